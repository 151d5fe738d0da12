"""Parser for ``nvidia-smi topo -m`` (the GPU/NIC connection matrix).

Real output puts an ANSI underline around the header, separates cells with tabs and pads link
cells (`` X ``); NIC columns are named ``NIC0..`` with a ``NIC Legend`` (newer drivers) or
``mlx5_0..`` (older ones). Rows are parsed by whitespace split, so the padding does not matter.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from verl_top.verl.parse import strip_ansi

if TYPE_CHECKING:
    from verl_top.model import NodeTopology

_MAX_NICS = 256
_MAX_GPUS = 64
_MAX_TOPO_TEXT = 64 * 1024

# Best to worst; the order used to call one link "worse" than another.
LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_DEVICE_NAME = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|mlx5_\w+)$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass
class Topology:
    """The matrix: ``links[(a, b)]`` for device names such as ``GPU0`` or ``NIC1``."""

    devices: list[str] = field(default_factory=list)
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str | None] = field(default_factory=dict)
    gpu_numa_id: dict[str, str | None] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0

    @property
    def gpus(self) -> list[int]:
        """GPU indices in matrix order."""
        return [int(d[3:]) for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        """NIC names (``mlx5_0``...), resolved through the NIC legend when there is one."""
        return [self.nic_names.get(d, d) for d in self.devices if not d.startswith("GPU")]

    def link(self, a: int | str, b: int | str) -> str | None:
        """The link between two devices (ints are GPU indices); None when unknown."""
        return self.links.get((_name(a), _name(b)))


def _name(dev: int | str) -> str:
    return f"GPU{dev}" if isinstance(dev, int) else dev


def parse_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` output; an empty ``Topology`` when there is no matrix."""
    topo = Topology()
    header_seen = False
    trailing: list[str] = []
    for raw in text.splitlines():
        line = strip_ansi(raw)
        if m := _NIC_LEGEND.match(line):
            topo.nic_names[m.group(1)] = m.group(2)
            continue
        tokens = line.split()
        if not tokens:
            continue
        if not header_seen:
            names = list(itertools.takewhile(lambda t: _DEVICE_NAME.match(t), tokens))
            if names and names[0].startswith("GPU"):
                topo.devices = names
                rest = " ".join(tokens[len(names) :])
                trailing = [col for col in _TRAILING if col in rest]
                trailing.sort(key=rest.index)
                header_seen = True
            continue
        label = tokens[0]
        if label not in topo.devices:
            continue
        cells = tokens[1 : 1 + len(topo.devices)]
        if len(cells) < len(topo.devices) or not all(_LINK.match(c) for c in cells):
            continue
        for other, cell in zip(topo.devices, cells, strict=True):
            topo.links[(label, other)] = cell
        extra = tokens[1 + len(topo.devices) :]
        for col, value in zip(trailing, extra, strict=False):
            val = None if value == "N/A" else value
            if col == "CPU Affinity" and val is not None:
                topo.cpu_affinity[label] = val
            elif col == "NUMA Affinity":
                topo.numa_affinity[label] = val
            elif col == "GPU NUMA ID":
                topo.gpu_numa_id[label] = val
    return topo


def nvlink_count(link: str | None) -> int:
    """Number of bonded NVLinks in a cell (``NV18`` -> 18), 0 for anything else."""
    if link and link.startswith("NV") and link[2:].isdigit():
        return int(link[2:])
    return 0


def nvlink_connected(topo: Topology, gpus: list[int] | None = None) -> bool:
    """True when every pair of ``gpus`` (default: all) is joined by NVLink.

    Fewer than two GPUs gives False: there is no GPU-to-GPU link to speak of.
    """
    gpus = topo.gpus if gpus is None else gpus
    if len(gpus) < 2:
        return False
    return all(nvlink_count(topo.link(a, b)) > 0 for a, b in itertools.combinations(gpus, 2))


def worst_link(topo: Topology, gpus: list[int] | None = None) -> str | None:
    """The slowest link class among pairs of ``gpus`` (``NV18``, ``PIX``, ``SYS``...)."""
    gpus = topo.gpus if gpus is None else gpus
    worst: str | None = None
    for a, b in itertools.combinations(gpus, 2):
        link = topo.link(a, b)
        if link is None:
            return None
        if worst is None or _rank(link) > _rank(worst):
            worst = link
        elif _rank(link) == _rank(worst) and nvlink_count(link) < nvlink_count(worst):
            worst = link
    return worst


def slow_tp_groups(
    links: Mapping[tuple[int, int], str], n: int, tp: int
) -> list[tuple[int, list[str]]]:
    """TP groups of ``tp`` consecutive GPUs (of ``n``) joined by anything but NVLink.

    ``links`` maps GPU index pairs, either way round, to a link class. One
    ``(first GPU, sorted slow link classes)`` per such group; a group left incomplete at the end
    is not one, and unknown pairs do not count as slow.
    """
    out: list[tuple[int, list[str]]] = []
    for start in range(0, n - n % tp, tp):
        group = range(start, start + tp)
        kinds = {
            links.get((i, j)) or links.get((j, i)) or "?" for i in group for j in group if i < j
        }
        slow = sorted(lk for lk in kinds if not lk.startswith("NV") and lk != "?")
        if slow:
            out.append((start, slow))
    return out


def _rank(link: str) -> int:
    key = "NV" if nvlink_count(link) else ("SYS" if link == "SOC" else link)
    return LINK_ORDER.index(key) if key in LINK_ORDER else len(LINK_ORDER)


def record_matrix(rec: NodeTopology) -> dict[tuple[int, int], str]:
    """GPU pairs -> link class from an agent topology record (NVML links or `topo -m` text)."""
    out: dict[tuple[int, int], str] = {}
    for key, link in rec.links.items():
        a, sep, b = str(key).partition("-")
        if sep and a.isdigit() and b.isdigit() and _LINK.match(str(link)):
            out[(int(a), int(b))] = str(link)
    if out or not rec.smi_topo:
        return out
    topo = parse_topo(rec.smi_topo)
    for (a, b), link in topo.links.items():
        if a.startswith("GPU") and b.startswith("GPU") and a != b:
            out[(int(a[3:]), int(b[3:]))] = link
    return out


@dataclass
class GpuMark:
    """Something wrong with one GPU's place in the node."""

    gpu: int
    text: str


def topology_marks(rec: NodeTopology) -> list[GpuMark]:
    """GPUs whose NVLinks are down, or that sit across a CPU socket from every RDMA NIC.

    NVLink: fewer links up than the GPU has, or none up while another GPU of the node has some.
    Socket: the GPU's NUMA node differs from every active RDMA NIC's (sysfs), or the
    ``topo -m`` matrix says SYS to each NIC. Unknown NUMA nodes mark nothing.
    """
    marks: list[GpuMark] = []
    any_up = any((g.nvlinks_up or 0) > 0 for g in rec.gpus)
    for g in rec.gpus:
        if g.nvlinks_total and g.nvlinks_up is not None and g.nvlinks_up < g.nvlinks_total:
            marks.append(GpuMark(g.index, f"NVLink {g.nvlinks_up}/{g.nvlinks_total} links up"))
        elif any_up and g.nvlinks_up == 0:
            marks.append(GpuMark(g.index, "NVLink: no link up"))
    rdma = [n for n in rec.nics if n.kind in ("ib", "roce") and n.state.upper() == "ACTIVE"]
    numas = {n.numa_node for n in rdma if n.numa_node is not None and n.numa_node >= 0}
    if any(g.nic_link for g in rec.gpus):
        # PCI paths from sysfs: SYS to the closest RDMA NIC means across the CPU socket.
        for g in rec.gpus:
            if g.nic_link == "SYS":
                marks.append(
                    GpuMark(g.index, f"closest RDMA NIC {g.nic} is across the socket (SYS)")
                )
    elif numas:
        for g in rec.gpus:
            if g.numa_node is not None and g.numa_node >= 0 and g.numa_node not in numas:
                marks.append(
                    GpuMark(g.index, f"NUMA {g.numa_node}, RDMA NICs on NUMA {sorted(numas)}")
                )
    elif rec.smi_topo:
        topo = parse_topo(rec.smi_topo)
        nics = [d for d in topo.devices if not d.startswith("GPU")]
        for i in topo.gpus if nics else []:
            if all(topo.link(i, n) == "SYS" for n in nics):
                marks.append(GpuMark(i, "every NIC across the CPU socket (SYS)"))
    return marks


def clean_topology(rec: NodeTopology) -> NodeTopology:
    """The record with every foreign string cleaned and every number bounded (untrusted.py):
    the one place a node's topology enters the client."""
    from verl_top.model import GpuTopo, NicPort
    from verl_top.untrusted import bounded_int, clean_line, clean_text, finite

    def num(v: object) -> int | None:
        return bounded_int(v, 0, 1 << 16)

    nics = [
        NicPort(
            name=clean_text(n.name, 64),
            port=num(n.port),
            kind=clean_text(n.kind, 8),
            rate_gbps=finite(n.rate_gbps, 0.0, 1e5),
            state=clean_text(n.state, 16),
            numa_node=num(n.numa_node),
            netdev=clean_text(n.netdev, 64),
            pci=clean_text(n.pci, 32),
        )
        for n in rec.nics[:_MAX_NICS]
        if isinstance(n, NicPort)
    ]
    gpus = [
        GpuTopo(
            index=num(g.index) or 0,
            bus_id=clean_text(g.bus_id, 32),
            numa_node=num(g.numa_node),
            nvlink_version=num(g.nvlink_version),
            nvlinks_up=num(g.nvlinks_up),
            nvlinks_total=num(g.nvlinks_total),
            nvlink_error=clean_text(g.nvlink_error, 80),
            nic=clean_text(g.nic, 64),
            nic_link=clean_text(g.nic_link, 8),
        )
        for g in rec.gpus[:_MAX_GPUS]
        if isinstance(g, GpuTopo)
    ]
    links = rec.links if isinstance(rec.links, dict) else {}
    return dataclasses.replace(
        rec,
        source=clean_text(rec.source, 16),
        gpus=gpus,
        nics=nics,
        links={
            clean_text(k, 16): clean_text(v, 8)
            for k, v in list(links.items())[: _MAX_GPUS * _MAX_GPUS]
        },
        smi_topo=clean_line(rec.smi_topo if isinstance(rec.smi_topo, str) else "", _MAX_TOPO_TEXT),
        error=clean_text(rec.error, 200),
        hostname=clean_text(rec.hostname, 255),
    )
