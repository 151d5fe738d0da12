"""The node agent and how to ship it.

``node_agent.py`` is one self-contained file (standard library only, Python >= 3.8). The SSH
client does not install it on nodes: it runs ``python3 -u -c "<BOOTSTRAP>" ARGS`` and writes
``agent_payload()`` to the process's stdin. The bootstrap reads a line with the character count N,
then N characters of source, and exec()s them as ``__main__`` with
``sys.argv = ['verl-top-agent'] + ARGS``. After that, the same stdin is the agent's control
channel (JSON lines); closing it stops the agent. See docs/protocol.md.
"""

from __future__ import annotations

from pathlib import Path

AGENT_FILE = Path(__file__).with_name("node_agent.py")

# Kept free of double quotes, backslashes, '$', '!' and backticks so it can sit inside double
# quotes on a remote shell command line unchanged. It reads through sys.stdin (the text layer) so
# that control lines buffered behind the source stay readable by the agent.
BOOTSTRAP = (
    "import sys;"
    "n=int(sys.stdin.readline());"
    "s=sys.stdin.read(n);"
    "sys.argv=['verl-top-agent']+sys.argv[1:];"
    "g={'__name__':'__main__','__file__':'verl-top-agent','__builtins__':__builtins__};"
    "exec(compile(s,'verl-top-agent','exec'),g)"
)


def bootstrap_for(client: str) -> str:
    """``BOOTSTRAP`` led by ``verl_top_agent='CLIENT';``, so ``ps -ef`` on a node shows what runs
    and for which machine: ``python3 -u -c verl_top_agent='laptop';import sys;...``. The name
    is reduced to host-name characters (it sits inside the quoted -c argument)."""
    safe = "".join(c for c in client if c.isascii() and (c.isalnum() or c in ".-_"))[:64]
    return f"verl_top_agent='{safe or 'client'}';{BOOTSTRAP}"


def agent_source() -> str:
    """The text of ``node_agent.py`` (what the bootstrap exec()s on the node)."""
    return AGENT_FILE.read_text(encoding="utf-8")


def agent_payload() -> str:
    """What the client writes to the bootstrap's stdin: ``f"{len(src)}\\n{src}"``."""
    src = agent_source()
    return f"{len(src)}\n{src}"


def remote_command(args: list[str] | tuple[str, ...] = (), python: str = "python3") -> str:
    """The shell command that starts the agent on a node (arguments shell-quoted)."""
    import shlex

    tail = " ".join(shlex.quote(a) for a in args)
    return f'{python} -u -c "{BOOTSTRAP}"' + (f" {tail}" if tail else "")


__all__ = [
    "AGENT_FILE",
    "BOOTSTRAP",
    "agent_payload",
    "agent_source",
    "bootstrap_for",
    "remote_command",
]
