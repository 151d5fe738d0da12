"""Keys and mouse: footer, the generated help screen, the / filter, +/- window, >/< speed, clicks."""

from __future__ import annotations

import re

from rich.console import Console
from test_ui_app import SIZE, make_app, plain, started
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static, TabbedContent
from ui_data import build_store

from verl_top.model import HostState
from verl_top.sources.replay import ReplayControl
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.filter_bar import FilterBar, matches_filter
from verl_top.ui.header import host_summary
from verl_top.ui.help_screen import HelpScreen, help_sections, render_help


def help_text(app: VerlTopApp, width: int = 140) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render_help(app))
    return console.export_text()


async def test_every_binding_has_a_description() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        sections = help_sections(app)
        titles = [title for title, _ in sections]
        assert titles[0].startswith("Main screen")
        assert any("Help" in t for t in titles) and any("Filter" in t for t in titles)
        for title, rows in sections:
            for row in rows:
                assert row.description and row.description != row.action, (title, row)


async def test_help_lists_every_app_key_from_the_bindings() -> None:
    class Extra(VerlTopApp):
        BINDINGS = [*VerlTopApp.BINDINGS, Binding("z", "bell", "Ring the bell (test only)")]

    store = build_store()
    app = make_app(store)
    app.__class__ = Extra  # same app, one more binding: the help must show it unprompted
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = help_text(app)
        for binding in VerlTopApp.BINDINGS:
            assert isinstance(binding, Binding)
            assert binding.description in text, binding
            assert app.get_key_display(binding) in text
        assert "Ring the bell (test only)" in text
        for key, what in (("o", "Sort"), ("s", "Snapshot"), ("/", "Filter"), ("?", "Help")):
            # the key first on its line (htop's twin may follow it: "o, F6")
            first = (re.match(r"[^,\s]+", line) for line in text.splitlines() if what in line)
            assert any(m is not None and m.group() == key for m in first), key
        for keys, what in (("?, F1", "Help"), ("q, F10", "Quit"), ("o, F6", "Sort")):
            # htop's keys share their twin's line (one action, one description)
            assert any(line.startswith(keys) and what in line for line in text.splitlines()), keys
        assert "Down (like ↓)" in text and "Up (like ↑)" in text
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        shown = plain(app.screen.query_one("#help-text", Static))
        assert "Wider history window" in shown and "Mouse" in shown
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_footer_shows_the_main_keys_of_the_screen() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        footer = app.screen.query_one(Footer)
        await pilot.pause()
        labels = " ".join(str(w.render()) for w in footer.query("*"))
        for what in ("Diagnosis", "Filter", "Help", "Quit", "Window"):
            assert what in labels, (what, labels)
        assert "Speed" not in labels and "Pause" not in labels  # a live session: no replay keys
        await pilot.press("question_mark")
        await pilot.pause()
        labels = " ".join(str(w.render()) for w in app.screen.query_one(Footer).query("*"))
        assert "Close help" in labels and "Diagnosis" not in labels


def test_filter_matching() -> None:
    assert matches_filter("", "node01", 3)
    assert matches_filter("NODE02", "node02", 0)
    assert matches_filter("gpu7", "node01", 7) and not matches_filter("gpu7", "node01", 6)
    assert matches_filter("node02/7", "node02", 7) and not matches_filter("node02/7", "node01", 7)
    assert not matches_filter("node02", "node01", 2)


async def test_slash_filters_pane1_and_pane4_and_esc_clears() -> None:
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        gpus = app.query_one("#gpu-table", DataTable)
        hosts = app.query_one("#host-table", DataTable)
        assert gpus.row_count == 24
        await pilot.press("slash", *"node02")
        await pilot.pause()
        assert app.host_filter == "node02"
        assert gpus.row_count == 8 and hosts.row_count == 1
        assert all(k.startswith("node02/") for k in app.throughput.ordered_row_keys())
        await pilot.press("enter")  # keep the filter, keys go back to the panes
        await pilot.press("4")
        await pilot.pause()
        grid = app.query_one("#map-grid", DataTable)
        nodes = [str(grid.get_row_at(i)[0]).strip() for i in range(grid.row_count)]
        assert nodes == ["node02"]  # pane 4's node map keeps the matching node only
        await pilot.press("1", "slash")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.host_filter == ""
        assert gpus.row_count == 24 and hosts.row_count == 3
        assert not app.query_one(FilterBar).has_class("-shown")
        await pilot.press("slash", *"gpu7", "enter")
        await pilot.pause()
        assert sorted(app.throughput.ordered_row_keys()) == ["node01/7", "node02/7", "node03/7"]
        assert hosts.row_count == 3  # every host has a GPU 7


async def test_plus_minus_change_the_history_window() -> None:
    store = build_store()
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        start = store.limits.window_s
        await pilot.press("plus")
        await pilot.pause()
        assert store.limits.window_s > start
        await pilot.press("minus", "minus")
        await pilot.pause()
        assert store.limits.window_s < start
        for _ in range(10):
            await pilot.press("minus")
        await pilot.pause()
        assert store.limits.window_s == 30.0
        # A narrower window changes the window means the GPU table shows.
        assert store.window_start() == store.now - 30.0


async def test_greater_less_change_replay_speed() -> None:
    replay = ReplayControl(speed=1.0)
    app = make_app(replay=replay, mode="REPLAY")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("greater_than_sign")
        await pilot.pause()
        assert replay.speed == 2.0
        await pilot.press("less_than_sign", "less_than_sign")
        await pilot.pause()
        assert replay.speed == 0.5
        await pilot.press("plus")  # + is the window now, not the speed
        await pilot.pause()
        assert replay.speed == 0.5


def _header_x(table: DataTable, key: str) -> int:
    pad = table.cell_padding
    x = 0
    for column in table.ordered_columns:  # as fitted to the width (widgets.fit_columns)
        if column.key.value == key:
            return x + pad + 1
        x += column.width + 2 * pad
    raise KeyError(key)


async def test_mouse_clicks_on_tabs_headers_and_rows() -> None:
    app = make_app(build_store())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        tabs = app.query_one(TabbedContent)
        assert await pilot.click("#--content-tab-pane-3")
        await pilot.pause()
        assert tabs.active == "pane-3"
        assert await pilot.click("#--content-tab-pane-1")
        await pilot.pause()
        assert tabs.active == "pane-1"
        gpus = app.query_one("#gpu-table", DataTable)
        assert await pilot.click(gpus, offset=(_header_x(gpus, "power"), 0))
        await pilot.pause()
        assert app.throughput.sort_key == "power" and not app.throughput.sort_reverse
        assert await pilot.click(gpus, offset=(_header_x(gpus, "power"), 0))
        await pilot.pause()
        assert app.throughput.sort_reverse
        assert await pilot.click(gpus, offset=(4, 3))
        await pilot.pause()
        assert gpus.cursor_row == 2


def test_header_shows_connecting_progress() -> None:
    store = Store()
    for i in range(64):
        state = "up" if i < 10 else "down" if i < 12 else "connecting"
        store.ingest(HostState(host=f"gpu{i:02d}", t=1.0, state=state, reason=""))
    assert "connecting 12/64" in host_summary(store)
    for i in range(64):
        store.ingest(HostState(host=f"gpu{i:02d}", t=2.0, state="up", reason=""))
    assert "connecting" not in host_summary(store)
