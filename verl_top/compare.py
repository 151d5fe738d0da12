"""``verl-top compare BASELINE CURRENT``: why is this run slower (or faster) than that one?

Each side is a verl log, a recording (``--record`` / ``--demo``) or a snapshot bundle; each is
read to its end through the same Monitor as ``diagnose``. Per verl stage, the median seconds per
step of each run, the difference, and a noise band from each run's own step-to-step spread:
a difference inside the band is not called a change. The verdict names the stage that explains
most of the change and the likely cause: a config key that acts on that stage and changed, a
longer response length, more or fewer GPUs, another verl version.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_top.diagnosis.thresholds import Thresholds
from verl_top.diagnosis.view import PERIODIC_STAGES, StepView, View, first
from verl_top.export.redact import redact_mapping
from verl_top.inputs import InputError, Inputs, run_inputs
from verl_top.store import Store

SCHEMA = "verl-top.compare/1"
# A change smaller than this share of the baseline step is noise whatever the spread says.
MIN_SHARE = 0.02
# Robust standard deviation from the median absolute deviation (normal data).
MAD_SD = 1.4826
# Which config keys act on which stage (prefixes); a changed key under these is a likely cause.
STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "gen": (
        "actor_rollout_ref.rollout.",
        "data.max_response_length",
        "data.max_prompt_length",
        "data.train_batch_size",
    ),
    "update_actor": (
        "actor_rollout_ref.actor.",
        "actor_rollout_ref.model.",
        "data.train_batch_size",
        "data.max_response_length",
    ),
    "update_critic": ("critic.", "data.train_batch_size", "data.max_response_length"),
    "old_log_prob": (
        "actor_rollout_ref.rollout.log_prob",
        "actor_rollout_ref.actor.",
        "data.max_response_length",
    ),
    "ref": ("actor_rollout_ref.ref.", "data.max_response_length"),
    "values": ("critic.", "data.max_response_length"),
    "reward": ("reward_model.", "custom_reward_function."),
    "adv": ("algorithm.",),
    "update_weights": ("actor_rollout_ref.rollout.", "actor_rollout_ref.actor."),
}
# Keys that say how many GPUs the run had.
SCALE_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")
# The model itself: a bigger or smaller one changes every stage that runs it on a GPU.
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward_model.model.path")
GPU_STAGES = frozenset(
    {"gen", "old_log_prob", "ref", "values", "update_actor", "update_critic", "update_weights"}
)
# Step metrics compared besides the stages: (label, metric keys, unit).
METRICS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("throughput", ("perf/throughput",), "tokens/s/GPU"),
    ("MFU (actor)", ("perf/mfu/actor", "mfu/actor"), "ratio"),
    ("response length", ("response_length/mean",), "tokens"),
    ("response length max", ("response_length/max",), "tokens"),
    ("clip ratio", ("response_length/clip_ratio",), "ratio"),
)


@dataclass(frozen=True)
class Stat:
    """Median, robust spread (MAD-based SD) and count of one quantity over a run's steps."""

    median: float
    sd: float
    n: int

    def se(self) -> float:
        """Standard error of the median (1.25 x SD / sqrt(n) for normal data)."""
        return 1.2533 * self.sd / math.sqrt(self.n) if self.n else math.inf


def stat(values: list[float]) -> Stat | None:
    """The Stat of ``values`` (None when empty)."""
    clean = [v for v in values if v == v and math.isfinite(v)]
    if not clean:
        return None
    med = statistics.median(clean)
    mad = statistics.median(abs(v - med) for v in clean)
    return Stat(med, MAD_SD * mad, len(clean))


@dataclass
class Run:
    """One side of a comparison: what was read and its per-step statistics."""

    path: str
    kind: str  # log | recording | bundle
    steps: list[StepView]
    skipped: list[int]  # step numbers left out (warm-up, validation/checkpoint steps)
    stages: dict[str, Stat]
    step_s: Stat | None
    metrics: dict[str, Stat]
    gpu_activity: float | None
    gpus: int
    config: dict[str, Any]
    versions: dict[str, str]
    verdict: str  # the run's own diagnosis status line

    def step_range(self) -> str:
        """'steps 2-40 (39 steps)'."""
        if not self.steps:
            return "no steps"
        return f"steps {self.steps[0].step}-{self.steps[-1].step} ({len(self.steps)} steps)"


@dataclass(frozen=True)
class StageDelta:
    """One stage, baseline against current, in seconds per step."""

    stage: str
    baseline_s: float | None
    current_s: float | None
    delta_s: float
    delta_pct: float | None
    noise_s: float
    significant: bool


@dataclass
class Comparison:
    """The whole comparison: stages sorted by |delta|, metrics, config and version changes."""

    baseline: Run
    current: Run
    stages: list[StageDelta]
    step: StageDelta | None
    metrics: list[tuple[str, Stat | None, Stat | None, str]]
    config_diff: list[tuple[str, Any, Any]]
    versions: dict[str, tuple[str, str]]
    verdict: str
    notes: list[str] = field(default_factory=list)


def kind_of(path: Path) -> str:
    """``bundle`` (a snapshot directory), ``recording`` (.ndjson[.gz]) or ``log``."""
    if path.is_dir():
        return "bundle"
    name = path.name.lower()
    return "recording" if name.endswith((".ndjson", ".ndjson.gz")) else "log"


def _steps(view: View) -> tuple[list[StepView], list[int]]:
    """The steps to compare: timed, no validation/checkpoint step, no warm-up first step."""
    all_steps = [s for s in view.steps() if s.stage_times]
    kept = [s for s in all_steps if not s.is_outlier]
    skipped = [s.step for s in all_steps if s.is_outlier]
    if len(kept) > 3 and kept[0].step == min(s.step for s in all_steps):
        skipped.append(kept[0].step)  # the first step compiles, warms caches and allocates
        kept = kept[1:]
    return kept, sorted(skipped)


def summarize(
    path: str, kind: str, store: Store, verdict: str = "", gpu_activity: bool = True
) -> Run:
    """A Run from a store (read to its end, or live). ``gpu_activity``: also average every
    GPU's activity over the window (skipped live at scale: it is shown in pane 1)."""
    view = View(store, Thresholds())
    steps, skipped = _steps(view)
    names: dict[str, None] = {}
    for s in steps:
        names.update(dict.fromkeys(n for n in s.stage_times if n not in PERIODIC_STAGES))
    stages = {
        n: st
        for n in names
        if (st := stat([s.stage_times[n] for s in steps if n in s.stage_times]))
    }
    metrics = {}
    for label, keys, _unit in METRICS:
        values = [hit[1] for s in steps if (hit := first(s.metrics, *keys))]
        if label.startswith("MFU"):
            values = [v for v in values if 0 < v <= 1]  # verl logs 0 when it cannot estimate
        if (st := stat(values)) is not None:
            metrics[label] = st
    acts = (
        [m for g in store.iter_gpus() if (m := view.gpu_mean(g, "activity")) is not None]
        if gpu_activity
        else []
    )
    versions = {}
    for h in store.hosts.values():
        if h.hello is not None and h.hello.driver:
            versions.setdefault("NVIDIA driver", h.hello.driver)
    return Run(
        path=path,
        kind=kind,
        steps=steps,
        skipped=skipped,
        stages=stages,
        step_s=stat([s.step_time_core for s in steps if s.step_time_core]),
        metrics=metrics,
        gpu_activity=sum(acts) / len(acts) if acts else None,
        gpus=store.gpu_count(),
        config=redact_mapping(store.config),
        versions=versions,
        verdict=verdict,
    )


async def load_run(path: str) -> Run:
    """Read one side to its end (InputError when it cannot be read)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file or directory")
    kind = kind_of(p)
    source = p / "recording.ndjson.gz" if kind == "bundle" else p
    if kind == "bundle" and not source.is_file():
        raise InputError(f"{path}: a directory without recording.ndjson.gz (not a snapshot bundle)")
    from verl_top.monitor import Monitor  # the monitor shows comparisons: import it late

    inputs: Inputs = run_inputs(str(source), "log" if kind == "log" else "recording")
    try:
        assessment = await Monitor(inputs).run()
    finally:
        inputs.close()
    return summarize(path, kind, inputs.store, assessment.status.text)


def _delta(name: str, base: Stat | None, cur: Stat | None, step_s: float) -> StageDelta:
    b = base.median if base else None
    c = cur.median if cur else None
    delta = (c or 0.0) - (b or 0.0)
    # 95 % band of the difference of two medians, from each run's own step-to-step spread.
    noise = 1.96 * math.hypot(base.se() if base else 0.0, cur.se() if cur else 0.0)
    noise = 0.0 if math.isinf(noise) or math.isnan(noise) else noise
    significant = abs(delta) > noise and abs(delta) >= MIN_SHARE * step_s
    return StageDelta(name, b, c, delta, (delta / b if b else None), noise, significant)


def _config_diff(base: dict[str, Any], cur: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = sorted(set(base) | set(cur))
    missing = object()
    out = []
    for k in keys:
        a, b = base.get(k, missing), cur.get(k, missing)
        if a is missing or b is missing:
            if base and cur:  # both configs known: a key only one side printed
                out.append((k, None if a is missing else a, None if b is missing else b))
            continue
        if str(a) != str(b):
            out.append((k, a, b))
    return out


def compare_runs(base: Run, cur: Run) -> Comparison:
    """Compare two summarized runs."""
    step_b = base.step_s.median if base.step_s else 0.0
    stages = [
        _delta(n, base.stages.get(n), cur.stages.get(n), step_b)
        for n in dict.fromkeys([*base.stages, *cur.stages])
    ]
    stages.sort(key=lambda d: -abs(d.delta_s))
    step = _delta("step", base.step_s, cur.step_s, step_b) if base.step_s or cur.step_s else None
    metrics = [
        (label, base.metrics.get(label), cur.metrics.get(label), unit)
        for label, _, unit in METRICS
        if label in base.metrics or label in cur.metrics
    ]
    versions = {
        k: (base.versions.get(k, "unknown"), cur.versions.get(k, "unknown"))
        for k in sorted(set(base.versions) | set(cur.versions))
    }
    comp = Comparison(
        base, cur, stages, step, metrics, _config_diff(base.config, cur.config), versions, ""
    )
    comp.verdict = verdict_text(comp)
    return comp


def fmt_s(seconds: float) -> str:
    """Seconds for people: '850 ms', '12.3 s', '4.2 min', '1.5 h'."""
    a = abs(seconds)
    if a < 1:
        return f"{seconds * 1000:.0f} ms"
    if a < 100:
        return f"{seconds:.1f} s"
    if a < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_signed(seconds: float) -> str:
    """'+1.2 s' / '-850 ms'."""
    return ("+" if seconds >= 0 else "-") + fmt_s(abs(seconds))


def _likely_causes(comp: Comparison, stage: StageDelta) -> list[str]:
    causes = []
    prefixes = STAGE_KEYS.get(stage.stage, ())
    for key, a, b in comp.config_diff:
        if key in MODEL_KEYS and stage.stage in GPU_STAGES:
            causes.insert(0, f"another model: {key} {a} -> {b}")
        elif any(key.startswith(p) for p in prefixes):
            causes.append(f"{key} {a} -> {b}")
    if stage.stage in ("gen", "old_log_prob", "ref", "values", "update_actor", "update_critic"):
        for label in ("response length", "response length max"):
            mb = comp.baseline.metrics.get(label)
            mc = comp.current.metrics.get(label)
            if mb and mc and mb.median and abs(mc.median / mb.median - 1) >= 0.1:
                causes.append(
                    f"{label} {mb.median:.0f} -> {mc.median:.0f} tokens "
                    f"({(mc.median / mb.median - 1) * 100:+.0f} %)"
                )
                break
    for key, a, b in comp.config_diff:
        if key in SCALE_KEYS:
            causes.append(f"{key} {a} -> {b} (GPU count)")
    if comp.baseline.gpus and comp.current.gpus and comp.baseline.gpus != comp.current.gpus:
        causes.append(f"GPUs seen {comp.baseline.gpus} -> {comp.current.gpus}")
    for name, (a, b) in comp.versions.items():
        if a != b:
            causes.append(f"{name} {a} -> {b}")
    return causes


def verdict_text(comp: Comparison) -> str:
    """One paragraph: how much slower/faster, which stage explains it, the likely cause."""
    if not comp.baseline.steps or not comp.current.steps:
        side = "baseline" if not comp.baseline.steps else "current"
        return f"Cannot compare: the {side} run has no timed verl step"
    step = comp.step
    total = step.delta_s if step is not None else sum(d.delta_s for d in comp.stages)
    base_s = comp.baseline.step_s.median if comp.baseline.step_s else None
    moved = [d for d in comp.stages if d.significant]
    if step is not None and not step.significant and not moved:
        return (
            f"No change beyond noise: step {fmt_s(step.current_s or 0)} vs "
            f"{fmt_s(step.baseline_s or 0)} (band ±{fmt_s(step.noise_s)})"
        )
    word = "slower" if total > 0 else "faster"
    pct = f" ({total / base_s * 100:+.0f} %)" if base_s else ""
    head = f"Current is {fmt_s(abs(total))} per step {word}{pct}"
    same_way = [d for d in moved if (d.delta_s > 0) == (total > 0)]
    if not same_way:
        return head + "; no single stage moved beyond its noise band"
    top = same_way[0]
    share = f" ({top.delta_s / total * 100:.0f} % of the change)" if total else ""
    text = (
        f"{head}: {top.stage} explains {fmt_signed(top.delta_s)}{share}, "
        f"{fmt_s(top.baseline_s or 0)} -> {fmt_s(top.current_s or 0)}"
    )
    causes = _likely_causes(comp, top)
    if causes:
        text += "; likely cause: " + "; ".join(causes[:3])
    else:
        text += "; no config key that acts on this stage changed, and the response length held"
    return text


def _stat_json(st: Stat | None) -> dict[str, Any] | None:
    if st is None:
        return None
    return {"median": round(st.median, 6), "sd": round(st.sd, 6), "n": st.n}


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "path": run.path,
        "kind": run.kind,
        "steps": run.step_range(),
        "skipped_steps": run.skipped,
        "gpus": run.gpus,
        "gpu_activity_pct": None if run.gpu_activity is None else round(run.gpu_activity, 2),
        "step_s": _stat_json(run.step_s),
        "versions": run.versions,
        "verdict": run.verdict,
    }


def _json_value(value: Any) -> Any:
    return value if isinstance(value, bool | int | float | str) or value is None else str(value)


def to_json(comp: Comparison) -> dict[str, Any]:
    """The comparison as the ``verl-top.compare/1`` document (docs/compare.md)."""

    def delta(d: StageDelta) -> dict[str, Any]:
        return {
            "stage": d.stage,
            "baseline_s": d.baseline_s,
            "current_s": d.current_s,
            "delta_s": round(d.delta_s, 6),
            "delta_pct": None if d.delta_pct is None else round(d.delta_pct * 100, 2),
            "noise_s": round(d.noise_s, 6),
            "significant": d.significant,
        }

    return {
        "schema": SCHEMA,
        "baseline": _run_json(comp.baseline),
        "current": _run_json(comp.current),
        "step": delta(comp.step) if comp.step else None,
        "stages": [delta(d) for d in comp.stages],
        "metrics": [
            {"metric": label, "unit": unit, "baseline": _stat_json(b), "current": _stat_json(c)}
            for label, b, c, unit in comp.metrics
        ],
        "config_diff": [
            {"key": k, "baseline": _json_value(a), "current": _json_value(b)}
            for k, a, b in comp.config_diff
        ],
        "versions": {k: {"baseline": a, "current": b} for k, (a, b) in comp.versions.items()},
        "verdict": comp.verdict,
    }


def _fmt_metric(st: Stat | None, unit: str) -> str:
    if st is None:
        return "—"
    if unit == "ratio":
        pct = st.median * 100
        return f"{pct:.1f} %" if pct >= 1 else f"{pct:.2g} %"
    return f"{st.median:.0f} {unit}"


def format_text(comp: Comparison) -> str:
    """The comparison for people: verdict, stage table, metrics, config changes."""
    b, c = comp.baseline, comp.current
    lines = [
        comp.verdict,
        "",
        f"baseline: {b.path} ({b.kind}, {b.step_range()})",
        f"current:  {c.path} ({c.kind}, {c.step_range()})",
        "",
        f"{'stage':<24} {'baseline':>10} {'current':>10} {'delta':>10} {'%':>7} {'noise ±':>9}",
    ]
    rows = ([comp.step] if comp.step else []) + comp.stages
    for d in rows:
        pct = f"{d.delta_pct * 100:+.0f}" if d.delta_pct is not None else "new"
        mark = " *" if d.significant else ""
        lines.append(
            f"{d.stage:<24} {fmt_s(d.baseline_s) if d.baseline_s is not None else '—':>10} "
            f"{fmt_s(d.current_s) if d.current_s is not None else '—':>10} "
            f"{fmt_signed(d.delta_s):>10} {pct:>7} {fmt_s(d.noise_s):>9}{mark}"
        )
    lines.append("(* beyond the noise band: 95 % of the two runs' own step-to-step spread)")
    if comp.metrics:
        lines += ["", f"{'metric':<24} {'baseline':>16} {'current':>16}"]
        for label, mb, mc, unit in comp.metrics:
            lines.append(f"{label:<24} {_fmt_metric(mb, unit):>16} {_fmt_metric(mc, unit):>16}")
    if b.gpu_activity is not None or c.gpu_activity is not None:
        lines.append(
            f"{'GPU activity':<24} "
            f"{'—' if b.gpu_activity is None else f'{b.gpu_activity:.0f} %':>16} "
            f"{'—' if c.gpu_activity is None else f'{c.gpu_activity:.0f} %':>16}"
        )
    if comp.config_diff:
        lines += ["", "config keys that differ (secrets redacted):"]
        lines += [f"  {k}: {a} -> {v}" for k, a, v in comp.config_diff[:60]]
        if len(comp.config_diff) > 60:
            lines.append(f"  … and {len(comp.config_diff) - 60} more (--json lists all)")
    if comp.versions:
        lines += ["", "versions:"] + [f"  {k}: {a} -> {v}" for k, (a, v) in comp.versions.items()]
    return "\n".join(lines) + "\n"
