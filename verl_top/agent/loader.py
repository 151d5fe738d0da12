"""Runs the agent on a node from its zip, in memory: nothing is written to the node's disk.

The bootstrap (``verl_top.agent.ship.BOOTSTRAP``) reads the zip from stdin, checks its sha256,
and exec()s this module's source, which sits uncompressed in the zip at the offset its header
line gives; ``boot(data)`` then puts an importer for the package on ``sys.meta_path`` and runs
``main``. Self-contained (it runs before any other agent module can be imported): standard
library only, Python >= 3.8; ``zlib`` is the only module it adds (``zipfile`` and ``hashlib``
would keep ~2 MB and ~4 MB resident for the agent's whole life).
"""

from __future__ import annotations

import sys
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Sequence

PACKAGE = "verl_top_agent"  # the agent package's name on a node
EOCD = b"PK\x05\x06"  # end of central directory record
CENTRAL = b"PK\x01\x02"  # central directory file header
STORED, DEFLATED = 0, 8
MAX_ENTRY = 8 * 1024 * 1024  # an agent module is ~50 KB: anything larger is not our archive


def _u16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 2], "little")


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little")


def entry_data_offset(data: bytes, header_offset: int) -> int:
    """Where an entry's bytes start: after its local file header, name and extra field."""
    return header_offset + 30 + _u16(data, header_offset + 26) + _u16(data, header_offset + 28)


def read_zip(data: bytes) -> dict[str, bytes]:
    """The files of a zip archive with stored or deflated entries, by name (what ``zipfile``
    would give for the archives ``ship.build_zip`` writes); ValueError for anything else."""
    end = data.rfind(EOCD)
    if end < 0 or len(data) < end + 22:
        raise ValueError("not a zip archive (no end of central directory)")
    count, pos = _u16(data, end + 10), _u32(data, end + 16)
    files: dict[str, bytes] = {}
    for _ in range(count):
        if data[pos : pos + 4] != CENTRAL:
            raise ValueError(f"broken zip central directory at byte {pos}")
        method, size, name_len = _u16(data, pos + 10), _u32(data, pos + 20), _u16(data, pos + 28)
        name = data[pos + 46 : pos + 46 + name_len].decode("utf-8")
        start = entry_data_offset(data, _u32(data, pos + 42))
        raw = data[start : start + size]
        if method == DEFLATED:
            files[name] = zlib.decompressobj(-15).decompress(raw, MAX_ENTRY)
        elif method == STORED:
            files[name] = raw
        else:
            raise ValueError(f"zip entry {name}: compression method {method}")
        pos += 46 + name_len + _u16(data, pos + 30) + _u16(data, pos + 32)
    return files


class MemoryImporter:
    """Finds and loads the modules of one package from source held in memory (a meta-path
    finder and its loader). Tracebacks name ``<verl-top-agent>/PACKAGE/MODULE.py`` and show the
    source lines (``get_source``)."""

    def __init__(self, package: str, files: dict[str, bytes]) -> None:
        self.package = package
        self.files = {name: src for name, src in files.items() if name.endswith(".py")}

    def _file(self, fullname: str) -> tuple[str, bool] | None:
        """(archive path, is a package) of a module of ours, None for any other module."""
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        rel = fullname.replace(".", "/")
        if rel + "/__init__.py" in self.files:
            return rel + "/__init__.py", True
        if rel + ".py" in self.files:
            return rel + ".py", False
        return None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """A spec for a module of the package held here; None lets the next finder look."""
        found = self._file(fullname)
        if found is None:
            return None
        from importlib.machinery import ModuleSpec  # noqa: PLC0415 - frozen, already loaded

        spec = ModuleSpec(
            fullname, self, origin="<verl-top-agent>/" + found[0], is_package=found[1]
        )
        if found[1]:
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec: ModuleSpec) -> None:
        """The default module object."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Compile the module's source and run it in the module's namespace."""
        spec = module.__spec__
        found = self._file(module.__name__)
        if spec is None or found is None:
            raise ImportError(f"no source for {module.__name__}", name=module.__name__)
        code = compile(self.files[found[0]], spec.origin or found[0], "exec")
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str | None:
        """The module's source text (linecache reads it for tracebacks)."""
        found = self._file(fullname)
        return None if found is None else self.files[found[0]].decode("utf-8")


def boot(data: bytes) -> None:
    """Import the agent from the zip ``data`` and run it with this process's arguments; does not
    return (the agent ends the process with its exit status)."""
    sys.meta_path.insert(0, MemoryImporter(PACKAGE, read_zip(data)))
    main = __import__(PACKAGE + ".main", fromlist=["run"])
    main.run(sys.argv[1:])
