"""GPU backends: what they share, the "none" backend, and choosing one (NVML, nvidia-smi, replay).

A backend has ``name``, ``driver``, ``nvml_version``, ``gpus`` (GpuInfo wire dicts),
``capabilities``, ``error``, ``blocking``, ``sample(now)`` -> one tuple of field pairs per GPU,
``processes()`` -> ``[(pid, gpu_index, used_mib)]`` or None, and ``close()``. The NVML,
nvidia-smi and replay backends live in their own modules and are imported only when chosen
(the replay module is shipped to a node only when the agent is asked to replay).
"""

from __future__ import annotations

from .strides import GPM_EVERY, MEM_EVERY, SLOW_EVERY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace
    from typing import Any, Protocol

    from .wire import Fields

    ProcRow = tuple[int, int, float | None]  # (pid, GPU index, used MiB)

    class Backend(Protocol):
        """What the agent asks of a GPU backend."""

        name: str
        blocking: bool
        driver: str
        nvml_version: str
        gpus: list[dict[str, Any]]
        capabilities: list[str]
        error: str

        def sample(self, now: float) -> list[Fields]: ...

        def processes(self) -> list[ProcRow] | None: ...

        def close(self) -> None: ...


MISMATCH_MSG = "Driver/library version mismatch: reload the NVIDIA kernel module or reboot"


def gpu_info(
    index: int,
    name: str = "",
    uuid: str = "",
    mem_total_mib: float | None = None,
    bus_id: str = "",
    power_limit_w: float | None = None,
    gpm: bool = False,
) -> dict[str, Any]:
    """A GpuInfo wire dict in model order."""
    out: dict[str, Any] = {"index": index, "name": name, "uuid": uuid}
    if mem_total_mib is not None:
        out["mem_total_mib"] = mem_total_mib
    out["bus_id"] = bus_id
    if power_limit_w is not None:
        out["power_limit_w"] = power_limit_w
    out["gpm"] = bool(gpm)
    return out


def lost_fields(index: int) -> Fields:
    """The field pairs of a GPU that fell off the bus."""
    return (("index", index), ("lost", True), ("label", ""))


class BackendUnavailable(Exception):
    """A backend cannot start; the message says why in plain words."""


class NoneBackend:
    """No GPUs: host samples still flow, hello.error says why."""

    name = "none"
    blocking = False

    def __init__(self, error: str = "") -> None:
        self.driver = ""
        self.nvml_version = ""
        self.gpus: list[dict[str, Any]] = []
        self.capabilities: list[str] = []
        self.error = error or "no GPU backend selected"

    def sample(self, now: float) -> list[Fields]:
        """No GPU, no fields."""
        return []

    def processes(self) -> list[ProcRow] | None:
        """No GPU processes to list."""
        return None

    def close(self) -> None:
        """Nothing to release."""


def _replay(opts: Namespace) -> Backend:
    try:
        from .replay import ReplayBackend  # noqa: PLC0415 - shipped only to replaying agents
    except ImportError:
        return NoneBackend("the replay backend was not sent to this agent")
    try:
        return ReplayBackend(
            opts.replay_trace, opts.replay_gpus, opts.replay_speed, opts.replay_seed, opts.interval
        )
    except BackendUnavailable as exc:
        return NoneBackend(str(exc))


def _nvml(opts: Namespace) -> tuple[Backend | None, str]:
    """The NVML backend through ctypes, then the pynvml module (as ``--nvml`` allows), or why
    neither works."""
    from .nvml import CtypesNvml, NvmlBackend  # noqa: PLC0415 - only when NVML is tried

    reason = ""
    binding = getattr(opts, "nvml", "auto")
    strides = (
        getattr(opts, "gpm_every", GPM_EVERY),
        getattr(opts, "slow_every", SLOW_EVERY),
        getattr(opts, "mem_every", MEM_EVERY),
    )
    if binding in ("auto", "ctypes"):
        try:
            return NvmlBackend(CtypesNvml(), *strides), ""
        except BackendUnavailable as exc:
            reason = str(exc)
    if binding in ("auto", "pynvml"):
        try:
            return NvmlBackend(None, *strides), ""
        except BackendUnavailable as exc:
            # pynvml missing says less than the library's own reason when there is one
            if not (reason and "not installed" in str(exc)):
                reason = str(exc)
    return None, reason


def make_backend(opts: Namespace) -> Backend:
    """The GPU backend for ``opts.backend``: "auto" tries NVML (through ctypes, then the pynvml
    module, as ``--nvml`` allows), then nvidia-smi, then none."""
    choice = opts.backend
    if choice == "replay":
        return _replay(opts)
    if choice == "none":
        return NoneBackend("GPU sampling disabled (--backend none)")
    nvml_reason = smi_reason = ""
    if choice in ("auto", "pynvml"):
        backend, nvml_reason = _nvml(opts)
        if backend is not None:
            return backend
        if choice == "pynvml":
            return NoneBackend(nvml_reason)
    if choice in ("auto", "nvidia-smi"):
        from .smi import SmiBackend  # noqa: PLC0415 - only when nvidia-smi is tried

        try:
            smi = SmiBackend()
        except BackendUnavailable as exc:
            smi_reason = str(exc)
        else:
            if nvml_reason:
                smi.error = f"NVML unavailable ({nvml_reason}); using nvidia-smi"
            return smi
        if choice == "nvidia-smi":
            return NoneBackend(smi_reason)
    return NoneBackend(no_gpu_message(nvml_reason, smi_reason))


def no_gpu_message(nvml_reason: str, smi_reason: str) -> str:
    """Plain words for why neither NVML nor nvidia-smi gives GPU data."""
    if MISMATCH_MSG in (nvml_reason, smi_reason):
        return MISMATCH_MSG
    driverless = ("library not found", "driver not loaded", "not on PATH")
    if all(any(d in r for d in driverless) for r in (nvml_reason, smi_reason) if r):
        return f"no NVIDIA driver: {nvml_reason} and {smi_reason}"
    return f"no GPU data: {nvml_reason}; {smi_reason}"
