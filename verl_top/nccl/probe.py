"""Client side of the bandwidth probes: run them, parse them, compare with the expected table.

Two tools: nccl-tests (``all_reduce_perf`` ...) when installed, else the built-in torch probe
(``torch_probe.py``, self-contained). Probes run only when the user asks, and the torch probe
refuses GPUs that already run compute processes unless ``force``.

Transport-agnostic remote runs: :func:`run_remote_probe` takes a ``run(argv, stdin_text)``
callable returning an async iterator of output lines (the SSH source provides one), and
:func:`probe_command` builds the argv (``python3 -u - ARGS`` with the script on stdin).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from verl_top import protocol
from verl_top.model import ProbeResult
from verl_top.nccl.expected import Expectation, expected_busbw, fill_expectation, ratio
from verl_top.nccl.parse import NcclLogState, parse_nccl_tests
from verl_top.nccl.topo import Topology, parse_topo
from verl_top.nccl.torch_probe import parse_size

SCRIPT_PATH = Path(__file__).with_name("torch_probe.py")
RunFn = Callable[[list[str], str], AsyncIterator[str]]
_KILL_GRACE_S = 3.0


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


def probe_command(python: str = "python3", **kwargs: object) -> tuple[list[str], str]:
    """(remote argv, stdin text): ``python3 -u - ARGS`` reading the script from stdin."""
    return [python, "-u", "-", *probe_args(**kwargs)], probe_script()  # type: ignore[arg-type]


class ProbeCollector:
    """Turns probe output lines into ProbeResults; NCCL INFO lines feed the transport classifier."""

    def __init__(self) -> None:
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
                result, gpu_name=self.gpu_names.get(collective, ""), topo=topo, nics=nics
            )
        return result


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
            await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
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
    sink = ProbeCollector()
    error = ""
    try:
        # The launcher enforces `timeout` itself; the margin covers interpreter start-up.
        await asyncio.wait_for(
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
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, asyncio.TimeoutError):
        return None
    topo = parse_topo(out.decode("utf-8", "replace"))
    return topo if topo.devices else None


async def run_remote_probe(
    run: RunFn,
    hosts: Sequence[str],
    collective: str = "all_reduce",
    *,
    nprocs: int,
    master_port: int = 29533,
    master_addr: str | None = None,
    python: str = "python3",
    nics: int | None = None,
    **kwargs: object,
) -> ProbeResult:
    """Probe across ``hosts``: one launcher per host, ``nprocs`` ranks each, rank 0 on hosts[0].

    ``run(argv, stdin_text)`` starts ``argv`` on the host it was made for and yields output lines;
    pass a mapping-aware callable by binding it per host, e.g. ``run=lambda argv, s: ...``. Here
    ``run`` receives argv whose ``--host`` names the target host.
    """
    world = nprocs * len(hosts)
    addr = master_addr or hosts[0]
    sinks = [ProbeCollector() for _ in hosts]

    async def one(i: int, host: str) -> None:
        argv, stdin_text = probe_command(
            python,
            nprocs=nprocs,
            collectives=(collective,),
            rank_offset=i * nprocs,
            world_size=world,
            master_addr=addr,
            master_port=master_port,
            host=host,
            **kwargs,
        )
        async for line in run(argv, stdin_text):
            sinks[i].feed(line)

    await asyncio.gather(*(one(i, h) for i, h in enumerate(hosts)))
    head = sinks[0]
    for sink in sinks[1:]:  # transport lines may come from any node
        for key, gdr in sink.log.net_via.items():
            head.log.net_via[key] = head.log.net_via.get(key, False) or gdr
        if not head.log.nnodes and sink.log.nnodes:
            head.log.nnodes = sink.log.nnodes
    errors = [s.other[-1] for s in sinks[1:] if s.results and not s.results[-1].ok]
    result = head.finish(collective, hosts[0], nics=nics, error="; ".join(errors))
    if len(hosts) > 1:
        result.scope = "inter"
    return result


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
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
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
    parser.add_argument("--hosts", default="", help="comma list; only this machine is supported")
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


_LOCAL_NAMES = ("", "localhost", "127.0.0.1")


async def main_probe(args: argparse.Namespace) -> int:
    """``verl-top probe nccl``: run a probe on this machine and print it. Exit 0 when ok."""
    hosts = [h.strip() for h in (args.hosts or "").split(",") if h.strip()]
    me = socket.gethostname()
    if any(h not in (*_LOCAL_NAMES, me) for h in hosts):
        print(
            "verl-top probe: remote hosts are probed from the TUI (SSH); this command probes "
            "this machine only",
            file=sys.stderr,
        )
        return 2
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
        result = await run_local_probe(
            args.collective,
            backend=args.backend,
            nprocs=args.nprocs,
            min_bytes=args.min_bytes,
            max_bytes=args.max_bytes,
            iters=args.iters,
            warmup=args.warmup,
            timeout=args.timeout,
            force=args.force,
        )
    if args.json:
        print(json.dumps(protocol.to_dict(result)))
    else:
        print(format_probe(result))
    return 0 if result.ok else 1


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
    if result.link:
        exp = expected_busbw(result.link, result.collective, result.nranks)
    peak = result.busbw_max_gbs
    if peak is not None:
        line = f"busbw max (>= 256 MiB when present): {peak:.2f} GB/s"
        if exp is not None:
            r = ratio(peak, exp)
            line += f"  expected ~{exp.gbs:.0f} GB/s for {exp.link}"
            if r is not None:
                line += f"  ratio {r:.0%}"
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
