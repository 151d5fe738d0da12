"""The synchronous rollout's long tail from per-step evidence (issue 27 item 5).

Real numbers: steps 16-19 of a public verl log (LoRA GRPO of a 72B model on 8 GPUs, vLLM sync
rollout; wt-corpus's real_logs/lora72b_grpo_8gpu_validation_every_5_steps.log, source in its
PROVENANCE.md; step 15 ran validation and is left out). Per step: timing_s/gen, timing_s/step,
response_length/max and /mean as logged. Written from the numbers before running the rule:
least squares of gen on max gives 0.0851 s per token, r = 0.944; the mean moves 10.1 % while
the max runs 479-853; median max 519.5 vs median mean 249.7 tokens, so the batch decodes
0.0851 x 269.8 = 23.0 s per step past the mean response, 15 % of the 153.6 s step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_diagnosis_real_verl import _store_from_log
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.step3_long_tail import flow_long_tail, length_tail
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import VerlConfig, VerlStep
from verl_top.store import Store

TH = Thresholds()
FIX = Path(__file__).resolve().parent / "fixtures"
# step: (timing_s/gen, timing_s/step, response_length/max, response_length/mean)
LORA72B = {
    16: (96.547, 140.092, 503.0, 236.103),
    17: (107.259, 156.47, 479.0, 240.516),
    18: (105.587, 150.645, 536.0, 258.844),
    19: (133.261, 179.287, 853.0, 261.428),
}


def _store(rows: dict[int, tuple[float, float, float, float]]) -> Store:
    store = Store()
    store.ingest(
        VerlConfig(
            host="h",
            t=0.0,
            values={
                "actor_rollout_ref.rollout.name": "vllm",
                "actor_rollout_ref.rollout.mode": "sync",
            },
        )
    )
    for step, (gen, total, mx, mn) in rows.items():
        metrics = {
            "timing_s/gen": gen,
            "timing_s/step": total,
            "response_length/max": mx,
            "response_length/mean": mn,
            "response_length/clip_ratio": 0.0,
        }
        store.ingest(VerlStep(host="h", t=0.0, step=step, metrics=metrics))
    return store


def test_generation_following_the_longest_response_is_a_tail() -> None:
    store = _store(LORA72B)
    lt = length_tail(View(store, TH), ["gen"])
    assert lt is not None and lt.steps == 4
    assert lt.slope_s == pytest.approx(0.0851, abs=0.0005)
    assert lt.r_max == pytest.approx(0.944, abs=0.005)
    assert lt.mean_spread == pytest.approx(0.101, abs=0.002)
    assert lt.tail_s == pytest.approx(23.0, abs=0.2)
    f = flow_long_tail(View(store, TH), TH)
    assert f.rule == "flow.long_tail" and f.stage == "rollout"
    assert f.save_s == pytest.approx(23.0, abs=0.2) and f.step_s == pytest.approx(153.6, abs=0.1)
    assert "follows response_length/max (r = 0.94 over 4 steps" in f.evidence[0]
    assert "over_sample_rate" in f.advice and "max_response_length" not in f.advice  # no cap hit


def test_a_flat_max_or_a_moving_mean_is_no_length_tail() -> None:
    # The same steps with the mean following the max (the responses grew): no tail.
    grown = {k: (g, s, mx, mx * 0.47) for k, (g, s, mx, _) in LORA72B.items()}
    assert flow_long_tail(View(_store(grown), TH), TH).status == "passed"
    # Real logs whose longest response sits at the cap every step (nothing to correlate) or
    # does not move generation (r 0.09 over 392 steps): no length tail claimed.
    for path in (
        FIX / "real_logs" / "verl01_ppo_critic_qwen05b_timing_keys.log",
        FIX / "verl" / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log",
    ):
        v = Engine().evaluate(_store_from_log(path))
        assert not [f for f in v.findings if f.rule == "flow.long_tail"], path.name
