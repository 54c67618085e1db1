"""Tests for strategies.model_costs: parameters vs published sizes, closed forms, kernels,
activation bytes (Korthikanti et al. 2022), model FLOPs (PaLM appendix B)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import one_line_error as _error
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware.spec import COMPUTE_KINDS
from strategies.model_costs import (
    BLOCKS,
    CAUSAL_FLOP_FRACTION,
    FLASH_BWD_FLOP_FACTOR,
    Kernel,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    embedding_kernels,
    head_activation_bytes,
    head_kernels,
    layer_kernels,
    layer_params,
    model_flops_per_token,
    param_counts,
    rank_params,
)
from strategies.model_spec import ModelSpec, MoESpec
from strategies.models import load_model

# A small MHA GELU model (Korthikanti's setting: f = 4h, a*d = h) and a GQA SwiGLU MoE one.
L, H, A, D, F, V = 2, 64, 4, 16, 256, 1000
MHA = ModelSpec(name="mha", num_layers=L, hidden_size=H, num_heads=A, num_kv_heads=A, head_dim=D,
                ffn_hidden_size=F, vocab_size=V, mlp="gelu", norm="layernorm")
G, FE, E, TOPK, S = 2, 32, 4, 2, 1
MOE = ModelSpec(name="moe", num_layers=3, hidden_size=H, num_heads=A, num_kv_heads=G, head_dim=D,
                ffn_hidden_size=F, vocab_size=V, mlp="swiglu", norm="rmsnorm",
                moe=MoESpec(num_experts=E, top_k=TOPK, expert_ffn_hidden_size=FE, shared_experts=S,
                            first_dense_layers=1, capacity_factor=0.0))



def _by_name(kernels: list[Kernel]) -> dict[str, Kernel]:
    return {k.name: k for k in kernels}


def _flops(kernels, kinds=("matmul", "attention")) -> float:
    return sum(k.fwd_flops for k in kernels if k.kind in kinds)


# ---------------------------------------------------------------------------- published sizes

# (preset, published total, published active, relative tolerance). Dense models: 1 %
# (we omit biases and position embeddings: <0.02 % for GPT-3).
PUBLISHED = [
    ("llama2-7b", 6.74e9, None, 0.01),     # Llama 2 model card: 6.74B (arXiv 2307.09288)
    ("llama3-8b", 8.03e9, None, 0.01),     # Llama 3 model card: 8.03B
    ("llama3-70b", 70.6e9, None, 0.01),    # Llama 3 model card: 70.6B
    ("llama3-405b", 405.8e9, None, 0.01),  # Llama 3.1 405B: 405.8B (HF safetensors count)
    ("gpt3-175b", 174.6e9, None, 0.01),    # arXiv 2005.14165 Table 2.1: 175.0B; 174.6B exact count
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01),  # arXiv 2401.04088 Section 2: 47B / 13B; 46.7B / 12.9B
]


@pytest.mark.parametrize("name, total, active, tol", PUBLISHED)
def test_param_counts_match_published_sizes(name, total, active, tol):
    pc = param_counts(load_model(name))
    assert pc.total == pytest.approx(total, rel=tol)
    assert pc.active_per_token == pytest.approx(total if active is None else active, rel=tol)


def test_deepseek_v3_params_with_multi_head_latent_attention():
    """DeepSeek-V3 (arXiv 2412.19437, Section 4.2): 671B total and 37B activated parameters,
    without the MTP module. MLA's weights per layer, exactly: q down, q norm, q up, kv down
    (latent + rotary key), kv norm, kv up, output, and the block's norm."""
    m = load_model("deepseek-v3")
    pc = param_counts(m)
    h = 7168
    mla = (h * 1536 + 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 + 512 * 128 * 256
           + 128 * 128 * h)
    assert mla == pytest.approx(187.1e6, rel=1e-3)
    assert pc.layers[0] == mla + h + 3 * h * 18432 + h
    assert pc.total == pytest.approx(671e9, rel=0.001)
    # the published 37B has two significant digits: the activated parameters without the
    # embedding lookup (it does no matmul) are 36.63e9, -1.0 %; with it 37.55e9
    active = pc.active_per_token - pc.embedding
    assert 36.5e9 <= active < 37.5e9
    assert active / 37e9 - 1 == pytest.approx(-0.0101, abs=0.001)
    # the MTP module: a MoE layer, the 2h x h projection, two norms (the 14B of the
    # released checkpoint also holds its own embedding and head copies, 2 x 0.93e9)
    assert pc.mtp + 2 * pc.embedding == pytest.approx(13.5e9, rel=0.01)
    assert pc.dense_layer > 0 and pc.moe_layer > pc.dense_layer
    assert pc.layers[:3] == (pc.dense_layer,) * 3 and pc.layers[3:] == (pc.moe_layer,) * 58


def test_mla_kernels_flops_and_kv_cache():
    """MLA's attention block: the down projections on the sequence shard, the up
    projections on every token, the core over 192 query/key and 128 value dims; the
    cache holds the 512-dim latent and the 64-dim rotary key per layer (DeepSeek-V2
    report Table 1)."""
    from strategies.model_costs import kv_cache_elements_per_token, model_flops_per_token

    m = load_model("deepseek-v3")
    b, s, t = 1, 4096, 2
    k = {x.name: x for x in layer_kernels(m, 0, micro_batch=b, seq_len=s, tp=t)}
    n, n_sp = b * s, b * s // t
    assert k["attn.q_down"].fwd_flops == 2 * n_sp * 7168 * 1536
    assert k["attn.kv_down"].fwd_flops == 2 * n_sp * 7168 * 576
    assert k["attn.q_up"].fwd_flops == 2 * n * 1536 * 64 * 192
    assert k["attn.kv_up"].fwd_flops == 2 * n * 512 * 64 * 256
    assert k["attn.out"].fwd_flops == 2 * n * 64 * 128 * 7168
    assert k["attn.core"].fwd_flops == 0.5 * 2 * b * s * s * 64 * (192 + 128)
    assert k["attn.core"].shape[5] == 192
    assert kv_cache_elements_per_token(m) == (512 + 64) * 61
    mha = replace(m, mla=None, head_dim=128)
    assert kv_cache_elements_per_token(mha) == 2 * 128 * 128 * 61
    attention = 6 * 61 * 128 * s * (192 + 128)
    pc = param_counts(m)
    assert model_flops_per_token(m, s) == 6 * (pc.active_per_token - pc.embedding) + attention


# ---------------------------------------------------------------------------- closed forms


def test_param_counts_of_a_small_dense_model_exactly():
    layer = 4 * H * H + 2 * (2 * H) + 2 * H * F
    pc = param_counts(MHA)
    assert pc.layers == (layer, layer)
    assert pc.dense_layer == layer and pc.moe_layer == 0
    assert (pc.embedding, pc.head, pc.final_norm) == (V * H, V * H, 2 * H)
    assert pc.total == pc.active_per_token == L * layer + 2 * V * H + 2 * H
    tied = param_counts(replace(MHA, tied_embeddings=True))
    assert tied.head == 0 and tied.total == L * layer + V * H + 2 * H


def test_param_counts_of_a_small_moe_model_exactly():
    attn = H * (A + 2 * G) * D + A * D * H
    dense = attn + 2 * H + 3 * H * F
    expert = 3 * H * FE
    moe = attn + 2 * H + H * E + (E + S) * expert
    pc = param_counts(MOE)
    assert pc.layers == (dense, moe, moe)
    assert (pc.dense_layer, pc.moe_layer) == (dense, moe)
    assert pc.total == dense + 2 * moe + 2 * V * H + H
    assert pc.active_per_token == pc.total - 2 * (E - TOPK) * expert


def test_model_flops_per_token_is_6n_plus_12lhs_exactly():
    s = 128
    n = L * (4 * H * H + 4 * H + 2 * H * F) + V * H + 2 * H  # layers + head + final norm
    expected = 6 * n + 12 * L * A * D * s
    assert model_flops_per_token(MHA, s) == expected
    # A tied head is the same matmul: same model FLOPs.
    assert model_flops_per_token(replace(MHA, tied_embeddings=True), s) == expected


def test_model_flops_per_token_causal_halves_only_the_attention_term():
    """Megatron-Core's count (num_floating_point_operations, causal mask): 6N + 6 L a d s."""
    s = 128
    n = L * (4 * H * H + 4 * H + 2 * H * F) + V * H + 2 * H
    assert model_flops_per_token(MHA, s, causal=True) == 6 * n + 6 * L * A * D * s
    pc = param_counts(MOE)
    assert model_flops_per_token(MOE, 64, causal=True) == (
        6 * (pc.active_per_token - pc.embedding) + 6 * 3 * A * D * 64)


def test_model_flops_per_token_of_moe_uses_active_params():
    pc = param_counts(MOE)
    s = 64
    assert model_flops_per_token(MOE, s) == 6 * (pc.active_per_token - pc.embedding) + 12 * 3 * A * D * s


def test_kernel_matmul_flops_are_6_per_matmul_param_per_token():
    """Summed over a whole model at tp = cp = 1, matmul fwd+bwd FLOPs = 6 * matmul params *
    tokens (Narayanan et al. 2021), and attention fwd+bwd = 3.5 * causal 4bs^2ad."""
    b, s = 2, 32
    kernels = [k for i in range(L) for k in layer_kernels(MHA, i, micro_batch=b, seq_len=s)]
    kernels += head_kernels(MHA, micro_batch=b, seq_len=s)
    mm = [k for k in kernels if k.kind == "matmul"]
    matmul_params = L * (4 * H * H + 2 * H * F) + V * H
    assert sum(k.fwd_flops + k.bwd_flops for k in mm) == 6 * matmul_params * b * s
    attn = [k for k in kernels if k.kind == "attention"]
    assert sum(k.fwd_flops + k.bwd_flops for k in attn) == L * 3.5 * 0.5 * 4 * b * s * s * A * D


# ---------------------------------------------------------------------------- kernels


def test_dense_kernel_order_gelu_and_swiglu():
    names = [k.name for k in layer_kernels(MHA, 0, micro_batch=1, seq_len=16)]
    assert names == ["attn.norm", "attn.qkv", "attn.core", "attn.out", "attn.residual",
                     "mlp.norm", "mlp.fc1", "mlp.act", "mlp.fc2", "mlp.residual"]
    names = [k.name for k in layer_kernels(MOE, 0, micro_batch=1, seq_len=16)]
    assert names[5:] == ["mlp.norm", "mlp.gate_up", "mlp.act", "mlp.down", "mlp.residual"]


def test_moe_kernel_order():
    names = [k.name for k in layer_kernels(MOE, 1, micro_batch=1, seq_len=16)]
    assert names[5:] == ["moe.norm", "moe.router", "moe.route", "moe.shared.gate_up", "moe.shared.act",
                         "moe.shared.down", "moe.permute", "moe.experts.gate_up", "moe.experts.act",
                         "moe.experts.down", "moe.unpermute", "moe.residual"]


@pytest.mark.parametrize("model, layer", [(MHA, 0), (MOE, 0), (MOE, 1)])
def test_kernel_fields_are_valid(model, layer):
    kernels = layer_kernels(model, layer, micro_batch=2, seq_len=32, tp=2, cp=2, ep=2)
    kernels += embedding_kernels(model, micro_batch=2, seq_len=32, tp=2, cp=2)
    kernels += head_kernels(model, micro_batch=2, seq_len=32, tp=2, cp=2)
    for k in kernels:
        assert k.kind in COMPUTE_KINDS and k.block in BLOCKS, k
        assert k.fwd_flops >= 0 and k.fwd_bytes > 0 and k.bwd_input_bytes >= 0, k
        if k.params == 0:
            assert k.bwd_weight_flops == 0 and k.bwd_weight_bytes == 0, k
    assert {k.name for k in kernels if k.selective_recompute} == {"attn.core"}


@pytest.mark.parametrize("model, layer", [(MHA, 0), (MOE, 0), (MOE, 1)])
def test_matmul_backward_is_twice_forward(model, layer):
    for k in layer_kernels(model, layer, micro_batch=2, seq_len=32, tp=2):
        if k.kind == "matmul":
            assert k.bwd_input_flops == k.fwd_flops and k.bwd_weight_flops == k.fwd_flops, k.name
            assert k.bwd_flops == 2 * k.fwd_flops


def test_flash_attention_flops_causal_and_backward():
    b, s, tp, cp = 2, 64, 2, 4
    core = _by_name(layer_kernels(MHA, 0, micro_batch=b, seq_len=s, tp=tp, cp=cp))["attn.core"]
    assert core.fwd_flops == CAUSAL_FLOP_FRACTION * 4 * b * (s // cp) * s * (A // tp) * D
    assert core.bwd_input_flops == FLASH_BWD_FLOP_FACTOR * core.fwd_flops == 2.5 * core.fwd_flops
    assert core.bwd_weight_flops == 0 and core.params == 0
    assert core.shape == (b, A // tp, A // tp, s // cp, s, D)


def test_matmul_bytes_and_gqa_shapes_exactly():
    b, s, tp = 2, 32, 2
    n = b * s
    k = _by_name(layer_kernels(MOE, 0, micro_batch=b, seq_len=s, tp=tp))["attn.qkv"]
    cols = (A // tp + 2 * (G // tp)) * D
    assert k.shape == (1, n, cols, H)
    assert k.fwd_flops == 2 * n * cols * H
    assert k.fwd_bytes == 2 * (n * H + H * cols + n * cols)
    assert k.bwd_input_bytes == 2 * (n * cols + H * cols + n * H)
    assert k.bwd_weight_bytes == 2 * (n * H + n * cols + H * cols)
    assert k.params == H * cols
    fp8 = _by_name(layer_kernels(MOE, 0, micro_batch=b, seq_len=s, tp=tp, dtype="fp8"))["attn.qkv"]
    assert fp8.dtype == "fp8" and fp8.fwd_bytes == 1 * (n * H + H * cols) + 2 * n * cols
    # KV heads are replicated when tp exceeds them (G = 2 < tp = 4).
    k4 = _by_name(layer_kernels(MOE, 0, micro_batch=b, seq_len=s, tp=4))["attn.qkv"]
    assert k4.shape[2] == (A // 4 + 2 * 1) * D


@pytest.mark.parametrize("model, layer", [(MHA, 0), (MOE, 0), (MOE, 1)])
def test_tp_halves_layer_matmul_flops_exactly(model, layer):
    one = layer_kernels(model, layer, micro_batch=2, seq_len=32, tp=1)
    two = layer_kernels(model, layer, micro_batch=2, seq_len=32, tp=2)
    assert _flops(two, ("matmul",)) * 2 == _flops(one, ("matmul",))
    assert _flops(two, ("attention",)) * 2 == _flops(one, ("attention",))
    # Sequence parallel shards norms and residuals too.
    assert _flops(two, ("norm", "elementwise")) < _flops(one, ("norm", "elementwise"))


def test_sequence_parallel_off_replicates_norms():
    sp = _by_name(layer_kernels(MHA, 0, micro_batch=2, seq_len=32, tp=4, sequence_parallel=True))
    no = _by_name(layer_kernels(MHA, 0, micro_batch=2, seq_len=32, tp=4, sequence_parallel=False))
    assert sp["attn.norm"].shape == (16, H) and no["attn.norm"].shape == (64, H)
    assert no["attn.norm"].fwd_flops == 4 * sp["attn.norm"].fwd_flops
    assert no["attn.qkv"] == sp["attn.qkv"]


def test_cp_divides_projections_and_attention():
    one = _by_name(layer_kernels(MHA, 0, micro_batch=2, seq_len=64, cp=1))
    four = _by_name(layer_kernels(MHA, 0, micro_batch=2, seq_len=64, cp=4))
    for name in ("attn.qkv", "attn.out", "mlp.fc1", "mlp.fc2", "attn.core"):
        assert four[name].fwd_flops * 4 == one[name].fwd_flops, name


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 4))
def test_dense_layer_work_scales_as_one_over_tp_cp(tp, cp, b):
    s = 64
    base = layer_kernels(MHA, 1, micro_batch=b, seq_len=s)
    split = layer_kernels(MHA, 1, micro_batch=b, seq_len=s, tp=tp, cp=cp)
    assert _flops(split) * tp * cp == _flops(base)


def test_moe_experts_tokens_top_k_capacity_and_ep():
    b, s, tp = 2, 32, 2
    n = b * s
    k1 = _by_name(layer_kernels(MOE, 1, micro_batch=b, seq_len=s, tp=tp, ep=1))
    k2 = _by_name(layer_kernels(MOE, 1, micro_batch=b, seq_len=s, tp=tp, ep=2))
    up1, up2 = k1["moe.experts.gate_up"], k2["moe.experts.gate_up"]
    pairs = n * TOPK
    assert up1.fwd_flops == 2 * pairs * H * (2 * FE // tp) == up2.fwd_flops
    assert up1.shape == (E, pairs // E, 2 * FE // tp, H) and up2.shape == (E // 2, pairs // 2, 2 * FE // tp, H)
    assert up1.params == 2 * up2.params == E * H * 2 * FE // tp
    assert k1["moe.experts.down"].fwd_flops == 2 * pairs * (FE // tp) * H
    assert k1["moe.shared.gate_up"].fwd_flops == 2 * n * H * 2 * S * FE // tp
    assert k1["moe.router"].fwd_flops == 2 * (n // tp) * H * E and k1["moe.router"].params == H * E
    padded = replace(MOE, moe=replace(MOE.moe, capacity_factor=1.25))
    kp = _by_name(layer_kernels(padded, 1, micro_batch=b, seq_len=s, tp=tp))
    assert kp["moe.experts.gate_up"].fwd_flops == 1.25 * up1.fwd_flops


@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 1), (2, 2), (4, 4)])
@pytest.mark.parametrize("has_embedding", [False, True])
def test_kernel_params_add_up_to_rank_params(tp, ep, has_embedding):
    for model in (MHA, MOE):
        kernels = [k for i in range(model.num_layers)
                   for k in layer_kernels(model, i, micro_batch=1, seq_len=16, tp=tp, ep=ep)]
        kernels += head_kernels(model, micro_batch=1, seq_len=16, tp=tp)
        if has_embedding:
            kernels += embedding_kernels(model, micro_batch=1, seq_len=16, tp=tp)
        rp = rank_params(model, layers=range(model.num_layers), tp=tp, ep=ep,
                         has_embedding=has_embedding, has_head=True)
        expert = sum(k.params for k in kernels if k.expert)
        assert {k.name for k in kernels if k.expert} == (
            {"moe.experts.gate_up", "moe.experts.act", "moe.experts.down"} if model.moe else set())
        dense = sum(k.params for k in kernels) - expert
        assert (rp.dense_params, rp.expert_params) == (dense, expert)


def test_rank_params_unsharded_equals_param_counts():
    for model in (MHA, MOE, replace(MHA, tied_embeddings=True)):
        rp = rank_params(model, layers=range(model.num_layers), tp=1, ep=1, has_embedding=True, has_head=True)
        assert rp.total == param_counts(model).total


def test_tied_head_on_another_stage_keeps_a_copy():
    tied = replace(MHA, tied_embeddings=True)
    last = rank_params(tied, layers=[1], tp=2, ep=1, has_embedding=False, has_head=True)
    first = rank_params(tied, layers=[0], tp=2, ep=1, has_embedding=True, has_head=False)
    assert last.dense_params - first.dense_params == 2 * H  # the final norm
    assert _by_name(head_kernels(tied, micro_batch=1, seq_len=16, tp=2))["head.logits"].params == 0


def test_layer_params_shard_by_tp_and_ep():
    dense, expert = layer_params(MOE, 1, tp=2, ep=2)
    assert expert == (E // 2) * 3 * H * (FE // 2)
    assert dense == H * (A // 2 + 2 * (G // 2)) * D + (A // 2) * D * H + 2 * H + H * E + S * 3 * H * (FE // 2)


def test_embedding_and_head_kernels():
    b, s, tp = 2, 32, 2
    n = b * s
    head = _by_name(head_kernels(MHA, micro_batch=b, seq_len=s, tp=tp))
    assert head["head.logits"].fwd_flops == 2 * n * H * (V // tp)
    assert head["head.logits"].params == (V // tp) * H
    assert head["head.cross_entropy"].shape == (n, V // tp)
    assert head["head.norm"].params == 2 * H
    emb = _by_name(embedding_kernels(MHA, micro_batch=b, seq_len=s, tp=tp))
    assert emb["embed.lookup"].params == (V // tp) * H and emb["embed.lookup"].fwd_flops == 0
    assert emb["embed.lookup"].bwd_input_flops == 0
    odd = _by_name(head_kernels(MHA, micro_batch=b, seq_len=s, tp=4))
    assert odd["head.logits"].shape[2] == 250
    assert "embed.dropout" not in _by_name(embedding_kernels(MHA, micro_batch=b, seq_len=s, dropout=False))


# ---------------------------------------------------------------------------- activations


def _korthikanti(s, b, h, a, t, *, sp, recompute):
    """Korthikanti et al. 2022 Table 2 (bytes per layer, 16-bit), with flash attention:
    the 5as/h score terms are not stored."""
    if recompute == "full":
        return 2 * s * b * h / t if sp else 2 * s * b * h
    return s * b * h * 34 / t if sp else s * b * h * (10 + 24 / t)


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_bytes_match_korthikanti_exactly(t, sp, recompute):
    s, b = 32, 2
    got = activation_bytes_per_layer(MHA, 0, micro_batch=b, seq_len=s, tp=t,
                                     sequence_parallel=sp, recompute=recompute)
    assert got == _korthikanti(s, b, H, A, t, sp=sp, recompute=recompute)


def test_activation_bytes_cp_divides_the_sequence():
    s, b, t, cp = 64, 2, 2, 4
    got = activation_bytes_per_layer(MHA, 0, micro_batch=b, seq_len=s, tp=t, cp=cp)
    assert got == _korthikanti(s // cp, b, H, A, t, sp=True, recompute="none")


def test_activation_bytes_swiglu_gqa_exactly():
    s, b, t = 32, 2, 2
    n, n_sp = b * s, b * s // t
    expected = (2 * 2 * n_sp * H                               # norm input, QKV input
                + 2 * n * (2 * (A // t) + 2 * (G // t)) * D      # Q, attention out, K, V
                + n_sp * H                                     # dropout mask
                + 2 * 2 * n_sp * H + n_sp * H                  # norm input, MLP input, mask
                + 2 * 3 * n * F // t)                          # gate, up, act output
    assert activation_bytes_per_layer(MOE, 0, micro_batch=b, seq_len=s, tp=t) == expected
    no_dropout = activation_bytes_per_layer(MOE, 0, micro_batch=b, seq_len=s, tp=t, dropout=False)
    assert expected - no_dropout == 2 * n_sp * H


def test_activation_bytes_moe_exactly():
    s, b, t = 32, 2, 2
    n, n_sp = b * s, b * s // t
    pairs = n * TOPK        # processed by the rank's experts: etp * n_sp * k, etp = t
    own = n_sp * TOPK       # the rank's own token-expert pairs
    attention_and_io = (2 * 2 * n_sp * H + 2 * n * (2 * (A // t) + 2 * (G // t)) * D + n_sp * H
                        + 2 * 2 * n_sp * H + n_sp * H)
    expected = (attention_and_io
                + 4 * n_sp * E                                  # fp32 router probabilities
                + pairs * 2 * (H + 3 * FE // t)                 # permuted input, 3 ffn tensors
                + own * 4                                       # fp32 probability
                + 2 * 3 * n * S * FE // t)                      # shared expert intermediates
    assert activation_bytes_per_layer(MOE, 1, micro_batch=b, seq_len=s, tp=t) == expected


def test_embedding_and_head_activation_bytes():
    s, b, t = 32, 2, 2
    n_sp = b * s // t
    assert embedding_activation_bytes(MHA, micro_batch=b, seq_len=s, tp=t) == n_sp * H
    assert embedding_activation_bytes(MHA, micro_batch=b, seq_len=s, tp=t, dropout=False) == 0
    assert head_activation_bytes(MHA, micro_batch=b, seq_len=s, tp=t) == 2 * 2 * n_sp * H + 4 * b * s * V // t


def test_bf16_logit_loss_keeps_and_needs_two_bytes_per_logit():
    """NeMo AutoModel's MaskedCrossEntropy(fp32_upcast=False): F.cross_entropy on the bf16
    logits saves its bf16 log-softmax (2 bytes per logit) and, in the backward, holds the
    bf16 gradients of the log-probabilities and of the logits (2 + 2 bytes per logit)."""
    from strategies.model_costs import head_transient_bytes
    s, b, t = 32, 2, 2
    n_sp, logits = b * s // t, b * s * V // t
    assert head_activation_bytes(MHA, micro_batch=b, seq_len=s, tp=t,
                                 cross_entropy="eager_bf16") == 2 * 2 * n_sp * H + 2 * logits
    assert head_transient_bytes(MHA, micro_batch=b, seq_len=s, tp=t,
                                cross_entropy="eager_bf16") == 4 * logits
    assert head_transient_bytes(MHA, micro_batch=b, seq_len=s, tp=t,
                                cross_entropy="eager") == 8 * logits


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, words", [
    (dict(tp=3), ["tp", "3", "num_heads", "32", "valid tp"]),
    (dict(cp=3), ["cp", "3", "seq_len", "4096"]),
    (dict(micro_batch=0), ["micro_batch", "0"]),
    (dict(dtype="int3"), ["int3", "valid dtypes"]),
])
def test_bad_kernel_inputs_raise_one_line_errors(kwargs, words):
    args = dict(micro_batch=1, seq_len=4096)
    args.update(kwargs)
    message = _error(layer_kernels, load_model("llama3-8b"), 0, **args)
    for word in words:
        assert word in message, message


def test_more_bad_inputs():
    assert "layer" in _error(layer_kernels, MHA, 2, micro_batch=1, seq_len=16)
    assert "ep" in _error(layer_kernels, load_model("mixtral-8x7b"), 0, micro_batch=1, seq_len=16, ep=3)
    assert "sequence_parallel" in _error(layer_kernels, MHA, 0, micro_batch=1, seq_len=6, tp=4)
    assert "recompute" in _error(activation_bytes_per_layer, MHA, 0, micro_batch=1, seq_len=16,
                                 recompute="partial")
    assert "listed twice" in _error(rank_params, MHA, layers=[0, 0], tp=1, ep=1,
                                    has_embedding=False, has_head=False)
    assert "seq_len" in _error(model_flops_per_token, MHA, 0)
    assert "num_kv_heads" in _error(layer_kernels, replace(MHA, num_heads=12, num_kv_heads=4,
                                                           head_dim=16), 0, micro_batch=1, seq_len=16, tp=6)


# ------------------------------------------------------- torchtitan per-op checkpointing


def test_op_sac_reruns_every_second_matmul_of_llama_order():
    """wq, wk, wv, wo, w1, w3, w2: the policy saves the odd ones, so wk (a sixth of the
    fused QKV for 32 query and 8 KV heads), wo and w3 (half of gate_up) re-run, with
    their FP8 casts; SDPA is saved; norms, activation and residuals re-run."""
    from strategies.model_costs import op_sac_recompute_fractions
    model = load_model("llama3-8b")
    kernels = layer_kernels(model, 0, micro_batch=1, seq_len=4096, dtype="fp8",
                            fp8_recipe="torchao", elementwise="eager")
    share = dict(zip((k.name for k in kernels), op_sac_recompute_fractions(kernels, model)))
    assert share["attn.qkv"] == pytest.approx(8 / (32 + 8 + 8))
    assert share["attn.qkv.quant"] == share["attn.qkv"]
    assert (share["attn.out"], share["mlp.gate_up"], share["mlp.down"]) == (1.0, 0.5, 0.0)
    assert (share["attn.core"], share["attn.norm"], share["mlp.act"]) == (0.0, 1.0, 1.0)
    assert share["mlp.down.quant"] == 0.0


def test_op_sac_activation_bytes_closed_form():
    """Kept: block input, Q, V, SDPA output (n*(2a+g)*d), w1's and w2's outputs."""
    model = load_model("llama3-8b")
    n, h, d, f = 2 * 4096, model.hidden_size, model.head_dim, model.ffn_hidden_size
    expected = 2 * (n * h + n * (2 * 32 + 8) * d + n * f + n * h)
    got = activation_bytes_per_layer(model, 0, micro_batch=2, seq_len=4096,
                                     recompute="selective", recompute_modules=("op_sac",))
    assert got == expected
    assert got < activation_bytes_per_layer(model, 0, micro_batch=2, seq_len=4096)


def test_op_sac_is_refused_on_moe_layers():
    model = load_model("mixtral-8x7b")
    with pytest.raises(ValueError, match="op_sac is modelled for dense layers"):
        activation_bytes_per_layer(model, 0, micro_batch=1, seq_len=4096,
                                   recompute="selective", recompute_modules=("op_sac",))


# ------------------------------------------------------------- JAX remat policies


def test_jax_remat_skips_the_last_matmul_and_what_each_policy_saves():
    """jax.checkpoint re-runs only what the backward reads: never the MLP's down projection
    (its output only enters the residual sum, the next layer's input) nor that sum; the
    saved projections are read; FP8 input casts, norms, attention core, activation and the
    attention residual re-run."""
    from strategies.model_costs import jax_remat_recompute_fractions
    model = load_model("llama3-8b")
    kernels = layer_kernels(model, 0, micro_batch=1, seq_len=4096, dtype="fp8")
    names = [k.name for k in kernels]
    rerun = {policy: {n for n, f in zip(names, jax_remat_recompute_fractions(kernels, model, policy))
                      if f == 1.0}
             for policy in ("jax_full", "jax_save_qkv", "jax_save_qkv_out")}
    for policy, chosen in rerun.items():
        assert set(jax_remat_recompute_fractions(kernels, model, policy)) <= {0.0, 1.0}
        assert {"mlp.down", "mlp.residual"}.isdisjoint(chosen), policy
        assert {"attn.norm", "attn.core", "attn.residual", "mlp.norm", "mlp.gate_up", "mlp.act",
                "mlp.down.quant", "attn.qkv.quant", "attn.out.quant"} <= chosen, policy
    assert {"attn.qkv", "attn.out"} <= rerun["jax_full"]
    assert "attn.qkv" not in rerun["jax_save_qkv"] and "attn.out" in rerun["jax_save_qkv"]
    assert {"attn.qkv", "attn.out"}.isdisjoint(rerun["jax_save_qkv_out"])
    with pytest.raises(ValueError, match="policy: 'jax_none' is not a JAX remat policy"):
        jax_remat_recompute_fractions(kernels, model, "jax_none")


def test_jax_remat_activation_bytes_closed_form():
    """Kept: the layer input n*h, plus Q, K, V n*(a + 2g)*d (save_qkv) and the output
    projection's n*h (save_qkv_out), 2 bytes each."""
    model = load_model("llama3-8b")
    n, h, d = 2 * 4096, model.hidden_size, model.head_dim
    qkv = n * (32 + 2 * 8) * d
    got = {policy: activation_bytes_per_layer(model, 0, micro_batch=2, seq_len=4096,
                                              recompute="selective", recompute_modules=(policy,))
           for policy in ("jax_full", "jax_save_qkv", "jax_save_qkv_out")}
    assert got == {"jax_full": 2 * n * h, "jax_save_qkv": 2 * (n * h + qkv),
                   "jax_save_qkv_out": 2 * (n * h + qkv + n * h)}


def test_jax_remat_is_refused_on_moe_layers():
    model = load_model("mixtral-8x7b")
    with pytest.raises(ValueError, match="jax_full is modelled for dense layers"):
        activation_bytes_per_layer(model, 0, micro_batch=1, seq_len=4096,
                                   recompute="selective", recompute_modules=("jax_full",))
