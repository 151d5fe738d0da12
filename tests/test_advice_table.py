"""Advice never contradicts the config it was built from (issue 27 item 2).

Two tables. The first runs every advice builder over the cartesian grid of the job facts that
advice depends on (engine x rollout TP x enforce_eager x offload x dynamic bsz x micro batch x
device). The second runs every rule, through the engine, over every scenario and the real corpus
logs with step timings, each with a grid of configs laid over its own; every finding's advice is
checked against the config it was given. The contradictions are the ones seen on real logs:
"smaller rollout TP (more replicas)" under TP = 1, "keep enforce_eager=False" to a job with it
True, vLLM knobs for the HF rollout, CUDA wording on an NPU job.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_diagnosis_real_verl import _store_from_log
from tests.test_diagnosis_scenarios import NAMES, load
from verl_top.diagnosis import advice
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.job import A, JobFacts, R
from verl_top.diagnosis.readable import SCIENTIFIC
from verl_top.model import VerlConfig
from verl_top.store import Store

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "real_logs"
TIMED_LOGS = [
    "ppo_critic_qwen25_7b_2x8gpu_ray_job_submit.log",
    "verl01_ppo_critic_qwen05b_timing_keys.log",
    "vlm_gui_cursor_custom_rollout_key.log",
    "vlm_gui_cursor_mfu_not_estimated.log",
    "grpo_1gpu_nested_gen_timers_readme.log",
    "grpo_megatron_deepseek7b_16gpu_preemption.log",
]
VLLM_KNOBS = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager")
SMALLER_TP = re.compile(r"(lower|smaller)[^;.]*tensor_model_parallel_size|more replicas")
# Rules whose evidence is the vLLM/SGLang servers' own metrics: their engine is what the
# metrics say, whatever a grid overlay claims.
SERVER_RULES = ("flow.rollout_queue", "flow.kv_cache_pressure")


def contradictions(facts: JobFacts, text: str, rule: str = "") -> list[str]:
    """What ``text`` (advice) says against ``facts`` (the job's config)."""
    bad = []
    if facts.rollout_tp == 1 and SMALLER_TP.search(text):
        bad.append("smaller rollout TP at TP 1")
    if re.search(r"\bkeep\b[^;.]*enforce_eager", text):
        bad.append("'keep enforce_eager' (advice says what to change)")
    if facts.enforce_eager is not True and "enforce_eager=False" in text:
        bad.append("set enforce_eager=False when it is not True")
    if facts.engine == "hf" and rule not in SERVER_RULES:
        bad += [f"vLLM knob {k} for hf" for k in VLLM_KNOBS if k in text]
    if facts.dynamic_bsz is True and A + "use_dynamic_bsz=True" in text:
        bad.append("set use_dynamic_bsz=True when it is on")
    if facts.critic_dynamic_bsz is True and "critic.use_dynamic_bsz=True" in text:
        bad.append("set critic.use_dynamic_bsz=True when it is on")
    if not facts.offload and re.search(r"offload[\w.]*=False|offload off", text):
        bad.append("turn offload off when it is off")
    if facts.device == "npu" and ("CUDA" in text or "nvidia-smi" in text):
        bad.append("GPU-only wording on an NPU job")
    if SCIENTIFIC.search(text):
        bad.append("scientific notation")
    if facts.rollout_tp and (m := re.search(r"tensor_model_parallel_size from (\d+)", text)):
        if int(m.group(1)) != facts.rollout_tp:
            bad.append(f"quotes TP {m.group(1)}, config has {facts.rollout_tp}")
    return bad


FACT_GRID = [
    JobFacts(
        has_config=True,
        engine=engine,
        rollout_tp=tp,
        enforce_eager=eager,
        offload=offload,
        dynamic_bsz=dyn,
        micro_batch=micro,
        device=device,
        gpus_per_node=8,
        max_prompt=1024,
        max_response=4096,
        token_budget=4096,
        gpu_memory_utilization=0.6,
    )
    for engine, tp, eager, offload, dyn, micro, device in itertools.product(
        ("vllm", "sglang", "trtllm", "hf", None),
        (1, 2, 4, None),
        (True, False, None),
        ((), (A + "fsdp_config.param_offload",)),
        (True, False, None),
        (1.0, 8.0, None),
        ("gpu", "npu"),
    )
]


def _builders(f: JobFacts) -> dict[str, str]:
    return {
        "rollout": advice.rollout_advice(f, None, False),
        "rollout busy": advice.rollout_advice(f, 85.0, False),
        "rollout launch-bound": advice.rollout_advice(f, 5.0, True),
        "train": advice.train_advice(f),
        "train critic": advice.train_advice(f, critic_heavy=True),
        "micro batch": advice.micro_batch_advice(f),
        # cfg.enforce_eager passes for engines without the switch (hf, trtllm)
        "eager": advice.eager_advice(f)
        if f.enforce_eager and f.engine in ("vllm", "sglang")
        else "",
        "offload": advice.offload_advice(f) if f.offload else "",
        "logprob": advice.logprob_advice(f),
        "long tail": advice.long_tail_advice(f, 0.3, 0.1),
        "clip": advice.clip_advice(f),
        "periodic": advice.periodic_advice(f, ["testing", "save_checkpoint"]),
        "driver": advice.driver_advice(f, "reward"),
        "seqlen": advice.seqlen_advice(f),
        "replicas": advice.replicas_advice(f),
        "util": advice.util_misleading_advice(f),
        "kv low": advice.kv_low_advice(f) if f.engine != "hf" else "",
        "memory headroom": advice.memory_headroom_advice(f),
        "tput drop": advice.tput_drop_advice(f),
        "unused gpu": advice.unused_gpu_advice(f),
    }


def test_every_builder_over_the_whole_fact_grid() -> None:
    assert len(FACT_GRID) == 5 * 4 * 3 * 2 * 3 * 3 * 2
    bad = []
    for facts in FACT_GRID:
        for name, text in _builders(facts).items():
            bad += [(name, why, facts, text) for why in contradictions(facts, text)]
    assert not bad, bad[:3]


def test_the_builders_name_what_the_config_lets_change() -> None:
    base = FACT_GRID[0]
    tp4 = dataclasses.replace(base, engine="vllm", rollout_tp=4, enforce_eager=True)
    text = advice.rollout_advice(tp4, None, False)
    assert "tensor_model_parallel_size from 4 to 2 (4 replicas instead of 2)" in text
    assert text.startswith("Set actor_rollout_ref.rollout.enforce_eager=False (CUDA graphs;")
    npu = dataclasses.replace(tp4, device="npu")
    assert "(graph mode; your config has True" in advice.rollout_advice(npu, None, False)
    on = dataclasses.replace(base, dynamic_bsz=True, token_budget=4096.0)
    assert "raise actor_rollout_ref.actor.ppo_max_token_len_per_gpu from 4096 to 10240" in (
        advice.train_advice(on).lower()
    )
    hf = dataclasses.replace(base, engine="hf")
    assert advice.rollout_advice(hf, None, False).startswith(f"Switch {R}name to vllm or sglang")


# -- the rules, through the engine ----------------------------------------------------------

OVERLAYS: list[dict[str, Any]] = [
    {"name": "vllm", "tp": 1, "eager": True, "offload": False, "dyn": False, "micro": 1, "dev": "cuda"},
    {"name": "vllm", "tp": 4, "eager": False, "offload": True, "dyn": True, "micro": 8, "dev": "cuda"},
    {"name": "sglang", "tp": 2, "eager": True, "offload": True, "dyn": False, "micro": 8, "dev": "npu"},
    {"name": "sglang", "tp": 1, "eager": False, "offload": False, "dyn": True, "micro": 1, "dev": "cuda"},
    {"name": "hf", "tp": 1, "eager": True, "offload": True, "dyn": True, "micro": 1, "dev": "cuda"},
    {"name": "hf", "tp": 2, "eager": False, "offload": False, "dyn": False, "micro": 8, "dev": "npu"},
    {"name": "trtllm", "tp": 4, "eager": True, "offload": False, "dyn": True, "micro": 1, "dev": "npu"},
    {"name": "trtllm", "tp": 1, "eager": False, "offload": True, "dyn": False, "micro": 8, "dev": "cuda"},
]  # fmt: skip


def _overlay(o: dict[str, Any]) -> dict[str, Any]:
    return {
        R + "name": o["name"],
        R + "tensor_model_parallel_size": o["tp"],
        R + "enforce_eager": o["eager"],
        A + "fsdp_config.param_offload": o["offload"],
        A + "fsdp_config.optimizer_offload": o["offload"],
        A + "use_dynamic_bsz": o["dyn"],
        A + "ppo_micro_batch_size_per_gpu": o["micro"],
        "trainer.device": o["dev"],
    }


def _with_config(store: Store, overlay: dict[str, Any]) -> Store:
    store.ingest(VerlConfig(host="head", t=0.0, values={**store.config, **overlay}))
    return store


BASES = [pytest.param(("scenario", n), id=n) for n in NAMES]
BASES += [pytest.param(("log", n), id=n.removesuffix(".log")) for n in TIMED_LOGS]


@pytest.mark.parametrize("base", BASES)
def test_every_rule_over_a_grid_of_configs(base: tuple[str, str]) -> None:
    kind, name = base
    bad, seen = [], 0
    for o in OVERLAYS:
        store = load(name)[0] if kind == "scenario" else _store_from_log(CORPUS / name)
        store = _with_config(store, _overlay(o))
        from verl_top.diagnosis.view import View

        facts = View(store, Engine().thresholds).facts()
        assert (facts.engine, facts.rollout_tp, facts.device) == (
            o["name"],
            o["tp"],
            "npu" if o["dev"] == "npu" else "gpu",
        )
        for f in Engine().evaluate(store).findings:
            seen += 1
            bad += [(o, f.rule, why, f.advice) for why in contradictions(facts, f.advice, f.rule)]
    assert seen, "no finding to check"
    assert not bad, bad[:3]
