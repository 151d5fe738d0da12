"""Key t on the node screen (and on a process screen): the Python stacks of the job's processes
on that node, grouped by role (verl_top/stacks.py), read through the node's own connection.

The screen says first that py-spy pauses each process briefly while it reads it; the result
goes to the store (``store.stacks``) so a snapshot taken afterwards carries it. Live sessions
only: a replay or Prometheus has no process to read.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top import stacks
from verl_top.node_exec import Runner, local_run
from verl_top.sources.base import Source
from verl_top.store import Store
from verl_top.untrusted import clean_text


def _made(module: str) -> bool:
    """Whether the session imported a source module: a class never imported has no instance
    (so a session without SSH or Ray does not pay their imports, ~0.2-0.3 s, on key t)."""
    return module in sys.modules


def runner_for(sources: Sequence[Source], host: str) -> Runner | None:
    """How to run a command on ``host``: its SSH source's connection, or this machine for the
    in-process agent; None when the session has no live source for it."""
    ssh, local = _made("verl_top.sources.ssh"), _made("verl_top.sources.local")
    if ssh:
        from verl_top.sources.ssh import SshSource  # noqa: PLC0415 - loaded already
    if local:
        from verl_top.sources.local import LocalSource  # noqa: PLC0415 - loaded already
    for src in sources:  # the first source of the host, in the session's order
        if ssh and isinstance(src, SshSource) and src.name == host:
            return src.exec
        if local and isinstance(src, LocalSource) and src.host == host:
            return local_run
    return None


def ray_for(sources: Sequence[Source], store: Store) -> stacks.RayTrace | None:
    """The Ray dashboard's traceback when the session watches one (--ray)."""
    if not _made("verl_top.sources.ray"):
        return None
    from verl_top.sources.ray import RaySource  # noqa: PLC0415 - loaded already

    url = next((s.url for s in sources if isinstance(s, RaySource)), None)
    if not url:
        return None
    ips = {n.name: n.ip for n in store.ray_nodes}
    return stacks.ray_traceback(url, lambda h: ips.get(h) or socket.gethostbyname(h))


def targets_for(store: Store, host: str, pid: int | None = None) -> list[stacks.Target]:
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

    def __init__(
        self, store: Store, sources: Sequence[Source], host: str, pid: int | None = None
    ) -> None:
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
