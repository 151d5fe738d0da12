"""Parsers for NCCL text: nccl-tests stdout and NCCL_DEBUG=INFO logs.

Formats and the transport classifier follow /work/shared/reference/gpu_comm.md §1-§2
(nccl-tests ``src/util.cu``; NCCL ``src/debug.cc``, ``src/transport/*``, ``src/init.cc``;
PyTorch ``ProcessGroupNCCL.cpp``). Everything here is pure text processing: no I/O.

``NcclStreamParser`` is the contract with ``verl_top.sources.pipeline``: it turns the lines of a
followed NCCL log (or a file where nccl-tests writes its output) into ``NcclInfo``, ``LogEvent``
and ``ProbeResult`` records.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from verl_top.model import LogEvent, NcclInfo, ProbeResult, ProbeRow, Record
from verl_top.nccl.expected import fill_expectation
from verl_top.protocol import in_range
from verl_top.untrusted import clean_line, clean_text

MIB = 1 << 20
# sjeaugey (NVIDIA), nccl-tests#212: "256M is too small" to reach NVLink peak; sizes below this
# are latency-bound and must not count for health.
LARGE_SIZE_BYTES = 256 * MIB

# Transport names NcclInfo.transport can take (plugin names are reported verbatim besides these).
TRANSPORTS = (
    "IB+GDRDMA",
    "IB",
    "RoCE+GDRDMA",
    "RoCE",
    "Socket",
    "MNNVL",
    "NVLS",
    "P2P",
    "SHM",
)

# ---------------------------------------------------------------------------------------------
# nccl-tests stdout
# ---------------------------------------------------------------------------------------------

_COLLECTIVE_NAMES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "broadcast",
    "reduce",
    "sendrecv",
    "gather",
    "scatter",
    "hypercube",
)
_BINARY = re.compile(r"\b(" + "|".join(_COLLECTIVE_NAMES) + r")_perf(?:_mpi)?\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_TESTS_VERSION = re.compile(
    r"^#\s*nccl-tests version\s+(\S+)(?:.*?nccl-library=(\d{1,18}))?", re.IGNORECASE
)
_NTHREAD = re.compile(r"^#\s*nThread\s+(\d{1,18})\s+nGpus\s+(\d{1,18})")
# "#  Rank  0 Group  0 Pid   1347 on  vm device  0 [0000:00:06] NVIDIA H200"; very old builds
# have no "Group".
_DEVICE = re.compile(
    r"^#\s*Rank\s+(\d{1,18})\s+(?:Group\s+\d+\s+)?Pid\s+(\d{1,18})\s+on\s+(\S+)\s+device\s+(\d{1,18})\s+"
    r"\[([^\]]*)\]\s*(.*?)\s*$"
)
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d{1,18})\s*(\S*)")
_INT = re.compile(r"^-?\d+$")
# Numbers are captured with at most 18 digits: a longer one is no NCCL number, and int() of
# 5000 digits raised ValueError (Python's 4300-digit limit) and killed the NCCL source.
MAX_ROW_DIGITS = 19  # a data row's size and count (2**63 has 19 digits)
# What launchers put in front of every output line: Ray / SkyPilot "(head, rank=0, pid=3808) ",
# OpenMPI --tag-output "[1,0]<stdout>:", Slurm srun --label " 0: " (the last only before a
# blank, so "host:pid:tid" INFO lines and data rows are left alone).
_LAUNCHER_PREFIX = re.compile(
    r"^\s*(?:\([^()]*\bpid=\d+[^()]*\)\s*)?(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s))?"
)


def strip_launcher_prefix(line: str) -> str:
    """``line`` without a launcher's per-line prefix, stripped of surrounding blanks."""
    return _LAUNCHER_PREFIX.sub("", line, count=1).strip()


@dataclass
class NcclTestsDevice:
    """One ``# Rank ... device ...`` line of the nccl-tests header."""

    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    name: str


@dataclass
class NcclTestsResult:
    """Everything read from one nccl-tests run's stdout."""

    collective: str = ""
    nranks: int = 0
    devices: list[NcclTestsDevice] = field(default_factory=list)
    rows: list[ProbeRow] = field(default_factory=list)
    # nccl-tests' footer: the mean over ALL rows (small sizes too). Shown, never used for health.
    avg_busbw: float | None = None
    # Max busbw (out-of-place or in-place) over sizes >= 256 MiB; the health number.
    busbw_max_large: float | None = None
    busbw_max_size: int | None = None
    dropped_rows: int = 0  # data rows with numbers out of any real range (skipped)
    # True when no size reached 256 MiB and busbw_max_large is the max over all sizes.
    large_fallback: bool = False
    nccl_version: str = ""
    tests_version: str = ""
    errors: list[str] = field(default_factory=list)  # rows with #wrong > 0, OOB failures
    complete: bool = False  # the footer was seen
    log: NcclLogState | None = None  # NCCL INFO lines interleaved in the output

    def rank_hosts(self) -> list[tuple[int, str]]:
        """(rank, host) in rank order: the header's device lines, else NCCL's own rank lines
        (``Init COMPLETE`` / ``Destroy COMPLETE``) when they name every rank, as in output pasted
        from the column header on."""
        if self.devices:
            return [(d.rank, d.host) for d in self.devices]
        log = self.log
        if log is None or not log.nranks or sorted(log.rank_gpus) != list(range(log.nranks)):
            return []  # some ranks unnamed: a partial list would miscount the GPUs per node
        return [(r, log.rank_gpus[r][0]) for r in sorted(log.rank_gpus)]

    @property
    def hosts(self) -> list[str]:
        """Distinct hosts of the ranks, in rank order."""
        return list(dict.fromkeys(host for _, host in self.rank_hosts()))

    @property
    def gpus_per_host(self) -> dict[str, int]:
        """Ranks (one GPU each) per host, hosts in rank order."""
        out: dict[str, int] = {}
        for _, host in self.rank_hosts():
            out[host] = out.get(host, 0) + 1
        return out

    @property
    def gpu_name(self) -> str:
        """The GPU name of rank 0 ("" when the header has no device lines)."""
        return self.devices[0].name if self.devices else ""

    def _problems(self) -> list[str]:
        """What to say next to the rows: errors, no rows, rows skipped as impossible."""
        out = list(self.errors) or ([] if self.rows else ["no data rows"])
        if self.dropped_rows:
            out.append(f"{self.dropped_rows} data rows with impossible numbers skipped")
        return out

    def to_probe(self, host: str = "", t: float = 0.0) -> ProbeResult:
        """This run as a ``ProbeResult`` (expected bandwidth is left for the caller to fill)."""
        hosts = self.hosts
        transport = ""
        if self.log is not None:
            # The rank list says how many nodes there are, even when NCCL's INFO lines do not.
            multi = len(hosts) > 1 or (self.log.nnodes or 0) > 1
            transport = (self.log.network() or self.log.intra()) if multi else self.log.intra()
        return ProbeResult(
            host=host,
            t=t,
            tool="nccl-tests",
            collective=self.collective or "all_reduce",
            scope="inter" if len(hosts) > 1 else "intra",
            hosts=hosts,
            nranks=self.nranks or len(self.rank_hosts()),
            rows=list(self.rows),
            busbw_max_gbs=self.busbw_max_large,
            transport=transport,
            ok=not self.errors and bool(self.rows),
            error="; ".join(self._problems()),
            peak_size_bytes=self.busbw_max_size,
            gpus_per_host=self.gpus_per_host or None,
            nics=len(self.log.ib_devices) if self.log is not None and self.log.ib_devices else None,
            settings=(dict(self.log.settings) or None) if self.log is not None else None,
            gpu_name=self.gpu_name or None,
        )


def _float(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _wrong(token: str) -> int | None:
    """The #wrong column: an int, or None for ``N/A`` (run with ``-c 0``) or a number that is
    none (``inf``, ``nan``: int() of them raised OverflowError / ValueError)."""
    try:
        return int(float(token))
    except (ValueError, OverflowError):
        return None


def _library_code_to_version(code: str) -> str:
    """NCCL_VERSION_CODE (e.g. 22809) to "2.28.9" (codes >= 2.9 are X*10000 + Y*100 + Z)."""
    n = int(code)
    if n >= 10000:
        return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
    return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"


@dataclass
class _Layout:
    """Where the numbers sit in a data row, from the column header (or the default)."""

    preamble: int | None = None  # number of tokens before the first "time"
    half: int = 4  # tokens per out-of-place/in-place half
    total: int | None = None  # tokens in a row per the header


def _layout_from_header(line: str) -> _Layout | None:
    """Read the ``# size count type redop root time algbw busbw #wrong ...`` header."""
    names = [n.lstrip("#").lower() for n in line.lstrip("#").split()]
    names = [n for n in names if n]
    if "time" not in names or "busbw" not in names or "size" not in names:
        return None
    first = names.index("time")
    try:
        second = names.index("time", first + 1)
    except ValueError:
        return _Layout(preamble=first, half=len(names) - first, total=len(names))
    return _Layout(preamble=first, half=second - first, total=len(names))


_DROPPED = "dropped"


def _parse_row(tokens: list[str], layout: _Layout) -> tuple[ProbeRow, int, int] | str | None:
    """A data row to (ProbeRow, wrong out-of-place, wrong in-place); None if not a data row;
    ``_DROPPED`` for a data row whose numbers are out of any real range (counted, skipped)."""
    if len(tokens) < 10 or not _INT.match(tokens[0]) or not _INT.match(tokens[1]):
        return None
    if len(tokens[0]) > MAX_ROW_DIGITS or len(tokens[1]) > MAX_ROW_DIGITS:
        return _DROPPED
    if layout.total is not None and len(tokens) == layout.total and layout.preamble is not None:
        start = layout.preamble
        half = layout.half
    else:
        # Header missing or not matching: count from the right (last 8 = t/alg/bus/wrong x2).
        start = len(tokens) - 8
        half = 4
    oop = tokens[start : start + 4]
    inp = tokens[start + half : start + half + 4]
    if len(oop) < 4:
        return None
    t_us, alg, bus = (_float(x) for x in oop[:3])
    if t_us is None or alg is None or bus is None:
        return None
    in_bus = _float(inp[2]) if len(inp) >= 3 else None
    w1 = _wrong(oop[3]) or 0
    w2 = (_wrong(inp[3]) or 0) if len(inp) >= 4 else 0
    size = int(tokens[0])
    checks = (("size_bytes", size), ("time_us", t_us), ("algbw_gbs", alg), ("busbw_gbs", bus))
    if any(in_range(name, value) is None for name, value in checks):
        return _DROPPED  # the protocol's ranges: no negative, NaN or 1e300 bandwidth
    if in_bus is not None:
        in_bus = in_range("in_place_busbw_gbs", in_bus)
    row = ProbeRow(
        size_bytes=size,
        time_us=t_us,
        algbw_gbs=alg,
        busbw_gbs=bus,
        in_place_busbw_gbs=in_bus,
    )
    return row, w1, w2


def parse_nccl_tests(text: str, collective: str | None = None) -> NcclTestsResult:
    """Parse one nccl-tests run's stdout (any collective, old and new column layouts).

    ``collective`` is used only when the text names none (no ``# Collective test starting:``
    line and no ``*_perf`` binary name). NCCL INFO lines mixed into the output are classified
    too (``result.log``).
    """
    res = NcclTestsResult()
    log = NcclLogState()
    layout = _Layout()
    nthread_gpus: int | None = None
    named = ""
    for raw in text.splitlines():
        # One boundary for every field read below (host names, GPU names, errors): escapes,
        # controls and bidi overrides go here, not at each use.
        stripped = strip_launcher_prefix(clean_line(raw))
        if not stripped:
            continue
        if stripped.startswith("#"):
            if m := _STARTING.match(stripped):
                named = m.group(1)
            elif m := _TESTS_VERSION.match(stripped):
                res.tests_version = m.group(1)
                if m.group(2) and not res.nccl_version:
                    res.nccl_version = _library_code_to_version(m.group(2))
            elif m := _NTHREAD.match(stripped):
                nthread_gpus = int(m.group(1)) * int(m.group(2))
            elif m := _DEVICE.match(stripped):
                res.devices.append(
                    NcclTestsDevice(
                        rank=int(m.group(1)),
                        pid=int(m.group(2)),
                        host=m.group(3),
                        device=int(m.group(4)),
                        bus_id=m.group(5),
                        name=m.group(6),
                    )
                )
            elif m := _AVG_BUSBW.match(stripped):
                res.avg_busbw = _float(m.group(1))
                res.complete = True
            elif m := _OOB.match(stripped):
                if int(m.group(1)) > 0 or m.group(2).upper() == "FAILED":
                    res.errors.append(f"out of bounds values: {m.group(1)} {m.group(2)}".strip())
            elif (hdr := _layout_from_header(stripped)) is not None:
                layout = hdr
            elif not named and (m := _BINARY.search(stripped)):
                named = m.group(0)
            continue
        parsed = _parse_row(stripped.split(), layout)
        if parsed == _DROPPED:
            res.dropped_rows += 1
            continue
        if isinstance(parsed, tuple):
            row, w1, w2 = parsed
            res.rows.append(row)
            if w1 > 0 or w2 > 0:
                res.errors.append(f"{w1 + w2} wrong values at size {row.size_bytes}")
            continue
        log.feed_line(stripped)
        if not named and (m := _BINARY.search(stripped)):
            named = m.group(0)
        if not res.nccl_version and (m := _NCCL_VERSION.search(stripped)):
            res.nccl_version = m.group(1)
    res.log = log if log.seen else None
    if log.version and not res.nccl_version:
        res.nccl_version = log.version
    res.collective = _collective_name(named) or (collective or "")
    res.nranks = len(res.devices) or (nthread_gpus or 0)
    if repeated := _repeated_rank(res.devices):
        res.errors.append(repeated)
    _fill_peak(res)
    return res


def _repeated_rank(devices: list[NcclTestsDevice]) -> str:
    """Why the rank list is not one run when a rank number comes twice, else "".

    nccl-tests built without MPI=1 and started by mpirun runs one independent test per process:
    each prints its own header, so "Rank 0" shows up once per host (NVIDIA/nccl-tests#182,
    #294) and the rows are single-node numbers, not a multi-node result.
    """
    first: dict[int, str] = {}
    for dev in devices:
        if dev.rank in first:
            return (
                f"rank {dev.rank} is listed twice ({first[dev.rank]}, {dev.host}): each process "
                "ran its own test, not one multi-node run (nccl-tests built without MPI=1 "
                "under mpirun does this)"
            )
        first[dev.rank] = dev.host
    return ""


def _collective_name(name: str) -> str:
    """``all_reduce_perf`` / ``all_reduce_perf_mpi`` -> ``all_reduce``."""
    m = _BINARY.search(name)
    return m.group(1) if m else ""


def _fill_peak(res: NcclTestsResult) -> None:
    """Max busbw over sizes >= 256 MiB (both halves), or over all sizes, flagged."""

    def best(rows: list[ProbeRow]) -> tuple[float, int] | None:
        out: tuple[float, int] | None = None
        for r in rows:
            for bw in (r.busbw_gbs, r.in_place_busbw_gbs):
                if bw is not None and (out is None or bw > out[0]):
                    out = (bw, r.size_bytes)
        return out

    large = best([r for r in res.rows if r.size_bytes >= LARGE_SIZE_BYTES])
    if large is None:
        large = best(res.rows)
        res.large_fallback = large is not None
    if large is not None:
        res.busbw_max_large, res.busbw_max_size = large


# ---------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO logs and PyTorch watchdog lines
# ---------------------------------------------------------------------------------------------

_VIA_NET = re.compile(
    r"via NET/([^/\s][^/]*?)/(\d{1,18})(?:\(\d+\))?((?:/GDRDMA|/Shared|\(PCI\))*)"
)
_IB_USING = re.compile(r"NET/(IB\w*) : Using (.*?)(?:;|$)")
_IB_DEV = re.compile(r"\[\d+\]([\w.:-]+?):\d+/(IB|RoCE)\b")
_USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
# HPC-X's nccl-rdma-sharp-plugins registers as "NCCL RDMA Plugin vN" (channels read
# "via NET/NCCL RDMA Plugin v8/0/GDRDMA") and says which layer it wraps: "P2P plugin v8 IBext_v8".
_P2P_LAYER = re.compile(r"NCCL INFO P2P plugin (?:v\d+ )?(\S+)")
_RDMA_PLUGIN = "NCCL RDMA Plugin"
_GDR_HCA = re.compile(r"GPU Direct RDMA Enabled for HCA")
_COMM_SUMMARY = re.compile(r"\bcomm 0x[0-9a-f]+ rank \d+ nRanks (\d{1,18}) nNodes (\d{1,18})")
_INIT_COMPLETE = re.compile(r"\bnranks (\d{1,18})\b.*- (?:Init|Destroy) COMPLETE")
# "<host>:<pid>:<tid> [<dev>] NCCL INFO ... rank R nranks N cudaDev D ... - Init COMPLETE"
_INIT_RANK = re.compile(
    r"(?:^|[\s\]])(?P<host>[^:\s\]]+):\d+:\d+ \[\d+\] NCCL INFO .*?\brank (?P<rank>\d{1,18}) "
    r"nranks \d+ cudaDev (?P<dev>\d{1,18})"
)
_MAX_RANKS = 65536
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d{1,18}), OpType=(\w+)"
    r".*?Timeout\(ms\)=(\d{1,18})\) ran for (\d{1,18}) milliseconds"
)
_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d{1,18})\]")
# "[PG 1 Rank 0]", "[PG ID 0 PG GUID 0(default_pg) Rank 1]": the process group a line is about.
_PG = re.compile(r"\[PG (?:ID )?(\w+)(?: PG GUID [^\]]*?)? Rank \d+\]")
# "... detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL
# work: 1579." (gpu_comm.md §2.5): how far each rank got.
_WATCHDOG_STATE = re.compile(
    r"detected by watchdog at work: (\d{1,18}), last enqueued NCCL work: (-?\d{1,18}), "
    r"last completed NCCL work: (-?\d{1,18})"
)
# Ray's prefix on a worker's line in the driver log: "(WorkerDict pid=55154, ip=10.0.0.2)".
_RAY_PID = re.compile(r"\((?:[\w.:-]+) pid=(\d{1,18})(?:, ip=([\d.:a-fA-F]+))?\)")
_NCCL_WARN = re.compile(r"\bNCCL WARN (.*)$")
# NCCL's own echo of a setting ("NCCL_IB_DISABLE set by environment to 1.", "NCCL_IB_HCA set to
# mlx5_0") and a launcher's command line ("-x NCCL_IB_DISABLE=1", "export NCCL_IB_HCA=mlx5_0").
_ENV_ECHO = re.compile(r"\b(NCCL_[A-Z0-9_]+) set (?:by environment )?to (\S+)")
_ENV_ASSIGN = re.compile(
    r"(?:^|[\s'\",])(NCCL_[A-Z0-9_]+)=[\"']?([^\s'\";,]+(?:,[^\s'\";,=]+(?=[\s'\";,]|$))*)"
)
_MAX_SETTINGS = 64
_MAX_SETTING_LEN = 200
_BENIGN_WARN = ("Address already in use",)

SEVERITY_WATCHDOG = 1.0
SEVERITY_WARN = 0.6
SEVERITY_BENIGN = 0.1
_MAX_EVENT_TEXT = 500


@dataclass
class WatchdogTimeout:
    """One PyTorch ProcessGroupNCCL watchdog timeout line."""

    rank: int | None
    seq: int
    op_type: str
    timeout_ms: int
    ran_for_ms: int
    pg: str | None = None  # process group id ("0", "1"), when the line names one
    pid: int | None = None  # the reporting process, from a Ray log prefix


def parse_watchdog(line: str) -> WatchdogTimeout | None:
    """The fields of a ``Watchdog caught collective operation timeout`` line, or None."""
    m = _WATCHDOG.search(line)
    if m is None:
        return None
    head = line[: m.start()]
    ranks = _RANK.findall(head)
    return WatchdogTimeout(
        rank=int(ranks[-1]) if ranks else None,
        seq=int(m.group(1)),
        op_type=m.group(2),
        timeout_ms=int(m.group(3)),
        ran_for_ms=int(m.group(4)),
        pg=_pg_of(head),
        pid=_pid_of(head),
    )


def _pg_of(text: str) -> str | None:
    m = _PG.search(text)
    return m.group(1) if m else None


def _pid_of(text: str) -> int | None:
    m = _RAY_PID.search(text)
    return int(m.group(1)) if m else None


@dataclass
class WatchdogState:
    """One ``Exception ... detected by watchdog at work: N, last enqueued NCCL work: E, last
    completed NCCL work: C`` line: where one rank of one process group stood."""

    rank: int | None
    pg: str | None
    work: int
    last_enqueued: int
    last_completed: int
    pid: int | None = None


def parse_watchdog_state(line: str) -> WatchdogState | None:
    """The fields of a watchdog's ``detected by watchdog at work`` line, or None."""
    m = _WATCHDOG_STATE.search(line)
    if m is None:
        return None
    head = line[: m.start()]
    ranks = _RANK.findall(head)
    return WatchdogState(
        rank=int(ranks[-1]) if ranks else None,
        pg=_pg_of(head),
        work=int(m.group(1)),
        last_enqueued=int(m.group(2)),
        last_completed=int(m.group(3)),
        pid=_pid_of(head),
    )


@dataclass
class RankReport:
    """What the watchdog lines say about one rank of one process group."""

    rank: int
    pg: str | None
    seq: int | None = None  # the collective it timed out in
    op_type: str = ""
    timeout_ms: int | None = None
    ran_for_ms: int | None = None
    last_completed: int | None = None
    last_enqueued: int | None = None
    pid: int | None = None
    host: str = ""  # where the line was read


@dataclass
class WatchdogTies:
    """Watchdog lines tied to ranks: who timed out where, and who is behind the others."""

    ranks: dict[tuple[str | None, int], RankReport]

    def timed_out(self) -> list[RankReport]:
        """Ranks that printed a timeout, by process group and rank."""
        return sorted(
            (r for r in self.ranks.values() if r.seq is not None),
            key=lambda r: (r.pg or "", r.rank),
        )

    def behind(self) -> list[RankReport]:
        """Ranks whose last completed collective is lower than their group's most advanced
        rank's: they never finished what the others did (the likely culprits)."""
        out: list[RankReport] = []
        by_pg: dict[str | None, list[RankReport]] = {}
        for r in self.ranks.values():
            if r.last_completed is not None:
                by_pg.setdefault(r.pg, []).append(r)
        for reports in by_pg.values():
            top = max(r.last_completed or 0 for r in reports)
            out += [r for r in reports if (r.last_completed or 0) < top]
        return sorted(out, key=lambda r: (r.pg or "", r.rank))

    def disagree(self) -> bool:
        """True when ranks of one group timed out in different collectives (a desync)."""
        seqs: dict[str | None, set[int]] = {}
        for r in self.ranks.values():
            if r.seq is not None:
                seqs.setdefault(r.pg, set()).add(r.seq)
        return any(len(s) > 1 for s in seqs.values())


MAX_TIED_RANKS = 65536


def _rank_entry(
    ranks: dict[tuple[str | None, int], RankReport], pg: str | None, rank: int
) -> RankReport | None:
    """The report of (pg, rank). Older torch prints the timeout line without its process group
    ("[Rank 0] Watchdog caught ...") and the state line with it ("[PG 1 Rank 0] ..."): a line
    without a group joins the rank's one entry, and a group fills in an entry that lacked it."""
    hit = ranks.get((pg, rank))
    if hit is not None:
        return hit
    if pg is None:
        same = [r for (g, n), r in ranks.items() if n == rank]
        return same[0] if len(same) == 1 else None
    bare = ranks.pop((None, rank), None)
    if bare is not None:
        bare.pg = pg
        ranks[(pg, rank)] = bare
    return bare


def watchdog_ties(events: Iterable[LogEvent]) -> WatchdogTies:
    """Tie the watchdog lines among ``events`` to (process group, rank): the collective each
    rank timed out in and how far it got. Lines without a rank are skipped."""
    ranks: dict[tuple[str | None, int], RankReport] = {}
    for ev in events:
        if ev.kind not in ("watchdog", "watchdog_state"):
            continue
        wd = parse_watchdog(ev.text) if ev.kind == "watchdog" else None
        st = parse_watchdog_state(ev.text) if wd is None else None
        hit = wd or st
        if hit is None or hit.rank is None:
            continue
        rep = _rank_entry(ranks, hit.pg, hit.rank)
        if rep is None:
            if len(ranks) >= MAX_TIED_RANKS:
                continue
            rep = ranks[(hit.pg, hit.rank)] = RankReport(rank=hit.rank, pg=hit.pg, host=ev.host)
        rep.pid = hit.pid if hit.pid is not None else rep.pid
        if wd is not None:
            rep.seq, rep.op_type = wd.seq, wd.op_type
            rep.timeout_ms, rep.ran_for_ms = wd.timeout_ms, wd.ran_for_ms
        elif st is not None:
            rep.last_completed, rep.last_enqueued = st.last_completed, st.last_enqueued
    return WatchdogTies(ranks)


def classify_event(line: str) -> LogEvent | None:
    """A ``LogEvent`` for a watchdog timeout or NCCL WARN line (no host/time/path set)."""
    text = clean_line(line).strip()
    if _WATCHDOG.search(text):
        return LogEvent(kind="watchdog", text=text[:_MAX_EVENT_TEXT], severity=SEVERITY_WATCHDOG)
    if _WATCHDOG_STATE.search(text):
        return LogEvent(
            kind="watchdog_state", text=text[:_MAX_EVENT_TEXT], severity=SEVERITY_WATCHDOG
        )
    m = _NCCL_WARN.search(text)
    if m is not None:
        benign = any(b in m.group(1) for b in _BENIGN_WARN)
        return LogEvent(
            kind="nccl_warn",
            text=text[:_MAX_EVENT_TEXT],
            severity=SEVERITY_BENIGN if benign else SEVERITY_WARN,
        )
    return None


@dataclass
class NcclLogState:
    """What the NCCL INFO lines seen so far say; ``transport()`` applies gpu_comm.md §2.3."""

    version: str = ""
    nranks: int | None = None
    nnodes: int | None = None
    init_complete: int = 0
    using_network: str = ""  # "Using network X"
    p2p_layer: str = ""  # "P2P plugin v8 IBext_v8": the layer HPC-X's RDMA plugin wraps
    net_via: dict[str, bool] = field(default_factory=dict)  # net name -> any /GDRDMA channel
    link_layers: set[str] = field(default_factory=set)  # IB / RoCE from "NET/IB : Using"
    ib_devices: list[str] = field(default_factory=list)
    no_ib_device: bool = False
    gdr_hca: bool = False
    p2p: bool = False
    mnnvl: bool = False
    nvls: bool = False
    shm: bool = False
    seen: bool = False  # any NCCL line at all
    settings: dict[str, str] = field(default_factory=dict)  # NCCL_* from env echo / command line
    nic_layers: dict[str, str] = field(default_factory=dict)  # mlx5_0 -> IB | RoCE
    rank_gpus: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (host, cudaDev)

    def feed_line(self, line: str) -> None:
        """Update the state from one line (prefixes such as ``(WorkerDict pid=..)`` are fine)."""
        if "NCCL" not in line and "via " not in line:
            return
        if "NCCL INFO" in line or "NCCL WARN" in line or "NCCL version" in line:
            self.seen = True
        if "NCCL_" in line:
            self._settings(line)
        if not self.version and (m := _NCCL_VERSION.search(line)):
            self.version = m.group(1)
        if "via " in line:
            self._via(line)
        if m := _COMM_SUMMARY.search(line):
            self.nranks = max(self.nranks or 0, int(m.group(1)))
            self.nnodes = max(self.nnodes or 0, int(m.group(2)))
        if "Init COMPLETE" in line:
            self.init_complete += 1
        if "Init COMPLETE" in line or "Destroy COMPLETE" in line:
            # Both print "<host>:<pid>:<tid> [d] NCCL INFO comm .. rank R nranks N cudaDev D".
            if m := _INIT_COMPLETE.search(line):
                self.nranks = max(self.nranks or 0, int(m.group(1)))
            if (m := _INIT_RANK.search(line)) and len(self.rank_gpus) < _MAX_RANKS:
                host = clean_text(m.group("host"), 128)
                self.rank_gpus[int(m.group("rank"))] = (host, int(m.group("dev")))
        if m := _USING_NETWORK.search(line):
            self.using_network = m.group(1)
        if m := _P2P_LAYER.search(line):
            self.p2p_layer = clean_text(m.group(1), 64)
        if "NET/IB : No device found" in line:
            self.no_ib_device = True
        if m := _IB_USING.search(line):
            for dev, layer in _IB_DEV.findall(m.group(2)):
                self.link_layers.add(layer)
                if dev not in self.ib_devices and len(self.ib_devices) < _MAX_SETTINGS:
                    self.ib_devices.append(dev)
                    self.nic_layers[dev] = layer
        if _GDR_HCA.search(line):
            self.gdr_hca = True
        if "Connected NVLS" in line or re.search(r"NVLS multicast support is available", line):
            self.nvls = True

    def _settings(self, line: str) -> None:
        """Record NCCL_* settings the line states (NCCL's echo wins over a command line)."""
        found = [(m.group(1), m.group(2).rstrip(".")) for m in _ENV_ECHO.finditer(line)]
        if not found:
            found = [(m.group(1), m.group(2)) for m in _ENV_ASSIGN.finditer(line)]
        for name, value in found:
            if name in self.settings or len(self.settings) < _MAX_SETTINGS:
                self.settings[name] = clean_text(value, _MAX_SETTING_LEN)
                self.seen = True

    def merged(self, other: NcclLogState) -> NcclLogState:
        """This state with what ``other`` saw and this one did not (this one wins)."""
        out = NcclLogState(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        out.settings = {**other.settings, **self.settings}
        out.net_via = {**other.net_via, **self.net_via}
        out.link_layers = self.link_layers | other.link_layers
        out.ib_devices = list(dict.fromkeys(self.ib_devices + other.ib_devices))
        out.nic_layers = {**other.nic_layers, **self.nic_layers}
        out.rank_gpus = {**other.rank_gpus, **self.rank_gpus}
        out.using_network = self.using_network or other.using_network
        out.p2p_layer = self.p2p_layer or other.p2p_layer
        out.nnodes = self.nnodes or other.nnodes
        for flag in ("p2p", "mnnvl", "nvls", "shm", "gdr_hca", "no_ib_device", "seen"):
            setattr(out, flag, getattr(self, flag) or getattr(other, flag))
        return out

    def rdma_disabled(self) -> str:
        """The setting that turns RDMA off ("NCCL_IB_DISABLE=1"), "" when none is set."""
        if self.settings.get("NCCL_IB_DISABLE", "").strip() == "1":
            return "NCCL_IB_DISABLE=1"
        if self.settings.get("NCCL_NET", "").strip().lower() == "socket":
            return "NCCL_NET=Socket"
        return ""

    def _via(self, line: str) -> None:
        if m := _VIA_NET.search(line):
            name = m.group(1)
            gdr = "/GDRDMA" in m.group(3)
            self.net_via[name] = self.net_via.get(name, False) or gdr
        elif "via P2P/MNNVL" in line:
            self.mnnvl = True
        elif "via P2P/" in line:
            self.p2p = True
        elif "via SHM/" in line:
            self.shm = True

    def _ib_net(self, name: str) -> bool:
        """Whether a NET/<name> is NCCL's IB verbs transport: "IB", "IBext_v8", or HPC-X's RDMA
        plugin over its IB layer (its "P2P plugin ... IBext" line, else NCCL's NET/IB list)."""
        if name.startswith("IB"):
            return True
        if name.startswith(_RDMA_PLUGIN):
            return self.p2p_layer.startswith("IB") or (not self.p2p_layer and bool(self.ib_devices))
        return False

    def network(self) -> str:
        """The inter-node transport (rules 1-4 of §2.3), "" when no network line was seen."""
        roce = "RoCE" in self.link_layers and "IB" not in self.link_layers
        fabric = "RoCE" if roce else "IB"
        ib_gdr = [gdr for name, gdr in self.net_via.items() if self._ib_net(name)]
        if any(ib_gdr):
            return f"{fabric}+GDRDMA"
        if ib_gdr:
            return fabric
        if "Socket" in self.net_via or self.using_network == "Socket":
            return "Socket"
        others = [name for name in self.net_via if not self._ib_net(name)]
        if others:
            return others[0]
        if self._ib_net(self.using_network):
            return fabric
        if not self.using_network and self.rdma_disabled():
            # No channel lines (NCCL_DEBUG below INFO), but RDMA was switched off: NCCL can
            # only use its socket transport between nodes.
            return "Socket"
        return self.using_network

    def transport_basis(self) -> str:
        """Which lines the network transport was read from, in words."""
        if self.net_via:
            return "NCCL channel lines (via NET/...)"
        if self.using_network:
            return f'NCCL "Using network {self.using_network}"'
        if self.rdma_disabled():
            return f"{self.rdma_disabled()} (no NCCL_DEBUG=INFO channel lines)"
        return ""

    def intra(self) -> str:
        """The intra-node transport (rules 5-6 of §2.3), "" when none was seen."""
        if self.mnnvl:
            return "MNNVL"
        if self.nvls:
            return "NVLS"
        if self.p2p:
            return "P2P"
        if self.shm:
            return "SHM"
        return ""

    def transport(self) -> str:
        """One word for the job: the network when multi-node (or unknown), else intra-node."""
        net = self.network()
        intra = self.intra()
        if (self.nnodes or 0) <= 1 and intra:
            return intra
        if net == "Socket" and not self.net_via and not self.using_network and not self.nnodes:
            # Only a setting (NCCL_IB_DISABLE=1) says so and nothing says there are several
            # nodes: a single-node run would move no bytes over sockets. Callers that know the
            # hosts (nccl-tests rank lists) use network() themselves.
            net = ""
        return net or intra

    def info(self, host: str, t: float, path: str) -> NcclInfo:
        """The summary as a record."""
        return NcclInfo(
            host=host,
            t=t,
            transport=self.transport(),
            version=self.version,
            nranks=self.nranks,
            nnodes=self.nnodes,
            init_complete=self.init_complete,
            path=path,
            settings=dict(self.settings) or None,
            nics=self.nic_list() or None,
            gpus_per_host=self.gpus_per_host() or None,
        )

    def gpus_per_host(self) -> dict[str, int]:
        """Ranks per host from the ``Init COMPLETE`` lines seen (hosts in rank order)."""
        out: dict[str, int] = {}
        for _, (host, _dev) in sorted(self.rank_gpus.items()):
            out[host] = out.get(host, 0) + 1
        return out

    def nic_list(self) -> list[str]:
        """The NICs NCCL said it uses, ``mlx5_0/IB`` style (empty when no NET/IB line)."""
        return [f"{d}/{self.nic_layers.get(d, '?')}" for d in self.ib_devices]


def parse_nccl_log(text: str) -> tuple[NcclLogState, list[LogEvent]]:
    """Classify a whole NCCL_DEBUG=INFO log; returns the summary and its events."""
    state = NcclLogState()
    events: list[LogEvent] = []
    for line in text.splitlines():
        clean = clean_line(line)
        state.feed_line(clean)
        if (ev := classify_event(clean)) is not None:
            events.append(ev)
    return state, events


# ---------------------------------------------------------------------------------------------
# Stream parser used by the pipeline
# ---------------------------------------------------------------------------------------------

# A run's first line; "# Using devices" starts one when the lines before it were cut (a run pasted
# from its device list on, as in NVIDIA/nccl-tests#290).
_RUN_START = re.compile(
    r"^#\s*(nccl-tests version|Collective test starting|nThread\s+\d+|Using devices)"
)


class EventScanner:
    """Watchdog, watchdog-state and NCCL WARN lines of one followed file as ``LogEvent``s,
    each timeout once: it is printed again in the abort message ("what(): ...")."""

    # Every line it keeps has "atchdog" or "NCCL WARN": most lines are skipped without a regex.
    _MAX_SEEN = 65536

    def __init__(self, host: str, path: str) -> None:
        self.host = host
        self.path = path
        self._watchdogs: set[tuple[int | None, int, str]] = set()

    def scan(self, line: str) -> LogEvent | None:
        """The event of one line, or None."""
        if "atchdog" not in line and "NCCL WARN" not in line:
            return None
        ev = classify_event(line)
        if ev is None:
            return None
        if ev.kind == "watchdog":
            wd = parse_watchdog(ev.text)
            if wd is not None:
                key = (wd.rank, wd.seq, wd.op_type)
                if key in self._watchdogs:
                    return None
                if len(self._watchdogs) < self._MAX_SEEN:
                    self._watchdogs.add(key)
        ev.host, ev.path = self.host, self.path
        return ev

    def feed(self, lines: list[str], t: float = 0.0) -> list[LogEvent]:
        """The events of these lines, in order, at ``t`` (the lines' arrival time)."""
        out = [ev for line in lines if (ev := self.scan(line)) is not None]
        for ev in out:
            ev.t = t
        return out


_MAX_RUN_LINES = 20_000  # a nccl-tests run is < 100 table lines; the rest is INFO chatter


class NcclStreamParser:
    """Turns a followed NCCL log (or nccl-tests output file) into records, chunk by chunk."""

    def __init__(self, host: str, path: str) -> None:
        self.host = host
        self.path = path
        self.reset()

    def reset(self) -> None:
        """Forget everything (the file was truncated or rotated)."""
        self.state = NcclLogState()
        self._last: tuple[object, ...] | None = None
        self._run: list[str] | None = None
        self._events = EventScanner(self.host, self.path)

    def feed(self, lines: list[str], t: float) -> list[Record]:
        """Records for these lines: events as they come, then NcclInfo if the summary changed."""
        out: list[Record] = []
        for raw in lines:
            line = clean_line(raw).rstrip("\r\n")
            self.state.feed_line(line)
            ev = self._event(line)
            if ev is not None:
                ev.t = t  # when the line arrived: the straggler rules look at recent ones
                out.append(ev)
            probe = self._tests_line(line, t)
            if probe is not None:
                out.append(probe)
        key = (
            self.state.transport(),
            self.state.version,
            self.state.nranks,
            self.state.nnodes,
            self.state.init_complete,
            tuple(self.state.settings.items()),
            tuple(self.state.ib_devices),
        )
        if self.state.seen and any(key) and key != self._last:
            self._last = key
            out.append(self.state.info(self.host, t, self.path))
        return out

    def _event(self, line: str) -> LogEvent | None:
        return self._events.scan(line)

    def _tests_line(self, line: str, t: float) -> ProbeResult | None:
        stripped = strip_launcher_prefix(line)
        if self._run is None and stripped.startswith("#") and _layout_from_header(stripped):
            # Output pasted from the column header on (no "# nThread", no device list).
            self._run = []
        if _RUN_START.match(stripped):
            # "# nccl-tests version" then "# Collective test starting" then "# nThread": one run.
            if self._run is None or any(_DEVICE.match(strip_launcher_prefix(r)) for r in self._run):
                self._run = []
            self._run.append(line)
            return None
        if self._run is None:
            return None
        self._run.append(line)
        if len(self._run) > _MAX_RUN_LINES:
            self._run = None
            return None
        if _AVG_BUSBW.match(stripped):
            res = parse_nccl_tests("\n".join(self._run))
            self._run = None
            # Lines before the run (the launcher's command line with -x NCCL_*, INFO lines of
            # other ranks) describe it too.
            if self.state.seen:
                res.log = self.state if res.log is None else res.log.merged(self.state)
            probe = res.to_probe(self.host, t)
            fill_expectation(probe, gpu_name=res.gpu_name)
            return probe
        return None
