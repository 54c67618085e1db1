"""Simulate a parameter-server training step (strategies.param_server).

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

"""

from __future__ import annotations

from hardware.cost import ComputeTimer, CostModel
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.breakdown import AXES_IN_ORDER, rank_breakdowns
from sim.engine import Engine
from strategies.collectives.catalog import ALGORITHMS
from sim.step import StepResult, job_layout, resolved_inputs, throughput
from sim.timeline import Timeline
from strategies.memory import MemoryBreakdown, OutOfMemoryError, Remedy
from strategies.model_spec import ModelSpec
from strategies.param_server import (PSLowering, colocated_memory, lower_ps_step, num_servers,
                                     ps_world_size, server_memory, server_nodes,
                                     worker_memory)
from strategies.pipeline import max_inflight_microbatches
from strategies.plan import ParallelPlan


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


def simulate_ps_step(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, fidelity: str,
                 check_memory: bool, compute: ComputeTimer | None) -> StepResult:
    """Simulate a parameter-server plan (module docstring); called by
    :func:`sim.step.simulate_step` after the plan is validated.

    Raises:
        ValueError: when the servers do not fit the cluster.
        OutOfMemoryError: when a worker or server does not fit HBM.
    """
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
    engine = Engine(lowering.program,
                    CostModel(layout, ALGORITHMS, compute=compute, fidelity=fidelity),
                    check=False)
    result = engine.run()
    timeline = result.timeline
    steps = lowering.steps
    worker_ends = ps_step_ends(timeline, lowering)
    ends = [max(e[t] for e in worker_ends.values()) for t in range(steps)]
    step_s = (ends[0] if steps == 1 else (ends[-1] - ends[0]) / (steps - 1)) / 1e9
    critical = max(lowering.worker_ranks, key=lambda r: (worker_ends[r][-1], -r))
    whole = rank_breakdowns(timeline, [critical], result.makespan_ns)[critical]
    compute_s = whole["compute"] / steps
    optimizer_s = whole["optimizer"] / steps
    breakdown = {"compute": compute_s, "optimizer": optimizer_s,
                 **{f"exposed_{axis}": 0.0 for axis in AXES_IN_ORDER}, "bubble": 0.0}
    breakdown["exposed_dp"] = max(step_s - compute_s - optimizer_s, 0.0)
    busy = _server_busy_ns(timeline, lowering.server_ranks[0])
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
        **throughput(model, cluster, plan, step_s),
        peak_memory_bytes=int(max(worker.total_bytes, (host or server).total_bytes)),
        memory={0: worker},
        breakdown=breakdown,
        stage_breakdown={0: breakdown},
        inputs=resolved_inputs(model, cluster, plan, fidelity, layout, result.plan_counts),
        timeline=timeline,
        lowering=lowering,
        ps=ps,
    )


def _check_ps_fits(plan: ParallelPlan, servers: int, breakdown: MemoryBreakdown,
                   capacity_bytes: float, rank: int, *, server: bool) -> None:
    """check_fits with remedies that exist for parameter-server plans (no ZeRO, tp, pp)."""
    if breakdown.total_bytes <= capacity_bytes:
        return
    # (twice the servers: each holds half the shard it holds now)
    tips: list[Remedy | str] = [Remedy("ps_servers", 2 * servers)] if server else []
    if server and plan.ps_placement == "colocated":
        tips.append(Remedy("ps_placement", "dedicated"))
    if breakdown.activations_bytes > 0:
        if plan.recompute != "full":
            tips.append(Remedy("recompute", "full"))
        if plan.micro_batch > 1:
            tips.append(Remedy("micro_batch", plan.micro_batch // 2))
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
