"""The configuration file: defaults for the command line, and the diagnosis thresholds.

``~/.config/verl-top/config.toml`` (or ``$XDG_CONFIG_HOME/verl-top/config.toml``, or
``--config FILE``)::

    hosts = "~/cluster/hosts.txt"   # or a list: ["gpu[01-04]", "head"]
    interval = 1.0                  # s, sample period on the nodes
    window = 300                    # s, history window
    refresh = 1.0                   # s, screen refresh
    theme = "verl-dark"             # a theme name or a .toml theme file
    sort = "activity"               # pane 1's GPU table order (o / O in the app)
    sort_reverse = true

    [ssh]
    identity = "~/.ssh/id_ed25519"  # or a list
    jump = "me@bastion"
    ssh_config = "~/.ssh/config"
    known_hosts = "~/.ssh/known_hosts"
    accept_new_hosts = false
    connect_timeout = 10
    max_handshakes = 16
    user = "root"

    [prometheus]                    # docs/prometheus.md
    url = "http://prometheus:9090"  # read GPUs from dcgm-exporter instead of SSH
    selector = 'namespace="rl"'
    interval = 5

    [thresholds]                    # any field of verl_top.diagnosis.thresholds.Thresholds
    idle_pct = 40

Values become argparse defaults, so a flag on the command line always wins. Unknown keys are
warned about (and ignored); a bad value is an error naming its key, before anything connects.

The app saves what is chosen in it (theme, window, sort: ``UI_KEYS``) back to the file with
``save_ui_settings``: only those keys' own lines change (or are added before the first table),
so the user's other settings, comments and layout stay as they are; the new text must parse to
the old settings plus the changed keys, else nothing is written; the write is atomic.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_top.diagnosis.thresholds import Thresholds

CONFIG_FILE = "config.toml"
# Pane 1's sort orders (the values of ui/panes/throughput.py SORT_BY_COLUMN; a test keeps the
# two equal): listed here so that reading the config file does not import the UI.
SORT_KEYS = (
    "host",
    "activity",
    "nvml",
    "sm",
    "tensor",
    "dram",
    "memory",
    "power",
    "temp",
    "clock",
    "throttle",
)
# What the app saves back to the file when it is changed in the app (top-level keys).
UI_KEYS = ("theme", "window", "sort", "sort_reverse")


class SettingsError(Exception):
    """The configuration file cannot be used; the message names the file and the key."""


Check = Callable[[Any], Any]  # returns the value to use, raises ValueError("must be ...")


def _number(low: float, strict: bool = True) -> Check:
    def check(value: Any) -> float:
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        if not ok or not (value > low if strict else value >= low):
            raise ValueError(f"must be a number {'>' if strict else '>='} {low:g}")
        return float(value)

    return check


def _integer(low: int) -> Check:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be a whole number >= {low}")
        return value

    return check


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _sort_key(value: Any) -> str:
    if value not in SORT_KEYS:
        raise ValueError(f"must be one of {', '.join(SORT_KEYS)}")
    return str(value)


def _path(value: Any) -> str:
    return os.path.expanduser(_string(value))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _string_list(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise ValueError("must be a string or a list of strings")
    return [os.path.expanduser(v) for v in items]


def _strings(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise ValueError("must be a string or a list of strings")
    return list(items)


def _hosts(value: Any) -> str:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise ValueError("must be a hosts file, a host list string, or a list of host names")
    return ",".join(v.strip() for v in items)


# key path in the file -> (argparse dest, check)
KEYS: dict[str, tuple[str, Check]] = {
    "hosts": ("hosts", _hosts),
    "interval": ("interval", _number(0.05, strict=False)),
    "window": ("window", _number(1.0)),
    "refresh": ("refresh", _number(0.0)),
    "theme": ("theme", _string),
    "sort": ("sort", _sort_key),
    "sort_reverse": ("sort_reverse", _bool),
    "ssh.identity": ("identity", _string_list),
    "ssh.jump": ("jump", _string),
    "ssh.ssh_config": ("ssh_config", _path),
    "ssh.known_hosts": ("known_hosts", _path),
    "ssh.accept_new_hosts": ("accept_new_hosts", _bool),
    "ssh.connect_timeout": ("connect_timeout", _number(0.0)),
    "ssh.max_handshakes": ("max_handshakes", _integer(1)),
    "ssh.user": ("ssh_user", _string),
    "prometheus.url": ("prometheus", _string),
    "prometheus.selector": ("prom_selector", _string),
    "prometheus.rollout_selector": ("prom_rollout_selector", _string),
    "prometheus.node_selector": ("prom_node_selector", _string),
    "prometheus.interval": ("prom_interval", _number(0.0)),
    "prometheus.timeout": ("prom_timeout", _number(0.0)),
    "prometheus.headers": ("prom_header", _strings),
    "prometheus.bearer_token_file": ("prom_bearer_token_file", _path),
    "prometheus.ca_file": ("prom_ca_file", _path),
    "prometheus.cert_file": ("prom_cert_file", _path),
    "prometheus.key_file": ("prom_key_file", _path),
}
TABLES = ("ssh", "prometheus", "thresholds")
# argparse "append" options: a default list would be appended to, not replaced, by the flag.
APPEND_DESTS = ("identity", "prom_header")


@dataclass
class Settings:
    """What the configuration file says: argparse defaults, thresholds and warnings."""

    path: Path | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    warnings: list[str] = field(default_factory=list)


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/verl-top/config.toml, else ~/.config/verl-top/config.toml."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg:
        return Path(xdg) / "verl-top" / CONFIG_FILE
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".config" / "verl-top" / CONFIG_FILE


def _flatten(data: Mapping[str, Any], src: str, warnings: list[str]) -> dict[str, Any]:
    """Top-level keys and ``table.key`` keys; unknown tables/keys become warnings."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in TABLES:
            if not isinstance(value, Mapping):
                raise SettingsError(f"{src}: '{key}' must be a table ([{key}])")
            for sub, subvalue in value.items():
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    for key in list(flat):
        if key not in KEYS and not key.startswith("thresholds."):
            warnings.append(f"{src}: unknown key '{key}' (ignored)")
            del flat[key]
    return flat


def _thresholds(flat: Mapping[str, Any], src: str, warnings: list[str]) -> Thresholds:
    known = {f.name for f in dataclasses.fields(Thresholds)}
    values: dict[str, Any] = {}
    for key, value in flat.items():
        if not key.startswith("thresholds."):
            continue
        name = key.split(".", 1)[1]
        if name not in known:
            warnings.append(f"{src}: unknown key '{key}' (ignored; see docs/diagnosis.md)")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise SettingsError(f"{src}: '{key}' must be a number >= 0, got {value!r}")
        values[name] = value
    try:
        return Thresholds.from_mapping(values)
    except ValueError as exc:  # from_mapping's own checks, should the rules above miss one
        raise SettingsError(f"{src}: thresholds: {exc}") from exc


def parse_settings(data: Mapping[str, Any], path: Path) -> Settings:
    """Validate a parsed configuration file (SettingsError on the first bad value)."""
    src = str(path)
    settings = Settings(path=path)
    flat = _flatten(data, src, settings.warnings)
    for key, value in flat.items():
        if key.startswith("thresholds."):
            continue
        dest, check = KEYS[key]
        try:
            settings.defaults[dest] = check(value)
        except ValueError as exc:
            raise SettingsError(f"{src}: '{key}' {exc}, got {value!r}") from None
    hosts = settings.defaults.get("hosts")
    if hosts and not os.path.isabs(os.path.expanduser(hosts)):
        # A relative hosts file is relative to the config file, wherever verl-top is started.
        beside = path.parent / hosts
        if beside.is_file():
            settings.defaults["hosts"] = str(beside)
    elif hosts:
        settings.defaults["hosts"] = os.path.expanduser(hosts)
    settings.thresholds = _thresholds(flat, src, settings.warnings)
    return settings


def load_settings(path: str | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``path`` (must exist) or of the default file (may be absent)."""
    from verl_top.toml_text import load_toml

    explicit = path is not None
    p = Path(os.path.expanduser(path)) if path is not None else default_config_path(env)
    if not p.exists():
        if explicit:
            raise SettingsError(f"{p}: no such config file (given to --config)")
        return Settings()
    try:
        data = load_toml(p)
    except OSError as exc:
        raise SettingsError(f"{p}: cannot read the config file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SettingsError(f"{p}: {exc}") from exc
    return parse_settings(data, p)


def config_arg(argv: Sequence[str]) -> str | None:
    """The value of ``--config FILE`` / ``--config=FILE`` in ``argv``, if given."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def parse_args_with(
    parser: argparse.ArgumentParser, argv: Sequence[str], settings: Settings
) -> argparse.Namespace:
    """Parse ``argv`` with the file's values as defaults: command-line flags win."""
    dests = {a.dest for a in parser._actions}  # noqa: SLF001 - argparse has no public listing
    parser.set_defaults(
        **{k: v for k, v in settings.defaults.items() if k in dests and k not in APPEND_DESTS}
    )
    args = parser.parse_args(argv)
    for dest in APPEND_DESTS:
        if dest in dests and getattr(args, dest, None) is None and dest in settings.defaults:
            setattr(args, dest, list(settings.defaults[dest]))
    return args


# -- saving what the app changed -----------------------------------------------------------

_TABLE_HEADER = re.compile(r"^\s*\[")
# A one-line TOML value: a basic or literal string, a number, a boolean or a date.
_VALUE = r"""(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|[^\s#"'\[{][^\s#]*)"""


def toml_value(value: Any) -> str:
    """``value`` (str, bool, int or finite float) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written to TOML")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    raise ValueError(f"{type(value).__name__} values are not saved")


def set_top_level_key(text: str, key: str, value: Any) -> str:
    """``text`` with the top-level ``key = value`` line set: the line's value replaced (its
    indentation and trailing comment kept), or a new line after the last top-level line."""
    lines = text.splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if _TABLE_HEADER.match(line)), len(lines))
    pattern = re.compile(
        rf"""^(\s*(?:{re.escape(key)}|"{re.escape(key)}")\s*=\s*){_VALUE}(\s*(?:#.*)?)$"""
    )
    new = toml_value(value)
    for i in range(end):
        body = lines[i].rstrip("\r\n")
        match = pattern.match(body)
        if match:
            lines[i] = f"{match.group(1)}{new}{match.group(2)}{lines[i][len(body) :]}"
            return "".join(lines)
    at = end
    while at > 0 and not lines[at - 1].strip():
        at -= 1  # right after the last top-level line, before blank lines and the tables
    if at > 0 and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    lines.insert(at, f"{key} = {new}\n")
    return "".join(lines)


def save_ui_settings(path: Path, values: Mapping[str, Any]) -> bool:
    """Write the app's choices (keys of UI_KEYS) into the config file at ``path``.

    Returns True when the file was written, False when it already said so. Raises
    SettingsError (the file untouched) when the file cannot be read or parsed, or when the
    change cannot be made by editing those keys' lines alone."""
    from verl_top.toml_text import parse_toml

    unknown = set(values) - set(UI_KEYS)
    if unknown:
        raise SettingsError(f"not saved: {', '.join(sorted(unknown))} are not app settings")
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        old = parse_toml(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SettingsError(f"{path}: settings not saved: {exc}") from exc
    changed = {k: v for k, v in values.items() if old.get(k) != v}
    if not changed:
        return False
    new_text = text
    try:
        for key, value in changed.items():
            new_text = set_top_level_key(new_text, key, value)
        new = parse_toml(new_text)
    except ValueError as exc:
        raise SettingsError(f"{path}: settings not saved: {exc}") from exc
    if new != {**old, **changed}:
        raise SettingsError(
            f"{path}: settings not saved: {', '.join(changed)} could not be set without "
            "touching other lines (edit the file by hand)"
        )
    _write_atomic(path, new_text)
    return True


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once (a crash leaves the old or the new file), keeping
    its permissions; a new file and its directory are private to the user."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise SettingsError(f"{path}: settings not saved: {exc.strerror or exc}") from exc
