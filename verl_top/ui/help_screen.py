"""The help screen (key ``?``): every key of every screen, generated from the bindings.

Nothing here is a hand-written list of keys: the tables are built from the ``BINDINGS`` of the
app, of every screen and widget class defined in ``verl_top.ui``, and of the tables, so the
help stays true when a key is added, moved or removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static

MOUSE_HELP = (
    ("click a tab", "show that step's pane"),
    ("click a column header", "GPU table: sort by it (click again: reverse)"),
    ("click a row", "select it (Enter acts on the selected row)"),
    ("wheel", "scroll the pane or table under the pointer"),
)


@dataclass(frozen=True)
class KeyRow:
    """One line of the help: the key as shown in the footer, and what it does."""

    key: str
    description: str
    action: str


def _title(cls: type) -> str:
    """A scope's title: the class's HELP_TITLE, else its docstring's first line."""
    title = getattr(cls, "HELP_TITLE", None)
    if title:
        return str(title)
    doc = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
    return doc.split(". ")[0].split("; ")[0].rstrip(".")


def _own_classes(base: type[DOMNode]) -> Iterator[type[DOMNode]]:
    """Subclasses of ``base`` (recursively) defined in verl-top's UI package."""
    seen: set[type[DOMNode]] = set()
    stack: list[type[DOMNode]] = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("verl_top.ui") and "BINDINGS" in vars(cls):
            yield cls


def binding_rows(app: App, cls: type[DOMNode], inherited: bool = True) -> list[KeyRow]:
    """The keys of ``cls`` (with its bases' when ``inherited``), one row per action.

    Several keys bound to one action and description are joined (``q, ctrl+q``).
    """
    bindings = cls._merged_bindings if inherited else BindingsMap(cls.BINDINGS)  # noqa: SLF001
    merged: dict[tuple[str, str], list[str]] = {}
    if bindings is None:
        return []
    for items in bindings.key_to_bindings.values():
        for binding in items:
            if binding.system and not binding.description:
                continue
            desc = binding.description or binding.action
            display = app.get_key_display(binding)
            merged.setdefault((desc, binding.action), [])
            if display not in merged[(desc, binding.action)]:
                merged[(desc, binding.action)].append(display)
    return [KeyRow(", ".join(keys), desc, action) for (desc, action), keys in merged.items()]


def help_sections(app: App) -> list[tuple[str, list[KeyRow]]]:
    """(title, rows) for the app, each verl-top screen and widget with keys, and the tables."""
    sections: list[tuple[str, list[KeyRow]]] = [
        ("Main screen (the five panes)", binding_rows(app, type(app)))
    ]
    for cls in sorted(_own_classes(Screen), key=lambda c: c.__name__):
        sections.append((_title(cls), binding_rows(app, cls, inherited=False)))
    for cls in sorted(_own_classes(Widget), key=lambda c: c.__name__):
        if issubclass(cls, Screen):
            continue
        sections.append((_title(cls), binding_rows(app, cls, inherited=False)))
    sections.append(("Tables (host and GPU rows)", binding_rows(app, DataTable, inherited=False)))
    return [(title, rows) for title, rows in sections if rows]


def render_help(app: App) -> RenderableType:
    """The help text: one key table per section, then the mouse."""
    parts: list[RenderableType] = [
        Text("verl-top keys", style="bold underline"),
        Text(
            "The footer shows the main keys of the screen you are on; ctrl+p searches commands.\n"
        ),
    ]
    for title, rows in help_sections(app):
        parts.append(Text(title, style="bold underline"))
        parts.append(_key_table([(row.key, row.description) for row in rows]))
        parts.append(Text(""))
    parts.append(Text("Mouse", style="bold underline"))
    parts.append(_key_table(list(MOUSE_HELP)))
    return Group(*parts)


def _key_table(rows: list[tuple[str, str]]) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, expand=False)
    table.add_column("key", style="bold", min_width=22, no_wrap=True)
    table.add_column("does")
    for key, does in rows:
        table.add_row(key, does)
    return table


class HelpScreen(ModalScreen[None]):
    """Help: every key."""

    HELP_TITLE = "Help screen (?)"
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 90%;
        max-width: 110;
        height: 90%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "Close help"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(render_help(self.app), id="help-text")
        yield Footer(show_command_palette=False)

    def action_close(self) -> None:
        """Back to the screen below."""
        self.dismiss(None)


__all__ = ["HelpScreen", "KeyRow", "binding_rows", "help_sections", "render_help"]
