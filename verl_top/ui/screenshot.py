"""The app's screen as SVG without a terminal, for headless snapshots (``verl-top snapshot``)."""

from __future__ import annotations

import re

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
        return portable_fonts(app.export_screenshot(title="verl-top snapshot"))


def portable_fonts(svg: str) -> str:
    """``svg`` made readable outside a browser with Fira Code (librsvg, offline viewers).

    Cells are separate ``<text>`` runs whose leading spaces are no-break spaces: without
    ``xml:space="preserve"`` librsvg collapses them and neighbouring columns run together
    ("0%steps/min", "18.191%"). Textual also names "Fira Code" (fetched from a CDN) first:
    offline, fontconfig substitutes a proportional font for it, so the generic ``monospace``
    is named instead; every cell keeps its x position and textLength."""
    svg = re.sub(r"font-family:\s*Fira Code,\s*monospace", "font-family: monospace", svg)
    return re.sub(r"<svg(?![^>]*xml:space)", '<svg xml:space="preserve"', svg, count=1)
