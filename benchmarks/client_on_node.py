"""The TUI's own CPU on the node it watches: verl-top under tmux, a steady window after warm-up.

    python benchmarks/client_on_node.py --verl-log /path/to/driver.log          # a real job
    python benchmarks/client_on_node.py --backend replay --duration 60          # no GPU
    python benchmarks/client_on_node.py --backend replay --gpus 1               # a 1-GPU node
    python benchmarks/client_on_node.py --extra='--ray http://127.0.0.1:8265' --verl-log L

Target (product brief, issue 30 item 5): the TUI watching one real job on its node, at a 1 s
interval, uses at most 2 % of a core. A lifetime mean from ``ps`` counts start-up (imports,
NVML init, reading the log's history); this measures a steady window instead.

**The TUI as people run it.** ``verl-top --interval 1 --follow --verl-log LOG [...]`` in a real
terminal (a detached tmux session, 200x50). After ``--warmup`` seconds its CPU is read from
``/proc/PID/stat`` (user + system of every thread, dead ones included) and per thread from
``/proc/PID/task/*/schedstat`` (ns), at the start and end of ``--duration`` seconds: % of one
core, the event loop's thread against the others (the diagnosis worker, the agent's executor,
Textual's input and writer threads).

**Where it goes** (``--sampler``), in parts: agent tick (the in-process agent's sampling), log
follower (reading the log), decode (wire dicts to records), intake (the pipeline: parse the log
lines, redact, route), store (``Store.ingest``), monitor (status, assessment), engine
(``Engine.evaluate``, in whatever thread runs it), refresh (header and visible pane: the
widgets' content), layout (Textual's reflow), tables' and other widgets' lines, compositor
(the update's chops), terminal output (the update as escape codes), event loop (asyncio's
select and what wakes it), and the rest (timers, messages, GC). What runs inside another part
is that part's (the engine inside a refresh when it runs on the loop, a widget's lines inside
the compositor). Two ways:

- ``py-spy`` (the default when it is installed): py-spy samples the same process over the same
  window (``--nonblocking``: it never stops it; running threads only); each sample goes to the
  innermost part on its stack, and the window's CPU is shared out in those proportions.
- ``instruments``: a second tmux run through this script (``--instrument``), which wraps each
  part's method in the verl-top process and times it with its thread's CPU clock (nested parts
  exclusive), and GC through ``gc.callbacks``. Exact per call, but the wrappers cost CPU of
  their own where calls are many (the run's total says how much).

Without ``--verl-log`` a live log is written while it runs, by a child process (not counted):
the real VLM GRPO log of tests/fixtures/real_logs, its head (banner, config) and one run of its
body (9 steps) at once, as a job already under way, then its body again (steps renumbered) at
``--log-rate`` lines/s. Results: ``--json-out FILE`` (else ``OUT/client_on_node.json``, ``--out``
or $OUT or the current folder) and a table. On a machine without a GPU use ``--backend replay``
(the H200 trace, fanned out to ``--gpus`` GPUs: 8 by default, as on an 8-GPU node).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import REPO, code_root, ensure_repo_on_path, table, write_json
from postmortem_log import renumbered, split_log

SOURCE = REPO / "tests" / "fixtures" / "real_logs" / "vlm_gui_cursor_custom_rollout_key.log"
TRACE = REPO / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl"
TICK_HZ = os.sysconf("SC_CLK_TCK")
TERMINAL = (200, 50)
TARGET_PCT = 2.0
REPLAY_GPUS = 8  # the agent's own default for its replay backend
SAMPLE_HZ = 250


# ---------------------------------------------------------------------------------------------
# A live log (written by a child process, so its CPU is nobody's part)


def log_lines(source: Path) -> Iterator[bytes]:
    """The body of ``source`` again and again, its steps renumbered to follow on."""
    _, body, steps = split_log(source)
    copy = 0
    while True:
        yield from (line + b"\n" for line in renumbered(body, steps * copy))
        copy += 1


def write_log(path: Path, rate: float, source: Path = SOURCE) -> None:
    """Write ``source``'s head and one run of its body to ``path`` at once (a job under way),
    then append its body again at ``rate`` lines per second (bursts every 0.1 s) until killed."""
    head, body, _ = split_log(source)
    path.write_bytes(b"\n".join(head + body) + b"\n")
    lines = log_lines(source)
    for _ in body:  # the first run is written already
        next(lines)
    per_burst = max(1, round(rate / 10))
    with open(path, "ab", buffering=0) as fh:
        t = time.monotonic()
        while True:
            t += 0.1
            fh.write(b"".join(next(lines) for _ in range(per_burst)))
            time.sleep(max(0.0, t - time.monotonic()))


@contextlib.contextmanager
def live_log(path: Path, rate: float) -> Iterator[Path]:
    """A child process writing ``path`` while the block runs (removed after it)."""
    path.unlink(missing_ok=True)
    child = subprocess.Popen(
        [sys.executable, __file__, "--write-log", str(path), "--log-rate", f"{rate:g}"],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield path
    finally:
        child.terminate()
        child.wait(10)
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The TUI under tmux


@dataclass
class Cpu:
    """A process's CPU counters at one moment."""

    wall: float
    ticks: int  # utime + stime of every thread, dead ones included (/proc/PID/stat)
    threads: dict[int, int] = field(default_factory=dict)  # tid -> ns on CPU (schedstat)
    rss_kb: int = 0


def read_cpu(pid: int) -> Cpu:
    """/proc counters of ``pid`` now."""
    wall = time.monotonic()
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    threads: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                threads[int(tid)] = int(fh.read().split()[0])
    rss = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    # utime and stime: fields 14 and 15 of stat(5), 11 and 12 after the command's ")"
    return Cpu(wall, int(fields[11]) + int(fields[12]), threads, rss)


def window_figures(pid: int, start: Cpu, a: Cpu, b: Cpu) -> dict[str, Any]:
    """The steady window [a, b] of process ``pid`` (started at ``start``) as figures."""
    wall = b.wall - a.wall
    loop_ns = b.threads.get(pid, 0) - a.threads.get(pid, 0)
    others = sum(v - a.threads.get(t, 0) for t, v in b.threads.items() if t != pid)
    return {
        "window_s": wall,
        "cpu_pct": 100.0 * (b.ticks - a.ticks) / TICK_HZ / wall,
        "startup_cpu_s": (a.ticks - start.ticks) / TICK_HZ,
        "loop_thread_pct": 100.0 * loop_ns / 1e9 / wall,
        "other_threads_pct": 100.0 * others / 1e9 / wall,
        "threads": len(b.threads),
        "rss_mb": b.rss_kb / 1024.0,
    }


def verl_top_argv(args: argparse.Namespace, log: Path) -> list[str]:
    """The command line people would type (plus the replay backend here)."""
    argv = ["--interval", f"{args.interval:g}", "--follow", "--verl-log", str(log.resolve())]
    if args.backend != "auto":
        argv += ["--backend", args.backend]
    if args.backend == "replay":
        argv += ["--replay-trace", str(TRACE)]
    return argv + shlex.split(args.extra)


def tmux_command(args: argparse.Namespace, log: Path, report: Path | None) -> str:
    """The shell command tmux runs: ``python -m verl_top``, or verl-top started through this
    script (``--launch``) when it needs instruments or a replay with another GPU count."""
    argv = verl_top_argv(args, log)
    gpus = args.gpus if args.backend == "replay" else REPLAY_GPUS
    if report is None and gpus == REPLAY_GPUS:
        head = [sys.executable, "-m", "verl_top"]
    else:
        head = [sys.executable, __file__, "--launch", "--gpus", str(gpus)]
        if report is not None:
            head += ["--instrument", str(report)]
        head += ["--warmup", f"{args.warmup:g}", "--duration", f"{args.duration:g}", "--"]
    env = f"PYTHONPATH={shlex.quote(str(code_root()))}"
    return " ".join([env, "exec", *map(shlex.quote, head + argv)])


Sampler = Callable[[int], Callable[[float], dict[str, Any]]]


def run_tmux(
    args: argparse.Namespace,
    log: Path,
    report: Path | None = None,
    sampler: Sampler | None = None,
) -> dict[str, Any]:
    """verl-top in a detached tmux session; its CPU over the steady window. ``sampler(pid)``
    starts when the window does and returns what ends it: called with the window's CPU % once
    the window is over (verl-top still running), its answer is kept as ``parts``. With
    ``report``, the parts are those the instruments wrote there."""
    if shutil.which("tmux") is None:
        return {"error": "tmux is not installed"}
    session = f"verl-top-cpu-{os.getpid()}"
    cols, rows = TERMINAL
    cmd = tmux_command(args, log, report)
    # Started in the measured checkout: ``python -m`` puts its working folder first on sys.path,
    # ahead of PYTHONPATH, so from another checkout it would import that one's verl_top.
    start = ["tmux", "new-session", "-d", "-s", session, "-c", str(code_root())]
    start += ["-x", str(cols), "-y", str(rows), cmd]
    for attempt in range(5):  # the server of the previous session may still be exiting
        if subprocess.run(start, capture_output=True).returncode == 0:
            break
        time.sleep(0.5 * (attempt + 1))
    else:
        return {"error": "tmux could not start a session"}
    try:
        pane = subprocess.run(
            ["tmux", "display-message", "-p", "-t", session, "#{pane_pid}"],
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(pane.stdout.strip())
        first = read_cpu(pid)
        cwd = os.readlink(f"/proc/{pid}/cwd")
        if Path(cwd).resolve() != code_root():
            return {"error": f"verl-top runs in {cwd}, not in the measured {code_root()}"}
        time.sleep(args.warmup)
        a = read_cpu(pid)
        finish = sampler(pid) if sampler is not None else None
        time.sleep(max(0.0, args.duration - (time.monotonic() - a.wall)))
        b = read_cpu(pid)
        figures: dict[str, Any] = {"pid": pid, "cwd": cwd, **window_figures(pid, first, a, b)}
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
        figures["screen_head"] = "\n".join(screen.splitlines()[:3])
        if report is not None:
            figures["parts"] = wait_for_report(report, 10.0)
        elif finish is not None:
            figures["parts"] = finish(figures["cpu_pct"])
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        return {"error": f"verl-top did not keep running: {exc}"}
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return figures


def wait_for_report(path: Path, timeout: float) -> dict[str, Any]:
    """The instruments' JSON, once written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text(encoding="utf-8"))
        time.sleep(0.2)
    return {"error": f"the instrumented verl-top wrote no report to {path}"}


# ---------------------------------------------------------------------------------------------
# Where it goes: the parts, found by py-spy's samples or timed by instruments


@dataclass(frozen=True)
class Part:
    """A part of the TUI's work: the method that does it (module, class, method)."""

    name: str
    module: str
    owner: str
    method: str

    @property
    def frame(self) -> str:
        """How py-spy names the method's frames: ``Owner.method (package/module.py:LINE)``."""
        return f"{self.owner}.{self.method} ({self.module.replace('.', '/')}.py:"


TABLES = "lines: tables"
LOOP = "event loop (select, wake-ups)"
REST = "rest (timers, messages, GC)"
PARTS = (
    Part("agent tick", "verl_top.agent.main", "Agent", "tick"),
    Part("log follower", "verl_top.agent.follow", "Follower", "poll"),
    Part("decode", "verl_top.protocol", "Decoder", "decode_dict"),
    Part("intake (parse, redact)", "verl_top.sources.pipeline", "Pipeline", "emit"),
    Part("store", "verl_top.store", "Store", "ingest"),
    Part("monitor (status, assessment)", "verl_top.monitor", "Monitor", "assess"),
    Part("engine", "verl_top.diagnosis.engine", "Engine", "evaluate"),
    Part("refresh (header, pane content)", "verl_top.ui.app", "VerlTopApp", "refresh_now"),
    Part("layout", "textual.screen", "Screen", "_refresh_layout"),
    Part(TABLES, "textual.widgets._data_table", "DataTable", "render_lines"),
    Part("lines: other widgets", "textual.widget", "Widget", "render_lines"),
    Part("compositor", "textual._compositor", "Compositor", "render_update"),
    Part("terminal output", "textual._compositor", "LayoutUpdate", "render_segments"),
    Part("terminal output", "textual._compositor", "ChopsUpdate", "render_segments"),
)


def sample_part(frames: list[str]) -> str:
    """The part a py-spy sample (its frames, outermost first) belongs to: the innermost
    part's frame on it; a method's frame directly inside a frame of the same method name
    (``super().render_lines``) belongs to the outer one's part."""
    for i in range(len(frames) - 1, -1, -1):
        for part in PARTS:
            if frames[i].startswith(part.frame):
                outer = frames[i - 1] if i else ""
                inner_of = [p for p in PARTS if outer.startswith(p.frame)]
                if inner_of and inner_of[0].method == part.method:
                    return inner_of[0].name
                return part.name
    leaf = frames[-1] if frames else ""
    return LOOP if "(selectors.py:" in leaf else REST


def spy_parts(raw: Iterable[str], cpu_pct: float) -> dict[str, Any]:
    """Parts from py-spy's ``--format raw`` lines (``frame;frame;... COUNT``): each part's
    share of the samples, times the window's CPU %."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw:
        stack, _, count = line.strip().rpartition(" ")
        if stack and count.isdigit():
            counts[sample_part(stack.split(";"))] += int(count)
    total = sum(counts.values())
    return {
        "method": "py-spy",
        "samples": total,
        "cpu_pct": cpu_pct,
        "parts_pct": {k: cpu_pct * v / total for k, v in counts.items()} if total else {},
    }


def py_spy_sampler(duration: float, out: Path) -> Sampler:
    """A ``Sampler`` for ``run_tmux``: py-spy records the process for ``duration`` seconds in
    the background (``--nonblocking``: it never stops it); once the window is over its raw
    samples are read (``spy_parts``)."""

    def start(pid: int) -> Callable[[float], dict[str, Any]]:
        raw = out / "client_on_node_py_spy.txt"
        raw.unlink(missing_ok=True)
        cmd = ["py-spy", "record", "-p", str(pid), "--duration", f"{max(1.0, duration):.0f}"]
        cmd += ["--rate", str(SAMPLE_HZ), "--nonblocking", "--format", "raw", "-o", str(raw)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def finish(cpu_pct: float) -> dict[str, Any]:
            try:
                _, err = proc.communicate(timeout=duration + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return {"error": "py-spy did not finish"}
            if not raw.exists():
                return {"error": f"py-spy wrote no samples: {err.decode(errors='replace')[-300:]}"}
            lines = raw.read_text(encoding="utf-8").splitlines()
            raw.unlink()
            return spy_parts(lines, cpu_pct)

        return finish

    return start


@dataclass
class _Frame:
    part: str
    start: float  # thread CPU seconds at entry
    inner: float = 0.0  # thread CPU seconds spent in parts nested inside


class Parts:
    """CPU seconds per part while ``on`` (each thread's CPU clock; nested parts exclusive)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.on = False
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, part: str | Callable[[Any], str]) -> bool:
        """Time ``owner.name`` (a method, patched on its class) as ``part`` (or as the part
        that ``part(self_of_the_call)`` names). False when ``owner`` has no such method."""
        original = getattr(owner, name, None)
        if original is None:
            return False
        parts = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            label = part if isinstance(part, str) else part(args[0] if args else None)
            frame = parts.enter(label)
            try:
                return original(*args, **kwargs)
            finally:
                parts.leave(frame)

        setattr(owner, name, timed)
        return True

    def enter(self, part: str) -> _Frame:
        """Start timing ``part`` on this thread."""
        stack = self._local.__dict__.setdefault("stack", [])
        frame = _Frame(part, time.thread_time())
        stack.append(frame)
        return frame

    def leave(self, frame: _Frame) -> None:
        """Stop timing ``frame``: its own time to its part, all of it to the enclosing one's
        inner time."""
        took = time.thread_time() - frame.start
        stack = self._local.stack
        stack.pop()
        if stack:
            stack[-1].inner += took
        if self.on:
            with self._lock:
                self.seconds[frame.part] = self.seconds.get(frame.part, 0.0) + took - frame.inner
                self.calls[frame.part] = self.calls.get(frame.part, 0) + 1


class GcClock:
    """Wall seconds spent in the garbage collector (``gc.callbacks``), per generation."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = [0.0, 0.0, 0.0]
        self._t0: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self._t0[tid] = time.perf_counter()
        elif tid in self._t0 and self.on:
            self.seconds[info["generation"]] += time.perf_counter() - self._t0.pop(tid)


def install(parts: Parts) -> list[str]:
    """Wrap every part's method in the code under test; those that could not be found.
    ``DataTable.render_lines`` is not wrapped: it calls ``Widget.render_lines``, whose wrapper
    gives a DataTable's lines to the tables' part."""
    from textual.widgets import DataTable  # noqa: PLC0415

    def widget_part(widget: Any) -> str:
        return TABLES if isinstance(widget, DataTable) else "lines: other widgets"

    missing = []
    for part in PARTS:
        if part.name == TABLES:
            continue
        try:
            owner = getattr(importlib.import_module(part.module), part.owner)
        except (ImportError, AttributeError):
            owner = None
        label = widget_part if part.owner == "Widget" else part.name
        if owner is None or not parts.wrap(owner, part.method, label):
            missing.append(f"{part.module}.{part.owner}.{part.method}")
    return missing


def replay_gpus(gpus: int) -> None:
    """Make the in-process agent's replay backend fan its trace out to ``gpus`` GPUs (the
    command line has no option for it: the agent's default is 8)."""
    from verl_top.sources import local  # noqa: PLC0415

    original = local.LocalSource.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("replay_gpus", gpus)
        original(self, *args, **kwargs)

    local.LocalSource.__init__ = init  # type: ignore[method-assign]


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """verl-top's CLI with ``argv`` in this process (under tmux): the replay fanned out to
    ``--gpus``, and with ``--instrument FILE`` each part timed over [warmup, warmup +
    duration], written there as JSON."""
    ensure_repo_on_path()
    if args.gpus != REPLAY_GPUS:
        replay_gpus(args.gpus)
    if args.instrument:
        start_instruments(Path(args.instrument), args.warmup, args.duration)
    from verl_top.cli import main as verl_top_main  # noqa: PLC0415

    return verl_top_main(argv)


def start_instruments(report: Path, warmup: float, duration: float) -> None:
    """Wrap the parts now; time them over [warmup, warmup + duration]; write the report."""
    parts = Parts()
    missing = install(parts)
    gc_clock = GcClock()
    gc.callbacks.append(gc_clock)
    started: list[float] = []

    def begin() -> None:
        started[:] = [time.monotonic(), time.process_time()]
        parts.on = gc_clock.on = True

    def end() -> None:
        parts.on = gc_clock.on = False
        wall = time.monotonic() - started[0]
        cpu = time.process_time() - started[1]
        seconds = dict(parts.seconds)
        seconds[REST] = max(0.0, cpu - sum(seconds.values()))
        payload = {
            "method": "instruments",
            "window_s": wall,
            "cpu_pct": 100.0 * cpu / wall,
            "parts_pct": {k: 100.0 * v / wall for k, v in seconds.items()},
            "calls": parts.calls,
            "gc_ms_per_s": [1000.0 * s / wall for s in gc_clock.seconds],
            "not_wrapped": missing,
        }
        tmp = report.with_suffix(".part")
        tmp.write_text(json.dumps(payload, indent=1), encoding="utf-8")
        os.replace(tmp, report)

    for delay, action in ((warmup, begin), (warmup + duration, end)):
        timer = threading.Timer(delay, action)
        timer.daemon = True
        timer.start()


# ---------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, log: Path, out: Path) -> tuple[dict[str, Any], dict]:
    """The TUI's window, and its parts by the chosen sampler: (tui, parts)."""
    sampler = args.sampler
    if sampler == "auto":
        sampler = "py-spy" if shutil.which("py-spy") else "instruments"
    if sampler == "py-spy":
        tui = run_tmux(args, log, sampler=py_spy_sampler(args.duration, out))
        return tui, tui.pop("parts", {})
    tui = run_tmux(args, log)
    if sampler == "none" or "error" in tui:
        return tui, {}
    print("again, with instruments in the verl-top process ...", flush=True)
    report_file = out / "client_on_node_parts.json"
    report_file.unlink(missing_ok=True)
    second = run_tmux(args, log, report_file)
    report_file.unlink(missing_ok=True)
    parts = second.get("parts") or {"error": second.get("error", "no report")}
    if "parts_pct" in parts:
        parts["tmux_cpu_pct"] = second.get("cpu_pct")
    return tui, parts


def rows_of(tui: dict[str, Any], parts: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row for benchmarks/compare.py: the TUI's figures and each part's %."""
    row: dict[str, Any] = {k: v for k, v in tui.items() if isinstance(v, int | float)}
    if "error" in tui:
        row["error"] = tui["error"]
    if "parts_pct" in parts:
        row["parts_cpu_pct"] = parts.get("cpu_pct")
        row.update({f"part:{k}": v for k, v in parts["parts_pct"].items()})
        if "gc_ms_per_s" in parts:
            row["gc_ms_per_s"] = sum(parts["gc_ms_per_s"])
    return [row]


def report(tui: dict[str, Any], parts: dict[str, Any]) -> str:
    """The printed tables."""
    if "error" in tui:
        return f"TUI: {tui['error']}"
    rows = [
        ["CPU % of a core (all threads)", tui["cpu_pct"]],
        ["  event-loop thread %", tui["loop_thread_pct"]],
        ["  other threads % (diagnosis, agent executor, input, writer)", tui["other_threads_pct"]],
        ["start-up and warm-up CPU s (not in the window)", tui["startup_cpu_s"]],
        ["RSS MB", tui["rss_mb"]],
        ["window s", tui["window_s"]],
    ]
    text = f"TUI under tmux (target <= {TARGET_PCT:g} % of a core at 1 s):\n"
    text += table(["", "value"], rows)
    if "parts_pct" in parts:
        prow = [[k, v] for k, v in sorted(parts["parts_pct"].items(), key=lambda kv: -kv[1])]
        if parts["method"] == "py-spy":
            how = f"py-spy, {parts['samples']} samples at {SAMPLE_HZ} Hz, same window"
        else:
            how = "instruments, a second run"
            prow.append(["total (instrumented run, in-process clock)", parts["cpu_pct"]])
            prow.append(["of which GC, ms/s (inside the parts above)", sum(parts["gc_ms_per_s"])])
        text += f"\n\nwhere it goes (% of a core; {how}):\n" + table(["part", "%"], prow)
        if parts.get("not_wrapped"):
            text += "\nnot found in this code: " + ", ".join(parts["not_wrapped"])
    elif parts:
        text += f"\n\nparts: {parts.get('error')}"
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument(
        "--verl-log", default="", metavar="PATH", help="a live job's log (else one is written)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="verl-top --interval")
    p.add_argument("--backend", default="auto", choices=("auto", "pynvml", "nvidia-smi", "replay"))
    p.add_argument("--gpus", type=int, default=REPLAY_GPUS, help="GPUs of the replay backend")
    p.add_argument("--extra", default="", metavar="ARGS", help="more verl-top options ('--x=y')")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the window")
    p.add_argument("--duration", type=float, default=60.0, help="seconds measured")
    p.add_argument("--log-rate", type=float, default=20.0, help="lines/s of the written log")
    p.add_argument(
        "--sampler",
        default="auto",
        choices=("auto", "py-spy", "instruments", "none"),
        help="how the parts are found (auto: py-spy when installed)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    p.add_argument("--json-out", default=None, metavar="FILE", help="JSON file (else OUT/...)")
    # Internal modes: the log writer's child process, and verl-top started from here.
    p.add_argument("--write-log", default=None, help=argparse.SUPPRESS)
    p.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--instrument", default=None, help=argparse.SUPPRESS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    args = parse_args(argv)
    if args.write_log:
        write_log(Path(args.write_log), args.log_rate)
        return 0
    if args.launch:
        return launch(args, args.rest[1:] if args.rest[:1] == ["--"] else args.rest)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.verl_log:
            log = Path(args.verl_log)
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="verl-top-")))
            log = stack.enter_context(live_log(folder / "live.log", args.log_rate))
        print(f"verl-top under tmux: {args.warmup:g} s warm-up, {args.duration:g} s measured")
        tui, parts = measure(args, log, out)
    print(report(tui, parts))
    write_json(
        args.json_out or str(out / "client_on_node.json"),
        {
            "benchmark": "client_on_node",
            "argv": sys.argv[1:] if argv is None else argv,
            "target_pct": TARGET_PCT,
            "verl_top_argv": verl_top_argv(args, log),
            "replay_gpus": args.gpus if args.backend == "replay" else None,
            "tui": tui,
            "parts": parts,
            "rows": rows_of(tui, parts),
        },
    )
    return 1 if "error" in tui else 0


if __name__ == "__main__":
    sys.exit(main())
