"""Any terminal size: every pane at 80x24, 120x40 and 200x60 shows the header, the tabs, the
verdict, its content and the footer; cells end in … instead of being cut, numbers are never cut,
and low-priority columns go first. SVG snapshots of every pane at the three sizes.

Data: the real-trace store of tests/ui_data.py with one host on a port (``127.0.0.91:2399``,
the name from issue 18 that used to show as ``127.0.0.91:239``) and a long reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from rich.text import Text
from test_ui_app import dataflow_bottleneck, make_app, started
from textual.widgets import DataTable, Footer, Static, Tabs
from ui_data import build_store

from verl_top.model import HostState
from verl_top.ui.header import VerlTopHeader
from verl_top.ui.panes.throughput import GPU_COLUMNS
from verl_top.ui.widgets import Column, fit_columns

SIZES = [(80, 24), (120, 40), (200, 60)]
PORT_HOST = "127.0.0.91:2399"
LONG_REASON = "connection closed by the remote side after 3 keepalive probes went unanswered"


def sized_store() -> Any:
    layout = {"node01": ["busy"] * 8, PORT_HOST: ["train"] * 4 + ["idle"] * 4, "node03": ["stall"]}
    store = build_store(layout, no_gpm_hosts=("node03",), steps=True, config=True)
    store.ingest(HostState(host="node03", t=store.now, state="down", reason=LONG_REASON))
    return store


def text_of(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def visible(app: Any, widget: Any) -> bool:
    """The widget has a non-empty region inside the screen."""
    r = widget.region
    return r.height > 0 and r.width > 0 and r.bottom <= app.size.height


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_pane_shows_header_tabs_verdict_content_and_footer(size) -> None:
    app = make_app(sized_store(), verdict=dataflow_bottleneck())
    async with app.run_test(size=size) as pilot:
        await started(app, pilot)
        for step in (1, 2, 3, 4, 5):
            await pilot.press(str(step))
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            header = app.query_one(VerlTopHeader)
            assert visible(app, header) and header.region.y == 0
            status = app.query_one("#status-line", Static).content
            assert isinstance(status, Text) and status.cell_len <= size[0], status.plain
            assert "hosts 2 up · 1 down" in status.plain
            banner = app.query_one("#banner", Static)
            assert visible(app, banner) and "rollout takes 60 %" in str(banner.content)
            tabs = app.query_one(Tabs)
            assert visible(app, tabs)
            assert sum(t.region.width for t in tabs.query("Tab")) <= size[0]  # all 5 tabs fit
            footer = app.query_one(Footer)
            assert visible(app, footer) and footer.region.bottom == size[1]
            pane = app.pane(step)
            assert visible(app, pane) and visible(app, pane.findings)
            content = app.main_widget(step) if step in (1, 4) else pane.query(".body").first()
            assert content.region.height > 0 and content.region.y < size[1] - 1, step


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_cells_are_not_cut_numbers_never(size) -> None:
    app = make_app(sized_store(), verdict=dataflow_bottleneck())
    async with app.run_test(size=size) as pilot:
        await started(app, pilot)
        if not app.query_one("#host-table").display:  # folded into the host line: show it
            await pilot.press("h")
            await pilot.pause()
        for table_id, sync in (
            ("#gpu-table", app.throughput.gpu_sync),
            ("#host-table", app.throughput.host_sync),
        ):
            table = app.query_one(table_id, DataTable)
            widths = sync.widths()
            assert widths["host"] >= len(PORT_HOST)  # 127.0.0.91:2399, not 127.0.0.91:239
            kinds = {c.key: c.kind for c in sync.specs}
            for r in range(table.row_count):
                for key, cell in zip(sync.columns, table.get_row_at(r), strict=True):
                    if kinds[key] == "num":  # a number fits its column
                        assert len(text_of(cell).strip()) <= widths[key], (key, cell)
                    elif isinstance(cell, Text) and cell.cell_len > widths[key]:
                        assert cell.overflow == "ellipsis" and cell.no_wrap, (key, cell)
            used = sum(w + 2 for w in widths.values())
            assert used <= app.throughput.scrollable_content_region.width, table_id
        if size[0] >= 200:  # wide: every column, the reason in full
            assert app.throughput.gpu_sync.columns == [c.key for c in GPU_COLUMNS]
            assert app.throughput.host_sync.widths()["reason"] >= len(LONG_REASON)


def test_fit_columns_drops_lowest_priority_first_and_gives_spare_to_flex() -> None:
    cols = [
        Column("host", "Host", 6, 10, "text", 20),
        Column("n", "N", 3, 8),
        Column("low", "Low", 5, 1),
        Column("mid", "Mid", 5, 5),
        Column("spark", "History", 8, 4, "flex", 30),
    ]
    needed = {"host": 15, "n": 6, "low": 5, "mid": 5}
    wide = fit_columns(cols, 200, needed)
    assert [(c.key, w) for c, w in wide] == [
        ("host", 15),
        ("n", 6),
        ("low", 5),
        ("mid", 5),
        ("spark", 30),
    ]
    narrow = fit_columns(cols, 17 + 8 + 7 + 10, needed)  # host, n, mid, spark at minimum
    assert [c.key for c, _ in narrow] == ["host", "n", "mid", "spark"]
    tight = fit_columns(cols, 20, needed)
    assert [c.key for c, _ in tight] == ["host"]  # required columns stay, the table scrolls
    long_host = fit_columns(cols, 200, {"host": 50})
    assert long_host[0][1] == 20  # a text column stops at max_width; its cells end in …


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_pane_snapshot_at_size(snap_compare, size, step) -> None:
    app = make_app(sized_store(), verdict=dataflow_bottleneck(), mode="REPLAY")
    assert snap_compare(app, press=[str(step)], terminal_size=size)


async def test_dense_like_nvtop_one_row_per_gpu_wide_sparklines_and_gradients() -> None:
    from ui_data import scale_store

    from verl_top.ui.widgets import ACTIVITY_STOPS, TEMP_STOPS, gradient

    app = make_app(scale_store(16, samples=60))
    async with app.run_test(size=(200, 60)) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        assert table.row_count == 16 * 8  # one row per GPU
        # 60 rows: header, tabs, findings, verl line, host line, status and footer take 9;
        # the host table is folded into its line; every other line is a GPU row.
        assert table.size.height - 1 >= 50
        widths = app.throughput.gpu_sync.widths()
        spark = widths["spark"]
        assert spark >= 60  # the History column takes the spare width...
        assert sum(w + 2 for w in widths.values()) == app.throughput.table_width()
        row = app.throughput.gpu_rows["gpu000/0"]
        assert len(row.cells[3].plain) == spark  # ...and the sparkline its column
    palette = {"error": "#ff0000", "warning": "#ffff00", "success": "#00ff00"}
    assert gradient(0.0, ACTIVITY_STOPS, palette) == "#FF0000"
    assert gradient(90.0, ACTIVITY_STOPS, palette) == "#00FF00"
    low, mid = gradient(20.0, ACTIVITY_STOPS, palette), gradient(35.0, ACTIVITY_STOPS, palette)
    assert low not in (mid, "#FF0000")  # a gradient, not three flat colours
    assert gradient(85.0, TEMP_STOPS, palette) != gradient(45.0, TEMP_STOPS, palette)


def test_plot_titles_shed_words_before_numbers() -> None:
    from verl_top.ui.node_screen import plot_title

    wide = plot_title("activity %", "GPM SM util", "84 mean", 60)
    assert wide == "activity % (GPM SM util) · now 84 mean"
    assert plot_title("activity %", "GPM SM util", "84", 25) == "activity % · now 84"
    assert plot_title("DRAM BW util %", "", "74", 25) == "DRAM BW util % 74"
    tiny = plot_title("DRAM BW util %", "", "74 mean", 16)
    assert tiny.endswith("… 74 mean")  # the value is never cut
