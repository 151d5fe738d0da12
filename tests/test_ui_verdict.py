"""The app marks the same bottleneck step that `verl-top diagnose` names, for the same data."""

from __future__ import annotations

import json
import subprocess
import sys

from textual.widgets import TabbedContent

from verl_top.cli import app_parser
from verl_top.headless import run_sources
from verl_top.inputs import build_inputs
from verl_top.ui.app import VerlTopApp


async def test_app_marks_the_step_that_diagnose_names() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "diagnose", "--demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    expected = json.loads(out.stdout)["bottleneck"]["step"]
    inputs = build_inputs(app_parser().parse_args(["--demo"]))
    await run_sources(inputs, None)  # the whole recording, as diagnose reads it
    app = VerlTopApp(inputs, live=False)
    async with app.run_test(size=(160, 48)) as pilot:
        app.refresh_now()
        await pilot.pause()
        tabs = app.query_one(TabbedContent)
        marked = [s for s in range(1, 6) if str(tabs.get_tab(f"pane-{s}").label).startswith("●")]
        assert marked == [expected] == [app.verdict.bottleneck_step]
