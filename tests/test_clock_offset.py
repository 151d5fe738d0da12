"""Per-host clock offset: a node whose clock is an hour ahead hides nothing, its own data neither."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from verl_top.agent import main, wire
from verl_top.model import ClockOffset, Record
from verl_top.sources.intake import LIVE_WINDOW_S, Intake
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store

T0 = 1_800_000_000.0
SKEW = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _agent(trace: Path) -> main.Agent:
    opts = main.parse_args(
        ["--backend", "replay", "--replay-trace", str(trace), "--replay-gpus", "2", "--no-procs"]
    )
    return main.Agent(opts)


def _run(trace: Path, skews: dict[str, float], seconds: int) -> tuple[Store, dict[str, Intake]]:
    """Two real agents ticking once a second; each node's clock is off by ``skews[name]``;
    their lines go through the SSH intake with 20 ms of transit."""
    clock = Clock()
    store = Store(wall_clock=clock)
    pipe = Pipeline(store, wall_clock=clock)
    agents = {name: _agent(trace) for name in skews}
    intakes = {name: Intake(name, clock=clock) for name in skews}
    for name, agent in agents.items():
        line = wire.encode_line(agent.hello(now=clock.now + skews[name]))
        clock.now += 0.02
        intakes[name].accept(line, pipe.emit)
    for _ in range(seconds):
        clock.now += 0.96
        for name, agent in agents.items():
            for rec in agent.tick(now=clock.now + skews[name]):
                intakes[name].accept(wire.encode_line(rec), pipe.emit)
        clock.now += 0.02  # transit
    for agent in agents.values():
        agent.close()
    return store, intakes


def test_an_hour_ahead_node_hides_nothing(h200_trace: Path) -> None:
    store, intakes = _run(h200_trace, {"good": 0.0, "ahead": SKEW}, seconds=40)
    # The data clock follows the receiving host, not the skewed node.
    assert abs(store.now - store.wall_clock()) < 2.0
    for host in ("good", "ahead"):
        for entry in store.hosts[host].gpus.values():
            assert store.gpu_mean(entry, "util_gpu", window_s=30) is not None, host
            assert abs(entry.history.last_time() - store.now) < 2.0
    # The offset is measured, applied and visible (store, diagnose --json).
    assert intakes["ahead"].applied < -SKEW + 0.1 and intakes["ahead"].applied > -SKEW - 0.1
    assert intakes["good"].applied == 0.0
    offsets = store.input_health()["clock_offset_s"]
    assert abs(offsets["ahead"] + SKEW) < 0.1 and abs(offsets["good"]) < 0.1


def test_without_correction_the_skewed_node_would_empty_the_window(h200_trace: Path) -> None:
    """What the correction prevents: the raw times put the good host an hour in the past."""
    clock = Clock()
    store = Store(wall_clock=clock)
    agent = _agent(h200_trace)
    from verl_top.protocol import Decoder

    dec = Decoder()
    for rec in agent.tick(now=T0 + SKEW):
        store.ingest(dec.decode(wire.encode_line(rec)))
    agent.close()
    assert store.now >= T0 + SKEW  # the store's data clock would jump an hour ahead


def test_a_clock_stepped_later_is_refused_then_relearned(h200_trace: Path) -> None:
    clock = Clock()
    intake = Intake("n", clock=clock)
    got: list[Record] = []
    agent = _agent(h200_trace)
    intake.accept(wire.encode_line(agent.hello(now=clock.now)), got.append)
    jumped = 0.0
    refused = 0
    for i in range(100):
        clock.now += 1.0
        if i == 40:
            jumped = 2 * LIVE_WINDOW_S  # NTP steps the node's clock by 20 minutes
        for rec in agent.tick(now=clock.now + jumped):
            if intake.accept(wire.encode_line(rec), got.append) is None:
                refused += 1
    agent.close()
    assert refused > 0  # refused while the old offset no longer fits
    offsets = [r for r in got if isinstance(r, ClockOffset)]
    assert abs(offsets[-1].offset + jumped) < 1.0  # then learned again
    last = [r for r in got if r.TYPE == "gpu"][-1]
    assert abs(last.t - clock.now) < 1.0
    assert intake.decoder.drops[("n", "time_window")] == refused


@pytest.mark.sshd
@pytest.mark.timeout(60)
async def test_over_ssh_a_node_an_hour_ahead_hides_nothing(
    tmp_path: Path, ssh_keys, sshd_pool, h200_trace: Path, remote_python: str
) -> None:
    """Two real agents over real sshd; one's clock is +3600 s (time.time patched by a
    sitecustomize on its PYTHONPATH). Both hosts' GPUs have data in the window."""
    import shutil
    import sys

    from sshd import agent_args, make_settings, running, spec_for

    from verl_top.sources.ssh import SshSource

    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(
        f"import time\n_real = time.time\ntime.time = lambda: _real() + {SKEW}\n"
    )
    python = shutil.which(remote_python) or sys.executable
    wrapper = tmp_path / "python-skewed"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={skew} exec {python} "$@"\n')
    wrapper.chmod(0o755)
    good, ahead = sshd_pool.start(), sshd_pool.start()
    store = Store()
    pipe = Pipeline(store)
    sources = [
        SshSource(
            spec_for(good),
            make_settings(tmp_path, ssh_keys, [good, ahead], remote_python),
            agent_args(h200_trace),
        ),
        SshSource(
            spec_for(ahead),
            make_settings(tmp_path, ssh_keys, [good, ahead], str(wrapper)),
            agent_args(h200_trace),
        ),
    ]
    async with running(sources, pipe.emit):
        for _ in range(200):
            await asyncio.sleep(0.1)
            if all(
                len(store.hosts.get(d.name).gpus if d.name in store.hosts else ()) == 2
                for d in (good, ahead)
            ) and all(
                e.history.last_time() is not None and len(e.history) >= 3
                for d in (good, ahead)
                for e in store.hosts[d.name].gpus.values()
            ):
                break
    assert abs(store.now - store.wall_clock()) < 5.0  # not an hour ahead
    for d in (good, ahead):
        for entry in store.hosts[d.name].gpus.values():
            assert store.gpu_mean(entry, "util_gpu", window_s=30) is not None, d.name
            # its samples sit at the receiving host's time, so they age out when it stops
            assert abs(entry.history.last_time() - store.wall_clock()) < 5.0, d.name
    assert abs(store.hosts[ahead.name].clock_offset + SKEW) < 2.0
    assert abs(store.hosts[good.name].clock_offset) < 1.0


def test_one_node_lying_ahead_does_not_move_the_shared_clock(h200_trace: Path) -> None:
    """Issue 31: three honest nodes and one whose records claim to be 250 s ahead once its
    offset was learnt (within the 600 s live window, so nothing refused them before). The data
    clock stays with the honest hosts, which keep every point of the last 120 s (before: 11 of
    120)."""
    clock = Clock()
    store = Store(wall_clock=clock)
    pipe = Pipeline(store, wall_clock=clock)
    names = ("honest1", "honest2", "honest3", "liar")
    agents = {name: _agent(h200_trace) for name in names}
    intakes = {name: Intake(name, clock=clock) for name in names}
    for name, agent in agents.items():
        intakes[name].accept(wire.encode_line(agent.hello(now=clock.now)), pipe.emit)
    clock.now += 0.02
    for second in range(200):
        clock.now += 0.98
        for name, agent in agents.items():
            # The liar behaves through the offset's learning window, then jumps ahead.
            ahead = 250.0 if name == "liar" and second >= 60 else 0.0
            for rec in agent.tick(now=clock.now + ahead):
                intakes[name].accept(wire.encode_line(rec), pipe.emit)
        clock.now += 0.02
    for agent in agents.values():
        agent.close()
    assert abs(store.now - clock.now) < 2.0  # not 250 s ahead
    since = store.now - 120.0
    for name in names[:3]:
        for entry in store.hosts[name].gpus.values():
            times, _ = entry.history.series("util_gpu", since=since)
            assert len(times) >= 119, (name, len(times))  # every point of the last 120 s
    # Its jump is refused and counted until RELEARN_AFTER in a row say the clock was stepped;
    # then its offset is learnt again and its records are corrected back to arrival time.
    from verl_top.sources.intake import RELEARN_AFTER

    assert intakes["liar"].decoder.drops[("liar", "time_window")] == RELEARN_AFTER
    assert abs(intakes["liar"].applied + 250.0) < 1.0
    for entry in store.hosts["liar"].gpus.values():
        assert abs(entry.history.last_time() - clock.now) < 2.0
