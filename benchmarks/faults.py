"""Fault injection: how fast and how precisely verl-top names a hung rank or a straggler.

    python benchmarks/faults.py --json-out faults.json            # 128 hosts x 8 GPUs, 20 trials
    python benchmarks/faults.py --quick                           # 4 hosts, 2 trials (smoke test)
    python benchmarks/faults.py --faults hang,throttle --trials 50 --seed 7

A simulated verl PPO job (GAE: generate, log-prob, ref, values, adv on the driver, critic and
actor updates; ~26 s steps with +-10 % jitter) on N hosts x 8 GPUs. Every host's agent sends
what the real agent sends (hello, a GPU sample per GPU and a host sample per second at its own
offset within the second, a process list when a WorkerDict title changes or every 30 s) and the
driver's log gets one verl console step line per step (the follower's ``LogLines``; the first
10 steps arrive at once, as when verl-top attaches to a running job). Every record is encoded to
the wire (``protocol.encode``) and decoded by ``protocol.Decoder`` into the real ``Pipeline``
and ``Store``; the real ``Engine`` evaluates every ``--eval-period`` seconds of data (default:
the live monitor's period), starting at a random phase.

Faults (one per trial, on a random host / GPU / rank, seeded):
- ``hang``: a rank stops (SIGSTOP: its GPU idles, its CPU falls to 0 %) inside a random worker
  method; the others finish their part and spin in NCCL (NVML util 100 %, SM ~3 %); no further
  step. Detection time is measured from the moment the method *overruns* (3x the p95 of its
  logged durations, at least 20 s: the documented rule, computed here from the simulated
  history), and also from the injection.
- ``throttle``: a GPU's clocks fall to 50-70 % with HW slowdown + HW thermal reasons set; the
  GPU-bound stages stretch by 1/ratio and the other ranks spin while they wait for it.
- ``slow_node``: a host's iowait rises to 30-60 % and its GPUs work at 30-50 % of their usual
  activity; the stages stretch and the other hosts wait.
- ``nic``: a host's NCCL log prints ``NET/IB : Got completion from peer ... status=12`` every
  2-5 s (the real WARN format) and its network rate falls to 8 % of the others'.
- ``flap``: a host's agent drops out for 5-10 s every 8-15 s (the SSH source reports it down,
  then a new hello).
- ``healthy``: no fault; the control. Healthy noise: per-rank finish jitter, sw_power_cap on 5 %
  of update samples (clocks within 5 %), single-sample iowait spikes, a missed agent tick now and
  then.

A claim is a finding's ``data["culprits"]`` entry (job.hang, map.imbalance); it is right when it
names the injected host and, for a GPU or a rank, that GPU or process. Per fault: ``recall`` =
trials with a right claim / trials; ``precision`` = right distinct claims / all distinct claims
(claims before the injection count as wrong); detection = data time from the injection (hang:
from the overrun) to the first evaluation with a right claim. ``false_alarms`` (healthy): trials
with any claim or any job.hang / job.stalled / nccl.watchdog / map.imbalance / gpu.throttle
finding.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from _common import ensure_repo_on_path, percentile, table, write_json

ensure_repo_on_path()

from verl_top.diagnosis.engine import Engine  # noqa: E402
from verl_top.diagnosis.hang import percentile as p_interp  # noqa: E402
from verl_top.model import (  # noqa: E402
    GpuInfo,
    GpuProcess,
    GpuSample,
    Hello,
    HostSample,
    HostState,
    LogLines,
    ProcessList,
    Record,
)
from verl_top.monitor import LIVE_PERIOD_S  # noqa: E402
from verl_top.protocol import Decoder, encode  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store  # noqa: E402

GPUS = 8
HISTORY_STEPS = 10  # steps the job ran before verl-top attached
LEAD_IN_S = 60.0  # seconds of agent data before a fault can start
AFTER_S = 45.0  # seconds evaluated after the injection (hang: after the overrun)
PROCS_FORCE_S = 30.0  # the agent re-sends an unchanged process list this often
HEAD = "node0000"
DRIVER_LOG = "/job/driver.log"
NCCL_LOG = "/job/nccl.log"
FAULTS = ("hang", "throttle", "slow_node", "nic", "flap", "healthy")
ALARM_RULES = frozenset(
    {"job.hang", "job.stalled", "nccl.watchdog", "map.imbalance", "gpu.throttle"}
)
# The real NCCL WARN format for a fabric failure (reference/gpu_comm.md §2.4, NVIDIA/nccl#1814).
NIC_WARN = (
    "{host}:{pid}:{tid} [{dev}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from "
    "peer 10.0.{peer}.17<53042> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid "
    "::ffff:10.0.{me}.17 remoteGid ::ffff:10.0.{peer}.17 hca mlx5_3"
)


@dataclass(frozen=True)
class Stage:
    name: str
    mean_s: float
    method: str | None  # the WorkerDict method (None: driver-side, workers idle)
    profile: str  # gen | fwd | upd | idle


STAGES = (
    Stage("gen", 12.0, "actor_rollout_generate_sequences", "gen"),
    Stage("old_log_prob", 2.0, "actor_rollout_compute_log_prob", "fwd"),
    Stage("ref", 1.5, "actor_rollout_ref_compute_ref_log_prob", "fwd"),
    Stage("values", 1.5, "critic_compute_values", "fwd"),
    Stage("adv", 0.4, None, "idle"),
    Stage("update_critic", 3.0, "critic_update_critic", "upd"),
    Stage("update_actor", 5.0, "actor_rollout_update_actor", "upd"),
    Stage("bookkeeping", 0.3, None, "idle"),  # between steps: metrics, logging
)
WORKER_STAGES = tuple(i for i, s in enumerate(STAGES) if s.method)
# (SM activity, NVML util, tensor util) while working, per profile.
PROFILES = {"gen": (55.0, 97.0, 15.0), "fwd": (72.0, 98.0, 45.0), "upd": (85.0, 99.0, 60.0)}
NET_BPS = {"gen": 1e8, "fwd": 2e8, "upd": 2e9, "idle": 5e6}


def unit(*key: object) -> float:
    """A deterministic number in [0, 1) from ``key`` (per-rank jitter without RNG state)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class Segment:
    start: float
    end: float  # inf: hung
    stage: int
    step: int
    base: float  # duration the healthy ranks need


@dataclass
class Fault:
    kind: str
    t_inj: float
    host: int = 0
    gpu: int = 0
    ratio: float = 1.0  # speed of the straggler relative to its peers
    t_over: float | None = None  # hang: when its method overruns

    def target(self, hosts: list[str]) -> tuple[str, int | None, int | None]:
        """(host, gpu, pid) the right claim names (gpu/pid None: the host is enough)."""
        host = hosts[self.host]
        if self.kind == "hang":
            return host, None, pid_of(self.host, self.gpu)
        if self.kind == "throttle":
            return host, self.gpu, None
        return host, None, None


def pid_of(host: int, gpu: int) -> int:
    return 10_000 + 100 * (host % 500) + gpu


class Job:
    """The simulated job's schedule: segments of stages, stretched by a straggler."""

    def __init__(self, rng: random.Random, t_job0: float, fault: Fault | None) -> None:
        self.rng = rng
        self.fault = fault
        self.segments: list[Segment] = []
        self.t = t_job0
        self.step = 1
        self.hung = False

    def _stretch(self, start: float, stage: Stage) -> float:
        f = self.fault
        if f is None or f.kind not in ("throttle", "slow_node", "nic") or start < f.t_inj:
            return 1.0
        if f.kind == "nic":
            return 1.5 if stage.profile == "upd" else 1.0
        return 1.0 / f.ratio if stage.method else 1.0

    def extend(self, until: float) -> None:
        """Schedule steps until ``until`` (or forever after a hang)."""
        while not self.hung and self.t <= until:
            jitter = [self.rng.uniform(0.9, 1.1) for _ in STAGES]
            for i, st in enumerate(STAGES):
                base = st.mean_s * jitter[i]
                dur = base * self._stretch(self.t, st)
                self.segments.append(Segment(self.t, self.t + dur, i, self.step, base))
                self.t += dur
            self.step += 1

    def hang_at(self, seg: Segment, t_inj: float) -> None:
        """The rank stops at ``t_inj`` inside ``seg``: it never ends, nothing follows."""
        seg.end = math.inf
        self.segments = self.segments[: self.segments.index(seg) + 1]
        self.hung = True
        self.t = math.inf

    def at(self, t: float) -> Segment:
        lo, hi = 0, len(self.segments) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.segments[mid].start <= t:
                lo = mid
            else:
                hi = mid - 1
        return self.segments[lo]

    def step_ends(self) -> Iterator[tuple[int, float, dict[str, float]]]:
        """(step, end time, stage seconds) of every finished step."""
        by_step: dict[int, list[Segment]] = {}
        for s in self.segments:
            by_step.setdefault(s.step, []).append(s)
        for n, segs in sorted(by_step.items()):
            if len(segs) == len(STAGES) and math.isfinite(segs[-1].end):
                yield n, segs[-1].end, {STAGES[s.stage].name: s.end - s.start for s in segs}


def step_line(n: int, stages: dict[str, float]) -> str:
    """The driver's console line for one step, as verl 0.5 prints it."""
    timings = {k: v for k, v in stages.items() if k != "bookkeeping"}
    timings["generate_sequences"] = timings["gen"] - 0.05
    total = sum(stages.values())
    parts = [f"timing_s/{k}:{v:.6f}" for k, v in timings.items()]
    parts += [f"timing_s/step:{total:.6f}", f"perf/throughput:{3.2e5 / total:.3f}"]
    return f"\x1b[36m(TaskRunner pid=4186)\x1b[0m step:{n} - " + " - ".join(parts)


class Fleet:
    """Turns the schedule and the fault into the records every agent would send."""

    def __init__(self, hosts: int, job: Job, fault: Fault | None, seed: int) -> None:
        self.hosts = [f"node{i:04d}" for i in range(hosts)]
        self.job = job
        self.fault = fault
        self.seed = seed
        self.offset = [unit(seed, "offset", h) for h in range(hosts)]
        self.last_titles: dict[int, tuple[str, ...]] = {}
        self.last_procs: dict[int, float] = {}
        self.flap: list[tuple[float, float]] = []  # (down from, up at) of the flapping host

    # -- one host at one instant -----------------------------------------------------------
    def down(self, h: int, t: float) -> bool:
        f = self.fault
        return bool(
            f and f.kind == "flap" and h == f.host and any(a <= t < b for a, b in self.flap)
        )

    def gpu_state(self, h: int, g: int, t: float) -> tuple[str, Segment]:
        """work | spin | idle | stopped for GPU g of host h at t."""
        seg = self.job.at(t)
        st = STAGES[seg.stage]
        f = self.fault
        if f is not None and f.kind == "hang" and math.isinf(seg.end) and t >= f.t_inj:
            if (h, g) == (f.host, f.gpu):
                return "stopped", seg
            work_end = seg.start + seg.base * (0.93 + 0.07 * unit(self.seed, seg.start, h, g))
            return ("work" if t < work_end else "spin"), seg
        if not st.method:
            return "idle", seg
        slow = (
            f is not None
            and t >= f.t_inj
            and (
                (f.kind == "throttle" and (h, g) == (f.host, f.gpu))
                or (f.kind == "slow_node" and h == f.host)
            )
        )
        frac = 1.0 if slow else 0.93 + 0.07 * unit(self.seed, seg.start, h, g)
        if seg.end - seg.start > seg.base * 1.01 and not slow:
            return ("work" if t < seg.start + seg.base * frac else "spin"), seg
        return ("work" if t < seg.start + (seg.end - seg.start) * frac else "spin"), seg

    def gpu_sample(self, rng: random.Random, h: int, g: int, t: float) -> tuple[GpuSample, str]:
        state, seg = self.gpu_state(h, g, t)
        st = STAGES[seg.stage]
        f = self.fault
        mhz, reasons = 1980.0, 0x1 if state in ("idle", "stopped") else 0
        if state == "work":
            sm, util, tensor = PROFILES[st.profile]
            sm, util = sm + rng.gauss(0, 5), min(100.0, util + rng.gauss(0, 1))
            if st.profile == "upd" and rng.random() < 0.05:
                mhz, reasons = rng.uniform(1885, 1980), 0x4  # healthy power capping
        elif state == "spin":
            sm, util, tensor = 3.0 + rng.gauss(0, 1), 100.0, 0.0
        else:
            sm, util, tensor = max(0.0, rng.gauss(0.5, 0.3)), max(0.0, rng.gauss(1, 0.7)), 0.0
        if f is not None and t >= f.t_inj:
            if f.kind == "throttle" and (h, g) == (f.host, f.gpu):
                reasons, mhz = 0x8 | 0x40, (1980.0 * f.ratio if state == "work" else 1400.0)
            if f.kind == "slow_node" and h == f.host and state == "work":
                sm, util = sm * f.ratio, util * (0.4 + f.ratio)
        sm = min(100.0, max(0.0, sm))
        return (
            GpuSample(
                host=self.hosts[h],
                t=round(t, 3),
                index=g,
                util_gpu=round(max(0.0, util), 1),
                util_mem=round(sm * 0.6, 1),
                mem_used_mib=62_000.0,
                mem_total_mib=143_771.0,
                power_w=round(120 + 5.5 * sm, 1),
                power_limit_w=700.0,
                temp_c=round(45 + sm / 4, 1),
                sm_mhz=round(mhz, 0),
                mem_mhz=3201.0,
                clock_reasons=reasons,
                sm_util=round(sm, 2),
                tensor_util=round(max(0.0, tensor + rng.gauss(0, 2)) if tensor else 0.0, 2),
                dram_util=round(sm * 0.4, 2),
            ),
            state,
        )

    def host_sample(self, rng: random.Random, h: int, t: float, busy: int) -> HostSample:
        seg = self.job.at(t)
        f = self.fault
        slow = f is not None and f.kind == "slow_node" and h == f.host and t >= f.t_inj
        iowait = rng.uniform(30, 60) if slow else max(0.0, rng.gauss(0.8, 0.5))
        if not slow and rng.random() < 0.02:
            iowait = rng.uniform(8, 15)  # a checkpoint or log flush: one sample
        cpu = rng.uniform(92, 99) if slow else 18 + 1.5 * busy + rng.gauss(0, 3)
        net = NET_BPS[STAGES[seg.stage].profile] * rng.uniform(0.8, 1.2)
        if f is not None and f.kind == "nic" and h == f.host and t >= f.t_inj:
            net *= 0.08
        return HostSample(
            host=self.hosts[h],
            t=round(t, 3),
            cpu_pct=round(min(100.0, max(0.0, cpu)), 1),
            cpu_per_core=[round(min(100.0, 70 + rng.gauss(0, 8)), 1)],
            iowait_pct=round(min(100.0, iowait), 1),
            load1=20.0,
            mem_used_bytes=600 * 2**30,
            mem_total_bytes=2048 * 2**30,
            net_rx_bps=round(net, 0),
            net_tx_bps=round(net, 0),
            disk_read_bps=1e7,
            disk_write_bps=1e6,
        )

    def procs(self, h: int, t: float, states: list[str]) -> ProcessList | None:
        """The process list when a title changed or every PROCS_FORCE_S, as the agent does."""
        seg = self.job.at(t)
        method = STAGES[seg.stage].method or ""
        titles = tuple("ray::WorkerDict" + (f".{method}" if method else "") for _ in range(GPUS))
        last = self.last_procs.get(h)
        if self.last_titles.get(h) == titles and last is not None and t - last < PROCS_FORCE_S:
            return None
        self.last_titles[h], self.last_procs[h] = titles, t
        cpus = [0.0 if s == "stopped" else (2.0 if s == "idle" else 100.0) for s in states]
        return ProcessList(
            host=self.hosts[h],
            t=round(t, 3),
            procs=[
                GpuProcess(
                    pid=pid_of(h, g),
                    gpu_index=g,
                    used_mib=60_000.0,
                    user="verl",
                    cmd=titles[g],
                    cpu_pct=cpus[g],
                    rss_bytes=30 * 2**30,
                    env_rank=h * GPUS + g,
                    env_local_rank=g,
                )
                for g in range(GPUS)
            ],
        )

    def hello(self, h: int, t: float) -> Hello:
        return Hello(
            host=self.hosts[h],
            t=round(t, 3),
            agent_version="sim",
            backend="pynvml",
            gpus=[GpuInfo(index=g, name="NVIDIA H200", gpm=True) for g in range(GPUS)],
            interval=1.0,
        )


@dataclass
class Trial:
    kind: str
    seed: int
    detect_s: float | None = None  # from the reference time (hang: the overrun)
    detect_inj_s: float | None = None  # from the injection
    right: set[tuple[Any, ...]] = field(default_factory=set)
    wrong: set[tuple[Any, ...]] = field(default_factory=set)
    alarms: int = 0  # healthy: evaluations with an alarm
    lead_ok: bool | None = None  # hang: job.hang led at the detection
    evals: int = 0


def claims(verdict: Any) -> list[tuple[str, int | None, int | None]]:
    """(host, gpu, pid) of every culprit the findings name."""
    out = []
    for f in verdict.findings:
        for c in f.data.get("culprits", []) if isinstance(f.data, dict) else []:
            out.append((c.get("host"), c.get("gpu"), c.get("pid")))
    return out


def is_right(claim: tuple[str, int | None, int | None], target: tuple[str, Any, Any]) -> bool:
    host, gpu, pid = target
    if claim[0] != host:
        return False
    if gpu is not None and claim[1] != gpu:
        return False
    return pid is None or claim[2] == pid


def overrun_time(job: Job, seg: Segment) -> float:
    """When the hung method overruns by the documented rule, from the simulated history of the
    stage's logged timer (last 20 steps)."""
    stage = STAGES[seg.stage].name
    history = [s[stage] for _, end, s in job.step_ends() if end < seg.start][-20:]
    if stage == "gen":
        history = [v - 0.05 for v in history]  # its timer is generate_sequences
    return seg.start + max(3 * p_interp(history, 95), 20.0)


def plan(kind: str, rng: random.Random, hosts: int, t0: float) -> tuple[Job, Fault | None]:
    """The trial's schedule and fault."""
    step_s = sum(s.mean_s for s in STAGES)
    t_job0 = t0 - HISTORY_STEPS * step_s
    if kind == "healthy":
        job = Job(rng, t_job0, None)
        return job, None
    host, gpu = rng.randrange(hosts), rng.randrange(GPUS)
    if kind == "hang":
        job = Job(rng, t_job0, None)
        job.extend(t0 + LEAD_IN_S + 2 * step_s)
        cands = [
            s
            for s in job.segments
            if s.stage in WORKER_STAGES and t0 + LEAD_IN_S <= s.start <= t0 + LEAD_IN_S + step_s
        ]
        seg = rng.choice(cands)
        t_inj = seg.start + rng.uniform(0.2, 0.8) * (seg.end - seg.start)
        fault = Fault("hang", t_inj, host, gpu)
        job.fault = fault
        fault.t_over = overrun_time(job, seg)
        job.hang_at(seg, t_inj)
        return job, fault
    ratio = rng.uniform(0.5, 0.7) if kind == "throttle" else rng.uniform(0.3, 0.5)
    fault = Fault(kind, t0 + LEAD_IN_S + rng.uniform(0, step_s), host, gpu, ratio=ratio)
    return Job(rng, t_job0, fault), fault


FLAT = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in (GpuSample, HostSample)}


def wire(rec: Record) -> str:
    """The line an agent sends for ``rec``: flat samples built directly (as the agent writes
    them: fields in model order, no nulls), the rest through ``protocol.encode``."""
    names = FLAT.get(type(rec))
    if names is None:
        return encode(rec)
    body = {"v": 1, "type": rec.TYPE}
    for name in names:
        value = getattr(rec, name)
        if value is not None and value != [] and value != "":
            body[name] = value
    return json.dumps(body, separators=(",", ":"))


def run_trial(kind: str, hosts: int, seed: int, period: float, engine: Engine) -> Trial:
    """One trial: the fleet's records through decoder -> pipeline -> store, evaluated."""
    rng = random.Random(seed)
    t0 = 1_767_000_000.0 + 10_000 * (seed % 1000)
    job, fault = plan(kind, rng, hosts, t0)
    fleet = Fleet(hosts, job, fault, seed)
    trial = Trial(kind, seed)
    store = Store()
    pipe = Pipeline(store, wall_clock=lambda: store.now or t0)
    dec = Decoder()

    def send(rec: Record) -> None:
        out = dec.decode(wire(rec))
        if out is not None:
            pipe.emit(out)

    t_ref = fault.t_over if fault and fault.t_over else (fault.t_inj if fault else t0 + LEAD_IN_S)
    t_end = t_ref + (AFTER_S if kind != "healthy" else 120.0)
    job.extend(t_end + 60)
    if fault and fault.kind == "flap":
        t = fault.t_inj
        while t < t_end:
            down = rng.uniform(5, 10)
            fleet.flap.append((t, t + down))
            t += down + rng.uniform(8, 15)
    for h in range(hosts):
        send(fleet.hello(h, t0 - 1))
    history = [step_line(n, s) for n, end, s in job.step_ends() if end < t0]
    send(LogLines(host=HEAD, t=t0, path=DRIVER_LOG, kind="verl", lines=history))
    logged = len(history)
    first_eval = (t_ref if kind != "hang" else fault.t_inj) - 10 + rng.uniform(0, period)
    if kind == "healthy":
        first_eval = t0 + LEAD_IN_S - 10 + rng.uniform(0, period)
    next_eval = first_eval
    target = fault.target(fleet.hosts) if fault else None
    warn_at = fault.t_inj if fault and fault.kind == "nic" else math.inf
    was_down = False
    second = t0
    while second < t_end:
        for h in sorted(range(hosts), key=lambda i: fleet.offset[i]):
            t = second + fleet.offset[h]
            if fleet.down(h, t):
                if not was_down:
                    send(
                        HostState(host=fleet.hosts[h], t=t, state="down", reason="connection lost")
                    )
                    was_down = True
                continue
            if was_down and fault and h == fault.host:
                send(fleet.hello(h, t))
                was_down = False
            states = []
            for g in range(GPUS):
                rec, state = fleet.gpu_sample(rng, h, g, t)
                states.append(state)
                if rng.random() > 0.001:  # a lost sample now and then
                    send(rec)
            send(fleet.host_sample(rng, h, t, sum(s == "work" for s in states)))
            plist = fleet.procs(h, t, states)
            if plist is not None:
                send(plist)
        ends = list(job.step_ends())
        new = [(n, end, s) for n, end, s in ends[logged:] if end <= second + 1]
        for n, end, s in new:
            send(
                LogLines(
                    host=HEAD,
                    t=round(end, 3),
                    path=DRIVER_LOG,
                    kind="verl",
                    lines=[step_line(n, s)],
                )
            )
        logged += len(new)
        if second + 1 >= warn_at:
            h = fault.host
            line = NIC_WARN.format(
                host=fleet.hosts[h], pid=pid_of(h, 3), tid=7, dev=3, peer=(h + 1) % 250, me=h % 250
            )
            send(
                LogLines(
                    host=fleet.hosts[h], t=second + 1, path=NCCL_LOG, kind="nccl", lines=[line]
                )
            )
            warn_at += rng.uniform(2, 5)
        second += 1
        while next_eval <= second and next_eval < t_end:
            verdict = engine.evaluate(store)
            trial.evals += 1
            judge(trial, verdict, target, fault, store.now, t_ref)
            next_eval += period
    return trial


def judge(
    trial: Trial,
    verdict: Any,
    target: tuple[str, Any, Any] | None,
    fault: Fault | None,
    now: float,
    t_ref: float,
) -> None:
    """Score one evaluation's claims against the injected fault."""
    found = claims(verdict)
    if target is None:
        rules = {f.rule for f in verdict.findings} & ALARM_RULES
        if found or rules:
            trial.alarms += 1
            trial.wrong |= {c for c in found} | {(r,) for r in rules}
        return
    for c in found:
        if fault is not None and now >= fault.t_inj and is_right(c, target):
            trial.right.add(c)
            if trial.detect_s is None:
                trial.detect_s = now - t_ref
                trial.detect_inj_s = now - fault.t_inj
                if fault.kind == "hang":
                    trial.lead_ok = verdict.bottleneck_rule == "job.hang"
        else:
            trial.wrong.add(c)


def summarise(kind: str, trials: list[Trial]) -> dict[str, Any]:
    times = [t.detect_s for t in trials if t.detect_s is not None]
    right = sum(len(t.right) for t in trials)
    wrong = sum(len(t.wrong) for t in trials)
    row: dict[str, Any] = {
        "fault": kind,
        "trials": len(trials),
        "p50_detect_s": round(percentile(times, 50), 1) if times else None,
        "p95_detect_s": round(percentile(times, 95), 1) if times else None,
        "precision": round(right / (right + wrong), 3) if right + wrong else None,
        "recall": round(len(times) / len(trials), 3) if trials else None,
        "evaluations": sum(t.evals for t in trials),
    }
    if kind == "healthy":
        row["false_alarms"] = sum(1 for t in trials if t.alarms)
        row["alarm_evaluations"] = sum(t.alarms for t in trials)
        row["precision"] = row["recall"] = None
    if kind == "hang":
        inj = [t.detect_inj_s for t in trials if t.detect_inj_s is not None]
        row["p95_detect_from_injection_s"] = round(percentile(inj, 95), 1) if inj else None
        leads = [t.lead_ok for t in trials if t.lead_ok is not None]
        row["hang_leads"] = round(sum(leads) / len(leads), 3) if leads else None
    return row


TARGETS = {
    "hang": "p95 <= 20 s from the overrun",
    "throttle": "p95 <= 10 s",
    "slow_node": "p95 <= 10 s",
    "nic": "p95 <= 10 s",
    "flap": "(needs 2 drop-outs)",
    "healthy": "0 false alarms",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-period", type=float, default=LIVE_PERIOD_S)
    ap.add_argument("--quick", action="store_true", help="4 hosts, 2 trials: the smoke test")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.quick:
        args.hosts, args.trials = min(args.hosts, 4), min(args.trials, 2)
    kinds = [k for k in args.faults.split(",") if k]
    bad = [k for k in kinds if k not in FAULTS]
    if bad:
        ap.error(f"unknown fault(s) {', '.join(bad)}; choose from {', '.join(FAULTS)}")
    engine = Engine()
    rows = []
    started = time.process_time()
    for kind in kinds:
        trials = []
        for i in range(args.trials):
            seed = args.seed * 100_003 + FAULTS.index(kind) * 1009 + i
            trials.append(run_trial(kind, args.hosts, seed, args.eval_period, engine))
        rows.append(summarise(kind, trials))
        print(f"  {kind}: {args.trials} trials done", file=sys.stderr)
    headers = ["fault", "trials", "p50 s", "p95 s", "precision", "recall", "false alarms", "target"]
    print(
        table(
            headers,
            [
                [
                    r["fault"],
                    r["trials"],
                    r["p50_detect_s"],
                    r["p95_detect_s"],
                    r["precision"],
                    r["recall"],
                    r.get("false_alarms"),
                    TARGETS[r["fault"]],
                ]
                for r in rows
            ],
        )
    )
    cpu = time.process_time() - started
    print(
        f"{args.hosts} hosts x {GPUS} GPUs, evaluation every {args.eval_period:g} s of data; "
        f"CPU {cpu:.0f} s"
    )
    write_json(
        args.json_out,
        {
            "hosts": args.hosts,
            "gpus": args.hosts * GPUS,
            "eval_period_s": args.eval_period,
            "seed": args.seed,
            "rows": rows,
            "cpu_s": round(cpu, 1),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
