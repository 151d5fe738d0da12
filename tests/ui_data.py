"""Deterministic stores for the UI tests, built from the real H200 trace.

GPU samples are the real rows of tests/fixtures/h200/h200_phased_trace.jsonl (1× H200, NVML +
GPM), re-timed to 1 s apart and dealt to several hosts × 8 GPUs by phase, so the cluster has
busy, decode-like, stalled and idle GPUs: each GPU plays the real rows of its profile's phases,
rotated by its index. What the trace does not hold is constructed and marked so: host CPU /
memory / network samples, the throttle bits of the one throttled GPU, and the config.
verl steps come from tests/fixtures/verl/verl_file_sample.jsonl (verl's file-logger format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_top.model import (
    GpuInfo,
    GpuSample,
    Hello,
    HostSample,
    HostState,
    VerlConfig,
    VerlStep,
)
from verl_top.store import Store, StoreLimits

FIXTURES = Path(__file__).parent / "fixtures"
TRACE = FIXTURES / "h200" / "h200_phased_trace.jsonl"
VERL_JSONL = FIXTURES / "verl" / "verl_file_sample.jsonl"
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed so ages and windows are deterministic
H200_MEM_MIB = 150754820096 / 2**20  # nvml_static.json: total memory of the captured H200
H200_POWER_LIMIT_W = 700.0
SAMPLES = 60  # one sample a second per GPU

# Phase profiles (names of the trace's phases); a GPU plays the real rows of its profile.
PROFILES = {
    "busy": ("train_matmul_bf16", "gen_decode_memory_bound"),
    "train": ("train_matmul_bf16",),
    "decode": ("gen_decode_memory_bound",),
    "stall": ("host_stall_50pct",),
    "idle": ("idle", "idle_after"),
}
# Per host: a profile per GPU index.
DEFAULT_LAYOUT = {
    "node01": ["busy"] * 8,
    "node02": ["train"] * 4 + ["decode"] * 2 + ["idle"] * 2,
    "node03": ["stall"] * 8,
}
CONSTRUCTED_CONFIG: dict[str, Any] = {  # constructed: a plausible small-GRPO config
    "trainer.nnodes": 3,
    "trainer.n_gpus_per_node": 8,
    "data.train_batch_size": 256,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 4096,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
}


def load_trace(path: Path = TRACE) -> list[dict[str, Any]]:
    """The real trace rows, in order."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def trace_sample(row: dict[str, Any], host: str, index: int, t: float, gpm: bool) -> GpuSample:
    """A GpuSample from one trace row (GPM fields only when ``gpm``)."""
    g = row.get("gpm") or {}

    def pick(key: str) -> float | None:
        return g.get(key) if gpm else None

    def mib_s(key: str) -> float | None:
        v = pick(key)  # the trace's GPM PCIe/NVLink rates are MB/s
        return None if v is None else v * 1e6 / 2**20

    return GpuSample(
        host=host,
        t=t,
        index=index,
        util_gpu=row["util_gpu"],
        util_mem=row["util_mem"],
        mem_used_mib=row["mem_used_mib"],
        mem_total_mib=H200_MEM_MIB,
        power_w=row["power_w"],
        power_limit_w=H200_POWER_LIMIT_W,
        temp_c=row["temp_c"],
        sm_mhz=row["sm_mhz"],
        clock_reasons=None if not gpm else (0x1 if row["phase"].startswith("idle") else 0x0),
        sm_util=pick("SM_UTIL"),
        sm_occupancy=pick("SM_OCCUPANCY"),
        tensor_util=pick("ANY_TENSOR_UTIL"),
        dram_util=pick("DRAM_BW_UTIL"),
        nvlink_tx_mibs=mib_s("NVLINK_TOTAL_TX_PER_SEC"),
        nvlink_rx_mibs=mib_s("NVLINK_TOTAL_RX_PER_SEC"),
        pcie_tx_mibs=mib_s("PCIE_TX_PER_SEC"),
        pcie_rx_mibs=mib_s("PCIE_RX_PER_SEC"),
        label=row["phase"],
    )


def verl_steps(path: Path = VERL_JSONL) -> list[VerlStep]:
    """verl steps from a file-logger JSONL, arriving one per 520 s before T0 + SAMPLES."""
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    end = T0 + SAMPLES
    n = len(rows)
    return [
        VerlStep(
            host="driver",
            t=end - (n - 1 - i) * 520.0,
            step=r["step"],
            metrics=r["data"],
            source="jsonl",
        )
        for i, r in enumerate(rows)
    ]


def build_store(
    layout: dict[str, list[str]] | None = None,
    *,
    no_gpm_hosts: tuple[str, ...] = ("node03",),
    down: dict[str, str] | None = None,
    throttled: tuple[tuple[str, int], ...] = (("node01", 3),),
    steps: bool = False,
    config: bool = False,
    samples: int = SAMPLES,
) -> Store:
    """A store as a 1 Hz monitor would hold it after ``samples`` seconds.

    ``no_gpm_hosts`` report NVML only (older GPUs, no GPM); ``down`` maps hosts to the reason
    their connection dropped halfway; ``throttled`` GPUs carry a (constructed) SW power-cap bit.
    """
    layout = DEFAULT_LAYOUT if layout is None else layout
    down = down or {}
    rows = load_trace()
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_phase.setdefault(row["phase"], []).append(row)
    end = T0 + samples
    store = Store(StoreLimits(window_s=300.0, points=600), wall_clock=lambda: end)
    for hi, (host, profiles) in enumerate(layout.items()):
        gpm = host not in no_gpm_hosts
        store.ingest(
            Hello(
                host=host,
                t=T0,
                agent_version="test",
                backend="replay",
                driver="580.159.04",
                gpus=[
                    GpuInfo(
                        index=i,
                        name="NVIDIA H200",
                        mem_total_mib=H200_MEM_MIB,
                        power_limit_w=H200_POWER_LIMIT_W,
                        gpm=gpm,
                    )
                    for i in range(len(profiles))
                ],
                cpu_count=192,
                mem_total_bytes=2 * 2**40,
                interval=1.0,
            ),
            received=T0,
        )
        pools = [[r for ph in PROFILES[p] for r in by_phase[ph]] for p in profiles]
        cut = samples // 2 if host in down else samples
        for k in range(cut):
            t = T0 + 1 + k
            for i, pool in enumerate(pools):
                s = trace_sample(pool[(k + 7 * i + 3 * hi) % len(pool)], host, i, t, gpm)
                if (host, i) in throttled and s.clock_reasons is not None:
                    s.clock_reasons |= 0x4  # constructed: SW power cap
                store.ingest(s, received=t)
            busy = sum(1 for p in profiles if p != "idle") / max(1, len(profiles))
            store.ingest(  # constructed host activity, deterministic
                HostSample(
                    host=host,
                    t=t,
                    cpu_pct=12.0 + 40.0 * busy + (k % 5),
                    iowait_pct=(9.5 if profiles and profiles[0] == "stall" else 0.4),
                    mem_used_bytes=int((300 + 10 * hi) * 2**30),
                    mem_total_bytes=2 * 2**40,
                    net_rx_bps=1.2e9 * busy,
                    net_tx_bps=0.9e9 * busy,
                ),
                received=t,
            )
        if host in down:
            store.ingest(
                HostState(host=host, t=T0 + cut, state="down", reason=down[host]), received=T0 + cut
            )
    if steps:
        for st in verl_steps():
            store.ingest(st, received=st.t)
    if config:
        store.ingest(
            VerlConfig(host="driver", t=end, values=dict(CONSTRUCTED_CONFIG), source="constructed"),
            received=end,
        )
    return store


def scale_store(hosts: int, gpus_per_host: int = 8, samples: int = 120) -> Store:
    """A bigger store (``hosts`` × ``gpus_per_host``) for refresh-cost measurements."""
    cycle = ["busy", "train", "decode", "stall", "idle"]
    layout = {
        f"gpu{h:03d}": [cycle[(h + i) % len(cycle)] for i in range(gpus_per_host)]
        for h in range(hosts)
    }
    return build_store(layout, no_gpm_hosts=(), throttled=(), samples=samples)
