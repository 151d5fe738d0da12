"""Deadlines on awaits that never lose a cancellation.

Python 3.11's ``asyncio.wait_for`` can swallow the caller's cancellation: when the awaited
thing completes in the same loop iteration as the caller is cancelled, it returns the result
and the ``CancelledError`` is gone (CPython gh-86296; 3.12 rebuilt ``wait_for`` on
``asyncio.timeout``). A source whose loop awaits that way then never stops, and a command the
user abandoned goes on writing its result. ``asyncio.timeout`` re-raises the cancellation; before
3.11, aiohttp's own dependency async-timeout provides the same context manager. The client uses
these two names instead of ``asyncio.wait_for`` (tests/test_deadline.py checks it stays so).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from typing import TypeVar

if sys.version_info >= (3, 11):
    from asyncio import timeout as time_limit
else:  # aiohttp depends on async-timeout before 3.11
    from async_timeout import timeout as time_limit

__all__ = ["time_limit", "within"]

T = TypeVar("T")


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """``await aw`` for at most ``seconds`` (None: no limit): ``aw`` is cancelled and
    ``asyncio.TimeoutError`` raised when they pass; the caller's own cancellation is always
    raised, even when ``aw`` completes at that moment."""
    async with time_limit(seconds):
        return await aw
