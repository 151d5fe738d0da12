"""Pane 4 — Parallelism & mapping: are GPUs used evenly and placed well?

After the step's findings: a nodes × GPUs map (one row per node, one cell per GPU) coloured by
mean activity over the window, each cell carrying the role letter of the GPU's main process
(``Enter`` on a cell opens that node); the parallel sizes from the job's config against the GPUs
seen; per-role spread of activity and memory across the role's GPUs; stragglers (GPUs and nodes
below 0.6× the cluster mean); and the GPU interconnect topology when a source collected it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from verl_top.assessment import Assessment
from verl_top.model import GpuProcess
from verl_top.nccl.expected import rdma_ports
from verl_top.nccl.topo import slow_tp_groups, topology_marks
from verl_top.roles import process_map
from verl_top.store import Store, mean
from verl_top.ui.panes.base import Pane
from verl_top.ui.widgets import (
    DASH,
    DEAD_STATES,
    REQUIRED,
    Column,
    TableSync,
    activity_style,
    add_plain_row,
    ellipsis_cell,
    fmt_num,
    gpu_total,
)
from verl_top.untrusted import clean_text

ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
PARALLEL_KEYS = (
    ("trainer.nnodes", "nodes"),
    ("trainer.n_gpus_per_node", "GPUs per node"),
    (ROLLOUT_TP, "rollout TP"),
    ("actor_rollout_ref.rollout.data_parallel_size", "rollout DP"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "actor TP (Megatron)"),
    ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size", "actor PP (Megatron)"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "Ulysses SP"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", "FSDP size"),
)
ROLE_LETTERS = {
    "trainer": "T",
    "rollout": "R",
    "driver": "D",
    "agent_loop": "A",
    "reward": "W",
    "other": "O",
}
STRAGGLER_RATIO = 0.6  # same as the diagnosis' node_ratio threshold (map.imbalance)
STRAGGLERS_SHOWN = 12
TOPOLOGY_PATTERNS_SHOWN = 2
TOPOLOGY_HOSTS_SHOWN = 8  # inventory lines in pane 4 (the snapshot has all)
CELL_WIDTH = 6


@dataclass
class GpuStat:
    """One GPU's window means and the roles of its processes (main role first)."""

    host: str
    index: int
    activity: float | None
    memory: float | None  # % of total
    roles: list[str] = field(default_factory=list)
    live: bool = True

    @property
    def name(self) -> str:
        return f"{self.host}:gpu{self.index}"


def gpu_roles(procs: Iterable[GpuProcess]) -> dict[int, list[str]]:
    """Per GPU, the roles of its processes, the one holding most GPU memory first."""
    by_gpu: dict[int, list[GpuProcess]] = {}
    for p in procs:
        by_gpu.setdefault(p.gpu_index, []).append(p)
    out: dict[int, list[str]] = {}
    for index, plist in by_gpu.items():
        plist.sort(key=lambda p: -(p.used_mib or 0.0))
        roles: list[str] = []
        for p in plist:
            role = p.role or ("hidden" if not p.visible else "other")
            if role not in roles:
                roles.append(role)
        out[index] = roles
    return out


def gpu_stats(store: Store) -> list[GpuStat]:
    """Window means of activity and memory % of every GPU, with its processes' roles."""
    since = store.window_start()
    out: list[GpuStat] = []
    for h in store.hosts.values():
        roles = gpu_roles(h.procs.procs) if h.procs is not None else {}
        live = h.state not in DEAD_STATES
        for index in sorted(h.gpus):
            g = h.gpus[index]
            act = mean(g.history.recent_values("activity", since))
            used = mean(g.history.recent_values("mem_used_mib", since))
            total = gpu_total(h, g, "mem_total_mib")
            mem = 100.0 * used / total if used is not None and total else None
            out.append(GpuStat(h.name, index, act, mem, roles.get(index, []), live))
    return out


def role_letter(roles: list[str]) -> str:
    """The map's letter for a GPU: its main process's role, ``-`` for none, ``+`` if shared."""
    if not roles:
        return "- "
    letter = ROLE_LETTERS.get(roles[0], "?")
    return letter + ("+" if len(roles) > 1 else " ")


def map_rows(
    store: Store, stats: list[GpuStat], width: int, palette: dict[str, str], keep: Any
) -> list[tuple[str, tuple[Any, ...]]]:
    """DataTable rows of the map: node, one cell per GPU, mean, spread, state."""
    by_host: dict[str, dict[int, GpuStat]] = {}
    for s in stats:
        by_host.setdefault(s.host, {})[s.index] = s
    rows: list[tuple[str, tuple[Any, ...]]] = []
    muted = palette.get("muted", "grey50")
    for h in store.hosts.values():
        mine = by_host.get(h.name, {})
        if not keep(h.name, list(mine)):
            continue
        live = h.state not in DEAD_STATES
        cells: list[Any] = [ellipsis_cell(Text(clean_text(h.name), style="" if live else muted))]
        acts = []
        for i in range(width):
            s = mine.get(i)
            if s is None:
                cells.append("")
                continue
            if s.activity is not None:
                acts.append(s.activity)
            style = activity_style(s.activity, palette) if live else muted
            value = DASH if s.activity is None else f"{s.activity:.0f}"
            cells.append(Text(f"{role_letter(s.roles)}{value:>3}", style=style))
        node_mean = mean(acts)
        spread = max(acts) - min(acts) if acts else None
        cells.append(Text(fmt_num(node_mean).rjust(4), style=activity_style(node_mean, palette)))
        cells.append(fmt_num(spread).rjust(6))
        state_style = "dim" if h.state == "up" else f"bold {palette.get('error', 'red')}"
        state = clean_text(h.state if live else f"{h.state} (last values)")
        cells.append(ellipsis_cell(Text(state, style=state_style)))
        rows.append((h.name, tuple(cells)))
    return rows


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(float(str(value)))
    except ValueError:
        return None


def parallel_block(store: Store, palette: dict[str, str]) -> RenderableType:
    """Parallel sizes from the config against the GPUs seen, with mismatch notes."""
    cfg = store.config
    warn = palette.get("warning", "yellow")
    seen = store.gpu_count()
    text = Text()
    values = {key: cfg.get(key) for key, _ in PARALLEL_KEYS if cfg.get(key) is not None}
    nnodes = _int(values.get("trainer.nnodes"))
    per_node = _int(values.get("trainer.n_gpus_per_node"))
    text.append("GPUs seen: ", style="dim")
    text.append(f"{seen} on {len(store.hosts)} nodes", style="bold")
    if per_node:
        want = per_node * (nnodes or 1)
        text.append(" · config: ", style="dim")
        text.append(f"{nnodes or 1} nodes × {per_node} GPUs = {want} GPUs", style="bold")
        if want == seen:
            text.append("  ✓ matches", style=palette.get("success", "green"))
        else:
            text.append(
                f"\n⚠ mismatch: the config asks for {want} GPUs, {seen} are seen "
                "(trainer.nnodes × trainer.n_gpus_per_node vs the nodes monitored)",
                style=f"bold {warn}",
            )
    labelled = [(label, values[key]) for key, label in PARALLEL_KEYS if key in values]
    if labelled:
        text.append("\n")
        for i, (label, value) in enumerate(labelled):
            text.append(("" if i == 0 else " · ") + f"{label}: ", style="dim")
            text.append(str(value), style="bold")
    tp = _int(values.get(ROLLOUT_TP))
    total = seen or ((per_node or 0) * (nnodes or 1))
    if tp and tp > 0 and total:
        text.append(f"\nrollout: TP {tp} → {total // tp} engine(s) over {total} GPUs", style="")
        if per_node and per_node % tp and tp <= per_node:
            text.append(
                f"\n⚠ rollout TP {tp} does not divide {per_node} GPUs per node: an engine "
                "spans two nodes",
                style=f"bold {warn}",
            )
        elif per_node and tp > per_node:
            text.append(
                f"\n⚠ rollout TP {tp} is larger than a node ({per_node} GPUs): TP crosses the "
                "network",
                style=f"bold {warn}",
            )
    mtp = _int(values.get("actor_rollout_ref.actor.megatron.tensor_model_parallel_size"))
    mpp = _int(values.get("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"))
    if (mtp or mpp) and total:
        model = (mtp or 1) * (mpp or 1)
        if total % model:
            text.append(
                f"\n⚠ actor TP×PP = {model} does not divide {total} GPUs", style=f"bold {warn}"
            )
        else:
            text.append(f"\nactor: TP×PP = {model} → data parallel {total // model}")
    missing = [key for key, _ in PARALLEL_KEYS if key not in values]
    if missing:
        text.append("\nnot in the config: " + ", ".join(missing), style="dim")
    if not cfg:
        text.append(
            "\nno config: give --verl-config FILE or a driver log that printed the config",
            style="italic",
        )
    return text


def _ranges(ranks: Iterable[int]) -> str:
    """``0-7,16`` from a set of ranks."""
    values = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for r in values:
        if start is None:
            start = prev = r
        elif r == prev + 1:  # type: ignore[operator]
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts) or DASH


def _spread(values: list[float]) -> str:
    if not values:
        return DASH
    return f"{min(values):.0f} / {sum(values) / len(values):.0f} / {max(values):.0f}"


def _no_roles(store: Store) -> str:
    """Why roles are unknown: no process list, for this session's reason."""
    from verl_top.origin import PROMETHEUS, no_processes_text

    if store.origin == PROMETHEUS:
        return f"roles unknown: {no_processes_text(store)}"
    return "no GPU process lists yet: roles unknown (the node agents report them)"


def roles_block(store: Store, stats: list[GpuStat]) -> RenderableType:
    """Per role: GPUs, nodes, ranks, and activity / memory min / mean / max over its GPUs."""
    if not any(h.procs is not None for h in store.hosts.values()):
        acts = [s.activity for s in stats if s.activity is not None]
        text = Text(
            f"{_no_roles(store)}. All GPUs: activity min/mean/max {_spread(acts)} %",
            style="italic",
        )
        return text
    ranks: dict[str, set[int]] = {}
    names: dict[str, set[str]] = {}  # coarse role -> verl's names of its processes
    for h in store.hosts.values():
        for p in h.procs.procs if h.procs is not None else []:
            if p.rank is not None and p.role:
                ranks.setdefault(p.role, set()).add(p.rank)
            if p.role and p.verl_role:
                names.setdefault(p.role, set()).add(p.verl_role)
    groups: dict[str, list[GpuStat]] = {}
    for s in stats:
        for role in s.roles or ["(no process)"]:
            groups.setdefault(role, []).append(s)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (
        ("role", "left"),
        ("GPUs", "right"),
        ("nodes", "right"),
        ("ranks", "left"),
        ("activity % min/mean/max", "right"),
        ("memory % min/mean/max", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for role in sorted(groups, key=lambda r: (r.startswith("("), r)):
        members = groups[role]
        letter = ROLE_LETTERS.get(role, "-" if role.startswith("(") else "?")
        verl = ", ".join(sorted(names.get(role, ())))
        add_plain_row(
            table,
            f"{letter} {role}" + (f" ({verl})" if verl and verl != role else ""),
            str(len(members)),
            str(len({s.host for s in members})),
            _ranges(ranks.get(role, ())),
            _spread([s.activity for s in members if s.activity is not None]),
            _spread([s.memory for s in members if s.memory is not None]),
        )
    return table


PROCESS_ROWS = 64  # processes listed on pane 4 (the node screen lists all of a node's)
PROCESS_COLUMNS: tuple[Column, ...] = (
    Column("role", "verl role · method", 12, REQUIRED, "text", 48),
    Column("state", "state", 5, 4),
    Column("rank", "rank", 4, 5),
    Column("gpus", "GPUs", 4, 6, "text", 24),
    Column("gmem", "GPU mem", 7, 7),
    Column("node", "node", 6, REQUIRED, "text", 32),
    Column("pid", "pid", 5, REQUIRED),
)


def process_rows(store: Store) -> list[tuple[str, tuple[Any, ...]]]:
    """Rows of pane 4's process table: the job's processes as verl names them (GPU processes,
    job processes without a GPU, Ray actors), keyed ``host<TAB>pid`` (Enter opens one)."""
    procs = {h.name: h.procs for h in store.hosts.values()}
    rows: list[tuple[str, tuple[Any, ...]]] = []
    for k, m in enumerate(process_map(procs, store.ray_actors)[:PROCESS_ROWS]):
        key = f"{m.host}\t{m.pid}" if m.pid is not None else f"{m.host}\t-{k}"
        rows.append(
            (
                key,
                (
                    Text(m.label),
                    m.state or "-",
                    "-" if m.rank is None else str(m.rank),
                    ",".join(str(g) for g in m.gpus) or "-",
                    "-" if m.gpu_mem_mib is None else f"{m.gpu_mem_mib / 1024:.1f} GiB",
                    Text(m.host),
                    "-" if m.pid is None else str(m.pid),
                ),
            )
        )
    return rows


def process_row_target(key: str) -> tuple[str, int] | None:
    """(host, pid) of a process-table row (None for a Ray actor without a pid)."""
    host, _, pid = key.rpartition("\t")
    return (host, int(pid)) if host and pid.isdigit() else None


def straggler_block(stats: list[GpuStat], palette: dict[str, str]) -> RenderableType:
    """GPUs and nodes whose mean activity is below 0.6× the cluster mean over the window."""
    live = [s for s in stats if s.live and s.activity is not None]
    if len(live) < 2:
        return Text("needs activity from ≥ 2 live GPUs", style="dim")
    cluster = sum(s.activity for s in live) / len(live)  # type: ignore[misc]
    cut = STRAGGLER_RATIO * cluster
    text = Text()
    text.append(f"cluster mean {cluster:.0f} % · straggler below {cut:.0f} % ", style="dim")
    text.append(f"({STRAGGLER_RATIO:g}× the mean)", style="dim")
    if cluster <= 0:
        text.append("\nevery GPU idle over the window", style="italic")
        return text
    nodes: dict[str, list[float]] = {}
    for s in live:
        nodes.setdefault(s.host, []).append(s.activity)  # type: ignore[arg-type]
    warn = palette.get("warning", "yellow")
    slow_nodes = sorted(
        ((sum(v) / len(v), host) for host, v in nodes.items() if sum(v) / len(v) < cut),
    )
    if len(nodes) >= 2:
        if slow_nodes:
            for value, host in slow_nodes[:STRAGGLERS_SHOWN]:
                text.append("\n⚠ node ", style=warn)
                text.append(clean_text(host), style=f"bold {warn}")
                text.append(f" mean {value:.0f} % = {value / cluster:.2f}× the cluster mean")
        else:
            text.append("\nno straggler node", style=palette.get("success", "green"))
    slow_gpus = sorted(
        (s for s in live if s.activity < cut and s.host not in {h for _, h in slow_nodes}),  # type: ignore[operator]
        key=lambda s: s.activity,  # type: ignore[arg-type, return-value]
    )
    if slow_gpus:
        for s in slow_gpus[:STRAGGLERS_SHOWN]:
            text.append("\n⚠ GPU ", style=warn)
            text.append(clean_text(s.name), style=f"bold {warn}")
            text.append(
                f" {s.activity:.0f} % = {s.activity / cluster:.2f}× the cluster mean"  # type: ignore[operator]
                + ("" if s.roles else " (no process on it)")
            )
        if len(slow_gpus) > STRAGGLERS_SHOWN:
            text.append(f"\n… {len(slow_gpus) - STRAGGLERS_SHOWN} more GPUs", style="dim")
    elif not slow_nodes:
        text.append(" · no straggler GPU", style=palette.get("success", "green"))
    return text


def _gpu_links(matrix: Any) -> dict[tuple[int, int], str]:
    """A host's GPU link matrix as ``{(i, j): link}`` (also from a parsed ``Topology``)."""
    if isinstance(matrix, dict):
        return {(int(i), int(j)): str(v) for (i, j), v in matrix.items()}
    links = getattr(matrix, "links", None)
    out: dict[tuple[int, int], str] = {}
    if isinstance(links, dict):
        for (a, b), v in links.items():
            if str(a).startswith("GPU") and str(b).startswith("GPU"):
                out[(int(str(a)[3:]), int(str(b)[3:]))] = str(v)
    return out


def inventory_lines(store: Store, palette: dict[str, str]) -> Text | None:
    """Per host: where the topology came from, NVLink state, RDMA NICs, and marked GPUs."""
    records = store.node_topology
    if not isinstance(records, dict) or not records:
        return None
    warn = palette.get("warning", "yellow")
    text = Text()
    for k, (host, rec) in enumerate(sorted(records.items())):
        if k >= TOPOLOGY_HOSTS_SHOWN:
            text.append(f"\n… {len(records) - k} more node(s)", style="dim")
            break
        if k:
            text.append("\n")
        text.append(f"{host}", style="bold")
        text.append(f" · {len(rec.gpus)} GPU(s) · source {rec.source or 'none'}")
        ups = [g.nvlinks_up for g in rec.gpus if g.nvlinks_up is not None]
        if ups:
            ver = max((g.nvlink_version or 0) for g in rec.gpus)
            text.append(f" · NVLink{ver or ''} {min(ups)}-{max(ups)} links up")
        elif any(g.nvlink_error for g in rec.gpus):
            text.append(f" · NVLink: {rec.gpus[0].nvlink_error}", style="dim")
        rdma = rdma_ports(rec)
        if rdma:
            rates = sorted({r for _, r in rdma})
            text.append(f" · RDMA {len(rdma)}× " + "/".join(f"{r:g}" for r in rates) + " Gb/s")
            rels: dict[str, int] = {}
            for g in rec.gpus:
                if g.nic_link:
                    rels[g.nic_link] = rels.get(g.nic_link, 0) + 1
            if rels:
                text.append(" · GPU→NIC " + ", ".join(f"{n}× {k}" for k, n in sorted(rels.items())))
        else:
            text.append(" · no active IB/RoCE port", style="dim")
        if rec.error:
            text.append(f"\n  {rec.error}", style="dim")
        for mark in topology_marks(rec)[:8]:
            text.append(f"\n  ⚠ GPU{mark.gpu}: {mark.text}", style=warn)
    return text


def topology_block(store: Store, palette: dict[str, str]) -> RenderableType:
    """Each node's inventory line, the GPU link matrix per distinct pattern, and whether each
    rollout TP group is on NVLink."""
    topo = store.topology
    inv = inventory_lines(store, palette)
    if not isinstance(topo, dict) or not topo:
        if inv is not None:
            return Group(inv, Text("GPU link matrix: no GPU pairs reported", style="dim"))
        return Text("topology: not collected (nvidia-smi topo -m)", style="dim")
    patterns: dict[tuple[tuple[tuple[int, int], str], ...], list[str]] = {}
    for host, matrix in topo.items():
        links = _gpu_links(matrix)
        patterns.setdefault(tuple(sorted(links.items())), []).append(str(host))
    tp = _int(store.config.get(ROLLOUT_TP)) or 0
    parts: list[RenderableType] = []
    warn = palette.get("warning", "yellow")
    for k, (pattern, hosts) in enumerate(patterns.items()):
        links = dict(pattern)
        n = 1 + max((max(i, j) for i, j in links), default=-1)
        head = Text()
        names = ", ".join(hosts[:6]) + (f" … (+{len(hosts) - 6})" if len(hosts) > 6 else "")
        head.append(clean_text(f"{len(hosts)} node(s): {names}"), style="bold")
        kinds: dict[str, int] = {}
        for (i, j), link in links.items():
            if i < j:
                kinds[link] = kinds.get(link, 0) + 1
        pairs = ", ".join(f"{v}× {kk}" for kk, v in sorted(kinds.items()))
        head.append(" · GPU pairs: " + clean_text(pairs))
        if tp > 1 and n:
            bad = [
                f"GPUs {start}-{start + tp - 1}: {'/'.join(slow)}"
                for start, slow in slow_tp_groups(links, n, tp)
            ]
            if bad:
                head.append(f"\n⚠ rollout TP {tp} groups off NVLink: " + "; ".join(bad), style=warn)
            else:
                head.append(f"\nrollout TP {tp} groups are NVLink-connected", style="dim")
        parts.append(head)
        if k < TOPOLOGY_PATTERNS_SHOWN and 0 < n <= 16:
            grid = Table(box=None, pad_edge=False, header_style="bold")
            grid.add_column("")
            for j in range(n):
                grid.add_column(f"GPU{j}", justify="center")
            for i in range(n):
                row = [f"GPU{i}"]
                for j in range(n):
                    row.append("X" if i == j else links.get((i, j)) or links.get((j, i)) or DASH)
                add_plain_row(grid, *row)
            parts.append(grid)
    if len(patterns) > TOPOLOGY_PATTERNS_SHOWN:
        parts.append(Text(f"{len(patterns)} different matrices across nodes", style=warn))
    if inv is not None:
        parts.insert(0, inv)
    return Group(*parts)


def _host_keep(app: Any) -> Any:
    """The app's host filter (key /) as a predicate (host, gpu indices) -> bool."""
    text = str(getattr(app, "host_filter", "") or "")
    if not text.strip():
        return lambda host, gpus: True
    try:
        from verl_top.ui.filter_bar import host_matches
    except ImportError:  # no filter bar: plain substring of the host name
        needle = text.strip().lower()
        return lambda host, gpus: needle in host.lower()
    return lambda host, gpus: host_matches(text, host, gpus)


class MappingPane(Pane):
    """Pane 4: nodes × GPUs map with roles, parallel sizes, role spread, stragglers, topology."""

    STEP = 4

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.map_sync: TableSync | None = None
        self._map_width = -1
        self._map_states: tuple[str, ...] = ()
        self.stats: list[GpuStat] = []
        self.procs_sync: TableSync | None = None
        self._procs_stamp: tuple[Any, ...] = ()

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="map-legend", classes="status")
        yield DataTable(id="map-grid", cursor_type="cell", zebra_stripes=False, classes="hosts")
        yield Static("", id="map-procs-title", classes="body")
        yield DataTable(id="map-procs", cursor_type="row", zebra_stripes=True, classes="hosts")
        yield Static("", id="map-body", classes="body")

    def on_mount(self) -> None:
        self.procs_sync = TableSync(self.query_one("#map-procs", DataTable), PROCESS_COLUMNS)

    def _reset_grid(self, width: int) -> None:
        """New GPU columns (a node with more GPUs appeared) or a host changed state."""
        table = self.query_one("#map-grid", DataTable)
        table.clear(columns=True)
        columns = [
            Column("node", "node", 6, REQUIRED, "text", 32),
            *(Column(f"g{i}", str(i), CELL_WIDTH, REQUIRED) for i in range(width)),
            Column("mean", "mean", 4, 7),
            Column("spread", "spread", 6, 5),
            Column("state", "state", 8, 3, "flex", 30),
        ]
        self.map_sync = TableSync(table, columns)
        self._map_width = width

    def update_content(self, store: Store, assessment: Assessment) -> None:
        palette = self.palette()
        stats = gpu_stats(store)
        self.stats = stats
        width = max((len(h.gpus) and 1 + max(h.gpus) for h in store.hosts.values()), default=0)
        states = tuple(h.state for h in store.hosts.values())
        if width != self._map_width or states != self._map_states or self.map_sync is None:
            self._map_states = states
            self._reset_grid(width)
        assert self.map_sync is not None
        rows = map_rows(store, stats, width, palette, _host_keep(self.app))
        legend = Text("Map: ", style="bold")
        legend.append("mean activity % over the window, letter = role of the GPU's main process ")
        legend.append(
            "(T trainer · R rollout · D driver · A agent loop · W reward · O other · "
            "- none; + = more roles share the GPU)",
            style="dim",
        )
        legend.append(" · Enter: open the node", style="dim")
        with self.app.batch_update():
            self.query_one("#map-legend", Static).update(legend)
            avail = self.scrollable_content_region.width - 2
            self.map_sync.fit(avail if avail > 10 else 78, rows)
            self.map_sync.sync(rows)
            body = Group(
                Text("Parallel sizes", style="bold underline"),
                parallel_block(store, palette),
                Text(""),
                Text(
                    "Roles: spread across each role's GPUs (window means)", style="bold underline"
                ),
                roles_block(store, stats),
                Text(""),
                Text("Stragglers", style="bold underline"),
                straggler_block(stats, palette),
                Text(""),
                Text("GPU interconnect", style="bold underline"),
                topology_block(store, palette),
            )
            self.query_one("#map-body", Static).update(body)
            self._sync_processes(store)

    def _sync_processes(self, store: Store) -> None:
        """The process table (Enter opens a process), or why it is empty; rebuilt only when a
        process list or the Ray actors changed (lists come every 5th tick)."""
        stamp = (tuple(id(h.procs) for h in store.hosts.values()), id(store.ray_actors))
        if stamp == self._procs_stamp:
            return
        self._procs_stamp = stamp
        rows = process_rows(store)
        title = Text("Processes of the job", style="bold underline")
        if rows:
            title.append(
                "  Enter: open a process (command, environment, stack, signals)", style="dim"
            )
        else:
            title.append(
                "\nno process of the job seen yet (GPU process lists come from the node agents, "
                "Ray actors from --ray)",
                style="italic",
            )
        self.query_one("#map-procs-title", Static).update(title)
        table = self.query_one("#map-procs", DataTable)
        table.display = bool(rows)
        if self.procs_sync is not None and rows:
            avail = self.scrollable_content_region.width - 2
            self.procs_sync.fit(avail if avail > 10 else 78, rows)
            self.procs_sync.sync(rows)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a process row opens that process's screen."""
        if event.data_table.id != "map-procs":
            return
        event.stop()
        target = process_row_target(str(event.row_key.value or ""))
        opener = getattr(self.app, "open_process", None)
        if target is not None and callable(opener):
            opener(*target)

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        """Enter on a map cell opens that node (on that GPU when the cell is a GPU)."""
        if event.data_table.id != "map-grid":
            return
        event.stop()
        host = event.cell_key.row_key.value
        col = str(event.cell_key.column_key.value or "")
        gpu = int(col[1:]) if col.startswith("g") and col[1:].isdigit() else None
        opener = getattr(self.app, "open_node", None)
        if host and callable(opener):
            opener(host, gpu)
