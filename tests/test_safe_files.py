"""Safe files: non-regular log paths refused, big log catch-up paced, snapshots replaced safely."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from verl_top.cli import app_parser
from verl_top.inputs import InputError, build_inputs
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store


@pytest.mark.timeout(10)
@pytest.mark.parametrize("option", ["--verl-log", "--nccl-log"])
def test_a_fifo_log_path_is_refused_with_a_message(
    tmp_path: Path, option: str, h200_trace: Path
) -> None:
    fifo = tmp_path / "driver.log"
    os.mkfifo(fifo)
    args = app_parser().parse_args(["--demo", option, str(fifo)])
    with pytest.raises(InputError) as err:
        build_inputs(args)
    assert str(err.value) == (
        f"{fifo}: not a regular file (a FIFO) (given to {option}); give the log file itself"
    )


def test_a_directory_log_path_is_refused(tmp_path: Path, h200_trace: Path) -> None:
    args = app_parser().parse_args(["--demo", "--verl-log", str(tmp_path)])
    with pytest.raises(InputError, match=r"not a regular file \(a directory\)"):
        build_inputs(args)


async def test_big_log_catch_up_yields_to_the_event_loop(tmp_path: Path) -> None:
    """A 4 MB finished log is read in slices: another task runs many times meanwhile (before,
    the whole 8 MiB poll was parsed in one go: one turn). Timing figures: benchmarks/catchup.py."""
    log = tmp_path / "driver.log"
    pairs = " - ".join(f"actor/m_{k:03d}:{k / 1000:.3f}" for k in range(100))
    log.write_text("".join(f"step:{s} - {pairs}\n" for s in range(2000)))
    turns = 0
    running = True

    async def other() -> None:
        nonlocal turns
        while running:
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(other())
    store = Store()
    await LocalFollowSource([("verl", str(log), True)], until_eof=True).run(Pipeline(store).emit)
    running = False
    await task
    assert len(store.steps) == 2000
    assert turns >= 8
