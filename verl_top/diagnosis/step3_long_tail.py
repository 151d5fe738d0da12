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

from verl_top.diagnosis import advice
from verl_top.diagnosis.findings import Finding, Rule, RuleResult, no_data, passed, scale
from verl_top.diagnosis.guards import mode_guard
from verl_top.diagnosis.readable import seconds, times
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import StepView, View, fmt_pct, median, timing
from verl_top.diagnosis.worth import Worth

STEP = 3
RULE = "flow.long_tail"


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
