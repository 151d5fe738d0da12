"""Which nodes to monitor: hosts files, ``--hosts a,b,c`` lists, Slurm node lists.

Every entry is ``[user@]host[:port]``; ``host`` may be a hostlist range (``gpu[01-16]``,
``node[1-3,7]``) or a bracketed IPv6 address (``[::1]:22``). Errors name the file and line so
the run stops before any connection is tried. See docs/hosts-and-ssh.md.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import hostlist

# A hostname, IPv4 address or ssh_config alias after range expansion.
# \Z, not $: "$" also matches before a final newline, so "node1\n" passed for a host name.
_NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?\Z")
# What may appear in a host part before expansion (names plus hostlist brackets).
_PATTERN_CHARS = re.compile(r"[A-Za-z0-9._\-\[\],]")
_USER_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?\Z")
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "127.0.0.1", "::1")


_ZONE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}\Z")  # an interface name or number (IFNAMSIZ)
MAX_HOSTS = 2048  # hosts one run may name (the store keeps as many)


class HostsError(ValueError):
    """A hosts file, ``--hosts`` list or Slurm node list that cannot be used."""


def host_problem(host: str) -> str:
    """Why ``host`` may not be handed to SSH, or "" when it is a hostname, an IPv4 address or
    an IPv6 address (with an optional ``%zone``).

    Host strings reach ssh options and ``%h`` in a user's ProxyCommand, so only these forms
    pass: no leading ``-`` (``-oProxyCommand=…``), no spaces, quotes, ``$``, ``;`` or control
    characters, at most 253 characters with labels of at most 63.
    """
    if not isinstance(host, str) or not host:
        return "empty host name"
    if ":" in host:  # only an IPv6 address has a colon here
        addr, _, zone = host.partition("%")
        try:
            socket.inet_pton(socket.AF_INET6, addr)
        except (OSError, ValueError):
            return f"bad IPv6 address {_show(host)}"
        if "%" in host and not _ZONE_RE.match(zone):
            return f"bad IPv6 zone {_show(zone)} in {_show(host)} (an interface name like eth0)"
        return ""
    if len(host) > 253:
        return f"host name of {len(host)} characters (at most 253)"
    if host.startswith("-"):
        return f"host name {_show(host)} starts with '-' (it would be read as an ssh option)"
    if not _NAME_RE.match(host):
        return f"bad host name {_show(host)} (letters, digits, '.', '-', '_' only)"
    if any(len(label) > 63 for label in host.split(".")):
        return f"bad host name {_show(host)} (a label longer than 63 characters)"
    return ""


def _show(text: str) -> str:
    from verl_top.untrusted import clean_text

    return repr(clean_text(text, 80))


def check_host(host: str, where: str) -> str:
    """``host`` when it is safe to hand to SSH; else HostsError naming ``where`` it came from."""
    problem = host_problem(host)
    if problem:
        raise HostsError(f"{where}: {problem}")
    return host


@dataclass(frozen=True)
class HostSpec:
    """One node to connect to. ``alias`` is the name shown in the UI and sent as the host."""

    user: str | None
    host: str
    port: int | None = None
    alias: str = ""

    def __post_init__(self) -> None:
        if not self.alias:
            object.__setattr__(self, "alias", _default_alias(self.host, self.port))

    @property
    def name(self) -> str:
        """The display name (``alias``)."""
        return self.alias

    @property
    def key(self) -> tuple[str, int | None]:
        """Identity used to drop duplicates: the same host and port is the same node."""
        return (self.host.lower(), self.port)


def _default_alias(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host and port is not None else host
    return shown if port is None else f"{shown}:{port}"


def _split_entries(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]`` (those belong to hostlist ranges)."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if depth == 0 and ch == ",":
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def _parse_port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"bad port {text!r} in {entry!r} (must be a number 1-65535)")
    return int(text)


def _split_host_port(rest: str, entry: str) -> tuple[str, int | None, bool]:
    """(host part, port, is_ipv6) of ``host[:port]``, ``[v6]:port`` or a bare IPv6 address."""
    m = re.fullmatch(r"\[([^\]]*:[^\]]*)\](?::(.*))?", rest)
    if m:  # bracketed IPv6 (a hostlist range never contains ':')
        port = _parse_port(m.group(2), entry) if m.group(2) is not None else None
        return m.group(1), port, True
    if rest.count(":") > 1 and "[" not in rest:  # bare IPv6 without a port
        return rest, None, True
    # The port separator is the last ':' outside brackets.
    depth, colon = 0, -1
    for i, ch in enumerate(rest):
        depth += ch == "["
        depth -= ch == "]"
        if ch == ":" and depth == 0:
            colon = i
    if colon < 0:
        return rest, None, False
    return rest[:colon], _parse_port(rest[colon + 1 :], entry), False


def _expand_host(pattern: str, entry: str) -> list[str]:
    if not pattern:
        raise ValueError(f"empty host in {entry!r}")
    junk = sorted(set(_PATTERN_CHARS.sub("", pattern)))
    if junk:
        raise ValueError(f"junk characters {''.join(junk)!r} in host {pattern!r}")
    if pattern.count("[") != pattern.count("]"):
        raise ValueError(f"bad range in {pattern!r} (unbalanced brackets)")
    try:
        names = hostlist.expand_hostlist(pattern) if "[" in pattern else [pattern]
    except hostlist.BadHostlist as exc:
        raise ValueError(f"bad range in {pattern!r} ({exc})") from None
    for name in names:
        if not _NAME_RE.match(name):
            raise ValueError(f"bad host name {name!r} in {entry!r}")
    return names


def parse_entry(entry: str) -> list[HostSpec]:
    """The hosts named by one ``[user@]host[:port]`` entry. Raises ValueError with the reason."""
    user: str | None = None
    rest = entry
    if "@" in entry:
        user, rest = entry.rsplit("@", 1)
        if not _USER_RE.match(user):
            raise ValueError(f"bad user name {user!r} in {entry!r}")
    host, port, ipv6 = _split_host_port(rest, entry)
    if ipv6:
        problem = host_problem(host)
        if problem:
            raise ValueError(f"{problem} in {entry!r}")
        return [HostSpec(user, host, port)]
    names = _expand_host(host, entry)
    for name in names:
        problem = host_problem(name)
        if problem:
            raise ValueError(f"{problem} in {entry!r}")
    return [HostSpec(user, name, port) for name in names]


def _dedupe(specs: Iterable[HostSpec]) -> list[HostSpec]:
    seen: set[tuple[str, int | None]] = set()
    out: list[HostSpec] = []
    for spec in specs:
        if spec.key not in seen:
            seen.add(spec.key)
            out.append(spec)
    return out


def _parse_lines(lines: Iterable[str], where: str, numbered: bool = True) -> list[HostSpec]:
    specs: list[HostSpec] = []
    for lineno, raw in enumerate(lines, 1):
        if len(specs) > MAX_HOSTS:
            raise HostsError(f"{where}: more than {MAX_HOSTS} hosts (verl-top's cap)")
        text = raw.split("#", 1)[0].strip()
        for entry in _split_entries(text):
            try:
                if len(entry.split()) > 1:
                    raise ValueError(
                        f"spaces in {entry.strip()!r} (one [user@]host[:port] per line, "
                        "or separate them with commas)"
                    )
                specs.extend(parse_entry(entry.strip()))
            except ValueError as exc:
                at = f"{where}:{lineno}" if numbered else where
                raise HostsError(f"{at}: {exc}") from None
    return _dedupe(specs)


def parse_hosts_file(path: str | os.PathLike[str]) -> list[HostSpec]:
    """Hosts of a hosts file: one ``[user@]host[:port]`` a line, ``#`` comments, ranges.

    Duplicates are dropped (the first one wins, order kept). Raises HostsError naming
    ``file:line`` for a bad entry, or the file when it cannot be read or lists no host.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HostsError(f"{p}: cannot read hosts file ({exc})") from None
    specs = _parse_lines(text.splitlines(), str(p))
    if not specs:
        raise HostsError(f"{p}: no hosts in file")
    return specs


def parse_hosts_arg(value: str) -> list[HostSpec]:
    """``--hosts`` value: a hosts file when such a file exists, else a comma list.

    Commas inside ``[...]`` belong to hostlist ranges (``gpu[1-3,7],head``).
    """
    if os.path.isfile(value):
        return parse_hosts_file(value)
    if "/" in value or value.endswith((".txt", ".hosts", ".list")):
        raise HostsError(f"{value}: hosts file not found")
    specs = _parse_lines([value], "--hosts", numbered=False)
    if not specs:
        raise HostsError("--hosts: no hosts given")
    return specs


def hosts_from_slurm(env: Mapping[str, str] | None = None) -> list[HostSpec]:
    """Hosts of the current Slurm job (``SLURM_JOB_NODELIST``, e.g. ``gpu[01-04,09]``)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise HostsError(
            "--slurm: SLURM_JOB_NODELIST is not set (run verl-top inside the job's allocation, "
            "e.g. `srun --jobid <id> --overlap --pty verl-top --slurm`, or pass --hosts)"
        )
    var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    if len(nodelist) > 1 << 16:
        raise HostsError(f"{var}: node list of {len(nodelist)} characters refused")
    try:
        names = hostlist.expand_hostlist(nodelist.strip())
    except hostlist.BadHostlist as exc:
        raise HostsError(f"{var}: bad node list {_show(nodelist)} ({exc})") from None
    if len(names) > MAX_HOSTS:
        raise HostsError(f"{var}: {len(names)} nodes (verl-top monitors at most {MAX_HOSTS})")
    return _dedupe(HostSpec(None, check_host(name, var)) for name in names)


def is_local(spec: HostSpec) -> bool:
    """True when ``spec`` is this machine on the default port (use the local source, no SSH)."""
    if spec.port not in (None, 22):
        return False
    if spec.user not in (None, _current_user()):
        return False
    names = {*_LOCAL_NAMES, socket.gethostname().lower()}
    short = socket.gethostname().split(".", 1)[0].lower()
    names.add(short)
    return spec.host.lower() in names


def _current_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None
