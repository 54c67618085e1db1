"""The nccl-tests logs of validate/data/nccl, simulated on the preset of their system.

Shared by ``tests/test_nccl_logs.py`` (which asserts the tolerances of issue 12) and
runnable on its own to print every table::

    PYTHONPATH=. python tests/nccl_logs.py

A *log* is the set of rows of one long-format CSV that share source, collective, job
shape, algorithm note, environment and citation (validate/data/nccl/SOURCES.md). Each
is simulated at analytic fidelity on the preset that describes its system
(:data:`SYSTEMS`), with the algorithm the log ran (:func:`algorithm_of`); logs whose
algorithm trainsim does not model (CollNet / SHARP) are left out and listed as such.

Categories (issue 12, must-show of item 4):

* ``sendrecv``: sendrecv across nodes (nccl-tests' ring over all ranks);
* ``tree``: all_reduce with the tree algorithm across nodes;
* ``mid``: sizes 1-256 MiB of multi-node logs;
* ``ring_nodes``: ring (or NCCL-default) busbw of one system and report at several
  node counts, compared point by point and by its drop from the fewest nodes.

Calibration logs (:data:`CALIBRATION_LOGS`) are the ones a preset number was fitted on
(``comm.ring_step_pacing_us.LL128``, :func:`ring_step_pacing_fit`): they are reported
apart and are in no category, so every category holds validation logs only. Refit::

    PYTHONPATH=. python tests/nccl_logs.py --fit-ring-pacing

Errors are ``(simulated - measured) / measured`` of busbw.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware.catalog import load_cluster
from hardware.cost import CostModel
from hardware.topology import ClusterLayout
from sim.collective_bench import _PER_RANK_SPLIT, _count, bus_factor
from strategies.collectives.catalog import ALGORITHMS

DATA = Path(__file__).resolve().parents[1] / "validate" / "data" / "nccl"
MiB = 1 << 20
#: The long-format logs (SOURCES.md section 2).
LOG_FILES = (
    "nccl_xxrjun_h100_clusters.csv",
    "nccl_alcf_polaris_a100.csv",
    "nccl_aws_awsome_distributed_training_readme.csv",
    "nccl_coreweave_readme.csv",
    "nccl_gh_nccl1801_gb200_tree_vs_ring.csv",
    "nccl_together_b200_sendrecv_scaling.csv",
    "nccl_together_b200_64node_sweep.csv",
    "nccl_together_b200_collective_scaling.csv",
    "nccl_together_gb200_nvl72_rack_allreduce.csv",
)


@dataclass(frozen=True)
class Log:
    """One benchmark run: its identity and its (size bytes, busbw GB/s) lines."""

    source: str
    collective: str
    gpu_model: str
    nodes: int
    gpus_per_node: int
    note: str
    env: str
    citation: str
    rows: tuple[tuple[int, float], ...]

    @property
    def label(self) -> str:
        """Short name for tables."""
        note = self.note.split(" (")[0][:22]
        column = self.citation.split(" column ")[1].split(" ")[0] if " column " in self.citation else ""
        if column and not column.islower():  # one column of a report's table: name it
            note = f"{note} [{column[:10]}]"
        return f"{self.source[:26]} {self.collective} {self.nodes}x{self.gpus_per_node} {note}"


def load_logs() -> list[Log]:
    """Every log of :data:`LOG_FILES` (rows without a busbw are skipped)."""
    logs: list[Log] = []
    for name in LOG_FILES:
        grouped: OrderedDict[tuple, list[tuple[int, float]]] = OrderedDict()
        with open(DATA / name, newline="") as handle:
            for r in csv.DictReader(handle):
                busbw = r["oop_busbw_GBps"] or r["ip_busbw_GBps"]
                if not busbw:
                    continue
                key = (r["source_id"], r["collective"], r["gpu_model"], int(r["num_nodes"]),
                       int(r["gpus_per_node"]), r["algorithm_note"], r["nccl_env"],
                       r["citation"])
                grouped.setdefault(key, []).append((int(r["size_bytes"]), float(busbw)))
        logs += [Log(*key, tuple(rows)) for key, rows in grouped.items()]
    return logs


# ------------------------------------------------------------------ systems
#: source -> (preset, overrides) of the system it ran on, with why.
SYSTEMS: dict[str, tuple[str, dict]] = {
    # H100 80GB HBM3, 8 per host (printed); network not stated (SOURCES.md).
    "xxrjun_h100_clusters": ("dgx-h100", {}),
    # 8x B200 + 8x ConnectX-7 400G IB per node, NCCL 2.29.7 / 2.28.9 (stated).
    "together_b200_sendrecv_scaling": ("dgx-b200", {}),
    "together_b200_64node_sweep": ("dgx-b200", {}),
    "together_b200_collective_scaling": ("dgx-b200", {}),
    # 4x A100-40GB, 2x Slingshot 11 (ALCF machine overview).
    "alcf_polaris_a100": ("polaris", {}),
    # GB200 NVL72 trays of 4 GPUs (stated).
    "together_gb200_nvl72_rack_allreduce": ("gb200-nvl72", {}),
    "coreweave_readme": ("gb200-nvl72", {}),
    # Three NVL partitions on different racks joined by IB only: a domain per partition.
    "gh_nccl1801_gb200_tree_vs_ring": ("gb200-nvl72", {"scale_up.nvls": False}),
}
#: Together's use3a-ss B200 cluster (NCCL 2.29.7): its NICs deliver 43.1 GB/s of 50, the
#: per-pair rate of its 2-node sendrecv (NIC-bound: 4 p2p channels x 14 GB/s exceed it;
#: nccl_together_b200_sendrecv_scaling.csv, 41.9-44.9 GB/s at 64-256 MiB), not the 0.95 of
#: the dgx-b200 preset; the ring and tree logs of the cluster are then predictions.
B200_USE3A = {"nic.link_efficiency": 0.86}
#: Together's "flapping-airplanes" B200 cluster ran NCCL 2.28.9 (printed): 2 p2p channels
#: per network peer, halved while 2 x ranks > 4 x the p2p pool (paths.cc of 2.28.9).
B200_SLINKY = {"comm.p2p_net_channels_per_peer": 2, "comm.p2p_peers_per_channel": 4}
#: NCCL <= 2.27 gave Blackwell twice Hopper's per-channel tree ceilings (tuning.cc
#: perChMaxTreeBws "Blackwell {2*38.7, 2*41.4, 2*36.0}"); 2.28 measured lower ones.
NCCL_2_27_BLACKWELL_TREE = {"comm.channel_max_gb_per_s.tree.Simple.n1": 77.4,
                            "comm.channel_max_gb_per_s.tree.Simple.n2": 82.8,
                            "comm.channel_max_gb_per_s.tree.Simple.n4": 72.0}
#: AWS instance types of aws_awsome_distributed_training_readme (AWS instance specs):
#: p4de.24xlarge = 8x A100 80GB, 4x 100 Gb/s EFA; p5.48xlarge = 8x H100, 32x 100 Gb/s
#: EFAv2, laid out here as one 400 Gb/s EFA rail per GPU (4 x 100G each).
#: The EFA net plugin (aws-ofi-nccl, src/platform-aws.cpp platform_config_endpoint) sets
#: NCCL_PROTO=simple when the endpoint cannot deliver 128-byte-aligned writes in order
#: (LL/LL128 "can lead to data corruption"): p4d/p4de use its SENDRECV transport, whose
#: FI_OPT_EFA_SENDRECV_IN_ORDER_ALIGNED_128_BYTES EFA does not support there (p4d.24xlarge
#: log in aws/aws-ofi-nccl#715: "... not supported", "Setting NCCL_PROTO to simple"); p5
#: uses the RDMA transport, where the plugin leaves NCCL_PROTO alone
#: (aws/aws-ofi-nccl#280, "Do not force NCCL_PROTO=simple on P5"). The plugin reports a
#: network latency of 75 us on p4d, p4de and p5 (platform_data_map ``.latency = 75.0``;
#: "NET/OFI Internode latency set at 75.0 us" in #715; ``props->latency``), which NCCL adds
#: to every network step of its model, twice for Simple (nic.net_latency_us).
AWS = {"A100": ("dgx-a100", {"nic.count_per_node": 4, "nic.gbit_per_s": 100.0,
                             "nic.kind": "efa", "comm.nccl_proto": "Simple",
                             "nic.net_latency_us": 75.0}),
       "H100": ("dgx-h100", {"nic.gbit_per_s": 400.0, "nic.kind": "efa",
                             "nic.net_latency_us": 75.0})}


def system_of(log: Log) -> tuple[str, dict, int, int] | None:
    """(preset, overrides, nodes, GPUs per node) that describe the log's system and job;
    None when no preset does."""
    nodes, gpn = log.nodes, log.gpus_per_node
    if log.source == "aws_awsome_distributed_training_readme":
        return (*AWS["A100" if "A100" in log.gpu_model else "H100"], nodes, gpn)
    if log.source == "coreweave_readme" and "GB200" not in log.gpu_model:
        return None  # hardware and rank count not printed (SOURCES.md: low confidence)
    found = SYSTEMS.get(log.source)
    if found is None:
        return None
    preset, overrides = found
    if log.source.startswith("together_b200"):
        overrides = {**overrides, **(B200_SLINKY if "flapping-airplanes" in log.citation
                                     else B200_USE3A)}
    if log.source == "gh_nccl1801_gb200_tree_vs_ring":
        # one NVL partition of gpus_per_node GPUs (1 or 2 trays of 4) per "node", and the
        # tree kernel of the NCCL the poster ran (2.27.3)
        overrides = {**overrides, **NCCL_2_27_BLACKWELL_TREE, "scale_up.domain_gpus": gpn}
        nodes, gpn = nodes * gpn // 4, 4
    if log.source == "coreweave_readme" and log.nodes == 32:
        # 2 racks of 16 trays (128 ranks, SOURCES.md): a domain per rack
        overrides = {**overrides, "scale_up.domain_gpus": 64}
    return preset, overrides, nodes, gpn


def algorithm_of(log: Log) -> str | None:
    """trainsim's algorithm for what the log ran (None: not modelled: CollNet/SHARP)."""
    note, env = log.note.lower(), log.env.lower()
    collnet_active = "nccl_collnet_enable=1" in env and "no collnet plugin" not in note
    if note.startswith("collnet") or collnet_active:
        return None
    if log.collective != "all_reduce":
        return "auto"
    if "nccl_algo=nvlstree" in env or note.startswith("nvlstree"):
        return "nvls_tree"
    if "nccl_algo=tree" in env or note.startswith("tree"):
        return "tree"
    if "nccl_algo=ring" in env or note.startswith("ring"):
        return "ring"
    return "auto"


# ---------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Row:
    """One compared line."""

    log: Log
    size_bytes: int
    measured: float
    simulated: float
    plan: str

    @property
    def error(self) -> float:
        """Relative busbw error."""
        return (self.simulated - self.measured) / self.measured


@lru_cache(maxsize=None)
def _simulate(preset: str, overrides: tuple, kind: str, nodes: int, gpn: int,
              algorithm: str, sizes: tuple[int, ...]) -> dict[int, tuple[float, str]]:
    """{size: (busbw GB/s, algorithm/protocol)} as ``trainsim collective`` gives at
    analytic fidelity (the engine's makespan of one collective is the cost model's
    duration; priced here without building a Program of every rank)."""
    cluster = load_cluster(preset, dict(overrides))
    layout = ClusterLayout(cluster, nodes, gpn)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    ranks = layout.world_size
    group = tuple(range(ranks))
    out: dict[int, tuple[float, str]] = {}
    for requested in sizes:
        # nccl-tests' float elements, rounded down to whole elements per rank
        count = _count(kind, requested, ranks, 4)
        size = count * 4 * (ranks if kind in _PER_RANK_SPLIT else 1)
        if count == 0:
            continue
        choice = cost.collective(kind, group, size, algorithm)
        busbw = size / choice.duration_ns * bus_factor(kind, ranks)  # bytes/ns = GB/s
        out[size] = (busbw, f"{choice.algorithm}/{choice.protocol}")
    return out


def compare(log: Log) -> list[Row] | None:
    """The log's lines with their simulated busbw (None: not simulated)."""
    system, algorithm = system_of(log), algorithm_of(log)
    if system is None or algorithm is None:
        return None
    preset, overrides, nodes, gpn = system
    sizes = tuple(size for size, _ in log.rows)
    simulated = _simulate(preset, tuple(sorted(overrides.items())), log.collective,
                          nodes, gpn, algorithm, sizes)
    rows = []
    for size, busbw in log.rows:
        # nccl-tests rounds sizes down to a multiple of the ranks; so does the sweep
        near = min(simulated, key=lambda s: abs(s - size))
        if busbw > 0 and abs(near - size) <= log.nodes * log.gpus_per_node * 8:
            rows.append(Row(log, size, busbw, *simulated[near]))
    return rows


@lru_cache(maxsize=2)
def compared(simulate: bool = True) -> tuple[tuple[Log, tuple[Row, ...] | None], ...]:
    """Every log with its compared rows (None: not simulated). ``simulate=False`` gives
    the rows that would be compared with no simulated value (nan): what test
    parametrization needs, at collection time, without seconds of simulation in every
    pytest-xdist worker."""
    out = []
    for log in load_logs():
        if simulate:
            rows = compare(log)
        elif system_of(log) is None or algorithm_of(log) is None:
            rows = None
        else:
            rows = [Row(log, size, busbw, math.nan, "") for size, busbw in log.rows
                    if busbw > 0]
        out.append((log, None if rows is None else tuple(rows)))
    return tuple(out)


# ---------------------------------------------------------------- categories
def median_abs(errors) -> float:
    """Median of absolute errors (nan for none)."""
    errors = [abs(e) for e in errors]
    return statistics.median(errors) if errors else float("nan")


@lru_cache(maxsize=None)
def category_rows(category: str, simulate: bool = True) -> list[Row]:
    """Rows of a category (see the module docstring; calibration logs are in none);
    ``simulate`` as :func:`compared`."""
    rows: list[Row] = []
    for log, found in compared(simulate):
        if not found or log.nodes < 2:
            continue
        if category == "sendrecv" and log.collective == "sendrecv":
            rows += [r for r in found if r.size_bytes >= MiB]
        elif category == "tree" and algorithm_of(log) == "tree":
            rows += [r for r in found if r.size_bytes >= MiB]
        elif (category == "mid" and log.source not in MID_SIZE_EXCLUDED and _domains(log) > 1
              and not is_calibration(log)):
            rows += [r for r in found if MiB <= r.size_bytes <= 256 * MiB]
    return rows


@lru_cache(maxsize=None)
def _domain_gpus(preset: str) -> int:
    return load_cluster(preset).scale_up.domain_gpus


@lru_cache(maxsize=None)
def _domains(log: Log) -> int:
    """NVLink domains (NCCL's "nodes") the log's job spans."""
    system = system_of(log)
    if system is None:
        return log.nodes
    preset, overrides, nodes, gpn = system
    domain_gpus = overrides.get("scale_up.domain_gpus") or _domain_gpus(preset)
    return max(1, -(-nodes * gpn // domain_gpus))


#: Logs left out of the mid-size category, and why.
MID_SIZE_EXCLUDED = {
    # README setup (5) (FI_CXI software matching, alt_read rendezvous) holds the time at a
    # floor of ~0.5-4 ms up to 16-64 MiB that no link or NCCL term explains (SOURCES.md;
    # the 2-node sweep takes 0.9 ms from 2 to 16 MiB alike).
    "alcf_polaris_a100",
}

#: Logs a preset number is fitted on: (source, collective, nodes, GPUs per node), and
#: what. Reported apart (:func:`calibration_rows`), in no category (validation only).
CALIBRATION_LOGS = {
    # comm.ring_step_pacing_us.LL128 (hardware/catalog/_defaults.toml): the 80-rank H100
    # rings (10 x 8, NCCL 2.29.2) of xxrjun/nccl-tests-cluster, ring_step_pacing_fit
    ("xxrjun_h100_clusters", "all_gather", 10, 8): "comm.ring_step_pacing_us.LL128",
    ("xxrjun_h100_clusters", "reduce_scatter", 10, 8): "comm.ring_step_pacing_us.LL128",
}


def is_calibration(log: Log) -> bool:
    """Whether a preset number was fitted on the log (:data:`CALIBRATION_LOGS`)."""
    return (log.source, log.collective, log.nodes, log.gpus_per_node) in CALIBRATION_LOGS


def calibration_rows() -> list[Row]:
    """Rows of the calibration logs at 1 MiB or more (the validation tables leave them
    out)."""
    return [r for log, found in compared() if found and is_calibration(log)
            for r in found if r.size_bytes >= MiB]


@dataclass(frozen=True)
class Series:
    """Busbw of one system, report, collective and size at several node counts."""

    key: str
    points: tuple[Row, ...]  # sorted by nodes

    def drop(self, attr: str) -> float:
        """busbw at the most nodes / busbw at the fewest."""
        first, last = self.points[0], self.points[-1]
        return getattr(last, attr) / getattr(first, attr)


@lru_cache(maxsize=2)
def ring_series(simulate: bool = True) -> list[Series]:
    """Ring series (forced ring, or the report's Ring column) of one system, report,
    collective and size at >= 2 multi-node counts, for sizes of at least 256 MiB;
    ``simulate`` as :func:`compared`."""
    by_key: dict[tuple, list[Row]] = {}
    for log, found in compared(simulate):
        if not found or _domains(log) < 2 or log.collective == "sendrecv":
            continue
        ring = ("nccl_algo=ring" in log.env.lower() or log.note.lower().startswith("ring"))
        if not ring:
            continue
        note = log.note.split(" (")[0]
        citation = log.citation.split(" column")[0].split(" table")[0]
        for row in found:
            if row.size_bytes < 256 * MiB:
                continue
            key = (log.source, citation, log.collective, note, log.gpus_per_node,
                   row.size_bytes)
            by_key.setdefault(key, []).append(row)
    series = []
    for key, rows in by_key.items():
        nodes = {r.log.nodes for r in rows}
        if len(nodes) >= 2 and len(rows) == len(nodes):
            rows.sort(key=lambda r: r.log.nodes)
            label = f"{key[0][:24]} {key[2]} {key[3][:14]} {key[5] / 2**30:g}GiB"
            series.append(Series(label, tuple(rows)))
    return series


# ------------------------------------------------------- ring latency at scale
#: Size windows (bytes) where each protocol's latency, not its bandwidth, sets a large
#: ring's time, read under the protocol trainsim's selection (NCCL's tuning model) runs
#: there: LL at 1-2 MiB (NCCL's channel thresholds run one channel there) and LL128 at
#: 16-256 MiB (the streaming time is a fifth or less of the measured time at >= 80
#: ranks). LL128, not Simple, is what NCCL runs at 16 MiB-4 GiB on the 512-rank ring:
#: its model (tuning.cc / src/tuning/ring.cc: LL128 latency below Simple's, 0.92 of its
#: bandwidth) keeps LL128 to ~6 GB, and the logs show the switch between 4 and 8 GiB
#: (test_512_rank_ring_switches_to_simple_between_4_and_8_gib).
LATENCY_WINDOWS = {"LL": (1 * MiB, 2 * MiB), "LL128": (16 * MiB, 256 * MiB)}
#: Fewest ranks a ring log needs to be read for its step latency (below, the latency
#: is under a tenth of the time at these sizes and the ratio is noise).
LATENCY_MIN_RANKS = 64


@dataclass(frozen=True)
class RingLatency:
    """One line of a large multi-node ring log read for its latency: the measured time
    minus the time trainsim streams the bytes at ``protocol``, over trainsim's latency
    of the ring at that protocol (base latency + NCCL tuning.cc's steps x hop latency;
    hardware/network.py ``phase_latency_s``). 1.0: the step model explains the time."""

    log: Log
    size_bytes: int
    protocol: str
    steps: int
    measured_s: float
    stream_s: float
    latency_s: float
    inter_steps: int = 0
    base_s: float = 0.0

    @property
    def ratio(self) -> float:
        """(measured - streaming) / modelled latency."""
        return (self.measured_s - self.stream_s) / self.latency_s


@lru_cache(maxsize=None)
def ring_latency_rows() -> tuple[RingLatency, ...]:
    """:class:`RingLatency` of every ring (forced, or chosen by auto) all_reduce,
    all_gather and reduce_scatter log over >= LATENCY_MIN_RANKS ranks and several
    NVLink domains, at the sizes of :data:`LATENCY_WINDOWS` where trainsim's
    selection runs that window's protocol."""
    out: list[RingLatency] = []
    for log, rows in compared():
        if not rows or log.collective not in ("all_reduce", "all_gather", "reduce_scatter"):
            continue
        if _domains(log) < 2 or log.nodes * log.gpus_per_node < LATENCY_MIN_RANKS:
            continue
        if log.source in MID_SIZE_EXCLUDED:
            continue
        for row in rows:
            protocol = row.plan.removeprefix("ring/")  # the protocol the selection runs
            window = LATENCY_WINDOWS.get(protocol) if row.plan.startswith("ring/") else None
            # (1 % slack: some logs print 63.999 MiB for 64 MiB)
            if window is None or not 0.99 * window[0] <= row.size_bytes <= window[1]:
                continue
            out.append(ring_latency(log, row, protocol))
    return tuple(out)


def ring_latency(log: Log, row: Row, protocol: str) -> RingLatency:
    """One log row read as a ring of ``protocol`` over all the log's ranks
    (:class:`RingLatency`: measured, streamed and modelled latency, steps)."""
    preset, overrides, nodes, gpn = system_of(log)
    cost = _cost_model(preset, tuple(sorted(overrides.items())), nodes, gpn)
    network, ranks = cost.network, nodes * gpn
    plan = cost.collective_plan(log.collective, tuple(range(ranks)), row.size_bytes, "ring",
                                protocol)
    # NCCL's own step model (no ring step pacing: that is what this reading measures)
    latency = network.base_latency_s(plan) + sum(
        network.phase_latency_s(ph, protocol, plan.family, paced=False) for ph in plan.phases)
    stream = sum(network.phase_stream_s(plan, ph) for ph in plan.phases)
    steps = sum(ph.intra_steps + ph.inter_steps for ph in plan.phases)
    # nccl-tests: busbw = size / time x bus factor (bytes/ns = GB/s)
    measured = row.size_bytes * bus_factor(log.collective, ranks) / row.measured
    return RingLatency(log, row.size_bytes, protocol, steps, measured * 1e-9, stream, latency,
                       sum(ph.inter_steps for ph in plan.phases), network.base_latency_s(plan))


#: Protocols whose ring step pacing a calibration log measures (LL: no calibration log
#: runs LL in its latency window; Simple: no multi-node ring log runs it at sizes where
#: latency counts; both stay 0 in the presets).
PACING_PROTOCOLS = ("LL128",)


def ring_step_pacing_fit(protocol: str = "LL128") -> tuple[float, int]:
    """(``comm.ring_step_pacing_us[protocol]`` fitted, rows it was fitted on) from the
    calibration logs (:data:`CALIBRATION_LOGS`): the median over their
    :func:`ring_latency_rows` of that protocol of the time per ring step beyond
    streaming and the base latency, ``(measured - streamed - base) / steps``, in us
    rounded to 0.1. That is the value at which a ring whose every step is paced
    (hardware/network.py ``ring_step_pacing_s``: the pacing above every hop latency)
    reproduces the median row. Neither the streaming time nor the base latency depends
    on the pacing, so the fit does not depend on the value stored.

    Raises:
        ValueError: ``protocol`` not in :data:`PACING_PROTOCOLS`, or no row to fit on.
    """
    if protocol not in PACING_PROTOCOLS:
        raise ValueError(f"protocol: {protocol!r} has no calibration log; valid: "
                         f"{', '.join(PACING_PROTOCOLS)}")
    per_step = [(r.measured_s - r.stream_s - r.base_s) / r.steps * 1e6
                for r in ring_latency_rows()
                if is_calibration(r.log) and r.protocol == protocol]
    if not per_step:
        raise ValueError(f"protocol: no {protocol} ring row in the calibration logs")
    return round(statistics.median(per_step), 1), len(per_step)


@lru_cache(maxsize=None)
def _cost_model(preset: str, overrides: tuple, nodes: int, gpn: int) -> CostModel:
    layout = ClusterLayout(load_cluster(preset, dict(overrides)), nodes, gpn)
    return CostModel(layout, ALGORITHMS, fidelity="analytic")


# ------------------------------------------------------------------- printing
def print_tables(out=sys.stdout) -> None:
    """Every table: per log, per source (sizes >= 1 MiB), per category, ring series."""
    print("\n== per log (sizes >= 1 MiB): median |busbw error| (* calibration log)", file=out)
    by_source: dict[str, list[Row]] = {}
    for log, found in compared():
        if found is None:
            print(f"  {log.label:<62} not simulated ({'no preset' if system_of(log) is None else 'CollNet/SHARP not modelled'})", file=out)
            continue
        big = [r for r in found if r.size_bytes >= MiB]
        by_source.setdefault(log.source, []).extend(big)
        if big:
            plans = sorted({r.plan for r in big})
            worst = max(big, key=lambda r: abs(r.error))
            mark = "*" if is_calibration(log) else " "
            print(f" {mark}{log.label:<62} {median_abs(r.error for r in big):6.1%}  worst "
                  f"{worst.error:+6.1%} @ {worst.size_bytes >> 20} MiB  {','.join(plans)}",
                  file=out)
    print("\n== per source (sizes >= 1 MiB; validation logs only)", file=out)
    for source, rows in by_source.items():
        rows = [r for r in rows if not is_calibration(r.log)]
        print(f"  {source:<42} rows {len(rows):4d}  median |err| "
              f"{median_abs(r.error for r in rows):6.1%}", file=out)
    calibration = calibration_rows()
    print("\n== calibration logs (sizes >= 1 MiB; fitted on, in no category)", file=out)
    for key, what in CALIBRATION_LOGS.items():
        rows = [r for r in calibration
                if (r.log.source, r.log.collective, r.log.nodes, r.log.gpus_per_node) == key]
        print(f"  {' '.join(map(str, key)):<52} rows {len(rows):4d}  median |err| "
              f"{median_abs(r.error for r in rows):6.1%}  ({what})", file=out)
    for protocol in PACING_PROTOCOLS:
        fitted, count = ring_step_pacing_fit(protocol)
        print(f"  ring_step_pacing_us.{protocol}: fitted {fitted} us on {count} rows", file=out)
    print("\n== categories", file=out)
    for category in ("sendrecv", "tree", "mid"):
        rows = category_rows(category)
        print(f"  {category:<10} rows {len(rows):4d}  median |err| "
              f"{median_abs(r.error for r in rows):6.1%}", file=out)
        sources: dict[str, list[Row]] = {}
        for r in rows:
            sources.setdefault(r.log.source, []).append(r)
        for source, srows in sources.items():
            print(f"      {source:<40} rows {len(srows):4d}  median |err| "
                  f"{median_abs(r.error for r in srows):6.1%}", file=out)
    print("\n== ring latency at scale: (measured - streamed) / modelled latency (1.0: NCCL's "
          "step model explains the time; * calibration log)", file=out)
    for r in ring_latency_rows():
        mark = "*" if is_calibration(r.log) else " "
        print(f" {mark}{r.log.label:<62} {r.size_bytes >> 20:4d} MiB {r.protocol:<6} "
              f"{r.steps:5d} steps  measured {r.measured_s * 1e6:7.0f} us  streamed "
              f"{r.stream_s * 1e6:6.0f}  modelled latency {r.latency_s * 1e6:6.0f}  "
              f"ratio {r.ratio:4.2f}", file=out)
    print("\n== ring vs node count (>= 256 MiB): nodes:measured/simulated; drop = "
          "busbw(most nodes)/busbw(fewest)", file=out)
    for s in ring_series():
        points = " ".join(f"{r.log.nodes}:{r.measured:.0f}/{r.simulated:.0f}"
                          for r in s.points)
        print(f"  {s.key:<58} drop {s.drop('measured'):.2f}/{s.drop('simulated'):.2f}  "
              f"median |err| {median_abs(r.error for r in s.points):5.1%}  {points}",
              file=out)


if __name__ == "__main__":
    if "--fit-ring-pacing" in sys.argv[1:]:
        for name in PACING_PROTOCOLS:
            value, used = ring_step_pacing_fit(name)
            print(f"comm.ring_step_pacing_us.{name} = {value}  (median of {used} calibration "
                  f"rows; stored in _defaults.toml: "
                  f"{load_cluster('dgx-h100').comm.ring_step_pacing_s.get(name, 0.0) * 1e6:g})")
    else:
        print_tables()
