"""Pane 4 (Parallelism & mapping) on the demo data: map with role letters, parallel sizes from the
demo config (rollout TP 4, 4 nodes × 8 GPUs), stragglers, topology, and Enter to the node screen."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from rich.console import Console
from test_ui_node import DEMO_END, SIZE, demo_records, make_app, started
from textual.widgets import DataTable, Static
from ui_data import FIXTURES

from verl_top.model import GpuSample, VerlConfig
from verl_top.nccl.topo import parse_topo
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.node_screen import NodeScreen
from verl_top.ui.panes.mapping import role_letter


def demo_store(slow: str | None = None, factor: float = 0.3) -> tuple[Store, Pipeline]:
    """The demo through the pipeline; ``slow`` node's GPU activity scaled by ``factor``
    (constructed straggler: NVML and GPM SM util of its real samples multiplied)."""
    store = Store(wall_clock=lambda: DEMO_END)
    pipeline = Pipeline(store, parsers={}, wall_clock=lambda: DEMO_END)
    for rec in demo_records():
        if slow and isinstance(rec, GpuSample) and rec.host == slow:
            rec = dataclasses.replace(
                rec,
                util_gpu=None if rec.util_gpu is None else rec.util_gpu * factor,
                sm_util=None if rec.sm_util is None else rec.sm_util * factor,
            )
        pipeline.emit(rec)
    return store, pipeline


def text_of(widget: Static) -> str:
    console = Console(width=220, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


async def pane4(app: Any, pilot: Any) -> tuple[DataTable, str]:
    await started(app, pilot)
    await pilot.press("4")
    await pilot.pause()
    return app.query_one("#map-grid", DataTable), text_of(app.query_one("#map-body", Static))


def test_role_letter_is_the_main_process_role() -> None:
    assert role_letter([]) == "- "
    assert role_letter(["trainer"]) == "T "
    assert role_letter(["rollout", "trainer"]) == "R+"
    assert role_letter(["driver"]) == "D "


async def test_map_has_role_letters_and_the_demo_parallel_sizes() -> None:
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        grid, body = await pane4(app, pilot)
        assert grid.row_count == 4
        cell = str(grid.get_cell("node02", "g3"))
        # The demo's last process list is from a training stage: the WorkerDict (52 GB) is the
        # GPU's main process, the vLLM worker (15 GB) shares it.
        assert cell.startswith("T+")
        act = store.gpu_mean(store.hosts["node02"].gpus[3], "activity")
        assert act is not None and cell.endswith(f"{act:.0f}")
        assert "rollout TP: 4" in body
        assert "4 nodes × 8 GPUs = 32 GPUs" in body and "✓ matches" in body
        assert "32 on 4 nodes" in body
        assert "TP 4 → 8 engine(s) over 32 GPUs" in body
        assert "T trainer" in body and "R rollout" in body
        assert "0-31" in body  # trainer ranks across the 4 nodes
        assert "no straggler node" in body
        assert "topology: not collected (nvidia-smi topo -m)" in body


async def test_a_slow_node_is_a_straggler() -> None:
    store, pipeline = demo_store(slow="node03")
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        _, body = await pane4(app, pilot)
        assert "⚠ node node03 mean" in body
        for other in ("node01", "node02", "node04"):
            assert f"node {other} mean" not in body


async def test_config_mismatch_is_noted() -> None:
    store, pipeline = demo_store()
    values = dict(store.config)
    values["trainer.nnodes"] = 3
    values["actor_rollout_ref.rollout.tensor_model_parallel_size"] = 3
    pipeline.emit(VerlConfig(host="node01", t=DEMO_END, values=values, source="test"))
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        _, body = await pane4(app, pilot)
        assert "⚠ mismatch: the config asks for 24 GPUs, 32 are seen" in body
        assert "rollout TP 3 does not divide 8 GPUs per node" in body


async def test_topology_matrix_and_tp_groups() -> None:
    store, pipeline = demo_store()
    topo = parse_topo((FIXTURES / "nccl" / "smi_topo_8xH200_4nic_CONSTRUCTED.txt").read_text())
    matrix = {(a, b): topo.link(a, b) for a in topo.gpus for b in topo.gpus if a != b}
    store.topology = {h: dict(matrix) for h in store.hosts}  # type: ignore[attr-defined]
    store.topology["node04"][(2, 3)] = store.topology["node04"][(3, 2)] = "SYS"  # type: ignore[attr-defined]
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        _, body = await pane4(app, pilot)
        assert "3 node(s): node01, node02, node03 · GPU pairs: 28× NV18" in body
        assert "rollout TP 4 groups are NVLink-connected" in body
        assert "1 node(s): node04" in body
        assert "rollout TP 4 groups off NVLink: GPUs 0-3: SYS" in body
        assert "GPU7" in body and "NV18" in body


async def test_enter_on_a_map_cell_opens_that_gpu() -> None:
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        grid, _ = await pane4(app, pilot)
        grid.focus()
        grid.move_cursor(row=grid.get_row_index("node04"), column=1 + 6)  # GPU 6
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        assert screen.host == "node04" and screen.selected == 6
        await pilot.press("escape")
        await pilot.pause()
        assert app.visible_step() == 4


async def test_map_redraws_only_changed_cells() -> None:
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await pane4(app, pilot)
        pane = app.pane(4)
        sync = pane.map_sync  # type: ignore[attr-defined]
        base = sync.cell_updates
        store.version += 1
        app.refresh_now()
        assert sync.cell_updates == base
        latest = store.hosts["node01"].gpus[0].latest
        pipeline.emit(dataclasses.replace(latest, t=store.now + 1, sm_util=0.0, util_gpu=0.0))
        app.refresh_now()
        assert 1 <= sync.cell_updates - base <= 4  # that GPU, its node's mean and spread
