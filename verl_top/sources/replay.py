"""``--replay FILE``: play a recording with its original timing (scaled by ``speed``).

The player can be paused, stepped one interval at a time while paused, and sped up or slowed
down while it runs; the UI drives it through ``ReplayControl``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from verl_top.model import Record
from verl_top.protocol import Decoder, read_recording
from verl_top.sources.base import Emit

MAX_GAP_S = 5.0  # long silences in a recording are shortened to this (scaled) wait


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


def load(path: str | Path) -> tuple[list[Record], Decoder]:
    """Read a recording, raising a clear error for a missing or empty file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recording not found: {p}")
    decoder = Decoder()
    records = read_recording(p, decoder)
    if not records:
        detail = (
            f" ({decoder.malformed} malformed lines; last: {decoder.last_error})"
            if decoder.malformed
            else ""
        )
        raise ValueError(f"{p} holds no verl-top records{detail}")
    return records, decoder


class ReplaySource:
    """Plays records from a recording file."""

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
            records, self.decoder = load(self.path)
        self.records = records
        self.step_interval = step_interval

    async def run(self, emit: Emit) -> None:
        ctl = self.control
        prev_t: float | None = None
        step_until: float | None = None  # while paused: play freely up to this data time
        for rec in self.records:
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
