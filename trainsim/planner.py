"""Capacity planning: enumerate parallel plans, prune, simulate, rank by time to train.

The search, in order (each step says how many candidates it drops and why):

1. **Enumerate** every combination of the search space (:class:`SearchSpace`): tp, pp,
   cp, ep, vpp (with the interleaved schedule), micro-batch, ZeRO stage, recompute and
   schedule; dp is what is left of the GPU count.
2. **Invalid**: :func:`strategies.plan.validate_plan` rejects a combination (tp not
   dividing the heads, layers not splitting over pp*vpp, batch not divisible, ...).
   Reasons are grouped by their message with the numbers blanked out.
3. **Out of memory**: per-rank memory (:func:`strategies.memory.rank_memory` under the
   schedule's in-flight micro-batches) is checked *before* anything is simulated; it is
   closed-form and costs microseconds.
4. **Dominated**: of plans that differ only in recompute, the lightest recompute that
   fits is kept (recompute only adds kernels; it never removes communication).
5. **Rank**: every feasible plan is simulated at the ranking fidelity (``analytic``, the
   closed-form step model: its step time, throughput and peak memory from
   :class:`sim.analytic_batch.BatchStepEvaluator`, well under a ms per plan once the
   distinct layer shapes are priced; the best ``top`` then get their full result, whose
   step must equal the ranked one), ranked, and the best ``top`` are
   simulated again at the final fidelity (``event``, the SimPy replay) and re-ranked.
   Ranking is by days to train including failure goodput (effective tokens/s when no
   token target is given), or by cost: the top plans are chosen at the simulated step
   (so the lower bound prunes exactly) and ordered by the **median** of their step's
   prediction band (:mod:`sim.step_bands`).
   A plan whose 80 % band overlaps the best plan's is marked ``tied_with_best``: the
   simulator cannot tell them apart.

Failure goodput: the failure profile (``llama3-h100`` by default) gives the job's MTBF at
its GPU count; the checkpoint interval is Young-Daly ``sqrt(2 C M)`` for the model's
checkpoint; the goodput at that interval is the exact exponential renewal model when it
applies, else the first-order model (strategies.failures). It depends on the GPU count and
the model, not on the plan's factors, so it is computed once per GPU count.

Every returned plan carries the ``trainsim simulate`` command and the scenario
(:mod:`trainsim.scenario`) that reproduce its step time exactly (same plan, same fidelity).

The search space's fields are ParallelPlan's fields whose metadata says ``search="list"``
(:class:`SearchSpace` must have one attribute per such field; a test checks it); the
other fields (``fixed``) take one value for every candidate (``fixed`` argument).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shlex
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import pandas as pd

from hardware.spec import ClusterSpec
from strategies import failures as fl
from strategies import model_costs
from strategies.memory import OutOfMemoryError
from strategies.model_spec import ModelSpec
from strategies.plan import RECOMPUTE, ZERO_STAGES, ParallelPlan, validate_plan
from strategies.schedules import SCHEDULES, get_schedule
from trainsim import defaults
from trainsim.version import VERSION

SECONDS_PER_DAY = 86_400.0
#: Ranking order of recompute modes: lighter first (less recomputed work).
_RECOMPUTE_WEIGHT = {"none": 0, "selective": 1, "full": 2}


def ranking_fidelities() -> tuple[str, str]:
    """(fidelity to rank all candidates with, fidelity to re-simulate the top plans at).

    Where the simulator offers ``event`` (the SimPy replay) next to a closed-form
    ``analytic``, the search ranks at ``analytic`` and confirms at ``event``; where
    ``analytic`` is itself the replay (no ``event`` level), both are ``analytic``.
    """
    from sim import step

    levels = getattr(step, "STEP_FIDELITIES", ("analytic",))
    return ("analytic", "event") if "event" in levels else ("analytic", "analytic")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Values the search tries per plan field; ``None`` = every valid value.

    Defaults leave out what never wins in this simulator's model and say why:
    ZeRO 0 (replicated optimizer state, same traffic as ZeRO 1) and 2 (times exactly as
    ZeRO 1 here), selective recompute (saves nothing under flash attention,
    strategies.memory) and GPipe (1F1B's bubble with more memory). Ask for them
    explicitly to include them.

    Attributes:
        tp, pp, cp, ep, vpp, micro_batch: sizes to try. None: tp = divisors of the KV
            heads up to the NVLink domain; pp = divisors of the layer count and powers
            of two, leaving at least 4 layers per stage (uneven splits are allowed); cp = 1, 2, 4; ep = divisors of
            the expert count; vpp = 2, 4 (interleaved only); micro-batch 1, 2, 4.
        zero: ZeRO stages. recompute: modes. schedule: pipeline schedules (None: those
            registered as searched by default, strategies.schedules).
    """

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] = (1, 2, 4)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "full")
    schedule: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.schedule is None:  # the registered schedules worth trying unasked
            object.__setattr__(self, "schedule", tuple(
                name for name in SCHEDULES if get_schedule(name).searched_by_default))
        for name in ("tp", "pp", "cp", "ep", "vpp", "micro_batch"):
            values = getattr(self, name)
            if values is not None and not values:
                raise ValueError(f"{name}: no values given; give whole numbers >= 1")
            for v in values or ():
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name}: {v!r} is not valid; give whole numbers >= 1")
        for name, valid in (("zero", ZERO_STAGES), ("recompute", RECOMPUTE),
                            ("schedule", SCHEDULES)):
            for v in getattr(self, name):
                if v not in valid:
                    raise ValueError(f"{name}: {v!r} is not valid; valid: "
                                     f"{', '.join(map(str, valid))}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _reason(message: str) -> str:
    """A grouping key for a rejection: the message with its numbers blanked out."""
    return re.sub(r"\d+(\.\d+)?", "N", message.split(";")[0])


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, gpus: int, *, seq_len: int,
                    global_batch: int, space: SearchSpace = SearchSpace(),
                    dtype: str = "bf16", fixed: Mapping[str, object] | None = None
                    ) -> tuple[list[ParallelPlan], Counter]:
    """Every valid plan of the search space on ``gpus`` GPUs.

    ``fixed``: other ParallelPlan fields, the same for every candidate.

    Returns:
        (valid plans in a fixed order, Counter of rejection reasons for invalid ones).
    """
    experts = model.moe.num_experts if model.moe else 0
    tps = space.tp or [d for d in _divisors(model.num_kv_heads)
                       if d <= cluster.scale_up.domain_gpus]
    # At least 4 layers per stage by default: thinner stages are valid (ask for them
    # with pp) but move more activations per layer and never won in our searches.
    pps = space.pp or sorted(p for p in set(_divisors(model.num_layers))
                             | {2**k for k in range(model.num_layers.bit_length())}
                             if 4 * p <= model.num_layers or p == 1)
    cps = space.cp or [1, 2, 4]
    eps = space.ep or ([d for d in _divisors(experts)] if experts else [1])
    plans, rejected = [], Counter()
    cluster_gpus = cluster.max_nodes * cluster.gpus_per_node
    # Without pipeline parallelism every schedule runs the same actions: keep the
    # first one that runs on a single stage per rank.
    without_pipeline = next((name for name in space.schedule
                             if 1 in get_schedule(name).vpp_choices), None)
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if gpus % (tp * pp * cp):
            continue  # not a factorisation of the GPU count: not a candidate at all
        dp = gpus // (tp * pp * cp)
        for ep, mb, zero, rc, sched in itertools.product(
                eps, space.micro_batch, space.zero, space.recompute, space.schedule):
            if pp == 1 and sched != without_pipeline:
                rejected["equivalent: a schedule has no effect without pipeline "
                         "parallelism"] += 1
                continue
            choices = get_schedule(sched).vpp_choices
            for vpp in choices if choices == (1,) or space.vpp is None else space.vpp:
                try:
                    plan = ParallelPlan(**{**(fixed or {}), "dp": dp, "tp": tp, "pp": pp,
                                           "cp": cp, "ep": ep, "vpp": vpp, "micro_batch": mb,
                                           "global_batch": global_batch, "seq_len": seq_len,
                                           "zero": zero, "recompute": rc, "schedule": sched,
                                           "dtype": dtype})
                    validate_plan(plan, num_layers=model.num_layers,
                                  num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                                  num_experts=experts, gpus=gpus, cluster_gpus=cluster_gpus)
                except ValueError as problem:
                    rejected[f"invalid: {_reason(str(problem))}"] += 1
                    continue
                plans.append(plan)
    return plans, rejected


def step_time_lower_bound_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan
                            ) -> float:
    """A lower bound on the simulated step time, seconds, used to skip plans that cannot
    reach the top without simulating them.

    The transformer layers' kernels (:func:`strategies.model_costs.layer_kernels`, the
    ones the lowering emits) priced by the cluster's compute model: forward + backward
    per micro-batch, plus the forward again under full recompute (the selective kernels
    under selective recompute); summed over the layers, divided by ``pp`` (the critical
    pipeline rank computes at least the average), times ``m`` micro-batches, plus the
    schedule's own lower bound on the bubble
    (:meth:`strategies.schedules.PipelineSchedule.bubble_lower_bound`). Embedding,
    head, communication, the optimizer and ZeRO-3 gathers only add to the real time.
    Every kernel runs at the job's expected slowest GPU's pace
    (:func:`hardware.cost.slowest_gpu_factor`; the layers are priced on one GPU, where it
    is 1, and scaled by the job's). Tests check the bound against the simulator.
    """
    from hardware.cost import slowest_gpu_factor

    args = (plan.micro_batch, plan.seq_len, plan.tp, plan.cp, plan.ep,
            plan.sequence_parallel, plan.dtype, plan.flash_attention, plan.recompute,
            plan.fp8_recipe, plan.elementwise, plan.attention_impl)
    layers_s, smallest_fill = _layers_compute_s(model, cluster, args)
    pace = slowest_gpu_factor(cluster, plan.world_size)
    layers_s, smallest_fill = layers_s * pace, smallest_fill * pace
    per_microbatch = layers_s / plan.pp
    compute_s = per_microbatch * plan.num_microbatches
    if plan.pp == 1:
        return compute_s
    # a stage's F + I - W (Qi et al. 2023) is at least the smallest layer's, times the
    # fewest layers a stage holds
    stages = plan.pp * plan.vpp
    fill = max(0.0, smallest_fill) * (model.num_layers // stages) * plan.vpp
    return compute_s + get_schedule(plan.schedule).bubble_lower_bound(
        plan.pp, plan.vpp, per_microbatch, fill)


_LAYER_CACHE: dict[tuple, tuple] = {}
_KINDS_CACHE: dict[int, tuple] = {}
_SUMS_CACHE: dict[tuple, tuple] = {}


def _layers_compute_s(model: ModelSpec, cluster: ClusterSpec, args: tuple
                      ) -> tuple[float, float]:
    """(every layer's compute for one micro-batch summed in layer order, the smallest
    layer's ZB-H1 fill), seconds, memoised per (model, cluster, kernel arguments): plans
    that differ only in pp, vpp, dp, ZeRO or schedule share them (same floats: the same
    sum in the same order). Specs are keyed by identity and kept alive in the entry."""
    key = (id(model), id(cluster), *args)
    entry = _SUMS_CACHE.get(key)
    if entry is None or entry[0] is not model or entry[1] is not cluster:
        if len(_SUMS_CACHE) > 100_000:
            _SUMS_CACHE.clear()
        # each layer kind priced once; the sum stays in layer order
        priced: dict[tuple[bool, int], tuple] = {}
        kinds = []
        for kind in _layer_kinds(model):
            found = priced.get(kind)
            if found is None:
                found = priced[kind] = _layer_compute_s(model, cluster, kind, *args)
            kinds.append(found)
        entry = (model, cluster, sum(total for total, _ in kinds), min(f for _, f in kinds))
        _SUMS_CACHE[key] = entry
    return entry[2], entry[3]


def _layer_kinds(model: ModelSpec) -> tuple[tuple[bool, int], ...]:
    """``model.layer_kind`` of every layer, memoised by the spec's identity (kept alive
    in the entry, so an id is never reused while it can be looked up)."""
    entry = _KINDS_CACHE.get(id(model))
    if entry is None or entry[0] is not model:
        if len(_KINDS_CACHE) > 1000:
            _KINDS_CACHE.clear()
        entry = (model, tuple(model.layer_kind(i) for i in range(model.num_layers)))
        _KINDS_CACHE[id(model)] = entry
    return entry[1]


def _layer_compute_s(model: ModelSpec, cluster: ClusterSpec, kind: tuple[bool, int],
                     *args) -> float:
    """(seconds of compute of one layer for one micro-batch: forward, backward and
    recompute; its ZB-H1 fill F + I - W), memoised: the specs are unhashable, so they are keyed by identity and kept alive in
    the cache entry (an id is never reused while its object lives)."""
    key = (id(model), id(cluster), kind, *args)
    if key not in _LAYER_CACHE:
        if len(_LAYER_CACHE) > 100_000:
            _LAYER_CACHE.clear()
        _LAYER_CACHE[key] = (model, cluster, _price_layer(model, cluster, kind, *args))
    return _LAYER_CACHE[key][2]


def _price_layer(model: ModelSpec, cluster: ClusterSpec, kind: tuple[bool, int],
                 micro_batch: int, seq_len: int,
                 tp: int, cp: int, ep: int, sequence_parallel: bool, dtype: str,
                 flash_attention: bool, recompute: str, fp8_recipe: str, elementwise: str,
                 attention_impl: str) -> tuple[float, float]:
    from hardware.cost import CostModel
    from hardware.topology import ClusterLayout
    from strategies.collectives.catalog import ALGORITHMS
    from strategies.lowering import compute_op

    cost = CostModel(ClusterLayout(cluster, 1, 1), ALGORITHMS, fidelity="analytic")
    impl = "" if attention_impl == "auto" else attention_impl
    layer = next(i for i in range(model.num_layers) if model.layer_kind(i) == kind)
    total = fill = 0.0
    for k in model_costs.layer_kernels(model, layer, micro_batch=micro_batch, seq_len=seq_len,
                                       tp=tp, cp=cp, ep=ep, sequence_parallel=sequence_parallel,
                                       dtype=dtype, flash_attention=flash_attention,
                                       dropout=model.dropout, fp8_recipe=fp8_recipe,
                                       elementwise=elementwise):
        def price(phase: str) -> float:
            return cost.compute_ns(compute_op(k, k.name, phase, attention_impl=impl)) / 1e9
        fwd = price("F")
        total += fwd + price("B")
        if recompute == "full" or (recompute == "selective" and k.selective_recompute):
            total += fwd
        weight = price("W") if k.bwd_weight_flops else 0.0
        fill += fwd + price("I") - weight
    return total, fill


def failure_goodput(model: ModelSpec, cluster: ClusterSpec, gpus: int, *,
                    profile: str = "llama3-h100") -> dict[str, float]:
    """Expected goodput of a ``gpus``-GPU job of ``model`` checkpointing at the
    Young-Daly interval under ``profile``.

    Returns:
        ``goodput`` (fraction), ``checkpoint_interval_s`` (Young-Daly), ``mtbf_s`` (job),
        ``checkpoint_s`` (blocking save), ``goodput_model`` (``exact`` or
        ``first-order``).

    Raises:
        ValueError: for an unknown profile or a GPU count the cluster cannot place.
    """
    from sim.longrun import prepare_long_run

    s = prepare_long_run(cluster=cluster, gpus=gpus, days=1.0, profile=profile, model=model)
    interval_s = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
    if not math.isfinite(interval_s) or interval_s <= 0:
        interval_s = SECONDS_PER_DAY  # no failures or free checkpoints: save daily
    kw = dict(interval_s=interval_s, checkpoint_s=s.costs.blocking_s,
              detection_s=s.mean_detection_s, restart_s=s.costs.restart_s, mtbf_s=s.mtbf_s)
    exact = s.exact_model_applies
    goodput = (fl.expected_goodput_exponential(**kw) if exact
               else fl.first_order_goodput(**kw, upload_s=s.costs.upload_s))
    return {"goodput": goodput, "checkpoint_interval_s": interval_s, "mtbf_s": s.mtbf_s,
            "checkpoint_s": s.costs.blocking_s,
            "goodput_model": "exact" if exact else "first-order"}


def _evaluate_chunk(args: tuple) -> list[dict]:
    """Worker: simulate plans (the memory check comes first and costs ~1 ms); each
    result is ``StepResult.to_dict()`` or ``{"out_of_memory": reason}``."""
    from sim.step import simulate_step

    model, cluster, plans, fidelity = args
    cluster, cache = _pricing_cache(cluster)
    # one copy of each model per process: a worker unpickles one per chunk, and the
    # memory model's memo knows a model by identity
    model = _MODELS.setdefault(model, model)
    out = []
    for plan in plans:
        try:
            out.append(simulate_step(model, cluster, plan, fidelity=fidelity,
                                     cache=cache).to_dict())
        except OutOfMemoryError as oom:
            b = oom.breakdown
            states = b.weights_bytes + b.gradients_bytes + b.optimizer_bytes
            what = "model states" if states >= b.activations_bytes else "activations"
            out.append({"out_of_memory": f"out of memory ({what} dominate)"})
    return out


def _rank_chunk(args: tuple) -> list[dict]:
    """Worker: what the ranking needs of each plan. At ``analytic`` fidelity the step
    time, throughput and peak memory from :class:`sim.analytic_batch.BatchStepEvaluator`
    (the values :func:`_evaluate_chunk` gives, without a band, breakdown or result per
    plan; :func:`search` evaluates in full the plans that reach the top); else
    :func:`_evaluate_chunk`'s results."""
    model, cluster, plans, fidelity = args
    if fidelity != "analytic":
        return _evaluate_chunk(args)
    from sim.analytic_batch import BatchStepEvaluator

    cluster, cache = _pricing_cache(cluster)
    model = _MODELS.setdefault(model, model)
    key = (id(model), id(cluster))
    entry = _EVALUATORS.get(key)
    if entry is None or entry[0] is not model or entry[1] is not cluster:
        if len(_EVALUATORS) > 16:
            _EVALUATORS.clear()
        entry = _EVALUATORS[key] = (model, cluster, BatchStepEvaluator(model, cluster, cache))
    return entry[2].rank_results(plans)


_CACHES: dict[bytes, tuple] = {}
_MODELS: dict = {}
#: BatchStepEvaluator per (model, cluster) of this process (kept alive with them)
_EVALUATORS: dict[tuple, tuple] = {}


def _pricing_cache(cluster: ClusterSpec):
    """(the canonical copy of ``cluster`` in this process, its PricingCache).

    A cluster arrives re-pickled with every chunk; the cache keys specs by identity, so
    each process maps equal specs (same pickle) onto one object and one cache, and
    collective prices are computed once per process instead of once per chunk.
    """
    import hashlib
    import pickle

    from sim.analytic_step import PricingCache

    key = hashlib.sha256(pickle.dumps(cluster)).digest()
    if key not in _CACHES:
        if len(_CACHES) > 16:
            _CACHES.clear()
        _CACHES[key] = (cluster, PricingCache())
    return _CACHES[key]


def _parallel(func, model, cluster, plans: list, extra: tuple, workers: int,
              tick: Callable[[int], None]) -> list:
    """``func`` over ``plans`` in chunks on ``workers`` processes; results in plan order
    (so the search is deterministic whatever finishes first)."""
    from trainsim.sweeps import _chunks, map_local

    indexed = list(enumerate(plans))
    chunks = _chunks(indexed, workers)
    results: dict[int, object] = {}

    for start, values in map_local(_Indexed(func, model, cluster, extra), chunks, workers):
        for offset, value in enumerate(values):
            results[start + offset] = value
        tick(len(values))
    return [results[i] for i in range(len(plans))]


class _Indexed:
    """Picklable chunk task: ``[(i, plan), ...] -> (first i, func over the plans)``."""

    def __init__(self, func, model, cluster, extra: tuple) -> None:
        self.func, self.model, self.cluster, self.extra = func, model, cluster, extra

    def __call__(self, chunk: list) -> tuple[int, list]:
        return chunk[0][0], self.func((self.model, self.cluster, [p for _, p in chunk],
                                       *self.extra))


#: Plan fields every plan row and command states, whatever their value.
_CORE_FLAGS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch", "seq_len",
               "zero", "recompute", "schedule", "dtype")


def plan_flags(plan: ParallelPlan) -> dict[str, object]:
    """The plan as ``trainsim simulate`` option values (field -> value): the core fields,
    and every other field that differs from its ParallelPlan default."""
    from trainsim.plan_fields import PLAN_FIELDS

    flags = {name: getattr(plan, name) for name in _CORE_FLAGS}
    for f in PLAN_FIELDS:
        value = getattr(plan, f.name)
        if f.name not in flags and value != f.default:
            flags[f.name] = list(value) if isinstance(value, tuple) else value
    return flags


def simulate_command(model: str, cluster: str, gpus: int, plan: ParallelPlan, fidelity: str,
                     overrides: Mapping[str, object] | None = None,
                     calibration: str | None = None) -> list[str]:
    """argv of the ``trainsim simulate`` call that reproduces a plan's step time."""
    from trainsim.plan_fields import BY_NAME

    argv = ["simulate", "--model", model, "--cluster", cluster, "--gpus", str(gpus)]
    for name, value in plan_flags(plan).items():
        option = BY_NAME[name].options[0]
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, list):
            argv += [option, ",".join(map(str, value))]
        elif value is not None:
            argv += [option, str(value)]
    for key, value in (overrides or {}).items():
        argv += ["--set", f"{key}={value}"]
    if calibration is not None:
        argv += ["--calibration", calibration]
    return argv + ["--fidelity", fidelity]


@dataclass
class PlanReport:
    """Result of a plan search.

    Attributes:
        plans: ranked plans, best first; each a dict with ``rank``, ``plan`` (the fields),
            the keys of ``StepResult.to_dict()`` (step_time_s, tokens_per_s, mfu, ...),
            ``goodput``, ``checkpoint_interval_s``, ``effective_tokens_per_s``,
            ``days_to_train`` and ``cost`` (None without tokens / price), at the
            simulated step; ``days_to_train_p10``/``_p50``/``_p90`` at the band's
            quantiles (same goodput), ``tied_with_best`` (its step-time band overlaps
            the best plan's), ``fidelity``,
            ``ranked_step_time_s`` (at the ranking fidelity), ``command`` (the
            ``trainsim simulate`` call that reproduces the step time), ``scenario``
            (the same as a scenario file's data, :mod:`trainsim.scenario`) and
            ``trainsim_version``.
        counts: ``enumerated``, ``invalid``, ``out_of_memory``, ``dominated``,
            ``feasible``, ``simulated``.
        dropped: reason -> number of candidates dropped for it.
        inputs: model, cluster, gpus, seq_len, global_batch, tokens, price, profile,
            fidelities, sort, overrides, calibration, fixed plan fields.
    """

    plans: list[dict]
    counts: dict[str, int]
    dropped: dict[str, int]
    inputs: dict[str, object]

    def to_frame(self) -> pd.DataFrame:
        """One row per ranked plan: its fields and headline numbers."""
        rows = []
        for p in self.plans:
            rows.append({"rank": p["rank"], **p["plan"], "step_time_s": p["step_time_s"],
                         "step_time_p10_s": p["step_time_p10_s"],
                         "step_time_p50_s": p["step_time_p50_s"],
                         "step_time_p90_s": p["step_time_p90_s"],
                         "tied_with_best": p["tied_with_best"], "mfu": p["mfu"], "tokens_per_s": p["tokens_per_s"],
                         "peak_memory_GiB": p["peak_memory_bytes"] / 2**30,
                         "goodput": p["goodput"], "days_to_train": p["days_to_train"],
                         "days_to_train_p10": p["days_to_train_p10"],
                         "days_to_train_p90": p["days_to_train_p90"],
                         "cost": p["cost"], "fidelity": p["fidelity"]})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable: plans, counts, dropped reasons and inputs."""
        return {"plans": self.plans, "counts": self.counts, "dropped": self.dropped,
                "inputs": self.inputs}


#: Largest price of a GPU-hour a plan search takes (in the user's currency): a million,
#: ~10^5 x any cloud list price; past it a cost of 10^8 GPU-hours overflows the float
#: range into infinity.
MAX_PRICE_PER_GPU_HOUR = 1e6


def _positive_number(name: str, value, *, integer: bool = False,
                     maximum: float | None = None):
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) \
        or (integer and not float(value).is_integer()) or not value > 0 \
        or not math.isfinite(value) or (maximum is not None and value > maximum)
    if bad:
        most = "" if maximum is None else f" and at most {maximum:g}"
        raise ValueError(f"{name}: {value!r} is not valid; give a "
                         f"{'whole number' if integer else 'number'} > 0{most}")
    return int(value) if integer else float(value)


def search(model: str | ModelSpec, *, cluster: str | ClusterSpec = defaults.CLUSTER,
           gpus: int, seq_len: int = defaults.SEQ_LEN, global_batch: int | None = None,
           tokens: float | str | None = None, price_per_gpu_hour: float | None = None,
           top: int = 10, sort: str = "time", profile: str = "llama3-h100",
           space: SearchSpace | None = None, workers: int | None = None,
           overrides: Mapping[str, object] | None = None, dtype: str = "bf16",
           calibration: str | None = None, fixed: Mapping[str, object] | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> PlanReport:
    """Find the best parallel plans for ``model`` on ``gpus`` GPUs of ``cluster``.

    Every feasible plan is simulated at the ranking fidelity; the best ``top`` again at
    the final fidelity (:func:`ranking_fidelities`), and re-ranked.

    Args:
        model: preset name, model file, or spec.
        cluster: preset name, preset file or spec. gpus: GPUs of the job.
        seq_len: tokens per sequence. global_batch: sequences per step (default
            :func:`trainsim.defaults.global_batch`: ~4 Mi tokens, a power of two).
        tokens: token target (e.g. ``"15T"``): gives ``days_to_train``.
        price_per_gpu_hour: with tokens, gives ``cost`` (GPU-hours x price).
        top: plans returned. sort: ``time`` (effective tokens/s, i.e. days to train) or
            ``cost``.
        profile: failure profile for goodput.
        space: search space (default :class:`SearchSpace`).
        workers: processes (default: the CPU count).
        overrides: dotted cluster preset keys to change.
        dtype: compute dtype of every plan.
        calibration: calibration file (trainsim calibrate) applied after the overrides.
        fixed: other ParallelPlan fields, the same for every plan (e.g.
            ``{"sequence_parallel": False}``).
        progress: ``callback(phase, done, total)``.

    Raises:
        ValueError: one line for bad inputs, or when no plan is feasible (naming the most
            common reason).
    """
    from sim.longrun import parse_tokens
    from trainsim import resolve
    from trainsim.scenario import Scenario

    spec = resolve.load_model_ref(model)
    base = Scenario(model=model, cluster=cluster, overrides=dict(overrides or {}),
                    calibration=calibration)
    cspec = resolve.cluster_spec(base)
    gpus = _positive_number("gpus", gpus, integer=True)
    resolve.check_fits_cluster(gpus, cspec)
    seq_len = _positive_number("seq_len", seq_len, integer=True)
    top = _positive_number("top", top, integer=True)
    if sort not in ("time", "cost"):
        raise ValueError(f"sort: {sort!r} is not valid; valid: time, cost")
    if sort == "cost" and (price_per_gpu_hour is None or tokens is None):
        raise ValueError("sort: 'cost' needs tokens and a price per GPU-hour")
    token_count = None if tokens is None else parse_tokens(tokens)
    price = None if price_per_gpu_hour is None else _positive_number(
        "price_per_gpu_hour", price_per_gpu_hour, maximum=MAX_PRICE_PER_GPU_HOUR)
    global_batch = defaults.global_batch(seq_len, gpus) if global_batch is None \
        else _positive_number("global_batch", global_batch, integer=True)
    space = space or SearchSpace()
    rank_fidelity, final_fidelity = ranking_fidelities()
    workers = (os.cpu_count() or 1) if workers is None else \
        _positive_number("workers", workers, integer=True)
    report = progress or (lambda phase, done, total: None)
    if gpus > cspec.gpus_per_node and gpus % cspec.gpus_per_node:
        raise ValueError(f"gpus: {gpus} is not a whole number of {cspec.gpus_per_node}-GPU "
                         f"nodes of {cspec.name!r}; give a multiple of {cspec.gpus_per_node}")
    fail = failure_goodput(spec, cspec, gpus, profile=profile)

    valid, invalid = enumerate_plans(spec, cspec, gpus, seq_len=seq_len,
                                     global_batch=global_batch, space=space, dtype=dtype,
                                     fixed=fixed)
    bounds = {p: step_time_lower_bound_s(spec, cspec, p) for p in valid}
    ordered = sorted(valid, key=lambda p: (bounds[p], _plan_key(p)))
    rows, dropped, fits = [], Counter(), {}
    tick = _ticker(report, f"simulating ({rank_fidelity})", len(ordered))
    batch, examined = 16, 0
    # A long search ranks on every core: one pool for the whole search (each worker keeps
    # its caches), each batch split over it, results in plan order; a short one stays in
    # this process (starting processes costs more than it saves).
    pool = (_RankingPool(workers) if workers > 1 and len(ordered) >= _POOL_MIN_PLANS
            else None)
    try:
        rows, examined = _rank(ordered, bounds, top, batch, pool, spec, cspec, rank_fidelity,
                               fits, dropped, tick, fail, token_count, price)
    finally:
        if pool is not None:
            pool.close()
    # Heavier recompute simulated in the same batch as a lighter one that fits.
    rows = [r for r in rows if not any(
        fits.get(replace(r["_plan"], recompute=m)) for m in RECOMPUTE
        if _RECOMPUTE_WEIGHT[m] < _RECOMPUTE_WEIGHT[r["_plan"].recompute])]
    dominated_late = sum(fits.values()) - len(rows)
    if dominated_late:
        dropped["dominated: heavier recompute than another that fits"] += dominated_late
    examined = min(examined, len(ordered))
    tick(len(ordered) - examined)  # the plans bounded out are done too: the bar ends full
    counts = {"enumerated": len(valid) + sum(invalid.values()),
              "invalid": sum(v for k, v in invalid.items() if k.startswith("invalid")),
              "equivalent": sum(v for k, v in invalid.items() if k.startswith("equivalent")),
              "examined": examined,
              "out_of_memory": sum(v for k, v in dropped.items() if k.startswith("out of")),
              "dominated": sum(v for k, v in dropped.items() if k.startswith("dominated")),
              "feasible": len(rows), "simulated": len(rows) + dominated_late,
              "final_simulated": 0,
              "bounded": len(ordered) - examined}
    if counts["bounded"]:
        dropped["bounded: step-time lower bound above the top plans' simulated time"] = \
            counts["bounded"]
    reasons = dict(sorted({**invalid, **dropped}.items(), key=lambda kv: (-kv[1], kv[0])))
    if not rows:
        top_reason = next(iter(reasons), "no candidate")
        raise ValueError(f"gpus: no feasible plan for {spec.name} on {gpus} GPUs of "
                         f"{cspec.name} ({counts['enumerated']} tried, most dropped as "
                         f"{top_reason!r}); valid: more GPUs, another global batch or a "
                         "wider search space")
    rows.sort(key=lambda row: _sort_key(row, sort))
    best = _full_rows(rows[:top], spec, cspec, rank_fidelity, fail, token_count, price)
    confirmed = _within_confirm_budget(spec, best) if final_fidelity != rank_fidelity else []
    # plans whose analytic result is the event replay's by construction
    # (analytic_equals_event: no pipeline) keep their ranked result, relabelled
    equal = [r for r in confirmed
             if analytic_equals_event(r["_plan"], rank_fidelity, final_fidelity, spec)]
    replayed = [r for r in confirmed if not any(r is e for e in equal)]
    tick_confirm = _ticker(report, f"confirming ({final_fidelity})", len(confirmed))
    redone = {id(r): {**r, "fidelity": final_fidelity, "confirmed_by": "construction"}
              for r in equal}
    tick_confirm(len(equal))
    if replayed:
        again = _parallel(_evaluate_chunk, spec, cspec, [r["_plan"] for r in replayed],
                          (final_fidelity,), workers, tick_confirm)
        redone.update({id(r): _row(r["_plan"], res, fail, token_count, price, final_fidelity,
                                   ranked_step_time_s=r["step_time_s"])
                       for r, res in zip(replayed, again)})
    best = [redone.get(id(r), r) for r in best]
    counts["final_simulated"] = len(confirmed)
    counts["final_replayed"] = len(replayed)
    if equal:
        reasons[f"at {final_fidelity} without a replay: no pipeline, where "
                f"{rank_fidelity} equals {final_fidelity} (tests/test_planner.py)"] = len(equal)
    if final_fidelity != rank_fidelity and len(confirmed) < len(best):
        reasons[f"kept at {rank_fidelity}: past the {final_fidelity} replay budget of "
                f"{MAX_CONFIRM_LAYER_PASSES:,} layer passes"] = len(best) - len(confirmed)
    best.sort(key=lambda row: _sort_key(row, sort, median=True))
    for row in best:
        row["tied_with_best"] = bands_overlap(row, best[0])
    plans = []
    for i, row in enumerate(best, 1):
        plan = row.pop("_plan")
        scenario = resolve.resolved_scenario(base, plan=plan, gpus=gpus,
                                             fidelity=row["fidelity"]).to_dict()
        command = simulate_command(scenario["model"], scenario["cluster"], gpus, plan,
                                   row["fidelity"], overrides, scenario.get("calibration"))
        plans.append({"rank": i, **row, "command": "trainsim " + shlex.join(command),
                      "scenario": scenario, "trainsim_version": VERSION})
    inputs = {"model": spec.name, "cluster": cspec.name, "gpus": gpus, "seq_len": seq_len,
              "global_batch": global_batch, "tokens": token_count,
              "price_per_gpu_hour": price, "profile": profile, "sort": sort,
              "ranking_fidelity": rank_fidelity, "final_fidelity": final_fidelity,
              "overrides": dict(overrides or {}), "calibration": calibration,
              "fixed": dict(fixed or {}),
              **{f"failure_{k}": v for k, v in fail.items()}}
    return PlanReport(plans=plans, counts=counts, dropped=reasons, inputs=inputs)


#: Plans to rank before a search starts worker processes for it. Each worker prices its
#: collectives again (cold caches) and ships every result's dict back, so a pool pays
#: only for large searches: llama3-70b on 1,024 GPUs (4,592 plans, 1,248 examined)
#: ranked in 12-14 s in one process and 17-20 s with a pool of 2 on the 2-core
#: development machine at load ~3.3 (same runs, alternated).
_POOL_MIN_PLANS = 8192


class _RankingPool:
    """Worker processes that rank the batches of one search: each batch is split into
    one contiguous chunk per worker and the results come back in plan order, so the
    search (its counts, its top plans) is the same as in one process."""

    def __init__(self, workers: int) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.workers = workers
        self._pool = ProcessPoolExecutor(max_workers=workers)

    def evaluate(self, spec, cspec, plans: list, fidelity: str) -> list[dict]:
        """:func:`_rank_chunk` over ``plans`` on the workers, in plan order."""
        size = -(-len(plans) // self.workers) or 1
        futures = [self._pool.submit(_rank_chunk, (spec, cspec, plans[i:i + size],
                                                   fidelity))
                   for i in range(0, len(plans), size)]
        return [result for future in futures for result in future.result()]

    def close(self) -> None:
        """Stop the workers."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _rank(ordered: list, bounds: dict, top: int, batch: int, pool: _RankingPool | None,
          spec, cspec, fidelity: str, fits: dict, dropped: Counter, tick, fail: dict,
          token_count, price) -> tuple[list[dict], int]:
    """Simulate the plans in bound order, ``batch`` at a time, until no plan left can
    beat the ``top``-th (its lower bound is above that plan's simulated time); a plan
    whose lighter-recompute twin already fits is dropped unsimulated. Fills ``fits``
    and ``dropped``; returns (rows of the plans that fit, plans examined)."""
    rows: list[dict] = []
    examined = 0
    while examined < len(ordered):
        fast = sorted(r["step_time_s"] for r in rows)
        if len(fast) >= top and bounds[ordered[examined]] > fast[top - 1]:
            break  # no plan left can beat the top-th: every bound from here is larger
        chunk = []
        for plan in ordered[examined:examined + batch]:
            lighter = [fits.get(replace(plan, recompute=r)) for r in RECOMPUTE
                       if _RECOMPUTE_WEIGHT[r] < _RECOMPUTE_WEIGHT[plan.recompute]]
            if any(lighter):
                dropped["dominated: heavier recompute than another that fits"] += 1
            else:
                chunk.append(plan)
        examined += batch
        if pool is not None and chunk:
            results = pool.evaluate(spec, cspec, chunk, fidelity)
        else:
            # a closed-form evaluation costs well under a ms, less than shipping it
            results = _rank_chunk((spec, cspec, chunk, fidelity))
        tick(min(batch, len(ordered) - (examined - batch)))
        for plan, result in zip(chunk, results):
            fits[plan] = "out_of_memory" not in result
            if not fits[plan]:
                dropped[result["out_of_memory"]] += 1
            else:
                rows.append(_row(plan, result, fail, token_count, price, fidelity))
    return rows, min(examined, len(ordered))


def _full_rows(rows: list[dict], spec, cspec, fidelity: str, fail: dict, token_count,
               price) -> list[dict]:
    """``rows`` (ranked by :func:`_rank_chunk`'s step times) with the full result of
    their plans (:func:`_evaluate_chunk`: breakdown, band, memory), in the same order.

    Raises:
        RuntimeError: when a full evaluation's step time is not the ranked one (the
            batch evaluator must give simulate_step's step to the nanosecond).
    """
    full = _evaluate_chunk((spec, cspec, [r["_plan"] for r in rows], fidelity))
    out = []
    for row, result in zip(rows, full):
        if result.get("step_time_s") != row["step_time_s"]:
            raise RuntimeError(f"ranking: step {row['step_time_s']!r} s of "
                               f"{row['_plan']} is not simulate_step's "
                               f"{result.get('step_time_s')!r} s")
        out.append(_row(row["_plan"], result, fail, token_count, price, fidelity))
    return out


def _ticker(report: Callable[[str, int, int], None], phase: str, total: int
            ) -> Callable[[int], None]:
    done = [0]
    report(phase, 0, total)

    def tick(n: int) -> None:
        done[0] += n
        report(phase, done[0], total)
    return tick


def _phase_prefix(report: Callable[[str, int, int], None] | None, prefix: str
                  ) -> Callable[[str, int, int], None] | None:
    """``report`` with ``prefix`` on every phase name (one bar per search of a series)."""
    if report is None:
        return None
    return lambda phase, done, total: report(prefix + phase, done, total)


def _plan_key(plan: ParallelPlan) -> tuple:
    """A total order on plans, so ties rank the same way every run."""
    return (plan.tp, plan.pp, plan.cp, plan.ep, plan.vpp, plan.micro_batch, plan.zero,
            plan.recompute, plan.schedule)


def bands_overlap(row: Mapping, best: Mapping) -> bool:
    """Whether a plan's 80 % step-time band overlaps ``best``'s (rows of
    :class:`PlanReport`; both train the same tokens per step on the same GPUs, so the
    step time orders them)."""
    return (row["step_time_p10_s"] <= best["step_time_p90_s"]
            and best["step_time_p10_s"] <= row["step_time_p90_s"])


#: Replay budget of a plan search's confirmation at the final fidelity, in layer passes
#: (a forward or a backward of one layer on one micro-batch, summed over the pipeline;
#: ~20 ops and ~0.5 ms of SimPy each on this 2-core machine): the top plans are
#: confirmed in rank order while their passes add up to at most this, i.e. ~10 s of
#: CPU. GPT-3 175B at global batch 2,048 on 64 GPUs (dp 2: 1,024 micro-batches) is
#: 196,608 passes per plan, minutes of SimPy; the closed form the search ranked with
#: equals the replay for every registered schedule (tests/test_fidelity.py), so a plan
#: past the budget keeps its ranked time, and its row says which fidelity gave it.
MAX_CONFIRM_LAYER_PASSES = 20_000


def analytic_equals_event(plan: ParallelPlan, rank_fidelity: str, final_fidelity: str,
                          model: ModelSpec | None = None) -> bool:
    """Whether a plan's ``rank_fidelity`` result is its ``final_fidelity`` result by
    construction, so confirming it needs no replay: ``analytic`` against ``event``
    without pipeline parallelism and with all-reduce data parallelism. The closed form
    is then one rank's list schedule of the ops the replay runs, every duration from the
    same cost model (sim/analytic_step.py, OpPricer.schedule); context parallelism adds
    the ring's K/V exchanges (TE's P2P ring or PyTorch's rotations), which the list
    schedule prices as the replay runs them, members arriving together.

    Left to the replay (measured, issue 16):

    * pipelines (``pp > 1``, every registered schedule): the fill/drain is the
      schedule's closed form (``PipelineSchedule.timing``) while the replay waits op by
      op, so step times differ (1f1b and zb-h1 by ~1 ns per micro-batch of rounding,
      interleaved by up to ~1.5 %);
    * CP through TE's all-gather variant (``cp_comm_type="all_gather"``, and every
      sliding-window layer: ``model.sliding_window``; without ``model`` CP is left to
      the replay): the K/V gather on the CP stream overlaps the compute stream's TP
      collectives; the list schedule charges the compute wait to the op it waited for
      (CP), the replay's breakdown to the first axis of sim.breakdown.AXES_IN_ORDER
      running then (TP) -- the same step, a different split of exposed time (band).

    tests/test_planner.py checks the whole result (step, bands, breakdowns, memory) for
    seeded samples of plans of the llama3-70b/1,024-GPU space and of smaller models.
    Stragglers and other perturbations never enter a plan search."""
    if not (rank_fidelity == "analytic" and final_fidelity == "event" and plan.pp == 1
            and plan.dp_mode == "allreduce"):
        return False
    return plan.cp == 1 or (model is not None and not model.sliding_window
                            and plan.cp_comm_type != "all_gather")


def _within_confirm_budget(spec: ModelSpec, rows: list[dict]) -> list[dict]:
    """The leading rows whose replays fit :data:`MAX_CONFIRM_LAYER_PASSES` together."""
    chosen, passes = [], 0
    for row in rows:
        passes += replay_layer_passes(spec, row["_plan"])
        if passes > MAX_CONFIRM_LAYER_PASSES:
            break
        chosen.append(row)
    return chosen


def replay_layer_passes(spec: ModelSpec, plan: ParallelPlan) -> int:
    """Layer passes (a forward or a backward of one layer on one micro-batch) of the
    event replay of ``plan``: 2 x micro-batches x layers -- what its op count and wall
    time grow with (symmetry reduction simulates one rank per pipeline stage)."""
    return 2 * plan.num_microbatches * spec.num_layers


def _row(plan: ParallelPlan, result: dict, fail: dict, tokens: float | None,
         price: float | None, fidelity: str, ranked_step_time_s: float | None = None) -> dict:
    effective = result["tokens_per_s"] * fail["goodput"]
    days = tokens / effective / SECONDS_PER_DAY if tokens is not None else None
    cost = days * 24 * plan.world_size * price if days is not None and price is not None \
        else None
    step_s = result["step_time_s"]
    # days scale with the step time (same tokens per step, same goodput)
    band_days = {f"days_to_train_{q}": None if days is None else
                 days * result[f"step_time_{q}_s"] / step_s for q in ("p10", "p50", "p90")}
    return {"plan": plan_flags(plan) | {"gpus": plan.world_size}, **result,
            "goodput": fail["goodput"], "checkpoint_interval_s": fail["checkpoint_interval_s"],
            "effective_tokens_per_s": effective,
            "median_effective_tokens_per_s": effective * step_s / result["step_time_p50_s"],
            "days_to_train": days, **band_days, "cost": cost,
            "cost_p50": None if cost is None else cost * result["step_time_p50_s"] / step_s,
            "fidelity": fidelity,
            "ranked_step_time_s": result["step_time_s"] if ranked_step_time_s is None
            else ranked_step_time_s, "_plan": plan}


def _sort_key(row: dict, sort: str, *, median: bool = False) -> tuple:
    """Rank by cost or effective tokens/s, at the simulated step or (``median``) at the
    median of its band."""
    if median:
        primary = row["cost_p50"] if sort == "cost" else -row["median_effective_tokens_per_s"]
    else:
        primary = row["cost"] if sort == "cost" else -row["effective_tokens_per_s"]
    # Ties (equal simulated times): less memory first, then the fixed plan order.
    return (primary, row["peak_memory_bytes"], _plan_key(row["_plan"]))


def gpus_needed(model: str | ModelSpec, *, tokens: float | str, days: float,
                cluster: str | ClusterSpec = defaults.CLUSTER, min_gpus: int | None = None,
                max_gpus: int | None = None, progress=None, **search_kwargs) -> dict:
    """The inverse question: the fewest GPUs that train ``tokens`` in ``days``, and how.

    Tries whole nodes doubling from ``min_gpus`` (default one node) up to ``max_gpus``
    (default the cluster), running :func:`search` (top 1) at each count, and stops at
    the first count whose best plan meets the deadline (days to train include failure
    goodput). Between two doublings the answer is not refined: it is the smallest
    power-of-two number of nodes that is enough.

    Returns:
        ``{"answer": best plan row with "gpus" or None, "tried": [{gpus, days_to_train,
        step_time_s, mfu, cost, plan fields}...], "tokens", "days", "max_gpus_tried"}``.

    Raises:
        ValueError: for bad inputs (one line).
    """
    from sim.longrun import parse_tokens
    from trainsim import resolve
    from trainsim.scenario import Scenario

    token_count = parse_tokens(tokens)
    deadline = _positive_number("days", days)
    cspec = resolve.cluster_spec(Scenario(cluster=cluster,
                                          overrides=dict(search_kwargs.get("overrides") or {}),
                                          calibration=search_kwargs.get("calibration")))
    node = cspec.gpus_per_node
    limit = cspec.max_nodes * node if max_gpus is None else \
        _positive_number("max_gpus", max_gpus, integer=True)
    count = node if min_gpus is None else _positive_number("min_gpus", min_gpus, integer=True)
    tried, answer = [], None
    while count <= limit:
        try:
            found = search(model, cluster=cluster, gpus=count, tokens=token_count, top=1,
                           progress=_phase_prefix(progress, f"{count:,} GPUs: "),
                           **search_kwargs)
        except ValueError as problem:
            if not str(problem).startswith("gpus: no feasible plan"):
                raise
            tried.append({"gpus": count, "days_to_train": None, "note": "no feasible plan"})
            count *= 2
            continue
        best = found.plans[0]
        tried.append({"gpus": count, "days_to_train": best["days_to_train"],
                      "step_time_s": best["step_time_s"], "mfu": best["mfu"],
                      "goodput": best["goodput"], "cost": best["cost"],
                      **{k: v for k, v in best["plan"].items() if k != "gpus"}})
        if best["days_to_train"] <= deadline:
            answer = {"gpus": count, **best}
            break
        count *= 2
    return {"answer": answer, "tried": tried, "tokens": token_count, "days": deadline,
            "max_gpus_tried": tried[-1]["gpus"] if tried else None}
