"""The node screen: one host in depth (``Enter`` on a host or GPU row, ``Esc`` back).

A header with the host's state, reason, backend, driver, agent and Python; per-GPU history plots
over the window (activity, tensor, DRAM, memory % and power % of the limit) for one GPU or all
of them (``←`` / ``→``); the node's GPU processes with their verl role and rank (a process the
agent cannot see is said so, never shown as some other process); CPU per core, memory, network
and disk; the bandwidth probes that involved the node; and the tail of its followed logs.

Cost: the app calls ``refresh_screen`` on its timer only while this screen is the active one.
Plots are rebuilt only when one of the node's GPUs got a new sample, the GPU selection or the
plot size changed, with each series averaged down to about one point per plot column
(plotext's ``build`` costs milliseconds per line and point: docs/ui.md, "Node screen").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from verl_top.assessment import Assessment
from verl_top.export.redact import redact_lines
from verl_top.model import GpuProcess
from verl_top.origin import no_host_sample_text, no_processes_text
from verl_top.roles import classify, process_map, verl_name
from verl_top.store import GpuEntry, HostEntry, Store, mean
from verl_top.ui.running_app import app_palette, monitor_app
from verl_top.ui.widgets import (
    DASH,
    DEAD_STATES,
    REQUIRED,
    SPARK_CHARS,
    Column,
    TableSync,
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
from verl_top.verl.parse import strip_ansi

SPARK_MIN = 16  # cells of a host sparkline before the block's width is known (or when narrow)
# Host CPU load on the theme gradient: green while there is headroom, red when saturated.
CPU_STOPS = ((0.0, "success"), (60.0, "warning"), (90.0, "error"))

# (key, title, what the plot shows): one plot each, 0-100 %.
METRICS: tuple[tuple[str, str], ...] = (
    ("activity", "activity %"),
    ("tensor", "tensor util %"),
    ("dram", "DRAM BW util %"),
    ("memory", "memory used %"),
    ("power", "power % of limit"),
)
# "All GPUs" plots three lines, not one per GPU: eight overlapping braille lines were
# unreadable and cost ~30 ms per plot at 50x12 (one line: ~8 ms).
# (line, palette colour); drawn in this order, so the mean lies on top.
ENVELOPE = (("min", "muted"), ("max", "error"), ("mean", "success"))
FALLBACK_COLOURS = {"muted": "#808080", "error": "#ff4444", "success": "#44bb44"}


def rgb(hex_colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` as a plotext RGB tuple (plotext's own colour names follow its theme)."""
    h = hex_colour.lstrip("#")
    try:
        return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    except ValueError:
        return 68, 136, 255


LOG_LINES = 15
PROBES_SHOWN = 5
PROC_COLUMNS: tuple[Column, ...] = (
    Column("pid", "PID", 5, REQUIRED),
    Column("user", "User", 4, 6, "text", 16),
    Column("gpu", "GPU", 3, 9),
    Column("gmem", "GPU mem", 7, 8),
    Column("cpu", "CPU%", 4, 5),
    Column("rss", "RSS", 7, 4),
    Column("role", "verl role · method", 8, 8, "text", 40),
    Column("rank", "Rank", 4, 7),
    Column("cmd", "Command", 12, 7, "flex", 400),
)


def row_target(table_id: str | None, row_key: str | None) -> tuple[str, int | None] | None:
    """(host, GPU index or None) for a selected row of pane 1's host or GPU table."""
    if not row_key:
        return None
    if table_id == "host-table":
        return row_key, None
    if table_id == "gpu-table" and "/" in row_key:
        host, _, index = row_key.rpartition("/")
        try:
            return host, int(index)
        except ValueError:
            return None
    return None


def invisible_line(pid: int, gpu: int) -> str:
    """What the screen says about a GPU process the agent cannot see in /proc."""
    return f"pid {pid} on GPU {gpu} is not visible to the agent (another PID namespace / container)"


def bucket_means(
    times: Sequence[float], values: Sequence[float], start: float, end: float, buckets: int
) -> list[float | None]:
    """Means of ``values`` in ``buckets`` equal time slices of [start, end] (None: no point);
    NaN (missing) points are left out."""
    if buckets < 1 or end <= start:
        return []
    width = (end - start) / buckets
    sums = [0.0] * buckets
    counts = [0] * buckets
    for t, v in zip(times, values, strict=False):
        if v != v or t < start:  # NaN: missing
            continue
        k = min(buckets - 1, int((t - start) / width))
        sums[k] += v
        counts[k] += 1
    return [sums[k] / counts[k] if counts[k] else None for k in range(buckets)]


def bucket_x(start: float, end: float, buckets: int) -> list[float]:
    """Bucket centres in seconds before ``end`` (the right edge is 0)."""
    width = (end - start) / buckets
    return [start + (k + 0.5) * width - end for k in range(buckets)]


def downsample(
    times: Sequence[float], values: Sequence[float], start: float, end: float, buckets: int
) -> tuple[list[float], list[float]]:
    """Bucket means as plot points (x in seconds before ``end``), empty slices left out."""
    means = bucket_means(times, values, start, end, buckets)
    xs = bucket_x(start, end, buckets) if means else []
    return [x for x, y in zip(xs, means, strict=True) if y is not None], [
        y for y in means if y is not None
    ]


def envelope(
    per_gpu: list[list[float | None]], xs: list[float]
) -> dict[str, tuple[list[float], list[float]]]:
    """Per time bucket, min / mean / max across GPUs (buckets no GPU has are left out)."""
    out: dict[str, tuple[list[float], list[float]]] = {
        "min": ([], []),
        "mean": ([], []),
        "max": ([], []),
    }
    for k, x in enumerate(xs):
        vals = [v for b in per_gpu if k < len(b) and (v := b[k]) is not None]
        if not vals:
            continue
        for name, value in (
            ("min", min(vals)),
            ("mean", sum(vals) / len(vals)),
            ("max", max(vals)),
        ):
            out[name][0].append(x)
            out[name][1].append(value)
    return out


def metric_series(
    h: HostEntry, g: GpuEntry, metric: str, since: float
) -> tuple[list[float], list[float]]:
    """Times and 0-100 values of one plotted metric of one GPU (NaN where missing)."""
    ring = g.history
    if metric == "activity":
        return ring.series("activity", since)
    if metric == "tensor":
        return ring.series("tensor_util", since)
    if metric == "dram":
        return ring.series("dram_util", since)
    if metric == "memory":
        ts, vs = ring.series("mem_used_mib", since)
        total = gpu_total(h, g, "mem_total_mib")
        return ts, [100.0 * v / total if total else math.nan for v in vs]
    ts, vs = ring.series("power_w", since)
    limit = gpu_total(h, g, "power_limit_w")
    return ts, [100.0 * v / limit if limit else math.nan for v in vs]


def activity_source(h: HostEntry) -> str:
    """Which counter the activity plot shows for this host."""
    if any(g.latest is not None and g.latest.sm_util is not None for g in h.gpus.values()):
        return "GPM SM util"
    return "NVML util"


def core_bars(per_core: Sequence[float], palette: dict[str, str]) -> Text:
    """One block character per CPU core (height = busy %), on the theme's load gradient."""
    text = Text()
    last = len(SPARK_CHARS) - 1
    for v in per_core:
        if missing(v):
            text.append("·", style="dim")
            continue
        ch = SPARK_CHARS[min(last, max(0, int(v / 100.0 * last + 0.5)))]
        text.append(ch, style=gradient(v, CPU_STOPS, palette))
    return text


def render_info(store: Store, h: HostEntry, palette: dict[str, str]) -> Text:
    """The lines under the title: state and reason, backend, driver, agent, Python, hardware."""
    live = h.state not in DEAD_STATES
    text = Text()
    state_style = host_state_style(h.state, palette)
    text.append("state ", style="dim")
    text.append(clean_text(h.state), style=f"bold {state_style}")
    if h.reason:
        text.append(
            f" ({clean_text(h.reason)})", style=palette.get("error", "red") if not live else ""
        )
    age = None if h.last_received is None else store.wall_clock() - h.last_received
    text.append(f" · last seen {fmt_age(age)} ago", style="dim")
    drops = store.drops.get(h.name)
    if drops:  # what the record boundary refused from this host, worst reasons first
        top = sorted(drops.items(), key=lambda kv: -kv[1])[:3]
        text.append(f"\nrefused input: {sum(drops.values())} (", style="yellow")
        text.append(", ".join(f"{reason} ×{n}" for reason, n in top) + ")", style="yellow")
    if h.clock_offset is not None and abs(h.clock_offset) >= 1.0:
        text.append(f"\nclock offset {h.clock_offset:+.1f} s (corrected)", style="yellow")
    hello = h.hello
    if hello is None:
        text.append("\nno hello from the agent yet: backend, driver and versions unknown")
        return text
    parts = [
        ("backend", hello.backend or DASH),
        ("driver", hello.driver or DASH),
        ("NVML", hello.nvml_version or DASH),
        ("agent", hello.agent_version or DASH),
        ("Python", hello.python or DASH),
        ("interval", f"{hello.interval:g} s"),
    ]
    text.append("\n")
    for i, (label, value) in enumerate(parts):
        text.append(("" if i == 0 else " · ") + f"{label} ", style="dim")
        text.append(clean_text(value), style="bold")
    names: dict[str, int] = {}
    for info in hello.gpus:
        name = clean_text(info.name) or "GPU"
        names[name] = names.get(name, 0) + 1
    gpus = ", ".join(f"{n}× {name}" for name, n in names.items()) or "no GPU"
    gpm = sum(1 for info in hello.gpus if info.gpm)
    text.append(f"\n{gpus}", style="bold")
    if hello.gpus:
        text.append(
            " (GPM: SM/tensor/DRAM util)"
            if gpm == len(hello.gpus)
            else f" ({gpm} with GPM)"
            if gpm
            else " (no GPM: activity is NVML util, no tensor/DRAM plots)",
            style="dim",
        )
    if hello.cpu_count:
        text.append(f" · {hello.cpu_count} CPUs", style="dim")
    if hello.mem_total_bytes:
        text.append(f" · {hello.mem_total_bytes / 2**30:.0f} GiB RAM", style="dim")
    if hello.error:
        text.append(f"\nagent: {clean_text(hello.error)}", style=palette.get("warning", "yellow"))
    pods = [f"GPU {g.index} {g.workload}" for g in hello.gpus if g.workload]
    if pods:  # from dcgm-exporter's Kubernetes labels (--prometheus)
        text.append("\npods: ", style="dim")
        text.append(", ".join(pods))
    return text


def render_host(store: Store, h: HostEntry, palette: dict[str, str], width: int = 0) -> Text:
    """CPU (total, iowait, load, per core), memory, network and disk rates, the agent's cost.

    The sparklines take the width the block has (``width``; 0: 16 cells), the CPU one coloured
    cell by cell on the load gradient."""
    s = h.latest
    text = Text()
    text.append("Host\n", style="bold underline")
    if s is None:
        text.append(no_host_sample_text(store), style="italic")
        return text
    span = (store.window_start(), store.now)

    def series(column: str) -> tuple[list[float], list[float]]:
        times, values = h.history.recent_series(column, span[0])
        return times, [v for v in values if v == v]  # v == v drops NaN (missing)

    cpu_times, cpu_hist = series("cpu_pct")
    cpu = fmt_num(s.cpu_pct, "{:.0f}", " %")
    iowait = fmt_num(s.iowait_pct, "{:.1f}", " %")
    load = fmt_num(s.load1, "{:.1f}")
    text.append("CPU ", style="dim")
    text.append(cpu, style="bold")
    # The sparkline takes what the line leaves beside its numbers.
    rest = len(f"CPU {cpu} ") + len(f" · iowait {iowait} · load {load}")
    cells = max(4, width - rest) if width > 0 else SPARK_MIN
    text.append(" ")
    text.append_text(window_spark(cpu_hist, cpu_times, span, cells, palette, CPU_STOPS))
    text.append(" · iowait ", style="dim")
    iowait_style = "bold " + palette.get("warning", "yellow") if (s.iowait_pct or 0) >= 5 else ""
    text.append(iowait, style=iowait_style)
    text.append(" · load ", style="dim")
    text.append(load)
    if s.cpu_per_core:
        text.append(f"\n{len(s.cpu_per_core)} cores: ", style="dim")
        text.append_text(core_bars(s.cpu_per_core, palette))
    elif s.cpu_max_core_pct is not None:  # node_exporter via Prometheus: the busiest only
        text.append("\nbusiest core ", style="dim")
        text.append(fmt_num(s.cpu_max_core_pct, "{:.0f}", " %"), style="bold")
        text.append(" (per-core values are not read from Prometheus)", style="dim")
    else:
        text.append("\nper-core CPU not reported", style="dim")
    total = host_mem_total(h)
    text.append("\nMemory ", style="dim")
    if s.mem_used_bytes is not None:
        used = s.mem_used_bytes / 2**30
        text.append(f"{used:.0f}", style="bold")
        if total:
            text.append(f" / {total / 2**30:.0f} GiB ({100 * s.mem_used_bytes / total:.0f} %)")
        else:
            text.append(" GiB")
    else:
        text.append(DASH)
    for label, col, value in (
        ("Net rx ", "net_rx_bps", s.net_rx_bps),
        ("Net tx ", "net_tx_bps", s.net_tx_bps),
        ("Disk rd", "disk_read_bps", s.disk_read_bps),
        ("Disk wr", "disk_write_bps", s.disk_write_bps),
    ):
        times, hist = series(col)
        text.append(f"\n{label} ", style="dim")
        text.append(fmt_bytes_rate(value).rjust(10), style="bold")
        if hist:
            cells = max(4, width - 19) if width > 0 else SPARK_MIN  # label + rate: 19
            top = max(hist) or 1.0  # rates have no ceiling: scaled to the window's peak
            text.append(" ")
            accent = palette.get("accent", "cyan")
            text.append_text(window_spark(hist, times, span, cells, style=accent, top=top))
    if s.agent_cpu_pct is not None or s.agent_rss_bytes is not None:
        text.append_text(cost_line(store, h))
    return text


COST_WINDOW_S = 30.0  # one sample's CPU % is one interval's worth: too noisy to show alone


def cost_line(store: Store, h: HostEntry) -> Text:
    """What sampling this node costs: the agent's CPU (mean over the last 30 s) and RSS. With
    the in-process local source the agent runs inside verl-top, so the figure is verl-top's own
    (client and agent together), and the line says so."""
    s = h.latest
    in_process = h.hello is not None and h.hello.pid == os.getpid() and not store.replay
    hist = h.history.recent_values("agent_cpu_pct", store.now - COST_WINDOW_S)
    vals = [v for v in hist if v == v]  # NaN: no value in that sample
    cpu = sum(vals) / len(vals) if vals else (None if s is None else s.agent_cpu_pct)
    rss = None if s is None or s.agent_rss_bytes is None else s.agent_rss_bytes / 2**20
    text = Text()
    label = "verl-top itself (this process: UI + in-process agent)" if in_process else "agent"
    text.append(f"\n{label}: CPU ", style="dim")
    text.append(fmt_num(cpu, "{:.1f}", " % of a core"))
    text.append(f" ({int(COST_WINDOW_S)} s mean)" if vals else " (last sample)", style="dim")
    text.append(" · RSS ", style="dim")
    text.append(fmt_num(rss, "{:.0f}", " MiB"))
    return text


def _size(nbytes: float | None) -> str:
    if missing(nbytes):
        return DASH
    assert nbytes is not None
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.0f} MiB"


def role_label(proc: GpuProcess) -> str:
    """verl's name of the process with the method it runs now (``actor/rollout/ref ·
    generate_sequences``); the coarse role when the name is unknown."""
    name = proc.verl_role or verl_name(proc.cmd or "") or proc.role or ""
    method = proc.method or classify(proc.cmd or "").method
    if not name:
        return DASH
    return f"{name} · {method}" if method else name


def process_rows(
    h: HostEntry, actors: Sequence[Any] = ()
) -> tuple[list[tuple[str, tuple[Any, ...]]], list[Any]]:
    """Table rows of the visible GPU processes (by GPU, then pid), then the job's Ray actors on
    this host that hold no GPU (TaskRunner, ...); and the invisible GPU processes."""
    rows: list[tuple[str, tuple[Any, ...]]] = []
    hidden: list[Any] = []
    procs = [] if h.procs is None else sorted(h.procs.procs, key=lambda p: (p.gpu_index, p.pid))
    for p in procs:
        if not p.visible:
            hidden.append(p)
            continue
        gmem = None if p.used_mib is None else p.used_mib * 2**20
        rows.append(
            (
                f"{p.pid}/{p.gpu_index}",
                (
                    Text(str(p.pid), justify="right"),
                    ellipsis_cell(p.user or DASH),
                    Text(str(p.gpu_index), justify="right"),
                    Text(_size(gmem), justify="right"),
                    Text(fmt_num(p.cpu_pct), justify="right"),
                    Text(_size(p.rss_bytes), justify="right"),
                    ellipsis_cell(role_label(p)),
                    Text(DASH if p.rank is None else str(p.rank), justify="right"),
                    ellipsis_cell(p.cmd or DASH),
                ),
            )
        )
    plist = {h.name: h.procs} if h.procs is not None else {}
    for m in process_map(plist, [a for a in actors if a.host == h.name]):
        if m.source == "job":  # a process of the job holding no GPU (driver, engine, ...)
            rows.append((f"job/{m.pid}", job_row(m)))
            continue
        if m.source != "ray":
            continue
        rows.append(
            (
                f"ray/{m.pid}",
                (
                    (DASH if m.pid is None else str(m.pid)).rjust(8),
                    DASH,
                    DASH.rjust(3),
                    DASH.rjust(9),
                    DASH.rjust(5),
                    DASH.rjust(9),
                    m.label,
                    (DASH if m.rank is None else str(m.rank)).rjust(4),
                    f"Ray actor {m.cmd}"[:200],
                ),
            )
        )
    return rows, hidden


def process_row_pid(key: str) -> int | None:
    """The pid of a process-table row key (``PID/GPU``, ``job/PID``, ``ray/PID``)."""
    first, _, rest = key.partition("/")
    text = first if first.isdigit() else rest
    return int(text) if text.isdigit() else None


def job_row(m: Any) -> tuple[Any, ...]:
    """The cells of a job process that holds no GPU: no GPU columns, its state with its role."""
    state = f" [{m.state}]" if m.state else ""
    return (
        Text(str(m.pid), justify="right"),
        ellipsis_cell(m.user or DASH),
        Text(DASH, justify="right"),
        Text(DASH, justify="right"),
        Text(fmt_num(m.cpu_pct), justify="right"),
        Text(_size(m.rss_bytes), justify="right"),
        ellipsis_cell(m.label + state),
        Text(DASH if m.rank is None else str(m.rank), justify="right"),
        ellipsis_cell(m.cmd or DASH),
    )


def render_hidden(
    h: HostEntry, hidden: list[Any], palette: dict[str, str], store: Store | None = None
) -> RenderableType:
    """A plain line per invisible process, or the reason there is no process list (in the
    session's terms: dcgm-exporter exports none, a recording has none, the agent's is due)."""
    if h.procs is None:
        return Text(no_processes_text(store if store is not None else Store()), style="italic")
    lines: list[RenderableType] = []
    if not h.procs.procs:
        lines.append(Text("no process holds GPU memory on this node", style="italic"))
    for p in hidden:
        line = Text("⚠ ", style=palette.get("warning", "yellow"))
        line.append(invisible_line(p.pid, p.gpu_index))
        if p.used_mib is not None:
            line.append(f" · {_size(p.used_mib * 2**20)} GPU memory", style="dim")
        lines.append(line)
    return Group(*lines)


def render_probes(store: Store, host: str, palette: dict[str, str]) -> RenderableType:
    """The bandwidth probes that ran on this node, newest first."""
    mine = [p for p in store.probes if host in (p.hosts or [p.host]) or p.host == host]
    title = Text("Bandwidth probes on this node", style="bold underline")
    if not mine:
        return Group(
            title,
            Text("none has run on this node (`verl-top probe nccl`)", style="dim"),
        )
    lines: list[RenderableType] = [title]
    for p in reversed(mine[-PROBES_SHOWN:]):
        line = Text()
        ok_style = palette.get("success", "green") if p.ok else palette.get("error", "red")
        line.append("ok  " if p.ok else "FAIL", style=f"bold {ok_style}")
        line.append(clean_text(f" {p.tool} {p.collective} {p.scope} · {p.nranks} ranks"))
        if p.hosts:
            line.append(
                f" · {clean_text(','.join(p.hosts[:4]))}{'…' if len(p.hosts) > 4 else ''}",
                style="dim",
            )
        if p.busbw_max_gbs is not None:
            line.append(" · busbw ")
            line.append(f"{p.busbw_max_gbs:.1f} GB/s", style="bold")
            if p.expected_gbs:
                share = 100.0 * p.busbw_max_gbs / p.expected_gbs
                style = palette.get("warning", "yellow") if share < 70 else ""
                line.append(f" = {share:.0f} % of {p.expected_gbs:.0f} expected", style=style)
        if p.link:
            line.append(f" ({clean_text(p.link)})", style="dim")
        if p.transport:
            line.append(f" · {clean_text(p.transport)}", style="dim")
        if p.error:
            line.append(f" · {clean_text(p.error)}", style=palette.get("error", "red"))
        lines.append(line)
    return Group(*lines)


def render_log(h: HostEntry, width: int) -> RenderableType:
    """The last lines of the node's followed logs (colour codes stripped, long lines cut)."""
    title = Text(f"Log tail (last {LOG_LINES} lines)", style="bold underline")
    if not h.log_tail:
        return Group(
            title,
            Text("no followed log on this node (--verl-log HOST:PATH, --nccl-log)", style="dim"),
        )
    tail = redact_lines(list(h.log_tail)[-LOG_LINES:])  # a screen may be shared: no secrets
    cut = max(20, width - 4)
    # clean_text: escapes and controls out (also when a line did not pass the trust boundary),
    # one screen line each, cut with "…".
    body = Text(
        "\n".join(clean_text(strip_ansi(raw).replace("\t", "  "), cut) for raw in tail),
        no_wrap=True,
    )
    return Group(title, body)


def plot_title(name: str, source: str, now: str, width: int) -> str:
    """A plot's title within a plot ``width`` wide (plotext shows nothing for a longer one): the
    metric, its source counter and the latest value; the source goes first, then the words
    around the value, and the value itself is never cut."""
    room = max(8, width - 6)  # the y axis labels take ~5 columns
    value = f" {now}" if now else ""
    for title in (
        f"{name} ({source}) · now{value}" if source and now else "",
        f"{name} ({source})" if source and not now else "",
        f"{name} · now{value}" if now else name,
        f"{name}{value}",
    ):
        if title and len(title) <= room:
            return title
    return name[: max(1, room - len(value) - 1)] + "…" + value


PLOT_FRAME = 9  # columns of a plot that are not its drawing area: y labels, ticks, borders


def fit_note(note: str, width: int) -> str:
    """A note shown inside a plot ``width`` columns wide, cut with "…" to its drawing area."""
    room = max(3, width - PLOT_FRAME) if width > 0 else len(note)
    return note if len(note) <= room else note[: room - 1].rstrip() + "…"


class MetricPlot(PlotextPlot):
    """One metric's history (0-100 %) over the window: a line per GPU, or one GPU's line."""

    DEFAULT_CSS = """
    MetricPlot { height: 12; width: 1fr; }
    """

    def __init__(self, metric: str, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.metric = metric
        self.title_text = title
        self.builds = 0  # for tests and benchmarks

    def show(
        self,
        title: str,
        lines: list[tuple[str, list[float], list[float], tuple[int, int, int]]],
        window_s: float,
        note: str = "",
    ) -> None:
        """Replace the plotted lines: (label, xs, ys, colour) each, x in seconds before now."""
        plt = self.plt
        plt.clear_data()
        plt.title(title)
        plt.ylim(0, 100)
        plt.xlim(-window_s, 0)
        plt.yticks([0, 50, 100])
        for _label, xs, ys, colour in lines:
            if xs:
                plt.plot(xs, ys, color=colour, marker="braille")
        if note or not any(xs for _, xs, _, _ in lines):
            # Left-aligned from the plot's left edge: centred on a point, a note wider than
            # its half of the plot ran under the y axis ("o GPM on this node").
            label = fit_note(note or "no data", self.size.width)
            plt.text(label, x=-window_s, y=50, alignment="left")
        self.builds += 1
        self.refresh()


class NodeScreen(Screen):
    """One node in depth. The app refreshes it on its timer while it is the active screen."""

    DEFAULT_CSS = """
    NodeScreen { background: $surface; }
    #node-title {
        dock: top; height: 1; background: $primary; color: $foreground; text-style: bold;
    }
    #node-scroll { padding: 0 1; }
    #node-plots { grid-size: 3; grid-gutter: 1 1; grid-rows: 12; height: auto; }
    #node-host { height: 12; }
    .node-block { height: auto; margin-top: 1; }
    #node-info, #node-select { margin-top: 0; }
    #node-procs { height: auto; max-height: 20; }
    """

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("left", "select_gpu(-1)", "Prev GPU", key_display="←", priority=True),
        Binding("right", "select_gpu(1)", "Next GPU", key_display="→", priority=True),
        Binding("t", "stacks", "Stacks (py-spy)"),
    ]

    def __init__(self, store: Store, host: str, gpu: int | None = None) -> None:
        super().__init__()
        self.store = store
        self.host = host
        self.selected: int | None = gpu  # None: all GPUs, one line each
        self._seen_version = -1
        self._plot_stamp: tuple[Any, ...] = ()
        self.proc_sync: TableSync | None = None
        self.refresh_count = 0

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static("", id="node-title")
        with VerticalScroll(id="node-scroll"):
            yield Static("", id="node-info", classes="node-block")
            yield Static("", id="node-select", classes="node-block")
            with Grid(id="node-plots"):
                for metric, title in METRICS:
                    yield MetricPlot(metric, title, id=f"plot-{metric}")
                yield Static("", id="node-host")
            yield Static(
                Text(
                    "Processes of the job (GPU processes, then Ray actors)", style="bold underline"
                ),
                classes="node-block",
            )
            yield DataTable(id="node-procs", cursor_type="row", zebra_stripes=True)
            yield Static("", id="node-hidden", classes="node-block")
            yield Static("", id="node-probes", classes="node-block")
            yield Static("", id="node-log", classes="node-block")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#node-procs", DataTable)
        self.proc_sync = TableSync(table, PROC_COLUMNS, id_columns=1)
        self.refresh_screen(self.store, None, force=True)

    def on_resize(self) -> None:
        """A new plot size needs new buckets: redraw at the next refresh."""
        self._plot_stamp = ()
        self.call_after_refresh(self.refresh_screen, self.store, None, True)

    # -- helpers ---------------------------------------------------------------------------

    def palette(self) -> dict[str, str]:
        """Theme colours for Rich text (the app's palette)."""
        return app_palette(self)

    def entry(self) -> HostEntry | None:
        """The host's store entry (None if it vanished)."""
        return self.store.hosts.get(self.host)

    def action_select_gpu(self, delta: int) -> None:
        """← / →: previous / next GPU; past either end: all GPUs."""
        h = self.entry()
        if h is None or not h.gpus:
            return
        choices: list[int | None] = [None, *sorted(h.gpus)]
        i = choices.index(self.selected) if self.selected in choices else 0
        self.selected = choices[(i + delta) % len(choices)]
        self.refresh_screen(self.store, None, force=True)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a process row opens that process's screen."""
        if event.data_table.id != "node-procs":
            return
        event.stop()
        pid = process_row_pid(str(event.row_key.value or ""))
        app = monitor_app(self)
        if pid is not None and app is not None:
            app.open_process(self.host, pid)

    def action_stacks(self) -> None:
        """t: the Python stacks of the job's processes on this node (py-spy, read-only; each
        process is paused for the moment it is read)."""
        from verl_top.ui.stacks_screen import StacksScreen

        app = monitor_app(self)
        sources = list(app.inputs.sources) if app is not None else []
        self.app.push_screen(StacksScreen(self.store, sources, self.host))

    # -- refresh ---------------------------------------------------------------------------

    def refresh_screen(
        self, store: Store, assessment: Assessment | None, force: bool = False
    ) -> None:
        """Redraw from the store when it changed (or ``force``)."""
        # proc_sync is set by on_mount: ``is_mounted`` is still False while Mount is handled,
        # so testing it left the screen blank until the next tick or resize.
        if self.proc_sync is None or (store.version == self._seen_version and not force):
            return
        self._seen_version = store.version
        self.store = store
        h = self.entry()
        palette = self.palette()
        try:
            title = self.query_one("#node-title", Static)
        except NoMatches:  # a timer tick between pushing the screen and composing it
            self._seen_version = -1
            return
        if h is None:
            title.update(
                Text(f" Node {clean_text(self.host)}: not known to this session (Esc back)")
            )
            return
        self.refresh_count += 1
        with self.app.batch_update():
            title.update(self._title(h, palette))
            # A node without GPUs: no empty plots or GPU selector; the host block stays.
            for plot in self.query(MetricPlot):
                plot.display = bool(h.gpus)
            self.query_one("#node-select").display = bool(h.gpus)
            self.query_one("#node-info", Static).update(render_info(store, h, palette))
            self._update_plots(store, h, palette)
            block = self.query_one("#node-host", Static)
            block.update(render_host(store, h, palette, block.content_region.width))
            rows, hidden = process_rows(h, store.ray_actors)
            if self.proc_sync is not None:
                avail = self.query_one("#node-scroll").scrollable_content_region.width - 4
                self.proc_sync.fit(avail if avail > 10 else 76, rows)
                self.proc_sync.sync(rows)
            self.query_one("#node-hidden", Static).update(render_hidden(h, hidden, palette, store))
            self.query_one("#node-probes", Static).update(render_probes(store, h.name, palette))
            width = self.size.width or 160
            self.query_one("#node-log", Static).update(render_log(h, width))

    def _title(self, h: HostEntry, palette: dict[str, str]) -> Text:
        live = h.state not in DEAD_STATES
        text = Text(" Node ", style="bold")
        text.append(clean_text(h.name), style="bold")
        text.append(
            f" · {clean_text(h.state)}", style="" if live else f"bold {palette.get('error', 'red')}"
        )
        text.append(f" · {len(h.gpus)} GPUs", style="")
        procs = 0 if h.procs is None else len(h.procs.procs)
        text.append(f" · {procs} GPU processes", style="")
        text.append("   Esc back · ←/→ GPU · s snapshot", style="dim")
        return text

    def _update_plots(self, store: Store, h: HostEntry, palette: dict[str, str]) -> None:
        plots = list(self.query(MetricPlot))
        width = max((p.size.width for p in plots), default=0) or 50
        indices = sorted(h.gpus)
        if self.selected is not None and self.selected not in h.gpus:
            self.selected = None
        shown = [self.selected] if self.selected is not None else indices
        stamp = (
            tuple(shown),
            width,
            store.limits.window_s,
            tuple(h.gpus[i].history.last_time() for i in shown),
            tuple(len(h.gpus[i].history) for i in shown),
        )
        self._update_selector(h, palette)
        if stamp == self._plot_stamp:
            return
        self._plot_stamp = stamp
        end = store.now
        window = store.limits.window_s
        since = end - window
        buckets = max(10, width - 8)  # the y-axis labels take ~6 columns
        source = activity_source(h)
        xs_all = bucket_x(since, end, buckets)
        colours = {k: rgb(palette.get(k, v)) for k, v in FALLBACK_COLOURS.items()}
        for plot in plots:
            per_gpu = []
            for i in shown:
                ts, vs = metric_series(h, h.gpus[i], plot.metric, since)
                per_gpu.append(bucket_means(ts, vs, since, end, buckets))
            lines: list[tuple[str, list[float], list[float], tuple[int, int, int]]] = []
            if self.selected is not None:
                b = per_gpu[0]
                xs = [x for x, y in zip(xs_all, b, strict=True) if y is not None]
                ys = [y for y in b if y is not None]
                lines.append((f"GPU{self.selected}", xs, ys, colours["success"]))
            else:
                env = envelope(per_gpu, xs_all)
                lines = [(name, *env[name], colours[key]) for name, key in ENVELOPE]
            now_vals = [
                ys[-1] for name, _, ys, _ in lines if ys and name != "min" and name != "max"
            ]
            now = (
                f"{now_vals[0]:.0f}" + (" mean" if self.selected is None else "")
                if now_vals
                else ""
            )
            source_name = source if plot.metric == "activity" else ""
            title = plot_title(plot.title_text, source_name, now, plot.size.width or width)
            note = ""
            if plot.metric in ("tensor", "dram") and not any(xs for _, xs, _, _ in lines):
                note = "no GPM on this node"
            plot.show(title, lines, window, note)

    def _update_selector(self, h: HostEntry, palette: dict[str, str]) -> None:
        text = Text("GPU ", style="bold")
        text.append("◀ ", style="dim")
        if self.selected is None:
            text.append(f"all {len(h.gpus)}", style="bold reverse")
            text.append(" ▶  ", style="dim")
            for name, key in ENVELOPE[::-1]:
                text.append("━━ ", style=palette.get(key, FALLBACK_COLOURS[key]))
                text.append(f"{name}  ")
            text.append("across the node's GPUs (→ picks one GPU)", style="dim")
        else:
            g = h.gpus[self.selected]
            text.append(f"GPU{self.selected}", style="bold reverse")
            text.append(" ▶  ", style="dim")
            act = mean(g.history.recent_values("activity", self.store.window_start()))
            text.append("mean activity over the window ", style="dim")
            text.append(fmt_num(act, "{:.0f}", " %"), style=f"bold {activity_style(act, palette)}")
        text.append("    x: seconds before now · y: 0-100 %", style="dim")
        self.query_one("#node-select", Static).update(text)
