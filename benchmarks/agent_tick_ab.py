"""The agent of this checkout against a base version, side by side in ONE run (ratios).

    python benchmarks/agent_tick_ab.py --base-ref main~3              # base from git
    python benchmarks/agent_tick_ab.py --base-dir build/agent-base    # base copied by hand
    python benchmarks/agent_tick_ab.py --backend pynvml --rate 1 --ticks 60 --json-out ab.json

Both agents are loaded as packages from their directories (``verl_top/agent`` of each version;
an old single-file ``node_agent.py`` works too) and measured alternately, so whatever else the
machine does falls on both:

- ``tick``: ``Agent.tick()`` plus the JSON encoding of its lines, in this process, the two
  agents' ticks interleaved one for one at ``--rate``; CPU = ``process_time`` per tick (mean,
  p50, p90). Same backend and options for both (default: the replay backend, 8 GPUs).
- ``process``: each agent started the way the SSH source starts it (its own bootstrap and stdin
  payload) as a subprocess, both at once: CPU per tick from /proc schedstat between the first
  and the last tick, resident size after the ticks (VmRSS) and its peak (VmHWM).

The ratio column is head / base (below 1: the head costs less).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from _common import REPO, median, percentile, table, write_json
from agent_cost import task_cpu_s, vm_kib

TRACE = REPO / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl"


@dataclass
class Version:
    """One agent version loaded as the package ``name``: its agent module and shipping module."""

    label: str
    name: str
    agent: ModuleType
    ship: ModuleType
    tick_ms: list[float] = field(default_factory=list)


def load_version(label: str, name: str, folder: Path) -> Version:
    """Import ``folder`` as the package ``name`` (its own copy, whatever else is imported)."""
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    agent_mod = "main" if (folder / "main.py").exists() else "node_agent"
    agent = importlib.import_module(f"{name}.{agent_mod}")
    ship = importlib.import_module(f"{name}.ship") if (folder / "ship.py").exists() else pkg
    return Version(label, name, agent, ship)


def export_ref(ref: str, into: Path) -> Path:
    """``verl_top/agent`` of git revision ``ref`` unpacked under ``into``."""
    archive = into / "base.tar"
    with archive.open("wb") as fh:
        subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "verl_top/agent"], stdout=fh, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "verl_top" / "agent"


def agent_args(backend: str, gpus: int, rate: float) -> list[str]:
    """The same agent command line for both versions."""
    args = ["--backend", backend, "--interval", f"{1.0 / rate:g}", "--host", "ab"]
    if backend == "replay":
        args += ["--replay-trace", str(TRACE), "--replay-gpus", str(gpus)]
    return args


def measure_ticks(versions: list[Version], args: list[str], ticks: int, rate: float) -> None:
    """Tick the versions' agents in turn, one tick each per period, recording CPU ms per tick."""
    agents = [v.agent.Agent(v.agent.parse_args(args)) for v in versions]
    encoders = [v.agent.encode_line for v in versions]
    try:
        for _ in range(2):  # warm-up: first ticks pay one-off costs in both
            for a in agents:
                a.tick(time.time())
        period = 1.0 / rate / len(agents)
        nxt = time.perf_counter()
        for _ in range(ticks):
            for v, a, enc in zip(versions, agents, encoders, strict=True):
                nxt += period
                time.sleep(max(0.0, nxt - time.perf_counter()))
                c0 = time.process_time()
                ("\n".join(enc(r) for r in a.tick(time.time())) + "\n").encode("ascii")
                v.tick_ms.append((time.process_time() - c0) * 1000)
    finally:
        for a in agents:
            a.close()


def _payload(ship: ModuleType, args: list[str]) -> str:
    fn = ship.agent_payload
    return fn(args) if inspect.signature(fn).parameters else fn()


def _host_lines(path: Path) -> int:
    return path.read_bytes().count(b'"type":"host"')


def measure_processes(
    versions: list[Version], args: list[str], ticks: int, rate: float
) -> list[dict[str, Any]]:
    """Both agents as bootstrapped processes at once: CPU per tick, RSS after, peak RSS."""
    runs = []
    for v in versions:
        fd, out_name = tempfile.mkstemp(prefix=f"agent-ab-{v.label}-", suffix=".ndjson")
        with os.fdopen(fd, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-u", "-c", v.ship.BOOTSTRAP, *args],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        assert proc.stdin is not None
        proc.stdin.write(_payload(v.ship, args).encode("ascii"))
        proc.stdin.flush()
        runs.append((v, proc, Path(out_name)))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_host_lines(p) >= 1 for _, _, p in runs):
            time.sleep(0.02)
        start = [(task_cpu_s(proc.pid), _host_lines(path)) for _, proc, path in runs]
        deadline = time.monotonic() + ticks / rate + 30
        while time.monotonic() < deadline and not all(
            _host_lines(p) >= s[1] + ticks for (_, _, p), s in zip(runs, start, strict=True)
        ):
            time.sleep(0.05)
        rows = []
        for (v, proc, path), (cpu0, n0) in zip(runs, start, strict=True):
            n1 = _host_lines(path)
            cpu = (task_cpu_s(proc.pid) - cpu0) * 1000 / max(1, n1 - n0)
            rss, hwm = vm_kib(proc.pid, "VmRSS"), vm_kib(proc.pid, "VmHWM")
            rows.append(
                {
                    "version": v.label,
                    "ticks": n1 - n0,
                    "cpu_ms_per_tick": cpu,
                    "rss_mb": None if rss is None else rss / 1024,
                    "rss_peak_mb": None if hwm is None else hwm / 1024,
                }
            )
        return rows
    finally:
        for _, proc, path in runs:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            path.unlink(missing_ok=True)


def tick_rows(versions: list[Version]) -> list[list[Any]]:
    """Table rows of the in-process tick: mean, p50, p90 CPU ms and the head/base ratio."""
    base = versions[0]
    base_mean = sum(base.tick_ms) / len(base.tick_ms)
    rows = []
    for v in versions:
        mean = sum(v.tick_ms) / len(v.tick_ms)
        p50, p90 = median(v.tick_ms), percentile(v.tick_ms, 90)
        rows.append([f"tick [{v.label}]", len(v.tick_ms), mean, p50, p90, mean / base_mean])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--base-ref", help="git revision whose verl_top/agent is the base")
    src.add_argument("--base-dir", type=Path, help="a directory holding the base agent")
    p.add_argument(
        "--backend", default="replay", choices=("replay", "pynvml", "nvidia-smi", "none")
    )
    p.add_argument(
        "--job-procs",
        type=int,
        default=0,
        help="start N processes titled like verl's workers (ray::WorkerDict.<method>) for the run",
    )
    p.add_argument(
        "--other-procs", type=int, default=0, help="and N other processes (a busy node's /proc)"
    )
    p.add_argument("--gpus", type=int, default=8, help="replay fan-out")
    p.add_argument("--rate", type=float, default=10.0, help="ticks per second per agent")
    p.add_argument("--ticks", type=int, default=200, help="ticks per agent")
    p.add_argument("--no-process", action="store_true", help="skip the process rows")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    extra = crowd(args.job_procs, args.other_procs)
    try:
        return run(args, argv)
    finally:
        for proc in extra:
            proc.kill()
            proc.wait()


def crowd(jobs: int, others: int) -> list[subprocess.Popen[bytes]]:
    """Sleeping processes: ``jobs`` titled as verl's WorkerDicts (``exec -a``), ``others`` not."""
    out = []
    for i in range(jobs + others):
        title = "ray::WorkerDict.actor_rollout_generate_sequences" if i < jobs else "sleep"
        out.append(subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 3600', title]))
    return out


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Measure and print (``main`` without the extra processes' lifetime)."""
    with tempfile.TemporaryDirectory(prefix="agent-ab-") as tmp:
        base_dir = args.base_dir or export_ref(args.base_ref, Path(tmp))
        versions = [
            load_version("base", "agent_ab_base", base_dir.resolve()),
            load_version("head", "agent_ab_head", REPO / "verl_top" / "agent"),
        ]
        cmd = agent_args(args.backend, args.gpus, args.rate)
        print(f"agent args: {' '.join(cmd)}; {args.ticks} ticks each at {args.rate:g} Hz")
        measure_ticks(versions, cmd, args.ticks, args.rate)
        rows = tick_rows(versions)
        print(table(["row", "ticks", "CPU ms mean", "p50", "p90", "head/base"], rows, digits=4))
        procs: list[dict[str, Any]] = []
        if not args.no_process:
            procs = measure_processes(versions, cmd, args.ticks, args.rate)
            b = procs[0]
            prow = [
                [
                    f"process [{r['version']}]",
                    r["ticks"],
                    r["cpu_ms_per_tick"],
                    r["rss_mb"],
                    r["rss_peak_mb"],
                    r["cpu_ms_per_tick"] / b["cpu_ms_per_tick"] if b["cpu_ms_per_tick"] else None,
                ]
                for r in procs
            ]
            print()
            print(
                table(["row", "ticks", "CPU ms/tick", "RSS MB", "peak MB", "head/base CPU"], prow)
            )
    write_json(
        args.json_out,
        {
            "benchmark": "agent_tick_ab",
            "argv": sys.argv[1:] if argv is None else argv,
            "agent_args": cmd,
            "tick": [
                dict(zip(("row", "ticks", "mean", "p50", "p90", "ratio"), r, strict=True))
                for r in rows
            ],  # fmt: skip
            "process": procs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
