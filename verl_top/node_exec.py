"""One command on a node, with a fixed argument list: on this machine as a subprocess (no
shell), or over SSH as a separate exec on a connection (``sources.ssh.exec_argv``, every
argument quoted). Used by stacks and signals; their output is foreign and bounded."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_top.deadline import within

if TYPE_CHECKING:
    from verl_top.sources.base import Source

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


def _runner_of(src: Source) -> tuple[str | None, Runner | None]:
    """(the host a source reaches, how to run a command there), or (None, None).

    Only source classes the session imported are looked for: a class never imported has no
    instance (a session without SSH does not pay for importing it, ~0.2 s, on key t)."""
    if "verl_top.sources.ssh" in sys.modules:
        from verl_top.sources.ssh import SshSource  # noqa: PLC0415 - loaded already

        if isinstance(src, SshSource):  # an SSH source: its agent's connection
            return src.name, src.exec
    if "verl_top.sources.local" in sys.modules:
        from verl_top.sources.local import LocalSource  # noqa: PLC0415 - loaded already

        if isinstance(src, LocalSource):  # the in-process agent: this machine
            return src.host, local_run
    return None, None


def runner_for(sources: Sequence[Source], host: str) -> Runner | None:
    """How to run a command on ``host`` in this session: its SSH source's connection (while
    its agent runs), or this machine for the in-process agent; None when no live source
    reaches it (a replay, Prometheus, Ray alone). The first such source, in the session's
    order."""
    for src in sources:
        name, run = _runner_of(src)
        if run is not None and name == host:
            return run
    return None


def reaches_processes(sources: Sequence[Source]) -> bool:
    """True when some source of the session can run a command on its host."""
    return any(_runner_of(src)[1] is not None for src in sources)
