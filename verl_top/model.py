"""Typed records: the one vocabulary every source, the store, the diagnosis and the UI speak.

Every record has a wire ``type`` tag (``TYPE``), the ``host`` it concerns and a time ``t`` in
seconds since the epoch, taken where the value was measured (the node's clock for agent data,
arrival time for log lines). ``protocol.py`` turns them into NDJSON lines and back.

Optional measurements are ``None`` when the device or node does not provide them: a missing
field means "not supported / not known", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

# Host states shown on host rows. Order is the severity order used for sorting.
HOST_STATES = (
    "up",
    "connecting",
    "stale",
    "no_gpu",
    "no_python",
    "down",
    "auth_failed",
    "hostkey_changed",
)

# Clock-event (throttle) reason bits from NVML (nvmlClocksEventReason*).
CLOCK_REASON_BITS: dict[int, str] = {
    0x1: "idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}
# Reasons that mean the GPU runs slower than it could (used by the gpu.throttle rule).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def clock_reason_names(mask: int | None) -> list[str]:
    """Names of the clock-event reason bits set in ``mask``."""
    if not mask:
        return []
    return [name for bit, name in CLOCK_REASON_BITS.items() if mask & bit]


@dataclass
class GpuInfo:
    """Static facts about one GPU, sent once in the hello."""

    index: int
    name: str = ""
    uuid: str = ""
    mem_total_mib: float | None = None
    bus_id: str = ""
    power_limit_w: float | None = None
    gpm: bool = False  # GPM metrics (Hopper+) supported
    # Kubernetes namespace/pod using the GPU (dcgm-exporter labels); None: not known (agents).
    workload: str | None = None


@dataclass
class Record:
    """Base of all records. Subclasses set ``TYPE``."""

    TYPE: ClassVar[str] = ""
    host: str = ""
    t: float = 0.0


@dataclass
class Hello(Record):
    """First line from an agent: who it is, what it sees and which backend it uses."""

    TYPE: ClassVar[str] = "hello"
    agent_version: str = ""
    python: str = ""
    backend: str = "none"  # pynvml | nvidia-smi | replay | none
    driver: str = ""
    nvml_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    cpu_count: int | None = None
    mem_total_bytes: int | None = None
    interval: float = 1.0
    pid: int | None = None
    error: str = ""  # why there is no GPU data, in plain words ("no NVIDIA driver", ...)


@dataclass
class GpuSample(Record):
    """One GPU at one instant. Percentages are 0-100; GPM values are interval averages."""

    TYPE: ClassVar[str] = "gpu"
    index: int = 0
    util_gpu: float | None = None  # NVML: % of time any kernel ran
    util_mem: float | None = None  # NVML: % of time memory was read/written
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    clock_reasons: int | None = None  # NVML clock-event reason bitmask
    # GPM (Hopper+): percentages and MiB/s.
    sm_util: float | None = None
    sm_occupancy: float | None = None
    tensor_util: float | None = None
    dram_util: float | None = None
    nvlink_tx_mibs: float | None = None
    nvlink_rx_mibs: float | None = None
    pcie_tx_mibs: float | None = None
    pcie_rx_mibs: float | None = None
    lost: bool = False  # fell off the bus (NVML GpuIsLost)
    label: str = ""  # phase label carried by replayed traces, empty for live data

    @property
    def activity(self) -> float | None:
        """Best measure of real GPU work: GPM SM util when present, else NVML util."""
        return self.sm_util if self.sm_util is not None else self.util_gpu

    @property
    def throttled(self) -> bool:
        """True when the clocks are held down by power, thermal or hardware slowdown."""
        return bool(self.clock_reasons and self.clock_reasons & THROTTLE_MASK)


@dataclass
class HostSample(Record):
    """Host-side activity of a node; rates are per second over the last interval."""

    TYPE: ClassVar[str] = "host"
    cpu_pct: float | None = None
    cpu_per_core: list[float] = field(default_factory=list)
    # The busiest core's busy % where the per-core list is not sent (node_exporter through
    # Prometheus: one value per host instead of one series per core); else max(cpu_per_core).
    cpu_max_core_pct: float | None = None
    iowait_pct: float | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    net_rx_bps: float | None = None  # bytes/s
    net_tx_bps: float | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    agent_cpu_pct: float | None = None  # the agent's own CPU use
    agent_rss_bytes: int | None = None


@dataclass
class GpuProcess:
    """A process holding memory on a GPU, with what the node could learn about it."""

    pid: int
    gpu_index: int
    used_mib: float | None = None
    user: str = ""
    cmd: str = ""
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    visible: bool = True  # False: NVML reports the pid but /proc does not show it (namespaces)
    role: str = ""  # filled by the client's role mapper
    rank: int | None = None
    env_rank: int | None = None  # RANK from /proc/<pid>/environ when readable
    env_local_rank: int | None = None
    # Filled by the client (None: not mapped): verl's name of the process ("actor/rollout/ref",
    # "critic", "TaskRunner (driver)", ...) and the method a WorkerDict runs now (its live title).
    verl_role: str | None = None
    method: str | None = None


# The process states of /proc/PID/stat (proc(5)): R running, S sleeping, D blocked in the kernel
# (uninterruptible), T stopped (SIGSTOP), t stopped by a tracer, Z zombie, X dead, I idle kernel
# thread, P parked, W paging / waking, K wakekill; "" = unknown.
PROC_STATES = ("R", "S", "D", "T", "t", "Z", "X", "I", "P", "W", "K", "")


@dataclass
class JobProcess:
    """A process of the training job on a node, GPU or not: a Ray worker or actor
    (``ray::WorkerDict``, ``ray::TaskRunner``), the verl driver, a vLLM/SGLang engine, a
    torchrun rank, or any process holding a GPU (docs/protocol.md, "procs")."""

    pid: int
    ppid: int | None = None
    user: str = ""
    state: str = ""  # one of PROC_STATES, from /proc/PID/stat
    title: str = ""  # the process title / command line, sanitized
    # The Ray method its title names ("ray::WorkerDict.critic_update_critic" ->
    # "critic_update_critic"), and since when (epoch s) the agent has seen it in that method.
    method: str | None = None
    method_since: float | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    gpus: list[int] = field(default_factory=list)  # indices of the GPUs it holds memory on
    role: str = ""  # verl's name of the process, filled by the client (roles.py)


@dataclass
class ProcessList(Record):
    """All GPU processes of a host at one instant, and the job's processes (GPU or not)."""

    TYPE: ClassVar[str] = "procs"
    procs: list[GpuProcess] = field(default_factory=list)
    job_procs: list[JobProcess] = field(default_factory=list)


@dataclass
class HostState(Record):
    """Connection/health state of a host, set by sources (and by the store for staleness)."""

    TYPE: ClassVar[str] = "state"
    state: str = "connecting"  # one of HOST_STATES
    reason: str = ""


@dataclass
class Heartbeat(Record):
    """Periodic sign of life from an agent; carries its own cost."""

    TYPE: ClassVar[str] = "hb"
    agent_cpu_s: float | None = None
    agent_rss_bytes: int | None = None
    seq: int = 0


@dataclass
class LogLines(Record):
    """Raw lines of a followed file (verl log, NCCL log) as read on the node."""

    TYPE: ClassVar[str] = "log"
    path: str = ""
    kind: str = ""  # verl | nccl | verl_config
    lines: list[str] = field(default_factory=list)
    reset: bool = False  # the file was truncated or rotated before these lines


@dataclass
class LogHistory(LogLines):
    """Lines from earlier in a followed file than those already sent: a big log's history,
    read after its recent tail so that the first verdict comes in seconds. Parsed in file order
    by a parser of its own; the steps go before the tail's."""

    TYPE: ClassVar[str] = "log_history"


@dataclass
class VerlStep(Record):
    """One verl training step's metrics (``t`` = arrival time of its log line)."""

    TYPE: ClassVar[str] = "step"
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    source: str = ""  # console | jsonl


@dataclass
class VerlConfig(Record):
    """The job's resolved config, flattened to dotted keys."""

    TYPE: ClassVar[str] = "config"
    values: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@dataclass
class ProbeRow:
    """One message size of a bandwidth probe."""

    size_bytes: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    in_place_busbw_gbs: float | None = None


@dataclass
class ProbeResult(Record):
    """Result of one NCCL bandwidth probe (nccl-tests or the built-in torch probe)."""

    TYPE: ClassVar[str] = "probe"
    tool: str = ""  # nccl-tests | torch
    collective: str = "all_reduce"
    scope: str = "intra"  # intra | inter
    hosts: list[str] = field(default_factory=list)
    nranks: int = 0
    rows: list[ProbeRow] = field(default_factory=list)
    busbw_max_gbs: float | None = None  # max busbw at large sizes (>= 256 MiB when present)
    expected_gbs: float | None = None
    link: str = ""  # which link the expectation is for
    transport: str = ""
    ok: bool = True
    error: str = ""
    # Where expected_gbs came from: "--expect-busbw", "NIC inventory ...", "NCCL log ...",
    # "assumed ..." or the table entry; shown next to every judgement.
    # Fields added later default to None so older records and recordings stay byte-identical.
    expected_source: str | None = None
    peak_size_bytes: int | None = None  # the message size busbw_max_gbs was measured at
    gpus_per_host: dict[str, int] | None = None  # ranks on each host
    nics: int | None = None  # NICs per node NCCL listed ("NET/IB : Using [0].. [n]..")
    settings: dict[str, str] | None = None  # NCCL_* seen (env lines, -x)
    gpu_name: str | None = None  # of rank 0, for the expectation when no inventory tells it


@dataclass
class NcclInfo(Record):
    """What an NCCL_DEBUG=INFO log says about the job's communication setup."""

    TYPE: ClassVar[str] = "nccl"
    transport: str = ""  # IB+GDRDMA | IB | RoCE | Socket | P2P | NVLS | SHM | ...
    version: str = ""
    nranks: int | None = None
    nnodes: int | None = None
    init_complete: int = 0
    path: str = ""
    # Added later: None (left off the wire) when the log says nothing, so old recordings match.
    settings: dict[str, str] | None = None  # NCCL_* seen in the log
    nics: list[str] | None = None  # NICs NCCL listed, e.g. "mlx5_0/IB"
    gpus_per_host: dict[str, int] | None = None  # from "Init COMPLETE" lines


@dataclass
class LogEvent(Record):
    """A notable line: NCCL WARN, watchdog timeout, traceback, OOM."""

    TYPE: ClassVar[str] = "event"
    kind: str = ""  # nccl_warn | watchdog | error | crash
    text: str = ""
    path: str = ""
    severity: float = 0.5
    where: str = ""  # crash: the failed Ray task and frame (verl_top/verl/crash.py)
    after_steps: int = 0  # crash: verl step lines of the same log read before it


@dataclass
class RayNode:
    """One node of the Ray cluster, as the dashboard's state API lists it."""

    node_id: str
    ip: str
    name: str = ""  # the host name verl-top shows (and keys the node's records by)
    hostname: str = ""  # the node's own hostname when the dashboard tells it
    gpus: float | None = None  # GPU resources of the node (Ray's "GPU" total)
    is_head: bool = False
    alive: bool = True
    local: bool = False  # this machine: monitored in-process, not over SSH


@dataclass
class RayActor:
    """One live Ray actor of the job, mapped to its node, pid and verl role."""

    name: str  # Ray actor name ("" for unnamed actors such as TaskRunner)
    class_name: str
    actor_id: str = ""
    node_id: str = ""
    node_ip: str = ""
    host: str = ""  # RayNode.name of its node: the host its pid lives on in the store
    pid: int | None = None
    role: str = ""  # roles.ROLES: trainer | rollout | driver | agent_loop | reward | other
    rank: int | None = None  # global rank in its worker group (WorkerDict), or replica index
    local_rank: int | None = None  # WorkerDict_<pg>:<local_rank>, or the server's node rank
    group: str = ""  # worker-group prefix of a WorkerDict ("abc123"), else ""
    gpus: float | None = None  # GPU resources the actor holds (needs the detail view)
    job_id: str = ""


@dataclass
class RayActors(Record):
    """The Ray cluster's nodes and the job's live actors (``host``: the dashboard address).

    Emitted by the Ray source when anything in it changes. ``driver_log`` is ``host:path`` of
    the driver log verl-top follows; ``note`` says what went wrong or where it looked.
    """

    TYPE: ClassVar[str] = "ray_actors"
    nodes: list[RayNode] = field(default_factory=list)
    actors: list[RayActor] = field(default_factory=list)
    driver_log: str = ""
    note: str = ""
    # For a snapshot (export/environment.py): the cluster's Ray version (/api/version) and the
    # job's id and launch command (its entrypoint in the dashboard's job list).
    ray_version: str = ""
    job_id: str = ""
    entrypoint: str = ""


@dataclass
class Dropped(Record):
    """How many records (or fields) from ``host`` were refused, and why (``reason``).

    Emitted by a source when its decoder refuses foreign input (see ``protocol.validate``) and
    by nothing else; the store adds ``count`` to the host's drop counts. Reasons are short
    tags: ``json``, ``type``, ``version``, ``drop:<type>.<field>`` (record dropped),
    ``field:<type>.<field>`` (that field set to "no data"), ``cap:<type>.<field>`` (list cut),
    ``time_window`` (time too far from the receiving host's clock).
    """

    TYPE: ClassVar[str] = "drop"
    reason: str = ""
    count: int = 0


@dataclass
class ClockOffset(Record):
    """A node's clock offset, measured by the client at connect (``t``: the client's clock).

    ``offset`` is seconds to add to the node's times (arrival minus node time, least transit
    delay seen); ``applied`` says whether the source adds it (only from 1 s on).
    """

    TYPE: ClassVar[str] = "clock"
    offset: float = 0.0
    applied: bool = False


@dataclass
class RolloutSample(Record):
    """One rollout server (vLLM / SGLang) at one instant, from its Prometheus metrics.

    ``host`` is the server's scrape address (``instance``), not a monitored node: rollout servers
    are shown next to verl's timings, not as host rows. Latency quantiles come from the server's
    cumulative histograms (since it started); rates are per second over the last minute.
    """

    TYPE: ClassVar[str] = "rollout"
    server: str = ""  # vllm | sglang
    model: str = ""
    running: float | None = None  # requests being generated
    waiting: float | None = None  # requests queued for a slot
    kv_cache_pct: float | None = None  # KV-cache blocks in use, 0-100
    gen_tokens_s: float | None = None  # generated tokens per second
    prompt_tokens_s: float | None = None
    preemptions_s: float | None = None  # preempted requests per second (KV cache ran out)
    ttft_p50_s: float | None = None  # time to first token
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None  # time per output token
    e2e_p50_s: float | None = None  # request latency
    e2e_p90_s: float | None = None


@dataclass
class SourceStatus(Record):
    """How a source that is not one host is doing (``host``: the source's name, e.g. its URL).

    ``state`` is ``up`` (answering), ``slow`` (answered past its budget) or ``down``; ``reason``
    says why in one sentence. Emitted when the state or reason changes.
    """

    TYPE: ClassVar[str] = "source"
    state: str = "up"
    reason: str = ""
    queries: int = 0  # requests made in the last round
    duration_s: float | None = None  # wall time of the last round


@dataclass
class NicPort:
    """One network port of a node, read from /sys by the agent."""

    name: str  # mlx5_0 (an RDMA device) or eth0 (a plain interface)
    port: int | None = None  # RDMA port number
    kind: str = ""  # ib | roce | eth
    rate_gbps: float | None = None  # link rate; None when down or unknown
    state: str = ""  # ACTIVE / DOWN (RDMA), up / down (net)
    numa_node: int | None = None  # NUMA node of its PCI device; None when unknown
    netdev: str = ""  # the net interface of an RDMA port (ib0, ens1np0)
    pci: str = ""  # PCI address (0000:1b:00.0)


@dataclass
class GpuTopo:
    """One GPU's place in the node: PCI/NUMA and NVLink state."""

    index: int
    bus_id: str = ""
    numa_node: int | None = None
    nvlink_version: int | None = None
    nvlinks_up: int | None = None  # links in state active
    nvlinks_total: int | None = None  # links the GPU has (None: no NVLink or unknown)
    nvlink_error: str = ""  # why NVLink state is unknown ("Not Supported")
    nic: str = ""  # the closest active IB/RoCE port (sysfs PCI paths)
    nic_link: str = ""  # and how: PIX | PXB | PHB | NODE | SYS (as `nvidia-smi topo -m`)


@dataclass
class NodeTopology(Record):
    """A node's GPU/NIC topology and network inventory, sent once per agent connection."""

    TYPE: ClassVar[str] = "topo"
    source: str = ""  # nvml | nvidia-smi | file | "" (where the GPU matrix came from)
    gpus: list[GpuTopo] = field(default_factory=list)
    nics: list[NicPort] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # "0-1" -> NV18 / SYS / PIX ...
    smi_topo: str = ""  # raw `nvidia-smi topo -m` (bounded) when that was the source
    error: str = ""
    hostname: str = ""  # the node's own hostname: what nccl-tests and NCCL logs call it


RECORD_TYPES: dict[str, type[Record]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        GpuSample,
        HostSample,
        ProcessList,
        HostState,
        Heartbeat,
        LogLines,
        LogHistory,
        VerlStep,
        VerlConfig,
        ProbeResult,
        NcclInfo,
        LogEvent,
        RayActors,
        Dropped,
        ClockOffset,
        RolloutSample,
        SourceStatus,
        NodeTopology,
    )
}

# Nested dataclasses inside records, by (record type, field name).
NESTED: dict[tuple[str, str], type] = {
    ("hello", "gpus"): GpuInfo,
    ("procs", "procs"): GpuProcess,
    ("procs", "job_procs"): JobProcess,
    ("probe", "rows"): ProbeRow,
    ("ray_actors", "nodes"): RayNode,
    ("ray_actors", "actors"): RayActor,
    ("topo", "gpus"): GpuTopo,
    ("topo", "nics"): NicPort,
}
