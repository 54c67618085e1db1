#!/usr/bin/env python3
"""Why FP8 weak-scaling series lose speed with GPU count (issue 12): measure the trend and
price the one FP8-only mechanism that synchronises the whole data-parallel side.

Run from the repository root::

    python tools/fp8_trend.py                    # slopes, BF16 vs FP8, and the amax estimate
    python tools/fp8_trend.py --algorithm ring   # the amax all-reduce priced as a ring

What it prints:

1. **Slope of the error per doubling** of each weak-scaling series of the NVIDIA DGX
   Cloud benchmarking rows and NeMo's long-sequence rows (same model, GPU and dtype:
   least squares of ``simulated / published - 1`` on ``log2(GPUs)``), as the simulator
   prices them today and with the estimate of 2. added to each FP8 row.
2. **Transformer Engine's amax reduction**, the mechanism candidate: under delayed
   scaling (``te-delayed``, Megatron-Core's default ``fp8_recipe`` before TE 2.x) every
   exit of an ``fp8_autocast`` region all-reduces (``ReduceOp.MAX``, ``async_op=False``,
   on the compute stream) the region's current amaxes over the region's ``fp8_group``
   (TransformerEngine ``transformer_engine/pytorch/fp8.py``:
   ``FP8GlobalStateManager.fp8_autocast_exit`` -> ``reduce_and_update_fp8_tensors
   (forward=True)`` -> ``reduce_tensor_across_group_op_max``), and the backward's amaxes
   are reduced the same way when the region's backward ends
   (``hook_for_bwd_amax_reduction``, a ``register_multi_grad_hook``). Megatron-Core wraps
   each ``TransformerBlock.forward`` (one model chunk) in one region under delayed
   scaling, ``fp8_group = parallel_state.get_amax_reduction_group(with_context_parallel=
   True, tp_only_amax_red=config.tp_only_amax_red)``: TP x DP x CP unless
   ``tp_only_amax_red`` (default False; megatron/core/transformer/transformer_block.py,
   megatron/core/fp8_utils.py ``get_fp8_context``). So each micro-batch of each model
   chunk synchronises all data-parallel replicas of a pipeline stage twice; BF16 steps
   synchronise them once, at the gradient reduction. Bytes: one fp32 amax per FP8
   tensor of the region, 3 per GEMM forward (input, weight, output) and 2 backward
   (grad output, grad input), 4 GEMMs per layer (TE 1.x ``fp8_meta`` sizes).
   The estimate prices that all-reduce with the simulator's own collective cost model
   (``hardware.cost.CostModel.collective``, ``--algorithm`` as NCCL would be forced
   with ``NCCL_ALGO``) and adds ``2 x micro-batches x vpp`` of them per step, exposed.

The estimate is offline (the step is not re-simulated): it is what the lowering would
add if the reduction were an op on the compute stream of every forward and backward
action. Only Megatron-Core-family rows (NeMo, Megatron-Bridge, DGX Cloud's NeMo recipes)
with the ``te-delayed`` recipe get it; MaxText and Paxml (JAX) rows do not.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from sim.analytic_step import PricingCache  # noqa: E402
from validate.published import (evaluate, load_models, load_nemo_recipes,  # noqa: E402
                                load_runs, scenario_for)
from validate.published_stacks import framework_kind  # noqa: E402

#: Sources whose rows form weak-scaling series (fixed work per GPU).
SOURCES = ("nvidia_dgxc_benchmarking", "nvidia_nemo_perf")

#: fp32 amaxes per GEMM that one amax reduction carries: forward (input, weight,
#: output) and backward (grad output, grad input); TE 1.x ``fp8_meta["scaling_fwd"]``
#: and ``["scaling_bwd"]`` hold 3 and 2 per GEMM.
AMAX_PER_GEMM = {"forward": 3, "backward": 2}

#: GEMMs of one transformer layer under TE (QKV, attention projection, FC1, FC2).
GEMMS_PER_LAYER = 4

ALGORITHMS = ("auto", "tree", "ring")


def series_of(source_id: str, row_id: str) -> str | None:
    """The weak-scaling series a row belongs to (None: not one of them): the DGX Cloud
    rows' middle id part (``dgxc_l70b_07`` -> ``l70b``), NeMo's long-sequence rows by GPU."""
    if source_id == "nvidia_dgxc_benchmarking":
        return row_id.split("_")[1]
    if source_id == "nvidia_nemo_perf" and row_id.startswith("nemo_longseq"):
        return "longseq_b200" if "_b200_" in row_id else "longseq"
    return None


def slope_per_doubling(gpus: list[int], errors: list[float]) -> float:
    """Least-squares slope of ``errors`` on ``log2(gpus)`` (relative error per doubling).

    Raises:
        ValueError: when fewer than two distinct GPU counts are given.
    """
    if len(set(gpus)) < 2:
        raise ValueError(f"gpus: {sorted(set(gpus))!r} is not valid; give at least two "
                         "distinct GPU counts")
    return float(np.polyfit(np.log2(gpus), errors, 1)[0])


def amax_reduction_s(run, scenario, cache: PricingCache, algorithm: str
                     ) -> tuple[float, int, int, float]:
    """Seconds per step of a row's amax all-reduces (see the module docstring), the
    group size, the reductions per step and one forward reduction's microseconds.
    (0, 0, 0, 0) for rows it does not apply to."""
    plan = scenario.plan
    if (plan.dtype != "fp8" or plan.fp8_recipe != "te-delayed"
            or framework_kind(run.get("framework"), run.get("framework_version"))
            != "megatron-core"):
        return 0.0, 0, 0, 0.0
    layout = cache.layout(scenario.cluster, plan.world_size)
    cost = cache.cost_model(layout)
    # Megatron's rank order puts TP, CP and DP inside PP: rank 0's group is contiguous
    group = tuple(range(plan.tp * plan.cp * plan.dp))
    layers = math.ceil(scenario.model.num_layers / (plan.pp * plan.vpp))
    seconds = {}
    for phase, per_gemm in AMAX_PER_GEMM.items():
        size = 4 * per_gemm * GEMMS_PER_LAYER * layers
        seconds[phase] = (cost.collective("all_reduce", group, size, algorithm).duration_ns
                          / 1e9 if len(group) > 1 else 0.0)
    reductions = 2 * plan.num_microbatches * plan.vpp
    per_step = plan.num_microbatches * plan.vpp * sum(seconds.values())
    return per_step, len(group), reductions, seconds["forward"] * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print the series' slopes and the amax estimate (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="auto",
                        help=f"the amax all-reduce's algorithm: {', '.join(ALGORITHMS)}")
    args = parser.parse_args(argv)
    if args.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: {args.algorithm!r} is not valid; valid: "
                         f"{', '.join(ALGORITHMS)}")
    runs = [r for r in load_runs(sources=SOURCES) if series_of(r.source_id, r.row_id)]
    frame = evaluate(runs)
    models, recipes, cache = load_models(), load_nemo_recipes(), PricingCache()
    by_row = {(r.source_id, r.row_id): r for r in runs}
    series: dict[tuple[str, str, str], list[tuple[int, float, float]]] = {}
    print(f"{'row':22s} {'GPUs':>5s} {'group':>5s} {'reductions':>10s} {'one (us)':>8s} "
          f"{'per step (ms)':>13s} {'error':>7s} {'with amax':>9s}")
    for row in frame.itertuples():
        if row.status != "ok":
            continue
        run = by_row[(row.source_id, row.row_id)]
        added, group, count, one_us = amax_reduction_s(
            run, scenario_for(run, models, recipes), cache, args.algorithm)
        with_amax = (row.simulated_step_s + added) / row.published_step_s - 1
        key = (series_of(row.source_id, row.row_id), row.gpu, row.dtype)
        series.setdefault(key, []).append((row.gpus, row.error, with_amax))
        if added:
            print(f"{row.row_id:22s} {row.gpus:5d} {group:5d} {count:10d} {one_us:8.1f} "
                  f"{added * 1e3:13.1f} {row.error:+7.2%} {with_amax:+9.2%}")
    print(f"\n{'series':14s} {'GPU':9s} {'dtype':5s} {'rows':>4s} {'slope/doubling':>14s} "
          f"{'with amax':>9s} {'mean error':>10s} {'with amax':>9s}")
    for (name, gpu, dtype), points in sorted(series.items()):
        gpus = [n for n, _, _ in points]
        if len(set(gpus)) < 3:
            continue
        before = [e for _, e, _ in points]
        after = [a for _, _, a in points]
        print(f"{name:14s} {gpu:9s} {dtype:5s} {len(points):4d} "
              f"{slope_per_doubling(gpus, before):+14.2%} {slope_per_doubling(gpus, after):+9.2%} "
              f"{np.mean(before):+10.2%} {np.mean(after):+9.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
