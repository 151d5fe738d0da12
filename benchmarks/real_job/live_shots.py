"""The real app, live, without a terminal: watch for a while, then save every pane as SVG.

    python benchmarks/real_job/live_shots.py --watch 60 --out DIR -- --ray http://127.0.0.1:8265 ...

Used by ``real_job.sh`` on the GPU machine next to the TUI under tmux: the same VerlTopApp with
the same arguments, driven by Textual's pilot at 160x48, so the pictures are what a user saw on
the real job (not a replay). Also writes ``client_cpu.csv``: this process's CPU seconds and RSS
every 2 s (from /proc/self), the ground truth for the node screen's client-cost line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from verl_top.cli import app_parser  # noqa: E402
from verl_top.inputs import build_inputs  # noqa: E402
from verl_top.ui.app import VerlTopApp  # noqa: E402
from verl_top.ui.themes import DEFAULT_THEME  # noqa: E402

SIZE = (160, 48)
VIEWS = (("1", "pane1"), ("2", "pane2"), ("3", "pane3"), ("4", "pane4"), ("5", "pane5"))


def cpu_rss() -> tuple[float, int]:
    """This process's CPU seconds (all threads) and RSS bytes."""
    t = os.times()
    with open("/proc/self/statm", encoding="ascii") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return t[0] + t[1], rss


async def watch(args: argparse.Namespace, app_args: list[str]) -> None:
    """Run the app for ``args.watch`` seconds, sampling its cost, then shoot each view."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = build_inputs(app_parser().parse_args(app_args))
    app = VerlTopApp(inputs, theme_name=DEFAULT_THEME)
    rows = ["t_s,cpu_s,rss_mib"]
    async with app.run_test(size=SIZE) as pilot:
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.watch:
            cpu, rss = cpu_rss()
            rows.append(f"{time.monotonic() - t0:.1f},{cpu:.3f},{rss / 2**20:.1f}")
            await pilot.pause(2.0)
        for key, name in VIEWS:
            await pilot.press(key)
            await pilot.pause(1.0)
            (out / f"{name}.svg").write_text(app.export_screenshot(title=f"verl-top {name}"))
        await pilot.press("d")
        await pilot.pause(1.0)
        (out / "findings.svg").write_text(app.export_screenshot(title="verl-top diagnosis"))
        await pilot.press("escape", "1", "tab", "tab", "enter")
        await pilot.pause(1.5)
        (out / "node.svg").write_text(app.export_screenshot(title="verl-top node screen"))
    inputs.close()
    (out / "client_cpu.csv").write_text("\n".join(rows) + "\n")


def main() -> int:
    """Command line: our options, then ``--``, then the verl-top arguments."""
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--watch", type=float, default=60.0, help="seconds to watch before the shots")
    p.add_argument("--out", required=True, help="folder for the SVGs and client_cpu.csv")
    p.add_argument("--profile", default="", help="cProfile dump (CPU-time clock) of the run")
    args = p.parse_args(argv[:cut])
    if not args.profile:
        asyncio.run(watch(args, argv[cut + 1 :]))
        return 0
    import cProfile  # noqa: PLC0415 - only when asked
    import time  # noqa: PLC0415

    prof = cProfile.Profile(time.process_time)
    try:
        prof.runcall(asyncio.run, watch(args, argv[cut + 1 :]))
    finally:
        prof.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
