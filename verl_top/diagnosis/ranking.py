"""Ranking: which finding leads, and whether any does (docs/diagnosis.md, "Ranking").

With verl's step timings known, the lead is the finding with the largest recoverable cost
(``save_s``, what its advised change could save per step):

1. a fault (a watchdog timeout, a stalled job) leads always;
2. then causes whose saving is at least ``material_frac`` of the step, largest first;
3. then causes whose cost is not known (a socket transport, a topology), by severity;
4. then causes worth less than ``material_frac`` of the step;
5. symptoms (GPUs idle, throughput drop) last: one never leads while a cause has a known cost;
6. a setting that slows a stage which has its own finding (enforce_eager under a rollout-bound
   step) is that finding's advice, never its rival; an amortized periodic cost (validation,
   checkpoints) leads only when it is larger than every stage's time; a measured cause that
   accounts for most of a stage's saving (idle rollout replicas, a long tail) leads over the
   stage finding: it says why, the stage only where.

Without step timings (GPU-only monitoring) severity orders, faults first. A finding leads only
at severity >= ``floor`` and, with timings, when it is worth ``material_frac`` of the step or
its cost is unknown. No lead but findings worth that much: "no single bottleneck". Findings are
never changed here: the ranking only orders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_top.diagnosis.findings import (
    FAULT_RULES,
    PERIODIC_RULES,
    SETTING_RULES,
    STAGE_RULES,
    SYMPTOM_RULES,
    Finding,
)
from verl_top.diagnosis.readable import seconds, seconds_pair
from verl_top.diagnosis.thresholds import Thresholds

FAULT, MATERIAL, UNKNOWN_COST, SMALL, SYMPTOM, PART_OF = range(6)
# A measured cause worth this share of its stage finding's saving explains that stage.
CAUSE_SHARE = 0.9


@dataclass(frozen=True)
class Ranked:
    """The findings in lead order, the lead (None: no bottleneck) and the material ones."""

    findings: list[Finding]
    lead: Finding | None
    worth_doing: list[Finding]


def subsumed(f: Finding, findings: Sequence[Finding]) -> bool:
    """A setting whose stage has its own finding: it is that finding's advice."""
    if f.rule not in SETTING_RULES or not f.stage:
        return False
    return any(g.rule in STAGE_RULES and g.stage == f.stage for g in findings)


def explained_by(f: Finding, findings: Sequence[Finding]) -> Finding | None:
    """The measured cause that accounts for most of a stage finding's saving (idle replicas,
    a long tail under a rollout-bound step): it names *why*, so it leads over *where*."""
    if f.rule not in STAGE_RULES or not f.save_s:
        return None
    causes = [
        g
        for g in findings
        if g.stage == f.stage
        and g.save_s is not None
        and g.save_s >= CAUSE_SHARE * f.save_s
        and g.rule not in STAGE_RULES | SETTING_RULES | SYMPTOM_RULES | PERIODIC_RULES
    ]
    return max(causes, key=lambda g: g.save_s or 0.0, default=None)


def _material(f: Finding, th: Thresholds) -> bool:
    return bool(f.save_s is not None and f.step_s and f.save_s >= th.material_frac * f.step_s)


def tier(f: Finding, findings: Sequence[Finding], th: Thresholds, stage_max_s: float) -> int:
    """The tier of a finding when step timings are known (lower leads)."""
    if f.rule in FAULT_RULES:
        return FAULT
    if subsumed(f, findings):
        return PART_OF
    if f.rule in SYMPTOM_RULES:
        return SYMPTOM
    if f.rule in PERIODIC_RULES and (f.save_s or 0.0) <= stage_max_s:
        return PART_OF  # amortized: leads only when larger than every stage
    if f.save_s is None:
        return UNKNOWN_COST
    return MATERIAL if _material(f, th) else SMALL


def rank(
    findings: Sequence[Finding], timed: bool, th: Thresholds, stage_max_s: float = 0.0
) -> Ranked:
    """Order ``findings`` for the lead and pick it (see the module docstring)."""
    if not timed:
        ordered = sorted(
            findings, key=lambda f: (f.rule not in FAULT_RULES, -f.severity, f.step, f.rule)
        )
        lead = ordered[0] if ordered and ordered[0].severity >= th.floor else None
        return Ranked(ordered, lead, [])
    tiers = {id(f): tier(f, findings, th, stage_max_s) for f in findings}
    costed = any(tiers[id(f)] in (MATERIAL, SMALL) for f in findings)

    def key(f: Finding) -> tuple:
        t = tiers[id(f)]
        if t == SYMPTOM and not costed:
            t = UNKNOWN_COST  # no cause has a known cost: symptoms compete by severity
        by_save = t in (MATERIAL, SMALL) or (t == PART_OF and f.save_s is not None)
        cause = explained_by(f, findings)
        save = min(f.save_s or 0.0, cause.save_s or 0.0) if cause else (f.save_s or 0.0)
        return (t, -save if by_save else -f.severity, cause is not None, f.step, f.rule)

    ordered = sorted(findings, key=key)
    lead = next((f for f in ordered if _leads(f, tiers[id(f)], costed, th)), None)
    worth = [f for f in ordered if _material(f, th)]
    return Ranked(ordered, lead, worth if lead is None else [])


def _leads(f: Finding, t: int, costed: bool, th: Thresholds) -> bool:
    if t == FAULT:
        return True
    if f.severity < th.floor:
        return False
    if t in (MATERIAL, UNKNOWN_COST):
        return True
    return t == SYMPTOM and not costed


def improvements_text(worth: Sequence[Finding], step_s: float | None, limit: int = 3) -> str:
    """The headline of "no single bottleneck": what each improvement is worth.

    '1 improvement worth doing, none leading: <title> (up to 75 s of each 380 s step,
    flow.periodic)'."""
    parts = []
    for f in worth[:limit]:
        save, step = seconds_pair(f.save_s, step_s) if step_s else (seconds(f.save_s), "")
        of = f" of each {step} step" if step else " a step"
        parts.append(f"{f.title} (up to {save}{of}, {f.rule})")
    more = f"; {len(worth) - limit} more below" if len(worth) > limit else ""
    s = "s" if len(worth) != 1 else ""
    return f"{len(worth)} improvement{s} worth doing, none leading: " + "; ".join(parts) + more
