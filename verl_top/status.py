"""The one verdict vocabulary: where the job stands, in words every surface shares.

The banner, the panes, report.md, ``diagnose`` (text and ``--json``), ``snapshot`` and the
metrics all say it with these words, from the same store and the same (monitored) verdict:

- **no data**: nothing to judge: no GPU sample and no verl step (hosts may be connecting, down,
  or have no GPU: the text says which, once);
- **waiting**: a verl log is followed but its first step has not come yet ("waiting for the first
  verl step (42 s)"): GPU symptoms before the first step are warm-up, not a verdict;
- **reading**: data arrives but the diagnosis cannot say yet (no check has passed);
- **healthy**: checks passed and no finding costs a material share of the step;
- **no single bottleneck**: several findings are worth something, none leads;
- **step N bottleneck**: the diagnosis names step N; its lead finding follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_top.diagnosis.findings import STEP_NAMES, Finding, Verdict, worth_text
from verl_top.store import Store

NO_DATA = "no data"
WAITING = "waiting"
READING = "reading"
HEALTHY = "healthy"
NO_SINGLE = "no single bottleneck"
BOTTLENECK = "bottleneck"
STATES = (NO_DATA, WAITING, READING, HEALTHY, NO_SINGLE, BOTTLENECK)
# Host states in which nothing arrives (same list as the UI's greyed rows).
_DEAD = ("down", "stale", "auth_failed", "hostkey_changed", "no_python")


@dataclass(frozen=True)
class JobStatus:
    """Where the job stands: ``state`` is one of STATES, ``text`` one line for people.

    ``lead`` is the finding a bottleneck status names (its title, worth and advice are what
    the banner shows)."""

    state: str
    text: str
    step: int | None = None
    severity: float | None = None
    lead: Finding | None = None

    @property
    def label(self) -> str:
        """The state as shown: ``no data``, ``waiting``, ``healthy``, ``step 3 bottleneck`` ..."""
        return f"step {self.step} {BOTTLENECK}" if self.state == BOTTLENECK else self.state

    def as_dict(self) -> dict[str, Any]:
        """For ``diagnose --json`` and snapshot.json."""
        return {
            "state": self.state,
            "label": self.label,
            "step": self.step,
            "rule": self.lead.rule if self.lead is not None else None,
            "text": self.text,
        }


def _strip_prefix(reason: str) -> str:
    """A no-GPU reason without its own "no GPU data:" lead (the status says that once)."""
    low = reason.lower()
    for lead in ("no gpu data:", "no gpu data -", "no gpu data"):
        if low.startswith(lead):
            return reason[len(lead) :].strip(" :;-")
    return reason


def _no_data_text(store: Store) -> str:
    """Why there is nothing to judge, in one line."""
    hosts = list(store.hosts.values())
    down = [src for src in store.sources.values() if src.state == "down"]
    if not hosts and down:  # e.g. Prometheus unreachable: say so, not "waiting"
        return f"{NO_DATA}: " + "; ".join(f"{src.host}: {src.reason}" for src in down[:2])
    if not hosts:
        return f"{NO_DATA}: waiting for the first samples"
    no_gpu = [h for h in hosts if h.state == "no_gpu"]
    if no_gpu and len(no_gpu) == len(hosts):
        reasons = sorted({_strip_prefix(h.reason) for h in no_gpu if h.reason})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        where = no_gpu[0].name if len(no_gpu) == 1 else f"{len(no_gpu)} hosts"
        return f"{NO_DATA}: no GPU on {where}{why}; showing host activity only"
    dead = [h for h in hosts if h.state in _DEAD]
    connecting = [h for h in hosts if h.state == "connecting"]
    parts = []
    if connecting:
        parts.append(f"{len(connecting)} connecting")
    if dead:
        reasons = sorted({h.reason for h in dead if h.reason})[:2]
        parts.append(f"{len(dead)} down" + (f" ({'; '.join(reasons)})" if reasons else ""))
    tail = f" ({', '.join(parts)})" if parts else ""
    return f"{NO_DATA}: waiting for the first GPU samples from {len(hosts)} hosts{tail}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def has_gpu_or_steps(store: Store) -> bool:
    """True once a GPU sample or a verl step arrived: something the rules can judge."""
    return bool(store.steps) or any(h.gpus for h in store.hosts.values())


def follows_verl_log(store: Store) -> bool:
    """True when a verl log (given to follow, or held by a recording) is being read.

    A recording holds the log's parsed records, not its lines: the config verl printed at
    the start of its console log says a log was followed when it was made."""
    if store.verl_log_given or store.config_source.startswith("console"):
        return True
    return any(s.get("kind") == "verl" for s in store.log_stats.values())


def waiting_for_first_step(store: Store) -> bool:
    """A verl log is read but no step came out of it yet (and the log is not finished)."""
    return follows_verl_log(store) and not store.steps and not store.post_mortem


def waited_s(store: Store) -> float:
    """Data seconds since the first record (how long the job has been waited for)."""
    if store.first_t is None or not store.now:
        return 0.0
    return max(0.0, store.now - store.first_t)


def lead_text(lead: Finding) -> str:
    """'step 3 bottleneck (Dataflow): <title> — <worth>'."""
    name = STEP_NAMES.get(lead.step, f"step {lead.step}")
    worth = worth_text(lead)  # seconds per step it costs, what the advice could save
    return f"step {lead.step} {BOTTLENECK} ({name}): {lead.title}" + (
        f" — {worth}" if worth else ""
    )


def job_status(store: Store, verdict: Verdict | None, waiting: bool = False) -> JobStatus:
    """The status of the job from the store and the monitored verdict (None: not evaluated).

    ``waiting``: the monitor holds the lead back until the first verl step (warm-up)."""
    if verdict is not None and verdict.no_data and store.log_stats:
        # The engine read the inputs and found nothing to judge: its headline says what was
        # read (file, lines, first unreadable line), which beats "waiting".
        head = verdict.headline
        detail = head.split(":", 1)[1].strip() if head.startswith("No data") else head
        return JobStatus(NO_DATA, f"{NO_DATA}: {detail}" if detail else _no_data_text(store))
    lead = verdict.lead if verdict is not None else None
    if lead is not None:
        return JobStatus(BOTTLENECK, lead_text(lead), lead.step, float(lead.severity), lead)
    if waiting:
        what = [_count(store.gpu_count(), "GPU")] if store.gpu_count() else []
        seen = f"; {' and '.join(what)} seen" if what else ""
        return JobStatus(
            WAITING, f"waiting for the first verl step ({waited_s(store):.0f} s){seen}"
        )
    if not has_gpu_or_steps(store):
        return JobStatus(NO_DATA, _no_data_text(store))
    if verdict is None or not any(c.status == "passed" for c in verdict.checks):
        gpus = store.gpu_count()
        what = [_count(gpus, "GPU")] if gpus else []
        if store.steps:
            what.append(_count(len(store.steps), "verl step"))
        return JobStatus(READING, f"{READING}: {' and '.join(what)}; not enough yet to judge")
    if verdict.outcome == NO_SINGLE:
        return JobStatus(NO_SINGLE, f"{NO_SINGLE}: {verdict.headline}")
    detail = (
        verdict.healthy_detail
        or f"{sum(c.status == 'passed' for c in verdict.checks)} checks passed"
    )
    return JobStatus(HEALTHY, f"{HEALTHY}: {detail}")
