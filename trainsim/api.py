"""Python API: the same answers as the CLI, as pandas objects (``import trainsim``).

Example (Jupyter)::

    import trainsim
    df = trainsim.collective("all_reduce", cluster="dgx-h100", nodes=2, gpus_per_node=8)
    df.plot(x="size_bytes", y="busbw_GBps", logx=True)
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from hardware.catalog import cluster_to_dict, list_presets, load_cluster
from hardware.compute import ComputeModel
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from hardware.units import parse_size_bytes
from sim.collective_bench import collective_sweep, sweep_sizes
from sim.engine import Engine, SimulationResult
from sim.longrun import LongRunResult, simulate_long_run
from sim.analytic_step import PricingCache
from sim.step import StepResult, simulate_step
from strategies.failures import FailureProfile, Responses
from strategies.ir import Program
from strategies.model_spec import ModelSpec
from strategies.models import load_model
from strategies.perturbations import Perturbations
from strategies.plan import ParallelPlan
from trainsim.planner import gpus_needed, search as plan
from trainsim.sweeps import sweep

__all__ = ["collective", "failures", "gpus_needed", "hardware_list", "hardware_show",
           "make_plan", "plan", "resolve_cluster", "simulate", "simulate_program", "sweep"]


def resolve_cluster(cluster: str | ClusterSpec,
                    overrides: Mapping[str, object] | None = None) -> ClusterSpec:
    """A preset name, a preset file path or a ClusterSpec, with overrides applied.

    Raises:
        ValueError: for an unknown preset or a bad override (one line naming it).
    """
    if isinstance(cluster, ClusterSpec):
        if overrides:
            raise ValueError("overrides: give a preset name or path to apply overrides to, "
                             "not a ClusterSpec (use dataclasses.replace on the spec)")
        return cluster
    return load_cluster(cluster, overrides)


def collective(op: str, *, cluster: str | ClusterSpec = "dgx-h100", nodes: int = 1,
               gpus_per_node: int | None = None, algorithm: str = "auto",
               min_bytes: int | str = 8, max_bytes: int | str = "16GiB", step_factor: int = 2,
               fidelity: str = "analytic", dtype: str = "float",
               overrides: Mapping[str, object] | None = None, on_row=None) -> pd.DataFrame:
    """Simulate an nccl-tests sweep of one collective over all GPUs of the job.

    Args:
        op: all_reduce, all_gather, reduce_scatter, alltoall, broadcast,
            reduce or sendrecv.
        cluster: preset name, preset file, or spec.
        nodes: nodes in the job.
        gpus_per_node: GPUs used per node (default: all of the preset's).
        algorithm: ``auto``, ``ring``, ``tree``, ``nvls``, ``nvls_tree``, ``hierarchical``
            (all_reduce) or ``direct`` (alltoall, sendrecv).
        min_bytes, max_bytes: sweep bounds in bytes or with a suffix ("16GiB").
        step_factor: multiply the size by this each step (nccl-tests -f).
        fidelity: ``analytic`` or ``flow``.
        dtype: nccl-tests type name for the count column.
        overrides: dotted preset keys to change, e.g. ``{"nic.gbit_per_s": 200}``.
        on_row: callback receiving each row as it is computed.

    Returns:
        DataFrame with nccl-tests' columns (see :mod:`sim.collective_bench`).

    Raises:
        ValueError: one line naming the bad field, its value and what is valid.
    """
    spec = resolve_cluster(cluster, overrides)
    sizes = sweep_sizes(parse_size_bytes(min_bytes, field="min-bytes"),
                        parse_size_bytes(max_bytes, field="max-bytes"), step_factor)
    return collective_sweep(op, spec, nodes=nodes,
                            gpus_per_node=spec.gpus_per_node if gpus_per_node is None
                            else gpus_per_node,
                            sizes=sizes, algorithm=algorithm, fidelity=fidelity, dtype=dtype,
                            on_row=on_row)


def simulate_program(program: Program, *, cluster: str | ClusterSpec = "dgx-h100",
                     nodes: int = 1, gpus_per_node: int | None = None,
                     fidelity: str = "analytic", overrides: Mapping[str, object] | None = None,
                     trace_path: str | None = None) -> SimulationResult:
    """Replay a Program on a cluster; optionally write a Chrome/Perfetto trace.

    Compute ops are priced by the roofline model of the cluster's GPU.

    Args:
        program: what every rank does (validated before it runs).
        cluster: preset name, preset file, or spec.
        nodes, gpus_per_node: job shape (default: all GPUs of each node).
        fidelity: ``analytic`` or ``flow``.
        overrides: dotted preset keys to change.
        trace_path: where to write the trace JSON (atomically), if given.

    Returns:
        The :class:`sim.engine.SimulationResult` (timeline, makespan, plans).

    Raises:
        ValueError: for a malformed program or a layout the cluster cannot hold.
    """
    spec = resolve_cluster(cluster, overrides)
    layout = ClusterLayout(spec, nodes, spec.gpus_per_node if gpus_per_node is None
                           else gpus_per_node)
    result = Engine(program, layout, fidelity=fidelity, compute=ComputeModel(spec.gpu)).run()
    if trace_path is not None:
        result.timeline.write_chrome_trace(trace_path)
    return result


def simulate(model: str | ModelSpec, *, cluster: str | ClusterSpec = "dgx-h100",
             gpus: int | None = None, plan: ParallelPlan | None = None,
             fidelity: str = "event", overrides: Mapping[str, object] | None = None,
             stragglers: Mapping[int, float] | None = None,
             cache: PricingCache | None = None,
             perturbations: Perturbations | None = None,
             **plan_fields: object) -> StepResult:
    """Simulate one training step (see :func:`sim.step.simulate_step`).

    Args:
        model: preset name, model file / Hugging Face config.json path, or spec.
        cluster: preset name, preset file, or spec.
        gpus: GPUs of the job (default: the plan's dp*tp*pp*cp).
        plan: a ParallelPlan; or give its fields as keywords (``tp=8, pp=4``);
            ``dp`` defaults to gpus / (tp*pp*cp) and ``global_batch`` to
            dp * micro_batch * 4 * pp. Parameter-server training: ``dp_mode``
            ("ps-sync", "ps-async", "ps-stale"), ``ps_servers``, ``ps_placement``,
            ``staleness``, ``ps_steps`` (strategies.param_server; ``gpus`` counts the
            workers, dedicated servers add nodes).
        fidelity: ``analytic`` (closed form, ~10 ms: for sweeps), ``event``
            (SimPy replay of every op with α-β collective costs; the default) or
            ``flow`` (the replay with per-link max-min contention).
        overrides: dotted preset keys to change.
        stragglers: ``{rank: speed}`` of slow ranks (0.5 = half speed).
        perturbations: throttling episodes, degraded or flapping links, nodes of
            another GPU generation, slow ranks (strategies.perturbations); the
            result's ``perturbation_cost`` says what they cost the step.
        cache: a :class:`sim.analytic_step.PricingCache` shared by the calls of a
            sweep at ``analytic`` fidelity (same answers, faster).

    Raises:
        ValueError: for a bad model, cluster or plan (one line naming the field).
        OutOfMemoryError: when the plan does not fit, with the breakdown.
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    cluster_spec = resolve_cluster(cluster, overrides)
    if plan is None:
        plan = make_plan(gpus=gpus, **plan_fields)
    elif plan_fields:
        raise ValueError(f"plan: give a ParallelPlan or plan fields, not both "
                         f"({', '.join(plan_fields)})")
    return simulate_step(spec, cluster_spec, plan, gpus=gpus, fidelity=fidelity,
                         stragglers=stragglers, cache=cache, perturbations=perturbations)


def make_plan(*, gpus: int | None = None, **fields: object) -> ParallelPlan:
    """A ParallelPlan with defaults filled in from the GPU count.

    ``dp`` = gpus / (tp * pp * cp) when not given; ``global_batch`` =
    dp * micro_batch * 4 * pp (four micro-batches per pipeline stage) when not
    given; ``zero`` = 0 for a parameter-server ``dp_mode`` (the servers hold the
    optimizer state) when not given.

    Raises:
        ValueError: when dp cannot be derived, or a field is unknown.
    """
    known = set(ParallelPlan.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"plan: {unknown[0]!r} is not a plan field; valid: {', '.join(sorted(known))}")
    values = {k: v for k, v in fields.items() if v is not None}
    tp, pp, cp = (int(values.get(k, 1)) for k in ("tp", "pp", "cp"))
    if "dp" not in values:
        if gpus is None:
            values["dp"] = 1
        elif gpus % (tp * pp * cp):
            raise ValueError(f"gpus: {gpus} is not divisible by tp {tp} x pp {pp} x cp {cp} = "
                             f"{tp * pp * cp}; give --dp or a GPU count that divides")
        else:
            values["dp"] = gpus // (tp * pp * cp)
    if "global_batch" not in values:
        values["global_batch"] = values["dp"] * int(values.get("micro_batch", 1)) * 4 * pp
    if "zero" not in values and values.get("dp_mode", "allreduce") != "allreduce":
        values["zero"] = 0
    return ParallelPlan(**values)


def failures(model: str | ModelSpec, *, cluster: str | ClusterSpec = "dgx-h100", gpus: int,
             plan: Any = None, fidelity: str = "analytic",
             overrides: Mapping[str, object] | None = None,
             days: float | None = None, tokens: float | str | None = None,
             profile: str | Mapping[str, Any] | FailureProfile = "llama3-h100",
             checkpoint_interval: str | float = "auto", checkpoint_mode: str = "sync",
             policy: str | None = None, spare_nodes: int | None = None,
             responses: Responses | Mapping[str, Any] | None = None,
             seeds: int = 100, seed: int = 0, **plan_fields: Any) -> LongRunResult:
    """``trainsim failures``: simulate one step of ``model`` under the plan (as
    :func:`simulate`), then the long run with failures (:func:`simulate_long_run`).

    Plan fields (``tp=8, pp=16, ...``) or ``plan`` as in :func:`simulate`.
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    cluster_spec = resolve_cluster(cluster, overrides)
    step = simulate(spec, cluster=cluster_spec, gpus=gpus, plan=plan, fidelity=fidelity,
                        **plan_fields)
    return simulate_long_run(cluster=cluster_spec, gpus=gpus, days=days, tokens=tokens,
                             profile=profile, checkpoint_interval=checkpoint_interval,
                             checkpoint_mode=checkpoint_mode, policy=policy,
                             spare_nodes=spare_nodes, responses=responses, seeds=seeds,
                             seed=seed, model=spec, step=step)


def hardware_list() -> pd.DataFrame:
    """Built-in presets with their headline numbers (one row each)."""
    rows = []
    for name in list_presets():
        spec = load_cluster(name)
        rows.append({
            "name": name,
            "gpu": spec.gpu.name,
            "gpus_per_node": spec.gpus_per_node,
            "nvlink_domain_gpus": spec.scale_up.domain_gpus,
            "nvlink_GBps_per_gpu": spec.scale_up.nvlink_bytes_per_s / 1e9,
            "nvls": spec.scale_up.nvls,
            "nics_per_node": spec.nic.count_per_node,
            "nic_Gbps": spec.nic.gbit_per_s,
            "nic_kind": spec.nic.kind,
            "fabric": spec.fabric.topology,
            "description": spec.description,
        })
    return pd.DataFrame(rows)


def hardware_show(cluster: str, overrides: Mapping[str, object] | None = None) -> dict:
    """Every field of a preset (after overrides), JSON-serialisable."""
    return cluster_to_dict(load_cluster(cluster, overrides))
