"""Run the inputs without a screen: collect for a while, then give the final Assessment.

Used by ``verl-top diagnose`` and ``verl-top snapshot``: the same Monitor as the app, run to
the end of its data (replays at full speed, logs to their end, live sources for ``duration``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from verl_top.assessment import Assessment
from verl_top.diagnosis.engine import Engine
from verl_top.inputs import Inputs
from verl_top.monitor import Monitor


async def collect(
    inputs: Inputs,
    duration: float | None = None,
    engine: Engine | None = None,
    finale: Callable[[Assessment], Awaitable[None]] | None = None,
) -> Assessment:
    """Collect from the inputs, then return the final assessment of what was seen;
    ``finale`` runs before the sources stop (``Monitor.run``)."""
    return await Monitor(inputs, engine).run(duration, finale)


async def run_sources(inputs: Inputs, duration: float | None) -> None:
    """Run every source until all end (finite inputs) or ``duration`` seconds pass."""
    await Monitor(inputs).run(duration)
