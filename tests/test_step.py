"""One training step: closed forms (bubble, memory, FLOPs), lowering validity, CLI."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from conftest import run_cli, tiny_models

from hardware.catalog import load_cluster
from sim.step import simulate_step
from strategies import model_costs
from strategies.lowering import lower_step
from strategies.memory import OutOfMemoryError
from strategies.models import load_model
from strategies.plan import ParallelPlan
from strategies.program_check import check_program

TINY, TINY_MOE = tiny_models()
# Communication that costs nothing: no latency, (practically) infinite bandwidth.
FREE_COMM = {"scale_up.nvlink_gb_per_s_per_link": 1e21,
             **{f"comm.base_latency_us.{f}.{p}": 0.0 for f in ("ring", "tree", "nvls", "direct")
                for p in ("LL", "LL128", "Simple")},
             **{f"comm.hop_latency_us.{t}.{p}": 0.0 for t in ("nvlink", "pcie", "network")
                for p in ("LL", "LL128", "Simple")}}


class LayerOnlyTimer:
    """Layers cost what their FLOPs say (1 ns per MFLOP); embedding, head and
    optimizer cost nothing, so pipeline stages are exactly equal."""

    def duration_ns(self, op):
        if op.name.startswith(("embed", "head", "optimizer")):
            return 0
        return int(op.flops // 1_000_000) + 1


@pytest.mark.parametrize("schedule,p,m", [("1f1b", 4, 8), ("1f1b", 4, 4), ("gpipe", 4, 6),
                                          ("1f1b", 2, 7)])
def test_simulated_bubble_is_the_closed_form(schedule, p, m):
    """Equal stages, free communication: bubble = (p-1)/(m+p-1) on every rank."""
    plan = ParallelPlan(pp=p, global_batch=m, micro_batch=1, seq_len=512, schedule=schedule,
                        zero=0)
    result = simulate_step(TINY, load_cluster("dgx-h100", FREE_COMM), plan,
                           compute=LayerOnlyTimer())
    for breakdown in result.stage_breakdown.values():
        total = sum(breakdown.values())
        assert total == pytest.approx(result.step_time_s, rel=1e-12)
        assert Fraction(round(breakdown["bubble"] * 1e9), round(result.step_time_s * 1e9)) \
            == Fraction(p - 1, m + p - 1)


def test_interleaving_shrinks_the_bubble_as_v():
    base = dict(pp=4, global_batch=8, micro_batch=1, seq_len=512, zero=0)
    cluster = load_cluster("dgx-h100", FREE_COMM)
    plain = simulate_step(TINY, cluster, ParallelPlan(**base), compute=LayerOnlyTimer())
    inter = simulate_step(TINY, cluster, ParallelPlan(**base, vpp=2, schedule="interleaved"),
                          compute=LayerOnlyTimer())
    bubble = inter.stage_breakdown[0]["bubble"] / inter.step_time_s
    assert bubble == pytest.approx(3 / (2 * 8 + 3), abs=2e-3)  # (p-1)/(v*m+p-1)
    assert inter.step_time_s < plain.step_time_s


def test_memory_is_16_bytes_per_parameter_without_zero():
    plan = ParallelPlan(dp=2, global_batch=2, seq_len=512, zero=0)
    result = simulate_step(TINY, load_cluster("dgx-h100"), plan)
    params = model_costs.rank_params(TINY, layers=range(8), has_embedding=True, has_head=True)
    states = result.memory[0]
    assert states.weights_bytes + states.gradients_bytes + states.optimizer_bytes \
        == 16 * (params.dense_params + params.expert_params)


def test_zero_shards_model_states_over_dp():
    cluster = load_cluster("dgx-h100")
    params = model_costs.rank_params(TINY, layers=range(8), has_embedding=True, has_head=True)
    n = params.dense_params
    for zero, expected in ((1, 2 * n + 2 * n + 12 * n / 8), (2, 2 * n + (2 + 12) * n / 8),
                           (3, 16 * n / 8)):
        plan = ParallelPlan(dp=8, global_batch=8, seq_len=512, zero=zero)
        m = simulate_step(TINY, cluster, plan).memory[0]
        assert m.weights_bytes + m.gradients_bytes + m.optimizer_bytes == pytest.approx(expected)


def test_model_flops_are_6nt_plus_attention():
    plan = ParallelPlan(dp=8, global_batch=16, seq_len=1024)
    result = simulate_step(TINY, load_cluster("dgx-h100"), plan)
    counts = model_costs.param_counts(TINY)
    n = counts.active_per_token - counts.embedding + (counts.embedding if TINY.tied_embeddings else 0)
    per_token = 6 * model_costs.model_flops_per_token(TINY, 1024) / 6
    expected = (6 * n + 12 * TINY.num_layers * TINY.num_heads * TINY.head_dim * 1024)
    assert per_token == pytest.approx(expected, rel=1e-12)
    achieved = result.tflops_per_gpu * 1e12 * result.step_time_s * 8
    assert achieved == pytest.approx(expected * 16 * 1024, rel=1e-9)
    assert result.mfu == pytest.approx(result.tflops_per_gpu * 1e12 / 989e12)


@pytest.mark.parametrize("plan", [
    ParallelPlan(dp=2, tp=2, pp=2, global_batch=8, seq_len=512),
    ParallelPlan(tp=2, pp=2, vpp=2, global_batch=4, seq_len=512, schedule="interleaved"),
    ParallelPlan(pp=4, global_batch=8, seq_len=512, schedule="zb-h1"),
    ParallelPlan(pp=2, global_batch=4, seq_len=512, schedule="gpipe", recompute="full"),
    ParallelPlan(dp=2, cp=2, tp=2, global_batch=4, seq_len=512, recompute="selective"),
    ParallelPlan(dp=4, global_batch=8, seq_len=512, zero=3),
    ParallelPlan(dp=2, tp=2, global_batch=4, seq_len=512, sequence_parallel=False,
                 overlap_grad_reduce=False),
], ids=["tp-pp-dp", "interleaved", "zb-h1", "gpipe-full", "cp", "zero3", "no-sp"])
def test_lowered_programs_are_valid(plan):
    lowering = lower_step(TINY, plan)
    check_program(lowering.program)
    result = simulate_step(TINY, load_cluster("dgx-h100"), plan)
    assert result.step_time_s > 0 and 0 < result.mfu < 1


def test_moe_with_expert_parallelism_runs_alltoalls():
    plan = ParallelPlan(dp=4, ep=4, global_batch=8, seq_len=512)
    lowering = lower_step(TINY_MOE, plan)
    check_program(lowering.program)
    kinds = {op.kind for ops in lowering.program.ops_by_rank.values() for op in ops
             if op.name.startswith("ep.")}
    assert kinds == {"alltoall"}
    result = simulate_step(TINY_MOE, load_cluster("dgx-h100"), plan)
    assert result.breakdown["exposed_ep"] > 0


def test_out_of_memory_is_an_error_with_the_breakdown():
    model = load_model("llama3-70b")
    plan = ParallelPlan(tp=8, global_batch=8, seq_len=8192)
    with pytest.raises(OutOfMemoryError) as info:
        simulate_step(model, load_cluster("dgx-h100"), plan)
    assert info.value.breakdown.total_bytes > info.value.capacity_bytes
    assert "out of memory" in str(info.value)




def test_cli_simulate_json_has_the_documented_keys(capsys, tmp_path):
    trace = tmp_path / "step.json"
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                             "--gpus", "16", "--tp", "4", "--pp", "2", "--seq-len", "2048",
                             "--global-batch", "16", "--format", "json", "--trace", str(trace))
    assert code == 0, err
    data = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_bytes",
                "memory", "breakdown", "inputs"):
        assert key in data
    assert set(data["breakdown"]) >= {"compute", "exposed_tp", "exposed_dp", "exposed_pp",
                                      "exposed_cp", "exposed_ep", "bubble", "optimizer"}
    assert data["inputs"]["plan"]["dp"] == 2
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"node 0", "node 1"}  # pp rank 0 on node 0, pp rank 1 on node 1


def test_cli_simulate_out_of_memory_exits_nonzero(capsys):
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-70b", "--gpus", "8",
                             "--tp", "8", "--seq-len", "8192", "--format", "json")
    assert code == 3
    assert json.loads(out)["error"] == "out_of_memory"
    assert err.startswith("error: out of memory")


@pytest.mark.parametrize("args,field", [
    (["--gpus", "24", "--tp", "3"], "tp"),
    (["--gpus", "8", "--tp", "3"], "gpus"),
    (["--gpus", "8", "--tp", "2", "--pp", "4", "--dp", "3"], "gpus"),
    (["--gpus", "40", "--pp", "40"], "pp"),  # 32 layers cannot fill 40 stages
    (["--gpus", "8", "--global-batch", "7"], "global_batch"),
    (["--gpus", "8", "--ep", "2"], "ep"),
    (["--gpus", "8", "--schedule", "looped"], "schedule"),
    (["--gpus", "8", "--recompute", "some"], "recompute"),
    (["--gpus", "8", "--zero", "4"], "zero"),
    (["--gpus", "8", "--model", "llama9"], "model"),
    (["--gpus", "100000"], "gpus"),
])
def test_cli_simulate_rejects_bad_plans_in_one_line(capsys, args, field):
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-8b", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}")


def test_cli_accepts_a_hugging_face_config(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 1024, "num_hidden_layers": 4,
                                  "num_attention_heads": 16, "num_key_value_heads": 4,
                                  "intermediate_size": 4096, "vocab_size": 32000}))
    code, out, err = run_cli(capsys, "simulate", "--model", str(config), "--gpus", "8",
                             "--tp", "2", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["inputs"]["model"]


def test_one_rank_at_half_speed_lengthens_a_dp_step_by_the_closed_form():
    """64-GPU data parallelism, gradients reduced after the backward and parameters
    gathered after the optimizer: every rank waits for the slowest, so T' = T + (compute +
    optimizer) * (1/(speed f) - 1), where f is the expected slowest GPU's factor the step's
    kernels already run at (gpu.speed_spread), up to the rounding of each of the
    straggler's kernels to whole ns."""
    model = load_model("llama2-7b")
    plan = ParallelPlan(dp=64, global_batch=128, seq_len=4096, zero=1,
                        overlap_grad_reduce=False, overlap_param_gather=False)
    cluster = load_cluster("dgx-h100")
    base = simulate_step(model, cluster, plan)
    slow = simulate_step(model, cluster, plan, stragglers={5: 0.5})
    work_s = base.breakdown["compute"] + base.breakdown["optimizer"]
    kernels = sum(1 for op in slow.lowering.program.ops_by_rank[5] if op.stream == "compute")
    fleet = base.inputs["slowest_gpu_factor"]
    assert fleet > 1.0
    assert slow.step_time_s - base.step_time_s == pytest.approx(
        work_s * (1 / (0.5 * fleet) - 1), abs=2 * kernels * 1e-9)
    assert slow.inputs["critical_rank"] == 5
    assert sorted(slow.lowering.program.represents.items()) == [(0, 63), (5, 1)]


def test_a_straggler_in_a_tp_pp_job_holds_up_everyone():
    """tp 4 x pp 2 x dp 4: the straggler's pipeline and TP groups are simulated
    individually; the representatives wait for them through data parallelism."""
    model = load_model("llama2-7b")
    plan = ParallelPlan(dp=4, tp=4, pp=2, global_batch=32, seq_len=4096)
    cluster = load_cluster("dgx-h100")
    base = simulate_step(model, cluster, plan)
    slow = simulate_step(model, cluster, plan, stragglers={13: 0.5})
    present = sorted(slow.lowering.program.ops_by_rank)
    assert {12, 13, 14, 15, 28, 29, 30, 31} <= set(present)
    check_program(slow.lowering.program)
    ends = slow.timeline.end_ns_by_rank()
    assert ends[0] > base.step_time_s * 1e9  # the representative waits for the straggler
    assert slow.step_time_s > 1.4 * base.step_time_s


def test_stragglers_are_validated():
    plan = ParallelPlan(dp=8, global_batch=8, seq_len=512)
    with pytest.raises(ValueError, match="straggler: rank 99 is outside the job"):
        simulate_step(TINY, load_cluster("dgx-h100"), plan, stragglers={99: 0.5})
    with pytest.raises(ValueError, match="straggler: rank 1 speed 0"):
        simulate_step(TINY, load_cluster("dgx-h100"), plan, stragglers={1: 0})


def test_cli_uneven_layer_split(capsys):
    split = ",".join(["7"] + ["8"] * 14 + ["7"])
    # analytic: the split is what is checked, not the timing (the replay of this 405B job
    # took 3 s; uneven splits time alike in both fidelities: test_fidelity's
    # test_short_one_f_one_b_pipelines_equal_the_replay)
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-405b", "--gpus", "1024",
                             "--tp", "8", "--pp", "16", "--seq-len", "8192",
                             "--global-batch", "128", "--recompute", "full",
                             "--layers-per-stage", split, "--format", "json",
                             "--fidelity", "analytic")
    assert code == 0, err
    assert json.loads(out)["inputs"]["plan"]["layers_per_stage"][0] == 7
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-405b", "--gpus", "1024",
                           "--tp", "8", "--pp", "16", "--layers-per-stage", "7,x")
    assert code == 2 and err.startswith("error: layers_per_stage: '7,x' is not valid")


def _tp_collectives(plan: ParallelPlan) -> dict[str, list[float]]:
    """Rank 0's TP collectives of one step: kind -> sizes in bytes."""
    lowering = lower_step(TINY, plan)
    check_program(lowering.program)
    found: dict[str, list[float]] = {}
    for op in lowering.program.ops_by_rank[0]:
        if getattr(op, "kind", None) and op.name.startswith("tp."):
            found.setdefault(op.kind, []).append(op.size_bytes)
    return found


def test_dtensor_tp_does_not_gather_the_column_input_again_in_the_backward():
    """PyTorch DTensor TP saves the gathered input of a column-parallel GEMM for its
    weight gradient; Megatron-LM re-gathers it. Per layer and micro-batch: forward 2
    all-gathers + 2 reduce-scatters either way; backward 2 output-gradient all-gathers
    + 2 input-gradient reduce-scatters, plus 2 input re-gathers for Megatron only."""
    base = dict(tp=2, global_batch=1, seq_len=512)
    megatron = _tp_collectives(ParallelPlan(tp_comm_overlap="none", **base))
    dtensor = _tp_collectives(ParallelPlan(tp_comm_overlap="dtensor", **base))
    layers = TINY.num_layers
    assert len(megatron["reduce_scatter"]) == len(dtensor["reduce_scatter"]) == 4 * layers
    assert len(dtensor["all_gather"]) == 4 * layers
    assert len(megatron["all_gather"]) == 6 * layers


def test_torchao_float8_tp_gathers_the_forward_input_in_one_byte():
    """torchao's Float8ColwiseParallel casts the input to float8 before the all-gather:
    forward all-gathers move half the bf16 bytes; gradients stay bf16."""
    base = dict(tp=2, global_batch=1, seq_len=512, tp_comm_overlap="dtensor")
    bf16 = _tp_collectives(ParallelPlan(dtype="bf16", **base))["all_gather"]
    fp8 = _tp_collectives(ParallelPlan(dtype="fp8", fp8_recipe="torchao", **base))["all_gather"]
    act_bytes = 512 * TINY.hidden_size * 2
    assert sorted(bf16) == [act_bytes] * len(bf16)
    assert sorted(fp8) == sorted([act_bytes / 2] * (len(fp8) // 2) + [act_bytes] * (len(fp8) // 2))


def test_te_userbuffers_gather_fp8_inputs_and_gradients_and_reduce_in_bf16():
    """Transformer Engine's userbuffers hold every all-gathered GEMM input in FP8 under a
    per-tensor FP8 recipe (initialize_ub: "AllGather buffers use fp8 when using fp8
    recipe"): per layer and micro-batch, the 2 forward input ring exchanges, the 2 output
    gradient ones and the 2 bulk input re-gathers move 1 byte per element (each ring
    exchange in tp - 1 sends of 1/tp); the 2 forward and 2 input-gradient reduce-scatters
    stay bf16. MXFP8 gathers its FP8 data and its E8M0 scales (1 + 1/32 bytes per
    element, fill_userbuffers_buffer_for_all_gather); blockwise-FP8 and bf16 plans gather
    in bf16."""
    base = dict(tp=2, global_batch=1, seq_len=512, tp_comm_overlap="userbuffers")
    act_bytes = 512 * TINY.hidden_size * 2
    layers = TINY.num_layers

    def sizes(**fields):
        found = _tp_collectives(ParallelPlan(**base, **fields))
        return sorted(found["sendrecv"]), sorted(found["all_gather"]), found["reduce_scatter"]

    for recipe, element_bytes in (("te-delayed", 1.0), ("te-mxfp8", 1.0 + 1.0 / 32)):
        ring, gathers, reduces = sizes(dtype="fp8", fp8_recipe=recipe)
        gathered = act_bytes * element_bytes / 2
        assert ring == [gathered / 2] * (4 * layers)
        assert gathers == [gathered] * (2 * layers)
        assert sum(reduces) == 4 * layers * act_bytes
    for fields in (dict(dtype="bf16"), dict(dtype="fp8", fp8_recipe="te-blockwise")):
        ring, gathers, reduces = sizes(**fields)
        assert ring == [act_bytes / 2] * (4 * layers)
        assert gathers == [act_bytes] * (2 * layers)
        assert sum(reduces) == 4 * layers * act_bytes


def test_te_userbuffers_fp8_buf_reduce_scatters_move_one_byte_per_element():
    """A userbuffers config's fp8_buf on a pipelined forward reduce-scatter
    (ParallelPlan.tp_comm_fp8_reduce_scatter; TE initialize_ub ``buffer_dtype =
    torch.uint8``): the GEMM writes FP8 and each of the UB_PIPELINE_SPLITS chunks moves
    1 byte per element; proj_fprop is the attention out-projection's, fc2_fprop the MLP
    down projection's. Without the field every forward chunk is bf16 (act_bytes / 4);
    the 2 input-gradient reduce-scatters per layer stay bf16 either way."""
    base = dict(tp=2, global_batch=1, seq_len=512, tp_comm_overlap="userbuffers",
                dtype="fp8", fp8_recipe="te-delayed")
    act_bytes = 512 * TINY.hidden_size * 2
    layers = TINY.num_layers

    def forward_reduces(buffers):
        lowering = lower_step(TINY, ParallelPlan(**base, tp_comm_fp8_reduce_scatter=buffers))
        found = {"attention": [], "mlp": [], "backward": []}
        for op in lowering.program.ops_by_rank[0]:
            if getattr(op, "kind", None) == "reduce_scatter" and op.name.startswith("tp."):
                block = op.name.split(".")[3] if ".split" in op.name else "backward"
                found[block].append(op.size_bytes)
        return found

    bf16 = forward_reduces(())
    assert bf16["attention"] == bf16["mlp"] == [act_bytes / 4] * (4 * layers)
    proj = forward_reduces(("proj_fprop",))
    assert proj["attention"] == [act_bytes / 2 / 4] * (4 * layers)
    assert proj["mlp"] == [act_bytes / 4] * (4 * layers)
    both = forward_reduces(("proj_fprop", "fc2_fprop"))
    assert both["attention"] == both["mlp"] == [act_bytes / 2 / 4] * (4 * layers)
    for found in (bf16, proj, both):
        assert found["backward"] == [act_bytes] * (2 * layers)


def test_fp8_reduce_scatter_buffers_need_fp8_userbuffers_with_a_per_tensor_recipe():
    """tp_comm_fp8_reduce_scatter names TE's pipelined reduce-scatters and needs dtype
    fp8, userbuffers TP overlap and a per-tensor FP8 recipe: one-line errors otherwise."""
    base = dict(tp=2, global_batch=1, seq_len=512, tp_comm_overlap="userbuffers",
                dtype="fp8", fp8_recipe="te-current")
    assert ParallelPlan(**base, tp_comm_fp8_reduce_scatter=["fc2_fprop"]
                        ).tp_comm_fp8_reduce_scatter == ("fc2_fprop",)
    with pytest.raises(ValueError, match=r"^tp_comm_fp8_reduce_scatter: qkv_fprop is not "
                                         r"valid; valid: proj_fprop, fc2_fprop$"):
        ParallelPlan(**base, tp_comm_fp8_reduce_scatter=("qkv_fprop",))
    for wrong in (dict(dtype="bf16"), dict(tp_comm_overlap="async"),
                  dict(fp8_recipe="te-mxfp8")):
        with pytest.raises(ValueError, match=r"^tp_comm_fp8_reduce_scatter: proj_fprop needs "
                                             r"dtype fp8, tp_comm_overlap userbuffers"):
            ParallelPlan(**{**base, **wrong}, tp_comm_fp8_reduce_scatter=("proj_fprop",))


def test_symmetric_memory_tp_hides_collectives_behind_gemms():
    """PyTorch AsyncTP micro-pipelines each TP collective with its GEMM (copy-engine
    transfers over symmetric memory): less exposed TP time than blocking DTensor TP,
    the same FLOPs."""
    model = load_model("llama3-70b")
    cluster = load_cluster("dgx-h100")
    base = dict(tp=8, dp=1, global_batch=1, seq_len=8192, recompute="full")
    blocking = simulate_step(model, cluster, ParallelPlan(tp_comm_overlap="dtensor", **base),
                             check_memory=False)
    pipelined = simulate_step(model, cluster,
                              ParallelPlan(tp_comm_overlap="symmetric_memory", **base),
                              check_memory=False)
    assert pipelined.breakdown["exposed_tp"] < 0.5 * blocking.breakdown["exposed_tp"]
    assert pipelined.step_time_s < blocking.step_time_s


@pytest.mark.parametrize("fidelity", ["analytic", "event"])
def test_a_dtype_the_gpu_lacks_is_a_one_line_error_naming_the_field(fidelity):
    """FP8 on A100 (no FP8 tensor cores): the plan's ``dtype`` is named, not the first
    op the pricing met (it said ``ComputeOp 'attn.qkv.F0.l0' dtype: ...``, found by
    benchmarks/plan_fuzz.py)."""
    from trainsim import api

    with pytest.raises(ValueError, match=r"^dtype: 'fp8' is not supported by the GPU of "
                                         r"preset 'dgx-a100' \(A100-SXM4-80GB\); valid: "
                                         r"bf16, fp16, fp32$"):
        api.simulate("llama3-8b", cluster="dgx-a100", gpus=8, tp=8, global_batch=8,
                     dtype="fp8", fidelity=fidelity)


def test_a_dtype_a_perturbing_node_gpu_lacks_names_the_field():
    """FP8 job with an A100 node among H100 ones (node_gpus): the same one-line error."""
    from strategies.perturbations import Perturbations
    from trainsim import api

    with pytest.raises(ValueError, match=r"^dtype: 'fp8' is not supported by the GPU of "
                                         r"preset 'dgx-a100' \(node_gpu of node 1\)"):
        api.simulate("llama3-8b", gpus=16, tp=8, global_batch=16, dtype="fp8",
                     fidelity="event", perturbations=Perturbations(node_gpus={1: "dgx-a100"}))


def test_mxfp8_on_a_gpu_before_blackwell_is_a_one_line_error():
    """MXFP8 block scaling needs compute capability 10.0 (Transformer Engine
    check_mxfp8_support); on H100 (sm_90) the plan was priced as if it ran
    (benchmarks/plan_fuzz.py). B200 (sm_100) runs it."""
    from trainsim import api

    plan = dict(gpus=8, tp=8, global_batch=8, seq_len=1024, dtype="fp8",
                fp8_recipe="te-mxfp8", fidelity="analytic")
    with pytest.raises(ValueError, match=r"^fp8_recipe: 'te-mxfp8' needs compute capability "
                                         r"10.0 or newer \(Blackwell\); the GPU of preset "
                                         r"'dgx-h100' \(H100-SXM5-80GB\) is sm_90"):
        api.simulate("llama3-8b", cluster="dgx-h100", **plan)
    assert api.simulate("llama3-8b", cluster="dgx-b200", **plan).step_time_s > 0
