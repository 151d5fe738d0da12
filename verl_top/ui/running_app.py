"""The verl-top app a widget runs in, typed, for the widgets that read its state or call it.

Textual types ``widget.app`` as a plain ``App``. Panes and screens that need the app's palette,
store, host filter or navigation ask :func:`monitor_app` instead of probing attributes by name,
so the checker sees every use. A widget hosted by another app (a test harness showing one
pane) gets None and falls back to its defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.dom import DOMNode

    from verl_top.ui.app import VerlTopApp


def monitor_app(node: DOMNode) -> VerlTopApp | None:
    """The ``VerlTopApp`` running ``node``; None when another app hosts it."""
    from verl_top.ui.app import VerlTopApp  # noqa: PLC0415 - the app module imports the widgets

    app = node.app
    return app if isinstance(app, VerlTopApp) else None


def app_palette(node: DOMNode) -> dict[str, str]:
    """The app's theme colours for Rich text; {} outside verl-top's app (Rich's defaults)."""
    app = monitor_app(node)
    return app.palette() if app is not None else {}
