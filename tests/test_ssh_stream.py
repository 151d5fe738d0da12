"""The SSH source against real OpenSSH sshd daemons on 127.0.0.x, running the real agent.

Each host runs the agent's replay backend on the real H200 trace, so every host streams hello
and gpu records exactly as a GPU node would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from sshd import Collector, SshdFactory, agent_args, gone, make_settings, running, spec_for

from verl_top.model import Hello
from verl_top.sources.hosts import HostSpec
from verl_top.sources.ssh import SshSource

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]


def hellos(c: Collector, host: str) -> list[Hello]:
    return [r for r in c.records if isinstance(r, Hello) and r.host == host]


async def test_three_hosts_stream_and_agents_exit_on_disconnect(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    daemons = [sshd_pool.start() for _ in range(3)]
    settings = make_settings(tmp_path, ssh_keys, daemons, remote_python)
    sources = [SshSource(spec_for(d), settings, agent_args(h200_trace)) for d in daemons]
    c = Collector()
    async with running(sources, c):
        waited = await c.wait(lambda: all(c.count(d.name, "gpu") >= 4 for d in daemons), 20)
        print(f"3 hosts: first gpu records after {waited:.2f} s")
        for d in daemons:
            assert c.states(d.name)[:2] == [("connecting", ""), ("up", "")]
            (hello,) = hellos(c, d.name)
            assert hello.backend == "replay"
            assert len(hello.gpus) == 2
            assert hello.pid
            assert {r.index for r in c.records if r.TYPE == "gpu" and r.host == d.name} == {0, 1}
        pids = [hellos(c, d.name)[0].pid for d in daemons]
    # Client gone: every remote agent must exit (stdin EOF / channel closed).
    assert await gone(pids, 5.0), "remote agents still running after the client disconnected"


async def test_killed_host_goes_down_others_keep_streaming_and_it_comes_back(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    daemons = [sshd_factory.start() for _ in range(3)]
    settings = make_settings(tmp_path, ssh_keys, daemons, remote_python)
    sources = [SshSource(spec_for(d), settings, agent_args(h200_trace)) for d in daemons]
    c = Collector()
    victim, others = daemons[0], daemons[1:]
    async with running(sources, c):
        await c.wait(lambda: all(c.count(d.name, "gpu") >= 2 for d in daemons), 20)
        mark = len(c.records)
        t0 = time.monotonic()
        victim.stop()  # listener and its session processes, SIGKILL
        await c.wait(lambda: (c.last_state(victim.name) or ("",))[0] == "down", 10)
        print(f"killed sshd detected after {time.monotonic() - t0:.2f} s")
        state, reason = c.last_state(victim.name)
        assert "closed" in reason or "refused" in reason, reason
        # While it is down the others keep streaming.
        await c.wait(lambda: all(c.count(d.name, "gpu", mark) >= 6 for d in others), 10)
        print("victim states while down:", c.states(victim.name)[-3:])
        # Reconnect attempts meanwhile find nothing listening.
        assert any(s == "down" and "connection refused" in r for s, r in c.states(victim.name))
        sshd_factory.restart(victim)
        t1 = time.monotonic()
        await c.wait(lambda: len(hellos(c, victim.name)) == 2, 10)
        print(f"restarted sshd back up after {time.monotonic() - t1:.2f} s")
        assert c.last_state(victim.name) == ("up", "")
        mark = len(c.records)
        await c.wait(lambda: c.count(victim.name, "gpu", mark) >= 2, 10)


async def test_missing_python_is_no_python(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path
) -> None:
    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], "python3-missing")
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(lambda: (c.last_state(d.name) or ("",))[0] == "no_python", 10)
    state, reason = c.last_state(d.name)
    assert "python3-missing not found on the node" in reason
    assert not hellos(c, d.name)


async def test_jump_flag_uses_one_shared_bastion(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    bastion = sshd_factory.start(log_level="DEBUG1")
    nodes = [sshd_factory.start() for _ in range(3)]
    settings = make_settings(
        tmp_path,
        ssh_keys,
        [bastion, *nodes],
        remote_python,
        jump=f"root@{bastion.addr}:{bastion.port}",
    )
    sources = [SshSource(spec_for(d), settings, agent_args(h200_trace)) for d in nodes]
    c = Collector()
    async with running(sources, c):
        waited = await c.wait(lambda: all(c.count(d.name, "gpu") >= 2 for d in nodes), 20)
        print(f"3 hosts through one bastion: streaming after {waited:.2f} s")
        shared = settings.shared()
        assert [b.connects for b in shared.bastions.values()] == [1]
        assert bastion.accepted_logins() == 1
        log = bastion.log.read_text()
        for d in nodes:  # every node was reached through the bastion's forwarding
            assert f"target {d.addr} port {d.port}" in log
            assert d.accepted_logins() == 1
        # The bastion connection dies: every node goes down, then all come back through
        # one new bastion connection.
        mark = len(c.records)
        for pid in bastion.connection_pids():
            os.kill(pid, signal.SIGKILL)
        await c.wait(lambda: all(c.count(d.name, "hello", mark) == 1 for d in nodes), 15)
        assert all(any(s == "down" for s, _ in c.states(d.name)) for d in nodes)
        assert [b.connects for b in shared.bastions.values()] == [2]
        assert bastion.accepted_logins() == 2


async def test_ssh_config_proxyjump_hostname_port_user_identityfile(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    bastion = sshd_factory.start(log_level="DEBUG1")
    nodes = [sshd_factory.start() for _ in range(2)]
    cfg = tmp_path / "ssh_config"
    text = (
        f"Host jumpbox\n  HostName {bastion.addr}\n  Port {bastion.port}\n  User root\n"
        f"  IdentityFile {ssh_keys['client']}\n"
    )
    for i, d in enumerate(nodes):
        text += f"Host node{i}\n  HostName {d.addr}\n  Port {d.port}\n  ProxyJump jumpbox\n"
    text += f"Host *\n  User root\n  IdentityFile {ssh_keys['client']}\n"
    settings = make_settings(tmp_path, ssh_keys, [bastion, *nodes], remote_python, identities=())
    cfg.write_text(text)  # overwrites the empty config make_settings points at
    sources = [
        SshSource(HostSpec(None, f"node{i}"), settings, agent_args(h200_trace)) for i in range(2)
    ]
    c = Collector()
    async with running(sources, c):
        await c.wait(lambda: all(c.count(f"node{i}", "gpu") >= 2 for i in range(2)), 20)
        assert [b.connects for b in settings.shared().bastions.values()] == [1]
    assert bastion.accepted_logins() == 1
    log = bastion.log.read_text()
    for d in nodes:
        assert f"target {d.addr} port {d.port}" in log


async def test_follows_files_given_at_start_and_over_the_control_channel(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    first = tmp_path / "driver.log"
    first.write_text("step:1 - timing_s/step:10.5\nstep:2 - timing_s/step:9.8\n")
    later = tmp_path / "nccl.log"
    later.write_text("")
    src = SshSource(spec_for(d), settings, agent_args(h200_trace), [("verl+start", str(first))])
    c = Collector()

    def lines(path: Path) -> list[str]:
        return [x for r in c.records if r.TYPE == "log" and r.path == str(path) for x in r.lines]

    async with running([src], c):
        await c.wait(lambda: len(lines(first)) == 2, 10)
        assert lines(first)[1] == "step:2 - timing_s/step:9.8"
        assert src.follow("nccl", str(later))
        await asyncio.sleep(0.6)  # the agent opens it at its next tick, at the end of the file
        with later.open("a") as fh:
            fh.write("NCCL INFO Channel 00/02 : 0 1\n")
        await c.wait(lambda: lines(later) == ["NCCL INFO Channel 00/02 : 0 1"], 10)
    assert {r.kind for r in c.records if r.TYPE == "log"} == {"verl", "nccl"}


async def test_two_hop_proxyjump_chain_from_config(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    """ProxyJump a,b (three sshd): the nodes are reached through a, then b, over one chain
    connection shared by both nodes."""
    hop_a = sshd_factory.start(log_level="DEBUG1")
    hop_b = sshd_factory.start(log_level="DEBUG1")
    nodes = [sshd_factory.start() for _ in range(2)]
    settings = make_settings(
        tmp_path, ssh_keys, [hop_a, hop_b, *nodes], remote_python, identities=()
    )
    text = ""
    for name, d in (("hopa", hop_a), ("hopb", hop_b)):
        text += f"Host {name}\n  HostName {d.addr}\n  Port {d.port}\n"
    for i, d in enumerate(nodes):
        text += f"Host node{i}\n  HostName {d.addr}\n  Port {d.port}\n  ProxyJump hopa,hopb\n"
    text += f"Host *\n  User root\n  IdentityFile {ssh_keys['client']}\n  IdentitiesOnly yes\n"
    Path(settings.ssh_config).write_text(text)
    sources = [
        SshSource(HostSpec(None, f"node{i}"), settings, agent_args(h200_trace)) for i in range(2)
    ]
    c = Collector()
    async with running(sources, c):
        await c.wait(lambda: all(c.count(f"node{i}", "gpu") >= 2 for i in range(2)), 20)
        (chain,) = settings.shared().bastions.values()
        assert chain.connects == 1
        assert [h.target for h in chain.chain] == [
            f"root@{hop_a.addr}:{hop_a.port}",
            f"root@{hop_b.addr}:{hop_b.port}",
        ]
    # a forwarded to b only; b forwarded to both nodes; each hop logged in once.
    log_a, log_b = hop_a.log.read_text(), hop_b.log.read_text()
    assert f"target {hop_b.addr} port {hop_b.port}" in log_a
    for d in nodes:
        assert f"target {d.addr} port {d.port}" not in log_a
        assert f"target {d.addr} port {d.port}" in log_b
        assert d.accepted_logins() == 1
    assert (hop_a.accepted_logins(), hop_b.accepted_logins()) == (1, 1)
