"""Benchmark: every figure of issue 16 ("Speed") in one table: target, measured, load.

Each figure runs in its own subprocess (fresh caches, its own peak RSS) with a time
limit, so one that takes minutes shows as "> limit" instead of stalling the table.
The machine is shared and timings are noisy: the load average is printed before and
after each figure, and ratios should be taken from one run.

Figures:

* ``analytic_gpt3``: plans/s of the closed-form step (``fidelity="analytic"``) on 400
  GPT-3-175B plans on 1,024 A100s (tp, pp, micro-batch, recompute, interleaving
  varied), one shared :class:`sim.analytic_step.PricingCache`, one core. Target >= 2,000.
  The figure is the step times of the batch evaluator a plan search ranks with
  (:class:`sim.analytic_batch.BatchStepEvaluator`, cold prices); the detail says how
  many plans it covers (the others go through analytic_step), its rate again from warm
  prices, and the rate of ``simulate_step`` building a full result per plan (the
  figure before the batch evaluator).
* ``analytic_llama``: the same for llama3-70b on 1,024 H100s.
* ``plan_70b``: ``trainsim plan`` for llama3-70b on 1,024 H100s, default space. <= 3 s.
* ``plan_405b``: llama3-405b on 16,384 H100s over a space with cp 1/2/4, vpp up to 8
  and selective recompute. <= 10 s.
* ``event_405b`` / ``flow_405b``: one step of llama3-405b on 16,384 H100s (tp 8, pp 16,
  cp 1) at event (<= 1.5 s, <= 500 MiB) and flow fidelity (<= 5 s).
* ``flow_allreduce``: a 16 GiB all-reduce over 128 H100 nodes at flow fidelity. <= 3 s.
* ``alltoall_gb200`` / ``sendrecv_b200``: one 1 GiB collective over 2,048 nodes at
  analytic fidelity (16k+ ranks). <= 1 s.

Usage::

    PYTHONPATH=. python benchmarks/speed.py                  # every figure
    PYTHONPATH=. python benchmarks/speed.py --only analytic_gpt3 analytic_llama
    PYTHONPATH=. python benchmarks/speed.py --timeout 120 --memory-gib 4
    python benchmarks/speed.py --root /path/to/other/checkout   # "before" figures
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: Code run in the subprocess per figure; it prints one JSON line {"value": ..., ...}.
_PRELUDE = """
import json, resource, time, itertools
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def cpu_s():
    # CPU seconds of this process and its finished children (worker pools)
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
"""

_ANALYTIC = """
from hardware.catalog import load_cluster
from sim.analytic_step import PricingCache
from sim.step import simulate_step
from strategies.models import load_model
from trainsim.api import make_plan
from strategies.plan import validate_plan
model, cluster, gpus = load_model({model!r}), load_cluster({cluster!r}), 1024
plans = []
for tp, pp, mb, rc, sched in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8),
                                               ("none", "selective", "full"),
                                               ("1f1b", "interleaved")):
    if sched == "interleaved" and pp == 1:
        continue
    fields = dict(tp=tp, pp=pp, micro_batch=mb, recompute=rc, schedule=sched,
                  vpp=2 if sched == "interleaved" else 1, global_batch=1536, seq_len=2048)
    try:
        plan = make_plan(gpus=gpus, **fields)
        validate_plan(plan, num_layers=model.num_layers, num_heads=model.num_heads,
                      num_kv_heads=model.num_kv_heads, num_experts=0, gpus=gpus,
                      cluster_gpus=cluster.max_nodes * cluster.gpus_per_node)
    except ValueError:
        continue
    plans.append(plan)
plans = plans[:400]
try:  # the batch evaluator of plan searches (a checkout from before has none)
    from sim.analytic_batch import BatchStepEvaluator
except ImportError:
    BatchStepEvaluator = None
batch = ""
if BatchStepEvaluator is not None:
    # step times of every plan from a cold cache (the figure), then again from warm
    # prices (what each plan past the distinct shapes costs)
    evaluator = BatchStepEvaluator(model, cluster)
    start, cpu0 = time.perf_counter(), cpu_s()
    evaluator.step_ns(plans)
    batch_wall, batch_cpu = time.perf_counter() - start, cpu_s() - cpu0
    covered = evaluator.counts["batch"]
    cpu0 = cpu_s()
    evaluator.step_ns(plans)
    warm_cpu = cpu_s() - cpu0
    batch = (f"batch evaluator: {{covered}}/{{len(plans)}} plans covered, warm "
             f"{{len(plans) / warm_cpu:,.0f}} plans/cpu-s; ")
cache = PricingCache()
start, cpu0 = time.perf_counter(), cpu_s()
for plan in plans:
    simulate_step(model, cluster, plan, fidelity="analytic", check_memory=False, cache=cache)
wall, cpu = time.perf_counter() - start, cpu_s() - cpu0
full = f"simulate_step (full result per plan) {{len(plans) / cpu:,.0f}} plans/cpu-s; "
if BatchStepEvaluator is not None:
    wall, cpu = batch_wall, batch_cpu
# plans whose action counts come from the schedule's closed form (no action lists:
# PipelineSchedule.action_counts); the others (F&B pairs) count their lists
from strategies.schedules import get_schedule
# (a checkout from before the closed-form counts builds lists for every plan)
closed = sum(1 for plan in plans if not (
    plan.moe_a2a_overlap or getattr(get_schedule(plan.schedule), "pairs_own_actions", True)))
print(json.dumps(dict(value=len(plans) / wall, unit="plans/s", wall_s=wall, cpu_s=cpu,
                      detail=batch + full + f"{{len(plans)}} plans, {{closed}} without "
                             "action lists", rss=rss_mib())))
"""

_PLAN = """
from trainsim import planner
space = {space}
done = []
start, cpu0 = time.perf_counter(), cpu_s()
# the wall clock at each phase's first report: ranking ends where confirming starts
report = planner.search({model!r}, cluster="dgx-h100", gpus={gpus}, space=space,
                        progress=lambda phase, d, t: done.append((phase, d, t,
                                                                  time.perf_counter())))
end = time.perf_counter()
wall, cpu = end - start, cpu_s() - cpu0
last = done[-1] if done else ("-", 0, 0, end)
confirm = next((row[3] for row in done if row[0].startswith("confirming")), end)
print(json.dumps(dict(value=wall, unit="s", wall_s=wall, cpu_s=cpu, rss=rss_mib(),
                      detail=f"{{report.counts['enumerated']}} enumerated, "
                             f"{{report.counts['examined']}} examined; ranking "
                             f"{{confirm - start:.2f}} s, confirming "
                             f"{{report.counts['final_simulated']}} {{end - confirm:.2f}} s; "
                             f"progress {{last[1]}}/{{last[2]}}")))
"""

_STEP = """
from sim.step import simulate_step
from trainsim.api import make_plan
from strategies.models import load_model
from hardware.catalog import load_cluster
plan = make_plan(gpus=16384, tp=8, pp=16, cp=1, micro_batch=1, seq_len=8192,
                 global_batch=2048, schedule="interleaved", vpp=2)
start, cpu0 = time.perf_counter(), cpu_s()
result = simulate_step(load_model("llama3-405b"), load_cluster("dgx-h100"), plan,
                       fidelity={fidelity!r}, check_memory=False)
wall, cpu = time.perf_counter() - start, cpu_s() - cpu0
print(json.dumps(dict(value=wall, unit="s", wall_s=wall, cpu_s=cpu, rss=rss_mib(),
                      detail=f"step {{result.step_time_s:.3f}} s")))
"""

_COLLECTIVE = """
from hardware.catalog import load_cluster
from sim.collective_bench import collective_sweep
cluster = load_cluster({cluster!r})
start, cpu0 = time.perf_counter(), cpu_s()
rows = collective_sweep({kind!r}, cluster, nodes={nodes}, gpus_per_node=cluster.gpus_per_node,
                        sizes=[{size}], fidelity={fidelity!r})
wall, cpu = time.perf_counter() - start, cpu_s() - cpu0
print(json.dumps(dict(value=wall, unit="s", wall_s=wall, cpu_s=cpu, rss=rss_mib(),
                      detail=f"{{len(rows)}} rows, {{cluster.gpus_per_node * {nodes}}} ranks")))
"""

_SPACE_405B = ("planner.SearchSpace(cp=(1, 2, 4), vpp=(2, 4, 8), "
               "recompute=('none', 'selective', 'full'))")

#: name -> (target text, test of the value, code)
FIGURES = {
    "analytic_gpt3": (">= 2000 plans/s", lambda v: v >= 2000,
                      _ANALYTIC.format(model="gpt3-175b", cluster="dgx-a100")),
    "analytic_llama": (">= 2000 plans/s", lambda v: v >= 2000,
                       _ANALYTIC.format(model="llama3-70b", cluster="dgx-h100")),
    "plan_70b": ("<= 3 s", lambda v: v <= 3,
                 _PLAN.format(model="llama3-70b", gpus=1024, space="None")),
    "plan_405b": ("<= 10 s", lambda v: v <= 10,
                  _PLAN.format(model="llama3-405b", gpus=16384, space=_SPACE_405B)),
    "event_405b": ("<= 1.5 s, <= 500 MiB", lambda v: v <= 1.5,
                   _STEP.format(fidelity="event")),
    "flow_405b": ("<= 5 s", lambda v: v <= 5, _STEP.format(fidelity="flow")),
    "flow_allreduce": ("<= 3 s", lambda v: v <= 3,
                       _COLLECTIVE.format(cluster="dgx-h100", kind="all_reduce", nodes=128,
                                          size=16 << 30, fidelity="flow")),
    "alltoall_gb200": ("<= 1 s", lambda v: v <= 1,
                       _COLLECTIVE.format(cluster="gb200-nvl72", kind="alltoall", nodes=2048,
                                          size=1 << 30, fidelity="analytic")),
    "sendrecv_b200": ("<= 1 s", lambda v: v <= 1,
                      _COLLECTIVE.format(cluster="dgx-b200", kind="sendrecv", nodes=2048,
                                         size=1 << 30, fidelity="analytic")),
}


def load() -> str:
    """The 1-minute load average and the core count, as text."""
    return f"{os.getloadavg()[0]:.2f}/{os.cpu_count()}"


def run(name: str, timeout_s: float, root: str, memory_gib: float) -> dict:
    """Run one figure in a subprocess (address space capped at ``memory_gib``, so a
    figure that would exhaust the shared machine fails instead); its JSON line, or a
    row saying why there is none."""
    import resource

    target, _, code = FIGURES[name]
    before = load()
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=root)
    limit = int(memory_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        done = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True,
                              text=True, timeout=timeout_s, cwd=root, env=env,
                              preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return dict(name=name, target=target, measured=f"> {timeout_s:.0f} s", met="no",
                    rss="-", detail="time limit", load=f"{before} -> {load()}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return dict(name=name, target=target, measured="error", met="no", rss="-",
                    detail=last[:70], load=f"{before} -> {load()}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    value = row["value"]
    measured = (f"{value:,.0f} {row['unit']}" if row["unit"] == "plans/s"
                else f"{value:.2f} {row['unit']}")
    # CPU seconds (this process and its workers) move less with the machine's load
    # than wall time: the figure to compare two checkouts by on a shared machine
    cpu = row.get("cpu_s")
    per_cpu = (f"{len_plans(row) / cpu:,.0f} plans/cpu-s" if row["unit"] == "plans/s" and cpu
               else f"{cpu:.2f}" if cpu is not None else "-")
    return dict(name=name, target=target, measured=measured, cpu=per_cpu,
                met="yes" if FIGURES[name][1](value) else "no", rss=f"{row['rss']:.0f}",
                detail=row["detail"], load=f"{before} -> {load()}",
                wall=time.perf_counter() - start)


def len_plans(row: dict) -> float:
    """Plans a plans/s figure evaluated (its value times its wall time)."""
    return row["value"] * row["wall_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(FIGURES), default=None)
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds per figure before it is reported as '> limit'")
    parser.add_argument("--memory-gib", type=float, default=6.0,
                        help="address-space cap of each figure's process")
    parser.add_argument("--root", default=os.getcwd(),
                        help="checkout to measure (PYTHONPATH of the subprocesses)")
    args = parser.parse_args(argv)
    names = args.only or list(FIGURES)
    print(f"# {args.root}; python {sys.version.split()[0]}; load avg (1 min)/cores")
    print(f"{'figure':<16} {'target':<22} {'measured':>16} {'met':>4} {'cpu_s':>18} "
          f"{'rss_MiB':>8} {'load before -> after':>22}  detail")
    for name in names:
        row = run(name, args.timeout, args.root, args.memory_gib)
        print(f"{row['name']:<16} {row['target']:<22} {row['measured']:>16} {row['met']:>4} "
              f"{row.get('cpu', '-'):>18} {row['rss']:>8} {row['load']:>22}  {row['detail']}",
              flush=True)


if __name__ == "__main__":
    main()
