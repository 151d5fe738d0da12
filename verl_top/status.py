"""The one verdict vocabulary: ``no data``, ``reading``, ``healthy``, ``step N bottleneck``.

The banner, the panes, report.md and ``diagnose`` (text and ``--json``) all say where the job
stands with these words, from the same store and verdict, so they never contradict each other
("healthy" with no data, "No GPU data: no GPU data"):

- **no data**: nothing to judge: no GPU sample and no verl step (hosts may be connecting, down,
  or have no GPU: the text says which, once);
- **reading**: data arrives but the diagnosis cannot say yet (no verdict, every check still
  lacks data, or findings the engine is still confirming);
- **healthy**: at least one check passed and no step is the bottleneck;
- **step N bottleneck**: the diagnosis names step N (its worst finding follows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_top.diagnosis.findings import STEP_NAMES, worth_text
from verl_top.store import Store

NO_DATA = "no data"
READING = "reading"
HEALTHY = "healthy"
BOTTLENECK = "bottleneck"
# Host states in which nothing arrives (same list as the UI's greyed rows).
_DEAD = ("down", "stale", "auth_failed", "hostkey_changed", "no_python")


@dataclass(frozen=True)
class JobStatus:
    """Where the job stands: ``state`` is one of the four words, ``text`` one line for people."""

    state: str
    text: str
    step: int | None = None
    severity: float | None = None

    @property
    def label(self) -> str:
        """The state as shown: ``no data``, ``reading``, ``healthy`` or ``step 3 bottleneck``."""
        return f"step {self.step} {BOTTLENECK}" if self.state == BOTTLENECK else self.state

    def as_dict(self) -> dict[str, Any]:
        """For ``diagnose --json`` and snapshot.json."""
        return {"state": self.state, "label": self.label, "step": self.step, "text": self.text}


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
    down = [src for src in getattr(store, "sources", {}).values() if src.state == "down"]
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


def _healthy_detail(headline: str) -> str:
    """The engine's healthy headline without its lead ("Job looks healthy: 32 GPUs at …")."""
    head, sep, rest = headline.partition(":")
    return rest.strip() if sep and "healthy" in head.lower() else ""


def job_status(store: Store, verdict: Any) -> JobStatus:
    """The status of the job from the store and the latest verdict (None: not evaluated yet)."""
    if (
        verdict is not None
        and getattr(verdict, "no_data", False)
        and getattr(store, "log_stats", None)  # a log was read: say what it gave
    ):
        # The engine read the inputs and found nothing to judge: its headline says what was
        # read (file, lines, first unreadable line), which beats "waiting".
        head = str(getattr(verdict, "headline", "") or "")
        detail = head.split(":", 1)[1].strip() if head.startswith("No data") else head
        return JobStatus(NO_DATA, f"{NO_DATA}: {detail}" if detail else _no_data_text(store))
    step = None if verdict is None else getattr(verdict, "bottleneck_step", None)
    if step is None and not has_gpu_or_steps(store):
        # Nothing measured (config or probe findings alone may still name a step above).
        return JobStatus(NO_DATA, _no_data_text(store))
    if step is not None:
        mine = [f for f in getattr(verdict, "findings", []) or [] if f.step == step]
        worst = max(mine, key=lambda f: float(f.severity), default=None)
        name = STEP_NAMES.get(step, f"step {step}")
        if worst is None:  # held by hysteresis while its findings clear
            text = f"step {step} {BOTTLENECK} ({name}): its findings cleared, confirming"
            return JobStatus(BOTTLENECK, text, step, None)
        worth = worth_text(worst)  # seconds per step it costs, what the advice could save
        text = f"step {step} {BOTTLENECK} ({name}): {worst.title}" + (
            f" — {worth}" if worth else ""
        )
        return JobStatus(BOTTLENECK, text, step, float(worst.severity))
    findings = [] if verdict is None else list(getattr(verdict, "findings", []) or [])
    if findings:  # findings, but no bottleneck named yet (the engine confirms over time)
        worst = max(findings, key=lambda f: float(f.severity))
        name = STEP_NAMES.get(worst.step, f"step {worst.step}")
        text = f"{READING}: confirming step {worst.step} ({name}): {worst.title}"
        return JobStatus(READING, text, None, float(worst.severity))
    checks = [] if verdict is None else list(getattr(verdict, "checks", []) or [])
    passed = sum(1 for c in checks if getattr(c, "status", "") == "passed")
    if verdict is None or not passed:
        gpus = store.gpu_count()
        what = [_count(gpus, "GPU")] if gpus else []
        if store.steps:
            what.append(_count(len(store.steps), "verl step"))
        return JobStatus(READING, f"{READING}: {' and '.join(what)}; not enough yet to judge")
    detail = _healthy_detail(str(getattr(verdict, "headline", "") or ""))
    if not detail or "no data" in detail:
        detail = f"{passed} checks passed"
    return JobStatus(HEALTHY, f"{HEALTHY}: {detail}")
