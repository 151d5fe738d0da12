"""What ``ssh`` would use for one host: ssh_config read by asyncssh's own parser, plus flags.

asyncssh parses ``Host``/``Match``/``Include`` and most options itself; it skips
``StrictHostKeyChecking`` and ``CheckHostIP`` and looks up known_hosts more leniently than
OpenSSH (by IP address too, and without the port when ``[host]:port`` is missing). This module
adds those two options to asyncssh's parser and computes, per host, the effective values that
``ssh -F FILE HOST`` would use, with command-line flags overriding the file like ``ssh -o``.
The connection itself (HostName, Port, User, IdentityFile, ProxyCommand, ciphers, ...) is still
made by asyncssh from the same file; this result drives host-key policy, bastion sharing and
the messages. See docs/hosts-and-ssh.md.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncssh.config import SSHClientConfig, SSHConfig

DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_IDENTITIES = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_dsa")
STRICT_VALUES = {
    "yes": "yes",
    "true": "yes",
    "ask": "ask",
    "accept-new": "accept-new",
    "no": "no",
    "off": "no",
    "false": "no",
}
MAX_JUMP_DEPTH = 8
SYSTEM_CONFIG = "/etc/ssh/ssh_config"


def _set_strict(self: SSHClientConfig, option: str, args: list[str]) -> None:
    value = args.pop(0).lower()
    if value not in STRICT_VALUES:
        self._error(f"Invalid {option} value: {value}")
    if option not in self._options:  # first obtained value wins, as in OpenSSH
        self._options[option] = STRICT_VALUES[value]


def _set_proxy(self: SSHClientConfig, option: str, args: list[str]) -> None:
    # ProxyJump and ProxyCommand exclude each other, the first one obtained winning, as in
    # OpenSSH (asyncssh keeps both). Checked against ssh 9.2: any ProxyCommand, "none" too,
    # blocks a later ProxyJump; "ProxyJump none" does not block a later ProxyCommand.
    blocked = (
        "ProxyCommand" in self._options
        if option == "ProxyJump"
        else self._options.get("ProxyJump") is not None
    )
    if blocked:
        args.clear()
        return
    SSHClientConfig._set_string(self, option, args)


class _Config(SSHClientConfig):
    """asyncssh's client config parser with the host-key options it does not read."""

    _handlers = {
        **SSHClientConfig._handlers,
        "proxyjump": ("ProxyJump", _set_proxy),
        "proxycommand": ("ProxyCommand", _set_proxy),
        "stricthostkeychecking": ("StrictHostKeyChecking", _set_strict),
        "checkhostip": ("CheckHostIP", SSHClientConfig._set_bool),
        "batchmode": ("BatchMode", SSHClientConfig._set_bool),
        "hashknownhosts": ("HashKnownHosts", SSHClientConfig._set_bool),
    }


@dataclass(frozen=True)
class CliOverrides:
    """Command-line values that win over the config file (None: take the file's)."""

    user: str | None = None
    identities: tuple[str, ...] = ()
    jump: str | None = None
    known_hosts: str | None = None
    strict: str | None = None  # "accept-new" from --accept-new-hosts
    connect_timeout: float | None = None


@dataclass(frozen=True)
class HostConfig:
    """The effective OpenSSH settings of one host (one hop of a chain, or a node)."""

    name: str  # as given (alias or address)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]  # existing files, in the order ssh tries them
    identities_missing: tuple[str, ...]  # named in config/-i but not on disk
    identities_only: bool
    proxy_jump: str | None  # None: direct (or ProxyCommand)
    proxy_command: str | None
    user_known_hosts: tuple[str, ...]
    global_known_hosts: tuple[str, ...]
    strict: str  # yes | ask | accept-new | no
    host_key_alias: str | None
    check_host_ip: bool
    hash_known_hosts: bool  # new known_hosts entries are written hashed
    connect_timeout: float | None
    keepalive_interval: float | None
    keepalive_count_max: int | None
    config_files: tuple[str, ...]

    @property
    def target(self) -> str:
        """``user@hostname:port`` (what the connection really goes to)."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"

    @property
    def known_hosts_files(self) -> tuple[str, ...]:
        """Every known_hosts file consulted, user files first."""
        return self.user_known_hosts + self.global_known_hosts

    @property
    def known_hosts_name(self) -> str:
        """The name looked up in known_hosts: HostKeyAlias as is, else ``[host]:port``."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def refuses_unknown(self) -> bool:
        """True when a host key that is not in known_hosts is refused (yes, and ask without a
        terminal: verl-top never prompts)."""
        return self.strict in ("yes", "ask")


def local_user() -> str:
    """The local login name (``root`` when it cannot be found)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def config_files(path: str | None, system: str = SYSTEM_CONFIG) -> list[str]:
    """The ssh_config files to read, as ssh does: ``path`` alone (``ssh -F``), else
    ~/.ssh/config and then the system-wide file, each when readable."""
    if path:
        return [path]
    found = [Path("~/.ssh/config").expanduser(), Path(system)]
    return [str(p) for p in found if os.access(p, os.R_OK)]


def load(paths: Sequence[str], host: str, port: int | None, user: str | None) -> SSHConfig:
    """asyncssh's parse of ``paths`` for ``host`` (``port``/``user`` as given on the command
    line, which ssh_config cannot override). Raises asyncssh.config.ConfigParseError."""
    me = local_user()
    return _Config.load(None, list(paths), False, False, False, me, user or (), host, port or ())


def _expand(path: str, tokens: dict[str, str]) -> str:
    """``%h``-style tokens, ``${VAR}`` environment variables and ``~``, as ssh expands paths."""
    path = re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m.group(1), ""), path)
    out, i = [], 0
    while i < len(path):
        ch = path[i]
        if ch == "%" and i + 1 < len(path):
            out.append(tokens.get(path[i + 1], "%" + path[i + 1]))
            i += 2
            continue
        out.append(ch)
        i += 1
    return os.path.expanduser("".join(out))


def _number(value: object) -> int | float | str:
    """A numeric option for int()/float(): asyncssh's parser stores ints, the CLI floats."""
    if isinstance(value, (int, float, str)):
        return value
    raise TypeError(f"ssh_config: a number expected, not {value!r}")


def _strings(value: object) -> list[str]:
    """A list option (IdentityFile): asyncssh appends each value to a list; unset is []."""
    return [str(p) for p in value] if isinstance(value, (list, tuple)) else []


def _files(value: Any, default: Sequence[str], tokens: dict[str, str]) -> tuple[str, ...]:
    items = default if value is None else value  # [] is "none"
    return tuple(_expand(str(p), tokens) for p in items)


def resolve(
    paths: Sequence[str], host: str, port: int | None, user: str | None, cli: CliOverrides
) -> HostConfig:
    """The effective settings for ``[user@]host[:port]`` as ``ssh`` would compute them.

    Order of precedence (as in OpenSSH): values in the entry itself (``user@``, ``:port``),
    then command-line flags, then the first value obtained from the config files.
    """
    user = user or cli.user
    cfg = load(paths, host, port, user)
    get = cfg.get
    hostname = str(get("Hostname", host))
    eff_port = int(_number(get("Port", 22)))
    eff_user = str(get("User") or local_user())
    home = os.path.expanduser("~")
    tokens = {"%": "%", "h": hostname, "n": host, "p": str(eff_port), "r": eff_user, "d": home}
    tokens["u"] = local_user()
    user_kh = _files(get("UserKnownHostsFile"), DEFAULT_USER_KNOWN_HOSTS, tokens)
    if cli.known_hosts:
        user_kh = (os.path.expanduser(cli.known_hosts),)
    global_kh = _files(get("GlobalKnownHostsFile"), DEFAULT_GLOBAL_KNOWN_HOSTS, tokens)
    named = [os.path.expanduser(p) for p in cli.identities]
    named += [os.path.expanduser(p) for p in _strings(get("IdentityFile"))]
    if not named:
        named = [os.path.expanduser(f"~/.ssh/{n}") for n in DEFAULT_IDENTITIES]
        missing: tuple[str, ...] = ()
    else:
        missing = tuple(p for p in named if not os.path.isfile(p))
    jump = cli.jump if cli.jump else get("ProxyJump")
    if isinstance(jump, str) and jump.lower() == "none":
        jump = None
    timeout = cli.connect_timeout if cli.connect_timeout is not None else get("ConnectTimeout")
    interval = get("ServerAliveInterval")
    count = get("ServerAliveCountMax")
    return HostConfig(
        name=host,
        hostname=hostname,
        port=eff_port,
        user=eff_user,
        identity_files=tuple(dict.fromkeys(p for p in named if os.path.isfile(p))),
        identities_missing=missing,
        identities_only=bool(get("IdentitiesOnly", False)),
        proxy_jump=str(jump) if jump else None,
        proxy_command=None if jump else (str(get("ProxyCommand")) if get("ProxyCommand") else None),
        user_known_hosts=user_kh,
        global_known_hosts=global_kh,
        strict=cli.strict or str(get("StrictHostKeyChecking", "ask")),
        host_key_alias=str(get("HostKeyAlias")) if get("HostKeyAlias") else None,
        check_host_ip=bool(get("CheckHostIP", False)),
        hash_known_hosts=bool(get("HashKnownHosts", False)),
        connect_timeout=float(_number(timeout)) if timeout is not None else None,
        keepalive_interval=None if interval is None else float(_number(interval)),
        keepalive_count_max=None if count is None else int(_number(count)),
        config_files=tuple(str(p) for p in paths),
    )


def split_jump(jump: str) -> list[tuple[str | None, str, int | None]]:
    """``[user@]host[:port]`` hops of a ProxyJump value, in order."""
    hops: list[tuple[str | None, str, int | None]] = []
    for raw in jump.split(","):
        hop = raw.strip()
        if hop.startswith("ssh://"):
            hop = hop[len("ssh://") :]
        user, _, rest = hop.rpartition("@")
        host, port = rest, None
        if rest.startswith("["):
            end = rest.find("]")
            host = rest[1:end]
            if rest[end + 1 : end + 2] == ":":
                port = int(rest[end + 2 :])
        elif rest.count(":") == 1:
            host, port_text = rest.split(":")
            port = int(port_text)
        if not host:
            raise ValueError(f"empty host in jump {jump!r}")
        hops.append((user or None, host, port))
    return hops


def jump_chain(
    paths: Sequence[str], jump: str, cli: CliOverrides, depth: int = 0
) -> list[HostConfig]:
    """Every hop to go through for a ProxyJump value, first hop first.

    As with ssh, the first hop's own ProxyJump (from the config) is honoured, so chains can
    be built in the config file; later hops are reached through the earlier ones.
    """
    if depth > MAX_JUMP_DEPTH:
        raise ValueError(f"ProxyJump chain deeper than {MAX_JUMP_DEPTH} hops (a loop?)")
    hop_cli = CliOverrides(
        identities=cli.identities,
        known_hosts=cli.known_hosts,
        strict=cli.strict,
        connect_timeout=cli.connect_timeout,
    )
    chain: list[HostConfig] = []
    for i, (user, host, port) in enumerate(split_jump(jump)):
        hc = resolve(paths, host, port, user, hop_cli)
        if i == 0 and hc.proxy_jump:
            chain = jump_chain(paths, hc.proxy_jump, cli, depth + 1)
        chain.append(hc)
    return chain
