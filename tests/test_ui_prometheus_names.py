"""Names and plot labels in Prometheus mode (issue 32 item 6): a rollout server's and its
model's names are whole whenever the pane has room beside the numbers, and cut with ``…``
only when it has not; a plot's "no data" note is never drawn under its y axis.

The two servers are the real ones of tests/fixtures/prometheus/ as the Prometheus source reads
them (tests/test_prometheus_source.py): vLLM opt-125m (0 running, TTFT p50/p90 375/475 ms)
and SGLang's documented Llama-3.1-8B-Instruct (162 running, 2826 waiting, KV 28 %).
"""

from __future__ import annotations

import html
import re

import pytest
from rich.console import Console

from verl_top.model import GpuInfo, GpuSample, Hello, RolloutSample
from verl_top.store import Store
from verl_top.ui.node_screen import NodeScreen, fit_note
from verl_top.ui.panes.dataflow import ROLLOUT_COLUMNS, rollout_table
from verl_top.ui.widgets import REQUIRED, Column, fit_names

VLLM = RolloutSample(
    host="127.0.0.90:39095", t=1.0, server="vllm", model="facebook/opt-125m", running=0,
    waiting=0, kv_cache_pct=0, gen_tokens_s=0, ttft_p50_s=0.375, ttft_p90_s=0.475,
    tpot_p50_s=0.038, e2e_p50_s=0.5, e2e_p90_s=0.9, preemptions_s=0,
)  # fmt: skip
SGLANG = RolloutSample(
    host="127.0.0.90:40297", t=1.0, server="sglang", model="meta-llama/Llama-3.1-8B-Instruct",
    running=162, waiting=2826, kv_cache_pct=28, gen_tokens_s=0, ttft_p50_s=30.0,
    ttft_p90_s=30.0, tpot_p50_s=0.093, e2e_p50_s=60.0, e2e_p90_s=60.0,
)  # fmt: skip


def rendered(width: int) -> list[str]:
    store = Store()
    store.ingest(VLLM)
    store.ingest(SGLANG)
    console = Console(width=width, record=True, color_system=None)
    console.print(rollout_table(store, width))
    return console.export_text().splitlines()


def test_names_are_whole_when_the_pane_has_room() -> None:
    lines = rendered(196)
    text = "\n".join(lines)
    assert "meta-llama/Llama-3.1-8B-Instruct" in text and "127.0.0.90:40297" in text
    assert "facebook/opt-125m" in text and "…" not in text
    assert "30000/30000" in text and "60.0/60.0" in text and "preempt" in text
    assert max(map(len, lines)) <= 196


def test_names_are_cut_with_an_ellipsis_only_for_want_of_room() -> None:
    # 116 columns hold every number but not the 32-character model name: the model column
    # takes exactly what is left (the table fills the width) and its name ends in "…".
    lines = rendered(116)
    rows = [line for line in lines if line.startswith("127.0.0.90:")]
    assert any("meta-llama/Llama" in r and "…" in r for r in rows)
    assert "127.0.0.90:39095" in rows[0] and "facebook/opt-125m" in rows[0]  # short: whole
    assert max(len(line) for line in lines[1:]) == 116
    assert all(v in "\n".join(rows) for v in ("2826", "30000/30000", "60.0/60.0", "0.0"))
    # 78 columns: names at their floors (server 12, kind whole, model 12), numbers whole, the
    # lowest-priority columns (preemptions, TPOT, e2e) left out rather than cut.
    narrow = rendered(78)
    rows = [line for line in narrow if line.startswith("127.0.0.")]
    assert all(len(line) <= 78 for line in narrow)
    assert rows[1].split()[:3] == ["127.0.0.90:…", "sglang", "meta-llama/…"]
    assert "2826" in rows[1] and "30000/30000" in rows[1]
    assert "preempt" not in "\n".join(narrow)


def test_fit_names_cuts_the_longest_name_first_and_numbers_never() -> None:
    cols = [
        Column("a", "a", 4, REQUIRED, "text"),
        Column("b", "b", 4, 9, "text"),
        Column("n", "num", 3, 5),
    ]
    needed = {"a": 30, "b": 10, "n": 7}
    assert [w for _, w in fit_names(cols, needed, 100)] == [30, 10, 7]  # room: whole
    # 40 cells: 4 of gaps, 7 for the number, 29 for the names: the 30 goes to 19, 10 stays.
    assert [w for _, w in fit_names(cols, needed, 40)] == [19, 10, 7]
    # 25: both names shrink together (8 and 6 would be uneven): the longest goes first.
    assert [w for _, w in fit_names(cols, needed, 25)] == [7, 7, 7]
    # Below the floors the lowest-priority column goes, never a number's digits.
    assert [(c.key, w) for c, w in fit_names(cols, needed, 14)] == [("a", 4), ("b", 4)]
    assert ROLLOUT_COLUMNS[0].priority == REQUIRED


def test_fit_note_keeps_the_note_inside_the_plot() -> None:
    assert fit_note("no GPM on this node", 60) == "no GPM on this node"
    assert fit_note("no GPM on this node", 24) == "no GPM on this…"
    assert fit_note("no GPM on this node", 25) == "no GPM on this…"  # no space before …


def screen_rows(app) -> list[str]:  # noqa: ANN001
    """The screen as rows of text (the SVG's text runs grouped by their y)."""
    rows: dict[float, str] = {}
    for y, run in re.findall(r'<text[^>]*?y="([\d.]+)"[^>]*>(.*?)</text>', app.export_screenshot()):
        rows[float(y)] = rows.get(float(y), "") + html.unescape(run).replace("\xa0", " ")
    return [rows[y] for y in sorted(rows)]


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
async def test_the_no_gpm_note_starts_at_the_y_axis(size: tuple[int, int]) -> None:
    """A DCGM host without PROF fields (as the real H100 excerpt): the tensor and DRAM plots say
    "no GPM on this node" from their first letter, right of the axis (it was centred on a
    point a quarter in and ran under the axis: "PM on this node")."""
    from textual.app import App

    store = Store()
    store.ingest(Hello(host="gpu01", t=1.0, backend="dcgm-exporter", gpus=[GpuInfo(index=0)]))
    for k in range(5):
        store.ingest(GpuSample(host="gpu01", t=1.0 + k, index=0, util_gpu=30.0))

    class One(App):
        def on_mount(self) -> None:
            self.push_screen(NodeScreen(store, "gpu01", 0))

    app = One()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.pause()
        rows = screen_rows(app)
    notes = [line for line in rows if "GPM on this" in line]
    assert len(notes) == 1, rows  # the tensor and the DRAM plot, side by side on one row
    assert len(re.findall(r"50┤no GPM on this", notes[0])) == 2, notes
