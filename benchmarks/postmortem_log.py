"""Judging a finished verl log against a bare Python loop over its lines (same file, same run).

    python benchmarks/postmortem_log.py                        # a ~100 MB log, 3 rounds
    python benchmarks/postmortem_log.py --size-mb 1024 --rounds 1
    python benchmarks/postmortem_log.py --attach --size-mb 1024  # + the first live verdict

The log is built from a real one (tests/fixtures/real_logs/vlm_gui_cursor_custom_rollout_key.log:
a VLM GRPO run whose workers print every sample, 9 steps): its head (up to the first worker
line: banner and the printed config) once, then its body (the per-sample printouts and the 9
step lines) repeated until the size is reached, each copy's ``step:N`` renumbered to follow
the previous one, so it reads as one long run with the real run's timings. It is written once
to ``--dir`` (not kept in the repository) and reused while its size and source match.

Each round runs, as child processes, the bare loop (``for line in open(path, errors="replace")``)
and ``verl-top diagnose --verl-log PATH --json`` (the post-mortem: the file was last written
long ago), back to back, the order flipped every other round; CPU = the child's user + system
time (``os.wait4``), RSS = its peak (``ru_maxrss``: includes the ~10 MB of this small parent
it was forked from). Also timed once: ``import verl_top.cli`` alone (verl-top's start-up).

``--attach``: the live path. The same file, followed as a live job's log (``--follow``): the
time from start until the monitor has its first verdict on the run's recent steps, and until
the whole history was read, in one process, with its RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, code_root, median, table, write_json

SOURCE = REPO / "tests" / "fixtures" / "real_logs" / "vlm_gui_cursor_custom_rollout_key.log"
BODY_MARK = b"CursorLoopWorker"  # the first worker line: the run's body starts there
STEP_RE = re.compile(rb"step:(\d+) - ")
BARE_LOOP = (
    "import sys\n"
    "n = 0\n"
    "with open(sys.argv[1], encoding='utf-8', errors='replace') as fh:\n"
    "    for line in fh:\n"
    "        n += 1\n"
    "print(n)\n"
)


def split_log(source: Path) -> tuple[list[bytes], list[bytes], int]:
    """A real log's head (up to its first worker line), its body, and the steps the body has."""
    lines = source.read_bytes().split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    cut = next(i for i, line in enumerate(lines) if BODY_MARK in line)
    head, body = lines[:cut], lines[cut:]
    steps = max(int(m.group(1)) for line in body for m in [STEP_RE.search(line)] if m)
    return head, body, steps


def renumbered(body: list[bytes], shift: int) -> list[bytes]:
    """The body with every ``step:N`` line's number moved on by ``shift``."""

    def renumber(m: re.Match[bytes]) -> bytes:
        return b"step:%d - " % (int(m.group(1)) + shift)

    return [STEP_RE.sub(renumber, x) if b"step:" in x else x for x in body]


def build_log(source: Path, size_mb: float, folder: Path) -> Path:
    """The repeated log of about ``size_mb`` MB (made once; reused while it matches)."""
    tag = hashlib.sha256(source.read_bytes()).hexdigest()[:10]
    path = folder / f"verl-top-postmortem-{tag}-{size_mb:g}MB.log"
    target = int(size_mb * 2**20)
    if path.exists() and path.stat().st_size >= target:
        return path
    head, body, steps = split_log(source)
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as out:
        out.write(b"\n".join(head) + b"\n")
        copy = 0
        while out.tell() < target:
            out.write(b"\n".join(renumbered(body, steps * copy)) + b"\n")
            copy += 1
    os.replace(tmp, path)
    old = time.time() - 86400  # finished a day ago: diagnose judges it post-mortem
    os.utime(path, (old, old))
    return path


def timed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``argv``: its wall time, its own CPU (user + sys) and peak RSS (os.wait4), exit
    status and stdout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        # in the measured checkout: ``python -m``/``-c`` put the working folder first on
        # sys.path, ahead of PYTHONPATH (from this one, BASE would run this checkout's code)
        cwd=code_root(),
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024.0,
        "rc": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
    }


def child_env() -> dict[str, str]:
    """The environment of the children: the code under test first on the path, its modules'
    bytecode cached as an installed package's is (pip compiles it), outside the checkout
    (``PYTHONPYCACHEPREFIX``, one folder per code root): with ``PYTHONDONTWRITEBYTECODE`` set,
    every start would compile verl-top from source (0.1-0.25 s of a ~2 s post-mortem)."""
    env = dict(os.environ)
    root = code_root()
    env["PYTHONPATH"] = str(root)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "verl-top-bench-pyc" / tag)
    return env


def warm_bytecode(path: Path, env: dict[str, str]) -> None:
    """Fill the children's bytecode cache before timing: one untimed ``diagnose`` of the
    log's first 256 KiB (the same modules as the timed runs import)."""
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(tmp) / "head.log"
        with open(path, "rb") as fh:
            head.write_bytes(fh.read(256 * 1024))
        cmd = [sys.executable, "-m", "verl_top", "diagnose", "--verl-log", str(head), "--json"]
        subprocess.run(cmd, env=env, capture_output=True, check=False)


def verdict_of(stdout: str) -> dict[str, Any]:
    """The lead rule and step count of ``diagnose --json``'s output."""
    try:
        data = json.loads(stdout)
    except ValueError:
        return {"lead": None, "steps": None}
    lead = (data.get("bottleneck") or {}).get("rule") if isinstance(data, dict) else None
    logs = ((data.get("inputs") or {}).get("logs") or []) if isinstance(data, dict) else []
    steps = sum(int(log.get("steps") or 0) for log in logs if isinstance(log, dict))
    return {"lead": lead, "steps": steps}


def post_mortem(path: Path, rounds: int) -> dict[str, Any]:
    """Bare loop and verl-top diagnose, alternating, ``rounds`` times."""
    env = child_env()
    bare_cmd = [sys.executable, "-c", BARE_LOOP, str(path)]
    top_cmd = [sys.executable, "-m", "verl_top", "diagnose", "--verl-log", str(path), "--json"]
    warm_bytecode(path, env)
    bare: list[dict[str, Any]] = []
    top: list[dict[str, Any]] = []
    for r in range(rounds):
        order = ((bare_cmd, bare), (top_cmd, top))
        for cmd, sink in order if r % 2 == 0 else order[::-1]:
            res = timed(cmd, env)
            if res["rc"] not in (0, 3):  # 3: diagnose read the log and found nothing to judge
                raise SystemExit(f"{' '.join(cmd[:4])} failed with exit status {res['rc']}")
            sink.append(res)
    start = timed([sys.executable, "-c", "import verl_top.cli"], env)
    ratios = [t["cpu_s"] / b["cpu_s"] for b, t in zip(bare, top, strict=True) if b["cpu_s"] > 0]
    lines = int(bare[0]["stdout"].strip() or 0)
    return {
        "lines": lines,
        "bare_cpu_s": median([b["cpu_s"] for b in bare]),
        "verl_top_cpu_s": median([t["cpu_s"] for t in top]),
        "verl_top_wall_s": median([t["wall_s"] for t in top]),
        "import_cpu_s": start["cpu_s"],
        "ratio": median(ratios),
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "rss_mb": max(t["rss_mb"] for t in top),
        "bare_rss_mb": max(b["rss_mb"] for b in bare),
        **verdict_of(top[-1]["stdout"]),
    }


async def first_verdict(path: Path, timeout: float) -> dict[str, Any]:
    """Follow ``path`` as a live job's log; seconds to the first verdict and to all steps."""
    from verl_top.cli import diagnose_parser  # noqa: PLC0415
    from verl_top.inputs import build_inputs  # noqa: PLC0415
    from verl_top.monitor import Monitor  # noqa: PLC0415

    args = diagnose_parser().parse_args(["--verl-log", str(path), "--follow", "--backend", "none"])
    inputs = build_inputs(args)
    monitor = Monitor(inputs, period_s=0.0)
    total = _count_lines(path)
    last_step = _last_step(path)
    t0 = time.perf_counter()
    seen: int | None = None  # the store version holding the log's last step
    tasks = [asyncio.create_task(s.run(inputs.pipeline.emit)) for s in inputs.sources]
    first: float | None = None
    first_steps = 0
    done: float | None = None
    stats: dict[str, Any] = {}
    try:
        while time.perf_counter() - t0 < timeout:
            await asyncio.sleep(0.1)
            assessment = monitor.assess()
            store = inputs.store
            if seen is None and any(s.step == last_step for s in list(store.steps)[-50:]):
                seen = store.version
            # The first verdict on the recent steps: evaluated once the last step was in.
            evaluated = monitor._eval_version  # noqa: SLF001 - which store version it judged
            if first is None and seen is not None and evaluated >= seen and assessment.lead:
                first, first_steps = time.perf_counter() - t0, len(store.steps)
            stats = next(iter(inputs.store.log_stats.values()), {})
            if first is not None and int(stats.get("lines") or 0) >= total:
                done = time.perf_counter() - t0
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    lead = monitor.assessment.lead
    return {
        "first_verdict_s": first,
        "steps_at_first_verdict": first_steps,
        "history_read_s": done,
        "steps": len(inputs.store.steps),
        "lines_read": int(stats.get("lines") or 0),
        "lines_total": total,
        "lead": lead.rule if lead is not None else None,
        "rss_mb": _rss_mb(),
    }


def _last_step(path: Path) -> int:
    """The number of the last ``step:N`` line of ``path`` (read from its last MiB)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - (1 << 20)))
        found = STEP_RE.findall(fh.read())
    return int(found[-1]) if found else -1


def _count_lines(path: Path) -> int:
    """Lines of ``path`` (newlines), counted in 64 MiB blocks."""
    n = 0
    with open(path, "rb") as fh:
        while block := fh.read(64 << 20):
            n += block.count(b"\n")
    return n


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


HEADERS = [
    "log MB",
    "lines",
    "bare loop CPU s",
    "verl-top CPU s",
    "ratio (min-max)",
    "of it start-up s",
    "verl-top wall s",
    "RSS MB",
    "lead",
    "steps",
]


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--size-mb", type=float, default=100.0, help="size of the built log")
    p.add_argument("--rounds", type=int, default=3, help="bare/verl-top pairs")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the log is built")
    p.add_argument("--source", default=str(SOURCE), help="the real log to repeat")
    p.add_argument("--attach", action="store_true", help="also time the first live verdict")
    p.add_argument("--attach-timeout", type=float, default=120.0, metavar="S")
    p.add_argument("--attach-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)

    path = build_log(Path(args.source), args.size_mb, Path(args.dir))
    size_mb = path.stat().st_size / 2**20
    if args.attach_only:  # child: the live path in a fresh process (its own RSS)
        sys.path.insert(0, str(code_root()))
        res = asyncio.run(first_verdict(path, args.attach_timeout))
        Path(args.json_out).write_text(json.dumps(res))
        return 0
    res = post_mortem(path, max(1, args.rounds))
    spread = "—" if res["ratio_min"] is None else f"{res['ratio_min']:.1f}-{res['ratio_max']:.1f}"
    ratio = "—" if res["ratio"] is None else f"{res['ratio']:.1f}x ({spread})"
    row = [
        round(size_mb),
        res["lines"],
        res["bare_cpu_s"],
        res["verl_top_cpu_s"],
        ratio,
        res["import_cpu_s"],
        res["verl_top_wall_s"],
        round(res["rss_mb"]),
        res["lead"],
        res["steps"],
    ]
    print(table(HEADERS, [row]))
    print("target: verl-top within 3x the bare loop, RSS < 300 MB")
    attach: dict[str, Any] = {}
    if args.attach:
        attach = attach_child(args, path)
        print(
            f"\nlive attach to the {size_mb:.0f} MB log: first verdict after "
            f"{_s(attach.get('first_verdict_s'))} ({attach.get('steps_at_first_verdict')} steps, "
            f"lead {attach.get('lead')}); whole history after {_s(attach.get('history_read_s'))} "
            f"({attach.get('steps')} steps kept); RSS {_s(attach.get('rss_mb'), ' MB')}"
        )
        print("target: the first verdict within 5 s")
    write_json(
        args.json_out,
        {
            "benchmark": "postmortem_log",
            "argv": sys.argv[1:] if argv is None else argv,
            "log": str(path),
            "log_mb": size_mb,
            "rows": [{**res, "log_mb": size_mb}],
            "attach": attach,
        },
    )
    return 0


def attach_child(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """The live attach, in a fresh interpreter."""
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    os.utime(path)  # written just now: a live job's log
    try:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--attach-only",
            "--size-mb",
            str(args.size_mb),
            "--dir",
            args.dir,
            "--source",
            args.source,
            "--attach-timeout",
            str(args.attach_timeout),
            "--json-out",
            out,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
        text = Path(out).read_text()
        if proc.returncode != 0 or not text:
            return {"error": proc.stderr[-1000:]}
        return json.loads(text)
    finally:
        Path(out).unlink(missing_ok=True)
        old = time.time() - 86400
        os.utime(path, (old, old))


def _s(value: Any, unit: str = " s") -> str:
    return "—" if value is None else f"{value:.1f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
