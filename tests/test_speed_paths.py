"""Fast paths that must give what the slow ones give: collectives priced once per class
cost what each group costs priced on its own, to the nanosecond."""

from __future__ import annotations

import random

import pytest

from hardware.catalog import load_cluster
from hardware.cost import CostModel
from hardware.topology import ClusterLayout
from strategies.collectives.catalog import ALGORITHMS

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall", "sendrecv")


def _groups(layout: ClusterLayout, rng: random.Random) -> list[tuple[int, ...]]:
    """Strided groups (data-parallel-like, every offset and stride) and random ones."""
    n = layout.world_size
    groups = []
    for stride in (1, 2, 8, 16, 32):
        for size in (2, 4, 8):
            if stride * size > n:
                continue
            for offset in range(0, n - stride * (size - 1), max(1, n // 7)):
                groups.append(tuple(range(offset, offset + stride * size, stride)))
    for _ in range(20):
        groups.append(tuple(rng.sample(range(n), rng.choice((2, 3, 5, 8)))))
    return groups


@pytest.mark.parametrize("cluster,nodes", [("dgx-h100", 32), ("gb200-nvl72", 40),
                                           ("dgx-a100", 16), ("polaris", 24)])
def test_class_prices_equal_own_prices(cluster, nodes):
    spec = load_cluster(cluster)
    layout = ClusterLayout(spec, min(nodes, spec.max_nodes), spec.gpus_per_node)
    shared = CostModel(layout, ALGORITHMS, fidelity="analytic")
    rng = random.Random(7)
    classes = set()
    for group in _groups(layout, rng):
        classes.add(layout.group_class(group))
        for kind in KINDS:
            for size in (4096, 1 << 20, 1 << 28):
                alone = CostModel(layout, ALGORITHMS, fidelity="analytic")
                assert shared.collective(kind, group, size) == alone.collective(kind, group, size), \
                    (cluster, kind, group, size)
    assert len(classes) < len(_groups(layout, random.Random(7)))  # some groups shared a class
    # send/recv between two ranks: a pair's class prices it as the pair alone
    pairs = [(a, b) for a, b in ((rng.randrange(layout.world_size),
                                  rng.randrange(layout.world_size)) for _ in range(150))]
    pairs += [(g[0], g[1]) for g in _groups(layout, random.Random(7)) if len(g) > 1]
    pair_classes = set()
    for a, b in pairs:
        pair_classes.add(layout.group_class((a, b)))
        for size in (4096, 1 << 20, 1 << 28):
            alone = CostModel(layout, ALGORITHMS, fidelity="analytic")
            assert shared.p2p_ns(a, b, size) == alone.p2p_ns(a, b, size), (cluster, a, b, size)
    assert len(pair_classes) < len(pairs) and len(shared._p2p_by_class) > 0


def test_degraded_link_breaks_symmetry():
    spec = load_cluster("dgx-h100")
    layout = ClusterLayout(spec, 4, 8)
    assert layout.group_class((0, 8)) == layout.group_class((1, 9)) == layout.group_class((16, 24))
    assert layout.group_class((0, 8)) != layout.group_class((0, 9))
    layout.scale_nic(0, 0.5)
    assert layout.group_class((0, 8)) is None
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    assert (cost.collective("all_reduce", (0, 8), 1 << 28).duration_ns
            > cost.collective("all_reduce", (1, 9), 1 << 28).duration_ns)


@pytest.mark.parametrize("fidelity", ["analytic", "flow"])
def test_collective_sweep_one_representative_equals_every_rank(fidelity, monkeypatch):
    """collective_sweep runs one representative for all ranks: the same table as the
    program in which every rank issues the call."""
    from sim import collective_bench
    from strategies.ir import Program

    cluster = load_cluster("gb200-nvl72")
    sizes = [1 << 12, 1 << 22, 1 << 28]
    kinds = ("all_reduce", "all_gather", "alltoall", "sendrecv", "broadcast")
    reduced = {k: collective_bench.collective_sweep(k, cluster, nodes=20, gpus_per_node=4,
                                                    sizes=sizes, fidelity=fidelity)
               for k in kinds}

    def full_program(*, ops_by_rank, world_size, name, represents):
        op = ops_by_rank[0][0]
        return Program(ops_by_rank={r: (op,) for r in range(world_size)},
                       world_size=world_size, name=name)

    monkeypatch.setattr(collective_bench, "Program", full_program)
    for kind in kinds:
        full = collective_bench.collective_sweep(kind, cluster, nodes=20, gpus_per_node=4,
                                                 sizes=sizes, fidelity=fidelity)
        assert full.equals(reduced[kind]), kind


def _variants():
    """Presets and variations of them that route differently: no GPUDirect (host
    bounce), a non-rail fat tree, three tiers with small leaves, fewer NICs than GPUs,
    NVLink domains spanning nodes, PCIe islands."""
    from dataclasses import replace

    h100 = load_cluster("dgx-h100")
    small = replace(h100.fabric, nodes_per_leaf=2, leaves_per_spine_group=2, tiers=3)
    yield "dgx-h100-small-leaves", replace(h100, fabric=small), 9, 8
    yield "fat-tree", replace(h100, fabric=replace(small, topology="fat-tree")), 9, 8
    yield "no-gpudirect", replace(h100, nic=replace(h100.nic, gpudirect_rdma=False),
                                  fabric=small), 6, 8
    yield "half-nodes", replace(h100, fabric=small), 7, 4
    gb200 = load_cluster("gb200-nvl72")
    yield "gb200", replace(gb200, fabric=replace(gb200.fabric, nodes_per_leaf=5,
                                                 leaves_per_spine_group=3)), 40, 4
    yield "polaris", load_cluster("polaris"), 24, 4


@pytest.mark.parametrize("name,spec,nodes,gpn", list(_variants()), ids=lambda v: str(v)[:20])
def test_all_pairs_link_counts_equal_every_path(name, spec, nodes, gpn):
    """Counting the links of an all-to-all without listing its pairs gives what
    walking the path of every pair gives, for whole and scattered groups."""
    import numpy as np

    layout = ClusterLayout(spec, nodes, gpn)
    rng = random.Random(3)
    n = layout.world_size
    groups = [tuple(range(n)), tuple(range(0, n, 3)), tuple(rng.sample(range(n), n // 2)),
              tuple(rng.sample(range(n), 5)), (0, n - 1)]
    for group in groups:
        walked = np.zeros(layout.num_links)
        for a in group:
            for b in group:
                if a != b:
                    for link in layout.path(a, b).links:
                        walked[link] += 1
        np.testing.assert_array_equal(layout.all_pairs_link_counts(group), walked,
                                      err_msg=f"{name} {group[:6]}")


def test_large_alltoall_priced_from_counts_as_listed(monkeypatch):
    """An all-to-all above the listing threshold (AllPairs) costs what the same
    all-to-all with its transfers listed costs, and flow fidelity refuses one too
    large for memory in one line."""
    from strategies.collectives import algorithms

    cluster = load_cluster("gb200-nvl72")
    layout = ClusterLayout(cluster, 40, 4)
    group = tuple(range(0, 160, 1))
    sizes = (1 << 14, 1 << 20, 1 << 30)
    listed = CostModel(layout, ALGORITHMS, fidelity="analytic")
    expected = {s: listed.collective("alltoall", group, s) for s in sizes}
    monkeypatch.setattr(algorithms, "ALL_PAIRS_LISTED_MAX", 16)
    counted = CostModel(layout, ALGORITHMS, fidelity="analytic")
    for s in sizes:
        mine = counted.collective("alltoall", group, s)
        assert mine.algorithm == expected[s].algorithm and mine.protocol == expected[s].protocol
        assert mine.duration_ns == pytest.approx(expected[s].duration_ns, abs=1)
    from sim.collective_bench import collective_sweep
    monkeypatch.setattr("hardware.network.FLOWS_MAX", 1000)
    with pytest.raises(ValueError, match="fidelity: 'flow' would run 25,440 flows"):
        collective_sweep("alltoall", cluster, nodes=40, gpus_per_node=4, sizes=[1 << 20],
                         fidelity="flow")


def test_flow_link_bytes_summed_when_asked():
    """FlowNetwork.link_bytes (summed per batch when read or when a batch ends) is the
    payload delivered times each link's weight."""
    import numpy as np
    import simpy

    from hardware.flow import FlowNetwork, FlowRequest

    env = simpy.Environment()
    network = FlowNetwork(env, np.asarray([1e9, 2e9, 1e9]))
    seen = {}

    def run():
        first = network.transfer([FlowRequest((0, 1), (1.0, 2.0), 1e6)])
        second = network.transfer([FlowRequest((1, 2), (1.0, 1.0), 3e6)])
        yield first  # link 1 (2e9 B/s) shared at weights 2 and 1: both at 2e9/3 B/s
        seen["first"] = network.link_bytes
        yield second
        seen["end"] = network.link_bytes

    env.process(run())
    env.run()
    np.testing.assert_allclose(seen["first"], [1e6, 2e6 + 1e6, 1e6])
    np.testing.assert_allclose(seen["end"], [1e6, 2e6 + 3e6, 3e6])


@pytest.mark.parametrize("name,spec,nodes,gpn", list(_variants()), ids=lambda v: str(v)[:20])
def test_geometry_switch_hops_equal_walked_paths(name, spec, nodes, gpn):
    """GroupGeometry.switch_hops (from the extremes of the domains' leaf units and spine
    groups: consecutive domains differ somewhere iff not all are alike) is the
    most switches the paths between consecutive domains' first members cross, and
    link_tier_index numbers link_tier."""
    layout = ClusterLayout(spec, nodes, gpn)
    assert [("nvlink", "pcie", "network")[i] for i in layout.link_tier_index] == \
        list(layout.link_tier)
    rng = random.Random(5)
    for _ in range(150):
        group = tuple(rng.sample(range(layout.world_size),
                                 min(layout.world_size, rng.choice((2, 3, 9, 30)))))
        by_domain: dict[int, list[int]] = {}
        for rank in sorted(group):
            by_domain.setdefault(layout.domain_of(rank), []).append(rank)
        firsts = [by_domain[d][0] for d in sorted(by_domain)]
        walked = max((layout.path(a, b).switch_hops
                      for a, b in zip(firsts, firsts[1:] + firsts[:1]) if a != b), default=0)
        assert layout.geometry(group).switch_hops == walked, group


@pytest.mark.parametrize("name,spec,nodes,gpn", list(_variants()), ids=lambda v: str(v)[:20])
def test_paths_links_equal_path(name, spec, nodes, gpn):
    """ClusterLayout.paths_links lists, per transfer and in order, the links of path()."""
    import numpy as np

    layout = ClusterLayout(spec, nodes, gpn)
    rng = random.Random(11)
    n = layout.world_size
    src = [rng.randrange(n) for _ in range(3000)] + list(range(n))
    dst = [rng.randrange(n) for _ in range(3000)] + list(range(n))
    which, links = layout.paths_links(np.asarray(src), np.asarray(dst))
    expected_which = [i for i, (a, b) in enumerate(zip(src, dst)) for _ in layout.path(a, b).links]
    expected_links = [link for a, b in zip(src, dst) for link in layout.path(a, b).links]
    assert which.tolist() == expected_which
    assert links.tolist() == expected_links
    # link_counts: the same links counted per link (every link, int64)
    counted = layout.link_counts(np.asarray(src), np.asarray(dst))
    assert counted.dtype == np.int64 and counted.size == layout.num_links
    assert counted.tolist() == np.bincount(np.asarray(expected_links, dtype=np.int64),
                                           minlength=layout.num_links).tolist()
    assert layout.link_counts(np.asarray(src[:0]), np.asarray(dst[:0])).tolist() == \
        [0] * layout.num_links


def test_collective_work_estimate_follows_listed_transfers():
    """The bound on `trainsim collective` follows what one representative lists: a
    16k-rank all-to-all or sendrecv at analytic fidelity is allowed (priced in well
    under a second), an all-reduce over 16,416 GB200s (1.2 M ring transfers per pass)
    and every size of a 1,000-node reduce at flow fidelity are refused."""
    from trainsim.api import check_collective_work

    assert check_collective_work("alltoall", 16384, 3, domain_ranks=8) < 2
    assert check_collective_work("sendrecv", 16384, 32, domain_ranks=8, fidelity="flow") < 10
    with pytest.raises(ValueError, match="all_reduce on 16,416 ranks"):
        check_collective_work("all_reduce", 16416, 1, domain_ranks=72)
    with pytest.raises(ValueError, match="reduce on 8,000 ranks"):
        check_collective_work("reduce", 8000, 32, domain_ranks=8, fidelity="flow")


@pytest.mark.parametrize("cluster,nodes", [("dgx-h100", 8), ("gb200-nvl72", 4), ("dgx-a100", 6)])
def test_flow_batches_built_in_bulk_equal_one_request_per_transfer(cluster, nodes):
    """FlowFabric builds a phase's flows as arrays (paths_links, per-tier weights) and a
    send/recv's mirrors as one phase; the arrays are exactly what NetworkModel.request
    gives transfer by transfer (and, for mirrors, pair by pair from each pair's own
    plan): same links in the same order, same weights, payloads and ceilings."""
    import numpy as np
    import simpy

    from hardware.network import FlowFabric
    from strategies.collectives.catalog import valid_algorithms

    spec = load_cluster(cluster)
    layout = ClusterLayout(spec, nodes, spec.gpus_per_node)
    cost = CostModel(layout, ALGORITHMS, fidelity="flow")
    model = cost.network
    fabric = FlowFabric(simpy.Environment(), model)

    def expected(plans, index=0):
        flows, links, weights, payload, caps = [], [], [], [], []
        for plan in plans:
            for phase in plan.phases[index:index + 1]:
                fill = model.pipeline_factor(plan, phase)
                for t, cap in zip(phase.transfers, model.transfer_caps(plan, phase)):
                    request = model.request(t, plan.protocol, cap, fill)
                    flows += [len(payload)] * len(request.links)
                    links += list(request.links)
                    weights += list(request.weights)
                    payload.append(request.payload_bytes)
                    caps.append(request.max_rate)
        return flows, links, weights, payload, caps

    def arrays(batch):
        return (batch.entry_flow.tolist(), batch.entry_link.tolist(),
                batch.entry_weight.tolist(), batch.payload.tolist(), batch.caps.tolist())

    rng = random.Random(3)
    compared = 0
    for group in _groups(layout, rng)[::3]:
        for kind in KINDS[:5]:
            for size in (1 << 16, 1 << 27):
                for algorithm in valid_algorithms(kind)[1:]:  # every algorithm that can run
                    try:
                        choice = cost.collective(kind, group, size, algorithm)
                    except ValueError:
                        continue
                    plan = cost.plan_of(kind, group, size, choice)
                    for index, phase in enumerate(plan.phases):
                        if phase.transfers:
                            assert arrays(fabric._phase_requests(plan, index)) == \
                                expected([plan], index)
                            compared += 1
    n = layout.world_size
    for _ in range(40):
        src, dst = rng.sample(range(n), 2)
        pairs = [tuple(rng.sample(range(n), 2)) for _ in range(rng.choice((1, 7, 30)))]
        pairs.append((dst, dst))  # within a rank: no flow
        size = rng.choice((1 << 12, 1 << 26))
        plan = cost.p2p_plan(src, dst, size)
        batch = fabric.p2p_mirrored_requests(plan, pairs)
        mirrors = [cost.p2p_plan(a, b, size) for a, b in pairs]
        assert arrays(batch) == expected([plan, *mirrors])
    assert compared > 50


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "gb200-nvl72", "polaris"])
def test_small_group_class_equals_numpy_class(name, monkeypatch):
    """group_class of a small group (plain Python) is the numpy path's bytes, on strided
    and scattered groups over several domains, leaves and spine groups."""
    import hardware.topology as topology

    spec = load_cluster(name)
    layout = ClusterLayout(spec, min(spec.max_nodes, 512), spec.gpus_per_node)
    rng = random.Random(3)
    groups = []
    for _ in range(300):
        size = rng.choice((1, 2, 3, 4, 8, 16, 64))
        if rng.random() < 0.5:
            stride = rng.choice((1, 2, 8, 64, 512))
            start = rng.randrange(layout.world_size - (size - 1) * stride) \
                if (size - 1) * stride < layout.world_size else None
            if start is None:
                continue
            groups.append(tuple(start + i * stride for i in range(size)))
        else:
            groups.append(tuple(rng.sample(range(layout.world_size), size)))
    small = [layout.group_class(group) for group in groups]
    monkeypatch.setattr(topology, "_SMALL_GROUP", 0)
    layout._classes.clear()
    assert [layout.group_class(group) for group in groups] == small


def test_tree_columns_built_in_numpy_are_the_listed_tree():
    """tree_all_reduce over uniform domains (columns built in numpy) lists NCCL's double
    binary tree as the loop does: per tree and channel, each domain's chain from member c
    (b -> a, a -> b per consecutive pair) then its exchange with its parent domain's
    member c; and the columns read as tuples and as arrays agree."""
    import numpy as np

    from strategies.collectives.algorithms import double_binary_trees, tree_all_reduce

    rng = random.Random(5)
    for name in ("dgx-a100", "gb200-nvl72"):
        spec = load_cluster(name)
        layout = ClusterLayout(spec, 64, spec.gpus_per_node)
        for _ in range(60):
            stride, size = rng.choice((1, 2, 4, 8, 16)), rng.choice((2, 3, 8, 16, 64, 128))
            offset = rng.randrange(0, 16)
            group = tuple(offset + i * stride for i in range(size))
            if group[-1] >= layout.world_size:
                continue
            geometry = layout.geometry(group)
            (phase,) = tree_all_reduce(geometry, 1 << 28)
            src, dst = [], []
            trees, _ = double_binary_trees(len(geometry.domains))
            for parents in trees:
                for c in range(geometry.local_size):
                    for d, members in enumerate(geometry.domains):
                        order = members[c % len(members):] + members[:c % len(members)]
                        for a, b in zip(order, order[1:]):
                            src += (b, a)
                            dst += (a, b)
                        if d in parents:
                            up = geometry.domains[parents[d]][c]
                            src += (members[c], up)
                            dst += (up, members[c])
            columns = phase.transfers
            assert (columns.src, columns.dst) == (tuple(src), tuple(dst)), group
            arrays = columns.arrays()
            assert arrays[0].tolist() == src and arrays[1].tolist() == dst
            assert len(columns) == len(src) and list(columns)[0].src == src[0]
            assert isinstance(arrays[0], np.ndarray)


@pytest.mark.parametrize("cluster,nodes", [("dgx-h100", 32), ("gb200-nvl72", 40),
                                           ("dgx-a100", 16), ("polaris", 24)])
def test_auto_choice_is_the_catalog_order_argmin_of_every_candidate(cluster, nodes):
    """CostModel.collective prices candidates from the lowest fixed latency up and skips
    those whose latencies alone lose: the choice must be the one trying every algorithm
    and protocol the catalog offers in its order gives (first of the least durations of
    NCCL's model: the ring step pacing, which NCCL's choice does not see, off), each
    priced on its own cost model, to the nanosecond; its duration is that candidate's
    with the pacing."""
    spec = load_cluster(cluster)
    unpaced = load_cluster(cluster, {f"comm.ring_step_pacing_us.{p}": 0.0
                                     for p in ("LL", "LL128", "Simple")})
    layout = ClusterLayout(spec, min(nodes, spec.max_nodes), spec.gpus_per_node)
    nccl_layout = ClusterLayout(unpaced, min(nodes, spec.max_nodes), spec.gpus_per_node)
    shared = CostModel(layout, ALGORITHMS, fidelity="analytic")
    rng = random.Random(11)
    skipped = 0
    for group in _groups(layout, rng)[::3] + [tuple(range(0, layout.world_size, 8)),
                                               tuple(range(layout.world_size))]:
        geometry = layout.geometry(group)
        for kind in KINDS:
            for size in (4, 4096, 1 << 20, 1 << 28):
                chosen = shared.collective(kind, group, size)
                if geometry.size == 1:
                    continue
                tried = []
                for name in ALGORITHMS.algorithms(kind):
                    if not ALGORITHMS.chosen_by_auto(name) or ALGORITHMS.unavailable(
                            kind, name, geometry, spec, explicit=False) is not None:
                        continue
                    for proto in shared._protocols(name, "auto", size, geometry):
                        alone = CostModel(nccl_layout, ALGORITHMS, fidelity="analytic")
                        tried.append(alone.collective(kind, group, size, name, proto))
                best = min(tried, key=lambda c: c.duration_ns)  # (the first of the least)
                assert chosen[:2] == best[:2], (cluster, kind, group, size, tried)
                paced = CostModel(layout, ALGORITHMS, fidelity="analytic").collective(
                    kind, group, size, best.algorithm, best.protocol)
                assert chosen == paced, (cluster, kind, group, size)
                skipped += len(tried) - 1
    assert skipped > 100


def test_lazy_transfers_equal_the_built_ones_and_a_loser_is_never_built():
    """A builder's plans.LazyTransfers reads as what it builds (length, items, equality,
    hash, columns), and NVLS_TREE, which loses to the tree on latency alone for a small
    all-reduce over 32 H100 nodes, is never built."""
    from strategies.collectives.plans import LazyTransfers, TransferColumns

    built = []
    lazy = LazyTransfers(lambda: built.append(1) or TransferColumns((0, 1), (1, 0), 8.0))
    assert not built
    assert len(lazy) == 2 and list(lazy)[1].src == 1 and lazy.columns and built == [1]
    assert lazy == TransferColumns((0, 1), (1, 0), 8.0) == lazy and hash(lazy) == hash(
        tuple(TransferColumns((0, 1), (1, 0), 8.0))) and built == [1]
    spec = load_cluster("dgx-h100")
    layout = ClusterLayout(spec, 32, 8)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    group = tuple(range(layout.world_size))
    assert cost.collective("all_reduce", group, 4).algorithm != "nvls_tree"
    geometry = layout.geometry(group)
    phases = cost._reference_phases[("all_reduce", layout.group_class(group), "nvls_tree")]
    assert phases and all(p.transfers._built is None for p in phases)
    eager = ALGORITHMS.phases("all_reduce", "nvls_tree", geometry, 1 << 20)
    assert all(p.transfers._built is None for p in eager)


@pytest.mark.parametrize("name,nodes,gpn", [("dgx-h100", 64, 8), ("dgx-a100", 48, 8),
                                             ("gb200-nvl72", 72, 4), ("polaris", 24, 4),
                                             ("dgx-h100", 16, 4)])
def test_counted_ring_and_tree_loads_equal_the_listed_transfers(name, nodes, gpn):
    """Ring and tree phases over several domains give the network model their transfers
    counted (plans.TransferCounts: those inside a domain per GPU port, the others
    listed): each link's load must be the very float the listed transfers' bincount
    gives, for strided, offset and random groups of every collective kind, and the list
    is never built on the way."""
    import numpy as np

    from strategies.collectives.plans import Phase

    spec = load_cluster(name)
    layout = ClusterLayout(spec, min(nodes, spec.max_nodes), gpn)
    rng = random.Random(13)
    n = layout.world_size
    groups = [tuple(range(n)), tuple(range(0, n, gpn)), tuple(range(3, n, 2 * gpn + 1))]
    for _ in range(40):
        stride, size = rng.choice((1, 2, 3, 4, 8, 16, 64)), rng.choice((2, 3, 5, 8, 16, 64, 256))
        offset = rng.randrange(0, 2 * gpn)
        groups.append(tuple(offset + i * stride for i in range(size)))
    for _ in range(10):
        groups.append(tuple(rng.sample(range(n), rng.choice((4, 9, 33)))))
    counted = 0
    for group in groups:
        if group[-1] >= n:
            continue
        geometry = layout.geometry(group)
        for kind, algorithm in (("all_reduce", "ring"), ("all_gather", "ring"),
                                ("reduce_scatter", "ring"), ("all_reduce", "tree"),
                                ("broadcast", "ring")):
            if algorithm not in ALGORITHMS.algorithms(kind) or geometry.size == 1:
                continue
            for phase in ALGORITHMS.phases(kind, algorithm, geometry, 3 * (1 << 20) + 7):
                model = CostModel(layout, ALGORITHMS, fidelity="analytic").network
                loads = model._payload_per_link(phase)
                if phase.transfers.counts is None:
                    continue
                assert phase.transfers._built is None  # (priced without the list)
                listed = Phase(phase.name, tuple(phase.transfers.built()), 0, 0)
                alone = CostModel(layout, ALGORITHMS, fidelity="analytic").network
                expected = alone._payload_per_link(listed)
                assert loads.keys() == expected.keys()
                for mode in loads:
                    assert loads[mode].tobytes() == expected[mode].tobytes(), (
                        name, group, kind, algorithm, np.flatnonzero(loads[mode] != expected[mode]))
                counted += 1
    assert counted > 40


@pytest.mark.parametrize("name,spec,nodes,gpn", list(_variants()), ids=lambda v: str(v)[:20])
def test_phase_bandwidth_from_run_maxima_equals_every_link(name, spec, nodes, gpn):
    """NetworkModel.phase_bandwidth_s on uniform links (each run of links of one kind
    slowest at its largest payload) is the float the max over every loaded link of
    (payload x weight) / capacity gives, for ring, tree, all-to-all and send/recv phases
    of strided and random groups under every protocol; and the same model with a NIC
    scaled (not uniform) still prices through every link."""
    import numpy as np

    from hardware.spec import PROTOCOLS

    layout = ClusterLayout(spec, nodes, gpn)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    network = cost.network
    rng = random.Random(13)
    n = layout.world_size
    groups = [tuple(range(0, n, s)) for s in (1, 2, gpn, 2 * gpn) if n // s >= 2]
    groups += [tuple(rng.sample(range(n), rng.choice((2, 3, 7, 12)))) for _ in range(12)]

    def every_link(phase, protocol):
        wire = np.zeros(layout.num_links)
        for mode, payload in network._payload_per_link(phase).items():
            weight = np.asarray([network._weights[(tier, protocol, mode)]
                                 for tier in ("nvlink", "pcie", "network")])
            wire += payload * weight[layout.link_tier_index]
        used = wire > 0
        return float((wire[used] / layout.capacity_bytes_per_s[used]).max()) if used.any() else 0.0

    checked = 0
    for group in groups:
        geometry = layout.geometry(group)
        for kind in ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "sendrecv"):
            for algorithm in ALGORITHMS.algorithms(kind):
                if ALGORITHMS.unavailable(kind, algorithm, geometry, spec, explicit=True):
                    continue
                for phase in ALGORITHMS.phases(kind, algorithm, geometry, 3 * (1 << 20) + 7):
                    if not phase.transfers:
                        continue
                    for protocol in PROTOCOLS:
                        assert network.phase_bandwidth_s(phase, protocol) == \
                            every_link(phase, protocol), (kind, algorithm, group, protocol)
                        checked += 1
    assert checked > 100
    # a degraded NIC: links of one kind no longer share a capacity (every link read)
    phase = ALGORITHMS.phases("all_gather", "ring", layout.geometry(groups[0]), 1 << 20)[0]
    layout.scale_nic(gpn - 1, 0.25)
    for protocol in PROTOCOLS:
        assert network.phase_bandwidth_s(phase, protocol) == every_link(phase, protocol)


def test_class_candidates_still_check_each_request():
    """A group whose class's algorithms are already known (CostModel's candidates by
    class) still has its algorithm, protocol and size checked, one line naming the field."""
    spec = load_cluster("dgx-h100")
    layout = ClusterLayout(spec, 4, 8)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    assert layout.group_class((0, 8)) == layout.group_class((1, 9))
    first = cost.collective("all_reduce", (0, 8), 1 << 20)
    assert cost.collective("all_reduce", (1, 9), 1 << 20) == first
    with pytest.raises(ValueError, match="protocol: 'bogus' is not valid"):
        cost.collective("all_reduce", (1, 9), 1 << 21, protocol="bogus")
    with pytest.raises(ValueError, match="algorithm: 'nope' is not available"):
        cost.collective("all_reduce", (1, 9), 1 << 21, algorithm="nope")
    with pytest.raises(ValueError, match="size: -1 is negative"):
        cost.collective("all_reduce", (1, 9), -1)


def test_prices_ops_by_shape_knows_both_rooflines():
    """The roofline and the calibrated roofline price ops by shape (shared part prices),
    any other timer (a subclass that may read names included) does not; asking never
    needs the calibration module imported (a plan search on the roofline skips it)."""
    from hardware.calibration import CalibratedComputeModel
    from hardware.compute import ComputeModel
    from hardware.cost import prices_ops_by_shape

    gpu = load_cluster("dgx-h100").gpu

    class Named(ComputeModel):
        pass

    assert prices_ops_by_shape(ComputeModel(gpu))
    assert prices_ops_by_shape(CalibratedComputeModel(gpu, {}))
    assert not prices_ops_by_shape(Named(gpu))
    assert not prices_ops_by_shape(object())


def test_rank_layout_groups_interned_across_plans(monkeypatch):
    """RankLayout.group hands one tuple object per group to every plan of the same axis
    sizes and order (what identity-keyed cost tables hit), equal to the group computed
    afresh, for one and two axes, every order; other sizes get their own; the table
    starts again past its bound."""
    from strategies import plan as plan_module
    from strategies.plan import RankLayout
    from trainsim.api import make_plan

    for order in (("tp", "cp", "dp", "pp"), ("tp", "dp", "cp", "pp"), ("cp", "tp", "pp", "dp")):
        first = RankLayout(make_plan(gpus=64, tp=2, cp=2, pp=2, order=order))
        other = RankLayout(make_plan(gpus=64, tp=2, cp=2, pp=2, order=order,
                                     micro_batch=2, global_batch=64))
        for rank in (0, 5, 37, 63):
            for axes in (("tp",), ("dp",), ("dp", "cp"), ("cp",), ("pp",)):
                group = first.group(rank, *axes)
                assert group == first._group(rank, axes)
                assert other.group(rank, *axes) is group
    wider = RankLayout(make_plan(gpus=64, tp=4, cp=2, pp=2))
    assert wider.group(0, "dp") == tuple(range(0, 64, 8))[:4]
    assert wider.group(0, "dp") != RankLayout(make_plan(gpus=64, tp=2, cp=2, pp=2)).group(0, "dp")
    monkeypatch.setattr(plan_module, "_GROUP_RANKS_MAX", 8)
    monkeypatch.setattr(plan_module, "_GROUPS", {})
    monkeypatch.setattr(plan_module, "_GROUP_RANKS", 0)
    for rank in range(16):
        wider.group(rank, "tp")
    assert sum(map(len, plan_module._GROUPS.values())) <= 8


def test_efficiency_tables_read_every_row_by_header():
    """The compute tables (read with csv.reader by header column) hold, row for row,
    what csv.DictReader gives for the package's CSV files."""
    import csv
    import math
    from importlib import resources

    from hardware import compute

    text = resources.files("hardware.data").joinpath(compute.ATTENTION_TABLE).read_text()
    expected: dict = {}
    for r in csv.DictReader(text.splitlines()):
        key = (r["profile"], r["impl"], r["phase"], r["causal"] == "1")
        expected.setdefault(key, {}).setdefault(int(r["head_dim"]), []).append(
            (float(r["seq_len"]), float(r["efficiency"])))
    table = compute.load_attention_table()
    assert set(table) == set(expected)
    for key, by_dim in expected.items():
        for dim, knots in by_dim.items():
            knots.sort()
            assert table[key][dim] == (tuple(math.log(s) for s, _ in knots),
                                       tuple(math.log(e) for _, e in knots))
    text = resources.files("hardware.data").joinpath(compute.EFFICIENCY_TABLE).read_text()
    rows: dict = {}
    for r in csv.DictReader(text.splitlines()):
        rows.setdefault((r["profile"], r["dtype"]), []).append(
            (float(r["flops"]), float(r["efficiency"]), float(r["peak_flops_per_s"])))
    curves = compute.load_efficiency_table()
    assert sum(len(v) for v in curves.values()) == len(rows)
    for (profile, dtype), knots in rows.items():
        knots.sort()
        curve = curves[profile][dtype]
        assert curve.log_flops == tuple(math.log(f) for f, _, _ in knots)
        assert curve.log_efficiency == tuple(math.log(e) for _, e, _ in knots)
        assert curve.peak_flops_per_s == knots[0][2]
