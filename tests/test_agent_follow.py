"""The Follower (tail -F) in-process: start position, partial lines, chunking, late files."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.agent import follow
from verl_top.protocol import from_dict, to_dict


def poll(f: follow.Follower) -> list[dict]:
    return f.poll("h", 1.0)


def test_starts_at_end_unless_from_start(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_text("x\ny\n")
    assert poll(follow.Follower("verl", str(p))) == []
    (rec,) = poll(follow.Follower("verl", str(p), from_start=True))
    assert rec["lines"] == ["x", "y"] and rec["reset"] is False
    assert to_dict(from_dict(rec)) == rec


def test_missing_file_is_waited_for_and_read_from_start(tmp_path: Path) -> None:
    p = tmp_path / "late.log"
    f = follow.Follower("nccl", str(p))
    assert poll(f) == [] and poll(f) == []
    p.write_text("first\n")
    assert poll(f)[0]["lines"] == ["first"]


def test_chunks_of_500_lines_crlf_and_bad_utf8(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    p.write_bytes(b"".join(b"line %d\r\n" % i for i in range(1203)) + b"bad \xff byte\n")
    recs = poll(follow.Follower("verl", str(p), from_start=True))
    assert [len(r["lines"]) for r in recs] == [500, 500, 204]
    assert recs[0]["lines"][0] == "line 0" and recs[2]["lines"][-1] == "bad \ufffd byte"


def test_partial_line_flushed_on_rotation(tmp_path: Path) -> None:
    p = tmp_path / "r.log"
    p.write_text("")
    f = follow.Follower("verl", str(p))
    with p.open("a") as fh:
        fh.write("complete\nhalf")
    assert poll(f)[0]["lines"] == ["complete"]
    p.rename(tmp_path / "r.log.1")
    assert [r["reset"] for r in poll(f)] == [False]  # old file drained, new not there yet
    p.write_text("new\n")
    (rec,) = poll(f)
    assert rec["reset"] is True and rec["lines"] == ["new"]


def test_truncate_to_empty_sends_reset(tmp_path: Path) -> None:
    p = tmp_path / "t.log"
    p.write_text("a\nb\n")
    f = follow.Follower("verl", str(p), from_start=True)
    poll(f)
    p.write_text("")
    (rec,) = poll(f)
    assert rec["reset"] is True and rec["lines"] == []


def test_follow_spec_parsing() -> None:
    assert follow.parse_follow("verl:/a:b.log") == ("verl", "/a:b.log", False)
    assert follow.parse_follow("verl_config+start:/c.yaml") == ("verl_config", "/c.yaml", True)
    with pytest.raises(ValueError):
        follow.parse_follow("bogus:/x")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_non_regular_paths_are_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    """Opening a FIFO for reading blocks until a writer comes: the follower must not open it."""
    import os

    p = tmp_path / "x.log"
    if kind == "fifo":
        os.mkfifo(p)
        what = "a FIFO"
    elif kind == "dir":
        p.mkdir()
        what = "a directory"
    else:
        p = Path("/dev/null")
        what = "a character device"
    f = follow.Follower("verl", str(p), from_start=True)
    (event,) = poll(f)
    assert event["type"] == "event" and event["kind"] == "error"
    assert event["text"] == f"{p}: not a regular file ({what}); give the log file itself"
    assert poll(f) == []  # said once
    rec = from_dict(event)
    assert rec.text == event["text"]


def test_copytruncate_rotation_loses_no_line(tmp_path: Path) -> None:
    """logrotate copytruncate: copy to x.log.1, truncate x.log. Lines written after our last
    read and before the truncation exist only in the copy; they must still arrive, in order."""
    import shutil

    p = tmp_path / "driver.log"
    p.write_text("".join(f"step:{i} - a:1\n" for i in range(1, 4)))
    f = follow.Follower("verl", str(p), from_start=True)
    got = [line for r in poll(f) for line in r["lines"]]
    with p.open("a") as fh:  # written, but not yet read by the follower ...
        fh.write("step:4 - a:1\nstep:5 - a:1\n")
    shutil.copyfile(p, tmp_path / "driver.log.1")  # ... when logrotate copies
    with p.open("r+") as fh:
        fh.truncate(0)  # and truncates
    with p.open("a") as fh:
        fh.write("step:6 - a:1\n")
    recs = poll(f)
    got += [line for r in recs for line in r["lines"]]
    assert got == [f"step:{i} - a:1" for i in range(1, 7)]
    assert [r["reset"] for r in recs] == [False, True]  # old lines first, then the new file


def test_truncated_and_refilled_past_the_offset_is_seen(tmp_path: Path) -> None:
    """The file was truncated and grew past our offset before the next poll: the size alone
    does not show it; the changed first bytes do."""
    import shutil

    p = tmp_path / "d.log"
    p.write_text("step:1 - a:1\n")
    f = follow.Follower("verl", str(p), from_start=True)
    poll(f)
    with p.open("a") as fh:
        fh.write("step:2 - a:1\n")
    shutil.copyfile(p, tmp_path / "d.log-20260101")
    p.write_text("".join(f"step:{i} - b:2\n" for i in range(3, 9)))  # longer than before
    got = [line for r in poll(f) for line in r["lines"]]
    assert got == ["step:2 - a:1"] + [f"step:{i} - b:2" for i in range(3, 9)]


def test_records_stay_small_whatever_the_line_length(tmp_path: Path) -> None:
    p = tmp_path / "long.log"
    p.write_text("".join(f"step:{i} - " + "x" * 20_000 + "\n" for i in range(100)))
    recs = poll(follow.Follower("verl", str(p), from_start=True))
    assert sum(len(r["lines"]) for r in recs) == 100
    assert all(sum(map(len, r["lines"])) <= follow.MAX_CHARS_PER_RECORD + 20_100 for r in recs)
    assert len(recs) >= 100 * 20_000 // follow.MAX_CHARS_PER_RECORD
