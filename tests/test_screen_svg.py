"""screen.svg of a headless snapshot (issue 32 item 8): valid XML, the whole banner, the data's
span (not the replay clock), and readable in librsvg (cells keep their spaces, monospace)."""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from verl_top.cli import diagnose_parser
from verl_top.headless import collect
from verl_top.inputs import build_inputs
from verl_top.ui.banner import fmt_seconds, saving_text
from verl_top.ui.screenshot import render_screen_svg

SESSION = (
    Path(__file__).resolve().parent / "fixtures" / "h200" / "real_verl050_grpo_session.ndjson.gz"
)


@pytest.fixture(scope="module")
def svg_and_lead():  # noqa: ANN201
    inputs = build_inputs(diagnose_parser().parse_args(["--replay", str(SESSION)]))
    try:
        assessment = asyncio.run(collect(inputs))
        svg = asyncio.run(render_screen_svg(inputs, assessment))
        span = inputs.store.now - inputs.store.first_t
    finally:
        inputs.close()
    return svg, assessment.lead, span


def lines_of(svg: str) -> list[str]:
    """The screen's text rows (cells of one row joined by their y)."""
    rows: dict[str, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text[^>]*\bx="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        rows.setdefault(m.group(2), []).append((float(m.group(1)), html.unescape(m.group(3))))
    return ["".join(t for _, t in sorted(cells)).replace("\xa0", " ") for cells in rows.values()]


def test_screen_svg_is_xml_with_the_whole_banner_and_the_datas_span(svg_and_lead) -> None:
    svg, lead, span = svg_and_lead
    root = ET.fromstring(svg)  # parses as XML
    assert root.tag.endswith("svg")
    text = "\n".join(lines_of(svg))
    assert f"finished · {fmt_seconds(span)} of data" in text  # ~40 s, not "x1 at +0s"
    assert "at +0s" not in text
    assert 35 < span < 45
    # The banner at 160 columns: the whole title, its saving and the advice's switch.
    assert lead.title in text and saving_text(lead).split(" (")[0] in text
    assert "→ Switch actor_rollout_ref.rollout.name to vllm or sglang" in text


def test_screen_svg_keeps_cell_spaces_and_a_monospace_font_for_librsvg(svg_and_lead) -> None:
    svg, _, _ = svg_and_lead
    head = svg[: svg.index(">", svg.index("<svg")) + 1]
    assert 'xml:space="preserve"' in head  # else librsvg drops the cells' leading spaces
    assert "font-family: Fira Code" not in svg and "font-family: monospace" in svg


@pytest.mark.skipif(shutil.which("rsvg-convert") is None, reason="rsvg-convert: librsvg2-bin")
def test_librsvg_renders_it(svg_and_lead, tmp_path: Path) -> None:
    svg, _, _ = svg_and_lead
    (tmp_path / "screen.svg").write_text(svg)
    done = subprocess.run(
        ["rsvg-convert", str(tmp_path / "screen.svg"), "-o", str(tmp_path / "screen.png")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "screen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
