"""The verdict pages the team (issue 33 items 2-3): alerting rules checked and unit-tested by
promtool, fired end to end through a real Prometheus and a real Alertmanager scraping a real
``verl-top export-metrics``; the webhook push; the Grafana dashboard valid and its queries live.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from assessing import assessment_of
from promserver import PromServer, free_port

from verl_top.diagnosis.findings import Check, Finding, Verdict
from verl_top.export.webhook import WebhookNotifier, payload, urllib_post
from verl_top.store import Store

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "verl_top" / "data" / "alerts" / "verl-top.rules.yml"
RULE_TESTS = ROOT / "tests" / "fixtures" / "alerts" / "verl-top.rules.test.yml"
DASHBOARD = ROOT / "verl_top" / "data" / "grafana" / "verl-top.json"
SCHEMA = ROOT / "tests" / "fixtures" / "grafana" / "dashboard-classic.schema.json"
STALLED = ROOT / "tests" / "scenarios" / "job_stalled" / "recording.ndjson"
ROLLOUT = ROOT / "tests" / "scenarios" / "flow_rollout_bound" / "recording.ndjson"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = os.environ.get("ALERTMANAGER_BIN", "/usr/bin/prometheus-alertmanager")


class Receiver:
    """An HTTP endpoint that records POSTed JSON; answers ``codes`` in turn, then 200."""

    def __init__(self, addr: str = "127.0.0.92", codes: tuple[int, ...] = ()) -> None:
        self.bodies: list[Any] = []
        self.codes = list(codes)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                code = outer.codes.pop(0) if outer.codes else 200
                if code == 200:
                    outer.bodies.append(json.loads(data))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((addr, 0), Handler)
        self.url = f"http://{addr}:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


# -- rules ------------------------------------------------------------------------------------


def test_rules_pass_promtool_check_and_their_unit_tests(tmp_path: Path) -> None:
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "7 rules found" in check.stdout, check.stdout + check.stderr
    tests = tmp_path / "tests.yml"
    tests.write_text(RULE_TESTS.read_text().replace("RULES", str(RULES)))
    run = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_print_rules_and_dashboard_are_the_packaged_files() -> None:
    for flag, path in (("--print-rules", RULES), ("--print-dashboard", DASHBOARD)):
        out = subprocess.run(
            [sys.executable, "-m", "verl_top", "export-metrics", flag],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.returncode == 0 and out.stdout == path.read_text()


# -- the Grafana dashboard ------------------------------------------------------------------------


def _exprs(dash: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def _instantiated(expr: str) -> str:
    """A panel query with the dashboard's variables filled in as Grafana would."""
    return expr.replace("$job", "verl-top").replace("$instance", ".*")


def test_dashboard_is_valid_classic_grafana_json_and_every_query_parses(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(dash)]
    assert errors == []
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:  # no two panels on the same grid cell
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    # promtool parses PromQL in recording rules: one rule per panel query.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": _instantiated(expr)}
                    for i, (_, expr) in enumerate(_exprs(dash))
                ],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# -- end to end: export-metrics -> Prometheus rules -> Alertmanager -> webhook ------------------


@pytest.mark.slow
def test_an_alert_reaches_alertmanager_and_its_webhook(tmp_path: Path) -> None:
    """Two jobs served by `verl-top export-metrics` (a stalled one, the job_stalled scenario,
    and a rollout-bound one with verl's throughput and a costed lead), scraped by a real
    Prometheus with the shipped rules (durations shortened to 2 s), routed by a real
    Alertmanager to a webhook: the critical VerlTopJobStalled and VerlTopBottleneckPersists
    arrive; every dashboard query returns data from the same Prometheus."""
    addr = "127.0.0.91"
    ports = [free_port(addr), free_port(addr)]
    exporters = [
        subprocess.Popen(
            [sys.executable, "-m", "verl_top", "export-metrics", "--replay", str(rec)]
            + ["--speed", "1000", "--listen", f"{addr}:{port}", "--refresh", "0.5"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for rec, port in zip((STALLED, ROLLOUT), ports, strict=True)
    ]
    receiver = Receiver(addr)
    am_port = free_port(addr)
    (tmp_path / "am.yml").write_text(
        "route:\n  receiver: hook\n  group_wait: 1s\n  group_interval: 1s\n"
        "  repeat_interval: 1h\n  group_by: [alertname]\nreceivers:\n  - name: hook\n"
        f"    webhook_configs:\n      - url: {receiver.url}\n"
    )
    am = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address={addr}:{am_port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    fast = re.sub(r"for: \S+", "for: 2s", RULES.read_text())
    (tmp_path / "rules.yml").write_text(fast)
    prom = PromServer(
        tmp_path / "prom",
        {"verl-top": [f"{addr}:{port}" for port in ports]},
        addr=addr,
        extra_config=(
            f"rule_files: ['{tmp_path / 'rules.yml'}']\n"
            f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{addr}:{am_port}']\n"
        ),
    )
    try:
        prom.wait_for("verl_top_inputs_ended == 1", count=2, timeout=60)
        deadline = time.monotonic() + 60
        names: set[str] = set()
        while (
            time.monotonic() < deadline
            and not {"VerlTopJobStalled", "VerlTopBottleneckPersists"} <= names
        ):
            time.sleep(0.5)
            names = {a["labels"]["alertname"] for b in receiver.bodies for a in b["alerts"]}
        assert {"VerlTopJobStalled", "VerlTopBottleneckPersists"} <= names, (names, prom.log_text())
        stalled = next(
            a
            for b in receiver.bodies
            for a in b["alerts"]
            if a["labels"]["alertname"] == "VerlTopJobStalled"
        )
        assert stalled["status"] == "firing" and stalled["labels"]["severity"] == "critical"
        assert stalled["labels"]["rule"] == "job.stalled" and stalled["annotations"]["summary"]
        # The dashboard shows data: every panel query answers (the host table lists only hosts
        # that are not up, and all are up here: its metric must still be there).
        dash = json.loads(DASHBOARD.read_text())
        for title, expr in _exprs(dash):
            query = _instantiated(expr)
            if title == "Hosts not up":
                query = query.replace(',state!="up"', "").replace(" == 1", "")
            assert prom.query(query), f"{title}: {query} returned nothing"
    finally:
        prom.stop()
        _stop(am)
        for exporter in exporters:
            _stop(exporter)
        receiver.stop()


# -- the webhook ----------------------------------------------------------------------------------


def _assessment(rule: str | None, step: int = 3, advice: str = "raise the micro batch") -> Any:
    findings = (
        [Finding(step, rule, 0.7, f"{rule} title", ["e"], advice, save_s=12.5)] if rule else []
    )
    verdict = Verdict(
        step if rule else None,
        rule,
        "",
        findings=findings,
        checks=[Check(1, "gpu.idle", "passed", "")],
        t=1000.0,
    )
    return assessment_of(Store(), verdict)


def test_webhook_sends_one_message_per_state_change_with_retries() -> None:
    receiver = Receiver(codes=(503, 502))  # two failures, then accepted
    notifier = WebhookNotifier(receiver.url, backoff_s=0.05, timeout_s=5)

    async def go() -> None:
        task = asyncio.create_task(notifier.run())
        for a in (
            _assessment("flow.train_bound"),
            _assessment("flow.train_bound"),  # same state: no second message
            _assessment("flow.logprob_slow"),
            _assessment(None),
        ):
            notifier.observe(a)
            await asyncio.sleep(0.01)
        for _ in range(200):
            if len(receiver.bodies) == 3:
                break
            await asyncio.sleep(0.02)
        task.cancel()

    try:
        asyncio.run(go())
    finally:
        receiver.stop()
    assert [b["rule"] for b in receiver.bodies] == ["flow.train_bound", "flow.logprob_slow", None]
    assert receiver.bodies[1]["previous"]["rule"] == "flow.train_bound"
    assert receiver.bodies[0]["text"].startswith("verl-top: step 3 bottleneck")
    assert receiver.bodies[0]["save_s_per_step"] == 12.5
    assert notifier.sent == 3 and notifier.failed == 0


def test_webhook_gives_up_on_a_client_error_and_never_prints_the_url_path() -> None:
    receiver = Receiver(codes=(403,))
    secret = receiver.url.replace("/hook", "/services/T000/B000/XXXXSECRET")
    notifier = WebhookNotifier(secret, backoff_s=0.01, timeout_s=5)

    async def go() -> None:
        notifier.observe(_assessment("flow.train_bound"))
        await notifier.drain(within_s=5)

    try:
        asyncio.run(go())
    finally:
        receiver.stop()
    assert notifier.failed == 1 and receiver.bodies == []
    assert "HTTP 403" in notifier.notes[0] and "XXXXSECRET" not in notifier.notes[0]


def test_webhook_payload_carries_no_secret() -> None:
    doc = payload(
        _assessment(
            "flow.train_bound", advice="export HF_TOKEN=hf_abcdefghijklmnopqrstuvwx then retry"
        ),
        None,
    )
    text = json.dumps(doc)
    assert "hf_abcdefghijklmnopqrstuvwx" not in text and doc["advice"]


def test_webhook_network_errors_are_retried_then_counted() -> None:
    port = free_port("127.0.0.93")  # nothing listens there
    notifier = WebhookNotifier(
        f"http://127.0.0.93:{port}/x", attempts=3, backoff_s=0.01, timeout_s=2
    )

    async def go() -> None:
        notifier.observe(_assessment("flow.train_bound"))
        await notifier.drain(within_s=10)

    asyncio.run(go())
    assert notifier.failed == 1 and "ConnectionRefusedError" in notifier.notes[0]


def test_bad_webhook_url_is_one_sentence() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "export-metrics", "--listen", "127.0.0.1:9", "--demo"]
        + ["--webhook", "ftp://example/x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "expected an http:// or https:// URL" in out.stderr


def test_urllib_post_reports_the_status() -> None:
    receiver = Receiver(codes=(500,))
    try:
        assert asyncio.run(urllib_post(receiver.url, b"{}", 5)) == 500
        assert asyncio.run(urllib_post(receiver.url, b"{}", 5)) == 200
    finally:
        receiver.stop()
