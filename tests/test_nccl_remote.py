"""NCCL probes on remote nodes over the real test sshd (gloo on CPU, 2 ranks per "node").

Every test also checks the promise that matters most: no probe process outlives the client.
Processes are found by the ``verl-top-probe`` marker of the bootstrap plus the host name the
launcher was given (``--host 127.0.0.X:PORT``, unique per daemon), and by the daemon's own
session processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sshd import SshDaemon, SshdFactory, free_port, gone, make_settings, spec_for

from verl_top.nccl.probe import probe_ssh_hosts
from verl_top.sources.ssh import RemoteCommandError, run_remote

pytest.importorskip("torch", reason="torch is installed by .ci/run (CPU build)")
pytestmark = [pytest.mark.sshd, pytest.mark.timeout(120)]

SMALL = dict(backend="gloo", max_bytes="4M", iters=2, warmup=1, busy_check="none")
MARKER = "verl-top-probe"


def probe_pids(host: str) -> list[int]:
    """Live (non-zombie) probe processes started for ``host``."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if MARKER in cmd and host in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


@contextlib.asynccontextmanager
async def watching(host: str) -> Iterator[set[int]]:
    """Collect every probe pid seen for ``host`` while the block runs."""
    seen: set[int] = set()

    async def loop() -> None:
        while True:
            seen.update(probe_pids(host))
            await asyncio.sleep(0.1)

    task = asyncio.create_task(loop())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def nothing_left(d: SshDaemon, seen: set[int], within: float = 10.0) -> None:
    assert await gone(list(seen), within), f"probe processes left on {d.name}"
    assert not probe_pids(d.name)
    assert await gone(d.session_pids(), within), "sshd session processes left"


def _settings(tmp_path: Path, ssh_keys, daemons: list[SshDaemon]):  # noqa: ANN001, ANN202
    return make_settings(tmp_path, ssh_keys, daemons, sys.executable)


async def test_run_remote_streams_and_raises_for_unknown_host_key(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d = sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d])
    lines = [
        line
        async for line in run_remote(
            settings, spec_for(d), "cat; echo err >&2", "a\nb\n", close_stdin=True
        )
    ]
    assert lines == ["a", "b", "err"]
    Path(settings.known_hosts).write_text("")
    with pytest.raises(RemoteCommandError) as info:
        async for _ in run_remote(settings, spec_for(d), "true"):
            pass
    assert info.value.host == d.name and "known_hosts" in info.value.reason


async def test_intra_node_probe_on_one_host(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d = sshd_pool.start()
    async with watching(d.name) as seen:
        [res] = await probe_ssh_hosts(
            [spec_for(d)], _settings(tmp_path, ssh_keys, [d]), nprocs=2, timeout=60, **SMALL
        )
    assert res.ok, res.error
    assert res.tool == "torch" and res.scope == "intra" and res.nranks == 2
    assert res.host == d.name and res.hosts == [d.name]
    assert [r.size_bytes for r in res.rows] == [1 << 20, 2 << 20, 4 << 20]
    for row in res.rows:  # all_reduce over 2 ranks: busbw = algbw * 2(n-1)/n = algbw
        assert row.busbw_gbs > 0 and row.busbw_gbs == pytest.approx(row.algbw_gbs, rel=1e-4)
    assert res.busbw_max_gbs == max(r.busbw_gbs for r in res.rows)
    assert len(seen) >= 3  # launcher + 2 ranks really ran there
    await nothing_left(d, seen)


async def test_cross_node_probe_two_hosts_world_four(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d1, d2 = sshd_pool.start(), sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d1, d2])
    async with watching(d1.name) as seen1, watching(d2.name) as seen2:
        [res] = await probe_ssh_hosts(
            [spec_for(d1), spec_for(d2)],
            settings,
            scope="inter",
            nprocs=2,
            master_port=free_port(d1.addr),
            timeout=60,
            **SMALL,
        )
    assert res.ok, res.error
    assert res.nranks == 4 and res.scope == "inter" and res.hosts == [d1.name, d2.name]
    for row in res.rows:  # 4 ranks: busbw = algbw * 2*3/4
        assert row.busbw_gbs == pytest.approx(row.algbw_gbs * 1.5, rel=1e-4)
    assert len(seen1) >= 3 and len(seen2) >= 3
    await nothing_left(d1, seen1)
    await nothing_left(d2, seen2)


async def test_timeout_reports_and_leaves_no_process(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d = sshd_pool.start()
    t0 = time.monotonic()
    async with watching(d.name) as seen:
        [res] = await probe_ssh_hosts(
            [spec_for(d)],
            _settings(tmp_path, ssh_keys, [d]),
            nprocs=2,
            timeout=2,
            **{**SMALL, "iters": 10**9},
        )
    assert not res.ok and "timed out after 2 s" in res.error
    assert time.monotonic() - t0 < 30
    assert len(seen) >= 3
    await nothing_left(d, seen)


async def test_cancelling_the_client_leaves_no_process(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d = sshd_pool.start()
    async with watching(d.name) as seen:
        task = asyncio.create_task(
            probe_ssh_hosts(
                [spec_for(d)],
                _settings(tmp_path, ssh_keys, [d]),
                nprocs=2,
                timeout=120,
                **{**SMALL, "iters": 10**9},
            )
        )
        deadline = time.monotonic() + 30
        while len(probe_pids(d.name)) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(probe_pids(d.name)) >= 3, "probe never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await nothing_left(d, seen)


async def test_unreachable_host_is_named_and_others_still_probed(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    good, bad = sshd_pool.start(), sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [good])  # bad's host key is not known
    async with watching(good.name) as seen:
        ok, failed = await probe_ssh_hosts(
            [spec_for(good), spec_for(bad)], settings, nprocs=2, timeout=60, **SMALL
        )
    assert ok.ok and ok.host == good.name
    assert not failed.ok and failed.host == bad.name
    assert failed.error.startswith(f"{bad.name}: host key not in known_hosts")
    await nothing_left(good, seen)

    # Across nodes the run stops at once (the first host must not wait for rank 2 till timeout).
    t0 = time.monotonic()
    async with watching(good.name) as seen:
        [res] = await probe_ssh_hosts(
            [spec_for(good), spec_for(bad)],
            settings,
            scope="inter",
            nprocs=2,
            master_port=free_port(good.addr),
            timeout=60,
            **SMALL,
        )
    assert not res.ok and f"{bad.name}: host key not in known_hosts" in res.error
    assert time.monotonic() - t0 < 20
    await nothing_left(good, seen)


def test_cli_killed_hard_leaves_no_remote_process(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    """SIGKILL of the client: sshd closes the probe's stdin, and the probe stops itself."""
    d = sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d])
    argv = [sys.executable, "-m", "verl_top", "probe", "nccl", "--hosts", d.name, "--gpus", "2"]
    argv += ["--backend", "gloo", "--max-bytes", "1M", "--iters", str(10**9), "--timeout", "120"]
    argv += ["--ssh-config", settings.ssh_config, "-i", settings.identities[0]]
    argv += ["--known-hosts", settings.known_hosts, "--python", sys.executable]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while len(probe_pids(d.name)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = probe_pids(d.name)
        assert len(seen) >= 3, proc.stderr.read().decode() if proc.poll() is not None else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert asyncio.run(gone(seen, 10)), "probe outlived its killed client"
    assert not probe_pids(d.name)


def test_cli_probes_remote_host_json(tmp_path: Path, ssh_keys, sshd_pool: SshdFactory) -> None:
    d = sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d])
    argv = [sys.executable, "-m", "verl_top", "probe", "nccl", "--hosts", d.name, "--gpus", "2"]
    argv += ["--backend", "gloo", "--max-bytes", "1M", "--iters", "1", "--json", "--timeout", "60"]
    argv += ["--ssh-config", settings.ssh_config, "-i", settings.identities[0]]
    argv += ["--known-hosts", settings.known_hosts, "--python", sys.executable]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    [rec] = [json.loads(line) for line in out.stdout.splitlines()]
    assert rec["ok"] and rec["hosts"] == [d.name] and rec["nranks"] == 2
    # --scope inter without --gpus counts the node's GPUs over SSH (nvidia-smi -L): none here.
    no_gpus = [a for a in argv if a not in ("--gpus", "2")]
    bad = subprocess.run([*no_gpus, "--scope", "inter"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and f"no GPU on {d.name}" in bad.stderr


async def test_probe_key_runner_probes_ssh_hosts(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    """Key p's runner goes over the SSH source's own settings; no GPU here, so the remote
    probe answers "no GPU found" for that host (the NCCL backend needs one)."""
    from verl_top.sources.ssh import SshSource
    from verl_top.ui.probe_screen import ProbePlan, plan_runner

    d = sshd_pool.start()
    src = SshSource(spec_for(d), _settings(tmp_path, ssh_keys, [d]))
    plan = ProbePlan(remote_hosts=[src.name], remote_sources=[src])
    async with watching(d.name) as seen:
        [res] = await plan_runner(plan)(False)
    assert res.host == d.name and not res.ok and "no GPU found" in res.error
    await nothing_left(d, seen)


FAKE_SMI_L = "printf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\\nGPU 1: NVIDIA H200 (UUID: GPU-b)\\n'"


async def test_cross_node_probe_takes_ranks_from_the_inventory_and_reports_progress(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    """No nprocs: the GPU count comes from each node over SSH (here a stand-in for
    `nvidia-smi -L` printing 2 GPUs), and rank 0's launcher streams one progress line per size."""
    d1, d2 = sshd_pool.start(), sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d1, d2])
    progress: list[tuple[str, str]] = []
    async with watching(d1.name) as seen1, watching(d2.name) as seen2:
        [res] = await probe_ssh_hosts(
            [spec_for(d1), spec_for(d2)],
            settings,
            scope="inter",
            gpu_count_command=FAKE_SMI_L,
            master_port=free_port(d1.addr),
            timeout=60,
            on_progress=lambda host, text: progress.append((host, text)),
            **SMALL,
        )
    assert res.ok, res.error
    assert res.nranks == 4 and res.hosts == [d1.name, d2.name]  # 2 per node, from the count
    mine = [t for h, t in progress if h == d1.name]
    assert [t.split(",")[0] for t in mine] == [
        "all_reduce 1/3: 1 MiB",
        "all_reduce 2/3: 2 MiB",
        "all_reduce 3/3: 4 MiB",
    ]
    assert all(re.fullmatch(r".*, busbw [0-9.e+-]+ GB/s", t) for t in mine)
    await nothing_left(d1, seen1)
    await nothing_left(d2, seen2)


async def test_cross_node_probe_refuses_a_node_without_gpus(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    d1, d2 = sshd_pool.start(), sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d1, d2])
    with pytest.raises(ValueError, match=f"no GPU on {d1.name}, {d2.name}"):
        await probe_ssh_hosts(
            [spec_for(d1), spec_for(d2)], settings, scope="inter", gpu_count_command="true"
        )


async def test_probe_key_runner_adds_a_cross_node_run_from_the_agents_gpu_counts(
    tmp_path: Path, ssh_keys, sshd_pool: SshdFactory
) -> None:
    """Two SSH sources: after each node alone, one run across both, ranks per node from the
    GPU counts of their agents' hellos. No GPU here, so it fails on "no GPU found"; without any
    count it is refused up front and says why. Nothing is left running either way."""
    from verl_top.sources.ssh import SshSource
    from verl_top.ui.probe_screen import ProbePlan, plan_runner

    d1, d2 = sshd_pool.start(), sshd_pool.start()
    settings = _settings(tmp_path, ssh_keys, [d1, d2])
    srcs = [SshSource(spec_for(d), settings) for d in (d1, d2)]
    plan = ProbePlan(remote_hosts=[s.name for s in srcs], remote_sources=srcs)
    results = await plan_runner(plan)(False)
    assert [r.scope for r in results] == ["intra", "intra", "inter"]
    assert (
        results[2].error
        == f"no cross-node probe: no GPU on {d1.name}, {d2.name} (nvidia-smi -L lists none)"
    )
    plan.remote_gpus = {d1.name: 2, d2.name: 2}
    async with watching(d1.name) as seen1, watching(d2.name) as seen2:
        results = await plan_runner(plan)(False)
    inter = results[2]
    assert inter.scope == "inter" and inter.hosts == [d1.name, d2.name]
    assert not inter.ok and "no GPU found" in inter.error
    await nothing_left(d1, seen1)
    await nothing_left(d2, seen2)
