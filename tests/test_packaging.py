"""Install like every other tool (issue 32 item 9): one version source, metadata a package index
accepts, and a wheel that installs into a fresh venv and runs.

The wheel test builds from a copy of the package (the build writes build/ and *.egg-info next to
its sources), offline (build and twine come with the test extra): no build isolation (the installed setuptools builds it) and a venv that
sees this machine's packages for the dependencies (`--system-site-packages`, `--no-index`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import venv
from email.parser import Parser
from pathlib import Path

import pytest

import verl_top
from verl_top.cli_help import KEY_DEPENDENCIES, version_text

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def test_one_version_source() -> None:
    from verl_top.ui.themes import load_toml

    data = load_toml(PYPROJECT)
    assert "version" not in data["project"] and "version" in data["project"]["dynamic"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "verl_top.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[ab]\d+|rc\d+|\.dev\d+)?", verl_top.__version__)


def test_version_names_verl_top_its_key_dependencies_and_python() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"verl-top {verl_top.__version__}"
    names = [line.split()[0] for line in lines[1:]]
    assert names == [name for name, _ in KEY_DEPENDENCIES] + ["python"]
    textual = next(line for line in lines if line.split()[0] == "textual")
    assert re.search(r"\b8\.\d+", textual)  # the installed textual 8.x, not a placeholder
    assert f"{sys.version_info.major}.{sys.version_info.minor}." in lines[-1]
    assert out.stdout.strip() == version_text()


def _build(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "verl_top", src / "verl_top", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return dist


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_wheel_and_sdist_build_pass_twine_and_the_wheel_runs_in_a_fresh_venv(
    tmp_path: Path,
) -> None:
    dist = _build(tmp_path)
    version = verl_top.__version__
    wheel = dist / f"verl_top-{version}-py3-none-any.whl"
    sdist = dist / f"verl_top-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    check = subprocess.run(  # what a package index runs on upload (the test extra has twine)
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    meta = _wheel_metadata(wheel)
    assert meta["Name"] == "verl-top" and meta["Version"] == version
    assert meta["License-Expression"] == "Apache-2.0" and meta["Requires-Python"] == ">=3.10"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert any(r.startswith("textual") for r in meta.get_all("Requires-Dist"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--force-reinstall",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    deps = subprocess.run(
        [str(py), "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert "verl-top" not in deps.stdout, deps.stdout  # its requirements are all met
    run_env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run(
        [str(py), "-c", "import verl_top; print(verl_top.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=run_env,
    )
    assert where.stdout.startswith(str(env_dir)), where  # the wheel's copy, not the checkout
    script = env_dir / "bin" / "verl-top"
    out = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, env=run_env
    )
    assert out.returncode == 0 and out.stdout.startswith(f"verl-top {version}\n"), out
    # The package data came along: the bundled demo recording and the stylesheet.
    demo = subprocess.run(
        [str(script), "diagnose", "--demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=run_env,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert '"label": "step 3 bottleneck"' in demo.stdout
    installed = Path(where.stdout.strip()).parent
    assert (installed / "ui" / "verl_top.tcss").is_file()
    assert (installed / "themes" / "verl-dark.toml").is_file()


def _wheel_metadata(wheel: Path):  # noqa: ANN202 - an email.message.Message
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode("utf-8"))
