"""Build ``verl_top/data/verl_config_keys.json``: which verl releases have each config key.

Run against a git clone of github.com/verl-project/verl (any clone with its tags)::

    python -m verl_top.verl.config_dates_build /path/to/verl [REF] > verl_top/data/verl_config_keys.json

It reads the PPO trainer's config (``verl/trainer/config/ppo_trainer.yaml`` and
``ppo_megatron_trainer.yaml``; from July 2025 their Hydra-composed ``_generated_*`` forms, which
hold every key the trainer prints) at every commit of ``REF``'s first-parent history that
changed them, and at every release tag. A key's life on main (the commit that added it, the one
that removed it) is mapped to release lines: a commit belongs to the newest release whose
branch point it contains, so a key added on main after v0.2 left it reads "since 0.2" (a main
build of that time, or any later release). Release tags that left main on a branch widen a
key's range where the branch's config differs. Nothing of verl's code or text is copied: the
output holds key names, release numbers, commit ids and ``tag path:line`` positions.

This is a developer tool (it needs git and a clone); verl-top itself only reads its output
(``verl_top.verl.config_dates``).
"""

from __future__ import annotations

import bisect
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CONFIG_DIR = "verl/trainer/config/"
CONFIG_FILES = ("ppo_trainer.yaml", "ppo_megatron_trainer.yaml")
RELEASE_TAG = re.compile(r"v(\d+)\.(\d+)(?:\.\d+)?(?:\.post\d+)?")
SCHEMA = "verl-top.verl-config-keys/1"

Release = tuple[int, int]


@dataclass
class KeyLife:
    """What the history says of one key: the release lines it lived in and where."""

    since: Release
    until: Release | None = None  # None: still in REF's config
    added: str = ""  # "<sha7> <date>" of the main commit that added it
    removed: str = ""  # of the main commit that removed it last
    tags: list[str] = field(default_factory=list)  # release tags whose config has it


class Repo:
    """The few git reads the build needs, on one repository."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def git(self, *args: str) -> str:
        done = subprocess.run(
            ["git", "-C", self.path, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def show(self, ref: str, path: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", self.path, "show", f"{ref}:{path}"], capture_output=True, text=True
        )
        return done.stdout if done.returncode == 0 else None


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of every leaf of a YAML mapping (a non-empty mapping is a
    section, not a key; an empty one is a leaf, as the printed config shows it)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    out: dict[str, int] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, prefix = stack.pop()
        if not isinstance(node, yaml.MappingNode):
            continue
        for key_node, value in node.value:
            name = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if isinstance(value, yaml.MappingNode) and value.value:
                stack.append((value, name))
            else:
                out[name] = key_node.start_mark.line + 1
    return out


def config_keys(repo: Repo, ref: str) -> dict[str, str] | None:
    """Every key of the PPO configs at ``ref`` -> ``path:line`` where it is; None when there is
    no config, or only a Hydra ``defaults:`` list without its generated form (a week of July
    2025: the keys of the sub-configs are not in the file)."""
    found: dict[str, str] = {}
    for name in CONFIG_FILES:
        for path in (CONFIG_DIR + "_generated_" + name, CONFIG_DIR + name):
            text = repo.show(ref, path)
            if text is None:
                continue
            doc = yaml.safe_load(text)
            if not path.split("/")[-1].startswith("_generated_") and "defaults" in (doc or {}):
                return None
            for key, line in key_lines(text).items():
                found.setdefault(key, f"{path}:{line}")
            break
    return found or None


def releases(repo: Repo, ref: str, main: list[str]) -> list[tuple[int, Release, str]]:
    """(index on main of the branch point, release line, tag) of every release tag, oldest
    first. A tag on main is its own branch point."""
    index = {c: i for i, c in enumerate(main)}
    out = []
    for tag in repo.git("tag").split():
        match = RELEASE_TAG.fullmatch(tag)
        if match is None:
            continue
        point = repo.git("merge-base", tag, ref).strip()
        if point not in index:
            raise ValueError(f"{tag}: branch point {point[:7]} is not on {ref}'s first parents")
        out.append((index[point], (int(match[1]), int(match[2])), tag))
    return sorted(out)


def _version_key(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", tag))


def lives(
    repo: Repo, ref: str = "HEAD"
) -> tuple[dict[str, KeyLife], dict[str, str], list[tuple[int, Release, str]]]:
    """Every config key's life, where each tag first has it, and the releases."""
    main = repo.git("rev-list", "--first-parent", "--reverse", ref).split()
    index = {c: i for i, c in enumerate(main)}
    rel = releases(repo, ref, main)
    points = [r[0] for r in rel]

    def era(i: int) -> Release:
        j = bisect.bisect_right(points, i) - 1
        return rel[max(j, 0)][1]

    paths = [CONFIG_DIR + p + n for n in CONFIG_FILES for p in ("", "_generated_")]
    commits = repo.git("log", "--first-parent", "--reverse", "--format=%H %cs", ref, "--", *paths)
    life: dict[str, KeyLife] = {}
    present: set[str] = set()
    for line in commits.splitlines():
        sha, date = line.split()
        keys = config_keys(repo, sha)
        if keys is None:
            continue
        now, i, stamp = set(keys), index[sha], f"{sha[:7]} {date}"
        for key in now - present:
            if key not in life:
                life[key] = KeyLife(since=era(i), added=stamp)
            life[key].until = None  # (re-)added
        for key in present - now:
            life[key].until, life[key].removed = era(i - 1), stamp
        present = now
    first_at: dict[str, str] = {}
    for _, line_of, tag in sorted(rel, key=lambda r: _version_key(r[2])):
        keys = config_keys(repo, tag) or {}
        for key, where in keys.items():
            first_at.setdefault(key, f"{tag} {where}")
            entry = life.setdefault(key, KeyLife(since=line_of, until=line_of))
            entry.since = min(entry.since, line_of)
            if entry.until is not None:
                entry.until = max(entry.until, line_of)
            entry.tags.append(tag)
    return life, first_at, rel


def _v(release: Release | None) -> str | None:
    return None if release is None else f"{release[0]}.{release[1]}"


ABOUT = (
    "Which verl releases print each key of the resolved PPO config (issue 28 item 1).",
    "Generated by `python -m verl_top.verl.config_dates_build /path/to/verl` from",
    "github.com/verl-project/verl: the first-parent history of main and every release tag",
    "(verl_top/verl/config_dates_build.py says how). Do not edit by hand.",
    "since / until: the first and last release line whose code prints the key; a main commit",
    "counts as the newest release whose branch point it contains; until null = still printed",
    "by main at `ref`. added / removed: the main commit (sha, date) that added / last removed",
    "the key. first_tag: the first release tag whose config has it (tag path:line), absent",
    "when the key lived only on main between releases. last_tag: for a removed key, the last",
    "release tag whose config has it.",
)


def _entry(key: str, entry: KeyLife, first_at: dict[str, str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {"since": _v(entry.since), "until": _v(entry.until)}
    if entry.added:
        out["added"] = entry.added
    if entry.removed and entry.until is not None:
        out["removed"] = entry.removed
    if key in first_at:
        out["first_tag"] = first_at[key]
    if entry.until is not None and entry.tags:
        out["last_tag"] = max(entry.tags, key=_version_key)
    return out


def render(repo: Repo, ref: str = "HEAD") -> str:
    """The data file's text (JSON, one key a line so a rebuild diffs by key): what it is, the
    releases, then every key that dates a config (keys every release has tell nothing)."""
    life, first_at, rel = lives(repo, ref)
    main = repo.git("rev-list", "--first-parent", "--reverse", ref).split()
    releases: dict[str, str] = {}
    for point, line_of, tag in rel:
        on_main = repo.git("rev-parse", f"{tag}^{{commit}}").strip() == main[point]
        where = "on main" if on_main else f"left main at {main[point][:7]}"
        releases.setdefault(str(_v(line_of)), f"{tag} ({where})")
    head = {
        "about": list(ABOUT),
        "schema": SCHEMA,
        "ref": repo.git("rev-parse", ref).strip(),
        "files": [CONFIG_DIR + p + n for n in CONFIG_FILES for p in ("", "_generated_")],
        "releases": releases,
    }
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append('  "keys": {')
    oldest = rel[0][1]
    rows = []
    for key in sorted(life):
        entry = life[key]
        # Keys every release has tell nothing; "@pkg" keys are Hydra package directives that
        # leaked into a generated file for a few days, never printed by a trainer.
        if (entry.since == oldest and entry.until is None) or key.startswith("@"):
            continue
        rows.append(f"    {json.dumps(key)}: {json.dumps(_entry(key, entry, first_at))}")
    lines += [",\n".join(rows), "  }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    """``config_dates_build REPO [REF]``: print the data file for the clone at REPO."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print(
            "usage: python -m verl_top.verl.config_dates_build /path/to/verl [REF]", file=sys.stderr
        )
        return 2
    sys.stdout.write(render(Repo(args[0]), args[1] if len(args) == 2 else "HEAD"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
