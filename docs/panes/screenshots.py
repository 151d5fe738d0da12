"""Regenerate the screenshots of docs/ui.md from the bundled demo: ``python docs/panes/screenshots.py``.

The real app runs headless at 160x48 on ``--demo`` (the recording built from the real H200
trace, docs/demo.md) in the default theme; after about 80 s of replay (x16, 60 s window) each pane, the
diagnosis screen, the node screen and the help screen are saved as SVG next to this file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from verl_top.cli import app_parser
from verl_top.inputs import build_inputs
from verl_top.ui.app import VerlTopApp
from verl_top.ui.themes import DEFAULT_THEME

OUT = Path(__file__).parent
SIZE = (160, 48)


async def main() -> None:
    """Write one SVG per view into docs/panes/."""
    inputs = build_inputs(app_parser().parse_args(["--demo"]))
    app = VerlTopApp(inputs, theme_name=DEFAULT_THEME)
    async with app.run_test(size=SIZE) as pilot:
        # About 80 s of the replay at x16, shown in a 60 s window, so histories are full.
        await pilot.press(*["greater_than_sign"] * 4, "minus", "minus")
        await pilot.pause(5.0)
        await pilot.press("space")  # pause: every shot shows the same moment
        await pilot.pause(1.5)  # let the pause/window notifications time out
        for step in range(1, 6):
            await pilot.press(str(step))
            await pilot.pause(0.5)
            (OUT / f"pane{step}.svg").write_text(
                app.export_screenshot(title=f"verl-top pane {step}")
            )
        await pilot.press("d")
        await pilot.pause(0.5)
        (OUT / "findings.svg").write_text(app.export_screenshot(title="verl-top diagnosis (d)"))
        await pilot.press("escape", "1")
        await pilot.pause(0.5)
        if app.throughput.hosts_expanded:  # shown because all fits: fold it, h shows it focused
            await pilot.press("h")
        await pilot.press("h", "enter")  # the host table, focused; Enter: node01, all GPUs
        await pilot.pause(1.0)
        (OUT / "node.svg").write_text(app.export_screenshot(title="verl-top node screen (Enter)"))
        await pilot.press("escape", "question_mark")
        await pilot.pause(0.5)
        (OUT / "help.svg").write_text(app.export_screenshot(title="verl-top help (?)"))
    inputs.close()


if __name__ == "__main__":
    asyncio.run(main())
