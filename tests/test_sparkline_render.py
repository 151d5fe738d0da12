"""Pane 1's cells and gradient sparklines draw themselves straight to segments (``LineText``,
issue 30): the picture must be exactly what ``rich.text.Text`` draws for the same text, spans,
style and justification, in every cell the GPU table can put them in (as wide as the text,
wider, narrower)."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.padding import Padding
from rich.style import Style
from rich.text import Span, Text
from textual.renderables.styled import Styled

from verl_top.ui.widgets import ACTIVITY_STOPS, SPARK_CHARS, LineText, RunText, window_spark

PALETTE = {"error": "#ff4444", "warning": "#ffaa00", "success": "#44bb44"}


def cell_lines(renderable: object, width: int, justify: str | None = None) -> list[list]:
    """What the DataTable draws for a cell: padded, styled, cut into lines of ``width``."""
    console = Console(width=200, color_system="truecolor", force_terminal=True)
    options = console.options.update_width(width).update(no_wrap=True)
    if justify is not None:
        options = options.update(justify=justify)
    cell = Styled(
        Padding(renderable, (0, 1)), pre_style=Style(bgcolor="black"), post_style=Style(bold=True)
    )
    return console.render_lines(cell, options)


def sparkline(seed: int, width: int) -> RunText:
    rng = random.Random(seed)
    values = [
        max(0.0, min(100.0, 60 + 40 * math.sin(i / 40) + rng.uniform(-20, 20))) for i in range(300)
    ]
    times = [float(i) for i in range(300)]
    spark = window_spark(
        values, times, (0.0, 299.0), width, PALETTE, stops=ACTIVITY_STOPS, cache={}
    )
    assert isinstance(spark, RunText)
    return spark


def as_text(run: Text) -> Text:
    return Text(run.plain, spans=list(run.spans), no_wrap=run.no_wrap, end=run.end)


def test_a_gradient_sparkline_draws_what_text_draws() -> None:
    for seed in range(4):
        for width in (8, 16, 61):
            spark = sparkline(seed, width)
            assert len(spark.spans) > 1  # a real gradient: several runs
            for cell in (width + 2, width + 7, width - 3):  # exact fit, wider, cropped
                for justify in (None, "right", "center"):
                    want = cell_lines(as_text(spark), cell, justify)
                    assert cell_lines(spark, cell, justify) == want, (seed, width, cell, justify)


def test_text_the_fast_path_cannot_draw_goes_through_text() -> None:
    # Overlapping spans, a base style, an empty span, a span past the end, two lines.
    cases = [
        RunText("▁▂▃▄", spans=[Span(0, 3, "red"), Span(1, 4, "bold")]),
        RunText("▁▂▃▄", style="italic", spans=[Span(0, 2, "red")]),
        RunText("▁▂▃▄", spans=[Span(1, 1, "red"), Span(2, 4, "green")]),
        RunText("▁▂", spans=[Span(0, 5, "red")]),
        RunText("▁▂\n▃▄", spans=[Span(0, 2, "red"), Span(3, 5, "green")]),
    ]
    for run in cases:
        plain = Text(run.plain, spans=list(run.spans), style=run.style)
        for cell in (4, 6, 9):
            assert cell_lines(run, cell) == cell_lines(plain, cell), (run, cell)


def test_the_runs_are_one_span_per_level_change() -> None:
    values = [100.0] * 10 + [0.0] * 10 + [100.0] * 10
    spark = window_spark(
        values, [float(i) for i in range(30)], (0.0, 29.0), 30, PALETTE, ACTIVITY_STOPS
    )
    assert spark.plain == SPARK_CHARS[-1] * 10 + SPARK_CHARS[0] * 10 + SPARK_CHARS[-1] * 10
    assert [(s.start, s.end) for s in spark.spans] == [(0, 10), (10, 20), (20, 30)]
    assert spark.spans[0].style == spark.spans[2].style != spark.spans[1].style


TEXTS = st.text(alphabet=st.sampled_from(list("ab  1.%中✓")), max_size=12)
STYLES = st.sampled_from(["", "bold", "#ff0000", "dim", "bold #44bb44 on black"])
JUSTIFY = st.sampled_from([None, "default", "left", "right", "center", "full"])


@st.composite
def line_texts(draw: st.DrawFn) -> LineText:
    plain = draw(TEXTS)
    edges = sorted(draw(st.lists(st.integers(0, len(plain)), max_size=6)))
    spans = [Span(a, b, draw(STYLES)) for a, b in zip(edges[::2], edges[1::2], strict=False)]
    return LineText(
        plain,
        style=draw(STYLES),
        spans=spans,
        justify=draw(JUSTIFY),
        overflow=draw(st.sampled_from([None, "crop", "ellipsis", "fold", "ignore"])),
        no_wrap=draw(st.sampled_from([None, True, False])),
    )


@settings(max_examples=500, derandomize=True)
@given(line_texts(), st.integers(2, 18), JUSTIFY)
def test_any_one_line_cell_draws_what_text_draws(
    cell: LineText, width: int, justify: str | None
) -> None:
    """Pane 1's number and name cells: any justification, base style, spans and width."""
    plain = Text(
        cell.plain,
        style=cell.style,
        spans=list(cell.spans),
        justify=cell.justify,
        overflow=cell.overflow,
        no_wrap=cell.no_wrap,
    )
    assert cell_lines(cell, width, justify) == cell_lines(plain, width, justify)
