"""Secrets never reach a snapshot bundle (verl_top/export/redact.py).

The secrets below are CONSTRUCTED in the real formats of each provider (the AWS pair is AWS's
own documentation example); none is a live credential.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from verl_top.export.redact import (
    REDACTED,
    is_secret_name,
    redact_mapping,
    redact_text,
    redact_tree,
)
from verl_top.export.snapshot import write_snapshot
from verl_top.model import (
    GpuProcess,
    GpuSample,
    Hello,
    LogEvent,
    LogLines,
    ProbeResult,
    ProcessList,
    VerlConfig,
)
from verl_top.store import Store

WANDB = "3f9a1c0b7e2d4a6f8b1c3e5d7f9a0b2c4d6e8f10"
HF = "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"
OPENAI = "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34"
GITHUB = "ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXy"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2ZXJsIn0.c2lnbmF0dXJlX2hlcmVfMTIz"
DB_PASSWORD = "Tr0ub4dor-and-3"
SECRETS = [WANDB, HF, OPENAI, GITHUB, AWS_ID, AWS_SECRET, BEARER, DB_PASSWORD, "hunter2-xyz"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"WANDB_API_KEY={WANDB} python3 -m verl.trainer.main_ppo",
            f"WANDB_API_KEY={REDACTED} python3 -m verl.trainer.main_ppo",
        ),
        (f"--hf-token {HF}", f"--hf-token {REDACTED}"),
        (f"--api_key={OPENAI}", f"--api_key={REDACTED}"),
        (f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}", f"export AWS_SECRET_ACCESS_KEY={REDACTED}"),
        (f"key id {AWS_ID} in use", f"key id {REDACTED} in use"),
        (f"Authorization: Bearer {BEARER}", f"Authorization: {REDACTED} {REDACTED}"),
        (f"postgres://verl:{DB_PASSWORD}@db:5432/runs", f"postgres://verl:{REDACTED}@db:5432/runs"),
        (f"https://{GITHUB}@github.com/org/repo", f"https://{REDACTED}@github.com/org/repo"),
        ('{"password": "hunter2-xyz"}', f'{{"password": "{REDACTED}"}}'),
        (f"using token {HF}", f"using token {REDACTED}"),
    ],
)
def test_redact_text_replaces_secrets(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [  # verl config and log text that names tokens but holds no secret
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        "actor_rollout_ref.rollout.max_num_batched_tokens: 8192",
        "(TaskRunner pid=2664304) step:3 - perf/total_num_tokens:1024",
        '"eos_token_id": 151645,',
        "pad_token: <|endoftext|>",
        "the token budget is tight",
        "GPU-demo0000-0000-0000-0000-000000000000",
    ],
)
def test_redact_text_keeps_what_is_not_secret(text: str) -> None:
    assert redact_text(text) == text


def test_secret_names() -> None:
    for name in (
        "WANDB_API_KEY",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "trainer.wandb.api_key",
        "--hf-token",
        "db.password",
        "auth",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        assert is_secret_name(name), name
    for name in (
        "max_num_batched_tokens",
        "ppo_max_token_len_per_gpu",
        "tokenizer",
        "pad_token",
        "author",
        "data.train_batch_size",
    ):
        assert not is_secret_name(name), name


def test_redact_mapping_hides_values_by_key_and_keeps_numbers_the_diagnosis_needs() -> None:
    out = redact_mapping(
        {
            "trainer.wandb.api_key": WANDB,
            "custom.auth_token": 123456,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
            "x.use_auth": True,
            "env": {"HF_TOKEN": HF, "PATH": "/usr/bin"},
            "trainer.logger": ["console", f"wandb:{WANDB}"],
            "data.path": f"s3://bucket/data?token={HF}",
        }
    )
    assert out == {
        "trainer.wandb.api_key": REDACTED,
        "custom.auth_token": REDACTED,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
        "x.use_auth": True,
        "env": {"HF_TOKEN": REDACTED, "PATH": "/usr/bin"},
        "trainer.logger": ["console", f"wandb:{WANDB}"],  # a bare hex id has no sign of a secret
        "data.path": f"s3://bucket/data?token={REDACTED}",
    }


def test_redact_tree_keeps_numbers() -> None:
    tree = {"series": [1.0, None, 2], "labels": ["gen", f"x {HF}"], "token": "abc", "n": 3}
    assert redact_tree(tree) == {
        "series": [1.0, None, 2],
        "labels": ["gen", f"x {REDACTED}"],
        "token": REDACTED,
        "n": 3,
    }


def _store_with_secrets() -> Store:
    store = Store()
    store.ingest(Hello(host="n1", t=100.0, backend="pynvml", error=f"ssh -i key HF_TOKEN={HF}"))
    store.ingest(GpuSample(host="n1", t=101.0, index=0, util_gpu=50.0))
    store.ingest(
        ProcessList(
            host="n1",
            t=101.0,
            procs=[
                GpuProcess(pid=7, gpu_index=0, cmd="ray::WorkerDict", env_rank=0),
                GpuProcess(
                    pid=8,
                    gpu_index=0,
                    cmd=f"env WANDB_API_KEY={WANDB} HF_TOKEN={HF} python3 -m "
                    f"verl.trainer.main_ppo trainer.wandb.api_key={WANDB} --openai-key={OPENAI}",
                ),
            ],
        )
    )
    store.ingest(
        VerlConfig(
            t=100.0,
            values={
                "trainer.wandb.api_key": WANDB,
                "custom.db_url": f"postgres://verl:{DB_PASSWORD}@db/runs",
                "custom.password": "hunter2-xyz",
                "custom.aws.secret_access_key": AWS_SECRET,
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
            },
            source="config.yaml",
        )
    )
    store.ingest(LogEvent(host="n1", t=102.0, kind="error", text=f"401 for Bearer {BEARER}"))
    store.ingest(LogEvent(host="n1", t=102.5, kind="error", text=f"git push {GITHUB}"))
    store.ingest(
        LogLines(
            host="n1",
            t=103.0,
            kind="verl",
            path="/x.log",
            lines=[f"export AWS_ACCESS_KEY_ID={AWS_ID}", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}"],
        )
    )
    store.ingest(
        ProbeResult(host="n1", t=103.0, ok=False, error=f"auth failed: password={DB_PASSWORD}")
    )
    store.notes.append(f"source failed for https://verl:{DB_PASSWORD}@proxy")
    return store


def _bundle_text(path: Path) -> dict[str, str]:
    out = {}
    for f in path.iterdir():
        data = f.read_bytes()
        out[f.name] = (gzip.decompress(data) if f.suffix == ".gz" else data).decode()
    return out


def test_no_secret_survives_anywhere_in_the_bundle(tmp_path: Path) -> None:
    svg = f"<svg><text>HF_TOKEN={HF}</text><text>{OPENAI}</text></svg>"
    out = write_snapshot(_store_with_secrets(), None, tmp_path / "s", screen_svg=svg)
    files = _bundle_text(out)
    assert sorted(files) == [
        "recording.ndjson.gz",
        "report.md",
        "screen.svg",
        "snapshot.json",
        "verl-top-manifest.json",
    ]
    for name, text in files.items():
        for secret in SECRETS:
            assert secret not in text, (name, secret)
        assert REDACTED in text or name == "verl-top-manifest.json", name  # a file list
    # what is not secret is still there for the diagnosis
    assert "16384" in files["report.md"] and "16384" in files["snapshot.json"]
    assert "verl.trainer.main_ppo" in files["snapshot.json"]
