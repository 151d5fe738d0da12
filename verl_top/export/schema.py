"""The ``snapshot.json`` schema (``verl-top.snapshot/1``) and a small validator for it.

``SNAPSHOT_SCHEMA`` is written in the JSON Schema vocabulary (a subset: ``type``, ``const``,
``enum``, ``properties``, ``required``, ``additionalProperties``, ``items``, ``minimum``), so
external tools can read it; ``validate`` checks exactly that subset without a dependency.
docs/snapshot.md describes every field. Version rule: adding a field keeps ``/1``; removing or
changing the meaning of a field bumps the version.
"""

from __future__ import annotations

from typing import Any

SNAPSHOT_VERSION = "verl-top.snapshot/1"

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": "string"}
_SERIES = {"type": "array", "items": _NUM}  # NaN (missing) is null


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None, extra: bool = True):
    """An object schema with ``required`` and ``optional`` properties."""
    props = dict(required)
    props.update(optional or {})
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": extra,
    }


_GPU_INFO = _obj(
    {"index": {"type": "integer"}},
    {"name": _STR, "uuid": _STR, "mem_total_mib": _NUM, "bus_id": _STR, "power_limit_w": _NUM},
)
_HELLO = _obj(
    {"backend": _STR, "driver": _STR, "gpus": {"type": "array", "items": _GPU_INFO}},
    {"agent_version": _STR, "nvml_version": _STR, "interval": _NUM, "error": _STR},
)
_HOST = _obj(
    {
        "name": _STR,
        "state": _STR,
        "reason": _STR,
        "hello": {"type": ["object", "null"], **{k: v for k, v in _HELLO.items() if k != "type"}},
        "latest": {"type": ["object", "null"]},
        "series": {"type": "object", "additionalProperties": _SERIES},
    },
    {"last_t": _NUM},
)
_GPU = _obj(
    {
        "host": _STR,
        "index": {"type": "integer"},
        "latest": {"type": ["object", "null"]},
        "means": {"type": "object", "additionalProperties": _NUM},
        "series": _obj(
            {"t": _SERIES, "label": {"type": "array", "items": _STR}},
            extra=True,
        ),
    },
    {"name": _STR, "throttle_reasons": {"type": "array", "items": _STR}},
)
_GPU["properties"]["series"]["additionalProperties"] = _SERIES
_PROCESS = _obj(
    {
        "host": _STR,
        "pid": {"type": "integer"},
        "gpu_index": {"type": "integer"},
        "cmd": _STR,
        "role": {"enum": ["trainer", "rollout", "driver", "agent_loop", "reward", "other"]},
        "method": _STR,
        "rank": _INT,
    },
    {
        "used_mib": _NUM,
        "user": _STR,
        "env_rank": _INT,
        "env_local_rank": _INT,
        "t": _NUM,
        "verl_role": _STR,
    },
)
_MAPPED = _obj(
    {
        "host": _STR,
        "verl_role": _STR,
        "method": _STR,
        "gpus": {"type": "array", "items": {"type": "integer"}},
        "source": {"enum": ["gpu", "job", "ray"]},
    },
    {
        "pid": _INT,
        "rank": _INT,
        "gpu_mem_mib": _NUM,
        "cpu_pct": _NUM,
        "rss_bytes": _INT,
        "state": _STR,
    },
)
_STEP = _obj(
    {
        "step": {"type": "integer"},
        "t": {"type": "number"},
        "metrics": {"type": "object", "additionalProperties": _NUM},
    },
    {"source": _STR},
)
_FINDING = _obj(
    {
        "step": {"type": "integer"},
        "rule": _STR,
        "severity": {"type": "number"},
        "title": _STR,
        "evidence": {"type": "array", "items": _STR},
        "advice": _STR,
    }
)
_CHECK = _obj(
    {
        "step": {"type": "integer"},
        "rule": _STR,
        "status": {"enum": ["passed", "no_data", "finding"]},
        "detail": _STR,
    }
)
_DIAGNOSIS = _obj(
    {
        "schema": {"const": "verl-top.diagnose/1"},
        "bottleneck": _obj({"step": _INT, "rule": {"type": ["string", "null"]}, "headline": _STR}),
        "steps": {
            "type": "array",
            "items": _obj(
                {
                    "step": {"type": "integer"},
                    "name": _STR,
                    "findings": {"type": "array", "items": _FINDING},
                    "checks": {"type": "array", "items": _CHECK},
                }
            ),
        },
        "findings": {"type": "array", "items": _FINDING},
    },
    {"history": {"type": "array"}, "time": _NUM},
)

_STACK = _obj(
    {"host": _STR, "pid": _INT, "threads": {"type": "array", "items": {"type": "object"}}},
    {"role": _STR, "title": _STR, "source": _STR, "error": _STR, "t": _NUM},
)

SNAPSHOT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SNAPSHOT_VERSION,
    "title": "verl-top snapshot",
    **_obj(
        {
            "schema": {"const": SNAPSHOT_VERSION},
            "tool": _obj({"name": {"const": "verl-top"}, "version": _STR}),
            "created": {"type": "number"},
            "created_iso": _STR,
            "data_time": {"type": "number"},
            "data_time_iso": _STR,
            "mode": {"enum": ["live", "replay"]},
            "window": _obj(
                {"seconds": {"type": "number", "minimum": 0}, "start": _NUM, "end": _NUM},
                {"points": {"type": "integer"}},
            ),
            "hosts": {"type": "array", "items": _HOST},
            "gpus": {"type": "array", "items": _GPU},
            "processes": {"type": "array", "items": _PROCESS},
            "steps": {"type": "array", "items": _STEP},
            "config": _obj({"source": _STR, "values": {"type": "object"}}),
            "probes": {"type": "array", "items": {"type": "object"}},
            "nccl": {"type": "array", "items": {"type": "object"}},
            "events": {"type": "array", "items": {"type": "object"}},
            "diagnosis": {"type": ["object", "null"]},
            "files": _obj(
                {
                    "report": _STR,
                    "recording": _STR,
                    "screen": {"type": ["string", "null"]},
                },
                {"stacks": {"type": ["string", "null"]}},
            ),
            "redaction": _obj({"placeholder": _STR, "rules": {"type": "array", "items": _STR}}),
        },
        {
            "notes": {"type": "array", "items": _STR},
            "process_map": {"type": "array", "items": _MAPPED},
            # Each node's topo record (docs/protocol.md) plus "marks": [{"gpu", "text"}].
            "topology": {"type": "array", "items": {"type": "object"}},
            # Python stacks collected in the session (verl_top.stacks.to_json), one per process.
            "stacks": {"type": "array", "items": _STACK},
        },
    ),
}
# The diagnosis, when present, follows its own schema (docs/diagnose-json.md); check its core.
DIAGNOSIS_SCHEMA = _DIAGNOSIS

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("number", "integer"):
        return False  # JSON booleans are not numbers
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
        return
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            errors.append(f"{path}: expected {' or '.join(names)}, got {type(value).__name__}")
            return
    if "minimum" in schema and isinstance(value, int | float) and value < schema["minimum"]:
        errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        _check_object(value, schema, path, errors)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", errors)


def _check_object(value: dict[str, Any], schema: dict[str, Any], path: str, errors: list[str]):
    props: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"{path}: missing {name!r}")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        sub = props.get(name)
        if sub is not None:
            _check(item, sub, f"{path}.{name}", errors)
        elif extra is False:
            errors.append(f"{path}: unexpected property {name!r}")
        elif isinstance(extra, dict):
            _check(item, extra, f"{path}.{name}", errors)


def validate(data: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Problems of ``data`` against ``schema`` (default: the snapshot schema); [] = valid.

    Each problem names the JSON path (``$.gpus[3].means.util_gpu``) and what was wrong. The
    diagnosis section is also checked against its core schema when present.
    """
    errors: list[str] = []
    _check(data, SNAPSHOT_SCHEMA if schema is None else schema, "$", errors)
    if schema is None and isinstance(data, dict) and isinstance(data.get("diagnosis"), dict):
        _check(data["diagnosis"], DIAGNOSIS_SCHEMA, "$.diagnosis", errors)
    return errors
