"""Command line: ``verl-top`` (the live app) and its headless sub-commands.

    verl-top [INPUTS]                 live monitor (this machine when no hosts are given)
    verl-top diagnose [INPUTS]        print the five-step verdict (text or --json)
    verl-top snapshot [INPUTS] -o DIR write a snapshot bundle
    verl-top probe nccl [...]         run an NCCL bandwidth probe
    verl-top doctor HOST...           check each host step by step (ssh -v for humans)
    verl-top stacks HOST[:PID]...     Python stacks of the job's processes, grouped by role
    verl-top export-metrics --listen HOST:PORT [INPUTS]
                                      serve the verdicts as Prometheus metrics

INPUTS are shared by all of them: --hosts/--slurm (SSH), --replay/--demo, --verl-log,
--verl-config, --nccl-log, --record. Errors in inputs are reported in one plain sentence on
stderr with exit status 2, before anything connects.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from verl_top.cli_help import VersionAction, with_help
from verl_top.inputs import InputError, Inputs, add_input_arguments, build_inputs
from verl_top.settings import (
    Settings,
    SettingsError,
    config_arg,
    default_config_path,
    load_settings,
    parse_args_with,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from verl_top.assessment import Assessment
    from verl_top.diagnosis.engine import Engine  # imported lazily: the engine pulls in the rules

SUBCOMMANDS = ("diagnose", "snapshot", "compare", "probe", "doctor", "stacks", "export-metrics")
# `diagnose` exit statuses (docs/diagnose-json.md): 0 a verdict, 2 bad inputs, 3 nothing to
# judge (no GPU sample, verl step or config read) or a --verl-log gave neither step nor config.
EXIT_NO_DATA = 3
# One line each for `verl-top --help` (every subcommand is listed there).
SUBCOMMAND_HELP: dict[str, str] = {
    "diagnose": "collect for a while, then print the five-step diagnosis (text or --json)",
    "snapshot": "collect, then write a bundle: snapshot.json, report.md, screen.svg, recording",
    "compare": "compare two runs (logs, recordings or bundles): which stage changed and why",
    "probe": "probe nccl: measure NCCL bus bandwidth on this machine or --hosts, on purpose",
    "doctor": "check each host step by step (resolve, TCP, host key, auth, agent, NVML)",
    "stacks": "Python stacks of the job's processes on a node (py-spy), grouped by role",
    "export-metrics": "run headless and serve the verdicts as Prometheus metrics (--listen)",
}
_NAME_W = max(len(name) for name in SUBCOMMAND_HELP)  # the help's command column
# Help for the probe's options that nccl/probe.py leaves without one (every option has help).
PROBE_OPTION_HELP = {
    "master_port": "inter: TCP port of the rendezvous on the first host",
    "nprocs": "processes (GPUs) per host; 0: every GPU the host has",
    "min_bytes": "smallest message size (K, M, G suffixes)",
    "max_bytes": "largest message size (K, M, G suffixes)",
    "collective": "collective to time",
    "nccl_tests": "directory with nccl-tests binaries (all_reduce_perf ...) to use instead of torch",
    "backend": "torch.distributed backend (gloo: no GPU needed, for a dry run)",
    "iters": "timed iterations per message size",
    "warmup": "untimed iterations per message size first",
    "timeout": "seconds before the probe stops itself and kills its processes",
    "what": "what to probe (only nccl)",
}
# Sources that cannot be combined: a replay plays one recording, live sources watch hosts.
REPLAY_SOURCES = ("demo", "replay")
LIVE_SOURCES = ("hosts", "slurm", "ray")


def _base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="configuration file (default ~/.config/verl-top/config.toml; docs/configuration.md)",
    )
    return parser


def app_parser() -> argparse.ArgumentParser:
    """Parser of the live app."""
    parser = _base_parser("verl-top", "Live monitor that tells why a verl training job is slow.")
    parser.usage = "verl-top [COMMAND] [options]"
    parser.description = (
        f"{parser.description}\n\ncommands:\n"
        + "\n".join(f"  {name:<{_NAME_W}} {line}" for name, line in SUBCOMMAND_HELP.items())
        + "\n\nWithout a command: the live monitor (options below). "
        "`verl-top COMMAND --help`: a command's options."
    )
    add_input_arguments(parser)
    parser.add_argument(
        "--theme",
        default=None,
        help="colour theme: verl-dark (default), classic, light, high-contrast, a theme of "
        "~/.config/verl-top/themes/, or a .toml theme file",
    )
    parser.add_argument(
        "--refresh", type=float, default=1.0, metavar="S", help="screen refresh period (s)"
    )
    parser.add_argument(
        "--readonly",
        action="store_true",
        help="never send a signal to a process (the process screen's F9 is refused)",
    )
    return with_help(parser, "verl-top")


def diagnose_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top diagnose``."""
    parser = _base_parser(
        "verl-top diagnose", "Collect for a while, then print the five-step diagnosis."
    )
    add_input_arguments(parser)
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds to collect from live sources (default 10; replays and logs are read to the end)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the JSON schema of docs/diagnose-json.md"
    )
    parser.epilog = (
        "Exit status: 0 a verdict was given; 2 the inputs are unusable; 3 no data to judge "
        "(nothing read), or a --verl-log gave neither a step nor the config (the output says "
        "what was read: lines, lines matched, the first unreadable line)."
    )
    return with_help(parser, "diagnose")


def snapshot_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top snapshot``."""
    parser = diagnose_parser()
    parser.prog = "verl-top snapshot"
    parser.description = "Collect for a while, then write a snapshot bundle."
    parser.epilog = None  # diagnose's exit statuses and examples are not snapshot's
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory")
    parser.add_argument("--force", action="store_true", help="overwrite an existing bundle")
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="before writing, read the Python stacks of every job process on the monitored "
        "hosts (py-spy on each node, as `verl-top stacks`; it pauses each process for a moment) "
        "into stacks.txt; without it, only when job.hang leads, the hung role's",
    )
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to reword
        if action.dest == "json":
            action.help = "print the bundle's manifest (files, sizes, status) as JSON"
    return with_help(parser, "snapshot")


def export_metrics_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top export-metrics``."""
    parser = _base_parser(
        "verl-top export-metrics",
        "Run headless and serve the verdicts (bottleneck, severities, stage shares, host "
        "states) in the Prometheus text format; see docs/prometheus.md.",
    )
    add_input_arguments(parser)
    parser.add_argument(
        "--listen",
        required=True,
        metavar="HOST:PORT",
        help="address of the /metrics endpoint, e.g. 127.0.0.1:9108",
    )
    parser.add_argument(
        "--refresh", type=float, default=5.0, metavar="S", help="seconds between evaluations"
    )
    parser.add_argument(
        "--duration", type=float, default=None, metavar="S", help="stop after S seconds"
    )
    parser.add_argument(
        "--webhook",
        metavar="URL",
        help="also POST each change of the job's state (status and lead) as JSON to URL, with "
        "retries; Slack-style incoming webhooks show its 'text' (docs/alerting.md)",
    )
    parser.add_argument(
        "--print-rules",
        action="store_true",
        help="print the Prometheus alerting rules for these metrics and exit",
    )
    parser.add_argument(
        "--print-dashboard",
        action="store_true",
        help="print the Grafana dashboard (JSON) for these metrics and exit",
    )
    return with_help(parser, "export-metrics")


def compare_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top compare``."""
    parser = _base_parser(
        "verl-top compare",
        "Compare two runs stage by stage: the median seconds per step of each verl stage, the "
        "difference with a noise band from each run's own spread, metric and config changes, "
        "and the stage that explains most of the change with its likely cause.",
    )
    parser.add_argument("baseline", metavar="BASELINE", help="verl log, recording or bundle dir")
    parser.add_argument("current", metavar="CURRENT", help="verl log, recording or bundle dir")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the verl-top.compare/1 document (docs/compare.md)",
    )
    parser.epilog = (
        "Example: verl-top compare runs/0.6/driver.log runs/0.7/driver.log. Exit status: 0 "
        "compared; 2 an input cannot be read; 3 a side has no timed verl step."
    )
    return with_help(parser, "compare")


def unknown_command(word: str) -> str | None:
    """The error for a first argument that is no option and no command (None: not that case)."""
    if word.startswith("-") or word in SUBCOMMANDS:
        return None
    near = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.6)
    hint = f"; did you mean '{near[0]}'?" if near else f" (commands: {', '.join(SUBCOMMANDS)})"
    return f"unknown command '{word}'{hint}"


def check_sources(args: argparse.Namespace) -> None:
    """Refuse inputs that contradict each other, naming both (raises InputError)."""

    def given(name: str) -> bool:
        value = getattr(args, name, None)
        return value not in (None, False, "", [])

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    replays = [n for n in REPLAY_SOURCES if given(n)]
    lives = [n for n in LIVE_SOURCES if given(n)]
    if len(replays) > 1:
        raise InputError(f"{flag(replays[0])} and {flag(replays[1])} cannot be used together")
    if replays and lives:
        raise InputError(
            f"{flag(replays[0])} and {flag(lives[0])} cannot be used together "
            "(a replay plays a recording; live sources watch hosts)"
        )
    hosts = getattr(args, "hosts", None)
    if hosts and os.path.isdir(hosts):
        raise InputError(
            f"--hosts {hosts}: is a directory; give a hosts file (one host a line) or a comma list"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``verl-top`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list and args_list[0] in SUBCOMMANDS else None
    if args_list and command is None and (error := unknown_command(args_list[0])):
        print(f"verl-top: {error}", file=sys.stderr)
        return 2
    try:
        if command == "probe":
            return _run_probe(args_list[1:])
        settings = _load_settings(args_list)
        if command == "doctor":
            from verl_top.doctor_cli import main_doctor

            return main_doctor(args_list[1:], lambda p, a: parse_args_with(p, a, settings))
        if command == "stacks":
            from verl_top.stacks_cli import main_stacks

            return main_stacks(args_list[1:], lambda p, a: parse_args_with(p, a, settings))
        if command == "diagnose":
            args = parse_args_with(diagnose_parser(), args_list[1:], settings)
            return _run_diagnose(args, settings)
        if command == "snapshot":
            args = parse_args_with(snapshot_parser(), args_list[1:], settings)
            return _run_snapshot(args, settings)
        if command == "compare":
            args = parse_args_with(compare_parser(), args_list[1:], settings)
            return _run_compare(args)
        if command == "export-metrics":
            if _print_asset(args_list[1:]):
                return 0
            args = parse_args_with(export_metrics_parser(), args_list[1:], settings)
            return _run_export_metrics(args, settings)
        return _run_app(parse_args_with(app_parser(), args_list, settings), settings)
    except (InputError, SettingsError) as exc:
        print(f"verl-top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as other CLI tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _load_settings(argv: Sequence[str]) -> Settings:
    """The config file's settings; its warnings go to stderr (errors raise SettingsError)."""
    settings = load_settings(config_arg(argv))
    for warning in settings.warnings:
        print(f"verl-top: {warning}", file=sys.stderr)
    return settings


def _engine(settings: Settings, args: argparse.Namespace | None = None) -> Engine:
    """The diagnosis engine with the config file's thresholds and --expect-busbw."""
    import dataclasses

    from verl_top.diagnosis.engine import Engine
    from verl_top.inputs import expect_busbw_overrides

    extra = expect_busbw_overrides(getattr(args, "expect_busbw", None) or [])
    return Engine(dataclasses.replace(settings.thresholds, **extra))


def _load_baseline(inputs: Inputs, args: argparse.Namespace) -> None:
    """``--baseline RUN``: read that finished run now (InputError when it cannot be read)."""
    path = getattr(args, "baseline", None)
    if not path:
        return
    from verl_top.compare import load_run

    inputs.baseline = asyncio.run(load_run(path))
    if not inputs.baseline.steps:
        raise InputError(f"--baseline {path}: no timed verl step in it to compare with")


def _run_app(args: argparse.Namespace, settings: Settings | None = None) -> int:
    from verl_top.ui.app import VerlTopApp
    from verl_top.ui.themes import DEFAULT_THEME, ThemeError, check_theme_arg

    settings = settings or Settings()
    theme = args.theme or DEFAULT_THEME
    try:
        check_theme_arg(theme)  # a bad theme is an error now, not a notification later
    except ThemeError as exc:
        raise InputError(f"--theme: {exc}") from exc
    check_sources(args)
    inputs = build_inputs(args)
    _load_baseline(inputs, args)
    sort = settings.defaults.get("sort")
    app = VerlTopApp(
        inputs,
        refresh=args.refresh,
        theme_name=theme,
        engine=_engine(settings, args),
        readonly=args.readonly,
        # theme, sort and window chosen in the app go back to the file (docs/configuration.md)
        settings_file=settings.path or default_config_path(),
        sort=(sort, bool(settings.defaults.get("sort_reverse", False))) if sort else None,
    )
    app.run()
    inputs.close()
    if app.return_code:
        return app.return_code
    return 0


def _run_diagnose(args: argparse.Namespace, settings: Settings | None = None) -> int:
    from verl_top.diagnosis.report import format_text, to_json
    from verl_top.headless import collect

    check_sources(args)
    inputs = build_inputs(args)
    try:
        _load_baseline(inputs, args)
        assessment = asyncio.run(
            collect(inputs, args.duration, _engine(settings or Settings(), args))
        )
    finally:
        inputs.close()
    for note in dict.fromkeys(inputs.store.notes):  # why data is missing (Prometheus down, ...)
        print(f"verl-top diagnose: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(to_json(assessment), indent=2))
    else:
        print(format_text(assessment))
    verdict = assessment.verdict
    unread = [
        log
        for log in (verdict.inputs.get("logs", []) if verdict is not None else [])
        if log.get("kind") == "verl" and not log.get("steps") and not log.get("config_keys")
    ]
    if verdict is None or verdict.no_data or unread:
        return EXIT_NO_DATA
    return 0


def _screen_svg(inputs, assessment) -> str | None:  # noqa: ANN001
    """The screen the app would show for what was collected (None if it cannot be drawn)."""
    from verl_top.ui.screenshot import render_screen_svg

    try:
        return asyncio.run(render_screen_svg(inputs, assessment))
    except Exception as exc:  # noqa: BLE001 - the bundle is still useful without its picture
        print(f"verl-top snapshot: no screen.svg ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _snapshot_stacks(inputs: Inputs, every: bool) -> Callable[[Assessment], Awaitable[None]]:
    """What ``snapshot`` does before its sources stop: read the stacks of every job process
    (``--stacks``), else of the hung role when job.hang leads (docs/stacks.md)."""
    from verl_top.hang_stacks import HangStacks, every_target
    from verl_top.node_exec import reaches_processes
    from verl_top.stacks import PAUSE_NOTE

    if every and not reaches_processes(inputs.sources):
        raise InputError(
            "--stacks reads the job's processes on the nodes: give --hosts or --slurm, or run "
            "it on the node itself (a replay, Prometheus or Ray alone has no process to read)"
        )
    reader = HangStacks(inputs.store, inputs.sources)

    async def finale(assessment: Assessment) -> None:
        targets = every_target(inputs.store) if every else reader.due(assessment)
        if not targets:
            return
        why = "--stacks" if every else "job.hang leads"
        print(
            f"verl-top snapshot: reading the Python stacks of {len(targets)} process(es) "
            f"({why}); {PAUSE_NOTE}",
            file=sys.stderr,
        )
        await reader.read(targets)

    return finale


def _run_snapshot(args: argparse.Namespace, settings: Settings | None = None) -> int:
    from verl_top.export.snapshot import SnapshotError, check_output, write_snapshot
    from verl_top.headless import collect

    check_sources(args)
    try:
        check_output(args.output, args.force)
    except SnapshotError as exc:
        print(f"verl-top snapshot: {exc}", file=sys.stderr)
        return 1
    inputs = build_inputs(args)
    try:
        _load_baseline(inputs, args)
        finale = _snapshot_stacks(inputs, every=args.stacks)
        assessment = asyncio.run(
            collect(inputs, args.duration, _engine(settings or Settings(), args), finale)
        )
        screen = _screen_svg(inputs, assessment)
        try:
            path = write_snapshot(
                inputs.store, assessment, args.output, force=args.force, screen_svg=screen
            )
        except SnapshotError as exc:
            print(f"verl-top snapshot: {exc}", file=sys.stderr)
            return 1
    finally:
        inputs.close()
    if args.json:
        print(json.dumps(bundle_manifest(Path(path), assessment.status.as_dict()), indent=2))
    else:
        print(f"snapshot written to {path}")
    return 0


ASSETS = {
    "--print-rules": "alerts/verl-top.rules.yml",
    "--print-dashboard": "grafana/verl-top.json",
}


def _print_asset(argv: list[str]) -> bool:
    """``export-metrics --print-rules`` / ``--print-dashboard``: print that file (no --listen
    needed); False when neither flag is given."""
    from importlib import resources

    for flag, name in ASSETS.items():
        if flag in argv:
            print((resources.files("verl_top") / "data" / name).read_text(), end="")
            return True
    return False


def _run_export_metrics(args: argparse.Namespace, settings: Settings | None = None) -> int:
    from verl_top.export.metrics import parse_listen, serve
    from verl_top.export.webhook import WebhookError, WebhookNotifier, check_url

    try:
        parse_listen(args.listen)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    notifier = None
    if args.webhook:
        try:
            notifier = WebhookNotifier(check_url(args.webhook))
        except WebhookError as exc:
            raise InputError(str(exc)) from exc
    if not args.refresh > 0:
        raise InputError(f"--refresh must be greater than 0 (got {args.refresh:g})")
    inputs = build_inputs(args)
    try:
        _load_baseline(inputs, args)
        asyncio.run(
            serve(
                inputs,
                _engine(settings or Settings(), args),
                args.listen,
                args.refresh,
                args.duration,
                notifier,
            )
        )
    except OSError as exc:  # the address is taken or not ours
        print(f"verl-top export-metrics: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    finally:
        inputs.close()
    for note in notifier.notes if notifier is not None else []:
        print(f"verl-top export-metrics: {note}", file=sys.stderr)
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from verl_top.compare import compare_runs, format_text, load_run, to_json

    async def both() -> tuple:
        return await load_run(args.baseline), await load_run(args.current)

    base, cur = asyncio.run(both())
    comp = compare_runs(base, cur)
    print(json.dumps(to_json(comp), indent=2) if args.json else format_text(comp), end="")
    if args.json:
        print()
    return 0 if base.steps and cur.steps else EXIT_NO_DATA


def bundle_manifest(path: Path, status: dict[str, object]) -> dict[str, object]:
    """``snapshot --json``: the bundle's path, files and sizes, status, and the manifest that
    verl-top writes into a bundle (when there is one)."""
    doc: dict[str, object] = {
        "bundle": str(path.resolve()),
        "files": {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()},
        "status": status,
    }
    manifest = path / "verl-top-manifest.json"
    if manifest.is_file():
        try:
            doc["manifest"] = json.loads(manifest.read_text())
        except (OSError, ValueError):
            doc["manifest"] = None
    return doc


PROBES = {
    "nccl": "NCCL collective bus bandwidth (all_reduce, all_gather) against what the links should reach"
}


def probe_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top probe`` itself: what can be probed (``probe --help``)."""
    parser = _base_parser(
        "verl-top probe",
        "Measure on purpose what the monitor cannot see passively. A probe loads the GPUs and the "
        "network: it perturbs a training job while it runs, so it refuses to start while GPUs "
        "are busy unless --force.\n\nprobes:\n"
        + "\n".join(f"  {name:<6} {what}" for name, what in PROBES.items())
        + "\n\n`verl-top probe nccl --help`: its options.",
    )
    parser.usage = "verl-top probe nccl [options]"
    parser.add_argument("what", choices=tuple(PROBES), help="what to probe")
    return with_help(parser, "probe")


def probe_nccl_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top probe nccl``."""
    from verl_top.nccl.probe import add_probe_arguments

    parser = _base_parser(
        "verl-top probe nccl",
        "Measure NCCL bus bandwidth on purpose: torch.distributed ranks on this machine or on "
        "--hosts over SSH (or nccl-tests binaries with --nccl-tests), the peak busbw at large "
        "sizes against what the GPU links and NICs should reach (docs/nccl.md).",
    )
    add_probe_arguments(parser)
    for action in parser._actions:  # noqa: SLF001 - fill the help nccl/probe.py leaves out
        if not action.help and action.dest in PROBE_OPTION_HELP:
            action.help = PROBE_OPTION_HELP[action.dest]
    return with_help(parser, "probe nccl")


def _run_probe(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        parser = probe_parser()
        if argv and argv[0] in ("-h", "--help", "--version"):
            parser.parse_args(argv)  # prints and exits 0
        print(
            "verl-top probe: say what to probe: verl-top probe nccl [options] "
            "(verl-top probe --help lists the probes)",
            file=sys.stderr,
        )
        return 2
    if argv[0] not in PROBES:
        near = difflib.get_close_matches(argv[0], PROBES, n=1, cutoff=0.5)
        hint = (
            f"; did you mean '{near[0]}'?"
            if near
            else " (" + ", ".join(f"verl-top probe {name}" for name in PROBES) + ")"
        )
        print(f"verl-top probe: unknown probe '{argv[0]}'{hint}", file=sys.stderr)
        return 2
    from verl_top.nccl.probe import main_probe

    return asyncio.run(main_probe(probe_nccl_parser().parse_args(argv[1:])))
