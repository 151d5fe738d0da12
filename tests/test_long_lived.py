"""A live session's long-lived objects are frozen out of full collections once it settled
(verl_top/long_lived.py): a full pass over them was pane 1's slowest frames at 1024 GPUs."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import pytest
from test_ui_app import SIZE, make_app, started
from ui_data import build_store

from verl_top import monitor
from verl_top.long_lived import LongLivedHeap


def _ticks(heap: LongLivedHeap, sizes: list[int]) -> list[int]:
    """The ticks (0-based) at which a freeze was due, freezing (bookkeeping only) each time."""
    due = []
    for i, size in enumerate(sizes):
        if heap.due(size):
            due.append(i)
            heap.freezes += 1
            heap._frozen_at = size
    return due


def test_a_freeze_is_due_once_the_session_settled_and_again_only_after_it_grew() -> None:
    heap = LongLivedHeap(settle_ticks=3, growth=1.25, max_freezes=3)
    assert _ticks(heap, [0] * 6) == []  # nothing connected: nothing to freeze
    # 8 GPUs + 1 host settle; a host more (18) is not a quarter more... 27 is
    sizes = [9] * 5 + [10] * 5 + [18] * 5 + [27] * 5
    assert _ticks(heap, sizes) == [3, 13, 18]
    heap = LongLivedHeap(settle_ticks=3, growth=1.25, max_freezes=3)
    assert _ticks(heap, [9, 10, 9, 10, 9, 10, 9]) == []  # never settles: never frozen
    heap = LongLivedHeap(settle_ticks=1, growth=1.0, max_freezes=2)
    assert _ticks(heap, [5, 5, 6, 6, 7, 7, 8, 8]) == [1, 3]  # at most max_freezes


def test_freeze_moves_the_heap_out_of_collections_and_release_gives_it_back() -> None:
    heap = LongLivedHeap(settle_ticks=1)
    assert gc.get_freeze_count() == 0
    heap.due(4)
    assert heap.due(4)
    try:
        heap.freeze()
        assert gc.get_freeze_count() > 1000 and heap.freezes == 1
        assert not heap.due(4)  # frozen at this size
    finally:
        heap.release()
    assert gc.get_freeze_count() == 0 and heap.freezes == 0


def test_a_session_collects_its_young_objects_less_often_and_gives_the_thresholds_back() -> None:
    # At 700 allocations a pass, a tick's short-lived rows and strips were walked, promoted and
    # walked again by the older passes; 5000 lets their reference counts free most of them first.
    before = gc.get_threshold()
    heap = LongLivedHeap(young_threshold=before[0] + 4300)
    try:
        heap.start()
        heap.start()  # twice: the thresholds from before the first are the ones given back
        assert gc.get_threshold() == (before[0] + 4300, *before[1:])
    finally:
        heap.release()
    assert gc.get_threshold() == before
    gc.set_threshold(9000, *before[1:])  # already rarer than asked: left as it is
    try:
        heap.start()
        assert gc.get_threshold()[0] == 9000
        heap.release()
    finally:
        gc.set_threshold(*before)


async def test_only_a_live_app_changes_the_collectors_thresholds_and_only_while_it_runs() -> None:
    before = gc.get_threshold()
    for live, during in ((True, LongLivedHeap().young_threshold), (False, before[0])):
        app = make_app(build_store(), live=live)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            assert gc.get_threshold() == (max(before[0], during), *before[1:])
        assert gc.get_threshold() == before  # the app closed


async def ticks(app, pilot, n: int) -> None:  # noqa: ANN001 - the app and its test pilot
    """The app started, then ``n`` refresh ticks, each followed by its frame."""
    await started(app, pilot)
    for _ in range(n):
        app.refresh_now()
        await pilot.pause()


async def test_a_live_app_freezes_once_settled_and_unfreezes_when_it_closes() -> None:
    app = make_app(build_store(), live=True)
    app.long_lived = LongLivedHeap(settle_ticks=2)
    async with app.run_test(size=SIZE) as pilot:
        await ticks(app, pilot, 4)
        await pilot.pause()
        assert app.long_lived.freezes == 1 and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0  # the app closed: nothing stays frozen


async def test_the_heap_is_frozen_between_two_evaluations_even_when_they_follow_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each tick the store changed and an evaluation started in the worker thread as soon as
    the last ended (16384 GPUs): the freeze that is due waits for the running evaluation to
    end and comes then, never while one runs."""
    monkeypatch.setattr(monitor, "MAX_SHARE", 1e9)  # due again as soon as one ended
    store = build_store()
    app = make_app(store, live=True)
    app.monitor.period_s = 0.0  # due at every change of the store
    app.long_lived = LongLivedHeap(settle_ticks=2)
    seen: list[bool] = []  # whether an evaluation ran at each freeze
    freeze = app.long_lived.freeze

    def watched() -> None:
        seen.append(app.monitor.evaluating)
        freeze()

    app.long_lived.freeze = watched  # type: ignore[method-assign]

    async def until(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, f"never {what}"
            await pilot.pause(0.01)

    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        started_evaluations = 0
        for _ in range(5):
            store.version += 1  # new data: the next tick starts an evaluation
            await until("due", app.monitor.due)
            app.refresh_now()
            started_evaluations += app.monitor.evaluating
            await pilot.pause()
            await until("ended", lambda: not app.monitor.evaluating)
        assert started_evaluations == 5  # each tick started one
        assert seen == [False] and app.long_lived.freezes == 1
    assert gc.get_freeze_count() == 0


async def test_an_app_that_is_not_live_never_freezes() -> None:
    app = make_app(build_store())
    app.long_lived = LongLivedHeap(settle_ticks=1)
    async with app.run_test(size=SIZE) as pilot:
        await ticks(app, pilot, 4)
        assert app.long_lived.freezes == 0 and gc.get_freeze_count() == 0
