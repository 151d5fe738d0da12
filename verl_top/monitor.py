"""One monitor for every surface: sources -> pipeline -> store -> engine -> one Assessment.

The app, ``diagnose``, ``snapshot`` and ``export-metrics`` all own a ``Monitor`` and read its
``Assessment``; none of them calls the engine or the status words itself, so they cannot
disagree about the same data (issue 27). "Headless" is the same monitor run to the end of its
data.

The engine is stateless; the monitor keeps the lead steady over time (hysteresis) in *data*
time, so a paced replay, a replay read at full speed and a live run of the same records reach
the same lead:

- a challenger replaces the lead only after it has led for ``hysteresis_s`` seconds of data;
- a lead whose finding is gone is dropped at once (no "its findings cleared" ghost);
- a symptom (GPUs idle, throughput drop) never stays in front of a cause;
- before the first verl step of a followed log, only faults lead ("waiting for the first verl
  step"): GPUs idle during start-up are warm-up, not a verdict;
- when the inputs end (``settle``), the verdict follows the data: hysteresis only exists to
  stop a live banner from flickering.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor

from verl_top.assessment import Assessment, LeadChange
from verl_top.compare import Comparison, compare_runs, summarize
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import FAULT_RULES, SYMPTOM_RULES, Finding, Verdict
from verl_top.gc_pause import cyclic_gc_paused
from verl_top.inputs import Inputs
from verl_top.model import Record
from verl_top.status import job_status, waiting_for_first_step
from verl_top.store import Store

HISTORY_LEN = 20
# Live, the diagnosis runs every LIVE_PERIOD_S whatever the cluster size (its rules read 30-300 s
# windows, so a verdict a few seconds old says the same); only an evaluation slower than
# MAX_SHARE of that period (a pathological cluster) stretches it further.
LIVE_PERIOD_S = 5.0
MAX_SHARE = 0.25
# Headless runs look at the data this often (wall seconds) while they collect.
HEADLESS_TICK_S = 1.0
# The longest a closed gate holds an evaluation (from its closing): a tick that paints nothing
# (no widget changed, the app closing) must not stop the diagnosis.
FRAME_WAIT_S = 0.5
RELEASE_SLICE = 500  # held writes applied per turn of the event loop after an evaluation
# A replay read at full speed is also looked at every this many seconds of *data*, so its lead
# history (a hang that came and went) is the one the app would have shown; an evaluation that
# costs c seconds stretches the gap to REPLAY_COST_FACTOR x c of data, so a long recording of a
# large cluster stays quick (its history is then coarser, its final lead the same).
REPLAY_LOOK_S = 5.0
REPLAY_COST_FACTOR = 50.0
DEFAULT_LIVE_DURATION = 10.0


@dataclasses.dataclass
class _Challenger:
    rule: str | None
    since_t: float


class LeadKeeper:
    """Which lead to show, given the lead the data ranks first now (hysteresis on data time)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.rule: str | None = None
        self._started = False
        self._challenger: _Challenger | None = None

    def update(self, verdict: Verdict, raw: Finding | None, now: float, settle: bool) -> str | None:
        """The rule to lead with after seeing ``verdict`` (whose ranked lead is ``raw``)."""
        want = raw.rule if raw is not None else None
        held = self._held(verdict)
        if settle or not now or not self._started or self._switch_at_once(held, raw):
            # Settled inputs, data without times (post-mortem logs), the first look, or a
            # lead that must go now: follow the data.
            return self._take(want)
        if want == self.rule:
            self._challenger = None
            return self.rule
        ch = self._challenger
        if ch is None or ch.rule != want:
            ch = self._challenger = _Challenger(want, now)
        if now - ch.since_t >= self.hold_s:
            return self._take(want)
        return self.rule

    def _held(self, verdict: Verdict) -> Finding | None:
        if self.rule is None:
            return None
        return next((f for f in verdict.findings if f.rule == self.rule), None)

    def _switch_at_once(self, held: Finding | None, raw: Finding | None) -> bool:
        if self.rule is not None and held is None:
            return True  # the held lead's finding cleared
        if self.rule is None and raw is not None:
            return True  # nothing was shown: show the first lead without delay
        if held is not None and raw is not None:
            if held.rule in SYMPTOM_RULES and raw.rule not in SYMPTOM_RULES:
                return True  # never keep a symptom over a cause
            if raw.rule in FAULT_RULES and held.rule not in FAULT_RULES:
                return True  # a broken job is news now
        return False

    def _take(self, rule: str | None) -> str | None:
        self._started = True
        self.rule = rule
        self._challenger = None
        return rule


class Monitor:
    """Runs the inputs' sources into the store and keeps the one Assessment of the job.

    ``period_s`` is the least wall time between two evaluations (0: whenever the store
    changed); an evaluation that costs more than ``MAX_SHARE`` of it stretches it."""

    def __init__(
        self,
        inputs: Inputs,
        engine: Engine | None = None,
        period_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        background: bool = False,
    ) -> None:
        self.inputs = inputs
        # Live in the app: the engine runs in a worker thread while the store holds its writes
        # (Store.hold), so no frame waits for an evaluation (0.6-0.9 s at 4096 GPUs).
        self.background = background
        self._executor: ThreadPoolExecutor | None = None
        self._job: Future[Verdict] | None = None
        self._after: list[Callable[[], None]] = []  # called as the running evaluation ends
        self.gate = FrameGate()  # closed by the app while it draws a frame
        self.engine = engine if engine is not None else Engine()
        self.period_s = period_s
        self._clock = clock
        self._keeper = LeadKeeper(self.engine.thresholds.hysteresis_s)
        self._history: deque[LeadChange] = deque(maxlen=HISTORY_LEN)
        self._verdict: Verdict | None = None
        self._raw_lead: str | None = None
        self._eval_version = -1
        self._next_eval = 0.0
        self._settled = False
        self._comparison: Comparison | None = None
        self._assembled_version = -1
        self._evidence = (False, False)  # (steps, config) at the last evaluation
        self.failure: str | None = None  # why the last evaluation failed (kept verdict)
        self.assessment: Assessment = self._assemble()

    @property
    def store(self) -> Store:
        """The store the sources fill."""
        return self.inputs.store

    # -- evaluation ------------------------------------------------------------------------

    @property
    def evaluating(self) -> bool:
        """True while an evaluation runs in the worker thread."""
        return self._job is not None

    def due(self) -> bool:
        """True when the store changed since the last evaluation and the period has passed,
        or the first verl steps or the job's config arrived since (new evidence: judged now,
        not a live period later)."""
        store = self.store
        if store.version == self._eval_version or not _has_data(store):
            return False
        return self._clock() >= self._next_eval or self._evidence != _evidence(store)

    def assess(self, force: bool = False) -> Assessment:
        """Evaluate when due (or ``force``d) and return the latest Assessment.

        Host states and counts change between evaluations: the status is refreshed on every
        call, the engine runs only when due."""
        if self._job is not None:
            return self.assessment  # the store is held: nothing changed that it would show
        if force or self.due():
            if self.background and not force and _loop() is not None:
                self._evaluate_in_background()
            else:
                self._evaluate(settle=False)
        elif self.store.version != self._assembled_version:
            self.assessment = self._assemble()
        return self.assessment

    def settle(self) -> Assessment:
        """The inputs ended: hand over what the parsers hold, and give the final word."""
        self._finish_background()
        self.inputs.pipeline.finish()
        self._settled = True
        self._evaluate(settle=True)
        return self.assessment

    def close(self) -> None:
        """Stop the worker thread (an evaluation running finishes) and apply held writes."""
        self._finish_background()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _evaluate(self, settle: bool) -> None:
        store = self.store
        self._eval_version = store.version
        self._evidence = _evidence(store)
        started = self._clock()
        try:
            verdict = judge(self.engine, store)
        except Exception as exc:  # noqa: BLE001 - a broken rule set must not stop the monitor
            self._failed(exc)
            return
        self._take(verdict, settle, started)

    def _evaluate_in_background(self) -> None:
        """Start an evaluation in the worker thread; the store holds its writes meanwhile."""
        store = self.store
        loop = _loop()
        assert loop is not None
        self._eval_version = store.version
        self._evidence = _evidence(store)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="verl-top-diagnosis")
        store.hold()
        started = self._clock()
        job = self._job = self._executor.submit(judge, self.engine, store, self.gate.wait)

        def done(_: Future[Verdict]) -> None:  # in the worker: hand over to the loop
            loop.call_soon_threadsafe(self._background_done, job, started)

        job.add_done_callback(done)

    def after_evaluation(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, on the loop, as the evaluation now running ends (none runs
        then); never if the monitor closes first."""
        self._after.append(callback)

    def _background_done(self, job: Future[Verdict], started: float) -> None:
        """The worker's verdict, taken on the loop; then the held writes are applied."""
        if job is not self._job:
            return  # already taken (settle or close waited for it)
        self._job = None
        self._take_result(job, started)
        after, self._after = self._after, []
        for callback in after:
            callback()
        self._release()

    def _take_result(self, job: Future[Verdict], started: float) -> None:
        try:
            verdict = job.result()
        except Exception as exc:  # noqa: BLE001 - a broken rule set must not stop the monitor
            self._failed(exc)
            return
        self._take(verdict, False, started)

    def _release(self) -> None:
        """Apply the writes held during the evaluation a slice at a time, so that catching up
        with a second of 4096 GPUs' samples does not hold a frame either."""
        if not self.store.release(RELEASE_SLICE):
            loop = _loop()
            if loop is not None:
                loop.call_soon(self._release)
            else:
                self.store.release()

    def _finish_background(self) -> None:
        """Wait for an evaluation still running, take it, apply every held write."""
        job, self._job = self._job, None
        if job is not None:
            try:
                job.result()
            except Exception:  # noqa: BLE001, S110 - taken below as the failure it is
                pass
            self._take_result(job, self._clock())
        self.store.release()

    def _failed(self, exc: Exception) -> None:
        self.failure = f"diagnosis failed: {type(exc).__name__}: {exc}"
        self.assessment = self._assemble()

    def _take(self, verdict: Verdict, settle: bool, started: float) -> None:
        """Keep ``verdict`` (from an evaluation started at ``started``) as the assessment."""
        store = self.store
        self.failure = None
        cost = self._clock() - started
        self._next_eval = started + max(self.period_s, cost / MAX_SHARE)
        raw = verdict.lead
        if raw is not None and waiting_for_first_step(store) and raw.rule not in FAULT_RULES:
            raw = None  # warm-up: nothing but a fault leads before the first verl step
        self._raw_lead = raw.rule if raw is not None else None
        rule = self._keeper.update(verdict, raw, store.now, settle)
        verdict = self._with_lead(verdict, rule)
        self._note_change(verdict)
        # One verdict object per evaluation: views redraw findings only when it changes. Its
        # ``headline`` stays the engine's; people read ``Assessment.status.text``.
        history = [(c.t, c.step, c.rule) for c in self._history]
        self._verdict = dataclasses.replace(verdict, history=history)
        self._comparison = self._compare()
        self.assessment = self._assemble()

    def _with_lead(self, verdict: Verdict, rule: str | None) -> Verdict:
        """The engine's verdict with the lead the keeper holds, and the lead history."""
        lead = next((f for f in verdict.findings if f.rule == rule), None) if rule else None
        outcome = verdict.outcome
        if lead is not None:
            outcome = "no data" if verdict.no_data else "bottleneck"  # a crash before any step
        elif outcome == "bottleneck":
            outcome = "healthy"  # held back (warm-up, or a challenger still confirming)
        return dataclasses.replace(
            verdict,
            bottleneck_step=lead.step if lead is not None else None,
            bottleneck_rule=lead.rule if lead is not None else None,
            outcome=outcome,
        )

    def _note_change(self, verdict: Verdict) -> None:
        last = self._history[-1] if self._history else None
        if last is None or last.rule != verdict.bottleneck_rule:
            lead = verdict.lead
            self._history.append(
                LeadChange(
                    verdict.t,
                    verdict.bottleneck_step,
                    verdict.bottleneck_rule,
                    lead.title if lead is not None else "",
                )
            )

    def _assemble(self) -> Assessment:
        store = self.store
        self._assembled_version = store.version
        verdict = self._verdict
        waiting = waiting_for_first_step(store) and (verdict is None or verdict.lead is None)
        status = job_status(store, verdict, waiting=waiting)
        return Assessment(
            verdict=verdict,
            status=status,
            t=store.now,
            window=verdict.window if verdict is not None else "",
            raw_lead=self._raw_lead,
            history=tuple(self._history),
            health=store.input_health(),
            settled=self._settled,
            comparison=self._comparison,
        )

    def _compare(self) -> Comparison | None:
        """This run against ``--baseline``, when one was given and steps arrived."""
        base = self.inputs.baseline
        if base is None or not self.store.steps:
            return None
        current = summarize("this run", "live", self.store, gpu_activity=False)
        return compare_runs(base, current)

    # -- running ---------------------------------------------------------------------------

    async def run(
        self,
        duration: float | None = None,
        finale: Callable[[Assessment], Awaitable[None]] | None = None,
    ) -> Assessment:
        """Headless: run every source until all end (finite inputs) or ``duration`` seconds
        pass, looking at the data as it comes, then settle and return the final Assessment.

        ``finale(assessment)`` runs once collection is over while the sources still run (their
        connections open): ``snapshot`` reads the processes' stacks there."""
        inputs = self.inputs
        speed = inputs.replay.speed if inputs.replay is not None else None
        if inputs.replay is not None:
            inputs.replay.speed = 1e9  # no pacing: the data carries its own times
            inputs.pipeline.listeners.append(self._replay_looker())
        tasks = [asyncio.create_task(src.run(inputs.pipeline.emit)) for src in inputs.sources]
        limit = (
            duration if duration is not None else (None if inputs.finite else DEFAULT_LIVE_DURATION)
        )
        loop = asyncio.get_running_loop()
        end = None if limit is None else loop.time() + limit
        post_mortem = inputs.finite and inputs.replay is None
        try:
            pending = set(tasks)
            while pending:
                left = None if end is None else end - loop.time()
                if left is not None and left <= 0:
                    break
                step = HEADLESS_TICK_S if left is None else min(HEADLESS_TICK_S, left)
                done, pending = await asyncio.wait(pending, timeout=step)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        inputs.store.notes.append(f"a source failed: {task.exception()}")
                if not post_mortem:  # a finished log is judged once, at its end (settle)
                    self.assess()
            if finale is not None:
                await finale(self.assess(force=_has_data(self.store)))
        finally:
            if inputs.replay is not None and speed is not None:
                inputs.replay.speed = speed  # what a screenshot of the session should show
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        return self.settle()

    def _replay_looker(self) -> Callable[[Record], None]:
        """A pipeline listener that assesses every REPLAY_LOOK_S of data time (stretched by
        the evaluation's own cost)."""
        next_t: list[float | None] = [None]

        def look(record: Record) -> None:
            t = record.t
            if not t:
                return
            if next_t[0] is not None and t < next_t[0]:
                return
            if next_t[0] is not None:
                started = self._clock()
                self._evaluate(settle=False)
                cost = self._clock() - started
            else:
                cost = 0.0
            next_t[0] = t + max(REPLAY_LOOK_S, REPLAY_COST_FACTOR * cost)

        return look


class FrameGate:
    """Lets an evaluation in the worker thread give way while the event loop draws a frame.

    The two threads share the GIL, which passes between them every 5 ms
    (``sys.getswitchinterval``): a frame drawn while an evaluation runs took about twice its
    own time (pane 1's p95 at 1024 GPUs was 2-3x its p50; at 4096 GPUs most frames over 40 ms
    were ones an evaluation's rule ran beside). The app closes the gate when a tick starts
    and opens it once the frame is written out; the evaluation waits, without the GIL, before
    its next rule. A rule under way runs to its end. A closed gate holds for at most
    ``max_wait_s`` from its closing, however many rules then ask, and closing it again before
    it opened does not extend that: ticks that paint nothing (every 0.2 s with ``--interval
    0.2``) would otherwise hold an evaluation for as long as they come.
    """

    def __init__(self, max_wait_s: float = FRAME_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._open = threading.Event()
        self._open.set()
        self._until = 0.0  # monotonic time the closed gate stops holding

    def close(self) -> None:
        """A frame is being drawn: evaluations pause at their next rule (if the gate is still
        closed from an earlier tick, until that closing's time is up)."""
        if self._open.is_set():
            self._until = time.monotonic() + self.max_wait_s
            self._open.clear()

    def open(self) -> None:
        """The frame is painted: evaluations go on."""
        self._open.set()

    @property
    def is_open(self) -> bool:
        """True when no frame is being drawn."""
        return self._open.is_set()

    def wait(self) -> bool:
        """Block (in the worker thread) while a frame is drawn, until ``max_wait_s`` after the
        gate closed at most.

        True when the gate was open or opened in time."""
        if self._open.is_set():
            return True
        left = self._until - time.monotonic()
        return left > 0 and self._open.wait(left)


def judge(engine: Engine, store: Store, between: Callable[[], object] | None = None) -> Verdict:
    """``engine.evaluate(store)`` with the cyclic collector paused (``between``: called
    before each rule, see ``FrameGate``).

    An evaluation reads every GPU's window into lists of floats (~100 000 lists, millions of
    floats at 4096 GPUs) that live until it ends. Collections triggered meanwhile, by either
    thread, promoted them and walked all their items: 0.4-0.7 s full collections holding the
    GIL, so the event loop stalled that long (benchmarks/client_scale.py, 4096 GPUs). They
    form no cycles, so reference counting frees them when the evaluation ends; what the
    event loop allocates meanwhile is collected at its next collection."""
    with cyclic_gc_paused():
        if between is None:
            return engine.evaluate(store)
        return engine.evaluate(store, between)


def _has_data(store: Store) -> bool:
    """True once anything to judge or report arrived (a sample, a step, a followed log).

    Not on an empty store: the first verdict would be an empty one."""
    if store.steps or store.log_stats:
        return True
    return any(h.latest is not None or h.gpus for h in store.hosts.values())


def _loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _evidence(store: Store) -> tuple[bool, bool]:
    """Whether the store holds verl steps and a config."""
    return bool(store.steps), bool(store.config)


def assess_store(store: Store, engine: Engine | None = None) -> Assessment:
    """The settled assessment of a store as it stands (one-off reports, benchmarks, tests)."""
    from verl_top.sources.pipeline import Pipeline

    return Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={})), engine).settle()
