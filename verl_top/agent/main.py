"""The agent: one ``Agent`` samples the GPUs, the host and the processes once per tick and polls
the followed logs; ``main`` runs it as a process (NDJSON on stdout, JSON control lines on stdin,
exit when stdin closes or stdout breaks). ``verl_top.sources.local`` runs ``Agent`` in-process.
See docs/protocol.md and docs/agent.md."""

from __future__ import annotations

import json
import os
import sys
import time

from .backends import make_backend
from .follow import FOLLOW_KINDS, Follower, parse_follow
from .host import HostSampler
from .procs import JobScanner, ProcInspector, proc_dict
from .strides import CPU_EVERY, GPM_EVERY, MEM_EVERY, PROCS_EVERY, SLOW_EVERY
from .topo import SYS_ROOT, collect_topology
from .wire import AGENT_VERSION, PROTOCOL_VERSION, encode_line, record

# Everything else is imported where it is used (argparse, threading, ...): a module the agent
# does not need on its path costs resident memory for the agent's whole life.

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace
    from collections import deque
    from typing import Any, TextIO

    from .wire import Wire

HEARTBEAT_S = 5.0
PROCS_FORCE_S = 30.0
GPM_WARMUP_S = 0.12  # GPM needs two samples 100 ms apart (nvml.GPM_MIN_GAP_S) for its first window


class Agent:
    """Samples everything once per ``tick``; usable in-process or behind ``main``."""

    def __init__(self, options: Namespace | None = None) -> None:
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
        # The job's processes (any, GPU or not); a replayed trace has no processes of its own.
        self.jobs = JobScanner(self.inspector) if self.backend.name != "replay" else None
        self.followers: dict[str, Follower] = {}  # path -> Follower
        for spec in opts.follow or ():
            kind, path, from_start = parse_follow(spec)
            self.follow(kind, path, from_start)
        self.ticks = 0
        self.seq = 0
        self._last_hb: float | None = None
        self._last_procs: tuple[float, Any] | None = None  # (t, signature)
        self._state = ""  # last runtime node-level error reported

    @property
    def blocking(self) -> bool:
        """True when a tick may block for long (spawns nvidia-smi, or psutil syscalls)."""
        return bool(self.backend.blocking or self.host_sampler.mode == "psutil")

    def hello(self, now: float | None = None) -> Wire:
        """The hello record: who this agent is, what it sees, which backend it uses."""
        b = self.backend
        caps = list(b.capabilities)
        if not self.procs_enabled and "procs" in caps:
            caps.remove("procs")
        if self.host_sampler.mode == "psutil":
            caps.append("psutil")
        if self.procs_enabled and self.jobs is not None and self.inspector.has_proc:
            caps.append("jobs")  # procs records carry job_procs
        caps.append("follow")
        fields = (
            ("agent_version", AGENT_VERSION),
            ("python", ".".join(str(x) for x in sys.version_info[:3])),
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
        return record("hello", self.host, round(now or time.time(), 3), fields)

    def tick(self, now: float | None = None) -> list[Wire]:
        """All records of one sampling instant (gpu, host, maybe procs, hb, log)."""
        now = round(now if now is not None else time.time(), 3)
        host = self.host
        out: list[Wire] = []
        for fields in self.backend.sample(now):
            rec: Wire = {"v": PROTOCOL_VERSION, "type": "gpu", "host": host, "t": now}
            for k, v in fields:  # backends give every field in model order, lost and label too
                if v is not None:
                    rec[k] = v
            out.append(rec)
        failing = getattr(self.backend, "failing", "")
        if failing != self._state:
            state = "no_gpu" if failing else "up"
            out.append(record("state", host, now, (("state", state), ("reason", failing))))
            self._state = failing
        out.append(record("host", host, now, self.host_sampler.sample(now)))
        if self.procs_enabled and self.ticks % self.procs_every == 0:
            procs = self._procs(now)
            if procs is not None:
                out.append(procs)
        if self._last_hb is None or now - self._last_hb >= HEARTBEAT_S:
            out.append(self._heartbeat(now))
        for follower in list(self.followers.values()):
            out.extend(follower.poll(host, now))
        self.ticks += 1
        return out

    def topology(self, now: float | None = None) -> Wire:
        """The ``topo`` record (GPU/NIC topology, network inventory); sent once per connection."""
        fields = collect_topology(self.backend, getattr(self.opts, "sys_root", SYS_ROOT))
        return record("topo", self.host, round(now or time.time(), 3), fields)

    def _heartbeat(self, now: float) -> Wire:
        self._last_hb = now
        self.seq += 1
        fields = (
            ("agent_cpu_s", round(HostSampler.agent_cpu_s(), 3)),
            ("agent_rss_bytes", self.host_sampler.agent_rss()),
            ("seq", self.seq),
        )
        return record("hb", self.host, now, fields)

    def _procs(self, now: float) -> Wire | None:
        """A procs record: the GPU processes and the job's processes. Sent every listing while
        the job has processes here (their state, CPU and method move); with GPU processes only,
        when their set or titles changed, or every 30 s. None when there is nothing to say."""
        raw = self.backend.processes()
        if raw is None and self.jobs is None:
            return None
        self.inspector.begin()
        rows = sorted(raw or [])
        infos = [self.inspector.inspect(pid) for pid, _, _ in rows]
        gpus_by_pid: dict[int, list[int]] = {}
        for (pid, gpu, _), info in zip(rows, infos):
            if info.get("visible", True):
                gpus_by_pid.setdefault(pid, []).append(gpu)
        jobs = self.jobs.scan(gpus_by_pid, now) if self.jobs is not None else []
        self.inspector.forget_except({p[0] for p in rows} | {j["pid"] for j in jobs})
        if raw is None and not jobs:
            return None
        # A changed title (the method a Ray worker runs) is a change too, not only pids and memory.
        signature = (tuple(rows), tuple(info.get("cmd", "") for info in infos))
        last = self._last_procs
        fresh = last is not None and last[1] == signature and now - last[0] < PROCS_FORCE_S
        if fresh and not jobs:
            return None
        self._last_procs = (now, signature)
        procs = [proc_dict(pid, gpu, used, info) for (pid, gpu, used), info in zip(rows, infos)]
        return record("procs", self.host, now, (("procs", procs), ("job_procs", jobs)))

    def follow(self, kind: str, path: str, from_start: bool = False) -> None:
        """Start following ``path`` (replaces an existing follower of the same path)."""
        if kind not in FOLLOW_KINDS:
            raise ValueError(f"unknown follow kind {kind!r}")
        old = self.followers.pop(path, None)
        if old is not None:
            old.close()
        self.followers[path] = Follower(kind, path, from_start)

    def unfollow(self, path: str) -> None:
        """Stop following ``path``."""
        old = self.followers.pop(path, None)
        if old is not None:
            old.close()

    def command(self, cmd: Any) -> str:
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
                if hasattr(self.backend, "interval"):  # the replay backend paces by it
                    self.backend.interval = self.interval
            elif name == "procs":
                self.procs_enabled = bool(cmd["value"])
                self._last_procs = None
            else:
                return f"unknown command {name!r}"
        except (KeyError, TypeError, ValueError) as exc:
            return f"bad {name} command: {exc}"
        return ""

    def close(self) -> None:
        """Release NVML, open /proc files and followed files."""
        for follower in self.followers.values():
            follower.close()
        self.followers.clear()
        self.backend.close()
        self.host_sampler.close()
        self.inspector.close()


def parse_args(argv: list[str] | None = None) -> Namespace:
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
    p.add_argument(
        "--procs-every", type=int, default=PROCS_EVERY, help="list processes every N ticks"
    )
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

    def __init__(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stdout
        self.raw = getattr(stream, "buffer", None)
        self.text = stream if self.raw is None else None
        self.broken = False

    def write(self, records: list[Wire]) -> bool:
        """Write ``records`` as lines; False once the reader is gone."""
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


def _trim_heap() -> None:
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

    def __init__(self, enabled: bool) -> None:
        import collections  # noqa: PLC0415 - only the process needs these
        import select  # noqa: PLC0415

        self.select = select.select
        self.lines: deque[str | None] = collections.deque()
        self.wake_r: int | None = None
        self.wake_w: int | None = None
        if enabled:
            import threading  # noqa: PLC0415

            self.wake_r, self.wake_w = os.pipe()
            os.set_blocking(self.wake_w, False)  # a full pipe already wakes the loop
            threading.Thread(target=self._read, name="control", daemon=True).start()

    def _read(self) -> None:
        """The reader thread: stdin's non-empty lines, then None at its end."""
        try:
            for line in sys.stdin:
                line = line.strip()
                if line:
                    self._put(line)
        except (OSError, ValueError):
            pass
        self._put(None)

    def _put(self, line: str | None) -> None:
        self.lines.append(line)
        try:
            os.write(self.wake_w, b"\0")  # type: ignore[arg-type] # set when the thread runs
        except OSError:
            pass

    def wait(self, timeout: float) -> list[str | None]:
        """Sleep up to ``timeout`` s or until a control line arrives; the lines that did."""
        if self.wake_r is None:
            time.sleep(timeout)
            return []
        if not self.lines and self.select([self.wake_r], [], [], timeout)[0]:
            os.read(self.wake_r, 4096)
        out: list[str | None] = []
        while self.lines:
            out.append(self.lines.popleft())
        return out


def set_process_name(name: str = "verl-top-agent") -> None:
    """Name the process for ps -e, top and pgrep (Linux: prctl PR_SET_NAME, 15 bytes), so node
    admins see what runs; elsewhere nothing happens."""
    try:
        import ctypes  # noqa: PLC0415 - only where the agent runs

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode("ascii")[:15]), 0, 0, 0)  # 15: PR_SET_NAME
    except Exception:
        pass


def main(argv: list[str] | None = None) -> int:
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
        if opts.once and agent.backend.name == "pynvml" and "gpm" in agent.backend.capabilities:
            time.sleep(GPM_WARMUP_S)
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
                    sys.stderr.write(f"verl-top-agent: {error}\n")
    except KeyboardInterrupt:
        return 130
    finally:
        agent.close()


def run(argv: list[str]) -> None:
    """``main`` as the whole life of the process: flush stdout and exit with its status.

    os._exit: a daemon thread may still block in stdin.readline(), and a normal interpreter
    shutdown can then abort on the stdin lock; there is nothing left to clean up.
    """
    code = main(argv)
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os._exit(code)
