"""Replay a Program on the hardware models inside one SimPy environment.

The :class:`Engine` owns all simulation state for one run (DESIGN.md
principle 5's "one Environment"); nothing is kept in module globals. Time is
integer nanoseconds.

Execution rules (strategies/ir.py): each (rank, stream) is one SimPy process
that walks its ops in order; an op also waits for its explicit ``deps``. A
collective starts when the last member of its group reaches it and ends for
all members at once; a send/recv pair starts when both sides have reached it.
A span's start is when its rank issued the op (so time spent waiting for
peers shows up in the span, as a CUDA-event measurement would show it).

Determinism: processes are created in (rank, stream) order and SimPy breaks
ties between events scheduled for the same instant in creation order, so a
run is identical for identical inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import Iterator, Mapping, Protocol

import simpy

from hardware.network import CommPlan, make_fabric
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.timeline import Timeline
from strategies.collectives.algorithms import point_to_point
from strategies.collectives.planner import CollectivePlanner
from strategies.perturbations import stretched_ns
from strategies.ir import CollectiveOp, ComputeOp, Op, Program, RecvOp, SendOp
from strategies.program_check import check_program


class ComputeTimer(Protocol):
    """Anything that prices a compute op (hardware.compute.ComputeModel)."""

    def duration_ns(self, op: ComputeOp) -> int: ...


@dataclass
class _Rendezvous:
    """Meeting point of the ranks taking part in one collective or send/recv."""

    expected: int
    arrived: int = 0
    done: simpy.Event | None = None
    started_ns: int = 0


@dataclass
class SimulationResult:
    """What a run produced.

    Attributes:
        timeline: one span per executed op.
        makespan_ns: end of the last op minus start of the first.
        fidelity: network fidelity used.
        plans: ``{collective key: "algorithm/protocol"}`` chosen per collective.
        stats: counters (ops, events, flow-rate solves).
        inputs: the resolved inputs (cluster, layout, fidelity), for provenance.
    """

    timeline: Timeline
    makespan_ns: int
    fidelity: str
    plans: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, object] = field(default_factory=dict)


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (each is processed
    once by ``run``): the work measure of the scale benchmarks."""

    def __init__(self) -> None:
        super().__init__()
        self.events_scheduled = 0

    def schedule(self, event, priority=simpy.core.NORMAL, delay=0) -> None:
        self.events_scheduled += 1
        super().schedule(event, priority, delay)


class Engine:
    """One simulation of one Program.

    Args:
        program: what every rank does.
        layout: where ranks sit on the cluster (its world size must cover the
            program's ranks).
        fidelity: network model: ``event`` (each collective costs its α-β
            closed form; ``analytic`` is accepted as the same) or ``flow``
            (max-min fair sharing of links among transfers in flight).
        compute: prices compute ops; required when the program has any.
        planner: collective planner to reuse (its plan cache) across runs on
            the same layout.
        check: validate the program first (:func:`strategies.program_check.check_program`).
        rank_speed: ``{rank: speed}`` of ranks whose kernels run at another
            speed (0.5 = a straggler at half speed: every compute op takes twice
            as long); others run at 1.
        rank_episodes: ``{rank: [(start_ns, end_ns, speed), ...]}`` throttling
            episodes (sorted, not overlapping): a compute op progresses at
            ``speed`` while it overlaps one (strategies.perturbations.stretched_ns).
        rank_compute: ``{rank: timer}`` of ranks whose GPU differs from the
            others' (mixed generations); others use ``compute``.

    Raises:
        ValueError: when the program does not fit the layout or the fidelity
            is unknown; ProgramError (a ValueError) for a malformed program.
    """

    def __init__(self, program: Program, layout: ClusterLayout, *, fidelity: str = "event",
                 compute: ComputeTimer | None = None,
                 planner: CollectivePlanner | None = None, check: bool = True,
                 rank_speed: Mapping[int, float] | None = None,
                 rank_episodes: Mapping[int, list[tuple[int, int, float]]] | None = None,
                 rank_compute: Mapping[int, ComputeTimer] | None = None) -> None:
        if program.world_size > layout.world_size:
            raise ValueError(
                f"world_size: the program has {program.world_size} ranks but the cluster "
                f"layout has {layout.world_size} GPUs; give more nodes or GPUs per node")
        if check:
            check_program(program, world_size=layout.world_size)
        self.program = program
        self.layout = layout
        self.env = CountingEnvironment()
        self.planner = planner or CollectivePlanner(layout, layout.spec.comm)
        self.fabric = make_fabric(fidelity, self.env, self.planner.model)
        self.fidelity = fidelity
        self.compute = compute
        self.timeline = Timeline()
        self._done: dict[int, dict[int, simpy.Event]] = {}
        self._meetings: dict[object, _Rendezvous] = {}
        self._chosen: dict[str, str] = {}
        self._present_cache: dict[tuple[int, ...], int] = {}
        self._referenced: dict[int, set[int]] = {}
        self._finished: dict[int, int] = {}
        self._durations: dict[tuple[int, float], int] = {}
        self._pair_plans: dict[tuple[int, int, int], tuple[CommPlan, ...]] = {}
        self._mirror_groups: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
        self._present_domains: set[int] | None = None
        self._speed = dict(rank_speed or {})
        self._episodes = {r: list(e) for r, e in (rank_episodes or {}).items() if e}
        self._rank_compute = dict(rank_compute or {})
        for rank, speed in self._speed.items():
            if not speed > 0:
                raise ValueError(f"rank_speed: rank {rank} has speed {speed!r}; give a speed > 0")

    # ------------------------------------------------------------------ running
    def run(self) -> SimulationResult:
        """Run to completion and return the result.

        Raises:
            RuntimeError: if some op never finished (a deadlock the program
                validator should have rejected).
        """
        for rank in self.program.ranks():
            ops = self.program.ops_by_rank[rank]
            referenced = {d for op in ops for d in op.deps}
            # Only ops that others wait for need an event; the rest are counted.
            self._done[rank] = {d: self.env.event() for d in sorted(referenced)}
            self._referenced[rank] = referenced
            self._finished[rank] = 0
            streams: dict[str, list[int]] = {}
            for index, op in enumerate(ops):
                streams.setdefault(op.stream, []).append(index)
            for stream in sorted(streams):
                self.env.process(self._stream(rank, stream, streams[stream]))
        self.env.run()
        unfinished = {r: len(self.program.ops_by_rank[r]) - n for r, n in self._finished.items()
                      if n < len(self.program.ops_by_rank[r])}
        if unfinished:
            rank = min(unfinished)
            index = self._finished[rank]
            raise RuntimeError(
                f"deadlock: {sum(unfinished.values())} ops never finished (first on rank "
                f"{rank}, after {index} finished ops); check the program with "
                "strategies.program_check")
        stats = {"ops": self.program.num_ops(), "spans": len(self.timeline),
                 "events": self.env.events_scheduled}
        network = getattr(self.fabric, "network", None)
        if network is not None:
            stats["flow_rate_solves"] = network.rate_solves
            stats["flows_completed"] = network.flows_completed
        return SimulationResult(
            timeline=self.timeline,
            makespan_ns=self.timeline.makespan_ns(),
            fidelity=self.fidelity,
            plans=dict(self._chosen),
            stats=stats,
            inputs={"cluster": self.layout.spec.name, "nodes": self.layout.nodes,
                    "gpus_per_node": self.layout.gpus_per_node, "fidelity": self.fidelity},
        )

    def _stream(self, rank: int, stream: str, indices: list[int]) -> Iterator[simpy.Event]:
        ops = self.program.ops_by_rank[rank]
        done = self._done[rank]
        referenced = self._referenced[rank]
        position = 0
        while position < len(indices):
            index = indices[position]
            op = ops[index]
            if op.deps:
                pending = [done[d] for d in op.deps if not done[d].triggered]
                if pending:
                    yield self.env.all_of(pending)
            duration = self._fixed_ns(op, rank, self.env.now)
            if duration is not None:
                # A run of ops whose durations are known in advance (compute; a
                # collective nobody else joins, at analytic fidelity) that
                # nothing else waits on in between costs one event: their spans
                # follow from their durations.
                begin = self.env.now
                spans = [(index, begin, begin + duration)]
                while index not in referenced and position + 1 < len(indices):
                    following = ops[indices[position + 1]]
                    if following.deps:
                        break
                    duration = self._fixed_ns(following, rank, spans[-1][2])
                    if duration is None:
                        break
                    position += 1
                    index = indices[position]
                    spans.append((index, spans[-1][2], spans[-1][2] + duration))
                yield self.env.timeout(spans[-1][2] - begin)
                for member, span_start, span_end in spans:
                    self._record(rank, ops[member], span_start, span_end)
                self._finished[rank] += len(spans)
            else:
                started = yield from self._execute(rank, op)
                self._record(rank, op, started, self.env.now)
                self._finished[rank] += 1
            if index in done:
                done[index].succeed()
            position += 1

    def _fixed_ns(self, op: Op, rank: int, start_ns: int) -> int | None:
        """Duration of an op starting at ``start_ns`` known before it runs, or None
        if it depends on others."""
        if isinstance(op, ComputeOp):
            duration = self._compute_ns(op, self._speed.get(rank, 1.0),
                                        self._rank_compute.get(rank))
            episodes = self._episodes.get(rank)
            return duration if episodes is None else stretched_ns(start_ns, duration, episodes)
        if (self.fidelity != "flow" and isinstance(op, CollectiveOp)
                and self._members_present(op) == 1):
            return self._collective_ns(op)
        return None

    def _collective_ns(self, op: CollectiveOp) -> int:
        """α-β duration of a collective, priced without building its transfers
        (CollectivePlanner.cost); its choice is recorded like a plan's."""
        cost = self.planner.cost(op.kind, op.group, op.size_bytes, op.algorithm)
        self._chosen[op.key] = f"{cost.algorithm}/{cost.protocol}"
        return cost.duration_ns

    def _compute_ns(self, op: ComputeOp, speed: float = 1.0,
                    timer: ComputeTimer | None = None) -> int:
        """Duration of a compute op on a rank of ``speed`` (and its own GPU's
        ``timer``), memoised per op object (a step repeats the same op objects
        thousands of times; the program keeps them alive, so ids are stable)."""
        key = (id(op), speed, id(timer))
        duration = self._durations.get(key)
        if duration is None:
            timer = timer or self.compute
            if timer is None:
                raise ValueError(f"compute: op {op.name!r} needs a compute model; "
                                 "pass compute=ComputeModel(gpu)")
            duration = timer.duration_ns(op)
            if speed != 1.0:
                duration = math.ceil(duration / speed)
            self._durations[key] = duration
        return duration

    def _execute(self, rank: int, op: Op):
        """Run one communication op; return when data began to move (the last
        participant arrived)."""
        if isinstance(op, CollectiveOp) and self.fidelity != "flow":
            duration = self._collective_ns(op)
            meeting = self._meet(op.key, self._members_present(op), lambda: duration,
                                 lambda plan: ())
        elif isinstance(op, CollectiveOp):
            if self._members_present(op) == 1:
                # Alone (a reduced program's representative): nobody to wait for.
                started = self.env.now
                plan = self._collective_plan(op)
                yield from self.fabric.run(plan, self._group_mirrors(op, plan))
                return started
            meeting = self._meet(op.key, self._members_present(op),
                                 lambda: self._collective_plan(op),
                                 lambda plan: self._group_mirrors(op, plan))
        elif isinstance(op, (SendOp, RecvOp)):
            src, dst = (rank, op.peer) if isinstance(op, SendOp) else (op.peer, rank)
            meeting = self._meet(("p2p", src, dst, op.tag), 2,
                                 lambda: point_to_point(self.layout, src, dst, op.size_bytes),
                                 lambda plan: self._pair_mirrors(src, dst, op.size_bytes))
        else:
            raise TypeError(f"op: {type(op).__name__} is not a Program op")
        yield meeting.done
        return meeting.started_ns

    def _group_mirrors(self, op: CollectiveOp, plan: CommPlan) -> tuple[CommPlan, ...]:
        """At flow fidelity, the same collective of the groups a reduced program
        leaves out (Program.mirrors), with this plan's algorithm and protocol."""
        mirrors = self.program.mirrors
        if self.fidelity != "flow" or mirrors is None:
            return ()
        found = self._mirror_groups.get(op.group)
        if found is None:
            found = tuple(g for g in mirrors.groups.get(op.group, ()) if self._may_contend(g))
            self._mirror_groups[op.group] = found
        return tuple(self.planner.plan(op.kind, group, op.size_bytes, plan.label, plan.protocol)
                     for group in found)

    def _may_contend(self, group: tuple[int, ...]) -> bool:
        """A mirror group inside one scale-up domain that holds no simulated rank
        loads only that domain's links, which no simulated flow crosses: skipping
        it changes no rate (a mirror of a cross-domain transfer routed through the
        domain's scale-up links, PXN, would; the tests pin the cases that agree)."""
        if self._present_domains is None:
            self._present_domains = {self.layout.domain_of(r) for r in self.program.ops_by_rank}
        domains = {self.layout.domain_of(r) for r in group}
        return len(domains) > 1 or not domains.isdisjoint(self._present_domains)

    def _pair_mirrors(self, src: int, dst: int, size_bytes: int) -> tuple[CommPlan, ...]:
        """At flow fidelity, the same pipeline transfer between the ranks a reduced
        program leaves out."""
        mirrors = self.program.mirrors
        if self.fidelity != "flow" or mirrors is None:
            return ()
        key = (src, dst, size_bytes)
        found = self._pair_plans.get(key)
        if found is None:
            found = tuple(point_to_point(self.layout, a, b, size_bytes)
                          for a, b in mirrors.pairs.get((src, dst), ()))
            self._pair_plans[key] = found
        return found

    def _members_present(self, op: CollectiveOp) -> int:
        """Members a collective waits for: all of them, or in a symmetry-reduced
        program only those listed (the others mirror their representative)."""
        if self.program.represents is None:
            return len(op.group)
        present = self._present_cache.get(op.group)
        if present is None:
            present = sum(1 for r in op.group if r in self.program.ops_by_rank)
            self._present_cache[op.group] = present
        return present

    def _collective_plan(self, op: CollectiveOp) -> CommPlan:
        plan = self.planner.plan(op.kind, op.group, op.size_bytes, op.algorithm)
        self._chosen[op.key] = f"{plan.label}/{plan.protocol}"
        return plan

    def _meet(self, key: object, expected: int, make_plan, make_mirrors) -> _Rendezvous:
        """Arrive at a rendezvous; the last to arrive starts the communication
        (with the mirrors of ``make_mirrors(plan)``)."""
        meeting = self._meetings.get(key)
        if meeting is None:
            meeting = _Rendezvous(expected, 0, self.env.event())
            self._meetings[key] = meeting
        meeting.arrived += 1
        if meeting.arrived == meeting.expected:
            del self._meetings[key]
            meeting.started_ns = self.env.now
            plan = make_plan()
            self.env.process(self._communicate(plan, make_mirrors(plan), meeting.done))
        return meeting

    def _communicate(self, plan: CommPlan | int, mirrors: tuple[CommPlan, ...],
                     done: simpy.Event) -> Iterator[simpy.Event]:
        """Run a plan on the fabric, or wait a duration already priced (ns)."""
        if isinstance(plan, int):
            yield self.env.timeout(plan)
        else:
            yield from self.fabric.run(plan, mirrors)
        done.succeed()

    def _record(self, rank: int, op: Op, start_ns: int, end_ns: int) -> None:
        if isinstance(op, ComputeOp):
            self.timeline.record(rank, op.stream, op.name, op.kind, start_ns, end_ns,
                                 op.bytes, op.flops, "compute")
        elif isinstance(op, CollectiveOp):
            self.timeline.record(rank, op.stream, op.name, op.kind, start_ns, end_ns,
                                 op.size_bytes, 0.0, "comm")
        else:
            kind = "send" if isinstance(op, SendOp) else "recv"
            self.timeline.record(rank, op.stream, op.name, kind, start_ns, end_ns,
                                 op.size_bytes, 0.0, "comm")


def simulate(program: Program, cluster: ClusterSpec, *, nodes: int, gpus_per_node: int,
             fidelity: str = "analytic", compute: ComputeTimer | None = None) -> SimulationResult:
    """Place ``program`` on ``nodes x gpus_per_node`` GPUs of ``cluster`` and run it.

    Raises:
        ValueError: for a layout the cluster cannot hold, an unknown fidelity,
            or a program that does not fit.
    """
    layout = ClusterLayout(cluster, nodes, gpus_per_node)
    return Engine(program, layout, fidelity=fidelity, compute=compute).run()
