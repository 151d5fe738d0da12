"""The findings screen (key ``d``): all five steps with findings, passed checks and checks without data."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top.assessment import Assessment
from verl_top.compare import Comparison, fmt_s, fmt_signed
from verl_top.ui.widgets import STEP_NAMES, render_finding, step_checks, step_findings
from verl_top.untrusted import clean_text


def render_verdict(
    assessment: Assessment | None, palette: dict[str, str] | None = None
) -> RenderableType:
    """The whole assessment, step by step."""
    if assessment is None or assessment.verdict is None:
        return Text("reading: no diagnosis yet", style="italic")
    parts: list[RenderableType] = []
    bottleneck = assessment.bottleneck_step
    parts.append(Text(f"Verdict: {clean_text(assessment.status.text)}", style="bold"))
    if assessment.window:
        parts.append(Text(f"Covers: {clean_text(assessment.window)}", style="dim"))
    if assessment.comparison is not None:
        parts.append(comparison_block(assessment.comparison))
    for step in range(1, 6):
        title = Text()
        mark = "● " if step == bottleneck else "  "
        title.append(f"\n{mark}Step {step} — {STEP_NAMES[step]}", style="bold underline")
        if step == bottleneck:
            title.append("  (bottleneck)", style="bold")
        parts.append(title)
        findings = step_findings(assessment, step)
        checks = step_checks(assessment, step)
        if findings:
            parts.extend(render_finding(f, palette) for f in findings)
        else:
            parts.append(Text("  no finding", style="dim"))
        passed = [c for c in checks if c.status == "passed"]
        no_data = [c for c in checks if c.status == "no_data"]
        if passed:
            t = Text("  passed: ", style="bold")
            t.append(", ".join(c.rule for c in passed), style="dim")
            parts.append(t)
        if no_data:
            parts.append(Text("  without data:", style="bold"))
            for c in no_data:
                line = Text(f"    {c.rule}", style="")
                if c.detail:
                    line.append(f": {clean_text(c.detail)}", style="dim")
                parts.append(line)
    return Group(*parts)


def comparison_block(comparison: Comparison) -> RenderableType:
    """--baseline: the verdict of the comparison and the stages that moved beyond noise."""
    out = Text("\nAgainst the baseline ", style="bold underline")
    out.append(f"({clean_text(comparison.baseline.path)})", style="dim")
    out.append(f"\n  {clean_text(comparison.verdict)}")
    for d in [d for d in comparison.stages if d.significant][:6]:
        out.append(
            f"\n    {d.stage}: {fmt_s(d.baseline_s or 0)} -> {fmt_s(d.current_s or 0)} "
            f"({fmt_signed(d.delta_s)}, band ±{fmt_s(d.noise_s)})"
        )
    for key, a, b in comparison.config_diff[:8]:
        out.append(
            f"\n    config {clean_text(key)}: {clean_text(str(a))} -> {clean_text(str(b))}",
            style="dim",
        )
    return out


class FindingsScreen(Screen):
    """Full-screen list of the diagnosis; Esc (or d) goes back."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, assessment: Assessment, palette: dict[str, str] | None = None) -> None:
        super().__init__()
        self.assessment = assessment
        self.palette = palette or {}

    def compose(self) -> ComposeResult:
        yield Static(" Diagnosis — the five steps (Esc to go back)", id="findings-title")
        with VerticalScroll(id="findings-scroll"):
            yield Static(render_verdict(self.assessment, self.palette), id="findings-body")
        yield Footer(show_command_palette=False)
