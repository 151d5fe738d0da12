"""Lossless transport: big agent records arrive over a real sshd exactly as they do locally."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sshd import SshdFactory, replay_cluster_args

from verl_top.cli import app_parser
from verl_top.headless import run_sources
from verl_top.inputs import build_inputs
from verl_top.sources.intake import read_lines
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(90)]
STEPS = 400
METRICS = 200  # a verl step line with 200 metrics is ~9 KB; 400 of them ~3.7 MB in one poll


def _step_line(step: int) -> str:
    pairs = " - ".join(f"actor/metric_{k:03d}:{step + k / 1000:.3f}" for k in range(METRICS))
    return f"(TaskRunner pid=1) step:{step} - timing_s/step:{10 + step % 7}.0 - {pairs}\n"


async def test_400_long_verl_step_lines_arrive_over_ssh_as_locally(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path
) -> None:
    log = tmp_path / "driver.log"
    log.write_text("".join(_step_line(s) for s in range(1, STEPS + 1)))
    assert log.stat().st_size > 2 * 1024 * 1024  # more than asyncssh's line buffer

    local = Store()
    await LocalFollowSource([("verl", str(log), True)], until_eof=True).run(Pipeline(local).emit)
    local_steps = [s.step for s in local.steps]
    assert local_steps == list(range(1, STEPS + 1))

    daemon = sshd_pool.start()
    inputs = build_inputs(
        app_parser().parse_args(
            replay_cluster_args(daemon, tmp_path, ssh_keys["client"], h200_trace, log)
        )
    )
    task = asyncio.create_task(run_sources(inputs, duration=60))
    for _ in range(400):
        await asyncio.sleep(0.1)
        if len(inputs.store.steps) >= STEPS:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    remote = inputs.store.steps
    assert [s.step for s in remote] == local_steps
    assert remote[-1].metrics == local.steps[-1].metrics
    assert len(remote[-1].metrics) == METRICS + 1
    assert sum(inputs.store.drops.get(daemon.addr, {}).values()) == 0


class _Chunks:
    """A reader that hands out fixed chunks, like asyncssh's ``read(n)``."""

    def __init__(self, chunks: list[str]) -> None:
        self.chunks = list(chunks)

    async def read(self, n: int) -> str:
        return self.chunks.pop(0) if self.chunks else ""


async def test_read_lines_frames_any_chunking_and_skips_over_long_lines() -> None:
    text = "a\nbb\n" + "x" * 50 + "\nccc\nlast"
    for size in (1, 2, 3, 7, 100):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        got = [line async for line in read_lines(_Chunks(chunks), limit=20)]
        assert got == ["a", "bb", None, "ccc", "last"], size


async def test_escape_sequences_on_the_nodes_stderr_never_reach_the_host_reason(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    from sshd import Collector, make_settings, running, spec_for

    from verl_top.sources.ssh import SshSource
    from verl_top.untrusted import is_clean

    fake = tmp_path / "python-evil"
    fake.write_text(
        "#!/bin/sh\nprintf '\\033]52;c;cm0gLXJmIH4=\\007\\033[2Jboom \\302\\233\\061m[red]x\\n' >&2\n"
        "exit 3\n"
    )
    fake.chmod(0o755)
    daemon = sshd_pool.start()
    source = SshSource(spec_for(daemon), make_settings(tmp_path, ssh_keys, [daemon], str(fake)))
    c = Collector()
    async with running([source], c):
        await c.wait(lambda: any(s == "down" for s, _ in c.states(daemon.name)), 20)
    (reason,) = [r for s, r in c.states(daemon.name) if s == "down"][:1]
    assert "agent exited with status 3: boom [red]x" in reason
    assert is_clean(reason)
