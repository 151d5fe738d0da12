"""Client cost that follows the screen, not the cluster (issue 21): the per-tick store summary,
its running window means, and pane 1 building only the rows on screen."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest
from textual.widgets import DataTable
from ui_data import T0, build_store, scale_store

from verl_top.inputs import Inputs
from verl_top.model import GpuSample
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Ring, Store, mean
from verl_top.store_summary import SummaryCache, WindowMean
from verl_top.ui import app as app_module
from verl_top.ui.app import VerlTopApp
from verl_top.ui.header import cluster_activity
from verl_top.ui.node_screen import NodeScreen

SIZE = (160, 40)


def make_app(store: Store) -> VerlTopApp:
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), mode="LIVE", title="t")
    return VerlTopApp(inputs, engine=None, live=False)


async def started(app: VerlTopApp, pilot: Any) -> None:
    await pilot.pause()
    app.refresh_now()
    await pilot.pause()


# -- WindowMean: the running window mean equals a full re-read -----------------------------


def test_window_mean_matches_a_full_read_through_wraps_gaps_and_window_changes() -> None:
    rng = random.Random(7)
    ring = Ring(("activity",), 50)
    wm = WindowMean()
    t = 0.0
    windows = [20.0] * 60 + [45.0] * 30 + [80.0] * 30 + [10.0] * 40  # grows past the ring
    for step, window in enumerate(windows):
        for _ in range(rng.choice((0, 1, 1, 2, 3))):  # ticks with nothing, one or a burst
            t += rng.choice((0.5, 1.0, 1.0, 2.0))
            v = None if rng.random() < 0.1 else rng.uniform(0, 100)  # NaN = missing
            ring.push(t, {"activity": v})
        since = t - window
        got = wm.update(ring, "activity", since)
        want = mean(ring.recent_values("activity", since))
        if want is None:
            assert got is None, step
        else:
            assert got is not None and math.isclose(got, want, abs_tol=1e-9), (step, got, want)


def test_window_mean_follows_a_ring_whose_time_steps_back() -> None:
    ring = Ring(("activity",), 20)
    wm = WindowMean()
    for i in range(10):
        ring.push(float(i), {"activity": float(i)})
    assert wm.update(ring, "activity", 5.0) == mean([5.0, 6.0, 7.0, 8.0, 9.0])
    ring.push(3.0, {"activity": 100.0})  # a clock stepped back: the plain read decides
    want = mean(ring.values("activity", 5.0))
    assert wm.update(ring, "activity", 5.0) == want


# -- SummaryCache: once per store change, shared ------------------------------------------


def test_summary_is_computed_once_per_store_change_and_agrees_with_the_store() -> None:
    store = build_store()
    cache = SummaryCache()
    first = cache.get(store)
    assert cache.get(store) is first and cache.computed == 1
    for g in store.iter_gpus():
        want = store.gpu_mean(g, "activity")
        got = first.gpus[f"{g.host}/{g.index}"].act
        assert got is not None and want is not None and math.isclose(got, want)
    # The fixture's idle GPUs: node02/6-7 at 0 % and the stalled node03 (8 GPUs, ~24 %).
    assert first.idle == 10 and first.hosts["node02"].idle == 2
    store.ingest(GpuSample(host="node01", t=T0 + 61, index=0, util_gpu=50.0))
    assert cache.get(store) is not first and cache.computed == 2


def test_a_gpu_that_appears_on_a_known_host_joins_the_summary() -> None:
    """The summary keeps each host's GPU keys between ticks; a new GPU must still be counted."""
    store = build_store()
    cache = SummaryCache()
    before = cache.get(store)
    assert "node01/9" not in before.gpus and before.hosts["node01"].gpus == 8
    store.ingest(GpuSample(host="node01", t=T0 + 61, index=9, util_gpu=0.0))
    after = cache.get(store)
    assert after.gpus["node01/9"].act == 0.0 and after.hosts["node01"].gpus == 9
    assert after.idle == before.idle + 1  # 0 % over its window: idle


async def test_the_app_and_pane_1_share_one_summary_per_tick() -> None:
    app = make_app(build_store())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        before = app.summaries.computed
        app.store.ingest(GpuSample(host="node01", t=T0 + 61, index=0, util_gpu=50.0))
        app.refresh_now()
        assert app.summaries.computed == before + 1


def same_summary(a: Any, b: Any) -> None:
    """Two summaries hold the same numbers for every GPU and host."""
    assert a.gpus.keys() == b.gpus.keys() and a.hosts == b.hosts
    for key, ga in a.gpus.items():
        gb = b.gpus[key]
        assert ga._replace(act=None) == gb._replace(act=None), key
        assert (ga.act is None) == (gb.act is None), key
        assert ga.act is None or math.isclose(ga.act, gb.act or 0.0, abs_tol=1e-9), key
    assert (a.idle, a.throttled, a.indices) == (b.idle, b.throttled, b.indices)
    assert a.cluster_act is not None and math.isclose(a.cluster_act, b.cluster_act or 0.0)


async def test_a_summary_made_in_slices_is_the_summary_and_gives_the_loop_turns() -> None:
    """Issue 30: at 4096 GPUs the summary held the loop for half a tick; made in slices it
    gives the loop a turn every ``per_turn`` GPUs and holds the same numbers."""
    store = scale_store(hosts=16, samples=30)  # 128 GPUs
    turns = 0
    running = True

    async def count_turns() -> None:
        nonlocal turns
        while running:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    start = turns
    sliced = await SummaryCache().compute_sliced(store, per_turn=16)
    during = turns - start
    running = False
    await counter
    assert during >= 128 // 16 - 1  # a turn after every 16 GPUs (two hosts)
    same_summary(sliced, SummaryCache().get(store))
    assert sliced.covers(store)
    # The cache keeps it as the store's summary while the store does not move on.
    cache = SummaryCache()
    made = await cache.compute_sliced(store, per_turn=64)
    assert cache.fresh(store) and cache.get(store) is made and cache.computed == 1


def test_a_summary_no_longer_covers_a_store_whose_hosts_or_gpus_changed() -> None:
    store = build_store()
    summary = SummaryCache().get(store)
    assert summary.covers(store)
    store.ingest(GpuSample(host="node01", t=T0 + 61, index=9, util_gpu=0.0))  # a GPU more
    assert not summary.covers(store)
    other = build_store()
    summary = SummaryCache().get(other)
    del other.hosts["node01"].gpus[7]  # as many GPUs as before on no host but one: fewer
    other.hosts["node01"].gpus[8] = other.hosts["node02"].gpus[0]  # now as many, not the same
    assert not summary.covers(other)


async def test_a_tick_at_scale_draws_with_the_summary_it_made_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The live tick from ``SLICED_SUMMARY_GPUS`` on: one summary per tick, made in slices,
    drawn by pane 1 and the header (whose activity is the summary's)."""
    monkeypatch.setattr(app_module, "SLICED_SUMMARY_GPUS", 64)
    monkeypatch.setattr(app_module, "SUMMARY_SLICE", 16)
    store = scale_store(hosts=16, samples=30)  # 128 GPUs
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        made = []
        original = app.summaries.compute_sliced

        async def spy(st: Store, per_turn: int) -> Any:
            made.append(per_turn)
            return await original(st, per_turn)

        app.summaries.compute_sliced = spy  # type: ignore[method-assign]
        before = app.summaries.computed
        store.ingest(GpuSample(host="gpu000", t=store.now + 1, index=0, util_gpu=50.0))
        await app._tick()
        assert made == [16] and app.summaries.computed == before + 1
        assert app.summaries.pinned is None  # pinned for that tick only
        header = str(app.query_one("#status-line").render())
        act = cluster_activity(store)
        assert act is not None and f"activity {act:.0f}%" in header
        # Nothing new: the summary held is the store's, no slices.
        await app._tick()
        assert made == [16] and app.summaries.computed == before + 1


async def test_a_host_that_comes_while_the_summary_is_sliced_is_drawn_on_that_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A summary made in slices can miss a host that came between two turns: the tick then
    draws with a summary made whole (no GPU of pane 1 without its summary)."""
    monkeypatch.setattr(app_module, "SLICED_SUMMARY_GPUS", 64)
    monkeypatch.setattr(app_module, "SUMMARY_SLICE", 16)
    store = scale_store(hosts=16, samples=30)
    newcomer = scale_store(hosts=17, samples=30).hosts["gpu016"]
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        original = app.summaries.compute_sliced
        sliced: list[Any] = []

        async def host_arrives(st: Store, per_turn: int) -> Any:
            async def arrive() -> None:
                st.hosts["gpu016"] = newcomer
                st.version += 1

            arriving = asyncio.create_task(arrive())  # runs at the first turn of the slices
            summary = await original(st, per_turn)
            await arriving
            sliced.append(summary)
            return summary

        app.summaries.compute_sliced = host_arrives  # type: ignore[method-assign]
        store.ingest(GpuSample(host="gpu000", t=store.now + 1, index=0, util_gpu=50.0))
        await app._tick()
        await pilot.pause()
        assert len(sliced) == 1 and "gpu016/0" not in sliced[0].gpus  # it missed the host
        table = app.query_one("#gpu-table", DataTable)
        assert table.row_count == 17 * 8
        assert "gpu016/0" in app.summaries.get(store).gpus


# -- VirtualRows: only what is on screen is built -------------------------------------------


async def test_pane1_builds_only_the_visible_rows_of_a_large_cluster() -> None:
    store = scale_store(hosts=64, samples=30)  # 512 GPUs
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        sync = app.throughput.gpu_sync
        assert sync is not None
        assert table.row_count == 512  # every GPU has its row (scrolling, keys, Enter)
        # ... but cells were built for the window on screen plus a margin only.
        assert 0 < len(sync.built) < 100
        last = sync.order[-1]
        assert last not in sync.built
        assert str(table.get_cell(last, "act")) == ""  # a placeholder until it is shown
        built = sync.rows_built
        store.ingest(GpuSample(host="gpu000", t=T0 + 200, index=0, util_gpu=50.0))
        app.refresh_now()
        assert sync.rows_built - built < 100  # a tick rebuilds the window, not 512 rows


async def test_rows_scrolled_into_view_are_built_and_enter_opens_their_node() -> None:
    store = scale_store(hosts=64, samples=30)
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        sync = app.throughput.gpu_sync
        assert sync is not None
        table.focus()
        table.move_cursor(row=table.row_count - 1)  # the table scrolls to keep it in view
        await pilot.pause()
        await pilot.pause()
        last = sync.order[-1]
        assert last in sync.built
        assert str(table.get_cell(last, "act")).strip() != ""
        assert str(table.get_cell(last, "host")) == last.split("/")[0]
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        assert app.screen.host == last.split("/")[0]


async def test_sorting_orders_every_row_not_only_the_built_ones() -> None:
    store = scale_store(hosts=64, samples=30)
    app = make_app(store)
    means = {f"{g.host}/{g.index}": store.gpu_mean(g, "activity") for g in store.iter_gpus()}
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("o")  # activity, lowest first
        await pilot.pause()
        order = app.throughput.ordered_row_keys()
        assert len(order) == 512
        values = [means[k] for k in order]
        assert values == sorted(values)


async def test_columns_fit_the_visible_rows_and_refit_when_a_wider_number_scrolls_in() -> None:
    # The column fit measures only the rows built (on screen): an off-screen GPU's 8-digit
    # clock does not widen the column, until it scrolls into view; then the number is shown whole.
    store = scale_store(hosts=64, samples=30)
    store.ingest(GpuSample(host="gpu063", t=T0 + 31, index=7, util_gpu=90.0, sm_mhz=12345678))
    app = make_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        sync = app.throughput.gpu_sync
        assert sync is not None
        last = sync.order[-1]
        assert last == "gpu063/7" and last not in sync.built
        assert "clock" in sync.columns and sync.widths()["clock"] < 8
        table.focus()
        table.move_cursor(row=table.row_count - 1)
        for _ in range(4):
            await pilot.pause()
        assert sync.widths()["clock"] >= 8
        assert str(table.get_cell(last, "clock")).strip() == "12345678"
