"""The host as a resource (issue 12): the CPU thread that issues a rank's kernels in
program order (``ParallelPlan.host_issue``), the dropless MoE dispatcher's device-to-host
sync, and the closed form and event replay honouring both the same way.

Closed forms asserted exactly: the CPU launches of each op (one per kernel; the
unfused router's 72 per pass, NVIDIA's DeepSeek-V3 GB200 guide; per local expert for
Transformer Engine's grouped GEMM and its quantization), the sync's placement
(Megatron-Core ``cuda_sync_point``), and the list schedule of a host-bound op list
``end_i = max(end_{i-1}, issue_i) + duration_i`` with the issue restarting after a sync.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware.catalog import load_cluster
from hardware.compute import HOST_ISSUE_S
from hardware.cost import CostModel
from sim.analytic_step import OpPricer
from sim.engine import Engine
from sim.step import job_layout, simulate_step
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp, ComputeOp, Program
from strategies.lowering import ROUTER_HOST_LAUNCHES, StepLowerer
from strategies.models import load_model
from strategies.plan import ParallelPlan


def _model():
    model = load_model("mixtral-8x7b")
    return replace(model, num_layers=2)


def _plan(**kw):
    base = dict(dp=8, ep=8, micro_batch=1, global_batch=16, seq_len=1024, dtype="fp8",
                host_issue="eager")
    base.update(kw)
    return ParallelPlan(**base)


def test_host_launches_per_op_and_the_dropless_sync():
    model = _model()
    lowerer = StepLowerer(model, _plan(ep=4))  # 8 experts over EP 4: 2 local experts
    ops = lowerer.phase_ops(0, 0, "F")
    by_name = {op.name.split(".F")[0]: op for op in ops if isinstance(op, ComputeOp)}
    assert by_name["moe.route"].host_launches == ROUTER_HOST_LAUNCHES == 72
    assert by_name["moe.experts.gate_up"].host_launches == 2        # one GEMM per expert
    assert by_name["moe.experts.gate_up.quant"].host_launches == 2  # one cast per expert
    assert by_name["attn.qkv"].host_launches == by_name["attn.qkv"].launches
    backward = {op.name.split(".B")[0]: op for op in lowerer.phase_ops(0, 0, "B")
                if isinstance(op, ComputeOp)}
    assert backward["moe.experts.gate_up"].host_launches == 4       # data + weight gradient
    syncs = [i for i, op in enumerate(ops) if getattr(op, "host_sync", False)]
    assert len(syncs) == 1
    # dropless: the sync sits right before the EP all-to-all (cuda_sync_point
    # "before_ep_alltoall"), after the permute
    assert ops[syncs[0] - 1].name.startswith("moe.permute")
    assert isinstance(ops[syncs[0] + 1], CollectiveOp) and ops[syncs[0] + 1].axis == "ep"
    assert not any(getattr(op, "host_sync", False) for op in lowerer.phase_ops(0, 0, "B"))
    # a capacity with padding has static shapes: no sync; off: no host cost at all
    padded = StepLowerer(model, _plan(ep=4, moe_capacity_factor="1.0",
                                      moe_pad_to_capacity=True)).phase_ops(0, 0, "F")
    assert not any(getattr(op, "host_sync", False) for op in padded)
    off = StepLowerer(model, _plan(ep=4, host_issue="off")).phase_ops(0, 0, "F")
    assert not any(getattr(op, "host_launches", 0) or getattr(op, "host_sync", False)
                   for op in off)
    # partial CUDA graphs replay attention and router; the experts stay eager
    partial = {op.name.split(".F")[0]: op for op in StepLowerer(
        model, _plan(ep=4, host_issue="partial")).phase_ops(0, 0, "F")
        if isinstance(op, ComputeOp)}
    assert partial["attn.qkv"].host_launches == partial["moe.route"].host_launches == 0
    assert partial["moe.experts.gate_up"].host_launches == 2


def test_bad_host_issue_is_a_one_line_error():
    with pytest.raises(ValueError, match="host_issue"):
        _plan(host_issue="cudagraph")


def _cost():
    cluster = load_cluster("dgx-h100")
    return CostModel(job_layout(cluster, 8), ALGORITHMS, fidelity="event")


def test_list_schedule_of_a_host_bound_stream_and_a_sync_closed_form():
    cost = _cost()
    tiny = ComputeOp(name="tiny", kind="elementwise", bytes=1e3, host_launches=3)
    long = ComputeOp(name="long", kind="elementwise", bytes=3e9, host_launches=1)
    sync = ComputeOp(name="sync", kind="memcpy", bytes=64, host_launches=1, host_sync=True)
    first = ComputeOp(name="first", kind="elementwise", bytes=1e3)  # the timeline's origin
    ops = [first, tiny, tiny, long, sync, tiny]
    host = [cost.host_ns(op) for op in ops]
    assert host[0] == 0 and host[1] == round(3 * HOST_ISSUE_S["eager"] * 1e9)
    dur = [cost.compute_ns(op) for op in ops]
    end, issued = 0, 0
    for i, op in enumerate(ops):
        issued += host[i]
        end = max(end, issued) + dur[i]
        if op.host_sync:
            issued = max(issued, end)
    got = OpPricer(cost).schedule(ops)
    assert got.total_ns == end
    assert got.total_ns > sum(dur)  # the GPU waited for the CPU
    # the event engine's CPU process gives the same end on one rank
    program = Program(world_size=1, ops_by_rank={0: list(ops)})
    assert Engine(program, cost).run().makespan_ns == end


def test_analytic_equals_event_for_one_moe_rank_with_host_issue():
    model = _model()
    cluster = load_cluster("dgx-h100")
    plan = _plan(dp=1, ep=1, global_batch=1)
    event = simulate_step(model, cluster, plan, fidelity="event", check_memory=False)
    analytic = simulate_step(model, cluster, plan, fidelity="analytic", check_memory=False)
    off = simulate_step(model, cluster, replace(plan, host_issue="off"), fidelity="analytic",
                        check_memory=False)
    assert analytic.step_time_s > off.step_time_s
    # one micro-batch: each phase starts with the CPU level with the GPU in both
    assert analytic.step_time_s == pytest.approx(event.step_time_s, rel=0.02)


def test_cpu_only_calls_and_te_module_calls_closed_form():
    """Beyond kernel launches the CPU pays, per op: TE's module call (forward and
    backward entry) and, for the routed experts, the split view and two allocations of
    each GroupedLinear GEMM and the four allocations of each quantization."""
    from hardware.compute import HOST_CALL_S, HOST_MODULE_S
    from strategies.lowering import GROUPED_GEMM_HOST_CALLS, QUANT_HOST_CALLS
    lowerer = StepLowerer(_model(), _plan(ep=4))  # 2 local experts
    fwd = {op.name.split(".F")[0]: op for op in lowerer.phase_ops(0, 0, "F")
           if isinstance(op, ComputeOp)}
    bwd = {op.name.split(".B")[0]: op for op in lowerer.phase_ops(0, 0, "B")
           if isinstance(op, ComputeOp)}
    gate_up = fwd["moe.experts.gate_up"]
    assert (gate_up.host_calls, gate_up.host_modules) == (GROUPED_GEMM_HOST_CALLS * 2, 1) == (6, 1)
    assert bwd["moe.experts.gate_up"].host_calls == GROUPED_GEMM_HOST_CALLS * 4  # dgrad + wgrad
    assert fwd["moe.experts.gate_up.quant"].host_calls == QUANT_HOST_CALLS * 2 == 8
    assert fwd["moe.experts.gate_up.quant"].host_modules == 0
    assert fwd["attn.qkv"].host_modules == fwd["attn.core"].host_modules == 1
    assert bwd["attn.qkv"].host_modules == 1
    # the router's gating GEMM is a torch GEMM, not a TE module; norms call none
    assert fwd["moe.router"].host_modules == 0 and fwd["attn.norm"].host_calls == 0
    cost = _cost()
    expected = (HOST_ISSUE_S["eager"] * gate_up.host_launches + HOST_CALL_S * 6 + HOST_MODULE_S)
    assert cost.host_ns(gate_up) == round(expected * 1e9)
    # partial graphs: the captured attention costs the CPU nothing at all
    partial = {op.name.split(".F")[0]: op for op in StepLowerer(
        _model(), _plan(ep=4, host_issue="partial")).phase_ops(0, 0, "F")
        if isinstance(op, ComputeOp)}
    assert partial["attn.qkv"].host_modules == partial["attn.qkv"].host_calls == 0
    assert partial["moe.experts.gate_up"].host_modules == 1


def test_grace_host_scales_every_host_cost_by_its_measured_factor():
    """TE issue 2053: one torch.nn.Linear forward costs 37.08 us of CPU on GB200 (Grace)
    and 13.48 us on DGX H100 (Xeon 8480C); the GB200 preset's host is Grace."""
    from hardware.compute import HOST_CPU_FACTOR
    assert HOST_CPU_FACTOR["grace"] == pytest.approx(2.75, abs=0.01)
    grace = CostModel(job_layout(load_cluster("gb200-nvl72"), 8), ALGORITHMS,
                      fidelity="event")
    assert load_cluster("gb200-nvl72").gpu.host_cpu == "grace"
    assert load_cluster("dgx-b200").gpu.host_cpu == "x86"
    op = ComputeOp(name="op", kind="elementwise", bytes=1e3, host_launches=2, host_calls=3,
                   host_modules=1)
    x86 = _cost().host_ns(op)
    assert grace.host_ns(op) == pytest.approx(x86 * HOST_CPU_FACTOR["grace"], abs=1)


def test_bad_host_cpu_is_a_one_line_error():
    with pytest.raises(ValueError, match="host_cpu"):
        load_cluster("dgx-h100", {"gpu.host_cpu": "z80"})


def test_published_rows_host_issue_rule():
    """Which published row's stack issues kernels how (validate.published_stacks.
    host_issue_of): Megatron-Core/NeMo eager unless its NeMo recipe captures CUDA graphs,
    llm-foundry, Megatron-LM 2021 and eager torchtitan eager, torch.compile'd torchtitan
    off (no compiled host mode yet), JAX graphed; MoE rows keep _moe_settings' choice."""
    from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for
    runs = {r.row_id: r for r in load_runs()}
    models, recipes = load_models(), load_nemo_recipes()
    expected = {
        "mosaic_070": "eager",          # llm-foundry (PyTorch FSDP, eager)
        "megatron2021_01": "eager",     # Megatron-LM 2021
        "nemo2407a_08": "eager",        # NeMo 24.07, H100 recipe: cuda_graphs 0
        "dgxc_n15_01": "eager",         # NeMo launcher
        "mb2509_01": "graphed",         # Megatron-Bridge llama3-8b GB200: cuda_graphs 1
        "mb2509_13": "graphed",         # Megatron-Bridge llama3-8b B200: cuda_graphs 1
        "mb2509_03": "eager",           # llama3-70b GB200: cuda_graphs 0
        "mb2509_22": "eager",           # llama3-8b H100: cuda_graphs 0
        "tt_t1_1": "eager",             # torchtitan without torch.compile
        "tt_t1_2": "off",               # torchtitan with torch.compile
        "dgxc_maxtext_01": "graphed",   # MaxText (XLA)
        "dgxc_pax_01": "graphed",       # Paxml (XLA)
    }
    got = {row: scenario_for(runs[row], models, recipes).plan.host_issue for row in expected}
    assert got == expected
    moe = scenario_for(runs["mb2509_09"], models, recipes)  # qwen3-30b-a3b, Bridge, GB200
    assert moe.plan.host_issue == "partial"  # _moe_settings' rule, unchanged
    assert [n for n in moe.settings if n.startswith("host issue")] == [
        "host issue partial (the CPU launches the routed experts; dropless dispatch syncs "
        "per layer)"]
