"""Processes on the node, from /proc (or psutil where there is no /proc).

Two lists, made on the process stride: the processes holding GPU memory (user, command/title,
CPU %, RSS, RANK and LOCAL_RANK of their environment: ``GpuProcess``), and every process of the
training job, GPU or not (``JobProcess``: Ray workers and actors, the verl driver, vLLM/SGLang
engines, torchrun ranks, and anything holding a GPU) with its state, parent, the Ray method its
title names and since when. Each pid's /proc files are read once per listing, for both lists.
"""

from __future__ import annotations

import os
import time

from .host import ProcFile, read_bytes
from .wire import int_or_none

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from re import Pattern
    from typing import Any

    ProcInfo = dict[str, Any]  # GpuProcess / JobProcess fields learned from /proc

PROC_ROOT = "/proc"
TITLE_READ = 65536  # bytes of /proc/PID/cmdline read
TITLE_MAX = 4096  # characters of a title sent (the client's limit for the field)
MAX_JOB_PROCS = 512  # job processes sent per listing, lowest pids first
# pids whose stat and cmdline stay open between listings (2 fds each): a pread on a kept fd costs
# a third of open + read + close; a process that exits makes its fd fail (never a reused pid's).
KEEP_OPEN = 64
# Listing /proc costs the kernel ~2.6 us per process (a GPU node has 1000-3000 with its kernel
# threads): new processes are looked for every DISCOVER_S, not every listing; the job's known
# processes are read every listing. A process's command line is read when it is new, again at
# each discovery while it is younger than YOUNG_S (a launcher that exec()s keeps its pid), and
# every pid's again each RESCAN_S.
DISCOVER_S = 60.0
YOUNG_S = 120.0
RESCAN_S = 600.0
# A job process by its title or command line: a Ray worker or actor (but not an idle pool worker
# or Ray's own agents), a Ray worker before it set its title, the verl driver, a vLLM or SGLang
# engine or server, a torchrun launcher or rank. verl-top itself (verl_top, verl-top) is not.
JOB_TITLE = (
    r"^ray::(?!IDLE|DashboardAgent|RuntimeEnvAgent|JobSupervisor|_StatsActor)"
    r"|ray/_private/workers/default_worker\.py"
    r"|\bverl[./]trainer\b|\bmain_ppo\b|(?:^|\s)-m\s+verl\.|(?:^|/)verl/\S+\.py\b"
    r"|^VLLM::|\bvllm\b|^sglang::|\bsglang\b"
    r"|\btorchrun\b|torch[./]distributed[./]run\b"
)
# The Ray method a title names: ``ray::WorkerDict.critic_update_critic`` -> critic_update_critic.
RAY_METHOD = r"^ray::[\w-]+\.(\w+)"
JOB_FIELDS = (
    "pid", "ppid", "user", "state", "title", "method", "method_since", "cpu_pct", "rss_bytes",
    "gpus", "role",
)  # fmt: skip
PROC_FIELDS = (
    "pid", "gpu_index", "used_mib", "user", "cmd", "cpu_pct", "rss_bytes", "visible", "role",
    "rank", "env_rank", "env_local_rank",
)  # fmt: skip


class Snap:
    """One pid as this listing read it from /proc."""

    __slots__ = ("cpu_pct", "ppid", "rss", "start", "state", "title", "user")

    def __init__(
        self,
        state: str,
        ppid: int | None,
        user: str,
        title: str,
        cpu_pct: float | None,
        rss: int,
        start: bytes,
    ) -> None:
        self.state = state
        self.ppid = ppid
        self.user = user
        self.title = title
        self.cpu_pct = cpu_pct
        self.rss = rss
        self.start = start


def _title(raw: bytes | None) -> str:
    """A process title from /proc/PID/cmdline: arguments joined by spaces, bounded."""
    if not raw:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:TITLE_MAX]


class ProcInspector:
    """Learns user, title, state, parent, CPU %, RSS (and for GPU holders RANK/LOCAL_RANK) of
    pids from /proc (or psutil). ``begin()`` starts a listing: within one, each pid is read once
    however many lists ask for it (its CPU % is over the time since the previous listing)."""

    def __init__(self, root: str = PROC_ROOT) -> None:
        self.root = root
        self._users: dict[int, str] = {}
        # pid -> (starttime, user, env_rank, env_local_rank or None when not read yet)
        self._static: dict[int, tuple[bytes, str, tuple[int | None, int | None] | None]] = {}
        self._cpu: dict[int, tuple[float, int]] = {}  # pid -> (mono, cpu ticks)
        self._snaps: dict[int, Snap | None] = {}  # this listing's reads
        self._open: dict[tuple[int, str], ProcFile] = {}  # kept-open stat / cmdline files
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.has_proc = os.path.isdir(os.path.join(root, "self"))
        self._psutil: Any = None
        if not self.has_proc:
            try:
                import psutil  # noqa: PLC0415

                self._psutil = psutil
            except Exception:
                self._psutil = None

    def begin(self) -> None:
        """Start a listing: forget the previous listing's reads."""
        self._snaps.clear()

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                import pwd  # noqa: PLC0415 - not on every platform

                name = pwd.getpwuid(uid).pw_name
            except Exception:
                name = str(uid)
            self._users[uid] = name
        return name

    def _env_ranks(self, pid: int) -> tuple[int | None, int | None]:
        data = read_bytes(f"{self.root}/{pid}/environ", 1 << 22)
        rank = local = None
        if data:
            for item in data.split(b"\0"):
                if item.startswith(b"RANK="):
                    rank = int_or_none(item[5:])
                elif item.startswith(b"LOCAL_RANK="):
                    local = int_or_none(item[11:])
        return rank, local

    def _file(self, pid: int, name: str, limit: int) -> bytes | None:
        """/proc/PID/NAME now, through a kept-open file while there is room for one."""
        key = (pid, name)
        f = self._open.get(key)
        if f is None:
            path = f"{self.root}/{pid}/{name}"
            if len(self._open) >= 2 * KEEP_OPEN:
                return read_bytes(path, limit)
            f = self._open[key] = ProcFile(path, 512, limit)
        data = f.raw()
        if data is None:  # the process is gone: never reopen (the pid may be another's now)
            del self._open[key]
        return data

    def snapshot(self, pid: int) -> Snap | None:
        """``pid`` as /proc shows it now (once per listing); None when it is not visible."""
        if pid in self._snaps:
            return self._snaps[pid]
        snap = self._read(pid)
        self._snaps[pid] = snap
        return snap

    def _read(self, pid: int) -> Snap | None:
        stat = self._file(pid, "stat", 4096)
        if not stat:
            self._static.pop(pid, None)
            self._cpu.pop(pid, None)
            return None
        # comm may hold spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            state = fields[0].decode("ascii", "replace")[:1]
            ppid = int(fields[1])
            ticks = int(fields[11]) + int(fields[12])
            start = fields[19]
            rss = int(fields[21]) * self._page
        except (IndexError, ValueError):
            return None
        static = self._static.get(pid)
        if static is None or static[0] != start:
            try:
                user = self._user(os.stat(f"{self.root}/{pid}").st_uid)
            except OSError:
                user = ""
            static = (start, user, None)
            self._static[pid] = static
            self._cpu.pop(pid, None)
        # The title is read every time: Ray rewrites it per task ("ray::WorkerDict.actor_rollout_
        # generate_sequences"), so it tells which method the worker is running now.
        title = _title(self._file(pid, "cmdline", TITLE_READ))
        mono = time.monotonic()
        prev = self._cpu.get(pid)
        self._cpu[pid] = (mono, ticks)
        cpu = None
        if prev is not None and mono > prev[0]:
            cpu = round(100.0 * (ticks - prev[1]) / self._hz / (mono - prev[0]), 1)
        return Snap(state, ppid, static[1], title, cpu, rss, start)

    def inspect(self, pid: int) -> ProcInfo:
        """Dict of GpuProcess fields for ``pid``; visible=False when /proc does not show it."""
        if self._psutil is not None:
            return self._inspect_psutil(pid)
        if not self.has_proc:
            return {"visible": False}
        snap = self.snapshot(pid)
        if snap is None:
            return {"visible": False}
        start, user, ranks = self._static[pid]
        if ranks is None:  # RANK / LOCAL_RANK: read once per process (environ is large)
            ranks = self._env_ranks(pid)
            self._static[pid] = (start, user, ranks)
        return {
            "user": snap.user,
            "cmd": snap.title,
            "cpu_pct": snap.cpu_pct,
            "rss_bytes": snap.rss,
            "env_rank": ranks[0],
            "env_local_rank": ranks[1],
        }

    def _inspect_psutil(self, pid: int) -> ProcInfo:
        ps = self._psutil
        try:
            p = ps.Process(pid)
            with p.oneshot():
                info = {
                    "user": p.username(),
                    "cmd": " ".join(p.cmdline()),
                    "cpu_pct": None,
                    "rss_bytes": p.memory_info().rss,
                }
                try:
                    env = p.environ()
                    info["env_rank"] = int_or_none(env.get("RANK"))
                    info["env_local_rank"] = int_or_none(env.get("LOCAL_RANK"))
                except Exception:
                    pass
            return info
        except Exception:
            return {"visible": False}

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop cached state of pids that are gone."""
        keep = set(pids)
        for cache in (self._static, self._cpu):
            for pid in [p for p in cache if p not in keep]:
                del cache[pid]
        for key in [k for k in self._open if k[0] not in keep]:
            self._open.pop(key).close()

    def close(self) -> None:
        """Close the kept-open files."""
        for f in self._open.values():
            f.close()
        self._open.clear()


def proc_dict(pid: int, gpu_index: int, used_mib: float | None, info: ProcInfo) -> ProcInfo:
    """A GpuProcess wire dict in model order, None fields left out."""
    values: ProcInfo = {
        "pid": pid,
        "gpu_index": gpu_index,
        "used_mib": used_mib,
        "user": "",
        "cmd": "",
        "cpu_pct": None,
        "rss_bytes": None,
        "visible": True,
        "role": "",
        "rank": None,
        "env_rank": None,
        "env_local_rank": None,
    }
    values.update(info)
    return {k: values[k] for k in PROC_FIELDS if values[k] is not None}


class JobScanner:
    """Finds the job's processes among all of the node's: /proc is listed every ``DISCOVER_S``
    (a new pid's command line read once, a young one's again), the job's own processes and the
    GPU holders are read every listing."""

    def __init__(
        self, inspector: ProcInspector, discover_s: float = DISCOVER_S, rescan_s: float = RESCAN_S
    ) -> None:
        import re  # noqa: PLC0415 - already loaded by argparse

        self.inspector = inspector
        self.discover_s = discover_s
        self.rescan_s = rescan_s
        self._job: Pattern[str] = re.compile(JOB_TITLE, re.IGNORECASE)
        self._method: Pattern[str] = re.compile(RAY_METHOD)
        # pid -> (its command line marks a job process, when it was first seen)
        self._known: dict[int, tuple[bool, float]] = {}
        self._jobs: set[int] = set()  # the pids _known marks as the job's
        self._since: dict[int, tuple[bytes, str | None, float | None]] = {}  # pid -> start, method
        # pid -> (start, its last title): a zombie's cmdline is empty, its title is not lost
        self._titles: dict[int, tuple[bytes, str]] = {}
        self._discover_at = 0.0
        self._rescan_at = 0.0
        self._self = os.getpid()

    def is_job(self, title: str) -> bool:
        """True when a title / command line marks a process of the training job."""
        return bool(title) and self._job.search(title) is not None and "verl_top" not in title

    def method(self, title: str) -> str | None:
        """The Ray method a worker's title names, None when it names none."""
        m = self._method.match(title)
        return m.group(1) if m else None

    def discover(self) -> None:
        """List /proc now: forget the pids that are gone, classify the new (and young) ones."""
        mono = time.monotonic()
        self._discover_at = mono + self.discover_s
        try:
            names = os.listdir(self.inspector.root)
        except OSError:
            return
        pids = [int(n) for n in names if n.isdigit()]
        alive = set(pids)
        for cache in (self._known, self._since, self._titles):
            for pid in [p for p in cache if p not in alive]:
                del cache[pid]
        if mono >= self._rescan_at:
            # Read every command line again (exec() keeps the pid); a job process's is re-read
            # every listing anyway, and a zombie's is empty: keep those.
            self._known = {pid: v for pid, v in self._known.items() if v[0]}
            self._rescan_at = mono + self.rescan_s
        root = self.inspector.root
        for pid in pids:
            known = self._known.get(pid)
            if known is None or (not known[0] and mono - known[1] < YOUNG_S):
                raw = read_bytes(f"{root}/{pid}/cmdline", TITLE_READ)
                job = pid != self._self and self.is_job(_title(raw))
                self._known[pid] = (job, mono if known is None else known[1])
        self._jobs = {pid for pid, (job, _) in self._known.items() if job}

    def scan(self, gpus_by_pid: dict[int, list[int]], now: float) -> list[ProcInfo]:
        """JobProcess wire dicts of the job's processes (and every GPU holder /proc shows), in
        pid order, at most MAX_JOB_PROCS. Call inside a listing (``inspector.begin()``)."""
        if not self.inspector.has_proc:
            return []
        if time.monotonic() >= self._discover_at:
            self.discover()
        wanted = sorted(self._jobs.union(gpus_by_pid))
        out = []
        for pid in wanted:
            snap = self.inspector.snapshot(pid)
            if snap is None:  # gone since the last discovery
                for cache in (self._known, self._since, self._titles):
                    cache.pop(pid, None)
                self._jobs.discard(pid)
                continue
            gpus = sorted(set(gpus_by_pid.get(pid, ())))
            title = snap.title
            if not title:
                last = self._titles.get(pid)
                title = last[1] if last is not None and last[0] == snap.start else ""
            if not gpus and not self.is_job(title):  # its title changed (ray::IDLE)
                continue
            self._titles[pid] = (snap.start, title)
            method, since = self._track(pid, snap.start, title, now)
            values = {
                "pid": pid,
                "ppid": snap.ppid,
                "user": snap.user,
                "state": snap.state,
                "title": title,
                "method": method,
                "method_since": since,
                "cpu_pct": snap.cpu_pct,
                "rss_bytes": snap.rss,
                "gpus": gpus,
                "role": "",
            }
            out.append({k: values[k] for k in JOB_FIELDS if values[k] is not None})
            if len(out) >= MAX_JOB_PROCS:
                break
        return out

    def _track(
        self, pid: int, start: bytes, title: str, now: float
    ) -> tuple[str | None, float | None]:
        """The method the title names and when this agent first saw the process in it."""
        method = self.method(title)
        prev = self._since.get(pid)
        if prev is not None and prev[0] == start and prev[1] == method:
            return method, prev[2]
        since = now if method is not None else None
        self._since[pid] = (start, method, since)
        return method, since
