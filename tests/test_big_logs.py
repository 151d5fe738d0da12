"""Big verl logs (issue 30): read fast without reading differently.

The parser skips lines that cannot matter, the follower cuts records a slice at a time, the
engine keeps each step's reading between evaluations, and a big live log is read tail first
with its history filled in afterwards in file order. Each test checks the fast way against the
plain way on real logs, or the order and counts people see."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top.agent import follow as na
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.view import View
from verl_top.model import VerlStep
from verl_top.sources import local
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.verl import parse

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
REAL_LOGS = sorted(
    [*(FIXTURES / "real_logs").glob("*.log"), *(FIXTURES / "verl").glob("*.log")]
    + [*(FIXTURES / "verl").glob("*.txt"), *(FIXTURES / "verl").glob("*.jsonl")]
)
SOURCE = FIXTURES / "real_logs" / "vlm_gui_cursor_custom_rollout_key.log"
sys.path.insert(0, str(REPO / "benchmarks"))
from postmortem_log import STEP_RE, build_log  # noqa: E402


def read_in_chunks(path: Path, seed: int) -> tuple[list, dict]:
    """Every record and the counts of a parser fed the file in random chunks."""
    parser = parse.VerlStreamParser("h", str(path))
    lines = path.read_bytes().decode("utf-8", "replace").split("\n")
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(lines):
        k = rng.randint(1, 300)
        out += parser.feed(lines[i : i + k], float(i), more=i + k < len(lines))
        i += k
    return out + parser.flush(0.0), parser.counts


@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.name)
def test_skipping_quiet_lines_reads_every_real_log_as_reading_each_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = read_in_chunks(path, 7)
    monkeypatch.setattr(parse.VerlStreamParser, "_quiet", lambda self: False)
    assert fast == read_in_chunks(path, 7)


def test_follower_records_are_cut_where_the_line_by_line_rule_cuts_them(tmp_path: Path) -> None:
    rng = random.Random(3)
    lines = ["x" * rng.choice((10, 300, 5_000, 90_000, 300_000)) for _ in range(1_500)]
    p = tmp_path / "mixed.log"
    p.write_text("\n".join(lines) + "\n")
    got = [r["lines"] for r in na.Follower("verl", str(p), from_start=True).poll("h", 1.0)]
    want, chunk, size = [], [], 0  # the rule: a record ends at 500 lines or the char cap
    for line in lines[: sum(map(len, got))]:
        if chunk and (
            len(chunk) >= na.MAX_LINES_PER_RECORD or size + len(line) > na.MAX_CHARS_PER_RECORD
        ):
            want.append(chunk)
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    assert got == [*want, chunk]


def test_evaluations_share_each_steps_reading_and_agree_with_a_fresh_engine(
    tmp_path: Path,
) -> None:
    store = Store()
    pipeline = Pipeline(store)
    text = build_log(SOURCE, 1, tmp_path).read_text(encoding="utf-8", errors="replace")
    text = text.split("\n")
    pipeline.emit(_log(text[: len(text) // 2]))
    engine = Engine()
    first = engine.evaluate(store)
    views = {id(v) for v in View(store, engine.thresholds, engine._steps).steps()}  # noqa: SLF001
    pipeline.emit(_log(text[len(text) // 2 :]))
    again = engine.evaluate(store)
    kept = {id(v) for v in View(store, engine.thresholds, engine._steps).steps()}  # noqa: SLF001
    assert views and views < kept  # the old steps' readings reused, the new ones added
    fresh = Engine().evaluate(store)
    assert (again.bottleneck_rule, again.headline) == (fresh.bottleneck_rule, fresh.headline)
    assert first.bottleneck_rule is not None


def _log(lines: list[str]):  # noqa: ANN202
    from verl_top.model import LogLines

    return LogLines(host="h", t=1.0, path=str(SOURCE), kind="verl", lines=lines)


def test_a_long_log_is_judged_as_its_real_source(tmp_path: Path) -> None:
    """The real 9-step run repeated to 3 MB: every copy has the source's timings, so the verdict
    is the source's (expected.yaml: rollout-bound) and every step and line is read."""
    path = build_log(SOURCE, 3, tmp_path)
    data = path.read_bytes()
    total = data.count(b"\n")
    last = max(int(n) for n in STEP_RE.findall(data))  # copy k renumbered 9k+1 .. 9k+9
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "diagnose", "--verl-log", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    verdict = json.loads(out.stdout)
    (log,) = verdict["inputs"]["logs"]
    assert verdict["bottleneck"]["rule"] == "flow.rollout_bound"
    assert last % 9 == 0 and last > 9
    assert log["steps"] == last and log["lines"] == total


def test_a_big_live_log_is_read_tail_first_then_its_history_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build_log(SOURCE, 2, tmp_path)
    monkeypatch.setattr(local, "BIG_LOG", 256 * 1024)
    monkeypatch.setattr(local, "TAIL_READ", 200 * 1024)
    monkeypatch.setattr(local, "HISTORY_READ", 128 * 1024)
    store = Store()
    pipeline = Pipeline(store)
    seen: list[int] = []
    pipeline.listeners.append(lambda r: seen.append(r.step) if isinstance(r, VerlStep) else None)
    source = LocalFollowSource([("verl", str(path), True)], interval=0.05, count=40)
    asyncio.run(source.run(pipeline.emit))
    numbers = [s.step for s in store.steps]
    last = max(numbers)
    assert seen[0] > last // 2  # the first steps delivered were recent ones
    assert numbers == list(range(1, last + 1))  # all of them, in the order of the file
    (stats,) = store.log_stats.values()
    assert stats["lines"] == path.read_bytes().count(b"\n") and stats["steps"] == last
    assert store.config  # the printed config at the log's start was read as history


def test_quiet_skip_keeps_every_line_a_traceback_or_launch_command_opens_with() -> None:
    """The skip's inline tests cover CrashScanner's and LaunchReader's openers: a crash and a
    launch command after quiet lines are read as when every line is read."""
    from verl_top.verl.crash import CrashScanner
    from verl_top.verl.launch import LaunchReader

    lines = ["banner text nobody parses", "more quiet text"]
    lines += ["python3 -m verl.trainer.main_ppo \\", "  data.train_batch_size=64 \\"]
    lines += ["  actor_rollout_ref.rollout.n=4", "quiet again"]
    lines += [
        CrashScanner.OPENERS[0],
        '  File "/x/verl/trainer/ppo/ray_trainer.py", line 3, in fit',
    ]
    lines += ["RuntimeError: CUDA error: out of memory", f"{CrashScanner.OPENERS[1]} ['a=1']"]
    assert all(any(m in line for line in lines) for m in LaunchReader.OPENERS)

    def read(quiet: bool) -> list:
        parser = parse.VerlStreamParser("h", "log")
        if not quiet:
            parser._quiet = lambda: False  # type: ignore[method-assign]
        return [parser.feed([line], float(i)) for i, line in enumerate(lines)]

    fast, slow = read(True), read(False)
    assert fast == slow
    kinds = [type(r).__name__ for batch in fast for r in batch]
    assert "VerlConfig" in kinds and "LogEvent" in kinds, kinds
