"""Process title -> verl role and rank (verl_top/roles.py).

Titles marked REAL are quoted from verl.md §5 (verl's source and issue #302) or from the real
driver logs in /work/shared/fixtures/verl/ (Ray's ``(Actor pid=…)`` log prefixes, ANSI colour
included). Titles marked CONSTRUCTED follow a naming pattern documented in verl.md §5 or vLLM /
SGLang's process naming, with values made up.
"""

from __future__ import annotations

import pytest

from verl_top.inputs import demo_recording_path
from verl_top.model import GpuProcess, ProcessList, RayActor
from verl_top.protocol import read_recording
from verl_top.roles import (
    ROLES,
    Role,
    RoleMemory,
    annotate,
    annotate_verl,
    classify,
    config_roles,
    join_roles,
    process_map,
    title_rank,
    title_roles,
    trainer_method,
    verl_name,
)

REAL = [
    # issue #302 traceback: the trainer while it runs the sync rollout
    ("ray::WorkerDict.actor_rollout_generate_sequences()", Role("trainer", "generate_sequences")),
    ("ray::WorkerDict", Role("trainer", "")),  # idle WorkerDict (verl.md §5)
    ("VLLM::EngineCore", Role("rollout")),  # vLLM v1 engine core (verl.md §5)
    # real driver logs (fixtures/verl/real_*.log and verl_real_log_excerpt.txt)
    ("(TaskRunner pid=2664304) step:1 - actor/pg_loss:0.01", Role("driver")),
    ("(main_task pid=54569) step:0 - val/test_score/openai/gsm8k:0.0", Role("driver")),
    ('\x1b[36m(WorkerDict pid=55154)\x1b[0m   "eos_token_id": 151645,', Role("trainer")),
]

CONSTRUCTED = [
    ("ray::WorkerDict.actor_rollout_update_actor()", Role("trainer", "update_actor")),
    ("ray::WorkerDict.ref_compute_ref_log_prob()", Role("trainer", "compute_ref_log_prob")),
    ("ray::WorkerDict.critic_update_critic()", Role("trainer", "update_critic")),
    ("a1b2c3WorkerDict_0:3", Role("trainer")),  # Ray actor name <prefix>WorkerDict_<pg>:<rank>
    ("(WorkerDict pid=812, ip=10.0.0.2) loading model", Role("trainer")),
    ("ray::TaskRunner.run()", Role("driver")),
    (
        "python3 -m verl.trainer.main_ppo reward_model.enable=False "
        "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.agent.num_workers=8",
        Role("driver"),
    ),
    ("VLLM::Worker_TP3", Role("rollout")),
    ("VLLM::Worker_PP0_TP1", Role("rollout")),
    ("VllmWorker rank=2", Role("rollout")),
    ("ray::vLLMHttpServer.generate()", Role("rollout")),
    ("vllm_server_0_1", Role("rollout")),  # vLLMHttpServer actor name vllm_server_<replica>_<node>
    ("sglang_server_1_0", Role("rollout")),
    ("sglang::scheduler_TP1", Role("rollout")),
    ("ray::AgentLoopWorker.generate_sequences()", Role("agent_loop")),
    ("agent_loop_worker_3_1a2b3c4d", Role("agent_loop")),
    ("ray::RewardLoopWorker", Role("reward")),
    ("vllm_server_reward_0_0", Role("reward")),  # the RM's server (…_reward_…)
    ("ray::IDLE", Role("other")),
    ("python train.py --lr 1e-5", Role("other")),
    ("", Role("other")),
]


@pytest.mark.parametrize(("title", "expected"), REAL + CONSTRUCTED)
def test_classify(title: str, expected: Role) -> None:
    role = classify(title)
    assert role == expected
    assert role.role in ROLES


@pytest.mark.parametrize(
    ("bound", "method"),
    [  # the WorkerDict methods verl binds (verl.md §5)
        ("actor_rollout_update_actor", "update_actor"),
        ("actor_rollout_compute_log_prob", "compute_log_prob"),
        ("actor_rollout_generate_sequences", "generate_sequences"),
        ("ref_compute_ref_log_prob", "compute_ref_log_prob"),
        ("critic_compute_values", "compute_values"),
        ("critic_update_critic", "update_critic"),
        ("rm_compute_rm_score", "compute_rm_score"),
    ],
)
def test_trainer_method_strips_the_role_prefix(bound: str, method: str) -> None:
    assert trainer_method(bound) == method
    assert classify(f"ray::WorkerDict.{bound}()").method == method


def test_label_joins_role_and_method() -> None:
    assert classify("ray::WorkerDict.actor_rollout_update_actor()").label == "trainer:update_actor"
    assert classify("VLLM::EngineCore").label == "rollout"


@pytest.mark.parametrize(
    ("title", "rank"),
    [
        ("VLLM::Worker_TP3", 3),
        ("VLLM::Worker_PP0_TP1", 1),
        ("sglang::scheduler_TP12", 12),
        ("VllmWorker rank=2", 2),
        ("VLLM::EngineCore", None),
        ("ray::WorkerDict", None),
        ("TPU_NAME=x python", None),
    ],
)
def test_title_rank(title: str, rank: int | None) -> None:
    assert title_rank(title) == rank


def test_annotate_fills_role_and_rank_on_a_copy() -> None:
    procs = ProcessList(
        host="n1",
        t=1.0,
        procs=[
            GpuProcess(pid=1, gpu_index=0, cmd="ray::WorkerDict", env_rank=8, env_local_rank=0),
            # an engine process that inherited the actor's RANK: its title's TP rank wins
            GpuProcess(pid=2, gpu_index=0, cmd="VLLM::Worker_TP1", env_rank=8),
            GpuProcess(pid=3, gpu_index=1, cmd="VLLM::EngineCore", env_rank=5),
            GpuProcess(pid=4, gpu_index=1, cmd="python other.py"),
        ],
    )
    out = annotate(procs)
    assert [(p.role, p.rank) for p in out.procs] == [
        ("trainer", 8),
        ("rollout", 1),
        ("rollout", 5),
        ("other", None),
    ]
    assert out.host == "n1" and out.t == 1.0
    assert all(p.role == "" and p.rank is None for p in procs.procs)  # input untouched


def test_annotate_on_the_demo_recording_maps_every_gpu_process() -> None:
    records = [r for r in read_recording(demo_recording_path()) if isinstance(r, ProcessList)]
    by_host = {r.host: r for r in records}  # the last process list of each host
    for host, procs in by_host.items():
        out = annotate(procs).procs
        trainers = [p for p in out if p.role == "trainer"]
        rollouts = [p for p in out if p.role == "rollout"]
        assert len(trainers) == len(rollouts) == 8, host
        assert sorted(p.rank for p in trainers) == sorted(
            p.env_rank for p in procs.procs if p.env_rank is not None
        )
        assert sorted(p.rank for p in rollouts) == sorted(list(range(4)) * 2)  # 2 TP=4 engines


# -- verl's own names (issue 23) -------------------------------------------------------------
# REAL: titles sampled every second from /proc/PID/cmdline of verl 0.5.0's WorkerDict on the H200
# (tests/fixtures/real_h200/*/titles.txt.gz): no "()" in a live title.
LIVE_TITLES = [
    ("ray::WorkerDict.ref_init_model", Role("trainer", "init_model"), ("ref",)),
    (
        "ray::WorkerDict.actor_rollout_init_model",
        Role("trainer", "init_model"),
        ("actor", "rollout"),
    ),
    (
        "ray::WorkerDict.actor_rollout_generate_sequences",
        Role("trainer", "generate_sequences"),
        ("actor", "rollout"),
    ),
    (
        "ray::WorkerDict.actor_rollout_compute_log_prob",
        Role("trainer", "compute_log_prob"),
        ("actor", "rollout"),
    ),
    ("ray::WorkerDict.ref_compute_ref_log_prob", Role("trainer", "compute_ref_log_prob"), ("ref",)),
    (
        "ray::WorkerDict.actor_rollout_update_actor",
        Role("trainer", "update_actor"),
        ("actor", "rollout"),
    ),
    ("ray::WorkerDict", Role("trainer", ""), ()),
]


@pytest.mark.parametrize(("title", "role", "groups"), LIVE_TITLES)
def test_live_titles_name_the_method_and_the_worker_group(title, role, groups) -> None:  # type: ignore[no-untyped-def]
    assert classify(title) == role
    assert title_roles(title) == groups


def test_hybrid_worker_name_builds_up_from_its_titles() -> None:
    """The real run's order: ref and actor_rollout init, then generate/update: one process."""
    memory = RoleMemory()
    names = []
    for title, _, _ in LIVE_TITLES:
        seen = memory.see("vm", 2834, title)
        names.append(verl_name(title, seen))
    assert names[0] == "ref"  # only the reference policy's method seen yet
    assert names[1:] == ["actor/rollout/ref"] * (len(LIVE_TITLES) - 1)
    assert memory.see("vm", 9999, "ray::WorkerDict") == frozenset()  # another pid: nothing yet


@pytest.mark.parametrize(
    ("config", "roles"),
    [  # the keys as verl prints them (fixtures/real_h200/*/session: GRPO with use_kl_loss)
        (
            {"actor_rollout_ref.actor.use_kl_loss": True, "algorithm.adv_estimator": "grpo"},
            "actor/rollout/ref",
        ),  # fmt: skip
        (
            {"actor_rollout_ref.actor.use_kl_loss": False, "algorithm.adv_estimator": "grpo"},
            "actor/rollout",
        ),  # fmt: skip
        (
            {
                "algorithm.use_kl_in_reward": "True",
                "algorithm.adv_estimator": "gae",
                "reward_model.enable": True,
            },
            "actor/rollout/ref/critic/reward model",
        ),  # fmt: skip
        ({}, ""),
    ],
)
def test_config_names_the_colocated_roles(config: dict, roles: str) -> None:
    assert join_roles(config_roles(config)) == roles


@pytest.mark.parametrize(
    ("title", "name"),
    [
        ("ray::TaskRunner.run", "TaskRunner (driver)"),
        ("VLLM::Worker_TP1", "rollout (vLLM)"),
        ("sglang::scheduler_TP1", "rollout (SGLang)"),
        ("ray::vLLMHttpServer.generate()", "rollout server"),
        ("vllm_server_0_1", "rollout server"),
        ("ray::AgentLoopWorker.generate_sequences()", "agent-loop worker"),
        ("ray::RewardLoopWorker", "reward"),
        ("ray::IDLE", "Ray worker"),
        ("python train.py", ""),
    ],
)
def test_other_processes_named(title: str, name: str) -> None:
    assert verl_name(title) == name


def test_annotate_verl_fills_name_and_method_and_keeps_a_recorded_name() -> None:
    procs = ProcessList(
        host="vm",
        t=1.0,
        procs=[GpuProcess(pid=2834, gpu_index=0, cmd="ray::WorkerDict.actor_rollout_update_actor")],
    )
    out = annotate_verl(
        procs, RoleMemory(), config_roles({"actor_rollout_ref.actor.use_kl_loss": True})
    )
    (p,) = out.procs
    assert (p.role, p.verl_role, p.method) == ("trainer", "actor/rollout/ref", "update_actor")
    # A replayed record already carries its name: a fresh memory and no config keep it.
    (q,) = annotate_verl(out, RoleMemory()).procs
    assert q.verl_role == "actor/rollout/ref"


def test_process_map_merges_gpus_and_adds_ray_actors_without_a_gpu() -> None:
    procs = ProcessList(
        host="n1",
        t=1.0,
        procs=[
            GpuProcess(pid=10, gpu_index=1, used_mib=1000.0, cmd="VLLM::Worker_TP1"),
            GpuProcess(pid=10, gpu_index=0, used_mib=500.0, cmd="VLLM::Worker_TP1"),
            GpuProcess(pid=11, gpu_index=2, cmd="ray::WorkerDict", rank=2),
        ],
    )
    actors = [
        RayActor(name="", class_name="TaskRunner", host="n1", pid=5, role="driver"),
        RayActor(
            name="x_register_center",
            class_name="WorkerGroupRegisterCenter",
            host="n1",
            pid=6,
            role="other",
        ),  # fmt: skip
        RayActor(
            name="xWorkerDict_0:2", class_name="WorkerDict", host="n1", pid=11, role="trainer"
        ),
    ]
    by_pid = {m.pid: m for m in process_map({"n1": procs}, actors)}
    assert by_pid[10].gpus == (0, 1) and by_pid[10].gpu_mem_mib == 1500.0
    assert by_pid[10].verl_role == "rollout (vLLM)" and by_pid[10].source == "gpu"
    assert by_pid[11].gpus == (2,) and by_pid[11].rank == 2  # on a GPU: not repeated from Ray
    assert (
        by_pid[5].label == "TaskRunner (driver)"
        and by_pid[5].gpus == ()
        and by_pid[5].source == "ray"
    )
    assert by_pid[6].verl_role == "register center"
    assert len(by_pid) == 4
