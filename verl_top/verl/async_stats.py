"""Who waits for whom in one step of an async verl trainer, read from the step's own keys.

In every async mode ``timing_s/gen`` is the trainer's wait for finished samples; the trainer's
busy time is the rest of the step; the weight sync has a mode-specific key
(``timing_s/update_weights``, ``timing_s/sync_rollout_weights`` which contains it, the doubled
``timing_s/timing_s/param_sync``); one-step-off times the generation itself outside the step
(``timing_s/generate_async``); the fully-async trainer also prints verl's own idle ratios
(``fully_async/trainer/idle_ratio``, ``fully_async/rollouter/idle_ratio``). Which keys feed which
field is the key catalogue's ``reads`` (verl_top/data/verl_keys.yaml).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from verl_top.verl.keys import catalogue

PREFIX = "AsyncStats."
# Weight-sync keys, outermost first: a container's time already holds what it contains.
SYNC_KEYS = (
    "timing_s/sync_rollout_weights",
    "timing_s/timing_s/param_sync",
    "timing_s/param_sync",
    "timing_s/update_weights",
)


def _value(metrics: Mapping[str, float], key: str) -> float | None:
    v = metrics.get(key)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


@dataclass(frozen=True)
class AsyncStats:
    """The numbers of one step (fully async: one weight version) that say who waited."""

    step_s: float | None = None  # timing_s/step
    wait_s: float | None = None  # timing_s/gen read as the trainer's wait
    sync_s: float | None = None  # the weight sync, by the mode's key
    sync_key: str = ""
    generate_s: float | None = None  # one-step-off: the background generation
    hybrid_wait_s: float | None = None  # fully async dynamic scheduling
    trainer_idle_verl: float | None = None  # verl's own fully_async/trainer/idle_ratio
    rollouter_idle_verl: float | None = None
    rollouter_active_s: float | None = None
    rollouter_version_s: float | None = None
    rollouter_samples: float | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> AsyncStats:
        """Read one step's metrics (keys the catalogue routes to these fields)."""
        values: dict[str, float | None] = {}
        names = {f.name for f in fields(cls)}
        for key, info in catalogue().keys.items():
            target = (
                (info.reads or "")[len(PREFIX) :] if (info.reads or "").startswith(PREFIX) else ""
            )
            if target in names and values.get(target) is None:
                values[target] = _value(metrics, key)
        sync_key = next((k for k in SYNC_KEYS if _value(metrics, k) is not None), "")
        return cls(
            step_s=_value(metrics, "timing_s/step") or _value(metrics, "perf/time_per_step"),
            wait_s=_value(metrics, "timing_s/gen") or _value(metrics, "timing_s/wait_prev_gen"),
            sync_s=_value(metrics, sync_key) if sync_key else None,
            sync_key=sync_key,
            generate_s=_value(metrics, "timing_s/generate_async"),
            hybrid_wait_s=_value(metrics, "timing_s/wait_for_enough_samples"),
            **{k: v for k, v in values.items() if k not in ("step_s", "wait_s")},
        )

    @property
    def trainer_idle(self) -> float | None:
        """Share of the step the trainer waited for samples, computed from the timers."""
        if self.wait_s is None or not self.step_s:
            return None
        return self.wait_s / self.step_s

    @property
    def train_s(self) -> float | None:
        """The trainer's own time in the step: the step less its wait and the weight sync."""
        if self.step_s is None or self.wait_s is None:
            return None
        return max(
            0.0, self.step_s - self.wait_s - (self.sync_s or 0.0) - (self.hybrid_wait_s or 0.0)
        )

    @property
    def rollouter_idle(self) -> float | None:
        """The rollouter's idle share from its times (verl's own ratio when those are absent)."""
        if self.rollouter_version_s and self.rollouter_active_s is not None:
            return max(0.0, 1.0 - self.rollouter_active_s / self.rollouter_version_s)
        return self.rollouter_idle_verl
