"""job.crashed: the exception the job died of, and where (step 1: the job is broken, not slow).

The verl log's parser hands over every traceback the driver printed as a ``crash`` event
(verl_top/verl/crash.py): the exception line, the failed Ray task and verl frame, and how many
step lines of that log came before it. The job died of the last one when no step followed it;
earlier, different ones are usually its cause (a worker that failed to import leaves the
driver waiting for a register-center actor that never comes) and are shown with it.

With no timed step the crash leads while the status stays "no data" (the engine), so a
post-mortem of a run that never finished a step says why. After timed steps it is listed but
does not lead: the steps say where the time went (ranking.py).
"""

from __future__ import annotations

from verl_top.diagnosis.advice import now_text
from verl_top.diagnosis.findings import (
    CRASH_RULE,
    Finding,
    Rule,
    RuleResult,
    no_data,
    passed,
)
from verl_top.diagnosis.job import JobFacts
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import LogEvent
from verl_top.verl.crash import CRASH_KIND

STEP = 1
MAX_EARLIER = 2  # earlier, different exceptions shown as the likely cause
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."


def _steps_read(view: View, event: LogEvent) -> int:
    """Step lines the parser read from the crash's log so far."""
    stats = view.store.log_stats.get(f"{event.host}:{event.path}") or {}
    steps = stats.get("steps")
    return int(steps) if isinstance(steps, int) else event.after_steps


def _earlier(events: list[LogEvent], last: LogEvent) -> list[LogEvent]:
    """Up to MAX_EARLIER exceptions before the last, each text once, oldest first."""
    seen = {last.text}
    out = []
    for ev in events[:-1]:
        if ev.text not in seen and ev.path == last.path:
            seen.add(ev.text)
            out.append(ev)
    return out[:MAX_EARLIER]


def _memory_advice(where: str, facts: JobFacts) -> str:
    """What to lower, by the stage the allocation failed in, with the job's own values."""
    dev = facts.accelerator
    if any(k in where for k in ("update_actor", "update_policy", "update_critic")):
        batch = (
            f"a smaller {A}ppo_max_token_len_per_gpu (use_dynamic_bsz is on)"
            if facts.dynamic_bsz
            else f"a smaller {A}ppo_micro_batch_size_per_gpu (now "
            f"{now_text(facts.micro_batch)}) or use_dynamic_bsz with a token budget"
        )
        tail = (
            " (offload is already on: "
            + ", ".join(k.rsplit(".", 1)[-1] for k in facts.offload)
            + ")."
            if facts.offload
            else ", or param/optimizer offload."
        )
        return (
            f"The update ran out of {dev} memory: {batch}, or "
            f"actor_rollout_ref.model.enable_gradient_checkpointing=True{tail}"
        )
    if any(k in where for k in ("log_prob", "_forward_micro_batch")):
        return (
            f"A log-prob forward ran out of {dev} memory: a smaller "
            f"{R}log_prob_micro_batch_size_per_gpu (now {now_text(facts.log_prob_micro_batch)}) "
            "or log_prob_use_dynamic_bsz with a token budget."
        )
    if "generate" in where:
        return (
            f"Generation ran out of {dev} memory: a lower {R}gpu_memory_utilization (now "
            f"{now_text(facts.gpu_memory_utilization)}) or max_num_batched_tokens (now "
            f"{now_text(facts.max_num_batched_tokens)}), or a larger rollout "
            f"tensor_model_parallel_size (now {now_text(facts.rollout_tp)})."
        )
    return (
        f"Out of {dev} memory: smaller micro batches or token budgets for the stage that "
        "failed, gradient checkpointing, or offload."
    )


def crash_advice(event: LogEvent, earlier: list[LogEvent], facts: JobFacts) -> str:
    """What to do about the exception, from its kind and the job's own settings."""
    text, where = event.text, event.where
    low = text.lower()
    if "hbm" in low or "resource_exhausted" in low:
        return (
            "The XLA program needs more TPU HBM than a chip has: a smaller "
            f"{A}ppo_micro_batch_size_per_gpu (now {now_text(facts.micro_batch)}) or "
            f"data.max_response_length (now {now_text(facts.max_response)}), or shard the "
            "model over more chips."
        )
    if "out of memory" in low or "outofmemoryerror" in low:
        return _memory_advice(where, facts)
    if "register_center" in text:
        cause = f" (here: {earlier[0].text})" if earlier else ""
        return (
            "A worker group never came up (its register-center actor is missing): fix the "
            f"workers' own start-up error, printed before this one{cause}."
        )
    return f"Fix the error raised {where or 'in the driver'}; no verl step followed it."


def job_crashed(view: View, th: Thresholds) -> RuleResult:
    """The driver's log ends in a traceback no verl step followed."""
    events = [e for e in view.store.events if e.kind == CRASH_KIND]
    if not events:
        if view.logs_given() or view.store.steps:  # a recording carries the log's crash events
            return passed(STEP, CRASH_RULE, "no traceback of the driver ends the verl log")
        return no_data(STEP, CRASH_RULE, "needs the job's driver log: --verl-log")
    last = events[-1]
    later = _steps_read(view, last) - last.after_steps
    if later > 0:
        return passed(
            STEP,
            CRASH_RULE,
            f"the driver printed {last.text[:120]}, and {later} verl step line(s) followed: "
            "the job went on",
        )
    earlier = _earlier(events, last)
    before = (
        f"after {last.after_steps} verl step line(s)"
        if last.after_steps
        else "before any verl step line"
    )
    evidence = [f"raised {last.where}" if last.where else "raised in the driver"]
    evidence.append(f"{last.path}: the driver's last traceback, {before}")
    evidence += [f"earlier: {e.text}" + (f" ({e.where})" if e.where else "") for e in earlier]
    return Finding(
        STEP,
        CRASH_RULE,
        1.0,
        f"The job crashed: {last.text}",
        evidence,
        crash_advice(last, earlier, view.facts()),
        {"exception": last.text, "where": last.where, "after_steps": last.after_steps},
    )


RULES: list[Rule] = [job_crashed]
