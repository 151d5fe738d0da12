"""Engine behaviour: a stateless ranking, thresholds table, text report, no-data honesty.
(Hysteresis lives in the monitor: tests/test_monitor.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.diagnosis.engine import Engine, steps_summary
from verl_top.diagnosis.findings import STEP_NAMES
from verl_top.diagnosis.report import format_text, to_json
from verl_top.diagnosis.thresholds import THRESHOLD_DOCS, Thresholds
from verl_top.diagnosis.view import step_view
from verl_top.monitor import assess_store
from verl_top.protocol import read_recording
from verl_top.store import Store

SCEN = Path(__file__).resolve().parent / "scenarios"


def _store(name: str) -> Store:
    s = Store()
    for r in read_recording(SCEN / name / "recording.ndjson"):
        s.ingest(r)
    return s


def test_empty_store_is_all_no_data() -> None:
    v = Engine().evaluate(Store())
    assert v.bottleneck_step is None and not v.findings
    assert all(c.status == "no_data" and c.detail for c in v.checks)
    assert len(v.checks) == 35  # 30 + two rollout-server rules + two async-trainer rules + job.hang


def test_engine_is_stateless_the_same_store_gives_the_same_verdict() -> None:
    idle, watchdog = _store("gpu_idle"), _store("nccl_watchdog")
    eng = Engine()
    first = eng.evaluate(idle)
    assert eng.evaluate(watchdog).bottleneck_rule == "nccl.watchdog"  # no memory of `idle`
    again = eng.evaluate(idle)
    assert (again.bottleneck_step, again.bottleneck_rule) == (
        first.bottleneck_step,
        first.bottleneck_rule,
    )
    assert again.history == []  # the lead history is the monitor's


def test_first_evaluation_has_no_lag_and_healthy_needs_no_finding_over_floor() -> None:
    v = Engine(Thresholds(floor=0.99)).evaluate(_store("gpu_idle"))
    assert v.bottleneck_step is None and v.findings  # findings listed, none above the floor
    assert v.headline.startswith("Job looks healthy:")


def test_thresholds_from_mapping() -> None:
    assert Thresholds.from_mapping({"idle_pct": 40}).idle_pct == 40.0
    with pytest.raises(ValueError, match="idle_pc"):
        Thresholds.from_mapping({"idle_pc": 40})
    with pytest.raises(ValueError, match="floor"):
        Thresholds.from_mapping({"floor": "high"})
    assert set(THRESHOLD_DOCS) == set(Thresholds.__dataclass_fields__)
    assert all(unit and why for _, unit, why in THRESHOLD_DOCS.values())


def test_lower_idle_threshold_clears_finding() -> None:
    s = _store("map_imbalance")
    assert any(f.rule == "gpu.idle" for f in Engine().evaluate(s).findings)
    assert not any(
        f.rule == "gpu.idle" for f in Engine(Thresholds(idle_pct=10)).evaluate(s).findings
    )


def test_old_and_new_timing_keys() -> None:
    new = step_view(
        3, 100.0, {"timing_s/gen": 60.0, "timing_s/update_actor": 30.0, "timing_s/step": 100.0}
    )
    old = step_view(3, 100.0, {"timing/gen": 60.0, "timing/update_actor": 30.0})
    assert new.share("gen") == pytest.approx(0.6)
    assert old.step_time_core == 90.0 and old.step_time_source == "sum of stage timings"
    # verl <= 0.5: `step` includes testing/save_checkpoint; the core time excludes them
    v05 = step_view(5, 0.0, {"timing_s/gen": 50.0, "timing_s/testing": 40.0, "timing_s/step": 95.0})
    assert v05.is_outlier and v05.step_time_core == 55.0


def test_text_report_lists_five_steps_verdict_first() -> None:
    a = assess_store(_store("flow_long_tail"))
    v = a.verdict
    assert v is not None
    text = format_text(a)
    assert text.splitlines()[0] == a.status.text
    pos = [text.index(f"{n}. {name}") for n, name in STEP_NAMES.items()]
    assert pos == sorted(pos)
    assert "flow.long_tail" in text and "over_sample_rate" in text and "no data:" in text
    assert steps_summary(v)[3][1] >= 1
    assert to_json(a)["bottleneck"]["rule"] == "flow.long_tail"


def test_host_stall_needs_gpu_samples_not_only_host_ones() -> None:
    """A node whose CPU is sampled but that has no GPU samples (no GPU, or NVML down) cannot
    show a host stalling its GPUs: "no data", never "passed"."""
    from verl_top.model import HostSample

    s = Store()
    for i in range(30):
        s.ingest(HostSample(host="cpu-only", t=1000.0 + i, cpu_pct=99.0, iowait_pct=0.0))
    check = next(c for c in Engine().evaluate(s).checks if c.rule == "flow.host_stall")
    assert check.status == "no_data" and "GPU samples" in check.detail
