"""The replay backend: plays a recorded GPU trace (a real H200 capture or a verl-top recording)
as if it were N GPUs, paced by the agent's interval, for tests and demos on machines without
GPUs. Shipped to a node only when the agent is asked to replay (``--backend replay``)."""

from __future__ import annotations

import json

from .backends import BackendUnavailable, gpu_info
from .wire import GPU_FIELDS, PERCENT_FIELDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .wire import Fields

    Frame = tuple[float, list[dict[str, Any]], str]  # (trace time, per recorded GPU, label)

# H200 trace GPM keys -> gpu record field.
TRACE_GPM_KEYS = (
    ("SM_UTIL", "sm_util"),
    ("SM_OCCUPANCY", "sm_occupancy"),
    ("ANY_TENSOR_UTIL", "tensor_util"),
    ("DRAM_BW_UTIL", "dram_util"),
    ("NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_mibs"),
    ("NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_mibs"),
    ("PCIE_TX_PER_SEC", "pcie_tx_mibs"),
    ("PCIE_RX_PER_SEC", "pcie_rx_mibs"),
)

H200_NAME = "NVIDIA H200"
H200_MEM_MIB = 143771.0
H200_POWER_LIMIT_W = 700.0
TRACE_DIRECT = ("util_gpu", "util_mem", "mem_used_mib", "power_w", "temp_c", "sm_mhz", "mem_mhz")


def load_trace(path: str) -> tuple[list[Frame], dict[str, Any] | None]:
    """Frames [(t, [per-recorded-GPU field dict], label)] from an H200 trace or a recording.

    Also returns the recording's hello dict (or None). H200 trace lines: t, phase, util_gpu, ...,
    gpm{...}. Recording lines: verl-top wire records; gpu lines sharing a ``t`` form a frame.
    """
    import gzip  # noqa: PLC0415 - only replay needs it

    opener = gzip.open if str(path).endswith(".gz") else open
    frames: list[Frame] = []
    hello = None
    by_t: dict[float, Frame] = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            rtype = row.get("type")
            if rtype == "gpu":
                t = float(row.get("t", 0.0))
                frame = by_t.get(t)
                if frame is None:
                    frame = by_t[t] = (t, [], row.get("label", ""))
                    frames.append(frame)
                frame[1].append({k: row[k] for k in GPU_FIELDS if k in row and k != "index"})
            elif rtype == "hello" and hello is None:
                hello = row
            elif rtype is None and "util_gpu" in row:
                f = {k: row[k] for k in TRACE_DIRECT if row.get(k) is not None}
                gpm = row.get("gpm") or {}
                for key, name in TRACE_GPM_KEYS:
                    if gpm.get(key) is not None:
                        f[name] = gpm[key]
                frames.append((float(row.get("t", 0.0)), [f], str(row.get("phase", ""))))
    frames.sort(key=lambda fr: fr[0])
    if frames:
        t0 = frames[0][0]
        frames = [(t - t0, g, label) for t, g, label in frames]
    return frames, hello


class ReplayBackend:
    """Plays a GPU trace as if it were ``gpus`` GPUs, paced by the agent interval."""

    name = "replay"
    blocking = False

    def __init__(
        self, path: str, gpus: int = 8, speed: float = 1.0, seed: int = 0, interval: float = 1.0
    ) -> None:
        if not path:
            raise BackendUnavailable("replay backend needs --replay-trace PATH")
        try:
            self.frames, hello = load_trace(path)
        except OSError as exc:
            raise BackendUnavailable(f"cannot read replay trace {path}: {exc}") from exc
        if not self.frames:
            raise BackendUnavailable(f"replay trace {path} has no GPU samples")
        self.n = max(1, int(gpus))
        self.speed = float(speed) if speed and speed > 0 else 1.0
        self.interval = interval
        self.error = ""
        self.driver = "replay"
        self.nvml_version = ""
        name, mem_total, limit = H200_NAME, H200_MEM_MIB, H200_POWER_LIMIT_W
        if hello and hello.get("gpus"):
            g0 = hello["gpus"][0]
            name = g0.get("name") or name
            mem_total = g0.get("mem_total_mib") or mem_total
            limit = g0.get("power_limit_w") or limit
        self.mem_total = mem_total
        self.limit = limit
        self.gpus = [
            gpu_info(
                i,
                name,
                f"GPU-replay-{seed}-{i:02d}",
                mem_total,
                "00000000:%02X:00.0" % (0x18 + 0x10 * i),
                limit,
                True,
            )
            for i in range(self.n)
        ]
        self.capabilities = ["gpm"]
        import random  # noqa: PLC0415 - only replay jitters

        rng = random.Random(seed)
        # Small fixed per-GPU differences, so the fan-out does not look like one GPU 8 times.
        self._scale = [1.0 if i == 0 else 0.96 + 0.06 * rng.random() for i in range(self.n)]
        self._temp_off = [0 if i == 0 else rng.randint(-2, 3) for i in range(self.n)]
        self._jitter = random.Random(seed + 1)
        last = self.frames[-1][0]
        gaps = [b[0] - a[0] for a, b in zip(self.frames, self.frames[1:]) if b[0] > a[0]]
        self.period = last + (min(gaps) if gaps else 1.0)  # loop length
        self._pos = 0
        self._clock = 0.0  # trace time of the next tick
        self._started = False

    def _frame(self) -> Frame:
        """The frame for this tick: the last one whose time is <= the trace clock."""
        frames = self.frames
        if self._started:
            self._clock += self.interval * self.speed
        self._started = True
        if self._clock >= self.period:
            self._clock -= self.period * int(self._clock // self.period)
            self._pos = 0
        pos = self._pos
        while pos + 1 < len(frames) and frames[pos + 1][0] <= self._clock:
            pos += 1
        self._pos = pos
        return frames[pos]

    def _vary(self, i: int, src: dict[str, Any]) -> dict[str, Any]:
        """GPU i's values: the recorded GPU's, scaled a little (GPU 0 of a trace is exact)."""
        s = self._scale[i]
        if s == 1.0:
            return src
        j = 1.0 + 0.01 * (self._jitter.random() - 0.5)
        out = {}
        for k, v in src.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                out[k] = v
            elif k in PERCENT_FIELDS:
                out[k] = min(100.0, round(v * s * j, 2))
            elif k == "temp_c":
                out[k] = v + self._temp_off[i]
            elif k in (
                "power_w",
                "nvlink_tx_mibs",
                "nvlink_rx_mibs",
                "pcie_tx_mibs",
                "pcie_rx_mibs",
            ):
                out[k] = round(v * s * j, 2)
            elif k == "mem_used_mib":
                out[k] = round(v * (0.995 + 0.005 * s), 1)
            else:
                out[k] = v
        return out

    def sample(self, now: float) -> list[Fields]:
        _, gpus, label = self._frame()
        nrec = len(gpus)
        out = []
        for i in range(self.n):
            src = gpus[i % nrec]
            vals = src if (i < nrec and nrec > 1) else self._vary(i, src)
            f = {"index": i, "mem_total_mib": self.mem_total, "power_limit_w": self.limit}
            f.update(vals)
            f["index"] = i
            f["lost"] = bool(f.get("lost", False))
            f["label"] = label or f.get("label", "")
            out.append(tuple((k, f[k]) for k in GPU_FIELDS if k in f))
        return out

    def processes(self) -> None:
        return None

    def close(self) -> None:
        pass
