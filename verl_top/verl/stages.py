"""The stage catalogue of one verl training step, and what a step's metrics say about speed.

verl times each stage of a PPO/GRPO step with ``marked_timer`` and logs ``timing_s/<stage>``
(``timing/<stage>`` in the oldest versions). This module maps every name verl has used onto one
catalogue of canonical stages, knows which timers are nested inside others, infers whether
``step`` includes validation and checkpointing (it does before v0.6), and derives the numbers the
panes and rules need (``StepView``). It also rebuilds when each stage ran (``stage_bands``) from
the arrival time of the step line, which is printed when the step is over.

What a timer means depends on the verl version and the trainer mode: the key catalogue
(``verl_top.verl.keys``, verl_top/data/verl_keys.yaml) says where each known timer goes. In the
async trainers ``timing_s/gen`` is the trainer's wait for finished samples, filed as the stage
``wait``; one-step-off's ``generate_async`` runs outside the step; ``sync_rollout_weights``
contains ``update_weights``; fully async's weight sync prints as ``timing_s/timing_s/param_sync``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_top.diagnosis.readable import mfu as mfu_text  # one formatting module everywhere
from verl_top.model import VerlStep
from verl_top.verl.config import n_gpus as config_n_gpus
from verl_top.verl.config import samples_per_step
from verl_top.verl.keys import catalogue


@dataclass(frozen=True)
class Stage:
    """One canonical stage of a verl step."""

    name: str
    label: str
    description: str
    extra: bool = False  # validation / checkpoint: periodic, not part of the steady-state step
    overhead: bool = False  # profiler bookkeeping, ~0.1 ms
    role: str = ""  # rollout | reward | logprob | driver | train | sync | io | periodic | overhead
    diag_step: int = 3  # the diagnosis step whose rules judge this stage


# Execution order (= verl's timing dict order). ``step`` is the wall time of the stages before it
# (and, before v0.6, of testing and save_checkpoint too); it is not a stage of its own in bands.
STAGES: tuple[Stage, ...] = (
    Stage(
        "start_profile",
        "profile start",
        "profiler start for profiled steps",
        overhead=True,
        role="overhead",
    ),
    Stage(
        "wait_for_enough_samples",
        "wait (hybrid)",
        "fully async, dynamic scheduling: trainer GPUs lent to the rollout wait for samples",
        role="wait",
    ),
    Stage(
        "wait",
        "wait for samples",
        "async trainers: the trainer's wait for finished samples (timing_s/gen, wait_prev_gen)",
        role="wait",
    ),
    Stage(
        "gen",
        "generate",
        "rollout generation (includes the agent loop and, v0.5, reshard)",
        role="rollout",
    ),
    Stage("gen_max", "greedy baseline", "greedy rollout for the ReMax baseline", role="rollout"),
    Stage("reward", "reward", "reward model / reward function", role="reward"),
    Stage(
        "old_log_prob",
        "old log-prob",
        "actor forward for old log-probs and entropy",
        role="logprob",
    ),
    Stage("ref", "ref log-prob", "reference-model log-probs", role="logprob"),
    Stage("values", "values", "critic forward", role="logprob"),
    Stage(
        "adv",
        "advantage",
        "advantage on the driver (includes waiting for async reward)",
        role="driver",
    ),
    Stage("update_critic", "update critic", "critic PPO update", role="train"),
    Stage(
        "update_actor",
        "update actor",
        "actor PPO update (fwd+bwd+optimizer, offload)",
        role="train",
    ),
    Stage(
        "update_weights",
        "weight sync",
        "trainer to rollout weight sync",
        role="sync",
        diag_step=2,
    ),
    Stage("switch_to_rollout", "to rollout", "lend trainer GPUs to the rollout", role="sync"),
    Stage("switch_to_trainer", "to trainer", "take lent GPUs back from the rollout", role="sync"),
    Stage("switch_wait", "switch wait", "wait before switching back to training", role="wait"),
    Stage("dump_rollout_generations", "dump rollouts", "JSONL dump of samples", role="io"),
    Stage("step", "step", "wall time of the step as verl measures it"),
    Stage(
        "testing",
        "validation",
        "validation run (every test_freq steps)",
        extra=True,
        role="periodic",
    ),
    Stage(
        "save_checkpoint",
        "checkpoint",
        "checkpoint save (every save_freq steps)",
        extra=True,
        role="periodic",
    ),
    Stage("stop_profile", "profile stop", "profiler stop", overhead=True, role="overhead"),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
STAGE_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
# Stages that make up the step, in execution order (for sums and bands).
WORK_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.name != "step")
CORE_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.name != "step" and not s.extra)
EXTRA_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.extra)
# Stages worth a column in tables and reports (the profiler's bookkeeping left out).
DISPLAY_STAGES: tuple[str, ...] = tuple(s for s in WORK_STAGES if not STAGE_BY_NAME[s].overhead)

# Where each known timer goes (its canonical stage, rollout detail, outside the step, inside
# another timer) is the key catalogue's (verl_top/data/verl_keys.yaml), by trainer mode.
# Unknown names with a "/" are rollout detail too (a fork's per-sample timers).
DETAIL_PREFIXES: tuple[str, ...] = ("agent_loop/", "generation_timing/")
# A timer outside the catalogue whose name says rollout (a fork's own rollout timer).
ROLLOUT_WORDS: tuple[str, ...] = ("gen", "generate", "rollout", "sample")
UNKNOWN_ROLE = "unknown"

TIMING_PREFIXES: tuple[str, ...] = ("timing_s/", "timing/")
PER_TOKEN_PREFIX = "timing_per_token_ms/"

# Tolerance when deciding whether ``step`` contains testing/save_checkpoint.
STEP_TOLERANCE_S = 1.0
STEP_TOLERANCE_FRAC = 0.02


MFU_NOT_ESTIMATED = "not estimated"


def mfu_value(value: float | None) -> float | None:
    """verl's MFU, or ``None`` when it was not estimated: verl logs 0 for a GPU or model it
    has no FLOPs figure for; NaN, negative values and impossible ones above 1 (a wrong
    FLOPs figure) mean nothing either."""
    if value is None or not math.isfinite(value) or value <= 0 or value > 1:
        return None
    return value


def fmt_mfu(value: float | None) -> str:
    """An MFU for people, as a percentage: ``31 %``; a tiny one ``0.015 %`` (never ``0.00``,
    never scientific notation); ``not estimated`` when verl logged 0 or nothing."""
    return mfu_text(mfu_value(value))


def timing_name(key: str) -> str | None:
    """``timing_s/gen`` or ``timing/gen`` -> ``gen``; ``None`` for other keys."""
    for prefix in TIMING_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return None


def stage_of(key: str, mode: str | None = None) -> str | None:
    """Canonical stage of a timing key as ``mode`` files it (``timing_s/reshard`` ->
    ``update_weights``; ``timing_s/gen`` -> ``wait`` in async modes), else None."""
    name = timing_name(key)
    if name is None:
        return None
    use = catalogue().timer(name, mode)
    if use is not None:
        return use.stage if use.kind in ("timer", "contained") else None
    return name if name in STAGE_BY_NAME else None


@dataclass
class StageTimes:
    """Stage durations of one step, by canonical name, plus what is nested in what."""

    times: dict[str, float] = field(default_factory=dict)
    nested: dict[str, str] = field(default_factory=dict)  # stage -> the stage containing it
    other: dict[str, float] = field(default_factory=dict)  # rollout detail timers (not stages)
    per_token_ms: dict[str, float] = field(default_factory=dict)
    # Stages outside the catalogue (a fork's or a newer verl's own timers) and their role:
    # ``rollout`` when the name says so (gen/generate/rollout/sample), else ``unknown``.
    unknown: dict[str, str] = field(default_factory=dict)


def is_rollout_name(name: str) -> bool:
    """True when a timer's name says it is rollout (``gen``, ``generate``, ``rollout``, ``sample``)."""
    low = name.lower()
    return any(word in low for word in ROLLOUT_WORDS)


def role_of(name: str, unknown: Mapping[str, str] | None = None) -> str:
    """The role of a stage: the catalogue's, or the one given to a timer outside it."""
    stage = STAGE_BY_NAME.get(name)
    if stage is not None:
        return stage.role
    return (unknown or {}).get(name, UNKNOWN_ROLE)


def split_timings(metrics: Mapping[str, float], mode: str | None = None) -> StageTimes:
    """Sort a step's timing keys into stages, nested timers and rollout detail.

    A timer the key catalogue knows goes where the catalogue says for ``mode`` (the trainer
    mode, ``verl_top.verl.flavour``): its canonical stage (``timing_s/gen`` is ``wait`` in the
    async modes; ``reshard``, ``sync_rollout_weights`` and the doubled ``timing_s/param_sync``
    are ``update_weights``), rollout detail (``agent_loop/*``, ``generation_timing/*``,
    ``generate_sequences``) or outside the step (``generate_async``); a timer inside another
    that is also logged (``update_weights`` inside ``sync_rollout_weights``) is kept apart, never
    added twice. Every other ``timing_s/<name>`` is a stage too (the catalogue is open): it keeps
    its own name and counts in the shares, with role ``rollout`` when its name says so and
    ``unknown`` otherwise; any such name with a ``/`` is rollout detail, and when ``gen`` is
    logged a rollout-named timer no longer than ``gen`` is taken as nested inside it.
    NaN and infinite timings are left out.
    """
    out = _place_timers(metrics, mode)
    _nest_in_gen(out)
    return out


def _place_timers(metrics: Mapping[str, float], mode: str | None) -> StageTimes:
    """``split_timings`` but for its last step (rollout-named timers nested in ``gen``): where
    each timer goes depends on the keys alone (and on which values are finite)."""
    cat = catalogue()
    out = StageTimes()
    named: list[tuple[str, float]] = []
    for key, value in metrics.items():
        # One prefix test in C per key (a step has ~70, a few of them timers): every prefix
        # of TIMING_PREFIXES ends at the key's first "/" (timing_name without its calls).
        if key.startswith(TIMING_PREFIXES):
            named.append((key.partition("/")[2], value))
        elif key.startswith(PER_TOKEN_PREFIX):
            out.per_token_ms[key[len(PER_TOKEN_PREFIX) :]] = value
    inner = cat.contained(frozenset(n for n, _ in named))
    present = {n for n, _ in named}
    for name, value in named:
        if not math.isfinite(value):
            continue
        use = cat.timer(name, mode)
        if name in inner or (use is not None and use.kind in ("detail", "outside")):
            out.other[name] = value
            continue
        if use is not None and use.stage:
            if use.stage in out.times:  # a second timer for the same stage: keep the first
                out.other[name] = value
                continue
            out.times[use.stage] = value
            container = use.inside[len(TIMING_PREFIXES[0]) :] if use.inside else None
            if use.kind == "contained" and container in present:
                out.nested[use.stage] = stage_of(TIMING_PREFIXES[0] + container, mode) or container
            continue
        if name in STAGE_BY_NAME:
            out.times[name] = value
            continue
        if "/" in name or name.startswith(DETAIL_PREFIXES) or not name:
            out.other[name] = value
            continue
        out.times[name] = value
        out.unknown[name] = "rollout" if is_rollout_name(name) else UNKNOWN_ROLE
    return out


def _nest_in_gen(out: StageTimes) -> None:
    """When ``gen`` is logged, a rollout-named timer outside the catalogue no longer than
    ``gen`` is taken as nested inside it."""
    gen = out.times.get("gen")
    if gen is not None:
        for name, role in out.unknown.items():
            if role == "rollout" and out.times[name] <= gen:
                out.nested[name] = "gen"


@dataclass(frozen=True)
class _TimingPlan:
    """Where ``_place_timers`` puts each key of a step with these keys, as key positions: the
    same for every step of a run (its ~70 keys), so the catalogue is asked once."""

    times: tuple[tuple[str, int], ...]
    other: tuple[tuple[str, int], ...]
    per_token_ms: tuple[tuple[str, int], ...]
    nested: dict[str, str]
    unknown: dict[str, str]
    timers: tuple[int, ...]  # every timer key's position: a non-finite value voids the plan

    @classmethod
    def of(cls, keys: tuple[str, ...], mode: str | None) -> _TimingPlan:
        """The plan of ``keys``, found by placing each key's position as its value."""
        placed = _place_timers({key: float(i) for i, key in enumerate(keys)}, mode)

        def at(values: dict[str, float]) -> tuple[tuple[str, int], ...]:
            return tuple((name, int(i)) for name, i in values.items())

        timers = sorted(int(i) for i in (*placed.times.values(), *placed.other.values()))
        return cls(
            at(placed.times),
            at(placed.other),
            at(placed.per_token_ms),
            placed.nested,
            placed.unknown,
            tuple(timers),
        )

    def apply(self, values: list[float]) -> StageTimes | None:
        """The StageTimes of a step whose values (in key order) are ``values``; None when a
        timer is not finite (``_place_timers`` leaves it out: the plan does not hold)."""
        if not math.isfinite(sum(values[i] for i in self.timers)):
            return None
        out = StageTimes(
            times={name: values[i] for name, i in self.times},
            nested=dict(self.nested),
            other={name: values[i] for name, i in self.other},
            per_token_ms={name: values[i] for name, i in self.per_token_ms},
            unknown=dict(self.unknown),
        )
        _nest_in_gen(out)
        return out


class TimingPlans:
    """``split_timings`` for the many steps of a run: each layout of keys (and trainer mode)
    is read through the catalogue once (an evaluation reads up to 5000 steps)."""

    def __init__(self, limit: int = 64) -> None:
        self._plans: dict[tuple[tuple[str, ...], str | None], _TimingPlan] = {}
        self._limit = limit  # layouts kept (a run has one or two; a fork's extra keys a few)

    def split(self, metrics: Mapping[str, float], mode: str | None = None) -> StageTimes:
        """What ``split_timings(metrics, mode)`` returns."""
        keys = tuple(metrics)
        plan = self._plans.get((keys, mode))
        if plan is None:
            if len(self._plans) >= self._limit:
                self._plans.clear()
            plan = self._plans[keys, mode] = _TimingPlan.of(keys, mode)
        out = plan.apply(list(metrics.values()))
        return out if out is not None else split_timings(metrics, mode)


def core_names(times: Mapping[str, float], nested: Mapping[str, str]) -> list[str]:
    """Stages that make up the core step, in execution order; timers outside the catalogue
    follow the rollout when rollout by name, else come after the catalogue's stages."""
    known = [n for n in CORE_STAGES if n in times and n not in nested]
    unknown = [n for n in times if n not in STAGE_BY_NAME and n not in nested]
    rollout = [n for n in unknown if is_rollout_name(n)]
    rest = [n for n in unknown if n not in rollout]
    return rollout + known + rest


def _sum(times: Mapping[str, float], names: Iterable[str], nested: Mapping[str, str]) -> float:
    return sum(times[n] for n in names if n in times and n not in nested)


def _core_sum(times: Mapping[str, float], nested: Mapping[str, str]) -> float:
    return sum(times[n] for n in core_names(times, nested))


def included_extras(
    times: Mapping[str, float], nested: Mapping[str, str] | None = None
) -> frozenset[str] | None:
    """Which of ``testing`` / ``save_checkpoint`` the logged ``step`` contains.

    verl moved them: both inside ``step`` up to v0.5, neither in v0.6-v0.7 (and in the
    one-step-off and fully-async trainers), ``save_checkpoint`` only from v0.8 and in the V1
    trainer (key catalogue, ``timing_s/step``). Told from the numbers, not the version: ``step``
    contains what it is at least as long as, with the other stages, within a tolerance.
    ``None`` when it cannot be told (no ``step`` key, or neither ran this step).
    """
    nested = nested or {}
    step = times.get("step")
    present = [n for n in EXTRA_STAGES if n in times and n not in nested and times[n] > 0]
    if step is None or not present:
        return None
    core = _core_sum(times, nested)
    tolerance = max(STEP_TOLERANCE_S, STEP_TOLERANCE_FRAC * step)
    if step + tolerance >= core + sum(times[n] for n in present):
        return frozenset(present)
    ckpt = times.get("save_checkpoint")
    if len(present) > 1 and ckpt and step + tolerance >= core + ckpt:
        return frozenset({"save_checkpoint"})
    return frozenset()


def step_includes_extras(
    times: Mapping[str, float], nested: Mapping[str, str] | None = None
) -> bool | None:
    """Whether ``step`` contains every testing / save_checkpoint that ran (verl <= v0.5, or a
    checkpoint-only step from v0.8) or not all of them (``included_extras`` says which).

    ``None`` when it cannot be told (no ``step`` key, or neither ran this step).
    """
    inc = included_extras(times, nested)
    if inc is None:
        return None
    nested = nested or {}
    return inc == {n for n in EXTRA_STAGES if n in times and n not in nested and times[n] > 0}


def core_step_time(
    times: Mapping[str, float], nested: Mapping[str, str] | None = None
) -> float | None:
    """Step time without validation and checkpoint, comparable across verl versions.

    ``step`` minus the testing/save_checkpoint it includes (``included_extras``); when no
    ``step`` key was logged (earliest verl) the sum of the core stages.
    """
    nested = nested or {}
    step = times.get("step")
    if step is None:
        names = core_names(times, nested)
        return _core_sum(times, nested) if names else None
    inc = included_extras(times, nested) or frozenset()
    return max(0.0, step - sum(times[n] for n in inc))


def _first(metrics: Mapping[str, float], *keys: str) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if value is not None:
            return value
    return None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass
class StepView:
    """What one verl step says about speed, in canonical stage names.

    Times in seconds. ``None`` means verl did not log it and it cannot be derived.
    """

    step: int
    t: float
    host: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # the raw metrics of the line
    stage_times: dict[str, float] = field(default_factory=dict)
    nested: dict[str, str] = field(default_factory=dict)
    other_timings: dict[str, float] = field(default_factory=dict)
    per_token_ms: dict[str, float] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)  # stages outside the catalogue: role
    step_time: float | None = None  # verl's ``step`` (or the sum of stages when not logged)
    step_time_core: float | None = None  # without testing / save_checkpoint
    wall_time: float | None = None  # core + testing + save_checkpoint: time the step occupied
    step_time_source: str = ""  # timing_s/step | perf/time_per_step | sum of stage timings
    includes_extras: bool | None = None
    throughput: float | None = None  # tokens/s/GPU
    throughput_source: str = ""  # verl | derived | estimated
    total_tokens: float | None = None
    total_tokens_per_s: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None  # actor MFU 0-1; None when verl logs 0 (unknown GPU/model)
    mfu_critic: float | None = None
    mfu_infer: float | None = None  # old_log_prob forward MFU (0 on the legacy workers)
    mem_reserved_gb: float | None = None
    mem_allocated_gb: float | None = None
    cpu_mem_used_gb: float | None = None
    gen_seq_min: float | None = None
    gen_seq_mean: float | None = None
    gen_seq_max: float | None = None
    long_tail_ratio: float | None = None  # slowest / mean generation time
    num_preempted: float | None = None  # max preemptions of one request (agent loop)
    num_preempted_mean: float | None = None
    is_outlier: bool = False  # testing or save_checkpoint ran this step
    has_training: bool = False  # False for a validation-only line (step 0)

    @classmethod
    def from_step(
        cls,
        rec: VerlStep,
        config: Mapping[str, Any] | None = None,
        n_gpus: int | None = None,
        mode: str | None = None,
    ) -> StepView:
        """Build the view of one step; ``config`` (dotted keys) supplies GPUs and batch size,
        ``mode`` the trainer mode its timers are read in (``verl_top.verl.flavour``)."""
        m = rec.metrics
        config = config or {}
        timings = split_timings(m, mode)
        times, nested = dict(timings.times), timings.nested
        if "step" not in times and "perf/time_per_step" in m:
            times["step"] = m["perf/time_per_step"]  # same number, present when timers are not
        view = cls(
            step=rec.step,
            t=rec.t,
            host=rec.host,
            metrics=m,
            stage_times=dict(times),
            nested=dict(nested),
            other_timings=timings.other,
            per_token_ms=timings.per_token_ms,
            unknown=dict(timings.unknown),
        )
        extras = _sum(times, EXTRA_STAGES, nested)
        view.is_outlier = extras > 0
        view.has_training = any(
            n in times for n in ("gen", "update_actor", "update_critic")
        ) or any(role == "rollout" for role in timings.unknown.values())
        view.includes_extras = step_includes_extras(times, nested)
        view.step_time_core = core_step_time(times, nested)
        if "step" in times:
            view.step_time = times["step"]
            view.step_time_source = (
                "timing_s/step" if "step" in timings.times else "perf/time_per_step"
            )
        elif view.step_time_core is not None:
            # Earliest verl logged no ``step``; its step contained validation.
            view.step_time = view.step_time_core + extras
            view.step_time_source = "sum of stage timings"
        if view.step_time_core is not None:
            view.wall_time = view.step_time_core + extras
        view._fill_rollout(timings.other)
        view._fill_perf(m, config, n_gpus if n_gpus is not None else config_n_gpus(config))
        return view

    def _fill_rollout(self, other: Mapping[str, float]) -> None:
        self.gen_seq_min = other.get("agent_loop/generate_sequences/min")
        self.gen_seq_mean = other.get("agent_loop/generate_sequences/mean")
        self.gen_seq_max = other.get("agent_loop/generate_sequences/max")
        if self.gen_seq_mean is None and "generate_sequences" in other:
            # v0.5/v0.6 sync rollout: mean over ranks, with max/min of the ranks.
            self.gen_seq_mean = other["generate_sequences"]
            self.gen_seq_max = other.get("generation_timing/max")
            self.gen_seq_min = other.get("generation_timing/min")
        self.long_tail_ratio = _ratio(self.gen_seq_max, self.gen_seq_mean)
        preempted = other.get("agent_loop/num_preempted/max")
        self.num_preempted = preempted if preempted is not None and preempted >= 0 else None
        mean = other.get("agent_loop/num_preempted/mean")
        self.num_preempted_mean = mean if mean is not None and mean >= 0 else None

    def _fill_perf(
        self, m: Mapping[str, float], config: Mapping[str, Any], gpus: int | None
    ) -> None:
        core = self.step_time_core
        self.total_tokens = m.get("perf/total_num_tokens")
        self.throughput = m.get("perf/throughput")
        if self.throughput is not None:
            self.throughput_source = "verl"
        elif self.total_tokens is not None and gpus:
            self.throughput = _ratio(self.total_tokens / gpus, core)
            self.throughput_source = "derived" if self.throughput is not None else ""
        else:
            self._estimate_tokens(m, config, gpus)
        if self.total_tokens is not None:
            self.total_tokens_per_s = _ratio(self.total_tokens, core)
        elif self.throughput is not None and gpus:
            self.total_tokens_per_s = self.throughput * gpus
        samples = samples_per_step(config)
        self.samples_per_s = _ratio(float(samples), core) if samples else None
        self.mfu = mfu_value(_first(m, "perf/mfu/actor", "mfu/actor", "actor/perf/mfu"))
        self.mfu_critic = mfu_value(_first(m, "perf/mfu/critic", "mfu/critic"))
        self.mfu_infer = mfu_value(_first(m, "perf/mfu/actor_infer"))
        self.mem_reserved_gb = _first(
            m, "perf/max_memory_reserved_gb", "actor/perf/max_memory_reserved_gb"
        )
        self.mem_allocated_gb = _first(
            m, "perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb"
        )
        self.cpu_mem_used_gb = _first(m, "perf/cpu_memory_used_gb", "actor/perf/cpu_memory_used_gb")

    def _estimate_tokens(
        self, m: Mapping[str, float], config: Mapping[str, Any], gpus: int | None
    ) -> None:
        # Early verl logged no token counts: mean prompt + response length × samples per step.
        samples = samples_per_step(config)
        prompt, response = m.get("prompt_length/mean"), m.get("response_length/mean")
        if not samples or prompt is None or response is None or not self.has_training:
            return
        self.total_tokens = (prompt + response) * samples
        if gpus:
            self.throughput = _ratio(self.total_tokens / gpus, self.step_time_core)
            self.throughput_source = "estimated" if self.throughput is not None else ""

    def share(self, *stages: str) -> float | None:
        """Fraction of the step spent in ``stages`` together (canonical names).

        Core stages are measured against ``step_time_core``; as soon as testing or
        save_checkpoint is among them, against ``wall_time`` (the time the whole step occupied).
        ``None`` when none of the stages ran or the step time is unknown.
        """
        present = [self.stage_times[s] for s in stages if s in self.stage_times]
        if not present:
            return None
        extra = any(s in EXTRA_STAGES for s in stages)
        return _ratio(sum(present), self.wall_time if extra else self.step_time_core)

    def stage(self, name: str) -> float | None:
        """Duration of a canonical stage, or ``None`` when it did not run / was not logged."""
        return self.stage_times.get(name)

    def role(self, name: str) -> str:
        """Role of one of this step's stages (``rollout``, ``train``, ..., ``unknown``)."""
        return role_of(name, self.unknown)

    def shares(self) -> StageShares | None:
        """Each core stage's share of the step, plus ``other`` (time no stage explains).

        The denominator is the step without testing/save_checkpoint (``step_time_core``), or
        the sum of the stages when they add up to more (overlapping or asynchronous timers), so
        the parts always sum to 100 %. ``None`` when the step time is unknown.
        """
        names = [
            n
            for n in core_names(self.stage_times, self.nested)
            if not (n in STAGE_BY_NAME and STAGE_BY_NAME[n].overhead)  # ~0.1 ms: in "other"
        ]
        if not names or not self.step_time_core:
            return None
        total = sum(self.stage_times[n] for n in names)
        denominator = max(self.step_time_core, total)
        if denominator <= 0:
            return None
        parts = [(n, self.stage_times[n], self.stage_times[n] / denominator) for n in names]
        other = max(0.0, denominator - total)
        return StageShares(denominator, parts, other, other / denominator)


@dataclass
class StageShares:
    """A step split into its stages' shares: ``parts`` (name, seconds, share) and ``other``."""

    denominator: float  # seconds all shares are taken of
    parts: list[tuple[str, float, float]]
    other_s: float
    other_share: float

    def share(self, *names: str) -> float:
        """Sum of the shares of ``names`` (0 for stages that did not run)."""
        return sum(share for n, _, share in self.parts if n in names)


def stage_bands(
    steps: Iterable[VerlStep | StepView], mode: str | None = None
) -> list[tuple[float, float, str]]:
    """When each stage ran: ``(t_start, t_end, stage)`` for every step, oldest first.

    verl prints a step's line when the step is over, so each step is walked backwards from its
    arrival time ``t`` through its stages in reverse execution order, each lasting its logged
    duration. Nested timers (v0.5 ``reshard`` inside ``gen``) and ``step`` itself get no band.
    Bands are clipped so they do not reach back before the previous step's line; untimed gaps
    (time verl did not attribute to a stage) fall before the first stage. ``mode``: the
    trainer mode raw records are read in.
    """
    bands: list[tuple[float, float, str]] = []
    prev_t: float | None = None
    for item in steps:
        if isinstance(item, VerlStep):
            timings = split_timings(item.metrics, mode)
            times, nested, t = timings.times, timings.nested, item.t
        else:
            times, nested, t = item.stage_times, item.nested, item.t
        step_bands: list[tuple[float, float, str]] = []
        end = t
        order = core_names(times, nested) + [n for n in EXTRA_STAGES if n in times]
        for name in reversed(order):
            duration = times.get(name)
            if duration is None or name in nested or duration <= 0:
                continue
            start = end - duration
            if prev_t is not None and start < prev_t:
                start = prev_t
            if start < end:
                step_bands.append((start, end, name))
            end = start
        bands.extend(reversed(step_bands))
        prev_t = t if prev_t is None else max(prev_t, t)
    return bands
