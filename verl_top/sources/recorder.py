"""``--record FILE``: write every record that reaches the store as NDJSON (gzip for .gz)."""

from __future__ import annotations

from pathlib import Path
from typing import IO

from verl_top.model import Record
from verl_top.protocol import encode, open_recording


class Recorder:
    """Appends records to a recording file, flushing at most once a second."""

    def __init__(self, path: str | Path, flush_every: float = 1.0) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = open_recording(self.path, "w")
        self._flush_every = flush_every
        self._last_flush = 0.0
        self.count = 0
        self.error = ""

    def write(self, record: Record) -> None:
        """Write one record; a write error disables recording instead of stopping monitoring."""
        if self._fh is None:
            return
        try:
            self._fh.write(encode(record) + "\n")
            self.count += 1
            if record.t - self._last_flush >= self._flush_every:
                self._fh.flush()
                self._last_flush = record.t
        except (OSError, ValueError) as exc:
            self.error = f"recording to {self.path} stopped: {exc}"
            self.close()

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
