"""The job's processes on a node (issue 29 M2): every process of the training job, GPU or not,
with its state, parent, Ray method and since when, found on real processes started here.

The processes carry the titles real verl jobs show (``ray::WorkerDict.<method>``, seen on the
real H200 job; ``ray::TaskRunner.run``, ``VLLM::EngineCore`` from the role catalogue) as their
argv[0] (``exec -a``), which is what /proc/PID/cmdline shows, as for a title set by Ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from verl_top import roles
from verl_top.agent import main, procs
from verl_top.protocol import from_dict, to_dict

SLEEP = "/bin/sleep"


def titled(title: str, *args: str) -> subprocess.Popen[bytes]:
    """A process whose /proc/PID/cmdline starts with ``title`` (bash ``exec -a``)."""
    cmd = 'exec -a "$0" "$@"'
    return subprocess.Popen(["bash", "-c", cmd, title, *(args or (SLEEP, "60"))])


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        if p.poll() is None:
            p.kill()
        p.wait()


def agent() -> main.Agent:
    a = main.Agent(main.parse_args(["--backend", "none", "--host", "n1", "--procs-every", "1"]))
    assert a.jobs is not None
    return a


def listing(a: main.Agent, now: float) -> dict[int, dict]:
    """The job processes of one tick's procs record, by pid ({} when none was sent)."""
    recs = [r for r in a.tick(now) if r["type"] == "procs"]
    return {j["pid"]: j for j in recs[0]["job_procs"]} if recs else {}


def wait_title(pid: int, start: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read().startswith(start.encode()):
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never showed {start!r}")


def wait_asleep(pid: int) -> None:
    """Until /proc says the process sleeps: just after its exec a busy machine still shows R."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "S":
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never slept")


def test_job_processes_found_by_title_with_state_method_and_since(started) -> None:  # type: ignore[no-untyped-def]
    critic = titled("ray::WorkerDict.critic_update_critic")
    driver = titled("ray::TaskRunner.run")
    engine = titled("VLLM::EngineCore")
    idle = titled("ray::IDLE")  # a pooled Ray worker not serving the job
    plain = titled("python3", SLEEP, "60")  # no job process
    started += [critic, driver, engine, idle, plain]
    for p, t in ((critic, "ray::"), (driver, "ray::"), (engine, "VLLM"), (idle, "ray::")):
        wait_title(p.pid, t)
    wait_title(plain.pid, "python3")
    wait_asleep(critic.pid)
    a = agent()
    try:
        got = listing(a, 1000.0)
        assert {critic.pid, driver.pid, engine.pid} <= set(got)
        assert idle.pid not in got and plain.pid not in got
        c = got[critic.pid]
        assert c["title"].startswith("ray::WorkerDict.critic_update_critic")
        assert (c["method"], c["method_since"]) == ("critic_update_critic", 1000.0)
        assert c["state"] == "S" and c["ppid"] == os.getpid() and c["gpus"] == []
        assert c["user"] and c["rss_bytes"] > 0 and "cpu_pct" not in c  # no delta yet
        assert got[driver.pid]["method"] == "run" and "method" not in got[engine.pid]
        # SIGSTOP: the next listing says T, the method and its since are unchanged
        os.kill(critic.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while listing(a, 1005.0)[critic.pid]["state"] != "T":
            assert time.monotonic() < deadline, "never seen stopped"
        later = listing(a, 1010.0)[critic.pid]
        assert later["state"] == "T" and later["method_since"] == 1000.0
        assert later["cpu_pct"] == 0.0  # stopped: no CPU
        os.kill(critic.pid, signal.SIGCONT)
        # gone: no longer listed
        driver.kill()
        driver.wait()
        assert driver.pid not in listing(a, 1015.0)
    finally:
        a.close()


def test_a_zombie_keeps_its_title_and_shows_z(started) -> None:  # type: ignore[no-untyped-def]
    """A worker that died but was not reaped yet: state Z, still named (its cmdline is empty)."""
    title = "ray::WorkerDict.ref_compute_ref_log_prob"
    code = (
        "import subprocess, time\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {title} sleep 3'])\n"
        "time.sleep(60)  # never waits for it: a zombie once it exits"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    started.append(parent)
    deadline = time.monotonic() + 5
    child = None
    while child is None:
        assert time.monotonic() < deadline, "no child"
        with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as fh:
            kids = fh.read().split()
        child = int(kids[0]) if kids else None
    wait_title(child, title)
    wait_asleep(child)
    a = agent()
    try:
        first = listing(a, 1.0)[child]
        assert first["state"] == "S" and first["method"] == "ref_compute_ref_log_prob"
        deadline = time.monotonic() + 8
        while (got := listing(a, 2.0).get(child, {})).get("state") != "Z":
            assert time.monotonic() < deadline, f"never seen as a zombie: {got}"
            time.sleep(0.1)
        with open(f"/proc/{child}/cmdline", "rb") as fh:
            assert fh.read() == b""  # what /proc shows of a zombie
        assert got["title"].startswith(title) and got["method_since"] == 1.0
    finally:
        a.close()


def test_job_titles_and_methods() -> None:
    """Which titles are the job's (real verl titles from tests/fixtures and verl.md §5)."""
    s = procs.JobScanner(procs.ProcInspector())
    job = [
        "ray::WorkerDict.actor_rollout_generate_sequences",
        "ray::WorkerDict",
        "ray::TaskRunner.run",
        "ray::main_task",
        "python3 -m verl.trainer.main_ppo data.train_batch_size=8",
        "/usr/bin/python /home/u/verl/verl/trainer/main_ppo.py",
        "python /opt/ray/python/ray/_private/workers/default_worker.py --node-ip-address=1.2.3.4",
        "VLLM::EngineCore",
        "vllm serve Qwen/Qwen2.5-7B",
        "python -m sglang.launch_server --model x",
        "sglang::scheduler_TP0",
        "/usr/bin/python /usr/local/bin/torchrun --nproc-per-node 8 train.py",
        "python -m torch.distributed.run --nproc_per_node=8 x.py",
    ]
    not_job = [
        "ray::IDLE",
        "ray::IDLE_SPILL_WORKER",
        "ray::DashboardAgent",
        "/usr/bin/python -m verl_top --hosts nodes.txt",
        "python3 -u -c verl_top_agent='laptop';import sys",
        "/usr/sbin/sshd -D",
        "python train.py --lr 1e-5",
        "",
    ]
    assert [t for t in job if not s.is_job(t)] == []
    assert [t for t in not_job if s.is_job(t)] == []
    assert s.method("ray::WorkerDict.critic_update_critic") == "critic_update_critic"
    assert s.method("ray::WorkerDict.actor_rollout_compute_log_prob()") == (
        "actor_rollout_compute_log_prob"
    )
    assert s.method("ray::WorkerDict") is None and s.method("VLLM::EngineCore") is None


def test_job_processes_round_trip_and_get_verl_roles(started) -> None:  # type: ignore[no-untyped-def]
    """Through the boundary and the role mapper: each job process named as verl names it."""
    critic = titled("ray::WorkerDict.critic_update_critic")
    driver = titled("ray::TaskRunner.run")
    engine = titled("VLLM::Worker_TP3")
    started += [critic, driver, engine]
    for p in started:
        wait_title(p.pid, "ray::" if p is not engine else "VLLM")
    a = agent()
    try:
        (rec,) = [r for r in a.tick(5.0) if r["type"] == "procs"]
    finally:
        a.close()
    plist = from_dict(rec)
    mine = {p.pid for p in started}
    sent = [j for j in rec["job_procs"] if j["pid"] in mine]
    assert [j for j in to_dict(plist)["job_procs"] if j["pid"] in mine] == sent  # unchanged
    assert len(sent) == 3
    named = {j.pid: j for j in roles.annotate_verl(plist).job_procs}
    assert named[critic.pid].role == "critic"
    assert named[driver.pid].role == "TaskRunner (driver)"
    assert named[engine.pid].role == "rollout (vLLM)"
    mapped = {m.pid: m for m in roles.process_map({"n1": roles.annotate_verl(plist)})}
    assert mapped[engine.pid].rank == 3 and mapped[engine.pid].source == "job"
    assert mapped[critic.pid].verl_role == "critic" and mapped[critic.pid].method == "update_critic"
