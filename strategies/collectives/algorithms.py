"""Collective algorithms expressed as pipelined transfer phases.

Each builder turns (collective kind, group, size) into the transfers that move
over the machine, grouped in phases (see :mod:`hardware.network`). Transfers
of a phase run concurrently and are pipelined in chunks, so a phase's time is
the sum of its per-step hop latencies plus the time its most loaded link needs
for the payload (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005, for the ring and tree costs).

How the ring is laid on the machine (as NCCL does it): members are visited
domain by domain; with ``L`` members per NVLink domain the data is split over
``L`` channels; channel ``c`` enters every domain at its ``c``-th member,
walks the domain over NVLink, hands the data over NVLink to the ``c``-th member
again (PXN) and leaves through that member's own NIC to the ``c``-th member of
the next domain, so each channel stays on one rail.

Sizes are nccl-tests sizes (see :mod:`strategies.ir`).
"""

from __future__ import annotations

from itertools import chain
from typing import Callable

import numpy as np

from hardware.spec import GroupGeometry
from strategies.collectives.plans import (AllPairs, CommPlan, LazyTransfers, Phase, Transfer,
                                          TransferColumns, TransferCounts)

#: Largest group whose all-to-all lists its n (n - 1) transfers (262,000 at 512);
#: above it they are an :class:`AllPairs`, priced from per-link counts.
ALL_PAIRS_LISTED_MAX = 512


# ---------------------------------------------------------------------- rings
def _ring_transfers(geometry: GroupGeometry, edge_bytes: float) -> list[Transfer]:
    """Transfers of one ring pass moving ``edge_bytes`` out of every member."""
    return list(_ring_columns(geometry, edge_bytes))


def _ring_columns(geometry: GroupGeometry, edge_bytes: float) -> TransferColumns:
    """:func:`_ring_transfers` as columns (the same transfers in the same order): in
    each domain, channel ``c`` walks the domain's members from member ``c`` on and back
    to it (PXN hand-over), then crosses to member ``c`` of the next domain."""
    domains = geometry.domains
    if len(domains) == 1:
        members = tuple(domains[0])
        if len(members) == 1:
            return TransferColumns((), (), edge_bytes)
        return TransferColumns(members, members[1:] + members[:1], edge_bytes)
    channels = geometry.local_size
    per_channel = edge_bytes / channels
    # the columns depend on the domains alone: built once per geometry (a collective's
    # kinds and an all-reduce's two passes over one group share them; the same tuples
    # also let the network model find their per-link loads by content at once)
    found = _RING_COLUMNS.get(id(geometry))
    if found is not None and found[0] is geometry:
        return TransferColumns(found[1], found[2], per_channel)
    # (kept as int64 arrays: what the network model reads, TransferColumns.arrays)
    src: list[int] = []
    dst: list[int] = []
    for d, members in enumerate(domains):
        following = domains[(d + 1) % len(domains)]
        width = len(members)
        members = tuple(members)
        for c in range(channels):
            if width > 1:
                k = c % width  # the domain's ring starting at member c (a rotation)
                order = members[k:] + members[:k]
                src += order  # order[i] -> order[i + 1], and order[-1] -> order[0]
                dst += order[1:]
                dst.append(order[0])
            src.append(members[c])
            dst.append(following[c])
    columns = TransferColumns(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                              per_channel)
    if len(_RING_COLUMNS) >= _RING_COLUMNS_MAX:
        _RING_COLUMNS.clear()
    _RING_COLUMNS[id(geometry)] = (geometry, *columns.arrays())
    return columns


#: _ring_columns' sources and destinations per geometry (by identity, the geometry
#: kept alive with its entry; ClusterLayout.geometry hands one object per group), at
#: most _RING_COLUMNS_MAX of them
_RING_COLUMNS: dict[int, tuple[GroupGeometry, np.ndarray, np.ndarray]] = {}
_RING_COLUMNS_MAX = 1024


def _ring_steps(geometry: GroupGeometry, steps: int, boundaries: int) -> tuple[int, int]:
    """Split a chunk's ``steps`` hops into (intra-domain, inter-domain) hops."""
    inter = min(boundaries, steps) if geometry.num_domains > 1 else 0
    return steps - inter, inter


def _ring_phase(name: str, geometry: GroupGeometry, steps: int, edge_bytes: float,
                boundaries: int, ring_plateau: bool = False) -> Phase:
    """One ring pass; every rank sends ``edge_bytes``, which is also what NCCL's bus
    bandwidth counts per rank (tuning.cc: algBw = busBw x nRanks / nsteps)."""
    intra, inter = _ring_steps(geometry, steps, boundaries)
    # (transfers built when first read: a ring whose latency alone loses never is; its
    # per-link loads come from _ring_counts, the same transfers counted)
    if geometry.num_domains > 1:
        transfers = LazyTransfers(lambda: _ring_columns(geometry, edge_bytes),
                                  lambda: _ring_counts(geometry),
                                  edge_bytes / geometry.local_size)
    else:
        transfers = LazyTransfers(lambda: _ring_columns(geometry, edge_bytes))
    return Phase(name, transfers, intra, inter, geometry.switch_hops, bus_bytes=edge_bytes,
                 ring_plateau=ring_plateau)


def _ring_counts(geometry: GroupGeometry) -> TransferCounts:
    """:func:`_ring_columns` of a group over several domains, counted: channel ``c``'s
    ring walks every domain of more than one member from member ``c`` round to it
    again, so each such member sends one transfer and receives one inside its domain
    per channel (``local_size`` each); listed, each domain's member ``c`` sending to
    member ``c`` of the next domain, per channel."""
    # (once per geometry, as _ring_columns: a collective's kinds and an all-reduce's
    # two passes share them, and the network model finds their loads by content)
    found = _RING_COUNTS.get(id(geometry))
    if found is not None and found[0] is geometry:
        return found[1]
    domains = geometry.domains
    channels = geometry.local_size
    # (members 0 .. channels - 1 of every domain, domains in order, straight into int64:
    # channels is the smallest domain's size, so every domain has them; each one sends
    # to the member of its channel in the next domain, the same list rotated by one
    # domain)
    src = np.fromiter(chain.from_iterable(members[:channels] for members in domains),
                      dtype=np.int64, count=len(domains) * channels)
    dst = np.concatenate((src[channels:], src[:channels]))
    inside = np.fromiter(chain.from_iterable(members for members in domains
                                             if len(members) > 1), dtype=np.int64)
    each = np.full(inside.size, channels, dtype=np.int64)
    counts = TransferCounts(src, dst, inside, each, each)
    if len(_RING_COUNTS) >= _RING_COLUMNS_MAX:
        _RING_COUNTS.clear()
    _RING_COUNTS[id(geometry)] = (geometry, counts)
    return counts


#: _ring_counts per geometry (by identity, the geometry kept alive with its entry)
_RING_COUNTS: dict[int, tuple[GroupGeometry, TransferCounts]] = {}


def ring_all_reduce(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """Ring all-reduce = reduce-scatter then all-gather, each (n-1) steps of S/n;
    across several NVLink domains its phases carry NCCL's ring plateau
    (:attr:`Phase.ring_plateau`)."""
    n, N = geometry.size, geometry.num_domains
    edge = (n - 1) / n * size_bytes
    return [_ring_phase("reduce_scatter", geometry, n - 1, edge, N, N > 1),
            _ring_phase("all_gather", geometry, n - 1, edge, N, N > 1)]


def ring_gather_scatter(name: str) -> Callable[[GroupGeometry, int], list[Phase]]:
    """Ring all-gather / reduce-scatter: (n-1) steps of S/n, S the total size."""
    def build(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
        n = geometry.size
        return [_ring_phase(name, geometry, n - 1, (n - 1) / n * size_bytes,
                            geometry.num_domains)]
    return build


def ring_chain(name: str) -> Callable[[GroupGeometry, int], list[Phase]]:
    """Pipelined chain for broadcast / reduce: every edge carries all S bytes."""
    def build(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
        n = geometry.size
        return [_ring_phase(name, geometry, n - 1, float(size_bytes),
                            geometry.num_domains - 1)]
    return build


# ---------------------------------------------------------------------- trees
def _btree(num: int, node: int) -> tuple[int, list[int]]:
    """NCCL's binary tree over ``num`` nodes rooted at 0 (src/graph/trees.cc,
    ncclGetBtree): a node's parent and children follow from its lowest set bit, the
    root has a single child (the largest power of two below ``num``), and a subtree
    cut by ``num`` hangs its child from the nearest node in bounds.

    Returns ``(parent or -1, children)``.
    """
    bit = 1
    while bit < num and not bit & node:
        bit <<= 1
    if node == 0:
        return -1, ([bit >> 1] if num > 1 else [])
    up = (node ^ bit) | (bit << 1)
    if up >= num:
        up = node ^ bit
    low = bit >> 1
    children = []
    if low:
        children.append(node - low)
        down = node + low
        while down >= num and low:
            low >>= 1
            down = node + low if low else -1
        if down > 0:
            children.append(down)
    return up, children


def double_binary_trees(num: int) -> tuple[list[dict[int, int]], int]:
    """NCCL's double binary tree over ``num`` nodes (Sanders, Speck & Träff, Parallel
    Computing 2009; src/graph/trees.cc ncclGetDtree): the first tree is
    :func:`_btree`, the second its mirror (``num`` even) or the same tree shifted by
    one node (``num`` odd), so that most nodes inner in one tree are leaves in the
    other and every node's links carry both halves of the data (with 3 nodes, node 0
    is inner in both: a chain 0-2-1 and its shift 1-0-2).

    Returns ``([parents of tree 0, parents of tree 1], max height in edges)``.
    """
    first = {n: up for n in range(num) for up in (_btree(num, n)[0],) if up >= 0}
    if num % 2:
        second = {(n + 1) % num: (up + 1) % num for n, up in first.items()}
    else:
        second = {num - 1 - n: num - 1 - up for n, up in first.items()}

    def height(parents: dict[int, int]) -> int:
        best = 0
        for node in parents:
            depth, at = 0, node
            while at in parents:
                at, depth = parents[at], depth + 1
            best = max(best, depth)
        return best

    return [first, second], max(height(first), height(second))


def _dtree(num: int) -> tuple[list[dict[int, int]], int]:
    """:func:`double_binary_trees` of ``num`` nodes, built once per ``num`` for the
    builders here (which only read it)."""
    found = _DTREES.get(num)
    if found is None:
        found = _DTREES[num] = double_binary_trees(num)
    return found


#: _dtree's trees by node count
_DTREES: dict[int, tuple[list[dict[int, int]], int]] = {}


def _uniform_tree_columns(domains: tuple[tuple[int, ...], ...], channels: int,
                          trees: list[dict[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tree_all_reduce`'s sources and destinations when every domain holds
    ``channels`` members, as int64 arrays built in numpy (the same transfers in the same
    order as its loop): per tree and channel ``c``, each domain's chain from member
    ``c`` (``b -> a`` then ``a -> b`` for each consecutive pair) followed, unless the
    domain is the tree's root, by member ``c``'s exchange with member ``c`` of its
    parent domain."""
    members = np.asarray(domains, dtype=np.int64)  # (domains, channels)
    num, width = members.shape
    chain = 2 * (width - 1)
    src_blocks, dst_blocks = [], []
    for parents in trees:
        parent = np.full(num, -1, dtype=np.int64)
        parent[list(parents)] = list(parents.values())
        has_parent = parent >= 0
        # per domain row: its chain (2 (width - 1) entries), then 2 for the tree edge
        keep = np.ones((num, chain + 2), dtype=bool)
        keep[~has_parent, chain:] = False
        up_domain = np.where(has_parent, parent, 0)
        for c in range(channels):
            order = members[:, (np.arange(width) + c) % width]  # rotated to start at c
            lower, upper = order[:, :-1], order[:, 1:]
            src = np.empty((num, chain + 2), dtype=np.int64)
            dst = np.empty((num, chain + 2), dtype=np.int64)
            src[:, 0:chain:2], src[:, 1:chain:2] = upper, lower
            dst[:, 0:chain:2], dst[:, 1:chain:2] = lower, upper
            own, up = members[:, c], members[up_domain, c]
            src[:, chain], src[:, chain + 1] = own, up
            dst[:, chain], dst[:, chain + 1] = up, own
            src_blocks.append(src[keep])
            dst_blocks.append(dst[keep])
    return np.concatenate(src_blocks), np.concatenate(dst_blocks)


def tree_all_reduce(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """Double binary tree across domains, chains inside them; reduce and
    broadcast run pipelined at the same time, each tree carries half the data."""
    domains = geometry.domains
    channels = geometry.local_size
    trees, height = _dtree(len(domains))
    chunk = size_bytes / (2 * channels)
    uniform = geometry.uniform
    intra = 2 * (channels - 1) if uniform else 2 * (max(map(len, domains)) - 1)
    # NCCL counts a tree all-reduce as moving twice the size per rank (tuning.cc:
    # algBw = busBw x 0.5 for trees): its per-channel ceilings apply to 2 S. The
    # transfers are built when first read (a tree whose latency alone loses never is).
    counts = None
    if uniform and len(domains) > 1:  # (its per-link loads from the transfers counted)
        counts = lambda: _uniform_tree_counts(domains, channels, trees)  # noqa: E731
    return [Phase("reduce_broadcast",
                  LazyTransfers(lambda: _tree_columns(domains, channels, trees, chunk, uniform),
                                counts, chunk),
                  intra, 2 * height, geometry.switch_hops, bus_bytes=2.0 * size_bytes)]


def _uniform_tree_counts(domains: tuple[tuple[int, ...], ...], channels: int,
                         trees: list[dict[int, int]]) -> TransferCounts:
    """:func:`_uniform_tree_columns` counted: per tree and channel each domain's chain
    (its ``channels`` members from member ``c`` on) exchanges both ways along its
    ``channels - 1`` consecutive pairs, so over the channels a member sends (and
    receives) as many transfers as its chains give it neighbours: ``2 channels - 2``
    per tree (each of the ``channels`` rotations is a path whose two ends, member
    ``c`` and the one before it, have one neighbour, and the others two); listed, the
    tree edges: member ``c`` of each domain but the tree's root to member ``c`` of its
    parent domain and back."""
    members = np.asarray(domains, dtype=np.int64)  # (domains, channels)
    src_blocks, dst_blocks = [], []
    for parents in trees:
        below = np.asarray(list(parents), dtype=np.int64)
        above = np.asarray(list(parents.values()), dtype=np.int64)
        own, up = members[below].reshape(-1), members[above].reshape(-1)
        src_blocks += [own, up]
        dst_blocks += [up, own]
    inside = members.reshape(-1) if channels > 1 else np.zeros(0, dtype=np.int64)
    each = np.full(inside.size, len(trees) * (2 * channels - 2), dtype=np.int64)
    return TransferCounts(np.concatenate(src_blocks), np.concatenate(dst_blocks), inside,
                          each, each)


def _tree_columns(domains: tuple[tuple[int, ...], ...], channels: int,
                  trees: list[dict[int, int]], chunk: float, uniform: bool) -> TransferColumns:
    """:func:`tree_all_reduce`'s transfers (``chunk`` bytes each): per tree and channel
    ``c``, each domain's chain from member ``c`` (``b -> a`` then ``a -> b`` for each
    consecutive pair), then, unless the domain is the tree's root, member ``c``'s
    exchange with member ``c`` of its parent domain (``uniform``: every domain holds
    ``channels`` members)."""
    if uniform and len(domains) > 1:
        src, dst = _uniform_tree_columns(domains, channels, trees)
        return TransferColumns(src, dst, chunk)
    # each domain's chain per channel, the same in both trees (built once): for each
    # consecutive pair (a, b) of the chain, b -> a then a -> b (interleaved by slices)
    chains = []
    for c in range(channels):
        row = []
        for members in domains:
            k = c % len(members)  # the domain's chain starting at member c
            order = tuple(members[k:]) + tuple(members[:k])
            lower, upper = order[:-1], order[1:]
            chain_src = [0] * (2 * len(lower))
            chain_dst = chain_src[:]
            chain_src[0::2] = upper
            chain_src[1::2] = lower
            chain_dst[0::2] = lower
            chain_dst[1::2] = upper
            row.append((chain_src, chain_dst))
        chains.append(row)
    src: list[int] = []
    dst: list[int] = []
    for parents in trees:
        for c in range(channels):
            row = chains[c]
            for d, members in enumerate(domains):
                chain_src, chain_dst = row[d]
                src += chain_src
                dst += chain_dst
                up_domain = parents.get(d)
                if up_domain is not None:
                    up = domains[up_domain][c]
                    src += (members[c], up)
                    dst += (up, members[c])
    return TransferColumns(src, dst, chunk)


# ----------------------------------------------------------------- NVLS, hier
def nvls_all_reduce(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """NVLink SHARP: every GPU pushes S into the switch, which reduces and
    multicasts S back (one pass each way through the GPU's NVLink ports)."""
    members = geometry.domains[0]
    transfers = tuple(Transfer(m, m, float(size_bytes), "nvls") for m in members)
    return [Phase("nvls", transfers, 2, 0, 0)]


def nvls_tree_all_reduce(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """NCCL's NVLS_TREE for several domains: NVLS reduces inside each domain so
    that member ``i`` holds shard ``i`` (S/L), member ``i`` of every domain
    all-reduces its shard over a double binary tree through its own NIC, and
    NVLS multicasts the result back; the stages run pipelined, as one phase."""
    domains = geometry.domains
    width = geometry.local_size
    trees, height = _dtree(len(domains))
    shard = size_bytes / width / 2  # each of the two trees carries half of a shard

    def build() -> tuple[Transfer, ...]:
        transfers = [Transfer(m, m, float(size_bytes), "nvls") for members in domains
                     for m in members]
        for parents in trees:
            for d, parent in parents.items():
                for i in range(width):
                    below, above = domains[d][i], domains[parent][i]
                    transfers += [Transfer(below, above, shard), Transfer(above, below, shard)]
        return tuple(transfers)

    # (built when first read: NVLS_TREE's latency alone often loses, and then never is)
    return [Phase("nvls_tree", LazyTransfers(build), 2, 2 * height, geometry.switch_hops)]


def hierarchical_all_reduce(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """Reduce-scatter inside each domain, all-reduce of the 1/L shards across
    domains (one ring per local index, on its own rail), all-gather inside."""
    domains = geometry.domains
    width, num = geometry.local_size, len(domains)
    inner = [GroupGeometry(d, (d,), 0) for d in domains]
    phases = []
    intra_edge = (width - 1) / width * size_bytes

    def inside(name: str) -> Phase:
        transfers = tuple(t for g in inner for t in _ring_transfers(g, intra_edge))
        return Phase(name, transfers, width - 1, 0, 0)

    if width > 1:
        phases.append(inside("intra_reduce_scatter"))
    shard_edge = 2 * (num - 1) / num * size_bytes / width
    across = tuple(
        Transfer(domains[d][i], domains[(d + 1) % num][i], shard_edge)
        for i in range(width) for d in range(num)
    )
    phases.append(Phase("inter_all_reduce", across, 0, 2 * (num - 1), geometry.switch_hops))
    if width > 1:
        phases.append(inside("intra_all_gather"))
    return phases


# --------------------------------------------------------------------- direct
def direct_alltoall(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """Every member sends S/n to every other member at once, as NCCL runs it: a group
    of send/recv pairs (nccl-tests alltoall_perf; NCCL's p2p channels per peer)."""
    group, n = geometry.group, geometry.size
    share = size_bytes / n
    if n > ALL_PAIRS_LISTED_MAX:  # n (n - 1) transfers: priced from counts per link
        transfers = AllPairs(group, share, "p2p")
    else:
        transfers = tuple(Transfer(a, b, share, "p2p") for a in group for b in group if a != b)
    crosses = geometry.num_domains > 1
    return [Phase("alltoall", transfers, 0 if crosses else 1, 1 if crosses else 0,
                  geometry.switch_hops)]


def direct_sendrecv(geometry: GroupGeometry, size_bytes: int) -> list[Phase]:
    """nccl-tests sendrecv: member i sends S to member i+1 and receives from i-1."""
    group, n = geometry.group, geometry.size
    transfers = tuple(Transfer(group[i], group[(i + 1) % n], float(size_bytes), "p2p")
                      for i in range(n))
    crosses = geometry.num_domains > 1
    return [Phase("sendrecv", transfers, 0 if crosses else 1, 1 if crosses else 0,
                  geometry.switch_hops)]


def point_to_point(geometry: GroupGeometry, size_bytes: float) -> CommPlan:
    """A single send/recv from ``geometry.group[0]`` to ``group[1]`` (pipeline-parallel
    edges): one hop, over NVLink inside a domain or over the network between them."""
    src, dst = geometry.group
    crosses = geometry.num_domains > 1
    phase = Phase("p2p", (Transfer(src, dst, float(size_bytes), "p2p"),),
                  0 if crosses else 1, 1 if crosses else 0, geometry.switch_hops)
    return CommPlan("direct", "Simple", (phase,), "p2p", float(size_bytes), 2,
                    geometry.num_domains, geometry.local_size)
