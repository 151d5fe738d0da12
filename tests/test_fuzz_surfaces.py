"""One property test per surface foreign data enters by (issue 31): agent records, followed logs,
configs, Prometheus answers, Ray replies, recordings and NCCL text.

Each feeds generated hostile input (issue 31's attack material on top of issue 16's: C1
introducer runs, zero-width and bidi marks, lone surrogates, 5000-digit numbers, ``1_000``,
Arabic-Indic digits, alias bombs, deep nesting, invalid UTF-8) and asserts what the boundary
promises: no exception escapes, every output string is clean (no escape, control or invisible
character, no lone surrogate) and every number finite, and each call stays within stated bounds
(``BOUND_S`` seconds, and for the decoders that allocate in proportion to their input,
``BOUND_MIB`` of traced memory). The inputs are at most a few hundred KB, so linear work takes
milliseconds: a bound of seconds only catches the quadratic or unbounded kind.

    VERL_TOP_FUZZ_EXAMPLES=1500 python -m pytest tests/test_fuzz_surfaces.py -q
"""

from __future__ import annotations

import gzip
import io
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from fuzz_data import (
    EXAMPLES,
    FUZZ,
    HOSTILE_31,
    T0,
    assert_record_is_safe,
    hostile_text_31,
    json_value,
    wire_record,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.model import RayActors
from verl_top.nccl.parse import NcclStreamParser, parse_nccl_tests
from verl_top.protocol import Decoder, to_dict
from verl_top.sources.intake import Intake
from verl_top.sources.prometheus import LabelCleaner, SeriesReader, _stream, answer_series
from verl_top.sources.ray import ACTOR_ROW, NODE_ROW, map_actors, parse_nodes
from verl_top.sources.replay import _lines
from verl_top.sources.replay import _stream as replay_stream
from verl_top.untrusted import JsonArrayStream, UntrustedJSONError, is_clean
from verl_top.verl.config import ConfigError, flatten, load_config_text
from verl_top.verl.parse import VerlStreamParser

BOUND_S = 5.0  # CPU seconds of one call on one example (linear work here: milliseconds)
BOUND_MIB = 64  # traced allocation peak of one decode
# A third of the examples of the older fuzz targets: the decoders here run twice per example
# (timed, then traced) and the suite must stay well under 10 minutes on 2 cores.
SURFACE = settings(FUZZ, max_examples=max(20, EXAMPLES // 3))


def bounded(fn: Callable[[], Any], memory: bool = False) -> Any:
    """``fn()``, asserting it took under BOUND_S of CPU (this process's CPU time: other work on a
    shared machine stretches wall time, not this); with ``memory``, a second run under
    tracemalloc (which slows allocation several times, so it is not timed) under BOUND_MIB."""
    started = time.process_time()
    result = fn()
    took = time.process_time() - started
    assert took < BOUND_S, f"{took:.2f} s of CPU for one example"
    if memory:
        tracemalloc.start()
        try:
            fn()
            peak = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        assert peak < BOUND_MIB, f"{peak:.0f} MiB for one example"
    return result


def clean_tree(value: Any) -> None:
    """Every string (keys too) in a decoded structure is clean; every float finite."""
    if isinstance(value, str):
        assert is_clean(value), repr(value)[:200]
    elif isinstance(value, float):
        assert value == value and abs(value) != float("inf")
    elif isinstance(value, dict):
        for k, v in value.items():
            clean_tree(k)
            clean_tree(v)
    elif isinstance(value, list | tuple):
        for v in value:
            clean_tree(v)


hostile_value = st.one_of(hostile_text_31, json_value)


# --- agent records (over SSH: the intake, clock and all) -----------------------------------


@st.composite
def agent_line(draw: Any) -> str:
    record = draw(wire_record())
    for name in draw(st.lists(st.sampled_from(sorted(record)), max_size=3)):
        if name not in ("v", "type"):
            record[name] = draw(hostile_text_31)
    text = json.dumps(record, default=str)
    return text if draw(st.booleans()) else text.replace('"', draw(st.sampled_from(HOSTILE_31)), 1)


@SURFACE
@given(st.lists(agent_line(), min_size=1, max_size=8))
def test_agent_records_through_the_intake(lines: list[str]) -> None:
    out: list[Any] = []
    intake = Intake("node1", clock=lambda: T0)
    bounded(lambda: [intake.accept(line, out.append) for line in lines])
    for record in out:
        assert_record_is_safe(record)


# --- followed logs (verl and NCCL parsers, behind the line cleaner) -------------------------


STEP_31 = "(TaskRunner pid=1) step:{n} - timing_s/gen:{a} - {k}:{b}"


@SURFACE
@given(
    st.lists(
        st.one_of(
            hostile_text_31,
            st.builds(
                STEP_31.format,
                n=st.sampled_from(["1", "9" * 5000, "٣", "1_000"]),
                a=st.sampled_from(["1.5", "1e999", "9" * 400, "nan"]),
                k=hostile_text_31,
                b=st.sampled_from(["2.0", "-inf", "1_000"]),
            ),
            st.builds(
                lambda k, v: json.dumps({"step": 3, "data": {k: v}}),
                hostile_text_31,
                st.one_of(st.integers(), st.floats(), hostile_text_31),
            ),
        ),
        max_size=10,
    )
)
def test_followed_log_lines(lines: list[str]) -> None:
    from verl_top.untrusted import clean_line

    cleaned = [clean_line(line) for line in lines]  # what the record boundary does to them
    for parser in (VerlStreamParser("h", "/driver.log"), NcclStreamParser("h", "/nccl.log")):
        flush = getattr(parser, "flush", None)  # the verl parser ends a stream with flush()
        records = bounded(lambda p=parser, f=flush: p.feed(cleaned, T0) + (f(T0) if f else []))
        for record in records:
            assert_record_is_safe(record)
    # Decoding makes text the raw line did not hold: JSON "\u001b" in a JSONL key.
    for record in VerlStreamParser("h", "/x.jsonl").feed(lines, T0):
        assert_record_is_safe(record)


# --- configs (YAML / JSON / pprint) ----------------------------------------------------------


@st.composite
def config_text(draw: Any) -> tuple[str, bool]:
    kind = draw(st.sampled_from(["json", "yaml", "alias", "deep"]))
    if kind == "json":
        tree = {"trainer": draw(st.dictionaries(hostile_text_31, hostile_value, max_size=6))}
        return json.dumps(tree), True
    if kind == "alias":
        fan = draw(st.integers(2, 12))
        levels = draw(st.integers(1, 9))
        text = "a0: &a0 {" + ", ".join(f"k{j}: 1" for j in range(fan)) + "}\n"
        for i in range(1, levels):
            text += f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(fan)) + "}\n"
        return text, False
    if kind == "deep":
        depth = draw(st.integers(1, 3000))
        return "a: " + "[" * depth + "]" * depth, draw(st.booleans())
    key = json.dumps(draw(hostile_text_31))  # YAML double-quoted: \e, \u001b, \ud800 escapes
    value = json.dumps(draw(hostile_text_31))
    return (
        f"trainer:\n  {key}: {value}\n  nnodes: {draw(st.sampled_from(['2', '9' * 5000]))}\n",
        False,
    )


@SURFACE
@given(config_text())
def test_configs(case: tuple[str, bool]) -> None:
    text, json_first = case

    def load() -> dict[str, Any] | None:
        try:
            tree = load_config_text(text, json_first=json_first)
        except ConfigError:
            return None  # refused with a reason: fine
        return flatten(tree) if tree else None

    flat = bounded(load, memory=True)
    if flat is not None:
        clean_tree(flat)


# --- Prometheus answers ----------------------------------------------------------------------


@st.composite
def prometheus_answer(draw: Any) -> str:
    def row() -> dict[str, Any]:
        labels = draw(st.dictionaries(hostile_text_31, hostile_text_31, max_size=4))
        labels.update({"Hostname": draw(hostile_text_31), "gpu": draw(st.sampled_from(
            ["0", "1", "٣", "1_0", "99999", "-1", ""]))})  # fmt: skip
        values = st.one_of(
            st.sampled_from(["1", "NaN", "+Inf", "1_000", "٣", "9" * 5000, "1e400", ""]),
            hostile_text_31,
            st.integers(),
            st.floats(),
        )
        pair = st.lists(st.one_of(st.floats(), st.integers(), hostile_text_31, values), max_size=3)
        if draw(st.booleans()):
            return {"metric": labels, "value": draw(st.tuples(st.floats(0, 2e9), values))}
        return {"metric": labels, "values": draw(st.lists(pair, max_size=20))}

    result = [row() for _ in range(draw(st.integers(0, 6)))]
    doc = {"status": draw(st.sampled_from(["success", "error", 5])), "data": {"result": result}}
    doc["error"] = draw(hostile_text_31)
    text = json.dumps(doc, default=str)
    return text if draw(st.booleans()) else text[: draw(st.integers(0, len(text)))]


@SURFACE
@given(prometheus_answer(), st.integers(1, 64))
def test_prometheus_answers(text: str, chunk: int) -> None:
    def read() -> list[Any] | None:
        stream = _stream(SeriesReader(LabelCleaner()))
        try:
            for i in range(0, len(text), chunk):  # as the body arrives, in pieces
                stream.feed(text[i : i + chunk])
            return answer_series(stream.finish(), "x")
        except Exception as exc:  # noqa: BLE001 - only the two refusals may come out
            assert type(exc).__name__ in ("UntrustedJSONError", "PromError"), repr(exc)
            return None

    for series in bounded(read, memory=True) or []:
        clean_tree(series.labels)
        clean_tree([v for _, v in series.points if v is not None])


# --- Ray dashboard replies --------------------------------------------------------------------


@SURFACE
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "actor_id": hostile_value,
                "node_id": st.sampled_from(["n1", "n2"]),
                "state": st.sampled_from(["ALIVE", "DEAD", None]),
                "name": st.one_of(hostile_text_31, st.just("abcWorkerDict_0:1")),
                "class_name": hostile_value,
                "pid": st.one_of(st.integers(), hostile_value),
                "job_id": hostile_value,
                "required_resources": st.one_of(
                    st.fixed_dictionaries({"GPU": json_value}), hostile_value
                ),
                "extra": hostile_value,
            },
        ),
        max_size=8,
    ),
    st.lists(
        st.fixed_dictionaries(
            {"node_id": st.one_of(st.just("n1"), hostile_text_31)},
            optional={
                "node_ip": st.one_of(st.just("10.0.0.1"), hostile_text_31),
                "state": st.just("ALIVE"),
                "resources_total": json_value,
            },
        ),  # fmt: skip
        max_size=4,
    ),
)
def test_ray_replies(actors: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
    def reply(rows: list[dict[str, Any]]) -> str:
        body = {"result": True, "data": {"result": {"total": len(rows), "result": rows}}}
        return json.dumps(body, default=str)

    def read() -> RayActors | None:
        parsed = {}
        for name, rows, convert in (("a", actors, ACTOR_ROW), ("n", nodes, NODE_ROW)):
            stream = JsonArrayStream(("data", "result", "result"), convert)
            try:
                stream.feed(reply(rows))
                parsed[name] = stream.finish()["data"]["result"]
            except UntrustedJSONError:
                return None
        ray_nodes = parse_nodes(parsed["n"], [])
        mapped = map_actors(parsed["a"]["result"], {n.node_id: n for n in ray_nodes})
        record = RayActors(host="ray:x", t=T0, nodes=ray_nodes, actors=mapped)
        return Decoder().decode_dict(to_dict(record))  # what RaySource._emit does

    record = bounded(read, memory=True)
    if record is not None:
        assert_record_is_safe(record)


# --- recordings ----------------------------------------------------------------------------


@SURFACE
@given(
    st.lists(
        st.one_of(
            agent_line().map(lambda line: line.encode("utf-8", "surrogatepass")),  # bad UTF-8
            st.binary(max_size=60),
            st.sampled_from([b"\xff\xfe", b"\n" * 5000, b" " * 300, b"\r\n", b"\x00"]),
            st.just(b'{"v":1,"type":"hb","host":"n","t":1767225600.0}'),
        ),
        max_size=10,
    ),
    st.booleans(),
)
def test_recordings(tmp_path_factory, lines: list[bytes], packed: bool) -> None:
    data = b"\n".join(lines)
    path = tmp_path_factory.mktemp("rec") / ("r.ndjson.gz" if packed else "r.ndjson")
    path.write_bytes(gzip.compress(data) if packed else data)
    decoder = Decoder()
    records = bounded(lambda: list(replay_stream(path, decoder)))
    for record in records:
        assert_record_is_safe(record)
    # The line scanner agrees with a plain split on what is worth decoding.
    got = [line for line in _lines(io.BytesIO(data), 1 << 24) if line is not None]
    assert got == [line.lstrip() for line in data.split(b"\n") if line.strip()]


# --- NCCL text (nccl-tests output and NCCL_DEBUG logs) ---------------------------------------

ROW = "{size}  {count}  float  sum  -1  {t}  {alg}  {bus}  {w}  {t}  {alg}  {bus}  {w}"


@SURFACE
@given(
    st.lists(
        st.one_of(
            hostile_text_31,
            st.builds(
                ROW.format,
                size=st.sampled_from(["1048576", "9" * 5000, "-5", "١٢"]),
                count=st.sampled_from(["262144", "9" * 30]),
                t=st.sampled_from(["51.2", "inf", "nan", "-1", "1e400"]),
                alg=st.sampled_from(["20.5", "1e300", "-3"]),
                bus=st.sampled_from(["38.4", "nan", "9" * 400]),
                w=st.sampled_from(["0", "inf", "N/A", "9" * 5000]),
            ),
            st.builds(
                "node:1:1 [0] NCCL INFO comm 0x1 rank {} nRanks {} nNodes {}".format,
                hostile_text_31,
                st.sampled_from(["2", "9" * 5000]),
                hostile_text_31,
            ),  # fmt: skip
            st.just("# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592"),
            st.just("# Avg bus bandwidth    : 38.4"),
        ),
        max_size=12,
    )
)
def test_nccl_text(lines: list[str]) -> None:
    result = bounded(lambda: parse_nccl_tests("\n".join(lines)))
    assert_record_is_safe(result.to_probe("h", T0))
    parser = NcclStreamParser("h", "/nccl.log")
    for record in bounded(lambda: parser.feed(lines, T0)):
        assert_record_is_safe(record)
