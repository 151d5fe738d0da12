"""A PyTorch workload with distinct GPU phases, to check verl-top's readings on a real GPU.

    python3 benchmarks/gpu_phases.py --out phases.json [--scale 1.0]

Phases (seconds at scale 1): idle 15, bf16 GEMMs 20 (compute-bound), decode-like batched
matrix-vector products 20 (memory-bound: NVML util near 100 % while tensor pipes idle), a
host-stalled loop 20 (the GPU waits on the Python side about two thirds of the time), idle 10.
Writes the wall-clock start/end of each phase to --out for benchmarks/phase_readings.py.
"""

from __future__ import annotations

import argparse
import json
import time


def _run_for(seconds: float, body) -> int:
    import torch

    end = time.time() + seconds
    n = 0
    while time.time() < end:
        body()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return n


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every phase's length")
    args = p.parse_args()
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    # decode-like: a 1 GiB weight read once per product with a batch of 8 "tokens"
    w = torch.randn(32768, 16384, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16384, 8, device=dev, dtype=torch.bfloat16)
    small = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def gemm() -> None:
        torch.matmul(a, b)

    def decode() -> None:
        torch.matmul(w, x)

    def stalled() -> None:
        for _ in range(20):
            torch.matmul(small, small)
        torch.cuda.synchronize()
        busy_until = time.perf_counter() + 0.030  # the host "prepares the next batch"
        while time.perf_counter() < busy_until:
            pass

    plan = [
        ("idle", 15, None),
        ("train_matmul_bf16", 20, gemm),
        ("gen_decode_memory_bound", 20, decode),
        ("host_stall", 20, stalled),
        ("idle_after", 10, None),
    ]
    phases = []
    for name, secs, body in plan:
        start = time.time()
        iters = 0
        if body is None:
            time.sleep(secs * args.scale)
        else:
            iters = _run_for(secs * args.scale, body)
        phases.append({"phase": name, "start": start, "end": time.time(), "iterations": iters})
        print(f"{name}: {phases[-1]['end'] - start:.1f} s, {iters} iterations", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(0), "phases": phases}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
