"""Progress of the job's processes: the method each one runs now, since when, and how long each
method usually takes (issue 29).

verl logs once per step, but a WorkerDict's process title names the method it runs
(``ray::WorkerDict.critic_update_critic``) and goes back to ``ray::WorkerDict`` when it returns.
The ``ProgressTracker`` watches those titles in every host's process list as it reaches the
store and keeps, per process, the method and the time it started, and per method the durations
of its last occurrences (one occurrence = the ranks that started it together; its duration is
the slowest rank's, as the step waits for that one). The hang rule compares the time a process
has spent in its method with that history and with verl's own ``timing_s/*`` of the stage.

Everything here is bounded: a fixed number of processes, methods and durations per method.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from verl_top.model import GpuProcess, ProcessList
from verl_top.roles import classify, join_roles, title_roles, trainer_method, worker_roles

# A WorkerDict method -> the verl timers (``timing_s/<name>``) that time the same work, the most
# specific first: ``generate_sequences`` is the worker side of ``gen``.
METHOD_TIMERS: dict[str, tuple[str, ...]] = {
    "generate_sequences": ("generate_sequences", "gen"),
    "compute_log_prob": ("old_log_prob",),
    "compute_ref_log_prob": ("ref",),
    "compute_values": ("values",),
    "update_critic": ("update_critic",),
    "update_actor": ("update_actor",),
    "compute_rm_score": ("reward",),
    "save_checkpoint": ("save_checkpoint",),
}
# Process states as /proc/<pid>/stat writes them, in words.
STATE_WORDS: dict[str, str] = {
    "R": "running",
    "S": "sleeping",
    "D": "blocked in the kernel (D)",
    "T": "stopped (T)",
    "t": "stopped by a tracer (t)",
    "Z": "a zombie (Z)",
    "I": "idle (I)",
}
OCCURRENCE_JOIN_S = 5.0  # ranks starting a method within this of the first are one occurrence


class JobProcessLike(Protocol):
    """The fields of the agent's job-process record (``model.JobProcess``) this module reads."""

    pid: int
    state: str
    title: str
    method: str | None
    method_since: float | None
    cpu_pct: float | None
    gpus: list[int]
    role: str


@dataclass(frozen=True)
class ProcNow:
    """One process of the job as the latest process list shows it, with its progress."""

    host: str
    pid: int
    method: str  # the method's own name (``update_critic``); "" = idle or not a WorkerDict
    since: float | None  # when it entered ``method`` (agent's first sight, else the tracker's)
    state: str  # R S D T Z I; "" = not reported (GPU process list only)
    cpu_pct: float | None
    gpus: tuple[int, ...]
    role: str  # verl's name of the role: critic, actor/rollout, TaskRunner (driver), ...
    rank: int | None
    title: str
    seen: float = 0.0  # time of the list it comes from (its cpu_pct is as of then)

    def label(self) -> str:
        """``rank 3 (critic)`` or ``pid 4242 (critic)``, with the host: who it is, for people."""
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        return f"{who} ({self.role or 'process'}) on {self.host}"


def job_records(plist: ProcessList) -> Sequence[JobProcessLike] | None:
    """The job-process records of a process list, None when the agent sent none.

    ``ProcessList.job_procs`` is added by the agent's job-process work (issue 29 M2); until it
    is in the model the attribute may be absent, hence the default."""
    return getattr(plist, "job_procs", None)


def _method_of(bound: str | None) -> str:
    """``critic_update_critic`` -> ``update_critic``; None / "" -> ""."""
    return trainer_method(bound) if bound else ""


def _from_job(host: str, jp: JobProcessLike, ranks: dict[int, int], seen: float) -> ProcNow:
    bound = jp.method or ""
    roles = worker_roles(bound)
    return ProcNow(
        host=host,
        pid=jp.pid,
        method=_method_of(bound) or classify(jp.title).method,
        since=jp.method_since,
        state=(jp.state or "")[:1],
        cpu_pct=jp.cpu_pct,
        gpus=tuple(jp.gpus),
        role=join_roles(roles) if roles else (jp.role or ""),
        rank=ranks.get(jp.pid),
        title=jp.title,
        seen=seen,
    )


def _from_gpu(host: str, parts: list[GpuProcess], seen: float, titles: _Titles) -> ProcNow:
    first = parts[0]
    method, roles = titles.read(first.cmd)
    return ProcNow(
        host=host,
        pid=first.pid,
        method=first.method if first.method is not None else method,
        since=None,
        state="",
        cpu_pct=first.cpu_pct,
        gpus=tuple(sorted({p.gpu_index for p in parts})),
        role=roles or first.verl_role or first.role or "",
        rank=first.rank,
        title=first.cmd,
        seen=seen,
    )


class _Titles:
    """A title's method and roles, parsed once: a job has a handful of distinct titles and a
    list arrives at every title change (bounded: cleared when full)."""

    def __init__(self, limit: int = 4096) -> None:
        self._seen: dict[str, tuple[str, str]] = {}
        self._limit = limit

    def read(self, title: str) -> tuple[str, str]:
        """(method, verl roles joined) of a process title."""
        hit = self._seen.get(title)
        if hit is None:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            hit = self._seen[title] = (classify(title).method, join_roles(title_roles(title)))
        return hit


def processes(plist: ProcessList, titles: _Titles | None = None) -> list[ProcNow]:
    """The job's processes of one host list: the agent's job-process records when it sent
    them (state, method and since included), else one entry per GPU process (no state)."""
    ranks = {p.pid: p.rank for p in plist.procs if p.rank is not None}
    jobs = job_records(plist)
    if jobs:
        return [_from_job(plist.host, jp, ranks, plist.t) for jp in jobs]
    by_pid: dict[int, list[GpuProcess]] = {}
    for p in plist.procs:
        by_pid.setdefault(p.pid, []).append(p)
    titles = titles if titles is not None else _Titles()
    return [_from_gpu(plist.host, parts, plist.t, titles) for _, parts in sorted(by_pid.items())]


@dataclass
class _Current:
    method: str
    since: float
    last_t: float


class _Occurrences:
    """Durations of a method's last occurrences (the slowest rank of each)."""

    def __init__(self, keep: int) -> None:
        self.done: deque[float] = deque(maxlen=keep)
        self.start: float | None = None
        self.longest = 0.0

    def add(self, since: float, seconds: float) -> None:
        if self.start is None or since - self.start > OCCURRENCE_JOIN_S:
            if self.start is not None:
                self.done.append(self.longest)
            self.start, self.longest = since, seconds
        else:
            self.longest = max(self.longest, seconds)

    def values(self) -> list[float]:
        return [*self.done, *([self.longest] if self.start is not None else [])]


class ProgressTracker:
    """Per process the method it runs and since when; per method its recent durations.

    Fed every ``ProcessList`` the store ingests (``observe``). A process whose record carries
    ``method_since`` (the agent's job-process record) is timed from it; otherwise from the first
    list that showed it in the method (the agent sends a list whenever a title changes)."""

    def __init__(self, max_procs: int = 65_536, max_methods: int = 64, keep: int = 32) -> None:
        self._cur: dict[tuple[str, int], _Current] = {}
        self._now: dict[str, list[ProcNow]] = {}  # host -> its latest list's processes
        self._titles = _Titles()
        self._occ: dict[str, _Occurrences] = {}
        self.max_procs = max_procs
        self.max_methods = max_methods
        self.keep = keep

    def observe(self, plist: ProcessList) -> None:
        """Take one host's process list: close the episodes of processes that changed method,
        and keep the list's processes with their ``since`` for ``current``."""
        procs = processes(plist, self._titles)
        for p in procs:
            self._see(plist.host, p, plist.t)
        seen = {p.pid for p in procs}
        for key in [k for k in self._cur if k[0] == plist.host and k[1] not in seen]:
            del self._cur[key]  # gone: its last method's end is unknown, so it is not counted
        self._now[plist.host] = [self._timed(plist.host, p) for p in procs]

    def _timed(self, host: str, p: ProcNow) -> ProcNow:
        if p.since is not None or not p.method:
            return p
        return dataclasses.replace(p, since=self.since(host, p.pid, p.method))

    def current(self) -> list[ProcNow]:
        """Every job process of each host's latest list, with the time it entered its method
        (read at ingest: an evaluation costs no title parsing)."""
        return [p for procs in self._now.values() for p in procs]

    def _see(self, host: str, p: ProcNow, t: float) -> None:
        key = (host, p.pid)
        cur = self._cur.get(key)
        since = p.since if p.since is not None else t
        if cur is not None and cur.method == p.method:
            cur.last_t = t
            if p.since is not None:
                cur.since = p.since
            return
        if cur is not None and cur.method:
            self._finish(cur.method, cur.since, max(cur.last_t, since))
        if cur is None and len(self._cur) >= self.max_procs:
            return  # a bound, not a policy: a job has far fewer processes
        self._cur[key] = _Current(p.method, since, t)

    def _finish(self, method: str, since: float, end: float) -> None:
        occ = self._occ.get(method)
        if occ is None:
            if len(self._occ) >= self.max_methods:
                return
            occ = self._occ[method] = _Occurrences(self.keep)
        if end >= since:
            occ.add(since, end - since)

    def since(self, host: str, pid: int, method: str) -> float | None:
        """When ``pid`` on ``host`` was first seen in ``method`` (None: not in it)."""
        cur = self._cur.get((host, pid))
        return cur.since if cur is not None and cur.method == method else None

    def durations(self, method: str) -> list[float]:
        """Seconds of the method's recent occurrences, oldest first."""
        occ = self._occ.get(method)
        return occ.values() if occ is not None else []
