"""Hydra overrides from the launch command a verl log starts with.

People paste or tee the command with the log: a ``script:`` block with a multi-line
``python3 -m verl.trainer.main_ppo \\`` command (one ``key=value \\`` per line), or the
one-line ``+ python3 -m verl.trainer.main_ppo key=value ...`` that ``set -x`` prints. When the
printed config is cut from the file (an excerpt keeps only part of it) or never printed, those
overrides are the only place a setting such as ``trainer.test_freq=5`` is stated.

``LaunchReader`` follows the lines, joins a command's continuation lines and returns its
overrides as flat dotted keys once the command ends. Values are read as numbers, booleans and
null where they are those; a value that still holds a shell variable (``${total_procs}``) says
nothing and is left out. Everything is foreign text: a command is bounded in characters and
overrides, and tokenising falls back to plain splitting on unbalanced quotes.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from verl_top.untrusted import clean_text

MAX_COMMAND_CHARS = 65536
MAX_OVERRIDES = 2000
MAX_VALUE_CHARS = 1024
# The trainer's module or script: verl's main_ppo and the recipes' entry points.
_LAUNCH_RE = re.compile(r"(?:-m\s+(?:verl|recipe)\.[\w.]+|main_\w+\.py)(?:\s|$)")
_OVERRIDE_RE = re.compile(r"\+{0,2}([A-Za-z_][\w\-]*(?:\.[\w\-@]+)*)=(.*)", re.S)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")


def override_value(text: str) -> tuple[bool, Any]:
    """(keep, value) of one override's value as Hydra reads the common cases: numbers,
    true/false, null, quoted or bare strings; (False, None) for a shell variable."""
    if "$" in text or len(text) > MAX_VALUE_CHARS:
        return False, None
    low = text.lower()
    if low in ("true", "false"):
        return True, low == "true"
    if low in ("null", "none", "~"):
        return True, None
    if _NUMBER_RE.fullmatch(text):
        number = float(text)
        return True, int(number) if number.is_integer() and "." not in text else number
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return True, clean_text(text, MAX_VALUE_CHARS)


def parse_overrides(command: str) -> dict[str, Any]:
    """The ``key=value`` overrides of one launch command (options and the program left out)."""
    command = command[:MAX_COMMAND_CHARS]
    try:
        tokens = shlex.split(command, comments=False, posix=True)
    except ValueError:  # unbalanced quotes: a cut line
        tokens = command.split()
    out: dict[str, Any] = {}
    for token in tokens:
        match = _OVERRIDE_RE.fullmatch(token)
        if match is None or token.startswith("-"):
            continue
        keep, value = override_value(match.group(2))
        if keep:
            out[match.group(1)] = value
            if len(out) >= MAX_OVERRIDES:
                break
    return out


class LaunchReader:
    """The launch commands of one followed log, each handed over once it ends."""

    def __init__(self) -> None:
        self._parts: list[str] | None = None
        self._chars = 0

    # A line without one of these can only matter inside an open command (the parser's
    # quiet-line skip asks, verl/parse.py): the same cheap test ``scan`` starts with.
    OPENERS = ("-m ", "main_")

    @property
    def idle(self) -> bool:
        """No command is open (continued with a backslash)."""
        return self._parts is None

    def reset(self) -> None:
        self._parts = None
        self._chars = 0

    def scan(self, body: str) -> dict[str, Any] | None:
        """Read one line; the overrides of a command that ends with it, else None."""
        if self._parts is None:
            if not any(m in body for m in self.OPENERS):
                return None  # most lines: no regex
            if _LAUNCH_RE.search(body[:MAX_COMMAND_CHARS]) is None:
                return None
            self._parts, self._chars = [], 0
        text = body.rstrip()
        more = text.endswith("\\")
        if self._chars < MAX_COMMAND_CHARS:
            self._parts.append(text[:-1] if more else text)
            self._chars += len(text)
        if more:
            return None
        command, self._parts = " ".join(self._parts), None
        return parse_overrides(command) or None
