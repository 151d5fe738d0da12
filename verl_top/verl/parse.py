"""Parsers for everything verl prints: console metric lines, the ``file`` logger's JSONL, the
pprinted resolved config, and config files.

Console lines (``LocalLogger``) look like ``step:12 - timing_s/gen:299.46 - perf/throughput:843.0``,
possibly behind a Ray prefix (``(TaskRunner pid=1) ``, ``(main_task pid=1, ip=10.0.0.1) ``) and
ANSI colour codes. Values are Python reprs (full precision since v0.5, ``.3f`` before), numpy ≥ 2
wraps them (``np.float64(0.19)``, ``np.int32(2)``), bools print ``True``/``False``.

Malformed input policy (all counted in ``malformed``, never raised):

* A line that starts ``step:N - `` but has a pair that is not ``key:number`` before its last
  pair is garbled: it is skipped whole.
* A line whose *last* pair is incomplete (no colon, not a number, an unclosed ``np.float64(``) was
  cut: the last pair is dropped, the rest is kept (also counted in ``truncated``). In the
  3-decimal era (at least 8 earlier values, all with exactly 3 decimals) a last value without
  them is treated as cut too. A cut that happens
  to leave a complete full-precision number (``299.46`` of ``299.4644``) cannot be detected.
* A line ending in a dangling separator (``... - key:1.0 -``) was cut after a complete pair: all
  pairs are kept, the line counts as truncated.
* ``step:N`` with no pair at all, a JSONL object that does not parse, and a fragment of metric
  pairs with no ``step:`` head (a wrapped line) are malformed and yield nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_top.model import LogEvent, NcclInfo, Record, VerlConfig, VerlStep
from verl_top.nccl.parse import NcclStreamParser, may_be_event
from verl_top.untrusted import clean_text, finite, is_clean
from verl_top.verl.config import (
    CollectedConfig,
    ConfigError,
    PprintConfigCollector,
    flatten,
    load_config_file,
    load_config_text,
)
from verl_top.verl.crash import CrashScanner
from verl_top.verl.launch import LaunchReader

__all__ = [
    "ParsedLog",
    "VerlStreamParser",
    "load_config_file",
    "logical_lines",
    "parse_console_line",
    "parse_file",
    "parse_jsonl_line",
    "strip_ansi",
]

# CSI (colours, cursor), OSC (titles, links) and two-byte escapes.
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Ray's log prefix: "(TaskRunner pid=1)", "(main_task pid=1, ip=10.0.0.1)",
# "(VGNd5CWorkerDict_0:0 WorkerDict pid=65860)", "(pid=1)".
_RAY_PREFIX_RE = re.compile(r"\((?:[^()\s]+ ){0,3}pid=\d+(?:, ip=[^()\s]+)?\) ?")
_REPEATED_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_STEP_HEAD_RE = re.compile(r"step:(\d{1,18})(?= - | -$|$)")
_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
# torch prints ``tensor(0.5, device='cuda:0')``; numpy >= 2 ``np.float64(0.5)``.
_VALUE_RE = re.compile(
    rf"(?:(?:np\.\w+|tensor)\(\s*({_NUM})\s*(?:,[^()]*)?\)|({_NUM})"
    r"|np\.(True|False)_|np\.bool_?\((True|False)\))"
)
_BOOLS = {"True": 1.0, "False": 0.0}
_THREE_DEC_RE = re.compile(r"[-+]?(?:\d+\.\d{3}|nan|inf)")
# Three "group/key:number" pairs in a row without a "step:" head: a piece of a wrapped line.
_PAIR = r"[\w@.()\-]+/[\w@./()\-]*:(?:np\.\w+\()?[-+\w.]+\)?"
_FRAGMENT_RE = re.compile(rf"(?:^|\s){_PAIR} - {_PAIR} - {_PAIR}")
# Heads that tee/ts, logging formatters and ``srun --label`` put before a line. One separating
# blank is removed with them, so the indentation of a pprinted config line is kept.
_TIMESTAMP_RE = re.compile(
    r"^\[?(?:\d{4}-\d\d-\d\d[T ]|[A-Z][a-z]{2} [ \d]\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"(?:Z|[+-]\d\d:?\d\d)?\]?(?: \|)?[ \t]"
)
_SRUN_LABEL_RE = re.compile(r"^ {0,4}\d{1,5}: ")
# The Ray actor class in a line prefix: the word before " pid=" ("TaskRunnerV1",
# "FullyAsyncTrainer", "WorkerDict" of "(VGNd5CWorkerDict_0:0 WorkerDict pid=1)").
_PREFIX_ACTOR_RE = re.compile(r"([A-Za-z_][\w.]*) pid=")
MAX_ACTORS = 16
_HEAD_STARTS = frozenset("[ADFJMNOS")  # "[2024-…", month names of syslog-style stamps
# "step:N - " after some other head ("INFO:root:", "[rank0]: "): where the metrics start.
_EMBEDDED_STEP_RE = re.compile(r"(?<=[\s\]|>:])step:\d{1,18} - ")
MAX_HEAD_CHARS = 160
# A piece of a terminal-wrapped metrics line: no blanks except " - " separators.
_CONTINUATION_RE = re.compile(r"^-? ?[^\s]+(?: - [^\s]+)*(?: -)?$")
MAX_WRAPPED_CHARS = 1_000_000
# One metric per line: a "step: N" line, then "key: value" lines.
_BLOCK_STEP_RE = re.compile(r"^step\s*[:=]\s*(\d{1,18})\s*$")
_BLOCK_PAIR_RE = re.compile(r"^(?:- )?([\w@.()\-]+(?:/[\w@.()\-]+)+)\s*[:=]\s*(\S.*?)\s*$")
MAX_SHOWN_LINE = 200
# What a line must hold to be anything but noise to ``VerlStreamParser._line`` (a superset:
# "step:" or a metrics block head, '{"' of JSONL or "{'" of a pprinted config, "/key:" of a
# wrapped metrics piece, NCCL's own lines, a traceback's or launch command's opening, or an
# escape that could hide one). Most lines of a real log (a reward function printing each sample,
# vLLM and Ray chatter) have none and are counted, not parsed. Tested with
# `in` first: a regex with a literal head is found fast, an alternation is tried everywhere.
_STEP_ANYWHERE_RE = re.compile(r"step\s*[:=]")
_PAIR_KEY_RE = re.compile(r"/[\w@./()\-]*:")
# CrashScanner opens a traceback only on an unprefixed body that starts with it: at a line's or
# a \r piece's start, or after a head's blank; never after a digit or ASCII punctuation (the
# per-sample "ERROR:<time>,953:Traceback (most" a worker logs).
_TRACEBACK_START_RE = re.compile(r"(?<![!-?])Traceback \(most")

NONE, OK, TRUNCATED, MALFORMED = "none", "ok", "truncated", "malformed"
MAX_CONFIG_FILE_CHARS = 4_000_000
# Pairs before the last that must all have exactly 3 decimals to call a line ".3f era".
MIN_THREE_DEC_PAIRS = 8
_CONFIG_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colour codes) wherever they are."""
    return _ANSI_RE.sub("", text) if "\x1b" in text else text


def logical_lines(raw: str) -> list[tuple[str, str]]:
    """Split one physical line into ``(ray_prefix, body)`` pieces.

    ANSI codes are removed; ``\\r`` (progress bars) and a Ray prefix in the middle of a line (two
    actors' output glued together) start new pieces. ``ray_prefix`` is ``""`` when absent.
    """
    text = strip_ansi(raw.rstrip("\r\n"))
    segments = text.split("\r") if "\r" in text else [text]
    segments = [strip_heads(seg) for seg in segments]
    out: list[tuple[str, str]] = []
    for segment in segments:
        if "pid=" not in segment:
            if segment or not out:
                out.append(("", segment))
            continue
        pos, prefix = 0, ""
        for match in _RAY_PREFIX_RE.finditer(segment):
            if match.start() > pos:
                out.append((prefix, segment[pos : match.start()]))
            prefix, pos = match.group(0).rstrip(), match.end()
        out.append((prefix, segment[pos:]))
    return out


def strip_heads(text: str) -> str:
    """Remove timestamps (tee/ts, logging) and ``srun --label`` task numbers at a line's start.

    Up to three heads in any order (``0: 2024-05-01 12:00:00 ...``); the blank after each goes
    with it, further indentation stays.
    """
    for _ in range(3):
        first = text[:1]
        # Cheap test first: most lines start with a Ray prefix "(" or a letter of their own.
        if not (
            first.isdigit()
            or first in _HEAD_STARTS
            or (first == " " and text[1:5].strip()[:1].isdigit())
        ):
            break
        match = _TIMESTAMP_RE.match(text) or _SRUN_LABEL_RE.match(text)
        if match is None:
            break
        text = text[match.end() :]
    return text


def _join_wrapped(head: str, tail: str) -> str:
    """Glue the next piece of a terminal-wrapped line onto what came before."""
    if head.rstrip().endswith(" -") or tail.lstrip().startswith("- "):
        return head.rstrip() + " " + tail.strip()
    return head + tail  # cut inside a key or a value ("min:" + "-1.78")


def _parse_value(text: str) -> float | None:
    """A printed metric value as float (bools 1.0/0.0), or ``None`` when it is not a number."""
    value = _BOOLS.get(text)
    if value is not None:
        return value
    if text[-1:].isdigit() and text.isascii() and "_" not in text and not text[0].isspace():
        # Fast path for plain numbers (the vast majority); float() alone would accept "1_0".
        try:
            return float(text)
        except ValueError:
            pass
    match = _VALUE_RE.fullmatch(text)
    if match is None:
        return None
    num = match.group(1) or match.group(2)
    if num is not None:
        return float(num)
    return _BOOLS[match.group(3) or match.group(4)]


def _valid_key(key: str) -> bool:
    return bool(key) and key == key.strip() and key.isprintable()


def parse_console_body(
    body: str, layout: StepLayout | None = None
) -> tuple[str, int, dict[str, float]]:
    """Classify and parse one prefix-free console line: ``(status, step, metrics)``.

    ``status`` is ``none`` (not a metrics line), ``ok``, ``truncated`` (usable, last pair
    dropped or dangling separator) or ``malformed`` (skipped). See the module docstring.
    ``layout``: the stream's memo of its step lines' keys (a faster read, the same result).
    """
    body = body.strip()
    if not body.startswith("step:"):
        return NONE, 0, {}
    head = _STEP_HEAD_RE.match(body)
    if head is None:
        return NONE, 0, {}
    step = int(head.group(1))
    rest = body[head.end() :]
    if "[repeated " in rest:  # the regex scans the whole line: test for its words first
        rest = _REPEATED_RE.sub("", rest)
    truncated = False
    if rest.endswith(" -"):
        rest, truncated = rest[:-2], True
    if not rest.startswith(" - "):
        return MALFORMED, step, {}
    plain = layout.read(rest) if layout is not None else None
    tokens: list[str] = []
    if plain is None:
        tokens = rest[3:].split(" - ")
        plain = _plain_pairs(tokens, rest)
        if plain is not None and layout is not None:
            layout.learn(tuple(plain[0]))
    if plain is not None:
        metrics, raws = plain
        if not truncated and _cut_three_decimals(raws[:-1], raws[-1]):
            metrics.popitem()  # the last pair was cut (8 complete ones or more stay)
            return TRUNCATED, step, metrics
        return (TRUNCATED if truncated else OK), step, metrics
    return _console_pairs(tokens, step, truncated)  # split above: the layout did not read it


# The characters of plain numbers ("-1.5e-3"): a value made of only these is read by float()
# exactly as by _parse_value (no blank, underscore, nan/inf or wrapper can be in it).
_NUMBER_CHARS_RE = re.compile(r"[0-9.eE+\-]*")


def _plain_pairs(tokens: list[str], rest: str) -> tuple[dict[str, float], Sequence[str]] | None:
    """Every ``key:number`` pair of a step line at once, when all are plain (the usual line):
    ASCII printable keys with no blank at their ends, numbers float() reads as _parse_value
    does. None sends the line to the pair-by-pair parse."""
    pairs = [token.partition(":") for token in tokens]
    keys = [p[0] for p in pairs]
    raws = [p[2] for p in pairs]
    values = "".join(raws)
    names = "".join(keys)
    if (
        _NUMBER_CHARS_RE.fullmatch(values) is None
        or not (names.isascii() and names.isprintable())
        or "  " in rest
        or " :" in rest
        or not all(keys)
        or keys[0][0] == " "
    ):
        return None
    try:
        numbers = list(map(float, raws))
    except ValueError:
        return None
    if len(set(keys)) != len(keys):
        return None  # a key twice: the pair-by-pair parse keeps its order of events
    return dict(zip(keys, numbers, strict=True)), raws


class StepLayout:
    """The keys of a stream's plain step lines, in order, and a pattern that reads a line with
    exactly those keys in one regex match (a run prints the same ~70 keys every step).

    Only what ``_plain_pairs`` accepted is learned, and a line is read here only when each of
    its values is made of the plain number characters and float() reads it, so the result is
    ``_plain_pairs``'s: the keys already passed its checks (ASCII printable, none empty,
    twice or with a blank at an end), and values hold no blank, so the separators are where
    ``split(" - ")`` finds them. A pattern is compiled once a layout was seen twice in a row
    (a validation step's extra keys cost no compile), at most ``MAX_COMPILES`` times a stream
    (~3 ms each for 70 keys: a log whose keys keep changing is read pair by pair)."""

    MAX_COMPILES = 32

    def __init__(self) -> None:
        self._keys: tuple[str, ...] = ()
        self._pattern: re.Pattern[str] | None = None
        self._seen: tuple[str, ...] = ()
        self.compiles = 0

    def read(self, rest: str) -> tuple[dict[str, float], Sequence[str]] | None:
        """The pairs of ``rest`` (a step line after its head) when its keys are the layout's;
        None when they are not or a value is not a plain number."""
        if self._pattern is None:
            return None
        match = self._pattern.fullmatch(rest)
        if match is None:
            return None
        raws = match.groups()
        try:
            return dict(zip(self._keys, map(float, raws), strict=True)), raws
        except ValueError:  # "", "1e", "1-2": the pair-by-pair parse says what they are
            return None

    def learn(self, keys: tuple[str, ...]) -> None:
        """The keys of a line ``_plain_pairs`` read: the layout once seen twice in a row."""
        if keys == self._keys:
            return
        if keys != self._seen or self.compiles >= self.MAX_COMPILES:
            self._seen = keys
            return
        self.compiles += 1
        self._keys = keys
        self._pattern = re.compile(
            "".join(" - " + re.escape(key) + r":([0-9.eE+\-]*)" for key in keys)
        )


def _console_pairs(
    tokens: list[str], step: int, truncated: bool
) -> tuple[str, int, dict[str, float]]:
    """The pairs of a step line one by one (see the module docstring for what is malformed)."""
    metrics: dict[str, float] = {}
    raw_values: list[str] = []
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        key, sep, raw = token.partition(":")
        value = _parse_value(raw) if sep and _valid_key(key) else None
        if value is None:
            if i < last:
                return MALFORMED, step, {}
            truncated = True
            break
        if i == last and not truncated and _cut_three_decimals(raw_values, raw):
            truncated = True
            break
        metrics[key] = value
        raw_values.append(raw)
    if not metrics:
        return MALFORMED, step, {}
    return (TRUNCATED if truncated else OK), step, metrics


def _cut_three_decimals(previous: Sequence[str], last: str) -> bool:
    """In a ``.3f``-era line (all other values with 3 decimals) a last value without them was cut."""
    if len(previous) < MIN_THREE_DEC_PAIRS or _THREE_DEC_RE.fullmatch(last):
        return False
    return all(_THREE_DEC_RE.fullmatch(v) for v in previous)


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """Parse one console line (Ray prefix and ANSI codes allowed) into ``(step, metrics)``.

    Returns ``None`` for lines that are not metrics and for garbled ones; a line with a cut last
    pair yields the complete pairs. Never raises.
    """
    for _prefix, body in logical_lines(line):
        status, step, metrics = parse_console_body(body)
        if status in (OK, TRUNCATED):
            return step, metrics
    return None


def parse_jsonl_body(body: str) -> tuple[str, int, dict[str, float]]:
    """Classify one line of the ``file`` logger: ``{"step": N, "data": {...}}``."""
    text = body.strip()
    if not text.startswith('{"'):
        return NONE, 0, {}
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        # Cut by a crash or still being written: only ours if it carries a step.
        return (MALFORMED if '"step"' in text else NONE), 0, {}
    if not isinstance(obj, dict) or "step" not in obj or "data" not in obj:
        return NONE, 0, {}
    step, data = obj["step"], obj["data"]
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
        return MALFORMED, 0, {}
    metrics: dict[str, float] = {}
    for key, value in data.items():
        # JSON's "\u001b" makes an escape the raw line did not hold: clean the decoded key.
        name = key if is_clean(key) else clean_text(key, 256)
        if isinstance(value, bool):
            metrics[name] = 1.0 if value else 0.0
        elif isinstance(value, (int, float)) and (number := finite(value)) is not None:
            metrics[name] = number  # an int of 400 digits is no float: left out, not a crash
    return OK, step, metrics


def parse_jsonl_line(line: str) -> tuple[int, dict[str, float]] | None:
    """Parse one JSONL line of verl's ``file`` logger into ``(step, metrics)``; never raises.

    Non-numeric values (``null`` for NaN, strings, nested objects) are left out.
    """
    status, step, metrics = parse_jsonl_body(line)
    return (step, metrics) if status == OK else None


def _is_fragment(body: str) -> bool:
    return " - " in body and ":" in body and _FRAGMENT_RE.search(body) is not None


# The config source of overrides read from the launch command alone (no printed config yet).
COMMAND_LINE_SOURCE = "console_command_line"


class VerlStreamParser:
    """Turns successive chunks of one verl output file into ``VerlStep`` / ``VerlConfig`` records.

    One instance per followed file (``host``, ``path``). The format is detected per line, so a
    console log, a JSONL file and a mixed stream all work. Paths ending in ``.yaml``/``.yml``/
    ``.json`` are config files: their lines are accumulated and re-parsed until they form a
    mapping (JSONL step lines in them still count as steps). The pprinted config may span any
    number of ``feed`` calls.

    Shapes people paste are accepted too: a step line wrapped by a terminal over several lines
    (the pieces are glued back until a line that is not a piece), one ``key: value`` per line
    after a ``step: N`` line, and lines behind timestamps or ``srun --label`` numbers. A step
    line is emitted once the next line shows it is complete, or at the end of the ``feed``.

    Counters: ``lines``, ``matched`` (lines that were part of a step or the config), ``steps``,
    ``configs``, ``malformed``, ``truncated``; ``first_unmatched`` / ``first_malformed`` keep the
    first such line (cleaned, shortened) so an unreadable file can be shown to the user.
    """

    def __init__(self, host: str, path: str) -> None:
        self.host = host
        self.path = path
        self.config_file = path.lower().endswith(_CONFIG_FILE_SUFFIXES)
        self._json_file = path.lower().endswith(".json")
        self._collector = PprintConfigCollector()
        self._text: list[str] = []
        self._text_chars = 0
        self._last_values: dict[str, Any] | None = None
        self._pending: tuple[str, str] | None = None  # (prefix, body) of a step line, maybe wrapped
        self._layout = StepLayout()  # the keys its step lines print (a faster read)
        self._block: tuple[int, dict[str, float]] | None = None  # "step: N" + key: value lines
        self._nccl: NcclStreamParser | None = None  # made at the first NCCL line
        self._crash = CrashScanner(host, path)  # the driver's tracebacks (verl/crash.py)
        self._launch = LaunchReader()  # Hydra overrides of the launch command (verl/launch.py)
        self._overrides: dict[str, Any] = {}
        self._printed: tuple[dict[str, Any], str] | None = None  # the last printed config
        self.actors: list[str] = []  # Ray actor classes that printed steps or the config
        self.lines = 0
        self.matched = 0
        self.steps = 0
        self.configs = 0
        self.config_keys = 0
        self.config_source = ""
        self.malformed = 0
        self.truncated = 0
        self.first_unmatched = ""
        self.first_malformed = ""

    def reset(self) -> None:
        """The file was truncated or rotated: forget partial state (counters are kept)."""
        self._collector.reset()
        self._text = []
        self._text_chars = 0
        self._last_values = None
        self._pending = None
        self._block = None
        if self._nccl is not None:
            self._nccl.reset()
        self._crash.reset()
        self._launch.reset()
        self._overrides, self._printed = {}, None

    def feed(self, lines: list[str], t: float, more: bool = False) -> list[Record]:
        """Parse new lines that arrived at time ``t``; returns the records they complete.

        ``more``: the caller knows more lines follow at once (a file read in chunks), so a step
        line at the end of this chunk is held until the next one shows whether it goes on.
        """
        out: list[Record] = []
        grew = False
        skipped = 0
        quiet = self._quiet()
        for raw in lines:
            if (
                quiet
                and "\x1b" not in raw
                and '{"' not in raw  # a JSONL line's or a pprinted config's opening (what
                and "{'" not in raw  # _line reads in a quiet parser), not any brace
                and "NCCL" not in raw
                and ("step" not in raw or _STEP_ANYWHERE_RE.search(raw) is None)
                and ("/" not in raw or _PAIR_KEY_RE.search(raw) is None)
                and ("Traceback (most" not in raw or _TRACEBACK_START_RE.search(raw) is None)
                and "Error executing job" not in raw  # CrashScanner.OPENERS and
                and "-m " not in raw  # LaunchReader.OPENERS, inline (a generator costs more)
                and "main_" not in raw
            ):
                skipped += 1  # no step, config, JSONL, metrics, traceback or command here
                continue
            self.lines += 1
            hit = False
            for prefix, body in logical_lines(raw):
                if self._line(prefix, body, t, out):
                    hit = True
                    continue
                if (crash := self._crash.scan(prefix, body, self.steps)) is not None:
                    crash.t = t
                    out.append(crash)
                if (overrides := self._launch.scan(body)) is not None:
                    self._on_overrides(overrides, t, out)
                    hit = True
                if "NCCL" in body:  # workers' NCCL INFO/WARN/watchdog lines in the driver log
                    self._nccl_line(prefix, body, t, out)
                if self.config_file and self._text_chars < MAX_CONFIG_FILE_CHARS:
                    self._text.append(raw.rstrip("\r\n"))
                    self._text_chars += len(raw)
                    grew = hit = True
                    break
                if body.strip() and not self.first_unmatched:
                    self.first_unmatched = _shown(body)
            self.matched += hit
            quiet = self._quiet()
        self.lines += skipped
        if not more:
            self._end_pending(t, out)
            self._end_block(t, out)
        if grew:
            self._config_from_text(t, out)
        return out

    def quiet(self) -> bool:
        """True when the next line is skipped (only counted) unless it holds a marker of the
        quiet test in ``feed``: what lets a finished log's quiet lines go unread
        (sources/log_sieve.py)."""
        return self._quiet()

    def skip_quiet(self, n: int) -> None:
        """``n`` lines went by that the quiet test would have skipped: count them."""
        self.lines += n

    def _quiet(self) -> bool:
        """True when a line can only matter by what the quiet test in ``feed`` finds: no wrapped step
        line, metrics block, config, traceback or launch command is open, and the first
        unmatched line is already kept."""
        return (
            self._pending is None
            and self._block is None
            and not self._collector.active
            and not self.config_file
            and bool(self.first_unmatched)
            and self._crash.idle
            and self._launch.idle
        )

    def flush(self, t: float) -> list[Record]:
        """End of input: return a config still being collected (repaired), if any."""
        out: list[Record] = []
        self._end_pending(t, out)
        self._end_block(t, out)
        self._emit_config(self._collector.abandon(), t, out)
        return out

    @property
    def counts(self) -> dict[str, Any]:
        """What was read: lines, lines matched, steps, config keys, malformed, first misses."""
        return {
            "lines": self.lines,
            "matched": self.matched,
            "steps": self.steps,
            "config_keys": self.config_keys,
            "config_source": self.config_source,
            "malformed": self.malformed,
            "truncated": self.truncated,
            "first_unmatched": self.first_unmatched,
            "first_malformed": self.first_malformed,
            "actors": list(self.actors),
        }

    def _line(self, prefix: str, body: str, t: float, out: list[Record]) -> bool:
        """Handle one logical line; True when it was recognised (metrics, JSONL, config)."""
        if self._pending is not None:
            if self._continues(prefix, body):
                head = self._pending[1]
                if len(head) < MAX_WRAPPED_CHARS:
                    self._pending = (self._pending[0], _join_wrapped(head, body))
                return True
            self._end_pending(t, out)
        if self._block is not None and self._block_line(body):
            return True
        self._end_block(t, out)
        if self._collector.active:
            stripped = body.lstrip()
            if stripped.startswith("step:") and prefix == self._collector.prefix:
                self._emit_config(self._collector.abandon(), t, out)
            else:
                consumed, done = self._collector.add(prefix, body)
                self._emit_config(done, t, out)
                if consumed:
                    return True
        stripped = body.lstrip()
        if not stripped.startswith("step:") and "step:" in body[: MAX_HEAD_CHARS + 30]:
            embedded = _EMBEDDED_STEP_RE.search(body, 0, MAX_HEAD_CHARS + 30)
            if embedded is not None and embedded.start() <= MAX_HEAD_CHARS:
                stripped = body[embedded.start() :]
        if stripped.startswith("step:"):
            block = _BLOCK_STEP_RE.match(stripped)
            if block is not None:
                self._block = (int(block.group(1)), {})
                return True
            if _STEP_HEAD_RE.match(stripped) is None:  # "step: 3 with a space": not ours
                return False
            self._pending = (prefix, stripped)
            return True
        if stripped.startswith('{"'):
            status, step, metrics = parse_jsonl_body(stripped)
            return self._step(status, step, metrics, "jsonl", t, out, stripped)
        if not self.config_file and self._collector.starts(stripped):
            self._note_actor(prefix)
            self._emit_config(self._collector.begin(prefix, stripped), t, out)
            return True
        if _is_fragment(body):
            self._malformed(body)
            return not self.config_file
        return False

    def _note_actor(self, prefix: str) -> None:
        """Keep the Ray actor class of a step or config line's prefix (the trainer's name tells
        verl's trainer mode: verl_top.verl.flavour)."""
        if not prefix or len(self.actors) >= MAX_ACTORS:
            return
        match = _PREFIX_ACTOR_RE.search(prefix)
        if match is not None and match.group(1) not in self.actors:
            self.actors.append(match.group(1))

    def _nccl_line(self, prefix: str, body: str, t: float, out: list[Record]) -> None:
        """NCCL's and PyTorch's lines printed into the verl log (workers' stderr reaches the
        driver's console), read like an NCCL log of the same path: the transport summary
        (NcclInfo, so a log that says "Using network Socket" is not asked for an NCCL log) and
        the watchdog / NCCL WARN events (LogEvent), once each. An event's line keeps its Ray
        prefix: the worker's pid in it ties a watchdog timeout to its process
        (``nccl.parse.parse_watchdog``); the INFO chatter goes without it (nothing there needs
        the pid)."""
        if self._nccl is None:
            self._nccl = NcclStreamParser(self.host, self.path)
        line = f"{prefix} {body}" if prefix and may_be_event(body) else body
        out.extend(r for r in self._nccl.feed([line], t) if isinstance(r, NcclInfo | LogEvent))

    def _continues(self, prefix: str, body: str) -> bool:
        """True when ``body`` is the next piece of the pending, terminal-wrapped step line."""
        if self._pending is None or prefix:
            return False  # a terminal wraps text; it adds no Ray prefix to the pieces
        text = body.strip()
        return (
            bool(text)
            and "=" not in text
            and not text.startswith(("{", "["))
            and _STEP_HEAD_RE.match(text) is None  # "step:1.96 - ..." is a wrapped time_per_step
            and _CONTINUATION_RE.match(text) is not None
        )

    def _end_pending(self, t: float, out: list[Record]) -> None:
        if self._pending is None:
            return
        prefix, body = self._pending
        self._pending = None
        self._note_actor(prefix)
        status, step, metrics = parse_console_body(body, self._layout)
        self._step(status, step, metrics, "console", t, out, body)

    def _block_line(self, body: str) -> bool:
        """Add one ``key: value`` line to the open block; False when the line is not one."""
        match = _BLOCK_PAIR_RE.match(body.strip())
        if match is None or self._block is None:
            return False
        value = _parse_value(match.group(2))
        if value is None:
            return False
        self._block[1][match.group(1)] = value
        return True

    def _end_block(self, t: float, out: list[Record]) -> None:
        if self._block is None:
            return
        step, metrics = self._block
        self._block = None
        status = OK if metrics else MALFORMED
        self._step(status, step, metrics, "console", t, out, f"step: {step}")

    def _malformed(self, body: str) -> None:
        self.malformed += 1
        if not self.first_malformed:
            self.first_malformed = _shown(body)

    def _step(
        self,
        status: str,
        step: int,
        metrics: dict[str, float],
        source: str,
        t: float,
        out: list[Record],
        body: str = "",
    ) -> bool:
        if status == NONE:
            return False
        if status in (MALFORMED, TRUNCATED):
            self._malformed(body)
            self.truncated += status == TRUNCATED
        if status in (OK, TRUNCATED):
            self.steps += 1
            # nan/inf are read (verl prints them) but kept out of the record: absent = no data,
            # so no share, ratio or export ever sees a non-finite number.
            # One C sum tells the usual all-finite step (nan or inf make it non-finite, as
            # does an overflow, which only costs the filter).
            # The dict is the parse's own (no copy: nothing else holds it).
            finite_metrics = (
                metrics
                if math.isfinite(sum(metrics.values()))
                else {k: v for k, v in metrics.items() if math.isfinite(v)}
            )
            out.append(
                VerlStep(host=self.host, t=t, step=step, metrics=finite_metrics, source=source)
            )
        return True

    def _emit_config(self, collected: CollectedConfig | None, t: float, out: list[Record]) -> None:
        if collected is None:
            return
        source = "console_partial" if collected.partial else "console"
        self._emit_values(flatten(collected.tree), source, t, out)

    def _on_overrides(self, overrides: dict[str, Any], t: float, out: list[Record]) -> None:
        """A launch command's overrides: the config until one is printed, then what fills the
        keys the printed config lacks (an excerpt cut it)."""
        self._overrides.update(overrides)
        if self._printed is None:
            self._emit_values(dict(self._overrides), COMMAND_LINE_SOURCE, t, out, printed=False)
        else:
            self._emit_values(*self._printed, t, out)

    def _emit_values(
        self,
        values: dict[str, Any],
        source: str,
        t: float,
        out: list[Record],
        printed: bool = True,
    ) -> None:
        if printed:
            self._printed = (values, source)
            # The printed config is the resolved truth; the command line fills only its gaps.
            values = {**self._overrides, **values} if self._overrides else values
        if values == self._last_values:
            return
        self._last_values = values
        self.configs += 1
        self.config_keys = len(values)
        self.config_source = source
        out.append(VerlConfig(host=self.host, t=t, values=values, source=source))

    def _config_from_text(self, t: float, out: list[Record]) -> None:
        try:
            tree = load_config_text("\n".join(self._text), json_first=self._json_file)
        except ConfigError as exc:  # a limit, not an incomplete file: stop re-reading it
            self._malformed(f"config refused: {exc}")
            self._text, self.config_file = [], False
            return
        if tree:
            self._emit_values(flatten(tree), "json" if self._json_file else "yaml", t, out)


def _shown(body: str) -> str:
    """A line as it may be shown back to the user: cleaned and shortened."""
    return clean_text(body.strip(), MAX_SHOWN_LINE)


@dataclass
class ParsedLog:
    """A whole verl output file, parsed."""

    path: str
    steps: list[VerlStep] = field(default_factory=list)
    config: dict[str, Any] | None = None
    config_source: str = ""  # console | console_partial | yaml | json
    lines: int = 0
    matched: int = 0
    malformed: int = 0
    truncated: int = 0
    first_unmatched: str = ""
    first_malformed: str = ""

    @property
    def n_steps(self) -> int:
        """Number of step records (a validation line and a training line may share a number)."""
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        """The highest step number seen."""
        return max((s.step for s in self.steps), default=None)

    @property
    def counts(self) -> dict[str, int]:
        """Line, step and malformed counts, for reports."""
        return {
            "lines": self.lines,
            "matched": self.matched,
            "steps": self.n_steps,
            "malformed": self.malformed,
            "truncated": self.truncated,
        }

    def step(self, number: int) -> VerlStep | None:
        """The last record with this step number (the training line wins over step-0 validation)."""
        found = None
        for rec in self.steps:
            if rec.step == number:
                found = rec
        return found


def _read_lines(path: Path) -> Iterable[str]:
    # Split on "\n" only (like the agent's follower); "\r" is handled per line.
    with path.open("rb") as handle:
        for raw in handle:
            yield raw.decode("utf-8", errors="replace")


def parse_file(path: str | Path, host: str = "", t: float = 0.0, chunk: int = 2048) -> ParsedLog:
    """Parse a verl console log, a ``file``-logger JSONL or a mix, line by line.

    Every record gets time ``t`` (a file carries no arrival times). The config is the last one
    printed (or the whole file's, for a YAML/JSON path).
    """
    path = Path(path)
    parser = VerlStreamParser(host, str(path))
    result = ParsedLog(path=str(path))
    batch: list[str] = []

    def take(records: list[Record]) -> None:
        for rec in records:
            if isinstance(rec, VerlStep):
                result.steps.append(rec)
            elif isinstance(rec, VerlConfig):
                result.config, result.config_source = rec.values, rec.source

    for line in _read_lines(path):
        batch.append(line)
        if len(batch) >= chunk:
            take(parser.feed(batch, t, more=True))
            batch = []
    take(parser.feed(batch, t))
    take(parser.flush(t))
    result.lines = parser.lines
    result.matched = parser.matched
    result.malformed = parser.malformed
    result.truncated = parser.truncated
    result.first_unmatched = parser.first_unmatched
    result.first_malformed = parser.first_malformed
    return result
