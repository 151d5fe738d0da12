"""The Prometheus source against a real Prometheus scraping the real DCGM / vLLM fixtures.

Expected values are read off the fixture files (tests/fixtures/prometheus/) by hand, before
running: H100 node ip-10-0-171-111.ec2.internal (8 GPUs; GPU 0 at 30 C, 113.611 W, pod
dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5; no FB series in that excerpt), A800 node
msxf-hpc-64-35-ai (8 GPUs; GPU 0 in MIG with 3 instances of 10 MiB used / 19957 MiB free and
power 78.174, 78.174, 78.446 W; GPU 1: 2 MiB used, 81226 free, 55.942 W, 27 C, PCIe TX
143341 B/s; all PROF ratios 0), vLLM opt-125m (0 running, 0 waiting, KV cache 0, TTFT
p50 0.375 s from the cumulative buckets: its one request fell in (0.25, 0.5]).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from verl_top.model import GpuSample, Hello, HostState, RolloutSample, SourceStatus
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.prometheus import (
    EMIT_SLICE,
    PromClient,
    PromError,
    PrometheusSource,
    PromSettings,
    _emit_in_slices,
    parse_selector,
)
from verl_top.store import Store

H100 = "ip-10-0-171-111.ec2.internal"
A800 = "msxf-hpc-64-35-ai"


def settings(url: str, **kw) -> PromSettings:
    base = {"selector": 'job="dcgm"', "rollout_selector": 'job="vllm"', "interval": 1.0}
    base.update(kw)
    return PromSettings(url=url, **base)


def closing(source: PrometheusSource, step, emit=None) -> list:
    """``step(emit)`` run on its own loop, the client's connections closed after; the records
    (when no ``emit`` is given)."""
    out: list = []

    async def go() -> None:
        try:
            await step(emit or out.append)
        finally:
            await source.client.close()

    asyncio.run(go())
    return out


def one_round(source: PrometheusSource) -> list:
    return closing(source, source.poll)


def test_round_maps_real_dcgm_series_to_hosts_and_gpus(prom_cluster: dict) -> None:
    source = PrometheusSource(settings(prom_cluster["server"].url))
    records = one_round(source)
    hellos = {r.host: r for r in records if isinstance(r, Hello)}
    assert set(hellos) == {H100, A800}
    assert [g.index for g in hellos[H100].gpus] == list(range(8))
    assert hellos[H100].gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert hellos[H100].gpus[0].uuid == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    assert hellos[H100].driver == "580.105.08"
    assert hellos[A800].gpus[1].mem_total_mib == 2 + 81226
    assert hellos[H100].gpus[0].workload == "dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5"
    assert hellos[H100].gpus[1].workload is None  # no pod label on GPUs 1-7
    # PROF counters (tensor/DRAM) on the A800, none in the H100 excerpt.
    assert hellos[A800].gpus[1].gpm and not hellos[H100].gpus[0].gpm
    gpus = {(r.host, r.index): r for r in records if isinstance(r, GpuSample)}
    assert len(gpus) == 16
    h0 = gpus[(H100, 0)]
    assert (h0.temp_c, h0.power_w, h0.util_gpu) == (30, pytest.approx(113.611), 0)
    # The excerpt has no FB, SM, tensor or DRAM series: no data, never 0.
    assert h0.mem_used_mib is None and h0.sm_util is None and h0.tensor_util is None
    a0, a1 = gpus[(A800, 0)], gpus[(A800, 1)]
    assert a0.mem_used_mib == 30 and a0.mem_total_mib == 30 + 3 * 19957  # MIG instances summed
    assert a0.power_w == pytest.approx((78.174 + 78.174 + 78.446) / 3)  # repeated per instance
    assert a0.util_gpu == 0  # MIG: no GPU_UTIL; GR_ENGINE_ACTIVE (0) stands in
    assert (a1.mem_used_mib, a1.power_w, a1.temp_c) == (2, pytest.approx(55.942), 27)
    assert a1.pcie_tx_mibs == pytest.approx(143341 / 2**20)
    assert a1.tensor_util == 0 and a1.dram_util == 0  # real zeros stay zeros
    assert a1.sm_util is None  # SM_ACTIVE is not in the default field list
    # info + 19 DCGM + rollout info + 11 rollout; node_exporter: info + 12 + its scrape interval
    assert source.queries_last == 2 + 19 + 11 + 1 + 12 + 1
    status = [r for r in records if isinstance(r, SourceStatus)]
    assert status and status[0].state == "up"


def test_rollout_server_from_real_vllm_metrics(prom_cluster: dict) -> None:
    records = one_round(PrometheusSource(settings(prom_cluster["server"].url)))
    rollout = [r for r in records if isinstance(r, RolloutSample)]
    assert len(rollout) == 1
    r = rollout[0]
    assert r.server == "vllm" and r.model == "facebook/opt-125m"
    assert r.host == prom_cluster["ends"]["vllm"].target
    assert (r.running, r.waiting, r.kv_cache_pct) == (0, 0, 0)
    assert r.ttft_p50_s == pytest.approx(0.375)
    assert r.gen_tokens_s in (0.0, None)  # static counter: 0/s once two scrapes exist


def test_store_fills_like_the_ssh_source(prom_cluster: dict) -> None:
    store = Store()
    pipeline = Pipeline(store, parsers={})
    source = PrometheusSource(settings(prom_cluster["server"].url))
    closing(source, source.poll, pipeline.emit)
    assert store.hosts[H100].state == "up" and store.hosts[A800].state == "up"
    assert store.gpu_count() == 16
    assert store.hosts[H100].gpus[0].latest.temp_c == 30
    assert len(store.rollout) == 1
    assert not any(name.startswith("127.") for name in store.hosts)  # rollout is not a host


def test_history_fills_the_window_at_start(prom_cluster: dict) -> None:
    server = prom_cluster["server"]
    server.wait_for(f'count_over_time(DCGM_FI_DEV_GPU_TEMP{{Hostname="{A800}",gpu="1"}}[10s]) >= 4')
    source = PrometheusSource(settings(server.url, history_s=10.0))
    out = closing(source, source._history)
    samples = [r for r in out if isinstance(r, GpuSample) and r.host == A800 and r.index == 1]
    assert len(samples) >= 3, [(type(r).__name__, r.host, r.t) for r in out][:40]
    assert all(s.temp_c == 27 for s in samples)
    times = [s.t for s in samples]
    assert times == sorted(times) and times[-1] - times[0] >= 2.0
    assert isinstance(out[0], Hello)  # hellos before samples: GPUs exist when samples land


def test_selector_limits_the_hosts(prom_cluster: dict) -> None:
    source = PrometheusSource(settings(prom_cluster["server"].url, selector='job="dcgm-busy"'))
    hosts = {r.host for r in one_round(source) if isinstance(r, Hello)}
    assert hosts == {f"busy-{H100}"}


def test_a_selector_matching_nothing_is_said(prom_cluster: dict) -> None:
    source = PrometheusSource(settings(prom_cluster["server"].url, selector='job="nope"'))
    records = one_round(source)
    assert not [r for r in records if isinstance(r, Hello)]
    status = [r for r in records if isinstance(r, SourceStatus)][0]
    assert status.state == "up" and 'no DCGM GPU series match {job="nope"}' in status.reason


def test_dead_prometheus_is_a_clear_state_not_a_hang() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.92", 0))
        port = s.getsockname()[1]  # closed again: connection refused
    source = PrometheusSource(settings(f"http://127.0.0.92:{port}"))
    source._known.hellos["node1"] = ()  # a host it fed before
    t0 = time.monotonic()
    records = one_round(source)
    assert time.monotonic() - t0 < 2.0
    status = [r for r in records if isinstance(r, SourceStatus)]
    assert status[0].state == "down" and "connection refused" in status[0].reason
    states = [r for r in records if isinstance(r, HostState)]
    assert states and states[0].host == "node1" and states[0].state == "stale"


def test_silent_prometheus_ends_within_the_budget() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.92", 0))
    listener.listen(64)  # accepts connections (kernel backlog), never answers
    try:
        port = listener.getsockname()[1]
        source = PrometheusSource(
            settings(f"http://127.0.0.92:{port}", budget=1.0, request_timeout=0.5)
        )
        t0 = time.monotonic()
        records = one_round(source)
        assert time.monotonic() - t0 < 2.0
        status = [r for r in records if isinstance(r, SourceStatus)][0]
        assert status.state in ("down", "slow") and "0.5 s" in status.reason
    finally:
        listener.close()


def test_not_prometheus_is_named() -> None:
    from promserver import Exposition

    end = Exposition("hello\n")  # an HTTP server that is not Prometheus (404 on the API)
    try:

        async def ask() -> None:
            client = PromClient(f"http://{end.target}")
            try:
                await client.query("up", time.time())
            finally:
                await client.close()

        with pytest.raises(PromError, match="404|not Prometheus|JSON"):
            asyncio.run(ask())
    finally:
        end.stop()


def test_selector_and_url_validation() -> None:
    assert parse_selector('{job="dcgm", namespace=~"gpu.*"}') == 'job="dcgm",namespace=~"gpu.*"'
    for bad in ("job=dcgm", 'job="x"}; drop', '"x"="y"'):
        with pytest.raises(ValueError, match="--prom-selector"):
            parse_selector(bad)
    with pytest.raises(ValueError, match="--prometheus"):
        PromSettings(url="ftp://x")
    assert PromSettings(url="127.0.0.1:9090").url == "http://127.0.0.1:9090"


def test_hostile_answers_are_bounded_and_cleaned() -> None:
    from verl_top.sources.prometheus import parse_answer

    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"Hostname": "evil\x1b]0;pwned\x07host", "gpu": "0"},
                    "value": [1.0, "NaN"],
                },
                {"metric": {"Hostname": "n", "gpu": "1"}, "value": [1.0, "+Inf"]},
                {"metric": {"Hostname": "n", "gpu": "2"}, "value": [1.0, "9223372036854775794"]},
                {"metric": {"Hostname": "n", "gpu": "3"}, "value": [1.0, "140737488355328"]},
                {"metric": {"Hostname": "n", "gpu": "4"}, "value": [1.0, "12.5"]},
                {"metric": {"Hostname": "n", "gpu": "5"}, "value": [1.0, 12.5]},  # not a string
                {"metric": "not a dict", "value": [1.0, "1"]},
            ],
        },
    }
    series = parse_answer(json.dumps(doc).encode(), "x")
    assert series[0].labels["Hostname"] == "evilhost"  # the OSC title sequence is gone
    assert [s.points[0][1] for s in series] == [None, None, None, None, 12.5, None]
    deep = b'{"status":"success","data":' + b"[" * 200 + b"]" * 200 + b"}"
    with pytest.raises(PromError, match="not with Prometheus JSON"):
        parse_answer(deep, "x")
    with pytest.raises(PromError, match="bad_data: parse error"):
        parse_answer(b'{"status":"error","errorType":"bad_data","error":"parse error"}', "x")


def test_diagnose_names_a_dead_prometheus(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.92", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "diagnose", "--prometheus", f"127.0.0.92:{port}",
         "--duration", "1"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 3  # EXIT_NO_DATA: nothing could be judged, and why is said
    assert out.stdout.startswith("no data: ") and "cannot reach Prometheus" in out.stdout
    assert f"cannot reach Prometheus at http://127.0.0.92:{port}: connection refused" in out.stderr


def test_a_new_xid_is_one_event_shown_in_pane_2() -> None:
    from verl_top.model import LogEvent
    from verl_top.ui.panes.communication import events_block

    source = PrometheusSource(settings("http://127.0.0.92:1"))
    key = ("node1", 3)
    assert source._xid_events({key: 0.0}, 1.0) == []  # 0 = no XID
    first = source._xid_events({key: 79.0}, 2.0)
    assert source._xid_events({key: 79.0}, 3.0) == []  # the same last XID: said once
    assert [e.text for e in first] == [
        "GPU 3: XID 79 (GPU has fallen off the bus), from DCGM_FI_DEV_XID_ERRORS"
    ]
    store = Store()
    store.ingest(first[0])
    assert isinstance(first[0], LogEvent) and first[0].severity >= 0.7
    assert "XID 79" in events_block(store).plain


def test_sglang_server_and_its_queue(prom_cluster: dict) -> None:
    """SGLang's documented sample: 162 running, 2826 queued, token usage 0.28. By hand: TTFT
    and e2e p50 fall in the +Inf bucket (ranks 5504 > 2513 and 5614 > 1513), so Prometheus
    answers the highest finite bound, 30 s and 60 s; TPOT p50 = 0.075 + 0.025 x
    (3700378.5 - 433413) / (4950195 - 433413) = 0.0931 s (the older metric name)."""
    from verl_top.diagnosis.engine import Engine

    store = Store()
    pipeline = Pipeline(store, parsers={})
    source = PrometheusSource(settings(prom_cluster["server"].url, rollout_selector='job="sglang"'))
    closing(source, source.poll, pipeline.emit)
    (entry,) = store.rollout.values()
    r = entry.latest
    assert (r.server, r.model) == ("sglang", "meta-llama/Llama-3.1-8B-Instruct")
    assert (r.running, r.waiting, r.kv_cache_pct) == (162, 2826, pytest.approx(28))
    assert (r.ttft_p50_s, r.e2e_p50_s) == (30, 60)
    assert r.tpot_p50_s == pytest.approx(0.0931, abs=1e-4)
    verdict = Engine().evaluate(store)
    queue = next(f for f in verdict.findings if f.rule == "flow.rollout_queue")
    assert "2826 waiting vs 162 running" in queue.title
    assert "max_num_seqs" in queue.advice  # KV cache 28 %: slots, not memory, are the limit


def test_prometheus_numbers_get_the_protocol_ranges_and_plain_digits() -> None:
    """Issue 31: util 100 000 %, 1000 C, '1_000' and Arabic-Indic GPU indices passed."""
    from verl_top.sources.prometheus import gpu_sample, gpu_values, parse_answer

    def answer(rows: list[tuple[dict, str]]) -> bytes:
        result = [{"metric": m, "value": [1.0, v]} for m, v in rows]
        return json.dumps({"status": "success", "data": {"result": result}}).encode()

    util = parse_answer(
        answer(
            [
                ({"Hostname": "n1", "gpu": "0"}, "100000"),
                ({"Hostname": "n1", "gpu": "1"}, "1_000"),
                ({"Hostname": "n1", "gpu": "2"}, "٣٣"),  # Arabic-Indic digits as a value
                ({"Hostname": "n1", "gpu": "٣"}, "50"),  # ... and as a GPU index
                ({"Hostname": "n1", "gpu": "3"}, "55.5"),
            ]
        ),
        "x",
    )
    temp = parse_answer(answer([({"Hostname": "n1", "gpu": "3"}, "1000")]), "x")
    values = gpu_values({"util_gpu": util, "temp_c": temp})
    assert values["util_gpu"] == {("n1", 0): 100000.0, ("n1", 1): None, ("n1", 2): None,
                                  ("n1", 3): 55.5}  # fmt: skip
    assert gpu_sample("n1", 0, 1.0, values).util_gpu is None  # over 100 %: no data
    assert gpu_sample("n1", 3, 1.0, values).util_gpu == 55.5
    assert gpu_sample("n1", 3, 1.0, values).temp_c is None  # 1000 C: no data


def test_a_large_round_is_emitted_in_order_with_turns_of_the_event_loop_between_slices() -> None:
    # 16384 GPUs through Prometheus: a round's records ingested in one go held every frame
    # for over a second; between slices the screen and key presses get their turn.
    records = list(range(3 * EMIT_SLICE + 5))
    emitted: list[int] = []
    seen: list[int] = []

    async def other_work() -> None:  # a frame or a key press waiting for the loop
        while True:
            seen.append(len(emitted))
            await asyncio.sleep(0)

    async def main() -> None:
        task = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        await _emit_in_slices(emitted.append, records)  # type: ignore[arg-type]
        task.cancel()

    asyncio.run(main())
    assert emitted == records  # every record, in order
    assert {n for n in seen if 0 < n < len(records)} == {EMIT_SLICE, 2 * EMIT_SLICE, 3 * EMIT_SLICE}


def test_the_gpu_key_memo_answers_as_gpu_of_and_stays_bounded() -> None:
    """GpuKeys reads the four labels gpu_of reads: whatever the other labels hold, each label
    set gets gpu_of's key, the first time and from the memo; the memo never outgrows its
    capacity."""
    import itertools

    from verl_top.sources.prometheus import GpuKeys, gpu_of

    keys = GpuKeys(capacity=50)
    choices = {
        "gpu": [None, "0", "3", "\u0663", "1_0", "99999"],
        "Hostname": [None, "", "n1", "\x1b[31mn2"],
        "hostname": [None, "n3", " n4 "],
        "instance": [None, "n1:9400", "[::1]:9400", "a:b:c", "10.0.0.1:9400", "n\u200b5"],
    }
    label_sets = []
    for n, combo in enumerate(itertools.product(*choices.values())):
        labels = {k: v for k, v in zip(choices, combo, strict=True) if v is not None}
        labels["UUID"] = f"GPU-{n}"  # not read for the key
        label_sets.append(labels)
    for labels in label_sets * 2:  # every set twice: once computed, once (maybe) remembered
        assert keys(labels) == gpu_of(labels), labels
        assert len(keys._memo) <= 50


def test_a_rounds_gpu_records_are_made_with_turns_of_the_event_loop_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The regrouping of a large round (0.8 s at 16384 GPUs) gives the loop a turn per metric
    and per EMIT_SLICE GPUs, and makes what one piece would: a hello per host, a sample per
    GPU with its values."""
    from verl_top.sources.prometheus import Series, gpu_sample, gpu_values

    hosts, per_host = 3 * EMIT_SLICE // 8 + 1, 8
    source = PrometheusSource(settings("http://127.0.0.1:9"))
    info = [
        Series({"Hostname": f"h{h}", "gpu": str(g), "UUID": f"u{h}-{g}", "modelName": "H100"})
        for h in range(hosts)
        for g in range(per_host)
    ]
    answers = {"_info": info}
    for name in ("util_gpu", "temp_c"):
        answers[name] = [Series(dict(s.labels)) for s in info]
        for k, s in enumerate(answers[name]):
            s.times.append(1.0)
            s.values.append(float(k % 90))
    turns: list[int] = []

    async def main() -> list:
        async def other_work() -> None:  # a frame or a key press waiting for the loop
            while True:
                turns.append(1)
                await asyncio.sleep(0)

        task = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        turns.clear()
        out = await source._gpu_records(answers, 5.0)
        task.cancel()
        return out

    records = asyncio.run(main())
    gpus = hosts * per_host
    assert len(turns) >= 2 + gpus // EMIT_SLICE  # a turn per metric and per slice of GPUs
    hellos = [r for r in records if isinstance(r, Hello)]
    samples = [r for r in records if isinstance(r, GpuSample)]
    assert len(hellos) == hosts and len(samples) == gpus
    values = gpu_values({k: v for k, v in answers.items() if k != "_info"})
    assert samples == [gpu_sample(s.host, s.index, 5.0, values) for s in samples]
    assert [(s.host, s.index) for s in samples] == sorted((s.host, s.index) for s in samples)


def test_a_round_is_decoded_with_the_cyclic_collector_paused(
    prom_cluster: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's answers are regrouped into records with the collector paused (at 16384 GPUs
    its allocations triggered a full collection every ~0.3 s, benchmarks/prom_app_scale.py);
    it is back on after the round, also after one that failed."""
    import gc

    seen: list[bool] = []
    real_round = PrometheusSource._round

    async def watched(self: PrometheusSource, at: float):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        out = await real_round(self, at)
        seen.append(gc.isenabled())
        return out

    monkeypatch.setattr(PrometheusSource, "_round", watched)
    assert gc.isenabled()
    records = one_round(PrometheusSource(settings(prom_cluster["server"].url)))
    assert any(isinstance(r, GpuSample) for r in records)
    assert seen == [False, False] and gc.isenabled()
    with socket.socket() as s:  # a port nothing listens on: the round fails
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    records = one_round(PrometheusSource(settings(dead)))
    assert [r.state for r in records if isinstance(r, SourceStatus)] == ["down"]
    assert seen[2:] == [False] and gc.isenabled()
