"""Remote nodes over SSH: one asyncio task per host runs the node agent and streams its records.

Each :class:`SshSource` connects with asyncssh (honouring ``~/.ssh/config``, ssh-agent and the
default keys), starts ``python3 -u -c BOOTSTRAP ARGS`` on the node, sends the zipped agent on
stdin and keeps stdin open as the agent's control channel. Failures never escape a host's
task: they become :class:`~verl_top.model.HostState` records, and the task reconnects with
exponential backoff and jitter. Everything shared between hosts (loaded keys, the handshake
semaphore, bastion connections, known_hosts updates) lives in :class:`SshShared`, created once
per :class:`SshSettings`. See docs/hosts-and-ssh.md for the user-facing side.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import errno
import hashlib
import hmac
import ipaddress
import json
import os
import random
import shlex
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import asyncssh

from verl_top.deadline import time_limit, within
from verl_top.model import Hello, HostState
from verl_top.node_exec import OUTPUT_MAX, ExecResult, Runner
from verl_top.protocol import Decoder
from verl_top.sources.base import Emit
from verl_top.sources.hosts import HostSpec
from verl_top.sources.intake import Intake, read_lines
from verl_top.sources.liveness import Liveness, hang_limit, watch
from verl_top.sources.ssh_config import (
    CliOverrides,
    HostConfig,
    config_files,
    jump_chain,
    resolve,
)
from verl_top.untrusted import clean_text

UNKNOWN_HOST_REASON = "host key not in known_hosts (use --accept-new-hosts or ssh once by hand)"
STDERR_TAIL_LINES = 8
DEFAULT_TIMEOUT = 10.0  # s, when neither --connect-timeout nor ConnectTimeout is given


@dataclass
class SshSettings:
    """SSH options for all hosts, built once from the command line (``flags.ssh_settings``)."""

    ssh_config: str | None = None  # None: ~/.ssh/config when readable (asyncssh default)
    identities: tuple[str, ...] = ()  # -i; empty: IdentityFile, default keys and ssh-agent
    jump: str | None = None  # --jump: one bastion shared by every host
    known_hosts: str | None = None  # None: UserKnownHostsFile from the config (ssh's default)
    accept_new_hosts: bool = False  # True: StrictHostKeyChecking=accept-new over the config
    connect_timeout: float | None = None  # None: ConnectTimeout from the config, else 10 s
    max_handshakes: int = 16
    user: str | None = None  # --ssh-user: default login name (user@ in the hosts file wins)
    keepalive_interval: float = 1.0
    keepalive_count_max: int = 3
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    healthy_after: float = 30.0  # a stream this long resets the backoff
    attention_backoff: float = 300.0  # auth and host-key failures need a person: retry rarely
    python: str = "python3"  # interpreter started on the node
    hang_intervals: float = 10.0  # an agent silent this many intervals is replaced...
    hang_min_s: float = 5.0  # ...but never sooner than this
    _shared: SshShared | None = field(default=None, init=False, repr=False, compare=False)

    def cli(self) -> CliOverrides:
        """The flags that override the ssh_config file, as ``ssh -o`` would."""
        return CliOverrides(
            user=self.user,
            identities=self.identities,
            jump=self.jump,
            known_hosts=self.known_hosts,
            strict="accept-new" if self.accept_new_hosts else None,
            connect_timeout=self.connect_timeout,
        )

    def shared(self) -> SshShared:
        """The state every host of these settings shares (created on first use)."""
        if self._shared is None:
            self._shared = SshShared(self)
        return self._shared


def build_ssh_sources(
    specs: Sequence[HostSpec],
    settings: SshSettings,
    agent_args: Sequence[str] = (),
    follows: Sequence[tuple[str, str]] = (),
) -> list[SshSource]:
    """One :class:`SshSource` per host, all sharing one :class:`SshSettings`.

    ``agent_args`` are extra agent options (``--interval 1``); ``follows`` are (kind, path)
    files every one of these hosts should follow.
    """
    return [SshSource(spec, settings, agent_args, follows) for spec in specs]


@dataclass
class SshHostsSettings:
    """The SSH source's settings for the registry: hosts, shared options, per-host files."""

    KIND: ClassVar[str] = "ssh"
    hosts: Sequence[HostSpec]
    ssh: SshSettings
    agent_args: Sequence[str] = ()
    follows: Mapping[str, Sequence[tuple[str, str]]] = field(default_factory=dict)  # by alias


def build_sources(settings: SshHostsSettings) -> list[SshSource]:
    """The registry's entry point: one SSH source per host."""
    return [
        SshSource(spec, settings.ssh, settings.agent_args, settings.follows.get(spec.alias, ()))
        for spec in settings.hosts
    ]


# --- host keys -------------------------------------------------------------------------------


def _known_host_pattern(host: str, port: int | None) -> str:
    return host if port in (None, 22) else f"[{host}]:{port}"


def _read_known_hosts(path: str) -> asyncssh.SSHKnownHosts | None:
    """One known_hosts file; lines asyncssh cannot parse are skipped, as ssh skips them."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    try:
        return asyncssh.import_known_hosts(text)
    except ValueError:
        good = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                asyncssh.import_known_hosts(line)
                good.append(line)
        return asyncssh.import_known_hosts("\n".join(good))


class KnownHostsCache:
    """Parsed known_hosts files, re-read only when a file changes (size or mtime): hundreds of
    hosts connecting at once must not parse a large file hundreds of times."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[tuple[int, int], asyncssh.SSHKnownHosts | None]] = {}

    def get(self, path: str) -> asyncssh.SSHKnownHosts | None:
        """The parsed file, or None when it cannot be read."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._files.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        known = _read_known_hosts(path)
        self._files[path] = (stamp, known)
        return known


def _lookup(known: asyncssh.SSHKnownHosts, name: str) -> tuple[list, list, list]:
    # Exactly this name: asyncssh's public match() would also take entries for the peer's IP
    # address, which ssh does not (CheckHostIP is a separate check in HostKeyPolicy).
    keys, ca_keys, revoked = known._match(name, "")[:3]
    return (list(keys), list(ca_keys), list(revoked))


def _hashed(name: str) -> str:
    """A known_hosts host field hashed as ssh's HashKnownHosts writes it (``|1|salt|hash``)."""
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


class HostKeyPolicy:
    """OpenSSH host-key checking for one host: its known_hosts files, StrictHostKeyChecking,
    HostKeyAlias and CheckHostIP, as computed in :class:`HostConfig`."""

    def __init__(self, hc: HostConfig, direct: bool, cache: KnownHostsCache | None = None) -> None:
        self.hc = hc
        self.cache = cache or KnownHostsCache()
        self.direct = direct  # no jump or ProxyCommand: the peer address is the host's
        self.name = hc.known_hosts_name
        self.problem: tuple[str, str] | None = None  # ("unknown" | "changed", detail)
        self.warning = ""
        self.added_to: str | None = None

    def _each(self, name: str) -> list[tuple[str, tuple[list, list, list]]]:
        out = []
        for path in self.hc.known_hosts_files:
            known = self.cache.get(path)
            if known is not None:
                found = _lookup(known, name)
                if any(found):
                    out.append((path, found))
        return out

    def trusted(self, _host: str, _addr: str, _port: int | None) -> tuple[list, list, list]:
        """asyncssh's ``known_hosts`` callable: (keys, CA keys, revoked) for this host.

        Like ssh, a host on another port than 22 with no ``[host]:port`` entry is also
        checked against plain ``host`` entries ("checking without port identifier"); a key
        that differs there counts as unknown, not as changed.
        """
        found = self._each(self.name)
        if not found and self.name != self.hc.hostname and not self.hc.host_key_alias:
            found = self._each(self.hc.hostname)
        keys: list = []
        ca: list = []
        revoked: list = []
        for _path, (k, c, r) in found:
            keys += k
            ca += c
            revoked += r
        return (keys, ca, revoked)

    def files_text(self) -> str:
        """The known_hosts files that were looked in, for messages."""
        return (
            ", ".join(self.hc.known_hosts_files) or "no known_hosts file (UserKnownHostsFile none)"
        )

    def decide(self, addr: str, key: asyncssh.SSHKey) -> bool:
        """Called by asyncssh for a key known_hosts does not trust: accept it or not."""
        fp = f"{key.get_algorithm()} {key.get_fingerprint()}"
        holders = [path for path, (k, c, _r) in self._each(self.name) if k or c]
        if holders:
            where = holders[0]
            text = (
                f"host key CHANGED for '{self.name}': the server now offers {fp}, which differs "
                f"from {where}; if the node was reinstalled, verify the new key, run "
                f"`ssh-keygen -R '{self.name}' -f {where}` and connect again "
                "(otherwise this may be an attack)"
            )
            if self.hc.strict == "no":  # ssh connects too (and only disables passwords)
                self.warning = f"WARNING: {text}; connected because StrictHostKeyChecking=no"
                return True
            self.problem = ("changed", text)
            return False
        if self.hc.refuses_unknown:
            self.problem = (
                "unknown",
                f"{UNKNOWN_HOST_REASON}; server key {fp}; looked up '{self.name}' in "
                f"{self.files_text()}",
            )
            return False
        self._append(key)
        return True

    def _append(self, key: asyncssh.SSHKey, name: str | None = None) -> None:
        """accept-new / no: remember the key in the first user file, as ssh does."""
        if not self.hc.user_known_hosts:
            return
        path = Path(self.hc.user_known_hosts[0])
        with contextlib.suppress(OSError):  # ssh only warns when it cannot write
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fields = key.export_public_key("openssh").decode().split()
            pattern = name or self.name
            if self.hc.hash_known_hosts:
                pattern = _hashed(pattern)
            line = f"{pattern} {fields[0]} {fields[1]}\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                if path.is_file() and fh.tell() > 0 and not path.read_bytes().endswith(b"\n"):
                    fh.write("\n")
                fh.write(line)
            self.added_to = str(path)

    def check_ip(self, addr: str, key: asyncssh.SSHKey | None) -> str | None:
        """CheckHostIP, as ssh does it: the peer address's known_hosts entry must not hold
        another key. Returns the refusal (any StrictHostKeyChecking but no) or sets a warning;
        remembers the address when it has no entry yet. Off, as in ssh, for proxied
        connections, loopback peers and host names that are the address itself."""
        if not (self.hc.check_host_ip and self.direct and addr and key is not None):
            return None
        try:
            if ipaddress.ip_address(addr).is_loopback or addr == self.hc.hostname:
                return None
        except ValueError:
            return None
        ip_name = _known_host_pattern(addr, self.hc.port)
        recorded = [k for _p, (ks, _c, _r) in self._each(ip_name) for k in ks]
        if not recorded:
            self._append(key, ip_name)
            return None
        if key in recorded:
            return None
        text = (
            f"the host key for '{self.name}' differs from the key recorded for its IP address "
            f"'{ip_name}' (CheckHostIP)"
        )
        if self.hc.strict != "no":
            return text
        self.warning = f"WARNING: {text}"
        return None


class _Client(asyncssh.SSHClient):
    """Per-connection client: decides about untrusted host keys and remembers why it refused."""

    def __init__(self, policy: HostKeyPolicy) -> None:
        self.policy = policy
        self.closed = False
        self.conn: asyncssh.SSHClientConnection | None = None

    @property
    def problem(self) -> tuple[str, str] | None:
        """("unknown" | "changed" | "ip", detail) when the host key was refused."""
        return self.policy.problem

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        # Called by asyncssh only for a key that known_hosts does not already trust.
        return self.policy.decide(addr, key)

    def auth_completed(self) -> None:
        # The key is accepted by now; CheckHostIP compares it with the address's entry.
        conn = self.conn
        if conn is None:
            return
        peer = conn.get_extra_info("peername") or ("",)
        refusal = self.policy.check_ip(str(peer[0]), conn.get_server_host_key())
        if refusal:
            self.policy.problem = ("ip", refusal)
            conn.abort()


# --- shared state ---------------------------------------------------------------------------


class _HostFailure(Exception):
    """A classified failure: the host state to show and whether it needs a person."""

    def __init__(self, state: str, reason: str, attention: bool = False) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason
        self.attention = attention
        self.healthy_for = 0.0  # how long the stream had been up before this failure


@dataclass
class Route:
    """How one node is reached: its effective config and the hops in front of it."""

    hc: HostConfig
    chain: list[HostConfig]

    @property
    def text(self) -> str:
        """``user@host:port`` plus `` via hop -> hop`` (for messages)."""
        via = " -> ".join(h.target for h in self.chain)
        how = f" via {via}" if via else ""
        if not via and self.hc.proxy_command:
            how = f" via ProxyCommand {self.hc.proxy_command!r}"
        return f"{self.hc.target}{how}"


class SshShared:
    """What all hosts of one :class:`SshSettings` share: keys, semaphore, bastions, config."""

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self.client_keys: Sequence[asyncssh.SSHKeyPair] | None = None
        self._sem: asyncio.Semaphore | None = None
        self.bastions: dict[str, Bastion] = {}
        self.known_hosts = KnownHostsCache()
        self.handshakes = 0  # connections opened to nodes (for tests and stats)

    def load_keys(self) -> None:
        """Check that the ``-i`` keys load, once (raises ValueError for an unreadable key)."""
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

    def config_paths(self) -> list[str]:
        """The ssh_config files read for every host (--ssh-config, else ~/.ssh/config)."""
        return config_files(self.settings.ssh_config)

    def host_config(self, host: str, port: int | None, user: str | None) -> HostConfig:
        """The effective settings of ``[user@]host[:port]`` (raises _HostFailure for a config
        file that cannot be parsed)."""
        try:
            return resolve(self.config_paths(), host, port, user, self.settings.cli())
        except (asyncssh.Error, ValueError, OSError) as exc:
            raise _HostFailure("down", f"ssh config: {exc}", True) from None

    def route(self, spec: HostSpec) -> Route:
        """The node's effective config and its jump chain (``--jump`` over ProxyJump)."""
        hc = self.host_config(spec.host, spec.port, spec.user)
        chain: list[HostConfig] = []
        if hc.proxy_jump:
            try:
                chain = jump_chain(self.config_paths(), hc.proxy_jump, self.settings.cli())
            except (asyncssh.Error, ValueError, OSError) as exc:
                raise _HostFailure("down", f"ProxyJump {hc.proxy_jump}: {exc}", True) from None
        return Route(hc, chain)

    def connect_kwargs(self, hc: HostConfig, client: _Client) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect`` to one host (node or hop).

        asyncssh reads the same config files itself (HostName, IdentityFile, ProxyCommand,
        ciphers, ...); what is passed here is what verl-top decides: the host-key policy,
        the timeouts (flags over the config), keepalives and the keys named by ``-i``.
        """
        s = self.settings
        timeout = hc.connect_timeout if hc.connect_timeout is not None else DEFAULT_TIMEOUT
        kwargs: dict[str, Any] = {
            "config": self.config_paths(),
            "known_hosts": client.policy.trusted,
            "connect_timeout": timeout,
            "login_timeout": timeout,
            # verl-top's fast keepalive unless the config sets one (then the config's).
            "keepalive_interval": _keepalive(hc, s)[0],  # 0 (ServerAliveInterval 0): off
            "keepalive_count_max": _keepalive(hc, s)[1],
            "client_factory": lambda: client,
            "ignore_encrypted": True,  # a key with a passphrase must be in ssh-agent
        }
        if s.identities or hc.identity_files:
            kwargs["client_keys"] = list(hc.identity_files)
        return kwargs

    def bastion(self, chain: list[HostConfig]) -> Bastion:
        """The shared connection through ``chain`` (one per distinct chain of targets)."""
        key = " -> ".join(h.target for h in chain)
        b = self.bastions.get(key)
        if b is None:
            b = self.bastions[key] = Bastion(key, chain, self)
        return b

    async def close(self) -> None:
        """Close bastion connections."""
        for b in self.bastions.values():
            await b.close()


def make_client(
    hc: HostConfig, tunnel: asyncssh.SSHClientConnection | None, shared: SshShared | None = None
) -> _Client:
    """The asyncssh client for one connection to ``hc``, with its host-key policy."""
    direct = tunnel is None and not hc.proxy_command
    return _Client(HostKeyPolicy(hc, direct, shared.known_hosts if shared else None))


async def connect_host(
    shared: SshShared,
    hc: HostConfig,
    tunnel: asyncssh.SSHClientConnection | None,
    client: _Client,
) -> asyncssh.SSHClientConnection:
    """Open one SSH connection to ``hc`` (through ``tunnel`` when given). Raises what asyncssh
    raises; ``client`` keeps why a host key was refused and any warning."""
    kwargs = shared.connect_kwargs(hc, client)
    # The proxy is passed explicitly: OpenSSH's "first of ProxyJump/ProxyCommand wins" is
    # decided in ssh_config.py, not by asyncssh's own reading of the same file.
    proxy = None if tunnel is not None else hc.proxy_command
    conn = await asyncssh.connect(
        hc.name, hc.port, username=hc.user, tunnel=tunnel, proxy_command=proxy, **kwargs
    )
    if client.problem:  # CheckHostIP refused the key after login
        conn.abort()
        raise asyncssh.HostKeyNotVerifiable(client.problem[1])
    return conn


class Bastion:
    """One jump-host connection (or chain) shared by every node behind it, reopened when it dies."""

    def __init__(self, jump: str, chain: list[HostConfig], shared: SshShared) -> None:
        self.jump = jump
        self.chain = chain
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
        for i, hc in enumerate(self.chain):
            client = make_client(hc, conn, self.shared)
            try:
                # The next hop goes through the previous one.
                conn = await connect_host(self.shared, hc, conn, client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified for the hosts behind it
                route = Route(hc, self.chain[:i])
                fail = classify(exc, client, route, self.shared)
                raise _HostFailure(
                    fail.state, f"bastion {hc.name}: {fail.reason}", fail.attention
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
                await within(self._conn.wait_closed(), 2)
            self._conn = None


def _keepalive(hc: HostConfig, s: SshSettings) -> tuple[float, int]:
    """(interval, misses allowed): the config's ServerAlive* when set, else verl-top's."""
    interval = s.keepalive_interval if hc.keepalive_interval is None else hc.keepalive_interval
    count = s.keepalive_count_max if hc.keepalive_count_max is None else hc.keepalive_count_max
    return interval, count


def _identities_text(hc: HostConfig) -> str:
    tried = [f"key {p}" for p in hc.identity_files]
    if os.environ.get("SSH_AUTH_SOCK"):
        tried.append(
            "ssh-agent keys" + (" matching them (IdentitiesOnly)" if hc.identities_only else "")
        )
    text = ", ".join(tried) if tried else "no key (no IdentityFile, no ~/.ssh/id_*, no ssh-agent)"
    if hc.identities_missing:
        text += "; not found: " + ", ".join(hc.identities_missing)
    return text


def classify(
    exc: BaseException, client: _Client | None, route: Route, shared: SshShared
) -> _HostFailure:
    """Turn a connect/stream exception into a host state and a reason in plain words.

    Reasons name the effective values: ``user@host:port`` and the jump chain, the known_hosts
    files looked in, and the keys tried.
    """
    hc = route.hc
    if isinstance(exc, _HostFailure):
        return exc
    if client is not None and client.problem and client.problem[0] == "ip":
        return _HostFailure("hostkey_changed", f"{client.problem[1]} ({route.text})", True)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        problem = client.problem if client is not None else None
        if problem and problem[0] == "unknown":
            return _HostFailure("down", problem[1], True)
        if problem:
            return _HostFailure("hostkey_changed", problem[1], True)
        return _HostFailure(
            "hostkey_changed",
            f"host key refused for {route.text}: {exc.reason} "
            f"(known_hosts: {', '.join(hc.known_hosts_files)})",
            True,
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return _HostFailure(
            "auth_failed",
            f"server refused login as {hc.user} on {route.text} (tried {_identities_text(hc)}); "
            f"add your public key to ~{hc.user}/.ssh/authorized_keys on {hc.hostname} or "
            "pass -i KEY / --ssh-user",
            True,
        )
    if isinstance(exc, ConnectionRefusedError):
        return _HostFailure(
            "down",
            f"connection refused by {route.text} (is sshd running on port {hc.port}?)",
        )
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        timeout = hc.connect_timeout if hc.connect_timeout is not None else DEFAULT_TIMEOUT
        return _HostFailure(
            "down",
            f"timed out after {timeout:g} s connecting to {route.text} "
            "(no SSH answer; host down or firewalled?)",
        )
    if isinstance(exc, socket.gaierror):
        return _HostFailure(
            "down", f"unknown host name {hc.hostname!r} for {hc.name!r} ({exc.strerror})"
        )
    if isinstance(exc, asyncssh.ConnectionLost):
        if "keepalive" in str(exc.reason).lower():
            s = shared.settings
            interval, count = _keepalive(hc, s)
            return _HostFailure(
                "down", f"keepalive timeout (no answer for ~{interval * (count + 1):g} s)"
            )
        return _HostFailure("down", f"connection closed by peer ({route.text})")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return _HostFailure("down", f"cannot open channel to {route.text}: {exc.reason}")
    if isinstance(exc, asyncssh.DisconnectError):
        return _HostFailure("down", f"disconnected by {route.text}: {exc.reason}")
    if isinstance(exc, OSError):
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return _HostFailure("down", f"no route to host ({route.text})")
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):  # EPIPE: a ProxyCommand that exited
            return _HostFailure("down", f"connection closed by peer ({route.text})")
        return _HostFailure("down", f"network error on {route.text}: {exc.strerror or exc}")
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
        self.intake: Intake | None = None  # the current connection's (clock offset, drops)
        self.attempts = 0
        self.state = "connecting"
        self.reason = ""
        self.agent_pid: int | None = None
        self.route: Route | None = None  # effective config and jump chain of the last attempt
        self.warning = ""  # host-key warning of the live connection (StrictHostKeyChecking=no)
        self._stdin: asyncssh.SSHWriter | None = None
        self._conn: asyncssh.SSHClientConnection | None = None  # while the agent runs

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
        reason = clean_text(reason, 2048)  # may quote the server (disconnect reason, stderr)
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
                fail = (
                    classify(exc, None, self.route, self.shared)
                    if self.route is not None
                    else _HostFailure("down", f"unexpected error: {type(exc).__name__}: {exc}")
                )
            delay = backoff.next(fail.attention, fail.healthy_for)
            self._state(emit, fail.state, f"{fail.reason} (retry in {_fmt_delay(delay)})")
            await asyncio.sleep(delay)

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, _Client, Route]:
        """Connect to the node (through its jump hosts): the connection, its client, its route."""
        route = self.shared.route(self.spec)
        self.route = route
        async with self.shared.semaphore:
            tunnel = await self.shared.bastion(route.chain).get() if route.chain else None
            client = make_client(route.hc, tunnel, self.shared)
            try:
                conn = await connect_host(self.shared, route.hc, tunnel, client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise classify(exc, client, route, self.shared) from None
            self.shared.handshakes += 1
        self.warning = client.policy.warning
        return conn, client, route

    async def _session(self, emit: Emit) -> None:
        """One connection's life; always ends by raising (_HostFailure or CancelledError)."""
        from verl_top.agent.ship import agent_payload, bootstrap_for

        conn, client, route = await self._connect()
        stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        up_since: float | None = None
        stderr_task: asyncio.Task[None] | None = None
        watchdog: asyncio.Task[None] | None = None
        proc: asyncssh.SSHClientProcess | None = None
        live = Liveness()
        try:
            args = ["--host", self.name, *self.agent_args]
            for kind, path in self.follows:
                args += ["--follow", f"{kind}:{path}"]
            # ps on the node shows verl_top_agent='<this host>' (docs/agent.md)
            cmd = agent_command(self.settings.python, bootstrap_for(socket.gethostname()), args)
            proc = await conn.create_process(cmd, encoding="utf-8", errors="replace")
            proc.stdin.write(agent_payload(args))  # the replay backend only when asked
            self._stdin = proc.stdin
            self._conn = conn
            stderr_task = asyncio.create_task(_collect(proc.stderr, stderr_tail))
            intake = Intake(self.name, self.decoder)
            self.intake = intake
            watchdog = asyncio.create_task(self._watch(emit, live, conn, proc))
            try:
                # Framed by read_lines, not readline: a long record arrives whole (intake.py).
                async for line in read_lines(proc.stdout):
                    rec = intake.accept(line, emit)
                    if rec is None:
                        continue
                    if live.seen():
                        self._state(emit, "up", self.warning)
                    if isinstance(rec, Hello):
                        self.agent_pid = rec.pid
                        self._hello(live, rec)
                        if up_since is None:
                            up_since = time.monotonic()
                            self._state(emit, "up", self.warning)
                intake.report(emit, force=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                fail = classify(exc, client, route, self.shared)
                fail.healthy_for = _since(up_since)
                raise fail from None
            # stdout ended: the agent exited (or the channel closed).
            if live.hung_for is not None:
                fail = _HostFailure(
                    "down",
                    f"agent hung: no data for {live.hung_for:.0f} s while the connection "
                    f"stayed up; killed it (pid {self.agent_pid}) and starting a new one",
                )
                fail.healthy_for = _since(up_since)
                raise fail
            if stderr_task is not None:
                with contextlib.suppress(Exception):
                    await within(asyncio.shield(stderr_task), 1.0)
            status = None
            with contextlib.suppress(Exception):
                done = await within(proc.wait(check=False), 2.0)
                status = done.exit_status
            fail = self._exit_failure(status, list(stderr_tail), up_since is not None)
            fail.healthy_for = _since(up_since)
            raise fail
        finally:
            self._stdin = None
            self._conn = None
            for task in (stderr_task, watchdog):
                if task is not None:
                    task.cancel()
            await _close(conn, proc)

    async def exec(self, argv: Sequence[str], timeout: float, stdin: str = "") -> ExecResult:
        """Run ``argv`` on the node as a separate exec on the agent's connection (stacks,
        signals). Raises RemoteCommandError while the host is not connected."""
        conn = self._conn
        if conn is None:
            raise RemoteCommandError(self.name, "down", "not connected (no agent running)")
        return await exec_argv(conn, argv, timeout, stdin)

    def _hello(self, live: Liveness, hello: Hello) -> None:
        interval = hello.interval if hello.interval and hello.interval > 0 else 1.0
        live.interval, live.up = interval, True
        s = self.settings
        live.hang_after = hang_limit(interval, s.hang_intervals, s.hang_min_s)

    async def _watch(
        self,
        emit: Emit,
        live: Liveness,
        conn: asyncssh.SSHClientConnection,
        proc: asyncssh.SSHClientProcess,
    ) -> None:
        async def replace(_silent: float) -> None:
            await _kill_agent(conn, proc, self.agent_pid)
            proc.close()  # ends the read loop, which reports the hang

        await watch(live, lambda reason: self._state(emit, "stale", reason), replace)

    def _where(self) -> str:
        return f" {self.route.text}" if self.route is not None else ""

    def _exit_failure(self, status: int | None, tail: list[str], had_hello: bool) -> _HostFailure:
        text = " | ".join(line.strip() for line in tail if line.strip())[-400:]
        not_found = status == 127 or any(
            ("not found" in line or "No such file" in line) and self.settings.python in line
            for line in tail
        )
        if not had_hello and not_found:
            return _HostFailure(
                "no_python",
                f"{self.settings.python} not found on the node{self._where()} (install Python "
                ">= 3.8 or put "
                f"python3 on the login PATH){': ' + text if text else ''}",
            )
        what = "agent exited" if status is not None else "agent stream closed"
        if status is not None:
            what += f" with status {status}"
        return _HostFailure("down", f"{what}{': ' + text if text else ''}")


def _since(t0: float | None) -> float:
    return 0.0 if t0 is None else time.monotonic() - t0


def _fmt_delay(delay: float) -> str:
    return f"{delay:.1f} s" if delay < 10 else f"{delay:.0f} s"


async def _collect(stream: asyncssh.SSHReader, tail: collections.deque[str]) -> None:
    with contextlib.suppress(Exception):
        async for line in stream:
            if line:  # the node's stderr is foreign text: cleaned where it enters
                tail.append(clean_text(line.rstrip("\n"), 512))


async def _kill_agent(
    conn: asyncssh.SSHClientConnection, proc: asyncssh.SSHClientProcess, pid: int | None
) -> None:
    """Kill a hung agent on the node so that nothing is left behind; never raises.

    SIGKILL also ends a stopped process. It goes through the channel first (OpenSSH >= 8.1
    delivers signal requests, but not in every setup: the test sshd answers "session
    signalling requires privilege separation"); if the agent is still there a second later, a
    separate command kills its pid, checked to still be our agent (the bootstrap names it).
    """
    with contextlib.suppress(Exception):
        proc.send_signal("KILL")
    with contextlib.suppress(Exception):
        await within(proc.wait_closed(), 1.0)
        return
    if pid is None:
        return
    cmd = f"grep -q verl-top-agent /proc/{int(pid)}/cmdline 2>/dev/null && kill -KILL {int(pid)}"
    with contextlib.suppress(Exception):
        await within(conn.run(cmd, check=False), 5.0)


async def _close(conn: asyncssh.SSHClientConnection, proc: Any) -> None:
    """Close stdin (the agent exits on EOF), then the connection; never raises."""
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.write_eof()
    conn.close()
    with contextlib.suppress(Exception):
        await within(asyncio.shield(conn.wait_closed()), 2.0)


# --- one-off commands (probes, stacks, signals) ----------------------------------------------


async def _read_to_eof(stream: asyncssh.SSHReader[str]) -> str:
    """A stream's text up to its end, at most OUTPUT_MAX characters (the rest is drained)."""
    parts: list[str] = []
    size = 0
    while chunk := await stream.read(65536):
        if size < OUTPUT_MAX:
            parts.append(chunk[: OUTPUT_MAX - size])
            size += len(parts[-1])
    return "".join(parts)


async def exec_argv(
    conn: asyncssh.SSHClientConnection, argv: Sequence[str], timeout: float, stdin: str = ""
) -> ExecResult:
    """Run ``argv`` as one exec on ``conn``: every argument shell-quoted (the node's sshd
    hands the command line to the login shell), ``stdin`` written then closed, output bounded,
    killed (TERM through the channel) after ``timeout`` seconds."""
    proc = await conn.create_process(shlex.join(argv), encoding="utf-8", errors="replace")
    if stdin:
        proc.stdin.write(stdin)
    proc.stdin.write_eof()
    try:
        async with time_limit(timeout):
            out, err = await asyncio.gather(_read_to_eof(proc.stdout), _read_to_eof(proc.stderr))
            done = await proc.wait(check=False)
        return ExecResult(done.exit_status, out, err)
    except asyncio.TimeoutError:
        with contextlib.suppress(Exception):
            proc.send_signal("TERM")
        return ExecResult(None, "", f"no answer within {timeout:g} s")
    finally:
        proc.close()


@contextlib.asynccontextmanager
async def ssh_exec(settings: SshSettings, spec: HostSpec) -> AsyncIterator[Runner]:
    """One connection to ``spec`` (made as :class:`SshSource` makes it) for several commands:
    yields ``run(argv, timeout)``. Raises :class:`RemoteCommandError` when it cannot connect."""
    source = SshSource(spec, settings)
    try:
        conn, _, _ = await source._connect()
    except _HostFailure as exc:
        raise RemoteCommandError(spec.name, exc.state, exc.reason) from None
    try:

        async def run(argv: Sequence[str], timeout: float, stdin: str = "") -> ExecResult:
            return await exec_argv(conn, argv, timeout, stdin)

        yield run
    finally:
        await _close(conn, None)


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
) -> AsyncGenerator[str, None]:
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
        conn, client, _ = await source._connect()
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
            assert source.route is not None
            fail = classify(exc, client, source.route, source.shared)
            raise RemoteCommandError(spec.name, fail.state, fail.reason) from None
    finally:
        if proc is not None and proc.exit_status is None and proc.exit_signal is None:
            with contextlib.suppress(Exception):
                proc.send_signal("TERM")
        await _close(conn, proc)
