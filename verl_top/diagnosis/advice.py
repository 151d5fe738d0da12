"""Advice built from the job's own config and evidence, never against it.

Each builder takes the job's facts (job.py) and the numbers its rule measured, and names only
what the job can still change: no "smaller rollout TP" at TP = 1, "set enforce_eager=False"
only when it is True, no vLLM knobs for the HF rollout, no CUDA wording on an NPU, no "set
use_dynamic_bsz=True" when it already is. A setting the config does not state is named as
"not set" with verl's behaviour, not guessed. tests/test_advice_table.py holds every rule's
advice against a grid of configs.
"""

from __future__ import annotations

from verl_top.diagnosis.job import A, JobFacts, R
from verl_top.diagnosis.readable import number, pct

VLLM_LIKE = ("vllm", "sglang")
ROLLOUT_ENGINES = ("vllm", "sglang", "trtllm")


def _join(items: list[str]) -> str:
    """Sentences from advice items: 'a; b; c.'."""
    items = [i.rstrip(".") for i in items if i]
    return "; ".join(items) + "." if items else ""


def _sentence(items: list[str]) -> str:
    """Advice items as one sentence that starts with a capital: 'Raise x; set y.'."""
    text = _join(items)
    return text[:1].upper() + text[1:]


def now_text(value: float | None) -> str:
    """A config value as advice quotes it: the number, or ``not set``."""
    return "not set" if value is None else number(value)


def token_budget_target(facts: JobFacts, factor: float = 2.0) -> float | None:
    """verl's perf guide: ppo_max_token_len_per_gpu >= 2 x (max prompt + max response)."""
    sample = facts.sample_tokens
    return factor * sample if sample else None


def eager_item(facts: JobFacts) -> str:
    """'set enforce_eager=False (CUDA graphs; your config has True)' when it is True."""
    if facts.engine not in VLLM_LIKE and facts.engine is not None:
        return ""
    if facts.enforce_eager is not True:
        return ""
    return (
        f"set {R}enforce_eager=False ({facts.graphs}; your config has True; if it was set "
        f"for memory, lower gpu_memory_utilization, now {now_text(facts.gpu_memory_utilization)}, "
        "instead)"
    )


def tp_item(facts: JobFacts) -> str:
    """A smaller rollout TP for more replicas, only when TP > 1."""
    tp = facts.rollout_tp
    if tp is None or tp <= 1:
        return ""
    replicas = facts.replicas
    more = f"{replicas * 2} replicas instead of {replicas}" if replicas else "twice the replicas"
    return (
        f"lower {R}tensor_model_parallel_size from {tp} to {tp // 2} ({more}) if the model and "
        "its KV cache still fit"
    )


def rollout_advice(facts: JobFacts, activity_pct: float | None, launch_bound: bool) -> str:
    """How to speed up generation with this job's engine and settings."""
    engine = facts.engine
    if engine == "hf":
        return (
            f"Switch {R}name to vllm or sglang; the HF rollout runs transformers generate: one "
            f"Python-launched step per token, no {facts.graphs}, no continuous batching"
            + (", so a small batch leaves the GPU waiting on one CPU core" if launch_bound else "")
            + ". While on hf, more samples per step (data.train_batch_size x rollout.n) give "
            "each launch more work."
        )
    items = [eager_item(facts), tp_item(facts)]
    if engine in VLLM_LIKE or engine is None:
        busy = activity_pct is not None and activity_pct >= 70
        if not busy:
            items.append(
                f"raise {R}max_num_seqs (now {now_text(facts.max_num_seqs)}) and "
                f"max_num_batched_tokens (now {now_text(facts.max_num_batched_tokens)}) for "
                "more concurrent sequences"
            )
        gmu = facts.gpu_memory_utilization
        if gmu is None or gmu < 0.8:
            items.append(
                f"raise {R}gpu_memory_utilization (now {now_text(gmu)}; 0.5-0.7, 0.8-0.9 with "
                "trainer offload) for a larger KV cache"
            )
    if engine == "trtllm":
        items.append("raise the TensorRT-LLM servers' batch and KV-cache limits")
    if not any(items):
        items.append(
            "the engine's own knobs are already set for throughput: fewer samples per step "
            f"({R}n) or a lower data.max_response_length are what is left"
        )
    return _sentence(items)


def train_items(facts: JobFacts, critic: bool = False) -> list[str]:
    """What makes this job's update efficient, from its batch and offload settings."""
    items: list[str] = []
    target = token_budget_target(facts)
    need = f" (>= {number(target)}: 2x max prompt + response)" if target else ""
    if critic:
        if facts.critic_dynamic_bsz is not True:
            items.append(
                "set critic.use_dynamic_bsz=True with critic.ppo_max_token_len_per_gpu" + need
            )
        else:
            items.append("raise critic.ppo_max_token_len_per_gpu" + need)
    if facts.dynamic_bsz is True:
        budget = facts.token_budget
        if budget is not None and target is not None and budget < target:
            items.append(
                f"raise {A}ppo_max_token_len_per_gpu from {number(budget)} to {number(target)}"
            )
        else:
            items.append(
                f"raise {A}ppo_max_token_len_per_gpu (now {now_text(budget)}) while memory allows"
            )
    else:
        micro = facts.micro_batch
        items.append(
            f"set {A}use_dynamic_bsz=True with {A}ppo_max_token_len_per_gpu{need}"
            + (f", or raise ppo_micro_batch_size_per_gpu (now {number(micro)})" if micro else "")
        )
    if facts.offload:
        items.append(
            "turn " + ", ".join(f"{k}=False" for k in facts.offload) + " if memory allows "
            "(each update copies them between host and device)"
        )
    return items


def train_advice(facts: JobFacts, critic_heavy: bool = False) -> str:
    """How to make this job's update efficient."""
    return _sentence(train_items(facts, critic=critic_heavy))


def micro_batch_advice(facts: JobFacts) -> str:
    """cfg.micro_batch_small: dynamic batch size with a token budget, or a larger micro batch."""
    return _sentence(train_items(facts)[:1])


def token_budget_advice(facts: JobFacts, need: float) -> str:
    """cfg.token_budget: raise the budget to what the lengths need."""
    return (
        f"Raise {A}ppo_max_token_len_per_gpu to at least {number(need)} (verl perf tuning guide)."
    )


def offload_advice(facts: JobFacts) -> str:
    """cfg.offload: turn the offload keys that are on off."""
    return "Set " + ", ".join(f"{k}=False" for k in facts.offload) + "."


def eager_advice(facts: JobFacts) -> str:
    """cfg.enforce_eager: set it False; for memory, lower gpu_memory_utilization instead."""
    return (
        f"Set {R}enforce_eager=False ({facts.graphs}); if it was set for memory, lower "
        f"{R}gpu_memory_utilization (now {now_text(facts.gpu_memory_utilization)}) instead."
    )


def logprob_advice(facts: JobFacts) -> str:
    """flow.logprob_slow: larger forward-only micro batches or dynamic batch size."""
    items = []
    if facts.log_prob_dynamic_bsz is True:
        items.append(
            f"raise {R}log_prob_max_token_len_per_gpu (forward-only: ~2x the train budget)"
        )
    else:
        micro = facts.log_prob_micro_batch
        items.append(
            f"raise {R}log_prob_micro_batch_size_per_gpu (now {now_text(micro)}) and "
            "ref.log_prob_micro_batch_size_per_gpu (forward-only: ~2x the train micro batch), or "
            f"set {R}log_prob_use_dynamic_bsz=True"
        )
    if facts.offload:
        items.append("turn param offload off if memory allows (it slows these passes too)")
    return _sentence(items)


def long_tail_advice(
    facts: JobFacts, clip: float | None, clip_limit: float, capped: bool = False
) -> str:
    """flow.long_tail: cut the tail with this job's rollout mode and lengths."""
    items = []
    if not facts.over_sample_rate:
        items.append(
            f"set {R}over_sample_rate (now {now_text(facts.over_sample_rate)}) to drop the "
            "slowest samples"
        )
    else:
        items.append(f"raise {R}over_sample_rate (now {number(facts.over_sample_rate)})")
    if facts.rollout_mode == "async" or (facts.trainer_mode or "").endswith("async"):
        items.append("partial rollout or an off-policy trainer (one-step-off, fully async)")
    else:
        items.append(
            "async rollout (rollout.mode=async), then one-step-off or fully async training"
        )
    hit = capped or (clip is not None and clip > clip_limit)
    if hit and facts.max_response:
        share = f"{pct(clip)} of responses hit" if clip else "the longest responses hit"
        items.append(
            f"{share} data.max_response_length ({number(facts.max_response)}): a lower cap "
            "cuts the tail if the task allows"
        )
    return _sentence(items)


def clip_advice(facts: JobFacts) -> str:
    """A clip ratio alone: a length setting, not a measured tail."""
    cap = f" ({number(facts.max_response)})" if facts.max_response else ""
    return (
        f"If the answers need more room, raise data.max_response_length{cap} (costs generation "
        "time); if clipping is fine for the task, nothing to do."
    )


def periodic_advice(facts: JobFacts, stages: list[str]) -> str:
    """flow.periodic: run validation / checkpoints less often."""
    items = []
    if "testing" in stages:
        items.append(f"raise trainer.test_freq (now {now_text(facts.test_freq)})")
    if "save_checkpoint" in stages:
        items.append(
            f"raise trainer.save_freq (now {now_text(facts.save_freq)}) or use faster checkpoint storage"
        )
    return _sentence(items)


def driver_advice(facts: JobFacts, stage: str) -> str:
    """flow.driver_bound: overlap the driver's reward / advantage work."""
    if stage == "reward" and facts.launch_reward_async is not True:
        return (
            "Overlap the reward with GPU work: set reward_model.launch_reward_fn_async=True "
            "(or the reward loop)."
        )
    if stage == "reward":
        return "launch_reward_fn_async is on: move the reward to the reward loop / more reward workers."
    return (
        "The advantage runs on the driver: keep it light (vectorised, no per-token Python loops)."
    )


def seqlen_advice(facts: JobFacts) -> str:
    """map.seqlen_imbalance: balance tokens per DP rank."""
    items = []
    if facts.balance_batch is False:
        items.append(
            "set trainer.balance_batch=True (reorders samples so DP ranks get equal tokens)"
        )
    if facts.dynamic_bsz is not True:
        items.append(f"set {A}use_dynamic_bsz=True so micro batches follow token counts")
    if not items:
        items.append("lower data.max_response_length: balance_batch and dynamic bsz are on")
    return _sentence(items)


def replicas_advice(facts: JobFacts) -> str:
    """map.rollout_replicas: spread requests over the replicas."""
    items = [
        "spread requests over the replicas: check rollout.agent.num_workers and the rollout "
        "server load balance"
    ]
    if facts.rollout_tp and facts.rollout_tp > 1:
        items.append(tp_item(facts))
    return _sentence(items)


def util_misleading_advice(facts: JobFacts) -> str:
    """gpu.util_misleading: small or memory-bound kernels in training."""
    items = [
        f"{facts.accelerator} util only means 'a kernel ran'; low tensor util in training is small kernels"
    ]
    items += train_items(facts)[:1]
    items.append("check for a collective spinning (step 2)")
    return _sentence(items)


def batched_tokens_advice(facts: JobFacts, need: float) -> str:
    """cfg.batched_tokens: a larger prefill batch."""
    return f"Raise {R}max_num_batched_tokens to {number(need)} or more."


def kv_low_advice(facts: JobFacts) -> str:
    """cfg.kv_cache with preemptions: more KV cache."""
    return (
        f"Raise {R}gpu_memory_utilization (now {now_text(facts.gpu_memory_utilization)}) or lower "
        "rollout.n / max_num_seqs so the KV cache holds the batch."
    )


def kv_high_advice(facts: JobFacts) -> str:
    """cfg.kv_cache at OOM risk: less KV cache or offload."""
    offload = "" if facts.offload else " or enable actor offload"
    return (
        f"Lower {R}gpu_memory_utilization (now {now_text(facts.gpu_memory_utilization)}){offload}."
    )


def memory_headroom_advice(facts: JobFacts) -> str:
    """cfg.memory_headroom: make room before the rollout wakes up."""
    items = []
    if facts.engine != "hf":
        items.append(
            f"lower {R}gpu_memory_utilization (now {now_text(facts.gpu_memory_utilization)})"
        )
    items.append(f"shrink {A}ppo_max_token_len_per_gpu / the micro batch")
    items.append("enable entropy_checkpointing" + ("" if facts.offload else " or offload"))
    return _sentence(items)


def tput_drop_advice(facts: JobFacts) -> str:
    """tput.drop: where to look for what changed."""
    causes = ["growing response length", "a straggler node (step 4)"]
    if facts.engine != "hf":
        causes.insert(
            1, f"preemption (gpu_memory_utilization, now {now_text(facts.gpu_memory_utilization)})"
        )
    return (
        "Compare the stage shares (step 3) of the slow steps with earlier ones; "
        + ", ".join(causes[:-1])
        + f" or {causes[-1]} are common causes."
    )


def visible_devices(facts: JobFacts) -> str:
    """The environment variable that picks the devices a process sees."""
    return "ASCEND_RT_VISIBLE_DEVICES" if facts.device == "npu" else "CUDA_VISIBLE_DEVICES"


def unused_gpu_advice(facts: JobFacts) -> str:
    """map.unused_gpu: the pool size and the devices the processes see."""
    return (
        f"Check trainer.n_gpus_per_node / trainer.nnodes (now {now_text(facts.gpus_per_node)} x "
        f"{now_text(facts.nnodes)}) and {visible_devices(facts)} / Ray --num-gpus on the node."
    )
