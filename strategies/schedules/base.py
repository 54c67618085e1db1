"""What a pipeline schedule is: its actions, its placement, its timing and memory.

A schedule owns its shape (DESIGN.md, "schedules own their shape"): the step
lowering, the closed-form step model, the memory model and the planner ask the
schedule object, never its name. A new schedule is one subclass of
:class:`PipelineSchedule` in its own module plus one entry in the registry
(:mod:`strategies.schedules`); everything else follows from these methods:

* :meth:`~PipelineSchedule.check` — which ``(pp, microbatches, vpp)`` it accepts;
* :meth:`~PipelineSchedule.placement` — which rank holds each virtual stage;
* :meth:`~PipelineSchedule.rank_actions` — the ordered actions of one rank;
* :meth:`~PipelineSchedule.timing` — makespan and each rank's last end for given
  per-stage durations (default: an exact replay, extrapolated over the periodic
  steady state; a schedule may override it with its closed form);
* :meth:`~PipelineSchedule.peak_activation_bytes` — activations each rank holds
  at its peak;
* :meth:`~PipelineSchedule.bubble_lower_bound` — a lower bound on the time a
  rank idles (the planner's pruning; 0 is always valid).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, Mapping, Sequence

import numpy as np

from strategies.pipeline import (
    Action,
    StagePlacement,
    interleaved_placement,
    one_f_one_b_family_timing,
    one_f_one_b_family_timings,
    pair_forwards_with_backwards,
    peak_held,
    replay_timing,
)


@dataclass(frozen=True)
class PipelineTiming:
    """When a pipeline's compute ends (times in the caller's unit, integers).

    Attributes:
        makespan: end of the last action of any rank (every rank starts at 0).
        rank_end: per pipeline rank, the end of its last action.
        rank_start: per pipeline rank, the start of its first action (empty: not known).
        rank_comm_wait: per pipeline rank, time it idles for point-to-point transfers
            (empty: not known).
        rank_tail: per pipeline rank, its actions from the first that runs the last
            micro-batch's backward through one of its stages on, as ``(stage, comp,
            micro-batches before the stage's last, start less the rank's end)`` (None
            for a rank, or empty for all: not known;
            :func:`strategies.pipeline.replay_timing`'s ``tails``). The backwards with
            0 are where the step's gradients are complete: the closed-form step model
            starts their reduction there (sim.analytic_step).
    """

    makespan: int
    rank_end: tuple[int, ...]
    rank_start: tuple[int, ...] = ()
    rank_comm_wait: tuple[int, ...] = ()
    rank_tail: tuple[tuple[tuple[int, str, int, int], ...] | None, ...] = ()


def check_positive_shape(pp: object, microbatches: object, vpp: object) -> None:
    """``pp``, ``microbatches`` and ``vpp`` must be ints >= 1 (what every schedule asks
    before its own rules).

    Raises:
        ValueError: one line naming the first field that is not.
    """
    for name, value in (("pp", pp), ("microbatches", microbatches), ("vpp", vpp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; valid: an int >= 1")


class PipelineSchedule:
    """Base class of pipeline schedules (see the module docstring).

    Class attributes a subclass sets:
        name: the name users give (``--schedule``).
        summary: one line for help texts.
        source: where the schedule is described (paper, section).
        split_backward: actions split the backward into I (input) and W (weights).
        searched_by_default: ``trainsim plan`` tries it without being asked.
        vpp_choices: virtual stages per rank the planner tries by default.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    source: ClassVar[str] = ""
    split_backward: ClassVar[bool] = False
    searched_by_default: ClassVar[bool] = True
    vpp_choices: ClassVar[tuple[int, ...]] = (1,)
    #: Its own lists overlap forwards with backwards (F&B pairs, DualPipe): then what
    #: runs depends on the lists, and :meth:`action_counts` counts them.
    pairs_own_actions: ClassVar[bool] = False
    #: Its :meth:`timing` takes a transfer price per pair of ranks (``t_comm`` a mapping:
    #: a pipeline whose hops cross nodes in some places only); False: one price per hop
    #: (the 1F1B family's closed form), the caller then gives one.
    prices_each_hop: ClassVar[bool] = True

    # ------------------------------------------------------------------ shape
    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        """Reject shapes the schedule cannot run, one line naming the field.

        The base accepts any ``pp, microbatches >= 1`` with ``vpp == 1``.

        Raises:
            ValueError: naming ``pp``, ``microbatches`` or ``vpp``.
        """
        check_positive_shape(pp, microbatches, vpp)
        if vpp != 1:
            raise ValueError(f"vpp={vpp} is invalid for schedule={self.name!r}; valid: vpp=1 "
                             "(virtual stages need an interleaved or V-shaped schedule)")

    def microbatch_step(self, pp: int) -> int:
        """Micro-batch counts the schedule accepts are multiples of this (1: any)."""
        return 1

    def placement(self, pp: int, vpp: int) -> StagePlacement:
        """Which rank holds each of the ``pp * vpp`` stages (default: Megatron's
        interleaved layout, stage ``s`` on rank ``s % pp``)."""
        return interleaved_placement(pp, vpp)

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        """The ordered actions of pipeline rank ``rank`` (shape already checked)."""
        raise NotImplementedError(f"schedule {self.name!r} defines no actions")

    def actions(self, pp: int, microbatches: int, vpp: int = 1, overlap: bool = False
                ) -> tuple[tuple[Action, ...], ...]:
        """The ordered actions of every pipeline rank (index = rank), memoised.

        ``overlap``: merge each forward that directly precedes a backward of another
        micro-batch into an overlapped pair (Megatron-Core's
        ``--overlap-moe-expert-parallel-comm``;
        :func:`strategies.pipeline.pair_forwards_with_backwards`). Schedules whose own
        lists already pair them (DualPipe) are returned as they are.

        Raises:
            ValueError: for a shape :meth:`check` rejects.
        """
        self.check(pp, microbatches, vpp)  # before the cache: True == 1 there
        return _actions(self, pp, microbatches, vpp, bool(overlap))

    def action_counts(self, pp: int, microbatches: int, vpp: int = 1, overlap: bool = False
                      ) -> tuple[dict[tuple, int], ...]:
        """How often each kind of action runs on each pipeline rank (index = rank):
        ``("phase", stage, comp)`` or, for an overlapped pair, ``("pair", forward stage,
        backward stage, backward comp)``, memoised.

        Without overlapped pairs (``overlap`` off and a schedule whose lists pair
        nothing, :attr:`pairs_own_actions`) every micro-batch on a stage's route runs
        that stage's forward and backward (I and W when :attr:`split_backward`) once
        (any pipeline schedule: Narayanan et al. 2021, §2; Qi et al. 2024, §2), so the
        counts follow from the placement without building the lists; otherwise they
        are counted in :meth:`actions` (tests/test_schedules.py checks the closed form
        against the lists for every registered schedule).

        Raises:
            ValueError: for a shape :meth:`check` rejects.
        """
        self.check(pp, microbatches, vpp)
        return _action_counts(self, pp, microbatches, vpp, bool(overlap))

    def first_action(self, rank: int, pp: int, microbatches: int, vpp: int = 1,
                     overlap: bool = False) -> Action:
        """The first action of pipeline rank ``rank``. Without overlapped pairs every
        registered schedule starts a rank with the forward of micro-batch 0 through
        its first stage on route 0 (it has no input to work on before that: Narayanan
        et al. 2021, §2.2; Qi et al. 2024, Fig. 3), so the lists are not built
        (tests/test_schedules.py checks it against :meth:`actions`); a schedule that
        starts otherwise overrides this."""
        self.check(pp, microbatches, vpp)
        return _first_actions(self, pp, microbatches, vpp, bool(overlap))[rank]

    # ----------------------------------------------------------------- timing
    def timing(self, pp: int, microbatches: int, vpp: int, t_f: Sequence[int],
               t_b: Sequence[int], t_w: Sequence[int] | None, t_comm: int,
               t_fb: Mapping[tuple[int, int], int] | None = None,
               overlap: bool = False, t_i: Sequence[int] | None = None) -> PipelineTiming:
        """Makespan and each rank's last end with per-stage durations.

        Args:
            t_f, t_b: forward and full backward of each stage for one micro-batch.
            t_w: weight-gradient part of each stage's backward (split schedules).
            t_comm: a point-to-point transfer between ranks, or (where
                :attr:`prices_each_hop`) ``{(sending rank, receiving rank): ns}`` for
                every pair a dependency crosses.
            t_fb: an overlapped pair's duration by (forward stage, backward stage)
                (:func:`strategies.pipeline.simulate_unit_times`).
            overlap: the action lists with overlapped pairs (:meth:`actions`).
            t_i: input-gradient part of each stage's backward when it is not
                ``t_b - t_w`` (split schedules).

        The default replays the action lists exactly
        (:func:`strategies.pipeline.simulate_unit_times`, through its compiled
        :func:`strategies.pipeline.replay_timing`). Past the warm-up the
        steady state repeats, so a long schedule is extrapolated from three
        replays that show a constant period (checked for the makespan and every
        rank's end); otherwise the whole schedule is replayed.
        """
        placement = self.placement(pp, vpp)
        step = self.microbatch_step(pp)
        weights = None if not self.split_backward else list(t_w or [0] * len(t_f))

        def replay(m: int) -> PipelineTiming:
            # replay_timing: simulate_unit_times' makespan, ends, starts and transfer
            # waits, compiled once per action list and memoised per duration vector
            makespan, ends, starts, waits, tails = replay_timing(
                self.actions(pp, m, vpp, overlap), placement, t_f, t_b, weights, t_comm,
                t_fb=t_fb, t_i=t_i, tails=True)
            return PipelineTiming(int(makespan), tuple(int(e) for e in ends),
                                  tuple(int(x) for x in starts), tuple(int(w) for w in waits),
                                  tuple(None if row is None else
                                        tuple((s, c, k, int(x - end)) for s, c, k, x in row)
                                        for row, end in zip(tails, ends)))

        short = -(-3 * pp // step) * step
        if microbatches <= short + 2 * step:
            return replay(microbatches)
        base = short + (microbatches - short) % step
        runs = [replay(base + k * step) for k in range(3)]
        periods = {(b.makespan - a.makespan, *(y - x for x, y in zip(a.rank_end, b.rank_end)),
                    *(y - x for x, y in zip(a.rank_comm_wait, b.rank_comm_wait)))
                   for a, b in zip(runs, runs[1:])}
        if len(periods) != 1:
            return replay(microbatches)
        # (the tails' starts before the rank's end are periodic too, or not known)
        tail = runs[0].rank_tail if len({run.rank_tail for run in runs}) == 1 else ()
        period = periods.pop()
        repeats = (microbatches - base) // step
        grow = period[1:1 + pp], period[1 + pp:]
        return PipelineTiming(runs[0].makespan + repeats * period[0],
                              tuple(e + repeats * d for e, d in zip(runs[0].rank_end, grow[0])),
                              runs[0].rank_start,
                              tuple(w + repeats * d
                                    for w, d in zip(runs[0].rank_comm_wait, grow[1])),
                              tail)

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        """A lower bound on the idle time of the busiest rank (planner pruning).

        Args:
            work_per_microbatch: forward + backward of one micro-batch on the
                average rank (all its stages).
            fill_per_stage: a lower bound on one stage's ``F + I - W``.

        The base returns 0, which bounds any schedule.
        """
        return 0.0

    # ----------------------------------------------------------------- memory
    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        """Micro-batches after which no rank's peak of held activations grows
        (None: the whole schedule must be walked). Memory checks walk only that
        many, which keeps them cheap for long schedules."""
        return None

    def peak_activation_bytes(self, pp: int, microbatches: int, vpp: int,
                              stage_bytes: Sequence[float]) -> list[float]:
        """Peak bytes of activations each rank holds (held from a stage's F to its
        B or I; :func:`strategies.pipeline.peak_held`), walking the schedule cut at
        :meth:`memory_horizon`.

        Args:
            stage_bytes: activations of one micro-batch of each stage, bytes.
        """
        horizon = self.memory_horizon(pp, vpp)
        m = microbatches if horizon is None else min(microbatches, horizon)
        if _whole_bytes(stage_bytes, pp * vpp, m * vpp):
            self.check(pp, m, vpp)
            counts = _held_counts(self, pp, m, vpp)
            if counts is not None:
                # whole numbers of bytes below 2**53: every sum is exact, so the dot
                # product is the float peak_held's running total reaches
                sizes = np.asarray(stage_bytes[:pp * vpp], dtype=np.float64)
                return [float((rows @ sizes[cols]).max(initial=0.0)) for cols, rows in counts]
        return peak_held(self.actions(pp, m, vpp), stage_bytes)

    def held_counts(self, pp: int, microbatches: int, vpp: int
                    ) -> tuple[np.ndarray, ...] | None:
        """Closed form of the activations each rank holds right after each of its
        forwards (where :func:`strategies.pipeline.peak_held` looks for the peak): per
        rank an int matrix, one row per forward, one column per stage, of how many
        micro-batches of that stage it holds then (held from F to B or I). None: no
        closed form, :meth:`peak_activation_bytes` walks the action lists. Overrides
        are checked against the lists in tests/test_schedules.py."""
        return None

    def peak_inflight(self, pp: int, microbatches: int, vpp: int) -> list[int]:
        """Peak number of (stage, micro-batch) activations each rank holds."""
        return [int(x) for x in self.peak_activation_bytes(pp, microbatches, vpp,
                                                            [1.0] * (pp * vpp))]

    def __repr__(self) -> str:
        return f"<schedule {self.name}>"


def one_stage_held_counts(pp: int, microbatches: int) -> tuple[np.ndarray, ...]:
    """:meth:`PipelineSchedule.held_counts` of a schedule with one stage per rank whose
    rank ``r`` runs ``w = min(p - r - 1, m)`` forwards, then each forward followed by
    the backward (or I) of the oldest micro-batch (1F1B, ZB-H1: Narayanan et al. 2021,
    §2.2; Qi et al. 2023, §2.1): right after forward ``j`` it holds
    ``j + 1 - max(j - w, 0)`` micro-batches of its stage."""
    j = np.arange(microbatches, dtype=np.int64)
    out = []
    for rank in range(pp):
        warmup = min(pp - rank - 1, microbatches)
        rows = np.zeros((microbatches, pp), dtype=np.int64)
        rows[:, rank] = j + 1 - np.maximum(j - warmup, 0)
        out.append(rows)
    return tuple(out)


def _whole_bytes(stage_bytes: Sequence[float], stages: int, forwards: int) -> bool:
    """Whether ``stage_bytes`` has a whole number of bytes for each of ``stages`` stages,
    small enough that ``forwards`` of them add up exactly in float64 (< 2**53)."""
    if len(stage_bytes) < stages:
        return False
    sizes = stage_bytes[:stages]
    return (all(float(b).is_integer() and b >= 0 for b in sizes)
            and max(sizes, default=0) * max(forwards, 1) < 2 ** 53)


@lru_cache(maxsize=1024)
def _held_counts(schedule: "PipelineSchedule", pp: int, microbatches: int, vpp: int
                 ) -> tuple[tuple[np.ndarray, np.ndarray], ...] | None:
    """PipelineSchedule.held_counts, memoised: per rank (the stages it ever holds, the
    counts of those stages as float64)."""
    counts = schedule.held_counts(pp, microbatches, vpp)
    if counts is None:
        return None
    out = []
    for rows in counts:
        cols = np.flatnonzero(rows.any(axis=0)) if len(rows) else np.zeros(0, np.int64)
        kept = rows[:, cols].astype(np.float64) if len(rows) else np.zeros((1, 0))
        cols.setflags(write=False)
        kept.setflags(write=False)
        out.append((cols, kept))
    return tuple(out)


@lru_cache(maxsize=512)
def _actions(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int, overlap: bool
             ) -> tuple[tuple[Action, ...], ...]:
    rows = [schedule.rank_actions(rank, pp, microbatches, vpp) for rank in range(pp)]
    if overlap and not any(a.overlap for row in rows for a in row):
        rows = pair_forwards_with_backwards(rows, schedule.placement(pp, vpp))
    return tuple(tuple(row) for row in rows)


@lru_cache(maxsize=4096)
def _action_counts(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int,
                   overlap: bool) -> tuple[dict[tuple, int], ...]:
    """PipelineSchedule.action_counts (the returned dicts must not be changed)."""
    if overlap or schedule.pairs_own_actions:
        return tuple(count_actions(row)
                     for row in _actions(schedule, pp, microbatches, vpp, overlap))
    placement = schedule.placement(pp, vpp)
    comps = ("F", "I", "W") if schedule.split_backward else ("F", "B")
    rows: list[dict[tuple, int]] = [{} for _ in range(pp)]
    for stage, rank in enumerate(placement.rank_of_stage):
        through = placement.microbatches_through(stage, microbatches)
        if through:
            for comp in comps:
                rows[rank][("phase", stage, comp)] = through
    return tuple(rows)


@lru_cache(maxsize=4096)
def _first_actions(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int,
                   overlap: bool) -> tuple[Action, ...]:
    """PipelineSchedule.first_action of every rank."""
    if overlap or schedule.pairs_own_actions:
        return tuple(row[0] for row in _actions(schedule, pp, microbatches, vpp, overlap))
    placement = schedule.placement(pp, vpp)
    return tuple(Action(min(s for s in placement.stages_of(rank) if placement.on_route(s, 0)),
                        "F", 0) for rank in range(pp))


def count_actions(actions: Sequence[Action]) -> dict[tuple, int]:
    """How often each kind of action runs in ``actions``: ``("phase", stage, comp)``
    or ``("pair", forward stage, backward stage, backward comp)`` for an overlapped
    pair (the pair's two actions, forward first), in order of first appearance."""
    counts: dict[tuple, int] = {}
    index = 0
    while index < len(actions):
        action = actions[index]
        if action.overlap:
            forward, backward = sorted(actions[index:index + 2], key=lambda a: a.comp != "F")
            key = ("pair", forward.stage, backward.stage, backward.comp)
            index += 2
        else:
            key = ("phase", action.stage, action.comp)
            index += 1
        counts[key] = counts.get(key, 0) + 1
    return counts


class OneFOneBFamily(PipelineSchedule):
    """A schedule of the 1F1B family (GPipe, 1F1B, interleaved): rank ``r`` runs
    :meth:`warmup_forwards` forwards, then one forward and one backward, then the
    remaining backwards (Megatron-Core, megatron/core/pipeline_parallel/schedules.py),
    so its step is timed exactly, without building the lists, by
    :func:`strategies.pipeline.one_f_one_b_family_timing` -- the list replay's integers
    at any size. Overlapped forward-backward pairs, a subclass with its own order and
    durations that are not whole numbers are replayed from the lists. One transfer price
    per hop (:attr:`PipelineSchedule.prices_each_hop` False: the recurrence's)."""

    prices_each_hop = False

    def warmup_forwards(self, rank: int, pp: int, microbatches: int, vpp: int) -> int | None:
        """Forwards rank ``rank`` runs before its first backward (shape already
        checked); None: the lists follow no such order (then they are replayed)."""
        return None

    def timing(self, pp: int, microbatches: int, vpp: int, t_f: Sequence[int],
               t_b: Sequence[int], t_w: Sequence[int] | None, t_comm: int,
               t_fb: Mapping[tuple[int, int], int] | None = None,
               overlap: bool = False, t_i: Sequence[int] | None = None) -> PipelineTiming:
        """:meth:`PipelineSchedule.timing` (same arguments and integers): without
        overlapped pairs, the recurrence of
        :func:`strategies.pipeline.one_f_one_b_family_timing` on the schedule's warm-up
        counts, memoised per durations; otherwise (or without warm-up counts, with
        durations that are not whole numbers, or a price per hop) the base class's list
        replay."""
        if not overlap and not isinstance(t_comm, Mapping):
            self.check(pp, microbatches, vpp)
            found = _family_timing(self, pp, microbatches, vpp, tuple(t_f), tuple(t_b),
                                   t_comm)
            if found is not None:
                return found
        return super().timing(pp, microbatches, vpp, t_f, t_b, t_w, t_comm, t_fb, overlap,
                              t_i)


#: OneFOneBFamily timings without pairs by ``(schedule, pp, microbatches, vpp, t_f, t_b,
#: t_comm)`` (:func:`_family_timing`; :func:`prime_family_timings` fills it for many at
#: once), the least recently used dropped past :data:`_FAMILY_TIMINGS_MAX`
_FAMILY_TIMINGS: dict[tuple, PipelineTiming | None] = {}
_FAMILY_TIMINGS_MAX = 4096
_MISSING = object()


def _recall_timing(key: tuple) -> object:
    """The memo's entry for ``key`` (a timing, or None for lists to replay), moved to the
    most recently used end; :data:`_MISSING` when it holds none."""
    found = _FAMILY_TIMINGS.pop(key, _MISSING)
    if found is not _MISSING:
        _FAMILY_TIMINGS[key] = found
    return found


def _family_timing(schedule: OneFOneBFamily, pp: int, microbatches: int, vpp: int,
                   t_f: tuple, t_b: tuple, t_comm: int) -> PipelineTiming | None:
    """OneFOneBFamily.timing without pairs, memoised per durations; None when the lists
    must be replayed (no warm-up order, durations not whole ns >= 0)."""
    key = (schedule, pp, microbatches, vpp, t_f, t_b, t_comm)
    found = _recall_timing(key)
    if found is _MISSING:
        warmups = _family_warmups(schedule, pp, microbatches, vpp, t_f, t_b, t_comm)
        found = None
        if warmups is not None:
            found = PipelineTiming(*one_f_one_b_family_timing(
                pp, microbatches, vpp, warmups, t_f, t_b, t_comm))
        _remember_timing(key, found)
    return found


def _remember_timing(key: tuple, found: PipelineTiming | None) -> None:
    """Keep ``found`` in :data:`_FAMILY_TIMINGS` (bounded: the least recently used goes)."""
    if len(_FAMILY_TIMINGS) >= _FAMILY_TIMINGS_MAX:
        _FAMILY_TIMINGS.pop(next(iter(_FAMILY_TIMINGS)))
    _FAMILY_TIMINGS[key] = found


def _family_warmups(schedule: OneFOneBFamily, pp: int, microbatches: int, vpp: int,
                    t_f: tuple, t_b: tuple, t_comm: int) -> list[int] | None:
    """Each rank's warm-up forwards when :func:`_family_timing` times these durations by
    the recurrence; None when the lists must be replayed."""
    if not _whole_durations(pp * vpp, t_f, t_b, t_comm):
        return None
    return _shape_warmups(schedule, pp, microbatches, vpp)


def _whole_durations(stages: int, t_f: tuple, t_b: tuple, t_comm: int) -> bool:
    """Whether the recurrence times these durations: one per stage, whole ns >= 0."""
    return (len(t_f) == stages and len(t_b) == stages
            and all(type(x) is int and x >= 0 for x in (*t_f, *t_b, t_comm)))


def _shape_warmups(schedule: OneFOneBFamily, pp: int, microbatches: int, vpp: int
                   ) -> list[int] | None:
    """The shape's part of :func:`_family_warmups` (whole durations given): each rank's
    warm-up forwards on Megatron's placement, None when the lists must be replayed."""
    if schedule.placement(pp, vpp) != interleaved_placement(pp, vpp):
        return None  # (the recurrence reads Megatron's layout: stage s on rank s % pp)
    warmups = []
    for rank in range(pp):
        found = schedule.warmup_forwards(rank, pp, microbatches, vpp)
        if found is None:
            return None
        warmups.append(found)
    return warmups


def family_warmups(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int
                   ) -> list[int] | None:
    """Each rank's warm-up forwards where ``schedule`` is a 1F1B-family schedule timed by
    the family's recurrence (its own ``timing`` not overridden, Megatron's placement,
    a warm-up order): what :func:`strategies.pipeline.one_f_one_b_family_walk` walks;
    None otherwise (or for a shape :meth:`PipelineSchedule.check` rejects)."""
    if (not isinstance(schedule, OneFOneBFamily)
            or type(schedule).timing is not OneFOneBFamily.timing):
        return None
    try:
        schedule.check(pp, microbatches, vpp)
    except ValueError:
        return None
    return _shape_warmups(schedule, pp, microbatches, vpp)


def _family_key(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int,
                t_f: Sequence[int], t_b: Sequence[int], t_comm: object) -> tuple | None:
    """The memo key of a :meth:`OneFOneBFamily.timing` call without overlapped pairs, or
    None for a call the memo never holds (another schedule or one with its own
    ``timing``; a price per hop or a ``t_comm`` that is not a whole number: those go to
    the list replay)."""
    if (type(t_comm) is not int or not isinstance(schedule, OneFOneBFamily)
            or type(schedule).timing is not OneFOneBFamily.timing):
        return None
    return (schedule, pp, microbatches, vpp, tuple(t_f), tuple(t_b), t_comm)


def known_family_timing(schedule: PipelineSchedule, pp: int, microbatches: int, vpp: int,
                        t_f: Sequence[int], t_b: Sequence[int], t_comm: object
                        ) -> tuple[bool, PipelineTiming | None]:
    """``(missing, timing)`` for a :meth:`OneFOneBFamily.timing` call without overlapped
    pairs: ``(True, None)`` when :func:`prime_family_timings` would time it and the
    family's memo does not hold it yet; else ``(False, the memo's timing)`` (None for
    lists to replay) or ``(False, None)`` for a call the memo never holds (a key is kept
    only once its shape passed the schedule's check)."""
    key = _family_key(schedule, pp, microbatches, vpp, t_f, t_b, t_comm)
    if key is None:
        return False, None
    found = _recall_timing(key)
    if found is _MISSING:
        return True, None
    return False, found


def prime_family_timings(requests: Sequence[tuple]) -> list[PipelineTiming | None]:
    """:meth:`OneFOneBFamily.timing` of many requests at once, each ``(schedule, pp,
    microbatches, vpp, t_f, t_b, t_comm)`` as that method receives them (no overlapped
    pairs): the timing it returns, or None for a request left to its own call (another
    schedule or one with its own ``timing``, a price per hop, a shape the schedule
    refuses, durations not whole ns, lists to replay). Requests of one shape and
    ``t_comm`` are timed together (:func:`strategies.pipeline.one_f_one_b_family_timings`:
    the same integers as one at a time, several duration sets in one numpy pass where
    that pays), and kept in the family's memo for later calls."""
    keys: list[tuple | None] = []
    found: dict[tuple, PipelineTiming | None] = {}
    groups: dict[tuple, list[tuple]] = {}
    # each shape's check and warm-up counts once (a plan search sends many duration
    # sets per shape): its warm-up list, None (lists to replay) or _MISSING (refused)
    shapes: dict[tuple, object] = {}
    for request in requests:
        key = _family_key(*request)
        keys.append(key)
        if key is None or key in found:
            continue
        schedule, pp, microbatches, vpp, t_f, t_b, t_comm = key
        known = _recall_timing(key)
        if known is not _MISSING:  # (a key is kept only once its shape passed check)
            found[key] = known
            continue
        found[key] = None
        shape = key[:4]
        if shape not in shapes:
            try:
                schedule.check(pp, microbatches, vpp)
            except ValueError:
                shapes[shape] = _MISSING
            else:
                counts = _shape_warmups(schedule, pp, microbatches, vpp)
                shapes[shape] = None if counts is None else tuple(counts)
        warmups = shapes[shape]
        if warmups is _MISSING:
            continue  # (its own call raises)
        if warmups is not None and not _whole_durations(pp * vpp, t_f, t_b, t_comm):
            warmups = None
        if warmups is None:
            _remember_timing(key, None)  # (lists to replay, as _family_timing keeps it)
        else:
            groups.setdefault((pp, microbatches, vpp, warmups, t_comm), []).append(key)
    for (pp, microbatches, vpp, warmups, t_comm), members in groups.items():
        try:
            timings = one_f_one_b_family_timings(pp, microbatches, vpp, warmups,
                                                 [(key[4], key[5]) for key in members],
                                                 t_comm)
        except ValueError:
            continue  # (a schedule's warm-up count out of range: its own call raises)
        for key, timing in zip(members, timings):
            found[key] = PipelineTiming(*timing)
            _remember_timing(key, found[key])
    return [None if key is None else found[key] for key in keys]
