"""Key p: confirm, run NCCL bandwidth probes on the session's hosts, feed results to the pipeline.

The confirmation names the host, its GPUs (and which already run compute processes), the
expected duration, and warns that a probe perturbs training. Run / Run with --force start
``run_local_probe`` as a worker of this screen with a progress line; Esc, ``c`` or Cancel cancel
it, and ``run_local_probe`` kills the probe's whole process group before the cancellation
completes, so the screen closes only once nothing is left running. The result goes through
``inputs.pipeline.emit`` (store, recording, listeners) and the app shows pane 2.

Remote nodes (SSH sources): each is probed alone (intra-node, all its GPUs) over its own SSH
connection settings, concurrently with the local probe; cancelling closes every channel, and the
remote probes stop themselves when their stdin closes (see docs/nccl.md, "Remote probes").
Replays and the demo have no machine to probe: the key says probes need a live session.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Static
from textual.worker import Worker

from verl_top.model import NodeTopology, ProbeResult
from verl_top.ui.running_app import app_palette
from verl_top.untrusted import clean_text

if TYPE_CHECKING:
    from verl_top.sources.ssh import SshSource
    from verl_top.ui.app import VerlTopApp

# runner(force) -> the probe's result(s); the app's default probes the plan's hosts.
ProbeRunner = Callable[[bool], Awaitable["ProbeResult | list[ProbeResult]"]]
PROBE_TIMEOUT_S = 300.0
EXPECTED = "about 15-60 s (starting one process per GPU and NCCL init dominate)"
REMOTE_NOTE = "each probed alone over SSH, all its GPUs, with the agent's python3"
# Two or more remote hosts: afterwards one run across all of them (the network between them).
INTER_NOTE = (
    "then once across all of them, as many ranks per node as the node with the fewest GPUs has"
)
WARNING = (
    "A probe perturbs training: it moves up to 1 GiB per collective over NVLink/PCIe and takes "
    "GPU memory while it runs. GPUs running compute processes make the probe refuse unless "
    "forced."
)
NEEDS_LIVE = "probes need a live session: a replay has no machine to probe"


@dataclass
class ProbePlan:
    """What a probe from here would cover."""

    local_host: str | None = None  # None: no local source, nothing to run here
    gpus: list[str] = field(default_factory=list)  # "0 NVIDIA H200" per GPU of the local host
    busy: list[int] = field(default_factory=list)  # local GPU indices with compute processes
    remote_hosts: list[str] = field(default_factory=list)
    remote_sources: list[SshSource] = field(default_factory=list)  # (spec, settings) of each
    inventory: dict[str, NodeTopology] = field(default_factory=dict)  # host -> agent's topo
    progress: dict[str, str] = field(default_factory=dict)  # host -> latest progress line
    remote_gpus: dict[str, int] = field(default_factory=dict)  # host -> GPUs in its hello
    local_no_gpu: str = ""  # why this machine cannot be probed (its agent found no GPU)

    @property
    def local_runnable(self) -> bool:
        """A local probe can run: there is a local source and its machine has GPUs."""
        return self.local_host is not None and not self.local_no_gpu

    @property
    def can_run(self) -> bool:
        """Something to probe: the local GPUs or a remote host."""
        return self.local_runnable or bool(self.remote_sources)


def plan_probe(app: VerlTopApp) -> ProbePlan:
    """Local and remote hosts of the app's sources, the local GPUs and the busy ones."""
    from verl_top.sources.local import LocalSource
    from verl_top.sources.ssh import SshSource

    plan = ProbePlan()
    for src in app.inputs.sources:
        if isinstance(src, LocalSource):
            plan.local_host = src.host
        elif isinstance(src, SshSource):
            plan.remote_hosts.append(src.name)
            plan.remote_sources.append(src)
    plan.inventory = dict(app.store.node_topology)
    for name in plan.remote_hosts:
        remote = app.store.hosts.get(name)
        if remote is not None and remote.hello is not None:
            plan.remote_gpus[name] = len(remote.hello.gpus)
    entry = app.store.hosts.get(plan.local_host) if plan.local_host else None
    if entry is not None:
        if entry.hello is not None:
            plan.gpus = [f"{g.index} {g.name}".strip() for g in entry.hello.gpus]
        elif entry.gpus:
            plan.gpus = [str(i) for i in sorted(entry.gpus)]
        if entry.procs is not None:
            plan.busy = sorted({p.gpu_index for p in entry.procs.procs})
        if entry.state == "no_gpu" or (entry.hello is not None and not entry.hello.gpus):
            plan.local_no_gpu = clean_text(entry.reason) or "the agent found no GPU"
    return plan


def plan_runner(plan: ProbePlan) -> ProbeRunner:
    """all_reduce over every GPU of the local host and of each remote host, all at once."""

    async def run(force: bool) -> list[ProbeResult]:
        from verl_top.nccl.probe import probe_ssh_hosts, run_local_probe

        jobs: list[Awaitable[ProbeResult | list[ProbeResult]]] = []
        local = plan.local_host
        if plan.local_runnable and local is not None:  # runnable: there is a local host
            jobs.append(
                run_local_probe(
                    "all_reduce",
                    force=force,
                    timeout=PROBE_TIMEOUT_S,
                    on_progress=lambda text: plan.progress.__setitem__(local, text),
                )
            )
        for src in plan.remote_sources:
            jobs.append(
                probe_ssh_hosts(
                    [src.spec],
                    src.settings,
                    force=force,
                    timeout=PROBE_TIMEOUT_S,
                    # Judged like a parsed file, against the nodes' inventory; progress per size.
                    inventory=plan.inventory,
                    on_progress=lambda host, text: plan.progress.__setitem__(host, text),
                )
            )
        results: list[ProbeResult] = []
        for done in await asyncio.gather(*jobs):  # cancelling waits for every probe to stop
            results += done if isinstance(done, list) else [done]
        if len(plan.remote_sources) >= 2:  # after the per-node runs: never two probes per GPU
            results.append(await _inter_probe(plan, force))
        return results

    return run


async def _inter_probe(plan: ProbePlan, force: bool) -> ProbeResult:
    """One all_reduce across every remote host, ranks per node from their agents' GPU counts."""
    from verl_top.nccl.probe import probe_ssh_hosts, ranks_per_node

    names = [src.name for src in plan.remote_sources]
    nprocs, why = ranks_per_node({n: plan.remote_gpus.get(n, 0) for n in names})
    if nprocs <= 0:
        return ProbeResult(
            host=names[0],
            t=time.time(),
            tool="torch",
            scope="inter",
            hosts=names,
            ok=False,
            error=f"no cross-node probe: {why}",
        )
    first = plan.remote_sources[0]
    [result] = await probe_ssh_hosts(
        [src.spec for src in plan.remote_sources],
        first.settings,
        scope="inter",
        nprocs=nprocs,
        master_addr=first.spec.host,  # the first node's address as the monitor reaches it
        force=force,
        timeout=PROBE_TIMEOUT_S,
        inventory=plan.inventory,
        on_progress=lambda host, text: plan.progress.__setitem__(f"across {host}…", text),
    )
    return result


def gpus_text(plan: ProbePlan) -> str:
    """The local GPUs in one line."""
    if not plan.gpus:
        return "GPUs: not reported yet (the probe uses every GPU it can see)"
    names = {g.split(" ", 1)[1] for g in plan.gpus if " " in g}
    model = f" × {names.pop()}" if len(names) == 1 else ""
    text = (
        f"GPUs: {len(plan.gpus)}{model} (indices {', '.join(g.split(' ')[0] for g in plan.gpus)})"
    )
    if plan.busy:
        text += (
            f"; GPU {', '.join(map(str, plan.busy))} run compute processes now: "
            "Run will refuse them, Run with --force probes anyway"
        )
    return text


class ProbeScreen(ModalScreen["list[ProbeResult] | None"]):
    """Confirmation, progress and cancellation of the bandwidth probes of one key press."""

    DEFAULT_CSS = """
    ProbeScreen { align: center middle; }
    ProbeScreen > Vertical {
        width: 96; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    ProbeScreen #probe-progress { margin-top: 1; color: $accent; }
    ProbeScreen Horizontal { height: auto; margin-top: 1; }
    ProbeScreen Button { margin-right: 2; }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("c", "cancel", "Cancel", show=False),
    ]

    def __init__(
        self,
        plan: ProbePlan,
        runner: ProbeRunner,
        emit: Callable[[ProbeResult], None],
    ) -> None:
        super().__init__()
        self.plan = plan
        self.runner = runner
        self.emit = emit
        self.state = "confirm"  # confirm | running | cancelling | done
        self._started = 0.0
        self._worker: Worker[None] | None = None
        self._ticker: Timer | None = None

    def compose(self) -> ComposeResult:
        plan = self.plan
        # Host and GPU names are foreign text: plain Text, never markup.
        text = Text("NCCL bandwidth probe (all_reduce, 1 MiB - 1 GiB)\n\n", style="bold")
        if plan.local_host is not None:
            text.append("host: ")
            text.append(plan.local_host, style="bold")
            text.append(" (this machine)\n")
            if plan.local_no_gpu:  # said once, instead of offering Run and failing
                text.append(f"no GPU to probe here: {plan.local_no_gpu}", style="bold")
                text.append("" if plan.remote_sources else " (Run is disabled)", style="bold")
                text.append("\n")
            else:
                text.append(gpus_text(plan) + "\n")
                text.append(
                    f"expected duration: {EXPECTED}; stops itself after {PROBE_TIMEOUT_S:.0f} s\n"
                )
        else:
            text.append("no local source: this session does not monitor this machine\n")
        if plan.remote_hosts:
            shown = ", ".join(plan.remote_hosts[:8])
            more = f" and {len(plan.remote_hosts) - 8} more" if len(plan.remote_hosts) > 8 else ""
            note = REMOTE_NOTE + (f"; {INTER_NOTE}" if len(self.plan.remote_hosts) >= 2 else "")
            text.append(f"remote hosts: {shown}{more} ({note})\n")
            if plan.local_host is None:
                text.append(f"stops itself after {PROBE_TIMEOUT_S:.0f} s\n")
        text.append("\n")
        text.append(WARNING, style=f"bold {app_palette(self).get('warning', 'yellow')}")
        can_run = plan.can_run
        with Vertical():
            yield Static(text, id="probe-text")
            yield Static("", id="probe-progress")
            with Horizontal():
                yield Button("Run", id="probe-run", variant="warning", disabled=not can_run)
                yield Button(
                    "Run with --force", id="probe-force", variant="error", disabled=not can_run
                )
                yield Button("Cancel", id="probe-cancel", variant="default")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Run, Run with --force, Cancel."""
        event.stop()
        if event.button.id == "probe-run":
            self.start(force=False)
        elif event.button.id == "probe-force":
            self.start(force=True)
        else:
            self.action_cancel()

    def start(self, force: bool) -> None:
        """Start the probe worker (once)."""
        if self.state != "confirm" or not self.plan.can_run:
            return
        self.state = "running"
        self._started = time.monotonic()
        self.query_one("#probe-run", Button).disabled = True
        self.query_one("#probe-force", Button).disabled = True
        self.query_one("#probe-cancel", Button).label = "Cancel probe"
        self._tick()
        self._ticker = self.set_interval(0.5, self._tick)
        self._worker = self.run_worker(self._probe(force), group="probe", exit_on_error=False)

    def _tick(self) -> None:
        elapsed = time.monotonic() - self._started
        verb = "stopping the probe…" if self.state == "cancelling" else "probing…"
        lines = "".join(
            f"\n{host}: {text}" for host, text in sorted(self.plan.progress.items())[:8]
        )
        self.query_one("#probe-progress", Static).update(
            Text(
                f"{verb} {elapsed:.0f} s of ~15-60 s (limit {PROBE_TIMEOUT_S:.0f} s) · "
                "Esc / c cancels and kills the probe's processes" + lines
            )
        )

    async def _probe(self, force: bool) -> None:
        try:
            got = await self.runner(force)
            results = got if isinstance(got, list) else [got]
        except asyncio.CancelledError:
            # The probes have killed their process groups / closed their channels by now.
            self._finish(None)
            raise
        except Exception as exc:  # noqa: BLE001 - a failed probe is a result, not a crash
            results = [
                ProbeResult(
                    host=self.plan.local_host or socket.gethostname(),
                    t=time.time(),
                    tool="torch",
                    ok=False,
                    error=f"{type(exc).__name__}: {exc}",
                )
            ]
        for result in results:
            self.emit(result)
        self._finish(results)

    def _finish(self, result: list[ProbeResult] | None) -> None:
        self.state = "done"
        if self._ticker is not None:
            self._ticker.stop()
        self.app.call_later(self.dismiss, result)

    def action_cancel(self) -> None:
        """Esc / c / Cancel: close, or cancel the running probe (closes once it is stopped)."""
        if self.state == "confirm":
            self.state = "done"
            self.dismiss(None)
        elif self.state == "running" and self._worker is not None:
            self.state = "cancelling"
            self._tick()
            self._worker.cancel()


def probe_summary(result: ProbeResult) -> str:
    """One line for the notification after a probe."""
    if not result.ok:
        return f"probe failed on {result.host}: {result.error}"
    if result.nranks == 1:
        return f"probe on {result.host}: 1 GPU, no bus to measure"
    text = f"probe on {result.host}: {result.nranks} ranks, max busbw "
    text += "—" if result.busbw_max_gbs is None else f"{result.busbw_max_gbs:.1f} GB/s"
    if result.expected_gbs:
        text += f" of ~{result.expected_gbs:.0f} expected"
        if result.busbw_max_gbs is not None:
            text += f" ({result.busbw_max_gbs / result.expected_gbs:.0%})"
    return text


def open_probe(app: VerlTopApp) -> None:
    """Key p: the confirmation screen in a live session, else say why not."""
    if isinstance(app.screen, ProbeScreen):
        return
    if app.inputs.mode != "LIVE" or app.inputs.replay is not None:
        app.notify(NEEDS_LIVE, severity="warning", markup=False)
        return
    plan = plan_probe(app)
    runner = app.probe_runner or plan_runner(plan)

    def done(results: list[ProbeResult] | None) -> None:
        if not results:
            return
        app.show_step(2)
        app.refresh_now()
        ok = all(r.ok for r in results)
        text = "\n".join(probe_summary(r) for r in results)
        app.notify(text, severity="information" if ok else "error", markup=False)

    app.push_screen(ProbeScreen(plan, runner, app.inputs.pipeline.emit), done)
