"""Liveness against a real sshd: an agent that stops sending (SIGSTOP on the remote agent,
while sshd and TCP stay healthy) is marked stale, recovers by itself when it resumes, and is
killed and replaced when it stays silent, leaving no process behind on the node."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from sshd import Collector, SshdFactory, agent_args, gone, make_settings, running, spec_for

from verl_top.model import Hello
from verl_top.sources.ssh import SshSource

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]


def hellos(c: Collector, host: str) -> list[Hello]:
    return [r for r in c.records if isinstance(r, Hello) and r.host == host]


def agents_on(daemon) -> list[int]:  # noqa: ANN001
    """Pids of agent processes started through this daemon."""
    out = []
    for pid in daemon.session_pids():
        try:
            if "verl-top-agent" in " ".join(psutil.Process(pid).cmdline()):
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


async def test_silent_agent_is_stale_then_recovers_by_itself(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_factory.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python, hang_min_s=30.0)
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(lambda: c.count(d.name, "gpu") >= 4, 15)
        (hello,) = hellos(c, d.name)
        os.kill(hello.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            await c.wait(lambda: (c.last_state(d.name) or ("",))[0] == "stale", 5)
            took = time.monotonic() - t0
            reason = c.last_state(d.name)[1]
        finally:
            os.kill(hello.pid, signal.SIGCONT)
        # 3 intervals of 0.25 s, checked every interval/4.
        print(f"stale after {took:.2f} s: {reason}")
        assert 0.7 <= took <= 3.0
        assert reason.startswith("no data for ") and "intervals of 0.25 s" in reason
        mark = len(c.records)
        await c.wait(lambda: c.count(d.name, "gpu", mark) >= 2, 10)
        assert c.last_state(d.name)[0] == "up"
        assert len(hellos(c, d.name)) == 1  # the same agent resumed, nothing was replaced


async def test_hung_agent_is_killed_and_replaced(
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_factory.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python, hang_min_s=2.0)
    c = Collector()
    async with running([SshSource(spec_for(d), settings, agent_args(h200_trace))], c):
        await c.wait(lambda: c.count(d.name, "gpu") >= 4, 15)
        (first,) = hellos(c, d.name)
        assert agents_on(d) == [first.pid]
        os.kill(first.pid, signal.SIGSTOP)  # sshd and TCP stay up: keepalives are answered
        t0 = time.monotonic()
        await c.wait(lambda: len(hellos(c, d.name)) == 2, 20)
        print(f"replaced after {time.monotonic() - t0:.2f} s; states {c.states(d.name)[-4:]}")
        states = [s for s, _ in c.states(d.name)]
        assert states[-4:] == ["stale", "down", "connecting", "up"]
        # While stale, the age shown keeps growing (renewed every second).
        ages = [float(r.split()[3]) for s, r in c.states(d.name) if s == "stale"]
        assert len(ages) >= 2 and ages == sorted(ages) and ages[-1] > ages[0] + 0.9, ages
        down = [r for s, r in c.states(d.name) if s == "down"][-1]
        assert down.startswith("agent hung: no data for ") and f"pid {first.pid}" in down
        second = hellos(c, d.name)[1]
        assert second.pid != first.pid
        assert await gone([first.pid], 5.0), "the stopped agent was left on the node"
        assert agents_on(d) == [second.pid]
        mark = len(c.records)
        await c.wait(lambda: c.count(d.name, "gpu", mark) >= 2, 10)
