"""The compiled checks of all-scalar records (verl_top/flat_validator.py) keep exactly what the
field-by-field path keeps, and hand everything else to it: on real agent lines and on hostile
values (NaN, inf, huge ints, bools, wrong types, control characters, over-long strings)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_top import protocol
from verl_top.agent.main import Agent, parse_args
from verl_top.agent.wire import encode_line
from verl_top.model import RECORD_TYPES, GpuSample, Record
from verl_top.untrusted import loads

TRACE = Path(__file__).parent / "fixtures" / "agent" / "h200_phased_trace.jsonl"
FLAT_TYPES = sorted(name for name, cls in RECORD_TYPES.items() if protocol._flat_check(cls))


def typed(record: Record) -> list[tuple[str, type, str]]:
    """Every field with its exact type and repr: 1 and 1.0, 0.0 and -0.0 differ here."""
    return [
        (f.name, type(v), repr(v))
        for f in dataclasses.fields(record)
        for v in [getattr(record, f.name)]
    ]


def judged(data: Any, fast: bool) -> tuple[str, list[Any], list[str]]:
    """What validate makes of ``data``: ("ok", typed fields, issues) or ("rejected", reason)."""
    issues: list[str] = []
    try:
        record = protocol.validate(data, issues, fast=fast)
    except protocol.Rejected as exc:
        return "rejected", [exc.reason], issues
    return "ok", typed(record), issues


def assert_same(data: dict[str, Any]) -> None:
    """The compiled check keeps ``data`` only as the slow path would, and validate (which
    uses it) answers exactly as the slow path does."""
    slow = judged(data, fast=False)
    assert judged(data, fast=True) == slow
    check = protocol._flat_check(RECORD_TYPES[data["type"]])
    assert check is not None
    kept = check(data)
    if kept is not None:
        assert slow[0] == "ok" and slow[2] == [], f"fast kept what the slow path changed: {data}"
        assert typed(kept) == slow[1]
        # The instance the compiled check fills is the one the dataclass would build.
        assert type(kept) is RECORD_TYPES[data["type"]]
        assert vars(kept) == vars(protocol.validate(data, fast=False))
        assert list(vars(kept)) == [f.name for f in dataclasses.fields(kept)]


def wire(rtype: str) -> dict[str, Any]:
    """A valid wire dict of ``rtype`` with every field set (defaults, ``host`` and ``t``)."""
    cls = RECORD_TYPES[rtype]
    return {**protocol.to_dict(cls(host="node1", t=1.7e9)), "v": 1}


def real_gpu_lines(ticks: int = 30) -> list[str]:
    """The GPU lines the real agent writes (replay backend on the H200 trace, 8 GPUs)."""
    argv = ["--backend", "replay", "--replay-trace", str(TRACE), "--replay-gpus", "8"]
    agent = Agent(parse_args([*argv, "--host", "node1", "--no-procs"]))
    try:
        return [
            encode_line(rec)
            for i in range(ticks)
            for rec in agent.tick(1.7e9 + i)
            if rec["type"] == "gpu"
        ]
    finally:
        agent.close()


def test_real_gpu_lines_take_the_fast_path_and_match() -> None:
    """Every GPU sample the real agent writes (H200 trace) is kept by the compiled check, as the
    slow path keeps it: the fast path is the one the live stream takes, not dead code."""
    lines = real_gpu_lines()
    assert len(lines) == 240
    check = protocol._flat_check(GpuSample)
    assert check is not None
    for line in lines:
        data = loads(line)
        assert check(data) is not None, line
        assert_same(data)


def test_which_types_are_compiled() -> None:
    """GPU samples are compiled; a type with a list field (host samples) keeps the slow path."""
    assert "gpu" in FLAT_TYPES and "hb" in FLAT_TYPES and "state" in FLAT_TYPES
    assert "host" not in FLAT_TYPES and "procs" not in FLAT_TYPES


BIG = [10**30, -(10**30), 2**63, 2**64, 2**64 - 1, -1, 256, 255, 1e18, 1e19, 1e308, -1e308]
HOSTILE_SCALARS = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    True,
    False,
    None,
    "",
    "12",
    "node\x1b[31m",
    "a\x00b",
    "\x7f",
    "tab\there",
    "zw\u200bsp",
    "\ud800",
    "ünïcode",
    "x" * 300,
    "x" * 600,
    "up",
    "connecting",
    [],
    [1.0],
    {},
    {"a": 1},
    1.0,
    1.5,
    0,
    100,
    100.0,
    100.5,
    *BIG,
]
hostile = st.one_of(
    st.sampled_from(HOSTILE_SCALARS),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.booleans(),
)


@pytest.mark.parametrize("rtype", FLAT_TYPES)
@pytest.mark.parametrize("value", HOSTILE_SCALARS, ids=repr)
def test_each_hostile_value_in_each_field(rtype: str, value: Any) -> None:
    """Every hostile value in every field of every compiled type: the same answer as the slow
    path (kept, cleaned, set to no data, or the record refused)."""
    for name in wire(rtype):
        if name not in ("v", "type"):
            assert_same({**wire(rtype), name: value})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rtype=st.sampled_from(FLAT_TYPES),
    changes=st.dictionaries(st.text(min_size=1, max_size=16), hostile, max_size=6),
    drop=st.sets(st.text(min_size=1, max_size=16), max_size=3),
    pick=st.data(),
)
def test_random_records_match_the_slow_path(
    rtype: str, changes: dict[str, Any], drop: set[str], pick: st.DataObject
) -> None:
    """Random fields replaced by hostile values, removed, or added: identical answers."""
    data = wire(rtype)
    fields = [n for n in data if n not in ("v", "type")]
    for name in pick.draw(st.lists(st.sampled_from(fields), max_size=4)):
        data[name] = pick.draw(hostile)
    data.update({k: v for k, v in changes.items() if k not in ("v", "type")})
    for name in drop | set(pick.draw(st.lists(st.sampled_from(fields), max_size=2))):
        data.pop(name, None)
    assert_same(data)


@settings(max_examples=200, deadline=None)
@given(
    values=st.fixed_dictionaries(
        {
            "util_gpu": st.one_of(st.floats(-1, 101), st.integers(-1, 101)),
            "index": st.one_of(st.integers(-2, 258), st.floats(-2, 258)),
            "clock_reasons": st.integers(-1, 2**65),
            "label": st.text(max_size=520),
            "host": st.text(max_size=300),
        }
    )
)
def test_gpu_bounds_match_the_slow_path(values: dict[str, Any]) -> None:
    """Values at and around every bound of a GPU sample (0-100 %, GPU index 0-255, a 64-bit
    mask, the host's 255 and a label's 512 characters): identical answers."""
    assert_same({**wire("gpu"), **values})


def test_fast_path_refuses_what_needs_cleaning() -> None:
    """The compiled check hands these to the slow path (which cleans or refuses them): if it
    kept one, an escape or an out-of-range number would reach the store as sent."""
    check = protocol._flat_check(GpuSample)
    assert check is not None
    for name, value in [
        ("label", "idle\x1b]0;t\x07"),
        ("host", "n\u202e1"),
        ("label", "x" * 513),
        ("util_gpu", 100.5),
        ("util_gpu", True),
        ("index", 1.0),
        ("index", 256),
        ("clock_reasons", 2**64),
        ("lost", 1),
        ("t", math.inf),
    ]:
        assert check({**wire("gpu"), name: value}) is None, (name, value)
