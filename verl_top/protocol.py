"""NDJSON wire format: one JSON object per line, ``{"v": 1, "type": ..., ...fields}``.

The same lines travel from the node agent over SSH, are written to recordings, and are read
back by replay. Decoding is forgiving: unknown fields are dropped, missing fields take their
defaults, and a line that is not a valid record is counted and skipped, never raised.
See docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from verl_top.flat_validator import FlatCheck, FlatField, compile_flat
from verl_top.model import HOST_STATES, PROC_STATES, RECORD_TYPES, Dropped, Record
from verl_top.untrusted import (
    MAX_TEXT,
    UntrustedJSONError,
    bounded_int,
    clean_line,
    clean_lines,
    clean_text,
    finite,
    loads,
)

VERSION = 1

_FIELDS: dict[type, tuple[str, ...]] = {}
_FIELD_SETS: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        _FIELDS[cls] = names
        _FIELD_SETS[cls] = frozenset(names)
    return names


def _plain(value: Any) -> Any:
    """Turn nested dataclasses into dicts, dropping None fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            k: _plain(v) for k in _field_names(type(value)) if (v := getattr(value, k)) is not None
        }
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def to_dict(record: Record) -> dict[str, Any]:
    """The wire dict of a record (``v`` and ``type`` first, None fields left out)."""
    out: dict[str, Any] = {"v": VERSION, "type": record.TYPE}
    for name in _field_names(type(record)):
        value = getattr(record, name)
        if value is not None:
            out[name] = _plain(value)
    return out


def encode(record: Record) -> str:
    """One NDJSON line (without the trailing newline)."""
    return json.dumps(to_dict(record), separators=(",", ":"), allow_nan=False, default=str)


# --- validation: every field of every record, at decode time ---------------------------------

T_MIN = 0.0  # t = 0 means "no time" (log lines read from a finished file)
T_MAX = 4102444800.0  # 2100-01-01: any later t is garbage, not a clock skew
MAX_GPU_INDEX = 255  # GPU index cap: 0..255 (NVML enumerates far fewer per node)
MAX_RECORD_BYTES = 16 * 1024 * 1024  # one NDJSON line; longer lines are refused
MAX_DROP_KEYS = 1024  # distinct (host, reason) drop counters a decoder keeps
_PCT = (0.0, 100.0)
_BIG = 1e18  # magnitude bound for numbers without a physical range (no inf, no 1e308)
_BYTES = (0.0, float(2**60))
_MIB = (0.0, float(2**40))
_RATE = (0.0, 1e15)  # bytes/s or MiB/s

# Ranges of numeric fields by name (a name means the same thing in every record type).
RANGES: dict[str, tuple[float, float]] = {
    "t": (T_MIN, T_MAX),
    "index": (0, MAX_GPU_INDEX),
    "gpu_index": (0, MAX_GPU_INDEX),
    **dict.fromkeys(
        ("util_gpu", "util_mem", "sm_util", "sm_occupancy", "tensor_util", "dram_util"), _PCT
    ),
    **dict.fromkeys(("iowait_pct", "cpu_max_core_pct"), _PCT),
    "cpu_pct": (0.0, 1e5),  # a process's CPU % is per core, like top: 64 cores -> 6400
    "agent_cpu_pct": (0.0, 1e5),
    "cpu_per_core": _PCT,
    **dict.fromkeys(("mem_used_mib", "mem_total_mib", "used_mib"), _MIB),
    **dict.fromkeys(("power_w", "power_limit_w"), (0.0, 1e5)),
    "temp_c": (-100.0, 300.0),
    **dict.fromkeys(("sm_mhz", "mem_mhz"), (0.0, 1e6)),
    "clock_reasons": (0, 2**64 - 1),
    **dict.fromkeys(("nvlink_tx_mibs", "nvlink_rx_mibs", "pcie_tx_mibs", "pcie_rx_mibs"), _RATE),
    **dict.fromkeys(("net_rx_bps", "net_tx_bps", "disk_read_bps", "disk_write_bps"), _RATE),
    **dict.fromkeys(("load1", "load5", "load15"), (0.0, 1e7)),
    **dict.fromkeys(
        ("mem_used_bytes", "mem_total_bytes", "rss_bytes", "agent_rss_bytes", "size_bytes"), _BYTES
    ),
    "agent_cpu_s": (0.0, 1e12),
    "cpu_count": (0, 2**20),
    "interval": (0.0, 86400.0),
    "pid": (0, 2**31 - 1),
    "ppid": (0, 2**31 - 1),
    "method_since": (T_MIN, T_MAX),
    # A job process's GPUs are indices; elsewhere "gpus" counts GPU resources.
    "JobProcess.gpus": (0, MAX_GPU_INDEX),
    **dict.fromkeys(("rank", "env_rank", "env_local_rank", "local_rank"), (0, 2**24)),
    **dict.fromkeys(("nranks", "nnodes", "init_complete"), (0, 2**24)),
    "seq": (0, 2**63 - 1),
    "step": (0, 10**15),
    "count": (0, 2**63 - 1),
    "offset": (-1e10, 1e10),
    "severity": (0.0, 1.0),
    "gpus": (0.0, 1e6),
    "time_us": (0.0, 1e15),
    **dict.fromkeys(
        ("algbw_gbs", "busbw_gbs", "in_place_busbw_gbs", "busbw_max_gbs", "expected_gbs"),
        (0.0, 1e9),
    ),
    # A rollout server's gauges (Prometheus): requests, KV cache %, rates, latencies.
    **dict.fromkeys(("running", "waiting"), (0.0, 1e9)),
    "kv_cache_pct": _PCT,
    **dict.fromkeys(("gen_tokens_s", "prompt_tokens_s", "preemptions_s"), (0.0, 1e12)),
    **dict.fromkeys(
        ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s"), (0.0, 1e7)
    ),
}


def in_range(name: str, value: Any) -> Any:
    """``value`` when it is a finite number within the range of field ``name`` (``RANGES``),
    else None: the record boundary's check, for numbers read from text by a parser (NCCL
    rows, Prometheus answers) rather than decoded from the wire."""
    if value is None:
        return None
    lo, hi = RANGES.get(name, (-_BIG, _BIG))
    return value if finite(value, lo, hi) is not None else None


# Fields without which a record (or a list item) means nothing: a bad value drops it.
KEY_FIELDS = frozenset(
    ("host", "t", "index", "gpu_index", "pid", "step", "size_bytes", "node_id", "state")
)
# Text fields with a closed set of values (a host state drives colours and staleness).
# Keyed by "Class.field": other classes' ``state`` (a NIC port's ACTIVE, a Ray node's ALIVE) is
# plain text.
ENUMS: dict[str, frozenset[str]] = {
    "HostState.state": frozenset(HOST_STATES),
    "JobProcess.state": frozenset(PROC_STATES),
    "SourceStatus.state": frozenset(("up", "slow", "down")),
}
# Text bounds by field name (default untrusted.MAX_TEXT).
TEXT_LIMITS: dict[str, int] = {
    "host": 255,
    "cmd": 4096,
    "path": 4096,
    "text": 4096,
    "error": 2048,
    "reason": 2048,
    "note": 2048,
    "driver_log": 4096,
    "title": 4096,
    "method": 256,
    "user": 64,
    "entrypoint": 4096,
}
# Caps on list lengths by field name; longer lists are cut (and counted as ``cap:``).
LIST_CAPS: dict[str, int] = {
    "gpus": MAX_GPU_INDEX + 1,
    "procs": 4096,
    "job_procs": 4096,
    "lines": 5000,
    "cpu_per_core": 4096,
    "capabilities": 64,
    "hosts": 4096,
    "rows": 256,
    "nodes": 4096,
    "actors": 65536,
}
MAX_METRICS = 4096  # keys of one step's metrics
MAX_CONFIG_KEYS = 20000  # keys of a flattened verl config
MAX_CONFIG_LIST = 1024  # items of one list-valued config key


class Rejected(ValueError):
    """A record refused at the boundary; ``reason`` is the short tag that gets counted."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class _Spec:
    name: str
    kind: str  # str | float | int | bool | list | dict | any
    optional: bool
    item: Any = None  # list item: a kind string or a nested dataclass
    key: bool = False  # a bad value drops the record (or list item)
    required: bool = False  # no default: a missing value drops it too
    lo: float = -_BIG
    hi: float = _BIG
    enum: frozenset[str] | None = None  # the values a closed text field may take


_SPECS: dict[type, tuple[_Spec, ...]] = {}


def _kind(hint: Any) -> tuple[str, bool, Any]:
    """(kind, optional, list item) of a resolved type hint."""
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return "list", optional, item if dataclasses.is_dataclass(item) else _kind(item)[0]
    if origin is dict:
        return "dict", optional, None
    for cls, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if hint is cls:
            return name, optional, None
    return "any", optional, None


def _specs(cls: type) -> tuple[_Spec, ...]:
    specs = _SPECS.get(cls)
    if specs is None:
        import verl_top.model as model_module

        hints = typing.get_type_hints(cls, vars(model_module))
        out = []
        for f in dataclasses.fields(cls):
            kind, optional, item = _kind(hints[f.name])
            lo, hi = RANGES.get(f"{cls.__name__}.{f.name}", RANGES.get(f.name, (-_BIG, _BIG)))
            enum = ENUMS.get(f"{cls.__name__}.{f.name}")
            # ``state`` is a key only where it is an enum (a host's state drives staleness).
            key = f.name in KEY_FIELDS and not optional and (f.name != "state" or enum is not None)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            out.append(_Spec(f.name, kind, optional, item, key, required, lo, hi, enum))
        specs = _SPECS[cls] = tuple(out)
    return specs


_FLAT: dict[type, FlatCheck | None] = {}


def _flat_check(cls: type) -> FlatCheck | None:
    """The compiled check of a record type whose fields are all scalars (flat_validator.py),
    or None: built once per type from the same specs the slow path reads."""
    if cls not in _FLAT:
        fields = [
            FlatField(
                s.name, s.kind, s.optional, s.lo, s.hi, s.enum, TEXT_LIMITS.get(s.name, MAX_TEXT)
            )
            for s in _specs(cls)
        ]
        _FLAT[cls] = compile_flat(cls, fields)
    return _FLAT[cls]


_BAD = object()


def _scalar(
    kind: str, name: str, raw: Any, lo: float, hi: float, enum: frozenset[str] | None = None
) -> Any:
    """The clean value of one scalar, or _BAD."""
    if kind == "float":
        if type(raw) is float and lo <= raw <= hi:  # fast path; NaN fails both comparisons
            return raw
        value = finite(raw, lo, hi)
        # Keep a JSON int an int (round trips stay exact); refuse what is not a number.
        return _BAD if value is None else raw if type(raw) is int else value
    if kind == "int":
        value = bounded_int(raw, int(lo), int(hi))
        return _BAD if value is None else value
    if kind == "str":
        if not isinstance(raw, str):
            return _BAD
        if name == "lines":  # log lines keep their length (up to MAX_LINE) and \r splits
            return clean_line(raw)
        if enum is not None:
            return raw if raw in enum else _BAD
        return clean_text(raw, TEXT_LIMITS.get(name, MAX_TEXT))
    if kind == "bool":
        return raw if isinstance(raw, bool) else _BAD
    return _BAD


def _clean_list(spec: _Spec, raw: Any, where: str, issues: list[str]) -> Any:
    if not isinstance(raw, list):
        return _BAD
    cap = LIST_CAPS.get(spec.name, 4096)
    if len(raw) > cap:
        issues.append(f"cap:{where}.{spec.name}>{cap}")
        raw = raw[:cap]
    if spec.name == "lines":
        try:  # a followed log's chunk: cleaned in one pass, as clean_line would each line
            return clean_lines(raw)
        except TypeError:
            pass  # an item is no string: judged one by one below
    out = []
    bad = False
    # A list of records (dataclasses) or of scalars (``item`` is then a kind string).
    nested = (
        spec.item if isinstance(spec.item, type) and dataclasses.is_dataclass(spec.item) else None
    )
    for item in raw:
        if nested is not None:
            try:
                if not isinstance(item, dict):
                    raise Rejected(f"drop:{where}.{spec.name}")
                out.append(nested(**_clean_fields(nested, item, f"{where}.{spec.name}", issues)))
            except Rejected as exc:
                issues.append(exc.reason)
            continue
        value = _scalar(spec.item, spec.name, item, spec.lo, spec.hi)
        if value is _BAD:
            bad = True
        else:
            out.append(value)
    if bad:
        issues.append(f"field:{where}.{spec.name}")
    return out


def _clean_config_value(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        number = finite(value, -_BIG, _BIG)
        return _BAD if number is None else value
    if isinstance(value, str):
        return clean_text(value, 1024)
    if isinstance(value, dict) and not value:
        return {}  # an empty section (``override_config: {}``) is a leaf of the flat config
    if isinstance(value, list) and depth == 0:
        items = [_clean_config_value(v, 1) for v in value[:MAX_CONFIG_LIST]]
        return [v for v in items if v is not _BAD]
    return _BAD


def _clean_dict(spec: _Spec, raw: Any, where: str, issues: list[str]) -> Any:
    if not isinstance(raw, dict):
        return _BAD
    cap = MAX_METRICS if spec.name == "metrics" else MAX_CONFIG_KEYS
    if len(raw) > cap:
        issues.append(f"cap:{where}.{spec.name}>{cap}")
    out: dict[str, Any] = {}
    bad = False
    for n, (key, value) in enumerate(raw.items()):
        if n >= cap:
            break
        if spec.name == "metrics":
            clean: Any = finite(value, -_BIG, _BIG)
            clean = _BAD if clean is None else value
        else:
            clean = _clean_config_value(value)
        if clean is _BAD or not isinstance(key, str):
            bad = True
            continue
        out[clean_text(key, 256)] = clean
    if bad:
        issues.append(f"field:{where}.{spec.name}")
    return out


def _clean_fields(cls: type, data: dict[str, Any], where: str, issues: list[str]) -> dict[str, Any]:
    """Validated constructor arguments of ``cls`` from a wire dict (unknown keys ignored).

    A bad value of a key field raises Rejected (the record or list item is dropped); any other
    bad value is left out, so the field keeps its default ("no data"), and noted in ``issues``.
    """
    out: dict[str, Any] = {}
    for spec in _specs(cls):
        if spec.name not in data:
            if spec.required:
                raise Rejected(f"drop:{where}.{spec.name}", "missing")
            continue
        raw = data[spec.name]
        if raw is None and spec.optional:
            continue
        kind = spec.kind
        if (
            kind == "float"
            and (type(raw) is float or type(raw) is int)
            and spec.lo <= raw <= spec.hi
        ):
            out[spec.name] = raw  # the common case, as _scalar decides it (NaN fails the range)
            continue
        if kind == "list":
            value = _clean_list(spec, raw, where, issues)
        elif kind == "dict":
            value = _clean_dict(spec, raw, where, issues)
        elif kind == "any":
            value = raw
        else:
            value = _scalar(kind, spec.name, raw, spec.lo, spec.hi, spec.enum)
        if value is _BAD:
            if spec.key:
                raise Rejected(f"drop:{where}.{spec.name}", f"bad value {_show(raw)}")
            issues.append(f"field:{where}.{spec.name}")
            continue
        out[spec.name] = value
    return out


def _show(raw: Any) -> str:
    return clean_text(repr(raw), 60)


def validate(data: Any, issues: list[str] | None = None, *, fast: bool = True) -> Record:
    """The record of a foreign wire dict, every field checked (see docs/protocol.md).

    Raises Rejected (a ValueError) when the line is no record or a key field (host, t, a GPU
    index, a step number, ...) is bad. Other bad fields become "no data" and their reasons are
    appended to ``issues``. Never raises anything else, whatever ``data`` holds. ``fast=False``
    judges every field by the spec table, never by a compiled check (the reference that
    tests/test_flat_validator.py holds the compiled checks to).
    """
    if not isinstance(data, dict):
        raise Rejected("json", "not a JSON object")
    rtype = data.get("type")
    if not isinstance(rtype, str) or (cls := RECORD_TYPES.get(rtype)) is None:
        raise Rejected("type", f"unknown record type {_show(rtype)}")
    version = data.get("v", VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version <= VERSION:
        raise Rejected("version", f"unsupported protocol version {_show(version)}")
    # A GPU sample (or other all-scalar record) whose every field is already clean is kept as
    # is by its compiled check (host and t included); anything else is judged field by field.
    check = _flat_check(cls) if fast and type(data) is dict else None
    if check is not None and (record := check(data)) is not None:
        return record  # cls(...) of the compiled check
    if not isinstance(data.get("host", ""), str):
        raise Rejected(f"drop:{rtype}.host", "host must be a string")
    if not isinstance(data.get("t", 0.0), int | float):
        raise Rejected(f"drop:{rtype}.t", "t must be a number")
    found: list[str] = [] if issues is None else issues
    return cls(**_clean_fields(cls, data, rtype, found))


def from_dict(data: dict[str, Any], issues: list[str] | None = None) -> Record:
    """Build a record from a wire dict, every field validated (see ``validate``).

    Raises ValueError (``Rejected``) when it is not a record; bad non-key fields become "no
    data" and are reported in ``issues``.
    """
    return validate(data, issues)


@dataclass
class Decoder:
    """Decodes foreign lines; counts what it refused, per host and per reason, never raises.

    ``malformed`` counts lines that gave no record. ``drops`` counts every reason (whole records
    refused and fields set to "no data") by (host, reason); ``take_drops`` hands the counts
    not yet reported to the source, which emits them as ``Dropped`` records for the store.
    """

    decoded: int = 0
    malformed: int = 0
    last_error: str = ""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    drops: dict[tuple[str, str], int] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)

    def _count(self, host: str, reason: str) -> None:
        key = (host, reason)
        if key not in self.drops and len(self.drops) >= MAX_DROP_KEYS:
            key = (host, "other")  # bounded: a hostile stream cannot grow the table
        self.drops[key] = self.drops.get(key, 0) + 1
        self.pending[key] = self.pending.get(key, 0) + 1

    def decode(self, line: str | bytes) -> Record | None:
        """The record on ``line``, or None for a blank or refused line."""
        if len(line) > MAX_RECORD_BYTES:
            self._refuse({}, Rejected("size", f"line of {len(line)} bytes"))
            return None
        if isinstance(line, bytes | bytearray):
            line = bytes(line).decode("utf-8", "replace")
        line = line.strip()
        if not line:
            return None
        try:
            data = loads(line, max_bytes=MAX_RECORD_BYTES)
        except UntrustedJSONError as exc:
            self._refuse({}, Rejected("json", str(exc)))
            return None
        return self.decode_dict(data)

    def decode_dict(self, data: Any) -> Record | None:
        """The record of an already parsed wire dict (the in-process agent), or None."""
        issues: list[str] = []
        try:
            record = validate(data, issues)
        except Rejected as exc:
            self._refuse(data, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - the boundary must hold whatever comes
            self._refuse(data, Rejected("error", f"{type(exc).__name__}: {exc}"))
            return None
        for reason in issues:
            self._count(record.host, reason)
        self.decoded += 1
        return record

    def refuse(self, exc: Rejected, host: str = "") -> None:
        """Count a line refused before or after decoding (too long, time out of window)."""
        self._refuse({"host": host}, exc)

    def _refuse(self, data: Any, exc: Rejected) -> None:
        self.malformed += 1
        self.errors_by_kind[exc.reason] = self.errors_by_kind.get(exc.reason, 0) + 1
        self.last_error = clean_text(str(exc), 200)
        host = data.get("host") if isinstance(data, dict) else None
        self._count(clean_text(host, 255) if isinstance(host, str) else "", exc.reason)

    def decode_all(self, lines: Iterable[str | bytes]) -> Iterator[Record]:
        """Decode many lines, skipping the refused ones."""
        for line in lines:
            record = self.decode(line)
            if record is not None:
                yield record

    def take_drops(self, host: str | None = None, t: float = 0.0) -> list[Dropped]:
        """``Dropped`` records for the counts not yet reported (``host`` overrides theirs)."""
        out = [
            Dropped(host=host if host is not None else h, t=t, reason=reason, count=n)
            for (h, reason), n in self.pending.items()
        ]
        self.pending.clear()
        return out


def open_recording(path: str | Path, mode: str = "r") -> IO[str]:
    """Open a recording for text reading/writing; ``.gz`` paths are gzip-compressed."""
    p = Path(path)
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(p, mode.replace("t", "") + "b"), encoding="utf-8")
    return open(p, mode, encoding="utf-8")


def open_recording_bytes(path: str | Path) -> io.BufferedIOBase:
    """Open a recording for reading bytes (decompressed when ``.gz``): the reader decodes each
    line itself, so one bad byte costs that line, not the rest of the file."""
    p = Path(path)
    return gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")  # noqa: SIM115


def read_recording(path: str | Path, decoder: Decoder | None = None) -> list[Record]:
    """All valid records of a recording file (gzip or plain)."""
    decoder = decoder or Decoder()
    with open_recording(path) as fh:
        return list(decoder.decode_all(fh))
