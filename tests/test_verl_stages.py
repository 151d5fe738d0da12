"""Stage catalogue and StepView, on the real logs and the constructed samples."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.model import VerlStep
from verl_top.verl.parse import parse_file
from verl_top.verl.stages import (
    STAGE_NAMES,
    TIMING_PREFIXES,
    StepView,
    TimingPlans,
    core_step_time,
    split_timings,
    stage_bands,
    stage_of,
    step_includes_extras,
)

FIX = Path(__file__).parent / "fixtures" / "verl"
GEMMA = FIX / "real_gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log"
EXCERPT = FIX / "verl_real_log_excerpt.txt"
CONSOLE = FIX / "verl_console_sample.log"


def test_catalogue_names_and_aliases():
    for name in (
        "gen",
        "gen_max",
        "reward",
        "old_log_prob",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
        "update_weights",
        "dump_rollout_generations",
        "testing",
        "save_checkpoint",
        "step",
    ):
        assert name in STAGE_NAMES
    assert stage_of("timing/gen") == stage_of("timing_s/gen") == "gen"
    assert stage_of("timing_s/reshard") == "update_weights"
    assert stage_of("timing_per_token_ms/gen") is None
    assert stage_of("timing_s/agent_loop/generate_sequences/max") is None
    t = split_timings(
        {"timing_s/gen": 10.0, "timing_s/reshard": 2.0, "timing_per_token_ms/gen": 0.1}
    )
    assert t.times == {"gen": 10.0, "update_weights": 2.0}
    assert t.nested == {"update_weights": "gen"}  # v0.5 reshard runs inside gen
    assert t.per_token_ms == {"gen": 0.1}


def test_old_step_includes_testing():
    # Excerpt step 5 (verl ~0.4): gen..update_actor sum to 173.577, testing 45.697, step 219.373.
    (s5,) = [s for s in parse_file(EXCERPT).steps if s.step == 5]
    v = StepView.from_step(s5)
    assert v.includes_extras is True
    assert v.step_time == 219.373
    assert v.step_time_core == pytest.approx(219.373 - 45.697)
    assert v.is_outlier
    assert v.throughput == 858.615 and v.throughput_source == "verl"
    assert v.mfu == 0.780
    assert v.mem_reserved_gb == 204.752


def test_new_step_excludes_testing_and_checkpoint():
    s10 = parse_file(CONSOLE).steps[0]
    v = StepView.from_step(s10)
    # gen 299.46 + ... + update_weights 6.16 ≈ 498.3 ≈ step 500.42; testing 85.98, ckpt 112.03 outside.
    assert v.includes_extras is False
    assert v.step_time_core == v.step_time == 500.4209767680302
    assert v.wall_time == pytest.approx(500.4209767680302 + 85.98274128019146 + 112.02554937600111)
    assert v.is_outlier
    assert v.long_tail_ratio == pytest.approx(294.7922584213257 / 112.7680777607374)
    assert v.num_preempted == 27
    assert v.mfu == 0.30580672567297107
    assert v.mem_reserved_gb == 87.99117768143235
    assert v.share("gen") == pytest.approx(299.4644854043238 / 500.4209767680302)
    assert v.share("testing") == pytest.approx(85.98274128019146 / v.wall_time)
    # perf/throughput = total tokens / (step × 8 GPUs): derived n_gpus matches the sample's 8.
    assert v.total_tokens_per_s / v.throughput == pytest.approx(8.0)


def test_no_extras_is_undecidable_and_core_is_step():
    times = {"gen": 5.0, "update_actor": 3.0, "step": 8.2}
    assert step_includes_extras(times) is None
    assert core_step_time(times) == 8.2
    assert core_step_time({"gen": 5.0, "update_actor": 3.0}) == 8.0


def test_gemma_earliest_format_without_step_key():
    log = parse_file(GEMMA)
    v1 = StepView.from_step(log.step(1), log.config)
    # timing/gen 42.247 + ref 11.155 + values 9.618 + adv 0.118 + update_critic 32.821
    # + update_actor 38.767 = 134.726 (no timing/step in this version).
    assert v1.step_time_core == pytest.approx(134.726)
    assert v1.step_time_source == "sum of stage timings"
    assert v1.mfu is None and v1.throughput_source == "estimated"
    # 512 prompts (rollout.n 1) per 134.726 s.
    assert v1.samples_per_s == pytest.approx(512 / 134.726)
    # (83.561 + 133.205) mean tokens × 512 samples / 134.726 s / 2 GPUs.
    assert v1.throughput == pytest.approx((83.561 + 133.205) * 512 / 134.726 / 2)
    v9 = StepView.from_step(log.step(9), log.config)
    assert v9.is_outlier and v9.stage_times["testing"] == 73.947
    assert v9.step_time == pytest.approx(v9.step_time_core + 73.947)
    assert not StepView.from_step(log.steps[0]).has_training  # step-0 validation-only line


def test_stage_bands_walk_back_from_arrival():
    a = VerlStep(
        step=1,
        t=100.0,
        metrics={"timing_s/gen": 50.0, "timing_s/update_actor": 30.0, "timing_s/step": 85.0},
    )
    b = VerlStep(
        step=2,
        t=200.0,
        metrics={
            "timing_s/gen": 60.0,
            "timing_s/reshard": 5.0,  # nested in gen: no band
            "timing_s/old_log_prob": 10.0,
            "timing_s/update_actor": 20.0,
            "timing_s/step": 90.0,
            "timing_s/testing": 8.0,
        },
    )
    bands = stage_bands([a, StepView.from_step(b)])
    assert bands == [
        (20.0, 70.0, "gen"),
        (70.0, 100.0, "update_actor"),
        (102.0, 162.0, "gen"),
        (162.0, 172.0, "old_log_prob"),
        (172.0, 192.0, "update_actor"),
        (192.0, 200.0, "testing"),
    ]


def test_stage_bands_clip_to_previous_line():
    a = VerlStep(step=1, t=100.0, metrics={"timing_s/gen": 5.0})
    b = VerlStep(step=2, t=110.0, metrics={"timing_s/gen": 20.0, "timing_s/adv": 4.0})
    assert stage_bands([a, b]) == [
        (95.0, 100.0, "gen"),
        (100.0, 106.0, "gen"),
        (106.0, 110.0, "adv"),
    ]


def test_a_step_reads_alike_under_every_timing_prefix() -> None:
    """``split_timings`` takes a timer's name after its prefix's "/" whichever prefix verl
    used (``timing_s/`` or the older ``timing/``): same stages, nesting and detail, and the
    per-token timings and other metrics are not taken for timers."""
    step = {
        "timing_s/gen": 10.0,
        "timing_s/update_actor": 3.0,
        "timing_s/agent_loop/slowest/generate_sequences": 1.0,
        "timing_s/my_reward_stage": 2.0,
        "timing_per_token_ms/gen": 0.1,
        "actor/lr": 1e-6,
    }
    base = split_timings(step)
    assert base.times == {"gen": 10.0, "update_actor": 3.0, "my_reward_stage": 2.0}
    assert base.per_token_ms == {"gen": 0.1}
    assert "agent_loop/slowest/generate_sequences" in base.other
    for prefix in TIMING_PREFIXES:
        renamed = {k.replace("timing_s/", prefix, 1): v for k, v in step.items()}
        assert split_timings(renamed) == base, prefix


# Timers the catalogue knows (nested, detail, outside the step, mode-dependent), timers it
# does not (rollout-named or not, with a "/"), the old prefix, per-token timings, non-timers.
PLAN_KEYS = [
    "timing_s/gen",
    "timing_s/reshard",
    "timing_s/sync_rollout_weights",
    "timing_s/step",
    "timing_s/update_weights",
    "timing_s/timing_s/param_sync",
    "timing_s/generate_async",
    "timing_s/generate_sequences",
    "timing_s/agent_loop/tool_calls/max",
    "timing_s/testing",
    "timing_s/update_actor",
    "timing/gen",
    "timing/update_actor",
    "timing_s/my_rollout",
    "timing_s/sample_more",
    "timing_s/custom",
    "timing_s/a/b",
    "timing_s/",
    "actor/lr",
    "timing_per_token_ms/gen",
    "perf/throughput",
]
PLAN_VALUES = [0.5, 3.0, 120.0, 400.0, 0.0, -1.0, float("nan"), float("inf"), 1e308]
PLAN_MODES = [None, "sync", "one_step_off", "fully_async", "colocate_async", "legacy", "other"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(PLAN_KEYS), min_size=1, max_size=10, unique=True),
    st.lists(st.lists(st.sampled_from(PLAN_VALUES), min_size=10, max_size=10), min_size=1),
    st.sampled_from(PLAN_MODES),
)
def test_timing_plans_split_as_split_timings(
    keys: list[str], rows: list[list[float]], mode: str | None
) -> None:
    """TimingPlans (each key layout read through the catalogue once) gives what
    split_timings gives for every step of that layout, whatever the values (nan, inf, a
    rollout timer longer or shorter than gen)."""
    plans = TimingPlans(limit=2)
    for values in rows:
        for layout in (keys, keys[::-1]):
            metrics = dict(zip(layout, values, strict=False))
            assert repr(plans.split(metrics, mode)) == repr(split_timings(metrics, mode))
