"""Host strings are validated before they reach SSH options, and refused with their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.sources.hosts import (
    HostsError,
    host_problem,
    hosts_from_slurm,
    parse_hosts_arg,
    parse_hosts_file,
)

GOOD = [
    # entry, (user, host, port) of each host it names
    ("gpu01", [(None, "gpu01", None)]),
    ("node-7.cluster.example.org", [(None, "node-7.cluster.example.org", None)]),
    ("10.0.0.12", [(None, "10.0.0.12", None)]),
    ("root@10.0.0.12:2222", [("root", "10.0.0.12", 2222)]),
    ("::1", [(None, "::1", None)]),
    ("[fe80::1%eth0]:22", [(None, "fe80::1%eth0", 22)]),
    ("fe80::1%eth0", [(None, "fe80::1%eth0", None)]),
    ("[2001:db8::7]", [(None, "2001:db8::7", None)]),
    ("alice@gpu[01-02]:2200", [("alice", "gpu01", 2200), ("alice", "gpu02", 2200)]),
    ("svc_user@node_1", [("svc_user", "node_1", None)]),
]

BAD = [
    # entry, the start of the reason
    ("-oProxyCommand=touch pwned", "spaces in"),
    ("-oProxyCommand=x", "junk characters '='"),
    ("-oProxyCommand", "bad host name '-oProxyCommand'"),
    ("gpu01;id", "junk characters ';'"),
    ("gpu01 -p 22", "spaces in"),
    ("gpu'01", 'junk characters "\'"'),
    ('gpu"01', "junk characters '\"'"),
    ("gpu$(id)", "junk characters"),
    ("gpu\x1b[31m01", "junk characters"),
    ("gpu\x0001", "junk characters"),
    ("-l@gpu01", "bad user name '-l'"),
    ("[fe80::1%eth0 -oX]:22", "spaces in"),
    ("[fe80::1%$(id)]:22", "bad IPv6 zone"),
    ("fe80::1%a+b", "bad IPv6 zone"),
    ("[fe80::zz]:22", "bad IPv6 address"),
    ("gpu[01-", "bad range"),
    ("a" * 300, "host name of 300 characters"),
    ("x." + "b" * 64, "bad host name"),
    ("gpu01:0", "bad port '0'"),
    ("gpu01:99999", "bad port '99999'"),
]


@pytest.mark.parametrize(("entry", "expected"), GOOD)
def test_good_host_strings_are_accepted(entry: str, expected: list) -> None:
    assert [(s.user, s.host, s.port) for s in parse_hosts_arg(entry)] == expected


@pytest.mark.parametrize(("entry", "reason"), BAD)
def test_bad_host_strings_are_refused_naming_the_source(entry: str, reason: str) -> None:
    with pytest.raises(HostsError) as err:
        parse_hosts_arg(entry.replace(",", ""))
    assert str(err.value).startswith("--hosts: ")
    assert reason in str(err.value)


@pytest.mark.parametrize(("entry", "reason"), BAD[:14])
def test_bad_lines_of_a_hosts_file_name_file_and_line(
    tmp_path: Path, entry: str, reason: str
) -> None:
    p = tmp_path / "hosts.txt"
    p.write_text(f"gpu01\n# fine so far\n{entry}\n")
    with pytest.raises(HostsError) as err:
        parse_hosts_file(p)
    assert str(err.value).startswith(f"{p}:3: ")
    assert reason in str(err.value)


@pytest.mark.parametrize(
    ("nodelist", "reason"),
    [
        ("gpu[01-02],-oProxyCommand=x", "SLURM_JOB_NODELIST: "),
        ("gpu01,-oProxyCommand", "starts with '-'"),
        ("gpu01,a;b", "bad host name 'a;b'"),
        ("gpu[01-03", "bad node list"),
    ],
)
def test_bad_slurm_node_lists_name_the_variable(nodelist: str, reason: str) -> None:
    with pytest.raises(HostsError) as err:
        hosts_from_slurm({"SLURM_JOB_NODELIST": nodelist})
    assert str(err.value).startswith("SLURM_JOB_NODELIST: ")
    assert reason in str(err.value)


def test_slurm_variable_named_as_given() -> None:
    with pytest.raises(HostsError, match=r"^SLURM_NODELIST: .*starts with '-'"):
        hosts_from_slurm({"SLURM_NODELIST": "-x"})
    assert [s.host for s in hosts_from_slurm({"SLURM_JOB_NODELIST": "gpu[1-2]"})] == [
        "gpu1",
        "gpu2",
    ]


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("gpu01", True),
        ("10.1.2.3", True),
        ("fe80::1%eth0", True),
        ("fe80::1%eth0.100", True),
        ("-oProxyCommand=x", False),
        ("gpu01 ", False),
        ("gpu\n01", False),
        ("gpu01\n", False),  # issue 31: "$" let a trailing newline through
        ("10.1.2.3\n", False),
        ("fe80::1%eth0\n", False),
        ("fe80::1%", False),
        ("", False),
        ("a..b", True),  # odd but harmless: DNS says no
    ],
)
def test_host_problem(host: str, ok: bool) -> None:
    assert (host_problem(host) == "") is ok
