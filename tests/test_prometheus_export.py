"""Verdicts as metrics: the collector's exposition, and a real Prometheus scraping
``verl-top export-metrics`` while it reads the (constructed busy, real-labelled) H100 from the
same Prometheus.

Expected before running: the busy H100 has GPU util 100 % but SM active 30 % and tensor 5 %
(promserver.busy_h100), so step 1 fires gpu.idle (activity = SM 30 % < 50 %) and
gpu.util_misleading (util >= 90 with SM < 50): the bottleneck step is 1, its host is up with
8 GPUs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from assessing import assessment_of
from prometheus_client import generate_latest

from verl_top.diagnosis.findings import Finding, Verdict
from verl_top.export.metrics import VerdictSnapshot, new_registry, parse_listen, snapshot
from verl_top.model import GpuInfo, Hello
from verl_top.monitor import assess_store
from verl_top.store import Store

ROOT = Path(__file__).resolve().parents[1]
BUSY = "busy-ip-10-0-171-111.ec2.internal"


def test_collector_serves_bottleneck_severities_and_host_states() -> None:
    store = Store()
    store.ingest(Hello(host="node1", t=1.0, gpus=[GpuInfo(0), GpuInfo(1)]))
    store.ingest(Hello(host="node2", t=1.0, gpus=[GpuInfo(0)]))
    store.hosts["node2"].state = "stale"
    verdict = Verdict(
        bottleneck_step=3,
        bottleneck_rule="flow.rollout_bound",
        headline="",
        findings=[
            Finding(3, "flow.rollout_bound", 0.7, "t", [], ""),
            Finding(1, "gpu.idle", 0.4, "t", [], ""),
        ],
        t=1.0,
    )
    registry, collector = new_registry()
    assert generate_latest(registry) == b""  # nothing before the first evaluation
    collector.snapshot = snapshot(store, assessment_of(store, verdict))
    text = generate_latest(registry).decode()
    assert "verl_top_bottleneck_step 3.0" in text
    assert 'verl_top_bottleneck{name="Dataflow",rule="flow.rollout_bound",step="3"} 1.0' in text
    assert 'verl_top_bottleneck{name="Communication",rule="",step="2"} 0.0' in text
    assert 'verl_top_step_severity{name="Dataflow",step="3"} 0.7' in text
    assert 'verl_top_finding_severity{rule="gpu.idle",step="1"} 0.4' in text
    assert 'verl_top_host_state{host="node2",state="stale"} 1.0' in text
    assert 'verl_top_hosts{state="up"} 1.0' in text
    assert "verl_top_gpus 3.0" in text
    assert "process_cpu" not in text  # own registry: no global collectors


def test_no_bottleneck_is_step_zero() -> None:
    registry, collector = new_registry()
    collector.snapshot = VerdictSnapshot(0.0, 0.0, None, None)
    assert "verl_top_bottleneck_step 0.0" in generate_latest(registry).decode()


def test_listen_address_is_checked() -> None:
    assert parse_listen("127.0.0.1:9108") == ("127.0.0.1", 9108)
    assert parse_listen(":9108") == ("127.0.0.1", 9108)
    for bad in ("9108", "host:", "host:99999"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


@pytest.mark.timeout(90)
def test_prometheus_scrapes_verl_top_verdicts(prom_cluster: dict) -> None:
    server = prom_cluster["server"]
    addr, port = prom_cluster["verl_top_target"]  # the address the "verl-top" job scrapes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "verl_top", "export-metrics",
            "--listen", f"{addr}:{port}",
            "--prometheus", server.url, "--prom-selector", 'job="dcgm-busy"',
            "--prom-interval", "1", "--refresh", "1", "--duration", "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        found = server.wait_for('verl_top_bottleneck_step{job="verl-top"} == 1', 1, timeout=45)
        assert found[0]["metric"]["instance"] == f"{addr}:{port}"
        flag = server.query('verl_top_bottleneck{job="verl-top",step="1"}')
        assert flag[0]["value"][1] == "1"
        assert flag[0]["metric"]["rule"].startswith("gpu.")
        assert server.query('verl_top_gpus{job="verl-top"}')[0]["value"][1] == "8"
        up = server.query(f'verl_top_host_state{{job="verl-top",host="{BUSY}"}}')
        assert up[0]["metric"]["state"] == "up"
        print(f"verdict scraped {time.monotonic() - t0:.1f} s after start")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=15)[0].decode(errors="replace")
        assert "Traceback" not in out, out


def test_stage_shares_and_verdict_of_the_demo_recording() -> None:
    """The bundled demo (pane 3 shows gen at 62 % of the step): shares come from verl's steps."""
    from verl_top.inputs import demo_recording_path
    from verl_top.protocol import read_recording

    store = Store()
    for r in read_recording(demo_recording_path()):
        store.ingest(r, received=r.t)
    assessment = assess_store(store)
    snap = snapshot(store, assessment)
    assert snap.stage_shares["gen"] == pytest.approx(0.62, abs=0.01)
    assert snap.gpus == 32 and set(snap.host_states.values()) == {"up"}
    registry, collector = new_registry()
    collector.snapshot = snap
    text = generate_latest(registry).decode()
    assert 'verl_top_stage_share{stage="gen"} 0.6' in text
    assert f"verl_top_bottleneck_step {float(assessment.bottleneck_step or 0)}" in text


def test_a_taken_listen_address_is_one_sentence(capsys) -> None:
    import socket

    from verl_top.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.97", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc = main(["export-metrics", "--listen", f"127.0.0.97:{port}", "--demo"])
    assert rc == 1
    assert f"cannot listen on 127.0.0.97:{port}" in capsys.readouterr().err


def test_a_lone_surrogate_from_a_node_breaks_neither_the_scrape_nor_the_snapshot(
    tmp_path,
) -> None:
    """Issue 31: "\\ud800" in a node's JSON passed the cleaner; every export-metrics scrape then
    answered HTTP 500 (UTF-8 encoding failed) and snapshot wrote nothing."""
    from verl_top.export.snapshot import write_snapshot
    from verl_top.protocol import Decoder

    line = '{"v":1,"type":"hello","host":"gpu\\ud800node","t":1.0,"gpus":[{"index":0}]}'
    record = Decoder().decode(line)
    assert record is not None and record.host == "gpu\ufffdnode"
    store = Store()
    store.ingest(record)
    registry, collector = new_registry()
    collector.snapshot = snapshot(store, assessment_of(store, Verdict(None, None, "", [], t=1.0)))
    assert 'host="gpu\ufffdnode"' in generate_latest(registry).decode("utf-8")
    path = write_snapshot(store, None, tmp_path / "snap")
    assert "gpu\ufffdnode" in (path / "snapshot.json").read_text(encoding="utf-8")
