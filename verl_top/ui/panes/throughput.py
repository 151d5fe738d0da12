"""Pane 1 — Throughput & GPU: is there a problem, and how bad?

A host table (state, reason, last seen, CPU, iowait, memory, network) and a GPU table with one
row per GPU of every host: NVML util next to GPM SM / tensor / DRAM util (the NVML number alone
overstates real work), memory, power, temperature, clocks, throttling and an activity sparkline
over the window. GPUs whose mean activity over the window is below 50 % are marked idle.
Both tables are updated by diffing cells (``TableSync``); a GPU whose history did not move since
the last refresh reuses its row without touching the ring buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from verl_top.model import THROTTLE_MASK, clock_reason_names
from verl_top.store import GpuEntry, HostEntry, Store, mean
from verl_top.store_summary import StoreSummary, SummaryCache
from verl_top.ui.filter_bar import host_matches, matches_filter
from verl_top.ui.panes.base import Pane
from verl_top.ui.virtual_table import VirtualRows
from verl_top.ui.widgets import (
    DASH,
    DEAD_STATES,
    IDLE_THRESHOLD,
    activity_style,
    fmt_age,
    fmt_bytes_rate,
    fmt_num,
    gpu_total,
    host_mem_total,
    host_state_style,
    missing,
    sparkline,
)
from verl_top.untrusted import clean_text

GPU_COLUMNS: tuple[tuple[str, str, int], ...] = (
    # key, label, width
    ("host", "Host", 14),
    ("gpu", "GPU", 3),
    ("act", "Act(win)", 9),
    ("spark", "History", 16),
    ("nvml", "NVML%", 5),
    ("sm", "SM%", 5),
    ("tensor", "Tensor%", 7),
    ("dram", "DRAM%", 5),
    ("mem", "Mem GiB", 11),
    ("power", "Power W", 9),
    ("temp", "°C", 3),
    ("clock", "SM MHz", 6),
    ("throttle", "Throttle", 14),
)
W = {key: width for key, _, width in GPU_COLUMNS}
HOST_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("host", "Host", 14),
    ("state", "State", 11),
    ("seen", "Seen", 5),
    ("gpus", "GPUs", 4),
    ("act", "Act%", 5),
    ("idle", "Idle", 4),
    ("cpu", "CPU%", 5),
    ("iowait", "iowait", 6),
    ("mem", "Mem GiB", 11),
    ("rx", "Net rx", 10),
    ("tx", "Net tx", 10),
    ("reason", "Reason", 40),
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
SPARK_WIDTH = 16


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


def _pair(a: float | None, b: float | None, fmt: str) -> str:
    if missing(a):
        return DASH
    return fmt.format(a) + ("/" + fmt.format(b) if not missing(b) else "")


def build_gpu_row(store: Store, h: HostEntry, g: GpuEntry, palette: dict[str, str]) -> GpuRow:
    """Cells of one GPU row from its latest sample and its window history."""
    s = g.latest
    live = h.state not in DEAD_STATES
    acts = g.history.recent_values("activity", store.window_start())
    act = mean(acts)
    idle = act is not None and act < IDLE_THRESHOLD
    grey = "dim" if live else palette.get("muted", "grey50")
    colour = activity_style(act, palette) if live else grey

    def cell(text: str, width: int) -> str | Text:
        # Plain right-padded strings: a Rich Text per cell costs ~10 µs, ×13 cells ×1000 GPUs.
        padded = text.rjust(width)
        return padded if live else Text(padded, style=grey)

    if not live:
        act_cell = Text(f"{clean_text(h.state)} {fmt_num(act)}", style=grey)
    elif act is None:
        act_cell = Text(DASH, style="dim")
    elif idle:
        act_cell = Text(f"IDLE {act:.0f}%", style=f"bold {colour}")
    else:
        act_cell = Text(f"{act:.0f}%", style=colour, justify="right")
    reasons = None if s is None else s.clock_reasons
    throttled = bool(reasons and reasons & THROTTLE_MASK)
    if reasons is None:
        thr_cell = Text(DASH, style="dim")
    elif throttled:
        names = [n for n in clock_reason_names(reasons & THROTTLE_MASK)]
        thr_cell = Text(
            "⚠ " + ",".join(names), style=grey if not live else palette.get("warning", "yellow")
        )
    else:
        thr_cell = Text("ok", style="dim")
    cells = (
        Text(clean_text(h.name), style=grey if not live else ""),
        g.index,
        act_cell,
        Text(sparkline(acts, SPARK_WIDTH), style=colour),
        cell(fmt_num(None if s is None else s.util_gpu), W["nvml"]),
        cell(fmt_num(None if s is None else s.sm_util), W["sm"]),
        cell(fmt_num(None if s is None else s.tensor_util), W["tensor"]),
        cell(fmt_num(None if s is None else s.dram_util), W["dram"]),
        cell(
            _pair(
                _gib(None if s is None else s.mem_used_mib),
                _gib(gpu_total(h, g, "mem_total_mib")),
                "{:.1f}",
            ),
            W["mem"],
        ),
        cell(
            _pair(None if s is None else s.power_w, gpu_total(h, g, "power_limit_w"), "{:.0f}"),
            W["power"],
        ),
        cell(fmt_num(None if s is None else s.temp_c), W["temp"]),
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


def build_host_cells(
    store: Store, h: HostEntry, gpu_rows: list[GpuRow], palette: dict[str, str]
) -> tuple[Any, ...]:
    """Cells of one host row."""
    live = h.state not in DEAD_STATES
    grey = palette.get("muted", "grey50")
    state_style = host_state_style(h.state, palette)
    age = None if h.last_received is None else store.wall_clock() - h.last_received
    hs = h.latest
    acts = [r.sort["activity"] for r in gpu_rows if r.sort["activity"] >= 0]
    idle = sum(1 for r in gpu_rows if r.idle)

    def cell(text: str) -> Text:
        return Text(text, style="" if live else grey, justify="right")

    mem = None
    if hs is not None and hs.mem_used_bytes is not None:
        total = host_mem_total(h)
        mem = _pair(hs.mem_used_bytes / 2**30, None if total is None else total / 2**30, "{:.0f}")
    return (
        Text(clean_text(h.name), style="" if live else grey),
        Text(clean_text(h.state), style=f"bold {state_style}"),
        cell(fmt_age(age)),
        cell(str(len(h.gpus))),
        cell(fmt_num(mean(acts))),
        Text(str(idle), style=palette.get("warning", "yellow") if idle else "dim", justify="right"),
        cell(fmt_num(None if hs is None else hs.cpu_pct)),
        cell(fmt_num(None if hs is None else hs.iowait_pct, "{:.1f}")),
        cell(mem or DASH),
        cell(fmt_bytes_rate(None if hs is None else hs.net_rx_bps)),
        cell(fmt_bytes_rate(None if hs is None else hs.net_tx_bps)),
        Text(clean_text(h.reason), style=palette.get("error", "red") if not live else "dim"),
    )


def verl_summary(store: Store) -> Text:
    """The verl line (tokens/s per GPU and total, step time, MFU) and the stage strip.

    Numbers come from ``StepView``: tokens/s/GPU is derived from total tokens when verl did not
    log ``perf/throughput``, and total tokens/s uses the step time without validation/checkpoint.
    The second line shows which verl stage ran when over the history window (pane 3's letters).
    """
    from verl_top.ui.panes.dataflow import STAGE_STYLE, stage_strip  # pane 3 owns the letters
    from verl_top.verl.stages import StepView

    if not store.steps:
        return Text("verl: no verl log: give --verl-log PATH", style="dim")
    last = store.steps[-1]
    view = StepView.from_step(last, store.config)
    step_s = view.step_time_core if view.step_time_core is not None else view.step_time
    text = Text("verl ", style="bold")
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
        ("MFU", fmt_num(view.mfu, "{:.2f}")),
    ]
    for label, value in parts:
        text.append(f" · {label} ")
        text.append(value, style="bold")
    if view.is_outlier:
        text.append(" (validation/checkpoint step)", style="dim")
    text.append(f" · {len(store.steps)} steps seen", style="dim")
    since = store.window_start()
    strip = stage_strip(store.steps, since, store.now)
    if strip is not None:
        text.append(f"\nstages, last {store.now - since:.0f} s ", style="dim")
        text.append("│", style="dim")
        text.append_text(strip)
        text.append("│ ", style="dim")
        seen = strip_stages(strip, STAGE_STYLE)
        for name, (letter, colour) in STAGE_STYLE.items():
            if name in seen:
                text.append(letter, style=f"black on {colour}")
                text.append(f" {name}  ", style="dim")
    return text


def strip_stages(strip: Text, styles: dict[str, tuple[str, str]]) -> set[str]:
    """Stage names whose letter appears in a stage strip (for its legend)."""
    letters = set(strip.plain)
    return {name for name, (letter, _) in styles.items() if letter in letters}


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
        self.sort_key = "host"
        self.sort_reverse = False
        self._row_cache: dict[str, tuple[tuple[Any, ...], GpuRow]] = {}
        self.gpu_rows: Mapping[str, GpuRow] = {}
        self.gpu_sync: VirtualRows | None = None
        self.host_sync: VirtualRows | None = None
        self._summaries = SummaryCache()
        self._palette_key: tuple[str, ...] = ()
        self.on_sort_change: Callable[[], None] | None = None

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="verl-summary", classes="summary")
        yield DataTable(id="host-table", cursor_type="row", zebra_stripes=False, classes="hosts")
        yield Static("", id="gpu-status", classes="status")
        yield DataTable(id="gpu-table", cursor_type="row", zebra_stripes=True, classes="gpus")

    def on_mount(self) -> None:
        hosts = self.query_one("#host-table", DataTable)
        for key, label, width in HOST_COLUMNS:
            hosts.add_column(label, key=key, width=width)
        gpus = self.query_one("#gpu-table", DataTable)
        for key, label, width in GPU_COLUMNS:
            gpus.add_column(label, key=key, width=width)
        self.host_sync = VirtualRows(hosts, [c[0] for c in HOST_COLUMNS], id_columns=1)
        self.gpu_sync = VirtualRows(gpus, [c[0] for c in GPU_COLUMNS], id_columns=2)
        for widget in (hosts, gpus, self):  # the tables scroll their rows, the pane the tables
            self.watch(widget, "scroll_y", self._on_scrolled, init=False)

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

    def update_content(self, store: Store, verdict: Any) -> None:
        if self.gpu_sync is None or self.host_sync is None:
            return
        palette = self.palette()
        pkey = tuple(sorted(palette.items()))
        if pkey != self._palette_key:  # theme changed: rebuild every row's colours
            self._palette_key = pkey
            self._row_cache.clear()
        self.query_one("#verl-summary", Static).update(verl_summary(store))
        # Sorting and counting read the shared per-tick summary of every GPU; the row cells
        # are built only for the rows on screen (VirtualRows), so off-screen GPUs cost little.
        summary = self.summary(store)
        host_keys: list[str] = []
        keys: list[str] = []
        flt = str(getattr(self.app, "host_filter", "") or "")  # key /: host or host/GPU
        for h in store.hosts.values():
            if flt and not host_matches(flt, h.name, list(h.gpus)):
                continue
            host_keys.append(h.name)
            for index in sorted(h.gpus):
                if flt and not matches_filter(flt, h.name, index):
                    continue  # the host row still counts it; the GPU table hides it
                keys.append(f"{h.name}/{index}")
        for key in [k for k in self._row_cache if k not in summary.gpus]:
            del self._row_cache[key]
        self.gpu_rows = LazyRows(keys, lambda k: self._gpu_row(store, k, palette))

        def host_cells(name: str) -> tuple[Any, ...]:
            h = store.hosts[name]
            mine = [summary.gpus[f"{name}/{i}"] for i in sorted(h.gpus)]
            return build_host_cells(store, h, mine, palette)  # type: ignore[arg-type]

        with self.app.batch_update():
            self.host_sync.sync(host_keys, lambda n: (clean_text(n),), host_cells)
            self.gpu_sync.sync(
                self._sorted_keys(keys, summary), self._gpu_ident, lambda k: self.gpu_rows[k].cells
            )
        self._update_status(len(keys), summary)
        self._focus_hosts_without_gpus()

    def summary(self, store: Store) -> StoreSummary:
        """The per-tick summary the app shares between panes (the pane's own without an app)."""
        cache = getattr(self.app, "summaries", None)
        if not isinstance(cache, SummaryCache):
            cache = self._summaries
        return cache.get(store)

    def _gpu_ident(self, key: str) -> tuple[Any, ...]:
        host, _, index = key.rpartition("/")
        return (clean_text(host), int(index))

    def _gpu_row(self, store: Store, key: str, palette: dict[str, str]) -> GpuRow:
        """One GPU's row, rebuilt only when its history, state or window moved."""
        host, _, index = key.rpartition("/")
        h = store.hosts[host]
        g = h.gpus[int(index)]
        stamp = (
            g.history.last_time(),
            len(g.history),
            h.state,
            id(g.latest),
            store.limits.window_s,  # + / - change the window: Act(win) must follow
        )
        cached = self._row_cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        row = build_gpu_row(store, h, g, palette)
        self._row_cache[key] = (stamp, row)
        return row

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
        if self.app.focused is gpus and not gpus.row_count and hosts.row_count:
            hosts.focus()

    def _sorted_keys(self, keys: list[str], summary: StoreSummary) -> list[str]:
        gpus = summary.gpus
        if self.sort_key == "host":
            return sorted(
                keys, key=lambda k: (gpus[k].host_pos, gpus[k].index), reverse=self.sort_reverse
            )
        # Stable: ties keep host order; reverse puts the largest first.
        sign = -1.0 if self.sort_reverse else 1.0
        col = self.sort_key

        def order(k: str) -> tuple[float, int, int]:
            gs = gpus[k]
            return (sign * gs.sort_value(col), gs.host_pos, gs.index)

        return sorted(keys, key=order)

    def _update_status(self, shown: int, summary: StoreSummary) -> None:
        if shown == len(summary.gpus):  # no filter: the summary's counts
            idle, throttled = summary.idle, summary.throttled
        else:
            mine = [summary.gpus[k] for k in self.gpu_rows]
            idle = sum(1 for g in mine if g.idle)
            throttled = sum(1 for g in mine if g.throttled and g.live)
        text = Text()
        text.append(self.sort_label(), style="bold")
        text.append(" (o: next column · O: reverse · click a header · Enter: node)", style="dim")
        text.append(f" · {shown} GPUs")
        if idle:
            text.append(
                f" · {idle} idle (<{IDLE_THRESHOLD:.0f}% over the window)",
                style=self.palette().get("warning", "yellow"),
            )
        else:
            text.append(" · none idle", style="dim")
        if throttled:
            text.append(f" · {throttled} throttled", style=self.palette().get("warning", "yellow"))
        self.query_one("#gpu-status", Static).update(text)

    def ordered_row_keys(self) -> list[str]:
        """GPU row keys (``host/index``) in displayed order (for tests)."""
        return [] if self.gpu_sync is None else self.gpu_sync.keys_in_order()
