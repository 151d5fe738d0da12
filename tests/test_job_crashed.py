"""job.crashed: the exception a verl job died of, named with where it was raised.

The real corpus rows (tests/test_real_log_corpus.py, `crash:`) check the five logs that died
before their first step. Here: what is and is not a crash (a worker's logged traceback, a run
that went on after one, Python 3.11 carets, chained tracebacks), the real log that crashed
after a timed step (listed, not the lead), the advice built from the job's config, and the
event's trip through a recording.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from verl_top.cli import main
from verl_top.diagnosis.crash import crash_advice
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.job import job_facts
from verl_top.model import LogEvent, LogLines
from verl_top.protocol import encode, validate
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store
from verl_top.verl.crash import MAX_EXCEPTION_CHARS, CrashScanner
from verl_top.verl.parse import VerlStreamParser

REAL = Path(__file__).parent / "fixtures" / "real_logs"
STEP = (
    "(TaskRunner pid=7) step:{n} - timing_s/gen:40.0 - timing_s/update_actor:50.0 - "
    "timing_s/step:95.0 - perf/throughput:1000.0"
)
# The driver's traceback as main_ppo prints it when a worker task fails (shape of the real
# Search-R1 log: Ray's task header, then the task's own frames, then the exception).
DRIVER_OOM = [
    "Error executing job with overrides: ['data.train_batch_size=128']",
    "Traceback (most recent call last):",
    '  File "/ws/verl/trainer/main_ppo.py", line 110, in main',
    "    ray.get(main_task.remote(config))",
    '  File "/env/lib/python3.10/site-packages/ray/_private/worker.py", line 968, in get',
    "    raise value.as_instanceof_cause()",
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::main_task() (pid=11, ip=10.0.0.1)",
    '  File "/ws/verl/trainer/ppo/ray_trainer.py", line 820, in fit',
    "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor()"
    " (pid=12, ip=10.0.0.1, actor_id=ab)",
    '  File "/ws/verl/workers/actor/dp_actor.py", line 276, in update_policy',
    "    loss.backward()",
    "    ^^^^^^^^^^^^^^^",
    '  File "/env/lib/python3.10/site-packages/torch/autograd/graph.py", line 744, in _run',
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.07 GiB. GPU",
]


def _records(lines: list[str]) -> list:
    parser = VerlStreamParser("h", "driver.log")
    return parser.feed(lines, 5.0) + parser.flush(5.0)


def _crashes(lines: list[str]) -> list[LogEvent]:
    return [r for r in _records(lines) if isinstance(r, LogEvent) and r.kind == "crash"]


def _verdict(lines: list[str]):  # noqa: ANN202 - the engine's Verdict
    store = Store()
    Pipeline(store).emit(LogLines(host="h", t=5.0, path="driver.log", kind="verl", lines=lines))
    return Engine().evaluate(store)


def test_the_drivers_traceback_is_one_crash_with_where() -> None:
    (crash,) = _crashes(DRIVER_OOM)
    assert crash.text.startswith("torch.cuda.OutOfMemoryError: CUDA out of memory.")
    # The most specific Ray task, and the last frame inside verl (not torch's).
    assert crash.where == (
        "in ray::WorkerDict.actor_rollout_update_actor at "
        "verl/workers/actor/dp_actor.py:276 (update_policy)"
    )
    assert crash.after_steps == 0 and crash.t == 5.0


def test_a_workers_own_traceback_is_not_a_crash() -> None:
    """An agent-loop worker logging a caught error under its Ray prefix (the real GUI-cursor
    logs) is the job's business, not its death."""
    prefix = "(CursorLoopWorker pid=9) "
    lines = [prefix + line for line in DRIVER_OOM]
    assert _crashes(lines) == []
    verdict = _verdict([STEP.format(n=1), *lines])
    assert "job.crashed" not in [f.rule for f in verdict.findings]


def test_a_run_that_went_on_after_a_traceback_did_not_crash() -> None:
    lines = [STEP.format(n=1), *DRIVER_OOM, STEP.format(n=2)]
    verdict = _verdict(lines)
    check = next(c for c in verdict.checks if c.rule == "job.crashed")
    assert check.status == "passed" and "1 verl step line(s) followed" in check.detail


def test_chained_tracebacks_show_the_earlier_cause_once() -> None:
    """A worker that failed to import (printed twice, as Ray retries) and then the driver's
    assertion that its worker group never registered: the last is the crash, the first its
    likely cause, shown once."""
    cause = [
        "Traceback (most recent call last):",
        '  File "/ws/verl/utils/model.py", line 24, in <module>',
        "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZNK3c10",
    ]
    death = [
        "Traceback (most recent call last):",
        "ray.exceptions.RayTaskError(AssertionError): ray::main_task() (pid=1, ip=1.2.3.4)",
        '  File "/ws/verl/single_controller/ray/base.py", line 274, in _init_with_resource_pool',
        "AssertionError: failed to get register_center_actor: x_register_center in []",
    ]
    verdict = _verdict(cause + ["", "The above exception was the direct cause:"] + cause + death)
    assert verdict.no_data and verdict.bottleneck_rule == "job.crashed"
    lead = verdict.lead
    assert lead is not None and lead.title.startswith("The job crashed: AssertionError")
    assert [e for e in lead.evidence if e.startswith("earlier:")] == [
        "earlier: ImportError: flash_attn_2_cuda.so: undefined symbol: _ZNK3c10 "
        "(at verl/utils/model.py:24 (<module>))"
    ]
    assert "ImportError" in lead.advice and "register-center" in lead.advice
    assert verdict.headline.startswith("No data to judge: the job crashed: AssertionError")


def test_a_long_exception_line_is_cut_and_cleaned() -> None:
    scanner = CrashScanner("h", "p")
    assert scanner.scan("", "Traceback (most recent call last):", 0) is None
    event = scanner.scan("", "ValueError: " + "x\x1b[31m" * 10_000, 3)
    assert event is not None and len(event.text) <= MAX_EXCEPTION_CHARS
    assert "\x1b" not in event.text and event.after_steps == 3


def test_a_crash_after_timed_steps_is_listed_not_the_lead() -> None:
    """The real SLURM log died of a ValueError after its step 4: the step's update (72 %)
    stays the lead (the corpus row), and the crash is reported with where it was raised."""
    out = io.StringIO()
    log = REAL / "slurm_ppo_critic_warmup_multistep_env.log"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["diagnose", "--verl-log", str(log), "--json", "--duration", "1"])
    doc = json.loads(out.getvalue())
    assert doc["bottleneck"]["rule"] == "flow.train_bound"
    crash = next(f for f in doc["findings"] if f["rule"] == "job.crashed")
    assert crash["title"].startswith("The job crashed: ValueError: setting an array element")
    assert crash["evidence"][0] == (
        "raised in ray::TaskRunner.run at verl/utils/metric/utils.py:74 (reduce_metrics)"
    )


def test_memory_advice_follows_the_jobs_config() -> None:
    oom = LogEvent(
        kind="crash",
        text="torch.cuda.OutOfMemoryError: CUDA out of memory.",
        where="in ray::WorkerDict.actor_rollout_update_actor at verl/x.py:1 (update_policy)",
    )
    a = "actor_rollout_ref.actor."
    plain = crash_advice(oom, [], job_facts({a + "ppo_micro_batch_size_per_gpu": 8}))
    assert "ppo_micro_batch_size_per_gpu (now 8)" in plain and "param/optimizer offload" in plain
    dyn = {a + "use_dynamic_bsz": True, a + "fsdp_config.param_offload": True}
    advice = crash_advice(oom, [], job_facts(dyn))
    assert "ppo_max_token_len_per_gpu (use_dynamic_bsz is on)" in advice
    assert "offload is already on: param_offload" in advice
    assert "micro_batch_size" not in advice
    gen = LogEvent(kind="crash", text=oom.text, where="in ray::WorkerDict.actor_rollout_generate")
    rollout = {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.6}
    assert "gpu_memory_utilization (now 0.6)" in crash_advice(gen, [], job_facts(rollout))
    hbm = LogEvent(kind="crash", text="RuntimeError: Ran out of memory in memory space hbm.")
    assert "TPU HBM" in crash_advice(hbm, [], job_facts({}))


def test_the_crash_event_survives_a_recording() -> None:
    (crash,) = _crashes(DRIVER_OOM)
    back = validate(json.loads(encode(crash)))
    assert isinstance(back, LogEvent)
    assert (back.kind, back.text, back.where, back.after_steps) == (
        "crash",
        crash.text,
        crash.where,
        0,
    )
