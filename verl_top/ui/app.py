"""The verl-top Textual app: header, five step panes, findings screen, replay keys.

Data flow: sources (async workers) -> ``inputs.pipeline.emit`` -> store. A timer (``refresh``
seconds) asks the Monitor (verl_top/monitor.py, the same one ``diagnose`` runs) for its
Assessment, redraws the header, and refreshes only the visible pane: hidden tabs cost nothing.
When every source of a finite input (a replay) has ended, the monitor settles: the app then
says exactly what ``diagnose`` says about the same data.
Tests build the app with ``live=False`` (no sources, no timers) and call ``refresh_now()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.color import Color
from textual.screen import Screen
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Input, TabbedContent, TabPane, Tabs

from verl_top.assessment import Assessment
from verl_top.diagnosis.engine import Engine
from verl_top.hang_stacks import HangStacks
from verl_top.inputs import Inputs
from verl_top.long_lived import LongLivedHeap
from verl_top.monitor import LIVE_PERIOD_S, Monitor
from verl_top.sources.base import Source
from verl_top.stacks import PAUSE_NOTE
from verl_top.store_summary import SummaryCache
from verl_top.ui.filter_bar import FilterBar
from verl_top.ui.findings_screen import FindingsScreen
from verl_top.ui.header import VerlTopHeader
from verl_top.ui.node_screen import NodeScreen, row_target
from verl_top.ui.panes import PANE_CLASSES, Pane, ThroughputPane
from verl_top.ui.process_screen import ProcessScreen
from verl_top.ui.snapshot_action import SnapshotExporter
from verl_top.ui.ui_state import UiSettingsSaver
from verl_top.ui.widgets import StepTabs, severity_class

if TYPE_CHECKING:
    from rich.console import RenderableType

    from verl_top.ui.probe_screen import ProbeRunner  # imported on key p only

MIN_STALE_S = 5.0
SLICED_SUMMARY_GPUS = 1024  # from this many GPUs a tick's summary is made in slices ...
SUMMARY_SLICE = 512  # ... of this many GPUs a turn of the event loop (~3 ms each)
# History windows that + and - step through (seconds).
WINDOW_STEPS = (30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
# Footer groups: one label for a pair of keys ("> < Speed").
SPEED_KEYS = Binding.Group("Speed", compact=True)
WINDOW_KEYS = Binding.Group("Window", compact=True)


# Short tab names: the five tabs fit an 80-column terminal (full names head each pane's help).
TAB_NAMES = {1: "Throughput", 2: "Communication", 3: "Dataflow", 4: "Mapping", 5: "Config"}


# Tab marks: the lead's step, and every other step that holds findings.
LEAD_MARK, FINDINGS_MARK = "● ", "• "


def tab_label(step: int, bottleneck: bool, findings: bool = False) -> str:
    """Label of a step's tab: the bottleneck's tab carries a ●, a tab with findings a •."""
    mark = LEAD_MARK if bottleneck else FINDINGS_MARK if findings else ""
    return f"{mark}{step} {TAB_NAMES[step]}"


class VerlTopApp(App):
    """Live monitor of a verl job: one tab per step of the five-step method."""

    CSS_PATH = "verl_top.tcss"
    TITLE = "verl-top"
    # The focus model in one line (docs/keys.md): digits, d, ?, /, q and Ctrl+C work from every
    # screen and whatever has focus (priority bindings; while the filter bar is typed into they
    # type instead), Enter opens the highlighted node, Esc backs out one level or clears a filter.
    BINDINGS = [
        Binding("1", "show_tab(1)", "Throughput", show=False, priority=True),
        Binding("2", "show_tab(2)", "Comm", show=False, priority=True),
        Binding("3", "show_tab(3)", "Dataflow", show=False, priority=True),
        Binding("4", "show_tab(4)", "Mapping", show=False, priority=True),
        Binding("5", "show_tab(5)", "Config", show=False, priority=True),
        # Footer order = importance: an 80-column footer shows the first ones.
        Binding("d", "findings", "Diagnosis", priority=True),
        Binding("slash", "filter", "Filter", key_display="/", priority=True),
        Binding("question_mark", "help", "Help", key_display="?", priority=True),
        Binding("q", "quit", "Quit", priority=True),
        Binding("s", "snapshot", "Snapshot"),
        Binding("p", "probe", "Probe"),
        Binding("o", "sort", "Sort"),
        # htop/nvtop habits (docs/keys.md): F1 help, F10 quit, F6 sort, j/k down/up. Same
        # actions and descriptions as ? q o, so the help lists them on the same line.
        Binding("f1", "help", "Help", key_display="F1", show=False, priority=True),
        Binding("f10", "quit", "Quit", key_display="F10", show=False, priority=True),
        Binding("f6", "sort", "Sort", key_display="F6", show=False),
        Binding("j", "nav('down')", "Down (like ↓)", show=False),
        Binding("k", "nav('up')", "Up (like ↑)", show=False),
        Binding("h", "hosts", "Show / fold the host table", show=False),  # the host line says so
        Binding("O", "sort_reverse", "Reverse sort", key_display="O", show=False),
        Binding("space", "toggle_pause", "Pause"),
        Binding("n", "step_replay", "Step", show=False),
        Binding(
            "greater_than_sign", "speed(2.0)", "Faster replay", key_display=">", group=SPEED_KEYS
        ),
        Binding("less_than_sign", "speed(0.5)", "Slower replay", key_display="<", group=SPEED_KEYS),
        Binding("plus", "window(1)", "Wider history window", key_display="+", group=WINDOW_KEYS),
        Binding(
            "minus", "window(-1)", "Narrower history window", key_display="-", group=WINDOW_KEYS
        ),
        Binding("escape", "back", "Back / clear filter", show=False),
        Binding("ctrl+c", "quit_now", "Quit", show=False, priority=True),
        Binding("ctrl+q", "quit_now", "Quit", show=False, priority=True),
    ]
    # Keys that work from any screen (priority bindings) and what they yield to.
    GLOBAL_ACTIONS = ("show_tab", "findings", "filter", "help", "quit")
    REPLAY_ACTIONS = ("toggle_pause", "step_replay", "speed")

    def __init__(
        self,
        inputs: Inputs,
        refresh: float = 1.0,
        theme_name: str | None = None,
        engine: Engine | None = None,
        live: bool = True,
        assessment: Assessment | None = None,
        readonly: bool = False,
        settings_file: Path | None = None,
        sort: tuple[str, bool] | None = None,
    ) -> None:
        super().__init__()
        # Theme, sort and window chosen here are saved to ``settings_file`` (None: not saved).
        self.ui_settings = UiSettingsSaver(self, settings_file)
        self._initial_sort = sort
        self.inputs = inputs
        self.readonly = readonly  # --readonly: no signal is ever sent (process screen's F9)
        self.store = inputs.store
        self.refresh_s = max(0.05, float(refresh))
        self.live = live
        live_period = LIVE_PERIOD_S if live and inputs.mode == "LIVE" else 0.0
        # Live, the engine runs off the event loop (a worker thread): no frame waits for it.
        self.monitor = Monitor(inputs, engine, period_s=live_period, background=live_period > 0)
        # What a live session holds for its life is frozen out of full collections once it
        # settled (verl_top/long_lived.py): a full pass over it was the slowest frames.
        self.long_lived = LongLivedHeap()
        self._freeze_waits = False  # a freeze waits for the running evaluation to end
        # A fixed assessment (headless screenshots) is shown as it is; else the monitor's.
        self._fixed = assessment
        self.assessment: Assessment = assessment or self.monitor.assessment
        self._sources_left = len(inputs.sources) if live else 0
        self.summaries = SummaryCache()  # one per-tick summary of the store, shared by the panes
        self._marked_step: list[tuple[str, str | None]] | None = None  # (label, level) per tab
        self._replay_t0: float | None = None
        self._notes_seen = 0
        self._engine_failed = False
        self._had_gpus: bool | None = None  # the footer shows o Sort only with GPUs
        self._palette: dict[str, str] | None = None
        self._header: VerlTopHeader | None = None
        self._tabs: TabbedContent | None = None
        self._panes: dict[int, Pane] = {}
        self._theme_name = theme_name
        self.host_filter = ""  # key /: substring of host or host/GPU (panes 1 and 4)
        self.refresh_count = 0
        self.title = inputs.title
        self.snapshots = SnapshotExporter(self)
        self.probe_runner: ProbeRunner | None = None  # key p: tests inject a fake
        self.hang_stacks = HangStacks(inputs.store, inputs.sources)  # read once per hang

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield VerlTopHeader(id="header")
        with StepTabs(id="tabs", initial="pane-1"):
            for step, cls in enumerate(PANE_CLASSES, start=1):
                with TabPane(tab_label(step, False), id=f"pane-{step}"):
                    yield cls(id=f"step{step}")
        yield FilterBar(id="filter")
        yield Footer(show_command_palette=False)  # ctrl+p still opens it; ? lists it

    def on_mount(self) -> None:
        from verl_top.ui.themes import install_themes

        # Built-in and user themes (validated) join the palette's theme picker.
        for error in install_themes(self, self._theme_name):
            self.notify(error, severity="error", timeout=10, markup=False)
        # Keep direct references: the timer keeps ticking while another screen (d) is on top,
        # and app-level queries would search that screen instead of the main one.
        self._header = self.query_one(VerlTopHeader)
        self._tabs = self.query_one(TabbedContent)
        self._panes = {step: self.query_one(f"#step{step}", Pane) for step in range(1, 6)}
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.ui_settings.start(self.theme)
        if self._initial_sort is not None:  # the order saved last time
            self.throughput.set_sort(*self._initial_sort)
        self.throughput.on_sort_change = self._on_sort_change
        if self.live:
            for src in self.inputs.sources:
                self.run_worker(
                    self._run_source(src),
                    name=src.name,
                    group="sources",
                    exit_on_error=False,
                )
            self.set_interval(self.refresh_s, self._tick, name="refresh")
            self.long_lived.start()  # fewer, larger young passes while it runs
        self.call_after_refresh(self.refresh_now)
        # Enter opens the highlighted node at once. Focused now, not after a refresh: a late
        # focus would move the tabs back to pane 1 after a first digit key.
        self.focus_main()

    def on_unmount(self) -> None:
        """Stop the diagnosis worker (an evaluation still running finishes first) and give the
        frozen objects and the collector's thresholds back."""
        self.monitor.close()
        self.long_lived.release()

    async def _run_source(self, src: Source) -> None:
        """Run one source; a failure becomes a note and a notification, never a crash."""
        name = src.name
        try:
            await src.run(self.inputs.pipeline.emit)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any source bug must not take the UI down
            message = f"source {name} failed: {type(exc).__name__}: {exc}"
            self.store.notes.append(message)
            self.notify(message, severity="error", timeout=10, markup=False)
        self._sources_left -= 1
        if self._sources_left == 0 and self.inputs.finite and self._fixed is None:
            # A replay played out: the final word, as `diagnose` gives it on the same data.
            self.assessment = self.monitor.settle()
            self.refresh_now()

    # -- helpers ---------------------------------------------------------------------------

    @property
    def throughput(self) -> ThroughputPane:
        """Pane 1."""
        pane = self._panes[1]
        assert isinstance(pane, ThroughputPane)
        return pane

    def pane(self, step: int) -> Pane:
        """The pane of ``step`` (1-5)."""
        return self._panes[step]

    def visible_step(self) -> int:
        """The step whose tab is shown."""
        active = (self._tabs.active if self._tabs is not None else "") or "pane-1"
        return int(active.rsplit("-", 1)[1])

    def palette(self) -> dict[str, str]:
        """Theme colours as hex for Rich renderables: error, warning, success, accent, muted."""
        if self._palette is None:
            theme_vars = self.get_css_variables()

            def pick(name: str, fallback: str) -> str:
                try:
                    return Color.parse(theme_vars.get(name, fallback)).hex
                except Exception:  # noqa: BLE001 - odd theme values fall back to a safe colour
                    return fallback

            fg = Color.parse(pick("foreground", "#e0e0e0"))
            bg = Color.parse(pick("background", "#000000"))
            self._palette = {
                "error": pick("error", "#ff4444"),
                "warning": pick("warning", "#ffaa00"),
                "success": pick("success", "#44bb44"),
                "accent": pick("accent", "#4488ff"),
                "muted": fg.blend(bg, 0.55).hex,
            }
        return self._palette

    def _on_sort_change(self) -> None:
        pane = self.throughput
        self.ui_settings.save(sort=pane.sort_key, sort_reverse=pane.sort_reverse)
        self.refresh_now()

    def _on_theme_changed(self, theme: Theme) -> None:
        self.ui_settings.theme_changed(theme.name)
        self._palette = None
        for step in range(1, 6):
            pane = self.pane(step)
            pane.force_next()
            pane.findings.show(None)  # drop the cached verdict rendering
        self.refresh_now()

    # -- refresh ---------------------------------------------------------------------------

    async def _tick(self) -> None:
        """The refresh timer. From ``SLICED_SUMMARY_GPUS`` GPUs on, with pane 1 shown, the
        summary of every GPU it sorts and counts by is made first, in slices of a turn of the
        event loop each, and the refresh draws with it: at 4096 GPUs that summary was half of
        a ~50 ms tick, and a tick holds the loop (key presses, frames) while it runs."""
        summary = None
        store = self.store
        if (
            store.gpu_count() >= SLICED_SUMMARY_GPUS
            and self._pane1_shown()
            and not self.summaries.fresh(store)
        ):
            summary = await self.summaries.compute_sliced(store, SUMMARY_SLICE)
            if not summary.covers(store):  # hosts or GPUs came or went meanwhile
                summary = None
        self.summaries.pin(summary)
        try:
            self.refresh_now()
        finally:
            self.summaries.pin(None)

    def _pane1_shown(self) -> bool:
        """Pane 1 is on screen (not another tab, not a node or process screen on top)."""
        return (
            bool(self.screen_stack)
            and self.screen is self.screen_stack[0]
            and (self.visible_step() == 1)
        )

    def refresh_now(self) -> None:
        """One tick: staleness (live), diagnosis when the store changed, header, visible pane."""
        if self._header is None or self._tabs is None:
            return  # not mounted yet
        if not self.screen_stack:
            # Shutting down: a last timer tick or a source ending after the screens closed
            # would otherwise fail on self.screen (ScreenStackError) and panic the app.
            return
        store = self.store
        # An evaluation in the worker thread waits while this frame is drawn (redraw opens the
        # gate once it is painted): sharing the GIL, both took twice as long.
        self.monitor.gate.close()
        if self.live and self.inputs.mode == "LIVE":
            store.mark_stale(stale_after=max(MIN_STALE_S, 3 * self.refresh_s))
        if self._fixed is None:
            self.assessment = self.monitor.assess()
            if self.monitor.failure and not self._engine_failed:
                self._engine_failed = True  # keep the last verdict, say why once
                self.notify(self.monitor.failure, severity="error", markup=False)
            if self.live:
                self._read_hang_stacks()
        has_gpus = bool(store.gpu_count())
        if has_gpus != self._had_gpus:  # the footer's GPU-table keys come or go
            self._had_gpus = has_gpus
            self.refresh_bindings()
        replay = self.inputs.replay
        if replay is not None and self._replay_t0 is None and replay.position:
            self._replay_t0 = replay.position
        self.redraw()
        self._show_notes()
        self.refresh_count += 1
        due = self.live and self.long_lived.due(len(store.hosts) + store.gpu_count())
        if due and not self._freeze_waits:  # (one already waiting freezes for this one)
            if not self.monitor.evaluating:  # else as it ends (its lists are short-lived)
                self.call_after_refresh(self.long_lived.freeze)  # after the frame
            else:
                # At 16384 GPUs an evaluation starts as the last one ends: one was running at
                # every tick, and the heap was never frozen (full passes of 60-370 ms).
                self._freeze_waits = True
                self._freeze_after_evaluation()

    def _freeze_after_evaluation(self) -> None:
        """Freeze once the running evaluation ended, in a turn of the loop of its own (not in
        the callback that takes the verdict and applies the held writes)."""
        self.monitor.after_evaluation(lambda: self.call_next(self._freeze_between_evaluations))

    def _freeze_between_evaluations(self) -> None:
        """The evaluation that was running ended: freeze what was due, unless the next one
        started by then (then as that one ends)."""
        if self.monitor.evaluating:
            self._freeze_after_evaluation()
            return
        self._freeze_waits = False
        self.long_lived.freeze()

    def redraw(self) -> None:
        """Draw the header and what is on top from the store as it is now, in one batch: a
        pane redrawn alone (after a resize) showed rows newer than the header above them."""
        if self._header is None or not self.screen_stack:
            return
        store, assessment = self.store, self.assessment
        self.monitor.gate.close()  # until the frame is written out (_display)
        with self.batch_update():
            self._header.update_header(
                store,
                assessment,
                self.inputs.mode,
                self.inputs.title,
                self.inputs.replay,
                self._replay_t0,
                self.host_filter,
                self.summaries.pinned,
            )
            self._mark_bottleneck()
            if isinstance(self.screen, NodeScreen | ProcessScreen):  # these replace the panes
                self.screen.refresh_screen(store, assessment)
            else:
                self.pane(self.visible_step()).refresh_pane(store, assessment)

    def _display(self, screen: Screen, renderable: RenderableType | None) -> None:
        """Textual's hand-over of a painted frame to the terminal (a private method: Textual is
        pinned below 9, tests/test_ui_app.py fails if it stops being called), then the diagnosis
        gate opens: the frame ends here.

        Not ``call_after_refresh``: its callbacks ran once the screen's queue was idle, which at
        4096 GPUs was before the widgets the tick changed had asked to be painted, so an
        evaluation's rules ran beside one paint in six or seven and made it 1.5-2x as long."""
        super()._display(screen, renderable)
        if renderable is not None:
            self.monitor.gate.open()

    def _read_hang_stacks(self) -> None:
        """job.hang leads with a hang not read yet: read its role's Python stacks once, off
        the refresh (verl_top/hang_stacks.py); the evidence and process screen show them."""
        targets = self.hang_stacks.due(self.assessment)
        if not targets:
            return
        self.notify(
            f"job.hang: reading the Python stacks of {len(targets)} process(es) of the hung "
            f"role; {PAUSE_NOTE}",
            timeout=8,
            markup=False,
        )
        self.run_worker(self.hang_stacks.read(targets), group="hang-stacks", exit_on_error=False)

    def _mark_bottleneck(self) -> None:
        """Mark the lead's tab (●) and every tab holding findings (•), each in the colour of
        its worst finding, so findings outside the lead's step are not hidden."""
        assessment = self.assessment
        step = assessment.bottleneck_step
        marks = []
        for s in range(1, 6):
            worst = max((float(f.severity) for f in assessment.step_findings(s)), default=None)
            level = None
            if s == step or worst is not None:
                level = severity_class(worst if worst is not None else 0.5)
            marks.append((tab_label(s, s == step, worst is not None), level))
        # Compared as shown (label, colour), not as severities: a new evaluation moves those
        # every few seconds, and relabelling a tab reflows the screen and replays the tab
        # underline's animation.
        if marks == self._marked_step:
            return
        self._marked_step = marks
        tabs = self._tabs
        assert tabs is not None
        relabelled = False
        for s, (label, level) in enumerate(marks, start=1):
            tab = tabs.get_tab(f"pane-{s}")
            if str(tab.label) != label:
                tab.label = label
                relabelled = True
            for lv in ("error", "warning", "info"):
                tab.set_class(level == lv and s == step, f"-bottleneck-{lv}")
                tab.set_class(level == lv and s != step, f"-findings-{lv}")
            tab.set_class(s == step, "-bottleneck")
        if relabelled:
            self.call_after_refresh(self._underline_active_tab)

    def _underline_active_tab(self) -> None:
        """Put the tab underline under the active tab again once the relabelled tabs are laid
        out. Textual moves it after the refresh that follows a relabel, which can come before
        the tab's own new width: the underline stayed as wide as the label before its mark
        (a snapshot test caught it when other tests ran first in the same process)."""
        if self._tabs is not None:
            for tabs in self._tabs.query(Tabs):
                tabs._highlight_active(animate=False)

    def _show_notes(self) -> None:
        notes = self.store.notes
        if len(notes) < self._notes_seen:
            self._notes_seen = 0
        for note in list(notes)[self._notes_seen :]:
            if not note.startswith("source "):  # _run_source already notified those
                self.notify(note, severity="warning", timeout=8, markup=False)
        self._notes_seen = len(notes)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """A tab just became visible: draw it now rather than at the next tick."""
        self.pane(self.visible_step()).force_next()
        self.redraw()  # the header too: the pane is drawn from the store as it is now

    # -- actions ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Which keys act here. Global keys yield to a focused text input and to the probe
        dialog; pane keys wait on the main screen; replay keys exist only in replays."""
        if action in self.GLOBAL_ACTIONS:
            if isinstance(self.focused, Input):
                return False  # the / bar: the key is typed
            from verl_top.ui.probe_screen import ProbeScreen

            if isinstance(self.screen, ProbeScreen):
                return False  # the dialog's own keys (Esc / c) only, so a probe is not orphaned
            return True
        if action in ("sort", "sort_reverse", "hosts") and len(self.screen_stack) > 1:
            return False
        if action in ("sort", "sort_reverse") and not self.store.gpu_count():
            return False  # they order the GPU table: with no GPU, not in the footer
        if action in self.REPLAY_ACTIONS and self.inputs.replay is None:
            return False  # live: no Pause/Speed in the footer
        return True

    async def _to_main(self) -> None:
        """Close the node, findings and help screens (waiting for each): back to the panes."""
        while len(self.screen_stack) > 1:
            await self.pop_screen()

    def main_widget(self, step: int) -> Widget:
        """What has focus on a pane: its table (pane 1: GPUs, or hosts when there is no GPU;
        pane 4: the node map), else the pane itself so the arrows scroll it."""
        pane = self.pane(step)
        if step == 1:
            gpus = pane.query_one("#gpu-table", DataTable)
            hosts = pane.query_one("#host-table", DataTable)
            return gpus if gpus.row_count or not hosts.row_count else hosts
        if step == 4:
            return pane.query_one("#map-grid", DataTable)
        return pane

    def focus_main(self) -> None:
        """Give the focus to the visible pane's main widget."""
        if self._tabs is not None and len(self.screen_stack) == 1:
            self.main_widget(self.visible_step()).focus()

    async def action_show_tab(self, step: int) -> None:
        """Keys 1-5: show a step's pane (from any screen) with its table focused."""
        if len(self.screen_stack) > 1:
            self._aim_panes(step)  # before the screens close and hand their focus back
        await self._to_main()
        self.show_step(step)

    def _aim_panes(self, step: int) -> None:
        """Make ``step`` the active pane and its main widget the panes' focus. A closing screen
        gives the focus back to what had it below, and focusing a widget in a tab activates that
        tab: with the focus left in another pane, that pane would come back."""
        if self._tabs is not None:
            self._tabs.active = f"pane-{step}"
            self.screen_stack[0].set_focus(self.main_widget(step), scroll_visible=False)

    def show_step(self, step: int) -> None:
        """Show a step's pane on the main screen, its main widget focused."""
        if self._tabs is not None:
            self._aim_panes(step)
            # A closed screen hands its saved focus back after this: focus again after that.
            self.call_after_refresh(self.focus_main)

    async def action_back(self) -> None:
        """Esc on the panes: hide a host table opened with h (from it), else clear the host
        filter (screens above close themselves on Esc)."""
        pane = self.throughput
        if len(self.screen_stack) > 1:
            self.pop_screen()
        elif pane.hosts_shown and self.focused is pane.query_one("#host-table", DataTable):
            self.action_hosts()
        elif self.host_filter:
            self.query_one(FilterBar).action_clear_filter()
            self.focus_main()

    def action_quit_now(self) -> None:
        """Ctrl+C / Ctrl+Q: quit from anywhere, also from a dialog."""
        self.exit()

    def action_nav(self, direction: str) -> None:
        """Keys j/k (vi, htop, less): what ↓/↑ do on the focused table or scrolling pane."""
        widget = self.focused
        if widget is None:
            return
        for name in (f"action_cursor_{direction}", f"action_scroll_{direction}"):
            action = getattr(widget, name, None)
            if callable(action):
                action()
                return

    def action_sort(self) -> None:
        """Key o: next sort column of the GPU table."""
        self.show_step(1)
        self.throughput.cycle_sort()

    def action_sort_reverse(self) -> None:
        """Key O: reverse the GPU table's sort."""
        self.show_step(1)
        self.throughput.reverse_sort()

    def action_hosts(self) -> None:
        """Key h: pane 1's host table in full (focused: Enter opens a host) or back to its
        one-line summary, so the GPU table gets the rows."""
        self.show_step(1)
        pane = self.throughput
        if not self.store.gpu_count():
            self.notify("no GPU: the host table is the whole pane", markup=False)
            return
        shown = pane.query_one("#host-table", DataTable)
        if pane.toggle_hosts():
            shown.focus()
            self.call_after_refresh(shown.focus)  # after show_step's own late focus
        else:
            self.focus_main()

    def open_node(self, host: str, gpu: int | None = None) -> None:
        """The node screen of ``host`` (plots start on ``gpu``, or all GPUs)."""
        if host in self.store.hosts:
            self.push_screen(NodeScreen(self.store, host, gpu))

    def open_process(self, host: str, pid: int) -> None:
        """The process screen of ``pid`` on ``host`` (Enter on a process row)."""
        if host in self.store.hosts:
            sources = list(self.inputs.sources)
            self.push_screen(ProcessScreen(self.store, sources, host, pid, self.readonly))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a host or GPU row of pane 1 opens that node."""
        target = row_target(event.data_table.id, event.row_key.value)
        if target is not None and not isinstance(self.screen, NodeScreen):
            event.stop()
            self.open_node(*target)

    def action_snapshot(self) -> None:
        """Key s: write a snapshot bundle (data, report, screenshot) in a worker thread."""
        self.snapshots.start()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette: Textual's commands plus "Export snapshot"."""
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Export snapshot",
            "Write snapshot.json, report.md, screen.svg and the recording to "
            "./verl-top-snapshot-<time>/",
            self.action_snapshot,
        )

    def action_probe(self) -> None:
        """Key p: confirm, then probe NCCL bandwidth on this machine (live sessions only)."""
        from verl_top.ui.probe_screen import open_probe

        open_probe(self)

    async def action_findings(self) -> None:
        """Key d: the diagnosis of all five steps (d again: back to the panes)."""
        if isinstance(self.screen, FindingsScreen):
            self.pop_screen()
            return
        await self._to_main()
        self.push_screen(FindingsScreen(self.assessment, self.palette()))

    def action_toggle_pause(self) -> None:
        """Space: pause or resume a replay."""
        replay = self.inputs.replay
        if replay is None:
            self.notify(
                "pause works on replays (--replay / --demo); live data keeps flowing", markup=False
            )
            return
        replay.toggle()
        self.refresh_now()

    def action_step_replay(self) -> None:
        """Key n: while paused, play one more interval."""
        replay = self.inputs.replay
        if replay is None or not replay.paused:
            self.notify("n steps a paused replay (space pauses)", markup=False)
            return
        replay.step()

    def action_help(self) -> None:
        """Key ?: every key of every screen (? again closes it)."""
        from verl_top.ui.help_screen import HelpScreen

        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        self.push_screen(HelpScreen())

    async def action_filter(self) -> None:
        """Key /: type a host or GPU to narrow panes 1 and 4 (Esc clears)."""
        await self._to_main()
        self.query_one(FilterBar).open()

    def set_host_filter(self, text: str) -> None:
        """Apply a filter typed into the / bar: panes 1 and 4 redraw at once."""
        if text == self.host_filter:
            return
        self.host_filter = text
        for step in (1, 4):
            self.pane(step).force_next()
        self.refresh_now()

    def action_window(self, direction: int) -> None:
        """Keys + and -: widen or narrow the history window (30 s to 1 h)."""
        limits = self.store.limits
        now = limits.window_s
        if direction > 0:
            bigger = [w for w in WINDOW_STEPS if w > now + 1e-9]
            new = bigger[0] if bigger else now
        else:
            smaller = [w for w in WINDOW_STEPS if w < now - 1e-9]
            new = smaller[-1] if smaller else now
        if new == now:
            self.notify(f"history window stays {now:g} s (30 s to 1 h)", markup=False)
            return
        limits.window_s = new
        self.ui_settings.save(window=new)
        self.notify(f"history window {new:g} s", markup=False)
        for step in range(1, 6):
            self.pane(step).force_next()
        self.refresh_now()

    def action_speed(self, factor: float) -> None:
        """Keys > and <: replay speed ×2 or ÷2 (1/16 to 64)."""
        replay = self.inputs.replay
        if replay is None:
            self.notify("speed applies to replays (--replay / --demo)", markup=False)
            return
        replay.speed = min(64.0, max(1 / 16, replay.speed * factor))
        self.refresh_now()
