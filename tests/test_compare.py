"""``verl-top compare``: which stage changed between two runs, by how much, and why.

Real inputs: two real verl 0.5.0 GRPO runs of the same recipe on one H200 at different settings
(tests/fixtures/PROVENANCE.md: a 392k-parameter model vs Qwen2.5-0.5B's shape), a copy of one
of them with one stage made slower, and verl-top's own recordings and snapshot bundles.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from verl_top.cli import main
from verl_top.compare import compare_runs, load_run

FIX = Path(__file__).parent / "fixtures"
TINY = FIX / "verl" / "real_h200_verl050_grpo_hf_40steps.log"
SMALL = FIX / "verl" / "real_h200_verl050_grpo_hf_qwen05b-shape_24steps.log"
TINY_REC = FIX / "real_h200" / "tiny" / "session.ndjson.gz"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _slowed_copy(src: Path, dst: Path, stage: str, factor: float) -> Path:
    """``src`` with ``timing_s/<stage>`` (and the step time) of every step made slower."""
    pattern = re.compile(rf"(timing_s/{re.escape(stage)}):([0-9.eE+-]+)")
    out = []
    for line in src.read_text(errors="replace").splitlines(keepends=True):
        m = pattern.search(line)
        if m and "step:" in line:
            old = float(m.group(2))
            extra = old * (factor - 1)
            line = line.replace(m.group(0), f"{m.group(1)}:{old * factor!r}", 1)
            line = re.sub(
                r"(timing_s/step):([0-9.eE+-]+)",
                lambda s, extra=extra: f"{s.group(1)}:{float(s.group(2)) + extra!r}",
                line,
                count=1,
            )
        out.append(line)
    dst.write_text("".join(out))
    return dst


def test_two_real_runs_of_one_recipe_name_generation_and_the_model_change(tmp_path: Path) -> None:
    """Hand reading first: the small model's steps take ~7.6 s against ~2.0 s, and generation
    (HF generate, launch-bound) is ~95 % of both; the model path is what changed."""
    code, out, _ = _cli("compare", str(TINY), str(SMALL), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "verl-top.compare/1"
    stages = doc["stages"]
    assert [abs(s["delta_s"]) for s in stages] == sorted(
        (abs(s["delta_s"]) for s in stages), reverse=True
    )
    top = stages[0]
    assert top["stage"] == "gen" and top["significant"]
    assert 4.5 < top["delta_s"] < 6.0 and top["baseline_s"] < top["current_s"]
    assert doc["step"]["significant"] and doc["step"]["delta_s"] == pytest.approx(5.6, abs=0.4)
    assert "gen explains" in doc["verdict"] and "another model" in doc["verdict"]
    assert "actor_rollout_ref.model.path" in {c["key"] for c in doc["config_diff"]}
    for s in stages:
        assert {"stage", "baseline_s", "current_s", "delta_s"} <= set(s)
    assert doc["baseline"]["skipped_steps"] == [1]  # the warm-up step is left out


def test_a_copy_with_one_stage_slower_names_that_stage_and_no_config_cause(tmp_path: Path) -> None:
    slow = _slowed_copy(TINY, tmp_path / "slow.log", "update_actor", 8.0)
    comp = compare_runs(*asyncio.run(_both(TINY, slow)))
    top = comp.stages[0]
    assert top.stage == "update_actor" and top.significant
    # Every other stage is the same run: inside its band.
    assert not [d.stage for d in comp.stages[1:] if d.significant]
    assert "update_actor explains" in comp.verdict
    assert "no config key that acts on this stage changed" in comp.verdict
    assert not comp.config_diff


async def _both(a: Path, b: Path) -> tuple:
    return await load_run(str(a)), await load_run(str(b))


def test_the_same_run_twice_is_no_change(tmp_path: Path) -> None:
    code, out, _ = _cli("compare", str(TINY), str(TINY))
    assert code == 0 and out.startswith("No change beyond noise")


def test_a_recording_against_its_snapshot_bundle(tmp_path: Path) -> None:
    code, _, _ = _cli("snapshot", "--replay", str(TINY_REC), "-o", str(tmp_path / "bundle"))
    assert code == 0
    comp = compare_runs(*asyncio.run(_both(TINY_REC, tmp_path / "bundle")))
    assert comp.baseline.kind == "recording" and comp.current.kind == "bundle"
    assert comp.baseline.steps and [s.step for s in comp.baseline.steps] == [
        s.step for s in comp.current.steps
    ]
    assert not [d for d in comp.stages if d.significant]


def test_bad_inputs_get_one_plain_sentence(tmp_path: Path) -> None:
    code, _, err = _cli("compare", str(tmp_path / "nope.log"), str(TINY))
    assert code == 2 and "nope.log: no such file or directory" in err
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    code, _, err = _cli("compare", str(empty), str(TINY))
    assert code == 2 and "not a snapshot bundle" in err
    noise = tmp_path / "noise.log"
    noise.write_text("hello\nworld\n")
    code, out, _ = _cli("compare", str(noise), str(TINY))
    assert code == 3 and out.startswith("Cannot compare: the baseline run has no timed verl step")


def test_config_secrets_are_redacted(tmp_path: Path) -> None:
    text = TINY.read_text(errors="replace").replace(
        "'experiment_name': 'tiny_grpo'",
        "'experiment_name': 'tiny_grpo', 'api_key': 'sk-abcdefghijklmnop1234'",
    )
    assert "api_key" in text
    b = tmp_path / "b.log"
    b.write_text(text)
    code, out, _ = _cli("compare", str(TINY), str(b))
    assert code == 0 and "sk-abcdefghijklmnop1234" not in out and "api_key" in out


async def test_the_app_shows_the_baseline_column_and_the_diff(tmp_path: Path) -> None:
    """--baseline in the app: pane 3's stage medians gain the baseline's column, and the
    diagnosis screen names the stage that explains the change."""
    from rich.console import Console

    from verl_top.cli import app_parser
    from verl_top.compare import load_run
    from verl_top.inputs import build_inputs
    from verl_top.ui.app import VerlTopApp

    args = app_parser().parse_args(["--replay", str(TINY_REC), "--speed", "1000"])
    inputs = build_inputs(args)
    inputs.baseline = await load_run(str(SMALL))
    app = VerlTopApp(inputs, refresh=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.assessment.settled:
                break
        assert app.assessment.comparison is not None
        await pilot.press("3")
        await pilot.pause(0.2)
        console = Console(width=160, file=io.StringIO(), record=True)
        console.print(app.query_one("#flow-body").content)
        pane = console.export_text()
        assert "baseline s" in pane and "vs baseline" in pane
        gen = next(line for line in pane.splitlines() if " gen " in line)
        assert "↓" in gen  # the tiny run generates faster than the small baseline
        await pilot.press("d")
        await pilot.pause(0.2)
        console = Console(width=160, file=io.StringIO(), record=True)
        console.print(app.screen.query_one("#findings-body").content)
        screen = console.export_text()
        assert "Against the baseline" in screen and "gen explains" in screen
