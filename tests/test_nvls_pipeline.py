"""NVLS all-reduce versus message size: the fill and drain of NCCL's NVLS chunk pipeline
(hardware/network.py NetworkModel.nvls_pipeline_factor).

Closed forms (chunk, channels, heads, factor) are asserted exactly from NCCL's rules
(src/enqueue.cc calcCollChunking, src/transport/nvls.cc, src/graph/search.cc); the
GB200 NVL72 rack sweep (validate/data/nccl, Together) within a stated tolerance.
"""

from __future__ import annotations

import statistics

import pytest

import nccl_logs as logs
from hardware.catalog import load_cluster
from hardware.cost import CostModel
from hardware.topology import ClusterLayout
from strategies.collectives.catalog import ALGORITHMS

MiB, GiB = 1 << 20, 1 << 30


def _model(preset: str, nodes: int, gpn: int, overrides: dict | None = None) -> CostModel:
    layout = ClusterLayout(load_cluster(preset, overrides or {}), nodes, gpn)
    return CostModel(layout, ALGORITHMS, fidelity="analytic")


def _plan(cost: CostModel, size: int, algorithm: str):
    group = tuple(range(cost.layout.world_size))
    return cost.plan_of("all_reduce", group, size, cost.collective("all_reduce", group, size,
                                                                   algorithm))


def test_nvl72_runs_24_channels_of_32_heads_and_cuts_the_chunk_for_mid_sizes():
    # one MNNVL domain of 72: 24 channels (SM100), min(NCCL_MAX_NVLS_ARITY 32, 72) heads;
    # concurrentOps 768: 64 KiB below 64 x 768 x 128 KiB, 32 KiB below 8 x 768 x 64 KiB,
    # 16 KiB below 2 x 768 x 32 KiB
    cost = _model("gb200-nvl72", 18, 4)
    net = cost.network
    plan = _plan(cost, 128 * MiB, "nvls")
    assert (net.nvls_channels(plan), net.nvls_heads(plan)) == (24, 32)
    chunks = {s: net.nvls_chunk_bytes(plan, s) for s in
              (32 * MiB, 128 * MiB, 512 * MiB, GiB, 8 * GiB, 32 * GiB)}
    assert chunks == {32 * MiB: 16384, 128 * MiB: 32768, 512 * MiB: 65536, GiB: 65536,
                      8 * GiB: 131072, 32 * GiB: 131072}
    phase = plan.phases[0]
    assert net.pipeline_factor(plan, phase, 128 * MiB) == 1.0 + 2 * 24 * 32 * 32768 / (128 * MiB)


def test_hopper_node_runs_16_channels_of_8_heads():
    cost = _model("dgx-h100", 1, 8)
    net = cost.network
    plan = _plan(cost, 32 * MiB, "nvls")
    assert (net.nvls_channels(plan), net.nvls_heads(plan)) == (16, 8)
    assert [net.nvls_chunk_bytes(plan, s) for s in (32 * MiB, 64 * MiB, GiB)] == [
        32768, 65536, 131072]
    # a message smaller than one loop step fills the pipeline with what it holds
    assert net.pipeline_factor(plan, plan.phases[0], MiB) == 3.0


def test_nvls_tree_caps_the_chunk_at_64_kib_from_four_domains():
    cost = _model("dgx-b200", 4, 8)
    net = cost.network
    plan = _plan(cost, 16 * GiB, "nvls_tree")
    assert (net.nvls_channels(plan), net.nvls_heads(plan)) == (32, 8)
    assert net.nvls_chunk_bytes(plan, 16 * GiB) == 65536
    assert net.nvls_chunk_bytes(plan, 8 * MiB) == 32768  # below 1 x 256 x 64 KiB
    two = _model("dgx-b200", 2, 8)
    assert two.network.nvls_chunk_bytes(_plan(two, 16 * GiB, "nvls_tree"), 16 * GiB) == 131072


def test_no_chunk_means_no_fill():
    cost = _model("gb200-nvl72", 18, 4, {"comm.nvls_chunk_bytes": 0})
    plan = _plan(cost, 128 * MiB, "nvls")
    assert cost.network.pipeline_factor(plan, plan.phases[0], 128 * MiB) == 1.0


def test_the_fill_is_priced_the_same_at_flow_fidelity():
    layout = ClusterLayout(load_cluster("dgx-h100"), 1, 8)
    group = tuple(range(8))
    analytic = CostModel(layout, ALGORITHMS, fidelity="analytic")
    flow = CostModel(layout, ALGORITHMS, fidelity="flow")
    for size in (4 * MiB, 64 * MiB):
        a = analytic.collective("all_reduce", group, size, "nvls").duration_ns
        f = flow.collective("all_reduce", group, size, "nvls").duration_ns
        assert abs(f - a) <= 0.01 * a


def _nvl72_rack_rows():
    rows = []
    for log, compared in logs.compared():
        if log.source == "together_gb200_nvl72_rack_allreduce" and compared:
            rows += compared
    return rows


def test_nvl72_rack_sweep_ramps_with_size():
    # Together's six single-rack NVLS sweeps (128 MiB - 32 GiB): with the affine NVLS
    # price they were +68 % at 128 MiB and 17 % median; the pipeline fill brings them to
    # +28..+30 % at 128 MiB and 12 % median. Tolerance: 35 % worst, 14 % median.
    rows = _nvl72_rack_rows()
    assert len(rows) == 54
    assert all(r.plan == "nvls/Simple" for r in rows)
    assert max(abs(r.error) for r in rows) < 0.35
    assert statistics.median(abs(r.error) for r in rows) < 0.14
    # and busbw still rises with size, as measured
    by_size = sorted({(r.size_bytes, r.simulated) for r in rows})
    assert all(a[1] < b[1] for a, b in zip(by_size, by_size[1:]))


@pytest.mark.parametrize("size", [16 * GiB, 32 * GiB])
def test_large_nvl72_sizes_still_fit(size):
    rows = [r for r in _nvl72_rack_rows() if r.size_bytes == size]
    assert rows and all(abs(r.error) < 0.05 for r in rows)
