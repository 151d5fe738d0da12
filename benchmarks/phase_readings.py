"""Compare verl-top's readings with nvidia-smi's, phase by phase (real-GPU check).

    python3 benchmarks/phase_readings.py --phases phases.json --recording rec.ndjson.gz \
        --agent-smi agent_smi.ndjson --smi smi.csv [--json-out readings.json]

--recording: verl-top's own recording (pynvml backend, `--record`); --agent-smi: raw NDJSON of the
agent forced to its nvidia-smi backend; --smi: `nvidia-smi --query-gpu=timestamp,utilization.gpu,
utilization.memory,memory.used,power.draw,temperature.gpu,clocks.sm --format=csv,noheader,nounits
-lms 500` run alongside. The first and last 1.5 s of each phase are left out (transitions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime

from verl_top.model import GpuSample
from verl_top.protocol import Decoder, read_recording

EDGE_S = 1.5
METRICS = (
    "util_gpu",
    "util_mem",
    "mem_used_mib",
    "power_w",
    "temp_c",
    "sm_mhz",
    "sm_util",
    "tensor_util",
    "dram_util",
)
SMI_COLS = ("util_gpu", "util_mem", "mem_used_mib", "power_w", "temp_c", "sm_mhz")


def _smi_rows(path: str) -> list[tuple[float, dict[str, float]]]:
    rows = []
    for line in open(path, encoding="utf-8"):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 1 + len(SMI_COLS):
            continue
        try:
            ts = time.mktime(datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timetuple())
            ts += float("0." + parts[0].rsplit(".", 1)[1])
            rows.append((ts, {c: float(v) for c, v in zip(SMI_COLS, parts[1:], strict=True)}))
        except ValueError:
            continue
    return rows


def _gpu_rows(records) -> list[tuple[float, dict[str, float]]]:
    return [
        (r.t, {m: getattr(r, m) for m in METRICS if getattr(r, m) is not None})
        for r in records
        if isinstance(r, GpuSample) and r.index == 0
    ]


def _phase_means(rows, start: float, end: float) -> dict[str, float]:
    inner = [v for t, v in rows if start + EDGE_S <= t <= end - EDGE_S]
    out: dict[str, float] = {"n": float(len(inner))}
    for key in METRICS:
        vals = [v[key] for v in inner if key in v]
        if vals:
            out[key] = round(statistics.fmean(vals), 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--phases", required=True)
    p.add_argument("--recording", required=True)
    p.add_argument("--agent-smi", required=True)
    p.add_argument("--smi", required=True)
    p.add_argument("--json-out")
    args = p.parse_args()
    phases = json.load(open(args.phases))["phases"]
    nvml = _gpu_rows(read_recording(args.recording))
    dec = Decoder()
    smi_agent = _gpu_rows(list(dec.decode_all(open(args.agent_smi, encoding="utf-8"))))
    smi = _smi_rows(args.smi)
    result = []
    for ph in phases:
        row = {
            "phase": ph["phase"],
            "verl_top_pynvml": _phase_means(nvml, ph["start"], ph["end"]),
            "verl_top_smi_backend": _phase_means(smi_agent, ph["start"], ph["end"]),
            "nvidia_smi": _phase_means(smi, ph["start"], ph["end"]),
        }
        result.append(row)
    print("| phase | metric | verl-top (pynvml) | verl-top (nvidia-smi backend) | nvidia-smi |")
    print("|---|---|---|---|---|")
    for row in result:
        for m in METRICS:
            a, b, c = (
                row[k].get(m, "—")
                for k in ("verl_top_pynvml", "verl_top_smi_backend", "nvidia_smi")
            )
            print(f"| {row['phase']} | {m} | {a} | {b} | {c} |")
        n = [int(row[k]["n"]) for k in ("verl_top_pynvml", "verl_top_smi_backend", "nvidia_smi")]
        print(f"| {row['phase']} | samples | {n[0]} | {n[1]} | {n[2]} |")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
