"""Time how a function's cost grows with its input: the linear-time checks of the boundary.

A wall-clock threshold says little on a shared 2-core machine; the *ratio* between the cost of a
100x input and a 1x input does. Linear work gives ~100 (less when fixed costs dominate the small
input), quadratic work ~10 000. Each cost is the best of several runs of enough calls to last
a few milliseconds, so scheduler noise cannot make a linear function look quadratic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# A 100x input may cost at most this many times the 1x input (linear: ~100; quadratic: ~10 000),
# and the step from 10x to 100x at most this much (linear: ~10; quadratic: ~100).
MAX_RATIO_100X = 1000.0
MAX_RATIO_10X = 50.0
ATTEMPTS = 3  # a busy machine can spoil one measurement; quadratic work fails every one


def cost(fn: Callable[[Any], Any], arg: Any, repeat: int = 5, min_s: float = 0.003) -> float:
    """Seconds per call of ``fn(arg)``: the best of ``repeat`` batches of at least ``min_s``."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn(arg)
        took = time.perf_counter() - t0
        if took >= min_s or number >= 1 << 16:
            break
        number *= 2
    best = took / number
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(arg)
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def growth(fn: Callable[[Any], Any], make: Callable[[int], Any], n: int) -> tuple[float, float]:
    """(cost(100n) / cost(n), cost(100n) / cost(10n)) for inputs ``make(n)``."""
    small, mid, large = (cost(fn, make(n * k)) for k in (1, 10, 100))
    return large / small, large / mid


def assert_linear(fn: Callable[[Any], Any], make: Callable[[int], Any], n: int, what: str) -> None:
    """Fail when ``fn`` grows faster than linearly over ``make(n)``, ``make(10n)``, ``make(100n)``."""
    for _ in range(ATTEMPTS):
        r100, r10 = growth(fn, make, n)
        if r100 < MAX_RATIO_100X and r10 < MAX_RATIO_10X:
            return
    raise AssertionError(
        f"{what}: 100x input costs {r100:.0f}x the 1x input and {r10:.0f}x the 10x input "
        f"(linear: ~100 and ~10; bounds {MAX_RATIO_100X:g} and {MAX_RATIO_10X:g}; "
        f"{ATTEMPTS} attempts)"
    )
