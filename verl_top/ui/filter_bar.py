"""The host/GPU filter (key ``/``): a one-line input that narrows pane 1's rows and pane 4's grid.

The filter is a case-insensitive substring of ``host``, ``host/N`` or ``host:gpuN``, so
``node02`` keeps one node, ``gpu7`` keeps GPU 7 of every node and ``node02/7`` keeps one GPU.
Enter keeps the filter, hides the bar and gives the keys back to the panes; while a filter is
kept the header shows it (``filter node02``), so rows missing from a table are never a mystery.
``/`` edits it again; Esc clears it.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input


def gpu_labels(host: str, index: int | None) -> tuple[str, ...]:
    """The texts a filter is matched against for one host or one GPU."""
    if index is None:
        return (host.lower(),)
    h = host.lower()
    return (f"{h}/{index}", f"{h}:gpu{index}", f"{h} gpu{index}")


def matches_filter(text: str, host: str, index: int | None = None) -> bool:
    """True when ``host`` (or its GPU ``index``) passes the filter ``text`` (empty: all)."""
    needle = text.strip().lower()
    if not needle:
        return True
    return any(needle in label for label in gpu_labels(host, index))


def host_matches(text: str, host: str, gpu_indexes: list[int]) -> bool:
    """A host row is kept when its name or any of its GPUs passes the filter."""
    return matches_filter(text, host) or any(matches_filter(text, host, i) for i in gpu_indexes)


class FilterBar(Input):
    """The ``/`` input; hidden until ``/`` is pressed, and while no filter is set."""

    HELP_TITLE = "Filter bar (/)"

    DEFAULT_CSS = """
    FilterBar {
        display: none;
        height: 1;
        border: none;
        padding: 0 1;
        background: $panel;
    }
    FilterBar.-shown {
        display: block;
    }
    FilterBar:focus {
        border: none;
        background: $boost;
    }
    """
    BINDINGS = [
        Binding("escape", "clear_filter", "Clear filter", show=True),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(
            placeholder="filter hosts/GPUs: node02, gpu7, node02/7 (Enter: keep · Esc: clear)",
            **kwargs,  # type: ignore[arg-type]
        )
        # Not focusable while hidden: the screen's auto-focus would pick it and swallow keys.
        self.can_focus = False

    def open(self) -> None:
        """Show the bar and type into it (focused now, not after a refresh: keys typed right
        after ``/`` must land in the bar, not act as pane keys)."""
        self.add_class("-shown")
        self.can_focus = True
        self.screen.set_focus(self)

    def action_clear_filter(self) -> None:
        """Esc: clear the filter, hide the bar and give the keys back to the panes."""
        self.value = ""
        self._hide()
        self._apply("")

    def on_input_changed(self, event: Input.Changed) -> None:
        """Every keystroke narrows the rows at once."""
        event.stop()
        self._apply(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter: keep the filter (the header shows it) and give the keys back to the panes."""
        event.stop()
        self._hide()

    def _hide(self) -> None:
        self.remove_class("-shown")
        self.can_focus = False
        focus_main = getattr(self.app, "focus_main", None)
        self.screen.set_focus(None)
        if callable(focus_main):
            focus_main()  # the table again, so arrows, j/k and Enter act at once

    def _apply(self, text: str) -> None:
        setter = getattr(self.app, "set_host_filter", None)
        if callable(setter):
            setter(text)
