"""The app's screen as SVG without a terminal, for headless snapshots (``verl-top snapshot``)."""

from __future__ import annotations

from verl_top.assessment import Assessment
from verl_top.inputs import Inputs

SCREEN_SIZE = (160, 48)


async def render_screen_svg(
    inputs: Inputs, assessment: Assessment, size: tuple[int, int] = SCREEN_SIZE
) -> str:
    """Lay the app out headless over the collected store, with ``assessment``, and screenshot it.

    The app runs without sources or timers (``live=False``): it shows exactly what was
    collected, with the bottleneck pane in front, as the live app would.
    """
    from verl_top.ui.app import VerlTopApp

    app = VerlTopApp(inputs, live=False, assessment=assessment)
    async with app.run_test(size=size) as pilot:
        app.refresh_now()
        step = assessment.bottleneck_step
        if step:
            await pilot.press(str(step))
            app.refresh_now()
        await pilot.pause()
        return app.export_screenshot(title="verl-top snapshot")
