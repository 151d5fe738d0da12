"""Run the inputs without a screen: collect for a while, then diagnose.

Used by ``verl-top diagnose`` and ``verl-top snapshot``. Replays are played as fast as
possible and log files are read to their end; live sources are collected for ``duration``
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib

from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import Verdict
from verl_top.inputs import Inputs

DEFAULT_LIVE_DURATION = 10.0


async def run_sources(inputs: Inputs, duration: float | None) -> None:
    """Run every source until all finish (finite inputs) or ``duration`` seconds pass."""
    speed = inputs.replay.speed if inputs.replay is not None else None
    if inputs.replay is not None:
        inputs.replay.speed = 1e9  # no pacing: the data carries its own times
    tasks = [asyncio.create_task(src.run(inputs.pipeline.emit)) for src in inputs.sources]
    limit = duration if duration is not None else (None if inputs.finite else DEFAULT_LIVE_DURATION)
    try:
        done, pending = await asyncio.wait(tasks, timeout=limit)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                inputs.store.notes.append(f"a source failed: {task.exception()}")
        inputs.pipeline.finish()  # hand over what the log parsers still hold
    finally:
        if inputs.replay is not None and speed is not None:
            inputs.replay.speed = speed  # what a screenshot of the session should show
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def collect(
    inputs: Inputs, duration: float | None = None, engine: Engine | None = None
) -> Verdict:
    """Collect from the inputs, then return the diagnosis of what was seen."""
    await run_sources(inputs, duration)
    return (engine or Engine()).evaluate(inputs.store)
