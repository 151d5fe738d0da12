"""FastCellTable draws exactly what DataTable draws (issue 30: pane 1's paint at 4096 GPUs).

Each test draws the same cells both ways, the table's own fast path and DataTable's general
``_render_cell`` (Styled + Padding + Console.render_lines), and compares the segments: text,
style and control, segment by segment."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.style import Style
from rich.text import Text
from test_ui_app import make_app, started
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import DataTable
from ui_data import build_store, load_trace, trace_sample

from verl_top.ui.fast_cells import FastCellTable, inner_options, plain_cell_line
from verl_top.ui.widgets import LineText

# Cells of every kind pane 1 and hostile data bring: plain and markup-looking strings, styled
# and spanned Text, justified Text, wide (CJK, emoji) and zero-width characters, tabs, new
# lines, trailing blanks, empty cells, cells longer than their column, numbers, None.
CELLS: list[Any] = [
    "42",
    "[b]bold[/b]",
    "a:b",
    "",
    None,
    3.14159,
    7,
    Text("plain"),
    Text("styled", style="bold red"),
    Text.assemble(("act ", "dim"), ("97%", "bold green"), " tail"),
    Text("right", justify="right"),
    Text("centre", justify="center"),
    Text("left", justify="left"),
    Text("GPU 显存 占用"),
    Text("emoji 🚀🔥 x"),
    Text("zero\u200bwidth\u200b  "),
    Text("tab\there"),
    Text("two\nlines"),
    Text("trailing blanks      "),
    Text("a much longer cell than its column can hold, cut"),
    Text(""),
    Text("", style="on blue"),
    Text("▁▂▃▄▅▆▇█", style="green"),
    Text("ends", end=""),
    Text("nowrap", no_wrap=False),
    Text("wraps at a blank", no_wrap=False),
    LineText("86%", justify="right"),
    LineText("1.2 GB/s", justify="right", style="bold"),
    LineText("centred", justify="center"),
    LineText("left", justify="left"),
    LineText("right   ", justify="right"),
    LineText.assemble(("▁▂▃", "green"), ("▄▅", "yellow"), ("▆▇█", "red")),
    LineText("overlapping", spans=[]).copy(),
    Text("full justify me", justify="full"),
    Text("crop me", overflow="crop"),
    Text("ellipsis cut here", overflow="ellipsis"),
]
WIDTHS = (2, 3, 6, 9, 14, 40)


class CellsApp(App[None]):
    CSS = "DataTable { height: 30; }"

    def compose(self) -> ComposeResult:
        yield FastCellTable(id="t", zebra_stripes=True)


def fill(table: DataTable, cells: list[Any], widths: tuple[int, ...]) -> None:
    """One column per width, one row per cell (the same cell across the row)."""
    for w in widths:
        table.add_column(f"w{w}", key=f"w{w}", width=w)
    for i, cell in enumerate(cells):
        table.add_row(*([cell] * len(widths)), key=f"r{i}")


def general(table: DataTable, *args: Any) -> list[list[Any]]:
    """What DataTable's own code draws for a cell (its cache emptied before and after)."""
    table._cell_render_cache.clear()
    lines = DataTable._render_cell(table, *args)
    table._cell_render_cache.clear()
    return [list(line) for line in lines]


def fast(table: FastCellTable, *args: Any) -> list[list[Any]]:
    table._cell_render_cache.clear()
    lines = table._render_cell(*args)
    table._cell_render_cache.clear()
    return [list(line) for line in lines]


async def test_every_kind_of_cell_is_drawn_as_datatable_draws_it() -> None:
    app = CellsApp()
    async with app.run_test(size=(120, 34)) as pilot:
        table = app.query_one(FastCellTable)
        fill(table, CELLS, WIDTHS)
        await pilot.pause()
        base = Style(bgcolor="black", color="white")
        compared = 0
        for row in range(len(CELLS)):
            for col, width in enumerate(WIDTHS):
                for cursor, hover in ((False, False), (True, False), (False, True)):
                    for padding in (0, 1, 2):
                        table.cell_padding = padding
                        args = (row, col, base, width + 2 * padding, cursor, hover)
                        assert fast(table, *args) == general(table, *args), (CELLS[row], width)
                        compared += 1
        assert compared == len(CELLS) * len(WIDTHS) * 9
        # The fast path drew most of them (the rest went to DataTable's own code): a table
        # where nothing took it would pass the comparison above and do nothing.
        assert table.fast_cells > compared // 3
        # The header row and a row label are DataTable's own (checked the same way).
        table.cell_padding = 1
        assert fast(table, -1, 0, base, 8) == general(table, -1, 0, base, 8)


@pytest.mark.parametrize("fixed_rows", [0, 1, 2])
async def test_rows_striped_fixed_and_under_the_cursor_look_as_datatable_draws_them(
    fixed_rows: int,
) -> None:
    """The styles read once per pass (the table's, each kind of row's) are the ones each
    line read for itself: header, fixed rows, both stripes, the cursor's row."""
    app = CellsApp()
    async with app.run_test(size=(120, 34)) as pilot:
        table = app.query_one(FastCellTable)
        fill(table, CELLS, (6, 12))
        table.fixed_rows = fixed_rows
        table.move_cursor(row=fixed_rows + 3)
        await pilot.pause()
        region = Region(0, 0, table.size.width, table.size.height)
        redraw_whole(table)
        fast_lines = [list(s) for s in table.render_lines(region)]
        with general_path(table):
            redraw_whole(table)
            general_lines = [list(s) for s in table.render_lines(region)]
        assert fast_lines == general_lines
        # both stripes, the header and the cursor's row are among the lines compared
        assert len({str(line[0].style) for line in fast_lines if line}) >= 4


@st.composite
def texts(draw: st.DrawFn) -> Text:
    """Text with random characters (ASCII, wide, zero-width, blanks), spans and styles."""
    alphabet = st.sampled_from(list("ab 9%·—\t\n") + ["显", "🚀", "\u200b", "é", "\u0301"])
    plain = "".join(draw(st.lists(alphabet, max_size=14)))
    styles = st.sampled_from(["", "bold", "dim", "red", "on blue", "bold green", "italic"])
    kind = draw(st.sampled_from([Text, LineText]))
    text = kind(
        plain,
        style=draw(styles),
        end=draw(st.sampled_from(["", "\n"])),
        justify=draw(st.sampled_from([None, "left", "right", "center", "full"])),
        overflow=draw(st.sampled_from([None, "fold", "crop", "ellipsis", "ignore"])),
        no_wrap=draw(st.sampled_from([None, True, False])),
    )
    for _ in range(draw(st.integers(0, 3))):
        a = draw(st.integers(0, len(plain)))
        b = draw(st.integers(a, len(plain)))
        text.stylize(draw(styles), a, b)
    return text


@given(cell=texts(), width=st.integers(1, 16), padding=st.integers(0, 2))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_text_is_drawn_as_rich_draws_it(cell: Text, width: int, padding: int) -> None:
    """``plain_cell_line`` against the general pass DataTable runs for a one-line cell."""
    from rich.console import Console
    from rich.padding import Padding
    from textual.renderables.styled import Styled

    console = Console(width=80, color_system="truecolor")
    pre, post = Style(color="white", bgcolor="black", meta={"row": 1}), Style(bold=True)
    options = console.options.update_dimensions(width + 2 * padding, 1).update(no_wrap=True)
    expected = console.render_lines(
        Styled(Padding(cell, (0, padding)), pre_style=pre, post_style=post), options
    )
    inside = inner_options(console.options, width + 2 * padding, padding)
    line = plain_cell_line(console, cell, inside, padding, pre, post)
    assert line is not None
    assert [line] == expected


@contextmanager
def general_path(table: DataTable) -> Iterator[None]:
    """Draw ``table`` through DataTable's own ``_render_cell``, ``_render_line_in_row`` and
    ``render_lines`` (no styles kept for a pass) while inside."""
    table._render_cell = lambda *a, **k: DataTable._render_cell(table, *a, **k)  # type: ignore[method-assign]
    table.render_lines = lambda crop: DataTable.render_lines(table, crop)  # type: ignore[method-assign]
    table._render_line_in_row = lambda *a, **k: DataTable._render_line_in_row(table, *a, **k)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del table._render_cell
        del table.render_lines
        del table._render_line_in_row


def redraw_whole(table: DataTable) -> None:
    table._update_count += 1  # a new cache generation: every cell drawn again
    table.refresh()


async def test_pane1_shows_what_datatable_would_show() -> None:
    """Pane 1 (24 GPUs of the real H200 trace, the cursor on a row) after new samples: the
    screen drawn through the fast path is the screen DataTable's own drawing gives."""
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        assert isinstance(table, FastCellTable)
        rows = load_trace()
        t = store.now + 1.0
        for k, gpu in enumerate(list(store.iter_gpus())):
            store.ingest(trace_sample(rows[(k * 31) % len(rows)], gpu.host, gpu.index, t, True), t)
        app.refresh_now()
        table.move_cursor(row=3)
        await pilot.pause()
        drawn = table.fast_cells
        redraw_whole(table)
        await pilot.pause()
        region = Region(0, 0, table.size.width, table.size.height)
        fast_lines = [list(s) for s in table.render_lines(region)]
        # Nearly every body cell on screen went through the fast path.
        assert table.fast_cells - drawn >= 0.9 * len(table.columns) * min(
            table.row_count, table.size.height - 1
        )
        shot = app.export_screenshot()
        with general_path(table):
            redraw_whole(table)
            await pilot.pause()
            assert [list(s) for s in table.render_lines(region)] == fast_lines
            assert app.export_screenshot() == shot


class Nested(Text):
    """A Text subclass yielding a renderable, not segments: left to the general pass."""

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        yield Text(self.plain)


def test_a_cell_that_yields_renderables_is_left_to_datatable() -> None:
    from rich.console import Console

    console = Console(width=80)
    inside = inner_options(console.options, 12, 1)
    assert plain_cell_line(console, Nested("x"), inside, 1, Style(), Style()) is None
    assert plain_cell_line(console, "x", inside, 1, Style(), Style()) is None  # not formatted


class TwoTablesApp(App[None]):
    """A FastCellTable and a plain DataTable of the same size, one above the other."""

    CSS = "DataTable { height: 14; }"

    def compose(self) -> ComposeResult:
        yield FastCellTable(id="fast", zebra_stripes=True)
        yield DataTable(id="plain", zebra_stripes=True)


def many_rows(table: DataTable, widths: tuple[int | None, ...], rows: int, labels: bool) -> None:
    for i, width in enumerate(widths):
        table.add_column(f"c{i}", key=f"c{i}", width=width)
    for r in range(rows):
        cells = [f"r{r}", Text(f"{r * 7 % 100}%"), "x" * (r % 9)][: len(widths)]
        table.add_row(*cells, key=f"r{r}", label=f"L{r}" if labels and r % 50 == 0 else None)


@pytest.mark.parametrize(
    ("widths", "labels", "measured"),
    [
        ((6, 5, 4), False, False),  # every width set: new rows are not measured
        ((6, 5, 4), True, False),  # labelled rows are (by DataTable), the rest not
        ((6, None, 4), False, True),  # an automatic width: DataTable measures every row
    ],
)
async def test_new_rows_are_measured_only_where_a_width_depends_on_them(
    widths: tuple[int | None, ...], labels: bool, measured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16384 placeholder rows were measured cell by cell in one callback (~2.5 s, issue 30);
    a column of set width never reads what was measured. The table then looks the same as a
    DataTable that measured them, scrolled to its end too."""
    import textual.widgets._data_table as data_table

    calls = 0
    measure = data_table.measure

    def counted(*args: Any, **kwargs: Any) -> int:
        nonlocal calls
        calls += 1
        return measure(*args, **kwargs)

    app = TwoTablesApp()
    async with app.run_test(size=(60, 30)) as pilot:
        fast = app.query_one("#fast", FastCellTable)
        plain = app.query_one("#plain", DataTable)
        monkeypatch.setattr(data_table, "measure", counted)
        many_rows(fast, widths, 300, labels)
        await pilot.pause()
        fast_calls, calls = calls, 0
        many_rows(plain, widths, 300, labels)
        await pilot.pause()
        assert calls >= 300 * len(widths)  # DataTable measures every new cell
        if measured:
            assert fast_calls >= 300 and fast.unmeasured_rows == 0
        else:
            assert fast.unmeasured_rows == 300 - (6 if labels else 0)
            # (the column labels, measured as the columns are added, and the labelled rows)
            assert fast_calls <= len(widths) + (6 * (len(widths) + 1) if labels else 0)
        app.set_focus(None)  # (a focused table draws its header otherwise)
        for y in (0, 290):
            for table in (fast, plain):
                table.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            region = Region(0, 0, plain.size.width, plain.size.height)
            assert [list(s) for s in fast.render_lines(region)] == [
                list(s) for s in plain.render_lines(region)
            ]
            assert fast.virtual_size == plain.virtual_size
