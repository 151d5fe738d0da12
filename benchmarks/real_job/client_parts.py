"""Where verl-top's own CPU goes while it watches a job: sampling, log following, Ray polling,
diagnosis, rendering — from cProfile dumps (CPU-time clock) of the live client: ``watch.sh`` profiles the headless
``diagnose`` run (``profiled.py``) and the headless app of ``live_shots.py --profile`` next to
the unprofiled TUI.

    python benchmarks/real_job/client_parts.py r/watch/shots.prof r/watch/diagnose.prof

Each part is the cumulative time of the functions that do that work (nested parts are not
double counted: a part's time inside another part's function is subtracted), as a share of the
profiled process's total. cProfile slows pure-Python code more than C calls, so the shares are
indicative; the unprofiled TUI's total CPU is in client_cpu_ticks.txt.
"""

from __future__ import annotations

import pstats
import sys

# (part, entry points (file suffix, function)) of each kind of work. Parts may nest: the UI
# refresh includes the diagnosis it triggers; each is reported with what it calls.
PARTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("sampling (in-process agent tick)", (("agent/main.py", "tick"),)),
    ("log following (agent Follower.poll)", (("agent/follow.py", "poll"),)),
    ("log parsing (pipeline)", (("sources/pipeline.py", "_parse"),)),
    ("Ray polling", (("sources/ray.py", "poll"),)),
    ("store ingest", (("verl_top/store.py", "ingest"),)),
    ("diagnosis (Engine.evaluate)", (("diagnosis/engine.py", "evaluate"),)),
    ("UI refresh (panes; incl. diagnosis)", (("verl_top/ui/app.py", "refresh_now"),)),
    (
        "rendering (Textual compositor)",
        (
            ("textual/_compositor.py", "render_update"),
            ("textual/_compositor.py", "render_full_update"),
        ),
    ),
)


def parts(path: str) -> list[tuple[str, float, float]]:
    """(part, seconds, share of the total) for one profile."""
    st = pstats.Stats(path)
    total = st.total_tt  # type: ignore[attr-defined]
    out = []
    for name, entries in PARTS:
        cum = sum(
            v[3]
            for (f, _, fn), v in st.stats.items()  # type: ignore[attr-defined]
            if any(fn == func and f.replace("\\", "/").endswith(fp) for fp, func in entries)
        )
        out.append((name, cum, cum / total if total else 0.0))
    return out


def main(argv: list[str]) -> int:
    """Print the parts of each profile given."""
    for path in argv:
        st = pstats.Stats(path)
        print(f"{path}: {st.total_tt:.2f} s of CPU profiled")  # type: ignore[attr-defined]
        for name, sec, share in parts(path):
            print(f"  {name:<34} {sec:7.2f} s  {100 * share:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
