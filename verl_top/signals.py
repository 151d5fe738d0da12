"""Sending a signal to a process of the job (the process screen's F9): a fixed argument list
(``kill -s SIG PID``, the signal from a fixed set, the pid a checked integer) run on the node
through its own connection, only after the person confirmed it, never with ``--readonly``, and
refused up front for a process the connection's user does not own (unless root)."""

from __future__ import annotations

from dataclasses import dataclass

from verl_top.node_exec import Runner
from verl_top.untrusted import clean_text

# What each signal does to a training process, as the confirmation says it.
SIGNALS: dict[str, str] = {
    "TERM": "ask it to exit (it may clean up)",
    "INT": "interrupt it, like Ctrl+C (Python raises KeyboardInterrupt)",
    "KILL": "end it at once (no clean-up; its GPU memory is freed)",
    "STOP": "pause it (state T) until CONT",
    "CONT": "resume it after STOP",
}
OWNER_SCRIPT = 'id -u; stat -c %u "/proc/$1" 2>/dev/null || echo gone\n'
TIMEOUT_S = 15.0
READONLY = "read-only session (--readonly): verl-top sends no signal"


@dataclass(frozen=True)
class Permission:
    """Whether the connection's user may signal the process, and why not."""

    allowed: bool
    reason: str = ""


def check_pid(pid: object) -> int:
    """``pid`` as a process id verl-top may signal (an int > 1); ValueError otherwise."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < 2**31:
        raise ValueError(f"not a process id verl-top signals: {pid!r}")
    return pid


async def permission(run: Runner, host: str, pid: int, user: str = "") -> Permission:
    """Ask the node: the connection's uid and the process's owner (root may signal any)."""
    res = await run(["sh", "-c", OWNER_SCRIPT, "sh", str(check_pid(pid))], TIMEOUT_S)
    lines = res.stdout.split()
    if len(lines) < 2 or not lines[0].isdigit():
        why = clean_text(res.stderr or res.stdout or "no answer", 200)
        return Permission(False, f"could not ask {host} who owns pid {pid}: {why}")
    if lines[1] == "gone":
        return Permission(False, f"pid {pid} is not running on {host}")
    me, owner = int(lines[0]), int(lines[1]) if lines[1].isdigit() else -1
    if me == 0 or me == owner:
        return Permission(True)
    who = f"uid {owner}" + (f" ({user})" if user else "")
    return Permission(
        False,
        f"pid {pid} on {host} runs as {who}; the SSH user (uid {me}) may only signal its own "
        "processes: verl-top sends nothing",
    )


async def send(run: Runner, host: str, pid: int, signal: str) -> str:
    """``kill -s SIGNAL PID`` on the node; "" when sent, else why not (plain words)."""
    if signal not in SIGNALS:
        raise ValueError(f"not a signal verl-top sends: {signal!r}")
    res = await run(["kill", "-s", signal, str(check_pid(pid))], TIMEOUT_S)
    if res.status == 0:
        return ""
    why = clean_text((res.stderr or res.stdout).strip() or f"exit status {res.status}", 300)
    return f"kill -s {signal} {pid} on {host} failed: {why}"
