"""Simulate one training step and report where its time goes.

``simulate_step`` checks the plan, checks memory (a plan that does not fit
raises :class:`strategies.memory.OutOfMemoryError` with the breakdown), lowers
the step to a Program, replays it and measures the timeline.

Breakdown of the step time of the critical rank (the pipeline rank whose
timeline ends last), in seconds, attributed in this order so nothing is
counted twice:

* ``compute``: time the GPU runs kernels of the model (forward, backward,
  recompute), excluding the optimizer;
* ``optimizer``: the optimizer step;
* ``exposed_<axis>``: time communication of that axis (tp, cp, ep, pp, dp)
  runs while no kernel does, and no axis listed before it communicates;
* ``bubble``: the rest: idle time waiting for other pipeline stages.

Parameter-server plans (``plan.dp_mode`` not ``allreduce``; strategies.param_server)
simulate ``plan.ps_steps`` steps in one full Program on a layout with the servers (extra
nodes when dedicated: :func:`ps_job_layout`). Their step time is the steady-state step
interval: with ``E(t)`` the time at which the last worker holds the parameters of step t
(its last pull of step t, or its own shard's update when it hosts one, has completed),
``(E(T-1) - E(0)) / (T-1)`` for T >= 2 steps, and ``E(0)`` (one whole iteration: compute,
push, update, pull) for T = 1. Give T well above ``staleness + 1`` for ``ps-stale`` to
reach its steady state. The breakdown is that of the critical worker (largest
``E(T-1)``), attributed for the steady state: ``compute`` and ``optimizer`` (updates of a
server shard it hosts, where they do not overlap its kernels) are its per-step averages
over the run, ``exposed_dp`` the rest of the step interval (a worker only ever waits for
its pulls), other axes and ``bubble`` 0; it sums to the step time (unless a run too short
for a steady state gives an interval below the compute time: then ``exposed_dp`` is 0).
MFU counts the workers' GPUs only (``ps.gpus_total`` adds the dedicated servers'). The
result's ``ps`` entry has the mode, servers, their ranks and memory, ``E(t)``, the
makespan and the servers' busy time per step.

MFU follows PaLM (Chowdhery et al. 2022, appendix B): model FLOPs per token
``6 N + 12 L h s`` (no recompute) times tokens per second, over the GPUs'
dense bf16 peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from hardware.catalog import cluster_to_dict
from hardware.compute import ComputeModel
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.engine import ComputeTimer, Engine
from sim.timeline import Timeline
from strategies import model_costs
from strategies.lowering import StepLowering, lower_step
from strategies.memory import MemoryBreakdown, OutOfMemoryError, check_fits, rank_memory
from strategies.model_spec import ModelSpec
from strategies.param_server import (PSLowering, colocated_memory, lower_ps_step, num_servers,
                                     ps_world_size, server_memory, server_nodes,
                                     worker_memory)
from strategies.pipeline import max_inflight_microbatches
from strategies.plan import ParallelPlan, validate_plan

AXES_IN_ORDER = ("tp", "cp", "ep", "pp", "dp")


@dataclass
class StepResult:
    """A simulated training step.

    Attributes:
        step_time_s: wall time of one step.
        tokens_per_s: global tokens per second.
        tflops_per_gpu: model TFLOP/s per GPU (1e12 FLOP/s).
        mfu: model FLOPs utilisation of the dense bf16 peak.
        peak_memory_bytes: largest per-rank memory.
        memory: per pipeline rank, the memory breakdown.
        breakdown: seconds per category of the critical rank.
        stage_breakdown: the same for every pipeline rank.
        inputs: resolved model, cluster, plan and fidelity.
        timeline: spans of the simulated representatives.
        lowering: the lowered step (program, layout, schedule actions).
        ps: parameter-server details (None for all-reduce data parallelism): mode,
            servers, placement, server ranks, steps, staleness, GPUs and nodes in all,
            ``step_ends_s`` (E(t), module docstring), makespan, server memory and
            server shard 0's busy seconds per step (aggregation, updates).
    """

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: int
    memory: dict[int, MemoryBreakdown]
    breakdown: dict[str, float]
    stage_breakdown: dict[int, dict[str, float]]
    inputs: dict[str, object]
    timeline: Timeline = field(repr=False)
    lowering: StepLowering = field(repr=False)
    ps: dict[str, object] | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary (no timeline)."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory": {f"pp{p}": m.to_dict() for p, m in self.memory.items()},
            "breakdown": dict(self.breakdown),
            "stage_breakdown": {f"pp{p}": b for p, b in self.stage_breakdown.items()},
            "inputs": self.inputs,
            **({"ps": self.ps} if self.ps is not None else {}),
        }

    def breakdown_frame(self) -> pd.DataFrame:
        """Seconds per category (columns) for every pipeline rank (rows)."""
        return pd.DataFrame.from_dict(self.stage_breakdown, orient="index").rename_axis("pp")

    def memory_frame(self) -> pd.DataFrame:
        """Memory breakdown in bytes per pipeline rank."""
        return pd.DataFrame({p: m.to_dict() for p, m in self.memory.items()}).T.rename_axis("pp")

    def timeline_frame(self) -> pd.DataFrame:
        """Every simulated span."""
        return self.timeline.to_dataframe()

    def write_trace(self, path: str, gpus_per_node: int) -> None:
        """Chrome/Perfetto trace of the step: process = node, thread = rank and stream."""
        self.timeline.write_chrome_trace(path, process_of=lambda rank: rank // gpus_per_node,
                                         process_label="node")


def job_layout(cluster: ClusterSpec, gpus: int) -> ClusterLayout:
    """Place ``gpus`` ranks on whole nodes of ``cluster`` (fewer than a node: one node).

    Raises:
        ValueError: if ``gpus`` is not a whole number of nodes, or exceeds the cluster.
    """
    per_node = cluster.gpus_per_node
    if gpus < per_node:
        return ClusterLayout(cluster, 1, gpus)
    if gpus % per_node:
        raise ValueError(f"gpus: {gpus} is not a whole number of {per_node}-GPU nodes of "
                         f"{cluster.name!r}; give a multiple of {per_node}")
    return ClusterLayout(cluster, gpus // per_node, per_node)


def ps_job_layout(cluster: ClusterSpec, plan: ParallelPlan) -> tuple[ClusterLayout, int]:
    """Layout of a parameter-server job and its number of server shards.

    Workers fill whole nodes as :func:`job_layout` places them; dedicated servers take the
    GPU slots of extra nodes after them (as many slots per node as the workers use).

    Raises:
        ValueError: when the workers do not fill whole nodes, or the servers' nodes do not
            fit the cluster.
    """
    workers = job_layout(cluster, plan.world_size)
    servers = num_servers(plan, workers.nodes)
    if plan.ps_placement == "colocated":
        return workers, servers
    extra = server_nodes(servers, workers.gpus_per_node)
    nodes = workers.nodes + extra
    if nodes > cluster.max_nodes:
        raise ValueError(f"ps_servers: {servers} dedicated servers need {extra} more "
                         f"{workers.gpus_per_node}-GPU node(s), {nodes} in all, but cluster "
                         f"{cluster.name!r} has {cluster.max_nodes}; give fewer servers or "
                         "ps_placement 'colocated'")
    return ClusterLayout(cluster, nodes, workers.gpus_per_node), servers


def stage_memory(model: ModelSpec, plan: ParallelPlan, lowering: StepLowering
                 ) -> dict[int, MemoryBreakdown]:
    """Peak memory of every pipeline rank under the plan's schedule."""
    inflight = max_inflight_microbatches(list(map(list, lowering.actions)))
    stages = len(lowering.stage_layers)
    result = {}
    for p in range(plan.pp):
        layers = [layer for s in range(p, stages, plan.pp) for layer in lowering.stage_layers[s]]
        result[p] = rank_memory(model, plan, layers=layers, has_embedding=p == 0,
                                has_head=(stages - 1) % plan.pp == p,
                                inflight_microbatches=inflight[p])
    return result


def simulate_step(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                  gpus: int | None = None, fidelity: str = "analytic",
                  check_memory: bool = True, compute: ComputeTimer | None = None) -> StepResult:
    """Simulate one training step of ``model`` on ``cluster`` under ``plan``.

    Args:
        model: the model.
        cluster: the cluster preset.
        plan: the parallel plan.
        gpus: GPUs asked for (must equal dp*tp*pp*cp); default: the plan's.
        fidelity: network fidelity, ``analytic`` or ``flow``.
        check_memory: raise OutOfMemoryError when a rank does not fit HBM.
        compute: prices compute ops (default: the roofline model of the
            cluster's GPU).

    Raises:
        ValueError: for an invalid plan (one line naming the field).
        OutOfMemoryError: when a rank needs more than the GPU's HBM.
    """
    validate_plan(plan, num_layers=model.num_layers, num_heads=model.num_heads,
                  num_kv_heads=model.num_kv_heads,
                  num_experts=model.moe.num_experts if model.moe else 0,
                  gpus=plan.world_size if gpus is None else gpus,
                  cluster_gpus=cluster.max_nodes * cluster.gpus_per_node)
    if plan.dp_mode != "allreduce":
        return _simulate_ps(model, cluster, plan, fidelity=fidelity, check_memory=check_memory,
                            compute=compute)
    layout = job_layout(cluster, plan.world_size)
    lowering = lower_step(model, plan)
    memory = stage_memory(model, plan, lowering)
    if check_memory:
        for p, breakdown in memory.items():
            check_fits(breakdown, cluster.gpu.hbm_bytes, lowering.representatives[p], plan=plan)
    # The lowering builds valid programs by construction (tests check them
    # with strategies.program_check); skipping the check saves ~10 % here.
    engine = Engine(lowering.program, layout, fidelity=fidelity,
                    compute=compute or ComputeModel(cluster.gpu), check=False)
    result = engine.run()
    timeline = result.timeline
    step_ns = result.makespan_ns
    by_rank = _breakdowns(timeline, lowering.representatives, step_ns)
    stage_breakdown = {p: by_rank[rank] for p, rank in enumerate(lowering.representatives)}
    ends = timeline.end_ns_by_rank()
    critical = max(range(plan.pp), key=lambda p: (ends.get(lowering.representatives[p], 0), -p))
    step_s = step_ns / 1e9
    tokens = plan.global_batch * plan.seq_len
    flops = model_costs.model_flops_per_token(model, plan.seq_len) * tokens
    tflops_per_gpu = flops / step_s / plan.world_size / 1e12 if step_s > 0 else math.inf
    return StepResult(
        step_time_s=step_s,
        tokens_per_s=tokens / step_s if step_s > 0 else math.inf,
        tflops_per_gpu=tflops_per_gpu,
        mfu=tflops_per_gpu * 1e12 / cluster.gpu.peak_flops_per_s["bf16"],
        peak_memory_bytes=int(max(m.total_bytes for m in memory.values())),
        memory=memory,
        breakdown=stage_breakdown[critical],
        stage_breakdown=stage_breakdown,
        inputs={"model": model.name, "cluster": cluster_to_dict(cluster),
                "plan": _plan_dict(plan), "gpus": plan.world_size, "fidelity": fidelity,
                "nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node,
                "plans_chosen": _count_plans(result.plans)},
        timeline=timeline,
        lowering=lowering,
    )


def _simulate_ps(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, fidelity: str,
                 check_memory: bool, compute: ComputeTimer | None) -> StepResult:
    """A parameter-server plan (module docstring)."""
    layout, servers = ps_job_layout(cluster, plan)
    lowering = lower_ps_step(model, plan, servers=servers)
    inflight = max_inflight_microbatches(list(map(list, lowering.actions)))[0]
    worker = worker_memory(model, plan, inflight_microbatches=inflight)
    server = server_memory(plan, lowering)
    host = colocated_memory(worker, server) if plan.ps_placement == "colocated" else None
    hbm = cluster.gpu.hbm_bytes
    if check_memory:
        _check_ps_fits(plan, servers, host or server, hbm, lowering.server_ranks[0],
                       server=True)
        _check_ps_fits(plan, servers, worker, hbm, 0, server=False)
    engine = Engine(lowering.program, layout, fidelity=fidelity,
                    compute=compute or ComputeModel(cluster.gpu), check=False)
    result = engine.run()
    timeline = result.timeline
    steps = lowering.steps
    worker_ends = ps_step_ends(timeline, lowering)
    ends = [max(e[t] for e in worker_ends.values()) for t in range(steps)]
    step_s = (ends[0] if steps == 1 else (ends[-1] - ends[0]) / (steps - 1)) / 1e9
    critical = max(lowering.worker_ranks, key=lambda r: (worker_ends[r][-1], -r))
    whole = _breakdowns(timeline, [critical], result.makespan_ns)[critical]
    compute_s = whole["compute"] / steps
    optimizer_s = whole["optimizer"] / steps
    breakdown = {"compute": compute_s, "optimizer": optimizer_s,
                 **{f"exposed_{axis}": 0.0 for axis in AXES_IN_ORDER}, "bubble": 0.0}
    breakdown["exposed_dp"] = max(step_s - compute_s - optimizer_s, 0.0)
    busy = _server_busy_ns(timeline, lowering.server_ranks[0])
    tokens = plan.global_batch * plan.seq_len
    flops = model_costs.model_flops_per_token(model, plan.seq_len) * tokens
    tflops_per_gpu = flops / step_s / plan.world_size / 1e12 if step_s > 0 else math.inf
    ps = {"mode": plan.dp_mode, "servers": servers, "placement": plan.ps_placement,
          "server_ranks": list(lowering.server_ranks), "steps": steps,
          "staleness": lowering.staleness, "gpus_total": ps_world_size(plan, servers),
          "nodes": layout.nodes, "gradient_bytes_per_worker": lowering.gradient_bytes,
          "step_ends_s": [e / 1e9 for e in ends], "makespan_s": result.makespan_ns / 1e9,
          "critical_worker": critical, "server_memory": server.to_dict(),
          "host_memory": host.to_dict() if host is not None else None,
          "server_busy_s": {name: ns / steps / 1e9 for name, ns in busy.items()}}
    return StepResult(
        step_time_s=step_s,
        tokens_per_s=tokens / step_s if step_s > 0 else math.inf,
        tflops_per_gpu=tflops_per_gpu,
        mfu=tflops_per_gpu * 1e12 / cluster.gpu.peak_flops_per_s["bf16"],
        peak_memory_bytes=int(max(worker.total_bytes, (host or server).total_bytes)),
        memory={0: worker},
        breakdown=breakdown,
        stage_breakdown={0: breakdown},
        inputs={"model": model.name, "cluster": cluster_to_dict(cluster),
                "plan": _plan_dict(plan), "gpus": plan.world_size, "fidelity": fidelity,
                "nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node,
                "plans_chosen": _count_plans(result.plans)},
        timeline=timeline,
        lowering=lowering,
        ps=ps,
    )


def _check_ps_fits(plan: ParallelPlan, servers: int, breakdown: MemoryBreakdown,
                   capacity_bytes: float, rank: int, *, server: bool) -> None:
    """check_fits with remedies that exist for parameter-server plans (no ZeRO, tp, pp)."""
    if breakdown.total_bytes <= capacity_bytes:
        return
    tips = [f"ps_servers > {servers}"] if server else []
    if server and plan.ps_placement == "colocated":
        tips.append("ps_placement='dedicated'")
    if breakdown.activations_bytes > 0:
        if plan.recompute != "full":
            tips.append("recompute='full'")
        if plan.micro_batch > 1:
            tips.append(f"micro_batch={plan.micro_batch // 2}")
    if not server or plan.ps_placement == "colocated":
        tips.append("dp_mode='allreduce' with zero or tp/pp (a worker holds the whole model)")
    raise OutOfMemoryError(rank, breakdown, capacity_bytes, tips)


def _server_busy_ns(timeline: Timeline, rank: int) -> dict[str, int]:
    """Total ns the server ops (aggregation, updates) of ``rank`` run, over all streams."""
    df = timeline.to_dataframe()
    mine = df[(df["rank"] == rank) & df["op"].str.startswith("dp.server.")]
    kinds = mine["op"].str.split(".").str[2]
    return {name: int(mine["duration_ns"][kinds == name].sum())
            for name in ("aggregate", "update")}


def ps_step_ends(timeline: Timeline, lowering: PSLowering) -> dict[int, list[int]]:
    """``{worker rank: [time (ns) it holds the parameters of step t, for each t]}``: the end
    of the last of its ``lowering.ready`` ops of the step."""
    df = timeline.to_dataframe()
    df = df[df["rank"].isin(lowering.worker_ranks)]
    result = {}
    for rank, group in df.groupby("rank", sort=True):
        step_of = {name: t for t, names in enumerate(lowering.ready[int(rank)]) for name in names}
        steps = group["op"].map(step_of)
        known = steps.notna()
        last = group["end_ns"][known].groupby(steps[known]).max()
        result[int(rank)] = [int(last[t]) for t in range(lowering.steps)]
    return result


def _plan_dict(plan: ParallelPlan) -> dict[str, object]:
    data = dict(plan.__dict__)
    data["layers_per_stage"] = list(plan.layers_per_stage) if plan.layers_per_stage else None
    data["order"] = list(plan.order)
    data["num_microbatches"] = plan.num_microbatches
    return data


def _count_plans(plans: dict[str, str]) -> dict[str, int]:
    """How often each algorithm/protocol was chosen, per axis (for the report)."""
    counts: dict[str, int] = {}
    for key, label in plans.items():
        axis, kind, _ = key.split(".", 2)
        name = f"{axis}:{kind}:{label}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


# ----------------------------------------------------------------- breakdown
def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [start, end) as disjoint sorted intervals."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    opens = np.empty(starts.size, dtype=bool)
    opens[0] = True
    opens[1:] = starts[1:] > reach[:-1]
    firsts = np.flatnonzero(opens)
    return starts[firsts], np.maximum.reduceat(ends, firsts)


def _length(intervals: tuple[np.ndarray, np.ndarray]) -> int:
    return int((intervals[1] - intervals[0]).sum())


def _join(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    return _merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def _breakdowns(timeline: Timeline, ranks: Sequence[int], step_ns: int
                ) -> dict[int, dict[str, float]]:
    """Seconds of compute, optimizer, exposed comm per axis and bubble, per rank.

    Exposed time of an axis = |covered U axis| - |covered|, where covered is
    compute, optimizer and the axes attributed before it (AXES_IN_ORDER).
    """
    df = timeline.to_dataframe()
    comm = (df["category"] != "compute").to_numpy()
    axis = np.full(len(df), "", dtype=object)
    axis[comm] = [name.split(".", 1)[0] for name in df["op"].to_numpy()[comm]]
    result = {}
    for rank in ranks:
        mine = (df["rank"] == rank).to_numpy()
        starts = df["start_ns"].to_numpy()[mine]
        ends = df["end_ns"].to_numpy()[mine]
        category = df["category"].to_numpy()[mine]
        is_opt = (df["kind"].to_numpy()[mine] == "optimizer") & (category == "compute")
        is_compute = (category == "compute") & ~is_opt
        compute = _merge(starts[is_compute], ends[is_compute])
        covered = _join(compute, _merge(starts[is_opt], ends[is_opt]))
        row = {"compute": _length(compute) / 1e9,
               "optimizer": (_length(covered) - _length(compute)) / 1e9}
        rank_axis = axis[mine]
        for name in AXES_IN_ORDER:
            chosen = (category != "compute") & (rank_axis == name)
            joined = _join(covered, _merge(starts[chosen], ends[chosen]))
            row[f"exposed_{name}"] = (_length(joined) - _length(covered)) / 1e9
            covered = joined
        row["bubble"] = max(step_ns - _length(covered), 0) / 1e9
        result[rank] = row
    return result
