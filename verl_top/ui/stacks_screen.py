"""Key t on the node screen (and on a process screen): the Python stacks of the job's processes
on that node, grouped by role (verl_top/stacks.py), read through the node's own connection.

The screen says first that py-spy pauses each process briefly while it reads it; the result
goes to the store (``store.stacks``) so a snapshot taken afterwards carries it. Live sessions
only: a replay or Prometheus has no process to read.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top import stacks
from verl_top.node_exec import Runner, local_run
from verl_top.untrusted import clean_text


def runner_for(sources: Sequence[Any], host: str) -> Runner | None:
    """How to run a command on ``host``: its SSH source's connection, or this machine for the
    in-process agent; None when the session has no live source for it."""
    for src in sources:
        if getattr(src, "name", None) == host and callable(getattr(src, "exec", None)):
            return src.exec  # type: ignore[no-any-return]
        if type(src).__name__ == "LocalSource" and getattr(src, "host", None) == host:
            return local_run
    return None


def ray_for(sources: Sequence[Any], store: Any) -> stacks.RayTrace | None:
    """The Ray dashboard's traceback when the session watches one (--ray)."""
    url = next((s.url for s in sources if type(s).__name__ == "RaySource"), None)
    if not url:
        return None
    ips = {n.name: n.ip for n in store.ray_nodes}
    return stacks.ray_traceback(url, lambda h: ips.get(h) or socket.gethostbyname(h))


def targets_for(store: Any, host: str, pid: int | None = None) -> list[stacks.Target]:
    """The job's processes on ``host`` (or the one ``pid``) as the store knows them."""
    entry = store.hosts.get(host)
    plist = None if entry is None else entry.procs
    found: dict[int, stacks.Target] = {}
    if plist is not None:
        for j in plist.job_procs:
            found[j.pid] = stacks.Target(host, j.pid, j.role, j.title, j.user)
        for p in plist.procs:
            if p.visible and p.pid not in found:
                found[p.pid] = stacks.Target(host, p.pid, p.verl_role or p.role, p.cmd, p.user)
    if pid is not None:
        return [found.get(pid, stacks.Target(host, pid))]
    return [found[k] for k in sorted(found)]


class StacksScreen(Screen[None]):
    """The grouped stacks of one node's job processes (or of one process)."""

    HELP_TITLE = "Python stacks (t; py-spy pauses each process for a moment while it reads it)"

    DEFAULT_CSS = """
    StacksScreen #stacks-title { dock: top; height: 1; background: $primary; text-style: bold; }
    StacksScreen #stacks-body { padding: 0 1; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "reread", "Read again"),
    ]

    def __init__(self, store: Any, sources: Sequence[Any], host: str, pid: int | None = None):
        super().__init__()
        self.store = store
        self.sources = sources
        self.host = host
        self.pid = pid
        self.result: list[stacks.ProcessStack] | None = None

    def compose(self) -> ComposeResult:
        who = (
            f"pid {self.pid} on {self.host}" if self.pid else f"the job's processes on {self.host}"
        )
        yield Static(
            Text(f" Python stacks of {clean_text(who)} (Esc back, r read again)"), id="stacks-title"
        )
        with VerticalScroll():
            yield Static("", id="stacks-body")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.action_reread()

    def _body(self, text: Text | str) -> None:
        self.query_one("#stacks-body", Static).update(text)

    def action_reread(self) -> None:
        """Read the stacks (again)."""
        run = runner_for(self.sources, self.host)
        if run is None:
            self._body(
                Text(
                    f"No live connection to {self.host}: stacks are read on the node itself "
                    "(an SSH session, or this machine); a replay or Prometheus has no process "
                    "to read. From a shell: verl-top stacks HOST[:PID]",
                    style="italic",
                )
            )
            return
        targets = targets_for(self.store, self.host, self.pid)
        if not targets:
            self._body(Text(f"No process of the job seen on {self.host} yet.", style="italic"))
            return
        self._body(Text(f"Reading {len(targets)} process(es) with py-spy… {stacks.PAUSE_NOTE}."))
        self.run_worker(self._read(run, targets), exclusive=True, group="stacks")

    async def _read(self, run: Runner, targets: list[stacks.Target]) -> None:
        try:
            got = await stacks.collect_host(
                run, self.host, targets, ray_for(self.sources, self.store)
            )
        except Exception as exc:  # noqa: BLE001 - a node failing is said, never raised
            self._body(Text(f"Could not read stacks on {self.host}: {clean_text(str(exc))}"))
            return
        self.result = got
        self.store.stacks = got
        self._body(Text(stacks.render_text(got, stacks.SHOWN_FRAMES)))
