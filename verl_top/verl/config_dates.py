"""Which verl releases a printed config comes from, told by its keys alone.

verl prints its resolved config at start, long before the first step line, and a run that
crashes or is cut off early leaves only that config. Its keys date it: verl adds and removes
config keys in most releases, and ``verl_top/data/verl_config_keys.json`` (built by
``verl_top.verl.config_dates_build`` from verl's own history, with the commit and ``tag
path:line`` of every key) says which release lines print each one.

A fork or a user's ``+key=value`` override can carry a key out of its era (a key backported
early, a key verl later adopted), so the range is not where *every* dated key agrees but where
all but a few do: the release lines whose fit is within ``FORK_TOLERANCE`` of the best one.
Those few are named in the evidence, so "a fork?" is said, not hidden.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

DATA_FILE = "verl_config_keys.json"
# Fewer dated keys than this is no basis for a version (an SFT config, a fragment).
MIN_DATED_KEYS = 5
# Dated keys allowed out of their era before a release line no longer fits (2 % of the dated
# keys, at least 1): forks and +overrides carry a handful (the real corpus: 1 of 26, 6 of 338).
FORK_TOLERANCE = 0.02
MAX_NAMED = 3  # keys named in the evidence for each side

Release = tuple[int, int]


@dataclass(frozen=True)
class KeyDates:
    """The release lines that print one config key (``until`` None: still printed)."""

    since: Release
    until: Release | None

    def fits(self, release: Release) -> bool:
        return self.since <= release and (self.until is None or release <= self.until)


@dataclass(frozen=True)
class ConfigDates:
    """The data file: every dating key, and the release lines it knows (oldest first)."""

    keys: Mapping[str, KeyDates]
    releases: tuple[Release, ...]


@dataclass(frozen=True)
class ConfigVersion:
    """A printed config's release range and what it rests on."""

    low: Release
    high: Release | None  # None: up to the newest release the data knows
    best: Release  # the release line most dated keys fit
    dated: int  # keys of the config the data dates
    fitting: int  # of those, how many fit ``best``
    outliers: tuple[str, ...]  # keys that fit no release of the range (a fork, an override)

    def text(self) -> str:
        """``config keys: verl 0.5 (202 of 202 dated keys fit 0.5)`` (+ the outliers)."""
        lo, best = _name(self.low), _name(self.best)
        if self.high is None:
            span = f">= {lo}"
        else:
            span = lo if self.high == self.low else f"{lo}-{_name(self.high)}"
        text = f"config keys: verl {span} ({self.fitting} of {self.dated} dated keys fit {best})"
        if self.outliers:
            shown = ", ".join(self.outliers[:MAX_NAMED])
            more = len(self.outliers) - MAX_NAMED
            text += f"; from another release (a fork or an override?): {shown}"
            text += f" and {more} more" if more > 0 else ""
        return text


def _name(release: Release) -> str:
    return f"{release[0]}.{release[1]}"


def _release(text: object) -> Release | None:
    if text is None:
        return None
    major, minor = str(text).split(".")[:2]
    return int(major), int(minor)


def parse_config_dates(text: str) -> ConfigDates:
    """Build the table from the data file's text; ValueError names a bad entry."""
    doc = json.loads(text)  # our own bundled file (JSON: ~30x faster to read than its YAML)
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
        raise ValueError("verl config key dates: no 'keys' mapping")
    releases = tuple(sorted(r for r in map(_release, doc.get("releases") or {}) if r))
    keys: dict[str, KeyDates] = {}
    for key, raw in doc["keys"].items():
        try:
            since, until = _release(raw["since"]), _release(raw.get("until"))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"verl config key dates: {key}: {err!r}") from None
        if since is None or (until is not None and until < since):
            raise ValueError(f"verl config key dates: {key}: since {since} after until {until}")
        keys[str(key)] = KeyDates(since, until)
    return ConfigDates(keys, releases)


@functools.cache
def config_dates() -> ConfigDates:
    """The bundled table, read once."""
    text = (resources.files("verl_top") / "data" / DATA_FILE).read_text(encoding="utf-8")
    return parse_config_dates(text)


def config_version(keys: Iterable[str], table: ConfigDates | None = None) -> ConfigVersion | None:
    """The release range of a flat config's keys; None when too few of them are dated."""
    table = table or config_dates()
    dated = {k: table.keys[k] for k in keys if k in table.keys}
    if len(dated) < MIN_DATED_KEYS or not table.releases:
        return None
    fit = {r: sum(1 for d in dated.values() if d.fits(r)) for r in table.releases}
    good = _fitting_run(table.releases, fit, max(1, int(len(dated) * FORK_TOLERANCE)))
    top = max(good, key=lambda r: (fit[r], r))
    outliers = tuple(sorted(k for k, d in dated.items() if not any(d.fits(r) for r in good)))
    return ConfigVersion(
        low=good[0],
        high=None if good[-1] == table.releases[-1] else good[-1],
        best=top,
        dated=len(dated),
        fitting=fit[top],
        outliers=outliers,
    )


def _fitting_run(
    releases: tuple[Release, ...], fit: Mapping[Release, int], slack: int
) -> list[Release]:
    """The consecutive release lines around the best fit (the newest of equals) whose fit is
    within ``slack`` of it: a release in between that fits worse breaks the range."""
    best = max(fit.values())
    at = max(i for i, r in enumerate(releases) if fit[r] == best)
    lo = hi = at
    while lo > 0 and fit[releases[lo - 1]] >= best - slack:
        lo -= 1
    while hi < len(releases) - 1 and fit[releases[hi + 1]] >= best - slack:
        hi += 1
    return list(releases[lo : hi + 1])
