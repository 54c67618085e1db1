"""Tests for strategies.program_check.check_program."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp
from strategies.program_check import ProgramError, check_program


def compute(name: str = "c", **kw) -> ComputeOp:
    kw.setdefault("kind", "matmul")
    kw.setdefault("flops", 1e9)
    kw.setdefault("bytes", 1e6)
    return ComputeOp(name=name, **kw)


def allreduce(key: str = "ar0", group=(0, 1, 2, 3), **kw) -> CollectiveOp:
    kw.setdefault("size_bytes", 1 << 20)
    return CollectiveOp(name=f"{key}.op", key=key, kind=kw.pop("kind", "all_reduce"), group=tuple(group), **kw)


def valid_program() -> Program:
    """4 ranks: forward compute, 1F1B-like activations/gradients 0<->1, all_reduce over all."""
    ops = {}
    for r in range(4):
        ops[r] = [compute(f"r{r}.fwd")]
    ops[0] += [
        SendOp(name="r0.send_act", peer=1, size_bytes=4096, tag="act0", deps=(0,)),
        RecvOp(name="r0.recv_grad", peer=1, size_bytes=4096, tag="grad0"),
        compute("r0.bwd", deps=(2,)),
        allreduce(deps=(3,)),
    ]
    ops[1] += [
        RecvOp(name="r1.recv_act", peer=0, size_bytes=4096, tag="act0"),
        compute("r1.bwd", deps=(1,)),
        SendOp(name="r1.send_grad", peer=0, size_bytes=4096, tag="grad0", deps=(2,)),
        allreduce(deps=(2,)),
    ]
    for r in (2, 3):
        ops[r] += [compute(f"r{r}.bwd"), allreduce(deps=(1,))]
    return Program(ops_by_rank=ops, world_size=4, name="valid")


def with_op(program: Program, rank: int, index: int, op) -> Program:
    ops = {r: list(v) for r, v in program.ops_by_rank.items()}
    ops[rank][index] = op
    return Program(ops_by_rank=ops, world_size=program.world_size)


def expect(program: Program, *patterns: str, world_size: int | None = None) -> str:
    with pytest.raises(ProgramError) as info:
        check_program(program, world_size=world_size)
    message = str(info.value)
    assert "\n" not in message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


def test_program_error_is_value_error():
    assert issubclass(ProgramError, ValueError)


def test_valid_program_passes():
    check_program(valid_program())
    check_program(valid_program(), world_size=8)  # a larger cluster is fine


def test_empty_program_passes():
    check_program(Program(ops_by_rank={}, world_size=2))
    check_program(Program(ops_by_rank={0: [], 1: []}, world_size=2))


def test_rank_key_outside_world():
    p = Program(ops_by_rank={0: [compute()], 4: [compute()]}, world_size=4)
    expect(p, r"rank 4", r"0\.\.3")


def test_rank_key_outside_cluster_world_size():
    expect(valid_program(), r"rank 2", r"0\.\.1", world_size=2)


def test_negative_rank_key():
    expect(Program(ops_by_rank={-1: [compute()]}, world_size=2), r"rank -1", r"outside")


def test_unknown_op_type():
    p = with_op(valid_program(), 2, 1, "not an op")
    expect(p, r"rank 2 op #1", r"str is not an op", r"ComputeOp, CollectiveOp, SendOp or RecvOp")


def test_compute_unknown_kind():
    p = with_op(valid_program(), 3, 0, compute("bad", kind="gemm"))
    expect(p, r"rank 3 op #0 'bad'", r"kind='gemm'", r"matmul")


@pytest.mark.parametrize("field", ["flops", "bytes"])
def test_compute_negative_amounts(field):
    p = with_op(valid_program(), 1, 0, compute("neg", **{field: -1.0}))
    expect(p, r"rank 1 op #0 'neg'", rf"{field}=-1\.0", r">= 0")


def test_compute_nan_flops():
    p = with_op(valid_program(), 1, 0, compute("nan", flops=float("nan")))
    expect(p, r"flops=nan", r"finite")


def test_collective_unknown_kind():
    p = with_op(valid_program(), 2, 2, allreduce(kind="allreduce", deps=(1,)))
    expect(p, r"rank 2 op #2 'ar0.op'", r"kind='allreduce'", r"all_reduce")


def test_collective_unknown_algorithm():
    p = with_op(valid_program(), 2, 2, allreduce(algorithm="butterfly"))
    expect(p, r"rank 2 op #2", r"algorithm='butterfly'", r"ring")


def test_collective_negative_size():
    p = with_op(valid_program(), 2, 2, allreduce(size_bytes=-5))
    expect(p, r"rank 2 op #2", r"size_bytes=-5")


def test_collective_empty_group():
    p = with_op(valid_program(), 2, 2, allreduce(group=()))
    expect(p, r"rank 2 op #2", r"group is empty")


def test_collective_duplicate_ranks_in_group():
    p = with_op(valid_program(), 2, 2, allreduce(group=(0, 1, 2, 2)))
    expect(p, r"rank 2 op #2", r"lists rank 2 twice")


def test_collective_member_outside_world():
    p = with_op(valid_program(), 2, 2, allreduce(group=(0, 1, 2, 7)))
    expect(p, r"rank 2 op #2", r"group member 7", r"0\.\.3")


def test_collective_holder_not_in_group():
    p = with_op(valid_program(), 2, 2, allreduce(group=(0, 1, 3)))
    expect(p, r"rank 2 op #2", r"not in its group \(0, 1, 3\)")


def test_broadcast_missing_root():
    op = CollectiveOp(name="bc", key="bc", kind="broadcast", group=(0, 1), size_bytes=8)
    p = Program(ops_by_rank={0: [op], 1: [op]}, world_size=2)
    expect(p, r"rank 0 op #0 'bc'", r"broadcast needs a root")


def test_reduce_root_not_in_group():
    op = CollectiveOp(name="rd", key="rd", kind="reduce", group=(0, 1), size_bytes=8, root=2)
    p = Program(ops_by_rank={0: [op], 1: [op]}, world_size=3)
    expect(p, r"rank 0 op #0 'rd'", r"root=2 is not in the group")


def test_broadcast_with_root_passes():
    op = CollectiveOp(name="bc", key="bc", kind="broadcast", group=(0, 1), size_bytes=8, root=1)
    check_program(Program(ops_by_rank={0: [op], 1: [op]}, world_size=2))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kind": "all_gather"}, "kind"),
        ({"size_bytes": 123}, "size_bytes"),
        ({"algorithm": "tree"}, "algorithm"),
        ({"group": (3, 2, 1, 0)}, "group"),
    ],
)
def test_collective_members_disagree(change, field):
    base = valid_program()
    op = replace(base.ops_by_rank[3][2], **change)
    p = with_op(base, 3, 2, op)
    expect(p, r"rank 3 op #2", rf"key 'ar0' has {field}=", r"rank 0 op #4", r"must agree")


def test_unmatched_collective():
    base = valid_program()
    ops = {r: list(v) for r, v in base.ops_by_rank.items()}
    del ops[3][2]
    expect(Program(ops_by_rank=ops, world_size=4), r"unmatched collective", r"rank 3 never issues", r"'ar0'")


def test_unmatched_collective_rank_absent():
    op = allreduce(group=(0, 1))
    expect(Program(ops_by_rank={0: [op]}, world_size=2), r"rank 0 op #0", r"rank 1 never issues")


def test_collective_key_issued_twice_by_a_rank():
    op = allreduce(group=(0, 1))
    p = Program(ops_by_rank={0: [op, op], 1: [op]}, world_size=2)
    expect(p, r"rank 0 op #1", r"issues collective key 'ar0' twice", r"op #0")


def test_dep_not_earlier():
    p = with_op(valid_program(), 2, 1, compute("self_dep", deps=(1,)))
    expect(p, r"rank 2 op #1 'self_dep'", r"dep 1 is not an earlier op", r"0\.\.0")


def test_dep_forward_reference():
    p = with_op(valid_program(), 2, 1, compute("fwd_dep", deps=(2,)))
    expect(p, r"rank 2 op #1", r"dep 2")


def test_dep_negative():
    p = with_op(valid_program(), 2, 1, compute("neg_dep", deps=(-1,)))
    expect(p, r"rank 2 op #1", r"dep -1")


def test_dep_on_first_op():
    p = with_op(valid_program(), 2, 0, compute("first", deps=(0,)))
    expect(p, r"rank 2 op #0 'first'", r"op #0 can have no deps")


@pytest.mark.parametrize("cls", [SendOp, RecvOp])
def test_peer_outside_world(cls):
    p = Program(ops_by_rank={0: [cls(name="p2p", peer=5, size_bytes=1, tag="t")]}, world_size=2)
    expect(p, r"rank 0 op #0 'p2p'", r"peer=5 is outside the world", r"0\.\.1")


@pytest.mark.parametrize("cls", [SendOp, RecvOp])
def test_peer_is_self(cls):
    p = Program(ops_by_rank={1: [cls(name="p2p", peer=1, size_bytes=1, tag="t")]}, world_size=2)
    expect(p, r"rank 1 op #0 'p2p'", r"peer=1 is the rank itself")


@pytest.mark.parametrize("cls", [SendOp, RecvOp])
def test_p2p_negative_size(cls):
    p = Program(ops_by_rank={0: [cls(name="p2p", peer=1, size_bytes=-1, tag="t")]}, world_size=2)
    expect(p, r"rank 0 op #0 'p2p'", r"size_bytes=-1")


def test_unmatched_send():
    p = Program(ops_by_rank={0: [SendOp(name="s", peer=1, size_bytes=8, tag="x")]}, world_size=2)
    expect(p, r"rank 0 op #0 's'", r"unmatched send", r"rank 1 has no RecvOp with peer=0, tag='x'")


def test_unmatched_recv():
    p = Program(ops_by_rank={1: [RecvOp(name="r", peer=0, size_bytes=8, tag="x")]}, world_size=2)
    expect(p, r"rank 1 op #0 'r'", r"unmatched recv", r"rank 0 has no SendOp with peer=1, tag='x'")


def test_send_recv_tag_mismatch():
    p = Program(
        ops_by_rank={
            0: [SendOp(name="s", peer=1, size_bytes=8, tag="x")],
            1: [RecvOp(name="r", peer=0, size_bytes=8, tag="y")],
        },
        world_size=2,
    )
    expect(p, r"unmatched send", r"tag='x'")


def test_send_recv_size_mismatch_reports_both_sides():
    p = Program(
        ops_by_rank={
            0: [SendOp(name="s", peer=1, size_bytes=8, tag="x")],
            1: [RecvOp(name="r", peer=0, size_bytes=16, tag="x")],
        },
        world_size=2,
    )
    expect(p, r"rank 0 op #0 's'", r"size_bytes=8", r"rank 1 op #0 'r'", r"size_bytes=16")


def test_duplicate_send_tag():
    s = SendOp(name="s", peer=1, size_bytes=8, tag="x")
    r = RecvOp(name="r", peer=0, size_bytes=8, tag="x")
    p = Program(ops_by_rank={0: [s, s], 1: [r, r]}, world_size=2)
    expect(p, r"rank 0 op #1", r"duplicate send to rank 1 with tag 'x'")


def test_deadlock_recv_before_send():
    p = Program(
        ops_by_rank={
            0: [
                RecvOp(name="r0.recv", peer=1, size_bytes=8, tag="b"),
                SendOp(name="r0.send", peer=1, size_bytes=8, tag="a"),
            ],
            1: [
                RecvOp(name="r1.recv", peer=0, size_bytes=8, tag="a"),
                SendOp(name="r1.send", peer=0, size_bytes=8, tag="b"),
            ],
        },
        world_size=2,
    )
    message = expect(p, r"deadlock", r"cycle of 4 ops")
    for op in ("r0.recv", "r0.send", "r1.recv", "r1.send"):
        assert op in message


def test_same_order_on_separate_streams_is_fine():
    p = Program(
        ops_by_rank={
            0: [
                RecvOp(name="r0.recv", peer=1, size_bytes=8, tag="b", stream="recv"),
                SendOp(name="r0.send", peer=1, size_bytes=8, tag="a", stream="send"),
            ],
            1: [
                RecvOp(name="r1.recv", peer=0, size_bytes=8, tag="a", stream="recv"),
                SendOp(name="r1.send", peer=0, size_bytes=8, tag="b", stream="send"),
            ],
        },
        world_size=2,
    )
    check_program(p)


def test_deadlock_collectives_in_different_orders():
    a = allreduce("A", group=(0, 1))
    b = allreduce("B", group=(0, 1))
    p = Program(ops_by_rank={0: [a, b], 1: [b, a]}, world_size=2)
    message = expect(p, r"deadlock", r"collective 'A' to be reached by", r"same order")
    assert "'A.op'" in message and "'B.op'" in message


def test_deadlock_through_explicit_dep_and_collective():
    # Rank 1's all_reduce (comm stream) waits via dep for compute that waits for
    # a recv whose send on rank 0 comes after rank 0's part of the all_reduce.
    ar = allreduce("G", group=(0, 1))
    p = Program(
        ops_by_rank={
            0: [ar, SendOp(name="s", peer=1, size_bytes=8, tag="t")],
            1: [
                RecvOp(name="r", peer=0, size_bytes=8, tag="t", stream="p2p"),
                compute("c", deps=(0,)),
                allreduce("G", group=(0, 1), deps=(1,)),
            ],
        },
        world_size=2,
    )
    message = expect(p, r"deadlock", r"explicit dep", r"send/recv partner")
    assert "'c'" in message


def test_large_program_checks():
    # ~10^5 ops: 8 ranks, pipeline-like p2p chain plus periodic all_reduces.
    world, steps = 8, 2200
    ops = {r: [] for r in range(world)}
    for step in range(steps):
        for r in range(world):
            ops[r].append(ComputeOp(name=f"f{step}", kind="matmul", flops=1.0, bytes=1.0))
            if r + 1 < world:
                ops[r].append(
                    SendOp(name=f"s{step}", peer=r + 1, size_bytes=64, tag=f"{step}", deps=(len(ops[r]) - 1,))
                )
            if r > 0:
                ops[r].append(RecvOp(name=f"r{step}", peer=r - 1, size_bytes=64, tag=f"{step}"))
            if step % 10 == 0:
                ops[r].append(
                    CollectiveOp(name=f"ar{step}", key=f"ar{step}", kind="all_reduce",
                                 group=tuple(range(world)), size_bytes=1024, deps=(len(ops[r]) - 1,))
                )
            for k in range(3):
                ops[r].append(ComputeOp(name=f"b{step}.{k}", kind="elementwise"))
    p = Program(ops_by_rank=ops, world_size=world)
    assert p.num_ops() >= 100_000
    check_program(p)
    # A break at the very end is still found.
    ops[world - 1].append(RecvOp(name="orphan", peer=0, size_bytes=1, tag="never"))
    expect(Program(ops_by_rank=ops, world_size=world), r"orphan", r"unmatched recv")


def test_invalid_world_size():
    with pytest.raises(ProgramError, match="world_size=0"):
        check_program(valid_program(), world_size=0)


def test_deadlock_reports_waiting_reasons():
    p = Program(
        ops_by_rank={
            0: [
                RecvOp(name="r0.recv", peer=1, size_bytes=8, tag="b"),
                SendOp(name="r0.send", peer=1, size_bytes=8, tag="a"),
            ],
            1: [
                RecvOp(name="r1.recv", peer=0, size_bytes=8, tag="a"),
                SendOp(name="r1.send", peer=0, size_bytes=8, tag="b"),
            ],
        },
        world_size=2,
    )
    expect(p, r"'r0.recv' \(RecvOp\) waits for its send/recv partner to be reached by: "
              r"rank 1 op #1 'r1.send'",
           r"waits for the previous op on stream 'comm'")


def test_send_is_a_rendezvous_so_both_sending_first_deadlocks():
    """NCCL's send blocks until the peer posts the recv (as the engine models it)."""
    p = Program(
        ops_by_rank={
            0: [
                SendOp(name="r0.send", peer=1, size_bytes=8, tag="a"),
                RecvOp(name="r0.recv", peer=1, size_bytes=8, tag="b"),
            ],
            1: [
                SendOp(name="r1.send", peer=0, size_bytes=8, tag="b"),
                RecvOp(name="r1.recv", peer=0, size_bytes=8, tag="a"),
            ],
        },
        world_size=2,
    )
    expect(p, r"deadlock", r"send/recv partner")


def test_send_recv_on_separate_streams_do_not_deadlock():
    """The usual fix (batched isend/irecv): sends and recvs on different streams."""
    p = Program(
        ops_by_rank={
            0: [
                SendOp(name="r0.send", peer=1, size_bytes=8, tag="a", stream="send"),
                RecvOp(name="r0.recv", peer=1, size_bytes=8, tag="b", stream="recv"),
            ],
            1: [
                SendOp(name="r1.send", peer=0, size_bytes=8, tag="b", stream="send"),
                RecvOp(name="r1.recv", peer=0, size_bytes=8, tag="a", stream="recv"),
            ],
        },
        world_size=2,
    )
    check_program(p)


def test_gc_state_restored():
    import gc

    assert gc.isenabled()
    check_program(valid_program())
    assert gc.isenabled()
    with pytest.raises(ProgramError):
        check_program(Program(ops_by_rank={0: [SendOp(name="s", peer=1, size_bytes=1, tag="x")]}, world_size=2))
    assert gc.isenabled()
