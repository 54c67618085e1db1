"""Communication plans: what a collective or a send/recv moves, as data.

A :class:`CommPlan` is a sequence of :class:`Phase` objects, each a set of
concurrent, pipelined :class:`Transfer` objects; the algorithm builders
(:mod:`strategies.collectives.algorithms`) make them, and the hardware cost model
(:mod:`hardware.cost`) prices them through the read-only protocols of
:mod:`hardware.network` — a plan says *what* moves, never how long it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: How a transfer is driven, which changes the bandwidth it reaches.
TRANSFER_MODES = ("collective", "p2p", "nvls")


@dataclass(frozen=True, slots=True)
class Transfer:
    """Payload moved from one GPU to another during a phase.

    Attributes:
        src, dst: global ranks (``src == dst`` with mode ``nvls`` means the
            GPU's traffic to and from the NVSwitch).
        payload_bytes: bytes delivered over the whole phase.
        mode: ``collective`` (NCCL collective kernels), ``p2p`` (send/recv)
            or ``nvls`` (NVLink SHARP in-switch reduction).
    """

    src: int
    dst: int
    payload_bytes: float
    mode: str = "collective"


@dataclass(frozen=True, slots=True)
class Phase:
    """Concurrent pipelined transfers and the steps their latency adds up over.

    Attributes:
        name: label, e.g. ``"reduce_scatter"``.
        transfers: what moves.
        intra_steps: pipeline steps whose hop stays in the scale-up domain.
        inter_steps: pipeline steps whose hop crosses the network.
        switch_hops: scale-out switches one network hop crosses.
        bus_bytes: bytes each rank moves in the phase in NCCL's bus-bandwidth
            terms (a ring step's edge bytes; twice the size for a tree
            all-reduce), which NCCL's per-protocol and per-channel ceilings
            apply to; 0: none apply.
        ring_plateau: the phase is half of a ring all-reduce across several
            NVLink domains, whose Simple steps NCCL prices at its "plateau"
            factor (hardware.network.NetworkModel.phase_latency_s).
    """

    name: str
    transfers: tuple[Transfer, ...]
    intra_steps: int
    inter_steps: int
    switch_hops: int = 0
    bus_bytes: float = 0.0
    ring_plateau: bool = False


@dataclass(frozen=True, slots=True)
class CommPlan:
    """How one communication operation runs: algorithm, protocol, phases.

    Attributes:
        family: algorithm family keying the base latency (``ring``, ``tree``,
            ``nvls``, ``direct``).
        protocol: ``LL``, ``LL128`` or ``Simple``.
        phases: run one after another.
        label: algorithm name for reports (e.g. ``"hierarchical"``).
        size_bytes: the operation's size (nccl-tests meaning), which sets how
            many channels NCCL runs.
        ranks: ranks of the communicator (NCCL sizes p2p channels by it).
        domains: NVLink domains (NCCL "nodes") the communicator spans.
        local_ranks: fewest ranks the communicator has in one domain.
    """

    family: str
    protocol: str
    phases: tuple[Phase, ...]
    label: str = ""
    size_bytes: float = 0.0
    ranks: int = 0
    domains: int = 0
    local_ranks: int = 0


class AllPairs(Sequence):
    """The transfers of an exchange in which every member of ``group`` sends
    ``payload_bytes`` to every other member (a direct all-to-all), without listing
    them: ``n (n - 1)`` Transfer objects for 16,384 ranks would take tens of GB.

    A read-only sequence of :class:`Transfer` (source-major order, as a nested loop
    over the group would list them), so anything that walks transfers still can;
    the network model (hardware.network) prices it from counts per link instead
    (:meth:`hardware.topology.ClusterLayout.all_pairs_link_counts`).

    Attributes:
        group: the members, in communicator order.
        payload_bytes: bytes each member sends to each other member.
        mode: how the transfers are driven (``p2p`` for NCCL's send/recv).
    """

    all_pairs = True

    def __init__(self, group: tuple[int, ...], payload_bytes: float, mode: str = "p2p") -> None:
        self.group = tuple(group)
        self.payload_bytes = float(payload_bytes)
        self.mode = mode

    def __len__(self) -> int:
        n = len(self.group)
        return n * (n - 1)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self.group)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        src, k = divmod(index, n - 1)
        dst = k + (k >= src)
        return Transfer(self.group[src], self.group[dst], self.payload_bytes, self.mode)

    def __iter__(self):
        group, payload, mode = self.group, self.payload_bytes, self.mode
        for a in group:
            for b in group:
                if a != b:
                    yield Transfer(a, b, payload, mode)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AllPairs):
            return (self.group, self.payload_bytes, self.mode) == (
                other.group, other.payload_bytes, other.mode)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.group, self.payload_bytes, self.mode))

    def __repr__(self) -> str:
        return (f"AllPairs({len(self.group)} ranks, {self.payload_bytes:g} bytes each way, "
                f"{self.mode})")


class TransferColumns(Sequence):
    """Transfers of one mode and one payload held as two columns of ranks (sources,
    destinations) instead of one :class:`Transfer` object each: the ring and tree
    builders list thousands per phase for a large group, and building the objects cost
    more than pricing them (issue 16). The network model's closed form reads the
    columns (hardware.network ``_payload_per_link``); anything else walks it as the
    read-only sequence of :class:`Transfer` it stands for (built once, on first use), so
    it compares equal to that tuple.

    The columns may be given as int64 numpy arrays (a builder that computes them in
    numpy): the network model reads those (:meth:`arrays`) and the tuples are made only
    when something asks for them.

    Attributes:
        src, dst: global ranks of each transfer, in listing order (tuples).
        payload_bytes: bytes every transfer delivers.
        mode: how the transfers are driven (:data:`TRANSFER_MODES`).
    """

    all_pairs = False
    columns = True

    def __init__(self, src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray,
                 payload_bytes: float, mode: str = "collective") -> None:
        if len(src) != len(dst):
            raise ValueError(f"dst: {len(dst)} ranks for {len(src)} sources; give one "
                             "destination per source")
        given_arrays = isinstance(src, np.ndarray) and isinstance(dst, np.ndarray)
        self._arrays = (src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)) \
            if given_arrays else None
        self._src = None if given_arrays else tuple(src)
        self._dst = None if given_arrays else tuple(dst)
        self._size = len(src)
        self.payload_bytes = payload_bytes
        self.mode = mode
        self._listed: tuple[Transfer, ...] | None = None

    @property
    def src(self) -> tuple[int, ...]:
        """Sources, in listing order."""
        if self._src is None:
            self._src = tuple(self._arrays[0].tolist())
        return self._src

    @property
    def dst(self) -> tuple[int, ...]:
        """Destinations, in listing order."""
        if self._dst is None:
            self._dst = tuple(self._arrays[1].tolist())
        return self._dst

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Sources and destinations as int64 numpy arrays (made once; callers must not
        change them)."""
        if self._arrays is None:
            self._arrays = (np.asarray(self._src, dtype=np.int64),
                            np.asarray(self._dst, dtype=np.int64))
        return self._arrays

    def listed(self) -> tuple[Transfer, ...]:
        """The transfers as :class:`Transfer` objects (built once)."""
        if self._listed is None:
            payload, mode = self.payload_bytes, self.mode
            self._listed = tuple(Transfer(a, b, payload, mode)
                                 for a, b in zip(self.src, self.dst))
        return self._listed

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        return self.listed()[index]

    def __iter__(self):
        return iter(self.listed())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TransferColumns):
            return (self.src, self.dst, self.payload_bytes, self.mode) == (
                other.src, other.dst, other.payload_bytes, other.mode)
        if isinstance(other, (tuple, list)):
            return self.listed() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.listed())

    def __repr__(self) -> str:
        return (f"TransferColumns({len(self.src)} transfers of {self.payload_bytes:g} bytes, "
                f"{self.mode})")


class TransferCounts(NamedTuple):
    """Transfers of one payload and mode told by how they load links, for a collective
    whose transfers inside an NVLink domain only touch their two GPUs' scale-up ports
    (hardware.topology ``ClusterLayout.paths_links``: a transfer within a domain crosses
    its source's egress and its destination's ingress port, nothing else): those are
    counted per GPU, the others listed (int64 arrays).

    Attributes:
        src, dst: the transfers between domains (any order: the loads are sums of
            equal terms).
        inside: GPUs with transfers inside their domain (each once).
        sends, receives: how many such transfers each GPU of ``inside`` sends and
            receives.
    """

    src: np.ndarray
    dst: np.ndarray
    inside: np.ndarray
    sends: np.ndarray
    receives: np.ndarray


class LazyTransfers(Sequence):
    """A phase's transfers, built by ``build()`` when something first reads them.

    A collective's price starts with its fixed latencies, which read a phase's step
    counts and never its transfers (hardware.cost ``CostModel._coefficients_of``); a
    candidate algorithm whose latencies alone lose (``CostModel.collective``) is then
    never built (issue 16: NCCL's NVLS_TREE on H100 groups, a double binary tree that a
    ring beats). Reads through it give what ``build()`` returns: its length, items,
    equality and hash, and its attributes (``columns``, ``arrays()``, ``mode``, ...).

    With ``counts`` (the builder's :class:`TransferCounts` of the same transfers, which
    all move ``payload_bytes`` in ``mode``), the network model takes a phase's per-link
    loads from them without building the list (hardware.network
    ``NetworkModel._payload_per_link``); it then reads as columns of one mode
    (``columns``, ``mode``, ``payload_bytes``, not ``all_pairs``) and as non-empty
    without being built.

    Args:
        build: makes the transfers (a tuple of :class:`Transfer`, a
            :class:`TransferColumns` or an :class:`AllPairs`), called once.
        counts: None, or a callable giving the :class:`TransferCounts` of what
            ``build()`` lists (a :class:`TransferColumns` of ``payload_bytes`` in ``mode``).
        payload_bytes: with ``counts``, the payload of every transfer.
        mode: with ``counts``, the mode of every transfer.
    """

    def __init__(self, build, counts=None, payload_bytes: float = 0.0,
                 mode: str = "collective") -> None:
        self._build = build
        self._built = None
        self.counts = counts
        if counts is not None:
            self.all_pairs = False
            self.columns = True
            self.payload_bytes = payload_bytes
            self.mode = mode

    def __bool__(self) -> bool:
        # (a builder gives counts only for transfers it lists: non-empty)
        return self.counts is not None or len(self.built()) > 0

    def built(self):
        """The transfers (built on the first call)."""
        if self._built is None:
            self._built = self._build()
            self._build = None
        return self._built

    def __getattr__(self, name: str):
        if name.startswith("_"):  # (own slots not set yet, dunder probes)
            raise AttributeError(name)
        return getattr(self.built(), name)

    def __len__(self) -> int:
        return len(self.built())

    def __getitem__(self, index):
        return self.built()[index]

    def __iter__(self):
        return iter(self.built())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTransfers):
            other = other.built()
        return self.built() == other

    def __hash__(self) -> int:
        return hash(self.built())

    def __reduce__(self):
        return _identity, (self.built(),)

    def __repr__(self) -> str:
        return repr(self.built())


def _identity(value):
    """What a pickled :class:`LazyTransfers` unpickles to: its transfers."""
    return value
