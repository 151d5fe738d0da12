"""Print the ``topo`` record the agent sends on this machine, and what pane 4 makes of it.

Run on a GPU node (the "device" helper runs it on the H200):

    python benchmarks/topology_capture.py [--backend auto|pynvml|nvidia-smi] [--out DIR]

Prints the agent's hello and topo wire lines, the GPU link matrix and marks the client derives,
the time collecting took, and `nvidia-smi topo -m` for comparison. With ``--out DIR`` it also
writes ``topo_record.ndjson`` (hello + topo lines, a fixture the tests can replay),
``smi_topo.txt`` and ``pane4.txt`` (pane 4's topology block as plain text).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl_top.agent.main import Agent, parse_args  # noqa: E402
from verl_top.agent.wire import encode_line  # noqa: E402
from verl_top.protocol import from_dict  # noqa: E402
from verl_top.store import Store  # noqa: E402


def pane4_text(store: Store) -> str:
    """Pane 4's topology block as plain text ("" plus a note when rich/textual are missing)."""
    try:
        from rich.console import Console

        from verl_top.ui.panes.mapping import topology_block
    except ImportError as exc:  # a bare GPU node may lack the UI packages
        return f"(pane 4 not rendered: {exc})"
    console = Console(record=True, width=120, color_system=None)
    console.print(topology_block(store, {}))
    return console.export_text()


def main(argv: list[str] | None = None) -> int:
    """Collect, print, optionally save; exit 0 when a topo record was produced."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "pynvml", "nvidia-smi", "none"))
    ap.add_argument("--out", default="", help="directory to write the capture files to")
    args = ap.parse_args(argv)
    agent = Agent(parse_args(["--backend", args.backend, "--no-procs"]))
    try:
        hello = agent.hello()
        t0 = time.perf_counter()
        topo = agent.topology()
        took = time.perf_counter() - t0
    finally:
        agent.close()
    lines = [encode_line(hello), encode_line(topo)]
    print("\n".join(lines))
    store = Store()
    for line in lines:
        store.ingest(from_dict(json.loads(line)))
    from verl_top.nccl.topo import topology_marks

    rec = store.node_topology[agent.host]
    print(
        f"\n# collected in {took * 1000:.0f} ms; backend {hello['backend']}; source {rec.source!r}"
    )
    print(f"# GPU pairs: {len(store.topology.get(agent.host, {}))}; NICs: {len(rec.nics)}")
    for mark in topology_marks(rec):
        print(f"# marked GPU{mark.gpu}: {mark.text}")
    pane = pane4_text(store)
    print(pane)
    smi = ""
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False
        ).stdout
        print("# nvidia-smi topo -m:\n" + smi)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "topo_record.ndjson").write_text("\n".join(lines) + "\n")
        (out / "pane4.txt").write_text(pane)
        if smi:
            (out / "smi_topo.txt").write_text(smi)
    return 0 if topo.get("type") == "topo" else 1


if __name__ == "__main__":
    sys.exit(main())
