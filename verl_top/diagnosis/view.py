"""A read-only view of the store for the rules: windows, per-GPU means, steps, config.

The view never writes to the store. Its clock is ``Store.now`` (the newest data time), so a
replay gives the same verdict every time.

verl metric names: the stage catalogue below accepts both the current ``timing_s/<stage>`` keys
and the oldest ``timing/<stage>`` keys (verl.md §1.2). It is a small local mapping until
``verl_top.verl.stages`` provides the shared one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_top.diagnosis.thresholds import Thresholds
from verl_top.store import GpuEntry, HostEntry, Store

# Stages of one step in execution order (verl.md §1.2); testing/save_checkpoint follow `step`.
STEP_STAGES: tuple[str, ...] = (
    "gen",
    "gen_max",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "dump_rollout_generations",
)
PERIODIC_STAGES: tuple[str, ...] = ("testing", "save_checkpoint")
TIMING_PREFIXES: tuple[str, ...] = ("timing_s/", "timing/")


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

    def share(self, *stages: str) -> float | None:
        """Fraction of the core step time spent in ``stages`` (None when unknown)."""
        if not self.step_time_core:
            return None
        present = [self.stage_times[s] for s in stages if s in self.stage_times]
        if not present:
            return None
        return sum(present) / self.step_time_core


def step_view(step: int, t: float, metrics: dict[str, float]) -> StepView:
    """Read one step's metrics: stage times, step time without periodic work, throughput."""
    stages = {s: v for s in STEP_STAGES + PERIODIC_STAGES if (v := timing(metrics, s)) is not None}
    core_sum = sum(v for s, v in stages.items() if s in STEP_STAGES)
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
    )


def median(values: Iterable[float]) -> float | None:
    """Median, or None for no values."""
    vals = list(values)
    return statistics.median(vals) if vals else None


def fmt_pct(x: float) -> str:
    """A fraction as a percentage string."""
    return f"{100 * x:.0f} %"


class View:
    """Read-only helpers over a Store for one evaluation."""

    def __init__(self, store: Store, thresholds: Thresholds) -> None:
        self.store = store
        self.th = thresholds
        self.now = store.now
        self.since = store.now - thresholds.window_s
        self._steps: list[StepView] | None = None
        self._bands: list[tuple[float, float, str]] | None = None

    # -- window text ----------------------------------------------------------------------
    @property
    def window_text(self) -> str:
        """How the GPU window is named in evidence."""
        return f"last {self.th.window_s:.0f} s"

    # -- GPUs -----------------------------------------------------------------------------
    def gpus(self) -> list[GpuEntry]:
        """GPUs with at least one sample in the window."""
        return [g for g in self.store.iter_gpus() if g.history.values("activity", self.since)]

    def gpu_mean(self, entry: GpuEntry, column: str) -> float | None:
        """Mean of a GPU column over the window."""
        vals = entry.history.values(column, self.since)
        return sum(vals) / len(vals) if vals else None

    def gpu_points(self, entry: GpuEntry, column: str) -> list[tuple[float, float]]:
        """(t, value) of a GPU column over the window, missing values dropped."""
        ts, vs = entry.history.series(column, self.since)
        return [(t, v) for t, v in zip(ts, vs, strict=True) if not math.isnan(v)]

    def has_column(self, column: str) -> bool:
        """True when any GPU has ``column`` in the window (e.g. GPM sm_util)."""
        return any(g.history.values(column, self.since) for g in self.store.iter_gpus())

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
        ts, vs = host.history.series(column, self.since)
        return [(t, v) for t, v in zip(ts, vs, strict=True) if not math.isnan(v)]

    def gpu_host_count(self) -> int:
        """Hosts that report GPUs."""
        return sum(1 for h in self.store.hosts.values() if h.gpus)

    # -- verl steps -----------------------------------------------------------------------
    def steps(self) -> list[StepView]:
        """All steps in the store (oldest first), read through the stage catalogue."""
        if self._steps is None:
            self._steps = [
                step_view(s.step, s.t, s.metrics) for s in self.store.steps if s.step > 0
            ]
        return self._steps

    def recent_steps(self, n: int | None = None) -> list[StepView]:
        """The last ``n`` non-outlier steps (testing/save_checkpoint excluded)."""
        n = int(self.th.recent_steps) if n is None else n
        return [s for s in self.steps() if not s.is_outlier][-n:]

    def median_share(self, *stages: str) -> tuple[float, int] | None:
        """Median share of ``stages`` over the recent steps, and how many steps had it."""
        shares = [x for s in self.recent_steps() if (x := s.share(*stages)) is not None]
        m = median(shares)
        return None if m is None else (m, len(shares))

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
                for name in STEP_STAGES:
                    d = s.stage_times.get(name)
                    if d:
                        bands.append((cursor, cursor + d, name))
                        cursor += d
            self._bands = bands
        return self._bands

    def phase_at(self, t: float, label: str = "") -> str | None:
        """verl stage running at ``t`` (from step bands), else a replay label's phase, else None."""
        for start, end, name in self.stage_bands():
            if start <= t < end:
                return name
        if label.startswith("gen"):
            return "gen"
        if label.startswith(("train", "update")):
            return "update_actor"
        return None

    def phase_since(self) -> float:
        """Start of phase-aware queries: the window, extended back over the last recent step."""
        rec = self.recent_steps(1)
        if rec and rec[-1].step_time and rec[-1].t:
            return min(self.since, rec[-1].t - rec[-1].step_time)
        return self.since

    def gpu_phase_points(
        self, entry: GpuEntry, column: str, keep: Callable[[str | None], bool]
    ) -> list[float]:
        """Values of ``column`` in the window at times whose phase passes ``keep``."""
        since = self.phase_since()
        ts, vs = entry.history.series(column, since)
        _, labels = entry.history.label_series(since)
        labels = labels or [""] * len(ts)
        return [
            v
            for t, v, lab in zip(ts, vs, labels, strict=True)
            if not math.isnan(v) and keep(self.phase_at(t, lab))
        ]

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
