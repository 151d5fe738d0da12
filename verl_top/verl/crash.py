"""The exception a verl job died of, read from the driver's console log.

When verl's driver dies, ``main_ppo``'s ``ray.get`` re-raises the failed task's error: the log
ends with Hydra's ``Error executing job with overrides: ...`` and a Python traceback printed by
the driver itself (no Ray ``(Actor pid=N)`` prefix), in which Ray's ``RayTaskError(X):
ray::WorkerDict.actor_rollout_update_actor() (pid=...)`` headers say which remote task failed,
the ``File "...", line N, in f`` frames where, and the last unindented line what
(``torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.07 GiB``).

``CrashScanner`` follows those tracebacks line by line and hands each finished one over as a
``LogEvent`` of kind ``crash``: the exception line, where it was raised (the failed Ray task and
the last frame inside verl), and how many verl step lines came before it. Tracebacks a Ray actor
prints under its own prefix (an agent-loop worker logging a caught error) are the job's business
and not a crash. Whether the job died of it is the diagnosis's question (``job.crashed``: no
step after it).

Everything here is foreign text: lines are bounded before any regex, and the kept texts are
cleaned and cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from verl_top.model import LogEvent
from verl_top.untrusted import clean_text

CRASH_KIND = "crash"
MAX_SCAN_CHARS = 2000  # a traceback line longer than this is read by its head only
MAX_EXCEPTION_CHARS = 300
MAX_FRAMES = 512  # frames of one traceback kept while it is open (the last one counts)
_TRACEBACK = "Traceback (most recent call last):"
_HYDRA = "Error executing job with overrides"
_FRAME_RE = re.compile(r'\s+File "([^"]{1,1024})", line (\d{1,9}), in (\S{1,200})')
_RAY_TASK_RE = re.compile(r"ray\.exceptions\.\w{1,64}\((\w{1,120})\): ray::([\w.<>]{1,200})\(")
# The exception line: an unindented dotted name, then ":" and the message or nothing.
_EXCEPTION_RE = re.compile(r"([A-Za-z_][\w.]{0,200})(?::\s?(.*))?")
_EXCEPTION_NAME_RE = re.compile(r"(Error|Exception|Exit|Interrupt|Failure)$")


@dataclass
class _Traceback:
    """One traceback being read: the failed Ray tasks and the frames so far."""

    tasks: list[str] = field(default_factory=list)
    verl_frame: str = ""
    last_frame: str = ""
    frames: int = 0


def _verl_part(path: str) -> str | None:
    """The part of a frame's path from its last verl/ or recipe/ directory on; None when the
    file is not verl's (another package, a user's script)."""
    if "site-packages/" in path and "site-packages/verl/" not in path:
        return None
    at = max(path.rfind("/verl/"), path.rfind("/recipe/"))
    if at >= 0:
        return path[at + 1 :]
    return path if path.startswith(("verl/", "recipe/")) else None


def _frame_text(path: str, line: str, func: str) -> str:
    """``verl/workers/actor/dp_actor.py:276 (update_policy)``: verl's files from their verl/
    part, other files by name."""
    shown = _verl_part(path) or path.rsplit("/", 1)[-1]
    return f"{shown}:{line} ({func})"


def where_text(tasks: list[str], verl_frame: str, last_frame: str) -> str:
    """``in ray::WorkerDict.actor_rollout_update_actor at verl/workers/...:276 (update_policy)``."""
    parts = []
    if tasks:
        parts.append(f"in ray::{tasks[-1]}")
    frame = verl_frame or last_frame
    if frame:
        parts.append(f"at {frame}")
    return " ".join(parts)


class CrashScanner:
    """Tracebacks printed by the driver of one followed verl log, each as a ``crash`` event."""

    def __init__(self, host: str, path: str) -> None:
        self.host = host
        self.path = path
        self._open: _Traceback | None = None
        self.hydra_error = False  # Hydra said the job's main function raised

    # A line without one of these can only matter inside an open traceback (the parser's
    # quiet-line skip asks, verl/parse.py).
    OPENERS = (_TRACEBACK, _HYDRA)

    @property
    def idle(self) -> bool:
        """No traceback is open: only a line holding one of ``OPENERS`` can start one."""
        return self._open is None

    def reset(self) -> None:
        self._open = None
        self.hydra_error = False

    def scan(self, prefix: str, body: str, steps: int) -> LogEvent | None:
        """Read one logical line (its Ray prefix and body); the crash event a traceback ends
        with, else None. ``steps``: verl step lines read so far."""
        if prefix:
            return None  # an actor's own output, interleaved or not: never the driver's crash
        if self._open is None:  # most lines: two prefix tests, no copy
            if body.startswith(_TRACEBACK):
                self._open = _Traceback()
            elif body.startswith(_HYDRA):
                self.hydra_error = True
            return None
        return self._traceback_line(self._open, body[:MAX_SCAN_CHARS], steps)

    def _traceback_line(self, tb: _Traceback, text: str, steps: int) -> LogEvent | None:
        frame = _FRAME_RE.match(text)
        if frame is not None:
            path, line, func = frame.groups()
            if tb.frames < MAX_FRAMES:
                tb.frames += 1
                tb.last_frame = _frame_text(path, line, func)
                if _verl_part(path) is not None:
                    tb.verl_frame = tb.last_frame
            return None
        task = _RAY_TASK_RE.match(text)
        if task is not None:
            tb.tasks.append(task.group(2))
            tb.verl_frame = ""  # frames after a task header are that task's own
            return None
        if not text or text[0].isspace():
            return None  # source lines, carets, continuation of a message
        if text.startswith(_TRACEBACK):  # a chained traceback: start again
            self._open = _Traceback()
            return None
        exc = _EXCEPTION_RE.fullmatch(text.rstrip())
        if exc is None or not _EXCEPTION_NAME_RE.search(exc.group(1)):
            return None  # "The above exception was ...", "During handling of ..."
        self._open = None
        return LogEvent(
            host=self.host,
            path=self.path,
            kind=CRASH_KIND,
            text=clean_text(text.strip(), MAX_EXCEPTION_CHARS),
            where=clean_text(where_text(tb.tasks, tb.verl_frame, tb.last_frame), 600),
            after_steps=steps,
            severity=1.0,
        )
