"""Nothing hidden (issue 32 item 4): a kept filter shows in the header, every tab holding
findings is marked, and theme, sort and window chosen in the app survive a restart through the
config file. Data: the real-trace store of tests/ui_data.py."""

from __future__ import annotations

from pathlib import Path

from test_ui_app import dataflow_bottleneck, make_app, plain, started
from test_ui_keys import until
from textual import events
from textual.widgets import DataTable, Static, TabbedContent

from verl_top.settings import load_settings
from verl_top.ui.filter_bar import FilterBar

SIZE = (120, 40)


def status_line(app) -> str:  # noqa: ANN001
    return plain(app.query_one("#status-line", Static))


async def test_a_kept_filter_shows_in_the_header_until_esc_clears_it() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "filter" not in status_line(app)
        await pilot.press("slash", *"node02", "enter")
        await until(pilot, lambda: not app.query_one(FilterBar).has_class("-shown"))
        bar = app.query_one(FilterBar)
        assert not bar.has_class("-shown")  # the bar gives its row back to the table ...
        assert "filter node02" in status_line(app)  # ... and the header says rows are hidden
        assert isinstance(app.focused, DataTable)  # keys act on the table again
        await pilot.press("3")  # on another pane the header still says it
        await until(pilot, lambda: app.visible_step() == 3)
        assert "filter node02" in status_line(app)
        await pilot.press("1", "escape")
        await until(pilot, lambda: app.host_filter == "")
        assert "filter" not in status_line(app)
        assert len(app.throughput.gpu_rows) == 24


async def test_keys_typed_right_after_slash_land_in_the_bar() -> None:
    """A fast typist (or a paste) sends '/node02' at once: no key may act as a pane key
    (2 would show pane 2, d the diagnosis) before the bar has the focus."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        for key, char in [("slash", "/"), *[(c, c) for c in "node02"], ("enter", "\r")]:
            app.post_message(events.Key(key, char))
        await until(pilot, lambda: app.host_filter == "node02")
        assert app.host_filter == "node02"
        assert len(app.screen_stack) == 1 and app.visible_step() == 1


async def test_every_tab_holding_findings_is_marked_not_only_the_leads() -> None:
    app = make_app(verdict=dataflow_bottleneck())  # lead in step 3, a gpu.idle finding in step 1
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        tabs = app.query_one(TabbedContent)
        labels = {s: str(tabs.get_tab(f"pane-{s}").label) for s in range(1, 6)}
        assert labels[3].startswith("● 3") and labels[1].startswith("• 1")
        assert [labels[s][:2] for s in (2, 4, 5)] == ["2 ", "4 ", "5 "]
        tab1 = tabs.get_tab("pane-1")
        assert tab1.has_class("-findings-warning") and not tab1.has_class("-bottleneck")
        assert "• marks" in (Path(__file__).parents[1] / "docs" / "ui.md").read_text()


async def test_theme_sort_and_window_chosen_in_the_app_survive_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("# mine\ninterval = 2  # slow nodes\n\n[thresholds]\nidle_pct = 40\n")
    app = make_app(settings_file=config)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("o", "o", "O")  # activity, then memory, reversed
        await pilot.press("plus")  # the window: 300 s -> 600 s
        app.theme = "nord"
        await pilot.pause()
        await app.workers.wait_for_complete()
        assert (app.throughput.sort_key, app.throughput.sort_reverse) == ("memory", True)
    saved = load_settings(str(config))
    assert saved.defaults["sort"] == "memory" and saved.defaults["sort_reverse"] is True
    assert saved.defaults["window"] == 600 and saved.defaults["theme"] == "nord"
    assert saved.defaults["interval"] == 2 and saved.thresholds.idle_pct == 40
    assert config.read_text().startswith("# mine\ninterval = 2  # slow nodes\n")
    # the next start: the sort comes back (theme and window are flag defaults, test_settings)
    again = make_app(sort=(saved.defaults["sort"], saved.defaults["sort_reverse"]))
    async with again.run_test(size=SIZE) as pilot:
        await started(again, pilot)
        assert (again.throughput.sort_key, again.throughput.sort_reverse) == ("memory", True)
        assert "sort: memory ↓" in plain(again.throughput.query_one("#gpu-status", Static))


async def test_without_a_settings_file_nothing_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    app = make_app()  # tests and headless screenshots: settings_file=None
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("o", "plus")
        await app.workers.wait_for_complete()
    assert list(tmp_path.rglob("*.toml")) == []


def test_choices_are_written_one_at_a_time_and_the_latest_lands_last(tmp_path: Path) -> None:
    """o, o, O in quick succession: each write edits the file, so the writes must not overlap
    and the last choice must be the one on disk (two threads once saved the sort unreversed
    when the first, slower write finished after the second)."""
    import threading
    import time

    from verl_top import settings
    from verl_top.ui import ui_state

    config = tmp_path / "config.toml"
    config.write_text("# mine\n")
    calls: list[dict] = []
    inside = threading.Semaphore(1)

    def slow_first_write(path: Path, values: dict) -> bool:
        assert inside.acquire(blocking=False), "two writes at once"
        try:
            if not calls:
                time.sleep(0.3)  # the first write is slow: later choices arrive meanwhile
            calls.append(dict(values))
            return settings.save_ui_settings(path, values)
        finally:
            inside.release()

    class ThreadApp:
        def __init__(self) -> None:
            self.threads: list[threading.Thread] = []

        def run_worker(self, fn, **_: object) -> None:
            t = threading.Thread(target=fn)
            self.threads.append(t)
            t.start()

    app = ThreadApp()
    saver = ui_state.UiSettingsSaver(app, config)
    original = ui_state.save_ui_settings
    ui_state.save_ui_settings = slow_first_write  # type: ignore[assignment]
    try:
        saver.save(sort="activity", sort_reverse=False)
        time.sleep(0.05)
        saver.save(sort="memory", sort_reverse=False)
        saver.save(sort_reverse=True)
        for t in app.threads:
            t.join(5)
    finally:
        ui_state.save_ui_settings = original  # type: ignore[assignment]
    saved = load_settings(str(config))
    assert saved.defaults["sort"] == "memory" and saved.defaults["sort_reverse"] is True
    assert len(app.threads) == 1  # one writer took up the later choices
    assert calls == [
        {"sort": "activity", "sort_reverse": False},
        {"sort": "memory", "sort_reverse": True},
    ]
