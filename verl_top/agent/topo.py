"""The node's GPU and network topology, collected once per connection: NVLink and PCIe relations
between GPUs (NVML, else the text of ``nvidia-smi topo -m``), IB/RoCE ports and Ethernet
interfaces from sysfs, and each GPU's nearest RDMA NIC."""

from __future__ import annotations

import os

from .wire import in_order, to_str

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from .backends import Backend
    from .wire import Fields

    Entry = dict[str, Any]  # a GPU or NIC entry being built (model field names)

SYS_ROOT = "/sys"
TOPO_TEXT_MAX = 64 * 1024  # `nvidia-smi topo -m` of a 16-GPU, 16-NIC node is ~6 KB
MAX_NICS = 256
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (Hopper)
NVML_INVALID_ARGUMENT = 2
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
# nvmlGpuTopologyLevel_t -> the `nvidia-smi topo -m` cell for the same relation.
NVML_TOPO_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t, not the major version (hwloc#658:
# "A100 returns 5 which is not NVLink 5"): 1 1.0, 2 2.0, 3 2.2, 4 3.0, 5 3.1, 6 4.0, 7 5.0, 8 6.0.
NVLINK_ENUM_MAJOR = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}


# Field order and string defaults of model.NicPort / model.GpuTopo (the wire order of to_dict).
NIC_FIELDS = (
    ("name", ""), ("port", None), ("kind", ""), ("rate_gbps", None), ("state", ""),
    ("numa_node", None), ("netdev", ""), ("pci", ""),
)  # fmt: skip
GPU_TOPO_FIELDS = (
    ("index", 0), ("bus_id", ""), ("numa_node", None), ("nvlink_version", None),
    ("nvlinks_up", None), ("nvlinks_total", None), ("nvlink_error", ""), ("nic", ""),
    ("nic_link", ""),
)  # fmt: skip


def _sys_text(path: str, limit: int = 4096) -> str | None:
    """A small sysfs file's stripped text, None when absent or unreadable."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("ascii", "replace").strip()
    except OSError:
        return None


def _sys_int(path: str) -> int | None:
    text = _sys_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _numa(path: str) -> int | None:
    """A numa_node file: None when absent or -1 (no NUMA affinity known)."""
    n = _sys_int(path)
    return n if n is not None and n >= 0 else None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))[:MAX_NICS]
    except OSError:
        return []


def _realpath(path: str) -> str:
    try:
        return os.path.realpath(path) if os.path.exists(path) else ""
    except OSError:
        return ""


def pci_relation(a: str, b: str, numa_a: int | None = None, numa_b: int | None = None) -> str:
    """`nvidia-smi topo -m` cell for two PCI devices from their sysfs paths
    (/sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0): PIX (same parent bridge), PXB
    (more bridges shared), PHB (only the host bridge), NODE / SYS (other host bridge, same /
    other NUMA node); "" when a path is unknown."""
    pa = [x for x in a.split("/") if x] if a else []
    pb = [x for x in b.split("/") if x] if b else []
    root = lambda p: next((x for x in p if x.startswith("pci")), "")  # noqa: E731
    if not pa or not pb or not root(pa) or not root(pb):
        return ""
    if root(pa) != root(pb):
        if numa_a is not None and numa_b is not None and numa_a == numa_b:
            return "NODE"
        return "SYS" if numa_a is not None and numa_b is not None else ""
    shared = 0
    for x, y in zip(pa[:-1], pb[:-1]):
        if x != y:
            break
        shared += 1
    depth = shared - pa.index(root(pa)) - 1  # PCI bridges shared below the host bridge
    if pa[:-1] == pb[:-1]:
        return "PIX"
    return "PXB" if depth >= 2 else "PHB"


def nearest_nics(gpus: list[Entry], nics: list[Entry], sys_root: str = SYS_ROOT) -> None:
    """Set each GPU's ``nic`` and ``nic_link``: its closest active IB/RoCE port by PCI path."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    order = ("PIX", "PXB", "PHB", "NODE", "SYS")
    rdma = [n for n in nics if n.get("kind") in ("ib", "roce") and n.get("state") == "ACTIVE"]
    for g in gpus:
        m = re.match(
            r"^(?:[0-9A-Fa-f]{4})?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$",
            g.get("bus_id") or "",
        )
        if not m or not rdma:
            continue
        gpath = _realpath(os.path.join(sys_root, "bus", "pci", "devices", m.group(1).lower()))
        best = None
        for n in rdma:
            rel = pci_relation(gpath, n.get("_path", ""), g.get("numa_node"), n.get("numa_node"))
            if rel and (best is None or order.index(rel) < order.index(best[0])):
                best = (rel, n["name"])
        if best is not None:
            g["nic_link"], g["nic"] = best


def _pci_of(device_link: str) -> str:
    """PCI address a sysfs ``device`` link points at ("" for virtual devices)."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    try:
        name = os.path.basename(os.path.realpath(device_link))
    except OSError:
        return ""
    return name if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", name) else ""


def read_rdma_ports(sys_root: str = SYS_ROOT) -> list[Entry]:
    """IB/RoCE ports: /sys/class/infiniband/<dev>/ports/<n>/{rate,link_layer,state} + NUMA node.

    ``rate`` reads like "400 Gb/sec (4X NDR)"; ``link_layer`` is InfiniBand or Ethernet (RoCE);
    ``state`` like "4: ACTIVE".
    """
    base = os.path.join(sys_root, "class", "infiniband")
    out = []
    for dev in _listdir(base):
        ddir = os.path.join(base, dev)
        numa = _numa(os.path.join(ddir, "device", "numa_node"))
        pci = _pci_of(os.path.join(ddir, "device"))
        devpath = _realpath(os.path.join(ddir, "device"))
        netdevs = _listdir(os.path.join(ddir, "device", "net"))
        for port in _listdir(os.path.join(ddir, "ports")):
            pdir = os.path.join(ddir, "ports", port)
            rate = (_sys_text(os.path.join(pdir, "rate")) or "").split(" ")[0]
            layer = _sys_text(os.path.join(pdir, "link_layer")) or ""
            state = (_sys_text(os.path.join(pdir, "state")) or "").split(":")[-1].strip()
            try:
                gbps = float(rate) if rate else None
            except ValueError:
                gbps = None
            out.append(
                {
                    "name": dev[:64],
                    "port": int(port) if port.isdigit() else None,
                    "kind": "roce"
                    if layer == "Ethernet"
                    else ("ib" if layer == "InfiniBand" else ""),
                    "rate_gbps": gbps,
                    "state": state[:16],
                    "numa_node": numa,
                    "netdev": netdevs[0][:64] if netdevs else "",
                    "pci": pci,
                    "_path": devpath,
                }
            )
    return out


def read_net_ifaces(sys_root: str = SYS_ROOT, skip: set[str] | tuple[str, ...] = ()) -> list[Entry]:
    """Physical net interfaces (/sys/class/net/<if>/speed in Mb/s, operstate, NUMA node) that are
    not the netdev of an RDMA port already listed."""
    base = os.path.join(sys_root, "class", "net")
    out = []
    for name in _listdir(base):
        ndir = os.path.join(base, name)
        if name in skip or not os.path.exists(os.path.join(ndir, "device")):
            continue  # lo, bridges, veth: no device behind them
        speed = _sys_int(os.path.join(ndir, "speed"))
        out.append(
            {
                "name": name[:64],
                "kind": "eth",
                "rate_gbps": speed / 1000.0 if speed and speed > 0 else None,
                "state": (_sys_text(os.path.join(ndir, "operstate")) or "")[:16],
                "numa_node": _numa(os.path.join(ndir, "device", "numa_node")),
                "pci": _pci_of(os.path.join(ndir, "device")),
            }
        )
    return out


def pci_numa_node(bus_id: str, sys_root: str = SYS_ROOT) -> int | None:
    """NUMA node of a PCI device given NVML-style ("00000000:1B:00.0"); None when unknown."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    m = re.match(
        r"^(?:[0-9A-Fa-f]{4})?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$", bus_id or ""
    )
    if not m:
        return None
    return _numa(os.path.join(sys_root, "bus", "pci", "devices", m.group(1).lower(), "numa_node"))


def _nvml_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def nvml_nvlinks(nv: Any, h: Any) -> tuple[int | None, int | None, int | None, int, list[str], str]:
    """(links up, links present, version, links to an NVSwitch, remote bus ids, error) of one GPU."""
    up = total = switch = 0
    version = None
    remotes = []
    # Newer bindings say 36 (Blackwell); links past the GPU's own answer InvalidArgument.
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError as exc:
            if _nvml_code(exc) == NVML_INVALID_ARGUMENT:
                break  # past the GPU's last link
            if link == 0:
                return None, None, None, 0, [], str(exc)[:80] or "NVMLError"
            continue
        total += 1
        if not state:
            continue
        up += 1
        if version is None:
            try:
                version = NVLINK_ENUM_MAJOR.get(int(nv.nvmlDeviceGetNvLinkVersion(h, link)))
            except Exception:
                version = None
        try:
            if nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
                continue
        except Exception:
            pass
        try:
            remotes.append(to_str(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).upper())
        except Exception:
            pass
    return up, total, version, switch, remotes, ""


def nvml_topology(
    nv: Any, handles: list[Any], buses: list[str], sys_root: str = SYS_ROOT
) -> tuple[list[Entry], dict[str, str]]:
    """GPU entries and the GPU-pair link matrix from NVML (NVLink first, else the PCIe level)."""
    gpus = []
    nvl = []
    for i, h in enumerate(handles):
        if h is None:
            gpus.append({"index": i, "nvlink_error": "GPU not accessible"})
            nvl.append((0, 0, []))
            continue
        up, total, version, switch, remotes, err = nvml_nvlinks(nv, h)
        # A remote that is no GPU of this node is an NVSwitch (bindings without the remote
        # device type call report its PCI address instead).
        gpu_buses = set(b.upper() for b in buses if b)
        switch += sum(1 for b in remotes if b not in gpu_buses)
        gpus.append(
            {
                "index": i,
                "bus_id": buses[i],
                "numa_node": pci_numa_node(buses[i], sys_root),
                "nvlink_version": version,
                "nvlinks_up": up,
                "nvlinks_total": total or None,
                "nvlink_error": err,
            }
        )
        nvl.append((up or 0, switch, remotes))
    links = {}
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            direct = sum(1 for b in nvl[i][2] if b == (buses[j] or "").upper())
            if direct:
                links[f"{i}-{j}"] = f"NV{direct}"
            elif nvl[i][1] and nvl[j][1]:
                links[f"{i}-{j}"] = f"NV{min(nvl[i][1], nvl[j][1])}"  # via NVSwitch
            elif handles[i] is not None and handles[j] is not None:
                try:
                    level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    links[f"{i}-{j}"] = NVML_TOPO_LEVELS.get(int(level), "SYS")
                except Exception:
                    pass
    return gpus, links


def smi_topo_text(exe: str | None = None, runner: Callable[[list[str]], str] | None = None) -> str:
    """`nvidia-smi topo -m` output (bounded), "" when it cannot run."""
    import shutil  # noqa: PLC0415 - topology is collected once per connection
    import subprocess  # noqa: PLC0415 - topology is collected once per connection

    if runner is not None:
        return (runner(["topo", "-m"]) or "")[:TOPO_TEXT_MAX]
    exe = exe or shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        proc = subprocess.run(
            [exe, "topo", "-m"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.decode("utf-8", "replace")[:TOPO_TEXT_MAX] if proc.returncode == 0 else ""


def collect_topology(
    backend: Backend, sys_root: str = SYS_ROOT, smi_runner: Callable[[list[str]], str] | None = None
) -> Fields:
    """Fields of the ``topo`` record: NIC inventory from sysfs, GPUs/links from NVML when the
    backend is pynvml, else the text of `nvidia-smi topo -m` (parsed by the client)."""
    import socket  # noqa: PLC0415 - topology is collected once per connection

    nics = read_rdma_ports(sys_root)
    nics += read_net_ifaces(sys_root, skip={n["netdev"] for n in nics if n.get("netdev")})
    nics = nics[:MAX_NICS]
    gpus, links, text, source, error = [], {}, "", "", ""
    nv = getattr(backend, "nv", None)
    if nv is not None and getattr(backend, "handles", None) is not None:
        buses = [g.get("bus_id", "") for g in backend.gpus]
        try:
            gpus, links = nvml_topology(nv, backend.handles, buses, sys_root)
            source = "nvml"
        except Exception as exc:  # a binding without the NVLink calls: fall back to the text
            error = f"NVML topology failed: {exc}"
    if not source and backend.name in ("pynvml", "nvidia-smi"):
        text = smi_topo_text(runner=smi_runner or getattr(backend, "topo_runner", None))
        source = "nvidia-smi" if text else ""
        for g in backend.gpus:
            gpus.append(
                {
                    "index": g["index"],
                    "bus_id": g.get("bus_id", ""),
                    "numa_node": pci_numa_node(g.get("bus_id", ""), sys_root),
                }
            )
    if not source and not error:
        error = "no GPU topology: %s" % (backend.error or f"backend {backend.name} has none")
    nearest_nics(gpus, nics, sys_root)
    return (
        ("source", source),
        ("gpus", [in_order(g, GPU_TOPO_FIELDS) for g in gpus]),
        ("nics", [in_order(n, NIC_FIELDS) for n in nics]),
        ("links", links),
        ("smi_topo", text),
        ("error", error[:200]),
        ("hostname", socket.gethostname()[:255]),
    )
