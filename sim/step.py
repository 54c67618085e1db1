"""Simulate one training step and report where its time goes.

``simulate_step`` checks the plan, checks memory (a plan that does not fit
raises :class:`strategies.memory.OutOfMemoryError` with the breakdown), then
at ``event`` or ``flow`` fidelity lowers the step to a Program, replays it and
measures the timeline; at ``analytic`` fidelity it prices the same ops in
closed form (:mod:`sim.analytic_step`). Perturbations (slow or throttled GPUs,
degraded links, mixed GPU generations; :mod:`strategies.perturbations`) break
the rank symmetry and are replayed rank by rank (:mod:`sim.perturbed`).

Breakdown of the step time of the critical rank, in seconds: the busiest rank (the
least idle), the one that sets the pipeline's pace (sim.breakdown.critical_rank; with
dense first layers and MoE layers after them, an MoE stage, not the first one), with
every pipeline rank's breakdown beside it (``stage_breakdown``). Categories are
attributed in this order so nothing is counted twice:

* ``compute``: time the GPU runs kernels of the model (forward, backward,
  recompute), excluding the optimizer;
* ``optimizer``: the optimizer step;
* ``exposed_<axis>``: time communication of that axis (tp, cp, ep, pp, dp)
  runs while no kernel does, and no axis listed before it communicates;
* ``bubble``: the rest: idle time waiting for other pipeline stages.

Parameter-server plans (``plan.dp_mode`` not ``allreduce``) are simulated by
:mod:`sim.ps_step`.

MFU follows PaLM (Chowdhery et al. 2022, appendix B): model FLOPs per token
``6 N + 12 L h s`` (no recompute) times tokens per second, over the GPUs'
dense bf16 peak.
"""

from __future__ import annotations

import math
import re
from typing import Mapping
from dataclasses import dataclass, field, replace
import pandas as pd

from hardware.catalog import cluster_to_dict
from hardware.cost import ComputeTimer, CostModel, slowest_gpu_factor
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from hardware.units import canonical_dtype
from sim.analytic_step import (PricingCache, analytic_step, contention_closed_form,
                               plan_contention)
from sim.engine import Engine
from sim.step_bands import StepBand, band_shares, step_band
from sim.timeline import Timeline
from strategies import model_costs
from strategies.collectives.catalog import ALGORITHMS
from strategies.lowering import StepLowerer, StepLowering
from sim.breakdown import critical_rank, rank_breakdowns
from strategies.memory import MemoryBreakdown, check_fits, pipeline_memory
from strategies.model_spec import ModelSpec
from strategies.perturbations import Perturbations, check_perturbations
from strategies.plan import PLAN_DTYPES, ParallelPlan, validate_plan
from sim.perturbed import apply_perturbations


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
        breakdown: seconds per category of the critical rank: the busiest one, which sets
            the pace (sim.breakdown.critical_rank; ``inputs["critical_rank"]`` is its
            global rank).
        stage_breakdown: the same for every pipeline rank.
        critical_stage: the pipeline rank the top-level ``breakdown`` is of.
        inputs: resolved model, cluster, plan and fidelity.
        timeline: spans of the simulated representatives (empty at
            ``analytic`` fidelity, which replays nothing).
        lowering: the lowered step (program, layout, schedule actions); None at
            ``analytic`` fidelity.
        ps: parameter-server details (None for all-reduce data parallelism): mode,
            servers, placement, server ranks, steps, staleness, GPUs and nodes in all,
            ``step_ends_s`` (E(t), module docstring), makespan, server memory and
            server shard 0's busy seconds per step (aggregation, updates).
        stats: work done: SimPy ``events``, ``ops`` and ``spans`` of a replay;
            ``ops_priced`` by the analytic model.
        perturbation_cost: with perturbations, the unperturbed step, the
            slowdown (seconds and fraction) and the critical rank.
        embedded: what the application layer records for reproducibility (its
            resolved ``scenario`` and ``trainsim_version``); added to ``to_dict()``.
        band: the 80 % prediction band of the step a real run would measure
            (:mod:`sim.step_bands`); ``step_time_p10_s``, ``step_time_p50_s`` and
            ``step_time_p90_s`` read it.
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
    lowering: StepLowering | None = field(repr=False)
    ps: dict[str, object] | None = None
    stats: dict[str, int] = field(default_factory=dict)
    perturbation_cost: dict[str, object] | None = None
    embedded: dict[str, object] | None = field(default=None, repr=False)
    critical_stage: int = 0
    band: StepBand | None = field(default=None, repr=False)

    @property
    def step_time_p10_s(self) -> float:
        """The step a real run beats one time in ten (seconds; the step if no band)."""
        return self.band.p10_s if self.band else self.step_time_s

    @property
    def step_time_p50_s(self) -> float:
        """The median step a real run would measure (seconds)."""
        return self.band.p50_s if self.band else self.step_time_s

    @property
    def step_time_p90_s(self) -> float:
        """The step a real run exceeds one time in ten (seconds)."""
        return self.band.p90_s if self.band else self.step_time_s

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary (no timeline)."""
        return {
            "step_time_s": self.step_time_s,
            "step_time_p10_s": self.step_time_p10_s,
            "step_time_p50_s": self.step_time_p50_s,
            "step_time_p90_s": self.step_time_p90_s,
            **({"band_terms": dict(self.band.terms)} if self.band else {}),
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory": {f"pp{p}": m.to_dict() for p, m in self.memory.items()},
            "breakdown": dict(self.breakdown),
            "critical_stage": self.critical_stage,
            "stage_breakdown": {f"pp{p}": b for p, b in self.stage_breakdown.items()},
            "inputs": self.inputs,
            **({"ps": self.ps} if self.ps is not None else {}),
            **({"perturbation_cost": self.perturbation_cost}
               if self.perturbation_cost is not None else {}),
            **(self.embedded or {}),
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


#: Step fidelities, fastest first (recorded in every result's ``inputs``).
STEP_FIDELITIES = ("analytic", "event", "flow")


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


def _check_dtype(plan: ParallelPlan, gpu, where: str) -> None:
    """The plan's matmul dtype must be one the GPU has a peak for (else the first op
    priced raised, naming an internal ComputeOp rather than the plan's field)."""
    peaks = {canonical_dtype(name) for name in gpu.peak_flops_per_s}
    if plan.dtype not in peaks:
        raise ValueError(f"dtype: {plan.dtype!r} is not supported by the GPU of {where} "
                         f"({gpu.name}); valid: "
                         f"{', '.join(d for d in PLAN_DTYPES if d in peaks)}")
    # MXFP8 block scaling runs on Blackwell (compute capability 10.0) and newer only:
    # Transformer Engine's check_mxfp8_support (transformer_engine/pytorch/fp8.py,
    # "Device compute capability 10.0 or higher required for MXFP8 execution")
    arch = re.fullmatch(r"sm_(\d+)", gpu.matmul_profile)
    if plan.dtype == "fp8" and plan.fp8_recipe == "te-mxfp8" and arch and int(arch[1]) < 100:
        raise ValueError(f"fp8_recipe: 'te-mxfp8' needs compute capability 10.0 or newer "
                         f"(Blackwell); the GPU of {where} ({gpu.name}) is "
                         f"{gpu.matmul_profile}; give te-current, te-delayed or te-blockwise")


def simulate_step(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                  gpus: int | None = None, fidelity: str = "event",
                  check_memory: bool = True, compute: ComputeTimer | None = None,
                  stragglers: Mapping[int, float] | None = None,
                  cache: PricingCache | None = None,
                  perturbations: Perturbations | None = None) -> StepResult:
    """Simulate one training step of ``model`` on ``cluster`` under ``plan``.

    Args:
        model: the model.
        cluster: the cluster preset.
        plan: the parallel plan.
        gpus: GPUs asked for (must equal dp*tp*pp*cp); default: the plan's.
        fidelity: ``analytic`` (closed-form step model, sim.analytic_step),
            ``event`` (SimPy replay of every op, α-β collective costs) or
            ``flow`` (the replay with max-min link sharing).
        check_memory: raise OutOfMemoryError when a rank does not fit HBM.
        compute: prices compute ops (default: the roofline model of the
            cluster's GPU).
        stragglers: ``{rank: speed}`` of ranks whose kernels run slower (0.5 =
            half speed). They break the symmetry: each is simulated with the
            ranks coupled to it (strategies.lowering.StepLowerer.distinct_ranks),
            and the step waits for it wherever synchronous training does.
        cache: planners and collective prices shared between ``analytic``
            evaluations (sim.analytic_step.PricingCache; a sweep passes one).
        perturbations: slow ranks, throttling episodes, degraded or flapping
            NIC links, nodes of another GPU generation
            (strategies.perturbations; ``stragglers`` adds slow ranks). The
            result's ``perturbation_cost`` compares the step with the same step
            unperturbed: what the slowest rank costs the whole job.

    Raises:
        ValueError: for an invalid plan (one line naming the field).
        OutOfMemoryError: when a rank needs more than the GPU's HBM.
    """
    validate_plan(plan, num_layers=model.num_layers, num_heads=model.num_heads,
                  num_kv_heads=model.num_kv_heads,
                  num_experts=model.moe.num_experts if model.moe else 0,
                  expert_ffn_hidden_size=model.moe.expert_ffn_hidden_size if model.moe else 0,
                  gpus=plan.world_size if gpus is None else gpus,
                  cluster_gpus=cluster.max_nodes * cluster.gpus_per_node)
    if plan.comm_sm_contention and cluster.gpu.sm_count <= 0:
        raise ValueError(f"comm_sm_contention: true needs the GPU's SM count, which preset "
                         f"{cluster.name!r} ({cluster.gpu.name}) does not give; give false "
                         "or set gpu.sm_count")
    _check_dtype(plan, cluster.gpu, f"preset {cluster.name!r}")
    if plan.dp_mode != "allreduce":
        from sim.ps_step import simulate_ps_step  # it builds on this module

        # No closed form for parameter servers: ``analytic`` replays them at
        # ``event`` fidelity, and the result records that.
        return with_band(simulate_ps_step(
            model, cluster, plan, fidelity="event" if fidelity == "analytic" else fidelity,
            check_memory=check_memory, compute=compute), model, cluster, plan)
    if fidelity not in STEP_FIDELITIES:
        raise ValueError(f"fidelity: {fidelity!r} is not valid; valid: {', '.join(STEP_FIDELITIES)}")
    perturbations = perturbations or Perturbations()
    # a closed-form evaluation with a shared cache and at most slow ranks (nothing that
    # changes a link) reads the layout only: the cache's copy saves building the link
    # arrays of every GPU for every plan of a sweep
    layout = (cache.layout(cluster, plan.world_size)
              if cache is not None and fidelity == "analytic"
              and not stragglers and perturbations.only_slow_ranks()
              else job_layout(cluster, plan.world_size))
    if stragglers:
        perturbations = replace(perturbations,
                                slow_ranks={**perturbations.slow_ranks, **stragglers})
    check_perturbations(perturbations, world_size=plan.world_size, nodes=layout.nodes)
    stragglers = dict(perturbations.slow_ranks)
    if fidelity == "analytic" and not perturbations.only_slow_ranks():
        raise ValueError("fidelity: 'analytic' models slow ranks only; give event or flow "
                         "for throttling episodes, degraded or flapping links and mixed GPUs")
    applied = apply_perturbations(perturbations, layout)
    for node, preset in sorted(perturbations.node_gpus.items()):
        gpu = applied.rank_conditions[node * layout.gpus_per_node].gpu
        _check_dtype(plan, gpu, f"preset {preset!r} (node_gpu of node {node})")
    lowerer = StepLowerer(model, plan, domain_gpus=cluster.scale_up.domain_gpus)
    memory = pipeline_memory(model, plan, lowerer, reserve_bytes=cluster.gpu.memory_reserve_bytes)
    if check_memory:
        for p, breakdown in memory.items():
            check_fits(breakdown, applied.smallest_hbm_bytes, lowerer.representatives[p],
                       plan=plan)
    fallback = None
    if fidelity == "analytic":
        result = (_analytic_result(model, cluster, plan, layout, lowerer, memory, compute,
                                   stragglers, cache)
                  if contention_closed_form(plan) else None)
        if result is not None:
            if perturbations:
                result.perturbation_cost = _perturbation_cost(
                    result.step_time_s, int(result.inputs["critical_rank"]), model, cluster,
                    plan, fidelity, compute)
            return with_band(result, model, cluster, plan)
        # SM contention in a schedule the closed form does not price exactly
        # (sim.analytic_step.contention_closed_form, AnalyticStep.exact): the event
        # engine's number, recorded in the stats
        fallback, fidelity = "event: SM contention without an exact closed form", "event"
        layout = job_layout(cluster, plan.world_size)
        applied = apply_perturbations(perturbations, layout)
    lowering = lowerer.lower(distinct=sorted(applied.distinct), mirrors=fidelity == "flow")
    # The lowering builds valid programs by construction (tests check them
    # with strategies.program_check); skipping the check saves ~10 % here.
    cost = CostModel(layout, ALGORITHMS, compute=compute, fidelity=fidelity,
                     ranks=applied.rank_conditions)
    engine = Engine(lowering.program, cost, check=False,
                    comm_contention=plan_contention(plan))
    result = engine.run()
    timeline = result.timeline
    step_ns = result.makespan_ns
    present = sorted(lowering.program.ops_by_rank)
    by_rank = rank_breakdowns(timeline, present, step_ns)
    stage_breakdown = {p: by_rank[rank] for p, rank in enumerate(lowering.representatives)}
    step_s = step_ns / 1e9
    critical = critical_rank(by_rank, step_s)
    return with_band(StepResult(
        step_time_s=step_s,
        **throughput(model, cluster, plan, step_s),
        peak_memory_bytes=int(max(m.total_bytes for m in memory.values())),
        memory=memory,
        breakdown=by_rank[critical],
        stage_breakdown=stage_breakdown,
        inputs={**resolved_inputs(model, cluster, plan, fidelity, layout, result.plan_counts),
                "stragglers": {str(r): v for r, v in sorted(stragglers.items())},
                "perturbations": perturbations.to_dict(),
                "critical_rank": critical},
        timeline=timeline,
        lowering=lowering,
        stats={**result.stats, **({"analytic_fallback": fallback} if fallback else {})},
        critical_stage=lowerer.layout.coords(critical)["pp"],
        perturbation_cost=(_perturbation_cost(step_s, critical, model, cluster, plan, fidelity,
                                              compute) if perturbations else None),
    ), model, cluster, plan)


def with_band(result: StepResult, model: ModelSpec, cluster: ClusterSpec,
              plan: ParallelPlan) -> StepResult:
    """``result`` with its prediction band (:func:`sim.step_bands.step_band`) from its
    breakdown, the plan's dtype, the model's kind and the job's GPU count; a step of
    no time gets none."""
    if result.step_time_s > 0:
        shares = band_shares(result.breakdown, result.step_time_s, dtype=plan.dtype,
                             moe=model.moe is not None)
        result.band = step_band(result.step_time_s, shares, gpus=plan.world_size,
                                gpu_name=cluster.gpu.name,
                                speed_spread=cluster.gpu.speed_spread)
    return result


def _perturbation_cost(step_s: float, critical: int, model: ModelSpec, cluster: ClusterSpec,
                       plan: ParallelPlan, fidelity: str,
                       compute: ComputeTimer | None) -> dict[str, object]:
    """What the perturbations cost the whole job: the step against the same step
    with every rank alike (simulated at the same fidelity)."""
    baseline = simulate_step(model, cluster, plan, fidelity=fidelity, check_memory=False,
                             compute=compute).step_time_s
    return {"baseline_step_time_s": baseline, "step_time_s": step_s,
            "slowdown_s": step_s - baseline, "slowdown": step_s / baseline - 1,
            "critical_rank": critical}


def _analytic_result(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                     layout: ClusterLayout, lowerer: StepLowerer,
                     memory: dict[int, MemoryBreakdown], compute: ComputeTimer | None,
                     stragglers: Mapping[int, float],
                     cache: PricingCache | None) -> StepResult | None:
    """The StepResult of the closed-form model (no timeline, no program); None when it
    is not exact under SM contention (:attr:`sim.analytic_step.AnalyticStep.exact`)."""
    step = analytic_step(model, cluster, plan, layout, compute=compute, stragglers=stragglers,
                         lowerer=lowerer, cache=cache)
    if not step.exact:
        return None
    step_s = step.step_ns / 1e9
    critical = lowerer.representatives[step.critical]
    return StepResult(
        step_time_s=step_s,
        **throughput(model, cluster, plan, step_s),
        peak_memory_bytes=int(max(m.total_bytes for m in memory.values())),
        memory=memory,
        breakdown=step.breakdown_s[step.critical],
        stage_breakdown=step.breakdown_s,
        inputs={**resolved_inputs(model, cluster, plan, "analytic", layout, {},
                                  cluster_dict=cache.cluster_dict(cluster) if cache else None),
                "stragglers": {str(r): v for r, v in sorted(stragglers.items())},
                "critical_rank": critical},
        timeline=Timeline(),
        lowering=None,
        stats={"ops_priced": step.ops_priced},
        critical_stage=step.critical,
    )


def throughput(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
               step_s: float) -> dict[str, float]:
    """tokens_per_s, tflops_per_gpu (model FLOPs, 1e12/s) and mfu of a step time."""
    tokens = plan.global_batch * plan.seq_len
    flops = model_costs.model_flops_per_token(model, plan.seq_len) * tokens
    tflops_per_gpu = flops / step_s / plan.world_size / 1e12 if step_s > 0 else math.inf
    return {"tokens_per_s": tokens / step_s if step_s > 0 else math.inf,
            "tflops_per_gpu": tflops_per_gpu,
            "mfu": tflops_per_gpu * 1e12 / cluster.gpu.peak_flops_per_s["bf16"]}


def resolved_inputs(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, fidelity: str,
                    layout: ClusterLayout, plan_counts: dict[str, int],
                    cluster_dict: dict | None = None) -> dict[str, object]:
    """What a result embeds to be reproducible (DESIGN.md principle 6);
    ``plan_counts``: how often each algorithm/protocol was chosen, per axis and kind
    (sim.engine.SimulationResult.plan_counts); ``cluster_dict``: the cluster's
    ``cluster_to_dict``, when already built."""
    cluster_dict = cluster_to_dict(cluster) if cluster_dict is None else cluster_dict
    return {"model": model.name, "cluster": cluster_dict, "plan": _plan_dict(plan),
            "gpus": plan.world_size, "fidelity": fidelity, "nodes": layout.nodes,
            "gpus_per_node": layout.gpus_per_node, "plans_chosen": dict(plan_counts),
            # every kernel at the pace of the job's expected slowest GPU (1.0: GPUs alike)
            "slowest_gpu_factor": slowest_gpu_factor(cluster, layout.world_size)}


def _plan_dict(plan: ParallelPlan) -> dict[str, object]:
    """The plan's fields as JSON values (tuples as lists) and its micro-batch count."""
    data = {name: list(value) if isinstance(value, tuple) else value
            for name, value in plan.__dict__.items()}
    data["num_microbatches"] = plan.num_microbatches
    return data
