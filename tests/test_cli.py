"""The command line as a user runs it: clear errors before anything connects, headless commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top.cli import main


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verl_top", *args], capture_output=True, text=True, timeout=timeout
    )


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("verl-top ")


def test_bad_hosts_line_names_file_and_line_and_stops(tmp_path: Path, capsys) -> None:
    hosts = tmp_path / "nodes.txt"
    hosts.write_text("# cluster\ngpu[01-04]\n\nroot@gpu05:notaport\n")
    assert main(["--hosts", str(hosts)]) == 2
    err = capsys.readouterr().err
    assert f"{hosts}:4" in err and "port" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replay", "missing.ndjson"], "recording not found"),
        (["--interval", "0"], "--interval must be greater"),
        (["--speed", "-1"], "--speed must be greater"),
        (["--verl-log", "elsewhere:/tmp/x.log", "--hosts", "gpu01"], "host elsewhere is not among"),
        (["--verl-log", "/definitely/missing.log"], "no such file"),
        (
            ["--demo", "--verl-log", "gpu01:/tmp/x.log"],
            "a replay reads log files of this machine only",
        ),
    ],
)
def test_unusable_inputs_exit_2_with_one_sentence(args: list[str], message: str, capsys) -> None:
    assert main(["diagnose", *args]) == 2
    assert message in capsys.readouterr().err


def test_unknown_flag_is_refused_by_name() -> None:
    out = run_cli("--hots", "a,b")
    assert out.returncode == 2 and "--hots" in out.stderr


def test_diagnose_demo_json_names_the_dataflow_step() -> None:
    out = run_cli("diagnose", "--demo", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "verl-top.diagnose/1"
    assert data["bottleneck"]["step"] == 3
    assert data["bottleneck"]["rule"] in {"flow.long_tail", "flow.rollout_bound"}


def test_record_then_replay_gives_the_same_verdict(tmp_path: Path) -> None:
    rec = tmp_path / "session.ndjson.gz"
    first = run_cli("diagnose", "--demo", "--json", "--record", str(rec))
    assert first.returncode == 0 and rec.stat().st_size > 1000
    second = run_cli("diagnose", "--replay", str(rec), "--json")
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["bottleneck"] == b["bottleneck"]
    assert [f["rule"] for f in a["findings"]] == [f["rule"] for f in b["findings"]]


def test_snapshot_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out_dir = tmp_path / "snap"
    first = run_cli("snapshot", "--demo", "-o", str(out_dir))
    assert first.returncode == 0, first.stderr
    assert (out_dir / "snapshot.json").is_file() and (out_dir / "report.md").is_file()
    before = (out_dir / "snapshot.json").stat().st_mtime_ns
    second = run_cli("snapshot", "--demo", "-o", str(out_dir), "--duration", "60", timeout=30)
    # refused before collecting (a 60 s collection first would hit the timeout), nothing touched
    assert second.returncode == 1 and "--force" in second.stderr
    assert (out_dir / "snapshot.json").stat().st_mtime_ns == before
    third = run_cli("snapshot", "--demo", "-o", str(out_dir), "--force")
    assert third.returncode == 0


def test_probe_needs_a_known_target() -> None:
    out = run_cli("probe", "ethernet")
    assert out.returncode == 2 and "probe nccl" in out.stderr


def test_headless_snapshot_includes_the_screen_with_the_bottleneck_pane(tmp_path: Path) -> None:
    out_dir = tmp_path / "snap"
    done = run_cli("snapshot", "--demo", "-o", str(out_dir))
    assert done.returncode == 0, done.stderr
    svg = (out_dir / "screen.svg").read_text()
    assert svg.startswith("<svg") and "DEMO" in svg
    assert "Stages&#160;of&#160;the&#160;last" in svg  # pane 3 (the demo's bottleneck) in front
