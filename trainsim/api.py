"""Python API: the same answers as the CLI, as pandas objects (``import trainsim``).

Example (Jupyter)::

    import trainsim
    df = trainsim.collective("all_reduce", cluster="dgx-h100", nodes=2, gpus_per_node=8)
    df.plot(x="size_bytes", y="busbw_GBps", logx=True)
    step = trainsim.simulate("llama3-70b", gpus=1024, tp=8, pp=4)

Every function takes its defaults from :mod:`trainsim.defaults`, the same as the
commands: ``trainsim.simulate(...)`` and ``trainsim simulate ...`` give the same result
for the same inputs, bit for bit. A keyword left at None means "from ``scenario`` if it
gives it, else the default".
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping

import pandas as pd

from hardware.catalog import cluster_to_dict, list_presets, load_cluster
from hardware.cost import CostModel
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from hardware.units import parse_size_bytes
from sim.analytic_step import PricingCache
from sim.collective_bench import collective_sweep, sweep_sizes
from sim.engine import Engine, SimulationResult
from sim.longrun import LongRunResult, simulate_long_run
from sim.step import StepResult, simulate_step
from strategies.collectives.catalog import ALGORITHMS
from strategies.failures import FailureProfile, Responses
from strategies.ir import Program
from strategies.model_spec import ModelSpec
from strategies.perturbations import Perturbations
from strategies.plan import ParallelPlan
from trainsim import defaults, resolve
from trainsim.perturbations import format_perturbations
from trainsim.planner import gpus_needed, search as plan
from trainsim.scenario import Scenario, load_scenario
from trainsim.sweeps import sweep
from trainsim.version import VERSION

__all__ = ["collective", "failures", "gpus_needed", "hardware_list", "hardware_show",
           "make_plan", "plan", "resolve_cluster", "run_failures", "run_step", "simulate",
           "simulate_program", "sweep"]


def resolve_cluster(cluster: str | ClusterSpec | None = None,
                    overrides: Mapping[str, object] | None = None,
                    calibration: str | None = None) -> ClusterSpec:
    """A preset name (default :data:`trainsim.defaults.CLUSTER`), a preset file path or a
    ClusterSpec, with overrides and then a calibration file applied.

    Raises:
        ValueError: for an unknown preset, a bad override or an unreadable calibration
            (one line naming it).
    """
    return resolve.cluster_spec(Scenario(cluster=cluster, overrides=dict(overrides or {}),
                                         calibration=calibration))


def collective(op: str, *, cluster: str | ClusterSpec = defaults.CLUSTER, nodes: int = 1,
               gpus_per_node: int | None = None, algorithm: str = "auto",
               min_bytes: int | str = 8, max_bytes: int | str = "16GiB", step_factor: int = 2,
               fidelity: str = defaults.COLLECTIVE_FIDELITY, dtype: str = "float",
               overrides: Mapping[str, object] | None = None, calibration: str | None = None,
               on_row=None) -> pd.DataFrame:
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
        calibration: calibration file (trainsim calibrate) applied after the overrides.
        on_row: callback receiving each row as it is computed.

    Returns:
        DataFrame with nccl-tests' columns (see :mod:`sim.collective_bench`).

    Raises:
        ValueError: one line naming the bad field, its value and what is valid.
    """
    spec = resolve_cluster(cluster, overrides, calibration)
    if isinstance(nodes, int) and nodes > spec.max_nodes:
        raise ValueError(f"nodes: {nodes} exceeds the {spec.max_nodes} nodes of cluster "
                         f"{spec.name!r}; give 1..{spec.max_nodes}, or make room with --set "
                         f"max_nodes={nodes} (overrides {{'max_nodes': {nodes}}})")
    sizes = sweep_sizes(parse_size_bytes(min_bytes, field="min-bytes"),
                        parse_size_bytes(max_bytes, field="max-bytes"), step_factor)
    per_node = spec.gpus_per_node if gpus_per_node is None else gpus_per_node
    domain_ranks = (1 if spec.scale_up.kind == "pcie" and spec.scale_up.domain_gpus <= 1
                    else max(per_node, spec.scale_up.domain_gpus // spec.gpus_per_node
                             * per_node))
    check_collective_work(op, nodes * per_node, len(sizes), domain_ranks=domain_ranks,
                          fidelity=fidelity)
    return collective_sweep(op, spec, nodes=nodes,
                            gpus_per_node=spec.gpus_per_node if gpus_per_node is None
                            else gpus_per_node,
                            sizes=sizes, algorithm=algorithm, fidelity=fidelity, dtype=dtype,
                            on_row=on_row)


#: Seconds of simulation one ``collective`` call may be estimated to take; beyond it the
#: call is refused instead of running for many minutes (README: bounded runs).
MAX_COLLECTIVE_ESTIMATE_S = 30.0
#: Measured cost of a collective sweep on this project's 2-core machine (rounded up),
#: per transfer its candidate plans list: building and pricing them once (every size
#: after the first is priced from coefficients, hardware.cost), and at flow fidelity
#: running them as flows for each size. One representative stands for all ranks
#: (sim.collective_bench), so the cost follows the transfers: ranks x (ranks per
#: NVLink domain + 1) per ring pass (its channels), about three passes' worth for an
#: all-reduce's candidates (ring, tree, NVLS); ranks for sendrecv; ranks^2 for an
#: all-to-all up to 512 ranks and ranks x rails above (counted, not listed).
#: (all_reduce on 16,384 H100s 3.8 s, on 16,416 GB200s 32 s; alltoall on 512 ranks at
#: flow 5.4 s per size.)
_S_PER_TRANSFER = 9e-6
_S_PER_FLOW = 16e-6


def _listed_transfers(op: str, ranks: int, domain_ranks: int) -> int:
    """Transfers the candidate plans of one collective list (see _S_PER_TRANSFER)."""
    width = max(1, min(domain_ranks, ranks))
    if op == "alltoall":
        return ranks ** 2 if ranks <= 512 else ranks * width
    if op == "sendrecv":
        return ranks
    return ranks * (width + 1) * (3 if op == "all_reduce" else 1)


def check_collective_work(op: str, ranks: int, sizes: int, *, domain_ranks: int = 8,
                          fidelity: str = "analytic") -> float:
    """The estimated seconds a collective sweep takes to simulate, checked.

    Args:
        op, ranks, sizes: the collective, its ranks and how many sizes it sweeps.
        domain_ranks: ranks per NVLink domain (a ring runs that many channels).
        fidelity: ``flow`` runs every size's transfers as flows; the others price
            every size after the first from the first's coefficients.

    Raises:
        ValueError: one rank (a collective over one rank moves nothing: its bandwidth
            would be infinite), or an estimate over :data:`MAX_COLLECTIVE_ESTIMATE_S`
            (one line saying what to lower).
    """
    if ranks < 2:
        raise ValueError(f"gpus_per_node: a collective over {ranks} rank moves no data (its "
                         "bandwidth is not a number); valid: at least 2 ranks (nodes x "
                         "gpus_per_node)")
    listed = _listed_transfers(op, ranks, domain_ranks)
    estimate = listed * _S_PER_TRANSFER
    if fidelity == "flow":
        estimate += sizes * listed * _S_PER_FLOW
    if estimate > MAX_COLLECTIVE_ESTIMATE_S:
        raise ValueError(f"nodes: {op} on {ranks:,} ranks over {sizes} sizes would take about "
                         f"{estimate:,.0f} s to simulate; valid: at most "
                         f"{MAX_COLLECTIVE_ESTIMATE_S:g} s: fewer nodes or sizes "
                         "(--min-bytes, --max-bytes, --step-factor)")
    return estimate


def simulate_program(program: Program, *, cluster: str | ClusterSpec = defaults.CLUSTER,
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
    result = Engine(program, CostModel(layout, ALGORITHMS, fidelity=fidelity)).run()
    if trace_path is not None:
        result.timeline.write_chrome_trace(trace_path)
    return result


def simulate(model: str | ModelSpec | None = None, *, cluster: str | ClusterSpec | None = None,
             gpus: int | None = None, plan: ParallelPlan | None = None,
             fidelity: str | None = None, overrides: Mapping[str, object] | None = None,
             calibration: str | None = None,
             stragglers: Mapping[int, float] | None = None,
             perturbations: Perturbations | None = None,
             scenario: Scenario | str | None = None,
             cache: PricingCache | None = None,
             megatron_args: str | list[str] | None = None, nemo_config: str | None = None,
             **plan_fields: object) -> StepResult:
    """Simulate one training step (see :func:`sim.step.simulate_step`).

    Args:
        model: preset name, model file / Hugging Face config.json path, or spec.
        cluster: preset name, preset file, or spec (default ``dgx-h100``).
        gpus: GPUs of the job (default: the plan's dp*tp*pp*cp).
        plan: a ParallelPlan or a mapping of its fields; or give the fields as keywords
            (``tp=8, pp=4``). Missing
            fields follow :mod:`trainsim.defaults`: seq_len 4096, dp = gpus /
            (tp*pp*cp), global batch ~4 Mi tokens, zero 1 (0 for parameter servers),
            schedule interleaved when vpp > 1 else 1f1b. Parameter-server training:
            ``dp_mode`` ("ps-sync", "ps-async", "ps-stale"), ``ps_servers``,
            ``ps_placement``, ``staleness``, ``ps_steps`` (strategies.param_server;
            ``gpus`` counts the workers, dedicated servers add nodes).
        fidelity: ``analytic`` (closed form, ~10 ms: for sweeps), ``event``
            (SimPy replay of every op with α-β collective costs; the default) or
            ``flow`` (the replay with per-link max-min contention).
        overrides: dotted preset keys to change.
        calibration: calibration file (trainsim calibrate) applied after the overrides.
        stragglers: ``{rank: speed}`` of slow ranks (0.5 = half speed).
        perturbations: throttling episodes, degraded or flapping links, nodes of
            another GPU generation, slow ranks (strategies.perturbations); the
            result's ``perturbation_cost`` says what they cost the step.
        scenario: a :class:`trainsim.scenario.Scenario` or a scenario file (TOML, or a
            result JSON); the other arguments given win over it.
        cache: a :class:`sim.analytic_step.PricingCache` shared by the calls of a
            sweep at ``analytic`` fidelity (same answers, faster).
        megatron_args, nemo_config: a real job's Megatron-LM arguments (a string, ``@FILE``
            or a list of words) or NeMo / Megatron-Bridge YAML (:mod:`trainsim.importers`):
            the model and plan fields they set, under any given explicitly; the result's
            ``inputs["import"]`` lists the settings ignored and the assumptions made.

    Returns:
        The StepResult; ``to_dict()`` embeds the resolved ``scenario`` and the
        ``trainsim_version``.

    Raises:
        ValueError: for a bad model, cluster, plan or scenario (one line naming the field).
        OutOfMemoryError: when the plan does not fit, with the breakdown.
    """
    given = _step_scenario(model, cluster, gpus, plan, fidelity, overrides, calibration,
                           stragglers, perturbations, plan_fields,
                           _job(megatron_args, nemo_config))
    return run_step(_scenario(scenario).merged(given), default_fidelity=defaults.STEP_FIDELITY,
                    cache=cache)


def _scenario(scenario: Scenario | str | None) -> Scenario:
    if scenario is None:
        return Scenario()
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


def _job(megatron_args, nemo_config) -> dict[str, object]:
    """The ``[import]`` table of the given job configuration (none given: empty)."""
    if isinstance(megatron_args, (list, tuple)):
        import shlex

        megatron_args = shlex.join(map(str, megatron_args))
    return {k: v for k, v in (("megatron_args", megatron_args), ("nemo_config", nemo_config))
            if v is not None}


def _step_scenario(model, cluster, gpus, plan, fidelity, overrides, calibration, stragglers,
                   perturbations, plan_fields: Mapping[str, object],
                   job: Mapping[str, object] | None = None) -> Scenario:
    """The inputs given to a step function, as a Scenario (None = not given)."""
    if plan is not None and plan_fields:
        raise ValueError(f"plan: give a ParallelPlan or plan fields, not both "
                         f"({', '.join(plan_fields)})")
    if plan is not None and not isinstance(plan, (ParallelPlan, Mapping)):
        raise ValueError(f"plan: {type(plan).__name__} is not valid; give a ParallelPlan, a "
                         "mapping of its fields, or the fields as keywords")
    if isinstance(plan, Mapping):
        plan, plan_fields = None, {**plan}
    fields = asdict(plan) if plan is not None else {k: v for k, v in plan_fields.items()
                                                    if v is not None}
    perturbations = perturbations or Perturbations()
    if stragglers:
        perturbations = Perturbations(**{**perturbations.__dict__, "slow_ranks": {
            **perturbations.slow_ranks, **stragglers}})
    return Scenario(model=model, cluster=cluster, gpus=gpus, fidelity=fidelity,
                    calibration=calibration, overrides=dict(overrides or {}), plan=fields,
                    perturbations=format_perturbations(perturbations), job=dict(job or {}))


def run_step(scenario: Scenario, *, default_fidelity: str,
             cache: PricingCache | None = None) -> StepResult:
    """Simulate the step a scenario describes; the result embeds the resolved scenario.

    Raises:
        ValueError: for bad inputs (one line). OutOfMemoryError: when it does not fit.
    """
    return _simulate(resolve.resolve_step(scenario, default_fidelity=default_fidelity), cache)


def _simulate(step: resolve.ResolvedStep, cache: PricingCache | None = None) -> StepResult:
    result = simulate_step(step.model, step.cluster, step.plan, gpus=step.gpus,
                           fidelity=step.fidelity, perturbations=step.perturbations,
                           cache=cache)
    if step.imported is not None:  # what the import ignored and assumed (trainsim.importers)
        result.inputs["import"] = step.imported.notes()
    result.embedded = {"scenario": step.scenario.to_dict(), "trainsim_version": VERSION}
    return result


def make_plan(*, gpus: int | None = None, **fields: object) -> ParallelPlan:
    """A ParallelPlan with the defaults of :mod:`trainsim.defaults` filled in.

    ``dp`` = gpus / (tp * pp * cp); ``global_batch`` ~4 Mi tokens (a whole number of
    dp x micro_batch); ``seq_len`` 4096; ``zero`` 1 (0 with a parameter-server
    ``dp_mode``); ``schedule`` interleaved when ``vpp`` > 1, else 1f1b.

    Raises:
        ValueError: when dp cannot be derived, or a field is unknown or invalid.
    """
    known = set(ParallelPlan.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"plan: {unknown[0]!r} is not a plan field; valid: {', '.join(sorted(known))}")
    return ParallelPlan(**defaults.resolve_plan_fields(fields, gpus=gpus))


def failures(model: str | ModelSpec | None = None, *,
             cluster: str | ClusterSpec | None = None, gpus: int | None = None,
             plan: ParallelPlan | None = None, fidelity: str | None = None,
             overrides: Mapping[str, object] | None = None, calibration: str | None = None,
             scenario: Scenario | str | None = None,
             days: float | None = None, tokens: float | str | None = None,
             profile: str | Mapping[str, Any] | FailureProfile | None = None,
             checkpoint_interval: str | float | None = None, checkpoint_mode: str | None = None,
             policy: str | None = None, spare_nodes: int | None = None,
             responses: Responses | Mapping[str, Any] | None = None,
             seeds: int | None = None, seed: int | None = None,
             megatron_args: str | list[str] | None = None, nemo_config: str | None = None,
             **plan_fields: Any) -> LongRunResult:
    """``trainsim failures``: simulate one step of ``model`` under the plan (as
    :func:`simulate`, at ``analytic`` fidelity by default), then the long run with
    failures (:func:`sim.longrun.simulate_long_run`).

    Plan fields (``tp=8, pp=16, ...``), ``plan``, ``megatron_args`` or ``nemo_config`` as
    in :func:`simulate`. Long-run
    inputs left at None come from ``scenario``'s ``[failures]`` table, else
    :data:`trainsim.defaults.FAILURES` (profile llama3-h100, checkpoint interval auto,
    sync saves, 100 seeds from seed 0); exactly one of ``days`` and ``tokens``.

    Returns:
        The LongRunResult; ``to_dict()`` embeds the resolved ``scenario`` and the
        ``trainsim_version``.

    Raises:
        ValueError: one line naming the bad field. OutOfMemoryError: when it does not fit.
    """
    long_run = {"days": days, "tokens": tokens, "profile": profile,
                "checkpoint_interval": checkpoint_interval,
                "checkpoint_mode": checkpoint_mode, "policy": policy,
                "spare_nodes": spare_nodes, "seeds": seeds, "seed": seed,
                "responses": None if responses is None else
                responses if isinstance(responses, Mapping) else asdict(responses)}
    given = _step_scenario(model, cluster, gpus, plan, fidelity, overrides, calibration,
                           None, None, plan_fields, _job(megatron_args, nemo_config))
    given = Scenario(**{**given.__dict__, "failures": {k: v for k, v in long_run.items()
                                                        if v is not None}})
    return run_failures(_scenario(scenario).merged(given))


def run_failures(scenario: Scenario) -> LongRunResult:
    """Simulate the step a scenario describes, then its long run (``[failures]``).

    Raises:
        ValueError: for bad inputs (one line). OutOfMemoryError: when it does not fit.
    """
    step = resolve.resolve_step(scenario, default_fidelity=defaults.FAILURES_FIDELITY)
    long_run = {**defaults.FAILURES, **scenario.failures}
    result = simulate_long_run(cluster=step.cluster, gpus=step.gpus, model=step.model,
                               step=_simulate(step), **long_run)
    result.embedded = {"scenario": {**step.scenario.to_dict(), "failures": _plain(long_run)},
                       "trainsim_version": VERSION,
                       **({"import": step.imported.notes()} if step.imported else {})}
    return result


def _plain(value: Any) -> Any:
    """TOML/JSON data: tables as dicts, tuples as lists, None entries dropped."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return _plain(value.to_dict()) if hasattr(value, "to_dict") else value


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
    """Every field of a preset (after overrides), JSON-serialisable.

    Raises:
        ValueError: unknown preset or bad override (one line).
    """
    return cluster_to_dict(load_cluster(cluster, overrides))
