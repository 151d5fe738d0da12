"""Every secret form named in issue 16 is redacted, and verl's own config keys are not.

One row per form. The secrets are CONSTRUCTED in each provider's real format; none is live.
"""

from __future__ import annotations

import pytest

from verl_top.export.redact import REDACTED, redact_lines, redact_mapping, redact_text

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
