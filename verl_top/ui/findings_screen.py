"""The findings screen (key ``d``): all five steps with findings, passed checks and checks without data."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top.ui.widgets import STEP_NAMES, render_finding, step_checks, step_findings
from verl_top.untrusted import clean_text


def render_verdict(verdict: Any, palette: dict[str, str] | None = None) -> RenderableType:
    """The whole verdict, step by step."""
    if verdict is None:
        return Text("reading: no diagnosis yet", style="italic")
    parts: list[RenderableType] = []
    headline = getattr(verdict, "headline", "")
    bottleneck = getattr(verdict, "bottleneck_step", None)
    parts.append(Text(f"Verdict: {clean_text(headline) or 'no headline'}", style="bold"))
    for step in range(1, 6):
        title = Text()
        mark = "● " if step == bottleneck else "  "
        title.append(f"\n{mark}Step {step} — {STEP_NAMES[step]}", style="bold underline")
        if step == bottleneck:
            title.append("  (bottleneck)", style="bold")
        parts.append(title)
        findings = step_findings(verdict, step)
        checks = step_checks(verdict, step)
        if findings:
            parts.extend(render_finding(f, palette) for f in findings)
        else:
            parts.append(Text("  no finding", style="dim"))
        passed = [c for c in checks if getattr(c, "status", "") == "passed"]
        no_data = [c for c in checks if getattr(c, "status", "") == "no_data"]
        if passed:
            t = Text("  passed: ", style="bold")
            t.append(", ".join(c.rule for c in passed), style="dim")
            parts.append(t)
        if no_data:
            parts.append(Text("  without data:", style="bold"))
            for c in no_data:
                line = Text(f"    {c.rule}", style="")
                if getattr(c, "detail", ""):
                    line.append(f": {clean_text(c.detail)}", style="dim")
                parts.append(line)
    return Group(*parts)


class FindingsScreen(Screen):
    """Full-screen list of the diagnosis; Esc (or d) goes back."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, verdict: Any, palette: dict[str, str] | None = None) -> None:
        super().__init__()
        self.verdict = verdict
        self.palette = palette or {}

    def compose(self) -> ComposeResult:
        yield Static(" Diagnosis — the five steps (Esc to go back)", id="findings-title")
        with VerticalScroll(id="findings-scroll"):
            yield Static(render_verdict(self.verdict, self.palette), id="findings-body")
        yield Footer(show_command_palette=False)
