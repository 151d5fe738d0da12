"""What each of verl's timing and perf keys covers, by verl version and trainer mode.

The facts live in ``verl_top/data/verl_keys.yaml`` (read from verl's source at every tag v0.4 to
v0.9, with ``tag path:line`` provenance per entry). This module loads that file once, checks it,
and answers three questions: where a timer goes in a step (``Catalogue.timer``: its canonical
stage, or rollout detail, or outside the step), which timers contain others (never add both),
and what a key means for a person (``Catalogue.explain``).

The same key can mean different things in different trainer modes: ``timing_s/gen`` is the
rollout in the legacy and V1 sync trainers but the trainer's *wait* for finished samples in every
async mode; ``timing_s/update_weights`` is a stage of its own except in one-step-off, where
``timing_s/sync_rollout_weights`` contains it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

MODES: tuple[str, ...] = (
    "legacy",
    "sync",
    "colocate_async",
    "separate_async",
    "one_step_off",
    "fully_async",
)
ASYNC_MODES: frozenset[str] = frozenset(
    {"colocate_async", "separate_async", "one_step_off", "fully_async"}
)
KINDS: frozenset[str] = frozenset({"timer", "contained", "detail", "outside", "metric"})
ROLES: frozenset[str] = frozenset(
    {
        "rollout",
        "wait",
        "reward",
        "logprob",
        "driver",
        "train",
        "sync",
        "io",
        "periodic",
        "overhead",
        "step",
        "detail",
        "perf",
        "balance",
    }
)
MODE_NAMES: dict[str, str] = {
    "legacy": "legacy trainer",
    "sync": "V1 sync",
    "colocate_async": "V1 colocate_async",
    "separate_async": "V1 separate_async",
    "one_step_off": "one-step-off",
    "fully_async": "fully async",
}
TIMING_PREFIX = "timing_s/"
OLD_TIMING_PREFIX = "timing/"
DATA_FILE = "verl_keys.yaml"


@dataclass(frozen=True)
class KeyUse:
    """How one trainer mode uses a key: where it goes in the step and what it covers."""

    kind: str
    stage: str | None
    role: str
    inside: str | None
    covers: str


@dataclass(frozen=True)
class KeyInfo:
    """One catalogue entry: a key's defaults, its per-mode uses, versions and provenance."""

    key: str
    kind: str
    stage: str | None
    role: str
    inside: str | None
    contains: tuple[str, ...]
    reads: str | None
    since: str
    until: str | None
    covers: str
    modes: Mapping[str, KeyUse]
    source: tuple[str, ...]

    def use(self, mode: str | None = None) -> KeyUse:
        """The key as ``mode`` uses it; the entry's defaults when the mode is unknown or does
        not print the key."""
        hit = self.modes.get(mode or "")
        if hit is not None:
            return hit
        return KeyUse(self.kind, self.stage, self.role, self.inside, self.covers)

    @property
    def versions(self) -> str:
        """``v0.5.0-v0.7.0``, ``v0.8.0 and later``, ``v0.7.0 only``."""
        if self.until is None:
            return f"{self.since} and later"
        if self.until == self.since:
            return f"{self.since} only"
        return f"{self.since}-{self.until}"


@dataclass(frozen=True)
class Catalogue:
    """Every key of the data file, by key."""

    keys: Mapping[str, KeyInfo]

    def lookup(self, key: str) -> KeyInfo | None:
        """The entry of a metric key; the oldest ``timing/<name>`` form reads as ``timing_s/``."""
        hit = self.keys.get(key)
        if hit is None and key.startswith(OLD_TIMING_PREFIX):
            hit = self.keys.get(TIMING_PREFIX + key[len(OLD_TIMING_PREFIX) :])
        return hit

    def timer(self, name: str, mode: str | None = None) -> KeyUse | None:
        """A timer by the name verl gave it (``gen``, ``timing_s/param_sync``) as ``mode`` uses
        it; None for a timer the catalogue does not know."""
        info = self.keys.get(TIMING_PREFIX + name)
        return info.use(mode) if info is not None else None

    def contained(self, names: set[str] | frozenset[str]) -> frozenset[str]:
        """Timer names (without prefix) inside another timer that is also present: their time
        is part of the container's, so they are never added to it."""
        out: set[str] = set()
        for name in names:
            info = self.keys.get(TIMING_PREFIX + name)
            if info is None:
                continue
            for inner in info.contains:
                if inner.startswith(TIMING_PREFIX) and inner[len(TIMING_PREFIX) :] in names:
                    out.add(inner[len(TIMING_PREFIX) :])
        return frozenset(out)

    def explain(self, key: str, mode: str | None = None) -> list[str]:
        """What ``key`` covers, for a person: the meaning in ``mode`` first, then the verl
        versions that print it, what it contains or sits in, and where verl writes it. Without
        a mode, every mode's meaning where it differs. An unknown key says so."""
        info = self.lookup(key)
        if info is None:
            return [
                f"{key}: not in verl-top's catalogue (verl v0.4-v0.9): a fork's or a newer "
                "verl's own key; verl-top counts a timing_s/ key as a stage of its own"
            ]
        use = info.use(mode)
        lines = [f"{key}: {use.covers}"]
        if mode and mode not in info.modes:
            printed = ", ".join(MODE_NAMES[m] for m in info.modes) or "no trainer mode"
            lines.append(f"not printed by the {MODE_NAMES.get(mode, mode)}; printed by: {printed}")
        lines.append(f"verl versions: {info.versions}")
        if use.inside:
            lines.append(f"inside {use.inside}: part of its time, never add both")
        if info.contains:
            lines.append(f"contains {', '.join(info.contains)}: never add both")
        if use.kind == "outside":
            lines.append("outside timing_s/step: not part of the step's time")
        if mode is None:
            lines += [
                f"{MODE_NAMES[m]}: {u.covers}"
                for m, u in info.modes.items()
                if u.covers != use.covers
            ]
        elif any(u.covers != use.covers for u in info.modes.values()):
            lines.append("other trainer modes read it differently (docs/verl.md, key catalogue)")
        lines.append("written at: " + "; ".join(info.source))
        return lines


def _use(raw: Mapping[str, Any], base: Mapping[str, Any]) -> KeyUse:
    return KeyUse(
        kind=str(raw.get("kind", base["kind"])),
        stage=raw.get("stage", base.get("stage")),
        role=str(raw.get("role", base["role"])),
        inside=raw.get("inside", base.get("inside")),
        covers=" ".join(str(raw.get("covers", base["covers"])).split()),
    )


def _entry(key: str, raw: Mapping[str, Any]) -> KeyInfo:
    """One checked entry; ValueError names the key and what is wrong with it."""
    for field in ("kind", "role", "since", "covers", "modes", "source"):
        if field not in raw:
            raise ValueError(f"verl key catalogue: {key}: missing {field!r}")
    modes_raw = raw["modes"] or {}
    unknown = set(modes_raw) - set(MODES)
    if unknown:
        raise ValueError(f"verl key catalogue: {key}: unknown modes {sorted(unknown)}")
    uses = {m: _use(v or {}, raw) for m, v in modes_raw.items()}
    for m, u in [("", _use({}, raw)), *uses.items()]:
        if u.kind not in KINDS or u.role not in ROLES:
            raise ValueError(f"verl key catalogue: {key} {m}: kind {u.kind!r} / role {u.role!r}")
        if u.kind in ("timer", "contained") and not u.stage:
            raise ValueError(f"verl key catalogue: {key} {m}: a timer needs a stage")
    sources = tuple(str(s) for s in raw["source"])
    if not sources or any(len(s.split(" ")) != 2 or ":" not in s for s in sources):
        raise ValueError(f"verl key catalogue: {key}: source must be 'tag path:line' entries")
    return KeyInfo(
        key=key,
        kind=str(raw["kind"]),
        stage=raw.get("stage"),
        role=str(raw["role"]),
        inside=raw.get("inside"),
        contains=tuple(raw.get("contains") or ()),
        reads=raw.get("reads"),
        since=str(raw["since"]),
        until=raw.get("until"),
        covers=" ".join(str(raw["covers"]).split()),
        modes=MappingProxyType(uses),
        source=sources,
    )


def parse_catalogue(text: str) -> Catalogue:
    """Build a catalogue from the data file's text (checked; ValueError on a bad entry)."""
    # libyaml's loader when present: ~5x faster than the pure-Python one (startup cost).
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
        raise ValueError("verl key catalogue: no 'keys' mapping")
    keys = {str(k): _entry(str(k), v or {}) for k, v in doc["keys"].items()}
    return Catalogue(MappingProxyType(keys))


@functools.cache
def catalogue() -> Catalogue:
    """The bundled catalogue, read once (it never changes while verl-top runs)."""
    text = (resources.files("verl_top") / "data" / DATA_FILE).read_text(encoding="utf-8")
    return parse_catalogue(text)
