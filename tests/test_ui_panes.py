"""Panes 2, 3 and 5 and the probe key (p), with Pilot on fixed data.

Data: the bundled demo recording (verl_top/data/demo.ndjson.gz: 4 nodes × 8 H200, 12 verl steps
with a validation step 6, a config with rollout TP 4 and gpu_memory_utilization 0.6) read into a
Store with a fixed clock, and the H200-trace stores of tests/ui_data.py. Probe results are
constructed records; the probe runner is a fake injected into the app (no GPU, no processes).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

from assessing import FixedEngine
from rich.console import Console
from textual.app import App, ComposeResult
from textual.widgets import Button, Static
from ui_data import build_store

from verl_top import protocol
from verl_top.inputs import Inputs
from verl_top.model import LogEvent, ProbeResult
from verl_top.nccl.probe import ProbeCollector
from verl_top.protocol import read_recording
from verl_top.sources.local import LocalSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.panes.communication import NO_BUS
from verl_top.ui.panes.dataflow import DataflowPane
from verl_top.ui.probe_screen import NEEDS_LIVE, ProbeScreen

DEMO = Path(__file__).resolve().parents[1] / "verl_top" / "data" / "demo.ndjson.gz"
SIZE = (170, 60)


def demo_store() -> Store:
    """The demo recording in a store whose clock is the recording's end."""
    records = read_recording(DEMO)
    end = max(r.t for r in records)
    store = Store(wall_clock=lambda: end)
    for r in records:
        store.ingest(r, received=r.t)
    return store


def make_app(store: Store, mode: str = "LIVE", sources: list[Any] | None = None) -> VerlTopApp:
    inputs = Inputs(
        store=store,
        pipeline=Pipeline(store, parsers={}),
        sources=sources or [],
        mode=mode,
        title="test",
    )
    return VerlTopApp(inputs, engine=FixedEngine(), live=False)


def plain(widget: Static) -> str:
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


async def show(app: VerlTopApp, pilot: Any, step: int) -> None:
    await pilot.pause()
    app.refresh_now()
    await pilot.press(str(step))
    await pilot.pause()


def probe(**kw: Any) -> ProbeResult:
    base: dict[str, Any] = dict(
        host="node01",
        t=1764662770.0,
        tool="torch",
        collective="all_reduce",
        scope="intra",
        hosts=["node01"],
        nranks=8,
        busbw_max_gbs=250.0,
        expected_gbs=480.0,
        link="nvlink4",
        transport="NVLS",
    )
    base.update(kw)
    return ProbeResult(**base)


# -- pane 3 ---------------------------------------------------------------------------------


async def test_pane3_stacked_bars_share_outlier_and_long_tail_on_the_demo() -> None:
    app = make_app(demo_store())
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 3)
        text = plain(app.query_one("#flow-body", Static))
        width = app.pane(3).scrollable_content_region.width
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r"^\s*step (\d+)\s+([a-z·]+)\s", text, re.M)
    }
    assert sorted(rows) == list(range(1, 13))  # one bar per demo step
    # Bars are proportional: gen is ~62 % of a 30 s step; the longest (step 6, 37.7 s, 8.0 s of
    # testing at its end) spans the width the pane leaves beside the step, seconds and note.
    longest = len(rows[6])
    assert longest == width - 26 - len("⚑ outlier: testing 8.0 s") > 60  # the note in full
    assert rows[6].endswith("t" * round(longest * 8.0 / 37.7))
    assert 0.58 < rows[12].count("g") / longest * 37.7 / 30.2 < 0.66
    assert "t" not in rows[5]
    step6 = next(line for line in text.splitlines() if line.strip().startswith("step 6 "))
    assert "⚑ outlier: testing 8.0 s" in step6
    assert "excluded from medians and trends: step 6 (testing 8.0 s)" in text
    gen = next(line for line in text.splitlines() if re.search(r"^\s*g\s+gen\s", line))
    assert re.search(r"gen\s+18\.61\s+62%\s+18\.65\s+→ \+0%", gen), gen
    assert "Stage medians over 11 steps" in text  # step 6 left out
    assert "slowest sequence 18.3 s vs mean 6.8 s = 2.7×" in text
    assert "samples/s 67.9" in text and "tokens/s total 110,128" in text


async def test_pane3_trend_arrow_follows_the_last_three_steps() -> None:
    store = demo_store()
    from verl_top.model import VerlStep

    base = dict(store.steps[-1].metrics)
    for k in range(3):  # three slower steps: gen +25 %
        m = dict(base, **{"timing_s/gen": base["timing_s/gen"] * 1.25})
        store.ingest(VerlStep(host="driver", t=store.now + 30 * (k + 1), step=13 + k, metrics=m))
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 3)
        text = plain(app.query_one("#flow-body", Static))
    gen = next(line for line in text.splitlines() if re.search(r"^\s*g\s+gen\s", line))
    assert "↑ +24%" in gen or "↑ +25%" in gen, gen


class PaneHost(App):
    """Pane 3 alone on the demo data: the snapshot does not move with the app's keys or header."""

    def compose(self) -> ComposeResult:
        yield DataflowPane(id="step3")

    def on_mount(self) -> None:
        self.query_one(DataflowPane).refresh_pane(demo_store(), None)


def test_pane3_snapshot(snap_compare) -> None:
    assert snap_compare(PaneHost(), terminal_size=(160, 52))


async def test_pane1_summary_has_tokens_step_time_mfu_and_stage_strip() -> None:
    app = make_app(demo_store())
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 1)
        text = plain(app.query_one("#verl-summary", Static))
    assert "tokens/s/GPU 3,442" in text and "tokens/s total 110,128" in text
    assert "step time 30.2 s" in text and "MFU 31 %" in text
    strip = re.search(r"stages, last 300 s │(.*)│", text)
    assert strip is not None
    assert {"g", "u", "t"} <= set(strip.group(1))  # gen, update_actor and step 6's validation


# -- pane 5 ---------------------------------------------------------------------------------


async def test_pane5_values_defaults_and_headroom_on_the_demo() -> None:
    app = make_app(demo_store())
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 5)
        text = plain(app.query_one("#cfg-body", Static))
    assert re.search(r"rollout\.tensor_model_parallel_size\s+4\s+2\s", text)
    assert re.search(r"rollout\.gpu_memory_utilization\s+0\.6\s+0\.5\s", text)
    assert re.search(r"ppo_micro_batch_size_per_gpu\s+4\s+null\s", text)
    assert "37% free" in text and "88.0 GiB of 140.4 GiB" in text
    assert "megatron" not in text  # an FSDP job: the Megatron keys are not listed


async def test_pane5_names_the_missing_config_and_evidence_from_findings() -> None:
    from verl_top.diagnosis.engine import Engine

    app = make_app(build_store())
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 5)
        assert "missing: --verl-config FILE or a driver log that printed the config" in plain(
            app.query_one("#cfg-body", Static)
        )
    store = build_store(steps=True, config=True)  # enforce_eager True, micro batch 2
    app = make_app(store)
    app.monitor.engine = Engine()
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 5)
        text = plain(app.query_one("#cfg-body", Static))
    lines = text.split("\n")
    row = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("actor_rollout_ref.rollout.enforce_eager")
    )
    eager = lines[row : row + 3]  # the key's own row (advice above may quote the key too)
    assert "True" in eager[0] and "[cfg.enforce_eager]" in " ".join(eager)


# -- pane 2 ---------------------------------------------------------------------------------


async def test_pane2_probe_ratio_single_gpu_events_and_sync() -> None:
    store = demo_store()
    store.ingest(probe())
    store.ingest(probe(host="h200", hosts=[], nranks=1, busbw_max_gbs=0.0, expected_gbs=None))
    store.ingest(
        probe(
            scope="inter",
            hosts=["node01", "node02"],
            nranks=16,
            busbw_max_gbs=44.0,
            expected_gbs=47.0,
            link="ib_ndr",
            transport="IB+GDRDMA",
        )
    )
    store.ingest(LogEvent(host="node02", t=store.now, kind="nccl_warn", text="older warn"))
    store.ingest(
        LogEvent(
            host="node03",
            t=store.now + 1,
            kind="watchdog",
            text="Watchdog caught collective operation timeout",
            severity=1.0,
        )
    )
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 2)
        text = plain(app.query_one("#comm-body", Static))
    lines = text.splitlines()
    intra = next(line for line in lines if line.startswith("node01 ") and "nvlink4" in line)
    assert re.search(r"250\.0\s+480\s+52%\s+nvlink4\s+NVLS", intra)
    inter = next(line for line in lines if line.startswith("node01,node02"))
    assert re.search(r"inter .* 44\.0\s+47\s+94%\s+ib_ndr\s+IB\+GDRDMA", inter)
    single = next(line for line in lines if line.startswith("h200 "))
    assert NO_BUS in single and "Socket" not in single and "0.0" not in single
    assert text.index("Watchdog caught") < text.index("older warn")  # newest first
    assert re.search(r"step 12: 0\.89 s 3%", text)  # weight sync per step with its share
    assert re.search(r"node04\s+0\s+\d+\s+0%", text)  # sync wait per node


def test_single_gpu_probe_has_no_transport() -> None:
    # NCCL logs its bootstrap network even for one rank (seen on a real 1× H200 run).
    sink = ProbeCollector()
    record = probe(host="h200", hosts=["h200"], nranks=1, busbw_max_gbs=0.0, transport="")
    sink.feed("h200:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>")
    sink.feed("h200:1:1 [0] NCCL INFO Using network Socket")
    sink.feed(json.dumps(protocol.to_dict(record)))
    result = sink.finish("all_reduce", "h200")
    assert result.ok and result.nranks == 1
    assert result.transport == "" and result.link == "" and result.expected_gbs is None
    two = ProbeCollector()
    two.feed("h200:1:1 [0] NCCL INFO Using network Socket")
    two.feed(json.dumps(protocol.to_dict(probe(nranks=2, transport=""))))
    assert two.finish("all_reduce", "node01").transport == "Socket"  # a real bus keeps it


# -- key p ----------------------------------------------------------------------------------


class FakeRunner:
    """Stands in for run_local_probe: records calls, returns a result or waits to be cancelled."""

    def __init__(self, result: ProbeResult | None = None) -> None:
        self.result = result
        self.calls: list[bool] = []
        self.cancelled = False
        self.started = asyncio.Event()

    async def __call__(self, force: bool) -> ProbeResult:
        self.calls.append(force)
        self.started.set()
        if self.result is not None:
            return self.result
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def live_app(store: Store | None = None) -> VerlTopApp:
    store = store or build_store()
    return make_app(store, sources=[LocalSource(host="node01", count=1)])


async def test_probe_key_confirms_runs_and_shows_the_result_in_pane2() -> None:
    app = live_app()
    seen: list[Any] = []
    app.inputs.pipeline.listeners.append(seen.append)  # what a recorder would write
    runner = FakeRunner(probe(busbw_max_gbs=410.0))
    app.probe_runner = runner
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 1)
        await pilot.press("p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        confirm = plain(screen.query_one("#probe-text", Static))
        assert "host: node01 (this machine)" in confirm
        assert "GPUs: 8 × NVIDIA H200 (indices 0, 1, 2, 3, 4, 5, 6, 7)" in confirm
        assert "about 15-60 s" in confirm and "perturbs training" in confirm
        assert "GPUs running compute processes make the probe refuse unless forced" in confirm
        await pilot.click("#probe-force")
        for _ in range(50):
            await pilot.pause(0.02)
            if not isinstance(app.screen, ProbeScreen):
                break
        assert not isinstance(app.screen, ProbeScreen)
        assert runner.calls == [True]
        assert list(app.store.probes)[-1].busbw_max_gbs == 410.0
        assert any(isinstance(r, ProbeResult) for r in seen)
        assert app.visible_step() == 2
        text = plain(app.query_one("#comm-body", Static))
        assert re.search(r"410\.0\s+480\s+85%", text)


async def test_probe_cancel_before_and_during_a_run() -> None:
    app = live_app()
    runner = FakeRunner()
    app.probe_runner = runner
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 1)
        await pilot.press("p")
        await pilot.pause()
        await pilot.click("#probe-cancel")
        await pilot.pause()
        assert not isinstance(app.screen, ProbeScreen)
        assert runner.calls == [] and not app.store.probes
        await pilot.press("p")
        await pilot.pause()
        await pilot.click("#probe-run")
        await asyncio.wait_for(runner.started.wait(), 2)
        assert "probing…" in plain(app.screen.query_one("#probe-progress", Static))
        await pilot.press("c")
        for _ in range(50):
            await pilot.pause(0.02)
            if not isinstance(app.screen, ProbeScreen):
                break
        assert not isinstance(app.screen, ProbeScreen)
        assert runner.calls == [False] and runner.cancelled
        assert not app.store.probes and app.visible_step() == 1


async def test_probe_key_in_a_replay_says_it_needs_a_live_session() -> None:
    app = make_app(demo_store(), mode="REPLAY")
    app.probe_runner = FakeRunner(probe())
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 1)
        await pilot.press("p")
        await pilot.pause()
        assert not isinstance(app.screen, ProbeScreen)
        assert any(NEEDS_LIVE in str(n.message) for n in app._notifications)
        assert not app.store.probes


async def test_probe_screen_without_a_local_source_disables_run() -> None:
    app = make_app(build_store(), mode="LIVE", sources=[])
    async with app.run_test(size=SIZE) as pilot:
        await show(app, pilot, 1)
        await pilot.press("p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        assert screen.query_one("#probe-run", Button).disabled
        assert screen.query_one("#probe-force", Button).disabled
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProbeScreen)
