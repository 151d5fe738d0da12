"""The cyclic garbage collector paused while short-lived, acyclic data is built in bulk.

Reference counting frees that data when it is dropped; what the collector adds while it is
being built is full passes (every tracked object, the store's included) triggered by the
allocations themselves, again and again, and finding nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the duration (the reference counts still free
    what is dropped). Restores the collector's previous state, so nested uses are harmless;
    overlapping ones (a worker thread, a coroutine across awaits) always end with it enabled
    if it was enabled before the first."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
