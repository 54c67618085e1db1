"""Network performance models behind one interface, at two fidelities.

Communication reaches the network as plans (strategies.collectives.plans builds
them; this module reads them through :class:`CommPlanLike`, :class:`PhaseLike` and
:class:`TransferLike`): a sequence of phases, each a set of concurrent, pipelined
transfers. A phase costs

    latency  = intra_steps * hop[scale-up tier][protocol]
             + inter_steps * (hop[network][protocol] + switch_hops * switch_latency)
    bandwidth: the transfers' payload through the links of their paths,

and a plan adds the base latency of its algorithm family and protocol once
(the shape of NCCL's own tuning model, src/graph/tuning.cc).

* closed-form alpha-beta (:meth:`NetworkModel.plan_time_ns`; the ``analytic``
  and ``event`` fidelities of :class:`hardware.cost.CostModel`): a phase's
  bandwidth time is ``max over links of load / capacity`` where the load counts
  only this plan's own transfers: links shared *within* a collective are
  accounted for, other traffic is not;
* :class:`FlowFabric` (fidelity ``flow``): the transfers become flows in a
  :class:`hardware.flow.FlowNetwork` shared by everything running at the same
  time, with max-min fair sharing of every link.

For a phase whose transfers carry equal payloads and run alone, progressive
filling freezes every flow on the most loaded link at ``capacity / load``, so
both fidelities give the same time (tests/test_network.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np
import simpy

from hardware.flow import FlowNetwork, FlowRequest
from hardware.spec import PROTOCOLS, CommTuningSpec
from hardware.topology import ClusterLayout
from hardware.units import seconds_to_ns

#: How a transfer is driven, which changes the bandwidth it reaches.
TRANSFER_MODES = ("collective", "p2p", "nvls")


class TransferLike(Protocol):
    """What the network reads of a transfer (strategies.collectives.plans.Transfer)."""

    src: int
    dst: int
    payload_bytes: float
    mode: str


class PhaseLike(Protocol):
    """What the network reads of a phase (strategies.collectives.plans.Phase)."""

    transfers: Sequence[TransferLike]
    intra_steps: int
    inter_steps: int
    switch_hops: int


class CommPlanLike(Protocol):
    """What the network reads of a plan (strategies.collectives.plans.CommPlanLike)."""

    family: str
    protocol: str
    phases: Sequence[PhaseLike]
    label: str


class NetworkModel:
    """Paths, per-link weights and latencies shared by both fidelities.

    Args:
        layout: ranks placed on a cluster.
        comm: latency and efficiency per tier and protocol.
    """

    def __init__(self, layout: ClusterLayout, comm: CommTuningSpec) -> None:
        self.layout = layout
        self.comm = comm
        spec = layout.spec
        self._nvls_factor = (
            spec.scale_up.link_efficiency / spec.scale_up.nvls_efficiency
            if spec.scale_up.nvls_efficiency > 0 else np.inf
        )
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}
        self._loads: dict[int, tuple[PhaseLike, dict[str, np.ndarray]]] = {}
        self._tier_names = ("nvlink", "pcie", "network")
        self._tier_index = np.asarray(
            [self._tier_names.index(t) for t in layout.link_tier], dtype=np.int64)
        self._weights = {
            (tier, protocol, mode): self._weight(tier, protocol, mode)
            for tier in ("nvlink", "pcie", "network")
            for protocol in PROTOCOLS
            for mode in TRANSFER_MODES
        }

    def _weight(self, tier: str, protocol: str, mode: str) -> float:
        efficiency = self.comm.protocol_efficiency[tier][protocol]
        if mode == "p2p":
            efficiency *= self.comm.p2p_efficiency[tier]
        weight = 1.0 / efficiency
        if mode == "nvls":
            weight *= self._nvls_factor
        return weight

    def links_of(self, transfer: TransferLike) -> tuple[int, ...]:
        """Links a transfer crosses (NVLS: the GPU's own NVLink ports)."""
        layout = self.layout
        if transfer.mode == "nvls":
            return (layout.gpu_out_link(transfer.src), layout.gpu_in_link(transfer.dst))
        key = (transfer.src, transfer.dst)
        links = self._paths.get(key)
        if links is None:
            links = layout.path(transfer.src, transfer.dst).links
            self._paths[key] = links
        return links

    def request(self, transfer: TransferLike, protocol: str) -> FlowRequest:
        """The links a transfer loads and its wire bytes per payload byte on each."""
        links = self.links_of(transfer)
        tiers = self.layout.link_tier
        weights = tuple(self._weights[(tiers[link], protocol, transfer.mode)] for link in links)
        return FlowRequest(links, weights, float(transfer.payload_bytes))

    def phase_latency_s(self, phase: PhaseLike, protocol: str) -> float:
        """Latency of a phase: its steps times the hop latency of their tier."""
        hop = self.comm.hop_latency_s
        switch_s = self.layout.spec.fabric.switch_hop_latency_s
        intra = phase.intra_steps * hop[self.layout.scale_up_tier][protocol]
        inter = phase.inter_steps * (hop["network"][protocol] + phase.switch_hops * switch_s)
        return intra + inter

    def base_latency_s(self, plan: CommPlanLike) -> float:
        """Fixed cost of one call of the plan's algorithm family and protocol."""
        return self.comm.base_latency_s[plan.family][plan.protocol]

    def _payload_per_link(self, phase: PhaseLike) -> dict[str, np.ndarray]:
        """Payload bytes each link carries in a phase, per transfer mode (cached)."""
        cached = self._loads.get(id(phase))
        if cached is not None:
            return cached[1]
        links_by_mode: dict[str, list[int]] = {}
        bytes_by_mode: dict[str, list[float]] = {}
        for transfer in phase.transfers:
            links = self.links_of(transfer)
            links_by_mode.setdefault(transfer.mode, []).extend(links)
            bytes_by_mode.setdefault(transfer.mode, []).extend(
                [transfer.payload_bytes] * len(links))
        loads = {
            mode: np.bincount(np.asarray(links_by_mode[mode], dtype=np.int64),
                              weights=np.asarray(bytes_by_mode[mode]),
                              minlength=self.layout.num_links)
            for mode in links_by_mode
        }
        self._loads[id(phase)] = (phase, loads)  # keep the phase so its id stays unique
        return loads

    def bandwidth_factor(self, family: str, protocol: str, size_bytes: float) -> float:
        """How much longer than its full-rate time a message of ``size_bytes`` takes to
        stream (1.0: the link payload rates of the preset are reached at every size)."""
        return 1.0

    def phase_bandwidth_s(self, phase: PhaseLike, protocol: str) -> float:
        """Alpha-beta bandwidth time of a phase: max over links of load / capacity.

        The load of a link is the wire bytes of this phase's own transfers
        (payload / protocol efficiency of the link's tier).
        """
        if not phase.transfers:
            return 0.0
        wire = np.zeros(self.layout.num_links)
        for mode, payload in self._payload_per_link(phase).items():
            weight_by_tier = np.asarray(
                [self._weights[(tier, protocol, mode)] for tier in self._tier_names])
            wire += payload * weight_by_tier[self._tier_index]
        used = wire > 0
        if not used.any():
            return 0.0
        return float((wire[used] / self.layout.capacity_bytes_per_s[used]).max())

    def plan_time_s(self, plan: CommPlanLike) -> float:
        """Uncontended duration of a plan in seconds (analytic fidelity)."""
        total = self.base_latency_s(plan) if plan.phases else 0.0
        for phase in plan.phases:
            total += self.phase_latency_s(phase, plan.protocol)
            total += self.phase_bandwidth_s(phase, plan.protocol)
        return total

    def plan_time_ns(self, plan: CommPlanLike) -> int:
        """Uncontended duration of a plan in ns, rounded per term as the engine does."""
        if not plan.phases:
            return 0
        total = seconds_to_ns(self.base_latency_s(plan))
        for phase in plan.phases:
            total += seconds_to_ns(self.phase_latency_s(phase, plan.protocol))
            total += seconds_to_ns(self.phase_bandwidth_s(phase, plan.protocol))
        return total


class FlowFabric:
    """Fidelity ``flow``: phases become flows sharing links max-min fairly."""

    fidelity = "flow"

    def __init__(self, env: simpy.Environment, model: NetworkModel) -> None:
        self.env = env
        self.model = model
        self.network = FlowNetwork(env, model.layout.capacity_bytes_per_s)
        # Keyed by identity; the plan is kept so its id cannot be reused.
        self._requests: dict[int, tuple[CommPlanLike, list[list[FlowRequest]]]] = {}
        self._mirrored: dict[tuple, tuple[tuple, list[FlowRequest]]] = {}

    def _phase_requests(self, plan: CommPlanLike, index: int) -> Sequence[FlowRequest]:
        cached = self._requests.get(id(plan))
        if cached is None:
            per_phase = [[self.model.request(t, plan.protocol) for t in phase.transfers]
                         for phase in plan.phases]
            cached = (plan, per_phase)
            self._requests[id(plan)] = cached
        return cached[1][index]

    def _with_mirrors(self, plan: CommPlanLike, mirrors: Sequence[CommPlanLike],
                      index: int) -> Sequence[FlowRequest]:
        """Phase ``index`` of ``plan`` plus the same phase of every mirror plan, as
        one batch. A mirror sharing no link with anything simulated changes no rate
        but still costs solver time: the engine leaves those out (Engine._may_contend)."""
        key = (id(plan), tuple(id(m) for m in mirrors), index)
        cached = self._mirrored.get(key)
        if cached is not None:
            return cached[1]
        requests = list(self._phase_requests(plan, index))
        for mirror in mirrors:
            if index < len(mirror.phases):
                requests.extend(self._phase_requests(mirror, index))
        self._mirrored[key] = ((plan, tuple(mirrors)), requests)
        return requests

    def run(self, plan: CommPlanLike, mirrors: Sequence[CommPlanLike] = ()) -> Iterator[simpy.Event]:
        """SimPy process body: base latency, then each phase's latency and flows.

        ``mirrors``: the same communication of ranks a symmetry-reduced program
        leaves out (same algorithm and protocol); their flows share the links
        with this plan's, and a phase ends when all of them have arrived, as it
        would in the full job where they run in lockstep.
        """
        if not plan.phases:
            return
        yield self.env.timeout(seconds_to_ns(self.model.base_latency_s(plan)))
        for index, phase in enumerate(plan.phases):
            yield self.env.timeout(
                seconds_to_ns(self.model.phase_latency_s(phase, plan.protocol)))
            if phase.transfers:
                requests = (self._with_mirrors(plan, mirrors, index) if mirrors
                            else self._phase_requests(plan, index))
                yield self.network.transfer(requests)
