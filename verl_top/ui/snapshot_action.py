"""Key ``s`` (and the palette's "Export snapshot"): write a snapshot bundle of the live session.

The screenshot is taken and the store frozen on the event loop (both are quick and must see one
consistent moment); the bundle is then written by ``export.snapshot.write_snapshot`` in a thread
worker, so disk I/O never blocks the UI. The sources keep writing to the live store meanwhile,
which is why the writer gets a frozen copy: iterating dicts and deques that the event loop is
appending to would fail ("changed size during iteration") or mix two moments.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from verl_top.assessment import Assessment
from verl_top.export.snapshot import SnapshotError, write_snapshot
from verl_top.store import GpuEntry, HostEntry, Ring, Store

DIR_PREFIX = "verl-top-snapshot-"


def default_snapshot_dir(now: float | None = None, base: Path | None = None) -> Path:
    """``./verl-top-snapshot-YYYYmmdd-HHMMSS`` (local time) under ``base`` (default: the cwd)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return (Path.cwd() if base is None else base) / f"{DIR_PREFIX}{stamp}"


def _copy_ring(ring: Ring) -> Ring:
    """An independent copy of a ring (arrays are copied in C)."""
    out = copy.copy(ring)
    out.times = ring.times[:]
    out.cols = {name: col[:] for name, col in ring.cols.items()}
    out.labels = None if ring.labels is None else ring.labels[:]
    return out


def _copy_host(h: HostEntry) -> HostEntry:
    gpus = {
        i: GpuEntry(host=g.host, index=g.index, history=_copy_ring(g.history), latest=g.latest)
        for i, g in h.gpus.items()
    }
    return replace(
        h,
        history=_copy_ring(h.history),
        gpus=gpus,
        log_tail=deque(h.log_tail, maxlen=h.log_tail.maxlen),
    )


def freeze_store(store: Store) -> Store:
    """A copy of ``store`` that later ingests do not touch, for a writer thread to read.

    Records are shared, not copied: the store replaces them and never mutates one in place.
    Containers are copied generically, so attributes added later (``topology``) come along.
    """
    frozen = copy.copy(store)
    for name, value in vars(store).items():
        if isinstance(value, deque):
            setattr(frozen, name, deque(value, maxlen=value.maxlen))
        elif isinstance(value, dict):
            setattr(frozen, name, dict(value))
        elif isinstance(value, list):
            setattr(frozen, name, list(value))
    frozen.hosts = {name: _copy_host(h) for name, h in store.hosts.items()}
    return frozen


@dataclass
class SnapshotOutcome:
    """What the last export did (for the app's notifications and for tests)."""

    path: Path | None = None
    error: str = ""


class SnapshotExporter:
    """Runs one snapshot export at a time for an app, reporting through notifications."""

    def __init__(self, app: Any, directory: Callable[[], Path] = default_snapshot_dir) -> None:
        self.app = app
        self.directory = directory
        self.busy = False
        self.last: SnapshotOutcome | None = None
        self.exports = 0

    def start(self) -> bool:
        """Take the screenshot, freeze the store and start the writer; False if one is running."""
        app = self.app
        if self.busy:
            app.notify("a snapshot is already being written", severity="warning", markup=False)
            return False
        try:
            target = self.directory()
            svg = app.export_screenshot()
            frozen = freeze_store(app.store)
            assessment = app.assessment
        except Exception as exc:  # noqa: BLE001 - a failed export must not take the UI down
            self._done(SnapshotOutcome(error=f"snapshot failed: {type(exc).__name__}: {exc}"))
            return False
        self.busy = True
        app.notify(f"writing snapshot… {target}", timeout=4, markup=False)
        app.run_worker(
            lambda: self._write(frozen, assessment, target, svg),
            name="snapshot",
            group="snapshot",
            thread=True,
            exit_on_error=False,
        )
        return True

    def _write(self, store: Store, assessment: Assessment, target: Path, svg: str) -> None:
        """Worker thread: write the bundle, then report on the event loop."""
        try:
            path = write_snapshot(store, assessment, target, screen_svg=svg)
            outcome = SnapshotOutcome(path=path)
        except SnapshotError as exc:
            outcome = SnapshotOutcome(error=f"snapshot failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - any writer bug becomes a notification
            outcome = SnapshotOutcome(error=f"snapshot failed: {type(exc).__name__}: {exc}")
        try:
            self.app.call_from_thread(self._done, outcome)
        except RuntimeError:  # the app exited while we were writing: nobody to tell
            self.busy = False

    def _done(self, outcome: SnapshotOutcome) -> None:
        self.busy = False
        self.last = outcome
        self.exports += 1
        if outcome.path is not None:
            self.app.notify(
                f"snapshot written to {outcome.path}\n(snapshot.json, report.md, screen.svg, "
                "recording.ndjson.gz)",
                title="snapshot",
                timeout=10,
                markup=False,
            )
        else:
            self.app.notify(
                outcome.error, title="snapshot", severity="error", timeout=15, markup=False
            )
