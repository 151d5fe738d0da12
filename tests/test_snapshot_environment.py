"""What a verl maintainer asks for first (issue 32 item 8): versions with their source or
'unknown', the launch command, the last error lines, the verdict history, from real logs
(tests/fixtures/PROVENANCE.md). The expected values were read from the files by hand first."""

from __future__ import annotations

import asyncio
from pathlib import Path

from verl_top.cli import diagnose_parser
from verl_top.export.environment import collect_environment
from verl_top.export.snapshot import write_snapshot
from verl_top.headless import collect
from verl_top.inputs import build_inputs

FIX = Path(__file__).resolve().parent / "fixtures"


def _collected(log: Path):  # noqa: ANN202
    inputs = build_inputs(diagnose_parser().parse_args(["--verl-log", str(log)]))
    try:
        return inputs, asyncio.run(collect(inputs))
    finally:
        inputs.close()


def _software(env) -> dict[str, str]:  # noqa: ANN001
    return {s.name: s.version for s in env.software}


def test_versions_come_from_log_lines_or_say_unknown() -> None:
    # The 40-step H200 run prints "NCCL version 2.28.9+cuda13.0"; nothing prints torch/vLLM.
    inputs, _ = _collected(FIX / "verl" / "real_h200_verl050_grpo_hf_40steps.log")
    env = collect_environment(inputs.store)
    versions = _software(env)
    assert versions["NCCL"] == "2.28.9" and versions["CUDA (NCCL build)"] == "13.0"
    assert versions["torch"] == "unknown" and versions["vLLM"] == "unknown"
    assert versions["NVIDIA driver"] == "unknown"  # no agent in a post-mortem of a log
    assert all(s.source for s in env.software)  # every item says where (or why not)


def test_launch_command_is_the_logs_launch_line_joined_across_backslashes() -> None:
    # Line 7 of this log: `nohup python3 -m verl.trainer.main_ppo \`, continued for 40 lines.
    inputs, _ = _collected(FIX / "real_logs" / "grpo_fsdp2_qwen2_7b_offload_8gpu.log")
    env = collect_environment(inputs.store)
    assert env.launch is not None
    assert env.launch.startswith("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ")
    assert "data.train_batch_size=1024" in env.launch and "\\" not in env.launch
    # A FutureWarning quoting a python3.10/... path is no launch line.
    other, _ = _collected(FIX / "real_logs" / "ppo_critic_qwen25_7b_2x8gpu_ray_job_submit.log")
    assert collect_environment(other.store).launch is None


def test_last_error_lines_hold_the_oom_and_the_report_shows_everything(tmp_path: Path) -> None:
    # This fork's step 1 dies of "torch.cuda.OutOfMemoryError: CUDA out of memory".
    inputs, assessment = _collected(FIX / "real_logs" / "searchr1_fork_wandb_only_oom_step1.log")
    env = collect_environment(inputs.store)
    assert any("CUDA out of memory" in line for line in env.errors)
    assert any(line.startswith("Traceback (most recent call last)") for line in env.errors)
    out = write_snapshot(inputs.store, assessment, tmp_path / "bundle")
    report = (out / "report.md").read_text()
    for section in (
        "## Software",
        "## Launch command",
        "## Last error lines",
        "## Verdict history",
    ):
        assert section in report, section
    assert "CUDA out of memory" in report
    import json

    doc = json.loads((out / "snapshot.json").read_text())
    assert {s["name"] for s in doc["environment"]["software"]} >= {"verl", "torch", "Ray"}
    assert doc["environment"]["errors"] == list(env.errors)
