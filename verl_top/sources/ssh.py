"""Remote nodes over SSH: one asyncio task per host runs the node agent and streams its records.

Each :class:`SshSource` connects with asyncssh (honouring ``~/.ssh/config``, ssh-agent and the
default keys), starts ``python3 -u -c BOOTSTRAP ARGS`` on the node, sends the agent source on
stdin and keeps stdin open as the agent's control channel. Failures never escape a host's
task: they become :class:`~verl_top.model.HostState` records, and the task reconnects with
exponential backoff and jitter. Everything shared between hosts (loaded keys, the handshake
semaphore, bastion connections, known_hosts updates) lives in :class:`SshShared`, created once
per :class:`SshSettings`. See docs/hosts-and-ssh.md for the user-facing side.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import getpass
import json
import os
import random
import shlex
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.config import SSHClientConfig

from verl_top.model import Hello, HostState, Record
from verl_top.protocol import Decoder
from verl_top.sources.base import Emit
from verl_top.sources.hosts import HostSpec, parse_entry

UNKNOWN_HOST_REASON = "host key not in known_hosts (use --accept-new-hosts or ssh once by hand)"
STDERR_TAIL_LINES = 8


@dataclass
class SshSettings:
    """SSH options for all hosts, built once from the command line (see ``from_args``)."""

    ssh_config: str | None = None  # None: ~/.ssh/config when readable (asyncssh default)
    identities: tuple[str, ...] = ()  # -i; empty: IdentityFile, default keys and ssh-agent
    jump: str | None = None  # --jump: one bastion shared by every host
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_hosts: bool = False
    connect_timeout: float = 10.0
    max_handshakes: int = 16
    user: str | None = None  # --ssh-user: default login name (user@ in the hosts file wins)
    keepalive_interval: float = 1.0
    keepalive_count_max: int = 3
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    healthy_after: float = 30.0  # a stream this long resets the backoff
    attention_backoff: float = 300.0  # auth and host-key failures need a person: retry rarely
    python: str = "python3"  # interpreter started on the node
    _shared: SshShared | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SshSettings:
        """Settings from the options added by :func:`add_ssh_arguments`. Raises ValueError."""
        identities = tuple(str(Path(p).expanduser()) for p in (args.identity or ()))
        for path in identities:
            if not os.path.isfile(path):
                raise ValueError(f"-i {path}: no such key file")
        config = args.ssh_config
        if config is not None and not os.path.isfile(os.path.expanduser(config)):
            raise ValueError(f"--ssh-config {config}: no such file")
        if args.jump:
            try:
                for hop in args.jump.split(","):
                    parse_entry(hop)
            except ValueError as exc:
                raise ValueError(f"--jump {args.jump}: {exc}") from None
        if args.max_handshakes < 1:
            raise ValueError("--max-handshakes must be at least 1")
        if args.connect_timeout <= 0:
            raise ValueError("--connect-timeout must be positive")
        return cls(
            ssh_config=os.path.expanduser(config) if config else None,
            identities=identities,
            jump=args.jump or None,
            known_hosts=args.known_hosts or "~/.ssh/known_hosts",
            accept_new_hosts=bool(args.accept_new_hosts),
            connect_timeout=float(args.connect_timeout),
            max_handshakes=int(args.max_handshakes),
            user=args.ssh_user or None,
        )

    def shared(self) -> SshShared:
        """The state every host of these settings shares (created on first use)."""
        if self._shared is None:
            self._shared = SshShared(self)
        return self._shared


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the SSH options (``--ssh-config``, ``-i``, ``--jump``, ...) to ``parser``."""
    g = parser.add_argument_group("SSH (remote nodes)")
    g.add_argument(
        "--ssh-config", metavar="FILE", help="ssh_config file to use instead of ~/.ssh/config"
    )
    g.add_argument(
        "-i",
        "--identity",
        metavar="KEY",
        action="append",
        help="private key to log in with (repeatable; default: ssh-agent and ~/.ssh/id_*)",
    )
    g.add_argument(
        "--jump",
        metavar="[USER@]HOST[:PORT]",
        help="bastion to reach every node through (one shared connection; a,b for two hops)",
    )
    g.add_argument(
        "--accept-new-hosts",
        action="store_true",
        help="trust and remember host keys of nodes not yet in known_hosts (changed keys are "
        "still refused), like OpenSSH StrictHostKeyChecking=accept-new",
    )
    g.add_argument(
        "--known-hosts", metavar="FILE", help="known_hosts file (default ~/.ssh/known_hosts)"
    )
    g.add_argument(
        "--connect-timeout",
        metavar="S",
        type=float,
        default=10.0,
        help="seconds to wait for TCP connect + SSH handshake (default 10)",
    )
    g.add_argument(
        "--max-handshakes",
        metavar="N",
        type=int,
        default=16,
        help="SSH handshakes in flight at once (default 16)",
    )
    g.add_argument("--ssh-user", metavar="USER", help="login name for hosts without user@")


def build_ssh_sources(
    specs: Sequence[HostSpec],
    args: argparse.Namespace | SshSettings,
    agent_args: Sequence[str] = (),
    follows: Sequence[tuple[str, str]] = (),
) -> list[SshSource]:
    """One :class:`SshSource` per host, all sharing one :class:`SshSettings`.

    ``args`` is the parsed command line (or ready settings); ``agent_args`` are extra agent
    options (``--interval 1``); ``follows`` are (kind, path) files every one of these hosts
    should follow. Raises ValueError for unusable SSH options (before any connection).
    """
    settings = args if isinstance(args, SshSettings) else SshSettings.from_args(args)
    return [SshSource(spec, settings, agent_args, follows) for spec in specs]


# --- host keys -------------------------------------------------------------------------------


def _known_host_pattern(host: str, port: int | None) -> str:
    return host if port in (None, 22) else f"[{host}]:{port}"


class KnownHosts:
    """The known_hosts file: lookups for asyncssh, and OpenSSH-style accept-new appends."""

    def __init__(self, path: str, accept_new: bool) -> None:
        self.path = Path(path).expanduser()
        self.accept_new = accept_new

    def _load(self) -> asyncssh.SSHKnownHosts | None:
        try:
            return asyncssh.read_known_hosts(str(self.path))
        except FileNotFoundError:
            return None

    def match(self, host: str, addr: str, port: int | None) -> tuple[list, list, list]:
        """(trusted keys, CA keys, revoked keys) for a host; read fresh on every connect."""
        known = self._load()
        if known is None:
            return ([], [], [])
        keys, ca_keys, revoked = known.match(host, addr, port)[:3]
        return (list(keys), list(ca_keys), list(revoked))

    def append(self, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
        """Remember ``key`` for ``host`` (creating the file 0600 when missing)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fields = key.export_public_key("openssh").decode().split()
        line = f"{_known_host_pattern(host, port)} {fields[0]} {fields[1]}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            if fh.tell() > 0 and not self.path.read_bytes().endswith(b"\n"):
                fh.write("\n")
            fh.write(line)


class _Client(asyncssh.SSHClient):
    """Per-connection client: decides about untrusted host keys and remembers why it refused."""

    def __init__(self, known: KnownHosts) -> None:
        self.known = known
        self.problem: tuple[str, str] | None = None  # ("unknown" | "changed", detail)
        self.closed = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        # Called by asyncssh only for a key that known_hosts does not already trust.
        wire_port = None if port == 22 else port
        keys, ca_keys, _ = self.known.match(host, addr, wire_port)
        fp = f"{key.get_algorithm()} {key.get_fingerprint()}"
        if keys or ca_keys:
            pattern = _known_host_pattern(host, port)
            self.problem = (
                "changed",
                f"host key CHANGED: the server now offers {fp}, which differs from "
                f"{self.known.path}; if the node was reinstalled, verify the new key, run "
                f"`ssh-keygen -R '{pattern}' -f {self.known.path}` and connect again "
                "(otherwise this may be an attack)",
            )
            return False
        if self.known.accept_new:
            self.known.append(host, port, key)
            return True
        self.problem = ("unknown", f"{UNKNOWN_HOST_REASON}; server key {fp}")
        return False


# --- shared state ---------------------------------------------------------------------------


class _HostFailure(Exception):
    """A classified failure: the host state to show and whether it needs a person."""

    def __init__(self, state: str, reason: str, attention: bool = False) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason
        self.attention = attention
        self.healthy_for = 0.0  # how long the stream had been up before this failure


class SshShared:
    """What all hosts of one :class:`SshSettings` share: keys, semaphore, bastions, known_hosts."""

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self.known = KnownHosts(settings.known_hosts, settings.accept_new_hosts)
        self.client_keys: list[asyncssh.SSHKeyPair] | None = None
        self._sem: asyncio.Semaphore | None = None
        self.bastions: dict[str, Bastion] = {}
        self.handshakes = 0  # connections opened to nodes (for tests and stats)

    def load_keys(self) -> None:
        """Load ``-i`` keys once (raises ValueError for an unreadable key)."""
        if self.client_keys is None and self.settings.identities:
            try:
                self.client_keys = asyncssh.load_keypairs(list(self.settings.identities))
            except (OSError, asyncssh.KeyImportError) as exc:
                raise ValueError(f"-i: cannot load key: {exc}") from None

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """Caps concurrent handshakes (created lazily so it binds to the running loop)."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.settings.max_handshakes)
        return self._sem

    def config_paths(self) -> Any:
        """The ``config=`` argument for asyncssh: () means ~/.ssh/config when readable."""
        return [self.settings.ssh_config] if self.settings.ssh_config else ()

    def host_config(self, host: str, port: int | None, user: str | None) -> Any:
        """The ssh_config options that apply to ``host`` (for ProxyJump and messages)."""
        paths = self.config_paths()
        if paths == ():
            default = Path("~/.ssh/config").expanduser()
            paths = [str(default)] if os.access(default, os.R_OK) else []
        local_user = _local_user()
        return SSHClientConfig.load(
            None, paths, False, False, False, local_user, user or local_user, host, port or ()
        )

    def connect_kwargs(self, client: _Client) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect`` common to nodes and bastions."""
        s = self.settings
        kwargs: dict[str, Any] = {
            "config": self.config_paths(),
            "known_hosts": self.known.match,
            "connect_timeout": s.connect_timeout,
            "login_timeout": s.connect_timeout,
            "keepalive_interval": s.keepalive_interval,
            "keepalive_count_max": s.keepalive_count_max,
            "client_factory": lambda: client,
        }
        if self.client_keys is not None:
            kwargs["client_keys"] = self.client_keys
        return kwargs

    def bastion(self, jump: str) -> Bastion:
        """The shared connection for a jump spec (``[user@]host[:port]``, ``a,b`` for hops)."""
        b = self.bastions.get(jump)
        if b is None:
            b = self.bastions[jump] = Bastion(jump, self)
        return b

    async def close(self) -> None:
        """Close bastion connections."""
        for b in self.bastions.values():
            await b.close()


class Bastion:
    """One jump-host connection shared by every node behind it, reopened when it dies."""

    def __init__(self, jump: str, shared: SshShared) -> None:
        self.jump = jump
        self.shared = shared
        self.connects = 0
        self.attempts = 0
        self._conn: asyncssh.SSHClientConnection | None = None
        self._client: _Client | None = None
        self._lock = asyncio.Lock()
        self._failure: _HostFailure | None = None
        self._failed_at = float("-inf")

    async def get(self) -> asyncssh.SSHClientConnection:
        """The live bastion connection, connecting (once, for all waiting hosts) if needed.

        Hosts that queued while an attempt failed get that attempt's failure instead of
        each trying again in turn (a dead bastion must not cost N x the connect timeout).
        """
        asked = time.monotonic()
        async with self._lock:
            if self._conn is not None and self._client is not None and not self._client.closed:
                return self._conn
            if self._failure is not None and self._failed_at >= asked:
                raise self._failure
            self._conn = None
            try:
                return await self._open()
            except _HostFailure as exc:
                self._failure, self._failed_at = exc, time.monotonic()
                raise

    async def _open(self) -> asyncssh.SSHClientConnection:
        self.attempts += 1
        conn: asyncssh.SSHClientConnection | None = None
        for hop in self.jump.split(","):
            spec = parse_entry(hop.strip())[0]
            client = _Client(self.shared.known)
            kwargs = self.shared.connect_kwargs(client)
            if conn is not None:
                kwargs["tunnel"] = conn  # the next hop goes through the previous one
            user = spec.user or self.shared.settings.user
            try:
                conn = await asyncssh.connect(
                    spec.host, spec.port or (), username=user or (), **kwargs
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified for the hosts behind it
                fail = classify(exc, client, spec, self.shared)
                raise _HostFailure(
                    fail.state, f"bastion {spec.name}: {fail.reason}", fail.attention
                ) from None
            self._client = client
        assert conn is not None
        self._conn = conn
        self.connects += 1
        return conn

    async def close(self) -> None:
        """Close the bastion connection (hosts behind it go down and reconnect on demand)."""
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.wait_closed(), 2)
            self._conn = None


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def classify(
    exc: BaseException, client: _Client | None, spec: HostSpec, shared: SshShared
) -> _HostFailure:
    """Turn a connect/stream exception into a host state and a reason in plain words."""
    s = shared.settings
    if isinstance(exc, _HostFailure):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        problem = client.problem if client is not None else None
        if problem and problem[0] == "changed":
            return _HostFailure("hostkey_changed", problem[1], True)
        if problem:
            return _HostFailure("down", problem[1], True)
        return _HostFailure("hostkey_changed", f"host key refused: {exc.reason}", True)
    if isinstance(exc, asyncssh.PermissionDenied):
        user = spec.user or s.user
        if not user:
            with contextlib.suppress(Exception):
                user = shared.host_config(spec.host, spec.port, None).get("User")
        user = user or _local_user()
        if s.identities:
            tried = "keys " + ", ".join(s.identities)
        else:
            tried = "ssh-agent, IdentityFile from ssh config and ~/.ssh/id_*"
        return _HostFailure(
            "auth_failed",
            f"server refused login as {user} (tried {tried}); add your public key to "
            f"~{user}/.ssh/authorized_keys on {spec.host} or pass -i KEY / --ssh-user",
            True,
        )
    if isinstance(exc, ConnectionRefusedError):
        return _HostFailure(
            "down", f"connection refused (is sshd running on port {spec.port or 22}?)"
        )
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return _HostFailure(
            "down",
            f"timed out after {s.connect_timeout:g} s (no SSH answer; host down or firewalled?)",
        )
    if isinstance(exc, socket.gaierror):
        return _HostFailure("down", f"unknown host name {spec.host!r} ({exc.strerror})")
    if isinstance(exc, asyncssh.ConnectionLost):
        if "keepalive" in str(exc.reason).lower():
            waited = s.keepalive_interval * (s.keepalive_count_max + 1)
            return _HostFailure("down", f"keepalive timeout (no answer for ~{waited:g} s)")
        return _HostFailure("down", "connection closed by peer")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return _HostFailure("down", f"cannot open channel: {exc.reason}")
    if isinstance(exc, asyncssh.DisconnectError):
        return _HostFailure("down", f"disconnected: {exc.reason}")
    if isinstance(exc, OSError):
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return _HostFailure("down", "no route to host")
        if exc.errno == errno.ECONNRESET:
            return _HostFailure("down", "connection closed by peer")
        return _HostFailure("down", f"network error: {exc.strerror or exc}")
    return _HostFailure("down", f"unexpected error: {type(exc).__name__}: {exc}")


class Backoff:
    """Reconnect delays: initial doubling to the cap, +-20 % jitter, long for a person's fix."""

    def __init__(self, settings: SshSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.rng = rng or random.Random()
        self.current = settings.backoff_initial

    def next(self, attention: bool = False, healthy_for: float = 0.0) -> float:
        """Delay before the next attempt, given how the last one ended."""
        s = self.settings
        if healthy_for >= s.healthy_after:  # it worked for a while: start over
            self.current = s.backoff_initial
        if attention:
            return s.attention_backoff
        delay = min(self.current, s.backoff_max) * self.rng.uniform(0.8, 1.2)
        self.current = min(self.current * 2, s.backoff_max)
        return delay


# --- the per-host source --------------------------------------------------------------------


def agent_command(python: str, bootstrap: str, args: Sequence[str]) -> str:
    """The remote command line that starts the agent bootstrap (every piece quoted)."""
    quoted = " ".join(shlex.quote(a) for a in args)
    return f"exec {shlex.quote(python)} -u -c {shlex.quote(bootstrap)} {quoted}".rstrip()


class SshSource:
    """Streams one node's agent records over SSH, reconnecting with backoff, never raising."""

    def __init__(
        self,
        spec: HostSpec,
        settings: SshSettings,
        agent_args: Sequence[str] = (),
        follows: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.shared = settings.shared()
        self.shared.load_keys()  # once for all hosts; raises ValueError for a bad -i key
        self.name = spec.name
        self.agent_args = list(agent_args)
        self.follows = list(follows)
        self.decoder = Decoder()
        self.attempts = 0
        self.state = "connecting"
        self.reason = ""
        self.agent_pid: int | None = None
        self._stdin: asyncssh.SSHWriter | None = None

    # control channel

    def send(self, command: dict[str, Any]) -> bool:
        """Send one control command (a JSON line) to the running agent; False when not up."""
        if self._stdin is None:
            return False
        try:
            self._stdin.write(json.dumps(command) + "\n")
        except Exception:  # noqa: BLE001 - the channel may be closing; the run loop reports it
            return False
        return True

    def follow(self, kind: str, path: str, from_start: bool = False) -> bool:
        """Ask the running agent to follow another file (kept for reconnects).

        ``kind`` is verl | nccl | verl_config; the agent reads from the end unless
        ``from_start``. Returns False when the agent is not up (it gets the file at reconnect).
        """
        wire_kind = f"{kind}+start" if from_start else kind
        if (wire_kind, path) not in self.follows:
            self.follows.append((wire_kind, path))
        return self.send({"cmd": "follow", "kind": kind, "path": path, "from_start": from_start})

    # run loop

    def _state(self, emit: Emit, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        emit(HostState(host=self.name, t=time.time(), state=state, reason=reason))

    async def run(self, emit: Emit) -> None:
        """Connect, stream and reconnect until cancelled. Emits HostState for every change."""
        backoff = Backoff(self.settings)
        while True:
            self.attempts += 1
            self._state(
                emit, "connecting", "" if self.attempts == 1 else f"attempt {self.attempts}"
            )
            try:
                await self._session(emit)
                fail = _HostFailure("down", "agent stream ended")
            except asyncio.CancelledError:
                raise
            except _HostFailure as exc:
                fail = exc
            except Exception as exc:  # noqa: BLE001 - nothing a host does may stop the others
                fail = classify(exc, None, self.spec, self.shared)
            delay = backoff.next(fail.attention, fail.healthy_for)
            self._state(emit, fail.state, f"{fail.reason} (retry in {_fmt_delay(delay)})")
            await asyncio.sleep(delay)

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, _Client]:
        spec, s = self.spec, self.settings
        client = _Client(self.shared.known)
        kwargs = self.shared.connect_kwargs(client)
        jump = s.jump
        if jump is None:
            try:
                cfg_jump = self.shared.host_config(spec.host, spec.port, spec.user).get("ProxyJump")
            except Exception:  # noqa: BLE001 - a broken config is reported by asyncssh itself
                cfg_jump = None
            if isinstance(cfg_jump, str) and cfg_jump.lower() != "none":
                jump = cfg_jump
        async with self.shared.semaphore:
            if jump:
                kwargs["tunnel"] = await self.shared.bastion(jump).get()
            user = spec.user or s.user
            try:
                conn = await asyncssh.connect(
                    spec.host, spec.port or (), username=user or (), **kwargs
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise classify(exc, client, spec, self.shared) from None
            self.shared.handshakes += 1
        return conn, client

    async def _session(self, emit: Emit) -> None:
        """One connection's life; always ends by raising (_HostFailure or CancelledError)."""
        from verl_top.agent import agent_payload, bootstrap_for

        conn, client = await self._connect()
        stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        up_since: float | None = None
        stderr_task: asyncio.Task[None] | None = None
        proc: asyncssh.SSHClientProcess | None = None
        try:
            args = ["--host", self.name, *self.agent_args]
            for kind, path in self.follows:
                args += ["--follow", f"{kind}:{path}"]
            # ps on the node shows verl_top_agent='<this host>' (docs/agent.md)
            cmd = agent_command(self.settings.python, bootstrap_for(socket.gethostname()), args)
            proc = await conn.create_process(cmd, encoding="utf-8", errors="replace")
            proc.stdin.write(agent_payload())
            self._stdin = proc.stdin
            stderr_task = asyncio.create_task(_collect(proc.stderr, stderr_tail))
            try:
                async for line in proc.stdout:
                    rec = self.decoder.decode(line)
                    if rec is None:
                        continue
                    if isinstance(rec, Hello):
                        self.agent_pid = rec.pid
                        if up_since is None:
                            up_since = time.monotonic()
                            self._state(emit, "up")
                    _rename(rec, self.name)
                    emit(rec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                fail = classify(exc, client, self.spec, self.shared)
                fail.healthy_for = _since(up_since)
                raise fail from None
            # stdout ended: the agent exited (or the channel closed).
            if stderr_task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(stderr_task), 1.0)
            status = None
            with contextlib.suppress(Exception):
                done = await asyncio.wait_for(proc.wait(check=False), 2.0)
                status = done.exit_status
            fail = self._exit_failure(status, list(stderr_tail), up_since is not None)
            fail.healthy_for = _since(up_since)
            raise fail
        finally:
            self._stdin = None
            if stderr_task is not None:
                stderr_task.cancel()
            await _close(conn, proc)

    def _exit_failure(self, status: int | None, tail: list[str], had_hello: bool) -> _HostFailure:
        text = " | ".join(line.strip() for line in tail if line.strip())[-400:]
        not_found = status == 127 or any(
            ("not found" in line or "No such file" in line) and self.settings.python in line
            for line in tail
        )
        if not had_hello and not_found:
            return _HostFailure(
                "no_python",
                f"{self.settings.python} not found on the node (install Python >= 3.8 or put "
                f"python3 on the login PATH){': ' + text if text else ''}",
            )
        what = "agent exited" if status is not None else "agent stream closed"
        if status is not None:
            what += f" with status {status}"
        return _HostFailure("down", f"{what}{': ' + text if text else ''}")


def _since(t0: float | None) -> float:
    return 0.0 if t0 is None else time.monotonic() - t0


def _rename(rec: Record, name: str) -> None:
    # The UI keys hosts by the name the user gave, not the node's own hostname.
    if rec.host != name:
        rec.host = name


def _fmt_delay(delay: float) -> str:
    return f"{delay:.1f} s" if delay < 10 else f"{delay:.0f} s"


async def _collect(stream: asyncssh.SSHReader, tail: collections.deque[str]) -> None:
    with contextlib.suppress(Exception):
        async for line in stream:
            if line:
                tail.append(line.rstrip("\n"))


async def _close(conn: asyncssh.SSHClientConnection, proc: Any) -> None:
    """Close stdin (the agent exits on EOF), then the connection; never raises."""
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.write_eof()
    conn.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(conn.wait_closed()), 2.0)


# --- one-off commands (probes) ---------------------------------------------------------------


class RemoteCommandError(Exception):
    """A command could not be run on (or lost its connection to) a host; ``reason`` in words."""

    def __init__(self, host: str, state: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.state = state  # a HostState value: down, auth_failed, hostkey_changed
        self.reason = reason


async def run_remote(
    settings: SshSettings,
    spec: HostSpec,
    command: str,
    stdin_text: str = "",
    *,
    close_stdin: bool = False,
) -> AsyncIterator[str]:
    """Run the shell ``command`` on ``spec`` and yield its output lines (stderr merged in).

    Connects exactly as :class:`SshSource` does (same options, host-key policy, bastion and
    handshake cap). ``stdin_text`` is written first; stdin then stays open (unless
    ``close_stdin``) so the command can treat EOF as "the client is gone": sshd sends no signal
    to a command without a tty when the connection closes, it only closes the pipes. When the
    generator ends, is closed or its task is cancelled, the command also gets SIGTERM through
    the channel (best effort), stdin EOF, and the connection is closed. Raises
    :class:`RemoteCommandError` for connection, login and host-key failures.
    """
    source = SshSource(spec, settings)
    try:
        conn, client = await source._connect()
    except _HostFailure as exc:
        raise RemoteCommandError(spec.name, exc.state, exc.reason) from None
    proc: asyncssh.SSHClientProcess | None = None
    try:
        try:
            proc = await conn.create_process(
                command, encoding="utf-8", errors="replace", stderr=asyncssh.STDOUT
            )
            if stdin_text:
                proc.stdin.write(stdin_text)
            if close_stdin:
                proc.stdin.write_eof()
            async for line in proc.stdout:
                if line:  # asyncssh ends with "" at EOF; a blank line is "\n"
                    yield line.rstrip("\n")
        except Exception as exc:  # noqa: BLE001 - classified like the agent stream's failures
            fail = classify(exc, client, spec, source.shared)
            raise RemoteCommandError(spec.name, fail.state, fail.reason) from None
    finally:
        if proc is not None and proc.exit_status is None and proc.exit_signal is None:
            with contextlib.suppress(Exception):
                proc.send_signal("TERM")
        await _close(conn, proc)
