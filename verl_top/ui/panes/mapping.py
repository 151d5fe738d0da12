"""Pane 4 — Parallelism & mapping: are GPUs used evenly and placed well?

A nodes × GPUs grid coloured by mean activity over the window (with each node's mean and
spread), the GPU processes with their verl roles when the nodes report them, and the parallel
sizes from the job's config next to the GPU count seen.
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
from verl_top.ui.widgets import DASH, activity_style, fmt_num

PARALLEL_KEYS = (
    ("trainer.nnodes", "nodes"),
    ("trainer.n_gpus_per_node", "GPUs per node"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "rollout TP"),
    ("actor_rollout_ref.rollout.data_parallel_size", "rollout DP"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "actor TP (Megatron)"),
    ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size", "actor PP (Megatron)"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "Ulysses SP"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", "FSDP size"),
)
MAX_PROCS = 40


def grid_block(store: Store, palette: dict[str, str]) -> RenderableType:
    """One row per node, one coloured cell per GPU (mean activity over the window)."""
    if not store.hosts:
        return Text("no hosts yet", style="italic")
    width = max((len(h.gpus) for h in store.hosts.values()), default=0)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("node")
    for i in range(width):
        table.add_column(str(i), justify="right", width=4)
    table.add_column("mean", justify="right")
    table.add_column("spread", justify="right")
    since = store.window_start()
    for h in store.hosts.values():
        cells: list[Any] = [Text(h.name, style="" if store.is_live(h.name) else "dim")]
        acts = []
        for i in range(width):
            g = h.gpus.get(i)
            if g is None:
                cells.append("")
                continue
            vals = g.history.recent_values("activity", since)
            act = sum(vals) / len(vals) if vals else None
            if act is not None:
                acts.append(act)
            style = activity_style(act, palette) if store.is_live(h.name) else "dim"
            cells.append(Text(f"█{fmt_num(act)}", style=style))
        mean_act = sum(acts) / len(acts) if acts else None
        spread = max(acts) - min(acts) if acts else None
        cells += [fmt_num(mean_act), fmt_num(spread)]
        if not store.is_live(h.name):
            cells[-1] = Text(f"{h.state}", style="dim")
        table.add_row(*cells)
    return table


def procs_block(store: Store) -> RenderableType:
    """GPU processes with their roles, when the agents report them."""
    rows = []
    for h in store.hosts.values():
        if h.procs is None:
            continue
        for p in h.procs.procs:
            rows.append((h.name, p))
    if not rows:
        return Text(
            "no GPU process list yet (the node agents report it; roles come from the process "
            "command lines)",
            style="italic",
        )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("node", "GPU", "pid", "role", "rank", "MiB", "command"):
        table.add_column(col)
    for host, p in rows[:MAX_PROCS]:
        table.add_row(
            host,
            str(p.gpu_index),
            str(p.pid),
            p.role or DASH,
            DASH if p.rank is None else str(p.rank),
            fmt_num(p.used_mib),
            (p.cmd or "")[:60],
        )
    if len(rows) > MAX_PROCS:
        return Group(table, Text(f"… {len(rows) - MAX_PROCS} more", style="dim"))
    return table


def parallel_block(store: Store) -> RenderableType:
    """Parallel sizes from the config, and which keys are missing."""
    text = Text()
    text.append(f"GPUs seen: {store.gpu_count()} on {len(store.hosts)} nodes\n")
    missing = []
    for key, label in PARALLEL_KEYS:
        if key in store.config:
            text.append(f"{label}: ", style="dim")
            text.append(f"{store.config[key]}  ", style="bold")
        else:
            missing.append(key)
    if missing:
        text.append("\nnot in the config: " + ", ".join(missing), style="dim")
        if not store.config:
            text.append(
                "\nno config: give --verl-config FILE or a driver log that printed the config",
                style="italic",
            )
    return text


class MappingPane(Pane):
    """Pane 4: nodes × GPUs activity grid, processes and parallel sizes."""

    STEP = 4

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="map-body", classes="body")

    def update_content(self, store: Store, verdict: Any) -> None:
        body = Group(
            Text("Activity by node and GPU (mean over the window, %)", style="bold underline"),
            grid_block(store, self.palette()),
            Text(""),
            Text("Parallel sizes", style="bold underline"),
            parallel_block(store),
            Text(""),
            Text("GPU processes", style="bold underline"),
            procs_block(store),
        )
        self.query_one("#map-body", Static).update(body)
