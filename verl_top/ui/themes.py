"""Colour themes: the built-in TOML themes of the package and the user's own.

A theme file is TOML with the fields of ``textual.theme.Theme``::

    name = "my-theme"        # optional: defaults to the file name without .toml
    dark = true
    primary = "#5AA9E6"      # required
    warning = "#F2C14E"      # any other colour field is optional
    [variables]              # optional Textual design variables, e.g. "footer-key-foreground"

Every colour is checked with ``textual.color.Color.parse`` *before* the theme is registered:
Textual accepts a bad colour at registration and then crashes while drawing, so a bad file must
be refused here with a message naming the file and the field.

Where themes come from, later ones replacing earlier ones of the same name:
the package (``verl_top/themes/*.toml``), ``$XDG_CONFIG_HOME/verl-top/themes/*.toml`` and
``~/.config/verl-top/themes/*.toml``, and a FILE given to ``--theme``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from textual.color import Color, ColorParseError
from textual.theme import Theme

from verl_top.toml_text import load_toml

DEFAULT_THEME = "verl-dark"
COLOUR_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)
NUMBER_FIELDS = ("luminosity_spread", "text_alpha")
OTHER_FIELDS = ("name", "dark", "variables", "ansi")
KNOWN_FIELDS = frozenset(COLOUR_FIELDS + NUMBER_FIELDS + OTHER_FIELDS)


class ThemeError(Exception):
    """A theme file or theme name cannot be used; the message names the file and field."""


def _check_colour(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ThemeError(f"{source}: field {key!r}: {value!r} is not a colour (give a string)")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ThemeError(f"{source}: field {key!r}: {value!r} is not a colour") from None
    return value


def theme_from_mapping(data: Mapping[str, Any], source: str, default_name: str = "") -> Theme:
    """A validated Theme from a parsed theme file; ThemeError names ``source`` and the field."""
    unknown = sorted(set(data) - KNOWN_FIELDS)
    if unknown:
        raise ThemeError(
            f"{source}: unknown field {unknown[0]!r} (known: {', '.join(sorted(KNOWN_FIELDS))})"
        )
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise ThemeError(f"{source}: field 'name' must be a non-empty string, got {name!r}")
    if "primary" not in data:
        raise ThemeError(f"{source}: field 'primary' is missing (every theme needs one)")
    kwargs: dict[str, Any] = {"name": name.strip()}
    for key in COLOUR_FIELDS:
        if key in data:
            kwargs[key] = _check_colour(source, key, data[key])
    for key in ("dark", "ansi"):
        if key in data:
            if not isinstance(data[key], bool):
                raise ThemeError(
                    f"{source}: field {key!r} must be true or false, got {data[key]!r}"
                )
            kwargs[key] = data[key]
    for key in NUMBER_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ThemeError(
                    f"{source}: field {key!r} must be a number from 0 to 1, got {value!r}"
                )
            kwargs[key] = float(value)
    variables = data.get("variables", {})
    if not isinstance(variables, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in variables.items()
    ):
        raise ThemeError(f"{source}: field 'variables' must be a table of strings")
    kwargs["variables"] = dict(variables)
    return Theme(**kwargs)


def load_theme_file(path: str | os.PathLike[str]) -> Theme:
    """Read and validate one theme file (ThemeError on any problem)."""
    p = Path(path)
    try:
        data = load_toml(p)
    except OSError as exc:
        raise ThemeError(f"{p}: cannot read the theme file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ThemeError(f"{p}: {exc}") from exc
    return theme_from_mapping(data, str(p), default_name=p.stem)


def builtin_theme_dir() -> Path:
    """The folder of the themes shipped with the package."""
    return Path(str(resources.files("verl_top") / "themes"))


def user_theme_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """User theme folders: $XDG_CONFIG_HOME/verl-top/themes, then ~/.config/verl-top/themes."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg:
        dirs.append(Path(xdg) / "verl-top" / "themes")
    home = env.get("HOME")
    base = Path(home) if home else Path.home()
    dirs.append(base / ".config" / "verl-top" / "themes")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


@dataclass
class ThemeSet:
    """Themes found, by name, and the errors of the files that could not be used."""

    themes: dict[str, Theme] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def discover_themes(dirs: Iterable[Path] | None = None) -> ThemeSet:
    """Built-in then user themes (``dirs`` replaces the default folders); bad files are errors."""
    found = ThemeSet()
    folders = [builtin_theme_dir(), *user_theme_dirs()] if dirs is None else list(dirs)
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                theme = load_theme_file(path)
            except ThemeError as exc:
                found.errors.append(str(exc))
                continue
            found.themes[theme.name] = theme
    return found


def looks_like_file(value: str) -> bool:
    """True when a --theme value names a file rather than a theme."""
    return value.endswith(".toml") or os.sep in value or "/" in value


def resolve_theme(
    value: str | None, themes: Mapping[str, Theme], builtin_names: Iterable[str] = ()
) -> tuple[str, Theme | None]:
    """The theme name to use for ``--theme value`` and the theme to register first, if any.

    ``value`` is a theme name (ours, the user's or one of Textual's) or a theme file. Raises
    ThemeError with the choices when the name is unknown.
    """
    if not value:
        return DEFAULT_THEME, None
    if looks_like_file(value):
        theme = load_theme_file(os.path.expanduser(value))
        return theme.name, theme
    if value in themes or value in set(builtin_names):
        return value, None
    ours = sorted(themes)
    others = sorted(set(builtin_names) - set(ours))
    raise ThemeError(
        f"unknown theme {value!r}: choose one of {', '.join(ours)}"
        + (f" (or Textual's {', '.join(others[:6])}, …)" if others else "")
        + ", or give a .toml theme file"
    )


def textual_theme_names() -> list[str]:
    """Names of Textual's own built-in themes."""
    from textual.theme import BUILTIN_THEMES

    return sorted(BUILTIN_THEMES)


def check_theme_arg(value: str | None, dirs: Iterable[Path] | None = None) -> str:
    """Validate ``--theme`` before the app starts: the theme name, or ThemeError."""
    found = discover_themes(dirs)
    name, _ = resolve_theme(value, found.themes, textual_theme_names())
    return name


def install_themes(app: Any, value: str | None, dirs: Iterable[Path] | None = None) -> list[str]:
    """Register every valid theme with ``app`` and switch to ``value`` (None: keep the current).

    Returns the errors to show (bad user theme files, an unusable ``value``); the app keeps
    working on its current theme when ``value`` cannot be used.
    """
    found = discover_themes(dirs)
    for theme in found.themes.values():
        app.register_theme(theme)
    errors = list(found.errors)
    if value is None:
        return errors
    try:
        name, extra = resolve_theme(value, found.themes, app.available_themes)
    except ThemeError as exc:
        errors.append(str(exc))
        return errors
    if extra is not None:
        app.register_theme(extra)
    app.theme = name
    return errors
