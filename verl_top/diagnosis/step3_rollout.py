"""Step 3 — dataflow, from the rollout servers' own metrics (vLLM / SGLang via --prometheus).

verl's timings say *that* generation is slow; the servers say *why*: requests waiting for a
slot (``flow.rollout_queue``), or a KV cache that is full and preempts requests
(``flow.kv_cache_pressure``). The GPUs' DCGM activity (SM, tensor, DRAM) is quoted as evidence:
decode is memory-bound, so high DRAM with low SM/tensor activity is what generation looks like.
"""

from __future__ import annotations

from verl_top.diagnosis.advice import now_text, tp_item
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct, mean
from verl_top.store import RolloutEntry

STEP = 3
NEED_SERVERS = (
    "needs rollout server metrics: --prometheus with vLLM (vllm:*) or SGLang (sglang:*) "
    "series scraped from the rollout servers"
)


def _means(view: View, entry: RolloutEntry, column: str, th: Thresholds) -> float | None:
    since = view.store.window_start(th.window_s)
    return mean(entry.history.recent_values(column, since))


def _servers(view: View, th: Thresholds) -> dict[str, dict[str, float | None]]:
    """Per rollout server: window means of the columns the rules use."""
    cols = ("running", "waiting", "kv_cache_pct", "preemptions_s")
    return {
        name: {c: _means(view, e, c, th) for c in cols} for name, e in view.store.rollout.items()
    }


def _gpu_evidence(view: View) -> list[str]:
    """Mean SM / tensor / DRAM activity of the GPUs (DCGM PROF or GPM), when known."""
    parts = []
    for column, label in (("sm_util", "SM"), ("tensor_util", "tensor"), ("dram_util", "DRAM")):
        values = [m for g in view.gpus() if (m := view.gpu_mean(g, column)) is not None]
        if values:
            parts.append(f"{label} active {mean(values) or 0:.0f} %")
    if not parts:
        return []
    return [f"GPUs ({len(view.gpus())}): " + ", ".join(parts) + f" (means, {view.window_text})"]


def _gen_evidence(view: View) -> list[str]:
    hit = view.median_share("gen")
    return [f"gen {fmt_pct(hit[0])} of the step ({view.steps_text()})"] if hit else []


def flow_rollout_queue(view: View, th: Thresholds) -> RuleResult:
    """Requests wait for a slot on the rollout servers (waiting vs running, window means)."""
    servers = _servers(view, th)
    known = {n: s for n, s in servers.items() if s["waiting"] is not None}
    if not known:
        return no_data(STEP, "flow.rollout_queue", NEED_SERVERS)
    queued = {
        n: s
        for n, s in known.items()
        if (s["waiting"] or 0) >= th.rollout_queue_min
        and (s["waiting"] or 0) >= th.rollout_queue_ratio * max(s["running"] or 0, 1.0)
    }
    waiting = sum(s["waiting"] or 0 for s in known.values())
    running = sum(s["running"] or 0 for s in known.values())
    if not queued:
        return passed(
            STEP,
            "flow.rollout_queue",
            f"{len(known)} servers: {waiting:.1f} waiting vs {running:.1f} running (means)",
        )
    ratio = waiting / max(running, 1.0)
    sev = scale(ratio, th.rollout_queue_ratio, 3.0, 0.4, 0.75) * (
        0.6 + 0.4 * len(queued) / len(known)
    )
    kv = [s["kv_cache_pct"] for s in queued.values() if s["kv_cache_pct"] is not None]
    kv_full = bool(kv) and (mean(kv) or 0) >= th.kv_cache_pct
    worst = max(queued, key=lambda n: queued[n]["waiting"] or 0)
    evidence = [
        f"{len(queued)} of {len(known)} rollout servers queue: {waiting:.1f} requests waiting vs "
        f"{running:.1f} running (sums of means, {view.window_text})",
        f"most queued: {worst} with {queued[worst]['waiting'] or 0:.1f} waiting, "
        f"{queued[worst]['running'] or 0:.1f} running",
    ]
    if kv:
        evidence.append(f"KV cache {mean(kv) or 0:.0f} % in use on the queueing servers")
    evidence += _gen_evidence(view) + _gpu_evidence(view)
    facts = view.facts()
    if kv_full:
        advice = (
            "The KV cache is the limit: raise actor_rollout_ref.rollout.gpu_memory_utilization "
            f"(now {now_text(facts.gpu_memory_utilization)}), or give each replica more memory "
            "(a larger rollout tensor_model_parallel_size)."
        )
    else:
        advice = (
            "Slots, not memory, are the limit: raise actor_rollout_ref.rollout.max_num_seqs "
            f"(now {now_text(facts.max_num_seqs)}) / max_num_batched_tokens"
            + ("; or " + tp_item(facts) if tp_item(facts) else "")
            + "."
        )
    return Finding(
        STEP,
        "flow.rollout_queue",
        round(sev, 3),
        f"Rollout requests queue: {waiting:.0f} waiting vs {running:.0f} running on "
        f"{len(queued)} server{'s' if len(queued) != 1 else ''}",
        evidence,
        advice,
        {"waiting": waiting, "running": running, "servers": len(known), "queued": len(queued)},
        stage="rollout",
    )


def flow_kv_cache_pressure(view: View, th: Thresholds) -> RuleResult:
    """The rollout servers' KV cache is (nearly) full, or requests get preempted."""
    servers = _servers(view, th)
    known = {
        n: s
        for n, s in servers.items()
        if s["kv_cache_pct"] is not None or s["preemptions_s"] is not None
    }
    if not known:
        return no_data(STEP, "flow.kv_cache_pressure", NEED_SERVERS)
    full = {n: s for n, s in known.items() if (s["kv_cache_pct"] or 0) >= th.kv_cache_pct}
    preempt = {
        n: s for n, s in known.items() if (s["preemptions_s"] or 0) * 60 >= th.preempt_per_min
    }
    kv_all = [s["kv_cache_pct"] for s in known.values() if s["kv_cache_pct"] is not None]
    if not full and not preempt:
        return passed(
            STEP,
            "flow.kv_cache_pressure",
            f"KV cache {mean(kv_all) or 0:.0f} % in use (mean of {len(kv_all)} servers), "
            "no preemptions",
        )
    kv = mean([s["kv_cache_pct"] for s in full.values() if s["kv_cache_pct"] is not None])
    rate = sum((s["preemptions_s"] or 0) * 60 for s in preempt.values())
    sev = max(
        scale(kv or 0, th.kv_cache_pct, 100.0, 0.4, 0.6) if full else 0.0,
        scale(rate, th.preempt_per_min, 30.0, 0.5, 0.75) if preempt else 0.0,
    )
    evidence = []
    if full:
        evidence.append(
            f"KV cache {kv or 0:.0f} % in use on {len(full)} of {len(known)} servers "
            f"(>= {th.kv_cache_pct:.0f} %, means over {view.window_text})"
        )
    if preempt:
        evidence.append(f"{rate:.1f} requests preempted per minute on {len(preempt)} servers")
    gmu = view.config("actor_rollout_ref.rollout.gpu_memory_utilization")
    if gmu:
        evidence.append(f"rollout gpu_memory_utilization = {gmu[1]}")
    evidence += _gen_evidence(view) + _gpu_evidence(view)
    title = (
        f"Rollout KV cache under pressure: {rate:.1f} preemptions/min"
        if preempt
        else f"Rollout KV cache {kv or 0:.0f} % full on {len(full)} servers"
    )
    return Finding(
        STEP,
        "flow.kv_cache_pressure",
        round(sev, 3),
        title,
        evidence,
        "Give the KV cache room: raise actor_rollout_ref.rollout.gpu_memory_utilization (free "
        "memory by offloading the trainer), lower rollout.max_num_seqs, or use a larger rollout "
        "tensor_model_parallel_size so each replica holds more KV blocks.",
        {"kv_pct": kv, "preempt_per_min": rate, "servers": len(known)},
        stage="rollout",
    )


RULES: list[Rule] = [flow_rollout_queue, flow_kv_cache_pressure]
