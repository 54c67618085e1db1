"""Prices shared across plans (sim.analytic_prices.SharedPrices, the memory model's memo,
the compiled pipeline replay) change no result: plans that differ in each field a shared
price is said not to read are evaluated one after another on one PricingCache and each
alone without one, and must agree exactly."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import tiny_models
from hardware.catalog import load_cluster
from sim.analytic_prices import _NOT_IN_OPTIMIZER, _NOT_IN_PARTS
from sim.analytic_step import PricingCache
from sim.step import simulate_step
from strategies import memory
from trainsim.api import make_plan

#: A value other than the base plan's for the fields a shared price may not read.
VARIANTS = dict(
    dp=[1, 4], pp=[1, 4], vpp=[2], global_batch=[128], zero=[2, 3], schedule=["zb-h1"],
    grad_bucket_bytes=[2**20], overlap_grad_reduce=[False], overlap_param_gather=[True],
    grad_reduce_dtype=["fp32"], recompute_layers=[1], recompute=["full"],
    optimizer_impl=["unfused"], store_param_remainders=[True],
    activation_offload_layers=[1], tp_comm_overlap=[True], micro_batch=[2], seq_len=[2048],
    dp_shard=[2], amax_reduction=["none"], tp_only_amax_red=[True],
)


def _result(model, cluster, plan, cache):
    r = simulate_step(model, cluster, plan, fidelity="analytic", check_memory=False,
                      cache=cache)
    return (r.step_time_s, r.peak_memory_bytes, r.breakdown, r.stage_breakdown, r.memory)


def _plans(base):
    out = [base]
    for name, values in VARIANTS.items():
        for value in values:
            fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
            fields[name] = value
            if name in ("dp", "pp"):
                fields["global_batch"] = 64
                fields["pp"] = value if name == "pp" else base.pp
                fields["dp"] = 16 // (base.tp * fields["pp"]) if name == "pp" else value
                fields["layers_per_stage"] = None
            if name == "vpp":
                fields["schedule"] = "interleaved"
            try:
                out.append(make_plan(**{k: v for k, v in fields.items()
                                        if v is not None}))
            except ValueError:
                continue
    return out


@pytest.mark.parametrize("which", ["dense", "moe", "dense-fp8"])
def test_shared_prices_give_each_plan_its_own_result(which):
    """(dense-fp8: te-delayed FP8, whose amax part is keyed by its bytes and group, not
    by amax_reduction / tp_only_amax_red, which no layer, edge or optimizer reads)"""
    dense, moe = tiny_models()
    model = moe if which == "moe" else dense
    cluster = load_cluster("dgx-h100")
    base = make_plan(gpus=16, tp=2, pp=2, micro_batch=1, global_batch=64, seq_len=1024,
                     ep=2 if which == "moe" else 1,
                     dtype="fp8" if which == "dense-fp8" else "bf16")
    plans = []
    for plan in _plans(base):
        try:
            _result(model, cluster, plan, None)
        except ValueError:  # a combination the model or cluster refuses
            continue
        plans.append(plan)
    assert len(plans) > 10
    memory._CACHE.clear()
    cache = PricingCache()
    shared = [_result(model, cluster, plan, cache) for plan in plans]
    memory._CACHE.clear()
    alone = [_result(model, cluster, plan, None) for plan in plans]
    assert shared == alone


def test_the_lists_of_fields_not_read_are_plan_fields():
    names = {f.name for f in dataclasses.fields(make_plan(gpus=8))}
    assert _NOT_IN_PARTS <= names and _NOT_IN_OPTIMIZER <= names
    assert memory._NOT_IN_ACTIVATIONS <= names and memory._NOT_IN_STATES <= names


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_phases_that_recompute_nothing_read_no_recompute_field(which):
    """A layer's F and W and the edges in every phase are priced under the
    ``part_no_recompute`` fields (sim.analytic_prices.part_recomputes): their ops must be
    the same whatever the recompute fields say, on plans with TP, CP, sequence
    parallelism, pipelined TP and FP8; a layer's B, which recomputes, must differ."""
    from sim.analytic_prices import part_recomputes
    from strategies.lowering import StepLowerer

    dense, moe = tiny_models()
    model = dense if which == "dense" else moe
    recomputes = [dict(recompute="none"), dict(recompute="selective"),
                  dict(recompute="selective", recompute_modules=("core_attn", "mlp")),
                  dict(recompute="full"), dict(recompute="full", recompute_early_stop=True)]
    bases = [dict(tp=2, cp=2, schedule="zb-h1", pp=2),
             dict(tp=2, sequence_parallel=False, pp=2),
             dict(tp=2, tp_comm_overlap="userbuffers", dtype="fp8", pp=2)]
    if which == "moe":
        bases = [dict(base, ep=2) for base in bases]
    checked = 0
    for base in bases:
        ops = {}
        for fields in recomputes:
            try:
                plan = make_plan(gpus=16, micro_batch=1, global_batch=64, seq_len=1024,
                                 **base, **fields)
                lowerer = StepLowerer(model, plan, domain_gpus=8)
            except ValueError:
                continue
            comps = ("F", "B", "I", "W") if lowerer.schedule.split_backward else ("F", "B")
            ops[tuple(fields.items())] = {
                (part, comp): lowerer.phase_ops(0, part, comp)
                for part in (0, "embedding", "head") for comp in comps}
        assert len(ops) >= 4, base
        rows = list(ops.values())
        for row in rows[1:]:
            for (part, comp), listed in row.items():
                if not part_recomputes(part, comp):
                    assert listed == rows[0][(part, comp)], (base, part, comp)
                    checked += 1
        assert any(row[(0, "B")] != rows[0][(0, "B")] for row in rows[1:])
    assert checked > 30
