"""A verl log being appended to shows up in pane 3 within a refresh (local tail -F)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from verl_top.cli import app_parser
from verl_top.inputs import build_inputs
from verl_top.ui.app import VerlTopApp

SAMPLE = Path(__file__).parent / "fixtures" / "verl" / "verl_console_sample.log"
NEW_STEP = (
    "(TaskRunner pid=1523407) step:13 - timing_s/gen:300.5 - timing_s/reward:10.0 - "
    "timing_s/old_log_prob:40.0 - timing_s/update_actor:120.0 - timing_s/step:470.5\n"
)


async def _wait(pred, timeout: float = 10.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


async def test_appended_step_reaches_pane_3_within_a_refresh(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    shutil.copy(SAMPLE, log)
    args = app_parser().parse_args(
        ["--backend", "none", "--interval", "0.2", "--verl-log", str(log)]
    )
    inputs = build_inputs(args)
    app = VerlTopApp(inputs, refresh=0.2)
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.press("3")
        store = inputs.store
        assert await _wait(lambda: [s.step for s in store.steps] == [10, 11, 12])
        await asyncio.sleep(0.5)
        assert "step&#160;12" in app.export_screenshot()
        with open(log, "a") as fh:
            fh.write(NEW_STEP)
        # the follower polls every interval (0.2 s) and the pane refreshes every 0.2 s
        assert await _wait(lambda: store.steps[-1].step == 13, 3.0)
        count = app.refresh_count
        assert await _wait(lambda: app.refresh_count >= count + 2, 3.0)
        assert "step&#160;13" in app.export_screenshot()
