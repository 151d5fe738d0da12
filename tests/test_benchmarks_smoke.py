"""CI-sized runs of every benchmark: each one runs and prints its table (no timing assertions).

The numbers are the benchmarks' business (docs/performance.md); here we only check that each
script still works against the current code and writes its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_top.sources.prometheus import PrometheusSource, PromSettings

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def _sshd_missing() -> str:
    if not os.path.exists("/usr/sbin/sshd"):
        return "/usr/sbin/sshd is not installed (.ci/run installs openssh-server)"
    if os.geteuid() != 0:
        return "the benchmark sshd logs in as root and must be started as root (CI runs as root)"
    return ""


def run_bench(
    script: str, args: list[str], tmp_path: Path, timeout: float = 120
) -> tuple[str, dict]:
    """Run ``benchmarks/<script>`` with ``args`` + ``--json-out``; (stdout, parsed JSON)."""
    out = tmp_path / f"{script}.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_agent_cost_replay(tmp_path: Path) -> None:
    stdout, data = run_bench(
        "agent_cost.py",
        ["--backend", "replay", "--gpus", "8", "--rates", "10", "--samples", "4", "--no-floor"],
        tmp_path,
    )
    assert "tool" in stdout and "CPU ms/sample mean" in stdout and "bytes/sample" in stdout
    rows = {r["tool"]: r for r in data["rows"]}
    tick, proc = rows["verl-top agent tick"], rows["verl-top agent process"]
    assert tick["gpus"] == 8 and tick["samples"] == 4 and tick["cpu_ms_mean"] > 0
    assert proc["gpus"] == 8 and proc["rss_mb"] > 0 and proc["bytes_per_sample"] > 1000
    assert "nvidia-smi --query-gpu (spawn)" in rows  # a row even where there is no nvidia-smi
    floor = rows["python wake + write only (floor)"]  # the least any 10 Hz Python loop costs
    assert 0 < floor["cpu_ms_mean"] < tick["cpu_ms_mean"]


def test_agent_tick_ab_measures_both_versions_alternately(tmp_path: Path) -> None:
    """Head against a copy of itself: both load as their own packages, both tick, both run as
    bootstrapped processes, and the ratios are computed."""
    base = REPO / "verl_top" / "agent"
    stdout, data = run_bench(
        "agent_tick_ab.py", ["--base-dir", str(base), "--ticks", "4", "--rate", "20"], tmp_path
    )
    assert "head/base" in stdout
    assert [r["row"] for r in data["tick"]] == ["tick [base]", "tick [head]"]
    assert all(r["ticks"] == 4 and r["mean"] > 0 for r in data["tick"])
    assert [r["version"] for r in data["process"]] == ["base", "head"]
    assert all(r["ticks"] >= 4 and r["rss_mb"] > 0 for r in data["process"])


def test_nvml_cold_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    """The NVML floor benchmark needs a GPU; without one it says why and exits 2."""
    import importlib.util

    spec = importlib.util.find_spec("pynvml")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "nvml_cold.py"), "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    if os.path.exists("/dev/nvidiactl") and spec is not None:
        assert proc.returncode == 0, proc.stderr[-2000:]  # a GPU machine: it measures
        assert "further distinct GPU" in proc.stdout
    else:
        assert proc.returncode == 2 and "no NVML here" in proc.stdout


def test_parsers(tmp_path: Path) -> None:
    stdout, data = run_bench("parsers.py", ["--duration", "0.01"], tmp_path)
    assert "lines/s" in stdout
    by = {(r["parser"], r["input"]): r for r in data["rows"]}
    qwen = by[("VerlStreamParser.feed", "real_Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log")]
    assert qwen["records_per_pass"] > 400  # the real log's steps were found
    assert by[("parse_smi_csv + smi_gpu_fields", "smi_query.csv x8 GPUs")]["records_per_pass"] == 8


def test_postmortem_log(tmp_path: Path) -> None:
    stdout, data = run_bench(
        "postmortem_log.py", ["--size-mb", "1", "--rounds", "1", "--dir", str(tmp_path)], tmp_path
    )
    assert "bare loop CPU s" in stdout and "verl-top CPU s" in stdout
    (row,) = data["rows"]
    assert row["lead"] == "flow.rollout_bound" and row["lines"] > 5000 and row["ratio"] > 0


def test_flood(tmp_path: Path) -> None:
    stdout, data = run_bench("flood.py", ["--lines", "600"], tmp_path)
    assert "peak MiB" in stdout
    rows = {r["case"]: r for r in data["rows"]}
    assert rows["gpu_index_flood"]["gpus"] == 256 and rows["gpu_index_flood"]["refused"] == 344
    assert rows["host_flood"]["hosts"] == 600 and rows["normal"]["gpus"] == 8


def test_catchup(tmp_path: Path) -> None:
    stdout, data = run_bench("catchup.py", ["--steps", "300"], tmp_path)
    assert "max stall ms" in stdout
    assert [r["mode"] for r in data["rows"]] == ["unpaced", "paced"]


def test_client_scale_wire(tmp_path: Path) -> None:
    stdout, data = run_bench(
        "client_scale.py", ["--gpus", "8", "--duration", "2", "--warmup", "0.5"], tmp_path
    )
    assert "CPU % core" in stdout and "lat p95 s" in stdout
    (row,) = data["rows"]
    assert "error" not in row, row.get("error")
    assert row["gpus"] == 8 and row["refreshes"] >= 1 and row["samples_on_screen"] > 0


def test_client_on_node_measures_the_tui_under_tmux_and_its_parts(tmp_path: Path) -> None:
    """Both tmux runs happen, the window is read from /proc, and every instrument found its
    method in this code (a renamed method would leave its part out of the table). The live log
    and the instruments' report are gone afterwards."""
    args = ["--backend", "replay", "--warmup", "3", "--duration", "3", "--out", str(tmp_path)]
    args += ["--sampler", "instruments"]
    stdout, data = run_bench("client_on_node.py", args, tmp_path, timeout=180)
    assert "where it goes" in stdout
    tui, parts = data["tui"], data["parts"]
    assert "error" not in tui and 2.5 < tui["window_s"] < 10 and tui["cpu_pct"] > 0
    assert tui["cwd"] == str(REPO)  # (``python -m verl_top`` imports from its working folder)
    assert "--follow" in data["verl_top_argv"] and tui["startup_cpu_s"] > 0
    assert parts["not_wrapped"] == [] and parts["parts_pct"]["refresh (header, pane content)"] > 0
    (row,) = data["rows"]
    assert row["cpu_pct"] == tui["cpu_pct"] and row["part:agent tick"] >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client_on_node.py.json"]


def test_py_spy_samples_of_the_tui_are_shared_out_to_its_parts() -> None:
    """A real py-spy capture of verl-top: each sample goes to one part, the parts add up to the
    window's CPU, and a DataTable's lines (``super().render_lines`` inside the table's own)
    count as the tables' part, not the other widgets'."""
    sys.path.insert(0, str(BENCH))
    import client_on_node as node  # noqa: PLC0415

    raw = (REPO / "tests/fixtures/benchmarks/py_spy_raw_tui_on_node.txt").read_text()
    lines = raw.splitlines()
    parts = node.spy_parts(lines, cpu_pct=2.0)
    assert parts["samples"] == sum(int(line.rsplit(" ", 1)[1]) for line in lines) == 53
    assert abs(sum(parts["parts_pct"].values()) - 2.0) < 1e-9
    known = {p.name for p in node.PARTS} | {node.LOOP, node.REST}
    assert set(parts["parts_pct"]) <= known
    assert {"lines: tables", "compositor", "refresh (header, pane content)"} <= set(
        parts["parts_pct"]
    )
    table_lines = [
        line.rsplit(" ", 1)[0].split(";")
        for line in lines
        if "DataTable.render_lines (" in line and "Widget.render_lines (" in line
    ]
    assert table_lines and all(node.sample_part(f) == "lines: tables" for f in table_lines)


def test_startup_demo(tmp_path: Path) -> None:
    stdout, data = run_bench("startup.py", ["--runs", "1", "--scenarios", "demo"], tmp_path)
    assert "first frame p50 s" in stdout
    (row,) = data["rows"]
    assert row["ok"] == 1, row["errors"]


@pytest.mark.sshd
def test_ssh_benchmarks(tmp_path: Path) -> None:
    why = _sshd_missing()
    if why:
        pytest.skip(why)
    stdout, data = run_bench(
        "client_scale.py",
        ["--gpus", "16", "--duration", "2", "--warmup", "0.5", "--transport", "ssh"],
        tmp_path,
    )
    (row,) = data["rows"]
    assert "error" not in row, row.get("error")
    assert row["hosts"] == 2 and row["samples_on_screen"] > 0
    stdout, data = run_bench(
        "startup.py", ["--runs", "1", "--scenarios", "", "--ssh", "2"], tmp_path
    )
    (row,) = data["rows"]
    assert row["ok"] == 1, row["errors"]
    assert "all hosts streaming p50 s" in stdout


@pytest.mark.sshd
def test_ssh_scale(tmp_path: Path) -> None:
    why = _sshd_missing()
    if why:
        pytest.skip(why)
    stdout, data = run_bench(
        "ssh_scale.py", ["--scenarios", "chain:2,bastion:2", "--window", "1"], tmp_path
    )
    chain, bastion = data["rows"]
    assert "error" not in chain, chain.get("error")
    assert chain["hosts_with_data"] == 2 and chain["hop_logins"] == [1, 1]
    assert bastion["bastion_connects"] == [1] and not bastion["agents_left_behind"]
    assert "all data s" in stdout


def test_prom_scale(tmp_path: Path) -> None:
    if not os.path.exists("/usr/bin/prometheus"):
        pytest.skip("/usr/bin/prometheus is not installed (.ci/run installs prometheus)")
    stdout, data = run_bench(
        "prom_scale.py",
        ["--hosts", "2", "--rounds", "1", "--interval", "1", "--history-wait", "1",
         "--scrape-interval", "1s", "--addr", "127.0.0.95"],
        tmp_path,
    )  # fmt: skip
    assert "CPU % of 1 s" in stdout and "raw / aggregated" in stdout
    assert data["gpus"] == 16
    # A measured round asks every query once: the DCGM identities and GPU metrics, the
    # rollout engines' identities and metrics, node_exporter's identities and host metrics
    # (the benchmark makes them due every round; the scrape estimate was asked at start-up).
    src = PrometheusSource(PromSettings(url="http://127.0.0.95:1"))
    expected = 1 + len(src.gpu_exprs) + 1 + len(src.rollout_exprs) + 1 + len(src.node_exprs)
    assert expected == 45  # 19 GPU, 11 rollout and 12 host metrics today
    assert data["rounds"]["aggregated (verl-top)"][0]["queries"] == expected


def _compare(args: list[str], tmp_path: Path) -> tuple[str, dict]:
    return run_bench("compare.py", ["--quick", *args], tmp_path, timeout=300)


def test_prom_decode(tmp_path: Path) -> None:
    stdout, data = run_bench("prom_decode.py", ["--series", "64", "--repeat", "2"], tmp_path)
    assert "64 series" in stdout and "64 kept" in stdout  # every series read, none dropped
    assert data["series"] == 64 and data["cpu_ms_min"] > 0


def test_compare_runs_base_and_head_side_by_side(tmp_path: Path) -> None:
    """The regression guard checks out BASE in a worktree, runs both and prints the ratio table."""
    stdout, data = _compare(["HEAD", "--only", "pane,parsers,postmortem,agent"], tmp_path)
    assert "HEAD/BASE" in stdout and "spread (min-max)" in stdout
    assert data["base"].startswith("HEAD (") and data["head"].startswith("working tree at")
    rows = {(r["benchmark"], r["metric"]): r for r in data["rows"]}
    assert {b for b, _ in rows} == {"pane", "parsers", "postmortem", "agent"}
    for row in rows.values():
        assert not row["base_error"] and not row["head_error"], row
        assert row["rounds"] == 1 and row["ratio"] is not None
    # the temporary worktree is gone
    listing = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True
    ).stdout
    (worktree,) = data["worktrees"]
    assert worktree not in listing and not Path(worktree).exists()


def test_compare_says_na_when_base_cannot_run_a_benchmark(tmp_path: Path) -> None:
    """The first commit has no parsers: BASE reads n/a with the reason, HEAD still measures."""
    root = subprocess.run(
        ["git", "-C", str(REPO), "rev-list", "--max-parents=0", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.split()[0]
    stdout, data = _compare([root, "--only", "parsers"], tmp_path)
    (row, *_) = data["rows"]
    assert row["base_error"] and not row["head_error"] and row["head"] > 0
    assert "n/a" in stdout and "parsers on BASE: could not run" in stdout


def test_faults_quick(tmp_path: Path) -> None:
    """Seeded and in data time, so the quick run's outcome is a behaviour, not a timing: every
    fault is named by the right host/GPU/process and the healthy fleet raises nothing."""
    stdout, data = run_bench("faults.py", ["--quick"], tmp_path, timeout=300)
    assert "fault" in stdout and "false alarms" in stdout
    rows = {r["fault"]: r for r in data["rows"]}
    assert set(rows) == {"hang", "throttle", "slow_node", "nic", "flap", "healthy"}
    for kind, row in rows.items():
        assert row["trials"] == 2 and row["evaluations"] > 0
        if kind == "healthy":
            assert row["false_alarms"] == 0
        else:
            assert row["recall"] == 1.0 and row["precision"] == 1.0, row
            assert row["p95_detect_s"] is not None
    assert rows["hang"]["hang_leads"] == 1.0


def test_accuracy_table(tmp_path: Path) -> None:
    """docs/diagnosis-accuracy.md's tables: every corpus row, with the agreement the tests check."""
    stdout, data = run_bench("accuracy_table.py", [], tmp_path)
    assert len(data["real"]) >= 30 and len(data["new_eras"]) == 8
    assert all(r["agrees"] for r in data["real"] + data["new_eras"]), stdout
    assert f"{len(data['real'])} of {len(data['real'])} real leads agree" in stdout
