"""``verl-top stacks HOST[:PID]...``: the command-line side of stacks.py (argparse stays here)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

from verl_top import stacks
from verl_top.node_exec import Runner, local_run
from verl_top.sources.hosts import HostsError, HostSpec, is_local, parse_hosts_arg


def stacks_parser() -> argparse.ArgumentParser:
    """Parser of ``verl-top stacks``."""
    from verl_top.flags import add_ssh_arguments

    p = argparse.ArgumentParser(
        prog="verl-top stacks",
        description="Python stacks of the verl job's processes on a node (or of one PID), "
        "grouped by role: N processes share this stack. Uses py-spy on the node through SSH "
        "(it must be on the node: the PATH, ~/.local/bin or next to the job's python), else "
        "the Ray dashboard given with --ray. " + stacks.PAUSE_NOTE + ".",
        epilog="examples:\n  verl-top stacks gpu07                 every job process on gpu07\n"
        "  verl-top stacks gpu07:81234           one process\n"
        "  verl-top stacks alice@gpu07:2222:81234  user, SSH port and pid\n"
        "  verl-top stacks localhost             this machine, no SSH\n"
        "  verl-top stacks gpu07 --ray http://head:8265 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="HOST[:PID]",
        help="[user@]host[:port] (a port needs a pid after it: host:port:pid); this machine "
        "without SSH: localhost or its hostname",
    )
    p.add_argument("--python", default="python3", help="python on the node (default python3)")
    p.add_argument(
        "--ray", metavar="URL", help="Ray dashboard to ask when py-spy cannot be run over SSH"
    )
    p.add_argument("--json", action="store_true", help="print JSON (one object per process)")
    p.add_argument(
        "--frames",
        type=int,
        default=0,
        metavar="N",
        help="innermost frames shown per stack (default 0: all)",
    )
    add_ssh_arguments(p)
    return p


def split_target(text: str) -> tuple[str, int | None]:
    """``HOST[:PID]`` -> (host part, pid): the pid is the last ``:`` field when it is a number
    and something comes before it (``gpu07:2222`` is host gpu07, pid 2222; a port needs a pid
    after it)."""
    host, sep, last = text.rpartition(":")
    if sep and host and last.isdigit():
        pid = int(last)
        if not 0 < pid < 2**31:
            raise HostsError(f"{text}: {last} is not a pid")
        return host, pid
    return text, None


async def _host_stacks(
    run: Runner, spec: HostSpec, pids: list[int], python: str, ray: stacks.RayTrace | None
) -> list[stacks.ProcessStack]:
    jobs = await stacks.job_targets(run, spec.name, python)
    if pids:
        known = {t.pid: t for t in jobs}
        targets = [known.get(p, stacks.Target(spec.name, p)) for p in pids]
    else:
        targets = jobs
    if not targets:
        return [
            stacks.ProcessStack(
                spec.name,
                0,
                error=f"no process of the job on {spec.name}: none of its processes' titles is "
                "a Ray worker, verl, vLLM, SGLang or torchrun, and none holds a GPU (give a PID)",
            )
        ]
    return await stacks.collect_host(run, spec.name, targets, ray)


async def collect(
    specs: list[tuple[HostSpec, list[int]]],
    connect: Callable[[HostSpec], AbstractAsyncContextManager[Runner]],
    python: str,
    ray: stacks.RayTrace | None,
) -> list[stacks.ProcessStack]:
    """Stacks of every host, concurrently; a host that cannot be reached says so."""
    from verl_top.sources.ssh import RemoteCommandError

    async def one(spec: HostSpec, pids: list[int]) -> list[stacks.ProcessStack]:
        try:
            if is_local(spec):
                return await _host_stacks(local_run, spec, pids, python, ray)
            async with connect(spec) as run:
                return await _host_stacks(run, spec, pids, python, ray)
        except (RemoteCommandError, RuntimeError, OSError) as exc:
            return [stacks.ProcessStack(spec.name, pid, error=str(exc)) for pid in pids or [0]]

    parts = await asyncio.gather(*(one(spec, pids) for spec, pids in specs))
    return [s for part in parts for s in part]


def main_stacks(
    argv: Sequence[str],
    parse: Callable[[argparse.ArgumentParser, Sequence[str]], argparse.Namespace] | None = None,
) -> int:
    """``verl-top stacks``: exit 0 when every process was read, 1 when one was not, 2 for bad
    input."""
    parser = stacks_parser()
    args = parse(parser, argv) if parse else parser.parse_args(list(argv))
    by_host: dict[str, tuple[HostSpec, list[int]]] = {}
    try:
        for text in args.targets:
            host, pid = split_target(text)
            for spec in parse_hosts_arg(host):
                entry = by_host.setdefault(spec.name, (spec, []))
                if pid is not None:
                    entry[1].append(pid)
        from verl_top.flags import ssh_settings
        from verl_top.sources.ssh import ssh_exec

        settings = ssh_settings(args)
    except (HostsError, ValueError) as exc:
        print(f"verl-top stacks: {exc}", file=sys.stderr)
        return 2
    ray = None
    if args.ray:
        from verl_top.sources.ray import RayError, dashboard_url

        try:
            url, _ = dashboard_url(args.ray)
        except RayError as exc:
            print(f"verl-top stacks: {exc}", file=sys.stderr)
            return 2
        addrs = {name: spec.host for name, (spec, _) in by_host.items()}
        ray = stacks.ray_traceback(url, lambda h: socket.gethostbyname(addrs.get(h, h)))
    got = asyncio.run(
        collect(list(by_host.values()), lambda s: ssh_exec(settings, s), args.python, ray)
    )
    if args.json:
        print(json.dumps(stacks.to_json(got), indent=1))
    else:
        print(stacks.render_text(got, args.frames or None), end="")
    return 0 if got and all(s.threads for s in got) else 1
