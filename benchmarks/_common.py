"""Small helpers shared by the benchmark scripts (standard library only).

Every benchmark prints a plain-text table and, with ``--json-out FILE``, writes the same numbers
plus the machine description as JSON, so docs/performance.md can quote both.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# benchmarks/compare.py runs this checkout's benchmarks (the harness, its fixtures) against the
# code of another checkout: the verl_top package is imported from there.
CODE_ENV = "VERL_TOP_BENCH_CODE"


def code_root() -> Path:
    """The checkout whose ``verl_top`` is measured: ``$VERL_TOP_BENCH_CODE``, else this one."""
    return Path(os.environ.get(CODE_ENV) or REPO).resolve()


def ensure_repo_on_path() -> None:
    """Make ``import verl_top`` import the code under test (``code_root()``) when a benchmark is
    run as ``python benchmarks/x.py``, ahead of any installed copy."""
    root = str(code_root())
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)


def ensure_tests_on_path() -> None:
    """Make this checkout's test helpers (tests/ui_data.py, tests/sshd.py) importable."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.append(tests)


def median(values: Sequence[float]) -> float | None:
    """Median, or None for no values."""
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation, or None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def machine() -> dict[str, Any]:
    """Where the numbers were taken: CPU model, core count, Python, GPUs seen by nvidia-smi."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # Other work on the machine skews timings: say how busy it was when the run ended.
        "loadavg_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: numbers rounded, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """A left-aligned text table with a dashed rule under the header."""
    cells = [[fmt(c, digits) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "-+-".join("-" * w for w in widths)
    body = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, rule, *body])


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus the machine description) to ``path`` when one was given."""
    if not path:
        return
    data = {"machine": machine(), **payload}
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")
