"""The one registration point of the sources that are built from typed settings.

Each source module defines a settings dataclass with a ``KIND`` and a function
``build_sources(settings) -> list[Source]``; it is registered here with one line. The CLI
(``verl_top/flags.py``) maps command-line flags to settings objects and calls :func:`build`;
nothing under ``sources/`` sees argparse. Modules are imported on use, so a run without Ray or
Prometheus never imports their code (asyncssh alone costs ~0.1 s at start-up).

To add a source: write ``sources/<name>.py`` (settings + ``build_sources``), add its line to
``SOURCES``, and map its flags in ``flags.py``.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Protocol

from verl_top.sources.base import Source


class SourceSettings(Protocol):
    """What every source's settings object has: the ``KIND`` it is registered under."""

    KIND: ClassVar[str]


# KIND -> module defining build_sources(settings).
SOURCES: dict[str, str] = {
    "ssh": "verl_top.sources.ssh",
    "ray": "verl_top.sources.ray",
    "prometheus": "verl_top.sources.prometheus",
}


def build(settings: Any) -> list[Source]:
    """The sources for one settings object (its module's errors propagate unchanged)."""
    kind = getattr(settings, "KIND", None)
    if kind not in SOURCES:
        raise KeyError(f"no source registered for settings {type(settings).__name__} ({kind!r})")
    module = importlib.import_module(SOURCES[kind])
    return list(module.build_sources(settings))
