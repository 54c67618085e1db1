"""Pipeline-parallel action lists: notation, stage placement, checking and exact timing.

This module is the machinery every pipeline schedule shares; the schedules
themselves (GPipe, 1F1B, interleaved, zero bubble, ...) are classes in
:mod:`strategies.schedules`, each owning its action lists and its placement.

Notation (PyTorch ``torch.distributed.pipelining`` ``_Action``): an action is
``(stage, computation, microbatch)`` printed ``f"{stage}{comp}{mb}"``:

* ``0F1``: forward of stage 0 on micro-batch 1;
* ``3B0``: full backward of stage 3 on micro-batch 0;
* ``2I1``: backward for the *input* only (activation gradient) — zero-bubble
  schedules split B into I and W;
* ``2W1``: backward for the *weights* only.

Stages are GLOBAL virtual stage indices ``0 .. S-1``; stage ``s`` sends
activations to ``s+1`` and gradients to ``s-1``. A :class:`StagePlacement` says
which pipeline rank holds each stage: Megatron's interleaved layout puts stage
``s`` on rank ``s % pp``; V-shaped schedules put stages ``r`` and ``2 pp - 1 - r``
on rank ``r``. Micro-batches are ``0 .. m-1``.

Routes (bidirectional pipelines): a placement may cut its stages into ``routes``
consecutive blocks, each a whole pass over the model's chunks; micro-batch ``j``
runs through route ``j % routes`` only. DualPipe (DeepSeek-V3 report, arXiv
2412.19437, Section 3.2.1) has two: micro-batches fed from the first rank run
stages ``0 .. pp-1`` (rank ``r`` holds stage ``r``), those fed from the last rank
run stages ``pp .. 2pp-1`` (rank ``r`` holds stage ``2pp-1-r``); stage ``s`` runs
model chunk ``s % (S / routes)``, so every rank holds two copies' worth of chunks.

Overlapped pairs: an action with ``overlap=True`` runs together with the next
action of its rank's list, a forward and a backward of two different
micro-batches interleaved so that the communication of each hides behind the
computation of the other (DualPipe's "F&B" chunks; Megatron-Core's
``--overlap-moe-expert-parallel-comm``). The pair starts when both members'
dependencies are met and both end together (PyTorch pipelining's
``OVERLAP_F_B`` action with sub-actions; written ``(0F1;3B0)`` here).

Dependencies between actions (used by :func:`check_schedule` and
:func:`simulate_unit_times`):

* ``F(s, j)`` needs ``F(s-1, j)`` (unless ``s`` is the first stage of ``j``'s route);
* ``B(s, j)`` / ``I(s, j)`` need ``F(s, j)`` and, unless ``s`` is the last stage of
  ``j``'s route, the backward-input of stage ``s+1`` on ``j`` (its B or its I);
* ``W(s, j)`` needs ``I(s, j)``;
* actions of one rank run one at a time, in list order.

A dependency produced on another rank arrives ``t_comm`` later (a buffered
point-to-point transfer: a send never waits for its receiver); one produced on
the same rank (consecutive stages of a V on one rank) is there at once. Times
in this module are in whatever unit the caller uses (the engine uses integer
nanoseconds); with ``int`` or :class:`fractions.Fraction` durations every
result is exact.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from numbers import Rational, Real
from typing import Mapping, NamedTuple, Sequence, Union

__all__ = [
    "COMPUTATIONS",
    "Action",
    "parse_action",
    "parse_actions",
    "pair_forwards_with_backwards",
    "format_schedule",
    "StagePlacement",
    "interleaved_placement",
    "v_placement",
    "dual_placement",
    "PeerStages",
    "peer_stages",
    "send_target",
    "check_schedule",
    "max_inflight_microbatches",
    "peak_held",
    "ScheduleTiming",
    "simulate_unit_times",
    "replay_timing",
]

#: Compute actions: Forward, full Backward, backward-Input, backward-Weight.
COMPUTATIONS = ("F", "B", "I", "W")

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Action:
    """One compute action of a pipeline rank.

    Attributes:
        stage: global virtual stage index (``0 .. S-1``).
        comp: ``"F"`` forward, ``"B"`` full backward, ``"I"`` backward for
            the input only, ``"W"`` backward for the weights only.
        microbatch: micro-batch index (``0 .. m-1``).
        overlap: runs overlapped with the next action of the rank's list (an
            F&B pair, module docstring).

    ``str(Action(0, "F", 1)) == "0F1"`` (PyTorch pipelining notation).
    """

    stage: int
    comp: str
    microbatch: int
    overlap: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.stage) or self.stage < 0:
            raise ValueError(f"Action.stage={self.stage!r} is invalid; valid: an int >= 0")
        if self.comp not in COMPUTATIONS:
            raise ValueError(f"Action.comp={self.comp!r} is invalid; valid: one of {COMPUTATIONS}")
        if not _is_int(self.microbatch) or self.microbatch < 0:
            raise ValueError(f"Action.microbatch={self.microbatch!r} is invalid; valid: an int >= 0")
        if not isinstance(self.overlap, bool):
            raise ValueError(f"Action.overlap={self.overlap!r} is invalid; valid: True or False")

    def __str__(self) -> str:
        return f"{self.stage}{self.comp}{self.microbatch}"


def parse_action(text: str) -> Action:
    """Parse ``"0F1"`` (stage, computation, micro-batch) into an :class:`Action`.

    Raises:
        ValueError: if ``text`` is not ``<stage><F|B|I|W><microbatch>`` with
            non-negative decimal integers.
    """
    match = _ACTION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"action text={text!r} is invalid; valid: '<stage><F|B|I|W><microbatch>', e.g. '0F1'"
        )
    return Action(int(match.group(1)), match.group(2), int(match.group(3)))


def parse_actions(rows: Sequence[Sequence[str] | str]) -> list[list[Action]]:
    """Parse per-rank action lists; a row may be a list of strings or one
    whitespace-separated string (``"0F0 0F1 0B0"``); an overlapped pair is written
    ``"(0F1;3B0)"`` (its first action gets ``overlap=True``).

    Raises:
        ValueError: for an item that is neither an action nor a pair of two.
    """
    out = []
    for row in rows:
        items = row.split() if isinstance(row, str) else row
        parsed: list[Action] = []
        for item in items:
            if isinstance(item, str) and item.startswith("(") and item.endswith(")"):
                parts = item[1:-1].split(";")
                if len(parts) != 2:
                    raise ValueError(f"action text={item!r} is invalid; valid: a pair "
                                     "'(<action>;<action>)', e.g. '(0F1;3B0)'")
                first, second = (parse_action(part) for part in parts)
                parsed += [Action(first.stage, first.comp, first.microbatch, True), second]
            else:
                parsed.append(parse_action(item))
        out.append(parsed)
    return out


def _row_text(row: Sequence[Action]) -> str:
    """A rank's actions as text, overlapped pairs as ``(a;b)``."""
    words, pending = [], None
    for action in row:
        if pending is not None:
            words.append(f"({pending};{action})")
            pending = None
        elif action.overlap:
            pending = action
        else:
            words.append(str(action))
    if pending is not None:
        words.append(str(pending))
    return " ".join(words)


def format_schedule(actions: Sequence[Sequence[Action]]) -> str:
    """One line per rank: ``"rank 0: 0F0 0F1 0B0 ..."`` (pairs as ``(0F1;3B0)``)."""
    return "\n".join(f"rank {rank}: " + _row_text(row) for rank, row in enumerate(actions))


# --------------------------------------------------------------------------- placement


def pair_forwards_with_backwards(actions: Sequence[Sequence[Action]],
                                 placement: StagePlacement) -> list[list[Action]]:
    """The ranks' lists with every forward that directly precedes a backward (B or I)
    of another micro-batch or stage made an overlapped pair (:attr:`Action.overlap`):
    the steady state of a 1F1B-family schedule as Megatron-Core runs it with
    ``--overlap-moe-expert-parallel-comm`` (one micro-batch's forward merged with
    another's backward, ``megatron/core/pipeline_parallel/combined_1f1b.py``). A pair
    whose backward waits, through the next ranks, for its own forward (a warm-up cut
    short by few micro-batches) would deadlock: it stays two actions.

    A single rank with one stage (no pipeline) runs ``F0 (F1;B0) (F2;B1) ... B(m-1)``:
    each backward waits for the next forward to pair with, as Megatron-Core's combined
    1F1B does without pipeline parallelism.

    Raises:
        ValueError: when the lists deadlock without any pair.
    """
    if placement.pp == 1 and placement.num_stages == 1 and len(actions[0]) > 2:
        row = list(actions[0])
        forwards = [a for a in row if a.comp == "F"]
        backwards = [a for a in row if a.comp != "F"]
        if len(backwards) == len(forwards):  # F then B per micro-batch
            out = [forwards[0]]
            for forward, backward in zip(forwards[1:], backwards):
                out += [Action(forward.stage, "F", forward.microbatch, True), backward]
            return [out + [backwards[-1]]]
    rows = []
    for row in actions:
        out = list(row)
        index = 0
        while index + 1 < len(out):
            first, second = out[index], out[index + 1]
            if (first.comp == "F" and second.comp in ("B", "I") and not first.overlap
                    and not second.overlap
                    and (first.stage, first.microbatch) != (second.stage, second.microbatch)):
                out[index] = Action(first.stage, "F", first.microbatch, True)
                index += 2
            else:
                index += 1
        rows.append(out)
    while True:
        try:
            _run(rows, placement, lambda a: 0, 0)
            return rows
        except _Deadlock as stuck:
            paired = [(rank, index) for rank, index in stuck.waiting
                      if rows[rank][index].overlap]
            if not paired:
                raise
            rank, index = paired[0]
            action = rows[rank][index]
            rows[rank][index] = Action(action.stage, "F", action.microbatch)


def _check_pos_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid; valid: an int >= 1")


@dataclass(frozen=True)
class StagePlacement:
    """Which pipeline rank holds each global virtual stage, and the routes
    micro-batches take through them (module docstring).

    Attributes:
        pp: pipeline ranks.
        rank_of_stage: the rank of stage ``s`` at index ``s`` (every rank holds
            the same number of stages).
        routes: disjoint passes over the model (1; DualPipe: 2). The stages split
            in ``routes`` consecutive blocks of ``S / routes``; micro-batch ``j``
            runs through block ``j % routes``, and stage ``s`` runs model chunk
            ``s % (S / routes)``.

    Raises:
        ValueError: when a rank is out of range, ranks hold unequal numbers of
            stages, or ``routes`` does not divide the stages.
    """

    pp: int
    rank_of_stage: tuple[int, ...]
    routes: int = 1

    def __post_init__(self) -> None:
        _check_pos_int("pp", self.pp)
        counts = [0] * self.pp
        for stage, rank in enumerate(self.rank_of_stage):
            if not _is_int(rank) or not 0 <= rank < self.pp:
                raise ValueError(f"rank_of_stage[{stage}]={rank!r} is invalid; "
                                 f"valid: 0 .. {self.pp - 1}")
            counts[rank] += 1
        if len(set(counts)) != 1 or counts[0] == 0:
            raise ValueError(f"rank_of_stage={self.rank_of_stage!r} is invalid; valid: every "
                             f"one of the {self.pp} ranks holds the same number of stages")
        _check_pos_int("routes", self.routes)
        if len(self.rank_of_stage) % self.routes:
            raise ValueError(f"routes={self.routes} is invalid; valid: a divisor of the "
                             f"{len(self.rank_of_stage)} stages")
        # derived once (the closed-form step model asks these per part and plan); not
        # fields, so equality, hashing and the repr stay those of the three fields
        stages = len(self.rank_of_stage)
        object.__setattr__(self, "_stages", stages)
        object.__setattr__(self, "_chunks", stages // self.routes)
        held: list[list[int]] = [[] for _ in range(self.pp)]
        for stage, rank in enumerate(self.rank_of_stage):
            held[rank].append(stage)
        object.__setattr__(self, "_stages_of", tuple(map(tuple, held)))

    @property
    def num_stages(self) -> int:
        """Global virtual stages ``S``."""
        return self._stages

    @property
    def stages_per_rank(self) -> int:
        """Virtual stages (model chunks) each rank holds."""
        return self.num_stages // self.pp

    @property
    def num_chunks(self) -> int:
        """Distinct model chunks: the stages of one route (``S / routes``)."""
        return self._chunks

    def chunk_of(self, stage: int) -> int:
        """The model chunk stage ``stage`` runs (``stage % num_chunks``).

        Raises:
            ValueError: for a stage outside ``0 .. S-1``.
        """
        if type(stage) is not int or not 0 <= stage < self._stages:
            self.rank_of(stage)  # raises for an invalid stage
        return stage % self._chunks

    def is_first(self, stage: int) -> bool:
        """``stage`` is the first of its route (it embeds the input tokens)."""
        return self.chunk_of(stage) == 0

    def is_last(self, stage: int) -> bool:
        """``stage`` is the last of its route (it holds the head and the loss)."""
        return self.chunk_of(stage) == self.num_chunks - 1

    def on_route(self, stage: int, microbatch: int) -> bool:
        """Micro-batch ``microbatch`` runs through ``stage``."""
        return stage // self.num_chunks == microbatch % self.routes

    def microbatches_through(self, stage: int, microbatches: int) -> int:
        """How many of ``microbatches`` micro-batches run through ``stage``."""
        return len(range(stage // self.num_chunks, microbatches, self.routes))

    def rank_of(self, stage: int) -> int:
        """The pipeline rank that holds ``stage``.

        Raises:
            ValueError: for a stage outside ``0 .. S-1``.
        """
        if type(stage) is not int and not _is_int(stage) or not 0 <= stage < self._stages:
            raise ValueError(f"stage={stage!r} is invalid; valid: 0 .. {self.num_stages - 1}")
        return self.rank_of_stage[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Stages rank ``rank`` holds, ascending.

        Raises:
            ValueError: for a rank outside ``0 .. pp-1``.
        """
        if type(rank) is not int and not _is_int(rank) or not 0 <= rank < self.pp:
            raise ValueError(f"rank={rank!r} is invalid; valid: 0 .. {self.pp - 1} (pp={self.pp})")
        return self._stages_of[rank]

    def edges(self) -> tuple[tuple[int, int], ...]:
        """``(rank, next rank)`` of every stage boundary inside a route that crosses
        ranks, in stage order without repeats: the pipeline's point-to-point links."""
        seen: list[tuple[int, int]] = []
        for stage in range(self.num_stages - 1):
            if self.is_last(stage):
                continue
            pair = (self.rank_of_stage[stage], self.rank_of_stage[stage + 1])
            if pair[0] != pair[1] and pair not in seen:
                seen.append(pair)
        return tuple(seen)


def interleaved_placement(pp: int, vpp: int = 1) -> StagePlacement:
    """Megatron-LM's layout: rank ``r`` holds stages ``r, r + pp, r + 2 pp, ...``
    (``vpp`` of them; one with ``vpp = 1``).

    Raises:
        ValueError: if ``pp`` or ``vpp`` is not an int >= 1.
    """
    _check_pos_int("pp", pp)
    _check_pos_int("vpp", vpp)
    return _interleaved_placement(pp, vpp)


@lru_cache(maxsize=1024)
def _interleaved_placement(pp: int, vpp: int) -> StagePlacement:
    """interleaved_placement, built once per shape (a placement is immutable)."""
    return StagePlacement(pp, tuple(s % pp for s in range(pp * vpp)))


def v_placement(pp: int) -> StagePlacement:
    """The V-shaped layout of ZB-V and DualPipeV (Qi et al. 2024, arXiv 2405.15362;
    DeepSeek-V3 report, arXiv 2412.19437): ``2 pp`` stages, rank ``r`` holds stages
    ``r`` and ``2 pp - 1 - r``, so the first and last stages share rank 0.

    Raises:
        ValueError: if ``pp`` is not an int >= 1.
    """
    _check_pos_int("pp", pp)
    return StagePlacement(pp, tuple(range(pp)) + tuple(reversed(range(pp))))


def dual_placement(pp: int) -> StagePlacement:
    """DualPipe's two-way layout (DeepSeek-V3 report, arXiv 2412.19437, Section 3.2.1):
    ``2 pp`` stages on the V's ranks (stage ``s`` and ``2 pp - 1 - s`` on rank
    ``min(s, 2 pp - 1 - s)``) but two routes: even micro-batches run chunks
    ``0 .. pp-1`` on ranks ``0 .. pp-1``, odd ones the same chunks on ranks
    ``pp-1 .. 0``. Rank ``r`` holds chunks ``r`` and ``pp - 1 - r``.

    Raises:
        ValueError: if ``pp`` is not an int >= 1.
    """
    _check_pos_int("pp", pp)
    return StagePlacement(pp, v_placement(pp).rank_of_stage, routes=2)


class PeerStages(NamedTuple):
    """Where a stage's outputs go (global stage indices; None at a pipeline end).

    Attributes:
        activations_to: stage receiving this stage's forward activations (s+1).
        gradients_to: stage receiving this stage's input gradients (s-1).
    """

    activations_to: int | None
    gradients_to: int | None


def peer_stages(stage: int, num_stages: int) -> PeerStages:
    """Peers of ``stage`` in a pipeline of ``num_stages`` stages: the forward of
    stage ``s`` sends activations to ``s+1``, the backward (B or I) sends gradients
    to ``s-1``.

    Raises:
        ValueError: if ``stage`` is outside ``0 .. num_stages-1``.
    """
    _check_pos_int("num_stages", num_stages)
    if not _is_int(stage) or not 0 <= stage < num_stages:
        raise ValueError(f"stage={stage!r} is invalid; valid: 0 .. {num_stages - 1}")
    return PeerStages(
        activations_to=stage + 1 if stage + 1 < num_stages else None,
        gradients_to=stage - 1 if stage > 0 else None,
    )


def send_target(action: Action, placement: StagePlacement) -> tuple[int, int] | None:
    """``(stage, rank)`` the output of ``action`` goes to, or None (W actions, the
    last stage's F and the first stage's B/I of a route). It is a point-to-point
    transfer only when the target rank differs from the action's own rank."""
    stage = action.stage
    if action.comp == "F" and not placement.is_last(stage):
        target = stage + 1
    elif action.comp in ("B", "I") and not placement.is_first(stage):
        target = stage - 1
    else:
        return None
    return target, placement.rank_of(target)


# --------------------------------------------------------------------------- checking & timing

Number = Union[int, float, Fraction]
Durations = Union[Number, Sequence[Number]]


def _as_placement(placement: StagePlacement | int, vpp: int = 1) -> StagePlacement:
    """A placement, or Megatron's interleaved one for ``pp`` ranks and ``vpp`` stages each."""
    if isinstance(placement, StagePlacement):
        return placement
    return interleaved_placement(placement, vpp)


def _structure(
    actions: Sequence[Sequence[Action]], placement: StagePlacement, microbatches: int | None
) -> int:
    """Check placement and completeness; return the number of micro-batches."""
    pp = placement.pp
    if len(actions) != pp:
        raise ValueError(f"actions has {len(actions)} rank lists; valid: exactly pp={pp}")
    num_stages = placement.num_stages
    rank_of = placement.rank_of_stage
    seen: dict[tuple[int, str, int], int] = {}
    mbs = set()
    for rank, row in enumerate(actions):
        for index, action in enumerate(row):
            if not isinstance(action, Action):
                raise ValueError(
                    f"actions[{rank}][{index}]={action!r} is invalid; valid: an Action"
                )
            if action.stage >= num_stages:
                raise ValueError(
                    f"action {action} on rank {rank}: stage={action.stage} is invalid; "
                    f"valid: 0 .. {num_stages - 1} ({num_stages} stages)"
                )
            if rank_of[action.stage] != rank:
                raise ValueError(
                    f"action {action} is on rank {rank}; valid: rank {rank_of[action.stage]} "
                    f"holds stage {action.stage}"
                )
            key = (action.stage, action.comp, action.microbatch)
            if key in seen:
                raise ValueError(f"action {action} appears twice on rank {rank}; valid: once")
            seen[key] = rank
            mbs.add(action.microbatch)
            _check_pair(row, index, rank)
    if microbatches is None:
        microbatches = max(mbs) + 1 if mbs else 0
        if microbatches == 0:
            raise ValueError("actions are empty; valid: at least one micro-batch")
    else:
        _check_pos_int("microbatches", microbatches)
        if mbs and max(mbs) >= microbatches:
            bad = next(a for row in actions for a in row if a.microbatch >= microbatches)
            raise ValueError(
                f"action {bad}: microbatch={bad.microbatch} is invalid; "
                f"valid: 0 .. {microbatches - 1}"
            )
    for stage in range(num_stages):
        for j in range(microbatches):
            has = {c: (stage, c, j) in seen for c in COMPUTATIONS}
            where = f"stage {stage} (rank {rank_of[stage]}), micro-batch {j}"
            if not placement.on_route(stage, j):
                if any(has.values()):
                    raise ValueError(f"{where}: micro-batch {j} takes route "
                                     f"{j % placement.routes}, which does not pass stage "
                                     f"{stage}; valid: no action there")
                continue
            if not has["F"]:
                raise ValueError(f"{where} has no forward {stage}F{j}; valid: exactly one F")
            if has["B"] and (has["I"] or has["W"]):
                raise ValueError(
                    f"{where} has both {stage}B{j} and a split I/W; valid: one B, or one I and one W"
                )
            if not has["B"] and not (has["I"] and has["W"]):
                missing = " and ".join(f"{stage}{c}{j}" for c in "IW" if not has[c])
                raise ValueError(
                    f"{where} lacks a backward ({missing} missing); valid: one B, or one I and one W"
                )
    return microbatches


def _check_pair(row: Sequence[Action], index: int, rank: int) -> None:
    """An action flagged ``overlap`` pairs with the next one: a forward and a backward
    (B or I) of one rank, the second not flagged itself."""
    action = row[index]
    if not action.overlap:
        return
    partner = row[index + 1] if index + 1 < len(row) else None
    comps = {action.comp, partner.comp} if isinstance(partner, Action) else set()
    if (partner is None or not isinstance(partner, Action) or partner.overlap
            or "F" not in comps or not comps & {"B", "I"}):
        raise ValueError(f"action {action} on rank {rank} overlaps the next action "
                         f"({partner}); valid: a forward paired with a B or I that is not "
                         "paired itself")


def _dependencies(action: Action, placement: StagePlacement,
                  has_split: set[tuple[int, int]]) -> list[tuple[int, str, int]]:
    """Keys (stage, comp, mb) of the actions ``action`` waits for ("B" in a
    key means "the stage's backward-input": B or I, resolved via has_split)."""
    s, c, j = action.stage, action.comp, action.microbatch

    def bwd_key(stage: int) -> tuple[int, str, int]:
        return (stage, "I" if (stage, j) in has_split else "B", j)

    if c == "F":
        return [] if placement.is_first(s) else [(s - 1, "F", j)]
    if c in ("B", "I"):
        deps = [(s, "F", j)]
        if not placement.is_last(s):
            deps.append(bwd_key(s + 1))
        return deps
    return [(s, "I", j)]  # W


def _as_stage_durations(name: str, value: Durations, num_stages: int) -> list[Number]:
    if isinstance(value, (list, tuple)):
        if len(value) != num_stages:
            raise ValueError(
                f"{name} has {len(value)} entries; valid: a number or one per stage "
                f"({num_stages} stages)"
            )
        values = list(value)
    else:
        values = [value] * num_stages
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Real) or not v >= 0:
            raise ValueError(f"{name}={value!r} is invalid; valid: durations >= 0")
    return values


class _Deadlock(ValueError):
    """Action lists that cannot finish; ``waiting``: (rank, position) of every rank's
    stuck action, lowest rank first."""

    def __init__(self, message: str, waiting: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.waiting = waiting


def _run(
    actions: Sequence[Sequence[Action]],
    placement: StagePlacement,
    duration,
    t_comm: Number,
    pair_duration=None,
):
    """Execute the action lists in dependency order; an overlapped pair
    (:attr:`Action.overlap`) starts when both its actions may and lasts
    ``pair_duration(first, second)`` (default: the sum of their durations).

    Returns per rank a list of (action, start, end); raises ValueError naming
    the first stuck action (lowest rank) if the lists deadlock.
    """
    pp, rank_of = placement.pp, placement.rank_of_stage
    per_edge = isinstance(t_comm, Mapping)
    has_split = {
        (a.stage, a.microbatch) for row in actions for a in row if a.comp == "I"
    }
    if pair_duration is None:
        def pair_duration(first: Action, second: Action) -> Number:
            return duration(first) + duration(second)
    finish: dict[tuple[int, str, int], object] = {}
    pos = [0] * pp
    free_at: list[Number] = [0] * pp
    spans: list[list[tuple[Action, Number, Number]]] = [[] for _ in range(pp)]
    comm_wait: list[Number] = [0] * pp
    remaining = sum(len(row) for row in actions)
    # dependencies of the action (or pair) each rank waits on, computed once
    waiting: list[list | None] = [None] * pp
    while remaining:
        progressed = False
        for rank in range(pp):
            row = actions[rank]
            while pos[rank] < len(row):
                action = row[pos[rank]]
                members = (action, row[pos[rank] + 1]) if action.overlap else (action,)
                deps = waiting[rank]
                if deps is None:
                    deps = waiting[rank] = [d for member in members
                                            for d in _dependencies(member, placement, has_split)]
                if any(d not in finish for d in deps):
                    break
                waiting[rank] = None
                start = produced = free_at[rank]
                for d in deps:
                    ready = finish[d]
                    if ready > produced:
                        produced = ready
                    if rank_of[d[0]] != rank:
                        if per_edge:
                            hop = t_comm.get((rank_of[d[0]], rank))
                            if hop is None:
                                raise ValueError(
                                    f"t_comm: no price for the hop from rank {rank_of[d[0]]} "
                                    f"to rank {rank}; valid: a mapping with every (sending "
                                    f"rank, receiving rank) pair a dependency crosses")
                            ready = ready + hop
                        else:
                            ready = ready + t_comm
                    if ready > start:
                        start = ready
                # the rank idles for the transfer itself only past the data's production
                comm_wait[rank] = comm_wait[rank] + (start - produced if start > produced else 0)
                end = start + (pair_duration(*members) if action.overlap else duration(action))
                for member in members:
                    finish[(member.stage, member.comp, member.microbatch)] = end
                    spans[rank].append((member, start, end))
                free_at[rank] = end
                pos[rank] += len(members)
                remaining -= len(members)
                progressed = True
        if not progressed:
            for rank in range(pp):
                if pos[rank] < len(actions[rank]):
                    action = actions[rank][pos[rank]]
                    members = ((action, actions[rank][pos[rank] + 1]) if action.overlap
                               else (action,))
                    missing = [
                        f"{d[0]}{d[1]}{d[2]}"
                        for member in members
                        for d in _dependencies(member, placement, has_split)
                        if d not in finish
                    ]
                    raise _Deadlock(
                        f"schedule deadlocks: action {action} (rank {rank}, position "
                        f"{pos[rank]}) waits for {', '.join(missing)}, which can never run first",
                        [(r, pos[r]) for r in range(pp) if pos[r] < len(actions[r])])
    return spans, comm_wait


def check_schedule(
    actions: Sequence[Sequence[Action]], placement: StagePlacement | int, vpp: int = 1,
    microbatches: int | None = None
) -> None:
    """Check that per-rank action lists form a complete, deadlock-free step.

    ``placement``: a :class:`StagePlacement`, or ``pp`` for Megatron's interleaved
    layout of ``vpp`` stages per rank.

    Complete: every action sits on the rank holding its stage, stages are in
    ``0 .. S-1``, and every stage ×
    micro-batch has exactly one F and either exactly one B or exactly one I
    and one W (micro-batches ``0 .. microbatches-1``; inferred as max + 1 when
    None). Deadlock-free: executing each rank's list in order under the
    module's dependency rules finishes every action.

    Raises:
        ValueError: naming the first problem found; for a deadlock, the
            stuck action of the lowest rank and the actions it waits for.
    """
    placement = _as_placement(placement, vpp)
    _structure(actions, placement, microbatches)
    _run(actions, placement, lambda a: 0, 0)


def max_inflight_microbatches(
    actions: Sequence[Sequence[Action]], *, release: str = "input"
) -> list[int]:
    """Peak number of (stage, micro-batch) activations each rank holds, from
    the order of its actions alone.

    An activation is held from the end of its F until the end of its
    release action:

    * ``release="input"`` (default, what the memory model uses): released by
      the B or the I of the same stage and micro-batch;
    * ``release="weight"``: released by the B or the W (an I keeps the
      inputs the W still needs — the zero-bubble paper's accounting).

    With several stages per rank the count is in virtual-stage units (each
    holds the activations of its own stage's layers; :func:`peak_held` weighs
    them).
    """
    if release not in ("input", "weight"):
        raise ValueError(f"release={release!r} is invalid; valid: 'input' or 'weight'")
    freeing = ("B", "I") if release == "input" else ("B", "W")
    peaks = []
    for row in actions:
        held = peak = 0
        for action in row:
            if action.comp == "F":
                held += 1
                peak = max(peak, held)
            elif action.comp in freeing:
                held -= 1
        peaks.append(peak)
    return peaks


def peak_held(actions: Sequence[Sequence[Action]], stage_bytes: Sequence[float]) -> list[float]:
    """Peak bytes of activations each rank holds, from the order of its actions: an
    activation of stage ``s`` (``stage_bytes[s]``, one micro-batch) is held from its
    F until its B or I (the memory model's accounting, ``release="input"`` of
    :func:`max_inflight_microbatches`), so stages of unequal size weigh what they
    hold.

    Immutable action lists (tuples of tuples, as :meth:`PipelineSchedule.actions`
    returns them) are walked with numpy: each rank's running total is an
    ``add.accumulate``, which adds in list order like the loop below, so the peaks are
    the same floats.

    Raises:
        ValueError: when an action's stage has no entry in ``stage_bytes``.
    """
    walk = _held_walk(actions)
    if walk is not None and walk.max_stage < len(stage_bytes):
        import numpy as np

        sizes = np.asarray(stage_bytes, dtype=np.float64)[walk.stage]
        deltas = np.where(walk.sign > 0, sizes, np.where(walk.sign < 0, -sizes, 0.0))
        held = np.add.accumulate(deltas, axis=1)
        return [float(x) for x in np.where(walk.forward, held, 0.0).max(axis=1, initial=0.0)]
    peaks = []
    for row in actions:
        held = peak = 0.0
        for action in row:
            if action.stage >= len(stage_bytes):
                raise ValueError(f"stage_bytes has {len(stage_bytes)} entries; valid: one per "
                                 f"stage (action {action})")
            if action.comp == "F":
                held += stage_bytes[action.stage]
                peak = max(peak, held)
            elif action.comp in ("B", "I"):
                held -= stage_bytes[action.stage]
        peaks.append(peak)
    return peaks


@dataclass(frozen=True)
class ScheduleTiming:
    """Result of :func:`simulate_unit_times` (times in the caller's unit).

    Attributes:
        makespan: end of the last action; every rank starts at time 0.
        busy: per rank, total duration of its actions.
        bubble_fraction: per rank, ``1 - busy[r] / makespan`` — the share of
            the step the rank is idle (warm-up, cool-down and waits). Exact
            :class:`~fractions.Fraction` when all durations are ``int`` or
            ``Fraction``, else ``float``.
        max_inflight: per rank, peak activations held between F and B/I (see
            :func:`max_inflight_microbatches`, ``release="input"``).
        max_inflight_until_w: per rank, peak held between F and B/W
            (``release="weight"``).
        spans: per rank, ``(action, start, end)`` in execution order.
        comm_wait: per rank, time it idles for point-to-point transfers: an action
            that waits for an input from another rank waits ``t_comm`` at most beyond
            the input's production (the exposed transfer).
    """

    makespan: Number
    busy: tuple[Number, ...]
    bubble_fraction: tuple[Number, ...]
    max_inflight: tuple[int, ...]
    max_inflight_until_w: tuple[int, ...]
    spans: tuple[tuple[tuple[Action, Number, Number], ...], ...]
    comm_wait: tuple[Number, ...] = ()

    @property
    def mean_bubble_fraction(self) -> Number:
        """Bubble fraction averaged over ranks (= 1 - sum(busy) / (pp * makespan))."""
        return sum(self.bubble_fraction) / len(self.bubble_fraction)


def _busy(row: Sequence[tuple[Action, Number, Number]]) -> Number:
    """Time a rank computes: its spans, an overlapped pair's (shared) span once."""
    total, paired = 0, False
    for action, start, end in row:
        if not paired:
            total = total + (end - start)
        paired = action.overlap
    return total


def simulate_unit_times(
    actions: Sequence[Sequence[Action]],
    placement: StagePlacement | int,
    vpp: int,
    t_f: Durations,
    t_b: Durations,
    t_w: Durations | None = None,
    t_comm: Number = 0,
    check: bool = True,
    t_fb: Number | Mapping[tuple[int, int], Number] | None = None,
    t_i: Durations | None = None,
) -> ScheduleTiming:
    """Exact event simulation of per-rank action lists with fixed durations.

    Each action starts when its rank has finished the previous action of its
    list and all its dependencies (module docstring) have finished; a
    dependency produced on another rank arrives ``t_comm`` later (a
    point-to-point transfer that does not occupy either rank's compute).
    There is no other contention, so the result is the earliest-start
    timing of the given order.

    Args:
        actions: per-rank action lists (checked with :func:`check_schedule`).
        placement, vpp: a :class:`StagePlacement` (``vpp`` ignored), or ``pp``
            and ``vpp`` for Megatron's interleaved layout.
        t_f: forward duration of one virtual stage on one micro-batch; a
            number, or a sequence with one entry per global stage.
        t_b: duration of the FULL backward (input + weight gradients) of one
            virtual stage on one micro-batch; B actions take ``t_b``.
        t_w: weight-gradient part of the backward. Required when the lists
            contain I/W actions: W takes ``t_w`` and I takes ``t_b - t_w``, so
            split and unsplit schedules do the same total work. Ignored for
            lists with only B.
        t_comm: point-to-point latency between ranks (>= 0), or per pair of ranks
            ``{(sending rank, receiving rank): latency}`` (every pair a dependency
            crosses; a pipeline whose hops cross nodes in some places only).
        check: validate the lists' structure first (:func:`check_schedule`); lists
            from :func:`schedule_actions` may skip it.
        t_i: input-gradient part of the backward when it is not ``t_b - t_w`` (a
            full backward overlaps its two parts' communication better than the two
            split actions do): I takes ``t_i``.
        t_fb: duration of an overlapped forward-backward pair (DualPipe's ``F&B``):
            a number for every pair, or ``{(forward stage, backward stage):
            duration}``; None (or a pair missing from the mapping) takes the sum of
            the two actions' durations.

    Returns:
        :class:`ScheduleTiming` (a pair counts once in ``busy``).

    Raises:
        ValueError: on incomplete or deadlocking lists, negative durations,
            missing ``t_w`` for split lists, or ``t_w > t_b``.
    """
    placement = _as_placement(placement, vpp)
    if check:
        _structure(actions, placement, None)
    num_stages = placement.num_stages
    tf = _as_stage_durations("t_f", t_f, num_stages)
    tb = _as_stage_durations("t_b", t_b, num_stages)
    split = any(a.comp in ("I", "W") for row in actions for a in row)
    if split:
        if t_w is None:
            raise ValueError(
                "t_w=None is invalid for lists with I/W actions; valid: the weight-gradient "
                "duration, 0 <= t_w <= t_b"
            )
        tw = _as_stage_durations("t_w", t_w, num_stages)
        for s in range(num_stages):
            if tw[s] > tb[s]:
                raise ValueError(
                    f"t_w={tw[s]!r} exceeds t_b={tb[s]!r} at stage {s}; valid: 0 <= t_w <= t_b "
                    f"(I takes t_b - t_w)"
                )
    else:
        tw = [0] * num_stages
    ti = ([b - w for b, w in zip(tb, tw)] if t_i is None
          else _as_stage_durations("t_i", t_i, num_stages))
    for value in (t_comm.values() if isinstance(t_comm, Mapping) else (t_comm,)):
        if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0:
            raise ValueError(f"t_comm={value!r} is invalid; valid: a duration >= 0 (or a "
                             "mapping of rank pairs to durations >= 0)")

    def duration(action: Action) -> Number:
        s = action.stage
        if action.comp == "F":
            return tf[s]
        if action.comp == "B":
            return tb[s]
        if action.comp == "I":
            return ti[s]
        return tw[s]

    pair_values: list[Number] = []

    def pair_duration(first: Action, second: Action) -> Number:
        forward, backward = (first, second) if first.comp == "F" else (second, first)
        if t_fb is None:
            found = None
        elif isinstance(t_fb, Mapping):
            found = t_fb.get((forward.stage, backward.stage))
        else:
            found = t_fb
        if found is None:
            return duration(first) + duration(second)
        if isinstance(found, bool) or not isinstance(found, Real) or not found >= 0:
            raise ValueError(f"t_fb={found!r} is invalid; valid: durations >= 0")
        pair_values.append(found)
        return found

    spans, comm_wait = _run(actions, placement, duration, t_comm, pair_duration)
    ends = [row[-1][2] for row in spans if row]
    makespan = max(ends) if ends else 0
    busy = tuple(_busy(row) for row in spans)
    comms = list(t_comm.values()) if isinstance(t_comm, Mapping) else [t_comm]
    exact = all(
        isinstance(v, Rational) for v in [*tf, *tb, *tw, *ti, *comms, *pair_values]
    )
    if makespan == 0:
        bubble = tuple(0 for _ in busy)
    elif exact:
        bubble = tuple(1 - Fraction(b) / Fraction(makespan) for b in busy)
    else:
        bubble = tuple(1 - b / makespan for b in busy)
    return ScheduleTiming(
        makespan=makespan,
        busy=busy,
        bubble_fraction=bubble,
        max_inflight=tuple(max_inflight_microbatches(actions, release="input")),
        max_inflight_until_w=tuple(max_inflight_microbatches(actions, release="weight")),
        spans=tuple(tuple(row) for row in spans),
        comm_wait=tuple(comm_wait),
    )


# --------------------------------------------------------------------------- compiled walks
#
# A sweep or a plan search replays the same few action lists (one per schedule, pp,
# micro-batch count and vpp) with thousands of duration vectors. The lists are turned
# once into flat arrays (a dependency order for the replay, per-rank stage and sign
# arrays for the memory walk), kept in small LRU caches keyed by the identity of the
# immutable lists (the entry keeps them alive, so an id cannot be reused while cached).
# They hold no simulation state: every entry is a function of its key.

#: Compiled action lists kept (each is O(actions); a few hundred KiB at most).
_COMPILED_MAX = 64
#: Replay results kept per compiled list (duration vectors of one sweep).
_RESULTS_MAX = 512


class _HeldWalk(NamedTuple):
    """Per-rank arrays of the memory walk, padded to the longest rank with W-like
    no-ops: stage index, +1 (F) / -1 (B, I) / 0, and whether the action is an F."""

    stage: object
    sign: object
    forward: object
    max_stage: int


_HELD_WALKS: OrderedDict = OrderedDict()


def _held_walk(actions) -> _HeldWalk | None:
    """The compiled memory walk of immutable ``actions`` (None for mutable lists)."""
    if not isinstance(actions, tuple) or not all(isinstance(row, tuple) for row in actions):
        return None
    key = id(actions)
    found = _HELD_WALKS.get(key)
    if found is not None and found[0] is actions:
        _HELD_WALKS.move_to_end(key)
        return found[1]
    import numpy as np

    width = max((len(row) for row in actions), default=0)
    stage = np.zeros((len(actions), width), dtype=np.int64)
    sign = np.zeros((len(actions), width), dtype=np.float64)
    forward = np.zeros((len(actions), width), dtype=bool)
    for r, row in enumerate(actions):
        for i, action in enumerate(row):
            stage[r, i] = action.stage
            if action.comp == "F":
                sign[r, i], forward[r, i] = 1.0, True
            elif action.comp in ("B", "I"):
                sign[r, i] = -1.0
    walk = _HeldWalk(stage, sign, forward, int(stage.max(initial=0)))
    _HELD_WALKS[key] = (actions, walk)
    if len(_HELD_WALKS) > _COMPILED_MAX:
        _HELD_WALKS.popitem(last=False)
    return walk


class _Replay(NamedTuple):
    """An action list compiled for :func:`replay_timing`: per unit (an action, or an
    overlapped pair) in the order :func:`_run` executes them, ``(rank, duration index,
    pair, dependencies)`` with the dependencies as ``(unit position, edge)``, the edge
    0 on the same rank, else 1 + the index of its pair of ranks in ``edges``;
    the duration index is ``comp * stages + stage`` of a single action (F, B, I, W) or
    of a pair's forward (``pair`` then holds the backward's (stage, comp) and the
    forward's stage); each rank's first and last unit (-1: none); and each rank's tail
    (:func:`_tails`: its units from the first that runs the last micro-batch's backward
    on, as ``(unit, stage, comp, micro-batches before the stage's last)``; None when one
    of them is in an overlapped pair)."""

    units: tuple[tuple[int, int, tuple | None, tuple[tuple[int, int], ...]], ...]
    first: tuple[int, ...]
    last: tuple[int, ...]
    pp: int
    split: bool
    results: OrderedDict
    tails: tuple[tuple[tuple[int, int, str, int], ...] | None, ...] = ()
    edges: tuple[tuple[int, int], ...] = ()


_REPLAYS: OrderedDict = OrderedDict()
_COMP_INDEX = {"F": 0, "B": 1, "I": 2, "W": 3}


def _compile_replay(actions, placement: StagePlacement) -> _Replay | None:
    """Order the units as :func:`_run` executes them (a dependency order) and resolve
    their dependencies to positions; None when the lists deadlock (the caller then
    runs :func:`_run`, which names the stuck action)."""
    pp, num_stages, rank_of = placement.pp, placement.num_stages, placement.rank_of_stage
    has_split = {(a.stage, a.microbatch) for row in actions for a in row if a.comp == "I"}
    position: dict[tuple[int, str, int], int] = {}
    edges: dict[tuple[int, int], int] = {}
    units = []
    pos = [0] * pp
    remaining = sum(len(row) for row in actions)
    while remaining:
        progressed = False
        for rank in range(pp):
            row = actions[rank]
            while pos[rank] < len(row):
                action = row[pos[rank]]
                members = (action, row[pos[rank] + 1]) if action.overlap else (action,)
                deps = [d for member in members
                        for d in _dependencies(member, placement, has_split)]
                if any(d not in position for d in deps):
                    break
                refs = tuple((position[d], _edge(edges, rank_of[d[0]], rank)) for d in deps)
                if action.overlap:
                    forward, backward = members if members[0].comp == "F" else members[::-1]
                    units.append((rank, forward.stage, (backward.stage,
                                                        _COMP_INDEX[backward.comp]), refs))
                else:
                    units.append((rank, _COMP_INDEX[action.comp] * num_stages + action.stage,
                                  None, refs))
                for member in members:
                    position[(member.stage, member.comp, member.microbatch)] = len(units) - 1
                pos[rank] += len(members)
                remaining -= len(members)
                progressed = True
        if not progressed:
            return None
    first, last = [-1] * pp, [-1] * pp
    for k, unit in enumerate(units):
        if first[unit[0]] < 0:
            first[unit[0]] = k
        last[unit[0]] = k
    return _Replay(tuple(units), tuple(first), tuple(last), pp, bool(has_split), OrderedDict(),
                   _tails(actions, position), tuple(edges))


def _edge(edges: dict[tuple[int, int], int], source: int, rank: int) -> int:
    """0 for a dependency on the same rank, else the 1-based index of the pair of ranks
    ``(source, rank)`` in ``edges`` (added when new)."""
    if source == rank:
        return 0
    return edges.setdefault((source, rank), len(edges) + 1)


def _tails(actions, position: Mapping[tuple[int, str, int], int]
           ) -> tuple[tuple[tuple[int, int, str, int], ...] | None, ...]:
    """Per rank, its units from the first that runs the last micro-batch's backward (B,
    or I and W) through one of its stages to its end -- the last micro-batch through a
    stage is the largest that any list runs there (its route's last) -- as ``(unit
    position, stage, comp, how many micro-batches before the stage's last)``: the
    backwards with 0 are where the gradients of the step are complete and their
    data-parallel reduction starts (Megatron-Core's DDP reduces a bucket when its last
    micro-batch's gradients are in: megatron/core/distributed/param_and_grad_buffer.py,
    ``register_grad_ready``). None for a rank where one of them runs in an overlapped
    pair (its two actions' kernels interleaved)."""
    last_mb: dict[int, int] = {}
    for row in actions:
        for a in row:
            if a.microbatch > last_mb.get(a.stage, -1):
                last_mb[a.stage] = a.microbatch
    out: list[tuple[tuple[int, int, str, int], ...] | None] = []
    for row in actions:
        found: list[tuple[int, int, str, int]] | None = []
        started = False
        for index, a in enumerate(row):
            started = started or (a.comp != "F" and a.microbatch == last_mb[a.stage])
            if not started:
                continue
            if a.overlap or (index and row[index - 1].overlap):
                found = None
                break
            found.append((position[(a.stage, a.comp, a.microbatch)], a.stage, a.comp,
                          last_mb[a.stage] - a.microbatch))
        out.append(None if found is None else tuple(found))
    return tuple(out)


def _compiled(actions, placement: StagePlacement) -> _Replay | None:
    """The compiled replay of immutable ``actions`` (None for mutable or deadlocking
    lists), kept in a small LRU table keyed by the lists' identity."""
    if not isinstance(actions, tuple) or not all(isinstance(row, tuple) for row in actions):
        return None
    key = (id(actions), placement)
    entry = _REPLAYS.get(key)
    if entry is not None and entry[0] is actions:
        _REPLAYS.move_to_end(key)
        return entry[1]
    compiled = _compile_replay(actions, placement)
    if compiled is not None:
        _REPLAYS[key] = (actions, compiled)
        if len(_REPLAYS) > _COMPILED_MAX:
            _REPLAYS.popitem(last=False)
    return compiled


def replay_timing(actions: Sequence[Sequence[Action]], placement: StagePlacement,
                  t_f: Sequence[int], t_b: Sequence[int], t_w: Sequence[int] | None,
                  t_comm: int | Mapping[tuple[int, int], int],
                  t_fb: Mapping[tuple[int, int], int] | None = None,
                  t_i: Sequence[int] | None = None, tails: bool = False) -> tuple:
    """``(makespan, each rank's last end, each rank's first start, each rank's wait for
    transfers)`` of :func:`simulate_unit_times` on already-checked lists
    (``check=False``) with integer durations per stage (0 for a rank without actions).
    With ``tails`` a fifth entry: per rank, its actions from the first that runs the last
    micro-batch's backward through one of its stages on (:func:`_tails`) as ``(stage,
    comp, micro-batches before the stage's last, start)`` (None for a rank where one runs
    in an overlapped pair, and for every rank of lists replayed by
    :func:`simulate_unit_times`).

    The same earliest-start recurrence as :func:`_run` (a unit starts at the later of
    its rank's previous end and each dependency's end, plus ``t_comm`` across ranks (one
    price, or one per pair of ranks: :func:`simulate_unit_times`);
    the rank's wait for a transfer is the start past the latest production), over a
    dependency order compiled once per immutable action list and memoised per
    duration vector, so the same sums and maxima give the same integers. Mutable
    lists, and durations that are not integers, are replayed by
    :func:`simulate_unit_times` itself (which also raises its errors).

    Raises:
        ValueError: as :func:`simulate_unit_times` (deadlocks, bad durations).
    """
    compiled = _compiled(actions, placement)
    num_stages = placement.num_stages
    tw = list(t_w) if t_w is not None else [0] * len(t_f)
    ti = list(t_i) if t_i is not None else [b - w for b, w in zip(t_b, tw)]
    pairs = dict(t_fb) if isinstance(t_fb, Mapping) else {}
    values = (*t_f, *t_b, *tw, *ti, *pairs.values())
    per_edge = isinstance(t_comm, Mapping)
    comm: tuple | None = None
    if compiled is not None:
        if per_edge:
            found_comm = [t_comm.get(edge) for edge in compiled.edges]
            comm = None if None in found_comm else (0, *found_comm)
        else:
            comm = (0,) + (t_comm,) * len(compiled.edges)
    if (compiled is None or (t_fb is not None and not isinstance(t_fb, Mapping)) or not all(_is_int(v) and v >= 0 for v in values)
            or comm is None or not all(_is_int(c) and c >= 0 for c in comm)
            or any(len(v) != num_stages for v in (t_f, t_b, tw, ti))
            or (compiled.split and t_w is None) or any(w > b for w, b in zip(tw, t_b))):
        timing = simulate_unit_times(actions, placement, placement.stages_per_rank, list(t_f),
                                     list(t_b), None if t_w is None else list(t_w), t_comm,
                                     check=False, t_fb=t_fb,
                                     t_i=None if t_i is None else list(t_i))
        found = (timing.makespan, tuple(row[-1][2] if row else 0 for row in timing.spans),
                 tuple(row[0][1] if row else 0 for row in timing.spans),
                 tuple(timing.comm_wait))
        return (*found, (None,) * len(actions)) if tails else found
    durations = (*t_f, *t_b, *ti, *tw)
    memo_key = (durations, comm, tuple(sorted(pairs.items())))
    found = compiled.results.get(memo_key)
    if found is not None:
        compiled.results.move_to_end(memo_key)
        return found if tails else found[:4]
    end = [0] * len(compiled.units)
    start_of = [0] * len(compiled.units)
    free = [0] * compiled.pp
    wait = [0] * compiled.pp
    for k, (rank, which, pair, deps) in enumerate(compiled.units):
        start = produced = free[rank]
        for dep, edge in deps:
            ready = end[dep]
            if ready > produced:
                produced = ready
            if edge:
                ready += comm[edge]
            if ready > start:
                start = ready
        if start > produced:
            wait[rank] += start - produced
        if pair is None:
            duration = durations[which]
        else:  # which: the forward's stage; pair: the backward's stage and comp index
            duration = pairs.get((which, pair[0]))
            if duration is None:
                duration = durations[which] + durations[pair[1] * num_stages + pair[0]]
        start_of[k] = start
        free[rank] = end[k] = start + duration
    found = (max((end[k] for k in compiled.last if k >= 0), default=0),
             tuple(end[k] if k >= 0 else 0 for k in compiled.last),
             tuple(start_of[k] if k >= 0 else 0 for k in compiled.first),
             tuple(wait),
             tuple(None if row is None else tuple((stage, comp, back, start_of[k])
                                                  for k, stage, comp, back in row)
                   for row in compiled.tails))
    compiled.results[memo_key] = found
    if len(compiled.results) > _RESULTS_MAX:
        compiled.results.popitem(last=False)
    return found if tails else found[:4]


# --------------------------------------------------------------------------- 1F1B family
#
# GPipe, 1F1B and interleaved 1F1B order each rank the same way (Megatron-Core,
# megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with(out)
# _interleaving; Narayanan et al. 2021, §2.2): rank r walks T = m v "virtual"
# micro-batches k; it runs w_r warm-up forwards F_0 .. F_{w_r-1}, then pairs
# (F_{w_r+q}, B_q), then the remaining backwards B_{T-w_r} .. B_{T-1}. Virtual k runs
# chunk c = (k mod p v) // p forwards and chunk v - 1 - c backwards, so the stage of F_k
# on rank r is c p + r and that of B_k is (v - 1 - c) p + r (one chunk: stage r).
# F_k on rank r needs F_k of rank r - 1, or on rank 0 with c > 0 F_{k-p} of rank p - 1
# (the previous chunk); B_k on rank r needs B_k of rank r + 1, or on rank p - 1 with
# c > 0 B_{k-p} of rank 0; the F a backward also needs precedes it on its own rank.


def one_f_one_b_family_timing(pp: int, microbatches: int, vpp: int,
                              warmups: Sequence[int], t_f: Sequence[int],
                              t_b: Sequence[int], t_comm: int
                              ) -> tuple[int, tuple[int, ...], tuple[int, ...],
                                         tuple[int, ...]]:
    """:func:`replay_timing` of a 1F1B-family order (module comment above) given by
    each rank's warm-up forwards ``warmups`` on Megatron's interleaved placement, with
    integer durations per stage: ``(makespan, each rank's last end, each rank's first
    start, each rank's wait for transfers)``, the same integers, without building
    the action lists.

    The earliest-start recurrence (a unit starts at the later of its rank's previous
    end and its input's end plus ``t_comm`` across ranks) runs in position order:
    rank ``r``'s ``i``-th action is F_i while ``i < w_r``, then F and B alternately,
    then B_{i-T}; every input comes from an earlier position or, within a position,
    a forward from the rank above or a backward from the rank below, so each position
    does its forwards by rising rank, then its backwards by falling rank. While every
    rank is in its 1F-1B phase (positions ``w_max .. 2T - w_max - 1``), an input is at
    most two positions old and the orders repeat every ``P = 2 p v`` positions (2 for
    one chunk) with virtual index ``k + p v``; so when the ends of two consecutive
    positions are those ``P`` earlier plus one constant ``d`` on every rank, the
    recurrence from there is the one from ``P`` earlier shifted by ``d``, and whole
    periods up to the first cool-down are skipped exactly (ends plus ``n d``, waits
    plus ``n`` times the last period's). Cost: the warm-up, the cool-down and the
    periods until the ends repeat, not the micro-batch count.

    Long pipelines with whole-number durations (where the cost model
    :func:`_vector_pays` says so) solve the same recurrence rank by rank in numpy
    instead (:func:`_family_timing_vector`: the same integers, checked as the fixed
    point of every unit's equation); the others walk positions
    (:func:`_family_timing_scalar`).

    Raises:
        ValueError: for a shape or durations it cannot time (one line, naming it).
    """
    p, v = pp, vpp
    total = microbatches * v
    stages = p * v
    if len(warmups) != p or any(not 0 <= w <= total for w in warmups):
        raise ValueError(f"warmups={tuple(warmups)!r} is invalid; valid: {p} counts "
                         f"in 0 .. {total}")
    if len(t_f) != stages or len(t_b) != stages:
        raise ValueError(f"t_f/t_b have {len(t_f)}/{len(t_b)} entries; valid: {stages} "
                         "(one per stage)")
    if _vector_pays(p, total, v, max(warmups)) and _vector_exact(microbatches, t_f, t_b,
                                                                 t_comm):
        found = _family_timing_vector(p, microbatches, v, tuple(warmups), t_f, t_b, t_comm)
        if found is not None:
            return found
    return _family_timing_scalar(p, microbatches, v, warmups, t_f, t_b, t_comm)


def _family_timing_scalar(pp: int, microbatches: int, vpp: int, warmups: Sequence[int],
                          t_f: Sequence[int], t_b: Sequence[int], t_comm: int
                          ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """:func:`one_f_one_b_family_timing` (arguments already checked) walking positions
    in order with the exact period skip (any real durations): the units of
    :func:`one_f_one_b_family_walk` with no gathers (each ends at ``start + D``; the
    offset ``-(D + 1)`` never binds, the stream stays at 0)."""
    p, v = pp, vpp
    walkers = [_Durations(tuple(tuple((d, 0, -(d + 1)) for d in row) for row in (
        [t_b[ch * p + r] for ch in range(v)],
        [t_f[ch * p + r] for ch in range(v)]))) for r in range(p)]
    walk = one_f_one_b_family_walk(p, microbatches, v, warmups, t_comm, walkers,
                                   reducing=False)
    # (every rank's first action is F_0 of chunk 0: it starts where its end less its
    # duration says)
    first_start = (tuple(walk.first_end[r] - t_f[r] for r in range(p))
                   if microbatches * v else (0,) * p)
    return walk.makespan, walk.rank_end, first_start, walk.rank_comm_wait


class _Durations(NamedTuple):
    """A rank's units for :func:`one_f_one_b_family_walk` without gathers: ``plain``
    (backward, forward rows by chunk of ``(duration, 0, -(duration + 1))``)."""

    plain: tuple


# Numpy form of the same recurrence. Rank r's units, in its list order j = 0 .. 2T - 1,
# satisfy E_j = max(E_{j-1}, D_j) + d_j (E_{-1} = 0) with D_j its input's end (plus
# t_comm across ranks; 0 without an input). Given D, the whole row is a prefix
# maximum: E_j = S_j + max_{i <= j} (D_i - S_{i-1}) with S the row's running sum of
# durations (D >= 0 covers the E_{-1} = 0 term), one np.maximum.accumulate. Rows are
# recomputed from their inputs' current ends, ranks 0 .. p - 1 then p - 1 .. 0
# (forwards flow down, backwards up), until one step recomputing every row at once
# changes nothing: then every unit's equation holds. The walk's order reads every
# input already computed (checked once per shape, _vector_layout), so units and
# inputs form an acyclic graph, whose equations have one solution: the one the walk
# computes, to the integer. (Rows are kept as G = E - S; _family_timing_vectors.)
# Long shapes take the walk's period skip in rows: solved with whole periods fewer
# micro-batches, the missing periods inserted where the short solution repeats
# (_period_microbatches, _solve_rows).

#: Sweep rounds (down and up) the numpy rows may take, per model chunk, before they
#: give way to the position walk, plus a few: the benchmark's interleaved shapes settle
#: in 2-3 rounds at vpp 2, 600 random interleaved shapes in at most 2 vpp - 1; random
#: durations dominated by t_comm can take tens (each chunk's pass around the ring and
#: each bounce between neighbours is a round), where the walk is the cheaper.
_VECTOR_ROUNDS_PER_CHUNK = 2
_VECTOR_ROUNDS_EXTRA = 4
#: The cost model of :func:`_vector_pays` (microseconds on this project's 2-core
#: benchmark machine, best of 15): the walk per rank and position it visits, the numpy
#: form's fixed cost per call, and the positions of a row that cost one more microsecond
#: on top of the microsecond every recomputed row costs.
_WALK_US_PER_RANK_POSITION = 0.45
_VECTOR_CALL_US = 60
_VECTOR_ROW_POSITIONS_PER_US = 60


def _period_positions(pp: int, vpp: int) -> int:
    """Positions of one period of a 1F1B-family schedule's steady state (all 1F-1B):
    ``2 pp vpp`` with interleaving (it moves ``pp`` micro-batches), 2 with one chunk
    (one micro-batch): what the position walk's period skip, its cost model and the
    numpy rows' period check all step by."""
    return 2 * pp * vpp if vpp > 1 else 2


def _walk_us(pp: int, total: int, vpp: int, w_max: int) -> float:
    """The position walk's cost in microseconds (a cost model:
    :data:`_WALK_US_PER_RANK_POSITION` per rank and position it visits): the warm-up,
    two periods and the cool-down once the period skip applies (a period is
    ``2 pp vpp`` positions, 2 for one chunk: :func:`one_f_one_b_family_timing`), all
    ``2 * total`` positions at most."""
    period = _period_positions(pp, vpp)
    walked = min(2 * total, 2 * w_max + 2 * period + 2)
    return _WALK_US_PER_RANK_POSITION * pp * walked


def _rows_us(pp: int, rounds: int, positions: int) -> float:
    """The numpy rows' cost in microseconds (cost model): :data:`_VECTOR_CALL_US` per
    call plus, per row recomputed (2 ``pp`` a round over ``rounds`` rounds), one
    microsecond and one more per :data:`_VECTOR_ROW_POSITIONS_PER_US` of the row's
    ``positions`` (of every set a batch solves together)."""
    rows = 2 * pp * rounds
    return _VECTOR_CALL_US + rows * (1 + positions / _VECTOR_ROW_POSITIONS_PER_US)


def _vector_pays(pp: int, total: int, vpp: int, w_max: int) -> bool:
    """Whether the numpy form should be cheaper than the position walk (a cost model
    only, never a result): the walk ~0.45 us per rank and position it visits
    (:func:`_walk_us`), the numpy form ~60 us plus ~(1 + positions / 60) us per row
    recomputed, 2 pp rows a round and up to 2 vpp - 1 rounds (:func:`_rows_us`;
    measured on the GPT-3/llama benchmark shapes, best of 15; rounds on 600 random
    interleaved shapes). One chunk (vpp 1) always walks: its rounds are not
    predictable (equal stages with t_comm > 0 took up to 25, the walk's period skip
    caps its cost) and the gain was small where they were few."""
    if vpp == 1:
        return False
    return (_walk_us(pp, total, vpp, w_max)
            > _rows_us(pp, 2 * vpp - 1, _rows_positions(pp, total, vpp, w_max)))


def _rows_positions(pp: int, total: int, vpp: int, w_max: int) -> int:
    """The positions of a row the numpy rows solve for a shape of ``total`` virtual
    micro-batches: those of the shortened shape (:func:`_short_microbatches`; a cost
    model's figure only)."""
    return 2 * vpp * _short_microbatches(pp, total // vpp, vpp, w_max)


def _vector_exact(microbatches: int, t_f: Sequence, t_b: Sequence, t_comm: object) -> bool:
    """Whether int64 arithmetic gives the recurrence's integers: whole-number
    durations >= 0 (Python ints) and every end below 2**62 (no end exceeds every
    unit's duration plus ``t_comm``, summed over the ``2 * microbatches * stages``
    units)."""
    if type(t_comm) is not int or t_comm < 0:
        return False
    if not all(type(x) is int and x >= 0 for x in (*t_f, *t_b)):
        return False
    units = 2 * microbatches * len(t_f)
    return microbatches * (sum(t_f) + sum(t_b)) + units * t_comm < 2 ** 62


@lru_cache(maxsize=128)
def _vector_layout(pp: int, microbatches: int, vpp: int, warmups: tuple[int, ...]):
    """Per rank and list position of the 1F1B-family order: the duration index (into
    ``t_f + t_b``), the flat index of the input unit (``pp * n``: none, a zero end),
    whether the input crosses ranks, and ``n = 2 m v`` -- all as numpy arrays; None
    when the position walk's order would read an input not yet computed."""
    import numpy as np

    p, v = pp, vpp
    total = microbatches * v
    group, n, stages = p * v, 2 * total, p * v
    w = np.asarray(warmups, dtype=np.int64)[:, None]
    k = np.arange(total, dtype=np.int64)
    # F_k at position k in the warm-up, else w + 2 (k - w); B_k at w + 2 k + 1, or
    # k + T in the cool-down (the order of one_f_one_b_family_timing): with 0 <= w <= T
    # the two fill every position 0 .. 2T - 1 once
    pos_f = np.where(k < w, k, 2 * k - w)
    pos_b = np.where(k < total - w, w + 2 * k + 1, k + total)
    rank = np.arange(p, dtype=np.int64)[:, None]
    chunk = (k % group) // p
    wrap = (k % group) >= p  # rank 0 (F) / p - 1 (B) read the previous chunk
    back = np.maximum(k - p, 0)
    none = p * n
    row_start = rank * n
    # each rank's units by virtual index, F_0 .. F_{T-1} then B_0 .. B_{T-1} (p, n):
    # their duration index, input and whether it crosses ranks, then put in list order
    # by one scatter of the units' numbers to their positions and a gather per array
    # (a scatter per array and per direction cost twice as much on the long shapes)
    unit = np.empty((p, n), dtype=np.int64)
    unit[:, :total] = chunk * p + rank
    unit[:, total:] = stages + (v - 1 - chunk) * p + rank
    unit_dep = np.empty((p, n), dtype=np.int64)
    unit_dep[1:, :total] = row_start[:-1] + pos_f[:-1]
    unit_dep[0, :total] = np.where(wrap, (p - 1) * n + pos_f[p - 1, back], none)
    unit_dep[:-1, total:] = row_start[1:] + pos_b[1:]
    unit_dep[p - 1, total:] = np.where(wrap, pos_b[0, back], none)
    unit_far = np.ones((p, n), dtype=bool)
    unit_far[0, :total] = wrap & (p > 1)
    unit_far[p - 1, total:] = wrap & (p > 1)
    unit_at = np.empty(p * n, dtype=np.int64)  # the unit at each (rank, position)
    unit_at[np.concatenate((pos_f + row_start, pos_b + row_start), axis=1)] = np.arange(
        p * n, dtype=np.int64).reshape(p, n)
    index = unit.reshape(-1).take(unit_at).reshape(p, n)
    dep = unit_dep.reshape(-1).take(unit_at).reshape(p, n)
    far = unit_far.reshape(-1).take(unit_at).reshape(p, n)
    # the walk's order (position, its forwards by rising rank, then its backwards by
    # falling rank) must read every input already computed: then the units form an
    # acyclic graph, its one solution is what the walk computes, and the rows' fixed
    # point is that solution (warm-up counts of no schedule may break it: the walk then)
    is_b = index >= stages
    order = np.empty(p * n + 1, dtype=np.int64)
    order[:-1] = ((np.arange(n)[None, :] * 2 + is_b) * p
                  + np.where(is_b, p - 1 - rank, rank)).reshape(-1)
    order[-1] = -1  # ("no input": before everything)
    if not (order.take(dep.reshape(-1)) < order[:-1]).all():
        return None
    for shared in (index, dep, far):  # (cached: every caller reads the same arrays)
        shared.flags.writeable = False
    return index, dep, far, n


def _family_timing_vector(pp: int, microbatches: int, vpp: int, warmups: tuple[int, ...],
                          t_f: Sequence[int], t_b: Sequence[int], t_comm: int,
                          rounds_max: int | None = None
                          ) -> tuple[int, tuple[int, ...], tuple[int, ...],
                                     tuple[int, ...]] | None:
    """:func:`one_f_one_b_family_timing` (arguments checked, durations whole numbers
    >= 0 with ends below 2**62: :func:`_vector_exact`) by the numpy rows of the
    comment above (:func:`_family_timing_vectors` of the one set); None if the rows
    have not settled after ``rounds_max`` rounds (the position walk then times it)."""
    return _family_timing_vectors(pp, microbatches, vpp, warmups, [(t_f, t_b)], t_comm,
                                  rounds_max)[0]


#: The cost model of :func:`_batch_pays` (same units as :func:`_vector_pays`): sweep
#: rounds the numpy rows of a batch take at least (the benchmark's one-chunk groups
#: settle in 1-3; interleaved ones in 2 vpp - 1, as one set does), and the positions of
#: all sets of a batch of shapes :func:`_vector_pays` gives the rows up to which one pass
#: for all still costs less than one per set (above it the elements, not the calls,
#: make the time). With the rows shortened to whole periods fewer
#: (:func:`_period_microbatches`) the GPT-3 benchmark's pp 16 x vpp 2 groups are 9 sets
#: of 192 positions: batched, the benchmark's pipeline calls take 114 -> 101 M
#: instructions (callgrind); 960 (the figure before the shortening, when those groups
#: were 1,700-2,300 positions a set) left them per set.
_BATCH_ROUNDS = 3
_BATCH_VECTOR_POSITIONS = 2048


def _batch_pays(pp: int, total: int, vpp: int, w_max: int, count: int) -> bool:
    """Whether the numpy rows of ``count`` duration sets at once
    (:func:`one_f_one_b_family_timings`) should be cheaper than timing each (a cost
    model only, never a result). Shapes one call would time by the rows
    (:func:`_vector_pays`): while the sets' positions together stay below
    :data:`_BATCH_VECTOR_POSITIONS`. Shapes one call walks: at least as many positions
    as ranks, and ~60 us plus ~(1 + count * positions / 60) us per row recomputed over
    at least :data:`_BATCH_ROUNDS` rounds below the walk's ~0.45 us per rank and
    position (best of 5 on the GPT-3/llama benchmark groups: 2-5x faster than the walks
    where it says so)."""
    if count < 2:
        return False
    positions = _rows_positions(pp, total, vpp, w_max)
    if _vector_pays(pp, total, vpp, w_max):
        return count * positions <= _BATCH_VECTOR_POSITIONS
    if positions < pp:
        return False
    return (count * _walk_us(pp, total, vpp, w_max)
            > _rows_us(pp, max(2 * vpp - 1, _BATCH_ROUNDS), count * positions))


def one_f_one_b_family_timings(pp: int, microbatches: int, vpp: int,
                               warmups: Sequence[int],
                               durations: Sequence[tuple[Sequence[int], Sequence[int]]],
                               t_comm: int) -> list[tuple[int, tuple[int, ...],
                                                          tuple[int, ...],
                                                          tuple[int, ...]]]:
    """:func:`one_f_one_b_family_timing` of one shape for several duration sets
    ``durations`` (``(t_f, t_b)`` each), in order: the same integers. Where
    :func:`_batch_pays` says so (shapes each call would walk), the numpy rows
    solve every set at once (:func:`_family_timing_vectors`); a set whose rows have
    not settled, or whose ends could pass 2**62, is walked.

    Raises:
        ValueError: as :func:`one_f_one_b_family_timing`, for the first set it refuses.
    """
    total = microbatches * vpp
    # (warm-up counts the single call refuses: it raises, for the first set)
    if (not durations or len(warmups) != pp or any(not 0 <= w <= total for w in warmups)
            or not _batch_pays(pp, total, vpp, max(warmups, default=0), len(durations))):
        return [one_f_one_b_family_timing(pp, microbatches, vpp, warmups, t_f, t_b, t_comm)
                for t_f, t_b in durations]
    out: list = [None] * len(durations)
    exact = []
    for index, (t_f, t_b) in enumerate(durations):
        # (a set the single call would refuse, or time without int64 rows: that call)
        if (len(t_f) != pp * vpp or len(t_b) != pp * vpp
                or not _vector_exact(microbatches, t_f, t_b, t_comm)):
            out[index] = one_f_one_b_family_timing(pp, microbatches, vpp, warmups, t_f,
                                                   t_b, t_comm)
        else:
            exact.append(index)
    if len(exact) > 1:
        solved = _family_timing_vectors(pp, microbatches, vpp, tuple(warmups),
                                        [durations[i] for i in exact], t_comm)
        for index, found in zip(exact, solved):
            out[index] = found
    for index in exact:
        if out[index] is None:
            t_f, t_b = durations[index]
            out[index] = _family_timing_scalar(pp, microbatches, vpp, warmups, t_f, t_b,
                                               t_comm)
    return out


def _period_microbatches(pp: int, microbatches: int, vpp: int,
                         warmups: Sequence[int]) -> int:
    """The micro-batches the numpy rows solve for a shape of ``microbatches`` (at most
    that): the fewest, in whole periods fewer (a period of ``2 pp vpp`` positions moves
    ``pp`` micro-batches, one at one chunk: :func:`one_f_one_b_family_timing`), whose
    all-1F-1B window still holds the walk's first possible period check (position
    ``w_max + period + 1``) plus :data:`_PERIOD_MARGIN_POSITIONS` positions (or half a
    period) for the ends to settle into their period; ``microbatches`` itself for
    warm-up counts that rise with the rank (no schedule's: the rows refuse them)."""
    if any(a < b for a, b in zip(warmups, warmups[1:])):
        return microbatches
    return _short_microbatches(pp, microbatches, vpp, max(warmups))


def _short_microbatches(pp: int, microbatches: int, vpp: int, w_max: int) -> int:
    """:func:`_period_microbatches` by the largest warm-up count ``w_max`` alone (warm-up
    counts never rising with the rank)."""
    period = _period_positions(pp, vpp)
    step = pp if vpp > 1 else 1
    need = 2 * w_max + period + 2 + max(period // 2, _PERIOD_MARGIN_POSITIONS)
    fewest = -(-need // (2 * vpp))
    if fewest >= microbatches:
        return microbatches
    return microbatches - (microbatches - fewest) // step * step


#: Positions past the first possible period check that the shortened rows
#: (:func:`_period_microbatches`) leave for the ends to settle into their period, at
#: least: the benchmark's shapes settle 1-9 positions past it; a set that has not is
#: solved again at its full length (never a different number).
_PERIOD_MARGIN_POSITIONS = 8


def _family_timing_vectors(pp: int, microbatches: int, vpp: int, warmups: tuple[int, ...],
                           durations: Sequence[tuple[Sequence[int], Sequence[int]]],
                           t_comm: int, rounds_max: int | None = None) -> list:
    """:func:`one_f_one_b_family_timing` of one shape for several duration sets
    ``durations`` (``(t_f, t_b)`` each; arguments checked, each set
    :func:`_vector_exact`) by the numpy rows of the comment above, every set at once
    along a first axis (a set's rows never read another's, so each set's fixed point
    is its own, checked set by set): each set's timing, or None for a set whose rows
    have not settled after ``rounds_max`` rounds (default ``_VECTOR_ROUNDS_PER_CHUNK *
    vpp + _VECTOR_ROUNDS_EXTRA``; or every set, when the walk's order is not a
    topological order of the units: :func:`_vector_layout`).

    The period skip of the position walk, in rows: a long shape is solved with fewer
    micro-batches (:func:`_period_microbatches`, whole periods fewer), whose solution
    shows the period (two consecutive positions' ends on every rank those a period
    earlier plus one constant ``d``, past ``w_max + period``, before the first
    cool-down: the walk's own check); the long shape's recurrence is then the short one
    with the missing periods inserted there, so its last ends are the short ones plus
    ``n d`` and its waits the short ones plus ``n`` times that period's (the first
    starts are the same). A set whose short rows show no period is solved at full
    length."""
    if rounds_max is None:
        rounds_max = _VECTOR_ROUNDS_PER_CHUNK * vpp + _VECTOR_ROUNDS_EXTRA
    short = _period_microbatches(pp, microbatches, vpp, warmups)
    if short == microbatches:
        return _solve_rows(pp, microbatches, vpp, warmups, durations, t_comm, rounds_max)
    out = _solve_rows(pp, short, vpp, warmups, durations, t_comm, rounds_max,
                      microbatches)
    again = [k for k, found in enumerate(out) if found is _NO_PERIOD]
    if again:
        redone = _solve_rows(pp, microbatches, vpp, warmups, [durations[k] for k in again],
                             t_comm, rounds_max)
        for k, found in zip(again, redone):
            out[k] = found
    return out


_NO_PERIOD = object()


def _solve_rows(pp: int, microbatches: int, vpp: int, warmups: tuple[int, ...],
                durations: Sequence[tuple[Sequence[int], Sequence[int]]], t_comm: int,
                rounds_max: int, grow_to: int | None = None) -> list:
    """The numpy rows of :func:`_family_timing_vectors` at ``microbatches``: each set's
    timing (None: not settled; every set None when :func:`_vector_layout` refuses the
    order); with ``grow_to`` (more micro-batches, whole periods more), the timing at
    ``grow_to`` by the period found in the rows, or :data:`_NO_PERIOD` for a set whose
    rows show none."""
    import numpy as np

    p, count = pp, len(durations)
    layout = _vector_layout(pp, microbatches, vpp, warmups)
    if layout is None:
        return [None] * count
    index, dep, far, n = layout
    # every array (rank, set, position): a rank's row of all sets is one contiguous
    # block (2-D gathers and prefix maxima over strided rows took ~1.4x as long), then a
    # zero block the units without an input read
    values = np.array([(*t_f, *t_b) for t_f, t_b in durations], dtype=np.int64)
    d = values[np.arange(count)[:, None], index[:, None, :]]
    run = np.cumsum(d, axis=2)
    # each unit's input as a flat index into the (p + 1, count, n) arrays (dep is one
    # set's rank * n + position, p * n for none: the zero block's first row)
    deps = dep // n * (count * n) + dep % n
    if count > 1:
        deps = deps[:, None, :] + np.arange(0, count * n, n)[None, :, None]
    else:
        deps = deps[:, None, :]
    # rows kept as G = E - S (E_j = S_j + G_j, G_j = max_{i <= j} (D_i - S_{i-1})): an
    # input's end is G + S at its unit, so G_j = max_{i <= j} (G[input_i] + add_i)
    # with add = S[input] + (t_comm across ranks) - S_{i-1}, one gather, one add and
    # one prefix maximum per row; G = 0 (each rank back to back from 0) is below the
    # solution, so every recomputation only rises towards it
    run_at = np.zeros((p + 1, count, n), dtype=np.int64)
    run_at[:p] = run
    # (gathers in mode "clip": every index is in range by construction, the same values,
    # and numpy buffers an ``out`` under its default "raise" mode: ~2x the gather's time)
    run_in = run_at.reshape(-1).take(deps, mode="clip")  # S at each unit's input
    offset = run_in + far[:, None, :] * t_comm - run + d
    rise = np.zeros((p + 1) * count * n, dtype=np.int64)
    grid = rise.reshape(p + 1, count, n)[:p]
    acc, add, take = np.maximum.accumulate, np.add, rise.take
    if count == 1:  # (1-D rows: numpy's 2-D gathers and prefix maxima take ~0.2-0.4 us
        # more each, ~5 % of a single call's time on the benchmark shapes)
        buf = np.empty(n, dtype=np.int64)
        rows = [(deps[r, 0], offset[r, 0], grid[r, 0]) for r in range(p)]
    else:
        buf = np.empty((count, n), dtype=np.int64)
        rows = [(deps[r], offset[r], grid[r]) for r in range(p)]
    # down then up; the last row is not recomputed twice in a row (no row reads its own
    # with p > 1: nothing it reads changed in between)
    order = rows + rows[-2::-1] if p > 1 else rows
    same = np.zeros((1, count, 1), dtype=bool)  # (no round yet: no set settled)
    # the fixed point is checked (every row recomputed at once: as many elements as a
    # round, most of a batch's time on long rows -- 0.22 of 1.1 ms a round for pp 16 x 9
    # sets x 192 positions) from round 2 vpp - 1 on, the rounds interleaved shapes take
    # (the constants above), and after the last; a set at its fixed point stays there,
    # so checking later gives the same result
    first_check = min(rounds_max, 2 * vpp - 1)
    for done in range(1, rounds_max + 1):
        for row_dep, row_offset, row in order:
            take(row_dep, out=buf, mode="clip")
            add(buf, row_offset, out=buf)
            acc(buf, axis=-1, out=row)
        if done < first_check:
            continue
        every = acc(take(deps, mode="clip") + offset, axis=2)
        same = every == grid
        if same.all():
            settled = [True] * count
            break
        grid[:] = every
    else:  # (a set at its fixed point stays there: recomputing its rows changes nothing)
        settled = same.all(axis=(0, 2)).tolist()
    ends = grid + run
    start = ends - d
    before = np.zeros_like(ends)
    before[:, :, 1:] = ends[:, :, :-1]
    # a unit's wait for its transfer: its start past the later of its rank's previous
    # end and its input's end (zero for an input on its own rank or none)
    inputs = take(deps, mode="clip") + run_in
    waits = start - np.maximum(before, inputs)
    wait = waits.sum(axis=2).T
    last = ends[:, :, -1].T
    first = start[:, :, 0].T.tolist()
    if grow_to is None:
        last, wait = last.tolist(), wait.tolist()
        return [(max(last[k]), tuple(last[k]), tuple(first[k]), tuple(wait[k]))
                if settled[k] else None for k in range(count)]
    # the walk's period check (one_f_one_b_family_timing) at every position i of the
    # all-1F-1B window: ends of i - 1 and i those of a period earlier plus one d on
    # every rank, i - period > w_max; the first such i, per set
    period = _period_positions(p, vpp)
    periods = (grow_to - microbatches) * vpp * 2 // period
    w_max = max(warmups)
    moved = ends[:, :, period:] - ends[:, :, :-period]  # column j: position j + period
    shift = moved[0]
    even = (moved == shift).all(axis=0)
    pair = even[:, 1:] & even[:, :-1] & (shift[:, 1:] == shift[:, :-1])
    # pair column j: positions j + period (i - 1) and j + period + 1 (i)
    window = pair[:, w_max:n - w_max - period - 1]
    found = window.any(axis=1).tolist()
    at = (window.argmax(axis=1) + w_max + period + 1).tolist()
    out: list = []
    for k in range(count):
        if not settled[k]:
            out.append(None)
            continue
        if not found[k]:
            out.append(_NO_PERIOD)
            continue
        i = at[k]
        grow = waits[:, k, i - period + 1:i + 1].sum(axis=1)
        row_last = (last[k] + periods * int(shift[k, i - period])).tolist()
        row_wait = (wait[k] + periods * grow).tolist()
        out.append((max(row_last), tuple(row_last), tuple(first[k]), tuple(row_wait)))
    return out


def _skip_periods(i: int, repeats: int, period: int, shift: int,
                  warmups: Sequence[int], end_f: list, end_b: list, free: list) -> None:
    """Move the recurrence of :func:`one_f_one_b_family_timing` from position ``i`` to
    ``i + repeats * period``: the ends of the two positions later inputs read (``i - 1``
    and ``i``, all ranks in their 1F-1B phase) are copied ``repeats`` periods ahead
    (virtual index plus ``repeats * period / 2``) plus ``repeats * shift``."""
    add = repeats * shift
    step_k = repeats * (period // 2)  # one F and one B per rank every two positions
    for r, w in enumerate(warmups):
        for pos in (i - 1, i):
            off = pos - w
            if off & 1:
                k = off >> 1
                end_b[r][k + step_k] = end_b[r][k] + add
            else:
                k = w + (off >> 1)
                end_f[r][k + step_k] = end_f[r][k] + add
        free[r] += add


# ------------------------------------------------------------- 1F1B family, walked units
#
# The recurrence above with durations that depend on when a unit starts: a rank whose
# layers wait for their ZeRO-3 parameter gathers (sim.analytic_step.GatherWalker) ends a
# unit at max(start + its compute, where its gathers let it), and where its
# data-parallel stream stands when the unit issues its gathers decides the latter.


class FamilyWalk(NamedTuple):
    """:func:`one_f_one_b_family_walk`'s result (integer times)."""

    makespan: int
    rank_end: tuple[int, ...]    # each rank's last compute end
    rank_comm_wait: tuple[int, ...]  # each rank's wait for transfers
    stream_end: tuple[int, ...]  # where each rank's data-parallel stream ends
    gather_wait: tuple[int, ...]  # each rank's compute waits for its gathers
    first_end: tuple[int, ...]  # the end of each rank's first forward (0: none)


def _streams_repeat(now: tuple, then: tuple, shift: int) -> bool:
    """Whether the streams' state a period apart (``(stream, held, waited, reduced)`` of
    :func:`one_f_one_b_family_walk`) lets the period repeat: no unit reduced in between,
    and every rank's stream moved ``shift``, or at most ``shift`` with no unit's end set
    by its gathers meanwhile."""
    (s_now, h_now, _, red_now), (s_then, h_then, _, red_then) = now, then
    return red_now == red_then and all(
        a - b == shift or (a - b <= shift and h == g)
        for a, b, h, g in zip(s_now, s_then, h_now, h_then))


def one_f_one_b_family_walk(pp: int, microbatches: int, vpp: int, warmups: Sequence[int],
                            t_comm: int, walkers: Sequence, reducing: bool = True
                            ) -> FamilyWalk:
    """:func:`one_f_one_b_family_timing`'s order and dependencies (integer times) with
    each unit's end set by its rank's data-parallel stream: ``walkers[r].plain[f][c]``
    is ``(D, G, O)`` for rank ``r``'s forward (``f`` 1) or backward (0) through its
    chunk ``c`` (stage ``c * pp + r``): it ends at ``max(start + D, S + O)`` (without a
    gathered layer ``G`` is 0 and ``O`` an offset that never binds: ``-(D + 1)`` while
    the stream stays at 0, as in the plain timing, else far below any end, as
    :class:`sim.analytic_step.GatherWalker` gives) with ``S`` where the stream is free when it issues its
    gathers, which then move the stream ``G`` on; the backwards of the last
    micro-batch (which reduce gradients) are ``walkers[r].reduce(c, start, S)`` ->
    ``(end, S after it, its waits for gathers)``. Units reach a rank's walker in its
    list order. ``reducing`` False: no unit reduces (every backward is plain).

    Period skip: as the plain walk's (the ends of two consecutive positions those of a
    period earlier plus one ``d`` on every rank) where, over that period, every rank's
    stream moved ``d``, or at most ``d`` with no unit's end set by its gathers, and no
    unit reduced: then every term of every unit's end moves by ``d`` or stays dominated
    (falling further behind), so the next periods repeat the last one shifted by ``d``
    (by induction; the stream moves by its gathers alone, one period's each period).
    Otherwise the walk goes on position by position (exact, slower).

    Raises:
        ValueError: for warm-up counts out of range (one line)."""
    p, v = pp, vpp
    total = microbatches * v
    group = p * v
    if len(warmups) != p or any(not 0 <= w <= total for w in warmups):
        raise ValueError(f"warmups={tuple(warmups)!r} is invalid; valid: {p} counts "
                         f"in 0 .. {total}")
    c = t_comm
    far = p > 1
    end_f = [[0] * total for _ in range(p)]
    end_b = [[0] * total for _ in range(p)]
    free = [0] * p
    wait = [0] * p
    stream = [0] * p   # each rank's data-parallel stream end
    held = [0] * p     # units whose end a gather set
    waited = [0] * p   # compute waits for gathers
    reduced = 0
    w_max = max(warmups)
    positions = 2 * total
    period = _period_positions(p, v)
    steady_end = positions - w_max
    check_from = w_max
    ends: list[list[int]] = []
    waits: list[list[int]] = []
    states: list[tuple] = []
    last = p - 1
    # virtual indices of the last round (its last micro-batch); none when not reducing
    last_from = total - group if reducing else total
    last_mb = microbatches - 1
    # the streams' state matters to the period skip only where a unit gathers or
    # reduces; without (the plain family timing) it stays at zero and is not tracked
    tracked = reducing or any(unit[1] for walker in walkers for rows in walker.plain
                              for unit in rows)
    fw = [(r, w, positions - w, end_f[r], end_f[r - 1] if r else None,
           walkers[r].plain[1]) for r, w in enumerate(warmups)]
    bw = [(r, w, positions - w, end_b[r], end_b[r + 1] if r < last else None,
           walkers[r].plain[0]) for r, w in reversed(list(enumerate(warmups)))]
    i = 0
    # (the forward and backward units below mirror each other, inlined: this is the
    # planner's per-plan hot loop, where a call per unit would cost more than the unit)
    while i < positions:
        for r, w, cool, row, prev, plain in fw:
            if i < w:
                k = i
            elif i < cool:
                off = i - w
                if off & 1:
                    continue
                k = w + (off >> 1)
            else:
                continue
            start = produced = free[r]
            if r:
                dep = prev[k]
                if dep > produced:
                    produced = dep
                dep += c
                if dep > start:
                    start = dep
            elif k % group >= p:
                dep = end_f[last][k - p]
                if dep > produced:
                    produced = dep
                if far:
                    dep += c
                if dep > start:
                    start = dep
            if start > produced:
                wait[r] += start - produced
            duration, gathers, offset = plain[(k % group) // p]
            end = start + duration
            floor = stream[r] + offset  # (no gathered layer: an offset that never binds)
            if floor > end:
                held[r] += 1
                waited[r] += floor - end
                end = floor
            stream[r] += gathers
            free[r] = row[k] = end
        for r, w, cool, row, prev, plain in bw:
            if i < w:
                continue
            if i < cool:
                off = i - w
                if not off & 1:
                    continue
                k = off >> 1
            else:
                k = i - total
            start = produced = free[r]
            if r < last:
                dep = prev[k]
                if dep > produced:
                    produced = dep
                dep += c
                if dep > start:
                    start = dep
            elif k % group >= p:
                dep = end_b[0][k - p]
                if dep > produced:
                    produced = dep
                if far:
                    dep += c
                if dep > start:
                    start = dep
            if start > produced:
                wait[r] += start - produced
            chunk = v - 1 - (k % group) // p
            if k >= last_from and (k // group) * p + k % p == last_mb:
                reduced += 1
                end, stream[r], extra = walkers[r].reduce(chunk, start, stream[r])
                waited[r] += extra
            else:
                duration, gathers, offset = plain[chunk]
                end = start + duration
                floor = stream[r] + offset
                if floor > end:
                    held[r] += 1
                    waited[r] += floor - end
                    end = floor
                stream[r] += gathers
            free[r] = row[k] = end
        if check_from <= i < steady_end:
            ends.append(free[:])
            waits.append(wait[:])
            if tracked:
                states.append((stream[:], held[:], waited[:], reduced))
            if len(ends) > period + 1 and i - period > w_max:
                now, before = ends[-1], ends[-1 - period]
                shift = now[0] - before[0]
                repeats = (steady_end - 1 - i) // period
                if (repeats > 0 and now[last] - before[last] == shift
                        and [x + shift for x in before] == now
                        and [x + shift for x in ends[-2 - period]] == ends[-2]
                        and (not tracked or _streams_repeat(states[-1], states[-1 - period],
                                                            shift))):
                    _skip_periods(i, repeats, period, shift, warmups, end_f, end_b, free)
                    grow = [a - b for a, b in zip(waits[-1], waits[-1 - period])]
                    wait = [x + repeats * g for x, g in zip(wait, grow)]
                    if tracked:
                        (s_now, h_now, w_now, _), (s_then, h_then, w_then, _) = (
                            states[-1], states[-1 - period])
                        stream = [x + repeats * (a - b)
                                  for x, a, b in zip(stream, s_now, s_then)]
                        held = [x + repeats * (a - b) for x, a, b in zip(held, h_now, h_then)]
                        waited = [x + repeats * (a - b)
                                  for x, a, b in zip(waited, w_now, w_then)]
                    i += repeats * period
                    check_from = positions  # (one skip reaches the first cool-down)
        i += 1
    # (every rank's first action is F_0 of chunk 0; its end is never skipped)
    return FamilyWalk(max(free), tuple(free), tuple(wait), tuple(stream), tuple(waited),
                      tuple(row[0] if total else 0 for row in end_f))
