"""NDJSON wire format: one JSON object per line, ``{"v": 1, "type": ..., ...fields}``.

The same lines travel from the node agent over SSH, are written to recordings, and are read
back by replay. Decoding is forgiving: unknown fields are dropped, missing fields take their
defaults, and a line that is not a valid record is counted and skipped, never raised.
See docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from verl_top.model import NESTED, RECORD_TYPES, Record

VERSION = 1

_FIELDS: dict[type, tuple[str, ...]] = {}
_FIELD_SETS: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        _FIELDS[cls] = names
        _FIELD_SETS[cls] = frozenset(names)
    return names


def _plain(value: Any) -> Any:
    """Turn nested dataclasses into dicts, dropping None fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            k: _plain(v) for k in _field_names(type(value)) if (v := getattr(value, k)) is not None
        }
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def to_dict(record: Record) -> dict[str, Any]:
    """The wire dict of a record (``v`` and ``type`` first, None fields left out)."""
    out: dict[str, Any] = {"v": VERSION, "type": record.TYPE}
    for name in _field_names(type(record)):
        value = getattr(record, name)
        if value is not None:
            out[name] = _plain(value)
    return out


def encode(record: Record) -> str:
    """One NDJSON line (without the trailing newline)."""
    return json.dumps(to_dict(record), separators=(",", ":"), allow_nan=False, default=str)


def _build(cls: type, data: dict[str, Any]) -> Any:
    _field_names(cls)
    known = _FIELD_SETS[cls]
    return cls(**{k: v for k, v in data.items() if k in known})


def from_dict(data: dict[str, Any]) -> Record:
    """Build a record from a wire dict. Raises ValueError/TypeError when it is not one."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    rtype = data.get("type")
    cls = RECORD_TYPES.get(rtype) if isinstance(rtype, str) else None
    if cls is None:
        raise ValueError(f"unknown record type {rtype!r}")
    version = data.get("v", VERSION)
    if not isinstance(version, int) or version > VERSION:
        raise ValueError(f"unsupported protocol version {version!r}")
    fields = dict(data)
    for (tname, fname), sub in NESTED.items():
        if tname == rtype and fname in fields:
            items = fields[fname]
            if not isinstance(items, list):
                raise ValueError(f"{fname} must be a list")
            fields[fname] = [_build(sub, item) for item in items if isinstance(item, dict)]
    record = _build(cls, fields)
    if not isinstance(record.host, str) or not isinstance(record.t, int | float):
        raise ValueError("host must be a string and t a number")
    return record


@dataclass
class Decoder:
    """Decodes lines, counting those it had to skip (and remembering the last reason)."""

    decoded: int = 0
    malformed: int = 0
    last_error: str = ""
    errors_by_kind: dict[str, int] = field(default_factory=dict)

    def decode(self, line: str | bytes) -> Record | None:
        """The record on ``line``, or None for a blank or malformed line."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.strip()
        if not line:
            return None
        try:
            record = from_dict(json.loads(line))
        except (ValueError, TypeError, RecursionError) as exc:
            self.malformed += 1
            kind = type(exc).__name__
            self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1
            self.last_error = f"{kind}: {exc}"[:200]
            return None
        self.decoded += 1
        return record

    def decode_all(self, lines: Iterable[str | bytes]) -> Iterator[Record]:
        """Decode many lines, skipping the malformed ones."""
        for line in lines:
            record = self.decode(line)
            if record is not None:
                yield record


def open_recording(path: str | Path, mode: str = "r") -> IO[str]:
    """Open a recording for text reading/writing; ``.gz`` paths are gzip-compressed."""
    p = Path(path)
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(p, mode.replace("t", "") + "b"), encoding="utf-8")
    return open(p, mode, encoding="utf-8")


def read_recording(path: str | Path, decoder: Decoder | None = None) -> list[Record]:
    """All valid records of a recording file (gzip or plain)."""
    decoder = decoder or Decoder()
    with open_recording(path) as fh:
        return list(decoder.decode_all(fh))
