"""The collectives a training step issues, and their busbw on the job's own ranks.

:func:`step_collectives` lists every distinct kind of communication of a step's Program
(per parallel axis, collective and group shape: how many nodes, how many GPUs on each),
with the message sizes it uses and how often. :func:`busbw_curves` prices each one
nccl-tests style over a sweep of sizes, on the very ranks of one of its groups in the
job's layout (so a DP group strided across nodes crosses the NICs as it does in the
step), and at the sizes the step uses.

Times come from the hardware cost model at ``analytic`` (α-β) fidelity; busbw uses
nccl-tests' factors (:func:`sim.collective_bench.bus_factor`), GB/s = 1e9 B/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd

from hardware.cost import CostModel
from hardware.spec import ClusterSpec
from sim.collective_bench import bus_factor
from sim.engine import Engine
from sim.step import job_layout
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp, Program, SendOp

__all__ = ["UsedCollective", "busbw_curves", "group_busbw", "step_collectives"]

#: Sweep bounds of a curve: from 1 KiB to at least 1 GiB (and twice the largest size
#: the step uses), in powers of two as nccl-tests sweeps.
CURVE_MIN_BYTES = 2**10
CURVE_MIN_MAX_BYTES = 2**30


@dataclass(frozen=True)
class UsedCollective:
    """One kind of communication of a step.

    Attributes:
        axis: the parallelism it serves (tp, cp, ep, pp, dp) or "" outside one.
        kind: nccl-tests name (all_reduce, all_gather, ..., sendrecv for pipeline edges).
        group: global ranks of one of its groups (the one the curve is priced on).
        nodes: nodes that group spans.
        gpus_per_node: ranks of the group on each of those nodes.
        sizes_bytes: distinct message sizes the step uses (nccl-tests meaning), ascending.
        calls: calls per step on the simulated rank that issues the most.
    """

    axis: str
    kind: str
    group: tuple[int, ...]
    nodes: int
    gpus_per_node: int
    sizes_bytes: tuple[int, ...]
    calls: int

    @property
    def label(self) -> str:
        """``"DP reduce_scatter, 32 ranks (32 nodes × 1)"``."""
        axis = f"{self.axis.upper()} " if self.axis else ""
        return (f"{axis}{self.kind}, {len(self.group)} ranks ({self.nodes} node"
                f"{'s' if self.nodes > 1 else ''} × {self.gpus_per_node})")


def step_collectives(program: Program, gpus_per_node: int) -> list[UsedCollective]:
    """Every distinct (axis, collective, group shape) of a step's Program, ordered by
    axis then collective. Pipeline send/recv pairs count as ``sendrecv`` over 2 ranks."""
    found: dict[tuple, dict] = {}
    for rank, ops in program.ops_by_rank.items():
        calls: dict[tuple, int] = {}
        for op in ops:
            if isinstance(op, CollectiveOp):
                kind, group, axis = op.kind, tuple(op.group), op.axis
            elif isinstance(op, SendOp):
                kind, group, axis = "sendrecv", (rank, op.peer), op.axis
            else:
                continue  # compute, and the receiving half of a send
            if len(group) < 2:
                continue
            nodes = len({r // gpus_per_node for r in group})
            key = (axis, kind, nodes, len(group) // nodes)
            entry = found.setdefault(key, {"group": group, "sizes": set(), "calls": 0})
            entry["sizes"].add(int(op.size_bytes))
            calls[key] = calls.get(key, 0) + 1
        for key, count in calls.items():
            found[key]["calls"] = max(found[key]["calls"], count)
    order = ("tp", "cp", "ep", "pp", "dp")
    return [UsedCollective(axis=axis, kind=kind, group=entry["group"], nodes=nodes,
                           gpus_per_node=per_node, sizes_bytes=tuple(sorted(entry["sizes"])),
                           calls=entry["calls"])
            for (axis, kind, nodes, per_node), entry in sorted(
                found.items(), key=lambda item: (order.index(item[0][0])
                                                 if item[0][0] in order else len(order),
                                                 item[0][1], item[0][2]))]


def group_busbw(kind: str, group: Sequence[int], cost: CostModel, world_size: int,
                sizes_bytes: Iterable[int]) -> pd.DataFrame:
    """nccl-tests columns for ``kind`` over exactly ``group`` of a job, one row per size.

    Returns:
        DataFrame with size_bytes, time_us, algbw_GBps, busbw_GBps, algorithm, protocol
        (the algorithm and protocol the cost model picks, NCCL-style).
    """
    group = tuple(group)
    rows = []
    for size in sizes_bytes:
        if kind == "sendrecv":
            op = CollectiveOp(name=kind, key=f"{kind}:{size}", kind=kind, group=group,
                              size_bytes=int(size))
        else:
            op = CollectiveOp(name=kind, key=f"{kind}:{size}", kind=kind, group=group,
                              size_bytes=int(size), root=group[0] if kind in
                              ("broadcast", "reduce") else None)
        program = Program(ops_by_rank={r: (op,) for r in group}, world_size=world_size,
                          name=kind)
        result = Engine(program, cost).run()
        time_s = result.makespan_ns / 1e9
        algorithm, protocol = result.plans.get(op.key, "-/-").split("/")
        algbw = size / time_s / 1e9 if time_s > 0 else float("inf")
        rows.append({"size_bytes": int(size), "time_us": time_s * 1e6,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(kind, len(group)),
                     "algorithm": algorithm, "protocol": protocol})
    return pd.DataFrame(rows)


def busbw_curves(used: Sequence[UsedCollective], cluster: ClusterSpec, gpus: int
                 ) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """busbw of every used collective on the job's layout (``gpus`` ranks of the
    program, servers of a parameter-server job included; rounded up to whole nodes).

    Returns:
        ``({label: sweep frame}, points)``: a sweep from :data:`CURVE_MIN_BYTES` in
        powers of two per collective, and a frame of the sizes the step uses (columns
        of :func:`group_busbw` plus ``label``, the collective's label).
    """
    per_node = cluster.gpus_per_node
    layout = job_layout(cluster, gpus if gpus <= per_node else -(-gpus // per_node) * per_node)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    curves, points = {}, []
    for item in used:
        top = max(CURVE_MIN_MAX_BYTES, 2 * max(item.sizes_bytes))
        sizes, size = [], CURVE_MIN_BYTES
        while size <= top:
            sizes.append(size)
            size *= 2
        curves[item.label] = group_busbw(item.kind, item.group, cost, layout.world_size,
                                         sizes)
        at = group_busbw(item.kind, item.group, cost, layout.world_size, item.sizes_bytes)
        points.append(at.assign(label=item.label))
    return curves, (pd.concat(points, ignore_index=True) if points else pd.DataFrame())
