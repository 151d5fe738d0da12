"""Pane 3 — Dataflow: which stage of the RL step eats the time?

Per-step stacked stage bars over the last steps (one row per step, one letter and colour per
stage, widths proportional to time), each stage's median time and share of the step with its
trend (median of the last 3 steps against the run's median), the rollout long tail
(``agent_loop/generate_sequences`` max vs mean), samples/s and tokens/s, and the per-step table
of stage seconds. Steps that ran validation or a checkpoint are outliers: marked, and kept out of
medians and trends. Every number comes from ``verl_top.verl.stages.StepView``.

``stage_strip`` draws the same stage letters over a time window; pane 1 shows it above its tables.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from verl_top.assessment import Assessment
from verl_top.compare import Comparison
from verl_top.diagnosis.phases import Phase
from verl_top.model import RolloutSample, VerlStep
from verl_top.origin import missing_steps_text
from verl_top.status import waited_s, waiting_for_first_step
from verl_top.store import Store
from verl_top.ui.panes.base import Pane
from verl_top.ui.running_app import monitor_app
from verl_top.ui.widgets import REQUIRED, Column, add_plain_row, cell_width, fit_names
from verl_top.verl.flavour import store_flavour
from verl_top.verl.stages import STAGE_BY_NAME, StepView, is_rollout_name, stage_bands

# Stages of the per-step table, in the order of an RL step (``reshard`` is older verl's sync).
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
# Canonical stage -> (letter, colour). Letters keep the bars readable without colour.
STAGE_STYLE: dict[str, tuple[str, str]] = {
    "gen": ("g", "dodger_blue2"),
    "gen_max": ("G", "steel_blue1"),
    "reward": ("r", "gold3"),
    "old_log_prob": ("o", "medium_purple2"),
    "ref": ("f", "orchid"),
    "values": ("v", "dark_cyan"),
    "adv": ("a", "yellow3"),
    "update_critic": ("c", "dark_orange"),
    "update_actor": ("u", "green3"),
    "update_weights": ("w", "red3"),
    "wait": ("W", "grey66"),  # async trainers: timing_s/gen is the trainer's wait
    "wait_for_enough_samples": ("H", "grey66"),
    "switch_to_rollout": ("S", "red3"),
    "switch_to_trainer": ("S", "red3"),
    "switch_wait": ("W", "grey66"),
    "dump_rollout_generations": ("d", "grey50"),
    "testing": ("t", "grey62"),
    "save_checkpoint": ("s", "grey42"),
}
UNTIMED = ("·", "grey35")  # step time verl did not attribute to any stage
# Stages outside the catalogue: rollout by name, or of unknown role (their own name is shown).
ROLLOUT_BY_NAME = ("R", "dodger_blue2")
UNKNOWN_STAGE = ("x", "grey58")


def style_of(stage: str, view: StepView | None = None) -> tuple[str, str]:
    """(letter, colour) of a stage; timers outside the catalogue by their role."""
    if stage in STAGE_STYLE:
        return STAGE_STYLE[stage]
    if not stage:
        return UNTIMED
    role = view.role(stage) if view is not None else ""
    return ROLLOUT_BY_NAME if role == "rollout" or is_rollout_name(stage) else UNKNOWN_STAGE


def stage_label(stage: str) -> str:
    """A stage's label; a timer outside the catalogue keeps its own name (rollout says so)."""
    if stage in STAGE_BY_NAME:
        return STAGE_BY_NAME[stage].label
    return f"{stage} (rollout by name)" if is_rollout_name(stage) else f"{stage} (not in catalogue)"


LAST_STEPS = 12
BAR_WIDTH = 60  # the longest bar before the pane's width is known
NOTE_WIDTH = 16  # the outlier mark beside a bar at least ("⚑ outlier: test…")
NOTE_MAX = 40  # and at most: the outlier line under the legend names each outlier in full
STRIP_WIDTH = 64
TREND_STEPS = 3
FLAT_PCT = 5.0  # |trend| below this shows →


def stage_cell(stage: str) -> Text:
    """The stage's letter on its colour, then its name."""
    letter, colour = style_of(stage)
    text = Text()
    text.append(f" {letter} ", style=f"bold black on {colour}")
    text.append(f" {stage or 'other'}")
    return text


def legend(stages: Iterable[str], untimed: bool = False) -> Text:
    """One line naming the letters used."""
    text = Text("legend: ", style="dim")
    for stage in stages:
        letter, colour = style_of(stage)
        text.append(letter, style=f"bold black on {colour}")
        text.append(f" {stage_label(stage)}  ")
    if untimed:
        text.append(UNTIMED[0], style=f"bold black on {UNTIMED[1]}")
        text.append(" other (step time no stage accounts for)")
    return text


def segments(view: StepView) -> list[tuple[str, float]]:
    """(stage, seconds) of one step in execution order (timers outside the catalogue too),
    validation/checkpoint, then ``other``: the rest of the shares' denominator."""
    shares = view.shares()
    if shares is None:
        out = [
            (name, view.stage_times[name])
            for name in STAGE_STYLE
            if name in view.stage_times and name not in view.nested and view.stage_times[name] > 0
        ]
        return out
    out = [(name, seconds) for name, seconds, _ in shares.parts if seconds > 0]
    out += [
        (name, view.stage_times[name])
        for name in ("testing", "save_checkpoint")
        if view.stage_times.get(name, 0) > 0
    ]
    if shares.other_s > 0.005 * shares.denominator:
        out.append(("", shares.other_s))
    return out


def stage_bar(view: StepView, seconds_per_cell: float) -> Text:
    """One step as a stacked bar; widths from cumulative rounding so they add up exactly."""
    text = Text()
    acc = 0.0
    used = 0
    for stage, seconds in segments(view):
        acc += seconds
        end = round(acc / seconds_per_cell) if seconds_per_cell > 0 else 0
        width = max(0, end - used)
        if width:
            letter, colour = style_of(stage, view)
            text.append(letter * width, style=f"black on {colour}")
            used = end
    return text


def wall(view: StepView) -> float:
    """Seconds the step occupied (core + validation + checkpoint), 0 when unknown."""
    if view.wall_time is not None:
        return view.wall_time
    return view.step_time or 0.0


def outlier_note(view: StepView) -> str:
    """The mark beside an outlier step's bar ("⚑ outlier: testing 8.0 s"), else ""."""
    if not view.is_outlier:
        return ""
    extras = ", ".join(
        f"{name} {view.stage_times[name]:.1f} s"
        for name in ("testing", "save_checkpoint")
        if name in view.stage_times
    )
    return f"⚑ outlier: {extras}"


def bar_widths(width: int, views: Sequence[StepView]) -> tuple[int, int]:
    """Cells of the longest bar and of the outlier note in a pane ``width`` wide, beside
    "step N" and the seconds: the bar first up to BAR_WIDTH (the note at least NOTE_WIDTH),
    then the note up to its longest text (NOTE_MAX at most; none without outliers), then the
    bar all the rest."""
    if width <= 0:
        return BAR_WIDTH, 80
    avail = width - 26
    needed = min(NOTE_MAX, max((len(outlier_note(v)) for v in views), default=0))
    note = min(needed, max(NOTE_WIDTH if needed else 0, avail - BAR_WIDTH))
    bar = max(10, avail - note)
    return bar, max(NOTE_WIDTH, avail - bar)


def bars_block(
    views: Sequence[StepView], bar_width: int = BAR_WIDTH, note_width: int = 80
) -> RenderableType:
    """Stacked bars of ``views``, one row per step, with the outliers marked."""
    longest = max((wall(v) for v in views), default=0.0)
    per_cell = longest / bar_width if longest > 0 else 0.0
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column("step", justify="right", no_wrap=True, min_width=7)
    table.add_column("bar", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True, min_width=7)
    # The outlier line under the legend names each outlier step in full: here a short mark.
    table.add_column("note", no_wrap=True, overflow="ellipsis", max_width=note_width)
    for v in views:
        note = Text(outlier_note(v), style="bold yellow")
        shown = wall(v)
        add_plain_row(
            table,
            f"step {v.step}",
            stage_bar(v, per_cell),
            "—" if not shown else f"{shown:.1f} s",
            note,
        )
    return table


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def trend_text(recent: float | None, run: float | None) -> Text:
    """↑/↓/→ with the change of ``recent`` against ``run`` in %."""
    if recent is None or not run:
        return Text("—", style="dim")
    pct = (recent - run) / run * 100
    if round(pct) == 0:
        pct = 0.0  # never "-0%"
    if pct > FLAT_PCT:
        return Text(f"↑ {pct:+.0f}%", style="bold red")
    if pct < -FLAT_PCT:
        return Text(f"↓ {pct:+.0f}%", style="green")
    return Text(f"→ {pct:+.0f}%", style="dim")


def _baseline_cells(comparison: Comparison | None, stage: str, run: float | None) -> list[Text]:
    """'baseline s' and 'vs baseline' cells of a stage row (none without --baseline)."""
    if comparison is None:
        return []
    if stage == "step":
        base = comparison.baseline.step_s
    else:
        base = comparison.baseline.stages.get(stage)
    if base is None:
        return [Text("—", style="dim"), Text("new" if run else "—", style="dim")]
    return [Text(f"{base.median:.2f}"), trend_text(run, base.median)]


def stage_summary(
    views: Sequence[StepView], comparison: Comparison | None = None
) -> RenderableType:
    """Each stage's median seconds and share over the run, and the last steps' trend; with
    ``--baseline``, the baseline run's median and this run against it."""
    normal = [v for v in views if not v.is_outlier and v.has_training]
    if not normal:
        return Text("no training step without validation/checkpoint yet", style="italic")
    recent = normal[-TREND_STEPS:]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (
        ("stage", "left"),
        ("median s", "right"),
        ("share", "right"),
        (f"last {len(recent)} s", "right"),
        ("trend", "left"),
        *((("baseline s", "right"), ("vs baseline", "left")) if comparison else ()),
    ):
        table.add_column(col, justify=justify)
    order: dict[str, None] = {}
    for v in normal:
        shares = v.shares()
        order.update(dict.fromkeys(n for n, _, _ in (shares.parts if shares else [])))
    for stage in [*order, ""]:
        if stage in STAGE_BY_NAME and STAGE_BY_NAME[stage].overhead:
            continue
        # One denominator for every row (StepView.shares): the rows sum to 100 %.
        rows = [(sh, v) for v in normal if (sh := v.shares()) is not None]
        if stage:
            times = [v.stage_times[stage] for v in normal if stage in v.stage_times]
            shares_of = [sh.share(stage) for sh, v in rows if stage in v.stage_times]
            last = _median([v.stage_times[stage] for v in recent if stage in v.stage_times])
        else:
            times = [sh.other_s for sh, _ in rows]
            shares_of = [sh.other_share for sh, _ in rows]
            last = _median([sh.other_s for v in recent if (sh := v.shares()) is not None])
        if not times:
            continue
        run = _median(times)
        share = _median(shares_of)
        share_text = Text("—" if share is None else f"{share * 100:.0f}%")
        if share is not None and share >= 0.3:
            share_text.stylize("bold")
        add_plain_row(
            table,
            stage_cell(stage),
            f"{run:.2f}",
            share_text,
            "—" if last is None else f"{last:.2f}",
            trend_text(last, run),
            *_baseline_cells(comparison, stage or "(other)", run),
        )
    dens = [sh.denominator for v in normal if (sh := v.shares()) is not None]
    step_run = _median(dens)
    step_last = _median([sh.denominator for v in recent if (sh := v.shares()) is not None])
    add_plain_row(
        table,
        Text("    step (core)", style="bold"),
        "—" if step_run is None else f"{step_run:.2f}",
        "100%",
        "—" if step_last is None else f"{step_last:.2f}",
        trend_text(step_last, step_run),
        *_baseline_cells(comparison, "step", step_run),
    )
    return table


def outliers_line(views: Sequence[StepView]) -> Text | None:
    """Which steps ran validation / checkpoint (excluded from medians and trends)."""
    marked = [v for v in views if v.is_outlier]
    if not marked:
        return None
    parts = []
    for v in marked[-6:]:
        extras = " + ".join(
            f"{name} {v.stage_times[name]:.1f} s"
            for name in ("testing", "save_checkpoint")
            if name in v.stage_times
        )
        parts.append(f"step {v.step} ({extras})")
    text = Text("⚑ outlier steps, excluded from medians and trends: ", style="yellow")
    text.append(", ".join(parts))
    return text


def long_tail_text(views: Sequence[StepView]) -> Text | None:
    """Rollout long tail of the last step that logged it, and the run's median ratio."""
    tails = [v for v in views if v.long_tail_ratio is not None]
    if not tails:
        return None
    last = tails[-1]
    ratio = last.long_tail_ratio or 0.0
    text = Text(f"rollout long tail (step {last.step}): slowest sequence {last.gen_seq_max:.1f} s")
    text.append(f" vs mean {last.gen_seq_mean:.1f} s = ")
    text.append(f"{ratio:.1f}×", style="bold red" if ratio > 2 else "bold")
    med = _median([v.long_tail_ratio for v in tails if v.long_tail_ratio is not None])
    if med is not None and len(tails) > 1:
        text.append(f"  (median {med:.1f}× over {len(tails)} steps)", style="dim")
    if last.num_preempted:
        text.append(f"  · {last.num_preempted:g} preemptions (max per request)", style="yellow")
    return text


def rate_text(views: Sequence[StepView]) -> Text:
    """samples/s and tokens/s: last step and the run's median (outliers excluded)."""
    normal = [v for v in views if not v.is_outlier and v.has_training] or list(views)
    last = normal[-1]

    def pair(label: str, values: list[float | None], fmt: str) -> None:
        present = [x for x in values if x is not None]
        now = values[-1] if values else None
        text.append(f"{label} ")
        text.append("—" if now is None else fmt.format(now), style="bold")
        if present:
            text.append(f" (median {fmt.format(statistics.median(present))})", style="dim")
        text.append("  ·  ")

    text = Text()
    pair("samples/s", [v.samples_per_s for v in normal], "{:,.1f}")
    pair("tokens/s total", [v.total_tokens_per_s for v in normal], "{:,.0f}")
    pair("tokens/s/GPU", [v.throughput for v in normal], "{:,.0f}")
    text.append(f"last step {last.step}", style="dim")
    if last.throughput_source and last.throughput_source != "verl":
        text.append(f" (tokens/s {last.throughput_source})", style="dim")
    return text


def steps_table(views: Sequence[StepView]) -> Table:
    """Stage seconds and share of step for each step; the shares use the same denominator as
    the bars and the summary (step without validation/checkpoint), so a row sums to 100 %."""
    order: dict[str, None] = {}
    for v in views:
        shares = v.shares()
        order.update(dict.fromkeys(n for n, _, _ in (shares.parts if shares else [])))
    present = [s for s in order if not (s in STAGE_BY_NAME and STAGE_BY_NAME[s].overhead)]
    extras = [s for s in ("testing", "save_checkpoint") if any(s in v.stage_times for v in views)]
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("step", justify="right")
    table.add_column("step s", justify="right")
    for stage in [*present, "other", *extras]:
        table.add_column(stage, justify="right")
    for v in views:
        shares = v.shares()
        total = shares.denominator if shares else v.step_time_core
        cells: list[Any] = [str(v.step), "—" if total is None else f"{total:.1f}"]
        for stage in present:
            seconds = v.stage_times.get(stage)
            cells.append(_share_cell(seconds, shares.share(stage) if shares else None))
        cells.append(_share_cell(shares.other_s, shares.other_share) if shares else Text("—"))
        for stage in extras:
            seconds = v.stage_times.get(stage)
            cells.append("—" if seconds is None else f"{seconds:.1f}")
        add_plain_row(table, *cells)
    return table


# The rollout servers' table: names first (cut only when the numbers leave no room), then
# the numbers by priority (the queue and the cache matter most to flow.rollout_queue).
ROLLOUT_COLUMNS = (
    Column("server", "server", 12, REQUIRED, "text"),
    Column("kind", "kind", 6, 8, "text"),  # vllm, sglang: never cut
    Column("model", "model", 12, 9, "text"),
    Column("running", "running", 3, 9),
    Column("waiting", "waiting", 3, 9),
    Column("kv", "KV %", 3, 8),
    Column("gen", "gen\ntok/s", 3, 6),
    Column("ttft", "TTFT ms\np50/p90", 3, 5),
    Column("tpot", "TPOT ms\np50", 3, 3),
    Column("e2e", "e2e s\np50/p90", 3, 4),
    Column("preempt", "preempt\n/min", 3, 2),
)


def _rollout_cells(r: RolloutSample) -> dict[str, str]:
    def num(value: float | None, fmt: str = "{:.0f}") -> str:
        return "—" if value is None else fmt.format(value)

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f}"

    return {
        "kind": r.server,
        "model": r.model,
        "running": num(r.running),
        "waiting": num(r.waiting),
        "kv": num(r.kv_cache_pct),
        "gen": num(r.gen_tokens_s),
        "ttft": f"{ms(r.ttft_p50_s)}/{ms(r.ttft_p90_s)}",
        "tpot": ms(r.tpot_p50_s),
        "e2e": f"{num(r.e2e_p50_s, '{:.1f}')}/{num(r.e2e_p90_s, '{:.1f}')}",
        "preempt": num(None if r.preemptions_s is None else r.preemptions_s * 60, "{:.1f}"),
    }


def rollout_table(store: Store, width: int = 0) -> RenderableType | None:
    """The rollout servers' own view (vLLM / SGLang from --prometheus), None when there are none.

    Latency quantiles are the servers' cumulative histograms (since each server started).
    Server and model names are shown whole whenever ``width`` leaves room for them beside the
    numbers, else cut with ``…`` (0: no width known, nothing is cut).
    """
    if not store.rollout:
        return None
    rows = []
    for name, entry in sorted(store.rollout.items()):
        if entry.latest is not None:
            rows.append({"server": name, **_rollout_cells(entry.latest)})
    needed = {c.key: max((cell_width(r[c.key]) for r in rows), default=0) for c in ROLLOUT_COLUMNS}
    layout = fit_names(ROLLOUT_COLUMNS, needed, width if width > 0 else 1 << 20)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for c, w in layout:
        text = c.kind == "text"
        table.add_column(
            c.label, justify="left" if text else "right", width=w, no_wrap=True,
            overflow="ellipsis",
        )  # fmt: skip
    for row in rows:
        waiting = Text(row["waiting"], style="bold" if row["waiting"] not in ("0", "—") else "")
        # foreign strings (names): plain Text, never markup
        table.add_row(*(waiting if c.key == "waiting" else Text(row[c.key]) for c, _ in layout))
    title = Text(
        f"Rollout servers ({len(store.rollout)}, from Prometheus; latencies since server start)",
        style="bold underline",
    )
    return Group(title, table)


def _share_cell(seconds: float | None, share: float | None) -> Text:
    if seconds is None:
        return Text("—")
    cell = Text(f"{seconds:.1f}")
    if share is not None:
        pct = share * 100
        cell.append(f" {pct:.0f}%", style="bold" if pct >= 30 else "dim")
    return cell


def parse_line(store: Store) -> Text | None:
    """What each followed verl log gave: lines read and matched, steps, config keys."""
    stats = list(store.log_stats.values())
    if not stats:
        return None
    text = Text("", style="dim")
    for st in stats:
        text.append(
            f"{st.get('path')}: {st.get('lines', 0)} lines read, {st.get('matched', 0)} matched, "
            f"{st.get('steps', 0)} steps, {st.get('config_keys', 0)} config keys"
        )
        if st.get("malformed"):
            text.append(f", {st.get('malformed')} unreadable metric lines")
        text.append("\n")
    text.rstrip()
    return text


class StepViews:
    """StepViews of the store's steps, built once per record (the store keeps up to 5000)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[VerlStep, StepView]] = {}
        self._config_key: int = -1

    def views(self, store: Store) -> list[StepView]:
        """A view per step in the store, oldest first, read in the job's trainer mode (async
        modes show timing_s/gen as the trainer's wait)."""
        return self.of(store, store.steps)

    def of(self, store: Store, steps: Iterable[VerlStep]) -> list[StepView]:
        """A view of each of ``steps`` (records of ``store``), as ``views`` makes them; the
        cache keeps the views of these steps only."""
        mode = store_flavour(store).trainer_mode
        config_key = hash((id(store.config), len(store.config), mode))
        if config_key != self._config_key:  # samples/s and tokens/s depend on the config
            self._cache.clear()
            self._config_key = config_key
        out: list[StepView] = []
        fresh: dict[int, tuple[VerlStep, StepView]] = {}
        for rec in steps:
            hit = self._cache.get(id(rec))
            if hit is None or hit[0] is not rec:
                hit = (rec, StepView.from_step(rec, store.config, mode=mode))
            fresh[id(rec)] = hit
            out.append(hit[1])
        self._cache = fresh
        return out


def stage_strip(
    steps: Iterable[VerlStep | StepView],
    since: float,
    until: float,
    width: int = STRIP_WIDTH,
    mode: str | None = None,
) -> Text | None:
    """The stage running in each of ``width`` cells of [since, until], from ``stage_bands``
    (read in trainer mode ``mode``: an async trainer's timing_s/gen is a wait).

    None when no step falls in the window. Cells no band covers show a space.
    """
    if until <= since or width <= 0:
        return None
    recent = [s for s in steps if s.t >= since]
    if not recent:
        return None
    bands = [b for b in stage_bands(recent, mode) if b[1] > since and b[0] < until]
    cell_s = (until - since) / width
    cells: list[tuple[str, str]] = []  # (letter, style) of each cell
    j = 0
    for k in range(width):
        mid = since + (k + 0.5) * cell_s
        while j < len(bands) and bands[j][1] <= mid:
            j += 1
        if j < len(bands) and bands[j][0] <= mid < bands[j][1]:
            letter, colour = STAGE_STYLE.get(bands[j][2], UNTIMED)
            cells.append((letter, f"black on {colour}"))
        else:
            cells.append((" ", ""))
    # One span per run of a stage, not per cell: the strip is redrawn every second and a
    # Static's cost grows with its spans (~35 µs each).
    text = Text()
    for (letter, style), run in itertools.groupby(cells):
        text.append(letter * len(list(run)), style=style or None)
    return text


class DataflowPane(Pane):
    """Pane 3: stacked stage bars, stage medians and trends, long tail, rates, per-step table."""

    STEP = 3
    BINDINGS = [Binding("e", "explain_keys", "Explain keys")]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._views = StepViews()

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="flow-body", classes="body")

    def action_explain_keys(self) -> None:
        """Key e: what each timing and perf key of the latest step means in this verl version
        and trainer mode (timing_s/gen is a wait in the async trainers)."""
        from verl_top.ui.key_explain import KeyExplainScreen

        app = monitor_app(self)
        if app is not None:
            app.push_screen(KeyExplainScreen(app.store))

    def update_content(self, store: Store, assessment: Assessment) -> None:
        width = self.scrollable_content_region.width
        self.query_one("#flow-body", Static).update(
            self.body(
                store,
                width=width,
                comparison=assessment.comparison,
                phases=assessment.verdict.phases if assessment.verdict is not None else (),
            )
        )

    def body(
        self,
        store: Store,
        bar_width: int = BAR_WIDTH,
        note_width: int = 80,
        width: int = 0,
        comparison: Comparison | None = None,
        phases: Sequence[Phase] = (),
    ) -> RenderableType:
        """Everything below the findings (``width``: the bars take what it leaves, else
        ``bar_width`` and ``note_width``; ``phases``: a finished run's, listed when it changed
        shape)."""
        servers = rollout_table(store, width)
        if not store.steps:
            counts = parse_line(store)
            if counts is not None:  # a log was given but nothing in it could be read
                head: RenderableType = Group(
                    Text("no verl step read from the log yet", style="italic"), counts
                )
            elif waiting_for_first_step(store):
                head = Text(
                    f"waiting for the first verl step ({waited_s(store):.0f} s)", style="italic"
                )
            else:
                head = Text(missing_steps_text(store, "stage times per step"), style="italic")
            return head if servers is None else Group(head, Text(""), servers)
        views = self._views.views(store)
        shown = views[-LAST_STEPS:]
        if width > 0:
            bar_width, note_width = bar_widths(width, shown)
        used = list(dict.fromkeys(n for v in shown for n, _ in segments(v) if n))
        parts: list[RenderableType] = [
            Text(
                f"Stages of the last {len(shown)} steps (bar length ∝ seconds)",
                style="bold underline",
            ),
            bars_block(shown, bar_width, note_width),
            legend(used, any(name == "" for v in shown for name, _ in segments(v))),
        ]
        out = outliers_line(shown)
        if out is not None:
            parts.append(out)
        parts += [
            Text(""),
            Text(
                f"Stage medians over {sum(1 for v in views if not v.is_outlier)} steps "
                f"(trend: median of the last {TREND_STEPS} vs the run, ±{FLAT_PCT:.0f}% = →)",
                style="bold underline",
            ),
            stage_summary(views, comparison),
            Text(""),
            rate_text(views),
        ]
        if len(phases) > 1:
            parts += [
                Text(""),
                Text("Phases of the run (the verdict judges the last)", style="bold underline"),
                *(Text(p.text()) for p in phases),  # numbers and step ids only
            ]
        tail = long_tail_text(views)
        if tail is not None:
            parts.append(tail)
        parts += [
            Text(""),
            Text(
                f"Stage times of the last {len(shown)} steps (seconds, share of step)",
                style="bold underline",
            ),
            steps_table(shown),
        ]
        if servers is not None:
            parts += [Text(""), servers]
        counts = parse_line(store)
        if counts is not None:
            parts += [Text(""), counts]
        return Group(*parts)
