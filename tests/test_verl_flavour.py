"""Which verl a job runs (version range, trainer mode, engine, backend, device, pools), told
from the config, the Ray prefixes of its lines, its step keys and its Ray actors; and the parts
of the log reading it rests on (prefix actors, NCCL lines inside the verl log, the two lines of
a fully-async version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.model import NcclInfo, RayActor, RayActors, VerlConfig, VerlStep
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.verl.flavour import describe, detect, store_flavour
from verl_top.verl.parse import VerlStreamParser, parse_file

FIX = Path(__file__).parent / "fixtures" / "verl09"
REAL = Path(__file__).parent / "fixtures" / "verl"
REAL_LOGS = Path(__file__).parent / "fixtures" / "real_logs"
V1 = {"trainer.use_v1": True, "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1}


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_v1_mode_from_the_config(mode: str) -> None:
    fl = detect({**V1, "trainer.v1.trainer_mode": mode})
    assert fl.trainer_mode == mode and fl.version_range == "0.9"
    assert fl.is_async == (mode != "sync")


def test_experimental_trainers_win_over_the_inherited_use_v1() -> None:
    """one-step-off and fully-async configs inherit trainer.use_v1/trainer_mode=sync from
    ppo_trainer.yaml: their own clues must decide."""
    cfg = {**V1, "trainer.v1.trainer_mode": "sync"}
    assert detect(cfg, actors=["OneStepTaskRunner"]).trainer_mode == "one_step_off"
    assert detect(cfg, step_keys=["timing_s/generate_async"]).trainer_mode == "one_step_off"
    assert detect({**cfg, "async_training.staleness_threshold": 0.1}).trainer_mode == "fully_async"
    assert detect(cfg, actors=["FullyAsyncTrainer"]).trainer_mode == "fully_async"


@pytest.mark.parametrize(
    ("actors", "keys", "mode"),
    [
        (["TaskRunnerV1"], [], None),  # V1, but nothing says which mode
        (["TaskRunner"], [], "legacy"),
        (["main_task"], [], "legacy"),
        ([], ["timing_s/start_profile", "timing_s/gen"], "legacy"),
        ([], ["fully_async/trainer/idle_ratio"], "fully_async"),
        ([], ["timing_s/timing_s/param_sync"], "fully_async"),
        ([], ["trainer/idle_ratio"], "fully_async"),
        ([], ["timing_s/wait_prev_gen"], "one_step_off"),
        ([], ["timing_s/gen", "timing_s/step"], None),
    ],
)
def test_mode_without_a_config(actors: list[str], keys: list[str], mode: str | None) -> None:
    assert detect({}, actors, keys).trainer_mode == mode


@pytest.mark.parametrize(
    ("keys", "version"),
    [
        (["timing_s/gen_max"], "<= 0.7"),
        (["timing_s/reshard"], "0.4-0.6"),
        (["timing_s/generation_timing/max"], "0.6-0.7"),
        # v0.7.1 already times the weight sync and counts preemptions (ray_trainer.py:1532,
        # agent_loop.py:1061); its legacy workers still print perf/max_memory_* unprefixed.
        (["timing_s/update_weights"], "0.7-0.9"),
        (["timing_s/agent_loop/num_preempted/max"], "0.7-0.9"),
        (["timing_s/update_weights", "perf/max_memory_allocated_gb"], "0.7"),
        (
            ["actor/perf/max_memory_allocated_gb", "timing_s/agent_loop/compute_score/max"],
            "0.8-0.9",
        ),
        (["timing_s/wait_for_enough_samples"], "0.9"),
        (["timing/gen"], "<= 0.2"),
        (["timing_s/gen", "timing_s/step"], "unknown"),
        (["timing_s/reshard", "timing_s/update_weights"], "mixed (a fork?)"),
    ],
)
def test_version_range_from_the_keys(keys: list[str], version: str) -> None:
    assert detect({}, [], keys).version_range == version


def test_a_verl_071_log_reads_as_07() -> None:
    """The real 0.7.1 README paste (tests/fixtures/real_logs): every key its step prints is
    dated so that the range is 0.7 exactly, not 0.8-0.9."""
    log = parse_file(REAL_LOGS / "agent_loop_one_metric_per_line_verl071.log")
    fl = detect({}, [], log.steps[-1].metrics)
    assert fl.version_range == "0.7", fl.evidence


def test_a_config_without_use_v1_is_verl_08_or_older() -> None:
    fl = detect({"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1})
    assert fl.trainer_mode == "legacy" and fl.version_range == "<= 0.8"


def test_engine_backend_device_and_pools() -> None:
    fl = detect(
        {
            **V1,
            "trainer.v1.trainer_mode": "separate_async",
            "trainer.device": "npu",
            "actor_rollout_ref.rollout.name": "sglang",
            "actor_rollout_ref.actor.strategy": "megatron",
            "actor_rollout_ref.rollout.nnodes": 2,
            "actor_rollout_ref.rollout.n_gpus_per_node": 8,
            "reward.reward_model.enable": True,
            "reward.reward_model.enable_resource_pool": True,
            "reward.reward_model.n_gpus_per_node": 4,
            "reward.reward_model.nnodes": 1,
        }
    )
    assert (fl.engine, fl.backend, fl.device) == ("sglang", "megatron", "npu")
    assert (fl.pools.trainer, fl.pools.rollout, fl.pools.reward, fl.pools.total) == (8, 16, 4, 28)
    assert describe(fl.as_dict()) == (
        "verl 0.9 · V1 separate_async · sglang · megatron · Ascend NPU · "
        "8 trainer + 16 rollout + 4 reward GPUs"
    )


def test_colocated_modes_have_no_rollout_pool() -> None:
    """V1 sync keeps actor_rollout_ref.rollout.n_gpus_per_node (a default) but nnodes 0."""
    fl = detect(
        {
            **V1,
            "actor_rollout_ref.rollout.nnodes": 0,
            "actor_rollout_ref.rollout.n_gpus_per_node": 8,
        }
    )
    assert fl.pools.rollout is None and fl.pools.total == 8


def test_engine_from_ray_actors_when_the_config_has_none() -> None:
    assert detect({}, ["vLLMHttpServer", "TaskRunnerV1"]).engine == "vllm"
    assert detect({"actor_rollout_ref.rollout.name": "???"}).engine is None


def test_parser_keeps_the_actor_of_step_and_config_lines() -> None:
    parser = VerlStreamParser("h", "driver.log")
    parser.feed(
        [
            "(WorkerDict pid=7, ip=10.0.0.2) some worker chatter",
            "(FullyAsyncTaskRunner pid=1) {'trainer': {'nnodes': 1}}",
            "(FullyAsyncTrainer pid=2, ip=10.0.0.1) step:1 - timing_s/gen:1.0",
        ],
        0.0,
    )
    assert parser.counts["actors"] == ["FullyAsyncTaskRunner", "FullyAsyncTrainer"]


def test_real_early_log_is_legacy_from_its_prefix() -> None:
    """The real Dec-2024 log: (main_task pid=..) prefix, timing/ keys."""
    parsed = parse_file(REAL / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log")
    store = Store()
    for rec in parsed.steps:
        store.ingest(rec)
    store.log_stats["x"] = {"actors": ["main_task"]}
    fl = store_flavour(store)
    assert fl.trainer_mode == "legacy" and fl.version_range == "<= 0.2"


def test_nccl_lines_inside_the_verl_log_are_read() -> None:
    """A verl log whose workers printed "Using network Socket" gives its NCCL transport."""
    lines = (FIX / "v1_sync_2node_socket.log").read_text().splitlines()
    parser = VerlStreamParser("head", "driver.log")
    out = parser.feed(lines, 1.0)
    infos = [r for r in out if isinstance(r, NcclInfo)]
    assert infos and infos[-1].transport == "Socket" and infos[-1].nnodes == 2
    assert infos[-1].path == "driver.log"
    assert sum(isinstance(r, VerlStep) for r in out) == 9  # step 0 validation + 8 steps


def test_the_two_lines_of_a_fully_async_version_merge() -> None:
    """fully_async_trainer.py:783 then 807 log two dicts at step = version: one step."""
    store = Store()
    store.ingest(
        VerlStep(step=3, t=1.0, metrics={"fully_async/rollouter/idle_ratio": 0.4, "x": 1.0})
    )
    store.ingest(VerlStep(step=3, t=2.0, metrics={"timing_s/gen": 3.0, "x": 1.0}))
    assert len(store.steps) == 1
    assert store.steps[-1].metrics == {
        "fully_async/rollouter/idle_ratio": 0.4,
        "x": 1.0,
        "timing_s/gen": 3.0,
    }
    assert store.steps[-1].t == 2.0
    # A restarted run re-logging the step with other numbers replaces it (as before).
    store.ingest(VerlStep(step=3, t=3.0, metrics={"timing_s/gen": 5.0}))
    assert store.steps[-1].metrics == {"timing_s/gen": 5.0}


def test_store_flavour_follows_the_inputs() -> None:
    store = Store()
    pipe = Pipeline(store)
    assert store_flavour(store).trainer_mode is None
    pipe.emit(
        VerlConfig(host="h", t=1.0, values={**V1, "trainer.v1.trainer_mode": "colocate_async"})
    )
    assert store_flavour(store).trainer_mode == "colocate_async"
    assert store.verl_flavour is not None and store.verl_flavour[1].trainer_mode == "colocate_async"
    pipe.emit(VerlConfig(host="h", t=2.0, values={**V1, "trainer.v1.trainer_mode": "sync"}))
    assert store_flavour(store).trainer_mode == "sync"
    store.ingest(RayActors(actors=[RayActor(name="", class_name="FullyAsyncRollouter")]))
    assert store_flavour(store).trainer_mode == "fully_async"


def test_nccl_lines_in_a_verl_log_give_one_event_each() -> None:
    """The pipeline's EventScanner owns WARN/watchdog events of a verl log; the verl parser
    adds only the NCCL transport summary, so a WARN line is one event, not two."""
    from verl_top.model import LogLines

    store = Store()
    Pipeline(store).emit(
        LogLines(
            host="h",
            t=1.0,
            path="d.log",
            kind="verl",
            lines=[
                "(WorkerDict pid=3) n:1:1 [0] NCCL WARN NET/IB : Got async event : port error",
                "(WorkerDict pid=3) n:1:1 [0] NCCL INFO Using network Socket",
            ],
        )
    )
    assert [e.kind for e in store.events] == ["nccl_warn"]
    assert [i.transport for i in store.nccl.values()] == ["Socket"]


@pytest.mark.parametrize(
    "config",
    [
        {"trainer.device": "tpu"},
        {"trainer.device": "xla"},
        {"actor_rollout_ref.actor.strategy": "xla"},  # torch-xla forks
    ],
)
def test_a_torch_xla_job_runs_on_tpus(config: dict) -> None:
    fl = detect(config)
    assert fl.device == "tpu"
    assert "TPU (XLA)" in fl.text()


def test_the_gpu_sample_rules_run_when_samples_exist_even_on_a_tpu_job() -> None:
    """The TPU guard stands in for rules only when verl-top has no device samples to read:
    a job read as TPU whose hosts do send GPU samples is still judged on them."""
    from verl_top.diagnosis.guards import device_guard
    from verl_top.diagnosis.thresholds import Thresholds
    from verl_top.diagnosis.view import View

    store = Store()
    store.ingest(VerlConfig(host="h", t=1.0, values={"trainer.device": "tpu"}))
    view = View(store, Thresholds())
    guard = device_guard(view, 1, "gpu.idle")
    assert guard is not None and "TPUs" in guard.detail and "NVIDIA GPUs only" in guard.detail
    assert device_guard(view, 2, "nccl.busbw_low") is not None
    assert device_guard(view, 2, "sync.weight_update") is None  # a verl-step rule: judged

    class WithSamples(View):
        def gpus(self) -> list:
            return ["a GPU"]

    assert device_guard(WithSamples(store, Thresholds()), 1, "gpu.idle") is None


def test_a_tpu_job_watched_live_is_not_asked_for_gpu_samples(tmp_path: Path) -> None:
    """A TPU job's log followed live: the local sampler gives host samples but no device
    activity, and flow.host_stall said "needs GPU samples next to the host samples" (a
    fresh-clone CI run, where the corpus log's mtime was seconds old, read it as live)."""
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout

    from verl_top.cli import main

    log = tmp_path / "tpu.log"
    log.write_bytes((REAL_LOGS / "tpu_fork_no_vllm_xla_hbm_oom.log").read_bytes())
    out = io.StringIO()
    argv = ["diagnose", "--verl-log", str(log), "--follow", "--duration", "1.5", "--json"]
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        main(argv)
    checks = {c["rule"]: c for step in json.loads(out.getvalue())["steps"] for c in step["checks"]}
    host_stall = checks["flow.host_stall"]
    assert host_stall["status"] == "no_data"
    assert "not read on TPUs" in host_stall["detail"] and "GPU samples" not in host_stall["detail"]
