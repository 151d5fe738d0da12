"""GPUs through ``nvidia-smi --query-gpu`` spawned per tick: the fallback when NVML cannot be
loaded (~100 ms and ~25 ms of CPU per spawn). Also parses nvidia-smi's CSV for other callers."""

from __future__ import annotations

from .backends import MISMATCH_MSG, BackendUnavailable, gpu_info
from .wire import GPU_FIELDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .backends import ProcRow
    from .wire import Fields

    Runner = Callable[[list[str]], str]  # nvidia-smi arguments -> its output

SMI_QUERY = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks_event_reasons.active"
)
SMI_APPS_QUERY = "pid,used_memory,gpu_uuid"
# Header names nvidia-smi prints for query names that differ (header -> query name).
SMI_HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "power.draw.average": "power.draw",
}
SMI_FIELD_MAP = (
    ("utilization.gpu", "util_gpu"),
    ("utilization.memory", "util_mem"),
    ("memory.used", "mem_used_mib"),
    ("memory.total", "mem_total_mib"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("temperature.gpu", "temp_c"),
    ("clocks.sm", "sm_mhz"),
    ("clocks.mem", "mem_mhz"),
    ("clocks_event_reasons.active", "clock_reasons"),
)
_SMI_NUM = r"^([-+]?\d+(?:\.\d+)?)\s*(?:[A-Za-z%/]+)?$"


def smi_value(text: str) -> int | float | None:
    """A number from an nvidia-smi CSV cell ("117.90 W", "0 %", "0x1", "[N/A]" -> None)."""
    s = text.strip()
    if not s or s[0] == "[" or s in ("N/A", "Not Supported"):
        return None
    if s[:2].lower() == "0x":
        try:
            return int(s, 16)
        except ValueError:
            return None
    import re  # noqa: PLC0415 - only the nvidia-smi path parses text (re caches the pattern)

    m = re.match(_SMI_NUM, s)
    if not m:
        return None
    num = m.group(1)
    return float(num) if "." in num else int(num)


def _smi_header_name(cell: str) -> str:
    name = cell.strip()
    if name.endswith("]") and " [" in name:
        name = name[: name.rindex(" [")]
    return SMI_HEADER_ALIASES.get(name, name)


def parse_smi_csv(text: str, fields: str | list[str] | None = None) -> list[dict[str, str]]:
    """Rows of nvidia-smi ``--format=csv[,noheader][,nounits]`` output as dicts of raw cells.

    With a header line, columns are named by it (units and renamed headers understood); without
    one, by ``fields`` (the query list). Lines that are not data (prompts, errors) are skipped.
    """
    names = [f.strip() for f in fields.split(",")] if isinstance(fields, str) else fields
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "$#":
            continue
        cells = [c.strip() for c in line.split(",")]
        if "index" in cells or any(c.startswith("utilization.") for c in cells):
            names = [_smi_header_name(c) for c in cells]
            continue
        if names is None or len(cells) != len(names):
            continue
        rows.append(dict(zip(names, cells)))
    return rows


def smi_gpu_fields(row: dict[str, str]) -> Fields | None:
    """Field pairs of a gpu record from one parsed nvidia-smi row (None when not a GPU row)."""
    index = smi_value(row.get("index", ""))
    if not isinstance(index, int):
        return None
    f = {"index": index}
    lost = False
    for key, name in SMI_FIELD_MAP:
        cell = row.get(key)
        if cell is None:
            continue
        if "GPU is lost" in cell or "GPU requires reset" in cell:
            lost = True
        f[name] = smi_value(cell)
    if lost:
        return (("index", index), ("lost", True), ("label", ""))
    f["lost"] = False
    f["label"] = ""
    return tuple((k, f[k]) for k in GPU_FIELDS if f.get(k) is not None)


def _smi_error(text: str) -> str:
    if "version mismatch" in text:
        return MISMATCH_MSG
    if "couldn't communicate with the NVIDIA driver" in text:
        return "NVIDIA driver not loaded"
    line = text.strip().splitlines()[0] if text.strip() else "no output"
    return f"nvidia-smi failed: {line[:200]}"


class SmiBackend:
    """Spawns nvidia-smi per tick (fallback when pynvml is missing; ~100 ms per spawn)."""

    name = "nvidia-smi"
    blocking = True

    def __init__(self, exe: str | None = None, runner: Runner | None = None) -> None:
        import shutil  # noqa: PLC0415 - only this fallback needs it

        self.exe = exe or shutil.which("nvidia-smi")
        if not self.exe:
            raise BackendUnavailable("nvidia-smi not on PATH")
        self._run = runner or self._spawn
        self.error = ""
        self.nvml_version = ""
        out = self._run(["--query-gpu=" + SMI_QUERY + ",driver_version"])
        rows = parse_smi_csv(out, SMI_QUERY + ",driver_version")
        gpus = []
        self._uuid_index = {}
        for row in rows:
            idx = smi_value(row.get("index", ""))
            if not isinstance(idx, int):
                continue
            self._uuid_index[row.get("uuid", "")] = idx
            total = smi_value(row.get("memory.total", ""))
            limit = smi_value(row.get("power.limit", ""))
            gpus.append(
                gpu_info(
                    idx,
                    row.get("name", ""),
                    row.get("uuid", ""),
                    float(total) if total is not None else None,
                    row.get("pci.bus_id", ""),
                    float(limit) if limit is not None else None,
                    False,
                )
            )
        if not gpus:
            raise BackendUnavailable(_smi_error(out))
        self.gpus = gpus
        self.driver = rows[0].get("driver_version", "")
        self.capabilities = ["procs"]
        self.failing = ""

    def _spawn(self, args: list[str]) -> str:
        import subprocess  # noqa: PLC0415 - only this fallback spawns

        try:
            proc = subprocess.run(
                [self.exe] + args + ["--format=csv,noheader,nounits"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=15,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"nvidia-smi could not run: {exc}"
        return proc.stdout.decode("utf-8", "replace")

    def sample(self, now: float) -> list[Fields]:
        out = self._run(["--query-gpu=" + SMI_QUERY])
        result = []
        for row in parse_smi_csv(out, SMI_QUERY):
            fields = smi_gpu_fields(row)
            if fields is not None:
                result.append(fields)
        self.failing = "" if result else _smi_error(out)
        return result

    def processes(self) -> list[ProcRow]:
        out = self._run(["--query-compute-apps=" + SMI_APPS_QUERY])
        procs = []
        for row in parse_smi_csv(out, SMI_APPS_QUERY):
            pid = smi_value(row.get("pid", ""))
            if not isinstance(pid, int):
                continue
            idx = self._uuid_index.get(row.get("gpu_uuid", ""))
            if idx is None:
                continue
            used = smi_value(row.get("used_memory", ""))
            procs.append((pid, idx, float(used) if used is not None else None))
        return procs

    def close(self) -> None:
        pass
