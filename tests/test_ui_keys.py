"""The focus model (docs/keys.md), key by key and screen by screen.

Digits, d, ?, /, q and Ctrl+C work from every screen and whatever has focus; the main table has
focus at start; Enter opens the highlighted node (the host table when there is no GPU); Esc
backs out one level and clears a filter. Data: the real-trace store of tests/ui_data.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_ui_app import dataflow_bottleneck, make_app, started
from textual.widgets import DataTable, Input

from verl_top.model import Hello, HostSample, HostState
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.filter_bar import FilterBar
from verl_top.ui.findings_screen import FindingsScreen
from verl_top.ui.help_screen import HelpScreen
from verl_top.ui.node_screen import NodeScreen

SIZE = (120, 40)
Opener = Callable[[VerlTopApp, Any], Awaitable[None]]


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the app process messages until ``cond()`` holds (or ``timeout`` s pass): closing a
    screen and switching the pane take a few message rounds, more on a loaded machine, and the
    caller's assertion then says what did not happen."""
    waited = 0.0
    await pilot.pause()
    while not cond() and waited < timeout:
        await pilot.pause(0.05)
        waited += 0.05


async def on_table(app: VerlTopApp, pilot: Any) -> None:
    """The panes, with the GPU table focused (as at start)."""
    await pilot.press("1")
    await until(pilot, lambda: len(app.screen_stack) == 1 and app.visible_step() == 1)
    assert isinstance(app.focused, DataTable) and app.focused.id == "gpu-table"


async def on_node(app: VerlTopApp, pilot: Any) -> None:
    await on_table(app, pilot)
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, NodeScreen))
    assert isinstance(app.screen, NodeScreen)


async def on_findings(app: VerlTopApp, pilot: Any) -> None:
    await on_table(app, pilot)
    await pilot.press("d")
    await until(pilot, lambda: isinstance(app.screen, FindingsScreen))
    assert isinstance(app.screen, FindingsScreen)


async def on_help(app: VerlTopApp, pilot: Any) -> None:
    await on_node(app, pilot)  # help over the node screen: the deepest stack
    await pilot.press("question_mark")
    await until(pilot, lambda: isinstance(app.screen, HelpScreen))
    assert isinstance(app.screen, HelpScreen)


async def after_esc_from_node(app: VerlTopApp, pilot: Any) -> None:
    await on_node(app, pilot)
    await pilot.press("escape")
    await until(pilot, lambda: len(app.screen_stack) == 1)
    assert len(app.screen_stack) == 1


SCREENS: dict[str, Opener] = {
    "table": on_table,
    "node": on_node,
    "findings": on_findings,
    "help": on_help,
    "after-esc": after_esc_from_node,
}


# Two digits from each screen; over the five screens every digit 1-5 is pressed, each from a
# screen where it must close something or switch the pane (one test per screen: each runs alone).
DIGITS_FROM = {
    "table": (5, 2),
    "node": (4, 3),
    "findings": (1, 5),
    "help": (2, 4),
    "after-esc": (3, 1),
}


@pytest.mark.parametrize("name", list(SCREENS))
async def test_global_keys_work_from_every_screen(name: str) -> None:
    assert set(DIGITS_FROM) == set(SCREENS)
    every_digit_twice = sorted(d for pair in DIGITS_FROM.values() for d in pair)
    assert every_digit_twice == sorted([1, 2, 3, 4, 5] * 2)
    app = make_app(verdict=dataflow_bottleneck())
    opener = SCREENS[name]
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        for step in DIGITS_FROM[name]:
            await opener(app, pilot)
            await pilot.press(str(step))
            await until(
                pilot,
                lambda step=step: (
                    len(app.screen_stack) == 1
                    and app.visible_step() == step
                    and app.focused is app.main_widget(step)
                ),
            )
            assert len(app.screen_stack) == 1, (name, step)
            assert app.visible_step() == step, (name, step)
            assert app.focused is app.main_widget(step), (name, step)
        await opener(app, pilot)
        await pilot.press("d")
        await pilot.pause()
        if name == "findings":  # d toggles the diagnosis
            assert len(app.screen_stack) == 1
        else:
            assert isinstance(app.screen, FindingsScreen), name
        await opener(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        if name == "help":  # ? toggles the help
            assert isinstance(app.screen, NodeScreen)
        else:
            assert isinstance(app.screen, HelpScreen), name
        await pilot.press("escape")
        await opener(app, pilot)
        await pilot.press("slash")
        await pilot.pause()
        assert len(app.screen_stack) == 1 and isinstance(app.focused, FilterBar), name
        await pilot.press("escape")
        await pilot.pause()


@pytest.mark.parametrize("key", ["q", "ctrl+c", "f10"])
@pytest.mark.parametrize("where", list(SCREENS))
async def test_quit_keys_work_from_every_screen(where: str, key: str) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await SCREENS[where](app, pilot)
        await pilot.press(key)
        await pilot.pause()
        assert app._exit  # noqa: SLF001 - the app has been told to exit


async def test_enter_at_start_opens_the_highlighted_gpu_without_tabbing() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        assert (app.screen.host, app.screen.selected) == ("node01", 2)


def no_gpu_store() -> Store:
    store = Store(wall_clock=lambda: 1000.0)
    for host in ("cpu-a", "cpu-b"):
        store.ingest(Hello(host=host, t=990.0, backend="none", error="no NVIDIA driver"))
        store.ingest(HostState(host=host, t=990.0, state="no_gpu", reason="no NVIDIA driver"))
        store.ingest(HostSample(host=host, t=999.0, cpu_pct=12.0), received=999.0)
    return store


async def test_enter_with_no_gpu_opens_the_host_of_the_host_table() -> None:
    app = make_app(no_gpu_store())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.pause()
        assert isinstance(app.focused, DataTable) and app.focused.id == "host-table"
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.host == "cpu-b"


async def test_escape_backs_out_one_level_and_clears_a_kept_filter() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await on_help(app, pilot)  # panes > node > help
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert len(app.screen_stack) == 1
        await pilot.press("slash", *"node02", "enter")  # digits are typed, not pane keys
        await pilot.pause()
        assert app.host_filter == "node02" and app.visible_step() == 1
        assert not isinstance(app.focused, Input)
        assert set(app.throughput.gpu_rows) == {f"node02/{i}" for i in range(8)}
        await pilot.press("escape")
        await pilot.pause()
        assert app.host_filter == ""
        assert len(app.throughput.gpu_rows) == 24


async def test_live_mode_hides_replay_keys_from_the_footer() -> None:
    from verl_top.sources.replay import ReplayControl

    live = make_app()
    async with live.run_test(size=SIZE) as pilot:
        await started(live, pilot)
        keys = set(live.screen.active_bindings)
        assert "q" in keys and "space" not in keys and "greater_than_sign" not in keys
    replay = make_app(replay=ReplayControl(), mode="REPLAY")
    async with replay.run_test(size=SIZE) as pilot:
        await started(replay, pilot)
        keys = set(replay.screen.active_bindings)
        assert "space" in keys and "greater_than_sign" in keys


async def test_htop_keys_f1_f6_and_j_k_act_like_their_verl_top_twins() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.focused
        assert isinstance(table, DataTable) and table.cursor_row == 0
        await pilot.press("j", "j", "j")
        await until(pilot, lambda: table.cursor_row == 3)
        assert table.cursor_row == 3  # j is ↓
        await pilot.press("k")
        await until(pilot, lambda: table.cursor_row == 2)
        assert table.cursor_row == 2  # k is ↑
        await pilot.press("enter")  # j/k moved the row Enter opens
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        assert isinstance(app.screen, NodeScreen) and app.screen.selected == 2
        await pilot.press("f1")  # help from the node screen, F1 again closes it
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen))
        assert isinstance(app.screen, NodeScreen)
        await pilot.press("1")
        await until(pilot, lambda: len(app.screen_stack) == 1)
        before = app.throughput.sort_key
        await pilot.press("f6")
        await until(pilot, lambda: app.throughput.sort_key != before)
        assert app.throughput.sort_key != before  # F6 is o: the next sort column
        await pilot.press("slash", "j", "k")  # typed into the filter bar, not moving rows
        await pilot.pause()
        assert app.host_filter == "jk" and isinstance(app.focused, Input)
