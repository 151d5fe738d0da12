"""Cost of each stage of a GPU sample's way in, alone, on the real agent's lines.

    python benchmarks/ingest_stages.py                     # this checkout's code
    VERL_TOP_BENCH_CODE=/path/to/other/checkout python benchmarks/ingest_stages.py

The lines are client_scale.py's templates (the real agent, replay backend, 8 GPUs, 30 ticks:
240 GPU lines of ~400 bytes, 512 host names). Per stage, microseconds per GPU line (best of
``--repeat`` timings of ``--number`` passes): JSON parsing (``untrusted.loads``), the record
check (``protocol.validate``), the decoder (both, plus its bookkeeping), the store
(``Store.ingest``), the pipeline (``Pipeline.emit``: store + routing) and the whole path
(``Decoder.decode`` then ``Pipeline.emit``). Run it for two checkouts alternately to compare:
the machine's load moves absolute figures.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from _common import ensure_repo_on_path, write_json
from client_scale import line, make_templates

ensure_repo_on_path()

from verl_top.protocol import Decoder, validate  # noqa: E402
from verl_top.sources.pipeline import Pipeline  # noqa: E402
from verl_top.store import Store, StoreLimits  # noqa: E402
from verl_top.untrusted import loads  # noqa: E402

HOSTS = 512


def gpu_lines() -> list[str]:
    """The agent's GPU lines of every template tick, for ``HOSTS`` hosts (ticks rotate)."""
    tpl = make_templates()
    out = []
    for h in range(HOSTS):
        k = h % len(tpl.ticks)
        out += [
            line(rtype, f"node{h:04d}", 1.7e9 + k, rest)
            for rtype, rest in tpl.ticks[k]
            if rtype == "gpu"
        ]
    return out


def per_line(fn: Callable[[], Any], n_lines: int, number: int, repeat: int) -> float:
    """Best time of ``fn`` (one pass over the lines) in microseconds per line."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / (number * n_lines) * 1e6


def measure(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per GPU line, by stage."""
    lines = gpu_lines()
    dicts = [loads(s) for s in lines]
    records = [validate(d) for d in dicts]
    decoder = Decoder()
    store = Store(StoreLimits())
    pipeline = Pipeline(store)
    for rec in records:  # every GPU known: the steady state, not first contact
        pipeline.emit(rec)

    def whole() -> None:
        for s in lines:
            rec = decoder.decode(s)
            if rec is not None:
                pipeline.emit(rec)

    stages: dict[str, Callable[[], Any]] = {
        "loads": lambda: [loads(s) for s in lines],
        "validate": lambda: [validate(d) for d in dicts],
        "decode": lambda: [decoder.decode(s) for s in lines],
        "store": lambda: [store.ingest(r, r.t) for r in records],
        "emit": lambda: [pipeline.emit(r) for r in records],
        "whole": whole,
    }
    return {name: per_line(fn, len(lines), number, repeat) for name, fn in stages.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=3, help="passes per timing")
    p.add_argument("--repeat", type=int, default=5, help="timings; the best is kept")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args()
    result = measure(args.number, args.repeat)
    print("  ".join(f"{k} {v:.2f} us" for k, v in result.items()))
    if args.json_out:
        write_json(args.json_out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
