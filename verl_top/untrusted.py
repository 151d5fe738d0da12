"""The trust boundary: every string and number that comes from outside passes through here once.

Foreign data is anything another process wrote: agent records, process command lines, user and
host names, verl/NCCL log lines, Ray/Prometheus/Slurm JSON. Where it enters (protocol decode, log
reader, HTTP clients, hosts parsing) it is made safe here, so that inside verl-top it is plain,
bounded, printable text and finite numbers:

- every terminal escape sequence (CSI, OSC, DCS, SOS, PM, APC, in 7-bit ``ESC x`` and 8-bit C1
  form) is removed, repeatedly, until none is left: removing one sequence can splice the halves of
  a nested one together, so a single pass is not enough;
- every remaining C0/C1 control character and DEL is removed (tab becomes a space), and so is
  every invisible character: Unicode format characters (zero-width space/joiners, bidi marks,
  overrides and isolates, the Arabic letter mark, BOM, tags), other default-ignorable code points
  (variation selectors, Hangul fillers) and line/paragraph separators. ``zw\u200bnode1`` must
  not pass for ``zwnode1``, nor ``\u202e`` show text in another order than it is stored;
- a lone surrogate (``"\ud800"`` in JSON) becomes U+FFFD, so every string can be encoded as
  UTF-8 when it is written out;
- length is bounded, with ``…`` marking the cut.

Everything here runs in time linear in the input: the escape pattern never fails after it has
consumed text (an unterminated string sequence ends where the next escape begins), so no input
makes the regex engine backtrack over a run (tests/test_untrusted.py times 1x/10x/100x inputs).

The UI still never renders foreign text as Rich markup (it uses ``rich.text.Text``); this module
makes the characters safe, the UI makes their meaning inert. See docs/security.md.
"""

from __future__ import annotations

import json
import math
import re
from types import ModuleType
from typing import Any

orjson: ModuleType | None
try:
    import orjson
except ImportError:  # a checkout run from its folder without it (a GPU node): json reads the same
    orjson = None

# Bounds on foreign text. Long enough for a verl step line or a full command line.
MAX_TEXT = 512  # names, titles, reasons, fields
MAX_LINE = 64 * 1024  # one log line (a verl step line with 200 metrics is ~12 KB)

# Escape sequences, 7-bit and 8-bit. String-type sequences (OSC, DCS, SOS, PM, APC) run to their
# terminator (BEL or ST), to the next ESC (which a terminal takes as the start of a new sequence,
# ending the string), or to the end of the text. Every part after the introducer is a greedy run
# followed by an *optional* part, so a match attempt never fails after consuming anything: the
# old form ``[^...]*(?:BEL|ST|$)`` failed at every position of a run of C1 introducers before
# one ESC, and cleaning one 32 000-character line took 11 s.
_ESCAPES = re.compile(
    r"""
    (?=[\x1b\x90\x98\x9b\x9d\x9e\x9f])  # cheap reject of every other position (3x faster)
    (?:
      (?:\x1b\[|\x9b)[\x20-\x3f]*[\x40-\x7e]?            # CSI: params, intermediates, final
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])          # OSC, DCS, SOS, PM, APC ...
      [^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?              # ... up to BEL / ST / ESC / end
    | \x1b[\x20-\x2f]*[\x30-\x7e]?                      # other ESC sequences (charset, RIS, ...)
    )
    """,
    re.VERBOSE,
)
_ESCAPE_START = re.compile(r"[\x1b\x90\x98\x9b\x9d\x9e\x9f]")
# Invisible characters: every Unicode format character (Cf: soft hyphen, Arabic number signs and
# letter mark, Mongolian vowel separator, zero-width space/non-joiner/joiner, LRM/RLM, the bidi
# embeddings/overrides/isolates, word joiner and invisible operators, BOM, interlinear
# annotations, tags; ranges a little wider than Unicode 14 so newer Pythons' additions are in),
# the other default-ignorable code points (combining grapheme joiner, Hangul fillers, Khmer
# inherent vowels, Mongolian and other variation selectors) and the line/paragraph separators.
INVISIBLE_BMP = (
    "\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4"
    "\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f"
    "\ufeff\uffa0\ufff9-\ufffb"
)
INVISIBLE_ASTRAL = (
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff"
)
# The BMP classes compile to one bitmap lookup per character (as fast as the old, smaller
# class); ranges above U+FFFF would add comparisons for every character, so the astral
# invisibles have their own pattern, searched only in text that is not ASCII.
_SURROGATE = re.compile("[\ud800-\udfff]")
_ASTRAL = re.compile(f"[{INVISIBLE_ASTRAL}]")
# What survives escape removal and goes: C0 (tab/newline handled apart), DEL, C1, invisibles.
_CONTROLS = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{INVISIBLE_BMP}]")
_ASCII_UNSAFE = re.compile(r"[^\x20-\x7e]")  # ASCII text: only C0 and DEL can be unsafe
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{INVISIBLE_BMP}\ud800-\udfff]")


_INVISIBLE = re.compile(f"[{INVISIBLE_BMP}]")


def strip_invisible(text: str) -> str:
    """``text`` without its invisible characters (zero-width, bidi marks, BOM, tags, variation
    selectors...): what a matcher must not be fooled by (an ``hf_`` token split by U+200B)."""
    if text.isascii():
        return text
    return _ASTRAL.sub("", _INVISIBLE.sub("", text))


def _is_plain(text: str) -> bool:
    """True when ``text`` holds nothing the boundary removes or replaces (the fast path)."""
    if text.isascii():
        return _ASCII_UNSAFE.search(text) is None
    return _UNSAFE.search(text) is None and _ASTRAL.search(text) is None


def strip_escapes(text: str) -> str:
    """Remove every terminal escape sequence, in linear time.

    One left-to-right pass consumes every introducer (each one starts a match or lies inside
    one), so nothing can be spliced into a new sequence; the loop is a guard that ends after
    that pass (nesting cannot smuggle one through).
    """
    return _fixpoint(_ESCAPES, text, _ESCAPE_START)


def _plain(text: str, keep: str = "") -> str:
    """``text`` without escapes, controls (except those in ``keep``) and invisible characters;
    lone surrogates become U+FFFD."""
    if not text.isascii():
        text = _ASTRAL.sub("", _SURROGATE.sub("\ufffd", text))
    text = strip_escapes(text)
    if keep:
        return _CONTROLS.sub(lambda m: m.group(0) if m.group(0) in keep else "", text)
    return _CONTROLS.sub("", text)


def _bound(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def clean_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Foreign ``value`` as one line of plain printable text of at most ``limit`` characters.

    Non-strings are converted with ``str``; bytes are decoded as UTF-8 with replacement. Newlines
    and tabs become spaces (a name or title is one line on screen).
    """
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        value = bytes(value[: limit * 4 + 64]).decode("utf-8", "replace")
    elif not isinstance(value, str):
        value = str(value)
    # Cut early so a huge input costs little; escapes only shrink the text.
    if len(value) > limit * 4 + 64:
        value = value[: limit * 4 + 64]
    if _is_plain(value):
        return _bound(value, limit)
    text = value.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    return _bound(_plain(text), limit)


def clean_line(value: Any, limit: int = MAX_LINE) -> str:
    """One foreign log line: escapes and controls removed, ``\\r`` kept (progress-bar splits)."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    elif not isinstance(value, str):
        value = str(value)
    if len(value) > limit * 2:
        value = value[: limit * 2]
    if _is_plain(value):
        return _bound(value, limit)
    # Keep \r and \n: the log parsers split progress bars and glued lines on them.
    return _bound(_plain(value.replace("\t", "    "), keep="\r\n"), limit)


# The same sequences as _ESCAPES for many lines joined by "\n": a string-type sequence also
# ends at the end of its line, as it does in that line alone.
_OSC_BODY = r"[^\x07\x1b\x9c]*"
_ESCAPES_PER_LINE = re.compile(
    _ESCAPES.pattern.replace(_OSC_BODY, r"[^\x07\x1b\x9c\n]*"), re.VERBOSE
)
if _ESCAPES_PER_LINE.pattern == _ESCAPES.pattern:  # _ESCAPES changed shape: fix the line above
    raise ImportError("untrusted: _ESCAPES has no string-sequence body to bound per line")
# Its 7-bit half, starting with a literal ESC (which the regex engine finds ~25x faster than
# an alternation): the same matches wherever no 8-bit sequence starts outside one.
_ESC7_PER_LINE = re.compile(
    r"\x1b(?:\[[\x20-\x3f]*[\x40-\x7e]?|[\]PX^_][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|[\x20-\x2f]*[\x30-\x7e]?)"
)
_ESC = re.compile("\x1b")
_C1_START = re.compile(r"[\x90\x98\x9b\x9d\x9e\x9f]")
# _CONTROLS less \r, which clean_line keeps (\n separates the joined lines).
_CONTROLS_BUT_CR = re.compile(f"[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f{INVISIBLE_BMP}]")
# What clean_line would change in a joined chunk, besides the \n between lines and a kept \r.
_UNSAFE_BUT_CR = re.compile(
    f"[\\x00-\\x09\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f{INVISIBLE_BMP}\ud800-\udfff]"
)
# The colour codes real logs are made of (Ray's prefixes, vLLM, tqdm). Each holds one ESC, at
# its start, and is ESC [ digits m: at any ESC at most one of them matches.
COMMON_SGR = ("\x1b[0m", "\x1b[36m", "\x1b[2m", "\x1b[32m", "\x1b[39m", "\x1b[22m", "\x1b[1m")
# They are removed from the chunk's UTF-8 bytes in one pass: faster there than str.replace
# per code on a chunk that holds one non-Latin-1 letter (issue 30: a third of the cost).
_COMMON_SGR_BYTES = re.compile(
    b"\x1b\\[(?:" + b"|".join(re.escape(c[2:-1].encode()) for c in COMMON_SGR) + b")m"
)
# The bytes a plain line may hold as they are: printable ASCII, and the \n and kept \r.
_PLAIN_ASCII = bytes(range(0x20, 0x7F)) + b"\n\r"


def _fixpoint(pattern: re.Pattern[str], text: str, start: re.Pattern[str]) -> str:
    """Remove ``pattern`` until nothing changes (``start``: when none can be left)."""
    while start.search(text) is not None:
        cleaned = pattern.sub("", text)
        if cleaned == text:
            break
        text = cleaned
    return text


def _strip_escapes_per_line(text: str) -> str:
    """``strip_escapes`` of every line of ``text`` (lines joined by \n)."""
    if text.isascii():
        return _fixpoint(_ESC7_PER_LINE, text, _ESC)  # no 8-bit sequence can start
    fast = _fixpoint(_ESC7_PER_LINE, text, _ESC)
    # The 7-bit pass is exact unless an 8-bit sequence starts outside its matches, and then
    # that start is still in its result.
    if _C1_START.search(fast) is None:
        return fast
    return _fixpoint(_ESCAPES_PER_LINE, text, _ESCAPE_START)


def _unsafe(data: bytes) -> bool:
    """True when ``data`` (lines joined by \n, UTF-8 with lone surrogates passed through) holds
    anything clean_line would change besides a \r it keeps.

    Deleting the plain ASCII bytes leaves the other characters' whole UTF-8 sequences (no byte
    of a multibyte sequence is ASCII): usually a few letters, searched by the regexes instead
    of the whole chunk."""
    rest = data.translate(None, _PLAIN_ASCII)
    if not rest:
        return False
    text = rest.decode("utf-8", "surrogatepass")
    return _UNSAFE_BUT_CR.search(text) is not None or _ASTRAL.search(text) is not None


def clean_lines(values: list[str], limit: int = MAX_LINE) -> list[str]:
    """``[clean_line(v, limit) for v in values]`` for a list of strings, cleaned as one text.

    A followed log arrives in chunks of thousands of lines, and a Ray log colours nearly every
    line: a few passes over the chunk instead of a handful of regex calls per line make the
    boundary cost about what reading costs (issue 30). Lines that themselves hold a newline,
    or are longer than ``2 * limit``, take the per-line path; raises TypeError when an item is
    not a string (as ``str.join`` does)."""
    if not values:
        return []
    text = "\n".join(values)
    if text.count("\n") != len(values) - 1 or max(map(len, values)) > 2 * limit:
        return [clean_line(v, limit) for v in values]
    lines = _plain_lines(text)
    if lines is None:  # clean_line's steps, in its order, on every line at once
        text = text.replace("\t", "    ")
        if not text.isascii():
            text = _ASTRAL.sub("", _SURROGATE.sub("\ufffd", text))
        text = _CONTROLS_BUT_CR.sub("", _strip_escapes_per_line(text))
        lines = text.split("\n")
    if max(map(len, lines)) > limit:
        lines = [_bound(line, limit) for line in lines]
    return lines


def _plain_lines(text: str) -> list[str] | None:
    """The lines of ``text`` cleaned, when all it holds to clean is tabs and common colour
    codes; else None (the general path decides).

    Exact: when removing the common codes leaves no ESC, every ESC of ``text`` started one of
    them, and each is a whole CSI sequence to ``_ESCAPES`` too, so nothing else could have
    been spliced or swallowed. The work is done on the UTF-8 bytes, where every needle is
    ASCII and so never matches inside another character's encoding."""
    data = text.encode("utf-8", "surrogatepass")
    if b"\x1b" in data:
        data = _COMMON_SGR_BYTES.sub(b"", data)
        if b"\x1b" in data:
            return None
    if b"\t" in data:
        data = data.replace(b"\t", b"    ")
    # No lone surrogate gets past _unsafe: what is left decodes strictly.
    return None if _unsafe(data) else data.decode("utf-8").split("\n")


def is_clean(text: str) -> bool:
    """True when ``text`` holds no escape, control or invisible character nor a lone surrogate
    (what the boundary guarantees)."""
    return _is_plain(text)


def finite(value: Any, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    """``value`` as a finite float within ``[lo, hi]``, else None (never raises).

    Booleans are not numbers here; strings are not parsed (a number on the wire is a JSON number).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    if not math.isfinite(number) or number < lo or number > hi:
        return None
    return number


def bounded_int(value: Any, lo: int, hi: int) -> int | None:
    """``value`` as an int within ``[lo, hi]``, else None. 1.0 counts as 1; 1.5 does not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        value = int(value)
    if not isinstance(value, int) or value < lo or value > hi:
        return None
    return value


MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 32 * 1024 * 1024


class UntrustedJSONError(ValueError):
    """A foreign JSON document that is too large, too deep or not JSON."""


# A JSON string literal (unrolled loop, in C). The closing quote is optional so that a match
# never fails after consuming: with a required quote, an unterminated string full of escaped
# quotes (``"\\"\\"\\"...``) was rescanned from each of them, and 80 KB took 29 s.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def _depth_ok(text: str, max_depth: int) -> bool:
    """False when brackets outside strings nest deeper than ``max_depth``.

    Strings are cut out by a regex first, so only the few structural brackets are walked in
    Python: a 5 MB log record costs milliseconds, not the half second a per-character loop took.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return True  # cannot nest deeper than there are brackets
    depth = 0
    for ch in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        else:
            depth -= 1
    return True


def _depth_ok_slow(text: str, max_depth: int) -> bool:
    """The reference scan (one character at a time), kept for the equivalence test."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads(
    data: str | bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Parse foreign JSON with bounds on size and nesting; raises UntrustedJSONError.

    The depth check runs before ``json.loads`` so a hostile document never reaches Python's
    recursion limit. NaN and Infinity literals are refused (they are not JSON).
    """
    if len(data) > max_bytes:
        raise UntrustedJSONError(f"JSON document of {len(data)} bytes exceeds {max_bytes}")
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    if ("[" in text or "{" in text) and not _depth_ok(text, max_depth):
        raise UntrustedJSONError(f"JSON nested deeper than {max_depth}")
    try:
        return _decode(text)
    except (ValueError, RecursionError) as exc:
        raise UntrustedJSONError(f"not JSON: {exc}"[:200]) from exc


# orjson reads a document ~6x faster than the json module (a GPU sample's line: ~2 us against
# ~11 us; at 4096 GPUs that is 4096 lines a second, issue 30) and gives the same values, except
# that it refuses what ``_JSON`` maps or keeps (NaN/Infinity, 1e400, a lone surrogate: then
# ``_JSON`` decides) and makes an integer beyond 64 bits a float. A document with a run of 19
# digits anywhere (the shortest integer that may not fit) goes to ``_JSON`` for that reason.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19


def _decode(text: str) -> Any:
    """``_JSON.decode(text)``, faster where orjson reads the document the same way."""
    if orjson is not None and _NINETEEN_DIGITS not in text.encode(
        "utf-8", "surrogatepass"
    ).translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(text)
        except ValueError:  # orjson.JSONDecodeError: _JSON gives the value, or the reason
            pass
    return _JSON.decode(text)


def _no_number(_name: str) -> None:
    return None


# --- streamed JSON: one large array read item by item ----------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_JSON = json.JSONDecoder(parse_constant=_no_number)
# The states JsonArrayStream._items takes (the array's items and the commas between them).
_ITEM_STATES = frozenset({"item_or_end", "item", "item_after"})


class _More(Exception):
    """The buffer ends inside the next token: wait for more input."""


class JsonArrayStream:
    """Reads a foreign JSON object incrementally, decoding the items of one array one at a time.

    An HTTP answer of tens of MB decoded whole costs ~20x its size in Python objects (a 63 MiB
    Prometheus range answer took 1.4 GB). Here the body is fed as it arrives; the items of the
    array at ``path`` (``("data", "result")``) are decoded one by one and handed to ``convert``,
    which keeps what it needs in a compact form (or None to drop the item), and the text they
    came from is let go. Memory is bounded by one item (``max_item`` characters) plus one chunk,
    whatever the body's size. Values elsewhere in the document are decoded whole but must stay
    under ``max_other`` characters in all; at most ``max_items`` items are read (``truncated`` says
    when more came). Raises UntrustedJSONError when the text is not such a document or a cap
    is hit. Linear time: an item that is still incomplete is retried only once the buffer has
    doubled since the last try.
    """

    def __init__(
        self,
        path: tuple[str, ...],
        convert: Any = None,
        max_items: int = 100_000,
        max_item: int = 1 << 20,
        max_other: int = 1 << 20,
    ) -> None:
        self.path = path
        self.convert = convert if convert is not None else (lambda item: item)
        self.max_items, self.max_item, self.max_other = max_items, max_item, max_other
        self.items: list[Any] = []
        self.dropped = 0  # items convert refused
        self.truncated = False  # more than max_items came: the rest was not read
        self.chars = 0
        self._buf = ""
        self._pos = 0
        self._state = "start"
        self._stack: list[tuple[dict[str, Any], str]] = []  # open objects and the key being read
        self._root: dict[str, Any] | None = None
        self._retry_at = 0  # buffer length below which an incomplete token is not retried
        self._mark = 0  # where the step being taken began (it is redone from there)
        self._after = False  # text came after the document was complete
        self._other_chars = 0
        self._eof = False

    @property
    def done(self) -> bool:
        """True once the document is complete or the item cap was reached."""
        return self._state == "done" or self.truncated

    def feed(self, text: str) -> None:
        """Take the next piece of the document."""
        if self.done:
            # Text after a complete document is refused at finish as it is in the same piece.
            self._after = self._after or (not self.truncated and bool(text.strip(" \t\n\r")))
            return
        self.chars += len(text)
        if self._pos:  # let go of what was read (positions move with it)
            self._buf = self._buf[self._pos :]
            self._retry_at = max(0, self._retry_at - self._pos)
            self._pos = 0
        self._buf += text
        self._run()

    def finish(self) -> dict[str, Any]:
        """The document with the array replaced by the converted items (UntrustedJSONError if
        the text ended early)."""
        self._eof = True
        if not self.done:
            self._run()
        if self._root is None or not self.done:
            raise UntrustedJSONError("the JSON document ended early (cut or not JSON)")
        if not self.truncated and (self._after or self._buf[self._pos :].strip(" \t\n\r")):
            raise UntrustedJSONError("text after the end of the JSON document")
        return self._root

    # the walk

    def _run(self) -> None:
        self._mark = self._pos
        try:
            while not self.done:
                # Whitespace between tokens is consumed for good: a long run of it (a gzip
                # bomb of spaces) is never scanned twice.
                # _WS matches the empty string, so match() is never None (no check in this loop).
                self._mark = self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
                if self._state in _ITEM_STATES:
                    self._items()
                else:
                    self._step()
        except _More:
            self._pos = self._mark  # a step is all or nothing: redo it when more text came
            pending = len(self._buf) - self._pos
            cap = self.max_item if self._state == "item" else self.max_other
            if pending > cap + 16:
                raise UntrustedJSONError(
                    f"a JSON value longer than {cap} characters ({self._where()}); refused"
                ) from None
            if self._eof:
                raise UntrustedJSONError(
                    "the JSON document ended early (cut or not JSON)"
                ) from None

    def _where(self) -> str:
        return ".".join(key for _, key in self._stack if key) or "top level"

    def _skip_ws(self) -> str:
        self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]  # as in _run
        if self._pos >= len(self._buf):
            raise _More
        return self._buf[self._pos]

    def _expect(self, chars: str) -> str:
        ch = self._skip_ws()
        if ch not in chars:
            raise UntrustedJSONError(
                f"not the expected JSON: {clean_text(self._buf[self._pos : self._pos + 40], 40)!r}"
                f" where one of {chars!r} belongs ({self._where()})"
            )
        self._pos += 1
        return ch

    def _decode(self) -> Any:
        """The next whole value, or _More when the buffer ends inside it."""
        start = self._pos
        if not self._eof and len(self._buf) < self._retry_at:
            raise _More
        try:
            value, end = _JSON.raw_decode(self._buf, start)
        except RecursionError:
            raise UntrustedJSONError(  # the C decoder's own guard: far deeper than 64
                f"JSON nested deeper than {MAX_JSON_DEPTH} ({self._where()}); refused"
            ) from None
        except ValueError:
            if self._eof:
                raise UntrustedJSONError(f"not JSON ({self._where()})") from None
            self._retry_at = start + 2 * (len(self._buf) - start) + 1
            raise _More from None
        if end >= len(self._buf) and not self._eof and self._buf[start] not in '{["':
            raise _More  # a number may go on in the next chunk
        self._retry_at = 0
        self._pos = end
        return value

    def _step(self) -> None:
        state = self._state
        if state == "start":
            self._expect("{")
            self._root = {}
            self._stack.append((self._root, ""))
            self._state = "key_or_end"
        elif state in ("key_or_end", "key"):
            ch = self._skip_ws()
            if ch == "}" and state == "key_or_end":
                self._pos += 1
                self._close_object()
                return
            if ch != '"':
                self._expect('"')
            key = self._other()
            self._expect(":")
            obj, _ = self._stack[-1]
            self._stack[-1] = (obj, str(key))
            self._state = "value"
        elif state == "value":
            self._value()
        elif state == "after":
            if self._expect(",}") == ",":
                self._state = "key"
            else:
                self._close_object()

    def _items(self) -> None:
        """The array's items and the commas between them, one step after the other as the
        other states are taken, in one loop: the hot path (a Prometheus answer holds a series
        per GPU and metric). Each item or comma taken is a step done (``_mark``)."""
        buf, ws = self._buf, _WS.match
        while not self.truncated:
            pos = self._pos = ws(buf, self._pos).end()  # type: ignore[union-attr]  # as in _run
            if pos >= len(buf):
                raise _More
            ch, state = buf[pos], self._state
            if state == "item_after":
                if ch == ",":
                    self._pos, self._state = pos + 1, "item"
                elif ch == "]":
                    self._pos = pos + 1
                    self._close_array()
                    return
                else:
                    self._expect(",]")  # the error, as the step would raise it
            elif ch == "]" and state == "item_or_end":
                self._pos = pos + 1
                self._close_array()
                return
            else:
                self._take(self._decode())
                self._state = "item_after"
            self._mark = self._pos

    def _value(self) -> None:
        obj, key = self._stack[-1]
        level = len(self._stack) - 1
        on_path = level < len(self.path) and key == self.path[level]
        ch = self._skip_ws()
        if on_path and level == len(self.path) - 1 and ch == "[":
            self._pos += 1
            obj[key] = self.items
            self._state = "item_or_end"
        elif on_path and level < len(self.path) - 1 and ch == "{":
            self._pos += 1
            child: dict[str, Any] = {}
            obj[key] = child
            self._stack.append((child, ""))
            self._state = "key_or_end"
        else:
            obj[key] = self._other()
            self._state = "after"

    def _other(self) -> Any:
        """A key or a value off the array's path; all of them together stay under max_other."""
        start = self._pos
        value = self._decode()
        text = self._buf[start : self._pos]
        if ("[" in text or "{" in text) and not _depth_ok(text, MAX_JSON_DEPTH):
            raise UntrustedJSONError(f"JSON nested deeper than {MAX_JSON_DEPTH}; refused")
        self._other_chars += self._pos - start
        if self._other_chars > self.max_other:
            raise UntrustedJSONError(
                f"more than {self.max_other} characters of JSON besides {'.'.join(self.path)}"
                "; refused"
            )
        return value

    def _take(self, item: Any) -> None:
        value = self.convert(item)
        if value is None:
            self.dropped += 1
        else:
            self.items.append(value)
        if len(self.items) + self.dropped >= self.max_items:
            self.truncated = True

    def _close_array(self) -> None:
        self._state = "after"

    def _close_object(self) -> None:
        self._stack.pop()
        self._state = "after" if self._stack else "done"
