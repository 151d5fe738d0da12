"""This machine as a source: the node agent run in-process, and local file following.

``LocalSource`` imports the agent package ``verl_top.agent`` (the same code the SSH source ships
to nodes) and turns each tick's wire dicts into records with ``protocol.from_dict``, so local and
remote data take one path. ``LocalFollowSource`` follows files on this machine (e.g. the verl
driver log) while the GPUs are monitored on remote hosts, with the agent's ``Follower``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl_top.agent.follow import (
    MAX_LINES_PER_RECORD,
    MAX_READ_PER_POLL,
    Follower,
    parse_follow,
    skipped_event,
)
from verl_top.agent.main import Agent, parse_args
from verl_top.model import Record
from verl_top.protocol import Decoder
from verl_top.sources.base import Emit
from verl_top.sources.log_sieve import SievedRead
from verl_top.sources.pipeline import ParserSink

SinkFor = Callable[[str, str, str], ParserSink | None]

FollowSpec = str | tuple[str, str] | tuple[str, str, bool]
SLICE_S = 0.005  # catch-up yields once its work passes this (one record adds <~15 ms)
CATCH_UP_READ = 512 * 1024  # bytes of a finished log read per poll (parsed in ~10 ms slices)
# A live log bigger than this is read from its recent tail first (the first verdict), then from
# its start (the printed config, then the history) in the background: reading 1 GB in order
# would keep the verdict waiting for minutes.
BIG_LOG = 64 * 1024 * 1024
TAIL_READ = 16 * 1024 * 1024
HISTORY_READ = 4 * 1024 * 1024  # bytes of history read (and parsed, paced) at a time


def _follow_args(follows: Iterable[FollowSpec]) -> list[tuple[str, str, bool]]:
    """Normalise ``"KIND[+start]:PATH"`` strings and (kind, path[, from_start]) tuples."""
    out = []
    for spec in follows:
        if isinstance(spec, str):
            out.append(parse_follow(spec))
        else:
            kind, path, *rest = spec
            out.append((kind, str(path), bool(rest[0]) if rest else False))
    return out


def _decode(dicts: Sequence[dict[str, Any]], emit: Emit, decoder: Decoder | None = None) -> int:
    """Emit the records of wire dicts (validated like remote ones) and what was refused;
    returns how many could not be decoded."""
    decoder = decoder or Decoder()
    before = decoder.malformed
    for d in dicts:
        record: Record | None = decoder.decode_dict(d)
        if record is not None:
            emit(record)
    for dropped in decoder.take_drops():
        emit(dropped)
    return decoder.malformed - before


async def _decode_paced(dicts: Sequence[dict[str, Any]], emit: Emit) -> int:
    """``_decode`` one record at a time, yielding to the event loop every ``SLICE_S``, so a
    big log's catch-up never holds the UI for longer than about that."""
    bad = 0
    start = time.perf_counter()
    for d in dicts:
        bad += _decode([d], emit)
        if time.perf_counter() - start > SLICE_S:
            await asyncio.sleep(0)
            start = time.perf_counter()
    return bad


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_lines(path: str, start: int, end: int) -> tuple[int, list[str]]:
    """The whole lines of ``path`` in bytes [start, end): (where the next line starts, lines)
    (a CRLF line loses its \r, as the follower reads it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(max(0, end - start))
    except OSError:
        return start, []
    cut = data.rfind(b"\n")
    if cut < 0:
        return start, []
    text = data[:cut].decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").removesuffix("\r")
    return start + cut + 1, text.split("\n")


def _line_start(path: str, pos: int) -> int:
    """The first line start at or after byte ``pos`` (the byte after a newline)."""
    if pos <= 0:
        return 0
    try:
        with open(path, "rb") as fh:
            fh.seek(pos - 1)
            while True:
                block = fh.read(65536)
                if not block:
                    return pos
                at = block.find(b"\n")
                if at >= 0:
                    return fh.tell() - len(block) + at + 1
    except OSError:
        return pos


class LocalSource:
    """Samples this machine with the node agent, in-process."""

    def __init__(
        self,
        interval: float = 1.0,
        backend: str = "auto",
        follows: Iterable[FollowSpec] = (),
        replay_trace: str | None = None,
        replay_gpus: int = 8,
        replay_speed: float = 1.0,
        replay_seed: int = 0,
        host: str | None = None,
        procs: bool = True,
        host_sampler: str = "auto",
        count: int = 0,
    ) -> None:
        argv = [
            "--interval",
            str(interval),
            "--backend",
            backend,
            "--replay-gpus",
            str(replay_gpus),
            "--replay-speed",
            str(replay_speed),
            "--replay-seed",
            str(replay_seed),
            "--host-sampler",
            host_sampler,
        ]
        if replay_trace:
            argv += ["--replay-trace", str(replay_trace)]
        if host:
            argv += ["--host", host]
        if not procs:
            argv.append("--no-procs")
        self.options = parse_args(argv)
        self.follows = _follow_args(follows)
        self.count = count  # stop after this many ticks (0: run until cancelled)
        self.host = host or socket.gethostname()
        self.name = f"local:{self.host}"
        self.malformed = 0
        self.agent: Agent | None = None
        self._pending: list[dict[str, Any]] = []

    def command(self, cmd: dict[str, Any]) -> None:
        """Queue a control command (same JSON as the stdin channel); applied before next tick."""
        self._pending.append(cmd)

    def follow(self, kind: str, path: str, from_start: bool = False) -> None:
        """Follow a file on this machine (applied before the next tick)."""
        self.command({"cmd": "follow", "kind": kind, "path": path, "from_start": from_start})

    def _tick(self, agent: Agent) -> list[dict[str, Any]]:
        pending, self._pending = self._pending, []
        for cmd in pending:
            agent.command(cmd)
        return agent.tick(time.time())

    async def run(self, emit: Emit) -> None:
        """Emit hello, then every tick's records until cancelled (or ``count`` ticks)."""
        loop = asyncio.get_running_loop()
        # One worker thread, so ticks never overlap and the agent is only touched by one thread.
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-top-local")
        try:
            # NVML init and the nvidia-smi probe can take a second: keep them off the event loop.
            agent = await loop.run_in_executor(executor, Agent, self.options)
            self.agent = agent
            for kind, path, from_start in self.follows:
                agent.follow(kind, path, from_start)
            self.malformed += _decode([agent.hello()], emit)
            if not getattr(self.options, "no_topology", False):
                # Once per connection, like the SSH agent; may spawn `nvidia-smi topo -m`.
                topo = await loop.run_in_executor(executor, agent.topology)
                self.malformed += _decode([topo], emit)
            next_tick = loop.time()
            while not self.count or agent.ticks < self.count:
                if agent.blocking:
                    # nvidia-smi is spawned per tick (~100 ms) and psutil does syscalls on every
                    # core's counters: run those ticks in the worker so the UI never stalls.
                    dicts = await loop.run_in_executor(executor, self._tick, agent)
                else:
                    # pynvml getters take microseconds (PcieThroughput is never called) and the
                    # replay backend only does arithmetic: a thread hop would cost more.
                    dicts = self._tick(agent)
                self.malformed += await _decode_paced(dicts, emit)
                if self.count and agent.ticks >= self.count:
                    break
                next_tick += agent.interval
                delay = next_tick - loop.time()
                if delay < 0:
                    next_tick = loop.time()
                    delay = 0
                await asyncio.sleep(delay)
        finally:
            if self.agent is not None:
                self.agent.close()
            executor.shutdown(wait=False)


class LocalFollowSource:
    """Follows files on this machine (``tail -F``), e.g. the verl driver log, as ``log`` records."""

    def __init__(
        self,
        follows: Iterable[FollowSpec],
        interval: float = 1.0,
        host: str | None = None,
        count: int = 0,
        until_eof: bool = False,
        then_follow: bool = False,
        sinks: SinkFor | None = None,
    ) -> None:
        self.follows = _follow_args(follows)
        # until_eof: where a file's lines can go straight to their parser (Pipeline.sink), so
        # that its quiet lines are only counted (sources/log_sieve.py).
        self.sinks = sinks
        self.until_eof = until_eof  # read finished files to their end, then stop
        # ...or, with then_follow, go on following them (a finished-looking log that grows
        # again: the app opened on a long step's quiet minutes).
        self.then_follow = then_follow
        self.interval = interval
        self.host = host or socket.gethostname()
        self.name = f"files:{self.host}"
        self.count = count
        self.malformed = 0

    async def run(self, emit: Emit) -> None:
        """Poll every followed file each interval and emit what was appended."""
        # A catch-up reads CATCH_UP_READ per poll: each chunk is parsed within the loop budget.
        followers = []
        history: list[asyncio.Task[None]] = []
        for kind, path, from_start in self.follows:
            size = _size(path) if from_start and not self.until_eof else 0
            if size > BIG_LOG:
                end, start = await self._tail(kind, path, size, emit)
                followers.append(Follower(kind, path, max_read=CATCH_UP_READ, offset=end))
                history.append(asyncio.create_task(self._history(kind, path, start, emit)))
            else:
                followers.append(Follower(kind, path, from_start, max_read=CATCH_UP_READ))
        polls = 0
        try:
            if self.until_eof:
                await self._read_to_end(followers, emit)
                if not self.then_follow:
                    return
                await asyncio.sleep(self.interval)
            while not self.count or polls < self.count:
                now = round(time.time(), 3)
                for follower in followers:
                    # A stat and a read of what was appended: small local I/O, done inline.
                    # A big backlog (a log followed from its start) is read in CATCH_UP_READ
                    # pieces, up to the agent's 8 MiB per interval, parsed in paced slices.
                    for _ in range(MAX_READ_PER_POLL // CATCH_UP_READ):
                        dicts = follower.poll(self.host, now)
                        if not dicts:
                            break
                        self.malformed += await _decode_paced(dicts, emit)
                polls += 1
                if not self.count or polls < self.count:
                    await asyncio.sleep(self.interval)
        finally:
            for task in history:
                task.cancel()
            for follower in followers:
                follower.close()

    async def _tail(self, kind: str, path: str, size: int, emit: Emit) -> tuple[int, int]:
        """Emit a big log's recent tail (the first verdict reads it); the byte where following
        goes on and the byte where the tail started (the history is what lies before)."""
        now = round(time.time(), 3)
        start = _line_start(path, size - TAIL_READ)
        end, lines = _read_lines(path, start, size)
        # reset: what the history parser reads later goes before these steps.
        self.malformed += await _decode_paced(
            self._records(kind, path, now, lines, False, reset=True), emit
        )
        return end, start

    async def _history(self, kind: str, path: str, end: int, emit: Emit) -> None:
        """Read the log before its tail in order (its head holds the printed config), paced,
        as ``log_history`` records."""
        pos = 0
        while pos < end:
            await asyncio.sleep(0)
            nxt, lines = _read_lines(path, pos, min(end, pos + HISTORY_READ))
            if nxt <= pos:
                break  # no newline in a whole read: give up rather than spin
            now = round(time.time(), 3)
            self.malformed += await _decode_paced(self._records(kind, path, now, lines, True), emit)
            pos = nxt

    def _records(
        self,
        kind: str,
        path: str,
        t: float,
        lines: list[str],
        history: bool,
        reset: bool = False,
    ) -> list[dict[str, Any]]:
        """Wire dicts of ``log`` records for ``lines`` (the agent's record size limits)."""
        size = MAX_LINES_PER_RECORD
        out: list[dict[str, Any]] = []
        for i in range(0, max(1, len(lines)), size):
            out.append(
                {
                    "v": 1,
                    "type": "log_history" if history else "log",
                    "host": self.host,
                    "t": t,
                    "path": path,
                    "kind": kind,
                    "lines": lines[i : i + size],
                    "reset": reset and i == 0,
                }
            )
        return out

    async def _sieved(self, follower: Follower, sink: ParserSink, emit: Emit) -> bool:
        """Read a finished file with ``LogSieve`` (its quiet lines counted, not decoded);
        False when it cannot be opened (the follower reports why)."""
        fh = follower.handle  # opened as the follower opens files (links checked)
        if fh is None:
            return False
        read = SievedRead(fh, sink)
        try:
            fh.seek(0)
        except OSError:
            return False
        try:
            end = await read.run()
        except OSError:  # gone unreadable halfway: what was read stands, as with the follower
            end = read.stats.bytes
        follower.seek(end)
        sink.counted()
        if read.stats.skipped_long:
            self.malformed += _decode(
                [skipped_event(follower.path, read.stats.skipped_long, self.host, 0.0)], emit
            )
        return True

    async def _read_to_end(self, followers: list[Follower], emit: Emit) -> None:
        """Read each file completely (a finished log given with a replay or to diagnose).

        The lines get time 0 ("no arrival time"): stamping them with today's clock would pull
        the store's data clock away from the replay they accompany.
        """
        now = 0.0
        for follower in followers:
            sink = self.sinks(self.host, follower.path, follower.kind) if self.sinks else None
            if sink is not None and await self._sieved(follower, sink, emit):
                continue
            while True:
                dicts = follower.poll(self.host, now)
                if dicts:
                    self.malformed += await _decode_paced(dicts, emit)
                elif follower.caught_up:  # not merely inside a long line: the end
                    break
                await asyncio.sleep(0)  # and between polls
            # A last line without a newline is complete once the file is finished.
            self.malformed += _decode(follower.flush(self.host, now), emit)
