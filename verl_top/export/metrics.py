"""Verdicts as Prometheus metrics: ``verl-top export-metrics --listen 127.0.0.1:9108``.

Runs the same sources and diagnosis as the app, without a screen, and serves what it concludes
in the Prometheus text format through ``prometheus_client`` (a custom collector on a registry of
its own, not the library's global one), so Grafana and Alertmanager can alert on "rollout-bound
for 10 minutes"::

    verl_top_bottleneck_step                       3      (0: no bottleneck)
    verl_top_bottleneck{step="3",name="Dataflow",rule="flow.rollout_bound"}   1 per step, 0/1
    verl_top_step_severity{step="3",name="Dataflow"}                          0..1
    verl_top_step_findings{step="3",name="Dataflow"}                          count
    verl_top_finding_severity{step="3",rule="flow.rollout_bound"}             0..1
    verl_top_stage_share{stage="gen"}              median share of the step (recent steps)
    verl_top_host_state{host="node1",state="up"}   1 (one series per host, its current state)
    verl_top_hosts{state="up"}                     hosts per state
    verl_top_gpus                                  GPUs known
    verl_top_status{state="bottleneck"}            1 for the job's status word (the banner's)
    verl_top_lead_save_seconds                     recoverable seconds per step of the lead
    verl_top_inputs_ended                          1 once finite inputs (a replay) ended: final
    verl_top_tokens_per_second_per_gpu             verl perf/throughput, median of the recent steps
    verl_top_step_seconds                          verl step time (no validation/checkpoint), median
    verl_top_last_step                             number of the newest verl step
    verl_top_last_step_timestamp_seconds           data time the newest verl step ended
    verl_top_evaluation_timestamp_seconds          wall time of the last evaluation
    verl_top_data_timestamp_seconds                data time the verdict is about

The event loop asks the same Monitor as the app for its Assessment every ``refresh`` seconds
and publishes an immutable snapshot of it; the HTTP thread of ``prometheus_client`` only reads
the newest snapshot, never the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from verl_top.assessment import Assessment
from verl_top.diagnosis.findings import STEP_NAMES
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import View
from verl_top.export.redact import redact_text
from verl_top.export.webhook import WebhookNotifier
from verl_top.status import STATES
from verl_top.store import Store
from verl_top.verl.stages import DISPLAY_STAGES

if TYPE_CHECKING:
    from verl_top.diagnosis.engine import Engine
    from verl_top.inputs import Inputs

MIN_STALE_S = 5.0
WEBHOOK_DRAIN_S = 15.0


@dataclass(frozen=True)
class VerdictSnapshot:
    """What the collector serves: computed in the event loop, read by the HTTP thread."""

    evaluated_at: float
    data_t: float
    bottleneck_step: int | None
    bottleneck_rule: str | None
    step_severity: dict[int, float] = field(default_factory=dict)
    step_findings: dict[int, int] = field(default_factory=dict)
    findings: tuple[tuple[int, str, float], ...] = ()
    stage_shares: dict[str, float] = field(default_factory=dict)
    host_states: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    status: str = "no data"
    lead_save_s: float | None = None
    settled: bool = False
    tokens_per_gpu: float | None = None
    step_s: float | None = None
    last_step: int | None = None
    last_step_t: float | None = None


def snapshot(
    store: Store, assessment: Assessment, thresholds: Thresholds | None = None
) -> VerdictSnapshot:
    """The numbers of one assessment (reads the store: call it from the event loop)."""
    severity = {step: 0.0 for step in STEP_NAMES}
    counts = {step: 0 for step in STEP_NAMES}
    for f in assessment.findings:
        severity[f.step] = max(severity[f.step], f.severity)
        counts[f.step] += 1
    view = View(store, thresholds or Thresholds())
    shares = {s: hit[0] for s in DISPLAY_STAGES if (hit := view.median_share(s)) is not None}
    lead = assessment.lead
    recent = view.recent_steps()
    rates = [s.throughput for s in recent if s.throughput is not None]
    newest = store.steps[-1] if store.steps else None
    return VerdictSnapshot(
        evaluated_at=time.time(),
        data_t=assessment.t,
        bottleneck_step=assessment.bottleneck_step,
        bottleneck_rule=assessment.bottleneck_rule,
        status=assessment.status.state,
        settled=assessment.settled,
        tokens_per_gpu=statistics.median(rates) if rates else None,
        step_s=view.median_step_s(),
        last_step=newest.step if newest is not None else None,
        last_step_t=newest.t if newest is not None and newest.t else None,
        lead_save_s=lead.save_s if lead is not None else None,
        step_severity=severity,
        step_findings=counts,
        findings=tuple((f.step, f.rule, f.severity) for f in assessment.findings),
        stage_shares=shares,  # stage names come from verl-top's own catalogue
        # Host names are foreign (Slurm, Ray, Prometheus labels): redacted like every export.
        host_states={redact_text(h.name): h.state for h in store.hosts.values()},
        gpus=store.gpu_count(),
    )


class VerdictCollector(Collector):
    """A prometheus_client collector over the newest :class:`VerdictSnapshot`."""

    def __init__(self) -> None:
        self.snapshot: VerdictSnapshot | None = None  # replaced whole: readers see one or other

    def collect(self) -> Iterator[Metric]:
        """The metric families of the newest snapshot (nothing before the first evaluation)."""
        snap = self.snapshot
        if snap is None:
            return
        yield from _verdict_families(snap)
        yield from _host_families(snap)


def _verdict_families(snap: VerdictSnapshot) -> Iterator[Metric]:
    step = GaugeMetricFamily(
        "verl_top_bottleneck_step", "Step of the current bottleneck (1-5), 0 when none"
    )
    step.add_metric([], float(snap.bottleneck_step or 0))
    yield step
    flag = GaugeMetricFamily(
        "verl_top_bottleneck",
        "1 for the step that is the bottleneck, 0 for the others",
        labels=["step", "name", "rule"],
    )
    sev = GaugeMetricFamily(
        "verl_top_step_severity", "Worst finding severity per step (0-1)", labels=["step", "name"]
    )
    count = GaugeMetricFamily(
        "verl_top_step_findings", "Findings per step", labels=["step", "name"]
    )
    for number, name in STEP_NAMES.items():
        current = number == snap.bottleneck_step
        rule = (snap.bottleneck_rule or "") if current else ""
        flag.add_metric([str(number), name, rule], 1.0 if current else 0.0)
        sev.add_metric([str(number), name], snap.step_severity.get(number, 0.0))
        count.add_metric([str(number), name], float(snap.step_findings.get(number, 0)))
    yield from (flag, sev, count)
    finding = GaugeMetricFamily(
        "verl_top_finding_severity", "Severity of each finding (0-1)", labels=["step", "rule"]
    )
    for number, rule, severity in snap.findings:
        finding.add_metric([str(number), rule], severity)
    yield finding
    shares = GaugeMetricFamily(
        "verl_top_stage_share",
        "Median share of the step per verl stage over the recent steps (0-1)",
        labels=["stage"],
    )
    for stage, share in snap.stage_shares.items():
        shares.add_metric([stage], share)
    yield shares
    status = GaugeMetricFamily(
        "verl_top_status",
        "1 for the job's status word (the banner's), 0 for the others",
        labels=["state"],
    )
    for word in STATES:
        status.add_metric([word], 1.0 if word == snap.status else 0.0)
    yield status
    if snap.lead_save_s is not None:
        save = GaugeMetricFamily(
            "verl_top_lead_save_seconds",
            "Seconds per step the lead finding's advised change could save (upper bound)",
        )
        save.add_metric([], snap.lead_save_s)
        yield save
    yield from _step_families(snap)
    ended = GaugeMetricFamily(
        "verl_top_inputs_ended",
        "1 once every input was finite and ended (a replay, finished logs): the verdict is final",
    )
    ended.add_metric([], 1.0 if snap.settled else 0.0)
    yield ended
    evaluated = GaugeMetricFamily(
        "verl_top_evaluation_timestamp_seconds", "Wall time of the last diagnosis evaluation"
    )
    evaluated.add_metric([], snap.evaluated_at)
    yield evaluated
    data_t = GaugeMetricFamily(
        "verl_top_data_timestamp_seconds", "Time of the newest data the verdict is about"
    )
    data_t.add_metric([], snap.data_t)
    yield data_t


def _step_families(snap: VerdictSnapshot) -> Iterator[Metric]:
    """verl's own progress: throughput, step time, newest step (absent until a step came)."""
    for name, help_text, value in (
        (
            "verl_top_tokens_per_second_per_gpu",
            "verl perf/throughput (tokens/s/GPU), median of the recent steps",
            snap.tokens_per_gpu,
        ),
        (
            "verl_top_step_seconds",
            "verl step time without validation/checkpoint, median of the recent steps",
            snap.step_s,
        ),
        ("verl_top_last_step", "Number of the newest verl step", snap.last_step),
        (
            "verl_top_last_step_timestamp_seconds",
            "Data time (epoch s) the newest verl step ended",
            snap.last_step_t,
        ),
    ):
        if value is not None:
            family = GaugeMetricFamily(name, help_text)
            family.add_metric([], float(value))
            yield family


def _host_families(snap: VerdictSnapshot) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "verl_top_host_state",
        "1 for each host, labelled with its current state (up, stale, down, ...)",
        labels=["host", "state"],
    )
    per_state: dict[str, int] = {}
    for host, s in snap.host_states.items():
        state.add_metric([host, s], 1.0)
        per_state[s] = per_state.get(s, 0) + 1
    yield state
    hosts = GaugeMetricFamily("verl_top_hosts", "Hosts per state", labels=["state"])
    for s, n in sorted(per_state.items()):
        hosts.add_metric([s], float(n))
    yield hosts
    gpus = GaugeMetricFamily("verl_top_gpus", "GPUs known to verl-top")
    gpus.add_metric([], float(snap.gpus))
    yield gpus


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT`` for 127.0.0.1) -> (host, port); ValueError if unusable."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def new_registry() -> tuple[CollectorRegistry, VerdictCollector]:
    """A registry holding only verl-top's collector (no process/platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = VerdictCollector()
    registry.register(collector)
    return registry, collector


async def serve(
    inputs: Inputs,
    engine: Engine,
    listen: str,
    refresh: float = 5.0,
    duration: float | None = None,
    webhook: WebhookNotifier | None = None,
) -> None:
    """Run the sources, assess every ``refresh`` s and serve the verdicts on ``listen``;
    with ``webhook``, also push each change of the job's state to it.

    The same Monitor as the app: when every source is finite and has ended (a replay, finished
    logs), the monitor settles and the last word keeps being served."""
    from prometheus_client import start_http_server

    from verl_top.monitor import Monitor

    host, port = parse_listen(listen)
    registry, collector = new_registry()
    server, thread = start_http_server(port, addr=host, registry=registry)
    monitor = Monitor(inputs, engine)
    tasks = [asyncio.create_task(src.run(inputs.pipeline.emit)) for src in inputs.sources]
    sender = asyncio.create_task(webhook.run()) if webhook is not None else None
    loop = asyncio.get_running_loop()
    end = None if duration is None else loop.time() + duration
    settled = False
    try:
        while end is None or loop.time() < end:
            await asyncio.sleep(min(refresh, 0.5) if collector.snapshot is None else refresh)
            inputs.store.mark_stale(stale_after=max(MIN_STALE_S, 3 * refresh))
            if inputs.finite and not settled and all(t.done() for t in tasks):
                assessment, settled = monitor.settle(), True
            else:
                assessment = monitor.assess()
            collector.snapshot = snapshot(inputs.store, assessment, engine.thresholds)
            if webhook is not None:
                webhook.observe(assessment)
    finally:
        if sender is not None and webhook is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            await webhook.drain(within_s=WEBHOOK_DRAIN_S)  # the last word reaches the team
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
