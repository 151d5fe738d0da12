"""The verl key catalogue (verl_top/data/verl_keys.yaml): one test per key, plus the readings
that depend on the trainer mode (gen = wait in async modes, never add a contained timer twice,
the doubled param_sync prefix, generate_async outside the step).

The per-key test builds a step holding that key the way each trainer mode that prints it
would, and checks that verl-top files it where the catalogue says (a stage, nested, rollout
detail, outside the step, or the StepView / AsyncStats field that reads it) and explains it
with that mode's meaning.
"""

from __future__ import annotations

import re

import pytest

from verl_top.model import VerlStep
from verl_top.verl.async_stats import AsyncStats
from verl_top.verl.keys import MODES, catalogue, parse_catalogue
from verl_top.verl.stages import (
    StepView,
    core_step_time,
    included_extras,
    split_timings,
    stage_of,
)

CAT = catalogue()
SOURCE_RE = re.compile(r"^(v0\.\d\.\d|main-[0-9a-f]{7}) (verl|recipe)/[\w/.-]+\.(py|yaml):\d+$")
STEP_S = 100.0
VALUE = 7.0
# A plausible value for each field a metric key feeds (MFU and ratios must stay in (0, 1]).
FIELD_VALUES = {
    "mfu": 0.31,
    "mfu_critic": 0.22,
    "mfu_infer": 0.11,
    "trainer_idle_verl": 0.42,
    "rollouter_idle_verl": 0.35,
}


def _name(key: str) -> str:
    return key[len("timing_s/") :]


def _cases() -> list[tuple[str, str]]:
    return [(key, mode) for key, info in CAT.keys.items() for mode in info.modes]


def test_catalogue_is_complete_and_sourced() -> None:
    """Every entry names where verl writes it (tag path:line) and which modes print it; the
    keys issue 28 lists are all there."""
    assert len(CAT.keys) >= 60
    for key, info in CAT.keys.items():
        assert info.modes and set(info.modes) <= set(MODES), key
        assert info.covers and all(u.covers for u in info.modes.values()), key
        assert all(SOURCE_RE.match(s) for s in info.source), (key, info.source)
    for key in (
        "timing_s/gen",
        "timing_s/update_weights",
        "timing_s/sync_rollout_weights",
        "timing_s/generate_async",
        "timing_s/timing_s/param_sync",
        "timing_s/wait_for_enough_samples",
        "timing_s/switch_to_rollout",
        "fully_async/trainer/idle_ratio",
        "fully_async/rollouter/idle_ratio",
        "perf/throughput",
        "perf/mfu/actor",
    ):
        assert key in CAT.keys, key


@pytest.mark.parametrize(("key", "mode"), _cases(), ids=lambda x: x)
def test_catalogue_key(key: str, mode: str) -> None:
    """One test per key and mode that prints it: filed and explained as the catalogue says."""
    info = CAT.keys[key]
    use = info.use(mode)
    explained = CAT.explain(key, mode)
    assert use.covers in explained[0]
    assert any(info.since in line for line in explained)
    if use.kind == "metric":
        _check_metric(key, info.reads or "")
        return
    name = _name(key)
    metrics = {"timing_s/step": STEP_S, key: VALUE}
    if use.kind == "contained" and use.inside and use.inside in CAT.keys:
        metrics[use.inside] = VALUE + 2
    timings = split_timings(metrics, mode)
    if use.kind in ("detail", "outside"):
        assert timings.other[name] == VALUE
        assert VALUE not in [v for s, v in timings.times.items() if s != "step"]
        if use.kind == "outside":  # never part of the step's time
            assert core_step_time(timings.times, timings.nested) == STEP_S
        return
    container = CAT.keys.get(use.inside or "")
    if container is not None and key in container.contains:
        # Inside a timer that also is the stage: its time is the container's, never added.
        assert timings.other[name] == VALUE
        assert timings.times[use.stage] == VALUE + 2
        return
    assert timings.times[use.stage] == VALUE
    assert stage_of(key, mode) == use.stage
    if use.kind == "contained" and container is not None:
        assert timings.nested[use.stage] == stage_of(use.inside or "", mode)


def _check_metric(key: str, reads: str) -> None:
    cls, field = reads.split(".")
    value = FIELD_VALUES.get(field, 41.5)
    if cls == "AsyncStats":
        assert getattr(AsyncStats.from_metrics({key: value}), field) == value
        return
    assert cls == "StepView", reads
    metrics = {key: value}
    if field != "step_time":
        metrics["timing_s/step"] = STEP_S
    view = StepView.from_step(VerlStep(step=3, metrics=metrics))
    assert getattr(view, field) == value


@pytest.mark.parametrize(
    "mode", ["colocate_async", "separate_async", "one_step_off", "fully_async"]
)
def test_gen_is_the_trainers_wait_in_async_modes(mode: str) -> None:
    metrics = {"timing_s/gen": 46.0, "timing_s/update_actor": 20.0, "timing_s/step": 70.0}
    view = StepView.from_step(VerlStep(step=1, metrics=metrics), mode=mode)
    assert view.stage_times["wait"] == 46.0 and "gen" not in view.stage_times
    assert view.role("wait") == "wait"
    assert "wait" in CAT.explain("timing_s/gen", mode)[0]


@pytest.mark.parametrize("mode", ["legacy", "sync", None])
def test_gen_is_the_rollout_in_sync_modes(mode: str | None) -> None:
    metrics = {"timing_s/gen": 46.0, "timing_s/step": 70.0}
    view = StepView.from_step(VerlStep(step=1, metrics=metrics), mode=mode)
    assert view.stage_times["gen"] == 46.0 and view.role("gen") == "rollout"


def test_sync_rollout_weights_contains_update_weights_never_both() -> None:
    """One-step-off (v0.9.0 ray_trainer.py:398 around separation/ray_trainer.py:652): the step's
    weight sync is sync_rollout_weights; update_weights inside it is not added again."""
    metrics = {
        "timing_s/gen": 1.2,
        "timing_s/update_weights": 30.1,
        "timing_s/sync_rollout_weights": 30.6,
        "timing_s/update_actor": 26.5,
        "timing_s/step": 60.0,
    }
    view = StepView.from_step(VerlStep(step=2, metrics=metrics), mode="one_step_off")
    assert view.stage_times["update_weights"] == 30.6
    assert view.other_timings["update_weights"] == 30.1
    shares = view.shares()
    assert shares is not None and shares.denominator == 60.0
    assert abs(sum(s for _, _, s in shares.parts) + shares.other_share - 1.0) < 1e-9


def test_doubled_param_sync_prefix_is_the_weight_sync() -> None:
    """fully_async_trainer.py:729 times 'timing_s/param_sync'; verl prefixes it again."""
    metrics = {"timing_s/timing_s/param_sync": 5.1, "timing_s/gen": 88.0, "timing_s/step": 184.0}
    view = StepView.from_step(VerlStep(step=4, metrics=metrics), mode="fully_async")
    assert view.stage_times["update_weights"] == 5.1
    stats = AsyncStats.from_metrics(metrics)
    assert stats.sync_key == "timing_s/timing_s/param_sync" and stats.sync_s == 5.1


def test_generate_async_is_outside_the_step() -> None:
    metrics = {"timing_s/generate_async": 29.0, "timing_s/gen": 1.2, "timing_s/step": 60.0}
    view = StepView.from_step(VerlStep(step=1, metrics=metrics), mode="one_step_off")
    assert "generate_async" not in view.stage_times
    assert view.other_timings["generate_async"] == 29.0
    assert view.step_time_core == 60.0


def test_step_contains_the_checkpoint_but_not_validation_from_v08() -> None:
    """v0.8+ and V1 time save_checkpoint inside step and testing after it
    (trainer_base.py:449-470): only the checkpoint is taken out of the core step."""
    times = {"gen": 30.0, "update_actor": 20.0, "save_checkpoint": 12.0, "testing": 40.0}
    times["step"] = 30.0 + 20.0 + 12.0 + 0.5
    assert included_extras(times) == {"save_checkpoint"}
    assert core_step_time(times) == pytest.approx(50.5)
    old = {**times, "step": 30.0 + 20.0 + 12.0 + 40.0 + 0.5}  # <= v0.5: both inside
    assert included_extras(old) == {"save_checkpoint", "testing"}
    mid = {**times, "step": 50.5}  # v0.6-v0.7: neither
    assert included_extras(mid) == frozenset() and core_step_time(mid) == 50.5


def test_unknown_key_is_said_to_be_unknown() -> None:
    text = CAT.explain("timing_s/my_fork_rollout", "sync")
    assert "not in verl-top's catalogue" in text[0]


def test_explain_says_when_a_mode_does_not_print_a_key() -> None:
    lines = CAT.explain("fully_async/rollouter/idle_ratio", "sync")
    assert any("not printed by the V1 sync" in line for line in lines)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "kind: timer\n    role: rollout\n    since: v0.9.0\n    covers: x\n    modes: {sync: {}}\n    source: [v0.9.0 verl/a.py:1]",
            "a timer needs a stage",
        ),
        (
            "kind: timer\n    stage: gen\n    role: rollout\n    covers: x\n    modes: {sync: {}}\n    source: [v0.9.0 verl/a.py:1]",
            "missing 'since'",
        ),
        (
            "kind: metric\n    role: perf\n    since: v0.9.0\n    covers: x\n    modes: {turbo: {}}\n    source: [v0.9.0 verl/a.py:1]",
            "unknown modes",
        ),
        (
            "kind: metric\n    role: perf\n    since: v0.9.0\n    covers: x\n    modes: {sync: {}}\n    source: [somewhere]",
            "tag path:line",
        ),
    ],
)
def test_a_bad_entry_is_named(entry: str, message: str) -> None:
    text = f"keys:\n  timing_s/broken:\n    {entry}\n"
    with pytest.raises(ValueError, match=message) as err:
        parse_catalogue(text)
    assert "timing_s/broken" in str(err.value)
