"""Simulate what a replay directory measured and report the error.

The Program of the directory is replayed by the simulator's engine on the cluster
(a preset, ``cpu-host`` for CPU runs) with the calibration applied: its spec fields, its
compute tables for the op kinds they cover, and its per-rank speeds when they were
measured on this job's ranks (the engine's straggler mechanism). Measured and simulated timelines
are read by the same functions (validate.spans):

* ``step_time_error``: |simulated - measured| / measured of the step time, the makespan
  over every rank (measured: the mean over iterations, leaving out outliers slower than
  1.5x the median, validate.spans.OUTLIER_FACTOR; op durations are means over the same
  iterations);
* ``per_op_kind``: per compute kind, the summed op durations over all ranks; per
  communication kind (``p2p`` = send/recv pairs), the summed data-movement times from
  the last participant's arrival (a measured span includes waiting for peers, the
  simulator's data movement starts when the last one arrives).
"""

from __future__ import annotations

import statistics
from collections import Counter

from hardware.calibration import CalibratedComputeModel, apply_calibration, load_calibration
from hardware.catalog import load_cluster
from hardware.topology import ClusterLayout
from hardware.cost import CostModel, RankConditions
from sim.breakdown import rank_breakdowns
from sim.engine import Engine
from sim.step_bands import StepBand, band_shares, step_band
from strategies.collectives.catalog import ALGORITHMS
from validate.calibrate import job_shape, preset_path
from validate.spans import (comm_durations, compute_ops, load_measurements, measured_timeline,
                            timeline_intervals)

FIDELITIES = ("analytic", "flow")


def _relative(simulated: float, measured: float) -> float | None:
    return abs(simulated - measured) / measured if measured > 0 else None


def _band(program, result, spec) -> StepBand | None:
    """The simulated step's 80 % prediction band (sim.step_bands) from the breakdown of
    the rank that ends last, the compute ops' commonest dtype (a Program carries no
    model kind: dense); None for a step of no time."""
    step_ns = result.makespan_ns
    ends = result.timeline.end_ns_by_rank()
    if step_ns <= 0 or not ends:
        return None
    critical = max(ends, key=lambda rank: (ends[rank], -rank))
    breakdown = rank_breakdowns(result.timeline, [critical], step_ns)[critical]
    dtypes = Counter(op.dtype for _, _, op in compute_ops(program))
    dtype = dtypes.most_common(1)[0][0] if dtypes else "bf16"
    shares = band_shares(breakdown, step_ns * 1e-9, dtype=dtype, moe=False)
    return step_band(step_ns * 1e-9, shares, gpus=program.world_size, gpu_name=spec.gpu.name,
                     speed_spread=spec.gpu.speed_spread)


def compare(directory: str, *, calibration: str | None = None, cluster: str | None = None,
            overrides: dict | None = None, fidelity: str = "analytic",
            tolerance: float = 0.15, trace_prefix: str | None = None) -> dict:
    """Simulate the measured Program and compare (see the module docstring).

    With ``trace_prefix``, writes Perfetto/Chrome traces ``PREFIX.measured.json`` (the
    first kept iteration) and ``PREFIX.simulated.json`` side by side.

    Returns a JSON-serialisable dict with ``step_time_error``, ``per_op_kind``,
    ``step_time_s`` (measured, simulated, the measured spread, the simulated step's
    80 % band ``p10``/``p50``/``p90``), ``inside_band`` (the measured step lies in the
    band), ``tolerance``, ``within_tolerance`` and ``inputs``.

    Raises:
        ValueError: unreadable directory or calibration, unknown cluster or fidelity, or a
            GPU run without ``cluster`` or a calibration naming one (one line).
    """
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity: {fidelity!r} is not valid; valid: {', '.join(FIDELITIES)}")
    if not tolerance > 0:
        raise ValueError(f"tolerance: {tolerance!r} is not valid; valid: a fraction > 0")
    measured = load_measurements(directory)
    cal = load_calibration(calibration) if calibration else None
    if cluster is None and cal is not None:
        cluster = cal.provenance.get("base_cluster")
    if cluster is None:
        cluster = (measured.run or {}).get("cluster")
    if cluster is None:
        env = measured.env.get(min(measured.env), {}) if measured.env else {}
        if env.get("cuda_available"):
            raise ValueError("cluster: give --cluster (the preset the GPUs belong to) or a "
                             "--calibration made for them")
        cluster = "cpu-host"
    if cal is not None:
        # the calibration measured these very GPUs (kernel tables, per-rank speeds): no
        # fleet spread on top of them (gpu.speed_spread prices an unmeasured fleet)
        overrides = {**(overrides or {}), "gpu.speed_spread": 0.0}
    spec = load_cluster(preset_path(cluster), overrides)
    if cal is not None:
        spec = apply_calibration(spec, cal)
    nodes, gpus_per_node = job_shape(measured)
    compute = CalibratedComputeModel(spec.gpu, cal.compute_tables if cal else {})
    program = measured.program
    # measured per-rank speeds apply to the job they were measured on
    speeds = (dict(cal.rank_speed) if cal is not None
              and set(cal.rank_speed) == set(program.ranks()) else {})
    cost = CostModel(ClusterLayout(spec, nodes, gpus_per_node), ALGORITHMS, compute=compute,
                     fidelity=fidelity,
                     ranks={r: RankConditions(speed=v) for r, v in speeds.items()})
    result = Engine(program, cost).run()
    simulated = timeline_intervals(program, result.timeline)
    if trace_prefix:
        process_of = lambda rank: rank // gpus_per_node  # noqa: E731 - one process per node
        measured_timeline(program, measured.kept()[0]).write_chrome_trace(
            f"{trace_prefix}.measured.json", process_of=process_of)
        result.timeline.write_chrome_trace(f"{trace_prefix}.simulated.json",
                                           process_of=process_of)

    kinds: dict[str, dict] = {}
    durations = measured.mean_occupancy_ns()
    for rank, index, op in compute_ops(program):
        entry = kinds.setdefault(op.kind, {"category": "compute", "ops": 0, "measured_s": 0.0,
                                           "simulated_s": 0.0, "_errors": []})
        sim_ns = simulated[(rank, index)][1] - simulated[(rank, index)][0]
        meas_ns = durations[(rank, index)]
        entry["ops"] += 1
        entry["measured_s"] += meas_ns * 1e-9
        entry["simulated_s"] += sim_ns * 1e-9
        if meas_ns > 0:
            entry["_errors"].append(abs(sim_ns - meas_ns) / meas_ns)
    for sim_inst, meas_inst in zip(comm_durations(program, simulated), measured.comm_instances()):
        entry = kinds.setdefault(sim_inst.kind, {"category": "comm", "ops": 0, "measured_s": 0.0,
                                                 "simulated_s": 0.0, "_errors": []})
        entry["ops"] += 1
        entry["measured_s"] += meas_inst.duration_ns * 1e-9
        entry["simulated_s"] += sim_inst.duration_ns * 1e-9
        if meas_inst.duration_ns > 0:
            entry["_errors"].append(abs(sim_inst.duration_ns - meas_inst.duration_ns)
                                    / meas_inst.duration_ns)
    per_kind = {}
    for kind, entry in sorted(kinds.items()):
        errors = entry.pop("_errors")
        entry["error"] = _relative(entry["simulated_s"], entry["measured_s"])
        entry["median_op_error"] = statistics.median(errors) if errors else None
        per_kind[kind] = entry

    steps = measured.step_times_ns()
    step_measured_s = measured.step_time_ns() * 1e-9
    step_simulated_s = result.makespan_ns * 1e-9
    error = _relative(step_simulated_s, step_measured_s)
    band = _band(program, result, spec)
    return {
        "step_time_error": error,
        "step_time_s": {"measured": step_measured_s, "simulated": step_simulated_s,
                        "measured_min": min(steps) * 1e-9, "measured_max": max(steps) * 1e-9,
                        "iterations": len(steps), "iterations_used": len(measured.kept()),
                        **({"p10": band.p10_s, "p50": band.p50_s, "p90": band.p90_s}
                           if band else {})},
        "inside_band": None if band is None else band.p10_s <= step_measured_s <= band.p90_s,
        "per_op_kind": per_kind,
        "tolerance": tolerance,
        "within_tolerance": error is not None and error <= tolerance,
        "inputs": {"directory": str(directory), "cluster": spec.name, "cluster_source": cluster,
                   "calibration": calibration, "rank_speed": speeds, "fidelity": fidelity,
                   "nodes": nodes,
                   "gpus_per_node": gpus_per_node, "program": program.name,
                   "world_size": program.world_size},
    }
