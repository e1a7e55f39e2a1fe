"""Which link a GPU plan's transfers cross (popviz/compiler/gpu_fabric.py): ranks laid out
pipeline-outermost as Megatron-LM and torchtitan lay them out, 8 GPUs per DGX server,
NVLink inside it, the network (one NIC per GPU) between servers."""

from __future__ import annotations

import pytest

from popviz.compiler import compile
from popviz.compiler.gpu_fabric import Fabric
from popviz.options import Options
from popviz.target.gpu import A100_80GB, H100_PCIE, H100_SXM
from tooling.gpu_programs import gpu_program


def test_one_server_is_all_nvlink() -> None:
    f = Fabric(A100_80GB, pipeline_gpus=8, replicas=1)
    assert [f.p2p_link(g, g + 1) for g in range(7)] == ["nvlink"] * 7
    assert f.slowest() == "nvlink"


def test_stages_of_eight_replicas_talk_over_the_network() -> None:
    """PP 4 x DP 8 on 32 GPUs: each stage's replicas fill a server (ranks 8s .. 8s + 7),
    so every activation crosses servers and every all-reduce stays inside one."""
    f = Fabric(H100_SXM, pipeline_gpus=4, replicas=8)
    assert [f.p2p_link(g, g + 1) for g in range(3)] == ["network"] * 3
    assert [f.allreduce_link(g) for g in range(4)] == ["nvlink"] * 4
    assert f.slowest() == "network"
    # PP 2 x DP 4: both stages in one server
    assert Fabric(H100_SXM, 2, 4).slowest() == "nvlink"
    # one stage, 16 replicas: the ring spans two servers
    assert Fabric(H100_SXM, 1, 16).allreduce_link(0) == "network"
    # PCIe cards: NVLink pairs, PCIe between the pairs of one server
    assert Fabric(H100_PCIE, 1, 4).allreduce_link(0) == "pcie"


def test_network_p2p_runs_at_the_nic_rate() -> None:
    """A100 DGX: one 200 Gb/s HDR NIC per GPU, 25 GB/s, below NCCL's p2p ceiling over
    NVLink (300 GB/s x p2p_efficiency, 47 GB/s): 100 MB take 4 ms plus the latency."""
    gpu = A100_80GB
    assert gpu.network_bytes_per_s == pytest.approx(25e9)
    assert gpu.p2p_ns(100e6, "network") == pytest.approx((gpu.p2p_latency_s + 4e-3) * 1e9)
    assert gpu.p2p_ns(100e6, "network") > gpu.p2p_ns(100e6, "nvlink")
    with pytest.raises(ValueError, match="unknown GPU link"):
        gpu.p2p_ns(1, "carrier pigeon")


def test_a_plan_across_servers_sends_over_the_network() -> None:
    program = gpu_program("pipe", 256, 32)
    plans = {dp: compile(program, Options(target="a100", splits=["stage1"], num_ipus=2,
                                          replication_factor=dp, gradient_accumulation=4))
             for dp in (4, 8)}
    assert plans[4].meta["gpu"]["link"] == "nvlink"
    assert plans[8].meta["gpu"]["link"] == "network"

    def p2p(report: object) -> float:
        ex = report.tables["exchange"]  # type: ignore[attr-defined]
        sends = ex[ex["kind"] == "activation"]
        return float((sends["end"] - sends["start"]).mean())

    assert p2p(plans[8]) > p2p(plans[4])
