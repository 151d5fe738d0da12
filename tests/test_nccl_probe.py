"""The torch probe on CPU with gloo (same code path as NCCL), its cleanup, and the client side."""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from verl_top.nccl import probe as probe_mod
from verl_top.nccl.probe import (
    SCRIPT_PATH,
    ProbeCollector,
    add_probe_arguments,
    find_nccl_tests,
    main_probe,
    probe_command,
    run_local_probe,
    run_remote_probe,
)
from verl_top.nccl.torch_probe import bus_factor, parse_size, sizes_between

torch = pytest.importorskip("torch", reason="torch is installed by .ci/run (CPU build)")

SMALL = ["--backend", "gloo", "--max-bytes", "2M", "--iters", "2", "--warmup", "1"]


def _probe(
    *args: str, stdin: str | None = None, timeout: float = 90
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-u", str(SCRIPT_PATH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_helpers() -> None:
    assert (
        parse_size("4M") == 4 << 20 and parse_size("1GiB") == 1 << 30 and parse_size("512") == 512
    )
    assert sizes_between(1 << 20, 4 << 20) == [1 << 20, 2 << 20, 4 << 20]
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("all_reduce", 1) == 0.0


def test_gloo_three_ranks_both_collectives() -> None:
    proc = _probe(
        *SMALL,
        "--nprocs",
        "3",
        "--collective",
        "all_reduce",
        "--collective",
        "all_gather",
        "--busy-check",
        "none",
    )
    assert proc.returncode == 0, proc.stderr
    recs = _records(proc.stdout)
    assert [r["collective"] for r in recs] == ["all_reduce", "all_gather"]
    for r in recs:
        assert r["v"] == 1 and r["type"] == "probe" and r["tool"] == "torch" and r["ok"]
        assert r["nranks"] == 3 and r["backend"] == "gloo"
        assert [row["size_bytes"] for row in r["rows"]][0] >= (1 << 20) - 12
        factor = 2 * 2 / 3 if r["collective"] == "all_reduce" else 2 / 3
        for row in r["rows"]:
            assert row["time_us"] > 0
            assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor, rel=1e-4)
        assert r["large_fallback"] and r["busbw_max_gbs"] == max(x["busbw_gbs"] for x in r["rows"])


def test_script_runs_from_stdin_like_over_ssh() -> None:
    argv, script = probe_command(
        sys.executable,
        backend="gloo",
        nprocs=2,
        max_bytes="1M",
        iters=1,
        warmup=0,
        busy_check="none",
    )
    assert argv[1:3] == ["-u", "-c"] and argv[-1] == "--stdin-eof-cancel"
    script = script.split("\n", 1)[1]  # the payload: "<byte count>\n<script>"
    imported = set()
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    # Self-contained: stdlib, torch (workers) and optional pynvml only.
    assert "verl_top" not in imported
    assert imported - {"torch", "pynvml", "__future__"} <= set(sys.stdlib_module_names)
    # As over SSH: the payload on stdin, which stays open while the probe runs.
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(probe_mod.probe_payload())
    proc.stdin.flush()
    out = proc.stdout.read()
    proc.stdin.close()
    assert proc.wait(timeout=90) == 0
    assert _records(out)[0]["ok"]


def test_timeout_kills_ranks_and_reports() -> None:
    # World size 3 with 2 local ranks: the third never comes, rendezvous waits, timeout fires.
    start = time.monotonic()
    proc = _probe(
        *SMALL, "--nprocs", "2", "--world-size", "3", "--timeout", "3", "--busy-check", "none"
    )
    assert proc.returncode == 124
    recs = _records(proc.stdout)  # one per requested collective (default: all_reduce, all_gather)
    assert recs and all(not r["ok"] and r["error"] == "timed out after 3 s" for r in recs)
    assert time.monotonic() - start < 30


def test_sigterm_cancels_and_leaves_no_process() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(SCRIPT_PATH),
            *SMALL,
            "--nprocs",
            "2",
            "--world-size",
            "3",
            "--timeout",
            "60",
            "--busy-check",
            "none",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 20
    while len(launcher.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    kids = [c.pid for c in launcher.children(recursive=True)]
    assert len(kids) >= 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert "cancelled" in _records(out)[0]["error"]
    assert _gone(kids)


def test_stdin_eof_cancels() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(SCRIPT_PATH),
            *SMALL,
            "--nprocs",
            "2",
            "--world-size",
            "3",
            "--timeout",
            "60",
            "--busy-check",
            "none",
            "--stdin-eof-cancel",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 20
    while len(launcher.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    kids = [c.pid for c in launcher.children(recursive=True)]
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.stdout is not None
    out = proc.stdout.read()
    assert proc.wait(timeout=20) == 130 and "stdin closed" in out
    assert _gone(kids)


def _fake_smi(tmp_path: Path) -> dict[str, str]:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '4242, python3, 70000, 00000000:1B:00.0'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_refuses_busy_gpus_unless_forced(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path)
    args = [
        sys.executable,
        "-u",
        str(SCRIPT_PATH),
        *SMALL,
        "--nprocs",
        "2",
        "--busy-check",
        "nvidia-smi",
    ]
    busy = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert busy.returncode == 3
    rec = _records(busy.stdout)[0]
    assert not rec["ok"] and "GPUs busy" in rec["error"] and "pid 4242" in rec["error"]
    forced = subprocess.run([*args, "--force"], capture_output=True, text=True, env=env, timeout=90)
    assert forced.returncode == 0 and _records(forced.stdout)[0]["ok"]


async def test_run_local_probe_gloo() -> None:
    res = await run_local_probe(
        "all_reduce", backend="gloo", nprocs=2, max_bytes="4M", iters=2, warmup=1, busy_check="none"
    )
    assert res.ok and res.tool == "torch" and res.nranks == 2
    assert [r.size_bytes for r in res.rows] == [1 << 20, 2 << 20, 4 << 20]
    assert res.busbw_max_gbs == max(r.busbw_gbs for r in res.rows)
    assert res.expected_gbs is None  # CPU/gloo: no link to expect anything of


async def test_run_local_probe_cancel_kills_group() -> None:
    pids: list[int] = []
    task = asyncio.create_task(
        run_local_probe(
            backend="gloo",
            nprocs=2,
            timeout=60,
            busy_check="none",
            on_start=pids.append,
            max_bytes="1M",
        )
    )
    # Never finishes: replace nothing, but cancel after the workers exist.
    deadline = time.monotonic() + 20
    kids: list[int] = []
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if pids:
            try:
                kids = [c.pid for c in psutil.Process(pids[0]).children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            if len(kids) >= 2:
                break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pids and _gone([pids[0], *kids])


async def test_run_local_probe_single_rank() -> None:
    res = await run_local_probe(
        backend="gloo", nprocs=1, timeout=60, busy_check="none", max_bytes="1M", iters=1
    )
    # One rank: no bus, busbw 0 by definition (as nccl-tests prints for -g 1).
    assert res.ok and res.nranks == 1 and all(r.busbw_gbs == 0 for r in res.rows)


async def test_remote_probe_two_launchers_rendezvous() -> None:
    """Two 'nodes' on localhost through a fake transport: rank offsets and one result."""
    port = 29000 + os.getpid() % 1000

    async def run(argv: list[str], stdin_text: str) -> AsyncIterator[str]:
        argv = [sys.executable if a == "python3" else a for a in argv]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin_text.encode())  # stdin stays open: EOF would cancel the probe
        while line := await proc.stdout.readline():
            yield line.decode()
        proc.stdin.close()
        await proc.wait()

    res = await asyncio.wait_for(
        run_remote_probe(
            run,
            ["n1", "n2"],
            nprocs=1,
            master_port=port,
            master_addr="127.0.0.1",
            backend="gloo",
            max_bytes="1M",
            iters=1,
            warmup=0,
            busy_check="none",
        ),
        60,
    )
    assert res.ok and res.nranks == 2 and res.scope == "inter" and res.host == "n1"
    assert res.hosts == ["n1", "n2"]


def test_collector_reads_records_and_nccl_lines() -> None:
    c = ProbeCollector()
    c.feed("vm:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/3")
    c.feed(
        '{"v":1,"type":"probe","host":"a","t":1,"tool":"torch","collective":"all_reduce","nranks":16,"scope":"inter","rows":[],"gpu_name":"NVIDIA H200"}'
    )
    res = c.finish("all_reduce", "a")
    assert res.transport == "Socket" and res.link == "socket"
    assert res.expected_source.startswith("with RDMA: assumed")
    missing = ProbeCollector().finish("all_gather", "a")
    assert not missing.ok and missing.error


def test_find_nccl_tests(tmp_path: Path) -> None:
    assert find_nccl_tests(str(tmp_path)) is None
    exe = tmp_path / "build" / "all_reduce_perf"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert find_nccl_tests(str(tmp_path)) == str(exe)


async def test_run_nccl_tests_parses_fake_binary(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "nccl" / "all_reduce_perf_g1.txt"
    exe = tmp_path / "all_reduce_perf"
    exe.write_text(f"#!/bin/sh\ncat '{fixture}'\n")
    exe.chmod(0o755)
    res = await probe_mod.run_nccl_tests(str(exe), gpus=1, timeout=30)
    assert res.ok and res.tool == "nccl-tests" and len(res.rows) == 14 and res.nranks == 1


async def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_probe_arguments(parser)
    args = parser.parse_args(
        [
            "nccl",
            "--backend",
            "gloo",
            "--gpus",
            "2",
            "--max-bytes",
            "1M",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--json",
            "--force",
        ]
    )
    assert await main_probe(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["type"] == "probe" and data["ok"] and data["nranks"] == 2
    args = parser.parse_args(
        ["nccl", "--backend", "gloo", "--gpus", "2", "--max-bytes", "1M", "--iters", "1", "--force"]
    )
    assert await main_probe(args) == 0
    assert "busbw max" in capsys.readouterr().out
    bad = parser.parse_args(["nccl", "--hosts", "far-away-node", "--scope", "inter"])
    # No --gpus: the GPU count is asked of each node over SSH; an unreachable one is named.
    assert await main_probe(bad) == 1
    assert "far-away-node" in capsys.readouterr().err
