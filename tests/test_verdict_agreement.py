"""One verdict on every surface (issue 27 item 7): every scenario and the real GPU-machine
recordings go through the app (a *paced* replay), ``diagnose``, ``snapshot`` and
``export-metrics`` (scraped over HTTP), and all four must name the same step and rule.

Each surface is run as a user runs it (the CLI's own code path, in-process for speed); the
expected lead of each scenario is its expected.json, written when the scenario was built.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from textual.widgets import TabbedContent

from verl_top.cli import app_parser, main
from verl_top.inputs import build_inputs
from verl_top.protocol import read_recording
from verl_top.ui.app import VerlTopApp

ROOT = Path(__file__).resolve().parents[1]
SCEN = ROOT / "tests" / "scenarios"
# map.topology needs store.topology, which no recording carries: engine-only (test_diagnosis_scenarios).
SCENARIOS = sorted(
    d.name
    for d in SCEN.iterdir()
    if (d / "expected.json").exists() and not (d / "topology.json").exists()
)
REAL = {
    # verl 0.5.0 GRPO on one H200 (HF rollout): the recordings verl-top made watching real jobs.
    "real_small": ROOT / "tests/fixtures/real_h200/small/session.ndjson.gz",
    "real_tiny": ROOT / "tests/fixtures/real_h200/tiny/session.ndjson.gz",
    "real_grpo_session": ROOT / "tests/fixtures/h200/real_verl050_grpo_session.ndjson.gz",
}
CASES = [(n, SCEN / n / "recording.ndjson") for n in SCENARIOS] + sorted(REAL.items())
APP_PLAY_S = 1.0  # each recording is paced to play in about this many wall seconds


def _run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, out.getvalue()


def _lead_of(doc: dict) -> tuple[int | None, str | None]:
    return doc["bottleneck"]["step"], doc["bottleneck"]["rule"]


def _speed(path: Path) -> float:
    times = [r.t for r in read_recording(path) if r.t]
    span = (max(times) - min(times)) if times else 0.0
    return max(1.0, span / APP_PLAY_S)


async def _app_lead(path: Path) -> tuple[int | None, str | None, str]:
    """Play the recording paced in the app until it ends; (step, rule, banner text)."""
    args = app_parser().parse_args(["--replay", str(path), "--speed", f"{_speed(path):g}"])
    inputs = build_inputs(args)
    app = VerlTopApp(inputs, refresh=0.2)  # five or more looks while it plays
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(200):
            await pilot.pause(0.05)
            if app.assessment.settled:
                break
        await pilot.pause()
        a = app.assessment
        assert a.settled, "the replay did not end"
        tabs = app.query_one(TabbedContent)
        marked = [s for s in range(1, 6) if str(tabs.get_tab(f"pane-{s}").label).startswith("●")]
        assert marked == ([a.bottleneck_step] if a.bottleneck_step else [])
        banner = str(app.query_one("#banner").render())
    return a.bottleneck_step, a.bottleneck_rule, banner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback test server
        return resp.read().decode()


async def _metrics_lead(path: Path) -> tuple[int | None, str | None]:
    """``export-metrics --replay``: scrape until the inputs ended, then read the lead."""
    from verl_top.cli import _engine, export_metrics_parser
    from verl_top.export.metrics import serve
    from verl_top.settings import Settings

    port = _free_port()
    args = export_metrics_parser().parse_args(
        ["--replay", str(path), "--speed", f"{_speed(path):g}", "--listen", f"127.0.0.1:{port}"]
        + ["--refresh", "0.05"]
    )
    inputs = build_inputs(args)
    task = asyncio.create_task(
        serve(inputs, _engine(Settings(), args), args.listen, args.refresh, duration=30)
    )
    text = ""
    try:
        for _ in range(300):
            await asyncio.sleep(0.05)
            with contextlib.suppress(OSError):
                text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
                if "verl_top_inputs_ended 1.0" in text:
                    break
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "verl_top_inputs_ended 1.0" in text, "export-metrics never settled"
    step = int(float(re.search(r"^verl_top_bottleneck_step (\S+)$", text, re.M).group(1)))
    if not step:
        return None, None
    flagged = [
        line
        for line in text.splitlines()
        if line.startswith("verl_top_bottleneck{") and line.endswith(" 1.0")
    ]
    assert len(flagged) == 1 and f'step="{step}"' in flagged[0], flagged
    return step, re.search(r'rule="([^"]*)"', flagged[0]).group(1)


@pytest.mark.parametrize("name,path", CASES, ids=[c[0] for c in CASES])
def test_every_surface_names_the_same_lead(name: str, path: Path, tmp_path: Path) -> None:
    code, out = _run_cli("diagnose", "--replay", str(path), "--json")
    assert code in (0, 3), out
    diagnose = json.loads(out)
    lead = _lead_of(diagnose)
    expected = SCEN / name / "expected.json"
    if expected.exists():
        exp = json.loads(expected.read_text())
        assert lead == (exp["step"], exp["rule"]), diagnose["status"]["text"]

    code, out = _run_cli("snapshot", "--replay", str(path), "-o", str(tmp_path / "snap"))
    assert code == 0, out
    snap = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
    assert _lead_of(snap["diagnosis"]) == lead
    report = (tmp_path / "snap" / "report.md").read_text()
    assert diagnose["status"]["text"] in report  # the same words, not only the same rule

    assert asyncio.run(_metrics_lead(path)) == lead

    step, rule, banner = asyncio.run(_app_lead(path))
    assert (step, rule) == lead
    # The banner shortens by meaning (docs/ui.md) but names the same state and lead.
    label = diagnose["status"]["label"]
    assert label in banner, (label, banner)
    if rule is not None:
        title = next(f["title"] for f in diagnose["findings"] if f["rule"] == rule)
        assert title[:24] in banner, (title, banner)
