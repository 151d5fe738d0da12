"""Hydra overrides read from the launch command a verl log starts with (verl/launch.py).

The real LoRA-72B log (tests/fixtures/real_logs) states ``trainer.test_freq=5`` only in the
``script:`` block at its top (the excerpt cut the printed config before its trainer section), so
validation costing 318 s a step was missed; the ``set -x`` form is the real Megatron logs' own.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from verl_top.cli import main
from verl_top.model import VerlConfig
from verl_top.verl.launch import LaunchReader, override_value, parse_overrides
from verl_top.verl.parse import COMMAND_LINE_SOURCE, VerlStreamParser, parse_file

REAL = Path(__file__).parent / "fixtures" / "real_logs"
LORA = REAL / "lora72b_grpo_8gpu_validation_every_5_steps.log"


def test_the_lora_logs_script_block_gives_test_freq() -> None:
    log = parse_file(LORA)
    assert log.config is not None and log.config_source == "console_partial"
    assert log.config["trainer.test_freq"] == 5
    # Printed and command line agree where both say it; values of shell variables are left out.
    assert log.config["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 8
    # data.train_batch_size=${total_procs}: a shell variable says nothing (and the excerpt's
    # printed config starts after the data section), so it stays unknown.
    assert "data.train_batch_size" not in log.config


def test_validation_every_5_steps_leads_on_the_lora_log() -> None:
    """Its expectation (expected.yaml, written before the tool ran): testing 1588 s every 5
    steps = 318 s a step, 2.1x the core step: the largest recoverable cost."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["diagnose", "--verl-log", str(LORA), "--json", "--duration", "1"])
    doc = json.loads(out.getvalue())
    assert doc["bottleneck"]["rule"] == "flow.periodic"
    periodic = next(f for f in doc["findings"] if f["rule"] == "flow.periodic")
    assert "trainer.test_freq=5" in periodic["evidence"][0]
    assert periodic["advice"] == "Raise trainer.test_freq (now 5)."


def test_set_x_trace_of_a_real_megatron_log() -> None:
    log = parse_file(REAL / "grpo_megatron_deepseek7b_16gpu_preemption.log")
    assert log.config_source == COMMAND_LINE_SOURCE  # no printed config in that excerpt
    assert log.config is not None and log.config["trainer.test_freq"] == 5
    # A quoted list survives shlex ('data.train_files=['\''/home/...'\'']').
    assert str(log.config["data.train_files"]).startswith("[")


def test_printed_config_wins_and_the_command_fills_its_gaps() -> None:
    parser = VerlStreamParser("h", "driver.log")
    lines = [
        "python3 -m verl.trainer.main_ppo \\",
        "    trainer.test_freq=5 \\",
        "    data.train_batch_size=${N} \\",
        "    trainer.logger=['console'] \\",
        "    +trainer.extra=true",
        "(TaskRunner pid=1) {'trainer': {'test_freq': 10, 'nnodes': 1},",
        "(TaskRunner pid=1)  'data': {'train_batch_size': 256}, 'actor_rollout_ref': {}}",
    ]
    configs = [r for r in parser.feed(lines, 1.0) + parser.flush(1.0) if isinstance(r, VerlConfig)]
    first, last = configs[0], configs[-1]
    assert first.source == COMMAND_LINE_SOURCE
    assert first.values == {
        "trainer.test_freq": 5,
        "trainer.logger": "[console]",  # as the shell passes it
        "trainer.extra": True,
    }
    assert last.source == "console"
    assert last.values["trainer.test_freq"] == 10  # the resolved config says so
    assert last.values["data.train_batch_size"] == 256
    assert last.values["trainer.extra"] is True  # only on the command line


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("5", (True, 5)),
        ("3e-5", (True, 3e-5)),
        ("0.4", (True, 0.4)),
        ("True", (True, True)),
        ("null", (True, None)),
        ("'error'", (True, "error")),
        ("vllm", (True, "vllm")),
        ("${total_procs}", (False, None)),
        ("$MODEL_PATH", (False, None)),
    ],
)
def test_override_values(text: str, want: tuple) -> None:
    assert override_value(text) == want


def test_a_cut_or_hostile_command_is_bounded() -> None:
    assert parse_overrides("python3 -m verl.trainer.main_ppo a.b='unclosed c.d=2") == {
        "a.b": "'unclosed",
        "c.d": 2,
    }
    reader = LaunchReader()
    assert reader.scan("python3 -m verl.trainer.main_ppo \\") is None
    for _ in range(100_000):  # a command that never ends keeps a bounded text
        reader.scan("  x.y=1 " * 10 + "\\")
    got = reader.scan("  last.key=2")
    assert got is not None and len(got) <= 2000


def test_lines_that_are_not_a_launch_are_ignored() -> None:
    reader = LaunchReader()
    assert reader.scan("(TaskRunner pid=1) trainer.test_freq=5 is what I set") is None
    assert reader.scan("echo verl.trainer is great a=b") is None
