"""What each timing and perf key of the latest verl step means (key ``e`` on pane 3).

The same key means different things in different verl versions and trainer modes
(``timing_s/gen`` is the rollout in the sync trainers and the trainer's *wait* in the async
ones), so this screen shows, for every key of the latest step that verl-top's key catalogue
knows, what it covers in the job's own trainer mode, the versions that print it, what it
contains or sits inside, and where verl writes it. The mode and the clues it rests on head the
screen (verl_top/verl/flavour.py); everything shown comes from verl_top/data/verl_keys.yaml.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from verl_top.store import Store
from verl_top.untrusted import clean_text
from verl_top.verl.flavour import store_flavour
from verl_top.verl.keys import catalogue

# Keys worth explaining: timers, throughput/efficiency, and who-waits ratios.
EXPLAINED_PREFIXES = (
    "timing_s/",
    "timing/",
    "perf/",
    "actor/perf/",
    "fully_async/",
    "rollouter/",
    "trainer/",
)
NO_STEP = "no verl step read yet: give --verl-log PATH (the driver's console log or the file logger's JSONL)"


def _value(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def explain_keys(store: Store) -> RenderableType:
    """The explanation of every catalogued key of the latest step, in the job's trainer mode;
    keys of the step the catalogue does not know are listed at the end as such."""
    last = next(
        (
            s
            for s in reversed(store.steps)
            if any(k.startswith(EXPLAINED_PREFIXES) for k in s.metrics)
        ),
        None,
    )
    if last is None:
        return Text(NO_STEP, style="italic")
    fl = store_flavour(store)
    cat = catalogue()
    parts: list[RenderableType] = [
        Text(f"Step {last.step}: what its timing and perf keys mean", style="bold underline"),
        Text(f"read as: {clean_text(fl.text())}", style="bold"),
    ]
    if fl.evidence:
        parts.append(Text("because: " + clean_text("; ".join(fl.evidence)), style="dim"))
    unknown: list[str] = []
    for key, value in last.metrics.items():
        if not key.startswith(EXPLAINED_PREFIXES):
            continue
        if cat.lookup(key) is None:
            unknown.append(key)
            continue
        lines = cat.explain(key, fl.trainer_mode)
        head = Text("\n")
        head.append(clean_text(key), style="bold")
        head.append(f" = {_value(value)}")
        parts.append(head)
        parts.append(Text("  " + clean_text(lines[0].split(": ", 1)[-1])))
        parts.extend(Text("  " + clean_text(line), style="dim") for line in lines[1:])
    if unknown:
        parts.append(
            Text(
                "\nnot in the catalogue (a fork's or a newer verl's own keys; a timing_s/ key "
                "counts as a stage of its own): " + clean_text(", ".join(unknown[:40])),
                style="dim",
            )
        )
    return Group(*parts)


class KeyExplainScreen(Screen):
    """Full screen: every key of the latest step explained; Esc (or e) goes back."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("e", "app.pop_screen", "Back", show=False),
    ]

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        yield Static(
            " verl keys explained — this verl, this trainer mode (Esc to go back)", id="keys-title"
        )
        with VerticalScroll(id="keys-scroll"):
            yield Static(explain_keys(self.store), id="keys-body")
        yield Footer(show_command_palette=False)
