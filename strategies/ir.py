"""The Program IR: what each rank does, never how long it takes.

A :class:`Program` maps every rank to an ordered list of ops. Ops carry shapes,
bytes and FLOPs; durations come from the hardware models when the engine
replays the program (DESIGN.md: "a Program carries shapes, bytes and FLOPs,
never durations"). Because of that, ``validate`` can run the very same
Program on real GPUs.

Ordering rules (the same as CUDA streams):

* ops of one rank on one stream run in list order, one at a time;
* ``deps`` add explicit edges to earlier ops of the *same rank* (by index in
  that rank's list), typically across streams (communication waiting for the
  gradient a compute op produced);
* cross-rank ordering comes only from communication: a collective starts when
  every member of its group has reached it; a recv completes when the
  matching send's data has arrived.

Collective sizes follow nccl-tests (DESIGN.md principle 8): ``size_bytes`` is
the per-rank buffer for all_reduce, broadcast, reduce and alltoall, the total
*output* for all_gather and the total *input* for reduce_scatter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from hardware.spec import COMPUTE_KINDS  # noqa: F401  (re-exported: ComputeOp.kind)
from hardware.units import ELEMENT_BYTES, canonical_dtype

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"

COLLECTIVE_KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "broadcast",
    "reduce",
    "sendrecv",
)
COLLECTIVE_ALGORITHMS = ("auto", "ring", "tree", "nvls", "nvls_tree", "hierarchical", "direct")
#: Parallelism axes communication serves, in the order reports attribute exposed time.
AXES = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeOp:
    """Work on one GPU.

    Attributes:
        name: label shown in timelines, e.g. ``"layer3.mlp.fc1.fwd"``.
        kind: one of :data:`COMPUTE_KINDS`; selects the efficiency model.
        flops: floating-point operations (a multiply-add counts 2).
        bytes: HBM traffic in bytes (reads + writes).
        shape: the op's defining shape, e.g. ``(b, m, n, k)`` for a GEMM.
        dtype: element type, e.g. ``"bf16"``.
        stream: stream the op runs on.
        deps: indices of earlier ops of the same rank this op waits for.
        comm_sms: streaming multiprocessors a communication kernel running beside this
            one holds (Transformer Engine's pipelined TP overlap); the kernel runs on
            the others.
        phase: the training pass the work belongs to: ``F`` forward (a recompute too),
            ``B`` backward, ``I`` input gradient, ``W`` weight gradient; ``""`` unknown
            (the compute model then reads it from the name).
        launches: GPU kernels the op stands for (an eager RMSNorm is 8); each pays the
            GPU's launch gap.
        gemm_groups: GEMMs of a grouped GEMM (routed experts); 1 otherwise.
        impl: for attention, the fused kernel (``hardware.spec.ATTENTION_IMPLS``; ``""``:
            the GPU's default).
        causal: for attention, the kernel applies a causal mask (a ring-attention step off
            the diagonal of the context-parallel square does not).
        window: for attention, the sliding window in keys per query (0: none).
        host_launches: kernels the CPU issues one by one for this op (PyTorch eager: a
            Python call per kernel); 0: the host is not modelled or the op is replayed
            from a CUDA graph. The cost model prices the CPU time
            (``hardware.cost.CostModel.host_ns``).
        host_sync: the CPU waits until this op has finished on the GPU before issuing
            anything after it (a device-to-host copy it needs, e.g. Megatron-Core's
            dropless token counts per expert).
        host_calls: CPU-side framework calls of this op that launch no kernel (tensor
            allocations, views and splits: ``torch.empty``, ``torch.split``); priced like
            ``host_launches`` by the cost model, 0 when the host is not modelled.
        host_modules: Transformer Engine module calls of this op (``Linear``,
            ``GroupedLinear``, ``DotProductAttention`` forward or backward entry: its
            Python bookkeeping beyond the kernels it launches); 0 when the host is not
            modelled or the op is replayed from a CUDA graph.
        host_issue: how the CPU issues the op's ``host_launches``
            (``hardware.compute.HOST_ISSUE_S``): ``eager`` (a Python op through autograd
            and the ATen dispatcher per kernel) or ``compiled`` (from torch.compile's
            generated wrapper).
    """

    name: str
    kind: str = "other"
    flops: float = 0.0
    bytes: float = 0.0
    shape: tuple[int, ...] = ()
    dtype: str = "bf16"
    stream: str = COMPUTE_STREAM
    deps: tuple[int, ...] = ()
    comm_sms: int = 0
    phase: str = ""
    launches: int = 1
    gemm_groups: int = 1
    impl: str = ""
    causal: bool = True
    window: int = 0
    host_launches: int = 0
    host_sync: bool = False
    host_calls: int = 0
    host_modules: int = 0
    host_issue: str = "eager"


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveOp:
    """One rank's part in a collective.

    Every member of ``group`` holds a CollectiveOp with the same ``key``; the
    engine matches them by key.

    Attributes:
        name: label shown in timelines.
        key: identifies this collective instance across the group's ranks.
        kind: one of :data:`COLLECTIVE_KINDS`.
        group: global ranks taking part, in communicator order.
        size_bytes: nccl-tests size (see module docstring).
        algorithm: one of :data:`COLLECTIVE_ALGORITHMS`.
        dtype: element type (for element counts in reports).
        root: root rank (global) for broadcast and reduce.
        stream: stream the op runs on.
        deps: indices of earlier ops of the same rank this op waits for.
        axis: the parallelism the collective serves (one of :data:`AXES`, or ``""``
            outside a training step); reports attribute its time to that axis.
        host_launches: kernels the CPU issues for it (an NCCL launch: 1); 0: the host
            is not modelled.
        host_issue: how the CPU issues them: ``eager`` (a Python call) or ``compiled``
            (a functional collective in torch.compile's generated wrapper).
        holds_sms: the collective runs as an NCCL kernel holding one SM per channel
            while it moves data (compute beside it gets the others when the plan's
            ``comm_sm_contention`` is on); False: Transformer Engine userbuffers (charged
            through ``ComputeOp.comm_sms``) or copy-engine transfers.
    """

    name: str
    key: str
    kind: str
    group: tuple[int, ...]
    size_bytes: int
    algorithm: str = "auto"
    dtype: str = "fp32"
    root: int | None = None
    stream: str = COMM_STREAM
    deps: tuple[int, ...] = ()
    axis: str = ""
    host_launches: int = 0
    host_issue: str = "eager"
    holds_sms: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class _PeerOp:
    """Fields shared by :class:`SendOp` and :class:`RecvOp`.

    Attributes:
        name: label shown in timelines.
        peer: the other rank.
        size_bytes: bytes moved.
        tag: matches a send with its recv (same src, dst and tag).
        stream: stream the op runs on.
        deps: indices of earlier ops of the same rank this op waits for.
        axis: the parallelism the transfer serves (pipeline edges: ``pp``).
    """

    name: str
    peer: int
    size_bytes: int
    tag: str
    stream: str = COMM_STREAM
    deps: tuple[int, ...] = ()
    axis: str = "pp"


@dataclass(frozen=True, slots=True, kw_only=True)
class SendOp(_PeerOp):
    """Send ``size_bytes`` to ``peer``; completes with the matching RecvOp
    (NCCL's send/recv is a rendezvous)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvOp(_PeerOp):
    """Receive ``size_bytes`` from ``peer``; completes when the data has arrived."""


Op = Union[ComputeOp, CollectiveOp, SendOp, RecvOp]


@dataclass(frozen=True)
class Mirrors:
    """Communication of the ranks a symmetry-reduced program leaves out.

    Those ranks run the same collectives and pipeline transfers as their
    representatives, at the same time, over other links or the same ones. The
    flow fidelity loads the network with them, so contention is that of the full
    job (128 data-parallel rings crossing the same switches, eight pipeline
    edges through one NIC).

    Attributes:
        groups: for a group of a present rank, the groups of the absent ranks
            that run the same collectives.
        pairs: for a ``(src, dst)`` pipeline edge of present ranks, the same
            edges of absent ranks.
    """

    groups: Mapping[tuple[int, ...], tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    pairs: Mapping[tuple[int, int], tuple[tuple[int, int], ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Program:
    """Per-rank op lists for one simulated interval (a step, a benchmark).

    Attributes:
        ops_by_rank: ``{global rank: ops in issue order}``. Ranks that do
            nothing may be absent.
        world_size: number of ranks of the job (ranks are ``0..world_size-1``).
        name: label for reports.
        metadata: free-form provenance (model, plan, ...), copied to results.
        represents: for a symmetry-reduced program (DESIGN.md principle 5),
            ``{rank: number of ranks it stands for}`` over the ranks listed;
            a collective then waits only for the group members present, the
            absent ones behaving exactly like their representative. None for
            a full program, where every group member must issue its part.
        mirrors: for a reduced program, the communication of the absent ranks
            (:class:`Mirrors`), or None when contention with it is not modelled.
    """

    ops_by_rank: Mapping[int, Sequence[Op]]
    world_size: int
    name: str = "program"
    metadata: Mapping[str, object] = field(default_factory=dict)
    represents: Mapping[int, int] | None = None
    mirrors: Mirrors | None = None

    def ranks(self) -> list[int]:
        """Ranks with at least one op, ascending."""
        return sorted(self.ops_by_rank)

    def num_ops(self) -> int:
        """Total number of ops over all ranks."""
        return sum(len(ops) for ops in self.ops_by_rank.values())


def matmul_op(name: str, b: int, m: int, n: int, k: int, dtype: str = "bf16", **kwargs) -> ComputeOp:
    """A GEMM ``C[b,m,n] = A[b,m,k] @ B[b,k,n]`` as a ComputeOp.

    ``flops = 2*b*m*n*k``; ``bytes = element_size * (b*m*k + b*k*n + b*m*n)`` (read A and B,
    write C once: the minimum HBM traffic of a well-tiled GEMM). Extra keyword arguments
    (``stream``, ``deps``) are passed to :class:`ComputeOp`.

    Raises:
        ValueError: a dimension is not a positive integer, or the dtype is unknown.
    """
    for dim_name, value in (("b", b), ("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"matmul_op {name!r} {dim_name}: {value!r} must be a positive integer")
    canon = canonical_dtype(dtype)
    size = ELEMENT_BYTES[canon]
    return ComputeOp(
        name=name,
        kind="matmul",
        flops=2.0 * b * m * n * k,
        bytes=float(size * (b * m * k + b * k * n + b * m * n)),
        shape=(b, m, n, k),
        dtype=canon,
        **kwargs,
    )
