"""Sweep benchmark: how fast the analytic fidelity evaluates many plans.

Enumerates a grid of training-step configurations (models x GPU counts x tp x pp x
micro-batch x ZeRO stage x recompute x schedule), keeps those the plan checker
accepts, and evaluates the step time of the first ``--configs`` of them at
``analytic`` fidelity with one shared :class:`sim.analytic_step.PricingCache` (as a
planner or a sweep would). Memory is reported but not enforced, so every
configuration is priced in full. Prints a table: configurations, wall time, ms
per configuration, and how many would not fit in HBM.

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
    cache = PricingCache()
    chosen = list(itertools.islice(configurations(cluster), args.configs))
    start = time.perf_counter()
    too_big = 0
    for spec, plan in chosen:
        result = simulate_step(spec, cluster, plan, fidelity="analytic", check_memory=False,
                               cache=cache)
        too_big += result.peak_memory_bytes > cluster.gpu.hbm_bytes
    wall_s = time.perf_counter() - start
    print(f"{'configs':>8s} {'wall_s':>8s} {'ms_per_config':>14s} {'out_of_memory':>14s}")
    print(f"{len(chosen):8d} {wall_s:8.2f} {wall_s / len(chosen) * 1e3:14.2f} {too_big:14d}")


if __name__ == "__main__":
    main()
