"""Builds the bundled demo recording (``verl-top --demo``) from the real H200 trace.

    python -m verl_top.demo            # rewrites verl_top/data/demo.ndjson.gz and demo_verl.log

Four nodes x 8 GPUs run a GRPO-like verl job. Every GPU sample is a real sample from the H200
trace, chosen by the verl stage running at that second: decode-like (memory-bound) samples
during ``gen``, bf16 GEMM samples during ``old_log_prob``/``ref``/``update_actor``, idle samples
while the driver computes reward and advantages. Rollout has a long tail: GPUs finish their
requests at different times and wait idle for the slowest. The verl log lines carry stage times
that match those phases. The output is deterministic (fixed seed, gzip mtime 0).
"""

from __future__ import annotations

import gzip
import json
import pprint
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from verl_top.model import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    Hello,
    HostSample,
    NcclInfo,
    ProcessList,
    Record,
    VerlConfig,
    VerlStep,
)
from verl_top.protocol import encode

T0 = 1764662400.0  # fixed start time keeps the output byte-identical between builds
HOSTS = ("node01", "node02", "node03", "node04")
GPUS = 8
MEM_TOTAL_MIB = 143771.0
STEPS = 12
TESTING_STEP = 6
TESTING_S = 8.0

# Stage plan of one step: (stage, seconds, trace phase that the GPUs show meanwhile).
STAGES: tuple[tuple[str, float, str], ...] = (
    ("gen", 18.5, "gen_decode_memory_bound"),
    ("reward", 1.2, "idle"),
    ("old_log_prob", 2.2, "train_matmul_bf16"),
    ("ref", 1.8, "train_matmul_bf16"),
    ("adv", 0.4, "idle"),
    ("update_actor", 5.0, "train_matmul_bf16"),
    ("update_weights", 0.9, "host_stall_50pct"),
)
MEM_BY_STAGE = {"gen": 0.86, "update_actor": 0.64, "old_log_prob": 0.55, "ref": 0.55}

CONFIG = {
    "data.train_batch_size": 256,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 4096,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.enforce_eager": False,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.max_num_seqs": 256,
    "actor_rollout_ref.rollout.over_sample_rate": 0,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.model.use_remove_padding": True,
    "reward_model.launch_reward_fn_async": False,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 4,
    "trainer.balance_batch": True,
    "trainer.test_freq": TESTING_STEP,
    "trainer.save_freq": -1,
    "trainer.logger": ["console", "wandb"],
}


@dataclass
class Trace:
    """Real trace samples grouped by phase."""

    by_phase: dict[str, list[dict]]

    @classmethod
    def load(cls) -> Trace:
        text = (resources.files("verl_top") / "data" / "h200_phased_trace.jsonl").read_text()
        by_phase: dict[str, list[dict]] = {}
        for line in text.splitlines():
            row = json.loads(line)
            by_phase.setdefault(row["phase"], []).append(row)
        return cls(by_phase)

    def pick(self, phase: str, k: int) -> dict:
        rows = self.by_phase[phase]
        return rows[k % len(rows)]


def _jitter(rng: random.Random, value: float | None, rel: float = 0.03) -> float | None:
    if value is None:
        return None
    return round(max(0.0, value * (1 + rng.uniform(-rel, rel))), 2)


def _gpu_sample(
    trace: Trace, rng: random.Random, host: str, gpu: int, t: float, stage: str, phase: str, k: int
) -> GpuSample:
    row = trace.pick(phase, k)
    gpm = row["gpm"]
    mem_frac = MEM_BY_STAGE.get(stage, 0.5)

    def pct(value: float | None) -> float | None:
        jittered = _jitter(rng, value)
        return None if jittered is None else min(100.0, jittered)

    return GpuSample(
        host=host,
        t=round(t, 3),
        index=gpu,
        util_gpu=pct(row["util_gpu"]),
        util_mem=pct(row["util_mem"]),
        mem_used_mib=round(MEM_TOTAL_MIB * mem_frac + rng.uniform(-800, 800), 0),
        mem_total_mib=MEM_TOTAL_MIB,
        power_w=_jitter(rng, row["power_w"]),
        power_limit_w=700.0,
        temp_c=float(row["temp_c"] + rng.randint(-1, 2)),
        sm_mhz=float(row["sm_mhz"]),
        mem_mhz=3201.0,
        clock_reasons=None,  # the trace did not record clock-event reasons: do not invent them
        sm_util=pct(gpm.get("SM_UTIL")),
        sm_occupancy=pct(gpm.get("SM_OCCUPANCY")),
        tensor_util=pct(gpm.get("ANY_TENSOR_UTIL")),
        dram_util=pct(gpm.get("DRAM_BW_UTIL")),
        nvlink_tx_mibs=_jitter(rng, gpm.get("NVLINK_TOTAL_TX_PER_SEC")),
        nvlink_rx_mibs=_jitter(rng, gpm.get("NVLINK_TOTAL_RX_PER_SEC")),
        pcie_tx_mibs=_jitter(rng, gpm.get("PCIE_TX_PER_SEC")),
        pcie_rx_mibs=_jitter(rng, gpm.get("PCIE_RX_PER_SEC")),
        label=stage,
    )


def _hello(host: str, t: float) -> Hello:
    gpus = [
        GpuInfo(
            index=i,
            name="NVIDIA H200",
            uuid=f"GPU-demo{HOSTS.index(host):02d}{i:02d}-0000-0000-0000-000000000000",
            mem_total_mib=MEM_TOTAL_MIB,
            bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            power_limit_w=700.0,
            gpm=True,
        )
        for i in range(GPUS)
    ]
    return Hello(
        host=host,
        t=t,
        agent_version="demo",
        python="3.10.12",
        backend="replay",
        driver="580.159.04",
        nvml_version="13.580.159.04",
        gpus=gpus,
        capabilities=["gpm", "procs"],
        cpu_count=192,
        mem_total_bytes=2 * 1024**4,
        interval=1.0,
    )


def _procs(host: str, t: float, stage: str) -> ProcessList:
    h = HOSTS.index(host)
    method = {
        "gen": "",
        "old_log_prob": ".actor_rollout_compute_log_prob()",
        "ref": ".ref_compute_ref_log_prob()",
        "update_actor": ".actor_rollout_update_actor()",
    }.get(stage, "")
    procs = []
    for gpu in range(GPUS):
        rank = h * GPUS + gpu
        procs.append(
            GpuProcess(
                pid=41000 + gpu,
                gpu_index=gpu,
                used_mib=52000.0,
                user="verl",
                cmd=f"ray::WorkerDict{method}",
                cpu_pct=98.0 if method else 3.0,
                rss_bytes=38 * 1024**3,
                env_rank=rank,
                env_local_rank=gpu,
            )
        )
        procs.append(
            GpuProcess(
                pid=43000 + gpu,
                gpu_index=gpu,
                used_mib=70000.0 if stage == "gen" else 15000.0,
                user="verl",
                cmd=f"VLLM::Worker_TP{gpu % 4}",
                cpu_pct=60.0 if stage == "gen" else 1.0,
                rss_bytes=9 * 1024**3,
            )
        )
    return ProcessList(host=host, t=t, procs=procs)


def _step_metrics(
    step: int, rng: random.Random, gen_ends: list[float], with_test: bool
) -> dict[str, float]:
    stages = {name: round(sec * (1 + rng.uniform(-0.02, 0.02)), 4) for name, sec, _ in STAGES}
    core = sum(stages.values())
    metrics: dict[str, float] = {f"timing_s/{k}": v for k, v in stages.items()}
    metrics["timing_s/step"] = round(core, 4)
    if with_test:
        metrics["timing_s/testing"] = TESTING_S
    n_gpus = len(HOSTS) * GPUS
    tokens = 256 * 8 * (1024 * 0.2 + 1417)
    metrics.update(
        {
            "timing_s/agent_loop/generate_sequences/min": round(min(gen_ends) * 0.35, 3),
            "timing_s/agent_loop/generate_sequences/mean": round(
                sum(gen_ends) / len(gen_ends) * 0.55, 3
            ),
            "timing_s/agent_loop/generate_sequences/max": round(max(gen_ends), 3),
            "timing_s/agent_loop/num_preempted/max": 0,
            "perf/total_num_tokens": round(tokens),
            "perf/time_per_step": round(core, 4),
            "perf/throughput": round(tokens / core / n_gpus, 3),
            "perf/mfu/actor": round(0.31 + rng.uniform(-0.01, 0.01), 4),
            "perf/max_memory_allocated_gb": 70.9,
            "perf/max_memory_reserved_gb": 88.0,
            "response_length/mean": 1417.5,
            "response_length/max": 4096.0,
            "response_length/clip_ratio": 0.051,
            "global_seqlen/minmax_diff": 39246,
            "global_seqlen/mean": 417205.4,
            "training/global_step": step,
        }
    )
    return metrics


def _nested(flat: dict[str, object]) -> dict[str, object]:
    """Dotted keys back to the nested dict verl pretty-prints at start."""
    out: dict[str, object] = {}
    for key, value in flat.items():
        node: dict[str, Any] = out  # a dict of dicts as deep as the dotted keys
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _console_line(step: int, metrics: dict[str, float]) -> str:
    body = " - ".join(f"{k}:{v}" for k, v in metrics.items())
    return f"(TaskRunner pid=51234) step:{step} - {body}"


def build(seed: int = 7) -> tuple[list[Record], list[str]]:
    """The demo's records (time-ordered) and the matching verl console log lines."""
    trace = Trace.load()
    rng = random.Random(seed)
    records: list[Record] = [_hello(h, T0) for h in HOSTS]
    records.append(VerlConfig(host="node01", t=T0, values=dict(CONFIG), source="demo config"))
    records.append(
        NcclInfo(
            host="node01",
            t=T0,
            transport="IB+GDRDMA",
            version="2.27.3",
            nranks=32,
            nnodes=4,
            path="demo",
        )
    )
    log = [
        f"(TaskRunner pid=51234) {line}" for line in pprint.pformat(_nested(CONFIG)).splitlines()
    ]
    t = T0
    for step in range(1, STEPS + 1):
        with_test = step == TESTING_STEP
        # Each GPU finishes its rollout requests at its own time: the long tail.
        gen_ends = [rng.uniform(7.0, 17.0) for _ in range(len(HOSTS) * GPUS)]
        gen_ends[rng.randrange(len(gen_ends))] = 18.3
        plan = list(STAGES) + (
            [("testing", TESTING_S, "gen_decode_memory_bound")] if with_test else []
        )
        offset = 0.0
        for stage, secs, phase in plan:
            for s in range(int(secs)):
                now = t + offset + s
                for h, host in enumerate(HOSTS):
                    for gpu in range(GPUS):
                        ph = phase
                        if stage == "gen" and s > gen_ends[h * GPUS + gpu]:
                            ph = "idle"  # done with its requests, waiting for the slowest
                        k = int(now - T0) * 3 + gpu * 5 + h
                        records.append(_gpu_sample(trace, rng, host, gpu, now, stage, ph, k))
                    records.append(
                        HostSample(
                            host=host,
                            t=round(now, 3),
                            cpu_pct=round(
                                rng.uniform(12, 20) + (60 if stage == "reward" and h == 0 else 0), 1
                            ),
                            iowait_pct=round(rng.uniform(0.1, 0.6), 2),
                            load1=round(rng.uniform(20, 28), 2),
                            mem_used_bytes=int(0.41 * 2 * 1024**4),
                            mem_total_bytes=2 * 1024**4,
                            net_rx_bps=round(rng.uniform(2e7, 6e7)),
                            net_tx_bps=round(rng.uniform(2e7, 6e7)),
                            disk_read_bps=round(rng.uniform(0, 2e6)),
                            disk_write_bps=round(rng.uniform(0, 4e6)),
                        )
                    )
                    if s == 0:
                        records.append(_procs(host, round(now, 3), stage))
            offset += secs
        metrics = _step_metrics(step, rng, gen_ends, with_test)
        t_end = t + offset
        records.append(
            VerlStep(host="node01", t=round(t_end, 3), step=step, metrics=metrics, source="console")
        )
        log.append(_console_line(step, metrics))
        t = t_end
    records.sort(key=lambda r: r.t)
    return _start_after_first_step(records), log


def _start_after_first_step(records: list[Record]) -> list[Record]:
    """Start the recording when step 1 is logged, as if verl-top attached to a running job.

    The demo then has verl data from its first frame (no "no verl log" for half a minute and
    no verdict change when the first step arrives): samples before step 1's log line are left
    out; the hellos, config, NCCL info and each host's latest process list are stamped at it.
    """
    first = min(r.t for r in records if isinstance(r, VerlStep))
    setup: list[Record] = []
    procs: dict[str, ProcessList] = {}
    kept: list[Record] = []
    for r in records:
        if r.t >= first:
            kept.append(r)
        elif isinstance(r, Hello | VerlConfig | NcclInfo):
            r.t = first
            setup.append(r)
        elif isinstance(r, ProcessList):
            procs[r.host] = r
    for p in procs.values():
        p.t = first
    return [*setup, *procs.values(), *kept]


def write(directory: Path) -> tuple[Path, Path]:
    """Write demo.ndjson.gz and demo_verl.log into ``directory``."""
    records, log = build()
    rec_path = directory / "demo.ndjson.gz"
    with open(rec_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write("".join(encode(r) + "\n" for r in records).encode())
    log_path = directory / "demo_verl.log"
    log_path.write_text("\n".join(log) + "\n")
    return rec_path, log_path


if __name__ == "__main__":
    out = Path(__file__).parent / "data"
    for path in write(out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
