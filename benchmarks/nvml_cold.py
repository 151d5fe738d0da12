"""Why an NVML read costs more at 1 Hz than in a loop: a cold CPU, or the driver refetching?

    python benchmarks/nvml_cold.py --reps 10 --alternatives --json-out nvml_cold.json   # a GPU

The agent's per-tick GPU read (utilisation, memory, power field, SM clock, clock-event reasons:
``NvmlBackend.sample`` with GPM and the slow values switched off, memory on every tick) is timed
(CPU by ``time.process_time``, wall by ``perf_counter``) right after a previous read, then after
a gap of 1 ms .. 1 s spent two ways:

- **sleep**: the process sleeps (the CPU idles, its caches go cold, as in the agent at 1 Hz);
- **spin**: the process busy-waits in Python (the CPU stays awake, its caches warm).

If the read is dear after a long sleep but cheap after an equally long spin, the cost is the CPU
waking up; if it is dear after both, the driver's answers expire with time and a read after a
while makes the driver fetch them again, whatever the caller does.

Then: each call alone after a 1 s sleep (first in the tick by turns, later in the tick, and again
right after); a tick's GPU part with the one GPU read once and K times (``agent_cost.fan_out``);
from these, what a further distinct GPU adds to a 1 Hz tick; and with ``--alternatives`` the
memory call's v1 form and the host sampler's /proc reads, timed the same way.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import ensure_repo_on_path, table, write_json
from agent_cost import fan_out

ensure_repo_on_path()

from verl_top.agent import backends, host, nvml, strides, wire  # noqa: E402

GAPS_S = (0.0, 0.001, 0.01, 0.1, 1.0)


def backend(fan: int = 1) -> nvml.NvmlBackend:
    """The agent's NVML backend through ctypes, everything but GPM and the slow values read on
    every tick (the 5 calls); ``fan`` > 1 reads the one GPU that many times a tick."""
    be = nvml.NvmlBackend(nvml.CtypesNvml(), gpm_every=10**9, slow_every=10**9, mem_every=1)
    fan_out(be, fan)
    be.sample(time.time())  # the first tick reads the slow values and GPM once
    return be


def spin(seconds: float) -> None:
    """Busy-wait: the CPU stays awake."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(CPU us, wall us) of one call."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return (time.process_time() - c0) * 1e6, (time.perf_counter() - w0) * 1e6


def mean(xs: list[float]) -> float | None:
    """Arithmetic mean, None for no values."""
    return sum(xs) / len(xs) if xs else None


def gap_table(be: nvml.NvmlBackend, reps: int) -> list[dict[str, Any]]:
    """The GPU read after each gap, slept or spun."""
    out = []

    def read() -> None:
        be.sample(time.time())

    for how in ("sleep", "spin"):
        for gap in GAPS_S:
            if how == "spin" and gap >= 1.0:
                gap = 0.3  # a 1 s spin per rep only burns time: 0.3 s shows the trend
            cpu, wall = [], []
            for _ in range(reps):
                read()
                (time.sleep if how == "sleep" else spin)(gap)
                c, w = timed(read)
                cpu.append(c)
                wall.append(w)
            out.append(
                {
                    "gap": f"{how} {gap * 1000:g} ms",
                    "cpu_us_mean": mean(cpu),
                    "cpu_us_min": min(cpu),
                    "wall_us_mean": mean(wall),
                }
            )
    return out


def direct_calls(be: nvml.NvmlBackend) -> dict[str, Callable[[], Any]]:
    """The agent's five per-tick C calls for GPU 0, with its own buffers."""
    d = be._direct
    h = be.handles[0]
    _util, _mem, _sm, _memclk, _temp, _reasons, _power, fv, p = d.bufs[0]
    return {
        "utilization": lambda: d.util_fn(h, p[0]),
        "memory v2": lambda: d.mem_fn(h, p[1]),
        "field values [power avg]": lambda: d.fields_fn(h, d.n1, fv),
        "SM clock": lambda: d.clock_fn(h, 1, p[2]),
        "clock-event reasons": lambda: d.reasons_fn(h, p[5]),
    }


def call_table(be: nvml.NvmlBackend, reps: int) -> list[dict[str, Any]]:
    """Each call after a 1 s sleep: first in the tick (by turns), later in it, right after."""
    if be._direct is None:
        return []
    calls = direct_calls(be)
    names = list(calls)
    first: dict[str, list[float]] = {n: [] for n in names}
    later: dict[str, list[float]] = {n: [] for n in names}
    again: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps * len(names)):
        time.sleep(1.0)
        order = names[r % len(names) :] + names[: r % len(names)]
        for k, n in enumerate(order):
            (first if k == 0 else later)[n].append(timed(calls[n])[0])
        for n in order:
            again[n].append(timed(calls[n])[0])
    return [
        {
            "call": n,
            "first_after_sleep_us": mean(first[n]),
            "later_in_tick_us": mean(later[n]),
            "again_right_after_us": mean(again[n]),
        }
        for n in names
    ]


def fan_table(reps: int, k: int) -> list[dict[str, Any]]:
    """A tick's GPU part (``sample`` and encoding the gpu records, as the agent does) after a
    1 s sleep, with the one GPU read once and ``k`` times."""
    out: list[dict[str, Any]] = []
    for times in (1, k):
        be = backend(times)
        cpu = []
        try:
            for _ in range(reps):
                time.sleep(1.0)
                c0 = time.process_time()
                now = time.time()
                for fields in be.sample(now):
                    wire.encode_line(wire.record("gpu", "bench", now, fields))
                cpu.append((time.process_time() - c0) * 1e6)
        finally:
            be.close()
        out.append({"reads_per_tick": times, "cpu_us_mean": mean(cpu)})
    if k > 1:
        added = (out[1]["cpu_us_mean"] - out[0]["cpu_us_mean"]) / (k - 1)
        out.append({"reads_per_tick": f"each added read ({k} vs 1)", "cpu_us_mean": added})
    return out


def further_gpu_us(calls: list[dict[str, Any]], fans: list[dict[str, Any]]) -> dict[str, Any]:
    """What one more distinct GPU adds to a 1 Hz tick, from the measured parts: each call's cost
    once the tick is awake ("later in tick": the driver still fetches that GPU's values), memory
    weighted by its stride, plus the agent's Python per GPU (an added read of the same GPU,
    whose NVML answers come hot, minus those hot NVML costs; building and encoding the record
    included)."""
    if not calls or len(fans) < 3:
        return {}
    later = {c["call"]: c["later_in_tick_us"] for c in calls}
    hot = sum(c["again_right_after_us"] for c in calls)
    python = max(0.0, fans[2]["cpu_us_mean"] - hot)
    mem = later.pop("memory v2")
    nvml_us = sum(later.values()) + mem / strides.MEM_EVERY
    return {"nvml_us": nvml_us, "python_us": python, "total_us": nvml_us + python}


def alt_table(be: nvml.NvmlBackend, reps: int) -> list[dict[str, Any]]:
    """Candidates for the dear parts of a 1 Hz tick, each timed after a 1 s sleep and one
    utilisation read (which pays the wake-up, as the agent's first call does): memory through
    the v1 and v2 calls, and the host sampler's /proc reads (the read, then with the parse)."""
    if be._direct is None:
        return []
    calls = direct_calls(be)
    h = be.handles[0]
    mem1 = be.nv.MemoryV1()
    v1_fn = be.nv._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo")
    p1 = ctypes.pointer(mem1)
    sampler = host.HostSampler("proc")
    tests = {
        "memory v2 (what the agent reads)": calls["memory v2"],
        "memory v1": lambda: v1_fn(h, p1),
        "/proc/stat read": sampler._stat.read,
        "/proc/stat read + parse (HostSampler._cpu)": sampler._cpu,
        "/proc/meminfo read + parse": sampler._mem,
        "/proc/net/dev read + parse": sampler._net,
    }
    out: list[dict[str, Any]] = []
    try:
        for name, fn in tests.items():
            cpu = []
            for _ in range(reps):
                time.sleep(1.0)
                calls["utilization"]()
                cpu.append(timed(fn)[0])
            out.append({"what": name, "cpu_us_mean": mean(cpu), "cpu_us_min": min(cpu)})
    finally:
        sampler.close()
    with open("/proc/stat", "rb") as fh:
        out.append({"what": f"(/proc/stat is {len(fh.read())} bytes here)"})
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--reps", type=int, default=10, help="reads per gap (and per call)")
    p.add_argument("--fan", type=int, default=8, help="reads per tick in the fan-out table")
    p.add_argument("--alternatives", action="store_true", help="also memory v1, /proc reads")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    try:
        be = backend()
    except backends.BackendUnavailable as exc:
        print(f"no NVML here: {exc}")
        return 2
    try:
        gaps = gap_table(be, args.reps)
        calls = call_table(be, max(1, args.reps // 5))
        alts = alt_table(be, args.reps) if args.alternatives else []
    finally:
        be.close()
    fans = fan_table(args.reps, args.fan)
    est = further_gpu_us(calls, fans)
    print("The agent's GPU read (5 NVML calls), CPU and wall us, after a gap:")
    rows = [[g["gap"], g["cpu_us_mean"], g["cpu_us_min"], g["wall_us_mean"]] for g in gaps]
    print(table(["after", "CPU us mean", "CPU us min", "wall us mean"], rows, digits=1))
    print("\nEach call alone, CPU us: first after a 1 s sleep / later in that tick / right after:")
    rows = [
        [c["call"], c["first_after_sleep_us"], c["later_in_tick_us"], c["again_right_after_us"]]
        for c in calls
    ]
    print(table(["call", "first after sleep", "later in tick", "again right after"], rows, 1))
    print(f"\nA tick's GPU part with the one GPU read 1 and {args.fan} times, CPU us:")
    rows = [[f["reads_per_tick"], f["cpu_us_mean"]] for f in fans]
    print(table(["reads per tick", "CPU us mean"], rows, digits=1))
    if est:
        print(
            f"\nA further distinct GPU at 1 Hz (from the parts above): NVML {est['nvml_us']:.1f} us"
            f" (memory every {strides.MEM_EVERY} ticks) + the agent's Python {est['python_us']:.1f} us"
            f" = {est['total_us']:.1f} us"
        )
    if alts:
        print("\nAfter a 1 s sleep and one utilisation read (the wake-up paid), CPU us:")
        rows = [[a["what"], a.get("cpu_us_mean"), a.get("cpu_us_min")] for a in alts]
        print(table(["read", "CPU us mean", "min"], rows, digits=1))
    payload = {"benchmark": "nvml_cold", "gaps": gaps, "calls": calls, "fan": fans, "alt": alts}
    payload["further_gpu"] = est
    write_json(args.json_out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
