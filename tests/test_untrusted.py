"""The trust boundary (verl_top/untrusted.py): escapes, controls, bounds, numbers and JSON."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scaling import assert_linear

from verl_top.untrusted import (
    COMMON_SGR,
    UntrustedJSONError,
    bounded_int,
    clean_line,
    clean_lines,
    clean_text,
    finite,
    is_clean,
    loads,
)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b]52;c;ZXZpbA==\x07b", "ab"),  # OSC 52 clipboard write
        ("\x1b]0;title\x1b\\x", "x"),  # OSC 0 with ST terminator
        ("\x1b\x1b]]0;x\x07\x07title", "title"),  # nested: one pass would leave an OSC
        ("\x1b[1;31mred\x1b[0m", "red"),  # CSI SGR
        ("\x9b31mred", "red"),  # 8-bit CSI
        ("\x1bP+q544e\x1b\\ok", "ok"),  # DCS
        ("\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\ok", "ok"),  # APC, PM, SOS
        ("\x1b]8;;https://evil\x07link\x1b]8;;\x07", "link"),  # OSC 8 hyperlink
        ("unterminated \x1b]0;rest of text", "unterminated "),
        ("e\u202egnp.exe", "egnp.exe"),  # bidi override
        ("nul\x00bel\x07del\x7f", "nulbeldel"),
        ("tab\tnew\nline", "tab new line"),
        (
            "data.train_files=[/data/gsm8k/train.parquet]",
            "data.train_files=[/data/gsm8k/train.parquet]",
        ),
        ("naïve ✓ 中文", "naïve ✓ 中文"),
    ],
)
def test_clean_text_removes_every_escape_and_control(raw: str, shown: str) -> None:
    assert clean_text(raw) == shown


def test_clean_text_bounds_length_and_marks_the_cut() -> None:
    out = clean_text("x" * 10_000, limit=100)
    assert len(out) == 100 and out.endswith("…")
    assert clean_text(b"bytes \xff ok") == "bytes \ufffd ok"
    assert clean_text(None) == "" and clean_text(12) == "12"


def test_clean_line_keeps_line_structure_for_parsers() -> None:
    assert clean_line("a\rb\x1b[2K\n") == "a\rb\n"


@settings(max_examples=300, derandomize=True)
@given(st.text(alphabet=st.sampled_from(list("\x1b[]P^_X\\\x07\x9b\x9c\x9d;0a")), max_size=40))
def test_no_escape_survives_any_arrangement(raw: str) -> None:
    assert is_clean(clean_text(raw)) and is_clean(clean_line(raw).replace("\r", ""))


# Escapes, controls, separators and plain text, so lines open and close sequences anywhere.
LINE_CHARS = list("\x1b[]P^_X\\\x07\x9b\x9c\x9d\x90;0a \t\r\n\x00\x7f\u202e\u2028é\u200b\ufe0f")
LINE_CHARS += ["\U000e0041", "\ud800", "m", "3", "6"]  # a tag, a lone surrogate, SGR pieces


@settings(max_examples=400, derandomize=True)
@given(st.lists(st.text(alphabet=st.sampled_from(LINE_CHARS), max_size=30), max_size=12))
def test_a_chunk_of_lines_is_cleaned_as_each_line_alone(lines: list[str]) -> None:
    """The bulk boundary of followed logs gives, line for line, what clean_line gives: an
    escape left open at the end of one line must not swallow the next."""
    assert clean_lines(lines) == [clean_line(x) for x in lines]
    assert clean_lines(lines, limit=7) == [clean_line(x, 7) for x in lines]


@settings(max_examples=400, derandomize=True)
@given(
    st.lists(st.text(alphabet=st.sampled_from([c for c in LINE_CHARS if c != "\n"]), max_size=30))
)
def test_a_chunk_of_lines_without_newlines_takes_the_one_pass_path(lines: list[str]) -> None:
    assert clean_lines(lines) == [clean_line(x) for x in lines]
    assert clean_lines(lines, limit=7) == [clean_line(x, 7) for x in lines]


TOKENS = [
    *COMMON_SGR,
    "\x1b[1;31m",
    "\x1b]0;t",
    "\x07",
    "\x1b\\",
    "\x9b2K",
    "(pid=1) ",
    "step:1",
    "\t",
]
TOKENS += ["\r", "中", "\u200b", "\x1b", "[", "m", " - "]
# Beyond ASCII, for the byte-wise plain path: letters of 2, 3 and 4 UTF-8 bytes, a C1
# control, an astral invisible (a tag) and a lone surrogate.
TOKENS += ["é", "😀", "\x85", "\U000e0041", "\ud800"]


@settings(max_examples=400, derandomize=True)
@given(st.lists(st.lists(st.sampled_from(TOKENS), max_size=8).map("".join), max_size=10))
def test_a_chunk_of_coloured_lines_is_cleaned_as_each_line_alone(lines: list[str]) -> None:
    """Lines made of real colour codes, Ray prefixes and what could splice with them."""
    assert clean_lines(lines) == [clean_line(x) for x in lines]


def test_a_chunk_keeps_its_lines_when_one_escape_is_left_open() -> None:
    lines = ["(TaskRunner pid=1) \x1b[36mstep:1 - a:1\x1b[0m", "title \x1b]0;pwned", "next line"]
    assert clean_lines(lines) == ["(TaskRunner pid=1) step:1 - a:1", "title ", "next line"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1.0),
        (2.5, 2.5),
        (float("nan"), None),
        (float("inf"), None),
        (1e308, 1e308),
        ("3", None),
        (True, None),
        (None, None),
        (10**400, None),
    ],
)
def test_finite(value: object, expected: float | None) -> None:
    assert finite(value) == expected


def test_finite_range_and_bounded_int() -> None:
    assert finite(101.0, 0, 100) is None and finite(100.0, 0, 100) == 100.0
    assert bounded_int(3.0, 0, 255) == 3
    assert bounded_int(1.5, 0, 255) is None
    assert bounded_int(10**30, 0, 255) is None
    assert bounded_int(-1, 0, 255) is None
    assert bounded_int(True, 0, 255) is None


def test_loads_refuses_deep_and_large_documents_before_parsing() -> None:
    with pytest.raises(UntrustedJSONError, match="deeper"):
        loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UntrustedJSONError, match="exceeds"):
        loads(b"[" + b"1," * 1000 + b"1]", max_bytes=100)
    with pytest.raises(UntrustedJSONError, match="not JSON"):
        loads("{")
    assert loads('{"a": NaN, "b": "[{"}') == {"a": None, "b": "[{"}


# --- linear time, invisible characters, surrogates (issue 31) -------------------------------

# Inputs that made the old cleaner or JSON depth scan backtrack over a whole run, and a few more
# shapes of the same family: each is built as ``unit * n`` (plus a tail), cleaned at 1x/10x/100x.
HOSTILE_RUNS = {
    "C1 string introducers, then one ESC": lambda n: "\x90\x98\x9d\x9e\x9f" * n + "\x1b",
    "OSC introducers, never terminated": lambda n: "\x1b]" * n + "\x1b",
    "CSI parameters without a final byte": lambda n: ("\x1b[" + "0;" * 50) * n + "\x1b",
    "ESC intermediates without a final byte": lambda n: ("\x1b" + " " * 20) * n,
    "DCS payload broken by lone ESCs": lambda n: ("\x90abc\x1bd") * n,
    "zero-width and bidi marks between letters": lambda n: "a\u200b\u202e\u061c\ufeff" * n,
    "lone surrogates": lambda n: "x\ud800" * n,
}


@pytest.mark.parametrize("name", list(HOSTILE_RUNS))
def test_cleaning_time_grows_linearly_with_hostile_input(name: str) -> None:
    make = HOSTILE_RUNS[name]
    for fn in (lambda s: clean_line(s, limit=10**7), lambda s: clean_text(s, limit=10**7)):
        assert_linear(fn, make, 60, name)
    assert is_clean(clean_line(make(600), limit=10**7).replace("\r", ""))


def test_json_depth_scan_is_linear_on_unterminated_escaped_quotes() -> None:
    # 70 brackets reach the real scan; then one string of escaped quotes that never closes.
    def parse(text: str) -> None:
        with pytest.raises(UntrustedJSONError):
            loads(text)

    assert_linear(parse, lambda n: "[" * 70 + '"' + '\\"' * n, 200, "loads")


def test_every_unicode_format_character_is_removed() -> None:
    fmt = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    text = "n" + "o".join(fmt) + "de"
    assert clean_text(text, limit=10**6) == "n" + "o" * (len(fmt) - 1) + "de"
    assert is_clean(clean_line(text, limit=10**6))


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("zw\u200bnode1", "zwnode1"),  # zero-width space
        ("zw\u200dnode1\ufeff", "zwnode1"),  # ZWJ, BOM
        ("a\u200fb\u061cc\u200ed", "abcd"),  # RLM, ALM, LRM
        ("x\u2066y\u2069z\u202dw", "xyzw"),  # isolates, LRO
        ("hf_ab\u2060cd\u00adef", "hf_abcdef"),  # word joiner, soft hyphen
        ("\u3164\u115f\ufe0f\U000e0041name", "name"),  # Hangul fillers, VS16, tag A
        ("a\u2028b\u2029c", "abc"),
    ],
)
def test_invisible_characters_are_removed(raw: str, shown: str) -> None:
    assert clean_text(raw) == shown
    assert clean_line(raw) == shown


def test_lone_surrogates_become_replacement_characters_and_encode() -> None:
    out = clean_text(loads('{"h": "gpu\\ud800node\\udfff"}')["h"])
    assert out == "gpu\ufffdnode\ufffd"
    out.encode("utf-8")  # snapshot.json and the exposition format write UTF-8
    assert clean_line("a\udc80\r\n") == "a\ufffd\r\n"
    assert not is_clean("a\ud800") and is_clean(out)


def test_an_osc_string_broken_by_an_escape_ends_there() -> None:
    # The string is over where the next escape begins; its payload never shows.
    assert clean_text("\x1b]0;title\x1b[1mX") == "X"
    assert clean_text("\x90payload\x1b\\shown") == "shown"
