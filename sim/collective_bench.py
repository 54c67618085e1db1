"""nccl-tests, simulated: time one collective over a sweep of sizes.

Columns and meanings follow nccl-tests (doc/PERFORMANCE.md) so a simulated
table can be laid beside a real log: ``size`` in bytes (the total for
all_gather and reduce_scatter), ``count`` in elements as nccl-tests prints it,
``time`` in microseconds, ``algbw = size / time`` and ``busbw = algbw x
factor`` in GB/s (1e9 bytes/s), with the factors

* all_reduce: 2(n-1)/n
* all_gather, reduce_scatter, alltoall: (n-1)/n
* broadcast, reduce, sendrecv: 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from hardware.catalog import cluster_to_dict
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from hardware.cost import CostModel
from sim.engine import Engine
from strategies.collectives.catalog import ALGORITHMS, valid_algorithms
from strategies.ir import COLLECTIVE_KINDS, CollectiveOp, Program

TYPE_BYTES = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4,
              "double": 8, "int64": 8}
_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum"}
_ROOTED = {"broadcast", "reduce"}
#: Collectives whose size must split evenly over the ranks (nccl-tests rounds down).
_PER_RANK_SPLIT = {"all_gather", "reduce_scatter", "alltoall"}


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests busbw / algbw factor of a collective over ``ranks`` ranks."""
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes min, min*factor, ... up to max, as nccl-tests' -b/-e/-f.

    Raises:
        ValueError: naming the field when the bounds or factor are invalid.
    """
    if min_bytes <= 0:
        raise ValueError(f"min-bytes: {min_bytes} is not valid; give a size > 0")
    if max_bytes < min_bytes:
        raise ValueError(
            f"max-bytes: {max_bytes} is below min-bytes {min_bytes}; give max >= min")
    if factor < 2:
        raise ValueError(f"step-factor: {factor} is not valid; give an integer >= 2")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True)
class SweepRow:
    """One line of the table."""

    size_bytes: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str


def _count(kind: str, size_bytes: int, ranks: int, type_bytes: int) -> int:
    elements = size_bytes // type_bytes
    return elements // ranks if kind in _PER_RANK_SPLIT else elements


def collective_sweep(kind: str, cluster: ClusterSpec, *, nodes: int, gpus_per_node: int,
                     sizes: Iterable[int], algorithm: str = "auto", fidelity: str = "analytic",
                     dtype: str = "float", on_row=None) -> pd.DataFrame:
    """Simulate one collective over every rank for each size, like nccl-tests.

    Args:
        kind: collective (:data:`strategies.ir.COLLECTIVE_KINDS`).
        cluster: preset.
        nodes, gpus_per_node: job shape.
        sizes: sizes in bytes (nccl-tests meaning); sizes that do not split
            over the ranks are rounded down as nccl-tests does, and skipped
            when that leaves nothing.
        algorithm: ``auto`` or an algorithm the collective accepts.
        fidelity: ``analytic`` or ``flow``.
        dtype: nccl-tests type name (float, half, bfloat16, ...).
        on_row: optional callback receiving each :class:`SweepRow` as it is
            computed (progress display, incremental output).

    Returns:
        DataFrame with columns size_bytes, count, type, redop, root, time_us,
        algbw_GBps, busbw_GBps, algorithm, protocol.

    Raises:
        ValueError: one line naming the field for an unknown op, algorithm,
            dtype or fidelity, a layout the cluster cannot hold, or sizes that all
            round down to nothing.
    """
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"op: {kind!r} is not valid; valid: {', '.join(COLLECTIVE_KINDS)}")
    if algorithm not in valid_algorithms(kind):
        raise ValueError(f"algorithm: {algorithm!r} is not available for {kind}; "
                         f"valid: {', '.join(valid_algorithms(kind))}")
    if dtype not in TYPE_BYTES:
        raise ValueError(f"type: {dtype!r} is not valid; valid: {', '.join(TYPE_BYTES)}")
    layout = ClusterLayout(cluster, nodes, gpus_per_node)
    cost = CostModel(layout, ALGORITHMS, fidelity=fidelity)
    ranks = layout.world_size
    group = tuple(range(ranks))
    type_bytes = TYPE_BYTES[dtype]
    sizes = list(sizes)
    smallest = type_bytes * (ranks if kind in _PER_RANK_SPLIT else 1)
    if sizes and max(sizes) < smallest:
        # Every size would round down to nothing: an empty table is no answer.
        raise ValueError(f"max-bytes: {max(sizes)} is too small for {kind} of {dtype} over "
                         f"{ranks} ranks; valid: at least {smallest} bytes (one element "
                         "per rank)")
    rows = []
    for requested in sizes:
        count = _count(kind, requested, ranks, type_bytes)
        size = count * type_bytes * (ranks if kind in _PER_RANK_SPLIT else 1)
        if count == 0:
            continue
        op = CollectiveOp(name=kind, key=f"{kind}:{size}", kind=kind, group=group,
                          size_bytes=size, algorithm=algorithm,
                          root=0 if kind in _ROOTED else None)
        # Every rank issues the same call: one representative stands for all of them
        # (DESIGN.md principle 5; Program.represents). The collective's plan already
        # holds every member's transfers, so each fidelity prices the same traffic as
        # the full program (tests/test_collective_bench.py compares both); the full
        # program cost O(ranks^2) in checks and lookups over a 16k-rank group.
        program = Program(ops_by_rank={0: (op,)}, world_size=ranks, name=kind,
                          represents={0: ranks})
        result = Engine(program, cost).run()
        time_s = result.makespan_ns / 1e9
        plan_label = result.plans.get(op.key, "-/-")
        algo_name, proto = plan_label.split("/")
        algbw = size / time_s / 1e9 if time_s > 0 else float("inf")
        row = SweepRow(size, count, dtype, _REDOP.get(kind, "none"),
                       0 if kind in _ROOTED else -1, time_s * 1e6, algbw,
                       algbw * bus_factor(kind, ranks), algo_name, proto)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    df = pd.DataFrame([r.__dict__ for r in rows], columns=list(SweepRow.__dataclass_fields__))
    # Principle 6: every result carries the resolved inputs that produced it.
    df.attrs["inputs"] = {"op": kind, "cluster": cluster.name, "nodes": nodes,
                          "gpus_per_node": gpus_per_node, "ranks": ranks, "algorithm": algorithm,
                          "fidelity": fidelity, "dtype": dtype,
                          "cluster_spec": cluster_to_dict(cluster)}
    return df
