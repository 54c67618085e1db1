"""Read a replay's measurements and put them beside the Program that produced them.

The same functions interpret a simulated timeline, so measured and simulated numbers
are derived identically:

* :func:`op_intervals` -- ``{(rank, op index): (start_ns, end_ns)}``;
* :func:`comm_durations` -- each collective / send-recv pair's *data-movement* time,
  from the last participant's arrival to the participants' (mean) end: a measured
  span starts when its rank reached the op and so includes waiting for peers, while
  the simulator starts moving data when the last member arrives (sim/engine.py);
* :func:`step_time_ns` -- the step's makespan over every rank.

No torch here: calibration and comparison run anywhere.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp
from validate.program_io import load_program
from validate.store import MeasurementStore, check_fields

#: An iteration slower than this multiple of the median step is an outlier.
OUTLIER_FACTOR = 1.5

Intervals = Mapping[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class CommInstance:
    """One collective call or send/recv pair as it ran.

    Attributes:
        kind: collective kind, or ``p2p`` for a send/recv pair.
        ranks: participants (communicator order; (src, dst) for p2p).
        size_bytes: nccl-tests size (message size for p2p).
        duration_ns: last arrival to the participants' mean end.
        members: the ``(rank, op index)`` of every participant's op.
    """

    kind: str
    ranks: tuple[int, ...]
    size_bytes: int
    duration_ns: int
    members: tuple[tuple[int, int], ...]


@dataclass
class Measurements:
    """A replay directory, read.

    Attributes:
        program: the replayed Program.
        iterations: per measured iteration present on every rank, its intervals.
        env: ``{rank: environment}``.
        run: the run description (``run.json``), if any.
    """

    program: Program
    iterations: list[dict[tuple[int, int], tuple[int, int]]]
    env: dict[int, dict] = field(default_factory=dict)
    run: dict | None = None

    def kept(self) -> list[dict[tuple[int, int], tuple[int, int]]]:
        """The iterations used for statistics: those whose step time is at most
        :data:`OUTLIER_FACTOR` x the median (an iteration the OS disturbed, e.g. a rank
        descheduled for 100+ ms on a shared CPU host, is left out of every statistic
        alike)."""
        steps = [step_time_ns(it) for it in self.iterations]
        limit = OUTLIER_FACTOR * statistics.median(steps)
        return [it for it, step in zip(self.iterations, steps) if step <= limit]

    def mean_durations_ns(self) -> dict[tuple[int, int], float]:
        """Mean over the kept iterations of each op's duration (the mean, not the median:
        a step adds durations up, so occasional slow runs of an op are part of its cost)."""
        kept = self.kept()
        return {key: statistics.fmean(it[key][1] - it[key][0] for it in kept)
                for key in kept[0]}

    def mean_occupancy_ns(self) -> dict[tuple[int, int], float]:
        """Mean over the kept iterations of the time each compute op holds its stream:
        its duration plus the dispatch gap before it (from the end of the previous op of
        the stream, unless the op waited for a communication dep) -- what the
        simulator's compute model prices as kernel time + launch overhead."""
        kept = self.kept()
        out = {}
        for rank in self.program.ranks():
            ops = self.program.ops_by_rank[rank]
            previous: dict[str, int] = {}
            for index, op in enumerate(ops):
                before = previous.get(op.stream)
                previous[op.stream] = index
                if not isinstance(op, ComputeOp):
                    continue
                waited = any(not isinstance(ops[d], ComputeOp) for d in op.deps)
                total = 0.0
                for it in kept:
                    start, end = it[(rank, index)]
                    gap = 0 if before is None or waited else max(0, start - it[(rank, before)][1])
                    total += end - start + gap
                out[(rank, index)] = total / len(kept)
        return out

    def step_times_ns(self) -> list[int]:
        """Makespan of every measured iteration (kept or not)."""
        return [step_time_ns(it) for it in self.iterations]

    def step_time_ns(self) -> float:
        """Mean makespan over the kept iterations."""
        return statistics.fmean(step_time_ns(it) for it in self.kept())

    def comm_instances(self) -> list[CommInstance]:
        """Communication instances with their mean data-movement time over the kept
        iterations."""
        per_iteration = [comm_durations(self.program, it) for it in self.kept()]
        out = []
        for position, first in enumerate(per_iteration[0]):
            durations = [inst[position].duration_ns for inst in per_iteration]
            out.append(CommInstance(first.kind, first.ranks, first.size_bytes,
                                    int(statistics.fmean(durations)), first.members))
        return out

    def hosts(self) -> list[str]:
        """Distinct host names of the ranks, in rank order of first appearance."""
        seen: list[str] = []
        for rank in sorted(self.env):
            host = self.env[rank].get("hostname")
            if host and host not in seen:
                seen.append(host)
        return seen


def load_measurements(directory: str | Path) -> Measurements:
    """Read a replay directory.

    Only iterations that every rank of the Program finished are used (a killed run
    leaves some ranks one iteration ahead).

    Raises:
        ValueError: the directory has no program or no complete iteration (one line).
    """
    store = MeasurementStore(directory)
    if not (store.root / "program.json").exists():
        raise ValueError(f"measurements: {str(store.root)!r} has no program.json; give a "
                         "directory written by trainsim validate replay")
    program = load_program(store.root / "program.json")
    series = store.read_series("replay")
    ranks = program.ranks()
    missing = [r for r in ranks if r not in series]
    if missing:
        raise ValueError(f"measurements: {str(store.root)!r} has no replay iteration of rank "
                         f"{missing[0]}; run (or resume) trainsim validate replay")
    common = set.intersection(*({rec["iteration"] for rec in series[r]} for r in ranks))
    if not common:
        raise ValueError(f"measurements: {str(store.root)!r} has no iteration finished by "
                         "every rank; resume the replay")
    iterations = []
    for number in sorted(common):
        intervals = {}
        for rank in ranks:
            record = next(rec for rec in series[rank] if rec["iteration"] == number)
            intervals.update(_spans(record, rank, number, len(program.ops_by_rank[rank]),
                                    store.root))
        iterations.append(intervals)
    env = {r: store.read_meta("env", rank=r) or {} for r in ranks}
    return Measurements(program, iterations, env, store.read_meta("run"))


#: The fields of a span record (validate.worker writes them) and what each must be.
SPAN_FIELDS = {"index": "index", "start_ns": "index", "end_ns": "index"}


def _spans(record: dict, rank: int, iteration: int, ops: int,
           root: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(rank, index): (start_ns, end_ns)}`` of one iteration record, checked: every op
    of the rank exactly once, integer times, no span ending before it starts.

    Raises:
        ValueError: one line naming the record, the span and the field.
    """
    where = f"measurements: {str(root)!r}: rank {rank} iteration {iteration}"
    out = {}
    for position, span in enumerate(record["spans"]):
        at = f"{where}: spans[{position}]"
        if not isinstance(span, dict):
            raise ValueError(f"{at}: {span!r:.60} is not a span object")
        check_fields(span, SPAN_FIELDS, at)
        if span["index"] >= ops:
            raise ValueError(f"{at}: index: {span['index']} is not an op of rank {rank}; "
                             f"valid: 0..{ops - 1}")
        if span["end_ns"] < span["start_ns"]:
            raise ValueError(f"{at}: end_ns: {span['end_ns']} is before start_ns "
                             f"{span['start_ns']}; a span ends after it starts")
        out[(rank, span["index"])] = (span["start_ns"], span["end_ns"])
    if len(out) != ops:
        missing = next(i for i in range(ops) if (rank, i) not in out)
        raise ValueError(f"{where}: op {missing} has no span ({len(out)} of {ops} ops timed); "
                         "resume the replay or give a complete run")
    return out


def measured_timeline(program: Program, intervals: Intervals):
    """A :class:`sim.timeline.Timeline` of one measured iteration (for Perfetto traces
    beside the simulated one); spans carry their op's index like the engine's."""
    from sim.timeline import Timeline, record_op

    timeline = Timeline()
    for rank in program.ranks():
        for index, op in enumerate(program.ops_by_rank[rank]):
            start, end = intervals[(rank, index)]
            record_op(timeline, rank, index, op, start, end)
    return timeline


def step_time_ns(intervals: Intervals) -> int:
    """Makespan: last end minus first start over every rank and op."""
    starts = [s for s, _ in intervals.values()]
    ends = [e for _, e in intervals.values()]
    return max(ends) - min(starts) if starts else 0


def timeline_intervals(program: Program, timeline) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(rank, op index): (start, end)}`` of a simulated :class:`sim.timeline.Timeline`,
    joined by each span's ``op_id``.

    Raises:
        ValueError: when a rank's spans and ops do not correspond one to one.
    """
    out = {}
    for span in timeline.spans():
        out[(span.rank, span.op_id)] = (span.start_ns, span.end_ns)
    for rank in program.ranks():
        count = len(program.ops_by_rank[rank])
        found = sum(1 for index in range(count) if (rank, index) in out)
        if found != count:
            raise ValueError(f"timeline: rank {rank} has spans for {found} of its {count} ops")
    return out


def comm_durations(program: Program, intervals: Intervals) -> list[CommInstance]:
    """Every communication instance of ``program`` with its data-movement time under
    ``intervals``, in a deterministic order (first member's rank and index)."""
    collectives: dict[str, list[tuple[int, int]]] = {}
    sends: dict[tuple[int, int, str], tuple[int, int]] = {}
    recvs: dict[tuple[int, int, str], tuple[int, int]] = {}
    ops_of = program.ops_by_rank
    for rank in program.ranks():
        for index, op in enumerate(ops_of[rank]):
            if isinstance(op, CollectiveOp):
                collectives.setdefault(op.key, []).append((rank, index))
            elif isinstance(op, SendOp):
                sends[(rank, op.peer, op.tag)] = (rank, index)
            elif isinstance(op, RecvOp):
                recvs[(op.peer, rank, op.tag)] = (rank, index)
    out = []
    for members in collectives.values():
        op = ops_of[members[0][0]][members[0][1]]
        starts = [intervals[m][0] for m in members]
        ends = [intervals[m][1] for m in members]
        duration = max(0, int(sum(ends) / len(ends)) - max(starts))
        out.append(CommInstance(op.kind, tuple(op.group), int(op.size_bytes), duration,
                                tuple(members)))
    for key, send in sends.items():
        recv = recvs.get(key)
        if recv is None:
            continue
        op = ops_of[send[0]][send[1]]
        start = max(intervals[send][0], intervals[recv][0])
        out.append(CommInstance("p2p", (key[0], key[1]), int(op.size_bytes),
                                max(0, intervals[recv][1] - start), (send, recv)))
    out.sort(key=lambda inst: inst.members[0])
    return out


def compute_ops(program: Program):
    """``(rank, index, op)`` of every compute op."""
    for rank in program.ranks():
        for index, op in enumerate(program.ops_by_rank[rank]):
            if isinstance(op, ComputeOp):
                yield rank, index, op
