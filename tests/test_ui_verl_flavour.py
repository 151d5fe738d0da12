"""The job's verl flavour on screen: the header names the trainer mode, pane 3 reads an async
wait as a wait, and key ``e`` on pane 3 explains every key of the latest step in that mode."""

from __future__ import annotations

import io
from pathlib import Path

from assessing import FixedEngine
from rich.console import Console
from textual.widgets import Static

from verl_top.inputs import Inputs
from verl_top.model import LogLines
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.key_explain import NO_STEP, KeyExplainScreen, explain_keys
from verl_top.ui.panes.dataflow import DataflowPane, StepViews

FIX = Path(__file__).parent / "fixtures" / "verl09"


def _store(name: str) -> Store:
    store = Store()
    pipe = Pipeline(store)
    lines = (FIX / name).read_text().splitlines()
    pipe.emit(LogLines(host="head", t=1000.0, path=name, kind="verl", lines=lines))
    pipe.finish()
    return store


def _text(renderable: object) -> str:
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def test_explained_keys_follow_the_trainer_mode() -> None:
    text = _text(explain_keys(_store("fully_async_trainer_starved.log")))
    assert "read as: verl 0.9 · fully async · sglang" in text
    assert "because: fully async: Ray actor FullyAsyncTaskRunner" in text
    assert "timing_s/gen = 87.12\n  the trainer's wait on the message queue" in text  # step 8
    assert "timing_s/timing_s/param_sync = 5.049" in text and "prefix is doubled" in text
    assert "fully_async/rollouter/idle_ratio = 0" in text
    assert "rollout generation of the step's batch" not in text  # the sync meaning is not shown


def test_explained_keys_without_a_step() -> None:
    assert NO_STEP in _text(explain_keys(Store()))


def test_pane3_reads_the_async_wait_as_a_wait() -> None:
    views = StepViews().views(_store("v1_colocate_async_wait.log"))
    last = views[-1]
    assert "wait" in last.stage_times and "gen" not in last.stage_times


async def test_header_names_the_mode_and_e_explains_the_keys() -> None:
    store = _store("v1_separate_async_trainer_starved.log")
    inputs = Inputs(
        store=store, pipeline=Pipeline(store, parsers={}), sources=[], mode="LIVE", title="t"
    )
    app = VerlTopApp(inputs, engine=FixedEngine(), live=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        app.refresh_now()
        header = _text(app.query_one("#status-line", Static).content)
        assert "verl 0.9 · V1 separate_async · vllm" in header
        await pilot.press("3")
        await pilot.pause()
        app.query_one(DataflowPane).focus()
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, KeyExplainScreen)
        body = _text(app.screen.query_one("#keys-body", Static).content)
        assert "the trainer's time blocked in the replay buffer" in body
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, KeyExplainScreen)
