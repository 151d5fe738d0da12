"""The agent's NVML backend against a fake ``pynvml`` that raises pynvml's real error classes.

The fake is a module injected into ``sys.modules["pynvml"]``: the functions are fakes with call
counters, while ``NVMLError`` and its subclasses, the error codes, ``nvmlMemory_v2`` and the GPM
ctypes structures are taken from the installed nvidia-ml-py, so the agent sees exactly what a
real binding raises and fills.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pynvml as real
import pytest

from verl_top.agent import backends, main, nvml, procs, strides
from verl_top.protocol import from_dict, to_dict

# The agent scans the whole node for job processes: only this module's own count here.
pytestmark = pytest.mark.usefixtures("own_job_processes")

NOT_SUPPORTED = real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
assert type(NOT_SUPPORTED).__name__ == "NVMLError_NotSupported"  # real subclass, by value

# Values the fake GPM reports, by metric id, for GPU i: base + i.
GPM_VALUES = {2: 90.0, 3: 14.0, 5: 80.0, 10: 16.0, 60: 1000.0, 61: 2000.0, 20: 5.0, 21: 6.0}


class FakeNvml:
    """Per-test NVML state: GPUs, call counts and errors to raise per (function, gpu)."""

    def __init__(self, ngpu: int = 2, init_error: int | None = None) -> None:
        self.ngpu = ngpu
        self.init_error = init_error
        self.calls: Counter[tuple[str, int]] = Counter()
        self.raises: dict[tuple[str, int], int] = {}  # (fn, gpu) -> NVML error code
        self.procs: dict[int, list[tuple[int, int | None]]] = {}
        self.samples: dict[int, tuple[int, float]] = {}  # sample address -> (gpu, time)
        self.module = self._build()

    def _check(self, fn: str, h: int) -> None:
        self.calls[(fn, h)] += 1
        code = self.raises.get((fn, h))
        if code is not None:
            raise real.NVMLError(code)

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        for name in dir(real):
            if name.startswith(("NVMLError", "NVML_ERROR_", "NVML_GPM_")) or name in (
                "nvmlMemory_v2",
                "c_nvmlGpmMetricsGet_t",
                "c_nvmlGpmSample_t",
            ):
                setattr(m, name, getattr(real, name))
        fake = self

        def nvmlInit() -> None:
            fake.calls[("init", -1)] += 1
            if fake.init_error is not None:
                raise real.NVMLError(fake.init_error)

        def getter(fn: str, value):  # type: ignore[no-untyped-def]
            def call(h, *args, **kw):  # type: ignore[no-untyped-def]
                fake._check(fn, h)
                return value(h, *args, **kw) if callable(value) else value

            return call

        def memory(h: int, version: int | None = None) -> types.SimpleNamespace:
            fake._check("mem_v2" if version else "mem_v1", h)
            total = 143771 * 1048576
            return types.SimpleNamespace(total=total, used=(1000 + h) * 1048576, free=0)

        def gpm_alloc() -> object:
            return ctypes.pointer(real.struct_c_nvmlGpmSample_t())

        def gpm_get(h: int, sample) -> object:  # type: ignore[no-untyped-def]
            fake._check("gpm_sample", h)
            fake.samples[ctypes.addressof(sample.contents)] = (h, time.monotonic())
            return sample

        def gpm_metrics(mg):  # type: ignore[no-untyped-def]
            a = fake.samples[ctypes.addressof(mg.sample1.contents)]
            b = fake.samples[ctypes.addressof(mg.sample2.contents)]
            assert a[0] == b[0] and b[1] > a[1], "GPM samples of one GPU, oldest first"
            fake._check("gpm_metrics", a[0])
            for k in range(mg.numMetrics):
                mg.metrics[k].nvmlReturn = 0
                mg.metrics[k].value = GPM_VALUES[mg.metrics[k].metricId] + a[0]
            return mg

        def pcie(*args):  # type: ignore[no-untyped-def]
            fake.calls[("pcie", -1)] += 1
            raise AssertionError("nvmlDeviceGetPcieThroughput must never be called (blocks 20 ms)")

        def procs(h: int) -> list[types.SimpleNamespace]:
            fake._check("procs", h)
            return [
                types.SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in fake.procs.get(h, [])
            ]

        util = lambda h: types.SimpleNamespace(gpu=50 + h, memory=20 + h)  # noqa: E731
        funcs = {
            "nvmlInit": nvmlInit,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "580.159.04",
            "nvmlSystemGetNVMLVersion": lambda: "13.580.159.04",
            "nvmlDeviceGetCount": lambda: fake.ngpu,
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetName": getter("name", lambda h: b"NVIDIA H200"),
            "nvmlDeviceGetUUID": getter("uuid", lambda h: f"GPU-fake-{h}"),
            "nvmlDeviceGetPciInfo": getter(
                "pci", lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0".encode())
            ),
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetEnforcedPowerLimit": getter("plimit", 700000),
            "nvmlDeviceGetUtilizationRates": getter("util", util),
            "nvmlDeviceGetPowerUsage": getter("power", lambda h: 650000 + 1000 * h),
            "nvmlDeviceGetTemperature": getter("temp", lambda h, s: 40 + h),
            "nvmlDeviceGetClockInfo": getter("clock", lambda h, c: 1980 if c == 1 else 3201),
            "nvmlDeviceGetCurrentClocksEventReasons": getter("reasons", 0x4),
            "nvmlDeviceGetCurrentClocksThrottleReasons": getter("reasons_old", 0x4),
            "nvmlGpmQueryDeviceSupport": getter(
                "gpm_support", lambda h: types.SimpleNamespace(isSupportedDevice=1)
            ),
            "nvmlGpmSampleAlloc": gpm_alloc,
            "nvmlGpmSampleGet": gpm_get,
            "nvmlGpmMetricsGet": gpm_metrics,
            "nvmlGpmSampleFree": lambda s: None,
            "nvmlDeviceGetComputeRunningProcesses": procs,
            "nvmlDeviceGetPcieThroughput": pcie,
        }
        for name, fn in funcs.items():
            setattr(m, name, fn)
        return m


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    f = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", f.module)
    monkeypatch.setattr(nvml, "GPM_MIN_GAP_S", 0.0)  # ticks in a test are microseconds apart
    return f


def agent(*extra: str) -> main.Agent:
    return main.Agent(main.parse_args(["--backend", "pynvml", "--host", "n1", *extra]))


def gpu_lines(records: list[dict]) -> dict[int, dict]:
    return {r["index"]: r for r in records if r["type"] == "gpu"}


def test_normal_sample_with_gpm(fake: FakeNvml) -> None:
    a = agent()
    hello = a.hello()
    assert hello["backend"] == "pynvml" and hello["error"] == ""
    assert hello["driver"] == "580.159.04" and hello["nvml_version"] == "13.580.159.04"
    assert [g["name"] for g in hello["gpus"]] == ["NVIDIA H200"] * 2
    assert hello["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "uuid": "GPU-fake-1",
        "mem_total_mib": 143771.0,
        "bus_id": "00000000:01:00.0",
        "power_limit_w": 700.0,
        "gpm": True,
    }
    assert "gpm" in hello["capabilities"] and "procs" in hello["capabilities"]
    gpus = gpu_lines(a.tick())
    g1 = gpus[1]
    assert (g1["util_gpu"], g1["util_mem"], g1["temp_c"]) == (51, 21, 41)
    assert (g1["mem_used_mib"], g1["mem_total_mib"]) == (1001.0, 143771.0)
    assert (g1["power_w"], g1["power_limit_w"]) == (651.0, 700.0)
    assert (g1["sm_mhz"], g1["mem_mhz"], g1["clock_reasons"]) == (1980, 3201, 0x4)
    assert g1["sm_util"] == 91.0 and g1["sm_occupancy"] == 15.0 and g1["tensor_util"] == 81.0
    assert g1["dram_util"] == 17.0
    assert (g1["nvlink_rx_mibs"], g1["nvlink_tx_mibs"]) == (1001.0, 2001.0)
    assert (g1["pcie_tx_mibs"], g1["pcie_rx_mibs"]) == (6.0, 7.0)
    assert g1["lost"] is False
    # The records are valid wire records of model.py (decode, re-encode: identical).
    assert to_dict(from_dict(g1)) == g1 and list(to_dict(from_dict(g1))) == list(g1)
    # GPM on its own stride: the start sample, tick 0, then tick GPM_EVERY; the ticks between
    # repeat the last window's values. v2 memory preferred.
    for _ in range(strides.GPM_EVERY - 1):
        assert gpu_lines(a.tick())[1]["sm_util"] == 91.0
    assert fake.calls[("gpm_sample", 0)] == 2
    a.tick()
    assert fake.calls[("gpm_sample", 0)] == 3
    assert fake.calls[("mem_v1", 0)] == 0 and fake.calls[("mem_v2", 0)] >= 3
    a.close()


def test_gpm_skipped_when_samples_closer_than_100ms(fake: FakeNvml, monkeypatch) -> None:
    monkeypatch.setattr(nvml, "GPM_MIN_GAP_S", 0.1)
    a = agent("--gpm-every", "1")
    first = gpu_lines(a.tick())  # microseconds after the start sample: no GPM this tick
    assert "sm_util" not in first[0] and "util_gpu" in first[0]
    assert fake.calls[("gpm_sample", 0)] == 1
    time.sleep(0.12)
    assert gpu_lines(a.tick())[0]["sm_util"] == 90.0
    assert fake.calls[("gpm_sample", 0)] == 2


def test_not_supported_is_omitted_and_not_asked_again(fake: FakeNvml) -> None:
    fake.raises[("temp", 1)] = real.NVML_ERROR_NOT_SUPPORTED
    fake.raises[("reasons", 1)] = real.NVML_ERROR_NOT_SUPPORTED
    a = agent()
    for _ in range(4):
        gpus = gpu_lines(a.tick())
        assert "temp_c" not in gpus[1] and "clock_reasons" not in gpus[1]
        assert gpus[0]["temp_c"] == 40 and gpus[0]["clock_reasons"] == 0x4
        assert gpus[1]["util_gpu"] == 51
    assert fake.calls[("temp", 1)] == 1  # asked once, then remembered
    assert fake.calls[("temp", 0)] == 1  # slow stride: tick 0, then tick SLOW_EVERY
    for _ in range(strides.SLOW_EVERY - 4):
        assert gpu_lines(a.tick())[0]["temp_c"] == 40  # repeated between reads
    assert fake.calls[("temp", 0)] == 1
    a.tick()
    assert fake.calls[("temp", 0)] == 2


def test_gpu_lost_marks_it_and_others_keep_reporting(fake: FakeNvml, monkeypatch) -> None:
    a = agent()
    fake.raises[("util", 0)] = real.NVML_ERROR_GPU_IS_LOST
    gpus = gpu_lines(a.tick())
    assert gpus[0]["lost"] is True and "util_gpu" not in gpus[0]
    assert gpus[1]["lost"] is False and gpus[1]["util_gpu"] == 51
    assert to_dict(from_dict(gpus[0])) == gpus[0]
    calls = fake.calls[("util", 0)]
    for _ in range(3):
        gpus = gpu_lines(a.tick())
        assert gpus[0]["lost"] is True and gpus[1]["util_gpu"] == 51
    assert fake.calls[("util", 0)] == calls  # not retried within 30 s
    # 30 s later (retry time reached) and the GPU is back: it reports again.
    del fake.raises[("util", 0)]
    a.backend._lost[0] = 0.0
    gpus = gpu_lines(a.tick())
    assert gpus[0]["lost"] is False and gpus[0]["util_gpu"] == 50


def test_reset_required_also_marks_lost(fake: FakeNvml) -> None:
    a = agent()
    fake.raises[("power", 1)] = real.NVML_ERROR_RESET_REQUIRED
    assert gpu_lines(a.tick())[1]["lost"] is True


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            real.NVML_ERROR_DRIVER_NOT_LOADED,
            "no NVIDIA driver: NVIDIA driver not loaded and nvidia-smi not on PATH",
        ),
        (
            real.NVML_ERROR_LIBRARY_NOT_FOUND,
            "no NVIDIA driver: NVML library not found (libnvidia-ml.so.1) and nvidia-smi not on PATH",
        ),
        (
            real.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "Driver/library version mismatch: reload the NVIDIA kernel module or reboot",
        ),
    ],
)
def test_init_failure_falls_back_with_clear_error(
    code: int, expected: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=code).module)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    a = main.Agent(main.parse_args(["--backend", "auto", "--host", "n1"]))
    hello = a.hello()
    assert hello["backend"] == "none" and hello["gpus"] == []
    assert hello["error"] == expected
    recs = a.tick()
    assert [r["type"] for r in recs if r["type"] != "hb"] == ["host"]  # host data still flows


FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*driver_version*)
    echo "0, GPU-a, NVIDIA H200, 00000000:18:00.0, 0, 0, 0, 143771, 117.90, 700.00, 37, 525, 3201, 0x0000000000000001, 580.159.04"
    ;;
  --query-gpu=*)
    echo "0, GPU-a, NVIDIA H200, 00000000:18:00.0, 97, 40, 80000, 143771, 690.10, 700.00, 61, 1410, 3201, 0x0000000000000004"
    ;;
  --query-compute-apps=*)
    echo "4242, 80000, GPU-a"
    ;;
esac
"""


def test_driver_not_loaded_falls_back_to_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(
        sys.modules, "pynvml", FakeNvml(init_error=real.NVML_ERROR_DRIVER_NOT_LOADED).module
    )
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    a = main.Agent(main.parse_args(["--backend", "auto", "--host", "n1"]))
    hello = a.hello()
    assert hello["backend"] == "nvidia-smi"
    assert hello["error"] == "NVML unavailable (NVIDIA driver not loaded); using nvidia-smi"
    assert hello["driver"] == "580.159.04" and hello["gpus"][0]["mem_total_mib"] == 143771.0
    assert a.blocking  # spawns per tick: the local source runs these ticks in a thread
    recs = a.tick()
    g = gpu_lines(recs)[0]
    assert (g["util_gpu"], g["power_w"], g["sm_mhz"], g["clock_reasons"]) == (97, 690.1, 1410, 4)
    procs = [r for r in recs if r["type"] == "procs"]
    assert procs[0]["procs"][0]["pid"] == 4242 and procs[0]["procs"][0]["used_mib"] == 80000.0


def test_pcie_throughput_never_called(fake: FakeNvml) -> None:
    a = agent("--procs-every", "1")
    a.hello()
    for _ in range(6):
        a.tick()
    a.close()
    assert fake.calls[("pcie", -1)] == 0


def test_memory_v2_missing_falls_back_to_v1(fake: FakeNvml) -> None:
    fake.raises[("mem_v2", 0)] = real.NVML_ERROR_FUNCTION_NOT_FOUND
    fake.raises[("mem_v2", 1)] = real.NVML_ERROR_FUNCTION_NOT_FOUND
    a = agent()
    for _ in range(3):
        assert gpu_lines(a.tick())[0]["mem_used_mib"] == 1000.0
    assert fake.calls[("mem_v2", 0)] == 1  # tried once at start, then v1 only
    assert fake.calls[("mem_v1", 0)] >= 3


def test_processes_enriched_from_proc(fake: FakeNvml) -> None:
    env = dict(os.environ, RANK="3", LOCAL_RANK="1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        ghost = 2**22 + 12345  # above Linux pid_max: what a pid from another namespace looks like
        fake.procs = {0: [(child.pid, 2048 * 1048576)], 1: [(ghost, None)]}
        a = agent()
        recs = a.tick()
        (procs,) = [r for r in recs if r["type"] == "procs"]
        by_pid = {p["pid"]: p for p in procs["procs"]}
        mine = by_pid[child.pid]
        assert mine["gpu_index"] == 0 and mine["used_mib"] == 2048.0 and mine["visible"] is True
        assert mine["env_rank"] == 3 and mine["env_local_rank"] == 1
        assert "time.sleep(30)" in mine["cmd"] and mine["user"] and mine["rss_bytes"] > 0
        assert by_pid[ghost] == {"pid": ghost, "gpu_index": 1, "visible": False, "user": "",
                                 "cmd": "", "role": ""}  # fmt: skip
        assert to_dict(from_dict(procs)) == procs
        # A GPU holder is a job process too (state, parent, GPUs); the ghost is not in /proc
        (job,) = [j for j in procs["job_procs"] if j["pid"] == child.pid]
        assert job["gpus"] == [0] and job["state"] in ("S", "R") and job["ppid"] == os.getpid()
        assert ghost not in {j["pid"] for j in procs["job_procs"]}
        # While the job has processes the list goes out every listing (state and CPU move);
        # cpu % appears once there is a delta.
        for _ in range(4):
            assert not [r for r in a.tick() if r["type"] == "procs"]  # between listings
        (procs,) = [r for r in a.tick() if r["type"] == "procs"]
        assert {p["pid"]: p for p in procs["procs"]}[child.pid]["cpu_pct"] >= 0.0
        assert {j["pid"]: j for j in procs["job_procs"]}[child.pid]["cpu_pct"] >= 0.0
        # Without job scanning (no /proc), an unchanged GPU list is not re-sent within 30 s.
        a.jobs, a.procs_every = None, 1
        assert not [r for r in a.tick() if r["type"] == "procs"]
    finally:
        child.kill()
        child.wait()


def test_process_title_reread_and_a_new_title_is_a_change(fake: FakeNvml, monkeypatch) -> None:
    """Ray rewrites a worker's title per task: the procs record follows it (issue 23: the real
    WorkerDict showed "ref_init_model" for the whole run because the title was cached), and the
    job-process record's method and the time it was first seen in it (issue 29)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    titles = {"now": b"ray::WorkerDict.actor_rollout_ref_init_model\0"}
    read = procs.ProcInspector._file

    def fake_read(self, pid: int, name: str, limit: int):  # type: ignore[no-untyped-def]
        if (pid, name) == (child.pid, "cmdline"):  # what Ray's setproctitle would show now
            return titles["now"]
        return read(self, pid, name, limit)

    monkeypatch.setattr(procs.ProcInspector, "_file", fake_read)
    try:
        fake.procs = {0: [(child.pid, 2048 * 1048576)]}
        a = agent("--procs-every", "1")

        def job(now: float) -> dict:
            (rec,) = [r for r in a.tick(now) if r["type"] == "procs"]
            assert rec["procs"][0]["cmd"] == titles["now"].rstrip(b"\0").decode()
            (j,) = rec["job_procs"]
            assert j["pid"] == child.pid and j["title"] == rec["procs"][0]["cmd"]
            return j

        first = job(1000.0)
        assert (first["method"], first["method_since"]) == ("actor_rollout_ref_init_model", 1000.0)
        assert job(1001.0)["method_since"] == 1000.0  # the same method: still since 1000
        titles["now"] = b"ray::WorkerDict.actor_rollout_generate_sequences\0"
        third = job(1002.0)  # same pid, gpu and memory; a new method from now on
        assert (third["method"], third["method_since"]) == (
            "actor_rollout_generate_sequences",
            1002.0,
        )
        titles["now"] = b"ray::WorkerDict\0"  # idle: no method, no since
        fourth = job(1003.0)
        assert "method" not in fourth and "method_since" not in fourth and fourth["gpus"] == [0]
    finally:
        child.kill()
        child.wait()


# ----------------------------------------------------------------------------------------------
# The fast path: the library's C entry points with buffers made once (what runs with real pynvml)


class FakeEntryPoints:
    """``_nvmlGetFunctionPointer`` of a fake binding: C-style functions filling the caller's
    structs through the pointers they are given, returning nvmlReturn_t codes."""

    def __init__(self, fake: FakeNvml, field_rc: int = 0) -> None:
        self.fake = fake
        self.field_rc = field_rc
        self.pointers: Counter[int] = Counter()  # id of each pointer object passed in

    def _rc(self, fn: str, h: int, ptr) -> int:  # type: ignore[no-untyped-def]
        self.fake.calls[(fn, h)] += 1
        self.pointers[id(ptr)] += 1
        return self.fake.raises.get((fn, h), 0)

    def __call__(self, name: str):  # type: ignore[no-untyped-def]
        def util(h, p):  # type: ignore[no-untyped-def]
            rc = self._rc("util", h, p)
            p.contents.gpu, p.contents.memory = 50 + h, 20 + h
            return rc

        def mem(h, p):  # type: ignore[no-untyped-def]
            assert p.contents.version == 0x02000028  # nvmlMemory_v2
            p.contents.total, p.contents.used = 143771 * 1048576, (1000 + h) * 1048576
            return self._rc("mem_direct", h, p)

        def clock(h, kind, p):  # type: ignore[no-untyped-def]
            p.contents.value = 1980 if kind == 1 else 3201
            return self._rc("clock", h, p)

        def temp(h, sensor, p):  # type: ignore[no-untyped-def]
            p.contents.value = 40 + h
            return self._rc("temp", h, p)

        def reasons(h, p):  # type: ignore[no-untyped-def]
            p.contents.value = 0x4
            return self._rc("reasons", h, p)

        def fields(h, n, arr):  # type: ignore[no-untyped-def]
            assert n.value == 1 and arr[0].fieldId == 185  # NVML_FI_DEV_POWER_AVERAGE
            arr[0].nvmlReturn = self.field_rc
            arr[0].valueType = 1  # unsigned int, mW
            arr[0].value.uiVal = 650000 + 1000 * h
            return self._rc("fields", h, arr)

        def power(h, p):  # type: ignore[no-untyped-def]
            p.contents.value = 640000 + 1000 * h
            return self._rc("power", h, p)

        table = {
            "nvmlDeviceGetUtilizationRates": util,
            "nvmlDeviceGetMemoryInfo_v2": mem,
            "nvmlDeviceGetClockInfo": clock,
            "nvmlDeviceGetTemperature": temp,
            "nvmlDeviceGetCurrentClocksEventReasons": reasons,
            "nvmlDeviceGetFieldValues": fields,
            "nvmlDeviceGetPowerUsage": power,
        }
        if name not in table:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        return table[name]


@pytest.fixture
def direct(fake: FakeNvml) -> FakeEntryPoints:
    entry = FakeEntryPoints(fake)
    fake.module._nvmlGetFunctionPointer = entry  # type: ignore[attr-defined]
    return entry


def test_fast_path_same_record_as_getters_and_buffers_made_once(
    fake: FakeNvml, direct: FakeEntryPoints
) -> None:
    a = agent()
    assert a.backend._direct is not None
    gpus = gpu_lines(a.tick())
    g1 = gpus[1]
    # The same values as through pynvml's getters (test_normal_sample_with_gpm); power from the
    # field-values call (650 W + 1 W per GPU), not the plain getter (640 W).
    assert (g1["util_gpu"], g1["util_mem"], g1["temp_c"]) == (51, 21, 41)
    assert (g1["mem_used_mib"], g1["mem_total_mib"], g1["power_w"]) == (1001.0, 143771.0, 651.0)
    assert (g1["sm_mhz"], g1["mem_mhz"], g1["clock_reasons"]) == (1980, 3201, 0x4)
    assert g1["sm_util"] == 91.0 and to_dict(from_dict(g1)) == g1
    assert fake.calls[("util", 1)] == 1 and fake.calls[("power", 1)] == 0
    # No getter of the binding was used for these reads (init read the total once).
    assert fake.calls[("mem_v2", 0)] == 1 and fake.calls[("mem_direct", 0)] == 1
    for _ in range(9):
        a.tick()
    # Every call of 10 ticks reused the same few pointer objects: nothing made per tick.
    assert fake.calls[("util", 0)] == 10
    # Per GPU: util, SM clock, reasons, field array on every tick; memory every 2nd tick (0, 2,
    # .., 8); temperature and memory clock on the slow stride (ticks 0 and 5).
    assert sorted(direct.pointers.values()) == [2] * 4 + [5] * 2 + [10] * 8
    assert fake.calls[("mem_direct", 0)] == 5
    a.close()


def test_fast_path_falls_back_to_power_getter_when_field_unsupported(
    fake: FakeNvml, direct: FakeEntryPoints
) -> None:
    direct.field_rc = real.NVML_ERROR_NOT_SUPPORTED
    a = agent()
    assert gpu_lines(a.tick())[0]["power_w"] == 640.0
    assert gpu_lines(a.tick())[0]["power_w"] == 640.0
    assert fake.calls[("fields", 0)] == 1  # asked once, then the plain getter


def test_fast_path_unsupported_and_lost_codes(fake: FakeNvml, direct: FakeEntryPoints) -> None:
    fake.raises[("temp", 1)] = real.NVML_ERROR_NOT_SUPPORTED
    a = agent("--slow-every", "1")
    for _ in range(3):
        g = gpu_lines(a.tick())
        assert "temp_c" not in g[1] and g[0]["temp_c"] == 40
    assert fake.calls[("temp", 1)] == 1
    fake.raises[("util", 0)] = real.NVML_ERROR_GPU_IS_LOST
    g = gpu_lines(a.tick())
    assert g[0]["lost"] is True and "util_gpu" not in g[0] and g[1]["util_gpu"] == 51


def test_ctypes_binding_missing_library_is_a_clear_reason_and_auto_falls_back(
    fake: FakeNvml,
) -> None:
    """--nvml ctypes loads libnvidia-ml.so.1 itself (no pynvml import); without the library it
    says so, and --nvml auto falls back to the pynvml module (here the fake)."""
    try:
        nvml.CtypesNvml()
    except backends.BackendUnavailable as exc:
        assert "libnvidia-ml.so.1" in str(exc)
    else:  # a machine with the NVIDIA driver: nothing to check here
        return
    a = agent("--nvml", "ctypes")
    assert a.backend.name == "none" and "NVML library not found" in a.backend.error
    b = agent("--nvml", "auto")
    assert b.backend.name == "pynvml" and gpu_lines(b.tick())[0]["util_gpu"] == 50


@pytest.fixture
def fake_libnvml(tmp_path: Path) -> Path:
    """tests/fixtures/agent/fake_nvml.c built into a shared library (the C compiler is part of
    the project's CI image; without one the ctypes binding cannot be exercised off a GPU node)."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: needed to build the fake libnvidia-ml for the ctypes binding")
    src = Path(__file__).parent / "fixtures" / "agent" / "fake_nvml.c"
    lib = tmp_path / "libfakenvml.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    return lib


def test_ctypes_binding_samples_a_library_with_nvml_layouts(
    fake_libnvml: Path, monkeypatch
) -> None:
    """The whole agent over libnvidia-ml's C ABI, without pynvml: the same record as through
    pynvml's getters (test_normal_sample_with_gpm), the fast path taken, processes listed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing pynvml would fail
    lib = nvml.CtypesNvml(str(fake_libnvml))
    backend = nvml.NvmlBackend(lib, 5, 5)
    assert backend._direct is not None and backend.driver == "580.159.04"
    assert (
        backend.gpus[1]["uuid"] == "GPU-fake-1" and backend.gpus[1]["bus_id"] == "00000000:01:00.0"
    )
    assert (
        backend.gpus[1]["mem_total_mib"] == 143771.0 and backend.gpus[1]["power_limit_w"] == 700.0
    )
    assert backend.gpus[1]["gpm"] is False  # the library says GPM is not supported
    g1 = dict(backend.sample(0.0)[1])
    assert (g1["util_gpu"], g1["util_mem"], g1["temp_c"]) == (51, 21, 41)
    assert (g1["mem_used_mib"], g1["power_w"]) == (1001.0, 651.0)  # power from the field values
    assert (g1["sm_mhz"], g1["mem_mhz"], g1["clock_reasons"]) == (1980, 3201, 0x4)
    assert sorted(backend.processes()) == [(4242, 0, 2048.0), (4243, 1, 2048.0)]
    # what the topology collection asks (a missing call raises NVMLError, like pynvml)
    with pytest.raises(nvml.NvmlCallError) as err:
        lib.nvmlDeviceGetNvLinkState(backend.handles[0], 0)
    assert err.value.value == 3 and "Not Supported" in str(err.value)
    assert lib.nvmlDeviceGetTopologyCommonAncestor(backend.handles[0], backend.handles[1]) == 30
    with pytest.raises(nvml.NvmlCallError) as err:
        lib.nvmlDeviceGetNvLinkVersion(backend.handles[0], 0)
    assert err.value.value == 13  # NVML_ERROR_FUNCTION_NOT_FOUND: not in this library
    backend.close()


def test_no_driver_and_no_pynvml_says_the_library_is_missing(monkeypatch) -> None:
    """auto: ctypes finds no libnvidia-ml, pynvml is not installed either: the reason named is
    the missing library (the driver), not the missing Python package."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    try:
        nvml.CtypesNvml()
    except backends.BackendUnavailable:
        pass
    else:
        return  # a machine with the NVIDIA driver
    a = main.Agent(main.parse_args(["--backend", "pynvml", "--host", "n1"]))
    assert a.backend.name == "none" and "NVML library not found" in a.backend.error


@pytest.mark.parametrize("every", [1, 2, 3])
def test_memory_stride_repeats_the_last_reading(fake: FakeNvml, every: int) -> None:
    """GPU memory is read every --mem-every ticks (the getter path here) and the last reading is
    repeated between: each tick still has a value, and the read count follows the stride."""
    a = agent("--mem-every", str(every))
    before = fake.calls[("mem_v2", 0)]  # the total, read once at start-up
    ticks = [gpu_lines(a.tick())[0] for _ in range(6)]
    a.close()
    assert fake.calls[("mem_v2", 0)] - before == len(range(0, 6, every))
    assert all(t["mem_used_mib"] == 1000.0 for t in ticks)
