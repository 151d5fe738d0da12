"""Parse rates of the text parsers on the real fixtures (single core, this process).

    python benchmarks/parsers.py                     # ~1 s per row
    python benchmarks/parsers.py --duration 0.2 --json-out parsers.json

Rows:

- verl logs (tests/fixtures/verl/real_*.log, the excerpt): ``VerlStreamParser.feed`` in chunks of
  ``--chunk`` lines, a fresh parser per pass (what the pipeline does for a followed file).
- NCCL logs and nccl-tests output (tests/fixtures/nccl/): ``NcclStreamParser.feed`` (a followed
  NCCL_DEBUG log) and ``parse_nccl_tests`` (a probe's stdout, whole text).
- nvidia-smi CSV: the agent's ``parse_smi_csv`` + ``smi_gpu_fields`` on the real 1× H200 query
  output fanned out to 8 GPU rows (what the nvidia-smi backend does per sample).

Each row is repeated until ``--duration`` seconds of CPU have passed; the rate is lines (or rows)
per CPU second.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import REPO, ensure_repo_on_path, table, write_json

ensure_repo_on_path()

from verl_top.agent import smi  # noqa: E402
from verl_top.nccl.parse import NcclStreamParser, parse_nccl_tests  # noqa: E402
from verl_top.verl.parse import VerlStreamParser  # noqa: E402

FIX = REPO / "tests" / "fixtures"
VERL_LOGS = (
    "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log",
    "real_gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",
    "verl_real_log_excerpt.txt",
)
NCCL_LOGS = ("all_reduce_perf_debug_g1.txt", "real_2node_16xH200_socket_all_reduce.txt")
NCCL_TESTS = (
    "all_reduce_perf_g1.txt",
    "all_gather_perf_g1.txt",
    "real_2node_16xH200_socket_all_reduce.txt",
)


@dataclass
class Result:
    """One parser on one input."""

    parser: str
    input: str
    lines: int
    nbytes: int
    out: int  # records / rows produced per pass
    passes: int
    cpu_s: float

    def summary(self) -> dict[str, Any]:
        """The JSON form with rates."""
        per_pass = self.cpu_s / self.passes
        return {
            "parser": self.parser,
            "input": self.input,
            "lines": self.lines,
            "bytes": self.nbytes,
            "records_per_pass": self.out,
            "passes": self.passes,
            "us_per_pass": per_pass * 1e6,
            "lines_per_s": self.lines / per_pass,
            "mb_per_s": self.nbytes / per_pass / 1e6,
        }


def repeat(fn: Callable[[], int], duration: float) -> tuple[int, float, int]:
    """Run ``fn`` until ``duration`` CPU seconds passed (at least twice); (passes, cpu_s, out)."""
    out = fn()  # warm-up: compiled regexes, caches
    passes = 0
    c0 = time.process_time()
    while True:
        out = fn()
        passes += 1
        spent = time.process_time() - c0
        if passes >= 2 and spent >= duration:
            return passes, spent, out


def chunks(lines: list[str], size: int) -> list[list[str]]:
    """``lines`` cut into lists of ``size``."""
    return [lines[i : i + size] for i in range(0, len(lines), size)]


def bench_verl(path: Path, chunk: int, duration: float) -> Result:
    """A followed verl log, fed in chunks."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    parts = chunks(lines, chunk)

    def one() -> int:
        parser = VerlStreamParser("bench", str(path))
        n = 0
        for i, part in enumerate(parts):
            n += len(parser.feed(part, float(i)))
        return n + len(parser.flush(float(len(parts))))

    passes, cpu, out = repeat(one, duration)
    return Result("VerlStreamParser.feed", path.name, len(lines), len(text), out, passes, cpu)


def bench_nccl_stream(path: Path, chunk: int, duration: float) -> Result:
    """A followed NCCL_DEBUG log, fed in chunks."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    parts = chunks(lines, chunk)

    def one() -> int:
        parser = NcclStreamParser("bench", str(path))
        return sum(len(parser.feed(part, float(i))) for i, part in enumerate(parts))

    passes, cpu, out = repeat(one, duration)
    return Result("NcclStreamParser.feed", path.name, len(lines), len(text), out, passes, cpu)


def bench_nccl_tests(path: Path, duration: float) -> Result:
    """A probe's nccl-tests stdout, parsed whole."""
    text = path.read_text(encoding="utf-8", errors="replace")

    def one() -> int:
        return len(parse_nccl_tests(text).rows)

    passes, cpu, out = repeat(one, duration)
    n = len(text.splitlines())
    return Result("parse_nccl_tests", path.name, n, len(text), out, passes, cpu)


def smi_text(gpus: int) -> str:
    """The real 1× H200 ``--query-gpu`` CSV with its data row repeated for ``gpus`` indices."""
    raw = (FIX / "agent" / "smi_query.csv").read_text(encoding="utf-8").splitlines()
    header = next(x for x in raw if x.startswith("timestamp"))
    row = next(x for x in raw if x[:1].isdigit())
    cells = row.split(", ")
    out = [header]
    for i in range(gpus):
        cells[1] = str(i)
        out.append(", ".join(cells))
    return "\n".join(out) + "\n"


def bench_smi(gpus: int, duration: float) -> Result:
    """The nvidia-smi backend's parse of one sample."""
    text = smi_text(gpus)

    def one() -> int:
        rows = smi.parse_smi_csv(text)
        return len([f for f in (smi.smi_gpu_fields(r) for r in rows) if f is not None])

    passes, cpu, out = repeat(one, duration)
    name = f"smi_query.csv x{gpus} GPUs"
    return Result("parse_smi_csv + smi_gpu_fields", name, gpus + 1, len(text), out, passes, cpu)


HEADERS = ["parser", "input", "lines", "records", "µs/pass", "lines/s", "MB/s"]


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--duration", type=float, default=1.0, help="CPU seconds per row")
    p.add_argument("--chunk", type=int, default=200, help="lines per feed() call")
    p.add_argument("--gpus", type=int, default=8, help="GPU rows in the nvidia-smi sample")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)

    results: list[Result] = []
    for name in VERL_LOGS:
        results.append(bench_verl(FIX / "verl" / name, args.chunk, args.duration))
    for name in NCCL_LOGS:
        results.append(bench_nccl_stream(FIX / "nccl" / name, args.chunk, args.duration))
    for name in NCCL_TESTS:
        results.append(bench_nccl_tests(FIX / "nccl" / name, args.duration))
    results.append(bench_smi(args.gpus, args.duration))

    rows = []
    for r in results:
        s = r.summary()
        rows.append(
            [
                s["parser"],
                s["input"],
                s["lines"],
                s["records_per_pass"],
                round(s["us_per_pass"], 1),
                f"{s['lines_per_s']:,.0f}",
                round(s["mb_per_s"], 2),
            ]
        )
    print(table(HEADERS, rows))
    write_json(
        args.json_out,
        {
            "benchmark": "parsers",
            "argv": sys.argv[1:] if argv is None else argv,
            "rows": [r.summary() for r in results],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
