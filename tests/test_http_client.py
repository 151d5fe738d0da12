"""The shared HTTP client (verl_top/sources/http_client.py) for Prometheus and the Ray dashboard.

Against the real Prometheus (Debian's /usr/bin/prometheus) behind its own ``--web.config.file``:
TLS with a certificate signed by a CA made here, client certificates required, basic auth; and
against small local servers for what a real one will not do on demand: drip its headers, send
a gzip bomb, count connections, record the headers it was sent.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rawserver import BodyServer, ConnectProxy, RawServer, constant

from verl_top.sources.http_client import HttpOptions, parse_header
from verl_top.sources.prometheus import PromClient, PromError, PromSettings
from verl_top.sources.ray import Dashboard, RayError, first_look

pytestmark = pytest.mark.timeout(90)
TLS_ADDR = "127.0.0.93"
VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


def ask(client: PromClient, expr: str = "vector(42)") -> Any:
    """One instant query on a loop of its own, the client's connections closed after."""

    async def go() -> Any:
        try:
            return await client.query(expr, time.time())
        finally:
            await client.close()

    return asyncio.run(go())


# --- certificates ---------------------------------------------------------------------------


def _pki(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for TLS_ADDR and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    out: dict[str, Path] = {}

    def write(name: str, key: Any, cert: Any) -> None:
        (tmp / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (tmp / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[name], out[f"{name}_key"] = tmp / f"{name}.pem", tmp / f"{name}.key"

    def build(subject: str, key: Any, issuer: Any, issuer_key: Any, ca: bool, usage: Any) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if subject == TLS_ADDR:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(TLS_ADDR))]),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "verl-top test CA")])
    write("ca", ca_key, build("verl-top test CA", ca_key, ca_name, ca_key, True, None))
    for name, subject, usage in (
        ("server", TLS_ADDR, ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", "verl-top", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, key, build(subject, key, ca_name, ca_key, False, usage))
    return out


def _bcrypt(password: str) -> str:
    with warnings.catch_warnings():  # crypt is deprecated (3.11) but libxcrypt does bcrypt
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))


@pytest.fixture(scope="module")
def tls_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real Prometheus serving only TLS, wanting a client certificate from our CA and the
    basic-auth user alice (password wonderland), configured by its own --web.config.file."""
    from promserver import PROMETHEUS, PromServer

    if not os.path.exists(PROMETHEUS):
        message = f"{PROMETHEUS} is not installed (.ci/run installs the prometheus package)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a skip there would hide a lost test
        pytest.skip(message)
    tmp = tmp_path_factory.mktemp("tls-prom")
    pki = _pki(tmp)
    web = tmp / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki['server']}\n  key_file: {pki['server_key']}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"
        f"basic_auth_users:\n  alice: {_bcrypt('wonderland')}\n"
    )
    server = PromServer(tmp / "prom", {}, addr=TLS_ADDR, web_config=web)
    good = HttpOptions(
        ca_file=str(pki["ca"]), cert_file=str(pki["client"]), key_file=str(pki["client_key"])
    )
    url = f"https://alice:wonderland@{TLS_ADDR}:{server.port}"
    deadline = time.monotonic() + 30
    try:
        while True:  # ready when an authenticated query answers
            try:
                ask(PromClient(url, 2.0, good))
                break
            except PromError:
                if time.monotonic() > deadline or server.proc.poll() is not None:
                    raise AssertionError(
                        f"TLS Prometheus did not start: {server.log_text()}"
                    ) from None
                time.sleep(0.3)
        yield {"server": server, "pki": pki, "good": good, "url": url}
    finally:
        server.stop()


def test_prometheus_over_mutual_tls_with_basic_auth_answers(tls_prom: dict) -> None:
    (series,) = ask(PromClient(tls_prom["url"], 3.0, tls_prom["good"]))
    assert series.last() == 42.0


def test_a_wrong_password_is_refused_access(tls_prom: dict) -> None:
    url = tls_prom["url"].replace("wonderland", "looking-glass")
    with pytest.raises(PromError, match=r"refused access \(HTTP 401\)"):
        ask(PromClient(url, 3.0, tls_prom["good"]))


def test_an_untrusted_server_certificate_is_named(tls_prom: dict) -> None:
    pki = tls_prom["pki"]
    options = HttpOptions(cert_file=str(pki["client"]), key_file=str(pki["client_key"]))
    with pytest.raises(PromError, match="TLS certificate not trusted"):
        ask(PromClient(tls_prom["url"], 3.0, options))


def test_without_the_client_certificate_the_tls_handshake_fails(tls_prom: dict) -> None:
    options = HttpOptions(ca_file=str(tls_prom["pki"]["ca"]))
    with pytest.raises(PromError, match=r"cannot reach Prometheus|not answer as an HTTP"):
        ask(PromClient(tls_prom["url"], 3.0, options))


def test_https_proxy_from_the_environment_is_used(
    tls_prom: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = ConnectProxy()
    try:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        (series,) = ask(PromClient(tls_prom["url"], 3.0, tls_prom["good"]))
    finally:
        proxy.close()
    assert series.last() == 42.0
    assert proxy.targets == [f"{TLS_ADDR}:{tls_prom['server'].port}"]


# --- headers, tokens, options -----------------------------------------------------------------


@pytest.fixture
def recorder() -> Iterator[BodyServer]:
    rec = BodyServer(constant(json.dumps(VECTOR).encode()))
    yield rec
    rec.close()


def test_bearer_token_file_is_read_again_when_it_changes_and_headers_are_sent(
    recorder: BodyServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    options = HttpOptions(
        headers=(parse_header("X-Scope-OrgID: team-a"),), bearer_token_file=str(token)
    )
    client = PromClient(recorder.url, 3.0, options)

    async def twice() -> None:
        try:
            await client.query("up", 1.0)
            token.write_text("second-token\n")
            os.utime(token, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime for sure
            await client.query("up", 1.0)
        finally:
            await client.close()

    asyncio.run(twice())
    auth = [h.get("Authorization") for h in recorder.headers]
    assert auth == ["Bearer first-token", "Bearer second-token"]
    assert all(h.get("X-Scope-OrgID") == "team-a" for h in recorder.headers)
    assert all("gzip" in h.get("Accept-Encoding", "") for h in recorder.headers)


def test_a_round_reuses_connections(recorder: BodyServer) -> None:
    client = PromClient(recorder.url, 3.0, connections=8)

    async def round_of_32() -> None:
        try:
            await asyncio.gather(*(client.query(f"q{i}", 1.0) for i in range(32)))
            await asyncio.gather(*(client.query(f"q{i}", 2.0) for i in range(32)))
        finally:
            await client.close()

    asyncio.run(round_of_32())
    assert len(recorder.headers) == 64
    assert recorder.connections <= 8  # the old HTTP/1.0 client opened 64


def test_bad_options_are_said_before_any_request(tmp_path: Path) -> None:
    for text, words in (
        ("X-Scope-OrgID", "want NAME:VALUE"),
        ("Bad Name: x", "want NAME:VALUE"),
        ("X-Evil: a\r\nHost: b", "control character"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_header(text)
    with pytest.raises(ValueError, match=r"--prom-bearer-token-file .*: no such file"):
        PromSettings(url="http://p:9090", http=HttpOptions(bearer_token_file=str(tmp_path / "x")))
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate")
    with pytest.raises(ValueError, match="--prom-ca-file/cert-file"):
        PromSettings(url="https://p:9090", http=HttpOptions(ca_file=str(bad_ca)))


def test_an_empty_token_file_is_a_clear_error(recorder: BodyServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("\n")
    with pytest.raises(PromError, match=rf"bearer token file {token} is empty"):
        ask(PromClient(recorder.url, 3.0, HttpOptions(bearer_token_file=str(token))))


# --- hostile servers ----------------------------------------------------------------------------


def _drip_headers(stop: threading.Event) -> Any:
    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.is_set():  # a header that never ends, one byte every 0.1 s
            conn.sendall(b"X")
            time.sleep(0.1)

    return serve


@pytest.fixture
def dripping() -> Iterator[RawServer]:
    stop = threading.Event()
    srv = RawServer(_drip_headers(stop))
    yield srv
    stop.set()
    srv.close()


def test_prometheus_dripping_its_headers_is_cut_at_the_deadline(dripping: RawServer) -> None:
    t0 = time.monotonic()
    with pytest.raises(PromError, match=r"did not answer within 1 s"):
        ask(PromClient(dripping.url, 1.0))
    assert time.monotonic() - t0 < 2.5


def test_a_ray_dashboard_dripping_its_headers_is_cut_at_the_deadline(dripping: RawServer) -> None:
    """Before: urllib's per-read timeout never fired, 200 bytes took 22 s (unbounded)."""
    t0 = time.monotonic()
    with pytest.raises(RayError, match=r"no answer within 1 s"):
        first_look(Dashboard(dripping.url, deadline=1.0))
    assert time.monotonic() - t0 < 2.5


def test_a_gzip_answer_is_decoded_and_a_gzip_bomb_stops_at_the_cap() -> None:
    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"Hostname": "n1", "gpu": "0"}, "value": [1.0, "7.5"]}],
        },
    }
    good = BodyServer(constant(json.dumps(doc).encode(), packed=True))
    try:
        (series,) = ask(PromClient(good.url, 3.0))
    finally:
        good.close()
    assert series.labels == {"Hostname": "n1", "gpu": "0"} and series.last() == 7.5
    # ~200 KB on the wire, 200 MB of spaces once inflated (a JSON document may hold them).
    head = b'{"status":"success","data":{"resultType":"vector","result":['
    bomb = BodyServer(constant(head + b" " * 200_000_000, packed=True))
    try:
        t0 = time.monotonic()
        with pytest.raises(PromError, match=r"larger than 67108864 bytes refused"):
            ask(PromClient(bomb.url, 30.0))
        took = time.monotonic() - t0
    finally:
        bomb.close()
    assert took < 20.0  # inflating and scanning stop at the 64 MiB cap
