"""ZB-V: the zero-bubble schedule on a V-shaped placement (Qi et al. 2024, "Pipeline
Parallelism with Controllable Memory", arXiv 2405.15362; the ZB paper, arXiv
2401.10241, Appendix; PyTorch ``torch.distributed.pipelining.ScheduleZBVZeroBubble``).

Each rank holds two model chunks, stage ``r`` and stage ``2p - 1 - r``, so the first
and the last stage share rank 0 and the backward starts where the forward ended. With
per-chunk pass times ``F = I`` and ``W <= F`` the first rank idles ``(p - 1)(F + I -
2W)`` — none when the three passes are equal — while holding 1F1B's activations
(``2p`` half-size chunks).
"""

from __future__ import annotations

from strategies.pipeline import Action, StagePlacement, v_placement
from strategies.schedules.base import PipelineSchedule, check_positive_shape


class ZeroBubbleV(PipelineSchedule):
    """The handcrafted ZB-V list of rank ``r`` (chunk 0 = stage ``r``, chunk 1 = stage
    ``2p - 1 - r``): ``2(p - r) - 1`` forwards of chunk 0; ``r`` pairs of forwards of
    chunks 1 and 0; ``p - r`` rounds of chunk 1's F, I, W; then the steady state (chunk
    0's F, I, W, chunk 1's F, I, W) until every forward ran; then ``r`` rounds of both
    chunks' I, ``p - r`` rounds of chunk 0's I and W, and the remaining W's. Micro-batches
    beyond ``m`` are dropped from the list (fewer than ``2p - 1`` micro-batches)."""

    name = "zb-v"
    summary = "zero bubble V: two chunks per rank in a V, 1F1B's memory, weight passes fill"
    source = "Qi et al. 2024, arXiv 2405.15362; PyTorch ScheduleZBVZeroBubble"
    split_backward = True
    searched_by_default = False
    vpp_choices = (2,)

    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        check_positive_shape(pp, microbatches, vpp)
        if vpp != 2:
            raise ValueError(f"vpp={vpp} is invalid for schedule='zb-v'; valid: vpp=2 (two "
                             "chunks per rank in a V)")

    def placement(self, pp: int, vpp: int) -> StagePlacement:
        return v_placement(pp)

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        n = max(2 * pp - 1, microbatches)
        first, second = rank, 2 * pp - 1 - rank
        out: list[Action] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (pp - rank) - 1):
            out.append(Action(first, "F", f0))
            f0 += 1
        for _ in range(rank):
            out += [Action(second, "F", f1), Action(first, "F", f0)]
            f1, f0 = f1 + 1, f0 + 1
        for _ in range(pp - rank):
            out += [Action(second, "F", f1), Action(second, "I", b1), Action(second, "W", b1)]
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                out.append(Action(first, "F", f0))
                f0 += 1
            out += [Action(first, "I", b0), Action(first, "W", b0),
                    Action(second, "F", f1), Action(second, "I", b1), Action(second, "W", b1)]
            b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(rank):
            out += [Action(first, "I", b0), Action(second, "I", b1)]
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(pp - rank):
            out += [Action(first, "I", b0), Action(first, "W", w0)]
            b0, w0 = b0 + 1, w0 + 1
        out += [Action(second, "W", j) for j in range(w1, b1)]
        out += [Action(first, "W", j) for j in range(w0, b0)]
        return [a for a in out if a.microbatch < microbatches]

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp
