"""What a refresh redraws (issue 30, the TUI on a node): only the table cells that changed and
their rows' lines, status lines only when their text changed (a layout pass only when their
height may have), tabs only when their mark changed. Each test also checks that the screen
shows exactly what a full redraw would."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from assessing import assessment_of
from rich.text import Text
from test_ui_app import dataflow_bottleneck, make_app, started
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable, Static, TabbedContent
from ui_data import build_store, load_trace, trace_sample, verl_steps

from verl_top.ui.panes.dataflow import (
    ROLLOUT_BY_NAME,
    STAGE_STYLE,
    UNKNOWN_STAGE,
    UNTIMED,
    stage_strip,
)
from verl_top.ui.virtual_table import VirtualRows, forget_cells
from verl_top.ui.widgets import TextSlots

COLUMNS = ("name", "a", "b")


class TableApp(App):
    """One DataTable, 8 lines high (a header and 7 rows on screen)."""

    CSS = "DataTable { height: 8; }"

    def compose(self) -> ComposeResult:
        yield DataTable(id="t")


def shown(table: DataTable) -> list[Strip]:
    """The table's lines as the compositor gets them (through the widget's line cache)."""
    return table.render_lines(Region(0, 0, table.size.width, table.size.height))


def texts(strips: list[Strip]) -> list[str]:
    return [s.text.rstrip() for s in strips]


def generations(table: DataTable) -> set[int]:
    """The table generations (``_update_count``) its render caches hold entries of."""
    return (
        {k[6] for k in table._cell_render_cache.keys()}
        | {k[8] for k in table._row_render_cache.keys()}
        | {k[0] for k in table._row_renderable_cache.keys()}
        | {k[9] for k in table._line_cache.keys()}
    )


def twelve_rows(table: DataTable) -> tuple[VirtualRows, dict[str, list[str]]]:
    """Rows r00..r11 of three columns in ``table`` through ``VirtualRows``: (rows, their
    values by key); values changed in place are written by ``sync_again``."""
    values = {f"r{i:02d}": [f"r{i:02d}", str(i), "x"] for i in range(12)}
    for col in COLUMNS:
        table.add_column(col, key=col, width=4)
    rows = VirtualRows(table, COLUMNS, id_columns=1, margin=0)
    sync_again(rows, values)
    return rows, values


def sync_again(rows: VirtualRows, values: dict[str, list[str]]) -> None:
    """One refresh of ``rows`` from ``values`` (every key, in order)."""
    rows.sync(list(values), lambda k: (k,), lambda k: values[k])


async def drawn_anew(table: DataTable, pilot: Any) -> list[Strip]:
    """The table's lines once drawn whole, the old way (a new cache generation)."""
    table._update_count += 1
    table.refresh()
    await pilot.pause()
    return shown(table)


async def test_a_changed_cell_redraws_its_row_only_and_the_table_reads_as_if_drawn_anew() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(DataTable)
        rows, values = twelve_rows(table)
        await pilot.pause()
        table.scroll_to(y=3, animate=False, immediate=True)  # rows r03.. on screen
        await pilot.pause()
        rows.fill()
        await pilot.pause()
        before = [table.render_line(y) for y in range(table.size.height)]
        values["r04"][2] = "NEW"  # line 2 of the table (header, r03, r04)
        values["r07"][1] = "77"  # line 5
        sync_again(rows, values)
        await pilot.pause()
        after = [table.render_line(y) for y in range(table.size.height)]
        screen = texts(shown(table))
        # What earlier generations drew (columns and rows added, the sort) went with the pass:
        # the caches hold the current generation only, they do not fill up to their size.
        assert generations(table) == {table._update_count}
        # The untouched rows' lines are the ones drawn before, not drawn again ...
        assert [y for y in range(len(after)) if after[y] is not before[y]] == [2, 5]
        # ... and the screen shows the new cells where they are, after scrolling
        assert "NEW" in screen[2] and "77" in screen[5] and screen[1].startswith(" r03")
        # ... exactly as a table drawn anew (a new cache generation, the old way) shows it.
        anew = await drawn_anew(table, pilot)
        assert [list(s) for s in after] == [list(s) for s in anew]
        assert texts(anew) == screen


async def test_rows_of_more_than_one_line_are_found_by_their_lines() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col, width=4)
        for i in range(
            6
        ):  # r02 is two lines high: r04 is on line 6 (header, r00, r01, r02 x2, r03)
            table.add_row(f"r{i:02d}", str(i), "x", key=f"r{i:02d}", height=2 if i == 2 else 1)
        await pilot.pause()
        before = texts(shown(table))
        table._data["r04"]["a"] = "NEW"  # written as VirtualRows writes it
        assert forget_cells(table, {"r04": {"a"}}) is True
        await pilot.pause()
        screen = texts(shown(table))
        assert "NEW" in screen[6] and "NEW" not in before[6]
        assert [y for y in range(len(screen)) if screen[y] != before[y]] == [6]
        assert texts(await drawn_anew(table, pilot)) == screen


def _unknown_line_cache(table: DataTable) -> None:
    """Another Textual: the line cache is a plain dict (DataTable works with one)."""
    table._line_cache = {}  # type: ignore[assignment]


def _unknown_cell_key(table: DataTable) -> None:
    """Another Textual: a cell cache key laid out otherwise (one item more)."""
    table._cell_render_cache.set(("r00", "a", None, False, False, False, 0, None, "new"), [])


def _fixed_row(table: DataTable) -> None:
    """A fixed row does not scroll: its lines are not where ``forget_cells`` counts them."""
    table.fixed_rows = 1


@pytest.mark.parametrize("unknown", [_unknown_line_cache, _unknown_cell_key, _fixed_row])
async def test_a_table_whose_caches_are_not_the_known_ones_is_repainted_whole(
    unknown: Callable[[DataTable], None],
) -> None:
    app = TableApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(DataTable)
        rows, values = twelve_rows(table)
        await pilot.pause()
        assert forget_cells(table, {}) is True  # the known caches
        unknown(table)
        await pilot.pause()
        assert forget_cells(table, {"r01": {"a"}}) is False
        generation = table._update_count
        values["r01"][1] = "NEW"
        sync_again(rows, values)
        await pilot.pause()
        # The whole table was drawn anew (a new generation), showing the new cell ...
        assert table._update_count == generation + 1
        screen = texts(shown(table))
        assert "NEW" in screen[2]  # (header, r00, r01)
        # ... as a second full redraw shows it.
        assert texts(await drawn_anew(table, pilot)) == screen


async def test_pane1_after_new_samples_reads_as_a_full_redraw() -> None:
    store = build_store()  # the real H200 trace on 24 GPUs
    app = make_app(store)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        sync = app.throughput.gpu_sync
        assert sync is not None
        rows = load_trace()
        # Six GPUs move on by a second, twice: the first tick refits the columns (node01:3's
        # constructed throttle reason goes: a narrower column, the table laid out anew) ...
        for tick in (1, 2):
            generation, written = table._update_count, sync.cell_updates
            t = store.now + 1.0
            for k, gpu in enumerate(list(store.iter_gpus())[:6]):
                row = rows[(k * 97 + tick * 13) % len(rows)]
                store.ingest(trace_sample(row, gpu.host, gpu.index, t, gpm=True), received=t)
            app.refresh_now()
            await pilot.pause()
        # ... the second writes its changed cells without a new cache generation.
        assert sync.cell_updates > written and table._update_count == generation
        screen = texts(shown(table))
        shot = app.export_screenshot()
        assert texts(await drawn_anew(table, pilot)) == screen
        assert app.export_screenshot() == shot


class StatusApp(App):
    """A status line in a container of automatic height, as the header's."""

    CSS = "Vertical { height: auto; } Static { width: 30; }"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", id="line")


def spied(line: Static) -> tuple[list[bool], Callable[..., None]]:
    """Record each ``line.update``'s ``layout`` flag: (those flags, the update itself)."""
    calls: list[bool] = []
    update = line.update

    def spy(content: Any = "", *, layout: bool = True) -> None:
        calls.append(layout)
        update(content, layout=layout)

    line.update = spy  # type: ignore[method-assign]
    return calls, update


async def test_a_status_line_is_redrawn_only_when_its_text_changes_and_reflowed_when_its_size_may() -> (  # noqa: E501
    None
):
    """Same text: nothing done. New text of the same size: a repaint, no layout pass (the
    layout pass every second was ~0.3 % of a core on the H200). New size: reflowed."""
    app = StatusApp()
    async with app.run_test(size=(40, 10)) as pilot:
        line = app.query_one("#line", Static)
        calls, update = spied(line)
        slots = TextSlots()
        slots.show(line, Text("step 12 · 3.1 s"))
        await pilot.pause()
        slots.show(line, Text("step 12 · 3.1 s"))  # the same: nothing to do
        slots.show(line, Text("step 13 · 3.0 s"))  # one line again: a repaint, no reflow
        await pilot.pause()
        assert calls == [True, False] and str(line.content) == "step 13 · 3.0 s"
        slots.show(line, Text("step 13", style="bold"))  # a style is a change too
        slots.show(line, Text("lead: rollout\nraise max_num_seqs"))  # two lines: reflowed
        await pilot.pause()
        assert calls == [True, False, False, True] and line.size.height == 2
        slots.show(line, Text("x" * 45))  # one line that wraps at 30 cells: reflowed
        await pilot.pause()
        assert calls[-1] is True and line.size.height == 2
        slots.show(line, Text("short"))  # back from a wrapped line: reflowed to one line
        await pilot.pause()
        assert calls[-1] is True and line.size.height == 1
        line.styles.text_wrap = "nowrap"  # as pane 1's one-line findings and summary
        line.styles.text_overflow = "ellipsis"
        slots.show(line, Text("y" * 45))
        slots.show(line, Text("z" * 45))  # never wraps: a repaint
        await pilot.pause()
        assert calls[-1] is False and line.size.height == 1 and str(line.content) == "z" * 45
        update("other code wrote here")  # behind the slots' back: the next show is not skipped
        slots.show(line, Text("z" * 45))
        await pilot.pause()
        assert calls[-1] is True and str(line.content) == "z" * 45


class AutoWidthApp(App):
    """A status line as wide as its text."""

    CSS = "Static { width: auto; }"

    def compose(self) -> ComposeResult:
        yield Static("", id="line")


async def test_a_line_as_wide_as_its_text_is_reflowed_when_its_width_changes() -> None:
    app = AutoWidthApp()
    async with app.run_test(size=(40, 10)) as pilot:
        line = app.query_one("#line", Static)
        slots = TextSlots()
        slots.show(line, Text("12 s"))
        await pilot.pause()
        calls, _ = spied(line)
        slots.show(line, Text("13 s"))  # as wide: a repaint
        slots.show(line, Text("130 s"))  # wider: reflowed
        await pilot.pause()
        assert calls == [False, True] and line.size.width == 5
        slots.show(line, Text("14 s"))  # narrower (nothing wraps): reflowed too
        await pilot.pause()
        assert calls == [False, True, True] and line.size.width == 4


async def test_tabs_are_relabelled_only_when_their_mark_changes() -> None:
    verdict = dataflow_bottleneck()  # lead in step 3 (0.8: error), gpu.idle in step 1 (0.5)
    app = make_app(verdict=verdict)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        tabs = app.query_one(TabbedContent)
        labels = {s: tabs.get_tab(f"pane-{s}").label for s in range(1, 6)}
        # A new evaluation moves the severities, not the marks: no tab is touched.
        moved = [dataclasses.replace(f, severity=f.severity + 0.05) for f in verdict.findings]
        app.assessment = assessment_of(app.store, dataclasses.replace(verdict, findings=moved))
        app._mark_bottleneck()
        assert all(tabs.get_tab(f"pane-{s}").label is labels[s] for s in range(1, 6))
        # The idle finding turns to an error: tab 1 keeps its label, takes the colour.
        errors = [dataclasses.replace(f, severity=0.9) for f in verdict.findings]
        app.assessment = assessment_of(app.store, dataclasses.replace(verdict, findings=errors))
        app._mark_bottleneck()
        tab1 = tabs.get_tab("pane-1")
        assert tab1.label is labels[1] and tab1.has_class("-findings-error")
        assert not tab1.has_class("-findings-warning")
        # The lead moves to step 1: both tabs' labels change.
        lead1 = dataclasses.replace(verdict, bottleneck_step=1, bottleneck_rule="gpu.idle")
        app.assessment = assessment_of(app.store, lead1)
        app._mark_bottleneck()
        await pilot.pause()
        assert str(tabs.get_tab("pane-1").label).startswith("● 1")
        assert str(tabs.get_tab("pane-3").label).startswith("• 3")


def test_the_stage_strip_has_one_span_per_run_of_a_stage() -> None:
    steps = verl_steps()  # the real verl run of tests/ui_data.py
    strip = stage_strip(steps, steps[0].t - 30.0, steps[-1].t, width=150)
    assert strip is not None
    styles = {
        letter: f"black on {colour}"
        for letter, colour in [*STAGE_STYLE.values(), UNTIMED, ROLLOUT_BY_NAME, UNKNOWN_STAGE]
    }
    shown = [""] * len(strip.plain)
    for span in strip.spans:
        for i in range(span.start, span.end):
            shown[i] = str(span.style)
    # every cell in its stage's colour (spaces, outside any step, in none) ...
    assert shown == [styles.get(ch, "") for ch in strip.plain]
    # ... with one span per run: no two touching spans say the same
    assert all(
        not (a.end == b.start and a.style == b.style)
        for a, b in zip(strip.spans, strip.spans[1:], strict=False)
    )
    assert len(strip.spans) < len(strip.plain.replace(" ", "")) / 3
