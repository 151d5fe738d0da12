"""What the diagnosis produces: findings, per-rule checks and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from verl_top.diagnosis.readable import seconds, seconds_pair

if TYPE_CHECKING:
    from verl_top.diagnosis.phases import Phase
    from verl_top.diagnosis.thresholds import Thresholds
    from verl_top.diagnosis.view import View

STEP_NAMES: dict[int, str] = {
    1: "Throughput & GPU",
    2: "Communication",
    3: "Dataflow",
    4: "Parallelism & mapping",
    5: "Config & scheduling",
}

CheckStatus = Literal["passed", "no_data", "finding"]
# What an evaluation concludes (the status words of verl_top/status.py use the same strings).
Outcome = Literal["bottleneck", "no single bottleneck", "healthy", "no data"]
# Symptoms: they say *that* the job is slow, not why. One never leads over a finding that
# names a cause, and hysteresis never keeps one in front of a cause (docs/diagnosis.md).
SYMPTOM_RULES = frozenset({"gpu.idle", "tput.drop", "gpu.util_misleading", "sync.wait"})
# Faults: the job is broken, not slow. These lead even before the first verl step.
FAULT_RULES = frozenset({"nccl.watchdog", "job.stalled", "job.hang"})
# Where the time goes: one finding per stage role (Finding.stage) that a step spends too long in.
STAGE_RULES = frozenset(
    {
        "flow.rollout_bound",
        "flow.train_bound",
        "flow.logprob_slow",
        "flow.driver_bound",
        "sync.weight_update",
    }
)
# Settings that slow a stage: with that stage's own finding present they are its advice, not
# a rival lead (ranking.py).
SETTING_RULES = frozenset(
    {
        "cfg.micro_batch_small",
        "cfg.token_budget",
        "cfg.enforce_eager",
        "cfg.batched_tokens",
        "cfg.offload",
        "cfg.kv_cache",
    }
)
# Amortized costs: they lead only when larger than every stage's time.
PERIODIC_RULES = frozenset({"flow.periodic"})


@dataclass(frozen=True)
class Finding:
    """A problem a rule found: how bad, the numbers it used and what to change.

    Immutable once made: the ranking orders findings, it never edits them."""

    step: int
    rule: str
    severity: float  # 0-1
    title: str
    evidence: list[str] = field(default_factory=list)  # numbers with units and their window
    advice: str = ""  # names the verl / NCCL setting to change
    data: dict[str, Any] = field(default_factory=dict)  # raw numbers
    # What it is worth (issue 17 item 9): seconds of each step the problem costs, an upper
    # bound on what the advised change could save per step, and how that bound was reached.
    cost_s: float | None = None
    save_s: float | None = None
    step_s: float | None = None  # the step those seconds are part of
    save_basis: str = ""
    # The stage role whose time the cost is part of (rollout, train, logprob, driver, sync, ...;
    # "" when none): a setting is its stage's advice when that stage has its own finding.
    stage: str = ""


def worth_text(f: Finding) -> str:
    """'costs 9.88 min of each 17.8 min step; the advised change saves up to 4.1 min per step
    (basis)': the seconds in one unit, readable (readable.py), never in scientific notation."""
    if f.cost_s is None:
        return ""
    cost, step = seconds_pair(f.cost_s, f.step_s)
    text = f"costs {cost} of each {step} step" if f.step_s else f"costs {cost} per step"
    if f.save_s is not None:
        save = seconds_pair(f.save_s, f.step_s)[0] if f.step_s else seconds(f.save_s)
        text += f"; the advised change saves up to {save} per step"
        if f.save_basis:
            text += f" ({f.save_basis})"
    return text


@dataclass(frozen=True)
class Check:
    """The outcome of one rule: passed, no data (and how to give it), or a finding."""

    step: int
    rule: str
    status: CheckStatus
    detail: str = ""


@dataclass
class Verdict:
    """One evaluation: the lead (bottleneck step and rule; None = none), findings, checks.

    ``history`` is filled by the monitor (the leads shown over time), not by the engine."""

    bottleneck_step: int | None
    bottleneck_rule: str | None
    headline: str
    findings: list[Finding] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    history: list[tuple[float, int | None, str | None]] = field(default_factory=list)
    t: float = 0.0
    # What the verdict rests on: verl logs read (lines, matched, steps, first unreadable line),
    # config keys and their source, GPUs, post-mortem file times. ``no_data``: nothing to judge.
    inputs: dict[str, Any] = field(default_factory=dict)
    no_data: bool = False
    # "8 GPUs at 71 % activity, 1082 tokens/s/GPU, step 4 took 166 s" ("" when nothing measured)
    healthy_detail: str = ""
    outcome: Outcome = "healthy"
    # Which data the verdict covers: "steps 12-16 (median of 5); GPUs: last 120 s", or for a
    # finished run "last phase: steps 28-38 (...)" / "whole run: ...".
    window: str = ""
    # A finished run's phases, oldest first, where its shape changed (phases.py); the verdict
    # judges the last. Empty for a live run (its window is the last steps).
    phases: list[Phase] = field(default_factory=list)

    @property
    def lead(self) -> Finding | None:
        """The finding the verdict leads with (None: no bottleneck)."""
        if self.bottleneck_rule is None:
            return None
        return next((f for f in self.findings if f.rule == self.bottleneck_rule), None)


RuleResult = Finding | Check | list[Finding | Check]
Rule = Callable[["View", "Thresholds"], RuleResult]


def clamp(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    """``x`` limited to [lo, hi]."""
    return max(lo, min(hi, x))


def scale(value: float, start: float, end: float, lo: float, hi: float) -> float:
    """Severity growing linearly from ``lo`` at ``start`` to ``hi`` at ``end`` (clamped)."""
    if end == start:
        return hi
    frac = clamp((value - start) / (end - start))
    return round(lo + (hi - lo) * frac, 3)


def passed(step: int, rule: str, detail: str) -> Check:
    """A rule that looked and found nothing wrong."""
    return Check(step, rule, "passed", detail)


def no_data(step: int, rule: str, detail: str) -> Check:
    """A rule whose input is missing; ``detail`` says what it needs and how to give it."""
    return Check(step, rule, "no_data", detail)
