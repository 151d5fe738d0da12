"""Host CPU, memory, network and disks from node_exporter through a real Prometheus, joined
to the real DCGM hosts, shown as in SSH mode (issue 32 item 6).

The node_exporter data are two real captures of one machine 10.000 s apart (node_exporter
1.5.0, tests/fixtures/PROVENANCE.md), served with their capture interval as explicit
timestamps so ``irate`` is exact. Expected values, worked out by hand from the two files
before the tool ran (t10 minus t0, over 10 s):

- CPU: both cores' modes advance 20.00 s, idle+iowait 0.01 s (cpu1 iowait 65.52 -> 65.53):
  busy 99.95 %, iowait 0.05 %; cpu0 idle+iowait does not move: busiest core 100 %.
- load 4.69 / 3.72 / 3.08; memory used = MemTotal 25275973632 - MemAvailable 23260381184 =
  2015592448 bytes of 25275973632 (1.9 of 23.5 GiB).
- network (eth0; ifb0/ifb1 at 0; lo is not listed by node_exporter's capture): rx
  523581401 - 520061918 = 3519483 bytes -> 351948.3 B/s; tx 1060051 - 1046378 -> 1367.3 B/s.
- disks (vda only: zram0 is skipped as the agent skips it): read 6543971328 - 6520337408 ->
  2363392 B/s; written 11446513664 - 11177349120 -> 26916454.4 B/s.

Joins: the H100 DCGM exporter and a node_exporter share the scrape address 127.0.0.101 (the
bare-metal setup); the A800's node_exporter has its ``instance`` relabelled to the node name
(kube-prometheus' setup); a third node_exporter (127.0.0.104) matches no GPU host and makes no
host row. All three node_exporters report nodename "vm", which names no DCGM host.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from promserver import PROMETHEUS, Exposition, PromServer, fixture_text, stamped

from verl_top.cli import app_parser
from verl_top.inputs import build_inputs
from verl_top.model import GpuSample, HostSample, SourceStatus
from verl_top.origin import no_host_sample_text
from verl_top.sources.node_exporter import NodePlan, join_hosts, scrape_window
from verl_top.sources.prometheus import PrometheusSource, PromSettings
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.node_screen import render_host

H100 = "ip-10-0-171-111.ec2.internal"
A800 = "msxf-hpc-64-35-ai"
CAPTURE_S = 10.0
RELABEL = "    relabel_configs:\n      - target_label: instance\n        replacement: " + A800


@pytest.fixture(scope="module")
def node_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """A real Prometheus scraping two real DCGM captures and three node_exporters that serve
    the t0 capture, then (once Prometheus has it) the t10 capture, 10 s of timestamps later."""
    import os

    if not os.path.exists(PROMETHEUS):
        pytest.skip(f"{PROMETHEUS} is not installed (.ci/run installs the prometheus package)")
    t0 = int((time.time() - 30) * 1000)
    first = stamped(fixture_text("node_exporter_vm_t0.prom"), t0)
    second = stamped(fixture_text("node_exporter_vm_t10.prom"), t0 + int(CAPTURE_S * 1000))
    ends = {
        "h100": Exposition(fixture_text("dcgm_h100x8_eks_sampled.prom"), "127.0.0.101"),
        "a800": Exposition(fixture_text("dcgm_a800x8_mig_scrapeable.prom"), "127.0.0.102"),
        "node_h100": Exposition(first, "127.0.0.101"),
        "node_a800": Exposition(first, "127.0.0.103"),
        "node_other": Exposition(first, "127.0.0.104"),
    }
    server = PromServer(
        tmp_path_factory.mktemp("prometheus-node"),
        {
            "dcgm": [ends["h100"].target, ends["a800"].target],
            "node": [ends["node_h100"].target, ends["node_other"].target],
            "node-k8s": [ends["node_a800"].target],
        },
        addr="127.0.0.100",
        job_config={"node-k8s": RELABEL},
    )
    try:
        server.wait_for('DCGM_FI_DEV_GPU_TEMP{job="dcgm"}', 16)
        server.wait_for("node_load1 == 4.38", 3)  # the t0 capture is in
        for name in ("node_h100", "node_a800", "node_other"):
            ends[name].body = second
        server.wait_for("node_load1 == 4.69", 3)
        yield server
    finally:
        server.stop()
        for end in ends.values():
            end.stop()


def source_for(server: PromServer, **kw) -> PrometheusSource:
    return PrometheusSource(
        PromSettings(url=server.url, selector='job="dcgm"', rollout=False, interval=1.0, **kw)
    )


def run(source: PrometheusSource, step) -> list:
    out: list = []

    async def go() -> None:
        try:
            await step(out.append)
        finally:
            await source.client.close()

    asyncio.run(go())
    return out


def check_vm_numbers(s: HostSample) -> None:
    assert s.cpu_pct == pytest.approx(99.95, abs=1e-6)
    assert s.iowait_pct == pytest.approx(0.05, abs=1e-6)
    assert s.cpu_max_core_pct == pytest.approx(100.0, abs=1e-6)
    assert (s.load1, s.load5, s.load15) == (4.69, 3.72, 3.08)
    assert (s.mem_used_bytes, s.mem_total_bytes) == (2015592448, 25275973632)
    assert s.net_rx_bps == pytest.approx(351948.3) and s.net_tx_bps == pytest.approx(1367.3)
    assert s.disk_read_bps == pytest.approx(2363392.0)
    assert s.disk_write_bps == pytest.approx(26916454.4)


def test_node_exporter_values_join_the_dcgm_hosts(node_prom: PromServer) -> None:
    records = run(source_for(node_prom), source_for(node_prom).poll)
    hosts = {r.host: r for r in records if isinstance(r, HostSample)}
    # By scrape address (H100) and by the relabelled instance (A800); 127.0.0.104 is no host.
    assert set(hosts) == {H100, A800}
    for sample in hosts.values():
        check_vm_numbers(sample)


def test_history_has_host_samples_and_a_selector_limits_them(node_prom: PromServer) -> None:
    source = source_for(node_prom)
    history = [r for r in run(source, source._history) if isinstance(r, HostSample)]  # noqa: SLF001
    # irate has both samples from t10 on: those grid points carry the values, earlier none.
    assert {r.host for r in history} == {H100, A800}
    check_vm_numbers(history[-1])
    only_k8s = source_for(node_prom, node_selector='job="node-k8s"')
    records = run(only_k8s, only_k8s.poll)
    assert {r.host for r in records if isinstance(r, HostSample)} == {A800}


def test_a_node_that_goes_away_reads_no_data_not_its_last_values(node_prom: PromServer) -> None:
    source = source_for(node_prom)

    async def two_rounds(emit) -> None:
        await source.poll(emit)
        # The node_exporters stop answering: every node query comes back empty.
        plan = source.node_plan
        plan.queries = dict.fromkeys(plan.queries, "vector(0) > 1")
        plan.info, plan.next_at = "vector(0) > 1", 0.0
        await source.poll(emit)

    records = run(source, two_rounds)
    last = {r.host: r for r in records if isinstance(r, HostSample)}
    assert set(last) == {H100, A800}
    assert all(r.cpu_pct is None and r.net_rx_bps is None for r in last.values())


class SlowNodeProxy:
    """Forwards to a Prometheus, holding every query about node_exporter's series ``delay`` s
    (a Prometheus slow to evaluate irate over 100 000 per-core CPU series)."""

    def __init__(self, upstream: str, delay: float) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if "node_" in urllib.parse.unquote(self.path):
                    time.sleep(delay)
                try:
                    with urllib.request.urlopen(upstream + self.path, timeout=10) as resp:
                        body, status = resp.read(), resp.status
                except urllib.error.HTTPError as exc:
                    body, status = exc.read(), exc.code
                except OSError:  # Prometheus stopped while this query was held
                    body, status = b"", 502
                with contextlib.suppress(OSError):  # the client gave up waiting
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.100", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.100:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_slow_host_queries_never_cost_the_gpu_round(node_prom: PromServer) -> None:
    proxy = SlowNodeProxy(node_prom.url, delay=3.0)
    try:
        source = PrometheusSource(
            PromSettings(
                url=proxy.url, selector='job="dcgm"', rollout=False, interval=1.0, budget=1.5,
                request_timeout=1.5, history_budget=1.5,
            )
        )  # fmt: skip

        async def history_then_round(emit) -> None:  # noqa: ANN001
            await source._history(emit)  # noqa: SLF001
            await source.poll(emit)

        records = run(source, history_then_round)
    finally:
        proxy.close()
    gpus = [r for r in records if isinstance(r, GpuSample)]
    assert {r.host for r in gpus} == {H100, A800} and len(gpus) > 16  # history and the round
    assert not any(isinstance(r, HostSample) for r in records)
    (status,) = [r for r in records if isinstance(r, SourceStatus) and r.state == "up"]
    assert "host values (node_exporter) skipped this round" in status.reason


class Last:
    """An answered series with one value (what NodePlan.learn reads)."""

    def __init__(self, value: float) -> None:
        self.labels: dict[str, str] = {}
        self.value = value

    def last(self) -> float:
        return self.value


def test_host_queries_follow_the_scrape_interval() -> None:
    plan = NodePlan(interval=5.0)
    first = plan.due(100.0)
    assert first is not None and "_nscrape" in first and "[2m]" in first["cpu_modes"]
    assert plan.due(105.0) is not None  # interval unknown: every round
    plan.learn({"_nscrape": [Last(30.0)]}, 105.0)  # node_exporter scraped every 30 s
    assert "[90s]" in plan.queries["cpu_modes"] and "[90s]" in plan.queries["net_rx_bps"]
    assert plan.due(110.0) is not None  # due since 105; next one a scrape interval later
    assert [plan.due(t) is None for t in (115.0, 120.0, 130.0, 137.0)] == [True] * 4
    again = plan.due(140.0)
    assert again is not None and "_nscrape" not in again  # asked again after 5 minutes
    assert "_nscrape" in plan.due(410.0)
    # No answer, or a nonsense one, keeps what was known; the window stays within bounds.
    plan.learn({"_nscrape": []}, 410.0)
    plan.learn({"_nscrape": [Last(-1.0)]}, 410.0)
    assert plan.scrape_s == 30.0
    assert [scrape_window(x) for x in (None, 1.0, 15.0, 1000.0)] == ["2m", "15s", "45s", "600s"]


def test_join_rules_name_one_host_or_none() -> None:
    gpu = [("gpu01.cluster.local", "10.0.0.1:9400"), ("gpu02", "10.0.0.2:9400")]
    gpu += [("10.0.0.9", "10.0.0.9:9400")]  # dcgm-exporter --no-hostname: named by address
    nodes = [
        {"instance": "10.0.0.5:9100", "nodename": "gpu01"},  # short name of gpu01.cluster.local
        {"instance": "gpu02:9100"},  # instance relabelled to the node name
        {"instance": "10.0.0.9:9100", "nodename": "other"},  # the DCGM host's address
        {"instance": "10.0.0.7:9100", "nodename": "cpu-only"},  # no GPU host
    ]
    assert join_hosts(nodes, gpu) == {
        "10.0.0.5:9100": "gpu01.cluster.local",
        "gpu02:9100": "gpu02",
        "10.0.0.9:9100": "10.0.0.9",
    }
    # Two DCGM hosts behind one address (one exporter scraping both names): no guess.
    shared = [("a", "10.0.0.1:9400"), ("b", "10.0.0.1:9401")]
    assert join_hosts([{"instance": "10.0.0.1:9100"}], shared) == {}
    # IPv6 scrape address; a second exporter for a joined host does not take it over.
    v6 = [("n1", "[fd00::1]:9400")]
    twice = [{"instance": "[fd00::1]:9100"}, {"instance": "[fd00::1]:9101"}]
    assert join_hosts(twice, v6) == {"[fd00::1]:9100": "n1"}


def screen_text(app: VerlTopApp) -> str:
    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r"<text[^>]*>(.*?)</text>", svg))).replace("\xa0", " ")


@pytest.mark.timeout(90)
async def test_host_columns_and_node_screen_in_prometheus_mode(node_prom: PromServer) -> None:
    args = app_parser().parse_args(
        ["--prometheus", node_prom.url, "--prom-selector", 'job="dcgm"', "--prom-interval", "1",
         "--refresh", "0.5"]
    )  # fmt: skip
    inputs = build_inputs(args)
    store = inputs.store
    app = VerlTopApp(inputs, refresh=0.5)
    # Pane 1's host table: CPU% 100, iowait 0.1, memory 2/24 GiB, net rx/tx, as from SSH.
    row = re.compile(rf"{re.escape(H100)}\s+up\s.*?100\s+0\.1\s+2/24\s+351\.9 kB/s\s+1\.4 kB/s")
    async with app.run_test(size=(200, 50)) as pilot:
        # Polled until it shows (a deadline, not a count: a loaded CI machine has taken
        # longer than 15 s for the first rounds, and a round late by 3 refreshes reads stale).
        deadline = time.monotonic() + 45
        one = ""
        while time.monotonic() < deadline:
            app.refresh_now()
            await pilot.pause()
            one = screen_text(app)
            if row.search(one):
                break
            await asyncio.sleep(0.2)
    assert row.search(one), one
    h = store.hosts[H100]
    text = render_host(store, h, {}, width=80).plain
    assert "CPU 100 %" in text and "iowait 0.1 %" in text and "load 4.7" in text
    assert "busiest core 100 %" in text
    assert "Memory 2 / 24 GiB (8 %)" in text
    assert "351.9 kB/s" in text and "2.4 MB/s" in text and "26.9 MB/s" in text
    # The diagnosis reads the busiest core as from an agent's per-core list.
    assert store.hosts[H100].history.recent_values("cpu_max_core", 0)[-1] == pytest.approx(100)


def test_prometheus_mode_says_why_a_host_has_no_host_sample() -> None:
    store = Store()
    store.origin = "prometheus"
    assert "node_exporter" in no_host_sample_text(store)
    assert "--prom-node-selector" in no_host_sample_text(store)
    store.ingest(HostSample(host="gpu01", t=1.0, cpu_pct=5.0))
    # Another host has node_exporter values: this one's did not join.
    assert "joined" in no_host_sample_text(store) and "nodename" in no_host_sample_text(store)
