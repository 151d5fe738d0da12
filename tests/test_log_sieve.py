"""A finished log read through the sieve (sources/log_sieve.py) reads as when every line is read.

The sieve leaves lines undecoded when a quiet verl parser would skip them: on every real log the
records, counts and verdict must equal those of reading each line; any line the parser would
not skip must be selected, whatever escapes, controls or invisible characters it holds; the
lines that reach the parser are clean; a runaway line costs no memory. Each holds for both
ways of finding the lines: hyperscan's compiled scan (a dependency, so the default) and the
``re`` passes (where hyperscan cannot be imported), which select the same lines."""

from __future__ import annotations

import asyncio
import io
import tracemalloc
from pathlib import Path
from typing import BinaryIO
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.diagnosis.engine import Engine
from verl_top.sources import log_sieve
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.untrusted import clean_lines, is_clean
from verl_top.verl import parse
from verl_top.verl.crash import CrashScanner

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL_LOGS = sorted(
    [*(FIXTURES / "real_logs").glob("*.log"), *(FIXTURES / "verl").glob("*.log")]
    + [*(FIXTURES / "verl").glob("*.txt"), *(FIXTURES / "verl").glob("*.jsonl")]
)


# Both ways of finding the lines, built once (a compiled scan takes ~20 ms to build).
SIEVES = {"hyperscan": log_sieve.LogSieve(), "re": log_sieve.LogSieve(compiled=False)}
MATCHERS = pytest.mark.parametrize("matcher", list(SIEVES))


def use(matcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sieved reads find their lines with ``matcher`` (hyperscan must be there: a dependency)."""
    assert log_sieve.compiled_markers() is not None, "hyperscan is a dependency: not importable"
    if matcher == "re":
        monkeypatch.setattr(log_sieve, "compiled_markers", lambda: None)


def selected(matcher: str, line: str) -> bool:
    """Whether the sieve selects this one line."""
    return SIEVES[matcher].hits(f"{line}\n".encode()).index == [0]


def read(path: Path, sieved: bool) -> tuple[Store, list[object]]:
    """The store after reading ``path`` to its end (as diagnose does), and what was delivered."""
    store = Store()
    pipeline = Pipeline(store)
    seen: list[object] = []
    pipeline.listeners.append(seen.append)
    source = LocalFollowSource(
        [("verl", str(path), True)], until_eof=True, sinks=pipeline.sink if sieved else None
    )
    asyncio.run(source.run(pipeline.emit))
    pipeline.finish()
    return store, seen


def outcome(store: Store, seen: list[object]) -> tuple[object, ...]:
    verdict = Engine().evaluate(store)
    stats = [{k: v for k, v in s.items() if k != "host"} for s in store.log_stats.values()]
    return (
        seen,
        list(store.steps),
        store.config,
        stats,
        verdict.bottleneck_rule,
        verdict.headline,
        [(f.rule, f.title) for f in verdict.findings],
    )


@MATCHERS
@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.name)
def test_a_sieved_real_log_reads_as_every_line_read(
    path: Path, matcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(matcher, monkeypatch)
    fast = outcome(*read(path, sieved=True))
    monkeypatch.setattr(parse.VerlStreamParser, "_quiet", lambda self: False)
    assert fast == outcome(*read(path, sieved=False))  # every line decoded, cleaned, parsed


HOSTILE = [
    b"step:103 - gen:1.5 - total:2.0",  # a plain step line for contrast
    b"st\x1b[0mep:104 - gen:1.5 - total:2.0",  # an escape splits the marker
    b"ste\x00p:105 - gen:1.5 - total:2.0",  # a NUL inside it
    "st\u200bep:106 - gen:1.5 - total:2.0".encode(),  # a zero-width space
    b"(pid=1) step\x1b[32m :107 - gen:1.5",  # a colour code before a blank
    b"Trace\x1b]0;title\x07back (most recent call last):",  # an OSC title inside an opener
    b"python3 -m\tverl.trainer.main_ppo data.train_batch_size=64",  # a tab after -m
    b"\x1b[36m(TaskRunner pid=1)\x1b[0m step:108 - gen:1.5 - total:2.0",
    "\u5956\u52b1 reward: 0.5 \u2014 caf\u00e9 \U0001f600".encode(),  # letters, dash, emoji
    b"bad utf-8 \xff\xfe st\xffep:111 - x:1",  # invalid bytes
    "ste\u009bXp:109 - gen:1.5".encode(),  # an 8-bit CSI eats the X
]


def hostile_log(tmp_path: Path, runaway: int = 0) -> Path:
    """A real log with the hostile lines (and a runaway line) between two copies of it."""
    real = (FIXTURES / "real_logs" / "vlm_gui_cursor_custom_rollout_key.log").read_bytes()
    path = tmp_path / "hostile.log"
    with open(path, "wb") as fh:
        # quiet lines between them: a line right after a step line is read anyway
        fh.write(real + b"\n" + b"\na quiet line\nanother quiet line\n".join(HOSTILE) + b"\n")
        if runaway:
            fh.write(b"step:110 - " + b"x" * runaway + b"\n")
        fh.write(real + b"step:112 - gen:1.5 - total:2.0\r\r")  # no newline at the end
    return path


@MATCHERS
def test_hostile_lines_are_found_and_cleaned_as_when_every_line_is_read(
    tmp_path: Path, matcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(matcher, monkeypatch)
    path = hostile_log(tmp_path)
    fed: list[str] = []
    real_feed = parse.VerlStreamParser.feed

    def feed(self, lines, t, more=False):  # noqa: ANN001, ANN202
        fed.extend(lines)
        return real_feed(self, lines, t, more)

    monkeypatch.setattr(parse.VerlStreamParser, "feed", feed)
    fast = outcome(*read(path, sieved=True))
    assert fed and all(is_clean(line.replace("\r", "")) for line in fed)  # \r is kept
    steps = {s.step for s in fast[1]}  # markers spliced by what cleaning removes are read
    assert {103, 104, 105, 106, 108, 109} <= steps and 111 not in steps
    assert 112 in steps  # the last line, without a newline: the file is finished
    monkeypatch.setattr(parse.VerlStreamParser, "_quiet", lambda self: False)
    assert fast == outcome(*read(path, sieved=False))


class Unseekable(io.RawIOBase):
    """A file read through a pipe's interface: it cannot seek (the sieve carries the partial
    line after a block's last newline to the next block instead)."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed with the wrapper

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]  # noqa: ANN001
        return self._fh.readinto(buf)

    def close(self) -> None:
        self._fh.close()
        super().close()


def sieved_direct(path: Path, fh: BinaryIO) -> tuple[list[object], dict[str, object]]:
    """The records and counts of one ``SievedRead`` of ``fh`` (``path``'s bytes)."""
    store = Store()
    pipeline = Pipeline(store)
    seen: list[object] = []
    pipeline.listeners.append(seen.append)
    sink = pipeline.sink("local", str(path), "verl")
    assert sink is not None
    read = log_sieve.SievedRead(fh, sink)
    assert asyncio.run(read.run()) == path.stat().st_size
    pipeline.finish()
    (stats,) = store.log_stats.values()
    assert read.stats.bytes == path.stat().st_size  # each byte counted once
    return seen, {k: v for k, v in stats.items() if k not in ("host", "path")}


@MATCHERS
@pytest.mark.parametrize("block", [997, 4096, 65536])
def test_small_blocks_read_alike_whether_the_file_seeks_or_not(
    tmp_path: Path, block: int, matcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks smaller than the real log's step lines and configs (lines cross blocks, some
    span several): the partial line after a block's last newline is read again with the
    next block where the file seeks and carried where it does not; both deliver what reading
    every line delivers, with the same counts."""
    use(matcher, monkeypatch)
    path = hostile_log(tmp_path)
    monkeypatch.setattr(log_sieve, "BLOCK", block)
    with open(path, "rb") as fh:
        seeking = sieved_direct(path, fh)
    with io.BufferedReader(Unseekable(path)) as fh:
        assert not fh.seekable()
        carried = sieved_direct(path, fh)
    assert seeking == carried
    monkeypatch.setattr(parse.VerlStreamParser, "_quiet", lambda self: False)
    with open(path, "rb") as fh:
        assert seeking == sieved_direct(path, fh)  # every line decoded, cleaned, parsed
    assert {103, 104, 105, 106, 108, 109, 112} <= {
        r.step for r in seeking[0] if isinstance(r, parse.VerlStep)
    }


def test_a_runaway_line_is_skipped_and_counted_without_holding_it(tmp_path: Path) -> None:
    path = hostile_log(tmp_path, runaway=10 * 1024 * 1024)
    store, _ = read(path, sieved=False)
    tracemalloc.start()
    fast, _ = read(path, sieved=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 6 * 1024 * 1024  # the 10 MB line was never held whole
    assert [e.text for e in fast.events if "skipped" in e.text] == [
        e.text for e in store.events if "skipped" in e.text
    ]
    assert any("1 line(s) over" in e.text for e in fast.events)
    assert list(fast.log_stats.values())[0]["lines"] == list(store.log_stats.values())[0]["lines"]


MARKERS = ["step:", "step =", '{"', "{'", "NCCL", "/k:", "Traceback (most", "Error executing job"]
MARKERS += ["-m ", "main_"]
# What cleaning removes or changes, and what may stand around a marker.
REMOVED = ["\x1b[0m", "\x1b[32m", "\x1b[1;31m", "\x1b]0;t\x07", "\x1b", "\x1b(B", "\x00", "\x7f"]
REMOVED += ["\u200b", "\u009b", "\u009bX", "\u009d", "\ufeff", "\U000e0041", "\t", "\r"]
AROUND = ["", "x", " ", "(pid=1) ", "p", "m", ")", "]", "\u00e9", "\u5956", "\x1b[36m", "\xa0"]
AROUND += [":", "ERROR:12:00:00,953:", "0: ", "12:00:00 ", "\x1b7", "\x1b#8", "\x1b(B"]


@st.composite
def spliced(draw: st.DrawFn) -> str:
    """A marker cut somewhere, with things cleaning removes put in the cut."""
    marker = draw(st.sampled_from(MARKERS))
    cut = draw(st.integers(0, len(marker)))
    inside = "".join(draw(st.lists(st.sampled_from(REMOVED), min_size=1, max_size=3)))
    before, after = draw(st.sampled_from(AROUND)), draw(st.sampled_from(AROUND))
    return before + marker[:cut] + inside + marker[cut:] + after


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(spliced(), st.sampled_from(AROUND + REMOVED)), max_size=6))
def test_every_line_a_quiet_parser_would_read_is_selected(lines: list[str]) -> None:
    """Soundness of the sieve: a line it leaves out is one the quiet parser skips once
    cleaned, whatever escapes, controls and invisible characters split its markers."""
    lines = [line.replace("\n", "") for line in lines]
    block = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
    compiled = set(SIEVES["hyperscan"].hits(block).index)
    chosen = set(SIEVES["re"].hits(block).index)
    assert compiled == chosen  # valid UTF-8: the two ways select the same lines
    for i, line in enumerate(clean_lines([line.removesuffix("\r") for line in lines])):
        parser = parse.VerlStreamParser("h", "x.log")
        parser.first_unmatched = "x"  # quiet: a line without a marker is only counted
        with mock.patch.object(parse, "logical_lines", wraps=parse.logical_lines) as looked:
            parser.feed([line], 0.0, more=True)
        if looked.called:
            assert i in compiled, (lines[i], line)


# Bytes no text encodes: a lead byte without its tail, a tail without its lead, never UTF-8.
BROKEN = [b"\xff", b"\xc2", b"\xe2\x80", b"\x80", b"\x9b", b"\xf0\x9f", b"\xed\xa0\x80"]
PIECES = [x.encode() for x in MARKERS + REMOVED + AROUND] + BROKEN


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=7).map(b"".join), max_size=8))
def test_on_any_bytes_the_compiled_scan_is_sound_and_takes_no_more_than_re(
    lines: list[bytes],
) -> None:
    """Invalid UTF-8 around markers and escapes, many hits a block (each compiled scan stops
    at its line's first match and starts again on the next line; scanned in windows of whole
    lines, the same lines whatever their size): every line the quiet
    parser would read is selected, with its bounds; the line count is the block's; the ``re``
    path, which tests removable characters on the non-ASCII bytes alone, takes at least
    these lines."""
    lines = [line.replace(b"\n", b"") for line in lines]
    block = b"".join(line + b"\n" for line in lines)
    compiled, chosen = SIEVES["hyperscan"].hits(block), SIEVES["re"].hits(block)
    with mock.patch.object(log_sieve, "MIN_WINDOW", 8):  # windows of a line or two
        assert SIEVES["hyperscan"].hits(block) == compiled
    assert compiled.lines == chosen.lines == len(lines)
    assert set(compiled.index) <= set(chosen.index)
    spans, pos = [], 0
    for line in lines:
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1
    assert [spans[i] for i in compiled.index] == list(
        zip(compiled.start, compiled.end, strict=True)
    )
    for i, text in enumerate(log_sieve._texts(block, spans)):
        parser = parse.VerlStreamParser("h", "x.log")
        parser.first_unmatched = "x"  # quiet
        with mock.patch.object(parse, "logical_lines", wraps=parse.logical_lines) as looked:
            parser.feed([text], 0.0, more=True)
        if looked.called:
            assert i in compiled.index, (lines[i], text)


@pytest.mark.parametrize("window", [8, 64, log_sieve.MIN_WINDOW])
def test_a_marker_at_a_lines_start_is_found_wherever_a_scan_window_ends(window: int) -> None:
    """Each marker at the very start of a line, after quiet lines shorter and longer than the
    compiled scan's window (a window ends at a line's end; the next starts on its newline,
    which a traceback opener needs before it): the same lines as the ``re`` path."""
    quiet = [b"q", b"quiet line " * 3, b"x" * 100, b"(pid=1) " + b"y" * 5000]
    lines = []
    for marker in [*MARKERS, "\x1b7Traceback (most", "\x00", "\u200b"]:
        for before in quiet:
            lines += [before, marker.encode() + b" rest of it"]
    block = b"\n".join(lines) + b"\n"
    with mock.patch.object(log_sieve, "MIN_WINDOW", window):
        compiled = SIEVES["hyperscan"].hits(block)
    assert compiled == SIEVES["re"].hits(block)
    assert compiled.index == list(range(1, len(lines), 2))  # every marker line, no quiet one


def opens_traceback(cleaned: str) -> bool:
    """Whether the crash scanner opens a traceback on this cleaned line, read as a parser
    reading every line reads it (its logical lines, one after the other)."""
    scanner = CrashScanner("h", "x.log")
    for prefix, body in parse.logical_lines(cleaned):
        scanner.scan(prefix, body, 0)
    return not scanner.idle


WORKER_TRACEBACK = (
    "\x1b[36m(CursorLoopWorker pid=7)\x1b[0m ERROR:2025-11-19 19:07:43,953:"
    "Traceback (most recent call last):"
)


@pytest.mark.parametrize(
    ("line", "opens"),
    [
        (WORKER_TRACEBACK, False),  # an actor's handled error, logged per sample
        ("ERROR:2025-11-19 19:07:43,953:Traceback (most recent call last):", False),
        ("Traceback (most recent call last):", True),
        ("2025-11-19 19:07:43,953 Traceback (most recent call last):", True),
        ("0: Traceback (most recent call last):", True),
        ("\x1b7Traceback (most recent call last):", True),  # ESC 7 is removed: a bare start
        ("\x1b[31mTraceback (most recent call last):", True),
        ("progress 3%\rTraceback (most recent call last):", True),
    ],
)
@MATCHERS
def test_only_a_traceback_that_may_open_is_read(line: str, opens: bool, matcher: str) -> None:
    """The driver's traceback (at a line's, a head's or a \\r piece's start) is read by the
    sieve and the quiet parser; a worker's per-sample ``ERROR:<time>:Traceback`` is counted by
    both (the crash scanner never opens on it): 16 % fewer lines read in the benchmark log."""
    (cleaned,) = clean_lines([line])
    parser = parse.VerlStreamParser("h", "x.log")
    parser.first_unmatched = "x"  # quiet
    parser.feed([cleaned], 0.0, more=True)
    assert opens_traceback(cleaned) is opens  # what the crash scanner does with the line
    assert parser.quiet() is not opens  # the quiet test lets it through exactly then
    assert selected(matcher, line) is opens


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(AROUND + REMOVED + ["", "\r", "x\r", " ", "2025-11-19 19:07:43 "]),
    st.sampled_from(AROUND + REMOVED + [""]),
)
def test_the_quiet_test_never_skips_a_traceback_that_opens(before: str, inside: str) -> None:
    """Whatever stands before a driver's traceback, the quiet parser opens it whenever a parser
    reading every line does (the tightened quiet test is exact for tracebacks)."""
    line = before + inside + "Traceback (most recent call last):"
    (cleaned,) = clean_lines([line.replace("\n", "")])
    quiet = parse.VerlStreamParser("h", "x.log")
    quiet.first_unmatched = "x"
    quiet.feed([cleaned], 0.0, more=True)
    assert quiet.quiet() is not opens_traceback(cleaned), repr(line)


RAY = "\x1b[36m(CursorLoopWorker pid=7)\x1b[0m "


@pytest.mark.parametrize(
    ("line", "read"),
    [
        (RAY + "\u8bbf {", False),  # a sample printout (the benchmark log: 84 a block)
        (RAY + '    raise ValueError(f"step {self.step_idx} - failed from: {text}")', False),
        ("\x1b[36m(TaskRunner pid=1)\x1b[0m {'actor_rollout_ref': {'actor': {'a': 1}}}", True),
        ('{"step": 3, "timing_s/step": 1.5}', True),
        ("{\x1b[0m'actor': 1}", True),  # cleaned: {'actor': 1}
    ],
)
@MATCHERS
def test_only_a_brace_that_opens_jsonl_or_a_config_is_read(
    line: str, read: bool, matcher: str
) -> None:
    """A brace matters to a quiet parser only as the opening of a JSONL record or a pprinted
    config; the sieve and the quiet test leave the others (format strings in tracebacks,
    printed samples) unread: 25 112 -> 77 brace lines in the benchmark log."""
    (cleaned,) = clean_lines([line])
    parser = parse.VerlStreamParser("h", "x.log")
    parser.first_unmatched = "x"  # quiet
    with mock.patch.object(parse, "logical_lines", wraps=parse.logical_lines) as looked:
        parser.feed([cleaned], 0.0, more=True)
    assert looked.called is read
    assert selected(matcher, line) is read


@pytest.mark.parametrize(
    ("line", "read"),
    [
        # a traceback frame Ray folded: the code before " [repeated" follows a name, not a
        # marker's word (the benchmark log: 6987 such lines were read before)
        (
            RAY + '  File "/x/env.py", line 9, in _cursor\x1b[32m [repeated 9x across cluster]',
            False,
        ),
        ("Error\x1b[0m executing job with overrides", True),
        ("step\x1b[0m : 3", True),
        ("python3 -m\x1b[0m verl.trainer.main_ppo", True),
        ("Traceback\x1b[0m (most recent call last):", True),
        ("job\x1b[1m ok", False),
    ],
)
@MATCHERS
def test_an_escape_before_a_blank_is_read_only_after_a_markers_word(
    line: str, read: bool, matcher: str
) -> None:
    """Removing a colour code before a blank joins the text around it: only after a word a
    marker has before a blank ("step", "Traceback", "Error", "executing", "-m") can that make
    a marker, so only there is the line read."""
    assert selected(matcher, line) is read


def followed_after_sieve(
    tmp_path: Path, fixture: str, count: int
) -> tuple[Path, bytes, Store, Pipeline, LocalFollowSource]:
    """A copy of a real log read through the sieve and then followed ``count`` polls, as the
    app reads a log that looked finished (no ``pipeline.finish()``: the app follows on)."""
    path = tmp_path / "driver.log"
    real = (FIXTURES / "real_logs" / fixture).read_bytes()
    path.write_bytes(real)
    store = Store()
    pipeline = Pipeline(store)
    source = LocalFollowSource(
        [("verl", str(path), True)],
        interval=0.05,
        count=count,
        until_eof=True,
        then_follow=True,
        sinks=pipeline.sink,
    )
    return path, real, store, pipeline, source


def test_the_app_follows_a_sieved_log_on_from_where_the_sieve_stopped(tmp_path: Path) -> None:
    """A log that looked finished (the app opened on a long step's quiet minutes) is read
    through the sieve, then followed: the step printed afterwards is read once, not the
    history again."""
    path, real, store, pipeline, source = followed_after_sieve(
        tmp_path, "vlm_gui_cursor_custom_rollout_key.log", 20
    )

    async def run() -> None:
        task = asyncio.create_task(source.run(pipeline.emit))
        await asyncio.sleep(0.3)
        with open(path, "ab") as fh:
            fh.write(b"step:10 - timing_s/gen:1.5 - timing_s/step:2.0\nquiet after it\n")
        await task

    asyncio.run(run())
    assert [s.step for s in store.steps] == list(range(1, 11))
    (stats,) = store.log_stats.values()
    assert stats["lines"] == real.count(b"\n") + 2


def test_a_wrapped_step_line_at_a_finished_logs_end_is_read_before_following_on(
    tmp_path: Path,
) -> None:
    """The app reads a finished log through the sieve, then follows it: a step line wrapped
    onto the log's last line was held open for a next line that never comes (the app showed
    no data where diagnose named flow.rollout_bound on the real GH200 excerpt)."""
    _, _, store, pipeline, source = followed_after_sieve(
        tmp_path, "sglang_gh200_issue1208_wrapped_excerpt.log", 4
    )
    asyncio.run(source.run(pipeline.emit))  # no pipeline.finish(): the app follows on
    assert [s.step for s in store.steps] == [2]
    assert store.steps[0].metrics["timing_s/gen"] > 0  # the wrapped line was joined
