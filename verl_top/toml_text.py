"""TOML files read with the standard library (tomllib; tomli on Python 3.10).

Apart from the themes (which need textual) so that reading the config file costs the headless
commands no textual import (issue 30: start-up is part of every post-mortem)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load_toml", "parse_toml"]


def _toml() -> Any:
    """tomllib (3.11+) or tomli (3.10); ValueError when neither is there."""
    # The checker reads one Python version (3.10, then tomllib is missing to it) on a machine
    # that may lack tomli (3.11+): each import's ignore covers the version it is not for.
    try:
        import tomllib as toml  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ModuleNotFoundError as exc:
            raise ValueError(
                "reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli)"
            ) from exc
    return toml


def parse_toml(text: str) -> dict[str, Any]:
    """Parse TOML text; raises ValueError ("not valid TOML: ...")."""
    toml = _toml()
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from exc


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file with tomllib (3.11+) or tomli (3.10); ThemeError-free, raises ValueError."""
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid TOML: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    return parse_toml(text)
