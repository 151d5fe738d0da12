"""The one typed result every surface consumes: the app's banner and panes, ``diagnose``,
``snapshot``, report.md and ``export-metrics`` read an ``Assessment``, never the engine.

An assessment is immutable. The monitor (verl_top/monitor.py) makes a new one when the store
or the verdict changed; a surface that holds on to one keeps a consistent picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_top.diagnosis.findings import Check, Finding, Verdict
from verl_top.status import JobStatus

if TYPE_CHECKING:
    from verl_top.compare import Comparison


@dataclass(frozen=True)
class LeadChange:
    """One change of the lead shown to people: at data time ``t`` the lead became ``rule``
    (step ``step``), or nothing (``rule`` None)."""

    t: float
    step: int | None
    rule: str | None
    title: str = ""


@dataclass(frozen=True)
class Assessment:
    """Where the job stands: the monitored verdict, its status words, what it covers.

    ``verdict`` is the engine's verdict with the lead that hysteresis keeps (the same on every
    surface); ``raw_lead`` is the rule the data alone ranks first right now (it may differ while
    a challenger is being confirmed). ``window`` says which data the verdict covers;
    ``health`` what the input boundary refused; ``settled``: the inputs ended (finished logs,
    a replay played out) and this is the final word on them."""

    verdict: Verdict | None
    status: JobStatus
    t: float = 0.0
    window: str = ""
    raw_lead: str | None = None
    history: tuple[LeadChange, ...] = ()
    health: dict[str, Any] = field(default_factory=dict)
    settled: bool = False
    # --baseline RUN: this run against the baseline, stage by stage (verl_top/compare.py)
    comparison: Comparison | None = None

    @property
    def lead(self) -> Finding | None:
        """The finding shown as the bottleneck (None: none)."""
        return self.verdict.lead if self.verdict is not None else None

    @property
    def bottleneck_step(self) -> int | None:
        """The step of the lead (None: none)."""
        return self.verdict.bottleneck_step if self.verdict is not None else None

    @property
    def bottleneck_rule(self) -> str | None:
        """The rule of the lead (None: none)."""
        return self.verdict.bottleneck_rule if self.verdict is not None else None

    @property
    def findings(self) -> list[Finding]:
        """Every finding, ranked (the lead's own ranking, not hysteresis, orders them)."""
        return self.verdict.findings if self.verdict is not None else []

    @property
    def checks(self) -> list[Check]:
        """Every rule's outcome."""
        return self.verdict.checks if self.verdict is not None else []

    def step_findings(self, step: int) -> list[Finding]:
        """The findings of one step, worst first."""
        return sorted(
            (f for f in self.findings if f.step == step), key=lambda f: -float(f.severity)
        )

    def step_checks(self, step: int) -> list[Check]:
        """The checks of one step."""
        return [c for c in self.checks if c.step == step]


EMPTY = Assessment(verdict=None, status=JobStatus("no data", "no data: nothing was read yet"))
