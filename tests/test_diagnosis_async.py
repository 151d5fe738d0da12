"""verl v0.9.0 logs of every trainer mode are recognised and judged by that mode's logic.

tests/fixtures/verl09/ holds one CONSTRUCTED log per trainer mode (legacy, V1 sync, V1
colocate_async, V1 separate_async, one-step-off, fully async; tests/fixtures/PROVENANCE.md says
how each follows verl's metric code at v0.9.0). expected.yaml, written before verl-top ran on
them, gives the mode, version range, engine, backend, GPUs, the lead rule, the rules that must
fire or pass, and text that must appear nowhere (vLLM tuning for an async wait, "try one-step-off"
for a one-step-off run, NVIDIA-only wording for an NPU run, a request for an NCCL log when the
verl log names the transport). Each runs ``verl-top diagnose --verl-log FILE`` (text and --json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from verl_top.cli import main
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.step3_async import best_split
from verl_top.model import GpuInfo, GpuProcess, GpuSample, Hello, ProcessList, VerlConfig
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.verl.keys import MODES
from verl_top.verl.parse import parse_file

FIX = Path(__file__).resolve().parent / "fixtures" / "verl09"
CASES = yaml.safe_load((FIX / "expected.yaml").read_text())


def _diagnose(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    main(["diagnose", "--verl-log", str(path), "--json", "--duration", "1"])
    doc = json.loads(capsys.readouterr().out)
    main(["diagnose", "--verl-log", str(path), "--duration", "1"])
    return doc, capsys.readouterr().out


def _checks(doc: dict) -> dict[str, str]:
    return {c["rule"]: c["status"] for step in doc["steps"] for c in step["checks"]}


def test_every_mode_has_a_log() -> None:
    assert {c["mode"] for c in CASES} == set(MODES)  # every trainer mode verl v0.9 has
    assert sorted(c["file"] for c in CASES) == sorted(p.name for p in FIX.glob("*.log"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["file"].removesuffix(".log"))
def test_mode_is_recognised_and_judged(case: dict, capsys: pytest.CaptureFixture[str]) -> None:
    doc, text = _diagnose(FIX / case["file"], capsys)
    verl = doc["verl"]
    assert verl["trainer_mode"] == case["mode"], verl
    assert verl["version_range"] == case["versions"], verl
    assert (verl["engine"], verl["backend"]) == (case["engine"], case["backend"])
    assert verl["pools"]["total"] == case["gpus"]
    assert verl["device"] == case.get("device", "gpu")
    assert doc["bottleneck"]["rule"] == case["lead"], doc["bottleneck"]
    status = _checks(doc)
    for rule in case["findings"]:
        assert status[rule] == "finding", (rule, status)
    for rule in case["passed"]:
        assert status[rule] == "passed", (rule, status)
    dumped = json.dumps(doc)
    for word in case["absent"]:
        assert word not in text and word not in dumped, word
    assert "verl: verl " + case["versions"] in text  # the text report names the flavour


def _lead(doc: dict) -> dict:
    return next(f for f in doc["findings"] if f["rule"] == doc["bottleneck"]["rule"])


def test_separate_async_split_moves_gpus_to_the_rollout(capsys: pytest.CaptureFixture[str]) -> None:
    """expected.yaml: 493 trainer GPU-s vs 1201 rollout GPU-s, TP 2: 6 + 10 gives ~124.6 s."""
    doc, _ = _diagnose(FIX / "v1_separate_async_trainer_starved.log", capsys)
    lead = _lead(doc)
    assert lead["data"]["slow_side"] == "rollout"
    assert lead["data"]["split"] == {"trainer": 6, "rollout": 10}
    assert lead["worth"]["save_s_per_step_max"] == pytest.approx(150.1 - 124.6, abs=0.3)
    assert "move 2 GPUs to the rollout" in lead["advice"]


def test_fully_async_rollouter_idle_at_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """expected.yaml: rollouter idle 46 %, trainer 98 % busy: 10 trainer + 6 rollout GPUs."""
    doc, _ = _diagnose(FIX / "fully_async_rollouter_idle_at_cap.log", capsys)
    lead = _lead(doc)
    assert lead["data"]["slow_side"] == "trainer"
    assert lead["data"]["rollout_idle"] == pytest.approx(0.456, abs=0.01)
    assert lead["data"]["trainer_idle_verl"] == pytest.approx(
        lead["data"]["trainer_idle"], abs=1e-3
    )
    assert lead["data"]["split"] == {"trainer": 10, "rollout": 6}
    assert lead["worth"]["save_s_per_step_max"] == pytest.approx(180.0 - 142.7, abs=0.5)
    assert "staleness_threshold" in lead["advice"]


def test_fully_async_trainer_starved_reads_the_doubled_param_sync(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc, text = _diagnose(FIX / "fully_async_trainer_starved.log", capsys)
    lead = _lead(doc)
    assert lead["data"]["slow_side"] == "rollout"
    assert lead["data"]["split"] == {"trainer": 6, "rollout": 10}
    detail = next(
        c["detail"] for s in doc["steps"] for c in s["checks"] if c["rule"] == "sync.weight_push"
    )
    assert "timing_s/timing_s/param_sync 5.1 s" in detail


def test_one_step_off_weight_sync_counts_update_weights_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc, _ = _diagnose(FIX / "one_step_off_weight_sync_51pct.log", capsys)
    lead = _lead(doc)
    assert lead["data"]["key"] == "timing_s/sync_rollout_weights"
    assert lead["data"]["share"] == pytest.approx(0.51, abs=0.01)
    assert any("contains timing_s/update_weights" in e for e in lead["evidence"])
    # The split is balanced once the sync is taken out of the rollout's window.
    balance = next(
        c for s in doc["steps"] for c in s["checks"] if c["rule"] == "flow.async_balance"
    )
    assert balance["status"] == "passed" and "balanced" in balance["detail"]


def test_best_split_is_the_shortest_step() -> None:
    split = best_split(493.0, 1201.0, 16, 2, 4.5)
    assert split is not None and (split.trainer, split.rollout) == (6, 10)
    assert split.step_s == pytest.approx(1201 / 10 + 4.5)
    one = best_split(100.0, 100.0, 2, 1, 0.0)
    assert one is not None and (one.trainer, one.rollout) == (1, 1)


def _store_with_gpus(log: str, pools: dict[str, list[int]], activity: dict[str, float]) -> Store:
    """A store holding a fixture's steps and config plus GPU samples per pool (trainer GPUs
    run a WorkerDict, rollout GPUs only vLLM engine processes)."""
    parsed = parse_file(FIX / log)
    store = Store()
    pipe = Pipeline(store)
    pipe.emit(VerlConfig(host="h0", t=1.0, values=parsed.config or {}))
    for rec in parsed.steps:
        pipe.emit(rec)
    gpus = [i for ids in pools.values() for i in ids]
    pipe.emit(Hello(host="h0", t=1.0, gpus=[GpuInfo(index=i, name="NVIDIA H200") for i in gpus]))
    procs = []
    for pool, ids in pools.items():
        cmd = (
            "ray::WorkerDict.actor_rollout_update_actor"
            if pool == "trainer"
            else "VLLM::EngineCore"
        )
        procs += [GpuProcess(pid=100 + i, gpu_index=i, cmd=cmd) for i in ids]
    pipe.emit(ProcessList(host="h0", t=2.0, procs=procs))
    for t in range(2, 40):
        for pool, ids in pools.items():
            for i in ids:
                pipe.emit(GpuSample(host="h0", t=float(t), index=i, util_gpu=activity[pool]))
    return store


def test_verls_rollouter_idle_ratio_and_the_gpus_disagree() -> None:
    """verl's rollouter idle_ratio is 0 unless it paused at the cap (issues #6693, #7601): with
    the rollout GPUs 30 % busy verl-top says the two disagree."""
    store = _store_with_gpus(
        "fully_async_trainer_starved.log",
        {"trainer": list(range(8)), "rollout": list(range(8, 16))},
        {"trainer": 95.0, "rollout": 30.0},
    )
    verdict = Engine().evaluate(store)
    lead = next(f for f in verdict.findings if f.rule == "flow.async_balance")
    text = " ".join(lead.evidence)
    assert "rollouter/idle_ratio 0 %, but the rollout GPUs were 30 % busy: they disagree" in text
    assert "rollout GPUs 30 % busy" in text and "trainer GPUs 95 % busy" in text


def test_config_mismatch_counts_the_rollout_pool() -> None:
    """8 trainer + 8 standalone rollout GPUs: 16 GPUs seen is right, 8 is not."""
    half = {"trainer": list(range(8)), "rollout": list(range(8, 16))}
    store = _store_with_gpus(
        "v1_separate_async_trainer_starved.log", half, {"trainer": 80.0, "rollout": 90.0}
    )
    check = next(c for c in Engine().evaluate(store).checks if c.rule == "map.config_mismatch")
    assert check.status == "passed" and "16 GPUs configured" in check.detail
    store = _store_with_gpus(
        "v1_separate_async_trainer_starved.log", {"trainer": list(range(8))}, {"trainer": 80.0}
    )
    found = next(f for f in Engine().evaluate(store).findings if f.rule == "map.config_mismatch")
    assert "8 trainer + 8 rollout GPUs" in found.title and "= 16, GPUs seen = 8" in found.title


def test_a_standalone_rollout_pool_is_always_generating() -> None:
    """The scenario's 8 rollout GPUs replay real decode rows (98 % NVML util, low tensor
    util) beside 8 training GPUs: decode on a rollout pool is its job, not misleading util."""
    from verl_top.protocol import read_recording

    scen = Path(__file__).resolve().parent / "scenarios" / "flow_async_balance"
    store = Store()
    for rec in read_recording(scen / "recording.ndjson"):
        store.ingest(rec)
    checks = {c.rule: c for c in Engine().evaluate(store).checks}
    assert checks["gpu.util_misleading"].status != "finding", checks["gpu.util_misleading"]
    assert checks["flow.async_balance"].status == "finding"
