"""Process title -> verl role and rank (verl_top/roles.py).

Titles marked REAL are quoted from verl.md §5 (verl's source and issue #302) or from the real
driver logs in /work/shared/fixtures/verl/ (Ray's ``(Actor pid=…)`` log prefixes, ANSI colour
included). Titles marked CONSTRUCTED follow a naming pattern documented in verl.md §5 or vLLM /
SGLang's process naming, with values made up.
"""

from __future__ import annotations

import pytest

from verl_top.inputs import demo_recording_path
from verl_top.model import GpuProcess, ProcessList
from verl_top.protocol import read_recording
from verl_top.roles import ROLES, Role, annotate, classify, title_rank, trainer_method

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
