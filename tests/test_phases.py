"""Whole-run judgement (issue 27 item 4): a finished run's phases, and which one the verdict
covers, on every surface.

Hand reading of the real logs, from their per-step numbers before the split was run:

* verl01_ppo_critic_qwen05b_timing_keys.log (verl 0.1, PPO, 39 steps): step time flat at ~64 s,
  responses ~235 tokens through step ~26, then shrinking to ~182 by step 38 (medians of three
  steps: 235, 235, 236, 237, 234, 233, 228 | 221, 211, 199, 191, 182): two phases, the verdict
  on the second.
* real_Qwen2.5-0.5B (434 steps), real_gemma-2-2b (105 steps), real_h200 40 steps: one shape
  (step time within a few %, responses drifting < 20 %; the H200 run's 19.9 s first step is a
  warm-up, not a phase): "whole run".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rich.console import Console

from tests.test_diagnosis_real_verl import _old_copy
from tests.test_diagnosis_scenarios import load
from verl_top.cli import diagnose_parser
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.report import format_text, to_json
from verl_top.export.report import build_report
from verl_top.export.snapshot import build_snapshot
from verl_top.headless import collect
from verl_top.inputs import build_inputs
from verl_top.ui.panes.dataflow import DataflowPane

FIX = Path(__file__).resolve().parent / "fixtures"
VERL01 = FIX / "real_logs" / "verl01_ppo_critic_qwen05b_timing_keys.log"


def _post_mortem(path: Path, tmp_path: Path):  # noqa: ANN202 - (store, assessment)
    args = diagnose_parser().parse_args(["--verl-log", str(_old_copy(tmp_path, path))])
    inputs = build_inputs(args)
    try:
        return inputs.store, asyncio.run(collect(inputs, 1.0))
    finally:
        inputs.close()


def test_a_run_whose_responses_shrank_has_two_phases_and_the_verdict_judges_the_last(
    tmp_path: Path,
) -> None:
    store, a = _post_mortem(VERL01, tmp_path)
    first, last = a.verdict.phases
    assert (first.first_step, last.last_step) == (1, 38)
    assert 24 <= first.last_step <= 30 and last.first_step == first.last_step + 1
    assert first.response_len == pytest.approx(235, abs=5)
    assert last.response_len < 0.85 * first.response_len
    assert last.step_s == pytest.approx(first.step_s, rel=0.05)  # the step time stayed flat
    # The verdict's medians are over the whole last phase, not its last five steps.
    assert a.window.startswith(f"last phase: median of steps {last.first_step}-38")
    assert f"earlier: steps 1-{first.last_step}" in a.window
    # Every surface lists the phases.
    doc = to_json(a)
    assert [p["first_step"] for p in doc["phases"]] == [1, last.first_step]
    assert "Phases of the run" in format_text(a)
    report = build_report(store, a, build_snapshot(store, a))
    assert f"- {first.text()}" in report and f"- {last.text()}" in report
    assert "the verdict judges the last" in report
    pane = DataflowPane().body(store, phases=a.verdict.phases)
    console = Console(width=160, record=True)
    console.print(pane)
    assert last.text() in console.export_text()


@pytest.mark.parametrize(
    "path",
    [
        FIX / "verl" / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log",
        FIX / "verl" / "real_gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",
        FIX / "verl" / "real_h200_verl050_grpo_hf_40steps.log",
    ],
    ids=lambda p: p.name[:30],
)
def test_a_run_of_one_shape_is_judged_whole(path: Path, tmp_path: Path) -> None:
    _, a = _post_mortem(path, tmp_path)
    assert len(a.verdict.phases) == 1
    assert a.window.startswith("whole run: median of steps")
    assert "Phases of the run" not in format_text(a)


def test_a_live_verdict_names_its_window_of_the_last_steps() -> None:
    store, _ = load("flow_train_bound")
    v = Engine().evaluate(store)
    assert v.phases == [] and v.window.startswith("median of steps")
    assert "(5 steps)" in v.window
