"""What the job is, from its own config: the facts every advice string is built from.

Read once per evaluation (``View.facts``) from the resolved config verl printed (or
``--verl-config``): the rollout engine, its TP and eager mode, offload, micro batch and dynamic
batch size, token budgets, lengths, GPUs, nodes, the device type and the model. A key the config
does not hold is ``None`` ("not known"), never verl's default guessed in silence: advice that
depends on it says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
OFFLOAD_KEYS: tuple[str, ...] = (
    A + "fsdp_config.param_offload",
    A + "fsdp_config.optimizer_offload",
    A + "megatron.param_offload",
    A + "megatron.grad_offload",
    A + "megatron.optimizer_offload",
)
MODEL_KEYS: tuple[str, ...] = ("actor_rollout_ref.model.path", "critic.model.path")
# "Qwen2.5-7B-Instruct" -> 7, "UI-TARS-1.5-7B" -> 7, "Qwen3-VL-2B" -> 2, "Qwen2.5-0.5B" -> 0.5,
# "deepseek-llm-7b-chat" -> 7; a size must stand alone (not "v0.5b1" inside a word).
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z0-9])")
# Mixture-of-experts names: "Qwen3-30B-A3B", "Mixtral-8x7B", "...-MoE".
_MOE = re.compile(r"-A\d+(?:\.\d+)?B\b|mixtral|\bmoe\b|deepseek-v[23]", re.IGNORECASE)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    try:
        v = float(str(value))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return bool(value)
    return None


def _text(value: Any) -> str | None:
    return str(value).strip().lower() if value is not None and str(value).strip() else None


@dataclass(frozen=True)
class JobFacts:
    """The job's own settings that advice depends on (``None``: not in the config read)."""

    has_config: bool = False
    engine: str | None = None  # actor_rollout_ref.rollout.name: vllm | sglang | trtllm | hf
    rollout_tp: int | None = None
    enforce_eager: bool | None = None
    offload: tuple[str, ...] = ()  # offload keys set True
    micro_batch: float | None = None  # ppo_micro_batch_size_per_gpu
    dynamic_bsz: bool | None = None
    token_budget: float | None = None  # ppo_max_token_len_per_gpu
    log_prob_micro_batch: float | None = None
    log_prob_dynamic_bsz: bool | None = None
    max_prompt: float | None = None
    max_response: float | None = None
    max_num_seqs: float | None = None
    max_num_batched_tokens: float | None = None
    gpu_memory_utilization: float | None = None
    over_sample_rate: float | None = None
    rollout_mode: str | None = None  # sync | async (actor_rollout_ref.rollout.mode)
    trainer_mode: str | None = None  # the flavour's: legacy | sync | one_step_off | fully_async ...
    launch_reward_async: bool | None = None
    balance_batch: bool | None = None
    test_freq: float | None = None
    save_freq: float | None = None
    gpus_per_node: int | None = None
    nnodes: int | None = None
    device: str = "gpu"  # gpu | npu | tpu ... (trainer.device, else the hardware seen)
    strategy: str | None = None  # fsdp | fsdp2 | megatron
    model: str | None = None  # the model path as configured
    critic_micro_batch: float | None = None
    critic_dynamic_bsz: bool | None = None

    @property
    def gpus(self) -> int | None:
        """GPUs of the training pool (``n_gpus_per_node x nnodes``)."""
        if not self.gpus_per_node:
            return None
        return self.gpus_per_node * (self.nnodes or 1)

    @property
    def replicas(self) -> int | None:
        """Rollout replicas: GPUs / rollout TP."""
        if not self.gpus or not self.rollout_tp:
            return None
        return max(1, self.gpus // self.rollout_tp)

    @property
    def sample_tokens(self) -> float | None:
        """At most prompt + response tokens of one sample (the configured maxima)."""
        if self.max_prompt is None and self.max_response is None:
            return None
        return (self.max_prompt or 0.0) + (self.max_response or 0.0)

    @property
    def accelerator(self) -> str:
        """How to name the device in advice: ``GPU`` or ``NPU``."""
        return "NPU" if self.device == "npu" else ("TPU" if self.device == "tpu" else "GPU")

    @property
    def graphs(self) -> str:
        """What enforce_eager turns off on this device."""
        return "graph mode" if self.device == "npu" else "CUDA graphs"

    @property
    def model_params_b(self) -> float | None:
        """Model size in billions of parameters, read from the model path's name."""
        return model_size_b(self.model)

    @property
    def moe(self) -> bool:
        """True when the model's name says mixture of experts."""
        return bool(self.model and _MOE.search(self.model))


def model_size_b(name: str | None) -> float | None:
    """Billions of parameters a model name states ("Qwen2.5-7B-Instruct" -> 7.0); the largest
    when several appear ("Qwen3-30B-A3B" -> 30.0); None when the name states none."""
    if not name:
        return None
    base = name.rstrip("/").rsplit("/", 1)[-1]
    sizes = [float(m.group(1)) for m in _SIZE.finditer(base)]
    sizes = [s for s in sizes if 0.01 <= s <= 5000]
    return max(sizes) if sizes else None


def _device(config: Mapping[str, Any], device_names: list[str]) -> str:
    dev = _text(config.get("trainer.device"))
    names = " ".join(device_names).lower()
    if dev == "npu" or "ascend" in names:
        return "npu"
    if dev in ("tpu", "xla") or _text(config.get(A + "strategy")) == "xla":
        return "tpu"
    return "gpu"


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def job_facts(config: Mapping[str, Any], device_names: list[str] | None = None) -> JobFacts:
    """The facts of a job from its flattened config (dotted keys) and the devices seen."""
    num = lambda key: _num(config.get(key))  # noqa: E731
    tp = num(R + "tensor_model_parallel_size")
    per_node, nodes = num("trainer.n_gpus_per_node"), num("trainer.nnodes")
    return JobFacts(
        has_config=bool(config),
        engine=_text(config.get(R + "name")),
        rollout_tp=int(tp) if tp and tp > 0 else None,
        enforce_eager=_flag(config.get(R + "enforce_eager")),
        offload=tuple(k for k in OFFLOAD_KEYS if _flag(config.get(k))),
        micro_batch=num(A + "ppo_micro_batch_size_per_gpu"),
        dynamic_bsz=_flag(config.get(A + "use_dynamic_bsz")),
        token_budget=num(A + "ppo_max_token_len_per_gpu"),
        log_prob_micro_batch=num(R + "log_prob_micro_batch_size_per_gpu"),
        log_prob_dynamic_bsz=_flag(config.get(R + "log_prob_use_dynamic_bsz")),
        max_prompt=num("data.max_prompt_length"),
        max_response=num("data.max_response_length"),
        max_num_seqs=num(R + "max_num_seqs"),
        max_num_batched_tokens=num(R + "max_num_batched_tokens"),
        gpu_memory_utilization=num(R + "gpu_memory_utilization"),
        over_sample_rate=num(R + "over_sample_rate"),
        rollout_mode=_text(config.get(R + "mode")),
        launch_reward_async=_flag(config.get("reward_model.launch_reward_fn_async")),
        balance_batch=_flag(config.get("trainer.balance_batch")),
        test_freq=num("trainer.test_freq"),
        save_freq=num("trainer.save_freq"),
        gpus_per_node=int(per_node) if per_node and per_node > 0 else None,
        nnodes=int(nodes) if nodes and nodes > 0 else None,
        device=_device(config, device_names or []),
        strategy=_text(config.get(A + "strategy")),
        model=str(m) if (m := _first(config, *MODEL_KEYS)) is not None else None,
        critic_micro_batch=num("critic.ppo_micro_batch_size_per_gpu"),
        critic_dynamic_bsz=_flag(config.get("critic.use_dynamic_bsz")),
    )
