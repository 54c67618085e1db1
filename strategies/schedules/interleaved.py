"""Interleaved 1F1B: Megatron-LM's virtual pipeline stages (Narayanan et al. 2021,
arXiv 2104.04473, §2.2)."""

from __future__ import annotations

import numpy as np

from strategies.pipeline import Action
from strategies.schedules.base import OneFOneBFamily, check_positive_shape


class Interleaved(OneFOneBFamily):
    """Each rank holds ``v >= 2`` model chunks (rank ``r``: stages ``r, r + p, ...``),
    which cuts the bubble to ``(p - 1) / (v m + p - 1)`` at the price of ``v`` times
    the point-to-point traffic and ``1 + (p - 1) / (p v)`` times 1F1B's activations
    on the first rank."""

    name = "interleaved"
    summary = "Megatron's interleaved 1F1B over vpp >= 2 model chunks per rank"
    source = "Narayanan et al. 2021, arXiv 2104.04473, Section 2.2"
    vpp_choices = (2, 4)

    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        check_positive_shape(pp, microbatches, vpp)
        if vpp < 2:
            raise ValueError(f"vpp={vpp} is invalid for schedule='interleaved'; valid: vpp >= 2 "
                             "(use '1f1b' for vpp=1)")
        if microbatches % pp:
            raise ValueError(
                f"microbatches={microbatches} is invalid for schedule='interleaved' with pp={pp}; "
                f"valid: a multiple of pp (e.g. {pp * max(1, -(-microbatches // pp))})")

    def microbatch_step(self, pp: int) -> int:
        return pp

    def rank_actions(self, rank: int, pp: int, microbatches: int, vpp: int) -> list[Action]:
        """The rank walks ``m * v`` virtual micro-batches k in groups of ``p``: within a
        round of ``p v`` consecutive k, the first ``p`` run chunk 0 on micro-batches
        ``g p .. g p + p - 1``, the next ``p`` chunk 1 on the same micro-batches, and so
        on; backwards walk the chunks in reverse. Warm-up is ``(p - r - 1) 2 + (v - 1) p``
        forwards (all of them when ``m == p``, as Megatron does), then one forward and
        one backward per step, then the remaining backwards."""
        total = microbatches * vpp
        group = pp * vpp

        def chunk_and_mb(k: int, forward: bool) -> tuple[int, int]:
            chunk = (k % group) // pp
            if not forward:
                chunk = vpp - 1 - chunk
            return chunk, (k // group) * pp + k % pp

        def action(k: int, comp: str) -> Action:
            chunk, mb = chunk_and_mb(k, comp == "F")
            return Action(rank + chunk * pp, comp, mb)

        if microbatches == pp:
            warmup = total
        else:
            warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
        out = [action(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            out.append(action(warmup + k, "F"))
            out.append(action(k, "B"))
        out += [action(k, "B") for k in range(total - warmup, total)]
        return out

    def warmup_forwards(self, rank: int, pp: int, microbatches: int, vpp: int) -> int | None:
        """``min(2 (p - r - 1) + (v - 1) p, m v)``, all ``m v`` when ``m == p``
        (:meth:`rank_actions`; None for a subclass with its own order)."""
        if type(self).rank_actions is not Interleaved.rank_actions:
            return None
        total = microbatches * vpp
        if microbatches == pp:
            return total
        return min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)

    def bubble_lower_bound(self, pp: int, vpp: int, work_per_microbatch: float,
                           fill_per_stage: float) -> float:
        return (pp - 1) * work_per_microbatch / vpp

    def memory_horizon(self, pp: int, vpp: int) -> int | None:
        return pp * (2 * vpp + 2)  # past the warm-up each forward frees one chunk

    def held_counts(self, pp: int, microbatches: int, vpp: int
                    ) -> tuple[np.ndarray, ...] | None:
        """From :meth:`rank_actions`' order without building it: right after forward
        ``j`` (virtual micro-batch ``j``) rank ``r`` has run forwards ``0..j`` and
        backwards ``0..j - w - 1`` (``w`` its warm-up), and among the first ``n``
        virtual micro-batches ``(n // pv) p + clip(n % pv - c p, 0, p)`` are of chunk
        ``c`` (forwards) -- of chunk ``v - 1 - c`` for backwards."""
        if type(self).rank_actions is not Interleaved.rank_actions:
            return None  # a subclass with its own order: walk its lists
        total, group = microbatches * vpp, pp * vpp
        j = np.arange(total, dtype=np.int64)

        def of_chunk(n: np.ndarray, chunk: int) -> np.ndarray:
            return (n // group) * pp + np.clip(n % group - chunk * pp, 0, pp)

        out = []
        for rank in range(pp):
            warmup = total if microbatches == pp else \
                min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
            backwards = np.maximum(j - warmup, 0)
            rows = np.zeros((total, group), dtype=np.int64)
            for chunk in range(vpp):
                rows[:, rank + chunk * pp] = (of_chunk(j + 1, chunk)
                                              - of_chunk(backwards, vpp - 1 - chunk))
            out.append(rows)
        return tuple(out)
