"""SVG snapshots of the app on fixed data (real H200 trace, fake verdict): pane 1, pane 3, findings.

Plain ``def`` tests: ``snap_compare`` runs its own event loop. Re-baseline with
``pytest tests/test_ui_snapshots.py --snapshot-update`` after a deliberate UI change (or a
Textual upgrade) and look at the SVGs before committing them.
"""

from __future__ import annotations

from test_ui_app import dataflow_bottleneck, make_app
from ui_data import build_store

SIZE = (160, 48)


def test_pane1_snapshot(snap_compare) -> None:
    app = make_app(
        build_store(down={"node03": "connection refused"}, steps=True),
        verdict=dataflow_bottleneck(),
        mode="REPLAY",
    )
    assert snap_compare(app, terminal_size=SIZE)


def test_pane3_snapshot(snap_compare) -> None:
    app = make_app(build_store(steps=True, config=True), verdict=dataflow_bottleneck())
    assert snap_compare(app, press=["3"], terminal_size=SIZE)


def test_findings_screen_snapshot(snap_compare) -> None:
    app = make_app(build_store(), verdict=dataflow_bottleneck())
    assert snap_compare(app, press=["d"], terminal_size=SIZE)
