"""Where a rank's time goes: compute, optimizer, exposed communication per axis, bubble.

Attribution order (so nothing is counted twice): compute kernels, the
optimizer, then the communication of each axis in :data:`AXES_IN_ORDER`
counted only where nothing attributed before it runs; the rest of the step is
the bubble (idle time). A communication span's axis is the one its op carries
(``strategies.ir.CollectiveOp.axis``, ``RecvOp.axis``). A rank's own pipeline sends
are left out: they run on their stream while its compute moves on, so idle time beside
them is waiting for something else (the closed form counts a transfer as exposed only
on the rank that waits for it, :func:`strategies.pipeline.replay_timing`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.timeline import Timeline
from strategies.ir import AXES

AXES_IN_ORDER = AXES


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [start, end) as disjoint sorted intervals."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    opens = np.empty(starts.size, dtype=bool)
    opens[0] = True
    opens[1:] = starts[1:] > reach[:-1]
    firsts = np.flatnonzero(opens)
    return starts[firsts], np.maximum.reduceat(ends, firsts)


def _length(intervals: tuple[np.ndarray, np.ndarray]) -> int:
    return int((intervals[1] - intervals[0]).sum())


def _join(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    return _merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def rank_breakdowns(timeline: Timeline, ranks: Sequence[int], step_ns: int
                ) -> dict[int, dict[str, float]]:
    """Seconds of compute, optimizer, exposed comm per axis and bubble, per rank.

    Exposed time of an axis = |covered U axis| - |covered|, where covered is
    compute, optimizer and the axes attributed before it (AXES_IN_ORDER).
    """
    # columns once, spans grouped by rank once (the breakdown does not depend on the
    # spans' order: _merge sorts)
    cols = timeline.columns("rank", "start_ns", "end_ns", "category", "kind", "axis")
    order = np.argsort(cols["rank"], kind="stable")
    by_rank = {k: v[order] for k, v in cols.items()}
    ranks_sorted = by_rank["rank"]
    is_compute_all = by_rank["category"] == "compute"
    is_opt_all = (by_rank["kind"] == "optimizer") & is_compute_all
    is_send_all = by_rank["kind"] == "send"
    result = {}
    for rank in ranks:
        lo, hi = np.searchsorted(ranks_sorted, [rank, rank + 1])
        starts = by_rank["start_ns"][lo:hi]
        ends = by_rank["end_ns"][lo:hi]
        is_opt = is_opt_all[lo:hi]
        is_compute = is_compute_all[lo:hi] & ~is_opt
        compute = _merge(starts[is_compute], ends[is_compute])
        covered = _join(compute, _merge(starts[is_opt], ends[is_opt]))
        row = {"compute": _length(compute) / 1e9,
               "optimizer": (_length(covered) - _length(compute)) / 1e9}
        # a rank's own pipeline sends run on their stream while its compute moves on:
        # only what it waits for (receives, collectives) can hold its compute up
        waited = ~is_compute_all[lo:hi] & ~is_send_all[lo:hi]
        rank_axis = by_rank["axis"][lo:hi]
        for name in AXES_IN_ORDER:
            chosen = waited & (rank_axis == name)
            joined = _join(covered, _merge(starts[chosen], ends[chosen]))
            row[f"exposed_{name}"] = (_length(joined) - _length(covered)) / 1e9
            covered = joined
        row["bubble"] = max(step_ns - _length(covered), 0) / 1e9
        result[rank] = row
    return result


#: Busy times closer than this fraction of the step are one tie (the closed-form and
#: replayed models attribute a few microseconds differently).
CRITICAL_TIE_FRACTION = 0.005


def critical_rank(breakdowns: dict[int, dict[str, float]], step_s: float) -> int:
    """The rank that sets the step's pace: the busiest one (compute, optimizer and
    exposed communication; the least bubble), as a key of ``breakdowns``. Busy times
    within :data:`CRITICAL_TIE_FRACTION` of the step tie; a tie goes to the rank that
    computes longest (a straggler, a pipeline stage with more or heavier layers), then
    to the lowest rank.

    Raises:
        ValueError: for no breakdowns.
    """
    if not breakdowns:
        raise ValueError("breakdowns: empty; give at least one rank's breakdown")
    busy = {r: sum(v for k, v in row.items() if k != "bubble") for r, row in breakdowns.items()}
    top = max(busy.values())
    tied = [r for r, b in busy.items() if top - b <= CRITICAL_TIE_FRACTION * step_s]
    return max(tied, key=lambda r: (breakdowns[r]["compute"] + breakdowns[r]["optimizer"], -r))
