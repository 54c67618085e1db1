"""Zero-bubble pipeline schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
arXiv 2401.10241): the backward is split into the input gradient (I), which the
previous stage waits for, and the weight gradient (W), which nobody waits for and
can fill the bubbles."""

from __future__ import annotations

from strategies.pipeline import Action
from strategies.schedules.base import PipelineSchedule


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
        m = microbatches
        warmup = min(pp - rank - 1, m)
        out = [Action(rank, "F", j) for j in range(warmup)]
        next_f, next_i, next_w = warmup, 0, 0

        def input_then_maybe_weight() -> None:
            nonlocal next_i, next_w
            out.append(Action(rank, "I", next_i))
            next_i += 1
            if next_i - next_w > rank:
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

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        return (pp - 1) * max(0.0, fill_per_stage)

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return 4 * pp
