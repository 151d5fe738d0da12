"""The host sampler: CPU, load, memory, network, disk and the agent's own cost, from /proc
(kept-open files, one pread each) or psutil. Standard library only; psutil imported when asked."""

from __future__ import annotations

import os
import time

from .strides import CPU_EVERY, SLOW_EVERY
from .wire import r2

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .wire import Fields

    CpuTimes = list[tuple[float, float, float]]  # per core (total, idle, iowait); 0: machine

# The buffer a kept-open /proc file is read into, doubled while a read fills it (at most
# PROC_MAX_READ). One buffer per file, reused: a fresh 256 KiB bytes object per read went to
# mmap/mremap/munmap on every tick whenever glibc's mmap threshold had not been raised.
PROC_FIRST_READ = 16 * 1024
PROC_MAX_READ = 4 * 1024 * 1024


def _pread_into(fd: int, buf: bytearray) -> int:
    """Fill ``buf`` from offset 0 of ``fd`` with one syscall; the byte count read."""
    preadv = getattr(os, "preadv", None)  # Linux (and Python >= 3.7); else one pread
    if preadv is not None:
        return preadv(fd, [buf], 0)
    data = os.pread(fd, len(buf), 0)
    buf[: len(data)] = data
    return len(data)


class ProcFile:
    """A /proc file kept open and re-read from offset 0 into one reused buffer (saves an open
    and an allocation per tick). ``first``: the buffer's first size; ``limit``: the most read."""

    def __init__(self, path: str, first: int = PROC_FIRST_READ, limit: int = PROC_MAX_READ) -> None:
        self.path = path
        self.fd: int | None = None
        self.limit = limit
        self.buf = bytearray(min(first, limit))

    def raw(self) -> bytes | None:
        """The whole file (its first ``limit`` bytes), None when it cannot be read."""
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY)
            # One read: a syscall costs more than the parsing on a VM, and these files are small.
            while True:
                n = _pread_into(self.fd, self.buf)
                if n < len(self.buf) or len(self.buf) >= self.limit:
                    return bytes(self.buf[:n])
                # a full buffer: the file may go on
                self.buf = bytearray(min(2 * len(self.buf), self.limit))
        except OSError:
            self.close()
            return None

    def read(self) -> str:
        """The whole file as text, or "" when it cannot be read."""
        data = self.raw()
        return "" if data is None else data.decode("ascii", "replace")

    def close(self) -> None:
        """Close the file (it is reopened on the next read)."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def read_bytes(path: str, limit: int = 1 << 20) -> bytes | None:
    """Up to ``limit`` bytes of a file, None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _whole_disks() -> frozenset[str] | None:
    """Block devices that are whole disks (partitions, loop, ram, dm and md would double count)."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    skip = ("loop", "ram", "zram", "dm-", "md", "sr", "fd")
    return frozenset(n for n in names if not n.startswith(skip))


def _cpu_busy(cpu: CpuTimes, pcpu: CpuTimes) -> tuple[float | None, float | None, list[float]]:
    """(machine busy %, iowait %, per-core busy %) between two ``HostSampler._cpu`` readings."""
    if len(pcpu) != len(cpu):  # a CPU went on- or offline: skip one interval
        return None, None, []
    whole: float | None = None
    iowait: float | None = None
    per_core: list[float] = []
    for i, (tot, idle, io) in enumerate(cpu):
        dtot = tot - pcpu[i][0]
        busy = io_pct = 0.0
        if dtot > 0:
            busy = 100.0 * (1.0 - (idle - pcpu[i][1]) / dtot)
            io_pct = 100.0 * (io - pcpu[i][2]) / dtot
        busy = round(min(100.0, max(0.0, busy)), 1)
        if i == 0:
            whole = busy
            iowait = round(max(0.0, io_pct), 1)
        else:
            per_core.append(busy)
    return whole, iowait, per_core


class HostSampler:
    """CPU, load, memory, network, disk and the agent's own cost: psutil or /proc."""

    def __init__(
        self, mode: str = "auto", slow_every: int = SLOW_EVERY, cpu_every: int = CPU_EVERY
    ) -> None:
        self.psutil: Any = None
        self.cpu_every = max(1, int(cpu_every))
        # CPU every ``cpu_every`` ticks; memory, network, disk, load and the agent's RSS every
        # ``slow_every``: on a VM each /proc read costs ~0.1 ms once the agent wakes from its
        # one-second sleep, more than the parsing, and those values are shown, not diagnosed.
        self.slow_every = max(1, int(slow_every))
        # auto prefers /proc where it exists: measured on an H200 node, psutil's per-core and
        # per-NIC calls cost ~1 ms a tick against ~0.3 ms for reading /proc ourselves.
        if mode == "auto" and os.path.exists("/proc/stat"):
            mode = "proc"
        if mode in ("auto", "psutil") and not os.environ.get("VERL_TOP_AGENT_NO_PSUTIL"):
            try:
                import psutil  # noqa: PLC0415 - optional, lazily imported

                self.psutil = psutil
            except Exception:
                self.psutil = None
        self.mode = "psutil" if self.psutil is not None else "proc"
        self._stat = ProcFile("/proc/stat")
        self._meminfo = ProcFile("/proc/meminfo")
        self._netdev = ProcFile("/proc/net/dev")
        self._diskstats = ProcFile("/proc/diskstats")
        self._statm = ProcFile("/proc/self/statm")
        self._loadavg = ProcFile("/proc/loadavg")
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._disks = _whole_disks()
        self._disks_at = time.monotonic()
        self._proc_self = self.psutil.Process() if self.psutil is not None else None
        self._prev: tuple[float, CpuTimes, float] | None = None  # (mono, per core, agent cpu)
        self._n = 0
        self._slow: tuple[Fields, int | None] | None = None  # strided pairs, repeated
        self._head: tuple[Fields, float | None] | None = None  # the CPU pairs, likewise
        # (mono, net, disk) of the last strided read
        self._slow_prev: tuple[float, tuple[int, int], tuple[int, int] | None] | None = None
        self.cpu_count = os.cpu_count()
        # "cpu" then one line per core: the rest of /proc/stat is skipped
        self.cpu_lines = (self.cpu_count or 1) + 1
        self.mem_total = self._mem()[1]
        self.sample(time.time())  # prime the deltas so the first tick has rates
        self._n = 0  # ...and reads the strided values again, now with rates

    # raw readers ------------------------------------------------------------------------------
    def _cpu(self) -> CpuTimes:
        """Per-core (total, idle, iowait) jiffies/seconds; index 0 is the whole machine."""
        if self.psutil is not None:
            out = []
            total = self.psutil.cpu_times()
            for ct in [total] + self.psutil.cpu_times(percpu=True):
                tot = sum(ct)
                # guest time is already counted in user/nice on Linux
                tot -= getattr(ct, "guest", 0.0) + getattr(ct, "guest_nice", 0.0)
                io = getattr(ct, "iowait", 0.0)
                out.append((tot, ct.idle + io, io))
            return out
        out = []
        for line in self._stat.read().split("\n", self.cpu_lines)[: self.cpu_lines]:
            if not line.startswith("cpu"):
                break
            # user nice system idle iowait irq softirq steal
            vals = list(map(int, line.split(None, 9)[1:9]))
            io = vals[4] if len(vals) > 4 else 0
            out.append((sum(vals), vals[3] + io, io))
        return out

    def _mem(self) -> tuple[int | None, int | None]:
        """(used, total) bytes; used = total - available, as free(1) and htop count it."""
        if self.psutil is not None:
            vm = self.psutil.virtual_memory()
            return vm.total - vm.available, vm.total
        info: dict[str, int] = {}
        for line in self._meminfo.read().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"):
                info[key] = int(rest.split()[0]) * 1024
                if "MemAvailable" in info and "MemTotal" in info:
                    break  # the first lines; the other ~50 are not needed
        total = info.get("MemTotal")
        avail = info.get("MemAvailable")
        if avail is None and total is not None:
            avail = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
        if total is None:
            return None, None
        return total - avail, total

    def _net(self) -> tuple[int, int]:
        """(received, sent) bytes of every interface but lo since boot."""
        if self.psutil is not None:
            rx = tx = 0
            for name, c in self.psutil.net_io_counters(pernic=True).items():
                if name != "lo":
                    rx += c.bytes_recv
                    tx += c.bytes_sent
            return rx, tx
        rx = tx = 0
        for line in self._netdev.read().splitlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            f = rest.split()
            if len(f) >= 9:
                rx += int(f[0])
                tx += int(f[8])
        return rx, tx

    def _disk(self, mono: float) -> tuple[int, int] | None:
        """(read, written) bytes of the whole disks since boot; the disk list every minute."""
        if mono - self._disks_at > 60.0:
            self._disks = _whole_disks()
            self._disks_at = mono
        disks = self._disks
        rd = wr = 0
        if self.psutil is not None:
            try:
                counters = self.psutil.disk_io_counters(perdisk=True) or {}
            except Exception:
                return None
            for name, c in counters.items():
                if disks is None or name in disks:
                    rd += c.read_bytes
                    wr += c.write_bytes
            return rd, wr
        text = self._diskstats.read()
        if not text:
            return None
        for line in text.splitlines():
            f = line.split()
            if len(f) >= 10 and (disks is None or f[2] in disks):
                rd += int(f[5]) * 512  # sectors are always 512 bytes in diskstats
                wr += int(f[9]) * 512
        return rd, wr

    def _load(self) -> tuple[float | None, float | None, float | None]:
        """Load averages from a kept-open /proc/loadavg (os.getloadavg opens it every call)."""
        parts = self._loadavg.read().split()
        if len(parts) >= 3:
            try:
                return float(parts[0]), float(parts[1]), float(parts[2])
            except ValueError:
                pass
        try:
            return os.getloadavg()
        except OSError:
            return (None, None, None)

    def agent_rss(self) -> int | None:
        """The agent's resident memory in bytes."""
        if self._proc_self is not None:
            try:
                return self._proc_self.memory_info().rss
            except Exception:
                return None
        text = self._statm.read()
        parts = text.split()
        return int(parts[1]) * self._page if len(parts) > 1 else None

    @staticmethod
    def agent_cpu_s() -> float:
        """CPU seconds the agent's process has used, all threads (ns resolution: os.times()
        counts 10 ms clock ticks, so a 1 s interval read as whole percents)."""
        return time.process_time()

    # sample -----------------------------------------------------------------------------------
    def sample(self, now: float) -> Fields:
        """Field pairs of a host record (rates over the time since the previous read)."""
        mono = time.monotonic()
        self._n += 1
        if self._head is None or self._n % self.cpu_every == 1 % self.cpu_every:
            self._head = self._cpu_fields(mono)
        if self._slow is None or self._n % self.slow_every == 1 % self.slow_every:
            self._slow = self._slow_fields(mono)
        head, agent_pct = self._head
        fields, rss = self._slow
        return head + fields + (("agent_cpu_pct", agent_pct), ("agent_rss_bytes", rss))

    def _cpu_fields(self, mono: float) -> tuple[Fields, float | None]:
        """(field pairs, agent CPU %): machine, iowait and per-core busy % since the last read."""
        cpu = self._cpu()
        acpu = self.agent_cpu_s()
        prev = self._prev
        self._prev = (mono, cpu, acpu)
        cpu_pct = iowait = agent_pct = None
        per_core = []
        if prev is not None and mono > prev[0]:
            cpu_pct, iowait, per_core = _cpu_busy(cpu, prev[1])
            agent_pct = round(100.0 * (acpu - prev[2]) / (mono - prev[0]), 2)
        return (("cpu_pct", cpu_pct), ("cpu_per_core", per_core), ("iowait_pct", iowait)), agent_pct

    def _slow_fields(self, mono: float) -> tuple[Fields, int | None]:
        """(field pairs, agent RSS): memory, network and disk (rates since the last strided read),
        load averages, and the agent's resident size."""
        net = self._net()
        disk = self._disk(mono)
        used, total = self._mem()
        load = self._load()
        prev = self._slow_prev
        self._slow_prev = (mono, net, disk)
        net_rx = net_tx = d_rd = d_wr = None
        if prev is not None and mono > prev[0]:
            dt = mono - prev[0]
            net_rx = round(max(0, net[0] - prev[1][0]) / dt, 1)
            net_tx = round(max(0, net[1] - prev[1][1]) / dt, 1)
            if disk is not None and prev[2] is not None:
                d_rd = round(max(0, disk[0] - prev[2][0]) / dt, 1)
                d_wr = round(max(0, disk[1] - prev[2][1]) / dt, 1)
        return (
            ("load1", r2(load[0])),
            ("load5", r2(load[1])),
            ("load15", r2(load[2])),
            ("mem_used_bytes", used),
            ("mem_total_bytes", total),
            ("net_rx_bps", net_rx),
            ("net_tx_bps", net_tx),
            ("disk_read_bps", d_rd),
            ("disk_write_bps", d_wr),
        ), self.agent_rss()

    def close(self) -> None:
        """Close the kept-open /proc files."""
        for pf in (
            self._stat,
            self._meminfo,
            self._netdev,
            self._diskstats,
            self._statm,
            self._loadavg,
        ):
            pf.close()
