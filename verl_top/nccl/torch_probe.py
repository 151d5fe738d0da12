"""verl-top built-in collective bandwidth probe (PyTorch, NCCL or gloo).

SELF-CONTAINED: imports only the standard library at start, and torch inside the worker
processes. verl-top sends this file to nodes over SSH (``python3 -u - ARGS`` with the script on
stdin), so it must not import verl_top. Python >= 3.8.

One launcher per node forks one worker per local rank (``--nprocs``); workers rendezvous over
TCP at ``--master-addr:--master-port`` (the first node). Rank 0's launcher prints one verl-top
``probe`` record per collective as an NDJSON line on stdout; every failure also prints a record
with ``ok: false``. Method (gpu_comm.md §3, after nccl-tests' ``BenchTime``): warmup, barrier,
time ``iters`` back-to-back calls (CUDA events on GPU, perf_counter on CPU), take the MAX time
across ranks, ``algbw = S / t``, ``busbw = algbw * factor`` (all_reduce 2(n-1)/n; all_gather and
reduce_scatter (n-1)/n with S the total size).

Exit codes: 0 ok, 1 failed, 2 usage, 3 GPUs busy (refused), 124 timed out, 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait

PROTOCOL_VERSION = 1
LARGE_SIZE_BYTES = 256 << 20
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUSY, EXIT_TIMEOUT, EXIT_CANCELLED = 0, 1, 2, 3, 124, 130
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class Cancelled(Exception):
    """Raised in the launcher by SIGTERM/SIGINT/SIGHUP or stdin EOF."""


def parse_size(text: str) -> int:
    """``"4M"``, ``"1GiB"``, ``"1048576"`` -> bytes (K/M/G are powers of 1024, as nccl-tests)."""
    s = str(text).strip().upper().replace("IB", "").rstrip("B") or "0"
    unit = s[-1] if s[-1] in _UNITS else ""
    number = s[: -len(unit)] if unit else s
    return int(float(number) * _UNITS[unit])


def sizes_between(min_bytes: int, max_bytes: int) -> list:
    """Powers-of-two sweep from ``min_bytes`` up to and including ``max_bytes``."""
    sizes = []
    size = max(1, min_bytes)
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    if not sizes or sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw factor (doc/PERFORMANCE.md; ``*GetBw`` in src/*.cu)."""
    if nranks <= 1:
        return 0.0
    if collective == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    return (nranks - 1) / nranks


def _sig(x: float) -> float:
    """``x`` to 6 significant digits (keeps small CPU bandwidths exact enough to check)."""
    return float(f"{x:.6g}")


def peak_busbw(rows: list) -> tuple:
    """(max busbw over sizes >= 256 MiB, fell back to all sizes) over row dicts."""
    large = [r["busbw_gbs"] for r in rows if r["size_bytes"] >= LARGE_SIZE_BYTES]
    if large:
        return max(large), False
    if rows:
        return max(r["busbw_gbs"] for r in rows), True
    return None, False


# ------------------------------------------------------------------------------------ busy check


def _nvml_processes() -> list:
    import pynvml  # noqa: PLC0415 - optional, only where the driver is present

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = proc.usedGpuMemory
                out.append(
                    {"pid": int(proc.pid), "gpu": i, "used_mib": used / 2**20 if used else None}
                )
        return out
    finally:
        pynvml.nvmlShutdown()


def _smi_processes() -> list:
    cmd = [
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
        "--format=csv,noheader,nounits",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return []  # no nvidia-smi: no NVIDIA GPU to be busy
    if proc.returncode != 0:
        return []
    out = []
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            out.append({"pid": int(cells[0]), "name": cells[1], "gpu": cells[-1]})
    return out


def busy_gpu_processes(method: str = "auto") -> list:
    """Compute processes on this node's GPUs (not this probe's), via pynvml or nvidia-smi."""
    procs: list = []
    if method in ("auto", "nvml"):
        try:
            procs = _nvml_processes()
            method = "done"
        except Exception:  # no pynvml or no driver: try nvidia-smi
            if method == "nvml":
                return []
    if method in ("auto", "nvidia-smi"):
        procs = _smi_processes()
    mine = {os.getpid()}
    return [p for p in procs if p["pid"] not in mine]


def gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------- worker


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the launcher dies, so no rank outlives it."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _time_collective(dist, torch, collective, size, n, device, iters, warmup):
    """Seconds per call (max across ranks) and the byte count S the call moves."""
    elt = 4
    if collective == "all_reduce":
        numel = max(1, size // elt)
        x = torch.ones(numel, dtype=torch.float32, device=device)
        nbytes = numel * elt

        def op():
            dist.all_reduce(x)

    else:
        chunk = max(1, size // elt // n)
        nbytes = chunk * elt * n
        small = torch.ones(chunk, dtype=torch.float32, device=device)
        big = torch.empty(chunk * n, dtype=torch.float32, device=device)
        parts = list(big.chunk(n))
        if collective == "all_gather":
            fused = getattr(dist, "all_gather_into_tensor", None)

            def op():
                if fused is not None and device != "cpu":
                    fused(big, small)
                else:
                    dist.all_gather(parts, small)

        else:
            fused = getattr(dist, "reduce_scatter_tensor", None)

            def op():
                if fused is not None and device != "cpu":
                    fused(small, big)
                else:
                    dist.reduce_scatter(small, parts)

    for _ in range(warmup):
        op()
    if device != "cpu":
        torch.cuda.synchronize()
    dist.barrier()
    if device != "cpu":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        per_call = start.elapsed_time(end) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        per_call = (time.perf_counter() - t0) / iters
    t = torch.tensor([per_call], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank defines the collective
    return float(t.item()), nbytes


def worker(local_rank: int, cfg: dict, conn) -> None:
    """One rank: init the process group, sweep sizes, send rank 0's rows to the launcher."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _die_with_parent()
    rank = cfg["rank_offset"] + local_rank
    os.environ.update(
        {
            "MASTER_ADDR": cfg["master_addr"],
            "MASTER_PORT": str(cfg["master_port"]),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(cfg["world_size"]),
        }
    )
    try:
        import datetime

        import torch
        import torch.distributed as dist

        device = "cpu"
        gpu_name = ""
        if cfg["backend"] == "nccl":
            torch.cuda.set_device(local_rank)
            device = "cuda"
            gpu_name = torch.cuda.get_device_name(local_rank)
        dist.init_process_group(
            cfg["backend"],
            init_method="env://",
            rank=rank,
            world_size=cfg["world_size"],
            timeout=datetime.timedelta(seconds=cfg["pg_timeout"]),
        )
        n = dist.get_world_size()
        hosts: list = [None] * n
        dist.all_gather_object(hosts, socket.gethostname())
        for collective in cfg["collectives"]:
            rows = []
            for size in cfg["sizes"]:
                per_call, nbytes = _time_collective(
                    dist, torch, collective, size, n, device, cfg["iters"], cfg["warmup"]
                )
                algbw = nbytes / per_call / 1e9 if per_call > 0 else 0.0
                rows.append(
                    {
                        "size_bytes": nbytes,
                        "time_us": _sig(per_call * 1e6),
                        "algbw_gbs": _sig(algbw),
                        "busbw_gbs": _sig(algbw * bus_factor(collective, n)),
                    }
                )
                if rank == 0:  # one progress line per size (the launcher prints it)
                    conn.send(
                        {
                            "kind": "progress",
                            "collective": collective,
                            "done": len(rows),
                            "total": len(cfg["sizes"]),
                            "size_bytes": nbytes,
                            "busbw_gbs": rows[-1]["busbw_gbs"],
                        }
                    )
            if rank == 0:
                conn.send(
                    {
                        "kind": "result",
                        "collective": collective,
                        "rows": rows,
                        "hosts": list(dict.fromkeys(hosts)),
                        "gpus_per_host": {h: hosts.count(h) for h in dict.fromkeys(hosts)},
                        "nranks": n,
                        "gpu_name": gpu_name,
                    }
                )
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # report everything, the launcher decides
        try:
            conn.send({"kind": "error", "rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(EXIT_FAILED)
    conn.send({"kind": "done", "rank": rank})


# -------------------------------------------------------------------------------------- launcher


def _record(args, collective: str, **fields) -> dict:
    rec = {
        "v": PROTOCOL_VERSION,
        "type": "probe",
        "host": args.host,
        "t": time.time(),
        "tool": "torch",
        "collective": collective,
        "scope": "intra",
        "hosts": [args.host],
        "nranks": args.world_size,
        "rows": [],
        "transport": "",
        "ok": True,
        "error": "",
        "backend": args.backend,
    }
    rec.update(fields)
    return rec


def _emit(rec: dict) -> None:
    try:
        sys.stdout.write(json.dumps(rec, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError as exc:  # the client went away
        raise Cancelled("stdout closed") from exc


PROGRESS_PREFIX = "verl-top-probe progress "


def _progress(msg: dict) -> None:
    """A plain progress line: ``verl-top-probe progress all_reduce 3/11 4194304 B 12.3 GB/s``."""
    try:
        sys.stdout.write(
            f"{PROGRESS_PREFIX}{msg['collective']} {msg['done']}/{msg['total']} "
            f"{msg['size_bytes']} B {msg['busbw_gbs']} GB/s\n"
        )
        sys.stdout.flush()
    except BrokenPipeError as exc:
        raise Cancelled("stdout closed") from exc


def _fail_all(args, error: str, done: set) -> None:
    """One ok=false record per collective not yet reported (rank-0 launcher or any refusal)."""
    for collective in args.collectives:
        if collective not in done:
            try:
                _emit(_record(args, collective, ok=False, error=error))
            except Cancelled:
                return


def _kill_workers(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.join(timeout=5)


def _on_signal(signum, frame) -> None:
    raise Cancelled(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line."""
    p = argparse.ArgumentParser(prog="torch_probe", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--nprocs", "--gpus", type=int, default=0, help="local ranks (default: GPUs)")
    p.add_argument(
        "--collective",
        action="append",
        choices=COLLECTIVES,
        help="repeatable; default all_reduce and all_gather",
    )
    p.add_argument("--min-bytes", default="1M")
    p.add_argument("--max-bytes", default="1G")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole probe")
    p.add_argument("--force", action="store_true", help="probe even when GPUs are busy")
    p.add_argument("--busy-check", choices=("auto", "nvml", "nvidia-smi", "none"), default="auto")
    p.add_argument("--rank-offset", type=int, default=0, help="global rank of local rank 0")
    p.add_argument("--world-size", type=int, default=0, help="all ranks of all nodes")
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0, help="required across nodes")
    p.add_argument("--host", default="", help="name to report (default: hostname)")
    p.add_argument("--nccl-debug", action="store_true", help="NCCL_DEBUG=INFO to stderr")
    p.add_argument(
        "--stdin-eof-cancel",
        action="store_true",
        help="cancel when stdin closes (not with 'python3 -' where stdin holds the script)",
    )
    return p


def main(argv: list | None = None) -> int:
    """Run the probe; see the module docstring."""
    args = build_parser().parse_args(argv)
    args.host = args.host or socket.gethostname()
    args.collectives = args.collective or ["all_reduce", "all_gather"]
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), _on_signal)
    done: set = set()
    procs: list = []
    try:
        return _launch(args, procs, done)
    except Cancelled as exc:
        _kill_workers(procs)
        _fail_all(args, f"cancelled ({exc})", done)
        return EXIT_CANCELLED


def _launch(args, procs: list, done: set) -> int:
    try:
        sizes = sizes_between(parse_size(args.min_bytes), parse_size(args.max_bytes))
    except (ValueError, IndexError):
        sys.stderr.write(f"bad size: {args.min_bytes!r} / {args.max_bytes!r}\n")
        return EXIT_USAGE
    leader = args.rank_offset == 0
    if not args.force and args.busy_check != "none":
        busy = busy_gpu_processes(args.busy_check)
        if busy:
            pids = ", ".join(f"pid {p['pid']} on GPU {p.get('gpu', '?')}" for p in busy[:8])
            args.world_size = args.world_size or args.nprocs
            _fail_all(args, f"GPUs busy ({pids}); probing would disturb them; use --force", done)
            return EXIT_BUSY
    have = gpu_count() if args.backend == "nccl" else None
    nprocs = args.nprocs or (have if have is not None else 2)
    if nprocs <= 0 or have == 0:
        args.world_size = args.world_size or 0
        _fail_all(args, "no GPU found; use --backend gloo for a CPU probe", done)
        return EXIT_FAILED
    if have is not None and nprocs > have:
        # A rank per GPU: more ranks than GPUs would fail deep inside CUDA, less clearly.
        args.world_size = args.world_size or nprocs
        _fail_all(args, f"{nprocs} ranks asked for but only {have} GPU(s) here", done)
        return EXIT_FAILED
    args.world_size = args.world_size or (args.rank_offset + nprocs)
    port = args.master_port or free_port()
    if args.backend == "nccl" and args.nccl_debug:
        os.environ.setdefault("NCCL_DEBUG", "INFO")
    if args.master_addr.startswith("127.") or args.master_addr == "localhost":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cfg = {
        "backend": args.backend,
        "rank_offset": args.rank_offset,
        "world_size": args.world_size,
        "master_addr": args.master_addr,
        "master_port": port,
        "collectives": args.collectives,
        "sizes": sizes,
        "iters": max(1, args.iters),
        "warmup": max(0, args.warmup),
        "pg_timeout": max(30.0, args.timeout),
    }
    ctx = multiprocessing.get_context("fork")  # works when this script was read from stdin
    readers: list[Connection] = []
    for local_rank in range(nprocs):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=worker, args=(local_rank, cfg, send), daemon=False)
        proc.start()
        send.close()
        procs.append(proc)
        readers.append(recv)
    return _supervise(args, procs, readers, done, leader)


def _supervise(args, procs: list, readers: list[Connection], done: set, leader: bool) -> int:
    deadline = time.monotonic() + args.timeout
    stdin_fd = sys.stdin.fileno() if args.stdin_eof_cancel and sys.stdin else None
    errors: list = []
    finished = 0
    open_readers = list(readers)
    while finished < len(procs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_workers(procs)
            if leader:
                _fail_all(args, f"timed out after {args.timeout:g} s", done)
            return EXIT_TIMEOUT
        waitables = list(open_readers) + ([stdin_fd] if stdin_fd is not None else [])
        for ready in mp_wait(waitables, timeout=min(remaining, 0.5)):
            if isinstance(ready, int):  # stdin's fd, the one waitable that is no reader
                if not os.read(ready, 4096):
                    raise Cancelled("stdin closed")
                continue
            assert isinstance(ready, Connection)  # wait() returns what it was given
            try:
                msg = ready.recv()
            except EOFError:
                open_readers.remove(ready)
                continue
            if msg["kind"] == "result":
                _emit(_result_record(args, msg))
                done.add(msg["collective"])
            elif msg["kind"] == "progress":
                _progress(msg)
            elif msg["kind"] == "error":
                errors.append(f"rank {msg['rank']}: {msg['error']}")
            elif msg["kind"] == "done":
                finished += 1
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead or (errors and not open_readers):
            # One rank gone means the others wait forever in the next collective.
            _kill_workers(procs)
            why = "; ".join(errors) or f"worker exited with code {dead[0].exitcode}"
            if leader:
                _fail_all(args, why[:1000], done)
            else:
                sys.stderr.write(why + "\n")
            return EXIT_FAILED
        if not open_readers and finished < len(procs):
            break
    for p in procs:
        p.join(timeout=10)
    return EXIT_OK


def _result_record(args, msg: dict) -> dict:
    peak, fallback = peak_busbw(msg["rows"])
    hosts = msg["hosts"] or [args.host]
    return _record(
        args,
        msg["collective"],
        scope="inter" if len(hosts) > 1 else "intra",
        hosts=hosts,
        nranks=msg["nranks"],
        rows=msg["rows"],
        busbw_max_gbs=peak,
        large_fallback=fallback,
        gpu_name=msg["gpu_name"],
        gpus_per_host=msg.get("gpus_per_host") or None,
    )


if __name__ == "__main__":
    sys.exit(main())
