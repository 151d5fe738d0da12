"""Python stacks of the job's processes (issue 29 item 3) with the real py-spy, against real
Python processes started here: on this machine, and through the tests' real sshd (py-spy found
next to the job's python, as on a node where Ray brought it). Refusals are real too: the
commands run as ``nobody`` (setpriv) against processes of root."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd import SshdFactory

from verl_top import stacks
from verl_top.node_exec import local_run

PYSPY_DIR = Path(sys.executable).parent
# A verl-like worker: its title names the method, its main thread sleeps inside it.
WORKER = "import time\ndef {fn}():\n    time.sleep(120)\ndef execute():\n    {fn}()\nexecute()\n"


def worker(title: str, fn: str) -> subprocess.Popen[bytes]:
    """A Python process titled ``title`` (argv[0], as Ray's title shows in /proc) in ``fn``."""
    code = WORKER.format(fn=fn)
    return subprocess.Popen(["bash", "-c", 'exec -a "$0" "$@"', title, sys.executable, "-c", code])


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        p.kill()
        p.wait()


def wait_started(procs: list[subprocess.Popen[bytes]]) -> None:
    """Until each process sleeps inside its function (py-spy sees a frame there): its title is
    set at exec, so wait for the kernel to say it sleeps in ``time.sleep``'s nanosleep (a fixed
    pause was too short on a loaded machine: a worker stopped while still importing had no
    ``MainThread`` yet)."""
    deadline = time.monotonic() + 30
    for p in procs:
        while True:
            with open(f"/proc/{p.pid}/cmdline", "rb") as fh:
                titled = fh.read().startswith(b"ray::")
            with open(f"/proc/{p.pid}/wchan") as fh:
                if titled and "nanosleep" in fh.read():
                    break
            assert time.monotonic() < deadline, f"pid {p.pid} never reached its sleep"
            time.sleep(0.02)


def test_pyspy_is_here() -> None:
    assert (PYSPY_DIR / "py-spy").exists(), "pip install py-spy (the stacks tests need it)"


def test_stacks_of_real_processes_grouped_by_role(workers) -> None:  # type: ignore[no-untyped-def]
    workers += [worker("ray::WorkerDict.critic_update_critic", "update_critic") for _ in range(3)]
    workers.append(worker("ray::WorkerDict.actor_rollout_generate_sequences", "generate"))
    wait_started(workers)
    targets = [stacks.Target("local", p.pid, "critic") for p in workers[:3]]
    targets.append(stacks.Target("local", workers[3].pid, "actor/rollout"))
    got = asyncio.run(stacks.collect_host(local_run, "local", targets))
    assert [s.source for s in got] == ["py-spy"] * 4 and not any(s.error for s in got)
    main = {s.pid: next(t for t in s.threads if t.name == "MainThread") for s in got}
    assert [f.function for f in main[workers[0].pid].frames] == [
        "update_critic",
        "execute",
        "<module>",
    ]
    assert main[workers[0].pid].frames[0].line == 3  # the sleep's line in update_critic
    groups = [g for g in stacks.group(got) if g.thread == "MainThread"]
    critic = next(g for g in groups if g.role == "critic")
    assert sorted(p for _, p in critic.members) == sorted(p.pid for p in workers[:3])
    text = stacks.render_text(got)
    assert "3 processes share this stack [MainThread" in text
    assert "== critic: 3 process(es) ==" in text and "== actor/rollout: 1 process(es) ==" in text
    assert "update_critic (<string>:3)" in text and "pauses each process" in text
    doc = stacks.to_json(got)
    assert json.loads(json.dumps(doc))[0]["threads"][0]["frames"][0][0]  # plain JSON


def test_a_stopped_process_is_read_without_pausing_it(workers) -> None:  # type: ignore[no-untyped-def]
    """A worker stopped with SIGSTOP (the real H200 hang): the pausing read gets no stack, the
    non-blocking one does, and the process stays stopped."""
    import signal

    workers.append(worker("ray::WorkerDict.critic_update_critic", "update_critic"))
    wait_started(workers)
    os.kill(workers[0].pid, signal.SIGSTOP)
    try:
        (got,) = asyncio.run(
            stacks.collect_host(
                local_run, "local", [stacks.Target("local", workers[0].pid, "critic")]
            )
        )
        with open(f"/proc/{workers[0].pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    finally:
        os.kill(workers[0].pid, signal.SIGCONT)
    assert not got.error and got.source == "py-spy --nonblocking"
    main = next(t for t in got.threads if t.name == "MainThread")
    assert main.frames[0].function == "update_critic"
    assert state == "T"  # still stopped: nothing was sent to it


def test_refused_for_a_process_the_user_does_not_own(workers) -> None:  # type: ignore[no-untyped-def]
    """Run as nobody against root's process: refused, with the owner and what would work."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.fail("this test runs as root with setpriv (util-linux), as CI does")
    workers.append(worker("ray::WorkerDict.critic_update_critic", "update_critic"))
    wait_started(workers)

    async def as_nobody(argv, timeout, stdin=""):  # type: ignore[no-untyped-def]
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        return await local_run([*prefix, *argv], timeout, stdin)

    t = stacks.Target("gpu07", workers[0].pid, "critic", user="root")
    (got,) = asyncio.run(stacks.collect_host(as_nobody, "gpu07", [t]))
    assert not got.threads and got.source == ""
    assert got.error == (
        f"pid {t.pid} runs as uid 0 (root); the SSH user (uid 65534) may only read its own "
        "processes (root may read all): connect as root (root@gpu07)"
    )


def test_missing_pyspy_says_what_and_how(workers) -> None:  # type: ignore[no-untyped-def]
    """No py-spy on the PATH nor next to the process's python: the message names both."""
    code = WORKER.format(fn="update_critic")
    system = "/usr/bin/python3"
    if not os.path.exists(system) or os.path.exists("/usr/bin/py-spy"):
        pytest.fail("needs a python3 in /usr/bin without a py-spy next to it (Debian image)")
    p = subprocess.Popen(["bash", "-c", 'exec -a "$0" "$@"', "ray::WorkerDict", system, "-c", code])
    workers.append(p)
    wait_started(workers)

    async def bare_path(argv, timeout, stdin=""):  # type: ignore[no-untyped-def]
        env = ["env", "PATH=/usr/bin:/bin", "HOME=/nonexistent"]
        return await local_run([*env, *argv], timeout, stdin)

    (got,) = asyncio.run(stacks.collect_host(bare_path, "n1", [stacks.Target("n1", p.pid)]))
    assert got.error == (
        "py-spy is not installed on n1 (not on the login PATH, not in ~/.local/bin, not next to "
        "the job's python (/usr/bin)): pip install py-spy in the job's environment (ray[default] "
        "brings it), or give --ray http://HEAD:8265 to ask the Ray dashboard"
    )


def test_pyspy_found_next_to_the_jobs_python(workers) -> None:  # type: ignore[no-untyped-def]
    """Not on the PATH: found in the bin directory of the python the process runs (where Ray's
    pip install put it), and used."""
    workers.append(worker("ray::WorkerDict.critic_update_critic", "update_critic"))
    wait_started(workers)

    async def bare_path(argv, timeout, stdin=""):  # type: ignore[no-untyped-def]
        return await local_run(["env", "PATH=/usr/bin:/bin", "HOME=/nonexistent", *argv], timeout)

    pid = str(workers[0].pid)
    res = asyncio.run(bare_path(["sh", "-c", stacks.LOCATE_SCRIPT, "sh", pid], 10))
    loc = stacks.parse_located(res.stdout)
    assert loc.pyspy == [str(Path(os.path.realpath(sys.executable)).parent / "py-spy")]
    assert loc.uid == os.getuid() and loc.owners == {workers[0].pid: os.getuid()}
    (got,) = asyncio.run(stacks.collect_host(bare_path, "h", [stacks.Target("h", int(pid))]))
    assert got.source == "py-spy" and got.threads


def test_not_python_and_gone_are_said_plainly() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        targets = [stacks.Target("h", sleeper.pid), stacks.Target("h", 2**22 + 7)]
        got = asyncio.run(stacks.collect_host(local_run, "h", targets))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert got[0].error.startswith(f"pid {sleeper.pid} is not a Python process (py-spy: ")
    assert got[1].error == f"pid {2**22 + 7} is not running on h"


def test_dump_parser_bounds_and_sanitizes() -> None:
    """py-spy's text (also the Ray dashboard's): thread headers of every version, frames with
    and without a line, hostile text cleaned."""
    text = (
        "Process 42: ray::WorkerDict.critic_update_critic\n"
        "Python v3.10.12 (/usr/bin/python3.10)\n\n"
        'Thread 42 (active+gil): "MainThread"\n'
        "    update_critic (verl/workers/fsdp_workers.py:1210)\n"
        "        arguments:\n"
        "            self: <WorkerDict at 0x7f>\n"
        "    _bound (libfoo.so)\n"
        'Thread 0x7F12AB (idle): "\x1b[31mevil\x1b[0m"\n'
        "    wait (threading.py:320)\n"
    )
    threads = stacks.parse_dump(text)
    assert [t.name for t in threads] == ["MainThread", "evil"]
    assert threads[0].status == "active+gil"
    assert threads[0].frames == (
        stacks.Frame("update_critic", "verl/workers/fsdp_workers.py", 1210),
        stacks.Frame("_bound", "libfoo.so", None),
    )
    many = 'Thread 1 (idle): "t"\n' + "    f (x.py:1)\n" * 10_000
    assert len(stacks.parse_dump(many)[0].frames) == stacks.MAX_FRAMES


@pytest.mark.sshd
@pytest.mark.timeout(90)
def test_stacks_command_through_real_sshd(  # type: ignore[no-untyped-def]
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, remote_python: str, workers
) -> None:
    """``verl-top stacks HOST:PID`` over SSH: the agent lists the job's processes (the role),
    py-spy reads them through the same connection, one group per role."""
    workers += [worker("ray::WorkerDict.critic_update_critic", "update_critic") for _ in range(2)]
    wait_started(workers)
    d = sshd_factory.start()
    known = tmp_path / "known_hosts"
    known.write_text(d.known_hosts_line())
    (tmp_path / "ssh_config").touch()
    ssh = ["--known-hosts", str(known), "-i", str(ssh_keys["client"])]
    ssh += ["--ssh-config", str(tmp_path / "ssh_config"), "--python", remote_python]
    run = subprocess.run(
        [sys.executable, "-m", "verl_top", "stacks", f"root@{d.addr}:{d.port}:{workers[0].pid}",
         *ssh, "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    (one,) = json.loads(run.stdout)
    assert (
        one["source"] == "py-spy"
        and one["role"] == "critic"
        and one["host"] == f"{d.addr}:{d.port}"
    )
    main = next(t for t in one["threads"] if t["name"] == "MainThread")
    assert [f[0] for f in main["frames"]] == ["update_critic", "execute", "<module>"]
    run = subprocess.run(
        [sys.executable, "-m", "verl_top", "stacks", f"root@{d.addr}:{d.port}:{workers[1].pid}",
         f"root@{d.addr}:{d.port}:{workers[0].pid}", *ssh],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    assert "== critic: 2 process(es) ==" in run.stdout
    assert "2 processes share this stack [MainThread" in run.stdout


def test_split_target() -> None:
    from verl_top.stacks_cli import split_target

    assert split_target("gpu07") == ("gpu07", None)
    assert split_target("gpu07:81234") == ("gpu07", 81234)
    assert split_target("alice@gpu07:2222:81234") == ("alice@gpu07:2222", 81234)
    assert split_target("gpu[01-04]") == ("gpu[01-04]", None)


async def test_node_screen_key_reads_stacks_and_the_snapshot_keeps_them(  # type: ignore[no-untyped-def]
    tmp_path: Path, workers, own_job_processes
) -> None:
    """The live app on this machine (the real in-process agent lists the job's processes): t on
    the node screen reads their stacks, says py-spy pauses them, and a snapshot writes them."""
    from verl_top.diagnosis.engine import Engine
    from verl_top.export.schema import SNAPSHOT_SCHEMA, validate
    from verl_top.export.snapshot import write_snapshot
    from verl_top.inputs import Inputs
    from verl_top.sources.local import LocalSource
    from verl_top.sources.pipeline import Pipeline
    from verl_top.store import Store
    from verl_top.ui.app import VerlTopApp
    from verl_top.ui.node_screen import NodeScreen
    from verl_top.ui.stacks_screen import StacksScreen

    workers += [worker("ray::WorkerDict.critic_update_critic", "update_critic") for _ in range(2)]
    wait_started(workers)
    mine = {p.pid for p in workers}
    store = Store()
    source = LocalSource(interval=0.2, backend="none", host="thisbox")
    inputs = Inputs(store=store, pipeline=Pipeline(store, parsers={}), sources=[source])
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine(), live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(100):
            await asyncio.sleep(0.1)
            h = store.hosts.get("thisbox")
            if h is not None and h.procs is not None and mine <= {j.pid for j in h.procs.job_procs}:
                break
        assert {j.role for j in store.hosts["thisbox"].procs.job_procs if j.pid in mine} == {
            "critic"
        }
        app.push_screen(NodeScreen(store, "thisbox"))
        await pilot.pause()
        await pilot.press("t")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, StacksScreen)
        for _ in range(100):
            if screen.result is not None:
                break
            await asyncio.sleep(0.1)
        assert screen.result is not None
        body = str(screen.query_one("#stacks-body").render())
        assert "2 processes share this stack [MainThread" in body and "update_critic" in body
        assert "pauses each process" in body
        assert {s.pid for s in store.stacks if s.threads} >= mine
    out = write_snapshot(store, None, tmp_path / "snap")
    text = (out / "stacks.txt").read_text()
    assert "== critic: 2 process(es) ==" in text and "update_critic (<string>:3)" in text
    doc = json.loads((out / "snapshot.json").read_text())
    assert doc["files"]["stacks"] == "stacks.txt" and not validate(doc, SNAPSHOT_SCHEMA)
    read = [s for s in doc["stacks"] if s["pid"] in mine]
    assert len(read) == 2 and all(s["source"] == "py-spy" for s in read)


def _state(pid: int) -> str:
    """The process's state letter from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as fh:
        return next(line.split()[1] for line in fh if line.startswith("State:"))


def test_a_process_the_node_calls_stopped_gets_only_the_non_blocking_read(workers) -> None:  # type: ignore[no-untyped-def]
    """The node's /proc state, read just before the dump, says T: py-spy runs once, with
    --nonblocking (no pausing attempt that can only fail, or wait on a D process); the state
    is kept with the stack and the text says those were read without a pause."""
    workers.append(worker("ray::WorkerDict.actor_rollout_update_actor", "update_actor"))
    wait_started(workers)
    pid = workers[0].pid
    os.kill(pid, signal.SIGSTOP)
    dumps: list[list[str]] = []

    async def recording(argv, timeout, stdin=""):  # type: ignore[no-untyped-def]
        if "dump" in argv:
            dumps.append(list(argv[1:]))
        return await local_run(argv, timeout, stdin)

    (got,) = asyncio.run(
        stacks.collect_host(recording, "h", [stacks.Target("h", pid, "actor/rollout")])
    )
    assert dumps == [["dump", "--nonblocking", "--pid", str(pid)]]
    assert (got.source, got.state, got.error) == ("py-spy --nonblocking", "T", "")
    assert "were read without pausing them (py-spy --nonblocking" in stacks.render_text([got])
    assert _state(pid) == "T"


def _ssh_args(tmp_path: Path, d, ssh_keys) -> list[str]:  # type: ignore[no-untyped-def]
    """The monitor's SSH options for the test sshd ``d`` (the agent runs the node's python3;
    py-spy is found next to the workers' python, as Ray's pip install puts it)."""
    known = tmp_path / "known_hosts"
    known.write_text(d.known_hosts_line())
    (tmp_path / "ssh_config").touch()
    return [
        "--known-hosts", str(known), "-i", str(ssh_keys["client"]),
        "--ssh-config", str(tmp_path / "ssh_config"),
    ]  # fmt: skip


def _hung_job(workers) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """Two actor ranks in update_actor (the first stopped) and a critic: their pids."""
    workers.append(worker("ray::WorkerDict.actor_rollout_update_actor", "update_actor"))
    workers.append(worker("ray::WorkerDict.actor_rollout_update_actor", "update_actor"))
    workers.append(worker("ray::WorkerDict.critic_update_critic", "update_critic"))
    wait_started(workers)
    os.kill(workers[0].pid, signal.SIGSTOP)
    return workers[0].pid, workers[1].pid, workers[2].pid


def _snapshot(
    out: Path, host: str, ssh: list[str], *extra: str
) -> subprocess.CompletedProcess[str]:
    log = Path(__file__).parent / "fixtures" / "verl" / "real_h200_verl050_grpo_hf_40steps.log"
    return subprocess.run(
        [sys.executable, "-m", "verl_top", "snapshot", "--hosts", host, "--verl-log", str(log),
         "-o", str(out), *ssh, *extra],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip


@pytest.mark.sshd
@pytest.mark.timeout(150)
def test_snapshot_reads_the_hung_roles_stacks_through_real_sshd(  # type: ignore[no-untyped-def]
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, workers
) -> None:
    """A real job process stopped inside update_actor, its peer waiting, a critic elsewhere:
    job.hang leads at the end of `snapshot` (hang_min_s 2 s; the real log's update_actor p95 is
    65 ms), so the actor role's stacks are read through the agent's SSH connection (not the
    critic's), the stopped one without a pause; they are in the bundle and in the evidence."""
    stopped, peer, critic = _hung_job(workers)
    d = sshd_factory.start()
    cfg = tmp_path / "config.toml"
    cfg.write_text("[thresholds]\nhang_min_s = 2\n")
    host = f"root@{d.addr}:{d.port}"
    ssh = _ssh_args(tmp_path, d, ssh_keys)
    out = tmp_path / "bundle"
    run = _snapshot(out, host, ssh, "--duration", "7", "--config", str(cfg))
    assert run.returncode == 0, run.stderr + run.stdout
    assert "(job.hang leads); py-spy attaches with ptrace and pauses each process" in run.stderr
    doc = json.loads((out / "snapshot.json").read_text())
    assert doc["diagnosis"]["bottleneck"]["rule"] == "job.hang"
    read = {s["pid"]: s for s in doc["stacks"]}
    assert {stopped, peer} <= set(read) and critic not in read
    assert read[stopped]["state"] == "T" and read[stopped]["source"] == "py-spy --nonblocking"
    main = next(t for t in read[stopped]["threads"] if t["name"] == "MainThread")
    assert [f[0] for f in main["frames"]] == ["update_actor", "execute", "<module>"]
    (hang,) = [f for f in doc["diagnosis"]["findings"] if f["rule"] == "job.hang"]
    assert any(
        e.startswith(
            f"stack of pid {stopped} (actor/rollout) on {d.addr}:{d.port}, read by py-spy "
            "--nonblocking "
        )
        and "(the process is stopped (T)): MainThread at update_actor (<string>:3) < execute "
        "(<string>:5)"
        in e
        for e in hang["evidence"]
    ), hang["evidence"]
    text = (out / "stacks.txt").read_text()
    assert "== actor/rollout: " in text and "update_actor (<string>:3)" in text
    assert _state(stopped) == "T"  # still stopped: the snapshot resumed nothing


@pytest.mark.sshd
@pytest.mark.timeout(150)
def test_snapshot_stacks_reads_every_job_process_through_real_sshd(  # type: ignore[no-untyped-def]
    tmp_path: Path, ssh_keys, sshd_factory: SshdFactory, workers
) -> None:
    """`snapshot --stacks` with default thresholds (no hang within 4 s): every job process the
    agent lists is read, each role grouped; a replay has no process and is refused."""
    stopped, peer, critic = _hung_job(workers)
    d = sshd_factory.start()
    ssh = _ssh_args(tmp_path, d, ssh_keys)
    out = tmp_path / "bundle"
    run = _snapshot(out, f"root@{d.addr}:{d.port}", ssh, "--duration", "4", "--stacks")
    assert run.returncode == 0, run.stderr + run.stdout
    assert "(--stacks); py-spy attaches" in run.stderr
    doc = json.loads((out / "snapshot.json").read_text())
    assert doc["diagnosis"]["bottleneck"]["rule"] != "job.hang"
    read = {s["pid"]: s for s in doc["stacks"] if s["threads"]}
    assert {stopped, peer, critic} <= set(read)
    assert read[stopped]["state"] == "T" and read[critic]["state"] in ("S", "R")
    main = next(t for t in read[critic]["threads"] if t["name"] == "MainThread")
    assert main["frames"][0][0] == "update_critic"
    text = (out / "stacks.txt").read_text()
    assert "update_critic (<string>:3)" in text and "update_actor (<string>:3)" in text
    replay = Path(__file__).parent / "scenarios" / "job_hang" / "recording.ndjson"
    refused = subprocess.run(
        [sys.executable, "-m", "verl_top", "snapshot", "--replay", str(replay), "--stacks",
         "-o", str(tmp_path / "b2")],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    assert refused.returncode == 2 and "--stacks reads the job's processes on the nodes" in (
        refused.stderr
    )
    assert _state(stopped) == "T"


async def test_the_app_reads_the_hung_roles_stacks_once_and_shows_them(  # type: ignore[no-untyped-def]
    workers,
) -> None:
    """The live app on this machine (the real in-process agent, the real verl log followed):
    when job.hang leads it says py-spy pauses the processes, reads the actor role's stacks
    once (the stopped rank's without a pause), and shows them in the hang's evidence and on
    the stopped process's screen."""
    from verl_top.diagnosis.engine import Engine
    from verl_top.diagnosis.thresholds import Thresholds
    from verl_top.inputs import Inputs
    from verl_top.sources.local import LocalFollowSource, LocalSource
    from verl_top.sources.pipeline import Pipeline
    from verl_top.store import Store
    from verl_top.ui.app import VerlTopApp
    from verl_top.ui.process_screen import ProcessScreen

    stopped, peer, critic = _hung_job(workers)
    log = Path(__file__).parent / "fixtures" / "verl" / "real_h200_verl050_grpo_hf_40steps.log"
    store = Store()
    sources = [
        LocalSource(interval=0.2, backend="none", host="thisbox"),
        LocalFollowSource([("verl", str(log), True)], interval=0.2, host="thisbox"),
    ]
    inputs = Inputs(store=store, pipeline=Pipeline(store), sources=sources)
    app = VerlTopApp(inputs, refresh=0.2, engine=Engine(Thresholds(hang_min_s=1.0)), live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        evidence: list[str] = []
        for _ in range(300):  # the monitor looks every 5 s live: the lead, then the evidence
            await asyncio.sleep(0.1)
            lead = app.assessment.lead
            evidence = lead.evidence if lead is not None and lead.rule == "job.hang" else []
            if any(e.startswith(f"stack of pid {stopped} ") for e in evidence):
                break
        line = next(e for e in evidence if e.startswith(f"stack of pid {stopped} "))
        assert "read by py-spy --nonblocking " in line
        assert "(the process is stopped (T)): MainThread at " in line
        assert "update_actor (<string>:3)" in line
        read = {s.pid for s in store.stacks}
        assert {stopped, peer} <= read and critic not in read
        toasts = [str(n.message) for n in app._notifications]  # noqa: SLF001 - what was said
        said = [m for m in toasts if m.startswith("job.hang: reading the Python stacks")]
        assert len(said) == 1 and "pauses each process for the moment" in said[0]
        app.push_screen(ProcessScreen(store, sources, "thisbox", stopped))
        await pilot.pause()
        body = str(app.screen.query_one("#proc-stack").render())
        assert "Python stack (read " in body and "update_actor (<string>:3)" in body
        assert "read without pausing them" in body
    assert _state(stopped) == "T"
