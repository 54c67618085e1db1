"""Network performance models behind one interface, at two fidelities.

Communication reaches the network as plans (strategies.collectives.plans builds
them; this module reads them through :class:`CommPlanLike`, :class:`PhaseLike` and
:class:`TransferLike`): a sequence of phases, each a set of concurrent, pipelined
transfers. A phase costs

    latency  = intra_steps * hop[scale-up tier][protocol]
             + inter_steps * (hop[network][protocol] + switch_hops * switch_latency)
    bandwidth: the transfers' payload through the links of their paths, but no
               faster than NCCL's kernels can drive it (below),

and a plan adds the base latency of its algorithm family and protocol once
(the shape of NCCL's own tuning model, src/graph/tuning.cc).

**What NCCL's kernels can drive** (:meth:`NetworkModel.transfer_caps`): each
transfer may carry a rate ceiling on top of its links, from two mechanisms of
NCCL itself:

* *bus-bandwidth ceilings* of a protocol or algorithm (tuning.cc ``llMaxBws`` for
  LL; ``perChMax*Bws`` per channel for LL128 and trees, times the graph channels),
  scaled down when NCCL runs fewer channels for a small message (enqueue.cc:
  ``while nBytes < nc * nt * threadThreshold: nc--``). They bound a phase to
  ``bus_bytes / ceiling``, so every transfer of the phase gets the ceiling in
  proportion to its payload;
* *p2p channels per network peer*: a send/recv to a rank in another NVLink domain
  runs on a few channels (paths.cc ncclTopoGetNchannels, halved for large
  communicators in ncclTopoComputeP2pChannels), each moving at most
  NCCL_P2P_PER_CHANNEL_NET_BW, which is why one GPU pair reaches about half of a
  400G NIC and a full-job sendrecv ring slows as ranks grow.

The ceiling depends on the message size only through the channel count, so the
cost of a phase is ``max(link time, ceiling time)``: piecewise in the size, and the
same in both fidelities (a ceiling is a private link of one flow in
:mod:`hardware.flow`).

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

import dataclasses
import math
from typing import Iterator, Protocol, Sequence

import numpy as np
import simpy

from hardware.flow import FlowBatch, FlowNetwork, FlowRequest
from hardware.spec import PROTOCOLS, CommTuningSpec, node_bucket
from hardware.topology import TIERS, ClusterLayout
from hardware.units import seconds_to_ns

#: Most heads an NVLS all-reduce has in one NVLink domain: NCCL_MAX_NVLS_ARITY
#: (NVIDIA/nccl src/include/device.h, 32 since NCCL 2.20; 8 before).
NVLS_MAX_HEADS = 32

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
    bus_bytes: float


class CommPlanLike(Protocol):
    """What the network reads of a plan (strategies.collectives.plans.CommPlan)."""

    family: str
    protocol: str
    phases: Sequence[PhaseLike]
    label: str
    size_bytes: float
    ranks: int
    domains: int
    local_ranks: int


#: Most flows one phase may start at flow fidelity (each costs a FlowRequest and its
#: entries in the solver's arrays, a few hundred bytes: about 1 GB at this count).
FLOWS_MAX = 4_000_000


def all_pairs_p2p_cap_s(model: "NetworkModel", plan: CommPlanLike, transfers) -> float:
    """Seconds an all-pairs exchange (strategies.collectives.plans.AllPairs) takes at
    its send/recv channel ceilings alone: every transfer carries the same payload, so
    the ceiling binds as soon as one pair crosses NVLink domains (0: none)."""
    if transfers.mode != "p2p" or transfers.payload_bytes <= 0:
        return 0.0
    cap = model.p2p_cap_bytes_per_s(getattr(plan, "ranks", 2))
    if math.isinf(cap):
        return 0.0
    domain = model.layout.domain_of
    if len({domain(r) for r in transfers.group}) < 2:
        return 0.0
    return transfers.payload_bytes / cap


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
        # the same by what a phase of TransferColumns moves (mode, payload, sources,
        # destinations): the phases of different algorithms, protocols and collective
        # kinds over one ring list the same transfers (about half of a plan search's)
        self._loads_by_content: dict[tuple, dict[str, np.ndarray]] = {}
        # per loads dict of one mode (by identity, kept alive here): the links it
        # loads, their payload bytes and tier index (phase_bandwidth_s)
        self._weights_by_tier: dict[tuple[str, str], np.ndarray] = {}
        self._used: dict[int, tuple[dict, np.ndarray, np.ndarray, np.ndarray, str]] = {}
        # per loads dict of one mode (by identity, kept alive here): its largest payload
        # on each run of links of one kind that it loads, as (tier, first link, bytes)
        self._range_maxima: dict[int, tuple[dict, str, tuple]] = {}
        # the first link of each non-empty run of links of one kind, and its tier
        # (ClusterLayout._link_ranges: contiguous, one capacity each while uniform)
        ranges = [(start, count) for start, count, _ in layout._link_ranges if count]
        self._range_starts = np.asarray([start for start, _ in ranges], dtype=np.int64)
        self._range_tiers = tuple(TIERS[layout.link_tier_index[start]] for start, _ in ranges)
        self._tier_names = TIERS
        self._tier_index = layout.link_tier_index
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

    def request(self, transfer: TransferLike, protocol: str,
                max_rate: float = math.inf, pipeline_factor: float = 1.0) -> FlowRequest:
        """The links a transfer loads, its wire bytes per payload byte on each, its
        rate ceiling (payload bytes/s; :meth:`transfer_caps`), and the bytes it
        streams (its payload times the phase's :meth:`pipeline_factor`)."""
        links = self.links_of(transfer)
        tiers = self.layout.link_tier
        weights = tuple(self._weights[(tiers[link], protocol, transfer.mode)] for link in links)
        return FlowRequest(links, weights, float(transfer.payload_bytes) * pipeline_factor,
                           max_rate)

    # ----------------------------------------------------- NCCL kernel ceilings
    def graph_channels(self, plan: CommPlanLike) -> int:
        """Channels NCCL's topology search lays for the plan's communicator (what its
        per-channel ceilings multiply by): ``rail_channels`` per NIC rail the ranks of
        one domain use across domains (one per GPU on a DGX: the B200 logs print 8
        tree channels for 8 NICs), ``domain_channels`` inside one NVLink domain."""
        comm = self.comm
        if plan.domains <= 1:
            return comm.domain_channels
        spec = self.layout.spec
        nodes_per_domain = max(1, spec.scale_up.domain_gpus // spec.gpus_per_node)
        rails = min(max(plan.local_ranks, 1), spec.nic.count_per_node * nodes_per_domain)
        return rails * comm.rail_channels

    def channels_running(self, plan: CommPlanLike, size_bytes: float | None = None) -> int:
        """Channels NCCL runs for a message (enqueue.cc: from ``nChannels``, one less
        while ``nBytes < nc * nt * threadThreshold``; ring LL's threshold is times
        the ranks, tuning.cc)."""
        comm = self.comm
        channels = comm.collective_channels
        per_channel = comm.channel_threshold_bytes.get(plan.protocol, 0)
        if plan.family == "ring" and plan.protocol == "LL":
            per_channel *= max(plan.ranks, 1)
        if per_channel <= 0:
            return channels
        size = plan.size_bytes if size_bytes is None else size_bytes
        return int(min(channels, max(1, size // per_channel)))

    def bus_cap_bytes_per_s(self, plan: CommPlanLike, size_bytes: float | None = None) -> float:
        """NCCL's ceiling on the bus bandwidth of one rank for this plan at this size
        (inf: none): LL's ``llMaxBws``, a ceiling of the whole communicator, and the
        per-channel ``perChMax*Bws`` of its family and protocol times the graph
        channels (tuning.cc), scaled by the share of channels NCCL runs at this size
        (:meth:`channels_running`)."""
        if plan.domains <= 0:
            return math.inf
        comm = self.comm
        bucket = node_bucket(plan.domains)
        cap = math.inf
        if plan.protocol == "LL" and plan.family in ("ring", "tree"):
            cap = comm.ll_max_bus_bytes_per_s.get(bucket) or math.inf
        per_channel = (comm.channel_max_bus_bytes_per_s.get(plan.family, {})
                       .get(plan.protocol, {}).get(bucket))
        if per_channel:
            running = self.channels_running(plan, size_bytes) / comm.collective_channels
            cap = min(cap, per_channel * self.graph_channels(plan) * running)
        return cap

    def p2p_channels_per_peer(self, ranks: int) -> int:
        """Channels a send/recv to a rank in another NVLink domain runs on.

        NCCL (src/graph/paths.cc): ``nNetChannels`` per network peer (>= 2.29:
        ``max(1, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW))``), halved while
        ``channels x ceil(ranks / peers per channel) > p2pnChannels``
        (ncclTopoComputeP2pChannels: all peers of a round must fit the pool).
        """
        comm = self.comm
        channels = comm.p2p_net_channels_per_peer
        if channels <= 0:  # NCCL >= 2.29: enough channels to fill the NIC (GB/s, as ints)
            per_channel_gb = int(comm.p2p_net_channel_bytes_per_s / 1e9)
            nic_gb = int(self.layout.spec.nic.bytes_per_s / 1e9)
            channels = max(1, math.ceil(nic_gb / per_channel_gb)) if per_channel_gb else 1
        batches = -(-max(ranks, 2) // comm.p2p_peers_per_channel)
        while channels > 1 and channels * batches > comm.p2p_channels:
            channels //= 2
        return channels

    def p2p_cap_bytes_per_s(self, ranks: int) -> float:
        """Most a send/recv to another NVLink domain moves: its channels times what one
        channel moves (inf when the preset sets no per-channel rate)."""
        per_channel = self.comm.p2p_net_channel_bytes_per_s
        if per_channel <= 0:
            return math.inf
        return self.p2p_channels_per_peer(ranks) * per_channel

    def transfer_caps(self, plan: CommPlanLike, phase: PhaseLike,
                      size_bytes: float | None = None) -> list[float]:
        """Rate ceiling of each transfer of a phase (payload bytes/s; inf: none).

        A bus-bandwidth ceiling C holds the phase to ``bus_bytes / C``: each transfer
        gets ``payload x C / bus_bytes``, so all of them end together when it binds.
        A p2p transfer to another NVLink domain also gets :meth:`p2p_cap_bytes_per_s`.
        """
        if getattr(phase.transfers, "all_pairs", False) and len(phase.transfers) > FLOWS_MAX:
            raise ValueError(
                f"fidelity: 'flow' would run {len(phase.transfers):,} flows at once (every one "
                f"of {len(phase.transfers.group):,} ranks to every other); at most "
                f"{FLOWS_MAX:,} fit in memory: use fidelity 'analytic' or fewer ranks")
        caps = [math.inf] * len(phase.transfers)
        bus_bytes = getattr(phase, "bus_bytes", 0.0)
        if bus_bytes > 0:
            cap = self.bus_cap_bytes_per_s(plan, size_bytes)
            if not math.isinf(cap):
                caps = [t.payload_bytes * cap / bus_bytes for t in phase.transfers]
        if any(t.mode == "p2p" for t in phase.transfers):
            p2p = self.p2p_cap_bytes_per_s(getattr(plan, "ranks", 2))
            if not math.isinf(p2p):
                domain = self.layout.domain_of
                caps = [min(c, p2p) if t.mode == "p2p" and domain(t.src) != domain(t.dst) else c
                        for c, t in zip(caps, phase.transfers)]
        return caps

    def transfer_caps_columns(self, plan: CommPlanLike, phase: PhaseLike, src: np.ndarray,
                              dst: np.ndarray, payload: np.ndarray, mode: str) -> np.ndarray:
        """:meth:`transfer_caps` of a phase whose transfers all have ``mode``, given as
        arrays (sources, destinations, payload bytes as floats), in numpy: the same
        products and minima element by element."""
        caps = np.full(src.size, math.inf)
        bus_bytes = getattr(phase, "bus_bytes", 0.0)
        if bus_bytes > 0:
            cap = self.bus_cap_bytes_per_s(plan)
            if not math.isinf(cap):
                caps = payload * cap / bus_bytes
        if mode == "p2p" and src.size:
            p2p = self.p2p_cap_bytes_per_s(getattr(plan, "ranks", 2))
            if not math.isinf(p2p):
                cross = self.layout.domains_of(src) != self.layout.domains_of(dst)
                caps = np.where(cross, np.minimum(caps, p2p), caps)
        return caps

    def tree_chunk_bytes(self, plan: CommPlanLike, phase: PhaseLike,
                         size_bytes: float | None = None) -> float:
        """Chunk a tree all-reduce pipelines in (NCCL enqueue.cc): one Simple step of
        the channel buffer (NCCL_BUFFSIZE / NCCL_STEPS), halved while a channel
        would get fewer than 8x, 4x and 1x the tree depth in chunks (down to 128, 64
        and 32 KiB)."""
        size = plan.size_bytes if size_bytes is None else size_bytes
        channels = self.channels_running(plan, size)
        depth = max((phase.intra_steps + phase.inter_steps) // 2, 1)
        chunk = float(self.comm.tree_chunk_bytes)
        for per_depth, floor in ((8, 131072), (4, 65536), (1, 32768)):
            while size / (channels * chunk) < depth * per_depth and chunk > floor:
                chunk /= 2
        return chunk

    def pipeline_factor(self, plan: CommPlanLike, phase: PhaseLike,
                        size_bytes: float | None = None) -> float:
        """How much longer than its bytes alone a phase streams because it is
        pipelined in chunks (1.0: not modelled as such).

        A tree all-reduce (Simple) moves each channel's data up and down its tree in
        chunks: the last chunk leaves a leaf after all others and then crosses the
        whole tree, up and down, so the phase streams ``(2 depth - 1)`` more chunks
        per channel than its data (the pipeline fill; NCCL enqueue.cc picks the
        chunk). NVLS phases pay their chunk pipeline's fill the same way
        (:meth:`nvls_pipeline_factor`). Rings pipeline at a finer grain and pay their
        steps in latency.
        """
        if plan.family == "nvls":
            return self.nvls_pipeline_factor(plan, phase, size_bytes)
        if plan.family != "tree" or plan.protocol != "Simple" or self.comm.tree_chunk_bytes <= 0:
            return 1.0
        size = plan.size_bytes if size_bytes is None else size_bytes
        if size <= 0:
            return 1.0
        fill_steps = phase.intra_steps + phase.inter_steps - 1
        if fill_steps <= 0:
            return 1.0
        chunk = self.tree_chunk_bytes(plan, phase, size)
        return 1.0 + fill_steps * chunk * self.channels_running(plan, size) / size

    def nvls_heads(self, plan: CommPlanLike) -> int:
        """Heads of an NVLS all-reduce: the ranks of one NVLink domain that each reduce
        one slice in the switch, at most NCCL_MAX_NVLS_ARITY = 32 (NVIDIA/nccl
        src/graph/search.cc: the NVLS graph has ``min(NCCL_MAX_NVLS_ARITY, GPUs)``
        channels, one head each; src/include/device.h, 32 since 2.20)."""
        return max(1, min(NVLS_MAX_HEADS, plan.local_ranks))

    def nvls_channels(self, plan: CommPlanLike) -> int:
        """Channels an NVLS or NVLS_TREE all-reduce runs, at any size (enqueue.cc
        topoGetAlgoInfo: ``nc = comm->nvlsChannels``; nvls.cc sets it per
        architecture, more when the communicator spans NVLink domains)."""
        comm = self.comm
        return comm.nvls_channels_multi_domain if plan.domains > 1 else comm.nvls_channels

    def nvls_concurrent_ops(self, plan: CommPlanLike) -> int:
        """Chunks an NVLS loop step moves: one per channel and head (all_reduce.h loopSize)."""
        return self.nvls_channels(plan) * self.nvls_heads(plan)

    def nvls_chunk_bytes(self, plan: CommPlanLike, size_bytes: float | None = None) -> int:
        """Chunk an NVLS (one domain) or NVLS_TREE (several) all-reduce moves per head,
        channel and loop step, as NVIDIA/nccl src/enqueue.cc calcCollChunking picks it
        from ``concurrentOps = nChannels x nHeads`` (:meth:`nvls_concurrent_ops`): NVLS
        starts from NCCL_NVLS_CHUNKSIZE and drops to 64 KiB below 64 x concurrentOps x
        chunk, to 32 KiB below 8 x, to 16 KiB below 2 x; NVLS_TREE caps it at 64 KiB from
        4 nodes and drops to 64 KiB below 4 x, to 32 KiB below 1 x (0: no NVLS chunk set).
        The same function's 32 KiB cap for NVLS across nodes whose NVLS bandwidth is
        under 150 GB/s is left out: every preset's NVLS runs at 300 GB/s or more."""
        chunk = self.comm.nvls_chunk_bytes
        if chunk <= 0:
            return 0
        size = plan.size_bytes if size_bytes is None else size_bytes
        ops = self.nvls_concurrent_ops(plan)
        if plan.domains > 1:  # NVLS_TREE (ncclPatternNvlsTree)
            if plan.domains >= 4:
                chunk = min(chunk, 65536)
            for times, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
                if size < times * ops * chunk and chunk > floor:
                    chunk = floor
            return chunk
        for times, floor in ((64, 65536), (8, 32768), (2, 16384)):
            if size < times * ops * chunk and chunk > floor:
                chunk = floor
        return chunk

    def nvls_pipeline_factor(self, plan: CommPlanLike, phase: PhaseLike,
                             size_bytes: float | None = None) -> float:
        """How much longer than its bytes alone an NVLS phase streams: the fill and
        drain of NCCL's NVLS chunk pipeline.

        NCCL runs an NVLS all-reduce (src/device/all_reduce.h, RunWorkElement
        NCCL_ALGO_NVLS / NVLS_TREE, Simple) as a pipeline of stages per channel, each a
        warp group handing chunks to the next through NCCL_STEPS buffer slots: scatter
        (the rank's data into its NVLS buffers), the heads' reduction in the switch with
        its multicast (multimem.ld_reduce / multimem.st), gather (out to the user
        buffer); NVLS_TREE adds a tree of the domains' heads between reduce and
        broadcast (one stage per tree edge, up and down). A loop step moves one chunk
        per head and channel, ``nChannels x nHeads x chunk`` bytes in all
        (loopSize, all_reduce.h; enqueue.cc calcCollChunking: nLoops). Streaming at
        the bottleneck stage's rate, the last step still has to cross the other
        stages: ``phase.intra_steps + phase.inter_steps`` more steps (2 for NVLS, the
        hand-overs scatter -> reduce -> gather), each a step's bytes at the phase's
        rate, and never more of them than the message holds."""
        size = plan.size_bytes if size_bytes is None else size_bytes
        fill_steps = phase.intra_steps + phase.inter_steps
        if size <= 0 or fill_steps <= 0:  # (NVLS runs Simple only: catalog.SIMPLE_ONLY)
            return 1.0
        chunk = self.nvls_chunk_bytes(plan, size)
        if chunk <= 0:
            return 1.0
        step_bytes = min(float(size), self.nvls_concurrent_ops(plan) * chunk)
        return 1.0 + fill_steps * step_bytes / size

    def phase_cap_s(self, plan: CommPlanLike, phase: PhaseLike,
                    size_bytes: float | None = None) -> float:
        """Seconds the phase takes at its transfers' rate ceilings alone (0: none)."""
        transfers = phase.transfers
        if getattr(transfers, "all_pairs", False) and not getattr(phase, "bus_bytes", 0.0):
            # equal payloads: the p2p ceiling binds if any pair crosses NVLink domains
            return all_pairs_p2p_cap_s(self, plan, transfers)
        worst = 0.0
        for transfer, cap in zip(phase.transfers, self.transfer_caps(plan, phase, size_bytes)):
            if not math.isinf(cap) and transfer.payload_bytes > 0:
                worst = max(worst, transfer.payload_bytes / cap)
        return worst

    def ring_step_pacing_s(self, phase: PhaseLike, protocol: str, family: str = "") -> float:
        """Least every step of this phase takes (0: no pacing): ``comm.ring_step_pacing_s``
        of the protocol for a ring phase that spans several NVLink domains with more than
        one member in a domain (it has both NVLink and network steps).

        Why per step (tests/test_nccl_logs.py
        test_the_mid_size_excess_is_per_ring_step_not_per_network_hop): every ring step
        of NCCL's kernels ends with a barrier of the channel's threads (NCCL 2.29
        src/device/prims_ll128.h, primitives.h: one GenericOp per step), so a rank's
        step k+1 waits for its step k and a one-pass ring moves at its slowest rank's
        per-step service: the rank that sends to the network, whose LL128 step waits for
        the proxy (src/transport/net.cc sendProxyProgress: isend once the tail moved,
        after ``__threadfence_system`` on sm_90+). A ring with one member per domain
        (every step a network step) is not paced beyond its hop latency in the logs,
        nor is one inside a domain. NCCL's source does not give the constant: it is
        calibrated on measured logs (hardware/catalog/_defaults.toml)."""
        if family != "ring" or phase.inter_steps <= 0 or phase.intra_steps <= 0:
            return 0.0
        return self.comm.ring_step_pacing_s.get(protocol, 0.0)

    def phase_latency_s(self, phase: PhaseLike, protocol: str, family: str = "",
                        paced: bool = True) -> float:
        """Latency of a phase: its steps times the hop latency of their tier.

        A ring that crosses the network pays at least the network proxy's per-step
        overhead on its NVLink steps too, since its steps are paced by the proxy of
        the network hop (NCCL tuning.cc: ``intraLat = max(intraLat, netOverhead)``
        for inter-node rings, netOverhead x 3 for Simple).

        The Simple steps of a ring all-reduce across several NVLink domains
        (``phase.ring_plateau``) take ``comm.ring_plateau_factor`` times that: NCCL's
        "plateau effect of ring" (src/graph/tuning.cc ncclTopoGetAlgoTime, 2.19-2.28;
        src/tuning/ring.cc ncclTuningRingModelSim, 2.29+: ``lat *= minCompCap < 80 ?
        1.9 : 1.4`` for Ring/Simple all-reduce when nNodes > 1 and not MNNVL). NCCL
        applies it from 64 bytes per rank and channel (``nBytes / (nChannels x
        nRanks) >= 64``, under 1 MiB at 512 ranks); below that LL is the faster
        protocol by far, so the threshold is not modelled.

        With ``paced`` (the default: what the collective costs), every step of a ring
        phase over several NVLink domains with more than one member in a domain takes
        at least :meth:`ring_step_pacing_s`; ``paced=False`` is NCCL's own tuning model,
        which is what NCCL chooses the algorithm and protocol with (hardware.cost).
        """
        hop = self.comm.hop_latency_s
        switch_s = self.layout.spec.fabric.switch_hop_latency_s
        intra_hop = hop[self.layout.scale_up_tier][protocol]
        if family == "ring" and phase.inter_steps > 0:
            intra_hop = max(intra_hop, self.comm.net_step_overhead_s.get(protocol, 0.0))
        # the network plugin's reported latency on every network step, twice for Simple
        # (NCCL tuning.cc: interLat += latencyInter; "Also add the flush extra latency")
        plugin_s = self.layout.spec.nic.net_latency_s * (2 if protocol == "Simple" else 1)
        inter_hop = hop["network"][protocol] + plugin_s + phase.switch_hops * switch_s
        pacing_s = self.ring_step_pacing_s(phase, protocol, family) if paced else 0.0
        if pacing_s > 0:
            intra_hop, inter_hop = max(intra_hop, pacing_s), max(inter_hop, pacing_s)
        intra = phase.intra_steps * intra_hop
        inter = phase.inter_steps * inter_hop
        if protocol == "Simple" and getattr(phase, "ring_plateau", False):
            return (intra + inter) * self.comm.ring_plateau_factor
        return intra + inter

    def base_latency_s(self, plan: CommPlanLike) -> float:
        """Fixed cost of one call of the plan's algorithm family and protocol."""
        return self.comm.base_latency_s[plan.family][plan.protocol]

    def _payload_per_link(self, phase: PhaseLike) -> dict[str, np.ndarray]:
        """Payload bytes each link carries in a phase, per transfer mode (cached)."""
        cached = self._loads.get(id(phase))
        if cached is not None:
            return cached[1]
        transfers = phase.transfers
        counted = getattr(transfers, "counts", None)
        if counted is not None:  # (plans.LazyTransfers of a builder that counts them)
            loads = self._counted_loads(transfers.mode, transfers.payload_bytes, counted())
            self._loads[id(phase)] = (phase, loads)
            return loads
        if getattr(transfers, "all_pairs", False):  # every member to every other one
            loads = {transfers.mode: self.layout.all_pairs_link_counts(transfers.group)
                     * transfers.payload_bytes}
            self._loads[id(phase)] = (phase, loads)
            return loads
        # per mode, the links of every transfer in numpy (ClusterLayout.paths_links:
        # the entries in the order a walk over the transfers would list them, so each
        # link's bytes add up in the same order)
        by_mode: dict[str, tuple[list[int], list[int], list[float]]] = {}
        content = None
        if getattr(transfers, "columns", False):
            # held as columns (strategies.collectives.plans.TransferColumns: ring and tree
            # builders), read as int64 arrays; one payload for all (None below)
            sources, destinations = transfers.arrays()
            content = (transfers.mode, transfers.payload_bytes, sources.tobytes(),
                       destinations.tobytes())
            found = self._loads_by_content.get(content)
            if found is not None:
                self._loads[id(phase)] = (phase, found)
                return found
            by_mode[transfers.mode] = (sources, destinations, None)
            modes = set()
        else:
            modes = {t.mode for t in transfers}
        if len(modes) == 1:  # (the common case: the same lists, built column by column)
            by_mode[modes.pop()] = ([t.src for t in transfers], [t.dst for t in transfers],
                                    [t.payload_bytes for t in transfers])
        for t in transfers if not by_mode else ():
            entry = by_mode.get(t.mode)
            if entry is None:
                entry = by_mode[t.mode] = ([], [], [])
            entry[0].append(t.src)
            entry[1].append(t.dst)
            entry[2].append(t.payload_bytes)
        layout = self.layout
        loads = {}
        for mode, (sources, destinations, payloads) in by_mode.items():
            src = np.asarray(sources, dtype=np.int64)
            dst = np.asarray(destinations, dtype=np.int64)
            if mode == "nvls":  # the GPU's own NVLink ports (links_of)
                which = np.repeat(np.arange(src.size), 2)
                links = np.stack([layout.gpu_out_link(0) + src,
                                  layout.gpu_in_link(0) + dst], axis=1).reshape(-1)
            else:
                # (one payload for every transfer, as TransferColumns have: each link
                # adds equal terms, the same sum in any order)
                which, links = layout.paths_links(
                    src, dst, ordered=payloads is not None and len(set(payloads)) > 1)
            if payloads is None:  # columns: every transfer's payload, as a float64 weight
                weights = np.full(which.size, transfers.payload_bytes, dtype=np.float64)
            else:
                weights = np.asarray(payloads)[which]
            loads[mode] = np.bincount(links, weights=weights, minlength=layout.num_links)
        self._loads[id(phase)] = (phase, loads)  # keep the phase so its id stays unique
        if content is not None:
            self._loads_by_content[content] = loads
        return loads

    def _counted_loads(self, mode: str, payload_bytes: float, counts) -> dict[str, np.ndarray]:
        """:meth:`_payload_per_link` of transfers of one payload given as
        :class:`strategies.collectives.plans.TransferCounts`: how many cross each link
        (those between domains along :meth:`hardware.topology.ClusterLayout.link_counts`,
        those inside one on their GPUs' ports), then each link's load as the listed
        transfers' bincount adds it: ``k`` equal payloads added one after another from
        0.0 (``np.add.accumulate``: the same float as adding them one at a time), so
        the very same loads (tests/test_speed_paths.py)."""
        key = (mode, payload_bytes, "counted", counts.src.tobytes(), counts.dst.tobytes(),
               counts.inside.tobytes(), counts.sends.tobytes(), counts.receives.tobytes())
        found = self._loads_by_content.get(key)
        if found is not None:
            return found
        layout = self.layout
        crossed = layout.link_counts(counts.src, counts.dst)
        crossed[layout.gpu_out_link(0) + counts.inside] += counts.sends
        crossed[layout.gpu_in_link(0) + counts.inside] += counts.receives
        most = int(crossed.max(initial=0))
        sums = np.zeros(most + 1)
        sums[1:] = np.add.accumulate(np.full(most, payload_bytes, dtype=np.float64))
        loads = {mode: sums[crossed]}
        self._loads_by_content[key] = loads
        return loads

    def phase_bandwidth_s(self, phase: PhaseLike, protocol: str) -> float:
        """Alpha-beta bandwidth time of a phase: max over links of load / capacity.

        The load of a link is the wire bytes of this phase's own transfers
        (payload / protocol efficiency of the link's tier).
        """
        if not phase.transfers:
            return 0.0
        loads = self._payload_per_link(phase)
        if len(loads) == 1 and self.layout.uniform_links:
            # one mode on links whose capacity is their kind's: a run of links of one
            # kind (one tier, one capacity) is slowest at its largest payload, since
            # x -> (x * weight) / capacity is non-decreasing in floats (each operation
            # correctly rounded, positive constants): the max below is the same float
            # as the max over every link (the branch after), from one maximum per run
            found = self._range_maxima.get(id(loads))
            if found is None or found[0] is not loads:
                (mode, payload), = loads.items()
                maxima = np.maximum.reduceat(payload, self._range_starts).tolist()
                found = (loads, mode, tuple(
                    (tier, int(start), most) for tier, start, most
                    in zip(self._range_tiers, self._range_starts.tolist(), maxima)
                    if most > 0))
                self._range_maxima[id(loads)] = found
            _, mode, runs = found
            capacity = self.layout.capacity_bytes_per_s
            weights = self._weights
            worst = 0.0
            for tier, start, most in runs:
                seconds = (most * weights[(tier, protocol, mode)]) / float(capacity[start])
                if seconds > worst or seconds != seconds:  # (a NaN wins, as in numpy's max)
                    worst = seconds
                    if seconds != seconds:
                        break
            return worst
        if len(loads) == 1:  # one mode: only the links it loads (same arithmetic)
            found = self._used.get(id(loads))
            if found is None or found[0] is not loads:
                (mode, payload), = loads.items()
                used = np.flatnonzero(payload)
                found = (loads, used, payload[used], self._tier_index[used], mode)
                self._used[id(loads)] = found
            _, used, used_payload, used_tier, mode = found
            if not used.size:
                return 0.0
            weight_by_tier = self._weights_by_tier.get((protocol, mode))
            if weight_by_tier is None:
                weight_by_tier = self._weights_by_tier[(protocol, mode)] = np.asarray(
                    [self._weights[(tier, protocol, mode)] for tier in self._tier_names])
            wire = used_payload * weight_by_tier[used_tier]
            return float((wire / self.layout.capacity_bytes_per_s[used]).max())
        wire = np.zeros(self.layout.num_links)
        for mode, payload in self._payload_per_link(phase).items():
            weight_by_tier = np.asarray(
                [self._weights[(tier, protocol, mode)] for tier in self._tier_names])
            wire += payload * weight_by_tier[self._tier_index]
        used = wire > 0
        if not used.any():
            return 0.0
        return float((wire[used] / self.layout.capacity_bytes_per_s[used]).max())

    def phase_stream_s(self, plan: CommPlanLike, phase: PhaseLike) -> float:
        """Seconds a phase streams its bytes: its links' time or its transfers'
        ceilings' time, whichever is longer, stretched by its pipeline fill
        (:meth:`pipeline_factor`)."""
        stream = max(self.phase_bandwidth_s(phase, plan.protocol), self.phase_cap_s(plan, phase))
        return stream * self.pipeline_factor(plan, phase)

    def plan_time_s(self, plan: CommPlanLike) -> float:
        """Uncontended duration of a plan in seconds (analytic fidelity)."""
        total = self.base_latency_s(plan) if plan.phases else 0.0
        for phase in plan.phases:
            total += self.phase_latency_s(phase, plan.protocol, plan.family)
            total += self.phase_stream_s(plan, phase)
        return total

    def plan_time_ns(self, plan: CommPlanLike) -> int:
        """Uncontended duration of a plan in ns, rounded per term as the engine does."""
        if not plan.phases:
            return 0
        total = seconds_to_ns(self.base_latency_s(plan))
        for phase in plan.phases:
            total += seconds_to_ns(self.phase_latency_s(phase, plan.protocol, plan.family))
            total += seconds_to_ns(self.phase_stream_s(plan, phase))
        return total


class FlowFabric:
    """Fidelity ``flow``: phases become flows sharing links max-min fairly."""

    fidelity = "flow"

    def __init__(self, env: simpy.Environment, model: NetworkModel) -> None:
        self.env = env
        self.model = model
        self.network = FlowNetwork(env, model.layout.capacity_bytes_per_s)
        # Keyed by identity; the plan is kept so its id cannot be reused.
        self._requests: dict[int, tuple[CommPlanLike, list[FlowBatch]]] = {}
        self._mirrored: dict[tuple, tuple[tuple, FlowBatch]] = {}
        self._latencies: dict[int, tuple[CommPlanLike, int, tuple[int, ...]]] = {}

    def latencies_ns(self, plan: CommPlanLike) -> tuple[int, tuple[int, ...]]:
        """A plan's base latency and each phase's latency, ns (as :meth:`run` rounds
        them), once per plan (keyed by identity, the plan kept alive with its entry): a
        step runs each plan hundreds of times."""
        found = self._latencies.get(id(plan))
        if found is None or found[0] is not plan:
            model = self.model
            found = (plan, seconds_to_ns(model.base_latency_s(plan)),
                     tuple(seconds_to_ns(model.phase_latency_s(phase, plan.protocol,
                                                               plan.family))
                           for phase in plan.phases))
            self._latencies[id(plan)] = found
        return found[1], found[2]

    def _phase_requests(self, plan: CommPlanLike, index: int) -> FlowBatch:
        cached = self._requests.get(id(plan))
        if cached is None:
            cached = (plan, [self._phase_batch(plan, phase) for phase in plan.phases])
            self._requests[id(plan)] = cached
        return cached[1][index]

    def _phase_batch(self, plan: CommPlanLike, phase: PhaseLike) -> FlowBatch:
        """A phase's transfers as one :class:`FlowBatch`: the requests
        :meth:`NetworkModel.request` gives each (its links, the weights of their tiers,
        its payload times :meth:`NetworkModel.pipeline_factor`, its
        :meth:`NetworkModel.transfer_caps` ceiling), built for all at once
        (:meth:`ClusterLayout.paths_links` lists the links of ``path`` in order)."""
        model = self.model
        fill = model.pipeline_factor(plan, phase)
        transfers = phase.transfers
        if getattr(transfers, "columns", False):
            src, dst = transfers.arrays()
            payload = np.full(src.size, float(transfers.payload_bytes))
            modes = {transfers.mode}
            caps = model.transfer_caps_columns(plan, phase, src, dst, payload, transfers.mode)
        else:
            caps = model.transfer_caps(plan, phase)
            src = np.asarray([t.src for t in transfers], dtype=np.int64)
            dst = np.asarray([t.dst for t in transfers], dtype=np.int64)
            payload = np.asarray([float(t.payload_bytes) for t in transfers], dtype=np.float64)
            modes = {t.mode for t in transfers}
        if len(modes) != 1:  # mixed modes: one request each
            requests = [model.request(t, plan.protocol, cap, fill)
                        for t, cap in zip(transfers, caps)]
            return FlowBatch(
                np.repeat(np.arange(len(requests)), [len(r.links) for r in requests]),
                [link for r in requests for link in r.links],
                [w for r in requests for w in r.weights],
                [r.payload_bytes for r in requests], [r.max_rate for r in requests])
        mode = modes.pop()
        layout = self.model.layout
        if mode == "nvls":  # the GPU's own NVLink ports (NetworkModel.links_of)
            which = np.repeat(np.arange(src.size), 2)
            links = np.stack([layout.gpu_out_link(0) + src,
                              layout.gpu_in_link(0) + dst], axis=1).reshape(-1)
        else:
            which, links = layout.paths_links(src, dst)
        per_tier = np.asarray([model._weights[(tier, plan.protocol, mode)] for tier in TIERS])
        return FlowBatch(which, links, per_tier[layout.link_tier_index[links]],
                         payload * fill, caps)

    def _with_mirrors(self, plan: CommPlanLike, mirrors: Sequence[CommPlanLike],
                      index: int) -> FlowBatch:
        """Phase ``index`` of ``plan`` plus the same phase of every mirror plan, as
        one batch. A mirror sharing no link with anything simulated changes no rate
        but still costs solver time: the engine leaves those out (Engine._may_contend)."""
        key = (id(plan), tuple(id(m) for m in mirrors), index)
        cached = self._mirrored.get(key)
        if cached is not None:
            return cached[1]
        parts = [self._phase_requests(plan, index)]
        for mirror in mirrors:
            if index < len(mirror.phases):
                parts.append(self._phase_requests(mirror, index))
        requests = FlowBatch.concatenate(parts)
        self._mirrored[key] = ((plan, tuple(mirrors)), requests)
        return requests

    def p2p_mirrored_requests(self, plan: CommPlanLike, pairs: Sequence[tuple[int, int]]
                              ) -> FlowBatch | None:
        """The one batch of a send/recv ``plan`` (:func:`strategies.collectives.algorithms.point_to_point`)
        and the same send/recv between every pair of ``pairs`` (its mirrors), built in
        one pass without a plan per pair; None when ``plan`` is not such a send/recv.

        The requests are those :meth:`_with_mirrors` builds from each pair's own plan
        (``CostModel.p2p_plan``): a pair's plan is one phase with one ``p2p`` transfer
        of the same payload, none within a rank; its ceiling (:meth:`NetworkModel.transfer_caps`)
        depends on the family, protocol and rank count every such plan shares and on
        whether the pair crosses NVLink domains, which ``transfer_caps`` checks per
        transfer of the one phase listing them all; and a ``direct`` plan is not
        pipelined (:meth:`NetworkModel.pipeline_factor` 1.0).
        """
        if (plan.family != "direct" or len(plan.phases) != 1
                or len(plan.phases[0].transfers) != 1
                or plan.phases[0].transfers[0].mode != "p2p"):
            return None
        phase = plan.phases[0]
        first = phase.transfers[0]
        transfer = type(first)  # the plan's own transfer and phase types (dataclasses)
        everyone = dataclasses.replace(phase, transfers=tuple(phase.transfers) + tuple(
            transfer(a, b, first.payload_bytes, "p2p") for a, b in pairs if a != b))
        return self._phase_batch(plan, everyone)

    def start(self, plan: CommPlanLike, mirrors: Sequence[CommPlanLike] = (),
              batches: Sequence[FlowBatch] | None = None, on_done=None) -> bool:
        """What :meth:`run` does, driven by event callbacks instead of a SimPy process:
        the same timeouts and flow batches, each created at the point of SimPy's event
        order where the process would create it (when the event before it is
        processed, as its only callback), so every tie resolves as with :meth:`run`.
        ``on_done()`` is called while the last batch's event is processed, where the
        process would return. False (and no call): nothing to run, done already."""
        if not plan.phases:
            return False
        _PlanRun(self, plan, mirrors, batches, on_done).begin()
        return True

    def run(self, plan: CommPlanLike, mirrors: Sequence[CommPlanLike] = (),
            batches: Sequence[FlowBatch] | None = None) -> Iterator[simpy.Event]:
        """SimPy process body: base latency, then each phase's latency and flows.

        ``mirrors``: the same communication of ranks a symmetry-reduced program
        leaves out (same algorithm and protocol); their flows share the links
        with this plan's, and a phase ends when all of them have arrived, as it
        would in the full job where they run in lockstep.
        ``batches``: the requests of every phase, built already (this plan's and its
        mirrors', e.g. :meth:`p2p_mirrored_requests`), instead of ``mirrors``.
        """
        if not plan.phases:
            return
        yield self.env.timeout(seconds_to_ns(self.model.base_latency_s(plan)))
        for index, phase in enumerate(plan.phases):
            yield self.env.timeout(
                seconds_to_ns(self.model.phase_latency_s(phase, plan.protocol, plan.family)))
            if phase.transfers:
                if batches is not None:
                    requests = batches[index]
                elif mirrors:
                    requests = self._with_mirrors(plan, mirrors, index)
                else:
                    requests = self._phase_requests(plan, index)
                yield self.network.transfer(requests)


class _PlanRun:
    """One plan run by :meth:`FlowFabric.start`: base latency, then per phase its
    latency and its flows, each step a callback of the event ending the one before."""

    __slots__ = ("fabric", "plan", "mirrors", "batches", "on_done", "index")

    def __init__(self, fabric: FlowFabric, plan: CommPlanLike, mirrors: Sequence[CommPlanLike],
                 batches: Sequence[FlowBatch] | None, on_done) -> None:
        self.fabric = fabric
        self.plan = plan
        self.mirrors = mirrors
        self.batches = batches
        self.on_done = on_done
        self.index = 0

    def begin(self) -> None:
        """Wait the plan's base latency (FlowFabric.run's first timeout)."""
        fabric = self.fabric
        timer = fabric.env.timeout(fabric.latencies_ns(self.plan)[0])
        timer.callbacks.append(self._phase)

    def _phase(self, _event: simpy.Event) -> None:
        """The previous step has ended: wait the next phase's latency, or finish."""
        plan = self.plan
        if self.index == len(plan.phases):
            self.on_done()
            return
        fabric = self.fabric
        timer = fabric.env.timeout(fabric.latencies_ns(plan)[1][self.index])
        timer.callbacks.append(self._flows)

    def _flows(self, event: simpy.Event) -> None:
        """The phase's latency has passed: start its flows (none: next phase at once)."""
        index = self.index
        self.index += 1
        plan = self.plan
        if not plan.phases[index].transfers:
            self._phase(event)
            return
        fabric = self.fabric
        if self.batches is not None:
            requests = self.batches[index]
        elif self.mirrors:
            requests = fabric._with_mirrors(plan, self.mirrors, index)
        else:
            requests = fabric._phase_requests(plan, index)
        # (the latency timeout, normal priority, has this one callback)
        fabric.network.transfer(requests, last_in_event=True).callbacks.append(self._phase)
