"""Small building blocks shared by the panes: formatting, text sparklines, findings, table diffing.

Everything here is cheap and free of I/O: the panes call these at every refresh.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import DataTable, Static

from verl_top.store_summary import DEAD_STATES, IDLE_THRESHOLD
from verl_top.untrusted import clean_text, is_clean

if TYPE_CHECKING:
    from verl_top.store import GpuEntry, HostEntry

DASH = "—"  # shown for a value the device or node does not provide (never 0)
SPARK_CHARS = "▁▂▃▄▅▆▇█"
STEP_NAMES = {
    1: "Throughput & GPU",
    2: "Communication",
    3: "Dataflow",
    4: "Parallelism & mapping",
    5: "Config & scheduling",
}
REBUILD_SHARE = 0.3  # above this share of changed cells a table is rebuilt, not diffed
# IDLE_THRESHOLD (% mean activity over the window below which a GPU counts as idle) and
# DEAD_STATES (host states in which nothing new arrives: greyed, left out of live counts) are
# the store summary's, so the counts it shares and the rows drawn here agree.


def as_text(value: Any) -> Any:
    """A cell or line for Rich or Textual: strings become ``Text``, so they are never markup.

    Foreign text (process titles, log lines, host names, config values) routinely holds ``[...]``
    (Hydra overrides such as ``data.train_files=[/x]``): read as markup it would raise
    ``MarkupError`` or turn ``[link=...]`` into a live hyperlink.
    """
    return Text(clean_text(value)) if isinstance(value, str) else value


def table_cell(value: Any) -> Any:
    """``as_text`` for DataTable cells, leaving strings without ``[`` or ``:`` as they are.

    DataTable reads a ``str`` cell as markup (and ``:name:`` as an emoji); a plain number string
    cannot be either, and skipping the ``Text`` keeps 1000-GPU tables cheap. Escapes and
    controls are removed here too (``clean_text``), for data that reached the UI without passing
    the trust boundary.
    """
    if isinstance(value, str) and ("[" in value or ":" in value or not is_clean(value)):
        return Text(clean_text(value))
    return value


def add_plain_row(table: Any, *cells: Any, **kwargs: Any) -> None:
    """``table.add_row`` (Rich Table or DataTable) with every string cell as plain ``Text``."""
    table.add_row(*(as_text(c) for c in cells), **kwargs)


def missing(value: float | None) -> bool:
    """True for None and NaN (the store keeps missing points as NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_num(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    """Format a measurement, or the dash when it is missing."""
    if missing(value):
        return DASH
    return fmt.format(value) + unit


def fmt_bytes_rate(bps: float | None) -> str:
    """Bytes per second in a short human unit."""
    if missing(bps):
        return DASH
    assert bps is not None
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def fmt_age(seconds: float | None) -> str:
    """A short age: 3s, 5m, 2h."""
    if missing(seconds):
        return DASH
    assert seconds is not None
    seconds = max(0.0, seconds)
    if seconds < 100:
        return f"{seconds:.0f}s"
    if seconds < 6000:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def host_state_style(state: str, palette: dict[str, str]) -> str:
    """Colour of a host's state: green when up, red when dead, yellow in between."""
    if state == "up":
        return palette.get("success", "green")
    if state in DEAD_STATES:
        return palette.get("error", "red")
    return palette.get("warning", "yellow")


def gpu_total(h: HostEntry, g: GpuEntry, field: str) -> float | None:
    """A GPU's ``mem_total_mib`` or ``power_limit_w``: latest sample first, else the hello.

    0 counts as unknown (it is never a real total or limit, and would divide by zero).
    """
    value = getattr(g.latest, field, None) if g.latest is not None else None
    if value:
        return float(value)
    if h.hello is not None:
        for info in h.hello.gpus:
            if info.index == g.index:
                v = getattr(info, field, None)
                return float(v) if v else None
    return None


def host_mem_total(h: HostEntry) -> float | None:
    """A host's memory total in bytes: latest host sample first, else the hello."""
    total = h.latest.mem_total_bytes if h.latest is not None else None
    return total or (h.hello.mem_total_bytes if h.hello else None)


def sparkline(values: Sequence[float], width: int = 16, top: float = 100.0) -> str:
    """A text sparkline of ``values`` (0..top, no NaN) in ``width`` cells; buckets take their mean."""
    n = len(values)
    if not n or top <= 0:
        return ""
    if n > width:
        cells = []
        for k in range(width):
            lo, hi = k * n // width, (k + 1) * n // width
            cells.append(sum(values[lo:hi]) / (hi - lo))
    else:
        cells = list(values)
    last = len(SPARK_CHARS) - 1
    scale = last / top
    return "".join(SPARK_CHARS[min(last, max(0, int(v * scale + 0.5)))] for v in cells)


def severity_class(severity: float | None) -> str:
    """CSS-ish level name of a finding severity: error / warning / info."""
    if severity is None:
        return "info"
    if severity >= 0.7:
        return "error"
    if severity >= 0.4:
        return "warning"
    return "info"


def severity_style(severity: float | None) -> str:
    """Rich style name for a severity, resolved by the app from the current theme."""
    return {"error": "bold red", "warning": "yellow", "info": "cyan"}[severity_class(severity)]


def activity_style(value: float | None, theme_vars: dict[str, str] | None = None) -> str:
    """Colour for a GPU activity value: theme error below 20 %, warning below 50 %, else success."""
    tv = theme_vars or {}
    if missing(value):
        return tv.get("text-muted", "dim")
    assert value is not None
    if value < 20:
        return tv.get("error", "red")
    if value < IDLE_THRESHOLD:
        return tv.get("warning", "yellow")
    return tv.get("success", "green")


def step_findings(verdict: Any, step: int) -> list[Any]:
    """The verdict's findings of one step, worst first (empty without a verdict)."""
    if verdict is None:
        return []
    found = [f for f in getattr(verdict, "findings", []) or [] if getattr(f, "step", None) == step]
    return sorted(found, key=lambda f: -float(getattr(f, "severity", 0.0) or 0.0))


def step_checks(verdict: Any, step: int) -> list[Any]:
    """The verdict's checks of one step."""
    if verdict is None:
        return []
    return [c for c in getattr(verdict, "checks", []) or [] if getattr(c, "step", None) == step]


def render_finding(finding: Any, theme_vars: dict[str, str] | None = None) -> Text:
    """One finding: severity-coloured title, its evidence lines and the advice."""
    tv = theme_vars or {}
    level = severity_class(getattr(finding, "severity", None))
    colour = tv.get(level if level != "info" else "accent", severity_style(finding.severity))
    text = Text()
    text.append("● ", style=colour)
    text.append(clean_text(getattr(finding, "title", "")), style=f"bold {colour}")
    text.append(
        f"  [{getattr(finding, 'rule', '')} · severity {finding.severity:.2f}]", style="dim"
    )
    for line in getattr(finding, "evidence", []) or []:
        text.append(f"\n    {clean_text(line)}")  # evidence quotes foreign values
    advice = getattr(finding, "advice", "")
    if advice:
        text.append("\n    → ", style=colour)
        text.append(clean_text(advice), style="italic")
    return text


def render_step_findings(
    verdict: Any, step: int, theme_vars: dict[str, str] | None = None
) -> RenderableType:
    """The findings block at the top of a pane."""
    if verdict is None:
        return Text("Diagnosis: collecting…", style="dim")
    findings = step_findings(verdict, step)
    checks = step_checks(verdict, step)
    if not findings:
        passed = sum(1 for c in checks if getattr(c, "status", "") == "passed")
        no_data = [c for c in checks if getattr(c, "status", "") == "no_data"]
        msg = Text(f"No finding for step {step}", style="bold")
        msg.append(f" ({passed} checks passed, {len(no_data)} without data", style="dim")
        msg.append("; press d for details)" if checks else ")", style="dim")
        return msg
    return Group(*(render_finding(f, theme_vars) for f in findings))


class FindingsBox(Static):
    """The findings of one step at the top of its pane; re-rendered only when the verdict changes."""

    DEFAULT_CSS = """
    FindingsBox { height: auto; max-height: 12; padding: 0 1; }
    """

    def __init__(self, step: int, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.step = step
        self._verdict_id: int | None = -1

    def show(self, verdict: Any, theme_vars: dict[str, str] | None = None) -> None:
        """Render the step's findings if the verdict object changed."""
        vid = None if verdict is None else id(verdict)
        if vid == self._verdict_id:
            return
        self._verdict_id = vid
        findings = step_findings(verdict, self.step)
        worst = max((float(f.severity) for f in findings), default=None)
        for level in ("error", "warning", "info"):
            self.set_class(worst is not None and severity_class(worst) == level, f"-{level}")
        self.update(render_step_findings(verdict, self.step, theme_vars))


class TableSync:
    """Keeps a DataTable equal to a list of rows by diffing: only changed cells are written.

    Rows are addressed by a stable key; rows that vanish are removed, new ones added, and the
    table is re-sorted only when the order asked for differs from the one shown. The first
    ``id_columns`` cells of a row must identify it (their text is used to sort by our own order
    through the public ``DataTable.sort``, which only sees cell values).
    """

    def __init__(self, table: DataTable, columns: Sequence[str], id_columns: int = 1) -> None:
        self.table = table
        self.columns = list(columns)
        self.id_columns = id_columns
        self.rows: dict[str, tuple[Any, ...]] = {}
        self.order: list[str] = []
        self.cell_updates = 0  # for tests and benchmarks
        self.rebuilds = 0

    def _ident(self, cells: Sequence[Any]) -> tuple[str, ...]:
        return tuple(str(c) for c in cells[: self.id_columns])

    def sync(self, rows: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Make the table show ``rows`` (key, cells) in the given order."""
        table = self.table
        wanted: dict[str, tuple[Any, ...]] = {}
        for key, cells in rows:
            wanted[key] = tuple(cells)
        order = list(wanted)
        changes: list[tuple[str, str, Any]] = []
        for key, cells in wanted.items():
            old = self.rows.get(key)
            if old is None or old == cells:
                continue
            for col, new_value, old_value in zip(self.columns, cells, old, strict=False):
                if new_value != old_value:
                    changes.append((key, col, new_value))
        if len(changes) > REBUILD_SHARE * max(1, len(wanted) * len(self.columns)):
            self._rebuild(wanted)
            return
        for key in [k for k in self.rows if k not in wanted]:
            table.remove_row(key)
            del self.rows[key]
        added = False
        for key, cells in wanted.items():
            if key not in self.rows:
                table.add_row(*map(table_cell, cells), key=key)
                added = True
            self.rows[key] = cells
        for key, col, value in changes:
            table.update_cell(key, col, table_cell(value))
        self.cell_updates += len(changes)
        if order != self.order or added:
            position = {self._ident(wanted[k]): i for i, k in enumerate(order)}
            table.sort(key=lambda row: position.get(self._ident(row), len(position)))
            self.order = order

    def _rebuild(self, wanted: dict[str, tuple[Any, ...]]) -> None:
        """Most cells changed: clear and re-add (cheaper than per-cell updates), keeping the
        cursor on the same row and the scroll position."""
        table = self.table
        cursor_key = None
        if table.row_count and table.cursor_row < table.row_count:
            cursor_key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        scroll = (table.scroll_x, table.scroll_y)
        table.clear(columns=False)
        for key, cells in wanted.items():
            table.add_row(*map(table_cell, cells), key=key)
        self.rows = dict(wanted)
        self.order = list(wanted)
        self.rebuilds += 1
        if cursor_key in wanted:
            table.move_cursor(row=table.get_row_index(cursor_key), animate=False, scroll=False)
        table.scroll_to(*scroll, animate=False, immediate=True)

    def keys_in_order(self) -> list[str]:
        """Row keys as the table shows them, top to bottom."""
        table = self.table
        return [
            table.coordinate_to_cell_key((i, 0)).row_key.value or "" for i in range(table.row_count)
        ]
