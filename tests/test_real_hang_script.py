"""benchmarks/real_hang.sh's own logic, without a GPU, and benchmarks/hang_replay.py's judgement.

``FAKE_JOB=1`` runs the script end to end here: a stand-in worker titled
``ray::WorkerDict.critic_update_critic`` and a log of step lines instead of verl, verl-top on the
agent's replay backend. The script must find the worker by its title, wait for the steps,
SIGSTOP it in the method, SIGCONT it after STOP_S, record verl-top's session and pack one
archive. Whether verl-top then names the stopped process is judged on the real capture (the
GPU machine's agent lists the WorkerDict as a GPU process; the replay backend lists none, and
the summary says so) and, here, by ``hang_replay.judge`` on records built like the hang tests'.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.hang_data import T0, gpu, hello, worker
from verl_top.model import LogLines, ProcessList

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hang_replay  # noqa: E402


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc (Linux)")
def test_the_script_stops_the_worker_in_its_method_resumes_it_and_packs_one_archive(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "FAKE_JOB": "1",
        "STOP_AFTER_STEPS": "1",
        "STOP_S": "5",
        "WATCH_S": "14",
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "PYTHONPATH": str(ROOT),
        "TMUX_TMPDIR": str(tmp_path),  # a tmux server of its own, gone with the test
    }
    # Another test's WorkerDict stand-in, started first (a lower pid, listed first in /proc), as
    # the suite's job-scan tests run beside this one: the script must stop its own worker.
    title = "ray::WorkerDict.critic_update_critic"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    decoy = subprocess.Popen(["bash", "-c", 'exec -a "$0" "$@"', title, *sleeper])
    try:
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks" / "real_hang.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        decoy.kill()
        decoy.wait()
    assert run.returncode == 0, run.stderr[-2000:]
    r = tmp_path / "work" / "r"
    stop = hang_replay.read_stop(r / "stop.txt")
    assert stop.title == "ray::WorkerDict.critic_update_critic" and stop.pid != decoy.pid
    assert stop.cont_t is not None and 4.5 <= stop.cont_t - stop.stop_t <= 8
    # ps saw the worker stopped (T) between the signals, and running or sleeping after
    states: list[tuple[float, str]] = []
    t = 0.0
    for line in (r / "watch" / "ps.txt").read_text().splitlines():
        if line.startswith("== "):
            t = float(line[3:])
        elif line.split()[:1] == [str(stop.pid)]:
            states.append((t, line.split()[1]))
    during = [s for t, s in states if stop.stop_t + 1 < t < stop.cont_t - 1]
    after = [s for t, s in states if t > stop.cont_t + 1]
    assert during and all(s.startswith("T") for s in during)
    assert after and not any(s.startswith("T") for s in after)
    with tarfile.open(tmp_path / "out" / "real_hang.tar.gz") as tar:
        names = tar.getnames()
    assert "r/watch/session.ndjson.gz" in names and "r/stop.txt" in names
    assert "no process list" in (r / "hang_replay.txt").read_text()  # the replay backend's


def test_hang_replay_times_the_flag_from_the_stop_and_the_overrun() -> None:
    # One GPU, a WorkerDict entering update_actor at T0 and stopped at T0 + 2 (GPU idle from
    # there, real H200 rows); its history: update_actor 5 s in each of 5 steps (constructed),
    # so the limit is max(3 x 5, 20) = 20 s: flagged at the first evaluation past T0 + 20,
    # i.e. 18-19 s after the stop (evaluations each second from the stop).
    lines = [
        f"(TaskRunner pid=1) step:{n} - timing_s/update_actor:5.0 - timing_s/step:9.0"
        for n in range(1, 6)
    ]
    recs = [
        hello("n1", 1, T0 - 50),
        LogLines(host="n1", t=T0 - 40, path="/d", kind="verl", lines=lines),
    ]
    recs.append(
        ProcessList(host="n1", t=T0, procs=[worker(77, 0, "actor_rollout_update_actor", 99.0, 0)])
    )
    recs += [gpu("n1", 0, T0 - 30 + k, "busy" if k < 32 else "idle", k) for k in range(90)]
    stop = hang_replay.Stop(
        pid=77, stop_t=T0 + 2, title="ray::WorkerDict.actor_rollout_update_actor"
    )
    stop.cont_t = T0 + 50
    recs.append(ProcessList(host="n1", t=T0 + 51, procs=[worker(77, 0, "", 2.0, 0)]))
    res = hang_replay.judge(recs, stop)
    assert res.procs_seen and res.limit_s == 20.0
    assert res.flagged_s is not None and 18 <= res.flagged_s <= 19.5
    assert res.after_overrun_s is not None and 0 < res.after_overrun_s <= 1.5
    assert res.led is True and hang_replay.met(res, 20)
    assert res.cleared_s is not None and res.cleared_s <= 2
