"""Engine semantics: stream order, dependencies, rendezvous, overlap, determinism."""

from __future__ import annotations

import json

import pytest

from hardware.catalog import load_cluster
from hardware.topology import ClusterLayout
from sim.engine import Engine
from hardware.cost import CostModel
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import (COMPUTE_STREAM, CollectiveOp, ComputeOp, Program,
                           RecvOp, SendOp)


class FlopsTimer:
    """Test timer: 1 ns per 1,000 FLOPs, so durations are obvious."""

    def duration_ns(self, op: ComputeOp) -> int:
        return int(op.flops // 1000)


def compute(name, flops, deps=(), stream=COMPUTE_STREAM):
    return ComputeOp(name=name, kind="matmul", flops=flops, bytes=0, deps=deps, stream=stream)


def run(program, nodes=1, gpn=8, fidelity="analytic", preset="dgx-h100"):
    # GPUs alike (no expected-slowest factor): the hand-timed ops keep their flop times
    layout = ClusterLayout(load_cluster(preset, {"gpu.speed_spread": 0.0}), nodes, gpn)
    return Engine(program, CostModel(layout, ALGORITHMS, fidelity=fidelity,
                                     compute=FlopsTimer())).run()


def spans(result):
    return {(s.rank, s.op): (s.start_ns, s.end_ns) for s in result.timeline.spans()}


def test_ops_on_one_stream_run_in_order_and_deps_cross_streams():
    ops = [
        compute("fwd", 1_000_000),                       # 0: 0..1000
        compute("bwd", 2_000_000),                       # 1: 1000..3000
        CollectiveOp(name="grad", key="g", kind="all_reduce", group=(0,), size_bytes=1 << 20,
                     deps=(1,)),                         # 2: waits for bwd (single rank: free)
        compute("opt", 500_000, deps=(2,)),              # 3: after the all-reduce
    ]
    result = run(Program(ops_by_rank={0: ops}, world_size=1), gpn=1)
    got = spans(result)
    assert got[(0, "fwd")] == (0, 1000)
    assert got[(0, "bwd")] == (1000, 3000)
    assert got[(0, "grad")] == (3000, 3000)
    assert got[(0, "opt")] == (3000, 3500)


def test_communication_overlaps_compute_on_its_own_stream():
    """A gradient all-reduce of layer 2 runs while layer 1's backward computes."""
    group = tuple(range(8))
    ops = {}
    for rank in group:
        ops[rank] = [
            compute("bwd.layer2", 1_000_000),
            CollectiveOp(name="ar.layer2", key="ar2", kind="all_reduce", group=group,
                         size_bytes=64 << 20, deps=(0,)),
            compute("bwd.layer1", 1_000_000_000, deps=(0,)),
        ]
    result = run(Program(ops_by_rank=ops, world_size=8))
    got = spans(result)
    ar_start, ar_end = got[(0, "ar.layer2")]
    bwd_start, bwd_end = got[(0, "bwd.layer1")]
    assert ar_start == bwd_start == 1000
    assert ar_end < bwd_end  # hidden under compute
    assert result.makespan_ns == bwd_end


def test_collective_starts_when_the_last_member_arrives():
    group = (0, 1)
    ops = {
        0: [CollectiveOp(name="ar", key="k", kind="all_reduce", group=group, size_bytes=1 << 20)],
        1: [compute("late", 5_000_000),
            CollectiveOp(name="ar", key="k", kind="all_reduce", group=group, size_bytes=1 << 20,
                         deps=(0,))],
    }
    result = run(Program(ops_by_rank=ops, world_size=2), gpn=2)
    got = spans(result)
    early_start, early_end = got[(0, "ar")]
    late_start, late_end = got[(1, "ar")]
    # Data moves once the late rank arrives; the early rank's wait is idle time.
    assert early_start == late_start == 5000
    assert early_end == late_end > 5000


def test_send_recv_pair_moves_data_after_both_sides_arrive():
    size = 256 << 20
    ops = {
        0: [compute("stage0.fwd", 2_000_000),
            SendOp(name="act", peer=8, size_bytes=size, tag="mb0", deps=(0,))],
        8: [RecvOp(name="act", peer=0, size_bytes=size, tag="mb0"),
            compute("stage1.fwd", 2_000_000, deps=(0,))],
    }
    result = run(Program(ops_by_rank=ops, world_size=16), nodes=2)
    got = spans(result)
    send_start, send_end = got[(0, "act")]
    recv_start, recv_end = got[(8, "act")]
    assert recv_start == send_start == 2000  # the receiver idles until the sender comes
    assert send_end == recv_end
    cluster = load_cluster("dgx-h100")
    rate = (cluster.nic.bytes_per_s * cluster.nic.link_efficiency
            * cluster.comm.p2p_efficiency["network"])
    assert send_end - send_start >= size / rate * 1e9
    assert got[(8, "stage1.fwd")][0] == recv_end


def test_deadlock_is_reported_not_hung():
    ops = {
        0: [RecvOp(name="r", peer=1, size_bytes=8, tag="a"),
            SendOp(name="s", peer=1, size_bytes=8, tag="b")],
        1: [RecvOp(name="r", peer=0, size_bytes=8, tag="b"),
            SendOp(name="s", peer=0, size_bytes=8, tag="a")],
    }
    program = Program(ops_by_rank=ops, world_size=2)
    with pytest.raises(ValueError, match="deadlock"):  # the validator, before running
        run(program, gpn=2)
    layout = ClusterLayout(load_cluster("dgx-h100"), 1, 2)
    with pytest.raises(RuntimeError, match="deadlock"):  # and the engine, if asked not to check
        Engine(program, CostModel(layout, ALGORITHMS), check=False).run()


def test_program_larger_than_the_layout_is_rejected():
    program = Program(ops_by_rank={0: [compute("x", 1)]}, world_size=16)
    with pytest.raises(ValueError, match="world_size"):
        run(program, nodes=1, gpn=8)


@pytest.mark.parametrize("fidelity", ["analytic", "flow"])
def test_identical_inputs_give_identical_timelines(fidelity):
    def build():
        ops = {}
        for rank in range(16):
            ops[rank] = [compute("f", 1_000_000 + 1000 * rank),
                         CollectiveOp(name="tp", key=f"tp{rank // 8}", kind="all_reduce",
                                      group=tuple(range(rank // 8 * 8, rank // 8 * 8 + 8)),
                                      size_bytes=32 << 20, deps=(0,)),
                         CollectiveOp(name="dp", key=f"dp{rank % 8}", kind="all_reduce",
                                      group=(rank % 8, rank % 8 + 8), size_bytes=64 << 20,
                                      deps=(1,))]
        return Program(ops_by_rank=ops, world_size=16)

    first = run(build(), nodes=2, fidelity=fidelity).timeline.to_chrome_trace()
    second = run(build(), nodes=2, fidelity=fidelity).timeline.to_chrome_trace()
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_concurrent_dp_rings_contend_on_shared_nics_at_flow_fidelity():
    """8 DP groups (one per GPU index) across 2 nodes, 4 NICs per node: pairs of
    groups share a NIC, so the flow model is slower than the analytic one."""
    ops = {}
    for rank in range(16):
        ops[rank] = [CollectiveOp(name="dp", key=f"dp{rank % 8}", kind="all_reduce",
                                  group=(rank % 8, rank % 8 + 8), size_bytes=1 << 30,
                                  algorithm="ring")]
    program = Program(ops_by_rank=ops, world_size=16)
    layout = ClusterLayout(load_cluster("dgx-h100", {"nic.count_per_node": 4}), 2, 8)
    analytic = Engine(program, CostModel(layout, ALGORITHMS, fidelity="analytic")).run().makespan_ns
    flow = Engine(program, CostModel(layout, ALGORITHMS, fidelity="flow")).run().makespan_ns
    assert flow > 1.5 * analytic


def test_symmetry_reduced_program_gives_the_representatives_full_timeline():
    """A data-parallel job where every rank does the same: simulating one
    representative per pipeline stage gives that rank's exact timeline."""
    def build(ranks):
        ops = {}
        for rank in ranks:
            stage, dp = divmod(rank, 8)
            group = tuple(stage * 8 + i for i in range(8))
            ops[rank] = [compute("f", 1_000_000 * (stage + 1)),
                         CollectiveOp(name="ar", key=f"ar{stage}", kind="all_reduce",
                                      group=group, size_bytes=64 << 20, deps=(0,)),
                         compute("g", 500_000, deps=(1,))]
        return ops

    full = run(Program(ops_by_rank=build(range(16)), world_size=16), nodes=2)
    reduced = run(Program(ops_by_rank=build([0, 8]), world_size=16,
                          represents={0: 8, 8: 8}), nodes=2)
    full_spans = {k: v for k, v in spans(full).items() if k[0] in (0, 8)}
    assert spans(reduced) == full_spans
