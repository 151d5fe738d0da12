"""A process of the job, opened with Enter on a process row (node screen, pane 4's process table).

Shows what verl-top knows of it: role, rank, state, the method it runs and for how long (the
agent's ``method_since``), user, parent, GPUs, CPU and memory now and over time (the store's
per-process history), its command line, and its environment read from the node with secrets
redacted. ``t``: its Python stack (py-spy). ``F9`` (like htop): send a signal (TERM, INT, KILL,
STOP, CONT) after a confirmation that names the pid, host and role; refused with ``--readonly``
and for a process the connection's user does not own. Nothing is sent without that confirmation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Static

from verl_top import signals
from verl_top.export.redact import redact_mapping
from verl_top.node_exec import Runner
from verl_top.progress import STATE_WORDS
from verl_top.roles import classify, process_map, trainer_method
from verl_top.ui.stacks_screen import runner_for
from verl_top.ui.widgets import sparkline
from verl_top.untrusted import clean_text

ENV_TIMEOUT_S = 10.0
ENV_SHOWN = 200  # variables listed (sorted by name)
SPARK_WIDTH = 40


def _age(seconds: float) -> str:
    """``45 s``, ``3 min 12 s``, ``2 h 5 min``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def parse_environ(raw: str) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``NAME=value``) as a mapping, sanitized."""
    out: dict[str, str] = {}
    for item in raw.split("\0"):
        name, sep, value = item.partition("=")
        if sep and name and len(out) < 4096:
            out[clean_text(name, 128)] = clean_text(value, 2048)
    return out


class ProcessScreen(Screen[None]):
    """One process of the job on one host."""

    HELP_TITLE = "Process screen (Enter on a process row of the node screen or pane 4)"

    DEFAULT_CSS = """
    ProcessScreen #proc-title { dock: top; height: 1; background: $primary; text-style: bold; }
    ProcessScreen VerticalScroll { padding: 0 1; }
    ProcessScreen .proc-block { height: auto; margin-top: 1; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("t", "stack", "Stack (py-spy)"),
        Binding("f9", "signal", "Signal", key_display="F9"),
        Binding("e", "environment", "Read environment"),
    ]

    def __init__(
        self, store: Any, sources: Sequence[Any], host: str, pid: int, readonly: bool = False
    ) -> None:
        super().__init__()
        self.store = store
        self.sources = list(sources)
        self.host = host
        self.pid = pid
        self.readonly = readonly
        self.environment: dict[str, str] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="proc-title")
        with VerticalScroll():
            yield Static("", id="proc-info", classes="proc-block")
            yield Static("", id="proc-history", classes="proc-block")
            yield Static("", id="proc-cmd", classes="proc-block")
            yield Static("", id="proc-env", classes="proc-block")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.refresh_screen(self.store, None)
        self.action_environment()

    # -- what the store knows ----------------------------------------------------------------

    def _records(self) -> tuple[Any, list[Any], Any]:
        """(the job-process record, the GPU process records, the mapped process) of the pid."""
        entry = self.store.hosts.get(self.host)
        plist = None if entry is None else entry.procs
        if plist is None:
            return None, [], None
        job = next((j for j in plist.job_procs if j.pid == self.pid), None)
        gpus = [p for p in plist.procs if p.pid == self.pid]
        mapped = next((m for m in process_map({self.host: plist}) if m.pid == self.pid), None)
        return job, gpus, mapped

    def role(self) -> str:
        """verl's name of the process ("process" when it is none of the job's known ones)."""
        _, _, mapped = self._records()
        return (mapped.verl_role if mapped is not None else "") or "process"

    def refresh_screen(self, store: Any, assessment: Any, force: bool = False) -> None:
        """Redraw from the store (the app's timer calls this while the screen is on top)."""
        self.store = store
        try:
            title_box = self.query_one("#proc-title", Static)
        except NoMatches:  # a timer tick between pushing the screen and composing it
            return
        job, gpus, mapped = self._records()
        role = self.role()
        title_box.update(
            Text(
                f" Process {self.pid} on {clean_text(self.host)} · {clean_text(role)} "
                "(Esc back · t stack · F9 signal)"
            )
        )
        self.query_one("#proc-info", Static).update(self._info(job, gpus, mapped))
        self.query_one("#proc-history", Static).update(self._history())
        title = job.title if job is not None else (gpus[0].cmd if gpus else "")
        cmd = Text("Command line\n", style="bold underline")
        cmd.append(clean_text(title, 4096) or "(not known: the agent has not listed it)")
        self.query_one("#proc-cmd", Static).update(cmd)

    def _info(self, job: Any, gpus: list[Any], mapped: Any) -> Text:
        text = Text()
        if job is None and not gpus:
            text.append(
                f"pid {self.pid} is not in {self.host}'s latest process list (it may have "
                "exited, or the agent has not listed it yet)",
                style="italic",
            )
            return text
        state = job.state if job is not None else ""
        word = STATE_WORDS.get(state, state) if state else "not reported"
        text.append("state ", style="bold")
        text.append(word, style="bold red" if state in ("T", "t", "D", "Z") else "")
        method = self._method(job, gpus)
        if method:
            text.append("  ·  method ", style="bold")
            text.append(method)
            since = job.method_since if job is not None else None
            if since is not None:
                now = self.store.now or time.time()
                text.append(f" for {_age(now - since)} (since the agent first saw it)")
        rank = None if mapped is None else mapped.rank
        text.append("\nrank ", style="bold")
        env_rank = (self.environment or {}).get("RANK", "")
        if rank is None and env_rank.isdigit():
            text.append(f"{env_rank} (RANK in its environment)")
        else:
            text.append("-" if rank is None else str(rank))
        text.append("  ·  user ", style="bold")
        text.append(clean_text((job.user if job is not None else gpus[0].user) or "-", 64))
        if job is not None and job.ppid is not None:
            text.append("  ·  parent ", style="bold")
            text.append(str(job.ppid))
        gpu_ids = sorted({p.gpu_index for p in gpus} | set(job.gpus if job else ()))
        mem = sum(p.used_mib or 0.0 for p in gpus) if gpus else None
        text.append("\nGPUs ", style="bold")
        text.append(",".join(map(str, gpu_ids)) or "none")
        text.append("  ·  GPU memory ", style="bold")
        text.append(_size(None if mem is None else mem * 2**20))
        cpu = job.cpu_pct if job is not None else gpus[0].cpu_pct
        rss = job.rss_bytes if job is not None else gpus[0].rss_bytes
        text.append("  ·  CPU ", style="bold")
        text.append("-" if cpu is None else f"{cpu:.0f} %")
        text.append("  ·  RSS ", style="bold")
        text.append(_size(rss))
        return text

    @staticmethod
    def _method(job: Any, gpus: list[Any]) -> str:
        """The method it runs now: the job record's (from the live title), else the title's."""
        if job is not None and job.method:
            return trainer_method(job.method)
        title = job.title if job is not None else (gpus[0].cmd if gpus else "")
        return classify(title).method

    def _history(self) -> Text:
        points = self.store.proc_history.get(self.host, self.pid)
        text = Text("Over time ", style="bold underline")
        text.append(f"({len(points)} process listings)\n", style="dim")
        cpu = [p.cpu_pct for p in points if p.cpu_pct is not None]
        mem = [p.gpu_mem_mib for p in points if p.gpu_mem_mib is not None]
        rss = [float(p.rss_bytes) for p in points if p.rss_bytes is not None]
        for label, values, unit in (("CPU %", cpu, "%"), ("GPU mem", mem, "MiB"), ("RSS", rss, "")):
            text.append(f"{label:<8}")
            if not values:
                text.append("no data yet\n", style="dim")
                continue
            top = max(max(values), 100.0 if unit == "%" else 1.0)
            text.append(sparkline(values, SPARK_WIDTH, top))
            last = values[-1]
            shown = (
                f"{last:.0f} %"
                if unit == "%"
                else (_size(last * 2**20) if unit == "MiB" else _size(last))
            )
            text.append(f"  now {shown}, max ")
            text.append(
                f"{max(values):.0f} %"
                if unit == "%"
                else (_size(max(values) * 2**20) if unit == "MiB" else _size(max(values)))
            )
            text.append("\n")
        return text

    # -- actions -------------------------------------------------------------------------------

    def runner(self) -> Runner | None:
        """The node's live connection (or this machine), None in a replay."""
        return runner_for(self.sources, self.host)

    def action_environment(self) -> None:
        """e: read the process's environment from the node (secrets redacted)."""
        run = self.runner()
        box = self.query_one("#proc-env", Static)
        if run is None:
            box.update(Text("Environment: needs a live session on the node", style="dim"))
            return
        box.update(Text("Environment: reading…", style="dim"))
        self.run_worker(self._read_env(run), exclusive=True, group="env")

    async def _read_env(self, run: Runner) -> None:
        res = await run(["cat", f"/proc/{signals.check_pid(self.pid)}/environ"], ENV_TIMEOUT_S)
        box = self.query_one("#proc-env", Static)
        text = Text("Environment (secrets redacted)\n", style="bold underline")
        if res.status != 0:
            why = clean_text(res.stderr.strip() or f"exit status {res.status}", 300)
            text.append(f"not readable: {why} (only its owner and root may read it)", style="dim")
            box.update(text)
            return
        env = redact_mapping(parse_environ(res.stdout))
        self.environment = env
        self.refresh_screen(self.store, None)  # the rank may come from RANK
        for name in sorted(env)[:ENV_SHOWN]:
            text.append(f"{name}", style="bold")
            text.append(f"={env[name]}\n")
        if len(env) > ENV_SHOWN:
            text.append(f"… {len(env) - ENV_SHOWN} more", style="dim")
        box.update(text)

    def action_stack(self) -> None:
        """t: this process's Python stack (py-spy pauses it for a moment)."""
        from verl_top.ui.stacks_screen import StacksScreen

        self.app.push_screen(StacksScreen(self.store, self.sources, self.host, self.pid))

    def action_signal(self) -> None:
        """F9: choose a signal and confirm; refused with --readonly or without a connection."""
        if self.readonly:
            self.notify(signals.READONLY, severity="warning", markup=False)
            return
        run = self.runner()
        if run is None:
            self.notify(
                "signals need a live session on the node (SSH or this machine)", markup=False
            )
            return
        self.app.push_screen(SignalScreen(run, self.host, self.pid, self.role()))


class SignalScreen(ModalScreen[str]):
    """Pick a signal, then Send: the confirmation names the pid, host and role. The owner is
    checked first; Cancel (the default focus) and Esc send nothing."""

    HELP_TITLE = "Signal dialog (F9; nothing is sent until Send; refused with --readonly)"

    DEFAULT_CSS = """
    SignalScreen { align: center middle; }
    SignalScreen > Vertical { width: 76; height: auto; border: thick $warning; padding: 1 2; }
    SignalScreen Horizontal { height: auto; margin-top: 1; }
    SignalScreen Button { margin-right: 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, run: Runner, host: str, pid: int, role: str) -> None:
        super().__init__()
        self.runner_fn = run
        self.host = host
        self.pid = pid
        self.role = role
        self.chosen = "TERM"
        self.allowed: bool | None = None  # None until the node said who owns the process
        self.reason = ""
        self.outcome = ""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", id="sig-text")
            with Horizontal():
                for name in signals.SIGNALS:
                    yield Button(name, id=f"sig-{name}", variant="default")
            with Horizontal():
                yield Button("Send", id="sig-send", variant="error", disabled=True)
                yield Button("Cancel", id="sig-cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#sig-cancel", Button).focus()
        self._text("checking who owns the process…")
        self.run_worker(self._check(), exclusive=True, group="signal")

    def _text(self, note: str = "") -> None:
        text = Text()
        text.append(f"Send SIG{self.chosen} to pid {self.pid} on {self.host}", style="bold")
        text.append(f" ({clean_text(self.role)})?\n", style="bold")
        text.append(f"SIG{self.chosen}: {signals.SIGNALS[self.chosen]}.\n")
        text.append("Nothing is sent until you press Send.", style="dim")
        if note:
            text.append(f"\n{note}", style="italic")
        self.query_one("#sig-text", Static).update(text)

    async def _check(self) -> None:
        perm = await signals.permission(self.runner_fn, self.host, self.pid)
        self.allowed, self.reason = perm.allowed, perm.reason
        self.query_one("#sig-send", Button).disabled = not perm.allowed
        self._text(self.reason)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """A signal button picks it; Send sends it (once allowed); Cancel closes."""
        bid = event.button.id or ""
        event.stop()
        if bid.startswith("sig-") and bid[4:] in signals.SIGNALS:
            self.chosen = bid[4:]
            self._text(self.reason)
        elif bid == "sig-send" and self.allowed:
            self.run_worker(self._send(), exclusive=True, group="signal")
        elif bid == "sig-cancel":
            self.dismiss("")

    async def _send(self) -> None:
        self.query_one("#sig-send", Button).disabled = True
        error = await signals.send(self.runner_fn, self.host, self.pid, self.chosen)
        self.outcome = error or f"sent SIG{self.chosen} to pid {self.pid} on {self.host}"
        self.app.notify(self.outcome, severity="error" if error else "information", markup=False)
        self.dismiss(self.outcome)

    def action_cancel(self) -> None:
        """Esc: close, sending nothing."""
        self.dismiss("")
