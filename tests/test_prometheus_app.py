"""``verl-top --prometheus URL`` (Pilot) on the real test Prometheus: the real GPUs of the DCGM
fixtures (H100 node ip-10-0-171-111.ec2.internal, A800 MIG node msxf-hpc-64-35-ai, 8 GPUs
each) in every pane, history from range queries on the first frames, and the real vLLM server
in pane 3 (opt-125m, TTFT p50 375 ms from its cumulative buckets) next to the steps of a verl
log given with --verl-log (the mixed-sources setup of docs/prometheus.md)."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

import pytest

from verl_top.cli import app_parser
from verl_top.inputs import build_inputs
from verl_top.ui.app import VerlTopApp

H100, A800 = "ip-10-0-171-11", "msxf-hpc-64-35"  # as the host columns cut them
VERL_LOG = Path(__file__).parent / "fixtures" / "verl" / "verl_console_sample.log"


def screen_text(app: VerlTopApp) -> str:
    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r"<text[^>]*>(.*?)</text>", svg))).replace("\xa0", " ")


async def wait_for(pred, timeout: float = 15.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


@pytest.mark.timeout(90)
async def test_prometheus_gpus_fill_every_pane(prom_cluster: dict) -> None:
    server = prom_cluster["server"]
    server.wait_for(f'count_over_time(DCGM_FI_DEV_GPU_TEMP{{Hostname="{A800}-ai"}}[20s]) >= 6', 8)
    args = app_parser().parse_args(
        [
            "--prometheus", server.url, "--prom-selector", 'job="dcgm"',
            "--prom-rollout-selector", 'job="vllm"', "--prom-interval", "1", "--refresh", "0.5",
            "--verl-log", str(VERL_LOG),  # mixing sources: GPUs from Prometheus, steps from the log
        ]
    )  # fmt: skip
    inputs = build_inputs(args)
    store = inputs.store
    app = VerlTopApp(inputs, refresh=0.5)
    async with app.run_test(size=(200, 70)) as pilot:
        assert await wait_for(
            lambda: store.gpu_count() == 16 and len(store.rollout) == 1 and len(store.steps) == 3
        )
        # The start-up range queries filled the plots before the first live round landed.
        assert min(len(g.history) for g in store.iter_gpus()) >= 4
        screens = {}
        for key in "12345":
            await pilot.press(key)
            await pilot.pause()
            app.refresh_now()
            await asyncio.sleep(0.3)
            screens[key] = screen_text(app)
    # Header: the two DCGM hosts only (the followed log's machine is not a host row).
    assert all("hosts 2 up · 0 down  GPUs 16" in s for s in screens.values())
    one = screens["1"]
    assert len(re.findall(rf"{H100}\S*\s+\d\s+IDLE", one)) == 8  # every real GPU has a row
    assert len(re.findall(rf"{A800}\S*\s+\d\s+IDLE", one)) >= 7  # (the 200x70 screen cuts one)
    assert re.search(rf"{H100}\S*\s+0\s+IDLE.*?114\s+30", one)  # GPU 0: 113.611 W, 30 C
    two = screens["2"]
    assert len(re.findall(rf"{A800}-ai\s+\d", two)) >= 8  # GPU links rows (PCIe from DCGM)
    three = screens["3"]
    assert "Stage times of the last 3 steps" in three  # verl's timings ...
    assert "facebook/opt-125m" in three and "375/475" in three  # ... next to the vLLM server
    four = screens["4"]
    assert "GPUs seen: 16 on 2 nodes" in four and H100 in four and A800 in four
    # Its process table says why it is empty in Prometheus' terms, not "not seen yet".
    assert "no process of the job seen yet" not in four
    # Pane 5: the trainer's reserved memory (log) against the largest real GPU (Prometheus):
    # A800 FB_USED 2 + FB_FREE 81226 MiB = 79.3 GiB (the H100 excerpt has no FB series).
    assert "GiB of 79.3 GiB (NVIDIA A800-SXM4-80GB)" in screens["5"]
