"""DualPipe and DualPipeV (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv
2412.19437, Section 3.2.1 and its Figure 5; deepseek-ai/DualPipe, ``dualpipe.py`` and
the "cut-in-half" ``dualpipev.py``).

DualPipe feeds micro-batches from both ends of the pipeline at once: even micro-batches
run the model's chunks ``0 .. p-1`` on ranks ``0 .. p-1``, odd ones the same chunks on
ranks ``p-1 .. 0`` (:func:`strategies.pipeline.dual_placement`), so each rank holds two
chunks (twice the parameters) and every rank is busy almost from the start. In the
steady state each rank runs the forward of one micro-batch overlapped with the backward
of another (an ``F&B`` pair, :attr:`strategies.pipeline.Action.overlap`): the all-to-all
dispatch and combine of each hide behind the other's computation. DualPipeV cuts the
pipeline in half: the same lists on a V (:func:`strategies.pipeline.v_placement`),
every micro-batch running down the V and back up, parameters held once.

With ``F``, ``B`` (full backward), ``W`` the per-chunk times and ``F&B`` a pair's, the
report's Table 2 gives the bubble ``(PP/2 - 1)(F&B + B - 3W)`` for ``PP`` ranks (for
DualPipeV, ``PP`` = twice its ranks) and activations of ``PP + 1`` chunks. The exact
replay of these lists (tests/test_schedule_bubbles.py) meets that form on the first rank
when ``B - W = F >= W`` and either ``F&B = F + B`` (the report's figure draws the pair
as the two cells side by side) or ``PP <= 4``; otherwise the replay's bubble is
``(PP/2 - 2)(F + B - F&B)`` smaller: the published form counts the warm-up's unpaired
chunks at a pair's pace.
"""

from __future__ import annotations

from collections import deque

from strategies.pipeline import Action, StagePlacement, dual_placement, v_placement
from strategies.schedules.base import PipelineSchedule, check_positive_shape


def dualpipe_row(rank: int, pp: int, microbatches: int, *, v_shape: bool) -> list[Action]:
    """One rank's actions, step by step as ``DualPipe.step`` / ``DualPipeV.step`` run
    them (their steps 1-8: ``nF0``, ``nF0F1``, ``nB1W1F1``, the main ``nF0B1F1B0``,
    ``nB1F1B0``, ``nB1B0``, ``nWB0``, ``nW``). A backward run "with zero bubble"
    (``enable_zb``) becomes an I whose W is queued and run, first in first out, by a
    later weight step; an overlapped ``_forward_backward_chunk`` becomes a pair.

    Phases are the rank's own: for DualPipe, phase 0 is the direction whose micro-batches
    enter at this half's end of the pipeline (ranks in the second half swap them); for
    DualPipeV, phase 0 is the V's way down (stage ``r``), phase 1 the way up (stage
    ``2p - 1 - r``)."""
    if v_shape:
        half_rank, half_ranks, chunks_per_phase = rank, pp, microbatches
        middle = rank == pp - 1
        swap = 0
    else:
        half_rank, half_ranks, chunks_per_phase = min(rank, pp - 1 - rank), pp // 2, microbatches // 2
        middle = rank in (pp // 2 - 1, pp // 2)
        swap = int(rank >= pp // 2)
    forwards, backwards = [0, 0], [0, 0]
    weights: deque[Action] = deque()
    out: list[Action] = []

    def stage(phase: int) -> int:
        # direction 0 (or the V's way down): stage r; direction 1 (the way up): 2p - 1 - r
        return rank if phase ^ swap == 0 else 2 * pp - 1 - rank

    def microbatch(phase: int, k: int) -> int:
        return k if v_shape else 2 * k + (phase ^ swap)

    def forward(phase: int, overlap: bool = False) -> Action:
        k = forwards[phase]
        forwards[phase] += 1
        return Action(stage(phase), "F", microbatch(phase, k), overlap)

    def backward(phase: int, zero_bubble: bool = False) -> Action:
        k = backwards[phase]
        backwards[phase] += 1
        if not zero_bubble:
            return Action(stage(phase), "B", microbatch(phase, k))
        weights.append(Action(stage(phase), "W", microbatch(phase, k)))
        return Action(stage(phase), "I", microbatch(phase, k))

    def pair(forward_phase: int, backward_phase: int) -> None:
        out.append(forward(forward_phase, overlap=True))
        out.append(backward(backward_phase))

    out += [forward(0) for _ in range((half_ranks - half_rank - 1) * 2)]          # step 1
    for _ in range(half_rank + 1):                                                 # step 2
        out += [forward(0), forward(1)]
    for _ in range(half_ranks - half_rank - 1):                                   # step 3
        out.append(backward(1, zero_bubble=True))
        out.append(weights.popleft())
        out.append(forward(1))
    for i in range(chunks_per_phase - 2 * half_ranks + half_rank + 1):            # step 4
        if i == 0 and middle:  # not overlapped, to shrink the bubble (as the source says)
            out += [forward(0), backward(1)]
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(half_ranks - half_rank - 1):                                   # step 5
        out.append(backward(1))
        pair(1, 0)
    steps = half_rank + 1                                                          # step 6
    zero_bubble = False
    for i in range(steps):
        if i == steps // 2 and half_rank % 2 == 1:
            zero_bubble = True
        out.append(backward(1, zero_bubble))
        if i == steps // 2 and half_rank % 2 == 0:
            zero_bubble = True
        out.append(backward(0, zero_bubble))
    for _ in range(half_ranks - half_rank - 1):                                   # step 7
        out.append(weights.popleft())
        out.append(backward(0, zero_bubble=True))
    out += [weights.popleft() for _ in range(half_rank + 1)]                      # step 8
    return out


class DualPipe(PipelineSchedule):
    """DualPipe: two routes through two copies of the model's ``p`` chunks (module
    docstring); needs an even ``p``, vpp 1 (``p`` chunks, each rank holding two of
    them) and an even number of at least ``2p`` micro-batches."""

    name = "dualpipe"
    summary = "DeepSeek's bidirectional pipeline: F&B pairs hide the all-to-all, 2x params"
    source = "DeepSeek-AI 2024, arXiv 2412.19437, Section 3.2.1; deepseek-ai/DualPipe"
    split_backward = True
    searched_by_default = False
    pairs_own_actions = True

    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        check_positive_shape(pp, microbatches, vpp)
        if vpp != 1:
            raise ValueError(f"vpp={vpp} is invalid for schedule='dualpipe'; valid: vpp=1 (each "
                             "rank holds one chunk of each direction; 'dualpipe-v' has vpp=2)")
        if pp % 2:
            raise ValueError(f"pp={pp} is invalid for schedule='dualpipe'; valid: an even pp")
        if microbatches % 2 or microbatches < 2 * pp:
            raise ValueError(f"microbatches={microbatches} is invalid for schedule='dualpipe' "
                             f"with pp={pp}; valid: an even number >= {2 * pp}")

    def microbatch_step(self, pp: int) -> int:
        return 2

    def placement(self, pp: int, vpp: int) -> StagePlacement:
        return dual_placement(pp)

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        return dualpipe_row(rank, pp, microbatches, v_shape=False)

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp  # the PP + 1 peak is reached before the main step


class DualPipeV(PipelineSchedule):
    """DualPipeV: DualPipe's lists on a V (two chunks per rank, parameters once); needs
    vpp 2 and at least ``2p`` micro-batches."""

    name = "dualpipe-v"
    summary = "DualPipe cut in half: a V of two chunks per rank, F&B pairs, 1x params"
    source = "deepseek-ai/DualPipe (DualPipeV); Qi et al. 2024 (cut-in-half DualPipe)"
    split_backward = True
    searched_by_default = False
    pairs_own_actions = True
    vpp_choices = (2,)

    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        check_positive_shape(pp, microbatches, vpp)
        if vpp != 2:
            raise ValueError(f"vpp={vpp} is invalid for schedule='dualpipe-v'; valid: vpp=2 "
                             "(two chunks per rank in a V)")
        if microbatches < 2 * pp:
            raise ValueError(f"microbatches={microbatches} is invalid for schedule='dualpipe-v' "
                             f"with pp={pp}; valid: >= {2 * pp}")

    def placement(self, pp: int, vpp: int) -> StagePlacement:
        return v_placement(pp)

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        return dualpipe_row(rank, pp, microbatches, v_shape=True)

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp
