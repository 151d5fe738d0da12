"""The TUI's own CPU on the node it watches: verl-top under tmux, a steady window after warm-up.

    python benchmarks/client_on_node.py --verl-log /path/to/driver.log          # a real job
    python benchmarks/client_on_node.py --backend replay --duration 60          # no GPU
    python benchmarks/client_on_node.py --extra='--ray http://127.0.0.1:8265' --verl-log L

Target (product brief, issue 30 item 5): the TUI watching one real job on its node, at a 1 s
interval, uses at most 2 % of a core. A lifetime mean from ``ps`` counts start-up (imports,
NVML init, reading the log's history); this measures a steady window instead, twice:

1. **The TUI as people run it.** ``verl-top --interval 1 --follow --verl-log LOG [...]`` in a
   real terminal (a detached tmux session, 200x50). After ``--warmup`` seconds its CPU is read
   from ``/proc/PID/stat`` (user + system of every thread, dead ones included) and per thread
   from ``/proc/PID/task/*/schedstat`` (ns), at the start and end of ``--duration`` seconds: %
   of one core, the event loop's thread against the others (the diagnosis worker, the agent's
   executor, Textual's terminal writer).
2. **Where it goes** (unless ``--no-parts``): the same command line under tmux again, started
   through this script (``--instrument``), which wraps the parts in the verl-top process and
   times each with its thread's CPU clock over the same window. Parts nest (the engine runs
   inside a refresh when it runs on the loop, a widget's lines inside the compositor's update):
   each part counts its own time, what runs inside another part is that part's. The parts:
   agent tick (the in-process agent's sampling), decode (its wire dicts to records), intake
   (the pipeline: parse the log lines, redact, route), store (``Store.ingest``), monitor
   (status, assessment; the engine apart), engine (``Engine.evaluate``, in whatever thread
   runs it), refresh (header and visible pane: widgets' content), layout (Textual's reflow),
   tables' and other widgets' lines, compositor (the update's chops), terminal output (the
   update as escape codes), and the rest (the event loop, timers, messages, GC, Textual's
   writer thread). Garbage collection is also reported on its own (it happens inside parts).

Without ``--verl-log`` a live log is written while it runs, by a child process (not counted):
the real VLM GRPO log of tests/fixtures/real_logs (its body repeated, steps renumbered),
appended at ``--log-rate`` lines/s. Results: ``--json-out FILE`` (else
``OUT/client_on_node.json``, ``--out`` or $OUT or the current folder) and a table. On a machine
without a GPU use ``--backend replay`` (the H200 trace fanned out to 8 GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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
    """Write ``source``'s head (banner, config) to ``path`` at once, then append its body at
    ``rate`` lines per second (in bursts every 0.1 s) until killed."""
    head, _, _ = split_log(source)
    path.write_bytes(b"\n".join(head) + b"\n")
    lines = log_lines(source)
    per_burst = max(1, round(rate / 10))
    with open(path, "ab", buffering=0) as fh:
        t = time.monotonic()
        while True:
            t += 0.1
            fh.write(b"".join(next(lines) for _ in range(per_burst)))
            time.sleep(max(0.0, t - time.monotonic()))


@contextlib.contextmanager
def live_log(path: Path, rate: float) -> Iterator[Path]:
    """A child process writing ``path`` while the block runs."""
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


# ---------------------------------------------------------------------------------------------
# 1. The TUI under tmux


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
    argv = ["--interval", f"{args.interval:g}", "--follow", "--verl-log", str(log)]
    if args.backend != "auto":
        argv += ["--backend", args.backend]
    if args.backend == "replay":
        argv += ["--replay-trace", str(TRACE)]
    return argv + shlex.split(args.extra)


def tmux_command(args: argparse.Namespace, log: Path, report: Path | None) -> str:
    """The shell command tmux runs: verl-top, or verl-top inside this script's instruments."""
    argv = verl_top_argv(args, log)
    if report is None:
        head = [sys.executable, "-m", "verl_top"]
    else:
        head = [sys.executable, __file__, "--instrument", str(report)]
        head += ["--warmup", f"{args.warmup:g}", "--duration", f"{args.duration:g}", "--"]
    env = f"PYTHONPATH={shlex.quote(str(code_root()))}"
    return " ".join([env, "exec", *map(shlex.quote, head + argv)])


def run_tmux(args: argparse.Namespace, log: Path, report: Path | None = None) -> dict[str, Any]:
    """verl-top in a detached tmux session; its CPU over the steady window (and, with
    ``report``, the parts its instruments wrote there)."""
    if shutil.which("tmux") is None:
        return {"error": "tmux is not installed"}
    session = f"verl-top-cpu-{os.getpid()}"
    cols, rows = TERMINAL
    cmd = tmux_command(args, log, report)
    start = ["tmux", "new-session", "-d", "-s", session, "-x", str(cols), "-y", str(rows), cmd]
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
        start = read_cpu(pid)
        time.sleep(args.warmup)
        a = read_cpu(pid)
        time.sleep(args.duration)
        b = read_cpu(pid)
        figures = {"pid": pid, **window_figures(pid, start, a, b)}
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
        figures["screen_head"] = "\n".join(screen.splitlines()[:3])
        if report is not None:
            figures["parts"] = wait_for_report(report, 10.0)
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
# 2. Where it goes: instruments inside the verl-top process


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


def _widget_part(widget: Any) -> str:
    from textual.widgets import DataTable  # noqa: PLC0415

    return "lines: tables" if isinstance(widget, DataTable) else "lines: other widgets"


def install(parts: Parts) -> list[str]:
    """Wrap every part in the code under test; the parts that could not be found."""
    import importlib  # noqa: PLC0415

    targets: list[tuple[str, str, str, str | Callable[[Any], str]]] = [
        ("verl_top.agent.main", "Agent", "tick", "agent tick"),
        ("verl_top.protocol", "Decoder", "decode_dict", "decode"),
        ("verl_top.sources.pipeline", "Pipeline", "emit", "intake (parse, redact)"),
        ("verl_top.store", "Store", "ingest", "store"),
        ("verl_top.monitor", "Monitor", "assess", "monitor (status, assessment)"),
        ("verl_top.diagnosis.engine", "Engine", "evaluate", "engine"),
        ("verl_top.ui.app", "VerlTopApp", "refresh_now", "refresh (header, pane content)"),
        ("textual.screen", "Screen", "_refresh_layout", "layout"),
        ("textual.widget", "Widget", "render_lines", _widget_part),
        ("textual._compositor", "Compositor", "render_update", "compositor"),
        ("textual._compositor", "LayoutUpdate", "render_segments", "terminal output"),
        ("textual._compositor", "ChopsUpdate", "render_segments", "terminal output"),
    ]
    missing = []
    for module, cls, method, part in targets:
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            owner = None
        if owner is None or not parts.wrap(owner, method, part):
            missing.append(f"{module}.{cls}.{method}")
    return missing


def instrumented(report: Path, warmup: float, duration: float, argv: list[str]) -> int:
    """Run verl-top's CLI with ``argv`` in this process, parts wrapped; write what each part
    cost over [warmup, warmup + duration] to ``report`` (JSON)."""
    ensure_repo_on_path()
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
        seconds["rest (event loop, timers, messages, writer)"] = max(
            0.0, cpu - sum(seconds.values())
        )
        payload = {
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
    from verl_top.cli import main as verl_top_main  # noqa: PLC0415

    return verl_top_main(argv)


# ---------------------------------------------------------------------------------------------


def rows_of(tui: dict[str, Any], parts: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row for benchmarks/compare.py: the TUI's figures and each part's %."""
    row: dict[str, Any] = {k: v for k, v in tui.items() if isinstance(v, int | float)}
    if "error" in tui:
        row["error"] = tui["error"]
    if parts:
        row["parts_cpu_pct"] = parts.get("cpu_pct")
        row.update({f"part:{k}": v for k, v in parts.get("parts_pct", {}).items()})
        row["gc_ms_per_s"] = sum(parts.get("gc_ms_per_s", []))
    return [row]


def report(tui: dict[str, Any], parts: dict[str, Any]) -> str:
    """The printed tables."""
    if "error" in tui:
        return f"TUI: {tui['error']}"
    rows = [
        ["CPU % of a core (all threads)", tui["cpu_pct"]],
        ["  event-loop thread %", tui["loop_thread_pct"]],
        ["  other threads % (diagnosis worker, agent executor, writer)", tui["other_threads_pct"]],
        ["start-up and warm-up CPU s (not in the window)", tui["startup_cpu_s"]],
        ["RSS MB", tui["rss_mb"]],
        ["window s", tui["window_s"]],
    ]
    text = f"TUI under tmux (target <= {TARGET_PCT:g} % of a core at 1 s):\n"
    text += table(["", "value"], rows)
    if "parts_pct" in parts:
        prow = [[k, v] for k, v in sorted(parts["parts_pct"].items(), key=lambda kv: -kv[1])]
        prow.append(["total (instrumented run, in-process clock)", parts["cpu_pct"]])
        prow.append(["of which GC, ms/s (inside the parts above)", sum(parts["gc_ms_per_s"])])
        text += "\n\nwhere it goes (% of a core, a second run with instruments):\n"
        text += table(["part", "%"], prow)
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
    p.add_argument("--extra", default="", metavar="ARGS", help="more verl-top options ('--x=y')")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the window")
    p.add_argument("--duration", type=float, default=60.0, help="seconds measured")
    p.add_argument("--log-rate", type=float, default=20.0, help="lines/s of the written log")
    p.add_argument("--no-parts", action="store_true", help="only the plain TUI under tmux")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    p.add_argument("--json-out", default=None, metavar="FILE", help="JSON file (else OUT/...)")
    # Internal modes: the log writer's child process, and verl-top with instruments.
    p.add_argument("--write-log", default=None, help=argparse.SUPPRESS)
    p.add_argument("--instrument", default=None, help=argparse.SUPPRESS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    args = parse_args(argv)
    if args.write_log:
        write_log(Path(args.write_log), args.log_rate)
        return 0
    if args.instrument:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        return instrumented(Path(args.instrument), args.warmup, args.duration, rest)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.verl_log:
            log = Path(args.verl_log)
        else:
            log = stack.enter_context(live_log(out / "client_on_node_live.log", args.log_rate))
        print(f"verl-top under tmux: {args.warmup:g} s warm-up, {args.duration:g} s measured")
        tui = run_tmux(args, log)
        parts: dict[str, Any] = {}
        if not args.no_parts and "error" not in tui:
            print("again, with instruments in the verl-top process ...", flush=True)
            report_file = out / "client_on_node_parts.json"
            report_file.unlink(missing_ok=True)
            second = run_tmux(args, log, report_file)
            parts = second.get("parts") or {"error": second.get("error", "no report")}
            if "parts_pct" in parts:
                parts["tmux_cpu_pct"] = second.get("cpu_pct")
    print(report(tui, parts))
    write_json(
        args.json_out or str(out / "client_on_node.json"),
        {
            "benchmark": "client_on_node",
            "argv": sys.argv[1:] if argv is None else argv,
            "target_pct": TARGET_PCT,
            "verl_top_argv": verl_top_argv(args, log),
            "tui": tui,
            "parts": parts,
            "rows": rows_of(tui, parts),
        },
    )
    return 1 if "error" in tui else 0


if __name__ == "__main__":
    sys.exit(main())
