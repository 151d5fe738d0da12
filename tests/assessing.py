"""Test helpers: an Assessment around a verdict made by hand (the app and exports read only
Assessments; the monitor makes them in the product)."""

from __future__ import annotations

from collections.abc import Callable

from verl_top.assessment import Assessment
from verl_top.diagnosis.engine import Engine
from verl_top.diagnosis.findings import Verdict
from verl_top.status import job_status
from verl_top.store import Store


def assessment_of(store: Store, verdict: Verdict | None) -> Assessment:
    """The assessment a monitor would hold for ``verdict`` (its own lead, no hysteresis)."""
    return Assessment(verdict=verdict, status=job_status(store, verdict), t=store.now)


class FixedEngine(Engine):
    """Returns one verdict whatever the store (an empty one by default) and counts calls."""

    def __init__(self, verdict: Verdict | None = None) -> None:
        super().__init__()
        self.verdict = verdict if verdict is not None else Verdict(None, None, "")
        self.calls = 0

    def evaluate(self, store: Store, between: Callable[[], object] | None = None) -> Verdict:
        self.calls += 1
        return self.verdict
