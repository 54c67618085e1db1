"""The CPU's lead over the GPU, carried across op lists (issue 12: host issue in pipelines).

A rank's CPU thread issues its ops in program order, one host time each, and waits only
after a ``host_sync`` op (:mod:`sim.engine`, the replay's rules; PyTorch's launch queue is
otherwise unbounded, so the CPU runs ahead of the GPU). The closed form prices a rank's
work as op lists back to back (a layer's phase, a stage's action); between two lists the
CPU may be ahead of the GPU by some *lead*: it has issued the next list's first ops
``lead`` earlier than the list's start. The lead grows while the GPU waits for a pipeline
receive (the CPU goes on issuing) and across GPU-bound kernels, and shrinks across
host-bound ones; a ``host_sync`` drains it.

**A list as a function of its lead.** In the list schedule
(:meth:`sim.analytic_step.OpPricer.schedule`) every time is a max-plus form of the issue
times ``host_i - lead``: an op starts at the max of its stream's free time, its
dependencies' ends and its issue, and ends a duration later; after a ``host_sync`` the
CPU resumes at the max of its own time and that op's end. So the list's end is
``max(a, b - lead)`` for constants ``a``, ``b`` (one variable, coefficients 0 or 1), and so
is the CPU's end. :class:`HostForm` keeps four numbers, the list priced twice in one pass:
``free_ns`` (its end with the CPU without bound ahead: only issue after a sync binds),
``total_ns`` (its end with the CPU level, ``max(a, b)``), ``synced_ns`` (the CPU's end
without bound ahead: its time after the last sync, None without one) and ``host_ns`` (the
CPU's end, level). Then for any lead ``L >= 0``: end ``max(free_ns, total_ns - L)``, CPU
end ``max(synced_ns, host_ns - L)``, exactly.

**Composition.** Lists run back to back (the next starts when the previous has ended on
every stream, the closed form's rule), the lead passing on; two forms compose into the
form of the pair (:meth:`HostForm.then`, a 2x2 max-plus matrix product: associative), so
a stage's action is the form of its layers, ``n`` equal layers its ``n``-th power
(:meth:`HostForm.repeat`), and a rank's action list back to back one form: its end with
no pipeline wait, a lower bound of the replay's (every wait only delays the GPU, and
through a sync the CPU: the replay is monotone). tests/test_host_pipeline.py checks the
forms against list schedules started ``L`` ahead, and the closed form against the replay.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["HostForm", "LEVEL"]


class HostForm(NamedTuple):
    """An op list's end and its CPU's end as functions of the CPU's lead (module
    docstring; all ns, from the list's start).

    Attributes:
        free_ns: the list's end with the CPU without bound ahead of the GPU.
        total_ns: the list's end with the CPU level with the GPU (``>= free_ns``).
        synced_ns: the CPU's end without bound ahead: after the list's last
            ``host_sync`` op (None: the list has none, its CPU end moves with the lead).
        host_ns: the CPU's end, starting level (``>= synced_ns``).
    """

    free_ns: int
    total_ns: int
    synced_ns: int | None
    host_ns: int

    def total_at(self, lead_ns: int) -> int:
        """The list's end when the CPU starts ``lead_ns`` (>= 0) ahead of the GPU:
        ``max(free_ns, total_ns - lead_ns)``."""
        late = self.total_ns - lead_ns
        return late if late > self.free_ns else self.free_ns

    def host_at(self, lead_ns: int) -> int:
        """The CPU's end (from the list's start) when it starts ``lead_ns`` ahead:
        ``max(synced_ns, host_ns - lead_ns)``."""
        host = self.host_ns - lead_ns
        if self.synced_ns is not None and self.synced_ns > host:
            return self.synced_ns
        return host

    def lead_after(self, lead_ns: int) -> int:
        """How far ahead of the GPU the CPU is when the list ends, having started
        ``lead_ns`` ahead (>= 0 for a list whose last op carries the CPU's end: an op
        starts no earlier than its issue)."""
        return self.total_at(lead_ns) - self.host_at(lead_ns)

    def then(self, other: HostForm) -> HostForm:
        """The form of this list followed by ``other`` (which starts when this one ends,
        with the lead this one leaves): with ``x`` this form and ``y`` the other, the end
        is ``x.total_at(L) + y.total_at(x.lead_after(L))``
        ``= max(x.free + y.free, x.synced + y.total, x.total + y.free - L,
        x.host + y.total - L)`` and the CPU's end
        ``max(x.free + y.synced, x.synced + y.host, x.total + y.synced - L,
        x.host + y.host - L)``."""
        xf, xt, xs, xh = self
        yf, yt, ys, yh = other
        free = xf + yf
        if xs is not None and xs + yt > free:
            free = xs + yt
        total = xt + yf
        if xh + yt > total:
            total = xh + yt
        if free > total:
            total = free
        if ys is None:
            synced = None if xs is None else xs + yh
            host = xh + yh
        else:
            synced = xf + ys
            if xs is not None and xs + yh > synced:
                synced = xs + yh
            host = xt + ys
            if xh + yh > host:
                host = xh + yh
        if synced is not None and synced > host:
            host = synced
        return HostForm(free, total, synced, host)

    def repeat(self, count: int) -> HostForm:
        """The form of ``count`` (>= 0) copies of the list back to back (by squaring:
        O(log count) compositions)."""
        result, base = LEVEL, self
        while count:
            if count & 1:
                result = result.then(base)
            count >>= 1
            if count:
                base = base.then(base)
        return result


#: The empty list: nothing to run, the CPU's lead passes through unchanged.
LEVEL = HostForm(0, 0, None, 0)


def settle_rank_ends(ends: list[int], waits: Sequence[tuple[int, int, int]]) -> None:
    """Raise rank ends in place to a fixed point of ``ends[p] >= ends[holder] + gap`` for
    each ``(p, holder, gap)`` in ``waits`` (a rank's last wait for another rank: that
    rank's end, less what it runs after the action waited for, plus the transfer and
    this rank's list after the wait, from the CPU's lead); at most one round per rank,
    as a chain of waits visits each rank once."""
    for _ in range(len(ends)):
        moved = False
        for p, holder, gap in waits:
            if ends[holder] + gap > ends[p]:
                ends[p] = ends[holder] + gap
                moved = True
        if not moved:
            return


def repeated_blocks(keys: Sequence, longest: int) -> tuple[tuple[tuple, int], ...]:
    """``keys`` (a rank's actions as hashable keys) as ``((block, count), ...)``: from
    each position the repeated block (up to ``longest`` keys, starting again right after
    itself) that covers the most keys -- a schedule's warm-up forwards, its steady
    forward-backward cycles -- else one key; their forms compose as one power of the
    block's (:meth:`HostForm.repeat`)."""
    n, index, out = len(keys), 0, []
    while index < n:
        size, count = 1, 1
        head = keys[index]
        for length in range(1, longest + 1):
            if index + 2 * length > n:
                break
            if keys[index + length] != head:
                continue
            block = keys[index:index + length]
            repeats = 1
            while keys[index + repeats * length:index + (repeats + 1) * length] == block:
                repeats += 1
            if repeats > 1 and repeats * length > size * count:
                size, count = length, repeats
        out.append((tuple(keys[index:index + size]), count))
        index += size * count
    return tuple(out)
