"""A DataTable that draws its one-line text cells without Rich's general layout pass.

DataTable draws every cell it has not cached through ``Styled(Padding(cell))`` and
``Console.render_lines``: options copied three times, two passes that split and crop lines,
generators at each level, and a new meta style (the cell's row and column, for the mouse) per
cell. At 4096 GPUs pane 1 draws ~630 new cells a second, and that was ~40 % of a frame (issue
30: frames must not hold the loop for 50 ms).

``FastCellTable`` draws a ``Text`` cell on a row one line high itself, with the calls that
general pass ends in: the cell's own ``__rich_console__`` (wrapping, justification, tabs are
the Text's), its first line cut or padded by ``Segment.adjust_line_length``, and the styles
applied by ``Segment.apply_style`` as ``Styled`` does. With no fixed columns and no shown
labels it also composes a row's line itself, reads the table's and rows' styles once per
drawing pass, and does not measure new rows when every column has a set width. Anything else
(the header, labels, fixed rows or columns, a renderable that is not ``Text``, a row of more
than one line) goes to DataTable's own code. tests/test_fast_cells.py checks that both give
the same segments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import App
from textual.cache import LRUCache
from textual.color import Color
from textual.coordinate import Coordinate
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

META_CACHE = 4096  # (row, column) meta styles kept: a few screens of cells
OPTIONS_KEPT = 256  # cells' inner options kept (one per column width and screen size)


def plain_cell_line(
    console: Console,
    cell: object,
    options: ConsoleOptions,
    padding: int,
    pre: Style,
    post: Style,
) -> list[Segment] | None:
    """The segments DataTable draws for ``cell`` on a row one line high, or None when the
    cell needs the general pass. ``options``: those of the cell's inside (its column's width
    less ``padding`` each side, one line high, no wrapping); ``pre``/``post``: the styles
    ``Styled`` puts before and after the cell's own."""
    inner = options.max_width
    if not isinstance(cell, Text) or inner < 1:
        return None
    line: list[Segment] = []
    for segment in cell.__rich_console__(console, options):  # what Console.render calls
        if not isinstance(segment, Segment):
            return None  # (a Text yields segments only; a subclass might not)
        if "\n" in segment.text and not segment.control:
            before = segment.text.partition("\n")[0]  # the first line is all that is shown
            if before:
                line.append(Segment(before, segment.style))
            break
        line.append(segment)
    null = Style.null()  # Padding's style, and that of the padding of the inner line
    line = Segment.adjust_line_length(line, inner, style=null, pad=True)
    if padding:
        line.insert(0, Segment(" " * padding, null))
        line.append(Segment(" " * padding, null))
    return list(Segment.apply_style(line, style=pre, post_style=post))


def inner_options(options: ConsoleOptions, width: int, padding: int) -> ConsoleOptions:
    """What a cell's inside is rendered with: DataTable's options for a one-line cell
    ``width`` wide, then Padding's for its inside."""
    one_line = options.update_dimensions(width, 1).update(no_wrap=True)
    return one_line.update_width(width - 2 * padding).update_height(1)


class FastCellTable(DataTable[Any]):
    """DataTable drawing one-line ``Text`` cells through ``plain_cell_line`` (same segments,
    several times cheaper); everything else is DataTable's own, caches included."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._metas: LRUCache[tuple[int, int], Style] = LRUCache(META_CACHE)
        self._options: dict[tuple[int, int, Size], ConsoleOptions] = {}
        self._pass_styles: dict[object, Style] | None = None  # while the lines are drawn
        self.fast_cells = 0  # cells drawn here (for tests and benchmarks)
        self.unmeasured_rows = 0  # new rows whose cells were not measured (for tests)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """DataTable's, without measuring the cells of new rows when every column has a set
        width: a column's measured width is read only when its width is automatic, and a new
        row of one line without a label changes nothing else here. 16384 placeholder rows (a
        cluster read from Prometheus) were measured in one callback: ~2.5 s with the loop held.
        Rows with a label or an automatic height still go through DataTable's own code."""
        columns = self.columns.values()
        if not columns or any(column.auto_width for column in columns):
            super()._update_dimensions(new_rows)
            return
        rows = self.rows
        new_rows = list(new_rows)
        rest = [
            key
            for key in new_rows
            if key in rows and (rows[key].label is not None or rows[key].auto_height)
        ]
        self.unmeasured_rows += len(new_rows) - len(rest)
        super()._update_dimensions(rest)  # (with none: the table's virtual size, as always)

    def render_lines(self, crop: Region) -> list[Strip]:
        """DataTable's, with the table's and its rows' styles read once for all the lines
        drawn in this pass (per line, each walked the DOM for its colours: ~15 % of it)."""
        self._pass_styles = {}
        try:
            return super().render_lines(crop)
        finally:
            self._pass_styles = None

    @property
    def rich_style(self) -> Style:
        """DOMNode's, read once per pass of ``render_lines`` (nothing restyles meanwhile)."""
        memo = self._pass_styles
        if memo is None:
            return super().rich_style
        style = memo.get("table")
        if style is None:
            style = memo["table"] = super().rich_style
        return style

    def _get_row_style(self, row_index: int, base_style: Style) -> Style:
        memo = self._pass_styles
        if memo is None:
            return super()._get_row_style(row_index, base_style)
        # What DataTable's answer depends on: header, fixed row, or stripe parity.
        if row_index == -1:
            kind: object = "header"
        elif row_index < self.fixed_rows:
            kind = "fixed"
        else:
            kind = row_index % 2 if self.zebra_stripes else None
        key = ("row", kind, base_style)
        style = memo.get(key)
        if style is None:
            style = memo[key] = super()._get_row_style(row_index, base_style)
        return style

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Coordinate,
        hover_location: Coordinate,
    ) -> tuple[list[list[Segment]], list[list[Segment]]]:
        """DataTable's, for a table without fixed columns or shown labels (pane 1's): the same
        cells and the same filler, without what only those need (the header's and fixed cells'
        styles read per line, a ``Coordinate`` per cell) and with the filler's meta style kept
        per row. Otherwise DataTable's own."""
        if self.fixed_columns or (self._labelled_row_exists and self.show_row_labels):
            return super()._render_line_in_row(
                row_key, line_no, base_style, cursor_location, hover_location
            )
        cursor_type = self.cursor_type
        cache_key = (  # the key DataTable itself uses (Textual 8): one cache for both
            row_key,
            line_no,
            base_style,
            cursor_location,
            hover_location,
            cursor_type,
            self.show_cursor,
            self._show_hover_cursor,
            self._update_count,
            self._pseudo_class_state,
        )
        cache = self._row_render_cache
        cached = cache.get(cache_key)
        if cached is not None:
            return cached
        found = self._row_locations.get(row_key)
        row_index = -1 if found is None else found
        row_style = self._get_row_style(row_index, base_style)
        should_highlight = self._should_highlight
        render_cell = self._render_cell
        scrollable_row = []
        table_width = self._row_label_column_width
        for column_index, column in enumerate(self.ordered_columns):
            cell = (row_index, column_index)  # (compared as a Coordinate is: a tuple)
            width = column.get_render_width(self)
            table_width += width
            scrollable_row.append(
                render_cell(
                    row_index,
                    column_index,
                    row_style,
                    width,
                    cursor=should_highlight(cursor_location, cell, cursor_type),  # type: ignore[arg-type]
                    hover=should_highlight(hover_location, cell, cursor_type),  # type: ignore[arg-type]
                )[line_no]
            )
        remaining_space = max(0, self.size.width - table_width)
        scrollable_row.append(
            [
                Segment(
                    " " * remaining_space,
                    self._extend_style(row_index, row_style, cursor_location, hover_location),
                )
            ]
        )
        row_pair: tuple[list[list[Segment]], list[list[Segment]]] = ([], scrollable_row)
        cache[cache_key] = row_pair
        return row_pair

    def _extend_style(
        self, row_index: int, row_style: Style, cursor: Coordinate, hover_at: Coordinate
    ) -> Style:
        """The style of the filler right of the last column, as DataTable makes it."""
        if self.cursor_type == "row":
            hover = self._should_highlight(hover_at, Coordinate(row_index or 0, 0), "row")
            extend_style, _ = self._get_styles_to_render_cell(
                row_index == -1,
                False,
                False,
                hover,
                row_index == cursor.row,
                self.show_cursor,
                self._show_hover_cursor,
                False,
                False,
            )
            extend_style = row_style + extend_style
        elif row_style.bgcolor is not None:
            background_color = self.background_colors[1]
            faded_color = Color.from_rich_color(row_style.bgcolor).blend(
                background_color, factor=0.25
            )
            extend_style = Style.from_color(color=row_style.color, bgcolor=faded_color.rich_color)
        else:
            extend_style = Style.from_color(row_style.color, row_style.bgcolor)
        meta = self._metas.get((row_index, -2))
        if meta is None:
            meta = Style.from_meta({"row": row_index, "column": 0, "out_of_bounds": True})
            self._metas[(row_index, -2)] = meta
        return extend_style + meta

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        if row_index < 0 or column_index < 0 or self.fixed_rows or self.fixed_columns:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        # The key DataTable itself uses (Textual 8), so both fill and read one cache.
        cache_key = (
            row_key,
            column_key,
            base_style,
            cursor,
            hover,
            self._show_hover_cursor,
            self._update_count,
            self._pseudo_class_state,
        )
        cache = self._cell_render_cache
        cached = cache.get(cache_key)
        if cached is not None:
            return cached
        row = self.rows.get(row_key)
        lines = None
        if row is not None and row.height == 1:
            cells = self._get_row_renderables(row_index).cells
            if column_index < len(cells):
                lines = self._fast_cell(
                    cells[column_index], row_index, column_index, base_style, width, cursor, hover
                )
        if lines is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        cache[cache_key] = lines
        self.fast_cells += 1
        return lines

    def _fast_cell(
        self,
        cell: object,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool,
        hover: bool,
    ) -> list[list[Segment]] | None:
        component_style, post_style = self._get_styles_to_render_cell(
            False,
            False,
            False,
            hover,
            cursor,
            self.show_cursor,
            self._show_hover_cursor,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        meta = self._metas.get((row_index, column_index))
        if meta is None:  # (a new meta style per cell hashed its pickled dict each time)
            meta = Style.from_meta({"row": row_index, "column": column_index})
            self._metas[(row_index, column_index)] = meta
        app = self.app
        console = app.console
        padding = self.cell_padding
        options = self._inner_options(app, width, padding)
        pre = console.get_style(base_style + meta + component_style)
        line = plain_cell_line(console, cell, options, padding, pre, console.get_style(post_style))
        return None if line is None else [line]

    def _inner_options(self, app: App[Any], width: int, padding: int) -> ConsoleOptions:
        """The options DataTable's general pass gives a cell's inside (Padding's, in a row one
        line high): kept per width and screen size, not made four times per cell."""
        key = (width, padding, app.size)
        options = self._options.get(key)
        if options is None:
            options = inner_options(app.console_options, width, padding)
            if len(self._options) > OPTIONS_KEPT:
                self._options.clear()
            self._options[key] = options
        return options
