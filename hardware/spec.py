"""Frozen hardware specifications with units in field names.

A :class:`ClusterSpec` is everything the simulator knows about a machine: the
GPU, the scale-up domain (NVLink/NVSwitch or PCIe), the NICs, the scale-out
fabric, and the communication tuning (latency and efficiency per link tier and
protocol). Specs are plain data; performance models live in
:mod:`hardware.compute` and :mod:`hardware.network`.

Presets are TOML files in ``hardware/catalog`` (see :mod:`hardware.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from hardware.units import gbit_per_s_to_bytes_per_s

#: Link tiers a transfer can cross, from the fastest to the slowest.
TIERS = ("nvlink", "pcie", "network")
#: NCCL's three wire protocols: LL (8-byte flag+data stores, lowest latency),
#: LL128 (128-byte lines with 8 bytes of flags), Simple (bulk copies + fences).
PROTOCOLS = ("LL", "LL128", "Simple")
#: Collective algorithm families the tuning tables are keyed by.
ALGORITHM_FAMILIES = ("ring", "tree", "nvls", "direct")
#: NCCL's node-count buckets of its tuning tables (src/graph/tuning.cc ``index2``):
#: one node (NVLink domain), two, and more than two.
NODE_BUCKETS = ("n1", "n2", "n4")


def node_bucket(domains: int) -> str:
    """NCCL's tuning-table bucket for a communicator spanning ``domains`` NVLink
    domains (tuning.cc: ``index2 = nNodes <= 2 ? nNodes - 1 : 2``)."""
    return NODE_BUCKETS[min(max(domains, 1), 3) - 1]

SCALE_UP_KINDS = ("nvswitch", "nvlink-mesh", "pcie")
#: Host CPUs a GPU can be driven from (``GpuSpec.host_cpu``).
HOST_CPUS = ("x86", "grace")
NIC_KINDS = ("ib", "roce", "efa", "tcp")
#: NCCL's PCIe path types from a GPU to the NIC its channels use (src/graph/topo.h
#: ``PATH_*``, closest first: PIX one PCIe switch, PXB several switches, P2C through the
#: GPU's C2C link to its CPU and PCIe from there (GH200/GB200), PXN through an NVLink
#: peer that is PXB to the NIC, PHB through the CPU's PCIe host bridge, SYS across the
#: CPUs' interconnect). ``nvidia-smi topo -m`` prints the same names.
NIC_PATHS = ("PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
FABRIC_TOPOLOGIES = ("fat-tree", "rail-optimized")
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
#: Kernel classes the compute model prices (the Program IR's ComputeOp.kind).
COMPUTE_KINDS = ("matmul", "attention", "elementwise", "norm", "memcpy", "optimizer", "other")
#: Fused attention kernels the compute model knows: FlashAttention v1 (flash-attn 1.x), v2
#: (flash-attn 2.x; also PyTorch SDPA's flash backend), v3 (Hopper only), cuDNN fused
#: attention (Transformer Engine's ``FusedAttention``), the Triton flash kernel (OpenAI
#: tutorial / MosaicML ``attn_impl: triton``). Unfused attention is not a kernel: the cost
#: model lowers it to its GEMMs and softmax (``strategies.model_costs``).
ATTENTION_IMPLS = ("fa1", "fa2", "fa3", "cudnn", "triton")


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator.

    Attributes:
        name: marketing name, e.g. ``"H100-SXM5-80GB"``.
        peak_flops_per_s: dense peak FLOP/s per dtype (no sparsity).
        hbm_bytes: HBM capacity in bytes.
        hbm_bytes_per_s: peak HBM bandwidth in bytes/s.
        matmul_profile: key of the measured GEMM efficiency table used by the
            compute model (``hardware/data``), e.g. ``"sm_90"``.
        matmul_peak_efficiency: best fraction of peak a tuned GEMM reaches
            (maximum achievable matmul FLOP/s / peak).
        memory_efficiency: achievable fraction of ``hbm_bytes_per_s`` for
            streaming kernels.
        kernel_launch_s: fixed cost per kernel, in seconds.
        sustained_fraction: fraction of the microbenchmark rates (tensor and
            HBM) that kernels sustain inside a long training run: power and
            thermal clock throttling under continuous load, gaps between
            kernels. The one calibrated number of a preset (1.0 = none).
        sm_count: streaming multiprocessors (0 = unknown): a kernel that shares the
            GPU with a communication kernel holding some of them runs on the rest.
        memory_reserve_bytes: device memory a training process cannot use for model
            states and activations: the CUDA context and kernel images, NCCL's
            communicator buffers, cuBLAS/Transformer Engine workspaces and the caching
            allocator's fragmentation. A plan fits when its memory plus this reserve
            is at most ``hbm_bytes``.
        host_cpu: one of :data:`HOST_CPUS`, the CPU whose thread issues this GPU's
            work (``x86``: Intel Xeon / AMD EPYC servers, ``grace``: NVIDIA Grace of a
            GH200/GB200 superchip); it scales the framework's host time
            (``hardware.compute.HOST_CPU_FACTOR``).
        compute_capability: CUDA compute capability as NCCL writes it (major x 10 +
            minor: 80 A100, 90 H100/H200, 100 B200/GB200); 0 = not given. NCCL's LL128
            enable rule reads it (:func:`hardware.cost.ll128_enabled`).
        speed_spread: relative standard deviation of a GPU's sustained kernel time
            across the GPUs of this SKU in one fleet (manufacturing variability under
            power management: same-SKU GPUs settle at different clocks under load).
            A synchronous job runs at the pace of its slowest GPU, so every kernel is
            priced at the expected slowest of the job's GPUs
            (:func:`hardware.compute.expected_slowest_factor`); 0 = all GPUs alike.
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    hbm_bytes: int
    hbm_bytes_per_s: float
    matmul_profile: str
    matmul_peak_efficiency: float
    memory_efficiency: float
    kernel_launch_s: float
    sustained_fraction: float = 1.0
    sm_count: int = 0
    memory_reserve_bytes: int = 1 << 30
    host_cpu: str = "x86"
    compute_capability: int = 0
    speed_spread: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ScaleUpSpec:
    """The scale-up (intra-domain) interconnect.

    Attributes:
        kind: ``nvswitch`` (all-to-all non-blocking through NVSwitch),
            ``nvlink-mesh`` (direct GPU-GPU links) or ``pcie`` (no NVLink).
        domain_gpus: GPUs that share one NVLink domain (8 for DGX, 72 for
            NVL72). Equal to or a multiple of the node's GPU count.
        nvlink_generation: 2..5, 0 when there is no NVLink.
        nvlink_links_per_gpu: NVLink links per GPU.
        nvlink_bytes_per_s_per_link: unidirectional data rate of one link.
        link_efficiency: fraction of the raw rate that carries payload with
            NCCL's Simple protocol (packet headers, flow control).
        nvls: NVLink SHARP (in-switch reduction, NCCL's NVLS) available.
        nvls_efficiency: NVLS all-reduce algorithm bandwidth as a fraction of
            the raw per-GPU NVLink rate (in-switch reduction throughput).
        pcie_generation: PCIe generation between GPU and host/NIC.
        pcie_lanes: PCIe lanes per GPU.
        pcie_bytes_per_s: unidirectional PCIe data rate per GPU.
    """

    kind: str
    domain_gpus: int
    nvlink_generation: int
    nvlink_links_per_gpu: int
    nvlink_bytes_per_s_per_link: float
    link_efficiency: float
    nvls: bool
    nvls_efficiency: float
    pcie_generation: int
    pcie_lanes: int
    pcie_bytes_per_s: float

    @property
    def nvlink_bytes_per_s(self) -> float:
        """Raw unidirectional NVLink bandwidth of one GPU, bytes/s."""
        return self.nvlink_links_per_gpu * self.nvlink_bytes_per_s_per_link


@dataclass(frozen=True, kw_only=True)
class NicSpec:
    """Scale-out network adapters of one node.

    Attributes:
        count_per_node: NICs per node (8 on DGX: one per GPU, rail-aligned).
        gbit_per_s: line rate of one NIC in Gb/s (1e9 bits/s).
        kind: ``ib``, ``roce``, ``efa`` or ``tcp``.
        gpudirect_rdma: the NIC reads/writes GPU memory directly; otherwise
            traffic bounces through host memory (two PCIe crossings).
        link_efficiency: achievable fraction of the line rate for large
            transfers (encoding, headers, congestion control).
        gpu_path: one of :data:`NIC_PATHS`, the PCIe path from a GPU to the NIC its
            network channels use, as NCCL's topology search ends up with it (the
            ring/tree graph's ``typeInter``: the farthest path any GPU of the graph
            takes). NCCL enables LL128 across nodes only up to PXB (PXN from compute
            capability 9.0; :func:`hardware.cost.ll128_enabled`).
        net_latency_s: the latency the network plugin reports for one message
            (``ncclNetProperties_t.latency``; NCCL's own IB and socket transports
            report 0). NCCL adds it to every network step, twice for Simple ("the
            flush extra latency"; src/graph/tuning.cc ncclTopoTuneModel: ``interLat +=
            graphs[a]->latencyInter``).
    """

    count_per_node: int
    gbit_per_s: float
    kind: str
    gpudirect_rdma: bool
    link_efficiency: float
    gpu_path: str = "PXB"
    net_latency_s: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        """Raw unidirectional rate of one NIC in bytes/s."""
        return gbit_per_s_to_bytes_per_s(self.gbit_per_s)


@dataclass(frozen=True, kw_only=True)
class FabricSpec:
    """Scale-out switch fabric.

    Attributes:
        topology: ``fat-tree`` (every NIC of a node on the same leaf group) or
            ``rail-optimized`` (NIC *i* of every node in a scalable unit on
            leaf *i*).
        tiers: switch tiers (1 = single leaf, 2 = leaf-spine, 3 = + core).
        nodes_per_leaf: nodes below one leaf (or one rail group of leaves).
        leaves_per_spine_group: leaf groups joined by one spine group (tier 2);
            beyond it traffic crosses the core (tier 3).
        oversubscription: downlink:uplink bandwidth ratio at each leaf and
            spine (1.0 = non-blocking).
        switch_hop_latency_s: latency of one switch traversal, seconds.
    """

    topology: str
    tiers: int
    nodes_per_leaf: int
    leaves_per_spine_group: int
    oversubscription: float
    switch_hop_latency_s: float


@dataclass(frozen=True, kw_only=True)
class CommTuningSpec:
    """Communication latency and efficiency per link tier and protocol, and the
    ceilings NCCL's kernels put on top of the link rates.

    The collective cost model is (DESIGN.md; NCCL's tuning model has the same
    shape): ``time = base_latency[algorithm][protocol]
    + steps * hop_latency[tier][protocol] + bytes / (bw[tier] * eff[tier][protocol])``.

    Attributes:
        base_latency_s: ``{algorithm family: {protocol: seconds}}`` fixed
            cost of one collective call (launch, synchronisation).
        hop_latency_s: ``{tier: {protocol: seconds}}`` per pipeline step.
        protocol_efficiency: ``{tier: {protocol: fraction}}`` of the tier's
            payload bandwidth that a protocol delivers (LL: 8 B of every 16 B
            carry data; LL128: 120 of 128 B).
        p2p_efficiency: ``{tier: fraction}`` of the tier's payload bandwidth
            that point-to-point send/recv reaches (NCCL drives p2p with fewer
            channels than collectives).
        protocol_max_bytes: ``{protocol: bytes}`` largest message a protocol is
            considered for (0 = no limit).
        ll_max_bus_bytes_per_s: ``{node bucket: bytes/s}`` ceiling of the LL
            protocol (tuning.cc ``llMaxBws``: one node by GPU architecture,
            several by CPU vendor).
        channel_max_bus_bytes_per_s: ``{family: {protocol: {node bucket:
            bytes/s}}}`` ceiling per channel (tuning.cc ``perChMaxRingLL128Bws``,
            ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws``), times the channels
            running (absent: no ceiling).
        rail_channels: NCCL graph channels per NIC rail when a communicator
            spans several NVLink domains (the per-channel ceilings multiply by
            rails x this).
        domain_channels: NCCL graph channels inside one NVLink domain.
        collective_channels: channels a collective starts from before NCCL drops
            channels for small messages (enqueue.cc: ``nc = comm->nChannels``).
        channel_threshold_bytes: ``{protocol: bytes}`` per channel below which NCCL
            runs fewer channels (enqueue.cc: ``while nBytes < nc * nt *
            threadThreshold: nc--``; nt x threadThreshold, times the ranks for ring
            LL).
        p2p_net_channel_bytes_per_s: what one p2p channel moves over the network
            (NCCL_P2P_PER_CHANNEL_NET_BW, paths.cc).
        p2p_net_channels_per_peer: channels per network peer before NCCL halves
            them for large communicators; 0 = NCCL >= 2.29's rule
            ``max(1, ceil(NIC GB/s / p2p channel GB/s))`` (paths.cc
            ncclTopoGetNchannels).
        p2p_channels: the p2p channel pool (``comm->p2pnChannels``).
        p2p_peers_per_channel: NCCL halves the channels per peer while
            ``channels x ceil(ranks / this) > p2p_channels`` (2.29:
            NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8; <= 2.28: 4, from
            ``nChannels x nRanks > 4 x p2pnChannels``).
        net_step_overhead_s: ``{protocol: seconds}`` least a step of a ring that
            crosses the network takes, NVLink steps included: the network proxy's
            post overhead (tuning.cc getNetOverhead: 1 us on Intel CPUs, 2 us on
            AMD; x3 for Simple).
        ring_step_pacing_s: ``{protocol: seconds}`` least every step (NVLink and
            network alike) of a ring phase takes when the ring spans several NVLink
            domains with more than one member in a domain: a one-pass ring is paced by
            its slowest rank's per-step service (the rank sending to the network), a
            cost NCCL's tuning model does not carry. Calibrated on measured logs
            (_defaults.toml); 0 or absent: off (NCCL's step model alone). Not used to
            choose the algorithm or protocol (NCCL does not know it).
        ring_plateau_factor: NCCL's "plateau effect of ring": how many times the
            sum of its step latencies a Simple ring all-reduce across several NVLink
            domains takes (tuning.cc: 1.4 from compute capability 8.0, 1.9 below).
        tree_chunk_bytes: largest chunk a tree all-reduce pipelines in (one Simple
            step of a channel's buffer, NCCL_BUFFSIZE / NCCL_STEPS); NCCL halves it
            for small messages (enqueue.cc). 0: no pipeline fill modelled.
        nvls_chunk_bytes: largest chunk NCCL's NVLS / NVLS_TREE all-reduce moves per
            head, channel and step (NCCL_NVLS_CHUNKSIZE, src/transport/nvls.cc: 128 KiB);
            NCCL halves it for small messages (enqueue.cc calcCollChunking). 0: no
            NVLS pipeline fill modelled.
        nvls_channels: channels an NVLS all-reduce runs inside one NVLink domain, at
            every size (src/transport/nvls.cc ncclNvlsInit: 16 on Hopper, 24 on
            Blackwell in one node or MNNVL domain; enqueue.cc topoGetAlgoInfo: ``nc =
            comm->nvlsChannels``, no reduction for small messages).
        nvls_channels_multi_domain: the same for a communicator over several NVLink
            domains (NVLS_TREE; nvls.cc: 32 on Blackwell, 16 on Hopper).
        nccl_proto: the protocols NCCL may choose from under ``auto``, as the
            ``NCCL_PROTO`` environment variable gives them (all three unless a user or a
            network plugin sets it: aws-ofi-nccl sets ``NCCL_PROTO=simple`` where EFA
            cannot deliver 128-byte-aligned writes in order).

    The ceilings are in NCCL's *bus bandwidth* units: bytes one GPU moves per
    second (a ring step's edge bytes; twice the size for a tree all-reduce,
    tuning.cc's busBw-to-algBw ratio of 0.5).
    """

    base_latency_s: Mapping[str, Mapping[str, float]]
    hop_latency_s: Mapping[str, Mapping[str, float]]
    protocol_efficiency: Mapping[str, Mapping[str, float]]
    p2p_efficiency: Mapping[str, float]
    protocol_max_bytes: Mapping[str, int] = field(default_factory=dict)
    ll_max_bus_bytes_per_s: Mapping[str, float] = field(default_factory=dict)
    channel_max_bus_bytes_per_s: Mapping[str, Mapping[str, Mapping[str, float]]] = field(
        default_factory=dict)
    rail_channels: int = 1
    domain_channels: int = 16
    collective_channels: int = 16
    channel_threshold_bytes: Mapping[str, int] = field(default_factory=dict)
    p2p_net_channel_bytes_per_s: float = 0.0
    p2p_net_channels_per_peer: int = 0
    p2p_channels: int = 16
    p2p_peers_per_channel: int = 8
    net_step_overhead_s: Mapping[str, float] = field(default_factory=dict)
    ring_step_pacing_s: Mapping[str, float] = field(default_factory=dict)
    ring_plateau_factor: float = 1.0
    tree_chunk_bytes: int = 0
    nvls_chunk_bytes: int = 0
    nvls_channels: int = 16
    nvls_channels_multi_domain: int = 16
    nccl_proto: tuple[str, ...] = PROTOCOLS


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A cluster preset: node hardware, interconnects and size.

    Attributes:
        name: preset name, e.g. ``"dgx-h100"``.
        description: one line for ``trainsim hardware list``.
        gpu: the accelerator.
        gpus_per_node: GPUs in one node (server / compute tray).
        max_nodes: nodes the cluster has (an upper bound for jobs).
        scale_up: NVLink / NVSwitch / PCIe domain.
        nic: scale-out adapters.
        fabric: scale-out switches.
        comm: communication tuning.
        sources: ``{field path: citation}`` for every number in the preset.
    """

    name: str
    description: str
    gpu: GpuSpec
    gpus_per_node: int
    max_nodes: int
    scale_up: ScaleUpSpec
    nic: NicSpec
    fabric: FabricSpec
    comm: CommTuningSpec
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class GroupGeometry:
    """A communicator laid on the machine: what collective algorithms are built from
    (:meth:`hardware.topology.ClusterLayout.geometry` makes it).

    Attributes:
        group: ranks in communicator order.
        domains: members of each NVLink domain the group touches, domains in
            ascending order, members ascending.
        switch_hops: most scale-out switches between consecutive domains.
    """

    group: tuple[int, ...]
    domains: tuple[tuple[int, ...], ...]
    switch_hops: int

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.group)

    @property
    def num_domains(self) -> int:
        """NVLink domains spanned."""
        return len(self.domains)

    @cached_property
    def local_size(self) -> int:
        """Fewest members any domain has (channels a ring can use; computed once: a
        collective's pricing asks for it per algorithm and protocol)."""
        return min(len(d) for d in self.domains)

    @cached_property
    def uniform(self) -> bool:
        """Every domain holds the same number of members."""
        return len({len(d) for d in self.domains}) == 1
