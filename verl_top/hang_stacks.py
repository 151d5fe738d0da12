"""Stacks on a hang (issue 29): when ``job.hang`` leads, read once the Python stacks of the
named process's role, so the evidence shows where the process is stuck and where its peers wait.

The same code as the node screen's ``t`` and ``verl-top stacks`` (verl_top/stacks.py) reads
them, through the session's own connections (the SSH agent's, or this machine for the
in-process agent); a session that reaches no process (a replay, Prometheus) reads nothing.
Once per hang: a new hang (another method, or the same method entered again) reads again, the
same one does not. The result replaces ``store.stacks``, which job.hang's evidence, the process
screen and a snapshot (stacks.txt, snapshot.json) read. Read-only; py-spy pauses each running
process for the moment it reads it (a stopped one is read without a pause): the app and
``snapshot`` say so.

Bounded: at most ``HANG_STACKS_MAX`` processes per hang, the named ones first, then their peers
on the same host, then the rest of the role by host and pid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_top.assessment import Assessment
from verl_top.diagnosis.findings import Finding
from verl_top.node_exec import runner_for
from verl_top.progress import ProcNow
from verl_top.stacks import (
    MAX_TARGETS,
    ProcessStack,
    Target,
    collect_targets,
    ray_for,
    targets_for,
)
from verl_top.store import Store

HANG_RULE = "job.hang"
HANG_STACKS_MAX = 64  # processes read for one hang


def hang_lead(assessment: Assessment) -> Finding | None:
    """The job.hang finding when it is the lead, else None."""
    lead = assessment.lead
    return lead if lead is not None and lead.rule == HANG_RULE else None


def episode(finding: Finding) -> tuple[object, ...]:
    """What makes a hang the same one: its method and when its first process entered it (not
    the processes it names, which may change as their CPU and GPU are seen: each change would
    pause them all again)."""
    return finding.data.get("method"), finding.data.get("since")


def _users(store: Store) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for host, entry in store.hosts.items():
        if entry.procs is not None:
            for j in entry.procs.job_procs:
                out[(host, j.pid)] = j.user
    return out


def hang_targets(store: Store, finding: Finding, limit: int = HANG_STACKS_MAX) -> list[Target]:
    """The processes to read for a hang: every job process of the named processes' role (of
    every process in the hung method when none is named), the named ones first, then the
    processes on their hosts, then the others by host and pid; at most ``limit``."""
    procs = store.progress.current()
    named = [(str(c.get("host")), c.get("pid")) for c in finding.data.get("culprits") or []]
    by_key = {(p.host, p.pid): p for p in procs}
    roles = {by_key[k].role for k in named if k in by_key}
    method = finding.data.get("method")
    pick = [p for p in procs if (p.role in roles if roles else p.method == method)]
    hosts = {h for h, _ in named}
    order = {k: i for i, k in enumerate(named)}

    def rank(p: ProcNow) -> tuple[int, int, str, int]:
        first = order.get((p.host, p.pid), len(order))
        return first, 0 if p.host in hosts else 1, p.host, p.pid

    users = _users(store)
    return [
        Target(p.host, p.pid, p.role, p.title, users.get((p.host, p.pid), ""))
        for p in sorted(pick, key=rank)[:limit]
    ]


def every_target(store: Store, limit: int = MAX_TARGETS) -> list[Target]:
    """Every job process the store knows on every host (``snapshot --stacks``), at most
    ``limit`` per host."""
    return [t for host in sorted(store.hosts) for t in targets_for(store, host)[:limit]]


def reachable(targets: Sequence[Target], sources: Sequence[Any]) -> bool:
    """True when the session can run a command on at least one of the targets' hosts."""
    return any(runner_for(sources, h) is not None for h in {t.host for t in targets})


@dataclass
class HangStacks:
    """Reads the stacks of a hang's role once per hang, through the session's sources."""

    store: Store
    sources: Sequence[Any]
    _done: tuple[object, ...] | None = field(default=None, repr=False)

    def due(self, assessment: Assessment) -> list[Target]:
        """The processes to read now: the hang's role when job.hang leads with a hang not
        read yet and the session reaches its hosts; else none. Marks the hang as read."""
        finding = hang_lead(assessment)
        if finding is None:
            self._done = None  # the hang is over: a later one is read again
            return []
        key = episode(finding)
        if key == self._done:
            return []
        self._done = key
        targets = hang_targets(self.store, finding)
        return targets if reachable(targets, self.sources) else []

    async def read(self, targets: Sequence[Target]) -> list[ProcessStack]:
        """Read ``targets``' stacks; they become ``store.stacks`` (the snapshot's)."""
        got = await collect_targets(
            targets, lambda h: runner_for(self.sources, h), ray_for(self.sources, self.store)
        )
        self.store.stacks = got
        return got
