"""CI-sized run of benchmarks/engine_cost.py: it runs against the current code and writes JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_engine_cost_runs(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "engine_cost.py"), "--gpus", "16", "--runs", "2"]
        + ["--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CPU ms p50" in proc.stdout and "load average" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["gpus"] == 16 and row["steps"] > 0 and row["runs"] == 2 and row["cpu_ms_p50"] > 0
    assert "gpu.idle" in row["findings"]  # the replay trace's GPUs average below idle_pct
