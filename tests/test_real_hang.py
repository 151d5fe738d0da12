"""A real hang, caught (issue 29 item 6): verl 0.5.0 PPO (GAE) on one H200, its
``ray::WorkerDict`` stopped with SIGSTOP inside ``critic_update_critic`` for 60 s, then resumed;
verl-top recorded the whole run (tests/fixtures/real_hang/, PROVENANCE.md there).

Expected before the tool ran on it, from the ground truth (ps.txt: pid 3132 in state T from the
stop to the cont; verl.log: update_critic takes ~0.4 s a step): no hang before the stop; the
stopped worker named (pid, role, state T, method update_critic) within 20 s of its method
overrunning its own history, leading the verdict; nothing hung after SIGCONT; the run finished
all its 10 steps, so the end is no stall.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "real_hang"
sys.path.insert(0, str(ROOT / "benchmarks"))

from hang_replay import judge, met, read_stop  # noqa: E402

from verl_top.cli import main  # noqa: E402
from verl_top.diagnosis.engine import Engine  # noqa: E402
from verl_top.protocol import read_recording  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store  # noqa: E402

RECORDING = FIX / "session.ndjson.gz"


def test_the_ground_truth_is_a_stopped_worker() -> None:
    stop = read_stop(FIX / "stop.txt")
    assert stop.pid == 3132 and "critic_update_critic" in stop.title
    assert stop.cont_t is not None and 59 < stop.cont_t - stop.stop_t < 61
    states = []
    t = 0.0
    for line in gzip.open(FIX / "ps.txt.gz", "rt"):
        if line.startswith("=="):
            t = float(line.split()[1])
        elif line.split()[:1] == ["3132"] and stop.stop_t + 1 < t < stop.cont_t - 1:
            states.append(line.split()[1][0])
    assert states and set(states) == {"T"}


def test_the_stopped_worker_is_named_within_20_s_of_its_overrun() -> None:
    stop = read_stop(FIX / "stop.txt")
    res = judge(read_recording(RECORDING), stop, every=1.0)
    assert res.procs_seen
    assert met(res, 20.0), res
    assert res.led, "job.hang must lead the verdict once it names the process"
    assert "critic" in res.title_at_flag and "stopped (T)" in res.title_at_flag
    assert "update_critic" in res.title_at_flag
    assert res.cleared_s is not None and res.cleared_s <= 10.0  # gone after SIGCONT


def test_no_hang_is_named_before_the_stop() -> None:
    """The driver's own loop (TaskRunner.run) lasts the whole job: never a hang (it was named
    on this very recording before the fix)."""
    stop = read_stop(FIX / "stop.txt")
    store = Store()
    store.replay = True
    pipe = Pipeline(store, wall_clock=lambda: store.now)
    engine = Engine()
    next_eval = 0.0
    checked = 0
    for rec in sorted(read_recording(RECORDING), key=lambda r: r.t or 0.0):
        if rec.t and rec.t >= stop.stop_t:
            break
        if rec.t and rec.t >= next_eval:
            verdict = engine.evaluate(store)
            assert not [f for f in verdict.findings if f.rule == "job.hang"], verdict.findings
            checked += 1
            next_eval = rec.t + 1.0
        pipe.emit(rec)
    assert checked > 60


def test_diagnose_keeps_the_hang_in_its_history_and_ends_on_the_finished_run() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["diagnose", "--replay", str(RECORDING), "--json"])
    assert code == 0
    doc = json.loads(out.getvalue())
    hangs = [h for h in doc["history"] if h["rule"] == "job.hang"]
    assert hangs and "stopped (T)" in hangs[0]["title"] and "update_critic" in hangs[0]["title"]
    assert doc["bottleneck"]["rule"] not in ("job.hang", "job.stalled")  # recovered, finished
    stalled = next(c for c in doc["steps"][0]["checks"] if c["rule"] == "job.stalled")
    assert stalled["status"] == "passed" and "the run finished" in stalled["detail"]
