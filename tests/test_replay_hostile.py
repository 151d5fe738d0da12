"""Recordings someone else wrote: a bad byte, a gzip bomb, over-long lines (issue 31).

One invalid UTF-8 byte aborted the whole replay (and ``diagnose`` still exited 0); a 1 MB gzip
that inflates to 1 GiB of newlines kept ``diagnose --replay`` busy for more than 240 s.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.sources import replay
from verl_top.sources.replay import _lines, load

SESSION = Path(__file__).parent / "fixtures" / "h200" / "real_verl050_grpo_session.ndjson.gz"
REPO = Path(__file__).resolve().parents[1]


def _session_lines() -> list[bytes]:
    return [line for line in gzip.open(SESSION, "rb").read().split(b"\n") if line.strip()]


def _corrupt(tmp_path: Path, name: str) -> tuple[Path, int]:
    """The real session with one byte of its middle line made invalid UTF-8."""
    lines = _session_lines()
    mid = len(lines) // 2
    lines[mid] = lines[mid][:40] + b"\xff" + lines[mid][40:]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path, len(lines)


@pytest.mark.parametrize("name", ["bad.ndjson", "bad.ndjson.gz"])
def test_one_bad_byte_costs_one_line_and_is_counted(tmp_path: Path, name: str) -> None:
    path, n = _corrupt(tmp_path, name)
    records, decoder = load(path)
    good, _ = load(SESSION)
    assert len(good) == n and len(records) == n - 1  # every other record still plays
    assert decoder.drops == {("", "encoding"): 1}


def test_diagnose_says_what_the_recording_lost(tmp_path: Path) -> None:
    path, _ = _corrupt(tmp_path, "bad.ndjson")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "verl_top", "diagnose", "--replay", str(path)]
    text = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert "Refused input (skipped, counted): encoding x1" in text.stdout
    doc = json.loads(
        subprocess.run(run + ["--json"], env=env, capture_output=True, timeout=120).stdout
    )
    assert doc["inputs"]["dropped"] == {"": {"encoding": 1}}


def test_a_gzip_bomb_of_newlines_is_read_in_bounded_time(tmp_path: Path) -> None:
    """256 MiB of newlines (256 KB on disk) between two real records: both play, and the blank
    lines are skipped by the regex scan, not one Python iteration each (which took minutes)."""
    first, *_, last = _session_lines()
    member = gzip.compress(b"\n" * (1 << 20), compresslevel=9)
    path = tmp_path / "bomb.ndjson.gz"
    with open(path, "wb") as fh:
        fh.write(gzip.compress(first + b"\n"))
        for _ in range(256):  # gzip readers read concatenated members as one stream
            fh.write(member)
        fh.write(gzip.compress(last + b"\n"))
    assert path.stat().st_size < 400_000
    t0 = time.monotonic()
    records, decoder = load(path)
    took = time.monotonic() - t0
    assert len(records) == 2 and decoder.malformed == 0
    assert took < 30.0, f"{took:.1f} s for 256 MiB of newlines"


def test_an_over_long_line_is_skipped_and_the_rest_plays(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(replay, "MAX_RECORD_BYTES", 1000)
    lines = _session_lines()[:20]
    short = [line for line in lines if len(line) <= 1000]
    data = b"\n".join([*short[:3], b"x" * 5000, *short[3:]]) + b"\n"
    path = tmp_path / "long.ndjson"
    path.write_bytes(data)
    monkeypatch.setattr(replay, "READ_BLOCK", 700)  # the long line spans several blocks
    records, decoder = load(path)
    assert len(records) == len(short) and decoder.drops == {("", "size"): 1}


def _reference(data: bytes, limit: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for line in data.split(b"\n"):
        if len(line) > limit:
            out.append(None)
        elif line.strip():
            out.append(line.lstrip())
    return out


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.binary(max_size=400).map(lambda b: b.replace(b"\x00", b"\n")),
    st.integers(1, 50),
    st.integers(5, 60),
)
def test_lines_agree_with_a_plain_split_for_any_blocks(data: bytes, block: int, limit: int) -> None:
    """Whatever the block size, the scanner yields the non-blank lines (leading white space
    dropped, the decoder strips it anyway) and None for each line over the limit."""
    got = list(_lines(io.BytesIO(data), limit))
    original = replay.READ_BLOCK
    replay.READ_BLOCK = block
    try:
        small = list(_lines(io.BytesIO(data), limit))
    finally:
        replay.READ_BLOCK = original
    want = _reference(data, limit)
    assert got == want and small == want
