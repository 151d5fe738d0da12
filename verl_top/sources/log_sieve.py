"""A finished verl log read without decoding the lines nothing reads (issue 30).

A real log is mostly lines no parser needs (a reward function printing each sample, vLLM and
Ray chatter). ``VerlStreamParser`` already skips them while it is *quiet* (no step line,
metrics block, config, traceback or launch command open) by a test on each cleaned line; here
that test is done on a whole block of the file's bytes at C speed (one compiled hyperscan scan;
where hyperscan cannot be imported, the same test as ``re`` passes), so those lines are never
decoded, cleaned or looked at in Python. Only the lines that may pass the test are decoded
and cleaned at the boundary (``untrusted.clean_lines``) and fed to the parser; every other
line is counted. When the parser is not quiet (inside a traceback, a printed config, a
wrapped step line) the lines are fed one after the other, as before.

Exactness: a line is left out only when its *cleaned* text could not hold a marker of the
quiet test. The markers are searched in the raw bytes with patterns that accept any
non-ASCII byte where the parser's patterns accept a Unicode letter or space. Cleaning removes
escape sequences, control and invisible characters, which could splice a marker together
("st\\x1b[0mep:"): every line holding a control byte, an invisible or C1 character, or an
escape sequence other than a colour code where no marker can run through it (at the line's
start or end, or between ``)`` and a blank) is read like a marker line.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from verl_top.agent.follow import MAX_PARTIAL
from verl_top.untrusted import INVISIBLE_ASTRAL, INVISIBLE_BMP, clean_lines

BLOCK = 1024 * 1024  # bytes read at a time (~10 ms of work: the app's loop stays free)
DENSE_RUN = 16  # lines fed at a time while the parser reads every line
MIN_WINDOW = 4096  # bytes a compiled scan is given after a match (it doubles while none is found)

# What the parser's quiet test (verl/parse.py VerlStreamParser.feed) looks for, on raw bytes:
# each pattern then takes the rest of its line, so a line yields one match per pattern.
# [\x80-\xff] stands for the Unicode letters and spaces ``\w`` and ``\s`` accept in text.
_MARKERS = tuple(
    re.compile(p + rb"[^\n]*")
    for p in (
        rb"\{[\"']",  # JSONL, a pprinted config
        rb"NCCL",
        rb"step(?:[ \t\r]|[\x80-\xff])*[:=]",
        rb"/[\w@./()\-\x80-\xff]*:",
        rb"-m[ \t]",  # LaunchReader.OPENERS ("-m\t" cleans to "-m    ")
        rb"main_",
    )
)
# Long literal markers are found by bytes.find, which skips ahead by their length (a regex
# with a literal head looks at every byte): half the cost of a pass over the block.
_ERROR_EXECUTING = b"Error executing job"
# CrashScanner's traceback opener counts only at the start of a line's unprefixed body, after
# a blank (a timestamp's, srun's) or a line or \r start: never after a digit or ASCII punctuation
# (a worker's "ERROR:<time>,953:Traceback (most"), unless that byte ends an escape sequence
# cleaning removes (ESC, then only bytes 0x20-0x3F: "ESC 7", "ESC # 8"), which could bare a start.
_TRACEBACK = b"Traceback (most"
_ESCAPE_TAIL = re.compile(rb"\x1b[\x20-\x3f]*")
# An escape sequence whose removal could join the text on both sides into a marker: any but
# a plain colour code (ESC [ digits m) at the start of a line, at its end, or before a blank
# after a byte that no marker has before a blank (markers with one: "step :", "Traceback (",
# "Error executing job", "-m "). A run of codes is judged code by code: the byte before the
# second is the first one's "m".
_NO_BLANK_AFTER = bytes(sorted(set(range(0x21, 0x7F)) - set(b"pkrgm")))
_ANY_OTHER = bytes(sorted(set(range(256)) - set(_NO_BLANK_AFTER) - {0x0A}))
_RISKY_ESCAPE = re.compile(
    rb"\x1b(?:(?<=[" + re.escape(_NO_BLANK_AFTER) + rb"]\x1b)(?!\[[0-9;]*m[\n ])"
    rb"|(?<=[" + re.escape(_ANY_OTHER) + rb"]\x1b)(?!\[[0-9;]*m\n))"
)
# Of those, a colour code before a blank after p, k, r, g or m joins a marker only after the
# word the marker has there; checked in Python on the few such codes (Ray's folded traceback
# frames: "in _cursor ESC[32m [repeated 9x across cluster]"), which a regex alternative per
# word would check at every escape.
_BLANK_AFTER = (b"step", b"Traceback", b"Error", b"executing", b"-m")
_WORD_ENDS = frozenset(b"pkrgm")
_COLOUR_BLANK = re.compile(rb"\x1b\[[0-9;]*m ")
_CONTROL_BYTES = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_CONTROL = re.compile(b"[" + re.escape(_CONTROL_BYTES) + b"]")


def _hex(data: bytes) -> bytes:
    """``data`` as ``\\xNN`` escapes, read alike by ``re`` and hyperscan (a NUL or a raw
    high byte in a pattern is not)."""
    return b"".join(b"\\x%02x" % b for b in data)


# The same test as one hyperscan database (when installed): every marker above, the escapes
# ``_RISKY_ESCAPE`` and ``_may_join`` take, the tracebacks ``_may_open`` takes, the control
# bytes and the characters cleaning removes, as patterns without lookaround (hyperscan reports
# matches in the order they end only for patterns without assertions). A scan stops at its
# first match; the next starts on the next line, one byte early: its newline is what a
# traceback opener may follow. Each is exactly the re path's test for valid UTF-8 (the re
# path's test of removable characters, on the non-ASCII bytes alone, may take a line more
# where invalid bytes stand around ASCII).
_NOT_COLOUR_THEN = rb"\x1b(?:[^\[]|\[[0-9;]*[^0-9;m]|\[[0-9;]*m[^%s])"
_HS_MARKERS = (
    rb"\{[\"']",
    rb"NCCL",
    rb"step[ \t\r\x80-\xff]*[:=]",
    rb"/[\w@./()\-\x80-\xff]*:",
    rb"-m[ \t]",
    rb"main_",
    _ERROR_EXECUTING,
    rb"[^\x21-\x3f]Traceback \(most",
    rb"\x1b[\x20-\x3f]*Traceback \(most",
    # a colour code before a blank, after a marker's word (the risky escapes' third kind)
    b"(?:" + b"|".join(_BLANK_AFTER) + rb")\x1b\[[0-9;]*m ",
    b"[" + _hex(_CONTROL_BYTES) + b"]",
)
_HS_ESCAPES = (
    # an escape after a byte no marker has before a blank, or after p, k, r, g or m: risky
    # unless a colour code before a blank or the line's end
    b"[" + _hex(_NO_BLANK_AFTER + bytes(sorted(_WORD_ENDS))) + b"]" + _NOT_COLOUR_THEN % rb"\n ",
    # ... after any other byte: unless a colour code at the line's end
    b"[" + _hex(bytes(sorted(set(_ANY_OTHER) - _WORD_ENDS))) + b"]" + _NOT_COLOUR_THEN % rb"\n",
)


def _class_members(spec: str) -> Iterator[int]:
    """The code points of a regex character class body made of characters and ``a-b``."""
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            yield from range(ord(spec[i]), ord(spec[i + 2]) + 1)
            i += 3
        else:
            yield ord(spec[i])
            i += 1


def _trie_pattern(encodings: list[bytes]) -> bytes:
    """A regex matching exactly ``encodings`` (UTF-8 sequences sharing their first byte's
    length), tails with the same continuation grouped into one character class."""
    if len(encodings[0]) == 1:
        return b"[" + _hex(bytes(e[0] for e in encodings)) + b"]"
    heads: dict[int, list[bytes]] = {}
    for e in encodings:
        heads.setdefault(e[0], []).append(e[1:])
    by_tail: dict[bytes, list[int]] = {}
    for head, tails in sorted(heads.items()):
        by_tail.setdefault(_trie_pattern(sorted(tails)), []).append(head)
    alts = [b"[" + _hex(bytes(hs)) + b"]" + tail for tail, hs in by_tail.items()]
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


def _removable_tails() -> dict[int, bytes]:
    """Per UTF-8 lead byte, the pattern of the rest of the characters cleaning removes that
    start with it: C1 controls, invisible characters (untrusted.INVISIBLE_*)."""
    points = [*range(0x80, 0xA0), *_class_members(INVISIBLE_BMP + INVISIBLE_ASTRAL)]
    groups: dict[int, list[bytes]] = {}
    for cp in points:
        enc = chr(cp).encode("utf-8")
        groups.setdefault(enc[0], []).append(enc[1:])
    return {lead: _trie_pattern(sorted(set(tails))) for lead, tails in groups.items()}


def _removable_by_lead() -> dict[int, re.Pattern[bytes]]:
    """Per UTF-8 lead byte, a compiled pattern of the characters cleaning removes that start
    with it."""
    return {
        lead: re.compile(_hex(bytes([lead])) + tail) for lead, tail in _removable_tails().items()
    }


class _Scan:
    """One hyperscan block-mode database, scanned from line to line."""

    def __init__(self, hyperscan: Any, patterns: list[bytes]) -> None:
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(
            expressions=patterns,
            ids=list(range(len(patterns))),
            elements=len(patterns),
            flags=[0] * len(patterns),
        )
        self._scratch = hyperscan.Scratch(self._db)
        self._stopped = hyperscan.ScanTerminated

    @staticmethod
    def _first(_id: int, _start: int, end: int, _flags: int, found: list[int]) -> bool:
        found.append(end)
        return True  # stop: the rest of this line is taken anyway

    def lines(self, view: memoryview, block: bytes, at: int, out: list[int]) -> None:
        """Add to ``out`` a byte of each line of ``view`` (``block``'s whole lines) after
        ``at`` that holds a match: the match's last byte (a newline only where the match ends
        with its line's).

        A scan costs up to the length it is given, even when it stops at its first match (a
        JSONL log, a match a line: 118 ms a MiB given the rest of the block each time, 7 for
        the ``re`` passes), so it is given a window of whole lines: ``MIN_WINDOW`` after a
        match, doubling while none is found."""
        found: list[int] = []
        end = len(view)
        window = MIN_WINDOW
        while 0 <= at < end:
            stop = at + window
            if stop >= end:
                stop = end
            else:  # whole lines: to the window's last newline, or past a longer line's
                cut = block.rfind(b"\n", at + 1, stop)
                stop = cut + 1 if cut > at else min(end, block.find(b"\n", stop) + 1)
            try:
                self._db.scan(view[at:stop], self._first, context=found, scratch=self._scratch)
            except self._stopped:
                pass
            if found:
                hit = at + found.pop() - 1
                out.append(hit)
                at = block.find(b"\n", hit)  # the next scan starts one byte before the next line
                window = MIN_WINDOW
            elif stop == end:
                return
            else:
                at = stop - 1  # the window's last newline: the byte before its next line
                window = min(2 * window, BLOCK)


class _CompiledMarkers:
    """The sieve's test (``_HS_MARKERS`` and the removable characters) as hyperscan scans.
    The escape patterns are a database of their own: a log holds an escape every few dozen
    bytes (colour codes), and in one database with the markers each stopped the scan for
    the literals' engine, 2.5x the time of the two scans."""

    def __init__(self, hyperscan: Any) -> None:
        removable = b"|".join(_hex(bytes([lead])) + t for lead, t in _removable_tails().items())
        self._scans = (
            _Scan(hyperscan, [*_HS_MARKERS, removable]),
            _Scan(hyperscan, list(_HS_ESCAPES)),
        )

    def positions(self, block: bytes, end: int) -> list[int]:
        """A byte of each line of ``block[:end]`` (whole lines) that holds a match (not in
        order)."""
        out: list[int] = []
        at = 0  # the block's start, or the newline before a line
        if block.startswith(_TRACEBACK):  # no byte before it: the patterns need one
            out.append(0)
            at = block.find(b"\n")
        view = memoryview(block)[:end]
        self._scans[0].lines(view, block, at, out)
        self._scans[1].lines(view, block, 0, out)
        return out


def compiled_markers() -> _CompiledMarkers | None:
    """The sieve's compiled scan, or None where hyperscan is not installed or cannot run on
    this CPU (the ``re`` path then: same lines, several passes)."""
    try:
        import hyperscan
    except ImportError:
        return None
    try:
        return _CompiledMarkers(hyperscan)
    except hyperscan.error:  # e.g. a CPU without the instructions the library was built for
        return None


class LineSink(Protocol):
    """What reads the selected lines: a verl stream parser, through the pipeline."""

    def quiet(self) -> bool:
        """True when a line without a marker would be skipped (only counted)."""
        ...

    def skip(self, n: int) -> None:
        """``n`` lines without a marker went by."""
        ...

    def feed(self, lines: list[str]) -> None:
        """Cleaned lines, in file order (more follow)."""
        ...

    def counted(self) -> None:
        """A block was read: show the counts so far."""
        ...

    def finish(self) -> None:
        """The file's end: nothing more follows (a step line held for its wrap is complete)."""
        ...


@dataclass
class SieveStats:
    """What a sieved read went through: lines, bytes, lines decoded, runaway lines."""

    lines: int = 0
    bytes: int = 0
    decoded: int = 0
    skipped_long: int = 0


@dataclass
class _Hits:
    """The lines of a block that may matter: index, first byte, byte of their newline; and
    how many lines the block has."""

    index: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    lines: int = 0


class LogSieve:
    """Finds, in blocks of a log's bytes, the lines a quiet verl parser would not skip."""

    def __init__(self, compiled: bool = True) -> None:
        """``compiled``: scan with hyperscan when it is installed (False: the ``re`` path)."""
        self._compiled = compiled_markers() if compiled else None
        # The re path's pieces (~4 ms of compiling: not made when the compiled scan runs).
        self._removable = _removable_by_lead() if self._compiled is None else {}
        # What is left of a block without its printable ASCII (tabs, \r and escapes too):
        # its newlines, control bytes and non-ASCII characters, mostly nothing.
        self._ascii = bytes([0x09, 0x0D, 0x1B, *range(0x20, 0x7F)])
        keep = {*_CONTROL_BYTES, *self._removable}
        self._gate = bytes(b for b in range(256) if b not in keep)

    def hits(self, block: bytes, end: int | None = None) -> _Hits:
        """The lines of ``block[:end]`` (whole lines, each ending in a newline; ``end`` None:
        all of it) that hold a marker or something cleaning would remove around one."""
        end = len(block) if end is None else end
        if self._compiled is not None:
            return _lines_at(block, self._compiled.positions(block, end), end)
        if end < len(block):
            block = block[:end]  # the re path's passes take no bounds
        positions: list[int] = []
        for pattern in _MARKERS:
            positions += [m.start() for m in pattern.finditer(block)]
        positions += _found(block, _ERROR_EXECUTING)
        positions += [p for p in _found(block, _TRACEBACK) if _may_open(block, p)]
        positions += [
            m.start() for m in _RISKY_ESCAPE.finditer(block) if _may_join(block, m.start())
        ]
        hits = _lines_at(block, positions, len(block))
        rest = block.translate(None, self._ascii)
        if len(rest) > hits.lines:  # more than its newlines
            _merge(hits, _spans_of(block, self._removable_lines(rest)))
        return hits

    def _removable_lines(self, rest: bytes) -> list[int]:
        """The lines (by index) holding a control byte or a character cleaning removes, in
        ``rest``: a block's newlines and non-ASCII bytes (a character's bytes stay together)."""
        present = set(rest.translate(None, self._gate))
        patterns = [self._removable[b] for b in present if b in self._removable]
        if present & set(_CONTROL_BYTES):
            patterns.append(_CONTROL)
        lines: set[int] = set()
        for pattern in patterns:
            prev = line = 0
            for m in pattern.finditer(rest):
                line += rest.count(b"\n", prev, m.start())
                prev = m.start()
                lines.add(line)
        return sorted(lines)


def _found(block: bytes, literal: bytes) -> list[int]:
    """Where ``literal`` starts in ``block``, each occurrence (non-overlapping)."""
    out = []
    pos = block.find(literal)
    while pos >= 0:
        out.append(pos)
        pos = block.find(literal, pos + len(literal))
    return out


def _may_join(block: bytes, pos: int) -> bool:
    """False for a risky escape at ``pos`` that is a colour code before a blank after p, k,
    r, g or m where no marker's word ends (its removal cannot make a marker)."""
    if block[pos - 1] not in _WORD_ENDS or _COLOUR_BLANK.match(block, pos) is None:
        return True
    return block.endswith(_BLANK_AFTER, 0, pos)


def _may_open(block: bytes, pos: int) -> bool:
    """True when the ``Traceback (most`` at ``pos`` may start a line's body once cleaned
    (``VerlStreamParser``'s quiet test, on the cleaned line, is the same without escapes)."""
    if pos == 0 or not 0x21 <= block[pos - 1] <= 0x3F:
        return True
    esc = block.rfind(b"\x1b", 0, pos)
    return esc >= 0 and _ESCAPE_TAIL.fullmatch(block, esc, pos) is not None


def _lines_at(block: bytes, positions: list[int], stop: int) -> _Hits:
    """The distinct lines holding ``positions``, in order, and the line count of
    ``block[:stop]``."""
    out = _Hits()
    line, prev, last_end = 0, 0, -1
    for pos in sorted(positions):
        if pos <= last_end:
            continue  # on the line already taken
        line += block.count(b"\n", prev, pos)
        end = block.find(b"\n", pos)
        out.index.append(line)
        out.start.append(block.rfind(b"\n", 0, pos) + 1)
        out.end.append(end)
        prev, last_end = pos, end
    out.lines = line + block.count(b"\n", prev, stop)
    return out


def _spans_of(block: bytes, lines: list[int]) -> _Hits:
    """The lines of ``block`` with these (sorted) indices."""
    out = _Hits()
    line = pos = 0
    for want in lines:
        while line < want:
            pos = block.find(b"\n", pos) + 1
            line += 1
        out.index.append(want)
        out.start.append(pos)
        out.end.append(block.find(b"\n", pos))
    return out


def _merge(hits: _Hits, more: _Hits) -> None:
    """``hits`` with the lines of ``more`` it lacks, in order."""
    rows = dict(zip(hits.index, zip(hits.start, hits.end, strict=True), strict=True))
    rows.update(zip(more.index, zip(more.start, more.end, strict=True), strict=True))
    order = sorted(rows)
    hits.index[:] = order
    hits.start[:] = [rows[i][0] for i in order]
    hits.end[:] = [rows[i][1] for i in order]


def _texts(block: bytes, spans: list[tuple[int, int]]) -> list[str]:
    """The lines of ``block`` at ``spans`` decoded and cleaned at the boundary, as the
    follower reads them (a CRLF line loses its \\r)."""
    raw = b"\n".join(block[s:e] for s, e in spans)
    text = raw.decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").removesuffix("\r")
    return clean_lines(text.split("\n"))


class SievedRead:
    """Reads a finished log to its end into a ``LineSink``, decoding only what it needs."""

    def __init__(self, fh: BinaryIO, sink: LineSink, sieve: LogSieve | None = None) -> None:
        self.fh = fh
        self.sink = sink
        self.sieve = sieve or LogSieve()
        self.stats = SieveStats()
        self._carry = b""
        self._skipping = False  # inside a line over MAX_PARTIAL: dropped to its newline
        self._seekable = fh.seekable()

    async def run(self) -> int:
        """Read to the end; returns the offset reached (the file's end; for a file that
        cannot seek, the bytes read). A last line without a newline counts as a line (the
        file is finished)."""
        while True:
            data = self.fh.read(BLOCK)
            if not data:
                break
            self.stats.bytes += len(data)
            block, end = self._whole_lines(data)
            if end:
                self._block(block, end)
                self.sink.counted()
            await asyncio.sleep(0)  # one block at a time: the app's loop stays free
        if self._carry and not self._skipping:  # as the follower flushes it: no \r at its end
            last = self._carry.rstrip(b"\r") + b"\n"
            self._block(last, len(last))
        self._carry = b""
        # The log is finished: a step line held in case it wraps onto the next line is whole
        # (the app follows on and would hold it forever; diagnose ended it at its end).
        self.sink.finish()
        self.sink.counted()
        return self.fh.tell() if self._seekable else self.stats.bytes

    def _whole_lines(self, data: bytes) -> tuple[bytes, int]:
        """The whole lines that ``data`` completes, as ``data[:end]`` (runaway lines dropped
        and counted). The partial line after them is read again with the next block where
        the file can seek (no 1 MiB copy to join it to the next block), else carried."""
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return b"", 0
            data, self._skipping = data[nl + 1 :], False
        data = self._carry + data if self._carry else data
        cut = data.rfind(b"\n")
        tail = len(data) - cut - 1
        if self._seekable and cut >= 0 and 0 < tail <= MAX_PARTIAL:
            self.fh.seek(-tail, io.SEEK_CUR)
            self.stats.bytes -= tail
            self._carry = b""
        else:
            self._carry = data[cut + 1 :]
        if len(self._carry) > MAX_PARTIAL:
            self._carry, self._skipping = b"", True
            self.stats.skipped_long += 1
        first = data.find(b"\n", 0, cut + 1)
        # Only the first line can exceed MAX_PARTIAL (it may have been carried): the follower
        # drops a line of more than MAX_PARTIAL characters.
        if first > MAX_PARTIAL and len(data[:first].decode("utf-8", "replace")) > MAX_PARTIAL:
            self.stats.skipped_long += 1
            return data[first + 1 : cut + 1], cut - first
        return data, cut + 1

    def _block(self, block: bytes, stop: int) -> None:
        """Give the lines of ``block[:stop]`` to the sink: the quiet ones counted, the rest
        fed."""
        hits = self.sieve.hits(block, stop)
        n = hits.lines
        self.stats.lines += n
        texts = _texts(block, list(zip(hits.start, hits.end, strict=True))) if hits.index else []
        self.stats.decoded += len(texts)
        sink, index = self.sink, hits.index
        i = pos = k = 0  # next line (its index, first byte), next hit
        run, last_dense = 0, -1  # dense runs double while the parser stays awake
        while i < n:
            while k < len(index) and index[k] < i:
                k += 1
            if sink.quiet():
                nxt = index[k] if k < len(index) else n
                sink.skip(nxt - i)
                if nxt == n:
                    return
                j = k + 1  # hits on the lines right after it go along
                while j < len(index) and index[j] == index[j - 1] + 1:
                    j += 1
                sink.feed(texts[k:j])
                i, pos, k = index[j - 1] + 1, hits.end[j - 1] + 1, j
                continue
            # Every line is read now (a traceback, a config, a wrapped step line): a few
            # at a time, up to the next hit; feeding more than needed reads as before.
            run = min(run * 2, DENSE_RUN) if i == last_dense else 1
            stop = min(n, i + run, index[k] if k < len(index) and index[k] > i else n)
            end = pos
            spans = []
            for _ in range(stop - i):
                nl = block.find(b"\n", end)
                spans.append((end, nl))
                end = nl + 1
            lines = _texts(block, spans)
            self.stats.decoded += len(lines)
            sink.feed(lines)
            i, pos = stop, end
            last_dense = i
