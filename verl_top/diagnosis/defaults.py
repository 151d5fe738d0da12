"""verl's config defaults: the one table the step-5 rules and pane 5 both read.

Defaults come from verl's generated trainer config (``_generated_ppo_trainer.yaml``, FSDP, and
``_generated_ppo_megatron_trainer.yaml``), as collected in /work/shared/reference/verl.md §3.
``None`` is verl's ``null``. ``governs`` says what a mis-set value costs; ``advice`` is the
standing recommendation from verl's perf tuning guide / best practices (PT / BP in verl.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."


@dataclass(frozen=True)
class VerlDefault:
    """One config key: verl's default, what it governs and the usual recommendation."""

    key: str
    default: Any
    governs: str
    advice: str = ""
    group: str = "batch"  # parallel | batch | rollout | memory | schedule


VERL_DEFAULTS: tuple[VerlDefault, ...] = (
    # -- parallel sizes and placement (verl.md §3.1)
    VerlDefault("trainer.nnodes", 1, "nodes in the global pool", "= nodes you run on", "parallel"),
    VerlDefault(
        "trainer.n_gpus_per_node", 8, "GPUs per node in the pool", "= GPUs per node", "parallel"
    ),
    VerlDefault(
        R + "tensor_model_parallel_size",
        2,
        "rollout TP: replicas = GPUs / TP",
        "smallest TP whose KV cache fits: more replicas, more throughput (PT)",
        "parallel",
    ),
    VerlDefault(R + "data_parallel_size", 1, "rollout DP per replica", "", "parallel"),
    VerlDefault(
        A + "megatron.tensor_model_parallel_size",
        1,
        "Megatron TP of the trainer",
        "raise TP first for memory; keep it inside a node (BP)",
        "parallel",
    ),
    VerlDefault(
        A + "megatron.pipeline_model_parallel_size", 1, "Megatron PP: bubbles", "", "parallel"
    ),
    VerlDefault(
        A + "ulysses_sequence_parallel_size",
        1,
        "Ulysses SP: divides DP size",
        "> 1 only for long context (> 32k)",
        "parallel",
    ),
    VerlDefault(A + "fsdp_config.fsdp_size", -1, "FSDP group size (-1: all ranks)", "", "parallel"),
    # -- batch sizes and token budgets (verl.md §3.2)
    VerlDefault("data.train_batch_size", 1024, "prompts per step", "", "batch"),
    VerlDefault(R + "n", 1, "samples per prompt: multiplies rollout and train work", "", "batch"),
    VerlDefault("data.max_prompt_length", 512, "prompt length cap", "", "batch"),
    VerlDefault(
        "data.max_response_length",
        512,
        "response length cap: long responses dominate gen",
        "",
        "batch",
    ),
    VerlDefault(A + "ppo_mini_batch_size", 256, "prompts per actor update", "", "batch"),
    VerlDefault(
        A + "ppo_micro_batch_size_per_gpu",
        None,
        "train micro batch: ≤ 2 without dynamic bsz = tiny GEMMs",
        "raise up to the normalized mini batch, or use dynamic bsz (PT)",
        "batch",
    ),
    VerlDefault(
        A + "use_dynamic_bsz",
        False,
        "pack micro batches by tokens",
        "True: higher throughput (PT)",
        "batch",
    ),
    VerlDefault(
        A + "ppo_max_token_len_per_gpu",
        16384,
        "token budget per GPU with dynamic bsz",
        "≥ 2 × (max prompt + max response) (PT)",
        "batch",
    ),
    VerlDefault(
        R + "log_prob_micro_batch_size_per_gpu",
        None,
        "old_log_prob micro batch",
        "~2× the train micro batch, or dynamic bsz (PT)",
        "batch",
    ),
    # -- rollout engine
    VerlDefault(
        R + "gpu_memory_utilization",
        0.5,
        "KV-cache memory fraction",
        "0.5-0.7; 0.8-0.9 with offload (PT/BP)",
        "rollout",
    ),
    VerlDefault(
        R + "max_num_batched_tokens",
        8192,
        "prefill batch token cap",
        "≥ max(8192, prompt + response) (BP)",
        "rollout",
    ),
    VerlDefault(
        R + "max_num_seqs",
        256,
        "concurrent decode sequences",
        "raise while the KV cache is under-used",
        "rollout",
    ),
    VerlDefault(
        R + "enforce_eager",
        False,
        "True disables CUDA graphs: slow decode (verl's default: True up to 0.5, False from 0.6; "
        "vLLM/SGLang only, HF rollout has no such switch)",
        "False (True only to work around an OOM)",
        "rollout",
    ),
    VerlDefault(
        R + "over_sample_rate", 0, "abort the slowest requests", "> 0 cuts a long tail", "rollout"
    ),
    # -- memory / offload
    VerlDefault(
        A + "fsdp_config.param_offload",
        False,
        "offload adds H2D/D2H every update",
        "False while memory headroom > 30 %",
        "memory",
    ),
    VerlDefault(
        A + "fsdp_config.optimizer_offload",
        False,
        "offload adds H2D/D2H every update",
        "False while memory headroom > 30 %",
        "memory",
    ),
    VerlDefault(
        A + "megatron.param_offload",
        False,
        "offload adds H2D/D2H every update",
        "False while memory headroom > 30 %",
        "memory",
    ),
    VerlDefault(
        A + "megatron.optimizer_offload",
        False,
        "offload adds H2D/D2H every update",
        "False while memory headroom > 30 %",
        "memory",
    ),
    # -- scheduling
    VerlDefault("trainer.balance_batch", True, "equalize tokens per DP rank", "True", "schedule"),
    VerlDefault(
        "reward_model.launch_reward_fn_async",
        False,
        "overlap CPU reward with log-prob",
        "True when reward is slow (issue #1584)",
        "schedule",
    ),
    VerlDefault("trainer.test_freq", -1, "validation every N steps", "", "schedule"),
    VerlDefault("trainer.save_freq", -1, "checkpoint every N steps", "", "schedule"),
)
DEFAULT_BY_KEY: dict[str, VerlDefault] = {d.key: d for d in VERL_DEFAULTS}
# key -> verl default, for rules that only need the value.
DEFAULTS: dict[str, Any] = {d.key: d.default for d in VERL_DEFAULTS}


def fmt_default(value: Any) -> str:
    """A default as verl's YAML spells it (``null``, ``False``, ``0.5``)."""
    return "null" if value is None else str(value)
