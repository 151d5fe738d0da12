"""A real Prometheus (Debian's /usr/bin/prometheus) for tests, scraping local exposition endpoints.

``Exposition`` serves a text body at ``/metrics`` from a thread (the body can be swapped while it
runs); ``PromServer`` starts Prometheus on 127.0.0.x with a temporary data directory, a 1 s
scrape interval and the given targets, waits until it answers, and is stopped by its pid.

Prometheus 2.42 passes new targets to its scraper at most every 5 s, so the first data arrives
~6 s after start (fixtures/prometheus/README.md): start one per test session where possible.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PROMETHEUS = os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus")
FIXTURES = Path(__file__).parent / "fixtures" / "prometheus"


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` right now."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Exposition:
    """Serves ``body`` as Prometheus text format at http://ADDR:PORT/metrics (a thread)."""

    def __init__(self, body: str, addr: str = "127.0.0.90") -> None:
        self.body = body
        self.scrapes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                data = outer.body.encode()
                outer.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((addr, 0), Handler)
        self.server.daemon_threads = True
        self.addr = addr
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def target(self) -> str:
        return f"{self.addr}:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PromServer:
    """One real Prometheus process scraping ``targets`` (job name -> list of host:port);
    ``extra_config``: more top-level YAML (rule_files, alerting)."""

    def __init__(
        self,
        workdir: Path,
        targets: dict[str, list[str]],
        addr: str = "127.0.0.90",
        scrape_interval: str = "1s",
        extra_config: str = "",
        web_config: Path | None = None,
    ) -> None:
        self.addr = addr
        self.port = free_port(addr)
        # Prometheus' own --web.config.file: TLS (then https) and basic auth users.
        tls = web_config is not None and "tls_server_config" in web_config.read_text()
        self.url = f"{'https' if tls else 'http'}://{addr}:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        jobs = "\n".join(
            f"  - job_name: {name}\n    honor_labels: true\n    static_configs:\n"
            f"      - targets: {json.dumps(addrs)}"
            for name, addrs in targets.items()
        )
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {scrape_interval}\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n{jobs}\n{extra_config}"
        )
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address={addr}:{self.port}",
                "--log.level=warn",
                *([f"--web.config.file={web_config}"] if web_config is not None else []),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as resp:
            return json.loads(resp.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result list of an instant query."""
        return self.get("/api/v1/query", {"query": expr})["data"]["result"]

    def wait_for(self, expr: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns at least ``count`` series (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log_text()}")
            try:
                last = self.query(expr)
                if len(last) >= count:
                    return last
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise AssertionError(f"no {count} series for {expr} in {timeout}s: {last}")

    def log_text(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        """Stop Prometheus by its pid (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()


def fixture_text(name: str) -> str:
    """A recorded exposition of tests/fixtures/prometheus/."""
    return (FIXTURES / name).read_text()


def busy_h100() -> str:
    """CONSTRUCTED VALUES on the real H100 labels: GPU util 100 % (as NVML would say while a
    kernel runs), SM active 0.30, tensor pipe 0.05, DRAM 0.60 on all 8 GPUs, with the real
    labels and host of dcgm_h100x8_eks_sampled.prom. For the diagnosis test only: no real busy
    DCGM capture exists in fixtures/ (both real files are idle machines)."""
    out = []
    for line in fixture_text("dcgm_h100x8_eks_sampled.prom").splitlines():
        if not line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            continue
        labels = line[len("DCGM_FI_DEV_GPU_UTIL") : line.rindex("}") + 1]
        labels = labels.replace('Hostname="ip-10-0-171-111', 'Hostname="busy-ip-10-0-171-111')
        out += [
            f"DCGM_FI_DEV_GPU_UTIL{labels} 100",
            f"DCGM_FI_PROF_SM_ACTIVE{labels} 0.300000",
            f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{labels} 0.050000",
            f"DCGM_FI_PROF_DRAM_ACTIVE{labels} 0.600000",
        ]
    return "\n".join(out) + "\n"
