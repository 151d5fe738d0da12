"""A DataTable whose cost follows what is on screen, not how many rows it holds.

``VirtualRows`` keeps one DataTable row per key (so keys, the cursor, Enter on a row, sorting
and scrolling all stay the DataTable's own), but builds and writes the cells of the rows in the
visible window only (plus a margin). A row that scrolls into view is built at that moment; a
row off screen keeps whatever it showed last, which nobody can see. A new row starts as a
placeholder holding its identifying cells, so ordering works before it is first built.

Per refresh the cost is: one order compare over all keys (a re-sort only when the order moved),
and ``build`` + a cell diff for the ~screen-height rows shown. 1024 or 4096 GPUs cost about what
50 do.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from verl_top.ui.widgets import Column, cell_width, fit_columns, table_cell

MARGIN = 8  # rows built above and below the visible window (a few key presses of scroll)
REBUILD_SHARE = 0.5  # above this share of new keys the table is cleared and re-added


class VirtualRows:
    """Keeps ``table`` showing the given keys in the given order; cells built when visible.

    ``ident(key)`` returns the identifying cells (their text must be unique per key), used as
    the placeholder and for ordering through ``DataTable.sort``; ``build(key)`` the row's cells.
    With ``Column`` specs, ``fit`` chooses the shown columns and their widths from the rows on
    screen only (as ``TableSync.fit`` does from every row), so fitting costs what drawing does.
    """

    def __init__(
        self,
        table: DataTable,
        columns: Sequence[str] | Sequence[Column],
        id_columns: int = 1,
        margin: int = MARGIN,
    ) -> None:
        self.table = table
        self.specs: list[Column] = [c for c in columns if isinstance(c, Column)]
        self.all_keys = [c.key if isinstance(c, Column) else c for c in columns]
        self.columns = list(self.all_keys)  # the keys shown, in order
        self._pick: list[int] | None = None  # indices of the shown columns in a full row
        self._layout: list[tuple[str, int]] = []
        self.on_overflow: Callable[[], None] | None = None  # a scrolled-in row needs a refit
        self._restore: tuple[str | None, tuple[float, float]] | None = None  # after a refit
        self.id_columns = id_columns
        self.margin = margin
        self.order: list[str] = []
        self.written: dict[str, tuple[Any, ...]] = {}  # key -> cells the table holds
        self.built: set[str] = set()  # keys whose cells are real (not a placeholder)
        self._build: Callable[[str], Sequence[Any]] | None = None
        self._fresh: set[str] = set()  # keys built for the current data
        self._pending = False  # cells written straight into the table await a repaint
        self._dirty: dict[str, set[str]] = {}  # those cells: row key -> column keys
        self.cell_updates = 0  # for tests and benchmarks
        self.rows_built = 0
        self.rebuilds = 0

    # -- the visible window ----------------------------------------------------------------

    def window(self) -> range:
        """Display positions of the rows on screen, plus the margin, clipped to the rows."""
        table = self.table
        if not table.display:
            return range(0)  # a folded table (pane 1's hosts) builds nothing
        n = len(self.order)
        top = int(table.scroll_offset.y)
        height = table.size.height
        # A table taller than its scrolling parent (height: auto) is clipped by the parent.
        parent = table.parent
        if isinstance(parent, Widget) and parent.is_scrollable:
            clip = parent.scrollable_content_region
            above = clip.y - table.region.y
            if above > 0:
                top += above
            height = min(height, max(0, clip.bottom - max(table.region.y, clip.y)))
        if height <= 0:
            height = table.app.size.height if table.is_mounted else 50
        header = 1 if table.show_header else 0
        first = max(0, top - header - self.margin)
        last = min(n, top + height + self.margin)
        return range(first, max(first, last))

    def visible_keys(self) -> list[str]:
        """Keys of the rows in the window, top to bottom."""
        return [self.order[i] for i in self.window()]

    def window_of(self, order: Sequence[str]) -> list[str]:
        """The keys that ``order`` would put in today's window (before ``sync`` shows it)."""
        saved, self.order = self.order, list(order)
        try:
            return self.visible_keys()
        finally:
            self.order = saved

    # -- fitting the columns -----------------------------------------------------------------

    def _needed(self, rows: Sequence[Sequence[Any]]) -> dict[str, int]:
        index = {k: i for i, k in enumerate(self.all_keys)}
        return {
            c.key: max((cell_width(cells[index[c.key]]) for cells in rows), default=0)
            for c in self.specs
            if c.kind != "flex"
        }

    def fit(self, avail: int, rows: Sequence[Sequence[Any]]) -> list[str]:
        """Fit the columns to ``avail`` cells for ``rows`` (the full cells of the rows on
        screen): the shown keys. A changed choice or width rebuilds the table's columns; the
        next ``sync`` re-adds the rows (placeholders, the visible ones built)."""
        if not self.specs or avail <= 0:
            return self.columns
        layout = [(c.key, w) for c, w in fit_columns(self.specs, avail, self._needed(rows))]
        if layout != self._layout:
            self._layout = layout
            labels = {c.key: c.label for c in self.specs}
            index = {k: i for i, k in enumerate(self.all_keys)}
            # Clearing the columns drops the rows, the cursor and the scroll: the next sync puts
            # them back, so a refit caused by scrolling keeps the rows the user scrolled to.
            self._restore = (self._cursor_key(), (self.table.scroll_x, self.table.scroll_y))
            self.table.clear(columns=True)
            for key, width in layout:
                self.table.add_column(labels[key], key=key, width=width)
            self.columns = [k for k, _ in layout]
            self._pick = [index[k] for k in self.columns]
            self.written = {}
            self.built = set()
            self.order = []
        return self.columns

    def widths(self) -> dict[str, int]:
        """Width of each shown column after ``fit``."""
        return dict(self._layout)

    def _overflows(self, cells: Sequence[Any]) -> bool:
        """A number wider than its fitted column (only a refit may show it whole)."""
        widths = dict(self._layout)
        return any(
            c.kind == "num" and c.key in widths and cell_width(v) > widths[c.key]
            for c, v in zip(self.specs, cells, strict=False)
        )

    # -- sync ------------------------------------------------------------------------------

    def sync(
        self,
        keys: Sequence[str],
        ident: Callable[[str], Sequence[Any]],
        build: Callable[[str], Sequence[Any]],
    ) -> None:
        """Show ``keys`` in this order; (re)build the visible rows with ``build``."""
        table = self.table
        order = list(keys)
        self._build = build
        self._fresh = set()
        wanted = set(order)
        new = [k for k in order if k not in self.written]
        gone = [k for k in self.written if k not in wanted]
        if len(new) + len(gone) > REBUILD_SHARE * max(1, len(order)) and self.written:
            self._rebuild(order, ident)
        else:
            for key in gone:
                table.remove_row(key)
                del self.written[key]
                self.built.discard(key)
            for key in new:
                cells = self._placeholder(ident(key))
                table.add_row(*map(table_cell, cells), key=key)
                self.written[key] = cells
            if order != self.order or new:
                position = {self._ident(ident(k)): i for i, k in enumerate(order)}
                table.sort(key=lambda row: position.get(self._ident(row), len(position)))
        self.order = order
        if self._restore is not None:
            cursor_key, scroll = self._restore
            self._restore = None
            self._put_back(cursor_key, scroll)
        self.fill()

    def _cursor_key(self) -> str | None:
        table = self.table
        if table.row_count and table.cursor_row < table.row_count:
            return table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        return None

    def _put_back(self, cursor_key: str | None, scroll: tuple[float, float]) -> None:
        """Cursor on the same key (when still shown) and the scroll position as they were."""
        table = self.table
        if cursor_key in self.written:
            table.move_cursor(row=table.get_row_index(cursor_key), animate=False, scroll=False)
        table.scroll_to(*scroll, animate=False, immediate=True)

    def fill(self) -> None:
        """Build and write the rows now in the window that were not built for this data
        (called after ``sync`` and whenever the table or its parent scrolls or resizes)."""
        build = self._build
        if build is None:
            return
        overflow = False
        pick = self._pick
        for key in self.visible_keys():
            if key in self._fresh:
                continue
            self._fresh.add(key)
            full = tuple(build(key))
            self.rows_built += 1
            if self._layout and not overflow:
                overflow = self._overflows(full)
            cells = full if pick is None else tuple(full[i] for i in pick)
            old = self.written.get(key)
            self.built.add(key)
            if old == cells:
                continue
            changes = [
                (col, new_value)
                for col, new_value, old_value in zip(self.columns, cells, old or (), strict=False)
                if new_value != old_value
            ]
            self._write(key, changes)
            self.written[key] = cells
        if self._pending:
            self._flush()
        if overflow and self.on_overflow is not None:
            self.on_overflow()

    def _write(self, key: str, changes: list[tuple[str, Any]]) -> None:
        """Write changed cells. ``DataTable.update_cell`` repaints the whole widget per cell
        (~0.1 ms each, ×250 cells per tick); with the table's data dict at hand the cells are
        stored and the table repainted once (``_flush``), else cell by cell."""
        self.cell_updates += len(changes)
        data = getattr(self.table, "_data", None)
        if not isinstance(data, dict) or key not in data or self.columns[0] not in data[key]:
            for col, value in changes:
                self.table.update_cell(key, col, table_cell(value))
            return
        row = data[key]
        dirty = self._dirty.setdefault(key, set())
        for col, value in changes:
            row[col] = table_cell(value)
            dirty.add(col)
        self._pending = True

    def _flush(self) -> None:
        """Repaint the cells written by ``_write``: only them and their rows' lines when the
        table's render caches are the ones ``forget_cells`` knows, else the whole table (a new
        cache generation)."""
        self._pending = False
        dirty, self._dirty = self._dirty, {}
        table = self.table
        if forget_cells(table, dirty):
            return
        if isinstance(getattr(table, "_update_count", None), int):
            table._update_count += 1  # the render caches are keyed by it
        table.refresh()

    def _placeholder(self, ids: Sequence[Any]) -> tuple[Any, ...]:
        ids = tuple(ids)[: self.id_columns]
        return ids + ("",) * (len(self.columns) - len(ids))

    def _ident(self, cells: Sequence[Any]) -> tuple[str, ...]:
        return tuple(str(c) for c in tuple(cells)[: self.id_columns])

    def _rebuild(self, order: list[str], ident: Callable[[str], Sequence[Any]]) -> None:
        """Most keys changed (filter typed, cluster reshaped): clear and re-add placeholders,
        keeping the cursor on the same key when it is still there."""
        table = self.table
        cursor_key = self._cursor_key()
        scroll = (table.scroll_x, table.scroll_y)
        table.clear(columns=False)
        self.written = {}
        self.built = set()
        for key in order:
            cells = self._placeholder(ident(key))
            table.add_row(*map(table_cell, cells), key=key)
            self.written[key] = cells
        self.rebuilds += 1
        self._put_back(cursor_key, scroll)

    def keys_in_order(self) -> list[str]:
        """Row keys as the table shows them, top to bottom (read back from the table)."""
        table = self.table
        return [
            table.coordinate_to_cell_key(Coordinate(i, 0)).row_key.value or ""
            for i in range(table.row_count)
        ]


@dataclass(frozen=True)
class _CacheLayout:
    """How one of DataTable's render caches keys its entries (Textual 8): tuples of ``size``
    items, the one at ``row`` (of type ``kind``) naming the row, the one at ``generation`` the
    table's ``_update_count`` when it was drawn, and for cells the one at ``column`` naming the
    column."""

    attr: str
    size: int
    row: int
    kind: type
    generation: int
    column: int | None = None


# Cells keyed (row key, column key, ..., generation, ...), a row's lines (row key, line, ...,
# generation, ...), rows' renderables (generation, row index), the table's lines (y, x1, x2,
# width, ..., generation, ...).
_RENDER_CACHES = (
    _CacheLayout("_cell_render_cache", 8, 0, RowKey, generation=6, column=1),
    _CacheLayout("_row_render_cache", 10, 0, RowKey, generation=8),
    _CacheLayout("_row_renderable_cache", 2, 1, int, generation=0),
    _CacheLayout("_line_cache", 11, 0, int, generation=9),
)


def forget_cells(table: DataTable, cells: Mapping[str, Collection[str]]) -> bool:
    """Drop what ``table`` cached of ``cells`` (row key -> column keys whose values were
    written into its data) and of their rows' lines, and repaint those rows' lines only.

    ``DataTable.update_cell`` starts a new cache generation instead: every cell and line of the
    table is drawn again (through Rich's padding and styling, ~0.1 ms a cell) when one changed.
    On a node watching one job, a second's samples change a third of pane 1's cells and the
    redraw of the rest was the TUI's largest cost (issue 30).

    False when the table's caches are not laid out as this knows (another Textual, fixed rows):
    the caller must then start a new generation and repaint the whole table (what was dropped
    by then belonged to the old generation, which nothing reads again)."""
    caches: list[LRUCache[Any, Any]] = []
    for layout in _RENDER_CACHES:
        cache = getattr(table, layout.attr, None)
        if not isinstance(cache, LRUCache):
            return False
        caches.append(cache)
    offsets = getattr(table, "_y_offsets", None)
    generation = getattr(table, "_update_count", None)
    if table.fixed_rows or not isinstance(offsets, list) or not isinstance(generation, int):
        return False  # (fixed rows do not scroll: their lines are not where this counts them)
    if not cells:
        return True
    header = table.header_height if table.show_header else 0
    indices = [table.get_row_index(row) for row in cells if row in table.rows]
    if len(offsets) == table.row_count:  # every row one line high: a row's line is its index
        ys = [i + header for i in indices]
    else:
        ys = [y + header for y, (row, _) in enumerate(offsets) if row in cells]
    # per cache: the rows whose entries go, with the columns that go (None: the whole row)
    wanted: list[Mapping[Any, Collection[str] | None]] = [
        cells,
        dict.fromkeys(cells),
        dict.fromkeys(indices),
        dict.fromkeys(ys),
    ]
    for layout, cache, rows in zip(_RENDER_CACHES, caches, wanted, strict=True):
        if not _forget(cache, layout, rows, generation):
            return False
    top = int(table.scroll_offset.y)
    shown = range(top + header, top + table.size.height)
    width = max(table.virtual_size.width, table.size.width)
    regions = [Region(0, y - top, width, 1) for y in ys if y in shown]
    if regions:  # (no region at all would repaint the whole table)
        table.refresh(*regions)
    return True


def _forget(
    cache: LRUCache[Any, Any],
    layout: _CacheLayout,
    rows: Mapping[Any, Collection[str] | None],
    generation: int,
) -> bool:
    """Discard the entries of ``cache`` for ``rows`` (what names a row in ``layout``: its key's
    text, its index or a line -> the columns whose entries go, None: all of them), and those
    of generations before ``generation`` (nothing reads them again: without this the caches
    fill up to their size, 10,000 cells, and every pass reads them all). False, at the first
    key not laid out as ``layout`` says, when the cache is not what this knows.

    Runs over every entry each refresh (a few hundred for pane 1's screen): kept to plain type
    checks and lookups of strings and ints (a ``RowKey``'s own hash is Python code)."""
    size, at, kind, col_at, gen_at = (
        layout.size,
        layout.row,
        layout.kind,
        layout.column,
        layout.generation,
    )
    drop = []
    for key in cache.keys():
        if not isinstance(key, tuple) or len(key) != size or not isinstance(key[at], kind):
            return False
        if key[gen_at] != generation:
            if not isinstance(key[gen_at], int):
                return False
            drop.append(key)
            continue
        row = key[at].value if kind is RowKey else key[at]
        if row not in rows:
            continue
        cols = rows[row]
        if cols is not None and col_at is not None:
            col = key[col_at]
            if not isinstance(col, ColumnKey):
                return False
            if col.value not in cols:
                continue
        drop.append(key)
    for key in drop:
        cache.discard(key)
    return True


def plain_ids(*parts: Any) -> tuple[Text, ...]:
    """Identifying cells as plain ``Text`` (never markup)."""
    return tuple(Text(str(p)) for p in parts)
