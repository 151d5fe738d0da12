"""Agents are recognisable on nodes (issue 18.7): ``ps -e``/``top``/``pgrep`` show
``verl-top-agent`` (prctl PR_SET_NAME) and ``ps -ef`` shows ``verl_top_agent='<client>'`` at the
start of the -c argument; closing stdin (the SSH session) stops the agent."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top.agent.ship import BOOTSTRAP, agent_payload, bootstrap_for
from verl_top.sources.ssh import agent_command

pytestmark = pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="Linux /proc")


def test_bootstrap_names_the_client_and_stays_shell_safe() -> None:
    assert bootstrap_for("laptop.example") == f"verl_top_agent='laptop.example';{BOOTSTRAP}"
    hostile = bootstrap_for("x';import os;os.system('id');'\"$`")
    assert hostile.startswith("verl_top_agent='ximportosos.systemid';")  # no quote escapes
    cmd = agent_command("python3", bootstrap_for("laptop"), ["--host", "gpu01"])
    assert shlex.split(cmd)[4] == f"verl_top_agent='laptop';{BOOTSTRAP}"  # survives the shell


def test_running_agent_shows_its_name_and_client_in_ps_and_stops_with_stdin() -> None:
    argv = [sys.executable, "-u", "-c", bootstrap_for("laptop.example")]
    argv += ["--backend", "none", "--interval", "0.2"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(agent_payload())
        proc.stdin.flush()
        assert proc.stdout.readline().strip()  # the hello: the agent is running
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert comm == "verl-top-agent"  # ps -e, top, pgrep -x verl-top-agent
        assert cmdline[3].startswith(b"verl_top_agent='laptop.example';")  # ps -ef
        proc.stdin.close()  # what closing the SSH session does
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
