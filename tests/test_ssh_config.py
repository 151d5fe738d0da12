"""Effective per-host settings from ssh_config (no daemon): precedence, chains, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.sources.ssh_config import (
    CliOverrides,
    config_files,
    jump_chain,
    resolve,
    split_jump,
)

CONFIG = """
Host gpu*
  User ops
  Port 2222
  IdentityFile {dir}/id_gpu
  UserKnownHostsFile {dir}/kh_%h_%p ${{KH_DIR}}/kh2
  StrictHostKeyChecking accept-new
  ServerAliveInterval 15
  ServerAliveCountMax 4
  ConnectTimeout 7
  ProxyJump inner
Host inner
  HostName 10.0.0.2
  ProxyJump outer
Host outer
  HostName bastion.example.org
  User jump
  Port 2200
Host lonely
  ProxyJump none
  StrictHostKeyChecking off
  HostKeyAlias lonely-key
Host * !outer
  ProxyJump outer
Host *
  GlobalKnownHostsFile none
"""


@pytest.fixture
def cfg(tmp_path: Path) -> list[str]:
    (tmp_path / "id_gpu").write_text("key")
    path = tmp_path / "config"
    path.write_text(CONFIG.format(dir=tmp_path))
    return [str(path)]


def test_first_value_wins_and_tokens_expand(
    cfg: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KH_DIR", str(tmp_path))
    hc = resolve(cfg, "gpu01", None, None, CliOverrides())
    assert hc.target == "ops@gpu01:2222"
    assert hc.user_known_hosts == (f"{tmp_path}/kh_gpu01_2222", f"{tmp_path}/kh2")
    assert hc.global_known_hosts == ()  # "none"
    assert hc.strict == "accept-new" and hc.known_hosts_name == "[gpu01]:2222"
    assert (hc.keepalive_interval, hc.keepalive_count_max, hc.connect_timeout) == (15, 4, 7)
    assert hc.identity_files == (f"{tmp_path}/id_gpu",)
    assert hc.proxy_jump == "inner"  # the first ProxyJump obtained, not Host *'s
    from verl_top.sources.ssh import SshSettings, _keepalive

    assert _keepalive(hc, SshSettings()) == (15, 4)
    off = resolve(cfg, "lonely", None, None, CliOverrides())
    assert _keepalive(off, SshSettings()) == (1.0, 3)  # not set: verl-top's fast default


def test_entry_and_flags_override_the_file(cfg: list[str], tmp_path: Path) -> None:
    cli = CliOverrides(
        user="alice",
        known_hosts=str(tmp_path / "mine"),
        strict="accept-new",
        connect_timeout=2.0,
        jump="other",
    )
    hc = resolve(cfg, "gpu01", 22, None, cli)
    assert hc.target == "alice@gpu01:22" and hc.known_hosts_name == "gpu01"
    assert hc.user_known_hosts == (str(tmp_path / "mine"),)
    assert (hc.connect_timeout, hc.proxy_jump) == (2.0, "other")
    # user@ in the hosts entry beats --ssh-user, as user@host beats -l in ssh
    assert resolve(cfg, "gpu01", None, "bob", cli).user == "bob"


def test_proxyjump_none_strict_off_and_alias(cfg: list[str]) -> None:
    hc = resolve(cfg, "lonely", None, None, CliOverrides())
    assert hc.proxy_jump is None  # "none" wins over Host *
    assert hc.strict == "no" and not hc.refuses_unknown
    assert hc.known_hosts_name == "lonely-key"
    assert resolve(cfg, "other", None, None, CliOverrides()).strict == "ask"  # ssh's default
    assert resolve(cfg, "other", None, None, CliOverrides()).refuses_unknown


def test_chain_follows_the_first_hops_own_proxyjump(cfg: list[str]) -> None:
    chain = jump_chain(cfg, "inner", CliOverrides())
    assert [h.target for h in chain] == [
        "jump@bastion.example.org:2200",
        f"{chain[1].user}@10.0.0.2:22",  # the local user: inner sets no User
    ]
    assert [h.target for h in jump_chain(cfg, "outer,u@gpu02:22", CliOverrides())][1] == (
        "u@gpu02:22"
    )


def test_loops_and_bad_values_are_errors(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.write_text("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")  # ssh loops too
    with pytest.raises(ValueError, match="deeper than"):
        jump_chain([str(loop)], "a", CliOverrides())
    bad = tmp_path / "bad"
    bad.write_text("Host x\n  StrictHostKeyChecking maybe\n")
    with pytest.raises(Exception, match="Invalid StrictHostKeyChecking value: maybe"):
        resolve([str(bad)], "x", None, None, CliOverrides())
    assert split_jump("a@[::1]:2200,b") == [("a", "::1", 2200), (None, "b", None)]


def test_config_files_like_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    system = tmp_path / "ssh_config_system"
    assert config_files(None, str(system)) == []  # neither is there
    system.write_text("Host *\n  Port 2200\n")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu1\n  Port 2222\n")
    paths = config_files(None, str(system))
    assert paths == [str(tmp_path / ".ssh" / "config"), str(system)]  # user file first
    assert resolve(paths, "gpu1", None, None, CliOverrides()).port == 2222
    assert resolve(paths, "gpu2", None, None, CliOverrides()).port == 2200
    assert config_files("/x/given", str(system)) == ["/x/given"]  # like ssh -F: that one only


def test_check_host_ip_policy(tmp_path: Path) -> None:
    """CheckHostIP on a non-loopback address (the daemons of the table test are all loopback,
    where ssh turns it off): refuse a different key for the IP, warn under 'no', else add it."""
    import asyncssh

    from verl_top.sources.ssh import HostKeyPolicy

    def public() -> asyncssh.SSHKey:  # what the server presents
        return asyncssh.import_public_key(
            asyncssh.generate_private_key("ssh-ed25519").export_public_key()
        )

    key, other = public(), public()
    cfg = tmp_path / "config"
    known = tmp_path / "known_hosts"

    def policy(strict: str) -> HostKeyPolicy:
        cfg.write_text(
            f"Host gpu1\n  Port 2222\n  CheckHostIP yes\n  StrictHostKeyChecking {strict}\n"
            f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile none\n"
        )
        return HostKeyPolicy(resolve([str(cfg)], "gpu1", None, None, CliOverrides()), True)

    alg, b64 = other.export_public_key("openssh").decode().split()[:2]
    known.write_text(f"[10.0.0.5]:2222 {alg} {b64}\n")
    refusal = policy("yes").check_ip("10.0.0.5", key)
    assert refusal and "differs from the key recorded for its IP address '[10.0.0.5]:2222'" in (
        refusal
    )
    lax = policy("no")
    assert lax.check_ip("10.0.0.5", key) is None and lax.warning.startswith("WARNING: ")
    assert policy("yes").check_ip("10.0.0.5", other) is None  # the same key: fine
    assert policy("yes").check_ip("127.0.0.5", key) is None  # loopback: off, as in ssh
    known.write_text("")
    assert policy("yes").check_ip("10.0.0.6", key) is None
    assert known.read_text().startswith("[10.0.0.6]:2222 ssh-ed25519 ")  # remembered
