"""What a rule asks first when the job's flavour changes what its input means.

Some readings hold for one kind of verl job only (``verl_top.verl.flavour``):

- ``mode_guard``: in every async trainer mode ``timing_s/gen`` is the trainer's wait for finished
  samples, not generation time, so the rollout stage rules must not judge it (no vLLM tuning for
  a wait; ``flow.async_balance`` says who waits for whom); where trainer and rollout have separate
  pools the weight sync crosses a link and ``sync.weight_push`` judges it, once.
- ``device_guard``: on Ascend NPUs and on TPUs (torch-xla forks) there is no NVML, GPM or
  ``nvidia-smi``: a rule that reads NVIDIA's counters says it does not apply, a rule that needs
  the GPU samples verl-top takes (NVML, nvidia-smi, DCGM) says they are not read on that device
  instead of asking for them, and on TPUs, whose collectives run through XLA over the chips'
  own links, the NCCL rules say so instead of asking for an NCCL log or probe. The engine asks
  it before every rule (``engine.run_rules``).

Each returns a Check to return instead of judging, or None to go on.
"""

from __future__ import annotations

from verl_top.diagnosis.findings import Check, no_data, passed
from verl_top.diagnosis.view import View

BALANCE = "flow.async_balance"
WEIGHT_SYNC = "sync.weight_push"
# Rules that read NVIDIA-only counters or tools, and what they would need.
GPU_ONLY_RULES: dict[str, str] = {
    "gpu.util_misleading": "NVIDIA's SM and tensor activity counters",
    "gpu.throttle": "NVIDIA's clock-event reasons",
    "map.topology": "NVIDIA's GPU link matrix",
}
# Rules that need verl-top's own device samples, which it takes from NVIDIA GPUs only.
GPU_SAMPLE_RULES: dict[str, str] = {
    "gpu.idle": "device activity",
    "sync.wait": "device activity per node",
    "map.imbalance": "device activity per device",
    "map.unused_gpu": "the processes on each device",
    "map.rollout_replicas": "device activity during gen",
    "cfg.memory_headroom": "the device's memory size",
    "flow.host_stall": "device activity next to the host samples",
}
# Rules about NCCL, which a TPU job does not use.
NCCL_RULES = frozenset({"nccl.transport_socket", "nccl.busbw_low"})
DEVICE_WORDS = {
    "npu": "Ascend NPUs (trainer.device=npu)",
    "tpu": "TPUs (torch-xla: trainer.device=tpu or strategy xla)",
}


def mode_guard(view: View, step: int, rule: str) -> Check | None:
    """A passed check for a synchronous rule whose reading does not hold in this trainer mode
    (the async rules judge it), else None: ``flow.rollout_bound`` and ``flow.long_tail`` in
    every async mode, ``sync.weight_update`` where the weights cross pools."""
    fl = view.flavour()
    if rule in ("flow.rollout_bound", "flow.long_tail") and fl.is_async:
        return passed(
            step,
            rule,
            f"{fl.mode_name}: timing_s/gen is the trainer's wait for finished samples, not "
            f"generation time; who waits for whom is judged by {BALANCE}",
        )
    if rule == "sync.weight_update" and fl.separate_pools:
        return passed(
            step,
            rule,
            f"{fl.mode_name}: the weights cross from the trainer pool to the rollout pool; "
            f"judged by {WEIGHT_SYNC}",
        )
    return None


def device_guard(view: View, step: int, rule: str) -> Check | None:
    """A no-data check saying what an NVIDIA-only rule cannot read on an Ascend NPU or TPU job
    (instead of asking for NVML, GPM, nvidia-smi or NCCL), else None."""
    device = view.flavour().device
    where = DEVICE_WORDS.get(device)
    if where is None:
        return None
    if (need := GPU_ONLY_RULES.get(rule)) is not None:
        return no_data(step, rule, f"not applicable on {where}: it reads {need}")
    if (need := GPU_SAMPLE_RULES.get(rule)) is not None and not view.gpus():
        return no_data(
            step,
            rule,
            f"not read on {where}: it needs {need}, which verl-top samples on NVIDIA GPUs only",
        )
    if device == "tpu" and rule in NCCL_RULES:
        return no_data(
            step,
            rule,
            f"not applicable on {where}: collectives run through XLA over the TPU "
            "interconnect, not NCCL",
        )
    return None
