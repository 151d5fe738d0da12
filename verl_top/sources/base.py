"""The contract every source implements: an async producer of records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from verl_top.model import Record

Emit = Callable[[Record], None]


class Source(Protocol):
    """An async producer of records (local sampler, SSH host, replay, log follower)."""

    name: str

    async def run(self, emit: Emit) -> None:
        """Produce records until finished or cancelled; report failures as records."""
        ...
