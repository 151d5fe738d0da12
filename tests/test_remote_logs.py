"""`--hosts` + `--verl-log HOST:PATH` end to end: the remote agent follows the log over real sshd."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from sshd import SshdFactory, replay_cluster_args

from verl_top.cli import app_parser
from verl_top.headless import run_sources
from verl_top.inputs import build_inputs

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]
VERL_LOG = Path(__file__).parent / "fixtures" / "verl" / "verl_console_sample.log"


async def test_remote_verl_log_is_followed_from_its_start(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path
) -> None:
    daemon = sshd_pool.start()
    log = tmp_path / "driver.log"
    shutil.copy(VERL_LOG, log)
    args = app_parser().parse_args(
        replay_cluster_args(daemon, tmp_path, ssh_keys["client"], h200_trace, log)
    )
    inputs = build_inputs(args)
    task = asyncio.create_task(run_sources(inputs, duration=20))
    for _ in range(200):
        await asyncio.sleep(0.1)
        if len(inputs.store.steps) >= 3:
            break
    # a step appended while we watch arrives too (tail -F)
    with open(log, "a") as fh:
        fh.write("(TaskRunner pid=1) step:13 - timing_s/gen:10.0 - timing_s/step:20.0\n")
    for _ in range(100):
        await asyncio.sleep(0.1)
        if inputs.store.steps and inputs.store.steps[-1].step == 13:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    steps = [s.step for s in inputs.store.steps]
    assert steps[:3] == [10, 11, 12] and steps[-1] == 13
    assert inputs.store.gpu_count() == 8  # and the node's GPUs streamed meanwhile
