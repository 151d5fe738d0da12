"""GPUs through NVML: libnvidia-ml.so.1 straight through ctypes (``CtypesNvml``, no module to
load) or the pynvml module, with cached handles, cached "not supported" answers, GPM (Hopper+)
and a fast path that calls the C entry points with buffers made once (``_DirectNvml``)."""

from __future__ import annotations

import os
import time

from .backends import MISMATCH_MSG, BackendUnavailable, gpu_info, lost_fields
from .strides import GPM_EVERY, MEM_EVERY, SLOW_EVERY
from .wire import GPU_FIELDS, MIB, r1, to_str

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .backends import ProcRow
    from .wire import Fields

    RcCheck = Callable[[int, str, int], bool]

LOST_RETRY_S = 30.0
GPM_MIN_GAP_S = 0.1  # NVML: GPM samples closer than 100 ms give no valid metrics
NVML_FI_POWER_AVERAGE = 185  # nvml.h NVML_FI_DEV_POWER_AVERAGE: what nvmlDeviceGetPowerUsage gives

# NVML return codes (nvml.h); compared with NVMLError.value so any pynvml version works.
NVML_NOT_SUPPORTED = 3
NVML_NO_PERMISSION = 4
NVML_DRIVER_NOT_LOADED = 9
NVML_LIBRARY_NOT_FOUND = 12
NVML_FUNCTION_NOT_FOUND = 13
NVML_GPU_IS_LOST = 15
NVML_RESET_REQUIRED = 16
NVML_LIB_RM_VERSION_MISMATCH = 18

NVML_INIT_REASONS = {
    NVML_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    NVML_LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1)",
    NVML_LIB_RM_VERSION_MISMATCH: MISMATCH_MSG,
}

# GPM metric id -> gpu record field (ids from nvml.h nvmlGpmMetricId_t).
GPM_METRICS = (
    (2, "sm_util"),
    (3, "sm_occupancy"),
    (5, "tensor_util"),
    (10, "dram_util"),
    (60, "nvlink_rx_mibs"),
    (61, "nvlink_tx_mibs"),
    (20, "pcie_tx_mibs"),
    (21, "pcie_rx_mibs"),
)


class GpuLost(Exception):
    """The GPU answered "lost" or "reset required": report it lost and retry later."""


def _nvml_structs() -> tuple[Any, Any, Any, Any]:
    """ctypes layouts of the nvml.h structs the fast path fills (made once, on first use)."""
    import ctypes as c  # noqa: PLC0415 - only the NVML fast path needs it

    class Utilization(c.Structure):
        _fields_ = (("gpu", c.c_uint), ("memory", c.c_uint))

    class MemoryV2(c.Structure):
        _fields_ = (
            ("version", c.c_uint),
            ("total", c.c_ulonglong),
            ("reserved", c.c_ulonglong),
            ("free", c.c_ulonglong),
            ("used", c.c_ulonglong),
        )

    class Value(c.Union):
        _fields_ = (
            ("dVal", c.c_double),
            ("uiVal", c.c_uint),
            ("ulVal", c.c_ulong),
            ("ullVal", c.c_ulonglong),
            ("sllVal", c.c_longlong),
            ("siVal", c.c_int),
            ("usVal", c.c_ushort),
        )

    class FieldValue(c.Structure):
        _fields_ = (
            ("fieldId", c.c_uint),
            ("scopeId", c.c_uint),
            ("timestamp", c.c_longlong),
            ("latencyUsec", c.c_longlong),
            ("valueType", c.c_int),
            ("nvmlReturn", c.c_int),
            ("value", Value),
        )

    return c, Utilization, MemoryV2, FieldValue


_VALUE_KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t
NVML_MEMORY_V2 = 0x02000028  # nvml.h nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24


class _DirectNvml:
    """The per-tick NVML reads through the library's C entry points, with every buffer made once.

    pynvml's getters allocate a ctypes struct, a byref() and an exception check per call; here
    each GPU owns its structs and pre-built pointers, and a call is one C call plus reading the
    struct. Power comes from one ``nvmlDeviceGetFieldValues`` call per GPU (the only per-tick
    value of a gpu record that NVML offers as a field; utilisation, memory, clocks, temperature
    and clock-event reasons have no field ids).
    """

    def __init__(self, fp: Callable[[str], Any], count: int) -> None:
        c, Utilization, MemoryV2, FieldValue = _nvml_structs()
        self.util_fn = fp("nvmlDeviceGetUtilizationRates")
        self.mem_fn = fp("nvmlDeviceGetMemoryInfo_v2")
        self.clock_fn = fp("nvmlDeviceGetClockInfo")
        self.temp_fn = fp("nvmlDeviceGetTemperature")
        self.fields_fn = fp("nvmlDeviceGetFieldValues")
        try:
            self.reasons_fn = fp("nvmlDeviceGetCurrentClocksEventReasons")
        except Exception:  # drivers before 535 have only the old name
            self.reasons_fn = fp("nvmlDeviceGetCurrentClocksThrottleReasons")
        self.power_fn = fp("nvmlDeviceGetPowerUsage")
        self.use_fields = True
        self.bufs = []
        for _ in range(count):
            util, mem = Utilization(), MemoryV2()
            mem.version = NVML_MEMORY_V2
            sm, memclk, temp, power = c.c_uint(), c.c_uint(), c.c_uint(), c.c_uint()
            reasons = c.c_ulonglong()
            fv = (FieldValue * 1)()
            fv[0].fieldId = NVML_FI_POWER_AVERAGE
            ptrs = tuple(c.pointer(x) for x in (util, mem, sm, memclk, temp, reasons, power))
            self.bufs.append((util, mem, sm, memclk, temp, reasons, power, fv, ptrs))
        self.n1 = c.c_int(1)

    @classmethod
    def make(cls, nv: Any, count: int) -> _DirectNvml | None:
        """The fast path when the binding exposes its C entry points (pynvml does), else None."""
        fp = getattr(nv, "_nvmlGetFunctionPointer", None)
        if fp is None or os.environ.get("VERL_TOP_AGENT_NVML_API"):
            return None
        try:
            return cls(fp, count)
        except Exception:  # an old library without one of the entry points: pynvml's getters
            return None

    def read(
        self,
        i: int,
        h: Any,
        f: dict[str, Any],
        slow: bool,
        mem_due: bool,
        rc: RcCheck,
        un: set[tuple[int, str]],
    ) -> None:
        """Fill ``f`` (GPU i's reused field dict); ``slow``/``mem_due``: the strided values are
        due; ``rc(i, key, code)`` handles return codes and ``un`` holds the (gpu, key) pairs
        known to be unsupported."""
        util, mem, sm, memclk, temp, reasons, power, fv, p = self.bufs[i]
        if (i, "util") not in un and rc(i, "util", self.util_fn(h, p[0])):
            f["util_gpu"] = util.gpu
            f["util_mem"] = util.memory
        if (mem_due or "mem_used_mib" not in f) and (i, "mem") not in un:
            if rc(i, "mem", self.mem_fn(h, p[1])):
                f["mem_used_mib"] = round(mem.used / MIB, 1)
                f["mem_total_mib"] = round(mem.total / MIB, 1)
        self._power(i, h, f, fv, power, p[6], rc, un)
        if (i, "sm_clk") not in un and rc(i, "sm_clk", self.clock_fn(h, 1, p[2])):
            f["sm_mhz"] = sm.value  # NVML_CLOCK_SM
        if (i, "reasons") not in un and rc(i, "reasons", self.reasons_fn(h, p[5])):
            f["clock_reasons"] = reasons.value
        if slow or "temp_c" not in f:
            if (i, "temp") not in un and rc(i, "temp", self.temp_fn(h, 0, p[4])):
                f["temp_c"] = temp.value  # NVML_TEMPERATURE_GPU
            if (i, "mem_clk") not in un and rc(i, "mem_clk", self.clock_fn(h, 2, p[3])):
                f["mem_mhz"] = memclk.value  # NVML_CLOCK_MEM
            f.setdefault("temp_c", None)

    def _power(
        self,
        i: int,
        h: Any,
        f: dict[str, Any],
        fv: Any,
        power: Any,
        ptr: Any,
        rc: RcCheck,
        un: set[tuple[int, str]],
    ) -> None:
        if self.use_fields:
            code = self.fields_fn(h, self.n1, fv)
            if code == 0 and fv[0].nvmlReturn == 0:
                v = getattr(fv[0].value, _VALUE_KINDS[fv[0].valueType % 7])
                f["power_w"] = round(v / 1000.0, 1)
                return
            if code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise GpuLost()
            self.use_fields = False  # the field is not offered here: the plain getter from now on
        if (i, "power") not in un and rc(i, "power", self.power_fn(h, ptr)):
            f["power_w"] = round(power.value / 1000.0, 1)


class NvmlCallError(Exception):
    """An NVML call returned an error code (``value``), like pynvml's NVMLError."""

    def __init__(self, value: int, text: str = "") -> None:
        Exception.__init__(self, text or f"NVML error {value}")
        self.value = value


GPM_METRICS_ROOM = 512  # entries of nvmlGpmMetricsGet_t.metrics (nvml.h's maximum is below that)


class CtypesNvml:
    """The NVML calls the agent makes, straight from libnvidia-ml.so.1 through ctypes: the same
    names and return values as pynvml's (what ``NvmlBackend`` uses), without importing pynvml,
    whose module alone keeps ~4 MB resident. Struct layouts follow nvml.h."""

    NVMLError = NvmlCallError
    nvmlMemory_v2 = NVML_MEMORY_V2
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, path: str = "libnvidia-ml.so.1") -> None:
        import ctypes as c  # noqa: PLC0415

        self.c = c
        try:
            self.lib = c.CDLL(path)
        except OSError as exc:
            raise BackendUnavailable(f"NVML library not found (libnvidia-ml.so.1): {exc}") from exc
        self._fns = {}
        _, self.Utilization, self.MemoryV2, _ = _nvml_structs()

        class MemoryV1(c.Structure):
            _fields_ = (("total", c.c_ulonglong), ("free", c.c_ulonglong), ("used", c.c_ulonglong))

        class PciInfo(c.Structure):
            _fields_ = (
                ("busIdLegacy", c.c_char * 16),
                ("domain", c.c_uint),
                ("bus", c.c_uint),
                ("device", c.c_uint),
                ("pciDeviceId", c.c_uint),
                ("pciSubSystemId", c.c_uint),
                ("busId", c.c_char * 32),
            )

        class GpmSupport(c.Structure):
            _fields_ = (("version", c.c_uint), ("isSupportedDevice", c.c_uint))

        class MetricInfo(c.Structure):
            _fields_ = (("shortName", c.c_char_p), ("longName", c.c_char_p), ("unit", c.c_char_p))

        class GpmMetric(c.Structure):
            _fields_ = (
                ("metricId", c.c_uint),
                ("nvmlReturn", c.c_int),
                ("value", c.c_double),
                ("metricInfo", MetricInfo),
            )

        class GpmMetricsGet(c.Structure):
            _fields_ = (
                ("version", c.c_uint),
                ("numMetrics", c.c_uint),
                ("sample1", c.c_void_p),
                ("sample2", c.c_void_p),
                ("metrics", GpmMetric * GPM_METRICS_ROOM),
            )

        class ProcessInfo(c.Structure):  # nvmlProcessInfo_v2_t, what the _v3 calls fill
            _fields_ = (
                ("pid", c.c_uint),
                ("usedGpuMemory", c.c_ulonglong),
                ("gpuInstanceId", c.c_uint),
                ("computeInstanceId", c.c_uint),
            )

        self.MemoryV1, self.PciInfo, self.GpmSupport = MemoryV1, PciInfo, GpmSupport
        self.c_nvmlGpmMetricsGet_t = GpmMetricsGet
        self.ProcessInfo = ProcessInfo

    # plumbing ---------------------------------------------------------------------------------
    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise NvmlCallError(NVML_FUNCTION_NOT_FOUND, f"NVML has no {name}") from None
            self._fns[name] = fn
        return fn

    def _call(self, name: str, *args: Any) -> None:
        rc = self._nvmlGetFunctionPointer(name)(*args)
        if rc:
            raise NvmlCallError(rc, f"{name}: {self._error_text(rc)}")

    def _error_text(self, rc: int) -> str:
        try:
            fn = self._nvmlGetFunctionPointer("nvmlErrorString")
            fn.restype = self.c.c_char_p
            return to_str(fn(rc))
        except Exception:
            return f"error {rc}"

    def _string(self, name: str, *args: Any) -> str:
        buf = self.c.create_string_buffer(96)
        self._call(name, *(args + (buf, self.c.c_uint(96))))
        return buf.value.decode("utf-8", "replace")

    def _scalar(self, ctype: Any, name: str, *args: Any) -> Any:
        out = ctype()
        self._call(name, *(args + (self.c.byref(out),)))
        return out.value

    # the pynvml names NvmlBackend uses ----------------------------------------------------------
    def nvmlInit(self) -> None:
        try:
            self._call("nvmlInit_v2")
        except NvmlCallError as exc:
            if exc.value != NVML_FUNCTION_NOT_FOUND:
                raise
            self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._string("nvmlSystemGetDriverVersion")

    def nvmlSystemGetNVMLVersion(self) -> str:
        return self._string("nvmlSystemGetNVMLVersion")

    def nvmlDeviceGetCount(self) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetCount_v2")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        h = self.c.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", self.c.c_uint(index), self.c.byref(h))
        return h

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._string("nvmlDeviceGetName", h)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._string("nvmlDeviceGetUUID", h)

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        info = self.PciInfo()
        self._call("nvmlDeviceGetPciInfo_v3", h, self.c.byref(info))
        return info

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        if version:
            mem = self.MemoryV2()
            mem.version = version
            self._call("nvmlDeviceGetMemoryInfo_v2", h, self.c.byref(mem))
            return mem
        mem = self.MemoryV1()
        self._call("nvmlDeviceGetMemoryInfo", h, self.c.byref(mem))
        return mem

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetEnforcedPowerLimit", h)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        u = self.Utilization()
        self._call("nvmlDeviceGetUtilizationRates", h, self.c.byref(u))
        return u

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetPowerUsage", h)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetTemperature", h, self.c.c_int(sensor))

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetClockInfo", h, self.c.c_int(kind))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._scalar(self.c.c_ulonglong, "nvmlDeviceGetCurrentClocksEventReasons", h)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._scalar(self.c.c_ulonglong, "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        sup = self.GpmSupport()
        sup.version = 1  # NVML_GPM_SUPPORT_VERSION
        self._call("nvmlGpmQueryDeviceSupport", h, self.c.byref(sup))
        return sup

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = self.c.c_void_p()
        self._call("nvmlGpmSampleAlloc", self.c.byref(sample))
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._call("nvmlGpmSampleFree", sample)

    def nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        self._call("nvmlGpmSampleGet", h, sample)
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._call("nvmlGpmMetricsGet", self.c.byref(mg))
        return mg

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        return self._scalar(self.c.c_int, "nvmlDeviceGetNvLinkState", h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkVersion(self, h: Any, link: int) -> int:
        return self._scalar(self.c.c_uint, "nvmlDeviceGetNvLinkVersion", h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: int) -> int:
        name = "nvmlDeviceGetNvLinkRemoteDeviceType"
        return self._scalar(self.c.c_int, name, h, self.c.c_uint(link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:
        info = self.PciInfo()
        name = "nvmlDeviceGetNvLinkRemotePciInfo_v2"
        self._call(name, h, self.c.c_uint(link), self.c.byref(info))
        return info

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: Any, h2: Any) -> int:
        return self._scalar(self.c.c_int, "nvmlDeviceGetTopologyCommonAncestor", h1, h2)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        """The compute processes on a GPU (room for twice as many as counted, like pynvml)."""
        c = self.c
        fn = self._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        count = c.c_uint(0)
        rc = fn(h, c.byref(count), None)
        if rc == 0:
            return []
        if rc != 7:  # NVML_ERROR_INSUFFICIENT_SIZE: the count is in
            raise NvmlCallError(rc, self._error_text(rc))
        count.value = count.value * 2 + 5
        infos = (self.ProcessInfo * count.value)()
        rc = fn(h, c.byref(count), infos)
        if rc:
            raise NvmlCallError(rc, self._error_text(rc))
        return list(infos[: count.value])


class NvmlBackend:
    """Samples GPUs through pynvml with cached handles, cached NotSupported and GPM."""

    name = "pynvml"
    blocking = False

    def __init__(
        self,
        nvml: Any = None,
        gpm_every: int = GPM_EVERY,
        slow_every: int = SLOW_EVERY,
        mem_every: int = MEM_EVERY,
    ) -> None:
        self.gpm_every = max(1, int(gpm_every))
        self.slow_every = max(1, int(slow_every))
        self.mem_every = max(1, int(mem_every))
        self._ticks = 0
        self._slow_due = self._gpm_due = self._mem_due = True
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - optional
            except Exception as exc:
                raise BackendUnavailable(f"pynvml (nvidia-ml-py) not installed ({exc})") from exc
        self.nv = nvml
        self.error = ""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            raise BackendUnavailable(
                NVML_INIT_REASONS.get(code, f"NVML init failed: {exc}")
            ) from exc
        except OSError as exc:  # very old bindings surface dlopen failures raw
            raise BackendUnavailable(f"NVML library not found (libnvidia-ml.so.1): {exc}") from exc
        self._unsupported = set()
        self._lost = {}  # index -> monotonic time of the next retry
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._procs_fns = [
            getattr(nvml, n)
            for n in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
            )
            if hasattr(nvml, n)
        ]
        self.driver = self._static(lambda: to_str(nvml.nvmlSystemGetDriverVersion()))
        self.nvml_version = self._static(lambda: to_str(nvml.nvmlSystemGetNVMLVersion()))
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown()
            raise BackendUnavailable(f"NVML could not count GPUs: {exc}") from exc
        if count == 0:
            self._shutdown()
            raise BackendUnavailable("NVML sees no GPUs")
        self.handles = []
        self.gpus = []
        self._limits = []
        self._totals = []
        self._gpm = []  # per GPU: None or [prev_sample, cur_sample, metrics_struct, last_mono]
        for i in range(count):
            self._init_gpu(i)
        self.capabilities = ["gpm"] if any(g is not None for g in self._gpm) else []
        self.capabilities.append("procs")
        self._fields = [{"index": i, "lost": False, "label": ""} for i in range(count)]
        self._direct = _DirectNvml.make(nvml, count)
        if isinstance(nvml, CtypesNvml):
            self.capabilities.append("nvml-ctypes")

    @staticmethod
    def _static(fn: Callable[[], str]) -> str:
        try:
            return fn()
        except Exception:
            return ""

    def _init_gpu(self, i: int) -> None:
        nv = self.nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:
            self.handles.append(None)
            self.gpus.append(gpu_info(i))
            self._limits.append(None)
            self._totals.append(None)
            self._gpm.append(None)
            if getattr(exc, "value", None) in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                self._lost[i] = time.monotonic() + LOST_RETRY_S
            return
        self.handles.append(h)
        name = self._static(lambda: to_str(nv.nvmlDeviceGetName(h)))
        uuid = self._static(lambda: to_str(nv.nvmlDeviceGetUUID(h)))
        bus = self._static(lambda: to_str(nv.nvmlDeviceGetPciInfo(h).busId))
        try:
            mem = self._q(i, "mem", self._memory, h)
            limit_mw = self._q(i, "plimit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        except GpuLost:
            mem = limit_mw = None
            self._lost[i] = time.monotonic() + LOST_RETRY_S
        total = r1(mem[1] / MIB) if mem is not None else None
        limit = r1(limit_mw / 1000.0) if limit_mw is not None else None
        self._totals.append(total)
        self._limits.append(limit)
        gpm = None
        try:
            if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                gpm = self._gpm_init(h)
        except Exception:
            gpm = None
        self._gpm.append(gpm)
        self.gpus.append(gpu_info(i, name, uuid, total, bus, limit, gpm is not None))

    def _gpm_init(self, h: Any) -> list[Any]:
        nv = self.nv
        prev = nv.nvmlGpmSampleAlloc()
        cur = nv.nvmlGpmSampleAlloc()
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRICS)
        for k, (mid, _) in enumerate(GPM_METRICS):
            mg.metrics[k].metricId = mid
        # The first sample is taken now so the first tick already has an interval to measure.
        nv.nvmlGpmSampleGet(h, prev)
        return [prev, cur, mg, time.monotonic()]

    def _q(self, i: int, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML getter; None when unsupported (remembered) or failing; raise when lost."""
        if (i, key) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND, NVML_NO_PERMISSION):
                self._unsupported.add((i, key))
                return None
            if code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise GpuLost() from None
            return None

    def _memory(self, h: Any) -> tuple[int, int]:
        """(used, total) bytes: v2 (used excludes driver-reserved memory) else v1."""
        nv = self.nv
        if self._mem_v2 is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=self._mem_v2)
                return m.used, m.total
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) not in (NVML_FUNCTION_NOT_FOUND, NVML_NOT_SUPPORTED):
                    raise
                self._mem_v2 = None
            except TypeError:  # binding without the version argument
                self._mem_v2 = None
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return m.used, m.total

    def _reasons(self, h: Any) -> int:
        nv = self.nv
        fn = self._reasons_fn
        if fn is None:
            raise nv.NVMLError(NVML_NOT_SUPPORTED)
        try:
            return fn(h)
        except nv.NVMLError as exc:
            old = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if getattr(exc, "value", None) == NVML_FUNCTION_NOT_FOUND and old and old is not fn:
                self._reasons_fn = old  # older driver: only the old name exists
                return old(h)
            raise

    def _gpm_sample(self, i: int, h: Any, fields: dict[str, Any]) -> None:
        st = self._gpm[i]
        mono = time.monotonic()
        if mono - st[3] < GPM_MIN_GAP_S:
            return
        nv = self.nv
        try:
            nv.nvmlGpmSampleGet(h, st[1])
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
                raise GpuLost() from None
            return
        mg = st[2]
        mg.sample1 = st[0]
        mg.sample2 = st[1]
        st[0], st[1], st[3] = st[1], st[0], mono  # the new sample is the next "previous"
        try:
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_NOT_SUPPORTED:
                self._unsupported.add((i, "gpm"))
            return
        metrics = mg.metrics
        for k, (_, name) in enumerate(GPM_METRICS):
            m = metrics[k]
            if m.nvmlReturn == 0:
                fields[name] = round(m.value, 2)

    def _sample_gpu(self, i: int, h: Any) -> Fields:
        """One GPU's field pairs: fast values every tick, slow ones and GPM on their strides."""
        f = self._fields[i]  # a dict reused tick after tick: only the values change
        if self._direct is not None:
            self._direct.read(i, h, f, self._slow_due, self._mem_due, self._q_rc, self._unsupported)
        else:
            self._read_api(i, h, f)
        if f.get("mem_used_mib") is not None:
            f["mem_total_mib"] = self._totals[i] or f.get("mem_total_mib")
        f["power_limit_w"] = self._limits[i]
        if self._gpm_due and self._gpm[i] is not None and (i, "gpm") not in self._unsupported:
            self._gpm_sample(i, h, f)  # between GPM ticks the last window's values are repeated
        return tuple((k, f[k]) for k in GPU_FIELDS if f.get(k) is not None)

    def _q_rc(self, i: int, key: str, code: int) -> bool:
        """Handle a raw NVML return code: True when it is success; remember what is unsupported."""
        if code == 0:
            return True
        if code in (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND, NVML_NO_PERMISSION):
            self._unsupported.add((i, key))
        elif code in (NVML_GPU_IS_LOST, NVML_RESET_REQUIRED):
            raise GpuLost()
        return False

    def _read_api(self, i: int, h: Any, f: dict[str, Any]) -> None:
        """The pynvml-function path (bindings without raw entry points, and the tests' fakes)."""
        nv = self.nv
        q = self._q
        u = q(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if u is not None:
            f["util_gpu"] = u.gpu
            f["util_mem"] = u.memory
        if self._mem_due or "mem_used_mib" not in f:
            mem = q(i, "mem", self._memory, h)
            if mem is not None:
                f["mem_used_mib"] = round(mem[0] / MIB, 1)
                f["mem_total_mib"] = round(mem[1] / MIB, 1)
        p = q(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        if p is not None:
            f["power_w"] = round(p / 1000.0, 1)
        f["sm_mhz"] = q(i, "sm_clk", nv.nvmlDeviceGetClockInfo, h, 1)  # NVML_CLOCK_SM
        f["clock_reasons"] = q(i, "reasons", self._reasons, h)
        if self._slow_due or "temp_c" not in f:
            f["temp_c"] = q(i, "temp", nv.nvmlDeviceGetTemperature, h, 0)  # NVML_TEMPERATURE_GPU
            f["mem_mhz"] = q(i, "mem_clk", nv.nvmlDeviceGetClockInfo, h, 2)  # NVML_CLOCK_MEM

    def sample(self, now: float) -> list[Fields]:
        out = []
        mono = time.monotonic()
        n = self._ticks
        self._ticks = n + 1
        self._slow_due = n % self.slow_every == 0
        self._mem_due = n % self.mem_every == 0
        self._gpm_due = n % self.gpm_every == 0
        for i, h in enumerate(self.handles):
            if i in self._lost:
                if mono < self._lost[i] or h is None:
                    out.append(lost_fields(i))
                    continue
            if h is None:
                continue
            try:
                fields = self._sample_gpu(i, h)
            except GpuLost:
                self._lost[i] = mono + LOST_RETRY_S
                self._fields[i] = {"index": i, "lost": False, "label": ""}
                out.append(lost_fields(i))
                continue
            self._lost.pop(i, None)
            out.append(fields)
        return out

    def processes(self) -> list[ProcRow]:
        nv = self.nv
        procs = []
        for i, h in enumerate(self.handles):
            if h is None or i in self._lost:
                continue
            plist = None
            while self._procs_fns:
                try:
                    plist = self._procs_fns[0](h)
                    break
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == NVML_FUNCTION_NOT_FOUND:
                        self._procs_fns.pop(0)  # old driver: try the older variant
                        continue
                    break
            for p in plist or ():
                used = getattr(p, "usedGpuMemory", None)
                procs.append((int(p.pid), i, round(used / MIB, 1) if used is not None else None))
        return procs

    def _shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass

    def close(self) -> None:
        for st in self._gpm if hasattr(self, "_gpm") else ():
            if st is not None:
                for s in st[:2]:
                    try:
                        self.nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass
        self._gpm = []
        self._shutdown()
