"""SSH at scale on real OpenSSH sshd daemons: time until every host shows data, client CPU and RSS.

    python benchmarks/ssh_scale.py --scenarios bastion:64                # 64 hosts via one bastion
    python benchmarks/ssh_scale.py --scenarios chain:16,bastion:64,direct:256 --window 10

Each scenario runs in a fresh child process (clean CPU and RSS figures). The child starts one
sshd per host on 127.0.0.x (free ports; several daemons may share an address) plus the
bastion(s), with the real agent (replay backend on the real H200 trace) behind each, then runs
one ``SshSource`` per host, exactly as the monitor does, ingesting into the real ``Store``.

- ``bastion:N``: every host through one bastion (``--jump``): one connection, multiplexed.
- ``chain:N``: every host through ``ProxyJump a,b`` from an ssh config (three hops' worth of sshd).
- ``direct:N``: every host directly.

Measured: seconds from starting the sources until every host has delivered a GPU sample
(``all data``), the client's CPU seconds until then, the client's CPU % of one core over a
``--window`` of steady streaming afterwards, RSS at the end and peak RSS, records per second,
and for the bastion/chain runs the number of connections the bastion(s) accepted (1 expected).
The sshd daemons and agents are the "nodes": they run on the same machine and cores, so start-up
times include their cost (sshd fork + key exchange + a Python start per host); client CPU does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, ensure_repo_on_path, table, write_json

ensure_repo_on_path()
sys.path.insert(0, str(REPO / "tests"))

TRACE = REPO / "tests" / "fixtures" / "h200" / "h200_phased_trace.jsonl"


class Nodes:
    """The daemons of one scenario: ``n`` nodes plus up to two jump hosts."""

    def __init__(self, n: int, hops: int) -> None:
        from sshd import SshDaemon, free_port, new_key, sshd_version

        self.tmp = Path(tempfile.mkdtemp(prefix="verl-top-bench-ssh-"))
        self.key, key = new_key(self.tmp / "client_ed25519")
        auth = self.tmp / "authorized_keys"
        auth.write_bytes(key.export_public_key("openssh"))
        auth.chmod(0o600)
        penalties = sshd_version() >= (9, 8)
        self.daemons: list[Any] = []

        def start(i: int, addr: str, level: str) -> Any:
            d = SshDaemon(addr, free_port(addr), self.tmp / f"sshd-{i}", auth, level)
            self.daemons.append(d)
            d.start(penalties)
            return d

        self.hops = [start(i, f"127.0.0.{140 + i}", "INFO") for i in range(hops)]
        self.nodes = [start(100 + i, f"127.0.0.{150 + i % 100}", "ERROR") for i in range(n)]
        self.known = self.tmp / "known_hosts"
        self.known.write_text("".join(d.known_hosts_line() for d in self.daemons))
        self.config = self.tmp / "ssh_config"
        self.config.write_text(
            "".join(
                f"Host hop{i}\n  HostName {d.addr}\n  Port {d.port}\n  User root\n"
                for i, d in enumerate(self.hops)
            )
        )

    def stop(self) -> None:
        """Stop every daemon by pid."""
        for d in self.daemons:
            d.stop()


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


async def run_child(kind: str, n: int, window: float, interval: float, gpus: int) -> dict:
    """One scenario in this process; returns the figures."""
    from sshd import gone

    from verl_top.model import Hello
    from verl_top.sources.hosts import HostSpec
    from verl_top.sources.ssh import SshSettings, SshSource
    from verl_top.store import Store

    hops = {"bastion": 1, "chain": 2, "direct": 0}[kind]
    nodes = Nodes(n, hops)
    try:
        jump = None
        if kind == "bastion":
            b = nodes.hops[0]
            jump = f"root@{b.addr}:{b.port}"
        if kind == "chain":
            with nodes.config.open("a") as fh:
                fh.write("Host 127.0.0.1?? 127.0.0.2??\n  ProxyJump hop0,hop1\n")
        settings = SshSettings(
            ssh_config=str(nodes.config),
            identities=(str(nodes.key),),
            known_hosts=str(nodes.known),
            jump=jump,
            max_handshakes=32,
            python=sys.executable,
        )
        agent_args = ["--interval", str(interval), "--backend", "replay"]
        agent_args += ["--replay-trace", str(TRACE), "--replay-gpus", str(gpus)]
        specs = [HostSpec("root", d.addr, d.port) for d in nodes.nodes]
        sources = [SshSource(s, settings, agent_args) for s in specs]
        store = Store()
        has_data: set[str] = set()
        pids: list[int] = []
        count = [0]

        def emit(rec: Any) -> None:
            count[0] += 1
            store.ingest(rec, time.time())
            if rec.TYPE == "gpu":
                has_data.add(rec.host)
            elif isinstance(rec, Hello) and rec.pid:
                pids.append(rec.pid)

        cpu0, t0 = time.process_time(), time.monotonic()
        tasks = [asyncio.create_task(s.run(emit)) for s in sources]
        deadline = t0 + 120 + n
        while len(has_data) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        all_data = time.monotonic() - t0 if len(has_data) == n else None
        connect_cpu = time.process_time() - cpu0
        await asyncio.sleep(2.0)  # let the start-up backlog drain
        c1, w1, r1 = time.process_time(), time.monotonic(), count[0]
        await asyncio.sleep(window)
        c2, w2, r2 = time.process_time(), time.monotonic(), count[0]
        rss = _rss_mb()
        bastions = list(settings.shared().bastions.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await settings.shared().close()
        left = not await gone(pids, 10.0)
        return {
            "scenario": f"{kind}:{n}",
            "hosts_with_data": len(has_data),
            "all_data_s": all_data,
            "connect_cpu_s": connect_cpu,
            "cpu_pct": 100 * (c2 - c1) / (w2 - w1),
            "records_per_s": (r2 - r1) / (w2 - w1),
            "rss_mb": rss,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "bastion_connects": [b.connects for b in bastions],
            "hop_logins": [d.accepted_logins() for d in nodes.hops],
            "node_handshakes": settings.shared().handshakes,
            "agents_left_behind": left,
            "interval_s": interval,
            "gpus_per_host": gpus,
            "loadavg_1m": os.getloadavg()[0],
        }
    finally:
        nodes.stop()


def spawn(scenario: str, window: float, interval: float, gpus: int) -> dict:
    """Run one scenario in a fresh interpreter."""
    out = Path(tempfile.mktemp(suffix=".json"))
    argv = [sys.executable, __file__, "--child", scenario, "--json-out", str(out)]
    argv += ["--window", str(window), "--interval", str(interval), "--gpus", str(gpus)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        return {"scenario": scenario, "error": (proc.stderr or proc.stdout)[-1500:]}
    finally:
        out.unlink(missing_ok=True)


HEADERS = [
    "scenario",
    "hosts with data",
    "all data s",
    "client CPU s to all data",
    "client CPU % streaming",
    "records/s",
    "RSS MB",
    "peak RSS MB",
    "bastion conns",
    "hop logins",
    "agents left",
    "load 1m",
]


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--scenarios", default="bastion:64", help="kind:N list (bastion, chain, direct)")
    p.add_argument("--window", type=float, default=10.0, help="seconds of steady streaming")
    p.add_argument("--interval", type=float, default=1.0, help="agent sample interval (s)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per host (replay)")
    p.add_argument("--json-out", default=None, metavar="FILE")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        kind, n = args.child.split(":")
        res = asyncio.run(run_child(kind, int(n), args.window, args.interval, args.gpus))
        Path(args.json_out).write_text(json.dumps(res))
        os._exit(0)

    rows, results = [], []
    for scenario in [s for s in args.scenarios.split(",") if s]:
        print(f"{scenario}: starting daemons and sources ...", flush=True)
        res = spawn(scenario, args.window, args.interval, args.gpus)
        results.append(res)
        if "error" in res:
            print(f"  error: {res['error']}")
            continue
        rows.append(
            [
                res["scenario"],
                res["hosts_with_data"],
                res["all_data_s"],
                res["connect_cpu_s"],
                res["cpu_pct"],
                res["records_per_s"],
                res["rss_mb"],
                res["peak_rss_mb"],
                ",".join(map(str, res["bastion_connects"])) or "—",
                ",".join(map(str, res["hop_logins"])) or "—",
                res["agents_left_behind"],
                res["loadavg_1m"],
            ]
        )
    print()
    print(
        f"agents: interval {args.interval:g} s, {args.gpus} GPUs each (replay); "
        f"window {args.window:g} s"
    )
    print(table(HEADERS, rows, digits=2))
    write_json(args.json_out, {"benchmark": "ssh_scale", "argv": sys.argv[1:], "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
