"""Pane 1 as dense as nvtop (issue 18, item 3): the GPU table gets every row the fixed lines
leave, the host table folds into one line when the GPUs need the rows (h shows it, Enter on it
opens a host), and sparklines, strips and bars take the width they are given.

Data: the real-trace stores of tests/ui_data.py, 8 and 16 hosts x 8 GPUs with verl steps (the
verl line and the stage strip are on screen), one host down, and a verdict with a step-1
finding. The old layout (findings block, full host table above the GPUs) showed 19 / 27 / 39 GPU
rows at 120x40 / 160x48 / 200x60 on this data.
"""

from __future__ import annotations

from typing import Any

import pytest
from rich.text import Text
from test_ui_app import dataflow_bottleneck, make_app, started
from textual.widgets import DataTable, Static
from ui_data import T0, build_store

from verl_top.diagnosis.findings import Finding, Verdict
from verl_top.ui.node_screen import NodeScreen, render_host
from verl_top.ui.panes.throughput import host_line, verl_summary
from verl_top.ui.widgets import (
    ACTIVITY_STOPS,
    SPARK_CHARS,
    spark_cells,
    sparkline,
    window_spark,
)

CYCLE = ["busy", "train", "decode", "stall", "idle"]
# Fixed lines above and below the GPU rows: header 2, tabs 2, findings 1, verl line and stage
# strip 2, host line 1, GPU status 1, GPU table header 1, footer 1 = 11; the targets allow 12.
MIN_GPU_ROWS = {(120, 40): 28, (160, 48): 36, (200, 60): 48}


def cluster(hosts: int) -> Any:
    layout = {f"gpu{h:03d}": [CYCLE[(h + i) % 5] for i in range(8)] for h in range(hosts)}
    return build_store(
        layout, no_gpm_hosts=(), throttled=(), steps=True, down={"gpu003": "connection refused"}
    )


def visible_gpu_rows(app: Any) -> int:
    """GPU rows on screen: the GPU table's region inside the pane and the screen, less its
    header row."""
    table = app.query_one("#gpu-table", DataTable)
    if not table.display:
        return 0
    region = table.region.intersection(app.throughput.region).intersection(app.screen.region)
    return max(0, region.height - 1)


@pytest.mark.parametrize("hosts", [8, 16])
@pytest.mark.parametrize("size", list(MIN_GPU_ROWS), ids=lambda s: f"{s[0]}x{s[1]}")
async def test_gpu_table_gets_every_row_the_fixed_lines_leave(size, hosts) -> None:
    app = make_app(cluster(hosts), verdict=dataflow_bottleneck())
    async with app.run_test(size=size) as pilot:
        await started(app, pilot)
        await pilot.pause()
        assert visible_gpu_rows(app) >= MIN_GPU_ROWS[size]
        # The host table folded into its line, which still says what matters about hosts.
        assert not app.query_one("#host-table").display
        assert app.throughput.host_sync.rows_built == 0  # a folded table costs nothing
        line = app.query_one("#host-line", Static).content
        assert isinstance(line, Text) and line.no_wrap
        assert f"{hosts} hosts · {hosts - 1} up · 1 down" in line.plain
        assert "gpu003 down: connection refused" in line.plain
        # The step's findings are one line; the verl line and the stage strip one line each.
        assert app.throughput.findings.region.height == 1
        assert app.query_one("#verl-summary").region.height == 2
        # The verdict stays on screen.
        assert "rollout takes 60 %" in str(app.query_one("#banner", Static).content)


async def test_h_shows_the_host_table_for_enter_and_h_or_esc_hides_it() -> None:
    app = make_app(cluster(8), verdict=dataflow_bottleneck())
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        hosts = app.query_one("#host-table", DataTable)
        gpus = app.query_one("#gpu-table", DataTable)
        assert not hosts.display and app.focused is gpus
        await pilot.press("h")
        await pilot.pause()
        assert hosts.display and app.focused is hosts
        assert "h: hide host table" in app.query_one("#host-line", Static).content.plain
        assert visible_gpu_rows(app) >= 20  # the host table takes at most a quarter
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.host == "gpu001"
        assert app.screen.selected is None  # a host row: all its GPUs
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("escape")  # from the host table: Esc folds it again
        await pilot.pause()
        assert not hosts.display and app.focused is gpus
        await pilot.press("h")
        await pilot.pause()
        assert hosts.display
        await pilot.press("h")
        await pilot.pause()
        assert not hosts.display and app.focused is gpus
        assert visible_gpu_rows(app) >= MIN_GPU_ROWS[(160, 48)]
        await pilot.press("3", "h")  # from another pane: back to pane 1 with the hosts
        await pilot.pause()
        assert app.visible_step() == 1 and hosts.display and app.focused is hosts


async def test_host_table_shown_in_full_when_it_and_every_gpu_fit() -> None:
    store = build_store(down={"node03": "connection refused"}, steps=True)  # 3 x 8 GPUs
    app = make_app(store, verdict=dataflow_bottleneck())
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        await pilot.pause()
        hosts = app.query_one("#host-table", DataTable)
        assert hosts.display and hosts.region.height == 1 + 3
        assert visible_gpu_rows(app) >= 24  # and every GPU
        assert app.focused is app.query_one("#gpu-table")


async def test_findings_line_names_the_worst_and_counts_the_rest() -> None:
    worse = Finding(1, "gpu.throttle", 0.9, "4 GPUs throttled", ["gpu000:3 hw_slowdown"], "cool")
    verdict = dataflow_bottleneck()
    verdict = Verdict(
        verdict.bottleneck_step,
        verdict.bottleneck_rule,
        verdict.headline,
        findings=[*verdict.findings, worse],
        checks=verdict.checks,
    )
    app = make_app(cluster(8), verdict=verdict)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(app, pilot)
        box = app.throughput.findings
        text = box.content
        assert box.region.height == 1 and isinstance(text, Text)
        assert text.plain.startswith("● 4 GPUs throttled (+1 more, d: all) · gpu000:3 hw_slowdown")


def test_host_line_names_hosts_not_up_and_refused_input() -> None:
    store = cluster(8)
    for _ in range(3):
        store.count_drop("gpu005", "bad json")
    names = list(store.hosts)
    text = host_line(store, names, False, {}).plain
    assert text.startswith("8 hosts · 7 up · 1 down · gpu003 down: connection refused")
    assert "3 refused (gpu005 3)" in text and text.endswith("h: host table")
    assert host_line(store, names, True, {}).plain.endswith("h: hide host table")


def test_sparklines_fill_the_width_they_are_given() -> None:
    assert spark_cells([0.0, 100.0], 6) == [0.0, 0.0, 0.0, 100.0, 100.0, 100.0]
    assert spark_cells([0.0, 50.0, 100.0, 50.0], 2) == [25.0, 75.0]
    assert len(sparkline([10.0] * 3, 40)) == 40
    # A window half covered (the GPU was first seen halfway): the first half stays blank.
    times = [T0 + i for i in range(30, 60)]
    half = window_spark([100.0] * 30, times, (T0, T0 + 60), 40, stops=ACTIVITY_STOPS)
    assert half.plain == " " * 20 + SPARK_CHARS[-1] * 20
    # Covered: every cell, each on the gradient (a dip shows another colour).
    values = [100.0] * 30 + [0.0] * 5 + [100.0] * 25
    full = window_spark(values, [T0 + i for i in range(60)], (T0, T0 + 60), 60, {}, ACTIVITY_STOPS)
    assert len(full.plain) == 60 and " " not in full.plain
    colours = {str(span.style) for span in full.spans}
    assert len(colours) >= 2


async def test_history_and_stage_strip_take_the_pane_width() -> None:
    store = cluster(8)
    store.limits.window_s = 60.0  # the 60 samples cover the window: the History is full
    app = make_app(store, verdict=dataflow_bottleneck())
    async with app.run_test(size=(200, 60)) as pilot:
        await started(app, pilot)
        spark = app.throughput.gpu_sync.widths()["spark"]
        assert spark >= 60
        history = app.throughput.gpu_rows["gpu000/0"].cells[3]
        assert len(history.plain) == spark and " " not in history.plain
        width = app.throughput.table_width()
        strip = verl_summary(store, width).plain.split("\n")[1]
        assert width - 3 <= len(strip) <= width


def test_node_host_sparklines_take_the_block_width() -> None:
    store = cluster(2)
    store.limits.window_s = 60.0
    lines = render_host(store, store.hosts["gpu000"], {}, 70).plain.split("\n")
    cpu = next(line for line in lines if line.startswith("CPU "))
    net = next(line for line in lines if line.startswith("Net rx"))
    assert len(cpu) == len(net) == 70


async def test_dataflow_bars_take_the_pane_width() -> None:
    app = make_app(cluster(2), verdict=dataflow_bottleneck())
    async with app.run_test(size=(200, 60)) as pilot:
        await started(app, pilot)
        await pilot.press("3")
        await pilot.pause()
        body = app.query_one("#flow-body", Static)
        console_lines = [
            "".join(seg.text for seg in strip)
            for strip in body.render_lines(body.region.reset_offset)
        ]
        bars = [line for line in console_lines if line.lstrip().startswith("step ")]
        longest = max(len(word) for line in bars for word in line.split())  # the bar
        assert longest > 120  # was at most 60 cells whatever the width


async def test_gpus_that_arrive_after_start_get_their_cells() -> None:
    """Live use: the store starts empty (no GPU: the GPU table is hidden), then the first
    samples arrive. Their rows must be built, not left as host/index placeholders (a hidden
    table builds no rows, so it has to be shown before the rows are synced)."""
    from ui_data import load_trace, trace_sample

    from verl_top.store import Store, StoreLimits

    rows = load_trace()[:20]
    end = T0 + len(rows)
    store = Store(StoreLimits(window_s=300.0, points=600), wall_clock=lambda: end)
    app = make_app(store)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        assert not table.display  # no GPU yet
        for k, row in enumerate(rows):
            for i in range(4):
                store.ingest(trace_sample(row, "late", i, T0 + k, gpm=True), received=T0 + k)
        await started(app, pilot)
        assert table.display and table.row_count == 4
        for r in range(4):
            cells = [str(c) for c in table.get_row_at(r)]
            filled = [c for c in cells[2:] if c.strip()]
            assert len(filled) >= 5, cells  # Act, History, NVML%, Mem, Power ... not blank


async def test_sort_keys_only_in_the_footer_when_there_are_gpus() -> None:
    """o / O order the GPU table: with no GPU they leave the footer (and do nothing); the first
    GPU brings them back."""
    from textual.widgets import Footer
    from ui_data import load_trace, trace_sample

    from verl_top.store import Store, StoreLimits

    rows = load_trace()[:5]
    store = Store(StoreLimits(window_s=300.0, points=600), wall_clock=lambda: T0 + 5)
    app = make_app(store)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(app, pilot)

        def footer_text() -> str:
            footer = app.screen.query_one(Footer)
            return " ".join(str(k.render()) for k in footer.query("FooterKey"))

        assert "Sort" not in footer_text() and not app.check_action("sort", ())
        for k, row in enumerate(rows):
            store.ingest(trace_sample(row, "late", 0, T0 + k, gpm=True), received=T0 + k)
        await started(app, pilot)
        await pilot.pause()
        assert "Sort" in footer_text() and app.check_action("sort", ())
