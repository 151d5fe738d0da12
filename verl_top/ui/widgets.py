"""Small building blocks shared by the panes: formatting, text sparklines, findings, table diffing.

Everything here is cheap and free of I/O: the panes call these at every refresh.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual.color import Color
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Static, TabbedContent, TabPane

from verl_top.assessment import Assessment
from verl_top.diagnosis.findings import Check, Finding, worth_text
from verl_top.store_summary import DEAD_STATES, IDLE_THRESHOLD
from verl_top.untrusted import clean_text, is_clean

if TYPE_CHECKING:
    from verl_top.store import GpuEntry, HostEntry

DASH = "—"  # shown for a value the device or node does not provide (never 0)
SPARK_CHARS = "▁▂▃▄▅▆▇█"
GAP_SHARE = 0.05  # a sparkline gap shorter than this share of its window is not shown
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


def spark_cells(values: Sequence[float], width: int) -> list[float]:
    """``values`` as exactly ``width`` cells: buckets take their mean when there are more
    values than cells, a value spans several cells when there are fewer (the line fills the
    width it is given)."""
    n = len(values)
    if not n or width <= 0:
        return []
    if n > width:
        # Prefix sums: a wide sparkline (the History column takes the spare width) costs one
        # pass over the values, not one per cell.
        sums = [0.0, *itertools.accumulate(values)]
        bounds = [k * n // width for k in range(width + 1)]
        return [(sums[hi] - sums[lo]) / (hi - lo) for lo, hi in itertools.pairwise(bounds)]
    return [values[k * n // width] for k in range(width)]


def spark_level(value: float, top: float = 100.0) -> int:
    """Index into ``SPARK_CHARS`` of ``value`` on a 0..top scale (clipped)."""
    last = len(SPARK_CHARS) - 1
    i = int(value * last / top + 0.5) if top > 0 else 0
    return 0 if i < 0 else last if i > last else i


def sparkline(values: Sequence[float], width: int = 16, top: float = 100.0) -> str:
    """A text sparkline of ``values`` (0..top, no NaN) filling ``width`` cells."""
    if top <= 0:
        return ""
    return "".join(SPARK_CHARS[spark_level(v, top)] for v in spark_cells(values, width))


class LineText(Text):
    """A one-line ``Text`` that draws itself straight to segments when it fits its width.

    Rich draws a ``Text`` by wrapping it into lines, justifying them, joining them back and
    sorting span edges (~50 µs for a 5-character cell); pane 1 draws ~650 cells per frame and a
    60-cell gradient sparkline has ~40 spans. When the text is one printable line no wider than
    the cell and its spans do not overlap, the segments are computed directly and are exactly
    those ``Text`` gives (tests/test_sparkline_render.py compares them); otherwise (wrapping,
    cropping, tabs, overlapping spans) ``Text``'s own path draws it."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterable[Segment]:
        plain = self.plain
        width = options.max_width
        if (
            cell_len(plain) > width
            or not plain.isprintable()
            or (self.overflow or options.overflow) == "ignore"  # Rich then skips justifying
            or not _ordered(self._spans, len(plain))
        ):
            yield from super().__rich_console__(console, options)
            return
        justify = self.justify or options.justify or "default"
        spans = self._spans
        if justify == "left":
            plain += " " * (width - cell_len(plain))
        elif justify in ("right", "center"):
            plain = plain.rstrip()
            if len(plain) < len(self.plain):  # what Text.rstrip does to spans past the end
                size = len(plain)
                spans = [Span(a, min(b, size), st) for a, b, st in spans if a < size]
            gap = width - cell_len(plain)
            left = gap if justify == "right" else gap // 2
            plain = " " * left + plain + " " * (gap - left)
            spans = [Span(a + left, b + left, st) for a, b, st in spans] if left else spans
        yield from _segments(console, plain, spans, self.style)
        if self.end:
            yield Segment(self.end)


def _ordered(spans: Sequence[Span], size: int) -> bool:
    """True when ``spans`` are in order, inside ``[0, size]`` and do not overlap."""
    pos = 0
    for start, end, _ in spans:
        if start < pos or end < start or end > size:
            return False
        pos = end
    return True


def _segments(
    console: Console, plain: str, spans: Sequence[Span], style: str | Style
) -> Iterable[Segment]:
    """What ``Text.render`` yields for ``plain`` with a base ``style`` and ordered,
    non-overlapping ``spans``: one segment per stretch between span edges, in the base style
    combined with the span's (Rich cuts at every edge, empty spans included)."""
    if not spans and not style:
        yield Segment(plain)  # Text.render's own shortcut: no style at all, even when empty
        return
    null = Style.null()
    base = (console.get_style(style, default=null),) if style else ()
    outside = Style.combine((null, *base))
    combined: dict[str | Style, Style] = {}  # a sparkline's ~40 spans share <= 8 colours
    pos = 0
    for start, end, span_style in spans:
        if start > pos:
            yield Segment(plain[pos:start], outside)
        if end > start:
            own = combined.get(span_style)
            if own is None:
                own = Style.combine((null, *base, console.get_style(span_style, default=null)))
                combined[span_style] = own
            yield Segment(plain[start:end], own)
        pos = end
    if pos < len(plain):
        yield Segment(plain[pos:], outside)


RunText = LineText  # the gradient sparkline's name for it


def spark_text(
    values: Sequence[float],
    width: int,
    stops: Sequence[tuple[float, str]],
    palette: dict[str, str] | None = None,
    top: float = 100.0,
    cache: dict[tuple[int, int], str] | None = None,
    left: int = 0,
    total: int = 0,
) -> Text:
    """A sparkline whose every cell has its own colour on the gradient ``stops`` (0-100 scale;
    a dip shows red inside a green row, as in btop), after ``left`` blank cells and padded to
    ``total``. Cells of one level share one colour, so a row costs at most 8 colour blends
    (``cache``: kept across rows, keyed by scale and level); one span per run of a level."""
    colours = {} if cache is None else cache
    last = len(SPARK_CHARS) - 1
    scale = last / top if top > 0 else 0.0
    levels = [int(v * scale + 0.5) for v in spark_cells(values, width)]
    if levels and (min(levels) < 0 or max(levels) > last):  # clip once, not per cell
        levels = [0 if k < 0 else last if k > last else k for k in levels]
    line = " " * left + "".join(map(SPARK_CHARS.__getitem__, levels))
    palette_of = [_level_colour(k, stops, palette, colours) for k in range(last + 1)]
    # One span per run of a level: the run edges are where the level changes.
    edges = [i for i, (a, b) in enumerate(itertools.pairwise(levels), 1) if a != b]
    spans = [
        Span(left + a, left + b, palette_of[levels[a]])
        for a, b in itertools.pairwise([0, *edges, len(levels)])
        if b > a
    ]
    return RunText(line.ljust(total), spans=spans, no_wrap=True)


def window_spark(
    values: Sequence[float],
    times: Sequence[float],
    span: tuple[float, float],
    width: int,
    palette: dict[str, str] | None = None,
    stops: Sequence[tuple[float, str]] | None = None,
    style: str = "",
    top: float = 100.0,
    cache: dict[tuple[int, int], str] | None = None,
) -> Text:
    """A sparkline of a time window ``span`` (start, end) in ``width`` cells: the values (their
    sample ``times``, NaN left out of ``values``) fill the whole width when they cover the
    window; time the window holds no data for (a GPU seen only lately, a host down since)
    stays blank, since not seen is not 0. With ``stops`` each cell has its gradient colour,
    else the line has ``style``."""
    start, end = span
    if not values or not times or width <= 0:
        return Text("")
    window = max(end - start, 1e-9)

    def gap(seconds: float) -> int:  # gaps under GAP_SHARE of the window are sampling jitter
        share = seconds / window
        return 0 if share < GAP_SHARE else min(width, round(width * share))

    left, right = gap(times[0] - start), gap(end - times[-1])
    cells = max(1, width - left - right)
    left = min(left, width - cells)
    if stops is not None:
        return spark_text(values, cells, stops, palette, top, cache, left, width)
    line = (" " * left + sparkline(values, cells, top)).ljust(width)
    return Text(line, spans=[Span(left, left + cells, style)] if style else [], no_wrap=True)


def _level_colour(
    level: int,
    stops: Sequence[tuple[float, str]],
    palette: dict[str, str] | None,
    cache: dict[tuple[int, int], str],
) -> str:
    key = (id(stops), -1 - level)  # negative: apart from the per-value colours of the rows
    colour = cache.get(key)
    if colour is None:
        value = level * 100.0 / (len(SPARK_CHARS) - 1)
        colour = cache[key] = gradient(value, stops, palette)
    return colour


class TextSlots:
    """What was last put in each of a few ``Static`` widgets showing a ``Text``: ``show``
    updates one only when its text changed, and asks for a layout pass only when its size may
    have changed.

    ``Static.update`` reflows the whole screen and redraws what moved; status lines that say
    the same thing, or the same number of lines, every second were a large part of the TUI's
    CPU on a node watching one job (issue 30). (A layout pass for every update was tried as
    the cure for a stale header; its cause was a pane redrawn alone after a resize,
    ``VerlTopApp.redraw``, and the pass cost ~0.3 % of a core on the H200.)"""

    def __init__(self) -> None:
        self._shown: dict[Static, tuple[tuple[Any, ...], Text]] = {}  # (what it says, the Text)

    def show(self, widget: Static, text: Text) -> None:
        """Put ``text`` in ``widget`` unless it holds exactly that already."""
        key = (
            text.plain,
            tuple(text.spans),
            str(text.style),
            text.justify,
            text.overflow,
            text.no_wrap,
            text.end,
        )
        shown = self._shown.get(widget)
        if shown is not None and widget.content is not shown[1]:
            shown = None  # other code updated it since: what it shows is not known here
        if shown is not None and shown[0] == key:
            return
        self._shown[widget] = (key, text)
        layout = shown is None or _may_change_size(widget, shown[0][0], text.plain)
        widget.update(text, layout=layout)


def _may_change_size(widget: Static, old: str, new: str) -> bool:
    """False when ``widget`` showing ``new`` instead of ``old`` keeps its size: as many lines,
    none wrapping (lines longer than the widget wrap unless its style says nowrap: a Static
    draws a Text as Content, the Text's own no_wrap does not decide), and no width of its own
    made from its text. A widget not laid out yet (width 0) needs its layout pass."""
    width = widget.content_size.width
    if old.count("\n") != new.count("\n") or width <= 0:
        return True
    old_widths = [cell_len(line) for line in old.split("\n")]
    new_widths = [cell_len(line) for line in new.split("\n")]
    styles = widget.styles
    if styles.width is not None and styles.width.is_auto:
        return max(old_widths) != max(new_widths)
    return styles.text_wrap != "nowrap" and max(old_widths + new_widths) > width


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


def gradient(
    value: float | None,
    stops: Sequence[tuple[float, str]],
    palette: dict[str, str] | None = None,
) -> str:
    """Colour of ``value`` on a scale of (value, palette key) stops, blended between the two
    around it (colours from the theme, so every theme applies): more says more than 3 flat
    colours. Missing values are muted."""
    tv = palette or {}
    fallback = {"error": "#ff4444", "warning": "#ffaa00", "success": "#44bb44", "accent": "#4488ff"}
    if missing(value):
        return tv.get("muted", tv.get("text-muted", "dim"))
    assert value is not None

    def colour(key: str) -> Color:
        try:
            return Color.parse(tv.get(key, fallback.get(key, "#888888")))
        except Exception:  # noqa: BLE001 - an odd theme value falls back to grey
            return Color.parse("#888888")

    if value <= stops[0][0]:
        return colour(stops[0][1]).hex
    for (v0, k0), (v1, k1) in zip(stops, stops[1:], strict=False):
        if value <= v1:
            return colour(k0).blend(colour(k1), (value - v0) / (v1 - v0)).hex
    return colour(stops[-1][1]).hex


# Scales: activity (low is waste), temperature (°C, hot is bad), memory used (% of total).
ACTIVITY_STOPS = ((0.0, "error"), (IDLE_THRESHOLD, "warning"), (90.0, "success"))
TEMP_STOPS = ((40.0, "success"), (70.0, "warning"), (90.0, "error"))
MEMORY_STOPS = ((0.0, "accent"), (80.0, "success"), (95.0, "warning"), (100.0, "error"))


def activity_style(value: float | None, theme_vars: dict[str, str] | None = None) -> str:
    """Colour for a GPU activity value: a gradient from the theme's error (0 %) over warning
    (50 %, the idle threshold) to success (90 % and more)."""
    return gradient(value, ACTIVITY_STOPS, theme_vars)


def step_findings(assessment: Assessment | None, step: int) -> list[Finding]:
    """The findings of one step, worst first (empty before any assessment)."""
    return [] if assessment is None else assessment.step_findings(step)


def step_checks(assessment: Assessment | None, step: int) -> list[Check]:
    """The checks of one step."""
    return [] if assessment is None else assessment.step_checks(step)


def render_finding(finding: Finding, theme_vars: dict[str, str] | None = None) -> Text:
    """One finding: severity-coloured title, its evidence lines, its worth and the advice."""
    tv = theme_vars or {}
    level = severity_class(finding.severity)
    colour = tv.get(level if level != "info" else "accent", severity_style(finding.severity))
    text = Text()
    text.append("● ", style=colour)
    text.append(clean_text(finding.title), style=f"bold {colour}")
    text.append(f"  [{finding.rule} · severity {finding.severity:.2f}]", style="dim")
    for line in finding.evidence:
        text.append(f"\n    {clean_text(line)}")  # evidence quotes foreign values
    if worth := worth_text(finding):
        text.append(f"\n    {clean_text(worth)}", style="bold")
    advice = finding.advice
    if advice:
        text.append("\n    → ", style=colour)
        text.append(clean_text(advice), style="italic")
    return text


def render_finding_line(
    finding: Finding, more: int, theme_vars: dict[str, str] | None = None
) -> Text:
    """A finding on one line (a dense pane): title, how many more, the first evidence and the
    advice; what does not fit ends in ``…`` (``d`` shows every finding in full)."""
    tv = theme_vars or {}
    level = severity_class(finding.severity)
    colour = tv.get(level if level != "info" else "accent", severity_style(finding.severity))
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("● ", style=colour)
    text.append(clean_text(finding.title), style=f"bold {colour}")
    if more:
        text.append(f" (+{more} more, d: all)", style="bold")
    if finding.evidence:
        text.append(" · " + clean_text(finding.evidence[0]))  # evidence quotes foreign values
    if finding.advice:
        text.append(" → ", style=colour)
        text.append(clean_text(finding.advice), style="italic")
    text.append(f"  [{finding.rule}]", style="dim")
    return text


def render_step_findings(
    assessment: Assessment | None,
    step: int,
    theme_vars: dict[str, str] | None = None,
    compact: bool = False,
) -> RenderableType:
    """The findings block at the top of a pane (``compact``: the worst one on one line)."""
    if assessment is None or assessment.verdict is None:
        return Text("reading: no diagnosis yet", style="dim")
    findings = assessment.step_findings(step)
    checks = assessment.step_checks(step)
    if findings and compact:
        return render_finding_line(findings[0], len(findings) - 1, theme_vars)
    if not findings:
        passed = sum(1 for c in checks if c.status == "passed")
        no_data = [c for c in checks if c.status == "no_data"]
        msg = Text(f"No finding for step {step}", style="bold")
        msg.append(f" ({passed} checks passed, {len(no_data)} without data", style="dim")
        msg.append("; press d for details)" if checks else ")", style="dim")
        if compact:
            msg.no_wrap, msg.overflow = True, "ellipsis"
        return msg
    return Group(*(render_finding(f, theme_vars) for f in findings))


class FindingsBox(Static):
    """The findings of one step at the top of its pane; re-rendered only when the verdict changes."""

    DEFAULT_CSS = """
    FindingsBox { height: auto; max-height: 12; padding: 0 1; }
    """

    def __init__(self, step: int, compact: bool = False, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.step = step
        self.compact = compact  # one line: the worst finding and how many more (pane 1)
        self._verdict_id: int | None = -1
        self._slot = TextSlots()  # a verdict that words the findings alike changes nothing

    def show(self, assessment: Assessment | None, theme_vars: dict[str, str] | None = None) -> None:
        """Render the step's findings if the verdict changed (one object per evaluation)."""
        verdict = assessment.verdict if assessment is not None else None
        vid = None if verdict is None else id(verdict)
        if vid == self._verdict_id:
            return
        self._verdict_id = vid
        findings = step_findings(assessment, self.step)
        worst = max((float(f.severity) for f in findings), default=None)
        for level in ("error", "warning", "info"):
            self.set_class(worst is not None and severity_class(worst) == level, f"-{level}")
        content = render_step_findings(assessment, self.step, theme_vars, self.compact)
        if isinstance(content, Text):
            self._slot.show(self, content)
        else:
            self.update(content)


CELL_PAD = 2  # DataTable's cell padding: one column each side
REQUIRED = 10  # columns of this priority are never dropped (the table scrolls sideways)


@dataclass(frozen=True)
class Column:
    """A DataTable column that can be fitted to the width it gets.

    ``kind``: ``num`` is as wide as its widest cell (a number is never cut); ``text`` is as wide
    as its widest cell between ``width`` and ``max_width``, longer cells end in ``…``; ``flex``
    starts at ``width`` and takes the spare width up to ``max_width`` (a sparkline, a reason,
    a command line). ``priority``: when the table does not fit, the lowest goes first; columns
    of priority ``REQUIRED`` stay.
    """

    key: str
    label: str
    width: int
    priority: int = 5
    kind: str = "num"
    max_width: int = 0


def cell_width(value: Any) -> int:
    """Printed width of a cell (a str, a Text, a number); ASCII is counted by ``len`` (fast:
    this runs for every cell of a 1000-GPU table)."""
    text = value.plain if isinstance(value, Text) else str(value)
    return len(text) if text.isascii() else cell_len(text)


def fit_columns(
    columns: Sequence[Column], avail: int, needed: dict[str, int] | None = None
) -> list[tuple[Column, int]]:
    """The columns to show in ``avail`` cells and their widths.

    Each column first gets its natural width (``needed``: widest cell per key); while they do
    not fit, the lowest-priority column is dropped (the last one among equals); spare width then
    goes to the flex columns, in order, up to their ``max_width``.
    """
    needed = needed or {}

    def natural(c: Column) -> int:
        want = max(cell_len(c.label), needed.get(c.key, 0))
        if c.kind == "num":
            return max(c.width, want)
        if c.kind == "text":
            return max(c.width, min(want, c.max_width or want))
        return max(c.width, cell_len(c.label))

    shown = [(c, natural(c)) for c in columns]
    while sum(w + CELL_PAD for _, w in shown) > avail:
        optional = [i for i, (c, _) in enumerate(shown) if c.priority < REQUIRED]
        if not optional:
            break  # only required columns left: the table scrolls sideways
        del shown[min(optional, key=lambda i: (shown[i][0].priority, -i))]
    spare = avail - sum(w + CELL_PAD for _, w in shown)
    out = []
    for c, w in shown:
        if c.kind == "flex" and spare > 0:
            grow = min(spare, max(0, (c.max_width or w + spare) - w))
            w += grow
            spare -= grow
        out.append((c, w))
    return out


def label_width(label: str) -> int:
    """Printed width of a column label (its widest line: labels may take two lines)."""
    return max(cell_len(line) for line in label.split("\n"))


def fit_names(
    columns: Sequence[Column], needed: dict[str, int], avail: int, gap: int = 2
) -> list[tuple[Column, int]]:
    """Widths for a Rich table whose ``text`` columns hold names (servers, models, hosts).

    Numbers take their natural width and are never cut; names take theirs whenever the table
    fits in ``avail`` cells. Only when it does not are names cut (each ends in ``…``), the
    longest first, down to their ``width``; if even then it is too wide, the lowest-priority
    column goes (``gap``: cells between two columns)."""
    shown = [
        (c, max(label_width(c.label), needed.get(c.key, 0), c.width if c.kind == "num" else 0))
        for c in columns
    ]

    def over() -> int:
        return sum(w for _, w in shown) + gap * max(0, len(shown) - 1) - avail

    while (excess := over()) > 0:
        cuttable = [i for i, (c, w) in enumerate(shown) if c.kind == "text" and w > c.width]
        if cuttable:
            i = max(cuttable, key=lambda k: shown[k][1])
            c, w = shown[i]
            # The longest name down to the next-longest (names shrink together), by at most
            # the excess, never below its floor: each pass takes at least one cell.
            second = max((shown[k][1] for k in cuttable if k != i), default=c.width)
            shown[i] = (c, max(c.width, w - excess, min(second, w - 1)))
            continue
        optional = [i for i, (c, _) in enumerate(shown) if c.priority < REQUIRED]
        if not optional:
            break
        del shown[min(optional, key=lambda i: (shown[i][0].priority, -i))]
    return shown


def ellipsis_cell(value: Any) -> Any:
    """A text cell that ends in ``…`` when its column is narrower than the text."""
    text = value if isinstance(value, Text) else Text(clean_text(value))
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class TableSync:
    """Keeps a DataTable equal to a list of rows by diffing: only changed cells are written.

    Rows are addressed by a stable key; rows that vanish are removed, new ones added, and the
    table is re-sorted only when the order asked for differs from the one shown. The first
    ``id_columns`` cells of a row must identify it (their text is used to sort by our own order
    through the public ``DataTable.sort``, which only sees cell values).
    """

    def __init__(
        self,
        table: DataTable,
        columns: Sequence[str] | Sequence[Column],
        id_columns: int = 1,
    ) -> None:
        self.table = table
        self.specs: list[Column] = [c for c in columns if isinstance(c, Column)]
        self.all_keys = [c.key if isinstance(c, Column) else c for c in columns]
        self.columns = list(self.all_keys)  # the keys shown, in order
        self._pick: list[int] | None = None  # indices of the shown columns in a full row
        self._layout: list[tuple[str, int]] = []
        self.id_columns = id_columns
        self.rows: dict[str, tuple[Any, ...]] = {}
        self.order: list[str] = []
        self.cell_updates = 0  # for tests and benchmarks
        self.rebuilds = 0

    def _ident(self, cells: Sequence[Any]) -> tuple[str, ...]:
        return tuple(str(c) for c in cells[: self.id_columns])

    def fit(self, avail: int, rows: Sequence[tuple[str, Sequence[Any]]]) -> list[str]:
        """Fit the columns (``Column`` specs) to ``avail`` cells for these rows: the shown keys.

        The table's columns are rebuilt only when the choice or a width changes (a resize, a
        wider number); rows are then re-added by the next ``sync``.
        """
        if not self.specs or avail <= 0:
            return self.columns
        index = {k: i for i, k in enumerate(self.all_keys)}
        needed: dict[str, int] = {}
        for c in self.specs:
            if c.kind == "flex":
                continue
            i = index[c.key]
            needed[c.key] = max((cell_width(cells[i]) for _, cells in rows), default=0)
        layout = [(c.key, w) for c, w in fit_columns(self.specs, avail, needed)]
        if layout != self._layout:
            self._layout = layout
            labels = {c.key: c.label for c in self.specs}
            self.table.clear(columns=True)
            for key, width in layout:
                self.table.add_column(labels[key], key=key, width=width)
            self.columns = [k for k, _ in layout]
            self._pick = [index[k] for k in self.columns]
            self.rows = {}
            self.order = []
        return self.columns

    def widths(self) -> dict[str, int]:
        """Width of each shown column after ``fit``."""
        return dict(self._layout)

    def sync(self, rows: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Make the table show ``rows`` (key, cells) in the given order."""
        table = self.table
        wanted: dict[str, tuple[Any, ...]] = {}
        pick = self._pick
        for key, cells in rows:
            wanted[key] = tuple(cells) if pick is None else tuple(cells[i] for i in pick)
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
            cursor_key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
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
            table.coordinate_to_cell_key(Coordinate(i, 0)).row_key.value or ""
            for i in range(table.row_count)
        ]


class StepTabs(TabbedContent):
    """The five panes' tabs, ignoring a stale "a widget in this pane was focused" message.

    Textual activates the pane of a programmatically focused widget through a queued message.
    Keys pressed in quick succession under load (3 then 4) could see pane 3's message handled
    after the 4 had moved the focus into pane 4: pane 3 came back and stayed (the tmux
    walk-through waited 30 s for pane 4 on a loaded CI run)."""

    def _on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        focused = self.screen.focused
        if focused is not None and event.tab_pane not in focused.ancestors_with_self:
            event.prevent_default()  # Textual's handler would activate the stale pane
            event.stop()
