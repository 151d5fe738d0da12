"""``verl-top doctor`` with no host: this machine, as ``verl-top`` with no host monitors it.

The steps: this Python (the app runs the agent in-process, so it is the interpreter that
matters), the agent started in-process (sources/local.py, the same code the SSH source ships),
NVML (or nvidia-smi) and its GPUs, and a first sample. The report has the same form as a host's
(sources/doctor.py), so ``format_reports`` prints both.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time

from verl_top.model import GpuSample, Hello, HostSample, Record
from verl_top.sources.doctor import HostReport, Step
from verl_top.sources.local import LocalSource
from verl_top.untrusted import clean_text

LOCAL_STEPS = ("python", "agent", "nvml", "sample")
MIN_CLIENT_PYTHON = (3, 10)


class _Stop(Exception):
    """A step failed; the later ones are not tried."""


async def doctor_local(
    backend: str = "auto", wait_s: float = 15.0, replay_trace: str | None = None
) -> HostReport:
    """Check this machine step by step (never raises for what it finds)."""
    report = HostReport(
        "this machine",
        target=f"{socket.gethostname()} (in-process, no SSH)",
        steps=[Step(n) for n in LOCAL_STEPS],
    )
    with contextlib.suppress(_Stop):
        _python(report)
        await _agent(report, backend, wait_s, replay_trace)
    return report


def _python(report: HostReport) -> None:
    version = ".".join(str(v) for v in sys.version_info[:3])
    if sys.version_info[:2] < MIN_CLIENT_PYTHON:
        report.failed(
            "python", f"Python {version} ({sys.executable})", "verl-top needs Python >= 3.10"
        )
        raise _Stop
    report.passed("python", f"Python {version} ({sys.executable})")


async def _agent(report: HostReport, backend: str, wait_s: float, replay_trace: str | None) -> None:
    seen: list[Record] = []
    got_sample = asyncio.Event()

    def emit(rec: Record) -> None:
        seen.append(rec)
        if isinstance(rec, GpuSample | HostSample):
            got_sample.set()

    source = LocalSource(
        interval=0.5, backend=backend, replay_trace=replay_trace, procs=False, count=0
    )
    t0 = time.monotonic()
    task = asyncio.create_task(source.run(emit))
    try:
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(got_sample.wait(), wait_s)
        if got_sample.is_set():
            # GPU samples follow the host's within a tick or two: give them that long.
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(_gpu_sample(seen), 3.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    failure = task.exception() if task.done() and not task.cancelled() else None
    _judge(report, seen, failure, time.monotonic() - t0, wait_s)


async def _gpu_sample(seen: list[Record]) -> None:
    while not any(isinstance(r, GpuSample) for r in seen):
        await asyncio.sleep(0.05)


def _judge(
    report: HostReport,
    seen: list[Record],
    failure: BaseException | None,
    took: float,
    wait_s: float,
) -> None:
    hello = next((r for r in seen if isinstance(r, Hello)), None)
    if hello is None:
        why = f": {type(failure).__name__}: {failure}" if failure is not None else ""
        report.failed(
            "agent",
            f"the agent did not start{clean_text(why)}",
            "please report it with the output of `verl-top --version`",
        )
        return
    report.passed(
        "agent",
        f"started in-process (Python {clean_text(hello.python)}, "
        f"backend {clean_text(hello.backend)})",
    )
    if not hello.gpus:
        why = clean_text(hello.error) or "no GPU found"
        report.failed(
            "nvml",
            f"backend {clean_text(hello.backend)}: {why}",
            "check `nvidia-smi` (driver loaded? GPUs visible to this user?); without GPUs "
            "verl-top still shows this machine's CPU, memory, network and disks",
        )
        return
    driver = f", driver {clean_text(hello.driver)}" if hello.driver else ""
    report.passed("nvml", f"{len(hello.gpus)} GPUs via {clean_text(hello.backend)}{driver}")
    gpus = sum(isinstance(r, GpuSample) for r in seen)
    if not gpus:
        report.failed(
            "sample",
            f"no GPU sample within {wait_s:g} s",
            "the agent started but could not sample: run `verl-top` and read the notes",
        )
        return
    report.passed("sample", f"{gpus} GPU samples after {took:.1f} s")
