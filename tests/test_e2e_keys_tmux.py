"""Keyboard-only walk-through in a real terminal (issue 18, "done when"): ``verl-top --demo`` in
tmux at 80x24 and 200x60 reaches every pane, a node and back, the diagnosis and the help, with
keys only, reading the screen with capture-pane. Textual draws on stderr: it is never redirected.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys

import pytest
from test_e2e_tmux import EXIT_MARK, REPO, Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

# Key -> text that only that screen shows (at every size: near the top of the pane).
PANES = {
    "2": "Bandwidth probes",
    "3": "Stages of the last",
    "4": "Map: mean activity",
    "5": "memory headroom",
    "1": "sort: host",
}


def start(tmux: Tmux, cols: int, rows: int) -> None:
    env = {
        "TERM": "xterm-256color",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmux.cwd / "home"),
        "XDG_CONFIG_HOME": str(tmux.cwd / "xdg"),
        "COLUMNS": str(cols),
        "LINES": str(rows),
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    argv = shlex.join([sys.executable, "-m", "verl_top", "--demo"])
    cmd = f"env {exports} {argv}; echo {EXIT_MARK}:$?; sleep 60"
    tmux.tmux("-f", "/dev/null", "new-session", "-d", "-s", "setup")
    tmux.tmux("set-option", "-g", "status", "off")  # the pane is the whole cols x rows
    tmux.tmux(
        "new-session",
        "-d",
        "-s",
        tmux.session,
        "-x",
        str(cols),
        "-y",
        str(rows),
        "-c",
        str(tmux.cwd),
        cmd,
    )


@pytest.fixture
def tmux(tmp_path):  # type: ignore[no-untyped-def]
    t = Tmux(tmp_path)
    try:
        yield t
    finally:
        t.kill()


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_keyboard_walk_through_every_pane_a_node_and_back(tmux: Tmux, size) -> None:
    cols, rows = size
    start(tmux, cols, rows)

    def filled(s: str) -> bool:  # the app drew the whole terminal, footer on the last row
        lines = s.rstrip("\n").splitlines()
        return len(lines) == rows and "q Quit" in lines[-1] and "sort: host" in s

    screen = tmux.wait(filled, 40, "pane 1 with data, filling the terminal")
    lines = screen.rstrip("\n").splitlines()
    assert "DEMO" in lines[0] and "hosts 4 up" in lines[0]  # header
    assert "step 3 bottleneck" in lines[1]  # the verdict, from the first frame
    assert "1 Throughput" in lines[2] and "5 Config" in lines[2]  # every tab fits
    assert "d Diagnosis" in lines[-1] and "q Quit" in lines[-1]  # footer
    for key, text in PANES.items():
        tmux.keys(key)
        tmux.wait(lambda s, t=text: t in s, 15, f"pane {key} ({text!r})")
    # Enter opens the highlighted GPU's node (the GPU table has focus at start), Esc is back.
    tmux.keys("Enter")
    tmux.wait(lambda s: "Node node01" in s, 15, "the node screen")
    tmux.keys("Escape")
    tmux.wait(lambda s: "sort: host" in s and "Node node01" not in s, 15, "back on pane 1")
    # Digits work right after Esc from the node screen, with the table focused.
    tmux.keys("4")
    tmux.wait(lambda s: "Map: mean activity" in s, 15, "pane 4 after Esc")
    tmux.keys("d")
    tmux.wait(lambda s: "Diagnosis — the five steps" in s, 15, "the diagnosis screen")
    tmux.keys("2")  # a digit from the diagnosis screen goes to that pane
    tmux.wait(lambda s: "Bandwidth probes" in s, 15, "pane 2 from the diagnosis")
    tmux.keys("?")
    tmux.wait(lambda s: "Close help" in s, 15, "the help")
    tmux.keys("Escape")
    tmux.wait(lambda s: "Close help" not in s and "Bandwidth probes" in s, 15, "help closed")
    tmux.keys("q")
    screen = tmux.wait(lambda s: f"{EXIT_MARK}:" in s, 15, "the app to exit")
    assert f"{EXIT_MARK}:0" in screen


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_issue32_keys_and_states_in_a_real_terminal(tmux: Tmux, size) -> None:
    """The banner's two lines, F1/F6/F10, j/k, type-ahead into / and a kept filter in the header,
    read back from the terminal (issue 32)."""
    cols, rows = size
    start(tmux, cols, rows)
    screen = tmux.wait(lambda s: "sort: host" in s and "→ " in s, 40, "pane 1 and the banner")
    lines = screen.splitlines()
    assert lines[1].lstrip().startswith("● step 3") and "saves up to" in lines[1]
    assert lines[2].lstrip().startswith("→ ") and "rollout" in lines[2]  # the advice
    assert all(len(line) <= cols for line in lines)
    tmux.keys("F1")
    tmux.wait(lambda s: "Close help" in s and "F10" in s, 15, "F1 opens the help")
    tmux.keys("F1")
    tmux.wait(lambda s: "Close help" not in s and "sort: host" in s, 15, "F1 closes it")
    tmux.keys("F6")
    tmux.wait(lambda s: "sort: activity" in s, 15, "F6 sorts like o")
    tmux.keys("j", "j", "k", "Enter")  # j/k move the GPU cursor; Enter opens that GPU's node
    tmux.wait(lambda s: "Node node0" in s and "Esc back" in s, 15, "the node after j j k")
    tmux.keys("Escape")
    tmux.wait(lambda s: "sort: activity" in s and "Node node0" not in s, 15, "back")
    tmux.keys("/", "n", "o", "d", "e", "0", "2", "Enter")  # typed at once: all into the bar
    screen = tmux.wait(lambda s: "filter node02" in s.splitlines()[0], 15, "the kept filter")
    assert not any(re.match(r"\s*node01\s+\d", line) for line in screen.splitlines())
    tmux.keys("Escape")
    tmux.wait(lambda s: "filter node02" not in s.splitlines()[0], 15, "Esc clears the filter")
    tmux.keys("F10")
    screen = tmux.wait(lambda s: f"{EXIT_MARK}:" in s, 15, "F10 quits")
    assert f"{EXIT_MARK}:0" in screen
