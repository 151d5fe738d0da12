"""What a verl maintainer asks for first: software versions, the launch command, the last errors.

Every item says where it came from, or ``unknown``: nothing is guessed. Sources: the verl
logs followed on this machine (their first and last MiB, read when the snapshot is written,
never on the hot path), the lines the nodes' agents sent (each host's log tail), the agents'
hellos (driver, their Python), the config and verl's flavour detection, and this machine.
Log text is foreign: it is cleaned and bounded here, and the snapshot redacts it.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from verl_top import __version__
from verl_top.store import Store
from verl_top.untrusted import clean_text

READ_BYTES = 1 << 20  # of a log's head (versions, the launch line) and of its tail (errors)
MAX_ERRORS = 20
UNKNOWN = "unknown"

# name -> patterns whose group 1 is the version (first match wins, searched line by line).
_VERSION_LINES: dict[str, tuple[re.Pattern[str], ...]] = {
    "vLLM": (
        re.compile(r"\bvLLM (?:API server )?version:? v?(\d+\.\d+[\w.+-]*)"),
        re.compile(r"Initializing an? (?:V\d )?LLM engine \(v(\d+\.\d+[\w.+-]*)\)"),
    ),
    "SGLang": (re.compile(r"\bsglang(?:[ _]version)?[ =:]+v?(\d+\.\d+\.\d+[\w.+-]*)", re.I),),
    "torch": (re.compile(r"\btorch(?:[ _]version)?[ =:]+v?(\d+\.\d+\.\d+[\w.+-]*)"),),
    "Ray": (re.compile(r"\bRay version:? v?(\d+\.\d+\.\d+[\w.+-]*)"),),
    "NCCL": (re.compile(r"\bNCCL version (\d+\.\d+\.\d+)"),),
    "CUDA (NCCL build)": (re.compile(r"\bNCCL version \d+\.\d+\.\d+\+cuda(\d+\.\d+)"),),
}
# A launch line as shells echo it (`+ ` with set -x, `$ `, nohup): python -m verl.trainer.X,
# torchrun ... -m verl.trainer.X, or ray job submit ... -- python3 -m verl.trainer.X.
_LAUNCH = re.compile(
    r"^(?:[+$]\s+)?(?:nohup\s+)?((?:\S*/)?(?:python[\d.]*|torchrun|ray\s+job\s+submit)\s.*"
    r"\bverl\.trainer\.\w+.*)$"
)
MAX_CONTINUED = 200  # lines of one launch command continued with a trailing backslash
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception)\b:|CUDA out of memory|"
    r"OutOfMemoryError|NCCL WARN|[Ww]atchdog caught|ActorDiedError|RayTaskError|"
    r"\bKilled\b|Segmentation fault|core dumped"
)
# Ray's "(TaskRunner pid=2192)" prefix and ANSI colours before the text itself.
_PREFIX = re.compile(r"^(?:\x1b\[[\d;]*m)*(?:\([^)]*pid=\d+[^)]*\))?(?:\x1b\[[\d;]*m)*\s*")


@dataclass(frozen=True)
class Software:
    """One item of the software list: its version (or 'unknown') and where it was read."""

    name: str
    version: str = UNKNOWN
    source: str = ""


@dataclass(frozen=True)
class Environment:
    """Versions, the launch command (None: not seen) and the last error lines."""

    software: tuple[Software, ...]
    launch: str | None
    launch_source: str
    errors: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """For snapshot.json."""
        return {
            "software": [asdict(s) for s in self.software],
            "launch": {"command": self.launch, "source": self.launch_source},
            "errors": list(self.errors),
        }


def _local_logs(store: Store) -> list[str]:
    """Paths of the verl logs followed on this machine."""
    here = {socket.gethostname(), "", "localhost"}
    out = []
    for stats in store.log_stats.values():
        path = str(stats.get("path") or "")
        if stats.get("kind") == "verl" and str(stats.get("host") or "") in here:
            if os.path.isfile(path):
                out.append(path)
    return out


def _read(path: str, tail: bool) -> list[str]:
    """The first (or last) READ_BYTES of a file as cleaned lines ([] when unreadable)."""
    try:
        with open(path, "rb") as fh:
            if tail:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - READ_BYTES))
            data = fh.read(READ_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if tail and len(lines) > 1:
        lines = lines[1:]  # the first may start mid-line
    elif not tail and len(lines) > 1 and len(data) == READ_BYTES:
        lines = lines[:-1]
    return [_PREFIX.sub("", clean_text(line, 2048)) for line in lines]


def _versions(lines: Iterable[str]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        if "ersion" not in line and "engine (v" not in line and "sglang" not in line.lower():
            continue
        for name, patterns in _VERSION_LINES.items():
            if name in found:
                continue
            for pattern in patterns:
                m = pattern.search(line)
                if m:
                    found[name] = (m.group(1), f"log line: {line.strip()[:160]}")
                    break
    return found


def _software(store: Store, head: list[str], tails: list[str]) -> list[Software]:
    seen = _versions([*head, *tails])
    items: list[Software] = []
    from verl_top.verl.flavour import store_flavour

    verl_range = store_flavour(store).version_range
    items.append(
        Software("verl", verl_range, "inferred from the config keys and metric names")
        if verl_range not in (UNKNOWN, "")
        else Software("verl", UNKNOWN, "no log line or key tells it")
    )
    engine = str(store.config.get("actor_rollout_ref.rollout.name") or "")
    for name in ("vLLM", "SGLang", "torch", "Ray", "NCCL", "CUDA (NCCL build)"):
        if name in seen:
            items.append(Software(name, *seen[name]))
            continue
        why = "not printed in the logs read"
        if name in ("vLLM", "SGLang") and engine:
            why += f"; the config's rollout engine is {clean_text(engine, 40)}"
        items.append(Software(name, UNKNOWN, why))
    drivers = sorted({h.hello.driver for h in store.hosts.values() if h.hello and h.hello.driver})
    items.append(
        Software("NVIDIA driver", ", ".join(clean_text(d, 40) for d in drivers), "agent hello")
        if drivers
        else Software("NVIDIA driver", UNKNOWN, "no agent saw an NVIDIA driver")
    )
    pythons = sorted({h.hello.python for h in store.hosts.values() if h.hello and h.hello.python})
    items.append(
        Software(
            "Python (nodes' agents)", ", ".join(clean_text(p, 40) for p in pythons), "agent hello"
        )
        if pythons
        else Software("Python (nodes' agents)", UNKNOWN, "no agent said hello")
    )
    items.append(Software("verl-top", __version__, "this machine"))
    items.append(Software("Python (verl-top)", platform.python_version(), "this machine"))
    return items


def _launch(store: Store, head: list[str]) -> tuple[str | None, str]:
    for h in store.hosts.values():
        for proc in h.procs.procs if h.procs is not None else ():
            m = _LAUNCH.search((proc.cmd or "").strip())
            if m:
                return clean_text(m.group(1), 4096), f"process {proc.pid} on {h.name}"
    for i, line in enumerate(head):
        m = _LAUNCH.search(line.strip())
        if m:
            return _continued(m.group(1), head[i + 1 : i + 1 + MAX_CONTINUED]), (
                "the first launch line of the log"
            )
    return None, "not seen (no driver process or launch line in the logs read)"


def _continued(first: str, rest: list[str]) -> str:
    """A command whose lines end in a backslash, joined into one line."""
    parts = [first.strip()]
    for line in rest:
        if not parts[-1].endswith("\\"):
            break
        parts[-1] = parts[-1][:-1].rstrip()
        parts.append(line.strip())
    return clean_text(" ".join(p for p in parts if p).rstrip("\\ "), 4096)


def _errors(store: Store, tails: list[str]) -> list[str]:
    lines = [e.text for e in store.events] if store.events else []
    for h in store.hosts.values():
        lines += [_PREFIX.sub("", clean_text(x, 2048)) for x in h.log_tail]
    lines += tails
    hits = [line.strip() for line in lines if _ERROR.search(line)]
    return list(dict.fromkeys(hits))[-MAX_ERRORS:]


def collect_environment(store: Store) -> Environment:
    """Versions, launch command and last errors for a snapshot of ``store``."""
    paths = _local_logs(store)
    head = [line for p in paths for line in _read(p, tail=False)]
    tails = [line for p in paths for line in _read(p, tail=True)]
    launch, source = _launch(store, head)
    return Environment(
        software=tuple(_software(store, head, tails)),
        launch=launch,
        launch_source=source,
        errors=tuple(_errors(store, tails)),
    )
