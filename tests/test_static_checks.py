"""The static checks CI runs with the tests: ruff (lint and format) and mypy over the package.

Each runs as its own process from the repository root, with the settings in pyproject.toml, so
the README's one test command (``python -m pytest``) is also the whole CI check. A failure shows
the checker's own output. mypy's cache lives in pytest's cache folder (tmp when the cache
plugin is off): a fresh clone needs nothing prepared, a second run reuses it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <checker> ...`` in the repository root (the interpreter running the tests)."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _explain(name: str, proc: subprocess.CompletedProcess[str]) -> str:
    return f"{name} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def test_ruff_check_is_clean() -> None:
    proc = _run("ruff", "check", "--no-cache", ".", timeout=120)
    assert proc.returncode == 0, _explain("ruff check", proc)


def test_ruff_format_is_clean() -> None:
    proc = _run("ruff", "format", "--check", "--no-cache", ".", timeout=120)
    assert proc.returncode == 0, _explain("ruff format --check", proc)


@pytest.fixture
def mypy_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for mypy: pytest's own cache dir, else a fresh temporary one."""
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("mypy"))
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.slow
@pytest.mark.timeout(600)  # cold (no cache) it takes ~40 s on 2 cores; the limit is for slow CI
def test_mypy_is_clean(mypy_cache: Path) -> None:
    # The files and settings come from [tool.mypy] in pyproject.toml.
    proc = _run("mypy", "--cache-dir", str(mypy_cache), timeout=590)
    assert proc.returncode == 0, _explain("mypy", proc)
    assert "Success: no issues found" in proc.stdout, _explain("mypy", proc)
