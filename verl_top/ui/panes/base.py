"""The common shape of a pane: its step's findings on top, then the pane's own content."""

from __future__ import annotations

from typing import Any

from textual.containers import VerticalScroll
from textual.css.query import NoMatches

from verl_top.assessment import Assessment
from verl_top.store import Store
from verl_top.ui.running_app import app_palette
from verl_top.ui.widgets import FindingsBox


class Pane(VerticalScroll):
    """A pane for one step. Subclasses add widgets in ``compose`` after ``self.findings``.

    ``refresh_pane`` (not ``refresh``: that name is Textual's repaint request on every widget)
    is called by the app only while the pane is visible; it must be cheap when nothing changed.
    """

    STEP = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.findings = FindingsBox(self.STEP, classes="findings")
        self._seen_version = -1  # store.version at the last content refresh

    def palette(self) -> dict[str, str]:
        """Theme colours for Rich renderables (CSS covers widgets, Rich text needs hex)."""
        return app_palette(self)

    def refresh_pane(self, store: Store, assessment: Assessment) -> None:
        """Update the findings and, when the store changed, the content."""
        self.findings.show(assessment, self.palette())
        if store.version != self._seen_version:
            self._seen_version = store.version
            try:
                self.update_content(store, assessment)
            except NoMatches:
                # A timer tick can land between mounting the pane and composing its children
                # (seen under load at 1024 GPUs): skip this tick and redraw on the next.
                self._seen_version = -1

    def update_content(self, store: Store, assessment: Assessment) -> None:
        """Redraw the pane's data from the store (subclasses)."""

    def on_resize(self) -> None:
        """Widths depend on the pane's size (fitted columns, bars): redraw once laid out."""
        self.force_next()
        self.call_after_refresh(self._redraw)

    def _redraw(self) -> None:
        from verl_top.ui.app import VerlTopApp  # the app imports the panes

        app = self.app
        if not isinstance(app, VerlTopApp) or not self.display:
            return
        if app.pane(app.visible_step()) is self and app.screen is self.screen:
            app.redraw()  # with the header: both from the same store
        else:
            self.refresh_pane(app.store, app.assessment)

    def force_next(self) -> None:
        """Make the next ``refresh_pane`` redraw the content even if the store is unchanged."""
        self._seen_version = -1
