"""Store: bounded memory, latest values, host states, windows."""

from __future__ import annotations

import json
import math

from verl_top.model import GpuInfo, GpuSample, Hello, HostSample, HostState, VerlStep
from verl_top.store import Ring, Store, StoreLimits


def test_ring_keeps_only_the_newest_points() -> None:
    ring = Ring(("a",), capacity=4)
    for i in range(10):
        ring.push(float(i), {"a": i * 10})
    assert len(ring) == 4
    times, values = ring.series("a")
    assert times == [6.0, 7.0, 8.0, 9.0] and values == [60, 70, 80, 90]
    assert ring.values("a", since=8.0) == [80, 90]


def test_ring_stores_missing_as_nan_and_values_skips_them() -> None:
    ring = Ring(("a",), capacity=3)
    ring.push(1.0, {"a": None})
    ring.push(2.0, {"a": 5})
    assert math.isnan(ring.series("a")[1][0])
    assert ring.values("a") == [5]


def test_store_memory_is_flat_over_a_long_run() -> None:
    store = Store(StoreLimits(points=50, steps=10))
    for t in range(5000):
        for idx in range(2):
            store.ingest(GpuSample(host="h", t=float(t), index=idx, util_gpu=50.0))
        store.ingest(VerlStep(host="h", t=float(t), step=t))
    entry = store.hosts["h"].gpus[0]
    assert len(entry.history) == 50
    assert len(store.steps) == 10
    assert entry.history.capacity == 50


def test_activity_prefers_gpm_sm_util() -> None:
    store = Store()
    store.ingest(GpuSample(host="h", t=1.0, index=0, util_gpu=98.0, sm_util=13.0))
    store.ingest(GpuSample(host="h", t=2.0, index=1, util_gpu=40.0))
    gpus = list(store.iter_gpus())
    assert store.gpu_mean(gpus[0], "activity") == 13.0
    assert store.gpu_mean(gpus[1], "activity") == 40.0


def test_window_follows_data_time() -> None:
    store = Store(StoreLimits(window_s=10, points=100))
    for t in range(100):
        store.ingest(GpuSample(host="h", t=1000.0 + t, index=0, util_gpu=float(t)))
    entry = next(store.iter_gpus())
    assert store.now == 1099.0
    assert store.gpu_mean(entry, "util_gpu") == sum(range(89, 100)) / 11


def test_host_states_hello_down_and_stale() -> None:
    clock = [100.0]
    store = Store(wall_clock=lambda: clock[0])
    store.ingest(HostState(host="a", t=1.0, state="connecting"))
    assert store.hosts["a"].state == "connecting"
    store.ingest(Hello(host="a", t=1.0, gpus=[GpuInfo(index=0)]))
    assert store.hosts["a"].state == "up"
    store.ingest(Hello(host="b", t=1.0, error="no NVIDIA driver"), received=100.0)
    assert (store.hosts["b"].state, store.hosts["b"].reason) == ("no_gpu", "no NVIDIA driver")
    store.ingest(HostSample(host="a", t=2.0, cpu_pct=5.0), received=100.0)
    assert store.mark_stale(5.0, now_wall=103.0) == []
    assert store.mark_stale(5.0, now_wall=110.0) == ["a"]
    assert store.hosts["a"].state == "stale"
    store.ingest(HostSample(host="a", t=3.0, cpu_pct=5.0), received=111.0)
    assert store.hosts["a"].state == "up"
    store.ingest(HostState(host="a", t=4.0, state="down", reason="connection refused"))
    assert store.host_counts() == {"down": 1, "no_gpu": 1}


def test_a_slow_source_is_stale_after_three_of_its_intervals() -> None:
    """Prometheus rounds every 5 s (hello interval 5): not stale 7 s after the last round."""
    store = Store()
    store.ingest(Hello(host="p", t=1.0, gpus=[GpuInfo(index=0)], interval=5.0), received=100.0)
    assert store.mark_stale(5.0, now_wall=107.0) == []
    assert store.mark_stale(5.0, now_wall=116.0) == ["p"]


def test_repeated_step_number_replaces_previous() -> None:
    store = Store()
    store.ingest(VerlStep(host="h", t=1.0, step=1, metrics={"a": 1.0}))
    store.ingest(VerlStep(host="h", t=2.0, step=1, metrics={"a": 2.0}))
    assert [s.metrics["a"] for s in store.steps] == [2.0]


def test_source_status_notes_only_changes() -> None:
    from verl_top.model import SourceStatus

    store = Store()
    store.ingest(SourceStatus(host="prometheus:http://p:9090", t=1.0, state="up"))
    assert list(store.notes) == []  # a source that starts fine says nothing
    down = SourceStatus(host="prometheus:http://p:9090", t=2.0, state="down", reason="refused")
    store.ingest(down)
    store.ingest(down)
    store.ingest(SourceStatus(host="prometheus:http://p:9090", t=3.0, state="up"))
    assert list(store.notes) == [
        "prometheus:http://p:9090: down: refused",
        "prometheus:http://p:9090: up",
    ]


def test_a_ring_holds_one_object_per_distinct_label() -> None:
    # Decoded lines give every sample its own copy of its phase label; a full garbage
    # collection visits each label a ring holds (2.4 M at 4096 GPUs), and scattered copies
    # made it ~0.4 s. The ring keeps one object per distinct label, and the same labels.
    ring = Ring(("activity",), capacity=8, labels=True)
    for i in range(10):
        ring.push(float(i), {"activity": 1.0}, json.loads('"rollout"' if i % 2 else '"train"'))
    labels = ring.recent_labels()
    assert labels == ["train", "rollout"] * 4
    assert len({id(s) for s in labels}) == 2
    ring.push(10.0, {"activity": 1.0})
    assert ring.recent_labels()[-1] == ""
