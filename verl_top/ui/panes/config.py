"""Pane 5 — Config & scheduling: is a setting wasting the hardware?

One row per config key the rules read (verl_top.diagnosis.defaults, shared with the step-5 rules):
the value found in the job's config, verl's default, what it governs, and the recommendation —
the one a firing finding gives (with its title as evidence), else verl's standing advice. Above
the table: memory headroom (``perf/max_memory_reserved_gb`` against the GPU's memory from the
agent's hello). Works before any metric arrives: the config alone fills the table.
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from verl_top.assessment import Assessment
from verl_top.diagnosis.defaults import VERL_DEFAULTS, VerlDefault, fmt_default
from verl_top.diagnosis.findings import Finding, Verdict
from verl_top.store import Store
from verl_top.ui.panes.base import Pane
from verl_top.ui.widgets import add_plain_row, severity_style, step_findings
from verl_top.untrusted import clean_text

MISSING_CONFIG = "missing: --verl-config FILE or a driver log that printed the config"
RESERVED_KEYS = ("perf/max_memory_reserved_gb", "actor/perf/max_memory_reserved_gb")
GROUP_TITLES = {
    "parallel": "parallel sizes",
    "batch": "batch sizes and token budgets",
    "rollout": "rollout engine",
    "memory": "memory / offload",
    "schedule": "scheduling",
}
HEADROOM_RED = 0.95  # reserved share of device memory: OOM risk (cfg.memory_headroom)
HEADROOM_YELLOW = 0.85


def _same(value: Any, default: Any) -> bool:
    """Config value equals verl's default (``4`` == ``4.0``, ``"false"`` == ``False``)."""
    if value == default:
        return True
    return str(value).strip().lower() == fmt_default(default).lower()


def _strategy(config: dict[str, object]) -> str:
    return str(config.get("actor_rollout_ref.actor.strategy", "fsdp")).lower()


def shown_defaults(config: dict[str, object]) -> list[VerlDefault]:
    """Rows to show: every key, except the other trainer backend's keys when they are not set."""
    megatron = _strategy(config) == "megatron"
    out = []
    for d in VERL_DEFAULTS:
        if d.key in config:
            out.append(d)
        elif ".megatron." in d.key and not megatron:
            continue
        elif ".fsdp_config." in d.key and megatron:
            continue
        else:
            out.append(d)
    return out


def findings_for(assessment: Assessment | None, key: str) -> list[Finding]:
    """Findings whose evidence or advice names ``key``: step 5 first, then the others, worst first."""
    hits = []
    for step in (5, 1, 2, 3, 4):
        for f in step_findings(assessment, step):
            if any(key in line for line in f.evidence) or key in f.advice:
                hits.append(f)
    return hits


def recommendation_of(finding: Finding) -> str:
    """The finding's ``recommendation: …`` evidence line, else its advice."""
    for text in finding.evidence:
        if text.startswith("recommendation:"):
            return text[len("recommendation:") :].strip()
    return finding.advice


def advice_cell(d: VerlDefault, assessment: Assessment | None) -> Text:
    """Recommendation and evidence: the worst finding naming the key, else the standing advice."""
    hits = findings_for(assessment, d.key)
    if not hits:
        return Text(d.advice, style="dim")
    worst = hits[0]
    style = severity_style(worst.severity)
    text = Text("● ", style=style)
    text.append(worst.title, style=style)
    text.append(f" [{worst.rule}]", style="dim")
    rec = recommendation_of(worst)
    if rec:
        text.append(f"\n→ {rec}", style="italic")
    return text


def config_table(config: dict[str, object], assessment: Assessment | None = None) -> Table:
    """Value found vs verl default for each key the rules use, with recommendation and evidence."""
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    table.add_column("verl default")
    table.add_column("governs", max_width=34)
    table.add_column("recommendation / evidence", max_width=60)
    group = ""
    for d in shown_defaults(config):
        if d.group != group:
            group = d.group
            add_plain_row(table, Text(GROUP_TITLES.get(group, group), style="bold underline"))
        if d.key in config:
            raw = config[d.key]
            value = Text(clean_text(fmt_default(raw)))
            if not _same(raw, d.default):
                value.stylize("bold")
        else:
            value = Text("— (not set)", style="dim")
        add_plain_row(
            table,
            d.key,
            value,
            fmt_default(d.default),
            Text(d.governs, style="dim"),
            advice_cell(d, assessment),
        )
    return table


WIDE_TABLE = 150  # below this many columns the keys are listed one block each


def config_list(config: dict[str, object], assessment: Assessment | None = None) -> Group:
    """The same rows for a narrow terminal: key = value (default), then what it governs and the
    recommendation, indented under it; nothing is cut."""
    parts: list[RenderableType] = []
    group = ""
    for d in shown_defaults(config):
        if d.group != group:
            group = d.group
            parts.append(Text(GROUP_TITLES.get(group, group), style="bold underline"))
        line = Text(d.key)
        line.append(" = ")
        if d.key in config:
            raw = config[d.key]
            differs = not _same(raw, d.default)
            line.append(clean_text(fmt_default(raw)), style="bold" if differs else "")
        else:
            line.append("— (not set)", style="dim")
        line.append(f"  (verl default {fmt_default(d.default)})", style="dim")
        parts.append(line)
        detail = Text(d.governs, style="dim")
        detail.append("\n")
        detail.append_text(advice_cell(d, assessment))
        parts.append(Padding(detail, (0, 0, 0, 4)))
    return Group(*parts)


def reserved_gb(store: Store) -> tuple[float, int] | None:
    """Median ``perf/max_memory_reserved_gb`` over the steps that logged it, and their count."""
    values = []
    for st in list(store.steps)[-20:]:
        for key in RESERVED_KEYS:
            if key in st.metrics:
                values.append(float(st.metrics[key]))
                break
    return (statistics.median(values), len(values)) if values else None


def device_gib(store: Store) -> tuple[float, str] | None:
    """Largest GPU memory (GiB) and its model from the agents' hellos (else the samples)."""
    best: tuple[float, str] | None = None
    for h in store.hosts.values():
        if h.hello is not None:
            for g in h.hello.gpus:
                if g.mem_total_mib and (best is None or g.mem_total_mib / 1024 > best[0]):
                    best = (g.mem_total_mib / 1024, g.name)
        for entry in h.gpus.values():
            s = entry.latest
            if (
                s is not None
                and s.mem_total_mib
                and (best is None or s.mem_total_mib / 1024 > best[0])
            ):
                best = (s.mem_total_mib / 1024, best[1] if best else "")
    return best


def headroom_line(store: Store, palette: dict[str, str] | None = None) -> Text:
    """Trainer peak reserved memory against the GPU's total, and the headroom left."""
    tv = palette or {}
    reserved = reserved_gb(store)
    device = device_gib(store)
    text = Text("memory headroom: ", style="bold")
    if reserved is None or device is None:
        need = []
        if reserved is None:
            need.append("perf/max_memory_reserved_gb (--verl-log)")
        if device is None:
            need.append("the GPU memory size (agent hello)")
        text.append("needs " + " and ".join(need), style="italic")
        return text
    gb, n = reserved
    total, name = device
    frac = gb / total if total else 0.0
    colour = (
        tv.get("error", "red")
        if frac > HEADROOM_RED
        else tv.get("warning", "yellow")
        if frac > HEADROOM_YELLOW
        else tv.get("success", "green")
    )
    text.append(f"{(1 - frac) * 100:.0f}% free", style=f"bold {colour}")
    text.append(
        f" — trainer peak reserved {gb:.1f} GiB of {total:.1f} GiB"
        + (f" ({name})" if name else "")
        + f" = {frac * 100:.0f}%, median of {n} step{'s' if n != 1 else ''}"
    )
    if frac > HEADROOM_RED:
        text.append("  OOM risk at rollout wake-up", style=f"bold {colour}")
    return text


class ConfigPane(Pane):
    """Pane 5: config values against verl's defaults, recommendations, memory headroom."""

    STEP = 5
    _last_verdict: Verdict | None = None

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="cfg-body", classes="body")

    def update_content(self, store: Store, assessment: Assessment) -> None:
        width = self.scrollable_content_region.width or WIDE_TABLE
        body = self.body(store, assessment, self.palette(), width)
        self.query_one("#cfg-body", Static).update(body)

    @staticmethod
    def body(
        store: Store,
        assessment: Assessment | None,
        palette: dict[str, str] | None = None,
        width: int = WIDE_TABLE,
    ) -> RenderableType:
        """Everything below the findings: a table when wide, a list of keys when narrow."""
        parts: list[RenderableType] = [headroom_line(store, palette), Text("")]
        if store.config:
            src = f" (from {store.config_source})" if store.config_source else ""
            parts.append(
                Text(
                    f"{len(store.config)} config keys{src}; bold = differs from verl's default",
                    style="bold underline",
                )
            )
        else:
            parts.append(Text(MISSING_CONFIG, style="italic"))
        if width >= WIDE_TABLE:
            parts.append(config_table(store.config, assessment))
        else:
            parts.append(config_list(store.config, assessment))
        return Group(*parts)

    def refresh_pane(self, store: Store, assessment: Assessment) -> None:
        """Findings feed the table's evidence column: redraw when the verdict changes too."""
        if assessment.verdict is not self._last_verdict:
            self._last_verdict = assessment.verdict
            self.force_next()
        super().refresh_pane(store, assessment)
