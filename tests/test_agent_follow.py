"""The Follower (tail -F) in-process: start position, partial lines, chunking, late files."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.agent import node_agent as na
from verl_top.protocol import from_dict, to_dict


def poll(f: na.Follower) -> list[dict]:
    return f.poll("h", 1.0)


def test_starts_at_end_unless_from_start(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_text("x\ny\n")
    assert poll(na.Follower("verl", str(p))) == []
    (rec,) = poll(na.Follower("verl", str(p), from_start=True))
    assert rec["lines"] == ["x", "y"] and rec["reset"] is False
    assert to_dict(from_dict(rec)) == rec


def test_missing_file_is_waited_for_and_read_from_start(tmp_path: Path) -> None:
    p = tmp_path / "late.log"
    f = na.Follower("nccl", str(p))
    assert poll(f) == [] and poll(f) == []
    p.write_text("first\n")
    assert poll(f)[0]["lines"] == ["first"]


def test_chunks_of_500_lines_crlf_and_bad_utf8(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    p.write_bytes(b"".join(b"line %d\r\n" % i for i in range(1203)) + b"bad \xff byte\n")
    recs = poll(na.Follower("verl", str(p), from_start=True))
    assert [len(r["lines"]) for r in recs] == [500, 500, 204]
    assert recs[0]["lines"][0] == "line 0" and recs[2]["lines"][-1] == "bad \ufffd byte"


def test_partial_line_flushed_on_rotation(tmp_path: Path) -> None:
    p = tmp_path / "r.log"
    p.write_text("")
    f = na.Follower("verl", str(p))
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
    f = na.Follower("verl", str(p), from_start=True)
    poll(f)
    p.write_text("")
    (rec,) = poll(f)
    assert rec["reset"] is True and rec["lines"] == []


def test_follow_spec_parsing() -> None:
    assert na.parse_follow("verl:/a:b.log") == ("verl", "/a:b.log", False)
    assert na.parse_follow("verl_config+start:/c.yaml") == ("verl_config", "/c.yaml", True)
    with pytest.raises(ValueError):
        na.parse_follow("bogus:/x")
