"""One asynchronous HTTP client for the services verl-top talks to: Prometheus and the Ray
dashboard (GET), and the ``export-metrics --webhook`` push (POST).

Built on aiohttp (asyncio-native, maintained by aio-libs, already installed wherever Ray's
dashboard runs): pooled keep-alive connections, gzip/deflate, TLS with a CA bundle and a client
certificate, ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` from the environment. What verl-top adds
is the boundary every answer crosses:

- **one deadline per request** covering connect, TLS, headers and body together: a server that
  drips its headers or its body one byte at a time is cut there, never later;
- **a bounded body**: a larger ``Content-Length`` is refused before reading, a body without one
  is cut at ``max_body`` bytes (counted after decompression, so a gzip bomb stops there too);
- **a streamed JSON decode** (:class:`verl_top.untrusted.JsonArrayStream`): the large array of an
  answer is decoded item by item as the body arrives, so memory follows what is kept, not the
  size of the answer.

Failures are :class:`HttpError` with a ``kind`` the callers turn into their own sentences.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import os
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from verl_top.deadline import time_limit
from verl_top.untrusted import JsonArrayStream, UntrustedJSONError, clean_text

__all__ = ["HttpClient", "HttpError", "HttpOptions", "parse_header", "run_blocking", "time_limit"]

MAX_BODY = 64 * 1024 * 1024
READ_CHUNK = 64 * 1024
ERROR_BODY = 64 * 1024  # bytes of a non-2xx answer kept for its message
MAX_REDIRECTS = 3  # same-origin 307/308 hops a POST follows
# RFC 9110 token characters: a header name. A value may not hold CR, LF or other controls.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class HttpError(Exception):
    """A request that gave no usable answer; the message is the reason alone (callers say
    which service and URL).

    ``kind``: ``config`` (our own settings: an unreadable token file), ``refused`` (connection
    refused), ``dns`` (unknown host), ``timeout`` (the deadline passed; ``got`` bytes so far),
    ``tls``, ``proxy``, ``unreachable`` (other network errors), ``not_http`` (the peer does not
    speak HTTP), ``too_large``, ``status`` (an HTTP error status; ``status`` and ``body``),
    ``redirect`` (a POST redirected to another host, or too often).
    """

    def __init__(
        self, kind: str, message: str, status: int | None = None, body: bytes = b"", got: int = 0
    ) -> None:
        super().__init__(clean_text(message, 2048))
        self.kind = kind
        self.status = status
        self.body = body
        self.got = got


def parse_header(text: str) -> tuple[str, str]:
    """``NAME:VALUE`` (``--prom-header``) as a header pair; ValueError naming what is wrong.

    The value is never repeated in the message: headers carry tenant ids and tokens.
    """
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _TOKEN.match(name):
        raise ValueError(
            f"--prom-header {clean_text(name, 60)!r}: want NAME:VALUE with a header name of "
            "letters, digits and -"
        )
    if _BAD_VALUE.search(value):
        raise ValueError(f"--prom-header {name}: the value holds a control character")
    return name, value


@dataclass(frozen=True)
class HttpOptions:
    """How to reach a service: extra headers, a bearer token file, TLS files.

    ``bearer_token_file`` is read again whenever it changes (tokens of managed services
    rotate), like Prometheus' own ``bearer_token_file``.
    """

    headers: tuple[tuple[str, str], ...] = ()
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    proxy_from_env: bool = True

    def check(self, flag: str = "--prom") -> None:
        """ValueError naming the flag when a file cannot be used (said before any request)."""
        for what, path in (
            ("bearer-token-file", self.bearer_token_file),
            ("ca-file", self.ca_file),
            ("cert-file", self.cert_file),
            ("key-file", self.key_file),
        ):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{flag}-{what} {path}: no such file")
        if self.key_file and not self.cert_file:
            raise ValueError(f"{flag}-key-file needs {flag}-cert-file")
        try:
            self.ssl_context()
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"{flag}-ca-file/cert-file: {clean_text(exc, 200)}") from None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: the system's CAs or ``ca_file``, and the client certificate."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass
class _TokenFile:
    path: str
    mtime_ns: int = -1
    value: str = ""

    def read(self) -> str:
        try:
            stat = os.stat(self.path)
            if stat.st_mtime_ns != self.mtime_ns:
                with open(self.path, encoding="utf-8") as fh:
                    self.value = fh.read(64 * 1024).strip()
                self.mtime_ns = stat.st_mtime_ns
        except OSError as exc:
            raise HttpError(
                "config", f"bearer token file {self.path}: {exc.strerror or exc}"
            ) from None
        if not self.value:
            raise HttpError("config", f"bearer token file {self.path} is empty")
        return self.value


@dataclass
class JsonAnswer:
    """A decoded JSON answer: the document (the streamed array holds the converted items)."""

    status: int
    doc: dict[str, Any]
    dropped: int = 0  # array items the converter refused
    truncated: bool = False  # the item cap was reached; the rest was not read
    nbytes: int = 0


@dataclass
class HttpClient:
    """GETs against one base URL with pooled connections; see the module docstring.

    The aiohttp session belongs to the event loop that made it: it is made on first use and
    made again when the loop changed (``build_ray_source`` takes a first look in a loop of its
    own). Call :meth:`close` when done.
    """

    base_url: str
    options: HttpOptions = field(default_factory=HttpOptions)
    deadline: float = 10.0
    max_body: int = MAX_BODY
    connections: int = 8
    requests: int = 0
    nbytes: int = 0
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _token: _TokenFile | None = field(default=None, repr=False)
    _basic: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.base_url.rstrip("/"))
        if parts.username is not None:  # http://user:pass@host: basic auth, kept out of the URL
            user = urllib.parse.unquote(parts.username)
            secret = urllib.parse.unquote(parts.password or "")
            self._basic = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
            parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        self.base_url = urllib.parse.urlunsplit(parts)
        if self.options.bearer_token_file:
            self._token = _TokenFile(self.options.bearer_token_file)

    @property
    def shown(self) -> str:
        """The base URL without credentials (for messages)."""
        parts = urllib.parse.urlsplit(self.base_url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "verl-top"}
        token = self._token.read() if self._token else self.options.bearer_token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._basic:
            headers["Authorization"] = self._basic
        headers.update(self.options.headers)  # the user's own headers win
        return headers

    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            tls = self.options.ssl_context() if self.base_url.startswith("https:") else None
            connector = aiohttp.TCPConnector(
                limit=max(1, self.connections), ssl=tls if tls is not None else True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=self.options.proxy_from_env,  # HTTPS_PROXY, HTTP_PROXY, NO_PROXY
                timeout=aiohttp.ClientTimeout(total=None),  # our own deadline covers it all
                raise_for_status=False,
            )
            self._loop = loop
        return self._session

    async def close(self) -> None:
        """Close the pooled connections (safe to call twice, and to use the client again)."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                await session.close()
            except RuntimeError:  # its loop is gone: nothing left to close politely
                pass

    async def get_json(
        self,
        path: str,
        params: Sequence[tuple[str, str]] | Mapping[str, str] = (),
        array: tuple[str, ...] = (),
        convert: Callable[[Any], Any] | None = None,
        max_items: int = 100_000,
        max_item: int = 1 << 20,
        max_other: int = 1 << 20,
    ) -> JsonAnswer:
        """``GET path?params`` decoded as a JSON object, the array at ``array`` streamed.

        HttpError for any failure; a 2xx answer that is not such JSON raises HttpError kind
        ``not_json``. Error statuses raise kind ``status`` with the first bytes of the body.
        """
        stream = JsonArrayStream(array, convert, max_items, max_item, max_other)
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # arrives as the request completes, and a cancelled source then never stopped.
            async with time_limit(self.deadline):
                status, nbytes = await self._request(path, params, stream)
        except asyncio.TimeoutError:
            raise HttpError(
                "timeout",
                f"no complete answer within {self.deadline:g} s ({stream.chars} characters so far)",
                got=stream.chars,
            ) from None
        try:
            doc = stream.finish()
        except UntrustedJSONError as exc:
            raise HttpError("not_json", str(exc), status=status) from None
        return JsonAnswer(status, doc, stream.dropped, stream.truncated, nbytes)

    async def get_bytes(
        self,
        path: str,
        params: Sequence[tuple[str, str]] | Mapping[str, str] = (),
        accept: str = "*/*",
    ) -> bytes:
        """``GET path?params`` as raw bytes (at most ``max_body``, within the deadline);
        HttpError for any failure or an error status."""
        session = self._session_now()
        headers = {**self._headers(), "Accept": accept}
        self.requests += 1
        try:
            async with time_limit(self.deadline):
                with _request_errors():
                    async with session.get(
                        f"{self.base_url}{path}", params=params, headers=headers
                    ) as resp:
                        if not 200 <= resp.status < 300:
                            body = await _head(resp, ERROR_BODY)
                            raise HttpError("status", f"HTTP {resp.status}", resp.status, body)
                        out = bytearray()
                        async for chunk in resp.content.iter_chunked(READ_CHUNK):
                            out += chunk
                            self.nbytes += len(chunk)
                            if len(out) > self.max_body:
                                raise HttpError(
                                    "too_large",
                                    f"an answer larger than {self.max_body} bytes refused",
                                )
                        return bytes(out)
        except asyncio.TimeoutError:
            raise HttpError("timeout", f"no complete answer within {self.deadline:g} s") from None

    async def post(
        self, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """``POST body`` to ``path``: (status, the first ``ERROR_BODY`` bytes of the answer).

        One deadline covers connect, TLS, sending, the answer's headers and what is read of its
        body. A ``307``/``308`` redirect (the ones that keep the method and body) is followed
        at most ``MAX_REDIRECTS`` times and only to the same scheme, host and port: the body
        never goes to a host the user did not name (HttpError ``redirect``). Other statuses,
        other redirects included, are returned as they are. HttpError for any failure.
        """
        session = self._session_now()
        headers = {**self._headers(), "Content-Type": content_type}
        url = f"{self.base_url}{path}"
        self.requests += 1
        try:
            async with time_limit(self.deadline):
                with _request_errors():
                    for _ in range(MAX_REDIRECTS + 1):
                        async with session.post(
                            url, data=body, headers=headers, allow_redirects=False
                        ) as resp:
                            if resp.status not in (307, 308):
                                return resp.status, await _head(resp, ERROR_BODY)
                            url = _same_origin(url, resp.headers.get("Location", ""))
                    raise HttpError("redirect", f"more than {MAX_REDIRECTS} redirects")
        except asyncio.TimeoutError:
            raise HttpError("timeout", f"no complete answer within {self.deadline:g} s") from None

    async def _request(self, path: str, params: Any, stream: JsonArrayStream) -> tuple[int, int]:
        self.requests += 1
        session = self._session_now()
        url = f"{self.base_url}{path}"
        with _request_errors():
            async with session.get(url, params=params, headers=self._headers()) as resp:
                if not 200 <= resp.status < 300:
                    body = await _head(resp, ERROR_BODY)
                    raise HttpError("status", f"HTTP {resp.status}", resp.status, body)
                length = resp.content_length
                if length is not None and length > self.max_body:
                    raise HttpError(
                        "too_large",
                        f"an answer of {length} bytes refused (at most {self.max_body})",
                    )
                return resp.status, await self._read(resp, path, stream)

    async def _read(self, resp: aiohttp.ClientResponse, path: str, stream: JsonArrayStream) -> int:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        size = 0
        async for chunk in resp.content.iter_chunked(READ_CHUNK):
            size += len(chunk)
            self.nbytes += len(chunk)
            if size > self.max_body:
                raise HttpError("too_large", f"an answer larger than {self.max_body} bytes refused")
            try:
                stream.feed(decoder.decode(chunk))
            except UntrustedJSONError as exc:
                raise HttpError("not_json", str(exc), resp.status) from None
            if stream.done:
                break  # the document is complete, or the item cap says stop reading
            # A chunk already received is handed over without a pause: a 6 MB answer from a
            # near Prometheus was decoded in one turn of the loop (140-400 ms without a frame).
            await asyncio.sleep(0)
        stream.feed(decoder.decode(b"", final=True))
        return size

    @staticmethod
    def _network_error(exc: aiohttp.ClientError) -> HttpError:
        if isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
            return HttpError("proxy", f"the proxy failed ({exc})")
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return HttpError("tls", f"TLS certificate not trusted ({exc.certificate_error})")
        if isinstance(exc, aiohttp.ClientSSLError):
            return HttpError("tls", f"TLS error ({exc})")
        if isinstance(exc, aiohttp.ClientConnectorDNSError):
            return HttpError("dns", "unknown host name")
        if isinstance(exc, aiohttp.ClientConnectorError):
            cause = exc.os_error
            if isinstance(cause, ConnectionRefusedError):
                return HttpError("refused", "connection refused")
            return HttpError("unreachable", str(cause.strerror or cause))
        if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ServerDisconnectedError):
            return HttpError("not_http", f"not an HTTP answer ({type(exc).__name__}: {exc})")
        if isinstance(exc, aiohttp.ClientPayloadError):
            return HttpError("not_http", f"the answer was cut or garbled ({exc})")
        return HttpError("unreachable", f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _request_errors() -> Iterator[None]:
    """A request's failures as HttpError (the client's own pass through unchanged)."""
    try:
        yield
    except HttpError:
        raise
    except aiohttp.ClientError as exc:
        raise HttpClient._network_error(exc) from None  # noqa: SLF001 - this module's own
    except ssl.SSLError as exc:
        raise HttpError("tls", f"TLS error: {exc}") from None
    except OSError as exc:
        raise HttpError("unreachable", str(exc.strerror or exc)) from None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _same_origin(url: str, location: str) -> str:
    """Where a redirect from ``url`` goes, when that is the same scheme, host and port; else
    HttpError ``redirect`` naming the other host only (a webhook's path is its secret)."""
    target = urllib.parse.urljoin(url, location.strip())
    if not location.strip() or _origin(target) != _origin(url):
        scheme, host, port = _origin(target)
        where = f"{scheme}://{host}:{port}" if host else "an empty location"
        raise HttpError("redirect", f"redirected to {where}, another host: not followed")
    return target


async def _head(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of a body (an error answer's message)."""
    out = bytearray()
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        out += chunk[: limit - len(out)]
        if len(out) >= limit:
            break
    return bytes(out)


def run_blocking(make: Callable[[], Any]) -> Any:
    """Run the coroutine ``make()`` to its end from synchronous code.

    In a thread with its own loop when the caller already runs one (a test, or a source built
    from inside the app), else with ``asyncio.run``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(make())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="verl-top-http-first-look", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")
