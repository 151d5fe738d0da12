"""The record boundary: every field of every record validated; bad input counted, never raised."""

from __future__ import annotations

import json
import math

import pytest

from verl_top.model import RECORD_TYPES, Dropped, GpuSample, Hello, ProcessList, VerlStep
from verl_top.protocol import MAX_GPU_INDEX, Decoder, encode, from_dict
from verl_top.store import Store, StoreLimits
from verl_top.untrusted import is_clean

T = 1_800_000_000.0


def _gpu(**fields: object) -> dict[str, object]:
    return {"v": 1, "type": "gpu", "host": "n1", "t": T, "index": 0, **fields}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("util_gpu", "99"),  # a string where a number belongs
        ("util_gpu", float("nan")),
        ("util_gpu", float("inf")),
        ("util_gpu", 1e308),
        ("util_gpu", 100.5),  # a percentage over 100
        ("util_gpu", -1.0),
        ("temp_c", 1e6),
        ("power_w", -5.0),
        ("mem_used_mib", -1.0),
        ("clock_reasons", 1.5),
        ("util_gpu", True),  # a JSON bool is not a number
        ("util_gpu", [1, 2]),
        ("util_gpu", {"x": 1}),
    ],
)
def test_bad_number_becomes_no_data_and_is_counted(field: str, value: object) -> None:
    dec = Decoder()
    rec = dec.decode_dict(_gpu(**{field: value}, sm_util=40.0))
    assert isinstance(rec, GpuSample)
    assert getattr(rec, field) is None  # "no data", never 0 and never the bad value
    assert rec.sm_util == 40.0  # the good fields of the record are kept
    assert dec.drops == {("n1", f"field:gpu.{field}"): 1}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"index": 1.5}, "drop:gpu.index"),
        ({"index": 10**30}, "drop:gpu.index"),
        ({"index": MAX_GPU_INDEX + 1}, "drop:gpu.index"),
        ({"index": -1}, "drop:gpu.index"),
        ({"index": "0"}, "drop:gpu.index"),
        ({"t": 1e300}, "drop:gpu.t"),
        ({"t": -1.0}, "drop:gpu.t"),
        ({"t": "now"}, "drop:gpu.t"),
        ({"host": 5}, "drop:gpu.host"),
        ({"type": "no-such"}, "type"),
        ({"type": "state", "state": "[bold]pwned"}, "drop:state.state"),
        ({"v": 99}, "version"),
    ],
)
def test_bad_key_field_drops_the_record(fields: dict[str, object], reason: str) -> None:
    dec = Decoder()
    assert dec.decode_dict(_gpu(**fields)) is None
    assert dec.malformed == 1
    assert sum(n for (_, r), n in dec.drops.items() if r == reason) == 1


def test_wire_lines_with_nan_literals_deep_nesting_and_garbage_are_refused() -> None:
    dec = Decoder()
    nan_line = '{"v":1,"type":"gpu","host":"n1","t":1.0,"index":0,"util_gpu":NaN}'
    rec = dec.decode(nan_line)
    assert rec is not None and rec.util_gpu is None
    assert dec.decode("[" * 100_000 + "]" * 100_000) is None  # no RecursionError
    assert dec.decode("\x00\xff not json") is None
    assert dec.decode(b'{"v":1,"type":"hb","host":"n1","t":1e999}') is None  # inf t
    assert dec.errors_by_kind["json"] == 2


def test_strings_are_cleaned_and_bounded() -> None:
    dec = Decoder()
    hostile = "\x1b]52;c;cm0gLXJmIH4=\x07[link=http://x]click[/link]\x1b[2J" + "A" * 10_000
    rec = dec.decode_dict(
        {
            "v": 1,
            "type": "procs",
            "host": "n1\x1b[31m",
            "t": T,
            "procs": [{"pid": 7, "gpu_index": 0, "cmd": hostile, "user": "\x9b6n"}],
        }
    )
    assert isinstance(rec, ProcessList)
    assert rec.host == "n1" and is_clean(rec.procs[0].cmd) and is_clean(rec.procs[0].user)
    assert len(rec.procs[0].cmd) <= 4096
    assert "[link=http://x]" in rec.procs[0].cmd  # kept literally: the UI shows it as text


def test_bad_list_items_are_dropped_one_by_one() -> None:
    dec = Decoder()
    rec = dec.decode_dict(
        {
            "v": 1,
            "type": "procs",
            "host": "n1",
            "t": T,
            "procs": [
                {"pid": 1, "gpu_index": 0},
                {"pid": 1.5, "gpu_index": 0},
                {"pid": 2, "gpu_index": 10**30},
                "not a dict",
                {"pid": 3, "gpu_index": 1, "used_mib": "lots"},
            ],
        }
    )
    assert isinstance(rec, ProcessList)
    assert [(p.pid, p.used_mib) for p in rec.procs] == [(1, None), (3, None)]
    reasons = {r: n for (_, r), n in dec.drops.items()}
    assert reasons == {
        "drop:procs.procs.pid": 1,
        "drop:procs.procs.gpu_index": 1,
        "drop:procs.procs": 1,
        "field:procs.procs.used_mib": 1,
    }


def test_huge_lists_and_dicts_are_capped_and_said() -> None:
    dec = Decoder()
    hello = dec.decode_dict(
        {
            "v": 1,
            "type": "hello",
            "host": "n1",
            "t": T,
            "gpus": [{"index": i % 256} for i in range(100_000)],
            "capabilities": ["x"] * 10_000,
        }
    )
    assert isinstance(hello, Hello) and len(hello.gpus) == 256 and len(hello.capabilities) == 64
    step = dec.decode_dict(
        {
            "v": 1,
            "type": "step",
            "host": "n1",
            "t": T,
            "step": 3,
            "metrics": {f"m{i}": float(i) for i in range(50_000)} | {"bad": "x"},
        }
    )
    assert isinstance(step, VerlStep) and len(step.metrics) == 4096
    reasons = {r for (_, r) in dec.drops}
    assert {"cap:hello.gpus>256", "cap:hello.capabilities>64", "cap:step.metrics>4096"} <= reasons


def test_every_record_type_survives_hostile_values_for_every_field() -> None:
    """Each field of each type fed each hostile value: decode never raises, the store never
    raises, and what reaches the store is finite and clean."""
    hostile: list[object] = [
        "x",
        "\x1b[2J",
        float("nan"),
        float("inf"),
        -1e308,
        1e308,
        10**30,
        -(10**30),
        1.5,
        True,
        None,
        [],
        [1e308, "a", None, {"x": 1}],
        {"k": float("nan"), "j": [1, [2, [3]]], "l": {"deep": 1}},
    ]
    dec = Decoder()
    store = Store(StoreLimits(points=8))
    from verl_top.protocol import _specs

    for rtype, cls in RECORD_TYPES.items():
        for spec in _specs(cls):
            for value in hostile:
                rec = dec.decode_dict(
                    {"v": 1, "type": rtype, "host": "n1", "t": T, "step": 1, spec.name: value}
                )
                if rec is None:
                    continue
                store.ingest(rec, received=T)
                line = encode(rec)  # a recorder can always write what was accepted
                assert "NaN" not in line and "Infinity" not in line
                for v in vars(rec).values():
                    if isinstance(v, float):
                        assert math.isfinite(v)
                    if isinstance(v, str):
                        assert is_clean(v)
    assert dec.malformed > 0 and store.now == T
    # ... and the diagnosis over that store runs to a verdict.
    from verl_top.diagnosis.engine import Engine

    verdict = Engine().evaluate(store)
    assert verdict.checks


def test_store_counts_drops_per_host_and_reason() -> None:
    store = Store()
    store.ingest(Dropped(host="n1", t=0.0, reason="field:gpu.util_gpu", count=3))
    store.ingest(Dropped(host="n1", t=0.0, reason="drop:gpu.index", count=2))
    store.ingest(Dropped(host="n2", t=0.0, reason="json", count=1))
    assert store.dropped("n1") == 5 and store.dropped("n2") == 1 and store.dropped("n3") == 0
    health = store.input_health()
    assert health["dropped"] == {
        "n1": {"drop:gpu.index": 2, "field:gpu.util_gpu": 3},
        "n2": {"json": 1},
    }
    assert store.now == 0.0  # a drop report does not move the data clock


def test_gpu_index_flood_from_one_host_stays_bounded() -> None:
    """One node sending every index it can: the store keeps at most the per-host cap of GPU
    series, says so once with the number, and counts the rest."""
    store = Store(StoreLimits(points=16, gpus_per_host=64))
    dec = Decoder()
    for i in range(5000):
        line = json.dumps(_gpu(index=i, util_gpu=50.0, t=T + i * 0.001))
        rec = dec.decode(line)
        if rec is not None:
            store.ingest(rec, received=T)
    for dropped in dec.take_drops():
        store.ingest(dropped)
    assert len(store.hosts["n1"].gpus) == 64
    assert store.dropped("n1") == 5000 - 64
    assert store.drops["n1"]["drop:gpu.index"] == 5000 - (MAX_GPU_INDEX + 1)
    assert store.drops["n1"]["cap:gpus_per_host>64"] == MAX_GPU_INDEX + 1 - 64
    said = [n for n in store.notes if "64" in n and "n1" in n]
    assert len(said) == 1


def test_host_cap_refuses_new_hosts_and_counts_them() -> None:
    store = Store(StoreLimits(hosts=3))
    for i in range(10):
        store.ingest(GpuSample(host=f"h{i}", t=T, index=0, util_gpu=1.0), received=T)
    assert list(store.hosts) == ["h0", "h1", "h2"]
    assert sum(store.dropped(f"h{i}") for i in range(10)) + store.dropped("(other hosts)") == 7
    assert sum("at most 3 hosts" in n for n in store.notes) >= 1


def test_round_trip_of_valid_records_is_unchanged() -> None:
    rec = GpuSample(host="n1", t=T, index=3, util_gpu=99, mem_used_mib=1024, temp_c=-5.0)
    assert from_dict(json.loads(encode(rec))) == rec


def test_fast_depth_scan_agrees_with_the_reference_on_valid_json() -> None:
    import random

    from verl_top.untrusted import _depth_ok, _depth_ok_slow

    rng = random.Random(16)

    def value(depth: int) -> object:
        kind = rng.randrange(4 if depth < 12 else 2)
        if kind == 0:
            return "".join(rng.choice('[]{}"\\a\x1b') for _ in range(rng.randrange(6)))
        if kind == 1:
            return rng.random()
        if kind == 2:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {str(value(depth + 1)): value(depth + 1) for _ in range(rng.randrange(3))}

    for _ in range(3000):
        text = json.dumps(value(0))
        for limit in (1, 2, 4, 8):
            assert _depth_ok(text, limit) == _depth_ok_slow(text, limit), (text, limit)


def test_growing_ring_reads_like_a_bounded_deque() -> None:
    """Rings start small and double up to their capacity: every reader agrees with a plain
    bounded deque at every size (before, at and after each growth and the wrap)."""
    from collections import deque

    from verl_top.store import RING_START, Ring

    for capacity in (1, 5, RING_START, RING_START + 1, 50, 600):
        ring = Ring(("a",), capacity, labels=True)
        ref: deque[tuple[float, float, str]] = deque(maxlen=capacity)
        for n in range(1, 2 * capacity + 40):
            t = float(n)
            value = None if n % 7 == 0 else n * 0.5
            ring.push(t, {"a": value}, label=f"p{n}")
            ref.append((t, math.nan if value is None else value, f"p{n}"))
            since = ref[len(ref) // 2][0]
            times, values = ring.series("a", since)
            want = [(t, v) for t, v, _ in ref if t >= since]
            assert times == [t for t, _ in want]
            assert [v if v == v else None for v in values] == [
                v if v == v else None for _, v in want
            ]
            assert ring.recent_series("a", since)[0] == times
            assert ring.values("a", since) == ring.recent_values("a", since)
            assert ring.recent_labels(since) == [lab for t, _, lab in ref if t >= since]
            assert ring.last_time() == t and len(ring) == len(ref)
        assert len(ring.times) == capacity  # grown to its capacity, never past it


def test_a_flood_of_host_names_costs_little_per_host() -> None:
    import tracemalloc

    store = Store()
    tracemalloc.start()
    for i in range(1000):
        store.ingest(GpuSample(host=f"h{i}", t=T, index=0, util_gpu=1.0), received=T)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(store.hosts) == 1000
    assert peak < 20 * 2**20  # full-size rings took ~150 KB a host (150 MB here)


def test_refused_input_and_clock_offset_are_visible_on_host_row_and_node_screen() -> None:
    from verl_top.model import ClockOffset
    from verl_top.ui.node_screen import render_info
    from verl_top.ui.panes.throughput import build_host_cells

    store = Store(wall_clock=lambda: T)
    store.ingest(Hello(host="n1", t=T, backend="replay"), received=T)
    store.ingest(Dropped(host="n1", t=T, reason="drop:gpu.index", count=12))
    store.ingest(Dropped(host="n1", t=T, reason="field:gpu.util_gpu", count=3))
    store.ingest(ClockOffset(host="n1", t=T, offset=-3600.0, applied=True))
    h = store.hosts["n1"]
    row = build_host_cells(store, h, [], {})
    assert row[-1].plain.endswith("15 refused")
    info = render_info(store, h, {}).plain
    assert "refused input: 15 (drop:gpu.index ×12, field:gpu.util_gpu ×3)" in info
    assert "clock offset -3600.0 s (corrected)" in info
    assert store.input_health()["clock_offset_s"] == {"n1": -3600.0}


def test_property_any_wire_dict_decodes_or_is_refused_never_raises() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from verl_top.protocol import _specs

    names = sorted({s.name for cls in RECORD_TYPES.values() for s in _specs(cls)})
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
    )
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )
    records = st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(RECORD_TYPES)), "v": st.sampled_from([1, 1, 2, "1"])},
        optional={
            "host": st.one_of(st.text(max_size=20), scalars),
            "t": st.one_of(st.floats(0, 4e9), scalars),
        },
    ).flatmap(
        lambda base: st.dictionaries(st.sampled_from(names), values, max_size=8).map(
            lambda extra: {**extra, **base}
        )
    )

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(records)
    def check(data: dict) -> None:
        dec = Decoder()
        rec = dec.decode_dict(data)
        if rec is None:
            assert dec.malformed == 1
            return
        store = Store(StoreLimits(points=4))
        store.ingest(rec, received=T)
        encode(rec)
        for v in vars(rec).values():
            if isinstance(v, float):
                assert math.isfinite(v)
            if isinstance(v, str):
                assert is_clean(v)

    check()


def test_the_gpu_cap_says_how_to_raise_it_and_the_flag_raises_it() -> None:
    """A 16384-GPU cluster through Prometheus kept only 8192 GPUs with no way to keep more:
    the note names --max-gpus, the flag sets the cap (and the host cap along), and a bad
    value is refused with the range."""
    from verl_top.cli import app_parser
    from verl_top.inputs import InputError, build_inputs

    store = Store(StoreLimits(gpus=4))
    for i in range(6):
        store.ingest(GpuSample(host=f"h{i}", t=T, index=0, util_gpu=1.0), received=T)
    assert store.gpu_count() == 4
    assert [n for n in store.notes if "--max-gpus" in n and "at most 4 gpus" in n]
    store = build_inputs(app_parser().parse_args(["--demo", "--max-gpus", "16384"])).store
    assert store.limits.gpus == 16384 and store.limits.hosts >= 2048
    for bad in ("0", "1000000"):
        with pytest.raises(InputError, match="--max-gpus must be 1 to 65536"):
            build_inputs(app_parser().parse_args(["--demo", "--max-gpus", bad]))
