"""--ray against a real Ray head started on 127.0.0.1 with token authentication.

The module starts ``ray start --head`` (CPU only, 2 CPUs, its own temp dir, every address on
127.0.0.1, ``RAY_AUTH_MODE=token``) and a small driver that creates actors named and classed as
in a verl job: an unnamed ``TaskRunner`` that prints a verl step line, ``abc123WorkerDict_0:0``,
``abc123WorkerDict_0:1``, ``abc123WorkerDict_1:0`` and a ``vLLMHttpServer`` named
``vllm_server_0_0``. verl-top then talks to the dashboard over HTTP exactly as to a real
cluster. Everything Ray started is stopped by pid at the end (never ``ray stop``, which would
stop every Ray on the machine).

Needs ``pip install "ray[default]"`` (.ci/run installs it); marked ``ray``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from verl_top.inputs import InputError, add_input_arguments, build_inputs
from verl_top.sources.http_client import run_blocking
from verl_top.sources.ray import Dashboard, RaySource, Token, fetch_view

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

RAY = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))

DRIVER = r"""
import json, os, sys
import ray

ray.init(address=sys.argv[1], logging_level="ERROR")


@ray.remote(num_cpus=0)
class TaskRunner:
    def run(self):
        print("step:1 - actor/pg_loss:0.5 - timing_s/step:12.5 - timing_s/gen:4.0", flush=True)
        return os.getpid()


@ray.remote(num_cpus=0)
class WorkerDict:
    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=0)
class vLLMHttpServer:
    def pid(self):
        return os.getpid()


runner = TaskRunner.remote()
names = ["abc123WorkerDict_0:0", "abc123WorkerDict_0:1", "abc123WorkerDict_1:0"]
workers = [WorkerDict.options(name=n).remote() for n in names]
server = vLLMHttpServer.options(name="vllm_server_0_0").remote()
pids = ray.get([runner.run.remote()] + [w.pid.remote() for w in workers] + [server.pid.remote()])
print("PIDS " + json.dumps(dict(zip(["TaskRunner", *names, "vllm_server_0_0"], pids))), flush=True)
sys.stdin.read()  # keep the job (and its actors) alive until the test closes stdin
"""


def _ray_missing() -> str:
    try:
        import ray  # noqa: F401
    except ImportError:
        return 'ray[default] is not installed (.ci/run installs it: pip install "ray[default]")'
    if not os.path.exists(RAY):
        return "the ray command is not on PATH next to this python"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayHead:
    url: str
    gcs: str
    token: str
    temp_dir: Path
    pids: dict[str, int]
    env: dict[str, str]


def _tree(pgid: int, temp_dir: Path) -> list[psutil.Process]:
    """Every process Ray started for this head: its process group, their children (workers
    call setsid), and anything whose command line names our temp dir."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == pgid or str(temp_dir) in " ".join(p.info["cmdline"] or []):
                found[p.pid] = p
    for p in list(found.values()):
        with contextlib.suppress(psutil.Error):
            for child in p.children(recursive=True):
                found[child.pid] = child
    found.pop(os.getpid(), None)
    return list(found.values())


def _stop(pgid: int, temp_dir: Path) -> None:
    procs = _tree(pgid, temp_dir)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    why = _ray_missing()
    if why:
        pytest.skip(why)
    # Short path: Ray's unix sockets live under it (107-byte limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="vtray", dir="/tmp"))
    token = secrets.token_hex(32)
    gcs_port, dash_port, client_port = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's switch for single-machine clusters: every address stays on 127.0.0.1.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        RAY,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash_port}",
        f"--ray-client-server-port={client_port}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--num-cpus=2",
        "--num-gpus=0",
        "--include-dashboard=true",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    t0 = time.monotonic()
    start = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    driver: subprocess.Popen[str] | None = None
    try:
        out, _ = start.communicate(timeout=90)
        assert start.returncode == 0, out.decode(errors="replace")[-3000:]
        script = temp_dir / "driver.py"
        script.write_text(DRIVER)
        driver = subprocess.Popen(
            [sys.executable, str(script), f"127.0.0.1:{gcs_port}"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert driver.stdout is not None
        pids: dict[str, int] = {}
        deadline = time.monotonic() + 90
        tail: list[str] = []
        while time.monotonic() < deadline:
            line = driver.stdout.readline()
            if not line:
                break
            tail.append(line)
            if line.startswith("PIDS "):
                pids = json.loads(line[5:])
                break
        assert pids, "driver did not start its actors:\n" + "".join(tail[-30:])
        print(f"ray head + driver ready in {time.monotonic() - t0:.1f} s")
        yield RayHead(
            url=f"http://127.0.0.1:{dash_port}",
            gcs=f"127.0.0.1:{gcs_port}",
            token=token,
            temp_dir=temp_dir,
            pids=pids,
            env=env,
        )
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.stdin.close()  # type: ignore[union-attr]
                driver.wait(5)
            if driver.poll() is None:
                driver.kill()
                driver.wait(5)
        _stop(start.pid, temp_dir)
        left = _tree(start.pid, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes left running: {[p.pid for p in left]}"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_input_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No token anywhere Ray (and verl-top) would look."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_missing_token_is_refused_with_the_way_to_fix_it(ray_head: RayHead, no_token) -> None:
    with pytest.raises(InputError) as err:
        build_inputs(_args("--ray", ray_head.url))
    message = str(err.value)
    assert "HTTP 401" in message and ray_head.url in message
    assert "RAY_AUTH_TOKEN" in message and "ray get-auth-token" in message


def test_wrong_token_is_refused_without_showing_it(ray_head: RayHead, no_token) -> None:
    with pytest.raises(InputError) as err:
        build_inputs(_args("--ray", ray_head.url, "--ray-token", "not-the-token"))
    message = str(err.value)
    assert "HTTP 403" in message and "--ray-token" in message
    assert "not-the-token" not in message


def test_token_file_from_home_is_used(ray_head: RayHead, no_token, tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(ray_head.token + "\n")
    inputs = build_inputs(_args("--ray", ray_head.url))
    (source,) = inputs.sources
    assert isinstance(source, RaySource)
    assert source.dash.token is not None and source.dash.token.origin.endswith("auth_token")


def test_nodes_and_actors_are_mapped(ray_head: RayHead) -> None:
    dash = Dashboard(ray_head.url, Token(ray_head.token, "test"))
    source = RaySource(dash, factory=lambda node: None)  # type: ignore[arg-type,return-value]
    view = run_blocking(lambda: fetch_view(dash, detail=True))
    (node,) = source.name_nodes(view)
    assert node.ip == "127.0.0.1" and node.is_head and node.alive and node.local
    assert node.hostname == socket.gethostname() and node.name == node.hostname
    assert node.gpus == 0.0
    assert view.extras[node.node_id].logs_dir.startswith(str(ray_head.temp_dir))

    from verl_top.sources.ray import map_actors

    actors = {a.name or a.class_name: a for a in map_actors(view.actors, {node.node_id: node})}
    pids = ray_head.pids
    assert set(actors) == set(pids)
    for key, pid in pids.items():
        assert actors[key].pid == pid and actors[key].host == node.name
    assert actors["TaskRunner"].role == "driver"
    assert actors["vllm_server_0_0"].role == "rollout"
    assert actors["vllm_server_0_0"].class_name == "vLLMHttpServer"
    assert (actors["vllm_server_0_0"].rank, actors["vllm_server_0_0"].local_rank) == (0, 0)
    ranks = {k: (a.role, a.group, a.rank) for k, a in actors.items() if "WorkerDict" in k}
    assert ranks == {
        "abc123WorkerDict_0:0": ("trainer", "abc123", 0),
        "abc123WorkerDict_0:1": ("trainer", "abc123", 1),
        "abc123WorkerDict_1:0": ("trainer", "abc123", 2),
    }


async def test_live_run_follows_the_driver_log_of_the_taskrunner(
    ray_head: RayHead, h200_trace: Path
) -> None:
    inputs = build_inputs(
        _args(
            "--ray",
            ray_head.url,
            "--ray-token",
            ray_head.token,
            "--interval",
            "0.25",
            "--backend",
            "replay",
            "--replay-trace",
            str(h200_trace),
        )
    )
    (source,) = inputs.sources
    assert isinstance(source, RaySource)
    store = inputs.store
    host = socket.gethostname()
    task = asyncio.create_task(source.run(inputs.pipeline.emit))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if store.steps and host in store.hosts and store.hosts[host].gpus:
                break
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not source.running, "node sources still running after the Ray source stopped"
    pid = ray_head.pids["TaskRunner"]
    log_host, _, path = store.ray_driver_log.partition(":")
    assert log_host == host
    assert path.startswith(str(ray_head.temp_dir)) and path.endswith(f"-{pid}.out")
    assert os.path.isfile(path) and "step:1 -" in Path(path).read_text()
    # The step line went: TaskRunner stdout -> worker-*.out -> local agent -> verl parser.
    assert [s.step for s in store.steps] == [1]
    assert store.steps[0].metrics["timing_s/step"] == 12.5
    assert store.hosts[host].state == "up" and store.hosts[host].gpus  # the local node
    worker = store.ray_actor(host, ray_head.pids["abc123WorkerDict_0:1"])
    assert worker is not None and (worker.role, worker.rank) == ("trainer", 1)
    assert [n.name for n in store.ray_nodes] == [host]
    assert any("following the driver log" in n for n in store.notes)
