"""Host sampler through psutil and through /proc, and the in-process local sources."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from verl_top import model
from verl_top.agent import host, main
from verl_top.sources.local import LocalFollowSource, LocalSource

TRACE = Path(__file__).parent / "fixtures" / "agent" / "h200_phased_trace.jsonl"


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.mark.parametrize("mode", ["psutil", "proc"])
def test_host_sample_both_paths(mode: str) -> None:
    s = host.HostSampler(mode)
    assert s.mode == mode
    t_end = time.process_time() + 0.15
    while time.process_time() < t_end:  # burn CPU so the agent's own CPU % is visible
        pass
    f = dict(s.sample(time.time()))
    s.close()
    assert 0.0 <= f["cpu_pct"] <= 100.0 and 0.0 <= f["iowait_pct"] <= 100.0
    assert len(f["cpu_per_core"]) == os.cpu_count()
    assert all(0.0 <= c <= 100.0 for c in f["cpu_per_core"])
    assert f["mem_total_bytes"] == meminfo_total()
    assert 0 < f["mem_used_bytes"] < f["mem_total_bytes"]
    assert (f["load1"], f["load5"], f["load15"]) == pytest.approx(os.getloadavg(), abs=0.5)
    for k in ("net_rx_bps", "net_tx_bps", "disk_read_bps", "disk_write_bps"):
        assert f[k] is not None and f[k] >= 0.0
    assert f["agent_cpu_pct"] > 10.0  # it just burned most of 0.15 s
    assert f["agent_rss_bytes"] > 5_000_000


def test_env_switch_forces_proc_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_TOP_AGENT_NO_PSUTIL", "1")
    a = main.Agent(main.parse_args(["--backend", "none"]))
    assert a.host_sampler.mode == "proc" and "psutil" not in a.hello()["capabilities"]
    assert not a.blocking


def test_none_backend_still_sends_host_and_heartbeat() -> None:
    # --no-procs: the job processes of whatever runs on this machine are not this test's
    a = main.Agent(main.parse_args(["--backend", "none", "--host", "h", "--no-procs"]))
    hello = a.hello()
    assert hello["backend"] == "none" and hello["error"] and hello["gpus"] == []
    recs = a.tick(1000.0)
    assert [r["type"] for r in recs] == ["host", "hb"]
    assert recs[1]["seq"] == 1 and recs[1]["agent_cpu_s"] > 0
    assert [r["type"] for r in a.tick(1001.0)] == ["host"]  # next heartbeat after 5 s
    assert [r["type"] for r in a.tick(1005.0)] == ["host", "hb"]


def test_control_commands() -> None:
    a = main.Agent(main.parse_args(["--backend", "none"]))
    assert a.command({"cmd": "interval", "value": 0.5}) == "" and a.interval == 0.5
    assert a.command({"cmd": "procs", "value": False}) == "" and not a.procs_enabled
    assert a.command({"cmd": "follow", "kind": "bogus", "path": "/x"}).startswith("bad follow")
    assert a.command({"cmd": "nope"}) == "unknown command 'nope'"
    assert a.command([1]) != ""


async def test_local_source_emits_typed_records() -> None:
    src = LocalSource(backend="replay", replay_trace=str(TRACE), interval=0.01, count=3, host="me")
    got: list[model.Record] = []
    await asyncio.wait_for(src.run(got.append), 10)
    assert isinstance(got[0], model.Hello) and got[0].backend == "replay"
    gpus = [r for r in got if isinstance(r, model.GpuSample)]
    assert len(gpus) == 24 and {g.host for g in gpus} == {"me"}
    assert gpus[0].label == "idle" and gpus[0].mem_total_mib == 143771
    assert len([r for r in got if isinstance(r, model.HostSample)]) == 3
    assert src.malformed == 0


async def test_local_follow_source(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("step:1 - x:1\n")
    src = LocalFollowSource([f"verl+start:{log}", ("nccl", str(tmp_path / "later.log"))],
                            interval=0.01, host="me", count=3)  # fmt: skip
    got: list[model.Record] = []
    await asyncio.wait_for(src.run(got.append), 10)
    (rec,) = got
    assert isinstance(rec, model.LogLines)
    assert rec.lines == ["step:1 - x:1"] and rec.kind == "verl" and rec.host == "me"


def test_host_reads_follow_their_strides() -> None:
    """The per-tick cost: /proc/stat every 2nd tick, memory, network, disk and load every 5th
    (rates over those ticks); values repeated in between, never missing."""
    s = host.HostSampler("proc", slow_every=5, cpu_every=2)
    reads = {"stat": 0, "netdev": 0, "diskstats": 0, "meminfo": 0, "loadavg": 0}
    for name in reads:
        pf = getattr(s, "_" + name)
        real = pf.read

        def counted(real=real, name=name) -> str:
            reads[name] += 1
            return real()

        pf.read = counted  # type: ignore[method-assign]
    samples = [dict(s.sample(time.time())) for _ in range(10)]
    s.close()
    assert reads["stat"] == 5  # ticks 1, 3, 5, 7, 9
    assert reads["netdev"] == reads["diskstats"] == reads["meminfo"] == reads["loadavg"] == 2
    for f in samples:
        assert f["cpu_pct"] is not None and len(f["cpu_per_core"]) == os.cpu_count()
        assert f["net_rx_bps"] is not None and f["mem_used_bytes"] is not None
        assert f["agent_rss_bytes"] is not None and f["agent_cpu_pct"] is not None
    assert samples[2]["cpu_per_core"] == samples[3]["cpu_per_core"]  # repeated until re-read
    assert samples[1]["net_rx_bps"] == samples[4]["net_rx_bps"]
    assert samples[1]["mem_used_bytes"] == samples[4]["mem_used_bytes"]


def test_every_read_each_tick_with_strides_of_one() -> None:
    s = host.HostSampler("proc", slow_every=1, cpu_every=1)
    n = {"stat": 0, "meminfo": 0}
    for name in n:
        pf = getattr(s, "_" + name)

        def counted(real=pf.read, name=name) -> str:
            n[name] += 1
            return real()

        pf.read = counted  # type: ignore[method-assign]
    for _ in range(4):
        s.sample(time.time())
    s.close()
    assert n == {"stat": 4, "meminfo": 4}


def test_proc_file_reads_files_larger_than_its_buffer_whole_and_sees_changes(
    tmp_path: Path,
) -> None:
    """A kept-open file re-read into its reused buffer: a file past the first buffer is read
    whole (the buffer grows), and a rewrite (same inode, new content) is what the next read
    returns, as /proc files are."""
    path = tmp_path / "stat"
    lines = [f"cpu{i} {i} 0 {2 * i} 9999 7 0 0 0 0 0" for i in range(2000)]  # ~70 KB
    path.write_text("\n".join(lines) + "\n")
    pf = host.ProcFile(str(path))
    text = pf.read()
    assert len(text) > host.PROC_FIRST_READ and text.splitlines() == lines
    with path.open("r+") as fh:  # rewritten in place, shorter: no stale tail from the buffer
        fh.write("cpu 1 2 3 4\n")
        fh.truncate()
    assert pf.read() == "cpu 1 2 3 4\n"
    pf.close()
    path.unlink()
    assert pf.read() == ""  # gone: empty, never an exception
