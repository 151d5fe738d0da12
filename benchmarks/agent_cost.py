"""What one sample costs on a node: the verl-top agent next to the tools a user would poll.

    python benchmarks/agent_cost.py                       # auto backend, 1 Hz and 10 Hz, 15 s each
    python benchmarks/agent_cost.py --backend replay --gpus 8 --duration 5 --json-out agent.json

Rows, measured in ONE run on the same machine, each paced at 1 Hz and then at 10 Hz:

- ``verl-top agent tick``: ``Agent.tick()`` in this process plus the JSON encoding of its lines
  (exactly what the agent writes per sample); CPU = ``time.process_time`` delta, wall =
  ``perf_counter`` delta; the notes split it into GPU sampling, host sampler, process listing
  and encoding. The 8-GPU target figure scales only the GPU part (the rest is per node).
- ``verl-top agent process``: the real agent started through the SSH bootstrap
  (``python3 -u -c BOOTSTRAP``, zipped package on stdin) as a subprocess: peak RSS (/proc VmHWM),
  bytes per sample on its stdout, and its steady CPU per sample from /proc/PID/task/*/schedstat
  between its first and last tick (so interpreter start-up is not counted).
- ``nvidia-smi --query-gpu ...`` spawned per sample: wall = ``perf_counter``, CPU = the child's
  rusage (``wait4``, the same as ``RUSAGE_CHILDREN`` deltas); its RSS is not measured (a spawned
  child's ru_maxrss includes the parent's pages from before exec).
- nvitop (``Device.all()`` once, then ``[d.as_snapshot() for d in devices]`` per sample) and
  gpustat (``gpustat.new_query()`` per sample), in this process, when importable; their RSS is
  that of a fresh interpreter that imports the library and collects once.
- ``raw pynvml (8 getters)``: the floor, when NVML works.

No GPU here? ``--backend auto`` falls back to the replay backend (the recorded H200 trace fanned
out to ``--gpus`` GPUs) and the comparator rows say "not available".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import REPO, ensure_repo_on_path, fmt, median, percentile, table, write_json

ensure_repo_on_path()

from verl_top.agent import backends, nvml, wire  # noqa: E402
from verl_top.agent.main import Agent, parse_args  # noqa: E402
from verl_top.agent.ship import BOOTSTRAP, agent_payload, build  # noqa: E402

SMI_QUERY = (
    "index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "power.draw,temperature.gpu,clocks.sm"
)
SMI_ARGS = [f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"]
TRACE_CANDIDATES = (
    REPO / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl",
    REPO / "verl_top" / "data" / "demo.ndjson.gz",
)
AGENT_ROW = "verl-top agent tick"
WARMUP_TICKS = 2
# issue 21: per-GPU part <= 0.10 ms, 1-GPU tick <= 0.5 ms CPU, RSS <= 40 MB, >= 50x less CPU than
# spawning nvidia-smi at 1 Hz, >= 20x less than nvitop. CPU figures are MEANS per tick: the agent
# reads GPM, temperature and processes on strides, so a median tick would leave them out.
TARGETS = {
    "gpu_ms_per_gpu": 0.10,
    "tick_ms_1gpu": 0.5,
    "agent_rss_mb": 40.0,
    "ratio_vs_nvidia_smi": 50.0,
    "ratio_vs_nvitop": 20.0,
}


@dataclass
class Row:
    """One tool at one pacing rate."""

    tool: str
    rate_hz: float
    gpus: int | None = None
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    bytes_per_sample: float | None = None
    rss_mb: float | None = None
    rss_peak_mb: float | None = None  # the agent process: VmHWM (peak since exec)
    cpu_ms_steady: float | None = None  # the agent process: from its heartbeats
    parts: dict[str, float | None] = field(default_factory=dict)  # the agent tick's parts
    gpu_ms: list[float] = field(default_factory=list)  # the agent tick: its GPU part per tick
    note: str = ""

    def cpu_median(self) -> float | None:
        """CPU ms per sample: the mean (strided reads amortised); the process row: schedstat."""
        if self.cpu_ms_steady is not None:
            return self.cpu_ms_steady
        return sum(self.cpu_ms) / len(self.cpu_ms) if self.cpu_ms else None

    def summary(self) -> dict[str, Any]:
        """The JSON form (lists summarised)."""
        cpu = self.cpu_median()
        return {
            "tool": self.tool,
            "rate_hz": self.rate_hz,
            "gpus": self.gpus,
            "samples": len(self.wall_ms) or len(self.cpu_ms) or None,
            "wall_ms_median": median(self.wall_ms),
            "wall_ms_p90": percentile(self.wall_ms, 90),
            "wall_ms_max": max(self.wall_ms) if self.wall_ms else None,
            "cpu_ms_mean": cpu,
            "cpu_ms_p50": median(self.cpu_ms),
            "cpu_ms_per_gpu": cpu / self.gpus if cpu is not None and self.gpus else None,
            "rss_mb": self.rss_mb,
            "rss_peak_mb": self.rss_peak_mb,
            "bytes_per_sample": self.bytes_per_sample,
            "parts": self.parts,
            "cpu_ms": [round(x, 4) for x in self.cpu_ms],  # per tick, to see strided ticks
            "gpu_ms": [round(x, 4) for x in self.gpu_ms],
            "note": self.note,
        }


def paced(fn: Callable[[], None], n: int, interval: float) -> None:
    """Call ``fn`` ``n`` times, one call every ``interval`` seconds (no bursts when late)."""
    nxt = time.perf_counter()
    for _ in range(n):
        now = time.perf_counter()
        if now < nxt:
            time.sleep(nxt - now)
        fn()
        nxt += interval
        nxt = max(nxt, time.perf_counter())


# ---------------------------------------------------------------------------------------------
# The agent


def default_trace() -> str:
    """The recorded H200 trace the replay backend plays."""
    for path in TRACE_CANDIDATES:
        if path.exists():
            return str(path)
    raise SystemExit("no replay trace found (tests/fixtures/agent/h200_phased_trace.jsonl)")


def agent_argv(
    backend: str, gpus: int, trace: str, rate: float, count: int = 0, host_sampler: str = "auto"
) -> list[str]:
    """Agent command line for one backend and pacing."""
    argv = ["--backend", backend, "--interval", f"{1.0 / rate:g}", "--host", "bench"]
    argv += ["--host-sampler", host_sampler]
    if backend == "replay":
        argv += ["--replay-trace", trace, "--replay-gpus", str(gpus)]
    if count:
        argv += ["--count", str(count)]
    return argv


def resolve_backend(requested: str, gpus: int, trace: str) -> tuple[str, str]:
    """The backend to measure: ``auto`` means pynvml / nvidia-smi if they work, else replay."""
    if requested != "auto":
        return requested, ""
    agent = Agent(parse_args(agent_argv("auto", gpus, trace, 1.0)))
    try:
        name = agent.backend.name
        why = getattr(agent.backend, "error", "") or ""
    finally:
        agent.close()
    if name in ("pynvml", "nvidia-smi"):
        return name, ""
    return "replay", f"no GPU backend ({why or name}); replaying the H200 trace on {gpus} GPUs"


def _timed(obj: Any, attr: str, sink: list[float]) -> None:
    """Wrap ``obj.attr`` so each call's CPU ms goes to ``sink`` (instance attribute only)."""
    fn = getattr(obj, attr)

    def wrapper(*a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            sink.append((time.process_time() - c0) * 1000)

    setattr(obj, attr, wrapper)


def gpm_every(argv: list[str]) -> int:
    """The agent's GPM stride for this command line."""
    return int(parse_args(argv).gpm_every)


def warm_gpm(backend: Any) -> None:
    """Take each GPU's first GPM metrics now: libnvidia-ml's first nvmlGpmMetricsGet costs ~2 ms
    once (seen on the H200: 2.2-2.8 ms, then 0.15-0.2 ms a sample), not on every GPM tick."""
    gpm = getattr(backend, "_gpm", None)
    if not gpm or not any(st is not None for st in gpm):
        return
    time.sleep(nvml.GPM_MIN_GAP_S + 0.02)
    for i, h in enumerate(backend.handles):
        if gpm[i] is not None:
            backend._gpm_sample(i, h, {})


def fan_out(backend: Any, k: int) -> bool:
    """Make an NVML backend read each of its GPUs ``k`` times per tick, as if the node had ``k``
    times the GPUs (every copy with its own buffers, field dict and GPM samples). With one GPU
    lent, this separates what a tick pays once (waking the interpreter, the binding and the
    driver after a second asleep) from what each further GPU adds. A lower bound for distinct
    GPUs: their driver state sits in different memory. False when the backend is not NVML."""
    if k <= 1 or not isinstance(backend, nvml.NvmlBackend):
        return False
    n = len(backend.handles)
    for name in ("handles", "gpus", "_limits", "_totals"):
        setattr(backend, name, list(getattr(backend, name)) * k)
    backend._fields = [{"index": i, "lost": False, "label": ""} for i in range(n * k)]
    backend._gpm = list(backend._gpm) + [
        backend._gpm_init(backend.handles[i % n]) if backend._gpm[i % n] is not None else None
        for i in range(n, n * k)
    ]
    if backend._direct is not None:
        backend._direct = nvml._DirectNvml.make(backend.nv, n * k)
    return True


def measure_agent_tick(
    argv: list[str], rate: float, n: int, variant: str = "", fan: int = 1
) -> Row:
    """The in-process tick + encoding cost, with its parts (GPU, host, procs, encoding);
    ``fan`` > 1 reads each GPU that many times per tick (see ``fan_out``)."""
    agent = Agent(parse_args(argv))
    if fan > 1 and not fan_out(agent.backend, fan):
        agent.close()
        row = Row(AGENT_ROW + f" [{variant}]", rate)
        row.note = "not available (needs the NVML backend)"
        return row
    row = Row(AGENT_ROW + (f" [{variant}]" if variant else ""), rate, gpus=len(agent.backend.gpus))
    parts: dict[str, list[float]] = {"gpu": [], "host": [], "procs": [], "encode": []}
    _timed(agent.backend, "sample", parts["gpu"])
    _timed(agent.host_sampler, "sample", parts["host"])
    _timed(agent.backend, "processes", parts["procs"])
    nbytes: list[int] = []
    agent.hello()
    # Two ticks before the clock starts: the first ones pay one-off costs (the first GPM window,
    # first calls through ctypes) that a running agent does not; the process row counts them
    # the same way (from its first tick on).
    for _ in range(WARMUP_TICKS):
        agent.tick(time.time())
    warm_gpm(agent.backend)
    for sink in parts.values():
        sink.clear()

    def one() -> None:
        c0 = time.process_time()
        w0 = time.perf_counter()
        records = agent.tick(time.time())
        c_enc = time.process_time()
        data = ("\n".join(wire.encode_line(r) for r in records) + "\n").encode("ascii")
        w1 = time.perf_counter()
        c1 = time.process_time()
        row.wall_ms.append((w1 - w0) * 1000)
        row.cpu_ms.append((c1 - c0) * 1000)
        parts["encode"].append((c1 - c_enc) * 1000)
        nbytes.append(len(data))

    try:
        paced(one, n, 1.0 / rate)
    finally:
        agent.close()
    row.bytes_per_sample = sum(nbytes) / len(nbytes) if nbytes else None
    # procs are listed every --procs-every ticks: their cost per tick is the mean, not median.
    ticks = max(1, len(row.cpu_ms))
    row.gpu_ms = list(parts["gpu"])
    row.parts = {
        "gpu_ms_mean": sum(parts["gpu"]) / ticks,
        "gpu_ms_p50": median(parts["gpu"]),
        "host_ms_mean": sum(parts["host"]) / ticks,
        "procs_ms_per_tick": sum(parts["procs"]) / ticks,
        "encode_ms_mean": sum(parts["encode"]) / ticks,
    }
    row.note = (
        f"backend {agent.backend.name}, host sampler {agent.host_sampler.mode}; CPU ms parts: "
        + ", ".join(f"{k} {fmt(v, 3)}" for k, v in row.parts.items())
    )
    return row


def estimate_8gpu(row: Row) -> float | None:
    """CPU ms per sample for 8 GPUs: the per-GPU part scaled, the per-node parts as measured."""
    cpu = row.cpu_median()
    if cpu is None or not row.gpus:
        return None
    gpu = row.parts.get("gpu_ms_mean")
    if gpu is None:
        return cpu * 8 / row.gpus
    return cpu - gpu + gpu * 8 / row.gpus


def vm_kib(pid: int | str, key: str) -> int | None:
    """A ``VmHWM``/``VmRSS`` line of /proc/PID/status in KiB (peak/current RSS since exec)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for ln in fh:
                if ln.startswith(key + ":"):
                    return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def task_cpu_s(pid: int) -> float | None:
    """CPU seconds of all threads of ``pid`` from /proc/PID/task/*/schedstat (ns resolution;
    os.times() and rusage tick at 10 ms, too coarse for a ~1 ms tick over a few samples)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                total += int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


# A spawned child's ru_maxrss (wait4, RUSAGE_CHILDREN) keeps the high-water mark of the forked
# parent from before exec(), so it reads as the benchmark's own size; /proc VmHWM does not.
RSS_NOTE = "RSS = VmHWM (peak since exec)"


@dataclass
class AgentProcess:
    """The real agent behind the bootstrap, writing to a temporary file."""

    proc: subprocess.Popen[bytes]
    out_path: Path
    n: int
    rate: float
    cpu0: float | None = None
    ticks0: int = 0

    @classmethod
    def start(cls, argv: list[str], rate: float, n: int, warm: int = 1) -> AgentProcess:
        """Start it the way the SSH source does: bootstrap on the command line, source on stdin."""
        fd, name = tempfile.mkstemp(prefix="verl-top-agent-", suffix=".ndjson")
        with os.fdopen(fd, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-u", "-c", BOOTSTRAP, *argv],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        assert proc.stdin is not None
        proc.stdin.write(agent_payload(argv).encode("ascii"))
        proc.stdin.flush()  # stdin stays open: it is the agent's control channel
        self = cls(proc, Path(name), n, rate)
        # Start-up and the first ``warm`` ticks (with NVML: up to the first GPM metrics, which
        # cost the library ~2 ms once) done: from here on, CPU is steady-state sampling.
        self.wait_for(lambda data: data.count(b'"type":"host"') >= warm, timeout=20.0 + warm / rate)
        self.n = n + warm
        # Start-up done and one tick out: from here on, CPU is steady-state sampling.
        self.cpu0 = task_cpu_s(proc.pid)
        self.ticks0 = self.out_path.read_bytes().count(b'"type":"host"')
        return self

    def wait_for(self, done: Callable[[bytes], bool], timeout: float) -> bool:
        """Poll the output file until ``done(data)`` or the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if done(self.out_path.read_bytes()):
                return True
            time.sleep(0.02)
        return False

    def finish(self, timeout: float) -> Row:
        """Wait for ``n`` ticks, read the peak RSS, close stdin (the agent exits), summarise."""
        row = Row("verl-top agent process", self.rate)
        # n + 1 gpu timestamps seen = n complete ticks written
        ok = self.wait_for(lambda data: data.count(b'"type":"host"') >= self.n, timeout=timeout)
        hwm = vm_kib(self.proc.pid, "VmHWM")
        steady = vm_kib(self.proc.pid, "VmRSS")
        cpu1 = task_cpu_s(self.proc.pid)
        ticks1 = self.out_path.read_bytes().count(b'"type":"host"')
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()  # EOF on the control channel: the agent exits
        except OSError:
            pass
        ru = None
        deadline = time.monotonic() + 10
        while ru is None and time.monotonic() < deadline:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                ru = usage
                self.proc.returncode = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.02)
        if ru is None:
            self.proc.kill()
            _, status, ru = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            row.note = "did not exit on stdin EOF; killed. "
        if not ok:
            row.note += "fewer ticks than asked before the timeout. "
        data = self.out_path.read_bytes()
        self.out_path.unlink(missing_ok=True)
        lines = data.splitlines(keepends=True)
        records = [json.loads(x) for x in lines if x.strip()]
        hello = records[0] if records and records[0].get("type") == "hello" else {}
        gpu_t = sorted({r["t"] for r in records if r.get("type") == "host"})
        ticks = len(gpu_t) or self.n
        row.gpus = len(hello.get("gpus") or []) or None
        body = len(data) - (len(lines[0]) if hello else 0)
        row.bytes_per_sample = body / ticks if ticks else None
        hbs = [r for r in records if r.get("type") == "hb" and r.get("agent_cpu_s") is not None]
        hb_rss = max((r.get("agent_rss_bytes") or 0 for r in hbs), default=0) / 2**20
        # The steady resident size (VmRSS after the ticks) is the figure; the peak since exec
        # (VmHWM: start-up, compiling the shipped source) goes in the note.
        row.rss_mb = steady / 1024.0 if steady else (hb_rss or None)
        row.rss_peak_mb = hwm / 1024.0 if hwm else None
        how = "heartbeat deltas"
        if self.cpu0 is not None and cpu1 is not None and ticks1 > self.ticks0:
            row.cpu_ms_steady = (cpu1 - self.cpu0) * 1000 / (ticks1 - self.ticks0)
            how = "/proc schedstat (ns) between the first and the last tick"
        elif len(hbs) >= 2:
            between = sum(1 for t in gpu_t if hbs[0]["t"] < t <= hbs[-1]["t"])
            if between:
                cpu = hbs[-1]["agent_cpu_s"] - hbs[0]["agent_cpu_s"]
                row.cpu_ms_steady = cpu * 1000 / between
        total_cpu = ru.ru_utime + ru.ru_stime
        if row.cpu_ms_steady is None and hbs and ticks > 1:
            # One heartbeat (short run): it came with tick 0 and counts start-up; the rest of
            # the process CPU (rusage at exit) was spent on the other ticks.
            row.cpu_ms_steady = (total_cpu - hbs[0]["agent_cpu_s"]) * 1000 / (ticks - 1)
            how = "exit rusage minus the first heartbeat's CPU"
        row.note += (
            f"exit {self.proc.returncode}; {ticks} ticks; process CPU incl. start-up "
            f"{total_cpu * 1000:.0f} ms; CPU/sample from {how}; RSS = VmRSS after the ticks, "
            f"peak VmHWM {fmt(row.rss_peak_mb, 1)} MB; own heartbeat RSS {hb_rss:.1f} MB"
        )
        return row


# The least any 1 Hz Python process can cost: wake from a timed wait, write one line, wait again.
WAKE_LOOP = """
import os, sys, time
line = b"x" * int(sys.argv[2]) + b"\\n"
interval = float(sys.argv[1])
nxt = time.monotonic()
while True:
    nxt += interval
    time.sleep(max(0.0, nxt - time.monotonic()))
    os.write(1, line)
"""


def measure_wake_floor(rate: float, n: int, line_bytes: int = 700) -> Row:
    """A Python process that only sleeps to the next tick and writes a line of the agent's size:
    its CPU per tick (schedstat, as for the agent process) is the floor under any 1 Hz agent
    on this machine, whatever it samples."""
    row = Row("python wake + write only (floor)", rate)
    fd, name = tempfile.mkstemp(prefix="verl-top-wake-", suffix=".txt")
    path = Path(name)
    with os.fdopen(fd, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", WAKE_LOOP, f"{1.0 / rate:g}", str(line_bytes)],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )

    def lines() -> int:
        return path.read_bytes().count(b"\n")

    try:
        deadline = time.monotonic() + 10 + 2 / rate
        while lines() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        cpu0, l0 = task_cpu_s(proc.pid), lines()
        deadline = time.monotonic() + 10 + (n + 1) / rate
        while lines() < l0 + n and time.monotonic() < deadline:
            time.sleep(0.02)
        cpu1, l1 = task_cpu_s(proc.pid), lines()
    finally:
        proc.kill()
        proc.wait()
        path.unlink(missing_ok=True)
    if cpu0 is not None and cpu1 is not None and l1 > l0:
        row.cpu_ms_steady = (cpu1 - cpu0) * 1000 / (l1 - l0)
        row.note = f"{l1 - l0} ticks; /proc schedstat between its first and last tick"
    else:
        row.note = "not available (could not read /proc schedstat)"
    return row


# ---------------------------------------------------------------------------------------------
# Comparators


def measure_smi(rate: float, n: int) -> Row:
    """``nvidia-smi --query-gpu`` spawned once per sample."""
    row = Row("nvidia-smi --query-gpu (spawn)", rate)
    exe = shutil.which("nvidia-smi")
    if exe is None:
        row.note = "not available (no nvidia-smi on PATH)"
        return row
    nbytes: list[int] = []
    errors: list[str] = []

    def one() -> None:
        w0 = time.perf_counter()
        proc = subprocess.Popen([exe, *SMI_ARGS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        w1 = time.perf_counter()
        if proc.returncode != 0:
            errors.append(f"exit {proc.returncode}")
            return
        row.wall_ms.append((w1 - w0) * 1000)
        row.cpu_ms.append((ru.ru_utime + ru.ru_stime) * 1000)
        nbytes.append(len(out))
        row.gpus = len([x for x in out.splitlines() if x.strip()])

    paced(one, n, 1.0 / rate)
    if not row.wall_ms:
        row.note = f"not available ({errors[0] if errors else 'no output'})"
        return row
    row.rss_mb = None  # ru_maxrss of a spawned child is the parent's pre-exec size; see RSS_NOTE
    row.bytes_per_sample = sum(nbytes) / len(nbytes)
    row.note = "CPU = child rusage (wait4); RSS not measured (lives ~30 ms)"
    return row


def child_rss_mb(code: str) -> float | None:
    """Peak RSS (VmHWM) of a fresh interpreter running ``code`` (what a polling tool weighs)."""
    probe = code + "\nprint([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        return None
    try:
        return int(proc.stdout.strip().splitlines()[-1].split()[1]) / 1024.0
    except (IndexError, ValueError):
        return None


def measure_in_process(
    tool: str,
    rate: float,
    n: int,
    setup: Callable[[], tuple[Callable[[], Any], int]],
    rss_code: str,
) -> Row:
    """A library call timed in this process (wall + process CPU)."""
    row = Row(tool, rate)
    try:
        call, gpus = setup()
    except ImportError as exc:
        row.note = f"not installed ({exc})"
        return row
    except Exception as exc:  # no GPU, NVML missing: the library raises its own errors
        row.note = f"not available ({type(exc).__name__}: {exc})"
        return row
    row.gpus = gpus

    def one() -> None:
        c0 = time.process_time()
        w0 = time.perf_counter()
        call()
        w1 = time.perf_counter()
        c1 = time.process_time()
        row.wall_ms.append((w1 - w0) * 1000)
        row.cpu_ms.append((c1 - c0) * 1000)

    try:
        paced(one, n, 1.0 / rate)
    except Exception as exc:
        row.note = f"failed ({type(exc).__name__}: {exc})"
        return row
    row.rss_mb = child_rss_mb(rss_code)
    row.note = "in-process; RSS of a fresh interpreter doing one collection"
    return row


def nvitop_setup() -> tuple[Callable[[], Any], int]:
    """nvitop: devices once, snapshots per sample (what its UI loop does)."""
    import nvitop  # noqa: PLC0415 - optional comparator

    devices = nvitop.Device.all()
    if not devices:
        raise RuntimeError("no devices")
    return (lambda: [d.as_snapshot() for d in devices]), len(devices)


def gpustat_setup() -> tuple[Callable[[], Any], int]:
    """gpustat: one new_query() per sample."""
    import gpustat  # noqa: PLC0415 - optional comparator

    first = gpustat.new_query()
    return gpustat.new_query, len(first.gpus)


def pynvml_floor_setup() -> tuple[Callable[[], Any], int]:
    """Raw pynvml, 8 getters per GPU: the least any NVML-based tool can spend."""
    import pynvml  # noqa: PLC0415 - optional

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    if not handles:
        raise RuntimeError("no devices")

    def call() -> None:
        for h in handles:
            pynvml.nvmlDeviceGetUtilizationRates(h)
            pynvml.nvmlDeviceGetMemoryInfo(h)
            pynvml.nvmlDeviceGetPowerUsage(h)
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            pynvml.nvmlDeviceGetEnforcedPowerLimit(h)

    return call, len(handles)


NVITOP_RSS = "import nvitop; ds = nvitop.Device.all(); [d.as_snapshot() for d in ds]"
GPUSTAT_RSS = "import gpustat; gpustat.new_query()"
PYNVML_RSS = "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount()"


# ---------------------------------------------------------------------------------------------
# Run and report


def run_rate(
    backend: str,
    gpus: int,
    trace: str,
    rate: float,
    n: int,
    floor: bool,
    host_sampler: str,
    extra: list[str] | None = None,
    only_agent: bool = False,
) -> list[Row]:
    """All rows at one pacing rate (``extra``: more agent options; ``only_agent``: no
    comparators)."""
    argv = agent_argv(backend, gpus, trace, rate, host_sampler=host_sampler) + (extra or [])
    warm = 1 if backend != "pynvml" else gpm_every(argv) + 2
    proc = AgentProcess.start(argv, rate, n, warm)
    rows = [measure_agent_tick(argv, rate, n)]
    # The subprocess ran alongside the in-process loop; it is reaped before any spawned
    # comparator, so nothing else is counted in its rusage.
    rows.append(proc.finish(timeout=n / rate + 30))
    rows.append(measure_wake_floor(rate, n))
    if only_agent:
        return rows
    rows.append(measure_smi(rate, n))
    rows.append(
        measure_in_process("nvitop Device.as_snapshot() all", rate, n, nvitop_setup, NVITOP_RSS)
    )
    rows.append(measure_in_process("gpustat.new_query()", rate, n, gpustat_setup, GPUSTAT_RSS))
    if floor:
        rows.append(
            measure_in_process(
                "raw pynvml, 8 getters (floor)", rate, n, pynvml_floor_setup, PYNVML_RSS
            )
        )
    return rows


def ratio(row: Row, agent: Row) -> tuple[float | None, str]:
    """CPU of ``row`` over the agent's; per GPU when the GPU counts differ (replay fan-out)."""
    a, c = agent.cpu_median(), row.cpu_median()
    if a is None or c is None or a <= 0 or row.tool.startswith("verl-top"):
        return None, ""
    if row.gpus and agent.gpus and row.gpus != agent.gpus:
        return (c / row.gpus) / (a / agent.gpus), " (per GPU)"
    return c / a, ""


HEADERS = [
    "tool",
    "Hz",
    "GPUs",
    "wall ms/sample p50",
    "p90",
    "CPU ms/sample mean",
    "CPU ms/GPU",
    "RSS MB",
    "bytes/sample",
    "CPU ratio vs agent",
]


def report(rows: list[Row]) -> str:
    """The printed table (rows grouped by rate) and notes."""
    out_rows = []
    notes = []
    by_rate: dict[float, list[Row]] = {}
    for r in rows:
        by_rate.setdefault(r.rate_hz, []).append(r)
    for rate, group in by_rate.items():
        agent = next(r for r in group if r.tool == AGENT_ROW)
        for r in group:
            s = r.summary()
            rv, how = ratio(r, agent)
            unavailable = not r.wall_ms and r.cpu_ms_steady is None and r.rss_mb is None
            out_rows.append(
                [
                    r.tool,
                    f"{rate:g}",
                    r.gpus,
                    s["wall_ms_median"],
                    s["wall_ms_p90"],
                    s["cpu_ms_mean"],
                    s["cpu_ms_per_gpu"],
                    s["rss_mb"],
                    None if s["bytes_per_sample"] is None else round(s["bytes_per_sample"]),
                    "1.0 (reference)"
                    if r is agent
                    else (None if rv is None else f"{rv:.1f}x{how}"),
                ]
            )
            if unavailable or r.note:
                notes.append(f"[{rate:g} Hz] {r.tool}: {r.note}")
    text = table(HEADERS, out_rows, digits=3)
    return text + "\n\nnotes:\n" + "\n".join(f"  {n}" for n in notes)


def targets(rows: list[Row]) -> list[dict[str, Any]]:
    """Issue 21's agent targets against this run, 1 Hz (lowest rate) figures."""
    one = [r for r in rows if r.rate_hz == min(r.rate_hz for r in rows)]
    agent = next(r for r in one if r.tool == AGENT_ROW)
    proc = next(r for r in one if r.tool == "verl-top agent process")
    gpus = agent.gpus or 1
    gpu_part = agent.parts.get("gpu_ms_mean")
    out = [
        {
            "target": "GPU part per GPU, CPU ms per tick (mean)",
            "limit": f"<= {TARGETS['gpu_ms_per_gpu']}",
            "measured": None if gpu_part is None else gpu_part / gpus,
        },
        {
            "target": f"agent tick CPU ms, {gpus} GPU(s), incl. encoding (mean)",
            "limit": f"<= {TARGETS['tick_ms_1gpu']} (1 GPU)",
            "measured": agent.cpu_median(),
        },
        {
            "target": "agent tick CPU ms, 8 GPUs (estimate)",
            "limit": "-",
            "measured": estimate_8gpu(agent),
        },
        {
            "target": "agent process CPU ms per tick (schedstat)",
            "limit": "-",
            "measured": proc.cpu_median(),
        },
        {
            "target": "agent process RSS (MB)",
            "limit": f"<= {TARGETS['agent_rss_mb']:g}",
            "measured": proc.rss_mb,
        },
    ]
    out += marginal_targets(one, agent)
    for name, key in (("nvidia-smi", "ratio_vs_nvidia_smi"), ("nvitop", "ratio_vs_nvitop")):
        comp = next((r for r in one if r.tool.startswith(name)), None)
        rv = ratio(comp, agent)[0] if comp is not None else None
        out.append(
            {"target": f"CPU ratio vs {name}", "limit": f">= {TARGETS[key]:g}x", "measured": rv}
        )
        # The same against the whole agent process (its wake-ups, writing, control channel):
        # what the node really pays, next to what a spawned nvidia-smi really costs.
        pc, cc = proc.cpu_median(), None if comp is None else comp.cpu_median()
        out.append(
            {
                "target": f"CPU ratio vs {name}, whole agent process",
                "limit": f">= {TARGETS[key]:g}x",
                "measured": cc / pc if pc and cc else None,
            }
        )
    return out


def marginal_targets(one: list[Row], agent: Row) -> list[dict[str, Any]]:
    """With ``--fan-out K``: what each further GPU adds to a tick, and the 8-GPU tick from it."""
    fans = {}
    for r in one:
        if r.tool.startswith(AGENT_ROW + " [gpu x") and r.parts.get("gpu_ms_mean") is not None:
            fans[int(r.tool.rsplit("x", 1)[1].rstrip("]"))] = r.parts["gpu_ms_mean"]
    if 1 not in fans or len(fans) < 2:
        return []
    k = max(fans)
    per_gpu = (fans[k] - fans[1]) / (k - 1)
    base = agent.cpu_median()
    return [
        {
            # A lower bound: the driver answers a second read of the same GPU within a tick
            # from what it just fetched (benchmarks/nvml_cold.py), a distinct GPU it would not.
            "target": f"GPU part per added read of the same GPU (1x vs {k}x; lower bound)",
            "limit": "-",
            "measured": per_gpu,
        },
        {
            "target": "agent tick CPU ms, 8 reads of the one GPU (lower bound for 8 GPUs)",
            "limit": "-",
            "measured": None if base is None else base + 7 * per_gpu,
        },
    ]


# ---------------------------------------------------------------------------------------------
# Where the floor is: one NVML call, pynvml's getter against the agent's direct call, and RSS


def nvml_call_costs(reps: int = 300) -> list[dict[str, Any]]:
    """CPU us per call of each NVML read, through pynvml and through the agent's fast path."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        return []
    try:
        backend = nvml.NvmlBackend(None, 1, 1)
    except backends.BackendUnavailable:
        return []
    nv, h, rows = pynvml, backend.handles[0], []

    def timeit(name: str, how: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # unsupported here: say so
            rows.append({"call": name, "via": how, "us": None, "note": type(exc).__name__})
            return
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        rows.append({"call": name, "via": how, "us": (time.process_time() - c0) * 1e6 / reps})

    timeit("utilization", "pynvml", lambda: nv.nvmlDeviceGetUtilizationRates(h))
    timeit("memory v2", "pynvml", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
    timeit("power usage", "pynvml", lambda: nv.nvmlDeviceGetPowerUsage(h))
    timeit("temperature", "pynvml", lambda: nv.nvmlDeviceGetTemperature(h, 0))
    timeit("SM clock", "pynvml", lambda: nv.nvmlDeviceGetClockInfo(h, 1))
    timeit("clock reasons", "pynvml", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
    timeit("field values [power avg]", "pynvml", lambda: nv.nvmlDeviceGetFieldValues(h, [185]))
    d = backend._direct
    if d is not None:
        util, mem, sm, memclk, temp, reasons, power, fv, p = d.bufs[0]
        timeit("utilization", "direct", lambda: d.util_fn(h, p[0]))
        timeit("memory v2", "direct", lambda: d.mem_fn(h, p[1]))
        timeit("power usage", "direct", lambda: d.power_fn(h, p[6]))
        timeit("temperature", "direct", lambda: d.temp_fn(h, 0, p[4]))
        timeit("SM clock", "direct", lambda: d.clock_fn(h, 1, p[2]))
        timeit("clock reasons", "direct", lambda: d.reasons_fn(h, p[5]))
        timeit("field values [power avg]", "direct", lambda: d.fields_fn(h, d.n1, fv))
    f: dict[str, Any] = {}
    if backend._gpm[0] is not None:

        def gpm() -> None:
            backend._gpm[0][3] = 0.0  # skip the 100 ms guard: we time the calls, not the data
            backend._gpm_sample(0, h, f)

        timeit("GPM sample + 8 metrics", "pynvml", gpm)
    backend._ticks = 0
    timeit("whole GPU read (strides 1)", "agent", lambda: backend._sample_gpu(0, h))
    backend._slow_due = backend._gpm_due = False
    timeit("whole GPU read (fast ticks)", "agent", lambda: backend._sample_gpu(0, h))
    backend.close()
    return rows


# A: the shipped zip in a file; O, N: where loader.py sits in it. The steps load the package the
# way a node does (loader.py's in-memory importer), without the sha256 check.
RSS_STEPS = (
    ("python -c pass", "pass"),
    (
        "+ agent package (in memory)",
        "import sys; d = open(A, 'rb').read(); g = {}; exec(compile(d[O:O + N], 'l', 'exec'), g)\n"
        "sys.meta_path.insert(0, g['MemoryImporter'](g['PACKAGE'], g['read_zip'](d)))\n"
        "import verl_top_agent.main",
    ),
    ("+ import pynvml", "import pynvml"),
    ("+ nvmlInit + handle", "pynvml.nvmlInit(); pynvml.nvmlDeviceGetHandleByIndex(0)"),
    (
        "+ NvmlBackend (GPM buffers)",
        "from verl_top_agent.nvml import NvmlBackend; b = NvmlBackend(); b.sample(0)",
    ),
)


def rss_steps() -> list[dict[str, Any]]:
    """VmRSS of fresh interpreters doing a little more each: where the agent's memory goes."""
    payload = build()
    fd, zip_path = tempfile.mkstemp(prefix="verl-top-agent-", suffix=".zip")
    with os.fdopen(fd, "wb") as fh:
        fh.write(payload.zip)
    out: list[dict[str, Any]] = []
    code = f"A, O, N = {zip_path!r}, {payload.loader_offset}, {payload.loader_size}\n"
    try:
        for name, step in RSS_STEPS:
            code += step + "\n"
            probe = (
                code + "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0])"
            )
            proc = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
            )
            try:
                mb: float | None = int(proc.stdout.strip().splitlines()[-1].split()[1]) / 1024.0
            except (IndexError, ValueError):
                mb = None
            error = proc.stderr.strip()[-200:] if mb is None else ""
            out.append({"step": name, "rss_mb": mb, "error": error})
            if mb is None:
                break
    finally:
        os.unlink(zip_path)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--backend", default="auto", choices=("auto", "pynvml", "nvidia-smi", "replay"))
    p.add_argument("--gpus", type=int, default=8, help="replay fan-out (GPUs per node)")
    p.add_argument("--trace", default=None, help="replay trace (default: the bundled H200 trace)")
    p.add_argument("--rates", default="1,10", help="pacing rates in Hz, comma separated")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per tool and rate")
    p.add_argument("--samples", type=int, default=0, help="samples per tool and rate (overrides)")
    p.add_argument("--no-floor", action="store_true", help="skip the raw pynvml floor row")
    p.add_argument(
        "--host-sampler", default="auto", choices=("auto", "psutil", "proc"), help="agent option"
    )
    p.add_argument("--json-out", default=None, metavar="FILE")
    p.add_argument(
        "--no-floor-detail", action="store_true", help="skip NVML call costs and RSS steps"
    )
    p.add_argument(
        "--agent-extra", default="", metavar="ARGS", help="more agent options, e.g. '--nvml ctypes'"
    )
    p.add_argument("--only-agent", action="store_true", help="the agent rows only, no comparators")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="also time the tick with other agent options at the lowest rate, e.g. "
        "'gpm30=--gpm-every 30' (repeatable)",
    )
    p.add_argument(
        "--fan-out",
        type=int,
        default=0,
        metavar="K",
        help="NVML only: also time the tick reading each GPU 1 and K times per tick, to separate "
        "what a tick pays once from what each further GPU adds",
    )
    args = p.parse_args(argv)

    trace = args.trace or default_trace()
    backend, why = resolve_backend(args.backend, args.gpus, trace)
    print(f"agent backend: {backend}" + (f" — {why}" if why else ""))
    rows: list[Row] = []
    for rate in (float(x) for x in args.rates.split(",") if x.strip()):
        n = args.samples or max(3, int(round(args.duration * rate)))
        print(f"measuring at {rate:g} Hz, {n} samples per tool ...", flush=True)
        rows += run_rate(
            backend,
            args.gpus,
            trace,
            rate,
            n,
            not args.no_floor,
            args.host_sampler,
            args.agent_extra.split(),
            args.only_agent,
        )
    low = min(float(x) for x in args.rates.split(",") if x.strip())
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        n = args.samples or max(3, int(round(args.duration * low)))
        print(f"variant {name}: {extra} at {low:g} Hz ...", flush=True)
        base = agent_argv(backend, args.gpus, trace, low, host_sampler=args.host_sampler)
        rows.append(measure_agent_tick(base + extra.split(), low, n, variant=name))
    if args.fan_out > 1:
        n = args.samples or max(3, int(round(args.duration * low)))
        base = agent_argv(backend, args.gpus, trace, low, host_sampler=args.host_sampler)
        for k in (1, args.fan_out):
            print(f"GPU fan-out x{k} at {low:g} Hz ...", flush=True)
            rows.append(measure_agent_tick(base, low, n, variant=f"gpu x{k}", fan=k))
    print()
    print(report(rows))
    tgt = targets(rows)
    print("\ntargets (lowest rate):")
    for t in tgt:
        print(f"  {t['target']}: {fmt(t['measured'], 3)} (target {t['limit']})")
    calls: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    if not args.no_floor_detail and backend == "pynvml":
        calls, steps = nvml_call_costs(), rss_steps()
        print("\nNVML calls, CPU us per call (one GPU):")
        for c in calls:
            print(f"  {c['call']:<30} {c['via']:<7} {fmt(c['us'], 2)} {c.get('note', '')}")
        print("\nRSS of fresh interpreters (MB):")
        for st in steps:
            print(f"  {st['step']:<30} {fmt(st['rss_mb'], 1)} {st['error']}")
    write_json(
        args.json_out,
        {
            "benchmark": "agent_cost",
            "backend": backend,
            "backend_note": why,
            "argv": sys.argv[1:] if argv is None else argv,
            "rows": [r.summary() for r in rows],
            "targets": tgt,
            "nvml_calls": calls,
            "rss_steps": steps,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
