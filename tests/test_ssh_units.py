"""SSH pieces that need no daemon: options, backoff, the remote command line."""

from __future__ import annotations

import argparse
import random
import shlex
from pathlib import Path

import pytest

from verl_top.agent.ship import BOOTSTRAP
from verl_top.flags import add_ssh_arguments, ssh_settings
from verl_top.sources.hosts import parse_hosts_arg
from verl_top.sources.ssh import (
    Backoff,
    SshSettings,
    agent_command,
    build_ssh_sources,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_ssh_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_strict_and_bounded() -> None:
    s = ssh_settings(parse())
    assert s.accept_new_hosts is False
    assert s.known_hosts is None  # UserKnownHostsFile from the config, else ~/.ssh/known_hosts
    assert s.ssh_config is None  # ~/.ssh/config, then /etc/ssh/ssh_config, as ssh
    assert (s.connect_timeout, s.max_handshakes) == (None, 16)  # ConnectTimeout, else 10 s
    # A frozen peer is noticed within ~3-5 s.
    assert 3 <= s.keepalive_interval * (s.keepalive_count_max + 1) <= 5


def test_options_are_read_and_checked(tmp_path: Path) -> None:
    key = tmp_path / "id_test"
    key.write_text("x")
    cfg = tmp_path / "cfg"
    cfg.touch()
    s = ssh_settings(
        parse(
            "-i", str(key), "--ssh-config", str(cfg), "--jump", "ops@bastion:2200",
            "--accept-new-hosts", "--connect-timeout", "3", "--max-handshakes", "4",
            "--ssh-user", "alice",
        )
    )  # fmt: skip
    assert s.identities == (str(key),)
    assert (s.jump, s.user, s.accept_new_hosts) == ("ops@bastion:2200", "alice", True)
    assert (s.connect_timeout, s.max_handshakes) == (3.0, 4)
    with pytest.raises(ValueError, match="no such key file"):
        ssh_settings(parse("-i", str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="--ssh-config"):
        ssh_settings(parse("--ssh-config", str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="--jump"):
        ssh_settings(parse("--jump", "bastion:0"))
    with pytest.raises(ValueError, match="cannot load key"):
        build_ssh_sources(parse_hosts_arg("gpu01"), ssh_settings(parse("-i", str(key))))


def test_build_sources_share_one_settings() -> None:
    sources = build_ssh_sources(
        parse_hosts_arg("gpu[1-3]"), ssh_settings(parse()), ["--interval", "1"]
    )
    assert [s.name for s in sources] == ["gpu1", "gpu2", "gpu3"]
    assert len({id(s.shared) for s in sources}) == 1


def test_backoff_doubles_to_cap_with_jitter_and_resets() -> None:
    s = SshSettings(backoff_initial=1.0, backoff_max=30.0, healthy_after=30.0)
    b = Backoff(s, random.Random(1))
    delays = [b.next() for _ in range(7)]
    for got, base in zip(delays, [1, 2, 4, 8, 16, 30, 30], strict=True):
        assert 0.8 * base <= got <= 1.2 * base
    assert b.next(attention=True) == s.attention_backoff
    # A stream that stayed healthy for 30 s starts the sequence over.
    assert 0.8 <= b.next(healthy_for=31.0) <= 1.2
    assert 1.6 <= b.next(healthy_for=5.0) <= 2.4


def test_agent_command_quotes_everything() -> None:
    args = ["--host", "gpu01", "--follow", "verl:/data/run 1/log's.txt"]
    cmd = agent_command("python3", BOOTSTRAP, args)
    argv = shlex.split(cmd)
    assert argv[:4] == ["exec", "python3", "-u", "-c"]
    assert argv[4] == BOOTSTRAP
    assert argv[5:] == args
