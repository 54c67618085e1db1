"""Benchmark: wall time to simulate one training step.

Prints one line per case: model, GPUs, plan, simulated step time and MFU, ops
in the (symmetry-reduced) program, wall seconds, peak RSS. The issue-3 target
is the first case: one step of llama3-70b on 1,024 GPUs of dgx-h100 (tp 8,
pp 4, dp 32) in under 10 s on a 2-core machine.

Usage: python benchmarks/step_scale.py [--fidelity analytic|flow]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from hardware.catalog import load_cluster
from sim.step import simulate_step
from strategies.models import load_model
from strategies.plan import ParallelPlan

CASES = [
    ("llama3-70b", "dgx-h100", dict(tp=8, pp=4, dp=32, global_batch=1024, seq_len=8192)),
    ("llama3-8b", "dgx-h100", dict(tp=1, pp=1, dp=64, global_batch=512, seq_len=8192,
                                   zero=3)),
    ("gpt3-175b", "dgx-a100", dict(tp=8, pp=16, dp=8, global_batch=1536, seq_len=2048,
                                   recompute="full")),
    ("mixtral-8x7b", "dgx-h100", dict(tp=2, pp=4, dp=16, ep=8, global_batch=512,
                                      seq_len=4096, recompute="full")),
]


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", default="analytic")
    args = parser.parse_args(argv)
    print(f"# one training step per line; fidelity {args.fidelity}; python "
          f"{sys.version.split()[0]}")
    print(f"{'model':>13} {'cluster':>9} {'gpus':>5} {'tp':>3} {'pp':>3} {'dp':>4} {'ep':>3} "
          f"{'mbs':>4} {'step_s':>8} {'mfu':>6} {'ops':>9} {'wall_s':>7} {'peak_rss_MiB':>12}")
    for model_name, cluster_name, fields in CASES:
        plan = ParallelPlan(**fields)
        start = time.perf_counter()
        result = simulate_step(load_model(model_name), load_cluster(cluster_name), plan,
                               fidelity=args.fidelity)
        wall = time.perf_counter() - start
        ops = result.lowering.program.num_ops()
        print(f"{model_name:>13} {cluster_name:>9} {plan.world_size:>5} {plan.tp:>3} "
              f"{plan.pp:>3} {plan.dp:>4} {plan.ep:>3} {plan.num_microbatches:>4} "
              f"{result.step_time_s:>8.3f} {result.mfu:>6.1%} {ops:>9} {wall:>7.2f} "
              f"{peak_rss_mib():>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
