"""This machine without a GPU: the real local source, and the app says so plainly."""

from __future__ import annotations

import asyncio

from verl_top.diagnosis.engine import Engine
from verl_top.inputs import Inputs
from verl_top.sources.local import LocalSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.node_screen import MetricPlot, NodeScreen


async def test_no_driver_is_said_plainly_and_the_host_is_still_shown() -> None:
    store = Store()
    source = LocalSource(interval=0.2, backend="none", host="thisbox")
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), sources=[source])
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine(), live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(50):
            await asyncio.sleep(0.1)
            host = store.hosts.get("thisbox")
            if host is not None and len(host.history) >= 2:
                break
        app.refresh_now()
        await pilot.pause()
        host = store.hosts["thisbox"]
        assert host.state == "no_gpu" and host.reason
        assert host.latest is not None and host.latest.cpu_pct is not None  # host side still shown
        banner = str(app.query_one("#banner").render())
        reason = host.reason.removeprefix("no GPU data: ")
        assert banner.startswith("no data: no GPU on thisbox (") and reason in banner
        assert banner.lower().count("no gpu") == 1  # said once ("No GPU data: no GPU data")
        # The space goes to what is there: no empty GPU table, the host table has the focus,
        # and Enter opens the host; its node screen has no empty plots.
        assert not app.query_one("#gpu-table").display
        assert app.focused is app.query_one("#host-table")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.host == "thisbox"
        assert not any(p.display for p in app.screen.query(MetricPlot))
        assert app.screen.query_one("#node-host").display


async def test_probe_dialog_without_a_gpu_disables_run_and_says_why() -> None:
    from textual.widgets import Button, Static

    from verl_top.ui.probe_screen import ProbeScreen

    store = Store()
    source = LocalSource(interval=0.2, backend="none", host="thisbox")
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), sources=[source])
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine(), live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(50):
            await asyncio.sleep(0.1)
            if (h := store.hosts.get("thisbox")) is not None and h.state == "no_gpu":
                break
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen, ProbeScreen)
        assert app.screen.query_one("#probe-run", Button).disabled
        assert app.screen.query_one("#probe-force", Button).disabled
        text = str(app.screen.query_one("#probe-text", Static).render())
        assert "no GPU to probe here:" in text and "Run is disabled" in text
