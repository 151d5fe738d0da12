"""The Ray client under hostile dashboards: slow drip, huge replies, deep JSON, bad node IPs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from rawserver import RawServer

from verl_top.sources.ray import (
    MAX_BODY_BYTES,
    NODE_ROW,
    Dashboard,
    RayError,
    RaySource,
    first_look,
    parse_nodes,
)

pytestmark = pytest.mark.timeout(30)


def ask(dash: Dashboard, path: str) -> object:
    """``dash.get(path)`` on a loop of its own, its connections closed after."""

    async def go() -> object:
        try:
            return await dash.get(path)
        finally:
            await dash.close()

    return asyncio.run(go())


def _drip(stop: threading.Event) -> Callable[[socket.socket], None]:
    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{")
        while not stop.is_set():  # one byte every 0.2 s: no read ever times out
            conn.sendall(b" ")
            time.sleep(0.2)

    return serve


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], RawServer]]:
    made: list[RawServer] = []

    def make(serve: Callable[[socket.socket], None]) -> RawServer:
        made.append(RawServer(serve))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_slow_drip_reply_is_cut_at_the_request_deadline(server) -> None:
    stop = threading.Event()
    srv = server(_drip(stop))
    t0 = time.monotonic()
    with pytest.raises(RayError, match=r"no complete answer within 1 s"):
        ask(Dashboard(srv.url, deadline=1.0), "/api/v0/nodes")
    assert time.monotonic() - t0 < 3.0  # before: hung for as long as the server dripped
    stop.set()


def test_a_300_mb_reply_is_refused_before_it_is_read(server) -> None:
    sent = {"n": 0}

    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 300000000\r\n\r\n")
        chunk = b"0" * 65536
        for _ in range(300_000_000 // 65536):
            conn.sendall(chunk)
            sent["n"] += len(chunk)

    srv = server(serve)
    with pytest.raises(RayError, match=r"an answer of 300000000 bytes refused"):
        ask(Dashboard(srv.url), "/api/v0/nodes")


def test_a_huge_reply_without_length_stops_at_the_cap(server) -> None:
    # A well-formed list reply that never ends: rows of 2 KB (fewer than the row cap fit in
    # 64 MiB), so the byte cap is what stops it.
    def serve(conn: socket.socket) -> None:
        head = b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"result": true, "data": '
        conn.sendall(head + b'{"result": {"result": [')
        row = b'{"node_id": "' + b"x" * 2000 + b'"},'
        for _ in range(300_000_000 // len(row)):
            conn.sendall(row)

    srv = server(serve)
    dash = Dashboard(srv.url, deadline=20.0)

    async def go() -> None:
        try:
            await dash.state("/api/v0/nodes", convert=NODE_ROW)
        finally:
            await dash.close()

    with pytest.raises(RayError, match=rf"larger than {MAX_BODY_BYTES} bytes refused"):
        asyncio.run(go())


def test_deeply_nested_json_is_refused_not_a_recursion_error(server) -> None:
    body = b'{"result": true, "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"

    def serve(conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)

    srv = server(serve)
    with pytest.raises(RayError, match="nested deeper than 64"):
        ask(Dashboard(srv.url), "/api/v0/nodes")


@pytest.mark.parametrize(
    "ip",
    ["-oProxyCommand=touch /tmp/x", "10.0.0.1 -p 23", "node'1", "1.2.3.4.5", "", "fe80::1%e th0"],
)
def test_a_node_with_a_bad_ip_is_refused_with_its_node_id(ip: str) -> None:
    rows = {"result": [{"node_id": "abc123", "node_ip": ip, "state": "ALIVE"}]}
    refused: list[str] = []
    assert parse_nodes(rows, refused) == []
    if ip:
        assert refused and refused[0].startswith("Ray node abc123: bad ")


def test_good_ips_pass() -> None:
    rows = {
        "result": [
            {"node_id": "a", "node_ip": "10.0.0.1", "state": "ALIVE"},
            {"node_id": "b", "node_ip": "fe80::1%eth0", "state": "ALIVE"},
        ]
    }
    assert [n.ip for n in parse_nodes(rows)] == ["10.0.0.1", "fe80::1%eth0"]


async def test_shutdown_does_not_wait_for_a_dripping_request(server) -> None:
    """The source is cancelled while the dashboard drips: it stops at once (asyncio.to_thread
    kept asyncio.run's shutdown waiting for the thread)."""
    stop = threading.Event()
    srv = server(_drip(stop))
    source = RaySource(Dashboard(srv.url, deadline=30.0), lambda n: None, local_names=set())
    task = asyncio.create_task(source.run(lambda r: None))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert time.monotonic() - t0 < 0.5
    stop.set()


def test_fetch_view_with_only_bad_nodes_says_why(server) -> None:
    reply = {
        "result": True,
        "msg": "",
        "data": {"result": {"total": 1, "result": [{"node_id": "n9", "node_ip": "-x"}]}},
    }
    body = json.dumps(reply).encode()

    def serve(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    srv = server(serve)
    with pytest.raises(RayError, match=r"lists no node that can be monitored \(Ray node n9: bad"):
        first_look(Dashboard(srv.url))


def test_server_text_in_errors_is_cleaned(server) -> None:
    body = b"\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2Jnope [link=http://x]y[/link]"

    def serve(conn: socket.socket) -> None:
        head = f"HTTP/1.1 500 Oops\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)

    srv = server(serve)
    with pytest.raises(RayError) as err:
        ask(Dashboard(srv.url), "/api/v0/nodes")
    from verl_top.untrusted import is_clean

    assert is_clean(str(err.value))
    assert "HTTP 500: nope [link=http://x]y[/link]" in str(err.value)
