"""The app and `verl-top diagnose --json` give the same lead verdict on every real corpus log
(issue 17, "done when"). Each log is copied with a finished job's mtime, opened in the app
(headless Pilot) and diagnosed by the CLI; the app's verdict once the log is read must name the
same rule (or both: no bottleneck)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from verl_top.cli import app_parser, main
from verl_top.inputs import build_inputs
from verl_top.ui.app import VerlTopApp

CORPUS = Path(__file__).parent / "fixtures" / "real_logs"
CASES = yaml.safe_load((CORPUS / "expected.yaml").read_text())


def _finished_copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    dst.write_bytes((CORPUS / name).read_bytes())
    old = time.time() - 7200  # last written two hours ago: a finished run
    os.utime(dst, (old, old))
    return dst


def _diagnose_rule(path: Path) -> str | None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["diagnose", "--verl-log", str(path), "--json"])
    return json.loads(out.getvalue())["bottleneck"]["rule"]


async def _app_rule(path: Path) -> str | None:
    inputs = build_inputs(app_parser().parse_args(["--verl-log", str(path)]))
    app = VerlTopApp(inputs, refresh=0.1)
    last, stable = object(), 0
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(100):  # the log is read to its end, then the verdict must hold still
            await pilot.pause(0.1)
            rule = app.assessment.bottleneck_rule
            stable = stable + 1 if rule == last and app.assessment.verdict is not None else 0
            last = rule
            if stable >= 5:
                break
    return last  # type: ignore[return-value]


@pytest.mark.parametrize("case", CASES, ids=[c["file"].removesuffix(".log") for c in CASES])
def test_app_and_diagnose_agree_on_real_log(case: dict, tmp_path: Path) -> None:
    path = _finished_copy(tmp_path, case["file"])
    cli_rule = _diagnose_rule(path)
    app_rule = asyncio.run(_app_rule(path))
    assert app_rule == cli_rule, f"app {app_rule} vs diagnose {cli_rule}"
