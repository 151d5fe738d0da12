"""The node screen (Enter on a host/GPU row, Esc back) and the snapshot key (s), on the demo data.

The store is the bundled demo recording (verl_top/data/demo.ndjson.gz: real H200 samples laid
out as a 4-node GRPO job) fed through the real Pipeline, so GPU processes get their verl roles
and ranks as they do live. What the demo lacks is added and marked constructed in ``demo_store``.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from assessing import FixedEngine
from rich.console import Console
from textual.widgets import DataTable, Static
from ui_data import FIXTURES

from verl_top.inputs import Inputs
from verl_top.model import GpuProcess, HostSample, LogLines, ProbeResult, ProcessList, Record
from verl_top.protocol import from_dict, read_recording
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui import snapshot_action
from verl_top.ui.app import VerlTopApp
from verl_top.ui.node_screen import MetricPlot, NodeScreen, downsample, invisible_line, row_target

SIZE = (160, 48)
DEMO_END = 1764662769.0  # just after the demo recording's last record


@functools.cache
def demo_records() -> tuple[Record, ...]:
    """The demo recording, read once per test session (records are never mutated)."""
    return tuple(read_recording(resources.files("verl_top") / "data" / "demo.ndjson.gz"))


def demo_store(extras: bool = False) -> tuple[Store, Pipeline]:
    """The demo recording in a store, through the pipeline (roles and ranks annotated).

    ``extras`` adds what the demo does not carry, for the node screen's other blocks: per-core
    CPU on node02 (constructed), the demo's own verl console log as node02's followed log, the
    real torch probe of tests/fixtures/h200_real (re-hosted from "vm" to node02) and one GPU
    process on node02 that the agent cannot see (constructed: another PID namespace).
    """
    store = Store(wall_clock=lambda: DEMO_END)
    pipeline = Pipeline(store, parsers={}, wall_clock=lambda: DEMO_END)
    for rec in demo_records():
        pipeline.emit(rec)
    if extras:
        h = store.hosts["node02"]
        assert h.latest is not None
        cores = [min(100.0, (7 * k) % 97 + (60.0 if k < 24 else 0.0)) for k in range(192)]
        pipeline.emit(
            HostSample(**{**vars(h.latest), "t": h.latest.t + 0.5, "cpu_per_core": cores})
        )
        log = (resources.files("verl_top") / "data" / "demo_verl.log").read_text().splitlines()
        pipeline.emit(
            LogLines(host="node02", t=DEMO_END, path="/logs/driver.log", kind="verl", lines=log)
        )
        raw = (FIXTURES / "h200_real" / "probe_torch_g1.ndjson").read_text().splitlines()[0]
        probe = from_dict(json.loads(raw))
        assert isinstance(probe, ProbeResult)
        probe.host, probe.hosts, probe.t = "node02", ["node02"], DEMO_END - 30
        pipeline.emit(probe)
        add_invisible(pipeline, store, "node02", pid=777123, gpu=5)
    return store, pipeline


def add_invisible(pipeline: Pipeline, store: Store, host: str, pid: int, gpu: int) -> None:
    """Re-emit the host's process list with one more process that /proc does not show."""
    procs = store.hosts[host].procs
    assert procs is not None
    ghost = GpuProcess(pid=pid, gpu_index=gpu, used_mib=20480.0, visible=False)
    pipeline.emit(ProcessList(host=host, t=procs.t + 0.5, procs=[*procs.procs, ghost]))


def make_app(store: Store, pipeline: Pipeline) -> VerlTopApp:
    inputs = Inputs(store=store, pipeline=pipeline, mode="REPLAY", title="demo")
    return VerlTopApp(inputs, engine=FixedEngine(), live=False)


def plain(renderable: Any) -> str:
    console = Console(width=220, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


async def started(app: VerlTopApp, pilot: Any) -> None:
    await pilot.pause()
    app.refresh_now()
    await pilot.pause()


def test_row_target_reads_pane1_row_keys() -> None:
    assert row_target("gpu-table", "node02/3") == ("node02", 3)
    assert row_target("gpu-table", "gpu-a/b/7") == ("gpu-a/b", 7)
    assert row_target("host-table", "node04") == ("node04", None)
    assert row_target("gpu-table", "node02/x") is None
    assert row_target("other-table", "node02/3") is None


def test_downsample_keeps_about_one_point_per_bucket_and_drops_missing() -> None:
    times = [100.0 + k for k in range(300)]
    values = [float(k % 100) for k in range(300)]
    values[10] = float("nan")
    xs, ys = downsample(times, values, 100.0, 400.0, 30)
    assert len(xs) == len(ys) == 30
    assert xs[0] == -295.0 and xs[-1] == -5.0  # bucket centres, seconds before the end
    assert ys[1] == sum(range(11, 20)) / 9  # the NaN point is left out, not counted as 0
    assert downsample(times, values, 100.0, 400.0, 0) == ([], [])


async def test_enter_on_a_gpu_row_opens_the_node_with_roles_and_ranks_and_esc_returns() -> None:
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        table = app.query_one("#gpu-table", DataTable)
        table.focus()
        table.move_cursor(row=table.get_row_index("node03/5"))
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        assert screen.host == "node03" and screen.selected == 5
        title = plain(screen.query_one("#node-title", Static).content)
        assert "node03" in title and "8 GPUs" in title and "16 GPU processes" in title
        info = plain(screen.query_one("#node-info", Static).content)
        assert "backend replay" in info and "driver 580.159.04" in info
        assert "Python 3.10.12" in info and "agent demo" in info
        procs = screen.query_one("#node-procs", DataTable)
        assert procs.row_count == 16
        rows = {str(procs.get_cell(k, "pid")).strip(): k for k in screen.proc_sync.rows}  # type: ignore[union-attr]
        trainer = rows["41005"]
        role = str(procs.get_cell(trainer, "role"))
        # verl's name of the hybrid WorkerDict, then the method it runs now
        assert role.startswith("actor/rollout/ref · "), role
        assert str(procs.get_cell(trainer, "rank")).strip() == "21"  # RANK: node03 is 16-23
        rollout = rows["43005"]
        assert str(procs.get_cell(rollout, "role")) == "rollout (vLLM)"
        assert str(procs.get_cell(rollout, "rank")).strip() == "1"  # VLLM::Worker_TP1
        plots = list(screen.query(MetricPlot))
        assert [p.metric for p in plots] == ["activity", "tensor", "dram", "memory", "power"]
        assert all(p.builds >= 1 for p in plots)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, NodeScreen)
        assert app.visible_step() == 1


async def test_enter_on_a_host_row_opens_all_gpus_and_arrows_pick_one() -> None:
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        hosts = app.query_one("#host-table", DataTable)
        hosts.focus()
        hosts.move_cursor(row=hosts.get_row_index("node02"))
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen) and screen.host == "node02"
        assert screen.selected is None
        assert "all 8" in plain(screen.query_one("#node-select", Static).content)
        await pilot.press("right")
        assert screen.selected == 0
        await pilot.press("left", "left")
        assert screen.selected == 7
        assert "GPU7" in plain(screen.query_one("#node-select", Static).content)


async def test_invisible_pid_says_so_instead_of_showing_a_wrong_process() -> None:
    store, pipeline = demo_store()
    add_invisible(pipeline, store, "node01", pid=555001, gpu=2)
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.open_node("node01")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        hidden = plain(screen.query_one("#node-hidden", Static).content)
        assert invisible_line(555001, 2) in hidden
        assert (
            "pid 555001 on GPU 2 is not visible to the agent (another PID namespace / container)"
            in hidden
        )
        procs = screen.query_one("#node-procs", DataTable)
        assert procs.row_count == 16  # the 16 visible ones; the ghost is not a table row
        pids = {str(procs.get_cell(k, "pid")).strip() for k in screen.proc_sync.rows}  # type: ignore[union-attr]
        assert "555001" not in pids


async def test_node_screen_refreshes_only_while_active(monkeypatch: Any) -> None:
    """Drawn once by its mount (not by a later resize or tick: ``is_mounted`` is still False
    while Mount is handled, and testing it left the screen blank until the next tick), then
    only when the store changed, and never once popped."""
    monkeypatch.setattr(NodeScreen, "on_resize", lambda self: None)
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.open_node("node04", 1)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        before = screen.refresh_count
        assert before == 1
        assert "CPU" in plain(screen.query_one("#node-host", Static).content)
        app.refresh_now()  # nothing new: no redraw
        assert screen.refresh_count == before
        h = store.hosts["node04"]
        assert h.latest is not None
        pipeline.emit(HostSample(**{**vars(h.latest), "t": h.latest.t + 1, "cpu_pct": 77.0}))
        app.refresh_now()
        assert screen.refresh_count == before + 1
        assert "CPU 77 %" in plain(screen.query_one("#node-host", Static).content)
        await pilot.press("escape")
        await pilot.pause()
        pipeline.emit(HostSample(**{**vars(h.latest), "t": h.latest.t + 2, "cpu_pct": 12.0}))
        app.refresh_now()  # the popped screen is not refreshed any more
        assert screen.refresh_count == before + 1


async def test_node_screen_shows_cores_probes_and_log_tail() -> None:
    store, pipeline = demo_store(extras=True)
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        app.open_node("node02")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        host = plain(screen.query_one("#node-host", Static).content)
        assert "192 cores:" in host and "Memory" in host and "Net rx" in host
        probes = plain(screen.query_one("#node-probes", Static).content)
        assert "torch all_reduce intra · 1 ranks" in probes and "Socket" in probes
        log = plain(screen.query_one("#node-log", Static).content).splitlines()
        demo_log = (resources.files("verl_top") / "data" / "demo_verl.log").read_text()
        last = demo_log.splitlines()[-1]
        assert any(last[:60] in line for line in log)
        assert len([ln for ln in log if ln.strip()]) <= 16  # title + the last 15 lines


def test_node_screen_snapshot(snap_compare) -> None:
    store, pipeline = demo_store(extras=True)
    app = make_app(store, pipeline)

    async def open_node(pilot: Any) -> None:
        await pilot.pause()
        app.refresh_now()
        app.open_node("node02")
        await pilot.pause()

    assert snap_compare(app, run_before=open_node, terminal_size=SIZE)


# -- snapshot export (key s) --------------------------------------------------------------------


async def wait_export(app: VerlTopApp, pilot: Any, before: int) -> None:
    for _ in range(200):
        await pilot.pause()
        if app.snapshots.exports > before:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the snapshot worker did not finish")


def messages(app: VerlTopApp) -> list[tuple[str, str]]:
    return [(n.message, n.severity) for n in app._notifications]  # noqa: SLF001


async def test_s_writes_a_snapshot_bundle_in_the_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(app, pilot)
        await pilot.press("s")
        assert any(m.startswith("writing snapshot…") for m, _ in messages(app))
        await wait_export(app, pilot, 0)
        outcome = app.snapshots.last
        assert outcome is not None and outcome.error == ""
        assert outcome.path is not None and outcome.path.parent == tmp_path
        assert outcome.path.name.startswith("verl-top-snapshot-")
        files = {p.name for p in outcome.path.iterdir()}
        assert {"snapshot.json", "screen.svg", "report.md", "recording.ndjson.gz"} <= files
        doc = json.loads((outcome.path / "snapshot.json").read_text())
        assert len(doc["hosts"]) == 4
        assert "<svg" in (outcome.path / "screen.svg").read_text()[:2000]
        assert any(f"snapshot written to {outcome.path}" in m for m, _ in messages(app))
        assert app.is_running


async def test_a_failing_snapshot_is_an_error_notification_and_the_app_carries_on(
    tmp_path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store, pipeline = demo_store()
    app = make_app(store, pipeline)
    app.snapshots.directory = lambda: blocker / "verl-top-snapshot-x"  # parent is a file
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(app, pilot)
        await pilot.press("s")
        await wait_export(app, pilot, 0)
        outcome = app.snapshots.last
        assert outcome is not None and outcome.path is None
        assert "snapshot failed: cannot write the snapshot to" in outcome.error
        assert str(blocker) in outcome.error
        assert (outcome.error, "error") in messages(app)
        assert not app.snapshots.busy
        await pilot.press("4")  # the session carries on
        await pilot.pause()
        assert app.is_running and app.visible_step() == 4


def test_frozen_store_does_not_follow_later_ingests() -> None:
    store, pipeline = demo_store()
    frozen = snapshot_action.freeze_store(store)
    h = store.hosts["node01"]
    assert h.latest is not None
    n_gpu = len(h.gpus[0].history)
    pipeline.emit(HostSample(**{**vars(h.latest), "t": h.latest.t + 1}))
    pipeline.emit(HostSample(host="node09", t=DEMO_END + 1, cpu_pct=1.0))  # a new host
    assert "node09" in store.hosts and "node09" not in frozen.hosts
    assert frozen.hosts["node01"].latest is not store.hosts["node01"].latest
    assert len(frozen.hosts["node01"].gpus[0].history) == n_gpu
    assert frozen.now < store.now


def test_default_snapshot_dir_is_stamped_under_the_cwd(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = snapshot_action.default_snapshot_dir(now=1764662769.0)
    assert path.parent == Path(tmp_path)
    assert re.fullmatch(r"verl-top-snapshot-202512\d\d-\d{6}", path.name)
