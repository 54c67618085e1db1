"""XLA scanned layers without while-loop double buffering (``ParallelPlan.
xla_scan_carry_copies``): the collective pipeliner's loop-carried buffers are copied once
per layer iteration on the compute stream.

Closed forms: per micro-batch, one copy of each layer's gathered parameters in the
forward and one in the backward (``PARAM_BYTES`` per parameter, read and written), one
copy of its unreduced gradients in the backward (``grad_reduce_dtype`` bytes per
parameter, read and written), nothing else in the step changes; the option is refused
where it is not modelled; the dgxc Paxml recipe (double buffering off) runs it, the
dgxc MaxText recipe (double buffering on) does not.
"""

from __future__ import annotations

import pytest

from hardware.units import ELEMENT_BYTES
from strategies.lowering import COMPUTE, PARAM_BYTES, StepLowerer
from strategies.models import load_model
from strategies.plan import ParallelPlan
from trainsim import api
from validate.published_stacks import stack_settings

MODEL = load_model("llama2-7b")


def _ops(**fields):
    plan = api.make_plan(gpus=16, tp=1, seq_len=2048, global_batch=16, micro_batch=1,
                         zero=3, grad_reduce_dtype="fp32", **fields)
    program = StepLowerer(MODEL, plan).lower().program
    return plan, program.ops_by_rank[program.ranks()[0]]


def test_each_layer_copies_its_gathered_parameters_twice_and_its_gradients_once():
    plan, ops = _ops(xla_scan_carry_copies=True)
    _, plain = _ops()
    copies = [op for op in ops if op.name.startswith("scan.copy.")]
    layer_params = sum(k.params for k in StepLowerer(MODEL, plan).kernels(0))
    params = [op for op in copies if ".params." in op.name]
    grads = [op for op in copies if ".grads." in op.name]
    assert len(params) == 2 * MODEL.num_layers and len(grads) == MODEL.num_layers
    assert {op.bytes for op in params} == {2.0 * PARAM_BYTES * layer_params}
    assert {op.bytes for op in grads} == {2.0 * ELEMENT_BYTES["fp32"] * layer_params}
    assert {op.kind for op in copies} == {"memcpy"}
    assert {op.stream for op in copies} == {COMPUTE}
    # the copies are all that changes
    assert [op.name for op in ops if not op.name.startswith("scan.copy.")] == [
        op.name for op in plain]


def test_the_copies_slow_the_step_by_at_most_their_time():
    kwargs = dict(gpus=16, tp=1, seq_len=2048, global_batch=16, zero=3,
                  grad_reduce_dtype="fp32", fidelity="event")
    plain = api.simulate("llama2-7b", **kwargs)
    copied = api.simulate("llama2-7b", xla_scan_carry_copies=True, **kwargs)
    plan, ops = _ops(xla_scan_carry_copies=True)
    assert plan.num_microbatches == 1
    frame = copied.timeline_frame()
    rank = frame[frame["rank"] == frame["rank"].min()]
    copy_s = rank.duration_ns[rank.op.str.startswith("scan.copy.")].sum() / 1e9
    assert copy_s > 0
    # compute-stream work added: the step grows, by no more than the copies take
    assert plain.step_time_s < copied.step_time_s <= plain.step_time_s + copy_s + 1e-9


@pytest.mark.parametrize("fields", [dict(zero=1), dict(zero=3, gpus=1, global_batch=1),
                                    dict(zero=3, global_batch=32)])
def test_refused_where_not_modelled(fields):
    base = dict(dp=8, global_batch=8, micro_batch=1, seq_len=2048)
    base.update(fields)
    if base.pop("gpus", None) == 1:
        base["dp"] = 1
    with pytest.raises(ValueError, match="^xla_scan_carry_copies: true needs zero 3"):
        ParallelPlan(xla_scan_carry_copies=True, **base)


def _row(framework: str, model: str) -> dict:
    return {"framework": framework, "framework_version": "", "model": model, "gpu": "H100-SXM",
            "dtype": "fp8", "notes": "", "citation": ""}


def test_the_paxml_recipe_copies_and_the_maxtext_recipe_does_not():
    pax = stack_settings(_row("Paxml (JAX)", "gpt3-175b"), {"zero": 3}, None, num_layers=96)
    maxtext = stack_settings(_row("MaxText (JAX)", "llama2-70b"), {"zero": 3}, None,
                             num_layers=80)
    assert pax.fields.get("xla_scan_carry_copies") is True
    assert "xla_scan_carry_copies" not in maxtext.fields
    assert any("double buffering" in note for note in pax.unprinted)
