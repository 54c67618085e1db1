"""Replayed layer passes (strategies.lowering.StepLowerer._replayed): the Program a step
lowers to is op for op the one every pass built kernel by kernel gives."""

from __future__ import annotations

import pytest

from strategies.lowering import StepLowerer
from strategies.models import load_model
from trainsim.api import make_plan

CASES = [
    ("llama3-70b", 1024, dict(tp=2, pp=2, cp=2, vpp=4, zero=2, global_batch=256, seq_len=4096)),
    ("llama3-8b", 32, dict(tp=2, pp=4, global_batch=64, schedule="zb-h2", recompute="selective")),
    ("llama3-8b", 32, dict(tp=2, pp=2, cp=2, global_batch=64, seq_len=8192, recompute="full",
                           cp_comm_type="torch_allgather", zero=3)),
    ("llama3-8b", 16, dict(tp=2, pp=2, vpp=2, global_batch=32, dtype="fp8",
                           fp8_recipe="te-delayed", tp_comm_overlap="userbuffers")),
    ("mixtral-8x7b", 64, dict(tp=2, pp=4, ep=4, global_batch=64, schedule="dualpipe",
                              host_issue="eager")),
    ("mixtral-8x7b", 64, dict(tp=1, pp=4, ep=8, vpp=2, global_batch=64, moe_a2a_overlap=True)),
]


@pytest.mark.parametrize("name, gpus, fields", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_replayed_passes_build_the_same_program(name, gpus, fields, monkeypatch):
    model, plan = load_model(name), make_plan(gpus=gpus, **fields)
    replayed = StepLowerer(model, plan, domain_gpus=8).lower().program
    counts = {"replays": 0}
    original = StepLowerer._replay

    def counting(self, *args):
        counts["replays"] += 1
        return original(self, *args)

    monkeypatch.setattr(StepLowerer, "_replay", counting)
    StepLowerer(model, plan, domain_gpus=8).lower()
    assert counts["replays"] > 0  # the replay path is exercised
    monkeypatch.setattr(StepLowerer, "_replayed", lambda self, b, what, tag, emit: emit())
    built = StepLowerer(model, plan, domain_gpus=8).lower().program
    assert sorted(replayed.ops_by_rank) == sorted(built.ops_by_rank)
    for rank, ops in built.ops_by_rank.items():
        assert replayed.ops_by_rank[rank] == ops, rank


def test_a_pass_without_a_recording_is_built_every_time(monkeypatch):
    """A pass :func:`_record_template` refuses (None) is emitted kernel by kernel for every
    micro-batch: never replayed, the same Program."""
    import strategies.lowering as lowering

    model, plan = load_model("llama3-8b"), make_plan(gpus=16, tp=2, pp=2, vpp=2, global_batch=32)
    expected = StepLowerer(model, plan, domain_gpus=8).lower().program
    monkeypatch.setattr(lowering, "_record_template", lambda *args: None)
    replays = []
    monkeypatch.setattr(StepLowerer, "_replay", lambda self, *args: replays.append(args))
    refused = StepLowerer(model, plan, domain_gpus=8).lower().program
    assert replays == []
    assert refused.ops_by_rank == expected.ops_by_rank


def test_passes_that_cannot_be_renamed_are_not_recorded():
    """A collective whose name does not hold the pass's tag once, or a dependency before
    the pass that is not one of its entry ops, leaves the pass unrecorded (None)."""
    from strategies.ir import CollectiveOp
    from strategies.lowering import _RankBuilder, _record_template

    b = _RankBuilder(0, {})
    b.add(CollectiveOp(name="tp.all_gather.x", key="k#0", kind="all_gather", group=(0, 1),
                       size_bytes=8))
    assert _record_template(b, 0, (), "F0.mb1") is None
    b2 = _RankBuilder(0, {})
    b2.add(CollectiveOp(name="tp.all_gather.l0.F0.mb0", key="k#0", kind="all_gather",
                        group=(0, 1), size_bytes=8))
    b2.add(CollectiveOp(name="tp.all_gather.l0.F0.mb1", key="k#1", kind="all_gather",
                        group=(0, 1), size_bytes=8, deps=(0,)))
    # a dependency before the pass (op 1) that is not one of its entry ops: not replayable
    assert _record_template(b2, 1, (), "F0.mb1") is None
    assert _record_template(b2, 1, (0,), "F0.mb1") is not None
