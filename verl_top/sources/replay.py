"""``--replay FILE``: play a recording with its original timing (scaled by ``speed``).

The player can be paused, stepped one interval at a time while paused, and sped up or slowed
down while it runs; the UI drives it through ``ReplayControl``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from verl_top.model import Record
from verl_top.protocol import MAX_RECORD_BYTES, Decoder, Rejected, open_recording_bytes
from verl_top.sources.base import Emit

MAX_GAP_S = 5.0  # long silences in a recording are shortened to this (scaled) wait
YIELD_EVERY = 256  # records played between yields to the event loop when nothing waits


@dataclass
class ReplayControl:
    """Shared pause/step/speed state between the replay source and the UI."""

    speed: float = 1.0
    paused: bool = False
    finished: bool = False
    position: float = 0.0  # data time of the last record played
    _resume: asyncio.Event = field(default_factory=asyncio.Event)
    _steps: int = 0

    def __post_init__(self) -> None:
        if not self.paused:
            self._resume.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._resume.set()

    def toggle(self) -> bool:
        """Pause if playing, play if paused; returns the new paused state."""
        if self.paused:
            self.resume()
        else:
            self.pause()
        return self.paused

    def step(self) -> None:
        """While paused, play the records of one more interval."""
        self._steps += 1
        self._resume.set()

    async def wait_turn(self) -> None:
        """Block while paused (unless a step was requested)."""
        await self._resume.wait()


def _check(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"recording not found: {path}")
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file (a recording is an .ndjson[.gz] file)")


READ_BLOCK = 1 << 20  # bytes read from the (decompressed) recording at a time
# A line worth decoding starts at a byte that is not white space and runs to its newline.
# finditer skips blank lines in C: a gzip bomb of 1 GiB of newlines (1 MB on disk) kept the
# old line-by-line loop busy for minutes; now it costs the decompression and one scan.
_CONTENT = re.compile(rb"\S[^\n]*")


def _lines(fh: IO[bytes], limit: int = MAX_RECORD_BYTES) -> Iterator[bytes | None]:
    """The non-blank lines of a binary stream, without their newline; None for each line over
    ``limit`` bytes, skipped without being held."""
    carry = b""  # the start of a line the last block did not finish
    skipping = False  # inside a line already known to be too long
    while block := fh.read(READ_BLOCK):
        start = 0
        if carry or skipping:
            nl = block.find(b"\n")
            if nl < 0:
                if not skipping and len(carry) + len(block) > limit:
                    skipping, carry = True, b""
                if not skipping:
                    carry += block
                continue
            if skipping or len(carry) + nl > limit:
                yield None
            elif (line := carry + block[:nl]).strip():
                yield line
            carry, skipping, start = b"", False, nl + 1
        for m in _CONTENT.finditer(block, start):
            if m.end() == len(block) and not block.endswith(b"\n"):
                carry = m.group()  # goes on in the next block
                if len(carry) > limit:
                    skipping, carry = True, b""
            elif m.end() - m.start() > limit:
                yield None
            else:
                yield m.group()
    if skipping:
        yield None
    elif carry:
        yield carry


def _stream(path: Path, decoder: Decoder) -> Iterator[Record]:
    """The records of ``path``, one line at a time (a recording is never held whole).

    A line longer than ``MAX_RECORD_BYTES`` is skipped and counted as ``size``; a line that is
    not UTF-8 (one bad byte) is skipped and counted as ``encoding``: the rest plays.
    """
    with open_recording_bytes(path) as fh:
        for raw in _lines(fh, MAX_RECORD_BYTES):
            if raw is None:
                decoder.refuse(Rejected("size", f"line over {MAX_RECORD_BYTES} bytes"))
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                decoder.refuse(Rejected("encoding", f"not UTF-8 at byte {exc.start} of a line"))
                continue
            record = decoder.decode(line)
            if record is not None:
                yield record


def first_record(path: str | Path) -> Record:
    """The first valid record of a recording; a clear error for a missing or empty file.

    Reads no further than that record (the whole file only when it holds none).
    """
    p = Path(path)
    _check(p)
    decoder = Decoder()
    try:
        for record in _stream(p, decoder):
            return record
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{p}: cannot read the recording ({exc})") from None
    detail = (
        f" ({decoder.malformed} malformed lines; last: {decoder.last_error})"
        if decoder.malformed
        else ""
    )
    raise ValueError(f"{p} holds no verl-top records{detail}")


def load(path: str | Path) -> tuple[list[Record], Decoder]:
    """Read a whole recording (tests and tools; the replay source streams instead)."""
    p = Path(path)
    first_record(p)
    decoder = Decoder()
    return list(_stream(p, decoder)), decoder


class ReplaySource:
    """Plays records from a recording file, read as it plays (memory stays flat)."""

    def __init__(
        self,
        path: str | Path,
        control: ReplayControl | None = None,
        records: list[Record] | None = None,
        step_interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.name = f"replay:{self.path.name}"
        self.control = control or ReplayControl()
        self.decoder = Decoder()
        if records is None:
            first_record(self.path)  # fail now, with the reason, not inside the UI
        self.records = records  # given records (tests), else None: streamed from the file
        self.step_interval = step_interval

    def _records(self) -> Iterator[Record]:
        if self.records is not None:
            return iter(self.records)
        return _stream(self.path, self.decoder)

    async def run(self, emit: Emit) -> None:
        ctl = self.control
        prev_t: float | None = None
        step_until: float | None = None  # while paused: play freely up to this data time
        played = 0
        for rec in self._records():
            if ctl.paused:
                if step_until is None or (rec.t and rec.t >= step_until):
                    step_until = await self._next_step(rec)
            elif rec.t and prev_t is not None and rec.t > prev_t:
                step_until = None
                await asyncio.sleep(min(rec.t - prev_t, MAX_GAP_S) / max(ctl.speed, 1e-3))
            if rec.t:
                prev_t = rec.t
                ctl.position = rec.t
            emit(rec)
            for dropped in self.decoder.take_drops():
                emit(dropped)
            played += 1
            if played % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a fast replay still lets the UI draw
        for dropped in self.decoder.take_drops():
            emit(dropped)
        ctl.finished = True

    async def _next_step(self, rec: Record) -> float | None:
        """Wait for a step (or resume); returns the data time the step plays up to."""
        ctl = self.control
        while ctl.paused and ctl._steps == 0:
            ctl._resume.clear()
            await ctl._resume.wait()
        if not ctl.paused:
            return None
        ctl._steps -= 1
        return (rec.t or ctl.position) + self.step_interval
