"""The agent package and how it is shipped (issue 29 item 7).

The package imports nothing but the standard library (and pynvml/psutil, optional, lazily); it
is shipped as a deflated zip with its sha256 over stdin and run from memory by a short bootstrap;
the replay backend goes only to agents asked to replay; a damaged payload is refused before any
of it runs; nothing is written on the node.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from verl_top.agent import loader, ship

AGENT_DIR = Path(ship.__file__).parent
ROOT = AGENT_DIR.parents[1]
TRACE = ROOT / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
OPTIONAL = {"pynvml", "psutil"}  # used when the node has them, imported inside functions


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level module, relative level, at module level) of every import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], 0, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append(((node.module or "").split(".")[0], node.level, id(node) in top))
    return out


@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="sys.stdlib_module_names is 3.10+ (this file also runs on 3.8)",
)
def test_every_agent_module_imports_only_the_standard_library() -> None:
    modules = sorted(AGENT_DIR.glob("*.py"))
    assert len(modules) >= 14
    for path in modules:
        for name, level, at_top in _imports(path):
            if level:  # a module of the package itself
                continue
            assert name != "verl_top", f"{path.name} imports the client ({name})"
            if name in OPTIONAL:
                assert not at_top, f"{path.name}: {name} must be imported lazily (optional)"
                continue
            assert name in sys.stdlib_module_names, f"{path.name} imports {name}: not stdlib"


def test_payload_is_a_deflated_zip_with_its_sha256_and_loader_offset() -> None:
    p = ship.build(replay=False)
    text = p.text()
    head, body = text.split("\n", 1)
    n, sha, offset, size = head.split()
    assert text.isascii() and int(n) == len(body)
    data = base64.b64decode(body)
    assert data == p.zip and hashlib.sha256(data).hexdigest() == sha
    # the bootstrap runs loader.py by slicing: it is stored, at the offset the header gives
    assert data[int(offset) : int(offset) + int(size)] == (AGENT_DIR / "loader.py").read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        assert all(
            i.compress_type == zipfile.ZIP_DEFLATED for n, i in infos.items() if "loader" not in n
        )
        # the node's own reader (no zipfile module there) reads what zipfile reads
        assert loader.read_zip(data) == {name: zf.read(name) for name in infos}
    shipped = {Path(n).name for n in infos}
    assert "main.py" in shipped and "nvml.py" in shipped and "__init__.py" in shipped
    assert not shipped & {"ship.py", "__main__.py", "replay.py"}
    assert len(data) < sum((AGENT_DIR / n).stat().st_size for n in shipped) / 2  # deflated
    assert ship.build(replay=False).zip == data  # deterministic: the same source, the same sha


def test_replay_backend_is_sent_only_to_agents_asked_to_replay() -> None:
    assert ship.wants_replay(["--host", "a", "--backend", "replay"])
    assert ship.wants_replay(("--backend=replay",))
    assert not ship.wants_replay(["--backend", "auto", "--replay-gpus", "2"])
    assert not ship.wants_replay(["--backend"])
    names = {Path(n).name for n in ship.build(replay=True).modules}
    assert "replay.py" in names
    assert "replay.py" not in {Path(n).name for n in ship.build(replay=False).modules}


def _run_bootstrap(payload: str, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-u", "-c", ship.BOOTSTRAP, *args],
        input=payload,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
        env=env,
    )


def test_a_damaged_payload_is_refused_before_any_of_it_runs(tmp_path: Path) -> None:
    p = ship.build(replay=False)
    head, body = p.text().split("\n", 1)
    raw = bytearray(p.zip)
    raw[p.loader_offset + 10] ^= 0x20  # one flipped bit in loader.py: it must not be exec()ed
    bad = head + "\n" + base64.b64encode(bytes(raw)).decode()
    env = {**os.environ, "PYTHONPATH": ""}
    res = _run_bootstrap(bad, ["--once", "--backend", "none"], tmp_path, env)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip() == ship.BOOTSTRAP_REFUSAL
    # a truncated stream (the connection dropped mid-payload) is refused the same way
    for cut in (p.text()[: len(p.text()) // 2 + 1], head[:3], ""):
        res = _run_bootstrap(cut, ["--once"], tmp_path, env)
        assert res.returncode == 1 and res.stdout == ""
        assert res.stderr.strip() == ship.BOOTSTRAP_REFUSAL


def test_agent_runs_from_memory_and_writes_no_file(tmp_path: Path) -> None:
    """The node's working directory and TMPDIR stay empty: no temporary zip, no __pycache__."""
    work, tmp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": "", "TMPDIR": str(tmp), "VERL_TOP_AGENT_NO_PSUTIL": "1"}
    args = ["--once", "--backend", "replay", "--replay-trace", str(TRACE), "--replay-gpus", "2"]
    res = _run_bootstrap(ship.agent_payload(args), args, work, env)
    assert res.returncode == 0, res.stderr
    types = [line.split('"type":"')[1].split('"')[0] for line in res.stdout.splitlines()]
    assert types[:2] == ["hello", "topo"] and types.count("gpu") == 2
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []


def test_tracebacks_from_the_shipped_package_show_its_source() -> None:
    files = loader.read_zip(ship.build().zip)
    imp = loader.MemoryImporter(loader.PACKAGE, files)
    spec = imp.find_spec(f"{loader.PACKAGE}.host")
    assert spec is not None and spec.origin == f"<verl-top-agent>/{loader.PACKAGE}/host.py"
    assert imp.find_spec(f"{loader.PACKAGE}.replay") is None  # not shipped here
    assert imp.find_spec("json") is None  # other modules: the normal finders
    pkg = imp.find_spec(loader.PACKAGE)
    assert pkg is not None and pkg.submodule_search_locations == []
    assert "class HostSampler" in (imp.get_source(f"{loader.PACKAGE}.host") or "")


def test_read_zip_refuses_what_is_not_our_archive() -> None:
    with pytest.raises(ValueError, match="not a zip archive"):
        loader.read_zip(b"PK" + b"\0" * 40)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("x.py"), b"x = 1\n" * 100, zipfile.ZIP_BZIP2)
    with pytest.raises(ValueError, match="compression method 12"):
        loader.read_zip(buf.getvalue())


PY38_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
from verl_top.agent import backends, follow, host, loader, main, nvml, procs, smi, topo, wire
a = main.Agent(main.parse_args(["--backend", "replay", "--replay-trace", sys.argv[2],
                                "--replay-gpus", "2", "--host", "p"]))
recs = a.hello(), *a.tick(), *a.tick()
a.close()
print(json.dumps(sorted({r["type"] for r in recs})))
"""


def test_the_package_imports_and_ticks_on_python38() -> None:
    """Every module imported by Python 3.8 itself (not only compiled), and an Agent ticking."""
    if not os.path.exists(PY38):
        pytest.fail(f"{PY38} missing: the agent must be checked on Python 3.8")
    res = subprocess.run(
        [PY38, "-c", PY38_CHECK, str(ROOT), str(TRACE)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == '["gpu", "hb", "hello", "host"]'
