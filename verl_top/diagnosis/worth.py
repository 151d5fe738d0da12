"""One cost model for every rule: what a problem costs per step and what its fix can win.

Every finding states ``cost_s`` (seconds of each step the problem costs), ``save_s`` (what the
advised change could save per step, bounded by what is physically achievable) and
``save_basis`` (the bound, in words). The ranking (ranking.py) compares findings by ``save_s``.

- A **stage** (rollout, update, log-prob, ...) costs its median seconds per step; what can be
  won is the part its efficiency leaves: ``1 - MFU / achievable MFU`` for an update,
  ``1 - GPU activity / 87 %`` for a rollout (efficiency.py). With no efficiency measured (no
  MFU logged, no GPU samples) ``unknown_save_frac`` of the stage counts, and the basis says so.
- A **setting** (enforce_eager, offload, micro batch, token budget) costs the share of the
  stage it slows that the change can win; with no stage time known it has no cost, and says so.
- A **measured waste** (a long tail, idle replicas, periodic validation) costs what it wastes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from verl_top.diagnosis.efficiency import (
    DECODE_ACTIVITY_PCT,
    DECODE_SOURCE,
    achievable_mfu,
    gpu_class,
)
from verl_top.diagnosis.readable import mfu as mfu_text
from verl_top.diagnosis.readable import number, pct
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, first, median

NO_STAGE_TIME = "no step timings: what it costs is not known"


class WorthFields(TypedDict):
    """The Finding keyword arguments a Worth fills."""

    cost_s: float | None
    save_s: float | None
    step_s: float | None
    save_basis: str


@dataclass(frozen=True)
class Worth:
    """What a finding is worth per step; unpack into ``Finding(**worth.fields())``."""

    cost_s: float | None = None
    save_s: float | None = None
    step_s: float | None = None
    basis: str = ""

    def fields(self) -> WorthFields:
        """The Finding keyword arguments."""
        return {
            "cost_s": self.cost_s,
            "save_s": self.save_s,
            "step_s": self.step_s,
            "save_basis": self.basis,
        }


def _clamp01(x: float) -> float:
    return max(0.0, min(1.0, x))


def stage_worth(view: View, names: list[str] | tuple[str, ...], frac: float, basis: str) -> Worth:
    """A stage's median seconds, of which ``frac`` is recoverable (``basis`` says why)."""
    cost = view.median_seconds(*names) if names else None
    if cost is None:
        return Worth(basis=NO_STAGE_TIME)
    return Worth(cost, cost * _clamp01(frac), view.median_step_s(), basis)


def unmeasured(th: Thresholds, what: str, why: str = "") -> tuple[float, str]:
    """The share counted when a stage's efficiency is not measured, and the words for it."""
    frac = th.unknown_save_frac
    because = f", {why}" if why else ""
    return frac, f"{what} not measured{because}: {pct(frac)} of it counted as recoverable"


def _role_mfu(view: View, role: str) -> float | None:
    """Median MFU of ``actor`` or ``critic`` over the recent steps (0 / > 1: not estimated)."""
    keys = (f"perf/mfu/{role}", f"mfu/{role}")
    hits = [h[1] for s in view.recent_steps() if (h := first(s.metrics, *keys)) and 0 < h[1] <= 1]
    return median(hits)


def train_worth(view: View, th: Thresholds) -> tuple[Worth, dict[str, float | None]]:
    """update_actor + update_critic: each at its own MFU against the achievable one.

    Returns the worth and the MFU per role (None: not estimated)."""
    bound = achievable_mfu(view.facts(), view.device_names())
    parts: list[tuple[float, float]] = []
    mfus: dict[str, float | None] = {}
    words: list[str] = []
    for role, stage in (("actor", "update_actor"), ("critic", "update_critic")):
        secs = view.median_seconds(stage)
        if not secs:
            continue
        mfu = mfus[role] = _role_mfu(view, role)
        if mfu is None:
            frac, _ = unmeasured(th, "efficiency")
            words.append(f"{stage} MFU not estimated")
        else:
            frac = _clamp01(1 - mfu / bound.value)
            words.append(f"{stage} at MFU {mfu_text(mfu)}")
        parts.append((secs, frac))
    if not parts:
        return Worth(basis=NO_STAGE_TIME), mfus
    cost = sum(s for s, _ in parts)
    save = sum(s * f for s, f in parts)
    if all(m is None for m in mfus.values()):
        basis = unmeasured(th, "update efficiency", "no MFU logged")[1]
    else:
        basis = f"{', '.join(words)}; {bound.basis}"
        if any(m is None for m in mfus.values()):
            basis += f"; a stage without MFU counts {pct(th.unknown_save_frac)}"
    return Worth(cost, save, view.median_step_s(), basis), mfus


def rollout_worth(
    view: View, names: list[str], activity_pct: float | None, th: Thresholds
) -> Worth:
    """The rollout: the part its GPUs sat below what decoding keeps them busy."""
    if activity_pct is None:
        frac, basis = unmeasured(th, "rollout efficiency", "no GPU samples during it")
    else:
        frac = 1 - activity_pct / DECODE_ACTIVITY_PCT
        basis = f"GPU busy {activity_pct:.0f} % of the rollout; {DECODE_SOURCE}"
    return stage_worth(view, names, frac, basis)


def setting_worth(view: View, names: list[str] | tuple[str, ...], frac: float, basis: str) -> Worth:
    """A setting that slows ``names``: ``frac`` of their time is what changing it can win,
    the whole of it being the setting's cost. No stage time: no cost, and it says so."""
    secs = view.median_seconds(*names) if names else None
    if secs is None:
        return Worth(basis=NO_STAGE_TIME)
    save = secs * _clamp01(frac)
    return Worth(save, save, view.median_step_s(), basis)


def actor_update_worth(view: View, th: Thresholds) -> Worth:
    """A setting that makes update_actor inefficient (tiny micro batches, a small token
    budget): what the update's MFU leaves below the achievable one."""
    bound = achievable_mfu(view.facts(), view.device_names())
    mfu = _role_mfu(view, "actor")
    if mfu is None:
        frac, basis = unmeasured(th, "update efficiency", "no MFU logged")
    else:
        frac = 1 - mfu / bound.value
        basis = f"update_actor at MFU {mfu_text(mfu)}; {bound.basis}"
    return setting_worth(view, ["update_actor"], frac, basis)


# Bytes per parameter an offloaded update moves each way: FP32 master weights (param offload),
# Adam's two FP32 moments (optimizer offload).
OFFLOAD_BYTES = {"param_offload": 4.0, "optimizer_offload": 8.0, "grad_offload": 4.0}
# Host <-> device copy rate: PCIe Gen4 x16 moves ~25 GB/s of 32; Gen5 (Hopper, Blackwell) ~50.
PCIE_GBS = {"hopper": 50.0, "blackwell": 50.0}
PCIE_DEFAULT_GBS = 25.0


def offload_worth(view: View, th: Thresholds) -> Worth:
    """Offload on: each update copies the offloaded state to the device and back; that copy
    time (model size x bytes / PCIe rate, per GPU of the FSDP group) is what turning it off
    wins, at most the update itself."""
    facts = view.facts()
    size = facts.model_params_b
    per_param = sum(
        b for k, b in OFFLOAD_BYTES.items() if any(o.endswith(k) for o in facts.offload)
    )
    update = view.median_seconds("update_actor")
    if update is None:
        return Worth(basis=NO_STAGE_TIME)
    if size is None or not per_param:
        frac, basis = unmeasured(th, "copy volume", "model size not in the config")
        return setting_worth(view, ["update_actor"], frac, basis)
    gbs = PCIE_GBS.get(gpu_class(view.device_names()) or "", PCIE_DEFAULT_GBS)
    copy_s = 2 * size * 1e9 * per_param / (facts.gpus or 1) / (gbs * 1e9)
    basis = (
        f"{number(size)}B params x {number(per_param)} bytes to the device and back per update, "
        f"over {facts.gpus or 1} GPU(s) at ~{number(gbs)} GB/s PCIe"
    )
    save = min(update, copy_s)
    return Worth(save, save, view.median_step_s(), basis)
