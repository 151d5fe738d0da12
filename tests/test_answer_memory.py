"""Large Prometheus and Ray answers cost what is kept, not their size (issue 31).

A 63 MiB Prometheus range answer took 1.4 GB to parse (2.5 GB after the start-up regrouping),
80 000 timestamps made the regrouping take 17.6 s and 1 GB, and a 60 MiB Ray reply took 1.5 GB:
the bodies were decoded whole. Each answer here is served by a local HTTP server and read by
the real client in a child process, whose peak RSS before and after the read is compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rawserver import BodyServer, constant

from verl_top.model import GpuSample, Hello
from verl_top.sources.prometheus import (
    HISTORY_SAMPLES,
    HistoryGrid,
    PrometheusSource,
    PromSettings,
    history_records,
)

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


# Read in a child process, free of this test process's own history and of tracemalloc's 5x
# slowdown. Linux's peak RSS (VmHWM) is reset just before the read (``clear_refs`` 5), so the
# peak after it, less the RSS before it, is what the read took at its worst.
READER = """
import asyncio, json, sys
from verl_top.sources.prometheus import PromClient
from verl_top.sources.ray import Dashboard, fetch_view
kind, url = sys.argv[1], sys.argv[2]
async def read():
    if kind == "prom":
        client = PromClient(url, 60.0)
        try:
            series = await client.query_range("x", 0.0, 1.0, 5.0)
        finally:
            await client.close()
        first = series[0].points[:2]
        return {"kept": sum(len(s.times) for s in series), "first": first}
    dash = Dashboard(url, deadline=60.0)
    try:
        view = await fetch_view(dash, detail=True)
    finally:
        await dash.close()
    return {"kept": len(view.actors), "first": view.actors[0]}
def status(field):
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the peak RSS starts again from the RSS now
before = status("VmRSS")
out = asyncio.run(read())
out["grew_mib"] = (status("VmHWM") - before) / 1024
print(json.dumps(out))
"""


def read_in_child(kind: str, url: str) -> dict[str, Any]:
    """What the child read, and by how many MiB its peak RSS grew while reading."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", READER, kind, url], env=env, capture_output=True, text=True,
        timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def matrix(series: int, points: int, t0: float = 1.7e9, step: float = 5.0) -> bytes:
    """A Prometheus range answer as its encoder writes it (values as strings)."""
    values = ",".join(f'[{t0 + k * step:.3f},"{40 + k % 7}.25"]' for k in range(points))
    rows = ",".join(
        f'{{"metric":{{"Hostname":"node-{i // 8:04d}","gpu":"{i % 8}"}},"values":[{values}]}}'
        for i in range(series)
    )
    return f'{{"status":"success","data":{{"resultType":"matrix","result":[{rows}]}}}}'.encode()


@pytest.fixture(scope="module")
def big_matrix() -> Iterator[tuple[BodyServer, int]]:
    body = matrix(series=800, points=1100)  # ~21 MiB, 880 000 points
    srv = BodyServer(constant(body))
    yield srv, len(body)
    srv.close()


def test_a_20_mib_range_answer_is_read_in_bounded_memory(big_matrix) -> None:
    """Decoded whole, this answer took ~450 MB (the old client's ~22x its size)."""
    srv, size = big_matrix
    assert size > 20 * MIB
    out = read_in_child("prom", srv.url)
    # Every point kept as 16 bytes (14 MB); no point lives on as a decoded [t, "v"] list.
    assert out["kept"] == 800 * 1100
    assert out["first"] == [[1.7e9, 40.25], [1.7e9 + 5.0, 41.25]]
    assert out["grew_mib"] < 60, f"{out['grew_mib']:.0f} MiB to read a {size / MIB:.0f} MiB answer"


def test_an_answer_keeps_at_most_its_point_budget() -> None:
    from verl_top.sources.prometheus import LabelCleaner, SeriesReader, parse_answer

    body = matrix(series=3, points=600)
    reader = SeriesReader(LabelCleaner(), budget=1000)
    from verl_top.sources.prometheus import _stream

    stream = _stream(reader)
    stream.feed(body.decode())
    kept = [len(s.times) for s in stream.finish()["data"]["result"]]
    assert kept == [600, 400, 0] and reader.cut == 800
    assert len(parse_answer(body, "x")) == 3  # the default budget (2 000 000) keeps all


def test_history_regroups_a_hostile_range_answer_on_its_grid_in_bounded_time() -> None:
    """80 000 timestamps in a series, 5 ms apart where the grid's step is 5 s: the series keeps
    Prometheus' own 11 000 points, the regrouping walks the grid (61 points), not the
    timestamps, keeps only those on it, and stops at its deadline."""
    from verl_top.sources.prometheus import LabelCleaner, SeriesReader

    source = PrometheusSource(PromSettings(url="http://p:9090", interval=5.0))
    reader = SeriesReader(LabelCleaner())
    t0 = 1.7e9
    row = {
        "metric": {"Hostname": "n1", "gpu": "0"},
        "values": [[t0 + j * 0.005, "1"] for j in range(80_000)],
    }
    series = [reader(row)]
    assert len(series[0].times) == 11_000 and reader.cut == 69_000
    grid = HistoryGrid(t0, 5.0, 61)
    answers = {"_info": series, "temp_c": series}
    started = time.monotonic()
    history = history_records(source, answers, grid)
    took = time.monotonic() - started
    samples = [r for r in history.records if isinstance(r, GpuSample)]
    # On the grid: t0 + 0.005 j = t0 + 5 k for j = 1000 k, and j < 11 000 was kept: k = 0..10.
    assert [s.t for s in samples] == [t0 + 5.0 * k for k in range(11)]
    assert all(s.temp_c == 1.0 for s in samples) and isinstance(history.records[0], Hello)
    assert took < 5.0  # was 17.6 s for 80 000 timestamps
    late = history_records(source, answers, grid, until=time.monotonic() - 1.0)
    assert late.late and late.records == []


def test_history_asks_for_fewer_points_per_gpu_on_a_huge_cluster() -> None:
    gpus = 8192
    points = max(1, min(61, HISTORY_SAMPLES // gpus))
    assert points * gpus <= HISTORY_SAMPLES and points == 14


def test_a_20_mib_ray_reply_costs_what_is_kept() -> None:
    """Decoded whole, a reply like this one took ~25x its size (60 MiB: 1.5 GB)."""
    detail = {"death_cause": None, "placement_group_id": "pg" * 8, "repr_name": "", "x" * 20: 1}
    rows = [
        {
            "actor_id": f"{i:032x}",
            "class_name": "WorkerDict",
            "state": "ALIVE",
            "name": f"abcWorkerDict_0:{i}",
            "node_id": "n" * 56,
            "pid": 1000 + i,
            "job_id": "01000000",
            "required_resources": {"GPU": 1.0, "CPU": 1.0, "pad": "p" * 1500},
            **detail,
        }
        for i in range(10_000)
    ]
    nodes = {"result": True, "msg": "", "data": {"result": {"total": 1, "result": [
        {"node_id": "n" * 56, "node_ip": "127.0.0.1", "state": "ALIVE", "is_head_node": True}
    ]}}}  # fmt: skip
    actors = {"result": True, "msg": "", "data": {"result": {"total": 10000, "result": rows}}}
    body_actors, body_nodes = json.dumps(actors).encode(), json.dumps(nodes).encode()
    assert len(body_actors) > 18 * MIB

    def answer(path: str) -> tuple[bytes, bool]:
        if path.startswith("/nodes"):
            return b'{"result": true, "data": {"summary": []}}', False
        return (body_actors if path.startswith("/api/v0/actors") else body_nodes), False

    server = BodyServer(answer)
    del rows, actors
    try:
        out = read_in_child("ray", server.url)
    finally:
        server.close()
    assert out["kept"] == 10_000
    assert set(out["first"]) == {
        "actor_id", "class_name", "state", "name", "node_id", "pid", "job_id", "required_resources"
    }  # fmt: skip
    assert out["first"]["required_resources"] == {"GPU": 1.0}
    grew = out["grew_mib"]
    assert grew < 60, f"{grew:.0f} MiB for a {len(body_actors) / MIB:.0f} MiB reply"
