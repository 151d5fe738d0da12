"""The engine: runs every rule over a read-only view and ranks the findings (ranking.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl_top.diagnosis import (
    crash,
    hang,
    step1_throughput,
    step2_comm,
    step3_async,
    step3_dataflow,
    step3_long_tail,
    step3_rollout,
    step4_mapping,
    step5_config,
)
from verl_top.diagnosis.findings import (
    CRASH_RULE,
    STEP_NAMES,
    Check,
    Finding,
    Outcome,
    Rule,
    Verdict,
    worth_text,
)
from verl_top.diagnosis.guards import device_guard
from verl_top.diagnosis.ranking import improvements_text, rank
from verl_top.diagnosis.readable import seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import StepMemo, View, mean, median
from verl_top.store import Store

STEP_RULES: dict[int, list[Rule]] = {
    # job.hang: docs/hangs.md; job.crashed: the exception the driver died of
    1: step1_throughput.RULES + [hang.job_hang] + crash.RULES,
    2: step2_comm.RULES,
    # step3_rollout: the rollout servers' metrics (--prometheus); step3_async: async trainers
    3: step3_dataflow.RULES + step3_long_tail.RULES + step3_rollout.RULES + step3_async.RULES,
    4: step4_mapping.RULES,
    5: step5_config.RULES,
}


def run_rules(
    view: View, th: Thresholds, between: Callable[[], object] | None = None
) -> tuple[list[Finding], list[Check]]:
    """Every rule of every step; a finding also yields a Check with status 'finding'.

    ``between`` is called before each rule: where an evaluation in a worker thread gives way
    to the frames the event loop draws (monitor.FrameGate)."""
    findings: list[Finding] = []
    checks: list[Check] = []
    for step, rules in STEP_RULES.items():
        for rule in rules:
            if between is not None:
                between()
            name = rule.__name__.replace("_", ".", 1)
            try:
                # A rule the job's device cannot feed says so instead of judging (guards.py).
                result = device_guard(view, step, name) or rule(view, th)
            except Exception as exc:  # a broken rule must never take the monitor down
                checks.append(
                    Check(step, name, "no_data", f"rule failed: {type(exc).__name__}: {exc}")
                )
                continue
            for item in result if isinstance(result, list) else [result]:
                if isinstance(item, Finding):
                    findings.append(item)
                    checks.append(Check(item.step, item.rule, "finding", item.title))
                else:
                    checks.append(item)
    return findings, checks


def steps_summary(verdict: Verdict) -> dict[int, tuple[float, int]]:
    """Per step: (worst severity, number of findings), for the tab marks."""
    out = {step: (0.0, 0) for step in STEP_NAMES}
    for f in verdict.findings:
        worst, n = out[f.step]
        out[f.step] = (max(worst, f.severity), n + 1)
    return out


class Engine:
    """Runs every rule over a read-only view of the store and ranks the findings.

    Stateless: the same store gives the same verdict. Which lead every surface shows over time
    (hysteresis on data time) is the monitor's business (verl_top/monitor.py)."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self._steps = StepMemo()  # a cache of a pure reading: the verdict does not depend on it

    def evaluate(self, store: Store, between: Callable[[], object] | None = None) -> Verdict:
        """Run all rules over ``store`` (never mutated) and return the verdict at ``store.now``.

        ``between`` is called before each rule (see ``run_rules``); it cannot change the verdict.
        """
        th = self.thresholds
        view = View(store, th, self._steps)
        findings, checks = run_rules(view, th, between)
        timed = any(s.stage_times for s in view.steps())
        inputs = describe_inputs(view)
        nothing = not inputs["gpus"] and not timed
        ranked = rank(findings, timed, th, max(view.role_seconds().values(), default=0.0))
        lead = ranked.lead
        crashed = next((f for f in ranked.findings if f.rule == CRASH_RULE), None)
        if nothing and inputs["logs"]:
            # A verl log was given but no timed step came out of it (and no GPU was seen):
            # nothing measured to judge, whatever the printed config says; a crash says why.
            lead = crashed
        died = lead is not None and nothing and lead is crashed  # before any timed step
        if died:
            outcome: Outcome = "no data"
        elif lead is not None:
            outcome = "bottleneck"
        elif ranked.worth_doing and not nothing:
            outcome = "no single bottleneck"
        else:
            outcome = "no data" if nothing else "healthy"
        headline = (
            improvements_text(ranked.worth_doing, view.median_step_s())
            if outcome == "no single bottleneck"
            else self._headline(view, lead, inputs, nothing, died)
        )
        return Verdict(
            bottleneck_step=lead.step if lead else None,
            bottleneck_rule=lead.rule if lead else None,
            headline=headline,
            findings=ranked.findings,
            checks=checks,
            t=store.now,
            inputs=inputs,
            no_data=nothing and (lead is None or died),
            healthy_detail=healthy_detail(view),
            outcome=outcome,
            window=window_text(view, inputs),
            phases=view.phases(),
        )

    def _headline(
        self,
        view: View,
        lead: Finding | None,
        inputs: dict,
        nothing: bool = False,
        died: bool = False,
    ) -> str:
        unread = unread_logs_text(inputs)
        if lead is None and nothing and (inputs["logs"] or inputs["steps"]):
            return "No data to judge: " + untimed_text(inputs, unread)
        if lead is not None and died:  # the crash a run died of before any timed step
            where = lead.data.get("where") or "in the driver"
            return f"No data to judge: {lead.title[0].lower()}{lead.title[1:]} ({where}); " + (
                untimed_text(inputs, unread)
            )
        if lead is not None:
            worth = worth_text(lead)
            return (
                f"Step {lead.step} ({STEP_NAMES[lead.step]}) is the bottleneck: {lead.title}"
                + (f" — {worth}" if worth else "")
                + (f". {unread}" if unread else "")
            )
        if not inputs["gpus"] and not inputs["steps"] and not inputs["config"]["keys"]:
            if unread:
                return f"No data to judge: {unread}"
            if inputs["hosts"]:
                return (
                    f"No data to judge: {inputs['hosts']} host(s) seen, but no GPU sample and "
                    "no verl step yet"
                )
            return "No data to judge: nothing was read yet"
        detail = healthy_detail(view)
        if not detail:
            return "No verdict: too little data to judge" + (f". {unread}" if unread else "")
        return "Job looks healthy: " + detail + (f". {unread}" if unread else "")


def window_text(view: View, inputs: dict[str, Any]) -> str:
    """Which data the verdict covers, for people: steps (and, for a finished run, which
    phase) and the GPU window."""
    parts = []
    if view.recent_steps():
        phases = view.phases()
        if len(phases) > 1:
            others = ", ".join(p.span for p in phases[:-1])
            parts.append(
                f"last phase: {view.steps_text()}; the run changed shape (earlier: {others})"
            )
        elif phases:
            parts.append(f"whole run: {view.steps_text()}")
        else:
            parts.append(view.steps_text())
    if inputs["gpus"]:
        parts.append(f"GPUs: {view.window_text}")
    return "; ".join(parts)


def healthy_detail(view: View) -> str:
    """What a healthy job does, in numbers: '8 GPUs at 71 % activity, 1082 tokens/s/GPU, ...'."""
    parts = []
    acts = [m for g in view.gpus() if (m := view.gpu_mean(g, "activity")) is not None]
    if acts:
        parts.append(f"{len(acts)} GPUs at {mean(acts) or 0:.0f} % activity")
    # The steps the verdict judges (their median), not the last one: a last step twice the
    # usual (a fork's anchor pass) must not read as the job's pace.
    rec = view.recent_steps()
    tput = median(s.throughput for s in rec if s.throughput is not None)
    if tput is not None:
        parts.append(f"{tput:.0f} tokens/s/GPU")
    step_s = view.median_step_s()
    if rec and step_s:
        if len(rec) == 1:
            parts.append(f"step {rec[0].step} took {seconds(step_s)}")
        else:
            parts.append(f"{seconds(step_s)} a step")
    if len(rec) > 1 and (tput is not None or step_s):
        parts[-1] += f" (median of steps {rec[0].step}-{rec[-1].step})"
    return ", ".join(parts)


def describe_inputs(view: View) -> dict[str, Any]:
    """What the verdict rests on, for the banner, ``diagnose`` and ``--json``."""
    store = view.store
    logs = [dict(v) for v in store.log_stats.values()]
    steps = view.steps()
    post = store.post_mortem
    return {
        "logs": logs,
        "config": {"keys": len(store.config), "source": store.config_source or None},
        "steps": len(steps),
        "last_step": steps[-1].step if steps else None,
        "gpus": len(view.gpus()),
        "hosts": len(store.hosts),
        "post_mortem": {path: dict(info) for path, info in post.items()},
        "verl": view.flavour().as_dict(),
    }


def untimed_text(inputs: dict[str, Any], unread: str) -> str:
    """Why logs that were read give nothing to judge: no step, or steps without stage times."""
    if unread:
        return unread
    parts = []
    for log in inputs.get("logs", []):
        parts.append(
            f"{log.get('path')}: {log.get('lines', 0)} lines read, {log.get('steps', 0)} verl "
            f"steps, {log.get('config_keys', 0)} config keys, no step with stage timings "
            "(timing_s/*)"
        )
    if not parts:
        parts.append(f"{inputs.get('steps', 0)} verl steps without stage timings (timing_s/*)")
    return "; ".join(parts) + "; config findings, if any, are listed below"


def unread_logs_text(inputs: dict[str, Any]) -> str:
    """One sentence per verl log that gave neither a step nor a config: what was read."""
    out = []
    for log in inputs.get("logs", []):
        if log.get("steps") or log.get("config_keys"):
            continue
        text = (
            f"{log.get('path')}: {log.get('lines', 0)} lines read, {log.get('matched', 0)} "
            "matched, no verl step or config"
        )
        first = log.get("first_malformed") or log.get("first_unmatched")
        if first:
            text += f"; first unreadable line: {first!r}"
        out.append(text)
    return "; ".join(out)
