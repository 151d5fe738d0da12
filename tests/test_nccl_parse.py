"""nccl-tests and NCCL_DEBUG parsers on the real fixtures (values read by hand from the files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.model import LogEvent, NcclInfo, ProbeResult
from verl_top.nccl.parse import (
    NcclStreamParser,
    classify_event,
    parse_nccl_log,
    parse_nccl_tests,
    parse_watchdog,
)

FIX = Path(__file__).parent / "fixtures" / "nccl"
TWO_NODE = "real_2node_16xH200_socket_all_reduce.txt"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_two_node_socket_run_peak_not_average() -> None:
    r = parse_nccl_tests(read(TWO_NODE))
    assert r.collective == "all_reduce"  # from the mpirun command line (no "starting" line)
    assert r.nranks == 16
    assert r.hosts == ["nvidiatools-dgx-2d-workload", "nvidiatools-dgx-9d-workload"]
    assert r.gpu_name == "NVIDIA H200"
    assert r.nccl_version == "2.27.3+cuda12.9"
    assert len(r.rows) == 32
    assert r.rows[0].size_bytes == 8 and r.rows[-1].size_bytes == 17179869184
    big = next(row for row in r.rows if row.size_bytes == 8589934592)
    assert (big.time_us, big.algbw_gbs, big.busbw_gbs) == (174409.0, 49.25, 92.35)
    assert big.in_place_busbw_gbs == 92.33
    assert r.avg_busbw == pytest.approx(36.2205)
    assert r.busbw_max_large == 92.35 and r.busbw_max_size == 8589934592
    assert not r.large_fallback and not r.errors and r.complete
    probe = r.to_probe("h", 1.0)
    assert probe.scope == "inter" and probe.busbw_max_gbs == 92.35 and probe.ok


@pytest.mark.parametrize(
    ("name", "collective", "nrows", "last_algbw"),
    [
        ("all_reduce_perf_g1.txt", "all_reduce", 14, 2083.1),
        ("all_gather_perf_g1.txt", "all_gather", 5, 2076.3),
        ("all_reduce_perf_debug_g1.txt", "all_reduce", 3, 432.01),
    ],
)
def test_single_gpu_runs_have_zero_busbw(
    name: str, collective: str, nrows: int, last_algbw: float
) -> None:
    r = parse_nccl_tests(read(name))
    assert r.collective == collective
    assert r.nranks == 1 and r.hosts == ["vm"]
    assert r.tests_version == "2.19.6"
    assert r.nccl_version.startswith("2.28.9")  # nccl-library=22809 / NCCL INFO line
    assert len(r.rows) == nrows and r.rows[-1].algbw_gbs == last_algbw
    assert all(row.busbw_gbs == 0.0 for row in r.rows)
    assert r.avg_busbw == 0 and r.busbw_max_large == 0.0


def test_small_sweep_falls_back_and_flags() -> None:
    r = parse_nccl_tests(read("all_reduce_perf_debug_g1.txt"))
    assert r.large_fallback  # max size 4 MiB < 256 MiB
    assert r.log is not None and r.log.transport() == "Socket"


def test_old_layout_without_root_and_error_header() -> None:
    # Constructed from the real 2-node file: the 2021-2024 layout had no root column and named
    # the column "error"; -c 0 prints N/A.
    text = read(TWO_NODE).replace("    root", "").replace("#wrong", " error")
    text = "\n".join(
        line.replace("     sum      -1", "     sum").replace("      0\n", "    N/A\n")
        for line in text.splitlines()
    )
    r = parse_nccl_tests(text)
    assert len(r.rows) == 32 and r.busbw_max_large == 92.35 and not r.errors


def test_wrong_values_are_errors_and_collective_can_be_passed() -> None:
    lines = read("all_reduce_perf_g1.txt").splitlines()
    lines = [ln for ln in lines if "Collective test" not in ln]
    body = "\n".join(lines).replace("0.00       0     1.35", "0.00       7     1.35")
    r = parse_nccl_tests(body, collective="reduce_scatter")
    assert r.collective == "reduce_scatter"
    assert r.errors == ["7 wrong values at size 536870912"]
    assert not r.to_probe().ok


def test_debug_log_classification() -> None:
    state, events = parse_nccl_log(read("all_reduce_perf_debug_g1.txt"))
    assert state.transport() == "Socket"
    assert state.no_ib_device  # "NET/IB : No device found."
    assert state.version == "2.28.9+cuda13.0"
    assert (state.nranks, state.nnodes, state.init_complete) == (1, 1, 1)
    assert events == []


# Real lines quoted in gpu_comm.md §2.2/§2.5 (issues named there), with launcher prefixes.
IB_LOG = [
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:192.168.11.1<0>",
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO comm 0x5581 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO Channel 03/0 : 7[3] -> 5[1] via P2P/CUMEM",
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA",
    "(WorkerDict pid=812) node1:812:900 [0] NCCL INFO ncclCommInitRank comm 0x8ec0ac0 rank 6 nranks 16 cudaDev 6 nvmlDev 6 busId c8000 commId 0x49bbd7790311d5eb - Init COMPLETE",
]


def test_ib_gdr_with_ray_prefix() -> None:
    state, _ = parse_nccl_log("\n".join(IB_LOG))
    assert state.transport() == "IB+GDRDMA"
    assert (state.nranks, state.nnodes, state.init_complete) == (16, 2, 1)
    assert state.ib_devices == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [
                "[rank3]:x:1:1 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5"
            ],
            "IB",
        ),
        (
            [
                "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.0.1<0>",
                "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            ],
            "RoCE+GDRDMA",
        ),
        (
            ["h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IBext_v8/4/GDRDMA"],
            "IB+GDRDMA",
        ),
        (
            [
                "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/AWS Libfabric/0/GDRDMA"
            ],
            "AWS Libfabric",
        ),
        (["h:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/3"], "Socket"),
        (["h:1:1 [0] NCCL INFO Channel 00/0 : 1[21000] -> 0[1000] via P2P/direct pointer"], "P2P"),
        (["h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct"], "SHM"),
        (
            [
                "h:1:1 [0] NCCL INFO Connected NVLS tree",
                "h:1:1 [0] NCCL INFO Channel 03/0 : 7[3] -> 5[1] via P2P/CUMEM",
            ],
            "NVLS",
        ),
    ],
)
def test_classifier(lines: list[str], expected: str) -> None:
    state, _ = parse_nccl_log("\n".join(lines))
    assert state.transport() == expected


WATCHDOG = (
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
    "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)


def test_watchdog_and_warn_events() -> None:
    wd = parse_watchdog(WATCHDOG)
    assert wd is not None
    assert (wd.rank, wd.seq, wd.op_type, wd.timeout_ms, wd.ran_for_ms) == (
        0,
        1580,
        "ALLREDUCE",
        600000,
        600060,
    )
    ev = classify_event(WATCHDOG)
    assert ev is not None and ev.kind == "watchdog" and ev.severity == 1.0
    warn = classify_event(
        "node:1:2 [3] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4> with status=12 opcode=1 len=0 vendor err 129"
    )
    assert warn is not None and warn.kind == "nccl_warn" and warn.severity == 0.6
    benign = classify_event(
        "h:1:1 [0] misc/socket.cc:484 NCCL WARN Call to bind failed: Address already in use"
    )
    assert benign is not None and benign.severity == 0.1
    assert classify_event("h:1:1 [0] NCCL INFO Using network Socket") is None


def test_stream_parser_emits_info_on_change_and_probe_once() -> None:
    lines = read("all_reduce_perf_debug_g1.txt").splitlines()
    p = NcclStreamParser("vm-host", "/logs/nccl.log")
    out = []
    for i in range(0, len(lines), 5):
        out += p.feed(lines[i : i + 5], float(i))
    infos = [r for r in out if isinstance(r, NcclInfo)]
    probes = [r for r in out if isinstance(r, ProbeResult)]
    assert infos[-1].transport == "Socket" and infos[-1].init_complete == 1
    assert infos[-1].version == "2.28.9+cuda13.0" and infos[-1].path == "/logs/nccl.log"
    assert len({(i.transport, i.version, i.nranks, i.init_complete) for i in infos}) == len(infos)
    assert len(probes) == 1
    probe = probes[0]
    assert probe.host == "vm-host" and probe.nranks == 1 and probe.tool == "nccl-tests"
    assert probe.expected_gbs is None  # one rank: no bus
    assert p.feed(["vm:1 [0] NCCL INFO Channel 00/64 : 0"], 99.0) == []  # no change, no record


def test_stream_parser_two_node_probe_and_reset() -> None:
    p = NcclStreamParser("h", "f")
    out = p.feed(read(TWO_NODE).splitlines(), 5.0)
    probes = [r for r in out if isinstance(r, ProbeResult)]
    assert len(probes) == 1 and probes[0].busbw_max_gbs == 92.35 and probes[0].scope == "inter"
    p.reset()
    assert p.feed(["random line"], 6.0) == []


def test_stream_parser_dedupes_watchdog_repeats() -> None:
    p = NcclStreamParser("h", "f")
    again = (
        "what():  [PG 3 Rank 0] Process group watchdog thread terminated with exception: "
        + WATCHDOG.split("] ", 2)[2]
    )
    out = p.feed([WATCHDOG, again], 1.0)
    events = [r for r in out if isinstance(r, LogEvent)]
    assert len(events) == 1 and events[0].host == "h" and events[0].path == "f"


def test_hostile_text_in_nccl_output_is_cleaned_where_it_enters() -> None:
    """Host and GPU names, errors and WARN events read from nccl-tests output reach the screen
    and exports: escapes, controls and bidi overrides never get through the parser."""
    from verl_top.nccl.parse import classify_event, parse_nccl_tests

    evil = "\x1b]0;pwned\x07\u202e\x1b[2J"
    text = (
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 1 iters: 1\n"
        f"#  Rank  0 Group  0 Pid    1 on node{evil}a device  0 [0x01] NVIDIA{evil} H200\n"
        f"#  Rank  0 Group  0 Pid    2 on node{evil}b device  0 [0x01] NVIDIA H200\n"
    )
    res = parse_nccl_tests(text, "all_reduce")
    seen = [d.host for d in res.devices] + [d.name for d in res.devices] + [res.to_probe().error]
    assert res.devices and all(not any(c in s for c in ("\x1b", "\x07", "\u202e")) for s in seen), (
        seen
    )
    ev = classify_event(f"host:1:2 [0] NCCL WARN {evil}bad things")
    assert ev is not None and "\x1b" not in ev.text and "\u202e" not in ev.text


def test_a_row_with_a_5000_digit_size_is_dropped_counted_and_the_stream_goes_on() -> None:
    """Issue 31: int() of 5000 digits raised ValueError and killed the NCCL source; a row of
    inf/negative numbers is no measurement either."""
    lines = read(TWO_NODE).splitlines()
    rows = [i for i, line in enumerate(lines) if line.split()[:1] and line.split()[0].isdigit()]
    bad = list(lines)
    bad[rows[2]] = "9" * 5000 + " " + " ".join(lines[rows[2]].split()[1:])
    bad[rows[3]] = "   1024  256  float  sum  -1  1e400  inf  -5  0  1.0  2.0  3.0  N/A"
    good, res = parse_nccl_tests("\n".join(lines)), parse_nccl_tests("\n".join(bad))
    assert res.dropped_rows == 2 and len(res.rows) == len(good.rows) - 2
    probe = res.to_probe("h", 1.0)
    assert probe.ok and "2 data rows with impossible numbers skipped" in probe.error
    assert probe.busbw_max_gbs == good.busbw_max_large == 92.35
    p = NcclStreamParser("h", "f")
    out = p.feed(bad, 5.0) + p.feed(lines, 6.0)  # the stream survives and reads the next run
    assert len([r for r in out if isinstance(r, ProbeResult)]) == 2


def test_nccl_numbers_longer_than_18_digits_are_not_read_as_nccl_lines() -> None:
    from verl_top.nccl.parse import NcclLogState

    state = NcclLogState()
    huge = "9" * 5000
    state.feed_line(f"node:1:1 [0] NCCL INFO comm 0x5 rank 0 nRanks {huge} nNodes 2 localRanks 1")
    state.feed_line(f"# nThread {huge} nGpus 1")
    assert state.nranks is None or state.nranks < 10**18
