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

import functools
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
    # delayed scaling (the default recipe): TE's fused multi-cast-transpose, one kernel
    assert by_name["moe.experts.gate_up.quant"].host_launches == 1
    mx = StepLowerer(model, _plan(ep=4, fp8_recipe="te-mxfp8")).phase_ops(0, 0, "F")
    mx_quant = [op for op in mx if op.name.startswith("moe.experts.gate_up.quant")][0]
    assert mx_quant.host_launches == mx_quant.launches == 2  # one quantize kernel per expert
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
    # without the host the closed form is the replay, exactly
    off_event = simulate_step(model, cluster, replace(plan, host_issue="off"), fidelity="event",
                              check_memory=False)
    assert off.step_time_s == off_event.step_time_s
    # one micro-batch: the closed form carries the CPU's lead across the layers' phases as
    # the replay's CPU process does (sim/host_lead.py; 2.2 % apart when every phase began
    # with the CPU level, 0.02 % since: the last backward's lead into the optimizer)
    assert analytic.step_time_s == pytest.approx(event.step_time_s, rel=0.001)


def test_cpu_only_calls_and_te_module_calls_closed_form():
    """Beyond kernel launches the CPU pays, per op: TE's module call (forward and
    backward entry) and, for the routed experts, the split view and two allocations of
    each GroupedLinear GEMM and the four allocations of each quantization kernel."""
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
    # delayed scaling (the default recipe) quantizes all experts in one fused kernel
    assert fwd["moe.experts.gate_up.quant"].host_calls == QUANT_HOST_CALLS * 1 == 4
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
    compiled, JAX graphed; MoE rows keep _moe_settings' choice."""
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
        "tt_t1_2": "compiled",          # torchtitan with torch.compile
        "dgxc_maxtext_01": "graphed",   # MaxText (XLA)
        "dgxc_pax_01": "graphed",       # Paxml (XLA)
    }
    got = {row: scenario_for(runs[row], models, recipes).plan.host_issue for row in expected}
    assert got == expected
    moe = scenario_for(runs["mb2511_08"], models, recipes)  # qwen3-30b-a3b dropless, GB200
    assert moe.plan.host_issue == "partial"  # _moe_settings' rule, unchanged
    assert [n for n in moe.settings if n.startswith("host issue")] == [
        "host issue partial (the CPU launches the routed experts; dropless dispatch syncs "
        "per layer)"]
    # the 25.09 token-drop presets of qwen3-30b-a3b on Blackwell capture the whole
    # iteration (validate.published._FULL_ITERATION_GRAPHS); on H100 they issue eagerly,
    # and the dropless rows of the same model keep the eager / partial rule
    modes = {row: scenario_for(runs[row], models, recipes).plan.host_issue
             for row in ("mb2509_09", "mb2509_19", "mb2509_26", "mb2511_16", "mb2511_22")}
    assert modes == {"mb2509_09": "graphed", "mb2509_19": "graphed", "mb2509_26": "eager",
                     "mb2511_16": "eager", "mb2511_22": "eager"}
    graphed = scenario_for(runs["mb2509_19"], models, recipes)
    assert [n for n in graphed.settings if n.startswith("host issue")] == [
        "host issue graphed (Megatron-Bridge token-drop preset: cuda_graph_scope "
        "full_iteration)"]


@functools.cache  # the analytic pair backs two tests; nothing mutates the result
def _pair_steps(fidelity: str) -> tuple[dict[str, float], float]:
    """Step times of mb2509_19 (token drop, graphed) and mb2511_16 (dropless, eager) at
    ``fidelity``, and their published ratio."""
    from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for
    runs = {r.row_id: r for r in load_runs()}
    models, recipes = load_models(), load_nemo_recipes()
    steps = {}
    for row in ("mb2509_19", "mb2511_16"):
        scenario = scenario_for(runs[row], models, recipes)
        steps[row] = simulate_step(scenario.model, scenario.cluster, scenario.plan,
                                   fidelity=fidelity, check_memory=False).step_time_s
    published = (runs["mb2511_16"].published_step_time_s
                 / runs["mb2509_19"].published_step_time_s)
    return steps, published


def test_token_drop_vs_dropless_pair_on_b200():
    """The same qwen3-30b-a3b configuration on 8 B200 (FP8, EP 8, micro-batch 1, GBS 512):
    the 25.09 token-drop run (mb2509_19, 14.51 s, a full-iteration CUDA graph) and the
    25.11 dropless run (mb2511_16, 28.19 s, eager: the tokens-per-expert sync forbids the
    graph) are 1.94x apart. The host issue of the eager dropless step is what separates
    them in the simulation too (identical expert GEMMs under forced balance): 1.47x, the
    closed form and the replay alike. (Until the closed form carried the CPU's lead it
    priced the dropless step 22 % above its own replay, 1.80x; the replay's 1.47x is
    what the host model gives: the published gap is
    :func:`test_token_drop_vs_dropless_pair_on_b200_published_ratio`'s.)"""
    steps, published = _pair_steps("analytic")
    assert published == pytest.approx(28.191 / 14.51)
    ratio = steps["mb2511_16"] / steps["mb2509_19"]
    assert 1.4 < ratio < published


@pytest.mark.slow  # two replays of a 512-micro-batch step: ~4 s
def test_token_drop_vs_dropless_pair_on_b200_replay_agrees():
    """The replay gives the pair the closed form's ratio (to 0.1 %). (The inner loop's
    check that the closed form equals the replay for an MoE rank with host issue is
    :func:`test_analytic_equals_event_for_one_moe_rank_with_host_issue`.)"""
    steps, _ = _pair_steps("analytic")
    event, _ = _pair_steps("event")
    assert steps["mb2511_16"] / steps["mb2509_19"] == pytest.approx(
        event["mb2511_16"] / event["mb2509_19"], rel=1e-3)


@pytest.mark.xfail(strict=True, reason="the replay's host model gives the dropless step "
                   "1.47x the token-drop one against the published 1.94x: the eager "
                   "dropless step's CPU cost is under-priced (open, physics)")
def test_token_drop_vs_dropless_pair_on_b200_published_ratio():
    """The published ratio within 10 % (the target the host model has to reach)."""
    steps, published = _pair_steps("analytic")
    assert steps["mb2511_16"] / steps["mb2509_19"] == pytest.approx(published, rel=0.10)


# ------------------------------------------------------- compiled issue and layer impl


def _dense_ops(**kw):
    """Forward compute ops of a 2-layer Llama 3 8B stage's first layer and head by name
    (micro-batch tag dropped), and rank 0's collectives over the whole step."""
    model = replace(load_model("llama3-8b"), num_layers=2)
    plan = ParallelPlan(**{**dict(tp=2, dp=4, micro_batch=1, global_batch=8, seq_len=1024,
                                  sequence_parallel=True), **kw})
    lowerer = StepLowerer(model, plan)
    ops = lowerer.phase_ops(0, 0, "F") + lowerer.phase_ops(0, "head", "F")
    colls = [op for op in lowerer.lower().program.ops_by_rank[0] if isinstance(op, CollectiveOp)]
    return {op.name.split(".F")[0]: op for op in ops if isinstance(op, ComputeOp)}, colls


def test_compiled_issue_prices_the_layers_kernels_at_the_compiled_rate():
    """torch.compile per TransformerBlock (torchtitan apply_compile): the blocks' kernels
    are launched by Inductor's wrapper at HOST_ISSUE_S["compiled"] each, as many launches
    as eager issue of the same (fused) kernels; the output layer outside the compiled
    blocks stays eager; TP collectives traced into the block are compiled, the others
    eager."""
    eager, eager_colls = _dense_ops(host_issue="eager", layer_impl="torch")
    compiled, colls = _dense_ops(host_issue="compiled", layer_impl="torch")
    cost = _cost()
    qkv = compiled["attn.qkv"]
    assert qkv.host_issue == "compiled" and eager["attn.qkv"].host_issue == "eager"
    assert qkv.host_launches == eager["attn.qkv"].host_launches == qkv.launches
    assert qkv.host_modules == qkv.host_calls == 0
    assert cost.host_ns(qkv) == round(HOST_ISSUE_S["compiled"] * qkv.host_launches * 1e9)
    assert cost.host_ns(eager["attn.qkv"]) == round(
        HOST_ISSUE_S["eager"] * qkv.host_launches * 1e9)
    assert HOST_ISSUE_S["compiled"] == 4e-6
    for name in ("attn.core", "mlp.down", "attn.norm"):
        assert compiled[name].host_issue == "compiled", name
    head = [op for name, op in compiled.items() if name.startswith("head.")]
    assert head and all(op.host_issue == "eager" and op.host_launches for op in head)
    by_axis = {(c.axis, c.host_issue) for c in colls}
    assert {("tp", "compiled"), ("dp", "eager")} <= by_axis and all(
        issue == ("compiled" if axis == "tp" else "eager") for axis, issue in by_axis)
    assert all(c.host_launches == 1 for c in colls)
    assert {c.host_issue for c in eager_colls} == {"eager"}


def test_te_module_cost_only_for_transformer_engine_layers():
    """layer_impl te (Megatron-Core's default) pays HOST_MODULE_S per TE module call;
    torch layers (torch.nn.Linear, Megatron local) pay only their launches and the
    framework's CPU-only calls."""
    from hardware.compute import HOST_CALL_S
    te = {op.name.split(".F")[0]: op for op in StepLowerer(_model(), _plan(ep=4)).phase_ops(
        0, 0, "F") if isinstance(op, ComputeOp)}
    torch_ = {op.name.split(".F")[0]: op for op in StepLowerer(
        _model(), _plan(ep=4, layer_impl="torch")).phase_ops(0, 0, "F")
        if isinstance(op, ComputeOp)}
    assert te["attn.qkv"].host_modules == te["moe.experts.gate_up"].host_modules == 1
    assert all(op.host_modules == 0 for op in torch_.values())
    gate_up = torch_["moe.experts.gate_up"]
    assert (gate_up.host_launches, gate_up.host_calls) == (te["moe.experts.gate_up"].host_launches,
                                                           te["moe.experts.gate_up"].host_calls)
    assert _cost().host_ns(gate_up) == round(
        (HOST_ISSUE_S["eager"] * gate_up.host_launches + HOST_CALL_S * gate_up.host_calls) * 1e9)


def test_compiled_list_schedule_closed_form_in_both_fidelities():
    """A compiled launch costs the CPU 4 us: a stream of tiny compiled kernels is
    host-bound at that pace, in the closed form and the event engine alike."""
    cost = _cost()
    first = ComputeOp(name="first", kind="elementwise", bytes=1e3)
    tiny = ComputeOp(name="tiny", kind="elementwise", bytes=1e3, host_launches=3,
                     host_issue="compiled")
    eager = replace(tiny, name="eager", host_issue="eager")
    ops = [first, tiny, tiny, eager, tiny]
    host = [cost.host_ns(op) for op in ops]
    assert host[1] == round(3 * 4e-6 * 1e9) and host[3] == round(3 * 10e-6 * 1e9)
    dur = [cost.compute_ns(op) for op in ops]
    end, issued = 0, 0
    for i in range(len(ops)):
        issued += host[i]
        end = max(end, issued) + dur[i]
    assert OpPricer(cost).schedule(ops).total_ns == end > sum(dur)
    program = Program(world_size=1, ops_by_rank={0: list(ops)})
    assert Engine(program, cost).run().makespan_ns == end


def test_compiled_torch_step_analytic_near_event():
    """A whole step: the closed form carries the CPU's lead across the phases as the
    replay does (sim/host_lead.py; 2 % apart when each phase began with the CPU level,
    0.04 % since); compiled issue lies between off and eager."""
    model = replace(load_model("llama3-8b"), num_layers=2)
    cluster = load_cluster("dgx-h100")
    plan = ParallelPlan(tp=1, dp=1, micro_batch=1, global_batch=1, seq_len=512,
                        host_issue="compiled", layer_impl="torch")
    event = simulate_step(model, cluster, plan, fidelity="event", check_memory=False)
    analytic = simulate_step(model, cluster, plan, fidelity="analytic", check_memory=False)
    eager = simulate_step(model, cluster, replace(plan, host_issue="eager"),
                          fidelity="analytic", check_memory=False)
    off = simulate_step(model, cluster, replace(plan, host_issue="off"), fidelity="analytic",
                        check_memory=False)
    assert analytic.step_time_s == pytest.approx(event.step_time_s, rel=0.001)
    assert off.step_time_s < analytic.step_time_s < eager.step_time_s


def test_bad_layer_impl_and_op_host_issue_are_one_line_errors():
    with pytest.raises(ValueError, match="layer_impl"):
        _plan(layer_impl="apex")
    op = ComputeOp(name="op", kind="elementwise", bytes=1e3, host_launches=1,
                   host_issue="jit")
    with pytest.raises(ValueError, match="host_issue: 'jit'"):
        _cost().host_ns(op)


def test_published_rows_layer_impl_rule():
    """Which published row's layers are Transformer Engine modules
    (validate.published_stacks.layer_impl_of): Megatron-Core/NeMo and llm-foundry FP8
    te; llm-foundry bf16, torchtitan, Megatron-LM 2021 and Meta's stack torch; AutoModel
    te when it prints TE."""
    from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for
    runs = {r.row_id: r for r in load_runs()}
    models, recipes = load_models(), load_nemo_recipes()
    expected = {"mosaic_001": "torch", "mosaic_071": "te", "megatron2021_01": "torch",
                "nemo2407a_08": "te", "mb2509_01": "te", "dgxc_n15_01": "te",
                "tt_t1_1": "torch", "tt_t1_3": "torch", "llama3_t4_1": "torch",
                "automodel_1": "te"}
    got = {row: scenario_for(runs[row], models, recipes).plan.layer_impl for row in expected}
    assert got == expected


def test_dispatch_preprocess_host_work_counted_from_megatron_core():
    """The dropless all-to-all dispatcher's preprocess (token_dispatcher.py ``preprocess``
    and ``_maybe_dtoh_and_synchronize``) rides on the host-sync op: 7 kernels (the count
    sums, the token-count all-gather, the local-expert slice) plus 4 device-to-host copies
    of the splits, and 13 CPU-only calls; captured under partial graphs (moe_preprocess),
    and only the one copy without EP (no splits to compute)."""
    from strategies.lowering import dispatch_preprocess_host
    assert dispatch_preprocess_host("eager", 8, "alltoall") == (11, 13)
    assert dispatch_preprocess_host("partial", 8, "alltoall") == (1, 0)
    assert dispatch_preprocess_host("eager", 1, "alltoall") == (1, 0)
    assert dispatch_preprocess_host("eager", 8, "deepep") == (1, 0)
    model = _model()
    sync = [op for op in StepLowerer(model, _plan(ep=4)).phase_ops(0, 0, "F")
            if getattr(op, "host_sync", False)][0]
    assert (sync.host_launches, sync.host_calls) == (11, 13)
    layout = job_layout(load_cluster("dgx-h100"), 8)
    cost = CostModel(layout, ALGORITHMS)
    # x86 reference host: 11 eager launches at 10 us and 13 calls at 3 us = 149 us
    assert cost.host_ns(sync) == 149_000
    partial = [op for op in StepLowerer(model, _plan(ep=4, host_issue="partial"))
               .phase_ops(0, 0, "F") if getattr(op, "host_sync", False)][0]
    assert (partial.host_launches, partial.host_calls) == (1, 0)
