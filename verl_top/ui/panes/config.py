"""Pane 5 — Config & scheduling: is a setting wasting the hardware?

The config keys the step-5 rules look at, each with the value found in the job's config and
verl's default (defaults from verl's generated trainer config; see docs/ui.md).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from verl_top.store import Store
from verl_top.ui.panes.base import Pane

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
# key, verl default (as verl prints it), what it governs
CONFIG_KEYS: tuple[tuple[str, str, str], ...] = (
    (
        A + "ppo_micro_batch_size_per_gpu",
        "null",
        "train micro batch; ≤ 2 without dynamic bsz = tiny GEMMs",
    ),
    (A + "use_dynamic_bsz", "False", "pack micro batches by tokens (usually faster)"),
    (
        A + "ppo_max_token_len_per_gpu",
        "16384",
        "token budget with dynamic bsz; ≥ 2×(prompt+response)",
    ),
    (A + "ppo_mini_batch_size", "256", "prompts per update"),
    ("data.train_batch_size", "1024", "prompts per step"),
    ("data.max_prompt_length", "512", "prompt length cap"),
    ("data.max_response_length", "512", "response length cap"),
    (R + "n", "1", "samples per prompt"),
    (R + "tensor_model_parallel_size", "2", "rollout TP: replicas = GPUs / TP"),
    (R + "gpu_memory_utilization", "0.5", "KV-cache memory fraction"),
    (R + "max_num_batched_tokens", "8192", "≥ max(8192, prompt+response)"),
    (R + "max_num_seqs", "256", "concurrent decode sequences"),
    (R + "enforce_eager", "False", "True disables CUDA graphs: slow decode"),
    (R + "log_prob_micro_batch_size_per_gpu", "null", "old_log_prob micro batch"),
    (A + "fsdp_config.param_offload", "False", "offload adds H2D/D2H every update"),
    (A + "fsdp_config.optimizer_offload", "False", "offload adds H2D/D2H every update"),
    ("trainer.balance_batch", "True", "equalize tokens per DP rank"),
    ("reward_model.launch_reward_fn_async", "False", "overlap CPU reward with log-prob"),
    ("trainer.test_freq", "-1", "validation every N steps"),
    ("trainer.save_freq", "-1", "checkpoint every N steps"),
)
MISSING_CONFIG = "no config: give --verl-config FILE or a driver log that printed the config"


def config_table(config: dict[str, object]) -> Table:
    """Value found vs verl default for each key the rules use."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("key", "value", "verl default", "what it governs"):
        table.add_column(col)
    for key, default, note in CONFIG_KEYS:
        if key in config:
            value = Text(str(config[key]))
            if str(config[key]) != default:
                value.stylize("bold")
        else:
            value = Text("— (not set)", style="dim")
        table.add_row(key, value, default, Text(note, style="dim"))
    return table


class ConfigPane(Pane):
    """Pane 5: config values against verl's defaults."""

    STEP = 5

    def compose(self) -> ComposeResult:
        yield self.findings
        yield Static("", id="cfg-body", classes="body")

    def update_content(self, store: Store, verdict: Any) -> None:
        parts: list[RenderableType] = []
        if store.config:
            src = f" (from {store.config_source})" if store.config_source else ""
            parts.append(Text(f"{len(store.config)} config keys{src}", style="bold underline"))
        else:
            parts.append(Text(MISSING_CONFIG, style="italic"))
        parts.append(config_table(store.config))
        self.query_one("#cfg-body", Static).update(Group(*parts))
