"""Stacks on a hang (verl_top/hang_stacks.py): which processes are read when job.hang leads, once
per hang, and what the hang's evidence says with them. Real py-spy, the app and ``snapshot``
through the real sshd are in tests/test_stacks.py.

The job: 2 hosts x 4 GPUs, ranks 0-7 (pids 5000-5007) in update_actor since S, rank 2 (pid
5002 on a) stopped (T) with its GPU idle while the others spin in NCCL; on host a also a critic
(pid 4000, in update_critic for 5 s) and the driver (pid 3000, TaskRunner.run). Timings from the
real verl 0.5.0 log (tests/hang_data.py): update_actor overruns after 20 s.
"""

from __future__ import annotations

import dataclasses

from tests.hang_data import T0, gpu, hello, history, new_pipeline, worker
from verl_top.assessment import Assessment
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import Finding, Verdict
from verl_top.diagnosis.hang import job_hang
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.hang_stacks import HangStacks, every_target, hang_targets
from verl_top.model import JobProcess, ProcessList
from verl_top.sources.local import LocalSource
from verl_top.stacks import ProcessStack, parse_dump
from verl_top.status import job_status
from verl_top.store import Store

S = T0
UP = "actor_rollout_update_actor"
TH = Thresholds()
# py-spy dump's text form (as tests/test_stacks.py reads it from real processes): where the
# stopped rank is, and where its peers wait.
STOPPED = (
    'Thread 5002 (idle): "MainThread"\n'
    "    _update (verl/workers/actor/dp_actor.py:420)\n"
    "    update_policy (verl/workers/actor/dp_actor.py:380)\n"
    "    update_actor (verl/workers/fsdp_workers.py:1210)\n"
    "    actor_rollout_update_actor (verl/single_controller/base/decorator.py:430)\n"
    "    main_loop (ray/_private/worker.py:946)\n"
)
WAITING = (
    'Thread 1 (active): "MainThread"\n'
    "    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
    "    wrapper (torch/distributed/c10d_logger.py:83)\n"
    "    update_policy (verl/workers/actor/dp_actor.py:380)\n"
    "    update_actor (verl/workers/fsdp_workers.py:1210)\n"
    "    main_loop (ray/_private/worker.py:946)\n"
)


def _job(pid: int, title: str, state: str, since: float, gpus: list[int]) -> JobProcess:
    method = title.split(".", 1)[1] if "." in title else None
    return JobProcess(
        pid=pid,
        user="verl",
        state=state,
        title=title,
        method=method,
        method_since=since,
        cpu_pct=0.0 if state == "T" else 100.0,
        gpus=gpus,
    )


def hung_fleet(end: float = S + 25) -> Store:
    store, pipe = new_pipeline()
    history(pipe, S - 100)
    for host, ranks in {"a": range(0, 4), "b": range(4, 8)}.items():
        pipe.emit(hello(host, 4, S - 100))
        procs = [worker(5000 + r, r % 4, UP, 100.0, r) for r in ranks]
        jobs = [
            _job(5000 + r, f"ray::WorkerDict.{UP}", "T" if r == 2 else "S", S, [r % 4])
            for r in ranks
        ]
        if host == "a":
            jobs.append(_job(4000, "ray::WorkerDict.critic_update_critic", "S", S + 20, []))
            jobs.append(_job(3000, "ray::TaskRunner.run", "S", S - 100, []))
        pipe.emit(ProcessList(host=host, t=S, procs=procs, job_procs=jobs))
    t, k = S - 30, 0
    while t <= end:
        for r in range(8):
            kind = "busy" if t < S + 2 else ("idle" if r == 2 else "spin")
            pipe.emit(gpu("a" if r < 4 else "b", r % 4, t, kind, k))
        t, k = t + 1, k + 1
    return store


def assess(store: Store) -> Assessment:
    verdict = Engine().evaluate(store)
    return Assessment(verdict=verdict, status=job_status(store, verdict), t=store.now)


def test_a_hang_reads_the_named_role_the_named_process_first() -> None:
    store = hung_fleet()
    lead = assess(store).lead
    assert lead is not None and lead.rule == "job.hang"
    got = hang_targets(store, lead)
    # the stopped rank, then its host's peers, then the other host's; no critic, no driver
    assert [(t.host, t.pid) for t in got] == [
        ("a", 5002),
        ("a", 5000),
        ("a", 5001),
        ("a", 5003),
        *[("b", p) for p in range(5004, 5008)],
    ]
    assert {t.role for t in got} == {"actor/rollout"} and {t.user for t in got} == {"verl"}
    assert [t.pid for t in hang_targets(store, lead, limit=3)] == [5002, 5000, 5001]
    # snapshot --stacks: every job process of every host, the critic and driver included
    assert {t.pid for t in every_target(store)} == {3000, 4000, *range(5000, 5008)}


def test_a_hang_is_read_once_and_again_when_a_new_one_leads() -> None:
    store = hung_fleet()
    hang = assess(store)
    calm = Assessment(verdict=Verdict(None, None, ""), status=hang.status, t=store.now)
    sources = [LocalSource(backend="none", host="a")]  # this machine is host "a" here
    reader = HangStacks(store, sources)
    assert len(reader.due(hang)) == 8
    assert reader.due(hang) == []  # the same hang: read once
    # ...even when the processes it names change as more is seen (no new pause for all 8)
    assert reader.due(_with_data(hang, culprits=[])) == []
    assert reader.due(calm) == []  # it cleared
    assert len(reader.due(hang)) == 8  # a later hang is read again
    assert len(reader.due(_with_data(hang, since=S + 60))) == 8  # the method entered again
    # a replay (or Prometheus) reaches no process: nothing is read, nothing said
    assert HangStacks(store, []).due(hang) == []


def _with_data(a: Assessment, **data: object) -> Assessment:
    """``a`` with its lead's data changed."""
    assert a.verdict is not None and a.lead is not None
    lead = dataclasses.replace(a.lead, data={**a.lead.data, **data})
    findings = [lead if f is a.lead else f for f in a.verdict.findings]
    return dataclasses.replace(a, verdict=dataclasses.replace(a.verdict, findings=findings))


def _stack(host: str, pid: int, text: str, t: float, state: str = "S") -> ProcessStack:
    source = "py-spy --nonblocking" if state == "T" else "py-spy"  # as stacks.collect_host
    return ProcessStack(
        host, pid, "actor/rollout", source=source, threads=parse_dump(text), t=t, state=state
    )


def test_the_stacks_read_in_the_hang_are_in_its_evidence() -> None:
    store = hung_fleet()
    store.stacks = [_stack("a", 5002, STOPPED, S + 20, "T")]
    store.stacks += [
        _stack("a" if p < 5004 else "b", p, WAITING, S + 21) for p in range(5000, 5008) if p != 5002
    ]
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding)
    lines = [e for e in hang.evidence if e.startswith("stack")]
    assert lines == [
        "stack of pid 5002 (actor/rollout) on a, read by py-spy --nonblocking 20 s into "
        "update_actor (the process is stopped (T)): MainThread at _update "
        "(verl/workers/actor/dp_actor.py:420) < update_policy (verl/workers/actor/dp_actor.py:380) "
        "< update_actor (verl/workers/fsdp_workers.py:1210) < actor_rollout_update_actor "
        "(verl/single_controller/base/decorator.py:430) < … 1 more",
        "stacks of 7 of its 7 peer(s) in update_actor: 7 at all_reduce "
        "(torch/distributed/distributed_c10d.py:2501) < wrapper "
        "(torch/distributed/c10d_logger.py:83) < … 3 more",
    ]


def test_a_stack_read_before_the_method_began_is_not_shown_as_the_hangs() -> None:
    store = hung_fleet()
    store.stacks = [_stack("a", 5002, WAITING, S - 5)]  # key t, before update_actor began
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding)
    assert not [e for e in hang.evidence if e.startswith("stack")]


def test_a_stack_that_could_not_be_read_says_why() -> None:
    store = hung_fleet()
    why = "pid 5002 runs as uid 1001 (verl); the SSH user (uid 1002) may only read its own"
    store.stacks = [ProcessStack("a", 5002, "actor/rollout", error=why, t=S + 20)]
    hang = job_hang(View(store, TH), TH)
    assert isinstance(hang, Finding)
    assert f"stack of pid 5002 (actor/rollout) on a not read: {why}" in hang.evidence
