"""Write a snapshot bundle: what verl-top saw and concluded, to attach to a bug report or chat.

A bundle is a directory holding

- ``snapshot.json`` — hosts, GPUs (latest values, window means and the window's series), GPU
  processes with their verl role and rank, verl steps, the job config, probes, NCCL info, log
  events and the diagnosis; schema ``verl-top.snapshot/1`` (``export/schema.py``);
- ``report.md`` — the five-step verdict with evidence, advice and small tables (``report.py``);
- ``recording.ndjson.gz`` — the records behind it, re-encoded from the store, so
  ``verl-top --replay recording.ndjson.gz`` shows the same numbers;
- ``screen.svg`` — the app's screen, when the snapshot was taken from the app.

Everything is redacted (``redact.py``) before it is written. The bundle is written into a
temporary directory next to the target and renamed into place only when complete, so a failure
(permission denied, disk full) never leaves a partial bundle, and ``force`` replaces an old
bundle only once the new one is whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from stat import S_ISREG
from typing import Any

from verl_top import __version__
from verl_top.assessment import Assessment
from verl_top.export.environment import collect_environment
from verl_top.export.redact import REDACTED, redact_mapping, redact_text, redact_tree
from verl_top.export.redact import rules as redaction_rules
from verl_top.export.schema import SNAPSHOT_VERSION
from verl_top.model import (
    ClockOffset,
    Dropped,
    GpuSample,
    Heartbeat,
    HostSample,
    HostState,
    LogLines,
    Record,
    RolloutSample,
    VerlConfig,
    clock_reason_names,
)
from verl_top.protocol import encode, from_dict, to_dict
from verl_top.roles import annotate, classify, process_map
from verl_top.stacks import render_text as stacks_text
from verl_top.stacks import to_json as stacks_json
from verl_top.store import (
    GPU_DERIVED,
    GPU_METRICS,
    HOST_METRICS,
    ROLLOUT_METRICS,
    GpuEntry,
    HostEntry,
    RolloutEntry,
    Store,
)

SNAPSHOT_FILE = "snapshot.json"
REPORT_FILE = "report.md"
RECORDING_FILE = "recording.ndjson.gz"
STACKS_FILE = "stacks.txt"
SCREEN_FILE = "screen.svg"
# Written last into every bundle: the proof that verl-top wrote the directory. ``--force``
# replaces only a directory whose every entry this manifest lists.
MANIFEST_FILE = "verl-top-manifest.json"
MANIFEST_KIND = "verl-top.snapshot-manifest/2"  # /2: each file with its type and size

MIN_STEPS = 20  # snapshot.json keeps at least this many last steps, even if older than the window


class SnapshotError(Exception):
    """The bundle could not be written; the message says where and why, in one sentence."""


# -- helpers ---------------------------------------------------------------------------------


def _num(x: float | None) -> float | None:
    """JSON-safe number: NaN / inf -> None."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x


def _clean(value: Any) -> Any:
    """A JSON-safe copy of a tree: NaN/inf -> None, tuples -> lists."""
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _iso(t: float | None) -> str:
    if not t:
        return ""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _fields(record: Any) -> dict[str, Any]:
    """A record's wire fields without the ``v`` / ``type`` tags (None fields left out)."""
    if not isinstance(record, Record):
        return {k: v for k, v in dataclasses.asdict(record).items() if v is not None}
    d = to_dict(record)
    d.pop("v", None)
    d.pop("type", None)
    return d


def redact_record(record: Record) -> Record:
    """A copy of ``record`` with every secret it carries replaced (config keys by name too)."""
    if isinstance(record, GpuSample | HostSample | Heartbeat):
        # Numbers only (and a phase label): the common case, kept fast.
        if isinstance(record, GpuSample) and record.label:
            label = redact_text(record.label)
            return record if label == record.label else dataclasses.replace(record, label=label)
        return record
    data = to_dict(record)
    if isinstance(record, VerlConfig):
        data["values"] = redact_mapping(record.values)
    return from_dict(redact_tree(data))


# -- the recording ----------------------------------------------------------------------------


def _gpu_samples(store: Store, entry: GpuEntry, since: float) -> list[GpuSample]:
    """GPU samples of the window rebuilt from the ring columns (the latest one verbatim)."""
    ring = entry.history
    latest = entry.latest
    times, labels = ring.label_series(since)
    cols = {c: ring.series(c, since)[1] for c in GPU_METRICS}
    reasons = ring.series("clock_reasons", since)[1]
    out: list[GpuSample] = []
    for i, t in enumerate(times):
        bits = reasons[i]
        # GpuSample's float fields by column name (NaN: no data).
        values: dict[str, Any] = {
            c: (None if math.isnan(v := cols[c][i]) else v) for c in GPU_METRICS
        }
        out.append(
            GpuSample(
                host=entry.host,
                t=t,
                index=entry.index,
                mem_total_mib=latest.mem_total_mib if latest else None,
                power_limit_w=latest.power_limit_w if latest else None,
                clock_reasons=None if math.isnan(bits) else int(bits),
                label=labels[i],
                **values,
            )
        )
    if latest is not None:
        if out and out[-1].t == latest.t:
            out[-1] = latest
        elif not out or latest.t < out[0].t:
            out.insert(0, latest)  # went silent before the window: keep its last word
    return out


def _host_samples(entry: HostEntry, since: float) -> list[HostSample]:
    """Host samples of the window rebuilt from the ring columns (the latest one verbatim)."""
    ring = entry.history
    latest = entry.latest
    times, _ = ring.series(HOST_METRICS[0], since)
    cols = {c: ring.series(c, since)[1] for c in HOST_METRICS}
    out: list[HostSample] = []
    for i, t in enumerate(times):
        values: dict[str, Any] = {
            c: (None if math.isnan(v := cols[c][i]) else v) for c in HOST_METRICS
        }
        if values["mem_used_bytes"] is not None:
            values["mem_used_bytes"] = int(values["mem_used_bytes"])
        # The ring keeps only the busiest core: replayed as such (not as a one-core list,
        # which the node screen drew as "1 cores").
        values["cpu_max_core_pct"] = values.pop("cpu_max_core", None)
        out.append(
            HostSample(
                host=entry.name,
                t=t,
                mem_total_bytes=latest.mem_total_bytes if latest else None,
                **values,
            )
        )
    if latest is not None:
        if out and out[-1].t == latest.t:
            out[-1] = latest
        elif not out or latest.t < out[0].t:
            out.insert(0, latest)
    return out


def _rollout_samples(entry: RolloutEntry, since: float) -> list[RolloutSample]:
    """A rollout server's samples of the window rebuilt from its ring (--prometheus)."""
    latest = entry.latest
    times, _ = entry.history.series(ROLLOUT_METRICS[0], since)
    cols = {c: entry.history.series(c, since)[1] for c in ROLLOUT_METRICS}
    return [
        RolloutSample(
            host=entry.name,
            t=t,
            server=latest.server if latest else "",
            model=latest.model if latest else "",
            **{c: (None if math.isnan(v := cols[c][i]) else v) for c in ROLLOUT_METRICS},
        )
        for i, t in enumerate(times)
    ]


def _topology_json(store: Store) -> list[dict[str, Any]]:
    """Each host's topology record with its marked GPUs (NVLinks down, across a socket)."""
    from verl_top.nccl.topo import topology_marks

    out = []
    for rec in store.node_topology.values():
        d = _fields(rec)
        d["marks"] = [{"gpu": m.gpu, "text": m.text} for m in topology_marks(rec)]
        out.append(d)
    return out


def recording_records(store: Store) -> list[Record]:
    """Every record needed to replay what the store shows, oldest first, redacted.

    Hellos and the config come first, then the window's GPU / host samples with the latest
    process lists, heartbeats, all kept steps, probes, NCCL info and events in time order, then
    each host's log tail at the data time and its final state.
    """
    since = store.window_start()
    head: list[Record] = [h.hello for h in store.hosts.values() if h.hello is not None]
    head.extend(store.node_topology.values())  # once per connection, like hello
    body: list[Record] = []
    for h in store.hosts.values():
        body.extend(_host_samples(h, since))
        for index in sorted(h.gpus):
            body.extend(_gpu_samples(store, h.gpus[index], since))
        if h.procs is not None:
            body.append(h.procs)
        if h.heartbeat is not None:
            body.append(h.heartbeat)
    for entry in store.rollout.values():
        body.extend(_rollout_samples(entry, since))
    body.extend(store.steps)
    body.extend(store.probes)
    body.extend(store.nccl.values())
    body.extend(store.events)
    body.sort(key=lambda r: r.t)
    if store.config:
        first_t = min((r.t for r in head + body if r.t), default=store.now)
        head.append(VerlConfig(t=first_t, values=dict(store.config), source=store.config_source))
    tail: list[Record] = []
    for h in store.hosts.values():
        if h.log_tail:
            tail.append(LogLines(host=h.name, t=store.now, kind="tail", lines=list(h.log_tail)))
    last_t = max((r.t for r in head + body + tail), default=0.0)
    if store.hosts and store.now and last_t < store.now:
        # Some record we do not keep (a raw log chunk) set the data time: mark it.
        tail.append(LogLines(host=next(iter(store.hosts)), t=store.now, kind="mark"))
    for h in store.hosts.values():
        tail.append(HostState(host=h.name, t=store.now, state=h.state, reason=h.reason))
        if h.clock_offset is not None:
            tail.append(ClockOffset(host=h.name, t=store.now, offset=h.clock_offset))
    for host, reasons in store.drops.items():  # what the boundary refused replays as counted
        tail.extend(Dropped(host=host, t=store.now, reason=r, count=n) for r, n in reasons.items())
    return [redact_record(r) for r in head + body + tail]


# -- snapshot.json ----------------------------------------------------------------------------


def _series(ring: Any, columns: Iterable[str], since: float) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    times: list[float] = []
    for c in columns:
        times, vs = ring.series(c, since)
        out[c] = [_num(v) for v in vs]
    return {"t": times, **out}


def _hello_json(entry: HostEntry) -> dict[str, Any] | None:
    if entry.hello is None:
        return None
    d = _fields(entry.hello)
    d.pop("host", None)
    return d


def _host_json(store: Store, entry: HostEntry, since: float) -> dict[str, Any]:
    return {
        "name": entry.name,
        "state": entry.state,
        "reason": entry.reason,
        "last_t": entry.last_t,
        "hello": _hello_json(entry),
        "latest": _fields(entry.latest) if entry.latest is not None else None,
        "series": _series(entry.history, HOST_METRICS, since),
    }


def _gpu_json(store: Store, entry: GpuEntry, since: float, names: dict[int, str]) -> dict[str, Any]:
    columns = GPU_METRICS + GPU_DERIVED
    latest: dict[str, Any] | None = None
    reasons: list[str] = []
    if entry.latest is not None:
        latest = _fields(entry.latest)
        latest["activity"] = entry.latest.activity
        latest["throttled"] = entry.latest.throttled
        reasons = clock_reason_names(entry.latest.clock_reasons)
    series = _series(entry.history, columns, since)
    series["label"] = entry.history.label_series(since)[1]
    return {
        "host": entry.host,
        "index": entry.index,
        "name": names.get(entry.index, ""),
        "latest": latest,
        "throttle_reasons": reasons,
        "means": {c: _num(store.gpu_mean(entry, c)) for c in columns},
        "series": series,
    }


def _processes_json(store: Store) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for h in store.hosts.values():
        if h.procs is None:
            continue
        for p in annotate(h.procs).procs:
            d = _fields(p)
            d.update(
                host=h.name, t=h.procs.t, method=classify(p.cmd).method, rank=p.rank, role=p.role
            )
            out.append(d)
    return out


def _process_map_json(store: Store) -> list[dict[str, Any]]:
    """Every process of the job as verl names it: GPU processes with their GPUs, GPU memory,
    rank and current method, then the job's Ray actors that hold no GPU (TaskRunner, ...)."""
    procs = {h.name: h.procs for h in store.hosts.values()}
    out = []
    for m in process_map(procs, store.ray_actors):
        d = _fields(m)
        d["gpus"] = list(m.gpus)
        d["cmd"] = redact_text(m.cmd)
        out.append(d)
    return out


def snapshot_steps(store: Store) -> list[Any]:
    """The window's steps, or the last ``MIN_STEPS`` when the window holds fewer."""
    since = store.window_start()
    steps = list(store.steps)
    in_window = [s for s in steps if s.t >= since]
    return in_window if len(in_window) >= MIN_STEPS else steps[-MIN_STEPS:]


def diagnosis_json(assessment: Assessment | None) -> dict[str, Any] | None:
    """The assessment as ``verl-top diagnose --json`` prints it (None: no diagnosis ran)."""
    if assessment is None or assessment.verdict is None:
        return None
    from verl_top.diagnosis.report import to_json

    return to_json(assessment)


def build_snapshot(
    store: Store, assessment: Assessment | None, now: float | None = None, screen: bool = False
) -> dict[str, Any]:
    """The ``snapshot.json`` document (redacted, JSON-safe)."""
    created = time.time() if now is None else now
    since = store.window_start()
    hosts = list(store.hosts.values())
    gpus: list[dict[str, Any]] = []
    for h in hosts:
        names = {g.index: g.name for g in h.hello.gpus} if h.hello else {}
        gpus.extend(_gpu_json(store, h.gpus[i], since, names) for i in sorted(h.gpus))
    doc = {
        "schema": SNAPSHOT_VERSION,
        "tool": {"name": "verl-top", "version": __version__},
        "created": created,
        "created_iso": _iso(created),
        "data_time": store.now,
        "data_time_iso": _iso(store.now),
        "mode": "replay" if store.replay else "live",
        "window": {
            "seconds": store.limits.window_s,
            "start": since,
            "end": store.now,
            "points": store.limits.points,
        },
        "hosts": [_host_json(store, h, since) for h in hosts],
        "gpus": gpus,
        "processes": _processes_json(store),
        "process_map": _process_map_json(store),
        "steps": [_fields(s) for s in snapshot_steps(store)],
        "config": {"source": store.config_source, "values": redact_mapping(store.config)},
        "probes": [_fields(p) for p in store.probes],
        "nccl": [_fields(n) for n in store.nccl.values()],
        "topology": _topology_json(store),
        "events": [_fields(e) for e in store.events],
        # versions, launch command, last error lines: what a verl maintainer asks for first
        "environment": collect_environment(store).as_dict(),
        "diagnosis": diagnosis_json(assessment),
        # Python stacks collected in this session (stacks.txt groups them by role).
        "stacks": stacks_json(store.stacks),
        "files": {
            "report": REPORT_FILE,
            "recording": RECORDING_FILE,
            "screen": SCREEN_FILE if screen else None,
            "stacks": STACKS_FILE if store.stacks else None,
        },
        "notes": list(store.notes),
        "inputs": store.input_health(),  # refused input per host and reason, clock offsets
    }
    doc = redact_tree(_clean(doc))
    # Added after the pass: the rules' own wording would otherwise be "redacted".
    doc["redaction"] = {"placeholder": REDACTED, "rules": redaction_rules()}
    return doc


# -- writing ----------------------------------------------------------------------------------


class _FdWriter:
    """A minimal binary file object over an OS file descriptor (all writes via ``os.write``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass


def _open_fd(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def _write_file(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to a new file and flush it to disk."""
    fd = _open_fd(path)
    try:
        out = _FdWriter(fd)
        for chunk in chunks:
            out.write(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_gzip(path: Path, lines: Iterator[str]) -> None:
    """Write text lines gzip-compressed (fixed mtime, so equal content gives equal bytes)."""
    fd = _open_fd(path)
    try:
        with gzip.GzipFile(filename="", mode="wb", fileobj=_FdWriter(fd), mtime=0) as gz:
            batch: list[str] = []
            for line in lines:
                batch.append(line)
                if len(batch) >= 1000:
                    gz.write("".join(batch).encode())
                    batch.clear()
            gz.write("".join(batch).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(exc: OSError) -> str:
    """One plain phrase for an OS error."""
    code = exc.errno
    if code == errno.ENOSPC:
        return "no space left on the device"
    if code == errno.EDQUOT:
        return "disk quota exceeded"
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if code == errno.EROFS:
        return "the file system is read-only"
    if code == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    return exc.strerror or str(exc)


def _check_target(target: Path, force: bool) -> dict[str, int] | None:
    """What may be removed at ``target`` (the previous bundle's files, name -> size), ``{}``
    for an empty directory, None when there is nothing there; raise when it may not be written.

    With ``force``, a non-empty directory is replaced only when it is a bundle verl-top wrote:
    every entry in it is a regular file its manifest lists with that very size, and neither the
    directory nor an entry is a symbolic link. Anything else (``-o . --force`` in a project
    folder, a forged manifest naming a directory or another file) is refused, nothing deleted.
    """
    try:
        if not os.path.lexists(target):
            return None
        if target.is_symlink():
            raise SnapshotError(
                f"{target} is a symbolic link; verl-top writes a snapshot only into a real "
                "directory (give the path it points to)"
            )
        if not target.is_dir():
            raise SnapshotError(f"{target} exists and is not a directory")
        entries = {e.name: e for e in os.scandir(target)}
    except OSError as exc:
        raise SnapshotError(f"cannot use {target}: {_reason(exc)}") from exc
    if not entries:
        return {}
    if not force:
        raise SnapshotError(f"{target} exists; use --force to overwrite")
    listed = _manifest_files(target)
    foreign = sorted(name for name, entry in entries.items() if not _vouched(entry, listed))
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise SnapshotError(
            f"{target} holds files verl-top did not write ({shown}); --force only replaces a "
            "previous snapshot (one with a verl-top-manifest.json listing each of its files "
            "with its size): choose a new directory"
        )
    return listed


def _vouched(entry: os.DirEntry[str], listed: Mapping[str, int]) -> bool:
    """True when ``entry`` is a regular file (not a link) the manifest lists with its size."""
    try:
        if not entry.is_file(follow_symlinks=False):
            return False
        size = entry.stat(follow_symlinks=False).st_size
    except OSError:
        return False
    return listed.get(entry.name) == size


def _manifest_files(target: Path) -> dict[str, int]:
    """name -> size of each file a bundle's manifest vouches for (itself included, by its own
    size); empty without a valid manifest. Manifests before issue 31 listed names only: they
    vouch for nothing (such an old bundle is removed by hand)."""
    path = target / MANIFEST_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode) or stat.st_size > 1 << 20:
            return {}
        doc = json.loads(os.read(fd, stat.st_size + 1).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        return {}
    files = doc.get("files")
    if not isinstance(files, list):
        return {}
    out: dict[str, int] = {}
    for item in files:
        if not isinstance(item, dict) or item.get("type") != "file":
            return {}
        name, size = item.get("name"), item.get("size")
        if not isinstance(name, str) or "/" in name or name in ("", ".", "..", MANIFEST_FILE):
            return {}
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return {}
        out[name] = size
    return {**out, MANIFEST_FILE: stat.st_size}


def _write_manifest(tmp: Path, created: float) -> None:
    files = [
        {"name": e.name, "type": "file", "size": e.stat(follow_symlinks=False).st_size}
        for e in sorted(os.scandir(tmp), key=lambda e: e.name)
    ]
    doc = {"kind": MANIFEST_KIND, "tool": "verl-top", "version": __version__, "created": created}
    doc["files"] = files
    _write_file(tmp / MANIFEST_FILE, [(json.dumps(doc, indent=1) + "\n").encode()])


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While the bundle is written, SIGTERM unwinds like Ctrl-C, so the temporary directory
    is removed (the default action would kill the process and leave it behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fill(
    tmp: Path,
    store: Store,
    assessment: Assessment | None,
    screen_svg: str | None,
    created: float,
) -> None:
    from verl_top.export.report import build_report

    doc = build_snapshot(store, assessment, now=created, screen=screen_svg is not None)
    # Compact: the series make up most of it; `jq .` pretty-prints when a person reads it.
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, ensure_ascii=False) + "\n"
    _write_file(tmp / SNAPSHOT_FILE, [text.encode()])
    report = build_report(store, assessment, doc, screen=screen_svg is not None)
    _write_file(tmp / REPORT_FILE, [report.encode()])
    records = recording_records(store)
    _write_gzip(tmp / RECORDING_FILE, (encode(r) + "\n" for r in records))
    if screen_svg is not None:
        _write_file(tmp / SCREEN_FILE, [redact_text(screen_svg).encode()])
    if store.stacks:
        _write_file(tmp / STACKS_FILE, [redact_text(stacks_text(store.stacks)).encode()])


def _install(tmp: Path, target: Path, previous: dict[str, int] | None) -> None:
    """Rename the finished bundle into place; an old one is removed only after the swap, file
    by file: only regular files its manifest lists with their size (checked again, without
    following a link), then the emptied directory. Nothing else is ever deleted."""
    if previous is None:
        os.replace(tmp, target)
        return
    if not previous:  # an empty directory: it was checked to be a real one
        os.rmdir(target)
        os.replace(tmp, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rmdir(old)  # only the unique name is wanted: rename needs a free slot
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        os.replace(old, target)  # put the old bundle back
        raise
    left = _remove_bundle(old, previous)
    if left:
        raise SnapshotError(
            f"the new snapshot is in {target}, but the previous one, moved to {old}, now holds "
            f"what its manifest does not list ({', '.join(left[:5])}); it was kept: look at it "
            "and remove it yourself"
        )


def _remove_bundle(path: Path, listed: Mapping[str, int]) -> list[str]:
    """Unlink the files of an old bundle that its manifest vouches for, then the directory; the
    names left when something else appeared meanwhile (then the directory stays)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    left: list[str] = []
    try:
        for entry in os.scandir(fd):
            st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            if S_ISREG(st.st_mode) and listed.get(entry.name) == st.st_size:
                os.unlink(entry.name, dir_fd=fd)
            else:
                left.append(entry.name)
    finally:
        os.close(fd)
    if not left:
        os.rmdir(path)
    return sorted(left)


def check_output(output_dir: str | os.PathLike[str], force: bool = False) -> None:
    """Raise ``SnapshotError`` now when ``output_dir`` could not take a bundle (it exists and
    ``force`` is not given, it is a link, a file, or holds files verl-top did not write): the
    user learns it before the collection, not after it. ``write_snapshot`` checks again."""
    _check_target(Path(output_dir).expanduser().absolute(), force)


def write_snapshot(
    store: Store,
    assessment: Assessment | None,
    output_dir: str | os.PathLike[str],
    force: bool = False,
    screen_svg: str | None = None,
    now: float | None = None,
) -> Path:
    """Write the bundle to ``output_dir`` and return its path; raise ``SnapshotError``.

    ``assessment`` is the monitor's Assessment (None: no diagnosis ran); ``screen_svg`` the app's screenshot
    (``App.export_screenshot()``), written as ``screen.svg`` when given; ``now`` the creation
    time (default: the wall clock). An existing non-empty directory is replaced only with
    ``force``, and only after the new bundle is complete.
    """
    target = Path(output_dir).expanduser().absolute()
    previous = _check_target(target, force)
    created = time.time() if now is None else now
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as exc:
        raise SnapshotError(f"cannot write the snapshot to {target}: {_reason(exc)}") from exc
    try:
        with _sigterm_as_exit():
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a bundle is meant to be read and shared
            _fill(tmp, store, assessment, screen_svg, created)
            _write_manifest(tmp, created)
            _fsync_dir(tmp)
            _install(tmp, target, previous)
            _fsync_dir(target.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SnapshotError(f"cannot write the snapshot to {target}: {_reason(exc)}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
