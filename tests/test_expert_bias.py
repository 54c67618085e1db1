"""Routed-expert biases (gpt-oss) priced the way the stacks add them.

Megatron-Core ``TEGroupedMLP`` adds the up-projection bias inside the grouped GEMM (free) and
the down-projection bias with ``_apply_bias`` (``t + b * p`` per local expert, then a cat) in
eager PyTorch; NeMo AutoModel's DeepEP experts add both that way. The bytes and kernel counts
of those eager chains are closed forms, asserted exactly.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from strategies import model_costs as costs
from strategies.models import load_model
from strategies.plan import ParallelPlan
from trainsim import api
from validate.published import load_models
from validate.published_stacks import stack_settings


def _biased_moe(**moe):
    """Mixtral shrunk to 2 layers with expert biases."""
    model = load_model("mixtral-8x7b")
    return replace(model, num_layers=2, moe=replace(model.moe, expert_bias=True, **moe))


def test_down_bias_closed_form():
    pairs, e_l, h, up = 4096.0, 16, 2880, 5760
    k = costs.expert_bias_kernels(pairs=pairs, local_experts=e_l, hidden=h, up_cols=up,
                                  ea=2.0, act="bf16")
    assert set(k) == {"down"}
    down = k["down"]
    x = pairs * h
    # b*p writes x; t + bp reads two, writes one; cat reads and writes: 6 elements of bf16
    assert down.fwd_bytes == 12.0 * x
    # db: grad*p read/write + row sum; dp: grad*b read/write + column sum; cat of dt slices
    assert down.bwd_input_bytes == 16.0 * x and down.bwd_weight_bytes == 0.0
    assert down.launches == (2 * 16 + 1, 4 * 16 + 1)
    assert (down.fwd_flops, down.bwd_input_flops) == (2.0 * x, 4.0 * x)
    assert down.kind == "elementwise" and down.shape == (4096, 2880)


def test_eager_impl_adds_the_up_bias_too():
    pairs, e_l, h, up = 1024.0, 32, 2880, 5760
    k = costs.expert_bias_kernels(pairs=pairs, local_experts=e_l, hidden=h, up_cols=up,
                                  ea=2.0, act="bf16", impl="eager")
    assert set(k) == {"down", "up"}
    y = pairs * up
    assert k["up"].fwd_bytes == 8.0 * y          # t + b (r1 w1), cat (r1 w1)
    assert k["up"].bwd_input_bytes == 6.0 * y    # db row sum (r1), cat of dt slices (r1 w1)
    assert k["up"].launches == (33, 33)
    assert k["down"] == costs.expert_bias_kernels(pairs=pairs, local_experts=e_l, hidden=h,
                                                  up_cols=up, ea=2.0, act="bf16")["down"]
    with pytest.raises(ValueError, match="expert_bias_impl"):
        costs.expert_bias_kernels(pairs=pairs, local_experts=e_l, hidden=h, up_cols=up,
                                  ea=2.0, act="bf16", impl="fused")


def test_layer_kernels_place_the_bias_after_its_gemm():
    model = _biased_moe()
    common = dict(micro_batch=1, seq_len=4096, tp=2, ep=4)
    names = [k.name for k in costs.layer_kernels(model, 0, **common)]
    i = names.index("moe.experts.down")
    assert names[i + 1] == "moe.experts.down_bias" and "moe.experts.up_bias" not in names
    eager = [k.name for k in costs.layer_kernels(model, 0, expert_bias_impl="eager", **common)]
    j = eager.index("moe.experts.gate_up")
    assert eager[j + 1] == "moe.experts.up_bias" and eager[j + 2] == "moe.experts.act"
    # the rank's pairs: n_sp * k * etp over its E/ep experts (balanced, dropless)
    bias = {k.name: k for k in costs.layer_kernels(model, 0, **common)}["moe.experts.down_bias"]
    pairs = 4096 // 2 * model.moe.top_k * 2
    assert bias.shape == (pairs, model.hidden_size)
    assert bias.launches == (2 * (8 // 4) + 1, 4 * (8 // 4) + 1)
    # fp8 GEMMs: the bias follows the down GEMM, not its quantization kernel
    fp8 = [k.name for k in costs.layer_kernels(model, 0, dtype="fp8", **common)]
    assert fp8[fp8.index("moe.experts.down") + 1] == "moe.experts.down_bias"
    # a model without expert biases is unchanged
    plain = replace(model, moe=replace(model.moe, expert_bias=False))
    assert not [n for n in (k.name for k in costs.layer_kernels(plain, 0, **common))
                if n.endswith("_bias")]


def test_expert_bias_sources():
    models = load_models()
    assert models["gpt-oss-120b"].moe.expert_bias and models["gpt-oss-20b"].moe.expert_bias
    assert not models["qwen3-30b-a3b"].moe.expert_bias
    assert not load_model("mixtral-8x7b").moe.expert_bias
    automodel = {"framework": "NeMo AutoModel (PyTorch backend: FSDP2; TE + DeepEP + FlexAttn)",
                 "model": "gpt-oss-20b", "gpu": "H100-SXM", "dtype": "bf16"}
    assert stack_settings(automodel, {}, None).fields["expert_bias_impl"] == "eager"
    bridge = {"framework": "Megatron-Bridge/Megatron-Core", "framework_version": "NeMo 26.02",
              "model": "gpt-oss-120b", "gpu": "B200", "dtype": "bf16"}
    assert "expert_bias_impl" not in stack_settings(bridge, {}, None).fields
    assert ParallelPlan().expert_bias_impl == "megatron"
    with pytest.raises(ValueError, match="expert_bias_impl"):
        ParallelPlan(expert_bias_impl="fused")


def test_hugging_face_gpt_oss_has_expert_biases(tmp_path):
    base = dict(hidden_size=2880, num_hidden_layers=2, num_attention_heads=64,
                num_key_value_heads=8, head_dim=64, intermediate_size=2880, vocab_size=201088,
                num_local_experts=32, num_experts_per_tok=4)
    for model_type, expected in (("gpt_oss", True), ("mixtral", False)):
        path = tmp_path / model_type / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**base, "model_type": model_type}))
        assert load_model(str(path)).moe.expert_bias is expected


def test_expert_bias_analytic_equals_event_and_costs_time():
    model = _biased_moe()
    case = dict(gpus=8, tp=2, ep=4, seq_len=2048, global_batch=8)
    analytic, event = (api.simulate(model, fidelity=f, **case) for f in ("analytic", "event"))
    assert analytic.step_time_s == event.step_time_s
    plain = api.simulate(replace(model, moe=replace(model.moe, expert_bias=False)), **case)
    eager = api.simulate(model, expert_bias_impl="eager", **case)
    assert plain.step_time_s < analytic.step_time_s < eager.step_time_s
