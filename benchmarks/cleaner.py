"""The boundary's text cleaner, BASE against HEAD, alternating in one process (ratios).

    python benchmarks/cleaner.py                  # BASE = main
    python benchmarks/cleaner.py --base HEAD~1 --rounds 9

``clean_text`` runs on every string of every record the protocol decodes and ``clean_line`` on
every followed log line, so a change to ``verl_top/untrusted.py`` is a hot-path change. This
loads ``verl_top/untrusted.py`` as it is at ``--base`` (``git show``) next to the working tree's
and times both on the same real inputs, alternating BASE and HEAD round by round so that a
busy shared machine slows both alike:

- every string field of the real verl 0.5.0 session recording (tests/fixtures/h200/), through
  ``clean_text`` (clean text: the fast path);
- every line of the real verl logs (tests/fixtures/verl/, with their ANSI colour codes and Ray
  prefixes), through ``clean_line``;
- the hostile run of issue 31 (C1 introducers then ESC) at 2 000 characters, through
  ``clean_line`` (BASE is quadratic there).

Prints, per input, the median CPU time of a pass for each side and HEAD/BASE.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from _common import REPO, ensure_repo_on_path, table

ensure_repo_on_path()

FIX = REPO / "tests" / "fixtures"


def load_at(rev: str | None, tmp: Path) -> ModuleType:
    """``verl_top/untrusted.py`` at git revision ``rev`` (None: the working tree) as a module."""
    path = REPO / "verl_top" / "untrusted.py"
    if rev is not None:
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:verl_top/untrusted.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        path = tmp / f"untrusted_{rev.replace('/', '_').replace('~', '_')}.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"untrusted_{id(path)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strings(value: Any) -> Iterable[str]:
    """Every string inside a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def inputs() -> dict[str, tuple[str, list[str]]]:
    """name -> (function name, the strings it is given)."""
    session = FIX / "h200" / "real_verl050_grpo_session.ndjson.gz"
    with gzip.open(session, "rt", encoding="utf-8") as fh:
        record_strings = [s for line in fh for s in strings(json.loads(line))]
    log_lines: list[str] = []
    for path in sorted((FIX / "verl").glob("real_*.log")):
        log_lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return {
        f"record strings ({len(record_strings)})": ("clean_text", record_strings),
        f"verl log lines ({len(log_lines)})": ("clean_line", log_lines),
        "hostile C1 run, 2000 chars (x20)": (
            "clean_line",
            ["\x90\x98\x9d\x9e\x9f" * 400 + "\x1b"] * 20,
        ),
    }


def one_pass(fn: Callable[[str], str], items: list[str]) -> float:
    """CPU seconds to clean every item once."""
    t0 = time.process_time()
    for item in items:
        fn(item)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="main", help="git revision to compare with (main)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base, head = load_at(args.base, Path(tmp)), load_at(None, Path(tmp))
    rows = []
    for name, (fn_name, items) in inputs().items():
        fb, fh = getattr(base, fn_name), getattr(head, fn_name)
        one_pass(fb, items), one_pass(fh, items)  # warm-up: regex caches
        tb, th = [], []
        for _ in range(args.rounds):  # alternate, so machine load hits both alike
            tb.append(one_pass(fb, items))
            th.append(one_pass(fh, items))
        mb, mh = statistics.median(tb), statistics.median(th)
        rows.append([name, fn_name, f"{mb * 1e3:.2f}", f"{mh * 1e3:.2f}", f"{mh / mb:.2f}"])
    print(f"BASE = {args.base}, HEAD = working tree; median of {args.rounds} alternating rounds")
    print(table(["input", "function", "BASE ms", "HEAD ms", "HEAD/BASE"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
