"""Numbers for people: every text the diagnosis writes (titles, evidence, advice, worth, the
headline) and the panes and report.md format seconds, shares, MFU and plain numbers here.

The rules of issue 27: seconds as s / min / h with the precision a person needs, ratios and
MFU as percentages, never scientific notation ("2.39e+03 s", "MFU 8.1e-03"), and two seconds
that are compared ("9.9 min of each 17.8 min step") in the same unit.
"""

from __future__ import annotations

import math
import re

MINUTE = 60.0
HOUR = 3600.0
# A duration up to this many seconds reads best in seconds ("74 s", "593 s"); beyond it in
# minutes, and beyond two hours in hours.
SECONDS_UP_TO = 600.0
MINUTES_UP_TO = 2 * HOUR
UNKNOWN = "unknown"
# A number in scientific notation as Python prints it ("2.39e+03", "8.1e-03", "1e-06"), for
# tests that hold every surface's text free of it.
SCIENTIFIC = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][+-]?\d+(?![\w.])")


def _finite(x: float | None) -> bool:
    return x is not None and not isinstance(x, bool) and math.isfinite(x)


def unit_for(x: float) -> str:
    """The unit a duration of ``x`` seconds reads best in: ``s``, ``min`` or ``h``."""
    x = abs(x)
    if x <= SECONDS_UP_TO:
        return "s"
    return "min" if x <= MINUTES_UP_TO else "h"


def seconds(x: float | None, unit: str | None = None) -> str:
    """A duration: ``42 ms``, ``0.42 s``, ``4.61 s``, ``74 s``, ``17.8 min``, ``2.03 h``.

    ``unit`` forces ``s``/``min``/``h`` (to compare two durations in one unit)."""
    if not _finite(x):
        return UNKNOWN
    assert x is not None
    forced = unit is not None
    unit = unit or unit_for(x)
    if unit == "min":
        return f"{number(x / MINUTE, 3)} min"
    if unit == "h":
        return f"{number(x / HOUR, 3)} h"
    if x != 0 and abs(x) < 0.1 and not forced:
        return f"{x * 1000:.0f} ms"
    return f"{number(x, 3)} s"


def seconds_pair(part: float | None, whole: float | None) -> tuple[str, str]:
    """``part`` and ``whole`` in the unit of the larger, for "X of each Y step"."""
    if not _finite(whole):
        return seconds(part), seconds(whole)
    assert whole is not None
    unit = unit_for(max(abs(whole), abs(part or 0.0)))
    return seconds(part, unit), seconds(whole, unit)


def pct(frac: float | None) -> str:
    """A fraction as a percentage: ``57 %``, ``4 %``, ``0.4 %``, ``< 0.1 %``."""
    if not _finite(frac):
        return UNKNOWN
    assert frac is not None
    v = 100 * frac
    if v == 0:
        return "0 %"
    if abs(v) < 0.1:
        return "< 0.1 %" if v > 0 else "> -0.1 %"
    if abs(v) < 1:
        return f"{v:.1f} %"
    return f"{v:.0f} %"


def mfu(value: float | None) -> str:
    """An MFU as a percentage: ``31 %``, ``8.1 %``, ``0.015 %``, ``0.00015 %`` (never ``1.5e-04``, never
    ``0.00``); ``not estimated`` when verl logged 0, nothing, or an impossible value > 1."""
    if not _finite(value) or value is None or value <= 0 or value > 1:
        return "not estimated"
    v = 100 * value
    if v >= 10:
        return f"{v:.0f} %"
    if v >= 1:
        return f"{number(v, 2)} %"
    if v < 0.0001:
        return "< 0.0001 %"
    return f"{number(v, 2)} %"


def number(x: float | None, sig: int = 3) -> str:
    """A plain number with about ``sig`` significant digits and no exponent: ``16384``,
    ``1000000``, ``4.5``, ``0.00012``."""
    if not _finite(x):
        return UNKNOWN
    assert x is not None
    if x == int(x) and abs(x) >= 1:
        return f"{x:.0f}"
    mag = math.floor(math.log10(abs(x))) if x else 0
    decimals = max(0, sig - 1 - mag)
    text = f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def times(x: float | None) -> str:
    """A ratio as a multiple: ``2.7x``, ``12x``."""
    if not _finite(x):
        return UNKNOWN
    assert x is not None
    return f"{x:.1f}x" if abs(x) < 10 else f"{x:.0f}x"
