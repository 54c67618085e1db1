"""Step times of many plans at ``analytic`` fidelity, without building a result per plan.

A plan search or a sweep ranks thousands of plans by their step time; only the few that
can reach the top need the full :class:`sim.step.StepResult` (breakdown, band, memory).
:class:`BatchStepEvaluator` gives the step time alone, the one
:func:`sim.step.simulate_step` ``(..., fidelity="analytic")`` gives, to the nanosecond
(tests/test_analytic_batch.py compares them on random plans of several models and every
schedule it covers).

How: the closed-form step model (:mod:`sim.analytic_step`) prices each distinct part
(layer kind, embedding, head) in each phase once per :class:`SharedPrices` key -- the
plan fields the part reads and the groups it runs on -- and the same for a gradient
bucket's reduction, a layer's parameter gather and a rank's optimizer step. Plans that
share those keys (the same tp/cp/ep, micro-batch, sequence, dtype, recompute; the same
data-parallel layout) differ only in what scales: how the layers split over ``pp * vpp``
stages, how many micro-batches run, the schedule's closed form. Here a plan looks its
shared prices up by the keys :class:`sim.analytic_step.AnalyticStepModel` itself uses
(so a price is the very value it would compute), and does the step's arithmetic from
them: stage sums by layer kind and count, the last backward's gradient buckets as they
fill, ZeRO's parameter gathers (with ZeRO-3 and a tail the schedule's timing runs
apart, the tail's gathers queued behind its reductions: BatchStepEvaluator.
_regather_walk), the schedule's ``timing``, each rank's end -- the same
integer operations as :meth:`AnalyticStepModel.run`, without the lowering, the
per-plan memo tables, the breakdown or the result object. A price no plan has asked
for yet is computed by the plan's own :class:`AnalyticStepModel` (its lowering built
on demand) and stored where that model stores it.

Covered (:meth:`BatchStepEvaluator.covers`): dense models, all-reduce data
parallelism, schedules whose micro-batches take one route and whose lists pair no
forward with a backward (1F1B, 1F1B-eager, interleaved, GPipe, ZB-H1/H2, ZB-V: not
DualPipe's two routes), overlapped gradient
reduction (at the last micro-batch only: not ``grad_reduce_every_microbatch``), no
per-stage recompute count, no SM contention (``comm_sm_contention``), no CPU issue cost
(``host_issue`` off or graphed: with one the closed form carries the CPU's lead,
:mod:`sim.host_lead`) and a compute model that prices by shape. Transformer Engine's
amax all-reduce (FP8 ``te-delayed``, :func:`strategies.lowering.reduces_amax`) is a part
of every stage's phases after its layers, priced as AnalyticStepModel prices it: on the
stage's own rank, by that rank's bytes and amax group.
Every other plan goes through :func:`sim.analytic_step.analytic_step` (the same
number, the usual cost), or under SM contention without an exact closed form
(DualPipe, :func:`sim.analytic_step.contention_closed_form`; a walk the closed form
flags, :attr:`sim.analytic_step.AnalyticStep.exact`) through the event engine, as
:func:`sim.step.simulate_step` does; :attr:`BatchStepEvaluator.counts` says how many
took each way.
"""

from __future__ import annotations

from typing import Sequence

from hardware.spec import ClusterSpec
from sim.analytic_prices import amax_price_key, part_recomputes, plan_fields
from sim.analytic_step import (AnalyticStepModel, OpPricer, PricingCache, analytic_step,
                               GatherWalker, contention_closed_form, fill_by_sums,
                               group_price_key,
                               hop_prices, last_wait, optimizer_layers_key,
                               plan_contention, timed_tail_entries)
from sim.host_lead import LEVEL, HostForm, repeated_blocks, settle_rank_ends
from strategies.lowering import (AMAX_PART, StepLowerer, amax_reduction_bytes,
                                 pp_message_bytes, reduces_amax, split_layers)
from strategies.model_spec import ModelSpec
from strategies.plan import HOST_FREE_MODES, ParallelPlan
from strategies.schedules import get_schedule
from strategies.pipeline import one_f_one_b_family_walk
from strategies.schedules.base import (family_warmups, known_family_timing,
                                       prime_family_timings)

__all__ = ["BatchStepEvaluator"]

#: Plans :meth:`BatchStepEvaluator.step_ns` walks up to their pipeline timing before
#: timing them together (their paused walks held meanwhile)
_CHUNK_PLANS = 512



def _timed_tail(timing, p: int, hosted: bool = False) -> tuple | None:
    """:func:`sim.analytic_step.timed_tail_entries` without regathers (ZeRO-3 plans
    take :func:`_regather_tail`) as ``(((stage, comp), ...), releases)``, or None (back
    to back)."""
    found = timed_tail_entries(timing, p, hosted, False)
    if found is None:
        return None
    row, releases = found
    return tuple((stage, comp) for stage, comp, _, _ in row), releases


def _regather_tail(timing, p: int) -> tuple | None:
    """Rank ``p``'s tail as a ZeRO-3 plan walks it (:func:`sim.analytic_step.
    timed_tail_entries` with ``regathers``: every action from its first last-micro-batch
    backward on, each gathering its layers) as ``(((stage, comp, micro-batches before
    the stage's last), ...), releases)``, or None (back to back, without gathers)."""
    found = timed_tail_entries(timing, p, False, True)  # (hosted reads nothing then)
    if found is None:
        return None
    row, releases = found
    return tuple((stage, comp, back) for stage, comp, back, _ in row), releases


def _tail_and_releases(stages, split: bool, timed: tuple | None) -> tuple:
    """A rank's tail, the last micro-batch's backwards ``((stage, comp), ...)``, and when
    the pipeline's timing runs them apart (``timed``, :func:`_timed_tail`) their releases
    (each action starts no earlier, then the rank's end); without it the rank's stages in
    reverse back to back (B, or I then W) and None."""
    if timed is not None:
        return timed
    comps = ("I", "W") if split else ("B",)
    return [(s, c) for s in reversed(stages) for c in comps], None


def _fill_buckets(pending: dict, sums, final: bool, bucket: float, total: int, dp_free: int,
                  reductions: dict, reduction_ns, rank) -> int:
    """Add one part's gradient bytes (``sums``: dense, expert) to the ``pending`` buckets
    (:func:`sim.analytic_step.fill_by_sums`); each bucket now due is reduced on the
    data-parallel stream from ``max(dp_free, total)``, its duration memoised in
    ``reductions`` (``reduction_ns(rank, kind, size)``; None: nothing to reduce). Returns
    the stream's new free time, ns, as AnalyticStepModel's bucket walk does."""
    for due in fill_by_sums(pending, sums, bucket, final):
        duration = reductions.get(due, _UNSEEN)
        if duration is _UNSEEN:
            duration = reductions[due] = reduction_ns(rank, *due)
        if duration is not None:
            dp_free = (dp_free if dp_free > total else total) + duration
    return dp_free


#: a reduction not looked up yet (_fill_buckets; None is a price: nothing to reduce)
_UNSEEN = object()
#: Shortest run of identical layers the bucket walk takes in closed form (_fill_run).
_RUN_MIN = 3
#: Whole gradient bytes below 2**53 add exactly as floats (in any grouping).
_EXACT_MAX = float(2 ** 53)


def _reduce_parts(parts: list, pending: dict, bucket: float, total: int, dp_free: int,
                  reductions: dict, reduction_ns, rank, waits: Sequence | None = None
                  ) -> tuple[int, int]:
    """One backward's parts in order, ``(part_ns, sums, count)`` each (``count``
    identical parts in a row), each adding its ns and then its gradient bytes to the
    ``pending`` buckets (:func:`_fill_buckets`; the last part is the walk's final one),
    a long run of layers that only fill the dense bucket in closed form
    (:func:`_fill_run`); returns (total, dp_free) after them. ``waits``: per part None
    or ``(G, g)``, the ``i``-th of its ``count`` (from 1) first waits for its parameter
    gather, ending at ``G + i g`` (ZeRO-3, :meth:`BatchStepEvaluator._regather_walk`)."""
    final_index = len(parts) - 1
    for index, (part_ns, sums, count) in enumerate(parts):
        final = index == final_index
        wait = None if waits is None else waits[index]
        done = 0
        if count >= _RUN_MIN and not sums[1] and 0 < sums[0] \
                and (count + 1) * sums[0] + pending.get("dense", 0.0) < _EXACT_MAX:
            done = count - 1 if final else count
            total, dp_free = _fill_run(pending, sums[0], done, part_ns, bucket, total,
                                       dp_free, reductions, reduction_ns, rank, wait)
        for i in range(done + 1, count + 1):
            if wait is not None and wait[0] + i * wait[1] > total:
                total = wait[0] + i * wait[1]
            total += part_ns
            dp_free = _fill_buckets(pending, sums, final and i == count, bucket, total,
                                    dp_free, reductions, reduction_ns, rank)
    return total, dp_free


def _fill_run(pending: dict, dense: float, count: int, part_ns: int, bucket: float,
              total: int, dp_free: int, reductions: dict, reduction_ns, rank,
              wait: tuple[int, int] | None = None) -> tuple[int, int]:
    """``count`` identical layers (``part_ns`` each, ``dense`` whole gradient bytes to the
    dense bucket, none to the expert one), none of them the walk's final part, through
    :func:`_fill_buckets` in closed form; returns (total, dp_free) after them, with
    ``pending`` as the walk leaves it. ``wait``: ``(G, g)``, layer ``i`` (from 1) starts
    no sooner than its parameter gather's end ``G + i g``.

    With ``P`` bytes pending and ``g`` per layer, the first bucket is due at the first
    layer ``i1`` with ``P + i1 g >= bucket`` and every ``k`` layers after it (``k g >=
    bucket``, the least such ``k``), at totals ``t_j``; its size is ``P + i1 g``, the
    others' ``k g`` (whole numbers below 2**53: the same floats as adding one layer at a
    time). The stream's recursion ``F_j = max(F_{j-1}, t_j) + d`` over ``J`` equal
    buckets ``K = k part_ns`` apart unrolls to ``max(F_0 + J d, t_1 + J d, t_J + d)``
    (each term ``t_i + (J - i + 1) d`` is linear in ``i``, so an end binds): the same
    integers as the walk layer by layer. With gathers the layers' ends
    ``e_i = max(e_{i-1}, G + i g) + c`` unroll to ``max(e_0 + i c, G + g + i c, G + i g
    + c)`` (:func:`_gathered_end`): convex in ``i``, so the bucket totals ``t_j`` are
    convex in ``j``, each term above too, and an end still binds (the gathers are on
    the stream before the run's reductions: they do not move)."""
    def end_at(i: int) -> int:  # the run's total after its i-th layer
        if wait is None or not i:
            return total + i * part_ns
        return _gathered_end(total, i, part_ns, *wait)

    start = pending.get("dense", 0.0)
    first = 1
    if start + dense < bucket:  # least i with start + i dense >= bucket
        first = max(1, int((bucket - start) // dense))
        while first > 1 and start + (first - 1) * dense >= bucket:
            first -= 1
        while start + first * dense < bucket:
            first += 1
    if first > count:  # no bucket due in the run
        pending["dense"] = start + count * dense
        pending["expert"] = pending.get("expert", 0.0) + 0.0
        return end_at(count), dp_free
    period = max(1, int(bucket // dense))
    while period > 1 and (period - 1) * dense >= bucket:
        period -= 1
    while period * dense < bucket:
        period += 1

    def duration_of(size: float):
        due = ("dense", size)
        found = reductions.get(due, _UNSEEN)
        if found is _UNSEEN:
            found = reductions[due] = reduction_ns(rank, *due)
        return found

    due_at = end_at(first)
    duration = duration_of(start + first * dense)
    if duration is not None:
        dp_free = (dp_free if dp_free > due_at else due_at) + duration
    more = (count - first) // period  # equal buckets after the first
    if more:
        duration = duration_of(period * dense)
        if duration is not None:
            t_first = end_at(first + period)
            t_last = end_at(first + more * period)
            dp_free = max(dp_free + more * duration, t_first + more * duration,
                          t_last + duration)
    left = count - first - more * period  # layers after the last due bucket
    pending["dense"] = left * dense
    pending["expert"] = pending.get("expert", 0.0) + 0.0
    return end_at(count), dp_free


def _gathered_end(total: int, count: int, part_ns: int, gathered: int, gather_ns: int
                  ) -> int:
    """Where ``count`` >= 1 identical layers (``part_ns`` each) started at ``total`` end
    when layer ``i`` (from 1) also waits for its parameter gather, ending at ``gathered
    + i gather_ns``, ns: ``e_i = max(e_{i-1}, G + i g) + c`` unrolls to ``e_n = max(e_0
    + n c, G + j g + (n - j + 1) c for j in 1..n)``, linear in ``j``: the first or the
    last gather binds (the same integers as the walk layer by layer)."""
    run_ns = count * part_ns
    return max(total + run_ns, gathered + gather_ns + run_ns,
               gathered + count * gather_ns + part_ns)


class BatchStepEvaluator:
    """Step times (ns) of plans of one model on one cluster at ``analytic`` fidelity,
    equal to :func:`sim.step.simulate_step`'s (module docstring).

    Args:
        model: the model every plan trains.
        cluster: the cluster spec (its GPU count per plan: ``plan.world_size``).
        cache: the :class:`sim.analytic_step.PricingCache` to share prices with (a
            planner passes the one its full evaluations use); default a new one.
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec,
                 cache: PricingCache | None = None) -> None:
        self.model = model
        self.cluster = cluster
        self.cache = cache if cache is not None else PricingCache()
        #: plans priced here ("batch"), by analytic_step ("reference") and by the event
        #: engine ("event": SM contention without an exact closed form)
        self.counts = {"batch": 0, "reference": 0, "event": 0}
        self._flags = tuple(model.layer_kind(i) for i in range(model.num_layers))
        self._layouts: dict[tuple, tuple] = {}
        self._splits: dict[tuple, tuple] = {}
        self._memory_layouts: dict[tuple, _MemoryLayout] = {}
        self._covered: dict[tuple, bool] = {}
        self._grads: dict[tuple, tuple | None] = {}
        self._fill_delays: dict[tuple, int] = {}  # _fill_delay_ns by what it reads
        self._plan_grads: dict = {}  # the plan being priced's, by kind (_part_grads)
        self._model_of: tuple[ParallelPlan, AnalyticStepModel] | None = None
        self._layer_runs: dict[tuple, tuple] = {}  # _runs by a stage's layers
        self._programs: dict[tuple, tuple] = {}  # _host_program by schedule shape
        self._amax_group_keys: dict[tuple, tuple] = {}  # _amax_groups by rank layout
        self._layer_amax_gemms: dict[tuple, int] = {}  # _amax_gemms by (part fields, kind)

    # ------------------------------------------------------------------ public
    def covers(self, plan: ParallelPlan) -> bool:
        """Whether :meth:`step_ns` prices ``plan`` here (else through analytic_step)."""
        if self.model.moe is not None or plan.dp_mode != "allreduce" or plan.dp_replicas > 1:
            # (hybrid sharding: a bucket's reduction is two collectives, priced by
            # AnalyticStepModel._reduction_ns)
            return False
        if plan_contention(plan) is not None:
            # SM contention re-prices each part by the data-parallel collectives it
            # overlaps: through analytic_step (its closed form, or the engine's fallback)
            return False
        if plan.host_issue not in HOST_FREE_MODES and plan.pp == 1 and self._gathers(plan):
            # the CPU issues the kernels of one rank whose layers wait for their gathers
            # (AnalyticStepModel._whole_rank_step: each wait adds to the CPU's lead, layer
            # by layer): priced there; other host-issue plans here (_host_step_ns)
            return False
        if getattr(plan, "moe_a2a_overlap", False) or plan.recompute_layers \
                or not plan.overlap_grad_reduce or plan.grad_reduce_every_microbatch:
            return False
        # (the rest reads the schedule, its placement and the job shape: once each)
        key = (plan.schedule, plan.pp, plan.vpp, plan.world_size)
        found = self._covered.get(key)
        if found is None:
            found = self._covered[key] = self._covers_shape(plan)
        return found

    def _covers_shape(self, plan: ParallelPlan) -> bool:
        """:meth:`covers`' schedule and cost-model conditions."""
        schedule = get_schedule(plan.schedule)
        if schedule.pairs_own_actions or schedule.placement(plan.pp, plan.vpp).routes != 1:
            return False
        layout = self.cache.layout(self.cluster, plan.world_size)
        return self.cache.shared_prices(layout) is not None

    def step_ns(self, plans: Sequence[ParallelPlan]) -> list[int]:
        """Step time of each plan, ns (validated plans; memory is not checked)."""
        out = []
        for start in range(0, len(plans), _CHUNK_PLANS):
            out += self._chunk_step_ns(plans[start:start + _CHUNK_PLANS])
        return out

    def _chunk_step_ns(self, plans: Sequence[ParallelPlan]) -> list[int]:
        """:meth:`step_ns` of a few hundred plans: the covered ones walked up to their
        pipeline's timing (:meth:`_plan_walk`), those timings computed together
        (:func:`strategies.schedules.base.prime_family_timings`: plans of one shape
        differ in their durations only, and one numpy pass times several), then each
        walk finished; the others as before."""
        walked: list = [None] * len(plans)
        paused = []
        requests = []
        for index, plan in enumerate(plans):
            if not self.covers(plan):
                continue
            # (a price no plan computed yet: the plan's own model computes what it
            # needs and stores it where it would, then the walk goes on)
            walk = self._plan_walk(plan)
            try:
                requests.append(next(walk))
            except StopIteration as stop:  # (no timing to ask for: none, or one known)
                walked[index] = stop.value
                continue
            except _Unsupported:
                continue
            paused.append((index, walk))
        for (index, walk), timing in zip(paused, prime_family_timings(requests)):
            try:
                walk.send(timing)
            except StopIteration as stop:
                walked[index] = stop.value
            except _Unsupported:
                pass
            else:  # (a walk asks for one timing)
                raise RuntimeError("a plan's walk asked for a second timing")
        out = []
        for plan, found in zip(plans, walked):
            if found is not None:
                self.counts["batch"] += 1
            elif contention_closed_form(plan):
                layout = self.cache.layout(self.cluster, plan.world_size)
                lowerer = StepLowerer(self.model, plan,
                                      domain_gpus=self.cluster.scale_up.domain_gpus)
                step = analytic_step(self.model, self.cluster, plan, layout,
                                     lowerer=lowerer, cache=self.cache)
                if step.exact:
                    found = step.step_ns
                    self.counts["reference"] += 1
            if found is None:
                # SM contention without an exact closed form: the event engine, as
                # simulate_step falls back to it (sim.analytic_step.contention_closed_form;
                # asked for directly, so the closed form does not run a second time)
                from sim.step import simulate_step  # (it builds on this module's imports)

                found = round(simulate_step(self.model, self.cluster, plan,
                                            fidelity="event", check_memory=False,
                                            cache=self.cache).step_time_s * 1e9)
                self.counts["event"] += 1
            out.append(found)
        return out

    def rank_results(self, plans: Sequence[ParallelPlan]) -> list[dict]:
        """What a plan search ranks by, per plan, without a full result:
        ``{"step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_bytes"}``
        (the values :func:`sim.step.simulate_step` ``(..., fidelity="analytic")``
        gives; ``step_time_p10_s`` .. ``p90_s`` are the step itself: no band), or
        ``{"out_of_memory": reason}`` when a pipeline rank does not fit the GPU's HBM
        (simulate_step's check, first rank first). Memory comes first, as there."""
        from sim.step import throughput
        from strategies.memory import pipeline_memory

        capacity = self.cluster.gpu.hbm_bytes  # (apply_perturbations without any)
        reserve = self.cluster.gpu.memory_reserve_bytes
        out: list[dict | None] = []
        priced = []
        for plan in plans:
            memory = pipeline_memory(self.model, plan, self._memory_layout(plan),
                                     reserve_bytes=reserve)
            too_big = next((b for b in memory.values() if b.total_bytes > capacity), None)
            if too_big is not None:
                states = too_big.weights_bytes + too_big.gradients_bytes \
                    + too_big.optimizer_bytes
                what = "model states" if states >= too_big.activations_bytes \
                    else "activations"
                out.append({"out_of_memory": f"out of memory ({what} dominate)"})
                continue
            out.append(None)
            priced.append((len(out) - 1, plan,
                           int(max(b.total_bytes for b in memory.values()))))
        steps = self.step_ns([plan for _, plan, _ in priced])
        for (index, plan, peak), step_ns in zip(priced, steps):
            step_s = step_ns / 1e9
            out[index] = {"step_time_s": step_s, "step_time_p10_s": step_s,
                          "step_time_p50_s": step_s, "step_time_p90_s": step_s,
                          **throughput(self.model, self.cluster, plan, step_s),
                          "peak_memory_bytes": peak}
        return out

    def _memory_layout(self, plan: ParallelPlan):
        """What strategies.memory.pipeline_memory reads of a StepLowerer, without the
        lowering (for plans without a per-stage recompute count; else the lowering)."""
        if plan.recompute_layers:
            return StepLowerer(self.model, plan, domain_gpus=self.cluster.scale_up.domain_gpus)
        key = (plan.pp, plan.vpp, plan.layers_per_stage, plan.schedule)
        found = self._memory_layouts.get(key)
        if found is None:
            schedule = get_schedule(plan.schedule)
            found = self._memory_layouts[key] = _MemoryLayout(
                schedule, *self._split(plan, schedule)[:2])
        return found

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _gathers(plan: ParallelPlan) -> bool:
        """StepLowerer.gathers_params("F", 0) (one route: every chunk held once)."""
        if plan.dp * plan.cp == 1:
            return False
        return plan.zero == 3 or (plan.zero in (1, 2) and plan.overlap_param_gather)

    def _reference_model(self, plan: ParallelPlan) -> AnalyticStepModel:
        """The plan's own closed-form model (built on a miss), as analytic_step builds
        it."""
        if self._model_of is not None and self._model_of[0] is plan:
            return self._model_of[1]
        layout = self.cache.layout(self.cluster, plan.world_size)
        lowerer = StepLowerer(self.model, plan, domain_gpus=self.cluster.scale_up.domain_gpus)
        model = AnalyticStepModel(lowerer, OpPricer(self.cache.cost_model(layout),
                                                    comm_contention=plan_contention(plan)),
                                  shared=self.cache.shared_prices(layout))
        self._model_of = (plan, model)
        return model

    def _layout_of(self, plan: ParallelPlan) -> tuple:
        """(representative rank of each pipeline rank, the groups a part's ops run on
        per pipeline rank: AnalyticStepModel._part_groups), once per rank layout."""
        return self._rank_groups(plan, ("tp", "cp", "ep"), self._layouts)

    def _amax_groups(self, plan: ParallelPlan) -> tuple:
        """Each pipeline rank's amax group (StepLowerer's ``amax``: TP x CP x DP, or TP x
        CP with ``tp_only_amax_red``) as :func:`group_price_key` names it, once per rank
        layout: what AnalyticStepModel._kind_cost keys an amax part's price by."""
        _, groups = self._rank_groups(plan, ("amax",), self._amax_group_keys,
                                      plan.tp_only_amax_red)
        return tuple(named[0] for named in groups)

    def _rank_groups(self, plan: ParallelPlan, names: tuple[str, ...], table: dict,
                     *extra) -> tuple:
        """(representative rank of each pipeline rank, per pipeline rank the
        :func:`group_price_key` of each of its ``names`` groups), kept in ``table`` by the
        rank layout (everything strategies.plan.RankLayout places ranks by) and
        ``extra`` (plan fields the groups also depend on)."""
        key = (plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.expert_tp, plan.order, *extra)
        found = table.get(key)
        if found is None:
            lowerer = StepLowerer(self.model, plan,
                                  domain_gpus=self.cluster.scale_up.domain_gpus)
            reps = lowerer.representatives
            cluster_layout = self.cache.layout(self.cluster, plan.world_size)
            found = table[key] = (reps, tuple(
                tuple(group_price_key(cluster_layout, lowerer._groups(reps[p])[name])
                      for name in names)
                for p in range(plan.pp)))
        return found

    def _amax_gemms(self, plan: ParallelPlan, plain_key: tuple, kinds, stages_of) -> list:
        """FP8 GEMMs of each pipeline rank's layers (StepLowerer.amax_bytes' count: the
        amaxes of all the rank's chunks), by kind and count; a kind's count once per
        ``part_no_recompute`` fields (the kernels' arguments), from the plan's model."""
        per_kind = self._layer_amax_gemms
        out = []
        for stages in stages_of:
            gemms = 0
            for s in stages:
                for kind, layer, count in kinds[s]:
                    found = per_kind.get((plain_key, kind))
                    if found is None:
                        found = per_kind[(plain_key, kind)] = (
                            self._reference_model(plan).lowerer.layer_amax_gemms(layer))
                    gemms += found * count
            out.append(gemms)
        return out

    def _split(self, plan: ParallelPlan, schedule) -> tuple:
        """Layers and holders of each virtual stage, once per split."""
        key = (plan.pp, plan.vpp, plan.layers_per_stage, plan.schedule)
        found = self._splits.get(key)
        if found is None:
            placement = schedule.placement(plan.pp, plan.vpp)
            chunks = split_layers(self.model.num_layers, plan)
            stage_layers = tuple(chunks[placement.chunk_of(s)]
                                 for s in range(placement.num_stages))
            flags = self._flags
            # per stage: (first, last) flags and its layers grouped by kind in backward
            # order (kind, a layer of that kind, count)
            kinds = []
            for layers in stage_layers:
                counts: dict = {}
                for layer in reversed(layers):
                    entry = counts.setdefault(flags[layer], [layer, 0])
                    entry[1] += 1
                kinds.append(tuple((k, first, n) for k, (first, n) in counts.items()))
            stages_of = tuple(placement.stages_of(p) for p in range(plan.pp))
            first = tuple(placement.is_first(s) for s in range(placement.num_stages))
            last = tuple(placement.is_last(s) for s in range(placement.num_stages))
            # distinct ranks (AnalyticStepModel._signature), each priced by its first p
            signatures, firsts = [], {}
            for p in range(plan.pp):
                signature = tuple((flags[stage_layers[s][0]:stage_layers[s][-1] + 1]
                                   if stage_layers[s] else (), first[s], last[s])
                                  for s in stages_of[p])
                signatures.append(signature)
                firsts.setdefault(signature, p)
            # which rank asks first for each (kind, phase), in AnalyticStepModel.run's
            # order: the distinct ranks' own phases (their action counts), then every
            # stage's phases for the schedule's timing; the plan's model prices a
            # (kind, phase) once, on that rank's groups, for every rank
            split = schedule.split_backward
            comps = ("F", "B", "W", "I") if split else ("F", "B")
            own = ("F", "I", "W") if split else ("F", "B")
            holders = placement.rank_of_stage
            order = [(p, s, own) for p in sorted(firsts.values()) for s in stages_of[p]]
            order += [(holders[s], s, comps) for s in range(len(stage_layers))]
            askers: dict[tuple, int] = {}
            for p, s, phase_comps in order:
                stage_kinds = [kind for kind, _, _ in kinds[s]]
                stage_kinds += ["head"] if last[s] else []
                stage_kinds += ["embedding"] if first[s] else []
                for comp in phase_comps:
                    for kind in stage_kinds:
                        askers.setdefault((kind, comp), p)
            # stages alike (the same kinds and counts, ends): one phase time for all
            shapes: dict[tuple, int] = {}
            shape_of = tuple(shapes.setdefault(
                (tuple((k, n) for k, _, n in kinds[s]), first[s], last[s]), s)
                for s in range(len(stage_layers)))
            # each rank's part of its optimizer key (AnalyticStepModel._optimizer_cost)
            optimizer_keys = tuple(
                (optimizer_layers_key(self.model, [layer for s in stages_of[p]
                                                   for layer in stage_layers[s]]),
                 any(first[s] for s in stages_of[p]), any(last[s] for s in stages_of[p]))
                for p in range(plan.pp))
            found = (placement, stage_layers, tuple(kinds), stages_of, first, last,
                     tuple(signatures), askers, shape_of, optimizer_keys)
            self._splits[key] = found
        return found

    def _part_grads(self, plan: ParallelPlan, part_key: tuple, kind, part) -> tuple | None:
        """AnalyticStepModel._part_grads of a part (whole gradient bytes to the dense and
        expert buckets, or None), per (part fields, gradient dtype, kind)."""
        # (this plan's kinds first: the key below hashes the plan's part fields)
        found = self._plan_grads.get(kind, _UNSEEN)
        if found is not _UNSEEN:
            return found
        key = (part_key, plan.grad_reduce_dtype, kind)
        if key in self._grads:
            found = self._grads[key]
        else:
            found = self._grads[key] = self._reference_model(plan)._part_grads(part)
        self._plan_grads[kind] = found
        return found

    # ------------------------------------------------------------------ the step
    def _plan_walk(self, plan: ParallelPlan):
        """AnalyticStepModel(...).run().step_ns from shared prices, as a generator: once
        its phases are priced, a pipeline timing not known yet
        (:func:`strategies.schedules.base.known_family_timing`) is yielded as a request
        ``(schedule, pp, microbatches, vpp, t_f, t_b, t_comm)`` and the walk is sent back
        its ``schedule.timing`` (:meth:`_chunk_step_ns` times many plans' at once), or
        None to ask ``schedule.timing`` itself; it returns the step (ns). A price not yet
        computed is computed by the plan's own model (:meth:`_reference_model`, built on the first such price), in
        one pass: looking the prices up has no side effect, so a pass that stopped at
        the first miss and started again (as before) gave the same integers at up to
        twice the walk."""
        model, cache = self.model, self.cache
        layout = cache.layout(self.cluster, plan.world_size)
        shared = cache.shared_prices(layout)
        schedule = get_schedule(plan.schedule)
        (placement, stage_layers, kinds, stages_of, is_first, is_last, signatures, askers,
         shape_of, optimizer_keys) = self._split(plan, schedule)
        reps, part_groups = self._layout_of(plan)
        mkey = shared.model_key(model)
        part_key = ("part", StepLowerer, mkey, plan_fields(plan, "part"))
        # (a phase that recomputes nothing: sim.analytic_prices.part_recomputes)
        plain_key = ("part_no_recompute", StepLowerer, mkey,
                     plan_fields(plan, "part_no_recompute"))
        groups_key = ("groups", StepLowerer, mkey, plan_fields(plan, "groups"), 1)
        opt_key = ("optimizer", StepLowerer, mkey, plan_fields(plan, "optimizer"))
        mode = plan.recompute
        pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
        split = schedule.split_backward
        get = shared.get
        plan_grads = self._plan_grads = {}
        # this plan's (rank, kind, phase) prices, once looked up (the shared key hashes
        # the plan's part fields and groups; a kind is a layer kind or "head" /
        # "embedding", so it says whether the part is a layer, all the key reads of it)
        costs: dict = {}
        amax = reduces_amax(plan)
        if amax:
            amax_groups = self._amax_groups(plan)
            amax_gemms = self._amax_gemms(plan, plain_key, kinds, stages_of)

        def kind_cost(p: int, part, kind, comp: str):
            if kind == AMAX_PART:
                # the amax all-reduce: priced on the stage's own rank, keyed by its bytes
                # and group (AnalyticStepModel._kind_cost)
                cost = costs.get((p, kind, comp))
                if cost is None:
                    cost = get(amax_price_key(plain_key, kind, comp,
                                              amax_reduction_bytes(amax_gemms[p], comp),
                                              amax_groups[p]))
                    if cost is None:
                        ref = self._reference_model(plan)
                        cost = ref._kind_cost(ref.pricer, p, part, kind, comp)
                    costs[(p, kind, comp)] = cost
                return cost
            # the plan's model prices a (kind, phase) once, on the rank that asks first,
            # and every rank reuses it (AnalyticStepModel._kind_cost): that rank's groups
            p = askers.get((kind, comp), p)
            cost = costs.get((p, kind, comp))
            if cost is not None:
                return cost
            if part_recomputes(part, comp):
                cost = get((part_key, kind, comp, mode, part_groups[p]))
            else:
                cost = get((plain_key, kind, comp, None, part_groups[p]))
            if cost is None:
                ref = self._reference_model(plan)
                cost = ref._kind_cost(ref.pricer, p, part, kind, comp)
            costs[(p, kind, comp)] = cost
            return cost

        def phase_ns(p: int, stage: int, comp: str) -> int:
            total = 0
            if is_last[stage]:
                total += kind_cost(p, "head", "head", comp).total_ns
            for kind, layer, count in kinds[stage]:
                total += kind_cost(p, layer, kind, comp).total_ns * count
            if is_first[stage]:
                total += kind_cost(p, "embedding", "embedding", comp).total_ns
            return total

        def reduction_ns(p: int, group: str, size: float) -> int | None:
            found = get((groups_key, None, "reduce", p, (group, size)))
            if found is None:
                ref = self._reference_model(plan)
                return ref._reduction_ns(ref.pricer, p, group, size)
            return found[0]

        def gather_ns(p: int, layer: int) -> int:
            found = get((groups_key, opt_key, "gather", p, self._flags[layer]))
            if found is None:
                ref = self._reference_model(plan)
                return ref._gather_ns(ref.pricer, p, layer) or 0
            return found[0] or 0

        def optimizer_cost(p: int):
            found = get((opt_key, groups_key, p, *optimizer_keys[p]))
            if found is None:
                ref = self._reference_model(plan)
                found = ref._optimizer_cost(ref.pricer, p)
            return found

        def optimizer_ns(p: int) -> int:
            return optimizer_cost(p).total_ns

        holders = placement.rank_of_stage
        comps = ("F", "B", "W", "I") if split else ("F", "B")
        hosted = plan.host_issue not in HOST_FREE_MODES
        if hosted:
            # the CPU issues the kernels: each phase is the form of its parts in issue
            # order (AnalyticStepModel._phase_form), priced with the CPU ahead (its
            # free_ns: _phase_cost), once per stage of the same parts in the same order
            forms = self._host_forms(plan, stage_layers, is_first, is_last, holders,
                                     comps, kind_cost,
                                     tuple(zip(amax_gemms, amax_groups)) if amax else None)
            phases = {comp: [form.free_ns for form in forms[comp]] for comp in comps}
        else:
            forms = None
            phases = {}
        for comp in () if hosted else comps:
            by_shape: dict[int, int] = {}
            row = []
            for s, shape in enumerate(shape_of):
                found = by_shape.get(shape)
                if found is None:  # (the asking rank, not the holder, picks the price)
                    found = by_shape[shape] = phase_ns(holders[s], s, comp)
                if amax:  # (the holder's own: its bytes and group)
                    found += kind_cost(holders[s], AMAX_PART, AMAX_PART, comp).total_ns
                row.append(found)
            phases[comp] = row
        gathers = self._gathers(plan)
        bucket = plan.grad_bucket_bytes
        if pp == 1 and gathers:
            return self._whole_rank_ns(plan, schedule, stage_layers, is_first, is_last,
                                       phases, kind_cost, reduction_ns, optimizer_ns,
                                       gather_ns, part_key, amax)
        t_p2p = hops = 0
        if pp > 1:
            cost_model = cache.cost_model(layout)
            size = int(pp_message_bytes(model, plan))
            t_p2p = cost_model.p2p_ns(reps[0], reps[1], size)
            hops = hop_prices(schedule, placement, reps, size, cost_model.p2p_ns, t_p2p)
        if gathers and plan.zero == 3 and not hosted:
            warmups = family_warmups(schedule, pp, m, vpp)
            if warmups is not None:
                # (ZeRO-3 on the 1F1B family: its units walked with their gathers,
                # AnalyticStepModel._gathered_step; no timing to ask for)
                return self._gathered_step_ns(plan, warmups, t_p2p, stage_layers, is_first,
                                              is_last, kind_cost, gather_ns, reduction_ns,
                                              optimizer_ns, part_key, amax)
        durations_b = list(phases["B"])
        if split:
            durations_b = [max(b, w) for b, w in zip(durations_b, phases["W"])]
            timing = schedule.timing(pp, m, vpp, phases["F"], durations_b, phases["W"], hops,
                                     t_fb=None, overlap=False, t_i=phases["I"])
        else:
            missing, timing = known_family_timing(schedule, pp, m, vpp, phases["F"],
                                                  durations_b, hops)
            if missing:
                # (timed with other plans' timings: paused until then, other walks run,
                # and its per-plan state is put back -- the gradients for correctness,
                # the model only to spare rebuilding it; a known timing, or one the memo
                # never holds, does not pause: holding many walks costs more than asking)
                model_of = self._model_of
                timing = yield (schedule, pp, m, vpp, phases["F"], durations_b, hops)
                self._plan_grads = plan_grads
                if model_of is not None and model_of[0] is plan:
                    self._model_of = model_of
            if timing is None:  # (one prime_family_timings left to this call)
                timing = schedule.timing(pp, m, vpp, phases["F"], durations_b, None, hops)
        # each distinct rank (AnalyticStepModel._signature, with its tail as the timing
        # runs it: AnalyticStepModel._timed_tail) priced once, by its first p
        by_signature: dict[tuple, tuple[int, int, int]] = {}
        rank_costs = []
        # ZeRO-3: a timed tail is walked with its parameter gathers queued behind its
        # reductions (AnalyticStepModel._regathers); a rank without one back to back
        regathers = gathers and plan.zero == 3
        for p, signature in enumerate(signatures):
            timed = _regather_tail(timing, p) if regathers else None
            if timed is not None:
                found = by_signature.get((signature, timed))
                if found is None:
                    found = by_signature[(signature, timed)] = self._regather_rank(
                        p, timed, hosted, stages_of[p], stage_layers, kinds, is_first,
                        is_last, split, kind_cost, reduction_ns, optimizer_cost, gather_ns,
                        m, placement, plan, part_key, amax)
                rank_costs.append(found)
                continue
            timed = None if regathers else _timed_tail(timing, p, hosted)
            found = by_signature.get((signature, timed))
            if found is None and hosted:
                found = by_signature[(signature, timed)] = self._host_rank(
                    p, stages_of[p], stage_layers, kinds, is_first, is_last, split, forms,
                    kind_cost, reduction_ns, optimizer_cost, gather_ns, gathers, bucket, m,
                    placement, plan, part_key, timed, amax)
            elif found is None:
                found = by_signature[(signature, timed)] = self._rank_ns(
                    p, stages_of[p], stage_layers, kinds, is_first, is_last, split, phases,
                    kind_cost, reduction_ns, optimizer_ns, gather_ns, gathers, bucket, m,
                    placement, plan, part_key, timed, amax)
            rank_costs.append(found)
        first_wait = 0
        if gathers:
            # it reads forward prices (keyed without the recompute fields), gathers and
            # the p2p time on the split's stages: plans that differ in recompute alone
            # share it
            # (and the amax part's forward, whose group and presence the part fields do
            # not say: sim.analytic_prices._NOT_IN_PARTS)
            wait_key = (plan.pp, plan.vpp, plan.layers_per_stage, plan.schedule, plain_key,
                        groups_key, opt_key, part_groups, t_p2p, amax, plan.tp_only_amax_red)
            first_wait = self._fill_delays.get(wait_key)
            if first_wait is None:
                first_wait = self._fill_delays[wait_key] = self._fill_delay_ns(
                    placement, stage_layers, kinds, kind_cost, gather_ns, t_p2p, is_first,
                    is_last, amax)
        if hosted:
            return self._host_step(plan, schedule, placement, forms, rank_costs,
                                   [end + first_wait for end in timing.rank_end], t_p2p,
                                   first_wait)
        step = 0
        for (last_backward, finish, gathers_ns), compute_end in zip(rank_costs,
                                                                  timing.rank_end):
            last_start = compute_end + first_wait - last_backward
            after_backward = finish - last_backward
            end = max(last_start + finish, gathers_ns + after_backward)
            if end > step:
                step = end
        return step

    def _gathered_step_ns(self, plan, warmups, t_p2p, stage_layers, is_first, is_last,
                          kind_cost, gather_ns, reduction_ns, optimizer_ns, part_key,
                          amax) -> int:
        """AnalyticStepModel._gathered_step's step (ns): each rank's
        :class:`sim.analytic_step.GatherWalker` from this plan's prices (its chunks'
        parts in the lowering's order, a run of identical layers as one row: the same
        integers, :func:`sim.analytic_step.gather_floor`), walked by
        :func:`strategies.pipeline.one_f_one_b_family_walk`."""
        pp = plan.pp
        walkers = []
        for p in range(pp):
            gather = _by_kind(gather_ns, p, self._flags)
            rows = {}
            for chunk in range(plan.vpp):
                stage = chunk * pp + p  # (Megatron's placement: family_warmups)
                runs = self._runs(stage_layers[stage])
                for comp in ("F", "B"):
                    forward = comp == "F"
                    lead, tail = _edge_parts(forward, is_first[stage], is_last[stage])
                    parts = [(part, part, 1) for part in lead]
                    parts += [(layer, kind, n) for kind, layer, n in
                              (runs if forward else runs[::-1])]
                    parts += [(AMAX_PART, AMAX_PART, 1)] if amax else []
                    parts += [(part, part, 1) for part in tail]
                    found = []
                    for part, kind, n in parts:
                        # (a backward's gradient sums: whole numbers, else analytic_step)
                        part_ns, sums = ((kind_cost(p, part, kind, comp).total_ns, None)
                                         if forward else
                                         self._row(p, part, kind, comp, kind_cost, plan,
                                                   part_key))
                        found.append((part_ns, 0 if isinstance(part, str) else gather(part),
                                      n, sums, part))
                    rows[(forward, chunk)] = tuple(found)
            walkers.append(GatherWalker(rows,
                                        lambda group, size, p=p: reduction_ns(p, group, size),
                                        None, plan.grad_bucket_bytes))
        walk = one_f_one_b_family_walk(pp, plan.num_microbatches, plan.vpp, warmups, t_p2p,
                                       walkers)
        return max(max(end, stream) + optimizer_ns(p)
                   for p, (end, stream) in enumerate(zip(walk.rank_end, walk.stream_end)))

    def _rank_ns(self, p, stages, stage_layers, kinds, is_first, is_last, split, phases,
                 kind_cost, reduction_ns, optimizer_ns, gather_ns, gathers, bucket, m,
                 placement, plan, part_key, timed=None, amax=False) -> tuple[int, int, int]:
        """(the last micro-batch's backward through the rank's stages, the same with its
        buckets reduced as they fill and the optimizer, the step's parameter gathers back
        to back): AnalyticStepModel._rank_costs' totals. ``timed``: the tail as the
        pipeline's timing runs it (``(actions, releases)``, :func:`_timed_tail`); ``amax``:
        every backward has the amax part after its layers (before the embedding)."""
        flags = self._flags
        tail, releases = _tail_and_releases(stages, split, timed)
        last_backward = 0
        for position, (s, comp) in enumerate(tail):
            if releases is not None and releases[position] > last_backward:
                last_backward = releases[position]
            last_backward += phases[comp][s]
        if releases is not None and releases[-1] > last_backward:
            last_backward = releases[-1]
        # _walk_parts over the tail (the rank's stages in reverse, the last micro-batch):
        # B / W actions reduce their buckets as they fill; I actions add their sums
        total = 0
        dp_free = 0
        reductions: dict = {}
        for position, (s, comp) in enumerate(tail):
            if releases is not None and releases[position] > total:
                total = releases[position]
            if comp == "I":
                total += phases["I"][s]
                continue
            # (each kind's list schedule and whole gradient bytes, looked up once)
            rows = {}
            for kind, layer, _ in kinds[s]:
                rows[kind] = self._row(p, layer, kind, comp, kind_cost, plan, part_key)
            pending: dict[str, float] = {}
            if len(kinds[s]) == 1:
                # one kind of layer: the stage's layers are one run of identical
                # parts (head, run, embedding); a long run in closed form
                kind, _, count = kinds[s][0]
                part_ns, sums = rows[kind]
                parts = [(part_ns, sums, count)]
            else:
                parts = [(*rows[flags[layer]], 1) for layer in reversed(stage_layers[s])]
            if is_last[s]:
                parts.insert(0, (*self._row(p, "head", "head", comp, kind_cost, plan,
                                            part_key), 1))
            if amax:
                parts.append((*self._row(p, AMAX_PART, AMAX_PART, comp, kind_cost, plan,
                                         part_key), 1))
            if is_first[s]:
                parts.append((*self._row(p, "embedding", "embedding", comp, kind_cost,
                                         plan, part_key), 1))
            total, dp_free = _reduce_parts(parts, pending, bucket, total, dp_free,
                                           reductions, reduction_ns, p)
        if releases is not None and releases[-1] > total:
            total = releases[-1]
        finish = max(total, dp_free) + optimizer_ns(p)
        gathers_ns = (self._step_gathers_ns(p, stages, kinds, split, gather_ns, m, placement,
                                            plan) if gathers else 0)
        return last_backward, finish, gathers_ns

    def _regather_rank(self, p, timed, hosted, stages, stage_layers, kinds, is_first,
                       is_last, split, kind_cost, reduction_ns, optimizer_cost, gather_ns, m,
                       placement, plan, part_key, amax) -> tuple:
        """AnalyticStepModel._rank_costs of a ZeRO-3 rank with a timed tail
        (:func:`_regather_tail`): its tail walked with its gathers, without and with the
        reductions and optimizer (:meth:`_regather_walk`), as :meth:`_rank_ns` returns
        them, or :meth:`_host_rank` with the CPU issuing the kernels."""
        tail, releases = timed
        gather = _by_kind(gather_ns, p, self._flags)

        # each action's layers in walk order as runs of one kind (kind, layer, n), and
        # whether an edge (a backward's head, a forward's embedding) leads them
        runs = [self._runs(stage_layers[s]) if comp == "F"
                else self._runs(stage_layers[s])[::-1] for s, comp, _ in tail]
        leads = [int(is_first[s] if comp == "F" else is_last[s]) for s, comp, _ in tail]
        prices = (kind_cost, reduction_ns, optimizer_cost, gather, plan, part_key, hosted,
                  is_first, is_last, amax, {})
        last_total, last_lead = self._regather_walk(p, tail, releases, runs, leads, prices,
                                                    finish=False)
        finish_total, finish_lead = self._regather_walk(p, tail, releases, runs, leads,
                                                        prices, finish=True)
        gathers_ns = self._step_gathers_ns(p, stages, kinds, split, gather_ns, m, placement,
                                           plan)
        if hosted:
            return (last_total, last_lead, finish_total, finish_lead, gathers_ns,
                    optimizer_cost(p).form())
        return last_total, finish_total, gathers_ns

    def _regather_walk(self, p, tail, releases, runs, leads, prices, finish: bool
                       ) -> tuple[int, int]:
        """AnalyticStepModel._walk of a ZeRO-3 rank's timed tail with its gathers
        (``tail``: ``(stage, comp, micro-batches before the stage's last)`` per action,
        ``releases`` as :func:`_regather_tail`; ``runs``, ``leads`` and ``prices`` as
        :meth:`_regather_rank` gives them), without SM contention: (its end, ns, and how
        far ahead the CPU is then: 0 unless ``hosted``); with ``finish`` the last
        micro-batch's B / W actions reduce their buckets as they fill and the end is the
        optimizer's (the lead its lead-in). The gathers queue on the data-parallel stream
        as :class:`_TailStream` issues them; each action is :meth:`_regather_action`."""
        reduces = [finish and comp in ("B", "W") and not back for _, comp, back in tail]
        hosted = prices[6]
        stream = _TailStream(runs, reduces, leads, prices[3])
        reductions: dict = {}
        total = lead = 0
        for position, (s, comp, _) in enumerate(tail):
            if releases[position] > total:
                lead += releases[position] - total  # (the CPU goes on issuing)
                total = releases[position]
            stream.issue(position, 0)
            total, lead = self._regather_action(p, s, comp, position, stream, total, lead,
                                                prices, reductions)
        if releases[-1] > total:
            total = releases[-1]
        if not finish:
            return total, lead
        optimizer, dp_free = prices[2](p), stream.free_ns
        if hosted:
            lead += dp_free - total if dp_free > total else 0
            return max(total, dp_free) + optimizer.form().total_at(lead), lead
        return max(total, dp_free) + optimizer.total_ns, lead

    def _regather_action(self, p, stage, comp, position, stream, total, lead, prices,
                         reductions) -> tuple[int, int]:
        """One action of :meth:`_regather_walk` (the ``position``-th of the tail, its
        gathers issued through ``stream``) from ``total`` (ns) and ``lead``: its leading
        edge, then the gathers it held back, its layers (each waiting for its gather),
        then the parts after them (amax, the other edge); returns (total, lead) after it.
        A run of identical layers takes its gather waits in closed form
        (:func:`_gathered_end`), its reductions too (:func:`_reduce_parts`: this
        action's gathers are on the stream before them); with the CPU's lead
        (``hosted``), part by part. ``reductions``: the walk's, by bucket."""
        reduction_ns, hosted, templates = prices[1], prices[6], prices[10]
        reduce, runs = stream.reduces[position], stream.runs[position]
        key = (stage, comp, reduce)
        template = templates.get(key)
        if template is None:
            template = templates[key] = self._regather_template(p, stage, comp, reduce,
                                                                runs, prices)
        edge, rows, counts, gathers, after_ns = template
        bucket = prices[4].grad_bucket_bytes
        pending: dict[str, float] = {}
        if edge is not None:  # the edge, then the gathers it held back
            price, sums = edge
            if hosted:
                total += price.total_at(lead)
                lead = price.lead_after(lead)
            else:
                total += price
            if reduce:
                stream.free_ns = _fill_buckets(pending, sums, not rows, bucket, total,
                                               stream.free_ns, reductions, reduction_ns, p)
            stream.issue(position, 1)
        # each run's gathers (G, g): its i-th layer's ends at G + i g; None after them
        starts = stream.starts.get(position, ())
        if not hosted and not reduce:
            for (part_ns, _), n, start, g in zip(rows, counts, starts, gathers):
                total = _gathered_end(total, n, part_ns, start, g)
            return total + after_ns, lead
        waits = [*zip(starts, gathers)]
        waits += [None] * (len(rows) - len(waits))
        if hosted:
            last = len(rows) - 1
            for index, ((form, sums), n, wait) in enumerate(zip(rows, counts, waits)):
                for i in range(1, n + 1):
                    if wait is not None and wait[0] + i * wait[1] > total:
                        lead += wait[0] + i * wait[1] - total  # (the CPU goes on issuing)
                        total = wait[0] + i * wait[1]
                    total += form.total_at(lead)
                    lead = form.lead_after(lead)
                    if reduce:
                        stream.free_ns = _fill_buckets(
                            pending, sums, index == last and i == n, bucket, total,
                            stream.free_ns, reductions, reduction_ns, p)
        elif rows:
            total, stream.free_ns = _reduce_parts(
                [(part_ns, sums, n) for (part_ns, sums), n in zip(rows, counts)], pending,
                bucket, total, stream.free_ns, reductions, reduction_ns, p, waits)
        return total, lead

    def _regather_template(self, p, stage, comp, reduce, runs, prices) -> tuple:
        """What :meth:`_regather_action` reads of an action of ``stage`` in ``comp`` on
        rank ``p`` (that reduces, or not), once per walk pair: (its leading edge's row or
        None, the rows of its runs then of the parts after them, their counts, each
        run's gather (ns), the parts after the runs back to back (ns, without the host)).
        A row is (ns, or form when hosted; gradient sums when it reduces, else None)."""
        kind_cost, _, _, gather, plan, part_key, hosted, is_first, is_last, amax, _ = prices

        def row(part, kind) -> tuple:
            if reduce:
                return (self._host_row if hosted else self._row)(
                    p, part, kind, comp, kind_cost, plan, part_key)
            cost = kind_cost(p, part, kind, comp)
            return (cost.form() if hosted else cost.total_ns), None

        lead, tail = _edge_parts(comp == "F", is_first[stage], is_last[stage])
        edge = row(lead[0], lead[0]) if lead else None
        after = ([AMAX_PART] if amax else []) + list(tail)
        rows = [row(layer, kind) for kind, layer, _ in runs]
        rows += [row(part, part) for part in after]
        counts = [n for _, _, n in runs] + [1] * len(after)
        after_ns = 0 if hosted else sum(part_ns for part_ns, _ in rows[len(runs):])
        return edge, rows, counts, [gather(layer) for _, layer, _ in runs], after_ns

    @staticmethod
    def _step_gathers_ns(p, stages, kinds, split, gather_ns, m, placement, plan) -> int:
        """AnalyticStepModel._gathers_ns: the step's parameter gathers of rank ``p`` back
        to back, ns (one micro-batch's actions, forwards in stage order, then the
        backwards reversed, each times the micro-batches that gather)."""
        gathers_ns = 0
        work = [(s, "F") for s in stages]
        for s in reversed(stages):
            work += [(s, c) for c in (("I", "W") if split else ("B",))]
        for s, comp in work:
            if plan.zero == 3:
                repeats = placement.microbatches_through(s, m)
            else:
                repeats = int(comp == "F" and placement.on_route(s, 0))
            if repeats:  # (whole ns: by kind and count, as _layers_gather_ns)
                gathers_ns += sum(gather_ns(p, layer) * n
                                  for _, layer, n in kinds[s]) * repeats
        return gathers_ns

    # ------------------------------------------------------------ host issue
    def _runs(self, layers: Sequence[int]) -> tuple:
        """A stage's layers in forward order as runs of one kind: ``(kind, a layer of
        it, count)`` each, per layer tuple (the order the CPU issues them in matters:
        forms do not commute)."""
        layers = tuple(layers)
        found = self._layer_runs.get(layers)
        if found is None:
            flags, runs = self._flags, []
            for layer in layers:
                if runs and runs[-1][0] == flags[layer]:
                    runs[-1][2] += 1
                else:
                    runs.append([flags[layer], layer, 1])
            found = self._layer_runs[layers] = tuple(tuple(run) for run in runs)
        return found

    def _host_forms(self, plan, stage_layers, is_first, is_last, holders, comps,
                    kind_cost, amax_keys=None) -> dict[str, list[HostForm]]:
        """Each virtual stage's phase as a :class:`sim.host_lead.HostForm`, per comp
        (AnalyticStepModel._phase_form: the parts in the order the lowering issues them,
        forward embedding, layers, head, else head, layers reversed, embedding; a run of
        one kind as a power; composition is exact in any grouping, a max-plus product),
        once per stage of the same runs and ends, priced by the rank that holds the
        first such stage (its kind prices by the asking rank, :func:`kind_cost`).
        ``amax_keys``: per pipeline rank what its amax part's price reads (its FP8 GEMMs
        and amax group), the part after the layers; None without one."""
        forms: dict[str, list[HostForm]] = {}
        for comp in comps:
            by_shape: dict[tuple, HostForm] = {}
            row = []
            for s, layers in enumerate(stage_layers):
                runs = self._runs(layers)
                shape = (runs, is_first[s], is_last[s],
                         None if amax_keys is None else amax_keys[holders[s]])
                form = by_shape.get(shape)
                if form is None:
                    p = holders[s]
                    form = LEVEL
                    ends = []
                    if is_first[s]:
                        ends.append(kind_cost(p, "embedding", "embedding", comp).form())
                    layer_forms = [kind_cost(p, layer, kind, comp).form().repeat(count)
                                   for kind, layer, count in runs]
                    if is_last[s]:
                        head = kind_cost(p, "head", "head", comp).form()
                    after_layers = ([] if amax_keys is None else
                                    [kind_cost(p, AMAX_PART, AMAX_PART, comp).form()])
                    if comp == "F":
                        parts = (ends + layer_forms + after_layers
                                 + ([head] if is_last[s] else []))
                    else:
                        parts = (([head] if is_last[s] else []) + layer_forms[::-1]
                                 + after_layers + ends)
                    for part in parts:
                        form = form.then(part)
                    by_shape[shape] = form
                row.append(form)
            forms[comp] = row
        return forms

    def _host_rank(self, p, stages, stage_layers, kinds, is_first, is_last, split, forms,
                   kind_cost, reduction_ns, optimizer_cost, gather_ns, gathers, bucket, m,
                   placement, plan, part_key, timed=None, amax=False) -> tuple:
        """AnalyticStepModel._rank_costs of a rank whose CPU issues the kernels: (the last
        micro-batch's backward through the rank's stages from no lead, and the lead it
        leaves; the same with its buckets reduced as they fill and the optimizer from the
        lead then, and that lead; the step's parameter gathers back to back; the
        optimizer's form), as :meth:`AnalyticStepModel._walk_parts` carries the lead.
        ``timed``: the tail as the pipeline's timing runs it (:func:`_timed_tail`; a wait
        before an action: the CPU goes on issuing)."""
        tail, releases = _tail_and_releases(stages, split, timed)
        total = lead = 0
        for position, (s, comp) in enumerate(tail):
            if releases is not None and releases[position] > total:
                lead += releases[position] - total
                total = releases[position]
            form = forms[comp][s]
            total += form.total_at(lead)
            lead = form.lead_after(lead)
        if releases is not None and releases[-1] > total:
            total = releases[-1]
        last_total, last_lead = total, lead
        total = lead = dp_free = 0
        reductions: dict = {}
        for position, (s, comp) in enumerate(tail):
            if releases is not None and releases[position] > total:
                lead += releases[position] - total
                total = releases[position]
            if comp == "I":  # (an input gradient reduces nothing: its phase's form)
                form = forms["I"][s]
                total += form.total_at(lead)
                lead = form.lead_after(lead)
                continue
            # head, the layers' runs reversed, embedding: (form, sums, count)
            parts = [(*self._host_row(p, layer, kind, comp, kind_cost, plan, part_key),
                      count) for kind, layer, count in self._runs(stage_layers[s])[::-1]]
            if is_last[s]:
                parts.insert(0, (*self._host_row(p, "head", "head", comp, kind_cost,
                                                 plan, part_key), 1))
            if amax:
                parts.append((*self._host_row(p, AMAX_PART, AMAX_PART, comp, kind_cost,
                                              plan, part_key), 1))
            if is_first[s]:
                parts.append((*self._host_row(p, "embedding", "embedding", comp,
                                              kind_cost, plan, part_key), 1))
            total, lead, dp_free = _reduce_parts_hosted(
                parts, {}, bucket, total, lead, dp_free, reductions, reduction_ns, p)
        if releases is not None and releases[-1] > total:
            total = releases[-1]
        optimizer = optimizer_cost(p).form()
        if dp_free > total:  # (the CPU goes on issuing while the GPU waits for them)
            lead += dp_free - total
        finish_total = max(total, dp_free) + optimizer.total_at(lead)
        gathers_ns = (self._step_gathers_ns(p, stages, kinds, split, gather_ns, m, placement,
                                            plan) if gathers else 0)
        return last_total, last_lead, finish_total, lead, gathers_ns, optimizer

    def _host_row(self, p, part, kind, comp, kind_cost, plan, part_key) -> tuple:
        """(a part's form in ``comp``, its whole gradient bytes to the dense and expert
        buckets): :meth:`_row` with the CPU's lead."""
        sums = self._part_grads(plan, part_key, kind, part)
        if sums is None:
            raise _Unsupported  # filled kernel by kernel: analytic_step
        return kind_cost(p, part, kind, comp).form(), sums

    def _host_program(self, plan, schedule, placement) -> tuple:
        """What AnalyticStepModel._host_ends reads of the schedule's action lists, once
        per (schedule, pp, vpp, micro-batches): each rank's list as blocks of (stage,
        comp) keys each repeated some times, rank 0's first key, and each rank's last
        wait on another rank's action (sim.analytic_step.last_wait, those the rank
        ends keep) as (rank, holder, this rank's list from that action on, the holder's
        list after its action), both as blocks."""
        key = (plan.schedule, plan.pp, plan.vpp, plan.num_microbatches)
        found = self._programs.get(key)
        if found is not None:
            return found
        rows = schedule.actions(plan.pp, plan.num_microbatches, plan.vpp)
        keys = [[(action.stage, action.comp) for action in row] for row in rows]
        longest = [2 * len(placement.stages_of(p)) + 2 for p in range(len(rows))]
        blocks = tuple(repeated_blocks(row, longest[p]) for p, row in enumerate(keys))
        first = keys[0][0] if rows and rows[0] else None
        lasts = [last_wait(placement, p, row, rows) for p, row in enumerate(rows)]
        waits = []
        for p in range(len(rows)):
            last = lasts[p]
            if last is None:
                continue
            index, holder, position = last
            if lasts[holder] is not None and position < lasts[holder][0]:
                continue  # (its rank waits for others after it: as _host_ends)
            waits.append((p, holder, repeated_blocks(keys[p][index:], longest[p]),
                          repeated_blocks(keys[holder][position + 1:], longest[holder])))
        found = self._programs[key] = (blocks, first, tuple(waits))
        return found

    def _host_step(self, plan, schedule, placement, forms, rank_costs, rank_end, t_p2p,
                   wait_ns) -> int:
        """The step of a plan whose CPU issues the kernels, ns: each rank's compute end
        bounded as AnalyticStepModel._host_ends bounds it (``rank_end``: the schedule's
        timing with the fill's gather delay ``wait_ns``), then what follows its last
        backward from the lead the CPU has there (AnalyticStepModel.run)."""
        blocks, first, waits = self._host_program(plan, schedule, placement)
        composed: dict[tuple, HostForm] = {}

        def compose(keys_blocks) -> HostForm:
            form = LEVEL
            for block, count in keys_blocks:
                found = composed.get(block)
                if found is None:
                    found = LEVEL
                    for stage, comp in block:
                        found = found.then(forms[comp][stage])
                    composed[block] = found
                form = form.then(found.repeat(count))
            return form

        ends = list(rank_end)
        cpu_ends = []
        late = 0
        if first is not None:
            head = forms[first[1]][first[0]]
            late = head.total_ns - head.free_ns  # rank 0's first action, from no lead
        start = HostForm(wait_ns, wait_ns, None, 0) if wait_ns else None
        for p, row in enumerate(blocks):
            alone = compose(row)
            if start is not None:
                alone = start.then(alone)
            ends[p] = max(ends[p] + late, alone.total_ns)
            cpu_ends.append(alone.host_ns)
        gaps = [(p, holder, compose(tail).free_ns - compose(after).total_ns + t_p2p)
                for p, holder, tail, after in waits]
        settle_rank_ends(ends, gaps)
        step = 0
        for p, (last_total, last_lead, finish_total, finish_lead, gathers_ns,
                optimizer) in enumerate(rank_costs):
            after_backward = finish_total - last_total
            lead = max(ends[p] - cpu_ends[p], 0)
            if lead > last_lead:
                # the CPU is further ahead at the rank's end than its last backward alone
                # leaves it: the optimizer runs from that much more lead
                more = lead - last_lead
                after_backward -= (optimizer.total_at(finish_lead)
                                   - optimizer.total_at(finish_lead + more))
            end = max(ends[p], gathers_ns) + after_backward
            if end > step:
                step = end
        return step

    def _whole_rank_ns(self, plan, schedule, stage_layers, is_first, is_last, phases,
                       kind_cost, reduction_ns, optimizer_ns, gather_ns, part_key,
                       amax=False) -> int:
        """AnalyticStepModel._whole_rank_step without pipeline parallelism, with
        parameter gathers: one rank's list schedule of every action in order
        (AnalyticStepModel._walk with ``gathers``): an action that gathers issues its
        layers' gathers on the data-parallel stream at its start and each layer waits
        for its own; the last micro-batch's backward reduces its buckets as they fill;
        then the optimizer; ``amax``: the amax part after the layers of every phase."""
        m, bucket = plan.num_microbatches, plan.grad_bucket_bytes
        amax_part = [AMAX_PART] if amax else []
        flags = self._flags
        zero3 = plan.zero == 3
        rows: dict[tuple, tuple] = {}

        def row(part, comp: str) -> tuple:
            kind = part if isinstance(part, str) else flags[part]
            found = rows.get((kind, comp))
            if found is None:
                found = rows[(kind, comp)] = self._row(0, part, kind, comp, kind_cost, plan,
                                                       part_key)
            return found

        gathers: dict = {}

        def gather(layer: int) -> int:
            found = gathers.get(flags[layer])
            if found is None:
                found = gathers[flags[layer]] = gather_ns(0, layer)
            return found

        total = dp_free = 0
        reductions: dict = {}
        for action in schedule.actions(1, m, plan.vpp)[0]:
            comp, stage = action.comp, action.stage
            gathers_here = zero3 or (comp == "F" and action.microbatch == 0)
            reduce_now = comp in ("B", "W") and action.microbatch == m - 1
            if not gathers_here and not reduce_now:
                total += phases[comp][stage]
                continue
            layers = stage_layers[stage]
            first, last = ["embedding"] if is_first[stage] else [], \
                ["head"] if is_last[stage] else []
            if layers and (gathers_here != reduce_now) and all(
                    flags[layer] == flags[layers[0]] for layer in layers):
                # one kind of layer (head, run, embedding), in closed form
                before, after = (first, last) if comp == "F" else (last, first)
                after = amax_part + after
                n = len(layers)
                if reduce_now:  # the bucket walk's runs (as _rank_ns)
                    parts = [(*row(part, comp), 1) for part in before]
                    parts.append((*row(layers[0], comp), n))
                    parts += [(*row(part, comp), 1) for part in after]
                    total, dp_free = _reduce_parts(parts, {}, bucket, total, dp_free,
                                                   reductions, reduction_ns, 0)
                    continue
                # gathers issued back to back when the first layer is reached, layer i
                # waits for the i-th (from 1): in closed form (_gathered_end)
                for part in before:
                    total += row(part, comp)[0]
                g, c = gather(layers[0]), row(layers[0], comp)[0]
                total = _gathered_end(total, n, c, dp_free, g)
                dp_free += n * g
                for part in after:
                    total += row(part, comp)[0]
                continue
            if comp == "F":
                parts = first + list(layers) + amax_part + last
                order = layers
            else:
                parts = last + list(reversed(layers)) + amax_part + first
                order = tuple(reversed(layers))
            gathered: dict[int, int] = {}
            pending: dict[str, float] = {}
            final_index = len(parts) - 1
            for index, part in enumerate(parts):
                if gathers_here and not isinstance(part, str):
                    if not gathered:
                        # issued when the first layer is reached (after the head's
                        # bucket, which may already be on the stream), in use order
                        for layer in order:
                            dp_free += gather(layer)
                            gathered[layer] = dp_free
                    if gathered[part] > total:
                        total = gathered[part]
                part_ns, sums = row(part, comp)
                total += part_ns
                if reduce_now:
                    dp_free = _fill_buckets(pending, sums, index == final_index, bucket,
                                            total, dp_free, reductions, reduction_ns, 0)
        return max(total, dp_free) + optimizer_ns(0)

    def _row(self, p, part, kind, comp, kind_cost, plan, part_key) -> tuple:
        """(a part's list-scheduled ns in ``comp``, its whole gradient bytes to the dense
        and expert buckets)."""
        sums = self._part_grads(plan, part_key, kind, part)
        if sums is None:
            raise _Unsupported  # filled kernel by kernel: analytic_step
        return kind_cost(p, part, kind, comp).total_ns, sums

    def _fill_delay_ns(self, placement, stage_layers, kinds, kind_cost, gather_ns, t_p2p,
                       is_first, is_last, amax=False) -> int:
        """AnalyticStepModel._gather_fill_delay_fast_ns: how much later micro-batch 0's
        forward leaves the last stage because layers wait for their gathers. Each rank's
        data-parallel stream gathers its layers back to back from the step's start, in
        stage order; a layer starts at ``max(ready, its gather's end)``. Over ``n``
        layers of one kind after gathers ending at ``G`` in closed form
        (:func:`_gathered_end`): the same integers as the walk layer by layer, which
        stages of mixed kinds still take; ``amax``: each stage's amax part after its
        layers."""
        holders = placement.rank_of_stage
        flags = self._flags
        gathers: dict[tuple, int] = {}
        forwards: dict[tuple, int] = {}

        def gather(p: int, layer: int) -> int:
            key = (p, flags[layer])
            found = gathers.get(key)
            if found is None:
                found = gathers[key] = gather_ns(p, layer)
            return found

        def forward(p: int, layer: int) -> int:
            key = (p, flags[layer])
            found = forwards.get(key)
            if found is None:
                found = forwards[key] = kind_cost(p, layer, key[1], "F").total_ns
            return found

        # each stage's gathers start where its rank's earlier stages' end
        dp_free: dict[int, int] = {}
        gathered_from: list[int] = []
        for stage, layers in enumerate(stage_layers):
            p = holders[stage]
            free = dp_free.get(p, 0)
            gathered_from.append(free)
            for kind, layer, n in kinds[stage]:
                free += gather(p, layer) * n
            dp_free[p] = free
        waiting = free = 0
        last = placement.num_chunks - 1
        for stage in range(last + 1):
            p = holders[stage]
            if stage == 0:
                cost_ns = kind_cost(p, "embedding", "embedding", "F").total_ns
                waiting += cost_ns
                free += cost_ns
            layers = stage_layers[stage]
            if len(kinds[stage]) == 1:
                _, layer, n = kinds[stage][0]
                g, c = gather(p, layer), forward(p, layer)
                waiting = _gathered_end(waiting, n, c, gathered_from[stage], g)
                free += n * c
            else:
                done = gathered_from[stage]
                for layer in layers:
                    done += gather(p, layer)
                    cost_ns = forward(p, layer)
                    if done > waiting:
                        waiting = done
                    waiting += cost_ns
                    free += cost_ns
            if amax:
                cost_ns = kind_cost(p, AMAX_PART, AMAX_PART, "F").total_ns
                waiting += cost_ns
                free += cost_ns
            if stage == last:
                cost_ns = kind_cost(p, "head", "head", "F").total_ns
                waiting += cost_ns
                free += cost_ns
            if stage < last and holders[stage] != holders[stage + 1]:
                waiting += t_p2p
                free += t_p2p
        return waiting - free


def _reduce_parts_hosted(parts: list, pending: dict, bucket: float, total: int, lead: int,
                         dp_free: int, reductions: dict, reduction_ns, rank
                         ) -> tuple[int, int, int]:
    """:func:`_reduce_parts` with the CPU issuing the kernels: ``parts`` are ``(form,
    sums, count)``, each part adds ``form.total_at(lead)`` and leaves
    ``form.lead_after(lead)`` (AnalyticStepModel._walk_parts). Within a run of one form,
    once every later part adds the same ns (the lead at a fixed point, or far enough
    ahead that the list's end no longer depends on it and still growing) the rest of the
    run takes :func:`_fill_run` with that ns, its lead after the run
    ``form.repeat(run).lead_after(lead)`` (composition is exact); until then part by
    part. Returns (total, lead, dp_free)."""
    final_index = len(parts) - 1
    for index, (form, sums, count) in enumerate(parts):
        final = index == final_index
        while count:
            step_ns = form.total_at(lead)
            after = form.lead_after(lead)
            if count >= _RUN_MIN and not sums[1] and 0 < sums[0] \
                    and (count + 1) * sums[0] + pending.get("dense", 0.0) < _EXACT_MAX \
                    and (after == lead or (after >= lead and step_ns == form.free_ns)):
                # (at a fixed point every part adds the same; where total_at is free_ns,
                # lead_after = free_ns - host_at(lead) is non-decreasing in the lead, so
                # a lead that does not fall there stays there)
                run = count - 1 if final else count
                total, dp_free = _fill_run(pending, sums[0], run, step_ns, bucket, total,
                                           dp_free, reductions, reduction_ns, rank)
                lead = form.repeat(run).lead_after(lead)
                count -= run
                continue
            total += step_ns
            lead = after
            dp_free = _fill_buckets(pending, sums, final and count == 1, bucket, total,
                                    dp_free, reductions, reduction_ns, rank)
            count -= 1
    return total, lead, dp_free


def _edge_parts(forward: bool, first_stage: bool, last_stage: bool
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the parts a unit runs before its layers, after them and any amax part): a forward
    starts with the embedding on the first stage and ends with the head on the last; a
    backward runs them the other way round (the lowering's part order)."""
    lead = (("embedding",) if forward and first_stage
            else ("head",) if not forward and last_stage else ())
    tail = (("head",) if forward and last_stage
            else ("embedding",) if not forward and first_stage else ())
    return lead, tail


def _by_kind(price, p: int, flags: Sequence) -> object:
    """``layer -> price(p, layer)`` asked once per layer kind (``flags[layer]``): a
    layer's gather on rank ``p`` reads only its kind."""
    found: dict = {}

    def of(layer: int) -> int:
        value = found.get(flags[layer])
        if value is None:
            value = found[flags[layer]] = price(p, layer)
        return value

    return of


class _TailStream:
    """The data-parallel stream of a ZeRO-3 tail walk (BatchStepEvaluator._regather_walk):
    AnalyticStepModel._walk's ``run_gathers`` without SM contention. Each action's
    gathers go on the stream back to back, in issue order: once every action before it
    that reduces is walked (the lowering's program order), and a reducing action's own
    after its leading edge (``walked`` >= 1), whose buckets go first.

    Args:
        runs: per action, its layers in walk order as runs ``(kind, layer, count)``.
        reduces: per action, whether it reduces gradient buckets.
        leads: per action, 1 when an edge (head, embedding) comes before its layers.
        gather: a layer's gather, ns.
    """

    def __init__(self, runs: Sequence, reduces: Sequence[bool], leads: Sequence[int],
                 gather) -> None:
        self.runs, self.reduces, self.leads, self.gather = runs, reduces, leads, gather
        #: where the stream is free (ns): gathers and reductions both move it
        self.free_ns = 0
        #: per issued action, where each of its runs' gathers start (ns)
        self.starts: dict[int, list[int]] = {}
        self._issued = 0

    def issue(self, current: int, walked: int) -> None:
        """Issue every gather the stream reaches before part ``walked`` of action
        ``current`` (those after a reduction not issued yet wait)."""
        reduces, leads = self.reduces, self.leads
        while self._issued < len(self.runs):
            k = self._issued
            if any(reduces[current:k]):
                return  # behind a reduction not issued yet
            if k >= current and reduces[k] and (walked if k == current else 0) < leads[k]:
                return  # behind its own edge's reductions
            if self.runs[k]:
                starts = self.starts[k] = []
                for _, layer, n in self.runs[k]:
                    starts.append(self.free_ns)
                    self.free_ns += self.gather(layer) * n
            self._issued += 1


class _Unsupported(Exception):
    """A part whose gradient bytes are not whole numbers (filled kernel by kernel)."""


class _MemoryLayout:
    """The parts of a StepLowerer :func:`strategies.memory.pipeline_memory` reads
    (strategies.memory.PipelineLayout) for plans of one split whose recompute mode is the
    same on every layer (no ``recompute_layers``), each rank's answers computed once."""

    #: every layer recomputes as the plan says: the memory model then takes the plan's
    #: mode (strategies.memory._modes), as StepLowerer.recompute_of gives it layer by layer
    recompute_of = None

    def __init__(self, schedule, placement, stage_layers) -> None:
        self.schedule = schedule
        self.placement = placement
        self.stage_layers = stage_layers
        self.num_stages = placement.num_stages
        self.chunk_copies = placement.num_stages // placement.num_chunks
        ranks = range(placement.pp)
        self._layers = [[layer for s in placement.stages_of(p) for layer in stage_layers[s]]
                        for p in ranks]
        self._first = [any(placement.is_first(s) for s in placement.stages_of(p))
                       for p in ranks]
        self._last = [any(placement.is_last(s) for s in placement.stages_of(p))
                      for p in ranks]

    def rank_layers(self, p: int) -> list[int]:
        """StepLowerer.rank_layers (callers must not change the list)."""
        return self._layers[p]

    def holds_embedding(self, p: int) -> bool:
        """StepLowerer.holds_embedding."""
        return self._first[p]

    def holds_head(self, p: int) -> bool:
        """StepLowerer.holds_head."""
        return self._last[p]
