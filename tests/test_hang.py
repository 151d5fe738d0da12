"""job.hang: a method overrunning its own history, GPUs not computing, the process named.

History is the real verl 0.5.0 log's timings (tests/hang_data.py says what is real and what is
constructed). Expected numbers, worked out from the log before running the rule:
- generate_sequences, last 20 steps sorted: 1.58 1.58 1.69 1.73 1.77 1.79 1.79 1.87 1.87 1.87
  1.89 1.93 1.96 1.97 1.98 2.13 2.47 2.68 2.70 3.16 -> p50 = (1.87 + 1.89) / 2 = 1.88 s,
  p95 = 2.70 + 0.05 x 0.46 = 2.72 s; 3 x p95 = 8.2 s < 20 s, so the limit is 20 s.
- update_actor, last 20 steps: every value 0.038-0.065 s -> the limit is 20 s too.
"""

from __future__ import annotations

import re

import pytest

from tests.hang_data import (
    T0,
    JobProcessRecord,
    gpu,
    hello,
    history,
    new_pipeline,
    with_jobs,
    worker,
)
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import Finding
from verl_top.diagnosis.hang import job_hang
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import LogLines, ProcessList
from verl_top.nccl.parse import watchdog_ties
from verl_top.progress import ProgressTracker
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

TH = Thresholds()
S = T0  # the moment the method starts


def _single_gpu(stop_after: float, end: float, busy_after: bool = False) -> Store:
    """One H200, one WorkerDict that enters generate_sequences at S; its GPU works for
    ``stop_after`` s, then is idle (the process was stopped) unless ``busy_after``."""
    store, pipe = new_pipeline()
    pipe.emit(hello("h200", 1, S - 100))
    history(pipe, S - 100)
    pipe.emit(ProcessList(host="h200", t=S - 60, procs=[worker(2481, 0, "", 3.0, 0)]))
    title = "actor_rollout_generate_sequences"
    pipe.emit(ProcessList(host="h200", t=S, procs=[worker(2481, 0, title, 99.0, 0)]))
    t, k = S - 60, 0
    while t <= end:
        kind = "busy" if t < S + stop_after or busy_after else "idle"
        pipe.emit(gpu("h200", 0, t, kind, k))
        t, k = t + 1, k + 1
    return store


def _eval(store: Store) -> tuple[object, list[Finding]]:
    v = Engine().evaluate(store)
    return job_hang(View(store, TH), TH), v.findings


def test_a_stopped_worker_is_flagged_after_its_method_overruns_and_named() -> None:
    early, _ = _eval(_single_gpu(stop_after=2, end=S + 15))
    assert not isinstance(early, Finding)  # 15 s < the 20 s limit
    hang, findings = _eval(_single_gpu(stop_after=2, end=S + 25))
    assert isinstance(hang, Finding)
    assert hang.data["method"] == "generate_sequences"
    assert hang.data["limit_s"] == pytest.approx(20.0)
    assert hang.data["usual_s"] == pytest.approx(1.88, abs=0.01)
    assert hang.cost_s == pytest.approx(25 - 1.88, abs=0.1)
    assert [c["pid"] for c in hang.data["culprits"]] == [2481]
    assert "rank 0 (actor/rollout) on h200" in hang.title and "GPU idle" in hang.title
    assert "20 runs: timing_s/generate_sequences of 20 steps" in hang.evidence[0]
    # job.stalled (no step for far more than 3x the median step) defers to the named hang
    rules = [f.rule for f in findings]
    assert "job.hang" in rules and "job.stalled" not in rules
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in hang.advice  # no watchdog lines: how to get dumps


def test_a_long_stage_whose_gpu_computes_is_not_a_hang() -> None:
    hang, findings = _eval(_single_gpu(stop_after=0, end=S + 40, busy_after=True))
    assert not isinstance(hang, Finding)
    assert "not a hang" in hang.detail
    assert "job.hang" not in [f.rule for f in findings]


def _fleet(pipe: Pipeline, end: float, odd: int, jobs: bool = False, state: str = "R") -> None:
    """2 hosts x 4 GPUs, ranks 0-7 enter update_actor at S; from S+2 rank ``odd``'s GPU is
    idle and its CPU 0 % (state ``state`` in job records), the others spin in NCCL at 100 %
    CPU (constructed spin samples)."""
    hosts = {"a": range(0, 4), "b": range(4, 8)}
    for host, ranks in hosts.items():
        pipe.emit(hello(host, 4, S - 100))
        for t, method, cpu in ((S - 30, "", 2.0), (S, "actor_rollout_update_actor", 100.0)):
            procs = [worker(5000 + r, r % 4, method, cpu, r) for r in ranks]
            plist = ProcessList(host=host, t=t, procs=procs)
            if jobs:
                recs = [
                    JobProcessRecord(
                        pid=5000 + r,
                        state=state if (r == odd and method) else "R",
                        title="ray::WorkerDict" + (f".{method}" if method else ""),
                        method=method or None,
                        method_since=t if method else None,
                        cpu_pct=0.0 if (r == odd and method) else cpu,
                        gpus=[r % 4],
                        role="trainer",
                    )
                    for r in ranks
                ]
                # Straight into the store: the pipeline's copy would drop the attribute that
                # stands in for ProcessList.job_procs until the field is in model.py.
                pipe.store.ingest(with_jobs(plist, recs))
                continue
            pipe.emit(plist)
    t, k = S - 30, 0
    while t <= end:
        for host, ranks in hosts.items():
            for r in ranks:
                kind = "busy" if t < S + 2 else ("idle" if r == odd else "spin")
                pipe.emit(gpu(host, r % 4, t, kind, k))
        t, k = t + 1, k + 1


def test_the_rank_whose_gpu_idles_while_its_peers_spin_is_the_one_named() -> None:
    store, pipe = new_pipeline()
    history(pipe, S - 100)
    _fleet(pipe, S + 25, odd=5)
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding)
    assert [(c["host"], c["rank"]) for c in hang.data["culprits"]] == [("b", 5)]
    assert "GPU idle while 7 peers spin in NCCL" in hang.title
    assert "7 other process(es) wait" in hang.title
    lines = [e for e in hang.evidence if "update_actor" in e and "8 process(es)" in e]
    # the lists are 25 s old (the agent re-sends unchanged ones every 30 s): no CPU claimed
    assert lines and re.search(
        r"state not reported; CPU n/a \(its process lists are 25 s old\); .*NVML util \d-100 %",
        lines[0],
    )


def test_job_process_records_name_the_stopped_rank_and_its_state() -> None:
    store, pipe = new_pipeline()
    history(pipe, S - 100)
    _fleet(pipe, S + 25, odd=2, jobs=True, state="T")
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding) and hang.severity == 1.0
    assert [(c["host"], c["pid"]) for c in hang.data["culprits"]] == [("a", 5002)]
    assert "stopped (T)" in hang.title
    assert "kill -CONT 5002" in hang.advice


def test_watchdog_lines_are_tied_to_ranks_and_the_silent_rank_is_said() -> None:
    store, pipe = new_pipeline()
    history(pipe, S - 100)
    _fleet(pipe, S + 25, odd=5)
    # The real line of reference/gpu_comm.md §2.5 (torch 2.5), re-issued for ranks 0-7 but 5.
    line = (
        "[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [PG 0 Rank {r}] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
        "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
        "milliseconds before timing out."
    )
    lines = [line.format(r=r) for r in range(8) if r != 5]
    pipe.emit(LogLines(host="a", t=S + 25, path="/tmp/nccl.log", kind="nccl", lines=lines))
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding)
    text = "\n".join(hang.evidence)
    assert "ranks 0-4, 6, 7 of process group 0 timed out in ALLREDUCE (SeqNum 1580)" in text or (
        "timed out in ALLREDUCE (SeqNum 1580)" in text and "rank 5 printed no timeout" in text
    )
    assert "rank 5 printed no timeout" in text
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in hang.advice


def test_without_process_lists_the_rule_says_what_it_needs() -> None:
    store, pipe = new_pipeline()
    history(pipe, S - 100)
    check = job_hang(View(store, TH), TH)
    assert not isinstance(check, Finding) and check.status == "no_data"


def test_tracker_keeps_each_occurrence_as_its_slowest_rank() -> None:
    tr = ProgressTracker()

    def lst(t: float, methods: list[str]) -> ProcessList:
        return ProcessList(
            host="a",
            t=t,
            procs=[worker(100 + i, i, m, 50.0) for i, m in enumerate(methods)],
        )

    up = "actor_rollout_update_actor"
    tr.observe(lst(10, [up] * 4))
    tr.observe(lst(12, ["", "", up, up]))
    tr.observe(lst(13, ["", "", "", up]))
    tr.observe(lst(14, [""] * 4))
    assert tr.durations("update_actor") == [4.0]
    tr.observe(lst(40, [up] * 4))
    assert tr.since("a", 101, "update_actor") == 40
    tr.observe(lst(42, [""] * 4))
    assert tr.durations("update_actor") == [4.0, 2.0]
    tr.observe(ProcessList(host="a", t=50, procs=[]))  # processes gone: forgotten
    assert tr.since("a", 101, "") is None


def test_watchdog_lines_in_a_followed_verl_log_become_events_with_rank_and_pid() -> None:
    store, pipe = new_pipeline()
    # A worker's stderr in the driver's console: Ray's prefix (format of the real verl 0.5.0
    # log) before the real watchdog line of reference/gpu_comm.md §2.5 (sglang#1693 form).
    line = (
        "\x1b[36m(WorkerDict pid=55154, ip=10.0.0.2)\x1b[0m [rank3]:[E626 06:24:44.906457629 "
        "ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=1, "
        "NumelOut=8, Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
    )
    abort = "what():  [PG 0 Rank 3] Process group watchdog thread terminated: " + line[40:]
    pipe.emit(LogLines(host="head", t=S, path="/tmp/driver.log", kind="verl", lines=[line, abort]))
    events = [e for e in store.events if e.kind == "watchdog"]
    assert len(events) == 1 and events[0].t == S  # the abort message repeats it: counted once
    (rep,) = watchdog_ties(store.events).timed_out()
    # The verl parser hands NCCL lines over without Ray's prefix: the rank ties, not the pid.
    assert (rep.rank, rep.pg, rep.seq, rep.op_type) == (3, "0", 9141, "_ALLGATHER_BASE")


def test_a_first_checkpoint_save_is_not_judged_by_the_step_time() -> None:
    # No save_checkpoint history (the real log has no timing_s/save_checkpoint): 90 s of a
    # first save with the GPU idle is no hang, while the step-based limit (3 x ~2 s) would say so.
    store, pipe = new_pipeline()
    pipe.emit(hello("h200", 1, S - 100))
    history(pipe, S - 100)
    save = "actor_rollout_save_checkpoint"
    pipe.emit(ProcessList(host="h200", t=S, procs=[worker(2481, 0, save, 20.0, 0)]))
    for k in range(-30, 91):
        pipe.emit(gpu("h200", 0, S + k, "busy" if k < 0 else "idle", k))
    check = job_hang(View(store, TH), TH)
    assert not isinstance(check, Finding) and "overruns after 600 s" in check.detail
