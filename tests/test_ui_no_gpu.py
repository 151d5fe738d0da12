"""This machine without a GPU: the real local source, and the app says so plainly."""

from __future__ import annotations

import asyncio

from verl_top.diagnosis.engine import Engine
from verl_top.inputs import Inputs
from verl_top.sources.local import LocalSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp


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
        assert banner.startswith("No GPU data:") and host.reason in banner
