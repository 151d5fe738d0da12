"""Client side of the bandwidth probes: run them, parse them, compare with the expected table.

Two tools: nccl-tests (``all_reduce_perf`` ...) when installed, else the built-in torch probe
(``torch_probe.py``, self-contained). Probes run only when the user asks, and the torch probe
refuses GPUs that already run compute processes unless ``force``.

Transport-agnostic remote runs: :func:`run_remote_probe` takes a ``run(argv, stdin_text)``
callable returning an async iterator of output lines, and :func:`probe_command` builds the argv
(``python3 -u -c BOOTSTRAP ARGS --stdin-eof-cancel``; the bootstrap reads the script from stdin,
and stdin then stays open: its EOF tells the probe that the client is gone). Over SSH,
:func:`ssh_probe_runner` provides ``run`` and :func:`probe_ssh_hosts` probes each node alone
(``scope="intra"``) or all of them together (``scope="inter"``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_top import protocol
from verl_top.deadline import within
from verl_top.model import ProbeResult
from verl_top.nccl.expected import Expectation, expected_busbw, fill_expectation, ratio
from verl_top.nccl.parse import NcclLogState, parse_nccl_tests
from verl_top.nccl.topo import Topology, parse_topo
from verl_top.nccl.torch_probe import PROGRESS_PREFIX, parse_size
from verl_top.untrusted import clean_text

if TYPE_CHECKING:
    from verl_top.model import NodeTopology
    from verl_top.sources.hosts import HostSpec
    from verl_top.sources.ssh import SshSettings

SCRIPT_PATH = Path(__file__).with_name("torch_probe.py")
RunFn = Callable[[list[str], str], AsyncGenerator[str, None]]  # closed with aclosing
_KILL_GRACE_S = 3.0
DEFAULT_MASTER_PORT = 29533  # across nodes; away from torchrun's 29500 that a job may hold
_PEER_GRACE_S = 15.0  # a non-first launcher ended: how long the first may still take
_CONNECT_MARGIN_S = 30.0  # client-side limit = probe timeout + this (SSH login, interpreter)
# Reads "<byte count>\n<script>" from stdin and runs it as __main__; stdin stays open after.
# "verl-top-probe" also marks the process's command line.
PROBE_BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());s=b.read(n);"
    "sys.argv=['verl-top-probe']+sys.argv[1:];"
    "exec(compile(s,'verl-top-probe','exec'),{'__name__':'__main__','__builtins__':__builtins__})"
)


def probe_script() -> str:
    """The torch probe's source, as sent to nodes."""
    return SCRIPT_PATH.read_text(encoding="utf-8")


def probe_args(
    *,
    backend: str = "nccl",
    nprocs: int = 0,
    collectives: Sequence[str] = ("all_reduce",),
    min_bytes: int | str = "1M",
    max_bytes: int | str = "1G",
    iters: int = 20,
    warmup: int = 5,
    timeout: float = 300.0,
    force: bool = False,
    rank_offset: int = 0,
    world_size: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    host: str = "",
    busy_check: str = "auto",
    nccl_debug: bool = True,
) -> list[str]:
    """Command-line arguments of ``torch_probe.py`` (without the interpreter and script)."""
    argv = ["--backend", backend, "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes)]
    argv += ["--iters", str(iters), "--warmup", str(warmup), "--timeout", f"{timeout:g}"]
    for c in collectives:
        argv += ["--collective", c]
    if nprocs:
        argv += ["--nprocs", str(nprocs)]
    if force:
        argv.append("--force")
    if world_size:
        argv += ["--rank-offset", str(rank_offset), "--world-size", str(world_size)]
    argv += ["--master-addr", master_addr]
    if master_port:
        argv += ["--master-port", str(master_port)]
    if host:
        argv += ["--host", host]
    if busy_check != "auto":
        argv += ["--busy-check", busy_check]
    if nccl_debug and backend == "nccl":
        argv.append("--nccl-debug")
    return argv


def probe_payload() -> str:
    """What :data:`PROBE_BOOTSTRAP` reads from stdin: ``f"{byte count}\\n{script}"``."""
    script = probe_script()
    return f"{len(script.encode('utf-8'))}\n{script}"


def probe_command(python: str = "python3", **kwargs: Any) -> tuple[list[str], str]:
    """(remote argv, stdin text) of one launcher; see :data:`PROBE_BOOTSTRAP`.

    The transport must write the stdin text and keep stdin open while the probe runs: the probe
    cancels itself (killing its ranks) when stdin closes.
    """
    args = probe_args(**kwargs)  # its keywords, checked by name there
    return [python, "-u", "-c", PROBE_BOOTSTRAP, *args, "--stdin-eof-cancel"], probe_payload()


class ProbeCollector:
    """Turns probe output lines into ProbeResults; NCCL INFO lines feed the transport classifier."""

    def __init__(self, on_progress: Callable[[str], None] | None = None) -> None:
        self.on_progress = on_progress
        self.progress = ""  # the latest progress line, without its prefix
        self.results: list[ProbeResult] = []
        self.gpu_names: dict[str, str] = {}
        self.log = NcclLogState()
        self.other: list[str] = []  # last non-record lines, for error messages
        self._decoder = protocol.Decoder()

    def feed(self, line: str) -> None:
        """Accept one output line (stdout or stderr)."""
        text = line.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict) and data.get("type") == "probe":
                record = self._decoder.decode(text)
                if isinstance(record, ProbeResult):
                    self.gpu_names[record.collective] = str(data.get("gpu_name") or "")
                    self.results.append(record)
                    return
        if text.startswith(PROGRESS_PREFIX):
            self.progress = _progress_text(text[len(PROGRESS_PREFIX) :])
            if self.on_progress is not None:
                self.on_progress(self.progress)
            return
        self.log.feed_line(text)
        if text:
            self.other = (self.other + [text])[-20:]

    def finish(
        self,
        collective: str,
        host: str,
        topo: Topology | None = None,
        error: str = "",
        nics: int | None = None,
        inventory: Mapping[str, NodeTopology] | None = None,
    ) -> ProbeResult:
        """The result for ``collective`` with transport and expectation filled in."""
        found = [r for r in self.results if r.collective == collective]
        if found:
            result = found[-1]
        else:
            why = error or ("; ".join(self.other[-3:]) or "probe produced no result")
            result = ProbeResult(
                host=host, t=time.time(), tool="torch", collective=collective, ok=False, error=why
            )
        if not result.transport:
            result.transport = self.log.transport()
        no_bus(result)
        if result.ok:
            fill_expectation(
                result,
                gpu_name=self.gpu_names.get(collective, "") or result.gpu_name or "",
                topo=topo,
                nics=nics,
                inventory=inventory,
            )
        return result


def _progress_text(raw: str) -> str:
    """``all_reduce 3/11 4194304 B 12.3 GB/s`` -> ``all_reduce 3/11: 4 MiB, busbw 12.3 GB/s``."""
    parts = clean_text(raw, 200).split()  # a node's output: untrusted
    if len(parts) >= 6 and parts[2].isdigit() and len(parts[2]) < 16:
        return f"{parts[0]} {parts[1]}: {human_size(int(parts[2]))}, busbw {parts[4]} GB/s"
    return " ".join(parts)


def no_bus(result: ProbeResult) -> ProbeResult:
    """One rank crosses no link: clear the transport NCCL's bootstrap logs for it.

    A single-GPU NCCL run still prints ``Using network Socket`` (its bootstrap network), which
    read as a transport would claim "Socket, RDMA off" for a probe that moved no bytes.
    """
    if result.nranks == 1:  # 0 = unknown (a failed probe): keep what the log said
        result.transport = ""
    return result


async def _read_lines(stream: asyncio.StreamReader | None, sink: ProbeCollector) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        sink.feed(line.decode("utf-8", "replace"))


def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the probe's process group (the launcher cleans up), then SIGKILL what is left."""
    if proc.returncode is None:
        _kill_group(proc, signal.SIGTERM)
        try:
            await within(proc.wait(), _KILL_GRACE_S)
        except asyncio.TimeoutError:
            pass
    _kill_group(proc, signal.SIGKILL)  # workers could outlive a launcher killed hard
    if proc.returncode is None:
        await proc.wait()


async def run_local_probe(
    collective: str = "all_reduce",
    *,
    backend: str = "nccl",
    nprocs: int = 0,
    min_bytes: int | str = "1M",
    max_bytes: int | str = "1G",
    iters: int = 20,
    warmup: int = 5,
    timeout: float = 300.0,
    force: bool = False,
    busy_check: str = "auto",
    topo: Topology | None = None,
    python: str = sys.executable,
    on_start: Callable[[int], None] | None = None,
    env: dict[str, str] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Run ``torch_probe.py`` on this machine and return its result for ``collective``.

    The probe runs in its own session (process group); a timeout or cancellation of this
    coroutine kills the whole group, so no rank is left behind. ``on_start(pid)`` is called with
    the launcher's pid (tests use it).
    """
    host = socket.gethostname()
    argv = [python, "-u", str(SCRIPT_PATH)]
    argv += probe_args(
        backend=backend,
        nprocs=nprocs,
        collectives=(collective,),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        iters=iters,
        warmup=warmup,
        timeout=timeout,
        force=force,
        host=host,
        busy_check=busy_check,
    )
    argv.append("--stdin-eof-cancel")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    if on_start is not None:
        on_start(proc.pid)
    sink = ProbeCollector(on_progress)
    error = ""
    try:
        # The launcher enforces `timeout` itself; the margin covers interpreter start-up.
        await within(
            asyncio.gather(
                _read_lines(proc.stdout, sink), _read_lines(proc.stderr, sink), proc.wait()
            ),
            timeout + 15.0,
        )
    except asyncio.TimeoutError:
        error = f"timed out after {timeout:g} s"
    finally:
        await _stop(proc)
    if topo is None and backend == "nccl":
        topo = await local_topology()
    return sink.finish(collective, host, topo=topo, error=error)


async def local_topology() -> Topology | None:
    """``nvidia-smi topo -m`` of this machine, None when it cannot be run."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            "nvidia-smi",
            "topo",
            "-m",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await within(proc.communicate(), 30)
    except (OSError, asyncio.TimeoutError):
        return None
    topo = parse_topo(out.decode("utf-8", "replace"))
    return topo if topo.devices else None


class _HostFailed(Exception):
    """One host of a remote probe failed; the message names it."""


async def run_remote_probe(
    run: RunFn | Sequence[RunFn],
    hosts: Sequence[str],
    collective: str = "all_reduce",
    *,
    nprocs: int,
    master_port: int | None = None,
    master_addr: str | None = None,
    python: str = "python3",
    nics: int | None = None,
    timeout: float = 300.0,
    on_progress: Callable[[str, str], None] | None = None,
    inventory: Mapping[str, NodeTopology] | None = None,
    **kwargs: object,
) -> ProbeResult:
    """Probe across ``hosts``: one launcher per host, ``nprocs`` ranks each, rank 0 on hosts[0].

    ``run`` is one ``run(argv, stdin_text)`` per host (or one callable for all, which then tells
    hosts apart by the ``--host`` argument). One host: ranks meet on 127.0.0.1 at a port the
    node picks; several: at ``master_addr`` (default hosts[0], which the other hosts must be
    able to reach) and ``master_port`` (default 29533). A host that cannot be reached or whose
    launcher fails stops the whole run and is named in the error. The probe enforces
    ``timeout`` itself; this side gives up ``_CONNECT_MARGIN_S`` later. Cancelling this
    coroutine closes every launcher's stdin and connection before it returns, which stops the
    launchers and their ranks.
    """
    runs = list(run) if isinstance(run, Sequence) else [run] * len(hosts)
    single = len(hosts) == 1
    world = nprocs * len(hosts)
    addr = master_addr or ("127.0.0.1" if single else hosts[0])
    port = master_port if master_port is not None else (0 if single else DEFAULT_MASTER_PORT)
    # Progress comes from rank 0's launcher (the first host); ``on_progress(host, text)``.
    sinks = [
        ProbeCollector(functools.partial(on_progress, h) if on_progress is not None else None)
        for h in hosts
    ]

    async def one(i: int, host: str) -> str:
        argv, stdin_text = probe_command(
            python,
            nprocs=nprocs,
            collectives=(collective,),
            rank_offset=i * nprocs,
            world_size=world,
            master_addr=addr,
            master_port=port,
            host=host,
            timeout=timeout,
            **kwargs,
        )
        try:
            async with contextlib.aclosing(runs[i](argv, stdin_text)) as lines:
                async for line in lines:
                    sinks[i].feed(line)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - becomes this host's error
            raise _HostFailed(str(exc) if host in str(exc) else f"{host}: {exc}") from None
        if i == 0:
            return ""
        failed = [r for r in sinks[i].results if not r.ok]
        if failed:
            raise _HostFailed(f"{host}: {failed[-1].error}")
        last = "; ".join(sinks[i].other[-3:]) or "no output"
        return f"{host}: launcher ended before the first host's: {last}"

    error = await _supervise_hosts([one(i, h) for i, h in enumerate(hosts)], timeout)
    head = sinks[0]
    for sink in sinks[1:]:  # transport lines may come from any node
        for key, gdr in sink.log.net_via.items():
            head.log.net_via[key] = head.log.net_via.get(key, False) or gdr
        if not head.log.nnodes and sink.log.nnodes:
            head.log.nnodes = sink.log.nnodes
    result = head.finish(collective, hosts[0], nics=nics, error=error, inventory=inventory)
    if error and result.ok:
        result.ok, result.error = False, error
    elif error and error not in result.error:
        result.error = f"{error}; {result.error}" if result.error else error
    result.host = hosts[0]
    result.hosts = list(hosts)  # the names the user gave, as the UI keys hosts by them
    if not single:
        result.scope = "inter"
    if result.ok:
        # Judged like a parsed nccl-tests file, now that hosts carry the names the inventory uses.
        fill_expectation(result, gpu_name=result.gpu_name or "", nics=nics, inventory=inventory)
    return result


async def _supervise_hosts(jobs: list, timeout: float) -> str:
    """Run one coroutine per host until the first one ends; '' or the error to report.

    The first host's launcher holds rank 0 and reports. The others are stopped once it ends
    (after a short wait for their own clean exit), on the first failure, or at the time limit.
    A non-first launcher that ends while the first still runs (its job returns why) fails the
    run unless the first ends within ``_PEER_GRACE_S``.
    """
    tasks = [asyncio.create_task(job) for job in jobs]
    head = tasks[0]
    limit = time.monotonic() + timeout + _CONNECT_MARGIN_S
    deadline = limit
    early: list[str] = []
    error = ""
    try:
        pending = set(tasks)
        while not head.done():
            left = deadline - time.monotonic()
            if left <= 0:
                error = "; ".join(early) or f"timed out after {timeout:g} s (probe not answering)"
                break
            done, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            peers = [t for t in done if t is not head]
            failed = [t for t in peers if t.exception() is not None]
            if failed:
                error = "; ".join(str(t.exception()) for t in failed)
                break
            if peers:
                early += [t.result() for t in peers]
                deadline = min(limit, time.monotonic() + _PEER_GRACE_S)
        rest = [t for t in tasks[1:] if not t.done()]
        if not error and rest:
            await asyncio.wait(rest, timeout=5.0)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not error and not head.cancelled() and head.exception() is not None:
        error = str(head.exception())
    return error


def ssh_probe_runner(settings: SshSettings, spec: HostSpec) -> RunFn:
    """``run(argv, stdin_text)`` that starts ``argv`` on ``spec`` over SSH (stdin kept open)."""
    import shlex

    from verl_top.sources.ssh import run_remote

    def run(argv: list[str], stdin_text: str) -> AsyncGenerator[str, None]:
        command = "exec " + " ".join(shlex.quote(a) for a in argv)
        return run_remote(settings, spec, command, stdin_text)

    return run


GPU_COUNT_COMMAND = "nvidia-smi -L"  # one "GPU i: NAME (UUID: ...)" line per GPU


def count_gpu_lines(lines: Sequence[str]) -> int:
    """GPUs in ``nvidia-smi -L`` output (MIG lines are not GPUs)."""
    return sum(1 for line in lines if line.strip().startswith("GPU ") and ":" in line)


async def remote_gpu_counts(
    specs: Sequence[HostSpec], settings: SshSettings, command: str = GPU_COUNT_COMMAND
) -> dict[str, int]:
    """GPUs per host from ``nvidia-smi -L`` over SSH (0 when the host has none or no driver).

    A host that cannot be reached raises (``RemoteCommandError`` names it).
    """
    from verl_top.sources.ssh import run_remote

    async def one(spec: HostSpec) -> tuple[str, int]:
        lines: list[str] = []
        async with contextlib.aclosing(
            run_remote(settings, spec, command, close_stdin=True)
        ) as out:
            async for line in out:
                if len(lines) < 4096:
                    lines.append(line)
        return spec.name, count_gpu_lines(lines)

    return dict(await asyncio.gather(*(one(s) for s in specs)))


def ranks_per_node(counts: Mapping[str, int]) -> tuple[int, str]:
    """Ranks per node for a cross-node probe: the smallest GPU count (every node must have one);
    returns (n, "") or (0, why not)."""
    if not counts:
        return 0, "no hosts"
    empty = [h for h, n in counts.items() if n <= 0]
    if empty:
        return 0, f"no GPU on {', '.join(empty)} (nvidia-smi -L lists none)"
    return min(counts.values()), ""


async def probe_ssh_hosts(
    specs: Sequence[HostSpec],
    settings: SshSettings,
    collective: str = "all_reduce",
    *,
    scope: str = "intra",
    nprocs: int = 0,
    gpu_count_command: str = GPU_COUNT_COMMAND,
    **kwargs: Any,  # run_remote_probe's keywords, checked by name there
) -> list[ProbeResult]:
    """Probe nodes over SSH: each alone (``intra``, one result per host, run concurrently) or
    all together (``inter``, one result; ``nprocs`` ranks per node, default: the fewest GPUs
    any node has, counted with ``gpu_count_command`` (``nvidia-smi -L``) over SSH).

    Keyword arguments go to :func:`run_remote_probe` (``backend``, ``max_bytes``, ``timeout``,
    ``force``, ``master_addr``, ...); the remote interpreter is ``settings.python``.
    """
    names = [s.name for s in specs]
    if scope == "inter":
        if nprocs <= 0:
            # No --gpus: take the GPUs the nodes have (the smallest count, so every node fits).
            counts = await remote_gpu_counts(specs, settings, gpu_count_command)
            nprocs, why = ranks_per_node(counts)
            if nprocs <= 0:
                raise ValueError(f"a cross-node probe needs GPUs on every node: {why}")
        runs = [ssh_probe_runner(settings, s) for s in specs]
        addr = kwargs.pop("master_addr", None) or specs[0].host
        result = await run_remote_probe(
            runs,
            names,
            collective,
            nprocs=nprocs,
            master_addr=addr,
            python=settings.python,
            **kwargs,
        )
        return [result]
    kwargs.pop("master_addr", None)
    kwargs.pop("master_port", None)
    return list(
        await asyncio.gather(
            *(
                run_remote_probe(
                    ssh_probe_runner(settings, s),
                    [s.name],
                    collective,
                    nprocs=nprocs,
                    python=settings.python,
                    **kwargs,
                )
                for s in specs
            )
        )
    )


# ------------------------------------------------------------------------------------ nccl-tests


def find_nccl_tests(dir: str | None = None, collective: str = "all_reduce") -> str | None:
    """Path of ``<collective>_perf`` in ``dir`` (or ``dir/build``), else on PATH; None if absent."""
    names = (f"{collective}_perf", f"{collective}_perf_mpi")
    if dir:
        for sub in (Path(dir), Path(dir) / "build"):
            for name in names:
                cand = sub / name
                if cand.is_file() and os.access(cand, os.X_OK):
                    return str(cand)
        return None
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


async def run_nccl_tests(
    binary: str,
    *,
    gpus: int = 1,
    min_bytes: int | str = "1M",
    max_bytes: int | str = "1G",
    timeout: float = 300.0,
    iters: int = 20,
    warmup: int = 5,
    topo: Topology | None = None,
) -> ProbeResult:
    """Run nccl-tests on this machine (``-g gpus``, ``-c 0``) and parse its output."""
    argv = [binary, "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(gpus)]
    argv += ["-c", "0", "-n", str(iters), "-w", str(warmup)]
    env = {**os.environ}
    env.setdefault("NCCL_DEBUG", "INFO")  # so the transport classifier has something to read
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    host = socket.gethostname()
    try:
        out, _ = await within(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        await _stop(proc)
        return ProbeResult(
            host=host,
            t=time.time(),
            tool="nccl-tests",
            ok=False,
            error=f"timed out after {timeout:g} s",
        )
    finally:
        if proc.returncode is None:
            await _stop(proc)
    parsed = parse_nccl_tests(out.decode("utf-8", "replace"), collective=_collective_of(binary))
    result = no_bus(parsed.to_probe(host, time.time()))
    if proc.returncode != 0 and result.ok:
        result.ok = False
        result.error = f"{Path(binary).name} exited with code {proc.returncode}"
    if topo is None:
        topo = await local_topology()
    fill_expectation(result, gpu_name=parsed.gpu_name, topo=topo)
    return result


def _collective_of(binary: str) -> str:
    name = Path(binary).name
    return name.split("_perf")[0] if "_perf" in name else "all_reduce"


# --------------------------------------------------------------------------------------- CLI


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``verl-top probe nccl``."""
    parser.add_argument("what", nargs="?", default="nccl", choices=("nccl",))
    parser.add_argument(
        "--hosts",
        default="",
        help="nodes to probe over SSH (comma list, ranges or a hosts file); default this machine",
    )
    parser.add_argument(
        "--scope",
        choices=("intra", "inter"),
        default="intra",
        help="intra: each host alone (default); inter: one run across all --hosts, as many ranks "
        "per host as the host with the fewest GPUs has (nvidia-smi -L over SSH) unless --gpus",
    )
    parser.add_argument(
        "--master-addr",
        default=None,
        help="inter: address the other hosts reach the first one at (default its --hosts name)",
    )
    parser.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    parser.add_argument(
        "--python",
        default="python3",
        help="interpreter with torch on the remote hosts (e.g. a venv's bin/python)",
    )
    parser.add_argument("--gpus", "--nprocs", dest="nprocs", type=int, default=0)
    parser.add_argument("--min-bytes", default="1M")
    parser.add_argument("--max-bytes", default="1G")
    parser.add_argument("--collective", choices=("all_reduce", "all_gather"), default="all_reduce")
    parser.add_argument("--nccl-tests", dest="nccl_tests", default=None, metavar="DIR")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--force", action="store_true", help="probe even if GPUs are busy")
    parser.add_argument("--json", action="store_true", help="print the result record as JSON")
    from verl_top.flags import add_ssh_arguments

    add_ssh_arguments(parser)


async def main_probe(args: argparse.Namespace) -> int:
    """``verl-top probe nccl``: run a probe (here or over SSH) and print it. Exit 0 when ok."""
    from verl_top.sources.hosts import HostsError, is_local, parse_hosts_arg

    specs = []
    if (args.hosts or "").strip():
        try:
            specs = parse_hosts_arg(args.hosts)
        except HostsError as exc:
            print(f"verl-top probe: {exc}", file=sys.stderr)
            return 2
    remote = [s for s in specs if not is_local(s)]
    if remote:
        return await _main_remote(args, specs)
    try:
        parse_size(args.min_bytes)
        parse_size(args.max_bytes)
    except (ValueError, IndexError):
        print(f"verl-top probe: bad size {args.min_bytes!r}/{args.max_bytes!r}", file=sys.stderr)
        return 2
    binary = None
    if args.backend == "nccl" and (args.nccl_tests is not None or find_nccl_tests()):
        binary = find_nccl_tests(args.nccl_tests or None, args.collective)
    if binary is not None:
        result = await run_nccl_tests(
            binary,
            gpus=args.nprocs or _local_gpus(),
            min_bytes=args.min_bytes,
            max_bytes=args.max_bytes,
            timeout=args.timeout,
            iters=args.iters,
            warmup=args.warmup,
        )
    else:
        result = await run_local_probe(args.collective, **_probe_options(args))
    _print_results([result], args.json)
    return 0 if result.ok else 1


def _probe_options(args: argparse.Namespace) -> dict[str, Any]:
    """The torch probe's options from the command line: the same for a local and an SSH run."""
    return {
        "backend": args.backend,
        "nprocs": args.nprocs,
        "min_bytes": args.min_bytes,
        "max_bytes": args.max_bytes,
        "iters": args.iters,
        "warmup": args.warmup,
        "timeout": args.timeout,
        "force": args.force,
    }


def missing_torch(result: ProbeResult, python: str = "", remote: bool = False) -> str:
    """One sentence when the torch probe failed because its interpreter has no PyTorch
    (every rank's error says so), else ''."""
    errors = [e for e in re.split(r";\s*(?=rank \d+:)", result.error or "") if e.strip()]
    if not errors or not all(_NO_TORCH.search(e) for e in errors):
        return ""
    if remote:
        where = ",".join(result.hosts) or result.host
        return (
            f"the NCCL probe needs PyTorch and {python or 'python3'} on {where} cannot import "
            "torch: install it there, or point --python at an interpreter that has it"
        )
    return (
        f"the NCCL probe needs PyTorch and this Python ({python or sys.executable}) cannot "
        "import torch: install it (pip install torch), or give --nccl-tests DIR with "
        "nccl-tests binaries"
    )


_NO_TORCH = re.compile(r"No module named '?torch\b")


def _print_results(results: Sequence[ProbeResult], as_json: bool, remote_python: str = "") -> None:
    for i, result in enumerate(results):
        plain = missing_torch(result, remote_python, remote=bool(remote_python))
        if plain:  # a sentence, not per-rank ModuleNotFoundError lines
            print(f"verl-top probe: {plain}", file=sys.stderr, flush=True)
        if as_json:
            print(json.dumps(protocol.to_dict(result)), flush=True)
        elif not plain:
            print(("\n" if i else "") + format_probe(result), flush=True)


async def _main_remote(args: argparse.Namespace, specs: list[HostSpec]) -> int:
    """``--hosts`` with other machines: probe them over SSH (the torch probe; nccl-tests is
    not started remotely)."""
    from verl_top.flags import ssh_settings
    from verl_top.sources.ssh import RemoteCommandError

    if args.nccl_tests is not None:
        print("verl-top probe: --nccl-tests runs on this machine only", file=sys.stderr)
        return 2
    try:
        parse_size(args.min_bytes)
        parse_size(args.max_bytes)
        settings = ssh_settings(args)
        settings.python = args.python
        settings.shared().load_keys()
    except (ValueError, IndexError) as exc:
        print(f"verl-top probe: {exc}", file=sys.stderr)
        return 2
    options = _probe_options(args)
    try:
        if args.scope == "inter" and args.nprocs <= 0:
            counts = await remote_gpu_counts(specs, settings)
            options["nprocs"], why = ranks_per_node(counts)
            if why:
                print(f"verl-top probe: {why}", file=sys.stderr)
                return 1
            listed = ", ".join(f"{h}: {n}" for h, n in counts.items())
            print(
                f"verl-top probe: {options['nprocs']} rank(s) per node (GPUs: {listed})",
                file=sys.stderr,
            )
        results = await probe_ssh_hosts(
            specs,
            settings,
            args.collective,
            scope=args.scope,
            master_addr=args.master_addr,
            master_port=args.master_port,
            on_progress=_print_progress,  # stderr: --json output stays clean
            **options,
        )
    except RemoteCommandError as exc:  # the GPU count of an unreachable host: named
        print(f"verl-top probe: {exc}", file=sys.stderr)
        return 1
    finally:
        await settings.shared().close()
    _print_results(results, args.json, args.python)
    return 0 if all(r.ok for r in results) else 1


def _print_progress(host: str, text: str) -> None:
    """Progress of a remote probe on stderr (stdout keeps the result)."""
    print(f"verl-top probe: {host}: {text}", file=sys.stderr, flush=True)


def _local_gpus() -> int:
    from verl_top.nccl.torch_probe import gpu_count

    return max(1, gpu_count())


def format_probe(result: ProbeResult) -> str:
    """A plain-text table of a probe, with the large-size peak against the expectation."""
    lines = [
        f"{result.tool} {result.collective}  ranks {result.nranks}  scope {result.scope}  "
        f"hosts {','.join(result.hosts) or result.host}"
        + (f"  transport {result.transport}" if result.transport else "")
    ]
    if not result.ok:
        lines.append(f"FAILED: {result.error}")
    if result.rows:
        lines.append(f"{'size':>10} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
        for r in result.rows:
            lines.append(
                f"{human_size(r.size_bytes):>10} {r.time_us:>12.2f} {r.algbw_gbs:>12.2f} "
                f"{r.busbw_gbs:>12.2f}"
            )
    exp: Expectation | None = None
    if result.expected_gbs:
        exp = Expectation(gbs=result.expected_gbs, link=result.link, source="")
    elif result.link:
        exp = expected_busbw(result.link, result.collective, result.nranks)
    peak = result.busbw_max_gbs
    if peak is not None:
        line = f"busbw max (>= 256 MiB when present): {peak:.2f} GB/s"
        if exp is not None:
            share = ratio(peak, exp)
            line += f"  expected ~{exp.gbs:.0f} GB/s for {exp.link or 'this link'}"
            if share is not None:
                line += f"  ratio {share:.0%}"
            if result.expected_source:
                line += f"\nexpected from: {result.expected_source}"
        elif result.nranks <= 1:
            line += "  (1 rank: no bus, busbw is 0 by definition)"
        else:
            line += "  (no expectation for this link)"
        lines.append(line)
    return "\n".join(lines)


def human_size(n: int) -> str:
    """1048576 -> "1 MiB"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
