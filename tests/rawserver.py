"""Small TCP servers for the HTTP client tests: hostile peers and a CONNECT proxy.

``RawServer`` hands every accepted connection, after reading the request, to ``serve(conn)``
in a thread of its own (a server that drips, lies about its length, or never answers).
``ConnectProxy`` is an HTTP proxy that only knows ``CONNECT`` (what a client sends through
``HTTPS_PROXY``) and records the targets it was asked for.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable


class RawServer:
    """A TCP server on ``addr`` whose every connection is handled by ``serve(conn)``."""

    def __init__(
        self, serve: Callable[[socket.socket], None], addr: str = "127.0.0.1", read: bool = True
    ) -> None:
        self.read = read  # read (and ignore) the request before serve() answers
        self.sock = socket.socket()
        self.sock.bind((addr, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{addr}:{self.port}"
        self.serve = serve
        self.stop = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self.read:
                conn.recv(65536)
            self.serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1: tunnels bytes both ways, records each target."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.server = RawServer(self._tunnel, read=False)
        self.url = self.server.url

    def _tunnel(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        method, target = head.split(b" ", 2)[:2]
        if method != b"CONNECT":
            conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        self.targets.append(target.decode())
        host, _, port = target.decode().rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pump = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        pump.start()
        _pump(conn, upstream)
        pump.join(timeout=10)
        upstream.close()

    def close(self) -> None:
        self.server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends; then end ``dst``'s sending side."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class BodyServer:
    """An HTTP/1.1 keep-alive server on 127.0.0.1: ``answer(path)`` gives (body, gzip) for each
    GET. Records every request's headers and counts the connections it accepted."""

    def __init__(self, answer: Callable[[str], tuple[bytes, bool]]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.headers: list[dict[str, str]] = []
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.headers.append(dict(self.headers.items()))
                body, packed = answer(self.path)
                data = gzip.compress(body, compresslevel=1) if packed else body
                self.send_response(200)
                if packed:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def constant(body: bytes, packed: bool = False) -> Callable[[str], tuple[bytes, bool]]:
    """An ``answer`` for BodyServer: the same body for every path."""
    return lambda _path: (body, packed)
