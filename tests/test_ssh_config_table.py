"""ssh_config semantics, one row per option: verl-top must reach what `ssh -F config host true`
reaches and refuse what it refuses, for the same reason.

Every row runs the real OpenSSH client (``ssh -F CFG -o BatchMode=yes HOST true``) and
verl-top's connection (``run_remote``) against real sshd daemons on 127.0.0.x, each with its
own copy of the config and known_hosts files, and compares both with the expected outcome
written in the row. Rows that let the client add a host key also compare what each wrote.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest
from sshd import SshDaemon, SshdFactory, free_port, sshd_version

from verl_top.sources.hosts import HostSpec
from verl_top.sources.ssh import (
    UNKNOWN_HOST_REASON,
    RemoteCommandError,
    SshSettings,
    run_remote,
)

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]


@dataclass
class Lab:
    """Target T, bastions A and B, a silent TCP port S and a closed port D, all on 127.0.0.x."""

    t: SshDaemon
    a: SshDaemon
    b: SshDaemon
    local: SshDaemon  # on 127.0.0.1, reached as "localhost"
    agent_sock: Path  # an ssh-agent holding the authorized client key
    silent: tuple[str, int]
    dead: tuple[str, int]
    keys: dict[str, Path]
    other_key: asyncssh.SSHKey = field(
        default_factory=lambda: asyncssh.generate_private_key("ssh-ed25519")
    )

    def fill(self, text: str, d: Path, cfg: Path) -> str:
        t, a, b = self.t, self.a, self.b
        return text.format(
            T=t.addr, Tp=t.port, A=a.addr, Ap=a.port, B=b.addr, Bp=b.port, Lp=self.local.port,
            S=self.silent[0], Sp=self.silent[1], D=self.dead[0], Dp=self.dead[1],
            key=self.keys["client"], wrong=self.keys["wrong"], dir=d, cfg=cfg,
        )  # fmt: skip

    def known_line(self, token: str) -> str:
        """known_hosts lines by name: T, A, B, T_old (another key under T's name),
        T_noport (T's key without the port), T_noport_old, T_alias (T's key as 'nodealias')."""
        t = self.t
        alg, b64 = t.host_key.export_public_key("openssh").decode().split()[:2]
        other = self.other_key.export_public_key("openssh").decode().split()[1]
        local_b64 = self.local.host_key.export_public_key("openssh").decode().split()[1]
        lines = {
            "T": t.known_hosts_line(),
            "A": self.a.known_hosts_line(),
            "B": self.b.known_hosts_line(),
            "T_old": t.known_hosts_line(self.other_key),
            "T_noport": f"{t.addr} {alg} {b64}\n",
            "T_noport_old": f"{t.addr} {alg} {other}\n",
            "T_alias": f"nodealias {alg} {b64}\n",
            "L": f"[localhost]:{self.local.port} {alg} {local_b64}\n",
            "L_ip_old": f"[127.0.0.1]:{self.local.port} {alg} {other}\n",
        }
        return lines[token]


@pytest.fixture(scope="module")
def lab(sshd_pool: SshdFactory, ssh_keys: dict[str, Path]) -> Iterator[Lab]:
    if shutil.which("ssh") is None:  # the comparison needs the real client
        pytest.skip("the OpenSSH client `ssh` is not installed (Debian: openssh-client)")
    t, a, b = sshd_pool.start(), sshd_pool.start(), sshd_pool.start()
    s_addr = "127.0.0.29"
    silent = socket.socket()
    silent.bind((s_addr, 0))
    silent.listen(64)  # accepts TCP (kernel backlog), never speaks SSH
    d_addr = "127.0.0.28"
    local = SshDaemon(
        "127.0.0.1", free_port("127.0.0.1"), sshd_pool.root / "sshd-local", t.authorized_keys
    )
    local.start(sshd_version() >= (9, 8))
    sock = ssh_keys["dir"] / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(ssh_keys["client"])], env=env, check=True)
        d_port = free_port(d_addr)
        yield Lab(t, a, b, local, sock, silent.getsockname()[:2], (d_addr, d_port), ssh_keys)
    finally:
        agent.kill()
        agent.wait(timeout=5)
        silent.close()
        local.stop()


JUMPS = """
Host jumpA
  HostName {A}
  Port {Ap}
  User root
  IdentityFile {key}
Host jumpB
  HostName {B}
  Port {Bp}
  User root
  IdentityFile {key}
"""
# Last, so every row's own values win (the first value obtained is used).
TRAILER = """
Host *
  UserKnownHostsFile {dir}/known_hosts
  GlobalKnownHostsFile {dir}/global_known_hosts
  IdentitiesOnly yes
"""
TARGET = "Host target\n  HostName {T}\n  Port {Tp}\n  User root\n"
KEY = "  IdentityFile {key}\n"


@dataclass
class Row:
    """One option: config text (before JUMPS and TRAILER), known_hosts files, flags, outcome."""

    id: str
    config: str
    expect: str  # ok | unknown | changed | auth | refused | closed | timeout
    known: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"known_hosts": ("T",)})
    host: str = "target"
    flags: dict[str, object] = field(default_factory=dict)  # SshSettings fields
    ssh_flags: tuple[str, ...] = ()  # the same, as ssh options
    files: dict[str, str] = field(default_factory=dict)  # extra files (Include)
    agent: bool = False  # SSH_AUTH_SOCK points at the lab's ssh-agent (else unset)
    compare_known: bool = False  # the client adds a key: both must add the same line


ROWS = [
    Row("HostName/Port/User/IdentityFile", TARGET + KEY, "ok"),
    Row("User (wrong login)", TARGET.replace("User root", "User nosuchuser") + KEY, "auth"),
    Row("Port (nothing listens)", "Host target\n  HostName {D}\n  Port {Dp}\n" + KEY, "refused"),
    Row("IdentityFile (not authorized)", TARGET + "  IdentityFile {wrong}\n", "auth"),
    Row(
        "IdentityFile (two, second one works)",
        TARGET + "  IdentityFile {wrong}\n" + KEY,
        "ok",
    ),
    Row(
        "ssh-agent key (no IdentityFile)",
        TARGET + "  IdentitiesOnly no\n",
        "ok",
        agent=True,
    ),
    Row(
        "IdentitiesOnly yes: agent keys not named are not offered",
        TARGET + "  IdentityFile {wrong}\n  IdentitiesOnly yes\n",
        "auth",
        agent=True,
    ),
    Row(
        "IdentitiesOnly no: agent keys are offered too",
        TARGET + "  IdentityFile {wrong}\n  IdentitiesOnly no\n",
        "ok",
        agent=True,
    ),
    Row(
        "UserKnownHostsFile (own file)",
        TARGET + KEY + "  UserKnownHostsFile {dir}/cluster_known_hosts\n",
        "ok",
        known={"known_hosts": (), "cluster_known_hosts": ("T",)},
    ),
    Row(
        "UserKnownHostsFile (two files, key in the second)",
        TARGET + KEY + "  UserKnownHostsFile {dir}/first {dir}/second\n",
        "ok",
        known={"first": ("A",), "second": ("T",)},
    ),
    Row(
        "UserKnownHostsFile (key not in it)",
        TARGET + KEY + "  UserKnownHostsFile {dir}/cluster_known_hosts\n",
        "unknown",
        known={"known_hosts": ("T",), "cluster_known_hosts": ()},
    ),
    Row(
        "GlobalKnownHostsFile",
        TARGET + KEY + "  GlobalKnownHostsFile {dir}/site_known_hosts\n",
        "ok",
        known={"known_hosts": (), "site_known_hosts": ("T",)},
    ),
    Row(
        "known_hosts entry without the port (same key)",
        TARGET + KEY,
        "ok",
        known={"known_hosts": ("T_noport",)},
    ),
    Row(
        "known_hosts entry without the port (other key)",
        TARGET + KEY,
        "unknown",
        known={"known_hosts": ("T_noport_old",)},
    ),
    Row(
        "StrictHostKeyChecking yes (unknown key)",
        TARGET + KEY + "  StrictHostKeyChecking yes\n",
        "unknown",
        known={"known_hosts": ()},
    ),
    Row(
        "StrictHostKeyChecking accept-new (unknown key)",
        TARGET + KEY + "  StrictHostKeyChecking accept-new\n",
        "ok",
        known={"known_hosts": ()},
        compare_known=True,
    ),
    Row(
        "StrictHostKeyChecking accept-new (changed key)",
        TARGET + KEY + "  StrictHostKeyChecking accept-new\n",
        "changed",
        known={"known_hosts": ("T_old",)},
    ),
    Row(
        "StrictHostKeyChecking no (unknown key)",
        TARGET + KEY + "  StrictHostKeyChecking no\n",
        "ok",
        known={"known_hosts": ()},
        compare_known=True,
    ),
    Row(
        "HashKnownHosts yes (accept-new writes a hashed entry)",
        TARGET + KEY + "  StrictHostKeyChecking accept-new\n  HashKnownHosts yes\n",
        "ok",
        known={"known_hosts": ()},
        compare_known=True,
    ),
    Row(
        "StrictHostKeyChecking off (changed key)",
        TARGET + KEY + "  StrictHostKeyChecking off\n",
        "ok",
        known={"known_hosts": ("T_old",)},
        compare_known=True,
    ),
    Row(
        "HostKeyAlias",
        TARGET + KEY + "  HostKeyAlias nodealias\n",
        "ok",
        known={"known_hosts": ("T_alias",)},
    ),
    Row(
        "HostKeyAlias (only the real name known)",
        TARGET + KEY + "  HostKeyAlias nodealias\n",
        "unknown",
    ),
    Row("CheckHostIP yes", TARGET + KEY + "  CheckHostIP yes\n", "ok"),
    Row(
        "CheckHostIP yes, other key for the IP (off for loopback, as in ssh)",
        "Host target\n  HostName localhost\n  Port {Lp}\n  User root\n  CheckHostIP yes\n" + KEY,
        "ok",
        known={"known_hosts": ("L", "L_ip_old")},
        compare_known=True,
    ),
    Row(
        "ConnectTimeout",
        "Host target\n  HostName {S}\n  Port {Sp}\n  ConnectTimeout 1\n" + KEY,
        "timeout",
    ),
    Row(
        "ServerAliveInterval/ServerAliveCountMax",
        TARGET + KEY + "  ServerAliveInterval 2\n  ServerAliveCountMax 2\n",
        "ok",
    ),
    Row("ProxyJump", TARGET + KEY + "  ProxyJump jumpA\n", "ok", known={"known_hosts": ("T", "A")}),
    Row(
        "ProxyJump (two hops a,b)",
        TARGET + KEY + "  ProxyJump jumpA,jumpB\n",
        "ok",
        known={"known_hosts": ("T", "A", "B")},
    ),
    Row(
        "ProxyJump none (over Host *)",
        TARGET + KEY + "  ProxyJump none\nHost *\n  ProxyJump {D}:{Dp}\n",
        "ok",
    ),
    Row(
        "ProxyJump (bastion down)",
        TARGET + KEY + "  ProxyJump root@{D}:{Dp}\n",
        "refused",
    ),
    Row(
        "ProxyCommand",
        TARGET + KEY + "  ProxyCommand ssh -F {cfg} -o BatchMode=yes -W %h:%p jumpA\n",
        "ok",
        known={"known_hosts": ("T", "A")},
    ),
    Row(
        "ProxyCommand before ProxyJump (the first one wins)",
        TARGET
        + KEY
        + "  ProxyCommand ssh -F {cfg} -o BatchMode=yes -W %h:%p jumpA\n"
        + "  ProxyJump root@{D}:{Dp}\n",
        "ok",
        known={"known_hosts": ("T", "A")},
    ),
    Row(
        "ProxyCommand none blocks a later ProxyJump",
        TARGET + KEY + "  ProxyCommand none\nHost *\n  ProxyJump root@{D}:{Dp}\n",
        "ok",
    ),
    Row(
        "ProxyJump none does not block a later ProxyCommand",
        TARGET + KEY + "  ProxyJump none\nHost *\n  ProxyCommand /bin/false\n",
        "closed",
    ),
    Row(
        "Include",
        "Include {dir}/cluster.conf\n",
        "ok",
        files={"cluster.conf": TARGET + KEY},
    ),
    Row(
        "Match host",
        "Host target\n  HostName {T}\n  User root\n" + KEY + "Match host {T}\n  Port {Tp}\n",
        "ok",
    ),
    Row(
        "Match user",
        TARGET + "Match user nobody\n  IdentityFile {wrong}\nMatch user root\n" + KEY,
        "ok",
    ),
    Row(
        "flag --ssh-user over User",
        TARGET.replace("User root", "User nosuchuser") + KEY,
        "ok",
        flags={"user": "root"},
        ssh_flags=("-l", "root"),
    ),
    Row(
        "flag -i adds to IdentityFile",
        TARGET + "  IdentityFile {wrong}\n",
        "ok",
        flags={"identities": ("{key}",)},
        ssh_flags=("-i", "{key}"),
    ),
    Row(
        "flag --known-hosts over UserKnownHostsFile",
        TARGET + KEY + "  UserKnownHostsFile {dir}/empty\n",
        "ok",
        known={"empty": (), "cli_known_hosts": ("T",)},
        flags={"known_hosts": "{dir}/cli_known_hosts"},
        ssh_flags=("-o", "UserKnownHostsFile={dir}/cli_known_hosts"),
    ),
    Row(
        "flag --accept-new-hosts over StrictHostKeyChecking yes",
        TARGET + KEY + "  StrictHostKeyChecking yes\n",
        "ok",
        known={"known_hosts": ()},
        flags={"accept_new_hosts": True},
        ssh_flags=("-o", "StrictHostKeyChecking=accept-new"),
        compare_known=True,
    ),
    Row(
        "flag --jump over ProxyJump none",
        TARGET + KEY + "  ProxyJump none\n",
        "ok",
        known={"known_hosts": ("T", "A")},
        flags={"jump": "jumpA"},
        ssh_flags=("-J", "jumpA"),
    ),
    Row(
        "flag --connect-timeout over ConnectTimeout",
        "Host target\n  HostName {S}\n  Port {Sp}\n  ConnectTimeout 30\n" + KEY,
        "timeout",
        flags={"connect_timeout": 1.0},
        ssh_flags=("-o", "ConnectTimeout=1"),
    ),
]


def _setup(lab: Lab, row: Row, d: Path) -> Path:
    d.mkdir(parents=True)
    cfg = d / "ssh_config"
    for name, text in row.files.items():
        (d / name).write_text(lab.fill(text, d, cfg))
    cfg.write_text(lab.fill(row.config + JUMPS + TRAILER, d, cfg))
    known = {"known_hosts": ("A", "B"), **row.known}
    for name, tokens in known.items():
        extra = ("A", "B") if name == "known_hosts" else ()
        (d / name).write_text("".join(lab.known_line(t) for t in dict.fromkeys((*tokens, *extra))))
    (d / "global_known_hosts").touch()
    return cfg


def _ssh_outcome(rc: int, err: str) -> str:
    if rc == 0:
        return "ok"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "differs from the key for the IP" in err:
        return "changed"
    if "Host key verification failed" in err or "No ED25519 host key is known" in err:
        return "unknown"
    if "Permission denied" in err:
        return "auth"
    if "Connection refused" in err:
        return "refused"
    if "Connection closed by" in err:
        return "closed"
    if "banner exchange" in err and "Broken pipe" in err:
        # A proxy command that exits at once: ssh reads EOF ("Connection closed by UNKNOWN")
        # or, when it writes its banner first, EPIPE (seen on a loaded machine): one outcome.
        return "closed"
    if "timed out" in err:
        return "timeout"
    return f"other: {err.strip()[-300:]}"


def _our_outcome(exc: RemoteCommandError | None) -> str:
    if exc is None:
        return "ok"
    reason = exc.reason
    if exc.state == "hostkey_changed":
        return "changed"
    if exc.state == "auth_failed":
        return "auth"
    if UNKNOWN_HOST_REASON in reason:
        return "unknown"
    if "connection refused" in reason:
        return "refused"
    if "connection closed by peer" in reason:
        return "closed"
    if "timed out" in reason:
        return "timeout"
    return f"other: {exc.state}: {reason}"


async def run_ssh(lab: Lab, row: Row, d: Path, cfg: Path) -> tuple[str, str, float]:
    flags = [lab.fill(f, d, cfg) for f in row.ssh_flags]
    argv = ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", *flags, row.host, "true"]
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    if row.agent:
        env["SSH_AUTH_SOCK"] = str(lab.agent_sock)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
    )
    _, err = await asyncio.wait_for(proc.communicate(), 40)
    text = err.decode(errors="replace")
    return _ssh_outcome(proc.returncode or 0, text), text, time.monotonic() - t0


async def run_ours(lab: Lab, row: Row, d: Path, cfg: Path) -> tuple[str, str, float]:
    flags = {
        k: tuple(lab.fill(x, d, cfg) for x in v)
        if isinstance(v, tuple)
        else (lab.fill(v, d, cfg) if isinstance(v, str) else v)
        for k, v in row.flags.items()
    }
    settings = SshSettings(ssh_config=str(cfg), **flags)  # type: ignore[arg-type]
    t0 = time.monotonic()
    err: RemoteCommandError | None = None
    try:
        async for _ in run_remote(settings, HostSpec(None, row.host), "true", close_stdin=True):
            pass
    except RemoteCommandError as exc:
        err = exc
    finally:
        await settings.shared().close()
    return _our_outcome(err), err.reason if err else "", time.monotonic() - t0


def _unhash(pattern: str, names: list[str]) -> str:
    """A hashed host field (``|1|salt|hash``) as the name it hashes, among ``names``."""
    if not pattern.startswith("|1|"):
        return pattern
    salt, digest = (base64.b64decode(x) for x in pattern[3:].split("|"))
    for name in names:
        if hmac.new(salt, name.encode(), hashlib.sha1).digest() == digest:
            return f"hashed:{name}"
    return "hashed:?"


def _known_entries(path: Path, lab: Lab) -> set[tuple[str, ...]]:
    names = [f"[{d.addr}]:{d.port}" for d in (lab.t, lab.a, lab.b)]
    out = set()
    for line in path.read_text().splitlines():
        if line.strip():
            pattern, alg, key = line.split()[:3]
            out.add((_unhash(pattern, names), alg, key))
    return out


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
async def test_option_behaves_like_openssh(
    lab: Lab, row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if row.agent:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(lab.agent_sock))
    else:
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ssh_dir, our_dir = tmp_path / "ssh", tmp_path / "ours"
    ssh_cfg, our_cfg = _setup(lab, row, ssh_dir), _setup(lab, row, our_dir)
    ssh_got, ssh_err, ssh_s = await run_ssh(lab, row, ssh_dir, ssh_cfg)
    our_got, our_err, our_s = await run_ours(lab, row, our_dir, our_cfg)
    print(f"{row.id}: ssh {ssh_got} ({ssh_s:.2f} s), verl-top {our_got} ({our_s:.2f} s)")
    print(f"  verl-top reason: {our_err}")
    assert ssh_got == row.expect, ssh_err
    assert our_got == row.expect, our_err
    if row.expect == "timeout":  # both gave up after the 1 s timeout (not 30 s, not at once)
        assert 0.9 <= our_s < 4 and 0.9 <= ssh_s < 4, (our_s, ssh_s)
    if row.compare_known:
        ssh_known = _known_entries(ssh_dir / "known_hosts", lab)
        ours_known = _known_entries(our_dir / "known_hosts", lab)
        assert ours_known == ssh_known
