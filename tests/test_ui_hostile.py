"""The UI never reads foreign text as Rich markup (issue 16).

Process titles, user names, GPU names, log lines, events, probe errors, NCCL fields and config
values come from other people's processes. A real verl command line holds ``[...]`` (Hydra list
overrides), which Rich would parse as markup: it must show literally, and ``[link=...]`` must
never become a live hyperlink. The store here is the demo recording plus hostile records, fed
through the real pipeline.
"""

from __future__ import annotations

import asyncio
import io
import xml.etree.ElementTree as ET
from typing import Any

from rich.console import Console
from test_ui_node import DEMO_END, FixedEngine, demo_store, started
from textual.widgets import DataTable, Static

from verl_top.inputs import Inputs
from verl_top.model import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    Hello,
    HostState,
    LogEvent,
    LogLines,
    NcclInfo,
    ProbeResult,
    ProcessList,
    VerlConfig,
)
from verl_top.ui.app import VerlTopApp
from verl_top.ui.node_screen import NodeScreen

VERL_CMD = "python3 -m verl.trainer.main_ppo data.train_files=[/data/gsm8k/train.parquet]"
LINK = "[link=https://evil.example/x]click me[/link]"
ESCAPES = "\x1b]52;c;aGk=\x07\x1b]0;pwned\x07\x1b[31m\x00\x0b\x7f\u202e"  # OSC 52/0, CSI, C0, bidi
HOSTILE = f"{VERL_CMD} {LINK} [/] [bold red]red[/bold red] [/oops]{ESCAPES}"
HOST = "evil[/]"


def hostile_store() -> tuple[Any, Any]:
    """The demo store plus a host whose every foreign string is hostile."""
    store, pipeline = demo_store()
    t = DEMO_END - 5
    pipeline.emit(
        Hello(
            host=HOST,
            t=t,
            agent_version="[bold]9[/bold]",
            python="3.[red]12",
            backend="pynvml",
            driver="[/]",
            gpus=[GpuInfo(index=0, name="NVIDIA [link=https://x]H200[/link]", mem_total_mib=1e5)],
        )
    )
    pipeline.emit(GpuSample(host=HOST, t=t, index=0, util_gpu=50.0, mem_used_mib=10.0))
    procs = [
        GpuProcess(pid=4242, gpu_index=0, used_mib=1024.0, user="[bold]root[/]", cmd=HOSTILE),
        GpuProcess(pid=4243, gpu_index=0, used_mib=512.0, user="u", cmd="[/]"),
    ]
    pipeline.emit(ProcessList(host=HOST, t=t, procs=procs))
    pipeline.emit(LogLines(host=HOST, t=t, path="/x/[b]log", kind="verl", lines=[HOSTILE, "[/]"]))
    pipeline.emit(LogEvent(host=HOST, t=t, kind="nccl_warn", text=HOSTILE, path="[/]"))
    pipeline.emit(NcclInfo(host=HOST, t=t, transport="[link=https://x]IB[/link]", version="[/]"))
    pipeline.emit(ProbeResult(host=HOST, t=t, tool="torch", hosts=[HOST], ok=False, error=HOSTILE))
    pipeline.emit(VerlConfig(host="driver", t=t, values={"data.train_files": "[/data/x]"}))
    pipeline.emit(HostState(host=HOST, t=t, state="up", reason="[/]"))
    store.notes.append(f"note {HOSTILE}")
    return store, pipeline


def text_of(widget: Any) -> str:
    """What a Static shows, as plain text."""
    content = widget.content
    if isinstance(content, str):
        return content
    console = Console(width=400, file=io.StringIO(), record=True)
    console.print(content)
    return console.export_text()


def screen_text(app: VerlTopApp) -> str:
    """Plain text of every Static and every DataTable cell on the current screen."""
    parts = [text_of(s) for s in app.screen.query(Static)]
    for table in app.screen.query(DataTable):
        for row in range(table.row_count):
            parts.extend(str(c) for c in table.get_row_at(row))
    return "\n".join(parts)


def links(renderable: Any) -> list[str]:
    """Hyperlinks in what ``renderable`` draws."""
    console = Console(width=400, file=io.StringIO())
    return [seg.style.link for seg in console.render(renderable) if seg.style and seg.style.link]


def no_links(app: VerlTopApp) -> None:
    """No hyperlink reached the screen; every foreign cell is plain Text; the SVG is valid XML."""
    for static in app.screen.query(Static):
        content = static.content
        # A str content is parsed as markup by Static: foreign text must arrive as Text.
        assert not isinstance(content, str) or "[" not in content, (static.id, content)
        if not isinstance(content, str):
            assert links(content) == [], static.id
    for table in app.screen.query(DataTable):
        for row in range(table.row_count):
            for cell in table.get_row_at(row):
                # A str cell is parsed as markup by DataTable: foreign text must arrive as Text.
                assert not (isinstance(cell, str) and "[" in cell), (table.id, cell)
    svg = app.export_screenshot()
    ET.fromstring(svg)  # valid XML: no control character reached it
    assert "\x1b" not in svg and "pwned" not in svg


async def test_hostile_strings_show_literally_in_every_pane_and_the_node_screen() -> None:
    store, pipeline = hostile_store()
    app = VerlTopApp(
        Inputs(store=store, pipeline=pipeline, mode="REPLAY", title="[b]t"),
        engine=FixedEngine(),
        live=False,
    )
    async with app.run_test(size=(200, 60)) as pilot:
        await started(app, pilot)
        for key in "12345":
            await pilot.press(key)
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            no_links(app)
        await pilot.press("4")
        await pilot.pause()
        assert f"{HOST}" in screen_text(app)  # the node map names the host literally
        app.open_node(HOST, 0)
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        shown = screen_text(app)
        assert "data.train_files=[/data/gsm8k/train.parquet]" in shown
        assert "[link=https://evil.example/x]" in shown
        assert "[bold]root[/]" in shown
        no_links(app)
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running


async def test_hostile_no_gpu_reason_and_notes_show_literally_in_banner_and_toasts() -> None:
    from verl_top.diagnosis.engine import Engine
    from verl_top.model import HostSample
    from verl_top.sources.pipeline import Pipeline
    from verl_top.store import Store

    store = Store(wall_clock=lambda: DEMO_END)
    pipeline = Pipeline(store, parsers={}, wall_clock=lambda: DEMO_END)
    pipeline.emit(Hello(host="box", t=DEMO_END - 2, backend="none", error=HOSTILE))
    pipeline.emit(HostState(host="box", t=DEMO_END - 2, state="no_gpu", reason=HOSTILE))
    pipeline.emit(HostSample(host="box", t=DEMO_END - 1, cpu_pct=5.0))
    store.notes.append(f"note {HOSTILE}")
    app = VerlTopApp(Inputs(store=store, pipeline=pipeline), engine=Engine(), live=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await started(app, pilot)
        await asyncio.sleep(0.2)
        await pilot.pause()
        assert "[link=https://evil.example/x]" in text_of(app.query_one("#banner", Static))
        no_links(app)  # toasts are Statics on the screen too
        toasts = [n.message for n in app._notifications]  # noqa: SLF001 - what was notified
        assert any(LINK in m for m in toasts)
        assert app.is_running
