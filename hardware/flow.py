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

from hardware.units import NS_PER_S

#: A flow whose remaining bytes would take less than this (ns) is complete.
_COMPLETION_SLACK_NS = 1e-3


def max_min_rates(
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    entry_weight: np.ndarray,
    num_flows: int,
    capacity: np.ndarray,
    flow_cap: np.ndarray | None = None,
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

    Returns:
        Array of ``num_flows`` rates; a flow that crosses no link gets its ceiling
        (``inf`` without one).
    """
    caps = (np.full(num_flows, np.inf) if flow_cap is None
            else np.asarray(flow_cap, dtype=np.float64))
    rates = caps.copy()
    if entry_flow.size == 0:
        return rates
    remaining = capacity.astype(np.float64).copy()
    frozen = np.zeros(num_flows, dtype=bool)
    has_links = np.zeros(num_flows, dtype=bool)
    has_links[entry_flow] = True
    frozen[~has_links] = True
    active = np.ones(entry_flow.size, dtype=bool)
    num_links = capacity.size
    while active.any():
        link_weight = np.bincount(
            entry_link[active], weights=entry_weight[active], minlength=num_links
        )
        used = link_weight > 0
        share = np.full(num_links, np.inf)
        share[used] = np.maximum(remaining[used], 0.0) / link_weight[used]
        level = share.min()
        open_caps = np.where(frozen, np.inf, caps)
        cap_level = open_caps.min()
        newly = np.zeros(num_flows, dtype=bool)
        if cap_level < level:  # a flow's own ceiling binds before any link
            level = cap_level
            newly[open_caps <= level * (1.0 + 1e-12)] = True
        else:
            bottleneck = share <= level * (1.0 + 1e-12)
            newly[entry_flow[active & bottleneck[entry_link]]] = True
            newly |= open_caps <= level * (1.0 + 1e-12)
        rates[newly] = level
        frozen |= newly
        newly_entries = active & newly[entry_flow]
        remaining -= np.bincount(
            entry_link[newly_entries],
            weights=entry_weight[newly_entries] * level,
            minlength=num_links,
        )
        active &= ~newly_entries
    return rates


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


class _Batch:
    """Flows submitted together; its event fires when all have finished."""

    __slots__ = ("event", "entry_flow", "entry_link", "entry_weight", "remaining",
                 "caps", "done", "pattern", "payload", "num_links")

    def __init__(self, event: simpy.Event, requests: Sequence[FlowRequest]) -> None:
        self.event = event
        flows, links, weights = [], [], []
        for index, request in enumerate(requests):
            flows.extend([index] * len(request.links))
            links.extend(request.links)
            weights.extend(request.weights)
        self.entry_flow = np.asarray(flows, dtype=np.int64)
        self.entry_link = np.asarray(links, dtype=np.int64)
        self.entry_weight = np.asarray(weights, dtype=np.float64)
        self.remaining = np.asarray([r.payload_bytes for r in requests], dtype=np.float64)
        self.payload = self.remaining.copy()
        self.caps = np.asarray([r.max_rate for r in requests], dtype=np.float64)
        # A flow that crosses no link (GPU to itself) is delivered at once.
        no_links = np.asarray([not r.links for r in requests], dtype=bool)
        self.done = (self.remaining <= 0) | no_links
        # Identical link patterns get identical rates: key for the rate cache.
        self.pattern = hash((self.entry_flow.tobytes(), self.entry_link.tobytes(),
                             self.entry_weight.tobytes(), self.caps.tobytes()))


    def link_bytes(self) -> np.ndarray:
        """Wire bytes this batch's flows have put on each link so far (payload
        delivered, payload minus what remains, times each link's weight)."""
        delivered = np.maximum(self.payload - self.remaining, 0.0)
        return np.bincount(self.entry_link, weights=delivered[self.entry_flow] * self.entry_weight,
                           minlength=self.num_links)


class FlowNetwork:
    """Fluid max-min fair network living in one SimPy environment.

    Args:
        env: the engine's environment (time unit: ns).
        capacity_bytes_per_s: capacity of every link.

    Attributes:
        rate_solves: number of max-min computations done (cache misses).
        flows_completed: number of flows finished.
    """

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray) -> None:
        self._env = env
        self._capacity = np.asarray(capacity_bytes_per_s, dtype=np.float64)
        self._batches: list[_Batch] = []
        self._rates: list[np.ndarray] = []
        self._last_update_ns = 0
        self._generation = 0
        self._rate_cache: dict[tuple, list[np.ndarray]] = {}
        self.rate_solves = 0
        self.flows_completed = 0
        self._finished_link_bytes = np.zeros(self._capacity.size)

    @property
    def link_bytes(self) -> np.ndarray:
        """Wire bytes every link has carried so far (delivered payload times each
        link's weight), summed once per batch when asked or when the batch ends rather
        than at every rate change."""
        total = self._finished_link_bytes.copy()
        for batch in self._batches:
            total += batch.link_bytes()
        return total

    def transfer(self, requests: Sequence[FlowRequest]) -> simpy.Event:
        """Start flows now; the returned event fires when the last one ends."""
        event = self._env.event()
        batch = _Batch(event, requests)
        batch.num_links = self._capacity.size
        self._advance()
        if batch.done.all():
            event.succeed()
            return event
        self._batches.append(batch)
        self._reschedule()
        return event

    # ------------------------------------------------------------------ internals
    def _advance(self) -> None:
        """Drain bytes for the time elapsed since the last update; finish flows."""
        now = self._env.now
        elapsed_s = (now - self._last_update_ns) / NS_PER_S
        self._last_update_ns = now
        if not self._batches:
            return
        finished: list[_Batch] = []
        for batch, rates in zip(self._batches, self._rates):
            live = ~batch.done
            if elapsed_s > 0:
                moved = np.where(live, np.minimum(rates * elapsed_s, batch.remaining), 0.0)
                batch.remaining -= moved
            slack = rates * (_COMPLETION_SLACK_NS / NS_PER_S)
            newly = live & (batch.remaining <= slack)
            if newly.any():
                batch.done |= newly
                self.flows_completed += int(newly.sum())
            if batch.done.all():
                finished.append(batch)
        for batch in finished:
            self._finished_link_bytes += batch.link_bytes()
            self._batches.remove(batch)
            batch.event.succeed()

    def _solve_rates(self) -> None:
        key = tuple(
            (b.pattern, None if not b.done.any() else b.done.tobytes()) for b in self._batches
        )
        cached = self._rate_cache.get(key)
        if cached is not None:
            self._rates = cached
            return
        flows, links, weights, caps, offsets = [], [], [], [], [0]
        for batch in self._batches:
            keep = ~batch.done[batch.entry_flow]
            flows.append(batch.entry_flow[keep] + offsets[-1])
            links.append(batch.entry_link[keep])
            weights.append(batch.entry_weight[keep])
            caps.append(batch.caps)
            offsets.append(offsets[-1] + batch.remaining.size)
        rates = max_min_rates(
            np.concatenate(flows), np.concatenate(links), np.concatenate(weights),
            offsets[-1], self._capacity, np.concatenate(caps),
        )
        self.rate_solves += 1
        self._rates = [rates[offsets[i]:offsets[i + 1]] for i in range(len(self._batches))]
        self._rate_cache[key] = self._rates

    def _reschedule(self) -> None:
        """Recompute rates and wake up when the next flow will finish."""
        self._generation += 1
        if not self._batches:
            self._rates = []
            return
        self._solve_rates()
        next_s = np.inf
        for batch, rates in zip(self._batches, self._rates):
            live = ~batch.done
            if live.any():
                next_s = min(next_s, float((batch.remaining[live] / rates[live]).min()))
        delay_ns = int(np.ceil(next_s * NS_PER_S - _COMPLETION_SLACK_NS))
        self._env.process(self._wake(max(delay_ns, 0), self._generation))

    def _wake(self, delay_ns: int, generation: int):
        yield self._env.timeout(delay_ns)
        if generation != self._generation:
            return  # superseded by a later arrival or completion
        self._advance()
        self._reschedule()
