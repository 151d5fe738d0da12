"""A read-only view of the store for the rules: windows, per-GPU means, steps, config.

The view never writes to the store. Its clock is ``Store.now`` (the newest data time), so a
replay gives the same verdict every time.

verl metric names: stage names, their order and the timing prefixes (current ``timing_s/<stage>``
and oldest ``timing/<stage>``, verl.md §1.2) come from the catalogue in ``verl_top.verl.stages``.
``StepView`` here is the diagnosis' own reading of a step, kept apart from the catalogue's
``StepView.from_step`` because the two differ where verdicts depend on them: here NaN timings
are dropped, aliases (``reshard``, ``param_sync``) are not mapped, ``step`` counts as including
testing/checkpoint when it is >= the core sum + 0.9 x their sum (the catalogue: within a
tolerance of 1 s or 2 %), an unlogged ``step`` is the core sum (the catalogue adds
testing/checkpoint), ``throughput`` is verl's ``perf/throughput`` only (the catalogue derives
or estimates it), and stage bands walk forward from ``t - step_time`` over the core stages
(the catalogue walks back from ``t`` and includes testing/checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any

from verl_top.diagnosis.job import JobFacts, job_facts
from verl_top.diagnosis.readable import pct
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.origin import NEEDS_TIMINGS, verl_log_ask
from verl_top.store import GpuEntry, HostEntry, Ring, Store
from verl_top.verl.stages import (
    CORE_STAGES,
    EXTRA_STAGES,
    STAGE_BY_NAME,
    TIMING_PREFIXES,
    TimingPlans,
    core_names,
    role_of,
    split_timings,
)

if TYPE_CHECKING:
    from verl_top.diagnosis.phases import Phase
    from verl_top.verl.flavour import VerlFlavour

# Stages of one step in execution order (verl.md §1.2), from the verl catalogue: the core stages
# without the profiler bookkeeping; testing/save_checkpoint are the periodic ones after `step`.
STEP_STAGES: tuple[str, ...] = tuple(n for n in CORE_STAGES if not STAGE_BY_NAME[n].overhead)
PERIODIC_STAGES: tuple[str, ...] = EXTRA_STAGES


def timing(metrics: dict[str, float], name: str) -> float | None:
    """``timing_s/<name>`` or the old ``timing/<name>``, None when absent."""
    for prefix in TIMING_PREFIXES:
        v = metrics.get(prefix + name)
        if isinstance(v, int | float) and not math.isnan(v):
            return float(v)
    return None


def first(metrics: dict[str, float], *keys: str) -> tuple[str, float] | None:
    """The first of ``keys`` present in ``metrics`` with its value."""
    for k in keys:
        v = metrics.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v):
            return k, float(v)
    return None


@dataclass
class StepView:
    """One verl step read through the stage catalogue."""

    step: int
    t: float  # arrival time of the step's log line (= end of the step)
    metrics: dict[str, float]
    stage_times: dict[str, float] = field(default_factory=dict)  # canonical stage -> seconds
    step_time: float | None = None  # as logged (may include testing/ckpt in verl <= 0.5)
    step_time_core: float | None = None  # without testing / save_checkpoint
    step_time_source: str = ""
    throughput: float | None = None  # perf/throughput, tokens/s/GPU
    is_outlier: bool = False  # a testing or save_checkpoint step: excluded from trends
    unknown: dict[str, str] = field(default_factory=dict)  # stages outside the catalogue: role
    denominator: float | None = None  # what shares are taken of: max(core step, stage sum)

    def share(self, *stages: str) -> float | None:
        """Fraction of the step (``denominator``) spent in ``stages`` (None when unknown)."""
        if not self.denominator:
            return None
        present = [self.stage_times[s] for s in stages if s in self.stage_times]
        if not present:
            return None
        return sum(present) / self.denominator

    def role_stages(self, role: str) -> list[str]:
        """This step's core stages of ``role`` (``rollout``: gen and rollout-named timers)."""
        return [
            s
            for s in self.stage_times
            if s not in PERIODIC_STAGES and role_of(s, self.unknown) == role
        ]


def step_view(
    step: int,
    t: float,
    metrics: dict[str, float],
    mode: str | None = None,
    plans: TimingPlans | None = None,
) -> StepView:
    """Read one step's metrics: stage times, step time without periodic work, throughput.

    Every ``timing_s/<name>`` outside the catalogue is a stage too (``split_timings``); timers
    nested in another (v0.5 ``reshard`` in ``gen``) and the profiler's bookkeeping are not.
    ``mode`` is the trainer mode (async modes read ``timing_s/gen`` as the stage ``wait``);
    ``plans``: the key layouts already read (many steps: the same result, sooner).
    """
    timings = plans.split(metrics, mode) if plans is not None else split_timings(metrics, mode)
    core_list = [
        n
        for n in core_names(timings.times, timings.nested)
        if not (n in STAGE_BY_NAME and STAGE_BY_NAME[n].overhead)
    ]
    stages = {n: timings.times[n] for n in core_list}
    stages.update({n: timings.times[n] for n in PERIODIC_STAGES if n in timings.times})
    core_sum = sum(stages[n] for n in core_list)
    periodic = sum(v for s, v in stages.items() if s in PERIODIC_STAGES)
    logged = timing(metrics, "step")
    source = "timing_s/step"
    if logged is None:
        hit = first(metrics, "perf/time_per_step")
        logged, source = (hit[1], "perf/time_per_step") if hit else (None, "")
    core = logged
    if logged is not None and periodic and logged >= core_sum + 0.9 * periodic:
        core = logged - periodic  # verl <= 0.5 counted testing/ckpt inside `step`
    if core is None and core_sum > 0:
        core, source = core_sum, "sum of stage timings"
    tput = first(metrics, "perf/throughput")
    return StepView(
        step=step,
        t=t,
        metrics=metrics,
        stage_times=stages,
        step_time=logged if logged is not None else core,
        step_time_core=core,
        step_time_source=source,
        throughput=tput[1] if tput else None,
        is_outlier=periodic > 0,
        unknown={n: r for n, r in timings.unknown.items() if n in stages},
        denominator=max(core, core_sum) if core else None,
    )


class StepMemo:
    """The ``StepView`` of each stored step, kept from one evaluation to the next.

    A step's view depends on its record alone, and the store keeps up to 5000 records: a long
    run's history is read through the stage catalogue once, not at every evaluation (a
    post-mortem of a GB log evaluates while it reads). Records are matched by identity; views
    of records the store dropped are let go at the next read."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[Any, StepView]] = {}
        self._mode: Any = None
        self._plans = TimingPlans()

    def views(self, steps: Iterable[Any], mode: Any = None) -> list[StepView]:
        """The views of ``steps`` (step numbers > 0) read in trainer ``mode``, oldest first."""
        old = self._views if mode == self._mode else {}
        new = {}
        out = []
        for s in steps:
            if s.step <= 0:
                continue
            hit = old.get(id(s))
            if hit is None or hit[0] is not s:
                hit = (s, step_view(s.step, s.t, s.metrics, mode, self._plans))
            new[id(s)] = hit
            out.append(hit[1])
        self._views, self._mode = new, mode
        return out


def label_phase(label: str) -> str | None:
    """The phase a replay trace's label names (``gen*`` / ``train*``, ``update*``), else None."""
    if label.startswith("gen"):
        return "gen"
    if label.startswith(("train", "update")):
        return "update_actor"
    return None


def median(values: Iterable[float]) -> float | None:
    """Median, or None for no values."""
    vals = list(values)
    return statistics.median(vals) if vals else None


def fmt_pct(x: float) -> str:
    """A fraction as a percentage string (readable.pct: ``57 %``, ``0.4 %``)."""
    return pct(x)


class _Phases:
    """The phase of each point of one GPU window, as runs, and the point spans a filter keeps."""

    def __init__(self, phases: list[str | None]) -> None:
        self.runs: list[tuple[int, int, str | None]] = []
        i = 0
        for phase, same in groupby(phases):
            n = len(list(same))
            self.runs.append((i, i + n, phase))
            i += n
        self.distinct = tuple(dict.fromkeys(phases))
        self._spans: dict[tuple[bool, ...], list[tuple[int, int]]] = {}
        # By filter: a rule passes one filter for every GPU (a host's GPUs share this object).
        self._by_keep: dict[Callable[[str | None], bool], list[tuple[int, int]]] = {}

    def spans(self, keep: Callable[[str | None], bool]) -> list[tuple[int, int]]:
        """(first, end) point ranges whose phase passes ``keep``, adjacent ones merged."""
        hit = self._by_keep.get(keep)
        if hit is None:
            hit = self._by_keep[keep] = self._signature_spans(keep)
        return hit

    def _signature_spans(self, keep: Callable[[str | None], bool]) -> list[tuple[int, int]]:
        sig = tuple(bool(keep(p)) for p in self.distinct)
        hit = self._spans.get(sig)
        if hit is None:
            ok = dict(zip(self.distinct, sig, strict=True))
            hit = []
            for i, j, phase in self.runs:
                if ok[phase]:
                    if hit and hit[-1][1] == i:
                        hit[-1] = (hit[-1][0], j)
                    else:
                        hit.append((i, j))
            self._spans[sig] = hit
        return hit


class View:
    """Read-only helpers over a Store for one evaluation.

    A view lives for one evaluation and the store does not change meanwhile, so everything it
    reads from the rings (window arrays, means, per-point phases) is memoised here: the rules
    ask for the same GPU windows many times, and at 1000+ GPUs reading them is the whole cost.
    """

    def __init__(
        self, store: Store, thresholds: Thresholds, step_memo: StepMemo | None = None
    ) -> None:
        self.store = store
        self.th = thresholds
        self._step_memo = step_memo
        self.now = store.now
        self.since = store.now - thresholds.window_s
        self._steps: list[StepView] | None = None
        self._recent: dict[int, list[StepView]] = {}
        self._bands: list[tuple[float, float, str]] | None = None
        self._starts: tuple[list[float] | None] | None = None  # (band starts or None,) once known
        self._phase_since: float | None = None
        self._gpus: list[GpuEntry] | None = None
        self._times: dict[tuple[int, float], list[float]] = {}
        self._start_k: dict[tuple[int, float], int | None] = {}
        self._axes: dict[tuple[int, float], bytes | None] = {}
        self._columns: dict[tuple[int, str, float], list[float]] = {}
        self._values: dict[tuple[int, str, float], list[float]] = {}
        self._sums: dict[tuple[int, str, float], tuple[float, int]] = {}
        self._has: dict[str, bool] = {}
        self._phase_of: dict[int, _Phases] = {}
        self._phase_by_points: dict[tuple, list[tuple[list[float], list[str], _Phases]]] = {}
        self._phase_by_axis: dict[bytes, list[tuple[list[str], _Phases]]] = {}
        self._wbands: list[tuple[float, float, str]] | None = None
        self._facts: JobFacts | None = None
        self._run_phases: list[Phase] | None = None
        self._flavour: VerlFlavour | None = None
        self._rollout_keys: frozenset[tuple[str, int]] | None = None

    # -- window text ----------------------------------------------------------------------
    @property
    def window_text(self) -> str:
        """How the GPU window is named in evidence."""
        return f"last {self.th.window_s:.0f} s"

    # -- ring windows (memoised) ----------------------------------------------------------
    def _start_of(self, ring: Ring, since: float) -> int | None:
        """Where the window from ``since`` starts in the ring (None: times not ascending),
        found once per ring and window and shared by its columns."""
        key = (id(ring), since)
        if key not in self._start_k:
            self._start_k[key] = ring.start_of(since)
        return self._start_k[key]

    def _times_of(self, ring: Ring, since: float) -> list[float]:
        """The times of a ring's points from ``since``, read once per ring and window."""
        key = (id(ring), since)
        ts = self._times.get(key)
        if ts is None:
            k = self._start_of(ring, since)
            ts = self._times[key] = (
                ring.series(ring.first_column, since)[0]
                if k is None
                else ring.times_array_from(k).tolist()
            )
        return ts

    def _axis(self, ring: Ring, since: float) -> bytes | None:
        """The window's times as bytes, None when the ring's times do not ascend. Equal bytes
        mean equal times (ascending times hold no NaN), told by one memcmp without a float
        object per point: the GPUs of a host are sampled at its agent's tick."""
        key = (id(ring), since)
        if key not in self._axes:
            k = self._start_of(ring, since)
            self._axes[key] = None if k is None else ring.times_array_from(k).tobytes()
        return self._axes[key]

    def _ring_series(
        self, ring: Ring, column: str, since: float
    ) -> tuple[list[float], list[float]]:
        """(times, values) of a ring column from ``since``, NaN kept."""
        key = (id(ring), column, since)
        vs = self._columns.get(key)
        if vs is None:
            k = self._start_of(ring, since)
            vs = self._columns[key] = (
                ring.series(column, since)[1] if k is None else ring.array_from(column, k).tolist()
            )
        return self._times_of(ring, since), vs

    def _window(self, ring: Ring, column: str, since: float) -> list[float] | array:
        """A ring column from ``since``, NaN kept: the list when a rule read it already, else
        a C array slice. Sums over the array make no float object per point to keep: at 4096
        GPUs those lists were most of an evaluation's cost (and its garbage)."""
        vs = self._columns.get((id(ring), column, since))
        if vs is not None:
            return vs
        k = self._start_of(ring, since)
        return ring.series(column, since)[1] if k is None else ring.array_from(column, k)

    def _stats(self, ring: Ring, column: str, since: float) -> tuple[float, int]:
        """(sum, count) of a ring column's non-missing values from ``since``: the same sum as
        ``sum(gpu_values(...))``, the values added in the same order."""
        key = (id(ring), column, since)
        hit = self._sums.get(key)
        if hit is None:
            vs = self._window(ring, column, since)
            total = sum(vs)
            if total != total:  # a NaN (missing) among them, or inf - inf: filter
                vals = [v for v in vs if v == v]
                hit = (sum(vals), len(vals))
            else:
                hit = (total, len(vs))
            self._sums[key] = hit
        return hit

    def gpu_values(self, entry: GpuEntry, column: str, since: float | None = None) -> list[float]:
        """Non-missing values of a GPU column from ``since`` (default: the window), oldest first."""
        since = self.since if since is None else since
        key = (id(entry.history), column, since)
        hit = self._values.get(key)
        if hit is None:
            vs = self._ring_series(entry.history, column, since)[1]
            # sum() is NaN iff a value is (or inf - inf): filter only then.
            hit = self._values[key] = [v for v in vs if v == v] if math.isnan(sum(vs)) else vs
        return hit

    def gpu_distinct(self, entry: GpuEntry, column: str) -> set[float]:
        """The distinct non-missing values of a GPU column over the window."""
        return {v for v in set(self._window(entry.history, column, self.since)) if v == v}

    # -- GPUs -----------------------------------------------------------------------------
    def gpus(self) -> list[GpuEntry]:
        """GPUs with at least one sample in the window."""
        if self._gpus is None:
            since = self.since
            self._gpus = [
                g for g in self.store.iter_gpus() if self._stats(g.history, "activity", since)[1]
            ]
        return list(self._gpus)

    def gpu_mean(self, entry: GpuEntry, column: str) -> float | None:
        """Mean of a GPU column over the window."""
        total, n = self._stats(entry.history, column, self.since)
        return total / n if n else None

    def gpu_series(self, entry: GpuEntry, column: str) -> tuple[list[float], list[float]]:
        """Times and values of a GPU column over the window, oldest first, NaN kept."""
        return self._ring_series(entry.history, column, self.since)

    def gpu_axis(self, entry: GpuEntry) -> bytes | None:
        """The GPU's window times as bytes (None when its times do not ascend): GPUs with
        equal axes were sampled at the same times."""
        return self._axis(entry.history, self.since)

    def gpu_times(self, entry: GpuEntry) -> list[float]:
        """The times of the GPU's points in the window, oldest first."""
        return self._times_of(entry.history, self.since)

    def gpu_column(self, entry: GpuEntry, column: str) -> Sequence[float]:
        """A GPU column over the window, NaN kept, as a list or a C array (not to be
        mutated): for readers that only iterate it."""
        return self._window(entry.history, column, self.since)

    def gpu_points(self, entry: GpuEntry, column: str) -> list[tuple[float, float]]:
        """(t, value) of a GPU column over the window, missing values dropped."""
        ts, vs = self.gpu_series(entry, column)
        return [(t, v) for t, v in zip(ts, vs, strict=True) if v == v]

    def has_column(self, column: str) -> bool:
        """True when any GPU has ``column`` in the window (e.g. GPM sm_util)."""
        if column not in self._has:
            self._has[column] = any(
                self._stats(g.history, column, self.since)[1] for g in self.store.iter_gpus()
            )
        return self._has[column]

    def gpu_name(self, entry: GpuEntry) -> str:
        """``host:index`` for evidence."""
        return f"{entry.host}:gpu{entry.index}"

    def device_mem_gib(self) -> float | None:
        """Largest device memory seen (GiB), from the hello or the samples."""
        sizes: list[float] = []
        for h in self.store.hosts.values():
            if h.hello is not None:
                sizes += [g.mem_total_mib for g in h.hello.gpus if g.mem_total_mib]
            sizes += [
                g.latest.mem_total_mib
                for g in h.gpus.values()
                if g.latest and g.latest.mem_total_mib
            ]
        return max(sizes) / 1024 if sizes else None

    def device_names(self) -> list[str]:
        """GPU model names from the hellos."""
        return sorted(
            {g.name for h in self.store.hosts.values() if h.hello for g in h.hello.gpus if g.name}
        )

    # -- hosts ----------------------------------------------------------------------------
    def hosts(self) -> list[HostEntry]:
        """All hosts known to the store."""
        return list(self.store.hosts.values())

    def host_values(self, host: HostEntry, column: str) -> list[tuple[float, float]]:
        """(t, value) of a host column over the window."""
        ts, vs = self._ring_series(host.history, column, self.since)
        return [(t, v) for t, v in zip(ts, vs, strict=True) if v == v]

    def host_mean(self, host: HostEntry, column: str) -> float | None:
        """Mean of a host column over the window (``host_values``' values, summed in place)."""
        total, n = self._stats(host.history, column, self.since)
        return total / n if n else None

    def gpu_host_count(self) -> int:
        """Hosts that report GPUs."""
        return sum(1 for h in self.store.hosts.values() if h.gpus)

    # -- verl steps -----------------------------------------------------------------------
    def steps(self) -> list[StepView]:
        """All steps in the store (oldest first), read through the stage catalogue."""
        if self._steps is None:
            memo = self._step_memo or StepMemo()
            self._steps = memo.views(self.store.steps, self.flavour().trainer_mode)
        return self._steps

    def recent_steps(self, n: int | None = None) -> list[StepView]:
        """The last ``n`` non-outlier steps (testing/save_checkpoint excluded). By default
        the steps the verdict judges: the last ``recent_steps`` of a live run, every step of
        the last phase of a finished one (post-mortem, phases.py)."""
        key = -1 if n is None else n
        if key not in self._recent:
            kept = [s for s in self.steps() if not s.is_outlier]
            if n is None and self.post_mortem() and (phases := self.phases()):
                self._recent[key] = [s for s in kept if s.step >= phases[-1].first_step]
            else:
                self._recent[key] = kept[-(int(self.th.recent_steps) if n is None else n) :]
        return list(self._recent[key])

    def post_mortem(self) -> bool:
        """True when the verl logs were read as finished runs (no live data)."""
        return bool(self.store.post_mortem)

    def phases(self) -> list[Phase]:
        """The run's phases (phases.py) over every step; only a finished run's (post-mortem)
        are told apart, a live verdict judges its window of the last steps."""
        if self._run_phases is None:
            from verl_top.diagnosis.phases import split_phases  # phases.py reads StepView

            self._run_phases = split_phases(self.steps(), self.th) if self.post_mortem() else []
        return self._run_phases

    def median_share(self, *stages: str) -> tuple[float, int] | None:
        """Median share of ``stages`` over the recent steps, and how many steps had it."""
        shares = [x for s in self.recent_steps() if (x := s.share(*stages)) is not None]
        m = median(shares)
        return None if m is None else (m, len(shares))

    def median_role_share(self, role: str) -> tuple[float, int, list[str]] | None:
        """Median share of a role's stages over the recent steps, the step count, the names."""
        shares, names = [], {}
        for s in self.recent_steps():
            stages = s.role_stages(role)
            if stages and (x := s.share(*stages)) is not None:
                shares.append(x)
                names.update(dict.fromkeys(stages))
        m = median(shares)
        return None if m is None else (m, len(shares), list(names))

    def median_seconds(self, *stages: str) -> float | None:
        """Median seconds per recent step spent in ``stages`` together (steps that ran none
        of them are left out)."""
        return median(
            sum(s.stage_times[n] for n in stages if n in s.stage_times)
            for s in self.recent_steps()
            if any(n in s.stage_times for n in stages)
        )

    def median_step_s(self) -> float | None:
        """Median of the recent steps' share denominator (step without validation/checkpoint)."""
        return median(s.denominator for s in self.recent_steps() if s.denominator)

    def flavour(self) -> VerlFlavour:
        """verl version range, trainer mode, engine, backend, device and pools of the job
        (``verl_top.verl.flavour``): the rules ask it before reading a key."""
        if self._flavour is None:
            from verl_top.verl.flavour import store_flavour

            self._flavour = store_flavour(self.store)
        return self._flavour

    def on_npu(self) -> bool:
        """True for a job on Ascend NPUs (trainer.device=npu): no NVML/GPM, CUDA-graph or
        other GPU-only wording applies to it."""
        return self.flavour().device == "npu"

    def pool_gpus(self) -> dict[str, list[GpuEntry]]:
        """The window's GPUs by the pool their processes serve: ``trainer`` (a WorkerDict or
        an actor worker on it), ``rollout`` (only rollout engine processes), ``unknown``."""
        out: dict[str, list[GpuEntry]] = {"trainer": [], "rollout": [], "unknown": []}
        for g in self.gpus():
            host = self.store.hosts.get(g.host)
            procs = host.procs.procs if host is not None and host.procs is not None else []
            roles = {p.role for p in procs if p.gpu_index == g.index}
            pool = (
                "trainer" if "trainer" in roles else "rollout" if "rollout" in roles else "unknown"
            )
            out[pool].append(g)
        return out

    def rollout_engine(self) -> str | None:
        """The rollout engine in use (``hf``, ``vllm``, ``sglang``...) from the config."""
        hit = self.config("actor_rollout_ref.rollout.name")
        return str(hit[1]).lower() if hit is not None else None

    def median_mfu(self) -> tuple[str, float, int] | None:
        """Median actor MFU over the recent steps that estimated it (verl logs 0 when it
        cannot, and a value above 1 is a wrong FLOPs figure: those steps say nothing)."""
        hits = [
            h
            for s in self.recent_steps()
            if (h := first(s.metrics, "perf/mfu/actor", "mfu/actor")) and 0 < h[1] <= 1
        ]
        if not hits:
            return None
        return hits[-1][0], float(statistics.median(v for _, v in hits)), len(hits)

    def median_metric(self, *keys: str) -> tuple[str, float, int] | None:
        """Median of the first present metric key over the recent steps."""
        hits = [h for s in self.recent_steps() if (h := first(s.metrics, *keys))]
        if not hits:
            return None
        return hits[-1][0], float(statistics.median(v for _, v in hits)), len(hits)

    def steps_text(self) -> str:
        """Names the steps used in evidence."""
        rec = self.recent_steps()
        if not rec:
            return "no steps"
        return f"median of steps {rec[0].step}-{rec[-1].step} ({len(rec)} steps)"

    def stage_bands(self) -> list[tuple[float, float, str]]:
        """(start, end, stage) bands rebuilt from each step's end time and stage durations."""
        if self._bands is None:
            bands: list[tuple[float, float, str]] = []
            for s in self.steps():
                if not s.step_time or not s.t:  # untimed steps (finished log) have no place in time
                    continue
                cursor = s.t - s.step_time
                for name in s.stage_times:
                    if name in PERIODIC_STAGES:
                        continue
                    d = s.stage_times.get(name)
                    if d:
                        bands.append((cursor, cursor + d, name))
                        cursor += d
            self._bands = bands
        return self._bands

    def _band_starts(self) -> list[float] | None:
        """Band starts when the bands are sorted and disjoint (one bisect then finds the only
        band that can hold a time), else None."""
        if self._starts is None:
            bands = self.stage_bands()
            ordered = all(s < e for s, e, _ in bands) and all(
                a[1] <= b[0] for a, b in zip(bands, bands[1:], strict=False)
            )
            self._starts = ([s for s, _, _ in bands] if ordered else None,)
        return self._starts[0]

    def phase_at(self, t: float, label: str = "") -> str | None:
        """verl stage running at ``t`` (from step bands), else a replay label's phase, else None."""
        bands = self.stage_bands()
        starts = self._band_starts()
        if starts is not None:
            i = bisect_right(starts, t) - 1
            if i >= 0 and t < bands[i][1]:
                return bands[i][2]
        else:  # overlapping bands (steps logged out of order): the first one holding t wins
            for start, end, name in bands:
                if start <= t < end:
                    return name
        return label_phase(label)

    def phase_since(self) -> float:
        """Start of phase-aware queries: the window, extended back over the last recent step."""
        if self._phase_since is None:
            rec = self.recent_steps(1)
            if rec and rec[-1].step_time and rec[-1].t:
                self._phase_since = min(self.since, rec[-1].t - rec[-1].step_time)
            else:
                self._phase_since = self.since
        return self._phase_since

    def _window_bands(self) -> list[tuple[float, float, str]]:
        """The stage bands that can hold a point from ``phase_since`` on, in order.

        Bands holding no time at all (end <= start, NaN) are left out, as ``phase_at`` never
        matches them."""
        if self._wbands is None:
            lo = self.phase_since()
            self._wbands = [b for b in self.stage_bands() if b[0] < b[1] and b[1] > lo]
        return self._wbands

    def _phases(self, entry: GpuEntry) -> _Phases:
        """The phase of each of the GPU's points from ``phase_since``, as runs.

        GPUs sampled at the same times with the same labels (a host's GPUs share its agent's
        tick) share one result."""
        ring = entry.history
        hit = self._phase_of.get(id(ring))
        if hit is not None:
            return hit
        since = self.phase_since()
        if entry.key in self._standalone_rollout():
            # A standalone rollout pool generates all the time; the step's stage bands are the
            # trainer's timeline, not its.
            hit = self._phase_of[id(ring)] = _Phases(["gen"] * len(self._times_of(ring, since)))
            return hit
        axis = self._axis(ring, since)
        if axis is not None:  # times as bytes: the times list is read for a new axis only
            labels = ring.recent_labels(since) or [""] * (len(axis) // 8)
            same_axis = self._phase_by_axis.setdefault(axis, [])
            hit = next((p for l2, p in same_axis if l2 == labels), None)
            if hit is None:
                hit = _Phases(self._phase_list(self._times_of(ring, since), labels))
                same_axis.append((labels, hit))
            self._phase_of[id(ring)] = hit
            return hit
        ts = self._times_of(ring, since)
        labels = ring.recent_labels(since) or [""] * len(ts)
        # Candidates share length, ends and end labels; comparing the lists in C confirms one
        # (hashing whole tuples of times and labels for every GPU cost more than the phases).
        key = (len(ts), ts[0], ts[-1], labels[0], labels[-1]) if ts else (0,)
        same = self._phase_by_points.setdefault(key, [])
        hit = next((p for t2, l2, p in same if t2 == ts and l2 == labels), None)
        if hit is None:
            hit = _Phases(self._phase_list(ts, labels))
            same.append((ts, labels, hit))
        self._phase_of[id(ring)] = hit
        return hit

    def _standalone_rollout(self) -> frozenset[tuple[str, int]]:
        """(host, index) of the GPUs of a standalone rollout pool (separate_async, one-step-off,
        fully async), from their processes; empty in the colocated modes."""
        if self._rollout_keys is None:
            if not self.flavour().separate_pools:
                self._rollout_keys = frozenset()
            else:
                self._rollout_keys = frozenset(g.key for g in self.pool_gpus()["rollout"])
        return self._rollout_keys

    def _phase_list(self, ts: list[float], labels: list[str]) -> list[str | None]:
        """``phase_at`` of every point, oldest first."""
        names = {x: label_phase(x) for x in set(labels)}
        phases = list(map(names.__getitem__, labels))
        if not self.stage_bands():
            return phases
        if not all(map(float.__le__, ts, ts[1:])):  # times not ascending: one lookup each
            return [self.phase_at(t, x) for t, x in zip(ts, labels, strict=True)]
        # Paint each band over the points it holds, last band first so that, as in
        # ``phase_at``, the first band holding a time wins.
        lo_t, hi_t = (ts[0], ts[-1]) if ts else (0.0, -1.0)
        for start, end, name in reversed(self._window_bands()):
            if end <= lo_t or start > hi_t:
                continue
            i, j = bisect_left(ts, start), bisect_left(ts, end)
            if i < j:
                phases[i:j] = [name] * (j - i)
        return phases

    def gpu_phase_points(
        self, entry: GpuEntry, column: str, keep: Callable[[str | None], bool]
    ) -> list[float]:
        """Values of ``column`` in the window at times whose phase passes ``keep``."""
        out = self._phase_span_values(entry, column, keep)
        return [v for v in out if v == v] if math.isnan(sum(out)) else list(out)

    def gpu_phase_mean(
        self, entry: GpuEntry, column: str, keep: Callable[[str | None], bool]
    ) -> float | None:
        """``mean(gpu_phase_points(entry, column, keep))``, summing the points once."""
        out = self._phase_span_values(entry, column, keep)
        total = sum(out)
        if total != total:  # a NaN (missing) among them, or inf - inf: the filtered reading
            out = [v for v in out if v == v]
            return sum(out) / len(out) if out else None
        return total / len(out) if out else None

    def _phase_span_values(
        self, entry: GpuEntry, column: str, keep: Callable[[str | None], bool]
    ) -> list[float] | array:
        """Values of ``column`` from ``phase_since`` at points whose phase passes ``keep``,
        missing ones (NaN) kept. Not to be mutated: one span over the whole window is the
        memoised column itself."""
        vs = self._window(entry.history, column, self.phase_since())
        spans = self._phases(entry).spans(keep)
        if len(spans) == 1 and spans[0] == (0, len(vs)):
            return vs
        if isinstance(vs, list):
            out: list[float] = []
            for i, j in spans:
                out += vs[i:j]
            return out
        joined = array("d")
        for i, j in spans:
            joined += vs[i:j]
        return joined

    # -- config, probes, logs -------------------------------------------------------------
    def config(self, *keys: str) -> tuple[str, Any] | None:
        """The first of ``keys`` present in the resolved config, with its value."""
        for k in keys:
            if k in self.store.config and self.store.config[k] is not None:
                return k, self.store.config[k]
        return None

    def has_config(self) -> bool:
        """True when a resolved config was read."""
        return bool(self.store.config)

    def facts(self) -> JobFacts:
        """The job's own settings (engine, TP, eager, offload, batch sizes, ...), read once;
        the engine, device, backend and trainer mode the flavour detected fill what the config
        does not say."""
        if self._facts is None:
            facts = job_facts(self.store.config, self.device_names())
            fl = self.flavour()
            self._facts = dataclasses.replace(
                facts,
                engine=facts.engine or fl.engine,
                device=fl.device if fl.device != "gpu" else facts.device,
                strategy=facts.strategy or fl.backend,
                trainer_mode=fl.trainer_mode,
            )
        return self._facts

    def logs_given(self) -> bool:
        """True when a verl log was given (followed or read), whatever it held."""
        return bool(self.store.log_stats)

    def need_steps(self, what: str = "verl steps") -> str:
        """A no-data detail for a rule that needs ``what`` from verl's step lines, in this
        session's terms (``origin.verl_log_ask``: give a log, the recording has none, the log
        given has no such data); once steps are read it says only what they lack."""
        ask = verl_log_ask(self.store)
        if ask:
            return f"needs {what}: {ask}"
        if what == "verl steps":
            return NEEDS_TIMINGS
        if "verl steps" in what:
            return f"needs {what}"
        return f"needs {what}, which the verl steps read do not have"

    def role_seconds(self) -> dict[str, float]:
        """Median seconds per recent step of each stage role (rollout, train, logprob, ...)."""
        out: dict[str, float] = {}
        roles = {role_of(n, s.unknown) for s in self.recent_steps() for n in s.stage_times}
        for role in sorted(r for r in roles if r):
            names = {n for s in self.recent_steps() for n in s.role_stages(role)}
            secs = self.median_seconds(*names) if names else None
            if secs:
                out[role] = secs
        return out

    def topology(self) -> dict[str, dict[tuple[int, int], str]] | None:
        """GPU link matrix per host when a topology source filled ``store.topology``."""
        topo = getattr(self.store, "topology", None)
        return topo if isinstance(topo, dict) and topo else None

    def num(self, value: Any) -> float | None:
        """A config value as a number (None for null/non-numbers)."""
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int | float):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            return None

    def flag(self, value: Any) -> bool | None:
        """A config value as a boolean (None when unknown)."""
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, int | float):
            return bool(value)
        return None


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, or None for no values."""
    return sum(values) / len(values) if values else None
