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

The host: when a rank's ops carry CPU costs (``host_launches``, ``host_calls``,
``host_modules``, ``host_sync``), one more process per rank stands for its launching
CPU thread: it issues the ops in program order, each after its host time, and waits
after a ``host_sync`` op until that op has ended; an op starts no earlier than its
issue.

SM contention (``comm_contention``, the plan's ``comm_sm_contention`` and
``nccl_max_ctas``): from the moment a collective or send/recv starts moving data
until it ends, its NCCL kernel holds CTAs (SMs) on every present member
(:meth:`hardware.cost.CostModel.collective_ctas`); a compute kernel running on that
rank meanwhile progresses on the SMs left (:func:`hardware.cost.shared_sm_ns`, a
deterministic processor-sharing stretch of the overlapped part). A communication
op's end is known when it starts (closed form; at ``flow`` fidelity its closed-form
duration stands in for the flows' end, an approximation), so a compute op's end is
computed from the intervals known at its start and recomputed when it is due: a
collective that started meanwhile moves it later. No communication op is then run
ahead of time in a stream's run of known durations.

Determinism: processes are created in (rank, stream) order and SimPy breaks
ties between events scheduled for the same instant in creation order, so a
run is identical for identical inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappush
from typing import Iterator

import simpy

from hardware.cost import CostModel, shared_sm_ns
from hardware.spec import ClusterSpec
from hardware.topology import ClusterLayout
from sim.timeline import Timeline, record_op
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp, ComputeOp, Op, Program, RecvOp, SendOp
from strategies.program_check import check_program


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
        plan_counts: ``{"axis:kind:algorithm/protocol": collectives}`` over the run.
        stats: counters (ops, events, flow-rate solves).
        inputs: the resolved inputs (cluster, layout, fidelity), for provenance.
    """

    timeline: Timeline
    makespan_ns: int
    fidelity: str
    plans: dict[str, str] = field(default_factory=dict)
    plan_counts: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, object] = field(default_factory=dict)


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (each is processed
    once by ``run``): the work measure of the scale benchmarks."""

    def __init__(self) -> None:
        super().__init__()
        self.events_scheduled = 0
        # (schedule below writes simpy 4's event queue itself)
        if not (isinstance(getattr(self, "_queue", None), list) and hasattr(self, "_eid")):
            raise RuntimeError("simpy: Environment has no _queue/_eid (simpy 4 expected)")

    def schedule(self, event, priority=simpy.core.NORMAL, delay=0) -> None:
        """Count the event, then queue it as ``simpy.Environment.schedule`` does (its
        body inlined, simpy 4 core.py: one call less on every event of a step)."""
        self.events_scheduled += 1
        heappush(self._queue, (self._now + delay, priority, next(self._eid), event))


class Engine:
    """One simulation of one Program.

    Args:
        program: what every rank does.
        cost: the cost model (hardware.cost.CostModel) every duration comes from:
            compute (with per-rank speeds, throttling and GPU generations),
            collectives and point-to-point transfers, at its fidelity; its layout
            must hold the program's ranks.
        check: validate the program first (:func:`strategies.program_check.check_program`).
        comm_contention: None: overlapped communication takes no SMs from compute;
            else the most CTAs an NCCL kernel holds (0: NCCL's default, one per channel;
            module docstring).

    Raises:
        ValueError: when the program does not fit the layout; ProgramError (a
            ValueError) for a malformed program.
    """

    def __init__(self, program: Program, cost: CostModel, *, check: bool = True,
                 comm_contention: int | None = None) -> None:
        layout = cost.layout
        if program.world_size > layout.world_size:
            raise ValueError(
                f"world_size: the program has {program.world_size} ranks but the cluster "
                f"layout has {layout.world_size} GPUs; give more nodes or GPUs per node")
        if check:
            check_program(program, world_size=layout.world_size)
        self.program = program
        self.cost = cost
        self.layout = layout
        self.env = CountingEnvironment()
        self.fabric = cost.fabric(self.env, present_ranks=program.ranks())
        self.timeline = Timeline()
        self._done: dict[int, dict[int, simpy.Event]] = {}
        self._meetings: dict[object, _Rendezvous] = {}
        self._chosen: dict[str, str] = {}
        self._chosen_axis: dict[str, str] = {}
        self._present_cache: dict[tuple[int, ...], int] = {}
        self._referenced: dict[int, set[int]] = {}
        self._finished: dict[int, int] = {}
        self._durations: dict[tuple[int, int | None], int] = {}
        self._throttled = {r for r, c in cost.ranks.items() if c.episodes}
        self._mirror_groups: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
        self._issued: dict[int, list[simpy.Event]] = {}
        self._complete: dict[int, set[int]] = {}
        sms = layout.spec.gpu.sm_count
        #: SM contention: the most CTAs per NCCL kernel (0: NCCL's), None when off
        self._max_ctas = comm_contention if sms > 0 else None
        self._sms = sms
        #: per rank: (begin_ns, end_ns, ctas) of communication holding SMs
        self._busy: dict[int, list[tuple[int, int, int]]] = {}
        #: (rank, stream) -> start of the compute run it is timing (re-timed from there)
        self._running: dict[tuple[int, str], int] = {}

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
            # Only ops that others wait for are tracked, and an event is made only
            # when one waits for an op not yet finished (_wait_for); the rest are counted.
            self._done[rank] = {}
            self._complete[rank] = set()
            self._referenced[rank] = referenced
            self._finished[rank] = 0
            streams: dict[str, list[int]] = {}
            for index, op in enumerate(ops):
                streams.setdefault(op.stream, []).append(index)
            if any(getattr(op, "host_launches", 0) or getattr(op, "host_calls", 0)
                   or getattr(op, "host_modules", 0) or getattr(op, "host_sync", False)
                   for op in ops):
                # the rank's CPU thread issues its ops in program order (module docstring)
                syncs = {i for i, op in enumerate(ops) if getattr(op, "host_sync", False)}
                self._referenced[rank] = referenced | syncs
                self._issued[rank] = [self.env.event() for _ in ops]
                self.env.process(self._host(rank))
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
                 "events": self.env.events_scheduled, **self.fabric.stats()}
        return SimulationResult(
            timeline=self.timeline,
            makespan_ns=self.timeline.makespan_ns(),
            fidelity=self.cost.fidelity,
            plans=dict(self._chosen),
            plan_counts=self._plan_counts(),
            stats=stats,
            inputs={"cluster": self.layout.spec.name, "nodes": self.layout.nodes,
                    "gpus_per_node": self.layout.gpus_per_node,
                    "fidelity": self.cost.fidelity},
        )

    def _plan_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for key, label in self._chosen.items():
            name = f"{self._chosen_axis[key]}:{label}"
            counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))

    def _host(self, rank: int) -> Iterator[simpy.Event]:
        """The rank's CPU thread: issues every op in program order, spending
        :meth:`hardware.cost.CostModel.host_ns` on each, and after a ``host_sync`` op
        waits until it has ended on the GPU (PyTorch's launch queue is otherwise
        unbounded: the CPU runs ahead of the GPU)."""
        ops = self.program.ops_by_rank[rank]
        issued = self._issued[rank]
        complete = self._complete[rank]
        for index, op in enumerate(ops):
            host_ns = self.cost.host_ns(op)
            if host_ns:
                yield self.env.timeout(host_ns)
            issued[index].succeed()
            if getattr(op, "host_sync", False) and index not in complete:
                yield self._wait_for(rank, index)

    def _wait_for(self, rank: int, index: int) -> simpy.Event:
        """The event that fires when op ``index`` of ``rank`` (not finished yet) ends,
        made on first demand (most ops others depend on have ended by the time they
        are needed: making an event for each would cost a SimPy event apiece)."""
        waiting = self._done[rank]
        event = waiting.get(index)
        if event is None:
            event = waiting[index] = self.env.event()
        return event

    def _finish(self, rank: int, index: int) -> None:
        """Op ``index`` of ``rank`` has ended: release whoever waits for it."""
        self._complete[rank].add(index)
        event = self._done[rank].pop(index, None)
        if event is not None:
            event.succeed()

    def _stream(self, rank: int, stream: str, indices: list[int]) -> Iterator[simpy.Event]:
        ops = self.program.ops_by_rank[rank]
        complete = self._complete[rank]
        referenced = self._referenced[rank]
        issued = self._issued.get(rank)
        position = 0
        while position < len(indices):
            index = indices[position]
            op = ops[index]
            if op.deps:
                pending = [self._wait_for(rank, d) for d in op.deps if d not in complete]
                if len(pending) == 1:
                    yield pending[0]
                elif pending:
                    yield self.env.all_of(pending)
            if issued is not None and not issued[index].triggered:
                yield issued[index]
            begin = self.env.now
            duration = self._fixed_ns(op, rank, begin)
            if duration is not None and issued is not None:
                # the next op's issue is known only when the CPU gets there: one at a time
                contended = self._max_ctas is not None
                if contended:
                    self._running[rank, stream] = begin
                yield self.env.timeout(duration)
                while contended and isinstance(op, ComputeOp):
                    # communication that started meanwhile takes SMs: later
                    late = begin + self._fixed_ns(op, rank, begin) - self.env.now
                    if late <= 0:
                        break
                    yield self.env.timeout(late)
                if contended:
                    del self._running[rank, stream]
                self._record(rank, index, op, begin, self.env.now)
                self._finished[rank] += 1
            elif duration is not None:
                # A run of ops whose durations are known in advance (compute; a
                # collective nobody else joins, when nothing contends) that
                # nothing else waits on in between costs one event: their spans
                # follow from their durations.
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
                contended = self._max_ctas is not None
                if contended:
                    self._running[rank, stream] = begin
                yield self.env.timeout(spans[-1][2] - begin)
                while contended:
                    # communication that started meanwhile takes SMs: re-time the run
                    retimed, end = [], begin
                    for member, _, _ in spans:
                        step = self._fixed_ns(ops[member], rank, end)
                        retimed.append((member, end, end + step))
                        end += step
                    spans = retimed
                    if end <= self.env.now:
                        break
                    yield self.env.timeout(end - self.env.now)
                if contended:
                    del self._running[rank, stream]
                for member, span_start, span_end in spans:
                    self._record(rank, member, ops[member], span_start, span_end)
                self._finished[rank] += len(spans)
            else:
                started = yield from self._execute(rank, op)
                self._record(rank, index, op, started, self.env.now)
                self._finished[rank] += 1
            if index in referenced:
                self._finish(rank, index)
            position += 1

    def _fixed_ns(self, op: Op, rank: int, start_ns: int) -> int | None:
        """Duration of an op starting at ``start_ns`` known before it runs, or None
        if it depends on others."""
        if isinstance(op, ComputeOp):
            if rank in self._throttled:  # the duration depends on when it starts
                duration = self.cost.compute_ns(op, rank, start_ns)
            else:
                # memoised per op object (a step repeats the same ops thousands of times;
                # the program keeps them alive, so ids are stable)
                key = (id(op), rank if rank in self.cost.ranks else None)
                duration = self._durations.get(key)
                if duration is None:
                    duration = self.cost.compute_ns(op, rank)
                    self._durations[key] = duration
            busy = self._busy.get(rank) if self._max_ctas is not None else None
            if busy:
                return shared_sm_ns(start_ns, duration, self._sms, busy)
            return duration
        if (not self.fabric.contended and isinstance(op, CollectiveOp)
                and self._max_ctas is None and self._members_present(op) == 1):
            return self._choose(op).duration_ns
        return None

    def _hold_sms(self, ranks, duration_ns: int, ctas: int) -> None:
        """Communication starting now holds ``ctas`` SMs on each present rank of
        ``ranks`` for ``duration_ns`` (module docstring); intervals over before now
        are dropped (every compute op still running started no earlier than the
        earliest one still listed that matters: a run's ops are re-timed from its
        start, which is at most one op's length back)."""
        if self._max_ctas is None or ctas <= 0 or duration_ns <= 0:
            return
        now = self.env.now
        for rank in ranks:
            if rank not in self.program.ops_by_rank:
                continue
            busy = self._busy.setdefault(rank, [])
            running = [b for (r, _), b in self._running.items() if r == rank]
            cutoff = min(running, default=now)
            if busy and busy[0][1] <= cutoff:
                busy[:] = [span for span in busy if span[1] > cutoff]
            busy.append((now, now + duration_ns, ctas))

    def _collective_sms(self, op: CollectiveOp, choice) -> None:
        """A collective starts: its members' SMs (:meth:`_hold_sms`)."""
        if self._max_ctas is None or not op.holds_sms:
            return
        ctas = self.cost.collective_ctas(op.kind, op.group, op.size_bytes, choice,
                                         self._max_ctas)
        self._hold_sms(op.group, choice.duration_ns, ctas)

    def _p2p_sms(self, src: int, dst: int, size_bytes: int) -> None:
        """A send/recv starts: both sides' SMs (:meth:`_hold_sms`)."""
        if self._max_ctas is None:
            return
        self._hold_sms((src, dst), self.cost.p2p_ns(src, dst, size_bytes),
                       self.cost.p2p_ctas(src, dst, size_bytes, self._max_ctas))

    def _choose(self, op: CollectiveOp):
        """The cost model's algorithm, protocol and closed-form duration of a
        collective; the choice is recorded for the report."""
        choice = self.cost.collective(op.kind, op.group, op.size_bytes, op.algorithm)
        self._chosen[op.key] = f"{choice.algorithm}/{choice.protocol}"
        self._chosen_axis[op.key] = f"{op.axis}:{op.kind}"
        return choice

    def _execute(self, rank: int, op: Op):
        """Run one communication op (a generator: its value is when data began to
        move, the last participant arrived), by event callbacks where the fabric has
        them (:meth:`_execute_callbacks`), else by fabric processes."""
        if getattr(self.fabric, "start_collective", None) is not None:
            return self._execute_callbacks(rank, op)
        return self._execute_processes(rank, op)

    def _execute_processes(self, rank: int, op: Op):
        """:meth:`_execute` with the fabric's process bodies (generators)."""
        if isinstance(op, CollectiveOp):
            choice = self._choose(op)
            run = lambda: self.fabric.run_collective(  # noqa: E731
                op.kind, op.group, op.size_bytes, choice, self._group_mirrors(op))
            if self._members_present(op) == 1:
                # Alone (a reduced program's representative): nobody to wait for.
                started = self.env.now
                self._collective_sms(op, choice)
                yield from run()
                return started
            meeting = self._meet(op.key, self._members_present(op), run,
                                 on_start=lambda: self._collective_sms(op, choice))
        elif isinstance(op, (SendOp, RecvOp)):
            src, dst = (rank, op.peer) if isinstance(op, SendOp) else (op.peer, rank)
            meeting = self._meet(("p2p", src, dst, op.tag), 2,
                                 lambda: self.fabric.run_p2p(src, dst, op.size_bytes,
                                                             self._pair_mirrors(src, dst)),
                                 on_start=lambda: self._p2p_sms(src, dst, op.size_bytes))
        else:
            raise TypeError(f"op: {type(op).__name__} is not a Program op")
        yield meeting.done
        return meeting.started_ns

    def _execute_callbacks(self, rank: int, op: Op):
        """:meth:`_execute` on a fabric that runs communication by event callbacks
        (hardware.cost.SharedFabric.start_collective): the same events in the same
        order, without a process per collective.

        Where :meth:`_execute` runs the fabric's process body inside this stream's
        process, the stream waits on an event that is never scheduled but processed
        on the spot (:func:`_process_now`) when the fabric finishes, inside the
        processing of the fabric's last event, as the stream's process would resume
        there; where it starts a process at the rendezvous, an urgent event scheduled
        then starts the fabric, as the process's Initialize event would (its end
        event, which nothing waits on, is left out)."""
        fabric = self.fabric
        if isinstance(op, CollectiveOp):
            choice = self._choose(op)
            mirrors = self._group_mirrors(op)

            def start(on_done) -> bool:
                return fabric.start_collective(op.kind, op.group, op.size_bytes, choice,
                                               mirrors, on_done)

            if self._members_present(op) == 1:
                # Alone (a reduced program's representative): nobody to wait for.
                started = self.env.now
                self._collective_sms(op, choice)
                finished = self.env.event()
                if start(lambda: _process_now(finished)):
                    yield finished
                return started
            meeting = self._meet(op.key, self._members_present(op), start, callbacks=True,
                                 on_start=lambda: self._collective_sms(op, choice))
        elif isinstance(op, (SendOp, RecvOp)):
            src, dst = (rank, op.peer) if isinstance(op, SendOp) else (op.peer, rank)
            mirrors = self._pair_mirrors(src, dst)
            meeting = self._meet(("p2p", src, dst, op.tag), 2,
                                 lambda on_done: fabric.start_p2p(src, dst, op.size_bytes,
                                                                  mirrors, on_done),
                                 callbacks=True,
                                 on_start=lambda: self._p2p_sms(src, dst, op.size_bytes))
        else:
            raise TypeError(f"op: {type(op).__name__} is not a Program op")
        yield meeting.done
        return meeting.started_ns

    def _group_mirrors(self, op: CollectiveOp) -> tuple[tuple[int, ...], ...]:
        """The same collective's groups among the ranks a reduced program leaves out
        (Program.mirrors); only a contended fabric loads links with them."""
        mirrors = self.program.mirrors
        if not self.fabric.contended or mirrors is None:
            return ()
        return mirrors.groups.get(op.group, ())

    def _pair_mirrors(self, src: int, dst: int) -> tuple[tuple[int, int], ...]:
        """The same pipeline transfer between ranks a reduced program leaves out."""
        mirrors = self.program.mirrors
        if not self.fabric.contended or mirrors is None:
            return ()
        return tuple(mirrors.pairs.get((src, dst), ()))

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

    def _meet(self, key: object, expected: int, communicate, callbacks: bool = False,
              on_start=None) -> _Rendezvous:
        """Arrive at a rendezvous; the last to arrive starts ``communicate()`` (a
        process body of the fabric), or with ``callbacks`` ``communicate(on_done)``
        (a fabric's callback start, False when there is nothing to run) from an
        urgent event scheduled now, where the process would start; ``on_start()`` runs
        when the last member arrives."""
        meeting = self._meetings.get(key)
        if meeting is None:
            meeting = _Rendezvous(expected, 0, self.env.event())
            self._meetings[key] = meeting
        meeting.arrived += 1
        if meeting.arrived == meeting.expected:
            del self._meetings[key]
            meeting.started_ns = self.env.now
            if on_start is not None:
                on_start()
            if callbacks:
                done = meeting.done
                begin = simpy.Event(self.env)
                begin._ok = True
                begin._value = None
                begin.callbacks.append(
                    lambda _event: communicate(done.succeed) or done.succeed())
                self.env.schedule(begin, simpy.core.URGENT)
            else:
                self.env.process(self._communicate(communicate(), meeting.done))
        return meeting

    def _communicate(self, body: Iterator[simpy.Event], done: simpy.Event
                     ) -> Iterator[simpy.Event]:
        yield from body
        done.succeed()

    def _record(self, rank: int, index: int, op: Op, start_ns: int, end_ns: int) -> None:
        record_op(self.timeline, rank, index, op, start_ns, end_ns)


def _process_now(event: simpy.Event) -> None:
    """Trigger ``event`` and run its callbacks at once, as SimPy would when processing
    it (for an event nobody schedules: the waiting process resumes here and now)."""
    event._ok = True
    event._value = None
    callbacks, event.callbacks = event.callbacks, None
    for callback in callbacks:
        callback(event)


def simulate(program: Program, cluster: ClusterSpec, *, nodes: int, gpus_per_node: int,
             fidelity: str = "event", compute=None) -> SimulationResult:
    """Place ``program`` on ``nodes x gpus_per_node`` GPUs of ``cluster`` and run it
    (compute priced by ``compute``, default the cluster GPU's roofline).

    Raises:
        ValueError: for a layout the cluster cannot hold, an unknown fidelity,
            or a program that does not fit.
    """
    layout = ClusterLayout(cluster, nodes, gpus_per_node)
    cost = CostModel(layout, ALGORITHMS, compute=compute, fidelity=fidelity)
    return Engine(program, cost).run()
