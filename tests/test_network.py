"""Network models: closed forms, flow = analytic without contention, fair sharing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware.catalog import load_cluster
from hardware.flow import FlowNetwork, FlowRequest, max_min_rates
from hardware.network import NetworkModel
from hardware.topology import ClusterLayout
from sim.engine import Engine
from hardware.cost import CostModel, RankConditions
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp, Program

NO_BASE = {f"comm.base_latency_us.ring.{p}": 0.0 for p in ("LL", "LL128", "Simple")}


def run_collectives(cluster, nodes, gpn, ops_by_group, fidelity):
    """Run collectives concurrently (one per group) and return {key: duration_ns}."""
    layout = ClusterLayout(cluster, nodes, gpn)
    ops = {}
    for index, (kind, group, size, algorithm) in enumerate(ops_by_group):
        op = CollectiveOp(name=f"c{index}", key=f"c{index}", kind=kind, group=tuple(group),
                          size_bytes=size, algorithm=algorithm,
                          root=tuple(group)[0] if kind in ("broadcast", "reduce") else None)
        for rank in group:
            ops.setdefault(rank, []).append(op)
    program = Program(ops_by_rank=ops, world_size=layout.world_size)
    result = Engine(program, CostModel(layout, ALGORITHMS, fidelity=fidelity)).run()
    df = result.timeline.to_dataframe()
    return {name: int(g.end_ns.max() - g.start_ns.min()) for name, g in df.groupby("op")}, result


# --------------------------------------------------------------- closed forms
def test_ring_all_reduce_equals_closed_form_to_the_nanosecond():
    """T = 2(n-1)*alpha + 2(n-1)/n * S/B with alpha the NVLink hop latency (Simple)
    and B the NVLink payload rate; base latency set to 0 so only the formula remains."""
    cluster = load_cluster("dgx-h100", NO_BASE)
    n = 8
    alpha_ns = cluster.comm.hop_latency_s["nvlink"]["Simple"] * 1e9
    bandwidth = cluster.scale_up.nvlink_bytes_per_s * cluster.scale_up.link_efficiency
    # S chosen so that S/n/B is a whole number of ns: the formula has no rounding.
    per_step_ns = 250_000
    size = int(n * bandwidth * per_step_ns / 1e9)
    assert size == n * bandwidth * per_step_ns / 1e9
    expected_ns = 2 * (n - 1) * alpha_ns + 2 * (n - 1) / n * size / bandwidth * 1e9
    durations, _ = run_collectives(cluster, 1, n, [("all_reduce", range(n), size, "ring")],
                                   "analytic")
    assert durations["c0"] == round(expected_ns)
    assert round(expected_ns) == pytest.approx(expected_ns, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(min_value=1 << 10, max_value=1 << 34),
       n=st.integers(min_value=2, max_value=8))
def test_ring_all_reduce_closed_form_any_size(size, n):
    """For any size the engine is the closed form plus base latency, up to the
    rounding of each of its 5 terms to whole ns (one per term, documented)."""
    cluster = load_cluster("dgx-h100")
    size -= size % n
    alpha = cluster.comm.hop_latency_s["nvlink"]["Simple"]
    base = cluster.comm.base_latency_s["ring"]["Simple"]
    bandwidth = cluster.scale_up.nvlink_bytes_per_s * cluster.scale_up.link_efficiency
    expected_ns = (base + 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth) * 1e9
    layout = ClusterLayout(cluster, 1, n)
    plan = CostModel(layout, ALGORITHMS).collective_plan("all_reduce", range(n), size, "ring",
                                                         "Simple")
    actual = NetworkModel(layout, cluster.comm).plan_time_ns(plan)
    assert 0 <= actual - expected_ns <= 5


def test_two_node_ring_is_bounded_by_nvlink_or_the_nics():
    """Across nodes, a ring step is limited by min(NVLink, 8 NICs) and its latency
    counts 2N network hops and the rest NVLink hops (NCCL's ring latency model)."""
    cluster = load_cluster("dgx-h100", NO_BASE)
    layout = ClusterLayout(cluster, 2, 8)
    n, size = 16, 1 << 30
    plan = CostModel(layout, ALGORITHMS).collective_plan("all_reduce", range(n), size, "ring",
                                                         "Simple")
    nvlink = cluster.scale_up.nvlink_bytes_per_s * cluster.scale_up.link_efficiency
    nics = 8 * cluster.nic.bytes_per_s * cluster.nic.link_efficiency
    hop = cluster.comm.hop_latency_s
    latency = 2 * (13 * hop["nvlink"]["Simple"] + 2 * (hop["network"]["Simple"]
                                                       + cluster.fabric.switch_hop_latency_s))
    expected = latency + 2 * (n - 1) / n * size / min(nvlink, nics)
    assert NetworkModel(layout, cluster.comm).plan_time_s(plan) == pytest.approx(expected,
                                                                                 rel=1e-12)


# ------------------------------------------------------ flow = analytic alone
@pytest.mark.parametrize("preset,nodes,gpn,kind,algorithm", [
    ("dgx-h100", 1, 8, "all_reduce", "ring"),
    ("dgx-h100", 1, 8, "all_reduce", "nvls"),
    ("dgx-h100", 2, 8, "all_reduce", "ring"),
    ("dgx-h100", 4, 8, "all_reduce", "tree"),
    ("dgx-h100", 4, 8, "all_reduce", "hierarchical"),
    ("dgx-h100", 2, 8, "all_reduce", "nvls_tree"),
    ("dgx-b200", 8, 8, "all_reduce", "nvls_tree"),
    ("dgx-h100", 64, 8, "all_reduce", "ring"),
    ("dgx-h100", 4, 8, "all_gather", "ring"),
    ("dgx-h100", 4, 8, "reduce_scatter", "ring"),
    ("dgx-h100", 4, 8, "broadcast", "ring"),
    ("dgx-h100", 4, 8, "sendrecv", "direct"),
    ("dgx-h100", 4, 8, "alltoall", "direct"),
    ("dgx-a100", 3, 8, "all_reduce", "auto"),
    ("dgx-h100-roce", 40, 8, "all_reduce", "ring"),
    ("gb200-nvl72", 36, 4, "all_reduce", "ring"),
    ("gcp-a3-mega", 2, 8, "all_reduce", "auto"),
])
@pytest.mark.parametrize("size", [4096, 1 << 20, 1 << 30])
def test_flow_equals_analytic_when_nothing_contends(preset, nodes, gpn, kind, algorithm, size):
    cluster = load_cluster(preset)
    group = range(nodes * gpn)
    analytic, _ = run_collectives(cluster, nodes, gpn, [(kind, group, size, algorithm)],
                                  "analytic")
    flow, _ = run_collectives(cluster, nodes, gpn, [(kind, group, size, algorithm)], "flow")
    assert flow == analytic


# ------------------------------------------------------------- fair sharing
def test_two_flows_over_one_link_get_half_each():
    capacity = np.array([100e9])
    rates = max_min_rates(np.array([0, 1]), np.array([0, 0]), np.array([1.0, 1.0]), 2, capacity)
    assert rates.tolist() == [50e9, 50e9]

    env = simpy.Environment()
    network = FlowNetwork(env, capacity)
    finished = {}

    def start(name, delay_ns, payload):
        yield env.timeout(delay_ns)
        yield network.transfer([FlowRequest((0,), (1.0,), payload)])
        finished[name] = env.now

    env.process(start("a", 0, 1e9))
    env.process(start("b", 0, 1e9))
    env.run()
    # 2 GB through 100 GB/s: both end together at 20 ms.
    assert finished == {"a": 20_000_000, "b": 20_000_000}


def test_max_min_frees_capacity_a_bottlenecked_flow_cannot_use():
    """Classic example: flow 0 crosses links A and B, flow 1 only A, flow 2 only B;
    A has capacity 10, B 4. Fair share on B is 2 (flows 0 and 2); flow 1 then
    takes the 8 left on A."""
    rates = max_min_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]),
                          np.ones(4), 3, np.array([10.0, 4.0]))
    assert rates.tolist() == [2.0, 8.0, 2.0]


def test_a_flow_finishing_early_speeds_up_the_other():
    env = simpy.Environment()
    network = FlowNetwork(env, np.array([1e9]))  # 1 GB/s = 1 byte/ns
    ends = {}

    def flow(name, payload):
        yield network.transfer([FlowRequest((0,), (1.0,), payload)])
        ends[name] = env.now

    env.process(flow("short", 1000))
    env.process(flow("long", 3000))
    env.run()
    # Both at 0.5 B/ns until short ends at 2000 ns; long then has 2000 B left at 1 B/ns.
    assert ends == {"short": 2000, "long": 4000}


def test_two_rings_sharing_a_nic_slow_each_other_down_only_at_flow_fidelity():
    """Two 2-rank rings whose inter-node hop crosses the one NIC of each node."""
    cluster = load_cluster("dgx-h100", {"nic.count_per_node": 1, **NO_BASE})
    size = 1 << 30
    collectives = [("all_reduce", (0, 2), size, "ring"), ("all_reduce", (1, 3), size, "ring")]
    alone, _ = run_collectives(cluster, 2, 2, collectives[:1], "flow")
    both_flow, _ = run_collectives(cluster, 2, 2, collectives, "flow")
    both_analytic, _ = run_collectives(cluster, 2, 2, collectives, "analytic")
    nic = cluster.nic.bytes_per_s * cluster.nic.link_efficiency
    bandwidth_ns = 2 * (1 / 2) * size / nic * 1e9  # 2(n-1)/n * S / B with n = 2
    assert both_analytic["c0"] == alone["c0"]
    for key in ("c0", "c1"):
        assert both_flow[key] - alone["c0"] == pytest.approx(bandwidth_ns, rel=1e-6)


def test_oversubscribed_uplink_is_shared_by_flows_leaving_the_leaf():
    """4:1 oversubscription, 2 nodes per leaf: 2 nodes' traffic crossing to the
    other leaf shares an uplink of half a NIC (2 NICs / 4)."""
    overrides = {"nic.count_per_node": 1, "fabric.topology": "fat-tree",
                 "fabric.nodes_per_leaf": 2, "fabric.oversubscription": 4.0, **NO_BASE}
    cluster = load_cluster("dgx-h100", overrides)
    layout = ClusterLayout(cluster, 4, 1)
    up = layout.path(0, 2).links
    assert len(up) == 4 and layout.path(0, 1).links == (
        layout.nic_out_link(0, 0), layout.nic_in_link(1, 0))
    size = 1 << 28
    pairs = [("sendrecv", (0, 2), size, "direct"), ("sendrecv", (1, 3), size, "direct")]
    alone, _ = run_collectives(cluster, 4, 1, pairs[:1], "flow")
    both, _ = run_collectives(cluster, 4, 1, pairs, "flow")
    nic = cluster.nic.bytes_per_s * cluster.nic.link_efficiency
    uplink = 2 * nic / 4
    p2p = cluster.comm.p2p_efficiency["network"]
    # Alone: the uplink (0.5 NIC) is the bottleneck; together it is halved again.
    assert alone["c0"] == pytest.approx(
        math.ceil(layout_latency_ns(cluster, layout, 0, 2) + size / (uplink * p2p) * 1e9),
        abs=2)
    extra = both["c0"] - alone["c0"]
    assert extra == pytest.approx(size / (uplink * p2p) * 1e9, rel=1e-6)


def layout_latency_ns(cluster, layout, src, dst):
    """Latency of one p2p transfer: base + one network hop + its switch hops."""
    comm = cluster.comm
    hops = layout.path(src, dst).switch_hops
    return 1e9 * (comm.base_latency_s["direct"]["Simple"] + comm.hop_latency_s["network"]["Simple"]
                  + hops * cluster.fabric.switch_hop_latency_s)


# ---------------------------------------------------------------- topology
def test_rails_and_pxn_paths_on_a_dgx():
    layout = ClusterLayout(load_cluster("dgx-h100"), 64, 8)
    # Same node: NVLink egress then ingress.
    assert layout.path(0, 5).tier == "nvlink"
    # Same rail, same scalable unit (32 nodes per leaf): NIC to NIC through one switch.
    same_rail = layout.path(3, 8 + 3)
    assert same_rail.links == (layout.nic_out_link(0, 3), layout.nic_in_link(1, 3))
    assert same_rail.switch_hops == 1
    # Different rail: moved over NVLink to the GPU on the destination rail first (PXN).
    cross = layout.path(0, 8 + 5)
    assert cross.links[:2] == (layout.gpu_out_link(0), layout.gpu_in_link(5))
    assert cross.links[2] == layout.nic_out_link(0, 5)
    # Another scalable unit: up through the leaf and the spine.
    far = layout.path(0, 8 * 40)
    assert far.switch_hops == 3 and len(far.links) == 4


def test_nvl72_domain_spans_eighteen_trays():
    layout = ClusterLayout(load_cluster("gb200-nvl72"), 36, 4)
    assert layout.domain_of(0) == layout.domain_of(71) == 0
    assert layout.domain_of(72) == 1
    assert layout.path(0, 71).tier == "nvlink"
    assert layout.path(0, 72).tier == "network"


def test_layout_rejects_more_gpus_per_node_than_the_preset_has():
    with pytest.raises(ValueError, match="gpus_per_node: 9 .* give 1..8"):
        ClusterLayout(load_cluster("dgx-h100"), 1, 9)
    with pytest.raises(ValueError, match="nodes: 0"):
        ClusterLayout(load_cluster("dgx-h100"), 0, 8)
