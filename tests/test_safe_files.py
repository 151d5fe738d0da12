"""Safe files: non-regular log paths refused, big log catch-up paced, snapshots replaced safely."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from verl_top.cli import app_parser
from verl_top.inputs import InputError, build_inputs
from verl_top.sources.local import LocalFollowSource
from verl_top.sources.pipeline import Pipeline
from verl_top.store import Store


@pytest.mark.timeout(10)
@pytest.mark.parametrize("option", ["--verl-log", "--nccl-log"])
def test_a_fifo_log_path_is_refused_with_a_message(
    tmp_path: Path, option: str, h200_trace: Path
) -> None:
    fifo = tmp_path / "driver.log"
    os.mkfifo(fifo)
    args = app_parser().parse_args(["--demo", option, str(fifo)])
    with pytest.raises(InputError) as err:
        build_inputs(args)
    assert str(err.value) == (
        f"{fifo}: not a regular file (a FIFO) (given to {option}); give the log file itself"
    )


def test_a_directory_log_path_is_refused(tmp_path: Path, h200_trace: Path) -> None:
    args = app_parser().parse_args(["--demo", "--verl-log", str(tmp_path)])
    with pytest.raises(InputError, match=r"not a regular file \(a directory\)"):
        build_inputs(args)


async def test_big_log_catch_up_yields_to_the_event_loop(tmp_path: Path) -> None:
    """A 4 MB finished log is read in slices: another task runs many times meanwhile (before,
    the whole 8 MiB poll was parsed in one go: one turn). Timing figures: benchmarks/catchup.py."""
    log = tmp_path / "driver.log"
    pairs = " - ".join(f"actor/m_{k:03d}:{k / 1000:.3f}" for k in range(100))
    log.write_text("".join(f"step:{s} - {pairs}\n" for s in range(2000)))
    turns = 0
    running = True

    async def other() -> None:
        nonlocal turns
        while running:
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(other())
    store = Store()
    await LocalFollowSource([("verl", str(log), True)], until_eof=True).run(Pipeline(store).emit)
    running = False
    await task
    assert len(store.steps) == 2000
    assert turns >= 8


# -- snapshot -o DIR --force ------------------------------------------------------------------


def _store() -> Store:
    from verl_top.model import GpuSample

    store = Store()
    for i in range(3):
        store.ingest(GpuSample(host="n1", t=1000.0 + i, index=0, util_gpu=50.0))
    return store


def test_force_in_a_folder_with_other_files_refuses_and_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_top.export.snapshot import SnapshotError, write_snapshot

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('mine')")
    (project / "data").mkdir()
    (project / "data" / "x.parquet").write_bytes(b"\0" * 10)
    monkeypatch.chdir(project)
    with pytest.raises(SnapshotError) as err:
        write_snapshot(_store(), None, ".", force=True)
    assert "holds files verl-top did not write (data, train.py)" in str(err.value)
    assert sorted(p.name for p in project.iterdir()) == ["data", "train.py"]
    assert (project / "data" / "x.parquet").stat().st_size == 10
    assert [p.name for p in tmp_path.iterdir()] == ["project"]  # no temporary left


def test_force_replaces_a_previous_snapshot_but_not_one_with_added_files(tmp_path: Path) -> None:
    from verl_top.export.snapshot import MANIFEST_FILE, SnapshotError, write_snapshot

    target = tmp_path / "snap"
    write_snapshot(_store(), None, target)
    manifest = (target / MANIFEST_FILE).read_text()
    assert '"report.md"' in manifest and '"snapshot.json"' in manifest
    write_snapshot(_store(), None, target, force=True)  # verl-top's own bundle: replaced
    (target / "notes.txt").write_text("my notes")
    with pytest.raises(SnapshotError, match=r"did not write \(notes.txt\)"):
        write_snapshot(_store(), None, target, force=True)
    assert (target / "notes.txt").read_text() == "my notes"
    (target / "notes.txt").unlink()
    (target / MANIFEST_FILE).write_text('{"kind": "something else", "files": ["a"]}')
    with pytest.raises(SnapshotError, match="did not write"):  # a forged or foreign manifest
        write_snapshot(_store(), None, target, force=True)


def test_an_export_killed_by_sigterm_leaves_no_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from verl_top.export import snapshot

    real_fill = snapshot._fill

    def fill_then_die(tmp: Path, *args: object) -> None:
        real_fill(tmp, *args)
        assert any(tmp.iterdir())  # half a bundle exists now
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(snapshot, "_fill", fill_then_die)
    with pytest.raises(SystemExit):
        snapshot.write_snapshot(_store(), None, tmp_path / "snap")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_diagnose_json_lists_refused_input_per_host(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    rec = tmp_path / "hostile.ndjson"
    lines = [{"v": 1, "type": "hello", "host": "n1", "t": 1000.0, "gpus": [{"index": 0}]}]
    for i in range(5):
        lines.append({"v": 1, "type": "gpu", "host": "n1", "t": 1001.0 + i, "index": 0})
    lines.append({"v": 1, "type": "gpu", "host": "n1", "t": 1006.0, "index": 1.5})
    lines.append({"v": 1, "type": "gpu", "host": "n1", "t": 1e300, "index": 0})
    lines.append({"v": 1, "type": "gpu", "host": "n1", "t": 1007.0, "index": 0, "temp_c": "hot"})
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"v":1,"type":"gpu","host":"n1","t":NaN}\n'
    rec.write_text(text + "[" * 10_000 + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "verl_top", "diagnose", "--replay", str(rec), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The GPU samples that got through carry no value: nothing to judge (exit 3), counts still listed.
    assert out.returncode == 3, out.stderr
    dropped = json.loads(out.stdout)["inputs"]["dropped"]
    assert dropped["n1"] == {
        "drop:gpu.index": 1,
        "drop:gpu.t": 2,  # 1e300 and NaN (not a number once parsed)
        "field:gpu.temp_c": 1,
    }
    assert dropped[""] == {"json": 1}  # no host to name: the line is not JSON


async def test_replay_streams_its_recording(tmp_path: Path) -> None:
    """A replay holds one line at a time, not the recording (20 000 records here)."""
    import gzip
    import tracemalloc

    from verl_top.model import GpuSample
    from verl_top.protocol import encode
    from verl_top.sources.replay import ReplayControl, ReplaySource

    rec = tmp_path / "big.ndjson.gz"
    with gzip.open(rec, "wt") as fh:
        for i in range(20_000):
            g = GpuSample(host="n1", t=1000.0 + i * 0.01, index=i % 8, util_gpu=50.0, temp_c=60.0)
            fh.write(encode(g) + "\n")
        fh.write("x" * 100 + "\n")  # a bad line at the end is counted, not fatal
    seen = 0

    def emit(record: object) -> None:
        nonlocal seen
        seen += 1

    tracemalloc.start()
    source = ReplaySource(rec, ReplayControl(speed=1e9))
    await source.run(emit)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert source.records is None  # nothing was loaded up front
    assert seen == 20_000 + 1  # every record, plus one drop report
    assert source.decoder.drops == {("", "json"): 1}
    assert peak < 4 * 2**20  # the 20 000 records as objects take ~15 MB


# -- snapshot --force: name, type and size (issue 31) -----------------------------------------


def _forge(target: Path, files: list[dict]) -> None:
    from verl_top.export.snapshot import MANIFEST_FILE, MANIFEST_KIND

    target.mkdir(exist_ok=True)
    doc = {"kind": MANIFEST_KIND, "tool": "verl-top", "files": files}
    (target / MANIFEST_FILE).write_text(json.dumps(doc))


def test_a_forged_manifest_naming_a_directory_deletes_nothing(tmp_path: Path) -> None:
    """Before: a manifest naming report.md made --force delete a *directory* of that name."""
    from verl_top.export.snapshot import SnapshotError, write_snapshot

    target = tmp_path / "snap"
    (target / "report.md").mkdir(parents=True)
    (target / "report.md" / "thesis.tex").write_text("years of work")
    _forge(target, [{"name": "report.md", "type": "file", "size": 4096}])
    with pytest.raises(SnapshotError, match=r"did not write \(report.md\)"):
        write_snapshot(_store(), None, target, force=True)
    assert (target / "report.md" / "thesis.tex").read_text() == "years of work"


def test_a_manifest_naming_a_file_of_another_size_deletes_nothing(tmp_path: Path) -> None:
    from verl_top.export.snapshot import SnapshotError, write_snapshot

    target = tmp_path / "snap"
    target.mkdir()
    (target / "report.md").write_text("my own report, not verl-top's")
    _forge(target, [{"name": "report.md", "type": "file", "size": 10}])
    with pytest.raises(SnapshotError, match=r"did not write \(report.md\)"):
        write_snapshot(_store(), None, target, force=True)
    assert (target / "report.md").read_text() == "my own report, not verl-top's"
    # A manifest of the old kind (names only) vouches for nothing either.
    from verl_top.export.snapshot import MANIFEST_FILE

    (target / MANIFEST_FILE).write_text(
        json.dumps({"kind": "verl-top.snapshot-manifest/1", "files": ["report.md"]})
    )
    with pytest.raises(SnapshotError, match="did not write"):
        write_snapshot(_store(), None, target, force=True)
    assert (target / "report.md").exists()


def test_links_are_never_followed_nor_left_behind(tmp_path: Path) -> None:
    """A target that is a symlink, or a bundle file that is one, is refused; before, a linked
    target was renamed and left as .NAME.old-* next to it."""
    from verl_top.export.snapshot import MANIFEST_FILE, SnapshotError, write_snapshot

    real = tmp_path / "real"
    write_snapshot(_store(), None, real)
    link = tmp_path / "snap"
    link.symlink_to(real)
    with pytest.raises(SnapshotError, match="is a symbolic link"):
        write_snapshot(_store(), None, link, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real", "snap"]
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    (real / "report.md").unlink()
    (real / "report.md").symlink_to(secret)  # listed name, but a link now
    with pytest.raises(SnapshotError, match=r"did not write \(report.md\)"):
        write_snapshot(_store(), None, real, force=True)
    assert secret.read_text() == "s3cret" and (real / MANIFEST_FILE).exists()


def test_force_replaces_its_own_bundle_and_leaves_nothing_behind(tmp_path: Path) -> None:
    from verl_top.export.snapshot import MANIFEST_FILE, write_snapshot

    target = tmp_path / "snap"
    write_snapshot(_store(), None, target)
    listed = json.loads((target / MANIFEST_FILE).read_text())["files"]
    assert all(
        f["type"] == "file" and f["size"] == (target / f["name"]).stat().st_size for f in listed
    )
    write_snapshot(_store(), None, target, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]  # no .snap.old-* nor .tmp-*
