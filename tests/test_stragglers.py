"""Stragglers (map.imbalance, diagnosis/straggler.py): named within seconds, with a cause.

GPU rows are real H200 trace rows (tests/hang_data.py); the verl history is the real 40-step
log. What each test changes on top (throttle bits and clocks, iowait, network rates, silences)
is constructed and said there. Expected values are computed from those inputs below, as the
rule's documentation defines them (docs/hangs.md), not read back from the tool.
"""

from __future__ import annotations

import pytest

from tests.hang_data import BUSY, T0, TRACE, gpu, hello, history, new_pipeline
from verl_top.diagnosis.findings import Finding
from verl_top.diagnosis.step4_mapping import map_imbalance
from verl_top.diagnosis.straggler import GPU_STAGES
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import HostSample, LogEvent, LogLines
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.prometheus import XID_TEXT
from verl_top.store import Store

TH = Thresholds()
NOW = T0 + 60
HOSTS = ("a", "b", "c")


def _fleet(
    gpu_over: dict | None = None,
    host_over: dict | None = None,
    silent: dict[str, list[tuple[float, float]]] | None = None,
) -> tuple[Store, Pipeline]:
    """3 hosts x 4 GPUs busy in the real decode rows for 60 s, a host sample per second;
    ``gpu_over(host, idx, t)`` / ``host_over(host, t)`` return field overrides, ``silent`` the
    (from, to) spans a host sends nothing."""
    store, pipe = new_pipeline()
    history(pipe, T0 - 100)
    for h in HOSTS:
        pipe.emit(hello(h, 4, T0 - 1))
    for k in range(61):
        t = T0 + k
        for h in HOSTS:
            if any(a <= t < b for a, b in (silent or {}).get(h, [])):
                continue
            for i in range(4):
                over = gpu_over(h, i, t) if gpu_over else {}
                kind = over.pop("kind", "busy")
                pipe.emit(gpu(h, i, t, kind, k, **over))
            fields = {"cpu_pct": 30.0, "iowait_pct": 1.0, "net_rx_bps": 4e8, "net_tx_bps": 4e8}
            fields.update(host_over(h, t) if host_over else {})
            pipe.emit(HostSample(host=h, t=t, cpu_per_core=[60.0], **fields))
    return store, pipe


def _culprits(store: Store) -> tuple[Finding | object, list[tuple]]:
    f = map_imbalance(View(store, TH), TH)
    found = f.data.get("culprits", []) if isinstance(f, Finding) else []
    return f, [(c["host"], c["gpu"], c["kind"]) for c in found]


def test_a_throttled_gpu_is_named_with_its_reasons_and_its_cost_per_step() -> None:
    def over(h: str, i: int, t: float) -> dict:
        if (h, i) == ("b", 2) and t > NOW - 4:  # constructed: HW slowdown + thermal, 1100 MHz
            return {"clock_reasons": 0x8 | 0x40, "sm_mhz": 1100.0}
        if (h, i) == ("c", 1):  # constructed: a healthy power cap, clock within 5 %
            return {"clock_reasons": 0x4, "sm_mhz": 1900.0}
        return {"clock_reasons": 0}

    store, _ = _fleet(over)
    f, found = _culprits(store)
    assert found == [("b", 2, "throttle")]  # c:gpu1's power cap at 1900 MHz is not a straggler
    assert "hw_slowdown, hw_thermal" in f.title and "More nodes will not help" in f.advice
    # The window holds the samples from NOW-6 to NOW (k = 54..60): b:gpu2's last 4 at 1100 MHz,
    # the rest at the real rows' clocks, which its peers keep.
    ks = range(54, 61)
    peers = sum(BUSY[k % len(BUSY)]["sm_mhz"] for k in ks) / len(ks)
    mine = sum(1100.0 if T0 + k > NOW - 4 else BUSY[k % len(BUSY)]["sm_mhz"] for k in ks) / len(ks)
    ratio = mine / peers
    view = View(store, TH)
    gpu_s = view.median_seconds(*GPU_STAGES)
    assert f.cost_s == pytest.approx(round(gpu_s * (1 / ratio - 1), 1), abs=0.05)
    assert f.save_s == f.cost_s


def test_a_node_starved_by_its_host_is_named_with_the_cause() -> None:
    stall = TRACE["host_stall_50pct"]  # real: GPU at ~20 % SM while the host stalls it

    def gpus(h: str, i: int, t: float) -> dict:
        if h == "c" and t > NOW - 5:
            row = stall[int(t) % len(stall)]
            return {"sm_util": row["gpm"]["SM_UTIL"], "util_gpu": float(row["util_gpu"])}
        return {}

    def iowait(h: str, t: float) -> dict:
        return {"iowait_pct": 45.0} if h == "c" and t > NOW - 5 else {}  # constructed

    store, _ = _fleet(gpus, iowait)
    f, found = _culprits(store)
    assert found == [("c", None, "host")]
    assert "host iowait" in f.title
    # The same GPUs without anything on the host: not named as a straggler here.
    store, _ = _fleet(gpus)
    assert _culprits(store)[1] == []


def test_a_failing_nic_is_named_from_nccl_warn_lines_or_a_collapsed_rate() -> None:
    store, pipe = _fleet()
    # The real WARN format of reference/gpu_comm.md §2.4 (NVIDIA/nccl#1814), host and HCA ours.
    line = (
        "b:2481:2612 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.3<53042> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid "
        "::ffff:10.0.0.2 remoteGid ::ffff:10.0.0.3 hca mlx5_3"
    )
    pipe.emit(LogLines(host="b", t=NOW, path="/job/nccl.log", kind="nccl", lines=[line]))
    f, found = _culprits(store)
    assert found == [("b", None, "nic")] and "mlx5_3" in "\n".join(f.evidence)

    def drop(h: str, t: float) -> dict:  # constructed: 5 % of its rate for the last 6 s
        return {"net_rx_bps": 2e7, "net_tx_bps": 2e7} if h == "a" and t >= NOW - 6 else {}

    store, _ = _fleet(host_over=drop)
    assert _culprits(store)[1] == [("a", None, "nic")]

    def always_low(h: str, t: float) -> dict:  # the head node: always less traffic
        return {"net_rx_bps": 2e7, "net_tx_bps": 2e7} if h == "a" else {}

    store, _ = _fleet(host_over=always_low)
    assert _culprits(store)[1] == []


def test_a_flapping_host_is_named_and_a_shared_silence_is_not() -> None:
    spans = [(T0 + 20, T0 + 26), (T0 + 40, T0 + 47)]  # constructed: two 6-7 s silences
    store, _ = _fleet(silent={"b": spans})
    f, found = _culprits(store)
    assert found == [("b", None, "flap")] and "went silent 2 times" in f.title
    store, _ = _fleet(silent={h: spans for h in HOSTS})  # everyone at once: the client's
    assert _culprits(store)[1] == []


def test_a_lost_gpu_leads_the_stragglers() -> None:
    store, _ = _fleet(lambda h, i, t: {"lost": True} if (h, i) == ("a", 3) and t == NOW else {})
    f, found = _culprits(store)
    assert found[0] == ("a", 3, "lost") and f.severity == 0.9


def test_an_xid_from_dcgm_names_its_gpu() -> None:
    store, pipe = _fleet()
    # The event the Prometheus source makes from DCGM_FI_DEV_XID_ERRORS (sources/prometheus.py).
    text = f"GPU 1: XID 79 ({XID_TEXT[79]}), from DCGM_FI_DEV_XID_ERRORS"
    pipe.emit(LogEvent(host="c", t=NOW - 2, kind="xid", text=text, path="prom", severity=0.9))
    f, found = _culprits(store)
    assert found == [("c", 1, "xid")] and f.severity == 0.9
    assert f"XID 79 ({XID_TEXT[79]})" in f.title
