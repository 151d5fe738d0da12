"""Processes on the node: who holds each GPU (user, command/title, CPU %, RSS, RANK and
LOCAL_RANK of its environment), read from /proc (or psutil where there is no /proc)."""

from __future__ import annotations

import os
import time

from .host import read_bytes
from .wire import int_or_none

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    ProcInfo = dict[str, Any]  # GpuProcess fields learned from /proc


class ProcInspector:
    """Learns user, command, CPU %, RSS and RANK/LOCAL_RANK of pids from /proc (or psutil)."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        # pid -> (starttime, user, cmd, env_rank, env_local_rank)
        self._static: dict[int, tuple[bytes, str, str, int | None, int | None]] = {}
        self._cpu: dict[int, tuple[float, int]] = {}  # pid -> (mono, cpu ticks)
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._has_proc = os.path.isdir("/proc/self")
        self._psutil: Any = None
        if not self._has_proc:
            try:
                import psutil  # noqa: PLC0415

                self._psutil = psutil
            except Exception:
                self._psutil = None

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

    @staticmethod
    def _env_ranks(pid: int) -> tuple[int | None, int | None]:
        data = read_bytes(f"/proc/{pid}/environ", 1 << 22)
        rank = local = None
        if data:
            for item in data.split(b"\0"):
                if item.startswith(b"RANK="):
                    rank = int_or_none(item[5:])
                elif item.startswith(b"LOCAL_RANK="):
                    local = int_or_none(item[11:])
        return rank, local

    def inspect(self, pid: int) -> ProcInfo:
        """Dict of GpuProcess fields for ``pid``; visible=False when /proc does not show it."""
        if self._psutil is not None:
            return self._inspect_psutil(pid)
        if not self._has_proc:
            return {"visible": False}
        stat = read_bytes(f"/proc/{pid}/stat", 4096)
        if stat is None:
            self._static.pop(pid, None)
            self._cpu.pop(pid, None)
            return {"visible": False}
        # comm may hold spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])
        start = fields[19]
        rss = int(fields[21]) * self._page
        static = self._static.get(pid)
        if static is None or static[0] != start:
            try:
                uid = os.stat(f"/proc/{pid}").st_uid
                user = self._user(uid)
            except OSError:
                user = ""
            rank, local = self._env_ranks(pid)
            static = (start, user, "", rank, local)
            self._static[pid] = static
            self._cpu.pop(pid, None)
        # The title is read every time: Ray rewrites it per task ("ray::WorkerDict.actor_rollout_
        # generate_sequences"), so it tells which method the worker is running now.
        raw = read_bytes(f"/proc/{pid}/cmdline", 65536) or b""
        cmd = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        mono = time.monotonic()
        prev = self._cpu.get(pid)
        self._cpu[pid] = (mono, ticks)
        cpu = None
        if prev is not None and mono > prev[0]:
            cpu = round(100.0 * (ticks - prev[1]) / self._hz / (mono - prev[0]), 1)
        return {
            "user": static[1],
            "cmd": cmd,
            "cpu_pct": cpu,
            "rss_bytes": rss,
            "env_rank": static[3],
            "env_local_rank": static[4],
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

    def forget_except(self, pids: Iterable[int] | set[int]) -> None:
        """Drop cached state of pids that are gone."""
        keep = set(pids)
        for cache in (self._static, self._cpu):
            for pid in [p for p in cache if p not in keep]:
                del cache[pid]


PROC_FIELDS = (
    "pid", "gpu_index", "used_mib", "user", "cmd", "cpu_pct", "rss_bytes", "visible", "role",
    "rank", "env_rank", "env_local_rank",
)  # fmt: skip


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
