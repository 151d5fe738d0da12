"""Pane 2 — Communication: is the network or synchronization slow?

Bandwidth probe results per node and across nodes (max busbw at large sizes against the link's
expectation, the ratio coloured like the nccl.busbw_low rule; a one-GPU probe has no bus), the
NCCL transport found in NCCL_DEBUG=INFO logs, weight-sync time per step and its share, "sync
wait" per node (all its GPUs idle while another node works), NCCL warnings / watchdog events
newest first, and GPM NVLink / PCIe rates per GPU. Each missing input is named with the flag or
key that provides it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from verl_top.assessment import Assessment
from verl_top.diagnosis.step2_comm import judge_probe, node_waits
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.model import ProbeResult
from verl_top.nccl.expected import ratio
from verl_top.origin import missing_steps_text
from verl_top.store import Store
from verl_top.ui.panes.base import Pane
from verl_top.ui.panes.dataflow import StepViews
from verl_top.ui.widgets import DASH, add_plain_row, fmt_num, missing
from verl_top.untrusted import clean_text
from verl_top.verl.stages import StepView

MISSING_NCCL = "no NCCL log: give --nccl-log PATH (NCCL_DEBUG=INFO output of the job)"
MISSING_PROBE = (
    "no bandwidth probe yet: press p to run a probe on this machine, "
    "or run `verl-top probe nccl` on a node"
)
NO_BUS = "1 GPU: no bus to measure"
MAX_GPU_ROWS = 64  # the per-GPU link table is a sample; pane 1 lists every GPU
MAX_EVENTS = 10
MAX_PROBES = 12
SYNC_STEPS = 8
LOW_RATIO = 0.6  # nccl.busbw_low fires below this share of the expected busbw
OK_RATIO = 0.8


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
        transport = Text(clean_text(info.transport) or DASH)
        if info.transport.lower().startswith("socket"):
            transport.stylize("bold red")
            transport.append("  (RDMA off)")
        add_plain_row(
            table,
            key,
            transport,
            info.version or DASH,
            fmt_num(info.nranks),
            fmt_num(info.nnodes),
            str(info.init_complete),
        )
    return table


def probe_key(p: ProbeResult) -> tuple[str, ...]:
    """What a probe measured: scope, collective and the hosts it spanned."""
    hosts = tuple(p.hosts) or (p.host,)
    return (p.scope, p.collective, *hosts)


def latest_probes(store: Store) -> list[ProbeResult]:
    """The newest probe of each (scope, collective, hosts), newest first."""
    seen: set[tuple[str, ...]] = set()
    out: list[ProbeResult] = []
    for p in reversed(store.probes):
        key = probe_key(p)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out


def ratio_style(r: float | None, palette: dict[str, str] | None = None) -> str:
    """Colour of a measured/expected ratio: red below the busbw_low rule's 60 %, yellow < 80 %."""
    tv = palette or {}
    if r is None:
        return "dim"
    if r < LOW_RATIO:
        return f"bold {tv.get('error', 'red')}"
    if r < OK_RATIO:
        return tv.get("warning", "yellow")
    return tv.get("success", "green")


def probe_block(
    store: Store, palette: dict[str, str] | None = None, th: Thresholds | None = None
) -> RenderableType:
    """Bandwidth probes per node (intra) and across nodes (inter), newest of each first.

    Peak and expectation are the nccl.busbw_low rule's own (``judge_probe``): the largest sizes
    present, and the expectation from --expect-busbw, the nodes' inventory, the NCCL log or an
    assumption, whose basis is printed under the table."""
    if not store.probes:
        return Text(MISSING_PROBE, style="italic")
    th = th or Thresholds()
    view = View(store, th)
    bases: list[str] = []
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "where",
        "scope",
        "collective",
        "ranks",
        "max busbw GB/s",
        "expected",
        "ratio",
        "link",
        "transport",
        "tool",
        "result",
    ):
        table.add_column(col)
    for p in latest_probes(store)[:MAX_PROBES]:
        where = ",".join(p.hosts) or p.host
        if p.nranks == 1 and p.ok:
            add_plain_row(
                table,
                where,
                p.scope,
                p.collective,
                "1",
                Text(NO_BUS, style="dim"),
                DASH,
                DASH,
                DASH,
                DASH,
                p.tool or DASH,
                Text("ok", style="dim"),
            )
            continue
        j = judge_probe(view, th, p) if p.ok else None
        peak = j.got if j is not None else p.busbw_max_gbs
        expected = j.expected if j is not None else p.expected_gbs
        r = ratio(peak, expected)
        if j is not None and j.basis and j.expected:
            bases.append(f"{where}: expected {j.expected:.0f} GB/s from {j.basis}")
        transport = Text(clean_text(p.transport) or DASH)
        if p.transport.lower().startswith("socket") and p.scope == "inter":
            transport.stylize("bold red")
            transport.append(" (RDMA off)")
        add_plain_row(
            table,
            where,
            p.scope,
            p.collective,
            str(p.nranks or DASH),
            fmt_num(peak, "{:.1f}"),
            fmt_num(expected, "{:.0f}") + ("?" if j is not None and j.assumed else ""),
            Text(
                fmt_num(None if r is None else r * 100, "{:.0f}", "%"),
                style=ratio_style(r, palette),
            ),
            p.link or DASH,
            transport,
            p.tool or DASH,
            Text(
                "ok" if p.ok else clean_text(f"failed: {p.error}", 80), style="" if p.ok else "red"
            ),
        )
    if not bases:
        return table
    notes = Text("\n".join(bases[:MAX_PROBES]), style="dim")
    return Group(table, notes)


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
            add_plain_row(table, g.host, str(g.index), *(fmt_num(v, "{:,.0f}") for v in vals))
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


def sync_block(
    store: Store, views: list[StepView], palette: dict[str, str] | None = None
) -> RenderableType:
    """Weight-sync time per step (``update_weights``, older ``reshard``) and its share of step."""
    tv = palette or {}
    if not store.steps:
        return Text(missing_steps_text(store, "weight-sync time per step"), style="italic")
    rows = [v for v in views if "update_weights" in v.stage_times][-SYNC_STEPS:]
    if not rows:
        return Text(
            "the verl log has no timing_s/update_weights (or reshard) metric", style="italic"
        )
    limit = Thresholds().weight_update_frac
    text = Text()
    for v in rows:
        share = v.share("update_weights")
        text.append(f"step {v.step}: {v.stage_times['update_weights']:.2f} s")
        if share is not None:
            style = f"bold {tv.get('error', 'red')}" if share > limit else "dim"
            text.append(f" {share * 100:.0f}%", style=style)
        if v.nested.get("update_weights") == "gen":
            text.append(" (reshard, inside gen)", style="dim")
        text.append("  ")
    shares = [x for v in rows if not v.is_outlier and (x := v.share("update_weights")) is not None]
    if shares:
        med = statistics.median(shares)
        text.append(f"\nmedian share {med * 100:.1f}% of the step", style="bold")
        text.append(f" (sync.weight_update fires above {limit * 100:.0f}%)", style="dim")
    return text


def events_block(store: Store, palette: dict[str, str] | None = None) -> RenderableType:
    """NCCL warnings, watchdog timeouts, errors and GPU XIDs (DCGM via --prometheus), newest
    first, coloured by severity."""
    tv = palette or {}
    events = [e for e in store.events if e.kind in ("nccl_warn", "watchdog", "error", "xid")]
    if not events:
        return Text("no NCCL warnings or watchdog timeouts seen", style="dim")
    text = Text()
    for e in list(reversed(events))[:MAX_EVENTS]:
        style = (
            f"bold {tv.get('error', 'red')}"
            if e.severity >= 0.7
            else tv.get("warning", "yellow")
            if e.severity >= 0.4
            else "dim"
        )
        stamp = time.strftime("%H:%M:%S", time.localtime(e.t)) if e.t else DASH
        text.append(clean_text(f"{stamp} {e.kind:<9} {e.host} "), style=style)
        text.append(clean_text(e.text, 200) + "\n")
    if len(events) > MAX_EVENTS:
        text.append(f"… {len(events) - MAX_EVENTS} older", style="dim")
    return text


def sync_wait_block(store: Store, palette: dict[str, str] | None = None) -> RenderableType:
    """Per node: seconds with all its GPUs idle while another node worked (rule sync.wait)."""
    tv = palette or {}
    th = Thresholds()
    waits = node_waits(View(store, th), th)
    if not waits:
        return Text("needs GPU samples from ≥ 2 nodes", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("node", "waiting s", "of s", "share", "episodes"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for w in sorted(waits.values(), key=lambda w: (-w.frac, w.host)):
        flagged = w.episodes >= th.sync_wait_episodes and w.frac > th.sync_wait_frac
        style = f"bold {tv.get('error', 'red')}" if flagged else ("" if w.waiting else "dim")
        add_plain_row(
            table,
            Text(clean_text(w.host), style=style),
            Text(str(w.waiting), style=style),
            str(w.seconds),
            Text(f"{w.frac * 100:.0f}%", style=style),
            str(w.episodes),
        )
    note = Text(
        f"all GPUs of the node < {th.sync_wait_idle_pct:.0f}% while another node's mean > "
        f"{th.sync_wait_busy_pct:.0f}%, last {th.window_s:.0f} s of data",
        style="dim",
    )
    return Group(table, note)


class CommunicationPane(Pane):
    """Pane 2: transport, probes, link rates, weight sync, sync wait, NCCL events."""

    STEP = 2

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._views = StepViews()

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="comm-body", classes="body")

    def update_content(self, store: Store, assessment: Assessment) -> None:
        self.query_one("#comm-body", Static).update(self.body(store, self.palette()))

    def _thresholds(self) -> Thresholds | None:
        """The thresholds the app's diagnosis uses (with --expect-busbw), None outside an app."""
        from verl_top.ui.app import VerlTopApp  # the app imports the panes

        try:
            app = self.app
        except Exception:  # noqa: BLE001 - no active app (a pane rendered on its own)
            return None
        return app.monitor.engine.thresholds if isinstance(app, VerlTopApp) else None

    def body(self, store: Store, palette: dict[str, str] | None = None) -> RenderableType:
        """Everything below the findings."""
        views = self._views.views(store) if store.steps else []
        return Group(
            _title("Bandwidth probes (p: run one on this machine)"),
            probe_block(store, palette, self._thresholds()),
            Text(""),
            _title("NCCL transport"),
            nccl_block(store),
            Text(""),
            _title("Weight sync per step (seconds, share of step)"),
            sync_block(store, views, palette),
            Text(""),
            _title("Sync wait per node"),
            sync_wait_block(store, palette),
            Text(""),
            _title("NCCL events (newest first)"),
            events_block(store, palette),
            Text(""),
            _title("GPU links (GPM, MiB/s)"),
            link_block(store),
        )
