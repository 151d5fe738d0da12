"""One command on a node, with a fixed argument list: on this machine as a subprocess (no
shell), or over SSH as a separate exec on a connection (``sources.ssh.exec_argv``, every
argument quoted). Used by stacks and signals; their output is foreign and bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

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
    killed after ``timeout``."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return ExecResult(None, "", f"no answer within {timeout:g} s")
    return ExecResult(
        proc.returncode,
        out[:OUTPUT_MAX].decode("utf-8", "replace"),
        err[:OUTPUT_MAX].decode("utf-8", "replace"),
    )
