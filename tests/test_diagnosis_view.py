"""The fast reads the diagnosis relies on give exactly what the plain reads give.

``Ring.recent_*`` bisect and slice in C, ``View`` memoises windows and paints stage bands over a
GPU's points, and ``node_waits`` counts the busy nodes per second: each is checked here
against the straightforward definition, including the cases that defeat the shortcuts (times
that step back, NaN, rings that wrap, bands that overlap).
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from verl_top.diagnosis.step2_comm import NodeWait, node_waits
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View, label_phase
from verl_top.model import GpuSample, HostSample, VerlStep
from verl_top.store import Ring, Store, StoreLimits
from verl_top.verl.stages import stage_bands

NAN = float("nan")
LABELS = ("gen", "train", "update_actor", "")

point = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, -3.0, NAN]),  # time step from the previous point
    st.sampled_from([1.0, 2.5, 90.0, NAN]),
    st.sampled_from(LABELS),
)


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(1, 9),
    points=st.lists(point, max_size=25),
    since=st.one_of(st.none(), st.floats(-5, 40)),
)
def test_recent_reads_equal_plain_reads(capacity: int, points: list, since: float | None) -> None:
    ring = Ring(("a",), capacity, labels=True)
    t = 0.0
    for dt, v, label in points:
        t = t + dt if not math.isnan(dt) else NAN
        ring.push(t, {"a": v}, label)
        if math.isnan(t):
            t = 0.0
    ts, vs = ring.series("a", since)
    rts, rvs = ring.recent_series("a", since)
    assert _same(ts, rts) and _same(vs, rvs)
    assert _same(vs, ring.recent_column("a", since))
    assert ring.recent_labels(since) == ring.label_series(since)[1]
    if ring.ascending():
        held = ring.series("a")[0]
        assert all(x <= y for x, y in zip(held, held[1:], strict=False))


def test_ascending_recovers_once_a_step_back_leaves_the_ring() -> None:
    ring = Ring(("a",), 3)
    for t in (1.0, 2.0, 1.5):
        ring.push(t, {"a": t})
    assert not ring.ascending()
    for t in (3.0, 4.0):
        ring.push(t, {"a": t})
    assert not ring.ascending()  # 1.5 still held
    ring.push(5.0, {"a": 5.0})
    assert ring.ascending()


def _store(
    steps: list[tuple[float, dict[str, float]]], samples: list[tuple[float, float, str]]
) -> Store:
    store = Store(StoreLimits(points=64))
    for t, act, label in samples:
        store.ingest(GpuSample(host="n0", t=t, index=0, util_gpu=act, sm_util=act, label=label))
    for n, (t, metrics) in enumerate(steps, 1):
        store.ingest(VerlStep(host="n0", t=t, step=n, metrics=metrics))
    return store


def _linear_phase(view: View, t: float, label: str) -> str | None:
    for start, end, name in view.stage_bands():
        if start <= t < end:
            return name
    return label_phase(label)


STEP = {
    "timing_s/gen": 6.0,
    "timing_s/ref": 1.0,
    "timing_s/update_actor": 3.0,
    "timing_s/step": 10.5,
}


def test_phases_match_a_linear_scan_with_sorted_and_overlapping_bands() -> None:
    samples = [(100.0 + 0.7 * i, float(i % 100), LABELS[i % 4]) for i in range(60)]
    sorted_steps = [(110.0, STEP), (121.0, STEP), (132.0, STEP)]
    # A step logged late reaches back over earlier ones: its bands overlap theirs.
    overlapping = [*sorted_steps, (118.0, {**STEP, "timing_s/gen": 15.0, "timing_s/step": 20.0})]
    for steps in (sorted_steps, overlapping, []):
        view = View(_store(steps, samples), Thresholds(window_s=30))
        gpu = view.gpus()[0]
        since = view.phase_since()
        ts, vs = gpu.history.series("util_gpu", since)
        labels = gpu.history.label_series(since)[1]
        for keep in (lambda p: p == "gen", lambda p: p != "gen", lambda p: p in ("ref", None)):
            want = [
                v
                for t, v, lab in zip(ts, vs, labels, strict=True)
                if keep(_linear_phase(view, t, lab))
            ]
            assert view.gpu_phase_points(gpu, "util_gpu", keep) == want
        for t in (*ts, 99.0, 131.99, 132.0, NAN):
            assert view.phase_at(t, "train") == _linear_phase(view, t, "train")


def test_view_phase_bands_agree_with_the_catalogue_where_both_apply() -> None:
    # Steps back to back, `step` = the sum of the stages: walking forward from t - step (view)
    # and back from t (catalogue) give the same bands.
    steps = [(110.0, STEP | {"timing_s/step": 10.0}), (120.0, STEP | {"timing_s/step": 10.0})]
    view = View(_store(steps, [(100.0, 50.0, "")]), Thresholds())
    assert view.stage_bands() == stage_bands(
        [VerlStep(host="n0", t=t, step=n, metrics=m) for n, (t, m) in enumerate(steps, 1)]
    )


def _naive_node_waits(view: View, th: Thresholds) -> dict[str, NodeWait]:
    buckets: dict[str, dict[int, list[float]]] = {}
    for h in view.hosts():
        for g in h.gpus.values():
            for t, v in view.gpu_points(g, "activity"):
                buckets.setdefault(h.name, {}).setdefault(int(t), []).append(v)
    if len(buckets) < 2:
        return {}
    times = sorted({t for b in buckets.values() for t in b})
    out = {}
    for host, mine in buckets.items():
        waiting = []
        for t in times:
            vals = mine.get(t)
            if not vals or max(vals) >= th.sync_wait_idle_pct:
                continue
            others = [sum(o[t]) / len(o[t]) for h2, o in buckets.items() if h2 != host and t in o]
            if others and max(others) > th.sync_wait_busy_pct:
                waiting.append(t)
        episodes = sum(1 for i, t in enumerate(waiting) if i == 0 or t - waiting[i - 1] > 2)
        out[host] = NodeWait(host, len(waiting), len(mine), episodes)
    return out


def test_node_waits_equal_the_pairwise_definition() -> None:
    store = Store(StoreLimits(points=128))
    for s in range(100):
        for h in range(4):
            for gpu in range(3):
                # node 1 idles every 3rd second while the others work; node 3 samples at two
                # moments per second on GPU 2 and misses GPU 1's value now and then.
                idle = h == 1 and s % 3 == 0
                act = 2.0 if idle else 60.0 + 10 * h + gpu
                act = NAN if (h == 3 and gpu == 1 and s % 7 == 0) else act
                t = 1000.0 + s + 0.1 * h
                store.ingest(GpuSample(host=f"n{h}", t=t, index=gpu, util_gpu=act))
                if h == 3 and gpu == 2:
                    store.ingest(GpuSample(host=f"n{h}", t=t + 0.5, index=gpu, util_gpu=act))
    th = Thresholds()
    view = View(store, th)
    got = node_waits(view, th)
    assert got == _naive_node_waits(view, th)
    assert got["n1"].waiting > 10 and got["n0"].waiting == 0
    # Thresholds where the busiest node itself counts as idle: it must not be its own "other".
    th = Thresholds(sync_wait_idle_pct=95, sync_wait_busy_pct=85)
    got = node_waits(View(store, th), th)
    assert got == _naive_node_waits(View(store, th), th) and got["n3"].waiting == 0


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _same_number(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


gpu_point = st.tuples(
    st.sampled_from([0.5, 1.0, 1.0, 1.0, 2.0, -3.0]),  # time step from the previous point
    st.sampled_from([0.0, 3.0, 55.5, 90.0, 97.25, NAN]),  # NVML util
    st.sampled_from([None, None, 1.0, 40.0, NAN]),  # GPM SM util (the activity when present)
    st.sampled_from([0, 0, 8, 1 << 3 | 1 << 5, None]),  # clock-event reasons
    st.sampled_from(LABELS),
)


@settings(max_examples=150, deadline=None)
@given(
    hosts=st.lists(st.lists(st.lists(gpu_point, max_size=30), min_size=1, max_size=3), max_size=3),
    same_axis=st.booleans(),
    steps=st.booleans(),
)
def test_window_fast_paths_equal_their_plain_definitions(
    hosts: list[list[list[tuple]]], same_axis: bool, steps: bool
) -> None:
    """The view's summed and shared readings (means over C arrays, spans shared by filter
    and by host, window starts found once) give what the plain list readings give, with
    missing values, times that step back, and GPUs of a host on one time axis or not."""
    store = Store(StoreLimits(points=24))  # rings wrap: windows cross the wrap point
    for h, gpus in enumerate(hosts):
        for index, points in enumerate(gpus):
            t = 1000.0 + (0 if same_axis else 0.3 * index)
            for j, (dt, util, sm, reasons, label) in enumerate(gpus[0] if same_axis else points):
                # Odd GPUs label some points otherwise: same times, other phases inside.
                if index % 2 and j % 3 == 1:
                    label = LABELS[LABELS.index(label) - 1]
                t += dt
                if index == 0:  # the host's own CPU and iowait, on the first GPU's tick
                    store.ingest(HostSample(host=f"n{h}", t=t, cpu_pct=util, iowait_pct=sm))
                store.ingest(
                    GpuSample(
                        host=f"n{h}",
                        t=t,
                        index=index,
                        util_gpu=util if index % 2 == 0 else util / 2,
                        sm_util=sm,
                        clock_reasons=reasons,
                        label=label,
                    )
                )
    if steps and store.now:
        for n, at in enumerate((store.now - 12.0, store.now - 1.5), 1):
            store.ingest(VerlStep(host="n0", t=at, step=n, metrics=STEP))
    th = Thresholds(window_s=15)
    view, plain = View(store, th), View(store, th)
    every = list(store.iter_gpus())
    assert view.gpus() == [g for g in every if plain.gpu_values(g, "activity")]
    assert view.has_column("sm_util") == any(plain.gpu_values(g, "sm_util") for g in every)
    filters = (lambda p: p == "gen", lambda p: p != "gen", {"ref", None}.__contains__)
    for g in every:
        for column in ("activity", "util_gpu", "sm_util", "throttled"):
            assert _same_number(view.gpu_mean(g, column), _mean(plain.gpu_values(g, column)))
            for keep in filters:
                want = plain.gpu_phase_points(g, column, keep)
                assert _same_number(view.gpu_phase_mean(g, column, keep), _mean(want))
                since = plain.phase_since()
                ts, vs = g.history.series(column, since)
                labels = g.history.label_series(since)[1]
                linear = [
                    v
                    for t, v, lab in zip(ts, vs, labels, strict=True)
                    if keep(_linear_phase(plain, t, lab)) and v == v
                ]
                assert want == linear
        assert view.gpu_distinct(g, "clock_reasons") == set(plain.gpu_values(g, "clock_reasons"))
    for host in store.hosts.values():
        for column in ("cpu_pct", "iowait_pct"):
            want = _mean([v for _, v in plain.host_values(host, column)])
            assert _same_number(view.host_mean(host, column), want)
    for idle, busy in ((10.0, 50.0), (95.0, 85.0)):
        th2 = Thresholds(window_s=15, sync_wait_idle_pct=idle, sync_wait_busy_pct=busy)
        assert node_waits(View(store, th2), th2) == _naive_node_waits(View(store, th2), th2)
