"""What to monitor: turns the shared command-line inputs into sources, a store and a pipeline.

Used by the live app and by the headless sub-commands alike, so ``verl-top diagnose`` sees
exactly what the app would. Every problem with the inputs (a bad hosts line, a missing
recording, a log on a host that is not monitored) raises ``InputError`` with one plain
sentence, before anything connects.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from verl_top.sources.base import Source
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.recorder import Recorder
from verl_top.sources.replay import ReplayControl, ReplaySource
from verl_top.store import Store, StoreLimits

if TYPE_CHECKING:
    from verl_top.compare import Run

DEMO_RECORDING = "demo.ndjson.gz"
# A verl log not written for this long is a finished job's (or a dead one's): read it to its end
# and judge at once (post-mortem) instead of following it. --follow keeps following.
POST_MORTEM_AGE_S = 60.0
MAX_GPUS = 65536  # --max-gpus: ~6.5 GB of history at 600 points


class InputError(Exception):
    """An input the user gave cannot be used; the message says which and why."""


@dataclass
class LogSpec:
    """A file to follow: ``kind`` (verl | verl_config | nccl) on ``host`` (None = this machine)."""

    kind: str
    path: str
    host: str | None = None


@dataclass
class Inputs:
    """Everything a run needs: the store, the pipeline feeding it and the sources."""

    store: Store
    pipeline: Pipeline
    sources: list[Source] = field(default_factory=list)
    replay: ReplayControl | None = None
    recorder: Recorder | None = None
    finite: bool = False  # every source ends by itself (replay, finished log files)
    title: str = "verl-top"
    mode: str = "LIVE"  # LIVE | REPLAY | DEMO
    baseline: Run | None = None  # --baseline: a finished run to compare this one with

    def close(self) -> None:
        """Flush the recording, if any."""
        if self.recorder is not None:
            self.recorder.close()


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the inputs shared by the app and the headless sub-commands."""
    g = parser.add_argument_group("what to monitor")
    g.add_argument(
        "--hosts", metavar="FILE|LIST", help="hosts file, or a comma list (a,b,gpu[01-04])"
    )
    g.add_argument("--slurm", action="store_true", help="monitor the nodes of $SLURM_JOB_NODELIST")
    g.add_argument("--replay", metavar="FILE", help="play a recording (.ndjson or .ndjson.gz)")
    g.add_argument("--speed", type=float, default=1.0, metavar="N", help="replay speed factor")
    g.add_argument("--demo", action="store_true", help="replay the bundled demo recording")
    g.add_argument(
        "--record", metavar="FILE", help="also write everything seen to FILE (.gz: gzip)"
    )
    g.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="sample period on the nodes"
    )
    g.add_argument("--window", type=float, default=300.0, metavar="S", help="history window (s)")
    g.add_argument(
        "--max-gpus",
        type=int,
        default=StoreLimits.gpus,
        metavar="N",
        help="GPUs the store keeps a history of (~100 KB each at 600 points); further GPUs "
        "are counted, not shown",
    )
    g.add_argument(
        "--verl-log",
        action="append",
        default=[],
        metavar="[HOST:]PATH",
        help="verl driver log or file-logger JSONL to follow (repeatable)",
    )
    g.add_argument("--verl-config", metavar="[HOST:]PATH", help="the job's config (YAML or JSON)")
    g.add_argument(
        "--baseline",
        metavar="RUN",
        help="a finished run (verl log, recording or snapshot bundle) to compare with: pane 3 "
        "gets a baseline column, the diagnosis screen (d) the difference (docs/compare.md)",
    )
    g.add_argument(
        "--follow",
        action="store_true",
        help=f"follow --verl-log files as live even when they have not grown for "
        f"{POST_MORTEM_AGE_S:.0f} s (default: such a log is read to its end and judged at once)",
    )
    g.add_argument(
        "--nccl-log",
        action="append",
        default=[],
        metavar="[HOST:]PATH",
        help="NCCL_DEBUG=INFO log or nccl-tests output to follow (repeatable)",
    )
    g.add_argument(
        "--expect-busbw",
        action="append",
        default=[],
        metavar="[intra=|inter=]GBS",
        help="NCCL busbw you know your links reach (GB/s); overrides what verl-top derives "
        "from the NIC inventory and topology (plain GBS: cross-node)",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "pynvml", "nvidia-smi", "replay", "none"),
        help="GPU backend of the agent (auto: pynvml, else nvidia-smi, else none)",
    )
    g.add_argument("--replay-trace", metavar="FILE", help=argparse.SUPPRESS)
    # From flags, not the sources: building the parser must not load asyncssh and aiohttp
    # (0.2 s of CPU at every start when no node or Ray dashboard is watched).
    from verl_top.flags import add_prometheus_arguments, add_ray_arguments, add_ssh_arguments

    add_ray_arguments(g)
    add_prometheus_arguments(g)
    add_ssh_arguments(parser)


def parse_log_spec(kind: str, text: str) -> LogSpec:
    """Split ``[host:]PATH``; a prefix with a slash in it is part of the path."""
    head, sep, tail = text.partition(":")
    if sep and head and "/" not in head and tail:
        return LogSpec(kind, tail, head)
    return LogSpec(kind, text, None)


def _check_number(name: str, value: float, low: float) -> None:
    if not value > low:
        raise InputError(f"{name} must be greater than {low:g} (got {value:g})")


def build_inputs(args: argparse.Namespace) -> Inputs:
    """Sources, store and pipeline for the parsed arguments (raises InputError)."""
    _check_number("--interval", args.interval, 0.05 - 1e-9)
    _check_number("--window", args.window, 1.0)
    _check_number("--speed", args.speed, 0.0)
    if not 1 <= args.max_gpus <= MAX_GPUS:
        raise InputError(f"--max-gpus must be 1 to {MAX_GPUS} (got {args.max_gpus})")
    limits = StoreLimits(
        window_s=args.window,
        points=max(120, int(args.window / args.interval) + 1),
        gpus=args.max_gpus,
        hosts=max(StoreLimits.hosts, args.max_gpus // 8),  # 8-GPU nodes: hosts scale along
    )
    store = Store(limits)
    recorder = _open_recorder(args.record)
    pipeline = Pipeline(store, recorder)
    inputs = Inputs(store=store, pipeline=pipeline, recorder=recorder)
    logs = [parse_log_spec("verl", p) for p in args.verl_log]
    # Expected before its first line: a job just started prints nothing for a while, and GPU
    # symptoms then are warm-up (the "waiting for the first verl step" state).
    store.verl_log_given = bool(logs)
    logs += [parse_log_spec("nccl", p) for p in args.nccl_log]
    if args.verl_config:
        logs.append(parse_log_spec("verl_config", args.verl_config))
    if args.demo or args.replay:
        _add_replay(inputs, args)
        remote_logs = [log for log in logs if log.host]
        if remote_logs:
            raise InputError(
                f"{remote_logs[0].host}:{remote_logs[0].path}: a replay reads log files of this "
                "machine only (drop the host prefix)"
            )
        _add_local_logs(inputs, logs, finite=True)
        return inputs
    _add_live(inputs, args, logs)
    return inputs


def run_inputs(path: str, kind: str) -> Inputs:
    """Inputs that read one finished run to its end: a verl log (``kind`` ``log``) or a
    recording (``recording``). For ``verl-top compare``; raises InputError."""
    store = Store(StoreLimits())
    inputs = Inputs(store=store, pipeline=Pipeline(store), finite=True, mode="POST-MORTEM")
    if kind == "recording":
        try:
            source = ReplaySource(Path(path), ReplayControl(speed=1e9))
        except (OSError, ValueError) as exc:
            raise InputError(str(exc)) from exc
        inputs.sources.append(source)
        store.replay = True
    else:
        _add_local_logs(inputs, [LogSpec("verl", path)], finite=True)
    return inputs


def non_regular_reason(path: str) -> str:
    """Why ``path`` is no file to follow ("a FIFO", "a directory", ...), or "" for a regular
    file or one that does not exist (yet). Never opens it: opening a FIFO blocks."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode):
        return ""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"not a regular file ({name})"
    return "not a regular file"


def _open_recorder(path: str | None) -> Recorder | None:
    if not path:
        return None
    try:
        return Recorder(path)
    except OSError as exc:
        raise InputError(f"cannot write the recording {path}: {exc.strerror or exc}") from exc


def demo_recording_path() -> Path:
    """Path of the recording bundled with the package for ``--demo``."""
    return Path(str(resources.files("verl_top") / "data" / DEMO_RECORDING))


def _add_replay(inputs: Inputs, args: argparse.Namespace) -> None:
    path = demo_recording_path() if args.demo else Path(args.replay)
    control = ReplayControl(speed=args.speed)
    try:
        source = ReplaySource(path, control)
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from exc
    inputs.sources.append(source)
    inputs.replay = control
    inputs.finite = True
    inputs.store.replay = True
    inputs.store.origin = "demo" if args.demo else "replay"
    inputs.mode = "DEMO" if args.demo else "REPLAY"
    inputs.title = f"verl-top — {'demo' if args.demo else path.name}"


def _add_local_logs(
    inputs: Inputs, logs: list[LogSpec], finite: bool, then_follow: bool = False
) -> None:
    local = [log for log in logs if log.host is None]
    for log in local:
        option = {"verl": "--verl-log", "nccl": "--nccl-log"}.get(log.kind, "--verl-config")
        if not os.path.exists(log.path):
            raise InputError(f"{log.path}: no such file (given to {option})")
        refusal = non_regular_reason(log.path)
        if refusal:
            raise InputError(f"{log.path}: {refusal} (given to {option}); give the log file itself")
    if local:
        from verl_top.sources.local import LocalFollowSource

        # Logs are read from their start: the steps before verl-top started matter too.
        inputs.sources.append(
            LocalFollowSource(
                [(log.kind, log.path, True) for log in local],
                until_eof=finite,
                then_follow=then_follow,
                # A finished log's quiet lines are counted, not decoded (sources/log_sieve.py).
                sinks=inputs.pipeline.sink if finite else None,
            )
        )


def finished_logs(
    args: argparse.Namespace, logs: list[LogSpec], now: float | None = None
) -> dict[str, dict[str, object]] | None:
    """When only local verl logs were given and none has been written for POST_MORTEM_AGE_S:
    each one's last write time and size (the run is over: judge it post-mortem). Else None."""
    if getattr(args, "follow", False) or args.hosts or args.slurm:
        return None
    if getattr(args, "ray", None) is not None or any(log.host for log in logs):
        return None
    if not any(log.kind == "verl" for log in logs):
        return None
    now = time.time() if now is None else now
    out: dict[str, dict[str, object]] = {}
    for log in logs:
        try:
            st = os.stat(log.path)
        except OSError:
            return None  # a missing file is reported by _add_local_logs
        age = now - st.st_mtime
        if age < POST_MORTEM_AGE_S:
            return None
        out[log.path] = {
            "mtime": st.st_mtime,
            "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(st.st_mtime)),
            "age_s": round(age, 1),
            "age_text": _age_text(age),
            "size": st.st_size,
        }
    return out


def _age_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``2.0 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _add_post_mortem(
    inputs: Inputs, logs: list[LogSpec], info: dict[str, dict[str, object]], headless: bool
) -> None:
    """Finished logs: read them to the end, no live sampling of this machine (its GPUs and
    CPUs say nothing about a job that is over), no stall judgement (no arrival times).

    ``diagnose``/``snapshot`` stop there; the app goes on following the files, so a log that
    was only quiet (a long step) shows its next steps live."""
    _add_local_logs(inputs, logs, finite=True, then_follow=not headless)
    inputs.store.post_mortem = info
    inputs.store.origin = "post-mortem"
    inputs.finite = headless
    inputs.mode = "POST-MORTEM"
    names = ", ".join(os.path.basename(p) for p in info)
    inputs.title = f"verl-top — post-mortem of {names}"
    for path, item in info.items():
        inputs.store.notes.append(
            f"post-mortem: {path} was last written {item['written']} ({item['age_text']} ago); "
            "read to its end and judged as a finished run (--follow: treat it as live)"
        )


def _add_live(inputs: Inputs, args: argparse.Namespace, logs: list[LogSpec]) -> None:
    prom = _prometheus(args)
    finished = None if prom else finished_logs(args, logs)
    if finished is not None:
        # Only the headless commands have --duration: the app keeps following.
        _add_post_mortem(inputs, logs, finished, headless=hasattr(args, "duration"))
        return
    if getattr(args, "ray", None) is not None:
        _add_ray(inputs, args, logs)
        inputs.sources.extend(prom)
        return
    from verl_top.sources.hosts import HostsError, hosts_from_slurm, is_local, parse_hosts_arg
    from verl_top.sources.local import LocalSource

    try:
        specs = (
            hosts_from_slurm()
            if args.slurm
            else (parse_hosts_arg(args.hosts) if args.hosts else [])
        )
    except HostsError as exc:
        raise InputError(str(exc)) from exc
    local_specs = [s for s in specs if is_local(s)]
    remote = [s for s in specs if not is_local(s)]
    for log in logs:
        if log.host is not None and not any(_names(s, log.host) for s in remote):
            if log.host in ("localhost", "127.0.0.1") or any(
                _names(s, log.host) for s in local_specs
            ):
                log.host = None
            else:
                raise InputError(
                    f"--{log.kind.replace('_', '-')} {log.host}:{log.path}: host {log.host} is not "
                    "among the monitored hosts"
                )
    inputs.sources.extend(prom)
    inputs.store.origin = "ssh" if remote else "prometheus" if prom else "local"
    if (not specs and not prom) or local_specs:
        # This machine is monitored when nothing else is (or it is in the hosts list);
        # with --prometheus alone the GPUs come from the cluster's exporters.
        inputs.sources.append(
            LocalSource(
                interval=args.interval,
                backend=args.backend,
                replay_trace=args.replay_trace,
            )
        )
    _add_local_logs(inputs, logs, finite=False)
    if remote:
        agent_args = ["--interval", str(args.interval)]
        if args.backend != "auto":  # the same GPU backend on every node (replay: tests, demos)
            agent_args += ["--backend", args.backend]
        if args.replay_trace:
            agent_args += ["--replay-trace", os.path.abspath(args.replay_trace)]
        inputs.sources.extend(_ssh_sources(remote, args, agent_args, logs))
    inputs.title = f"verl-top — {len(specs) or 1} host{'s' if len(specs) > 1 else ''}"
    if prom:
        url = prom[0].name.split(":", 1)[1]
        inputs.title = f"verl-top — {url}" + (f" + {len(specs)} SSH" if specs else "")


def _prometheus(args: argparse.Namespace) -> list[Source]:
    """The Prometheus source for ``--prometheus`` (empty list without it)."""
    from verl_top.flags import prom_settings
    from verl_top.sources import registry

    try:
        settings = prom_settings(args)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    return registry.build(settings) if settings is not None else []


def _names(spec, host: str) -> bool:
    """True when ``host`` (from ``--verl-log HOST:PATH``) names this host spec.

    The host part cannot carry a port (the colon separates the path), so a host given as
    ``node:2222`` in the hosts file is also matched by its bare name.
    """
    return host in (spec.alias, spec.host)


def _ssh_sources(
    remote: list, args: argparse.Namespace, agent_args: list[str], logs: list[LogSpec]
) -> list[Source]:
    """One SSH source per remote host, each following that host's logs from their start."""
    from verl_top.flags import ssh_settings
    from verl_top.sources import registry
    from verl_top.sources.ssh import SshHostsSettings

    # "+start": the agent reads the file from its beginning (earlier steps matter too).
    follows = {
        spec.alias: [
            (f"{log.kind}+start", log.path) for log in logs if log.host and _names(spec, log.host)
        ]
        for spec in remote
    }
    try:
        settings = SshHostsSettings(remote, ssh_settings(args), agent_args, follows)
    except ValueError as exc:  # unusable SSH options, found before any connection
        raise InputError(str(exc)) from exc
    return registry.build(settings)


def _add_ray(inputs: Inputs, args: argparse.Namespace, logs: list[LogSpec]) -> None:
    """--ray: the nodes come from the Ray cluster (and follow it); see docs/ray.md."""
    from verl_top.flags import ray_settings
    from verl_top.sources import registry
    from verl_top.sources.ray import RayError, RaySource

    if args.hosts or args.slurm:
        raise InputError("--ray finds the nodes itself: drop --hosts / --slurm")
    follows: dict[str, list[tuple[str, str]]] = {}
    for log in logs:
        if log.host is not None and log.host not in ("localhost", "127.0.0.1"):
            follows.setdefault(log.host, []).append((log.kind, log.path))
        else:
            log.host = None
    try:
        settings = ray_settings(args, follows, not any(log.kind == "verl" for log in logs))
        source = registry.build(settings)[0]
    except (RayError, ValueError) as exc:
        raise InputError(str(exc)) from exc
    inputs.sources.append(source)
    inputs.store.origin = "ray"
    _add_local_logs(inputs, logs, finite=False)
    # The "ray" kind builds one RaySource: it knows the dashboard URL it reached.
    url = source.url if isinstance(source, RaySource) else source.name
    inputs.title = f"verl-top — ray {url}"


def expect_busbw_overrides(values: list[str]) -> dict[str, float]:
    """``--expect-busbw`` values as threshold overrides (raises InputError on a bad one)."""
    out: dict[str, float] = {}
    for text in values:
        scope, sep, number = text.partition("=")
        if not sep:
            scope, number = "inter", text
        key = {"inter": "expect_inter_busbw_gbs", "intra": "expect_busbw_gbs"}.get(scope.strip())
        try:
            gbs = float(number)
        except ValueError:
            gbs = -1.0
        if key is None or not 0 < gbs < 1e6:
            raise InputError(
                f"--expect-busbw {text!r}: want GBS, intra=GBS or inter=GBS (a positive number)"
            )
        out[key] = gbs
    return out
