"""``report.md``: the snapshot as a short Markdown report, readable pasted into an issue or chat.

The five diagnosis steps with the verdict, evidence and advice come first; then small tables:
GPUs per host, the last steps' stage times and shares, processes by role, the config, NCCL and
events. Every table is capped; the full data is in ``snapshot.json``. The text is built from the
already redacted snapshot document and redacted once more line by line.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from datetime import datetime, timezone
from typing import Any

from verl_top.assessment import Assessment
from verl_top.diagnosis.findings import STEP_NAMES, worth_text
from verl_top.export.redact import redact_text
from verl_top.status import job_status
from verl_top.store import Store
from verl_top.untrusted import clean_text
from verl_top.verl.flavour import store_flavour
from verl_top.verl.stages import DISPLAY_STAGES, timing_name

MAX_GPU_ROWS = 64  # beyond this, one row per host
MAX_HOST_ROWS = 32
MAX_STEP_ROWS = 8
MAX_STAGE_COLUMNS = 8
MAX_CONFIG_ROWS = 60
MAX_EVENT_ROWS = 10
MAX_PROBE_ROWS = 5
MAX_CHECK_ROWS = 12  # per step
MAX_CELL = 80

# Config keys the diagnosis reads most; shown first when the config is long.
KEY_CONFIG_PARTS: tuple[str, ...] = (
    "nnodes",
    "n_gpus_per_node",
    "train_batch_size",
    "ppo_mini_batch_size",
    "micro_batch_size",
    "max_prompt_length",
    "max_response_length",
    "rollout.name",
    "rollout.mode",
    "rollout.n",
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
    "free_cache_engine",
    "use_dynamic_bsz",
    "max_token_len",
    "strategy",
    "offload",
    "model.path",
    "balance_batch",
    "test_freq",
    "save_freq",
)


# A time at or before the epoch is "no data": 0 is an unset time, and a window start computed
# from an empty store (0 - 300 s) printed as 1969-12-31.
EPOCH_FLOOR = 0.0


def _iso(t: float | None) -> str:
    """A UTC time, or "no data" for a missing time (never 1970-01-01 / 1969-12-31)."""
    if t is None or not math.isfinite(t) or t <= EPOCH_FLOOR:
        return "no data"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def data_span(doc: dict[str, Any]) -> tuple[float, float] | None:
    """First and last time with data in the snapshot (samples and steps), None without data.

    This is the window the report speaks about: after ``--duration 10`` it is ~10 s, not the
    store's 300 s history window.
    """
    times: list[float] = []
    for entry in (*doc["hosts"], *doc["gpus"]):
        t = (entry.get("series") or {}).get("t") or []
        times += [t[0], t[-1]] if t else []
    times += [s["t"] for s in doc["steps"] if s.get("t")]
    times = [t for t in times if isinstance(t, int | float) and t > EPOCH_FLOOR]
    return (min(times), max(times)) if times else None


def _f(x: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x) + unit


# Characters that make Markdown markup anywhere in a line (emphasis, links, HTML, entities,
# strikethrough, code, table cells). Foreign text (host names, GPU models, config keys and
# values, log events) has each of them escaped, so a GPU "model" named ``[x](http://evil)`` or
# ``<img src=...>`` shows as those characters, never as a link or HTML.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&!])")


def md_text(value: Any) -> str:
    """Foreign text as literal Markdown: one line, its markup characters backslash-escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def _code(value: Any) -> str:
    """Foreign text as an inline code span, fenced by more backticks than it holds."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(value: Any) -> str:
    """A table cell: one line, markup escaped, at most ``MAX_CELL`` characters."""
    text = md_text(value)
    if len(text) <= MAX_CELL:
        return text
    return text[: MAX_CELL - 1].rstrip("\\") + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


# -- sections ---------------------------------------------------------------------------------


def _summary(doc: dict[str, Any], assessment: Assessment | None, store: Store) -> list[str]:
    hosts = doc["hosts"]
    states = Counter(h["state"] for h in hosts)
    state_text = ", ".join(f"{n} {s}" for s, n in states.most_common())
    span = data_span(doc)
    window = (
        f"data {span[1] - span[0]:.0f} s ({_iso(span[0])} → {_iso(span[1])})"
        if span is not None
        else "no data"
    )
    lines = [
        f"# verl-top snapshot — {_iso(span[1] if span else None)}",
        "",
        f"verl-top {doc['tool']['version']} · {doc['mode']} · {window}"
        f" · {len(hosts)} host(s) ({state_text or 'none'})"
        f" · {len(doc['gpus'])} GPU(s) · {len(doc['steps'])} verl step(s) in this snapshot",
        "",
    ]
    verdict = assessment.verdict if assessment is not None else None
    status = assessment.status if assessment is not None else job_status(store, None)
    lines += [f"**Status:** {status.text}", ""]
    flavour = store_flavour(store)
    if flavour.trainer_mode is not None or flavour.version_range != "unknown":
        # What the job is read as: the trainer mode decides what timing_s/gen means.
        lines += [f"**verl:** {flavour.text()}", ""]
    if verdict is None:
        lines += ["Verdict: no diagnosis was run for this snapshot.", ""]
        return lines
    names = STEP_NAMES
    where = (
        f"step {verdict.bottleneck_step} ({names.get(verdict.bottleneck_step, '?')}), "
        f"rule `{verdict.bottleneck_rule}`"
        if verdict.bottleneck_step is not None
        else "no bottleneck"
    )
    lines += [f"Bottleneck: {where}.", ""]
    if assessment is not None and assessment.window:
        lines += [f"The verdict covers: {assessment.window}.", ""]
    if len(verdict.phases) > 1:
        lines += ["Phases of the run (where its shape changed; the verdict judges the last):", ""]
        lines += [f"- {p.text()}" for p in verdict.phases] + [""]
    return lines


def _five_steps(assessment: Assessment | None) -> list[str]:
    verdict = assessment.verdict if assessment is not None else None
    if verdict is None:
        return []
    names = STEP_NAMES
    lines = ["## The five steps", ""]
    for step, name in sorted(names.items()):
        findings = sorted(
            (f for f in verdict.findings if f.step == step), key=lambda f: -f.severity
        )
        checks = [c for c in verdict.checks if c.step == step]
        if step == verdict.bottleneck_step:
            status = "**BOTTLENECK**"
        elif findings:
            status = f"{len(findings)} finding(s)"
        elif checks and all(c.status == "no_data" for c in checks):
            status = "no data"
        elif checks:
            status = "passed"
        else:
            status = "not checked"
        lines += [f"### {step}. {name} — {status}", ""]
        for f in findings:
            lines.append(f"- **{f.title}** (rule `{f.rule}`, severity {f.severity:.2f})")
            lines += [f"  - {e}" for e in f.evidence]
            if worth := worth_text(f):
                lines.append(f"  - *Worth:* {worth}")
            if f.advice:
                lines.append(f"  - *Advice:* {f.advice}")
        if findings:
            lines.append("")
        if checks:
            rows = [[f"`{c.rule}`", c.status, _cell(c.detail)] for c in checks[:MAX_CHECK_ROWS]]
            lines += _table(["rule", "status", "detail"], rows)
            if len(checks) > MAX_CHECK_ROWS:
                lines.append(f"\n… {len(checks) - MAX_CHECK_ROWS} more checks in snapshot.json")
            lines.append("")
    return lines


def _malformed(store: Store, name: str) -> str:
    """Records of a host refused at the trust boundary (all reasons), when the store counts them."""
    drops = store.drops
    if not isinstance(drops, dict):
        return "-"  # a store that does not count refused records
    return str(sum(v for v in (drops.get(name) or {}).values() if isinstance(v, int)))


def _hosts(doc: dict[str, Any], store: Store) -> list[str]:
    """One row per host: state, GPUs, the agent's own CPU and memory, malformed records."""
    hosts = doc["hosts"]
    if not hosts:
        return ["## Hosts", "", "No host in this snapshot.", ""]
    gpus = Counter(g["host"] for g in doc["gpus"])
    rows = []
    for h in hosts[:MAX_HOST_ROWS]:
        latest = h.get("latest") or {}
        rss = latest.get("agent_rss_bytes")
        rows.append(
            [
                _cell(h["name"]),
                _cell(h["state"] + (f" ({h['reason']})" if h.get("reason") else "")),
                str(gpus.get(h["name"], 0)),
                _f(latest.get("agent_cpu_pct"), "{:.1f}", " %"),
                _f(None if rss is None else rss / 2**20, "{:.0f}", " MiB"),
                _malformed(store, h["name"]),
            ]
        )
    lines = ["## Hosts", ""]
    lines += _table(["host", "state", "GPUs", "agent CPU", "agent RSS", "malformed"], rows)
    if len(hosts) > MAX_HOST_ROWS:
        lines.append(f"\n… {len(hosts) - MAX_HOST_ROWS} more hosts in snapshot.json")
    return lines + [""]


def _gib(mib: float | None) -> str:
    return _f(None if mib is None else mib / 1024, "{:.1f}")


def _gpu_row(g: dict[str, Any]) -> list[str]:
    m, latest = g["means"], g["latest"] or {}
    mem = f"{_gib(latest.get('mem_used_mib'))} / {_gib(latest.get('mem_total_mib'))}"
    return [
        str(g["index"]),
        _f(m.get("activity"), unit=" %"),
        _f(m.get("util_gpu"), unit=" %"),
        _f(m.get("tensor_util"), unit=" %"),
        _f(m.get("dram_util"), unit=" %"),
        mem,
        _f(m.get("power_w"), unit=" W"),
        ", ".join(g.get("throttle_reasons") or []) or "-",
    ]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _gpus(doc: dict[str, Any]) -> list[str]:
    gpus = doc["gpus"]
    if not gpus:
        return ["## GPUs", "", "No GPU data in this snapshot.", ""]
    lines = [
        "## GPUs",
        "",
        "Means over the data window; memory = latest.",
    ]
    by_host: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        by_host.setdefault(g["host"], []).append(g)
    if len(gpus) <= MAX_GPU_ROWS:
        header = ["GPU", "activity", "NVML util", "tensor", "DRAM", "mem GiB", "power", "throttle"]
        for host, rows in by_host.items():
            lines += ["", f"**{md_text(host)}** ({md_text(rows[0].get('name') or 'GPU')})", ""]
            lines += _table(header, [_gpu_row(g) for g in rows])
        return lines + [""]
    header = ["host", "GPUs", "activity", "lowest GPU", "NVML util", "tensor", "DRAM", "power"]
    rows = []
    for host, gs in list(by_host.items())[:MAX_HOST_ROWS]:
        act = [g["means"].get("activity") for g in gs]
        low = min((a for a in act if a is not None), default=None)
        rows.append(
            [
                _cell(host),
                str(len(gs)),
                _f(_mean(act), unit=" %"),
                _f(low, unit=" %"),
                _f(_mean([g["means"].get("util_gpu") for g in gs]), unit=" %"),
                _f(_mean([g["means"].get("tensor_util") for g in gs]), unit=" %"),
                _f(_mean([g["means"].get("dram_util") for g in gs]), unit=" %"),
                _f(_mean([g["means"].get("power_w") for g in gs]), unit=" W"),
            ]
        )
    lines += ["", *_table(header, rows)]
    if len(by_host) > MAX_HOST_ROWS:
        lines.append(f"\n… {len(by_host) - MAX_HOST_ROWS} more hosts in snapshot.json")
    return lines + [""]


def stage_times(metrics: dict[str, Any]) -> dict[str, float]:
    """Stage name -> seconds from a step's ``timing_s/<stage>`` (or old ``timing/``) metrics."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = timing_name(key)
        if name is not None and isinstance(value, int | float) and value == value:
            out.setdefault(name, float(value))
    return out


def _steps(doc: dict[str, Any]) -> list[str]:
    steps = doc["steps"][-MAX_STEP_ROWS:]
    if not steps:
        return [
            "## Last steps",
            "",
            "No verl steps were seen (give the driver log with --verl-log).",
            "",
        ]
    timings = [stage_times(s["metrics"]) for s in steps]
    present = {k for t in timings for k in t if k != "step"}
    ordered = [s for s in DISPLAY_STAGES if s in present]
    rest = sorted(present - set(ordered), key=lambda k: -sum(t.get(k, 0.0) for t in timings))
    stages = (ordered + rest)[:MAX_STAGE_COLUMNS]
    rows = []
    for s, t in zip(steps, timings, strict=True):
        total = t.get("step")
        row = [str(s["step"]), _f(total, "{:.1f}", " s")]
        for stage in stages:
            v = t.get(stage)
            share = f" ({100 * v / total:.0f} %)" if v is not None and total else ""
            row.append("-" if v is None else f"{v:.1f} s{share}")
        rows.append(row)
    lines = ["## Last steps", "", "Stage times, with their share of the step time.", ""]
    lines += _table(["step", "step time", *stages], rows)
    return lines + [""]


def _processes(doc: dict[str, Any]) -> list[str]:
    procs = doc["processes"]
    if not procs:
        return []
    by_host: dict[str, list[dict[str, Any]]] = {}
    for p in procs:
        by_host.setdefault(p["host"], []).append(p)
    rows = []
    for host, ps in list(by_host.items())[:MAX_HOST_ROWS]:
        roles = Counter(p.get("verl_role") or p["role"] for p in ps)  # verl's name when known
        methods = Counter(p["method"] or "idle" for p in ps if p["role"] == "trainer")
        ranks = sorted(p["rank"] for p in ps if p["role"] == "trainer" and p["rank"] is not None)
        rank_text = f"{ranks[0]}–{ranks[-1]}" if ranks else "-"
        rows.append(
            [
                _cell(host),
                _cell(", ".join(f"{n} {r}" for r, n in roles.most_common())),
                _cell(", ".join(f"{n} {m}" for m, n in methods.most_common()) or "-"),
                rank_text,
            ]
        )
    lines = ["## GPU processes", ""]
    lines += _table(["host", "roles", "trainer phase", "trainer ranks"], rows)
    if len(by_host) > MAX_HOST_ROWS:
        lines.append(f"\n… {len(by_host) - MAX_HOST_ROWS} more hosts in snapshot.json")
    # The job's processes that hold no GPU (TaskRunner, ...), from Ray: named, not counted above.
    others = [m for m in doc.get("process_map", []) if m.get("source") == "ray"]
    if others:
        names = Counter(m["verl_role"] for m in others)
        lines.append(
            "\nWithout a GPU (Ray actors): " + ", ".join(f"{n} {r}" for r, n in names.most_common())
        )
    return lines + [""]


def _config(doc: dict[str, Any]) -> list[str]:
    values: dict[str, Any] = doc["config"]["values"]
    if not values:
        return ["## Config", "", "No config was read (give it with --verl-config).", ""]
    keys = sorted(values)
    if len(keys) > MAX_CONFIG_ROWS:
        key_first = [k for k in keys if any(p in k for p in KEY_CONFIG_PARTS)]
        keys = sorted((key_first + [k for k in keys if k not in key_first])[:MAX_CONFIG_ROWS])
    source = doc["config"]["source"]
    lines = ["## Config", "", f"Source: {source or '-'} (secrets redacted)", ""]
    lines += _table(["key", "value"], [[_code(k), _cell(values[k])] for k in keys])
    if len(values) > len(keys):
        lines.append(f"\n… {len(values) - len(keys)} more keys in snapshot.json")
    return lines + [""]


def _comm(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for n in doc["nccl"]:
        lines.append(
            f"- NCCL {md_text(n.get('version') or '?')} on {md_text(n.get('host'))}: transport "
            f"{md_text(n.get('transport') or '?')}, {n.get('nranks') or '?'} ranks, "
            f"{n.get('nnodes') or '?'} nodes"
        )
    probes = doc["probes"][-MAX_PROBE_ROWS:]
    if probes:
        rows = [
            [
                _cell(p.get("tool", "")),
                _cell(p.get("collective", "")),
                _cell(p.get("scope", "")),
                str(p.get("nranks", "")),
                _f(p.get("busbw_max_gbs"), "{:.1f}", " GB/s"),
                _f(p.get("expected_gbs"), "{:.1f}", " GB/s"),
                _cell(p.get("error") or ("ok" if p.get("ok", True) else "failed")),
            ]
            for p in probes
        ]
        lines += [
            "",
            *_table(["tool", "collective", "scope", "ranks", "busbw", "expected", ""], rows),
        ]
    if not lines:
        return []
    return ["## Communication", "", *lines, ""]


def _events(doc: dict[str, Any]) -> list[str]:
    events = doc["events"][-MAX_EVENT_ROWS:]
    if not events:
        return []
    rows = [
        [
            _iso(e.get("t")),
            _cell(e.get("host", "")),
            _cell(e.get("kind", "")),
            _cell(e.get("text", "")),
        ]
        for e in events
    ]
    lines = ["## Log events", "", *_table(["time", "host", "kind", "text"], rows)]
    if len(doc["events"]) > MAX_EVENT_ROWS:
        lines.append(f"\n… {len(doc['events']) - MAX_EVENT_ROWS} earlier events in snapshot.json")
    return lines + [""]


def _environment(doc: dict[str, Any]) -> list[str]:
    """Software versions (or 'unknown', with where each was read), the launch command and
    the last error lines of the followed logs."""
    env = doc.get("environment") or {}
    rows = [[s["name"], s["version"], s["source"]] for s in env.get("software", [])]
    lines = ["## Software", "", *_table(["what", "version", "read from"], rows), ""]
    launch = env.get("launch") or {}
    lines += ["## Launch command", ""]
    if launch.get("command"):
        lines += [
            f"From {launch.get('source')} (secrets redacted):",
            "",
            "```",
            launch["command"],
            "```",
        ]
    else:
        lines.append(f"Not seen: {launch.get('source', '')}.")
    lines += ["", "## Last error lines", ""]
    errors = env.get("errors") or []
    if errors:
        lines += [
            "The last lines of the followed logs that report an error, oldest first:",
            "",
            "```",
        ]
        lines += list(errors)
        lines.append("```")
    else:
        lines.append("No traceback, OOM, NCCL WARN or watchdog line in the logs read.")
    return [*lines, ""]


def _history(assessment: Assessment | None) -> list[str]:
    """The leads shown over time (the monitor's hysteresis kept each for a while)."""
    lines = ["## Verdict history", ""]
    changes = list(assessment.history) if assessment is not None else []
    if not changes:
        return [*lines, "No verdict was given.", ""]
    rows = [
        [_iso(c.t), f"step {c.step}" if c.step else "-", c.rule or "no bottleneck", c.title or ""]
        for c in changes
    ]
    return [*lines, *_table(["data time", "step", "lead", "title"], rows), ""]


def _files(doc: dict[str, Any], store: Store) -> list[str]:
    files = doc["files"]
    screen = (
        f"- `{files['screen']}` — the verl-top screen when the snapshot was taken"
        if files.get("screen")
        else "- no screenshot: this snapshot was taken without a screen (`verl-top snapshot`); "
        "press `s` in the app to include one"
    )
    intervals = [h["hello"].get("interval") for h in doc["hosts"] if h.get("hello")]
    interval = min((i for i in intervals if i), default=None)
    replay = f"verl-top --replay {files['recording']} --window {doc['window']['seconds']:g}"
    if interval:
        replay += f" --interval {interval:g}"
    return [
        "## Files",
        "",
        f"- `snapshot.json` — all data ({doc['schema']}; see docs/snapshot.md)",
        f"- `{files['recording']}` — the records behind this report; replay with `{replay}`",
        screen,
        "",
        f"Secrets were replaced by `{doc['redaction']['placeholder']}`.",
        "",
    ]


def build_report(
    store: Store, assessment: Assessment | None, doc: dict[str, Any], screen: bool = False
) -> str:
    """The Markdown report of a snapshot document (``snapshot.build_snapshot``)."""
    lines: list[str] = []
    lines += _summary(doc, assessment, store)
    lines += _five_steps(assessment)
    lines += _hosts(doc, store)
    lines += _gpus(doc)
    lines += _steps(doc)
    lines += _processes(doc)
    lines += _comm(doc)
    lines += _config(doc)
    lines += _events(doc)
    lines += _environment(doc)
    lines += _history(assessment)
    lines += _files(doc, store)
    # Foreign text was cleaned where it entered; clean again so no record path can bypass it.
    return "\n".join(clean_text(redact_text(line), 8192) for line in lines).rstrip() + "\n"
