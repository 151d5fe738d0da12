"""The monitor: one Assessment for every surface, a lead kept steady in data time, warm-up."""

from __future__ import annotations

from pathlib import Path

from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import Check, Finding, Verdict
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.inputs import Inputs
from verl_top.model import GpuSample, LogEvent
from verl_top.monitor import LeadKeeper, Monitor, assess_store
from verl_top.protocol import read_recording
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

SCEN = Path(__file__).resolve().parent / "scenarios"


def _finding(rule: str, step: int, severity: float = 0.6) -> Finding:
    return Finding(step, rule, severity, f"{rule} title", ["evidence"], "advice")


def _verdict(*findings: Finding) -> Verdict:
    lead = findings[0] if findings else None
    return Verdict(
        bottleneck_step=lead.step if lead else None,
        bottleneck_rule=lead.rule if lead else None,
        headline="",
        findings=list(findings),
        checks=[Check(1, "gpu.throttle", "passed", "")],
    )


def test_a_challenger_leads_only_after_hold_s_of_data_time() -> None:
    keeper = LeadKeeper(hold_s=30.0)
    train = _finding("flow.train_bound", 3)
    logprob = _finding("flow.logprob_slow", 3)
    assert keeper.update(_verdict(train, logprob), train, 100.0, settle=False) == "flow.train_bound"
    # logprob ranks first from t=110: shown only once it has led for 30 s of data time
    for t in (110.0, 120.0, 139.0):
        assert (
            keeper.update(_verdict(logprob, train), logprob, t, settle=False) == "flow.train_bound"
        )
    assert (
        keeper.update(_verdict(logprob, train), logprob, 140.0, settle=False) == "flow.logprob_slow"
    )


def test_an_interrupted_challenger_starts_over() -> None:
    keeper = LeadKeeper(hold_s=30.0)
    a, b = _finding("flow.train_bound", 3), _finding("flow.logprob_slow", 3)
    keeper.update(_verdict(a, b), a, 0.0 + 1, settle=False)
    keeper.update(_verdict(b, a), b, 10.0, settle=False)
    keeper.update(_verdict(a, b), a, 25.0, settle=False)  # a leads again: b's clock resets
    assert keeper.update(_verdict(b, a), b, 45.0, settle=False) == "flow.train_bound"
    assert keeper.update(_verdict(b, a), b, 75.0, settle=False) == "flow.logprob_slow"


def test_a_symptom_is_never_kept_over_a_cause() -> None:
    keeper = LeadKeeper(hold_s=1e9)
    idle = _finding("gpu.idle", 1, 0.9)
    train = _finding("flow.train_bound", 3, 0.5)
    assert keeper.update(_verdict(idle), idle, 10.0, settle=False) == "gpu.idle"
    assert keeper.update(_verdict(train, idle), train, 11.0, settle=False) == "flow.train_bound"


def test_a_lead_whose_finding_cleared_goes_at_once() -> None:
    keeper = LeadKeeper(hold_s=1e9)
    train, logprob = _finding("flow.train_bound", 3), _finding("flow.logprob_slow", 3)
    keeper.update(_verdict(train), train, 10.0, settle=False)
    assert keeper.update(_verdict(logprob), logprob, 11.0, settle=False) == "flow.logprob_slow"
    assert keeper.update(_verdict(), None, 12.0, settle=False) is None


def test_settling_follows_the_data() -> None:
    keeper = LeadKeeper(hold_s=1e9)
    a, b = _finding("flow.train_bound", 3), _finding("flow.logprob_slow", 3)
    keeper.update(_verdict(a, b), a, 10.0, settle=False)
    assert keeper.update(_verdict(b, a), b, 11.0, settle=False) == "flow.train_bound"
    assert keeper.update(_verdict(b, a), b, 11.0, settle=True) == "flow.logprob_slow"


def _idle_store_with_a_verl_log() -> Store:
    store = Store()
    store.log_stats["head:/tmp/driver.log"] = {
        "host": "head",
        "path": "/tmp/driver.log",
        "kind": "verl",
    }
    for i in range(60):
        for g in range(2):
            store.ingest(GpuSample(host="n1", t=1000.0 + i, index=g, util_gpu=0.0))
    return store


def test_before_the_first_verl_step_the_job_is_waited_for_not_judged() -> None:
    store = _idle_store_with_a_verl_log()
    assert Engine().evaluate(store).bottleneck_rule == "gpu.idle"  # what the data alone says
    a = Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={}))).assess()
    assert a.status.state == "waiting" and a.lead is None
    assert a.status.text.startswith("waiting for the first verl step (59 s)")
    assert any(f.rule == "gpu.idle" for f in a.findings)  # still listed, only not the lead


def test_a_fault_leads_even_before_the_first_verl_step() -> None:
    store = _idle_store_with_a_verl_log()
    store.ingest(
        LogEvent(
            host="n1",
            t=1059.0,
            kind="watchdog",
            text="[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
            "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
            severity=1.0,
        )
    )
    a = Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={}))).assess()
    assert a.bottleneck_rule == "nccl.watchdog" and a.status.state == "bottleneck"


def test_history_records_each_change_with_its_title() -> None:
    idle = Store()
    for r in read_recording(SCEN / "gpu_idle" / "recording.ndjson"):
        idle.ingest(r)
    a = assess_store(idle)
    assert a.settled and a.lead is not None
    assert [(c.step, c.rule) for c in a.history] == [(a.bottleneck_step, a.bottleneck_rule)]
    assert a.history[0].title == a.lead.title


def test_the_monitor_evaluates_only_when_the_store_changed() -> None:
    calls = []

    class Counting(Engine):
        def evaluate(self, store: Store) -> Verdict:
            calls.append(store.version)
            return super().evaluate(store)

    store = _idle_store_with_a_verl_log()
    clock = [0.0]
    monitor = Monitor(
        Inputs(store=store, pipeline=Pipeline(store, parsers={})),
        Counting(),
        clock=lambda: clock[0],
    )
    monitor.assess()
    monitor.assess()
    assert len(calls) == 1
    store.ingest(GpuSample(host="n1", t=1100.0, index=0, util_gpu=0.0))
    first = monitor.assessment
    monitor.assess()
    assert len(calls) == 2 and monitor.assessment is not first


def test_an_expensive_evaluation_stretches_the_period() -> None:
    """At most MAX_SHARE of a core: an evaluation costing 1 s waits 4 s before the next."""
    clock = [0.0]

    class Slow(Engine):
        def evaluate(self, store: Store) -> Verdict:
            clock[0] += 1.0
            return super().evaluate(store)

    store = _idle_store_with_a_verl_log()
    monitor = Monitor(
        Inputs(store=store, pipeline=Pipeline(store, parsers={})), Slow(), clock=lambda: clock[0]
    )
    monitor.assess()
    store.ingest(GpuSample(host="n1", t=1100.0, index=0, util_gpu=0.0))
    assert not monitor.due()
    clock[0] = 4.0
    assert monitor.due()


def test_hysteresis_is_configured_in_data_seconds() -> None:
    th = Thresholds(hysteresis_s=5.0)
    store = Store()
    monitor = Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={})), Engine(th))
    assert monitor._keeper.hold_s == 5.0
    # Retired count-based settings of older config files still load (and are ignored).
    assert Thresholds.from_mapping({"hysteresis_evals": 3, "hysteresis_margin": 0.1})


def test_a_given_verl_log_is_waited_for_before_its_first_line() -> None:
    """A job just started prints nothing for a while: with --verl-log given, GPU and host
    symptoms before the first step are warm-up (seen live on the H200: 'one CPU core pinned'
    led for 47 s before the log's first line)."""
    store = Store()
    store.verl_log_given = True
    for i in range(60):
        store.ingest(GpuSample(host="n1", t=1000.0 + i, index=0, util_gpu=0.0))
    a = Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={}))).assess()
    assert a.status.state == "waiting" and a.lead is None
