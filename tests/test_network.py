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
from hardware.cost import CostModel
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
    rounding of each of its 5 terms to whole ns (one per term, documented). The closed
    form here is evaluated in floats too: at ~1e6 ns its own rounding is ~1e-9 ns, so it
    may sit that far above the engine's whole ns (size 1,166,420,808 on 8 GPUs:
    5,607,406.000000001 against 5,607,406)."""
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
    assert -1e-6 <= actual - expected_ns <= 5


def test_two_node_ring_is_bounded_by_nvlink_or_the_nics():
    """Across nodes, a ring step is limited by min(NVLink, 8 NICs) and its latency
    counts 2N network hops and the rest NVLink hops (NCCL's ring latency model), times
    NCCL's ring plateau factor for a Simple all-reduce across nodes (tuning.cc)."""
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
    latency *= cluster.comm.ring_plateau_factor  # 1.4
    expected = latency + 2 * (n - 1) / n * size / min(nvlink, nics)
    assert NetworkModel(layout, cluster.comm).plan_time_s(plan) == pytest.approx(expected,
                                                                                 rel=1e-12)


def test_ring_step_pacing_floors_every_step_of_a_ring_over_domains_of_several_gpus():
    """``comm.ring_step_pacing_us``: every step (NVLink and network) of a ring phase that
    spans several NVLink domains with more than one GPU in a domain takes at least the
    pacing, exactly; a ring of one GPU per domain, a ring inside one domain, a tree and
    a protocol whose pacing is 0 are not paced; the choice of protocol is NCCL's model's
    (unpaced) and the duration adds the pacing of what was chosen."""
    pacing_us = 9.0
    paced = load_cluster("dgx-h100", {"comm.ring_step_pacing_us.LL128": pacing_us})
    plain = load_cluster("dgx-h100", {"comm.ring_step_pacing_us.LL128": 0.0})
    assert paced.comm.ring_step_pacing_s["LL128"] == pytest.approx(9e-6, rel=1e-15)

    def latency_s(cluster, nodes, gpn, kind="all_gather", algorithm="ring", protocol="LL128"):
        layout = ClusterLayout(cluster, nodes, gpn)
        cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
        plan = cost.collective_plan(kind, tuple(range(nodes * gpn)), 64 << 20, algorithm,
                                    protocol)
        return sum(cost.network.phase_latency_s(ph, protocol, plan.family)
                   for ph in plan.phases), plan

    # 4 x 8: 31 steps, 4 of them network steps; every one at the pacing (above 1.9 / 4.0 us)
    found, plan = latency_s(paced, 4, 8)
    (phase,) = plan.phases
    assert (phase.intra_steps, phase.inter_steps) == (27, 4)
    assert found == 27 * 9e-6 + 4 * 9e-6
    # a pacing below the network hop leaves network steps at their hop latency
    low = load_cluster("dgx-h100", {"comm.ring_step_pacing_us.LL128": 3.0})
    hop = low.comm.hop_latency_s
    assert low.nic.net_latency_s == 0  # (a net plugin's latency would add to network_s)
    network_s = hop["network"]["LL128"] + low.fabric.switch_hop_latency_s * phase.switch_hops
    assert latency_s(low, 4, 8)[0] == 27 * 3e-6 + 4 * max(network_s, 3e-6)
    # not paced: one GPU per domain, one domain, a tree, Simple (pacing 0)
    for nodes, gpn, kind, algorithm, protocol in ((8, 1, "all_gather", "ring", "LL128"),
                                                  (1, 8, "all_gather", "ring", "LL128"),
                                                  (4, 8, "all_reduce", "tree", "LL128"),
                                                  (4, 8, "all_gather", "ring", "Simple")):
        assert (latency_s(paced, nodes, gpn, kind, algorithm, protocol)[0]
                == latency_s(plain, nodes, gpn, kind, algorithm, protocol)[0]), (nodes, gpn)
    # the choice: NCCL's (unpaced) model picks; the duration is the paced plan's time
    size = 32 << 20
    choices = {}
    for name, cluster in (("paced", paced), ("plain", plain)):
        layout = ClusterLayout(cluster, 4, 8)
        cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
        choices[name] = cost.collective("all_gather", tuple(range(32)), size)
        plan = cost.collective_plan("all_gather", tuple(range(32)), size)
        assert choices[name].duration_ns == cost.network.plan_time_ns(plan)
    assert choices["paced"][:2] == choices["plain"][:2] == ("ring", "LL128")
    assert choices["paced"].duration_ns - choices["plain"].duration_ns == pytest.approx(
        27 * (9.0 - 1.9) * 1e3 + 4 * (9e3 - network_s * 1e9), abs=2)


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
    # where NCCL's kernel ceilings bind (flows get private rate caps)
    ("dgx-b200", 2, 8, "all_reduce", "tree"),      # the tree kernel's per-channel ceiling
    ("dgx-b200", 16, 8, "sendrecv", "direct"),     # 1 p2p channel per network peer
    ("dgx-h100", 2, 1, "sendrecv", "direct"),      # 2 channels below the NIC
    ("dgx-h100", 4, 8, "all_reduce", "ring"),      # LL / LL128 ceilings at small sizes
    ("polaris", 4, 4, "all_reduce", "auto"),       # AMD proxy overhead, 2 NICs for 4 GPUs
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


# ------------------------------------------------- what NCCL's kernels can drive
def test_a_capped_flow_frees_its_share_for_the_others():
    """A flow's own ceiling is a private link: capped at 20, it leaves 80 of a 100
    link to the other flow."""
    rates = max_min_rates(np.array([0, 1]), np.array([0, 0]), np.ones(2), 2,
                          np.array([100.0]), np.array([20.0, np.inf]))
    assert rates.tolist() == [20.0, 80.0]
    # a cap above the fair share changes nothing
    rates = max_min_rates(np.array([0, 1]), np.array([0, 0]), np.ones(2), 2,
                          np.array([100.0]), np.array([70.0, np.inf]))
    assert rates.tolist() == [50.0, 50.0]


def _network(preset, nodes, gpn, overrides=None):
    layout = ClusterLayout(load_cluster(preset, overrides or {}), nodes, gpn)
    return layout, NetworkModel(layout, layout.spec.comm)


def test_p2p_channels_per_network_peer_follow_nccl_rules():
    """NCCL >= 2.29 (dgx-b200): ceil(50 GB/s / 14) = 4 channels, halved while
    channels x ceil(ranks / 8) > 16; NCCL <= 2.28 (dgx-h100): 2, halved while
    channels x ranks > 4 x 16."""
    _, b200 = _network("dgx-b200", 2, 8)
    assert [b200.p2p_channels_per_peer(r) for r in (2, 16, 32, 64, 128, 512)] == \
        [4, 4, 4, 2, 1, 1]
    _, h100 = _network("dgx-h100", 2, 8)
    assert [h100.p2p_channels_per_peer(r) for r in (2, 10, 16, 32, 64, 80)] == \
        [2, 2, 2, 2, 1, 1]
    assert h100.p2p_cap_bytes_per_s(2) == 2 * 14e9


def test_a_gpu_pair_across_nodes_moves_its_channels_worth():
    """sendrecv over 2 nodes x 1 GPU on dgx-h100: 2 channels x 14 GB/s (28 GB/s) of a
    400G NIC that would carry 47.5: about half of the line rate per pair."""
    cluster = load_cluster("dgx-h100")
    layout = ClusterLayout(cluster, 2, 1)
    cost = CostModel(layout, ALGORITHMS)
    size = 1 << 30
    choice = cost.collective("sendrecv", (0, 1), size)
    latency_ns = round(1e9 * (cluster.comm.base_latency_s["direct"]["Simple"]
                              + cluster.comm.hop_latency_s["network"]["Simple"]
                              + cluster.fabric.switch_hop_latency_s))
    assert choice.protocol == "Simple"
    assert choice.duration_ns == pytest.approx(latency_ns + size / 28e9 * 1e9, abs=3)


def test_tree_all_reduce_is_held_by_the_channel_ceiling_closed_form():
    """B200, 2 nodes: the tree streams 2 S at 8 graph channels x 42.8 GB/s (NCCL
    2.28 perChMaxTreeBws, N2), times its chunk pipeline fill, not at the NICs' rate."""
    cluster = load_cluster("dgx-b200")
    layout = ClusterLayout(cluster, 2, 8)
    cost = CostModel(layout, ALGORITHMS)
    size = 16 << 30
    plan = cost.collective_plan("all_reduce", range(16), size, "tree", "Simple")
    network = cost.network
    (phase,) = plan.phases
    assert network.graph_channels(plan) == 8
    cap = 8 * 42.8e9
    assert network.bus_cap_bytes_per_s(plan) == pytest.approx(cap)
    fill = 1 + (phase.intra_steps + phase.inter_steps - 1) * (512 << 10) * 16 / size
    assert network.pipeline_factor(plan, phase) == pytest.approx(fill)
    stream_s = 2 * size / cap * fill
    assert network.phase_stream_s(plan, phase) == pytest.approx(stream_s, rel=1e-12)
    # the NICs alone would allow twice as much: 2 nodes move S per node and direction
    assert network.phase_bandwidth_s(phase, "Simple") < 0.6 * 2 * size / cap


def test_channels_running_drop_for_small_messages():
    """enqueue.cc: one channel fewer while nBytes < nc x nt x threadThreshold
    (Simple 32 KiB, LL 4 KiB x ranks for rings)."""
    layout, network = _network("dgx-h100", 8, 8)
    cost = CostModel(layout, ALGORITHMS)
    simple = cost.collective_plan("all_reduce", range(64), 256 << 10, "ring", "Simple")
    assert network.channels_running(simple) == 8
    ll = cost.collective_plan("all_reduce", range(64), 1 << 20, "ring", "LL")
    assert network.channels_running(ll) == 4
    assert network.channels_running(ll, 1 << 30) == 16


def test_ll_is_held_at_the_nccl_ll_ceiling_across_nodes():
    """Ring LL on 4 nodes of Intel hosts: no more than llMaxBws' 20.4 GB/s of bus
    bandwidth, whatever the NICs could carry."""
    layout, _ = _network("dgx-h100", 4, 8)
    cost = CostModel(layout, ALGORITHMS)
    size, n = 1 << 30, 32
    ll = cost.collective("all_reduce", range(n), size, "ring", "LL")
    busbw = size * 2 * (n - 1) / n / ll.duration_ns  # GB/s
    assert 19.0 < busbw <= 20.4


def test_inter_node_ring_steps_pay_the_proxy_overhead():
    """NCCL tuning.cc: an inter-node ring's NVLink steps cost at least netOverhead
    (x3 for Simple): 6 us on AMD hosts (dgx-a100) instead of the 3.4 us NVLink hop
    (times the ring plateau of a Simple all-reduce across nodes, 1.4)."""
    layout, network = _network("dgx-a100", 2, 8)
    cost = CostModel(layout, ALGORITHMS)
    plan = cost.collective_plan("all_reduce", range(16), 1 << 30, "ring", "Simple")
    phase = plan.phases[0]
    hop = layout.spec.comm.hop_latency_s
    expected = 1.4 * (phase.intra_steps * 6e-6 + phase.inter_steps
                      * (hop["network"]["Simple"] + layout.spec.fabric.switch_hop_latency_s))
    assert network.phase_latency_s(phase, "Simple", "ring") == pytest.approx(expected)
    single = cost.collective_plan("all_reduce", range(8), 1 << 30, "ring", "Simple")
    assert network.phase_latency_s(single.phases[0], "Simple", "ring") == pytest.approx(
        7 * hop["nvlink"]["Simple"])


def test_double_binary_tree_is_the_nccl_dtree():
    """src/graph/trees.cc: root 0 with one child, odd counts shift the second tree by
    one, even counts mirror it."""
    from strategies.collectives.algorithms import double_binary_trees
    (t0, t1), height = double_binary_trees(3)
    assert t0 == {2: 0, 1: 2} and t1 == {0: 1, 2: 0} and height == 2
    (t0, t1), _ = double_binary_trees(4)
    assert t0 == {2: 0, 1: 2, 3: 2} and t1 == {1: 3, 2: 1, 0: 1}
    (t0, _), height = double_binary_trees(13)
    assert t0[8] == 0 and t0[4] == 8 and t0[12] == 8 and t0[10] == 12 and height == 4


# ------------------------------------------------ flow classes (weighted flows)
def _random_problem(rng: np.random.Generator):
    """A random small topology: links with capacities, flows over random link sets
    with random weights and (sometimes) ceilings, each flow repeated 1-4 times."""
    num_links = int(rng.integers(2, 12))
    capacity = rng.uniform(1e9, 100e9, num_links)
    distinct = int(rng.integers(1, 9))
    flows, links, weights, caps, counts = [], [], [], [], []
    for _ in range(distinct):
        crossed = rng.choice(num_links, size=int(rng.integers(1, min(num_links, 4) + 1)),
                             replace=False)
        flows.append((tuple(int(x) for x in crossed),
                      tuple(float(w) for w in rng.uniform(1.0, 3.0, crossed.size))))
        caps.append(float(rng.uniform(1e9, 60e9)) if rng.random() < 0.3 else math.inf)
        counts.append(int(rng.integers(1, 5)))
    return capacity, flows, caps, counts


def _entries(flow_list):
    entry_flow, entry_link, entry_weight = [], [], []
    for index, (crossed, weight) in enumerate(flow_list):
        entry_flow += [index] * len(crossed)
        entry_link += list(crossed)
        entry_weight += list(weight)
    return (np.asarray(entry_flow, dtype=np.int64), np.asarray(entry_link, dtype=np.int64),
            np.asarray(entry_weight))


@pytest.mark.parametrize("seed", range(40))
def test_weighted_flow_classes_give_the_rates_of_the_expanded_problem(seed):
    """m identical flows solved once with multiplicity m (hardware.flow.max_min_rates'
    derivation) get the rates progressive filling gives the m flows one by one, to
    1e-12 relative; flow_classes finds exactly the repeated flows."""
    from hardware.flow import flow_classes

    rng = np.random.default_rng(seed)
    capacity, flows, caps, counts = _random_problem(rng)
    # expanded: every copy a flow of its own, copies interleaved with the others
    order = [i for i, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(order)
    expanded = _entries([flows[i] for i in order])
    expanded_caps = np.asarray([caps[i] for i in order])
    full = max_min_rates(*expanded, len(order), capacity, expanded_caps)
    # classes: each distinct flow once, weighted by its count
    weighted = max_min_rates(*_entries(flows), len(flows), capacity, np.asarray(caps),
                             np.asarray(counts, dtype=np.float64))
    np.testing.assert_allclose(full, weighted[order], rtol=1e-12, atol=0)
    # and the classes flow_classes finds in the expanded list are the distinct flows
    class_of, first = flow_classes(*expanded, len(order), expanded_caps)
    assert len(first) == len(set(order)) == len(flows)
    assert [order[f] for f in first] == list(dict.fromkeys(order))
    assert all(order[a] == order[first[class_of[a]]] for a in range(len(order)))


def test_unused_links_do_not_change_rates_bit_for_bit():
    """The solver works on the links flows cross only: padding the fabric with links
    nobody uses leaves every rate bit-for-bit equal."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        capacity, flows, caps, _ = _random_problem(rng)
        entry_flow, entry_link, entry_weight = _entries(flows)
        base = max_min_rates(entry_flow, entry_link, entry_weight, len(flows), capacity,
                             np.asarray(caps))
        padded = np.concatenate([rng.uniform(1e9, 1e12, 50), capacity, rng.uniform(1, 2, 50)])
        moved = max_min_rates(entry_flow, entry_link + 50, entry_weight, len(flows), padded,
                              np.asarray(caps))
        assert np.array_equal(base, moved)


def test_a_batch_of_identical_flows_ends_when_the_expanded_one_does():
    """FlowNetwork solves repeated requests of a batch as one weighted class: three
    identical flows and a fourth over a shared link end at the times the progressive
    filling of the four gives (capacity 100 GB/s shared four ways: 25 GB/s each)."""
    env = simpy.Environment()
    network = FlowNetwork(env, np.array([100e9, 1e12]))
    same = FlowRequest((0, 1), (1.0, 1.0), 1e9)
    finished = {}

    def run():
        yield network.transfer([same, same, same, FlowRequest((0,), (1.0,), 2e9)])
        finished["batch"] = env.now

    env.process(run())
    env.run()
    # the three 1 GB flows end at 40 ms (25 GB/s); the 2 GB flow then runs alone at
    # 100 GB/s: 1 GB left after 40 ms, 10 ms more
    assert finished == {"batch": 50_000_000}
