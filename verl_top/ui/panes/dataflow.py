"""Pane 3 — Dataflow: which stage of the RL step eats the time?

A table of the last steps' stage times (verl ``timing_s/*``, older ``timing/*``) with each stage's
share of the step, plus the rollout long tail (``agent_loop/generate_sequences`` max vs mean).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from verl_top.model import VerlStep
from verl_top.store import Store
from verl_top.ui.panes.base import Pane

# Stages in the order of an RL step.
STAGES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "reshard",
    "testing",
    "save_checkpoint",
)
MISSING_VERL = (
    "no verl log: give --verl-log PATH (the driver's console log or the file logger's JSONL)"
)
LAST_STEPS = 12


def stage_time(metrics: dict[str, float], stage: str) -> float | None:
    """Seconds of ``stage`` in one step (``timing_s/`` or the older ``timing/`` prefix)."""
    value = metrics.get(f"timing_s/{stage}")
    if value is None:
        value = metrics.get(f"timing/{stage}")
    return None if value is None else float(value)


def step_time(metrics: dict[str, float]) -> float | None:
    """Wall time of the whole step."""
    for key in ("timing_s/step", "timing/step", "perf/time_per_step"):
        if key in metrics:
            return float(metrics[key])
    return None


def steps_table(steps: list[VerlStep]) -> Table:
    """Stage seconds and share of step for each of ``steps``."""
    present = [s for s in STAGES if any(stage_time(st.metrics, s) is not None for st in steps)]
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("step", justify="right")
    table.add_column("step s", justify="right")
    for stage in present:
        table.add_column(stage, justify="right")
    for st in steps:
        total = step_time(st.metrics)
        cells: list[Any] = [str(st.step), "—" if total is None else f"{total:.1f}"]
        for stage in present:
            v = stage_time(st.metrics, stage)
            if v is None:
                cells.append("—")
                continue
            share = v / total * 100 if total else None
            cell = Text(f"{v:.1f}")
            if share is not None:
                cell.append(f" {share:.0f}%", style="bold" if share >= 30 else "dim")
            cells.append(cell)
        table.add_row(*cells)
    return table


def long_tail_line(step: VerlStep) -> Text | None:
    """Rollout long tail of the last step, when its agent-loop metrics are present."""
    m = step.metrics
    mx = m.get("timing_s/agent_loop/generate_sequences/max")
    mn = m.get("timing_s/agent_loop/generate_sequences/mean")
    if mx is None or not mn:
        return None
    ratio = mx / mn
    text = Text(
        f"rollout long tail (step {step.step}): slowest sequence {mx:.1f} s vs mean {mn:.1f} s = "
    )
    text.append(f"{ratio:.1f}×", style="bold red" if ratio > 2 else "bold")
    return text


class DataflowPane(Pane):
    """Pane 3: per-step stage times."""

    STEP = 3

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="flow-body", classes="body")

    def update_content(self, store: Store, verdict: Any) -> None:
        body: RenderableType
        if not store.steps:
            body = Text(MISSING_VERL, style="italic")
        else:
            steps = list(store.steps)[-LAST_STEPS:]
            parts: list[RenderableType] = [
                Text(
                    f"Stage times of the last {len(steps)} steps (seconds, share of step)",
                    style="bold underline",
                ),
                steps_table(steps),
            ]
            tail = long_tail_line(steps[-1])
            if tail is not None:
                parts += [Text(""), tail]
            body = Group(*parts)
        self.query_one("#flow-body", Static).update(body)
