"""untrusted.loads reads a document with orjson where orjson reads it as the json module does,
and with the json module otherwise: the values (types included) and the refusals must be those
of the json module alone, on real lines and on hostile documents."""

from __future__ import annotations

import json
import math
from typing import Any

from fuzz_data import json_value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_top import untrusted


def shape(value: Any) -> Any:
    """``value`` with every leaf's exact type and repr (1 and 1.0, 0.0 and -0.0, key order)."""
    if isinstance(value, dict):
        return ("dict", [(k, shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [shape(v) for v in value])
    return (type(value).__name__, repr(value))


def reference(text: str) -> Any:
    """What the json module alone makes of ``text`` (NaN/Infinity as None, as loads does)."""
    try:
        return shape(untrusted._JSON.decode(text))
    except (ValueError, RecursionError):
        return "refused"


def fast(text: str) -> Any:
    try:
        return shape(untrusted._decode(text))
    except (ValueError, RecursionError):
        return "refused"


EDGES = [
    '{"a":1,"a":2}',
    '{"a":1,"b":2,"a":3}',
    "1e400",
    "-1e400",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "4.9e-324",
    "2.4703282292062328e-324",
    "0.1e-400",
    "-0",
    "-0.0",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    '{"seq": 99999999999999999999}',
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"',
    '"\ud800"',
    '"\x01"',
    '"\x7f"',
    '"\\u0000\\u001b[31m"',
    "\ufeff{}",
    "NaN",
    "[NaN, Infinity, -Infinity]",
    '{"t": NaN}',
    "[1,]",
    '{"a":1,}',
    " {} ",
    "\t[]\n",
    '{"a":1}x',
    "[01]",
    "[1.]",
    "[.5]",
    "[+1]",
    "[1e5]",
    "[1E+5]",
    "[1e-5]",
    "[true,false,null]",
    "[True]",
    "'a'",
    "",
    "[",
    '{"a"}',
    '"' + "x" * 70 + '"',
    '{"' + "k" * 70 + '": 1}',
]


def test_edge_documents() -> None:
    """Numbers at the 64-bit and float limits, NaN/Infinity, lone surrogates, control
    characters, duplicate keys, trailing data and broken syntax: the json module's answer."""
    for text in EDGES:
        assert fast(text) == reference(text), text


def test_big_integers_stay_exact() -> None:
    """orjson would make an integer beyond 64 bits a float; such documents take the json
    module, so a huge sequence number keeps its exact value (and is refused by its range)."""
    assert untrusted.loads('{"seq": 123456789012345678901234567890}') == {
        "seq": 123456789012345678901234567890
    }
    assert type(untrusted.loads("[-9223372036854775809]")[0]) is int


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_value)
def test_documents_of_hostile_values(value: Any) -> None:
    """Any document the json module writes (NaN and Infinity included): same values."""
    text = json.dumps(value, allow_nan=True)
    assert fast(text) == reference(text)


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False) | st.integers())
def test_numbers_read_alike(number: float | int) -> None:
    """Every float (shortest repr and 17 digits) and integer: the json module's value."""
    texts = [json.dumps(number, allow_nan=True)]
    if isinstance(number, float) and math.isfinite(number):
        texts.append(f"{number:.17e}")
    for text in texts:
        assert fast(f"[{text}]") == reference(f"[{text}]"), text


JSON_CHARS = st.sampled_from(
    list('{}[]:,"\\ 0123456789.eE+-truefalsnNIiy\x00\x1f\x7fu') + ["\ud800"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(JSON_CHARS, max_size=30).map("".join))
def test_random_text_reads_alike(text: str) -> None:
    """Text made of JSON's own characters, mostly broken: the same value or the same refusal."""
    assert fast(text) == reference(text)


@settings(max_examples=300, deadline=None)
@given(json_value, st.integers(0, 200), st.sampled_from(["", "x", "}", '"', "\\", "\x00", "1"]))
def test_damaged_documents_read_alike(value: Any, cut: int, junk: str) -> None:
    """A document cut short or with a stray character inserted: same value or refusal."""
    text = json.dumps(value, allow_nan=True)
    damaged = text[:cut] + junk + text[cut:]
    assert fast(damaged) == reference(damaged)


def test_without_orjson_the_json_module_reads_every_document(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A checkout run from its folder on a node without orjson (PYTHONPATH, as the GPU-machine
    scripts run it) reads the same documents the same way."""
    monkeypatch.setattr(untrusted, "orjson", None)
    for text in [*EDGES, '{"v":1,"type":"hb","host":"n","t":1767225600.0}']:
        assert fast(text) == reference(text)
    assert untrusted.loads('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
