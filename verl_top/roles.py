"""Which verl role a GPU process plays, and its rank.

verl runs as Ray actors whose process titles name them (verl.md §5): ``ray::WorkerDict`` (idle)
or ``ray::WorkerDict.<role>_<method>()`` (busy) for the trainer side (actor, ref, critic and the
sync rollout all live in that process), vLLM / SGLang engine processes for the async rollout,
``TaskRunner`` (``main_task`` in verl <= 0.3) for the driver, ``AgentLoopWorker`` for the agent
loop and reward workers. The same names appear as Ray actor names (``vllm_server_0_1``) and as
the ``(ActorClass pid=…)`` prefix of Ray log lines, so ``classify`` accepts all three forms.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from verl_top.model import GpuProcess, ProcessList
from verl_top.verl.parse import strip_ansi

ROLES: tuple[str, ...] = ("trainer", "rollout", "driver", "agent_loop", "reward", "other")

# WorkerDict binds methods as ``<role>_<method>``; the longest role prefix must be tried first.
_WORKER_ROLE_PREFIXES: tuple[str, ...] = (
    "actor_rollout_ref_",
    "actor_rollout_",
    "rollout_",
    "actor_",
    "critic_",
    "ref_",
    "rm_",
)

# Ray log prefix: "(TaskRunner pid=123)" or "(WorkerDict pid=55154, ip=10.0.0.2)".
_LOG_PREFIX = re.compile(r"^\((?P<actor>[\w.:-]+) pid=\d+(?:, ip=[\d.:a-fA-F]+)?\)")
_WORKER_DICT = re.compile(r"^(?:ray::)?(?:\w{6})?WorkerDict(?:_\d+:\d+)?(?:\.(?P<method>\w+)\(\))?")
_TP_RANK = re.compile(r"(?:^|[_\s:-])TP(\d+)(?![\d])")
_VLLM_RANK = re.compile(r"VllmWorker[ -]rank=(\d+)|VllmWorker-(\d+)")

# Reward actors and reward-model servers; not any text with "reward" in it (a driver's command
# line carries reward_model.* overrides).
_REWARD = re.compile(
    r"^(?:ray::)?Reward\w*|\bReward\w*(?:Worker|Manager)\b|reward_loop_worker"
    r"|(?:vllm|sglang)_server_\w*reward|reward\w*_server_"
)
_AGENT_LOOP = re.compile(r"AgentLoopWorker|agent_loop_worker|AgentLoopManager")
_DRIVER = re.compile(
    r"^(?:ray::)?(?:TaskRunner|main_task)\b|verl\.trainer\.main_\w+|\bmain_ppo\b|\bmain_task\b"
)
_ROLLOUT = re.compile(
    r"^VLLM::|^vllm[ :]|VllmWorker|vLLMHttpServer|vLLMAsyncRollout|AsyncvLLMServer|vllm_server_"
    r"|vllm\.entrypoints|\bvllm serve\b"
    r"|^sglang::|SGLangHttpServer|AsyncSglangServer|sglang_server_|sglang\.launch_server",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Role:
    """A process's verl role and, for the trainer, the method it is running ("" = idle)."""

    role: str
    method: str = ""

    @property
    def label(self) -> str:
        """``role`` with the method when there is one, e.g. ``trainer:update_actor``."""
        return f"{self.role}:{self.method}" if self.method else self.role


def _clean(cmd: str) -> tuple[str, str]:
    """The title without colour codes, and the Ray log-prefix actor class when there is one."""
    text = strip_ansi(cmd or "").strip()
    m = _LOG_PREFIX.match(text)
    if m:
        return text[m.end() :].strip(), m.group("actor")
    return text, ""


def trainer_method(bound: str) -> str:
    """The phase name of a WorkerDict method: ``actor_rollout_update_actor`` -> ``update_actor``."""
    for prefix in _WORKER_ROLE_PREFIXES:
        if bound.startswith(prefix) and len(bound) > len(prefix):
            return bound[len(prefix) :]
    return bound


def classify(cmd: str) -> Role:
    """The verl role of a process from its title / command line / Ray actor name / log prefix."""
    text, actor = _clean(cmd)
    # A log prefix names the actor class; the rest of the line is log text, not a title.
    subject = actor or text
    m = _WORKER_DICT.match(subject)
    if m:
        return Role("trainer", trainer_method(m.group("method") or ""))
    # The driver's command line names every other role in its overrides: match it first.
    if _DRIVER.search(subject):
        return Role("driver")
    if _AGENT_LOOP.search(subject):
        return Role("agent_loop")
    # Reward before rollout: a reward model served by vLLM is named vllm_server_reward_….
    if _REWARD.search(subject):
        return Role("reward")
    if _ROLLOUT.search(subject):
        return Role("rollout")
    return Role("other")


def title_rank(cmd: str) -> int | None:
    """The rank an engine process carries in its title (``VLLM::Worker_TP3`` -> 3), if any."""
    text, _ = _clean(cmd)
    m = _TP_RANK.search(text)
    if m:
        return int(m.group(1))
    m = _VLLM_RANK.search(text)
    if m:
        return int(m.group(1) or m.group(2))
    return None


def process_rank(proc: GpuProcess, role: Role) -> int | None:
    """A process's rank: the TP rank in a rollout engine's title, else RANK from its environment.

    A rollout engine's own title wins over ``env_rank`` because engine processes may inherit the
    ``RANK`` of the Ray actor that spawned them, which is not their rank inside the engine.
    """
    if role.role == "rollout":
        rank = title_rank(proc.cmd)
        if rank is not None:
            return rank
    return proc.env_rank


def annotate(procs: ProcessList) -> ProcessList:
    """A copy of ``procs`` with ``role`` and ``rank`` filled on every process."""
    out: list[GpuProcess] = []
    for p in procs.procs:
        role = classify(p.cmd)
        out.append(dataclasses.replace(p, role=role.role, rank=process_rank(p, role)))
    return dataclasses.replace(procs, procs=out)
