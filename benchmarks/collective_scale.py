"""Benchmark: wall time to simulate one large all-reduce as the job grows.

Prints one line per (GPUs, fidelity): wall seconds, simulated time, busbw,
flows and max-min rate solves, peak RSS. The issue-2 target is the last line
family: a 16 GiB all-reduce over 1,024 GPUs (128 nodes x 8) at flow fidelity in
under 5 s on a 2-core machine.

Usage: python benchmarks/collective_scale.py [--cluster dgx-h100] [--size 16GiB]
       [--max-nodes 128]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from hardware.catalog import load_cluster
from hardware.units import parse_size_bytes
from sim.collective_bench import collective_sweep


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="dgx-h100")
    parser.add_argument("--size", default="16GiB")
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--max-nodes", type=int, default=128)
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    size = parse_size_bytes(args.size, field="size")
    print(f"# {args.op} of {size} bytes on {args.cluster}; python {sys.version.split()[0]}")
    header = (f"{'gpus':>6} {'nodes':>5} {'fidelity':>8} {'wall_s':>8} {'sim_time_us':>12} "
              f"{'busbw_GBps':>10} {'algorithm':>10} {'peak_rss_MiB':>12}")
    print(header)
    nodes = 1
    while nodes <= args.max_nodes:
        for fidelity in ("analytic", "flow"):
            start = time.perf_counter()
            df = collective_sweep(args.op, cluster, nodes=nodes,
                                  gpus_per_node=cluster.gpus_per_node, sizes=[size],
                                  fidelity=fidelity)
            wall = time.perf_counter() - start
            row = df.iloc[0]
            print(f"{nodes * cluster.gpus_per_node:>6} {nodes:>5} {fidelity:>8} {wall:>8.3f} "
                  f"{row.time_us:>12.1f} {row.busbw_GBps:>10.2f} "
                  f"{row.algorithm + '/' + row.protocol:>10} {peak_rss_mib():>12.1f}",
                  flush=True)
        nodes *= 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
