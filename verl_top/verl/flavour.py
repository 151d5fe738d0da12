"""Which verl, which trainer mode, which rollout engine, backend and device a job runs.

The same log line means different things in different trainers (``timing_s/gen`` is generation
time in the legacy and V1 sync trainers, the trainer's wait in every async mode), so every
surface and rule first asks ``VerlFlavour``. It is told from what the job itself printed:

- the resolved config (``trainer.use_v1``, ``trainer.v1.trainer_mode``, ``async_training.*``,
  top-level ``rollout.*`` pools, ``actor_rollout_ref.rollout.name``, ``actor.strategy``,
  ``trainer.device``);
- the Ray prefixes of the step and config lines (``(TaskRunnerV1 pid=N)``,
  ``(OneStepTaskRunner pid=N)``, ``(FullyAsyncTrainer pid=N)``, ``(TaskRunner pid=N)``);
- the keys of the step lines (``timing_s/generate_async``, ``fully_async/*``, the doubled
  ``timing_s/timing_s/param_sync``...), which also bound the verl version through the key
  catalogue (verl_top/data/verl_keys.yaml: since/until of each key);
- the Ray actors' class names when ``--ray`` lists them.

Each conclusion keeps the clue it rests on (``VerlFlavour.evidence``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_top.verl.keys import ASYNC_MODES, MODE_NAMES, MODES, catalogue

if TYPE_CHECKING:
    from verl_top.store import Store

# Ray actor classes (line prefixes and ``--ray`` actor lists) that name a trainer.
FULLY_ASYNC_ACTORS = frozenset({"FullyAsyncTrainer", "FullyAsyncTaskRunner", "FullyAsyncRollouter"})
ONE_STEP_ACTORS = frozenset({"OneStepTaskRunner", "OneStepOffRayTrainer"})
V1_ACTORS = frozenset({"TaskRunnerV1"})
LEGACY_ACTORS = frozenset({"TaskRunner", "main_task"})
ENGINE_ACTORS: dict[str, str] = {
    "vLLMHttpServer": "vllm",
    "vLLMReplica": "vllm",
    "SGLangHttpServer": "sglang",
    "SGLangReplica": "sglang",
    "TRTLLMHttpServer": "trtllm",
    "TRTLLMReplica": "trtllm",
}
ENGINES = ("vllm", "sglang", "trtllm", "hf")
BACKENDS = ("fsdp", "fsdp2", "megatron", "veomni", "torchtitan")
# Keys only the legacy trainer prints (the V1 trainer has no profiler timers and no agent loop).
LEGACY_ONLY_KEYS = ("timing_s/start_profile", "timing_s/agent_loop/", "timing/")
ONE_STEP_KEYS = (
    "timing_s/generate_async",
    "timing_s/sync_rollout_weights",
    "timing_s/wait_prev_gen",
)
FULLY_ASYNC_KEYS = (
    "fully_async/",
    "timing_s/timing_s/param_sync",
    "trainer/idle_ratio",
    "rollouter/idle_ratio",
)
OLDEST_TAG_READ = "v0.4.0"  # the catalogue starts there: a key seen at it may be older still
NEWEST_TAG = (0, 9)
RECENT_STEPS = 8  # steps whose keys are read (enough to see both lines of a fully-async version)


@dataclass(frozen=True)
class Pools:
    """GPUs per resource pool as configured; None when the config does not say."""

    trainer: int | None = None
    rollout: int | None = None  # a standalone rollout pool (separate pools), else None
    reward: int | None = None  # a reward-model pool of its own

    @property
    def total(self) -> int | None:
        """All GPUs the job asked for, over every pool (None when the trainer's is unknown)."""
        if self.trainer is None:
            return None
        return self.trainer + (self.rollout or 0) + (self.reward or 0)

    def text(self) -> str:
        """``8 trainer + 8 rollout GPUs``."""
        parts = [
            f"{n} {name}"
            for name, n in (
                ("trainer", self.trainer),
                ("rollout", self.rollout),
                ("reward", self.reward),
            )
            if n
        ]
        return " + ".join(parts) + " GPUs" if parts else ""


@dataclass(frozen=True)
class VerlFlavour:
    """What the job is: verl versions it can be, trainer mode, engine, backend, device, pools."""

    version_low: tuple[int, int] | None = None
    version_high: tuple[int, int] | None = None
    trainer_mode: str | None = None  # one of keys.MODES, None when nothing tells
    engine: str | None = None  # vllm | sglang | trtllm | hf | a fork's name
    backend: str | None = None  # fsdp | fsdp2 | megatron | veomni | torchtitan
    device: str = "gpu"  # gpu | npu
    pools: Pools = field(default_factory=Pools)
    evidence: tuple[str, ...] = ()

    @property
    def is_async(self) -> bool:
        """True in every mode where ``timing_s/gen`` is the trainer's wait, not generation."""
        return self.trainer_mode in ASYNC_MODES

    @property
    def separate_pools(self) -> bool:
        """Trainer and rollout on different GPUs (separate_async, one-step-off, fully async)."""
        return self.trainer_mode in ("separate_async", "one_step_off", "fully_async")

    @property
    def version_range(self) -> str:
        """``0.9``, ``0.8-0.9``, ``<= 0.7``, ``0.5-0.6``; ``unknown`` when nothing tells."""
        low, high = self.version_low, self.version_high
        if low is None and high is None:
            return "unknown"
        if low is not None and high is not None and low > high:
            return "mixed (a fork?)"
        lo = f"{low[0]}.{low[1]}" if low else None
        hi = f"{high[0]}.{high[1]}" if high else None
        if lo and (hi is None or high == NEWEST_TAG):
            return lo if low == NEWEST_TAG else f"{lo}-{NEWEST_TAG[0]}.{NEWEST_TAG[1]}"
        if lo is None:
            return f"<= {hi}"
        return lo if lo == hi else f"{lo}-{hi}"

    @property
    def mode_name(self) -> str:
        """The trainer mode for people (``V1 separate_async``), ``unknown trainer``."""
        return MODE_NAMES.get(self.trainer_mode or "", "unknown trainer")

    def text(self) -> str:
        """One line for the header and reports: ``verl 0.9 · V1 sync · vllm · fsdp2 · 8 GPUs``."""
        return describe(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """The ``verl`` object of ``diagnose --json`` and snapshot.json."""
        return {
            "version_range": self.version_range,
            "trainer_mode": self.trainer_mode,
            "engine": self.engine,
            "backend": self.backend,
            "device": self.device,
            "pools": {
                "trainer": self.pools.trainer,
                "rollout": self.pools.rollout,
                "reward": self.pools.reward,
                "total": self.pools.total,
            },
            "evidence": list(self.evidence),
        }


def describe(verl: Mapping[str, Any]) -> str:
    """One line from a flavour's ``as_dict`` (or the ``verl`` object of ``diagnose --json``):
    ``verl 0.8-0.9 · fully async · vllm · megatron · 16 trainer + 16 rollout GPUs``."""
    mode = verl.get("trainer_mode")
    parts = [
        f"verl {verl.get('version_range') or 'unknown'}",
        MODE_NAMES.get(mode or "", "unknown trainer"),
    ]
    parts += [str(p) for p in (verl.get("engine"), verl.get("backend")) if p]
    if verl.get("device") == "npu":
        parts.append("Ascend NPU")
    pools = verl.get("pools") or {}
    text = Pools(pools.get("trainer"), pools.get("rollout"), pools.get("reward")).text()
    if text:
        parts.append(text)
    return " · ".join(parts)


def _num(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _true(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _product(config: Mapping[str, Any], per: str, nodes: str) -> int | None:
    n_per, n_nodes = _num(config.get(per)), _num(config.get(nodes))
    if n_per is None or n_nodes is None or n_per <= 0 or n_nodes <= 0:
        return None
    return n_per * n_nodes


def _tag(text: str) -> tuple[int, int] | None:
    """``v0.8.0`` -> (0, 8); tags of main (``main-...``) come after the newest release."""
    if text.startswith("main"):
        return (NEWEST_TAG[0], NEWEST_TAG[1] + 1)
    parts = text.lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _has(keys: Iterable[str], prefixes: tuple[str, ...]) -> str | None:
    """The first key that starts with one of ``prefixes``."""
    return next((k for k in keys if k.startswith(prefixes)), None)


@dataclass
class _Clues:
    """What detection collects: a version window and the reasons behind each conclusion."""

    low: tuple[int, int] | None = None
    high: tuple[int, int] | None = None
    evidence: list[str] = field(default_factory=list)

    def bound(self, low: tuple[int, int] | None, high: tuple[int, int] | None, why: str) -> None:
        changed = False
        if low is not None and (self.low is None or low > self.low):
            self.low, changed = low, True
        if high is not None and (self.high is None or high < self.high):
            self.high, changed = high, True
        if changed:
            self.evidence.append(why)


def _versions(clues: _Clues, config: Mapping[str, Any], keys: frozenset[str]) -> None:
    """Bound the verl version by the keys' first/last releases and the config's keys."""
    cat = catalogue()
    for key in sorted(keys):
        info = cat.keys.get(key)
        if info is None:
            continue
        low = None if info.since == OLDEST_TAG_READ else _tag(info.since)
        high = _tag(info.until) if info.until else None
        if low or high:
            clues.bound(low, high, f"step key {key} ({info.versions})")
    if _has(keys, ("timing/",)):
        clues.bound(None, (0, 2), "timing/ prefix (verl <= 0.2; timing_s/ from 0.3)")
    if "trainer.use_v1" in config:
        clues.bound((0, 9), None, "config has trainer.use_v1 (verl >= 0.9)")


def _mode(
    clues: _Clues, config: Mapping[str, Any], actors: frozenset[str], keys: frozenset[str]
) -> str | None:
    """The trainer mode: experimental trainers first (their configs inherit trainer.use_v1)."""
    hit = actors & FULLY_ASYNC_ACTORS
    key = _has(keys, FULLY_ASYNC_KEYS)
    if hit or key or any(k.startswith("async_training.") for k in config):
        why = (
            f"Ray actor {sorted(hit)[0]}"
            if hit
            else f"step key {key}"
            if key
            else "config async_training.*"
        )
        clues.evidence.append(f"fully async: {why}")
        return "fully_async"
    hit = actors & ONE_STEP_ACTORS
    key = _has(keys, ONE_STEP_KEYS)
    if hit or key:
        why = f"Ray actor {sorted(hit)[0]}" if hit else f"step key {key}"
        clues.evidence.append(f"one-step-off: {why}")
        return "one_step_off"
    v1 = _true(config.get("trainer.use_v1"))
    if actors & V1_ACTORS or v1:
        why = "Ray actor TaskRunnerV1" if actors & V1_ACTORS else "config trainer.use_v1=True"
        clues.bound((0, 9), None, f"V1 trainer: {why}")
        mode = str(config.get("trainer.v1.trainer_mode") or "")
        if mode in MODES:
            clues.evidence.append(f"trainer.v1.trainer_mode={mode}")
            return mode
        clues.evidence.append("V1 trainer, mode not in the config read")
        return None
    legacy = actors & LEGACY_ACTORS
    key = _has(keys, LEGACY_ONLY_KEYS)
    if legacy or v1 is False or key or (config and "trainer.use_v1" not in config):
        why = (
            f"Ray actor {sorted(legacy)[0]}"
            if legacy
            else "config trainer.use_v1=False"
            if v1 is False
            else f"step key {key}"
            if key
            else "config without trainer.use_v1 (verl <= 0.8)"
        )
        if not legacy and v1 is None and not key:
            clues.bound(None, (0, 8), why)
        clues.evidence.append(f"legacy trainer: {why}")
        return "legacy"
    return None


def _engine(config: Mapping[str, Any], actors: frozenset[str]) -> str | None:
    name = config.get("actor_rollout_ref.rollout.name")
    if isinstance(name, str) and name and name != "???":
        return name.lower()
    for actor, engine in ENGINE_ACTORS.items():
        if actor in actors:
            return engine
    return None


def _pools(config: Mapping[str, Any], mode: str | None) -> Pools:
    trainer = _product(config, "trainer.n_gpus_per_node", "trainer.nnodes")
    rollout = None
    if mode in ("one_step_off", "fully_async"):
        rollout = _product(config, "rollout.n_gpus_per_node", "rollout.nnodes") or _product(
            config, "actor_rollout_ref.rollout.n_gpus_per_node", "actor_rollout_ref.rollout.nnodes"
        )
    elif mode == "separate_async":
        rollout = _product(
            config, "actor_rollout_ref.rollout.n_gpus_per_node", "actor_rollout_ref.rollout.nnodes"
        )
    reward = None
    if _true(config.get("reward.reward_model.enable_resource_pool")) and _true(
        config.get("reward.reward_model.enable")
    ):
        reward = _product(
            config, "reward.reward_model.n_gpus_per_node", "reward.reward_model.nnodes"
        )
    return Pools(trainer, rollout, reward)


def detect(
    config: Mapping[str, Any] | None = None,
    actors: Iterable[str] = (),
    step_keys: Iterable[str] = (),
) -> VerlFlavour:
    """Tell the flavour from a flat config (dotted keys), the Ray actor class names seen (line
    prefixes, ``--ray``) and the keys of recent step lines. Never raises."""
    config = config or {}
    actor_set = frozenset(actors)
    keys = frozenset(step_keys)
    clues = _Clues()
    mode = _mode(clues, config, actor_set, keys)
    _versions(clues, config, keys)
    backend = config.get("actor_rollout_ref.actor.strategy")
    device = str(config.get("trainer.device") or "").lower()
    return VerlFlavour(
        version_low=clues.low,
        version_high=clues.high,
        trainer_mode=mode,
        engine=_engine(config, actor_set),
        backend=str(backend).lower() if isinstance(backend, str) and backend else None,
        device="npu" if device == "npu" else "gpu",
        pools=_pools(config, mode),
        evidence=tuple(clues.evidence),
    )


def _store_inputs(store: Store) -> tuple[frozenset[str], frozenset[str]]:
    """(actor class names, keys of the recent steps) the store holds."""
    actors: set[str] = set()
    for stats in getattr(store, "log_stats", {}).values():
        actors.update(str(a) for a in stats.get("actors", ()) or ())
    actors.update(a.class_name for a in getattr(store, "ray_actors", ()) if a.class_name)
    steps = list(store.steps)[-RECENT_STEPS:]
    keys = frozenset(k for s in steps for k in s.metrics)
    return frozenset(actors), keys


def store_flavour(store: Store) -> VerlFlavour:
    """The flavour of the job in ``store``, kept in ``store.verl_flavour`` until its inputs
    (config, latest step, actors seen) change."""
    last = store.steps[-1] if store.steps else None
    stats = getattr(store, "log_stats", {})
    sig = (
        id(store.config),
        len(store.config),
        len(store.steps),
        id(last),
        tuple(len(s.get("actors", ()) or ()) for s in stats.values()),
        len(getattr(store, "ray_actors", ())),
    )
    kept = getattr(store, "verl_flavour", None)
    if isinstance(kept, tuple) and kept[0] == sig:
        return kept[1]
    actors, keys = _store_inputs(store)
    flavour = detect(store.config, actors, keys)
    store.verl_flavour = (sig, flavour)
    return flavour
