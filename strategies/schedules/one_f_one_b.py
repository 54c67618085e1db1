"""1F1B: PipeDream-flush, Megatron-LM's non-interleaved schedule (Narayanan et al. 2021,
arXiv 2104.04473, §2.2; Harlap et al. 2018 for PipeDream)."""

from __future__ import annotations

from strategies.pipeline import Action
from strategies.schedules.base import OneFOneBFamily, one_stage_held_counts


class OneFOneB(OneFOneBFamily):
    """Rank ``r`` runs ``min(p - r - 1, m)`` warm-up forwards, then alternates one
    forward and one backward, then drains the backwards: the bubble of GPipe,
    ``(p - 1) / (m + p - 1)``, holding at most ``p - r`` micro-batches."""

    name = "1f1b"
    summary = "one forward, one backward (PipeDream-flush, Megatron's default)"
    source = "Narayanan et al. 2021, arXiv 2104.04473, Section 2.2"

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        m = microbatches
        warmup = min(pp - rank - 1, m)
        out = [Action(rank, "F", j) for j in range(warmup)]
        for k in range(m - warmup):  # steady state: one forward, one backward
            out.append(Action(rank, "F", warmup + k))
            out.append(Action(rank, "B", k))
        out += [Action(rank, "B", j) for j in range(m - warmup, m)]  # cool-down
        return out

    def warmup_forwards(self, rank: int, pp: int, microbatches: int, vpp: int) -> int | None:
        """``min(p - r - 1, m)`` (:meth:`rank_actions`; None for a subclass with its own
        order)."""
        if type(self).rank_actions is not OneFOneB.rank_actions:
            return None
        return min(pp - rank - 1, microbatches)

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        return (pp - 1) * work_per_microbatch

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp  # the peak, p - r micro-batches, is reached in the warm-up

    def held_counts(self, pp: int, microbatches: int, vpp: int):
        """:func:`strategies.schedules.base.one_stage_held_counts` (its warm-up of
        ``min(p - r - 1, m)`` forwards, then one forward and one backward)."""
        if type(self).rank_actions is not OneFOneB.rank_actions:
            return None  # a subclass with its own order: walk its lists
        return one_stage_held_counts(pp, microbatches)
