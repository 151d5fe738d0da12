"""report.md layout (issue 18.6): the real data window, no epoch dates, a host table, and the
shared status vocabulary (verl_top/status.py) in its first lines."""

from __future__ import annotations

import re

from verl_top.export import snapshot as snap
from verl_top.export.report import build_report
from verl_top.model import GpuSample, HostSample, HostState
from verl_top.store import Store, StoreLimits


def ten_seconds() -> Store:
    """Ten seconds of one GPU and one host sample a second (a `diagnose --duration 10`)."""
    store = Store(StoreLimits(window_s=300.0, points=600))
    t0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    store.ingest(HostState(host="n1", t=t0, state="up"))
    for k in range(11):
        store.ingest(GpuSample(host="n1", t=t0 + k, index=0, util_gpu=80.0), received=t0 + k)
        store.ingest(
            HostSample(
                host="n1", t=t0 + k, cpu_pct=5.0, agent_cpu_pct=0.4, agent_rss_bytes=31 << 20
            ),
            received=t0 + k,
        )
    store.ingest(HostState(host="n2", t=t0, state="down", reason="connection refused"))
    return store


def test_report_says_the_real_data_window_and_has_a_host_table() -> None:
    store = ten_seconds()
    text = build_report(store, None, snap.build_snapshot(store, None, now=0.0))
    assert "data 10 s (2026-01-01 00:00:00 UTC → 2026-01-01 00:00:10 UTC)" in text
    assert "window 300" not in text.splitlines()[2]
    assert "| host | state | GPUs | agent CPU | agent RSS | malformed |" in text
    assert "| n1 | up | 1 | 0.4 % | 31 MiB |" in text
    assert "| n2 | down (connection refused) | 0 | - | - |" in text
    assert "**Status:** reading:" in text  # data, no verdict: not "healthy"


def test_empty_report_has_no_epoch_dates_and_says_no_data() -> None:
    store = Store()
    text = build_report(store, None, snap.build_snapshot(store, None, now=0.0))
    assert "1969" not in text and "1970" not in text
    assert text.splitlines()[0] == "# verl-top snapshot — no data"
    assert "**Status:** no data: waiting for the first samples" in text


def test_foreign_text_shows_literally_in_report_md() -> None:
    """Issue 31: host names, GPU models and config keys were pasted into report.md as they came,
    so a GPU model could be a link or HTML, and a config key with a backtick broke out of its
    code span."""
    from verl_top.model import GpuInfo, Hello, VerlConfig

    store = ten_seconds()
    model = "H200 [pwn](http://evil.example) <img src=x onerror=alert(1)> *bold*"
    store.ingest(
        Hello(host="n1", t=1_767_225_600.0, gpus=[GpuInfo(index=0, name=model)]),
        received=1_767_225_600.0,
    )
    store.ingest(
        VerlConfig(host="n1", t=1_767_225_600.0, values={"data.a`b|c": "_x_ [y](z)"}),
        received=1_767_225_600.0,
    )
    text = build_report(store, None, snap.build_snapshot(store, None, now=0.0))
    assert "[pwn](http" not in text and "*bold*" not in text
    assert re.search(r"(?<!\\)<img", text) is None  # only the escaped form
    assert r"\[pwn\](http://evil.example) \<img src=x onerror=alert(1)\> \*bold\*" in text
    assert "| ``data.a`b\\|c`` | \\_x\\_ \\[y\\](z) |" in text  # a longer fence, pipe escaped
