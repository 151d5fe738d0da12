"""Is a connected node's agent still sending? Stale after 3 silent intervals, replaced when hung.

SSH keepalives only prove that sshd answers. An agent that is stopped (SIGSTOP, a debugger, a
kernel stall on a GPU call) while its sshd and TCP connection stay healthy sends nothing and
would look "up" for ever. :class:`Liveness` tracks when the last record arrived and the agent's
sample interval; :func:`watch` marks the host ``stale`` after ``STALE_INTERVALS`` silent
intervals (it turns ``up`` again with the next record) and, after ``hang_after`` seconds,
calls ``replace`` so the source can kill the agent on the node and start a new one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

STALE_INTERVALS = 3


@dataclass
class Liveness:
    """Arrival bookkeeping of one agent stream (monotonic seconds)."""

    interval: float = 1.0  # the agent's sample interval (from its hello)
    hang_after: float = 10.0  # silent this long: the agent is hung
    up: bool = False  # the agent said hello
    stale: bool = False
    hung_for: float | None = None  # set when the watchdog gave up on the agent
    last_rx: float = field(default_factory=time.monotonic)
    last_wall: float = field(default_factory=time.time)

    def seen(self) -> bool:
        """A record arrived. True when the host was stale (the caller reports it up again)."""
        self.last_rx, self.last_wall = time.monotonic(), time.time()
        was, self.stale = self.stale, False
        return was

    def silent_for(self) -> float:
        """Seconds since the last record."""
        return time.monotonic() - self.last_rx

    def stale_reason(self) -> str:
        """The reason shown while stale: how old the last sample is, in seconds and intervals."""
        age = self.silent_for()
        at = time.strftime("%H:%M:%S", time.localtime(self.last_wall))
        return (
            f"no data for {age:.1f} s (last sample at {at}, {age / self.interval:.0f} intervals "
            f"of {self.interval:g} s); the agent or the node may be stuck"
        )


def hang_limit(interval: float, intervals: float, minimum: float) -> float:
    """Seconds of silence after which an agent counts as hung."""
    return max(intervals * interval, minimum)


async def watch(
    live: Liveness,
    on_stale: Callable[[str], None],
    replace: Callable[[float], Awaitable[None]],
) -> None:
    """Check the stream a few times per interval until the agent is replaced (then return).

    While the host is stale the reason is renewed every second (or interval), so the age it
    shows keeps growing.
    """
    reported = 0.0
    while True:
        await asyncio.sleep(min(max(live.interval / 4, 0.05), 0.5))
        if not live.up:
            continue
        silent = live.silent_for()
        if not live.stale and silent > STALE_INTERVALS * live.interval:
            live.stale = True
            reported = 0.0
        if live.stale and time.monotonic() - reported >= max(1.0, live.interval):
            reported = time.monotonic()
            on_stale(live.stale_reason())
        if silent > live.hang_after:
            live.hung_for = silent
            await replace(silent)
            return
