"""The run's phases: where its shape changed (step time, response length, stage shares).

A post-mortem judges the last phase, not the last five steps of a run whose responses shrank
halfway, and says so; a run of one shape is judged whole. The split is a binary segmentation
(change points) on the per-step series: each series is scaled by its own noise (a robust
spread, floored so that a steady run's jitter does not count), the split that explains most of
the variance is kept when the two sides differ by a material amount (``Thresholds.phase_*``)
and both have at least ``phase_min_steps`` steps; each side may split once more. Linear in the
number of steps per split (prefix sums).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from verl_top.diagnosis.readable import number, pct, seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import PERIODIC_STAGES, StepView
from verl_top.verl.stages import role_of

ROLES = ("rollout", "train", "logprob")
ROLE_WORDS = {"rollout": "rollout", "train": "update", "logprob": "log-prob"}
MAX_STEPS = 5000  # the newest steps the split looks at (bounded work on a long run)


@dataclass(frozen=True)
class Phase:
    """Consecutive steps of one shape: their medians."""

    first_step: int
    last_step: int
    steps: int
    step_s: float | None  # median core step time
    response_len: float | None  # median response_length/mean
    shares: dict[str, float] = field(default_factory=dict)  # role -> median share of the step

    @property
    def span(self) -> str:
        """'steps 41-80'."""
        return f"steps {self.first_step}-{self.last_step}"

    def text(self) -> str:
        """'steps 1-40: 62 s a step, responses 420 tokens, rollout 55 %, update 30 %'."""
        parts = []
        if self.step_s:
            parts.append(f"{seconds(self.step_s)} a step")
        if self.response_len:
            parts.append(f"responses {number(self.response_len)} tokens")
        parts += [f"{ROLE_WORDS[r]} {pct(v)}" for r, v in self.shares.items()]
        return f"{self.span}: " + ", ".join(parts) if parts else self.span

    def as_dict(self) -> dict[str, object]:
        """For ``diagnose --json``."""
        return {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "steps": self.steps,
            "step_s": self.step_s,
            "response_length": self.response_len,
            "shares": dict(self.shares),
            "text": self.text(),
        }


def _series(steps: Sequence[StepView]) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {"step": [], "response": []}
    out.update({r: [] for r in ROLES})
    for s in steps:
        out["step"].append(s.denominator)
        resp = s.metrics.get("response_length/mean")
        out["response"].append(float(resp) if isinstance(resp, int | float) else None)
        secs: dict[str, float] = {}
        for name, t in s.stage_times.items():
            if name not in PERIODIC_STAGES:
                role = role_of(name, s.unknown)
                secs[role] = secs.get(role, 0.0) + t
        for role in ROLES:
            have = role in secs and s.denominator
            out[role].append(secs[role] / s.denominator if have and s.denominator else None)
    return out


def _scaled(values: list[float | None], relative: bool, floor: float) -> list[float] | None:
    """The series minus its median over its noise (None when too few values): missing values
    sit at the median (they add nothing to any split)."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    if len(present) < len(values) // 2 or len(present) < 2:
        return None
    med = statistics.median(present)
    mad = statistics.median(abs(v - med) for v in present) * 1.4826
    noise = max(mad, floor * abs(med) if relative else floor)
    if not noise:
        return None
    return [((v if v is not None and math.isfinite(v) else med) - med) / noise for v in values]


def _best_split(cols: list[list[float]], lo: int, hi: int, min_len: int) -> tuple[int, float]:
    """The split index in (lo, hi) with the largest drop of squared error, and that drop."""
    n = hi - lo
    best, gain = -1, 0.0
    sums = []
    for col in cols:
        s1, s2 = [0.0], [0.0]
        for v in col[lo:hi]:
            s1.append(s1[-1] + v)
            s2.append(s2[-1] + v * v)
        sums.append((s1, s2))

    def sse(a: int, b: int) -> float:
        total = 0.0
        for s1, s2 in sums:
            m = b - a
            total += (s2[b] - s2[a]) - (s1[b] - s1[a]) ** 2 / m
        return total

    whole = sse(0, n)
    for k in range(min_len, n - min_len + 1):
        g = whole - sse(0, k) - sse(k, n)
        if g > gain:
            best, gain = lo + k, g
    return best, gain


def _phase(steps: Sequence[StepView], series: dict[str, list[float | None]]) -> Phase:
    def med(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        return statistics.median(vals) if vals else None

    shares = {r: v for r in ROLES if (v := med(series[r])) is not None}
    return Phase(
        first_step=steps[0].step,
        last_step=steps[-1].step,
        steps=len(steps),
        step_s=med(series["step"]),
        response_len=med(series["response"]),
        shares=shares,
    )


def _differs(a: Phase, b: Phase, th: Thresholds) -> bool:
    """True when two neighbouring phases differ by a material amount."""
    for x, y in ((a.step_s, b.step_s), (a.response_len, b.response_len)):
        if x and y and abs(y - x) / min(x, y) >= th.phase_change_frac:
            return True
    return any(
        abs(a.shares[r] - b.shares[r]) >= th.phase_share_points
        for r in ROLES
        if r in a.shares and r in b.shares
    )


def split_phases(steps: Sequence[StepView], th: Thresholds) -> list[Phase]:
    """The run's phases, oldest first (one phase when its shape never changed; none without
    steps). Outlier steps (validation, checkpoint) are left out."""
    steps = [s for s in steps if not s.is_outlier and s.denominator][-MAX_STEPS:]
    if not steps:
        return []
    series = _series(steps)
    cols = [
        c
        for name, c in (
            ("step", _scaled(series["step"], True, th.phase_noise_frac)),
            ("response", _scaled(series["response"], True, th.phase_noise_frac)),
            *((r, _scaled(series[r], False, th.phase_noise_share)) for r in ROLES),
        )
        if c is not None
    ]
    min_len = int(th.phase_min_steps)
    bounds = [0, len(steps)]
    for _ in range(int(th.phase_max) - 1):
        candidates = []
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            if hi - lo < 2 * min_len or not cols:
                continue
            k, gain = _best_split(cols, lo, hi, min_len)
            if k < 0:
                continue
            left = _phase(steps[lo:k], {n: v[lo:k] for n, v in series.items()})
            right = _phase(steps[k:hi], {n: v[k:hi] for n, v in series.items()})
            if _differs(left, right, th):
                candidates.append((gain, k))
        if not candidates:
            break
        bounds = sorted({*bounds, max(candidates)[1]})
    return [
        _phase(steps[lo:hi], {n: v[lo:hi] for n, v in series.items()})
        for lo, hi in zip(bounds, bounds[1:], strict=False)
    ]
