"""nvidia-smi topo -m parser and the expected-bandwidth table."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_top.model import ProbeResult
from verl_top.nccl.expected import LINKS, expected_busbw, fill_expectation, infer_link, ratio
from verl_top.nccl.topo import nvlink_connected, parse_topo, worst_link

FIX = Path(__file__).parent / "fixtures" / "nccl"


def test_real_single_gpu_topo() -> None:
    topo = parse_topo((FIX / "smi_topo_1xH200.txt").read_text())
    assert topo.devices == ["GPU0"] and topo.gpus == [0]
    assert topo.link(0, 0) == "X"
    assert topo.cpu_affinity == {"GPU0": "0-15"}
    assert topo.numa_affinity == {"GPU0": "0"}
    assert topo.gpu_numa_id == {"GPU0": None}
    assert not nvlink_connected(topo)  # one GPU: no link to speak of


def test_constructed_eight_gpu_four_nic_topo() -> None:
    topo = parse_topo((FIX / "smi_topo_8xH200_4nic_CONSTRUCTED.txt").read_text())
    assert topo.gpus == list(range(8))
    assert topo.nics == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert topo.link(0, 7) == "NV18" and topo.link(3, 3) == "X"
    assert topo.link(0, "NIC0") == "PXB" and topo.link("NIC0", 0) == "PXB"
    assert topo.link(0, "NIC3") == "SYS"
    assert topo.cpu_affinity["GPU5"] == "56-111,168-223" and topo.numa_affinity["GPU5"] == "1"
    assert "NIC0" not in topo.cpu_affinity
    assert nvlink_connected(topo) and nvlink_connected(topo, [1, 6])
    assert worst_link(topo) == "NV18"


def test_pcie_only_topo_is_not_nvlink() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-7\t0\nGPU1\tPHB\t X \t0-7\t0\n"
    topo = parse_topo(text)
    assert not nvlink_connected(topo) and worst_link(topo) == "PHB"
    assert infer_link("NVIDIA H100 PCIe", topo=topo) == "pcie5"


def test_expected_table() -> None:
    assert expected_busbw("nvlink4", "all_reduce", 8).gbs == 480
    assert expected_busbw("nvlink4", "all_gather", 8).gbs == 370
    assert expected_busbw("nvlink3", "all_reduce", 8).gbs == 230
    assert expected_busbw("ib_ndr", "all_reduce", 16, nics=8).gbs == 8 * 47
    assert expected_busbw("ib_hdr", "all_reduce", 16).gbs == 23
    assert expected_busbw("pcie4", "all_reduce", 2).rule_of_thumb
    assert expected_busbw("socket", "all_reduce", 16) is None  # flag the transport instead
    assert expected_busbw("nvlink4", "all_reduce", 1) is None  # one rank: no bus
    assert all(spec.source for spec in LINKS.values())


def test_ratio_and_fill() -> None:
    exp = expected_busbw("nvlink4", "all_reduce", 8)
    assert ratio(240.0, exp) == pytest.approx(0.5)
    assert ratio(None, exp) is None and ratio(1.0, None) is None
    topo = parse_topo((FIX / "smi_topo_8xH200_4nic_CONSTRUCTED.txt").read_text())
    p = ProbeResult(collective="all_reduce", nranks=8, scope="intra", busbw_max_gbs=470.0)
    fill_expectation(p, gpu_name="NVIDIA H200", topo=topo)
    assert (p.link, p.expected_gbs) == ("nvlink4", 480.0)
    inter = ProbeResult(collective="all_reduce", nranks=16, scope="inter", transport="Socket")
    fill_expectation(inter, gpu_name="NVIDIA H200")
    # Sockets have no expectation of their own: the gap is to what RDMA would carry (one NDR
    # NIC assumed when nothing says how many GPUs or NICs a node has), marked as an assumption.
    assert (inter.link, inter.expected_gbs) == ("socket", pytest.approx(47.0))
    assert inter.expected_source.startswith("with RDMA: assumed")
    ib = ProbeResult(collective="all_reduce", nranks=16, scope="inter", transport="IB+GDRDMA")
    fill_expectation(ib, gpu_name="NVIDIA H200", nics=topo and len(topo.nics))
    assert (ib.link, ib.expected_gbs) == ("ib_ndr", 4 * 47)
