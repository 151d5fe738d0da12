"""verl-top node agent: samples GPUs, the host and GPU processes, follows log files.

ONE self-contained file, standard library only at import, Python >= 3.8. It is shipped as text
over SSH (see ``verl_top.agent.BOOTSTRAP``) and exec()ed as ``__main__``; it imports nothing from
verl_top. NVML is called through ctypes (libnvidia-ml.so.1, no module needed; ``--nvml pynvml``
uses the pynvml module instead); psutil is used when asked for; both imported lazily.

Output: NDJSON on stdout, one record per line, in the wire format of ``verl_top/protocol.py``
(``{"v":1,"type":...,"host":...,"t":...,fields}``, None fields left out). Input: JSON control
lines on stdin; the agent exits when stdin reaches EOF or stdout breaks. See docs/protocol.md.
The file is pure ASCII so that its character count equals its byte count in any locale.
"""

from __future__ import annotations

import json
import os
import stat  # already loaded by os: free
import sys
import time

# Everything else is imported where it is used (argparse, re, subprocess, threading, ...): a
# module the agent does not need on its path costs resident memory for the agent's whole life.

AGENT_VERSION = "0.1.0"
PROTOCOL_VERSION = 1
MIB = 1048576.0

FOLLOW_KINDS = ("verl", "nccl", "verl_config")
MAX_LINES_PER_RECORD = 500
MAX_READ_PER_POLL = 8 * 1024 * 1024  # bytes read from one followed file per tick
MAX_PARTIAL = 1024 * 1024  # a "line" longer than this is emitted without its newline
MAX_CHARS_PER_RECORD = 256 * 1024  # log lines per record also stop here (fast to decode)
HEAD_BYTES = 4096  # fingerprint of a followed file: its first bytes (copytruncate detection)
HEARTBEAT_S = 5.0
PROC_READ = 256 * 1024  # one read of a /proc file; larger files are read on in a loop
PROCS_FORCE_S = 30.0
LOST_RETRY_S = 30.0
GPM_MIN_GAP_S = 0.1  # NVML: GPM samples closer than 100 ms give no valid metrics
# Ticks between GPM samples. On the H200 one GPM sample costs ~2.5 ms of CPU (the other reads of
# a tick ~0.2 ms), so GPM has its own stride; between samples the last window's values repeat.
GPM_EVERY = 10
SLOW_EVERY = 5  # ticks between reads of values that change slowly (temperature, memory clock)
# GPU memory and host CPU every 2nd tick: at 1 Hz on an H200 VM the memory read alone costs
# ~0.06 ms and /proc/stat ~0.14 ms (the driver and the VM answer a call made once a second
# cold; benchmarks/nvml_cold.py), and 2 s is what btop and htop refresh at by default.
MEM_EVERY = 2
CPU_EVERY = 2
NVML_FI_POWER_AVERAGE = 185  # nvml.h NVML_FI_DEV_POWER_AVERAGE: what nvmlDeviceGetPowerUsage gives

# NVML return codes (nvml.h); compared with NVMLError.value so any pynvml version works.
NVML_NOT_SUPPORTED = 3
NVML_NO_PERMISSION = 4
NVML_DRIVER_NOT_LOADED = 9
NVML_LIBRARY_NOT_FOUND = 12
NVML_FUNCTION_NOT_FOUND = 13
NVML_GPU_IS_LOST = 15
NVML_RESET_REQUIRED = 16
NVML_LIB_RM_VERSION_MISMATCH = 18

MISMATCH_MSG = "Driver/library version mismatch: reload the NVIDIA kernel module or reboot"
NVML_INIT_REASONS = {
    NVML_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    NVML_LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1)",
    NVML_LIB_RM_VERSION_MISMATCH: MISMATCH_MSG,
}

# GPM metric id -> gpu record field (ids from nvml.h nvmlGpmMetricId_t).
GPM_METRICS = (
    (2, "sm_util"),
    (3, "sm_occupancy"),
    (5, "tensor_util"),
    (10, "dram_util"),
    (60, "nvlink_rx_mibs"),
    (61, "nvlink_tx_mibs"),
    (20, "pcie_tx_mibs"),
    (21, "pcie_rx_mibs"),
)
# H200 trace GPM keys -> gpu record field.
TRACE_GPM_KEYS = (
    ("SM_UTIL", "sm_util"),
    ("SM_OCCUPANCY", "sm_occupancy"),
    ("ANY_TENSOR_UTIL", "tensor_util"),
    ("DRAM_BW_UTIL", "dram_util"),
    ("NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_mibs"),
    ("NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_mibs"),
    ("PCIE_TX_PER_SEC", "pcie_tx_mibs"),
    ("PCIE_RX_PER_SEC", "pcie_rx_mibs"),
)

# Field order of each record type, exactly as in verl_top/model.py (the wire order of to_dict).
GPU_FIELDS = (
    "index", "util_gpu", "util_mem", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w",
    "temp_c", "sm_mhz", "mem_mhz", "clock_reasons", "sm_util", "sm_occupancy", "tensor_util",
    "dram_util", "nvlink_tx_mibs", "nvlink_rx_mibs", "pcie_tx_mibs", "pcie_rx_mibs", "lost",
    "label",
)  # fmt: skip
PERCENT_FIELDS = frozenset(
    ("util_gpu", "util_mem", "sm_util", "sm_occupancy", "tensor_util", "dram_util")
)

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _record(rtype, host, t, fields):
    """A wire dict: v, type, host, t, then ``fields`` in order, None values left out."""
    out = {"v": PROTOCOL_VERSION, "type": rtype, "host": host, "t": t}
    for k, v in fields:
        if v is not None:
            out[k] = v
    return out


def _finite(value):
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items() if _finite(v) is not None}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def encode_line(record):
    """One compact JSON line for a wire dict."""
    try:
        return _dumps(record)
    except ValueError:  # a NaN slipped in: drop it rather than emit invalid JSON
        return _dumps(_finite(record))


def _text(value):
    """NVML returns bytes in old bindings and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _r1(x):
    return None if x is None else round(x, 1)


def _r2(x):
    return None if x is None else round(x, 2)


# ----------------------------------------------------------------------------------------------
# /proc helpers


class ProcFile:
    """A /proc file kept open and re-read from offset 0 (saves an open per tick)."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def read(self):
        """The whole file as text, or "" when it cannot be read."""
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY)
            # One pread: a syscall costs more than the parsing on a VM, and these files are small.
            data = os.pread(self.fd, PROC_READ, 0)
            if len(data) < PROC_READ:
                return data.decode("ascii", "replace")
            chunks = [data]
            while True:
                chunk = os.pread(self.fd, PROC_READ, sum(len(c) for c in chunks))
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode("ascii", "replace")
        except OSError:
            self.close()
            return ""

    def close(self):
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def _read_bytes(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _whole_disks():
    """Block devices that are whole disks (partitions, loop, ram, dm and md would double count)."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    skip = ("loop", "ram", "zram", "dm-", "md", "sr", "fd")
    return frozenset(n for n in names if not n.startswith(skip))


# ----------------------------------------------------------------------------------------------
# Host sampler


def _cpu_busy(cpu, pcpu):
    """(machine busy %, iowait %, per-core busy %) between two ``HostSampler._cpu`` readings."""
    if len(pcpu) != len(cpu):  # a CPU went on- or offline: skip one interval
        return None, None, []
    whole = iowait = None
    per_core = []
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

    def __init__(self, mode="auto", slow_every=SLOW_EVERY, cpu_every=CPU_EVERY):
        self.psutil = None
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
        self._prev = None  # (mono, cpu_times per core, agent cpu)
        self._n = 0
        self._slow = None  # the strided field pairs, repeated between their reads
        self._head = None  # the CPU field pairs, likewise
        self._slow_prev = None  # (mono, net, disk) of the last strided read
        self.cpu_count = os.cpu_count()
        self.cpu_lines = (
            self.cpu_count or 1
        ) + 1  # "cpu" then one line per core: the rest is skipped
        self.mem_total = self._mem()[1]
        self.sample(time.time())  # prime the deltas so the first tick has rates
        self._n = 0  # ...and reads the strided values again, now with rates

    # raw readers ------------------------------------------------------------------------------
    def _cpu(self):
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

    def _mem(self):
        if self.psutil is not None:
            vm = self.psutil.virtual_memory()
            return vm.total - vm.available, vm.total
        info = {}
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

    def _net(self):
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

    def _disk(self, mono):
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

    def _load(self):
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

    def agent_rss(self):
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
    def agent_cpu_s():
        """CPU seconds the agent's process has used, all threads (ns resolution: os.times()
        counts 10 ms clock ticks, so a 1 s interval read as whole percents)."""
        return time.process_time()

    # sample -----------------------------------------------------------------------------------
    def sample(self, now):
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

    def _cpu_fields(self, mono):
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

    def _slow_fields(self, mono):
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
            ("load1", _r2(load[0])),
            ("load5", _r2(load[1])),
            ("load15", _r2(load[2])),
            ("mem_used_bytes", used),
            ("mem_total_bytes", total),
            ("net_rx_bps", net_rx),
            ("net_tx_bps", net_tx),
            ("disk_read_bps", d_rd),
            ("disk_write_bps", d_wr),
        ), self.agent_rss()

    def close(self):
        for pf in (
            self._stat,
            self._meminfo,
            self._netdev,
            self._diskstats,
            self._statm,
            self._loadavg,
        ):
            pf.close()


# ----------------------------------------------------------------------------------------------
# GPU process enrichment


class ProcInspector:
    """Learns user, command, CPU %, RSS and RANK/LOCAL_RANK of pids from /proc (or psutil)."""

    def __init__(self):
        self._users = {}
        self._static = {}  # pid -> (starttime, user, cmd, env_rank, env_local_rank)
        self._cpu = {}  # pid -> (mono, cpu ticks)
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._has_proc = os.path.isdir("/proc/self")
        self._psutil = None
        if not self._has_proc:
            try:
                import psutil  # noqa: PLC0415

                self._psutil = psutil
            except Exception:
                self._psutil = None

    def _user(self, uid):
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
    def _env_ranks(pid):
        data = _read_bytes("/proc/%d/environ" % pid, 1 << 22)
        rank = local = None
        if data:
            for item in data.split(b"\0"):
                if item.startswith(b"RANK="):
                    rank = _int_or_none(item[5:])
                elif item.startswith(b"LOCAL_RANK="):
                    local = _int_or_none(item[11:])
        return rank, local

    def inspect(self, pid):
        """Dict of GpuProcess fields for ``pid``; visible=False when /proc does not show it."""
        if self._psutil is not None:
            return self._inspect_psutil(pid)
        if not self._has_proc:
            return {"visible": False}
        stat = _read_bytes("/proc/%d/stat" % pid, 4096)
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
                uid = os.stat("/proc/%d" % pid).st_uid
                user = self._user(uid)
            except OSError:
                user = ""
            rank, local = self._env_ranks(pid)
            static = (start, user, "", rank, local)
            self._static[pid] = static
            self._cpu.pop(pid, None)
        # The title is read every time: Ray rewrites it per task ("ray::WorkerDict.actor_rollout_
        # generate_sequences"), so it tells which method the worker is running now.
        raw = _read_bytes("/proc/%d/cmdline" % pid, 65536) or b""
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

    def _inspect_psutil(self, pid):
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
                    info["env_rank"] = _int_or_none(env.get("RANK"))
                    info["env_local_rank"] = _int_or_none(env.get("LOCAL_RANK"))
                except Exception:
                    pass
            return info
        except Exception:
            return {"visible": False}

    def forget_except(self, pids):
        """Drop cached state of pids that are gone."""
        for cache in (self._static, self._cpu):
            for pid in [p for p in cache if p not in pids]:
                del cache[pid]


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


PROC_FIELDS = (
    "pid", "gpu_index", "used_mib", "user", "cmd", "cpu_pct", "rss_bytes", "visible", "role",
    "rank", "env_rank", "env_local_rank",
)  # fmt: skip


def proc_dict(pid, gpu_index, used_mib, info):
    """A GpuProcess wire dict in model order, None fields left out."""
    values = {
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


# ----------------------------------------------------------------------------------------------
# GPU backends. Each has: name, driver, nvml_version, gpus (GpuInfo dicts), capabilities, error,
# blocking, sample(now) -> list of field-pair tuples (one per GPU), processes() -> list of
# (pid, gpu_index, used_mib) or None, close().


def gpu_info(index, name="", uuid="", mem_total_mib=None, bus_id="", power_limit_w=None, gpm=False):
    """A GpuInfo wire dict in model order."""
    out = {"index": index, "name": name, "uuid": uuid}
    if mem_total_mib is not None:
        out["mem_total_mib"] = mem_total_mib
    out["bus_id"] = bus_id
    if power_limit_w is not None:
        out["power_limit_w"] = power_limit_w
    out["gpm"] = bool(gpm)
    return out


class BackendUnavailable(Exception):
    """A backend cannot start; the message says why in plain words."""


class NoneBackend:
    """No GPUs: host samples still flow, hello.error says why."""

    name = "none"
    blocking = False

    def __init__(self, error=""):
        self.driver = ""
        self.nvml_version = ""
        self.gpus = []
        self.capabilities = []
        self.error = error or "no GPU backend selected"

    def sample(self, now):
        return []

    def processes(self):
        return None

    def close(self):
        pass


class _GpuLost(Exception):
    pass


def _lost_fields(index):
    return (("index", index), ("lost", True), ("label", ""))


def _nvml_structs():
    """ctypes layouts of the nvml.h structs the fast path fills (made once, on first use)."""
    import ctypes as c  # noqa: PLC0415 - only the NVML fast path needs it

    class Utilization(c.Structure):
        _fields_ = (("gpu", c.c_uint), ("memory", c.c_uint))

    class MemoryV2(c.Structure):
        _fields_ = (
            ("version", c.c_uint),
            ("total", c.c_ulonglong),
            ("reserved", c.c_ulonglong),
            ("free", c.c_ulonglong),
            ("used", c.c_ulonglong),
        )

    class Value(c.Union):
        _fields_ = (
            ("dVal", c.c_double),
            ("uiVal", c.c_uint),
            ("ulVal", c.c_ulong),
            ("ullVal", c.c_ulonglong),
            ("sllVal", c.c_longlong),
            ("siVal", c.c_int),
            ("usVal", c.c_ushort),
        )

    class FieldValue(c.Structure):
        _fields_ = (
            ("fieldId", c.c_uint),
            ("scopeId", c.c_uint),
            ("timestamp", c.c_longlong),
            ("latencyUsec", c.c_longlong),
            ("valueType", c.c_int),
            ("nvmlReturn", c.c_int),
            ("value", Value),
        )

    return c, Utilization, MemoryV2, FieldValue


_VALUE_KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t
NVML_MEMORY_V2 = 0x02000028  # nvml.h nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24


class _DirectNvml:
    """The per-tick NVML reads through the library's C entry points, with every buffer made once.

    pynvml's getters allocate a ctypes struct, a byref() and an exception check per call; here
    each GPU owns its structs and pre-built pointers, and a call is one C call plus reading the
    struct. Power comes from one ``nvmlDeviceGetFieldValues`` call per GPU (the only per-tick
    value of a gpu record that NVML offers as a field; utilisation, memory, clocks, temperature
    and clock-event reasons have no field ids).
    """

    def __init__(self, fp, count):
        c, Utilization, MemoryV2, FieldValue = _nvml_structs()
        self.util_fn = fp("nvmlDeviceGetUtilizationRates")
        self.mem_fn = fp("nvmlDeviceGetMemoryInfo_v2")
        self.clock_fn = fp("nvmlDeviceGetClockInfo")
        self.temp_fn = fp("nvmlDeviceGetTemperature")
        self.fields_fn = fp("nvmlDeviceGetFieldValues")
        try:
            self.reasons_fn = fp("nvmlDeviceGetCurrentClocksEventReasons")
        except Exception:  # drivers before 535 have only the old name
            self.reasons_fn = fp("nvmlDeviceGetCurrentClocksThrottleReasons")
        self.power_fn = fp("nvmlDeviceGetPowerUsage")
        self.use_fields = True
        self.bufs = []
        for _ in range(count):
            util, mem = Utilization(), MemoryV2()
            mem.version = NVML_MEMORY_V2
            sm, memclk, temp, power = c.c_uint(), c.c_uint(), c.c_uint(), c.c_uint()
            reasons = c.c_ulonglong()
            fv = (FieldValue * 1)()
            fv[0].fieldId = NVML_FI_POWER_AVERAGE
            ptrs = tuple(c.pointer(x) for x in (util, mem, sm, memclk, temp, reasons, power))
            self.bufs.append((util, mem, sm, memclk, temp, reasons, power, fv, ptrs))
        self.n1 = c.c_int(1)

    @classmethod
    def make(cls, nv, count):
        """The fast path when the binding exposes its C entry points (pynvml does), else None."""
        fp = getattr(nv, "_nvmlGetFunctionPointer", None)
        if fp is None or os.environ.get("VERL_TOP_AGENT_NVML_API"):
            return None
        try:
            return cls(fp, count)
        except Exception:  # an old library without one of the entry points: pynvml's getters
            return None

    def read(self, i, h, f, slow, mem_due, rc, un):
        """Fill ``f`` (GPU i's reused field dict); ``slow``/``mem_due``: the strided values are
        due; ``rc(i, key, code)`` handles return codes and ``un`` holds the (gpu, key) pairs
        known to be unsupported."""
        util, mem, sm, memclk, temp, reasons, power, fv, p = self.bufs[i]
        if (i, "util") not in un and rc(i, "util", self.util_fn(h, p[0])):
            f["util_gpu"] = util.gpu
            f["util_mem"] = util.memory
        if (mem_due or "mem_used_mib" not in f) and (i, "mem") not in un:
            if rc(i, "mem", self.mem_fn(h, p[1])):
                f["mem_used_mib"] = round(mem.used / MIB, 1)
                f["mem_total_mib"] = round(mem.total / MIB, 1)
        self._power(i, h, f, fv, power, p[6], rc, un)
        if (i, "sm_clk") not in un and rc(i, "sm_clk", self.clock_fn(h, 1, p[2])):
            f["sm_mhz"] = sm.value  # NVML_CLOCK_SM
        if (i, "reasons") not in un and rc(i, "reasons", self.reasons_fn(h, p[5])):
            f["clock_reasons"] = reasons.value
        if slow or "temp_c" not in f:
            if (i, "temp") not in un and rc(i, "temp", self.temp_fn(h, 0, p[4])):
                f["temp_c"] = temp.value  # NVML_TEMPERATURE_GPU
            if (i, "mem_clk") not in un and rc(i, "mem_clk", self.clock_fn(h, 2, p[3])):
                f["mem_mhz"] = memclk.value  # NVML_CLOCK_MEM
            f.setdefault("temp_c", None)

    def _power(self, i, h, f, fv, power, ptr, rc, un):
        if self.use_fields:
            code = self.fields_fn(h, self.n1, fv)
            if code == 0 and fv[0].nvmlReturn == 0:
                v = getattr(fv[0].value, _VALUE_KINDS[fv[0].valueType % 7])
                f["power_w"] = round(v / 1000.0, 1)
                return
            if code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise _GpuLost()
            self.use_fields = False  # the field is not offered here: the plain getter from now on
        if (i, "power") not in un and rc(i, "power", self.power_fn(h, ptr)):
            f["power_w"] = round(power.value / 1000.0, 1)


class NvmlCallError(Exception):
    """An NVML call returned an error code (``value``), like pynvml's NVMLError."""

    def __init__(self, value, text=""):
        Exception.__init__(self, text or "NVML error %d" % value)
        self.value = value


GPM_METRICS_ROOM = 512  # entries of nvmlGpmMetricsGet_t.metrics (nvml.h's maximum is below that)


class CtypesNvml:
    """The NVML calls the agent makes, straight from libnvidia-ml.so.1 through ctypes: the same
    names and return values as pynvml's (what ``NvmlBackend`` uses), without importing pynvml,
    whose module alone keeps ~4 MB resident. Struct layouts follow nvml.h."""

    NVMLError = NvmlCallError
    nvmlMemory_v2 = NVML_MEMORY_V2
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, path="libnvidia-ml.so.1"):
        import ctypes as c  # noqa: PLC0415

        self.c = c
        try:
            self.lib = c.CDLL(path)
        except OSError as exc:
            raise BackendUnavailable("NVML library not found (libnvidia-ml.so.1): %s" % exc)
        self._fns = {}
        _, self.Utilization, self.MemoryV2, _ = _nvml_structs()

        class MemoryV1(c.Structure):
            _fields_ = (("total", c.c_ulonglong), ("free", c.c_ulonglong), ("used", c.c_ulonglong))

        class PciInfo(c.Structure):
            _fields_ = (
                ("busIdLegacy", c.c_char * 16),
                ("domain", c.c_uint),
                ("bus", c.c_uint),
                ("device", c.c_uint),
                ("pciDeviceId", c.c_uint),
                ("pciSubSystemId", c.c_uint),
                ("busId", c.c_char * 32),
            )

        class GpmSupport(c.Structure):
            _fields_ = (("version", c.c_uint), ("isSupportedDevice", c.c_uint))

        class MetricInfo(c.Structure):
            _fields_ = (("shortName", c.c_char_p), ("longName", c.c_char_p), ("unit", c.c_char_p))

        class GpmMetric(c.Structure):
            _fields_ = (
                ("metricId", c.c_uint),
                ("nvmlReturn", c.c_int),
                ("value", c.c_double),
                ("metricInfo", MetricInfo),
            )

        class GpmMetricsGet(c.Structure):
            _fields_ = (
                ("version", c.c_uint),
                ("numMetrics", c.c_uint),
                ("sample1", c.c_void_p),
                ("sample2", c.c_void_p),
                ("metrics", GpmMetric * GPM_METRICS_ROOM),
            )

        class ProcessInfo(c.Structure):  # nvmlProcessInfo_v2_t, what the _v3 calls fill
            _fields_ = (
                ("pid", c.c_uint),
                ("usedGpuMemory", c.c_ulonglong),
                ("gpuInstanceId", c.c_uint),
                ("computeInstanceId", c.c_uint),
            )

        self.MemoryV1, self.PciInfo, self.GpmSupport = MemoryV1, PciInfo, GpmSupport
        self.c_nvmlGpmMetricsGet_t = GpmMetricsGet
        self.ProcessInfo = ProcessInfo

    # plumbing ---------------------------------------------------------------------------------
    def _nvmlGetFunctionPointer(self, name):
        fn = self._fns.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise NvmlCallError(NVML_FUNCTION_NOT_FOUND, "NVML has no %s" % name)
            self._fns[name] = fn
        return fn

    def _call(self, name, *args):
        rc = self._nvmlGetFunctionPointer(name)(*args)
        if rc:
            raise NvmlCallError(rc, "%s: %s" % (name, self._error_text(rc)))

    def _error_text(self, rc):
        try:
            fn = self._nvmlGetFunctionPointer("nvmlErrorString")
            fn.restype = self.c.c_char_p
            return _text(fn(rc))
        except Exception:
            return "error %d" % rc

    def _string(self, name, *args):
        buf = self.c.create_string_buffer(96)
        self._call(name, *(args + (buf, self.c.c_uint(96))))
        return buf.value.decode("utf-8", "replace")

    def _scalar(self, ctype, name, *args):
        out = ctype()
        self._call(name, *(args + (self.c.byref(out),)))
        return out.value

    # the pynvml names NvmlBackend uses ----------------------------------------------------------
    def nvmlInit(self):
        try:
            self._call("nvmlInit_v2")
        except NvmlCallError as exc:
            if exc.value != NVML_FUNCTION_NOT_FOUND:
                raise
            self._call("nvmlInit")

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self):
        return self._string("nvmlSystemGetDriverVersion")

    def nvmlSystemGetNVMLVersion(self):
        return self._string("nvmlSystemGetNVMLVersion")

    def nvmlDeviceGetCount(self):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetCount_v2")

    def nvmlDeviceGetHandleByIndex(self, index):
        h = self.c.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", self.c.c_uint(index), self.c.byref(h))
        return h

    def nvmlDeviceGetName(self, h):
        return self._string("nvmlDeviceGetName", h)

    def nvmlDeviceGetUUID(self, h):
        return self._string("nvmlDeviceGetUUID", h)

    def nvmlDeviceGetPciInfo(self, h):
        info = self.PciInfo()
        self._call("nvmlDeviceGetPciInfo_v3", h, self.c.byref(info))
        return info

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version:
            mem = self.MemoryV2()
            mem.version = version
            self._call("nvmlDeviceGetMemoryInfo_v2", h, self.c.byref(mem))
            return mem
        mem = self.MemoryV1()
        self._call("nvmlDeviceGetMemoryInfo", h, self.c.byref(mem))
        return mem

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetEnforcedPowerLimit", h)

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self.Utilization()
        self._call("nvmlDeviceGetUtilizationRates", h, self.c.byref(u))
        return u

    def nvmlDeviceGetPowerUsage(self, h):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetPowerUsage", h)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetTemperature", h, self.c.c_int(sensor))

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetClockInfo", h, self.c.c_int(kind))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._scalar(self.c.c_ulonglong, "nvmlDeviceGetCurrentClocksEventReasons", h)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._scalar(self.c.c_ulonglong, "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def nvmlGpmQueryDeviceSupport(self, h):
        sup = self.GpmSupport()
        sup.version = 1  # NVML_GPM_SUPPORT_VERSION
        self._call("nvmlGpmQueryDeviceSupport", h, self.c.byref(sup))
        return sup

    def nvmlGpmSampleAlloc(self):
        sample = self.c.c_void_p()
        self._call("nvmlGpmSampleAlloc", self.c.byref(sample))
        return sample

    def nvmlGpmSampleFree(self, sample):
        self._call("nvmlGpmSampleFree", sample)

    def nvmlGpmSampleGet(self, h, sample):
        self._call("nvmlGpmSampleGet", h, sample)
        return sample

    def nvmlGpmMetricsGet(self, mg):
        self._call("nvmlGpmMetricsGet", self.c.byref(mg))
        return mg

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._scalar(self.c.c_int, "nvmlDeviceGetNvLinkState", h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._scalar(self.c.c_uint, "nvmlDeviceGetNvLinkVersion", h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        name = "nvmlDeviceGetNvLinkRemoteDeviceType"
        return self._scalar(self.c.c_int, name, h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        info = self.PciInfo()
        name = "nvmlDeviceGetNvLinkRemotePciInfo_v2"
        self._call(name, h, self.c.c_uint(link), self.c.byref(info))
        return info

    def nvmlDeviceGetTopologyCommonAncestor(self, h1, h2):
        return self._scalar(self.c.c_int, "nvmlDeviceGetTopologyCommonAncestor", h1, h2)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        """The compute processes on a GPU (room for twice as many as counted, like pynvml)."""
        c = self.c
        fn = self._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        count = c.c_uint(0)
        rc = fn(h, c.byref(count), None)
        if rc == 0:
            return []
        if rc != 7:  # NVML_ERROR_INSUFFICIENT_SIZE: the count is in
            raise NvmlCallError(rc, self._error_text(rc))
        count.value = count.value * 2 + 5
        infos = (self.ProcessInfo * count.value)()
        rc = fn(h, c.byref(count), infos)
        if rc:
            raise NvmlCallError(rc, self._error_text(rc))
        return list(infos[: count.value])


class NvmlBackend:
    """Samples GPUs through pynvml with cached handles, cached NotSupported and GPM."""

    name = "pynvml"
    blocking = False

    def __init__(self, nvml=None, gpm_every=GPM_EVERY, slow_every=SLOW_EVERY, mem_every=MEM_EVERY):
        self.gpm_every = max(1, int(gpm_every))
        self.slow_every = max(1, int(slow_every))
        self.mem_every = max(1, int(mem_every))
        self._ticks = 0
        self._slow_due = self._gpm_due = self._mem_due = True
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - optional
            except Exception as exc:
                raise BackendUnavailable("pynvml (nvidia-ml-py) not installed (%s)" % exc)
        self.nv = nvml
        self.error = ""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            raise BackendUnavailable(NVML_INIT_REASONS.get(code, "NVML init failed: %s" % exc))
        except OSError as exc:  # very old bindings surface dlopen failures raw
            raise BackendUnavailable("NVML library not found (libnvidia-ml.so.1): %s" % exc)
        self._unsupported = set()
        self._lost = {}  # index -> monotonic time of the next retry
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._procs_fns = [
            getattr(nvml, n)
            for n in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
            )
            if hasattr(nvml, n)
        ]
        self.driver = self._static(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        self.nvml_version = self._static(lambda: _text(nvml.nvmlSystemGetNVMLVersion()))
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown()
            raise BackendUnavailable("NVML could not count GPUs: %s" % exc)
        if count == 0:
            self._shutdown()
            raise BackendUnavailable("NVML sees no GPUs")
        self.handles = []
        self.gpus = []
        self._limits = []
        self._totals = []
        self._gpm = []  # per GPU: None or [prev_sample, cur_sample, metrics_struct, last_mono]
        for i in range(count):
            self._init_gpu(i)
        self.capabilities = ["gpm"] if any(g is not None for g in self._gpm) else []
        self.capabilities.append("procs")
        self._fields = [{"index": i, "lost": False, "label": ""} for i in range(count)]
        self._direct = _DirectNvml.make(nvml, count)
        if isinstance(nvml, CtypesNvml):
            self.capabilities.append("nvml-ctypes")

    @staticmethod
    def _static(fn):
        try:
            return fn()
        except Exception:
            return ""

    def _init_gpu(self, i):
        nv = self.nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:
            self.handles.append(None)
            self.gpus.append(gpu_info(i))
            self._limits.append(None)
            self._totals.append(None)
            self._gpm.append(None)
            if getattr(exc, "value", None) in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                self._lost[i] = time.monotonic() + LOST_RETRY_S
            return
        self.handles.append(h)
        name = self._static(lambda: _text(nv.nvmlDeviceGetName(h)))
        uuid = self._static(lambda: _text(nv.nvmlDeviceGetUUID(h)))
        bus = self._static(lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId))
        try:
            mem = self._q(i, "mem", self._memory, h)
            limit_mw = self._q(i, "plimit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        except _GpuLost:
            mem = limit_mw = None
            self._lost[i] = time.monotonic() + LOST_RETRY_S
        total = _r1(mem[1] / MIB) if mem is not None else None
        limit = _r1(limit_mw / 1000.0) if limit_mw is not None else None
        self._totals.append(total)
        self._limits.append(limit)
        gpm = None
        try:
            if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                gpm = self._gpm_init(h)
        except Exception:
            gpm = None
        self._gpm.append(gpm)
        self.gpus.append(gpu_info(i, name, uuid, total, bus, limit, gpm is not None))

    def _gpm_init(self, h):
        nv = self.nv
        prev = nv.nvmlGpmSampleAlloc()
        cur = nv.nvmlGpmSampleAlloc()
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRICS)
        for k, (mid, _) in enumerate(GPM_METRICS):
            mg.metrics[k].metricId = mid
        # The first sample is taken now so the first tick already has an interval to measure.
        nv.nvmlGpmSampleGet(h, prev)
        return [prev, cur, mg, time.monotonic()]

    def _q(self, i, key, fn, *args):
        """Call an NVML getter; None when unsupported (remembered) or failing; raise when lost."""
        if (i, key) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND, NVML_NO_PERMISSION):
                self._unsupported.add((i, key))
                return None
            if code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise _GpuLost()
            return None

    def _memory(self, h):
        """(used, total) bytes: v2 (used excludes driver-reserved memory) else v1."""
        nv = self.nv
        if self._mem_v2 is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=self._mem_v2)
                return m.used, m.total
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) not in (NVML_FUNCTION_NOT_FOUND, NVML_NOT_SUPPORTED):
                    raise
                self._mem_v2 = None
            except TypeError:  # binding without the version argument
                self._mem_v2 = None
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return m.used, m.total

    def _reasons(self, h):
        nv = self.nv
        fn = self._reasons_fn
        if fn is None:
            raise nv.NVMLError(NVML_NOT_SUPPORTED)
        try:
            return fn(h)
        except nv.NVMLError as exc:
            old = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if getattr(exc, "value", None) == NVML_FUNCTION_NOT_FOUND and old and old is not fn:
                self._reasons_fn = old  # older driver: only the old name exists
                return old(h)
            raise

    def _gpm_sample(self, i, h, fields):
        st = self._gpm[i]
        mono = time.monotonic()
        if mono - st[3] < GPM_MIN_GAP_S:
            return
        nv = self.nv
        try:
            nv.nvmlGpmSampleGet(h, st[1])
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise _GpuLost()
            return
        mg = st[2]
        mg.sample1 = st[0]
        mg.sample2 = st[1]
        st[0], st[1], st[3] = st[1], st[0], mono  # the new sample is the next "previous"
        try:
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_NOT_SUPPORTED:
                self._unsupported.add((i, "gpm"))
            return
        metrics = mg.metrics
        for k, (_, name) in enumerate(GPM_METRICS):
            m = metrics[k]
            if m.nvmlReturn == 0:
                fields[name] = round(m.value, 2)

    def _sample_gpu(self, i, h):
        """One GPU's field pairs: fast values every tick, slow ones and GPM on their strides."""
        f = self._fields[i]  # a dict reused tick after tick: only the values change
        if self._direct is not None:
            self._direct.read(i, h, f, self._slow_due, self._mem_due, self._q_rc, self._unsupported)
        else:
            self._read_api(i, h, f)
        if f.get("mem_used_mib") is not None:
            f["mem_total_mib"] = self._totals[i] or f.get("mem_total_mib")
        f["power_limit_w"] = self._limits[i]
        if self._gpm_due and self._gpm[i] is not None and (i, "gpm") not in self._unsupported:
            self._gpm_sample(i, h, f)  # between GPM ticks the last window's values are repeated
        return tuple((k, f[k]) for k in GPU_FIELDS if f.get(k) is not None)

    def _q_rc(self, i, key, code):
        """Handle a raw NVML return code: True when it is success; remember what is unsupported."""
        if code == 0:
            return True
        if code in (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND, NVML_NO_PERMISSION):
            self._unsupported.add((i, key))
        elif code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
            raise _GpuLost()
        return False

    def _read_api(self, i, h, f):
        """The pynvml-function path (bindings without raw entry points, and the tests' fakes)."""
        nv = self.nv
        q = self._q
        u = q(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if u is not None:
            f["util_gpu"] = u.gpu
            f["util_mem"] = u.memory
        if self._mem_due or "mem_used_mib" not in f:
            mem = q(i, "mem", self._memory, h)
            if mem is not None:
                f["mem_used_mib"] = round(mem[0] / MIB, 1)
                f["mem_total_mib"] = round(mem[1] / MIB, 1)
        p = q(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        if p is not None:
            f["power_w"] = round(p / 1000.0, 1)
        f["sm_mhz"] = q(i, "sm_clk", nv.nvmlDeviceGetClockInfo, h, 1)  # NVML_CLOCK_SM
        f["clock_reasons"] = q(i, "reasons", self._reasons, h)
        if self._slow_due or "temp_c" not in f:
            f["temp_c"] = q(i, "temp", nv.nvmlDeviceGetTemperature, h, 0)  # NVML_TEMPERATURE_GPU
            f["mem_mhz"] = q(i, "mem_clk", nv.nvmlDeviceGetClockInfo, h, 2)  # NVML_CLOCK_MEM

    def sample(self, now):
        out = []
        mono = time.monotonic()
        n = self._ticks
        self._ticks = n + 1
        self._slow_due = n % self.slow_every == 0
        self._mem_due = n % self.mem_every == 0
        self._gpm_due = n % self.gpm_every == 0
        for i, h in enumerate(self.handles):
            if i in self._lost:
                if mono < self._lost[i] or h is None:
                    out.append(_lost_fields(i))
                    continue
            if h is None:
                continue
            try:
                fields = self._sample_gpu(i, h)
            except _GpuLost:
                self._lost[i] = mono + LOST_RETRY_S
                self._fields[i] = {"index": i, "lost": False, "label": ""}
                out.append(_lost_fields(i))
                continue
            self._lost.pop(i, None)
            out.append(fields)
        return out

    def processes(self):
        nv = self.nv
        procs = []
        for i, h in enumerate(self.handles):
            if h is None or i in self._lost:
                continue
            plist = None
            while self._procs_fns:
                try:
                    plist = self._procs_fns[0](h)
                    break
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == NVML_FUNCTION_NOT_FOUND:
                        self._procs_fns.pop(0)  # old driver: try the older variant
                        continue
                    break
            for p in plist or ():
                used = getattr(p, "usedGpuMemory", None)
                procs.append((int(p.pid), i, round(used / MIB, 1) if used is not None else None))
        return procs

    def _shutdown(self):
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass

    def close(self):
        for st in self._gpm if hasattr(self, "_gpm") else ():
            if st is not None:
                for s in st[:2]:
                    try:
                        self.nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass
        self._gpm = []
        self._shutdown()


# nvidia-smi -----------------------------------------------------------------------------------

SMI_QUERY = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks_event_reasons.active"
)
SMI_APPS_QUERY = "pid,used_memory,gpu_uuid"
# Header names nvidia-smi prints for query names that differ (header -> query name).
SMI_HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "power.draw.average": "power.draw",
}
SMI_FIELD_MAP = (
    ("utilization.gpu", "util_gpu"),
    ("utilization.memory", "util_mem"),
    ("memory.used", "mem_used_mib"),
    ("memory.total", "mem_total_mib"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("temperature.gpu", "temp_c"),
    ("clocks.sm", "sm_mhz"),
    ("clocks.mem", "mem_mhz"),
    ("clocks_event_reasons.active", "clock_reasons"),
)
_SMI_NUM = r"^([-+]?\d+(?:\.\d+)?)\s*(?:[A-Za-z%/]+)?$"


def smi_value(text):
    """A number from an nvidia-smi CSV cell ("117.90 W", "0 %", "0x1", "[N/A]" -> None)."""
    s = text.strip()
    if not s or s[0] == "[" or s in ("N/A", "Not Supported"):
        return None
    if s[:2].lower() == "0x":
        try:
            return int(s, 16)
        except ValueError:
            return None
    import re  # noqa: PLC0415 - only the nvidia-smi path parses text (re caches the pattern)

    m = re.match(_SMI_NUM, s)
    if not m:
        return None
    num = m.group(1)
    return float(num) if "." in num else int(num)


def _smi_header_name(cell):
    name = cell.strip()
    if name.endswith("]") and " [" in name:
        name = name[: name.rindex(" [")]
    return SMI_HEADER_ALIASES.get(name, name)


def parse_smi_csv(text, fields=None):
    """Rows of nvidia-smi ``--format=csv[,noheader][,nounits]`` output as dicts of raw cells.

    With a header line, columns are named by it (units and renamed headers understood); without
    one, by ``fields`` (the query list). Lines that are not data (prompts, errors) are skipped.
    """
    names = [f.strip() for f in fields.split(",")] if isinstance(fields, str) else fields
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "$#":
            continue
        cells = [c.strip() for c in line.split(",")]
        if "index" in cells or any(c.startswith("utilization.") for c in cells):
            names = [_smi_header_name(c) for c in cells]
            continue
        if names is None or len(cells) != len(names):
            continue
        rows.append(dict(zip(names, cells)))
    return rows


def smi_gpu_fields(row):
    """Field pairs of a gpu record from one parsed nvidia-smi row (None when not a GPU row)."""
    index = smi_value(row.get("index", ""))
    if not isinstance(index, int):
        return None
    f = {"index": index}
    lost = False
    for key, name in SMI_FIELD_MAP:
        cell = row.get(key)
        if cell is None:
            continue
        if "GPU is lost" in cell or "GPU requires reset" in cell:
            lost = True
        f[name] = smi_value(cell)
    if lost:
        return (("index", index), ("lost", True), ("label", ""))
    f["lost"] = False
    f["label"] = ""
    return tuple((k, f[k]) for k in GPU_FIELDS if f.get(k) is not None)


def _smi_error(text):
    if "version mismatch" in text:
        return MISMATCH_MSG
    if "couldn't communicate with the NVIDIA driver" in text:
        return "NVIDIA driver not loaded"
    line = text.strip().splitlines()[0] if text.strip() else "no output"
    return "nvidia-smi failed: %s" % line[:200]


class SmiBackend:
    """Spawns nvidia-smi per tick (fallback when pynvml is missing; ~100 ms per spawn)."""

    name = "nvidia-smi"
    blocking = True

    def __init__(self, exe=None, runner=None):
        import shutil  # noqa: PLC0415 - only this fallback needs it

        self.exe = exe or shutil.which("nvidia-smi")
        if not self.exe:
            raise BackendUnavailable("nvidia-smi not on PATH")
        self._run = runner or self._spawn
        self.error = ""
        self.nvml_version = ""
        out = self._run(["--query-gpu=" + SMI_QUERY + ",driver_version"])
        rows = parse_smi_csv(out, SMI_QUERY + ",driver_version")
        gpus = []
        self._uuid_index = {}
        for row in rows:
            idx = smi_value(row.get("index", ""))
            if not isinstance(idx, int):
                continue
            self._uuid_index[row.get("uuid", "")] = idx
            total = smi_value(row.get("memory.total", ""))
            limit = smi_value(row.get("power.limit", ""))
            gpus.append(
                gpu_info(
                    idx,
                    row.get("name", ""),
                    row.get("uuid", ""),
                    float(total) if total is not None else None,
                    row.get("pci.bus_id", ""),
                    float(limit) if limit is not None else None,
                    False,
                )
            )
        if not gpus:
            raise BackendUnavailable(_smi_error(out))
        self.gpus = gpus
        self.driver = rows[0].get("driver_version", "")
        self.capabilities = ["procs"]
        self.failing = ""

    def _spawn(self, args):
        import subprocess  # noqa: PLC0415 - only this fallback spawns

        try:
            proc = subprocess.run(
                [self.exe] + args + ["--format=csv,noheader,nounits"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=15,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return "nvidia-smi could not run: %s" % exc
        return proc.stdout.decode("utf-8", "replace")

    def sample(self, now):
        out = self._run(["--query-gpu=" + SMI_QUERY])
        result = []
        for row in parse_smi_csv(out, SMI_QUERY):
            fields = smi_gpu_fields(row)
            if fields is not None:
                result.append(fields)
        self.failing = "" if result else _smi_error(out)
        return result

    def processes(self):
        out = self._run(["--query-compute-apps=" + SMI_APPS_QUERY])
        procs = []
        for row in parse_smi_csv(out, SMI_APPS_QUERY):
            pid = smi_value(row.get("pid", ""))
            if not isinstance(pid, int):
                continue
            idx = self._uuid_index.get(row.get("gpu_uuid", ""))
            if idx is None:
                continue
            used = smi_value(row.get("used_memory", ""))
            procs.append((pid, idx, float(used) if used is not None else None))
        return procs

    def close(self):
        pass


# replay ---------------------------------------------------------------------------------------

H200_NAME = "NVIDIA H200"
H200_MEM_MIB = 143771.0
H200_POWER_LIMIT_W = 700.0
TRACE_DIRECT = ("util_gpu", "util_mem", "mem_used_mib", "power_w", "temp_c", "sm_mhz", "mem_mhz")


def load_trace(path):
    """Frames [(t, [per-recorded-GPU field dict], label)] from an H200 trace or a recording.

    Also returns the recording's hello dict (or None). H200 trace lines: t, phase, util_gpu, ...,
    gpm{...}. Recording lines: verl-top wire records; gpu lines sharing a ``t`` form a frame.
    """
    import gzip  # noqa: PLC0415 - only replay needs it

    opener = gzip.open if str(path).endswith(".gz") else open
    frames = []
    hello = None
    by_t = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            rtype = row.get("type")
            if rtype == "gpu":
                t = float(row.get("t", 0.0))
                frame = by_t.get(t)
                if frame is None:
                    frame = by_t[t] = (t, [], row.get("label", ""))
                    frames.append(frame)
                frame[1].append({k: row[k] for k in GPU_FIELDS if k in row and k != "index"})
            elif rtype == "hello" and hello is None:
                hello = row
            elif rtype is None and "util_gpu" in row:
                f = {k: row[k] for k in TRACE_DIRECT if row.get(k) is not None}
                gpm = row.get("gpm") or {}
                for key, name in TRACE_GPM_KEYS:
                    if gpm.get(key) is not None:
                        f[name] = gpm[key]
                frames.append((float(row.get("t", 0.0)), [f], str(row.get("phase", ""))))
    frames.sort(key=lambda fr: fr[0])
    if frames:
        t0 = frames[0][0]
        frames = [(t - t0, g, label) for t, g, label in frames]
    return frames, hello


class ReplayBackend:
    """Plays a GPU trace as if it were ``gpus`` GPUs, paced by the agent interval."""

    name = "replay"
    blocking = False

    def __init__(self, path, gpus=8, speed=1.0, seed=0, interval=1.0):
        if not path:
            raise BackendUnavailable("replay backend needs --replay-trace PATH")
        try:
            self.frames, hello = load_trace(path)
        except OSError as exc:
            raise BackendUnavailable("cannot read replay trace %s: %s" % (path, exc))
        if not self.frames:
            raise BackendUnavailable("replay trace %s has no GPU samples" % path)
        self.n = max(1, int(gpus))
        self.speed = float(speed) if speed and speed > 0 else 1.0
        self.interval = interval
        self.error = ""
        self.driver = "replay"
        self.nvml_version = ""
        name, mem_total, limit = H200_NAME, H200_MEM_MIB, H200_POWER_LIMIT_W
        if hello and hello.get("gpus"):
            g0 = hello["gpus"][0]
            name = g0.get("name") or name
            mem_total = g0.get("mem_total_mib") or mem_total
            limit = g0.get("power_limit_w") or limit
        self.mem_total = mem_total
        self.limit = limit
        self.gpus = [
            gpu_info(
                i,
                name,
                "GPU-replay-%d-%02d" % (seed, i),
                mem_total,
                "00000000:%02X:00.0" % (0x18 + 0x10 * i),
                limit,
                True,
            )
            for i in range(self.n)
        ]
        self.capabilities = ["gpm"]
        import random  # noqa: PLC0415 - only replay jitters

        rng = random.Random(seed)
        # Small fixed per-GPU differences, so the fan-out does not look like one GPU 8 times.
        self._scale = [1.0 if i == 0 else 0.96 + 0.06 * rng.random() for i in range(self.n)]
        self._temp_off = [0 if i == 0 else rng.randint(-2, 3) for i in range(self.n)]
        self._jitter = random.Random(seed + 1)
        last = self.frames[-1][0]
        gaps = [b[0] - a[0] for a, b in zip(self.frames, self.frames[1:]) if b[0] > a[0]]
        self.period = last + (min(gaps) if gaps else 1.0)  # loop length
        self._pos = 0
        self._clock = 0.0  # trace time of the next tick
        self._started = False

    def _frame(self):
        """The frame for this tick: the last one whose time is <= the trace clock."""
        frames = self.frames
        if self._started:
            self._clock += self.interval * self.speed
        self._started = True
        if self._clock >= self.period:
            self._clock -= self.period * int(self._clock // self.period)
            self._pos = 0
        pos = self._pos
        while pos + 1 < len(frames) and frames[pos + 1][0] <= self._clock:
            pos += 1
        self._pos = pos
        return frames[pos]

    def _vary(self, i, src):
        """GPU i's values: the recorded GPU's, scaled a little (GPU 0 of a trace is exact)."""
        s = self._scale[i]
        if s == 1.0:
            return src
        j = 1.0 + 0.01 * (self._jitter.random() - 0.5)
        out = {}
        for k, v in src.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                out[k] = v
            elif k in PERCENT_FIELDS:
                out[k] = min(100.0, round(v * s * j, 2))
            elif k == "temp_c":
                out[k] = v + self._temp_off[i]
            elif k in (
                "power_w",
                "nvlink_tx_mibs",
                "nvlink_rx_mibs",
                "pcie_tx_mibs",
                "pcie_rx_mibs",
            ):
                out[k] = round(v * s * j, 2)
            elif k == "mem_used_mib":
                out[k] = round(v * (0.995 + 0.005 * s), 1)
            else:
                out[k] = v
        return out

    def sample(self, now):
        _, gpus, label = self._frame()
        nrec = len(gpus)
        out = []
        for i in range(self.n):
            src = gpus[i % nrec]
            vals = src if (i < nrec and nrec > 1) else self._vary(i, src)
            f = {"index": i, "mem_total_mib": self.mem_total, "power_limit_w": self.limit}
            f.update(vals)
            f["index"] = i
            f["lost"] = bool(f.get("lost", False))
            f["label"] = label or f.get("label", "")
            out.append(tuple((k, f[k]) for k in GPU_FIELDS if k in f))
        return out

    def processes(self):
        return None

    def close(self):
        pass


def make_backend(opts):
    """The GPU backend for ``opts.backend``: "auto" tries NVML (through ctypes, then the pynvml
    module, as ``--nvml`` allows), then nvidia-smi, then none."""
    choice = opts.backend
    if choice == "replay":
        try:
            return ReplayBackend(
                opts.replay_trace,
                opts.replay_gpus,
                opts.replay_speed,
                opts.replay_seed,
                opts.interval,
            )
        except BackendUnavailable as exc:
            return NoneBackend(str(exc))
    if choice == "none":
        return NoneBackend("GPU sampling disabled (--backend none)")
    nvml_reason = smi_reason = ""
    if choice in ("auto", "pynvml"):
        nvml_reason = ""
        binding = getattr(opts, "nvml", "auto")
        strides = (
            getattr(opts, "gpm_every", GPM_EVERY),
            getattr(opts, "slow_every", SLOW_EVERY),
            getattr(opts, "mem_every", MEM_EVERY),
        )
        if binding in ("auto", "ctypes"):
            try:
                return NvmlBackend(CtypesNvml(), *strides)
            except BackendUnavailable as exc:
                nvml_reason = str(exc)
        if binding in ("auto", "pynvml"):
            try:
                return NvmlBackend(None, *strides)
            except BackendUnavailable as exc:
                # pynvml missing says less than the library's own reason when there is one
                if not (nvml_reason and "not installed" in str(exc)):
                    nvml_reason = str(exc)
        if choice == "pynvml":
            return NoneBackend(nvml_reason)
    if choice in ("auto", "nvidia-smi"):
        try:
            backend = SmiBackend()
        except BackendUnavailable as exc:
            smi_reason = str(exc)
        else:
            if nvml_reason:
                backend.error = "NVML unavailable (%s); using nvidia-smi" % nvml_reason
            return backend
        if choice == "nvidia-smi":
            return NoneBackend(smi_reason)
    return NoneBackend(no_gpu_message(nvml_reason, smi_reason))


def no_gpu_message(nvml_reason, smi_reason):
    """Plain words for why neither NVML nor nvidia-smi gives GPU data."""
    if MISMATCH_MSG in (nvml_reason, smi_reason):
        return MISMATCH_MSG
    driverless = ("library not found", "driver not loaded", "not on PATH")
    if all(any(d in r for d in driverless) for r in (nvml_reason, smi_reason) if r):
        return "no NVIDIA driver: %s and %s" % (nvml_reason, smi_reason)
    return "no GPU data: %s; %s" % (nvml_reason, smi_reason)


# ----------------------------------------------------------------------------------------------
# File followers


def _chars_cut(lines, start, end):
    """Where the record starting at ``lines[start]`` ends (before ``end``): before the line that
    would take it past MAX_CHARS_PER_RECORD characters, after one line at least."""
    size = 0
    for i in range(start, end):
        size += len(lines[i])
        if i > start and size > MAX_CHARS_PER_RECORD:
            return i
    return end


class Follower:
    """Follows one file like ``tail -F``: growth, truncation, rotation, late creation."""

    def __init__(
        self, kind, path, from_start=False, max_lines=MAX_LINES_PER_RECORD, max_read=None, offset=None
    ):
        self.kind = kind
        self.path = path
        self.max_lines = max_lines
        self.max_read = max_read or MAX_READ_PER_POLL
        self._fh = None
        self._ino = None
        self._offset = 0
        self._head = b""  # the file's first bytes when opened (to recognise its rotated copy)
        self._partial = b""
        self._reset = False
        self._from_start = from_start
        self._start_at = offset  # read from this byte on (the caller read what is before)
        self.error = ""  # why the path is not followed (not a regular file), said once
        self._said = ""
        self._open(initial=True)

    def _open(self, initial=False):
        """Open the file; start at its end unless from_start or it appeared after we began.

        Only regular files are followed: opening a FIFO would block until a writer comes, and a
        directory or device is no log. O_NONBLOCK makes the open itself never wait.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.error = "%s: not a regular file (%s); give the log file itself" % (
                self.path,
                _file_kind(st.st_mode),
            )
            return False
        self.error = ""
        self._fh = os.fdopen(fd, "rb")
        self._ino = (st.st_dev, st.st_ino)
        self._offset = 0 if (self._from_start or not initial) else st.st_size
        if initial and self._start_at is not None and self._start_at <= st.st_size:
            self._offset = self._start_at
        self._head = self._read_head()
        return True

    def _read_head(self):
        try:
            self._fh.seek(0)
            return self._fh.read(HEAD_BYTES)
        except OSError:
            return b""

    def _rewritten(self, size):
        """True when the file (same inode) no longer starts as it did: truncated and refilled."""
        if not self._head or size < len(self._head):
            return bool(self._head)
        return self._read_head()[: len(self._head)] != self._head

    def _rescue_copy(self, out):
        """After a copytruncate rotation, read the lines that reached the copy but not us.

        ``logrotate copytruncate`` copies the file (``x.log.1``, ``x.log-20260101``) and then
        truncates it: what was appended since our last read is only in the copy. The copy is
        recognised by its first bytes (our fingerprint) and a size past our offset.
        """
        folder = os.path.dirname(self.path) or "."
        base = os.path.basename(self.path)
        best = None
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if name == base or not name.startswith(base) or name[len(base) : len(base) + 1] not in ".-_":
                continue
            if name.endswith((".gz", ".xz", ".bz2", ".zst", ".lz4")):
                continue
            full = os.path.join(folder, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size > self._offset:
                if best is None or st.st_mtime > best[0]:
                    best = (st.st_mtime, full)
        if best is None:
            return
        try:
            with open(best[1], "rb") as fh:
                if fh.read(len(self._head)) != self._head:
                    return
                fh.seek(self._offset)
                data = self._partial + fh.read(self.max_read)
        except OSError:
            return
        self._partial = b""
        text = data.decode("utf-8", "replace")
        out.extend(line[:-1] if line.endswith("\r") else line for line in text.split("\n") if line)

    def _close(self):
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
        self._fh = None

    def _read_more(self, out):
        """Read what was appended since the last call into ``out`` (complete lines only)."""
        fh = self._fh
        fh.seek(self._offset)
        data = fh.read(self.max_read)
        if not data:
            return
        self._offset += len(data)
        data = self._partial + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._partial = data
            if len(data) > MAX_PARTIAL:  # a runaway line: emit it rather than grow forever
                self._partial = b""
                out.append(data.decode("utf-8", "replace"))
            return
        self._partial = data[cut + 1 :]
        text = data[:cut].decode("utf-8", "replace")
        if "\r" in text:  # a CRLF line loses its \r (one pass, not one test per line)
            text = text.replace("\r\n", "\n")
            if text.endswith("\r"):
                text = text[:-1]
        out.extend(text.split("\n"))

    def _flush_partial(self, out):
        if self._partial:
            out.append(self._partial.decode("utf-8", "replace").rstrip("\r"))
            self._partial = b""

    def poll(self, host, t):
        """Log record dicts for what changed since the last poll."""
        records = []
        lines = []
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if self._fh is not None:
            rotated = st is None or (st.st_dev, st.st_ino) != self._ino
            if rotated:
                # Lines written to the old file just before the rotation are still ours.
                try:
                    self._read_more(lines)
                except OSError:
                    pass
                self._flush_partial(lines)
                self._emit(records, host, t, lines)
                lines = []
                self._close()
                self._reset = True
            elif st.st_size < self._offset or (
                st.st_size != self._offset and self._rewritten(st.st_size)
            ):
                # Truncated (copytruncate): the lines written since our last read are in the copy.
                self._rescue_copy(lines)
                self._emit(records, host, t, lines)
                lines = []
                self._offset = 0
                self._partial = b""
                self._reset = True
                self._head = b""
        if self._fh is None:
            if st is None or not self._open():
                if self.error and self.error != self._said:
                    self._said = self.error
                    records.append(_record("event", host, t, _error_event(self)))
                return records
        if not self._head and self._offset == 0:
            self._head = self._read_head()
        if st is not None and st.st_size == self._offset and not self._reset:
            return records
        try:
            self._read_more(lines)
        except OSError:
            self._close()
            return records
        if lines or self._reset:
            self._emit(records, host, t, lines)
        return records

    def _emit(self, records, host, t, lines):
        if not lines and not self._reset:
            return
        # At most max_lines lines and about MAX_CHARS_PER_RECORD characters per record (a line
        # longer than that alone); counted per slice, line by line only in a slice that is over.
        start, n = 0, len(lines)
        while start < n:
            end = min(n, start + self.max_lines)
            if sum(map(len, lines[start:end])) > MAX_CHARS_PER_RECORD:
                end = _chars_cut(lines, start, end)
            self._emit_one(records, host, t, lines[start:end])
            start = end
        if not lines:
            self._emit_one(records, host, t, [])

    def _emit_one(self, records, host, t, lines):
        fields = (("path", self.path), ("kind", self.kind), ("lines", lines), ("reset", self._reset))
        records.append(_record("log", host, t, fields))
        self._reset = False

    def flush(self, host, t):
        """Log records for a last line that has no newline yet (the file is known finished)."""
        lines = []
        self._flush_partial(lines)
        records = []
        if lines:
            self._emit(records, host, t, lines)
        return records

    def close(self):
        self._close()


def _file_kind(mode):
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _error_event(follower):
    return (
        ("kind", "error"),
        ("text", follower.error),
        ("path", follower.path),
        ("severity", 0.5),
    )


def parse_follow(spec):
    """``KIND[+start]:PATH`` -> (kind, path, from_start)."""
    kind, sep, path = spec.partition(":")
    if not sep or not path:
        raise ValueError("--follow wants KIND:PATH, got %r" % spec)
    from_start = False
    if kind.endswith("+start"):
        kind, from_start = kind[: -len("+start")], True
    if kind not in FOLLOW_KINDS:
        raise ValueError("follow kind must be one of %s, got %r" % ("|".join(FOLLOW_KINDS), kind))
    return kind, path, from_start


# topology and network inventory (once per connection) --------------------------------------

SYS_ROOT = "/sys"
TOPO_TEXT_MAX = 64 * 1024  # `nvidia-smi topo -m` of a 16-GPU, 16-NIC node is ~6 KB
MAX_NICS = 256
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS (Hopper)
NVML_INVALID_ARGUMENT = 2
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
# nvmlGpuTopologyLevel_t -> the `nvidia-smi topo -m` cell for the same relation.
NVML_TOPO_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t, not the major version (hwloc#658:
# "A100 returns 5 which is not NVLink 5"): 1 1.0, 2 2.0, 3 2.2, 4 3.0, 5 3.1, 6 4.0, 7 5.0, 8 6.0.
NVLINK_ENUM_MAJOR = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}


# Field order and string defaults of model.NicPort / model.GpuTopo (the wire order of to_dict).
NIC_FIELDS = (
    ("name", ""), ("port", None), ("kind", ""), ("rate_gbps", None), ("state", ""),
    ("numa_node", None), ("netdev", ""), ("pci", ""),
)  # fmt: skip
GPU_TOPO_FIELDS = (
    ("index", 0), ("bus_id", ""), ("numa_node", None), ("nvlink_version", None),
    ("nvlinks_up", None), ("nvlinks_total", None), ("nvlink_error", ""), ("nic", ""),
    ("nic_link", ""),
)  # fmt: skip


def _wire(d, spec):
    """``d`` in model field order with defaults filled and None values left out."""
    out = {}
    for key, default in spec:
        value = d.get(key, default)
        if value is not None:
            out[key] = value
    return out


def _sys_text(path, limit=4096):
    """A small sysfs file's stripped text, None when absent or unreadable."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("ascii", "replace").strip()
    except OSError:
        return None


def _sys_int(path):
    text = _sys_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _numa(path):
    """A numa_node file: None when absent or -1 (no NUMA affinity known)."""
    n = _sys_int(path)
    return n if n is not None and n >= 0 else None


def _listdir(path):
    try:
        return sorted(os.listdir(path))[:MAX_NICS]
    except OSError:
        return []


def _realpath(path):
    try:
        return os.path.realpath(path) if os.path.exists(path) else ""
    except OSError:
        return ""


def pci_relation(a, b, numa_a=None, numa_b=None):
    """`nvidia-smi topo -m` cell for two PCI devices from their sysfs paths
    (/sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0): PIX (same parent bridge), PXB
    (more bridges shared), PHB (only the host bridge), NODE / SYS (other host bridge, same /
    other NUMA node); "" when a path is unknown."""
    pa = [x for x in a.split("/") if x] if a else []
    pb = [x for x in b.split("/") if x] if b else []
    root = lambda p: next((x for x in p if x.startswith("pci")), "")  # noqa: E731
    if not pa or not pb or not root(pa) or not root(pb):
        return ""
    if root(pa) != root(pb):
        if numa_a is not None and numa_b is not None and numa_a == numa_b:
            return "NODE"
        return "SYS" if numa_a is not None and numa_b is not None else ""
    shared = 0
    for x, y in zip(pa[:-1], pb[:-1]):
        if x != y:
            break
        shared += 1
    depth = shared - pa.index(root(pa)) - 1  # PCI bridges shared below the host bridge
    if pa[:-1] == pb[:-1]:
        return "PIX"
    return "PXB" if depth >= 2 else "PHB"


def nearest_nics(gpus, nics, sys_root=SYS_ROOT):
    """Set each GPU's ``nic`` and ``nic_link``: its closest active IB/RoCE port by PCI path."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    order = ("PIX", "PXB", "PHB", "NODE", "SYS")
    rdma = [n for n in nics if n.get("kind") in ("ib", "roce") and n.get("state") == "ACTIVE"]
    for g in gpus:
        m = re.match(
            r"^(?:[0-9A-Fa-f]{4})?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$",
            g.get("bus_id") or "",
        )
        if not m or not rdma:
            continue
        gpath = _realpath(os.path.join(sys_root, "bus", "pci", "devices", m.group(1).lower()))
        best = None
        for n in rdma:
            rel = pci_relation(gpath, n.get("_path", ""), g.get("numa_node"), n.get("numa_node"))
            if rel and (best is None or order.index(rel) < order.index(best[0])):
                best = (rel, n["name"])
        if best is not None:
            g["nic_link"], g["nic"] = best


def _pci_of(device_link):
    """PCI address a sysfs ``device`` link points at ("" for virtual devices)."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    try:
        name = os.path.basename(os.path.realpath(device_link))
    except OSError:
        return ""
    return name if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", name) else ""


def read_rdma_ports(sys_root=SYS_ROOT):
    """IB/RoCE ports: /sys/class/infiniband/<dev>/ports/<n>/{rate,link_layer,state} + NUMA node.

    ``rate`` reads like "400 Gb/sec (4X NDR)"; ``link_layer`` is InfiniBand or Ethernet (RoCE);
    ``state`` like "4: ACTIVE".
    """
    base = os.path.join(sys_root, "class", "infiniband")
    out = []
    for dev in _listdir(base):
        ddir = os.path.join(base, dev)
        numa = _numa(os.path.join(ddir, "device", "numa_node"))
        pci = _pci_of(os.path.join(ddir, "device"))
        devpath = _realpath(os.path.join(ddir, "device"))
        netdevs = _listdir(os.path.join(ddir, "device", "net"))
        for port in _listdir(os.path.join(ddir, "ports")):
            pdir = os.path.join(ddir, "ports", port)
            rate = (_sys_text(os.path.join(pdir, "rate")) or "").split(" ")[0]
            layer = _sys_text(os.path.join(pdir, "link_layer")) or ""
            state = (_sys_text(os.path.join(pdir, "state")) or "").split(":")[-1].strip()
            try:
                gbps = float(rate) if rate else None
            except ValueError:
                gbps = None
            out.append(
                {
                    "name": dev[:64],
                    "port": int(port) if port.isdigit() else None,
                    "kind": "roce"
                    if layer == "Ethernet"
                    else ("ib" if layer == "InfiniBand" else ""),
                    "rate_gbps": gbps,
                    "state": state[:16],
                    "numa_node": numa,
                    "netdev": netdevs[0][:64] if netdevs else "",
                    "pci": pci,
                    "_path": devpath,
                }
            )
    return out


def read_net_ifaces(sys_root=SYS_ROOT, skip=()):
    """Physical net interfaces (/sys/class/net/<if>/speed in Mb/s, operstate, NUMA node) that are
    not the netdev of an RDMA port already listed."""
    base = os.path.join(sys_root, "class", "net")
    out = []
    for name in _listdir(base):
        ndir = os.path.join(base, name)
        if name in skip or not os.path.exists(os.path.join(ndir, "device")):
            continue  # lo, bridges, veth: no device behind them
        speed = _sys_int(os.path.join(ndir, "speed"))
        out.append(
            {
                "name": name[:64],
                "kind": "eth",
                "rate_gbps": speed / 1000.0 if speed and speed > 0 else None,
                "state": (_sys_text(os.path.join(ndir, "operstate")) or "")[:16],
                "numa_node": _numa(os.path.join(ndir, "device", "numa_node")),
                "pci": _pci_of(os.path.join(ndir, "device")),
            }
        )
    return out


def pci_numa_node(bus_id, sys_root=SYS_ROOT):
    """NUMA node of a PCI device given NVML-style ("00000000:1B:00.0"); None when unknown."""
    import re  # noqa: PLC0415 - topology is collected once per connection

    m = re.match(
        r"^(?:[0-9A-Fa-f]{4})?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$", bus_id or ""
    )
    if not m:
        return None
    return _numa(os.path.join(sys_root, "bus", "pci", "devices", m.group(1).lower(), "numa_node"))


def _nvml_code(exc):
    return getattr(exc, "value", None)


def nvml_nvlinks(nv, h):
    """(links up, links present, version, links to an NVSwitch, remote bus ids, error) of one GPU."""
    up = total = switch = 0
    version = None
    remotes = []
    # Newer bindings say 36 (Blackwell); links past the GPU's own answer InvalidArgument.
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError as exc:
            if _nvml_code(exc) == NVML_INVALID_ARGUMENT:
                break  # past the GPU's last link
            if link == 0:
                return None, None, None, 0, [], str(exc)[:80] or "NVMLError"
            continue
        total += 1
        if not state:
            continue
        up += 1
        if version is None:
            try:
                version = NVLINK_ENUM_MAJOR.get(int(nv.nvmlDeviceGetNvLinkVersion(h, link)))
            except Exception:
                version = None
        try:
            if nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
                continue
        except Exception:
            pass
        try:
            remotes.append(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).upper())
        except Exception:
            pass
    return up, total, version, switch, remotes, ""


def nvml_topology(nv, handles, buses, sys_root=SYS_ROOT):
    """GPU entries and the GPU-pair link matrix from NVML (NVLink first, else the PCIe level)."""
    gpus = []
    nvl = []
    for i, h in enumerate(handles):
        if h is None:
            gpus.append({"index": i, "nvlink_error": "GPU not accessible"})
            nvl.append((0, 0, []))
            continue
        up, total, version, switch, remotes, err = nvml_nvlinks(nv, h)
        # A remote that is no GPU of this node is an NVSwitch (bindings without the remote
        # device type call report its PCI address instead).
        gpu_buses = set(b.upper() for b in buses if b)
        switch += sum(1 for b in remotes if b not in gpu_buses)
        gpus.append(
            {
                "index": i,
                "bus_id": buses[i],
                "numa_node": pci_numa_node(buses[i], sys_root),
                "nvlink_version": version,
                "nvlinks_up": up,
                "nvlinks_total": total or None,
                "nvlink_error": err,
            }
        )
        nvl.append((up or 0, switch, remotes))
    links = {}
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            direct = sum(1 for b in nvl[i][2] if b == (buses[j] or "").upper())
            if direct:
                links["%d-%d" % (i, j)] = "NV%d" % direct
            elif nvl[i][1] and nvl[j][1]:
                links["%d-%d" % (i, j)] = "NV%d" % min(nvl[i][1], nvl[j][1])  # via NVSwitch
            elif handles[i] is not None and handles[j] is not None:
                try:
                    level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    links["%d-%d" % (i, j)] = NVML_TOPO_LEVELS.get(int(level), "SYS")
                except Exception:
                    pass
    return gpus, links


def smi_topo_text(exe=None, runner=None):
    """`nvidia-smi topo -m` output (bounded), "" when it cannot run."""
    import shutil  # noqa: PLC0415 - topology is collected once per connection
    import subprocess  # noqa: PLC0415 - topology is collected once per connection

    if runner is not None:
        return (runner(["topo", "-m"]) or "")[:TOPO_TEXT_MAX]
    exe = exe or shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        proc = subprocess.run(
            [exe, "topo", "-m"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.decode("utf-8", "replace")[:TOPO_TEXT_MAX] if proc.returncode == 0 else ""


def collect_topology(backend, sys_root=SYS_ROOT, smi_runner=None):
    """Fields of the ``topo`` record: NIC inventory from sysfs, GPUs/links from NVML when the
    backend is pynvml, else the text of `nvidia-smi topo -m` (parsed by the client)."""
    import socket  # noqa: PLC0415 - topology is collected once per connection

    nics = read_rdma_ports(sys_root)
    nics += read_net_ifaces(sys_root, skip={n["netdev"] for n in nics if n.get("netdev")})
    nics = nics[:MAX_NICS]
    gpus, links, text, source, error = [], {}, "", "", ""
    nv = getattr(backend, "nv", None)
    if nv is not None and getattr(backend, "handles", None) is not None:
        buses = [g.get("bus_id", "") for g in backend.gpus]
        try:
            gpus, links = nvml_topology(nv, backend.handles, buses, sys_root)
            source = "nvml"
        except Exception as exc:  # a binding without the NVLink calls: fall back to the text
            error = "NVML topology failed: %s" % exc
    if not source and backend.name in ("pynvml", "nvidia-smi"):
        text = smi_topo_text(runner=smi_runner or getattr(backend, "topo_runner", None))
        source = "nvidia-smi" if text else ""
        for g in backend.gpus:
            gpus.append(
                {
                    "index": g["index"],
                    "bus_id": g.get("bus_id", ""),
                    "numa_node": pci_numa_node(g.get("bus_id", ""), sys_root),
                }
            )
    if not source and not error:
        error = "no GPU topology: %s" % (backend.error or "backend %s has none" % backend.name)
    nearest_nics(gpus, nics, sys_root)
    return (
        ("source", source),
        ("gpus", [_wire(g, GPU_TOPO_FIELDS) for g in gpus]),
        ("nics", [_wire(n, NIC_FIELDS) for n in nics]),
        ("links", links),
        ("smi_topo", text),
        ("error", error[:200]),
        ("hostname", socket.gethostname()[:255]),
    )


# ----------------------------------------------------------------------------------------------
# The agent


class Agent:
    """Samples everything once per ``tick``; usable in-process or behind ``main``."""

    def __init__(self, options=None):
        opts = options if options is not None else parse_args([])
        self.opts = opts
        self.host = opts.host or os.uname().nodename
        self.interval = max(0.05, float(opts.interval))
        self.procs_enabled = not opts.no_procs
        self.procs_every = max(1, int(opts.procs_every))
        self.backend = make_backend(opts)
        self.host_sampler = HostSampler(
            opts.host_sampler,
            getattr(opts, "slow_every", SLOW_EVERY),
            getattr(opts, "cpu_every", CPU_EVERY),
        )
        self.inspector = ProcInspector()
        self.followers = {}  # path -> Follower
        for spec in opts.follow or ():
            kind, path, from_start = parse_follow(spec)
            self.follow(kind, path, from_start)
        self.ticks = 0
        self.seq = 0
        self._last_hb = None
        self._last_procs = None  # (t, signature)
        self._state = ""  # last runtime node-level error reported

    @property
    def blocking(self):
        """True when a tick may block for long (spawns nvidia-smi, or psutil syscalls)."""
        return bool(self.backend.blocking or self.host_sampler.mode == "psutil")

    def hello(self, now=None):
        """The hello record: who this agent is, what it sees, which backend it uses."""
        b = self.backend
        caps = list(b.capabilities)
        if not self.procs_enabled and "procs" in caps:
            caps.remove("procs")
        if self.host_sampler.mode == "psutil":
            caps.append("psutil")
        caps.append("follow")
        fields = (
            ("agent_version", AGENT_VERSION),
            ("python", "%d.%d.%d" % sys.version_info[:3]),
            ("backend", b.name),
            ("driver", b.driver),
            ("nvml_version", b.nvml_version),
            ("gpus", list(b.gpus)),
            ("capabilities", caps),
            ("cpu_count", self.host_sampler.cpu_count),
            ("mem_total_bytes", self.host_sampler.mem_total),
            ("interval", self.interval),
            ("pid", os.getpid()),
            ("error", b.error),
        )
        return _record("hello", self.host, round(now or time.time(), 3), fields)

    def tick(self, now=None):
        """All records of one sampling instant (gpu, host, maybe procs, hb, log)."""
        now = round(now if now is not None else time.time(), 3)
        host = self.host
        out = []
        for fields in self.backend.sample(now):
            rec = {"v": PROTOCOL_VERSION, "type": "gpu", "host": host, "t": now}
            for k, v in fields:  # backends give every field in model order, lost and label too
                if v is not None:
                    rec[k] = v
            out.append(rec)
        failing = getattr(self.backend, "failing", "")
        if failing != self._state:
            state = "no_gpu" if failing else "up"
            fields = (("state", state), ("reason", failing))
            out.append(_record("state", host, now, fields))
            self._state = failing
        out.append(_record("host", host, now, self.host_sampler.sample(now)))
        if self.procs_enabled and self.ticks % self.procs_every == 0:
            rec = self._procs(now)
            if rec is not None:
                out.append(rec)
        if self._last_hb is None or now - self._last_hb >= HEARTBEAT_S:
            out.append(self._heartbeat(now))
        for follower in list(self.followers.values()):
            out.extend(follower.poll(host, now))
        self.ticks += 1
        return out

    def topology(self, now=None):
        """The ``topo`` record (GPU/NIC topology, network inventory); sent once per connection."""
        fields = collect_topology(self.backend, getattr(self.opts, "sys_root", SYS_ROOT))
        return _record("topo", self.host, round(now or time.time(), 3), fields)

    def _heartbeat(self, now):
        self._last_hb = now
        self.seq += 1
        fields = (
            ("agent_cpu_s", round(HostSampler.agent_cpu_s(), 3)),
            ("agent_rss_bytes", self.host_sampler.agent_rss()),
            ("seq", self.seq),
        )
        return _record("hb", self.host, now, fields)

    def _procs(self, now):
        """A procs record when the GPU process set changed, or every 30 s; else None."""
        raw = self.backend.processes()
        if raw is None:
            return None
        raw.sort()
        infos = [self.inspector.inspect(pid) for pid, _, _ in raw]
        # A changed title (the method a Ray worker runs) is a change too, not only pids and memory.
        signature = (tuple(raw), tuple(info.get("cmd", "") for info in infos))
        self.inspector.forget_except({p[0] for p in raw})
        last = self._last_procs
        if last is not None and last[1] == signature and now - last[0] < PROCS_FORCE_S:
            return None
        self._last_procs = (now, signature)
        procs = [proc_dict(pid, gpu, used, info) for (pid, gpu, used), info in zip(raw, infos)]  # noqa: B905 - 3.8
        return _record("procs", self.host, now, (("procs", procs),))

    def follow(self, kind, path, from_start=False):
        """Start following ``path`` (replaces an existing follower of the same path)."""
        if kind not in FOLLOW_KINDS:
            raise ValueError("unknown follow kind %r" % kind)
        old = self.followers.pop(path, None)
        if old is not None:
            old.close()
        self.followers[path] = Follower(kind, path, from_start)

    def unfollow(self, path):
        """Stop following ``path``."""
        old = self.followers.pop(path, None)
        if old is not None:
            old.close()

    def command(self, cmd):
        """Apply one control command dict; returns an error string ("" when applied)."""
        if not isinstance(cmd, dict):
            return "control line is not a JSON object"
        name = cmd.get("cmd")
        try:
            if name == "follow":
                self.follow(str(cmd["kind"]), str(cmd["path"]), bool(cmd.get("from_start")))
            elif name == "unfollow":
                self.unfollow(str(cmd["path"]))
            elif name == "interval":
                self.interval = max(0.05, float(cmd["value"]))
                if isinstance(self.backend, ReplayBackend):
                    self.backend.interval = self.interval
            elif name == "procs":
                self.procs_enabled = bool(cmd["value"])
                self._last_procs = None
            else:
                return "unknown command %r" % (name,)
        except (KeyError, TypeError, ValueError) as exc:
            return "bad %s command: %s" % (name, exc)
        return ""

    def close(self):
        """Release NVML, open /proc files and followed files."""
        for follower in self.followers.values():
            follower.close()
        self.followers.clear()
        self.backend.close()
        self.host_sampler.close()


# ----------------------------------------------------------------------------------------------
# Process entry


def parse_args(argv=None):
    """The agent's command line."""
    import argparse  # noqa: PLC0415 - the command line is read once

    p = argparse.ArgumentParser(prog="verl-top-agent", description="verl-top node agent")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    p.add_argument("--host", default="", help="host name in records (default: hostname)")
    p.add_argument(
        "--backend", default="auto", choices=("auto", "pynvml", "nvidia-smi", "replay", "none")
    )
    p.add_argument("--replay-trace", default=None, help="H200 trace or verl-top recording")
    p.add_argument("--replay-gpus", type=int, default=8)
    p.add_argument("--replay-speed", type=float, default=1.0)
    p.add_argument("--replay-seed", type=int, default=0)
    p.add_argument(
        "--follow", action="append", default=[], metavar="KIND[+start]:PATH", help="follow a file"
    )
    p.add_argument("--once", action="store_true", help="emit hello and one tick, then exit")
    p.add_argument("--count", type=int, default=0, help="stop after N ticks (0: run on)")
    p.add_argument("--no-procs", action="store_true", help="do not list GPU processes")
    p.add_argument("--procs-every", type=int, default=5, help="list GPU processes every N ticks")
    p.add_argument("--gpm-every", type=int, default=GPM_EVERY, help="GPM sample every N ticks")
    p.add_argument(
        "--nvml",
        default="auto",
        choices=("auto", "ctypes", "pynvml"),
        help="NVML binding: libnvidia-ml through ctypes (no pynvml module to load: ~4 MB less "
        "resident), or the pynvml module; auto: ctypes, else pynvml",
    )
    p.add_argument(
        "--slow-every",
        type=int,
        default=SLOW_EVERY,
        help="temperature, memory clock, host memory/network/disk/load every N ticks",
    )
    p.add_argument("--mem-every", type=int, default=MEM_EVERY, help="GPU memory every N ticks")
    p.add_argument("--cpu-every", type=int, default=CPU_EVERY, help="host CPU every N ticks")
    p.add_argument("--host-sampler", default="auto", choices=("auto", "psutil", "proc"))
    p.add_argument("--no-topology", action="store_true", help="do not send the topo record")
    p.add_argument("--sys-root", default=SYS_ROOT, help=argparse.SUPPRESS)  # tests: a fake /sys
    p.add_argument(
        "--ignore-stdin", action="store_true", help="run without the stdin control channel"
    )
    opts = p.parse_args(argv)
    for spec in opts.follow:
        try:
            parse_follow(spec)
        except ValueError as exc:
            p.error(str(exc))
    return opts


class _Writer:
    """Writes NDJSON lines to stdout; remembers when the reader went away."""

    def __init__(self, stream=None):
        stream = stream or sys.stdout
        self.raw = getattr(stream, "buffer", None)
        self.text = stream if self.raw is None else None
        self.broken = False

    def write(self, records):
        if not records or self.broken:
            return not self.broken
        data = "\n".join(encode_line(r) for r in records) + "\n"
        try:
            if self.raw is not None:
                self.raw.write(data.encode("ascii"))
                self.raw.flush()
            else:
                self.text.write(data)
                self.text.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.broken = True
        return not self.broken


def _trim_heap():
    """Hand freed heap pages back to the OS (glibc only). Compiling the shipped source and NVML's
    start-up free megabytes that malloc would otherwise keep resident for the agent's life."""
    try:
        import ctypes  # noqa: PLC0415 - already loaded when pynvml is

        ctypes.CDLL(None).malloc_trim(0)
    except Exception:  # not glibc (musl, macOS): nothing to do
        pass


class _Control:
    """The control channel: a daemon thread reads stdin's JSON lines into a list and wakes the
    main loop through a pipe, which the loop waits on with ``select`` until its next tick. (A
    ``queue.Queue`` wait builds a lock and a condition per call: measured at 1 Hz, ~0.05 ms a
    tick more than this.) ``None`` in the list marks stdin's end."""

    def __init__(self, enabled):
        import collections  # noqa: PLC0415 - only the process needs these
        import select  # noqa: PLC0415

        self.select = select.select
        self.lines = collections.deque()
        self.wake_r = self.wake_w = None
        if enabled:
            import threading  # noqa: PLC0415

            self.wake_r, self.wake_w = os.pipe()
            os.set_blocking(self.wake_w, False)  # a full pipe already wakes the loop
            threading.Thread(target=self._read, name="control", daemon=True).start()

    def _read(self):
        try:
            for line in sys.stdin:
                line = line.strip()
                if line:
                    self._put(line)
        except (OSError, ValueError):
            pass
        self._put(None)

    def _put(self, line):
        self.lines.append(line)
        try:
            os.write(self.wake_w, b"\0")
        except OSError:
            pass

    def wait(self, timeout):
        """Sleep up to ``timeout`` s or until a control line arrives; the lines that did."""
        if self.wake_r is None:
            time.sleep(timeout)
            return ()
        if not self.lines and self.select([self.wake_r], [], [], timeout)[0]:
            os.read(self.wake_r, 4096)
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out


def set_process_name(name="verl-top-agent"):
    """Name the process for ps -e, top and pgrep (Linux: prctl PR_SET_NAME, 15 bytes), so node
    admins see what runs; elsewhere nothing happens."""
    try:
        import ctypes  # noqa: PLC0415 - only where the agent runs

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode("ascii")[:15]), 0, 0, 0)  # 15: PR_SET_NAME
    except Exception:
        pass


def main(argv=None):
    """Run the agent as a process; returns the exit status."""
    set_process_name()
    opts = parse_args(argv)
    agent = Agent(opts)
    writer = _Writer()
    control = _Control(not (opts.ignore_stdin or opts.once))
    try:
        if not writer.write([agent.hello()]):
            return 1
        if not opts.no_topology and not writer.write([agent.topology()]):
            return 1
        if (
            opts.once
            and isinstance(agent.backend, NvmlBackend)
            and "gpm" in agent.backend.capabilities
        ):
            time.sleep(GPM_MIN_GAP_S + 0.02)  # GPM needs two samples 100 ms apart
        limit = 1 if opts.once else max(0, opts.count)
        next_tick = time.monotonic()
        while True:
            mono = time.monotonic()
            if mono >= next_tick:
                if not writer.write(agent.tick(time.time())):
                    return 1
                if agent.ticks == 1:
                    _trim_heap()
                if limit and agent.ticks >= limit:
                    return 0
                next_tick += agent.interval
                if next_tick < mono:  # fell behind (slow spawn, suspend): do not burst
                    next_tick = mono + agent.interval
            for line in control.wait(max(0.0, next_tick - time.monotonic())):
                if line is None:
                    return 0  # stdin closed: the client is gone
                try:
                    error = agent.command(json.loads(line))
                except ValueError:
                    error = "control line is not JSON"
                if error:
                    sys.stderr.write("verl-top-agent: %s\n" % error)
    except KeyboardInterrupt:
        return 130
    finally:
        agent.close()


if __name__ == "__main__":
    _code = main(sys.argv[1:])
    try:
        sys.stdout.flush()
    except Exception:
        pass
    # os._exit: a daemon thread may still block in stdin.readline(), and a normal interpreter
    # shutdown can then abort on the stdin lock; there is nothing left to clean up.
    os._exit(_code)
