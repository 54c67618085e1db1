"""Zero-bubble pipeline schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
arXiv 2401.10241): the backward is split into the input gradient (I), which the
previous stage waits for, and the weight gradient (W), which nobody waits for and
can fill the bubbles.

The handcrafted schedules of the paper's Section 2 (its Figure 3) differ in two
numbers per rank ``r``: the forwards run before the first backward, and how many
weight passes a rank lets pend before it runs one after an I. With ``F``, ``I``,
``W`` the times of one stage's passes (the paper's ``T_F``, ``T_B``, ``T_W``) and
``W <= min(F, I)``, the first rank idles (its Table 2)

* ZB-H1: ``(p - 1)(F + I - W)``, holding at most ``p`` micro-batches (1F1B's);
* ZB-H2: ``(p - 1)(F + I - 2W)``, holding up to ``2p - 1``: zero when the three
  passes take equal time (a parallelogram; the last rank, which starts ``(p - 1) F``
  late, ends as much later — the paper closes that gap by replacing the optimizer's
  synchronisation with a post-validation, which Megatron-style training here keeps).
"""

from __future__ import annotations

from strategies.pipeline import Action
from strategies.schedules.base import PipelineSchedule, one_stage_held_counts


def _split_backward_row(rank: int, microbatches: int, warmup: int, pending: int
                        ) -> list[Action]:
    """One rank of a ZB-H schedule: ``warmup`` forwards, then per micro-batch a
    forward and an I, each I followed by a W only while more than ``pending`` weight
    passes wait; the remaining I's, and the deferred W's close the list."""
    m = microbatches
    out = [Action(rank, "F", j) for j in range(warmup)]
    next_f, next_i, next_w = warmup, 0, 0

    def input_then_maybe_weight() -> None:
        nonlocal next_i, next_w
        out.append(Action(rank, "I", next_i))
        next_i += 1
        if next_i - next_w > pending:
            out.append(Action(rank, "W", next_w))
            next_w += 1

    while next_f < m:
        out.append(Action(rank, "F", next_f))
        next_f += 1
        input_then_maybe_weight()
    while next_i < m:
        input_then_maybe_weight()
    out += [Action(rank, "W", j) for j in range(next_w, m)]
    return out


class ZeroBubbleH1(PipelineSchedule):
    """ZB-H1 (§2.1): 1F1B's forward / backward order with B split into I and W;
    after each I a W runs only if more than ``r`` weight passes are pending on rank
    ``r``, and the deferred W passes close the schedule, filling the cool-down. Every
    rank holds at most ``p`` micro-batches between F and W (1F1B's peak) and the
    bubble shrinks to ``(p - 1)(F + I - W)``."""

    name = "zb-h1"
    summary = "zero bubble H1: 1F1B with the weight gradients deferred into the drain"
    source = "Qi et al. 2023, arXiv 2401.10241, Section 2.1"
    split_backward = True

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        return _split_backward_row(rank, microbatches, min(pp - rank - 1, microbatches), rank)

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        return (pp - 1) * max(0.0, fill_per_stage)

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp

    def held_counts(self, pp: int, microbatches: int, vpp: int):
        """1F1B's (:func:`strategies.schedules.base.one_stage_held_counts`): the same
        warm-up and the same forward / I order, an activation held from F to I."""
        if type(self).rank_actions is not ZeroBubbleH1.rank_actions:
            return None  # a subclass with its own order: walk its lists
        return one_stage_held_counts(pp, microbatches)


class ZeroBubbleH2(PipelineSchedule):
    """ZB-H2 (§2.2, Figure 3 bottom): rank ``r`` runs ``2 (p - r - 1) + 1`` forwards
    before its first I (the first rank: ``2p - 1``, filling the wait for the first
    gradient with forwards), then F and I alternate with a W after an I only while more
    than ``2r`` weight passes are pending, and the last rank's weight passes gather at
    the tail. The first rank idles ``(p - 1)(F + I - 2W)`` (module docstring) and holds
    up to ``2p - 1`` micro-batches."""

    name = "zb-h2"
    summary = "zero bubble H2: 2p-1 micro-batches in flight, weight passes fill the rest"
    source = "Qi et al. 2023, arXiv 2401.10241, Section 2.2 and Figure 3"
    split_backward = True
    searched_by_default = False

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        warmup = min(2 * (pp - rank - 1), microbatches)
        return _split_backward_row(rank, microbatches, warmup, 2 * rank)

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 6 * pp  # the 2p - 1 peak is reached in the warm-up
