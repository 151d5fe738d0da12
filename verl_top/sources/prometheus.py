"""The cluster from Prometheus: ``verl-top --prometheus http://PROM:9090``.

Reads NVIDIA's DCGM exporter series and the rollout servers' own metrics (vLLM, SGLang) through
the Prometheus HTTP API, instead of one SSH session per node. Every round (``--interval``, 5 s by
default) runs one *instant query per metric* (never per GPU): each query aggregates its metric
``by`` the labels that name a GPU (``Hostname``/``hostname``/``instance``, ``gpu``), so MIG
instances fold into their GPU and the answer stays small at 1000+ GPUs. The answers become the
same records the SSH agent sends (``Hello``, ``GpuSample``), so every pane and the diagnosis work
unchanged; rollout servers become :class:`~verl_top.model.RolloutSample` records.

At start-up the same expressions are asked as *range queries* over the history window, so the
plots are full on the first frame. A metric without a series is ``None`` (no data), never 0;
DCGM's "blank" numbers (>= 2**47: not found / not supported / no permission) are ``None`` too.
Every answer is foreign: JSON through :func:`verl_top.untrusted.loads`, label values through
``clean_text``, numbers through ``finite``. A round has a time budget; a dead or slow Prometheus
is reported as a :class:`~verl_top.model.SourceStatus` and its hosts go ``stale``, never a hang.

Facts about the exporter's names, units and labels: tests/fixtures/prometheus/README.md.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl_top.model import (
    GpuInfo,
    GpuSample,
    Hello,
    HostState,
    LogEvent,
    Record,
    RolloutSample,
    SourceStatus,
)
from verl_top.sources.base import Emit, Source
from verl_top.untrusted import UntrustedJSONError, bounded_int, clean_text, finite, loads

DEFAULT_PORT = 9090
MAX_BODY = 64 * 1024 * 1024  # one API answer; 1024 GPUs x 20 metrics is ~0.3 MB per metric
MAX_SERIES = 200_000  # series taken from one answer
THREAD_PARSE_BYTES = 512 * 1024  # answers larger than this are decoded in a worker thread
EMIT_CHUNK = 2000  # start-up history records emitted between two yields to the event loop
MAX_GPU_INDEX = 1023
DCGM_BLANK = float(2**47)  # DCGM's float blank; int64 blanks (9.2e18) are above it too
MIB = 1024.0 * 1024.0
# Labels that name one GPU. Both spellings of the host label: dcgm-exporter master renamed
# ``Hostname`` to ``hostname``; ``instance`` is the fallback when --no-hostname dropped both.
GPU_KEY = "Hostname, hostname, instance, gpu"
INFO_LABELS = (
    "Hostname, hostname, instance, gpu, UUID, uuid, modelName, DCGM_FI_DRIVER_VERSION, "
    "pod, namespace, container"
)
# Series every exporter has by default: whichever of them a GPU has names it in the info query.
INFO_METRICS = (
    "DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_USED|FB_FREE|GPU_UTIL|SM_CLOCK)"
    "|DCGM_FI_PROF_GR_ENGINE_ACTIVE"
)
# XIDs worth a sentence (NVIDIA's XID catalogue); others are shown by number.
XID_TEXT = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement / row remap",
    64: "ECC page retirement / row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


class PromError(Exception):
    """Prometheus could not be asked or did not answer usefully; the message says why.

    ``unreachable``: no answer at all (refused, timed out, not HTTP): the whole round stops.
    Otherwise Prometheus answered with an error for this one query.
    """

    def __init__(self, message: str, unreachable: bool = True) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class GpuMetric:
    """One DCGM series read into a ``GpuSample`` field (or an auxiliary value)."""

    field: str  # GpuSample field, or "mem_free" / "mem_reserved" / "gr_engine" / "xid"
    metric: str
    agg: str = "avg"  # avg for gauges repeated per MIG instance, sum for per-instance memory
    scale: float = 1.0

    def expr(self, selector: str) -> str:
        """The instant/range PromQL: one series per GPU."""
        return f"{self.agg} by ({GPU_KEY}) ({self.metric}{{{selector}}})"


# Ratios (PROF fields) are 0-1 and become percentages like the agent's GPM values;
# byte rates become MiB/s like the agent's NVLink/PCIe columns.
GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("util_gpu", "DCGM_FI_DEV_GPU_UTIL"),
    GpuMetric("util_mem", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    GpuMetric("gr_engine", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100.0),
    GpuMetric("sm_util", "DCGM_FI_PROF_SM_ACTIVE", scale=100.0),
    GpuMetric("sm_occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", scale=100.0),
    GpuMetric("tensor_util", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", scale=100.0),
    GpuMetric("dram_util", "DCGM_FI_PROF_DRAM_ACTIVE", scale=100.0),
    GpuMetric("mem_used_mib", "DCGM_FI_DEV_FB_USED", agg="sum"),
    GpuMetric("mem_free", "DCGM_FI_DEV_FB_FREE", agg="sum"),
    GpuMetric("mem_reserved", "DCGM_FI_DEV_FB_RESERVED", agg="sum"),
    GpuMetric("power_w", "DCGM_FI_DEV_POWER_USAGE"),
    GpuMetric("temp_c", "DCGM_FI_DEV_GPU_TEMP"),
    GpuMetric("sm_mhz", "DCGM_FI_DEV_SM_CLOCK"),
    GpuMetric("mem_mhz", "DCGM_FI_DEV_MEM_CLOCK"),
    GpuMetric("nvlink_tx_mibs", "DCGM_FI_PROF_NVLINK_TX_BYTES", scale=1 / MIB),
    GpuMetric("nvlink_rx_mibs", "DCGM_FI_PROF_NVLINK_RX_BYTES", scale=1 / MIB),
    GpuMetric("pcie_tx_mibs", "DCGM_FI_PROF_PCIE_TX_BYTES", scale=1 / MIB),
    GpuMetric("pcie_rx_mibs", "DCGM_FI_PROF_PCIE_RX_BYTES", scale=1 / MIB),
    GpuMetric("xid", "DCGM_FI_DEV_XID_ERRORS", agg="max"),
)
SAMPLE_FIELDS = {
    m.field for m in GPU_METRICS if m.field not in ("mem_free", "mem_reserved", "gr_engine", "xid")
}


def _either(vllm: str, sglang: str) -> str:
    """vLLM's series, else SGLang's, each tagged with a ``server`` label (one query)."""
    return (
        f'label_replace({vllm}, "server", "vllm", "", "") or '
        f'label_replace({sglang}, "server", "sglang", "", "")'
    )


def _quantile(q: float, vllm: str, sglang: str, sel: str) -> str:
    """``histogram_quantile`` per server; ``sglang`` may name alternatives (``a|b``: newer
    SGLang's name first, the older one second)."""

    # Cumulative buckets (since the server started): a rate over a short window is empty
    # whenever no request finished in it, and the long tail is what matters here.
    def one(name: str) -> str:
        return f"histogram_quantile({q}, sum by (instance, le) ({name}_bucket{{{sel}}}))"

    return _either(one(vllm), " or ".join(one(n) for n in sglang.split("|")))


def rollout_queries(sel: str) -> dict[str, tuple[str, float]]:
    """RolloutSample field -> (PromQL, scale); vLLM V0/V1 and SGLang names in one query each."""

    def by(agg: str, name: str) -> str:
        return f"{agg} by (instance) ({name}{{{sel}}})"

    def rate(name: str) -> str:
        return f"sum by (instance) (rate({name}{{{sel}}}[1m]))"

    return {
        "running": (
            _either(by("sum", "vllm:num_requests_running"), by("sum", "sglang:num_running_reqs")),
            1.0,
        ),
        "waiting": (
            _either(by("sum", "vllm:num_requests_waiting"), by("sum", "sglang:num_queue_reqs")),
            1.0,
        ),
        # vLLM V1 renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are 0-1.
        "kv_cache_pct": (
            _either(
                f"{by('avg', 'vllm:kv_cache_usage_perc')} or "
                f"{by('avg', 'vllm:gpu_cache_usage_perc')}",
                by("avg", "sglang:token_usage"),
            ),
            100.0,
        ),
        "gen_tokens_s": (
            _either(rate("vllm:generation_tokens_total"), rate("sglang:generation_tokens_total")),
            1.0,
        ),
        "prompt_tokens_s": (
            _either(rate("vllm:prompt_tokens_total"), rate("sglang:prompt_tokens_total")),
            1.0,
        ),
        "preemptions_s": (
            _either(
                rate("vllm:num_preemptions_total"), rate("sglang:num_retracted_requests_total")
            ),
            1.0,
        ),
        "ttft_p50_s": (
            _quantile(
                0.5, "vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds", sel
            ),
            1.0,
        ),
        "ttft_p90_s": (
            _quantile(
                0.9, "vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds", sel
            ),
            1.0,
        ),
        "tpot_p50_s": (
            _quantile(
                0.5,
                "vllm:time_per_output_token_seconds",
                # SGLang renamed time_per_output_token_seconds to inter_token_latency_seconds.
                "sglang:inter_token_latency_seconds|sglang:time_per_output_token_seconds",
                sel,
            ),
            1.0,
        ),
        "e2e_p50_s": (
            _quantile(
                0.5, "vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds", sel
            ),
            1.0,
        ),
        "e2e_p90_s": (
            _quantile(
                0.9, "vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds", sel
            ),
            1.0,
        ),
    }


def rollout_info(sel: str) -> str:
    """One series per rollout server, naming its kind (``server``) and ``model_name``."""
    return _either(
        f"group by (instance, model_name) (vllm:num_requests_running{{{sel}}})",
        f"group by (instance, model_name) (sglang:num_running_reqs{{{sel}}})",
    )


# --- settings -----------------------------------------------------------------------------------

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_selector(text: str) -> str:
    """``job="dcgm",namespace=~"gpu.*"`` (braces optional) as PromQL matchers; ValueError if bad."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out, pos = [], 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(
                f"--prom-selector {text!r}: expected label matchers like "
                'job="dcgm",namespace=~"train-.*" (name, one of = != =~ !~, a "quoted" value)'
            )
        out.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
    return ",".join(out)


def parse_url(text: str) -> str:
    """``http(s)://HOST[:PORT][/prefix]`` (scheme and port optional); ValueError if unusable."""
    raw = text.strip()
    if "://" not in raw:
        raw = f"http://{raw}"
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--prometheus {text!r}: expected http(s)://HOST:PORT")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValueError(f"--prometheus {text!r}: bad port") from None
    return raw.rstrip("/")


@dataclass
class PromSettings:
    """What the Prometheus source needs; built by the CLI from ``--prometheus`` and friends."""

    KIND: ClassVar[str] = "prometheus"
    url: str
    selector: str = ""  # PromQL label matchers applied to the DCGM series
    rollout_selector: str | None = None  # for vllm:/sglang: series; None: same as selector
    interval: float = 5.0  # s between rounds
    budget: float = 4.0  # s: a round (all queries) must answer within this
    request_timeout: float = 3.0  # s per request (connect + answer)
    history_s: float = 300.0  # range queried at start-up
    history_budget: float = 20.0  # s for the start-up range queries
    parallel: int = 8  # requests in flight at once
    rollout: bool = True

    def __post_init__(self) -> None:
        self.url = parse_url(self.url)
        self.selector = parse_selector(self.selector) if self.selector else ""
        if self.rollout_selector is not None:
            self.rollout_selector = parse_selector(self.rollout_selector)
        if self.interval <= 0 or self.budget <= 0 or self.request_timeout <= 0:
            raise ValueError("--prometheus: interval and timeouts must be positive")


# --- the HTTP API client ------------------------------------------------------------------------


@dataclass
class Series:
    """One answered series: its labels (cleaned) and its points (None = not a finite number)."""

    labels: dict[str, str]
    points: list[tuple[float, float | None]]


def _number(text: Any) -> float | None:
    """An API sample value (a string) as a finite float below DCGM's blank, else None."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    number = finite(value)
    if number is None or abs(number) >= DCGM_BLANK:
        return None
    return number


def _point(pair: Any) -> tuple[float, float | None] | None:
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    t = finite(pair[0], 0.0, 1e11)
    return None if t is None else (t, _number(pair[1]))


class LabelCleaner:
    """``clean_text`` with a bounded memo: the same label names and values arrive in every
    answer of every round (1024 GPUs x 20 metrics), and cleaning them was most of a round's CPU.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._memo: dict[tuple[str, int], str] = {}

    def __call__(self, value: str, limit: int) -> str:
        key = (value, limit)
        hit = self._memo.get(key)
        if hit is None:
            hit = clean_text(value, limit)
            if len(value) <= 1024:  # a long value is rare; do not let it fill the memo
                if len(self._memo) >= self.capacity:
                    self._memo.clear()
                self._memo[key] = hit
        return hit


def parse_answer(body: bytes, url: str, clean: LabelCleaner | None = None) -> list[Series]:
    """The series of an API answer (vector or matrix); PromError for an error answer."""
    clean = clean if clean is not None else LabelCleaner()
    try:
        doc = loads(body, max_bytes=MAX_BODY)
    except UntrustedJSONError as exc:
        raise PromError(f"{url} answered, but not with Prometheus JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise PromError(f"{url} answered JSON that is not a Prometheus API reply")
    if doc.get("status") != "success":
        kind = clean_text(doc.get("errorType"), 40) or "error"
        raise PromError(f"Prometheus {kind}: {clean_text(doc.get('error'), 300)}", False)
    data = doc.get("data")
    rows = data.get("result") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise PromError(f"{url} answered JSON without data.result: is this Prometheus?")
    out: list[Series] = []
    for row in rows[:MAX_SERIES]:
        if not isinstance(row, dict) or not isinstance(row.get("metric"), dict):
            continue
        labels = {
            clean(k, 64): clean(v, 256)
            for k, v in list(row["metric"].items())[:64]
            if isinstance(k, str) and isinstance(v, str)
        }
        if "value" in row:
            p = _point(row["value"])
            points = [p] if p is not None else []
        else:
            values = row.get("values")
            raw = values if isinstance(values, list) else []
            points = [p for v in raw if (p := _point(v)) is not None]
        out.append(Series(labels, points))
    return out


class PromClient:
    """Asynchronous GETs against one Prometheus HTTP API (plain asyncio, HTTP/1.0).

    HTTP/1.0 so the server closes the connection and never chunks the body: the reader needs no
    chunk decoding, and the read is bounded by ``MAX_BODY``. Cancellable, so a round's budget
    really ends it. Basic auth from ``http://user:pass@host`` is sent when given.
    """

    def __init__(self, url: str, timeout: float = 3.0) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else DEFAULT_PORT)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.requests = 0
        self.bytes = 0
        auth = ""
        if parts.username is not None:
            token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            auth = f"Authorization: Basic {base64.b64encode(token.encode()).decode()}\r\n"
        self._auth = auth
        self.shown = f"{parts.scheme}://{self.host}:{self.port}{self.prefix}"  # no password
        self.clean = LabelCleaner()
        self._tls = ssl.create_default_context() if self.tls else None  # once: costs ms

    async def get(self, path: str, params: Mapping[str, str]) -> list[Series]:
        """Series of ``GET /api/v1/<path>?params`` (PromError on any failure)."""
        try:
            return await asyncio.wait_for(self._get(path, params), self.timeout)
        except asyncio.TimeoutError:
            raise PromError(
                f"Prometheus at {self.shown} did not answer within {self.timeout:g} s"
            ) from None

    async def _get(self, path: str, params: Mapping[str, str]) -> list[Series]:
        self.requests += 1
        target = f"{self.prefix}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._tls)
        except OSError as exc:
            raise PromError(self._unreachable(exc)) from None
        try:
            request = (
                f"GET {target} HTTP/1.0\r\nHost: {self.host}:{self.port}\r\n"
                f"Accept: application/json\r\nUser-Agent: verl-top\r\n{self._auth}\r\n"
            )
            writer.write(request.encode())
            raw = await self._read_all(reader)
        except OSError as exc:
            raise PromError(self._unreachable(exc)) from None
        finally:
            writer.close()
        self.bytes += len(raw)
        head, sep, body = raw.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if not sep or len(status) < 2 or not status[0].startswith(b"HTTP/"):
            raise PromError(f"{self.shown} did not answer as an HTTP server: is this Prometheus?")
        code = bounded_int(int(status[1]) if status[1].isdigit() else -1, 100, 599)
        if code in (401, 403):
            raise PromError(f"Prometheus at {self.shown} refused access (HTTP {code})")
        if code == 404:
            raise PromError(
                f"{self.shown}/api/v1/{path} does not exist (HTTP 404): not Prometheus?"
            )
        try:
            # 400/422/503 from Prometheus carry a JSON error that names why.
            if len(body) > THREAD_PARSE_BYTES:
                # Start-up range answers at 1000+ GPUs are MBs: decode them off the event loop
                # so the screen keeps drawing meanwhile.
                return await asyncio.to_thread(parse_answer, body, self.shown, self.clean)
            return parse_answer(body, self.shown, self.clean)
        except PromError as exc:
            if code is not None and code >= 400:  # e.g. a proxy's HTML 502 in front of it
                raise PromError(f"HTTP {code}: {exc}", exc.unreachable) from None
            raise

    async def _read_all(self, reader: asyncio.StreamReader) -> bytes:
        buf = bytearray()
        while chunk := await reader.read(256 * 1024):
            buf += chunk
            if len(buf) > MAX_BODY:
                raise PromError(f"Prometheus answer larger than {MAX_BODY} bytes (refused)")
        return bytes(buf)

    def _unreachable(self, exc: OSError) -> str:
        if isinstance(exc, ConnectionRefusedError):
            return f"cannot reach Prometheus at {self.shown}: connection refused"
        return f"cannot reach Prometheus at {self.shown}: {clean_text(exc.strerror or exc, 200)}"

    async def query(self, expr: str, at: float) -> list[Series]:
        """Instant query evaluated at ``at``."""
        return await self.get("query", {"query": expr, "time": f"{at:.3f}"})

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """Range query over [start, end] every ``step`` seconds."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return await self.get("query_range", params)


# --- labels -> hosts and GPUs -------------------------------------------------------------------


def host_of(labels: Mapping[str, str]) -> str:
    """The host a DCGM series is about: ``Hostname``/``hostname``, else the scrape address."""
    name = labels.get("Hostname") or labels.get("hostname")
    if not name:
        instance = labels.get("instance", "")
        name = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
    return clean_text(name.strip("[]"), 128)


def gpu_of(labels: Mapping[str, str]) -> tuple[str, int] | None:
    """(host, GPU index) of a DCGM series, or None when it names no GPU."""
    text = labels.get("gpu", "")
    index = bounded_int(int(text), 0, MAX_GPU_INDEX) if text.isdigit() else None
    host = host_of(labels)
    return None if index is None or not host else (host, index)


def workload_of(labels: Mapping[str, str]) -> str:
    """``namespace/pod`` of the GPU's workload (dcgm-exporter --kubernetes), else ''.

    Prometheus without honor_labels puts the exporter's own pod there: that is not a workload.
    """
    pod = labels.get("pod") or labels.get("exported_pod") or ""
    if not pod or "dcgm-exporter" in pod:
        return ""
    ns = labels.get("namespace") or labels.get("exported_namespace") or ""
    return f"{ns}/{pod}" if ns else pod


@dataclass
class GpuFacts:
    """What the info query says about one GPU."""

    uuid: str = ""
    model: str = ""
    driver: str = ""
    workload: str = ""


def gpu_facts(series: Iterable[Series]) -> dict[tuple[str, int], GpuFacts]:
    """GPU key -> facts, from the info query (first series of a GPU wins)."""
    out: dict[tuple[str, int], GpuFacts] = {}
    for s in series:
        key = gpu_of(s.labels)
        if key is None:
            continue
        facts = out.setdefault(key, GpuFacts())
        facts.uuid = facts.uuid or s.labels.get("UUID") or s.labels.get("uuid", "")
        facts.model = facts.model or s.labels.get("modelName", "")
        facts.driver = facts.driver or s.labels.get("DCGM_FI_DRIVER_VERSION", "")
        facts.workload = facts.workload or workload_of(s.labels)
    return out


Values = dict[str, dict[Any, float | None]]  # metric field -> series key -> value


def gpu_values(answers: Mapping[str, list[Series]], index: int = -1) -> Values:
    """Per field, per GPU key: point ``index`` (-1: an instant answer's only point)."""
    out: Values = {}
    for name, series in answers.items():
        scale = METRIC_SCALE[name]
        col: dict[Any, float | None] = {}
        for s in series:
            key = gpu_of(s.labels)
            if key is None or key in col or not s.points:
                continue
            v = s.points[index][1]
            col[key] = None if v is None else v * scale
        out[name] = col
    return out


METRIC_SCALE = {m.field: m.scale for m in GPU_METRICS}


def gpu_sample(host: str, index: int, t: float, values: Values) -> GpuSample:
    """The GpuSample of one GPU from the per-field values of one instant."""

    def get(name: str) -> float | None:
        return values.get(name, {}).get((host, index))

    fields = {name: get(name) for name in SAMPLE_FIELDS}
    if fields["util_gpu"] is None:
        # MIG GPUs have no GPU_UTIL; GR_ENGINE_ACTIVE is the same "any engine busy" measure.
        fields["util_gpu"] = get("gr_engine")
    used, free, reserved = fields["mem_used_mib"], get("mem_free"), get("mem_reserved")
    total = None if used is None or free is None else used + free + (reserved or 0.0)
    return GpuSample(host=host, t=t, index=index, mem_total_mib=total, **fields)


# --- the source ---------------------------------------------------------------------------------


@dataclass
class _Known:
    """What the source has told the store, so it only repeats what changed."""

    hellos: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    xids: dict[tuple[str, int], float] = field(default_factory=dict)
    status: tuple[str, str] | None = None
    gone: set[str] = field(default_factory=set)


class PrometheusSource:
    """Polls Prometheus for DCGM and rollout-server series and emits verl-top records."""

    def __init__(self, settings: PromSettings) -> None:
        self.settings = settings
        self.client = PromClient(settings.url, settings.request_timeout)
        self.name = f"prometheus:{self.client.shown}"
        self.rounds = 0
        self.queries_last = 0
        self._known = _Known()
        self._sem = asyncio.Semaphore(max(1, settings.parallel))
        sel = settings.selector
        rsel = settings.selector if settings.rollout_selector is None else settings.rollout_selector
        self.gpu_exprs = {m.field: m.expr(sel) for m in GPU_METRICS}
        self.info_expr = (
            f'group by ({INFO_LABELS}) ({{__name__=~"{INFO_METRICS}"{"," + sel if sel else ""}}})'
        )
        queries = rollout_queries(rsel) if settings.rollout else {}
        self.rollout_exprs = {name: expr for name, (expr, _) in queries.items()}
        self.rollout_info = rollout_info(rsel)

    # asking

    async def _ask(self, expr: str, at: float, span: tuple[float, float] | None) -> list[Series]:
        async with self._sem:
            if span is None:
                return await self.client.query(expr, at)
            return await self.client.query_range(expr, span[0], at, span[1])

    async def _ask_all(
        self, exprs: Mapping[str, str], at: float, span: tuple[float, float] | None = None
    ) -> tuple[dict[str, list[Series]], list[str]]:
        """Every expression at once; answers by name, and the errors of those that failed.

        The first "unreachable" failure cancels the other requests and is raised: when
        Prometheus does not answer one request, waiting for the other 30 only delays saying so.
        """
        tasks = {asyncio.ensure_future(self._ask(e, at, span)): name for name, e in exprs.items()}
        answers: dict[str, list[Series]] = {}
        errors: list[str] = []
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        answers[tasks[task]] = task.result()
                    elif isinstance(exc, PromError) and not exc.unreachable:
                        errors.append(str(exc))
                    else:
                        raise exc
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return answers, errors

    # running

    async def run(self, emit: Emit) -> None:
        """History first (range queries), then one round every ``interval`` until cancelled."""
        await self._history(emit)
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            await self.poll(emit)
            next_round += self.settings.interval
            delay = next_round - loop.time()
            if delay < 0:  # a round overran: start the next one now, do not pile up
                next_round, delay = loop.time(), 0.0
            await asyncio.sleep(delay)

    async def poll(self, emit: Emit) -> None:
        """One round: every metric once, at one evaluation time, within the round's budget."""
        self.rounds += 1
        before = self.client.requests
        started = time.monotonic()
        at = time.time()
        try:
            records, errors = await asyncio.wait_for(self._round(at), self.settings.budget)
        except asyncio.TimeoutError:
            self._lost(
                emit,
                "slow",
                f"Prometheus at {self.client.shown} did not answer all queries within "
                f"{self.settings.budget:g} s (values kept as last seen)",
            )
            return
        except PromError as exc:
            self._lost(emit, "down", str(exc))
            return
        finally:
            self.queries_last = self.client.requests - before
        for record in records:
            emit(record)
        # A query Prometheus refused (an old version without a function, say) leaves its
        # metric without data; the rest of the round stands.
        reason = f"{len(errors)} queries failed, e.g. {errors[0]}" if errors else ""
        if not any(isinstance(r, GpuSample) for r in records):
            where = f"{{{self.settings.selector}}}" if self.settings.selector else "at all"
            reason = (
                f"no DCGM GPU series match {where} (is dcgm-exporter scraped by this "
                "Prometheus, and is --prom-selector right?)"
            )
        self._status(emit, "up", reason, time.monotonic() - started)

    async def _round(self, at: float) -> tuple[list[Record], list[str]]:
        exprs = {"_info": self.info_expr, **self.gpu_exprs}
        if self.rollout_exprs:
            exprs.update({"_rinfo": self.rollout_info, **self.rollout_exprs})
        answers, errors = await self._ask_all(exprs, at)
        if "_info" not in answers:
            raise PromError(errors[0] if errors else "no answer")
        records = self._gpu_records(answers, at)
        records += rollout_records(answers, at)
        return records, errors

    def _gpu_records(self, answers: Mapping[str, list[Series]], at: float) -> list[Record]:
        facts = gpu_facts(answers["_info"])
        gpu_answers = {k: v for k, v in answers.items() if k in self.gpu_exprs}
        values = gpu_values(gpu_answers)
        out: list[Record] = self._hellos(facts, values, at)
        for host, index in sorted(facts):
            out.append(gpu_sample(host, index, at, values))
        out += self._xid_events(values.get("xid", {}), at)
        return out

    def _hellos(
        self, facts: Mapping[tuple[str, int], GpuFacts], values: Values, at: float
    ) -> list[Record]:
        """A Hello per host whose GPUs changed; hosts that vanished go stale once."""
        by_host: dict[str, list[GpuInfo]] = {}
        drivers: dict[str, str] = {}
        for (host, index), f in sorted(facts.items()):
            sample = gpu_sample(host, index, at, values)
            total = None if sample.mem_total_mib is None else round(sample.mem_total_mib)
            # DCGM's PROF fields read the same SM/tensor/DRAM counters as NVML's GPM.
            prof = any(
                getattr(sample, c) is not None for c in ("sm_util", "tensor_util", "dram_util")
            )
            by_host.setdefault(host, []).append(
                GpuInfo(
                    index=index,
                    name=f.model,
                    uuid=f.uuid,
                    mem_total_mib=total,
                    gpm=prof,
                    workload=f.workload or None,
                )
            )
            drivers[host] = drivers.get(host) or f.driver
        out: list[Record] = []
        for host, gpus in by_host.items():
            key = tuple((g.index, g.uuid, g.name, g.mem_total_mib, g.gpm, g.workload) for g in gpus)
            if self._known.hellos.get(host) != key or host in self._known.gone:
                self._known.hellos[host] = key
                self._known.gone.discard(host)
                out.append(
                    Hello(
                        host=host,
                        t=at,
                        backend="dcgm-exporter",
                        driver=drivers.get(host, ""),
                        gpus=gpus,
                        capabilities=["prometheus"],
                        interval=self.settings.interval,
                    )
                )
        for host in set(self._known.hellos) - set(by_host) - self._known.gone:
            self._known.gone.add(host)
            out.append(
                HostState(
                    host=host,
                    t=at,
                    state="stale",
                    reason="no DCGM series in Prometheus any more (exporter down or target gone)",
                )
            )
        return out

    def _xid_events(self, xids: Mapping[Any, float | None], at: float) -> list[Record]:
        """A LogEvent when a GPU's last XID (DCGM_FI_DEV_XID_ERRORS; 0 = none) changes."""
        out: list[Record] = []
        for key, value in xids.items():
            if value is None or value == self._known.xids.get(key, 0.0):
                continue
            self._known.xids[key] = value
            if value <= 0:
                continue
            xid = int(value)
            what = XID_TEXT.get(xid, "see NVIDIA's XID catalogue")
            out.append(
                LogEvent(
                    host=key[0],
                    t=at,
                    kind="xid",
                    text=f"GPU {key[1]}: XID {xid} ({what}), from DCGM_FI_DEV_XID_ERRORS",
                    path=self.name,
                    severity=0.9 if xid in (48, 79, 95) else 0.6,
                )
            )
        return out

    def _lost(self, emit: Emit, state: str, reason: str) -> None:
        """Prometheus failed this round: say so, and mark the hosts it feeds stale."""
        self._status(emit, state, reason, None)
        now = time.time()
        for host in self._known.hellos:
            if host not in self._known.gone:
                emit(HostState(host=host, t=now, state="stale", reason=reason))
        self._known.gone.update(self._known.hellos)

    def _status(self, emit: Emit, state: str, reason: str, duration: float | None) -> None:
        if self._known.status == (state, reason) and state == "up":
            return
        self._known.status = (state, reason)
        emit(
            SourceStatus(
                host=self.name,
                t=time.time(),
                state=state,
                reason=reason,
                queries=self.queries_last,
                duration_s=duration,
            )
        )

    # history

    async def _history(self, emit: Emit) -> None:
        """Range queries over the history window so the panes are full on the first frame."""
        s = self.settings
        step = s.interval
        end = time.time()
        start = end - min(s.history_s, step * 10_000)  # Prometheus allows 11 000 points
        exprs = {"_info": self.info_expr, **self.gpu_exprs}
        exprs.update(self.rollout_exprs)
        try:
            answers, _ = await asyncio.wait_for(
                self._ask_all(exprs, end, (start, step)), s.history_budget
            )
        except (asyncio.TimeoutError, PromError) as exc:
            reason = str(exc) or f"no answer within {s.history_budget:g} s"
            self._status(emit, "slow", f"no history at start-up: {reason}", None)
            return
        if "_info" not in answers:
            return
        records = await asyncio.to_thread(history_records, self, answers)
        for i, record in enumerate(records):
            emit(record)
            if i % EMIT_CHUNK == EMIT_CHUNK - 1:
                await asyncio.sleep(0)  # 60k samples at 1024 GPUs: let the screen draw


def _by_time(series: Iterable[Series]) -> dict[float, list[Series]]:
    """A range answer regrouped as one instant answer per timestamp."""
    out: dict[float, list[Series]] = {}
    for s in series:
        for t, v in s.points:
            out.setdefault(t, []).append(Series(s.labels, [(t, v)]))
    return out


def history_records(source: PrometheusSource, answers: Mapping[str, list[Series]]) -> list[Record]:
    """Records for every timestamp of the range answers, oldest first (hellos come first)."""
    per_name = {name: _by_time(series) for name, series in answers.items()}
    times = sorted({t for by_t in per_name.values() for t in by_t})
    facts_all = gpu_facts(answers["_info"])
    out: list[Record] = []
    seen_hello = False
    for t in times:
        at_t = {name: by_t.get(t, []) for name, by_t in per_name.items()}
        facts = gpu_facts(at_t["_info"])
        gpu_answers = {k: v for k, v in at_t.items() if k in source.gpu_exprs}
        values = gpu_values(gpu_answers)
        if not seen_hello and facts:
            out += source._hellos(facts_all, values, t)  # noqa: SLF001 - one source's own parts
            seen_hello = True
        out += [gpu_sample(h, i, t, values) for h, i in sorted(facts)]
        out += rollout_records(at_t, t)
    return out


def rollout_records(answers: Mapping[str, list[Series]], at: float) -> list[Record]:
    """A RolloutSample per rollout server seen in any rollout answer."""
    queries = rollout_queries("")
    cols: dict[str, dict[str, float | None]] = {}
    servers: dict[str, tuple[str, str]] = {}
    for name in queries:
        col: dict[str, float | None] = {}
        for s in answers.get(name, []):
            inst = clean_text(s.labels.get("instance", ""), 128)
            if not inst or inst in col or not s.points:
                continue
            v = s.points[-1][1]
            col[inst] = None if v is None else v * queries[name][1]
            servers.setdefault(inst, (s.labels.get("server", ""), ""))
        cols[name] = col
    for s in answers.get("_rinfo", []):
        inst = clean_text(s.labels.get("instance", ""), 128)
        if inst:
            servers[inst] = (s.labels.get("server", ""), s.labels.get("model_name", ""))
    out: list[Record] = []
    for inst, (server, model) in sorted(servers.items()):
        fields = {name: cols[name].get(inst) for name in queries}
        out.append(RolloutSample(host=inst, t=at, server=server, model=model, **fields))
    return out


def build_sources(settings: PromSettings) -> list[Source]:
    """The registry's entry point: one source for one Prometheus."""
    return [PrometheusSource(settings)]
