"""Transformer Engine delayed scaling's amax all-reduce (issue 12, FP8 as Megatron-Core runs
it): one blocking fp32 MAX all-reduce over TP x DP x CP after every model chunk's forward
and backward (strategies.lowering ``StepLowerer._amax_reduction``). Where it appears, its
group and bytes exactly, and every fidelity pricing it alike."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from hardware.catalog import load_cluster
from sim.analytic_batch import BatchStepEvaluator
from sim.step import simulate_step
from strategies.ir import CollectiveOp
from strategies.lowering import lower_step
from strategies.models import load_model
from trainsim.api import make_plan

MODEL = "llama3-8b"  # 32 layers, 4 FP8 GEMMs each (qkv, out, gate_up, down)


def _amax_ops(plan, model=MODEL):
    """The amax all-reduces of pipeline rank 0's representative, by name."""
    lowering = lower_step(load_model(model), plan)
    ops = lowering.program.ops_by_rank[lowering.representatives[0]]
    return [op for op in ops if isinstance(op, CollectiveOp) and op.name.startswith("amax.")]


def _plan(**fields):
    base = dict(gpus=64, tp=2, pp=4, dtype="fp8", seq_len=4096, global_batch=64,
                micro_batch=1)
    base.update(fields)
    return make_plan(**base)


def test_one_forward_and_one_backward_reduction_per_microbatch_and_chunk():
    plan = _plan(vpp=2)  # dp 8, 64 / 8 = 8 micro-batches, 2 chunks per rank
    ops = _amax_ops(plan)
    counts = Counter(op.name for op in ops)
    assert counts == {"amax.all_reduce.fwd": 8 * 2, "amax.all_reduce.bwd": 8 * 2}
    # the rank holds 32 / 4 = 8 layers (both chunks: TE's buffer is per recipe and group,
    # not per region) of 4 FP8 GEMMs: 3 fp32 amaxes per GEMM forward, 2 backward
    sizes = {op.name: op.size_bytes for op in ops}
    assert sizes == {"amax.all_reduce.fwd": 4 * 3 * 4 * 8, "amax.all_reduce.bwd": 4 * 2 * 4 * 8}
    for op in ops:
        assert op.kind == "all_reduce" and op.stream == "compute" and op.axis == "dp"
        assert op.dtype == "fp32"
        assert len(op.group) == plan.tp * plan.cp * plan.dp == 16


def test_tp_only_amax_red_shrinks_the_group_to_tp_times_cp():
    ops = _amax_ops(_plan(tp=2, cp=2, pp=2, tp_only_amax_red=True))
    assert ops and all(len(op.group) == 2 * 2 for op in ops)
    assert all(len(op.group) == 2 * 2 * 8 for op in _amax_ops(_plan(tp=2, cp=2, pp=2)))


@pytest.mark.parametrize("fields", [dict(dtype="bf16"), dict(fp8_recipe="te-current"),
                                    dict(fp8_recipe="te-mxfp8"), dict(fp8_recipe="torchao"),
                                    dict(amax_reduction="none")],
                         ids=lambda f: "-".join(str(v) for v in f.values()))
def test_no_reduction_outside_megatron_delayed_scaling(fields):
    assert _amax_ops(_plan(**fields)) == []


def test_a_group_of_one_reduces_nothing():
    assert _amax_ops(_plan(gpus=4, tp=1, pp=4, global_batch=8, tp_only_amax_red=True)) == []


def test_grouped_expert_gemms_count_one_amax_set_per_local_expert():
    """Mixtral 8x7B with ep 4: each MoE layer has qkv, out and 8 / 4 = 2 local experts'
    gate_up and down (TE GroupedLinear: num_gemms = local experts); the router is bf16."""
    plan = make_plan(gpus=32, tp=2, ep=4, pp=2, dtype="fp8", seq_len=4096, global_batch=32)
    gemms_per_layer = 2 + 2 * 2
    layers = 32 // 2
    sizes = {op.name: op.size_bytes for op in _amax_ops(plan, "mixtral-8x7b")}
    assert sizes == {"amax.all_reduce.fwd": 4 * 3 * gemms_per_layer * layers,
                     "amax.all_reduce.bwd": 4 * 2 * gemms_per_layer * layers}


@pytest.mark.parametrize("fields", [dict(), dict(vpp=2, schedule="interleaved"),
                                    dict(schedule="zb-h1"), dict(pp=1, gpus=16)],
                         ids=["1f1b", "interleaved", "zb-h1", "no-pipeline"])
def test_analytic_equals_event_to_the_ns(fields):
    model, cluster = load_model(MODEL), load_cluster("dgx-h100")
    plan = _plan(**{"gpus": 32, "global_batch": 32, **fields})
    analytic, event = (simulate_step(model, cluster, plan, fidelity=f, check_memory=False)
                       for f in ("analytic", "event"))
    assert analytic.step_time_s == event.step_time_s
    bare = simulate_step(model, cluster, replace(plan, amax_reduction="none"),
                         fidelity="analytic", check_memory=False)
    assert analytic.step_time_s > bare.step_time_s
    # the compute stream waits for it: the exposed data-parallel time grows
    assert analytic.breakdown["exposed_dp"] > bare.breakdown["exposed_dp"]


def test_batch_evaluator_gives_the_single_plan_step():
    model, cluster = load_model(MODEL), load_cluster("dgx-h100")
    plans = [_plan(gpus=32, global_batch=32, **f) for f in (dict(), dict(vpp=2),
                                                            dict(tp_only_amax_red=True))]
    evaluator = BatchStepEvaluator(model, cluster)
    got = evaluator.step_ns(plans)
    for plan, step_ns in zip(plans, got, strict=True):
        assert not evaluator.covers(plan)  # handed to analytic_step
        assert step_ns / 1e9 == simulate_step(model, cluster, plan, fidelity="analytic",
                                              check_memory=False).step_time_s


def test_bad_amax_reduction_is_a_one_line_error():
    with pytest.raises(ValueError, match="amax_reduction") as error:
        _plan(amax_reduction="always")
    assert "\n" not in str(error.value) and "megatron" in str(error.value)


def test_simulate_says_where_the_amax_time_goes(capsys):
    from trainsim.cli import main

    args = ["simulate", "--model", MODEL, "--cluster", "dgx-h100", "--gpus", "16", "--tp",
            "2", "--global-batch", "32", "--fidelity", "analytic"]
    try:
        main(args + ["--dtype", "fp8"])
    except SystemExit as stop:
        assert not stop.code
    out = " ".join(line.lstrip("#").strip() for line in capsys.readouterr().out.splitlines())
    assert ("FP8 amaxes all-reduced over TP x DP x CP after each chunk's forward and "
            "backward (exposed dp)") in out
    try:
        main(args)  # bf16: no amax reduction
    except SystemExit as stop:
        assert not stop.code
    assert "amaxes" not in capsys.readouterr().out
