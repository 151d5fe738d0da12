"""The configuration file: defaults under command-line flags, warnings, errors, thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_top.cli import app_parser, diagnose_parser, main
from verl_top.diagnosis.thresholds import Thresholds
from verl_top.settings import (
    SettingsError,
    config_arg,
    default_config_path,
    load_settings,
    parse_args_with,
)

FULL = """
hosts = "hosts.txt"
interval = 2
window = 600
refresh = 0.5
theme = "classic"

[ssh]
identity = "~/.ssh/id_test"
jump = "me@bastion:2222"
ssh_config = "/etc/ssh/ssh_config"
known_hosts = "/tmp/kh"
accept_new_hosts = true
connect_timeout = 4
max_handshakes = 8
user = "ops"

[thresholds]
idle_pct = 40
long_tail_ratio = 3.5
"""


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never read the real ~/.config/verl-top of whoever runs the tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_full_file_becomes_defaults_and_thresholds(tmp_path: Path) -> None:
    (tmp_path / "hosts.txt").write_text("node01\nnode02\n")
    s = load_settings(str(write(tmp_path, FULL)))
    assert s.warnings == []
    assert s.defaults == {
        "hosts": str(tmp_path / "hosts.txt"),  # relative to the config file's folder
        "interval": 2.0,
        "window": 600.0,
        "refresh": 0.5,
        "theme": "classic",
        "identity": [str(Path("~/.ssh/id_test").expanduser())],
        "jump": "me@bastion:2222",
        "ssh_config": "/etc/ssh/ssh_config",
        "known_hosts": "/tmp/kh",
        "accept_new_hosts": True,
        "connect_timeout": 4.0,
        "max_handshakes": 8,
        "ssh_user": "ops",
    }
    assert s.thresholds.idle_pct == 40.0
    assert s.thresholds.long_tail_ratio == 3.5
    assert s.thresholds.busy_pct == Thresholds().busy_pct


def test_command_line_flags_override_the_file(tmp_path: Path) -> None:
    s = load_settings(str(write(tmp_path, FULL)))
    args = parse_args_with(app_parser(), ["--interval", "5", "-i", "/k/cli_key"], s)
    assert args.interval == 5.0  # flag wins
    assert args.window == 600.0  # file fills what the flag left
    assert args.theme == "classic"
    assert args.identity == ["/k/cli_key"]  # replaced, not appended to the file's list
    args = parse_args_with(app_parser(), [], s)
    assert args.identity == [str(Path("~/.ssh/id_test").expanduser())]
    assert args.accept_new_hosts is True and args.ssh_user == "ops"


def test_hosts_list_is_joined(tmp_path: Path) -> None:
    s = load_settings(str(write(tmp_path, 'hosts = ["gpu[01-04]", "head"]\n')))
    assert s.defaults["hosts"] == "gpu[01-04],head"


def test_unknown_keys_warn_with_their_path(tmp_path: Path) -> None:
    path = write(tmp_path, '[ssh]\nidenity = "x"\n[thresholds]\nidle_pc = 3\n[colours]\na = 1\n')
    s = load_settings(str(path))
    assert s.warnings == [
        f"{path}: unknown key 'ssh.idenity' (ignored)",
        f"{path}: unknown key 'colours' (ignored)",
        f"{path}: unknown key 'thresholds.idle_pc' (ignored; see docs/diagnosis.md)",
    ]
    assert s.defaults == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('interval = "fast"\n', "'interval' must be a number >= 0.05, got 'fast'"),
        ("window = 0\n", "'window' must be a number > 1, got 0"),
        ("refresh = true\n", "'refresh' must be a number > 0, got True"),
        ('[ssh]\naccept_new_hosts = "yes"\n', "'ssh.accept_new_hosts' must be true or false"),
        ("[ssh]\nmax_handshakes = 2.5\n", "'ssh.max_handshakes' must be a whole number >= 1"),
        ("[ssh]\nidentity = []\n", "'ssh.identity' must be a string or a list of strings"),
        ('ssh = "x"\n', "'ssh' must be a table ([ssh])"),
        ("[thresholds]\nidle_pct = -1\n", "'thresholds.idle_pct' must be a number >= 0, got -1"),
        ('[thresholds]\nidle_pct = "lots"\n', "'thresholds.idle_pct' must be a number >= 0"),
        ("interval = \n", "not valid TOML"),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_settings(str(path))
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_default_path_and_missing_files(tmp_path: Path) -> None:
    assert default_config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/verl-top/config.toml")
    assert default_config_path({"HOME": "/h"}) == Path("/h/.config/verl-top/config.toml")
    assert load_settings().defaults == {}  # no default file: nothing to apply, no error
    with pytest.raises(SettingsError, match="no such config file"):
        load_settings(str(tmp_path / "absent.toml"))


def test_default_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "xdg" / "verl-top" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("window = 120\n")
    assert load_settings().defaults == {"window": 120.0}


def test_config_arg_anywhere_in_argv() -> None:
    assert config_arg(["diagnose", "--demo", "--config", "a.toml"]) == "a.toml"
    assert config_arg(["--config=b.toml"]) == "b.toml"
    assert config_arg(["--demo"]) is None


def test_cli_bad_value_exits_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, 'interval = "fast"\n')
    assert main(["diagnose", "--demo", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"verl-top: {path}: 'interval' must be a number >= 0.05, got 'fast'\n")
    assert captured.out == ""  # nothing was collected or printed


def test_cli_warns_on_unknown_key_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[ssh]\nidenity = 'x'\n")
    assert main(["diagnose", "--demo", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"verl-top: {path}: unknown key 'ssh.idenity' (ignored)" in captured.err
    assert "bottleneck" in captured.out.lower() or "healthy" in captured.out.lower()


def test_thresholds_reach_the_diagnosis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The demo's bottleneck is the rollout long tail (slowest request ~2.9x the mean, threshold
    # 2x). Raising the threshold in the config file must make that finding go away.
    assert main(["diagnose", "--demo", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["bottleneck"]["rule"] == "flow.long_tail"
    path = write(tmp_path, "[thresholds]\nlong_tail_ratio = 10\n")
    assert main(["diagnose", "--demo", "--json", "--config", str(path)]) == 0
    after = json.loads(capsys.readouterr().out)
    rules = {f["rule"] for f in after["findings"]}
    assert "flow.long_tail" not in rules


def test_diagnose_parser_accepts_config_flag(tmp_path: Path) -> None:
    s = load_settings(str(write(tmp_path, "window = 30\n")))
    args = parse_args_with(diagnose_parser(), ["--config", "x", "--demo"], s)
    assert args.window == 30.0 and args.config == "x"


def test_prometheus_table_becomes_flag_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[prometheus]\nurl = "http://127.0.0.96:9090"\nselector = \'job="dcgm"\'\ninterval = 10\n',
    )
    s = load_settings(str(path))
    assert s.warnings == []
    args = parse_args_with(app_parser(), [], s)
    assert (args.prometheus, args.prom_selector, args.prom_interval) == (
        "http://127.0.0.96:9090",
        'job="dcgm"',
        10.0,
    )
    flag = parse_args_with(app_parser(), ["--prom-interval", "2"], s)
    assert flag.prom_interval == 2.0  # the command line wins


# -- the app's choices saved back (issue 32 item 4) -----------------------------------------

USER_FILE = """# my cluster, my rules
hosts = "gpu[01-04]"   # the four nodes
theme = 'classic'      # easy on the eyes
window=300

[ssh]
user = "ops"           # shared account
theme = "not the top-level theme"

[thresholds]
idle_pct = 40
"""


def test_saving_changes_only_the_keys_lines_and_keeps_comments(tmp_path: Path) -> None:
    from verl_top.settings import save_ui_settings

    path = write(tmp_path, USER_FILE)
    assert save_ui_settings(
        path, {"theme": "nord", "window": 600.0, "sort": "power", "sort_reverse": True}
    )
    text = path.read_text()
    # every line but the two changed ones is as it was; the new keys join the top level
    assert text.splitlines()[:4] == [
        "# my cluster, my rules",
        'hosts = "gpu[01-04]"   # the four nodes',
        'theme = "nord"      # easy on the eyes',
        "window=600",
    ]
    assert text.splitlines()[4:6] == ['sort = "power"', "sort_reverse = true"]
    assert text.endswith(USER_FILE.split("\n\n", 1)[1])  # the tables, untouched
    s = load_settings(str(path))
    assert [w.rsplit(": ", 1)[1] for w in s.warnings] == ["unknown key 'ssh.theme' (ignored)"]
    assert (s.defaults["theme"], s.defaults["window"]) == ("nord", 600.0)
    assert (s.defaults["sort"], s.defaults["sort_reverse"]) == ("power", True)
    assert s.thresholds.idle_pct == 40 and s.defaults["ssh_user"] == "ops"


def test_saving_what_the_file_already_says_does_not_write(tmp_path: Path) -> None:
    from verl_top.settings import save_ui_settings

    path = write(tmp_path, USER_FILE)
    before = path.stat().st_mtime_ns
    assert not save_ui_settings(path, {"theme": "classic", "window": 300})
    assert path.stat().st_mtime_ns == before and path.read_text() == USER_FILE


@pytest.mark.parametrize(
    "text",
    [
        'theme = """classic"""\n',  # a multi-line string: its line is not `key = value`
        "theme = [\n  'classic',\n]\n",  # a value over several lines
        "theme = \n",  # does not parse
    ],
)
def test_a_file_that_cannot_be_edited_line_by_line_is_left_alone(tmp_path: Path, text) -> None:
    from verl_top.settings import save_ui_settings

    path = write(tmp_path, text)
    with pytest.raises(SettingsError, match="settings not saved") as err:
        save_ui_settings(path, {"theme": "nord"})
    assert str(path) in str(err.value)
    assert path.read_text() == text  # untouched


def test_a_new_key_goes_before_the_first_table_and_the_mode_is_kept(tmp_path: Path) -> None:
    from verl_top.settings import save_ui_settings

    path = write(tmp_path, 'ui = {theme = "classic"}\nrefresh = 1\n\n[ssh]\nuser = "a"\n')
    path.chmod(0o640)
    assert save_ui_settings(path, {"theme": "nord"})
    assert path.read_text() == (
        'ui = {theme = "classic"}\nrefresh = 1\ntheme = "nord"\n\n[ssh]\nuser = "a"\n'
    )
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_new_file_is_private_and_its_directory_made(tmp_path: Path) -> None:
    from verl_top.settings import save_ui_settings

    path = tmp_path / "xdg" / "verl-top" / "config.toml"
    assert save_ui_settings(path, {"sort": "temp", "sort_reverse": False})
    assert path.read_text() == 'sort = "temp"\nsort_reverse = false\n'
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temporary left


def test_sort_keys_are_pane1s_and_a_bad_one_is_an_error(tmp_path: Path) -> None:
    from verl_top.settings import SORT_KEYS
    from verl_top.ui.panes.throughput import SORT_BY_COLUMN, SORT_CYCLE

    assert set(SORT_KEYS) == set(SORT_BY_COLUMN.values()) | set(SORT_CYCLE)
    with pytest.raises(SettingsError, match="'sort' must be one of host, activity"):
        load_settings(str(write(tmp_path, 'sort = "speed"\n')))
