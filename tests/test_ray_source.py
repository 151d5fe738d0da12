"""The Ray source against a small local HTTP server on 127.0.0.1 that answers like the Ray
dashboard (replies shaped as the real ones in tests/fixtures/ray/): every failure mode of the
dashboard, nodes joining and leaving while running, and a node reached over real SSH."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from verl_top.model import HostState, RayActors, RayNode
from verl_top.sources.ray import (
    LEFT_REASON,
    Dashboard,
    RayError,
    RaySource,
    Token,
    first_look,
)

FIX = Path(__file__).parent / "fixtures" / "ray"


def state_reply(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    return {
        "result": True,
        "msg": "",
        "data": {
            "result": {
                "total": n,
                "num_after_truncation": n,
                "num_filtered": n,
                "result": rows,
                "partial_failure_warning": "",
                "warnings": None,
            }
        },
    }


def node_row(node_id: str, ip: str, gpus: float = 8.0, state: str = "ALIVE") -> dict[str, Any]:
    real = json.loads((FIX / "nodes.json").read_text())["data"]["result"]["result"][0]
    return {
        **real,
        "node_id": node_id,
        "node_ip": ip,
        "node_name": ip,
        "is_head_node": node_id == "head",
        "state": state,
        "resources_total": {**real["resources_total"], "GPU": gpus},
    }


class FakeDashboard:
    """Answers GETs from ``routes`` (path -> (status, body bytes)); records the auth header."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.auth: list[str | None] = []
        self.nodes: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.auth.append(self.headers.get("Authorization"))
                path = self.path.split("?", 1)[0]
                if path in fake.routes:
                    status, body = fake.routes[path]
                elif path == "/api/v0/nodes":
                    status, body = 200, json.dumps(state_reply(fake.nodes)).encode()
                elif path in ("/api/v0/actors", "/api/v0/jobs"):
                    status, body = 200, json.dumps(state_reply([])).encode()
                else:
                    status, body = 404, b"404: Not Found"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeDashboard]:
    f = FakeDashboard()
    try:
        yield f
    finally:
        f.close()


# --- failure modes ----------------------------------------------------------------------------


def test_401_without_token_says_how_to_give_one(fake: FakeDashboard) -> None:
    fake.routes["/api/v0/nodes"] = (401, b"Unauthorized: Missing authentication token")
    with pytest.raises(RayError) as err:
        first_look(Dashboard(fake.url))
    assert err.value.kind == "auth"
    msg = str(err.value)
    assert "HTTP 401: Unauthorized: Missing authentication token" in msg
    assert "RAY_AUTH_TOKEN" in msg and "--ray-token" in msg and "~/.ray/auth_token" in msg
    assert fake.auth == [None]


def test_403_names_where_the_token_came_from_and_sends_it_as_bearer(fake: FakeDashboard) -> None:
    fake.routes["/api/v0/nodes"] = (403, b"Forbidden: Invalid authentication token")
    with pytest.raises(RayError) as err:
        first_look(Dashboard(fake.url, Token("s3cret", "RAY_AUTH_TOKEN")))
    assert err.value.kind == "auth"
    assert "rejected the token from RAY_AUTH_TOKEN" in str(err.value)
    assert "s3cret" not in str(err.value)
    assert fake.auth == ["Bearer s3cret"]


@pytest.mark.parametrize(
    ("status", "body", "kind", "words"),
    [
        (200, b"<html><body>Grafana</body></html>", "not_ray", "not with JSON"),
        (200, b'{"result": tru', "not_ray", "not with JSON"),
        (200, b'{"hello": "world"}', "not_ray", "not a Ray state-API reply"),
        (404, b"404: Not Found", "not_ray", "HTTP 404"),
        (
            400,
            (FIX / "bad_limit.json").read_bytes(),  # a real 400 reply of Ray 2.60
            "api",
            "exceeds the supported limit 10000",
        ),
        (200, json.dumps(state_reply([])).encode(), "api", "lists no node"),
    ],
)
def test_answers_that_are_not_a_usable_dashboard(
    fake: FakeDashboard, status: int, body: bytes, kind: str, words: str
) -> None:
    fake.routes["/api/v0/nodes"] = (status, body)
    with pytest.raises(RayError) as err:
        first_look(Dashboard(fake.url))
    assert err.value.kind == kind and words in str(err.value), str(err.value)


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RayError) as err:
        first_look(Dashboard(f"http://127.0.0.1:{port}"))
    assert err.value.kind == "unreachable" and "connection refused" in str(err.value)
    assert "ssh -L 8265" in str(err.value)


def _listener(reply: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A TCP server on 127.0.0.1 that sends ``reply`` and closes, or (None) never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                if reply is None:
                    held.append(conn)  # keep it open, silent
                    continue
                conn.recv(4096)
                conn.sendall(reply)
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def test_silent_server_times_out() -> None:
    srv, _ = _listener(None)
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        with pytest.raises(RayError) as err:
            first_look(Dashboard(url, deadline=0.3))
    finally:
        srv.close()
    assert err.value.kind == "unreachable" and "no answer within 0.3 s" in str(err.value)


def test_a_port_that_does_not_speak_http_is_named_as_such() -> None:
    srv, _ = _listener(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00")  # binary, like a gRPC port
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        with pytest.raises(RayError) as err:
            first_look(Dashboard(url, deadline=2))
    finally:
        srv.close()
    assert err.value.kind == "not_ray" and "GCS or Ray Client port" in str(err.value)


# --- nodes joining and leaving ----------------------------------------------------------------


class StubNode:
    """A node source that reports itself up and records what it was asked to follow."""

    def __init__(self, node: RayNode) -> None:
        self.name = node.name
        self.node = node
        self.follows: list[tuple[str, str, bool]] = []
        self.cancelled = False

    async def run(self, emit) -> None:  # noqa: ANN001
        emit(HostState(host=self.name, t=1.0, state="up"))
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled = True

    def follow(self, kind: str, path: str, from_start: bool = False) -> bool:
        self.follows.append((kind, path, from_start))
        return True


async def test_nodes_join_and_leave_while_running(fake: FakeDashboard) -> None:
    fake.nodes = [node_row("head", "127.0.0.11"), node_row("w1", "127.0.0.12")]
    started: list[StubNode] = []

    def factory(node: RayNode) -> StubNode:
        started.append(StubNode(node))
        return started[-1]

    records: list[Any] = []
    source = RaySource(Dashboard(fake.url), factory, poll_s=0.1, local_names=set())
    task = asyncio.create_task(source.run(records.append))

    async def until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
        for _ in range(int(timeout / 0.02)):
            if cond():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("condition not met")

    try:
        await until(lambda: len(started) == 2)
        assert [s.node.ip for s in started] == ["127.0.0.11", "127.0.0.12"]
        assert started[0].node.gpus == 8.0 and started[0].node.is_head
        # A node joins.
        fake.nodes.append(node_row("w2", "127.0.0.13"))
        await until(lambda: len(started) == 3)
        # A node leaves (Ray marks it DEAD) -> its source stops and it is shown down.
        fake.nodes[1] = node_row("w1", "127.0.0.12", state="DEAD")
        await until(lambda: started[1].cancelled)
        await until(
            lambda: any(isinstance(r, HostState) and r.reason == LEFT_REASON for r in records)
        )
        left = [r for r in records if isinstance(r, HostState) and r.state == "down"]
        assert [(r.host, r.reason) for r in left] == [("127.0.0.12", LEFT_REASON)]
        # It comes back (a new raylet: new node id, same machine) -> a new source.
        fake.nodes[1] = node_row("w1-again", "127.0.0.12")
        await until(lambda: len(started) == 4)
        assert started[3].node.ip == "127.0.0.12" and not started[0].cancelled
        # The dashboard goes away: nodes are kept, a note says so; it comes back: note cleared.
        fake.routes["/api/v0/nodes"] = (502, b"Bad Gateway")
        await until(lambda: "HTTP 502" in _last(records).note)
        assert len(source.running) == 3
        del fake.routes["/api/v0/nodes"]
        await until(
            lambda: (
                _last(records).note == "Ray: no driver log yet: no TaskRunner "
                "actor and no running submitted job (looked for a running submitted job's "
                "job-driver-*.log on 127.0.0.11); give --verl-log HOST:PATH to follow one"
            )
        )
        # Nothing changes for a few polls: no new snapshot (the recorder keeps every record).
        sent, polls = sum(isinstance(r, RayActors) for r in records), source.polls
        await until(lambda: source.polls >= polls + 3)
        assert sum(isinstance(r, RayActors) for r in records) == sent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(s.cancelled for s in started), "node sources must stop with the Ray source"


def _last(records: list[Any]) -> RayActors:
    return [r for r in records if isinstance(r, RayActors)][-1]


# --- a node over real SSH ---------------------------------------------------------------------


@pytest.mark.sshd
@pytest.mark.timeout(60)
async def test_a_ray_node_is_monitored_over_ssh(
    fake: FakeDashboard, tmp_path: Path, ssh_keys, sshd_factory, h200_trace: Path, remote_python
) -> None:
    import argparse

    from sshd import make_settings

    from verl_top.flags import ray_settings
    from verl_top.inputs import add_input_arguments
    from verl_top.sources.ray import build_ray_source

    daemon = sshd_factory.start()
    settings = make_settings(tmp_path, ssh_keys, [daemon], remote_python)
    # Ray names the node by IP; the SSH port comes from ssh_config, as a user would set it.
    Path(settings.ssh_config).write_text(f"Host {daemon.addr}\n  Port {daemon.port}\n  User root\n")
    fake.nodes = [node_row("head", daemon.addr, gpus=2.0)]
    parser = argparse.ArgumentParser()
    add_input_arguments(parser)
    args = parser.parse_args(
        [
            "--ray",
            fake.url,
            "--ssh-config",
            settings.ssh_config,
            "-i",
            settings.identities[0],
            "--known-hosts",
            settings.known_hosts,
            "--interval",
            "0.25",
            "--backend",
            "replay",
            "--replay-trace",
            str(h200_trace),
        ]
    )
    source = build_ray_source(ray_settings(args, {}, find_driver_log=False))
    assert [n.local for n in source._nodes] == [False]  # 127.0.0.4x: not this machine's address
    assert not source.running  # nothing connects before run()
    records: list[Any] = []
    task = asyncio.create_task(source.run(records.append))
    try:
        for _ in range(300):
            if sum(1 for r in records if r.TYPE == "gpu" and r.host == daemon.addr) >= 4:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    states = [(r.state, r.reason) for r in records if r.TYPE == "state" and r.host == daemon.addr]
    assert states[:2] == [("connecting", ""), ("up", "")], states
    assert {r.index for r in records if r.TYPE == "gpu" and r.host == daemon.addr} == set(range(8))
