"""``verl-top doctor HOST...``: the command-line side of sources/doctor.py (argparse stays here)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence

from verl_top.cli_help import with_help
from verl_top.flags import add_ssh_arguments
from verl_top.sources.doctor import doctor_hosts, format_reports
from verl_top.sources.hosts import HostsError, HostSpec, parse_hosts_arg


def doctor_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top doctor``."""
    p = argparse.ArgumentParser(
        prog="verl-top doctor",
        description="Check each host step by step (resolve, TCP, host key, auth, python3, "
        "agent, NVML, first sample) and say how to fix the first failing step. Without a host: "
        "this machine (Python, the in-process agent, NVML, first sample).",
    )
    p.add_argument(
        "hosts",
        nargs="*",
        metavar="HOST",
        help="[user@]host[:port], ssh config alias, range or hosts file (default: the "
        "configuration file's hosts; with none, this machine is checked, as `verl-top` "
        "without hosts monitors it)",
    )
    p.add_argument("--config", metavar="FILE", help="verl-top configuration file")
    p.add_argument("--python", default="python3", help="python on the nodes (default python3)")
    p.add_argument(
        "--wait", type=float, default=15.0, metavar="S", help="seconds for the agent's first sample"
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "pynvml", "nvidia-smi", "replay", "none"),
        help="GPU backend of the agent",
    )
    p.add_argument("--replay-trace", metavar="FILE", help=argparse.SUPPRESS)
    add_ssh_arguments(p)
    return with_help(p, "doctor")


def main_doctor(
    argv: Sequence[str],
    parse: Callable[[argparse.ArgumentParser, Sequence[str]], argparse.Namespace] | None = None,
) -> int:
    """``verl-top doctor``: exit 0 when every host passed, 1 when one failed, 2 for bad input.

    ``parse`` parses with the configuration file's values as defaults (cli.py passes it).
    """
    import os

    parser = doctor_parser()
    args = parse(parser, argv) if parse else parser.parse_args(list(argv))
    entries = [args.hosts] if isinstance(args.hosts, str) else list(args.hosts or [])
    if not entries:  # no host given or configured: this machine (the app's default too)
        from verl_top.sources.doctor_local import doctor_local

        trace = os.path.abspath(args.replay_trace) if args.replay_trace else None
        report = asyncio.run(doctor_local(args.backend, args.wait, trace))
        print(format_reports([report]))
        return 0 if report.ok else 1
    try:
        specs: list[HostSpec] = []
        for entry in entries:
            specs += parse_hosts_arg(entry)
        from verl_top.flags import ssh_settings  # the CLI side of the settings

        settings = ssh_settings(args)
        settings.python = args.python
    except (HostsError, ValueError) as exc:
        print(f"verl-top doctor: {exc}", file=sys.stderr)
        return 2
    agent_args: list[str] = []
    if args.backend != "auto":
        agent_args += ["--backend", args.backend]
    if args.replay_trace:
        agent_args += ["--replay-trace", os.path.abspath(args.replay_trace)]
    reports = asyncio.run(doctor_hosts(settings, specs, agent_args, args.wait))
    print(format_reports(reports))
    return 0 if all(r.ok for r in reports) else 1
