"""Which verl a printed config comes from, by its keys alone (issue 28 item 1; the corpus's
323-key verl 0.5 config with no step line used to read "unknown").

- the builder (verl_top/verl/config_dates_build.py) on a small git history made here: a key's
  release lines come from the main commits that add and remove it, release branches widen
  them, a Hydra ``defaults:`` file without its generated form is skipped;
- the bundled table (verl_top/data/verl_config_keys.json, built from verl-project/verl);
- real printed configs whose release is known read that release, and a fork's odd keys are
  named instead of making the range "mixed".
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from verl_top.verl.config_dates import (
    ConfigDates,
    KeyDates,
    config_dates,
    config_version,
    parse_config_dates,
)
from verl_top.verl.config_dates_build import Repo, render
from verl_top.verl.flavour import detect
from verl_top.verl.parse import parse_file

FIX = Path(__file__).parent / "fixtures"
TAG_WHERE = re.compile(r"^v\d+\.\d+[\w.]* verl/trainer/config/[\w.]+\.yaml:\d+$")


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": "2025-01-01T00:00:00",
        "GIT_COMMITTER_DATE": "2025-01-01T00:00:00",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        path = repo / "verl" / "trainer" / "config" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """main: v0.1 {a, b} -> +c (tagged v0.2) -> -b -> a defaults-only file (skipped) ->
    generated form with d; v0.3.0 branches off after '-b' and adds z only on its branch."""
    repo = tmp_path_factory.mktemp("verl")
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"ppo_trainer.yaml": "trainer:\n  a: 1\n  b: 2\n"}, "start")
    _git(repo, "tag", "v0.1")
    _commit(repo, {"ppo_trainer.yaml": "trainer:\n  a: 1\n  b: 2\n  c: 3\n"}, "add c")
    _git(repo, "tag", "v0.2")
    _commit(repo, {"ppo_trainer.yaml": "trainer:\n  a: 1\n  c: 3\n"}, "drop b")
    _git(repo, "checkout", "-q", "-b", "release")
    _commit(repo, {"ppo_trainer.yaml": "trainer:\n  a: 1\n  c: 3\n  z: 0\n"}, "branch z")
    _git(repo, "tag", "v0.3.0")
    _git(repo, "checkout", "-q", "main")
    _commit(repo, {"ppo_trainer.yaml": "defaults:\n  - actor@x: y\nother: 1\n"}, "compose")
    _commit(
        repo,
        {"_generated_ppo_trainer.yaml": "trainer:\n  a: 1\n  c: 3\n  d: {}\n"},
        "generated",
    )
    doc = json.loads(render(Repo(repo), "main"))
    return doc


def test_builder_dates_keys_by_release_lines(history: dict) -> None:
    keys = history["keys"]
    assert "trainer.a" not in keys  # in every release: dates nothing
    assert keys["trainer.c"]["since"] == "0.2" and keys["trainer.c"]["until"] is None
    assert keys["trainer.c"]["first_tag"] == "v0.2 verl/trainer/config/ppo_trainer.yaml:4"
    # b left main after v0.2 and before v0.3 branched: the 0.2 line is its last.
    assert keys["trainer.b"]["since"] == "0.1" and keys["trainer.b"]["until"] == "0.2"
    assert keys["trainer.b"]["last_tag"] == "v0.2" and keys["trainer.b"]["removed"]
    # z exists only on the v0.3.0 branch: that tag alone dates it.
    assert keys["trainer.z"] == {
        "since": "0.3",
        "until": "0.3",
        "first_tag": "v0.3.0 verl/trainer/config/ppo_trainer.yaml:4",
        "last_tag": "v0.3.0",
    }
    # The defaults-only commit is skipped (its 'other' key never appears); the generated file's
    # empty mapping d is a key, as the printed config shows it.
    assert "other" not in keys
    assert keys["trainer.d"]["since"] == "0.3" and keys["trainer.d"]["until"] is None
    assert set(history["releases"]) == {"0.1", "0.2", "0.3"}
    assert "left main" in history["releases"]["0.3"]


def test_bundled_table_is_sourced_and_consistent() -> None:
    raw = json.loads((resources.files("verl_top") / "data" / "verl_config_keys.json").read_text())
    table = config_dates()
    assert len(table.keys) > 500
    assert [f"{a}.{b}" for a, b in table.releases] == [f"0.{n}" for n in range(1, 10)]
    for key, entry in raw["keys"].items():
        dates = table.keys[key]
        assert dates.until is None or dates.since <= dates.until, key
        assert entry.get("added") or entry.get("first_tag"), key  # where it comes from
        if "first_tag" in entry:
            assert TAG_WHERE.match(entry["first_tag"]), entry
        if dates.until is not None:
            assert entry.get("removed") or entry.get("last_tag"), key


@pytest.mark.parametrize(
    ("log", "release", "widest"),
    [
        # verl 0.5.0 run by this project on the H200 (fixtures/verl/PROVENANCE.md).
        ("verl/real_h200_verl050_grpo_hf_40steps.log", (0, 5), 2),
        # verl-data logs of verl's own author, at a known commit of the 0.1 line.
        ("real_logs/verl01_ppo_critic_qwen05b_timing_keys.log", (0, 1), 2),
        # The README paste of issue 28's corpus row: 323 keys, no step line.
        ("real_logs/retool_ppo_readme_stops_before_step1.log", (0, 5), 1),
        ("real_logs/ppo_critic_qwen25_7b_2x8gpu_ray_job_submit.log", (0, 3), 1),
    ],
)
def test_real_configs_read_their_release(log: str, release: tuple, widest: int) -> None:
    cfg = parse_file(FIX / log).config
    got = config_version(cfg)
    assert got is not None
    high = got.high or config_dates().releases[-1]
    assert got.low <= release <= high, got.text()
    assert high[1] - got.low[1] + 1 <= widest, got.text()


def test_a_config_alone_gives_the_flavour_a_version() -> None:
    """The corpus defect: a 323-key verl 0.5 config and no step said 'unknown'."""
    cfg = parse_file(FIX / "real_logs" / "retool_ppo_readme_stops_before_step1.log").config
    flavour = detect(cfg, ["TaskRunner"], [])
    assert flavour.version_range == "0.5"
    assert any(e.startswith("config keys: verl 0.5 (") for e in flavour.evidence)


def _table(entries: dict[str, tuple[str, str | None]]) -> ConfigDates:
    text = json.dumps(
        {
            "releases": {f"0.{n}": "" for n in range(1, 10)},
            "keys": {k: {"since": s, "until": u} for k, (s, u) in entries.items()},
        }
    )
    return parse_config_dates(text)


def test_a_forks_odd_key_is_named_not_a_mixed_range() -> None:
    """60 keys of the 0.6 line and one that verl added only in 0.8 (a backport, a +override):
    the config still reads 0.6, and the odd key is named."""
    entries: dict[str, tuple[str, str | None]] = {f"k{i}": ("0.6", "0.6") for i in range(60)}
    entries["backported"] = ("0.8", None)
    got = config_version(list(entries), _table(entries))
    assert got is not None and (got.low, got.high) == ((0, 6), (0, 6))
    assert got.outliers == ("backported",) and "backported" in got.text()
    assert "60 of 61 dated keys fit 0.6" in got.text()


def test_two_eras_half_and_half_give_no_tidy_answer() -> None:
    """Not a fork's handful: as many keys of 0.2 as of 0.8. No release fits them all, so the
    range is where the most fit, and every key out of it is named."""
    entries = {f"old{i}": ("0.1", "0.2") for i in range(10)}
    entries |= {f"new{i}": ("0.8", None) for i in range(12)}
    got = config_version(list(entries), _table(entries))
    assert got is not None and got.low == (0, 8) and got.high is None
    assert len(got.outliers) == 10 and got.text().startswith("config keys: verl >= 0.8")


def test_too_few_dated_keys_say_nothing() -> None:
    entries = {f"k{i}": ("0.5", "0.5") for i in range(4)}
    assert config_version(list(entries), _table(entries)) is None
    # A real SFT trainer's config (not the PPO one) dates too few keys to tell.
    sft = parse_file(FIX / "real_logs" / "sft_trainer_gemma2_2b_not_rl.log").config
    assert config_version(sft) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"releases": {}}', "no 'keys'"),
        ('{"keys": {"x": {"until": "0.2"}}}', "x"),
        ('{"keys": {"x": {"since": "0.5", "until": "0.2"}}}', "since"),
    ],
)
def test_a_bad_table_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config_dates(text)


def test_key_dates_fit() -> None:
    assert KeyDates((0, 3), None).fits((0, 9)) and not KeyDates((0, 3), (0, 4)).fits((0, 5))


def _corpus_rows() -> list[tuple[str, tuple[int, int]]]:
    """(log, release) of every real corpus row whose `release` names one (``verl ~0.4``,
    ``fork of verl ~0.1``), written before this reading existed."""
    import yaml

    rows = yaml.safe_load((FIX / "real_logs" / "expected.yaml").read_text())
    out = []
    for row in rows:
        hit = re.search(r"verl (?:>= )?~?(\d+)\.(\d+)", row["release"])
        if hit:
            out.append((row["file"], (int(hit[1]), int(hit[2]))))
    return out


@pytest.mark.parametrize(("log", "release"), _corpus_rows())
def test_every_printed_config_of_the_corpus_holds_its_release(log: str, release: tuple) -> None:
    """Each corpus row's release, as its provenance gives it, lies in the range its printed
    config's keys give (a row without a PPO config, or with too few dated keys, gives none)."""
    cfg = parse_file(FIX / "real_logs" / log).config or {}
    got = config_version(cfg)
    if got is None:
        assert len([k for k in cfg if k in config_dates().keys]) < 5, log
        return
    high = got.high or config_dates().releases[-1]
    assert got.low <= release <= high, got.text()
