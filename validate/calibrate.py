"""Fit the hardware models to measurements and write a calibration file.

Inputs: replay / microbenchmark directories (validate.store), nccl-tests stdout logs,
and the shared long-format nccl-tests CSV. No torch needed.

**Communication** (alpha-beta per tier and protocol regime). For every measured point
(collective or send/recv, its ranks, size, time) the simulator's plan is split into a
latency part ``A`` (base latency of the algorithm family and protocol + steps x hop
latency of the tier) and a bandwidth part ``B`` (bytes over link rate x efficiencies),
both from :class:`hardware.network.NetworkModel`, so the fit uses the very cost model it
calibrates. Points are grouped by the fields they depend on (family, protocol, tier)
and each group gets the scale factors ``(r_alpha, r_beta)`` minimising
``sum(((r_alpha A + r_beta B - t) / t)^2)`` (relative least squares, closed form; one
common factor when the sizes cannot separate the two). The latency fields are
multiplied by ``r_alpha``, the bandwidth efficiency divided by ``r_beta`` (an
efficiency that would pass 1 moves the excess into the raw rate). The planner may pick
other algorithms/protocols once the parameters change, so this repeats until the
factors settle (see :func:`fit_comm`).

**Compute.** Measured op times become tables of time vs work per (kind, dtype)
(``CalibratedComputeModel``), each replayed rank a speed relative to the tables
(:func:`rank_speeds`: a rank sharing a busier core runs slower), and the GpuSpec gets
the best GEMM rate (matmul peak x efficiency) and a copy fit
``t = launch + bytes / bandwidth`` (HBM bandwidth x efficiency, kernel launch), for
kinds without a table and for ``--calibration`` on ``trainsim simulate``.
"""

from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from hardware.calibration import (FLOP_KEYED_KINDS, Calibration, ComputeTable,
                                  apply_calibration, calibration_to_toml, get_field,
                                  spec_leaves)
from hardware.catalog import load_cluster
from hardware.compute import ComputeModel
from hardware.units import canonical_dtype
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.atomic_io import write_text_atomic
from hardware.cost import CostModel
from strategies.collectives.catalog import ALGORITHMS
from validate.nccl_log import NcclSeries, read_nccl_csv, read_nccl_tests
from validate.spans import Measurements, compute_ops, load_measurements
from validate.store import MeasurementStore

#: The preset a CPU (gloo) replay is simulated on.
CPU_HOST_PRESET = Path(__file__).with_name("cpu-host.toml")
#: Rounds of fit / re-plan.
FIT_ROUNDS = 8
MIB = 1 << 20


@dataclass(frozen=True)
class CommPoint:
    """One measured communication: ``time_s`` for ``size_bytes`` over ``ranks``.

    ``kind`` is a collective kind or ``p2p`` (ranks = (src, dst)); the job is
    ``nodes x gpus_per_node`` ranks; ``series`` labels where it came from.
    """

    kind: str
    ranks: tuple[int, ...]
    size_bytes: int
    time_s: float
    nodes: int
    gpus_per_node: int
    series: str


@dataclass(frozen=True)
class ComputePoint:
    """One measured compute op: ``time_s`` for ``work`` (FLOPs or bytes)."""

    kind: str
    dtype: str
    work: float
    time_s: float
    source: str


@dataclass
class Inputs:
    """Everything read from the command line's INPUTS."""

    comm: list[CommPoint] = field(default_factory=list)
    compute: list[ComputePoint] = field(default_factory=list)
    rank_ops: dict[int, list[ComputePoint]] = field(default_factory=dict)
    described: list[str] = field(default_factory=list)
    cluster_hint: str | None = None
    versions: dict = field(default_factory=dict)
    cpu_measurements: bool = False


# ------------------------------------------------------------------ reading inputs


def job_shape(measurements: Measurements) -> tuple[int, int]:
    """(nodes, ranks per node) of a replay: its distinct host names (one node when the
    ranks do not split evenly over them)."""
    hosts = measurements.hosts() or ["localhost"]
    world = measurements.program.world_size
    nodes = len(hosts) if world % len(hosts) == 0 else 1
    return nodes, world // nodes


def _series_points(series: NcclSeries) -> list[CommPoint]:
    ranks = tuple(range(series.ranks))
    return [CommPoint(series.kind, ranks, s, t * 1e-6, series.nodes, series.gpus_per_node,
                      series.label)
            for s, t in zip(series.sizes_bytes, series.times_us) if t > 0 and s > 0]


def _versions_of(env: dict) -> dict:
    keys = ("torch", "nccl", "cuda", "driver", "backend", "hostname")
    return {k: env.get(k) for k in keys if env.get(k) is not None} | (
        {"gpus": ", ".join(sorted(set(env["gpus"])))} if env.get("gpus") else {})


def read_inputs(paths: Sequence[str | Path], *, source: str | None = None) -> Inputs:
    """Read measurement directories, nccl-tests logs and CSV tables (only the rows of
    ``source_id == source`` when given).

    Raises:
        ValueError: a path that is missing or holds nothing measurable (one line).
    """
    found = Inputs()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            _read_directory(path, found)
        elif path.suffix == ".csv" and path.is_file():
            for series in read_nccl_csv(path, source_id=source):
                found.comm += _series_points(series)
                if series.nccl_version:
                    found.versions.setdefault("nccl_tests_nccl", set()).add(series.nccl_version)
            found.described.append(f"nccl-tests table {path}"
                                   + (f", source {source}" if source else ""))
        elif path.exists():  # read_nccl_tests refuses a FIFO, a device or a socket
            series = read_nccl_tests(path)
            found.comm += _series_points(series)
            found.described.append(f"nccl-tests log {path} ({series.kind}, {series.nodes} x "
                                   f"{series.gpus_per_node} ranks)")
        else:
            raise ValueError(f"inputs: {str(path)!r} not found; give measurement directories, "
                             "nccl-tests logs or .csv tables")
    if not found.comm and not found.compute:
        raise ValueError(f"inputs: nothing measured in {', '.join(map(str, paths))}")
    found.versions = {k: ", ".join(sorted(v)) if isinstance(v, set) else v
                      for k, v in found.versions.items()}
    return found


def _read_directory(path: Path, found: Inputs) -> None:
    store = MeasurementStore(path)
    what = []
    if (path / "program.json").exists() and store.read_series("replay"):
        measured = load_measurements(path)
        nodes, gpn = job_shape(measured)
        # Instances of one (kind, size, group size) are pooled into their mean: single
        # instances on a busy host vary with scheduling (a transfer that finished while
        # its receiver was busy measures ~0), and a step adds up their expected cost.
        pooled: dict[tuple, list] = {}
        for inst in measured.comm_instances():
            pooled.setdefault((inst.kind, inst.size_bytes, len(inst.ranks)), []).append(inst)
        for (kind, size, _), members in sorted(pooled.items()):
            mean_ns = statistics.fmean(i.duration_ns for i in members)
            found.comm.append(CommPoint(kind, members[0].ranks, size,
                                        max(mean_ns, 1000) * 1e-9, nodes, gpn,
                                        f"{path.name}:replay:{kind}"))
        durations = measured.mean_occupancy_ns()
        for rank, index, op in compute_ops(measured.program):
            work = op.flops if op.kind in FLOP_KEYED_KINDS else op.bytes
            point = ComputePoint(op.kind, canonical_dtype(op.dtype), work,
                                 max(durations[(rank, index)], 1) * 1e-9, f"{path.name}:replay")
            found.compute.append(point)
            found.rank_ops.setdefault(rank, []).append(point)
        env = measured.env.get(min(measured.env)) if measured.env else {}
        found.versions.update(_versions_of(env or {}))
        found.cluster_hint = found.cluster_hint or (measured.run or {}).get("cluster")
        what.append(f"replay of {measured.program.name!r}, {len(measured.iterations)} "
                    f"iterations, {measured.program.world_size} ranks")
    for rank, records in store.read_series("collectives").items():
        for rec in records:
            found.comm.append(CommPoint(rec["op"], tuple(range(rec["ranks"])), rec["size_bytes"],
                                        rec["time_us"] * 1e-6, rec["nodes"],
                                        rec["gpus_per_node"],
                                        f"{path.name}:collectives:{rec['op']}"))
        what.append(f"{len(records)} collective rows")
    for rank, records in store.read_series("compute").items():
        for rec in records:
            found.compute.append(ComputePoint(rec["kind"], canonical_dtype(rec["dtype"]),
                                              rec["work"], rec["time_s"], f"{path.name}:compute"))
        what.append(f"{len(records)} compute microbenchmark points of rank {rank}")
    env0 = store.read_meta("env", rank=0) or {}
    found.cpu_measurements |= bool(what) and (env0.get("backend") == "gloo"
                                              or not env0.get("cuda_available", False))
    if not what:
        raise ValueError(f"inputs: {str(path)!r} holds no measurements; give a directory "
                         "written by trainsim validate replay/collectives/gemm")
    found.described.append(f"measurements {path}: " + "; ".join(what))


# ------------------------------------------------------------------ communication fit


@dataclass(frozen=True)
class _Decomposed:
    latency_s: float
    bandwidth_s: float
    latency_field: str
    latency_count: int
    bandwidth_field: str
    label: str


def _decompose(spec: ClusterSpec, point: CommPoint, planners: dict,
               protocol: str = "auto") -> _Decomposed:
    """The simulator's time of ``point`` split into latency and bandwidth parts, and the
    spec fields each part is fitted through: a network collective's latency through the
    network hop latency (times its network steps), any other through the base latency
    of its algorithm family and protocol; the bandwidth through the efficiency of the
    bottleneck tier (or the protocol's / p2p's relative efficiency)."""
    key = (point.nodes, point.gpus_per_node)
    cost = planners.get(key)
    if cost is None:
        cost = CostModel(ClusterLayout(spec, point.nodes, point.gpus_per_node), ALGORITHMS)
        planners[key] = cost
    layout, model = cost.layout, cost.network
    if point.kind == "p2p":
        plan = cost.p2p_plan(point.ranks[0], point.ranks[1], point.size_bytes)
    else:
        plan = cost.collective_plan(point.kind, point.ranks, point.size_bytes,
                                    protocol=protocol)
    latency = model.base_latency_s(plan) + sum(
        model.phase_latency_s(ph, plan.protocol, plan.family) for ph in plan.phases)
    bandwidth = sum(model.phase_stream_s(plan, ph) for ph in plan.phases)
    network_steps = sum(ph.inter_steps for ph in plan.phases)
    tier = "network" if network_steps else layout.scale_up_tier
    proto = plan.protocol
    paced_steps = sum(ph.intra_steps + ph.inter_steps for ph in plan.phases
                      if model.ring_step_pacing_s(ph, proto, plan.family) > 0)
    if paced_steps:
        # a paced ring's steps take the pacing, not their hop latency
        # (NetworkModel.ring_step_pacing_s): its latency moves with that field
        lat_field, count = f"comm.ring_step_pacing_s.{proto}", paced_steps
    elif network_steps:
        lat_field, count = f"comm.hop_latency_s.network.{proto}", network_steps
    else:
        lat_field, count = f"comm.base_latency_s.{plan.family}.{proto}", 1
    if point.kind == "p2p":
        bw_field = f"comm.p2p_efficiency.{tier}"
    elif proto != "Simple":
        bw_field = f"comm.protocol_efficiency.{tier}.{proto}"
    elif plan.family == "nvls":
        bw_field = "scale_up.nvls_efficiency"
    elif tier == "network":
        bw_field = "nic.link_efficiency"
    else:
        bw_field = "scale_up.link_efficiency"
    return _Decomposed(latency, bandwidth, lat_field, count, bw_field,
                       f"{plan.label or plan.family}/{proto}")


#: Raw-rate field that takes an efficiency's excess over 1.
_RATE_FOR = {"scale_up.link_efficiency": {"pcie": "scale_up.pcie_bytes_per_s",
                                          "nvswitch": "scale_up.nvlink_bytes_per_s_per_link",
                                          "nvlink-mesh": "scale_up.nvlink_bytes_per_s_per_link"},
             "nic.link_efficiency": {"*": "nic.gbit_per_s"}}


#: A cost term explaining less than this share of every point's time is left as it is
#: (the points cannot determine it).
MIN_SHARE = 0.1


def _solve(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """:func:`_solve_once`, then once more without outliers: points whose relative error
    exceeds both 10 % and 3x the median error (a disturbed line of a log, e.g. the
    128 MiB line of liplus_a100_sendrecv at 57 % of its neighbours' bandwidth)."""
    ra, rb = _solve_once(rows)
    errors = [abs((ra * a + rb * b) / t - 1.0) for a, b, t in rows]
    limit = max(0.1, 3.0 * statistics.median(errors))
    kept = [row for row, err in zip(rows, errors) if err <= limit]
    if len(kept) < len(rows) and kept:
        return _solve_once(kept)
    return ra, rb


def _normal_sums(rows: Iterable[tuple[float, float, float]]) -> tuple[float, ...]:
    """Sums of the normal equations of t ~ c0 x0 + c1 x1 with weights 1/t^2 (relative
    error): (x0 x0, x0 x1, x1 x1, x0 t, x1 t)."""
    sums = [0.0] * 5
    for x0, x1, t in rows:
        w = 1.0 / (t * t)
        for i, term in enumerate((x0 * x0, x0 * x1, x1 * x1, x0 * t, x1 * t)):
            sums[i] += w * term
    return tuple(sums)


def _solve_once(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(r_alpha, r_beta) minimising the relative squared error of r_a A + r_b B vs t.

    A term whose share of the time is below :data:`MIN_SHARE` at every point keeps its
    factor 1 and the other is fitted alone; when the rows cannot separate the two (one
    size), one common factor scales both.
    """
    saa, sab, sbb, sat, sbt = _normal_sums(rows)
    if max(a / t for a, _, t in rows) < MIN_SHARE and sbb > 0:
        return 1.0, max(1e-6, (sbt - sab) / sbb)
    if max(b / t for _, b, t in rows) < MIN_SHARE and saa > 0:
        return max(1e-6, (sat - sab) / saa), 1.0
    det = saa * sbb - sab * sab
    if det > 1e-9 * max(saa * sbb, 1e-300):
        ra = (sat * sbb - sbt * sab) / det
        rb = (saa * sbt - sab * sat) / det
        if ra > 0 and rb > 0:
            return ra, rb
    total = saa + 2 * sab + sbb
    common = (sat + sbt) / total if total > 0 else 1.0
    return common, common


def fit_comm(spec: ClusterSpec, points: Sequence[CommPoint]) -> tuple[dict, ClusterSpec]:
    """Fit the communication fields of ``spec`` to ``points``.

    Outer loop: each point's protocol is the one the planner picks under the current
    parameters; inner loop: the fit with those protocols held fixed (so the groups do
    not change under it) until the factors settle; then the planner chooses again, until
    its choices stop changing (at most :data:`FIT_ROUNDS` times each).

    Returns ``({spec field path: value}, the fitted spec)``.
    """
    fields: dict[str, float] = {}
    current = spec
    choice: list[str] | None = None
    for _ in range(FIT_ROUNDS):
        planners: dict = {}
        new_choice = [_decompose(current, p, planners).label.split("/")[1] for p in points]
        if new_choice == choice:
            break
        choice = new_choice
        for _ in range(FIT_ROUNDS):
            fields, current, change = _fit_round(spec, current, fields, points, choice)
            if change < 1e-3:
                break
    return fields, current


def _fit_round(spec: ClusterSpec, current: ClusterSpec, fields: dict,
               points: Sequence[CommPoint], protocols: Sequence[str]):
    """One update of every group's latency and bandwidth field; returns the new fields,
    the spec they give and the largest relative change."""
    fields = dict(fields)
    planners: dict = {}
    groups: dict[tuple, list] = {}
    for point, protocol in zip(points, protocols):
        d = _decompose(current, point, planners, protocol)
        groups.setdefault((d.latency_field, d.latency_count, d.bandwidth_field), []).append(
            (d.latency_s, d.bandwidth_s, point.time_s))
    latency: dict[str, list[tuple[float, int]]] = {}
    beta: dict[str, list[tuple[float, int]]] = {}
    for (lat_field, count, bw_field), rows in groups.items():
        ra, rb = _solve(rows)
        mean_a = sum(a for a, _, _ in rows) / len(rows)
        # additive: the field moves so that this group's latency part becomes ra * A
        proposal = max(0.0, get_field(current, lat_field) + (ra - 1.0) * mean_a / count)
        latency.setdefault(lat_field, []).append((proposal, len(rows)))
        if any(b > 0 for _, b, _ in rows):
            beta.setdefault(bw_field, []).append((rb, len(rows)))
    change = 0.0
    for name, proposals in latency.items():
        value = sum(v * n for v, n in proposals) / sum(n for _, n in proposals)
        old = get_field(current, name)
        change = max(change, abs(value - old) / max(old, value, 1e-12))
        fields[name] = value
    for name, ratios in beta.items():
        weight = sum(n for _, n in ratios)
        ratio = math.exp(sum(n * math.log(r) for r, n in ratios) / weight)
        change = max(change, abs(math.log(ratio)))
        value = get_field(current, name) / ratio
        if value > 1.0:
            rate = _RATE_FOR.get(name, {})
            rate_field = rate.get(current.scale_up.kind) or rate.get("*")
            if rate_field:
                fields[rate_field] = get_field(current, rate_field) * value
            value = 1.0
        fields[name] = value
    return fields, apply_calibration(spec, Calibration(fields)), change


def comm_residuals(spec: ClusterSpec, points: Sequence[CommPoint]) -> dict:
    """Per series: relative error of the fitted model's time (= of busbw, |t/t_fit - 1|)
    over all points and over sizes >= 1 MiB: median, p90, max, count."""
    planners: dict = {}
    by_series: dict[str, list[tuple[int, float]]] = {}
    for point in points:
        d = _decompose(spec, point, planners)
        predicted = d.latency_s + d.bandwidth_s
        by_series.setdefault(point.series, []).append(
            (point.size_bytes, abs(point.time_s / predicted - 1.0)))
    out = {}
    for series, errors in by_series.items():
        entry = _stats([e for _, e in errors])
        large = [e for s, e in errors if s >= MIB]
        if large:
            entry |= {f"{k}_ge_1MiB": v for k, v in _stats(large).items()}
        out[series] = entry
    return out


def _stats(errors: list[float]) -> dict:
    ordered = sorted(errors)
    p90 = ordered[min(len(ordered) - 1, int(math.ceil(0.9 * len(ordered))) - 1)]
    return {"median_rel_err": round(statistics.median(ordered), 6),
            "p90_rel_err": round(p90, 6), "max_rel_err": round(ordered[-1], 6),
            "points": len(ordered)}


# ------------------------------------------------------------------ compute fit


def compute_tables(points: Iterable[ComputePoint]) -> dict[tuple[str, str], ComputeTable]:
    """Mean time per distinct work of each (kind, dtype) (ops of the same work are the
    same kernel: their mean is its expected cost)."""
    grouped: dict[tuple[str, str], dict[float, list[float]]] = {}
    for p in points:
        work = float(p.work) if p.work > 0 else 1.0
        grouped.setdefault((p.kind, p.dtype), {}).setdefault(work, []).append(p.time_s)
    return {key: ComputeTable(tuple(sorted(by_work)),
                              tuple(statistics.fmean(by_work[w]) for w in sorted(by_work)))
            for key, by_work in grouped.items()}


def fit_compute(spec: ClusterSpec, points: Sequence[ComputePoint]) -> dict:
    """GpuSpec fields from measured ops: GEMM peak x efficiency per dtype, copy bandwidth
    and per-kernel overhead. Returns ``{spec field path: value}``."""
    gpu = spec.gpu
    fields: dict[str, float] = {}
    rates: dict[str, float] = {}
    for dtype in sorted({p.dtype for p in points if p.kind == "matmul"}):
        mm = sorted((p for p in points if p.kind == "matmul" and p.dtype == dtype),
                    key=lambda p: p.work)
        top = mm[len(mm) * 3 // 4:] or mm
        rates[dtype] = statistics.median(p.work / p.time_s for p in top)
    if rates:
        primary = max(rates, key=lambda d: sum(1 for p in points if p.dtype == d))
        peak = gpu.peak_flops_per_s.get(primary, 0.0)
        efficiency = min(1.0, rates[primary] / peak) if peak > 0 else 1.0
        fields["gpu.matmul_peak_efficiency"] = efficiency
        for dtype, rate in rates.items():
            if gpu.peak_flops_per_s.get(dtype, 0.0) * efficiency < rate or dtype == primary \
                    and efficiency == 1.0:
                fields[f"gpu.peak_flops_per_s.{dtype}"] = rate / efficiency
    copies = [p for p in points if p.kind not in FLOP_KEYED_KINDS and p.work > 1]
    if len({p.work for p in copies}) >= 2:
        # relative least squares of t = launch + bytes / bandwidth
        rows = [(1.0, p.work, p.time_s) for p in copies]
        launch, per_byte = _solve(rows) if False else _linear_fit(rows)
        if per_byte > 0:
            bandwidth = 1.0 / per_byte
            if bandwidth <= gpu.hbm_bytes_per_s:
                fields["gpu.memory_efficiency"] = bandwidth / gpu.hbm_bytes_per_s
            else:
                fields["gpu.hbm_bytes_per_s"] = bandwidth
                fields["gpu.memory_efficiency"] = 1.0
        fields["gpu.kernel_launch_s"] = max(0.0, launch)
    return fields


def _linear_fit(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(c0, c1) of t = c0 * x0 + c1 * x1 by relative least squares (may be negative)."""
    s00, s01, s11, s0t, s1t = _normal_sums(rows)
    det = s00 * s11 - s01 * s01
    if det <= 0:
        return 0.0, s1t / s11 if s11 else 0.0
    return (s0t * s11 - s1t * s01) / det, (s00 * s1t - s01 * s0t) / det


def rank_speeds(tables: dict, rank_ops: dict[int, list[ComputePoint]]) -> dict[int, float]:
    """Speed of each replayed rank: the tables' time of its compute ops over their
    measured time (the tables average all ranks; a rank on a busier core comes out
    below 1). The engine's ``rank_speed`` divides that rank's kernel times by it."""
    speeds = {}
    for rank, points in sorted(rank_ops.items()):
        predicted = sum(tables[(p.kind, p.dtype)](max(p.work, 1.0)) for p in points)
        measured = sum(p.time_s for p in points)
        if predicted > 0 and measured > 0:
            speeds[rank] = predicted / measured
    return speeds


def compute_residuals(spec: ClusterSpec, tables: dict, points: Sequence[ComputePoint]) -> dict:
    """Per (kind/dtype): relative error of the tables and of the fitted roofline."""
    model = ComputeModel(spec.gpu)
    out = {}
    for (kind, dtype), table in sorted(tables.items()):
        mine = [p for p in points if p.kind == kind and p.dtype == dtype]
        table_err = [abs(table(max(p.work, 1.0)) / p.time_s - 1) for p in mine]
        entry = {f"table_{k}": v for k, v in _stats(table_err).items()}
        try:
            roof = []
            for p in mine:
                op = _Probe(kind, dtype, p.work)
                roof.append(abs(model.duration_s(op) / p.time_s - 1))
            entry |= {f"roofline_{k}": v for k, v in _stats(roof).items() if k != "points"}
        except ValueError:
            pass
        out[f"{kind}/{dtype}"] = entry
    return out


@dataclass(frozen=True)
class _Probe:
    kind: str
    dtype: str
    work: float
    name: str = "probe"

    @property
    def flops(self) -> float:
        return self.work if self.kind in FLOP_KEYED_KINDS else 0.0

    @property
    def bytes(self) -> float:
        return 0.0 if self.kind in FLOP_KEYED_KINDS else self.work


# ------------------------------------------------------------------ the command


def preset_path(name: str) -> str:
    """``cpu-host`` names :data:`CPU_HOST_PRESET`; anything else is passed on as is."""
    return str(CPU_HOST_PRESET) if name == "cpu-host" else name


def base_cluster(cluster: str | None, overrides: dict | None,
                 inputs: Inputs) -> tuple[str, ClusterSpec]:
    """The preset the measurements are fitted against, and its name (``cpu-host`` for the
    CPU preset, so a calibration file does not carry this checkout's path).

    Raises:
        ValueError: no cluster given and the inputs do not say (GPU measurements).
    """
    cluster = cluster or inputs.cluster_hint
    if cluster is None:
        if not inputs.cpu_measurements:
            raise ValueError("cluster: give --cluster, the preset the measurements ran on "
                             "(e.g. dgx-h100); only CPU (gloo) runs default to cpu-host")
        cluster = "cpu-host"
    return cluster, load_cluster(preset_path(cluster), overrides)


def calibrate(paths: Sequence[str | Path], *, cluster: str | None = None,
              overrides: dict | None = None, out: str | Path | None = None,
              source: str | None = None) -> dict:
    """Fit and (with ``out``) write a calibration file; return its content as a dict
    (``fields``, ``compute_tables``, ``provenance``, ``residuals``).

    Raises:
        ValueError: unreadable inputs or an unknown cluster (one line).
    """
    inputs = read_inputs(paths, source=source)
    name, spec = base_cluster(cluster, overrides, inputs)
    fields: dict = {}
    if overrides:  # the overrides the fit assumed travel with it, as spec fields
        plain_base = spec_leaves(load_cluster(preset_path(name)))
        for path, value in spec_leaves(spec).items():
            if plain_base.get(path) != value \
                    and isinstance(value, (int, float, bool)) \
                    and not ("efficiency" in path and value == 0):
                fields[path] = value
    residuals: dict = {}
    fitted = spec
    if inputs.compute:
        fields.update(fit_compute(spec, inputs.compute))
    fitted = apply_calibration(spec, Calibration(fields)) if fields else spec
    if inputs.comm:
        comm_fields, fitted = fit_comm(fitted, inputs.comm)
        fields.update(comm_fields)
        fitted = apply_calibration(spec, Calibration(fields))
        residuals["comm"] = comm_residuals(fitted, inputs.comm)
    tables = compute_tables(inputs.compute)
    speeds = rank_speeds(tables, inputs.rank_ops) if inputs.rank_ops else {}
    if tables:
        residuals["compute"] = compute_residuals(fitted, tables, inputs.compute)
    from importlib.metadata import PackageNotFoundError, version

    try:
        trainsim_version = version("trainsim")
    except PackageNotFoundError:
        trainsim_version = "unknown"
    provenance = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trainsim_version": trainsim_version,
        "base_cluster": name,
        "base_overrides": {k: str(v) for k, v in (overrides or {}).items()},
        "inputs": [str(Path(p).resolve()) for p in paths],
        "source_id": source or "",
        "described": inputs.described,
        "comm_points": len(inputs.comm),
        "compute_points": len(inputs.compute),
        "versions": {k: str(v) for k, v in inputs.versions.items()},
        "method": "validate/calibrate.py: relative least squares of alpha/beta per "
                  "(algorithm family, protocol, tier) on the simulator's own cost terms; "
                  "compute tables = mean measured time per work",
    }
    text = calibration_to_toml(fields, tables, provenance, residuals, speeds)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
    return {"fields": fields, "compute_tables": tables, "provenance": provenance,
            "residuals": residuals, "rank_speed": speeds, "spec": fitted}
