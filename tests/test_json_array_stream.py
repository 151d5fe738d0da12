"""The streamed JSON reader of Prometheus and Ray answers (``untrusted.JsonArrayStream``) and
the label cleaning of each series (``prometheus.LabelCleaner.labels``), held to their plain
definitions: whatever the chunks the answer arrives in, the document is ``json.loads``' with
the array's items converted, and a broken document is refused whatever its chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fuzz_data import FUZZ
from hypothesis import given
from hypothesis import strategies as st

from verl_top.sources.prometheus import LabelCleaner
from verl_top.untrusted import JsonArrayStream, UntrustedJSONError, clean_text

PATH = ("data", "result")
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def convert(item: Any) -> Any:
    """Drops the integers (a row the reader refuses), wraps the rest."""
    return None if isinstance(item, int) and not isinstance(item, bool) else ("ok", item)


def read(text: str, cuts: list[int], max_items: int = 1000) -> tuple[dict, int, bool]:
    stream = JsonArrayStream(PATH, convert, max_items)
    last = 0
    for cut in sorted(c % (len(text) + 1) for c in cuts):
        stream.feed(text[last:cut])
        last = cut
    stream.feed(text[last:])
    return stream.finish(), stream.dropped, stream.truncated


@FUZZ
@given(
    st.lists(values, max_size=12),
    st.dictionaries(st.sampled_from(["status", "warnings", "z"]), scalars, max_size=3),
    st.lists(st.integers(0, 10_000), max_size=8),
    st.sampled_from([None, 0, 2, "\t"]),
)
def test_any_chunking_reads_the_document_json_reads(items, other, cuts, indent) -> None:
    # indent: whitespace between the tokens (none, newlines, spaces, tabs)
    text = json.dumps({**other, "data": {"resultType": "vector", "result": items}}, indent=indent)
    doc, dropped, truncated = read(text, cuts)
    expected = json.loads(text)
    kept = [convert(i) for i in expected["data"]["result"]]
    expected["data"]["result"] = [k for k in kept if k is not None]
    assert doc == expected and dropped == kept.count(None) and not truncated


@FUZZ
@given(st.lists(values, min_size=1, max_size=12), st.lists(st.integers(0, 10_000), max_size=6))
def test_the_item_cap_stops_reading_at_any_chunking(items, cuts) -> None:
    text = json.dumps({"data": {"result": items}})
    cap = max(1, len(items) // 2)
    doc, dropped, truncated = read(text, cuts, max_items=cap)
    assert len(doc["data"]["result"]) + dropped == cap
    assert truncated == (len(items) >= cap)


@pytest.mark.parametrize(
    "text",
    [
        '{"data": {"result": [1, 2,]}}',  # a trailing comma
        '{"data": {"result": [1 2]}}',  # no comma
        '{"data": {"result": [1, 2}}',  # the array never closed
        '{"data": {"result": [1, 2]}',  # the object never closed
        '{"data": {"result": [1, 2]}} x',  # text after the document
        '{"data": {"result": [,]}}',
    ],
)
def test_a_broken_array_is_refused_whatever_its_chunks(text: str) -> None:
    for size in (1, 2, 3, 7, len(text)):
        stream = JsonArrayStream(PATH, convert)
        with pytest.raises(UntrustedJSONError):
            for i in range(0, len(text), size):
                stream.feed(text[i : i + size])
            stream.finish()


def test_an_item_longer_than_its_cap_is_refused_while_it_streams() -> None:
    stream = JsonArrayStream(PATH, convert, max_item=100)
    stream.feed('{"data": {"result": [1, "' + "x" * 50)
    with pytest.raises(UntrustedJSONError, match="longer than 100"):
        stream.feed("x" * 200)


hostile = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",))
    | st.sampled_from("\x1b\x00\u200b\x85"),
    max_size=300,
)


@FUZZ
@given(st.lists(st.tuples(hostile, hostile | st.integers()), max_size=80))
def test_labels_are_the_first_64_string_pairs_cleaned(pairs) -> None:
    metric: dict[Any, Any] = dict(pairs)
    cleaner = LabelCleaner(capacity=50)  # small: the memos are cleared along the way
    expected = {
        clean_text(k, 64): clean_text(v, 256)
        for k, v in list(metric.items())[:64]
        if isinstance(k, str) and isinstance(v, str)
    }
    assert cleaner.labels(metric) == expected
    assert cleaner.labels(metric) == expected  # from the memos
    assert all(cleaner(k, 64) == clean_text(k, 64) for k in metric)
