"""Keep the collector's full passes off the objects a live session holds for its whole life.

A full (generation 2) collection walks every object the collector tracks. A client watching
1024 GPUs holds ~150 000 of them for hours (rings, host and GPU entries, the tables' rows and
caches, widgets) and a full pass over them took 60-120 ms on the dev machine, every ~8 s: the
frame it fell into (pane 1's p95 at 1024 GPUs) was 3x the others. Those objects do not become
garbage while the session runs, so walking them again finds nothing.

``LongLivedHeap`` moves them out of the collector's way (``gc.freeze``) once the session has
settled (the number of hosts and GPUs unchanged for a few ticks), after collecting the young
garbage, and again only when the session grew by a quarter since (new hosts), at most a few times.
What the collector no longer visits can only leak if it becomes cyclic garbage later; the
bound on freezes bounds that, and ``release`` (the app closing) gives everything back.

While the session runs, the youngest generation is also collected every ``young_threshold``
allocations instead of Python's 700 (``start``). A tick at 4096 GPUs allocates tens of thousands
of short-lived containers (rows, texts, segments, strips) that the next tick replaces: at 700,
each was walked by a young pass or two, the ones alive at that moment were promoted and walked
again by the older passes, and full passes came every few seconds (12-96 ms each). Most of them
are freed by their reference counts before a pass at 5000 sees them.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

SETTLE_TICKS = 3  # ticks (1 s each by default) with the same hosts and GPUs before a freeze
# Allocations between two passes over the youngest generation while a session runs (Python's
# default is 700). 20 000 made the middle generation's passes 31-45 ms at 1024-4096 GPUs.
YOUNG_THRESHOLD = 5000
GROWTH = 1.25  # the session must have grown this much since the last freeze
MAX_FREEZES = 8


@dataclass
class LongLivedHeap:
    """When to freeze the objects a live session has built up (see the module docstring)."""

    settle_ticks: int = SETTLE_TICKS
    growth: float = GROWTH
    max_freezes: int = MAX_FREEZES
    young_threshold: int = YOUNG_THRESHOLD
    freezes: int = 0
    _thresholds: tuple[int, ...] | None = None  # the collector's, before ``start``
    _size: int = -1  # hosts + GPUs at the last tick
    _stable: int = 0  # ticks since it last changed
    _frozen_at: int = 0  # hosts + GPUs at the last freeze

    def start(self) -> None:
        """The session starts: collect the youngest generation every ``young_threshold``
        allocations (never more often than the collector was set to)."""
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            young, *older = self._thresholds
            gc.set_threshold(max(young, self.young_threshold), *older)

    def due(self, size: int) -> bool:
        """Note this tick's ``size`` (hosts + GPUs); True when a freeze is due now."""
        if size != self._size:
            self._size, self._stable = size, 0
            return False
        self._stable += 1
        return (
            size > 0
            and self.freezes < self.max_freezes
            and self._stable >= self.settle_ticks
            and size >= self._frozen_at * self.growth
            and size > self._frozen_at
        )

    def freeze(self) -> None:
        """Collect the young garbage, then move every tracked object out of later passes.

        Not a full collection first: that is the ~0.1 s pause this avoids. What old garbage is
        frozen with the rest stays until ``release``, a bounded amount (``max_freezes``)."""
        gc.collect(1)
        gc.freeze()
        self.freezes += 1
        self._frozen_at = self._size

    def release(self) -> None:
        """Give the frozen objects back to the collector and its thresholds as they were
        (the session ends)."""
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        if self.freezes:
            gc.unfreeze()
            self.freezes = 0
            self._frozen_at = 0
