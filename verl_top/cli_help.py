"""What ``--help`` shows for every command: its options with their defaults, and examples.

The examples are real command lines: tests/test_cli_help.py parses each one with its command's
parser, so they cannot drift from the options.
"""

from __future__ import annotations

import argparse
import platform
import sys
import textwrap
from typing import Any, NoReturn

# Command -> (command line, what it does). The command line starts with "verl-top".
EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "verl-top": (
        ("verl-top", "this machine, in-process (no SSH)"),
        (
            "verl-top --hosts nodes.txt --verl-log head01:/path/to/driver.log",
            "every node over SSH, the driver's log on head01",
        ),
        ("verl-top --slurm --verl-log logs/driver.log", "the nodes of this Slurm job"),
        ("verl-top --ray http://head:8265", "nodes, actors and driver log from Ray"),
        (
            "verl-top --prometheus http://prometheus:9090 --prom-selector 'namespace=\"rl\"'",
            "GPUs from dcgm-exporter, no SSH",
        ),
        ("verl-top --replay session.ndjson.gz --speed 4", "play a recording at 4x"),
        ("verl-top --demo", "the bundled demo recording"),
    ),
    "diagnose": (
        ("verl-top diagnose --verl-log driver.log", "judge a log (a finished one: post-mortem)"),
        (
            "verl-top diagnose --hosts nodes.txt --verl-log head01:/logs/driver.log "
            "--duration 60 --json",
            "watch a live job for 60 s, print JSON",
        ),
        ("verl-top diagnose --replay session.ndjson.gz", "judge a recording"),
    ),
    "snapshot": (
        (
            "verl-top snapshot --hosts nodes.txt --verl-log head01:/logs/driver.log -o bundle",
            "10 s of a live job, then the bundle",
        ),
        ("verl-top snapshot --replay session.ndjson.gz -o bundle --force", "from a recording"),
        (
            "verl-top snapshot --hosts nodes.txt --stacks -o bundle",
            "with every job process's Python stack (py-spy)",
        ),
    ),
    "compare": (
        (
            "verl-top compare runs/0.6/driver.log runs/0.7/driver.log",
            "which stage changed between two runs",
        ),
    ),
    "probe": (
        ("verl-top probe nccl", "all_reduce over every GPU of this machine (torch + NCCL)"),
        ("verl-top probe nccl --backend gloo --gpus 2", "a dry run without GPUs"),
    ),
    "probe nccl": (
        ("verl-top probe nccl", "all_reduce over every GPU of this machine (torch + NCCL)"),
        ("verl-top probe nccl --backend gloo --gpus 2", "a dry run without GPUs"),
        ("verl-top probe nccl --hosts gpu[01-02] --scope inter", "across two nodes over SSH"),
        ("verl-top probe nccl --nccl-tests /opt/nccl-tests/build", "with nccl-tests binaries"),
    ),
    "doctor": (
        ("verl-top doctor", "this machine: python, the agent, NVML, a first sample (no SSH)"),
        ("verl-top doctor gpu01 gpu02", "each host step by step over SSH"),
        ("verl-top doctor nodes.txt -i ~/.ssh/id_gpu --jump me@bastion", "through a bastion"),
    ),
    "export-metrics": (
        (
            "verl-top export-metrics --listen 127.0.0.1:9108 --hosts nodes.txt "
            "--verl-log head01:/logs/driver.log",
            "serve /metrics for Prometheus",
        ),
    ),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option that has a default shows it.

    Like argparse.ArgumentDefaultsHelpFormatter without its noise: no "(default: None)" or
    "(default: False)", and nothing added to a help that already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, "*")
        if (
            text
            and shown
            and "default" not in text.lower()
            and default not in (None, False, "", [], argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


def examples_text(command: str) -> str:
    """The 'examples:' block of ``command``'s help ('' when it has none)."""
    rows = EXAMPLES.get(command, ())
    if not rows:
        return ""
    lines = ["examples:"]
    for line, what in rows:
        lines.append(f"  {line}")
        lines.append(f"      {what}")
    return "\n".join(lines)


def wrap_prose(text: str, width: int = 79) -> str:
    """``text`` with each one-line prose paragraph wrapped to ``width``; paragraphs of several
    lines or indented ones (tables, command lines) are kept as written."""
    paragraphs = text.split("\n\n")
    return "\n\n".join(
        textwrap.fill(p, width) if "\n" not in p and not p.startswith(" ") else p
        for p in paragraphs
    )


def with_help(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """``parser`` with the shared formatter and ``command``'s examples after its epilog."""
    parser.formatter_class = HelpFormatter
    # The formatter keeps text as written (command tables): prose paragraphs are wrapped here.
    if parser.description:
        parser.description = wrap_prose(parser.description)
    parts = [wrap_prose(parser.epilog)] if parser.epilog else []
    examples = examples_text(command)
    if examples:
        parts.append(examples)
    parser.epilog = "\n\n".join(parts) or None
    return parser


# Distributions whose versions a bug report needs (name as installed -> what it does here).
KEY_DEPENDENCIES = (
    ("textual", "the screen"),
    ("asyncssh", "SSH to the nodes"),
    ("nvidia-ml-py", "NVML on this machine"),
    ("psutil", "host samples"),
    ("hyperscan", "a finished log read fast; without it the same lines, slower"),
    ("torch", "only for `probe nccl`"),
)


def dist_version(name: str) -> str:
    """The installed version of distribution ``name``, or 'not installed'."""
    from importlib import metadata  # only for --version: ~10 ms of every start otherwise

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_text() -> str:
    """``verl-top --version``: verl-top, its key dependencies and the Python running it."""
    from verl_top import __version__

    lines = [f"verl-top {__version__}"]
    width = max(len(name) for name, _ in KEY_DEPENDENCIES)
    for name, why in KEY_DEPENDENCIES:
        lines.append(f"  {name:<{width}} {dist_version(name):<14} ({why})")
    lines.append(f"  {'python':<{width}} {platform.python_version():<14} ({sys.executable})")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """``--version``: print version_text() and exit 0 (argparse's own prints one string)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        kw.setdefault("help", "print the versions of verl-top, its key dependencies and Python")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        print(version_text())
        parser.exit()
