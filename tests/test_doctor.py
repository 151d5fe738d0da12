"""`verl-top doctor` against real sshd: a good host, a down host, a wrong key, an unknown host
key. Each report must stop at the right step with a fix, and leave later steps untried."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sshd import SshdFactory, free_port, make_settings, spec_for

from verl_top.sources.doctor import STEPS, doctor_hosts, format_reports
from verl_top.sources.hosts import HostSpec

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(60)]


def replay(trace: Path) -> list[str]:
    return ["--backend", "replay", "--replay-trace", str(trace), "--replay-gpus", "2"]


def outcome(rep) -> list[bool | None]:  # noqa: ANN001
    return [s.ok for s in rep.steps]


async def test_good_down_wrong_key_and_unknown_host(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    good, stranger = sshd_pool.start(), sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [good], remote_python)
    down = HostSpec("root", "127.0.0.27", free_port("127.0.0.27"))
    (ok, refused, unknown) = await doctor_hosts(
        settings, [spec_for(good), down, spec_for(stranger)], replay(h200_trace), 15
    )
    wrong_settings = make_settings(
        tmp_path, ssh_keys, [good], remote_python, identities=(str(ssh_keys["wrong"]),)
    )
    (wrong,) = await doctor_hosts(wrong_settings, [spec_for(good)], replay(h200_trace), 15)
    text = format_reports([ok, refused, unknown, wrong])
    print(text)

    assert ok.ok and outcome(ok) == [True] * len(STEPS)
    assert ok.target == f"root@{good.addr}:{good.port}"
    assert "2 GPUs via replay" in ok.step("nvml").detail
    assert ok.step("host key").detail.startswith(f"ssh-ed25519 {good.host_key.get_fingerprint()}")

    assert outcome(refused) == [True, True, False] + [None] * 6
    assert refused.first_failure.name == "tcp"
    assert f"port {down.port}" in refused.first_failure.fix

    assert outcome(unknown)[:4] == [True, True, True, False]
    assert unknown.first_failure.name == "host key"
    assert "not in known_hosts" in unknown.first_failure.detail
    assert "--accept-new-hosts" in unknown.first_failure.fix

    assert outcome(wrong)[:5] == [True, True, True, True, False]
    assert wrong.first_failure.name == "auth"
    assert str(ssh_keys["wrong"]) in wrong.first_failure.detail  # which key was tried
    assert "authorized_keys" in wrong.first_failure.fix
    assert text.endswith("1 of 4 hosts ready")


async def test_missing_python_and_no_gpu(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, remote_python: str
) -> None:
    d = sshd_pool.start()
    missing = make_settings(tmp_path, ssh_keys, [d], "python3-missing")
    (rep,) = await doctor_hosts(missing, [spec_for(d)], [], 15)
    assert rep.first_failure.name == "python3" and "--python" in rep.first_failure.fix
    no_gpu = make_settings(tmp_path, ssh_keys, [d], remote_python)
    (rep,) = await doctor_hosts(no_gpu, [spec_for(d)], ["--backend", "none"], 15)
    assert outcome(rep)[:7] == [True] * 7
    assert rep.first_failure.name == "nvml" and "nvidia-smi" in rep.first_failure.fix


def test_cli_exit_status_and_report(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    argv = [sys.executable, "-m", "verl_top", "doctor", f"root@{d.addr}:{d.port}"]
    argv += ["--ssh-config", str(settings.ssh_config), "-i", str(ssh_keys["client"])]
    argv += ["--known-hosts", str(settings.known_hosts), "--python", remote_python]
    argv += ["--backend", "replay", "--replay-trace", str(h200_trace)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "=> all steps passed" in res.stdout
    Path(settings.known_hosts).write_text("")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "=> fails at host key:" in res.stdout
    bad = subprocess.run([*argv[:4], "bad host"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "verl-top doctor:" in bad.stderr


async def test_host_behind_a_jump_host_from_the_config(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    bastion, node = sshd_pool.start(), sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [bastion, node], remote_python)
    Path(settings.ssh_config).write_text(
        f"Host jb\n  HostName {bastion.addr}\n  Port {bastion.port}\n"
        f"Host gpu1\n  HostName {node.addr}\n  Port {node.port}\n  ProxyJump jb\n"
        "Host *\n  User root\n"
    )
    (rep,) = await doctor_hosts(settings, [HostSpec(None, "gpu1")], replay(h200_trace), 15)
    print(format_reports([rep]))
    assert rep.ok
    assert rep.target == f"root@{node.addr}:{node.port} via root@{bastion.addr}:{bastion.port}"
    assert rep.step("resolve").detail == f"{node.addr} is resolved by the jump host"


def test_cli_takes_hosts_and_ssh_options_from_the_config_file(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory, h200_trace: Path, remote_python: str
) -> None:
    d = sshd_pool.start()
    settings = make_settings(tmp_path, ssh_keys, [d], remote_python)
    conf = tmp_path / "verl-top.toml"
    conf.write_text(
        f'hosts = "root@{d.addr}:{d.port}"\n[ssh]\nidentity = "{ssh_keys["client"]}"\n'
        f'known_hosts = "{settings.known_hosts}"\nssh_config = "{settings.ssh_config}"\n'
    )
    argv = [sys.executable, "-m", "verl_top", "doctor", "--config", str(conf)]
    argv += ["--python", remote_python, "--backend", "replay", "--replay-trace", str(h200_trace)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"{d.addr}:{d.port}  root@{d.addr}:{d.port}")
