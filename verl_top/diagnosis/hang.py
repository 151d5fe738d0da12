"""job.hang (step 1): a method that overruns its own history with no GPU doing real work.

verl logs once per step, so "no step for 3x the median step" (job.stalled) is late and names
nobody. Each WorkerDict's title names the method it runs; the store's ``ProgressTracker`` knows
since when, and how long that method took before (its own occurrences and verl's ``timing_s/*``
for the stage). A method running longer than ``hang_factor`` x its p95 (and ``hang_min_s``),
while none of its processes' GPUs computes (idle, or NVML util pinned by an NCCL spin) is a
hang. The rule then localises it: per role and method, the processes' state, CPU, GPU activity
and time in the method; the odd one out (stopped, blocked, idle GPU among spinning peers, no
CPU among spinning peers); the NCCL watchdog lines tied to ranks.

Its worth: the seconds the method has run past its usual (p50) duration so far; nothing else
in the job moves while it lasts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from verl_top.diagnosis.findings import Finding, RuleResult, no_data, passed
from verl_top.diagnosis.readable import seconds
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, median
from verl_top.nccl.parse import WatchdogTies, watchdog_ties
from verl_top.progress import METHOD_TIMERS, STATE_WORDS, ProcNow

STEP = 1
RULE = "job.hang"
NEED_PROCS = (
    "needs the job's process list from the agent on each node (GPU processes and their titles)"
)
# How to get PyTorch's NCCL Flight Recorder dumps next time (one file per rank on a timeout).
FLIGHT_RECORDER_ENV = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
    "(dumps /tmp/nccl_trace_rank_<N>; TORCH_NCCL_DEBUG_INFO_TEMP_FILE sets the prefix)"
)
BAD_STATES = ("T", "t", "Z", "D")
# Methods that read or write checkpoints: without a history of their own, minutes are normal
# for them, so the step-based limit would call a slow disk a hang.
IO_METHODS = frozenset(
    {"save_checkpoint", "load_checkpoint", "init_model"}
)  # stopped, traced, zombie, blocked: never normal for long
# A driver's or trainer actor's own loop (verl's `TaskRunner.run`, a trainer's `fit`) lasts as
# long as the job: it is no stage and never a hang candidate (seen on the real H200 job: the
# driver in `run` for minutes was named while the stopped worker was not).
LIFETIME_METHODS = frozenset({"run", "fit", "main", "train", "loop", "__init__"})
MAX_GROUP_LINES = 6
CPU_FRESH_S = 5.0  # a process list older than this says nothing about CPU now


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; ``values`` must not be empty."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class MethodHistory:
    """How long a method took before in this job."""

    method: str
    p50: float
    p95: float
    n: int
    basis: str  # "12 runs: timing_s/update_critic of 10 steps, 2 observed"


def method_history(view: View, method: str) -> MethodHistory | None:
    """The method's past durations: verl's timer of its stage in the logged steps plus the
    occurrences the tracker saw; None when there are none."""
    timed: list[float] = []
    timer = ""
    for name in METHOD_TIMERS.get(method, ()):
        timed = _timings(view, name)
        if timed:
            timer = name
            break
    seen = view.store.progress.durations(method)
    values = timed + seen
    if not values:
        return None
    parts = []
    if timed:
        parts.append(f"timing_s/{timer} of {len(timed)} steps")
    if seen:
        parts.append(f"{len(seen)} observed")
    return MethodHistory(
        method,
        percentile(values, 50),
        percentile(values, 95),
        len(values),
        f"{len(values)} runs: " + ", ".join(parts),
    )


def _timings(view: View, name: str) -> list[float]:
    """The stage timer ``name`` of the recent steps (last 20, validation steps included: a
    method runs the same in them)."""
    out = []
    for s in view.steps()[-20:]:
        for prefix in ("timing_s/", "timing/"):
            v = s.metrics.get(prefix + name)
            if isinstance(v, int | float) and v == v and v >= 0:
                out.append(float(v))
                break
    return out


def overrun_limit(
    view: View, th: Thresholds, hist: MethodHistory | None, method: str = ""
) -> tuple[float, str]:
    """Seconds after which the method overruns, and why that many."""
    if hist is not None and hist.n >= th.hang_min_history:
        limit = max(th.hang_factor * hist.p95, th.hang_min_s)
        return limit, (
            f"{th.hang_factor:g}x its p95 {seconds(hist.p95)} ({hist.basis}), "
            f"at least {seconds(th.hang_min_s)}"
        )
    if method in IO_METHODS:
        return th.stall_max_s, f"no history of {method} (I/O-bound, minutes are normal)"
    steps = [s.step_time for s in view.steps() if s.step_time]
    med = median(steps)
    if med:
        limit = max(min(th.stall_factor * med, th.stall_max_s), th.hang_min_s)
        return limit, (
            f"too little history of this method: {th.stall_factor:g}x the median step "
            f"{seconds(med)}"
        )
    return th.stall_max_s, "no history of this method or of verl steps yet"


@dataclass(frozen=True)
class GpuNow:
    """A process's GPUs over the quiet window: SM activity and NVML util (means, max over
    its GPUs), or None when not sampled."""

    activity: float | None
    util: float | None

    def word(self, th: Thresholds) -> str:
        """busy | spin | idle | low | unknown."""
        if self.activity is None:
            return "unknown"
        if self.activity >= th.hang_busy_pct:
            return "busy"
        if self.util is not None and self.util >= th.stall_spin_pct:
            return "spin"
        if self.util is not None and self.util <= th.stall_idle_pct:
            return "idle"
        if self.util is None and self.activity <= th.stall_idle_pct:
            return "idle"
        return "low"


def gpu_now(view: View, p: ProcNow, since: float) -> GpuNow:
    """Mean activity and NVML util of ``p``'s GPUs from ``since`` (the highest GPU's)."""
    host = view.store.hosts.get(p.host)
    acts: list[float] = []
    utils: list[float] = []
    for idx in p.gpus:
        g = host.gpus.get(idx) if host is not None else None
        if g is None:
            continue
        a = view.gpu_values(g, "activity", since)
        u = view.gpu_values(g, "util_gpu", since)
        if a:
            acts.append(sum(a) / len(a))
        if u:
            utils.append(sum(u) / len(u))
    return GpuNow(max(acts) if acts else None, max(utils) if utils else None)


@dataclass
class Running:
    """A process in a method, how long, and against which limit; its GPUs are read only when
    asked (most evaluations find nothing overrunning and read none)."""

    proc: ProcNow
    elapsed: float
    limit: float
    basis: str
    hist: MethodHistory | None
    view: View = field(repr=False, compare=False)
    quiet_since: float = 0.0
    _gpu: GpuNow | None = field(default=None, repr=False, compare=False)

    @property
    def cpu(self) -> float | None:
        """Its CPU % when the list it comes from is recent (the agent re-sends an unchanged
        list only every 30 s: an older figure may predate a stop)."""
        fresh = self.view.now - self.proc.seen <= CPU_FRESH_S
        return self.proc.cpu_pct if fresh else None

    @property
    def gpu(self) -> GpuNow:
        """Its GPUs over the quiet window."""
        if self._gpu is None:
            self._gpu = gpu_now(self.view, self.proc, self.quiet_since)
        return self._gpu


def running(view: View, th: Thresholds) -> list[Running] | None:
    """Every job process in a method (not idle) with its time in it; None without process
    lists."""
    if not any(h.procs is not None for h in view.hosts()):
        return None
    procs = view.store.progress.current()
    quiet = view.now - th.hang_quiet_s
    out: list[Running] = []
    limits: dict[str, tuple[float, str, MethodHistory | None]] = {}
    for p in procs:
        if not p.method or p.since is None or p.method in LIFETIME_METHODS:
            continue
        if p.method not in limits:
            hist = method_history(view, p.method)
            limits[p.method] = (*overrun_limit(view, th, hist, p.method), hist)
        limit, basis, hist = limits[p.method]
        out.append(Running(p, view.now - p.since, limit, basis, hist, view, quiet))
    return out


@dataclass(frozen=True)
class OddOnes:
    """The processes that differ from their peers, and how."""

    procs: list[ProcNow]
    why: str  # "stopped (T)", "GPU idle while 7 peers spin", ...


def _minority(
    group: list[Running], test: Callable[[Running], bool], peers_ok: Callable[[Running], bool]
) -> list[Running]:
    """The members passing ``test`` when they are a minority and the rest pass ``peers_ok``."""
    hit = [r for r in group if test(r)]
    rest = [r for r in group if not test(r)]
    if not hit or not rest or len(hit) > max(1, len(group) // 4):
        return []
    return hit if all(peers_ok(r) for r in rest) else []


def odd_ones(group: list[Running], th: Thresholds) -> OddOnes | None:
    """Who in a group of processes in the same method is not like the others."""
    if len(group) == 1:
        r = group[0]
        return OddOnes([r.proc], _describe_state(r, th))
    bad = [r for r in group if r.proc.state in BAD_STATES]
    if bad and len(bad) <= max(1, len(group) // 4):
        states = Counter(STATE_WORDS.get(r.proc.state, r.proc.state) for r in bad)
        return OddOnes([r.proc for r in bad], ", ".join(states))
    states = Counter(r.proc.state for r in group if r.proc.state)
    if len(states) > 1:
        common = states.most_common(1)[0][0]
        hit = _minority(group, lambda r: r.proc.state not in ("", common), lambda r: True)
        if hit:
            word = STATE_WORDS.get(hit[0].proc.state, hit[0].proc.state)
            return OddOnes([r.proc for r in hit], f"{word} while the others are {common}")
    idle_gpu = _minority(
        group, lambda r: r.gpu.word(th) == "idle", lambda r: r.gpu.word(th) == "spin"
    )
    if idle_gpu:
        n = len(group) - len(idle_gpu)
        return OddOnes([r.proc for r in idle_gpu], f"GPU idle while {n} peers spin in NCCL")
    cpus = [r.cpu for r in group if r.cpu is not None]
    if cpus and (median(cpus) or 0) >= 50:
        no_cpu = _minority(
            group,
            lambda r: r.cpu is not None and r.cpu < 5,
            lambda r: r.cpu is None or r.cpu >= 20,
        )
        if no_cpu:
            return OddOnes([r.proc for r in no_cpu], "no CPU while its peers spin")
    return None


def _describe_state(r: Running, th: Thresholds) -> str:
    parts = []
    if r.proc.state:
        parts.append(STATE_WORDS.get(r.proc.state, r.proc.state))
    word = r.gpu.word(th)
    if word == "idle":
        parts.append("GPU idle")
    elif word == "spin":
        parts.append("GPU spinning (NCCL wait)")
    if r.cpu is not None:
        parts.append(f"CPU {r.cpu:.0f} %")
    return ", ".join(parts) or "no sign of work"


def _range(values: list[float], unit: str = " %") -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo:.0f}{unit}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}{unit}"


def group_line(role: str, method: str, group: list[Running]) -> str:
    """One role's processes in one method: state counts, CPU, GPU, time in it."""
    states = Counter(r.proc.state for r in group if r.proc.state)
    state = ", ".join(f"{n} {s}" for s, n in states.most_common()) or "not reported"
    cpu = _range([r.cpu for r in group if r.cpu is not None])
    if cpu == "n/a" and group:
        age = min(r.view.now - r.proc.seen for r in group)
        cpu = f"n/a (its process lists are {seconds(age)} old)"
    act = _range([r.gpu.activity for r in group if r.gpu.activity is not None])
    util = _range([r.gpu.util for r in group if r.gpu.util is not None])
    longest = max(r.elapsed for r in group)
    return (
        f"{role or 'process'} · {method}: {len(group)} process(es), state {state}; CPU {cpu}; "
        f"GPU SM activity {act}, NVML util {util}; in it for up to {seconds(longest)}"
    )


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(set(ranks))
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def watchdog_lines(ties: WatchdogTies, group: list[Running]) -> list[str]:
    """Evidence from the NCCL watchdog lines: who timed out in what, who is behind, and which
    of the group's ranks printed nothing."""
    out: list[str] = []
    by_op: dict[tuple[str | None, int | None, str], list[int]] = {}
    for r in ties.timed_out():
        by_op.setdefault((r.pg, r.seq, r.op_type), []).append(r.rank)
    for (pg, seq, op), ranks in sorted(by_op.items(), key=lambda kv: -len(kv[1]))[:3]:
        where = f" of process group {pg}" if pg is not None else ""
        out.append(f"watchdog: {_ranks_text(ranks)}{where} timed out in {op} (SeqNum {seq})")
    if ties.disagree():
        out.append("watchdog: ranks of one group timed out in different collectives (desync)")
    for r in ties.behind()[:3]:
        out.append(
            f"watchdog: rank {r.rank} completed collective {r.last_completed} only; "
            "its peers got further"
        )
    printed = {r.rank for r in ties.ranks.values()}
    silent = [r.proc.rank for r in group if r.proc.rank is not None and r.proc.rank not in printed]
    if printed and silent:
        out.append(f"watchdog: {_ranks_text(silent)} printed no timeout (stuck before it)")
    return out


def _advice(odd: OddOnes | None, view: View, has_watchdog: bool) -> str:
    first = odd.procs[0] if odd else None
    parts: list[str] = []
    if first is not None and first.state == "T":
        parts.append(
            f"{first.label()} is stopped: `kill -CONT {first.pid}` on {first.host} resumes it; "
            "find what stopped it (a debugger, job control, kill -STOP)."
        )
    elif first is not None and first.state == "D":
        parts.append(
            f"{first.label()} is blocked in the kernel: check storage/NFS and the GPU driver "
            f"(dmesg) on {first.host}."
        )
    elif first is not None:
        parts.append(f"Take {first.label()}'s Python stack: `py-spy dump --pid {first.pid}`.")
    else:
        parts.append("Take every rank's Python stack (`py-spy dump --pid PID`) to see where.")
    timeout = view.config("actor_rollout_ref.nccl_timeout")
    limit = f" (here {timeout[1]} s)" if timeout else " (600 s by default)"
    parts.append(
        f"actor_rollout_ref.nccl_timeout{limit} decides when NCCL's watchdog aborts the job; "
        "raising it only delays the error."
    )
    if not has_watchdog:
        parts.append(f"For the last collective of every rank next time, set {FLIGHT_RECORDER_ENV}.")
    return " ".join(parts)


def _culprits(procs: list[ProcNow]) -> list[dict[str, object]]:
    return [
        {"host": p.host, "pid": p.pid, "rank": p.rank, "gpus": list(p.gpus), "role": p.role}
        for p in procs
    ]


def _quiet(group: list[Running], th: Thresholds) -> bool:
    """No process of the group computes: GPUs idle / spinning / unknown, and where nothing is
    sampled on a GPU, a state that is not running."""
    for r in group:
        word = r.gpu.word(th)
        if word == "busy":
            return False
        if word == "unknown" and r.proc.state in ("", "R"):
            return False
    return True


def analyse(view: View, th: Thresholds) -> RuleResult:
    """The hang finding, or a check saying what was looked at."""
    runs = running(view, th)
    if runs is None:
        return no_data(STEP, RULE, NEED_PROCS)
    if not runs:
        return passed(STEP, RULE, "no job process is inside a method now")
    over = [r for r in runs if r.elapsed > r.limit]
    if not over:
        top = max(runs, key=lambda r: r.elapsed / r.limit)
        return passed(
            STEP,
            RULE,
            f"{len(runs)} process(es) in a method; longest ratio: {top.proc.method} for "
            f"{seconds(top.elapsed)} (overruns after {seconds(top.limit)})",
        )
    worst = max(over, key=lambda r: r.elapsed - r.limit)
    method = worst.proc.method
    group = [r for r in runs if r.proc.method == method]
    if not _quiet(group, th):
        busy = sum(1 for r in group if r.gpu.word(th) == "busy")
        return passed(
            STEP,
            RULE,
            f"{method} has run {seconds(worst.elapsed)} (limit "
            f"{seconds(worst.limit)}) but {busy} of its {len(group)} processes' GPUs "
            "compute: a long stage, not a hang",
        )
    return _finding(view, th, worst, group, runs)


def _finding(
    view: View, th: Thresholds, worst: Running, group: list[Running], runs: list[Running]
) -> Finding:
    method = worst.proc.method
    odd = odd_ones(group, th)
    ties = watchdog_ties(view.store.events)
    elapsed = max(r.elapsed for r in group)
    usual = worst.hist.p50 if worst.hist is not None else worst.limit / th.hang_factor
    cost = max(0.0, elapsed - usual)
    waiting = [r for r in group if odd is None or r.proc not in odd.procs]
    span = f"in {method} for {seconds(elapsed)} (usually {seconds(usual)})"
    if odd is not None:
        title = f"Hang: {_names(odd.procs)} {span}: {odd.why}"
        if waiting:
            title += f"; {len(waiting)} other process(es) wait in it"
    else:
        title = (
            f"Hang: all {len(group)} process(es) {span}, no GPU computing: a collective "
            "nobody returns from, or the driver"
        )
    evidence = [
        f"{method} running {seconds(elapsed)}; overruns after {seconds(worst.limit)}: "
        f"{worst.basis}",
    ]
    evidence += _group_lines(runs)
    evidence += watchdog_lines(ties, group)
    severe = odd is not None and any(p.state in BAD_STATES for p in odd.procs)
    idle = all(r.gpu.word(th) in ("idle", "unknown") for r in group)
    med = median(s.step_time for s in view.recent_steps() if s.step_time)
    return Finding(
        STEP,
        RULE,
        1.0 if severe or idle else 0.95,
        title,
        evidence,
        _advice(odd, view, bool(ties.ranks)),
        {
            "method": method,
            "elapsed_s": elapsed,
            "limit_s": worst.limit,
            "usual_s": usual,
            "processes": len(group),
            "culprits": _culprits(odd.procs) if odd else [],
            "why": odd.why if odd else "",
        },
        cost_s=round(cost, 1),
        save_s=round(cost, 1),
        step_s=med,
        save_basis=(
            f"seconds {method} has run past its usual {seconds(usual)} so far; it grows "
            "until the process resumes, and no other stage runs meanwhile"
        ),
    )


def _names(procs: list[ProcNow]) -> str:
    if len(procs) == 1:
        return procs[0].label()
    ranks = [p.rank for p in procs if p.rank is not None]
    hosts = sorted({p.host for p in procs})
    who = _ranks_text(ranks) if len(ranks) == len(procs) else f"{len(procs)} processes"
    return f"{who} on {', '.join(hosts[:3])}" + (" ..." if len(hosts) > 3 else "")


def _group_lines(runs: list[Running]) -> list[str]:
    groups: dict[tuple[str, str], list[Running]] = {}
    for r in runs:
        groups.setdefault((r.proc.role, r.proc.method), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: -max(r.elapsed for r in kv[1]))
    return [group_line(role, method, g) for (role, method), g in ordered[:MAX_GROUP_LINES]]


def job_hang(view: View, th: Thresholds) -> RuleResult:
    """A method overrunning its own history while none of its processes' GPUs computes."""
    return analyse(view, th)


def hang_found(view: View, th: Thresholds) -> bool:
    """True when job.hang has a finding for this view (job.stalled then defers to it)."""
    return isinstance(analyse(view, th), Finding)
