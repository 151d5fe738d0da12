"""Start and stop real OpenSSH sshd daemons on 127.0.0.x for the SSH tests.

Each daemon listens on its own loopback address (127.0.0.2, 127.0.0.3, ...) and a free high
port, with a host key generated for the run, ``StrictModes no`` (keys live in tmp),
``UsePAM no`` and ``MaxStartups 256``. Only addresses inside 127.0.0.0/8 are ever used.
Daemons are stopped by pid. Recipe: /work/shared/reference/textual_asyncssh.md section 6.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import psutil

from verl_top.sources.hosts import HostSpec
from verl_top.sources.ssh import SshSettings

SSHD = "/usr/sbin/sshd"


def write_key(path: Path, key: asyncssh.SSHKey) -> Path:
    """Write a private key (OpenSSH format, 0600) and its .pub next to it."""
    path.write_bytes(key.export_private_key("openssh"))
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(key.export_public_key("openssh"))
    return path


def new_key(path: Path) -> tuple[Path, asyncssh.SSHKey]:
    """Generate an ed25519 key at ``path``."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    return write_key(path, key), key


def free_port(addr: str) -> int:
    """A port that is free on ``addr`` right now."""
    assert addr.startswith("127."), addr
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@dataclass
class SshDaemon:
    """One sshd listening on ``addr:port``."""

    addr: str
    port: int
    dir: Path
    authorized_keys: Path
    log_level: str = "VERBOSE"
    extra_config: str = ""
    host_key: asyncssh.SSHKey = field(
        default_factory=lambda: asyncssh.generate_private_key("ssh-ed25519")
    )
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        """The host name used in hosts lists and known_hosts (``127.0.0.X:port``)."""
        return f"{self.addr}:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    def known_hosts_line(self, key: asyncssh.SSHKey | None = None) -> str:
        """The known_hosts line for this daemon (``[addr]:port alg base64``)."""
        alg, b64 = (key or self.host_key).export_public_key("openssh").decode().split()[:2]
        return f"[{self.addr}]:{self.port} {alg} {b64}\n"

    def write_config(self, penalties: bool) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_key(self.dir / "host_ed25519", self.host_key)
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.addr}",
            f"HostKey {self.dir / 'host_ed25519'}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 256",
            "MaxSessions 64",
            "AllowTcpForwarding yes",
            f"LogLevel {self.log_level}",
        ]
        if penalties:  # OpenSSH >= 9.8 would throttle our deliberate auth failures
            lines.append("PerSourcePenalties no")
        cfg = self.dir / "sshd_config"
        cfg.write_text("\n".join(lines) + "\n" + self.extra_config)
        return cfg

    def start(self, penalties: bool = False, timeout: float = 5.0) -> None:
        """Start sshd in the foreground (-D) and wait until the port accepts."""
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        cfg = self.write_config(penalties)
        log = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((self.addr, self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"sshd on {self.name} did not start: {self.log.read_text()[-2000:]}")

    def session_pids(self) -> list[int]:
        """Pids of the per-connection sshd processes and everything they started."""
        if self.proc is None:
            return []
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def connection_pids(self) -> list[int]:
        """Pids of the direct children of the listener: one sshd per client connection."""
        if self.proc is None:
            return []
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Kill the listener and its sessions (by pid) and reap the listener."""
        pids = self.session_pids()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        for pid in pids:
            _kill(pid, signal.SIGCONT)  # a stopped process must be able to die
            _kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=5)
            self.proc = None

    def accepted_logins(self) -> int:
        """How many logins this sshd accepted (from its log)."""
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count("Accepted publickey")


def sshd_version() -> tuple[int, int]:
    """OpenSSH version of the installed sshd, e.g. (9, 2)."""
    out = subprocess.run([SSHD, "-V"], capture_output=True, text=True, timeout=10)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class SshdFactory:
    """Starts daemons on distinct 127.0.0.x addresses and stops all of them at the end."""

    root: Path
    authorized_keys: Path
    first_octet: int = 2
    daemons: list[SshDaemon] = field(default_factory=list)
    _penalties: bool | None = None

    def _supports_penalties(self) -> bool:
        if self._penalties is None:
            self._penalties = sshd_version() >= (9, 8)
        return self._penalties

    def start(self, log_level: str = "VERBOSE", extra_config: str = "") -> SshDaemon:
        """A new running sshd on the next loopback address."""
        n = self.first_octet + len(self.daemons)
        assert 2 <= n <= 254
        addr = f"127.0.0.{n}"
        d = SshDaemon(
            addr=addr,
            port=free_port(addr),
            dir=self.root / f"sshd-{n}",
            authorized_keys=self.authorized_keys,
            log_level=log_level,
            extra_config=extra_config,
        )
        self.daemons.append(d)
        d.start(self._supports_penalties())
        return d

    def restart(self, d: SshDaemon) -> None:
        """Start a stopped daemon again on the same address, port and host key."""
        d.start(self._supports_penalties())

    def stop_all(self) -> None:
        """Stop every daemon this factory started."""
        for d in self.daemons:
            d.stop()


class Collector:
    """An ``emit`` that keeps every record and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.records: list = []
        self._event = asyncio.Event()

    def __call__(self, record) -> None:  # noqa: ANN001 - any Record
        self.records.append(record)
        self._event.set()

    def states(self, host: str) -> list[tuple[str, str]]:
        """(state, reason) of every HostState emitted for ``host``, in order."""
        return [(r.state, r.reason) for r in self.records if r.TYPE == "state" and r.host == host]

    def last_state(self, host: str) -> tuple[str, str] | None:
        states = self.states(host)
        return states[-1] if states else None

    def count(self, host: str, rtype: str, since: int = 0) -> int:
        """How many records of ``rtype`` arrived for ``host`` after index ``since``."""
        return sum(1 for r in self.records[since:] if r.TYPE == rtype and r.host == host)

    async def wait(self, predicate, timeout: float) -> float:  # noqa: ANN001
        """Wait until ``predicate()`` holds; returns the seconds waited, fails on timeout."""
        t0 = time.monotonic()
        while not predicate():
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise AssertionError(f"condition not met within {timeout} s")
            self._event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event.wait(), min(left, 0.1))
        return time.monotonic() - t0


@contextlib.asynccontextmanager
async def running(sources, emit):  # noqa: ANN001
    """Run sources as tasks; cancel them (and close shared bastions) on exit."""
    tasks = [asyncio.create_task(s.run(emit)) for s in sources]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for shared in {id(s.shared): s.shared for s in sources}.values():
            await shared.close()


async def gone(pids, timeout: float = 5.0) -> bool:  # noqa: ANN001
    """True once none of ``pids`` is alive (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        await asyncio.sleep(0.05)
    return False


def spec_for(d: SshDaemon) -> HostSpec:
    return HostSpec("root", d.addr, d.port)


def agent_args(trace: Path) -> list[str]:
    return [
        "--interval",
        "0.25",
        "--backend",
        "replay",
        "--replay-trace",
        str(trace),
        "--replay-gpus",
        "2",
    ]


def make_settings(
    tmp_path: Path, keys: dict[str, Path], daemons: list[SshDaemon], python: str, **kw: object
) -> SshSettings:
    known = tmp_path / "known_hosts"
    known.write_text("".join(d.known_hosts_line() for d in daemons))
    empty = tmp_path / "ssh_config"
    empty.touch()
    base: dict[str, object] = dict(
        ssh_config=str(empty),
        identities=(str(keys["client"]),),
        known_hosts=str(known),
        connect_timeout=3.0,
        backoff_initial=0.2,
        backoff_max=1.0,
        attention_backoff=60.0,
        python=python,
    )
    base.update(kw)
    return SshSettings(**base)  # type: ignore[arg-type]


def replay_cluster_args(
    daemon: SshDaemon, tmp_path: Path, client_key: Path, trace: Path, log: Path
) -> list[str]:
    """verl-top's command line for one test sshd: a pinned known_hosts, an empty ssh_config,
    the replay backend on ``trace``, and ``log`` on that host followed as the verl log."""
    known = tmp_path / "known_hosts"
    known.write_text(daemon.known_hosts_line())
    (tmp_path / "ssh_config").touch()
    return [
        "--hosts", f"root@{daemon.addr}:{daemon.port}",
        "--known-hosts", str(known),
        "-i", str(client_key),
        "--ssh-config", str(tmp_path / "ssh_config"),
        "--backend", "replay",
        "--replay-trace", str(trace),
        "--interval", "0.5",
        "--verl-log", f"{daemon.addr}:{log}",
    ]  # fmt: skip
