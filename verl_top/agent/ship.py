"""Shipping the agent to a node (client side; this module is never sent itself).

The SSH client runs ``python3 -u -c "<BOOTSTRAP>" ARGS`` on the node and writes
``agent_payload()`` to the process's stdin: one header line ``"N SHA256 OFFSET SIZE"``, then N
characters of base64 text holding a deflated zip of the agent package (base64 keeps the text
stdin readable: the same stdin then carries the agent's JSON control lines). The bootstrap
decodes the zip, refuses it unless its sha256 matches, and exec()s ``loader.py`` (stored
uncompressed at OFFSET, SIZE bytes), which imports the package from memory and runs it with
``sys.argv = ['verl-top-agent'] + ARGS``. Nothing is written to the node. The replay backend
goes only to agents started with ``--backend replay``. See docs/protocol.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import shlex
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .loader import PACKAGE, entry_data_offset

AGENT_DIR = Path(__file__).parent
# Modules that stay here: this one, and the entry for ``python -m verl_top.agent``.
CLIENT_ONLY = frozenset(("ship.py", "__main__.py"))
ON_REQUEST = {"replay.py": "replay"}  # module -> the backend that needs it on the node
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed entry dates: the same source gives the same sha256

# Kept free of double quotes, backslashes, '$', '!' and backticks so it can sit inside double
# quotes on a remote shell command line unchanged. It reads through sys.stdin (the text layer) so
# that control lines buffered behind the payload stay readable by the agent. The sha256 comes
# from the interpreter's built-in module when there is one (hashlib loads OpenSSL: ~4 MB more
# resident for the agent's life). A short stream (the connection dropped) or no header at all
# fails that check too, with its message rather than a traceback.
BOOTSTRAP_REFUSAL = (
    "verl-top-agent: the agent payload does not match its sha256 (cut short or damaged in transit)"
)
BOOTSTRAP = (
    "import sys,binascii,importlib.util as u;"
    "h=sys.stdin.readline().split()+['0','-'];"
    "t=sys.stdin.read(int(h[0]));"
    "d=binascii.a2b_base64(t[:len(t)&-4]);"
    "del t;"
    "m=[n for n in ('_sha2','_sha256') if u.find_spec(n)]+['hashlib'];"
    "__import__(m[0]).sha256(d).hexdigest()==h[1] or "
    f"sys.exit('{BOOTSTRAP_REFUSAL}');"
    "o,n=int(h[2]),int(h[3]);"
    "g={'__name__':'verl_top_agent_loader','__builtins__':__builtins__};"
    "exec(compile(d[o:o+n],'<verl-top-agent>/loader.py','exec'),g);"
    "g['boot'](d)"
)


@dataclass(frozen=True)
class Payload:
    """The zipped agent and what the bootstrap needs to check and start it."""

    zip: bytes
    sha256: str
    loader_offset: int  # where loader.py's bytes start in ``zip`` (stored, not deflated)
    loader_size: int
    modules: tuple[str, ...]  # archive names, for docs and tests

    def text(self) -> str:
        """What is written to the bootstrap's stdin: the header line, then the base64 zip."""
        body = base64.b64encode(self.zip).decode("ascii")
        head = f"{len(body)} {self.sha256} {self.loader_offset} {self.loader_size}\n"
        return head + body


def module_files(replay: bool = False) -> list[Path]:
    """The agent modules a node gets: the package, less the client-only modules, and less the
    replay backend unless the agent is asked to replay."""
    wanted = []
    for path in sorted(AGENT_DIR.glob("*.py")):
        if path.name in CLIENT_ONLY or (path.name in ON_REQUEST and not replay):
            continue
        wanted.append(path)
    return wanted


def build_zip(files: Sequence[Path]) -> tuple[bytes, int, int]:
    """(zip bytes, loader offset, loader size): ``loader.py`` first and stored, so the bootstrap
    can run it by slicing; every other module deflated at level 9."""
    buf = io.BytesIO()
    ordered = sorted(files, key=lambda p: (p.name != "loader.py", p.name))
    with zipfile.ZipFile(buf, "w") as zf:
        for path in ordered:
            info = zipfile.ZipInfo(f"{PACKAGE}/{path.name}", ZIP_TIME)
            info.compress_type = (
                zipfile.ZIP_STORED if path.name == "loader.py" else zipfile.ZIP_DEFLATED
            )
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes(), compresslevel=9)
        loader = zf.getinfo(f"{PACKAGE}/loader.py")
    data = buf.getvalue()
    return data, entry_data_offset(data, loader.header_offset), loader.file_size


@functools.lru_cache(maxsize=2)
def build(replay: bool = False) -> Payload:
    """The payload for an agent (with the replay backend when ``replay``); built once per run."""
    files = module_files(replay)
    data, offset, size = build_zip(files)
    names = tuple(f"{PACKAGE}/{p.name}" for p in files)
    return Payload(data, hashlib.sha256(data).hexdigest(), offset, size, names)


def wants_replay(args: Sequence[str]) -> bool:
    """True when an agent command line selects the replay backend (``--backend replay`` or
    ``--backend=replay``)."""
    for i, arg in enumerate(args):
        if arg == "--backend=replay" or (
            arg == "--backend" and list(args[i + 1 : i + 2]) == ["replay"]
        ):
            return True
    return False


def agent_payload(args: Sequence[str] = ()) -> str:
    """The stdin text for an agent started with ``args`` (see the module docstring)."""
    return build(wants_replay(args)).text()


def bootstrap_for(client: str) -> str:
    """``BOOTSTRAP`` led by ``verl_top_agent='CLIENT';``, so ``ps -ef`` on a node shows what runs
    and for which machine: ``python3 -u -c verl_top_agent='laptop';import sys;...``. The name
    is reduced to host-name characters (it sits inside the quoted -c argument)."""
    safe = "".join(c for c in client if c.isascii() and (c.isalnum() or c in ".-_"))[:64]
    return f"verl_top_agent='{safe or 'client'}';{BOOTSTRAP}"


def remote_command(args: Sequence[str] = (), python: str = "python3") -> str:
    """The shell command that starts the agent on a node (arguments shell-quoted)."""
    tail = " ".join(shlex.quote(a) for a in args)
    return f'{python} -u -c "{BOOTSTRAP}"' + (f" {tail}" if tail else "")
