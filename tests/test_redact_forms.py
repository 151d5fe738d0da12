"""Every secret form named in issues 16 and 31 is redacted, and verl's own config keys are not.

One row per form. The secrets are CONSTRUCTED in each provider's real format; none is live.
"""

from __future__ import annotations

import pytest

from verl_top.export.redact import (
    FORMS as TABLE,
)
from verl_top.export.redact import (
    REDACTED,
    Redactor,
    redact_lines,
    redact_mapping,
    redact_text,
    rules,
)

PEM = [
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "QyNTUxOQAAACBcC1b6nCmKe6bG1Oe7x5X4sP1G1VqgwTqz0dAqI0D7lAAAAJhJw5lASc",
    "-----END OPENSSH PRIVATE KEY-----",
]

FORMS = [
    # (form, text, the secret that must disappear, what must stay)
    ("PGPASSWORD env", "PGPASSWORD=Tr0ub4dor3x psql -h db", "Tr0ub4dor3x", "psql -h db"),
    (
        "WANDB_API_KEY env",
        "WANDB_API_KEY=3f9a1c0b7e2d4a6f8b1c python3 x",
        "3f9a1c0b7e2d4a6f8b1c",
        "x",
    ),
    (
        "trainer.wandb.key",
        "trainer.wandb.key=3f9a1c0b7e2d4a6f8b1c",
        "3f9a1c0b7e2d4a6f8b1c",
        "wandb",
    ),
    ("curl -u", "curl -u alice:s3cr3tPass https://api.x/v1", "s3cr3tPass", "https://api.x/v1"),
    ("curl --user", "curl --user alice:s3cr3tPass https://a", "s3cr3tPass", "https://a"),
    ("sshpass -p", "sshpass -p 'hunter2xyz' ssh node01", "hunter2xyz", "ssh node01"),
    ("mysql -pSECRET", "mysql -ualice -pS3cretDbPw runs", "S3cretDbPw", "runs"),
    ("URL password with @", "https://u:p@ss@w0rd@host.io/x", "ss@w0rd", "host.io/x"),
    ("URL password with /", "redis://:pa/ss9word@cache:6379/0", "ss9word", "cache:6379"),
    (
        "Google API key",
        "key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUv1 used",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUv1",
        "used",
    ),
    (
        "Azure SAS sig=",
        "https://a.blob.core.windows.net/c?sv=2022&sig=Zm9vYmFyYmF6cXV4%3D&se=1",
        "Zm9vYmFyYmF6cXV4",
        "sv=2022",
    ),
    ("quoted --api-key", '--api-key "sk live key 123456789"', "live key 123456789", "--api-key"),
    ("nested JSON key", '{"wandb": {"key": "3f9a1c0b7e2d4a6f"}}', "3f9a1c0b7e2d4a6f", '"wandb"'),
    ("GitLab token", "token glpat-AbCdEfGhIjKlMnOpQrSt here", "glpat-AbCdEfGhIjKlMnOpQrSt", "here"),
    ("HF token", "export HF_TOKEN=hf_QkVbWxRtYuIoPaSdFgHj", "hf_QkVbWxRtYuIoPaSdFgHj", "export"),
    # issue 31: the eight forms an outside attack found in process command lines
    (
        "wandb login KEY",
        "wandb login 0123456789abcdef0123456789abcdef01234567 && python3 -m verl.trainer",
        "0123456789abcdef0123456789abcdef01234567",
        "verl.trainer",
    ),
    (
        "Slack webhook path",
        "curl -X POST https://hooks.slack.com/services/T0ABCDE12/B0FGHIJ34/AbCdEfGhIjKlMnOpQrStUvWx",
        "AbCdEfGhIjKlMnOpQrStUvWx",
        "hooks.slack.com/services/",
    ),
    ("SSHPASS env", "SSHPASS=hunter2xyz sshpass -e ssh node01", "hunter2xyz", "ssh node01"),
    (
        "docker login -p",
        "docker login -u bob -p dckr_pat_s3cretValue registry.example.com",
        "dckr_pat_s3cretValue",
        "registry.example.com",
    ),
    (
        "Azure AccountKey=",
        "az storage blob upload --connection-string 'DefaultEndpointsProtocol=https;"
        "AccountName=ckpt;AccountKey=bXlBY2NvdW50S2V5QmFzZTY0PT0=;EndpointSuffix=core.windows.net'",
        "bXlBY2NvdW50S2V5QmFzZTY0PT0",
        "AccountName=ckpt",
    ),
    (
        "hf_ token split by U+200B",
        "python3 train.py hf_QkVbWxRt\u200bYuIoPaSdFgHj --epochs 3",
        "YuIoPaSdFgHj",
        "--epochs 3",
    ),
    (
        "URL-encoded password%3D",
        "curl -d 'user%3Dalice%26password%3Dhunter2xyz' https://login.x",
        "hunter2xyz",
        "https://login.x",
    ),
    (
        "GCP private_key_id",
        '{"type": "service_account", "private_key_id": "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"}',
        "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b",
        "service_account",
    ),
    (
        "full-width hf token (NFKC)",
        "token ｈｆ＿QkVbWxRtYuIoPaSdFgHj here",
        "QkVbWxRtYuIoPaSdFgHj",
        "here",
    ),
]


@pytest.mark.parametrize(("form", "text", "secret", "kept"), FORMS, ids=[f[0] for f in FORMS])
def test_each_secret_form_is_redacted(form: str, text: str, secret: str, kept: str) -> None:
    out = redact_text(text)
    assert secret not in out, f"{form}: {out!r}"
    assert REDACTED in out
    assert kept in out, f"{form} over-redacted: {out!r}"


def test_pem_private_key_block_is_redacted_across_lines() -> None:
    lines = ["config loaded", *PEM, "step:1 - timing_s/gen:1.0"]
    out = redact_lines(lines)
    body = "\n".join(out)
    for secret_line in PEM[1:-1]:
        assert secret_line not in body
    assert out[0] == "config loaded" and out[-1] == "step:1 - timing_s/gen:1.0"
    assert "PRIVATE KEY" in body  # the reader still sees that a key was there
    assert redact_text("\n".join(lines)).count(PEM[1]) == 0


@pytest.mark.parametrize(
    "text",
    [  # verl keys that contain "key"/"token"/"pass" and are not secrets
        "data.prompt_key=prompt",
        "data.reward_fn_key=data_source",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/x",
        "critic.ppo_max_token_len_per_gpu=32768",
        "data.response_key: response",
        "trainer.project_name=verl_grpo_example_gsm8k",
        "passes: 3",
        "https://huggingface.co/Qwen/Qwen2.5-0.5B",
        "sampling with -p 0.9 top-p",
    ],
)
def test_verl_settings_survive(text: str) -> None:
    assert redact_text(text) == text


def test_mapping_with_bare_key_under_service() -> None:
    out = redact_mapping({"trainer.wandb.key": "3f9a1c0b", "data.prompt_key": "prompt"})
    assert out == {"trainer.wandb.key": REDACTED, "data.prompt_key": "prompt"}


@pytest.mark.parametrize("form", TABLE, ids=[f.what[:40] for f in TABLE])
def test_every_row_of_the_table_redacts_its_own_example(form) -> None:
    """The table is the one list of forms: each row's example line loses something to it."""
    assert form.example, f"{form.what}: no example"
    out = redact_text(form.example)
    assert REDACTED in out and out != form.example, f"{form.what}: {out!r}"
    assert form.pattern.search(form.example) is not None  # this row, not another, finds it


def test_the_snapshot_lists_the_table() -> None:
    assert rules() == [f.what for f in TABLE] and len(rules()) >= 20


def test_text_without_a_secret_comes_back_unchanged_even_when_not_normal() -> None:
    for text in ("naïve\u200bnode ｆｕｌｌ", "path%20with%20spaces/data.parquet"):
        assert redact_text(text) == text


def test_the_pipeline_redacts_command_lines_configs_and_events_everywhere(tmp_path) -> None:
    """Issue 31: secrets in command lines reached snapshot.json and the recording. The pipeline
    redacts once; the store (screen, snapshot, metrics) and the recording both get it."""
    from verl_top.model import GpuProcess, LogEvent, ProcessList, VerlConfig
    from verl_top.protocol import read_recording
    from verl_top.sources.pipeline import Pipeline
    from verl_top.sources.recorder import Recorder
    from verl_top.store import Store

    secret = "0123456789abcdef0123456789abcdef01234567"
    cmd = f"bash -c 'wandb login {secret} && python3 -m verl.trainer.main_ppo'"
    store = Store()
    recorder = Recorder(tmp_path / "rec.ndjson")
    pipe = Pipeline(store, recorder=recorder, parsers={})
    pipe.emit(ProcessList(host="n1", t=1.0, procs=[GpuProcess(pid=7, gpu_index=0, cmd=cmd)]))
    pipe.emit(VerlConfig(host="n1", t=1.0, values={"trainer.wandb.key": secret, "a.b": 2}))
    pipe.emit(LogEvent(host="n1", t=1.0, kind="warn", text=f"SSHPASS={secret} failed"))
    recorder.close()
    recorded = (tmp_path / "rec.ndjson").read_text()
    assert secret not in recorded and REDACTED in recorded
    shown = store.hosts["n1"].procs.procs[0].cmd  # what the node screen and panes show
    assert secret not in shown and "verl.trainer.main_ppo" in shown
    assert store.config == {"trainer.wandb.key": REDACTED, "a.b": 2}
    assert len(read_recording(tmp_path / "rec.ndjson")) == 3


def test_the_redactor_remembers_command_lines() -> None:
    redactor = Redactor(capacity=2)
    line = "sshpass -p 'hunter2xyz' ssh node01"
    assert redactor.text(line) == redactor.text(line) == redact_text(line)
    for other in ("a", "b", "c"):  # the memo stays bounded
        redactor.text(other)
    assert len(redactor._memo) <= 2
