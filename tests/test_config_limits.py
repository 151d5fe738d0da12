"""Configs are foreign text: YAML alias bombs, deep nesting and decoded escapes (issue 31).

``--verl-config`` files, config files followed on a node and the dict verl prints at start all
go through verl_top/verl/config.py. A 900-byte alias bomb made the flattener walk 10**9 keys
(46 s, 2.8 GB); deep YAML raised RecursionError and killed its source; ``"\\e"`` in YAML,
``"\\u001b"`` in JSON and ``'\\x1b'`` in a pprinted dict made escape characters after the
raw-line boundary had been passed.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from verl_top.model import VerlConfig
from verl_top.untrusted import is_clean
from verl_top.verl.config import (
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_KEYS,
    MAX_CONFIG_NODES,
    ConfigError,
    flatten,
    load_config_file,
    load_config_text,
)
from verl_top.verl.parse import VerlStreamParser

REAL = Path(__file__).parent / "fixtures" / "verl" / "verl_generated_ppo_trainer.yaml"


def billion_laughs_sequences() -> str:
    """9 levels of 9 aliases each: 9**9 (387 million) leaves from ~300 bytes."""
    text = "a: &a [" + ",".join(["lol"] * 9) + "]\n"
    for i in range(1, 9):
        name, prev = chr(ord("a") + i), chr(ord("a") + i - 1)
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text


def billion_laughs_mappings() -> str:
    """The flattener's case: mappings of mappings, 10**9 dotted keys from ~900 bytes."""
    text = "l0: &l0 {" + ", ".join(f"k{j}: 1" for j in range(10)) + "}\n"
    for i in range(1, 9):
        text += f"l{i}: &l{i} {{" + ", ".join(f"k{j}: *l{i - 1}" for j in range(10)) + "}\n"
    return text


@pytest.mark.parametrize("bomb", [billion_laughs_sequences, billion_laughs_mappings])
def test_an_alias_bomb_is_refused_with_a_reason_in_little_memory(bomb, tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text(bomb())
    assert path.stat().st_size < 1000
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=rf"{path}: YAML aliases expand to more than"):
            load_config_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB to refuse a {path.stat().st_size} B file"


def test_the_alias_bomb_followed_as_a_config_file_is_said_and_the_stream_goes_on() -> None:
    parser = VerlStreamParser("head", "/runs/config.yaml")
    out = parser.feed(billion_laughs_mappings().splitlines(), 1.0)
    assert out == [] and parser.malformed == 1
    assert "aliases expand to more than" in parser.counts["first_malformed"]
    # The same stream still reads step lines that follow.
    assert parser.feed(['{"step": 1, "data": {"timing_s/step": 2.0}}'], 2.0)[0].step == 1


def test_anchors_and_merge_keys_of_an_ordinary_config_still_work() -> None:
    text = "base: &b {lr: 1.0e-6, wd: 0.01}\nactor: {<<: *b, lr: 2.0e-6}\ncritic: *b\n"
    assert flatten(load_config_text(text)) == {
        "base.lr": 1e-6,
        "base.wd": 0.01,
        "actor.lr": 2e-6,
        "actor.wd": 0.01,
        "critic.lr": 1e-6,
        "critic.wd": 0.01,
    }


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("deep_block.yaml", "a:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(3000))),
        ("deep.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ],
)
def test_deep_yaml_and_json_give_a_clear_error_not_recursion_error(
    name: str, text: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{path}: .*nested deeper than {MAX_CONFIG_DEPTH}"):
        load_config_file(path)


def test_a_deep_config_followed_on_a_node_does_not_kill_its_stream() -> None:
    parser = VerlStreamParser("head", "/runs/deep.yaml")
    assert parser.feed(["a: " + "[" * 5000 + "]" * 5000], 1.0) == []
    assert "nested deeper than" in parser.counts["first_malformed"]


def test_flatten_is_bounded_on_shared_subtrees_built_in_memory() -> None:
    # A pprinted or JSON config cannot share sub-trees, but flatten must not trust its caller.
    level: dict[str, object] = {f"k{j}": 1 for j in range(10)}
    for _ in range(9):
        level = {f"k{j}": level for j in range(10)}  # 10**10 paths
    out = flatten({"trainer": level})
    assert 0 < len(out) <= MAX_CONFIG_NODES
    wide = {f"key{i}": i for i in range(MAX_CONFIG_KEYS * 3)}
    assert len(flatten(wide)) == MAX_CONFIG_KEYS
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(10_000):  # would have been a RecursionError
        deep = {"d": deep}
    assert flatten(deep) == {}  # nothing within MAX_CONFIG_DEPTH levels is a leaf


def test_escapes_made_by_decoding_are_removed_from_keys_and_values() -> None:
    yaml_text = 'trainer:\n  "exp\\e[2Jname": "\\e]0;pwned\\a ok"\n  logger: ["\\e[31mconsole"]\n'
    json_text = '{"trainer": {"project\\u001b]52;c;eA==\\u0007": "a\\u202eb\\u200bc"}}'
    from_yaml = flatten(load_config_text(yaml_text))
    from_json = flatten(load_config_text(json_text, json_first=True))
    assert from_yaml == {"trainer.expname": " ok", "trainer.logger": ["console"]}
    assert from_json == {"trainer.project": "abc"}
    parser = VerlStreamParser("head", "driver.log")
    printed = (
        "(TaskRunner pid=1) {'data': {'train_files': '\\x1b[8m/secret\\x1b]8;;http://x\\x07'},"
    )
    (config,) = parser.feed([printed, "(TaskRunner pid=1)  'trainer': {'nnodes': 1}}"], 1.0)
    assert isinstance(config, VerlConfig)
    assert config.values == {"data.train_files": "/secret", "trainer.nnodes": 1}
    for values in (from_yaml, from_json, config.values):
        for key, value in values.items():
            assert is_clean(key) and is_clean(str(value))


def test_an_int_too_long_for_python_loses_only_its_value() -> None:
    out = flatten(load_config_text("trainer:\n  nnodes: 2\n  seed: " + "9" * 5000 + "\n"))
    assert out["trainer.nnodes"] == 2
    assert out["trainer.seed"].startswith("999") and len(out["trainer.seed"]) <= 64


def test_verls_own_generated_config_loads_unchanged(tmp_path: Path) -> None:
    values = load_config_file(REAL)
    # Read off the file: line 201 and 543 (gpu_memory_utilization: 0.5), 494/604
    # (n_gpus_per_node: 8), 597 (logger: console, wandb), 52 (micro batch null).
    assert values["actor_rollout_ref.rollout.gpu_memory_utilization"] == 0.5
    assert values["trainer.n_gpus_per_node"] == 8
    assert values["trainer.logger"] == ["console", "wandb"]
    assert values["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] is None
    assert len(values) > 500 and all(is_clean(k) for k in values)
    # Same keys, same order as the plain recursive flattening the module used to do.
    assert list(values) == list(_recursive_flatten(load_config_text(REAL.read_text())))


def _recursive_flatten(tree: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(_recursive_flatten(value, name))
        else:
            out[name] = value
    return out
