"""Tests for strategies.memory: ZeRO closed forms, activations, buffers, OOM errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware.units import GIB
from strategies.memory import (
    WORKSPACE_BYTES,
    MemoryBreakdown,
    OutOfMemoryError,
    Remedy,
    check_fits,
    rank_memory,
    transient_activation_bytes,
)
from strategies.model_costs import activation_bytes_per_layer, param_counts, rank_params
from strategies.model_spec import ModelSpec, MoESpec
from strategies.plan import ParallelPlan

H, V = 64, 1000
# A Korthikanti-style GPT: trained with dropout, so its masks count.
MHA = ModelSpec(name="mha", num_layers=2, hidden_size=H, num_heads=4, num_kv_heads=4, head_dim=16,
                ffn_hidden_size=4 * H, vocab_size=V, mlp="gelu", norm="layernorm", dropout=True)
MOE = ModelSpec(name="moe", num_layers=2, hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16,
                ffn_hidden_size=256, vocab_size=V,
                moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, shared_experts=1),
                dropout=True)
ALL = dict(layers=[0, 1], has_embedding=True, has_head=True)
BUCKET = 1_000_000


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=4, tp=1, pp=1, micro_batch=2, global_batch=64, seq_len=32, zero=0,
                grad_bucket_bytes=BUCKET)
    base.update(kw)
    return ParallelPlan(**base)


def _states(b: MemoryBreakdown) -> float:
    return b.weights_bytes + b.gradients_bytes + b.optimizer_bytes


# ---------------------------------------------------------------------------- model states


def test_unsharded_model_states_are_16_bytes_per_param():
    p = param_counts(MHA).total
    b = rank_memory(MHA, _plan(zero=0), inflight_microbatches=1, **ALL)
    assert (b.weights_bytes, b.gradients_bytes, b.optimizer_bytes) == (2 * p, 2 * p, 12 * p)
    assert _states(b) == 16 * p


@pytest.mark.parametrize("zero, per_param", [
    (0, lambda p, d: 2 * p + 2 * p + 12 * p),
    (1, lambda p, d: 2 * p + 2 * p + 12 * p / d),
    (2, lambda p, d: 2 * p + 2 * p / d + 12 * p / d),
    (3, lambda p, d: 2 * p / d + 2 * p / d + 12 * p / d),
])
@pytest.mark.parametrize("dp, cp", [(4, 1), (2, 2), (8, 1)])
def test_zero_stages_match_the_zero_paper_exactly(zero, per_param, dp, cp):
    p = param_counts(MHA).total
    b = rank_memory(MHA, _plan(zero=zero, dp=dp, cp=cp), inflight_microbatches=1, **ALL)
    assert _states(b) == pytest.approx(per_param(p, dp * cp), rel=1e-15)


def test_zero_paper_figure_1_numbers():
    """ZeRO paper (arXiv 1910.02054) Figure 1: a 7.5B model on N_d = 64 GPUs with K = 12 needs
    120 GB (baseline), 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p) of model states."""
    model = ModelSpec(name="7.5b", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=32,
                      head_dim=128, ffn_hidden_size=11008, vocab_size=32000)
    assert param_counts(model).total == pytest.approx(7.5e9, rel=0.01)
    for zero, published_gb in ((0, 120), (1, 31.4), (2, 16.6), (3, 1.9)):
        b = rank_memory(model, _plan(dp=64, zero=zero, seq_len=128), layers=range(36),
                        has_embedding=True, has_head=True, inflight_microbatches=1)
        assert _states(b) / 1e9 == pytest.approx(published_gb, rel=0.02), zero


def test_expert_params_shard_over_dp_over_ep():
    plan = _plan(zero=3, dp=4, ep=2)
    rp = rank_params(MOE, layers=[0, 1], tp=1, ep=2, has_embedding=True, has_head=True)
    assert rp.expert_params > 0
    b = rank_memory(MOE, plan, inflight_microbatches=1, **ALL)
    assert b.optimizer_bytes == 12 * rp.dense_params / 4 + 12 * rp.expert_params / 2
    assert b.gradients_bytes == 2 * rp.dense_params / 4 + 2 * rp.expert_params / 2
    assert b.weights_bytes == 2 * rp.dense_params / 4 + 2 * rp.expert_params / 2


def test_tp_shards_model_states():
    rp = rank_params(MHA, layers=[0, 1], tp=2, ep=1, has_embedding=True, has_head=True)
    b = rank_memory(MHA, _plan(tp=2, zero=0), inflight_microbatches=1, **ALL)
    assert _states(b) == 16 * rp.total
    assert rp.total < param_counts(MHA).total


def test_fp8_keeps_te_weight_copies_of_the_layers_only():
    """Transformer Engine caches an FP8 weight and its transpose (2 bytes) per linear-layer
    parameter of the transformer layers; embedding, head and final norm stay bf16."""
    pc = param_counts(MHA)
    p, layers = pc.total, sum(pc.layers)
    b = rank_memory(MHA, _plan(dtype="fp8", zero=0), inflight_microbatches=1, **ALL)
    assert (b.weights_bytes, b.gradients_bytes, b.optimizer_bytes) == (2 * p + 2 * layers, 2 * p, 12 * p)
    torchao = rank_memory(MHA, _plan(dtype="fp8", zero=0, fp8_recipe="torchao"),
                          inflight_microbatches=1, **ALL)
    assert torchao.weights_bytes == 2 * p


def test_store_param_remainders_keeps_10_bytes_of_optimizer_state():
    """Megatron-Core's distributed optimizer with bf16 weights keeps the master weight as a
    16-bit remainder: K = 10 instead of 12 (only when the optimizer is sharded)."""
    p = param_counts(MHA).total
    z1 = rank_memory(MHA, _plan(zero=1, dp=4, store_param_remainders=True),
                     inflight_microbatches=1, **ALL)
    assert z1.optimizer_bytes == pytest.approx(10 * p / 4)
    z0 = rank_memory(MHA, _plan(zero=0, dp=4, store_param_remainders=True),
                     inflight_microbatches=1, **ALL)
    assert z0.optimizer_bytes == 12 * p


def test_fsdp2_fp32_params_are_the_masters_16_bytes_per_param():
    """PyTorch FSDP2 over fp32 parameters with a bf16 MixedPrecisionPolicy (NeMo AutoModel):
    fp32 sharded weights 4 + fp32 gradients 4 + Adam's two fp32 moments 8 = 16 bytes per
    parameter, all sharded over dp, where bf16 weights with a separate fp32 master take 18."""
    p = param_counts(MHA).total
    fsdp2 = rank_memory(MHA, _plan(zero=3, dp=4, grad_reduce_dtype="fp32",
                                   fsdp_fp32_params=True), inflight_microbatches=1, **ALL)
    assert (fsdp2.weights_bytes, fsdp2.gradients_bytes, fsdp2.optimizer_bytes) == \
        pytest.approx((4 * p / 4, 4 * p / 4, 8 * p / 4))
    assert _states(fsdp2) == pytest.approx(16 * p / 4)
    zero3 = rank_memory(MHA, _plan(zero=3, dp=4, grad_reduce_dtype="fp32"),
                        inflight_microbatches=1, **ALL)
    assert _states(zero3) == pytest.approx(18 * p / 4)
    # the gathered bf16 weights of the buffers are the same either way
    assert fsdp2.comm_buffers_bytes == zero3.comm_buffers_bytes
    with pytest.raises(ValueError, match="fsdp_fp32_params.*zero 3"):
        _plan(zero=1, fsdp_fp32_params=True)


@settings(max_examples=30, deadline=None)
@given(dp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4]))
def test_higher_zero_stage_never_needs_more_model_state_memory(dp, tp):
    states = [_states(rank_memory(MHA, _plan(dp=dp, tp=tp, zero=z), inflight_microbatches=1, **ALL))
              for z in (0, 1, 2, 3)]
    assert states == sorted(states, reverse=True)
    if dp > 1:
        assert states[0] > states[1] > states[2] > states[3]


# ---------------------------------------------------------------------------- activations


def test_activations_are_inflight_times_korthikanti_plus_embedding_and_head():
    s, b, t, inflight = 32, 2, 2, 3
    sbh = s * b * H
    per_layer = sbh * 34 / t  # Korthikanti Table 2, TP + SP, flash attention
    embedding = sbh / t  # dropout mask, 1 byte
    head = 2 * 2 * sbh / t + 4 * s * b * V / t  # final-norm and head inputs, fp32 logits
    # transients (added once): Megatron's fp32 cross entropy holds the bf16 logits and their
    # fp32 cast besides the saved softmax, (2 + 4)*s*b*V/t; it beats the GELU MLP backward's
    # fc1-output and activation-output gradients 2*2*s*b*f/t
    loss, mlp_backward = (2 + 4) * s * b * V / t, 2 * 2 * s * b * (4 * H) / t
    assert loss > mlp_backward
    mem = rank_memory(MHA, _plan(tp=t, micro_batch=b, seq_len=s), inflight_microbatches=inflight, **ALL)
    assert mem.activations_bytes == inflight * (2 * per_layer + embedding + head)
    assert mem.transient_bytes == loss
    middle = rank_memory(MHA, _plan(tp=t, micro_batch=b, seq_len=s), layers=[1], has_embedding=False,
                         has_head=False, inflight_microbatches=inflight)
    assert (middle.activations_bytes, middle.transient_bytes) == (inflight * per_layer, mlp_backward)
    none = rank_memory(MHA, _plan(tp=t), layers=[1], has_embedding=False, has_head=False,
                       inflight_microbatches=0)
    assert none.activations_bytes == none.transient_bytes == 0


def test_full_recompute_keeps_inputs_plus_one_rematerialised_layer():
    s, b, t, inflight = 32, 2, 2, 4
    sbh = s * b * H
    mem = rank_memory(MHA, _plan(tp=t, micro_batch=b, seq_len=s, recompute="full"), layers=[0, 1],
                      has_embedding=False, has_head=False, inflight_microbatches=inflight)
    assert mem.activations_bytes == inflight * 2 * (2 * sbh / t)
    assert mem.transient_bytes == 34 * sbh / t  # one layer rematerialised


def test_selective_recompute_equals_none_under_flash_attention():
    kw = dict(layers=[0, 1], has_embedding=False, has_head=False, inflight_microbatches=2)
    assert rank_memory(MHA, _plan(recompute="selective"), **kw).activations_bytes == \
        rank_memory(MHA, _plan(recompute="none"), **kw).activations_bytes


def test_moe_activations_use_the_cost_model():
    plan = _plan(tp=2, ep=2)
    expected = 2 * sum(activation_bytes_per_layer(MOE, i, micro_batch=2, seq_len=32, tp=2) for i in (0, 1))
    # transient: the experts' backward, 2 bytes * 3 (SwiGLU) * f_e/t per routed pair and
    # per token of the shared expert: 2*3*16*(64*2 + 64)
    mem = rank_memory(MOE, plan, layers=[0, 1], has_embedding=False, has_head=False, inflight_microbatches=2)
    assert (mem.activations_bytes, mem.transient_bytes) == (expected, 2 * 3 * 16 * (64 * 2 + 64))


# ---------------------------------------------------------------------------- buffers and totals


def test_comm_buffers_and_workspace():
    kw = dict(inflight_microbatches=1, **ALL)
    assert rank_memory(MHA, _plan(dp=4, zero=1), **kw).comm_buffers_bytes == 2 * BUCKET
    assert rank_memory(MHA, _plan(dp=1, zero=1), **kw).comm_buffers_bytes == 0
    layer = param_counts(MHA).dense_layer
    # ZeRO-3: two gathered layers (bf16, + TE's 2-byte FP8 copies in fp8) and one layer's
    # unsharded bf16 gradients (+ their fp32 copy when reduced in fp32)
    assert rank_memory(MHA, _plan(dp=4, zero=3), **kw).comm_buffers_bytes == \
        2 * BUCKET + 2 * (2 * layer) + 2 * layer
    z3_fp8 = rank_memory(MHA, _plan(dp=4, zero=3, dtype="fp8"), **kw)
    assert z3_fp8.comm_buffers_bytes == 2 * BUCKET + 2 * (4 * layer) + 2 * layer
    z3_fp32 = rank_memory(MHA, _plan(dp=4, zero=3, grad_reduce_dtype="fp32"), **kw)
    assert z3_fp32.comm_buffers_bytes == 2 * BUCKET + 2 * (2 * layer) + (2 + 4) * layer
    assert rank_memory(MHA, _plan(), **kw).workspace_bytes == WORKSPACE_BYTES == GIB


def test_total_and_to_dict():
    b = rank_memory(MOE, _plan(zero=2, tp=2, ep=2), inflight_microbatches=2, **ALL)
    d = b.to_dict()
    assert set(d) == {"weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                      "comm_buffers_bytes", "workspace_bytes", "transient_bytes", "total_bytes"}
    assert b.transient_bytes > 0
    assert d["total_bytes"] == b.total_bytes == sum(v for k, v in d.items() if k != "total_bytes")


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(ValueError, match="inflight_microbatches") as info:
        rank_memory(MHA, _plan(), inflight_microbatches=-1, **ALL)
    assert "\n" not in str(info.value)
    # the expert side splits a stage's tp*cp*dp ranks as expert_tp x ep x expert-dp
    with pytest.raises(ValueError, match=r"ep: expert_tp 1 x ep 3 = 3 does not divide the 4 "):
        rank_memory(MOE, _plan(ep=3), inflight_microbatches=1, **ALL)
    with pytest.raises(ValueError, match="zero"):
        rank_memory(MHA, _plan(zero=4), inflight_microbatches=1, **ALL)
    with pytest.raises(ValueError, match="layer"):
        rank_memory(MHA, _plan(), layers=[5], has_embedding=False, has_head=False, inflight_microbatches=1)


# ---------------------------------------------------------------------------- OOM


def _breakdown(states_gib: float, acts_gib: float) -> MemoryBreakdown:
    return MemoryBreakdown(weights_bytes=states_gib / 4 * GIB, gradients_bytes=states_gib / 4 * GIB,
                           optimizer_bytes=states_gib / 2 * GIB, activations_bytes=acts_gib * GIB,
                           comm_buffers_bytes=0.0, workspace_bytes=1 * GIB)


def test_check_fits_passes_when_it_fits():
    b = _breakdown(40, 30)
    assert check_fits(b, b.total_bytes, rank=0) is None


def test_out_of_memory_error_is_one_line_and_carries_the_breakdown():
    b = _breakdown(60, 20)
    with pytest.raises(OutOfMemoryError) as info:
        check_fits(b, 80 * GIB, rank=7, plan=_plan(zero=1, micro_batch=4))
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.rank, err.breakdown, err.capacity_bytes) == (7, b, 80 * GIB)
    message = str(err)
    assert "\n" not in message
    assert message.startswith("out of memory on rank 7: needs 81.00 GiB of 80.00 GiB (weights 15.00, "
                              "gradients 15.00, optimizer 30.00, activations 20.00")
    # model states dominate: the ZeRO stage is suggested first
    assert message.endswith("try zero=2, recompute='full', micro_batch=2, more tp, pp or cp")


def test_oom_suggestions_follow_the_biggest_consumer_and_the_plan():
    b = _breakdown(10, 80)
    with pytest.raises(OutOfMemoryError) as info:
        check_fits(b, 80 * GIB, rank=0, plan=_plan(zero=3, micro_batch=1, recompute="selective"))
    message = str(info.value)
    assert message.endswith("try recompute='full', more tp, pp or cp")
    assert "zero=" not in message
    with pytest.raises(OutOfMemoryError) as info:
        check_fits(b, 80 * GIB, rank=0)
    assert "try recompute='full', a smaller micro_batch, a higher ZeRO stage" in str(info.value)


def test_oom_does_not_suggest_zero_without_ranks_to_shard_over():
    """One data-parallel rank (and cp 1) is one ZeRO shard: a higher stage divides
    nothing, so it is not suggested (a user on one GPU was told to try zero=1)."""
    b = _breakdown(60, 20)
    with pytest.raises(OutOfMemoryError) as info:
        check_fits(b, 80 * GIB, rank=0, plan=_plan(zero=0, micro_batch=4, dp=1))
    assert str(info.value).endswith("try recompute='full', micro_batch=2, more tp, pp or cp")


def test_oom_remedies_are_structured_for_each_front_end():
    b = _breakdown(60, 20)
    with pytest.raises(OutOfMemoryError) as info:
        check_fits(b, 80 * GIB, rank=0, plan=_plan(zero=1, micro_batch=4))
    remedies = [s for s in info.value.suggestions if isinstance(s, Remedy)]
    assert [(r.field, r.value) for r in remedies] == [("zero", 2), ("recompute", "full"),
                                                      ("micro_batch", 2)]
    spelled = info.value.message(lambda r: f"<{r.field}:{r.value}>")
    assert spelled.endswith("try <zero:2>, <recompute:full>, <micro_batch:2>, more tp, pp or cp")


def test_check_fits_rejects_a_bad_capacity():
    with pytest.raises(ValueError, match="capacity_bytes"):
        check_fits(_breakdown(1, 1), 0, rank=0)


def test_llama3_8b_fits_an_h100_only_when_sharded():
    """Plausibility: 8.03B params * 16 bytes = 128 GB of model states cannot fit 80 GB
    unsharded; ZeRO-1 over 8 GPUs brings them to 4*8.03 + 12*8.03/8 = 44.2 GB."""
    from strategies.models import load_model
    m = load_model("llama3-8b")
    kw = dict(layers=range(32), has_embedding=True, has_head=True, inflight_microbatches=1)
    capacity = 80e9
    unsharded = rank_memory(m, replace(_plan(dp=8, seq_len=8192, micro_batch=1), zero=0), **kw)
    with pytest.raises(OutOfMemoryError):
        check_fits(unsharded, capacity, rank=0)
    z1 = rank_memory(m, _plan(dp=8, seq_len=8192, micro_batch=1, zero=1, recompute="full"), **kw)
    assert _states(z1) / 1e9 == pytest.approx((4 + 12 / 8) * 8.03, rel=0.01)
    check_fits(z1, capacity, rank=0)


# ---------------------------------------------------------------------------- schedules


def test_interleaved_activations_weigh_each_inflight_chunk_by_its_own_layers():
    """Interleaved 1F1B, p = 4, v = 2, m = 8, 16 layers: 8 chunks of 2 layers; rank 0
    holds stages 0 and 4. Forward k runs chunk (k mod 8) // 4 on micro-batch
    (k // 8) 4 + k mod 4, backward k the chunks reversed. Megatron's warm-up on rank 0
    is (p - 1) 2 + (v - 1) p = 10 forwards (k = 0..3: stage 0, mb 0-3; k = 4..7:
    stage 4, mb 0-3; k = 8, 9: stage 0, mb 4, 5), then forward 10 (stage 0, mb 6):
    7 S_0 + 4 S_4 held; backward 0 frees stage 4 mb 0 and forward 11 adds stage 0 mb 7:
    8 S_0 + 3 S_4; later forwards are stage 4's, each after a stage-4 backward. The
    peak is the larger of the two (S_0 carries the embedding, so the second), where
    counting each of the 11 in-flight chunks with all 4 of the rank's layers would give
    11 (S_0 + S_4).

    Rank 3 (stages 3 and 7, the head on 7): warm-up (4 - 3 - 1) 2 + 4 = 4 forwards of
    stage 3 (mb 0-3), then forward 4 (stage 7, mb 0): 4 S_3 + S_7; stage 7's forwards
    and backwards alternate until forward 8 (stage 3, mb 4): 5 S_3."""
    from strategies.lowering import StepLowerer
    from strategies.memory import pipeline_memory
    from strategies.memory import stage_activation_bytes

    model = replace(MHA, num_layers=16)
    plan = _plan(dp=1, pp=4, vpp=2, schedule="interleaved", global_batch=16)
    assert plan.num_microbatches == 8
    memory = pipeline_memory(model, plan, StepLowerer(model, plan), reserve_bytes=WORKSPACE_BYTES)

    def stage(layers, embedding=False, head=False):
        return stage_activation_bytes(model, plan, layers=layers, has_embedding=embedding,
                                      has_head=head)

    def held(p):
        return memory[p].activations_bytes

    s0, s4 = stage([0, 1], embedding=True), stage([8, 9])
    assert s0 > s4
    assert held(0) == max(7 * s0 + 4 * s4, 8 * s0 + 3 * s4) == 8 * s0 + 3 * s4
    s3, s7 = stage([6, 7]), stage([14, 15], head=True)
    assert held(3) == max(4 * s3 + s7, 5 * s3)


def test_1f1b_first_rank_holds_p_microbatches_of_its_stage():
    from strategies.lowering import StepLowerer
    from strategies.memory import pipeline_memory
    from strategies.memory import stage_activation_bytes

    model = replace(MHA, num_layers=8)
    plan = _plan(dp=1, pp=4, global_batch=32)
    memory = pipeline_memory(model, plan, StepLowerer(model, plan), reserve_bytes=WORKSPACE_BYTES)
    for p in range(4):
        layers = [2 * p, 2 * p + 1]
        per_mb = stage_activation_bytes(model, plan, layers=layers, has_embedding=p == 0,
                                        has_head=p == 3)
        assert memory[p].activations_bytes == (4 - p) * per_mb
        assert memory[p].transient_bytes == transient_activation_bytes(model, plan, layers=layers,
                                                                       has_head=p == 3)


@pytest.mark.parametrize("master, moments, per_param", [
    ("fp32", "fp32", 12), ("fp32", "bf16", 8), ("bf16", "bf16", 6), ("none", "bf16", 4),
    ("none", "fp32", 8)])
def test_optimizer_bytes_are_master_weights_plus_two_moments(master, moments, per_param):
    """K = M + 2*m: master weights (fp32 4, bf16 2, none 0) plus Adam's two moments (fp32 4
    or bf16 2 each). DeepSeek-V3 (fp32 masters, bf16 moments): 8; Apex DistributedFusedAdam
    with bf16 state over bf16 weights (no copy): 4; with FP8 weights (a bf16 copy): 6."""
    p = param_counts(MHA).total
    plan = _plan(zero=1, dp=4, master_weights_dtype=master, optimizer_moments_dtype=moments)
    b = rank_memory(MHA, plan, inflight_microbatches=1, **ALL)
    assert b.optimizer_bytes == per_param * p / 4
    assert (b.weights_bytes, b.gradients_bytes) == (2 * p, 2 * p)
    # remainders replace only an fp32 master weight (4 -> 2 bytes)
    rem = rank_memory(MHA, replace(plan, store_param_remainders=True), inflight_microbatches=1,
                      **ALL)
    assert rem.optimizer_bytes == (per_param - 2 * (master == "fp32")) * p / 4


def test_fp8_params_hold_the_fp8_weight_and_its_transpose_instead_of_bf16_and_copies():
    """Transformer Engine fp8_model_init: a linear weight is 1 byte plus its 1-byte cached
    transpose, replacing the bf16 weight (2) and TE's cached FP8 copies (2); the embedding,
    head and norms stay bf16. Only fp8 plans take the field."""
    pc = param_counts(MHA)
    p, layers = pc.total, sum(pc.layers)  # the cache's count (test above)
    cached = rank_memory(MHA, _plan(dtype="fp8", zero=0), inflight_microbatches=1, **ALL)
    fp8 = rank_memory(MHA, _plan(dtype="fp8", zero=0, fp8_params=True), inflight_microbatches=1,
                      **ALL)
    assert cached.weights_bytes - fp8.weights_bytes == 2 * layers
    assert fp8.weights_bytes == 2 * p
    with pytest.raises(ValueError, match="fp8_params: true needs dtype fp8.*not dtype bf16"):
        _plan(zero=0, fp8_params=True)


def test_master_weights_must_be_fp32_with_fsdp_fp32_params():
    with pytest.raises(ValueError, match="master_weights_dtype: 'none'.*fsdp_fp32_params"):
        _plan(zero=3, fsdp_fp32_params=True, master_weights_dtype="none")
    with pytest.raises(ValueError, match="optimizer_moments_dtype"):
        _plan(optimizer_moments_dtype="fp16")


def test_deepseek_low_precision_activation_cache_closed_form():
    """DeepSeek-V3 Section 3.3.3: the routed experts' SwiGLU inputs (gate and up outputs,
    2*f_e per token-expert pair) cached in FP8 save 1 byte per element against bf16; the
    attention output cached once in E5M6 (1.5 bytes) replaces bf16 plus TE's FP8 copy (3
    bytes with FP8 linear inputs, 2 without)."""
    from strategies.models import load_model
    m = load_model("deepseek-v3")
    n, pairs = 4096, 4096 * 8  # micro-batch 1, tp 1, top-8, uniform load
    args = dict(micro_batch=1, seq_len=4096, tp=1, recompute="selective",
                recompute_modules=("layernorm", "mla_up_proj", "moe_act"), expert_load=1.0)
    for fp8_inputs, saved in ((True, 3 - 1.5), (False, 2 - 1.5)):
        base = activation_bytes_per_layer(m, 5, fp8_linear_inputs=fp8_inputs, **args)
        swiglu = activation_bytes_per_layer(m, 5, fp8_linear_inputs=fp8_inputs,
                                            fp8_swiglu_inputs=True, **args)
        e5m6 = activation_bytes_per_layer(m, 5, fp8_linear_inputs=fp8_inputs,
                                          e5m6_attention_output=True, **args)
        assert base - swiglu == pairs * 2 * 2048 * (2 - 1)
        assert base - e5m6 == saved * n * 128 * 128
    # a dense layer has no routed experts: the SwiGLU cache changes nothing there
    dense = dict(args, recompute_modules=("layernorm", "mla_up_proj"))
    assert activation_bytes_per_layer(m, 0, fp8_swiglu_inputs=True, **dense) == \
        activation_bytes_per_layer(m, 0, **dense)
