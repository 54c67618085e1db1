"""The Adam step and the checkpoint priced from what the optimizer stores
(strategies.model_costs.adam_bytes_per_param, strategies.memory.optimizer_storage and
checkpoint_bytes_per_param): every case counted by hand from the implementations' passes."""

import pytest

from strategies import failures as fl
from strategies import model_costs as C
from strategies.memory import (OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES_PER_PARAM,
                               checkpoint_bytes_per_param, optimizer_storage)
from strategies.models import load_model
from strategies.plan import ParallelPlan
from trainsim import api


def _plan(**fields) -> ParallelPlan:
    return ParallelPlan(**{"dp": 8, "zero": 1, **fields})


# ------------------------------------------------------------------- kernel bytes by hand


def test_adam_bytes_per_param_by_hand():
    # fused: read g, p, m, v; write p, m, v (+ the model-weight copy)
    assert C.adam_bytes_per_param("fused") == 4 * 4 + 3 * 4 == 28
    assert C.ADAM_BYTES_PER_PARAM == {"fused": 28.0, "foreach": 80.0, "for-loop": 80.0}
    # foreach, all fp32: p 4 touches, exp_avg 3, exp_avg_sq 5, grad 2, temporary 6
    assert C.adam_bytes_per_param("foreach") == 4 * (4 + 3 + 5 + 2 + 6) == 80
    # foreach with bf16 moments (the temporary in exp_avg_sq's dtype) and a bf16 copy
    assert C.adam_bytes_per_param("foreach", exp_avg_bytes=2, exp_avg_sq_bytes=2,
                                  weight_copy_bytes=2) == 4 * 4 + 2 * 4 + 2 * (3 + 5 + 6) + 2
    # Megatron-Core default: bf16 main grads, fp32 master and moments, bf16 copy
    assert C.adam_bytes_per_param("fused", grad_bytes=2, weight_copy_bytes=2) == 28
    # bf16 moments: 4 x 2 bytes saved
    assert C.adam_bytes_per_param("fused", grad_bytes=2, exp_avg_bytes=2, exp_avg_sq_bytes=2,
                                  weight_copy_bytes=2) == 2 + 8 + 8 + 2 == 20
    # TE multi_tensor_adam_param_remainder: int16 remainder r/w, bf16 weight read and written
    assert C.adam_bytes_per_param("fused", grad_bytes=2, param_bytes=2,
                                  param_extra_read_bytes=2, weight_copy_bytes=2) == 26
    with pytest.raises(ValueError, match="exp_avg_bytes"):
        C.adam_bytes_per_param("fused", exp_avg_bytes=0)
    with pytest.raises(ValueError, match="weight_copy_bytes"):
        C.adam_bytes_per_param("fused", weight_copy_bytes=-1)
    with pytest.raises(ValueError, match="implementation"):
        C.adam_bytes_per_param("lamb")


@pytest.mark.parametrize("fields, stored, adam", [
    # today's defaults: bf16 gradient, fp32 master and moments, bf16 copy
    ({}, (2, 4, 4, 0, 2), 28),
    # fp32 main grads (NeMo's grad_reduce_in_fp32)
    ({"grad_reduce_dtype": "fp32"}, (4, 4, 4, 0, 2), 30),
    # DeepSeek-V3: BF16 moments, fp32 master weights and gradients
    ({"grad_reduce_dtype": "fp32", "optimizer_moments_dtype": "bf16"}, (4, 4, 2, 0, 2), 22),
    # Megatron-Core store_param_remainders under the distributed optimizer
    ({"store_param_remainders": True}, (2, 2, 4, 2, 2), 26),
    # ... which needs a sharded optimizer
    ({"store_param_remainders": True, "zero": 0}, (2, 4, 4, 0, 2), 28),
    # Apex DistributedFusedAdam, bf16 state, store_params=False: the bf16 weight updated in
    # place and params_out written for the all-gather
    ({"optimizer_moments_dtype": "bf16", "master_weights_dtype": "none"}, (2, 2, 2, 0, 2), 16),
    # ... unsharded: no all-gather buffer
    ({"optimizer_moments_dtype": "bf16", "master_weights_dtype": "none", "zero": 0},
     (2, 2, 2, 0, 0), 14),
    # Nemotron-4 340B FP8: bf16 parameter copy as master, FP8 weight written
    ({"optimizer_moments_dtype": "bf16", "master_weights_dtype": "bf16", "dtype": "fp8",
      "fp8_params": True}, (2, 2, 2, 0, 1), 15),
    # PyTorch FSDP2 over fp32 parameters (torch.optim foreach): gradients in fp32
    ({"zero": 3, "fsdp_fp32_params": True, "grad_reduce_dtype": "fp32",
      "optimizer_impl": "foreach"}, (4, 4, 4, 0, 2), 82),
    # Composer's for-loop over FSDP1's fp32 flat parameters: fp32 gradients whatever the
    # reduction dtype
    ({"zero": 3, "optimizer_impl": "for-loop"}, (4, 4, 4, 0, 2), 82),
])
def test_optimizer_storage_of_plans(fields, stored, adam):
    s = optimizer_storage(_plan(**fields))
    assert (s.grad_bytes, s.param_bytes, s.exp_avg_bytes, s.param_extra_read_bytes,
            s.weight_copy_bytes) == stored
    assert s.exp_avg_sq_bytes == s.exp_avg_bytes
    assert s.adam_bytes_per_param() == adam


# ------------------------------------------------------------------- the step


def test_bf16_moments_shorten_the_optimizer_step_by_exactly_the_bytes_saved():
    """Same plan, fp32 vs bf16 moments: the Adam kernel moves 8 bytes less per local
    parameter, nothing else changes, so the step is shorter by exactly the difference of
    the two Adam kernels' durations (the optimizer ends the step at ZeRO 0)."""
    def run(moments):
        result = api.simulate("llama3-8b", gpus=8, tp=8, seq_len=2048, global_batch=8,
                              micro_batch=1, zero=0, optimizer_moments_dtype=moments)
        spans = [s for s in result.timeline.spans() if s.op == "optimizer.adam"]
        return result, spans[0]

    fp32, adam32 = run("fp32")
    bf16, adam16 = run("bf16")
    params = adam32.bytes / 28
    assert params == int(params) and params > 1e9 / 8   # llama3-8b over TP 8
    assert adam32.bytes - adam16.bytes == 8 * params
    assert adam16.end_ns - adam16.start_ns < adam32.end_ns - adam32.start_ns
    saved_ns = (adam32.end_ns - adam32.start_ns) - (adam16.end_ns - adam16.start_ns)
    assert round((fp32.step_time_s - bf16.step_time_s) * 1e9) == saved_ns


# ------------------------------------------------------------------- checkpoints


def test_checkpoint_bytes_per_param_from_the_stored_dtypes():
    # defaults: bf16 weights + fp32 master + two fp32 moments
    assert checkpoint_bytes_per_param() == checkpoint_bytes_per_param(_plan()) == 14
    assert fl.CHECKPOINT_BYTES_PER_PARAM == WEIGHT_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM
    assert checkpoint_bytes_per_param(_plan(optimizer_moments_dtype="bf16")) == 2 + 4 + 4
    assert checkpoint_bytes_per_param(_plan(store_param_remainders=True)) == 2 + 2 + 8
    assert checkpoint_bytes_per_param(_plan(optimizer_moments_dtype="bf16",
                                            master_weights_dtype="none")) == 2 + 0 + 4
    assert checkpoint_bytes_per_param(_plan(master_weights_dtype="bf16")) == 2 + 2 + 8
    # FSDP2 over fp32 parameters: the fp32 parameters are the masters
    assert checkpoint_bytes_per_param(_plan(zero=3, fsdp_fp32_params=True)) == 4 + 8
    model = load_model("llama3-8b")
    total = C.param_counts(model).total
    assert fl.checkpoint_bytes_for(model) == int(total * 14)
    assert fl.checkpoint_bytes_for(model, plan=_plan(optimizer_moments_dtype="bf16")) == \
        int(total * 10)
    assert fl.checkpoint_bytes_for(model, bytes_per_param=3.0) == int(total * 3)


def test_the_long_run_prices_the_checkpoint_its_step_stores():
    """failures() sizes the checkpoint from the simulated step's plan."""
    from sim.longrun.inputs import prepare_long_run

    def size(moments):
        step = api.simulate("llama3-8b", gpus=8, tp=8, seq_len=2048, global_batch=8,
                            micro_batch=1, zero=0, fidelity="analytic",
                            optimizer_moments_dtype=moments)
        return prepare_long_run(gpus=8, days=1, model="llama3-8b", step=step).costs

    total = C.param_counts(load_model("llama3-8b")).total
    assert size("fp32").checkpoint_bytes == int(total * 14)
    assert size("bf16").checkpoint_bytes == int(total * 10)
