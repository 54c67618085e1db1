"""GPipe: every forward, then every backward (Huang et al. 2019, arXiv 1811.06965)."""

from __future__ import annotations

from strategies.pipeline import Action
from strategies.schedules.base import OneFOneBFamily


class GPipe(OneFOneBFamily):
    """All ``m`` forwards, then all ``m`` backwards, on every rank. Its bubble equals
    1F1B's, ``(p - 1) / (m + p - 1)``, but a rank holds every micro-batch's
    activations at once."""

    name = "gpipe"
    summary = "all forwards, then all backwards (holds every micro-batch)"
    source = "Huang et al. 2019, GPipe, arXiv 1811.06965"
    searched_by_default = False  # 1F1B does the same work in less memory

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        return ([Action(rank, "F", j) for j in range(microbatches)]
                + [Action(rank, "B", j) for j in range(microbatches)])

    def warmup_forwards(self, rank: int, pp: int, microbatches: int, vpp: int) -> int | None:
        """Every forward comes first: ``m`` (None for a subclass with its own order)."""
        if type(self).rank_actions is not GPipe.rank_actions:
            return None
        return microbatches

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        return (pp - 1) * work_per_microbatch
