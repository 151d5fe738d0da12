"""Render an assessment as text (five steps in order) or as the stable JSON of
docs/diagnose-json.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl_top.diagnosis.engine import steps_summary
from verl_top.diagnosis.findings import STEP_NAMES, Check, Finding, Verdict, worth_text

if TYPE_CHECKING:  # the assessment wraps the verdict; the diagnosis package imports no surface
    from verl_top.assessment import Assessment

SCHEMA = "verl-top.diagnose/1"


def _finding_text(f: Finding) -> list[str]:
    lines = [f"  [{f.severity:.2f}] {f.title}  ({f.rule})"]
    lines += [f"      - {e}" for e in f.evidence]
    if worth := worth_text(f):
        lines.append(f"      $ {worth}")
    if f.advice:
        lines.append(f"      > {f.advice}")
    return lines


def format_text(assessment: Assessment) -> str:
    """Human report: the status first, then each step's findings and checks."""
    out = [assessment.status.text]
    verdict = assessment.verdict
    if verdict is None:
        return "\n".join(out) + "\n"
    if verdict.bottleneck_step is not None:
        out.append(
            f"Bottleneck: step {verdict.bottleneck_step} {STEP_NAMES[verdict.bottleneck_step]} ({verdict.bottleneck_rule})"
        )
    if assessment.window:
        out.append(f"Covers: {assessment.window}")
    if len(verdict.phases) > 1:
        out.append("Phases of the run (the verdict judges the last):")
        out += [f"  {p.text()}" for p in verdict.phases]
    out += inputs_text(verdict.inputs)
    out += refused_text(assessment.health)
    if assessment.comparison is not None:
        from verl_top.compare import format_text as compare_text

        out += ["", "Against the baseline (--baseline):"]
        out += ["  " + line for line in compare_text(assessment.comparison).splitlines()]
    summary = steps_summary(verdict)
    for step, name in STEP_NAMES.items():
        worst, n = summary[step]
        mark = " <== bottleneck" if step == verdict.bottleneck_step else ""
        out.append("")
        out.append(f"{step}. {name}: {n} finding(s), worst {worst:.2f}{mark}")
        for f in verdict.findings:
            if f.step == step:
                out += _finding_text(f)
        checks = [c for c in verdict.checks if c.step == step and c.status != "finding"]
        ok = [c for c in checks if c.status == "passed"]
        nd = [c for c in checks if c.status == "no_data"]
        if ok:
            out.append("  passed: " + "; ".join(f"{c.rule} ({c.detail})" for c in ok))
        for c in nd:
            out.append(f"  no data: {c.rule}: {c.detail}")
    return "\n".join(out) + "\n"


def inputs_text(inputs: dict[str, Any]) -> list[str]:
    """What the verdict rests on, one line each: logs read, config keys, post-mortem times."""
    if not inputs:
        return []
    out = []
    for log in inputs.get("logs", []):
        line = (
            f"Read {log.get('path')}: {log.get('lines', 0)} lines, {log.get('matched', 0)} "
            f"matched, {log.get('steps', 0)} steps, {log.get('config_keys', 0)} config keys"
        )
        if log.get("malformed"):
            line += f", {log.get('malformed')} unreadable metric lines"
        out.append(line)
    verl = inputs.get("verl") or {}
    if verl.get("trainer_mode") or verl.get("version_range") not in (None, "unknown"):
        out.append("verl: " + flavour_text(verl))
    cfg = inputs.get("config", {})
    out.append(
        f"Config: {cfg.get('keys', 0)} keys"
        + (f" (from {cfg['source']})" if cfg.get("source") else " (none read)")
    )
    for path, info in inputs.get("post_mortem", {}).items():
        out.append(
            f"Post-mortem: {path} last written {info.get('written')} "
            f"({info.get('age_text')} ago), last step {inputs.get('last_step')}"
        )
    return out


def refused_text(health: dict[str, Any]) -> list[str]:
    """One line naming what the input boundary refused, per source and reason (none: none)."""
    dropped = health.get("dropped") or {}
    parts = [
        f"{reason} x{n}" + (f" from {host}" if host else "")
        for host, reasons in sorted(dropped.items())
        for reason, n in sorted(reasons.items())
    ]
    if not parts:
        return []
    more = f" (+{len(parts) - 8} more)" if len(parts) > 8 else ""
    return [f"Refused input (skipped, counted): {', '.join(parts[:8])}{more}"]


def flavour_text(verl: dict[str, Any]) -> str:
    """The ``verl`` object of the inputs in words, with the first clues it rests on."""
    from verl_top.verl.flavour import describe

    clues = verl.get("evidence") or []
    return describe(verl) + (f" (from: {'; '.join(clues[:3])})" if clues else "")


def _worth_json(f: Finding) -> dict[str, Any] | None:
    if f.cost_s is None:
        return None
    return {
        "cost_s_per_step": _plain(f.cost_s),
        "save_s_per_step_max": _plain(f.save_s),
        "step_s": _plain(f.step_s),
        "basis": f.save_basis,
        "text": worth_text(f),
    }


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "step": f.step,
        "rule": f.rule,
        "severity": round(f.severity, 3),
        "title": f.title,
        "evidence": list(f.evidence),
        "advice": f.advice,
        "data": _plain(f.data),
        "worth": _worth_json(f),
    }


def _check_json(c: Check) -> dict[str, Any]:
    return {"step": c.step, "rule": c.rule, "status": c.status, "detail": c.detail}


def _plain(value: Any) -> Any:
    """JSON-safe copy (NaN/inf become null, tuples lists, other objects strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return None if value != value or value in (float("inf"), float("-inf")) else round(value, 6)
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def to_json(assessment: Assessment) -> dict[str, Any]:
    """The assessment as the stable ``verl-top.diagnose/1`` document."""
    verdict = assessment.verdict or Verdict(None, None, assessment.status.text, no_data=True)
    summary = steps_summary(verdict)
    steps = []
    for step, name in STEP_NAMES.items():
        steps.append(
            {
                "step": step,
                "name": name,
                "worst_severity": round(summary[step][0], 3),
                "findings": [_finding_json(f) for f in verdict.findings if f.step == step],
                "checks": [_check_json(c) for c in verdict.checks if c.step == step],
            }
        )
    return {
        "schema": SCHEMA,
        "bottleneck": {
            "step": verdict.bottleneck_step,
            "rule": verdict.bottleneck_rule,
            "headline": assessment.status.text,
        },
        "status": assessment.status.as_dict(),
        "window": assessment.window,
        # A finished run's phases, oldest first; the verdict judges the last (docs/diagnosis.md).
        "phases": [_plain(p.as_dict()) for p in verdict.phases],
        "steps": steps,
        "findings": [_finding_json(f) for f in verdict.findings],
        "history": [
            {"t": c.t, "step": c.step, "rule": c.rule, "title": c.title} for c in assessment.history
        ],
        "time": verdict.t,
        "no_data": verdict.no_data,
        # verl version range, trainer mode, engine, backend, device, pools (verl/flavour.py).
        "verl": _plain(verdict.inputs.get("verl")),
        # What the verdict rests on (logs read) plus refused input per host and clock offsets.
        "inputs": _plain({**verdict.inputs, **assessment.health}),
        "comparison": _comparison_json(assessment),
    }


def _comparison_json(assessment: Assessment) -> dict[str, Any] | None:
    """``--baseline``: the verl-top.compare/1 document of this run against it (else null)."""
    if assessment.comparison is None:
        return None
    from verl_top.compare import to_json as compare_json

    return _plain(compare_json(assessment.comparison))
