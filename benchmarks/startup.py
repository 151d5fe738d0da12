"""Start to first frame: a fresh ``verl-top`` process until the first painted frame with data.

    python benchmarks/startup.py                           # demo + local agent, 5 runs each
    python benchmarks/startup.py --ssh 16,64 --json-out startup.json   # + hosts over one bastion

Each run is a new interpreter (imports included, like a user typing ``verl-top``); the clock
starts in the parent just before the spawn. The child builds its inputs exactly as the CLI does
(``app_parser`` + ``build_inputs``), runs the real ``VerlTopApp`` headless (``App.run_test``)
and reports when the first refresh that shows GPU data has been painted
(``call_after_refresh`` after ``refresh_now``).

Scenarios:

- ``demo``: ``verl-top --demo`` (the bundled recording).
- ``local``: the in-process local agent on the replay backend (this machine has no GPU; on a GPU
  machine ``--local-backend auto`` measures pynvml).
- ``ssh-N``: N hosts, one real OpenSSH sshd each on 127.0.0.x, all reached through one bastion
  sshd (``--jump``), each running the real agent (replay backend, 8 GPUs). Reports the first
  frame and the time until every host streams (the "64 hosts connected in < 5 s" target).
  Needs root and /usr/sbin/sshd (tests/sshd.py starts the daemons). On one machine the "nodes"
  (sshd + agent start-up: ~0.15 s CPU each) share the client's cores, so this is a pessimistic
  figure for a real cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, ensure_repo_on_path, median, percentile, table, write_json

TRACE = REPO / "tests" / "fixtures" / "agent" / "h200_phased_trace.jsonl"
REMOTE_REPLAY = ["--backend", "replay", "--replay-trace", str(TRACE), "--replay-gpus", "8"]
TARGETS = {"local": "< 1 s to first frame", "ssh-64": "64 hosts connected in < 5 s"}


# ---------------------------------------------------------------------------------------------
# Child: one start


async def first_frame(argv: list[str], t0: float, hosts: int, local_backend: str) -> dict:
    """Run the app until the first frame with data (and, for SSH, until every host streams)."""
    ensure_repo_on_path()
    t_import = time.time()
    from verl_top.cli import app_parser  # noqa: PLC0415
    from verl_top.inputs import build_inputs  # noqa: PLC0415
    from verl_top.ui.app import VerlTopApp  # noqa: PLC0415

    out: dict[str, Any] = {"interpreter_s": t_import - t0}
    out["imports_s"] = time.time() - t_import
    if argv == ["local"]:
        from verl_top.inputs import Inputs  # noqa: PLC0415
        from verl_top.sources.local import LocalSource  # noqa: PLC0415
        from verl_top.sources.pipeline import Pipeline  # noqa: PLC0415
        from verl_top.store import Store  # noqa: PLC0415

        store = Store()
        src = LocalSource(interval=1.0, backend=local_backend, replay_trace=str(TRACE))
        inputs = Inputs(store=store, pipeline=Pipeline(store), sources=[src], title="bench")
    else:
        inputs = build_inputs(app_parser().parse_args(argv))
        for src in inputs.sources:
            if hasattr(src, "agent_args"):  # SSH: the CLI passes no backend to remote agents
                src.agent_args += REMOTE_REPLAY
    app = VerlTopApp(inputs, refresh=1.0, live=True)
    store = inputs.store
    done = asyncio.get_running_loop().create_future()
    original = app.refresh_now

    def refresh() -> None:
        original()
        if store.gpu_count() and "first_frame_s" not in out:
            gpus = store.gpu_count()

            def painted() -> None:
                out["first_frame_s"] = time.time() - t0
                out["gpus_in_first_frame"] = gpus
                if not done.done():
                    done.set_result(True)

            app.call_after_refresh(painted)

    app.refresh_now = refresh  # type: ignore[method-assign]
    async with app.run_test(headless=True, size=(200, 60)) as pilot:
        try:
            await asyncio.wait_for(done, 60)
        except TimeoutError:
            reasons = sorted({f"{h.state}: {h.reason}" for h in store.hosts.values()})
            raise RuntimeError(
                f"no data in 60 s; hosts: {reasons[:3]}; notes {list(store.notes)[-2:]}"
            ) from None
        if hosts:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                streaming = sum(
                    1 for h in store.hosts.values() if any(g.latest for g in h.gpus.values())
                )
                up = sum(1 for h in store.hosts.values() if h.hello is not None)
                if up >= hosts and "all_hosts_up_s" not in out:
                    out["all_hosts_up_s"] = time.time() - t0
                    out["client_cpu_at_all_up_s"] = time.process_time()
                if streaming >= hosts:
                    out["all_hosts_streaming_s"] = time.time() - t0
                    break
                await asyncio.sleep(0.02)
            out["hosts_streaming"] = streaming
            out["states"] = sorted({h.state for h in store.hosts.values()})
            attempts = [getattr(src, "attempts", 0) for src in inputs.sources]
            out["connect_attempts_max"] = max(attempts, default=0)
            out["reconnects"] = sum(attempts) - len(attempts)
            up_at = sorted(
                h.last_received - t0 for h in store.hosts.values() if h.last_received is not None
            )
            out["hosts_up_at_s"] = [round(x, 2) for x in up_at]
        await pilot.pause()
    return out


# ---------------------------------------------------------------------------------------------
# Parent: scenarios


def spawn(argv: list[str], hosts: int, local_backend: str) -> dict:
    """One cold start in a new interpreter."""
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(argv)]
    cmd += ["--hosts-expected", str(hosts), "--local-backend", local_backend, "--json-out", out]
    t0 = time.time()
    proc = subprocess.run([*cmd, "--t0", repr(t0)], capture_output=True, text=True, timeout=180)
    try:
        data = json.loads(Path(out).read_text() or "{}")
    except ValueError:
        data = {}
    Path(out).unlink(missing_ok=True)
    if proc.returncode != 0 or "first_frame_s" not in data:
        return {"error": (proc.stderr or proc.stdout)[-800:]}
    return data


class Cluster:
    """N node sshd daemons and one bastion, on 127.0.0.x (tests/sshd.py)."""

    def __init__(self, n: int) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        ensure_repo_on_path()
        from sshd import SshdFactory, new_key  # noqa: PLC0415

        self.tmp = Path(tempfile.mkdtemp(prefix="verl-top-bench-startup-"))
        self.key, key = new_key(self.tmp / "client_ed25519")
        auth = self.tmp / "authorized_keys"
        auth.write_bytes(key.export_public_key("openssh"))
        auth.chmod(0o600)
        self.factory = SshdFactory(self.tmp / "sshd", auth, 2)
        self.bastion = self.factory.start(log_level="ERROR")
        self.nodes = [self.factory.start(log_level="ERROR") for _ in range(n)]
        self.known = self.tmp / "known_hosts"
        self.known.write_text("".join(d.known_hosts_line() for d in [self.bastion, *self.nodes]))
        self.hosts = self.tmp / "hosts"
        self.hosts.write_text("".join(f"root@{d.addr}:{d.port}\n" for d in self.nodes))
        self.config = self.tmp / "ssh_config"
        self.config.touch()

    def argv(self) -> list[str]:
        """The verl-top command line for these hosts through the bastion."""
        b = self.bastion
        return [
            "--hosts",
            str(self.hosts),
            "--jump",
            f"root@{b.addr}:{b.port}",
            "-i",
            str(self.key),
            "--known-hosts",
            str(self.known),
            "--ssh-config",
            str(self.config),
            "--max-handshakes",
            "64",
        ]

    def stop(self) -> None:
        """Stop every daemon by pid."""
        self.factory.stop_all()


HEADERS = [
    "scenario",
    "runs",
    "first frame p50 s",
    "max s",
    "all hosts up (hello) p50 s",
    "all hosts streaming p50 s",
    "max s",
    "imports s",
]


def summarise(name: str, runs: list[dict]) -> dict:
    """Median/max over the good runs of one scenario."""
    good = [r for r in runs if "error" not in r]
    ff = [r["first_frame_s"] for r in good]
    allh = [r["all_hosts_streaming_s"] for r in good if "all_hosts_streaming_s" in r]
    return {
        "scenario": name,
        "runs": len(runs),
        "ok": len(good),
        "first_frame_p50_s": median(ff),
        "first_frame_max_s": max(ff) if ff else None,
        "first_frame_p90_s": percentile(ff, 90),
        "all_hosts_up_p50_s": median([r["all_hosts_up_s"] for r in good if "all_hosts_up_s" in r]),
        "all_hosts_streaming_p50_s": median(allh),
        "all_hosts_streaming_max_s": max(allh) if allh else None,
        "imports_p50_s": median([r["imports_s"] for r in good]),
        "errors": [r["error"] for r in runs if "error" in r][:2],
        "raw": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=5, help="cold starts per scenario")
    p.add_argument("--scenarios", default="demo,local", help="demo,local (comma list)")
    p.add_argument("--ssh", default="", help="host counts over one bastion, e.g. 16,64")
    p.add_argument("--local-backend", default="replay", help="backend of the local scenario")
    p.add_argument("--json-out", default=None, metavar="FILE")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--hosts-expected", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        res = asyncio.run(
            first_frame(json.loads(args.child), args.t0, args.hosts_expected, args.local_backend)
        )
        Path(args.json_out).write_text(json.dumps(res))
        os._exit(0)  # agents' reader threads / SSH channels: nothing left worth a clean shutdown

    summaries = []
    for name in [s for s in args.scenarios.split(",") if s]:
        child_argv = ["--demo"] if name == "demo" else ["local"]
        print(f"{name}: {args.runs} cold starts ...", flush=True)
        summaries.append(
            summarise(name, [spawn(child_argv, 0, args.local_backend) for _ in range(args.runs)])
        )
    for n in [int(x) for x in args.ssh.split(",") if x.strip()]:
        print(f"ssh-{n}: starting {n + 1} sshd daemons ...", flush=True)
        cluster = Cluster(n)
        try:
            runs = [
                spawn(cluster.argv(), n, args.local_backend) for _ in range(max(1, args.runs // 2))
            ]
        finally:
            cluster.stop()
        summaries.append(summarise(f"ssh-{n} (one bastion)", runs))

    rows = [
        [
            s["scenario"],
            f"{s['ok']}/{s['runs']}",
            s["first_frame_p50_s"],
            s["first_frame_max_s"],
            s["all_hosts_up_p50_s"],
            s["all_hosts_streaming_p50_s"],
            s["all_hosts_streaming_max_s"],
            s["imports_p50_s"],
        ]
        for s in summaries
    ]
    print()
    print(table(HEADERS, rows))
    print(
        "\ntargets: start to first frame < 1 s locally; 64 hosts connected in < 5 s (one bastion)"
    )
    for s in summaries:
        for e in s["errors"]:
            print(f"  {s['scenario']} error: {e.strip()[-300:]}")
    write_json(
        args.json_out,
        {"benchmark": "startup", "argv": sys.argv[1:] if argv is None else argv, "rows": summaries},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
