"""One Prometheus instant answer of N DCGM-labelled series decoded as the source decodes it.

    python benchmarks/prom_decode.py                    # 16384 series (2048 hosts x 8 GPUs)
    VERL_TOP_BENCH_CODE=/path/to/other/tree python benchmarks/prom_decode.py --series 4096

The answer (constructed: the labels dcgm-exporter gives a GPU, one value each) is fed in 64 KiB
pieces, as ``http_client`` feeds a streamed body, to ``untrusted.JsonArrayStream`` with the
source's ``SeriesReader`` (label cleaning, value checks), the memos warm as in a running
source. Printed: CPU ms per answer, the best of ``--repeat`` (the decoding alone; the round's
regrouping into records and the ingest are ``prom_app_scale.py``'s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _common import ensure_repo_on_path, write_json

ensure_repo_on_path()

from verl_top.sources.prometheus import (  # noqa: E402
    MAX_OTHER,
    MAX_SERIES,
    MAX_SERIES_CHARS,
    LabelCleaner,
    SeriesReader,
)
from verl_top.untrusted import JsonArrayStream  # noqa: E402

PIECE = 65536


def answer(series: int) -> str:
    """An instant answer of ``series`` GPU temperature series, 8 GPUs a host."""
    rows = []
    for n in range(series):
        h, g = divmod(n, 8)
        metric = {
            "__name__": "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DRIVER_VERSION": "580.105.08",
            "Hostname": f"node-{h:04d}.cluster.internal",
            "UUID": f"GPU-{h:08x}-{g:04x}-aaaa-bbbb-cccccccccccc",
            "device": f"nvidia{g}",
            "gpu": str(g),
            "instance": f"10.0.{h // 256}.{h % 256}:9400",
            "job": "dcgm",
            "modelName": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": f"00000000:{g + 16:02X}:00.0",
        }
        rows.append({"metric": metric, "value": [1767225600.123, str(30 + g)]})
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": rows}})


def decode(pieces: list[str], clean: LabelCleaner) -> int:
    """The answer read as the source reads it; the number of series kept."""
    stream = JsonArrayStream(
        ("data", "result"), SeriesReader(clean), MAX_SERIES, MAX_SERIES_CHARS, MAX_OTHER
    )
    for piece in pieces:
        stream.feed(piece)
    return len(stream.finish()["data"]["result"])


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--series", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    text = answer(args.series)
    pieces = [text[i : i + PIECE] for i in range(0, len(text), PIECE)]
    clean = LabelCleaner()
    kept = decode(pieces, clean)  # warms the label memos, as every round after the first
    times = []
    for _ in range(max(1, args.repeat)):
        started = time.process_time()
        decode(pieces, clean)
        times.append((time.process_time() - started) * 1000)
    print(f"{args.series} series, {len(text) / 1e6:.1f} MB, {kept} kept: {min(times):.1f} ms CPU")
    write_json(
        args.json_out,
        {"benchmark": "prom_decode", "series": args.series, "cpu_ms_min": min(times)},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
