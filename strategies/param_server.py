"""Parameter-server training: workers push gradients to server shards and pull parameters back.

An alternative to all-reduce data parallelism (``ParallelPlan.dp_mode``), after Li et al.
2014 ("Scaling Distributed Machine Learning with the Parameter Server", OSDI) and Ho et al.
2013 ("More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server",
NIPS). The parameters are split in ``S`` shards, one per server; every worker (one DP rank,
a whole model replica on one GPU: tp = pp = cp = ep = 1, zero = 0) runs its forward and
backward, then:

* PUSH: as each gradient bucket becomes ready (the same buckets and overlap with the
  backward as all-reduce DP: ``grad_bucket_bytes``, ``overlap_grad_reduce``), the worker
  sends shard ``s`` of the bucket (bucket bytes / S) to server ``s``, one stream per server
  so all pushes run at once; all workers' pushes to one server arrive together, which is
  the incast on that server's NIC ingress;
* SERVER ``s``: receives the pushes (one stream per worker), then

  - ``ps-sync`` (BSP): waits for all N pushes of a bucket, sums them (a memory-bound
    ``elementwise`` op reading N shards and writing one), applies the optimizer to its
    shard (``optimizer`` op: Adam, the same FLOPs and bytes per parameter as
    strategies.lowering) and sends the updated shard (bf16, the same bytes) back to every
    worker (PULL);
  - ``ps-async``: applies each worker's push on its own as it arrives (one update per push,
    on a stream per worker, so updates for different workers never wait for each other:
    lock-free Hogwild-style application) and returns the shard to that worker at once;
  - ``ps-stale`` (SSP, bound ``s = staleness``): the server is that of ``ps-sync`` (the
    parameters a worker reads are exactly those of a step boundary), but a worker may
    compute step t+1 with the parameters of step t - s: its step t+1 waits only for its
    pulls of step t - s, so pushes and pulls overlap s steps of compute. With s = 0 it is
    ``ps-sync`` exactly.

* the worker's next step starts when its pulls (of step t, or t - s) have arrived; in
  ``ps-async`` those are its own pulls only, so workers never wait for each other.

Placement (``ps_placement``): ``dedicated`` servers occupy the GPU slots of extra nodes
appended after the workers' (server shard s is rank ``dp + s``); ``colocated`` shard s
lives on worker rank ``floor(s * dp / S)`` (spread evenly, so the default of one server per
worker node puts one on every node; with S = dp it is rank s), shares that GPU's NIC, and
its own worker's shard moves no bytes. ``ps_servers = 0`` means one server per worker node.

The Program is full (``represents`` is None: workers are not symmetric with the servers)
and covers ``ps_steps`` consecutive steps. Op names start with ``dp.`` so the step report
attributes waiting for pushes and pulls to ``exposed_dp``: ``dp.push.s{s}.t{t}.b{k}`` (a
worker's send), ``dp.push.w{w}...`` (the server's receive), ``dp.server.aggregate...``,
``dp.server.update...`` and ``dp.pull.s{s}...`` / ``dp.pull.w{w}...``.

Not modelled (stated once): server shards run on a GPU slot (their update is priced by
that GPU's roofline; CPU servers are not modelled); compute on different streams of one GPU
does not contend (a colocated server's updates do not slow its worker, async updates for
different workers run side by side); all workers are equally fast unless the caller edits
the Program (tests make one slow to show async's and SSP's effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from strategies import model_costs
from strategies.ir import ComputeOp, Op, Program, RecvOp, SendOp
from strategies.lowering import GRAD_BYTES, PARAM_BYTES, StepLowerer, StepLowering, _RankBuilder
from strategies.memory import (GRAD_BYTES_PER_PARAM, WEIGHT_BYTES_PER_PARAM, MemoryBreakdown,
                               WORKSPACE_BYTES, optimizer_state_bytes_per_param,
                               optimizer_storage, rank_memory)
from strategies.model_spec import ModelSpec
from strategies.schedules import schedule_actions
from strategies.plan import DP_MODES, ParallelPlan, RankLayout

PS_MODES = tuple(mode for mode in DP_MODES if mode != "allreduce")
SERVER_STREAM = "dp.server"


def num_servers(plan: ParallelPlan, worker_nodes: int) -> int:
    """Server shards of a plan: ``ps_servers``, or one per worker node when it is 0."""
    servers = plan.ps_servers or worker_nodes
    if plan.ps_placement == "colocated":
        servers = min(servers, plan.dp)
    return servers


def server_ranks(plan: ParallelPlan, servers: int) -> tuple[int, ...]:
    """Global rank of every server shard (module docstring: placement).

    Workers are ranks ``0..dp-1`` and fill whole nodes (sim.step.job_layout), so dedicated
    servers start on the first GPU of the first node after them.
    """
    if servers < 1:
        raise ValueError(f"ps_servers: {servers} is not valid; give at least one server")
    n = plan.dp
    if plan.ps_placement == "colocated":
        if servers > n:
            raise ValueError(f"ps_servers: {servers} colocated servers exceed the {n} workers; "
                             f"give 1..{n} or ps_placement 'dedicated'")
        return tuple(s * n // servers for s in range(servers))
    return tuple(n + s for s in range(servers))


def ps_world_size(plan: ParallelPlan, servers: int) -> int:
    """Ranks of the job: the workers, plus the servers when they are dedicated."""
    return plan.dp + (servers if plan.ps_placement == "dedicated" else 0)


def split_bytes(total: int, parts: int) -> tuple[int, ...]:
    """``total`` bytes in ``parts`` shards differing by at most one byte, summing to it."""
    return tuple((total * (i + 1)) // parts - (total * i) // parts for i in range(parts))


@dataclass(frozen=True)
class PSLowering(StepLowering):
    """A lowered parameter-server run (``ps_steps`` steps) and what reports need.

    Attributes (beyond :class:`strategies.lowering.StepLowering`, whose ``program`` is the
    full program and ``representatives`` is ``(0,)``, worker 0):
        mode: the plan's ``dp_mode``.
        steps: steps in the program.
        staleness: the SSP bound (0 unless ``ps-stale``).
        worker_ranks: ranks of the workers (0..dp-1).
        server_ranks: rank of each server shard.
        bucket_bytes: gradient bytes of each bucket a worker pushes per step (in push order).
        shard_bytes: ``[bucket][server]`` bytes pushed (and pulled) per worker.
        ready: per worker rank, per step, the names of its ops (pulls; its local shard's
            updates when it hosts one) whose completion gives it that step's parameters.
    """

    mode: str
    steps: int
    staleness: int
    worker_ranks: tuple[int, ...]
    server_ranks: tuple[int, ...]
    bucket_bytes: tuple[int, ...]
    shard_bytes: tuple[tuple[int, ...], ...]
    ready: Mapping[int, tuple[frozenset[str], ...]]

    @property
    def gradient_bytes(self) -> int:
        """Gradient bytes one worker pushes per step (= parameter bytes it pulls)."""
        return sum(self.bucket_bytes)


class _WorkerLowerer(StepLowerer):
    """One worker's step: StepLowerer's kernels and gradient buckets, without the data-parallel
    reduction and the optimizer (they happen on the servers); records where each bucket of
    gradients is ready instead."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan) -> None:
        super().__init__(model, plan)
        self.buckets: list[tuple[int, float, str]] = []

    def _reduce_bucket(self, b: _RankBuilder, group: str, size: float, label: str,
                       done_index: int) -> int:
        self.buckets.append((done_index, size, f"{group}.{label}"))
        return -1

    def _optimizer(self, b: _RankBuilder, p: int, dp_ops: list[int]) -> None:
        return None


def lower_ps_step(model: ModelSpec, plan: ParallelPlan, *, servers: int) -> PSLowering:
    """Lower ``plan.ps_steps`` parameter-server training steps (module docstring).

    Args:
        model: the model.
        plan: a validated plan whose ``dp_mode`` is a parameter-server mode.
        servers: number of server shards (:func:`num_servers`).

    Raises:
        ValueError: a plan that is not a parameter-server plan, or a bad server count.
    """
    if plan.dp_mode not in PS_MODES:
        raise ValueError(f"dp_mode: {plan.dp_mode!r} is not a parameter-server mode; "
                         f"valid: {', '.join(PS_MODES)}")
    ranks = server_ranks(plan, servers)
    worker = _WorkerLowerer(model, plan)
    template = worker.rank_ops(0)
    for op in template:
        if not isinstance(op, ComputeOp) or op.deps:
            raise ValueError(f"dp_mode: {plan.dp_mode!r} needs a worker step without "
                             f"communication (op {op.name!r}); give tp = pp = cp = ep = 1")
    buckets = [(index, int(round(size))) for index, size, _ in worker.buckets]
    shards = tuple(split_bytes(size, servers) for _, size in buckets)
    assembler = _Assembler(plan, template, buckets, shards, ranks)
    ops_by_rank: dict[int, list[Op]] = {}
    ready: dict[int, tuple[frozenset[str], ...]] = {}
    shared: tuple[list[Op], tuple[frozenset[str], ...]] | None = None
    for rank in range(ps_world_size(plan, servers)):
        if rank < plan.dp and rank not in assembler.shard_of:
            # Workers without a server shard do exactly the same thing: one list for all.
            if shared is None:
                shared = assembler.rank_ops(rank)
            ops_by_rank[rank], ready[rank] = shared
        else:
            ops_by_rank[rank], names = assembler.rank_ops(rank)
            if rank < plan.dp:
                ready[rank] = names
    actions = schedule_actions(plan.schedule, 1, plan.num_microbatches, 1)
    program = Program(ops_by_rank=ops_by_rank, world_size=ps_world_size(plan, servers),
                      name=f"{model.name} {plan.dp_mode} x{plan.ps_steps} steps",
                      metadata={"model": model.name, "plan": plan, "dp_mode": plan.dp_mode,
                                "servers": servers, "server_ranks": ranks,
                                "steps": plan.ps_steps},
                      represents=None)
    return PSLowering(program=program, layout=RankLayout(plan), representatives=(0,),
                      stage_layers=worker.stage_layers,
                      actions=tuple(tuple(a) for a in actions),
                      mode=plan.dp_mode, steps=plan.ps_steps, staleness=plan.staleness,
                      worker_ranks=tuple(range(plan.dp)), server_ranks=ranks,
                      bucket_bytes=tuple(size for _, size in buckets), shard_bytes=shards,
                      ready=ready)


class _Assembler:
    """Builds each rank's op list of a parameter-server program.

    A rank's list holds, step after step: the server's receives of the step (when it hosts a
    shard), the worker's compute with its pushes after each bucket's last gradient (and, on
    a colocated host, the server's work on that bucket right after), then the worker's
    pulls; a dedicated server's list holds the receives, aggregation, update and pulls of
    each bucket. Deps always point to earlier ops of the list.
    """

    def __init__(self, plan: ParallelPlan, template: Sequence[Op],
                 buckets: Sequence[tuple[int, int]], shards: Sequence[Sequence[int]],
                 ranks: Sequence[int]) -> None:
        self.plan = plan
        self.mode = plan.dp_mode
        self.template = template
        self.shards = shards
        self.ranks = tuple(ranks)
        self.shard_of = {rank: s for s, rank in enumerate(ranks)}
        self.workers = range(plan.dp)
        self.at_index: dict[int, list[int]] = {}
        for k, (index, _) in enumerate(buckets):
            self.at_index.setdefault(index, []).append(k)
        self.lag = 1 + (plan.staleness if self.mode == "ps-stale" else 0)

    def rank_ops(self, rank: int) -> tuple[list[Op], tuple[frozenset[str], ...]]:
        ops: list[Op] = []

        def add(op: Op) -> int:
            ops.append(op)
            return len(ops) - 1

        shard = self.shard_of.get(rank)
        is_worker = rank < self.plan.dp
        ready_index: list[list[int]] = []
        ready_names: list[frozenset[str]] = []
        buckets = range(len(self.shards))
        for t in range(self.plan.ps_steps):
            recv: dict[tuple[int, int], int] = {}
            if shard is not None:
                for k in buckets:
                    for w in self.workers:
                        if w != rank:
                            recv[k, w] = add(RecvOp(
                                name=f"dp.push.w{w}.t{t}.b{k}", peer=w,
                                size_bytes=self.shards[k][shard], tag=f"push.t{t}.b{k}",
                                stream=f"dp.recv.w{w}", axis="dp"))
            if not is_worker:
                for k in buckets:
                    self._server_bucket(add, rank, shard, t, k, recv, None)
                continue
            gate_step = t - self.lag
            gate = tuple(ready_index[gate_step]) if gate_step >= 0 else ()
            step_ready: list[tuple[int, str]] = []
            for i, op in enumerate(self.template):
                if i == 0 and gate:
                    op = replace(op, deps=gate)
                index = add(op)
                for k in self.at_index.get(i, ()):
                    for s, server in enumerate(self.ranks):
                        if server != rank:
                            add(SendOp(name=f"dp.push.s{s}.t{t}.b{k}", peer=server,
                                       size_bytes=self.shards[k][s], tag=f"push.t{t}.b{k}",
                                       stream=f"dp.push.s{s}", deps=(index,), axis="dp"))
                    if shard is not None:
                        step_ready += self._server_bucket(add, rank, shard, t, k, recv, index)
            for k in buckets:
                for s, server in enumerate(self.ranks):
                    if server != rank:
                        name = f"dp.pull.s{s}.t{t}.b{k}"
                        step_ready.append((add(RecvOp(
                            name=name, peer=server, size_bytes=self.shards[k][s],
                            tag=f"pull.t{t}.b{k}", stream=f"dp.pull.s{s}", axis="dp")), name))
            ready_index.append(sorted(index for index, _ in step_ready))
            ready_names.append(frozenset(name for _, name in step_ready))
        return ops, tuple(ready_names)

    def _server_bucket(self, add, rank: int, shard: int, t: int, k: int,
                       recv: Mapping[tuple[int, int], int],
                       local: int | None) -> list[tuple[int, str]]:
        """Server ``shard``'s work on bucket ``k`` of step ``t``; returns the (index, name) of
        the updates that give the rank's own worker its parameters (colocated host)."""
        size = self.shards[k][shard]
        elements = size / GRAD_BYTES
        n = self.plan.dp

        # the server's Adam over its shard: what the plan's optimizer stores (its summed
        # gradient in the plan's gradient dtype; strategies.memory.optimizer_storage)
        adam_bytes = optimizer_storage(self.plan).adam_bytes_per_param()

        def update(name: str, stream: str, deps: tuple[int, ...]) -> int:
            return add(ComputeOp(name=name, kind="optimizer",
                                 flops=elements * model_costs.ADAM_FLOPS_PER_PARAM,
                                 bytes=elements * adam_bytes, dtype="fp32",
                                 stream=stream, deps=deps))

        def pull(w: int, done: int) -> None:
            add(SendOp(name=f"dp.pull.w{w}.t{t}.b{k}", peer=w, size_bytes=size,
                       tag=f"pull.t{t}.b{k}", stream=f"dp.send.w{w}", deps=(done,),
                       axis="dp"))

        mine: list[tuple[int, str]] = []
        if self.mode == "ps-async":
            for w in self.workers:
                source = local if w == rank else recv[k, w]
                name = f"dp.server.update.w{w}.t{t}.b{k}"
                done = update(name, f"{SERVER_STREAM}.w{w}", (source,))
                if w == rank:
                    mine.append((done, name))
                else:
                    pull(w, done)
            return mine
        inputs = tuple(sorted([recv[k, w] for w in self.workers if w != rank]
                              + ([local] if local is not None else [])))
        if n > 1:
            add(ComputeOp(name=f"dp.server.aggregate.t{t}.b{k}", kind="elementwise",
                          flops=(n - 1) * elements, bytes=float((n + 1) * size), dtype="bf16",
                          stream=SERVER_STREAM, deps=inputs))
            inputs = ()
        name = f"dp.server.update.t{t}.b{k}"
        done = update(name, SERVER_STREAM, inputs)
        for w in self.workers:
            if w == rank:
                mine.append((done, name))
            else:
                pull(w, done)
        return mine


# ----------------------------------------------------------------------------- memory
def worker_memory(model: ModelSpec, plan: ParallelPlan, *, inflight_microbatches: int
                  ) -> MemoryBreakdown:
    """Peak memory of a worker: :func:`strategies.memory.rank_memory` of the whole model at
    zero 0 without the optimizer state (the servers hold it); under ``ps-stale`` with
    staleness >= 1 also a second bf16 copy of the weights (pulls land there while the step
    computes on the stale copy) and of the gradients (pushes of step t drain while step t+1
    accumulates): double buffering, assumed."""
    base = rank_memory(model, replace(plan, zero=0), layers=range(model.num_layers),
                       has_embedding=True, has_head=True,
                       inflight_microbatches=inflight_microbatches)
    params = model_costs.rank_params(model, layers=range(model.num_layers), has_embedding=True,
                                     has_head=True).total
    double = plan.dp_mode == "ps-stale" and plan.staleness > 0
    return replace(base, optimizer_bytes=0.0,
                   weights_bytes=base.weights_bytes
                   + (WEIGHT_BYTES_PER_PARAM * params if double else 0.0),
                   gradients_bytes=base.gradients_bytes
                   + (GRAD_BYTES_PER_PARAM * params if double else 0.0))


def server_memory(plan: ParallelPlan, lowering: PSLowering) -> MemoryBreakdown:
    """Peak memory of the largest server shard's process: bf16 weights (served to pulls),
    the summed bf16 gradient and the optimizer state the plan stores for its shard (master
    weights, momentum and variance: :func:`strategies.memory.optimizer_state_bytes_per_param`,
    2 + 2 + 12 bytes per parameter by default), and receive buffers for one bucket shard from
    every worker; no activations; the usual workspace."""
    per_shard = [sum(bucket[s] for bucket in lowering.shard_bytes)
                 for s in range(len(lowering.server_ranks))]
    s = max(range(len(per_shard)), key=per_shard.__getitem__)
    params = per_shard[s] / GRAD_BYTES
    largest = max((bucket[s] for bucket in lowering.shard_bytes), default=0)
    return MemoryBreakdown(
        weights_bytes=PARAM_BYTES * params,
        gradients_bytes=GRAD_BYTES_PER_PARAM * params,
        optimizer_bytes=optimizer_state_bytes_per_param(plan) * params,
        activations_bytes=0.0,
        comm_buffers_bytes=float(plan.dp * largest),
        workspace_bytes=float(WORKSPACE_BYTES))


def colocated_memory(worker: MemoryBreakdown, server: MemoryBreakdown) -> MemoryBreakdown:
    """A worker that also hosts a server shard: both, field by field (one workspace)."""
    return MemoryBreakdown(
        weights_bytes=worker.weights_bytes + server.weights_bytes,
        gradients_bytes=worker.gradients_bytes + server.gradients_bytes,
        optimizer_bytes=worker.optimizer_bytes + server.optimizer_bytes,
        activations_bytes=worker.activations_bytes,
        comm_buffers_bytes=worker.comm_buffers_bytes + server.comm_buffers_bytes,
        workspace_bytes=worker.workspace_bytes,
        transient_bytes=worker.transient_bytes)


def server_nodes(servers: int, gpus_per_node: int) -> int:
    """Extra nodes dedicated servers need, one server per GPU slot."""
    return math.ceil(servers / gpus_per_node)
