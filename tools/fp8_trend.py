#!/usr/bin/env python3
"""Why FP8 weak-scaling series lose speed with GPU count (issue 12): the trend, and what
Transformer Engine's amax all-reduce (now an op of the simulated step) contributes.

Run from the repository root::

    python tools/fp8_trend.py

What it prints:

1. Per FP8 row the simulator prices with the amax all-reduce (``te-delayed``,
   ``amax_reduction`` megatron): its amax group (TP x DP x CP, Megatron-Core's
   ``get_amax_reduction_group``), the reductions per step (forward and backward of every
   model chunk and micro-batch), the step's error as simulated and the error the same
   row has with ``amax_reduction = "none"`` (re-simulated: the step without the op).
2. The **slope of the error per doubling** of each weak-scaling series of the NVIDIA DGX
   Cloud benchmarking rows and NeMo's long-sequence rows (same model, GPU and dtype:
   least squares of ``simulated / published - 1`` on ``log2(GPUs)``), with the op and
   without it.

The mechanism (strategies/lowering.py ``StepLowerer._amax_reduction``): under delayed
scaling every exit of an ``fp8_autocast`` region all-reduces (``ReduceOp.MAX``,
``async_op=False``, on the compute stream) the amaxes of TE's global buffer over the
region's ``fp8_group`` (TransformerEngine ``transformer_engine/pytorch/fp8.py``
``fp8_autocast_exit`` -> ``reduce_and_update_fp8_tensors``; TE 2.x ``quantization.py``
``autocast_exit``), and the backward's when the region's backward ends. Megatron-Core
opens one region per ``TransformerBlock.forward``; JAX stacks (MaxText, Paxml) run no
such collective. This tool used to add an offline estimate of it on top of the simulated
step; the rows now carry the op.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from sim.analytic_step import PricingCache  # noqa: E402
from sim.step import simulate_step  # noqa: E402
from strategies.lowering import reduces_amax  # noqa: E402
from validate.published import (evaluate, load_models, load_nemo_recipes,  # noqa: E402
                                load_runs, scenario_for)

#: Sources whose rows form weak-scaling series (fixed work per GPU).
SOURCES = ("nvidia_dgxc_benchmarking", "nvidia_nemo_perf")


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


def amax_reductions(scenario) -> tuple[int, int]:
    """The amax group size and the amax all-reduces per step of a row's scenario
    (forward and backward of each micro-batch of each model chunk); (0, 0) when its
    plan runs none (not ``te-delayed`` FP8, a JAX stack, or a group of one)."""
    plan = scenario.plan
    group = plan.tp * plan.cp * (1 if plan.tp_only_amax_red else plan.dp)
    if not reduces_amax(plan) or group == 1:
        return 0, 0
    return group, 2 * plan.num_microbatches * plan.vpp


def without_amax_s(scenario, cache: PricingCache) -> float:
    """The row's simulated step (analytic) with ``amax_reduction = "none"``."""
    plan = replace(scenario.plan, amax_reduction="none")
    return simulate_step(scenario.model, scenario.cluster, plan, fidelity="analytic",
                         check_memory=False, cache=cache).step_time_s


def main(argv: list[str] | None = None) -> int:
    """Print the amax rows and the series' slopes (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    runs = [r for r in load_runs(sources=SOURCES) if series_of(r.source_id, r.row_id)]
    frame = evaluate(runs)
    models, recipes, cache = load_models(), load_nemo_recipes(), PricingCache()
    by_row = {(r.source_id, r.row_id): r for r in runs}
    series: dict[tuple[str, str, str], list[tuple[int, float, float]]] = {}
    print(f"{'row':22s} {'GPUs':>5s} {'group':>5s} {'reductions':>10s} "
          f"{'amax (ms)':>9s} {'error':>7s} {'no amax':>8s}")
    for row in frame.itertuples():
        if row.status != "ok":
            continue
        scenario = scenario_for(by_row[(row.source_id, row.row_id)], models, recipes)
        group, count = amax_reductions(scenario)
        without = row.error
        if count:
            bare_s = without_amax_s(scenario, cache)
            without = bare_s / row.published_step_s - 1
            print(f"{row.row_id:22s} {row.gpus:5d} {group:5d} {count:10d} "
                  f"{(row.simulated_step_s - bare_s) * 1e3:9.1f} {row.error:+7.2%} "
                  f"{without:+8.2%}")
        key = (series_of(row.source_id, row.row_id), row.gpu, row.dtype)
        series.setdefault(key, []).append((row.gpus, row.error, without))
    print(f"\n{'series':14s} {'GPU':9s} {'dtype':5s} {'rows':>4s} {'slope/doubling':>14s} "
          f"{'no amax':>8s} {'mean error':>10s} {'no amax':>8s}")
    for (name, gpu, dtype), points in sorted(series.items()):
        gpus = [n for n, _, _ in points]
        if len(set(gpus)) < 3:
            continue
        with_op = [e for _, e, _ in points]
        bare = [b for _, _, b in points]
        print(f"{name:14s} {gpu:9s} {dtype:5s} {len(points):4d} "
              f"{slope_per_doubling(gpus, with_op):+14.2%} {slope_per_doubling(gpus, bare):+8.2%} "
              f"{np.mean(with_op):+10.2%} {np.mean(bare):+8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
