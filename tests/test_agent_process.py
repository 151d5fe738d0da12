"""The agent as a real process, started exactly as the SSH source starts it.

``python3 -u -c "<BOOTSTRAP>" ARGS`` with the payload (header line + base64 zip of the package)
written to stdin, stdin then kept open as the control channel. Covers the NDJSON stream, exit on
stdin EOF, exit on a broken stdout, the follow control command, and Python 3.8 compatibility.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from verl_top.agent.ship import BOOTSTRAP, agent_payload, build, remote_command
from verl_top.protocol import Decoder, to_dict

ROOT = Path(__file__).resolve().parents[1]
TRACE = Path(__file__).parent / "fixtures" / "agent" / "h200_phased_trace.jsonl"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"


class AgentProc:
    """A running agent with a reader thread collecting its stdout lines."""

    def __init__(
        self, argv: list[str], env: dict | None = None, args: list[str] | None = None
    ) -> None:
        """``args``: the agent's own arguments when ``argv`` hides them in a shell string."""
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.all: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        assert self.proc.stdin is not None
        self.proc.stdin.write(agent_payload(argv if args is None else args).encode("ascii"))
        self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode("utf-8"))
        self.lines.put(None)

    def send(self, cmd: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def records(self, until, timeout: float = 10.0) -> list[dict]:  # type: ignore[no-untyped-def]
        """Read records until ``until(record)`` is true; returns those read."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; got {[r['type'] for r in got]}; stderr: {self.stderr()}"
            line = self.lines.get(timeout=left)
            assert line is not None, f"agent ended early; stderr: {self.stderr()}"
            self.all.append(line)
            rec = json.loads(line)
            got.append(rec)
            if until(rec):
                return got

    def collect(self, seconds: float) -> list[dict]:
        """Every record that arrives within ``seconds``."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            assert line is not None
            self.all.append(line)
            got.append(json.loads(line))
        return got

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def close_stdin_and_wait(self) -> float:
        assert self.proc.stdin is not None
        t0 = time.monotonic()
        self.proc.stdin.close()
        self.proc.wait(timeout=5)
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def procs():  # type: ignore[no-untyped-def]
    started: list[AgentProc] = []
    yield started
    for p in started:
        p.kill()


def test_bootstrap_is_safe_inside_double_quotes() -> None:
    for ch in '"\\$`!\n':
        assert ch not in BOOTSTRAP


def test_bootstrap_over_a_shell_streams_hello_and_gpus(procs) -> None:  # type: ignore[no-untyped-def]
    """The exact shell command line the SSH source runs; closing stdin stops it within 2 s."""
    args = [
        "--backend",
        "replay",
        "--replay-trace",
        str(TRACE),
        "--interval",
        "0.2",
        "--host",
        "n1",
    ]
    cmd = remote_command(args, python=shlex_quote(sys.executable))
    p = AgentProc(["/bin/sh", "-c", cmd], args=args)
    procs.append(p)
    seen = p.records(lambda r: r["type"] == "hb")
    assert seen[0]["type"] == "hello" and seen[0]["host"] == "n1"
    assert seen[0]["backend"] == "replay" and seen[0]["interval"] == 0.2
    assert [r["index"] for r in seen if r["type"] == "gpu"] == list(range(8))
    p.records(lambda r: r["type"] == "host")  # a second tick arrives
    assert p.close_stdin_and_wait() < 2.0
    assert p.proc.returncode == 0
    dec = Decoder()
    for line in p.all:
        rec = dec.decode(line)
        assert rec is not None and to_dict(rec) == json.loads(line)
    assert dec.malformed == 0


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def test_exits_when_stdout_breaks() -> None:
    argv = [sys.executable, "-u", "-c", BOOTSTRAP, "--backend", "none", "--interval", "0.05"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(agent_payload().encode())  # (no replay module: not asked for)
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["type"] == "hello"
        proc.stdout.close()  # the client went away without closing stdin
        proc.wait(timeout=5)
        assert proc.returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_follow_append_truncate_rotate(procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "verl.log"
    log.write_text("old line before follow\n")
    p = AgentProc(
        [sys.executable, "-u", "-c", BOOTSTRAP, "--backend", "none", "--interval", "0.05"]
    )
    procs.append(p)
    p.records(lambda r: r["type"] == "host")
    p.send({"cmd": "follow", "kind": "verl", "path": str(log)})
    p.send({"cmd": "interval", "value": 0.05})
    time.sleep(0.3)  # let the agent open it (at its end: the old line is not sent)

    def next_log() -> dict:
        return p.records(lambda r: r["type"] == "log")[-1]

    with log.open("a") as fh:
        fh.write("step:1 - a:1\nstep:2 - a:")
        fh.flush()
        rec = next_log()
        assert rec["lines"] == ["step:1 - a:1"] and rec["reset"] is False
        assert rec["kind"] == "verl" and rec["path"] == str(log)
        fh.write("2\n")  # the partial line was held until its newline arrived
    assert next_log()["lines"] == ["step:2 - a:2"]
    # Truncate and write less than before: reset, read from the start.
    log.write_text("after truncate\n")
    rec = next_log()
    assert rec["reset"] is True and rec["lines"] == ["after truncate"]
    # Rotate: rename away, create a new file: reset, new file from its start.
    log.rename(tmp_path / "verl.log.1")
    log.write_text("new file line 1\nnew file line 2\n")
    rec = next_log()
    assert rec["reset"] is True and rec["lines"] == ["new file line 1", "new file line 2"]
    # Unfollow: nothing more arrives for it.
    p.send({"cmd": "unfollow", "path": str(log)})
    time.sleep(0.2)
    with log.open("a") as fh:
        fh.write("ignored\n")
    later = p.collect(0.5)
    assert len([r for r in later if r["type"] == "host"]) >= 3
    assert not [r for r in later if r["type"] == "log"]
    assert p.close_stdin_and_wait() < 2.0


def test_once_and_count_exit_by_themselves() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verl_top.agent", "--once", "--backend", "none", "--host", "h",
         "--no-procs"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=20, check=True, cwd=ROOT,
    )  # fmt: skip
    types = [json.loads(line)["type"] for line in out.stdout.decode().splitlines()]
    assert types == ["hello", "topo", "host", "hb"]  # topo: once per connection, after hello


def _py38() -> tuple[str, str]:
    if os.path.exists(PY38):
        return PY38, "python3.8"
    return sys.executable, "sys_executable_because_python3.8_is_missing"


PY38_EXE, PY38_ID = _py38()


@pytest.mark.parametrize("exe", [PY38_EXE], ids=[PY38_ID])
def test_python38_compatibility(exe: str, procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The agent runs on Python 3.8 through the bootstrap, without psutil (the /proc path)."""
    log = tmp_path / "nccl.log"
    log.write_text("NCCL INFO Init COMPLETE\n")
    env = dict(os.environ, VERL_TOP_AGENT_NO_PSUTIL="1", PYTHONPATH="")
    argv = [exe, "-u", "-c", BOOTSTRAP, "--backend", "replay", "--replay-trace", str(TRACE),
            "--replay-gpus", "2", "--interval", "0.1", "--follow", f"nccl+start:{log}"]  # fmt: skip
    p = AgentProc(argv, env=env)
    procs.append(p)
    got = p.records(lambda r: r["type"] == "log")
    hello = got[0]
    if exe == PY38:
        assert hello["python"].startswith("3.8.")
    assert "psutil" not in hello["capabilities"]
    assert got[-1]["lines"] == ["NCCL INFO Init COMPLETE"] and got[-1]["kind"] == "nccl"
    host = [r for r in got if r["type"] == "host"][0]
    assert host["mem_total_bytes"] > 0 and len(host["cpu_per_core"]) >= 1
    assert p.close_stdin_and_wait() < 2.0
    dec = Decoder()
    assert all(dec.decode(line) is not None for line in p.all) and dec.malformed == 0


def test_python38_has_no_newer_syntax_issue() -> None:
    """Compile every shipped module with 3.8 itself (catches syntax only newer Pythons accept)."""
    exe = shutil.which(PY38) or PY38
    if not os.path.exists(exe):
        pytest.fail(f"{PY38} missing: the 3.8 compatibility run above used sys.executable")
    code = (
        "import io, sys, zipfile\n"
        "z = zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read()))\n"
        "for n in z.namelist(): compile(z.read(n), n, 'exec')\n"
        "print(len(z.namelist()))"
    )
    payload = build(replay=True)
    out = subprocess.run([exe, "-c", code], input=payload.zip, check=True, timeout=20,
                         capture_output=True)  # fmt: skip
    assert int(out.stdout) == len(payload.modules) >= 12
