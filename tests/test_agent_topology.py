"""The agent's topology / network inventory record (once per connection) and what the client makes
of it: sysfs trees built in tmp_path, NVML answers from the real H200 capture (nvml_static.json)
and from an 8-GPU NVSwitch fake, `nvidia-smi topo -m` from the real capture (smi backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pynvml as real
import pytest
from assessing import assessment_of
from rich.console import Console

from verl_top.agent import topo, wire
from verl_top.diagnosis.engine import Engine
from verl_top.model import NodeTopology
from verl_top.nccl.topo import record_matrix, topology_marks
from verl_top.protocol import from_dict
from verl_top.store import Store
from verl_top.ui.panes.mapping import topology_block

ROOT = Path(__file__).resolve().parents[1]
NVML_STATIC = ROOT / "tests" / "fixtures" / "h200" / "nvml_static.json"
SMI_TOPO = ROOT / "tests" / "fixtures" / "nccl" / "smi_topo_1xH200.txt"
AGENT = [sys.executable, "-m", "verl_top.agent"]  # the package from this checkout (cwd=ROOT)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def pci_device(sys_root: Path, addr: str, numa: int) -> Path:
    """A PCI device under the host bridge of its NUMA node (pci0000:00 or pci0000:80)."""
    dev = sys_root / "devices" / ("pci0000:00" if numa == 0 else "pci0000:80") / addr
    write(dev / "numa_node", str(numa))
    link = sys_root / "bus" / "pci" / "devices" / addr
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(dev)
    return dev


def rdma_dev(
    sys_root: Path, name: str, addr: str, numa: int, layer: str, rate: str, state: str, netdev: str
) -> None:
    dev = pci_device(sys_root, addr, numa)
    (dev / "net" / netdev).mkdir(parents=True, exist_ok=True)
    ib = sys_root / "class" / "infiniband" / name
    ib.mkdir(parents=True, exist_ok=True)
    (ib / "device").symlink_to(dev)
    write(ib / "ports" / "1" / "rate", rate)
    write(ib / "ports" / "1" / "link_layer", layer)
    write(ib / "ports" / "1" / "state", state)


def net_dev(sys_root: Path, name: str, addr: str | None, speed: str, numa: int = 0) -> None:
    nd = sys_root / "class" / "net" / name
    nd.mkdir(parents=True, exist_ok=True)
    write(nd / "speed", speed)
    write(nd / "operstate", "up")
    if addr:
        (nd / "device").symlink_to(pci_device(sys_root, addr, numa))


@pytest.fixture
def fake_sys(tmp_path: Path) -> Path:
    """Two NDR IB ports on NUMA 0, a RoCE port that is down on NUMA 1, an Ethernet NIC, lo."""
    root = tmp_path / "sys"
    rdma_dev(
        root, "mlx5_0", "0000:1b:00.0", 0, "InfiniBand", "400 Gb/sec (4X NDR)", "4: ACTIVE", "ib0"
    )
    rdma_dev(
        root, "mlx5_1", "0000:1c:00.0", 0, "InfiniBand", "400 Gb/sec (4X NDR)", "4: ACTIVE", "ib1"
    )
    rdma_dev(
        root, "mlx5_2", "0000:9c:00.0", 1, "Ethernet", "200 Gb/sec (4X HDR)", "1: DOWN", "ens2np0"
    )
    net_dev(root, "ib0", "0000:1b:00.0", "-1")
    net_dev(root, "ens2np0", "0000:9c:00.0", "200000", 1)
    net_dev(root, "eno1", "0000:03:00.0", "25000")
    net_dev(root, "lo", None, "-1")
    return root


def test_sysfs_inventory(fake_sys: Path) -> None:
    ports = topo.read_rdma_ports(str(fake_sys))
    assert [
        (p["name"], p["kind"], p["rate_gbps"], p["state"], p["numa_node"], p["netdev"])
        for p in ports
    ] == [
        ("mlx5_0", "ib", 400.0, "ACTIVE", 0, "ib0"),
        ("mlx5_1", "ib", 400.0, "ACTIVE", 0, "ib1"),
        ("mlx5_2", "roce", 200.0, "DOWN", 1, "ens2np0"),
    ]
    assert ports[0]["pci"] == "0000:1b:00.0"
    nets = topo.read_net_ifaces(str(fake_sys), skip={"ib0", "ens2np0"})
    # lo has no device; the netdevs of RDMA ports are not listed twice.
    assert [(n["name"], n["rate_gbps"]) for n in nets] == [("eno1", 25.0)]
    assert topo.pci_numa_node("00000000:9C:00.0", str(fake_sys)) == 1
    assert topo.pci_numa_node("garbage", str(fake_sys)) is None


def test_empty_sysfs_is_no_inventory_not_an_error(tmp_path: Path) -> None:
    assert topo.read_rdma_ports(str(tmp_path)) == [] and topo.read_net_ifaces(str(tmp_path)) == []


class NvmlFake:
    """Just the NVML calls the topology code makes, raising pynvml's real error classes."""

    def __init__(self, links_up: list[int], total: int = 18, numa: list[int] | None = None) -> None:
        self.links_up = links_up
        self.total = total
        self.module = types.SimpleNamespace(NVMLError=real.NVMLError)
        m = self.module
        m.nvmlDeviceGetNvLinkState = self.state
        m.nvmlDeviceGetNvLinkVersion = lambda h, link: real.NVML_NVLINK_VERSION_4_0  # 6
        m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: topo.NVML_NVLINK_DEVICE_TYPE_SWITCH
        m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50

    def state(self, h: int, link: int) -> int:
        if self.total == 0:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if link >= self.total:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link < self.links_up[h] else 0


def h200_capture_nvml() -> types.SimpleNamespace:
    """NVML as the real 1x H200 answered (nvml_static.json: every NvLinkState Not Supported)."""
    cap = json.loads(NVML_STATIC.read_text())["dev0"]
    assert set(cap["nvlink_state"].values()) == {"NVMLError: Not Supported"}

    def state(h: int, link: int) -> int:
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    return types.SimpleNamespace(
        NVMLError=real.NVMLError,
        nvmlDeviceGetNvLinkState=state,
        bus=cap["pci"]["busId"],
        name=cap["name"],
    )


def backend(nv: object, buses: list[str], name: str = "pynvml") -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name=name,
        nv=nv,
        handles=list(range(len(buses))),
        gpus=[{"index": i, "bus_id": b} for i, b in enumerate(buses)],
        error="",
    )


def test_nvml_topology_from_the_real_h200_capture(fake_sys: Path) -> None:
    nv = h200_capture_nvml()
    pci_device(fake_sys, "0000:00:06.0", 0)
    fields = dict(topo.collect_topology(backend(nv, [nv.bus]), str(fake_sys)))
    assert fields["source"] == "nvml" and fields["links"] == {}
    (gpu,) = fields["gpus"]
    assert "nvlinks_up" not in gpu and "nvlinks_total" not in gpu  # unknown: left out
    assert "Not Supported" in gpu["nvlink_error"] and gpu["numa_node"] == 0
    rec = from_dict(wire.record("topo", "h200", 1.0, tuple(fields.items())))
    assert isinstance(rec, NodeTopology) and topology_marks(rec) == []  # unknown is not "down"


def eight_gpu_record(fake_sys: Path, links_up: list[int]) -> NodeTopology:
    buses = [f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(8)]
    for i, b in enumerate(buses):
        pci_device(fake_sys, b[4:].lower(), 0 if i < 4 else 1)
    fields = topo.collect_topology(backend(NvmlFake(links_up).module, buses), str(fake_sys))
    return from_dict(wire.record("topo", "node01", 1.0, fields))  # type: ignore[return-value]


def test_nvswitch_node_matrix_and_marks(fake_sys: Path) -> None:
    rec = eight_gpu_record(fake_sys, [18, 18, 18, 16, 18, 18, 18, 18])
    matrix = record_matrix(rec)
    assert len(matrix) == 28 and matrix[(0, 1)] == "NV18" and matrix[(0, 3)] == "NV16"
    assert rec.gpus[0].nvlink_version == 4 and rec.gpus[3].nvlinks_up == 16
    marks = {m.gpu: m.text for m in topology_marks(rec)}
    assert marks[3] == "NVLink 16/18 links up"
    # Both active IB ports hang off NUMA 0's host bridge (the RoCE port on NUMA 1 is down):
    # GPUs 4-7 reach them only across the socket.
    assert all(
        marks[i] == "closest RDMA NIC mlx5_0 is across the socket (SYS)" for i in range(4, 8)
    )
    assert {(g.nic, g.nic_link) for g in rec.gpus[:4]} == {("mlx5_0", "PIX")}
    assert set(marks) == {3, 4, 5, 6, 7}


def test_no_nvlink_falls_back_to_pcie_levels(fake_sys: Path) -> None:
    buses = ["00000000:18:00.0", "00000000:28:00.0"]
    nv = NvmlFake([0, 0], total=0).module
    fields = dict(topo.collect_topology(backend(nv, buses), str(fake_sys)))
    assert fields["links"] == {"0-1": "SYS"}
    assert all("Not Supported" in g["nvlink_error"] for g in fields["gpus"])


def test_smi_backend_uses_the_real_topo_text(fake_sys: Path) -> None:
    text = SMI_TOPO.read_text()
    smi = backend(None, ["00000000:00:06.0"], name="nvidia-smi")
    smi.handles = None
    fields = dict(topo.collect_topology(smi, str(fake_sys), smi_runner=lambda args: text))
    assert fields["source"] == "nvidia-smi" and fields["smi_topo"] == text
    store = Store()
    store.ingest(from_dict(wire.record("topo", "h200", 1.0, tuple(fields.items()))))
    rec = store.node_topology["h200"]
    assert "\x1b" not in rec.smi_topo and "GPU0" in rec.smi_topo  # cleaned at the boundary
    assert store.topology == {}  # one GPU: no pairs, but the record is kept and shown
    console = Console(record=True, width=120, color_system=None)
    console.print(topology_block(store, {}))
    out = console.export_text()
    assert "h200 · 1 GPU(s) · source nvidia-smi" in out and "RDMA 2× 400 Gb/s" in out
    assert "not collected" not in out


def test_store_pane4_rule_and_snapshot_show_marks(fake_sys: Path) -> None:
    rec = eight_gpu_record(fake_sys, [18, 18, 18, 0, 18, 18, 18, 18])
    store = Store()
    store.ingest(rec)
    assert store.topology["node01"][(0, 3)] == "SYS"  # no NVLink on GPU 3: the PCIe level
    console = Console(record=True, width=140, color_system=None)
    console.print(topology_block(store, {}))
    out = console.export_text()
    assert "⚠ GPU3: NVLink 0/18 links up" in out and "NVLink4 0-18 links up" in out
    assert "⚠ GPU4: closest RDMA NIC mlx5_0 is across the socket (SYS)" in out
    verdict = Engine().evaluate(store)
    (f,) = [f for f in verdict.findings if f.rule == "map.topology"]
    assert "node01 GPU3: NVLink 0/18 links up" in f.evidence
    from verl_top.export.snapshot import _topology_json, recording_records

    (snap,) = _topology_json(store)
    assert {"gpu": 3, "text": "NVLink 0/18 links up"} in snap["marks"]
    assert any(isinstance(r, NodeTopology) for r in recording_records(store))
    from verl_top.export.schema import validate
    from verl_top.export.snapshot import build_snapshot

    doc = build_snapshot(store, assessment_of(store, verdict), now=2.0)
    assert validate(doc) == [] and doc["topology"][0]["marks"][0]["gpu"] == 3


def test_hostile_record_is_cleaned_and_bounded() -> None:
    raw = {
        "v": 1,
        "type": "topo",
        "host": "n",
        "t": 1.0,
        "nics": [
            {"name": "\x1b[31mmlx5_0\x07", "kind": "ib", "rate_gbps": 1e300, "state": "ACTIVE"}
        ]
        * 300,
        "links": {"0-1": "NV18\x1b]0;x\x07"},
        "error": "x" * 10_000,
    }
    store = Store()
    store.ingest(from_dict(raw))
    rec = store.node_topology["n"]
    assert len(rec.nics) == 256 and rec.nics[0].name == "mlx5_0" and rec.nics[0].rate_gbps is None
    assert len(rec.error) <= 200 and store.topology["n"] == {(0, 1): "NV18"}


def test_agent_process_sends_topo_after_hello(fake_sys: Path) -> None:
    out = subprocess.run(
        [
            *AGENT,
            "--backend",
            "none",
            "--once",
            "--no-procs",
            "--sys-root",
            str(fake_sys),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
        cwd=ROOT,
    ).stdout.splitlines()
    kinds = [json.loads(line)["type"] for line in out]
    assert kinds[:2] == ["hello", "topo"]
    record = from_dict(json.loads(out[1]))
    assert [n.name for n in record.nics][:2] == ["mlx5_0", "mlx5_1"]
    quiet = subprocess.run(
        [*AGENT, "--backend", "none", "--once", "--no-procs", "--no-topology"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    ).stdout
    assert '"type":"topo"' not in quiet


@pytest.mark.sshd
@pytest.mark.timeout(60)
async def test_topo_record_arrives_over_ssh_and_fills_the_store(
    tmp_path: Path, ssh_keys, sshd_pool, h200_trace: Path, remote_python: str
) -> None:
    """The real agent over the real test sshd: one topo record per connection, after hello,
    into the store the UI reads (pane 4 then shows the node instead of "not collected")."""
    from sshd import Collector, agent_args, make_settings, running, spec_for

    from verl_top.sources.ssh import SshSource

    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(lambda: c.count(d.name, "gpu") >= 2, 20)
    kinds = [r.TYPE for r in c.records if r.host == d.name and r.TYPE in ("hello", "topo")]
    assert kinds == ["hello", "topo"]
    store = Store()
    for r in c.records:
        store.ingest(r)
    rec = store.node_topology[d.name]
    assert rec.source == "" and "backend replay has none" in rec.error  # replay: no GPU topology
    console = Console(record=True, width=120, color_system=None)
    console.print(topology_block(store, {}))
    assert f"{d.name} · 0 GPU(s)" in console.export_text()


def test_nvswitch_without_remote_type_call(fake_sys: Path) -> None:
    """Older bindings lack nvmlDeviceGetNvLinkRemoteDeviceType: remotes that are no GPU of the
    node (the NVSwitches' PCI addresses) still count as switch links, so pairs read NV18."""
    buses = [f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(4)]
    fake = NvmlFake([18] * 4)
    nv = fake.module
    del nv.nvmlDeviceGetNvLinkRemoteDeviceType
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=f"00000000:{0xA0 + link % 4:02X}:00.0"
    )
    fields = dict(topo.collect_topology(backend(nv, buses), str(fake_sys)))
    assert set(fields["links"].values()) == {"NV18"} and len(fields["links"]) == 6


def test_direct_nvlink_pairs(fake_sys: Path) -> None:
    """A 2-GPU NVLink bridge (4 links, remote device type GPU): the pair reads NV4; a third GPU
    without NVLink gets the PCIe level from NVML."""
    buses = ["00000000:18:00.0", "00000000:28:00.0", "00000000:38:00.0"]
    fake = NvmlFake([4, 4, 0], total=4)
    nv = fake.module
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 0  # NVML_NVLINK_DEVICE_TYPE_GPU
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=buses[1 - h] if h < 2 else ""
    )
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 40
    fields = dict(topo.collect_topology(backend(nv, buses), str(fake_sys)))
    assert fields["links"] == {"0-1": "NV4", "0-2": "NODE", "1-2": "NODE"}
    rec = from_dict(wire.record("topo", "n", 1.0, tuple(fields.items())))
    assert [m.text for m in topology_marks(rec) if m.gpu == 2] == ["NVLink 0/4 links up"]


def test_pci_relation_from_sysfs_paths() -> None:
    root = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    gpu = root + "/0000:02:00.0/0000:03:00.0"
    assert topo.pci_relation(gpu, root + "/0000:02:00.0/0000:03:00.1") == "PIX"
    assert topo.pci_relation(gpu, root + "/0000:02:04.0/0000:04:00.0") == "PXB"
    assert topo.pci_relation(gpu, "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0") == "PHB"
    other = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    assert topo.pci_relation(gpu, other, 0, 0) == "NODE"
    assert topo.pci_relation(gpu, other, 0, 1) == "SYS"
    assert topo.pci_relation(gpu, other) == ""  # NUMA unknown: say nothing
    assert topo.pci_relation("", other) == ""


def test_topology_capture_script_runs_and_writes_its_files(tmp_path: Path) -> None:
    """benchmarks/topology_capture.py (what the device helper runs on the H200), here without a
    GPU: it prints the hello and topo lines and writes the files a fixture is made of."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "topology_capture.py"), "--backend", "none",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    first, second = out.splitlines()[:2]
    assert json.loads(first)["type"] == "hello" and json.loads(second)["type"] == "topo"
    lines = (tmp_path / "topo_record.ndjson").read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["hello", "topo"]
    assert "GPU(s) · source none" in (tmp_path / "pane4.txt").read_text()


def test_nvlink_version_enum_is_read_as_the_major_version() -> None:
    """NVML returns nvmlNvlinkVersion_t (A100 says 5 = 3.1, H100 6 = 4.0), not the major."""
    assert topo.NVLINK_ENUM_MAJOR[real.NVML_NVLINK_VERSION_3_1] == 3
    assert topo.NVLINK_ENUM_MAJOR[real.NVML_NVLINK_VERSION_4_0] == 4
    nv = NvmlFake([18]).module
    nv.nvmlDeviceGetNvLinkVersion = lambda h, link: real.NVML_NVLINK_VERSION_3_1
    assert topo.nvml_nvlinks(nv, 0)[2] == 3
