"""Words that know where the data comes from: a replay, Prometheus, SSH, Ray or this machine.

"give --verl-log PATH" is the right hint on this machine, a wrong one in a replay whose recording
holds the steps, and a useless one where the steps are already read. Every surface that tells
people what is missing asks here, with the store's ``origin`` (set by verl_top/inputs.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from verl_top.store import Store

LOCAL = "local"
SSH = "ssh"
RAY = "ray"
PROMETHEUS = "prometheus"
REPLAY = "replay"
DEMO = "demo"
POST_MORTEM = "post-mortem"
ORIGINS = (LOCAL, SSH, RAY, PROMETHEUS, REPLAY, DEMO, POST_MORTEM)

# The asks the rules write into their "no data" details (diagnosis/step*.py), longest first.
_NEED_STEPS = "needs verl steps: "
_ASK = re.compile(r"(?:pass )?--verl-log PATH(?: \(console log or file-logger JSONL\))?(?![\w/])")
GIVEN_LOG = "the --verl-log given has no such data yet (see what was read)"
NEEDS_TIMINGS = "needs stage timings (timing_s/*), which the verl steps read do not have"


class _Detailed(Protocol):
    status: str
    detail: str


def recorded(store: Store) -> bool:
    """True when the data is a recording (replay or demo)."""
    return store.origin in (REPLAY, DEMO)


def verl_log_ask(store: Store) -> str:
    """What to do to get verl steps, in this session's terms ('' once steps are read)."""
    if store.steps:
        return ""
    if store.log_stats:
        return GIVEN_LOG
    origin = store.origin
    if origin in (REPLAY, DEMO):
        return "the recording has no verl step (add --verl-log PATH: a log file of this machine)"
    if origin == PROMETHEUS:
        return (
            "Prometheus has no verl steps: add --verl-log PATH (a file on this machine), or "
            "--hosts with --verl-log HOST:PATH"
        )
    if origin in (SSH, RAY):
        return (
            "give --verl-log HOST:PATH (the driver's console log or the file logger's JSONL "
            "on its node)"
        )
    return "give --verl-log PATH (the driver's console log or the file logger's JSONL)"


def no_processes_text(store: Store) -> str:
    """Why a node has no GPU process list, in this session's terms."""
    if store.origin == PROMETHEUS:
        return (
            "process lists are not exported by dcgm-exporter: roles, ranks and per-process "
            "memory need the node agent (--hosts or --ray)"
        )
    if recorded(store):
        return "the recording has no GPU process list for this node"
    return "no GPU process list from this node yet (the agent reports it; roles come from the process titles)"


def no_host_sample_text(store: Store) -> str:
    """Why a node has no host sample (CPU, memory, network, disks), in this session's terms."""
    if store.origin == PROMETHEUS:
        return (
            "host samples (CPU, memory, network, disks) are not in dcgm-exporter's series; "
            "the node agent sends them (--hosts)"
        )
    if recorded(store):
        return "the recording has no host sample for this node"
    return "no host sample yet"


def missing_steps_text(store: Store, what: str = "") -> str:
    """A pane's line where verl steps are missing: 'no verl step yet: <ask>' (``what``: what
    the steps would show there, e.g. 'weight-sync time per step')."""
    about = f" ({what})" if what else ""
    ask = verl_log_ask(store)
    return f"no verl step yet{about}: {ask}" if ask else f"no verl step yet{about}"


def rephrase_asks(checks: Iterable[_Detailed], store: Store) -> None:
    """Reword the rules' "pass --verl-log PATH" in their no-data details for this session.

    With steps already read, the ask goes (the clause before it says what is missing); else
    it becomes the session's own way to get steps (verl_log_ask)."""
    ask = verl_log_ask(store)
    for check in checks:
        if check.status != "no_data" or "--verl-log PATH" not in check.detail:
            continue
        check.detail = _rephrase(check.detail, ask)


def _rephrase(detail: str, ask: str) -> str:
    if ask:
        return _ASK.sub(ask, detail, count=1)
    # Steps are read: drop the ask with its "needs verl steps: " lead and the ": " before it.
    head, tail = _ASK.split(detail, maxsplit=1)
    head = head.removesuffix(_NEED_STEPS).rstrip(" :")
    return (head or NEEDS_TIMINGS) + tail
