"""PyTorch's non-reentrant checkpoint early stop (``ParallelPlan.recompute_early_stop``).

Closed forms: a full recompute that stops early re-runs a layer's forward minus what comes
after the last saved tensor (strategies.lowering.early_stop_end); the FLOPs it saves are
exactly the down projection's GEMM for plain ``torch.nn.Linear`` layers, and only the
residual add's for Transformer Engine layers.
"""

from __future__ import annotations

import pytest

from conftest import tiny_models
from strategies import model_costs as costs
from strategies.lowering import early_stop_end, lower_step
from strategies.plan import ParallelPlan
from validate.published_stacks import framework_defaults

TINY, TINY_MOE = tiny_models()


def _recompute_flops(plan: ParallelPlan, model=TINY) -> float:
    """FLOPs of every recompute op of pipeline rank 0."""
    program = lower_step(model, plan).program
    ops = program.ops_by_rank[program.ranks()[0]]
    return sum(getattr(op, "flops", 0.0) for op in ops if ".recompute" in op.name)


def _plan(**fields) -> ParallelPlan:
    return ParallelPlan(global_batch=2, micro_batch=1, seq_len=256, recompute="full", **fields)


def test_early_stop_skips_the_down_projection_of_torch_linear_layers():
    full = _recompute_flops(_plan(layer_impl="torch"))
    early = _recompute_flops(_plan(layer_impl="torch", recompute_early_stop=True))
    kernels = costs.layer_kernels(TINY, 0, micro_batch=1, seq_len=256)
    down = next(k for k in kernels if k.name in ("mlp.fc2", "mlp.down"))
    residual = next(k for k in kernels if k.name == "mlp.residual")
    micro_batches = 2
    skipped = micro_batches * TINY.num_layers * (down.fwd_flops + residual.fwd_flops)
    assert full - early == pytest.approx(skipped, rel=1e-12)


def test_early_stop_with_te_layers_runs_the_gemm_and_skips_only_the_add():
    full = _recompute_flops(_plan(layer_impl="te"))
    early = _recompute_flops(_plan(layer_impl="te", recompute_early_stop=True))
    kernels = costs.layer_kernels(TINY, 0, micro_batch=1, seq_len=256)
    residual = next(k for k in kernels if k.name == "mlp.residual")
    assert full - early == pytest.approx(2 * TINY.num_layers * residual.fwd_flops, rel=1e-12)


def test_early_stop_end_rules():
    kernels = costs.layer_kernels(TINY, 0, micro_batch=1, seq_len=256)
    mlp = [k for k in kernels if k.block == "mlp"]
    down = max(i for i, k in enumerate(mlp) if k.kind == "matmul")
    assert early_stop_end("mlp", mlp, dropout=False, aten_matmul=True) == down
    assert early_stop_end("mlp", mlp, dropout=False, aten_matmul=False) == down + 1
    # dropout's mask is saved after the GEMM: everything re-runs
    assert early_stop_end("mlp", mlp, dropout=True, aten_matmul=True) == len(mlp)
    attention = [k for k in kernels if k.block == "attention"]
    assert early_stop_end("attention", attention, dropout=False,
                          aten_matmul=True) == len(attention)


def test_early_stop_changes_nothing_without_full_recompute():
    plan = ParallelPlan(global_batch=2, micro_batch=1, seq_len=256, layer_impl="torch")
    with_flag = ParallelPlan(global_batch=2, micro_batch=1, seq_len=256, layer_impl="torch",
                             recompute_early_stop=True)
    assert _recompute_flops(plan) == _recompute_flops(with_flag) == 0.0


def test_stacks_that_run_pytorch_2_1_checkpoint_stop_early():
    assert framework_defaults("torchtitan")["recompute_early_stop"] is True
    assert framework_defaults("NeMo AutoModel (FSDP2)")["recompute_early_stop"] is True
    # llm-foundry's benchmark sweeps ran PyTorch 2.0.1 / 1.13.1: no early stop
    assert "recompute_early_stop" not in framework_defaults(
        "Composer / llm-foundry (PyTorch FSDP)")
    assert "recompute_early_stop" not in framework_defaults("Megatron-Core")
