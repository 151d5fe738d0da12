"""Wire format: round trips, tolerance of unknown fields, malformed lines counted not raised."""

from __future__ import annotations

import gzip
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.model import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    Hello,
    HostState,
    ProbeResult,
    ProbeRow,
    ProcessList,
    VerlStep,
)
from verl_top.protocol import VERSION, Decoder, encode, from_dict, read_recording, to_dict

SAMPLES = [
    Hello(
        host="gpu01",
        t=1.5,
        backend="pynvml",
        gpus=[
            GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-a7f6", mem_total_mib=143771, gpm=True)
        ],
    ),
    GpuSample(host="gpu01", t=2.0, index=3, util_gpu=98.0, sm_util=13.2, tensor_util=0.4),
    ProcessList(host="gpu01", t=2.0, procs=[GpuProcess(pid=42, gpu_index=0, used_mib=1024.0)]),
    HostState(host="gpu02", t=2.0, state="down", reason="connection refused"),
    VerlStep(host="head", t=3.0, step=7, metrics={"timing_s/gen": 12.5, "perf/throughput": 1800.0}),
    ProbeResult(
        host="gpu01", t=4.0, rows=[ProbeRow(1 << 30, 5000.0, 214.7, 375.8)], busbw_max_gbs=375.8
    ),
]


def test_round_trip_keeps_every_field() -> None:
    dec = Decoder()
    for rec in SAMPLES:
        assert dec.decode(encode(rec)) == rec
    assert dec.malformed == 0 and dec.decoded == len(SAMPLES)


def test_line_carries_version_and_type_and_omits_missing_values() -> None:
    data = json.loads(encode(GpuSample(host="h", t=1.0, index=0, util_gpu=5.0)))
    assert data["v"] == VERSION and data["type"] == "gpu"
    assert "sm_util" not in data  # None means "not supported", so it is not sent


def test_unknown_fields_are_tolerated() -> None:
    data = to_dict(SAMPLES[1])
    data["future_metric"] = 1.0
    data["gpus"] = "ignored"
    rec = from_dict(data)
    assert rec == SAMPLES[1]


def test_malformed_lines_are_counted_and_skipped() -> None:
    dec = Decoder()
    lines = [
        "not json",
        '{"v":1,"type":"nope","host":"a","t":1}',
        '{"v":99,"type":"gpu","host":"a","t":1}',
        '{"v":1,"type":"gpu","host":5,"t":1}',
        "[1,2,3]",
        "",
        encode(SAMPLES[1]),
    ]
    out = list(dec.decode_all(lines))
    assert out == [SAMPLES[1]]
    assert dec.malformed == 5
    assert "version" in dec.errors_by_kind or dec.last_error


def test_gzip_recording_reads_back(tmp_path) -> None:
    path = tmp_path / "rec.ndjson.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for rec in SAMPLES:
            fh.write(encode(rec) + "\n")
        fh.write("garbage line\n")
    dec = Decoder()
    assert read_recording(path, dec) == SAMPLES
    assert dec.malformed == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_decoder_never_raises_on_text(text: str) -> None:
    Decoder().decode(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            "hello",
            "gpu",
            "host",
            "procs",
            "state",
            "hb",
            "log",
            "step",
            "config",
            "probe",
            "nccl",
            "event",
            "x",
        ]
    ),
    st.dictionaries(
        st.sampled_from(["host", "t", "gpus", "procs", "rows", "index", "metrics", "lines", "v"]),
        json_values,
    ),
)
def test_decoder_never_raises_on_json_objects(rtype: str, fields: dict) -> None:
    fields["type"] = rtype
    Decoder().decode(json.dumps(fields))
