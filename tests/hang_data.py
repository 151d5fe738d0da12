"""Building blocks for the hang and straggler tests: a verl job's history from a real log, GPU
samples from the real H200 trace, process lists as the agent sends them.

Real: the step timings (tests/fixtures/verl/real_h200_verl050_grpo_hf_40steps.log, verl 0.5.0 on
1x H200), the busy and idle GPU rows (tests/fixtures/agent/h200_phased_trace.jsonl) and the
WorkerDict title format (``ray::WorkerDict.actor_rollout_generate_sequences``, seen on that job).
Constructed, and said where used: an NCCL spin sample (NVML util 100 % with SM activity ~3 %,
the hang signature of reference/gpu_comm.md §2.5; no capture of one exists yet), pids, ranks and
the job-process records (``JobProcessRecord`` mirrors the agent's record field for field until it
is in verl_top/model.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_top.model import GpuInfo, GpuProcess, GpuSample, Hello, LogLines, ProcessList
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

FIX = Path(__file__).resolve().parent / "fixtures"
LOG_40 = FIX / "verl" / "real_h200_verl050_grpo_hf_40steps.log"
T0 = 1_767_000_000.0


def _trace() -> dict[str, list[dict[str, Any]]]:
    phases: dict[str, list[dict[str, Any]]] = {}
    for line in (FIX / "agent" / "h200_phased_trace.jsonl").read_text().splitlines():
        row = json.loads(line)
        phases.setdefault(row["phase"], []).append(row)
    return phases


TRACE = _trace()
BUSY = [r for r in TRACE["gen_decode_memory_bound"] if r["util_gpu"] > 50]
IDLE = TRACE["idle_after"]


@dataclass
class JobProcessRecord:
    """The agent's job-process record (issue 29 M2), field for field."""

    pid: int
    ppid: int | None = None
    user: str = ""
    state: str = "R"
    title: str = ""
    method: str | None = None
    method_since: float | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    gpus: list[int] = field(default_factory=list)
    role: str = ""


def gpu(host: str, idx: int, t: float, kind: str, k: int = 0, **over: Any) -> GpuSample:
    """One GPU sample: ``busy`` / ``idle`` are real H200 rows, ``spin`` is constructed."""
    if kind == "spin":
        return GpuSample(
            host=host, t=t, index=idx, util_gpu=100.0, sm_util=3.0, sm_mhz=1980.0, **over
        )
    row = (BUSY if kind == "busy" else IDLE)[k % len(BUSY if kind == "busy" else IDLE)]
    g = row["gpm"]
    values: dict[str, Any] = {
        "util_gpu": float(row["util_gpu"]),
        "sm_util": g["SM_UTIL"],
        "tensor_util": g["ANY_TENSOR_UTIL"],
        "sm_mhz": float(row["sm_mhz"]),
        "power_w": row["power_w"],
    }
    values.update(over)
    return GpuSample(host=host, t=t, index=idx, **values)


def hello(host: str, n: int, t: float) -> Hello:
    return Hello(
        host=host,
        t=t,
        backend="replay",
        gpus=[GpuInfo(index=i, name="NVIDIA H200", gpm=True) for i in range(n)],
    )


def worker(pid: int, idx: int, method: str, cpu: float, rank: int | None = None) -> GpuProcess:
    """A WorkerDict GPU process with its live title (``method`` "" = idle)."""
    title = "ray::WorkerDict" + (f".{method}" if method else "")
    return GpuProcess(
        pid=pid, gpu_index=idx, used_mib=40000.0, cmd=title, cpu_pct=cpu, env_rank=rank
    )


def history(store_pipeline: Pipeline, t: float, log: Path = LOG_40) -> None:
    """The real log's steps (timings) as the agent's follower would send them."""
    lines = log.read_text(errors="replace").splitlines()
    store_pipeline.emit(LogLines(host="head", t=t, path=str(log), kind="verl", lines=lines))


def new_pipeline() -> tuple[Store, Pipeline]:
    store = Store()
    return store, Pipeline(store, wall_clock=lambda: store.now or T0)


def with_jobs(plist: ProcessList, jobs: list[JobProcessRecord]) -> ProcessList:
    """``plist`` carrying the agent's job-process records (``ProcessList.job_procs``)."""
    procs = [dataclasses.replace(p, rank=p.env_rank) for p in plist.procs]  # as annotate does
    plist = dataclasses.replace(plist, procs=procs)
    plist.job_procs = jobs  # type: ignore[attr-defined]  # until the field is in model.py
    return plist
