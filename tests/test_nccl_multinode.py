"""Multi-node nccl-tests runs: ranks -> hosts, transport from env lines, expectation sources and
the step-2 judgement on real public captures (expected answers: fixtures/nccl/EXPECTED_JUDGEMENTS.md,
written before the tool was run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.inputs import InputError, expect_busbw_overrides
from verl_top.model import NicPort, NodeTopology, ProbeResult
from verl_top.nccl.parse import NcclStreamParser, parse_nccl_tests
from verl_top.store import Store

FIX = Path(__file__).parent / "fixtures" / "nccl"
SOCKET = FIX / "real_2node_16xH200_socket_all_reduce.txt"
ROCE = FIX / "real_2node_2xH100_roce_all_reduce.txt"
GIB = 1 << 30


def _store(path: Path, text: str | None = None, topo: list[NodeTopology] = ()) -> Store:
    """A store fed the way `--nccl-log PATH` feeds it (the stream parser over the file)."""
    store = Store()
    for rec in topo:
        store.ingest(rec)
    parser = NcclStreamParser("vm", str(path))
    lines = (text if text is not None else path.read_text()).splitlines()
    for rec in parser.feed(lines, 1.0):
        store.ingest(rec)
    return store


def _step2(store: Store, th: Thresholds | None = None) -> tuple[dict, dict]:
    verdict = Engine(th or Thresholds()).evaluate(store)
    findings = {f.rule: f for f in verdict.findings if f.step == 2}
    checks = {c.rule: c for c in verdict.checks if c.step == 2}
    return findings, checks


def _roce_port(host: str, rate: float = 400.0) -> NodeTopology:
    return NodeTopology(
        host=host,
        t=1.0,
        nics=[NicPort("mlx5_5", 1, "roce", rate, "ACTIVE", 0, "eno7np0")],
    )


def test_socket_run_ranks_hosts_sizes_and_env_transport() -> None:
    res = parse_nccl_tests(SOCKET.read_text())
    assert res.collective == "all_reduce" and res.nranks == 16
    assert res.gpus_per_host == {
        "nvidiatools-dgx-2d-workload": 8,
        "nvidiatools-dgx-9d-workload": 8,
    }
    assert [d.device for d in res.devices[8:]] == list(range(8))
    sizes = [r.size_bytes for r in res.rows]
    assert (sizes[0], sizes[-1], len(sizes)) == (8, 16 * GIB, 32)
    probe = res.to_probe("vm", 1.0)
    # No INFO lines at all: the transport comes from the launcher's -x NCCL_IB_DISABLE=1.
    assert probe.transport == "Socket" and probe.scope == "inter"
    assert probe.settings["NCCL_IB_DISABLE"] == "1"
    assert probe.settings["NCCL_IB_HCA"] == "mlx5_0"
    assert res.log is not None and "NCCL_IB_DISABLE=1" in res.log.transport_basis()
    assert (probe.busbw_max_gbs, probe.peak_size_bytes) == (92.35, 8 * GIB)


def test_socket_file_names_step2_socket_and_the_gap() -> None:
    findings, _ = _step2(_store(SOCKET))
    sock = findings["nccl.transport_socket"]
    assert sock.severity >= 0.8 and sock.data["nnodes"] == 2
    assert sock.data["transport"] == "Socket"
    assert sock.data["busbw_gbs"] == 92.35 and sock.data["expected_gbs"] == pytest.approx(376.0)
    text = " ".join(sock.evidence)
    assert "NCCL_IB_DISABLE=1" in text and "25 %" in text and "assumed" in text
    low = findings["nccl.busbw_low"]
    assert low.data["assumed"] is True and low.severity <= 0.5  # a guess never outranks facts
    assert low.data["size_bytes"] == 8 * GIB
    verdict = Engine().evaluate(_store(SOCKET))
    assert (verdict.bottleneck_step, verdict.bottleneck_rule) == (2, "nccl.transport_socket")


def test_socket_with_rdma_ports_in_inventory_is_worse() -> None:
    hosts = ["nvidiatools-dgx-2d-workload", "nvidiatools-dgx-9d-workload"]
    inv = [
        NodeTopology(
            host=h,
            t=1.0,
            nics=[
                NicPort(f"mlx5_{i}", 1, "ib", 400.0, "ACTIVE", i // 4, f"ib{i}") for i in range(8)
            ],
        )
        for h in hosts
    ]
    findings, _ = _step2(_store(SOCKET, topo=inv))
    sock = findings["nccl.transport_socket"]
    assert sock.severity == 0.9
    assert any("RDMA ports" in e and "mlx5_0 IB 400 Gb/s" in e for e in sock.evidence)
    low = findings["nccl.busbw_low"]
    # The inventory replaces the assumption: 8 x 400 Gb/s on both nodes = 8 x 47 GB/s.
    assert low.data["assumed"] is False and low.data["expected_gbs"] == pytest.approx(376.0)
    assert low.data["expected_basis"].startswith("with RDMA: NIC inventory")


def test_largest_sizes_below_1gib_are_used_and_named() -> None:
    cut = [
        ln
        for ln in SOCKET.read_text().splitlines()
        if not (ln[:13].strip().isdigit() and int(ln[:13]) > 128 * (1 << 20))
    ]
    findings, _ = _step2(_store(SOCKET, "\n".join(cut)))
    low = findings["nccl.busbw_low"]
    assert low.data["size_bytes"] == 128 * (1 << 20) and low.data["busbw_gbs"] == 89.37
    assert "largest size present, 128 MiB" in low.evidence[0]


def test_roce_run_is_judged_low() -> None:
    res = parse_nccl_tests(ROCE.read_text())
    assert res.gpus_per_host == {"MOC-R4PCC04U37": 1, "MOC-R4PCC04U35": 1}
    probe = res.to_probe("vm", 1.0)
    assert probe.transport == "RoCE"  # channels via NET/IB/1 without /GDRDMA
    assert probe.nics == 1 and res.log is not None and res.log.nic_list() == ["mlx5_5/RoCE"]
    findings, checks = _step2(_store(ROCE))
    assert checks["nccl.transport_socket"].status == "passed"
    low = findings["nccl.busbw_low"]
    assert low.data["busbw_gbs"] == 15.18 and low.data["size_bytes"] == 3 * GIB
    assert low.data["expected_gbs"] == pytest.approx(47.0) and low.data["assumed"] is False
    assert low.data["ratio"] == pytest.approx(15.18 / 47.0)
    assert "1 NIC(s) per node" in low.data["expected_basis"]


def test_roce_with_inventory_and_with_user_number() -> None:
    inv = [_roce_port("MOC-R4PCC04U37"), _roce_port("MOC-R4PCC04U35")]
    findings, _ = _step2(_store(ROCE, topo=inv))
    low = findings["nccl.busbw_low"]
    assert low.data["expected_basis"].startswith("NIC inventory")
    assert low.data["expected_gbs"] == pytest.approx(47.0)
    th = dataclasses.replace(Thresholds(), **expect_busbw_overrides(["20"]))
    findings, checks = _step2(_store(ROCE), th)
    assert "nccl.busbw_low" not in findings
    assert checks["nccl.busbw_low"].status == "passed"
    assert "set by --expect-busbw" in checks["nccl.busbw_low"].detail


def test_expect_busbw_argument() -> None:
    assert expect_busbw_overrides(["intra=400", "inter=46"]) == {
        "expect_busbw_gbs": 400.0,
        "expect_inter_busbw_gbs": 46.0,
    }
    for bad in ("x", "inter=-1", "nodes=3", "inter="):
        with pytest.raises(InputError):
            expect_busbw_overrides([bad])


def test_single_node_with_ib_disabled_is_not_socket() -> None:
    text = "\n".join(
        ["mpirun -x NCCL_IB_DISABLE=1 all_reduce_perf -g 2"]
        + [ln for ln in SOCKET.read_text().splitlines() if "9d-workload" not in ln][2:]
    )
    res = parse_nccl_tests(text)
    probe = res.to_probe("vm", 1.0)
    assert len(res.hosts) == 1 and probe.transport == ""  # no bytes between nodes


def test_probe_record_fields_survive_the_wire() -> None:
    from verl_top import protocol

    p = parse_nccl_tests(ROCE.read_text()).to_probe("vm", 1.0)
    back = protocol.from_dict(protocol.to_dict(p))
    assert isinstance(back, ProbeResult)
    assert back.gpus_per_host == p.gpus_per_host and back.settings == p.settings
    assert back.peak_size_bytes == 3 * GIB and back.nics == 1


def test_gpu_inventory_count_and_ranks_per_node() -> None:
    from verl_top.nccl.probe import count_gpu_lines, ranks_per_node

    smi_l = [
        "GPU 0: NVIDIA H200 (UUID: GPU-a7f64ac6-5bbd-7bfa-1353-f73a583799d6)",
        "  MIG 1g.18gb     Device  0: (UUID: MIG-x)",
        "GPU 1: NVIDIA H200 (UUID: GPU-b)",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    ]
    assert count_gpu_lines(smi_l) == 2
    assert ranks_per_node({"a": 8, "b": 4}) == (4, "")
    assert ranks_per_node({"a": 8, "b": 0}) == (0, "no GPU on b (nvidia-smi -L lists none)")
    assert ranks_per_node({})[0] == 0


def test_progress_lines_feed_the_callback_not_the_error_text() -> None:
    from verl_top.nccl.probe import ProbeCollector
    from verl_top.nccl.torch_probe import PROGRESS_PREFIX

    seen: list[str] = []
    c = ProbeCollector(seen.append)
    c.feed(f"{PROGRESS_PREFIX}all_reduce 2/11 2097152 B 12.5 GB/s")
    c.feed("Traceback: rank 1 died")
    assert seen == ["all_reduce 2/11: 2 MiB, busbw 12.5 GB/s"]
    res = c.finish("all_reduce", "a")
    assert not res.ok and res.error == "Traceback: rank 1 died"


def test_remote_probe_is_judged_like_a_parsed_file() -> None:
    """The torch probe's record (gpus_per_host, gpu_name) gets the same expectation as the
    nccl-tests file of the same shape: 2 nodes x 8 H200 over sockets -> 376 GB/s assumed."""
    from verl_top.nccl.expected import fill_expectation

    parsed = parse_nccl_tests(SOCKET.read_text()).to_probe("vm", 1.0)
    fill_expectation(parsed, gpu_name=parsed.gpu_name)
    torch_like = ProbeResult(
        tool="torch",
        scope="inter",
        hosts=["a", "b"],
        nranks=16,
        transport="Socket",
        gpus_per_host={"a": 8, "b": 8},
        gpu_name="NVIDIA H200",
    )
    fill_expectation(torch_like, gpu_name=torch_like.gpu_name)
    assert torch_like.expected_gbs == parsed.expected_gbs == pytest.approx(376.0)
    assert torch_like.expected_source == parsed.expected_source


def test_pane2_shows_the_rules_judgement_and_its_basis() -> None:
    from rich.console import Console

    from verl_top.ui.panes.communication import probe_block

    store = _store(ROCE)
    console = Console(record=True, width=200, color_system=None)
    console.print(probe_block(store, {}))
    out = console.export_text()
    assert "15.2" in out and " 47 " in out and "32%" in out.replace(" %", "%")
    assert "expected 47 GB/s from 1 NIC(s) per node" in out
    store = _store(SOCKET)
    console = Console(record=True, width=200, color_system=None)
    console.print(probe_block(store, {}))
    out = console.export_text()
    assert "376?" in out and "(RDMA off)" in out  # "?": an assumed expectation


def test_info_lines_map_ranks_to_hosts_and_gpus() -> None:
    """Init COMPLETE lines (format of NCCL's src/init.cc, as in NVIDIA/nccl#1412), with the Ray
    prefix verl adds: ranks -> (host, cudaDev) and GPUs per host."""
    from verl_top.nccl.parse import parse_nccl_log

    lines = [
        f"(WorkerDict pid={100 + r}) node{r // 2}:{100 + r}:{200 + r} [{r % 2}] NCCL INFO "
        f"ncclCommInitRank comm 0x8ec0ac0 rank {r} nranks 4 cudaDev {r % 2} nvmlDev {r % 2} "
        "busId c8000 commId 0x49bbd7790311d5eb - Init COMPLETE"
        for r in range(4)
    ]
    state, _ = parse_nccl_log("\n".join(lines))
    assert state.rank_gpus == {0: ("node0", 0), 1: ("node0", 1), 2: ("node1", 0), 3: ("node1", 1)}
    info = state.info("n", 1.0, "log")
    assert info.gpus_per_host == {"node0": 2, "node1": 2} and info.nranks == 4


A3MEGA = FIX / "real_2node_16xH100_gcp_a3mega_all_reduce.txt"


def test_gcp_a3mega_run_is_judged_healthy() -> None:
    res = parse_nccl_tests(A3MEGA.read_text())
    assert res.gpus_per_host == {"ztan-mig-235z": 8, "ztan-mig-gq73": 8}
    assert len(res.rows) == 31 and res.rows[-1].size_bytes == 8 * GIB
    assert res.to_probe("vm", 1.0).transport == ""  # nothing in the file says which
    findings, checks = _step2(_store(A3MEGA))
    assert checks["nccl.transport_socket"].status == "no_data"
    assert "nccl.busbw_low" not in findings
    busbw = checks["nccl.busbw_low"]
    assert busbw.status == "passed"
    assert "339 GB/s at 8 GiB = 90 % of 376 GB/s" in busbw.detail and "assumed" in busbw.detail


def test_intra_expectation_from_nvlink_facts() -> None:
    from verl_top.model import GpuTopo
    from verl_top.nccl.expected import fill_expectation

    def rec(ups: list[int], err: str = "") -> dict[str, NodeTopology]:
        gpus = [
            GpuTopo(i, nvlink_version=4 if not err else None, nvlinks_up=None if err else u,
                    nvlinks_total=None if err else 18, nvlink_error=err)
            for i, u in enumerate(ups)
        ]  # fmt: skip
        return {"n1": NodeTopology(host="n1", gpus=gpus)}

    def probe() -> ProbeResult:
        return ProbeResult(
            host="n1", hosts=["n1"], nranks=8, scope="intra", collective="all_reduce"
        )

    p = probe()
    fill_expectation(p, gpu_name="NVIDIA H200", inventory=rec([18] * 8))
    assert (p.link, p.expected_gbs) == ("nvlink4", 480.0)
    assert p.expected_source == "NVML on n1: NVLink4, 18-18 of 18 links up per GPU"
    p = probe()
    fill_expectation(p, gpu_name="NVIDIA H200", inventory=rec([18] * 7 + [16]))
    assert p.expected_gbs == pytest.approx(480.0 * 16 / 18)  # the GPU with 2 links down limits
    p = probe()
    fill_expectation(p, gpu_name="NVIDIA H200", inventory=rec([0] * 8, "Not Supported"))
    assert p.link == "pcie5" and "no NVLink up (Not Supported)" in p.expected_source


def test_a_setting_alone_does_not_make_a_single_node_log_socket() -> None:
    from verl_top.nccl.parse import parse_nccl_log

    state, _ = parse_nccl_log("export NCCL_IB_DISABLE=1\nNCCL version 2.27.3+cuda12.9")
    assert state.network() == "Socket" and state.transport() == ""
    state, _ = parse_nccl_log(
        "export NCCL_IB_DISABLE=1\nh:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 "
        "localRanks 8 localRank 0 MNNVL 0"
    )
    assert state.transport() == "Socket"  # two nodes: the setting decides
    store = Store()
    for rec in NcclStreamParser("h", "log").feed(
        ["export NCCL_IB_DISABLE=1", "NCCL version 2.27.3"], 1.0
    ):
        store.ingest(rec)
    _, checks = _step2(store)
    assert checks["nccl.transport_socket"].status == "no_data"


def test_a_producers_known_expectation_beats_an_assumption() -> None:
    """A probe that arrives with an expectation its producer knew (not an assumption) keeps it
    even when the GPU name alone would only give the 1-NIC-per-GPU guess."""
    from verl_top.diagnosis.step2_comm import judge_probe
    from verl_top.diagnosis.view import View
    from verl_top.model import ProbeRow

    rows = [ProbeRow(GIB, 1.0, 10.0, 150.0)]
    p = ProbeResult(
        host="a", hosts=["a", "b"], scope="inter", nranks=16, rows=rows, gpu_name="NVIDIA H100",
        expected_gbs=188.0, expected_source="4 NIC(s) per node (NCCL log / topology)",
    )  # fmt: skip
    j = judge_probe(View(Store(), Thresholds()), Thresholds(), p)
    assert j is not None and j.expected == 188.0 and not j.assumed
    p.expected_source = None
    p.expected_gbs = None
    j = judge_probe(View(Store(), Thresholds()), Thresholds(), p)
    assert j is not None and j.assumed and j.expected == pytest.approx(8 * 47.0)


def test_roce_without_gdr_is_named_in_the_finding() -> None:
    findings, _ = _step2(_store(ROCE))
    text = findings["nccl.busbw_low"].evidence[2]
    assert text.startswith("transport: RoCE without GPUDirect RDMA") and "nvidia-peermem" in text


def test_settings_from_echoes_and_command_lines() -> None:
    from verl_top.nccl.parse import parse_nccl_log

    roce = parse_nccl_tests(ROCE.read_text()).to_probe("vm", 1.0).settings or {}
    # NCCL's own echo ("... set by environment to 0.") without its final period.
    assert roce["NCCL_IB_DISABLE"] == "0" and roce["NCCL_IB_HCA"] == "mlx5_5"
    assert roce["NCCL_IB_GID_INDEX"] == "3" and roce["NCCL_ALGO"] == "RING"
    state, _ = parse_nccl_log(
        'export NCCL_IB_HCA="mlx5_0,mlx5_1"\n'
        "NCCL_SOCKET_IFNAME='eth0' torchrun train.py\n"
        "srun --export=ALL,NCCL_NET=Socket,NCCL_IB_GID_INDEX=3 python x.py"
    )
    assert state.settings == {
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_NET": "Socket",
        "NCCL_IB_GID_INDEX": "3",
    }
    assert state.rdma_disabled() == "NCCL_NET=Socket"


def test_cli_text_uses_the_probes_own_expectation_and_its_basis() -> None:
    from verl_top.nccl.expected import fill_expectation
    from verl_top.nccl.probe import format_probe

    p = parse_nccl_tests(ROCE.read_text()).to_probe("vm", 1.0)
    fill_expectation(p, gpu_name=p.gpu_name or "")
    text = format_probe(p)
    assert "expected ~47 GB/s" in text and "ratio 32%" in text
    assert "expected from: 1 NIC(s) per node" in text


def test_nccl_using_fewer_nics_than_the_nodes_have_is_named() -> None:
    """The RoCE run's NCCL listed 1 NIC (NCCL_IB_HCA=mlx5_5); with an inventory of 4 active
    RoCE ports per node the finding says NCCL_IB_HCA limits it."""
    hosts = ["MOC-R4PCC04U37", "MOC-R4PCC04U35"]
    inv = [
        NodeTopology(
            host=h,
            t=1.0,
            nics=[NicPort(f"mlx5_{i}", 1, "roce", 400.0, "ACTIVE", 0) for i in range(4)],
        )
        for h in hosts
    ]
    findings, _ = _step2(_store(ROCE, topo=inv))
    low = findings["nccl.busbw_low"]
    assert "NCCL used 1 NIC(s) per node; the nodes have 4 active RDMA ports" in low.evidence[3]
    assert "(NCCL_IB_HCA=mlx5_5 limits it)" in low.evidence[3]
    assert low.data["expected_gbs"] == pytest.approx(4 * 47.0)  # what the nodes could carry


def test_inventory_is_found_by_the_nodes_own_hostname() -> None:
    """verl-top monitors nodes under ssh names (gpu-a, gpu-b) while nccl-tests prints their own
    hostnames: the topo record's hostname joins the two (short names match too)."""
    inv = []
    for name, hostname in (("gpu-a", "MOC-R4PCC04U37.example.org"), ("gpu-b", "MOC-R4PCC04U35")):
        rec = _roce_port(name)
        rec.hostname = hostname
        inv.append(rec)
    findings, _ = _step2(_store(ROCE, topo=inv))
    assert (
        findings["nccl.busbw_low"]
        .data["expected_basis"]
        .startswith("NIC inventory: MOC-R4PCC04U37 1x400 Gb/s")
    )


IB_OK = FIX / "real_2node_16xH100_ib_ndr_all_reduce_healthy.txt"
IB_LOW = FIX / "real_2node_16xH100_ib_ndr_ring_srun_low.txt"
NDR8 = 8 * 47.0  # 8 x NDR 400 Gb/s per node, as both threads state; 47 GB/s per NIC (#290)


def test_ib_ndr_run_is_read_and_judged_healthy() -> None:
    """NVIDIA/nccl-tests#309: 2 x 8 H100, 8 x CX-7 IB 400 Gb/s, NCCL_DEBUG=VERSION; the xpmem
    warnings inside the header do not break it; NCCL_IB_DISABLE=0 is not Socket."""
    res = parse_nccl_tests(IB_OK.read_text())
    assert res.collective == "all_reduce"  # from all_reduce_perf_mpi on the mpirun line
    assert res.gpus_per_host == {"bm-h100-01": 8, "bm-h100-02": 8}
    assert [d.device for d in res.devices] == list(range(8)) * 2
    sizes = [r.size_bytes for r in res.rows]
    assert (sizes[0], sizes[-1], len(sizes)) == (8, 16 * GIB, 32)
    probe = res.to_probe("vm", 1.0)
    assert probe.transport == ""  # no INFO line says which transport NCCL used
    assert probe.settings["NCCL_IB_DISABLE"] == "0"
    assert probe.settings["NCCL_IB_HCA"].count("mlx5_") == 8
    assert (probe.busbw_max_gbs, probe.peak_size_bytes) == (469.21, 16 * GIB)
    assert res.avg_busbw == 139.56 and res.nccl_version.startswith("2.26.2")
    findings, checks = _step2(_store(IB_OK))
    assert "nccl.busbw_low" not in findings and "nccl.transport_socket" not in findings
    sock = checks["nccl.transport_socket"]
    assert sock.status == "no_data"
    assert "2-node nccl-tests output has no NCCL INFO line" in sock.detail  # not "pass --nccl-log"
    busbw = checks["nccl.busbw_low"]
    assert busbw.status == "passed"
    assert "469 GB/s at 16 GiB = 125 % of 376 GB/s" in busbw.detail and "assumed" in busbw.detail
    th = dataclasses.replace(Thresholds(), **expect_busbw_overrides([str(NDR8)]))
    findings, checks = _step2(_store(IB_OK), th)
    assert "nccl.busbw_low" not in findings
    assert "set by --expect-busbw" in checks["nccl.busbw_low"].detail


def test_ib_ndr_ring_run_behind_srun_labels_is_judged_low() -> None:
    """NVIDIA/nccl-tests#290: every line prefixed by `srun --label` (" 0: "), the paste starts at
    "# Using devices"; NCCL_ALGO=RING over 8 NDR NICs per node peaks at 89.9 GB/s = 24 %."""
    res = parse_nccl_tests(IB_LOW.read_text())
    assert res.gpus_per_host == {"node005": 8, "node007": 8} and res.nranks == 16
    sizes = [r.size_bytes for r in res.rows]
    assert (sizes[0], sizes[-1], len(sizes)) == (8 << 20, 8 * GIB, 11)
    assert res.complete and res.avg_busbw == 85.5294
    probe = res.to_probe("vm", 1.0)
    assert probe.settings["NCCL_ALGO"] == "RING" and probe.transport == ""
    assert probe.settings["NCCL_IB_HCA"].count("mlx5_") == 8
    findings, checks = _step2(_store(IB_LOW))  # the --nccl-log path: the stream parser
    assert checks["nccl.transport_socket"].status == "no_data"
    low = findings["nccl.busbw_low"]
    assert (low.data["busbw_gbs"], low.data["size_bytes"]) == (89.9, 4 * GIB)
    assert low.data["expected_gbs"] == pytest.approx(NDR8) and low.data["assumed"] is True
    assert low.data["ratio"] == pytest.approx(89.9 / NDR8) and low.severity <= 0.5
    assert "24 %" in low.title and "node005: 8 GPUs, node007: 8 GPUs" in low.evidence[0]
    verdict = Engine().evaluate(_store(IB_LOW))
    assert (verdict.bottleneck_step, verdict.bottleneck_rule) == (2, "nccl.busbw_low")
    # The user's number (8 x NDR, from the thread) replaces the assumption: a fact, full weight.
    th = dataclasses.replace(Thresholds(), **expect_busbw_overrides([str(NDR8)]))
    low = _step2(_store(IB_LOW), th)[0]["nccl.busbw_low"]
    assert low.data["assumed"] is False and low.severity > 0.5
    assert "set by --expect-busbw" in low.data["expected_basis"]


# Real lines from github.com/skypilot-org/skypilot, examples/gcp_gpu_direct_tcpx/README.md at
# commit 088eebc2dd2ef6cdac96f7b72e8f800bc9b1f9f2 (2 x 8 H200 on GKE a3-ultragpu-8g): Ray's
# "(head, rank=0, pid=3808)" in front of OpenMPI's "[1,0]<stdout>:" on every line. Kept: the
# header, ranks 0, 7, 8, 15, the column header, the last 4 rows and the footer.
_SKY = "(head, rank=0, pid=3808) [1,0]<stdout>:"
SKYPILOT_LINES = [
    "(head, rank=0, pid=3808) All nodes: 10.100.9.12:8,10.100.10.12:8",
    "(worker1, rank=1, pid=2769, ip=10.100.10.12) Worker nodes",
    f"{_SKY}# nThread 1 nGpus 1 minBytes 1024 maxBytes 8589934592 step: 2(factor) warmup iters:"
    " 5 iters: 100 agg iters: 1 validation: 1 graph: 0",
    f"{_SKY}#",
    f"{_SKY}# Using devices",
    f"{_SKY}#  Rank  0 Group  0 Pid   7774 on nc-d87e1263-head device  0 [0000:8f:00] NVIDIA H200",
    f"{_SKY}#  Rank  7 Group  0 Pid   7792 on nc-d87e1263-head device  7 [0000:cc:00] NVIDIA H200",
    f"{_SKY}#  Rank  8 Group  0 Pid   4926 on nc-d87e1263-worker1 device  0 [0000:8f:00] NVIDIA "
    "H200",
    f"{_SKY}#  Rank 15 Group  0 Pid   4940 on nc-d87e1263-worker1 device  7 [0000:cc:00] NVIDIA "
    "H200",
    f"{_SKY}#",
    f"{_SKY}#                                                              out-of-place         "
    "              in-place",
    f"{_SKY}#       size         count      type   redop    root     time   algbw   busbw #wrong "
    "    time   algbw   busbw #wrong",
    f"{_SKY}#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
    "      (us)  (GB/s)  (GB/s)",
    f"{_SKY}  1073741824      16777216     float    none      -1   3123.9  343.72  322.23      0"
    "   3079.7  348.65  326.86      0",
    f"{_SKY}  2147483648      33554432     float    none      -1   6229.6  344.72  323.18      0"
    "   6107.6  351.61  329.63      0",
    f"{_SKY}  4294967296      67108864     float    none      -1    12416  345.92  324.30      0"
    "    12133  354.00  331.87      0",
    f"{_SKY}  8589934592     134217728     float    none      -1    24724  347.44  325.72      0"
    "    24214  354.75  332.58      0",
    f"{_SKY}# Out of bounds values : 0 OK",
    f"{_SKY}# Avg bus bandwidth    : 122.073",
    f"{_SKY}#",
]


def test_launcher_prefixes_are_read_through() -> None:
    """Ray + OpenMPI --tag-output prefixes (real SkyPilot lines) and srun labels up to 2 digits;
    NCCL's own "host:pid:tid" lines and data rows are left as they are."""
    from verl_top.nccl.parse import strip_launcher_prefix

    res = parse_nccl_tests("\n".join(SKYPILOT_LINES), collective="all_gather")
    assert res.hosts == ["nc-d87e1263-head", "nc-d87e1263-worker1"]
    assert [r.size_bytes for r in res.rows] == [GIB, 2 * GIB, 4 * GIB, 8 * GIB]
    assert (res.busbw_max_large, res.busbw_max_size) == (332.58, 8 * GIB)
    assert res.collective == "all_gather" and res.complete
    records = NcclStreamParser("vm", "x").feed(SKYPILOT_LINES, 1.0)
    probes = [p for p in records if isinstance(p, ProbeResult)]
    assert len(probes) == 1 and probes[0].busbw_max_gbs == 332.58 and probes[0].nranks == 4
    assert strip_launcher_prefix("12: #  Rank 12 Group") == "#  Rank 12 Group"
    info = "node005:367195:367195 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB"
    assert strip_launcher_prefix(info) == info
    row = "  8589934592     134217728     float    none      -1    24724  347.44"
    assert strip_launcher_prefix(row) == row.strip()


# Lines quoted from the issue text of https://github.com/NVIDIA/nccl-tests/issues/182 (gim4moon,
# 2023-11-30; 2 VMs with 2 A100-PCIE-40GB and one HDR IB HCA each): the command, the whole
# header, then the last rows and both footers (the middle rows are left out). AddyLaddy (NVIDIA)
# answered: "That output doesn't look correct. Did you compile the nccl-tests with `MPI=1` ?"
# Each process ran its own 2-GPU test: two headers, "Rank 0" on both hosts, busbw == algbw
# (2 ranks), two footers.
NO_MPI_182 = """\
root@testgpu1:/nccl-tests# mpirun -x NCCL_DEBUG=WARN -x NCCL_IB_HCA=mlx5_0 -x NCCL_NET_GDR_LEVEL=5 \
-x NCCL_SHM_DISABLE=1 -x NCCL_IB_MERGE_VFS=0 -x NCCL_IB_DISABLE=0 -np 2 --allow-run-as-root \
-H testgpu1,testgpu2 ./build/all_reduce_perf -b 8 -e 256M -f 2 -g 2
# nThread 1 nGpus 2 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg \
iters: 1 validation: 1 graph: 0
#
# Using devices
# nThread 1 nGpus 2 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg \
iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   3591 on   testgpu1 device  0 [0x03] NVIDIA A100-PCIE-40GB
#  Rank  1 Group  0 Pid   3591 on   testgpu1 device  1 [0x03] NVIDIA A100-PCIE-40GB
#  Rank  0 Group  0 Pid   2451 on   testgpu2 device  0 [0x03] NVIDIA A100-PCIE-40GB
#  Rank  1 Group  0 Pid   2451 on   testgpu2 device  1 [0x03] NVIDIA A100-PCIE-40GB
NCCL version 2.19.3+cuda12.3
NCCL version 2.19.3+cuda12.3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
#
#
   134217728      33554432     float     sum      -1    27691    4.85    4.85      0    27634    4.86    4.86      0
   134217728      33554432     float     sum      -1    29708    4.52    4.52      0    29694    4.52    4.52      0
   268435456      67108864     float     sum      -1    55225    4.86    4.86      0    55242    4.86    4.86      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.80135
#

   268435456      67108864     float     sum      -1    59067    4.54    4.54      0    59082    4.54    4.54      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.65866
#
"""


def test_separate_runs_per_process_are_not_judged_as_one_multi_node_run() -> None:
    """nccl-tests without MPI=1 under mpirun: "Rank 0" on two hosts. Before, verl-top judged it
    as 2 nodes x 2 GPUs at 10 % of an assumed 47 GB/s; it is two single-node runs."""
    res = parse_nccl_tests(NO_MPI_182)
    assert [(d.rank, d.host) for d in res.devices] == [
        (0, "testgpu1"), (1, "testgpu1"), (0, "testgpu2"), (1, "testgpu2"),
    ]  # fmt: skip
    probe = res.to_probe("vm", 1.0)
    assert not probe.ok
    assert "rank 0 is listed twice (testgpu1, testgpu2)" in probe.error
    assert "MPI=1" in probe.error
    findings, checks = _step2(_store(Path("no_mpi.log"), NO_MPI_182))
    assert "nccl.busbw_low" not in findings and "nccl.transport_socket" not in findings
    for rule in ("nccl.busbw_low", "nccl.transport_socket"):
        assert checks[rule].status == "no_data"
        assert "rank 0 is listed twice" in checks[rule].detail


def test_a_failed_runs_reason_is_one_bounded_line() -> None:
    """A failed probe's error (a remote traceback) shows as its first line, at most 200 chars."""
    store = Store()
    err = "Traceback: rank 1 died " + "x" * 500 + "\n  File probe.py, line 9\nRuntimeError"
    store.ingest(ProbeResult(host="a", t=1.0, tool="torch", hosts=["a", "b"], ok=False, error=err))
    _, checks = _step2(store)
    for rule in ("nccl.busbw_low", "nccl.transport_socket"):
        detail = checks[rule].detail
        assert detail.startswith("torch: Traceback: rank 1 died")
        assert len(detail) == len("torch: ") + 200 and "\n" not in detail


AZURE = FIX / "real_2node_16xA100_azure_ndmv4_ib_all_reduce.txt"


def test_output_pasted_from_the_column_header_takes_hosts_from_nccls_rank_lines() -> None:
    """Azure NDm A100 v4 (2 x 8 A100, 8 x HDR IB): no "# Rank" lines; NCCL's Init COMPLETE
    (ranks 8-15) and Destroy COMPLETE (0-15) lines name every rank's host."""
    res = parse_nccl_tests(AZURE.read_text())
    assert res.devices == [] and res.log is not None and res.log.nranks == 16
    assert res.gpus_per_host == {
        "nccl-allreduce-job1-mpiworker-0": 8,
        "nccl-allreduce-job1-mpiworker-1": 8,
    }
    probe = res.to_probe("vm", 1.0)
    assert probe.nranks == 16 and probe.scope == "inter" and probe.transport == ""
    assert len(probe.rows) == 31 and (probe.busbw_max_gbs, probe.peak_size_bytes) == (
        189.28,
        8 * GIB,
    )
    # Only the Init COMPLETE lines (ranks 8-15 of 16): hosts stay unknown rather than "1 node".
    init_only = AZURE.read_text().split("Destroy COMPLETE")[0].rsplit("\n", 1)[0]
    part = parse_nccl_tests(init_only)
    assert part.hosts == [] and part.to_probe("vm", 1.0).nranks == 0


def test_azure_ib_run_needs_a_number_and_is_healthy_against_the_vms_nics() -> None:
    """No GPU name, no NIC line: no guess; with the VM's 8 x HDR (8 x 23 GB/s) it is 103 %."""
    findings, checks = _step2(_store(AZURE))  # the --nccl-log path: the stream parser
    assert not findings
    assert checks["nccl.busbw_low"].status == "no_data"
    assert "--expect-busbw" in checks["nccl.busbw_low"].detail
    assert (
        "2-node nccl-tests output has no NCCL INFO line" in checks["nccl.transport_socket"].detail
    )
    th = dataclasses.replace(Thresholds(), **expect_busbw_overrides(["184"]))
    findings, checks = _step2(_store(AZURE), th)
    assert "nccl.busbw_low" not in findings
    assert checks["nccl.busbw_low"].status == "passed"
    assert "189 GB/s at 8 GiB = 103 % of 184 GB/s (set by --expect-busbw)" in (
        checks["nccl.busbw_low"].detail
    )


IB_GDR = FIX / "real_2node_2xA100_ib_hdr_gdr_cross_socket_low.txt"
IB_NOGDR = FIX / "real_2node_2xA100_ib_hdr_no_gdr_low.txt"
HDR = 200 / 8 * 0.94  # verl-top's HDR NIC figure (EXPECTED_JUDGEMENTS.md wrote ~23)


def test_ib_run_with_info_lines_gdrdma_is_judged_low() -> None:
    """NVIDIA/nccl-tests#293: 2 x 1 A100 PCIe, one HDR HCA each across the CPU socket; NCCL INFO
    says NET/IB mlx5_0/IB and channels via NET/IBext_v8/0/GDRDMA; 6.44 GB/s at 1 GiB."""
    res = parse_nccl_tests(IB_GDR.read_text())
    assert res.gpus_per_host == {"test1": 1, "test2": 1} and res.collective == "all_reduce"
    assert len(res.rows) == 28 and res.rows[-1].size_bytes == GIB
    assert res.log is not None and res.log.nic_list() == ["mlx5_0/IB"]
    probe = res.to_probe("vm", 1.0)
    assert probe.transport == "IB+GDRDMA" and probe.nics == 1
    assert probe.settings["NCCL_NET_GDR_LEVEL"] == "SYS"
    findings, checks = _step2(_store(IB_GDR))
    assert checks["nccl.transport_socket"].status == "passed"
    assert "IB+GDRDMA" in checks["nccl.transport_socket"].detail
    low = findings["nccl.busbw_low"]
    assert (low.data["busbw_gbs"], low.data["size_bytes"]) == (6.44, GIB)
    assert low.data["expected_gbs"] == pytest.approx(HDR) and low.data["assumed"] is False
    assert low.data["ratio"] == pytest.approx(6.44 / HDR) and low.severity > 0.5
    assert low.data["expected_basis"].startswith("1 NIC(s) per node (NCCL log")
    assert "transport: IB+GDRDMA" in low.evidence
    # Small links keep a decimal: not "6 GB/s is 27 % of the 24 GB/s".
    assert low.title == "NCCL all_reduce busbw 6.4 GB/s is 27 % of the 23.5 GB/s expected"
    verdict = Engine().evaluate(_store(IB_GDR))
    assert (verdict.bottleneck_step, verdict.bottleneck_rule) == (2, "nccl.busbw_low")


def test_ib_run_without_gdrdma_is_low_and_says_so() -> None:
    """The same nodes after the BIOS change: channels via NET/IBext_v8/0 (no /GDRDMA), peak at
    >= 1 GiB 8.79 GB/s (the 9.00 at 256 MiB is below 1 GiB and not used)."""
    probe = parse_nccl_tests(IB_NOGDR.read_text()).to_probe("vm", 1.0)
    assert probe.transport == "IB" and probe.nics == 1
    assert probe.settings["NCCL_NET_GDR_LEVEL"] == "PXB"  # NCCL's echo beats the "-x ...=2"
    findings, checks = _step2(_store(IB_NOGDR))
    assert checks["nccl.transport_socket"].status == "passed"
    low = findings["nccl.busbw_low"]
    assert (low.data["busbw_gbs"], low.data["size_bytes"]) == (8.79, GIB)
    assert low.data["ratio"] == pytest.approx(8.79 / HDR) and low.data["assumed"] is False
    assert any("IB without GPUDirect RDMA" in e for e in low.evidence)


RDMA_PLUGIN = FIX / "real_2node_16xH100_ib_ndr_rdma_plugin_ring_low_PARTIAL.txt"


def test_ib_through_hpcx_rdma_plugin_is_ib_and_judged_low() -> None:
    """NVIDIA/nccl-tests#319 (partial): channels "via NET/NCCL RDMA Plugin v8/0/GDRDMA", the
    plugin's "P2P plugin v8 IBext_v8" and NET/IB's 8 HCAs: IB+GDRDMA, 44.41 GB/s = 12 % of 8 x
    NDR. Before, the transport was reported as an unknown plugin named "NCCL RDMA Plugin v8"."""
    res = parse_nccl_tests(RDMA_PLUGIN.read_text())
    assert res.gpus_per_host == {"lccn09": 8, "lccn19": 8} and len(res.rows) == 32
    assert res.log is not None and res.log.p2p_layer == "IBext_v8"
    assert len(res.log.nic_list()) == 8 and all(n.endswith("/IB") for n in res.log.nic_list())
    probe = res.to_probe("vm", 1.0)
    assert probe.transport == "IB+GDRDMA" and probe.nics == 8
    assert probe.settings["NCCL_ALGO"] == "RING"
    assert probe.settings["NCCL_IB_QPS_PER_CONNECTION"] == "64"
    findings, checks = _step2(_store(RDMA_PLUGIN))
    assert "IB+GDRDMA" in checks["nccl.transport_socket"].detail
    low = findings["nccl.busbw_low"]
    assert (low.data["busbw_gbs"], low.data["size_bytes"]) == (44.41, GIB)  # not 60.0 at 16 MiB
    assert low.data["expected_gbs"] == pytest.approx(NDR8) and low.data["assumed"] is False
    assert low.data["ratio"] == pytest.approx(44.41 / NDR8) and low.severity > 0.5
    assert low.data["expected_basis"].startswith("8 NIC(s) per node (NCCL log")


def test_rdma_plugin_over_ucx_is_not_called_ib() -> None:
    """The same plugin name over its UCX layer is not NCCL's IB verbs transport: it stays the
    plugin, reported verbatim (lines built from the #319 format, layer changed to UCX)."""
    from verl_top.nccl.parse import parse_nccl_log

    via = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/NCCL RDMA Plugin v8/0/GDRDMA"
    ucx, _ = parse_nccl_log("h:1:2 [0] NCCL INFO P2P plugin v8 UCX\n" + via)
    assert ucx.network() == "NCCL RDMA Plugin v8"
    ib, _ = parse_nccl_log("h:1:2 [0] NCCL INFO P2P plugin IBext_v8\n" + via)
    assert ib.network() == "IB+GDRDMA"
