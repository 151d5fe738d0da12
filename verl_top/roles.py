"""Which verl role a process of the job plays (GPU processes and the agent's job processes),
and its rank.

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
from collections.abc import Mapping
from dataclasses import dataclass

from verl_top.model import GpuProcess, JobProcess, ProcessList, RayActor
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
# A live title has no "()" ("ray::WorkerDict.actor_rollout_generate_sequences", seen on the real
# job); tracebacks and verl.md quote it with "()".
_WORKER_DICT = re.compile(
    r"^(?:ray::)?(?:\w{6})?WorkerDict(?:_\d+:\d+)?(?:\.(?P<method>\w+)(?:\(\))?)?"
)
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


# The verl roles a WorkerDict method prefix belongs to (verl's Role enum: ActorRolloutRef,
# ActorRollout, Actor, Rollout, RefPolicy, Critic, RewardModel), in verl's order.
_GROUP_ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("actor_rollout_ref_", ("actor", "rollout", "ref")),
    ("actor_rollout_", ("actor", "rollout")),
    ("rollout_", ("rollout",)),
    ("actor_", ("actor",)),
    ("critic_", ("critic",)),
    ("ref_", ("ref",)),
    ("rm_", ("reward model",)),
)
VERL_ROLE_ORDER: tuple[str, ...] = ("actor", "rollout", "ref", "critic", "reward model")
_SERVER = re.compile(r"HttpServer|_server_|Async\w*Server|launch_server|vllm serve", re.IGNORECASE)
# What the other processes are called, by coarse role (Ray class names where verl has one).
_OTHER_NAMES = {
    "driver": "TaskRunner (driver)",
    "agent_loop": "agent-loop worker",
    "reward": "reward",
}


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
    """A copy of ``procs`` with ``role`` and ``rank`` filled on every GPU process, and verl's
    name of each job process in its ``role``."""
    out: list[GpuProcess] = []
    for p in procs.procs:
        role = classify(p.cmd)
        out.append(dataclasses.replace(p, role=role.role, rank=process_rank(p, role)))
    jobs = [dataclasses.replace(j, role=verl_name(j.title)) for j in procs.job_procs]
    return dataclasses.replace(procs, procs=out, job_procs=jobs)


def worker_roles(bound: str) -> tuple[str, ...]:
    """The verl roles of a WorkerDict method: ``ref_compute_ref_log_prob`` -> ``("ref",)``."""
    for prefix, roles in _GROUP_ROLES:
        if bound.startswith(prefix):
            return roles
    return ()


def join_roles(roles: set[str] | frozenset[str] | tuple[str, ...]) -> str:
    """verl's roles in verl's order, slash-joined: ``actor/rollout/ref``."""
    return "/".join(r for r in VERL_ROLE_ORDER if r in roles)


def title_roles(cmd: str) -> tuple[str, ...]:
    """The verl roles a WorkerDict's current title names (empty for other processes)."""
    text, actor = _clean(cmd)
    m = _WORKER_DICT.match(actor or text)
    return worker_roles(m.group("method") or "") if m else ()


def verl_name(cmd: str, seen: frozenset[str] = frozenset()) -> str:
    """What verl calls the process: ``actor/rollout/ref`` for a hybrid WorkerDict (its current
    method's roles plus ``seen``, those of methods seen before), ``TaskRunner (driver)``,
    ``rollout server``, ``agent-loop worker``, ``reward``; "" when it is no verl process."""
    role = classify(cmd)
    if role.role == "trainer":
        return join_roles(set(title_roles(cmd)) | seen) or "WorkerDict"
    text, actor = _clean(cmd)
    if role.role == "other":
        return "Ray worker" if text.startswith("ray::") else ""
    if role.role == "rollout":
        subject = actor or text
        if _SERVER.search(subject):
            return "rollout server"
        low = subject.lower()
        return (
            "rollout (vLLM)"
            if "vllm" in low
            else "rollout (SGLang)"
            if "sglang" in low
            else "rollout"
        )
    return _OTHER_NAMES.get(role.role, role.role)


class RoleMemory:
    """The verl roles each WorkerDict was seen serving: one title names one method's roles only
    (``generate_sequences`` -> actor/rollout), so the hybrid worker's full name
    (actor/rollout/ref) builds up over the first step. Keyed by (host, pid)."""

    def __init__(self, limit: int = 100_000) -> None:
        self._seen: dict[tuple[str, int], frozenset[str]] = {}
        self._limit = limit

    def see(
        self, host: str, pid: int, cmd: str, prior: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """Add what ``cmd`` names (and ``prior``: roles a recorded process already carried) to
        the pid's roles; returns all roles seen for it."""
        key = (host, pid)
        seen = self._seen.get(key, frozenset()) | frozenset(title_roles(cmd)) | prior
        if len(self._seen) >= self._limit and key not in self._seen:
            self._seen.clear()  # a bound, not a cache policy: pids of a job are few
        self._seen[key] = seen
        return seen


def _truthy(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def config_roles(config: Mapping[str, object]) -> frozenset[str]:
    """The roles verl's ``main_ppo`` colocates in each WorkerDict, from the job's config: it puts
    every worker group in one resource pool, so the hybrid worker holds actor and rollout, the
    reference policy when a KL term needs it, the critic for GAE, the reward model when enabled.
    Empty when the config is unknown (then only the titles seen name the roles)."""
    if not config:
        return frozenset()
    roles = {"actor", "rollout"}
    if _truthy(config.get("actor_rollout_ref.actor.use_kl_loss")) or _truthy(
        config.get("algorithm.use_kl_in_reward")
    ):
        roles.add("ref")
    if str(config.get("algorithm.adv_estimator", "")).lower() == "gae" or _truthy(
        config.get("critic.enable")
    ):
        roles.add("critic")
    if _truthy(config.get("reward_model.enable")):
        roles.add("reward model")
    return frozenset(roles)


def annotate_verl(
    procs: ProcessList,
    memory: RoleMemory | None = None,
    colocated: frozenset[str] = frozenset(),
) -> ProcessList:
    """``annotate`` plus verl's name for each process and the method it runs now; a WorkerDict's
    name joins the roles its titles named so far and ``colocated`` (``config_roles``)."""
    out: list[GpuProcess] = []
    for p in annotate(procs).procs:
        # A recorded process carries the name it had when recorded: keep what it knew.
        prior = frozenset(r for r in (p.verl_role or "").split("/") if r in VERL_ROLE_ORDER)
        if memory is not None:
            seen = memory.see(procs.host, p.pid, p.cmd, prior)
        else:
            seen = prior
        role = classify(p.cmd)
        if role.role == "trainer":
            seen = seen | colocated
        out.append(dataclasses.replace(p, verl_role=verl_name(p.cmd, seen), method=role.method))
    jobs: list[JobProcess] = []
    for j in procs.job_procs:
        prior = frozenset(r for r in j.role.split("/") if r in VERL_ROLE_ORDER)
        seen = memory.see(procs.host, j.pid, j.title, prior) if memory is not None else prior
        if classify(j.title).role == "trainer":
            seen = seen | colocated
        jobs.append(dataclasses.replace(j, role=verl_name(j.title, seen)))
    return dataclasses.replace(procs, procs=out, job_procs=jobs)


@dataclass(frozen=True)
class MappedProcess:
    """One process of the job on the map: a GPU process (its GPUs merged) or a Ray actor that
    holds no GPU (TaskRunner, register center)."""

    host: str
    pid: int | None
    verl_role: str
    method: str
    rank: int | None
    gpus: tuple[int, ...]
    gpu_mem_mib: float | None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    cmd: str = ""
    # "gpu": the node's GPU process list; "job": a job process without a GPU (the agent's
    # job-process list); "ray": a Ray actor without a GPU (the Ray dashboard)
    source: str = "gpu"
    state: str = ""  # R S D T Z ... from the agent's job-process list ("" = not reported)
    user: str = ""

    @property
    def label(self) -> str:
        """``actor/rollout/ref · generate_sequences`` (the method when there is one)."""
        name = self.verl_role or "-"
        return f"{name} · {self.method}" if self.method else name


def _ray_name(actor: RayActor) -> str:
    cls = actor.class_name.rsplit(".", 1)[-1]
    if actor.role == "driver":
        return _OTHER_NAMES["driver"]
    if cls == "WorkerGroupRegisterCenter":
        return "register center"
    if actor.role == "trainer":
        return "WorkerDict"
    return _OTHER_NAMES.get(actor.role, cls or actor.name or "Ray actor")


def _job_rank(j: JobProcess, ranks: dict[int, int]) -> int | None:
    """A job process's rank: its GPU process's, else the TP rank its engine title carries."""
    if j.pid in ranks:
        return ranks[j.pid]
    return title_rank(j.title) if classify(j.title).role == "rollout" else None


def process_map(
    procs: dict[str, ProcessList | None], actors: list[RayActor] | tuple[RayActor, ...] = ()
) -> list[MappedProcess]:
    """Every process of the job per host: GPU processes (one entry per pid, its GPUs and GPU
    memory summed), then the agent's job processes that hold no GPU, then Ray actors of the job
    that are neither, by host and pid. A GPU process carries its job-process state."""
    out: list[MappedProcess] = []
    seen: set[tuple[str, int]] = set()
    for host, plist in procs.items():
        if plist is None:
            continue
        jobs = {j.pid: j for j in plist.job_procs}
        by_pid: dict[int, list[GpuProcess]] = {}
        for p in plist.procs:
            by_pid.setdefault(p.pid, []).append(p)
        ranks: dict[int, int] = {}
        for pid, parts in sorted(by_pid.items()):
            first = parts[0]
            mems = [q.used_mib for q in parts if q.used_mib is not None]
            seen.add((host, pid))
            if first.rank is not None:
                ranks[pid] = first.rank
            job = jobs.get(pid)
            out.append(
                MappedProcess(
                    host=host,
                    pid=pid,
                    verl_role=first.verl_role or verl_name(first.cmd),
                    method=first.method or classify(first.cmd).method,
                    rank=first.rank,
                    gpus=tuple(sorted({q.gpu_index for q in parts})),
                    gpu_mem_mib=sum(mems) if mems else None,
                    cpu_pct=first.cpu_pct,
                    rss_bytes=first.rss_bytes,
                    cmd=first.cmd,
                    state=job.state if job is not None else "",
                    user=first.user,
                )
            )
        for pid, j in sorted(jobs.items()):
            if (host, pid) in seen:
                continue
            seen.add((host, pid))
            out.append(
                MappedProcess(
                    host=host,
                    pid=pid,
                    verl_role=j.role or verl_name(j.title),
                    method=classify(j.title).method,
                    rank=_job_rank(j, ranks),
                    gpus=tuple(j.gpus),
                    gpu_mem_mib=None,
                    cpu_pct=j.cpu_pct,
                    rss_bytes=j.rss_bytes,
                    cmd=j.title,
                    source="job",
                    state=j.state,
                    user=j.user,
                )
            )
    for a in sorted(actors, key=lambda a: (a.host, a.pid or 0)):
        if a.pid is not None and (a.host, a.pid) in seen:
            continue
        out.append(
            MappedProcess(
                host=a.host,
                pid=a.pid,
                verl_role=_ray_name(a),
                method="",
                rank=a.rank,
                gpus=(),
                gpu_mem_mib=None,
                cmd=a.class_name,
                source="ray",
            )
        )
    return out
