"""Build the diagnosis scenarios (recordings + expected verdicts) from the real fixtures.

Run ``python tests/scenarios/build.py``; the output is deterministic and committed. Each
scenario directory holds ``recording.ndjson`` (verl_top.protocol lines), ``expected.json``
({"step", "rule"}; null/null = healthy) and, for map.topology, ``topology.json``.

Real inputs (tests/fixtures/): the H200 phased trace (NVML + GPM per phase), the verl
file-logger sample, a real verl driver log (Qwen2.5-0.5B), a real NCCL_DEBUG=INFO log and a
real 2-node nccl-tests run. What is constructed on top (re-timed samples, GPU count, stage
times changed to show one problem) is said in each scenario's ``note``.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verl_top.model import (  # noqa: E402
    GpuInfo,
    GpuProcess,
    GpuSample,
    Hello,
    HostSample,
    LogEvent,
    NcclInfo,
    ProbeResult,
    ProbeRow,
    ProcessList,
    Record,
    RolloutSample,
    VerlConfig,
    VerlStep,
)
from verl_top.protocol import encode  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
OUT = Path(__file__).resolve().parent
T_END = 1_767_000_000.0  # data time of the last record of every scenario
H200_MIB = 150754820096 / 2**20  # nvml_static.json mem.total
WATCHDOG = (
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
    "Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)  # real line quoted in reference/gpu_comm.md §2.5


def trace() -> dict[str, list[dict[str, Any]]]:
    """Real H200 trace rows by phase (the ramp row of each busy phase dropped)."""
    phases: dict[str, list[dict[str, Any]]] = {}
    for line in (FIX / "h200" / "h200_phased_trace.jsonl").read_text().splitlines():
        row = json.loads(line)
        phases.setdefault(row["phase"], []).append(row)
    phases["train_matmul_bf16"] = [r for r in phases["train_matmul_bf16"] if r["util_gpu"] > 0]
    return phases


TRACE = trace()


def hello(host: str, n: int) -> Hello:
    gpus = [
        GpuInfo(index=i, name="NVIDIA H200", mem_total_mib=H200_MIB, power_limit_w=700.0, gpm=True)
        for i in range(n)
    ]
    return Hello(host=host, t=T_END - 3000, backend="replay", gpus=gpus, interval=1.0)


def sample(
    host: str, idx: int, t: float, row: dict[str, Any], reasons: int | None = None
) -> GpuSample:
    g = row["gpm"]
    return GpuSample(
        host=host,
        t=round(t, 3),
        index=idx,
        util_gpu=row["util_gpu"],
        util_mem=row["util_mem"],
        mem_used_mib=row["mem_used_mib"],
        mem_total_mib=H200_MIB,
        power_w=row["power_w"],
        temp_c=row["temp_c"],
        sm_mhz=row["sm_mhz"],
        clock_reasons=reasons,
        sm_util=g["SM_UTIL"],
        sm_occupancy=g["SM_OCCUPANCY"],
        tensor_util=g["ANY_TENSOR_UTIL"],
        dram_util=g["DRAM_BW_UTIL"],
    )


def timeline(
    host: str,
    idx: int,
    segments: list[tuple[str, float]],
    end: float = T_END,
    reasons: int | None = None,
) -> list[Record]:
    """1 Hz samples of one GPU ending at ``end``: real rows of each phase, cycled, re-timed."""
    total = sum(d for _, d in segments)
    out: list[Record] = []
    t = end - total
    for phase, dur in segments:
        rows = TRACE[phase]
        for k in range(int(dur)):
            out.append(sample(host, idx, t + k, rows[k % len(rows)], reasons))
        t += dur
    return out


def gpus(host: str, n: int, segments: list[tuple[str, float]], **kw: Any) -> list[Record]:
    recs: list[Record] = [hello(host, n)]
    for i in range(n):
        recs += timeline(host, i, segments, **kw)
    return recs


def procs(host: str, used: list[int]) -> ProcessList:
    return ProcessList(
        host=host,
        t=T_END - 1,
        procs=[
            GpuProcess(
                pid=1000 + i,
                gpu_index=i,
                used_mib=60000,
                cmd="ray::WorkerDict",
                role="actor_rollout",
                rank=i,
            )
            for i in used
        ],
    )


SAMPLE = [
    json.loads(line) for line in (FIX / "verl" / "verl_file_sample.jsonl").read_text().splitlines()
]
HEALTHY_STAGES = {
    "gen": 170.0,
    "reward": 2.0,
    "old_log_prob": 38.0,
    "ref": 35.0,
    "adv": 1.0,
    "update_actor": 120.0,
    "update_weights": 6.0,
}


def step_metrics(
    stages: dict[str, float], overhead: float = 8.0, **extra: float
) -> dict[str, float]:
    """Metrics of one step: the verl sample's step 11 keys with these stage times."""
    m = {
        k: v
        for k, v in SAMPLE[1]["data"].items()
        if not k.startswith("timing_s/") or k.startswith("timing_s/agent_loop")
    }
    m.update(
        {
            "timing_s/agent_loop/generate_sequences/mean": 110.0,
            "timing_s/agent_loop/generate_sequences/max": 160.0,
            "timing_s/agent_loop/num_preempted/mean": 0.0,
            "timing_s/agent_loop/num_preempted/max": 0,
        }
    )
    for k, v in stages.items():
        m[f"timing_s/{k}"] = v
    step = sum(v for k, v in stages.items() if k not in ("testing", "save_checkpoint")) + overhead
    m["timing_s/step"] = m["perf/time_per_step"] = step
    m["perf/throughput"] = m["perf/total_num_tokens"] / (step * 8)
    m.update(extra)
    return m


def steps(
    n: int,
    stages: dict[str, float] | None = None,
    end: float = T_END,
    per_step: dict[int, dict[str, float]] | None = None,
    **extra: float,
) -> list[Record]:
    """``n`` steps ending at ``end``; ``per_step`` overrides stage times of given steps."""
    ms = [
        step_metrics({**(stages or HEALTHY_STAGES), **(per_step or {}).get(i, {})}, **extra)
        for i in range(1, n + 1)
    ]
    out, t = [], end
    for i in range(n, 0, -1):
        out.append(VerlStep(host="head", t=round(t, 3), step=i, metrics=ms[i - 1], source="jsonl"))
        t -= ms[i - 1]["timing_s/step"]
    return out[::-1]


def healthy_config(**over: Any) -> VerlConfig:
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    values = {
        "trainer.n_gpus_per_node": 8,
        "trainer.nnodes": 1,
        "trainer.balance_batch": True,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "data.max_prompt_length": 1024,
        "data.max_response_length": 4096,
        a + "use_dynamic_bsz": True,
        a + "ppo_max_token_len_per_gpu": 16384,
        a + "ppo_micro_batch_size_per_gpu": None,
        a + "fsdp_config.param_offload": False,
        a + "fsdp_config.optimizer_offload": False,
        r + "tensor_model_parallel_size": 2,
        r + "gpu_memory_utilization": 0.6,
        r + "enforce_eager": False,
        r + "max_num_batched_tokens": 8192,
    }
    values.update(over)
    return VerlConfig(
        host="head", t=T_END - 3000, values=values, source="constructed from verl defaults"
    )


ANSI = re.compile(r"\x1b\[[0-9;]*m")
PREFIX = re.compile(r"^\((?:main_task|TaskRunner) pid=\d+(?:, ip=[\d.]+)?\) ?")


def real_log() -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Steps and flattened config dump of the real Qwen2.5-0.5B verl log."""
    raw = [
        ANSI.sub("", ln)
        for ln in (FIX / "verl" / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log")
        .read_text()
        .splitlines()
    ]
    lines = [PREFIX.sub("", ln) for ln in raw if PREFIX.match(ln)]  # driver lines only
    start = next(i for i, ln in enumerate(lines) if ln.startswith("{'actor_rollout_ref'"))
    buf, depth = [], 0
    for ln in lines[start:]:
        buf.append(ln)
        depth += ln.count("{") - ln.count("}")
        if depth == 0:
            break
    flat: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[prefix + k] = v

    walk(ast.literal_eval("\n".join(buf)), "")
    out = []
    for ln in lines:
        m = re.match(r"^step:(\d+) - (.*)$", ln)
        if not m:
            continue
        metrics = {}
        for tok in m.group(2).split(" - "):
            k, _, v = tok.partition(":")
            try:
                metrics[k] = float(v)
            except ValueError:
                pass
        metrics["_step"] = int(m.group(1))
        out.append(metrics)
    return out, flat


def real_steps(n: int, end: float) -> list[Record]:
    rows = [r for r in real_log()[0] if r["_step"] >= 1][:n]
    durs = [
        sum(v for k, v in r.items() if k.startswith("timing/") and k != "timing/testing")
        for r in rows
    ]
    out, t = [], end
    for r, d in zip(rows[::-1], durs[::-1], strict=True):
        out.append(
            VerlStep(
                host="head",
                t=round(t, 3),
                step=r["_step"],
                metrics={k: v for k, v in r.items() if k != "_step"},
                source="console",
            )
        )
        t -= d
    return out[::-1]


def rollout(
    servers: int, waiting: float, running: float, kv_pct: float, preempt_s: float = 0.0
) -> list[Record]:
    """vLLM servers as --prometheus reports them, every 5 s for 150 s. The labels (instance,
    model_name, server kind) follow the real vLLM V0 fixture; the gauge values are CONSTRUCTED
    (the only real capture is an idle server)."""
    return [
        RolloutSample(
            host=f"10.0.0.{10 + k}:8000",
            t=T_END - 150 + 5 * i,
            server="vllm",
            model="facebook/opt-125m",
            running=running,
            waiting=waiting,
            kv_cache_pct=kv_pct,
            gen_tokens_s=1800.0,
            preemptions_s=preempt_s,
            ttft_p50_s=0.375,
        )
        for k in range(servers)
        for i in range(31)
    ]


def pool_procs(host: str, used: list[int], cmd: str, role: str) -> ProcessList:
    """One process per GPU of a pool: the trainer's WorkerDict or a rollout engine."""
    return ProcessList(
        host=host,
        t=T_END - 1,
        procs=[
            GpuProcess(pid=2000 + i, gpu_index=i, used_mib=60000, cmd=cmd, role=role) for i in used
        ],
    )


def verl09_log(name: str) -> list[Record]:
    """A CONSTRUCTED verl v0.9.0 log of tests/fixtures/verl09 (its config and steps), the steps
    re-timed one step time apart so the last ends at T_END; step 0 (validation) left out."""
    from verl_top.verl.parse import parse_file

    parsed = parse_file(FIX / "verl09" / name)
    steps_ = [r for r in parsed.steps if r.step > 0]
    last = max(r.step for r in steps_)
    out: list[Record] = [
        VerlConfig(host="head", t=T_END - 3000, values=parsed.config or {}, source="console")
    ]
    for rec in steps_:
        step_s = rec.metrics.get("timing_s/step") or rec.metrics.get("timing_s/gen") or 1.0
        t = T_END - (last - rec.step) * step_s - (0.5 if "timing_s/step" not in rec.metrics else 0)
        out.append(VerlStep(host="head", t=round(t, 3), step=rec.step, metrics=rec.metrics))
    return out


def scenarios() -> dict[str, tuple[list[Record], dict[str, Any], str]]:
    train = [("train_matmul_bf16", 150)]
    s: dict[str, tuple[list[Record], dict[str, Any], str]] = {}

    def add(
        name: str, recs: list[Record], step: int | None, rule: str | None, note: str, **extra: Any
    ) -> None:
        s[name] = (recs, {"step": step, "rule": rule, **extra}, note)

    add(
        "healthy",
        gpus("n1", 8, train) + [procs("n1", list(range(8))), healthy_config()] + steps(8),
        None,
        None,
        "8 GPUs replaying the real bf16 GEMM phase, steps with healthy shares, verl-default config",
    )
    add(
        "gpu_idle",
        gpus("n1", 8, [("idle", 150)]),
        1,
        "gpu.idle",
        "8 GPUs replaying the real idle phase",
    )
    add(
        "gpu_util_misleading",
        gpus("n1", 8, [("gen_decode_memory_bound", 150)]),
        1,
        "gpu.util_misleading",
        "real decode-like phase (NVML 98 %, tensor 13 %) with no verl steps: phase unknown",
    )
    add(
        "gpu_throttle",
        gpus("n1", 8, train, reasons=0x4),
        1,
        "gpu.throttle",
        "GEMM phase with sw_power_cap set: the real nvidia-smi dmon capture of that phase shows pviol 96-100 %",
    )
    add(
        "tput_drop",
        steps(
            12, per_step={i: {k: v * 1.8 for k, v in HEALTHY_STAGES.items()} for i in (10, 11, 12)}
        ),
        1,
        "tput.drop",
        "healthy steps, last 3 steps 1.8x slower in every stage",
    )
    rs = real_steps(20, T_END - 300)
    add(
        "job_stalled",
        rs + gpus("n1", 1, [("idle_after", 300)]),
        1,
        "job.stalled",
        "real verl log steps 1-20, then 300 s with no step and the GPU in the real idle_after phase",
    )
    stuck = ProcessList(
        host="n1",
        t=T_END - 120,
        procs=[
            GpuProcess(
                pid=4242,
                gpu_index=0,
                used_mib=60000,
                cmd="ray::WorkerDict.actor_rollout_update_actor",
                env_rank=0,
                rank=0,
            )
        ],
    )
    add(
        "job_hang",
        real_steps(20, T_END - 125)
        + gpus("n1", 1, [("train_matmul_bf16", 180), ("idle_after", 120)])
        + [stuck],
        1,
        "job.hang",
        "real verl log steps 1-20 (timing/update_actor p95 21.0 s: overrun after 63 s); a "
        "WorkerDict (pid and title constructed, title format real) in update_actor for 120 s, "
        "its GPU in the real train phase then 120 s in the real idle_after phase",
    )
    add(
        "nccl_transport_socket",
        gpus("n1", 8, train)
        + gpus("n2", 8, train)
        + [
            NcclInfo(
                host="n1",
                t=T_END - 2000,
                transport="Socket",
                version="2.28.9",
                nranks=16,
                nnodes=2,
                path="nccl.log",
            )
        ],
        2,
        "nccl.transport_socket",
        "2x8 GPUs; NCCL transport from the real NCCL_DEBUG=INFO line 'Using network Socket'",
    )
    rows = []
    for ln in (FIX / "nccl" / "real_2node_16xH200_socket_all_reduce.txt").read_text().splitlines():
        p = ln.split()
        if len(p) == 13 and p[0].isdigit():
            rows.append(
                ProbeRow(
                    size_bytes=int(p[0]),
                    time_us=float(p[5]),
                    algbw_gbs=float(p[6]),
                    busbw_gbs=float(p[7]),
                    in_place_busbw_gbs=float(p[11]),
                )
            )

    def socket_probe(transport: str) -> ProbeResult:
        return ProbeResult(
            host="n1",
            t=T_END,
            tool="nccl-tests",
            collective="all_reduce",
            scope="inter",
            hosts=["n1", "n2"],
            nranks=16,
            rows=rows,
            busbw_max_gbs=max(r.busbw_gbs for r in rows),
            expected_gbs=8 * 46.0,
            link="2 nodes, 8x 400 Gb/s NDR IB per node",
            transport=transport,
        )

    add(
        "nccl_busbw_low",
        [socket_probe("")],
        2,
        "nccl.busbw_low",
        "real 2-node 16xH200 all_reduce rows, transport not logged; expectation 8 NDR NICs per node",
    )
    add(
        "nccl_socket",
        [socket_probe("Socket")],
        2,
        "nccl.transport_socket",
        "the same real rows with the Socket transport: RDMA off is the cause, busbw_low follows",
    )
    add(
        "sync_weight_update",
        steps(8, {**HEALTHY_STAGES, "update_weights": 80.0}),
        2,
        "sync.weight_update",
        "healthy steps with timing_s/update_weights 80 s (verl issues report ~200 s for large models)",
    )
    add(
        "sync_weight_push",
        verl09_log("one_step_off_weight_sync_51pct.log"),
        2,
        "sync.weight_push",
        "the CONSTRUCTED one-step-off v0.9.0 log: sync_rollout_weights (containing update_weights) "
        "51 % of each step, a 7B model at 0.5 GB/s",
    )
    add(
        "flow_async_balance",
        gpus("n1", 8, [("train_matmul_bf16", 150)])
        + gpus("n2", 8, [("gen_decode_memory_bound", 150)])
        + [
            pool_procs("n1", list(range(8)), "ray::DetachActorWorker.update_actor", "trainer"),
            pool_procs("n2", list(range(8)), "VLLM::EngineCore", "rollout"),
        ]
        + verl09_log("fully_async_trainer_starved.log"),
        3,
        "flow.async_balance",
        "the CONSTRUCTED fully-async v0.9.0 log (trainer waits 48 % of each weight version, the "
        "rollouter never pauses) with 8 trainer GPUs replaying the real bf16 GEMM rows and 8 "
        "rollout GPUs the real decode rows",
    )
    waits = [("train_matmul_bf16", 20), ("idle", 20)] * 4
    add(
        "sync_wait",
        gpus("n1", 8, train[:1] and [("train_matmul_bf16", 160)]) + gpus("n2", 8, waits),
        2,
        "sync.wait",
        "n1 busy throughout; n2 alternates 20 s real GEMM and 20 s real idle rows",
    )
    add(
        "nccl_watchdog",
        steps(6)
        + [
            LogEvent(
                host="n1", t=T_END, kind="watchdog", text=WATCHDOG, path="worker.err", severity=1.0
            )
        ],
        2,
        "nccl.watchdog",
        "real watchdog line from reference/gpu_comm.md §2.5",
    )
    add(
        "flow_rollout_bound",
        steps(8, {**HEALTHY_STAGES, "gen": 340.0}),
        3,
        "flow.rollout_bound",
        "gen 72 % of the step (verl#6747 reports 72 %)",
    )
    add(
        "flow_long_tail",
        [
            VerlStep(
                host="head",
                t=T_END - 1000 + 500 * i,
                step=d["step"],
                metrics=d["data"],
                source="jsonl",
            )
            for i, d in enumerate(SAMPLE)
        ],
        3,
        "flow.long_tail",
        "the verl file-logger sample unchanged (generate_sequences max 2.6x mean)",
    )
    add(
        "flow_rollout_queue",
        rollout(4, waiting=24.0, running=16.0, kv_pct=55.0),
        3,
        "flow.rollout_queue",
        "4 vLLM servers (constructed gauges): 24 waiting vs 16 running each, KV cache 55 %",
    )
    add(
        "flow_kv_cache_pressure",
        rollout(4, waiting=0.0, running=32.0, kv_pct=97.0, preempt_s=0.1),
        3,
        "flow.kv_cache_pressure",
        "4 vLLM servers (constructed gauges): KV cache 97 %, 6 preemptions/min each, no queue",
    )
    add(
        "flow_train_bound",
        real_steps(30, T_END),
        3,
        "flow.train_bound",
        "real verl log steps 1-30 (update_actor + update_critic ~ 54 % of step)",
    )
    drv = {
        **HEALTHY_STAGES,
        "gen": 60.0,
        "reward": 50.0,
        "old_log_prob": 10.0,
        "ref": 10.0,
        "update_actor": 60.0,
        "update_weights": 2.0,
    }
    add(
        "flow_driver_bound",
        steps(3, drv)
        + gpus("n1", 8, [("train_matmul_bf16", 68), ("idle", 50), ("train_matmul_bf16", 83)]),
        3,
        "flow.driver_bound",
        "reward 50 s of 201 s; GPUs replay the real idle rows during reward, GEMM rows otherwise",
    )
    add(
        "flow_logprob_slow",
        steps(8, {**HEALTHY_STAGES, "old_log_prob": 90.0, "ref": 80.0}),
        3,
        "flow.logprob_slow",
        "old_log_prob + ref ~ 33 % of the step",
    )
    host = [
        HostSample(host="n1", t=T_END - 150 + k, cpu_pct=97.0, iowait_pct=2.0) for k in range(150)
    ]
    add(
        "flow_host_stall",
        gpus("n1", 8, [("host_stall_50pct", 150)]) + host,
        3,
        "flow.host_stall",
        "real host_stall_50pct phase (SM ~21 %) with host CPU at 97 % (constructed host samples)",
    )
    add(
        "flow_periodic",
        [healthy_config(**{"trainer.test_freq": 4, "trainer.save_freq": 4})]
        + steps(12, per_step={i: {"testing": 300.0, "save_checkpoint": 500.0} for i in (4, 8, 12)}),
        3,
        "flow.periodic",
        "testing 300 s and save_checkpoint 500 s every 4 steps (test_freq = save_freq = 4): "
        "200 s a step amortized, more than gen's 170 s (Megatron checkpoints take 10480 s in "
        "verl#2860)",
    )
    imb = gpus("n1", 8, train)
    imb = [r for r in imb if not (isinstance(r, GpuSample) and r.index == 7)] + timeline(
        "n1", 7, [("host_stall_50pct", 150)]
    )
    add(
        "map_imbalance",
        imb,
        4,
        "map.imbalance",
        "7 GPUs replay the GEMM phase, GPU 7 the host_stall phase",
    )
    un = [r for r in gpus("n1", 8, train) if not (isinstance(r, GpuSample) and r.index >= 6)]
    un += (
        timeline("n1", 6, [("idle", 150)])
        + timeline("n1", 7, [("idle", 150)])
        + [procs("n1", list(range(6)))]
    )
    add("map_unused_gpu", un, 4, "map.unused_gpu", "GPUs 6-7 idle with no process while 0-5 train")
    rep_stages = {
        **HEALTHY_STAGES,
        "gen": 110.0,
        "reward": 1.0,
        "old_log_prob": 20.0,
        "ref": 15.0,
        "update_actor": 40.0,
        "update_weights": 3.0,
    }
    rep = steps(2, rep_stages) + [hello("n1", 8), healthy_config()]
    for i in range(8):
        rep += timeline(
            "n1",
            i,
            [("gen_decode_memory_bound" if i < 2 else "idle", 110), ("train_matmul_bf16", 87)],
        )
    add(
        "map_rollout_replicas",
        rep,
        4,
        "map.rollout_replicas",
        "rollout TP 2 on 8 GPUs but only GPUs 0-1 run the real decode phase during gen",
    )
    add(
        "map_seqlen_imbalance",
        steps(
            8,
            {**HEALTHY_STAGES, "update_actor": 160.0},
            **{
                "global_seqlen/minmax_diff": 78170.0,
                "global_seqlen/mean": 458966.5,
                # verl logs global_seqlen/* only with balance_batch on; balanced_* is what the
                # ranks got. In verl#7412 balancing evened them out (458960/458975); here it is
                # CONSTRUCTED to leave one rank with 1.5x the mean (a few very long samples it
                # cannot split), so the others wait a third of the update.
                "global_seqlen/balanced_min": 229483.0,
                "global_seqlen/balanced_max": 688449.0,
            },
        ),
        4,
        "map.seqlen_imbalance",
        "global_seqlen mean from the real log in verl#7412; balanced_* constructed (one rank at "
        "1.5x the mean) and update_actor 160 s, so the wait is 53 s of a 420 s step",
    )
    add(
        "map_topology",
        gpus("n1", 8, train)
        + [healthy_config(**{"actor_rollout_ref.rollout.tensor_model_parallel_size": 4})],
        4,
        "map.topology",
        "rollout TP 4 on a PCIe-only 8-GPU box (topology.json, constructed)",
    )
    add(
        "map_config_mismatch",
        gpus("n1", 8, train) + [healthy_config(**{"trainer.nnodes": 2})],
        4,
        "map.config_mismatch",
        "config says 2 nodes x 8 GPUs, one 8-GPU node seen",
    )
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    add(
        "cfg_micro_batch_small",
        [
            healthy_config(
                **{
                    a + "use_dynamic_bsz": False,
                    a + "ppo_micro_batch_size_per_gpu": 2,
                    "data.max_prompt_length": 256,
                    "data.max_response_length": 512,
                }
            )
        ],
        5,
        "cfg.micro_batch_small",
        "micro batch 2 x at most 768 tokens, no dynamic bsz (2 x 1024+4096 tokens would be fine)",
    )
    add(
        "cfg_token_budget",
        [healthy_config(**{a + "ppo_max_token_len_per_gpu": 4096})],
        5,
        "cfg.token_budget",
        "token budget 4096 for 1024 + 4096 tokens",
    )
    add(
        "cfg_enforce_eager",
        [VerlConfig(host="head", t=T_END, values=real_log()[1], source="real verl log")],
        5,
        "cfg.enforce_eager",
        "the real Qwen2.5-0.5B log's config dump (enforce_eager True, old ppo_micro_batch_size 2)",
    )
    add(
        "cfg_offload",
        [hello("n1", 8), healthy_config(**{a + "fsdp_config.param_offload": True})]
        + steps(6, **{"perf/max_memory_reserved_gb": 60.0}),
        5,
        "cfg.offload",
        "param offload on, 60 GiB of 140 GiB reserved",
    )
    add(
        "cfg_kv_cache",
        [healthy_config(**{r + "gpu_memory_utilization": 0.3})]
        + steps(6, **{"timing_s/agent_loop/num_preempted/mean": 1.86}),
        5,
        "cfg.kv_cache",
        "gpu_memory_utilization 0.3 with the sample's preemption count 1.86",
    )
    add(
        "cfg_batched_tokens",
        [healthy_config(**{r + "max_num_batched_tokens": 2048})],
        5,
        "cfg.batched_tokens",
        "max_num_batched_tokens 2048",
    )
    add(
        "cfg_memory_headroom",
        [hello("n1", 8)] + steps(6, **{"perf/max_memory_reserved_gb": 136.0}),
        5,
        "cfg.memory_headroom",
        "trainer reserves 136 GiB of the H200's 140 GiB",
    )
    return s


TOPOLOGY = {
    "n1": {
        f"{i},{j}": ("NODE" if (i < 4) == (j < 4) else "SYS")
        for i in range(8)
        for j in range(8)
        if i < j
    }
}


def main() -> None:
    for name, (recs, expected, note) in scenarios().items():
        d = OUT / name
        d.mkdir(exist_ok=True)
        recs = sorted(recs, key=lambda r: r.t)
        (d / "recording.ndjson").write_text("".join(encode(r) + "\n" for r in recs))
        (d / "expected.json").write_text(json.dumps({**expected, "note": note}, indent=1) + "\n")
        if name == "map_topology":
            (d / "topology.json").write_text(json.dumps(TOPOLOGY, indent=1) + "\n")
    print(f"{len(scenarios())} scenarios written to {OUT}")


if __name__ == "__main__":
    main()
