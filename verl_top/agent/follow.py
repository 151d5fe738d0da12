"""Log files followed like ``tail -F``: growth, truncation (copytruncate, with the lines that
reached only the rotated copy), rotation and late creation; only regular files. Standard library
only."""

from __future__ import annotations

import os
import stat

from .wire import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

    from .wire import Fields, Wire

FOLLOW_KINDS = ("verl", "nccl", "verl_config")
MAX_LINES_PER_RECORD = 500
MAX_READ_PER_POLL = 8 * 1024 * 1024  # bytes read from one followed file per tick
MAX_PARTIAL = 1024 * 1024  # a "line" longer than this is skipped to its newline (and counted)
MAX_CHARS_PER_RECORD = 256 * 1024  # log lines per record also stop here (fast to decode)
HEAD_BYTES = 4096  # fingerprint of a followed file: its first bytes (copytruncate detection)


def _chars_cut(lines: list[str], start: int, end: int) -> int:
    """Where the record starting at ``lines[start]`` ends (before ``end``): before the line that
    would take it past MAX_CHARS_PER_RECORD characters, after one line at least."""
    size = 0
    for i in range(start, end):
        size += len(lines[i])
        if i > start and size > MAX_CHARS_PER_RECORD:
            return i
    return end


class Follower:
    """Follows one file like ``tail -F``: growth, truncation, rotation, late creation."""

    def __init__(
        self,
        kind: str,
        path: str,
        from_start: bool = False,
        max_lines: int = MAX_LINES_PER_RECORD,
        max_read: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.kind = kind
        self.path = path
        self.max_lines = max_lines
        self.max_read = max_read or MAX_READ_PER_POLL
        self._fh: BinaryIO | None = None
        self._ino: tuple[int, int] | None = None
        self._offset = 0
        self._head = b""  # the file's first bytes when opened (to recognise its rotated copy)
        self._partial = b""
        self._reset = False
        self._from_start = from_start
        self._start_at = offset  # read from this byte on (the caller read what is before)
        self.error = ""  # why the path is not followed (not a regular file), said once
        self._said = ""
        self._roots = follow_roots(path)  # where the file may live (see link_problem)
        self._skipping = False  # inside a line longer than MAX_PARTIAL: dropped to its newline
        self.skipped_lines = 0
        self._skips_said = 0
        self._open(initial=True)

    def _open(self, initial: bool = False) -> bool:
        """Open the file; start at its end unless from_start or it appeared after we began.

        Only regular files are followed: opening a FIFO would block until a writer comes, and a
        directory or device is no log. O_NONBLOCK makes the open itself never wait.
        """
        problem = link_problem(self.path, self._roots)
        if problem:
            self.error = problem
            return False
        try:
            # The link (if any) was checked: open what it named, never through another link.
            real = os.path.realpath(self.path)
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(real, flags)
        except OSError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.error = f"{self.path}: not a regular file ({_file_kind(st.st_mode)}); give the log file itself"
            return False
        self.error = ""
        self._skipping = False
        self._fh = os.fdopen(fd, "rb")
        self._ino = (st.st_dev, st.st_ino)
        self._offset = 0 if (self._from_start or not initial) else st.st_size
        if initial and self._start_at is not None and self._start_at <= st.st_size:
            self._offset = self._start_at
        self._head = self._read_head()
        return True

    def _read_head(self) -> bytes:
        fh = self._fh
        if fh is None:  # closed: no fingerprint
            return b""
        try:
            fh.seek(0)
            return fh.read(HEAD_BYTES)
        except OSError:
            return b""

    def _rewritten(self, size: int) -> bool:
        """True when the file (same inode) no longer starts as it did: truncated and refilled."""
        if not self._head or size < len(self._head):
            return bool(self._head)
        return self._read_head()[: len(self._head)] != self._head

    def _rescue_copy(self, out: list[str]) -> None:
        """After a copytruncate rotation, read the lines that reached the copy but not us.

        ``logrotate copytruncate`` copies the file (``x.log.1``, ``x.log-20260101``) and then
        truncates it: what was appended since our last read is only in the copy. The copy is
        recognised by its first bytes (our fingerprint) and a size past our offset.
        """
        folder = os.path.dirname(self.path) or "."
        base = os.path.basename(self.path)
        best = None
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if (
                name == base
                or not name.startswith(base)
                or name[len(base) : len(base) + 1] not in ".-_"
            ):
                continue
            if name.endswith((".gz", ".xz", ".bz2", ".zst", ".lz4")):
                continue
            full = os.path.join(folder, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size > self._offset:
                if best is None or st.st_mtime > best[0]:
                    best = (st.st_mtime, full)
        if best is None:
            return
        try:
            with open(best[1], "rb") as fh:
                if fh.read(len(self._head)) != self._head:
                    return
                fh.seek(self._offset)
                data = self._partial + fh.read(self.max_read)
        except OSError:
            return
        self._partial = b""
        text = data.decode("utf-8", "replace")
        out.extend(line[:-1] if line.endswith("\r") else line for line in text.split("\n") if line)

    def _close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
        self._fh = None

    def _read_more(self, out: list[str]) -> None:
        """Read what was appended since the last call into ``out`` (complete lines only)."""
        fh = self._fh
        if fh is None:  # closed (rotated away): nothing more to read
            return
        fh.seek(self._offset)
        data = fh.read(self.max_read)
        if not data:
            return
        self._offset += len(data)
        if self._skipping:  # the rest of a runaway line: drop it up to its newline
            nl = data.find(b"\n")
            if nl < 0:
                return
            data, self._skipping = data[nl + 1 :], False
        data = self._partial + data
        cut = data.rfind(b"\n")
        self._partial = data if cut < 0 else data[cut + 1 :]
        if len(self._partial) > MAX_PARTIAL:
            # A runaway line (no newline in over 1 MiB): skip it whole, count it, read on. Emitted
            # in 1 MiB pieces it cut a finished log's read short.
            self._partial, self._skipping = b"", True
            self.skipped_lines += 1
        if cut < 0:
            return
        text = data[:cut].decode("utf-8", "replace")
        if len(text) > MAX_PARTIAL and max(map(len, text.split("\n"))) > MAX_PARTIAL:
            for line in text.split("\n"):
                if len(line) > MAX_PARTIAL:  # as long as a runaway line, newline or not
                    self.skipped_lines += 1
                    continue
                out.append(line[:-1] if line.endswith("\r") else line)
            return
        if "\r" in text:  # a CRLF line loses its \r (one pass, not one test per line)
            text = text.replace("\r\n", "\n")
            if text.endswith("\r"):
                text = text[:-1]
        out.extend(text.split("\n"))

    def _flush_partial(self, out: list[str]) -> None:
        if self._partial:
            out.append(self._partial.decode("utf-8", "replace").rstrip("\r"))
            self._partial = b""

    def poll(self, host: str, t: float) -> list[Wire]:
        """Log record dicts for what changed since the last poll."""
        records: list[Wire] = []
        lines: list[str] = []
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        if self._fh is not None:
            if st is None or (st.st_dev, st.st_ino) != self._ino:  # rotated
                # Lines written to the old file just before the rotation are still ours.
                try:
                    self._read_more(lines)
                except OSError:
                    pass
                self._flush_partial(lines)
                self._emit(records, host, t, lines)
                lines = []
                self._close()
                self._reset = True
            elif st.st_size < self._offset or (
                st.st_size != self._offset and self._rewritten(st.st_size)
            ):
                # Truncated (copytruncate): the lines written since our last read are in the copy.
                self._rescue_copy(lines)
                self._emit(records, host, t, lines)
                lines = []
                self._offset = 0
                self._partial = b""
                self._skipping = False
                self._reset = True
                self._head = b""
        if self._fh is None:
            if st is None or not self._open():
                if self.error and self.error != self._said:
                    self._said = self.error
                    records.append(record("event", host, t, _error_event(self)))
                return records
        if not self._head and self._offset == 0:
            self._head = self._read_head()
        if st is not None and st.st_size == self._offset and not self._reset:
            return records
        try:
            self._read_more(lines)
        except OSError:
            self._close()
            return records
        if lines or self._reset:
            self._emit(records, host, t, lines)
        if self.skipped_lines != self._skips_said:
            self._skips_said = self.skipped_lines
            records.append(skipped_event(self.path, self.skipped_lines, host, t))
        return records

    @property
    def handle(self) -> BinaryIO | None:
        """The followed file, open (None while it is not: missing, refused)."""
        return self._fh

    def seek(self, offset: int) -> None:
        """Go on from byte ``offset`` (the caller read the file up to there)."""
        self._offset = offset
        self._partial = b""
        self._skipping = False

    @property
    def caught_up(self) -> bool:
        """True when everything the file held at the last poll has been read (or it is gone)."""
        if self._fh is None:
            return True
        try:
            return os.fstat(self._fh.fileno()).st_size <= self._offset
        except OSError:
            return True

    def _emit(self, records: list[Wire], host: str, t: float, lines: list[str]) -> None:
        if not lines and not self._reset:
            return
        # At most max_lines lines and about MAX_CHARS_PER_RECORD characters per record (a line
        # longer than that alone); counted per slice, line by line only in a slice that is over.
        start, n = 0, len(lines)
        while start < n:
            end = min(n, start + self.max_lines)
            if sum(map(len, lines[start:end])) > MAX_CHARS_PER_RECORD:
                end = _chars_cut(lines, start, end)
            self._emit_one(records, host, t, lines[start:end])
            start = end
        if not lines:
            self._emit_one(records, host, t, [])

    def _emit_one(self, records: list[Wire], host: str, t: float, lines: list[str]) -> None:
        fields = (
            ("path", self.path),
            ("kind", self.kind),
            ("lines", lines),
            ("reset", self._reset),
        )
        records.append(record("log", host, t, fields))
        self._reset = False

    def flush(self, host: str, t: float) -> list[Wire]:
        """Log records for a last line that has no newline yet (the file is known finished)."""
        lines: list[str] = []
        self._flush_partial(lines)
        records: list[Wire] = []
        if lines:
            self._emit(records, host, t, lines)
        return records

    def close(self) -> None:
        self._close()


def skipped_event(path: str, count: int, host: str, t: float) -> Wire:
    """The event saying ``count`` runaway lines of ``path`` were skipped."""
    text = f"{path}: {count} line(s) over {MAX_PARTIAL} bytes without a newline skipped"
    fields = (("kind", "error"), ("text", text), ("path", path), ("severity", 0.3))
    return record("event", host, t, fields)


def follow_roots(path: str) -> set[str]:
    """The directories a followed file may live in: its folder as given and as resolved, and
    the folder of what it points to when it is a link already (the user named that link)."""
    folder = os.path.dirname(os.path.abspath(path))
    roots = {folder, os.path.realpath(folder)}
    if os.path.islink(path):
        roots.add(os.path.dirname(os.path.realpath(path)))
    return roots


def link_problem(path: str, roots: set[str]) -> str:
    """Why ``path`` must not be read ("" when it may): it is a link to a file outside the
    job's directories (``roots``, and where its folder resolves to now).

    A followed log that another user replaced by a link to a secret (~/.ssh/id_rsa) would
    otherwise be read from its start into snapshots and recordings.
    """
    if not os.path.islink(path):
        return ""
    target = os.path.realpath(path)
    allowed = set(roots) | {os.path.realpath(os.path.dirname(os.path.abspath(path)))}
    for root in allowed:
        try:
            if os.path.commonpath([root, target]) == root:
                return ""
        except ValueError:
            continue
    return f"{path}: became a link to {target}, outside the job's directories " + (
        f"({', '.join(sorted(allowed))}); not read"
    )


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _error_event(follower: Follower) -> Fields:
    return (
        ("kind", "error"),
        ("text", follower.error),
        ("path", follower.path),
        ("severity", 0.5),
    )


def parse_follow(spec: str) -> tuple[str, str, bool]:
    """``KIND[+start]:PATH`` -> (kind, path, from_start)."""
    kind, sep, path = spec.partition(":")
    if not sep or not path:
        raise ValueError(f"--follow wants KIND:PATH, got {spec!r}")
    from_start = False
    if kind.endswith("+start"):
        kind, from_start = kind[: -len("+start")], True
    if kind not in FOLLOW_KINDS:
        raise ValueError(
            "follow kind must be one of {}, got {!r}".format("|".join(FOLLOW_KINDS), kind)
        )
    return kind, path, from_start
