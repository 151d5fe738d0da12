"""Rollout-server rules (flow.rollout_queue, flow.kv_cache_pressure) on stores built from
records, and the diagnosis over the real Prometheus using DCGM's SM/tensor/DRAM activity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from verl_top.diagnosis.findings import Finding
from verl_top.diagnosis.step3_rollout import flow_kv_cache_pressure, flow_rollout_queue
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import GpuInfo, GpuSample, Hello, RolloutSample
from verl_top.store import Store

ROOT = Path(__file__).resolve().parents[1]
TH = Thresholds()


def store_with(waiting: float, running: float, kv: float | None, preempt: float = 0.0) -> Store:
    store = Store()
    store.ingest(Hello(host="n1", t=1000.0, gpus=[GpuInfo(0)]))
    for i in range(20):
        t = 1000.0 + 5 * i
        store.ingest(
            GpuSample(host="n1", t=t, index=0, util_gpu=99, sm_util=30, tensor_util=5, dram_util=62)
        )
        store.ingest(
            RolloutSample(
                host="10.0.0.1:8000", t=t, server="vllm", waiting=waiting, running=running,
                kv_cache_pct=kv, preemptions_s=preempt,
            )
        )  # fmt: skip
    return store


def test_queue_found_with_slot_advice_and_dcgm_evidence() -> None:
    result = flow_rollout_queue(View(store_with(20, 16, 50), TH), TH)
    assert isinstance(result, Finding) and result.rule == "flow.rollout_queue"
    assert "20 waiting vs 16 running" in result.title
    assert "max_num_seqs" in result.advice  # KV cache has room: slots are the limit
    assert any("SM active 30 %, tensor active 5 %, DRAM active 62 %" in e for e in result.evidence)


def test_queue_with_full_kv_cache_points_at_memory() -> None:
    result = flow_rollout_queue(View(store_with(20, 16, 95), TH), TH)
    assert isinstance(result, Finding) and "gpu_memory_utilization" in result.advice


def test_small_queue_passes_and_no_servers_is_no_data() -> None:
    assert flow_rollout_queue(View(store_with(2, 16, 50), TH), TH).status == "passed"
    empty = flow_rollout_queue(View(Store(), TH), TH)
    assert empty.status == "no_data" and "--prometheus" in empty.detail


def test_kv_pressure_from_preemptions_and_from_fill() -> None:
    by_preempt = flow_kv_cache_pressure(View(store_with(0, 32, 70, preempt=0.2), TH), TH)
    assert isinstance(by_preempt, Finding) and "12.0 preemptions/min" in by_preempt.title
    by_fill = flow_kv_cache_pressure(View(store_with(0, 32, 96), TH), TH)
    assert isinstance(by_fill, Finding) and "96 % full" in by_fill.title
    assert flow_kv_cache_pressure(View(store_with(0, 32, 60), TH), TH).status == "passed"
    # An unknown KV cache is no data, never "0 % full".
    assert flow_kv_cache_pressure(View(store_with(0, 32, None), TH), TH).status == "passed"


def test_diagnose_over_prometheus_uses_dcgm_sm_and_tensor(prom_cluster: dict) -> None:
    """The constructed busy H100 (util 100, SM 0.30, tensor 0.05, DRAM 0.60 on real labels)."""
    url = prom_cluster["server"].url
    out = subprocess.run(
        [
            sys.executable, "-m", "verl_top", "diagnose", "--json", "--prometheus", url,
            "--prom-selector", 'job="dcgm-busy"', "--prom-rollout-selector", 'job="vllm"',
            "--prom-interval", "1", "--duration", "2.5",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    findings = {f["rule"]: f for f in verdict["findings"]}
    assert verdict["bottleneck"]["step"] == 1
    misleading = findings["gpu.util_misleading"]
    text = " ".join(misleading["evidence"])
    assert "NVML util 100 %" in text and "SM util 30 %" in text and "tensor util 5 %" in text
    idle = findings["gpu.idle"]
    assert "8 of 8 GPUs idle" in idle["title"]  # activity = DCGM SM active 30 % < 50 %
    checks = {c["rule"]: c for step in verdict["steps"] for c in step["checks"]}
    assert checks["flow.rollout_queue"]["status"] == "passed"  # the real idle vLLM server


def test_snapshot_keeps_the_rollout_servers_and_their_verdict(tmp_path: Path) -> None:
    from verl_top.export.snapshot import write_snapshot
    from verl_top.monitor import assess_store
    from verl_top.protocol import read_recording

    scen = ROOT / "tests" / "scenarios" / "flow_rollout_queue" / "recording.ndjson"
    store = Store()
    for rec in read_recording(scen):
        store.ingest(rec)
    out = write_snapshot(store, assess_store(store), tmp_path / "snap")
    replayed = Store(store.limits)
    for rec in read_recording(out / "recording.ndjson.gz"):
        replayed.ingest(rec)
    assert set(replayed.rollout) == set(store.rollout) and len(store.rollout) == 4
    for name, entry in store.rollout.items():
        again = replayed.rollout[name]
        assert len(again.history) == len(entry.history) == 31
        assert (again.latest.waiting, again.latest.model) == (24.0, "facebook/opt-125m")
    assert assess_store(replayed).bottleneck_rule == "flow.rollout_queue"
