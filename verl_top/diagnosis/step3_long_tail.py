"""Step 3 — the rollout's long tail: the slowest samples hold every step up.

Two kinds of evidence, both per step:

- **per-sample timings** (agent loop ``timing_s/agent_loop/generate_sequences/max`` vs ``mean``;
  sync rollout ``generation_timing/max`` vs ``generate_sequences``): the slowest sample ran far
  past the mean one; what it costs is the time after the mean sample finished.
- **the length cap** (a synchronous rollout whose per-rank timings are equal): generation time
  follows ``response_length/max`` hitting ``data.max_response_length`` while the mean length
  stays flat, with ``response_length/clip_ratio`` saying how many responses hit the cap.

``response_length/clip_ratio`` alone measures no tail: it is reported, at a severity that
cannot lead, as a length setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_top.diagnosis import advice
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.guards import mode_guard
from verl_top.diagnosis.readable import number, seconds, times
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import StepView, View, fmt_pct, median, timing
from verl_top.diagnosis.worth import Worth

STEP = 3
RULE = "flow.long_tail"
# Steps the length evidence is read over (more than the 5 of the stage medians: a correlation
# needs them), and the fewest that say anything.
LENGTH_STEPS = 20
MIN_LENGTH_STEPS = 4


def per_sample(s: StepView) -> tuple[float, float, str] | None:
    """(slowest, mean, source) of one step's per-sample generation times, when logged."""
    mx = timing(s.metrics, "agent_loop/generate_sequences/max")
    mn = timing(s.metrics, "agent_loop/generate_sequences/mean")
    if mx is not None and mn:
        return mx, mn, "agent_loop/generate_sequences"
    mx = timing(s.metrics, "generation_timing/max")
    mn = timing(s.metrics, "generate_sequences")
    if mx is not None and mn:
        return mx, mn, "generation_timing/max vs generate_sequences (mean over ranks)"
    return None


def _clip(view: View) -> float | None:
    clips = [
        float(c)
        for s in view.recent_steps()
        if (c := s.metrics.get("response_length/clip_ratio")) is not None and c == c
    ]
    return median(clips)


def _per_sample_tail(
    view: View, th: Thresholds, samples: list[tuple[StepView, tuple[float, float, str]]]
) -> RuleResult:
    gen = view.median_role_share("rollout")
    share = gen[0] if gen else None
    clip = _clip(view)
    ratio = median(mx / mn for _, (mx, mn, _) in samples) or 0.0
    tail = median(mx - mn for _, (mx, mn, _) in samples) or 0.0
    src = samples[-1][1][2]
    if ratio <= th.long_tail_ratio:
        return passed(STEP, RULE, f"{src}: slowest {times(ratio)} the mean, {view.steps_text()}")
    ev = [
        f"{src}: slowest {times(ratio)} the mean (> {times(th.long_tail_ratio)}), "
        f"{view.steps_text()}",
        f"the slowest sample ran {seconds(tail)} past the mean sample (median per step)",
    ]
    if share is not None:
        ev.append(f"rollout {fmt_pct(share)} of the step")
    if clip is not None:
        ev.append(f"response_length/clip_ratio = {clip:.2f}")
    gen_s = view.median_seconds(*gen[2]) if gen else None
    if gen_s:
        ev.append(f"the tail is {fmt_pct(tail / gen_s)} of the rollout time")
    return Finding(
        STEP,
        RULE,
        scale(ratio, th.long_tail_ratio, 5.0, 0.45, 0.8),
        f"Rollout long tail: slowest sample {times(ratio)} the mean",
        ev,
        advice.long_tail_advice(view.facts(), clip, th.clip_ratio),
        {"ratio": ratio, "tail_s": tail, "clip_ratio": clip, "gen_share": share},
        **Worth(
            tail,
            tail,
            view.median_step_s(),
            "time the slowest sample ran after the mean one finished",
        ).fields(),
        stage="rollout",
    )


@dataclass(frozen=True)
class LengthTail:
    """Generation time against the longest response, over the recent steps."""

    steps: int
    r_max: float  # correlation of gen time with response_length/max
    slope_s: float  # seconds of generation per token of the longest response
    max_len: float  # median response_length/max
    mean_len: float  # median response_length/mean
    mean_spread: float  # (max - min) / median of response_length/mean
    gen_s: float  # median generation seconds
    capped: int  # steps whose longest response hit data.max_response_length
    cap: float | None

    @property
    def tail_s(self) -> float:
        """What decoding past the mean response costs per step: slope x (max - mean)."""
        return max(0.0, min(self.gen_s, self.slope_s * (self.max_len - self.mean_len)))


def _pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sx = sum((x - mx) ** 2 for x in xs) ** 0.5
    sy = sum((y - my) ** 2 for y in ys) ** 0.5
    return sxy / (sx * sy) if sx and sy else 0.0


def length_tail(view: View, names: list[str]) -> LengthTail | None:
    """How generation time follows the longest response across the recent steps (sync
    rollout, no per-sample timings): a batch decodes until its longest response ends."""
    rows = []
    for s in view.recent_steps(LENGTH_STEPS):
        gen = sum(s.stage_times.get(n, 0.0) for n in names)
        mx, mn = s.metrics.get("response_length/max"), s.metrics.get("response_length/mean")
        if gen > 0 and mx and mn and mx == mx and mn == mn:
            rows.append((gen, float(mx), float(mn)))
    if len(rows) < MIN_LENGTH_STEPS:
        return None
    gens, maxes, means = ([r[i] for r in rows] for i in range(3))
    mx_avg, gen_avg = sum(maxes) / len(maxes), sum(gens) / len(gens)
    var = sum((m - mx_avg) ** 2 for m in maxes)
    slope = (
        sum((m - mx_avg) * (g - gen_avg) for m, g in zip(maxes, gens, strict=True)) / var
        if var
        else 0.0
    )
    mean_med = median(means) or 0.0
    cap = view.facts().max_response
    return LengthTail(
        steps=len(rows),
        r_max=_pearson(maxes, gens),
        slope_s=slope,
        max_len=median(maxes) or 0.0,
        mean_len=mean_med,
        mean_spread=(max(means) - min(means)) / mean_med if mean_med else 0.0,
        gen_s=median(gens) or 0.0,
        capped=sum(1 for m in maxes if cap and m >= cap),
        cap=cap,
    )


def _length_tail_finding(view: View, th: Thresholds, t: LengthTail, share: float) -> Finding:
    step_s = view.median_step_s()
    ev = [
        f"generation time follows response_length/max (r = {t.r_max:.2f} over {t.steps} "
        f"steps, {seconds(t.slope_s)} per token of the longest response) while "
        f"response_length/mean stays within {fmt_pct(t.mean_spread)}",
        f"longest response {number(t.max_len)} tokens vs mean {number(t.mean_len)} "
        f"({times(t.max_len / t.mean_len)}): the batch decodes {seconds(t.tail_s)} past the "
        "mean response each step",
        f"rollout {fmt_pct(share)} of the step",
    ]
    if t.cap:
        ev.append(
            f"response_length/max hit data.max_response_length ({number(t.cap)}) in "
            f"{t.capped} of {t.steps} steps"
        )
    clip = _clip(view)
    if clip is not None:
        ev.append(f"response_length/clip_ratio = {clip:.2f}")
    return Finding(
        STEP,
        RULE,
        scale(t.tail_s / step_s if step_s else 0.0, 0.05, 0.3, 0.45, 0.8),
        f"Rollout long tail: generation follows the longest response ({times(t.max_len / t.mean_len)} "
        "the mean), not the mean",
        ev,
        advice.long_tail_advice(view.facts(), clip, th.clip_ratio, capped=t.capped > 0),
        {"r_max": t.r_max, "slope_s_per_token": t.slope_s, "tail_s": t.tail_s, "gen_share": share},
        **Worth(
            t.tail_s,
            t.tail_s,
            step_s,
            "decoding past the mean response: slope of generation time over the longest "
            "response x (longest - mean)",
        ).fields(),
        stage="rollout",
    )


def flow_long_tail(view: View, th: Thresholds) -> RuleResult:
    """The slowest sample holds the rollout up while generation is a material share of the
    step: per-sample timings, else the length cap (see the module docstring)."""
    if (guard := mode_guard(view, STEP, RULE)) is not None:
        return guard  # async trainers overlap or cut the tail: async.balance judges the wait
    gen = view.median_role_share("rollout")
    samples = [(s, hit) for s in view.recent_steps() if (hit := per_sample(s)) is not None]
    clip = _clip(view)
    if gen is None and not samples and clip is None:
        return no_data(
            STEP,
            RULE,
            view.need_steps(
                "per-sample generation timings (timing_s/agent_loop/*, generation_timing/*) "
                "or response_length/*"
            ),
        )
    share = gen[0] if gen else None
    if share is not None and share < th.long_tail_gen_frac:
        return passed(
            STEP, RULE, f"rollout {fmt_pct(share)} of the step: a generation tail cannot cost much"
        )
    if samples:
        return _per_sample_tail(view, th, samples)
    lt = length_tail(view, gen[2]) if gen else None
    if (
        lt is not None
        and share is not None
        and lt.r_max >= th.tail_length_r
        and lt.slope_s > 0
        and lt.mean_spread <= th.tail_mean_flat
        and lt.max_len > th.long_tail_ratio * lt.mean_len
    ):
        return _length_tail_finding(view, th, lt, share)
    if clip is not None and clip > th.clip_ratio:
        return Finding(
            STEP,
            RULE,
            0.2,  # a setting, not a measured tail: never the bottleneck on its own
            f"{fmt_pct(clip)} of responses hit max_response_length (a length setting; "
            "no per-sample timings to measure a tail)",
            [
                f"response_length/clip_ratio = {clip:.2f} (> {th.clip_ratio:.2f}), "
                f"{view.steps_text()}",
                "no timing_s/agent_loop/* or generation_timing/* in the log: the tail itself "
                "is not measured",
            ]
            + ([f"rollout {fmt_pct(share)} of the step"] if share is not None else []),
            advice.clip_advice(view.facts()),
            {"clip_ratio": clip, "gen_share": share},
            stage="rollout",
        )
    return passed(
        STEP,
        RULE,
        "no per-sample generation timings"
        + (f"; clip ratio {clip:.2f}" if clip is not None else ""),
    )


RULES: list[Rule] = [flow_long_tail]
