"""Pane 2 — Communication: is the network or synchronization slow?

Shows the NCCL transport found in NCCL_DEBUG=INFO logs, bandwidth probe results (max busbw at
large sizes against the link's expectation), GPM NVLink / PCIe rates per GPU, weight-sync time
from verl steps and the latest NCCL warnings / watchdog events. Each missing input is named with
the flag that provides it.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from verl_top.store import Store
from verl_top.ui.panes.base import Pane
from verl_top.ui.widgets import DASH, fmt_num, missing

MISSING_NCCL = "no NCCL log: give --nccl-log PATH (NCCL_DEBUG=INFO output of the job)"
MISSING_PROBE = "no bandwidth probe yet: press p to run a probe (later), or `verl-top probe nccl`"
MAX_GPU_ROWS = 64  # the per-GPU link table is a sample; pane 1 lists every GPU
MAX_EVENTS = 8


def _title(text: str) -> Text:
    return Text(text, style="bold underline")


def nccl_block(store: Store) -> RenderableType:
    """Transport per NCCL log."""
    if not store.nccl:
        return Text(MISSING_NCCL, style="italic")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("log", "transport", "NCCL", "ranks", "nodes", "inits"):
        table.add_column(col)
    for key, info in store.nccl.items():
        transport = Text(info.transport or DASH)
        if info.transport.lower().startswith("socket"):
            transport.stylize("bold red")
            transport.append("  (RDMA off)")
        table.add_row(
            key,
            transport,
            info.version or DASH,
            fmt_num(info.nranks),
            fmt_num(info.nnodes),
            str(info.init_complete),
        )
    return table


def probe_block(store: Store) -> RenderableType:
    """Bandwidth probes, newest first."""
    if not store.probes:
        return Text(MISSING_PROBE, style="italic")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "tool",
        "collective",
        "scope",
        "ranks",
        "max busbw GB/s",
        "expected",
        "% of exp.",
        "link",
        "transport",
        "result",
    ):
        table.add_column(col)
    for p in list(store.probes)[::-1][:10]:
        pct = (
            p.busbw_max_gbs / p.expected_gbs * 100
            if p.busbw_max_gbs is not None and p.expected_gbs
            else None
        )
        pct_text = Text(fmt_num(pct, "{:.0f}", "%"))
        if pct is not None and pct < 60:
            pct_text.stylize("bold red")
        table.add_row(
            p.tool or DASH,
            p.collective,
            p.scope,
            str(p.nranks),
            fmt_num(p.busbw_max_gbs, "{:.1f}"),
            fmt_num(p.expected_gbs, "{:.0f}"),
            pct_text,
            p.link or DASH,
            p.transport or DASH,
            Text("ok" if p.ok else f"failed: {p.error}", style="" if p.ok else "red"),
        )
    return table


def link_block(store: Store) -> RenderableType:
    """GPM NVLink / PCIe rates per GPU (MiB/s)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("host", "GPU", "NVLink TX", "NVLink RX", "PCIe TX", "PCIe RX"):
        table.add_column(col, justify="right" if col not in ("host",) else "left")
    shown = 0
    any_value = False
    for g in store.iter_gpus():
        s = g.latest
        if s is None:
            continue
        vals = (s.nvlink_tx_mibs, s.nvlink_rx_mibs, s.pcie_tx_mibs, s.pcie_rx_mibs)
        any_value = any_value or any(not missing(v) for v in vals)
        if shown < MAX_GPU_ROWS:
            table.add_row(g.host, str(g.index), *(fmt_num(v, "{:,.0f}") for v in vals))
            shown += 1
    if not shown:
        return Text("no GPU samples yet", style="italic")
    if not any_value:
        return Text(
            "no NVLink/PCIe rates: the GPUs do not report GPM link counters (Hopper+ with GPM)",
            style="italic",
        )
    total = store.gpu_count()
    if total > shown:
        return Group(table, Text(f"… {total - shown} more GPUs", style="dim"))
    return table


def sync_block(store: Store) -> RenderableType:
    """Weight-sync time of recent steps and its share of the step."""
    if not store.steps:
        return Text("no verl log: give --verl-log PATH (weight-sync time per step)", style="italic")
    rows = []
    for st in list(store.steps)[-5:]:
        m = st.metrics
        sync = m.get("timing_s/update_weights", m.get("timing_s/reshard", m.get("timing/reshard")))
        step = m.get("timing_s/step", m.get("timing/step"))
        if sync is None:
            continue
        share = f" ({sync / step * 100:.0f}% of step)" if step else ""
        rows.append(f"step {st.step}: {sync:.2f} s{share}")
    if not rows:
        return Text(
            "the verl log has no timing_s/update_weights (or reshard) metric", style="italic"
        )
    return Text("weight sync: " + " · ".join(rows))


def events_block(store: Store) -> RenderableType:
    """The newest NCCL warnings and watchdog events."""
    events = [e for e in store.events if e.kind in ("nccl_warn", "watchdog", "error")]
    if not events:
        return Text("no NCCL warnings or watchdog timeouts seen", style="dim")
    text = Text()
    for e in events[-MAX_EVENTS:]:
        style = "bold red" if e.severity >= 0.7 else "yellow"
        text.append(f"{e.kind:<10} {e.host} ", style=style)
        text.append(e.text[:200] + "\n")
    return text


class CommunicationPane(Pane):
    """Pane 2: transport, probes, link rates, weight sync, NCCL events."""

    STEP = 2

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="comm-body", classes="body")

    def update_content(self, store: Store, verdict: Any) -> None:
        body = Group(
            _title("NCCL transport"),
            nccl_block(store),
            Text(""),
            _title("Bandwidth probes"),
            probe_block(store),
            Text(""),
            _title("Weight sync"),
            sync_block(store),
            Text(""),
            _title("NCCL events"),
            events_block(store),
            Text(""),
            _title("GPU links (GPM, MiB/s)"),
            link_block(store),
        )
        self.query_one("#comm-body", Static).update(body)
