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
Every answer is foreign: decoded series by series as it streams in (bounded in memory by what is
kept, :class:`verl_top.untrusted.JsonArrayStream`), label values through
``clean_text``, numbers through ``finite``. A round has a time budget; a dead or slow Prometheus
is reported as a :class:`~verl_top.model.SourceStatus` and its hosts go ``stale``, never a hang.

Facts about the exporter's names, units and labels: tests/fixtures/prometheus/README.md.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import urllib.parse
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl_top.gc_pause import cyclic_gc_paused
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
from verl_top.protocol import MAX_GPU_INDEX, in_range
from verl_top.sources.base import Emit, Source
from verl_top.sources.http_client import HttpClient, HttpError, HttpOptions, time_limit
from verl_top.sources.node_exporter import (
    NodePlan,
    cpu_columns,
    host_sample,
    host_samples,
    instance_values,
    join_hosts,
    scrape_query,
    series_key,
)
from verl_top.untrusted import (
    JsonArrayStream,
    UntrustedJSONError,
    bounded_int,
    clean_text,
    finite,
)

DEFAULT_PORT = 9090
MAX_BODY = 64 * 1024 * 1024  # one API answer; 1024 GPUs x 20 metrics is ~0.3 MB per metric
MAX_SERIES = 200_000  # series taken from one answer
MAX_SERIES_POINTS = 11_000  # points of one series (Prometheus' own limit per range query)
MAX_SERIES_CHARS = 1 << 20  # characters of one series (11 000 points are ~400 KB)
MAX_OTHER = 1 << 20  # characters of an answer outside data.result (status, warnings)
EMIT_SLICE = 1024  # records of a round emitted per turn of the event loop
MAX_ANSWER_POINTS = 2_000_000  # points kept from one answer (32 MB as arrays)
HISTORY_SAMPLES = 120_000  # GPU samples the start-up history may make (1024 GPUs x 117)
EMIT_CHUNK = 2000  # start-up history records emitted between two yields to the event loop
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


def parse_selector(text: str, flag: str = "--prom-selector") -> str:
    """``job="dcgm",namespace=~"gpu.*"`` (braces optional) as PromQL matchers; ValueError if bad
    (the message names ``flag``)."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out, pos = [], 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(
                f"{flag} {text!r}: expected label matchers like "
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
    node_selector: str = ""  # for node_exporter's series (they carry their own job labels)
    interval: float = 5.0  # s between rounds
    budget: float = 4.0  # s: a round (all queries) must answer within this
    request_timeout: float = 3.0  # s per request (connect + answer)
    history_s: float = 300.0  # range queried at start-up
    history_budget: float = 20.0  # s for the start-up range queries
    parallel: int = 8  # requests in flight at once
    rollout: bool = True
    node: bool = True  # host metrics from node_exporter, where Prometheus has them
    http: HttpOptions = field(default_factory=HttpOptions)  # headers, token, TLS files

    def __post_init__(self) -> None:
        self.url = parse_url(self.url)
        self.selector = parse_selector(self.selector) if self.selector else ""
        if self.rollout_selector is not None:
            self.rollout_selector = parse_selector(self.rollout_selector)
        if self.node_selector:
            self.node_selector = parse_selector(self.node_selector, "--prom-node-selector")
        if self.interval <= 0 or self.budget <= 0 or self.request_timeout <= 0:
            raise ValueError("--prometheus: interval and timeouts must be positive")
        self.http.check("--prom")


# --- the HTTP API client ------------------------------------------------------------------------

NAN = float("nan")


@dataclass
class Series:
    """One answered series: its labels (cleaned) and its points, kept compact (two arrays of
    doubles: 16 bytes a point, where a decoded ``[t, "v"]`` pair costs ~200). A value that is
    not a finite number is NaN here and ``None`` through :attr:`points` / :meth:`last`."""

    labels: dict[str, str]
    times: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))

    @property
    def points(self) -> list[tuple[float, float | None]]:
        """(t, value or None) pairs, oldest first."""
        return [(t, None if v != v else v) for t, v in zip(self.times, self.values, strict=True)]

    def last(self) -> float | None:
        """The newest value (an instant answer's only one); None when absent or not a number."""
        if not self.values:
            return None
        v = self.values[-1]
        return None if v != v else v


def _number(text: Any) -> float | None:
    """An API sample value (a string) as a finite float below DCGM's blank, else None.

    Only Prometheus' own spelling of a number is read: ASCII digits, sign, point, exponent
    (``float`` would also take ``1_000`` and Arabic-Indic digits).
    """
    if not isinstance(text, str) or len(text) > 40 or _NUMBER.match(text) is None:
        return None
    number = finite(float(text))
    if number is None or abs(number) >= DCGM_BLANK:
        return None
    return number


_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


class LabelCleaner:
    """``clean_text`` with a bounded memo: the same label names and values arrive in every
    answer of every round (1024 GPUs x 20 metrics), and cleaning them was most of a round's CPU.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._memos: dict[int, dict[str, str]] = {}  # per length limit: value -> cleaned

    def __call__(self, value: str, limit: int) -> str:
        memo = self._memo(limit)
        hit = memo.get(value)
        return self._miss(memo, value, limit) if hit is None else hit

    def _memo(self, limit: int) -> dict[str, str]:
        memo = self._memos.get(limit)
        if memo is None:
            memo = self._memos[limit] = {}
        return memo

    def _miss(self, memo: dict[str, str], value: str, limit: int) -> str:
        hit = clean_text(value, limit)
        if len(value) <= 1024:  # a long value is rare; do not let it fill the memo
            if sum(len(m) for m in self._memos.values()) >= self.capacity:
                for m in self._memos.values():
                    m.clear()
            memo[value] = hit
        return hit

    def labels(self, metric: dict[Any, Any]) -> dict[str, str]:
        """A series' labels cleaned: the first 64 of them whose name and value are strings,
        names cut at 64 characters, values at 256 (one loop per series, the memos read
        directly: this runs for every series of every answer)."""
        names, values = self._memo(64), self._memo(256)
        out: dict[str, str] = {}
        for k, v in list(metric.items())[:64]:
            if isinstance(k, str) and isinstance(v, str):
                name = names.get(k)
                if name is None:
                    name = self._miss(names, k, 64)
                value = values.get(v)
                if value is None:
                    value = self._miss(values, v, 256)
                out[name] = value
        return out


@dataclass
class SeriesReader:
    """Turns each decoded ``result`` item into a :class:`Series` as the answer streams in.

    ``budget`` bounds the points kept from one answer (the start-up history asks for a known
    number of GPUs and points; a Prometheus answering more is cut there, and ``cut`` counts
    the points let go).
    """

    clean: LabelCleaner
    budget: int = MAX_ANSWER_POINTS
    cut: int = 0

    def __call__(self, row: Any) -> Series | None:
        if not isinstance(row, dict) or not isinstance(row.get("metric"), dict):
            return None
        series = Series(self.clean.labels(row["metric"]))
        if "value" in row:  # an instant answer: one pair, the common case of every round
            pair = row["value"]
            if isinstance(pair, list) and len(pair) == 2 and self.budget > 0:
                t = finite(pair[0], 0.0, 1e11)
                if t is not None:
                    value = _number(pair[1])
                    series.times.append(t)
                    series.values.append(NAN if value is None else value)
                    self.budget -= 1
            return series
        raw = row.get("values")
        if not isinstance(raw, list):
            return series
        if len(raw) > min(self.budget, MAX_SERIES_POINTS):
            keep = max(0, min(self.budget, MAX_SERIES_POINTS))
            self.cut += len(raw) - keep
            raw = raw[:keep]
        try:
            _fast_points(raw, series)
        except (TypeError, ValueError, KeyError, IndexError, OverflowError):
            _slow_points(raw, series)  # something in it is not a plain [t, "v"] pair
        self.budget -= len(series.times)
        return series


def _fast_points(raw: list[Any], series: Series) -> None:
    """All pairs of a well-formed series at once (C-level loops, ~10x the pair-by-pair speed):
    raises when any pair is not ``[number, "number"]`` in Prometheus' spelling (nothing is kept
    then, and the caller goes pair by pair)."""
    stamps = [p[0] for p in raw]
    texts = [p[1] for p in raw]
    if not set(map(type, stamps)) <= _NUMBER_TYPES:  # a string, None or a bool
        raise TypeError("a timestamp that is not a number")
    if _VALUE_CHARS.match("".join(texts)) is None:  # TypeError unless all are strings
        raise ValueError("a value that is not a plain number")
    times = array("d", stamps)
    total = sum(times)
    if total != total or (times and (min(times) < 0.0 or max(times) > 1e11)):
        raise ValueError("a timestamp out of range")
    values = array("d", map(float, texts))  # ValueError for "1e" or "--1" and the like
    spread = sum(values)
    if values and not (spread == spread and -DCGM_BLANK < min(values) <= max(values) < DCGM_BLANK):
        for k, v in enumerate(values):  # NaN, +-Inf or DCGM's blanks: no data
            if not -DCGM_BLANK < v < DCGM_BLANK:
                values[k] = NAN
    series.times, series.values = times, values


_NUMBER_TYPES = {int, float}


def _slow_points(raw: list[Any], series: Series) -> None:
    """Pair by pair, keeping the good ones (a hostile or odd series)."""
    for pair in raw:
        if isinstance(pair, list) and len(pair) == 2:
            t = finite(pair[0], 0.0, 1e11)
            if t is not None:
                series.times.append(t)
                value = _number(pair[1])
                series.values.append(NAN if value is None else value)


# Every character of a Prometheus sample value, NaN and +Inf/-Inf included.
_VALUE_CHARS = re.compile(r"[0-9.eE+\-NaIf]*\Z")


def answer_series(doc: Mapping[str, Any], url: str) -> list[Series]:
    """The series of a decoded API answer (vector or matrix); PromError for an error answer."""
    if doc.get("status") != "success":
        kind = clean_text(doc.get("errorType"), 40) or "error"
        raise PromError(f"Prometheus {kind}: {clean_text(doc.get('error'), 300)}", False)
    data = doc.get("data")
    rows = data.get("result") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise PromError(f"{url} answered JSON without data.result: is this Prometheus?")
    return [s for s in rows if isinstance(s, Series)]


def _stream(reader: SeriesReader) -> JsonArrayStream:
    return JsonArrayStream(
        ("data", "result"), reader, MAX_SERIES, max_item=MAX_SERIES_CHARS, max_other=MAX_OTHER
    )


def parse_answer(body: bytes, url: str, clean: LabelCleaner | None = None) -> list[Series]:
    """The series of a whole API answer held in memory (tests, error bodies)."""
    stream = _stream(SeriesReader(clean if clean is not None else LabelCleaner()))
    try:
        stream.feed(body.decode("utf-8", "replace"))
        doc = stream.finish()
    except UntrustedJSONError as exc:
        raise PromError(f"{url} answered, but not with Prometheus JSON ({exc})") from None
    return answer_series(doc, url)


class PromClient:
    """Asynchronous GETs against one Prometheus HTTP API, on the shared HTTP client
    (verl_top/sources/http_client.py): keep-alive connections, gzip, TLS and proxy options,
    one deadline per request, the ``result`` array decoded series by series as it arrives.
    Basic auth from ``http://user:pass@host`` is sent when given.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 3.0,
        options: HttpOptions | None = None,
        connections: int = 8,
    ) -> None:
        self.http = HttpClient(
            url, options or HttpOptions(), deadline=timeout, max_body=MAX_BODY,
            connections=connections,
        )  # fmt: skip
        self.url = self.http.base_url
        self.shown = self.http.shown  # no password
        self.timeout = timeout
        self.clean = LabelCleaner()

    @property
    def requests(self) -> int:
        """Requests sent so far."""
        return self.http.requests

    @property
    def bytes(self) -> int:
        """Answer bytes received so far (as sent: compressed when gzip was used)."""
        return self.http.nbytes

    async def get(
        self, path: str, params: Mapping[str, str], budget: int = MAX_ANSWER_POINTS
    ) -> list[Series]:
        """Series of ``GET /api/v1/<path>?params`` (PromError on any failure)."""
        reader = SeriesReader(self.clean, budget)
        try:
            answer = await self.http.get_json(
                f"/api/v1/{path}", params, ("data", "result"), reader, MAX_SERIES,
                MAX_SERIES_CHARS, MAX_OTHER,
            )  # fmt: skip
        except HttpError as exc:
            raise self._error(exc, path) from None
        return answer_series(answer.doc, self.shown)

    def _error(self, exc: HttpError, path: str) -> PromError:
        where = self.shown
        if exc.kind == "timeout":
            return PromError(f"Prometheus at {where} did not answer within {self.timeout:g} s")
        if exc.kind == "status":
            code = exc.status
            if code in (401, 403):
                return PromError(f"Prometheus at {where} refused access (HTTP {code})")
            if code == 404:
                return PromError(
                    f"{where}/api/v1/{path} does not exist (HTTP 404): not Prometheus?"
                )
            try:  # 400/422/503 from Prometheus carry a JSON error that names why
                parse_answer(exc.body, where, self.clean)
            except PromError as inner:  # e.g. a proxy's HTML 502 in front of it
                return PromError(f"HTTP {code}: {inner}", inner.unreachable)
            return PromError(f"{where}: HTTP {code}")
        if exc.kind == "not_json":
            return PromError(f"{where} answered, but not with Prometheus JSON ({exc})")
        if exc.kind == "not_http":
            return PromError(f"{where} did not answer as an HTTP server: is this Prometheus?")
        if exc.kind == "refused":
            return PromError(f"cannot reach Prometheus at {where}: connection refused")
        if exc.kind == "too_large":
            return PromError(f"Prometheus answer refused: {exc}")
        return PromError(f"cannot reach Prometheus at {where}: {exc}")

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.http.close()

    async def query(self, expr: str, at: float) -> list[Series]:
        """Instant query evaluated at ``at``."""
        return await self.get("query", {"query": expr, "time": f"{at:.3f}"})

    async def query_range(
        self, expr: str, start: float, end: float, step: float, budget: int = MAX_ANSWER_POINTS
    ) -> list[Series]:
        """Range query over [start, end] every ``step`` seconds (at most ``budget`` points)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return await self.get("query_range", params, budget)


# --- labels -> hosts and GPUs -------------------------------------------------------------------


def host_of(labels: Mapping[str, str]) -> str:
    """The host a DCGM series is about: ``Hostname``/``hostname``, else the scrape address."""
    name = labels.get("Hostname") or labels.get("hostname")
    if not name:
        instance = labels.get("instance", "")
        name = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
    return clean_text(name.strip("[]"), 128)


def gpu_of(labels: Mapping[str, str]) -> tuple[str, int] | None:
    """(host, GPU index) of a DCGM series, or None when it names no GPU.

    Only ASCII digits make an index (``str.isdigit`` also takes Arabic-Indic and superscript
    digits, which ``int`` reads as numbers), at most the protocol's GPU index cap.
    """
    text = labels.get("gpu", "")
    usable = text.isascii() and text.isdigit() and len(text) <= 4
    index = bounded_int(int(text), 0, MAX_GPU_INDEX) if usable else None
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


class GpuKeys:
    """``gpu_of`` with a bounded memo. A round asks ~12 metrics, and each answer has a series
    per GPU with the same labels: at 16384 GPUs the keys were ~40 % of the regrouping. The
    key depends on four labels only (``gpu``, ``Hostname``, ``hostname``, ``instance``)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._memo: dict[tuple[str | None, ...], tuple[str, int] | None] = {}

    def __call__(self, labels: Mapping[str, str]) -> tuple[str, int] | None:
        get = labels.get
        ident = (get("gpu"), get("Hostname"), get("hostname"), get("instance"))
        memo = self._memo
        if ident in memo:
            return memo[ident]
        key = gpu_of(labels)
        if len(memo) >= self.capacity:
            memo.clear()
        memo[ident] = key
        return key


def gpu_facts(
    series: Iterable[Series], key_of: Callable[[Mapping[str, str]], Any] = gpu_of
) -> dict[tuple[str, int], GpuFacts]:
    """GPU key -> facts, from the info query (first series of a GPU wins)."""
    out: dict[tuple[str, int], GpuFacts] = {}
    for s in series:
        key = key_of(s.labels)
        if key is None:
            continue
        facts = out.setdefault(key, GpuFacts())
        facts.uuid = facts.uuid or s.labels.get("UUID") or s.labels.get("uuid", "")
        facts.model = facts.model or s.labels.get("modelName", "")
        facts.driver = facts.driver or s.labels.get("DCGM_FI_DRIVER_VERSION", "")
        facts.workload = facts.workload or workload_of(s.labels)
    return out


Values = dict[str, dict[Any, float | None]]  # metric field -> series key -> value


def gpu_values(
    answers: Mapping[str, list[Series]], key_of: Callable[[Mapping[str, str]], Any] = gpu_of
) -> Values:
    """Per field, per GPU key: the value of an instant answer (scaled)."""
    out: Values = {}
    for name, series in answers.items():
        scale = METRIC_SCALE[name]
        col: dict[Any, float | None] = {}
        for s in series:
            key = key_of(s.labels)
            if key is None or key in col or not s.values:
                continue
            v = s.last()
            col[key] = None if v is None else v * scale
        out[name] = col
    return out


METRIC_SCALE = {m.field: m.scale for m in GPU_METRICS}


def gpu_sample(host: str, index: int, t: float, values: Values) -> GpuSample:
    """The GpuSample of one GPU from the per-field values of one instant."""

    def get(name: str) -> float | None:
        return values.get(name, {}).get((host, index))

    # The protocol's ranges, as for an agent's sample: util 0-100 %, temperature -100..300 C...
    fields = {name: in_range(name, get(name)) for name in SAMPLE_FIELDS}
    if fields["util_gpu"] is None:
        # MIG GPUs have no GPU_UTIL; GR_ENGINE_ACTIVE is the same "any engine busy" measure.
        fields["util_gpu"] = get("gr_engine")
    used, free, reserved = fields["mem_used_mib"], get("mem_free"), get("mem_reserved")
    total = None if used is None or free is None else used + free + (reserved or 0.0)
    total = in_range("mem_total_mib", total)
    return GpuSample(host=host, t=t, index=index, mem_total_mib=total, **fields)


# --- the source ---------------------------------------------------------------------------------


Asked = tuple[dict[str, list[Series]], list[str]]  # answers by name, errors
Pending = asyncio.Future[Asked] | None  # node_exporter's queries in flight


async def _emit_in_slices(emit: Emit, records: list[Record]) -> None:
    """Emit ``records`` in order, ``EMIT_SLICE`` per turn of the event loop: a round of
    16384 GPUs ingested at once held every frame for its whole ingest."""
    for start in range(0, len(records), EMIT_SLICE):
        for record in records[start : start + EMIT_SLICE]:
            emit(record)
        await asyncio.sleep(0)


async def _dropped(future: asyncio.Future[Any] | None) -> None:
    """Cancel queries no longer wanted and wait for them to end (nothing left running)."""
    if future is not None:
        future.cancel()
        await asyncio.gather(future, return_exceptions=True)


@dataclass
class _Known:
    """What the source has told the store, so it only repeats what changed."""

    hellos: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    node_hosts: set[str] = field(default_factory=set)  # hosts with node_exporter values
    xids: dict[tuple[str, int], float] = field(default_factory=dict)
    status: tuple[str, str] | None = None
    gone: set[str] = field(default_factory=set)


class PrometheusSource:
    """Polls Prometheus for DCGM and rollout-server series and emits verl-top records."""

    def __init__(self, settings: PromSettings) -> None:
        self.settings = settings
        self.client = PromClient(
            settings.url, settings.request_timeout, settings.http, settings.parallel
        )
        self.name = f"prometheus:{self.client.shown}"
        self.rounds = 0
        self.queries_last = 0
        self._known = _Known()
        self._gpu_keys = GpuKeys()
        self._last_info: dict[str, list[Series]] = {}  # the DCGM identities, for the join
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
        self.node_plan = (
            NodePlan(settings.node_selector, settings.interval) if settings.node else None
        )

    @property
    def node_exprs(self) -> dict[str, str]:
        """node_exporter's queries by HostSample field ({} without them)."""
        return self.node_plan.queries if self.node_plan is not None else {}

    # asking

    async def _ask(
        self, expr: str, at: float, span: tuple[float, float] | None, budget: int
    ) -> list[Series]:
        async with self._sem:
            if span is None:
                return await self.client.query(expr, at)
            return await self.client.query_range(expr, span[0], at, span[1], budget)

    async def _ask_all(
        self,
        exprs: Mapping[str, str],
        at: float,
        span: tuple[float, float] | None = None,
        budget: int = MAX_ANSWER_POINTS,
    ) -> tuple[dict[str, list[Series]], list[str]]:
        """Every expression at once; answers by name, and the errors of those that failed.

        The first "unreachable" failure cancels the other requests and is raised: when
        Prometheus does not answer one request, waiting for the other 30 only delays saying so.
        """
        tasks = {
            asyncio.ensure_future(self._ask(e, at, span, budget)): name for name, e in exprs.items()
        }
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
        try:
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
        finally:
            await self.client.close()

    async def poll(self, emit: Emit) -> None:
        """One round: every metric once, at one evaluation time, within the round's budget.

        node_exporter's queries go after the GPU queries and can never cost them: the round
        stands on the GPU answers; host values that miss the budget are skipped this round."""
        self.rounds += 1
        before = self.client.requests
        started = time.monotonic()
        deadline = started + self.settings.budget
        at = time.time()
        node: Pending = None
        try:
            # A round's answers (a series per GPU and metric) are decoded and regrouped into
            # records held until they are emitted: at 16384 GPUs the allocations triggered a
            # full collection every ~0.3 s, each walking them and the store (40-240 ms).
            with cyclic_gc_paused():
                async with time_limit(self.settings.budget):
                    records, errors, node = await self._round(at)
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
        await _emit_in_slices(emit, records)  # the GPUs now, whatever node_exporter's do
        host_answers, host_note = await self._node_answers(node, deadline - time.monotonic())
        self.queries_last = self.client.requests - before
        if host_answers is not None:  # after the hellos: the hosts exist
            for record in self._host_records({**self._last_info, **host_answers}, at):
                emit(record)
        # A query Prometheus refused (an old version without a function, say) leaves its
        # metric without data; the rest of the round stands.
        reasons = [f"{len(errors)} queries failed, e.g. {errors[0]}"] if errors else []
        reasons += [host_note] if host_note else []
        if not any(isinstance(r, GpuSample) for r in records):
            where = f"{{{self.settings.selector}}}" if self.settings.selector else "at all"
            reasons = [
                f"no DCGM GPU series match {where} (is dcgm-exporter scraped by this "
                "Prometheus, and is --prom-selector right?)"
            ]
        self._status(emit, "up", "; ".join(reasons), time.monotonic() - started)

    async def _round(self, at: float) -> tuple[list[Record], list[str], Pending]:
        """The GPU and rollout answers as records, their errors, and the node_exporter
        queries still in flight."""
        exprs = {"_info": self.info_expr, **self.gpu_exprs}
        if self.rollout_exprs:
            exprs.update({"_rinfo": self.rollout_info, **self.rollout_exprs})
        plan = self.node_plan
        node_exprs = plan.due(time.monotonic()) if plan is not None else None
        node_job = None if not node_exprs else (lambda: self._ask_all(node_exprs, at))
        answers, errors, node = await self._ask_gpus_first(exprs, at, node_job)
        self._last_info = {"_info": answers["_info"]}
        records = await self._gpu_records(answers, at)
        records += rollout_records(answers, at)
        return records, errors, node

    async def _ask_gpus_first(
        self,
        exprs: Mapping[str, str],
        at: float,
        node_job: Callable[[], Awaitable[Asked]] | None,
        span: tuple[float, float] | None = None,
        budget: int = MAX_ANSWER_POINTS,
    ) -> tuple[dict[str, list[Series]], list[str], Pending]:
        """``exprs`` answered (PromError without the DCGM identities), and ``node_job``
        (node_exporter's queries) started after them, so its requests queue behind the GPU
        ones; it is returned still in flight (None when there is none)."""
        gpu = asyncio.ensure_future(self._ask_all(exprs, at, span, budget))
        node: Pending = None
        try:
            await asyncio.sleep(0)  # the GPU requests take the connections first
            if node_job is not None:
                node = asyncio.ensure_future(node_job())
            answers, errors = await gpu
            if "_info" not in answers:
                raise PromError(errors[0] if errors else "no answer")
        except BaseException:
            await _dropped(gpu)
            await _dropped(node)
            raise
        return answers, errors, node

    async def _node_answers(
        self, node: Pending, remaining: float
    ) -> tuple[dict[str, list[Series]] | None, str]:
        """node_exporter's answers within ``remaining`` seconds (None: none this time) and
        what went wrong ('' when nothing did)."""
        if node is None:
            return None, ""
        try:
            async with time_limit(max(0.0, remaining)):
                answers, errors = await node
        except (asyncio.TimeoutError, PromError) as exc:
            await _dropped(node)
            why = str(exc) or "they did not answer within the round's budget"
            return None, f"host values (node_exporter) skipped this round: {why}"
        if self.node_plan is not None:
            self.node_plan.learn(answers, time.monotonic())
        note = f"{len(errors)} node_exporter queries failed, e.g. {errors[0]}" if errors else ""
        return answers, note

    def _host_records(self, answers: Mapping[str, list[Series]], at: float) -> list[Record]:
        """node_exporter's values as HostSamples of the DCGM hosts they join; a host whose
        node series went away gets one empty sample (no data, not its last values)."""
        if not self.node_exprs:
            return []
        join = node_join(answers)
        columns = instance_values({k: answers.get(k, []) for k in self.node_exprs})
        out: list[Record] = list(host_samples(columns, join, at))
        joined = set(join.values())
        out += [host_sample(h, at, {}) for h in sorted(self._known.node_hosts - joined)]
        self._known.node_hosts = joined
        return out

    async def _gpu_records(self, answers: Mapping[str, list[Series]], at: float) -> list[Record]:
        """The round's GPU records. The regrouping (~0.8 s of CPU at 16384 GPUs) is done a
        metric and ``EMIT_SLICE`` GPUs per turn of the event loop: in one piece it held every
        frame and key press that long. It reads only the answers; what the source remembers
        (``_hellos``) changes at the end, so a round given up at its deadline leaves nothing
        half-told."""
        keys = self._gpu_keys
        facts = gpu_facts(answers["_info"], keys)
        values: Values = {}
        for name, series in answers.items():
            if name in self.gpu_exprs:
                values.update(gpu_values({name: series}, keys))
                await asyncio.sleep(0)
        order = sorted(facts)
        samples: dict[tuple[str, int], GpuSample] = {}
        for start in range(0, len(order), EMIT_SLICE):
            for h, i in order[start : start + EMIT_SLICE]:
                samples[(h, i)] = gpu_sample(h, i, at, values)
            await asyncio.sleep(0)
        out: list[Record] = self._hellos(facts, values, at, samples)
        out += samples.values()
        out += self._xid_events(values.get("xid", {}), at)
        return out

    def _hellos(
        self,
        facts: Mapping[tuple[str, int], GpuFacts],
        values: Values,
        at: float,
        samples: Mapping[tuple[str, int], GpuSample] | None = None,
    ) -> list[Record]:
        """A Hello per host whose GPUs changed; hosts that vanished go stale once.
        ``samples``: the round's GPU samples when already made (not made twice per GPU)."""
        by_host: dict[str, list[GpuInfo]] = {}
        drivers: dict[str, str] = {}
        for (host, index), f in sorted(facts.items()):
            made = None if samples is None else samples.get((host, index))
            sample = made if made is not None else gpu_sample(host, index, at, values)
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
        """Range queries over the history window so the panes are full on the first frame.

        Bounded in time and memory: the info query says how many GPUs there are, so the range
        asks for at most ``HISTORY_SAMPLES`` samples in all (fewer points per GPU on a huge
        cluster: the window the store keeps is 600 points anyway); every answer is cut at that
        many points; the regrouping into records runs within what is left of
        ``history_budget`` and stops there (said with the number of samples it made).
        """
        s = self.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.history_budget
        step = s.interval
        end = time.time()
        try:
            async with time_limit(s.history_budget):
                info = await self.client.query(self.info_expr, end)
            gpus = max(1, len(gpu_facts(info)))
            points = int(min(s.history_s, step * 10_000) // step) + 1  # Prometheus: 11 000
            points = max(1, min(points, HISTORY_SAMPLES // gpus))
            grid = HistoryGrid(end - (points - 1) * step, step, points)
            exprs = {"_info": self.info_expr, **self.gpu_exprs}
            exprs.update(self.rollout_exprs)
            span, budget = (grid.start, step), 2 * HISTORY_SAMPLES
            node_job = None
            if self.node_plan is not None:
                node_job = lambda: self._history_nodes(end, span, budget)  # noqa: E731
            async with time_limit(max(0.0, deadline - loop.time())):
                answers, _, node = await self._ask_gpus_first(exprs, end, node_job, span, budget)
        except (asyncio.TimeoutError, PromError) as exc:
            reason = str(exc) or f"no answer within {s.history_budget:g} s"
            self._status(emit, "slow", f"no history at start-up: {reason}", None)
            return
        # Host history only if it comes soon: it may wait half of what is left of the budget,
        # the other half is the regrouping's (the GPUs' history never waits for the hosts').
        host_answers, _ = await self._node_answers(node, (deadline - loop.time()) / 2)
        answers.update(host_answers or {})
        until = time.monotonic() + max(0.0, deadline - loop.time())
        history = await asyncio.to_thread(history_records, self, answers, grid, until)
        if history.late:
            self._status(
                emit,
                "slow",
                f"start-up history cut at {s.history_budget:g} s: {history.samples} samples "
                f"of {len(history.records)} records kept",
                None,
            )
        for i, record in enumerate(history.records):
            emit(record)
            if i % EMIT_CHUNK == EMIT_CHUNK - 1:
                await asyncio.sleep(0)  # 60k samples at 1024 GPUs: let the screen draw

    async def _history_nodes(self, at: float, span: tuple[float, float], budget: int) -> Asked:
        """node_exporter's range queries for the start-up history, their rate window set by
        the scrape interval, asked first (one small instant query)."""
        plan = self.node_plan
        assert plan is not None
        series = await self.client.query(scrape_query(plan.selector), at)
        plan.learn({"_nscrape": series}, time.monotonic())
        return await self._ask_all({"_ninfo": plan.info, **plan.queries}, at, span, budget)


@dataclass(frozen=True)
class HistoryGrid:
    """The timestamps of a range query: ``start + k * step`` for k in [0, points)."""

    start: float
    step: float
    points: int

    def index(self, t: float) -> int | None:
        """k of ``t`` when it is one of the grid's timestamps (to a millisecond), else None."""
        k = round((t - self.start) / self.step)
        if 0 <= k < self.points and abs(t - (self.start + k * self.step)) < 2e-3:
            return k
        return None

    def time(self, k: int) -> float:
        """The timestamp of point ``k``."""
        return self.start + k * self.step


@dataclass
class History:
    """The start-up history as records, and whether the time budget cut it."""

    records: list[Record]
    samples: int = 0
    late: bool = False


def _dense(series: Iterable[Series], key_of: Any, grid: HistoryGrid) -> dict[Any, array]:
    """Per series key (first series wins), its values on the grid (NaN where absent).

    A range answer's timestamps are the grid's; one that is not (a hostile or confused
    server sending 80 000 distinct timestamps) is dropped, so the regrouping's cost and memory
    are set by the grid, not by the answer.
    """
    out: dict[Any, array] = {}
    for s in series:
        key = key_of(s.labels)
        if key is None or key in out:
            continue
        row = array("d", [NAN]) * grid.points
        for t, v in zip(s.times, s.values, strict=True):
            k = grid.index(t)
            if k is not None:
                row[k] = v
        out[key] = row
    return out


def _instance(labels: Mapping[str, str]) -> str | None:
    return clean_text(labels.get("instance", ""), 128) or None


def node_join(answers: Mapping[str, list[Series]]) -> dict[str, str]:
    """node_exporter instance -> DCGM host, from the node info and DCGM info answers."""
    gpu_hosts = []
    for s in answers.get("_info", []):
        key = gpu_of(s.labels)
        if key is not None:
            gpu_hosts.append((key[0], s.labels.get("instance", "")))
    return join_hosts((s.labels for s in answers.get("_ninfo", [])), gpu_hosts)


def history_records(
    source: PrometheusSource,
    answers: Mapping[str, list[Series]],
    grid: HistoryGrid,
    until: float = math.inf,
) -> History:
    """Records for every point of the grid, oldest first (hellos come first); stops at the
    monotonic time ``until`` (what was made so far is kept)."""
    facts_all = gpu_facts(answers["_info"])
    present = _dense(answers["_info"], gpu_of, grid)
    gpu_cols = {name: _dense(answers.get(name, []), gpu_of, grid) for name in source.gpu_exprs}
    join = node_join(answers) if source.node_exprs else {}
    node_cols = {
        name: _dense(answers.get(name, []), series_key, grid) for name in source.node_exprs
    }
    queries = rollout_queries("")
    roll_cols = {name: _dense(answers.get(name, []), _instance, grid) for name in queries}
    servers: dict[str, tuple[str, str]] = {}
    for name in queries:
        for s in answers.get(name, []):
            inst = _instance(s.labels)
            if inst:
                servers.setdefault(inst, (s.labels.get("server", ""), ""))
    out = History([])
    for k in range(grid.points):
        if time.monotonic() > until:
            out.late = True
            break
        t = grid.time(k)
        values: Values = {
            name: {key: _scaled(row[k], METRIC_SCALE[name]) for key, row in col.items()}
            for name, col in gpu_cols.items()
        }
        here = sorted(key for key, row in present.items() if row[k] == row[k])
        if here and not out.samples:
            out.records += source._hellos(facts_all, values, t)  # noqa: SLF001 - its own parts
        out.records += [gpu_sample(h, i, t, values) for h, i in here]
        out.samples += len(here)
        # Host samples only for hosts whose GPUs are there (their hello came first).
        shown = {h for h, _ in here}
        nodes = cpu_columns(
            {
                name: {key: _scaled(row[k], 1.0) for key, row in col.items()}
                for name, col in node_cols.items()
            }
        )
        here_join = {i: h for i, h in join.items() if h in shown}
        out.records += host_samples(nodes, here_join, t, sparse=True)
        cols = {
            name: {inst: _scaled(row[k], queries[name][1]) for inst, row in col.items()}
            for name, col in roll_cols.items()
        }
        out.records += _rollout_samples(cols, servers, t, sparse=True)
    return out


def _scaled(value: float, scale: float) -> float | None:
    return None if value != value else value * scale


def rollout_records(answers: Mapping[str, list[Series]], at: float) -> list[Record]:
    """A RolloutSample per rollout server seen in any rollout answer."""
    queries = rollout_queries("")
    cols: dict[str, dict[str, float | None]] = {}
    servers: dict[str, tuple[str, str]] = {}
    for name in queries:
        col: dict[str, float | None] = {}
        for s in answers.get(name, []):
            inst = _instance(s.labels)
            if not inst or inst in col or not s.values:
                continue
            v = s.last()
            col[inst] = None if v is None else v * queries[name][1]
            servers.setdefault(inst, (s.labels.get("server", ""), ""))
        cols[name] = col
    for s in answers.get("_rinfo", []):
        inst = _instance(s.labels)
        if inst:
            servers[inst] = (s.labels.get("server", ""), s.labels.get("model_name", ""))
    return _rollout_samples(cols, servers, at)


def _rollout_samples(
    cols: Mapping[str, Mapping[str, float | None]],
    servers: Mapping[str, tuple[str, str]],
    at: float,
    sparse: bool = False,
) -> list[Record]:
    """A RolloutSample per server; ``sparse``: only servers with a value at ``at`` (history)."""
    out: list[Record] = []
    for inst, (server, model) in sorted(servers.items()):
        fields = {name: in_range(name, col.get(inst)) for name, col in cols.items()}
        if sparse and all(v is None for v in fields.values()):
            continue
        out.append(RolloutSample(host=inst, t=at, server=server, model=model, **fields))
    return out


def build_sources(settings: PromSettings) -> list[Source]:
    """The registry's entry point: one source for one Prometheus."""
    return [PrometheusSource(settings)]
