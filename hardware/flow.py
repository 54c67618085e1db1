"""Flow-level network: max-min fair sharing of every link a transfer crosses.

Transfers are fluid flows. Whenever a flow starts or ends, the rate of every
active flow is recomputed by progressive filling (Bertsekas & Gallager, *Data
Networks*, 2nd ed., §6.5.2): all unfrozen flows grow at the same rate until a
link saturates; the flows crossing it are frozen at that rate; repeat.

A flow may load the links it crosses unequally: ``weight`` is the wire bytes a
link carries per payload byte (1 / protocol efficiency of that link's tier),
so a link's constraint is ``sum(weight * rate) <= capacity``. A flow may also
have a rate ceiling of its own (what the NCCL kernel driving it can move): it
acts as a private link of that capacity, so a capped flow frees the share of
every link it cannot use for the others.

The :class:`FlowNetwork` runs inside the engine's SimPy environment; time is
integer nanoseconds and a flow finishes at the first whole nanosecond at which
its remaining bytes reach zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import simpy
from simpy.core import URGENT

from hardware.units import NS_PER_S

#: Request lists whose arrays FlowNetwork keeps (a step has a few hundred distinct
#: phases; a caller building a new list per transfer only refills the cache).
_TEMPLATES_MAX = 4096

#: Finished batches whose link bytes FlowNetwork sums in one go (memory: their
#: remaining-bytes arrays until then).
_UNSUMMED_MAX = 512

#: Odd multipliers of a link by its position on a path, for flow_classes' hash
#: (int64 products wrap around: a hash, equal for equal sequences).
_HASH_FACTORS = np.random.default_rng(16).integers(1, 2**62, 64, dtype=np.int64) | 1

#: A flow whose remaining bytes would take less than this (ns) is complete.
_COMPLETION_SLACK_NS = 1e-3


def max_min_rates(
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    entry_weight: np.ndarray,
    num_flows: int,
    capacity: np.ndarray,
    flow_cap: np.ndarray | None = None,
    multiplicity: np.ndarray | None = None,
    levels: list[float] | None = None,
) -> np.ndarray:
    """Max-min fair rates (payload bytes/s) of flows sharing capacitated links.

    The incidence is given as parallel arrays with one entry per (flow, link)
    crossing.

    Args:
        entry_flow: flow index of each entry (ints in ``0..num_flows-1``).
        entry_link: link index of each entry.
        entry_weight: wire bytes per payload byte on that link (> 0).
        num_flows: number of flows.
        capacity: capacity of every link, bytes/s.
        flow_cap: optional rate ceiling of every flow (inf: none), a private link
            of the flow in the progressive filling.
        multiplicity: optional number of identical flows each flow stands for (a
            *flow class*: that many flows crossing the same links with the same
            weights and ceiling); default 1 each. The rate returned is that of one
            flow of the class.
        levels: optional list the level of every round of the filling is appended
            to, in order (what :class:`FlowNetwork` needs to tell whether solving
            disconnected parts of a problem apart gives the rates of solving it whole).

    Returns:
        Array of ``num_flows`` rates; a flow that crosses no link gets its ceiling
        (``inf`` without one).

    Flow classes (why a class of ``m`` identical flows is one flow of weight
    ``m * w`` on each of its links): in progressive filling (Bertsekas & Gallager
    §6.5.2) every unfrozen flow grows at the common level ``r``; a flow freezes
    when one of its links saturates or its ceiling is reached. Two flows with the
    same links, weights and ceiling are therefore unfrozen or frozen at the same
    iterations and always hold the same rate ``r_c``. A link ``l`` crossed by the
    ``m_c`` flows of class ``c`` thus carries ``sum_c m_c * w_lc * r_c`` in the
    expanded problem; writing each class once with weight ``m_c * w_lc`` gives the
    same constraint, the same saturation level at every iteration
    (``remaining_l / sum_c m_c * w_lc`` over unfrozen classes) and the same freezing
    sets, hence the same rates. The only difference is the order of a
    floating-point sum (``m * w`` once instead of ``w`` added ``m`` times), which
    moves a rate by a few ulps (tests/test_network.py compares both on random
    topologies to 1e-12 relative).

    Only the links some flow crosses enter the arrays (a 16,384-GPU fabric has
    ~66,000 links, a step's flows cross a few thousand): the per-link sums add
    the same entries in the same order, so the rates are bit-for-bit those of the
    uncompressed problem.
    """
    caps = (np.full(num_flows, np.inf) if flow_cap is None
            else np.asarray(flow_cap, dtype=np.float64))
    rates = caps.copy()
    if entry_flow.size == 0:
        return rates
    # The links used, ascending, and each entry's index among them: what
    # ``np.unique(entry_link, return_inverse=True)`` gives, from a mark per link of
    # the fabric instead of a sort (a third of the time at a step's sizes).
    capacity = np.asarray(capacity, dtype=np.float64)
    mark = np.zeros(capacity.size, dtype=bool)
    mark[entry_link] = True
    used_links = np.flatnonzero(mark)
    local = np.empty(capacity.size, dtype=np.int64)
    local[used_links] = np.arange(used_links.size)
    entry_link = local[entry_link]
    remaining = capacity[used_links]
    if multiplicity is not None:
        entry_weight = entry_weight * np.asarray(multiplicity, dtype=np.float64)[entry_flow]
    has_links = np.zeros(num_flows, dtype=bool)
    has_links[entry_flow] = True
    # the ceilings of the flows not frozen yet (inf once frozen; a flow crossing no
    # link is frozen at its ceiling from the start)
    open_caps = np.where(has_links, caps, np.inf)
    num_links = used_links.size
    share = np.empty(num_links)
    # The entries of unfrozen flows, in their original order (the per-link sums add
    # them in that order): frozen ones are dropped after every round.
    while entry_flow.size:
        link_weight = np.bincount(entry_link, weights=entry_weight, minlength=num_links)
        share.fill(np.inf)
        np.divide(np.maximum(remaining, 0.0), link_weight, out=share, where=link_weight > 0)
        level = share.min()
        cap_level = open_caps.min()
        if cap_level < level:  # a flow's own ceiling binds before any link
            level = cap_level
            newly = open_caps <= level * (1.0 + 1e-12)
        else:
            newly = open_caps <= level * (1.0 + 1e-12)
            newly[entry_flow[(share <= level * (1.0 + 1e-12))[entry_link]]] = True
        rates[newly] = level
        if levels is not None:
            levels.append(float(level))
        open_caps[newly] = np.inf
        newly_entries = newly[entry_flow]
        remaining -= np.bincount(
            entry_link[newly_entries],
            weights=entry_weight[newly_entries] * level,
            minlength=num_links,
        )
        keep = ~newly_entries
        entry_flow, entry_link, entry_weight = (entry_flow[keep], entry_link[keep],
                                                entry_weight[keep])
    return rates


def _levels_apart(levels: Sequence[float]) -> bool:
    """Whether the round levels of :func:`max_min_rates` solves of separate link-disjoint
    groups of flows are pairwise equal or further apart than its freezing tolerance
    (``b > a * (1 + 1e-12)`` for every two distinct levels ``a < b``).

    Then solving the groups one by one gives bit for bit the rates of one solve of
    all of them. Proof: the groups share no link, so a round changes only the
    remaining capacity and open flows of the groups that freeze something in it. In
    the joint solve a round's level ``L`` is the least of the groups' next own levels
    (each ``min`` of its link shares and open ceilings, as alone, the per-link sums
    adding the same entries in the same order). A group whose next level is ``L``
    freezes what it freezes alone at ``L`` (the same link shares and ceilings against
    the same threshold ``L * (1 + 1e-12)``; a ceiling of another group equal to ``L``
    picking the link branch changes nothing, the threshold being the same); any
    other group's next level is above ``L * (1 + 1e-12)`` by the condition, so none
    of its links or ceilings is within the threshold and it freezes nothing. By
    induction over the rounds every group freezes the same flows at the same levels
    as alone. With two levels closer than that and not equal, the joint solve would
    freeze both groups at the lower one (the coupling :class:`FlowNetwork` then
    solves jointly instead). Checking all pairs, those of one group included, is
    stricter than needed and so safe.
    """
    ordered = sorted(set(levels))
    return all(b > a * (1.0 + 1e-12) for a, b in zip(ordered, ordered[1:]))


def flow_classes(entry_flow: np.ndarray, entry_link: np.ndarray, entry_weight: np.ndarray,
                 num_flows: int, flow_cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group identical flows (same links in the same order, same weights, same
    ceiling) into classes for :func:`max_min_rates`' ``multiplicity``.

    Entries must be grouped by flow (all entries of a flow contiguous, flows in
    ascending order), as :class:`_Batch` lays them out.

    Returns:
        ``(class_of_flow, first_flow_of_class)``: the class of every flow, and for
        each class (in order of first appearance) its first flow.
    """
    starts = np.searchsorted(entry_flow, np.arange(num_flows + 1))
    lengths = np.diff(starts)
    if num_flows > 1 and lengths.all():
        # Flows with the same links have the same hash of their link sequence: when
        # no two hashes are equal, every flow is a class of its own (the common case
        # of a phase's transfers between distinct pairs). A collision only sends the
        # list to the exact comparison below.
        position = np.arange(entry_flow.size) - starts[entry_flow]
        factors = _HASH_FACTORS[np.minimum(position, _HASH_FACTORS.size - 1)]
        hashed = np.add.reduceat(np.asarray(entry_link, dtype=np.int64) * factors
                                 + position, starts[:-1])
        if np.unique(hashed).size == num_flows:
            every = np.arange(num_flows, dtype=np.int64)
            return every, every.copy()
    # float keys compared by value as the loop compares them (x + 0.0: -0.0 is 0.0);
    # NaN (never equal to itself) is left to the loop
    weights = np.asarray(entry_weight, dtype=np.float64) + 0.0
    caps = np.asarray(flow_cap, dtype=np.float64) + 0.0
    if np.isnan(weights).any() or np.isnan(caps).any():
        return _flow_classes_loop(starts, entry_link, entry_weight, num_flows, flow_cap)
    # flows of each link count as rows (links, weight bits, ceiling bits): identical
    # rows are one class; np.unique gives each distinct row's first flow
    label = np.empty(num_flows, dtype=np.int64)
    firsts = []
    labels = 0
    for length in np.unique(lengths).tolist():
        flows = np.flatnonzero(lengths == length)
        index = starts[flows][:, None] + np.arange(length)
        rows = np.concatenate((entry_link[index], weights[index].view(np.int64),
                               caps[flows].view(np.int64)[:, None]), axis=1)
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        label[flows] = labels + inverse.reshape(-1)
        firsts.append(flows[first])
        labels += first.size
    first_flow = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    order = np.argsort(first_flow, kind="stable")  # classes by first appearance
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank[label], first_flow[order]


def _flow_classes_loop(starts: np.ndarray, entry_link: np.ndarray, entry_weight: np.ndarray,
                       num_flows: int, flow_cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`flow_classes` by a walk over the flows, keyed by tuples (the definition;
    used when a weight or ceiling is NaN)."""
    links, weights = entry_link.tolist(), entry_weight.tolist()
    caps = flow_cap.tolist()
    seen: dict[tuple, int] = {}
    class_of = np.empty(num_flows, dtype=np.int64)
    first: list[int] = []
    for flow in range(num_flows):
        a, b = starts[flow], starts[flow + 1]
        key = (tuple(links[a:b]), tuple(weights[a:b]), caps[flow])
        found = seen.get(key)
        if found is None:
            found = seen[key] = len(first)
            first.append(flow)
        class_of[flow] = found
    return class_of, np.asarray(first, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """One transfer to push through the network.

    Attributes:
        links: link ids crossed.
        weights: wire bytes per payload byte on each of ``links``.
        payload_bytes: bytes to deliver.
        max_rate: the flow's own rate ceiling, payload bytes/s (inf: none).
    """

    links: tuple[int, ...]
    weights: tuple[float, ...]
    payload_bytes: float
    max_rate: float = float("inf")


class FlowBatch:
    """A list of requests held as arrays (one entry per link a flow crosses, flows in
    order, each flow's links in path order): what :class:`_Template` builds from
    :class:`FlowRequest` objects, built in bulk instead (hardware.network.FlowFabric
    lists thousands of mirror transfers per phase). :meth:`FlowNetwork.transfer`
    takes it in place of a list.

    Attributes:
        entry_flow, entry_link, entry_weight: the flow, link and wire bytes per
            payload byte of every entry.
        payload: bytes every flow delivers.
        caps: every flow's rate ceiling (inf: none).
    """

    __slots__ = ("entry_flow", "entry_link", "entry_weight", "payload", "caps")

    def __init__(self, entry_flow: np.ndarray, entry_link: np.ndarray, entry_weight: np.ndarray,
                 payload: np.ndarray, caps: np.ndarray) -> None:
        self.entry_flow = np.asarray(entry_flow, dtype=np.int64)
        self.entry_link = np.asarray(entry_link, dtype=np.int64)
        self.entry_weight = np.asarray(entry_weight, dtype=np.float64)
        self.payload = np.asarray(payload, dtype=np.float64)
        self.caps = np.asarray(caps, dtype=np.float64)

    def __len__(self) -> int:
        return self.payload.size

    @staticmethod
    def concatenate(parts: Sequence["FlowBatch"]) -> "FlowBatch":
        """The flows of ``parts`` one after the other, as one batch."""
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        return FlowBatch(
            np.concatenate([p.entry_flow + o for p, o in zip(parts, offsets)]),
            np.concatenate([p.entry_link for p in parts]),
            np.concatenate([p.entry_weight for p in parts]),
            np.concatenate([p.payload for p in parts]),
            np.concatenate([p.caps for p in parts]))


class _Template:
    """The arrays of one list of requests, built once: the fabric hands the same list
    for every run of the same phase (hardware.network.FlowFabric caches them), and a
    step runs each phase hundreds of times.

    Identical flows of the list (same links, weights and ceiling: the same transfer
    of symmetric groups that meet on the same links) form one *flow class*
    (:func:`flow_classes`); the solver sees a class once, weighted by how many of its
    flows are still running (:func:`max_min_rates`' ``multiplicity``).
    """

    __slots__ = ("requests", "entry_flow", "entry_link", "entry_weight", "payload", "caps",
                 "no_links", "pattern", "live", "key", "links_used", "link_set", "_delivered", "entry_local_link", "class_of", "classes", "class_entry_flow",
                 "class_entry_link", "class_entry_weight", "class_caps")

    def __init__(self, requests: Sequence[FlowRequest] | FlowBatch) -> None:
        self.requests = requests  # keeps the list alive: its id keys the cache
        if isinstance(requests, FlowBatch):
            self.entry_flow, self.entry_link = requests.entry_flow, requests.entry_link
            self.entry_weight = requests.entry_weight
            self.payload, self.caps = requests.payload, requests.caps
        else:
            flows, links, weights = [], [], []
            for index, request in enumerate(requests):
                flows.extend([index] * len(request.links))
                links.extend(request.links)
                weights.extend(request.weights)
            self.entry_flow = np.asarray(flows, dtype=np.int64)
            self.entry_link = np.asarray(links, dtype=np.int64)
            self.entry_weight = np.asarray(weights, dtype=np.float64)
            self.payload = np.asarray([r.payload_bytes for r in requests], dtype=np.float64)
            self.caps = np.asarray([r.max_rate for r in requests], dtype=np.float64)
        # The links the list crosses (ascending) and each entry's index among them:
        # a batch's link bytes are summed over these, not over the whole fabric.
        self.links_used, self.entry_local_link = np.unique(self.entry_link,
                                                           return_inverse=True)
        # the same as a set: whether two lists share a link (FlowNetwork._groups)
        self.link_set = frozenset(self.links_used.tolist())
        self._delivered: np.ndarray | None = None
        # A flow that crosses no link (GPU to itself) is delivered at once.
        self.no_links = np.bincount(self.entry_flow, minlength=self.payload.size) == 0
        # Identical link patterns get identical rates: key for the rate cache.
        self.pattern = hash((self.entry_flow.tobytes(), self.entry_link.tobytes(),
                             self.entry_weight.tobytes(), self.caps.tobytes()))
        # the flows that run (bytes to move, a link to cross) and a batch's rate-cache
        # key when they start (_Batch.key; None: none runs)
        self.live = (self.payload > 0) & ~self.no_links
        self.key: tuple | None = (
            None if not self.live.any() else (self.pattern, None) if self.live.all()
            else (self.pattern, (~self.live).tobytes()))
        self.class_of, first = flow_classes(self.entry_flow, self.entry_link,
                                            self.entry_weight, len(requests), self.caps)
        self.classes = first.size
        if self.classes < len(requests):
            # the entries of each class's first flow, renumbered by class
            keep = np.zeros(len(requests), dtype=bool)
            keep[first] = True
            keep_entries = keep[self.entry_flow]
            self.class_entry_flow = self.class_of[self.entry_flow[keep_entries]]
            self.class_entry_link = self.entry_link[keep_entries]
            self.class_entry_weight = self.entry_weight[keep_entries]
            self.class_caps = self.caps[first]


    def delivered_link_bytes(self) -> np.ndarray:
        """Wire bytes per link of :attr:`links_used` once every flow has delivered its
        payload: :meth:`_Batch.link_bytes` with nothing remaining (computed once)."""
        if self._delivered is None:
            delivered = np.maximum(self.payload - np.zeros(self.payload.size), 0.0)
            self._delivered = np.bincount(
                self.entry_local_link, weights=delivered[self.entry_flow] * self.entry_weight,
                minlength=self.links_used.size)
        return self._delivered


class _Batch:
    """Flows submitted together; its event fires when all have finished. Its flows'
    remaining bytes, rates and liveness live in :class:`FlowNetwork`'s flat arrays,
    at ``offset .. offset + size``."""

    __slots__ = ("event", "template", "offset", "size", "key")

    def __init__(self, event: simpy.Event, template: _Template) -> None:
        self.event = event
        self.template = template
        self.offset = 0
        self.size = template.payload.size
        # this batch's part of the rate-cache key: its template's and which of its
        # flows are not running (None: all are)
        self.key: tuple = template.key  # type: ignore[assignment]

    def problem(self, done: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray | None, np.ndarray | None]:
        """This batch's part of the rate problem: ``(entry_flow, entry_link,
        entry_weight, caps, multiplicity, class_of)`` over its flow classes, the
        finished flows (``done``, one per flow of the batch) left out
        (``multiplicity`` and ``class_of`` None when every class is one flow: then
        the problem is over the flows themselves)."""
        template = self.template
        if template.classes == done.size:
            if not done.any():
                return (template.entry_flow, template.entry_link, template.entry_weight,
                        template.caps, None, None)
            keep = ~done[template.entry_flow]
            return (template.entry_flow[keep], template.entry_link[keep],
                    template.entry_weight[keep], template.caps, None, None)
        multiplicity = np.bincount(template.class_of[~done],
                                   minlength=template.classes).astype(np.float64)
        keep = multiplicity[template.class_entry_flow] > 0
        return (template.class_entry_flow[keep], template.class_entry_link[keep],
                template.class_entry_weight[keep], template.class_caps, multiplicity,
                template.class_of)

    def link_bytes(self, remaining: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Wire bytes this batch's flows have put on each link so far (payload
        delivered, payload minus ``remaining``, times each link's weight), as
        ``(links, bytes)`` over the links the batch crosses."""
        template = self.template
        delivered = np.maximum(template.payload - remaining, 0.0)
        return template.links_used, np.bincount(
            template.entry_local_link,
            weights=delivered[template.entry_flow] * template.entry_weight,
            minlength=template.links_used.size)


class _Rates:
    """The rates of every flow of the running batches (never written in place) and
    what :class:`FlowNetwork` derives from them on every rescheduling, computed once
    per set of running batches: ``positive``, the flows of positive rate (None when
    all are, the common case), and their rates ``positive_rate``."""

    __slots__ = ("rate", "positive", "positive_rate")

    def __init__(self, rate: np.ndarray) -> None:
        self.rate = rate
        moving = rate > 0
        if moving.all():
            self.positive = self.positive_rate = None
        else:
            self.positive = np.flatnonzero(moving)
            self.positive_rate = rate[self.positive]


_NO_RATES = _Rates(np.zeros(0))


class FlowNetwork:
    """Fluid max-min fair network living in one SimPy environment.

    The state of every flow in flight is held in three flat arrays (remaining bytes,
    rate, still running), the batches' flows laid end to end in arrival order, so
    draining bytes and finding the next completion are a few numpy operations however
    many batches run. One timer wakes the network at the next completion: a
    rescheduling supersedes the pending one (its callback then does nothing).

    Args:
        env: the engine's environment (time unit: ns).
        capacity_bytes_per_s: capacity of every link.

    Attributes:
        rate_solves: number of max-min computations done (cache misses).
        joint_solves: those of them made because separately solved groups of
            batches had levels too close to be solved apart (:func:`_levels_apart`).
        flows_completed: number of flows finished.
    """

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray) -> None:
        self._env = env
        self._capacity = np.asarray(capacity_bytes_per_s, dtype=np.float64)
        self._batches: list[_Batch] = []
        self._remaining = np.zeros(0)
        self._live = np.zeros(0, dtype=bool)
        self._last_update_ns = 0
        self._generation = 0
        # the rates of every set of running batches seen (same templates, same flows
        # finished), with what is derived from them (_Rates)
        self._rate_cache: dict[tuple, _Rates] = {}
        self._rates: _Rates = _NO_RATES
        # the time (ns) before which no flow can complete (_reschedule; 0: unknown)
        self._quiet_until_ns = 0
        # rates of groups of batches sharing no link with the others, per batch, and
        # the round levels of their solve (_solve_rates)
        self._group_cache: dict[tuple, tuple[list[np.ndarray], list[float]]] = {}
        self._overlaps: dict[tuple[int, int], bool] = {}
        self._grouping: dict[tuple[int, ...], list[list[int]]] = {}
        self.joint_solves = 0
        self._templates: dict[int, _Template] = {}
        self.rate_solves = 0
        self.flows_completed = 0
        self._finished_link_bytes = np.zeros(self._capacity.size)
        # finished batches whose link bytes are not in _finished_link_bytes yet:
        # (template, remaining bytes of its flows at the end), in order of ending
        self._unsummed: list[tuple[_Template, np.ndarray]] = []

    @property
    def _rate(self) -> np.ndarray:
        """Every running flow's rate (payload bytes/s), batches end to end."""
        return self._rates.rate

    @property
    def link_bytes(self) -> np.ndarray:
        """Wire bytes every link has carried so far (delivered payload times each
        link's weight), summed once per batch when asked or when the batch ends rather
        than at every rate change."""
        self._sum_finished()
        total = self._finished_link_bytes.copy()
        for batch in self._batches:
            links, carried = batch.link_bytes(
                self._remaining[batch.offset:batch.offset + batch.size])
            total[links] += carried
        return total

    def transfer(self, requests: Sequence[FlowRequest] | FlowBatch, *,
                 last_in_event: bool = False) -> simpy.Event:
        """Start flows now (a list of requests, or the same as a :class:`FlowBatch`);
        the returned event fires when the last one ends.

        ``last_in_event``: the caller is the last callback of a normal-priority event
        being processed and schedules nothing after this call (hardware.network's
        callback-driven plans): the wake-up timer is then created at once instead of
        from an urgent event, the next event SimPy would process (every urgent event
        due now went before the one being processed), so it gets the same place in
        the event order."""
        event = self._env.event()
        found = self._templates.get(id(requests))
        if found is None or found.requests is not requests:
            if len(self._templates) >= _TEMPLATES_MAX:
                self._templates.clear()
            found = self._templates[id(requests)] = _Template(requests)
        self._advance()
        live = found.live
        if found.key is None:  # no flow to run
            event.succeed()
            return event
        batch = _Batch(event, found)
        batch.offset = self._live.size
        self._batches.append(batch)
        self._remaining = np.concatenate((self._remaining, found.payload))
        self._live = np.concatenate((self._live, live))
        self._reschedule(last_in_event)  # sets the rates of all flows, these included
        return event

    # ------------------------------------------------------------------ internals
    def _advance(self) -> None:
        """Drain bytes for the time elapsed since the last update; finish flows."""
        now = self._env.now
        elapsed_s = (now - self._last_update_ns) / NS_PER_S
        self._last_update_ns = now
        if not self._batches:
            return
        rates = self._rates
        remaining = self._remaining
        # (the rate of a finished flow is 0: its remaining bytes stay as they are)
        if elapsed_s > 0:
            remaining -= np.minimum(rates.rate * elapsed_s, remaining)
        if now < self._quiet_until_ns:
            return  # no flow can have finished yet (_reschedule)
        live = self._live
        newly = remaining <= rates.rate * (_COMPLETION_SLACK_NS / NS_PER_S)
        newly &= live
        count = np.count_nonzero(newly)
        if not count:
            return
        live &= ~newly
        self.flows_completed += int(count)
        finished: list[_Batch] = []
        batches = self._batches
        touched = (np.logical_or.reduceat(newly, [b.offset for b in batches])
                   if len(batches) > 1 else (True,))
        for batch, hit in zip(batches, touched):
            if not hit:
                continue
            running = live[batch.offset:batch.offset + batch.size]
            if np.count_nonzero(running):
                batch.key = (batch.template.pattern, (~running).tobytes())
            else:
                finished.append(batch)
        if not finished:
            return
        if len(finished) == 1:  # (the common case: the two slices around it)
            batch = finished[0]
            start, end = batch.offset, batch.offset + batch.size
            self._unsummed.append((batch.template, remaining[start:end]))
            self._batches.remove(batch)
            self._remaining = np.concatenate((remaining[:start], remaining[end:]))
            self._live = np.concatenate((live[:start], live[end:]))
        else:
            keep = np.ones(live.size, dtype=bool)
            for batch in finished:
                start, end = batch.offset, batch.offset + batch.size
                self._unsummed.append((batch.template, remaining[start:end]))
                keep[start:end] = False
                self._batches.remove(batch)
            self._remaining, self._live = remaining[keep], live[keep]
        # (the rates are set again by the _reschedule that follows every _advance)
        offset = 0
        for batch in self._batches:
            batch.offset = offset
            offset += batch.size
        if len(self._unsummed) >= _UNSUMMED_MAX:
            self._sum_finished()
        for batch in finished:
            batch.event.succeed()

    def _sum_finished(self) -> None:
        """Add the link bytes of the batches ended since the last call to
        ``_finished_link_bytes``, as :meth:`_Batch.link_bytes` and
        ``total[links] += carried`` batch after batch would: one bincount gives every
        batch's per-link sums (each bin adds its batch's entries in their order,
        from 0), ``np.add.at`` adds them in the order the batches ended."""
        unsummed = self._unsummed
        if not unsummed:
            return
        self._unsummed = []
        base = np.cumsum([0] + [t.links_used.size for t, _ in unsummed])
        pieces: list[np.ndarray | None] = [None] * len(unsummed)
        by_template: dict[int, list[int]] = {}
        for i, (template, remaining) in enumerate(unsummed):
            if remaining.any():
                by_template.setdefault(id(template), []).append(i)
            else:  # every flow drained to 0 exactly (the common case): all delivered
                pieces[i] = template.delivered_link_bytes()
        if by_template:
            bins, weights, members_all = [], [], []
            for members in by_template.values():
                template = unsummed[members[0]][0]
                remaining = np.stack([unsummed[i][1] for i in members])
                delivered = np.maximum(template.payload - remaining, 0.0)
                weights.append((delivered[:, template.entry_flow]
                                * template.entry_weight).reshape(-1))
                bins.append((base[members][:, None]
                             + template.entry_local_link[None, :]).reshape(-1))
                members_all.extend(members)
            carried = np.bincount(np.concatenate(bins), weights=np.concatenate(weights),
                                  minlength=int(base[-1]))
            for i in members_all:
                pieces[i] = carried[base[i]:base[i + 1]]
        np.add.at(self._finished_link_bytes,
                  np.concatenate([t.links_used for t, _ in unsummed]), np.concatenate(pieces))

    def _solve_rates(self) -> None:
        """Set every flow's rate: from the cache when the same batches (same templates,
        same flows finished) ran before, else from the rates of each group of batches
        that share no link with the others (:meth:`_groups`), each solved by
        :func:`max_min_rates` on its own and cached, when that provably gives the rates
        of solving all batches at once (:meth:`_levels_apart`); else by one
        :func:`max_min_rates` over all batches' problems laid end to end."""
        batches = self._batches
        key = tuple([b.key for b in batches])
        cached = self._rate_cache.get(key)
        if cached is not None:
            self._rates = cached  # never written in place: replaced on every change
            return
        groups = self._groups()
        per_batch: list[np.ndarray] = [None] * len(batches)  # type: ignore[list-item]
        levels: list[float] = []
        for group in groups:
            group_key = tuple(batches[i].key for i in group)
            found = self._group_cache.get(group_key)
            if found is None:
                group_levels: list[float] = []
                members = [batches[i] for i in group]
                rates = self._solve(members, group_levels)
                for batch, batch_rates in zip(members, rates):
                    # a flow not running moves nothing (_advance drains rate * time)
                    batch_rates[~self._live[batch.offset:batch.offset + batch.size]] = 0.0
                found = (rates, group_levels)
                self._group_cache[group_key] = found
            for i, rates in zip(group, found[0]):
                per_batch[i] = rates
            levels.extend(found[1])
        if len(groups) > 1 and not _levels_apart(levels):
            per_batch = self._solve(batches)
            for batch, batch_rates in zip(batches, per_batch):
                batch_rates[~self._live[batch.offset:batch.offset + batch.size]] = 0.0
            self.joint_solves += 1
        self._rates = self._rate_cache[key] = _Rates(np.concatenate(per_batch))

    def _groups(self) -> list[list[int]]:
        """The running batches (indices) in groups that share no link with one another:
        batches whose templates cross a common link are in the same group (directly or
        through others). Groups in order of their first batch, batches in order."""
        batches = self._batches
        count = len(batches)
        if count == 1:
            return [[0]]
        patterns = tuple([b.template.pattern for b in batches])
        found = self._grouping.get(patterns)
        if found is not None:
            return found
        owner = list(range(count))  # union-find, by index
        overlaps = self._overlaps
        for i in range(count):
            a = batches[i].template
            for j in range(i + 1, count):
                b = batches[j].template
                pair = (a.pattern, b.pattern)
                meet = overlaps.get(pair)
                if meet is None:
                    meet = overlaps[pair] = not a.link_set.isdisjoint(b.link_set)
                if meet:
                    x, y = i, j
                    while owner[x] != x:
                        x = owner[x]
                    while owner[y] != y:
                        y = owner[y]
                    if x != y:
                        owner[max(x, y)] = min(x, y)
        groups: dict[int, list[int]] = {}
        for i in range(count):
            root = i
            while owner[root] != root:
                root = owner[root]
            groups.setdefault(root, []).append(i)
        found = self._grouping[patterns] = list(groups.values())
        return found

    def _solve(self, batches: Sequence[_Batch], levels: list[float] | None = None
               ) -> list[np.ndarray]:
        """Rates of every flow of ``batches`` (one array per batch) by one
        :func:`max_min_rates` over their problems laid end to end (its round levels
        appended to ``levels``)."""
        flows, links, weights, caps, mults, offsets = [], [], [], [], [], [0]
        parts = []
        weighted = False
        live = self._live
        for batch in batches:
            done = ~live[batch.offset:batch.offset + batch.size]
            entry_flow, entry_link, entry_weight, batch_caps, mult, class_of = \
                batch.problem(done)
            flows.append(entry_flow + offsets[-1])
            links.append(entry_link)
            weights.append(entry_weight)
            caps.append(batch_caps)
            mults.append(mult)
            weighted |= mult is not None
            parts.append(class_of)
            offsets.append(offsets[-1] + batch_caps.size)
        multiplicity = None
        if weighted:
            multiplicity = np.concatenate([np.ones(c.size) if m is None else m
                                           for m, c in zip(mults, caps)])
        rates = max_min_rates(
            np.concatenate(flows), np.concatenate(links), np.concatenate(weights),
            offsets[-1], self._capacity, np.concatenate(caps), multiplicity, levels,
        )
        self.rate_solves += 1
        return [rates[offsets[i]:offsets[i + 1]] if class_of is None
                else rates[offsets[i]:offsets[i + 1]][class_of]
                for i, class_of in enumerate(parts)]

    def _reschedule(self, at_once: bool = False) -> None:
        """Recompute rates and arm the timer for when the next flow will finish
        (``at_once``: see :meth:`transfer`)."""
        self._generation += 1
        if not self._batches:
            self._rates = _NO_RATES
            return
        self._solve_rates()
        rates = self._rates
        # the soonest end of a running flow: a flow of rate 0 (finished) would give
        # inf or nan, which fmin passes over: the minimum over the flows of positive
        # rate is the same number
        if rates.positive is None:
            next_s = float(np.fmin.reduce(self._remaining / rates.rate))
        elif rates.positive.size:
            next_s = float(np.fmin.reduce(self._remaining[rates.positive]
                                          / rates.positive_rate))
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                next_s = float(np.fmin.reduce(self._remaining / rates.rate))
        delay_ns = int(np.ceil(next_s * NS_PER_S - _COMPLETION_SLACK_NS))
        # No flow finishes before now + delay_ns - 1: a running flow (remaining bytes
        # R > 0 after _advance, rate r) is complete at elapsed e when R - r e <=
        # r * slack, i.e. e_ns >= 1e9 R / r - slack_ns >= 1e9 next_s - slack_ns >
        # delay_ns - 1 (delay_ns being that rounded up); rounding errors are ~1e-16
        # relative, far below the 1 ns margin. A running flow of rate 0 never finishes.
        # So _advance skips the completion test before then (same result).
        self._quiet_until_ns = self._env.now + delay_ns - 1
        if at_once:
            # the urgent event below would be the next one processed, nothing being
            # scheduled in between: its timeout would get the next event id, as here
            timer = self._env.timeout(max(delay_ns, 0), self._generation)
            timer.callbacks.append(self._wake)
            return
        # The timeout is created when an urgent event scheduled now is processed, the
        # point in SimPy's event order at which a process started here would create
        # it: ties with other events at the wake-up time resolve as they always have.
        arm = simpy.Event(self._env)
        arm._ok = True
        arm._value = (max(delay_ns, 0), self._generation)
        arm.callbacks.append(self._arm)
        self._env.schedule(arm, URGENT)

    def _arm(self, event: simpy.Event) -> None:
        delay_ns, generation = event._value
        if generation != self._generation:
            return  # superseded already: its timer would do nothing
        timer = self._env.timeout(delay_ns, generation)
        timer.callbacks.append(self._wake)

    def _wake(self, timer: simpy.Event) -> None:
        if timer._value != self._generation:
            return  # superseded by a later arrival or completion
        self._advance()
        # Processing a timeout (normal priority): every urgent event due now was
        # processed before it, and _advance schedules only normal ones.
        self._reschedule(at_once=True)
