"""A pipeline schedule written the way a user adds one: this file plus one registry
entry (``strategies.schedules.register(EagerOneFOneB())``, done in conftest.py).

Eager 1F1B runs twice 1F1B's warm-up forwards, ``min(2 (p - r - 1), m)`` on rank
``r``, so each forward's send to the next rank has a whole extra forward to hide
behind (the warm-up Megatron's interleaved schedule uses, with one model chunk);
it holds up to twice 1F1B's activations. It overrides nothing but its actions: its
timing is the base class's replay, its memory the base class's walk, its planner
bound the base class's 0.
"""

from __future__ import annotations

from strategies.pipeline import Action
from strategies.schedules import PipelineSchedule


class EagerOneFOneB(PipelineSchedule):
    """1F1B with a doubled warm-up (see the module docstring)."""

    name = "1f1b-eager"
    summary = "1F1B with twice the warm-up forwards (test schedule)"
    source = "tests/example_schedule.py"
    searched_by_default = False

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        m = microbatches
        warmup = min(2 * (pp - rank - 1), m)
        out = [Action(rank, "F", j) for j in range(warmup)]
        for k in range(m - warmup):
            out.append(Action(rank, "F", warmup + k))
            out.append(Action(rank, "B", k))
        out += [Action(rank, "B", j) for j in range(m - warmup, m)]
        return out
