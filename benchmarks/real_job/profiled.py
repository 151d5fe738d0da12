"""Run ``verl-top ARGS`` under cProfile with a CPU-time clock (the default clock is wall time,
which counts the event loop's idle waits): ``python profiled.py OUT.prof -- diagnose --ray ...``.
``client_parts.py`` then splits the CPU into sampling, log following, Ray polling, diagnosis,
rendering."""

from __future__ import annotations

import cProfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl_top.cli import main  # noqa: E402


def run(out: str, args: list[str]) -> int:
    """Profile one verl-top command; the dump goes to ``out`` even when it fails."""
    prof = cProfile.Profile(time.process_time)
    try:
        return prof.runcall(main, args)
    finally:
        prof.dump_stats(out)


if __name__ == "__main__":
    cut = sys.argv.index("--")
    sys.exit(run(sys.argv[1], sys.argv[cut + 1 :]))
