"""CPU, resident memory and GPU memory of each process of the job over time, from the process
lists the store ingests (for the process screen's sparklines). Bounded: per process the last
``points`` listings; only the processes of each host's latest list are kept."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from verl_top.model import ProcessList


@dataclass(frozen=True)
class ProcPoint:
    """One listing of one process."""

    t: float
    cpu_pct: float | None
    rss_bytes: int | None
    gpu_mem_mib: float | None


class ProcHistory:
    """``(host, pid)`` -> the process's last ``points`` listings."""

    def __init__(self, points: int = 720) -> None:
        self.points = points
        self._series: dict[tuple[str, int], deque[ProcPoint]] = {}

    def add(self, plist: ProcessList) -> None:
        """Take one host's process list (its GPU processes and job processes)."""
        gpu_mem: dict[int, float] = {}
        cpu: dict[int, float | None] = {}
        rss: dict[int, int | None] = {}
        for p in plist.procs:
            if p.used_mib is not None:
                gpu_mem[p.pid] = gpu_mem.get(p.pid, 0.0) + p.used_mib
            cpu.setdefault(p.pid, p.cpu_pct)
            rss.setdefault(p.pid, p.rss_bytes)
        for j in plist.job_procs:
            cpu[j.pid] = j.cpu_pct if j.cpu_pct is not None else cpu.get(j.pid)
            rss[j.pid] = j.rss_bytes if j.rss_bytes is not None else rss.get(j.pid)
        host = plist.host
        for key in [k for k in self._series if k[0] == host and k[1] not in cpu]:
            del self._series[key]  # gone from the host's list
        for pid in cpu:
            series = self._series.get((host, pid))
            if series is None:
                series = self._series[(host, pid)] = deque(maxlen=self.points)
            series.append(ProcPoint(plist.t, cpu[pid], rss[pid], gpu_mem.get(pid)))

    def get(self, host: str, pid: int) -> list[ProcPoint]:
        """The process's listings, oldest first ([] when unknown)."""
        return list(self._series.get((host, pid), ()))
