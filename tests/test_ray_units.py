"""--ray pieces without a cluster: address and token rules, parsing the real state-API replies
captured from Ray 2.60 (tests/fixtures/ray/), rank arithmetic, and the store/protocol side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_top.model import RayActor, RayActors, RayNode
from verl_top.protocol import Decoder, encode
from verl_top.sources.ray import (
    ClusterView,
    Dashboard,
    JobInfo,
    NodeSource,
    RayError,
    RaySource,
    Token,
    dashboard_url,
    find_token,
    map_actors,
    parse_nodes,
    parse_summary,
    pick_job,
    ray_version,
)
from verl_top.store import Store

FIX = Path(__file__).parent / "fixtures" / "ray"
DASH = Dashboard("http://head:8265")  # never asked: these tests only name and map


def NO_FACTORY(node: RayNode) -> NodeSource:  # noqa: N802 - a constant-like stand-in
    raise AssertionError("no node source is started in these tests")


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


# --- address --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("http://head:8265", "http://head:8265"),
        ("head", "http://head:8265"),
        ("head:9000", "http://head:9000"),
        ("10.0.0.5:8265/", "http://10.0.0.5:8265"),
        ("https://ray.example.org/proxy/", "https://ray.example.org:8265/proxy"),
        ("[::1]:8265", "http://[::1]:8265"),
    ],
)
def test_dashboard_url(given: str, url: str) -> None:
    assert dashboard_url(given, env={}) == (url, "")


@pytest.mark.parametrize("given", ["head:6379", "ray://head:10001", "head:10001"])
def test_gcs_and_client_addresses_become_the_dashboard_with_a_note(given: str) -> None:
    url, note = dashboard_url(given, env={})
    assert url == "http://head:8265"
    assert given in note and "http://head:8265" in note


def test_address_from_environment_in_rays_order() -> None:
    env = {"RAY_ADDRESS": "a:6379", "RAY_API_SERVER_ADDRESS": "http://b:8265"}
    assert dashboard_url("", env)[0] == "http://b:8265"
    assert dashboard_url(None, {"RAY_ADDRESS": "http://c:8265"})[0] == "http://c:8265"


@pytest.mark.parametrize(
    ("given", "env", "words"),
    [
        ("", {}, "RAY_ADDRESS"),
        ("auto", {}, "dashboard address"),
        ("", {"RAY_ADDRESS": "auto"}, "RAY_ADDRESS=auto"),
        ("ftp://head", {}, "not an http"),
        ("http://head:99999", {}, "99999"),
    ],
)
def test_unusable_addresses_say_why(given: str, env: dict, words: str) -> None:
    with pytest.raises(RayError) as err:
        dashboard_url(given, env)
    assert err.value.kind == "config" and words in str(err.value)


# --- token ----------------------------------------------------------------------------------


def test_token_precedence_follows_ray(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    path_file = tmp_path / "tok"
    path_file.write_text(" from-path \n")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(path_file)}
    assert find_token("from-flag", env, home) == Token("from-flag", "--ray-token")
    assert find_token(None, env, home).value == "from-env"  # type: ignore[union-attr]
    del env["RAY_AUTH_TOKEN"]
    token = find_token(None, env, home)
    assert (
        token is not None and token.value == "from-path" and "RAY_AUTH_TOKEN_PATH" in token.origin
    )
    token = find_token(None, {}, home)
    assert token is not None and token.value == "from-home"
    assert find_token(None, {}, tmp_path / "nobody") is None


def test_unreadable_or_empty_token_path_is_an_error_as_in_ray(tmp_path: Path) -> None:
    with pytest.raises(RayError, match="cannot read"):
        find_token(None, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(RayError, match="empty"):
        find_token(None, {"RAY_AUTH_TOKEN_PATH": str(empty)}, tmp_path)


# --- parsing real replies -------------------------------------------------------------------


def real_view() -> ClusterView:
    nodes = parse_nodes(load("nodes.json")["data"]["result"])
    extras = parse_summary(load("nodes_summary.json"))
    return ClusterView(nodes, load("actors.json")["data"]["result"]["result"], extras)


def test_real_nodes_reply_and_summary() -> None:
    view = real_view()
    (node,) = view.nodes
    assert node.ip == "127.0.0.1" and node.is_head and node.alive and node.gpus == 0.0
    extra = view.extras[node.node_id]
    assert extra.hostname == "vm"
    assert extra.logs_dir.startswith("/tmp/vtr1/session_") and extra.logs_dir.endswith("/logs")
    src = RaySource(DASH, NO_FACTORY, local_names={"127.0.0.1"})
    (named,) = src.name_nodes(view)
    assert (named.name, named.hostname, named.local) == ("vm", "vm", True)


def test_real_actors_reply_maps_roles_ranks_and_pids() -> None:
    view = real_view()
    src = RaySource(DASH, NO_FACTORY, local_names=set())
    nodes = {n.node_id: n for n in src.name_nodes(view)}
    actors = {a.name or a.class_name: a for a in map_actors(view.actors, nodes)}
    assert actors["TaskRunner"].role == "driver" and actors["TaskRunner"].pid == 16475
    assert actors["vllm_server_0_0"].role == "rollout"
    w0, w1 = actors["abc123WorkerDict_0:0"], actors["abc123WorkerDict_0:1"]
    assert (w0.role, w0.rank, w0.pid, w0.group) == ("trainer", 0, 16476, "abc123")
    assert (w1.rank, w1.pid) == (1, 16567)
    assert all(a.host == "vm" and a.node_ip == "127.0.0.1" for a in actors.values())


def _row(name: str, cls: str = "WorkerDict", pid: int = 1, state: str = "ALIVE") -> dict:
    return {"name": name, "class_name": cls, "pid": pid, "state": state, "node_id": "n"}


def test_worker_ranks_across_placement_groups_and_groups() -> None:
    names = [f"aaaaaaWorkerDict_{pg}:{lr}" for pg in range(3) for lr in range(4)]
    names += ["bbbbbbWorkerDict_0:0", "bbbbbbWorkerDict_0:1"]  # a second worker group (critic)
    rows = [_row(n) for n in reversed(names)]
    ranks = {a.name: a.rank for a in map_actors(rows, {})}
    assert [ranks[f"aaaaaaWorkerDict_{pg}:{lr}"] for pg in range(3) for lr in range(4)] == list(
        range(12)
    )
    assert (ranks["bbbbbbWorkerDict_0:0"], ranks["bbbbbbWorkerDict_0:1"]) == (0, 1)


def test_worker_ranks_when_a_node_left() -> None:
    # Placement group 1 is gone; equal sizes still give pg 2 its offset of 2 * 4.
    rows = [_row(f"aaaaaaWorkerDict_{pg}:{lr}") for pg in (0, 2) for lr in range(4)]
    ranks = sorted(a.rank for a in map_actors(rows, {}))  # type: ignore[type-var]
    assert ranks == [0, 1, 2, 3, 8, 9, 10, 11]


def test_roles_of_other_verl_actors_and_dead_ones_dropped() -> None:
    rows = [
        _row("sglang_server_1_0", "SGLangHttpServer"),
        _row("agent_loop_worker_3_1a2b3c4d", "AgentLoopWorker"),
        _row("", "RewardLoopWorker"),
        _row("abc123_register_center", "WorkerGroupRegisterCenter"),
        _row("vllm_server_0_0", "vLLMHttpServer", state="DEAD"),
    ]
    got = {(a.name or a.class_name): (a.role, a.rank) for a in map_actors(rows, {})}
    assert got == {
        "sglang_server_1_0": ("rollout", 1),
        "agent_loop_worker_3_1a2b3c4d": ("agent_loop", 3),
        "RewardLoopWorker": ("reward", None),
        "abc123_register_center": ("other", None),
    }


def test_names_are_stable_and_unique() -> None:
    src = RaySource(DASH, NO_FACTORY, local_names=set())
    a = RayNode("id-a", "10.0.0.1")
    b = RayNode("id-b", "10.0.0.2")
    from verl_top.sources.ray import NodeExtra

    same = {"id-a": NodeExtra("gpu"), "id-b": NodeExtra("gpu")}  # containers with one hostname
    assert [n.name for n in src.name_nodes(ClusterView([a, b], [], same))] == ["gpu", "10.0.0.2"]
    # The dashboard stops telling hostnames: names stay what they were.
    assert [n.name for n in src.name_nodes(ClusterView([a, b], [], {}))] == ["gpu", "10.0.0.2"]


# --- store and wire -------------------------------------------------------------------------


def test_ray_actors_record_round_trips_and_lands_in_the_store() -> None:
    rec = RayActors(
        host="ray:http://head:8265",
        t=100.0,
        nodes=[RayNode("n1", "10.0.0.1", name="gpu1", gpus=8.0, is_head=True)],
        actors=[
            RayActor("abcWorkerDict_0:3", "WorkerDict", host="gpu1", pid=42, role="trainer", rank=3)
        ],
        driver_log="gpu1:/tmp/ray/session_latest/logs/worker-x-ffffffff-7.out",
        note="Ray: following the driver log",
    )
    back = Decoder().decode(encode(rec))
    assert back == rec
    store = Store()
    store.ingest(back)
    store.ingest(back)  # the same note is not repeated
    assert store.ray_actor("gpu1", 42) is not None and store.ray_actor("gpu1", 42).rank == 3
    assert store.ray_actor("gpu2", 42) is None
    assert store.ray_nodes[0].gpus == 8.0 and store.ray_driver_log.startswith("gpu1:")
    assert list(store.notes) == ["Ray: following the driver log"]
    assert "ray:http://head:8265" not in store.hosts  # the dashboard is not a monitored host


# --- for a snapshot: the Ray version and the job's launch command ---------------------------


def test_version_and_job_from_the_real_replies() -> None:
    # version.json: {"ray_version": "2.60.0", ...}; jobs.json: one DRIVER job 01000000, RUNNING,
    # entrypoint "/root/.pyenv/versions/3.11.7/bin/python driver.py 127.0.0.1:46379".
    assert ray_version(load("version.json")) == "2.60.0"
    assert ray_version({"version": "4"}) == "" and ray_version(["2.60.0"]) == ""
    rows = load("jobs.json")["data"]["result"]["result"]
    entry = "/root/.pyenv/versions/3.11.7/bin/python driver.py 127.0.0.1:46379"
    assert pick_job(rows, "01000000") == JobInfo("01000000", entry)
    assert pick_job(rows) == JobInfo("01000000", entry)  # no TaskRunner id: the running one
    # The TaskRunner's job wins over a newer running one; finished jobs are never guessed.
    newer = {**rows[0], "job_id": "02000000", "entrypoint": "python other.py", "start_time": 9}
    done = {**rows[0], "job_id": "03000000", "status": "SUCCEEDED", "start_time": 99}
    assert pick_job([rows[0], newer, done], "01000000").job_id == "01000000"
    assert pick_job([rows[0], newer, done]).job_id == "02000000"
    assert pick_job([done]) is None and pick_job([{**rows[0], "entrypoint": ""}]) is None


def test_snapshot_environment_takes_ray_version_and_entrypoint_from_the_record() -> None:
    from verl_top.export.environment import collect_environment

    entry = "python3 -m verl.trainer.main_ppo data.train_batch_size=1024 trainer.n_gpus_per_node=8"
    rec = RayActors(
        host="ray:http://head:8265", t=1.0, ray_version="2.60.0", job_id="01000000",
        entrypoint=entry,
    )  # fmt: skip
    store = Store()
    store.ingest(Decoder().decode(encode(rec)))
    store.ingest(Decoder().decode(encode(RayActors(host=rec.host, t=2.0, note="later"))))
    env = collect_environment(store)
    ray = next(s for s in env.software if s.name == "Ray")
    assert (ray.version, ray.source) == ("2.60.0", "the Ray dashboard's /api/version")
    assert env.launch == entry and "Ray job 01000000" in env.launch_source
