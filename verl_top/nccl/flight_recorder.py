"""PyTorch's NCCL Flight Recorder dumps: the last collective of every rank, and where ranks
disagree.

With ``TORCH_NCCL_TRACE_BUFFER_SIZE=2000`` (``TORCH_FR_BUFFER_SIZE`` in newer torch) and
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, every rank writes its ring buffer of collectives when the
watchdog fires, one file per rank named ``<prefix><rank>`` (prefix ``/tmp/nccl_trace_rank_`` by
default, ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` / ``TORCH_FR_DUMP_TEMP_FILE`` to change it). The file
is a pickled dict (``_dump_nccl_trace`` / ``_dump_fr_trace``), or JSON (``_dump_fr_trace_json``):
``version``, ``pg_config`` (process groups and their ranks), ``pg_status`` (last enqueued /
started / completed collective per group) and ``entries`` (``collective_seq_id``,
``profiling_name`` such as ``nccl:all_reduce``, ``state`` scheduled / started / completed,
``process_group`` (name, description), sizes, ``frames`` of the Python stack, ...). Field names
from PyTorch's flight recorder tutorial and a dump made by torch 2.13 (tests/fixtures/
flight_recorder/).

A dump is foreign data: it is read with an unpickler that refuses every global (only dicts,
lists, tuples, strings and numbers come out, nothing is imported or called), at most
``MAX_DUMP_BYTES``, the last ``MAX_ENTRIES`` entries, every string cleaned and bounded.

    python -m verl_top.nccl.flight_recorder /tmp/nccl_trace_rank_*
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_top.untrusted import UntrustedJSONError, bounded_int, clean_text, loads

MAX_DUMP_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 4096  # the buffer PyTorch recommends is 2000
MAX_FRAMES = 8
MAX_DUMPS = 4096
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.\w+)?$")
ENV_HINT = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (one file per rank, "
    "/tmp/nccl_trace_rank_<N>; TORCH_NCCL_DEBUG_INFO_TEMP_FILE sets the prefix)"
)


class FlightRecorderError(ValueError):
    """A dump that cannot be read, with the reason in plain words."""


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load {clean_text(module, 80)}.{clean_text(name, 80)}: a Flight "
            "Recorder dump holds plain data only"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent reference")


def decode(data: bytes) -> Any:
    """The dump's top-level object from pickle or JSON bytes (no global is ever resolved)."""
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return loads(data.decode("utf-8", "replace"), max_bytes=MAX_DUMP_BYTES)
        except UntrustedJSONError as exc:
            raise FlightRecorderError(f"not a Flight Recorder JSON dump: {exc}") from None
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        why = clean_text(str(exc), 200)
        raise FlightRecorderError(
            why if why.startswith("refused") else f"not a Flight Recorder dump ({why})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated or hostile bytes must not escape
        raise FlightRecorderError(
            f"not a Flight Recorder dump (pickle: {type(exc).__name__})"
        ) from None


@dataclass(frozen=True)
class Entry:
    """One collective (or p2p op) a rank recorded."""

    pg: str  # process group name ("0")
    pg_desc: str  # "default_pg"
    seq: int | None  # collective_seq_id (p2p_seq_id for p2p ops)
    op: str  # "nccl:all_reduce"
    state: str  # scheduled | started | completed
    sizes: str  # "[[3, 4]]"
    is_p2p: bool = False
    timeout_ms: int | None = None
    where: str = ""  # the innermost frame outside torch: "run at crash.py:44"


@dataclass
class Dump:
    """One rank's dump."""

    path: str
    rank: int | None
    version: str
    entries: list[Entry] = field(default_factory=list)
    pg_ranks: dict[str, str] = field(default_factory=dict)  # pg name -> "[0, 1]"
    # pg name -> (last enqueued, last started, last completed collective)
    pg_status: dict[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    dropped_entries: int = 0  # entries beyond MAX_ENTRIES, oldest first, left out


def rank_of(path: str) -> int | None:
    """The rank a dump's file name ends with (``nccl_trace_rank_3``, ``fr_rank_0.pkl``)."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _int(value: Any) -> int | None:
    return bounded_int(value, -(2**62), 2**62)


def _where(frames: Any) -> str:
    """The first frame outside torch's own files, as ``name at file:line``."""
    if not isinstance(frames, list | tuple):
        return ""
    for fr in frames[:MAX_FRAMES]:
        if not isinstance(fr, dict):
            continue
        filename = clean_text(fr.get("filename"), 200)
        if "/torch/" in filename:
            continue
        return f"{clean_text(fr.get('name'), 80)} at {filename}:{_int(fr.get('line'))}"
    return ""


def _entry(raw: Any) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    pg = raw.get("process_group")
    name, desc = (pg[0], pg[1]) if isinstance(pg, list | tuple) and len(pg) >= 2 else (pg, "")
    is_p2p = raw.get("is_p2p") is True
    seq = _int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id"))
    return Entry(
        pg=clean_text(name if name is not None else raw.get("pg_id"), 64),
        pg_desc=clean_text(desc, 64),
        seq=seq,
        op=clean_text(raw.get("profiling_name"), 80),
        state=clean_text(raw.get("state"), 32),
        sizes=clean_text(json.dumps(raw.get("input_sizes"), default=str)[:200], 200),
        is_p2p=is_p2p,
        timeout_ms=_int(raw.get("timeout_ms")),
        where=_where(raw.get("frames")),
    )


def parse(obj: Any, path: str, rank: int | None = None) -> Dump:
    """A ``Dump`` from the decoded top-level object of one rank's file."""
    if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
        raise FlightRecorderError("not a Flight Recorder dump: no 'entries' list")
    raw = obj["entries"]
    dump = Dump(
        path=clean_text(path, 4096),
        rank=rank if rank is not None else rank_of(path),
        version=clean_text(obj.get("version"), 32),
        dropped_entries=max(0, len(raw) - MAX_ENTRIES),
    )
    dump.entries = [e for r in raw[-MAX_ENTRIES:] if (e := _entry(r)) is not None]
    config = obj.get("pg_config")
    if isinstance(config, dict):
        for key, pg in list(config.items())[:MAX_DUMPS]:
            if isinstance(pg, dict):
                dump.pg_ranks[clean_text(pg.get("name") or key, 64)] = clean_text(
                    pg.get("ranks"), 512
                )
    status = obj.get("pg_status")
    if isinstance(status, dict):
        for key, st in list(status.items())[:MAX_DUMPS]:
            if isinstance(st, dict):
                dump.pg_status[clean_text(key, 64)] = (
                    _int(st.get("last_enqueued_collective")),
                    _int(st.get("last_started_collective")),
                    _int(st.get("last_completed_collective")),
                )
    return dump


def read_dump(path: str | Path, max_bytes: int = MAX_DUMP_BYTES) -> Dump:
    """Read one rank's dump file (pickle or JSON), bounded; FlightRecorderError says why not."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise FlightRecorderError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise FlightRecorderError(f"{p}: larger than {max_bytes // 2**20} MiB; not read")
    try:
        return parse(decode(data), str(p))
    except FlightRecorderError as exc:
        raise FlightRecorderError(f"{p}: {exc}") from None


@dataclass(frozen=True)
class Last:
    """A rank's last collective in one process group."""

    rank: int | None
    pg: str
    entry: Entry


@dataclass
class Comparison:
    """The ranks' last collectives per process group and where they part."""

    last: list[Last]
    # pg -> (the furthest seq, its op, ranks that reached it, ranks behind it (their last seq))
    behind: dict[str, tuple[int, str, list[int], dict[int, int]]]
    mismatched: list[str]  # "pg 0 seq 5: rank 0 nccl:all_reduce, rank 1 nccl:broadcast"


def compare(dumps: Sequence[Dump]) -> Comparison:
    """Last collective per rank and group; ranks that stopped short of the furthest one; ranks
    that ran different collectives under the same sequence number (a desync)."""
    last: list[Last] = []
    by_pg: dict[str, dict[int, Entry]] = {}
    ops: dict[tuple[str, int], dict[int, str]] = {}
    for d in dumps:
        mine: dict[str, Entry] = {}
        for e in d.entries:
            if e.is_p2p or e.seq is None:
                continue
            mine[e.pg] = e
            if d.rank is not None:
                ops.setdefault((e.pg, e.seq), {})[d.rank] = e.op
        for pg, e in sorted(mine.items()):
            last.append(Last(d.rank, pg, e))
            if d.rank is not None:
                by_pg.setdefault(pg, {})[d.rank] = e
    behind: dict[str, tuple[int, str, list[int], dict[int, int]]] = {}
    for pg, ranks in by_pg.items():
        top = max(e.seq or 0 for e in ranks.values())
        ahead = sorted(r for r, e in ranks.items() if e.seq == top)
        late = {r: e.seq or 0 for r, e in ranks.items() if (e.seq or 0) < top}
        if late:
            behind[pg] = (top, ranks[ahead[0]].op, ahead, dict(sorted(late.items())))
    mismatched = [
        f"process group {pg} collective {seq}: "
        + ", ".join(f"rank {r} {op}" for r, op in sorted(per.items()))
        for (pg, seq), per in sorted(ops.items())
        if len(set(per.values())) > 1
    ]
    return Comparison(last, behind, mismatched[:20])


def report(dumps: Sequence[Dump], errors: Iterable[str] = ()) -> list[str]:
    """Lines for people: each rank's last collective, then where ranks disagree."""
    cmp = compare(dumps)
    lines = [f"{len(dumps)} dump(s) read" + (f", version {dumps[0].version}" if dumps else "")]
    lines += [f"unreadable: {e}" for e in errors]
    for item in sorted(cmp.last, key=lambda x: (x.pg, x.rank if x.rank is not None else -1)):
        e = item.entry
        who = f"rank {item.rank}" if item.rank is not None else "rank ?"
        desc = f" ({e.pg_desc})" if e.pg_desc else ""
        at = f", at {e.where}" if e.where else ""
        lines.append(
            f"{who} group {item.pg}{desc}: last collective {e.seq} {e.op} {e.state}, "
            f"sizes {e.sizes}{at}"
        )
    for pg, (top, op, ahead, late) in sorted(cmp.behind.items()):
        late_text = ", ".join(f"rank {r} (last {s})" for r, s in late.items())
        who = ("rank " if len(ahead) == 1 else "ranks ") + ", ".join(map(str, ahead[:16]))
        lines.append(
            f"group {pg}: {who} entered collective {top} ({op}); never joined it: {late_text}"
        )
    lines += [f"desync: {m}" for m in cmp.mismatched]
    if not cmp.behind and not cmp.mismatched and dumps:
        lines.append("all ranks agree on their last collective in every group")
    return lines


def dump_files(paths: Iterable[str]) -> list[Path]:
    """The files named, and the files inside the directories named (one level)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        out += sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p]
    return out[:MAX_DUMPS]


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_top.nccl.flight_recorder FILE|DIR ...``: print the comparison."""
    ap = argparse.ArgumentParser(
        prog="python -m verl_top.nccl.flight_recorder",
        description="Last collective per rank from PyTorch NCCL Flight Recorder dumps.",
    )
    ap.add_argument("paths", nargs="+", help="dump files (one per rank) or their directory")
    args = ap.parse_args(argv)
    dumps, errors = [], []
    for path in dump_files(args.paths):
        try:
            dumps.append(read_dump(path))
        except FlightRecorderError as exc:
            errors.append(str(exc))
    for line in report(dumps, errors):
        print(line)
    if not dumps:
        print(f"no dump read; to get them next time set {ENV_HINT}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
