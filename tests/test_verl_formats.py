"""The shapes in which people paste verl logs (issue 17 items 2, 3, 8).

Each test reshapes a REAL verl 0.5.0 console log (tests/fixtures/verl/real_h200_verl050_*, see
PROVENANCE.md) the way a terminal, ``srun --label``, ``tee`` with timestamps or a logging
formatter does, and checks that exactly the same steps and values come out as from the original.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from verl_top.model import VerlConfig, VerlStep
from verl_top.verl.parse import VerlStreamParser, parse_console_line, parse_file

FIX = Path(__file__).parent / "fixtures" / "verl"
H200_40 = FIX / "real_h200_verl050_grpo_hf_40steps.log"
H200_SMALL = FIX / "real_h200_verl050_grpo_hf_qwen05b-shape_24steps.log"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def original():
    return parse_file(H200_40)


def _parse_lines(lines: list[str], path: str = "driver.log", chunk: int = 50):
    parser = VerlStreamParser("h", path)
    out = []
    for i in range(0, len(lines), chunk):
        out += parser.feed(lines[i : i + chunk], 1.0, more=i + chunk < len(lines))
    out += parser.flush(1.0)
    steps = [r for r in out if isinstance(r, VerlStep)]
    configs = [r for r in out if isinstance(r, VerlConfig)]
    return parser, steps, configs


def _same_steps(steps: list[VerlStep], original) -> None:
    assert [s.step for s in steps] == [s.step for s in original.steps]
    for got, want in zip(steps, original.steps, strict=True):
        assert got.metrics == want.metrics


def test_original_has_40_steps_and_full_config(original):
    # Numbers read by hand from the file: 40 "step:" lines; step 1 gen 18.05 s of a 19.92 s step.
    assert original.n_steps == 40 and original.malformed == 0
    s1 = original.step(1).metrics
    assert s1["timing_s/gen"] == pytest.approx(18.051974709999996)
    assert s1["timing_s/step"] == pytest.approx(19.918296663999996)
    assert s1["perf/mfu/actor"] == pytest.approx(3.5202119027333784e-06)  # np.float64(...)
    assert original.config["actor_rollout_ref.rollout.name"] == "hf"
    assert original.config_source == "console"


@pytest.mark.parametrize("width", [80, 133, 200])
def test_terminal_wrapped_lines_are_glued_back(original, width):
    raw = [ANSI.sub("", ln) for ln in H200_40.read_text().splitlines()]
    wrapped: list[str] = []
    for line in raw:
        if " step:" in line:  # a terminal breaks the long metrics lines at its width
            wrapped += [line[i : i + width] for i in range(0, len(line), width)]
        else:
            wrapped.append(line)
    parser, steps, _ = _parse_lines(wrapped)
    _same_steps(steps, original)
    assert parser.malformed == 0


def test_wrap_at_a_separator_keeps_both_pairs():
    lines = ["step:3 - a/b:1.5 -", "c/d:2.0 - e/f:np.float64(3.5)", "- g/h:4"]
    _, steps, _ = _parse_lines(lines)
    assert steps[0].metrics == {"a/b": 1.5, "c/d": 2.0, "e/f": 3.5, "g/h": 4.0}


def test_srun_labels_timestamps_and_logging_heads(original):
    raw = [ANSI.sub("", ln) for ln in H200_40.read_text().splitlines()]
    heads = ["0: ", "2026-12-02 22:07:31,004 ", "[2026-12-02T22:07:31.004Z] ", "0: 22:07:31 "]
    for head in heads:
        parser, steps, configs = _parse_lines([head + ln for ln in raw])
        _same_steps(steps, original)
        # The pprinted config keeps its indentation behind the head: every key is read.
        assert configs and len(configs[-1].values) == len(original.config), head
    logged = [f"INFO:verl.trainer:{ln}" if "step:" in ln else ln for ln in raw]
    _same_steps(_parse_lines(logged)[1], original)


def test_one_metric_per_line_block():
    lines = [
        "step: 12",
        "timing_s/gen: 299.46",
        "timing_s/step: 500.42",
        "perf/mfu/actor: np.float64(0.0)",
        "actor/loss: tensor(0.25, device='cuda:0')",
        "",
        "some other line",
    ]
    parser, steps, _ = _parse_lines(lines)
    assert [(s.step, s.metrics) for s in steps] == [
        (
            12,
            {
                "timing_s/gen": 299.46,
                "timing_s/step": 500.42,
                "perf/mfu/actor": 0.0,
                "actor/loss": 0.25,
            },
        )
    ]
    assert parser.matched == 5 and parser.first_unmatched == "some other line"


def test_values_as_verl_writes_them():
    step, m = parse_console_line(
        "step:1 - a:np.float64(1.5e-06) - b:tensor(0.5) - c:tensor(2.0, dtype=torch.float64)"
        " - d:np.float32(nan) - e:-inf - f:np.int64(7)"
    )
    assert (m["a"], m["b"], m["c"], m["e"], m["f"]) == (1.5e-06, 0.5, 2.0, -math.inf, 7.0)
    assert math.isnan(m["d"])


def test_config_entry_split_by_a_flush_is_read_whole():
    # The real qwen05b-shape log prints "'nnodes': " and "1," on two lines (lines 278-279).
    log = parse_file(H200_SMALL)
    assert log.config_source == "console" and len(log.config) == 306
    assert log.config["trainer.nnodes"] == 1
    assert log.config["trainer.npu_profile.options.level"] == "level1"


def test_config_survives_driver_lines_and_blank_lines_inside():
    raw = [ANSI.sub("", ln) for ln in H200_40.read_text().splitlines()]
    start = next(i for i, ln in enumerate(raw) if "{'actor_rollout_ref'" in ln)
    messy = list(raw)
    # A warning of the driver itself, another actor's line and blank lines land inside the dict.
    messy.insert(start + 30, "(TaskRunner pid=2192) WARNING: something the driver printed")
    messy.insert(start + 60, "(WorkerDict pid=2481) loading weights")
    messy.insert(start + 90, "")
    messy.insert(start + 91, "(TaskRunner pid=2192) ")
    _, _, configs = _parse_lines(messy)
    assert configs[-1].source == "console" and len(configs[-1].values) == 306


def test_nothing_readable_is_counted_and_shown():
    parser, steps, configs = _parse_lines(
        ["hello world", "timing gen 12.0 s", "step 3 took 10 s"], "x.log"
    )
    assert not steps and not configs
    assert (parser.lines, parser.matched, parser.steps) == (3, 0, 0)
    assert parser.first_unmatched == "hello world"


def test_file_logger_jsonl_behind_heads():
    lines = [
        '0: {"step": 3, "data": {"timing_s/gen": 12.5, "perf/mfu/actor": 0.0}}',
        '2026-12-02 22:07:31,004 {"step": 4, "data": {"timing_s/gen": NaN, "x/y": 1}}',
    ]
    _, steps, _ = _parse_lines(lines, "run.jsonl")
    assert [s.step for s in steps] == [3, 4]
    assert steps[0].metrics == {"timing_s/gen": 12.5, "perf/mfu/actor": 0.0}
    # NaN is read (the line still parses) and kept out of the record: absent means no data.
    assert "timing_s/gen" not in steps[1].metrics and steps[1].metrics["x/y"] == 1.0
