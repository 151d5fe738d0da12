"""Expected NCCL bus bandwidth per link kind: the one table pane 2 compares probes against.

Each entry cites where its number comes from (see /work/shared/reference/gpu_comm.md §1.5 and
docs/nccl.md). Numbers are busbw in GB/s (1e9 B/s) at large sizes (>= 256 MiB, ideally >= 1 GiB).
PCIe numbers are rules of thumb, not measurements we can cite to a vendor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from verl_top.model import NodeTopology, ProbeResult
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
    # Which facts the number rests on, in words ("NIC inventory: ...", "set by --expect-busbw",
    # "assumed: ..."). Shown with every judgement so the user can tell a guess from a fact.
    basis: str = ""
    assumed: bool = False  # no inventory, no log and no user number: a design-based guess


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


# NDR 400 Gb/s is 50 GB/s raw; nccl-tests#290 expects 46-48 GB/s busbw per NIC: ~94 % of raw.
NIC_EFFICIENCY = 47.0 / 50.0
# Per-NIC rate assumed when only the GPU generation is known (HGX reference designs: ConnectX-7
# NDR with Hopper, ConnectX-6 HDR with Ampere; one NIC per GPU).
_GEN_NIC_GBPS = {"hopper": 400.0, "ampere": 200.0}


def nic_busbw(rate_gbps: float) -> float:
    """Large-size busbw one RDMA NIC of ``rate_gbps`` Gb/s sustains (GB/s)."""
    return rate_gbps / 8.0 * NIC_EFFICIENCY


def rdma_ports(topo: NodeTopology) -> list[tuple[str, float]]:
    """(``name kind``, rate Gb/s) of the node's active IB/RoCE ports."""
    out = []
    for nic in topo.nics:
        if nic.kind in ("ib", "roce") and nic.state.upper() == "ACTIVE" and nic.rate_gbps:
            out.append(
                (f"{nic.name} {nic.kind.upper() if nic.kind == 'ib' else 'RoCE'}", nic.rate_gbps)
            )
    return out


def inventory_for(
    hosts: list[str], inventory: Mapping[str, NodeTopology] | None
) -> dict[str, NodeTopology]:
    """The topology records of ``hosts``, found by the name verl-top monitors a node under or by
    the node's own hostname (what nccl-tests and NCCL print), short names matching too."""
    if not inventory:
        return {}
    by_name: dict[str, NodeTopology] = {}
    for name, rec in inventory.items():
        for key in (name, rec.hostname):
            if key:
                by_name.setdefault(key, rec)
                by_name.setdefault(key.split(".")[0], rec)
    out = {}
    for host in hosts:
        found = by_name.get(host) or by_name.get(host.split(".")[0])
        if found is not None:
            out[host] = found
    return out


def _inventory_inter(
    hosts: list[str], inventory: Mapping[str, NodeTopology]
) -> tuple[float, str] | None:
    """Node network busbw from the agents' inventory: the slowest node's sum of active RDMA
    ports; None unless every host of the probe reported one."""
    found = inventory_for(hosts, inventory)
    if not hosts or len(found) < len(hosts):
        return None
    per_node: list[tuple[float, str]] = []
    for host in hosts:
        ports = rdma_ports(found[host])
        if not ports:
            return None
        rates = sorted({r for _, r in ports})
        desc = f"{host} {len(ports)}x" + "/".join(f"{r:g}" for r in rates) + " Gb/s"
        per_node.append((sum(nic_busbw(r) for _, r in ports), desc))
    gbs = min(g for g, _ in per_node)
    return gbs, "NIC inventory: " + ", ".join(d for _, d in per_node)


def _inter_expectation(
    probe: ProbeResult,
    gpu_name: str,
    inventory: Mapping[str, NodeTopology] | None,
) -> Expectation | None:
    """What the network between the probe's nodes should carry (RDMA), and on what basis.

    The per-NIC figure is a ring figure (nccl-tests#290 benchmarks 2 nodes with NCCL_ALGO=RING);
    NCCL's tree algorithms can show busbw up to 2(n-1)/n times it on few nodes, which reads as a
    ratio above 100 %, never as a false "low"."""
    src = _NCCL290_NDR
    hit = _inventory_inter(probe.hosts, inventory or {})
    if hit is not None:
        return Expectation(gbs=hit[0], link="network", source=src, basis=hit[1])
    gen = _generation(gpu_name)
    per_nic = _GEN_NIC_GBPS.get(gen)
    if per_nic is None:
        return None
    if probe.nics:
        basis = (
            f"{probe.nics} NIC(s) per node (NCCL log / topology); {per_nic:g} Gb/s each assumed "
            f"({'NDR' if per_nic == 400 else 'HDR'}, usual with {gen.title()})"
        )
        return Expectation(
            gbs=probe.nics * nic_busbw(per_nic), link="network", source=src, basis=basis
        )
    gpn = max((probe.gpus_per_host or {}).values(), default=0)
    if not gpn:
        gpn = probe.nranks // len(probe.hosts) if len(probe.hosts) > 1 else 1
    basis = (
        f"assumed: {gpn} NIC(s) per node, one {per_nic:g} Gb/s NIC per GPU (HGX reference "
        "design); no NIC inventory: monitor the nodes or pass --expect-busbw"
    )
    return Expectation(
        gbs=gpn * nic_busbw(per_nic),
        link="network",
        source=src,
        basis=basis,
        rule_of_thumb=True,
        assumed=True,
    )


_NVLINK_LINK = {4: "nvlink4", 3: "nvlink3"}


def _nvlink_facts(
    hosts: list[str], inventory: Mapping[str, NodeTopology] | None
) -> tuple[str, float, str] | None:
    """(link, share of links up, basis) from the agent's NVML facts for an intra-node probe.

    All GPUs with links up: NVLink of their version, scaled by the fewest links up over the
    links present (an NVSwitch GPU with 16 of 18 links carries ~16/18). No link up anywhere (or
    NVLink not supported): PCIe, link "". None when no host of the probe reported NVLink state.
    """
    found = inventory_for(hosts, inventory)
    for host in hosts:
        topo = found.get(host)
        if topo is None or not topo.gpus:
            continue
        ups = [g.nvlinks_up for g in topo.gpus if g.nvlinks_up is not None]
        totals = [g.nvlinks_total for g in topo.gpus if g.nvlinks_total]
        versions = {g.nvlink_version for g in topo.gpus if g.nvlink_version}
        if ups and max(ups) > 0 and versions:
            link = _NVLINK_LINK.get(max(versions), "")
            share = min(ups) / max(totals) if totals else 1.0
            basis = (
                f"NVML on {host}: NVLink{max(versions)}, {min(ups)}-{max(ups)} of "
                f"{max(totals) if totals else '?'} links up per GPU"
            )
            return (link, share, basis) if link else None
        if (ups and max(ups) == 0) or any(g.nvlink_error for g in topo.gpus):
            why = topo.gpus[0].nvlink_error or "0 links"
            return "", 0.0, f"NVML on {host}: no NVLink up ({why})"
    return None


def fill_expectation(
    probe: ProbeResult,
    gpu_name: str = "",
    topo: Topology | None = None,
    gpus: list[int] | None = None,
    nics: int | None = None,
    link: str | None = None,
    inventory: Mapping[str, NodeTopology] | None = None,
    override: float | None = None,
) -> Expectation | None:
    """Set ``probe.link``, ``probe.expected_gbs`` and ``probe.expected_source``.

    Order of trust: ``override`` (the user's number), then for a cross-node probe the agents'
    NIC inventory, the NICs NCCL listed, and last a GPU-generation assumption (marked); for an
    intra-node one the link table (NVLink generation from the topology or GPU name).
    """
    if nics is not None and not probe.nics:
        probe.nics = nics
    exp: Expectation | None = None
    if probe.nranks <= 1:
        link = ""  # one rank has no bus: no link to name and nothing to expect
    elif override:
        exp = Expectation(
            gbs=float(override), link="user", source="", basis="set by --expect-busbw"
        )
        link = link or "user"
    elif len(probe.hosts) > 1 or probe.scope == "inter":
        exp = _inter_expectation(probe, gpu_name, inventory)
        if exp is not None and probe.transport == "Socket":
            exp = Expectation(**{**exp.__dict__, "basis": "with RDMA: " + exp.basis})
        link = link or infer_link(gpu_name, "inter", probe.transport) or "network"
    else:
        facts = _nvlink_facts(probe.hosts or [probe.host], inventory) if link is None else None
        share = 1.0
        if facts is not None and facts[0]:
            link, share = facts[0], facts[1]
        elif facts is not None:  # NVLink absent or down: the GPUs talk over PCIe
            gen = _generation(gpu_name)
            link = "pcie5" if gen == "hopper" else ("pcie4" if gen == "ampere" else "")
        if link is None:
            link = infer_link(gpu_name, probe.scope, probe.transport, topo, gpus)
        exp = expected_busbw(link, probe.collective, probe.nranks, nics=nics) if link else None
        if exp is not None:
            basis = facts[2] if facts is not None else f"table: {LINKS[link].description}"
            if facts is None and gpu_name:
                basis += f" ({gpu_name})"
            exp = Expectation(**{**exp.__dict__, "gbs": exp.gbs * share, "basis": basis})
    probe.link = link or ""
    probe.expected_gbs = exp.gbs if exp is not None else None
    probe.expected_source = exp.basis if exp is not None else None
    return exp
