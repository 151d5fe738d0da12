"""The banner at a glance (issue 32 item 1): the verdict, its saving and its advice in at most two
lines at 80, 120 and 200 columns, shortened by meaning; the warm-up state; hints that know the
session's source. Findings are the engine's own on real fixtures (tests/fixtures/PROVENANCE.md).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from verl_top.assessment import Assessment
from verl_top.cli import diagnose_parser
from verl_top.diagnosis.findings import Finding
from verl_top.headless import collect
from verl_top.inputs import Inputs, build_inputs
from verl_top.model import VerlStep
from verl_top.monitor import Monitor
from verl_top.origin import ORIGINS, verl_log_ask
from verl_top.protocol import read_recording
from verl_top.sources.pipeline import Pipeline
from verl_top.status import WAITING
from verl_top.store import Store
from verl_top.ui.banner import (
    advice_forms,
    fit_banner,
    fmt_seconds,
    saving_text,
    shorten,
    status_label,
)
from verl_top.ui.header import banner_lines

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
SESSION = FIX / "h200" / "real_verl050_grpo_session.ndjson.gz"
REAL = [
    ["--replay", str(SESSION)],
    ["--verl-log", str(FIX / "verl" / "real_h200_verl050_grpo_hf_40steps.log")],
    ["--verl-log", str(FIX / "real_logs" / "grpo_megatron_deepseek7b_16gpu_preemption.log")],
    ["--verl-log", str(FIX / "real_logs" / "ppo_critic_qwen25_7b_2x8gpu_ray_job_submit.log")],
    ["--verl-log", str(FIX / "real_logs" / "vlm_gui_cursor_custom_rollout_key.log")],
    ["--demo"],
]
WIDTHS = (80, 120, 200)
# A setting the advice names (the same kinds banner.py keeps): dotted key, key=value, ENV_VAR.
SETTING = re.compile(r"[a-z_]+\.[a-z_][a-z_.]*|\w+=\w+|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")
PUNCT = ".,;:()—→●…'\""


def assess(argv: list[str]) -> Assessment:
    inputs = build_inputs(diagnose_parser().parse_args(argv))
    try:
        return asyncio.run(collect(inputs))
    finally:
        inputs.close()


@pytest.fixture(scope="module")
def real_leads() -> dict[str, Finding]:
    leads = {}
    for argv in REAL:
        lead = assess(argv).lead
        assert lead is not None, argv  # each of these real runs has a bottleneck
        leads[Path(argv[-1]).name] = lead
    return leads


def words(*texts: str) -> set[str]:
    """The words of the source texts, with and without verl's actor_rollout_ref. prefix."""
    out: set[str] = set()
    for text in texts:
        for token in text.replace("actor_rollout_ref.", " ").split() + text.split():
            out.add(token.strip(PUNCT))
    return out


def assert_shortened_by_meaning(line: str, sources: set[str]) -> None:
    """Every word of ``line`` is a whole word of the sources, or ends in … (a marked cut)."""
    for token in line.split():
        if token.endswith("…"):
            continue
        word = token.strip(PUNCT)
        assert not word or word in sources, (word, line)


@pytest.mark.parametrize("width", WIDTHS)
def test_real_leads_keep_verdict_saving_and_advice_at_every_width(real_leads, width) -> None:
    room = width - 2  # the banner's padding
    for name, lead in real_leads.items():
        first, second = fit_banner(
            lead.title, saving_text(lead), lead.advice, status_label(lead), room
        )
        assert cell_len(first) <= room and cell_len(second) <= room, (name, first, second)
        # the verdict: its step and (part of) its title
        assert first.startswith(f"● step {lead.step}"), (name, first)
        assert lead.title.split()[0] in first, (name, first)
        # its saving, in readable units
        assert lead.save_s is not None, name
        assert f"saves up to {fmt_seconds(lead.save_s)}/step" in first, (name, first)
        assert "e+" not in first and "e-0" not in first
        # its advice, with a setting it names
        assert second.startswith("→ "), (name, second)
        named = {
            m.group().removeprefix("actor_rollout_ref.") for m in SETTING.finditer(lead.advice)
        }
        if named:
            assert any(key in second for key in named), (name, second)
        source = words(lead.title, lead.advice, saving_text(lead), status_label(lead))
        assert_shortened_by_meaning(first, source)
        assert_shortened_by_meaning(second, source)


def test_at_200_columns_the_whole_lead_and_its_share_fit(real_leads) -> None:
    for name, lead in real_leads.items():
        first, _ = fit_banner(lead.title, saving_text(lead), lead.advice, status_label(lead), 198)
        assert lead.title in first, name  # nothing of the title is dropped at 200 columns
        share = 100 * lead.save_s / lead.step_s
        assert f"({share:.0f} % of the {fmt_seconds(lead.step_s)} step)" in first, name


def test_the_real_hf_session_at_80_columns_reads_as_planned(real_leads) -> None:
    """Written from the numbers before running: the lead (91 % gen, 18 s of a 19.9 s step,
    HF rollout) keeps its step, first clauses and saving; the advice keeps the switch to
    vllm/sglang with the full key (it fits 78 cells)."""
    lead = real_leads[SESSION.name]
    assert lead.rule == "flow.rollout_bound" and lead.step_s == pytest.approx(19.9, abs=0.1)
    first, second = fit_banner(lead.title, saving_text(lead), lead.advice, status_label(lead), 78)
    assert first.startswith("● step 3: Rollout takes 91 % of the step")
    assert first.endswith(f"— saves up to {fmt_seconds(lead.save_s)}/step")
    assert second == "→ Switch actor_rollout_ref.rollout.name to vllm or sglang"


def test_without_a_lead_the_status_wraps_over_two_lines_at_a_space() -> None:
    status = (
        "no data: tests/fixtures/real_logs/tpu_xla_fork_no_step_after_7min.log: 729 lines read, "
        "0 verl steps, 241 config keys, no step with stage timings (timing_s/*); config findings, "
        "if any, are listed below"
    )
    for width in (78, 118, 198):
        first, second = fit_banner("", "", "", status, width)
        assert cell_len(first) <= width and cell_len(second) <= width
        # what is shown is the status's start, broken at a space, cut only with the mark
        assert status.startswith(f"{first} {second.removesuffix('…')}".strip())
        assert second.endswith("…") == (cell_len(status) > 2 * width)
    assert fit_banner("", "", "", "healthy: 8 GPUs at 92 % activity", 78) == (
        "healthy: 8 GPUs at 92 % activity",
        "",
    )


def test_shorten_never_cuts_a_word_without_the_ellipsis() -> None:
    assert shorten("raise rollout.max_num_seqs now", 20) == "raise…"
    assert shorten("raise rollout.max_num_seqs now", 30) == "raise rollout.max_num_seqs now"
    assert shorten("supercalifragilistic", 6) == "super…"  # one word: cut inside, marked
    forms = advice_forms("Cut the tail: a.b_c, d (x, y); if z, review e.f. (Note.)")
    assert forms[0].startswith("Cut the tail") and "(" not in forms[1]


def test_fmt_seconds_is_readable() -> None:
    # The findings' own formatter (readable.seconds): the banner and the worth line agree.
    assert [fmt_seconds(s) for s in (1.94, 18.05, 592.8, 1053.8, 9000)] == [
        "1.94 s",
        "18.1 s",
        "593 s",
        "17.6 min",
        "2.5 h",
    ]
def test_banner_seconds_are_the_shared_readable_ones() -> None:
    from verl_top.diagnosis import readable

    assert fmt_seconds is readable.seconds  # one way to write seconds on every surface
    assert "e+" not in fmt_seconds(1053.8) and fmt_seconds(1053.8).endswith(" min")


def _warm_up_monitor() -> tuple[Monitor, float]:
    """The real session fed up to its first verl step: (monitor, first step's data time)."""
    store = Store()
    monitor = Monitor(Inputs(store=store, pipeline=Pipeline(store, parsers={})))
    for rec in read_recording(SESSION):
        if isinstance(rec, VerlStep):
            return monitor, rec.t
        store.ingest(rec)
    raise AssertionError("the session has a verl step")


def test_warm_up_of_the_real_session_waits_for_the_first_step() -> None:
    monitor, step_t = _warm_up_monitor()
    assessment = monitor.assess(force=True)
    store = monitor.store
    # The GPU is idle and one core pinned while verl starts: findings, but not a verdict.
    assert {f.rule for f in assessment.findings} >= {"gpu.idle"}
    assert assessment.lead is None and assessment.status.state == WAITING
    waited = store.now - store.first_t
    assert 30 < waited < step_t - store.first_t + 1  # ~38 s of start-up in this recording
    first, second = banner_lines(assessment, 78)
    assert first == f"waiting for the first verl step ({waited:.0f} s); 1 GPU seen"
    assert second == ""


async def test_pane1_says_waiting_not_give_verl_log_in_a_replay_before_its_first_step() -> None:
    from test_ui_app import make_app, plain, started
    from textual.widgets import Static

    monitor, _ = _warm_up_monitor()
    monitor.store.origin = "replay"
    app = make_app(monitor.store, mode="REPLAY")
    app.monitor = monitor
    async with app.run_test(size=(120, 40)) as pilot:
        await started(app, pilot)
        app.refresh_now()
        summary = plain(app.query_one("#verl-summary", Static))
        assert "waiting for the first step" in summary and "--verl-log" not in summary
        assert "waiting for the first verl step" in plain(app.query_one("#banner", Static))


def test_diagnose_on_a_replay_with_steps_never_asks_for_a_verl_log() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "diagnose", "--replay", str(SESSION)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "--verl-log" not in out.stdout
    assert "tput.drop: needs >= 6 verl steps (have 1)\n" in out.stdout


def test_each_origin_has_its_own_way_to_get_verl_steps() -> None:
    asks = {}
    for origin in ORIGINS:
        store = Store()
        store.origin = origin
        asks[origin] = verl_log_ask(store)
    assert "HOST:PATH" in asks["ssh"] and "HOST:PATH" in asks["ray"]
    assert asks["prometheus"].startswith("Prometheus has no verl steps")
    assert asks["replay"] == asks["demo"]
    assert asks["replay"].startswith("the recording has no verl step")
    assert asks["local"].startswith("give --verl-log PATH")
    store = Store()
    store.ingest(VerlStep(host="h", t=1.0, step=1, metrics={}))
    assert verl_log_ask(store) == ""  # steps read: never ask for a log


def test_prometheus_and_replays_say_what_they_cannot_know() -> None:
    """dcgm-exporter has no process list and no host sample: say so, not 'yet' (issue 32
    item 6); a recording without them says the recording has none."""
    from verl_top.model import GpuSample
    from verl_top.ui.node_screen import render_hidden, render_host

    words = {}
    for origin in ("prometheus", "replay", "ssh"):
        store = Store()
        store.origin = origin
        store.ingest(GpuSample(host="gpu01", t=1.0, index=0, util_gpu=50.0))
        h = store.hosts["gpu01"]
        words[origin] = (
            str(render_hidden(h, [], {}, store)),
            str(render_host(store, h, {}, 40)),
        )
    procs, host = words["prometheus"]
    assert procs.startswith("process lists are not exported by dcgm-exporter")
    assert "not in dcgm-exporter's series" in host and "yet" not in procs + host
    assert words["replay"][0] == "the recording has no GPU process list for this node"
    assert "from this node yet" in words["ssh"][0] and "no host sample yet" in words["ssh"][1]
