"""The snapshot bundle: contents, schema, replay to the same numbers, and safe writing.

The data is the bundled demo recording (verl_top/data/demo.ndjson.gz: real H200 samples arranged
into a 4-node verl job, see docs/demo.md), read into a Store as ``verl-top --replay`` does.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
from pathlib import Path

import pytest
from assessing import assessment_of

from verl_top import __version__
from verl_top.diagnosis.findings import Check, Finding, Verdict
from verl_top.export import snapshot as snap
from verl_top.export.schema import SNAPSHOT_VERSION, validate
from verl_top.export.snapshot import SnapshotError, write_snapshot
from verl_top.inputs import demo_recording_path
from verl_top.model import GpuSample, HostSample, LogEvent, VerlConfig, VerlStep
from verl_top.protocol import read_recording
from verl_top.sources.pipeline import Pipeline
from verl_top.sources.replay import ReplayControl, ReplaySource
from verl_top.store import GPU_DERIVED, GPU_METRICS, HOST_METRICS, Store, StoreLimits

LIMITS = StoreLimits(window_s=300.0, points=600)


def _demo_store() -> Store:
    store = Store(LIMITS)
    pipeline = Pipeline(store, parsers={})  # as the app does: processes get their verl roles
    for rec in read_recording(demo_recording_path()):
        pipeline.emit(rec)
    store.replay = True
    return store


def _verdict(store: Store) -> Verdict:
    """A verdict in the diagnosis engine's shape (diagnosis/findings.py)."""
    return Verdict(
        bottleneck_step=3,
        bottleneck_rule="dataflow.gen_share",
        headline="Rollout (gen) takes 62 % of each step",
        findings=[
            Finding(
                step=3,
                rule="dataflow.gen_share",
                severity=0.72,
                title="Generation dominates the step",
                evidence=["gen 18.6 s of 30.1 s (62 %), median of steps 5-12"],
                advice="raise actor_rollout_ref.rollout.gpu_memory_utilization",
                data={"share": 0.62},
            )
        ],
        checks=[
            Check(1, "gpu.activity", "passed", "activity 66 % over 300 s"),
            Check(2, "comm.probe", "no_data", "run `verl-top probe nccl`"),
            Check(3, "dataflow.gen_share", "finding", "62 %"),
        ],
        history=[(store.now, 3, "dataflow.gen_share")],
        t=store.now,
    )


@pytest.fixture(scope="module")
def demo() -> Store:
    return _demo_store()


@pytest.fixture(scope="module")
def bundle(demo: Store, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "snap"
    return write_snapshot(demo, assessment_of(demo, _verdict(demo)), out, now=1_800_000_000.0)


def _strict_json(path: Path) -> dict:
    def no_constants(name: str) -> None:
        raise AssertionError(f"{path.name} holds {name}")

    return json.loads(path.read_text(), parse_constant=no_constants)


def _small_store() -> Store:
    store = Store(StoreLimits(window_s=60.0, points=120))
    for i in range(5):
        store.ingest(GpuSample(host="n1", t=1000.0 + i, index=0, util_gpu=10.0 * i))
    store.ingest(VerlStep(host="n1", t=1004.0, step=1, metrics={"timing_s/step": 3.0}))
    return store


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# -- contents ---------------------------------------------------------------------------------


def test_bundle_holds_the_four_parts_but_no_screen(bundle: Path) -> None:
    assert sorted(p.name for p in bundle.iterdir()) == [
        "recording.ndjson.gz",
        "report.md",
        "snapshot.json",
        "verl-top-manifest.json",
    ]
    doc = _strict_json(bundle / "snapshot.json")  # NaN never written: missing is null
    assert doc["files"]["screen"] is None
    assert "no screenshot" in (bundle / "report.md").read_text()


def test_snapshot_json_is_valid_and_versioned(bundle: Path, demo: Store) -> None:
    doc = _strict_json(bundle / "snapshot.json")
    assert validate(doc) == []
    assert doc["schema"] == SNAPSHOT_VERSION
    assert doc["tool"] == {"name": "verl-top", "version": __version__}
    assert doc["created"] == 1_800_000_000.0
    assert doc["data_time"] == demo.now
    assert doc["mode"] == "replay"
    assert doc["window"]["seconds"] == 300.0
    assert [h["name"] for h in doc["hosts"]] == ["node01", "node02", "node03", "node04"]
    assert doc["hosts"][0]["hello"]["backend"] == "replay"
    assert doc["hosts"][0]["hello"]["driver"] == "580.159.04"
    assert len(doc["hosts"][0]["hello"]["gpus"]) == 8
    assert len(doc["gpus"]) == 32 and len(doc["processes"]) == 64


def test_gpu_section_has_latest_means_and_window_series(bundle: Path, demo: Store) -> None:
    doc = _strict_json(bundle / "snapshot.json")
    g = doc["gpus"][5]
    entry = demo.hosts[g["host"]].gpus[g["index"]]
    assert g["name"] == "NVIDIA H200"
    assert g["latest"]["util_gpu"] == entry.latest.util_gpu
    assert g["latest"]["activity"] == entry.latest.activity
    for col in GPU_METRICS + GPU_DERIVED:
        assert g["means"][col] == demo.gpu_mean(entry, col), col
        times, values = entry.history.series(col, demo.window_start())
        assert g["series"]["t"] == times
        assert g["series"][col] == [None if math.isnan(v) else v for v in values], col
    assert len(g["series"]["label"]) == len(g["series"]["t"]) > 200


def test_processes_carry_role_method_and_rank(bundle: Path) -> None:
    doc = _strict_json(bundle / "snapshot.json")
    node02 = [p for p in doc["processes"] if p["host"] == "node02"]
    trainers = sorted((p for p in node02 if p["role"] == "trainer"), key=lambda p: p["rank"])
    assert [p["rank"] for p in trainers] == list(range(8, 16))  # RANK from the environment
    assert {p["method"] for p in trainers} == {"update_actor"}  # ray::WorkerDict.…update_actor()
    rollouts = [p for p in node02 if p["role"] == "rollout"]
    assert sorted(p["rank"] for p in rollouts) == [0, 0, 1, 1, 2, 2, 3, 3]  # VLLM::Worker_TP<k>


def test_steps_config_and_diagnosis(bundle: Path, demo: Store) -> None:
    doc = _strict_json(bundle / "snapshot.json")
    assert [s["step"] for s in doc["steps"]] == [s.step for s in demo.steps]  # fewer than 20
    assert doc["steps"][-1]["metrics"] == demo.steps[-1].metrics
    assert doc["config"]["values"]["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
    assert doc["nccl"][0]["transport"] == "IB+GDRDMA"
    diag = doc["diagnosis"]
    assert diag["schema"] == "verl-top.diagnose/1"  # diagnosis/report.py to_json
    assert diag["bottleneck"]["step"] == 3
    assert diag["findings"][0]["advice"].startswith("raise actor_rollout_ref")
    checks = [c["status"] for s in diag["steps"] for c in s["checks"]]
    assert checks == ["passed", "no_data", "finding"]


def test_report_has_the_five_steps_and_capped_tables(bundle: Path) -> None:
    text = (bundle / "report.md").read_text()
    for n, name in enumerate(
        ["Throughput & GPU", "Communication", "Dataflow", "Parallelism & mapping"], start=1
    ):
        assert f"### {n}. {name}" in text
    assert "### 3. Dataflow — **BOTTLENECK**" in text
    assert "**Status:** step 3 bottleneck (Dataflow): Generation dominates the step" in text
    assert "gen 18.6 s of 30.1 s (62 %)" in text  # evidence
    assert "*Advice:* raise actor_rollout_ref.rollout.gpu_memory_utilization" in text
    assert "| GPU | activity | NVML util | tensor | DRAM | mem GiB | power | throttle |" in text
    assert text.count("**node0") == 4  # one GPU table per host
    assert "| step | step time | gen |" in text
    assert "`actor_rollout_ref.rollout.n` | 8 |" in text
    assert "verl-top --replay recording.ndjson.gz --window 300" in text
    step_rows = [line for line in text.splitlines() if line.startswith("| 1") and " s (" in line]
    assert len(step_rows) <= 8  # only the last steps


def test_report_caps_a_long_config_and_a_large_cluster() -> None:
    store = _small_store()
    for h in range(40):
        for i in range(8):
            store.ingest(GpuSample(host=f"h{h:02d}", t=1004.0, index=i, util_gpu=50.0))
    store.ingest(VerlConfig(t=1.0, values={f"k.{i:03d}": i for i in range(300)}))
    doc = snap.build_snapshot(store, None, now=0.0)
    from verl_top.export.report import build_report

    text = build_report(store, None, doc)
    assert "… 240 more keys in snapshot.json" in text
    assert "… 9 more hosts in snapshot.json" in text  # 41 hosts, 32 rows
    assert len(text.splitlines()) < 200
    assert "no diagnosis was run" in text


def test_screen_svg_is_written_when_given(tmp_path: Path) -> None:
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><text>verl-top</text></svg>'
    out = write_snapshot(_small_store(), None, tmp_path / "s", screen_svg=svg)
    assert (out / "screen.svg").read_text() == svg
    doc = _strict_json(out / "snapshot.json")
    assert doc["files"]["screen"] == "screen.svg"
    assert "`screen.svg`" in (out / "report.md").read_text()
    assert validate(doc) == []


# -- replay -----------------------------------------------------------------------------------


def _assert_same_numbers(original: Store, replayed: Store) -> None:
    assert replayed.now == original.now
    assert list(replayed.hosts) == list(original.hosts)
    for g in original.iter_gpus():
        r = replayed.hosts[g.host].gpus[g.index]
        assert r.latest == g.latest, g.key
        for col in GPU_METRICS + GPU_DERIVED:
            assert replayed.gpu_mean(r, col) == original.gpu_mean(g, col), (g.key, col)
    for h in original.hosts.values():
        r = replayed.hosts[h.name]
        assert r.latest == h.latest and r.state == h.state and r.hello == h.hello
        assert r.procs == h.procs
        for col in HOST_METRICS:
            since = original.window_start()
            assert r.history.values(col, since) == h.history.values(col, since), col
    assert list(replayed.steps) == list(original.steps)
    assert replayed.config == original.config
    assert list(replayed.nccl.values()) == list(original.nccl.values())


def test_recording_replays_into_a_store_with_the_same_numbers(bundle: Path, demo: Store) -> None:
    replayed = Store(LIMITS)
    for rec in read_recording(bundle / "recording.ndjson.gz"):
        replayed.ingest(rec)
    _assert_same_numbers(demo, replayed)


async def test_recording_plays_through_the_replay_source(bundle: Path, demo: Store) -> None:
    """The path ``verl-top --replay`` takes: ReplaySource -> Pipeline -> Store."""
    replayed = Store(LIMITS)
    source = ReplaySource(bundle / "recording.ndjson.gz", ReplayControl(speed=1e9))
    await source.run(Pipeline(replayed, parsers={}).emit)
    assert source.decoder.malformed == 0
    _assert_same_numbers(demo, replayed)


def test_replay_keeps_events_throttling_and_the_data_time(tmp_path: Path) -> None:
    store = _small_store()
    store.ingest(GpuSample(host="n1", t=1005.0, index=0, util_gpu=90.0, clock_reasons=0x40))
    store.ingest(GpuSample(host="n1", t=1006.0, index=0, util_gpu=80.0, clock_reasons=0x1))
    store.ingest(HostSample(host="n1", t=1006.0, cpu_pct=12.0, mem_used_bytes=7, load5=1.0))
    store.ingest(LogEvent(host="n1", t=1006.5, kind="nccl_warn", text="NCCL WARN timeout"))
    from verl_top.model import LogLines

    store.ingest(LogLines(host="n1", t=1007.0, path="/x.log", kind="verl", lines=["hello"]))
    out = write_snapshot(store, None, tmp_path / "s")
    replayed = Store(store.limits)
    for rec in read_recording(out / "recording.ndjson.gz"):
        replayed.ingest(rec)
    _assert_same_numbers(store, replayed)
    assert replayed.now == 1007.0  # set by a raw log chunk the store does not keep
    assert list(replayed.events) == list(store.events)
    assert list(replayed.hosts["n1"].log_tail) == ["hello"]
    gpu = replayed.hosts["n1"].gpus[0]
    assert gpu.history.values("throttled") == [1.0, 0.0]  # no reasons before t=1005


# -- writing safely ---------------------------------------------------------------------------


def test_existing_non_empty_directory_needs_force(tmp_path: Path) -> None:
    target = tmp_path / "snap"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(SnapshotError, match=r"snap exists; use --force to overwrite"):
        write_snapshot(_small_store(), None, target)
    assert sorted(p.name for p in target.iterdir()) == ["mine.txt"]
    assert _leftovers(tmp_path) == []


def test_existing_empty_directory_is_used_without_force(tmp_path: Path) -> None:
    target = tmp_path / "snap"
    target.mkdir()
    write_snapshot(_small_store(), None, target)
    assert (target / "snapshot.json").is_file()
    assert _leftovers(tmp_path) == []


def test_force_replaces_an_old_bundle(tmp_path: Path) -> None:
    target = tmp_path / "snap"
    write_snapshot(_small_store(), None, target, screen_svg="<svg/>")
    write_snapshot(_small_store(), None, target, force=True)
    assert sorted(p.name for p in target.iterdir()) == [
        "recording.ndjson.gz",
        "report.md",
        "snapshot.json",
        "verl-top-manifest.json",
    ]  # the old screen.svg went with the old bundle
    assert _leftovers(tmp_path) == []


def test_a_file_in_the_way_is_refused_even_with_force(tmp_path: Path) -> None:
    target = tmp_path / "snap"
    target.write_text("not a bundle")
    with pytest.raises(SnapshotError, match="exists and is not a directory"):
        write_snapshot(_small_store(), None, target, force=True)
    assert target.read_text() == "not a bundle"


def test_unwritable_path_under_a_file(tmp_path: Path) -> None:
    # Tests run as root, where chmod does not stop writes: a regular file as a parent does.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SnapshotError, match=r"cannot write the snapshot to .*file/snap"):
        write_snapshot(_small_store(), None, blocker / "snap")
    assert blocker.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def _fail_writes_after(monkeypatch: pytest.MonkeyPatch, n: int, code: int) -> None:
    """Make ``os.write`` fail with ``code`` after ``n`` successful calls."""
    real = os.write
    calls = {"n": 0}

    def write(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] > n:
            raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("n", [0, 1, 2])  # in snapshot.json, report.md, the recording
def test_disk_full_leaves_no_partial_bundle(tmp_path: Path, monkeypatch, n: int) -> None:
    _fail_writes_after(monkeypatch, n, errno.ENOSPC)
    with pytest.raises(SnapshotError, match="no space left on the device"):
        write_snapshot(_small_store(), None, tmp_path / "snap")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_disk_full_with_force_keeps_the_old_bundle(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "snap"
    write_snapshot(_small_store(), None, target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    _fail_writes_after(monkeypatch, 1, errno.ENOSPC)
    with pytest.raises(SnapshotError, match="no space left"):
        write_snapshot(_demo_store(), None, target, force=True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert _leftovers(tmp_path) == []


def test_failed_swap_puts_the_old_bundle_back(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "snap"
    write_snapshot(_small_store(), None, target)
    before = (target / "snapshot.json").read_bytes()
    real = os.replace
    calls = {"n": 0}

    def replace(src, dst) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # 1: old bundle aside, 2: new bundle in place
            raise OSError(errno.EACCES, "Permission denied")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(SnapshotError, match="permission denied"):
        write_snapshot(_small_store(), None, target, force=True)
    monkeypatch.undo()
    assert (target / "snapshot.json").read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_validate_reports_paths_of_problems(bundle: Path) -> None:
    doc = _strict_json(bundle / "snapshot.json")
    del doc["window"]
    doc["gpus"][0]["index"] = "zero"
    doc["processes"][0]["role"] = "wizard"
    doc["schema"] = "verl-top.snapshot/2"
    errors = validate(doc)
    assert "$: missing 'window'" in errors
    assert any(e.startswith("$.gpus[0].index: expected integer") for e in errors)
    assert any(e.startswith("$.processes[0].role: 'wizard' is not one of") for e in errors)
    assert any(e.startswith("$.schema: expected 'verl-top.snapshot/1'") for e in errors)


def test_recording_is_gzip_ndjson(bundle: Path) -> None:
    with gzip.open(bundle / "recording.ndjson.gz", "rt") as fh:
        first = json.loads(fh.readline())
    assert first["v"] == 1 and first["type"] == "hello"


def test_process_map_names_gpu_processes_and_ray_actors(tmp_path: Path) -> None:
    """snapshot.json's process_map: the WorkerDict as verl names it, with its GPU and memory;
    the TaskRunner, which holds no GPU, from Ray (as on the real H200 job, issue 23)."""
    from verl_top.model import GpuProcess, ProcessList, RayActor, RayActors

    store = _small_store()
    pipe = Pipeline(store)
    pipe.emit(VerlConfig(host="n1", t=1000.0, values={"actor_rollout_ref.actor.use_kl_loss": True}))
    pipe.emit(
        ProcessList(
            host="n1",
            t=1004.0,
            procs=[
                GpuProcess(
                    pid=2834,
                    gpu_index=0,
                    used_mib=1482.0,
                    env_rank=0,
                    cmd="ray::WorkerDict.actor_rollout_generate_sequences",
                )
            ],  # fmt: skip
        )
    )
    pipe.emit(
        RayActors(
            host="ray:http://127.0.0.1:8265",
            t=1004.0,
            actors=[RayActor(name="", class_name="TaskRunner", host="n1", pid=2521, role="driver")],
        )
    )
    out = write_snapshot(store, None, tmp_path / "s")
    doc = _strict_json(out / "snapshot.json")
    assert validate(doc) == []
    by_role = {m["verl_role"]: m for m in doc["process_map"]}
    worker = by_role["actor/rollout/ref"]
    assert (worker["pid"], worker["gpus"], worker["gpu_mem_mib"]) == (2834, [0], 1482.0)
    assert worker["method"] == "generate_sequences" and worker["rank"] == 0
    driver = by_role["TaskRunner (driver)"]
    assert (driver["pid"], driver["gpus"], driver["source"]) == (2521, [], "ray")
    assert doc["processes"][0]["verl_role"] == "actor/rollout/ref"
    assert "Without a GPU (Ray actors): 1 TaskRunner (driver)" in (out / "report.md").read_text()


def test_replayed_host_samples_carry_the_busiest_core_not_a_one_core_list() -> None:
    """The ring keeps the busiest core only: a rebuilt sample says so (cpu_max_core_pct), so a
    replayed node screen reads "busiest core 97 %", not "1 cores" (values constructed)."""
    store = Store(LIMITS)
    for k, cores in enumerate(([10.0, 97.0, 5.0], [20.0, 30.0, 40.0])):
        store.ingest(HostSample(host="h", t=1000.0 + k, cpu_pct=50.0, cpu_per_core=cores))
    first = [r for r in snap.recording_records(store) if isinstance(r, HostSample)][0]
    assert first.t == 1000.0 and first.cpu_per_core == [] and first.cpu_max_core_pct == 97.0
    replayed = Store(LIMITS)
    replayed.ingest(first)
    assert replayed.hosts["h"].history.values("cpu_max_core", 0.0) == [97.0]
