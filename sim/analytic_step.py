"""Closed-form step model: fidelity ``analytic``, for sweeps of thousands of plans.

The event fidelity replays every op of the step in SimPy. This model prices the
same ops without an event loop, in three parts:

1. **One micro-batch of each virtual stage.** The step lowering builds the ops of
   one layer's (or the embedding's, or the head's) forward and backward
   (:meth:`StepLowerer.phase_ops`), so the kernels, TP/CP/EP communication and
   recompute are exactly those the event fidelity runs; a stage is its layers back
   to back, priced once per layer kind. A list schedule prices them on one rank: ops on a stream run in
   order, an op starts when its stream is free and its dependencies are done, and
   symmetric collective members arrive together. Every op costs what the cost model
   (:class:`hardware.cost.CostModel`) says: what the event fidelity charges, to the
   nanosecond.
2. **The pipeline.** Each virtual stage's forward, backward (and, for schedules
   that split it, weight-gradient part) of one micro-batch, priced on the rank that
   holds it, go to the schedule object
   (:meth:`strategies.schedules.PipelineSchedule.timing`), which returns when each
   rank's last action ends: its closed form where it has one (the 1F1B family:
   ``m T_c + sum_{r != c} T_r / v + 2 (p - 1) t_p2p``, Narayanan et al. 2021, §2.2),
   else an exact replay of its action lists extrapolated over the steady state's
   period (zero bubble and any schedule added later). The forward of the first
   micro-batch and the backward of the last cross ``p - 1`` pipeline edges each,
   ``t_p2p`` apiece.
3. **The end of the step.** From the start of rank ``r``'s last backward (its
   last action's end, minus the last micro-batch's backward), the same list
   schedule prices the last micro-batch's backward with its gradient buckets
   reduced over data parallelism as they fill, the optimizer and ZeRO's
   parameter all-gather; the step ends when the last rank does. Where the
   schedule's timing is a replay of its lists, each of those backwards (a V's or
   DualPipe's two stages, I and W apart) starts where the replay starts it
   (``PipelineTiming.rank_tail``), so the first stage's reductions run in the gaps
   as they do in the event replay; the 1F1B family, one stage per rank or
   interleaved, walks them back to back. Replay-timed schedules also price each
   pipeline hop at its own pair of ranks' transfer (a hop across nodes), the 1F1B
   family's recurrence at rank 0 to rank 1's.

ZeRO-3's parameter gathers depend on nothing, so the data-parallel stream runs
them ahead of use, in program order behind the reductions issued before them. The
1F1B family (GPipe, 1F1B, interleaved) walks every unit with them
(:class:`GatherWalker`, :func:`strategies.pipeline.one_f_one_b_family_walk`: the
replay's integers where hops share one price); other schedules walk the tail the
timing runs apart with its gathers and bound the rest: the first layer of the step
waits for its gather, and a rank whose gathers outlast its compute ends no sooner
than all of them.

Where the event fidelity must agree: without pipeline parallelism the step is
one rank's list schedule (with ZeRO-3, of all its actions in order), so the two
agree to the nanosecond (tests). With pipelines they differ by how waits inside
the steady state and the drain overlap the reduction: under 1 % on the tested
schedules, under 5 % with ZeRO-3, whose prefetch also runs through the bubbles.

What a plan costs to price (issue 16): every distinct part (layer kind, edge) in
each phase is list-scheduled once per :class:`PricingCache` for all plans that read
it the same way (:mod:`sim.analytic_prices`); a plan itself builds no action list
where the schedule has a closed form for its counts
(:meth:`strategies.schedules.PipelineSchedule.action_counts`, ``first_action``: every
schedule without F&B pairs) and walks its stages from per-plan tables of part prices
and their sums (``fast``; ``fast=False`` is the reference walk over the lists,
tests/test_fast_analytic.py checks both give the same result).

The host's lead (issue 12, :mod:`sim.host_lead`): when the CPU issues the kernels
(``host_issue`` eager, compiled, partial) each list schedule is also a max-plus form of
how far ahead of the GPU the CPU starts it; a phase composes its parts' forms, the
pipeline timing takes each phase with the CPU ahead, and each rank's end is bounded by
its action list back to back from the CPU's start, the unled first action and the
waits for other ranks' last actions (:meth:`AnalyticStepModel._host_ends`): within 1 %
of the replay on the tested pipelines (tests/test_host_pipeline.py), 0.1 % without.

Stragglers (``{rank: speed}``) slow every compute op of their whole pipeline
(its TP/CP peers wait for them); the step is the slower of that pipeline and the
others, as data parallelism synchronises them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from hardware.catalog import cluster_to_dict
from hardware.cost import (ComputeTimer, CostModel, RankConditions, prices_ops_by_shape,
                           shared_sm_ns)
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.analytic_prices import SharedPrices, amax_price_key, part_recomputes, plan_fields
from sim.breakdown import AXES_IN_ORDER, critical_rank
from sim.host_lead import LEVEL, HostForm, repeated_blocks, settle_rank_ends
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp, ComputeOp, Op
from strategies.lowering import AMAX_PART, StepLowerer
from strategies.model_spec import ModelSpec
from strategies.pipeline import Action, one_f_one_b_family_walk
from strategies.schedules import PipelineTiming
from strategies.schedules.base import count_actions, family_warmups
from strategies.plan import HOST_FREE_MODES, ParallelPlan

COMPUTE_STREAM = "compute"


@dataclass
class OpListCost:
    """Time of an op list on one rank, list-scheduled (all times in ns).

    Attributes:
        total_ns: from the first op's start to the last op's end.
        compute_ns: compute kernels on the compute stream (not the optimizer).
        optimizer_ns: the optimizer.
        exposed_ns: per axis, time the compute stream waits for or runs
            communication of that axis, plus communication that ends after the
            compute stream.
    """

    total_ns: int = 0
    compute_ns: int = 0
    optimizer_ns: int = 0
    exposed_ns: dict[str, int] = field(default_factory=dict)
    #: the list as a function of the CPU's lead (:class:`sim.host_lead.HostForm`; None:
    #: no op costs the CPU anything, the list takes ``total_ns`` at any lead)
    host: HostForm | None = None
    #: compute-stream time lost waiting for the CPU, starting level (in ``compute_ns``)
    starved_ns: int = 0
    #: a walk's (:meth:`AnalyticStepModel._walk`): how far ahead of the GPU the CPU is
    #: when its compute ends, having started level (a finish walk's: when its optimizer
    #: starts; 0 when the host is not modelled)
    lead_ns: int = 0

    def form(self) -> HostForm:
        """:attr:`host`, or the form of a list the CPU never holds back (its CPU ends
        where it starts)."""
        if self.host is not None:
            return self.host
        return HostForm(self.total_ns, self.total_ns, None, 0)


class PricingCache:
    """Cost models shared by many evaluations (a sweep, a plan search): evaluations on
    the same cluster spec, job shape and compute model reuse one
    :class:`hardware.cost.CostModel`, its collective choices and prices, and the
    :class:`SharedPrices` of the analytic step model on it. Specs are held by
    identity, so the cache keeps them alive; at most ``max_layouts`` job shapes are
    kept.

    Args:
        max_layouts: job shapes (cluster spec, nodes, GPUs per node) to keep.
    """

    def __init__(self, max_layouts: int = 64) -> None:
        self.max_layouts = max_layouts
        self._entries: dict[tuple, tuple[ClusterSpec, object, CostModel, SharedPrices]] = {}
        self._cluster_dicts: dict[int, tuple[ClusterSpec, dict]] = {}
        self._layouts: dict[tuple, tuple[ClusterSpec, ClusterLayout]] = {}

    def cluster_dict(self, cluster: ClusterSpec) -> dict:
        """``hardware.catalog.cluster_to_dict`` of ``cluster``, computed once per spec
        (results embed it; building it costs more than pricing a plan)."""
        entry = self._cluster_dicts.get(id(cluster))
        if entry is None:
            entry = (cluster, cluster_to_dict(cluster))
            self._cluster_dicts[id(cluster)] = entry
        return entry[1]

    def layout(self, cluster: ClusterSpec, gpus: int) -> ClusterLayout:
        """``sim.step.job_layout(cluster, gpus)``, built once per spec and GPU count
        (callers must not change it: no degraded links). The spec is held by
        identity and kept alive with its entry."""
        key = (id(cluster), gpus)
        entry = self._layouts.get(key)
        if entry is None:
            from sim.step import job_layout  # (sim.step imports this module)

            if len(self._layouts) >= self.max_layouts:
                self._layouts.pop(next(iter(self._layouts)))
            entry = (cluster, job_layout(cluster, gpus))
            self._layouts[key] = entry
        return entry[1]

    def cost_model(self, layout: ClusterLayout, compute: ComputeTimer | None = None
                   ) -> CostModel:
        """The closed-form cost model of ``layout`` (with ``compute``, default the GPU's
        roofline), shared by every evaluation of the same job shape."""
        return self._entry(layout, compute)[2]

    def shared_prices(self, layout: ClusterLayout, compute: ComputeTimer | None = None
                      ) -> SharedPrices | None:
        """The :class:`SharedPrices` of :meth:`cost_model`'s model (None when its compute
        timer may price by layer name, :func:`hardware.cost.prices_ops_by_shape`)."""
        return self._entry(layout, compute)[3]

    def _entry(self, layout: ClusterLayout, compute: ComputeTimer | None) -> tuple:
        key = (id(layout.spec), layout.nodes, layout.gpus_per_node, id(compute))
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_layouts:
                self._entries.pop(next(iter(self._entries)))
            cost = CostModel(layout, ALGORITHMS, compute=compute, fidelity="analytic")
            shared = SharedPrices() if prices_ops_by_shape(cost.compute) else None
            entry = (layout.spec, compute, cost, shared)
            self._entries[key] = entry
        return entry


class OpPricer:
    """Asks the cost model for the duration of ops on one rank, and list-schedules op
    lists.

    Args:
        cost: the cost model (hardware.cost.CostModel).
        rank: the rank whose conditions (speed) apply; None: an ordinary rank.
        comm_contention: None: overlapped communication takes no SMs from compute;
            else the most CTAs an NCCL kernel holds (0: NCCL's default): compute kernels
            overlapping communication run on the SMs left, as the event engine runs
            them (:func:`hardware.cost.shared_sm_ns`; the plan's ``comm_sm_contention``
            and ``nccl_max_ctas``).
    """

    def __init__(self, cost: CostModel, rank: int | None = None,
                 comm_contention: int | None = None) -> None:
        self.cost = cost
        self.rank = rank
        sms = cost.layout.spec.gpu.sm_count
        self.max_ctas = comm_contention if sms > 0 else None
        self.sms = sms
        self.speed = cost.rank_speed(rank)
        self._kept_groups: dict[int, tuple[int, ...]] = {}
        self._own_prices: dict[tuple, int] = {}
        self._own_ctas: dict[tuple, int] = {}
        self.ops_scheduled = 0

    def duration_ns(self, op: Op) -> int:
        """Nanoseconds the op takes once it starts; point-to-point ops cost 0 here
        (the pipeline's timing prices them)."""
        if isinstance(op, ComputeOp):
            return self.cost.compute_ns(op, self.rank)
        if isinstance(op, CollectiveOp):
            # Hashing a 16,384-rank tuple on every lookup would cost more than the
            # pricing (tuples do not cache their hash): the pricer's own table is keyed
            # by the group's identity (the tuple kept alive, so its id stays its own);
            # the cost model's by the group itself, on a miss.
            key = (op.kind, id(op.group), op.size_bytes, op.algorithm)
            duration = self._own_prices.get(key)
            if duration is None:
                self._kept_groups[id(op.group)] = op.group
                duration = self.cost.collective(op.kind, op.group, op.size_bytes,
                                                op.algorithm).duration_ns
                self._own_prices[key] = duration
            return duration
        return 0

    def p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """Nanoseconds of one point-to-point transfer."""
        return self.cost.p2p_ns(src, dst, size_bytes)

    def ctas(self, op: Op) -> int:
        """SMs a communication op's NCCL kernel holds while it runs (0: none, or SM
        contention off; :meth:`hardware.cost.CostModel.collective_ctas`)."""
        if self.max_ctas is None:
            return 0
        if isinstance(op, CollectiveOp):
            if not op.holds_sms:
                return 0
            key = (op.kind, id(op.group), op.size_bytes, op.algorithm)
            found = self._own_ctas.get(key)
            if found is None:
                self._kept_groups[id(op.group)] = op.group
                choice = self.cost.collective(op.kind, op.group, op.size_bytes, op.algorithm)
                found = self._own_ctas[key] = self.cost.collective_ctas(
                    op.kind, op.group, op.size_bytes, choice, self.max_ctas)
            return found
        return 0

    def schedule(self, ops: Sequence[Op],
                 external: Sequence[tuple[int, int, int]] = (), lead_ns: int = 0
                 ) -> OpListCost:
        """List-schedule ``ops`` (stream order and ``deps``) on one rank.

        Under SM contention (``comm_contention``) a compute op runs on the SMs that the
        communication in flight leaves: this list's own collectives and ``external``
        ones ``(begin_ns, end_ns, ctas)`` from the list's start (the data-parallel
        stream's). A collective's start can depend on compute it slows and a compute
        op's end on collectives listed after it, so the op times come from one pass in
        time order (:meth:`contended_durations`, the event engine's causal order),
        then the list schedule's accounting runs with them.

        The rank's CPU thread issues the ops in list order (:meth:`hardware.cost.
        CostModel.host_ns` each, from ``lead_ns`` before the list's start: how far ahead
        of the GPU the CPU is); an op starts no earlier than its issue, and after a
        ``host_sync`` op the CPU waits for it to end. GPU time lost waiting for the CPU
        on the compute stream counts as compute here (``starved_ns`` says how much; the
        step model's phases and walks count it as idle, as the replay does), and the
        list's end and its CPU's end at any other lead are its ``host`` form
        (:class:`sim.host_lead.HostForm`, the same pass). Without host costs nothing
        changes."""
        if self.max_ctas is None:
            return self._schedule(ops, lead_ns=lead_ns)
        return self._schedule(ops, self.contended_durations(ops, external, lead_ns), lead_ns)

    def contended_durations(self, ops: Sequence[Op],
                            external: Sequence[tuple[int, int, int]] = (), lead_ns: int = 0
                            ) -> list[int]:
        """Each op's duration in the list schedule of ``ops`` under SM contention: a
        discrete-event pass in time order (what :class:`sim.engine.Engine` does), each
        op starting when its stream is free, its ``deps`` have ended and the CPU has
        issued it (:meth:`schedule`); a collective holds its CTAs
        (:meth:`ctas`) from its start to its end, and a compute op running when one
        starts is re-timed from its own start with every interval known
        (:func:`hardware.cost.shared_sm_ns`: the intervals that start before it ends
        are all known by then). Events at one instant in list order; O(n^2) in the
        list's length at worst (tens of ops per part)."""
        n = len(ops)
        base = [self.duration_ns(op) for op in ops]
        if not external and not any(base[i] and not isinstance(op, ComputeOp) and self.ctas(op)
                                    for i, op in enumerate(ops)):
            return base
        sms = self.sms
        busy = list(external)
        start: list[int | None] = [None] * n
        end: list[int | None] = [None] * n
        issue: list[int | None] = [None] * n
        queues: dict[str, list[int]] = {}
        for index, op in enumerate(ops):
            queues.setdefault(op.stream, []).append(index)
        heads = {stream: 0 for stream in queues}
        stream_free = {stream: 0 for stream in queues}
        running: dict[int, int] = {}  # compute op -> its tentative end
        host_ns = self.cost.host_ns
        host, issued, left = -lead_ns, 0, n
        while left:
            while issued < n:  # the CPU issues in list order, waiting after a host_sync
                previous = ops[issued - 1] if issued else None
                if previous is not None and getattr(previous, "host_sync", False):
                    if end[issued - 1] is None or issued - 1 in running:
                        break
                    host = max(host, end[issued - 1])
                host += host_ns(ops[issued])
                issue[issued] = host
                issued += 1
            best_time, best = None, None
            for stream, queue in queues.items():
                if heads[stream] >= len(queue) or stream_free[stream] is None:
                    continue
                index = queue[heads[stream]]
                if issue[index] is None:
                    continue
                ready = max(stream_free[stream], issue[index])
                for dep in ops[index].deps:
                    if end[dep] is None or dep in running:
                        ready = None
                        break
                    if end[dep] > ready:
                        ready = end[dep]
                if ready is not None and (best_time is None or (ready, index) < (best_time, best)):
                    best_time, best = ready, index
            if running:
                first = min(running, key=lambda i: (running[i], i))
                if best_time is None or running[first] <= best_time:
                    del running[first]  # a compute op ends: nothing can start before
                    stream_free[ops[first].stream] = end[first]
                    left -= 1
                    continue
            index, now = best, best_time
            op = ops[index]
            heads[op.stream] += 1
            start[index] = now
            if isinstance(op, ComputeOp):
                end[index] = now + (shared_sm_ns(now, base[index], sms, busy) if busy
                                    else base[index])
                running[index] = end[index]
                stream_free[op.stream] = None
                continue
            end[index] = now + base[index]
            stream_free[op.stream] = end[index]
            left -= 1
            ctas = self.ctas(op) if base[index] else 0
            if ctas:
                busy.append((now, end[index], ctas))
                for other in running:  # compute in flight gets fewer SMs from now on
                    if running[other] > now:
                        end[other] = running[other] = start[other] + shared_sm_ns(
                            start[other], base[other], sms, busy)
        return [end[i] - start[i] for i in range(n)]

    def _schedule(self, ops: Sequence[Op], durations: Sequence[int] | None = None,
                  lead_ns: int = 0) -> OpListCost:
        """:meth:`schedule`'s list schedule, with each op's ``durations`` when given
        (under SM contention, :meth:`contended_durations`), else the cost model's."""
        self.ops_scheduled += len(ops)
        end = [0] * len(ops)
        stream_free: dict[str, int] = {}
        cost = OpListCost(exposed_ns={axis: 0 for axis in AXES_IN_ORDER})
        host = -lead_ns
        host_ns = self.cost.host_ns
        # the same list with the CPU without bound ahead (HostForm.free_ns): the issue
        # binds only after a host_sync (free_host: the CPU's time from the last one on)
        free_end = [0] * len(ops)
        free_stream: dict[str, int] = {}
        free_host: int | None = None
        hosted = False
        for index, op in enumerate(ops):
            ready = stream_free.get(op.stream, 0)
            free_ready = free_stream.get(op.stream, 0)
            blocker = None
            for dep in op.deps:
                if end[dep] > ready:
                    ready, blocker = end[dep], dep
                if free_end[dep] > free_ready:
                    free_ready = free_end[dep]
            issue_ns = host_ns(op)
            host += issue_ns
            synced = getattr(op, "host_sync", False)
            if issue_ns or synced:
                hosted = True
            if free_host is not None:
                free_host += issue_ns
                if free_host > free_ready:
                    free_ready = free_host
            starved = host - ready if host > ready else 0
            duration = self.duration_ns(op) if durations is None else durations[index]
            end[index] = ready + starved + duration
            free_end[index] = free_ready + duration
            free_stream[op.stream] = free_end[index]
            if synced:
                if end[index] > host:
                    host = end[index]
                if free_host is None or free_end[index] > free_host:
                    free_host = free_end[index]
            if op.stream != COMPUTE_STREAM:
                stream_free[op.stream] = end[index]
                continue
            cost.starved_ns += starved
            waited = ready - stream_free.get(COMPUTE_STREAM, 0)
            if waited > 0 and blocker is not None:
                axis = getattr(ops[blocker], "axis", "")
                cost.exposed_ns[axis] = cost.exposed_ns.get(axis, 0) + waited
            cost.compute_ns += starved
            stream_free[COMPUTE_STREAM] = end[index]
            if isinstance(op, ComputeOp):
                if op.kind == "optimizer":
                    cost.optimizer_ns += duration
                else:
                    cost.compute_ns += duration
            elif duration:
                axis = op.axis
                cost.exposed_ns[axis] = cost.exposed_ns.get(axis, 0) + duration
        cost.total_ns = max(end, default=0)
        if hosted:
            cost.host = HostForm(max(free_end, default=0), cost.total_ns, free_host,
                                 host if free_host is None or host > free_host else free_host)
        compute_end = stream_free.get(COMPUTE_STREAM, 0)
        if cost.total_ns > compute_end:
            last = max(range(len(ops)), key=lambda i: (end[i], -i))
            axis = getattr(ops[last], "axis", "")
            cost.exposed_ns[axis] = cost.exposed_ns.get(axis, 0) + cost.total_ns - compute_end
        return cost


@dataclass
class AnalyticStep:
    """Closed-form step of one pipeline (a data-parallel replica).

    Attributes:
        step_ns: step time.
        rank_end_ns: when each pipeline rank finishes the step.
        breakdown_s: per pipeline rank, seconds of compute, optimizer, exposed
            communication per axis and bubble (the keys of sim.breakdown).
        critical: the pipeline rank that sets the pace (sim.breakdown.critical_rank).
        ops_priced: ops list-scheduled to get there (the model's work).
        exact: False when SM contention (the plan's ``comm_sm_contention``) met a
            schedule the closed form does not price as the event engine runs it
            (:func:`contention_closed_form`, :meth:`AnalyticStepModel._walk`); callers
            that need the engine's number run it instead (:func:`sim.step.simulate_step`).
    """

    step_ns: int
    rank_end_ns: list[int]
    breakdown_s: dict[int, dict[str, float]]
    critical: int
    ops_priced: int = 0
    exact: bool = True


@dataclass
class _RankCosts:
    """What one pipeline rank's work costs (ns): per micro-batch, and at the end."""

    per_step: OpListCost         # every action of the step, back to back
    last_backward: OpListCost    # the last micro-batch's backward alone
    finish: OpListCost           # the same with gradient reduction and optimizer
    gathers_ns: int = 0          # ZeRO-3: the step's parameter gathers back to back
    first_gather_ns: int = 0     # ZeRO-3: the gather the first layer waits for


def _kind(lowerer: StepLowerer, part: int | str, layer_kind: object = None) -> object:
    """What a stage part's cost depends on: the edge's name, or the layer's kind (MoE or
    dense, attention window: ``ModelSpec.layer_kind``, or ``layer_kind`` when given) and,
    when it differs from the plan's mode, its recompute mode: with ``recompute = "full"``
    and ``recompute_layers = N`` the first N layers of a virtual stage re-run their
    forward in the backward and the others do not (StepLowerer.recompute_of), so the two
    are priced apart."""
    if isinstance(part, str):
        return part
    kind = lowerer.model.layer_kind(part) if layer_kind is None else layer_kind
    mode = lowerer.recompute_of(part)
    return kind if mode == lowerer.plan.recompute else (kind, mode)


#: Part groups (StepLowerer._groups) a layer's or edge's own ops may run on (a dense
#: model's only the first three).
_PART_GROUPS = ("tp", "cp", "ep", "etp", "ep_etp", "ep_rail", "ep_local")
_COUNTS: dict[int, tuple[Sequence[Action], dict[tuple, int]]] = {}
#: AnalyticStepModel._rank_actions by (placement, split backward, micro-batches, rank,
#: the lowering's last_microbatch).
_RANK_ACTIONS: dict[tuple, tuple] = {}
#: AnalyticStepModel._gather_repeats: gathering actions per (what decides, placement,
#: micro-batches, comp, stage).
_REPEATS: dict[tuple, int] = {}


def _action_counts(actions: Sequence[Action]) -> dict[tuple, int]:
    """:func:`strategies.schedules.base.count_actions` of ``actions``, memoised for
    immutable rows (a schedule's memoised lists; the entry keeps the row alive, so its
    id names it)."""
    entry = _COUNTS.get(id(actions)) if isinstance(actions, tuple) else None
    if entry is not None and entry[0] is actions:
        return entry[1]
    counts = count_actions(actions)
    if isinstance(actions, tuple):
        if len(_COUNTS) >= 4096:
            _COUNTS.clear()
        _COUNTS[id(actions)] = (actions, counts)
    return counts


def optimizer_layers_key(model: ModelSpec, layers: Sequence[int]) -> tuple:
    """The part of a rank's optimizer-step key its layers give: a model whose layers are
    all of one kind (dense, no attention window: ``ModelSpec.layer_kind``) reads them
    by count only (the optimizer sums their parameters and counts their tensors by
    layer type: StepLowerer._optimizer, strategies.model_costs.rank_params), so any
    ``n`` layers share a key; else the layers themselves."""
    if model.moe is None and not model.sliding_window:
        return ("uniform", len(layers))
    return tuple(layers)


def group_price_key(layout: ClusterLayout, group: Sequence[int]) -> object:
    """What every collective price on ``group`` is a function of, for a
    :class:`SharedPrices` key: its symmetry class
    (:meth:`hardware.topology.ClusterLayout.group_class`; the cost model keys its
    per-algorithm coefficients by it and picks candidates from the class's geometry,
    so :meth:`hardware.cost.CostModel.collective` gives every group of a class the
    same choice and duration at every size), or the group itself while links are not
    uniform (no class). A part's ops read their groups only through those prices
    (StepLowerer.phase_ops: the rank's TP/CP/EP collectives; compute and host costs do
    not read the group), so groups of one class give the part one list schedule."""
    found = layout.group_class(group)
    return tuple(group) if found is None else found


def _add(into: dict[str, int], other: dict[str, int], factor: int = 1) -> None:
    for key, value in other.items():
        into[key] = into.get(key, 0) + value * factor


def fill_by_sums(pending: dict[str, float], sums: tuple[float, float], bucket_bytes: float,
                 final: bool) -> list[tuple[str, float]]:
    """StepLowerer.fill_buckets for a part whose gradient bytes per group are known as
    whole sums (``sums``: dense, expert bytes): add them to the open buckets ``pending``
    (bytes per group) and return the buckets now due, as (group, bytes): those of at
    least ``bucket_bytes``, or every open one when ``final``."""
    # (the two groups unrolled: a plan search calls this once per layer of every
    # rank's last backward)
    dense, expert = sums
    size = pending.get("dense", 0.0) + dense
    if size > 0 and (size >= bucket_bytes or final):
        due = [("dense", size)]
        size = 0.0
    else:
        due = []
    pending["dense"] = size
    size = pending.get("expert", 0.0) + expert
    if size > 0 and (size >= bucket_bytes or final):
        due.append(("expert", size))
        size = 0.0
    pending["expert"] = size
    return due


def timed_tail_entries(timing: PipelineTiming, p: int, hosted: bool, regathers: bool
                       ) -> tuple[list, tuple[int, ...]] | None:
    """Rank ``p``'s timed tail (:meth:`AnalyticStepModel._timed_tail`) as the pipeline's
    timing entries ``(stage, comp, micro-batches before the stage's last, start)`` and the
    releases (each action's start, then the rank's end, relative to the first start);
    None when not known or one action. Without ``regathers`` only the last micro-batch's
    actions, and without ``hosted`` from the first that reduces gradients on."""
    rows = timing.rank_tail
    row = rows[p] if rows else None
    if row is None:
        return None
    if not regathers:
        row = [entry for entry in row if not entry[2]]
        if not hosted:
            reducing = [i for i, entry in enumerate(row) if entry[1] in ("B", "W")]
            if reducing:
                row = row[reducing[0]:]
    if len(row) < 2:
        return None
    first = row[0][3]
    return row, tuple(entry[3] - first for entry in row) + (-first,)


def hop_prices(schedule, placement, reps: Sequence[int], size_bytes: int, p2p_ns,
               t_p2p: int) -> int | dict[tuple[int, int], int]:
    """The pipeline's transfer price for the schedule's timing
    (:meth:`AnalyticStepModel._hop_prices`): ``t_p2p`` (rank 0 to rank 1) for every hop,
    or, where the schedule prices each hop and its hops differ, each pair of pipeline
    ranks' (both ways) as ``p2p_ns(sending representative, receiving representative,
    size_bytes)`` prices it."""
    if placement.pp < 2 or not schedule.prices_each_hop:
        return t_p2p
    prices = {}
    for a, b in placement.edges():
        prices[(a, b)] = p2p_ns(reps[a], reps[b], size_bytes)
        prices[(b, a)] = p2p_ns(reps[b], reps[a], size_bytes)
    if all(price == t_p2p for price in prices.values()):
        return t_p2p
    return prices


def last_wait(placement, p: int, row: Sequence[Action], rows: Sequence[Sequence[Action]]
              ) -> tuple[int, int, int] | None:
    """The last action of rank ``p``'s list ``row`` that waits for another rank's
    (strategies.pipeline's dependencies: a forward for the previous stage's forward,
    a backward or input-gradient for the next stage's), as (its index, that rank, the
    index of the action there); None when there is none, or either is in an
    overlapped pair (priced as one). ``placement``: the pipeline's
    (strategies.pipeline.Placement)."""
    for index in range(len(row) - 1, -1, -1):
        action = row[index]
        if action.comp == "F" and not placement.is_first(action.stage):
            stage, comps = action.stage - 1, ("F",)
        elif action.comp in ("B", "I") and not placement.is_last(action.stage):
            stage, comps = action.stage + 1, ("B", "I")
        else:
            continue
        holder = placement.rank_of(stage)
        if holder == p:
            continue
        if action.overlap or (index and row[index - 1].overlap):
            return None
        other = rows[holder]
        for position in range(len(other) - 1, -1, -1):
            found = other[position]
            if (found.stage == stage and found.comp in comps
                    and found.microbatch == action.microbatch):
                if found.overlap or (position and other[position - 1].overlap):
                    return None
                return index, holder, position
        return None
    return None


#: The stream offset of a unit that gathers nothing (:meth:`GatherWalker._plain`): far
#: below any stream position (ns) a step reaches, so ``stream + offset`` never exceeds the
#: unit's end.
_NEVER_BINDS = -(1 << 62)


class GatherWalker:
    """One pipeline rank's units as a ZeRO-3 step runs them, for
    :func:`strategies.pipeline.one_f_one_b_family_walk` (the 1F1B family): every
    forward and backward all-gathers its layers' parameters on the data-parallel stream
    (StepLowerer._param_gather: no dependency, so the stream runs them back to back in
    program order) and each layer waits for its own; the route's last micro-batch's
    backwards also reduce their gradient buckets on that stream as they fill
    (StepLowerer._backward_action: each after the part that filled it), and the gathers
    issued after a reduction queue behind it (one stream, in issue order). The replay's
    schedule of that stream, without SM contention and without the CPU's cost.

    A unit that reduces nothing ends at ``max(start + D, S + O)`` (:func:`gather_floor`;
    ``S`` where the stream is free when it issues its gathers): the walk
    ``e_i = max(e_{i-1}, g_i) + c_i`` over its layers unrolled. A unit that reduces is
    walked part by part (:meth:`reduce`), its gathers issued at its first layer, after
    its leading edge's reductions (:meth:`AnalyticStepModel._walk`'s order).

    Args:
        rows: per (forward, chunk) the unit's parts in walk order, ``(part ns, gather
            ns or 0, count, gradient sums or None, part)`` each (``count`` identical
            parts in a row).
        reduction_ns: ``(group, bytes) -> ns or None`` of one bucket.
        fill: ``(part, pending, final) -> due buckets`` for a part whose sums are None.
        bucket_bytes: the plan's gradient bucket size.
    """

    def __init__(self, rows: Mapping[tuple[bool, int], Sequence[tuple]], reduction_ns, fill,
                 bucket_bytes: float) -> None:
        chunks = 1 + max(chunk for _, chunk in rows)
        #: ``plain[1][c]``, ``plain[0][c]``: forward, backward ``(D, G, O)``
        self.plain = tuple(tuple(self._plain(rows[(bool(f), c)]) for c in range(chunks))
                           for f in (0, 1))
        self.reducing = [rows[(False, c)] for c in range(chunks)]
        self.reduction_ns, self.fill, self.bucket_bytes = reduction_ns, fill, bucket_bytes
        self._durations: dict[tuple, int | None] = {}

    @staticmethod
    def _plain(rows: Sequence[tuple]) -> tuple[int, int, int]:
        """:func:`gather_floor` of a unit's rows; a unit without a gathered layer gets
        :data:`_NEVER_BINDS` as its offset: wherever earlier reductions left the stream,
        its floor stays below the unit's end (an offset of ``-(D + 1)`` did only while the
        stream stood at 0: after a reduction it could hold an embedding-only unit)."""
        duration, gathers, offset = gather_floor([row[:3] for row in rows])
        return duration, gathers, _NEVER_BINDS if offset is None else offset

    def reduce(self, chunk: int, start: int, stream_ns: int) -> tuple[int, int, int]:
        """The backward of the last micro-batch through chunk ``chunk``, started at
        ``start`` with the stream free at ``stream_ns``, its buckets reduced as they
        fill: (its end, where the stream is free after it, its waits for gathers)."""
        parts = self.reducing[chunk]
        total, dp_free, pending = start, stream_ns, {}
        waits = gathered = 0
        final_index = len(parts) - 1
        issued = False
        for index, (part_ns, gather_ns, count, sums, part) in enumerate(parts):
            if gather_ns and not issued:
                # (every layer's gather, issued at the first layer: after the leading
                # edge's reductions)
                issued, gathered = True, dp_free
                dp_free += sum(g * n for _, g, n, _, _ in parts[index:])
            for i in range(1, count + 1):
                if gather_ns:
                    gathered += gather_ns
                    if gathered > total:
                        waits += gathered - total
                        total = gathered
                total += part_ns
                final = index == final_index and i == count
                if sums is None:
                    due = self.fill(part, pending, final)
                else:
                    due = fill_by_sums(pending, sums, self.bucket_bytes, final)
                for bucket in due:
                    duration = self._durations.get(bucket, _MISSING)
                    if duration is _MISSING:
                        duration = self._durations[bucket] = self.reduction_ns(*bucket)
                    if duration is not None:
                        dp_free = (dp_free if dp_free > total else total) + duration
        return total, dp_free, waits


#: a memo's "not looked up yet" (None is a value there)
_MISSING = object()


def gather_floor(parts: Sequence[tuple[int, int, int]]) -> tuple[int, int, int | None]:
    """A unit's parts in walk order, ``(part ns, gather ns or 0, count)`` each, as
    :class:`GatherWalker` takes a unit that reduces nothing: ``(D, G, O)``, its parts
    back to back, its gathers back to back and the latest of its ``i``-th gathered
    layer's gathers (the first ``i``) plus the parts from that layer on (None without a
    gathered layer), all ns."""
    duration = sum(part_ns * count for part_ns, _, count in parts)
    gathers = 0
    offset = None
    before = 0  # compute before the current run
    for part_ns, gather_ns, count in parts:
        if gather_ns and count:
            # layer i (1..count) of the run: gathers + i g, then duration - before - (i - 1) c
            first = gathers + gather_ns + duration - before
            last = gathers + count * gather_ns + duration - before - (count - 1) * part_ns
            found = first if first > last else last
            if offset is None or found > offset:
                offset = found
            gathers += gather_ns * count
        before += part_ns * count
    return duration, gathers, offset


class AnalyticStepModel:
    """Prices one step of one pipeline in closed form (module docstring).

    Each distinct part (a layer kind, the embedding, the head) is list-scheduled once
    per phase and reused for every stage, rank and micro-batch; with ``shared``, once
    for every plan on the same cost model that asks for the same part
    (:class:`sim.analytic_prices.SharedPrices`): the same for bucket reductions,
    parameter gathers and optimizer steps. Which layer stands for its kind within a
    plan is the first one met, as without sharing.

    Args:
        lowerer: the step lowering of the model and plan.
        pricer: prices the ops of the pipeline's ranks.
        stage_pricers: pricers of pipeline ranks that run at another speed
            (stragglers), by pipeline rank.
        shared: prices shared with other plans on the same cost model (only the
            ordinary ranks' pricer uses them).
        fast: count actions with the schedule's closed form
            (:meth:`strategies.schedules.PipelineSchedule.action_counts`) and walk a
            stage's parts from per-plan tables instead of building action lists and
            looking each part up; False: the original walk over the lists (the
            reference tests/test_fast_analytic.py compares with: same results).
    """

    def __init__(self, lowerer: StepLowerer, pricer: OpPricer,
                 stage_pricers: Mapping[int, OpPricer] | None = None,
                 shared: SharedPrices | None = None, fast: bool = True) -> None:
        self.lowerer = lowerer
        self.fast = fast
        self.pricer = pricer
        self.stage_pricers = dict(stage_pricers or {})
        self.plan = lowerer.plan
        self.shared = shared
        self._part_costs: dict[tuple, OpListCost] = {}
        self._phase_costs: dict[tuple, OpListCost] = {}
        self._ops: dict[tuple, Op | None] = {}
        self._durations: dict[tuple, int | None] = {}
        self._keys: dict[object, tuple] = {}
        self._kinds: dict[int, tuple] = {}
        self._grads: dict[object, tuple | None] = {}
        self._tables: dict[tuple, tuple] = {}
        self._kind_gathers: dict[tuple, int] = {}
        self._repeats: dict[tuple[str, int], int] = {}
        self._flags = self._moe_flags()
        #: the CPU issues the kernels (the plan's host_issue: the lowering gives ops host
        #: costs, strategies.lowering.host_launches): phases carry the CPU's lead
        #: (:mod:`sim.host_lead`)
        self._hosted = self.plan.host_issue not in HOST_FREE_MODES
        #: the walk under SM contention met a schedule it does not price exactly
        #: (:meth:`_walk`); the event engine is then the reference
        self.inexact = False

    # ------------------------------------------------------------ shared keys
    def _moe_flags(self) -> tuple[tuple[bool, int], ...]:
        """``model.layer_kind`` of every layer (the kind of a layer part: MoE or dense,
        attention window)."""
        model = self.lowerer.model
        if model.moe is None and not model.sliding_window:
            return ((False, 0),) * model.num_layers
        key = ("moe_flags", self.shared.model_key(model)) if self.shared else None
        flags = self.shared.get(key) if key else None
        if flags is None:
            flags = tuple(model.layer_kind(layer) for layer in range(model.num_layers))
            if key:
                self.shared.put(key, flags)
        return flags

    def _shared_key(self, name: str) -> tuple:
        """The plan's part of a :class:`SharedPrices` key: the lowering's class, the model
        and the plan fields a ``part``, ``optimizer`` or ``groups`` price reads
        (:func:`sim.analytic_prices.plan_fields`), once per plan."""
        found = self._keys.get(name)
        if found is None:
            found = (name, type(self.lowerer), self.shared.model_key(self.lowerer.model),
                     plan_fields(self.plan, name))
            if name == "groups":
                # a chunk held by several pipeline ranks (DualPipe) reduces its gradients
                # over their copies too (StepLowerer's "grad" group): the schedule decides
                found += (self.lowerer.chunk_copies,)
            self._keys[name] = found
        return found

    def _part_groups(self, p: int) -> tuple:
        """The groups a part's own communication runs on (TP, CP, EP and the expert
        groups) of pipeline rank ``p``'s representative: every group but the
        data-parallel ones (StepLowerer.phase_ops issues no data-parallel op), each as
        :func:`group_price_key` names it (its symmetry class: pipeline ranks and plans
        whose groups the machine maps onto each other share a part's price)."""
        key = ("groups", p)
        found = self._keys.get(key)
        if found is None:
            groups = self.lowerer._groups(self.lowerer.representatives[p])
            names = _PART_GROUPS if self.lowerer.model.moe is not None else ("tp", "cp", "ep")
            layout = self.pricer.cost.layout
            found = tuple(group_price_key(layout, groups[name]) for name in names)
            self._keys[key] = found
        return found

    def _shared_for(self, pricer: OpPricer) -> SharedPrices | None:
        """The shared prices ``pricer`` may use: the ordinary ranks' pricer only."""
        return self.shared if pricer is self.pricer else None

    def _stage_kinds(self, stage: int) -> tuple[tuple[object, int | str, int], ...]:
        """The parts of a virtual stage grouped by kind, in backward order (head, layers
        reversed, embedding): ``(kind, first part of that kind, how many)``."""
        found = self._kinds.get(stage)
        if found is None:
            counts: dict[object, list] = {}
            for part in self._stage_parts(stage):
                kind = _kind(self.lowerer, part,
                             None if isinstance(part, str) else self._flags[part])
                entry = counts.setdefault(kind, [part, 0])
                entry[1] += 1
            found = self._kinds[stage] = tuple((kind, first, count)
                                               for kind, (first, count) in counts.items())
        return found

    def _rank_actions(self, p: int) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
        """One micro-batch's actions of rank ``p`` (all its virtual stages), and the
        backward actions of the last micro-batch through each of its stages, in the
        order the rank runs them."""
        lowerer = self.lowerer
        split = lowerer.schedule.split_backward
        # (what decides them: the placement, split backwards and the micro-batch count,
        # through StepLowerer.last_microbatch; immutable, so shared by plans)
        key = (lowerer.placement, split, self.plan.num_microbatches, p,
               type(lowerer).last_microbatch)
        found = _RANK_ACTIONS.get(key)
        if found is not None:
            return found
        stages = list(lowerer.placement.stages_of(p))
        work = [Action(s, "F", 0) for s in stages]
        tail = []
        for s in reversed(stages):
            last = lowerer.last_microbatch(s)
            if split:
                work += [Action(s, "I", 0), Action(s, "W", 0)]
                tail += [Action(s, "I", last), Action(s, "W", last)]
            else:
                work.append(Action(s, "B", 0))
                tail.append(Action(s, "B", last))
        found = (tuple(work), tuple(tail))
        if len(_RANK_ACTIONS) >= 65536:
            _RANK_ACTIONS.clear()
        _RANK_ACTIONS[key] = found
        return found

    def _counts(self, p: int) -> dict[tuple, int]:
        """How often each kind of action runs on pipeline rank ``p``
        (:func:`_action_counts`), from the schedule's closed form when ``fast``."""
        lowerer = self.lowerer
        if not self.fast:
            return _action_counts(lowerer.actions()[p])
        plan = self.plan
        return lowerer.schedule.action_counts(plan.pp, plan.num_microbatches, plan.vpp,
                                              lowerer.overlap)[p]

    def _signature(self, p: int) -> tuple:
        """Ranks with equal signatures do equal work (symmetry of the stages; ranks whose
        lists overlap forwards with backwards each differ)."""
        lowerer, flags = self.lowerer, self._flags
        placement = lowerer.placement
        # (an overlapped pair is a "pair" kind among the row's memoised action counts)
        paired = any(key[0] == "pair" for key in self._counts(p))
        return (self.stage_pricers.get(p, self.pricer).speed, p if paired else None,
                tuple((tuple(flags[layer] for layer in lowerer.stage_layers[s]),
                       placement.is_first(s), placement.is_last(s),
                       placement.microbatches_through(s, self.plan.num_microbatches))
                      for s in placement.stages_of(p)))

    def _phase_cost(self, pricer: OpPricer, p: int, stage: int, comp: str) -> OpListCost:
        """One micro-batch's ``comp`` (F, B, I, W) of a virtual stage, alone: the parts
        add up, one evaluation per kind (ZeRO-3's gathers are prefetched, see
        :meth:`_gathers_ns`).

        When the CPU issues the kernels (:attr:`_hosted`) the parts run back to back
        with the CPU's lead carried across them (:meth:`_phase_form`), and the phase
        is priced as the pipeline runs it: with the CPU ahead (``HostForm.free_ns``: in
        the replay the CPU issues the next action's kernels while the GPU waits for a
        receive, and keeps its lead across GPU-bound kernels), its compute without the
        time kernels waited for the CPU (idle, as the replay's breakdown counts it);
        where the CPU does hold a rank back, :meth:`_host_ends` bounds the rank's end
        by its actions back to back from the CPU's start. ``host`` keeps the phase's
        form."""
        key = (id(pricer), stage, comp)
        total = self._phase_costs.get(key)
        if total is not None:
            return total
        total = OpListCost(exposed_ns={})
        for kind, part, count in self._stage_kinds(stage):
            cost = self._kind_cost(pricer, p, part, kind, comp)
            total.total_ns += cost.total_ns * count
            total.compute_ns += (cost.compute_ns - cost.starved_ns) * count
            _add(total.exposed_ns, cost.exposed_ns, count)
        if self._hosted:
            total.host = self._phase_form(pricer, p, stage, comp)
            total.total_ns = total.host.free_ns
        self._phase_costs[key] = total
        return total

    def _phase_form(self, pricer: OpPricer, p: int, stage: int, comp: str) -> HostForm:
        """:class:`sim.host_lead.HostForm` of one micro-batch's ``comp`` of a virtual
        stage: its parts in the order the lowering issues them (forward: embedding,
        layers, head; else head, layers reversed, embedding), a run of equal layers as
        one power."""
        runs: list[list] = []
        for cost, _, _ in self._stage_table(pricer, p, stage, comp):
            if runs and runs[-1][0] is cost:
                runs[-1][1] += 1
            else:
                runs.append([cost, 1])
        form = LEVEL
        for cost, count in runs:
            form = form.then(cost.form().repeat(count))
        return form

    def _part_cost(self, pricer: OpPricer, p: int, part: int | str, comp: str) -> OpListCost:
        """List schedule of one layer or edge in one phase, priced once per layer type."""
        return self._kind_cost(pricer, p, part, _kind(self.lowerer, part), comp)

    def _kind_cost(self, pricer: OpPricer, p: int, part: int | str, kind: object,
                   comp: str) -> OpListCost:
        """:meth:`_part_cost` of ``part``, whose kind is ``kind``; the first part of a
        kind priced in this plan stands for the kind, and with shared prices a part
        another plan priced under the same key (its plan fields, kind, phase, recompute
        mode and groups) gives the same list schedule."""
        amax = part == AMAX_PART
        # (the amax all-reduce's bytes and group are the pipeline rank's: keyed by rank)
        key = (id(pricer), kind, comp, p) if amax else (id(pricer), kind, comp)
        cost = self._part_costs.get(key)
        if cost is None:
            shared = self._shared_for(pricer)
            if shared is not None:
                # (a phase that recomputes nothing is keyed without the recompute fields:
                # one price for every recompute mode)
                if amax:
                    lowerer = self.lowerer
                    group = lowerer._groups(lowerer.representatives[p])["amax"]
                    shared_key = amax_price_key(
                        self._shared_key("part_no_recompute"), kind, comp,
                        lowerer.amax_bytes(p, comp),
                        group_price_key(self.pricer.cost.layout, group))
                elif part_recomputes(part, comp):
                    shared_key = (self._shared_key("part"), kind, comp,
                                  self.lowerer.recompute_of(part), self._part_groups(p))
                else:
                    shared_key = (self._shared_key("part_no_recompute"), kind, comp, None,
                                  self._part_groups(p))
                cost = shared.get(shared_key)
            if cost is None:
                cost = pricer.schedule(self.lowerer.phase_ops(p, part, comp))
                if shared is not None:
                    shared.put(shared_key, cost)
            self._part_costs[key] = cost
        return cost

    def _collective_ns(self, pricer: OpPricer, p: int, what: str, arg: object,
                       build, reads_kernels: bool) -> int | None:
        """Duration of one data-parallel op of rank ``p`` the lowering builds with
        ``build()`` (a bucket's reduction, a layer's parameter gather, whose size
        ``reads_kernels``); None when the lowering issues nothing. Built and priced once
        per plan, and once per :class:`SharedPrices` for the ordinary ranks."""
        key = (id(pricer), p, what, arg)
        if key in self._durations:
            return self._durations[key]
        shared = self._shared_for(pricer)
        if shared is not None:
            # (a gather reads its layer's parameters: the optimizer's fields)
            shared_key = (self._shared_key("groups"),
                          self._shared_key("optimizer") if reads_kernels else None, what, p,
                          arg)
            found = shared.get(shared_key)
            if found is not None:
                self._durations[key] = found[0]
                return found[0]
        op_key = (what, p, arg)
        if op_key not in self._ops:
            self._ops[op_key] = build()
        op = self._ops[op_key]
        duration = None if op is None else pricer.duration_ns(op)
        if shared is not None:
            shared.put(shared_key, (duration,))
        self._durations[key] = duration
        return duration

    def _reduction_ns(self, pricer: OpPricer, p: int, group: str, size: float) -> int | None:
        """Duration of the reduction of one gradient bucket (StepLowerer.reduction_op) on
        rank ``p``; None when nothing is reduced (a data-parallel group of one). Under
        hybrid sharding the replicas' all-reduce follows on the same stream
        (StepLowerer.replica_reduction_op): the two back to back."""
        found = self._collective_ns(pricer, p, "reduce", (group, size),
                                    lambda: self.lowerer.reduction_op(p, group, size), False)
        if found is None or self.plan.dp_replicas == 1:
            return found
        return found + (self._collective_ns(
            pricer, p, "replica", (group, size),
            lambda: self.lowerer.replica_reduction_op(p, group, size), False) or 0)

    def _gather_ns(self, pricer: OpPricer, p: int, layer: int) -> int | None:
        """Duration of ZeRO's parameter gather of a layer (StepLowerer.param_gather_op)
        on rank ``p``, once per layer kind; None when nothing is gathered."""
        return self._collective_ns(pricer, p, "gather", self._flags[layer],
                                   lambda: self.lowerer.param_gather_op(p, layer), True)

    def _optimizer_cost(self, pricer: OpPricer, p: int) -> OpListCost:
        """The optimizer step of rank ``p`` (StepLowerer.optimizer_ops), list-scheduled."""
        shared = self._shared_for(pricer)
        if shared is None:
            return pricer.schedule(self.lowerer.optimizer_ops(p))
        lowerer = self.lowerer
        key = (self._shared_key("optimizer"), self._shared_key("groups"), p,
               optimizer_layers_key(lowerer.model, lowerer.rank_layers(p)),
               lowerer.holds_embedding(p), lowerer.holds_head(p))
        cost = shared.get(key)
        if cost is None:
            cost = pricer.schedule(lowerer.optimizer_ops(p))
            shared.put(key, cost)
        return cost

    def _part_grads(self, part: int | str) -> tuple[float, float] | None:
        """Gradient bytes a part adds to the ``dense`` and ``expert`` buckets
        (StepLowerer.fill_buckets), or None when they are not whole numbers: then the
        buckets are filled kernel by kernel as the lowering does (whole numbers add
        exactly in any grouping, so adding a part's sum is adding its kernels)."""
        kind = _kind(self.lowerer, part)
        if kind in self._grads:
            return self._grads[kind]
        lowerer = self.lowerer
        kernels = lowerer.part_kernels(part)
        found = None
        if type(lowerer.grad_bytes) is int and all(type(k.params) is int for k in kernels):
            scratch: dict[str, float] = {}
            due = dict(lowerer.fill_buckets(kernels, scratch, False))
            found = (due.get("dense", scratch.get("dense", 0.0)),
                     due.get("expert", scratch.get("expert", 0.0)))
        self._grads[kind] = found
        return found

    def _fill(self, part: int | str, pending: dict[str, float], final: bool
              ) -> list[tuple[str, float]]:
        """StepLowerer.fill_buckets of a part's kernels, by its sums when they are whole."""
        grads = self._part_grads(part)
        if grads is None:
            return self.lowerer.fill_buckets(self.lowerer.part_kernels(part), pending, final)
        return fill_by_sums(pending, grads, self.plan.grad_bucket_bytes, final)

    def _pair_cost(self, pricer: OpPricer, p: int, forward_stage: int, backward_stage: int,
                   comp: str) -> OpListCost:
        """An overlapped forward-backward pair, list-scheduled as the lowering
        interleaves it (:meth:`StepLowerer.pair_ops`), priced once per stage pair."""
        key = (id(pricer), "pair", forward_stage, backward_stage, comp)
        cost = self._phase_costs.get(key)
        if cost is None:
            cost = pricer.schedule(self.lowerer.pair_ops(p, forward_stage, backward_stage, comp))
            if cost.host is not None:
                # priced as the pipeline runs it, the CPU ahead (:meth:`_phase_cost`)
                cost = replace(cost, total_ns=cost.host.free_ns,
                               compute_ns=cost.compute_ns - cost.starved_ns, starved_ns=0)
            self._phase_costs[key] = cost
        return cost

    def _work_cost(self, pricer: OpPricer, p: int, actions: Sequence[Action] | dict
                   ) -> OpListCost:
        """Compute and exposed communication of ``actions`` back to back (an overlapped
        pair as one), each kind of action priced once and counted (``actions`` may be
        their counts already, :func:`_action_counts`)."""
        counts = actions if isinstance(actions, dict) else _action_counts(actions)
        total = OpListCost(exposed_ns={})
        for key, count in counts.items():
            cost = (self._pair_cost(pricer, p, *key[1:]) if key[0] == "pair"
                    else self._phase_cost(pricer, p, *key[1:]))
            total.total_ns += cost.total_ns * count
            total.compute_ns += cost.compute_ns * count
            _add(total.exposed_ns, cost.exposed_ns, count)
        return total

    def _rank_costs(self, p: int, timed: tuple | None = None,
                    per_step: OpListCost | None = None) -> _RankCosts:
        """What rank ``p``'s work costs; ``timed``: its tail as the pipeline's timing
        runs it (:meth:`_timed_tail`), else the last micro-batch's backwards back to
        back; ``per_step``: its actions' :meth:`_work_cost` when already priced."""
        pricer = self.stage_pricers.get(p, self.pricer)
        if per_step is None:
            per_step = self._work_cost(pricer, p, self._counts(p))
        gathers, first_gather = self._gathers_ns(pricer, p)
        if timed is not None:
            tail, releases = list(timed[0]), timed[1]
            regather = self._regathers()
            last = self._walk(pricer, p, tail, finish=False, gathers=regather,
                              releases=releases)
            return _RankCosts(per_step, last,
                              self._walk(pricer, p, tail, finish=True, gathers=regather,
                                         releases=releases),
                              gathers, first_gather)
        _, tail = self._rank_actions(p)
        # (with the host, the last backward walked as the finish walks it: from the CPU
        # level, its lead carried, so what the finish adds after it is theirs to differ by)
        last = (self._walk(pricer, p, list(tail), finish=False) if self._hosted
                else self._work_cost(pricer, p, tail))
        return _RankCosts(per_step, last, self._finish_cost(pricer, p, tail), gathers,
                          first_gather)

    def _timed_tail(self, p: int, timing: PipelineTiming) -> tuple | None:
        """Rank ``p``'s last micro-batch's backwards (B, or I and W, through each of its
        stages) as the pipeline's timing runs them (``PipelineTiming.rank_tail``), for
        :meth:`_walk`: ``(actions, releases)``, the releases each action's start and
        then the rank's end, relative to the first action's start. None: not known, or
        one action (then back to back is the timing's order: the 1F1B family's one
        stage per rank). Where two or more are apart (a V's two stages, DualPipe's two
        routes, a W deferred behind other weight passes) the replay reduces the first
        stage's gradients in the gap, while the rank runs other micro-batches' actions or
        waits for a transfer; back to back, the second stage's reductions queued behind
        them (benchmarks/plan_fuzz.py: +3 to +12 % on ZB-V, DualPipe and DualPipe-V).
        Without the host the actions before the first that reduces gradients change
        nothing after it and are left out (ranks with equal signatures then share the
        walk). With ZeRO-3 (:meth:`_regathers`) every action from the first such
        backward on is walked, with its parameter gathers: those issued after a
        reduction wait for it on the data-parallel stream, and their layers for them
        (benchmarks/plan_fuzz.py: ZB-V at one micro-batch -5.7 %, now to the ns)."""
        found = timed_tail_entries(timing, p, self._hosted, self._regathers())
        if found is None:
            return None
        row, releases = found
        lowerer = self.lowerer
        return tuple(Action(stage, comp, lowerer.last_microbatch(stage) - back)
                     for stage, comp, back, _ in row), releases

    def _regathers(self) -> bool:
        """Every action gathers its layers' parameters (ZeRO-3): the tail is walked with
        its gathers (:meth:`_rank_costs`), and with every action from its first
        last-micro-batch backward on, whose gathers queue on the data-parallel stream
        behind the reductions issued before them (the lowering's program order)."""
        return self.lowerer.gathers_params("B", 0)

    def _stage_parts(self, stage: int) -> list[int | str]:
        """Parts of a virtual stage in backward order: head, layers reversed, embedding."""
        placement = self.lowerer.placement
        parts: list[int | str] = ["head"] if placement.is_last(stage) else []
        parts += list(reversed(self.lowerer.stage_layers[stage]))
        parts += [AMAX_PART] if self.lowerer.reduces_amax else []
        return parts + (["embedding"] if placement.is_first(stage) else [])

    def _forward_parts(self, stage: int) -> list[int | str]:
        """Parts of a virtual stage's forward, in order: embedding, layers, the amax
        reduction (StepLowerer._amax_reduction), head."""
        placement, lowerer = self.lowerer.placement, self.lowerer
        parts: list[int | str] = ["embedding"] if placement.is_first(stage) else []
        parts += list(lowerer.stage_layers[stage])
        parts += [AMAX_PART] if lowerer.reduces_amax else []
        return parts + (["head"] if placement.is_last(stage) else [])

    def _finish_cost(self, pricer: OpPricer, p: int, tail: list[Action]) -> OpListCost:
        """The last micro-batch's backward with its gradient buckets reduced on the
        data-parallel stream as they fill, then the optimizer and ZeRO's parameter
        all-gathers."""
        return self._walk(pricer, p, tail, finish=True)

    def _gathers_ns(self, pricer: OpPricer, p: int) -> tuple[int, int]:
        """Parameter gathers on rank ``p`` (StepLowerer.gathers_params): (the step's
        gathers back to back, the first one). They depend on nothing, so the
        data-parallel stream runs them ahead of use from the step's start; compute
        waits for the first, and for the rest only if the stream falls behind: a
        gather-bound rank ends no sooner than all of its step's gathers. ZeRO-3
        gathers in every micro-batch's forward and backward, ZeRO-1/2 with
        overlapped parameter gathers in the first micro-batch's forward only."""
        lowerer = self.lowerer
        if not lowerer.gathers_params("F", 0):  # then no action gathers
            return 0, 0
        work, _ = self._rank_actions(p)
        total = first = 0
        if self.fast:
            for action in work:
                repeats = self._gather_repeats(action.comp, action.stage)
                if repeats:
                    layers = self.lowerer.stage_layers[action.stage]
                    total += self._layers_gather_ns(pricer, p, layers) * repeats
                    for layer in layers if not first else ():
                        first = first or self._kind_gather_ns(pricer, p, layer)
            return total, first
        for action in work:
            repeats = self._gather_repeats(action.comp, action.stage)
            if not repeats:
                continue
            for layer in self.lowerer.stage_layers[action.stage]:
                duration = self._gather_ns(pricer, p, layer) or 0
                first = first or duration
                total += duration * repeats
        return total, first

    def _gather_repeats(self, comp: str, stage: int) -> int:
        """How many of the step's ``comp`` actions of ``stage`` gather their layers'
        parameters (StepLowerer.gathers_params over the micro-batches on its route),
        counted once per (what decides gathering, placement, micro-batches, comp,
        stage) in a module table."""
        found = self._repeats.get((comp, stage))
        if found is not None:
            return found
        if self.fast:
            found = self.lowerer.gathering_microbatches(comp, stage)
        else:
            found = self._gather_repeats_of(comp, stage)
        self._repeats[(comp, stage)] = found
        return found

    def _gather_repeats_of(self, comp: str, stage: int) -> int:
        """:meth:`_gather_repeats` from the module table."""
        lowerer, plan = self.lowerer, self.plan
        placement, m = lowerer.placement, plan.num_microbatches
        # everything StepLowerer.gathers_params reads besides (comp, micro-batch)
        decides = (type(lowerer).gathers_params, plan.shard_dp * plan.cp == 1, plan.zero,
                   lowerer._gather_in_forward())
        key = (decides, placement, m, comp, stage)
        found = _REPEATS.get(key)
        if found is None:
            found = sum(lowerer.gathers_params(comp, j) for j in range(m)
                        if placement.on_route(stage, j))
            if len(_REPEATS) >= 65536:
                _REPEATS.clear()
            _REPEATS[key] = found
        return found

    def _start_gathers_ns(self, p: int) -> int:
        """The parameter gathers rank ``p``'s first action issues at the step's start
        (StepLowerer.gathers_params), back to back: the data-parallel stream runs them
        while the rank waits for its first input, time the replay counts as exposed."""
        lowerer = self.lowerer
        if self.fast:
            plan = self.plan
            first = lowerer.schedule.first_action(p, plan.pp, plan.num_microbatches,
                                                  plan.vpp, lowerer.overlap)
        else:
            first = lowerer.actions()[p][0]
        if not lowerer.gathers_params(first.comp, first.microbatch):
            return 0
        pricer = self.stage_pricers.get(p, self.pricer)
        if self.fast:
            return self._layers_gather_ns(pricer, p, lowerer.stage_layers[first.stage])
        total = 0
        for layer in lowerer.stage_layers[first.stage]:
            total += self._gather_ns(pricer, p, layer) or 0
        return total

    def _kind_gather_ns(self, pricer: OpPricer, p: int, layer: int) -> int:
        """:meth:`_gather_ns` of ``layer`` (0 for nothing), looked up by its kind in a
        per-plan table."""
        key = (id(pricer), p, self._flags[layer])
        found = self._kind_gathers.get(key)
        if found is None:
            found = self._kind_gathers[key] = self._gather_ns(pricer, p, layer) or 0
        return found

    def _layers_gather_ns(self, pricer: OpPricer, p: int, layers: Sequence[int]) -> int:
        """The parameter gathers of ``layers`` on rank ``p`` back to back (whole
        nanoseconds: the sum of :meth:`_gather_ns` in any order), by kind."""
        key = (id(pricer), p, tuple(layers))
        found = self._kind_gathers.get(key)
        if found is None:
            flags, kinds = self._flags, {}
            for layer in layers:
                kind = flags[layer]
                if kind in kinds:
                    kinds[kind][1] += 1
                else:
                    kinds[kind] = [layer, 1]
            found = sum(self._kind_gather_ns(pricer, p, layer) * count
                        for layer, count in kinds.values())
            self._kind_gathers[key] = found
        return found

    def _gather_fill_delay_ns(self, t_p2p: int) -> int:
        """How much later micro-batch 0's forward leaves the last stage because layers
        wait for their parameter gathers (StepLowerer.gathers_params): the forward walks
        the stages in order; each rank's data-parallel stream gathers its layers back to
        back from the step's start (in stage order), and a layer starts no sooner than
        its gather ends. 0 when nothing is gathered."""
        lowerer = self.lowerer
        if not lowerer.gathers_params("F", 0):
            return 0
        placement = lowerer.placement
        if self.fast:
            return self._gather_fill_delay_fast_ns(t_p2p)
        dp_free: dict[int, int] = {}
        gathered: dict[int, int] = {}
        for stage, layers in enumerate(lowerer.stage_layers):
            p = placement.rank_of(stage)
            pricer = self.stage_pricers.get(p, self.pricer)
            for layer in layers:
                dp_free[p] = dp_free.get(p, 0) + (self._gather_ns(pricer, p, layer) or 0)
                gathered[layer] = dp_free[p]
        waiting = free = 0
        last = placement.num_chunks - 1  # micro-batch 0 runs the first route
        for stage in range(last + 1):
            p = placement.rank_of(stage)
            pricer = self.stage_pricers.get(p, self.pricer)
            for part in self._forward_parts(stage):
                if not isinstance(part, str):
                    waiting = max(waiting, gathered[part])
                cost = self._part_cost(pricer, p, part, "F").total_ns
                waiting += cost
                free += cost
            if stage < last and lowerer._crosses(stage, stage + 1):
                waiting += t_p2p
                free += t_p2p
        return waiting - free

    def _gather_fill_delay_fast_ns(self, t_p2p: int) -> int:
        """:meth:`_gather_fill_delay_ns` from per-plan tables (:meth:`_stage_table`,
        :meth:`_kind_gather_ns`): the same sums, each part looked up once per plan."""
        lowerer = self.lowerer
        placement = lowerer.placement
        holders = placement.rank_of_stage
        dp_free: dict[int, int] = {}
        gathered: dict[int, int] = {}
        for stage, layers in enumerate(lowerer.stage_layers):
            p = holders[stage]
            pricer = self.stage_pricers.get(p, self.pricer)
            free = dp_free.get(p, 0)
            for layer in layers:
                free += self._kind_gather_ns(pricer, p, layer)
                gathered[layer] = free
            dp_free[p] = free
        waiting = free = 0
        last = placement.num_chunks - 1  # micro-batch 0 runs the first route
        flags = self._flags
        for stage in range(last + 1):
            p = holders[stage]
            pricer = self.stage_pricers.get(p, self.pricer)
            if stage == 0:
                cost_ns = self._part_cost(pricer, p, "embedding", "F").total_ns
                waiting += cost_ns
                free += cost_ns
            kinds: dict[object, int] = {}  # a layer kind's forward, ns
            for layer in lowerer.stage_layers[stage]:
                kind = _kind(lowerer, layer, flags[layer])
                cost_ns = kinds.get(kind)
                if cost_ns is None:
                    cost_ns = kinds[kind] = self._kind_cost(pricer, p, layer, kind,
                                                            "F").total_ns
                if gathered[layer] > waiting:
                    waiting = gathered[layer]
                waiting += cost_ns
                free += cost_ns
            if lowerer.reduces_amax:
                cost_ns = self._part_cost(pricer, p, AMAX_PART, "F").total_ns
                waiting += cost_ns
                free += cost_ns
            if stage == last:
                cost_ns = self._part_cost(pricer, p, "head", "F").total_ns
                waiting += cost_ns
                free += cost_ns
            if stage < last and lowerer._crosses(stage, stage + 1):
                waiting += t_p2p
                free += t_p2p
        return waiting - free

    def _embedding_forward_ns(self) -> int:
        """The embedding's forward on pipeline rank 0 (before its first layer)."""
        return self._part_cost(self.stage_pricers.get(0, self.pricer), 0, "embedding",
                               "F").total_ns

    def _walk(self, pricer: OpPricer, p: int, actions: list[Action],
              finish: bool, gathers: bool = False,
              releases: Sequence[int] | None = None) -> OpListCost:
        """List schedule of ``actions`` on rank ``p``, part by part in the order the
        lowering issues them: layers and edges run back to back on the compute
        stream (each priced once per kind, :meth:`_part_cost`; their CP exchanges
        end inside them); with ``finish``, the data-parallel stream reduces the
        gradient buckets of the last micro-batch as they fill, then the optimizer
        and ZeRO's parameter all-gathers run. With ``gathers``, ZeRO-3's parameter
        gathers run on the data-parallel stream in issue order (an action's after the
        reductions of the actions before it) and each layer waits for its own: for a
        rank whose actions run back to back (no pipeline) this is the replay's
        schedule exactly.

        Under SM contention the data-parallel collectives hold SMs while they run and
        a part overlapping them is list-scheduled against them (:meth:`_overlapped_cost`).
        The walk is causal, one pass: before a part is priced, the stream runs every
        gather that nothing unknown precedes in its order (those of the next actions,
        up to one that reduces gradients, whose reductions are issued only as its
        parts are walked), so every interval that starts before the part ends is known
        (a reduction is issued at a part's end, and what follows it on the stream no
        earlier). A gather that would start before the part being walked when its
        action's turn came (the stream ran it behind a reduction the walk expected but
        that issued nothing) makes the result inexact: ``self.inexact`` is set and the
        event engine is the reference (:func:`analytic_step` callers, tests).

        ``releases`` (:meth:`_timed_tail`): no action starts before its entry (the
        compute stream idles, or runs other actions, until then; the CPU goes on
        issuing), and the compute ends no sooner than the last entry."""
        lowerer, plan = self.lowerer, self.plan
        cost = OpListCost(exposed_ns={})
        dp_free = 0
        # SM contention: the data-parallel stream's collectives (begin, end, CTAs), which
        # the parts they overlap are list-scheduled against (OpPricer.schedule)
        contention = pricer.max_ctas is not None
        dp_busy: list[tuple[int, int, int]] = []

        def on_dp_stream_ns(duration: int | None, ready_ns: int, ctas: int = 0) -> int:
            nonlocal dp_free
            if duration is not None:
                begin = max(dp_free, ready_ns)
                dp_free = begin + duration
                if ctas and duration:
                    dp_busy.append((begin, dp_free, ctas))
            return dp_free

        def reduce(due: list[tuple[str, float]]) -> None:
            for group, size in due:
                on_dp_stream_ns(self._reduction_ns(pricer, p, group, size), cost.total_ns,
                                self._dp_ctas(pricer, p, "reduce", (group, size)))

        pending: dict[int, dict[str, float]] = {}
        used: dict[int, tuple[OpListCost, int]] = {}  # part costs with exposed time, count
        placement = lowerer.placement
        if self.fast and not gathers and not contention:
            # the same walk from per-plan tables of each stage's parts
            dp_free = self._walk_parts(pricer, p, actions, finish, cost, pending, used,
                                       releases=releases)
            actions_left: Sequence[Action] = ()
        else:
            actions_left = actions
        # the data-parallel stream's gathers in issue order: an action's layers at its
        # start, after the reductions of the actions before it (those that reduce)
        plans = []
        for action in actions_left:
            stage, comp = action.stage, action.comp
            layers = list(lowerer.stage_layers[stage])
            if comp != "F":
                layers.reverse()
            # (an action's gathers are issued at its first layer: after the reductions
            # of the edges before it, the head's in a backward)
            lead = (int(placement.is_first(stage)) if comp == "F"
                    else int(placement.is_last(stage)))
            plans.append((layers if gathers and lowerer.gathers_params(comp, action.microbatch)
                          else None,
                          finish and comp in ("B", "W") and plan.overlap_grad_reduce
                          and lowerer.reduces_grads(stage, action.microbatch), lead))
        gathered: dict[int, dict[int, int]] = {}  # action -> its layers' gather ends
        next_gather = live = 0

        def parts_of(action: Action) -> list[int | str]:
            if action.comp == "F":
                return self._forward_parts(action.stage)
            return self._stage_parts(action.stage)

        # Under SM contention with gathers, the buckets each part fills are found first
        # (they depend on bytes only, not on time): a gather waits on the stream only
        # behind reductions that are issued, and after[j][i] says whether action j
        # issues any from its part i on
        dues: list[list | None] | None = None
        after: list[list[bool] | None] = []
        if contention and gathers:
            dues, scratch = [], {}
            for position, action in enumerate(actions_left):
                if not plans[position][1]:
                    dues.append(None)
                    after.append(None)
                    continue
                parts = parts_of(action)
                grads = scratch.setdefault(action.stage, {})
                due = [self._fill(part, grads, index == len(parts) - 1)
                       for index, part in enumerate(parts)]
                flags = [False] * (len(due) + 1)
                for index in range(len(due) - 1, -1, -1):
                    flags[index] = flags[index + 1] or bool(due[index])
                dues.append(due)
                after.append(flags)

        def reduces_from(j: int, index: int, stop: int | None = None) -> bool:
            """Action ``j`` issues reductions from its part ``index`` (to ``stop``)."""
            if dues is None:
                return plans[j][1] and (stop is None or index < stop)
            flags = after[j]
            if flags is None:
                return False
            if stop is None:
                return flags[index]
            return any(dues[j][index:stop])

        def run_gathers(current: int, walked: int) -> None:
            """Issue every gather the stream reaches before part ``walked`` of action
            ``current``."""
            nonlocal next_gather
            while next_gather < len(plans):
                k = next_gather
                if any(reduces_from(j, walked if j == current else 0)
                       for j in range(current, k)):
                    return  # behind a reduction not issued yet
                if (k >= current and plans[k][2]
                        and reduces_from(k, walked if k == current else 0, plans[k][2])):
                    return  # behind its own edge's reductions, not issued yet
                # (k < current: walked, its edge's reductions issued; an action with no
                # layer, e.g. the head alone on an empty last stage, never reaches a
                # part past its edge, and blocked every later gather)
                layers = plans[k][0]
                if layers:
                    first = len(dp_busy)
                    gathered[k] = {layer: on_dp_stream_ns(
                        self._gather_ns(pricer, p, layer), 0,
                        self._dp_ctas(pricer, p, "gather", layer)) for layer in layers}
                    if contention and any(b < cost.total_ns for b, _, _ in dp_busy[first:]):
                        self.inexact = True  # overlaps compute already walked
                next_gather += 1

        for position, action in enumerate(actions_left):
            stage, comp = action.stage, action.comp
            if releases is not None and releases[position] > cost.total_ns:
                cost.lead_ns += releases[position] - cost.total_ns
                cost.total_ns = releases[position]
            run_gathers(position, 0)
            if (self.fast and not lowerer.gathers_params(comp, action.microbatch)
                    and not (contention and (plans[position][1] or dp_busy
                                             and dp_busy[-1][1] > cost.total_ns))):
                # (an action that gathers nothing, and under SM contention reduces
                # nothing and runs beside no data-parallel collective: from the tables)
                dp_free = self._walk_parts(pricer, p, (action,), finish, cost, pending, used,
                                           dp_free)
                continue
            parts = parts_of(action)
            reduce_now = plans[position][1]
            grads = pending.setdefault(stage, {})
            for index, part in enumerate(parts):
                run_gathers(position, index)
                if position in gathered and not isinstance(part, str):
                    wait = gathered[position][part] - cost.total_ns
                    if wait > 0:  # the layer waits for its parameters
                        cost.exposed_ns["dp"] = cost.exposed_ns.get("dp", 0) + wait
                        cost.total_ns += wait
                        cost.lead_ns += wait  # (the CPU goes on issuing)
                part_cost = self._part_cost(pricer, p, part, comp)
                if contention and dp_busy and dp_busy[-1][1] > cost.total_ns:
                    while dp_busy[live][1] <= cost.total_ns:
                        live += 1  # (ends ascend: those over are over for good)
                    part_cost = self._overlapped_cost(pricer, p, part, comp, part_cost,
                                                      cost.total_ns, dp_busy, live)
                if self._hosted:  # from the CPU's lead (sim.host_lead)
                    form = part_cost.form()
                    cost.total_ns += form.total_at(cost.lead_ns)
                    cost.lead_ns = form.lead_after(cost.lead_ns)
                    cost.compute_ns += part_cost.compute_ns - part_cost.starved_ns
                else:
                    cost.total_ns += part_cost.total_ns
                    cost.compute_ns += part_cost.compute_ns
                if part_cost.exposed_ns:
                    used[id(part_cost)] = (part_cost, used.get(id(part_cost), (0, 0))[1] + 1)
                if reduce_now and dues is not None:
                    reduce(dues[position][index])  # (filled above)
                elif reduce_now:
                    # the stage's last backward part flushes its partly filled buckets
                    final = index == len(parts) - 1
                    reduce(self._fill(part, grads, final))
            gathered.pop(position, None)
        if actions_left and releases is not None and releases[-1] > cost.total_ns:
            cost.total_ns = releases[-1]
        for part_cost, count in used.values():
            _add(cost.exposed_ns, part_cost.exposed_ns, count)
        if not finish:
            return cost
        if not plan.overlap_grad_reduce:
            for stage in sorted({a.stage for a in actions}):
                reduce(lowerer.fill_buckets([k for part in reversed(self._stage_parts(stage))
                                             for k in lowerer.part_kernels(part)], {}, True))
        compute_end = cost.total_ns
        if dp_free > compute_end:
            cost.exposed_ns["dp"] = cost.exposed_ns.get("dp", 0) + dp_free - compute_end
        optimizer = self._optimizer_cost(pricer, p)
        optimizer_ns = optimizer.total_ns
        if self._hosted:
            # the CPU issues the optimizer ahead by its lead, and goes on while the GPU
            # waits for the last reductions (lead_ns: the optimizer's lead-in from here)
            cost.lead_ns += dp_free - compute_end if dp_free > compute_end else 0
            optimizer_ns = optimizer.form().total_at(cost.lead_ns)
        cost.total_ns = max(compute_end, dp_free) + optimizer_ns
        cost.optimizer_ns = optimizer.optimizer_ns
        # compute kernels of the optimizer step that are not Adam's (the per-step FP8 weight
        # quantization): compute, as the replay's breakdown counts them (sim.breakdown)
        cost.compute_ns += optimizer.compute_ns - optimizer.starved_ns
        _add(cost.exposed_ns, optimizer.exposed_ns)
        return cost

    def _dp_ctas(self, pricer: OpPricer, p: int, what: str, arg: object) -> int:
        """SMs a data-parallel collective of rank ``p`` holds (``what``: ``reduce`` of a
        (group, size) bucket, ``gather`` of a layer), 0 without SM contention."""
        if pricer.max_ctas is None:
            return 0
        key = (id(pricer), p, what, arg, "ctas")
        found = self._durations.get(key)
        if found is None:
            if what == "reduce":
                op_key = (what, p, arg)
                build = lambda: self.lowerer.reduction_op(p, *arg)  # noqa: E731
            else:
                op_key = (what, p, self._flags[arg])
                build = lambda: self.lowerer.param_gather_op(p, arg)  # noqa: E731
            if op_key not in self._ops:
                self._ops[op_key] = build()
            op = self._ops[op_key]
            found = self._durations[key] = 0 if op is None else pricer.ctas(op)
        return found

    def _overlapped_cost(self, pricer: OpPricer, p: int, part: int | str, comp: str,
                         alone: OpListCost, start_ns: int,
                         dp_busy: Sequence[tuple[int, int, int]], first: int = 0
                         ) -> OpListCost:
        """List schedule of ``part`` starting at ``start_ns`` while the data-parallel
        collectives ``dp_busy[first:]`` (one stream: begins and ends ascending) hold SMs
        (OpPricer.schedule's ``external``); ``alone`` when none overlaps it. Intervals
        are clipped to the most the part can last (every SM but one taken:
        ``alone * sms``), so parts overlapped the same way share one price per (kind,
        phase, overlap)."""
        kind = _kind(self.lowerer, part)
        limit = alone.total_ns * pricer.sms
        external = []
        for index in range(first, len(dp_busy)):
            begin, end, ctas = dp_busy[index]
            if begin - start_ns >= limit:
                break
            if end > start_ns:
                external.append((max(begin - start_ns, 0), min(end - start_ns, limit), ctas))
        if not external:
            return alone
        key = (id(pricer), kind, comp, tuple(external))
        found = self._part_costs.get(key)
        if found is None:
            found = pricer.schedule(self.lowerer.phase_ops(p, part, comp), external)
            self._part_costs[key] = found
        return found

    def _stage_table(self, pricer: OpPricer, p: int, stage: int, comp: str) -> tuple:
        """The parts of one virtual stage's ``comp`` in the order the lowering runs them
        (forward: embedding, layers, head; else head, layers reversed, embedding), each
        as (its list schedule :meth:`_part_cost`, the part, its whole gradient bytes
        :meth:`_part_grads` or None), once per plan."""
        key = (id(pricer), stage, comp)
        table = self._tables.get(key)
        if table is None:
            lowerer, placement = self.lowerer, self.lowerer.placement
            if comp == "F":
                parts = self._forward_parts(stage)
            else:
                parts = self._stage_parts(stage)
            flags, by_kind, rows = self._flags, {}, []
            for part in parts:
                kind = _kind(lowerer, part, None if isinstance(part, str) else flags[part])
                entry = by_kind.get(kind)
                if entry is None:
                    entry = by_kind[kind] = (self._kind_cost(pricer, p, part, kind, comp),
                                             self._part_grads(part))
                rows.append((entry[0], part, entry[1]))
            table = tuple(rows)
            self._tables[key] = table
        return table

    def _walk_parts(self, pricer: OpPricer, p: int, actions: Sequence[Action], finish: bool,
                    cost: OpListCost, pending: dict[int, dict[str, float]],
                    used: dict[int, tuple[OpListCost, int]], dp_free: int = 0,
                    releases: Sequence[int] | None = None) -> int:
        """:meth:`_walk`'s loop over ``actions`` without parameter gathers, from
        :meth:`_stage_table` (each part looked up once per plan, bucket fills by whole
        part sums, each bucket's reduction priced once per size; an action that reduces
        nothing adds its stage's sums at once, whole nanoseconds): adds to ``cost``,
        ``pending`` and ``used`` what the loop adds; returns where the data-parallel
        stream ends (``dp_free`` where it ends before); ``releases`` as :meth:`_walk`'s."""
        lowerer, plan = self.lowerer, self.plan
        bucket, overlap = plan.grad_bucket_bytes, plan.overlap_grad_reduce
        total = cost.total_ns
        compute = cost.compute_ns
        hosted, lead = self._hosted, cost.lead_ns
        reductions: dict[tuple[str, float], int | None] = {}
        for position, action in enumerate(actions):
            stage, comp = action.stage, action.comp
            if releases is not None and releases[position] > total:
                lead += releases[position] - total  # (the CPU goes on issuing)
                total = releases[position]
            reduce_now = (finish and comp in ("B", "W") and overlap
                          and lowerer.reduces_grads(stage, action.microbatch))
            grads = pending.setdefault(stage, {})
            if not reduce_now:
                # the parts' sums, kind by kind (whole ns): _phase_cost, whose exposed
                # time is that of its parts times their counts
                phase = self._phase_cost(pricer, p, stage, comp)
                if hosted:  # the parts back to back from the CPU's lead (their form)
                    total += phase.host.total_at(lead)
                    lead = phase.host.lead_after(lead)
                else:
                    total += phase.total_ns
                compute += phase.compute_ns
                if phase.exposed_ns:
                    used[id(phase)] = (phase, used.get(id(phase), (0, 0))[1] + 1)
                continue
            table = self._stage_table(pricer, p, stage, comp)
            last = len(table) - 1
            for index, (part_cost, part, sums) in enumerate(table):
                if hosted:
                    form = part_cost.form()
                    total += form.total_at(lead)
                    lead = form.lead_after(lead)
                    compute += part_cost.compute_ns - part_cost.starved_ns
                else:
                    total += part_cost.total_ns
                    compute += part_cost.compute_ns
                if part_cost.exposed_ns:
                    used[id(part_cost)] = (part_cost, used.get(id(part_cost), (0, 0))[1] + 1)
                if not reduce_now:
                    continue
                final = index == last
                if sums is None:
                    due = lowerer.fill_buckets(lowerer.part_kernels(part), grads, final)
                else:
                    due = fill_by_sums(grads, sums, bucket, final)
                for due_bucket in due:
                    if due_bucket in reductions:
                        duration = reductions[due_bucket]
                    else:
                        duration = reductions[due_bucket] = self._reduction_ns(
                            pricer, p, *due_bucket)
                    if duration is not None:
                        dp_free = (dp_free if dp_free > total else total) + duration
        if releases is not None and releases[-1] > total:
            total = releases[-1]
        cost.total_ns, cost.compute_ns, cost.lead_ns = total, compute, lead
        return dp_free

    def run(self) -> AnalyticStep:
        """The step's time, per-rank ends and breakdown."""
        plan = self.plan
        pp = plan.pp
        reps = self.lowerer.representatives
        t_p2p = (self.pricer.p2p_ns(reps[0], reps[1], int(self.lowerer.pp_message_bytes))
                 if pp > 1 else 0)
        if pp == 1 and (self.lowerer.gathers_params("F", 0)
                        or plan.grad_reduce_every_microbatch):
            return self._whole_rank_step()
        warmups = self._gather_walk_warmups()
        if warmups is not None:
            return self._gathered_step(warmups, t_p2p)
        # each distinct rank's actions priced first, in rank order: the first rank to
        # price a part's kind stands for it (_kind_cost), before the timing asks each
        # stage's holder
        signatures = [self._signature(p) for p in range(pp)]
        per_step: dict[tuple, OpListCost] = {}
        for p, signature in enumerate(signatures):
            if signature not in per_step:
                per_step[signature] = self._work_cost(self.stage_pricers.get(p, self.pricer),
                                                      p, self._counts(p))
        timing = self._pipeline_timing(self._hop_prices(t_p2p))
        by_signature: dict[tuple, _RankCosts] = {}
        ranks = []
        for p, signature in enumerate(signatures):
            timed = self._timed_tail(p, timing)
            if (signature, timed) not in by_signature:
                by_signature[(signature, timed)] = self._rank_costs(p, timed,
                                                                    per_step[signature])
            ranks.append(by_signature[(signature, timed)])
        # layers of the first micro-batch wait for their parameters (ZeRO-3, overlapped
        # ZeRO-1/2 gathers): the pipeline's fill is that much later
        first_wait = self._gather_fill_delay_ns(t_p2p)
        compute_ends, leads, fill = timing.rank_end, None, first_wait
        if self._hosted:
            # (the gather waits delay the pipeline's timing; a rank that runs at its CPU's
            # pace issues through them)
            compute_ends, leads = self._host_ends([end + first_wait for end in timing.rank_end],
                                                  t_p2p, first_wait)
            fill = 0
        ends = []
        for p, (rank, compute_end) in enumerate(zip(ranks, compute_ends)):
            after_backward = rank.finish.total_ns - rank.last_backward.total_ns
            if leads is not None and leads[p] > rank.last_backward.lead_ns:
                # the CPU is further ahead at the rank's end than its last backward alone
                # from no lead leaves it (it issued through the waits): the optimizer
                # runs from that much more lead
                optimizer = self._optimizer_cost(self.stage_pricers.get(p, self.pricer),
                                                 p).form()
                more = leads[p] - rank.last_backward.lead_ns
                after_backward -= (optimizer.total_at(rank.finish.lead_ns)
                                   - optimizer.total_at(rank.finish.lead_ns + more))
            # a gather-bound rank ends no sooner than its gathers, then what
            # follows the last backward (reductions, optimizer)
            ends.append(max(compute_end + fill, rank.gathers_ns) + after_backward)
        step_ns = max(ends)
        starts = timing.rank_start or (0,) * pp
        waits = timing.rank_comm_wait or (2 * (pp - 1) * t_p2p,) + (0,) * (pp - 1)
        breakdown = {p: self._breakdown(rank, step_ns, waits[p],
                                        first_wait if p == 0
                                        else min(starts[p], self._start_gathers_ns(p)))
                     for p, rank in enumerate(ranks)}
        critical = critical_rank(breakdown, step_ns / 1e9)
        pricers = [self.pricer, *self.stage_pricers.values()]
        return AnalyticStep(step_ns=step_ns, rank_end_ns=ends, breakdown_s=breakdown,
                            critical=critical, ops_priced=sum(p.ops_scheduled for p in pricers),
                            exact=not self.inexact)

    def _gather_walk_warmups(self) -> list[int] | None:
        """Each rank's warm-up forwards when the step is walked unit by unit with its
        ZeRO-3 gathers (:meth:`_gathered_step`): ZeRO-3 over a data-parallel group, a
        1F1B-family schedule the family's recurrence times (GPipe, 1F1B, interleaved;
        :func:`strategies.schedules.base.family_warmups`), gradients reduced as they fill
        at the last micro-batch, no SM contention, no CPU issue cost; else None (the
        bound of :meth:`run`)."""
        plan, lowerer = self.plan, self.lowerer
        if (plan.zero != 3 or plan.pp < 2 or type(lowerer) is not StepLowerer
                or not lowerer.gathers_params("F", 0) or self._hosted or lowerer.overlap
                or not plan.overlap_grad_reduce or plan.grad_reduce_every_microbatch
                or any(pricer.max_ctas is not None
                       for pricer in (self.pricer, *self.stage_pricers.values()))):
            return None
        return family_warmups(lowerer.schedule, plan.pp, plan.num_microbatches, plan.vpp)

    def _gather_walker(self, p: int) -> GatherWalker:
        """Rank ``p``'s :class:`GatherWalker`: each of its chunks' forward and backward
        as its parts' list schedules (:meth:`_stage_table`, in the lowering's order) with
        each layer's gather (:meth:`_kind_gather_ns`)."""
        lowerer, plan = self.lowerer, self.plan
        pricer = self.stage_pricers.get(p, self.pricer)
        rows = {}
        for chunk in range(plan.vpp):
            stage = chunk * plan.pp + p
            for comp in ("F", "B"):
                rows[(comp == "F", chunk)] = tuple(
                    (cost.total_ns,
                     0 if isinstance(part, str) else self._kind_gather_ns(pricer, p, part),
                     1, sums, part)
                    for cost, part, sums in self._stage_table(pricer, p, stage, comp))
        return GatherWalker(
            rows, lambda group, size: self._reduction_ns(pricer, p, group, size),
            lambda part, pending, final: lowerer.fill_buckets(lowerer.part_kernels(part),
                                                              pending, final),
            plan.grad_bucket_bytes)

    def _gathered_step(self, warmups: Sequence[int], t_p2p: int) -> AnalyticStep:
        """The step of a ZeRO-3 1F1B-family pipeline as the replay runs it: the family's
        recurrence (:func:`strategies.pipeline.one_f_one_b_family_walk`) with each
        rank's units ending where its layers' gathers let them (:class:`GatherWalker`:
        the data-parallel stream in program order, gathers behind the reductions
        issued before them); a rank ends when its compute and its stream have, then
        runs the optimizer."""
        plan = self.plan
        # each distinct rank's actions priced first, in rank order, as run() does: the
        # first rank to price a part's kind stands for it (_kind_cost)
        per_step: dict[tuple, OpListCost] = {}
        signatures = [self._signature(p) for p in range(plan.pp)]
        for p, signature in enumerate(signatures):
            if signature not in per_step:
                per_step[signature] = self._work_cost(self.stage_pricers.get(p, self.pricer),
                                                      p, self._counts(p))
        walkers = [self._gather_walker(p) for p in range(plan.pp)]
        walk = one_f_one_b_family_walk(plan.pp, plan.num_microbatches, plan.vpp, warmups,
                                       t_p2p, walkers)
        ends, ranks = [], []
        for p, (compute_end, dp_end) in enumerate(zip(walk.rank_end, walk.stream_end)):
            pricer = self.stage_pricers.get(p, self.pricer)
            optimizer = self._optimizer_cost(pricer, p)
            exposed = {"dp": max(dp_end - compute_end, 0)}
            _add(exposed, optimizer.exposed_ns)
            finish = OpListCost(total_ns=max(compute_end, dp_end) + optimizer.total_ns,
                                compute_ns=optimizer.compute_ns - optimizer.starved_ns,
                                optimizer_ns=optimizer.optimizer_ns, exposed_ns=exposed)
            ends.append(finish.total_ns)
            ranks.append(_RankCosts(per_step[signatures[p]], OpListCost(exposed_ns={}),
                                    finish))
        step_ns = max(ends)
        breakdown = {p: self._breakdown(rank, step_ns, walk.rank_comm_wait[p],
                                        walk.gather_wait[p])
                     for p, rank in enumerate(ranks)}
        pricers = [self.pricer, *self.stage_pricers.values()]
        return AnalyticStep(step_ns=step_ns, rank_end_ns=ends, breakdown_s=breakdown,
                            critical=critical_rank(breakdown, step_ns / 1e9),
                            ops_priced=sum(p.ops_scheduled for p in pricers))

    def _host_ends(self, rank_end: Sequence[int], t_p2p: int, wait_ns: int = 0
                   ) -> tuple[list[int], list[int]]:
        """When each pipeline rank's compute ends with the CPU issuing its kernels: the
        schedule's timing ``rank_end`` prices every action with the CPU ahead
        (:meth:`_phase_cost`); three bounds of the replay's add what the CPU costs
        (:mod:`sim.host_lead`):

        * the step starts with the CPU level (``wait_ns``: the GPU waiting that long
          for the first layers' parameter gathers, the CPU issuing meanwhile, the
          pipeline's fill delay :meth:`_gather_fill_delay_ns`, already in ``rank_end``):
          rank 0's first action runs from no lead,
          later than with one, and the pipeline's fill with it (every rank's end);
        * a rank ends no sooner than its action list back to back from the CPU's start
          (the composition of its actions' forms, started level): a rank whose CPU is
          the bottleneck issues through the pipeline's waits, and its actions then run
          at the CPU's pace;
        * a rank whose last action waits for another rank's last action (the last
          micro-batch's backward from the stage after its own) ends no sooner than
          that one's end, the transfer and its own action with the CPU ahead.

        Exact where the CPU binds nothing (GPU-bound ranks: the timing's) and where a
        rank's CPU does (its list back to back); between the two, a lower bound of the
        replay's (tests/test_host_pipeline.py bounds the gap). Also returns how far
        ahead each rank's CPU is when its compute ends (its end less its CPU's end, the
        list issued back to back: exact without a ``host_sync``, whose waits only make
        the CPU later)."""
        lowerer = self.lowerer
        rows = lowerer.actions()
        forms: dict[tuple, HostForm] = {}

        def form_of(p: int, row: Sequence[Action], index: int) -> HostForm:
            action = row[index]
            pricer = self.stage_pricers.get(p, self.pricer)
            if action.overlap:
                forward, backward = ((action, row[index + 1]) if action.comp == "F"
                                     else (row[index + 1], action))
                key = (p, "pair", forward.stage, backward.stage)
                found = forms.get(key)
                if found is None:
                    found = forms[key] = self._pair_cost(
                        pricer, p, forward.stage, backward.stage, backward.comp).form()
                return found
            key = (p, action.stage, action.comp)
            found = forms.get(key)
            if found is None:
                found = forms[key] = self._phase_cost(pricer, p, action.stage,
                                                      action.comp).form()
            return found

        ends = list(rank_end)
        cpu_ends: list[int] = []  # each rank's CPU end, its list issued back to back
        first = form_of(0, rows[0], 0) if rows and rows[0] else LEVEL
        late = first.total_ns - first.free_ns  # rank 0's first action, from no lead
        for p, row in enumerate(rows):
            if lowerer.overlap or lowerer.schedule.pairs_own_actions:  # (pairs: one form)
                alone, index = LEVEL, 0
                while index < len(row):
                    alone = alone.then(form_of(p, row, index))
                    index += 2 if row[index].overlap else 1
            else:
                alone = self._row_form(p, row, form_of)
            if wait_ns:  # the GPU first waits for the parameter gathers, the CPU issuing
                alone = HostForm(wait_ns, wait_ns, None, 0).then(alone)
            ends[p] = max(ends[p] + late, alone.total_ns)
            cpu_ends.append(alone.host_ns)
        # each rank's last action that waits for another rank's: no sooner than that
        # one's end, the transfer and the rest of this rank's list with the CPU ahead;
        # that one's end is its rank's end less what its rank ran after it (at most that
        # run from no lead), when nothing after it waits for a third rank; to a fixed
        # point (the last micro-batch's backward, from the last stage down)
        lasts = [last_wait(self.lowerer.placement, p, row, rows) for p, row in enumerate(rows)]
        waits = []
        for p, row in enumerate(rows):
            found = lasts[p]
            if found is not None:
                index, holder, position = found
                if lasts[holder] is not None and position < lasts[holder][0]:
                    continue  # (its rank waits for others after it: its end says little)
                tail = LEVEL
                for offset in range(index, len(row)):
                    tail = tail.then(form_of(p, row, offset))
                after = LEVEL
                for offset in range(position + 1, len(rows[holder])):
                    after = after.then(form_of(holder, rows[holder], offset))
                waits.append((p, holder, tail.free_ns - after.total_ns + t_p2p))
        settle_rank_ends(ends, waits)
        return ends, [max(end - cpu, 0) for end, cpu in zip(ends, cpu_ends)]

    def _row_form(self, p: int, row: Sequence[Action], form_of) -> HostForm:
        """The form of rank ``p``'s action list ``row`` (no overlapped pairs) back to
        back: runs of a repeated block of actions (a schedule's warm-up forwards, its
        steady state's forward-backward cycles) composed as one power of the block's
        form (:meth:`sim.host_lead.HostForm.repeat`: the same integers as composing
        them one by one, in O(log) compositions)."""
        keys = [(action.stage, action.comp) for action in row]
        longest = 2 * len(self.lowerer.placement.stages_of(p)) + 2  # block lengths tried
        blocks: dict[tuple, HostForm] = {}
        form, index = LEVEL, 0
        for key, count in repeated_blocks(keys, longest):
            found = blocks.get(key)
            if found is None:
                found = LEVEL
                for offset in range(len(key)):
                    found = found.then(form_of(p, row, index + offset))
                blocks[key] = found
            form = form.then(found.repeat(count))
            index += len(key) * count
        return form

    def _whole_rank_step(self) -> AnalyticStep:
        """Without pipeline parallelism the step is one rank's list schedule: every
        action in order, ZeRO-3's gathers prefetched across them and, with
        ``grad_reduce_every_microbatch``, every micro-batch's gradient buckets reduced as
        they fill (O(m * layers))."""
        pricer = self.stage_pricers.get(0, self.pricer)
        actions = list(self.lowerer.actions()[0])
        cost = self._walk(pricer, 0, actions, finish=True, gathers=True)
        row = {"compute": cost.compute_ns / 1e9, "optimizer": cost.optimizer_ns / 1e9}
        for axis in AXES_IN_ORDER:
            row[f"exposed_{axis}"] = cost.exposed_ns.get(axis, 0) / 1e9
        row["bubble"] = max(cost.total_ns - cost.compute_ns - cost.optimizer_ns
                            - sum(cost.exposed_ns.values()), 0) / 1e9
        return AnalyticStep(step_ns=cost.total_ns, rank_end_ns=[cost.total_ns],
                            breakdown_s={0: row}, critical=0, ops_priced=pricer.ops_scheduled,
                            exact=not self.inexact)

    def _hop_prices(self, t_p2p: int) -> int | dict[tuple[int, int], int]:
        """The pipeline's transfer price for the schedule's timing: ``t_p2p`` (rank 0 to
        rank 1) for every hop, or, where the schedule prices each hop
        (``PipelineSchedule.prices_each_hop``) and its hops differ (some cross nodes, the
        others not), each pair of ranks' (both ways) as the event engine prices the
        transfer between their representatives."""
        lowerer = self.lowerer
        return hop_prices(lowerer.schedule, lowerer.placement, lowerer.representatives,
                          int(lowerer.pp_message_bytes), self.pricer.p2p_ns, t_p2p)

    def _pipeline_timing(self, t_p2p: int | dict[tuple[int, int], int]) -> PipelineTiming:
        """When each pipeline rank's compute ends: the schedule's own timing
        (:meth:`strategies.schedules.PipelineSchedule.timing`, its closed form or an
        exact replay of its actions) with each virtual stage's forward, backward and
        weight-gradient time for one micro-batch, priced on the rank that holds it."""
        plan, lowerer = self.plan, self.lowerer
        schedule, placement = lowerer.schedule, lowerer.placement
        pairs: dict[tuple[int, int], int] = {}
        if self.fast:
            for p in range(plan.pp):
                for key in self._counts(p):
                    if key[0] == "pair" and key[1:3] not in pairs:
                        holder = placement.rank_of(key[1])
                        pricer = self.stage_pricers.get(holder, self.pricer)
                        pairs[key[1:3]] = self._pair_cost(pricer, holder, *key[1:]).total_ns
        for row in () if self.fast else lowerer.actions():
            for first, second in zip(row, row[1:]):
                if first.overlap:
                    forward, backward = (first, second) if first.comp == "F" else (second, first)
                    if (forward.stage, backward.stage) not in pairs:
                        p = placement.rank_of(forward.stage)
                        pricer = self.stage_pricers.get(p, self.pricer)
                        pairs[(forward.stage, backward.stage)] = self._pair_cost(
                            pricer, p, forward.stage, backward.stage, backward.comp).total_ns
        durations: dict[str, list[int]] = {"F": [], "B": [], "W": [], "I": []}
        for stage in range(lowerer.num_stages):
            p = placement.rank_of(stage)
            pricer = self.stage_pricers.get(p, self.pricer)
            durations["F"].append(self._phase_cost(pricer, p, stage, "F").total_ns)
            durations["B"].append(self._phase_cost(pricer, p, stage, "B").total_ns)
            if schedule.split_backward:
                weight = self._phase_cost(pricer, p, stage, "W").total_ns
                durations["W"].append(weight)
                durations["I"].append(self._phase_cost(pricer, p, stage, "I").total_ns)
                # (a full backward is at least its weight part)
                durations["B"][-1] = max(durations["B"][-1], weight)
        args = (plan.pp, plan.num_microbatches, plan.vpp, durations["F"], durations["B"],
                durations["W"] or None, t_p2p)
        if not pairs and not schedule.split_backward:
            return schedule.timing(*args)  # (a schedule's own timing may predate the rest)
        return schedule.timing(*args, t_fb=pairs or None, overlap=lowerer.overlap,
                               t_i=durations["I"] or None)

    @staticmethod
    def _breakdown(rank: _RankCosts, step_ns: int, p2p_ns: int,
                   gather_wait_ns: int) -> dict[str, float]:
        """Seconds per category: the rank's actions, plus what finishing the step adds
        (reduction, optimizer, parameter all-gather) beyond the last backward."""
        exposed: dict[str, int] = {"dp": gather_wait_ns}
        _add(exposed, rank.per_step.exposed_ns)
        _add(exposed, rank.finish.exposed_ns)
        _add(exposed, rank.last_backward.exposed_ns, -1)
        exposed["pp"] = exposed.get("pp", 0) + p2p_ns
        # what finishing the step computes besides Adam (the FP8 weight quantization),
        # and the last backward's compute as it ran beside the reductions (slower under
        # SM contention, else the same)
        compute = (rank.per_step.compute_ns + rank.finish.compute_ns
                   - rank.last_backward.compute_ns)
        row = {"compute": compute / 1e9, "optimizer": rank.finish.optimizer_ns / 1e9}
        for axis in AXES_IN_ORDER:
            row[f"exposed_{axis}"] = exposed.get(axis, 0) / 1e9
        busy = compute + rank.finish.optimizer_ns + sum(exposed.get(a, 0) for a in AXES_IN_ORDER)
        row["bubble"] = max(step_ns - busy, 0) / 1e9
        return row


def contention_closed_form(plan: ParallelPlan) -> bool:
    """Whether the closed form prices ``plan``'s SM contention (``comm_sm_contention``)
    as the event engine runs it, as far as the plan alone tells: always without
    contention; with it, not for schedules that pair a forward with a backward
    (DualPipe: the pair's collectives and the other direction's pipeline transfers
    overlap each other's compute in ways the per-stage prices do not see; the engine
    measured 29 % apart on tests/test_fidelity.py's DualPipe case). Pipelines otherwise
    stay the usual approximation: the closed form does not let pipeline send/recvs take
    SMs (tests/test_contention.py bounds it)."""
    if plan_contention(plan) is None:
        return True
    if plan.dp_replicas > 1:
        # (hybrid sharding: each bucket's reduce-scatter and replica all-reduce hold
        # different SMs; the walk prices one interval per bucket)
        return False
    from strategies.schedules import get_schedule  # (the module imports this one's users)
    return not get_schedule(plan.schedule).pairs_own_actions


def plan_contention(plan: ParallelPlan) -> int | None:
    """The SM-contention setting of ``plan`` for :class:`OpPricer` and
    :class:`sim.engine.Engine`: None when ``comm_sm_contention`` is off, else the most
    CTAs an NCCL kernel holds (``nccl_max_ctas``; 0: NCCL's default)."""
    return plan.nccl_max_ctas if plan.comm_sm_contention else None


def analytic_step(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                  layout: ClusterLayout, *, compute: ComputeTimer | None = None,
                  stragglers: Mapping[int, float] | None = None,
                  lowerer: StepLowerer | None = None,
                  cache: PricingCache | None = None, fast: bool = True) -> AnalyticStep:
    """Closed-form step of ``model`` under ``plan`` (module docstring).

    Args:
        model, cluster, plan: what to price (the plan already validated).
        layout: placement of the job's ranks.
        compute: prices compute ops (default: the roofline of the cluster's GPU).
        stragglers: ``{rank: speed}``; each slows its pipeline rank within its
            data-parallel replica (the replica waits for it); the step is that of
            the slowest replica.
        lowerer: a StepLowerer to reuse.
        cache: cost models to share with other evaluations.
        fast: :class:`AnalyticStepModel`'s ``fast`` (False: the reference walk over
            the action lists; the same result).

    Returns:
        :class:`AnalyticStep` of the slowest pipeline.
    """
    lowerer = lowerer or StepLowerer(model, plan)
    if cache is None:
        cost = CostModel(layout, ALGORITHMS, compute=compute, fidelity="analytic")
        shared = None
    else:
        cost = cache.cost_model(layout, compute)
        shared = cache.shared_prices(layout, compute)
    contention = plan_contention(plan)
    pricer = OpPricer(cost, comm_contention=contention)
    step = AnalyticStepModel(lowerer, pricer, shared=shared, fast=fast).run()
    if not stragglers:
        return step
    # the slowest rank of each (data-parallel replica, pipeline rank) sets its pace
    replicas: dict[int, dict[int, int]] = {}
    for rank, speed in sorted(stragglers.items()):
        coords = lowerer.layout.coords(rank)
        stages = replicas.setdefault(coords["dp"], {})
        slowest = stages.get(coords["pp"])
        if slowest is None or speed < stragglers[slowest]:
            stages[coords["pp"]] = rank
    slowed = CostModel(layout, ALGORITHMS, compute=cost.compute, fidelity="analytic",
                       ranks={r: RankConditions(speed=v) for r, v in stragglers.items()})
    for _, slow_ranks in sorted(replicas.items()):
        slow = {p: OpPricer(slowed, rank, contention) for p, rank in slow_ranks.items()
                if stragglers[rank] != 1.0}
        candidate = AnalyticStepModel(lowerer, pricer, slow, shared=shared, fast=fast).run()
        if candidate.step_ns > step.step_ns:
            step = candidate
    return step
