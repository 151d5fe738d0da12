"""Python stacks of the job's processes (issue 29 item 3): ``verl-top stacks`` and the node
screen's key.

On each node: ``py-spy dump --pid N`` run through the node's SSH connection (a separate exec
with a fixed argument list, every piece quoted; locally as a subprocess) when py-spy is on the
node (the login PATH, ``~/.local/bin``, or next to the python the job runs: Ray installs py-spy
with its dashboard); else the Ray dashboard's ``/worker/traceback`` (``--ray``), whose agent on
the node runs py-spy as the job's own user; else a message naming what is missing and how to
get it. A process the SSH user cannot read (neither its owner nor root) is refused with its
owner named. Read-only: py-spy attaches with ptrace and pauses the process for the moment it
reads the stack. Identical stacks are grouped by role, like a flame summary.

Everything read from a node (py-spy's text, owners, paths) is foreign: sanitized, bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_top.node_exec import Runner
from verl_top.untrusted import clean_text

PAUSE_NOTE = (
    "py-spy attaches with ptrace and pauses each process for the moment it reads its stack "
    "(read-only: nothing in the process is changed)"
)
DUMP_TIMEOUT_S = 30.0
LOCATE_TIMEOUT_S = 15.0
PARALLEL_DUMPS = 4  # py-spy runs at once per host
MAX_THREADS = 512  # threads kept per process
MAX_FRAMES = 256  # frames kept per thread
MAX_TARGETS = 1024  # processes per collection
SHOWN_FRAMES = 40  # frames of a group shown on screen (stacks.txt has them all)

# Run on the node with the pids as arguments (never formatted into it): where py-spy is (the
# login PATH, ~/.local/bin, next to each process's python), this user's uid, each pid's owner.
LOCATE_SCRIPT = (
    'c=$(command -v py-spy 2>/dev/null) && echo "path $c"\n'
    '[ -x "$HOME/.local/bin/py-spy" ] && echo "path $HOME/.local/bin/py-spy"\n'
    'echo "uid $(id -u)"\n'
    'for p in "$@"; do\n'
    '  u=$(stat -c %u "/proc/$p" 2>/dev/null) || { echo "gone $p"; continue; }\n'
    '  echo "owner $p $u"\n'
    '  e=$(readlink "/proc/$p/exe" 2>/dev/null) && d=${e%/*} && echo "python $p $e" &&'
    ' [ -x "$d/py-spy" ] && echo "path $d/py-spy"\n'
    "done\n"
    "exit 0\n"
)

_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \((.*?)(?::(\d+))?\)\s*$")


@dataclass(frozen=True)
class Frame:
    """One frame: function, file, line (py-spy prints the innermost first)."""

    function: str
    file: str
    line: int | None = None

    def text(self) -> str:
        """``function (file:line)`` as py-spy prints it."""
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{self.function} ({where})"


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a process: its name, py-spy's status words (idle, active, gil), frames."""

    name: str
    status: str
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Target:
    """A process to read: where, which, and what verl calls it."""

    host: str
    pid: int
    role: str = ""
    title: str = ""
    user: str = ""


@dataclass
class ProcessStack:
    """One process's stacks, or why there are none."""

    host: str
    pid: int
    role: str = ""
    title: str = ""
    source: str = ""  # "py-spy" | "py-spy --nonblocking" | "ray dashboard" | "" (none)
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""
    t: float = 0.0


@dataclass
class StackGroup:
    """Threads of one role with the same frames: who shares them."""

    role: str
    thread: str
    status: str
    frames: tuple[Frame, ...]
    members: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Located:
    """What LOCATE_SCRIPT found on a node."""

    pyspy: list[str] = field(default_factory=list)
    uid: int | None = None
    owners: dict[int, int] = field(default_factory=dict)
    pythons: dict[int, str] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)


def parse_located(text: str) -> Located:
    """LOCATE_SCRIPT's output: py-spy paths (first found first), uid, owners, pythons, gone."""
    out = Located()
    for line in text.splitlines()[: 4 * MAX_TARGETS + 8]:
        parts = line.split(" ", 2)
        try:
            if parts[0] == "path" and len(parts) >= 2:
                path = line[5:].strip()
                if path.startswith("/") and path not in out.pyspy and len(path) < 4096:
                    out.pyspy.append(path)
            elif parts[0] == "uid":
                out.uid = int(parts[1])
            elif parts[0] == "owner" and len(parts) == 3:
                out.owners[int(parts[1])] = int(parts[2])
            elif parts[0] == "python" and len(parts) == 3:
                out.pythons[int(parts[1])] = clean_text(parts[2], 512)
            elif parts[0] == "gone":
                out.gone.add(int(parts[1]))
        except (IndexError, ValueError):
            continue
    return out


def parse_dump(text: str) -> list[ThreadStack]:
    """The threads of ``py-spy dump`` text output (also what the Ray dashboard returns):
    ``Thread N (status): "name"`` then ``    function (file:line)`` lines; anything else
    (the process line, local variables) is skipped. Sanitized and bounded."""
    threads: list[ThreadStack] = []
    name = status = ""
    frames: list[Frame] = []
    open_thread = False

    def close() -> None:
        if open_thread and len(threads) < MAX_THREADS:
            threads.append(ThreadStack(name, status, tuple(frames)))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            status = clean_text(m.group(2), 64)
            name = clean_text(m.group(3) or m.group(1), 128)
            frames, open_thread = [], True
            continue
        f = _FRAME.match(line)
        if f and open_thread and len(frames) < MAX_FRAMES:
            line_no = int(f.group(3)) if f.group(3) else None
            frames.append(Frame(clean_text(f.group(1), 256), clean_text(f.group(2), 512), line_no))
    close()
    return threads


def explain_pyspy_error(pid: int, text: str) -> str:
    """Plain words for a failed ``py-spy dump``: permissions, not Python, gone; else its line."""
    low = text.lower()
    first = clean_text(next((x for x in text.splitlines() if x.strip()), "no output"), 300)
    if "permission denied" in low or "operation not permitted" in low:
        return (
            f"py-spy could not attach to pid {pid}: ptrace was refused ({first}). py-spy needs "
            "the process's own user with kernel.yama.ptrace_scope 0, or root / CAP_SYS_PTRACE "
            "(a container needs --cap-add SYS_PTRACE)"
        )
    if "no such process" in low or "failed to find process" in low:
        return f"pid {pid} exited before py-spy could read it"
    if "python" in low and ("failed to find" in low or "not a python" in low):
        return f"pid {pid} is not a Python process (py-spy: {first})"
    return f"py-spy failed on pid {pid}: {first}"


def _who(uid: int | None, user: str) -> str:
    return f"uid {uid}" + (f" ({user})" if user else "")


def refusal(t: Target, owner: int, me: int | None) -> str:
    """Why a process cannot be read by the SSH user, and what would work."""
    name = t.user or str(owner)
    return (
        f"pid {t.pid} runs as {_who(owner, t.user)}; the SSH user ({_who(me, '')}) may only read "
        f"its own processes (root may read all): connect as {name} ({name}@{t.host})"
        + ("" if name == "root" else " or as root")
    )


def missing_pyspy(host: str, pythons: Iterable[str]) -> str:
    """What is missing when no py-spy was found on a node, and how to get it."""
    dirs = sorted({p.rsplit("/", 1)[0] for p in pythons if "/" in p})
    where = f", not next to the job's python ({', '.join(dirs[:3])})" if dirs else ""
    return (
        f"py-spy is not installed on {host} (not on the login PATH, not in ~/.local/bin{where}): "
        "pip install py-spy in the job's environment (ray[default] brings it), or give "
        "--ray http://HEAD:8265 to ask the Ray dashboard"
    )


RayTrace = Callable[[str, int], Awaitable[str]]  # (host, pid) -> py-spy text via the dashboard


async def collect_host(
    run: Runner, host: str, targets: Sequence[Target], ray: RayTrace | None = None
) -> list[ProcessStack]:
    """Stacks of ``targets`` (all on ``host``) through ``run``; one ProcessStack each."""
    targets = list(targets)[:MAX_TARGETS]
    pids = [str(int(t.pid)) for t in targets]
    res = await run(["sh", "-c", LOCATE_SCRIPT, "sh", *pids], LOCATE_TIMEOUT_S)
    loc = parse_located(res.stdout)
    gate = asyncio.Semaphore(PARALLEL_DUMPS)

    async def one(t: Target) -> ProcessStack:
        async with gate:
            return await _one(run, loc, t, ray)

    return list(await asyncio.gather(*(one(t) for t in targets)))


async def _one(run: Runner, loc: Located, t: Target, ray: RayTrace | None) -> ProcessStack:
    out = ProcessStack(t.host, t.pid, t.role, t.title, t=time.time())
    why: list[str] = []
    if t.pid in loc.gone:
        out.error = f"pid {t.pid} is not running on {t.host}"
        return out
    owner = loc.owners.get(t.pid)
    allowed = loc.uid == 0 or (owner is not None and owner == loc.uid)
    if not allowed:
        why.append(refusal(t, owner if owner is not None else -1, loc.uid))
    elif loc.pyspy:
        # A process already stopped (SIGSTOP, the hangs worth a stack) cannot be paused again:
        # py-spy 0.4.3 then fails ("Failed to get stack traces", seen on the real H200 hang),
        # while --nonblocking reads its memory without pausing it. Running processes get the
        # consistent (pausing) read first.
        res = None
        for extra in ([], ["--nonblocking"]):
            res = await run(
                [loc.pyspy[0], "dump", *extra, "--pid", str(int(t.pid))], DUMP_TIMEOUT_S
            )
            threads = parse_dump(res.stdout) if res.status == 0 else []
            if threads:
                out.source, out.threads = "py-spy" + (" --nonblocking" if extra else ""), threads
                return out
            if "Failed to get stack traces" not in f"{res.stderr}{res.stdout}" and res.status:
                break  # refused, gone, not Python: the other mode cannot help
        assert res is not None
        why.append(explain_pyspy_error(t.pid, f"{res.stderr}\n{res.stdout}"))
    else:
        why.append(missing_pyspy(t.host, [loc.pythons.get(t.pid, "")]))
    if ray is not None:
        try:
            threads = parse_dump(await ray(t.host, t.pid))
        except Exception as exc:  # noqa: BLE001 - any dashboard failure is one more reason
            why.append(f"the Ray dashboard's stack trace failed: {clean_text(str(exc), 300)}")
        else:
            if threads:
                out.source, out.threads = "ray dashboard", threads
                return out
            why.append("the Ray dashboard returned no Python stack")
    out.error = "; ".join(why)
    return out


def group(stacks: Iterable[ProcessStack]) -> list[StackGroup]:
    """Threads with identical frames in one role, with every process that has them: the
    busiest first (non-idle, most processes), by role."""
    groups: dict[tuple[str, tuple[Frame, ...]], StackGroup] = {}
    for s in stacks:
        for th in s.threads:
            if not th.frames:
                continue
            key = (s.role, th.frames)
            g = groups.get(key)
            if g is None:
                g = groups[key] = StackGroup(s.role, th.name, th.status, th.frames)
            if (s.host, s.pid) not in g.members:
                g.members.append((s.host, s.pid))
    return sorted(
        groups.values(),
        key=lambda g: (g.role, "idle" in g.status, -len(g.members), g.thread),
    )


def _members(members: list[tuple[str, int]], most: int = 8) -> str:
    names = [f"{h}:{p}" for h, p in members[:most]]
    if len(members) > most:
        names.append(f"… {len(members) - most} more")
    return " ".join(names)


def render_text(stacks: Sequence[ProcessStack], frames: int | None = None) -> str:
    """The grouped stacks as plain text (the screen, ``verl-top stacks``, stacks.txt);
    ``frames``: the innermost frames shown per group (None: all)."""
    read = [s for s in stacks if s.threads]
    hosts = sorted({s.host for s in stacks})
    lines = [
        f"Python stacks of {len(read)} of {len(stacks)} process(es) on {len(hosts)} host(s) "
        f"({', '.join(sorted({s.source for s in read})) or 'none read'}); {PAUSE_NOTE}."
    ]
    role = None
    for g in group(stacks):
        if g.role != role:
            role = g.role
            count = len({(s.host, s.pid) for s in read if s.role == role})
            lines += ["", f"== {role or 'process'}: {count} process(es) =="]
        n = len(g.members)
        share = "1 process has" if n == 1 else f"{n} processes share"
        lines.append(f"{share} this stack [{g.thread}, {g.status}]: {_members(g.members)}")
        shown = g.frames if frames is None else g.frames[:frames]
        lines += [f"    {f.text()}" for f in shown]
        if len(shown) < len(g.frames):
            lines.append(f"    … {len(g.frames) - len(shown)} outer frames")
    failed = [s for s in stacks if not s.threads]
    if failed:
        lines += ["", "Not read:"]
        lines += [f"  {s.host}:{s.pid} ({s.role or 'process'}): {s.error}" for s in failed]
    return "\n".join(lines) + "\n"


def to_json(stacks: Sequence[ProcessStack]) -> list[dict[str, Any]]:
    """The stacks for snapshot.json: one object per process, frames as [function, file, line]."""
    out = []
    for s in stacks:
        d = dataclasses.asdict(s)
        d["threads"] = [
            {
                "name": th.name,
                "status": th.status,
                "frames": [[f.function, f.file, f.line] for f in th.frames],
            }
            for th in s.threads
        ]
        out.append(d)
    return out


LIST_TIMEOUT_S = 60.0


async def job_targets(run: Runner, host: str, python: str = "python3") -> list[Target]:
    """The job's processes on a node, as the agent lists them (one ``--once`` run through
    ``run``), each named as verl names it (roles.annotate_verl)."""
    from verl_top.agent.ship import BOOTSTRAP, agent_payload
    from verl_top.model import ProcessList
    from verl_top.protocol import Decoder
    from verl_top.roles import annotate_verl

    args = ["--once", "--no-topology", "--host", host]
    res = await run([python, "-u", "-c", BOOTSTRAP, *args], LIST_TIMEOUT_S, agent_payload(args))
    decoder = Decoder()
    for line in res.stdout.splitlines():
        rec = decoder.decode(line)
        if isinstance(rec, ProcessList):
            named = annotate_verl(rec)
            return [Target(host, j.pid, j.role, j.title, j.user) for j in named.job_procs]
    if res.status != 0:
        err = clean_text(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "", 300)
        raise RuntimeError(f"the agent could not list {host}'s processes ({err or res.status})")
    return []


def ray_traceback(url: str, ip_of: Callable[[str], str]) -> RayTrace:
    """``RayTrace`` through a Ray dashboard's ``/worker/traceback?pid=&ip=`` (its agent on the
    node runs py-spy as the job's user); ``ip_of(host)``: the node's address Ray knows."""
    from verl_top.sources.ray import Dashboard, find_token

    dash = Dashboard(url, find_token())

    async def trace(host: str, pid: int) -> str:
        params = [("pid", str(int(pid))), ("ip", ip_of(host))]
        body = await dash.body("/worker/traceback", params, "text/plain")
        return body.decode("utf-8", "replace")

    return trace
