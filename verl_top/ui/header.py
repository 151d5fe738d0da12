"""The header: cluster counts, activity, step rate, mode badge, replay state and the bottleneck banner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from verl_top.assessment import Assessment
from verl_top.status import BOTTLENECK, HEALTHY, NO_DATA
from verl_top.store import Store
from verl_top.store_summary import StoreSummary
from verl_top.ui.banner import fit_banner, fmt_seconds, saving_text, status_label
from verl_top.ui.widgets import DEAD_STATES, TextSlots, severity_class
from verl_top.untrusted import clean_text
from verl_top.verl.flavour import store_flavour

if TYPE_CHECKING:
    from verl_top.sources.replay import ReplayControl

RATE_STEPS = 20  # steps used for the step rate


def cluster_activity(store: Store) -> float | None:
    """Mean latest GPU activity (GPM SM util, else NVML util) over GPUs of live hosts."""
    acts = []
    for h in store.hosts.values():
        if h.state in DEAD_STATES:
            continue
        for g in h.gpus.values():
            if g.latest is not None and g.latest.activity is not None:
                acts.append(g.latest.activity)
    return sum(acts) / len(acts) if acts else None


def step_rate(store: Store) -> float | None:
    """Steps per minute from the arrival times of the recent verl steps."""
    steps = list(store.steps)[-RATE_STEPS:]
    if len(steps) < 2:
        return None
    span = steps[-1].t - steps[0].t
    return (len(steps) - 1) / span * 60.0 if span > 0 else None


def host_summary(store: Store) -> str:
    """'3 up · 1 down · 1 connecting' (only states present)."""
    counts = store.host_counts()
    up = counts.get("up", 0) + counts.get("no_gpu", 0)
    down = sum(counts.get(s, 0) for s in DEAD_STATES)
    other = sum(n for s, n in counts.items() if s not in DEAD_STATES and s not in ("up", "no_gpu"))
    parts = [f"{up} up", f"{down} down"]
    connecting = counts.get("connecting", 0)
    if connecting:  # progress while many hosts connect: hosts settled (up or failed) / all
        total = sum(counts.values())
        parts.append(f"connecting {total - connecting}/{total}")
    if other - connecting:
        parts.append(f"{other - connecting} other")
    return " · ".join(parts)


def flavour_part(store: Store) -> str:
    """``verl 0.9 · fully async · vllm``: what verl-top reads the job as (verl/flavour.py), or
    "" before any config, step or line prefix told it."""
    fl = store_flavour(store)
    if fl.trainer_mode is None and fl.version_range == "unknown":
        return ""
    parts = [f"verl {fl.version_range}", fl.mode_name]
    if fl.engine:
        parts.append(fl.engine)
    if fl.device in ("npu", "tpu"):
        parts.append(fl.device.upper())
    return " · ".join(parts)


def has_data(store: Store) -> bool:
    """True once any GPU or host sample, or a verl step, has arrived, or a followed log was
    read (an unreadable log is something to report, not something to wait for)."""
    if store.steps or store.log_stats:
        return True
    return any(h.latest is not None or h.gpus for h in store.hosts.values())


def banner(store: Store, assessment: Assessment) -> tuple[str, str]:
    """Banner text (the shared status vocabulary) and its level (error/warning/info/ok/wait)."""
    status = assessment.status
    if status.state == BOTTLENECK:
        return f"● {status.text}", severity_class(status.severity)
    if status.state == HEALTHY:
        return status.text, "ok"
    if status.state == NO_DATA and has_data(store):
        return status.text, "warning"  # hosts answer but give nothing to judge (no GPU)
    return status.text, "wait"


def banner_lines(assessment: Assessment, width: int) -> tuple[str, str]:
    """The banner's (at most) two lines for ``width`` cells: the lead with its saving, then
    its advice; without a lead, the status words (waiting, healthy, no data ...)."""
    status = assessment.status
    lead = status.lead
    if status.state == BOTTLENECK and lead is not None:
        return fit_banner(lead.title, saving_text(lead), lead.advice, status_label(lead), width)
    return fit_banner("", "", "", status.text, width)


def fit_parts(parts: list[tuple[int, Text]], width: int) -> Text:
    """Join ``parts`` (priority, text) with two spaces, leaving out the lowest-priority ones
    (the last among equals) until the line fits ``width``."""
    kept = list(parts)

    def size() -> int:
        return sum(t.cell_len for _, t in kept) + 1 * (len(kept) - 1)

    while len(kept) > 1 and size() > width:
        lowest = min(range(len(kept)), key=lambda i: (kept[i][0], -i))
        del kept[lowest]
    line = Text(no_wrap=True, overflow="ellipsis")
    for i, (_, text) in enumerate(kept):
        if i:
            line.append(" ")
        line.append_text(text)
    return line


class VerlTopHeader(Vertical):
    """The status line and the banner (one line, or two when a lead brings its advice)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._slots = TextSlots()  # redrawn only when they say something new

    def compose(self) -> ComposeResult:
        yield Static("", id="status-line")
        yield Static("", id="banner")

    def update_header(
        self,
        store: Store,
        assessment: Assessment,
        mode: str,
        title: str,
        replay: ReplayControl | None,
        replay_t0: float | None,
        host_filter: str = "",
        summary: StoreSummary | None = None,
    ) -> None:
        """Redraw from the store, the latest verdict, the replay control and the kept filter
        (the cluster's activity from ``summary`` when the tick made one: not every GPU read
        again)."""
        statics = self.query(Static)
        if len(statics) < 2:
            return  # children not composed yet (a timer can fire before the first layout)
        # (priority, text): on a narrow terminal the lowest-priority parts are left out.
        parts: list[tuple[int, Text]] = [(9, Text(f" {mode} ", style="reverse bold"))]
        if host_filter.strip():  # rows are hidden: say so on every screen (Esc clears it)
            parts.append((9, Text(f" filter {clean_text(host_filter.strip(), 40)} ", "reverse")))
            parts.append((3, Text(" Esc: clear", style="dim")))
        parts.append((2, Text(f" {clean_text(title)}", style="bold")))
        parts.append((8, Text(f" hosts {host_summary(store)}")))
        parts.append((7, Text(f" GPUs {store.gpu_count()}")))
        act = cluster_activity(store) if summary is None else summary.cluster_act
        parts.append(
            (8, Text.assemble(" activity ", ("—" if act is None else f"{act:.0f}%", "bold")))
        )
        rate = step_rate(store)
        steps = "—" if rate is None else f"{rate:.2f}"
        parts.append((6, Text.assemble(" steps/min ", (steps, "bold"))))
        if verl := flavour_part(store):  # the trainer mode decides what timing_s/gen means
            parts.append((1, Text(f" {clean_text(verl)}", style="dim")))
        if replay is not None:
            pos = replay.position
            rel = pos - replay_t0 if replay_t0 is not None and pos else 0.0
            if replay.finished:
                # The whole recording was played (a headless snapshot plays it at full speed):
                # say how much data it held, not the replay clock's position.
                span = store.now - store.first_t if store.first_t is not None else 0.0
                parts.append((5, Text(f" finished · {fmt_seconds(max(0.0, span))} of data")))
            else:
                state = "⏸ paused" if replay.paused else "▶ playing"
                parts.append((5, Text(f" {state} x{replay.speed:g} at +{rel:.0f}s")))
        line = fit_parts(parts, self.size.width or 200)
        self._slots.show(self.query_one("#status-line", Static), line)
        self.set_class(mode != "LIVE", "-replay")
        _, level = banner(store, assessment)
        b = self.query_one("#banner", Static)
        for lv in ("error", "warning", "info", "ok", "wait"):
            b.set_class(lv == level, f"-{lv}")
        # The banner's padding takes a cell each side; the lines are fitted to what is left.
        first, second = banner_lines(assessment, max(20, (self.size.width or 200) - 2))
        text = Text(clean_text(first), no_wrap=True, overflow="ellipsis")
        if second:  # verdicts quote host names and reasons: plain text, never markup
            text.append("\n")
            text.append(clean_text(second), style="not bold")
        self._slots.show(b, text)
