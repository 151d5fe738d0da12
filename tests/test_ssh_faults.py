"""SSH failure modes against real sshd daemons: every one becomes a host state with a reason."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import asyncssh
import psutil
import pytest
from sshd import (
    Collector,
    SshDaemon,
    SshdFactory,
    agent_args,
    free_port,
    make_settings,
    running,
    spec_for,
)

from verl_top.sources.hosts import HostSpec
from verl_top.sources.ssh import UNKNOWN_HOST_REASON, SshSource

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]


def state_is(c: Collector, host: str, state: str):  # noqa: ANN201
    return lambda: (c.last_state(host) or ("",))[0] == state


async def test_wrong_client_key_is_auth_failed(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    settings = make_settings(
        tmp_path, ssh_keys, [d], remote_python, identities=(str(ssh_keys["wrong"]),)
    )
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(state_is(c, d.name, "auth_failed"), 10)
    _, reason = c.last_state(d.name)
    assert "refused login as root" in reason
    assert str(ssh_keys["wrong"]) in reason  # says which key was tried
    assert "retry in 60 s" in reason  # long backoff: a person must act


async def test_changed_host_key_is_refused(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    old = asyncssh.generate_private_key("ssh-ed25519")
    Path(settings.known_hosts).write_text(d.known_hosts_line(old))  # the node "was reinstalled"
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(state_is(c, d.name, "hostkey_changed"), 10)
    _, reason = c.last_state(d.name)
    assert d.host_key.get_fingerprint() in reason  # the key the server offers now
    assert f"ssh-keygen -R '[{d.addr}]:{d.port}'" in reason
    assert Path(settings.known_hosts).read_text() == d.known_hosts_line(old)  # untouched


async def test_unknown_host_is_down_unless_accept_new_hosts(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    other = sshd_pool.start()
    strict = make_settings(tmp_path, ssh_keys, [other], remote_python)
    known = Path(strict.known_hosts)
    before = known.read_text()
    c = Collector()
    async with running([SshSource(spec_for(d), strict, agent_args(h200_trace))], c):
        await c.wait(state_is(c, d.name, "down"), 10)
    assert c.last_state(d.name)[1].startswith(UNKNOWN_HOST_REASON)
    assert known.read_text() == before

    accept = make_settings(tmp_path, ssh_keys, [other], remote_python, accept_new_hosts=True)
    c = Collector()
    async with running([SshSource(spec_for(d), accept, agent_args(h200_trace))], c):
        await c.wait(lambda: c.count(d.name, "gpu") >= 1, 10)
    assert known.read_text() == before + d.known_hosts_line()

    # Accept-new never overrides a changed key.
    known.write_text(d.known_hosts_line(asyncssh.generate_private_key("ssh-ed25519")))
    c = Collector()
    async with running([SshSource(spec_for(d), accept, agent_args(h200_trace))], c):
        await c.wait(state_is(c, d.name, "hostkey_changed"), 10)


async def test_silent_tcp_server_times_out(
    tmp_path: Path, ssh_keys, h200_trace: Path, remote_python: str
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # accept, never speak SSH

    server = await asyncio.start_server(silent, "127.0.0.30", 0)
    port = server.sockets[0].getsockname()[1]
    settings = make_settings(tmp_path, ssh_keys, [], remote_python, connect_timeout=1.5)
    spec = HostSpec("root", "127.0.0.30", port)
    c = Collector()
    try:
        t0 = time.monotonic()
        async with running([SshSource(spec, settings, agent_args(h200_trace))], c):
            await c.wait(state_is(c, spec.name, "down"), 5)
            took = time.monotonic() - t0
    finally:
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
    print(f"silent server: down after {took:.2f} s (connect timeout 1.5 s)")
    assert accepted
    assert "timed out after 1.5 s" in c.last_state(spec.name)[1]
    assert 1.4 <= took <= 2.5


async def test_refused_port_is_down_at_once(
    tmp_path: Path, ssh_keys, h200_trace: Path, remote_python: str
) -> None:
    port = free_port("127.0.0.31")  # nothing listens there
    settings = make_settings(tmp_path, ssh_keys, [], remote_python)
    spec = HostSpec("root", "127.0.0.31", port)
    c = Collector()
    async with running([SshSource(spec, settings, agent_args(h200_trace))], c):
        waited = await c.wait(state_is(c, spec.name, "down"), 5)
        assert waited < 1.0
        assert c.last_state(spec.name)[1].startswith("connection refused")
        downs = lambda: [r for s, r in c.states(spec.name) if s == "down"]  # noqa: E731
        await c.wait(lambda: len(downs()) >= 5, 6)
    # Backoff 0.2 s doubling to the 1 s cap, each with +-20 % jitter.
    delays = [float(r.rsplit("retry in ", 1)[1].split()[0]) for r in downs()[:5]]
    for got, base in zip(delays, [0.2, 0.4, 0.8, 1.0, 1.0], strict=True):
        assert 0.8 * base - 0.05 <= got <= 1.2 * base + 0.05, delays


def _stop_sessions(d: SshDaemon) -> list[int]:
    """SIGSTOP the sshd processes serving connections (not the listener, not the agent)."""
    stopped = []
    for pid in d.session_pids():
        try:
            if psutil.Process(pid).name() == "sshd":
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        except psutil.NoSuchProcess:
            pass
    return stopped


async def test_stalled_session_is_caught_by_keepalive(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_factory.start()
    # Default keepalive settings (1 s interval, 3 misses).
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(lambda: c.count(d.name, "gpu") >= 2, 10)
        stopped = _stop_sessions(d)
        assert stopped
        t0 = time.monotonic()
        try:
            await c.wait(state_is(c, d.name, "down"), 8)
            took = time.monotonic() - t0
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    print(f"stalled session: keepalive timeout after {took:.2f} s")
    assert c.last_state(d.name)[1].startswith("keepalive timeout")
    assert took <= 5.5


async def test_dead_bastion_fails_all_nodes_once_not_in_turn(
    tmp_path: Path, ssh_keys, h200_trace: Path, remote_python: str
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, never speak SSH

    server = await asyncio.start_server(silent, "127.0.0.32", 0)
    port = server.sockets[0].getsockname()[1]
    settings = make_settings(
        tmp_path, ssh_keys, [], remote_python, connect_timeout=1.0, jump=f"127.0.0.32:{port}"
    )
    specs = [HostSpec("root", f"127.0.0.{n}", 22) for n in range(33, 39)]
    c = Collector()
    try:
        async with running([SshSource(s, settings, agent_args(h200_trace)) for s in specs], c):
            # Six nodes queue for one bastion attempt: all fail after ~1 timeout, not six.
            waited = await c.wait(lambda: all(state_is(c, s.name, "down")() for s in specs), 4)
            (bastion,) = settings.shared().bastions.values()
            assert bastion.attempts == 1
    finally:
        server.close()
    print(f"dead bastion: 6 nodes down after {waited:.2f} s")
    for s in specs:
        reason = c.last_state(s.name)[1]
        # The effective target of the failing hop is named.
        assert reason.startswith(
            f"bastion 127.0.0.32: timed out after 1 s connecting to root@127.0.0.32:{port}"
        ), reason


async def test_down_hint_names_the_effective_port_from_the_config(
    tmp_path: Path, ssh_keys, h200_trace: Path, remote_python: str
) -> None:
    port = free_port("127.0.0.31")  # nothing listens there
    settings = make_settings(tmp_path, ssh_keys, [], remote_python)
    Path(settings.ssh_config).write_text(
        f"Host gpu7\n  HostName 127.0.0.31\n  Port {port}\n  User ops\n"
    )
    c = Collector()
    async with running([SshSource(HostSpec(None, "gpu7"), settings, agent_args(h200_trace))], c):
        await c.wait(state_is(c, "gpu7", "down"), 5)
    reason = c.last_state("gpu7")[1]
    assert reason.startswith(
        f"connection refused by ops@127.0.0.31:{port} (is sshd running on port {port}?)"
    ), reason


async def test_config_known_hosts_file_and_strict_no_with_changed_key(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    """The issue's case: a host whose config sets UserKnownHostsFile is reached (no
    --known-hosts); and StrictHostKeyChecking no connects despite a changed key, as ssh does,
    with the warning in the host's reason."""
    own, lax = sshd_pool.start(), sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [], remote_python, known_hosts=None)
    (tmp_path / "cluster_known_hosts").write_text(own.known_hosts_line())
    (tmp_path / "lax_known_hosts").write_text(
        lax.known_hosts_line(asyncssh.generate_private_key("ssh-ed25519"))
    )
    Path(settings.ssh_config).write_text(
        f"Host own\n  HostName {own.addr}\n  Port {own.port}\n"
        f"  UserKnownHostsFile {tmp_path}/cluster_known_hosts\n"
        f"Host lax\n  HostName {lax.addr}\n  Port {lax.port}\n  StrictHostKeyChecking no\n"
        f"  UserKnownHostsFile {tmp_path}/lax_known_hosts\n"
        "Host *\n  User root\n  GlobalKnownHostsFile none\n"
    )
    sources = [
        SshSource(HostSpec(None, name), settings, agent_args(h200_trace)) for name in ("own", "lax")
    ]
    c = Collector()
    async with running(sources, c):
        await c.wait(lambda: c.count("own", "gpu") >= 1 and c.count("lax", "gpu") >= 1, 15)
    assert c.states("own")[1] == ("up", "")
    state, reason = c.states("lax")[1]
    assert state == "up" and reason.startswith("WARNING: host key CHANGED for ")
    assert "connected because StrictHostKeyChecking=no" in reason
