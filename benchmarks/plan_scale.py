"""Benchmark: `trainsim plan` for llama3-70b on 1,024 H100s (issue 7: >= 10 ranked plans in
<= 60 s on a 2-core machine). Prints a table of wall time, plan counts and the top plans.

    python benchmarks/plan_scale.py [--gpus 1024] [--model llama3-70b]
"""

from __future__ import annotations

import argparse
import time

from trainsim import planner


def main() -> None:
    """Run the search once and print wall time, counts and the ranked plans."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--cluster", default="dgx-h100")
    parser.add_argument("--gpus", type=int, default=1024)
    args = parser.parse_args()
    start = time.perf_counter()
    report = planner.search(args.model, cluster=args.cluster, gpus=args.gpus)
    wall_s = time.perf_counter() - start
    print(f"{args.model} on {args.gpus} GPUs of {args.cluster}: {wall_s:.1f} s wall, "
          f"{len(report.plans)} ranked plans, fidelity {report.inputs['final_fidelity']}")
    print("  ".join(f"{k}={v}" for k, v in report.counts.items()))
    print(report.to_frame()[["rank", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "zero",
                             "recompute", "schedule", "step_time_s", "mfu",
                             "peak_memory_GiB"]].to_string(index=False))


if __name__ == "__main__":
    main()
