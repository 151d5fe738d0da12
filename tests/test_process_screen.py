"""A process you can open (issue 32 item 3): Enter on a process row opens its screen (command
line, environment with secrets redacted, role, state, method and its age, history); F9 sends a
signal only after a confirmation naming pid, host and role, through the node's own connection.

Real processes started here, titled as verl's workers; the SSH test drives the app connected to
the tests' real sshd and really stops and continues the process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import SshdFactory

from verl_top import signals
from verl_top.cli import app_parser
from verl_top.diagnosis.engine import Engine
from verl_top.export.redact import REDACTED
from verl_top.inputs import Inputs, build_inputs
from verl_top.node_exec import local_run
from verl_top.sources.local import LocalSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.ui.app import VerlTopApp
from verl_top.ui.node_screen import NodeScreen
from verl_top.ui.process_screen import ProcessScreen, SignalScreen

SECRET = "hf_" + "Q" * 34  # a Hugging Face token's shape: the redaction rules know it
CODE = "import time\ndef update_critic():\n    time.sleep(120)\nupdate_critic()\n"


def start_worker() -> subprocess.Popen[bytes]:
    """A Python process titled ``ray::WorkerDict.critic_update_critic``, a token in its env."""
    env = {**os.environ, "HF_TOKEN": SECRET, "RANK": "3"}
    argv = ["bash", "-c", 'exec -a "$0" "$@"', "ray::WorkerDict.critic_update_critic"]
    return subprocess.Popen([*argv, sys.executable, "-c", CODE], env=env)


@pytest.fixture
def proc() -> Iterator[subprocess.Popen[bytes]]:
    p = start_worker()
    yield p
    p.kill()
    p.wait()


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def listed(store: Store, host: str, pid: int) -> bool:
    h = store.hosts.get(host)
    return h is not None and h.procs is not None and pid in {j.pid for j in h.procs.job_procs}


async def signal_via_dialog(app: VerlTopApp, pilot, name: str) -> str:  # type: ignore[no-untyped-def]
    """F9, pick ``name``, Send; the notification's text."""
    await pilot.press("f9")
    await until(lambda: isinstance(app.screen, SignalScreen))
    dialog = app.screen
    assert isinstance(dialog, SignalScreen)
    await until(lambda: dialog.allowed is not None)
    assert dialog.allowed, dialog.reason
    await pilot.click(f"#sig-{name}")
    text = str(dialog.query_one("#sig-text").render())
    assert f"Send SIG{name} to pid {dialog.pid} on {dialog.host}" in text and "(critic)" in text
    await pilot.click("#sig-send")
    await until(lambda: not isinstance(app.screen, SignalScreen))
    return dialog.outcome


@pytest.mark.sshd
@pytest.mark.timeout(120)
async def test_process_screen_stops_and_continues_a_real_process_over_ssh(  # type: ignore[no-untyped-def]
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, remote_python: str, proc
) -> None:
    d = sshd_factory.start()
    known = tmp_path / "known_hosts"
    known.write_text(d.known_hosts_line())
    (tmp_path / "ssh_config").touch()
    args = app_parser().parse_args(
        ["--hosts", f"root@{d.addr}:{d.port}", "--known-hosts", str(known),
         "-i", str(ssh_keys["client"]), "--ssh-config", str(tmp_path / "ssh_config"),
         "--backend", "none", "--interval", "0.2"]
    )  # fmt: skip
    inputs = build_inputs(args)
    for src in inputs.sources:  # the agent's interpreter on the node (what sshd's PATH has)
        src.settings.python = remote_python  # type: ignore[attr-defined]
    host = f"{d.addr}:{d.port}"
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine())
    async with app.run_test(size=(160, 48)) as pilot:
        await until(lambda: listed(inputs.store, host, proc.pid), 30)
        app.open_process(host, proc.pid)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProcessScreen)
        await until(lambda: screen.environment is not None)
        assert screen.environment is not None and screen.environment["HF_TOKEN"] == REDACTED
        assert SECRET not in str(screen.query_one("#proc-env").render())
        info = str(screen.query_one("#proc-info").render())
        assert "state sleeping" in info and "method update_critic for " in info
        assert "rank 3" in info  # RANK from its environment (it holds no GPU: job process)
        assert "ray::WorkerDict.critic_update_critic" in str(screen.query_one("#proc-cmd").render())
        assert state_of(proc.pid) == "S"
        outcome = await signal_via_dialog(app, pilot, "STOP")
        assert outcome == f"sent SIGSTOP to pid {proc.pid} on {host}"
        assert state_of(proc.pid) == "T"
        await until(lambda: "state stopped (T)" in str(screen.query_one("#proc-info").render()))
        outcome = await signal_via_dialog(app, pilot, "CONT")
        assert outcome == f"sent SIGCONT to pid {proc.pid} on {host}"
        assert state_of(proc.pid) in ("S", "R")


async def test_readonly_refuses_signals_and_nothing_is_sent(proc) -> None:  # type: ignore[no-untyped-def]
    """--readonly: F9 says so and opens no dialog; Enter on the node screen's row opens the
    process (the in-process agent on this machine)."""
    store = Store()
    source = LocalSource(interval=0.2, backend="none", host="thisbox")
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), sources=[source])
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine(), readonly=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(lambda: listed(store, "thisbox", proc.pid))
        app.push_screen(NodeScreen(store, "thisbox"))
        await pilot.pause()
        table = app.screen.query_one("#node-procs")
        await until(lambda: f"job/{proc.pid}" in app.screen.proc_sync.rows)  # type: ignore[union-attr]
        table.focus()
        row = app.screen.proc_sync.order.index(f"job/{proc.pid}")  # type: ignore[union-attr]
        table.move_cursor(row=row)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, ProcessScreen))
        await pilot.press("f9")
        await pilot.pause()
        assert isinstance(app.screen, ProcessScreen)  # no dialog
        assert any(signals.READONLY in str(n.message) for n in app._notifications)
    assert state_of(proc.pid) == "S"


def test_a_process_of_another_user_is_refused_before_any_signal(proc) -> None:  # type: ignore[no-untyped-def]
    """The connection's user is nobody (setpriv), the process is root's: refused, named."""

    async def as_nobody(argv, timeout, stdin=""):  # type: ignore[no-untyped-def]
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        return await local_run([*prefix, *argv], timeout, stdin)

    perm = asyncio.run(signals.permission(as_nobody, "gpu07", proc.pid, "root"))
    assert not perm.allowed
    assert perm.reason == (
        f"pid {proc.pid} on gpu07 runs as uid 0 (root); the SSH user (uid 65534) may only "
        "signal its own processes: verl-top sends nothing"
    )
    assert asyncio.run(signals.permission(local_run, "here", proc.pid)).allowed  # root may
    assert not asyncio.run(signals.permission(local_run, "here", 2**22 + 3)).allowed


def test_only_fixed_signals_and_real_pids() -> None:
    for bad in (0, 1, -5, True, "12", 2**31):
        with pytest.raises(ValueError):
            signals.check_pid(bad)
    with pytest.raises(ValueError, match="not a signal"):
        asyncio.run(signals.send(local_run, "h", 1234, "HUP; rm -rf /"))
