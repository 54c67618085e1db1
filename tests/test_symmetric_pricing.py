"""Collectives priced once per class of symmetric groups (ClusterLayout.group_class)
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
