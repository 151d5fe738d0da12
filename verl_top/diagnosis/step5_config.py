"""Step 5 — hyper-parameters and scheduling: is a setting wasting the hardware?

Every rule shows the value found (or verl's default when the key is absent), the default from
verl's generated trainer config (reference verl.md §3) and the recommendation.
"""

from __future__ import annotations

from typing import Any

from verl_top.diagnosis import advice
from verl_top.diagnosis.defaults import DEFAULTS  # shared with pane 5 (verl.md §3)
from verl_top.diagnosis.efficiency import graph_share
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.readable import mfu as mfu_text
from verl_top.diagnosis.readable import number
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, fmt_pct
from verl_top.diagnosis.worth import (
    NO_STAGE_TIME,
    Worth,
    actor_update_worth,
    offload_worth,
    setting_worth,
)

STEP = 5
NEED_CONFIG = (
    "needs the job's resolved config: --verl-log (verl prints it at start) or --verl-config FILE"
)
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
RESERVED_KEYS = ("perf/max_memory_reserved_gb", "actor/perf/max_memory_reserved_gb")


def _get(view: View, key: str, *aliases: str) -> tuple[str, Any, bool]:
    """(key, value, is_default): the config value or verl's default."""
    hit = view.config(key, *aliases)
    if hit is not None:
        return hit[0], hit[1], False
    return key, DEFAULTS.get(key), True


def _show(key: str, value: Any, default: bool) -> str:
    return f"{key} = {value}" + (
        " (not set: verl default)" if default else f" (verl default {DEFAULTS.get(key)})"
    )


def _reserved_frac(view: View) -> tuple[float, float, float] | None:
    """(reserved GiB, device GiB, fraction) from perf/max_memory_reserved_gb and the hello."""
    hit = view.median_metric(*RESERVED_KEYS)
    dev = view.device_mem_gib()
    if hit is None or not dev:
        return None
    return hit[1], dev, hit[1] / dev


def _tokens_per_sample(view: View) -> tuple[float, str] | None:
    """Tokens of one sample: logged mean prompt + response length, else the configured maxima."""
    p = view.median_metric("prompt_length/mean")
    r = view.median_metric("response_length/mean")
    if r is not None:
        return (p[1] if p else 0.0) + r[1], (
            "mean prompt + response length logged" if p else "mean response length logged"
        )
    _, pm, _ = _get(view, "data.max_prompt_length")
    _, rm, _ = _get(view, "data.max_response_length")
    pn, rn = view.num(pm), view.num(rm)
    if pn is None and rn is None:
        return None
    return (pn or 0.0) + (rn or 0.0), "at most: data.max_prompt_length + max_response_length"


def cfg_micro_batch_small(view: View, th: Thresholds) -> RuleResult:
    """Too few tokens per training micro batch (count x tokens per sample) without dynamic bsz.

    The count alone says little: one sample of 6k tokens is a full GEMM, eight of 100 are not.
    """
    if not view.has_config():
        return no_data(STEP, "cfg.micro_batch_small", NEED_CONFIG)
    dk, dyn, dyn_def = _get(view, A + "use_dynamic_bsz")
    if view.flag(dyn):
        return passed(
            STEP,
            "cfg.micro_batch_small",
            "use_dynamic_bsz=True: micro batches follow the token budget",
        )
    key, value, is_def = _get(view, A + "ppo_micro_batch_size_per_gpu")
    per_gpu = view.num(value)
    note = ""
    if per_gpu is None and (old := view.config(A + "ppo_micro_batch_size")):
        n = (view.num((view.config("trainer.n_gpus_per_node") or ("", 8))[1]) or 8) * (
            view.num((view.config("trainer.nnodes") or ("", 1))[1]) or 1
        )
        if (total := view.num(old[1])) is not None:
            per_gpu, key, is_def = max(1.0, total / n), old[0], False
            note = f" (old global key: {int(total)} over {int(n)} GPUs)"
    if per_gpu is None:
        return no_data(
            STEP, "cfg.micro_batch_small", f"{A}ppo_micro_batch_size_per_gpu not in the config"
        )
    sample = _tokens_per_sample(view)
    if sample is None:
        return no_data(
            STEP,
            "cfg.micro_batch_small",
            f"{key} = {number(per_gpu)}: needs the sample length (response_length/mean or "
            "data.max_response_length) to know the tokens per micro batch",
        )
    tokens = per_gpu * sample[0]
    if tokens >= th.micro_batch_tokens_min:
        return passed(
            STEP,
            "cfg.micro_batch_small",
            f"{key} = {number(per_gpu)} x ~{sample[0]:.0f} tokens = {tokens:.0f} tokens per micro batch",
        )
    train = view.median_share("update_actor", "update_critic")
    if train is None:
        sev = 0.45  # what the update costs is unknown (no verl steps)
    elif train[0] < th.cost_frac_min:
        sev = 0.2  # the update is a small share of the step: little to win
    else:
        sev = 0.55 if train[0] > th.train_frac else 0.45
    return Finding(
        STEP,
        "cfg.micro_batch_small",
        sev,
        f"Micro batch of {number(per_gpu)} x ~{sample[0]:.0f} tokens = {tokens:.0f} tokens per GPU "
        "without dynamic batch size: small GEMMs"
        + (f", MFU {mfu_text(mfu[1])}" if (mfu := view.median_mfu()) else ""),
        [
            _show(key, value, is_def) + note,
            f"tokens per sample ~{sample[0]:.0f} ({sample[1]})",
            _show(dk, dyn, dyn_def),
            f"recommendation: >= {number(th.micro_batch_tokens_min)} tokens per micro batch "
            "(use_dynamic_bsz=True with ppo_max_token_len_per_gpu)",
        ]
        + (
            [f"update stages {fmt_pct(train[0])} of step, {view.steps_text()}"]
            if train
            else ["update share unknown (no verl steps)"]
        ),
        advice.micro_batch_advice(view.facts()),
        {"per_gpu": per_gpu, "tokens_per_micro_batch": tokens},
        **actor_update_worth(view, th).fields(),
        stage="train",
    )


def cfg_token_budget(view: View, th: Thresholds) -> RuleResult:
    """ppo_max_token_len_per_gpu below token_budget_factor x (max prompt + max response)."""
    if not view.has_config():
        return no_data(STEP, "cfg.token_budget", NEED_CONFIG)
    _, dyn, _ = _get(view, A + "use_dynamic_bsz")
    if not view.flag(dyn):
        return passed(STEP, "cfg.token_budget", "use_dynamic_bsz off: token budget unused")
    key, budget, bdef = _get(view, A + "ppo_max_token_len_per_gpu")
    pk, p, pdef = _get(view, "data.max_prompt_length")
    rk, r, rdef = _get(view, "data.max_response_length")
    b, pn, rn = view.num(budget), view.num(p), view.num(r)
    if b is None or pn is None or rn is None:
        return no_data(
            STEP, "cfg.token_budget", "token budget or max lengths not numbers in the config"
        )
    need = th.token_budget_factor * (pn + rn)
    if b >= need:
        return passed(STEP, "cfg.token_budget", f"{key} = {number(b)} >= {number(need)}")
    return Finding(
        STEP,
        "cfg.token_budget",
        scale(b / need, 1.0, 0.25, 0.4, 0.6),
        f"Token budget {number(b)}/GPU is below {number(th.token_budget_factor)}x (prompt + response) = {number(need)}",
        [
            _show(key, budget, bdef),
            _show(pk, p, pdef),
            _show(rk, r, rdef),
            f"recommendation: >= {number(need)}",
        ],
        advice.token_budget_advice(view.facts(), need),
        {"budget": b, "need": need},
        **actor_update_worth(view, th).fields(),
        stage="train",
    )


# verl's own default for rollout.enforce_eager changed with the release: True up to v0.5.0,
# False from v0.6.0 (verl/trainer/config/rollout/rollout.yaml at tags v0.5.0 and v0.6.0).
# v0.6 also added rollout.cudagraph_capture_sizes, so the printed config tells them apart.
EAGER_V06_KEY = R + "cudagraph_capture_sizes"
EAGER_ENGINES = ("vllm", "sglang")


def _engine_without(view: View, setting: str) -> str | None:
    """Why a vLLM/SGLang setting does not apply: the rollout engine in use has no such knob
    (HF generate has no KV-cache pool, batched-token cap or CUDA graphs). None when it applies
    or the engine is unknown."""
    engine = view.rollout_engine()
    if engine is None or engine in EAGER_ENGINES:
        return None
    return f"rollout engine {engine}: it has no {setting} (the key is ignored)"


def _eager_default(view: View) -> str:
    """verl's default for enforce_eager in the release that printed this config."""
    if view.config(EAGER_V06_KEY) is not None or EAGER_V06_KEY in view.store.config:
        return "verl >= 0.6 default False"
    return "verl <= 0.5 default True (False from 0.6)"


def cfg_enforce_eager(view: View, th: Thresholds) -> RuleResult:
    """vLLM/SGLang rollout with enforce_eager: true (CUDA graphs off, slow decode)."""
    if not view.has_config():
        return no_data(STEP, "cfg.enforce_eager", NEED_CONFIG)
    key, value, is_def = _get(view, R + "enforce_eager")
    engine = view.rollout_engine()
    if engine is not None and engine not in EAGER_ENGINES:
        return passed(
            STEP,
            "cfg.enforce_eager",
            f"rollout engine {engine}: it has no enforce_eager switch (the key is ignored)",
        )
    default = _eager_default(view)
    shown = f"{key} = {value}" + (" (not set: " if is_def else " (") + default + ")"
    if not view.flag(value):
        return passed(STEP, "cfg.enforce_eager", shown)
    gen = view.median_role_share("rollout")
    sev = 0.6 if gen and gen[0] > 0.5 else 0.5
    if gen is not None and gen[0] < th.cost_frac_min:
        sev = 0.2  # eager decode costs at most the rollout, here a small share
    facts = view.facts()
    graphs = graph_share(facts)
    return Finding(
        STEP,
        "cfg.enforce_eager",
        sev,
        f"{engine or 'Rollout'} runs eagerly ({facts.graphs} off): decode is CPU-launch bound",
        [shown, "recommendation: false (use true only to work around an OOM)"]
        + ([f"rollout engine: {engine}"] if engine else ["rollout engine not in the config"])
        + ([f"rollout {fmt_pct(gen[0])} of step, {view.steps_text()}"] if gen else []),
        advice.eager_advice(facts),
        {"value": value, "engine": engine, "default": default},
        **setting_worth(view, gen[2] if gen else [], graphs.value, graphs.basis).fields(),
        stage="rollout",
    )


def cfg_offload(view: View, th: Thresholds) -> RuleResult:
    """Actor param/optimizer offload on while memory headroom exceeds offload_headroom."""
    if not view.has_config():
        return no_data(STEP, "cfg.offload", NEED_CONFIG)
    keys = [
        A + "fsdp_config.param_offload",
        A + "fsdp_config.optimizer_offload",
        A + "megatron.param_offload",
        A + "megatron.optimizer_offload",
    ]
    on = [k for k in keys if (hit := view.config(k)) and view.flag(hit[1])]
    if not on:
        return passed(STEP, "cfg.offload", "actor param/optimizer offload off")
    mem = _reserved_frac(view)
    ev = [f"{k} = True (verl default False)" for k in on]
    if mem is None:
        return Finding(
            STEP,
            "cfg.offload",
            0.25,
            "Actor offload is on; memory headroom unknown",
            ev + ["perf/max_memory_reserved_gb or device memory not known yet"],
            "If memory allows, turn offload off: each update pays host<->device copies.",
            {"on": on},
            save_basis="memory headroom unknown: whether offload can be turned off is not known",
            stage="train",
        )
    reserved, dev, frac = mem
    headroom = 1 - frac
    if headroom <= th.offload_headroom:
        return passed(STEP, "cfg.offload", f"offload on, headroom {fmt_pct(headroom)}: needed")
    return Finding(
        STEP,
        "cfg.offload",
        scale(headroom, th.offload_headroom, 0.7, 0.4, 0.6),
        f"Offload on with {fmt_pct(headroom)} of GPU memory free: update_actor pays needless copies",
        ev
        + [
            f"perf/max_memory_reserved_gb {reserved:.0f} GiB of {dev:.0f} GiB ({fmt_pct(frac)}), {view.steps_text()}",
            f"recommendation: offload off while headroom > {fmt_pct(th.offload_headroom)}",
        ],
        advice.offload_advice(view.facts()),
        {"on": on, "headroom": headroom},
        **offload_worth(view, th).fields(),
        stage="train",
    )


def cfg_kv_cache(view: View, th: Thresholds) -> RuleResult:
    """gpu_memory_utilization low with preemptions, or high with OOM risk."""
    if not view.has_config():
        return no_data(STEP, "cfg.kv_cache", NEED_CONFIG)
    if (skip := _engine_without(view, "gpu_memory_utilization")) is not None:
        return passed(STEP, "cfg.kv_cache", skip)
    key, value, is_def = _get(view, R + "gpu_memory_utilization")
    util = view.num(value)
    if util is None:
        return no_data(STEP, "cfg.kv_cache", f"{key} not a number")
    pre = view.median_metric(
        "timing_s/agent_loop/num_preempted/mean", "timing_s/agent_loop/num_preempted/max"
    )
    mem = _reserved_frac(view)
    ooms = [e for e in view.store.events if "out of memory" in e.text.lower()]
    if util < th.kv_low:
        if pre is None:
            return no_data(
                STEP,
                "cfg.kv_cache",
                f"{key} = {number(util)} is low; needs timing_s/agent_loop/num_preempted to judge",
            )
        if pre[1] <= 0:
            return passed(STEP, "cfg.kv_cache", f"{key} = {number(util)}, no preemptions")
        return Finding(
            STEP,
            "cfg.kv_cache",
            0.55,
            f"Small KV cache ({key.split('.')[-1]} {number(util)}) and requests get preempted",
            [
                _show(key, value, is_def),
                f"{pre[0]} = {pre[1]:.2f} (median), {view.steps_text()}",
                "recommendation: 0.5-0.7 (0.8-0.9 with offload)",
            ],
            advice.kv_low_advice(view.facts()),
            {"value": util, "preempted": pre[1]},
            stage="rollout",
        )
    if util > th.kv_high:
        risk = [f"{len(ooms)} out-of-memory line(s)"] if ooms else []
        if mem is not None and mem[2] > 0.9:
            risk.append(f"perf/max_memory_reserved_gb {mem[0]:.0f} of {mem[1]:.0f} GiB")
        if not risk:
            return passed(STEP, "cfg.kv_cache", f"{key} = {number(util)}, no sign of OOM risk")
        return Finding(
            STEP,
            "cfg.kv_cache",
            0.55,
            f"{key.split('.')[-1]} {number(util)} leaves no room for the trainer: OOM risk at wake-up",
            [_show(key, value, is_def), *risk, "recommendation: <= 0.9"],
            advice.kv_high_advice(view.facts()),
            {"value": util},
        )
    return passed(STEP, "cfg.kv_cache", _show(key, value, is_def))


def cfg_batched_tokens(view: View, th: Thresholds) -> RuleResult:
    """max_num_batched_tokens below max(batched_tokens_min, prompt + response)."""
    if not view.has_config():
        return no_data(STEP, "cfg.batched_tokens", NEED_CONFIG)
    if (skip := _engine_without(view, "max_num_batched_tokens")) is not None:
        return passed(STEP, "cfg.batched_tokens", skip)
    key, value, is_def = _get(view, R + "max_num_batched_tokens")
    _, p, _ = _get(view, "data.max_prompt_length")
    _, r, _ = _get(view, "data.max_response_length")
    v, pn, rn = view.num(value), view.num(p) or 0, view.num(r) or 0
    if v is None:
        return no_data(STEP, "cfg.batched_tokens", f"{key} not a number")
    need = max(th.batched_tokens_min, pn + rn)
    if v >= need:
        return passed(STEP, "cfg.batched_tokens", f"{key} = {number(v)} >= {number(need)}")
    return Finding(
        STEP,
        "cfg.batched_tokens",
        scale(v / need, 1.0, 0.25, 0.35, 0.55),
        f"max_num_batched_tokens {number(v)} < {number(need)}: small prefill batches slow rollout",
        [
            _show(key, value, is_def),
            f"recommendation: >= max({number(th.batched_tokens_min)}, prompt + response) = {number(need)}",
        ],
        advice.batched_tokens_advice(view.facts(), need),
        {"value": v, "need": need},
        **_prefill_worth(view, pn, rn).fields(),
        stage="rollout",
    )


def _prefill_worth(view: View, prompt: float, response: float) -> Worth:
    """Small prefill batches slow the prefill only: at most the prompts' share of the tokens
    (the logged mean lengths, else the configured maxima)."""
    gen = view.median_role_share("rollout")
    p, r = view.median_metric("prompt_length/mean"), view.median_metric("response_length/mean")
    if p is not None and r is not None:
        prompt, response, what = p[1], r[1], "mean lengths logged"
    else:
        what = "configured maxima"
    if not gen or not prompt + response:
        return Worth(basis=NO_STAGE_TIME)
    frac = prompt / (prompt + response)
    basis = f"prefill: the prompts' share of a sample's tokens, {fmt_pct(frac)} ({what})"
    return setting_worth(view, gen[2], frac, basis)


def cfg_memory_headroom(view: View, th: Thresholds) -> RuleResult:
    """perf/max_memory_reserved_gb above mem_reserved_frac of device memory."""
    mem = _reserved_frac(view)
    if mem is None:
        return no_data(
            STEP,
            "cfg.memory_headroom",
            "needs perf/max_memory_reserved_gb (--verl-log) and GPU memory size (agent hello)",
        )
    reserved, dev, frac = mem
    if frac <= th.mem_reserved_frac:
        return passed(
            STEP,
            "cfg.memory_headroom",
            f"reserved {reserved:.0f} of {dev:.0f} GiB ({fmt_pct(frac)})",
        )
    key, value, is_def = _get(view, R + "gpu_memory_utilization")
    return Finding(
        STEP,
        "cfg.memory_headroom",
        scale(frac, th.mem_reserved_frac, 1.0, 0.6, 0.8),
        f"Trainer peak reserves {fmt_pct(frac)} of GPU memory: OOM risk at rollout wake-up",
        [
            f"perf/max_memory_reserved_gb {reserved:.1f} GiB of {dev:.1f} GiB device, {view.steps_text()}",
            _show(key, value, is_def) if view.has_config() else "config not known",
        ],
        advice.memory_headroom_advice(view.facts()),
        {"reserved_gb": reserved, "device_gb": dev, "frac": frac},
    )


RULES: list[Rule] = [
    cfg_micro_batch_small,
    cfg_token_budget,
    cfg_enforce_eager,
    cfg_offload,
    cfg_kv_cache,
    cfg_batched_tokens,
    cfg_memory_headroom,
]
