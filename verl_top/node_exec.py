"""One command on a node, with a fixed argument list: on this machine as a subprocess (no
shell), or over SSH as a separate exec on a connection (``sources.ssh.exec_argv``, every
argument quoted). Used by stacks and signals; their output is foreign and bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_top.deadline import within

OUTPUT_MAX = 4 * 1024 * 1024  # bytes of stdout (and of stderr) kept from one command


@dataclass(frozen=True)
class ExecResult:
    """What one command returned: exit status (None: killed or timed out) and its output."""

    status: int | None
    stdout: str
    stderr: str


# run(argv, timeout, stdin="") -> result
Runner = Callable[..., Awaitable[ExecResult]]


async def local_run(argv: Sequence[str], timeout: float, stdin: str = "") -> ExecResult:
    """``argv`` on this machine (no shell) with ``stdin`` written to it, output bounded,
    killed after ``timeout`` or when the caller is cancelled (nothing is left running)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await within(proc.communicate(stdin.encode()), timeout)
    except asyncio.TimeoutError:
        return ExecResult(None, "", f"no answer within {timeout:g} s")
    finally:
        if proc.returncode is None:  # timed out, or the caller gave up: stop it
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
    return ExecResult(
        proc.returncode,
        out[:OUTPUT_MAX].decode("utf-8", "replace"),
        err[:OUTPUT_MAX].decode("utf-8", "replace"),
    )


def _runner_of(src: Any) -> tuple[str | None, Runner | None]:
    """(the host a source reaches, how to run a command there), or (None, None)."""
    if callable(getattr(src, "exec", None)):  # an SSH source: its agent's connection
        return getattr(src, "name", None), src.exec
    if type(src).__name__ == "LocalSource":  # the in-process agent: this machine
        return getattr(src, "host", None), local_run
    return None, None


def runner_for(sources: Sequence[Any], host: str) -> Runner | None:
    """How to run a command on ``host`` in this session: its SSH source's connection (while
    its agent runs), or this machine for the in-process agent; None when no live source
    reaches it (a replay, Prometheus, Ray alone)."""
    for src in sources:
        name, run = _runner_of(src)
        if run is not None and name == host:
            return run
    return None


def reaches_processes(sources: Sequence[Any]) -> bool:
    """True when some source of the session can run a command on its host."""
    return any(_runner_of(src)[1] is not None for src in sources)
