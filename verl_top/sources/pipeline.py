"""Routes records from all sources to the store (and the recorder).

Raw ``LogLines`` from followed files are turned into typed records here by one stream parser per
(host, path): verl logs into steps and config, NCCL logs into transport info and events. The
parsed records are what gets recorded, so a replay needs no log files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from verl_top.export.redact import Redactor
from verl_top.model import LogHistory, LogLines, ProcessList, Record, VerlConfig, VerlStep
from verl_top.roles import RoleMemory, annotate_verl, config_roles
from verl_top.sources.recorder import Recorder
from verl_top.store import Store


class StreamParser(Protocol):
    """Turns successive chunks of one file's lines into records."""

    def feed(self, lines: list[str], t: float) -> list[Record]: ...

    def reset(self) -> None: ...


ParserFactory = Callable[[str, str], StreamParser]
HISTORY_SUMS = ("lines", "matched", "steps", "malformed", "truncated")


def default_parsers() -> dict[str, ParserFactory]:
    """Parser factories by ``LogLines.kind``."""
    from verl_top.nccl.parse import NcclStreamParser
    from verl_top.verl.parse import VerlStreamParser

    return {"verl": VerlStreamParser, "verl_config": VerlStreamParser, "nccl": NcclStreamParser}


class Pipeline:
    """The single entry point for records: parse logs, update the store, record."""

    def __init__(
        self,
        store: Store,
        recorder: Recorder | None = None,
        parsers: dict[str, ParserFactory] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.recorder = recorder
        self.parsers = default_parsers() if parsers is None else parsers
        self._streams: dict[tuple[str, str, str], StreamParser] = {}
        # A big log's history (LogHistory): its own parser per file, its steps placed
        # before the first step parsed after the jump to the recent tail (the anchor).
        self._history: dict[tuple[str, str, str], StreamParser] = {}
        self._anchor: dict[tuple[str, str, str], VerlStep | None] = {}
        self.wall_clock = wall_clock
        self.listeners: list[Callable[[Record], None]] = []
        self.roles = RoleMemory()  # the verl roles each WorkerDict served so far
        self.redactor = Redactor()

    def emit(self, record: Record) -> None:
        """Accept one record from any source."""
        received = self.wall_clock()
        if isinstance(record, ProcessList):
            # verl role, name, current method and rank of each GPU process, once, on arrival
            record = annotate_verl(record, self.roles, config_roles(self.store.config))
        if isinstance(record, LogHistory):  # parsed apart; not shown as the log's tail
            self._fill_history(record, received)
            return
        if isinstance(record, LogLines):
            self.store.ingest(record, received)
            for parsed in self._parse(record):
                self._deliver(parsed, received)
            return
        self._deliver(record, received)

    def _deliver(self, record: Record, received: float) -> None:
        # Secrets out of foreign free text once, before anything shows, records or exports it.
        record = self.redactor.record(record)
        self.store.ingest(record, received)
        if self.recorder is not None:
            self.recorder.write(record)
        for listener in self.listeners:
            listener(record)

    def finish(self) -> None:
        """The inputs ended (a finished log read to its end): let every parser hand over what
        it still holds (a config whose end never came, a last wrapped step line)."""
        received = self.wall_clock()
        for (host, path, kind), parser in list(self._streams.items()):
            flush = getattr(parser, "flush", None)
            if flush is None:
                continue
            for parsed in flush(0.0):
                self._deliver(parsed, received)
            self._note_counts(host, path, kind, parser)

    def sink(self, host: str, path: str, kind: str) -> ParserSink | None:
        """Where a finished log's lines can go straight to their parser, its quiet lines
        only counted (sources/log_sieve.py); None when that kind's parser reads every line."""
        parser = self._stream(host, path, kind)
        if parser is None or not hasattr(parser, "skip_quiet"):
            return None
        return ParserSink(self, (host, path, kind), parser)

    def _stream(self, host: str, path: str, kind: str) -> StreamParser | None:
        factory = self.parsers.get(kind)
        if factory is None:
            return None
        key = (host, path, kind)
        parser = self._streams.get(key)
        if parser is None:
            parser = self._streams[key] = factory(host, path)
        return parser

    def _parse(self, rec: LogLines) -> list[Record]:
        parser = self._stream(rec.host, rec.path, rec.kind)
        if parser is None:
            return []
        key = (rec.host, rec.path, rec.kind)
        if rec.reset:
            parser.reset()
            self._anchor[key] = None  # history read later goes before what comes now
        out = parser.feed(rec.lines, rec.t)
        if key in self._anchor and self._anchor[key] is None:
            self._anchor[key] = next((r for r in out if isinstance(r, VerlStep)), None)
        self._note_counts(rec.host, rec.path, rec.kind, parser)
        return out

    def _fill_history(self, rec: LogHistory, received: float) -> None:
        """Parse a chunk of a log's history (in file order, with its own parser) and put its
        steps before the anchor; its config counts only when none was seen since."""
        factory = self.parsers.get(rec.kind)
        if factory is None:
            return
        key = (rec.host, rec.path, rec.kind)
        parser = self._history.get(key)
        if parser is None:
            parser = self._history[key] = factory(rec.host, rec.path)
        out = parser.feed(rec.lines, rec.t)  # its NCCL/watchdog events too (the verl parser's)
        steps: list[VerlStep] = []
        for parsed in out:
            if isinstance(parsed, VerlStep):
                parsed = self.redactor.record(parsed)  # as _deliver does
                if steps and steps[-1].step == parsed.step:  # as Store keeps them
                    steps[-1] = parsed
                else:
                    steps.append(parsed)
            elif not isinstance(parsed, VerlConfig) or not self.store.config:
                self._deliver(parsed, received)
        self.store.insert_steps(steps, self._anchor.get(key))
        if self.recorder is not None:
            for step in steps:
                self.recorder.write(step)
        main = self._streams.get(key)
        if main is not None:
            self._note_counts(rec.host, rec.path, rec.kind, main)

    def _note_counts(self, host: str, path: str, kind: str, parser: StreamParser) -> None:
        """Keep what a verl log's parser read in the store (pane 3 and --json show it)."""
        counts = getattr(parser, "counts", None)
        if kind in ("verl", "verl_config") and isinstance(counts, dict):
            history = getattr(self._history.get((host, path, kind)), "counts", None)
            if isinstance(history, dict):  # the lines read as history count as read
                counts = {
                    k: v + history[k] if k in HISTORY_SUMS and k in history else v
                    for k, v in counts.items()
                }
            self.store.log_stats[f"{host}:{path}"] = {
                "host": host,
                "path": path,
                "kind": kind,
                **counts,
            }


class ParserSink:
    """A finished log's lines fed to its stream parser directly (``LogSieve``'s reader): the
    records it completes are delivered as those of ``LogLines`` are."""

    def __init__(self, pipeline: Pipeline, key: tuple[str, str, str], parser: Any) -> None:
        self.pipeline = pipeline
        self.key = key
        self.parser = parser

    def quiet(self) -> bool:
        """True when the parser would only count a line without a marker."""
        return bool(self.parser.quiet())

    def skip(self, n: int) -> None:
        """``n`` lines without a marker went by."""
        if n:
            self.parser.skip_quiet(n)

    def feed(self, lines: list[str], more: bool = True) -> None:
        """Cleaned lines (``more`` follow: a step line at their end waits for the next)."""
        pipeline = self.pipeline
        out = self.parser.feed(lines, 0.0, more=more)
        if out:
            received = pipeline.wall_clock()
            for parsed in out:
                pipeline._deliver(parsed, received)  # noqa: SLF001 - the pipeline's own helper

    def finish(self) -> None:
        """The file's end: end what the parser holds open (a step line that might wrap)."""
        self.feed([], more=False)

    def counted(self) -> None:
        """Show what was read so far (pane 3, ``--json``)."""
        self.pipeline._note_counts(*self.key, self.parser)  # noqa: SLF001
