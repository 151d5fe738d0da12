"""What a rule asks first when the job's flavour changes what its input means.

Some readings hold for one kind of verl job only (``verl_top.verl.flavour``):

- ``mode_guard``: in every async trainer mode ``timing_s/gen`` is the trainer's wait for finished
  samples, not generation time, so the rollout stage rules must not judge it (no vLLM tuning for
  a wait; ``flow.async_balance`` says who waits for whom); where trainer and rollout have separate
  pools the weight sync crosses a link and ``sync.weight_push`` judges it, once.
- ``device_guard``: on Ascend NPUs there is no NVML, GPM or ``nvidia-smi``: a rule that needs
  them says it does not apply instead of asking for them.

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
    """A no-data check saying an NVIDIA-only rule does not apply to an Ascend NPU job (instead
    of asking for NVML, GPM or nvidia-smi), else None."""
    need = GPU_ONLY_RULES.get(rule)
    if need is None or not view.on_npu():
        return None
    return no_data(
        step,
        rule,
        f"not applicable on Ascend NPUs (trainer.device=npu): it reads {need}",
    )
