"""Replay timing/pause/step and --record -> --replay round trips."""

from __future__ import annotations

import asyncio
import time

import pytest

from verl_top.model import GpuSample, HostSample, Record
from verl_top.protocol import encode, read_recording
from verl_top.sources.recorder import Recorder
from verl_top.sources.replay import ReplayControl, ReplaySource, load


def _records(n: int, dt: float = 0.1) -> list[Record]:
    out: list[Record] = []
    for i in range(n):
        out.append(GpuSample(host="h", t=1000.0 + i * dt, index=0, util_gpu=float(i)))
    return out


async def test_replay_keeps_original_timing_scaled_by_speed(tmp_path) -> None:
    got: list[tuple[float, Record]] = []
    src = ReplaySource(tmp_path / "x", ReplayControl(speed=2.0), records=_records(6, dt=0.2))
    start = time.monotonic()
    await src.run(lambda r: got.append((time.monotonic() - start, r)))
    # 5 gaps of 0.2 s of data time at speed 2 -> ~0.5 s of wall time
    assert [r.util_gpu for _, r in got] == [0, 1, 2, 3, 4, 5]
    assert 0.4 <= got[-1][0] < 1.0
    assert src.control.finished


async def test_pause_then_step_plays_one_interval(tmp_path) -> None:
    ctl = ReplayControl(speed=100.0, paused=True)
    got: list[Record] = []
    src = ReplaySource(tmp_path / "x", ctl, records=_records(30, dt=0.25), step_interval=1.0)
    task = asyncio.create_task(src.run(got.append))
    await asyncio.sleep(0.1)
    assert got == []  # paused from the start
    ctl.step()
    await asyncio.sleep(0.1)
    assert len(got) == 4  # one second of 0.25 s samples
    ctl.step()
    await asyncio.sleep(0.1)
    assert len(got) == 8
    ctl.resume()
    await asyncio.wait_for(task, 2)
    assert len(got) == 30


async def test_record_then_replay_gives_the_same_records(tmp_path) -> None:
    path = tmp_path / "rec.ndjson.gz"
    rec = Recorder(path)
    originals = _records(5) + [
        HostSample(host="h", t=1001.0, cpu_pct=12.5, cpu_per_core=[1.0, 24.0])
    ]
    for r in originals:
        rec.write(r)
    rec.close()
    assert read_recording(path) == originals
    got: list[Record] = []
    await ReplaySource(path, ReplayControl(speed=1e6)).run(got.append)
    assert got == originals


def test_load_reports_missing_and_empty_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="recording not found"):
        load(tmp_path / "missing.ndjson")
    bad = tmp_path / "bad.ndjson"
    bad.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="2 malformed lines"):
        load(bad)


def test_recorder_write_error_stops_recording_not_monitoring(tmp_path) -> None:
    rec = Recorder(tmp_path / "r.ndjson")
    rec._fh.close()  # simulate the disk going away under us
    rec.write(_records(1)[0])
    assert "stopped" in rec.error


def test_encoded_recording_is_plain_ndjson(tmp_path) -> None:
    path = tmp_path / "r.ndjson"
    rec = Recorder(path)
    rec.write(_records(1)[0])
    rec.close()
    assert path.read_text() == encode(_records(1)[0]) + "\n"
