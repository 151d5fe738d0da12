"""nvidia-smi CSV parsing on the real H200 capture and on synthetic multi-GPU output."""

from __future__ import annotations

from pathlib import Path

from verl_top.agent import backends, smi
from verl_top.protocol import from_dict

REAL_CSV = Path(__file__).parent / "fixtures" / "agent" / "smi_query.csv"


def fields(row: dict) -> dict:
    return dict(smi.smi_gpu_fields(row))


def test_real_capture_with_header_and_units() -> None:
    rows = smi.parse_smi_csv(REAL_CSV.read_text())
    assert len(rows) == 1  # the "$ nvidia-smi ..." prompt line and the header are not data
    row = rows[0]
    assert row["uuid"] == "GPU-a7f64ac6-5bbd-7bfa-1353-f73a583799d6"
    assert row["name"] == "NVIDIA H200" and row["pci.bus_id"] == "00000000:00:06.0"
    f = fields(row)
    assert f == {
        "index": 0,
        "util_gpu": 0,
        "util_mem": 0,
        "mem_used_mib": 0,
        "mem_total_mib": 143771,
        "power_w": 117.9,
        "power_limit_w": 700.0,
        "temp_c": 37,
        "sm_mhz": 525,  # header "clocks.current.sm [MHz]" maps to the query name clocks.sm
        "mem_mhz": 3201,
        "clock_reasons": 0x1,  # hex bitmask: GPU idle
        "lost": False,
        "label": "",
    }


def test_real_values_without_units_or_header() -> None:
    """The same real row as the agent requests it: noheader, nounits, its own column list."""
    line = (
        "0, GPU-a7f64ac6-5bbd-7bfa-1353-f73a583799d6, NVIDIA H200, 00000000:00:06.0, 0, 0, 0, "
        "143771, 117.90, 700.00, 37, 525, 3201, 0x0000000000000001"
    )
    (row,) = smi.parse_smi_csv(line, smi.SMI_QUERY)
    with_units = fields(smi.parse_smi_csv(REAL_CSV.read_text())[0])
    assert fields(row) == with_units


def test_synthetic_multi_gpu_with_missing_values() -> None:
    text = "\n".join(
        [
            "0, GPU-0, NVIDIA H200, 00000000:18:00.0, 98, 45, 120000, 143771, 695.20, 700.00, 66, 1410, 3201, 0x0000000000000004",
            "1, GPU-1, NVIDIA H200, 00000000:2A:00.0, [N/A], [N/A], 120000, 143771, [Not Supported], 700.00, 60, 1980, 3201, 0x0000000000000000",
            "2, GPU-2, NVIDIA H200, 00000000:3A:00.0, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]",
            "garbage line",
            "3, GPU-3, NVIDIA H200, 00000000:5D:00.0, 12, 3, 5000, 143771, 250.00, 700.00, 45, 1980, 3201, 0x00000000000000A0",
        ]
    )
    rows = smi.parse_smi_csv(text, smi.SMI_QUERY)
    got = {f["index"]: f for f in map(fields, rows)}
    assert sorted(got) == [0, 1, 2, 3]
    assert got[0]["clock_reasons"] == 0x4 and got[0]["power_w"] == 695.2
    assert "util_gpu" not in got[1] and "power_w" not in got[1]  # [N/A] / [Not Supported]
    assert got[1]["temp_c"] == 60
    assert got[2] == {"index": 2, "lost": True, "label": ""}
    assert got[3]["clock_reasons"] == 0xA0
    for f in got.values():  # each becomes a valid gpu record
        rec = from_dict({"v": 1, "type": "gpu", "host": "n", "t": 1.0, **f})
        assert rec.index == f["index"]


def test_header_without_units() -> None:
    text = "index, uuid, utilization.gpu, memory.used\n0, GPU-0, 42, 1000\n1, GPU-1, 7, 2000\n"
    rows = smi.parse_smi_csv(text)
    assert [fields(r)["util_gpu"] for r in rows] == [42, 7]
    assert [fields(r)["mem_used_mib"] for r in rows] == [1000, 2000]


def test_smi_values() -> None:
    assert smi.smi_value("117.90 W") == 117.9
    assert smi.smi_value("0 %") == 0
    assert smi.smi_value("3201 MHz") == 3201
    assert smi.smi_value("0x0000000000000001") == 1
    assert smi.smi_value("[N/A]") is None and smi.smi_value("N/A") is None
    assert smi.smi_value("[Not Supported]") is None and smi.smi_value("") is None


def test_smi_backend_with_runner_and_errors() -> None:
    out = {
        "gpu": "0, GPU-0, NVIDIA H200, 00000000:18:00.0, 5, 1, 10, 143771, 100.0, 700.0, 40, 1980, 3201, 0x1",
        "apps": "111, 2048, GPU-0\n222, [N/A], GPU-0\n333, 5, GPU-unknown",
    }

    def runner(args: list[str]) -> str:
        q = args[0]
        if "driver_version" in q:
            return out["gpu"] + ", 580.159.04"
        return out["apps"] if q.startswith("--query-compute-apps") else out["gpu"]

    b = smi.SmiBackend(exe="/bin/true", runner=runner)
    assert b.driver == "580.159.04" and b.gpus[0]["power_limit_w"] == 700.0
    assert dict(b.sample(0.0)[0])["util_gpu"] == 5
    assert b.processes() == [(111, 0, 2048.0), (222, 0, None)]
    out["gpu"] = "Failed to initialize NVML: Driver/library version mismatch"
    assert b.sample(0.0) == []
    assert b.failing == backends.MISMATCH_MSG
