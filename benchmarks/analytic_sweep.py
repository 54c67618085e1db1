"""Sweep benchmark: how fast the analytic fidelity evaluates many plans.

Enumerates a grid of training-step configurations (models x GPU counts x tp x pp x
micro-batch x ZeRO stage x recompute x schedule), keeps those the plan checker
accepts, and evaluates the step time of the first ``--configs`` of them at
``analytic`` fidelity with one shared :class:`sim.analytic_step.PricingCache` (as a
planner or a sweep would). Memory is reported but not enforced, so every
configuration is priced in full. Prints, on the same plans: CPU seconds, ms per
configuration and plans per CPU-second of the batch evaluator a plan search ranks with
(:class:`sim.analytic_batch.BatchStepEvaluator`: step times only; first from cold
prices, in a fresh process, then again from warm prices) and of ``simulate_step``
building a full result per plan (the figure before the batch evaluator; run last, with
its own PricingCache); how many plans would not fit in HBM, how many the batch evaluator
covers itself (the others go through analytic_step) and how many of its step times
differ from simulate_step's (0).

Usage::

    python benchmarks/analytic_sweep.py              # 10,000 configurations
    python benchmarks/analytic_sweep.py --configs 2000
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware.catalog import load_cluster  # noqa: E402
from sim.analytic_batch import BatchStepEvaluator  # noqa: E402
from sim.analytic_step import PricingCache  # noqa: E402
from trainsim.api import make_plan  # noqa: E402
from sim.step import simulate_step  # noqa: E402
from strategies.models import load_model  # noqa: E402
from strategies.plan import validate_plan  # noqa: E402

MODELS = ("llama3-8b", "llama3-70b", "gpt3-175b", "llama3-405b", "mixtral-8x7b")
GPUS = (64, 256, 1024, 4096, 16384)
GRID = dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16), micro_batch=(1, 2, 4), zero=(1, 2, 3),
            recompute=("none", "selective", "full"), schedule=("1f1b", "interleaved", "zb-h1"))


def configurations(cluster):
    """Valid (model spec, plan) pairs of the grid, in a fixed order."""
    specs = {name: load_model(name) for name in MODELS}
    keys = list(GRID)
    for name, gpus in itertools.product(MODELS, GPUS):
        spec = specs[name]
        for values in itertools.product(*GRID.values()):
            fields = dict(zip(keys, values))
            if fields["schedule"] == "interleaved":
                fields["vpp"] = 2
            if fields["pp"] == 1 and fields["schedule"] != "1f1b":
                continue
            tp_pp = fields["tp"] * fields["pp"]
            if gpus % tp_pp:
                continue
            dp = gpus // tp_pp
            fields["global_batch"] = max(dp * fields["micro_batch"] * 8, 512)
            fields["global_batch"] -= fields["global_batch"] % (dp * fields["micro_batch"])
            try:
                plan = make_plan(gpus=gpus, seq_len=4096, **fields)
                validate_plan(plan, num_layers=spec.num_layers, num_heads=spec.num_heads,
                              num_kv_heads=spec.num_kv_heads,
                              num_experts=spec.moe.num_experts if spec.moe else 0, gpus=gpus,
                              cluster_gpus=cluster.max_nodes * cluster.gpus_per_node)
            except ValueError:
                continue
            yield spec, plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=int, default=10_000)
    args = parser.parse_args(argv)
    cluster = load_cluster("dgx-h100")
    chosen = list(itertools.islice(configurations(cluster), args.configs))
    by_model: dict = {}
    for spec, plan in chosen:
        by_model.setdefault(spec.name, [spec, [], None])[1].append(plan)
    # the batch evaluator first, in a fresh process (cold prices), then again (warm)
    batch_s, covered, batch_steps = [], 0, {}
    for warm in (False, True):
        start = time.process_time()
        for name, entry in by_model.items():
            spec, plans = entry[0], entry[1]
            if not warm:
                entry[2] = BatchStepEvaluator(spec, cluster)
            steps = entry[2].step_ns(plans)
            batch_steps.update(zip(((name, plan) for plan in plans), steps))
            if not warm:
                covered += entry[2].counts["batch"]
        batch_s.append(time.process_time() - start)
    cache = PricingCache()
    start = time.process_time()
    too_big = mismatched = 0
    for spec, plan in chosen:
        result = simulate_step(spec, cluster, plan, fidelity="analytic", check_memory=False,
                               cache=cache)
        too_big += result.peak_memory_bytes > cluster.gpu.hbm_bytes
        mismatched += batch_steps[(spec.name, plan)] / 1e9 != result.step_time_s
    full_s = time.process_time() - start
    n = len(chosen)
    print(f"{'evaluator':<32s} {'configs':>8s} {'cpu_s':>8s} {'ms_per_config':>14s} "
          f"{'plans_per_cpu_s':>16s}")
    for label, seconds in (("simulate_step (full result)", full_s),
                           ("batch evaluator, cold prices", batch_s[0]),
                           ("batch evaluator, warm prices", batch_s[1])):
        print(f"{label:<32s} {n:8d} {seconds:8.2f} {seconds / n * 1e3:14.3f} "
              f"{n / seconds:16,.0f}")
    print(f"out of memory: {too_big}; batch evaluator covers {covered} of {n} "
          f"({covered / n:.0%}; the others through analytic_step); step times unlike "
          f"simulate_step's: {mismatched}")

if __name__ == "__main__":
    main()
