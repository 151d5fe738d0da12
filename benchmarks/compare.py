"""The hot paths of BASE and HEAD side by side, in one run, alternating: the regression guard.

    python benchmarks/compare.py main                      # this working tree against main
    python benchmarks/compare.py 5ce6cb2 --only client1024 --rounds 4
    python benchmarks/compare.py 5ce6cb2 --head main       # two commits, neither checked out here
    python benchmarks/compare.py HEAD --quick              # smoke test: tiny sizes, one round

BASE_REV is checked out in a temporary ``git worktree`` (removed at the end); HEAD is this
working tree, uncommitted changes included (``--head REV``: another temporary worktree). Both
are measured by *this* checkout's benchmark scripts and fixtures (the harness), importing
``verl_top`` from their own tree (``$VERL_TOP_BENCH_CODE``, benchmarks/_common.py), so the
workload is the same and only the code differs. Each round runs every benchmark once for each
side, BASE and HEAD back to back, the order flipped every other round (A B, B A, ...), so drift
in the machine's load falls on both. Figures are CPU time where the benchmark has one (robust to
other work on a shared machine), wall time only where wall time is the point (a frame's p95).

Printed per metric: BASE and HEAD (median over rounds), HEAD/BASE (median of the per-round
ratios) and the spread of those ratios (min-max). A benchmark that cannot run on BASE (the code
lacks what it measures) reads "n/a" with the reason; on HEAD it is an error (exit status 1).
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

from _common import CODE_ENV, REPO, machine, median, table, write_json

BENCH = REPO / "benchmarks"
Getter = Callable[[dict[str, Any]], float | None]


@dataclass(frozen=True)
class Metric:
    """One figure read from a benchmark's JSON (lower is better)."""

    label: str
    get: Getter


@dataclass(frozen=True)
class Case:
    """One benchmark run: its script, arguments (full and ``--quick``) and figures."""

    name: str
    script: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    metrics: tuple[Metric, ...]
    timeout_s: float = 1800.0


def _row(key: str, index: int = 0) -> Getter:
    """``data["rows"][index][key]``."""

    def get(data: dict[str, Any]) -> float | None:
        rows = data.get("rows") or []
        return rows[index].get(key) if len(rows) > index else None

    return get


def _where(field_name: str, value: str, key: str) -> Getter:
    """``key`` of the first row whose ``field_name`` equals ``value``."""

    def get(data: dict[str, Any]) -> float | None:
        for row in data.get("rows") or []:
            if row.get(field_name) == value:
                return row.get(key)
        return None

    return get


def _client(gpus: int, quick_gpus: int, duration: int) -> Case:
    return Case(
        name=f"client{gpus}",
        script="client_scale.py",
        args=("--gpus", str(gpus), "--duration", str(duration), "--warmup", "5"),
        quick=("--gpus", str(quick_gpus), "--duration", "2", "--warmup", "0.5", "--no-prefill"),
        metrics=(
            Metric("CPU % of a core", _row("cpu_pct")),
            Metric("ingest % core", _row("ingest_cpu_pct")),  # decode + pipeline + store
            Metric("pane 1 CPU p50 ms", _row("pane_cpu_ms_p50")),
            Metric("pane 1 CPU p95 ms", _row("pane_cpu_ms_p95")),
            Metric("pane 1 p95 ms (wall)", _row("pane_ms_p95")),
            Metric("engine CPU p50 ms", _row("engine_cpu_ms_p50")),
            Metric("loop lag max ms (wall)", _row("loop_lag_ms_max")),
            Metric("full GC ms/s", _row("gc_full_ms_per_s")),
        ),
    )


VERL_QWEN = "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
CASES: tuple[Case, ...] = (
    _client(1024, 16, 60),
    _client(4096, 32, 30),
    Case(
        name="engine",
        script="engine_cost.py",
        args=("--gpus", "1024", "--runs", "7", "--lag"),
        quick=("--gpus", "16", "--runs", "1", "--lag"),
        metrics=(
            Metric("one evaluation: CPU ms p50", _row("cpu_ms_p50")),
            Metric("  wall ms min", _row("wall_ms_min")),
            Metric("  longest GIL hold ms (wall)", _row("gil_wait_ms_max")),
        ),
    ),
    Case(
        name="pane",
        script="ui_refresh.py",
        args=("128", "--rounds", "30"),
        quick=("2", "--rounds", "2"),
        metrics=(
            Metric("refresh, all new: CPU p50 ms", _row("all_new_cpu_ms_p50")),
            Metric("all new: CPU p95 ms", _row("all_new_cpu_ms_p95")),
            Metric("its paint: CPU p50 ms", _row("all_new_paint_cpu_ms_p50")),
            Metric("nothing new: CPU p50 ms", _row("unchanged_cpu_ms_p50")),
        ),
    ),
    Case(
        name="parsers",
        script="parsers.py",
        args=("--duration", "1"),
        quick=("--duration", "0.01"),
        metrics=(
            Metric("verl log (Qwen) CPU µs/pass", _where("input", VERL_QWEN, "us_per_pass")),
            Metric(
                "NCCL_DEBUG log CPU µs/pass",
                _where("input", "all_reduce_perf_debug_g1.txt", "us_per_pass"),
            ),
        ),
    ),
    Case(
        name="postmortem",
        script="postmortem_log.py",
        args=("--size-mb", "100", "--rounds", "1"),
        quick=("--size-mb", "1", "--rounds", "1"),
        metrics=(
            Metric("diagnose a 100 MB log: CPU s", _row("verl_top_cpu_s")),
            Metric("x a bare loop over its lines", _row("ratio")),
            Metric("peak RSS MB", _row("rss_mb")),
        ),
    ),
    Case(
        name="node",
        script="client_on_node.py",
        args=("--backend", "replay", "--warmup", "15", "--duration", "45"),
        quick=("--backend", "replay", "--warmup", "3", "--duration", "3"),
        metrics=(
            Metric("TUI under tmux: CPU % of a core", _row("cpu_pct")),
            Metric("event-loop thread %", _row("loop_thread_pct")),
            Metric("parts' run: CPU % (py-spy: this run)", _row("parts_cpu_pct")),
            Metric("  tables' lines %", _row("part:lines: tables")),
            Metric("  other widgets' lines %", _row("part:lines: other widgets")),
            Metric("  refresh (content) %", _row("part:refresh (header, pane content)")),
            Metric("  layout %", _row("part:layout")),
            Metric("  GC ms/s (instruments only)", _row("gc_ms_per_s")),
        ),
        timeout_s=600.0,
    ),
    Case(
        name="agent",
        script="agent_cost.py",
        args=("--backend", "replay", "--gpus", "8", "--rates", "10", "--samples", "300"),
        quick=("--backend", "replay", "--gpus", "8", "--rates", "10", "--samples", "4"),
        metrics=(
            Metric("tick CPU ms (8 GPUs)", _where("tool", "verl-top agent tick", "cpu_ms_mean")),
            Metric("process CPU ms/tick", _where("tool", "verl-top agent process", "cpu_ms_mean")),
        ),
    ),
)
AGENT_ONLY = ("--no-floor", "--only-agent")


@dataclass
class Side:
    """One tree under test: BASE or HEAD."""

    label: str
    rev: str
    root: Path
    temporary: bool = False


@dataclass
class Outcome:
    """Every round of one case on one side: the figures, or why it could not run."""

    values: list[dict[str, float | None]] = field(default_factory=list)
    error: str = ""


def git(*args: str) -> str:
    """Run git in this checkout; its stdout."""
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def checkout(rev: str, label: str) -> Side:
    """``rev`` in a temporary worktree (detached; removed by ``cleanup``)."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = Path(tempfile.mkdtemp(prefix=f"verl-top-{label.lower()}-"))
    git("worktree", "add", "--detach", "--force", str(path), sha)
    return Side(label, f"{rev} ({sha[:9]})", path, temporary=True)


def this_tree() -> Side:
    """HEAD as this working tree (uncommitted changes included)."""
    sha = git("rev-parse", "HEAD")[:9]
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return Side("HEAD", f"working tree at {sha}" + (" + changes" if dirty else ""), REPO)


def cleanup(side: Side) -> None:
    """Remove a temporary worktree."""
    if side.temporary:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(side.root)],
            capture_output=True,
        )
        shutil.rmtree(side.root, ignore_errors=True)


def run_case(case: Case, side: Side, quick: bool) -> tuple[dict[str, float | None], str]:
    """One run of ``case`` against ``side``'s code: (figures, error)."""
    fd, out = tempfile.mkstemp(suffix=".json", prefix=f"compare-{case.name}-")
    os.close(fd)
    args = list(case.quick if quick else case.args)
    if case.script == "agent_cost.py":
        args += AGENT_ONLY
    env = dict(os.environ)
    env[CODE_ENV] = str(side.root)
    env["PYTHONPATH"] = str(side.root)
    cmd = [sys.executable, str(BENCH / case.script), *args, "--json-out", out]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=case.timeout_s
        )
        text = Path(out).read_text(encoding="utf-8")
        data = json.loads(text) if text.strip() else {}
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {case.timeout_s:.0f} s"
    except ValueError as exc:
        return {}, f"unreadable JSON: {exc}"
    finally:
        Path(out).unlink(missing_ok=True)
    if proc.returncode != 0 or not data:
        return {}, _last_line(proc.stderr or proc.stdout) or f"exit status {proc.returncode}"
    values = {m.label: _number(m.get(data)) for m in case.metrics}
    errors = [str(r["error"]).strip() for r in data.get("rows") or [] if r.get("error")]
    if errors:
        return {}, _last_line(errors[0])
    return values, ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:200] if lines else ""


def measure(
    cases: list[Case], base: Side, head: Side, rounds: int, quick: bool
) -> dict[str, dict[str, Outcome]]:
    """Every case, ``rounds`` times, BASE and HEAD back to back (order flipped each round)."""
    results = {c.name: {"BASE": Outcome(), "HEAD": Outcome()} for c in cases}
    for r in range(rounds):
        for case in cases:
            order = (base, head) if r % 2 == 0 else (head, base)
            for side in order:
                outcome = results[case.name][side.label]
                if outcome.error:
                    continue  # it failed once (e.g. BASE lacks what it measures): no retries
                t0 = time.perf_counter()
                values, error = run_case(case, side, quick)
                took = time.perf_counter() - t0
                status = f"error: {error}" if error else f"{took:.0f} s"
                print(f"round {r + 1}/{rounds} {case.name:<10} {side.label}: {status}", flush=True)
                if error:
                    outcome.error = error
                else:
                    outcome.values.append(values)
    return results


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def summarise(case: Case, pair: dict[str, Outcome]) -> list[dict[str, Any]]:
    """Per metric: medians, the per-round ratio's median and spread."""
    base, head = pair["BASE"], pair["HEAD"]
    rows = []
    for m in case.metrics:
        b = [v[m.label] for v in base.values]
        h = [v[m.label] for v in head.values]
        ratios = [
            hv / bv
            for bv, hv in zip(b, h, strict=False)
            if bv is not None and hv is not None and bv > 0
        ]
        rows.append(
            {
                "benchmark": case.name,
                "metric": m.label,
                "base": median([x for x in b if x is not None]),
                "head": median([x for x in h if x is not None]),
                "ratio": median(ratios),
                "ratio_min": min(ratios, default=None),
                "ratio_max": max(ratios, default=None),
                "rounds": len(ratios),
                "base_error": base.error,
                "head_error": head.error,
                "base_values": b,
                "head_values": h,
            }
        )
    return rows


HEADERS = ["benchmark", "metric", "BASE", "HEAD", "HEAD/BASE", "spread (min-max)", "rounds"]


def render(rows: list[dict[str, Any]]) -> str:
    """The printed table, then why any side could not run."""
    cells = []
    for r in rows:
        base = "n/a" if r["base_error"] else _fmt(r["base"])
        head = "error" if r["head_error"] else _fmt(r["head"])
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        spread = "—" if r["ratio_min"] is None else f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        cells.append([r["benchmark"], r["metric"], base, head, ratio, spread, r["rounds"]])
    text = table(HEADERS, cells)
    said: set[tuple[str, str]] = set()
    for r in rows:
        for side in ("base", "head"):
            error = r[f"{side}_error"]
            if error and (r["benchmark"], side) not in said:
                said.add((r["benchmark"], side))
                text += f"\n{r['benchmark']} on {side.upper()}: could not run: {error}"
    return text


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("base", metavar="BASE_REV", help="the commit to compare against")
    p.add_argument("--head", default=None, metavar="REV", help="a commit instead of this tree")
    p.add_argument("--rounds", type=int, default=3, help="BASE/HEAD pairs per benchmark")
    p.add_argument(
        "--only",
        default="",
        help="comma list of benchmarks: " + ", ".join(c.name for c in CASES),
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke test)")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)

    wanted = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(wanted) - {c.name for c in CASES})
    if unknown:
        p.error(
            f"unknown benchmark {', '.join(unknown)}; known: {', '.join(c.name for c in CASES)}"
        )
    cases = [c for c in CASES if not wanted or c.name in wanted]
    rounds = 1 if args.quick else max(1, args.rounds)
    base = checkout(args.base, "BASE")
    head = this_tree() if args.head is None else checkout(args.head, "HEAD")
    try:
        print(f"BASE: {base.rev}\nHEAD: {head.rev}")
        load0 = os.getloadavg()
        results = measure(cases, base, head, rounds, args.quick)
        load1 = os.getloadavg()
    finally:
        cleanup(base)
        cleanup(head)
    rows = [row for c in cases for row in summarise(c, results[c.name])]
    print()
    print(render(rows))
    print(
        f"\nratios < 1: HEAD is cheaper. {rounds} round(s), alternating; load average "
        f"{load0[0]:.1f} before, {load1[0]:.1f} after ({machine()['cores']} cores)."
    )
    write_json(
        args.json_out,
        {
            "benchmark": "compare",
            "argv": sys.argv[1:] if argv is None else argv,
            "base": base.rev,
            "head": head.rev,
            "worktrees": [str(side.root) for side in (base, head) if side.temporary],
            "rounds": rounds,
            "quick": args.quick,
            "rows": rows,
        },
    )
    return 1 if any(r["head_error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
