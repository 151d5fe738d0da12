"""Replay a recording of a stopped worker and say when verl-top flagged the hang and whom it named.

    python benchmarks/hang_replay.py session.ndjson.gz --stop-file stop.txt [--every 1]

``stop.txt`` is what benchmarks/real_hang.sh writes: ``stop <epoch s> <pid> <title>`` when it
sent SIGSTOP, ``cont <epoch s> <pid>`` when it sent SIGCONT (the same clock as the agent's
samples: both run on the node). The recording goes through the real pipeline and store; the
engine evaluates every ``--every`` seconds of data time. Printed: a line per evaluation from the
stop on (job.hang's title, or what the lead was), then the summary: the first evaluation whose
job.hang finding names the stopped pid, in seconds after the stop and after the method's
overrun (the limit job.hang computed), whether it led the verdict, and when the finding cleared
after SIGCONT.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import ensure_repo_on_path, write_json

ensure_repo_on_path()

from verl_top.diagnosis.engine import Engine  # noqa: E402
from verl_top.diagnosis.findings import Verdict  # noqa: E402
from verl_top.protocol import read_recording  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store  # noqa: E402


@dataclass
class Stop:
    """What the stopper did."""

    pid: int
    stop_t: float
    title: str
    cont_t: float | None = None


@dataclass
class Outcome:
    """When the hang was flagged and the process named."""

    pid: int
    title: str
    stop_t: float
    cont_t: float | None
    evaluations: int = 0
    flagged_s: float | None = None  # first job.hang naming the pid, seconds after SIGSTOP
    limit_s: float | None = None  # job.hang's overrun limit for the method
    since_s: float | None = None  # method start before the stop (elapsed at flag - flagged_s)
    after_overrun_s: float | None = None
    led: bool | None = None  # job.hang was the verdict's lead at that evaluation
    title_at_flag: str = ""
    cleared_s: float | None = None  # first evaluation after SIGCONT without job.hang
    procs_seen: bool = False  # the recording has process lists at all


def read_stop(path: str | Path) -> Stop:
    """The stop and cont lines of a stop file."""
    stop: Stop | None = None
    for line in Path(path).read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and parts[0] == "stop":
            stop = Stop(int(parts[2]), float(parts[1]), parts[3] if len(parts) > 3 else "")
        elif len(parts) >= 3 and parts[0] == "cont" and stop is not None:
            stop.cont_t = float(parts[1])
    if stop is None:
        raise ValueError(f"{path}: no 'stop' line")
    return stop


def _hang(verdict: Verdict) -> Any:
    return next((f for f in verdict.findings if f.rule == "job.hang"), None)


def judge(records: list[Any], stop: Stop, every: float = 1.0, out=None) -> Outcome:
    """Feed ``records`` in time order, evaluating every ``every`` s of data from the stop on."""
    store = Store()
    store.replay = True  # data time follows the recording, as when verl-top replays it
    pipe = Pipeline(store, wall_clock=lambda: store.now)
    engine = Engine()
    res = Outcome(stop.pid, stop.title, stop.stop_t, stop.cont_t)
    next_eval = stop.stop_t
    for rec in sorted(records, key=lambda r: r.t or 0.0):
        while rec.t and rec.t > next_eval:
            _evaluate(engine.evaluate(store), res, next_eval, out)
            next_eval += every
        pipe.emit(rec)
    _evaluate(engine.evaluate(store), res, store.now, out)
    res.procs_seen = any(h.procs is not None for h in store.hosts.values())
    return res


def _evaluate(verdict: Verdict, res: Outcome, t: float, out: Any) -> None:
    res.evaluations += 1
    f = _hang(verdict)
    rel = t - res.stop_t
    named = f is not None and any(c.get("pid") == res.pid for c in f.data.get("culprits", []))
    if out is not None:
        what = f.title if f is not None else f"(no job.hang; lead {verdict.bottleneck_rule})"
        print(f"{rel:+7.1f} s  {what}", file=out)
    if named and res.flagged_s is None:
        res.flagged_s = round(rel, 1)
        res.limit_s = round(f.data["limit_s"], 1)
        res.since_s = round(f.data["elapsed_s"] - rel, 1)
        res.after_overrun_s = round(f.data["elapsed_s"] - f.data["limit_s"], 1)
        res.led = verdict.bottleneck_rule == "job.hang"
        res.title_at_flag = f.title
    if res.cont_t is not None and t > res.cont_t and f is None and res.cleared_s is None:
        res.cleared_s = round(t - res.cont_t, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--every", type=float, default=1.0, help="evaluation period (s of data)")
    ap.add_argument(
        "--target-s",
        type=float,
        default=None,
        help="exit 1 unless the stopped pid was named within this many s of its method's overrun",
    )
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    stop = read_stop(args.stop_file)
    res = judge(read_recording(args.recording), stop, args.every, sys.stdout)
    print(
        f"stopped pid {stop.pid} ({stop.title}) for "
        f"{(stop.cont_t or stop.stop_t) - stop.stop_t:.0f} s"
    )
    if not res.procs_seen:
        print("the recording has no process list: job.hang cannot judge (the agent sent none)")
    elif res.flagged_s is None:
        print("job.hang never named the stopped process")
    else:
        print(
            f"flagged and named {res.flagged_s} s after SIGSTOP ({res.after_overrun_s} s after "
            f"its method overran the {res.limit_s} s limit); led the verdict: {res.led}; "
            f"cleared {res.cleared_s} s after SIGCONT"
        )
        print(f"  {res.title_at_flag}")
    write_json(args.json_out, {"benchmark": "hang_replay", **asdict(res)})
    if args.target_s is not None and not met(res, args.target_s):
        print(f"target missed: named within {args.target_s:g} s of the overrun")
        return 1
    return 0


def met(res: Outcome, target_s: float) -> bool:
    """The stopped process was named within ``target_s`` of its method's overrun."""
    return res.after_overrun_s is not None and res.after_overrun_s <= target_s


if __name__ == "__main__":
    sys.exit(main())
