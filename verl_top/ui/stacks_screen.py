"""Key t on the node screen (and on a process screen): the Python stacks of the job's processes
on that node, grouped by role (verl_top/stacks.py), read through the node's own connection.

The screen says first that py-spy pauses each process briefly while it reads it; the result
goes to the store (``store.stacks``) so a snapshot taken afterwards carries it. Live sessions
only: a replay or Prometheus has no process to read.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top import stacks
from verl_top.node_exec import Runner, runner_for
from verl_top.sources.base import Source
from verl_top.stacks import ray_for, targets_for
from verl_top.store import Store
from verl_top.untrusted import clean_text


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
