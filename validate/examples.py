"""Built-in example Programs for ``trainsim validate replay --example NAME``.

``tiny``: a 4-layer GPT-style transformer (hidden 256, 4 heads, FFN 1024, vocabulary
512, sequence 128) trained with pipeline parallelism 2 x data parallelism 2 = 4 ranks,
1F1B over 4 micro-batches per replica. Every op class appears (GEMMs, attention, norms,
elementwise, memcpy, optimizer, pipeline send/recv, a data-parallel all-reduce). A step
takes ~0.3-0.5 s with 4 ranks on a 2-core CI machine: long enough that the scheduler's
few-millisecond wake-ups of oversubscribed ranks are a small part of it (with hidden 128
the step was ~0.12 s and those wake-ups made up ~20 % of it, beyond what a model of the
ops can predict), short enough for CI.

Its matmuls run in fp32: on CPUs without AVX-512 BF16 a bf16 GEMM runs ~60x slower than
fp32 (measured on the CI machine: 0.57 vs 36.7 GFLOP/s for 256^3 with one thread), and
CPU training is fp32 anyway. On GPUs, replay real models (``--model``) in bf16.
"""

from __future__ import annotations

from strategies.ir import Program
from strategies.lowering import lower_step
from strategies.model_spec import ModelSpec
from strategies.plan import ParallelPlan

#: Names accepted by :func:`example_program`.
EXAMPLES = ("tiny",)


def tiny_model() -> ModelSpec:
    """The ``tiny`` example's transformer."""
    return ModelSpec(name="tiny-gpt", num_layers=4, hidden_size=256, num_heads=4,
                     num_kv_heads=4, head_dim=64, ffn_hidden_size=1024, vocab_size=512,
                     mlp="gelu", norm="layernorm", tied_embeddings=True)


def tiny_plan() -> ParallelPlan:
    """pp 2 x dp 2, 4 micro-batches of 1 x 128 tokens per replica, fp32, no ZeRO."""
    return ParallelPlan(dp=2, pp=2, micro_batch=1, global_batch=8, seq_len=128, zero=0,
                        dtype="fp32")


def full_program(model: ModelSpec, plan: ParallelPlan) -> Program:
    """The step Program of ``model`` under ``plan`` with EVERY rank listed.

    The simulator's default Program is symmetry-reduced (one rank per pipeline stage);
    a replay needs each rank's own ops, so all ranks are made distinct.
    """
    return lower_step(model, plan, distinct=list(range(plan.world_size))).program


def example_program(name: str) -> Program:
    """The Program of a built-in example.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if name == "tiny":
        return full_program(tiny_model(), tiny_plan())
    raise ValueError(f"example: {name!r} is not valid; valid: {', '.join(EXAMPLES)}")
