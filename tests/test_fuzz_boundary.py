"""Property tests: nothing a node, a log or an API sends raises inside verl-top or reaches the
screen or an export unsanitized (issue 16). Examples per target: $VERL_TOP_FUZZ_EXAMPLES
(default 150 in CI; the figures in docs/security.md come from a larger run)."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from fuzz_data import (
    EXAMPLES,
    FUZZ,
    HOSTILE,
    T0,
    assert_record_is_safe,
    hostile_text,
    json_safe,
    wire_record,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.diagnosis.engine import Engine
from verl_top.export.report import build_report
from verl_top.export.snapshot import build_snapshot
from verl_top.model import GpuProcess, GpuSample, Hello, HostState, ProcessList, Record
from verl_top.monitor import assess_store
from verl_top.nccl.parse import NcclStreamParser, parse_nccl_tests
from verl_top.protocol import Decoder
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.untrusted import is_clean
from verl_top.verl.parse import VerlStreamParser


@FUZZ
@given(wire_record())
def test_decoder_never_raises_and_lets_through_only_safe_records(data: dict[str, Any]) -> None:
    decoder = Decoder()
    line = json.dumps(data, default=str)  # json.dumps writes NaN/Infinity as a node could
    record = decoder.decode(line)
    assert (record is None) == (decoder.malformed == 1)
    if record is not None:
        assert_record_is_safe(record)


@FUZZ
@given(st.binary(max_size=300))
def test_decoder_survives_arbitrary_bytes(raw: bytes) -> None:
    Decoder().decode(raw)


STEP = (
    "(TaskRunner pid=2664304) step:{n} - timing_s/gen:{a} - timing_s/step:{b} - "
    "perf/mfu/actor:{c} - response_length/mean:{d}"
)


@FUZZ
@given(
    st.lists(
        st.one_of(
            hostile_text,
            st.builds(
                STEP.format,
                n=st.integers(-5, 10**20),
                a=st.sampled_from(["1.5", "nan", "inf", "1e308", "np.float64(2.0)", "[", "x"]),
                b=st.sampled_from(["3.0", "-inf", "tensor(4.0)", "1e999", "0"]),
                c=st.sampled_from(["np.float64(0.0)", "1.5e-06", "nan"]),
                d=hostile_text,
            ),
        ),
        max_size=12,
    )
)
def test_verl_parser_never_raises_and_yields_finite_metrics(lines: list[str]) -> None:
    parser = VerlStreamParser("h", "/log")
    for record in parser.feed(lines, T0):
        assert_record_is_safe(record)


@FUZZ
@given(
    st.lists(
        st.one_of(
            hostile_text,
            st.sampled_from(
                [
                    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
                    "  1073741824     268435456     float     sum      -1   5320.1  201.83  353.20      0",
                    "  1073741824     268435456     float     sum      -1   nan  inf  1e999      x",
                    "node01:12:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
                    "node01:12:12 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
                    "NCCL_IB_DISABLE=1",
                ]
            ),
        ),
        max_size=10,
    )
)
def test_nccl_parsers_never_raise(lines: list[str]) -> None:
    parse_nccl_tests("\n".join(lines))
    parser = NcclStreamParser("h", "/nccl.log")
    for record in parser.feed(lines, T0):
        assert_record_is_safe(record)


def _store_from(lines: list[str]) -> Store:
    store = Store()
    pipeline = Pipeline(store, wall_clock=lambda: T0)
    decoder = Decoder()
    for line in lines:
        record = decoder.decode(line)
        if record is not None:
            pipeline.emit(record)
    return store


@settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
@given(st.lists(wire_record(), min_size=1, max_size=25))
def test_store_diagnosis_and_exports_survive_fuzzed_records(records: list[dict[str, Any]]) -> None:
    store = _store_from([json.dumps(r, default=str) for r in records])
    assessment = assess_store(store, Engine())
    doc = build_snapshot(store, assessment, now=T0)
    assert json_safe(doc)
    json.dumps(doc, allow_nan=False)  # snapshot.json must stay valid JSON
    report = build_report(store, assessment, doc)
    for line in report.splitlines():
        assert is_clean(line), line


def hostile_records(title: str) -> list[Record]:
    """A node that names its GPU and its process with hostile text."""
    host = "node01"
    return [
        Hello(host=host, t=T0, backend="replay", gpus=[], error=title),
        GpuSample(host=host, t=T0, index=0, util_gpu=50.0, label=title),
        ProcessList(
            host=host,
            t=T0,
            procs=[GpuProcess(pid=42, gpu_index=0, used_mib=100.0, user=title, cmd=title)],
        ),
        HostState(host=host, t=T0, state="up", reason=title),
    ]


@pytest.mark.timeout(60 + 10 * max(5, EXAMPLES // 30))  # one app start per example
@settings(FUZZ, max_examples=max(5, EXAMPLES // 30))
@given(st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=3).map(" ".join))
def test_running_app_survives_hostile_text_on_every_pane(title: str) -> None:
    asyncio.run(_drive_app(title))


async def _drive_app(title: str) -> None:
    from verl_top.inputs import Inputs
    from verl_top.ui.app import VerlTopApp

    store = Store()
    pipeline = Pipeline(store, parsers={}, wall_clock=lambda: T0)
    decoder = Decoder()
    from verl_top.protocol import encode

    for record in hostile_records(title):
        decoded = decoder.decode(encode(record))  # through the boundary, as from a node
        if decoded is not None:
            pipeline.emit(decoded)
    app = VerlTopApp(Inputs(store=store, pipeline=pipeline), engine=Engine(), live=False)
    async with app.run_test(size=(160, 48)) as pilot:
        for key in ("1", "2", "3", "4", "5", "1"):
            await pilot.press(key)
            app.refresh_now()
            await pilot.pause()
        svg = app.export_screenshot()
        ET.fromstring(svg)  # valid XML: no control character or stray markup got in
        assert "\x1b" not in svg and "\x07" not in svg
        assert "evil.example" not in svg or "[link=" in svg  # shown literally, never a live link
    assert app.return_code in (None, 0)
