"""CLI like the tools users know (issue 18.5): every subcommand in the top-level help, a hint
for a mistyped command, conflicting sources named, help on every option, `snapshot --json`,
and a directory given to --hosts refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_cli import run_cli

from verl_top import cli


def test_top_level_help_lists_every_subcommand_with_one_line() -> None:
    text = cli.app_parser().format_help()
    assert set(cli.SUBCOMMAND_HELP) == set(cli.SUBCOMMANDS)
    width = max(map(len, cli.SUBCOMMAND_HELP))  # one column for every command name
    for name, line in cli.SUBCOMMAND_HELP.items():
        assert f"  {name:<{width}} {line}" in text


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("diagnos", "did you mean 'diagnose'?"),
        ("snapshto", "did you mean 'snapshot'?"),
        ("prob", "did you mean 'probe'?"),
        ("xyzzy", f"(commands: {', '.join(cli.SUBCOMMANDS)})"),
        ("docter", "did you mean 'doctor'?"),
    ],
)
def test_unknown_command_suggests_the_nearest(word: str, hint: str, capsys) -> None:
    assert cli.main([word]) == 2
    err = capsys.readouterr().err
    assert f"unknown command '{word}'" in err and hint in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--demo", "--replay", "x.ndjson"], ("--demo", "--replay")),
        (["--demo", "--hosts", "a,b"], ("--demo", "--hosts")),
        (["diagnose", "--replay", "x.ndjson", "--slurm"], ("--replay", "--slurm")),
        (["snapshot", "-o", "out", "--demo", "--ray", "http://h:8265"], ("--demo", "--ray")),
    ],
)
def test_conflicting_sources_are_an_error_naming_both(argv, names, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert all(n in err for n in names) and "cannot be used together" in err


def test_a_directory_given_to_hosts_is_refused(tmp_path: Path, capsys) -> None:
    assert cli.main(["diagnose", "--hosts", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def _parsers() -> dict[str, argparse.ArgumentParser]:
    probe = cli.probe_nccl_parser()
    return {
        "app": cli.app_parser(),
        "diagnose": cli.diagnose_parser(),
        "snapshot": cli.snapshot_parser(),
        "probe": probe,
    }


@pytest.mark.parametrize("name", ["app", "diagnose", "snapshot", "probe"])
def test_every_option_has_help(name: str) -> None:
    parser = _parsers()[name]
    missing = [
        a.option_strings or [a.dest]
        for a in parser._actions
        if not a.help and a.help is not argparse.SUPPRESS
    ]
    assert missing == []


def test_snapshot_json_prints_the_manifest(tmp_path: Path) -> None:
    out = tmp_path / "snap"
    done = run_cli("snapshot", "--demo", "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["bundle"] == str(out.resolve())
    assert set(doc["files"]) >= {"snapshot.json", "report.md", "recording.ndjson.gz"}
    assert doc["files"]["report.md"] == (out / "report.md").stat().st_size
    assert doc["status"]["label"] == "step 3 bottleneck"
