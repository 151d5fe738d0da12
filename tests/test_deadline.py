"""Deadlines that never lose a cancellation (verl_top/deadline.py).

Python 3.11's ``asyncio.wait_for`` returns the result when the awaited thing completes in the
loop iteration that cancels its caller (CPython gh-86296): a cancelled source then went on
forever. The client awaits with a deadline through ``deadline.within`` / ``time_limit`` only.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from verl_top.deadline import within
from verl_top.node_exec import local_run

ROOT = Path(__file__).resolve().parents[1]


async def _cancel_as_it_completes(wait: Callable[[Awaitable[int]], Awaitable[int]]) -> bool:
    """Cancel a caller in the same loop iteration as the future it awaits completes; True when
    the caller saw the cancellation, False when it went on as if never cancelled."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def caller() -> None:
        await wait(fut)
        await asyncio.sleep(0)  # a source would go on to its next read here

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the caller now waits on fut
    fut.set_result(1)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def test_within_raises_a_cancellation_that_arrives_as_the_awaited_thing_completes() -> None:
    assert asyncio.run(_cancel_as_it_completes(lambda aw: within(aw, 10.0)))
    lost = not asyncio.run(_cancel_as_it_completes(lambda aw: asyncio.wait_for(aw, 10.0)))
    # The race is real where the client runs (3.10, 3.11); 3.12 rebuilt wait_for on timeout.
    assert lost == (sys.version_info < (3, 12))


def test_within_times_out_and_cancels_what_it_waited_for() -> None:
    cancelled = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def go() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await within(slow(), 0.05)

    t0 = time.monotonic()
    asyncio.run(go())
    assert cancelled == [True] and time.monotonic() - t0 < 5


def test_a_cancelled_local_command_leaves_no_process_behind() -> None:
    """stacks/signals run commands as UI workers that a new key press cancels: the command is
    killed and the cancellation reaches the worker."""
    me = psutil.Process(os.getpid())

    async def go() -> int:
        task = asyncio.create_task(local_run(["sleep", "30"], 60))
        for _ in range(200):
            kids = [c for c in me.children() if c.name() == "sleep"]
            if kids:
                break
            await asyncio.sleep(0.02)
        (child,) = kids
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return child.pid

    pid = asyncio.run(go())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_local_command_past_its_deadline_is_killed_and_said() -> None:
    t0 = time.monotonic()
    res = asyncio.run(local_run(["sleep", "30"], 0.2))
    assert res.status is None and res.stderr == "no answer within 0.2 s"
    assert time.monotonic() - t0 < 5


def _wait_for_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "wait_for"
        if isinstance(node.value, ast.Name) and node.value.id == "asyncio"
    ]


def test_the_client_awaits_with_deadlines_only_through_deadline_py() -> None:
    """No ``asyncio.wait_for`` in the client (the agent under verl_top/agent/ uses no asyncio:
    it runs on the node's Python 3.8 standard library and ends with its stdin)."""
    found: dict[str, Any] = {}
    for path in sorted((ROOT / "verl_top").rglob("*.py")):
        if "agent" in path.relative_to(ROOT / "verl_top").parts:
            continue
        lines = _wait_for_calls(path)
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}
