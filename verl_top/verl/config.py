"""verl's resolved config: the pprinted dict in the driver log, YAML/JSON files, dotted keys.

verl prints its resolved config at start with ``pprint`` (a Python dict literal spread over many
lines, each carrying the Ray prefix of the driver actor). ``PprintConfigCollector`` gathers those
lines, tolerating other actors' lines interleaved with them, and evaluates the literal with
``ast.literal_eval`` (never ``eval``). A config whose closing brace never arrives is repaired by
closing the open brackets after the last complete line and reported as partial.

Everything is flattened to dotted keys (``data.train_batch_size``); lists stay lists.

A config is foreign text (a log line, a file someone else wrote), so loading it is bounded:
YAML is read by a loader that refuses nesting deeper than ``MAX_CONFIG_DEPTH`` and aliases that
would expand to more than ``MAX_CONFIG_NODES`` nodes (a 900-byte alias bomb made the flattener
walk 10**9 keys), JSON goes through :func:`verl_top.untrusted.loads`, and :func:`flatten` walks
at most ``MAX_CONFIG_NODES`` nodes without recursion and keeps at most ``MAX_CONFIG_KEYS`` keys.
Every key and string value is cleaned *after* decoding: YAML ``"\\e"``, JSON ``"\\u001b"`` and
a pprinted ``'\\x1b'`` make escape characters that were not in the raw text.
"""

from __future__ import annotations

import ast
import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from verl_top.untrusted import UntrustedJSONError, clean_text, loads

# Top-level sections of every verl PPO config; a printed dict without one of them is not the config.
CONFIG_SECTIONS = frozenset(
    {"actor_rollout_ref", "trainer", "data", "algorithm", "critic", "reward_model"}
)
# Bounds so a runaway dict (or a hostile file) cannot grow memory without limit.
MAX_CONFIG_LINES = 20000
MAX_REPAIR_TRIES = 60
# Lines of the driver that are not the config (a warning printed while pprint wrote it) skipped
# before the dict is given up on and repaired.
MAX_CONFIG_GAP = 40
# Bounds on one config: nesting, nodes walked (aliases counted as expanded), keys kept, list
# items kept, characters of a string value. verl's full PPO config has ~600 keys, depth 6.
MAX_CONFIG_DEPTH = 64
MAX_CONFIG_NODES = 200_000
MAX_CONFIG_KEYS = 20_000  # as protocol.MAX_CONFIG_KEYS: a recording keeps what was shown
MAX_CONFIG_LIST = 1024  # as protocol.MAX_CONFIG_LIST
MAX_CONFIG_TEXT = 1024  # characters of one string value
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config file read whole
_OPENERS = "{[("
# A pprinted dict entry: indentation, a quoted key, a colon.
_KEY_LINE_RE = re.compile(r"\s*'[^']*':")


class ConfigError(ValueError):
    """A config that is refused (too deep, an alias bomb, too large, unparseable); says why."""


def _short_repr() -> reprlib.Repr:
    """A repr bounded in depth and size, for containers nested inside a list value."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 200, 200
    return short


def _leaf(value: Any, in_list: bool = False) -> tuple[bool, Any]:
    """(keep, cleaned value) of one flattened value: strings cleaned and bounded, numbers finite
    (NaN, inf and ints too large for a float are dropped), a list's items cleaned and capped, a
    container inside a list shown as bounded text (what the recording's protocol keeps)."""
    if value is None or isinstance(value, bool):
        return True, value
    if isinstance(value, int | float):
        try:
            return math.isfinite(float(value)), value
        except OverflowError:
            return False, None
    if isinstance(value, str):
        return True, clean_text(value, MAX_CONFIG_TEXT)
    if isinstance(value, Mapping) and not value:
        return True, {}
    if isinstance(value, list | tuple) and not in_list:
        items = (_leaf(v, True) for v in value[:MAX_CONFIG_LIST])
        return True, [v for keep, v in items if keep]
    return True, clean_text(_short_repr().repr(value), MAX_CONFIG_TEXT)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys; lists and scalars are leaves, ``{}`` is kept.

    Bounded whatever the tree: no recursion, at most ``MAX_CONFIG_NODES`` nodes visited (a
    shared sub-tree counts each time it is reached) and ``MAX_CONFIG_KEYS`` keys kept; keys and
    values are cleaned (see the module docstring).
    """
    out: dict[str, Any] = {}
    stack = [(prefix, iter(tree.items()))]  # the recursion's frames, made explicit
    budget = MAX_CONFIG_NODES
    while stack and budget > 0 and len(out) < MAX_CONFIG_KEYS:
        base, items = stack[-1]
        entry = next(items, None)
        if entry is None:
            stack.pop()
            continue
        budget -= 1
        key, value = entry
        part = clean_text(key, 256)
        name = f"{base}.{part}" if base else part
        if isinstance(value, Mapping) and value:
            if len(stack) < MAX_CONFIG_DEPTH:
                stack.append((name, iter(value.items())))
            continue
        keep, clean = _leaf(value)
        if keep:
            out[name] = clean
    return out


def looks_like_verl_config(tree: object) -> bool:
    """True when ``tree`` is a dict with at least one of verl's top-level config sections."""
    return isinstance(tree, dict) and any(k in CONFIG_SECTIONS for k in tree)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Load a verl config from a YAML (or JSON) file and flatten it to dotted keys.

    Hydra interpolations such as ``${data.max_prompt_length}`` are kept as strings. Raises
    ``ConfigError`` (a ValueError) when the file is refused (too large, too deep, an alias bomb),
    ``ValueError`` when it does not hold a mapping, ``OSError`` when it cannot be read.
    """
    with open(path, "rb") as fh:
        raw = fh.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, not read")
    text = raw.decode("utf-8", errors="replace")
    try:
        tree = load_config_text(text, json_first=str(path).endswith(".json"))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if tree is None:
        raise ValueError(f"{path}: not a YAML/JSON mapping")
    return flatten(tree)


class BoundedYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two limits checked while the document is composed.

    Nesting deeper than ``MAX_CONFIG_DEPTH`` is refused (PyYAML composes recursively: a deep
    document raised RecursionError), and so is a document whose aliases would expand to more
    than ``MAX_CONFIG_NODES`` nodes: each alias counts the size of the node it names, so an
    alias bomb is refused after reading a few hundred bytes instead of being walked.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[int, int] = {}  # expanded size of each anchored node, by id

    def _count(self, n: int) -> None:
        self._nodes += n
        if self._nodes > MAX_CONFIG_NODES:
            raise ConfigError(
                f"YAML aliases expand to more than {MAX_CONFIG_NODES} nodes (an alias bomb?); "
                "refused"
            )

    def compose_node(self, parent: Any, index: Any) -> Any:
        """One node, counted (aliases by the size of what they name) and depth-checked."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            named = self.anchors.get(event.anchor)
            self._count(1 if named is None else self._sizes.get(id(named), 1))
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"YAML nested deeper than {MAX_CONFIG_DEPTH} levels; refused")
        before = self._nodes
        self._count(1)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if getattr(event, "anchor", None):
            self._sizes[id(node)] = self._nodes - before
        return node


def _int_or_text(loader: yaml.SafeLoader, node: Any) -> Any:
    """A YAML int, or its text when Python refuses it (over 4300 digits): one value, not the
    whole config, is lost."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        return clean_text(node.value, 64)


BoundedYamlLoader.add_constructor("tag:yaml.org,2002:int", _int_or_text)


def load_config_text(text: str, json_first: bool = False) -> dict[str, Any] | None:
    """Parse YAML or JSON text into a nested dict; ``None`` when it is not a mapping.

    Raises ConfigError when the text is refused by a limit (size, depth, aliases) rather than
    merely not (yet) a config: a caller re-parsing a growing file stops on it.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config text larger than {MAX_CONFIG_BYTES // 2**20} MiB; refused")
    tree: object = None
    if json_first:
        try:
            tree = loads(text, max_bytes=MAX_CONFIG_BYTES, max_depth=MAX_CONFIG_DEPTH)
        except UntrustedJSONError as exc:
            if "deeper" in str(exc):
                raise ConfigError(str(exc)) from None
            tree = None
    if tree is None:
        try:
            tree = yaml.load(text, Loader=BoundedYamlLoader)  # noqa: S506 - a SafeLoader
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            return None  # not YAML (yet): an int too long for Python is refused here too
        except RecursionError:
            raise ConfigError("YAML nested too deep; refused") from None
    return tree if isinstance(tree, dict) else None


def bracket_delta(line: str) -> tuple[int, list[str]]:
    """Net bracket depth change of one pprinted line, ignoring brackets inside string literals.

    Returns the net change and the brackets still open at the end of the line (pprint never
    splits one string literal across lines, so string state does not carry over).
    """
    stack: list[str] = []
    closed = 0
    quote = ""
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in _OPENERS:
            stack.append(ch)
        elif ch in "}])":
            if stack:
                stack.pop()
            else:
                closed += 1
        i += 1
    return len(stack) - closed, stack


def eval_dict_literal(text: str) -> dict[str, Any] | None:
    """``ast.literal_eval`` of a dict literal; ``None`` on any failure."""
    try:
        tree = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return tree if isinstance(tree, dict) else None


# A quoted dict key and its separator, as pprint writes it.
_KEY_AT_RE = re.compile(r"""('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"): """)


def _eval_value(text: str) -> tuple[bool, Any]:
    """Evaluate one pprinted value followed by any closing braces/commas of enclosing dicts."""
    candidate = text.strip().rstrip(",").rstrip()
    for _ in range(MAX_REPAIR_TRIES):
        try:
            return True, ast.literal_eval(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
        if not candidate.endswith("}"):
            break
        candidate = candidate[:-1].rstrip().rstrip(",").rstrip()
    return False, None


def rebuild_by_indent(lines: list[str]) -> dict[str, Any] | None:
    """Rebuild a pprinted dict from its indentation when its brackets do not balance.

    pprint puts every key of a dict in the same column, so the column of a line's key says which
    dict it belongs to even when lines were lost or the end never came. Lines whose column
    matches no open dict (their opening line was lost) are dropped, as are values that do not
    evaluate. Returns ``None`` when the first line does not open a dict.
    """
    if not lines or not lines[0].startswith("{"):
        return None
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(1, root)]
    pending: tuple[dict[str, Any], str, list[str]] | None = None

    def settle() -> None:
        if pending is not None:
            ok, value = _eval_value("\n".join(pending[2]))
            if ok:
                pending[0][pending[1]] = value

    for index, line in enumerate(lines):
        pos = 1 if index == 0 else len(line) - len(line.lstrip(" "))
        match = _KEY_AT_RE.match(line, pos)
        if match is None:
            if pending is not None:
                pending[2].append(line)  # a list or string wrapped over several lines
            continue
        settle()
        pending = None
        while stack and stack[-1][0] > pos:
            stack.pop()
        if not stack or stack[-1][0] != pos:
            continue  # its dict's opening line is missing
        target = stack[-1][1]
        while match is not None:
            try:
                key = str(ast.literal_eval(match.group(1)))
            except (ValueError, SyntaxError):
                break
            start = match.end()
            rest = line[start:]
            nested = _KEY_AT_RE.match(line, start + 1) if rest.startswith("{") else None
            if nested is not None and not _eval_value(rest)[0]:
                child: dict[str, Any] = {}
                target[key] = child
                stack.append((start + 1, child))
                target, match = child, nested
                continue
            pending = (target, key, [rest])
            match = None
    settle()
    return root


@dataclass
class CollectedConfig:
    """A config gathered from the log: the nested dict and whether it had to be repaired."""

    tree: dict[str, Any]
    partial: bool = False


@dataclass
class PprintConfigCollector:
    """Gathers the lines of verl's pprinted config from a stream of (prefix, body) lines.

    ``prefix`` is the Ray actor prefix of the line ("" when none). Once a line of the driver
    starts a dict (``{'...``), later lines of the same prefix that are indented continue it;
    lines of other actors, blank lines and unprefixed noise in between are skipped, and so are up
    to ``MAX_CONFIG_GAP`` non-indented lines of the same actor in a row (a line that follows an
    entry cut after its colon is glued onto it). The dict ends when its brackets balance, or
    (repaired, partial) when the gap grows too long, a step line of the same actor arrives, the
    stream ends or the line limit is reached.
    """

    active: bool = False
    prefix: str = ""
    lines: list[str] = field(default_factory=list)
    depth: int = 0
    gap: int = 0  # driver lines in a row that were not part of the config

    def reset(self) -> None:
        """Forget any config being collected."""
        self.active = False
        self.prefix = ""
        self.lines = []
        self.depth = 0
        self.gap = 0

    def starts(self, body: str) -> bool:
        """True when ``body`` (prefix already removed) opens a pprinted dict."""
        return body.startswith("{'")

    def begin(self, prefix: str, body: str) -> CollectedConfig | None:
        """Start collecting at an opening line; returns a config if it closes on the same line."""
        self.reset()
        self.active = True
        self.prefix = prefix
        return self.add(prefix, body)[1]

    def add(self, prefix: str, body: str) -> tuple[bool, CollectedConfig | None]:
        """Offer one line while active: ``(consumed, config)``.

        ``consumed`` is False when the line is not part of the config and should be parsed as an
        ordinary line (another actor's line, or the driver's first line after a cut dict).
        ``config`` is set when the dict is complete or was given up on and repaired; check
        ``active`` to know whether collection ended without a usable dict.
        """
        if prefix != self.prefix:
            # Another actor's line interleaved (or unprefixed noise inside a prefixed config).
            return False, None
        if not body.strip():
            return True, None
        if self.lines and not body[:1].isspace():
            if self.lines[-1].rstrip().endswith(":"):
                # "'nnodes': " then "1," on the next line: a flush split the entry. Glue it.
                self.lines[-1] = self.lines[-1].rstrip() + " " + body
                self.depth += bracket_delta(body)[0]
                self.gap = 0
                return True, self._finish() if self.depth <= 0 else None
            # The driver printed something else meanwhile; the dict may still go on.
            self.gap += 1
            if self.gap > MAX_CONFIG_GAP:
                return False, self._finish_partial()
            return False, None
        if self.lines and body == self.lines[-1] and _KEY_LINE_RE.match(body):
            # Same dict entry twice in a row: a duplicated copy/paste line, not pprint output.
            return True, None
        self.gap = 0
        self.lines.append(body)
        self.depth += bracket_delta(body)[0]
        if self.depth <= 0:
            return True, self._finish()
        if len(self.lines) >= MAX_CONFIG_LINES:
            return True, self._finish_partial()
        return True, None

    def abandon(self) -> CollectedConfig | None:
        """End of stream while collecting: salvage what was gathered."""
        if not self.active or not self.lines:
            self.reset()
            return None
        return self._finish_partial()

    def _finish(self) -> CollectedConfig | None:
        tree = eval_dict_literal("\n".join(self.lines)) if self.depth == 0 else None
        if tree is None:
            return self._finish_partial()
        self.reset()
        return CollectedConfig(tree) if looks_like_verl_config(tree) else None

    def _finish_partial(self) -> CollectedConfig | None:
        tree = rebuild_by_indent(self.lines)
        self.reset()
        if tree is None or not looks_like_verl_config(tree):
            return None
        return CollectedConfig(tree, partial=True)


def config_int(values: Mapping[str, Any], key: str) -> int | None:
    """An integer config value, or ``None`` when absent or not a plain number."""
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def n_gpus(values: Mapping[str, Any]) -> int | None:
    """GPUs of the training pool: ``trainer.n_gpus_per_node × trainer.nnodes`` (verl's divisor)."""
    per_node = config_int(values, "trainer.n_gpus_per_node")
    nodes = config_int(values, "trainer.nnodes")
    if per_node is None or per_node <= 0:
        return None
    return per_node * (nodes if nodes and nodes > 0 else 1)


def samples_per_step(values: Mapping[str, Any]) -> int | None:
    """Samples generated per step: ``data.train_batch_size × actor_rollout_ref.rollout.n``.

    ``rollout.n`` defaults to 1 (old configs do not print it).
    """
    batch = config_int(values, "data.train_batch_size")
    if batch is None or batch <= 0:
        return None
    n = config_int(values, "actor_rollout_ref.rollout.n")
    return batch * (n if n and n > 0 else 1)
