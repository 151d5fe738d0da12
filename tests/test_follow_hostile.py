"""Followed logs someone else can write to: links to secrets, runaway lines (issue 31).

A followed log replaced by a symlink to a secret file was read from its start, and its content
landed in snapshot.json and the recording. In a finished log, one line of over 8 MiB without a
newline ended the read: every later step was lost.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_top.agent import follow as na
from verl_top.model import LogEvent, VerlStep
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.verl.parse import VerlStreamParser

REAL = (
    Path(__file__).parent
    / "fixtures"
    / "verl"
    / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
)


def poll(f: na.Follower) -> list[dict]:
    return f.poll("h", 1.0)


def test_a_log_replaced_by_a_link_to_a_secret_is_refused_and_said(tmp_path: Path) -> None:
    job, home = tmp_path / "job", tmp_path / "home"
    job.mkdir()
    home.mkdir()
    secret = home / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n")
    log = job / "driver.log"
    log.write_text("step:1 - timing_s/gen:1.0\n")
    f = na.Follower("verl", str(log), from_start=True)
    assert poll(f)[0]["lines"] == ["step:1 - timing_s/gen:1.0"]
    log.unlink()
    log.symlink_to(secret)  # another user swaps the log for a link to a secret
    records = poll(f) + poll(f)
    lines = [line for r in records if r["type"] == "log" for line in r.get("lines", [])]
    assert not any("PRIVATE KEY" in line or "AAAA" in line for line in lines)
    events = [r for r in records if r["type"] == "event"]
    assert len(events) == 1  # said once, not every poll
    assert "became a link to" in events[0]["text"] and str(secret) in events[0]["text"]
    log.unlink()
    log.write_text("step:2 - timing_s/gen:2.0\n")  # a regular log again: followed again
    assert any("step:2 - timing_s/gen:2.0" in r.get("lines", []) for r in poll(f))


def test_links_the_user_gave_or_inside_the_job_directory_are_followed(tmp_path: Path) -> None:
    runs, job = tmp_path / "runs", tmp_path / "job"
    runs.mkdir()
    job.mkdir()
    (runs / "driver.log").write_text("given\n")
    given = job / "latest.log"
    given.symlink_to(runs / "driver.log")  # the user named a link: its target is the job's
    assert poll(na.Follower("verl", str(given), from_start=True))[0]["lines"] == ["given"]
    (job / "run-2.log").write_text("rotated\n")
    current = job / "current.log"
    f = na.Follower("verl", str(current))
    current.symlink_to(job / "run-2.log")  # a link to a sibling: rotation by link, allowed
    assert poll(f)[0]["lines"] == ["rotated"]


def _with_runaway_line(path: Path, size: int) -> int:
    """The real log with one ``size``-byte line inserted in its middle; its step count."""
    lines = REAL.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    mid = len(lines) // 2
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(lines[:mid])
        fh.write("x" * size + "\n")
        fh.writelines(lines[mid:])
    parser = VerlStreamParser("h", str(REAL))
    out = parser.feed([line.rstrip("\n") for line in lines], 0.0) + parser.flush(0.0)
    return sum(isinstance(r, VerlStep) for r in out)


async def test_a_9_mib_line_in_a_finished_log_is_skipped_and_every_step_still_read(
    tmp_path: Path,
) -> None:
    log = tmp_path / "driver.log"
    expected = _with_runaway_line(log, 9 * 1024 * 1024)
    store = Store()
    events: list[LogEvent] = []
    pipeline = Pipeline(store)
    pipeline.listeners.append(lambda r: events.append(r) if isinstance(r, LogEvent) else None)
    await LocalFollowSource([("verl", str(log), True)], until_eof=True).run(pipeline.emit)
    assert len(store.steps) == expected == 435  # before: the read stopped at the long line
    said = [e.text for e in events if "without a newline skipped" in e.text]
    assert said and said[-1].endswith("1 line(s) over 1048576 bytes without a newline skipped")


def test_the_remote_follower_skips_a_runaway_line_and_reads_on(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    _with_runaway_line(log, 9 * 1024 * 1024)
    f = na.Follower("verl", str(log), from_start=True)  # the node's 8 MiB per poll
    lines: list[str] = []
    for _ in range(10):
        lines += [line for r in poll(f) if r["type"] == "log" for line in r["lines"]]
        if f.caught_up:
            break
    assert f.caught_up and f.skipped_lines == 1
    assert max(len(line) for line in lines) < 100_000  # no piece of the runaway line
    assert sum(line.startswith("(main_task") or "step:" in line for line in lines) > 100
    assert os.path.getsize(log) > 9 * 1024 * 1024
