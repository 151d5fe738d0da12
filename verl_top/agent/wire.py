"""The wire format the agent writes: record dicts in model field order, one compact JSON line each.

The field orders here are those of ``verl_top/model.py`` (what ``protocol.to_dict`` writes), so a
record the agent emits decodes and re-encodes to the same line. Standard library only.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing is not imported at run time: it costs the agent resident memory
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    Wire = dict[str, Any]  # one record as the dict that becomes its JSON line
    Fields = tuple[tuple[str, Any], ...]  # (name, value) pairs in model order

AGENT_VERSION = "0.1.0"
PROTOCOL_VERSION = 1
MIB = 1048576.0

# Field order of each record type, exactly as in verl_top/model.py (the wire order of to_dict).
GPU_FIELDS = (
    "index", "util_gpu", "util_mem", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w",
    "temp_c", "sm_mhz", "mem_mhz", "clock_reasons", "sm_util", "sm_occupancy", "tensor_util",
    "dram_util", "nvlink_tx_mibs", "nvlink_rx_mibs", "pcie_tx_mibs", "pcie_rx_mibs", "lost",
    "label",
)  # fmt: skip
PERCENT_FIELDS = frozenset(
    ("util_gpu", "util_mem", "sm_util", "sm_occupancy", "tensor_util", "dram_util")
)

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def record(rtype: str, host: str, t: float, fields: Iterable[tuple[str, Any]]) -> Wire:
    """A wire dict: v, type, host, t, then ``fields`` in order, None values left out."""
    out: Wire = {"v": PROTOCOL_VERSION, "type": rtype, "host": host, "t": t}
    for k, v in fields:
        if v is not None:
            out[k] = v
    return out


def finite(value: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items() if finite(v) is not None}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def encode_line(rec: Wire) -> str:
    """One compact JSON line for a wire dict."""
    try:
        return _dumps(rec)
    except ValueError:  # a NaN slipped in: drop it rather than emit invalid JSON
        return _dumps(finite(rec))


def to_str(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def r1(x: float | None) -> float | None:
    """``x`` rounded to one decimal (None stays None)."""
    return None if x is None else round(x, 1)


def r2(x: float | None) -> float | None:
    """``x`` rounded to two decimals (None stays None)."""
    return None if x is None else round(x, 2)


def int_or_none(value: Any) -> int | None:
    """``int(value)``, or None when it is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def in_order(d: dict[str, Any], spec: tuple[tuple[str, Any], ...]) -> Wire:
    """``d`` in model field order with defaults filled and None values left out."""
    out: Wire = {}
    for key, default in spec:
        value = d.get(key, default)
        if value is not None:
            out[key] = value
    return out
