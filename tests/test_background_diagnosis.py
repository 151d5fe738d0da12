"""The diagnosis off the event loop (issue 30 item 4): live, the engine runs in a worker thread
while the store queues its writes, so frames never wait for an evaluation; the verdict is the
one a synchronous evaluation of the same data gives, and no sample is lost or reordered."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from ui_data import T0, build_store

from verl_top.diagnosis.engine import STEP_RULES, Engine
from verl_top.inputs import Inputs
from verl_top.model import GpuSample, HostState
from verl_top.monitor import FrameGate, Monitor, judge
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store


class SlowEngine:
    """The real engine, made to take a while, recording the thread it ran on."""

    def __init__(self, seconds: float) -> None:
        self.engine = Engine()
        self.seconds = seconds
        self.threads: list[str] = []
        self.started = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def evaluate(self, store: Store, between: Callable[[], object] | None = None) -> Any:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        time.sleep(self.seconds)  # like a 4096-GPU evaluation, without burning the CPU
        return self.engine.evaluate(store, between)


def test_writes_held_while_a_reader_works_are_applied_in_order() -> None:
    store = build_store()
    before = store.hosts["node01"].gpus[0].latest
    store.hold()
    samples = [
        GpuSample(host="node01", t=T0 + 61 + i, index=0, util_gpu=float(i)) for i in range(7)
    ]
    for s in samples:
        store.ingest(s)
    store.ingest(HostState(host="node03", t=T0 + 70, state="down", reason="gone"))
    assert store.hosts["node01"].gpus[0].latest is before and store.held == 8
    assert store.mark_stale(0.0, now_wall=T0 + 10_000) == []  # silence while held says nothing
    assert store.release(3) is False and store.held == 5
    assert store.hosts["node01"].gpus[0].latest is samples[2]
    assert store.release() is True and store.held == 0
    assert store.hosts["node01"].gpus[0].latest is samples[-1]
    assert store.hosts["node03"].state == "down"
    store.ingest(GpuSample(host="node01", t=T0 + 90, index=0, util_gpu=1.0))
    assert store.held == 0  # writes apply at once again


async def _live(monitor: Monitor, store: Store, engine: SlowEngine) -> dict[str, Any]:
    """Ask for an assessment, feed samples while the worker evaluates, measure the loop."""
    assert monitor.assess().verdict is None  # started in the worker, nothing yet
    await asyncio.to_thread(engine.started.wait, 5)
    lags: list[float] = []
    fed = [GpuSample(host="node02", t=T0 + 61 + i, index=3, util_gpu=50.0) for i in range(5)]
    for s in fed:
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - t0 - 0.01)
        store.ingest(s)
        assert monitor.assess().verdict is None  # still running: the last assessment
    while monitor.assessment.verdict is None or store.held:
        await asyncio.sleep(0.01)
    return {"lags": lags, "fed": fed}


def test_live_evaluation_runs_in_a_worker_and_gives_the_synchronous_verdict() -> None:
    store = build_store()
    want = Engine().evaluate(build_store())  # the same data, judged on this thread
    engine = SlowEngine(0.3)
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), mode="LIVE")
    monitor = Monitor(inputs, engine, period_s=5.0, background=True)
    try:
        out = asyncio.run(_live(monitor, store, engine))
    finally:
        monitor.close()
    got = monitor.assessment.verdict
    assert engine.threads == ["verl-top-diagnosis_0"]
    assert got is not None and got.bottleneck_rule == want.bottleneck_rule
    assert [f.rule for f in got.findings] == [f.rule for f in want.findings]
    assert max(out["lags"]) < 0.2  # the loop kept turning during a 0.3 s evaluation
    assert store.hosts["node02"].gpus[3].latest is out["fed"][-1]  # every held write applied


def test_without_a_running_loop_the_monitor_evaluates_on_the_spot() -> None:
    store = build_store()
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), mode="LIVE")
    monitor = Monitor(inputs, Engine(), period_s=5.0, background=True)
    assert monitor.assess().verdict is not None and store.held == 0
    monitor.close()


class GcWatchingEngine:
    """The real engine, noting whether the cyclic collector ran while it worked."""

    def __init__(self, fail: bool = False) -> None:
        self.engine = Engine()
        self.fail = fail
        self.collector_on: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def evaluate(self, store: Store, between: Callable[[], object] | None = None) -> Any:
        self.collector_on.append(gc.isenabled())
        if self.fail:
            raise RuntimeError("a broken rule")
        return self.engine.evaluate(store, between)


def test_an_evaluation_pauses_the_cyclic_collector_and_leaves_no_cyclic_garbage() -> None:
    # At 4096 GPUs, collections during an evaluation walked its millions of window values and
    # stalled the event loop 0.4-0.7 s; paused, those values are freed by reference counting,
    # which is only true while an evaluation makes no reference cycles.
    store = build_store()
    engine = GcWatchingEngine()
    assert gc.isenabled()
    want = Engine().evaluate(store)
    gc.collect()
    got = judge(engine, store)  # type: ignore[arg-type]
    assert engine.collector_on == [False] and gc.isenabled()
    assert got.bottleneck_rule == want.bottleneck_rule
    gc.disable()
    try:
        judge(Engine(), store)
        assert gc.collect() == 0  # nothing the evaluation left waits for the collector
        assert not gc.isenabled()  # a caller that had paused it keeps it paused
    finally:
        gc.enable()
    broken = GcWatchingEngine(fail=True)
    with pytest.raises(RuntimeError):
        judge(broken, store)  # type: ignore[arg-type]
    assert gc.isenabled()  # restored when a rule raises


def test_an_evaluation_gives_way_between_rules_and_judges_the_same() -> None:
    # The hook runs before every rule and cannot change what the rules find.
    store = build_store()
    calls: list[int] = []
    want = Engine().evaluate(store)
    got = Engine().evaluate(store, lambda: calls.append(1))
    assert len(calls) == sum(len(rules) for rules in STEP_RULES.values())  # one per rule
    assert got.bottleneck_rule == want.bottleneck_rule
    assert [(f.rule, f.title) for f in got.findings] == [(f.rule, f.title) for f in want.findings]


async def _gated(monitor: Monitor, engine: SlowEngine) -> tuple[bool, bool]:
    """Close the gate, start an evaluation; whether it ended while closed, and after opening."""
    monitor.gate.close()
    monitor.assess()
    await asyncio.to_thread(engine.started.wait, 5)
    await asyncio.sleep(0.6)  # the evaluation's own sleep (0.05 s) is long over
    while_closed = monitor.assessment.verdict is not None
    monitor.gate.open()
    deadline = time.monotonic() + 10
    while monitor.assessment.verdict is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return while_closed, monitor.assessment.verdict is not None


def test_a_background_evaluation_waits_while_a_frame_is_drawn() -> None:
    # Sharing the GIL, a frame drawn during an evaluation took twice its time: the worker
    # waits at its next rule while the app draws (FrameGate), and goes on once it is open.
    store = build_store()
    engine = SlowEngine(0.05)
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), mode="LIVE")
    monitor = Monitor(inputs, engine, period_s=5.0, background=True)
    monitor.gate = FrameGate(max_wait_s=30.0)
    try:
        while_closed, after = asyncio.run(_gated(monitor, engine))
    finally:
        monitor.close()
    assert not while_closed and after


def test_a_frame_that_is_never_painted_does_not_stop_the_diagnosis() -> None:
    # A tick that paints nothing (no widget changed, the app closing) never opens the gate:
    # it holds for max_wait_s from its closing in all, not max_wait_s before every rule.
    gate = FrameGate(max_wait_s=0.2)
    gate.close()
    t0 = time.monotonic()
    waits = [gate.wait() for _ in range(10)]  # ten rules ask in turn
    assert time.monotonic() - t0 < 0.6
    assert waits == [False] * 10 and not gate.is_open
    gate.open()
    assert gate.wait() is True and gate.is_open
    gate.close()  # closing again holds again
    t0 = time.monotonic()
    assert gate.wait() is False and time.monotonic() - t0 >= 0.15
    # Ticks that paint nothing keep closing it (every 0.2 s with --interval 0.2): the first
    # closing's time is not extended, so the evaluation is not held for as long as they come.
    gate.open()
    gate.close()
    t0 = time.monotonic()
    for _ in range(5):
        time.sleep(0.05)
        gate.close()
    assert gate.wait() is False and time.monotonic() - t0 < 0.35
