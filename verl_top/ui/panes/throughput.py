"""Pane 1 — Throughput & GPU: is there a problem, and how bad?

A host table (state, reason, last seen, CPU, iowait, memory, network) and a GPU table with one
row per GPU of every host: NVML util next to GPM SM / tensor / DRAM util (the NVML number alone
overstates real work), memory, power, temperature, clocks, throttling and an activity sparkline
over the window. GPUs whose mean activity over the window is below 50 % are marked idle.
Both tables (``VirtualRows``) keep one row per host / GPU but build, measure (column fitting)
and write only the rows on screen; sorting and counting read the shared per-refresh
``StoreSummary``. A GPU whose history did not move since
the last refresh reuses its row without touching the ring buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from verl_top.assessment import Assessment
from verl_top.model import THROTTLE_MASK, clock_reason_names
from verl_top.store import GpuEntry, HostEntry, Store, mean
from verl_top.store_summary import GpuSummary, StoreSummary, SummaryCache
from verl_top.ui.fast_cells import FastCellTable
from verl_top.ui.filter_bar import host_matches, matches_filter
from verl_top.ui.panes.base import Pane
from verl_top.ui.panes.dataflow import STAGE_STYLE, STRIP_WIDTH, StepViews, stage_strip
from verl_top.ui.virtual_table import VirtualRows
from verl_top.ui.widgets import (
    ACTIVITY_STOPS,
    DASH,
    DEAD_STATES,
    IDLE_THRESHOLD,
    MEMORY_STOPS,
    TEMP_STOPS,
    Column,
    LineText,
    TextSlots,
    activity_style,
    ellipsis_cell,
    fmt_age,
    fmt_bytes_rate,
    fmt_num,
    gpu_total,
    gradient,
    host_mem_total,
    host_state_style,
    missing,
    window_spark,
)
from verl_top.untrusted import clean_text

# Pane 1's columns: key, label, minimum width, priority (lowest dropped first on a narrow
# terminal), kind (num: as wide as its widest number; text: cut with …; flex: takes the spare).
GPU_COLUMNS: tuple[Column, ...] = (
    Column("host", "Host", 6, 10, "text", 32),
    Column("gpu", "GPU", 3, 10),
    Column("act", "Act(win)", 8, 9),
    Column("spark", "History", 8, 4, "flex"),  # takes all the spare width
    Column("nvml", "NVML%", 5, 5),
    Column("sm", "SM%", 4, 7),
    Column("tensor", "Tensor%", 7, 3),
    Column("dram", "DRAM%", 5, 3),
    Column("mem", "Mem GiB", 11, 8),
    Column("power", "Power W", 9, 6),
    Column("temp", "°C", 3, 5),
    Column("clock", "SM MHz", 6, 2),
    Column("throttle", "Throttle", 8, 4, "text", 24),
)
W = {c.key: c.width for c in GPU_COLUMNS}
HOST_COLUMNS: tuple[Column, ...] = (
    Column("host", "Host", 6, 10, "text", 32),
    Column("state", "State", 5, 9, "text", 16),
    Column("seen", "Seen", 4, 6),
    Column("gpus", "GPUs", 4, 8),
    Column("act", "Act%", 4, 8),
    Column("idle", "Idle", 4, 5),
    Column("cpu", "CPU%", 4, 7),
    Column("iowait", "iowait", 6, 4),
    Column("mem", "Mem GiB", 7, 6),
    Column("rx", "Net rx", 8, 3),
    Column("tx", "Net tx", 8, 3),
    Column("reason", "Reason", 10, 4, "flex", 400),
)
# Sort orders that `o` cycles through, and the columns whose header click selects one.
SORT_CYCLE = ("host", "activity", "memory", "power", "temp")
SORT_BY_COLUMN = {
    "host": "host",
    "gpu": "host",
    "act": "activity",
    "spark": "activity",
    "nvml": "nvml",
    "sm": "sm",
    "tensor": "tensor",
    "dram": "dram",
    "mem": "memory",
    "power": "power",
    "temp": "temp",
    "clock": "clock",
    "throttle": "throttle",
}
SPARK_WIDTH = 16  # until the first layout gives the History column its width
HOST_LINE_NAMES = 3  # hosts that are not up named on the host line (the table has them all)
IOWAIT_WARN = 10.0  # % iowait shown in the warning colour on the host line


@dataclass
class GpuRow:
    """One GPU row: its cells and the numbers it can be sorted by."""

    cells: tuple[Any, ...]
    sort: dict[str, float]
    idle: bool
    throttled: bool
    live: bool


def _gib(mib: float | None) -> float | None:
    return None if missing(mib) else mib / 1024.0  # type: ignore[operator]


def _mem_pct(h: HostEntry, g: GpuEntry) -> float | None:
    """Memory used in % of the GPU's total (None when either is unknown)."""
    used = None if g.latest is None else g.latest.mem_used_mib
    total = gpu_total(h, g, "mem_total_mib")
    return None if missing(used) or not total else 100.0 * used / total  # type: ignore[operator]


def _pair(a: float | None, b: float | None, fmt: str) -> str:
    if missing(a):
        return DASH
    return fmt.format(a) + ("/" + fmt.format(b) if not missing(b) else "")


def build_gpu_row(
    store: Store,
    h: HostEntry,
    g: GpuEntry,
    palette: dict[str, str],
    spark_width: int = SPARK_WIDTH,
    colours: dict[tuple[int, int], str] | None = None,
) -> GpuRow:
    """Cells of one GPU row from its latest sample and its window history."""
    s = g.latest
    live = h.state not in DEAD_STATES
    since = store.window_start()
    times, col = g.history.recent_series("activity", since)
    acts = [v for v in col if v == v]  # v == v drops NaN (missing)
    act = mean(acts)
    idle = act is not None and act < IDLE_THRESHOLD
    grey = "dim" if live else palette.get("muted", "grey50")
    cache = {} if colours is None else colours
    if live and act is not None:
        key = (id(ACTIVITY_STOPS), int(act))
        colour = cache.get(key) or cache.setdefault(key, activity_style(int(act), palette))
    else:
        colour = activity_style(act, palette) if live else grey

    def cell(text: str, width: int) -> str | Text:
        # Right-aligned by padding; a LineText draws in about half the time of a Text or of
        # a str (which the table would parse as markup), ×13 cells × the rows on screen.
        padded = text.rjust(width)
        return LineText(padded) if live else LineText(padded, style=grey, justify="right")

    temp = None if s is None else s.temp_c

    def coloured(text: str, width: int, value: float | None, stops: Any) -> str | Text:
        # Memory and temperature carry a theme gradient (a Text only where it says something);
        # colours are cached per whole unit: blending costs ~10 µs, ×2 ×1000 GPUs.
        if not live or missing(value):
            return cell(text, width)
        key = (id(stops), int(value))  # type: ignore[arg-type]
        style = cache.get(key)
        if style is None:
            style = cache[key] = gradient(int(value), stops, palette)  # type: ignore[arg-type]
        return LineText(text.rjust(width), style=style)

    if not live:
        act_cell = LineText(f"{clean_text(h.state)} {fmt_num(act)}", style=grey)
    elif act is None:
        act_cell = LineText(DASH, style="dim")
    elif idle:
        act_cell = LineText(f"IDLE {act:.0f}%", style=f"bold {colour}")
    else:
        act_cell = LineText(f"{act:.0f}%", style=colour, justify="right")
    reasons = None if s is None else s.clock_reasons
    throttled = bool(reasons and reasons & THROTTLE_MASK)
    if reasons is None:
        thr_cell = LineText(DASH, style="dim")
    elif throttled:
        names = [n for n in clock_reason_names(reasons & THROTTLE_MASK)]
        thr_cell = ellipsis_cell(
            LineText(
                "⚠ " + ",".join(names),
                style=grey if not live else palette.get("warning", "yellow"),
            )
        )
    else:
        thr_cell = LineText("ok", style="dim")
    cells = (
        ellipsis_cell(LineText(clean_text(h.name), style=grey if not live else "")),
        LineText(str(g.index), justify="right"),
        act_cell,
        window_spark(
            acts,
            times,
            (since, store.now),
            spark_width,
            palette,
            stops=ACTIVITY_STOPS if live else None,
            style=grey,
            cache=cache,
        ),
        cell(fmt_num(None if s is None else s.util_gpu), W["nvml"]),
        cell(fmt_num(None if s is None else s.sm_util), W["sm"]),
        cell(fmt_num(None if s is None else s.tensor_util), W["tensor"]),
        cell(fmt_num(None if s is None else s.dram_util), W["dram"]),
        coloured(
            _pair(
                _gib(None if s is None else s.mem_used_mib),
                _gib(gpu_total(h, g, "mem_total_mib")),
                "{:.1f}",
            ),
            W["mem"],
            _mem_pct(h, g),
            MEMORY_STOPS,
        ),
        cell(
            _pair(None if s is None else s.power_w, gpu_total(h, g, "power_limit_w"), "{:.0f}"),
            W["power"],
        ),
        coloured(fmt_num(None if s is None else s.temp_c), W["temp"], temp, TEMP_STOPS),
        cell(fmt_num(None if s is None else s.sm_mhz), W["clock"]),
        thr_cell,
    )

    def num(v: float | None) -> float:
        return -1.0 if missing(v) else float(v)  # type: ignore[arg-type]

    sort = {
        "activity": num(act),
        "nvml": num(None if s is None else s.util_gpu),
        "sm": num(None if s is None else s.sm_util),
        "tensor": num(None if s is None else s.tensor_util),
        "dram": num(None if s is None else s.dram_util),
        "memory": num(None if s is None else s.mem_used_mib),
        "power": num(None if s is None else s.power_w),
        "temp": num(None if s is None else s.temp_c),
        "clock": num(None if s is None else s.sm_mhz),
        "throttle": float(throttled),
    }
    return GpuRow(cells, sort, idle and live, throttled, live)


def _row_act(r: GpuRow | GpuSummary) -> float | None:
    if isinstance(r, GpuRow):
        act = r.sort["activity"]
        return act if act >= 0 else None
    return r.act


def build_host_cells(
    store: Store, h: HostEntry, gpu_rows: Sequence[GpuRow | GpuSummary], palette: dict[str, str]
) -> tuple[Any, ...]:
    """Cells of one host row (its GPUs as built rows or as the store summary's entries)."""
    live = h.state not in DEAD_STATES
    grey = palette.get("muted", "grey50")
    state_style = host_state_style(h.state, palette)
    age = None if h.last_received is None else store.wall_clock() - h.last_received
    hs = h.latest
    acts = [a for a in map(_row_act, gpu_rows) if a is not None]
    idle = sum(1 for r in gpu_rows if r.idle)

    def cell(text: str) -> Text:
        return LineText(text, style="" if live else grey, justify="right")

    mem = None
    if hs is not None and hs.mem_used_bytes is not None:
        total = host_mem_total(h)
        mem = _pair(hs.mem_used_bytes / 2**30, None if total is None else total / 2**30, "{:.0f}")
    return (
        ellipsis_cell(LineText(clean_text(h.name), style="" if live else grey)),
        ellipsis_cell(LineText(clean_text(h.state), style=f"bold {state_style}")),
        cell(fmt_age(age)),
        cell(str(len(h.gpus))),
        cell(fmt_num(mean(acts))),
        LineText(
            str(idle), style=palette.get("warning", "yellow") if idle else "dim", justify="right"
        ),
        cell(fmt_num(None if hs is None else hs.cpu_pct)),
        cell(fmt_num(None if hs is None else hs.iowait_pct, "{:.1f}")),
        cell(mem or DASH),
        cell(fmt_bytes_rate(None if hs is None else hs.net_rx_bps)),
        cell(fmt_bytes_rate(None if hs is None else hs.net_tx_bps)),
        ellipsis_cell(_reason_cell(store, h, live, palette)),
    )


def _reason_cell(store: Store, h: HostEntry, live: bool, palette: dict[str, str]) -> Text:
    """The host's reason, plus how much of its input the boundary refused (issue 16)."""
    text = LineText(clean_text(h.reason), style=palette.get("error", "red") if not live else "dim")
    dropped = store.dropped(h.name)
    if dropped:
        text.append(("; " if h.reason else "") + f"{dropped} refused", style="yellow")
    return text


def verl_summary(store: Store, width: int = 0, cache: StepViews | None = None) -> Text:
    """The verl line (tokens/s per GPU and total, step time, MFU) and the stage strip.

    Numbers come from ``StepView``: tokens/s/GPU is derived from total tokens when verl did not
    log ``perf/throughput``, and total tokens/s uses the step time without validation/checkpoint.
    The second line shows which verl stage ran when over the history window (pane 3's letters),
    as wide as ``width`` leaves beside its legend (0: the default width). Each line stays one
    line: what does not fit ends in ``…``. ``cache``: the views of the window's steps, kept
    from one refresh to the next (a step's stages are sorted once, not every second).
    """
    from verl_top.origin import missing_steps_text
    from verl_top.status import waited_s, waiting_for_first_step
    from verl_top.verl.stages import fmt_mfu

    if not store.steps:
        if waiting_for_first_step(store):
            return Text(f"verl: waiting for the first step ({waited_s(store):.0f} s)", style="dim")
        return Text(missing_steps_text(store), style="dim")
    last = store.steps[-1]
    since = store.window_start()
    # async trainers: timing_s/gen is a wait (the views read steps in the job's trainer mode)
    recent = [s for s in store.steps if s.t >= since and s is not last] + [last]
    views = (cache if cache is not None else StepViews()).of(store, recent)
    view = views[-1]
    step_s = view.step_time_core if view.step_time_core is not None else view.step_time
    text = Text("verl ", style="bold", no_wrap=True, overflow="ellipsis")
    text.append(f"step {last.step}")
    tput_label = "tokens/s/GPU" + (
        f" ({view.throughput_source})"
        if view.throughput_source and view.throughput_source != "verl"
        else ""
    )
    parts = [
        (tput_label, fmt_num(view.throughput, "{:,.0f}")),
        ("tokens/s total", fmt_num(view.total_tokens_per_s, "{:,.0f}")),
        ("step time", fmt_num(step_s, "{:.1f}", " s")),
        ("MFU", fmt_mfu(view.mfu)),  # 0 from verl = not estimated; 1.5e-06 never "0.00"
    ]
    for label, value in parts:
        text.append(f" · {label} ")
        text.append(value, style="bold")
    if view.is_outlier:
        text.append(" (validation/checkpoint step)", style="dim")
    text.append(f" · {len(store.steps)} steps seen", style="dim")
    strip = stage_strip(views, since, store.now)
    if strip is None:
        return text
    head = Text(f"stages, last {store.now - since:.0f} s ", style="dim")
    legend = Text()
    seen = strip_stages(strip, STAGE_STYLE)
    for name, (letter, colour) in STAGE_STYLE.items():
        if name in seen:
            legend.append(letter, style=f"black on {colour}")
            legend.append(f" {name}  ", style="dim")
    legend.rstrip()
    # The strip takes the width its line leaves beside its legend (like the History
    # sparklines), never less than 20 cells: on a narrow terminal the legend ends in "…".
    cells = width - head.cell_len - 3 - legend.cell_len if width > 0 else STRIP_WIDTH
    cells = max(20, cells)
    if cells != STRIP_WIDTH:
        strip = stage_strip(views, since, store.now, cells) or strip
    text.append("\n")
    text.append_text(head)
    text.append("│", style="dim")
    text.append_text(strip)
    text.append("│ ", style="dim")
    text.append_text(legend)
    return text


def strip_stages(strip: Text, styles: dict[str, tuple[str, str]]) -> set[str]:
    """Stage names whose letter appears in a stage strip (for its legend)."""
    letters = set(strip.plain)
    return {name for name, (letter, _) in styles.items() if letter in letters}


def host_line(store: Store, names: Sequence[str], expanded: bool, palette: dict[str, str]) -> Text:
    """The host table in one line, for when the GPUs need the rows: hosts per state, the
    hosts that are not up and why, refused input, the busiest CPU / iowait, and the key."""
    warn, err = palette.get("warning", "yellow"), palette.get("error", "red")
    counts: dict[str, int] = {}
    for name in names:
        state = store.hosts[name].state
        counts[state] = counts.get(state, 0) + 1
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{len(names)} hosts", style="bold")
    for state, n in sorted(counts.items(), key=lambda kv: (kv[0] != "up", kv[0])):
        style = host_state_style(state, palette)
        text.append(" · ")
        text.append(f"{n} {clean_text(state)}", style=style if state == "up" else f"bold {style}")
    bad = [n for n in names if store.hosts[n].state not in ("up", "no_gpu")]
    for name in bad[:HOST_LINE_NAMES]:
        h = store.hosts[name]
        reason = f": {clean_text(h.reason)}" if h.reason else ""
        style = host_state_style(h.state, palette)
        text.append(f" · {clean_text(name)} {clean_text(h.state)}{reason}", style=style)
    if len(bad) > HOST_LINE_NAMES:
        text.append(f" · +{len(bad) - HOST_LINE_NAMES} more not up", style=err)
    dropped = {n: store.dropped(n) for n in names}
    refused = sum(dropped.values())
    if refused:
        worst = max(dropped, key=lambda n: dropped[n])
        text.append(f" · {refused} refused ({clean_text(worst)} {dropped[worst]})", style=warn)
    cpu = _busiest(store, names, "cpu_pct")
    iowait = _busiest(store, names, "iowait_pct")
    if cpu is not None:
        text.append(f" · CPU max {cpu[1]:.0f}% ({clean_text(cpu[0])})", style="dim")
    if iowait is not None:
        style = warn if iowait[1] >= IOWAIT_WARN else "dim"
        text.append(f" · iowait max {iowait[1]:.1f}% ({clean_text(iowait[0])})", style=style)
    text.append(" · h: hide host table" if expanded else " · h: host table", style="dim")
    return text


def _busiest(store: Store, names: Sequence[str], field: str) -> tuple[str, float] | None:
    """The live host with the highest latest ``field`` of its host sample, and that value."""
    best: tuple[str, float] | None = None
    for name in names:
        h = store.hosts[name]
        value = None if h.latest is None or h.state in DEAD_STATES else getattr(h.latest, field)
        if value is None or missing(value):
            continue
        if best is None or float(value) > best[1]:
            best = (name, float(value))
    return best


class LazyRows(Mapping[str, GpuRow]):
    """The GPU rows of the table by key, each built only when read (the visible ones are)."""

    def __init__(self, keys: list[str], build: Callable[[str], GpuRow]) -> None:
        self._keys = dict.fromkeys(keys)
        self._build = build

    def __getitem__(self, key: str) -> GpuRow:
        if key not in self._keys:
            raise KeyError(key)
        return self._build(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class ThroughputPane(Pane):
    """Pane 1: per-host and per-GPU activity, with sort and idle marks."""

    STEP = 1

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.findings.compact = True  # one line: the GPU table gets the rows (d: all findings)
        # The host table: None = shown when it and every GPU row fit, else one line (h: toggle).
        self.hosts_shown: bool | None = None
        self.hosts_expanded = True  # what the last refresh decided
        self.sort_key = "host"
        self.sort_reverse = False
        self._row_cache: dict[str, tuple[tuple[Any, ...], GpuRow]] = {}
        self.gpu_rows: Mapping[str, GpuRow] = {}
        self.gpu_sync: VirtualRows | None = None
        self.host_sync: VirtualRows | None = None
        self._summaries = SummaryCache()
        self._palette_key: tuple[tuple[str, str], ...] = ()
        self.on_sort_change: Callable[[], None] | None = None
        self.spark_width = SPARK_WIDTH
        self._colours: dict[tuple[int, int], str] = {}  # gradient colour per (scale, value)
        self._slots = TextSlots()  # the status lines, redrawn only when they change
        self._step_views = StepViews()  # the verl line's steps, each read once

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="verl-summary", classes="summary")
        yield Static("", id="host-line", classes="status")
        yield FastCellTable(
            id="host-table", cursor_type="row", zebra_stripes=False, classes="hosts"
        )
        yield Static("", id="gpu-status", classes="status")
        yield FastCellTable(id="gpu-table", cursor_type="row", zebra_stripes=True, classes="gpus")

    def on_mount(self) -> None:
        hosts = self.query_one("#host-table", DataTable)
        gpus = self.query_one("#gpu-table", DataTable)
        self.host_sync = VirtualRows(hosts, HOST_COLUMNS, id_columns=1)
        self.gpu_sync = VirtualRows(gpus, GPU_COLUMNS, id_columns=2)
        self.host_sync.on_overflow = self.gpu_sync.on_overflow = self._refit
        for widget in (hosts, gpus, self):  # the tables scroll their rows, the pane the tables
            self.watch(widget, "scroll_y", self._on_scrolled, init=False)

    def table_width(self) -> int:
        """Cells a table can use: the pane's width less its scrollbar (80 before layout)."""
        # The pane's width less its scrollbar, less the table's own (it scrolls its rows).
        width = self.scrollable_content_region.width
        return width - 2 if width > 10 else 78

    # -- sorting ---------------------------------------------------------------------------

    def cycle_sort(self) -> None:
        """Next sort column of the cycle (host → activity → memory → power → temp)."""
        try:
            i = SORT_CYCLE.index(self.sort_key)
        except ValueError:
            i = -1
        self.set_sort(SORT_CYCLE[(i + 1) % len(SORT_CYCLE)], False)

    def reverse_sort(self) -> None:
        """Reverse the current sort order."""
        self.set_sort(self.sort_key, not self.sort_reverse)

    def set_sort(self, key: str, reverse: bool) -> None:
        """Sort by ``key``; the next refresh redraws (no store change needed)."""
        self.sort_key, self.sort_reverse = key, reverse
        self.force_next()
        if self.on_sort_change is not None:
            self.on_sort_change()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """Clicking a GPU-table header sorts by it; clicking it again reverses."""
        if event.data_table.id != "gpu-table":
            return
        key = SORT_BY_COLUMN.get(str(event.column_key.value))
        if key is None:
            return
        self.set_sort(key, not self.sort_reverse if key == self.sort_key else False)
        event.stop()

    def sort_label(self) -> str:
        """The sort in words, for the status line."""
        arrow = "↓" if self.sort_reverse else "↑"
        return f"sort: {self.sort_key} {arrow}"

    # -- refresh ---------------------------------------------------------------------------

    def update_content(self, store: Store, assessment: Assessment) -> None:
        if self.gpu_sync is None or self.host_sync is None:
            return
        palette = self.palette()
        pkey = tuple(sorted(palette.items()))
        if pkey != self._palette_key:  # theme changed: rebuild every row's colours
            self._palette_key = pkey
            self._row_cache.clear()
            self._colours.clear()
        verl = verl_summary(store, self.table_width(), self._step_views)
        self._show("#verl-summary", verl)
        # Sorting and counting read the shared per-tick summary of every GPU; the row cells are
        # built, measured for the column fit and written only for the rows on screen
        # (VirtualRows), so off-screen GPUs cost little.
        summary = self.summary(store)
        host_keys: list[str] = []
        keys: list[str] = []
        flt = str(getattr(self.app, "host_filter", "") or "")  # key /: host or host/GPU
        for h in store.hosts.values():
            if flt and not host_matches(flt, h.name, list(h.gpus)):
                continue
            host_keys.append(h.name)
            for index in sorted(h.gpus):
                key = f"{h.name}/{index}"
                if flt and not matches_filter(flt, h.name, index):
                    continue  # the host row still counts it; the GPU table hides it
                keys.append(key)
        for key in [k for k in self._row_cache if k not in summary.gpus]:
            del self._row_cache[key]
        self.gpu_rows = LazyRows(keys, lambda k: self._gpu_row(store, k, palette))

        built_hosts: dict[str, tuple[Any, ...]] = {}  # fit and sync read the same rows

        def host_cells(name: str) -> tuple[Any, ...]:
            cells = built_hosts.get(name)
            if cells is None:
                h = store.hosts[name]
                mine = [summary.gpus[f"{name}/{i}"] for i in sorted(h.gpus)]
                cells = built_hosts[name] = build_host_cells(store, h, mine, palette)
            return cells

        order = self._sorted_keys(keys, summary)
        width = self.table_width()
        no_gpu = not store.gpu_count()
        self._show_hosts(store, host_keys, len(keys), verl, no_gpu, palette)
        # No GPU anywhere (and no filter hiding them): the banner says so once; the empty GPU
        # table and its status line give their space to the host table. Set before the sync:
        # a hidden table builds no rows, so the first GPUs to arrive must find it shown.
        self.query_one("#gpu-status", Static).display = not no_gpu
        self.query_one("#gpu-table", DataTable).display = not no_gpu
        with self.app.batch_update():
            self.host_sync.fit(width, [host_cells(n) for n in self.host_sync.window_of(host_keys)])
            self.host_sync.sync(host_keys, lambda n: (clean_text(n),), host_cells)
            shown = [self.gpu_rows[k].cells for k in self.gpu_sync.window_of(order)]
            self.gpu_sync.fit(width, shown)
            spark = self.gpu_sync.widths().get("spark", SPARK_WIDTH)
            if spark != self.spark_width:  # the History column got another width: redraw
                self.spark_width = spark
                self._refit()
            self.gpu_sync.sync(order, self._gpu_ident, lambda k: self.gpu_rows[k].cells)
        self._update_status(len(keys), summary)
        self._focus_hosts_without_gpus()

    def _show_hosts(
        self,
        store: Store,
        host_keys: list[str],
        gpu_rows: int,
        verl: Text,
        no_gpu: bool,
        palette: dict[str, str],
    ) -> None:
        """Show the host table, or only its one-line summary when the GPUs need the rows.

        Like nvtop, the GPU table gets every row the fixed lines leave: the host table is
        shown in full when it and every GPU row fit (or with no GPU: it is the main table),
        else it collapses to the host line; ``h`` overrides either way.
        """
        chrome = 1 + len(verl.plain.split("\n")) + 1 + 1  # findings, verl lines, 2 status
        fits = len(host_keys) + 1 + gpu_rows + 1 <= self.size.height - chrome
        expanded = no_gpu or (self.hosts_shown if self.hosts_shown is not None else fits)
        self.hosts_expanded = expanded
        table = self.query_one("#host-table", DataTable)
        table.display = expanded
        table.set_class(no_gpu, "-alone")
        table.set_class(fits and self.hosts_shown is None, "-all")  # all fit: no 25 % cap
        line = self.query_one("#host-line", Static)
        line.display = not no_gpu  # with no GPU the host table is the pane
        if not no_gpu:
            self._show("#host-line", host_line(store, host_keys, expanded, palette))
        if not expanded and self.app.focused is table:
            self.query_one("#gpu-table", DataTable).focus()

    def _show(self, selector: str, text: Text) -> None:
        """Put ``text`` in a status widget when it changed (``TextSlots``)."""
        self._slots.show(self.query_one(selector, Static), text)

    def toggle_hosts(self) -> bool:
        """Key h: show or hide the host table (its one-line summary stays); True when shown."""
        self.hosts_shown = not self.hosts_expanded
        self.force_next()
        self._redraw()
        return self.hosts_shown

    def summary(self, store: Store) -> StoreSummary:
        """The per-tick summary the app shares between panes (the pane's own without an app)."""
        cache = getattr(self.app, "summaries", None)
        if not isinstance(cache, SummaryCache):
            cache = self._summaries
        return cache.get(store)

    def _gpu_ident(self, key: str) -> tuple[Any, ...]:
        host, _, index = key.rpartition("/")
        return (clean_text(host), index)

    def _gpu_row(self, store: Store, key: str, palette: dict[str, str]) -> GpuRow:
        """One GPU's row, rebuilt only when its history, state, window or width moved."""
        host, _, index = key.rpartition("/")
        h = store.hosts[host]
        g = h.gpus[int(index)]
        stamp = (
            self.spark_width,
            g.history.last_time(),
            len(g.history),
            h.state,
            id(g.latest),
            store.limits.window_s,  # + / - change the window: Act(win) must follow
        )
        cached = self._row_cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        row = build_gpu_row(store, h, g, palette, self.spark_width, self._colours)
        self._row_cache[key] = (stamp, row)
        return row

    def _refit(self) -> None:
        """The column widths must follow (a wider number scrolled in, the History width
        moved): redraw once after this refresh."""
        self.force_next()
        self.call_after_refresh(self._redraw)

    def _on_scrolled(self, *_: Any) -> None:
        """Rows that scrolled into view are built now, before the next tick."""
        for sync in (self.gpu_sync, self.host_sync):
            if sync is not None:
                sync.fill()

    def on_resize(self) -> None:
        """A taller pane shows more rows: build them."""
        self.call_after_refresh(self._on_scrolled)

    def _focus_hosts_without_gpus(self) -> None:
        """With no GPU row, the host table takes the focus so Enter still opens a node."""
        gpus = self.query_one("#gpu-table", DataTable)
        hosts = self.query_one("#host-table", DataTable)
        if (self.app.focused is gpus or self.app.focused is None) and not gpus.row_count:
            if hosts.row_count and self.screen is self.app.screen:
                hosts.focus()

    def _sorted_keys(self, keys: list[str], summary: StoreSummary) -> list[str]:
        gpus = summary.gpus
        if self.sort_key == "host":
            # update_content lists the keys in host order (store.hosts, then GPU index), the
            # order the summary numbers them in: sorting them again cost ~2 us a GPU a tick.
            return keys[::-1] if self.sort_reverse else keys
        # Stable: ties keep host order; reverse puts the largest first.
        sign = -1.0 if self.sort_reverse else 1.0
        col = self.sort_key

        def order(k: str) -> tuple[float, int, int]:
            gs = gpus[k]
            return (sign * gs.sort_value(col), gs.host_pos, gs.gpu_index)

        return sorted(keys, key=order)

    def _update_status(self, shown: int, summary: StoreSummary) -> None:
        if shown == len(summary.gpus):  # no filter: the summary's counts
            idle, throttled = summary.idle, summary.throttled
        else:
            mine = [summary.gpus[k] for k in self.gpu_rows]
            idle = sum(1 for g in mine if g.idle)
            throttled = sum(1 for g in mine if g.throttled and g.live)
        # The counts first: on a narrow terminal the line ends in … and the keys go first.
        warn = self.palette().get("warning", "yellow")
        text = Text(f"{shown} GPUs")
        if idle:
            text.append(f" · {idle} idle (<{IDLE_THRESHOLD:.0f}% over the window)", style=warn)
        else:
            text.append(" · none idle", style="dim")
        if throttled:
            text.append(f" · {throttled} throttled", style=warn)
        text.append(" · ")
        text.append(self.sort_label(), style="bold")
        text.append(" (o/O: sort · Enter: node)", style="dim")
        self._show("#gpu-status", text)

    def ordered_row_keys(self) -> list[str]:
        """GPU row keys (``host/index``) in displayed order (for tests)."""
        return [] if self.gpu_sync is None else self.gpu_sync.keys_in_order()
