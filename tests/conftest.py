"""Shared pytest fixtures.

SSH: real OpenSSH sshd daemons on 127.0.0.x (see tests/sshd.py). ``sshd_pool`` is one set of
daemons for the whole session (tests that only stream); ``sshd_factory`` starts daemons for one
test and stops them afterwards (fault tests that kill, stop or restart them).
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sshd import SSHD, SshdFactory, new_key  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
H200_TRACE = FIXTURES / "h200" / "h200_phased_trace.jsonl"


def _sshd_missing() -> str:
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (.ci/run installs openssh-server)"
    if os.geteuid() != 0:
        return "the test sshd logs in as root and must be started as root (CI runs as root)"
    return ""


@pytest.fixture(autouse=True)
def _still_screens_for_snapshots(request: pytest.FixtureRequest, monkeypatch) -> None:
    """Snapshot tests draw with animations off: the tab underline slides for a moment after a
    pane switch, and a loaded machine took the screenshot mid-slide (two parallel runs out
    of 2294 tests differed in that one line)."""
    if "snap_compare" in request.fixturenames:
        import textual.constants

        monkeypatch.setattr(textual.constants, "TEXTUAL_ANIMATIONS", "none")


async def _settled(pilot: Any) -> None:
    """Let the app finish what a refresh starts: ``call_after_refresh`` callbacks (the tab
    underline follows a relabelled tab only after the next repaint) run on the compositor's
    timer, which a loaded machine delays past a plain ``pause()``. Two quiet looks in a row,
    3 s at most."""
    quiet = 0
    for _ in range(60):
        await pilot.pause(0.05)
        still = not getattr(pilot.app.screen, "_callbacks", None) and _underlines_follow(pilot)
        quiet = quiet + 1 if still else 0
        if quiet >= 2:
            break
    await pilot.wait_for_scheduled_animations()


def _underlines_follow(pilot: Any) -> bool:
    """Every tab bar's underline spans its active tab (after a relabel it moves only once the
    relabel's message and the repaint after it went through: a run of the whole file caught
    the underline still as wide as the label before its mark)."""
    from textual.widgets import Tabs
    from textual.widgets._tabs import Underline

    for tabs in pilot.app.screen.query(Tabs):
        active = tabs.active_tab
        if active is None:
            continue
        start, end = active.virtual_region.shrink(active.styles.gutter).column_span
        underline = tabs.query_one(Underline)
        if (underline.highlight_start, underline.highlight_end) != (start, end):
            return False
    return True


@pytest.fixture
def snap_compare(snap_compare: Callable[..., bool]) -> Callable[..., bool]:
    """pytest-textual-snapshot's ``snap_compare``, with the screen settled after the keys (it
    takes the screenshot one ``pause()`` after them: a relabelled tab's underline was caught
    before it moved in a parallel run)."""

    def compare(
        app: Any,
        press: Iterable[str] = (),
        terminal_size: tuple[int, int] = (80, 24),
        run_before: Callable[[Any], Any] | None = None,
    ) -> bool:
        async def keys_then_settle(pilot: Any) -> None:
            if run_before is not None:
                result = run_before(pilot)
                if inspect.isawaitable(result):
                    await result
            await _settled(pilot)
            await pilot.press(*press)
            await _settled(pilot)

        return snap_compare(app, terminal_size=terminal_size, run_before=keys_then_settle)

    return compare


@pytest.fixture(scope="session")
def h200_trace() -> Path:
    """The real H200 trace the agent's replay backend plays."""
    return H200_TRACE


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A client key allowed on every test sshd, and a second key that is not."""
    why = _sshd_missing()
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("ssh-keys")
    client, key = new_key(d / "client_ed25519")
    wrong, _ = new_key(d / "wrong_ed25519")
    auth = d / "authorized_keys"
    auth.write_bytes(key.export_public_key("openssh"))
    auth.chmod(0o600)
    return {"client": client, "wrong": wrong, "authorized_keys": auth, "dir": d}


@pytest.fixture(scope="session")
def sshd_pool(
    tmp_path_factory: pytest.TempPathFactory, ssh_keys: dict[str, Path]
) -> Iterator[SshdFactory]:
    """Session-wide daemons (127.0.0.2 upwards); call ``.start()`` for each one you need."""
    factory = SshdFactory(tmp_path_factory.mktemp("sshd-pool"), ssh_keys["authorized_keys"], 2)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def sshd_factory(tmp_path: Path, ssh_keys: dict[str, Path]) -> Iterator[SshdFactory]:
    """Daemons for one test (127.0.0.40 upwards), all stopped by pid at teardown."""
    factory = SshdFactory(tmp_path / "sshd", ssh_keys["authorized_keys"], 40)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def remote_python() -> str:
    """The python the test sshd finds for the agent (sshd's default PATH), else this one."""
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    return "python3" if found else sys.executable


@pytest.fixture(scope="session")
def prom_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One real Prometheus for the session (127.0.0.90) scraping the real DCGM exporter
    fixtures (H100 EKS node, A800 MIG node) as job "dcgm", the real vLLM fixture as job "vllm",
    SGLang's documented /metrics sample as job "sglang",
    a constructed busy H100 (real labels, constructed values) as job "dcgm-busy", and a
    reserved address for verl-top's own metrics endpoint as job "verl-top".
    """
    from promserver import PROMETHEUS, Exposition, PromServer, busy_h100, fixture_text, free_port

    if not os.path.exists(PROMETHEUS):
        pytest.skip(f"{PROMETHEUS} is not installed (.ci/run installs the prometheus package)")
    ends = {
        "h100": Exposition(fixture_text("dcgm_h100x8_eks_sampled.prom")),
        "a800": Exposition(fixture_text("dcgm_a800x8_mig_scrapeable.prom")),
        "vllm": Exposition(fixture_text("vllm_metrics_v0_opt125m.prom")),
        "busy": Exposition(busy_h100()),
        "sglang": Exposition(fixture_text("sglang_docs_metrics_llama31_8b.prom")),
    }
    verl_top_target = ("127.0.0.91", free_port("127.0.0.91"))
    server = PromServer(
        tmp_path_factory.mktemp("prometheus"),
        {
            "dcgm": [ends["h100"].target, ends["a800"].target],
            "vllm": [ends["vllm"].target],
            "dcgm-busy": [ends["busy"].target],
            "sglang": [ends["sglang"].target],
            "verl-top": [f"{verl_top_target[0]}:{verl_top_target[1]}"],
        },
    )
    try:
        server.wait_for('DCGM_FI_DEV_GPU_TEMP{job="dcgm"}', 16)
        server.wait_for("vllm:num_requests_running", 1)
        server.wait_for("sglang:num_queue_reqs", 1)
        server.wait_for("DCGM_FI_PROF_SM_ACTIVE", 8)
        yield {"server": server, "ends": ends, "verl_top_target": verl_top_target}
    finally:
        server.stop()
        for end in ends.values():
            end.stop()


def _parent(pid: int) -> int:
    """A process's parent pid from /proc (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def own_job_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's job scan reads the whole node, and other tests of the suite run
    ``ray::WorkerDict`` stand-ins beside this one (xdist workers), which the agent rightly
    reports. With this fixture the node's job processes are this test's own children only."""
    from verl_top.agent import procs

    discover = procs.JobScanner.discover
    me = os.getpid()

    def own_children(self: procs.JobScanner) -> None:
        discover(self)
        self._jobs = {pid for pid in self._jobs if _parent(pid) == me}

    monkeypatch.setattr(procs.JobScanner, "discover", own_children)
