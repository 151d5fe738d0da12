"""Where a remote agent's byte stream becomes records: framing, clock offset, time window, drops.

One :class:`Intake` per connection of a host. It

- frames the stream into lines itself (``read_lines``), so a record of any length up to
  ``protocol.MAX_RECORD_BYTES`` arrives whole: asyncssh's ``readline`` hands back a partial
  line once its buffer (the channel window, 2 MiB) is full, which split big log batches into
  two undecodable halves;
- measures the node's clock offset from the first records (arrival minus the node's ``t``; the
  smallest value seen in the first ``OFFSET_LEARN_S`` seconds, i.e. the one with the least
  transit delay) and, when it is ``OFFSET_APPLY_S`` or more, adds it to every ``t``, so a node
  whose clock is an hour ahead neither hides the other hosts (the store's data clock follows the
  newest ``t``) nor is hidden itself;
- refuses records whose corrected ``t`` is more than ``LIVE_WINDOW_S`` before the arrival time
  or more than ``FUTURE_S`` after it (``time_window``), and re-learns the offset when that
  happens many times in a row (the node's clock was stepped). Nothing measured on a node can
  arrive before it happened: a corrected ``t`` in the future is a lying or stepped clock, and
  accepting it would move the store's data clock (the newest ``t`` of all hosts) ahead, pushing
  the honest hosts' points out of the window (a node 250 s ahead left them 11 of 120 points);
- reports what the decoder refused as ``Dropped`` records, at most once a second.

See docs/protocol.md ("Validation") and docs/security.md ("Caps").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from verl_top.model import ClockOffset, Hello, Record
from verl_top.protocol import MAX_RECORD_BYTES, Decoder, Rejected
from verl_top.sources.base import Emit

READ_CHUNK = 256 * 1024  # characters per read of the agent's stdout
OFFSET_LEARN_S = 30.0  # the offset estimate keeps improving for this long after the hello
OFFSET_APPLY_S = 1.0  # smaller offsets are left alone (transit delay would dominate them)
OFFSET_CHANGE_S = 0.5  # the applied offset moves only when the estimate moved this much
LIVE_WINDOW_S = 600.0  # a corrected t older than this at arrival is refused
# A corrected t this far after its arrival is refused: the offset is learnt from the fastest
# transit, so an honest record arrives after its t; 5 s covers hours of ppm clock drift.
FUTURE_S = 5.0
RELEARN_AFTER = 20  # this many refused records in a row: the node's clock jumped, learn again
DROP_REPORT_S = 1.0


async def read_lines(stream: Any, limit: int = MAX_RECORD_BYTES) -> AsyncIterator[str | None]:
    """Lines of ``stream`` (an asyncssh reader) without their newline; None for each line
    longer than ``limit`` characters, which is skipped without being held in memory."""
    parts: list[str] = []
    held = 0
    skipping = False
    while True:
        chunk = await stream.read(READ_CHUNK)
        if not chunk:
            break
        # A read served from asyncssh's buffer does not suspend: yield once per chunk so a
        # backlog (a big log's catch-up) is handled in ~256 KiB slices, not all in one go.
        await asyncio.sleep(0)
        start = 0
        while True:
            nl = chunk.find("\n", start)
            if nl < 0:
                rest = chunk[start:]
                if not skipping and held + len(rest) > limit:
                    skipping, parts, held = True, [], 0
                if not skipping and rest:
                    parts.append(rest)
                    held += len(rest)
                break
            if skipping or held + nl - start > limit:
                skipping = False
                yield None
            else:
                parts.append(chunk[start:nl])
                yield "".join(parts)
            parts, held = [], 0
            start = nl + 1
    if skipping:
        yield None
    elif parts:
        yield "".join(parts)


class Intake:
    """Decodes one connection's lines into records for ``name`` (see the module docstring)."""

    def __init__(
        self, name: str, decoder: Decoder | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.name = name
        self.decoder = decoder or Decoder()
        self.clock = clock
        self.offset: float | None = None  # measured (arrival - node t), best so far
        self.applied = 0.0  # what is added to every t
        self._learn_until: float | None = None
        self._refused_run = 0
        self._last_report = 0.0

    def accept(self, line: str | None, emit: Emit) -> Record | None:
        """Decode ``line`` (None: an over-long line), correct and check it, emit it; the record
        emitted, or None."""
        received = self.clock()
        if line is None:
            self.decoder.refuse(Rejected("size", f"line over {MAX_RECORD_BYTES} chars"), self.name)
            rec = None
        else:
            rec = self.decoder.decode(line)
        if rec is not None:
            rec.host = self.name  # keyed by the name the user gave, not the node's hostname
            if rec.t:
                self._learn(rec, received, emit)
                rec.t = round(rec.t + self.applied, 3)
                if not -LIVE_WINDOW_S <= rec.t - received <= FUTURE_S:
                    self._refuse_time(rec, received)
                    rec = None
                else:
                    self._refused_run = 0
        if rec is not None:
            emit(rec)
        self.report(emit, received)
        return rec

    def _learn(self, rec: Record, received: float, emit: Emit) -> None:
        if isinstance(rec, Hello) and self._learn_until is None:
            self._learn_until = received + OFFSET_LEARN_S
        if self._learn_until is None or received > self._learn_until:
            return
        measured = received - rec.t
        if self.offset is not None and measured >= self.offset:
            return
        first = self.offset is None
        self.offset = measured
        wanted = measured if abs(measured) >= OFFSET_APPLY_S else 0.0
        if first or abs(wanted - self.applied) >= OFFSET_CHANGE_S:
            self.applied = wanted
            emit(
                ClockOffset(
                    host=self.name, t=received, offset=round(measured, 3), applied=wanted != 0.0
                )
            )

    def _refuse_time(self, rec: Record, received: float) -> None:
        self.decoder.refuse(
            Rejected("time_window", f"t off by {rec.t - received:+.0f} s"), self.name
        )
        self._refused_run += 1
        if self._refused_run >= RELEARN_AFTER:
            # The node's clock was stepped: learn the offset again from the next records.
            self._refused_run = 0
            self.offset = None
            self._learn_until = received + OFFSET_LEARN_S

    def report(self, emit: Emit, now: float | None = None, force: bool = False) -> None:
        """Emit the decoder's new drop counts (at most once per ``DROP_REPORT_S``)."""
        now = self.clock() if now is None else now
        if not self.decoder.pending or (not force and now - self._last_report < DROP_REPORT_S):
            return
        self._last_report = now
        for rec in self.decoder.take_drops(self.name, now):
            emit(rec)
