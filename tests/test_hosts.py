"""Hosts files, --hosts lists and Slurm node lists."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from verl_top.sources.hosts import (
    HostsError,
    HostSpec,
    hosts_from_slurm,
    is_local,
    parse_hosts_arg,
    parse_hosts_file,
)


def names(specs: list[HostSpec]) -> list[str]:
    return [s.name for s in specs]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "nodes.txt"
    p.write_text(text)
    return p


def test_file_with_comments_ranges_users_ports_and_duplicates(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "# training nodes\n"
        "\n"
        "gpu[01-03]        # first rack\n"
        "  admin@head:2222\n"
        "node[1-3,7]\n"
        "gpu02             # duplicate, dropped\n"
        "root@gpu01        # same node as gpu01: dropped, first one wins\n"
        "[::1]:2200\n",
    )
    specs = parse_hosts_file(p)
    assert names(specs) == [
        "gpu01", "gpu02", "gpu03", "head:2222", "node1", "node2", "node3", "node7", "[::1]:2200",
    ]  # fmt: skip
    assert specs[0] == HostSpec(None, "gpu01", None, "gpu01")
    assert specs[3] == HostSpec("admin", "head", 2222, "head:2222")
    assert specs[-1].host == "::1" and specs[-1].port == 2200


def test_range_with_port_and_zero_padding(tmp_path: Path) -> None:
    specs = parse_hosts_arg("root@gpu[08-10]:22")
    assert [(s.user, s.host, s.port) for s in specs] == [
        ("root", "gpu08", 22),
        ("root", "gpu09", 22),
        ("root", "gpu10", 22),
    ]


def test_comma_list_keeps_commas_inside_brackets() -> None:
    specs = parse_hosts_arg("head,gpu[1-2,5],a@b:2022,head")
    assert names(specs) == ["head", "gpu1", "gpu2", "gpu5", "b:2022"]


def test_arg_that_is_a_file_is_read_as_a_file(tmp_path: Path) -> None:
    p = write(tmp_path, "x1\nx2\n")
    assert names(parse_hosts_arg(str(p))) == ["x1", "x2"]
    with pytest.raises(HostsError, match="hosts file not found"):
        parse_hosts_arg(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gpu01:99999", "bad port '99999'"),
        ("gpu01:ssh", "bad port 'ssh'"),
        ("root@", "empty host"),
        ("root@:22", "empty host"),
        ("gpu[01-", "bad range"),
        ("gpu[5-2]", "bad range"),
        ("gpu01;rm", "junk characters ';'"),
        ("gpu$(x)", "junk characters"),
        ("bad user@gpu01", "spaces in"),
        ("[::zz]:22", "bad IPv6"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = write(tmp_path, f"# ok\ngpu01\n{line}\n")
    with pytest.raises(HostsError, match=rf"^{p}:3: ") as err:
        parse_hosts_file(p)
    assert re.search(message, str(err.value)), str(err.value)


def test_bad_entry_in_comma_list_names_the_option() -> None:
    with pytest.raises(HostsError, match=r"^--hosts: bad port '0'"):
        parse_hosts_arg("a,b:0")


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HostsError, match="no hosts"):
        parse_hosts_file(write(tmp_path, "# nothing here\n\n"))


def test_slurm_nodelist() -> None:
    specs = hosts_from_slurm({"SLURM_JOB_NODELIST": "gpu[01-02,09],login1"})
    assert names(specs) == ["gpu01", "gpu02", "gpu09", "login1"]
    with pytest.raises(HostsError, match="SLURM_JOB_NODELIST is not set"):
        hosts_from_slurm({})
    with pytest.raises(HostsError, match="bad node list"):
        hosts_from_slurm({"SLURM_JOB_NODELIST": "gpu[01-"})


def test_is_local() -> None:
    assert is_local(HostSpec(None, "localhost"))
    assert is_local(HostSpec(None, "127.0.0.1"))
    assert is_local(HostSpec(None, socket.gethostname()))
    assert not is_local(HostSpec(None, "127.0.0.2"))
    assert not is_local(HostSpec(None, "localhost", 2222))  # e.g. a container's sshd
    assert not is_local(HostSpec(None, "gpu01"))
