"""Scenario tests: recordings built from the real fixtures must yield the expected bottleneck.

Each scenario (tests/scenarios/<name>/, made by tests/scenarios/build.py) is checked through
the Engine on an ingested Store here, and through every surface (the app paced, ``diagnose``,
``snapshot``, ``export-metrics``) in tests/test_verdict_agreement.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_top.diagnosis.engine import STEP_RULES, Engine
from verl_top.diagnosis.report import to_json
from verl_top.monitor import assess_store
from verl_top.protocol import read_recording
from verl_top.store import Store

ROOT = Path(__file__).resolve().parents[1]
SCEN = ROOT / "tests" / "scenarios"
NAMES = sorted(d.name for d in SCEN.iterdir() if (d / "expected.json").exists())


def load(name: str) -> tuple[Store, dict]:
    """The scenario's store (plus topology when given) and its expectation."""
    store = Store()
    for rec in read_recording(SCEN / name / "recording.ndjson"):
        store.ingest(rec)
    topo = SCEN / name / "topology.json"
    if topo.exists():
        raw = json.loads(topo.read_text())
        store.topology = {  # type: ignore[attr-defined]
            h: {tuple(int(x) for x in k.split(",")): v for k, v in m.items()}
            for h, m in raw.items()
        }
    return store, json.loads((SCEN / name / "expected.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_scenario_engine(name: str) -> None:
    store, exp = load(name)
    version = store.version
    verdict = Engine().evaluate(store)
    assert store.version == version, "the engine must not mutate the store"
    assert (verdict.bottleneck_step, verdict.bottleneck_rule) == (exp["step"], exp["rule"]), (
        verdict.headline
    )
    if exp["rule"] is None:
        assert verdict.headline.startswith("Job looks healthy:")
        assert not [f for f in verdict.findings if f.severity >= 0.3]
    else:
        top = verdict.findings[0]
        assert top.rule == exp["rule"] and top.evidence and top.advice
        assert str(exp["step"]) in verdict.headline


def test_every_rule_has_a_scenario() -> None:
    rules = {f.__name__ for rules in STEP_RULES.values() for f in rules}
    assert len(rules) == 35  # 33 + flow.async_balance and sync.weight_push (issue 28)
    expected = {json.loads((SCEN / n / "expected.json").read_text())["rule"] for n in NAMES}
    produced = set()
    for name in NAMES:
        store, _ = load(name)
        produced |= {c.rule for c in Engine().evaluate(store).checks}
    # The async trainer rules run everywhere but lead only in async modes: their cases are the
    # constructed v0.9.0 logs of tests/test_diagnosis_async.py.
    assert expected - {None} == produced - {"async.balance", "async.weight_sync"}
    assert None in expected  # and a healthy run


def test_build_is_deterministic(tmp_path: Path) -> None:
    """Rebuilding gives byte-identical recordings (the committed output is current)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scen_build", SCEN / "build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OUT = tmp_path
    mod.main()
    for name in NAMES:
        assert (tmp_path / name / "recording.ndjson").read_bytes() == (
            SCEN / name / "recording.ndjson"
        ).read_bytes(), name


def test_json_matches_engine() -> None:
    store, _ = load("flow_long_tail")
    doc = to_json(assess_store(store))
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4, 5]
    assert doc["steps"][2]["worst_severity"] == doc["findings"][0]["severity"]
    json.dumps(doc, allow_nan=False)
