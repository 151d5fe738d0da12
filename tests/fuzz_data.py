"""Hypothesis strategies for hostile input: what a compromised node, a broken log or a bad API
could send. Shared by the fuzz tests (tests/test_fuzz_*.py)."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from verl_top.model import NESTED, RECORD_TYPES, GpuSample, ProcessList, Record
from verl_top.untrusted import is_clean

# Strings that broke terminals, Rich or XML in real tools, plus verl's own bracketed CLI syntax.
HOSTILE = [
    "\x1b]52;c;ZXZpbCBjbGlwYm9hcmQ=\x07",  # OSC 52: write the user's clipboard
    "\x1b]0;pwned\x07",  # OSC 0: set the terminal title
    "\x1b\x1b]]0;nested\x07\x07",  # nesting that survives a single-pass strip
    "\x1b[\x1b[31m31m",
    "\x9b31m\x9d0;c1\x9c",  # 8-bit CSI / OSC / ST
    "\x1bP+q544e\x1b\\",  # DCS (XTGETTCAP)
    "\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\",
    "[link=https://evil.example]click[/link]",
    "[bold red]x[/]",
    "[/]",
    "[",
    "data.train_files=[/data/gsm8k/train.parquet]",
    "\u202egnp.exe",
    "\x00\x07\x08\x7f",
    "</svg><script>alert(1)</script>",
    "&amp;<>\"'",
    "\ud800" if False else "\ufffd",
    "a" * 5000,
    "\r\n\r\nstep:1 - timing_s/gen:1e308",
]

hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.lists(st.sampled_from(HOSTILE), min_size=2, max_size=4).map("".join),
)

NUMBERS = [0, 1, -1, 1.5, 1e308, -1e308, 10**30, -(10**30), 2**63, 1e300, 255, 256, 1024]
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(NUMBERS),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@st.composite
def nested_item(draw: Any, cls: type) -> dict[str, Any]:
    names = _field_names(cls)
    return {
        n: draw(json_value) for n in draw(st.lists(st.sampled_from(names), max_size=len(names)))
    }


@st.composite
def wire_record(draw: Any) -> dict[str, Any]:
    """A wire dict of a real record type whose fields hold anything a hostile node could send."""
    rtype = draw(st.sampled_from(sorted(RECORD_TYPES)))
    cls = RECORD_TYPES[rtype]
    out: dict[str, Any] = {"v": 1, "type": rtype, "host": draw(st.one_of(hostile_text, scalar))}
    out["t"] = draw(st.one_of(st.just(1_767_225_600.0), st.sampled_from(NUMBERS), scalar))
    for name in draw(st.lists(st.sampled_from(_field_names(cls)), max_size=6)):
        sub = NESTED.get((rtype, name))
        if sub is not None:
            out[name] = draw(st.lists(st.one_of(nested_item(sub), json_value), max_size=5))
        else:
            out[name] = draw(json_value)
    return out


def json_safe(value: Any) -> bool:
    """True when every float in ``value`` is finite (what json.dumps(allow_nan=False) needs)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(json_safe(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(json_safe(v) for v in value)
    return True


# Issue 31's attack material: what got through the first boundary. Kept apart from HOSTILE so
# the older fuzz targets keep their examples; tests/test_fuzz_surfaces.py draws from both.
HOSTILE_31 = [
    "\x90\x98\x9d\x9e\x9f" * 400 + "\x1b",  # C1 string introducers then one ESC (was quadratic)
    "zw\u200bnode1",  # zero-width space inside a name
    "a\u200fb\u061cc\u200d\ufeff",  # RLM, ALM, ZWJ, BOM
    "\u2066x\u2069\u202dy\u3164\ufe0f\U000e0041",  # isolates, LRO, Hangul filler, VS16, tag
    "lone \ud800 surrogate \udfff",
    "9" * 5000,  # int() refuses more than 4300 digits
    "1_000",
    "٣٣",  # Arabic-Indic digits
    "hf_QkVbWxRt\u200bYuIoPaSdFgHj",  # a token split by an invisible character
    "wandb login 0123456789abcdef0123456789abcdef01234567",
    "[" * 70 + '"' + '\\"' * 300,  # unterminated string of escaped quotes (was quadratic)
]

hostile_text_31 = st.one_of(
    hostile_text,
    st.sampled_from(HOSTILE_31),
    st.lists(st.sampled_from(HOSTILE + HOSTILE_31), min_size=2, max_size=3).map("".join),
    st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Nd")),
            max_size=30),
)  # fmt: skip


# --- shared by the fuzz targets ------------------------------------------------------------

EXAMPLES = int(os.environ.get("VERL_TOP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI must not be flaky: the same examples every run
)
T0 = 1_767_225_600.0


def _walk(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every leaf of a record (dataclasses, lists, dicts) with its path."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = []
        for f in dataclasses.fields(value):
            out += _walk(getattr(value, f.name), f"{path}.{f.name}")
        return out
    if isinstance(value, list | tuple):
        return [leaf for i, v in enumerate(value) for leaf in _walk(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.append((f"{path}<key>", k))
            out += _walk(v, f"{path}.{k}")
        return out
    return [(path, value)]


def assert_record_is_safe(record: Record) -> None:
    """What the boundary promises about any record it let through."""
    for path, leaf in _walk(record):
        if isinstance(leaf, str):
            assert is_clean(leaf), f"{path} holds a control/escape: {leaf!r}"
            assert len(leaf) <= 70_000, f"{path} is unbounded ({len(leaf)} chars)"
        elif isinstance(leaf, float):
            assert math.isfinite(leaf), f"{path} is {leaf}"
        elif isinstance(leaf, int) and not isinstance(leaf, bool):
            assert abs(leaf) < 2**63, f"{path} is {leaf}"
    assert math.isfinite(record.t)
    if isinstance(record, GpuSample):
        assert 0 <= record.index < 1024
    if isinstance(record, ProcessList):
        assert all(0 <= p.gpu_index < 1024 for p in record.procs)
