"""Compiled checks for records whose fields are all scalars (a GPU sample above all).

``protocol.validate`` judges a wire dict field by field through a table of specs: for a GPU
sample that is ~23 loop turns with a few function calls each, and at 4096 GPUs (4096 samples a
second) it was a third of the client's ingest cost (issue 30). For a record type whose fields
are all numbers, booleans and plain text, this module builds one straight-line function from
the same specs: per field one ``dict.get``, a type test and a range test, then the dataclass.

The compiled check only *accepts*: it returns the record when every field is exactly what the
slow path would keep unchanged (a finite number of the right type within its range, a bool, an
ASCII printable string within its length bound, a value of a closed set), and None for anything
else (NaN, inf, a bool where a number goes, a float where an int goes, a string that needs
cleaning or cutting, a missing required field, ...), which ``validate`` then judges field by
field as before. So the fast path can never keep what the slow path would refuse or clean: it
keeps a strict subset, unchanged (tests/test_flat_validator.py checks this on hostile values).

The function's source is made from the dataclass's own field names (checked to be identifiers)
and the bounds are passed as names of its namespace, never formatted into the source: nothing
foreign takes part in building it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FLAT_KINDS = ("float", "int", "bool", "str")


@dataclass(frozen=True)
class FlatField:
    """One scalar field as ``protocol.validate`` judges it."""

    name: str
    kind: str  # float | int | bool | str
    optional: bool  # None on the wire means "no data" (the default)
    lo: float
    hi: float
    enum: frozenset[str] | None  # the values a closed text field may take
    limit: int  # the longest text kept as it is


FlatCheck = Callable[[dict[str, Any]], Any]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return _REQUIRED if f.default_factory is dataclasses.MISSING else _NOT_FLAT


_REQUIRED = object()  # no default: a missing value is the slow path's to refuse
_NOT_FLAT = object()  # a default factory (a list, a dict): no scalar field


def _accepts(kind: str, k: int, optional: bool, enum: bool) -> str:
    """The condition (source text) under which the value ``x`` of field ``k`` is kept as is."""
    if kind == "float":  # a JSON int stays an int, as the slow path keeps it
        ok = f"(type(x) is float or type(x) is int) and lo{k} <= x <= hi{k}"
    elif kind == "int":
        ok = f"type(x) is int and lo{k} <= x <= hi{k}"
    elif kind == "bool":
        ok = "type(x) is bool"
    elif enum:
        ok = f"type(x) is str and x in enum{k}"
    else:  # printable ASCII needs no cleaning (C0 and DEL are not printable)
        ok = f"type(x) is str and len(x) <= limit{k} and x.isascii() and x.isprintable()"
    return f"x is None or ({ok})" if optional else ok


def _fills_directly(cls: type) -> bool:
    """True when the dataclass's __init__ only stores its arguments (not frozen, no slots,
    no ``__post_init__``), so filling the instance dict makes the same object."""
    params = getattr(cls, "__dataclass_params__", None)
    return (
        params is not None
        and params.init
        and not params.frozen
        and not hasattr(cls, "__post_init__")
        and not hasattr(cls, "__slots__")
    )


def compile_flat(cls: type, fields: Sequence[FlatField]) -> FlatCheck | None:
    """The compiled check of record type ``cls`` (its fields, in dataclass order, as judged by
    ``fields``), or None when a field is not a scalar: that type keeps the slow path."""
    params = {f.name: f for f in dataclasses.fields(cls)}
    if [f.name for f in fields] != list(params) or any(f.kind not in FLAT_KINDS for f in fields):
        return None
    namespace: dict[str, Any] = {"cls": cls}
    lines = ["def check(data):", "    get = data.get"]
    args = []
    for k, f in enumerate(fields):
        if not f.name.isidentifier():
            return None
        default = _default(params[f.name])
        if default is _NOT_FLAT or (f.optional and default is not None):
            return None  # a None would mean this default, not None: the slow path decides
        namespace.update({f"lo{k}": f.lo, f"hi{k}": f.hi, f"limit{k}": f.limit})
        if f.kind == "int":  # the slow path's bounded_int compares with int bounds
            namespace.update({f"lo{k}": int(f.lo), f"hi{k}": int(f.hi)})
        namespace[f"enum{k}"] = f.enum
        namespace[f"d{k}"] = default
        lines.append(f"    x = get({f.name!r}, d{k})")
        # A missing required field, or an optional one whose None is not its default, never
        # passes the tests below (REQUIRED is no str, number nor bool).
        lines.append(f"    if not ({_accepts(f.kind, k, f.optional, f.enum is not None)}):")
        lines.append("        return None")
        lines.append(f"    a{k} = x")
        args.append(f"{f.name}=a{k}")
    if _fills_directly(cls):
        # What the dataclass's __init__ would do, without a keyword call of ~23 arguments:
        # the instance dict filled in field order (~1 us less per GPU sample).
        namespace["new"] = object.__new__
        lines.append("    record = new(cls)")
        lines.append("    fields = record.__dict__")
        lines.extend(f"    fields[{f.name!r}] = a{k}" for k, f in enumerate(fields))
        lines.append("    return record")
    else:
        lines.append(f"    return cls({', '.join(args)})")
    exec("\n".join(lines), namespace)  # noqa: S102 - source made of our own field names only
    check: FlatCheck = namespace["check"]
    return check
