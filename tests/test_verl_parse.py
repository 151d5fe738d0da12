"""verl output parsing, checked against numbers read by hand from the real and sample fixtures."""

from __future__ import annotations

import math
import pprint
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_top.model import VerlConfig, VerlStep
from verl_top.verl import parse
from verl_top.verl.parse import (
    VerlStreamParser,
    parse_console_line,
    parse_file,
    parse_jsonl_line,
)

FIX = Path(__file__).parent / "fixtures" / "verl"
GEMMA = FIX / "real_gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log"
QWEN = FIX / "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
EXCERPT = FIX / "verl_real_log_excerpt.txt"
CONSOLE = FIX / "verl_console_sample.log"
JSONL = FIX / "verl_file_sample.jsonl"


@pytest.fixture(scope="module")
def gemma():
    return parse_file(GEMMA)


@pytest.fixture(scope="module")
def qwen():
    return parse_file(QWEN)


@pytest.fixture(scope="module")
def excerpt():
    return parse_file(EXCERPT)


# --- real log 1: gemma-2-2b PPO, Dec 2024, "(main_task pid=…)" prefix, ANSI, timing/ keys ---


def test_gemma_steps_and_values(gemma):
    # `grep -c " step:" ` -> 107 lines: step 0 twice (validation-only line, then training), 1..105.
    assert gemma.n_steps == 107
    assert gemma.last_step == 105
    assert gemma.malformed == 0
    assert gemma.steps[0].metrics == {"test_score/openai/gsm8k": 0.521}
    step1 = gemma.step(1)
    assert step1.metrics["timing/gen"] == 42.247
    assert step1.metrics["critic/lr(1e-4)"] == 0.1  # key with parentheses
    assert step1.metrics["critic/advantages/mean"] == -0.0  # "-0.000"
    step9 = gemma.step(9)
    assert step9.metrics["timing/testing"] == 73.947
    assert step9.metrics["val/test_score/openai/gsm8k"] == 0.546
    assert gemma.step(105).metrics["timing/gen"] == 48.744


def test_gemma_config_rebuilt_despite_lost_lines(gemma):
    # The stored log lost lines of the pprinted config (page-chunk gaps, "commit:" noise) and
    # glued a WorkerDict line onto 'experiment_name'; the indentation still places every key.
    assert gemma.config_source == "console_partial"
    cfg = gemma.config
    assert cfg["data.train_batch_size"] == 512
    assert cfg["trainer.n_gpus_per_node"] == 2
    assert cfg["trainer.experiment_name"] == "gemma2b_function_rm"
    assert cfg["trainer.logger"] == ["console", "wandb"]
    assert cfg["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert cfg["reward_model.model.path"] == "~/models/FsfairX-LLaMA3-RM-v0.1"
    assert cfg["algorithm.kl_ctrl.kl_coef"] == 0.001
    assert not any(k.startswith("reward_model.trainer") for k in cfg)


# --- real log 2: Qwen2.5-0.5B PPO, 435 steps, config interleaved with WorkerDict lines ---


def test_qwen_steps_and_values(qwen):
    assert qwen.n_steps == 435
    assert qwen.last_step == 434
    assert [s.step for s in qwen.steps] == list(range(435))
    assert qwen.malformed == 0
    assert qwen.lines == 2046
    assert qwen.step(0).metrics["timing/gen"] == 18.859
    assert qwen.step(434).metrics["timing/update_actor"] == 21.203
    assert qwen.step(434).metrics["prompt_length/min"] == 68.0


def test_qwen_config_complete(qwen):
    assert qwen.config_source == "console"
    cfg = qwen.config
    assert cfg["data.train_batch_size"] == 256
    assert cfg["trainer.n_gpus_per_node"] == 1
    assert cfg["actor_rollout_ref.actor.ppo_micro_batch_size"] == 2
    assert cfg["trainer.total_epochs"] == 15  # the line after 25 interleaved WorkerDict lines
    assert cfg["actor_rollout_ref.model.override_config"] == {}


# --- real excerpt: .3f values, full precision, np.float64, a wrapped issue paste ---


def test_excerpt(excerpt):
    steps = [s.step for s in excerpt.steps]
    assert steps == [0, 1, 2, 5, 34, 0]
    s1 = excerpt.steps[1]
    assert s1.metrics["timing_s/gen"] == 42.918
    assert s1.metrics["timing_s/step"] == 179.003
    assert s1.metrics["perf/throughput"] == 1049.601
    assert excerpt.steps[3].metrics["timing_s/testing"] == 45.697
    # Source B: issue paste wrapped inside "critic/rewards/min": the two pieces are glued back,
    # so the pair cut by the wrap and everything after it are read (issue 17 item 8).
    s34 = excerpt.steps[4].metrics
    assert s34["actor/lr"] == 2e-06
    assert s34["actor/ppo_kl"] == -8.163164312320433e-06
    assert s34["critic/rewards/max"] == 1.0
    assert s34["critic/rewards/min"] == -1.0
    assert s34["critic/returns/min"] == -1.7888524532318115
    assert list(s34)[-1] == "response_length/min" and s34["response_length/min"] == 38.0
    # Source D (oldest docs): timing/ keys, parenthesised lr key.
    assert excerpt.steps[5].metrics["critic/lr(1e-4)"] == 0.1
    assert excerpt.steps[5].metrics["timing/update_critic"] == 15.664
    # Counted: the step-34 line, which ends on a dangling " -" (the paste stopped there), and
    # the Source C fragment (no step head).
    assert excerpt.truncated == 1
    assert excerpt.malformed == 2
    assert excerpt.config is None  # only config fragments, no opening brace


def test_excerpt_numpy_wrappers():
    line = (
        "step:3 - critic/vf_loss:np.float64(0.007003280876688223) - critic/lr:np.float64(1e-05)"
        " - val-aux/num_turns/min:np.int32(2) - timing_s/agent_loop/num_preempted/max:np.int64(27)"
    )
    assert parse_console_line(line) == (
        3,
        {
            "critic/vf_loss": 0.007003280876688223,
            "critic/lr": 1e-05,
            "val-aux/num_turns/min": 2.0,
            "timing_s/agent_loop/num_preempted/max": 27.0,
        },
    )


# --- constructed samples: console and JSONL describe the same three steps ---


def test_console_and_jsonl_samples_agree():
    console, jsonl = parse_file(CONSOLE), parse_file(JSONL)
    assert [s.step for s in console.steps] == [10, 11, 12]
    assert [s.source for s in console.steps] == ["console"] * 3
    assert [s.source for s in jsonl.steps] == ["jsonl"] * 3
    for a, b in zip(console.steps, jsonl.steps, strict=True):
        assert a.step == b.step
        assert a.metrics == b.metrics
    s10 = console.steps[0].metrics
    assert s10["timing_s/gen"] == 299.4644854043238
    assert s10["timing_s/save_checkpoint"] == 112.02554937600111
    assert s10["timing_s/agent_loop/num_preempted/max"] == 27
    assert s10["actor/ppo_kl"] == 3.6119128725153384e-06
    assert console.steps[2].metrics["perf/throughput"] == pytest.approx(822.396193907516)


# --- line-level behaviour ---


@pytest.mark.parametrize(
    "line",
    [
        "\x1b[36m(TaskRunner pid=1523407)\x1b[0m step:7 - a/b:1.5 - c:2",
        "(TaskRunner pid=12, ip=10.0.0.3) step:7 - a/b:1.5 - c:2",
        "(main_task pid=54569) step:7 - a/b:1.5 - c:2",
        "step:7 - a/b:\x1b[1m1.5\x1b[0m - c:2",
        "step:7 - a/b:1.5 - c:2 [repeated 2x across cluster]",
        "Training Progress:  10%|█ | 7/70\rstep:7 - a/b:1.5 - c:2",
    ],
)
def test_prefix_and_ansi_variants(line):
    assert parse_console_line(line) == (7, {"a/b": 1.5, "c": 2.0})


def test_special_values():
    step, m = parse_console_line(
        "step:2 - x:True - y:False - n:nan - p:inf - q:-inf - r:np.float64(nan) - b:np.True_"
    )
    assert step == 2
    assert (m["x"], m["y"], m["p"], m["q"], m["b"]) == (1.0, 0.0, math.inf, -math.inf, 1.0)
    assert math.isnan(m["n"]) and math.isnan(m["r"])


@pytest.mark.parametrize(
    "line",
    [
        "Let's start with the first step:",
        "Training Progress:  10%|█ | 7/70 [01:00<10:00, 1.2s/it]",
        "Traceback (most recent call last):",
        "step: 3 with a space",
        "",
        "\"Final validation metrics: {'test_score/openai/gsm8k': 0.5685975609756098}\"",
    ],
)
def test_non_metric_lines_ignored(line):
    p = VerlStreamParser("h", "driver.log")
    assert p.feed([line], 1.0) == []
    assert p.malformed == 0
    assert parse_console_line(line) is None


def test_garbled_middle_pair_skips_line():
    p = VerlStreamParser("h", "driver.log")
    assert p.feed(["step:4 - a:1.0 - b:oops - c:3.0"], 1.0) == []
    assert p.malformed == 1
    assert parse_console_line("step:4 - a:1.0 - b:oops - c:3.0") is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step:4 - a:1.0 - b:2.5 - timing_s/ge", {"a": 1.0, "b": 2.5}),  # cut inside the key
        ("step:4 - a:1.0 - b:2.5 - c:np.float64(0.12", {"a": 1.0, "b": 2.5}),  # unclosed wrapper
        ("step:4 - a:1.0 - b:2.5 - c:", {"a": 1.0, "b": 2.5}),
        ("step:4 - a:1.0 - b:2.5 -", {"a": 1.0, "b": 2.5}),  # cut after a complete pair: kept
    ],
)
def test_cut_last_pair_dropped_and_counted(line, expected):
    p = VerlStreamParser("h", "driver.log")
    (rec,) = p.feed([line], 5.0)
    assert isinstance(rec, VerlStep) and rec.metrics == expected and rec.t == 5.0
    assert (p.malformed, p.truncated) == (1, 1)


def test_cut_three_decimal_line_drops_short_last_value():
    pairs = " - ".join(f"k{i}:{i}.125" for i in range(10))
    step, m = parse_console_line(f"step:1 - {pairs} - last:12.4")
    assert "last" not in m and m["k9"] == 9.125
    step, m = parse_console_line(f"step:1 - {pairs} - last:12.400")
    assert m["last"] == 12.4


def test_jsonl_line():
    assert parse_jsonl_line('{"step": 3, "data": {"a": 1, "b": true, "c": null, "d": "x"}}') == (
        3,
        {"a": 1.0, "b": 1.0},
    )
    assert parse_jsonl_line('{"step": 3, "data": {"a": 1') is None
    assert parse_jsonl_line('{"other": 1}') is None
    p = VerlStreamParser("h", "run.jsonl")
    assert p.feed(['{"step": 3, "data": {"a": 1'], 1.0) == []
    assert p.malformed == 1


# --- stream parser: config across feeds, reset, YAML files ---


def test_stream_config_split_across_feeds():
    lines = QWEN.read_text(encoding="utf-8").splitlines()
    p = VerlStreamParser("head", str(QWEN))
    records = []
    for i in range(0, len(lines), 7):  # odd chunk size: the config spans many feeds
        records += p.feed(lines[i : i + 7], float(i))
    configs = [r for r in records if isinstance(r, VerlConfig)]
    steps = [r for r in records if isinstance(r, VerlStep)]
    assert len(configs) == 1 and configs[0].source == "console" and configs[0].host == "head"
    assert configs[0].values["data.train_batch_size"] == 256
    assert len(steps) == 435 and steps[-1].host == "head"


def test_stream_reset_forgets_partial_config():
    p = VerlStreamParser("h", "driver.log")
    p.feed(["(TaskRunner pid=1) {'trainer': {'nnodes': 1,"], 1.0)
    p.reset()
    out = p.feed(["(TaskRunner pid=1)              'n_gpus_per_node': 8}}"], 2.0)
    assert out == []


def test_stream_config_cut_by_driver_line():
    p = VerlStreamParser("h", "driver.log")
    out = p.feed(
        [
            "(TaskRunner pid=1) {'data': {'train_batch_size': 1024,",
            "(WorkerDict pid=2) loading weights",
            "(TaskRunner pid=1)           'max_prompt_length': 512},",
            "(TaskRunner pid=1)  'trainer': {'n_gpus_per_node': 8,",
            "(TaskRunner pid=1) step:1 - timing_s/gen:3.5",
        ],
        9.0,
    )
    config, step = out
    assert isinstance(config, VerlConfig) and config.source == "console_partial"
    assert config.values == {
        "data.train_batch_size": 1024,
        "data.max_prompt_length": 512,
        "trainer.n_gpus_per_node": 8,
    }
    assert isinstance(step, VerlStep) and step.metrics == {"timing_s/gen": 3.5}


def test_yaml_config_file_stream(tmp_path):
    text = (
        "data:\n  train_batch_size: 1024\n  max_prompt_length: 512\n"
        "actor_rollout_ref:\n  rollout:\n    n: 5\n    prompt_length: ${data.max_prompt_length}\n"
    )
    p = VerlStreamParser("h", "/runs/config.yaml")
    lines = text.splitlines()
    out = p.feed(lines[:2], 1.0) + p.feed(lines[2:], 2.0)
    last = [r for r in out if isinstance(r, VerlConfig)][-1]
    assert last.source == "yaml"
    assert last.values["actor_rollout_ref.rollout.n"] == 5
    assert last.values["actor_rollout_ref.rollout.prompt_length"] == "${data.max_prompt_length}"
    assert p.feed([], 3.0) == []


# --- properties ---


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=300), max_size=20))
def test_never_raises_on_text(lines):
    p = VerlStreamParser("h", "x.log")
    p.feed(lines, 0.0)
    p.flush(0.0)
    for line in lines:
        parse_console_line(line)
        parse_jsonl_line(line)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=10))
def test_never_raises_on_bytes(chunks):
    lines = [c.decode("utf-8", errors="replace") for c in chunks]
    for path in ("x.log", "c.yaml"):
        VerlStreamParser("h", path).feed(lines, 0.0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["{'", "  'a': {", "'b': 1,", "}}", "step:1 - ", "(TaskRunner pid=1) "]),
        max_size=30,
    )
)
def test_never_raises_on_config_like_noise(parts):
    p = VerlStreamParser("h", "x.log")
    p.feed(["".join(parts[i : i + 3]) for i in range(0, len(parts), 3)], 0.0)
    p.flush(0.0)


# verl keys: no spaces, no colons (e.g. "val-core/openai/gsm8k/reward/mean@1", "critic/lr(1e-4)").
KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_/@.()-", min_size=1, max_size=24)
NUMBERS = st.one_of(
    st.floats(allow_nan=False),
    st.integers(min_value=-(10**15), max_value=10**15),
    st.booleans(),
)


def _verl_format(value: object, numpy_wrap: bool) -> str:
    text = pprint.pformat(value)
    if numpy_wrap and not isinstance(value, bool):
        kind = "int64" if isinstance(value, int) else "float64"
        text = f"np.{kind}({text})"
    return text


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=10**9),
    st.dictionaries(KEYS, NUMBERS, min_size=1, max_size=30),
    st.booleans(),
    st.sampled_from(["", "(TaskRunner pid=42) ", "\x1b[36m(main_task pid=7, ip=10.1.2.3)\x1b[0m "]),
)
def test_round_trip(step, metrics, numpy_wrap, prefix):
    """A metrics dict printed the way verl's console logger does parses back to the same numbers."""
    body = " - ".join(
        [f"step:{step}"] + [f"{k}:{_verl_format(v, numpy_wrap)}" for k, v in metrics.items()]
    )
    parsed = parse_console_line(prefix + body)
    assert parsed is not None
    got_step, got = parsed
    assert got_step == step
    assert got == {k: float(v) for k, v in metrics.items()}


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=10**6),
    st.dictionaries(KEYS, st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=30),
)
def test_round_trip_three_decimals(step, metrics):
    """verl ≤ v0.4 printed f"{v:.3f}"; those values parse back to the rounded numbers."""
    body = " - ".join([f"step:{step}"] + [f"{k}:{v:.3f}" for k, v in metrics.items()])
    assert parse_console_line(body) == (step, {k: float(f"{v:.3f}") for k, v in metrics.items()})


def test_load_config_file_yaml_and_json(tmp_path):
    from verl_top.verl.parse import load_config_file

    y = tmp_path / "ppo.yaml"
    y.write_text("trainer:\n  n_gpus_per_node: 8\n  nnodes: 2\n  logger: [console, file]\n")
    assert load_config_file(y) == {
        "trainer.n_gpus_per_node": 8,
        "trainer.nnodes": 2,
        "trainer.logger": ["console", "file"],
    }
    j = tmp_path / "cfg.json"
    j.write_text('{"data": {"train_batch_size": 1024}}')
    assert load_config_file(j) == {"data.train_batch_size": 1024}
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError):
        load_config_file(bad)


KEYS = ["timing_s/gen", "actor/lr", "a", " lead", "trail ", "", "caf\u00e9/x", "k\x7f", "a:b"]
VALUES = ["1.5", "-2e-3", "3.000", "0.125", "1.", ".5", "+4", "nan", "inf", "NaN", "1_0", " 1"]
VALUES += ["1 ", "np.float64(0.19)", "tensor(0.5, device='cuda:0')", "True", "np.True_", "", "1e"]
VALUES += ["299.46", "1.250", "7", "x", "1-2"]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), min_size=1, max_size=12),
    st.booleans(),
    st.booleans(),
)
def test_a_step_line_read_whole_reads_as_read_pair_by_pair(
    pairs: list[tuple[str, str]], dangling: bool, colon_less: bool
) -> None:
    """The all-plain fast path of parse_console_body gives what the pair-by-pair parse gives,
    for plain, wrapped, boolean, cut, odd-key and three-decimal lines alike."""
    tokens = [
        k if colon_less and i == len(pairs) - 1 else f"{k}:{v}" for i, (k, v) in enumerate(pairs)
    ]
    body = "step:7 - " + " - ".join(tokens) + (" -" if dangling else "")
    fast = parse.parse_console_body(body)
    with mock.patch.object(parse, "_plain_pairs", return_value=None):
        assert repr(fast) == repr(parse.parse_console_body(body))  # nan == nan by its repr


def test_three_decimal_lines_drop_a_cut_last_value_on_the_fast_path_too() -> None:
    body = "step:3 - " + " - ".join(f"k{i}/x:{i}.125" for i in range(9)) + " - k9/x:1.2"
    status, _, metrics = parse.parse_console_body(body)
    assert status == parse.TRUNCATED and "k9/x" not in metrics and len(metrics) == 9


def test_a_step_keeps_its_finite_metrics_whatever_their_sum() -> None:
    """Non-finite values (nan, inf, a number float() overflows) stay out of the step record;
    finite ones stay in, also when their sum overflows (the all-finite shortcut's edge)."""
    parser = parse.VerlStreamParser("h", "x.log")
    lines = [
        "step:1 - a/x:1e308 - a/y:1e308 - a/z:2.5",
        "step:2 - a/x:1e999 - a/y:nan - a/z:2.5",
        "step:3 - a/x:1.0 - a/y:2.0 - a/z:2.5",
    ]
    steps = [r for r in parser.feed(lines, 0.0) if isinstance(r, VerlStep)]
    assert [s.metrics for s in steps] == [
        {"a/x": 1e308, "a/y": 1e308, "a/z": 2.5},
        {"a/z": 2.5},
        {"a/x": 1.0, "a/y": 2.0, "a/z": 2.5},
    ]


PLAIN_KEYS = ["timing_s/gen", "actor/lr", "a", "perf/mfu/actor", "k-1", "x.y(z)", "a b"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(PLAIN_KEYS), min_size=1, max_size=6, unique=True),
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(VALUES), min_size=6, max_size=6),
            st.sampled_from(["same", "dangling", "extra key", "dropped key", "odd key"]),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_a_step_line_read_by_its_layout_reads_as_without_it(
    keys: list[str], lines: list[tuple[list[str], str]]
) -> None:
    """A stream's StepLayout (the pattern of its step lines' keys) changes no line's result:
    lines with the layout's keys and any values, with a dangling separator, a key more or
    less, or an odd key, read as parse_console_body reads them alone."""
    layout = parse.StepLayout()
    plain = [f"{k}:1.5" for k in keys]
    for body in ("step:1 - " + " - ".join(plain), "step:2 - " + " - ".join(plain)):
        assert repr(parse.parse_console_body(body, layout)) == repr(parse.parse_console_body(body))
    for values, shape in lines:
        pairs = [f"{k}:{v}" for k, v in zip(keys, values, strict=False)]
        if shape == "extra key":
            pairs.append("zz/extra:2.0")
        elif shape == "dropped key" and len(pairs) > 1:
            pairs.pop(0)
        elif shape == "odd key":
            pairs[0] = " " + pairs[0]
        body = "step:3 - " + " - ".join(pairs) + (" -" if shape == "dangling" else "")
        assert repr(parse.parse_console_body(body, layout)) == repr(parse.parse_console_body(body))


def test_a_step_layout_reads_the_real_step_lines_of_a_run() -> None:
    """After two lines with the same keys, a run's step lines are read by the layout's one
    match (not pair by pair), with the same metrics."""
    bodies = [
        body
        for line in GEMMA.read_text(encoding="utf-8").splitlines()
        for _prefix, body in parse.logical_lines(line)
        if body.startswith("step:")
    ]
    layout = parse.StepLayout()
    results = [parse.parse_console_body(body, layout) for body in bodies]
    assert results == [parse.parse_console_body(body) for body in bodies]
    rest = bodies[-1][bodies[-1].index(" - ") :]
    read = layout.read(rest)
    assert read is not None and read[0] == results[-1][2]


def test_a_step_layout_stops_compiling_when_the_keys_keep_changing() -> None:
    """A log whose keys change every other line compiles at most MAX_COMPILES patterns (each
    ~3 ms) and still reads every line as without a layout."""
    layout = parse.StepLayout()
    for n in range(3 * parse.StepLayout.MAX_COMPILES):
        body = f"step:{n} - a/x:1.5 - k{n // 2}/y:2.5"
        assert parse.parse_console_body(body, layout) == parse.parse_console_body(body)
    assert layout.compiles == parse.StepLayout.MAX_COMPILES
