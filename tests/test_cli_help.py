"""CLI dead ends (issue 32 item 7): every command's help has its defaults and examples that
parse; `probe --help` works; a missing torch ends in one sentence; `doctor` alone checks this
machine."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top import cli
from verl_top.cli_help import EXAMPLES
from verl_top.doctor_cli import doctor_parser

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "h200" / "h200_phased_trace.jsonl"
PARSERS = {
    "verl-top": cli.app_parser,
    "diagnose": cli.diagnose_parser,
    "snapshot": cli.snapshot_parser,
    "compare": cli.compare_parser,
    "probe": cli.probe_parser,
    "probe nccl": cli.probe_nccl_parser,
    "doctor": doctor_parser,
    "export-metrics": cli.export_metrics_parser,
}


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    base = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", "verl_top", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


@pytest.mark.parametrize("command", list(PARSERS))
def test_every_command_has_examples_that_parse(command: str) -> None:
    helped = PARSERS[command]().format_help()
    assert EXAMPLES[command] and "examples:" in helped, command
    lead = ["verl-top", *([] if command == "verl-top" else command.split())]
    for line, what in EXAMPLES[command]:
        assert what and line in helped  # shown as written
        argv = shlex.split(line)
        assert argv[: len(lead)] == lead, line
        rest, parser = argv[len(lead) :], PARSERS[command]()
        if command == "probe":  # `probe` examples name the probe, whose parser reads the rest
            assert rest[0] in cli.PROBES
            rest, parser = rest[1:], cli.probe_nccl_parser()
        parser.parse_args(rest)  # argparse exits (SystemExit) on a stale option


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        ([], ["--refresh S", "(default: 1.0)", "--interval S", "--window S", "--speed N"]),
        (["diagnose"], ["--speed N", "replay speed factor (default: 1.0)"]),
        (["probe", "nccl"], ["timed iterations per message size (default: 20)"]),
        (["probe", "nccl"], ["--timeout TIMEOUT", "(default: 300.0)", "(default: 1M)"]),
    ],
)
def test_help_shows_each_default(argv: list[str], shown: list[str]) -> None:
    out = run(*argv, "--help")
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    for text in shown:
        assert " ".join(text.split()) in flat, text
    assert "(default: None)" not in out.stdout and "(default: False)" not in out.stdout


def test_probe_help_exits_0_and_lists_nccl() -> None:
    out = run("probe", "--help")
    assert out.returncode == 0 and out.stderr == ""
    assert "usage: verl-top probe nccl [options]" in out.stdout
    assert any(line.split()[:1] == ["nccl"] for line in out.stdout.splitlines())
    alone = run("probe")
    assert alone.returncode == 2
    assert alone.stderr.strip().startswith("verl-top probe: say what to probe")
    typo = run("probe", "ncl")
    assert typo.returncode == 2 and "did you mean 'nccl'?" in typo.stderr


def test_probe_without_torch_ends_in_one_plain_sentence(tmp_path: Path) -> None:
    # Hide torch from this process and the probe's ranks: an import of it fails as when absent.
    (tmp_path / "torch.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = run("probe", "nccl", "--backend", "gloo", "--gpus", "2", "--max-bytes", "1M", env=env)
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("verl-top probe: the NCCL probe needs PyTorch and this Python")
    assert "pip install torch" in lines[0] and "--nccl-tests DIR" in lines[0]
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr


def test_doctor_without_hosts_checks_this_machine(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}  # no hosts configured
    ok = run("doctor", "--backend", "replay", "--replay-trace", str(TRACE), env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("this machine ")
    for step in ("python", "agent", "nvml", "sample"):
        assert any(line.split()[:2] == ["ok", step] for line in ok.stdout.splitlines()), step
    assert "8 GPUs via replay" in ok.stdout and "=> all steps passed" in ok.stdout
    none = run("doctor", "--backend", "none", env=env)
    assert none.returncode == 1
    assert "FAIL nvml" in none.stdout and "=> fails at nvml" in none.stdout
    assert "ssh" not in none.stdout.lower().replace("no ssh", "")  # nothing tried over SSH
