"""Expected NCCL bus bandwidth per link kind: the one table pane 2 compares probes against.

Each entry cites where its number comes from (see /work/shared/reference/gpu_comm.md §1.5 and
docs/nccl.md). Numbers are busbw in GB/s (1e9 B/s) at large sizes (>= 256 MiB, ideally >= 1 GiB).
PCIe numbers are rules of thumb, not measurements we can cite to a vendor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_top.model import ProbeResult
    from verl_top.nccl.topo import Topology


@dataclass(frozen=True)
class LinkSpec:
    """One row of the table."""

    link: str
    description: str
    all_reduce_gbs: float | None  # all_reduce busbw; None: no meaningful expectation
    other_gbs: float | None  # all_gather / reduce_scatter / ring
    per_nic: bool  # multiply by the number of NICs per node (inter-node ring)
    low: float | None
    high: float | None
    source: str
    rule_of_thumb: bool = False


@dataclass(frozen=True)
class Expectation:
    """What a healthy probe on ``link`` should reach."""

    gbs: float
    link: str
    source: str
    low: float | None = None
    high: float | None = None
    rule_of_thumb: bool = False
    note: str = ""


_NCCL212 = (
    'sjeaugey (NVIDIA), NVIDIA/nccl-tests#212: "On 8 GPUs, you should reach a peak busBw of '
    '~480GB/s" (NVLS all_reduce); "NCCL can get an effective NVLink bandwidth of 370GB/s" '
    "(ring / non-allreduce); AddyLaddy, nccl-tests#290: 476 GB/s expected for 8x H100"
)
_NCCL290_NDR = 'AddyLaddy (NVIDIA), NVIDIA/nccl-tests#290: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"'

LINKS: dict[str, LinkSpec] = {
    spec.link: spec
    for spec in (
        LinkSpec(
            "nvlink4",
            "NVLink4 + NVSwitch, 8x H100/H200 SXM",
            480.0,
            370.0,
            False,
            450.0,
            490.0,
            _NCCL212,
        ),
        LinkSpec(
            "nvlink3",
            "NVLink3 + NVSwitch, 8x A100 SXM",
            230.0,
            230.0,
            False,
            230.0,
            250.0,
            "docs.alayanew.com NCCL-tests table (third party): 230-250 GB/s for 8x A100",
        ),
        LinkSpec(
            "pcie4",
            "PCIe Gen4 x16 between GPUs",
            22.0,
            22.0,
            False,
            20.0,
            24.0,
            "rule of thumb: ~32 GB/s raw per direction, ~20-24 GB/s busbw in practice",
            rule_of_thumb=True,
        ),
        LinkSpec(
            "pcie5",
            "PCIe Gen5 x16 between GPUs",
            45.0,
            45.0,
            False,
            40.0,
            50.0,
            "rule of thumb: ~64 GB/s raw per direction, ~40-50 GB/s busbw in practice",
            rule_of_thumb=True,
        ),
        LinkSpec(
            "ib_ndr",
            "InfiniBand NDR 400 Gb/s, per NIC (x NICs per node, inter-node ring)",
            47.0,
            47.0,
            True,
            46.0,
            48.0,
            _NCCL290_NDR,
        ),
        LinkSpec(
            "ib_hdr",
            "InfiniBand HDR 200 Gb/s, per NIC (x NICs per node, inter-node ring)",
            23.0,
            23.0,
            True,
            22.0,
            24.0,
            "half of NDR (200 vs 400 Gb/s), scaled from nccl-tests#290",
            rule_of_thumb=True,
        ),
        LinkSpec(
            "socket",
            "TCP sockets (RDMA not enabled)",
            None,
            None,
            False,
            None,
            None,
            "a few GB/s to ~10 GB/s per node (NVIDIA/nccl#1453, schmaustech README); no "
            "meaningful expectation: the transport itself is the finding",
        ),
    )
}


def expected_busbw(
    link: str,
    collective: str = "all_reduce",
    nranks: int = 8,
    gpu_name: str = "",
    nics: int | None = None,
) -> Expectation | None:
    """Expected large-size busbw for ``link``; None when there is no bus or no expectation.

    ``nranks`` 1 has no bus at all (busbw is 0 by definition). ``nics`` multiplies per-NIC
    network numbers (default 1 NIC). ``gpu_name`` is accepted for callers that only know the GPU;
    use :func:`infer_link` to turn it into a link.
    """
    del gpu_name  # the link already encodes the GPU generation
    spec = LINKS.get(link)
    if spec is None or nranks <= 1:
        return None
    base = spec.all_reduce_gbs if collective == "all_reduce" else spec.other_gbs
    if base is None:
        return None
    factor = float(nics or 1) if spec.per_nic else 1.0
    note = f"{nics or 1} NIC(s) x per-NIC" if spec.per_nic else ""
    if link == "nvlink4" and collective == "all_reduce":
        note = "NVLS all_reduce; expect ~370 with NCCL_ALGO=Ring or NCCL_NVLS_ENABLE=0"
    return Expectation(
        gbs=base * factor,
        link=link,
        source=spec.source,
        low=spec.low * factor if spec.low is not None else None,
        high=spec.high * factor if spec.high is not None else None,
        rule_of_thumb=spec.rule_of_thumb,
        note=note,
    )


def ratio(measured: float | None, expected: Expectation | float | None) -> float | None:
    """``measured / expected`` (None when either is unknown or the expectation is 0)."""
    exp = expected.gbs if isinstance(expected, Expectation) else expected
    if measured is None or not exp:
        return None
    return measured / exp


def _generation(gpu_name: str) -> str:
    """``hopper`` / ``ampere`` / ``""`` from a GPU name such as "NVIDIA H200"."""
    name = gpu_name.upper()
    if any(tag in name for tag in ("H100", "H200", "H800", "H20", "GH200")):
        return "hopper"
    if any(tag in name for tag in ("A100", "A800")):
        return "ampere"
    return ""


def _is_pcie_card(gpu_name: str) -> bool:
    name = gpu_name.upper()
    return "PCIE" in name or name.endswith(" NVL")


def infer_link(
    gpu_name: str = "",
    scope: str = "intra",
    transport: str = "",
    topo: Topology | None = None,
    gpus: list[int] | None = None,
) -> str:
    """The table key that best describes what a probe crossed, "" when unknown.

    Inter-node: the NCCL transport decides (Socket -> ``socket``; IB/RoCE -> ``ib_ndr`` on Hopper,
    ``ib_hdr`` on Ampere, an assumption about the usual NIC of each generation). Intra-node: the
    topology matrix decides NVLink vs PCIe when given, else the GPU name (SXM parts have NVLink).
    """
    gen = _generation(gpu_name)
    if scope == "inter":
        if transport == "Socket":
            return "socket"
        if transport.startswith(("IB", "RoCE")):
            return {"hopper": "ib_ndr", "ampere": "ib_hdr"}.get(gen, "")
        return ""
    nvlink: bool | None = None
    if topo is not None and topo.devices:
        from verl_top.nccl.topo import nvlink_connected

        nvlink = nvlink_connected(topo, gpus)
    elif transport in ("NVLS", "MNNVL"):
        nvlink = True
    elif gen:
        nvlink = not _is_pcie_card(gpu_name)
    if nvlink is None:
        return ""
    if nvlink:
        return {"hopper": "nvlink4", "ampere": "nvlink3"}.get(gen, "")
    return "pcie5" if gen == "hopper" else ("pcie4" if gen == "ampere" else "")


def fill_expectation(
    probe: ProbeResult,
    gpu_name: str = "",
    topo: Topology | None = None,
    gpus: list[int] | None = None,
    nics: int | None = None,
    link: str | None = None,
) -> Expectation | None:
    """Set ``probe.link`` and ``probe.expected_gbs`` from the table; returns the expectation."""
    if link is None:
        # One rank has no bus: no link to name and nothing to expect.
        link = (
            infer_link(gpu_name, probe.scope, probe.transport, topo, gpus)
            if probe.nranks > 1
            else ""
        )
    probe.link = link
    exp = expected_busbw(link, probe.collective, probe.nranks, nics=nics) if link else None
    probe.expected_gbs = exp.gbs if exp is not None else None
    return exp
