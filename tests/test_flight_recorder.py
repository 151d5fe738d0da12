"""Flight Recorder dumps: real ones made by PyTorch 2.13 (tests/fixtures/flight_recorder/, see
make_dumps.py there), read safely, compared across ranks.

Expected, from what the dumps' program did before reading them with the tool: both ranks ran
collectives 1-4 (three all_reduce, one broadcast); rank 0 alone entered collective 5
(all_reduce of a 3-element tensor, line 35 of make_dumps.py); so rank 1's last is 4 and it
never joined 5.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from verl_top.nccl.flight_recorder import (
    FlightRecorderError,
    compare,
    decode,
    main,
    parse,
    read_dump,
    report,
)

FR = Path(__file__).resolve().parent / "fixtures" / "flight_recorder"


@pytest.mark.parametrize("ext", ["pkl", "json"])
def test_real_dumps_give_each_ranks_last_collective_and_who_never_joined(ext: str) -> None:
    dumps = [read_dump(FR / f"fr_rank_{r}.{ext}") for r in (0, 1)]
    assert [d.rank for d in dumps] == [0, 1] and dumps[0].version == "2.10"
    cmp = compare(dumps)
    last = {x.rank: (x.entry.seq, x.entry.op, x.entry.sizes) for x in cmp.last}
    assert last == {0: (5, "gloo:all_reduce", "[[3]]"), 1: (4, "gloo:broadcast", "[[4]]")}
    assert cmp.behind == {"0": (5, "gloo:all_reduce", [0], {1: 4})}
    assert cmp.mismatched == []
    text = "\n".join(report(dumps))
    assert "group 0: rank 0 entered collective 5 (gloo:all_reduce); never joined it: rank 1" in text
    if ext == "pkl":  # the pickle keeps the Python stack of each collective
        assert "make_dumps.py:35" in text


def test_a_pickle_that_names_any_global_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple:
            return (print, ("this must never run",))

    evil = tmp_path / "nccl_trace_rank_0"
    evil.write_bytes(pickle.dumps({"entries": [Boom()]}))
    with pytest.raises(FlightRecorderError, match="refused to load builtins.print"):
        read_dump(evil)


def test_bad_input_gets_a_specific_message(tmp_path: Path) -> None:
    real = (FR / "fr_rank_0.pkl").read_bytes()
    cut = tmp_path / "trace_rank_3"
    cut.write_bytes(real[: len(real) // 2])
    with pytest.raises(FlightRecorderError, match="trace_rank_3: not a Flight Recorder dump"):
        read_dump(cut)
    big = tmp_path / "trace_rank_4"
    big.write_bytes(real)
    with pytest.raises(FlightRecorderError, match="larger than 0 MiB"):
        read_dump(big, max_bytes=1000)
    deep = tmp_path / "trace_rank_5.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(FlightRecorderError, match="deeper"):
        read_dump(deep)
    with pytest.raises(FlightRecorderError, match="no 'entries' list"):
        parse(decode(pickle.dumps({"version": "2.5"})), "x")


def test_ranks_that_ran_different_collectives_under_one_number_are_a_desync() -> None:
    d0, d1 = (read_dump(FR / f"fr_rank_{r}.pkl") for r in (0, 1))
    # Rank 1's collective 4 relabelled as an all_reduce: same number, different op (constructed).
    d1.entries[-1] = type(d1.entries[-1])(**{**d1.entries[-1].__dict__, "op": "gloo:all_reduce"})
    assert compare([d0, d1]).mismatched == [
        "process group 0 collective 4: rank 0 gloo:broadcast, rank 1 gloo:all_reduce"
    ]


def test_cli_prints_the_comparison_and_says_how_to_get_dumps(capsys, tmp_path: Path) -> None:
    assert main([str(FR / "fr_rank_0.pkl"), str(FR / "fr_rank_1.pkl")]) == 0
    assert "never joined it: rank 1 (last 4)" in capsys.readouterr().out
    junk = tmp_path / "nccl_trace_rank_0"
    junk.write_text("hello")
    assert main([str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "unreadable:" in captured.out and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in captured.err
