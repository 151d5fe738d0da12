"""The real H200 session (tests/fixtures/h200_real): verl-top's recording must tell the phases apart.

Recorded on one NVIDIA H200 with `benchmarks/gpu_phase_readings.sh` (then `h200_session.sh`):
verl-top (pynvml backend, --record) while benchmarks/gpu_phases.py ran idle, bf16 GEMM,
decode-like and host-stalled phases.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top.diagnosis.engine import Engine
from verl_top.model import GpuSample, Hello, Record
from verl_top.protocol import Decoder, encode, read_recording
from verl_top.store import Store, StoreLimits

HERE = Path(__file__).parent / "fixtures" / "h200_real"
EDGE_S = 1.5  # leave out phase transitions


def _phases() -> dict[str, tuple[float, float]]:
    data = json.loads((HERE / "phases.json").read_text())
    return {p["phase"]: (p["start"] + EDGE_S, p["end"] - EDGE_S) for p in data["phases"]}


def _records() -> list[Record]:
    return read_recording(HERE / "h200_pynvml.ndjson.gz")


def _phase_records(phase: str) -> list[Record]:
    start, end = _phases()[phase]
    return [r for r in _records() if isinstance(r, Hello) or start <= r.t <= end]


def _verdict(phase: str):
    store = Store(StoreLimits(window_s=120, points=600))
    for rec in _phase_records(phase):
        store.ingest(rec)
    verdict = Engine().evaluate(store)
    return verdict, {f.rule for f in verdict.findings}


def test_recording_is_a_real_pynvml_session_with_gpm() -> None:
    dec = Decoder()
    records = read_recording(HERE / "h200_pynvml.ndjson.gz", dec)
    assert dec.malformed == 0
    hello = next(r for r in records if isinstance(r, Hello))
    assert hello.backend == "pynvml" and hello.gpus[0].name == "NVIDIA H200" and hello.gpus[0].gpm
    gpus = [r for r in records if isinstance(r, GpuSample)]
    assert len(gpus) > 200 and all(g.sm_util is not None for g in gpus[2:])


def test_idle_phase_is_called_idle() -> None:
    verdict, rules = _verdict("idle")
    assert verdict.bottleneck_rule == "gpu.idle" and "flow.host_stall" not in rules


def test_bf16_gemm_phase_is_healthy_compute() -> None:
    verdict, rules = _verdict("train_matmul_bf16")
    assert not rules & {"gpu.idle", "gpu.util_misleading", "flow.host_stall"}


def test_decode_phase_is_util_misleading() -> None:
    # NVML util reads ~99 % while the tensor pipes do ~13 %: memory-bound decode.
    verdict, rules = _verdict("gen_decode_memory_bound")
    assert verdict.bottleneck_rule == "gpu.util_misleading"
    finding = next(f for f in verdict.findings if f.rule == "gpu.util_misleading")
    assert any("13" in e for e in finding.evidence)


def test_host_stall_phase_is_a_host_stall_not_plain_idle() -> None:
    verdict, rules = _verdict("host_stall")
    assert verdict.bottleneck_rule == "flow.host_stall"
    assert "gpu.idle" in rules
    stall = next(f for f in verdict.findings if f.rule == "flow.host_stall")
    assert "core pinned" in stall.title


@pytest.mark.parametrize(
    ("phase", "rule"),
    [
        ("idle", "gpu.idle"),
        ("gen_decode_memory_bound", "gpu.util_misleading"),
        ("host_stall", "flow.host_stall"),
    ],
)
def test_diagnose_command_names_each_phase(tmp_path, phase: str, rule: str) -> None:
    rec = tmp_path / f"{phase}.ndjson.gz"
    with gzip.open(rec, "wt", encoding="utf-8") as fh:
        for r in _phase_records(phase):
            fh.write(encode(r) + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_top",
            "diagnose",
            "--replay",
            str(rec),
            "--json",
            "--interval",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout)["bottleneck"]["rule"] == rule
