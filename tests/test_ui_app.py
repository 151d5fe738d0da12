"""Pilot tests of the Textual app on stores built from the real H200 trace (tests/ui_data.py)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from assessing import FixedEngine
from rich.console import Console
from textual.widgets import DataTable, Static, TabbedContent
from ui_data import T0, build_store, load_trace, trace_sample

from verl_top.diagnosis.findings import Check, Finding, Verdict
from verl_top.inputs import Inputs
from verl_top.model import GpuSample
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.replay import ReplayControl
from verl_top.store import Ring, Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.findings_screen import FindingsScreen
from verl_top.ui.widgets import DASH, TEMP_STOPS, activity_style, gradient

SIZE = (160, 48)


def healthy() -> Verdict:
    return Verdict(
        None,
        None,
        "Job looks healthy: 24 GPUs at 71 % activity",
        checks=[Check(1, "gpu.idle", "passed", "24 GPUs busy")],
    )


def dataflow_bottleneck() -> Verdict:
    return Verdict(
        bottleneck_step=3,
        bottleneck_rule="flow.rollout_bound",
        headline="Step 3 (Dataflow) is the bottleneck: rollout takes 60 % of the step",
        findings=[
            Finding(
                3,
                "flow.rollout_bound",
                0.8,
                "rollout takes 60 % of the step",
                ["gen 307.7 s of 516.8 s (60 %), last 3 steps"],
                "raise actor_rollout_ref.rollout.max_num_seqs",
            ),
            Finding(1, "gpu.idle", 0.5, "2 of 24 GPUs idle", ["node02:gpu6 0 %"], "see steps 2-4"),
        ],
        checks=[
            Check(2, "nccl.transport_socket", "no_data", "give --nccl-log PATH"),
            Check(1, "gpu.throttle", "passed", "no throttling"),
        ],
    )


def make_app(
    store: Store | None = None,
    verdict: Verdict | None = None,
    replay: ReplayControl | None = None,
    mode: str = "LIVE",
    engine: Any = None,
    **kwargs: Any,
) -> VerlTopApp:
    store = store if store is not None else build_store()
    inputs = Inputs(
        store=store, pipeline=Pipeline(store, parsers={}), replay=replay, mode=mode, title="test"
    )
    return VerlTopApp(
        inputs, engine=engine or FixedEngine(verdict), live=kwargs.pop("live", False), **kwargs
    )


def plain(widget: Static) -> str:
    """The text a Static shows."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


def cell(table: DataTable, row: str, col: str) -> str:
    return str(table.get_cell(row, col)).strip()


async def started(app: VerlTopApp, pilot: Any) -> None:
    await pilot.pause()
    app.refresh_now()
    await pilot.pause()


async def test_tabs_switch_with_number_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        tabs = app.query_one(TabbedContent)
        for key in "23451":
            await pilot.press(key)
            await pilot.pause()
            assert tabs.active == f"pane-{key}"
            assert app.visible_step() == int(key)


async def test_pane1_has_a_row_per_gpu_and_per_host() -> None:
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        gpus = app.query_one("#gpu-table", DataTable)
        hosts = app.query_one("#host-table", DataTable)
        assert gpus.row_count == store.gpu_count() == 24
        assert hosts.row_count == 3
        assert app.throughput.ordered_row_keys()[:3] == ["node01/0", "node01/1", "node01/2"]


async def test_host_order_reverses_to_the_last_hosts_highest_gpu_first() -> None:
    store = build_store()
    app = make_app(store)
    host_order = [
        f"{h.name}/{i}" for h in store.hosts.values() for i in sorted(h.gpus)
    ]  # the store's hosts in arrival order, each host's GPUs by index
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        pane = app.throughput
        assert pane.sort_key == "host" and pane.ordered_row_keys() == host_order
        await pilot.press("O")
        await pilot.pause()
        assert pane.sort_key == "host" and pane.sort_reverse
        assert pane.ordered_row_keys() == host_order[::-1]
        assert "sort: host ↓" in plain(app.query_one("#gpu-status", Static))


async def test_sort_key_orders_rows_by_activity_and_reverses() -> None:
    store = build_store()
    app = make_app(store)
    means = {f"{g.host}/{g.index}": store.gpu_mean(g, "activity") for g in store.iter_gpus()}
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("o")
        await pilot.pause()
        pane = app.throughput
        assert pane.sort_key == "activity" and not pane.sort_reverse
        order = pane.ordered_row_keys()
        values = [means[k] for k in order]
        assert values == sorted(values)
        assert order[:2] == ["node02/6", "node02/7"]  # the two real-idle GPUs
        status = plain(app.query_one("#gpu-status", Static))
        assert "sort: activity ↑" in status
        await pilot.press("O")
        await pilot.pause()
        values = [means[k] for k in pane.ordered_row_keys()]
        assert values == sorted(values, reverse=True)
        assert "sort: activity ↓" in plain(app.query_one("#gpu-status", Static))
        await pilot.press("o")  # memory
        await pilot.pause()
        mem = {
            k: store.hosts[k.split("/")[0]].gpus[int(k.split("/")[1])].latest.mem_used_mib
            for k in means
        }
        got = [mem[k] for k in pane.ordered_row_keys()]
        assert pane.sort_key == "memory" and got == sorted(got)


async def test_clicking_a_header_sorts_by_it() -> None:
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        x = 0
        for key, column in table.columns.items():
            if key.value == "temp":
                break
            x += column.get_render_width(table)
        await pilot.click(table, offset=(x + 1, 0))
        await pilot.pause()
        assert app.throughput.sort_key == "temp"
        temps = [
            store.hosts[k.split("/")[0]].gpus[int(k.split("/")[1])].latest.temp_c
            for k in app.throughput.ordered_row_keys()
        ]
        assert temps == sorted(temps)


async def test_idle_gpus_are_marked() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        assert cell(table, "node02/6", "act").startswith("IDLE")
        assert cell(table, "node02/7", "act").startswith("IDLE")
        assert not cell(table, "node01/0", "act").startswith("IDLE")
        assert app.throughput.gpu_rows["node02/6"].idle
        idle_style = str(table.get_cell("node02/6", "act").style)
        act = app.throughput.gpu_rows["node02/6"].sort["activity"]
        # colours are taken per whole percent (cached)
        assert act < 5 and idle_style == f"bold {activity_style(int(act), app.palette())}"
        # ~0 %: the error end of the theme's activity gradient
        assert activity_style(0.0, app.palette()) == app.palette()["error"].upper()
        assert "10 idle" in plain(app.query_one("#gpu-status", Static))
        # The stalled node03 (NVML only, ~24 %) counts as idle too.
        assert cell(table, "node03/0", "act").startswith("IDLE")


async def test_absent_gpm_shows_dash_not_zero() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        for col in ("sm", "tensor", "dram"):
            assert cell(table, "node03/0", col) == DASH
            assert cell(table, "node01/0", col) != DASH
        assert cell(table, "node03/0", "nvml") not in (DASH, "0")
        assert cell(table, "node02/6", "sm") == "0"  # a real 0 stays 0


async def test_down_host_greys_out_and_says_why() -> None:
    store = build_store(down={"node03": "connection refused"})
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        hosts = app.query_one("#host-table", DataTable)
        assert cell(hosts, "node03", "state") == "down"
        assert cell(hosts, "node03", "reason") == "connection refused"
        assert cell(hosts, "node03", "seen") == "30s"
        gpus = app.query_one("#gpu-table", DataTable)
        act = gpus.get_cell("node03/0", "act")
        assert str(act).startswith("down")
        muted = app.palette()["muted"]
        assert str(act.style) == muted
        assert str(gpus.get_cell("node03/0", "temp").style) == muted
        live_temp = gpus.get_cell("node01/0", "temp")  # live: on the temperature gradient
        temp = store.hosts["node01"].gpus[0].latest.temp_c
        assert str(live_temp.style) == gradient(temp, TEMP_STOPS, app.palette())
        status = plain(app.query_one("#status-line", Static))
        assert "2 up · 1 down" in status


async def test_header_counts_mode_and_verl_summary() -> None:
    app = make_app(build_store(steps=True), mode="REPLAY", replay=ReplayControl())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        status = plain(app.query_one("#status-line", Static))
        assert " REPLAY " in status
        assert "GPUs 24" in status
        assert "activity" in status and "steps/min 0.12" in status  # 2 intervals of 520 s
        assert "playing x1" in status
        summary = plain(app.query_one("#verl-summary", Static))
        assert "step 12" in summary and "822" in summary and "MFU 29 %" in summary


async def test_without_verl_log_the_summary_says_which_flag() -> None:
    app = make_app(build_store())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "--verl-log PATH" in plain(app.query_one("#verl-summary", Static))


async def test_replay_keys_drive_the_replay_control() -> None:
    replay = ReplayControl()
    app = make_app(replay=replay, mode="REPLAY")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("space")
        await pilot.pause()
        assert replay.paused
        assert "paused" in plain(app.query_one("#status-line", Static))
        await pilot.press("n")
        assert replay._steps == 1
        await pilot.press("greater_than_sign", "greater_than_sign", "less_than_sign")
        assert replay.speed == 2.0  # > / < are the speed (+ / - are the history window)
        await pilot.press("space")
        await pilot.pause()
        assert not replay.paused


async def test_q_quits() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("q")
        await pilot.pause()
        assert app._exit  # noqa: SLF001 - the app has been told to exit


async def test_bottleneck_tab_is_marked_and_pane_shows_findings() -> None:
    app = make_app(verdict=dataflow_bottleneck())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        tabs = app.query_one(TabbedContent)
        tab3 = tabs.get_tab("pane-3")
        assert str(tab3.label).startswith("● 3 Dataflow")
        assert tab3.has_class("-bottleneck") and tab3.has_class("-bottleneck-error")
        assert not str(tabs.get_tab("pane-1").label).startswith("●")
        banner = app.query_one("#banner", Static)
        assert "rollout takes 60 %" in plain(banner) and banner.has_class("-error")
        await pilot.press("3")
        await pilot.pause()
        text = plain(app.pane(3).findings)
        assert "rollout takes 60 % of the step" in text
        assert "max_num_seqs" in text and "gen 307.7 s" in text


async def test_banner_collecting_then_healthy() -> None:
    empty = Store()
    app = make_app(empty, verdict=healthy())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert (
            plain(app.query_one("#banner", Static)).strip()
            == "no data: waiting for the first samples"
        )
        row = load_trace()[40]  # a real train_matmul_bf16 sample
        empty.ingest(trace_sample(row, "h1", 0, T0, gpm=True))
        app.refresh_now()
        await pilot.pause()
        banner = app.query_one("#banner", Static)
        assert plain(banner).startswith("healthy: ") and banner.has_class("-ok")


async def test_findings_screen_opens_with_d_and_closes_with_escape() -> None:
    app = make_app(verdict=dataflow_bottleneck())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, FindingsScreen)
        body = plain(app.screen.query_one("#findings-body", Static))
        assert "● Step 3 — Dataflow  (bottleneck)" in body
        assert "passed: gpu.throttle" in body
        assert "nccl.transport_socket: give --nccl-log PATH" in body
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, FindingsScreen)


async def test_only_the_visible_pane_is_refreshed() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        calls: list[int] = []
        pane2 = app.pane(2)
        original = pane2.update_content
        pane2.update_content = lambda store, verdict: (calls.append(1), original(store, verdict))  # type: ignore[method-assign]
        app.store.version += 1
        app.refresh_now()
        assert calls == []
        await pilot.press("2")
        await pilot.pause()
        n = len(calls)
        assert n >= 1
        app.refresh_now()  # nothing changed: no redraw
        assert len(calls) == n


async def test_engine_runs_once_per_store_change() -> None:
    engine = FixedEngine(healthy())
    app = make_app(engine=engine)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        before = engine.calls
        app.refresh_now()
        app.refresh_now()
        assert engine.calls == before
        app.store.ingest(GpuSample(host="node01", t=T0 + 61, index=0, util_gpu=50.0))
        app.refresh_now()
        app.refresh_now()
        assert engine.calls == before + 1


async def test_gpu_table_is_updated_by_diffing_cells() -> None:
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        sync = app.throughput.gpu_sync
        assert sync is not None
        base = sync.cell_updates
        store.version += 1
        app.refresh_now()
        assert sync.cell_updates == base  # nothing moved: no cell written
        latest = store.hosts["node01"].gpus[2].latest
        assert latest is not None
        store.ingest(
            GpuSample(
                host="node01",
                t=T0 + 61,
                index=2,
                util_gpu=7.0,
                sm_util=3.0,
                temp_c=41.0,
                mem_used_mib=latest.mem_used_mib,
                mem_total_mib=latest.mem_total_mib,
                power_w=latest.power_w,
                power_limit_w=latest.power_limit_w,
                sm_mhz=latest.sm_mhz,
            )
        )
        app.refresh_now()
        changed = sync.cell_updates - base
        assert 1 <= changed <= 13  # only that GPU's row changed
        table = app.query_one("#gpu-table", DataTable)
        assert cell(table, "node01/2", "nvml") == "7"
        assert cell(table, "node01/2", "temp") == "41"


async def test_missing_inputs_are_named_in_panes_2_to_5() -> None:
    app = make_app(build_store())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        expected = {
            2: ("--nccl-log PATH", "press p to run a probe"),
            3: ("--verl-log PATH",),
            4: ("--verl-config FILE",),
            5: ("--verl-config FILE or a driver log that printed the config",),
        }
        bodies = {2: "#comm-body", 3: "#flow-body", 4: "#map-body", 5: "#cfg-body"}
        for step, needles in expected.items():
            await pilot.press(str(step))
            await pilot.pause()
            text = plain(app.query_one(bodies[step], Static))
            for needle in needles:
                assert needle in text, (step, needle)


async def test_panes_3_to_5_show_steps_grid_and_config() -> None:
    app = make_app(build_store(steps=True, config=True))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("3")
        await pilot.pause()
        flow = plain(app.query_one("#flow-body", Static))
        assert "update_actor" in flow and "307.7 60%" in flow  # step 11's gen share
        await pilot.press("4")
        await pilot.pause()
        grid = plain(app.query_one("#map-body", Static))
        assert "node02" in grid and "rollout TP: 2" in grid
        await pilot.press("5")
        await pilot.pause()
        cfg = plain(app.query_one("#cfg-body", Static))
        assert "actor_rollout_ref.rollout.enforce_eager" in cfg and "True" in cfg


class BrokenSource:
    name = "broken"

    async def run(self, emit: Any) -> None:
        raise RuntimeError("agent exploded")


class OneShotSource:
    name = "oneshot"

    async def run(self, emit: Any) -> None:
        emit(GpuSample(host="live1", t=T0, index=0, util_gpu=42.0))


async def test_live_sources_run_and_a_failing_one_does_not_crash() -> None:
    store = Store()
    inputs = Inputs(
        store=store, pipeline=Pipeline(store, parsers={}), sources=[BrokenSource(), OneShotSource()]
    )
    app = VerlTopApp(inputs, refresh=0.1, engine=FixedEngine(healthy()), live=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        for _ in range(20):
            await asyncio.sleep(0.05)
            if store.gpu_count() and store.notes:
                break
        await pilot.pause()
        assert store.gpu_count() == 1
        assert any("broken failed: RuntimeError: agent exploded" in n for n in store.notes)
        assert app.is_running
        assert app.refresh_count >= 1


async def test_refresh_and_pane_keys_are_safe_on_the_findings_screen() -> None:
    app = make_app(verdict=dataflow_bottleneck())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("d")
        await pilot.pause()
        app.store.version += 1
        app.refresh_now()  # the timer keeps ticking under the findings screen
        await pilot.press("o")
        await pilot.pause()
        assert isinstance(app.screen, FindingsScreen)
        assert app.throughput.sort_key == "host"  # o sorts pane 1 only, not from here
        await pilot.press("3")  # digits work from every screen: back to the panes, pane 3
        await pilot.pause()
        assert not isinstance(app.screen, FindingsScreen)
        assert app.visible_step() == 3


def test_recent_values_matches_values_on_a_wrapped_ring() -> None:
    store = build_store(samples=80)
    store.limits.window_s = 30.0
    for g in list(store.iter_gpus())[:4]:
        since = store.window_start()
        assert g.history.recent_values("activity", since) == g.history.values("activity", since)
        assert g.history.recent_values("sm_util") == g.history.values("sm_util")
    r = Ring(("x",), 4)
    for i in range(7):
        r.push(float(i), {"x": float(i) if i != 5 else None})
    assert r.recent_values("x") == r.values("x") == [3.0, 4.0, 6.0]
    assert r.recent_values("x", since=4.0) == r.values("x", since=4.0) == [4.0, 6.0]


async def test_a_refresh_after_shutdown_does_nothing() -> None:
    """A last timer tick or a replay source ending while the app shuts down finds no screens:
    the refresh is skipped instead of raising ScreenStackError (which panicked the app in CI,
    seen as 'No screens on stack' once in a loaded run)."""
    app = make_app(live=True)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        count = app.refresh_count
    assert not app.screen_stack  # the screens are gone, the widgets' references are not
    app.refresh_now()
    assert app.refresh_count == count


async def test_a_pane_redrawn_out_of_tick_redraws_the_header_with_it() -> None:
    """A resize or a tab switch redraws the visible pane from the store as it is now; the
    header must be drawn from the same store in the same batch, or it trails the rows below
    it (the tmux walk-through saw 'hosts 1 up · connecting 1/2, GPUs 8' above 16 GPU rows)."""
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        before = store.gpu_count()
        status = app.query_one("#status-line", Static)
        assert f"GPUs {before}" in plain(status)
        host = next(iter(store.hosts))
        row = load_trace()[0]
        store.ingest(trace_sample(row, host, 99, store.now, True))  # a GPU appears, no tick
        assert store.gpu_count() == before + 1
        await pilot.resize_terminal(SIZE[0] - 10, SIZE[1])
        await pilot.pause()
        await pilot.pause()
        gpus = app.query_one("#gpu-table", DataTable)
        assert any(str(k.value).endswith("/99") for k in gpus.rows)  # the pane drew the new GPU
        assert f"GPUs {before + 1}" in plain(status)  # and the header counts it
        store.ingest(trace_sample(row, host, 98, store.now, True))  # another, no tick
        await pilot.press("2")  # a tab drawn at once, with the header
        await pilot.pause()
        assert f"GPUs {before + 2}" in plain(status)
        store.ingest(trace_sample(row, host, 97, store.now, True))
        await pilot.press("1")  # back to a pane already laid out: no resize redraws it
        await pilot.pause()
        assert f"GPUs {before + 3}" in plain(status)


async def test_a_stale_pane_focus_message_does_not_bring_its_pane_back() -> None:
    """Keys 3 then 4 pressed quickly under load: pane 3's queued "a widget here was focused"
    message could be handled after the 4 had moved the focus into pane 4, and Textual then
    made pane 3 active again (a loaded CI run's tmux walk-through waited 30 s for pane 4)."""
    from textual.widgets import TabPane

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("4")
        await pilot.pause()
        tabs = app.query_one(TabbedContent)
        assert tabs.active == "pane-4" and app.focused is app.main_widget(4)
        pane3 = app.query_one("#pane-3", TabPane)
        pane3.post_message(TabPane.Focused(pane3))  # late: the focus is in pane 4 by now
        await pilot.pause()
        await pilot.pause()
        assert tabs.active == "pane-4"
        app.pane(3).focus()  # a focus that is still there does activate its pane
        await pilot.pause()
        await pilot.pause()
        assert tabs.active == "pane-3"


async def test_a_tick_closes_the_diagnosis_gate_until_its_frame_is_painted() -> None:
    """A background evaluation gives way while a tick draws its frame (monitor.FrameGate):
    the gate is closed while the pane is refreshed and while the frame is rendered, and open
    again once the frame is written out, so an evaluation waits for the frame, never longer.

    At 4096 GPUs the gate used to open (call_after_refresh) before the widgets the tick changed
    were painted: an evaluation's rules ran beside those paints and made them 1.5-2x as long."""
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        pane = app.pane(1)
        refreshed: list[bool] = []
        original = pane.refresh_pane

        def watched(store: Any, assessment: Any) -> None:
            refreshed.append(app.monitor.gate.is_open)
            original(store, assessment)

        pane.refresh_pane = watched  # type: ignore[method-assign]
        gate = app.monitor.gate
        events: list[str] = []  # in order: "painted (open|closed)", "opened"
        table = app.query_one("#gpu-table", DataTable)
        render_lines, opened = table.render_lines, gate.open

        def rendered(crop: Any) -> Any:
            events.append("painted " + ("open" if gate.is_open else "closed"))
            return render_lines(crop)

        def watched_open() -> None:
            events.append("opened")
            opened()

        table.render_lines = rendered  # type: ignore[method-assign]
        gate.open = watched_open  # type: ignore[method-assign]
        row = load_trace()[5]
        for g in list(store.iter_gpus()):  # new readings: the GPU table changes
            store.ingest(trace_sample(row, g.host, g.index, store.now + 1, True))
        with app.batch_update():  # the loop goes idle before anything is painted
            app.refresh_now()
            for _ in range(5):
                await pilot.pause()
            assert not gate.is_open and not events  # idle is not painted
        assert refreshed and not any(refreshed)  # refreshed with the gate closed
        for _ in range(50):
            await pilot.pause()
            if "opened" in events:
                break
        # The changed table was painted with the gate closed, and the gate opened after it.
        assert events[: events.index("opened")] == ["painted closed"] * events.index("opened")
        assert events[0] == "painted closed"
