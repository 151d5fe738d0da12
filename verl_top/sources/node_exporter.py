"""Host activity from node_exporter through Prometheus, joined to the DCGM hosts.

``--prometheus`` reads GPUs from dcgm-exporter; where the same Prometheus scrapes node_exporter
(``node_cpu_seconds_total``, ``node_memory_*``, ``node_network_*``, ``node_disk_*``), its
series become the same :class:`~verl_top.model.HostSample` records the SSH agent sends, counted
the agent's way (docs/protocol.md, ``host``): CPU busy = 1 - (idle + iowait) / all modes, memory
used = MemTotal - MemAvailable, network over every interface but ``lo``, disks over whole disks
only (no partitions, loop, ram, zram, device-mapper, md, CD or floppy devices). Rates are
``irate`` (the last two scrapes), as the agent's are the last interval's.

The per-core CPU series are most of what Prometheus reads (8 modes x cores x nodes: 65 000
series at 128 nodes of 64 cores), so the CPU queries read only the idle and iowait series: a
core's modes together advance one second per second (/proc/stat accounts every tick to one
mode), so all modes of a node advance by its core count, counted in the same query. And the
rate window follows node_exporter's scrape interval (three scrapes, ``scrape_window``): a 2 m
window at a 5 s scrape read 24 samples a series where irate uses 2.

Each query is aggregated ``by (instance)`` (one series per node, never one per core or
device; the idle and iowait time, 2 series per node, from which busy and iowait % are worked
out) and, inside, ``by (instance, job)`` so a node scraped by two jobs is not counted twice.
A node_exporter ``instance`` is joined to a DCGM host (docs/prometheus.md, "Host metrics"):
by ``node_uname_info``'s ``nodename``, by its scrape address named as the host (``instance``
relabelled to the node name, as kube-prometheus does), by short names (``gpu01`` and
``gpu01.cluster``), else by the scrape address the DCGM series of that host came from. A name
or address that fits two hosts joins neither: nothing is guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from verl_top.model import HostSample
from verl_top.protocol import in_range

# irate needs two scrapes in the window: 2 minutes covers scrape intervals up to a minute (the
# window until the scrape interval is known, scrape_window).
RATE_WINDOW = "2m"
SCRAPE_WINDOW_S = (15, 600)  # the adaptive window's bounds
IDLE_MODES = 'mode=~"idle|iowait"'
IDLE_MODE = 'mode="idle"'
NET_DEVICES = 'device!="lo"'
# Whole disks only, as the agent's /sys/block list less its skipped prefixes.
DISK_DEVICES = (
    'device!~"(loop|ram|zram|dm-|md|sr|fd).*'
    '|((h|s|v|xv)d[a-z]+|nvme[0-9]+n[0-9]+p|mmcblk[0-9]+p)[0-9]+"'
)
_BY = "instance, job"
INT_FIELDS = ("mem_used_bytes", "mem_total_bytes")
# One query answers the idle and iowait time per node (2 series a node) and one its cores:
# busy and iowait % are worked out here (cpu_columns).
CPU_MODES = "cpu_modes"
CPU_COUNT = "cpu_count"


class SeriesLike(Protocol):
    """What is read of one answered series (``prometheus.Series``)."""

    labels: dict[str, str]

    def last(self) -> float | None:
        """The newest value, None when absent."""
        ...


def _matchers(selector: str, *extra: str) -> str:
    body = ",".join(m for m in (*extra, selector) if m)
    return f"{{{body}}}" if body else ""


def node_queries(selector: str = "", window: str = RATE_WINDOW) -> dict[str, str]:
    """HostSample field -> PromQL answering one series per node_exporter ``instance`` (the
    CPU modes: one per instance and mode), rates over ``window``."""

    def irate(metric: str, by: str, *extra: str) -> str:
        return f"sum by ({by}) (irate({metric}{_matchers(selector, *extra)}[{window}]))"

    def per_node(expr: str) -> str:
        return f"max by (instance) ({expr})"

    cpu = "node_cpu_seconds_total"
    core = f"{_BY}, cpu"
    mem_total = f"node_memory_MemTotal_bytes{_matchers(selector)}"
    mem_avail = f"node_memory_MemAvailable_bytes{_matchers(selector)}"
    idle_cores = f"node_cpu_seconds_total{_matchers(selector, IDLE_MODE)}"
    out = {
        CPU_MODES: f"max by (instance, mode) ({irate(cpu, f'{_BY}, mode', IDLE_MODES)})",
        CPU_COUNT: per_node(f"count by ({_BY}) ({idle_cores})"),
        # a core's modes advance 1 s/s: its busy share is 1 - its idle and iowait rate
        "cpu_max_core_pct": per_node(f"100 * (1 - {irate(cpu, core, IDLE_MODES)})"),
        "mem_total_bytes": per_node(mem_total),
        "mem_used_bytes": per_node(f"{mem_total} - {mem_avail}"),
        "net_rx_bps": per_node(irate("node_network_receive_bytes_total", _BY, NET_DEVICES)),
        "net_tx_bps": per_node(irate("node_network_transmit_bytes_total", _BY, NET_DEVICES)),
        "disk_read_bps": per_node(irate("node_disk_read_bytes_total", _BY, DISK_DEVICES)),
        "disk_write_bps": per_node(irate("node_disk_written_bytes_total", _BY, DISK_DEVICES)),
    }
    for name in ("load1", "load5", "load15"):
        out[name] = per_node(f"node_{name}{_matchers(selector)}")
    return out


def node_info_query(selector: str = "") -> str:
    """One series per node_exporter ``instance``, with its ``nodename`` when the uname
    collector is on (its memory series name the instance otherwise)."""
    return (
        f"group by (instance, nodename) (node_uname_info{_matchers(selector)}) or "
        f"group by (instance) (node_memory_MemTotal_bytes{_matchers(selector)})"
    )


def scrape_query(selector: str = "") -> str:
    """The longest scrape interval (s) of the node_exporters, from the samples of 5 minutes
    (a target scraped for less than that reads longer: the window errs on the wide side)."""
    return f"max(300 / count_over_time(node_memory_MemTotal_bytes{_matchers(selector)}[5m]))"


def scrape_window(interval_s: float | None) -> str:
    """The irate window for a scrape interval: three scrapes, within SCRAPE_WINDOW_S."""
    if interval_s is None or interval_s != interval_s or interval_s <= 0:
        return RATE_WINDOW
    low, high = SCRAPE_WINDOW_S
    return f"{int(min(high, max(low, 3 * interval_s)) + 0.999)}s"


REESTIMATE_S = 300.0  # how often the scrape interval is asked again


@dataclass
class NodePlan:
    """Which node_exporter queries to ask and when: the rate window and the pace follow
    node_exporter's scrape interval (its values change no faster than it scrapes)."""

    selector: str = ""
    interval: float = 5.0  # s between the source's rounds
    scrape_s: float | None = None  # node_exporter's scrape interval, once known
    estimated_at: float = -math.inf  # monotonic time of the last estimate
    next_at: float = -math.inf  # monotonic time the next host queries are due
    queries: dict[str, str] = field(default_factory=dict)
    info: str = ""

    def __post_init__(self) -> None:
        self.queries = self.queries or node_queries(self.selector)
        self.info = self.info or node_info_query(self.selector)

    def due(self, now: float) -> dict[str, str] | None:
        """The queries to ask in the round starting at ``now`` (None: not yet due)."""
        if now < self.next_at:
            return None
        exprs = {"_ninfo": self.info, **self.queries}
        if now - self.estimated_at >= REESTIMATE_S:
            exprs["_nscrape"] = scrape_query(self.selector)
        self.next_at = now + max(0.0, (self.scrape_s or 0.0) - self.interval / 2)
        return exprs

    def learn(self, answers: Mapping[str, Sequence[SeriesLike]], now: float) -> None:
        """Take the scrape interval from an answer to ``scrape_query`` (``_nscrape``)."""
        if "_nscrape" not in answers:
            return
        self.estimated_at = now
        series = answers["_nscrape"]
        value = series[0].last() if series else None
        if value is not None and value > 0:
            self.scrape_s = value
            self.queries = node_queries(self.selector, scrape_window(value))


def address(instance: str) -> str:
    """A scrape ``instance`` without its port (``[::1]:9100`` -> ``::1``)."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def _short(name: str) -> str:
    return name.split(".", 1)[0] if not name.replace(".", "").isdigit() else name


class _Index:
    """A key -> host map where a key that names two hosts names none."""

    def __init__(self) -> None:
        self.hosts: dict[str, str | None] = {}

    def add(self, key: str, host: str) -> None:
        if key:
            self.hosts[key] = host if self.hosts.get(key, host) == host else None

    def get(self, key: str) -> str | None:
        return self.hosts.get(key) if key else None


def join_hosts(
    nodes: Iterable[Mapping[str, str]], gpu_hosts: Iterable[tuple[str, str]]
) -> dict[str, str]:
    """node_exporter ``instance`` -> DCGM host name, for the instances that fit one host.

    ``nodes``: label sets of the node info answer (``instance``, maybe ``nodename``);
    ``gpu_hosts``: (host name, scrape instance) of the DCGM series.
    """
    names, shorts, addrs = _Index(), _Index(), _Index()
    for host, instance in gpu_hosts:
        names.add(host.lower(), host)
        shorts.add(_short(host.lower()), host)
        addrs.add(address(instance).lower(), host)
    nodenames: dict[str, str] = {}
    for labels in nodes:
        instance = labels.get("instance", "")
        if instance and (labels.get("nodename") or instance not in nodenames):
            nodenames[instance] = labels.get("nodename", "").lower()
    out: dict[str, str] = {}
    taken: set[str] = set()
    for instance in sorted(nodenames):
        nodename, where = nodenames[instance], address(instance).lower()
        found = (
            names.get(nodename)
            or names.get(where)
            or shorts.get(_short(nodename))
            or shorts.get(_short(where))
            or addrs.get(where)
        )
        if found is not None and found not in taken:  # two exporters for one host: the first
            out[instance] = found
            taken.add(found)
    return out


def series_key(labels: Mapping[str, str]) -> Any:
    """What a node series is about: its ``instance``, and its ``mode`` for the CPU modes."""
    instance = labels.get("instance")
    if not instance:
        return None
    mode = labels.get("mode")
    return (instance, mode) if mode else instance


def instance_values(
    answers: Mapping[str, Sequence[SeriesLike]],
) -> dict[str, dict[str, float | None]]:
    """Per field, per ``instance``: the value of an instant answer (first series wins), with
    the CPU modes turned into busy and iowait %."""
    out: dict[str, dict[Any, float | None]] = {}
    for name, series in answers.items():
        col: dict[Any, float | None] = {}
        for s in series:
            key = series_key(s.labels)
            if key is not None and key not in col:
                col[key] = s.last()
        out[name] = col
    return cpu_columns(out)


def cpu_columns(columns: Mapping[str, Mapping[Any, float | None]]) -> dict[str, Any]:
    """``columns`` with the idle and iowait rates ((instance, mode) -> s/s) and the core
    counts replaced by ``cpu_pct`` (100 x (1 - (idle + iowait) / cores)) and ``iowait_pct``
    per instance: all modes of a node advance by its core count each second."""
    out = {name: col for name, col in columns.items() if name not in (CPU_MODES, CPU_COUNT)}
    modes: dict[str, dict[str, float]] = {}
    for key, value in columns.get(CPU_MODES, {}).items():
        if isinstance(key, tuple) and value is not None:
            modes.setdefault(key[0], {})[key[1]] = value
    cores = columns.get(CPU_COUNT, {})
    busy: dict[str, float | None] = {}
    iowait: dict[str, float | None] = {}
    for instance, rates in modes.items():
        count = cores.get(instance)
        if count and "idle" in rates:
            busy[instance] = 100.0 * (1.0 - (rates["idle"] + rates.get("iowait", 0.0)) / count)
            iowait[instance] = 100.0 * rates.get("iowait", 0.0) / count
    out["cpu_pct"], out["iowait_pct"] = busy, iowait
    return out


def host_sample(host: str, t: float, values: Mapping[str, float | None]) -> HostSample:
    """The HostSample of one node from its fields' values (the protocol's ranges applied)."""
    fields = {name: in_range(name, value) for name, value in values.items()}
    for name in INT_FIELDS:
        if fields.get(name) is not None:
            fields[name] = int(fields[name])
    return HostSample(host=host, t=t, **fields)


def host_samples(
    columns: Mapping[str, Mapping[str, float | None]],
    join: Mapping[str, str],
    t: float,
    sparse: bool = False,
) -> list[HostSample]:
    """A HostSample per joined instance; ``sparse``: only those with a value (history)."""
    out = []
    for instance, host in sorted(join.items()):
        values = {name: col.get(instance) for name, col in columns.items()}
        if sparse and all(v is None for v in values.values()):
            continue
        out.append(host_sample(host, t, values))
    return out
