"""Where every GPU sits and which links a transfer between two GPUs crosses.

A :class:`ClusterLayout` places ``nodes x gpus_per_node`` ranks on a preset
(rank ``r`` is GPU ``r % gpus_per_node`` of node ``r // gpus_per_node``) and
describes the links of the machine as capacities (payload bytes/s, one
direction) grouped in tiers:

* ``nvlink`` (or ``pcie`` when the scale-up domain is PCIe): one egress and
  one ingress port per GPU. NVSwitch is non-blocking, so these ports are the
  only NVLink resources (an NVLink "path" is egress(src) -> ingress(dst)).
* ``network``: one egress and one ingress per NIC; for multi-tier fabrics the
  aggregate uplink/downlink of every leaf (and spine group), sized from the
  NICs below it and the oversubscription ratio. Aggregating a switch's
  uplinks into one link assumes ideal ECMP load balancing.
* ``pcie`` host bounce: without GPUDirect RDMA, network traffic crosses PCIe
  to host memory and back at each end.

Rails: NIC ``i`` of a node serves the GPUs ``i * gpus_per_node / nics`` onward
(DGX: GPU *i* uses NIC *i*). On a rail-optimized fabric, traffic between
different rails is first moved over NVLink to the GPU that sits on the
destination rail (NCCL's PXN), so it never crosses the spine for a rail change.
"""

from __future__ import annotations

from array import array as _array
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate as _accumulate
from operator import lt as _lt, ne as _ne
from typing import Sequence

import numpy as np

from hardware.spec import ClusterSpec, GroupGeometry

#: Largest group whose :meth:`ClusterLayout.group_class` is computed in plain Python.
_SMALL_GROUP = 64
#: Group classes a layout remembers before it empties its table (a bound on memory).
_MAX_GROUP_CLASSES = 65536
#: Nonzero entries of an array: a bool mask's any()/all() as one C call
#: (ndarray.any and .all go through numpy's Python-level reduction wrappers, ~3 us a
#: call on the few hundred transfers of a collective's phase)
_count = np.count_nonzero


#: Link tiers, in the order :attr:`ClusterLayout.link_tier_index` numbers them.
TIERS = ("nvlink", "pcie", "network")


@dataclass(frozen=True, slots=True)
class Path:
    """Links crossed by one transfer, and how far it travels.

    Attributes:
        links: link ids in order of traversal.
        tier: ``"local"`` (same GPU), ``"nvlink"``, ``"pcie"`` or ``"network"``.
        switch_hops: scale-out switches crossed (0 inside a domain).
    """

    links: tuple[int, ...]
    tier: str
    switch_hops: int


class ClusterLayout:
    """Placement of ranks on a cluster and the link graph between them.

    Args:
        spec: the cluster preset.
        nodes: nodes used by the job.
        gpus_per_node: GPUs used per node (at most ``spec.gpus_per_node``).

    Raises:
        ValueError: naming the field when ``nodes`` or ``gpus_per_node`` are out
            of range for the preset.
    """

    def __init__(self, spec: ClusterSpec, nodes: int, gpus_per_node: int) -> None:
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes: {nodes!r} is not valid; give an integer >= 1")
        if nodes > spec.max_nodes:
            raise ValueError(
                f"nodes: {nodes} exceeds the {spec.max_nodes} nodes of cluster "
                f"{spec.name!r}; give 1..{spec.max_nodes} or override max_nodes"
            )
        if not isinstance(gpus_per_node, int) or not 1 <= gpus_per_node <= spec.gpus_per_node:
            raise ValueError(
                f"gpus_per_node: {gpus_per_node!r} is not valid for cluster {spec.name!r}; "
                f"give 1..{spec.gpus_per_node}"
            )
        self.spec = spec
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.world_size = nodes * gpus_per_node
        self._nodes_per_domain = max(1, spec.scale_up.domain_gpus // spec.gpus_per_node)
        self._geometries: dict[tuple[int, ...], GroupGeometry] = {}
        self._classes: dict[tuple[int, ...], bytes] = {}
        #: False once a link's capacity differs from its kind's (scale_nic): then no
        #: two groups are priced alike by symmetry (group_class returns None).
        self.uniform_links = True
        self._build_links()

    # ----------------------------------------------------------------- placement
    def node_of(self, rank: int) -> int:
        """Node index of a global rank."""
        return rank // self.gpus_per_node

    def local_of(self, rank: int) -> int:
        """GPU index of a rank inside its node."""
        return rank % self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        """Scale-up (NVLink) domain of a rank; a DGX node is one domain, NVL72 is 18 nodes."""
        if self.spec.scale_up.kind == "pcie" and self.spec.scale_up.domain_gpus <= 1:
            return rank
        return self.node_of(rank) // self._nodes_per_domain

    def domains_of(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`domain_of` of every rank of an integer array."""
        if self.spec.scale_up.kind == "pcie" and self.spec.scale_up.domain_gpus <= 1:
            return np.asarray(ranks)
        return np.asarray(ranks) // self.gpus_per_node // self._nodes_per_domain

    def rail_of(self, rank: int) -> int:
        """NIC index (rail) serving a rank's GPU."""
        return self.local_of(rank) * self.spec.nic.count_per_node // self.spec.gpus_per_node

    def leaf_of(self, node: int, rail: int) -> int:
        """Leaf switch (group) of a node's NIC; rail-optimized fabrics have one leaf per rail."""
        fabric = self.spec.fabric
        unit = node // fabric.nodes_per_leaf
        if fabric.topology == "rail-optimized":
            return unit * self.spec.nic.count_per_node + rail
        return unit

    def spine_group_of(self, leaf: int) -> int:
        """Spine group above a leaf (tier-3 fabrics route between groups through the core)."""
        fabric = self.spec.fabric
        leaves_per_unit = (
            self.spec.nic.count_per_node if fabric.topology == "rail-optimized" else 1
        )
        unit = leaf // leaves_per_unit
        return unit // fabric.leaves_per_spine_group

    # --------------------------------------------------------------------- links
    @cached_property
    def nvlink_bytes_per_s(self) -> float:
        """Payload bandwidth of one GPU's scale-up port, one direction (bytes/s)."""
        up = self.spec.scale_up
        if up.kind == "pcie":
            return up.pcie_bytes_per_s * up.link_efficiency
        return up.nvlink_bytes_per_s * up.link_efficiency

    @cached_property
    def scale_up_tier(self) -> str:
        """``"pcie"`` when GPUs of a node talk over PCIe, else ``"nvlink"``."""
        return "pcie" if self.spec.scale_up.kind == "pcie" else "nvlink"

    @cached_property
    def nic_bytes_per_s(self) -> float:
        """Payload bandwidth of one NIC, one direction (bytes/s)."""
        return self.spec.nic.bytes_per_s * self.spec.nic.link_efficiency

    def _build_links(self) -> None:
        spec = self.spec
        gpus = self.world_size
        nics = spec.nic.count_per_node
        capacities: list[float] = []
        tiers: list[str] = []
        self._link_ranges: list[tuple[int, int, str]] = []

        range_tiers: list[str] = []

        def add(label: str, count: int, capacity: float, tier: str) -> int:
            first = len(capacities)
            capacities.extend([capacity] * count)
            tiers.extend([tier] * count)
            range_tiers.append(tier)
            self._link_ranges.append((first, count, label))
            return first

        self._gpu_out = add("gpu_out", gpus, self.nvlink_bytes_per_s, self.scale_up_tier)
        self._gpu_in = add("gpu_in", gpus, self.nvlink_bytes_per_s, self.scale_up_tier)
        self._nic_out = add("nic_out", self.nodes * nics, self.nic_bytes_per_s, "network")
        self._nic_in = add("nic_in", self.nodes * nics, self.nic_bytes_per_s, "network")
        self._host_d2h = self._host_h2d = -1
        if not spec.nic.gpudirect_rdma:
            pcie = spec.scale_up.pcie_bytes_per_s
            self._host_d2h = add("pcie_d2h", gpus, pcie, "pcie")
            self._host_h2d = add("pcie_h2d", gpus, pcie, "pcie")

        fabric = spec.fabric
        self._leaf_up = self._leaf_down = self._spine_up = self._spine_down = -1
        if fabric.tiers >= 2:
            nics_per_leaf = fabric.nodes_per_leaf * (
                1 if fabric.topology == "rail-optimized" else nics
            )
            leaf_capacity = nics_per_leaf * self.nic_bytes_per_s / fabric.oversubscription
            leaves = self.leaf_of(self.nodes - 1, nics - 1) + 1
            self._leaf_up = add("leaf_up", leaves, leaf_capacity, "network")
            self._leaf_down = add("leaf_down", leaves, leaf_capacity, "network")
            if fabric.tiers >= 3:
                groups = self.spine_group_of(leaves - 1) + 1
                spine_capacity = (
                    leaf_capacity * fabric.leaves_per_spine_group
                    * (nics if fabric.topology == "rail-optimized" else 1)
                    / fabric.oversubscription
                )
                self._spine_up = add("spine_up", groups, spine_capacity, "network")
                self._spine_down = add("spine_down", groups, spine_capacity, "network")
        self.capacity_bytes_per_s = np.asarray(capacities, dtype=np.float64)
        self.link_tier = tuple(tiers)
        #: index of each link's tier in TIERS (an array, for vectorised pricing)
        self.link_tier_index = np.repeat(
            np.asarray([TIERS.index(tier) for tier in range_tiers], dtype=np.int64),
            [count for _, count, _ in self._link_ranges])

    @property
    def num_links(self) -> int:
        """Number of links in the graph."""
        return len(self.link_tier)

    def gpu_out_link(self, rank: int) -> int:
        """Scale-up egress port of a GPU."""
        return self._gpu_out + rank

    def gpu_in_link(self, rank: int) -> int:
        """Scale-up ingress port of a GPU."""
        return self._gpu_in + rank

    def nic_out_link(self, node: int, rail: int) -> int:
        """Egress of NIC ``rail`` of ``node``."""
        return self._nic_out + node * self.spec.nic.count_per_node + rail

    def nic_in_link(self, node: int, rail: int) -> int:
        """Ingress of NIC ``rail`` of ``node``."""
        return self._nic_in + node * self.spec.nic.count_per_node + rail

    def scale_nic(self, rank: int, fraction: float) -> list[int]:
        """Run the NIC serving ``rank`` (both directions) at ``fraction`` of its rate,
        before a simulation starts (a degraded or flapping link); return the ranks
        that NIC serves.

        Raises:
            ValueError: for a rank outside the layout or a fraction outside (0, 1].
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank: {rank} is outside the layout; valid: 0..{self.world_size - 1}")
        if not 0 < fraction <= 1:
            raise ValueError(f"nic rate: {fraction!r} is not valid; give 0 < fraction <= 1")
        node, rail = self.node_of(rank), self.rail_of(rank)
        self.uniform_links = False
        self._classes.clear()
        for link in (self.nic_out_link(node, rail), self.nic_in_link(node, rail)):
            self.capacity_bytes_per_s[link] *= fraction
        return [r for r in range(node * self.gpus_per_node, (node + 1) * self.gpus_per_node)
                if self.rail_of(r) == rail]

    def link_name(self, link: int) -> str:
        """Human-readable name of a link id, e.g. ``"nic_out[12]"``, for reports."""
        for start, count, label in self._link_ranges:
            if start <= link < start + count:
                return f"{label}[{link - start}]"
        raise ValueError(f"link: {link} is not a link id; valid: 0..{self.num_links - 1}")

    # --------------------------------------------------------------------- paths
    def path(self, src: int, dst: int, *, rail: int | None = None) -> Path:
        """Links crossed by a transfer from GPU ``src`` to GPU ``dst``.

        Args:
            src, dst: global ranks.
            rail: for transfers between domains, the NIC index to leave and
                enter by (a ring channel pins its rail); default: the rail of
                ``dst``'s GPU, reached over NVLink from ``src`` when it differs
                (PXN) on rail-optimized fabrics, or ``src``'s own NIC otherwise.
        """
        if src == dst:
            return Path((), "local", 0)
        if self.domain_of(src) == self.domain_of(dst):
            return Path((self.gpu_out_link(src), self.gpu_in_link(dst)), self.scale_up_tier, 0)
        src_node, dst_node = self.node_of(src), self.node_of(dst)
        rail_mode = self.spec.fabric.topology == "rail-optimized"
        if rail is None:
            rail = self.rail_of(dst) if rail_mode else self.rail_of(src)
        links: list[int] = []
        if not self.spec.nic.gpudirect_rdma:
            links.append(self._host_d2h + src)
        elif self.rail_of(src) != rail and self.gpus_per_node > 1:
            relay = self._gpu_on_rail(src_node, rail)
            if relay is not None and relay != src:
                links += [self.gpu_out_link(src), self.gpu_in_link(relay)]
        links.append(self.nic_out_link(src_node, rail))
        dst_rail = rail if rail_mode else self.rail_of(dst)
        hops = 1
        src_leaf, dst_leaf = self.leaf_of(src_node, rail), self.leaf_of(dst_node, dst_rail)
        if src_leaf != dst_leaf and self._leaf_up >= 0:
            hops = 3
            links.append(self._leaf_up + src_leaf)
            src_group, dst_group = self.spine_group_of(src_leaf), self.spine_group_of(dst_leaf)
            if src_group != dst_group and self._spine_up >= 0:
                hops = 5
                links += [self._spine_up + src_group, self._spine_down + dst_group]
            links.append(self._leaf_down + dst_leaf)
        links.append(self.nic_in_link(dst_node, dst_rail))
        if not self.spec.nic.gpudirect_rdma:
            links.append(self._host_h2d + dst)
        elif self.rail_of(dst) != dst_rail and self.gpus_per_node > 1:
            relay = self._gpu_on_rail(dst_node, dst_rail)
            if relay is not None and relay != dst:
                links += [self.gpu_out_link(relay), self.gpu_in_link(dst)]
        return Path(tuple(links), "network", hops)

    # ----------------------------------------------------------------- groups
    def geometry(self, group: Sequence[int]) -> GroupGeometry:
        """A communicator split by NVLink domain, with its network distance (cached).

        Raises:
            ValueError: for an empty group, duplicate ranks or ranks outside the layout.
        """
        key = tuple(group)
        found = self._geometries.get(key)
        if found is not None:
            return found
        if not key:
            raise ValueError("group: empty; give at least one rank")
        if len(set(key)) != len(key):
            raise ValueError(f"group: {key} repeats a rank; give distinct ranks")
        if min(key) < 0 or max(key) >= self.world_size:
            bad = [r for r in key if not 0 <= r < self.world_size]
            raise ValueError(
                f"group: rank {bad[0]} is outside the cluster; valid: 0..{self.world_size - 1}")
        by_domain: dict[int, list[int]] = {}
        if self.spec.scale_up.kind == "pcie" and self.spec.scale_up.domain_gpus <= 1:
            for rank in sorted(key):  # (domain_of: every GPU its own domain)
                by_domain[rank] = [rank]
        else:  # domain_of inlined (a large group's ranks one by one)
            per_domain = self.gpus_per_node * self._nodes_per_domain
            for rank in sorted(key):
                by_domain.setdefault(rank // per_domain, []).append(rank)
        domains = tuple(tuple(by_domain[d]) for d in sorted(by_domain))
        found = GroupGeometry(key, domains, self._ring_switch_hops(domains))
        self._geometries[key] = found
        return found

    def _ring_switch_hops(self, domains: Sequence[Sequence[int]]) -> int:
        """Most scale-out switches :meth:`path` crosses from the first member of each
        domain to the first member of the next (and the last to the first): 0 for one
        domain; else 1, 3 between leaf units (two tiers), 5 between spine groups
        (three tiers). A path leaves and enters on one rail (rail-optimized) or each
        end's own rail (a leaf per unit), so only the units and groups decide.
        ``domains``: the group's members per domain, domains ascending (as
        :meth:`geometry` lists them)."""
        if len(domains) < 2:
            return 0
        fabric = self.spec.fabric
        # a unit differs from the next (cyclically) iff the units are not all equal; a
        # domain's unit (and spine group) never decreases with its first member, and
        # domains ascend, so the first domain's is the least and the last one's the
        # greatest: the two ends decide (no pass over every domain)
        low = domains[0][0] // self.gpus_per_node // fabric.nodes_per_leaf
        high = domains[-1][0] // self.gpus_per_node // fabric.nodes_per_leaf
        hops = 1
        if self._leaf_up >= 0 and low != high:
            hops = 3
            per_group = fabric.leaves_per_spine_group
            if self._spine_up >= 0 and low // per_group != high // per_group:
                hops = 5
        return hops

    def group_class(self, group: Sequence[int]) -> bytes | None:
        """A key equal for two groups that the machine's symmetry maps onto each other
        (None while a link runs at another rate than its kind's, :meth:`scale_nic`).

        Each member, in communicator order, is described by its GPU index in its node
        (its order among the group's GPU indices when every GPU has its own NIC) and
        the order-preserving rank of its node, NVLink domain, leaf unit and spine
        group among the group's own. Two groups with the same key are related by a
        relabelling of nodes that keeps GPU indices, rails, domains, leaves and spine
        groups, and their order: every transfer an algorithm builds on one maps onto
        a transfer of the other, over links of the same kind and capacity (all links
        of a kind are equal while :attr:`uniform_links`), in the same sorted orders.
        So every alpha-beta price of a collective (its phases' steps, most loaded
        link, NCCL ceilings) is the same for both: what lets a data-parallel group of
        every pipeline rank be priced once (DESIGN.md principle 5).
        """
        if not self.uniform_links:
            return None
        key = tuple(group)
        found = self._classes.get(key)
        if found is not None:
            return found
        if len(key) <= _SMALL_GROUP:
            return self._remember_class(key, self._small_group_class(key))
        ranks = np.asarray(key, dtype=np.int64)
        gpn = self.gpus_per_node
        pcie = self.spec.scale_up.kind == "pcie" and self.spec.scale_up.domain_gpus <= 1
        fabric = self.spec.fabric
        # with one NIC per GPU every GPU index is its own rail and its own PXN relay
        # (_gpu_on_rail), so GPU indices too are relabelled in order; else each
        # index keeps its rail
        one_nic_each = self.spec.nic.count_per_node == self.spec.gpus_per_node == gpn
        if bool((ranks[1:] > ranks[:-1]).all()):
            # ascending ranks: nodes, domains, units and spine groups never decrease,
            # so each one's rank among the distinct values (np.unique's inverse) counts
            # the steps up before it -- the four columns in one 2-D pass (a large
            # group's class costs a few numpy calls, not a few per column)
            nodes = ranks // gpn
            climbing = np.empty((4, ranks.size), dtype=np.int64)
            climbing[0] = nodes
            climbing[1] = ranks if pcie else nodes // self._nodes_per_domain
            np.floor_divide(nodes, fabric.nodes_per_leaf, out=climbing[2])
            np.floor_divide(climbing[2], fabric.leaves_per_spine_group, out=climbing[3])
            rank_of = np.zeros((5, ranks.size), dtype=np.int64)
            np.cumsum(climbing[:, 1:] != climbing[:, :-1], axis=1, out=rank_of[1:, 1:])
            local = ranks % gpn
            if one_nic_each:
                # GPU indices (below gpus_per_node) relabelled by their rank among the
                # group's: the running count of the indices present (np.unique's inverse)
                present = np.zeros(gpn, dtype=np.int64)
                present[local] = 1
                rank_of[0] = (np.cumsum(present) - 1)[local]
            else:
                rank_of[0] = local
            return self._remember_class(key, rank_of.tobytes())
        nodes = ranks // gpn
        local = ranks % gpn
        domains = ranks if pcie else nodes // self._nodes_per_domain
        units = nodes // fabric.nodes_per_leaf
        spines = units // fabric.leaves_per_spine_group
        relabelled = (local, nodes, domains, units, spines) if one_nic_each else (
            nodes, domains, units, spines)
        columns = [] if one_nic_each else [local]
        for values in relabelled:
            columns.append(np.unique(values, return_inverse=True)[1].reshape(-1))
        return self._remember_class(key, np.stack(columns).astype(np.int64).tobytes())

    def _remember_class(self, key: tuple[int, ...], found: bytes) -> bytes:
        """Store ``found`` as ``key``'s :meth:`group_class` (the table is bounded: emptied
        when full) and return it."""
        if len(self._classes) >= _MAX_GROUP_CLASSES:
            self._classes.clear()
        self._classes[key] = found
        return found

    def _small_group_class(self, key: tuple[int, ...]) -> bytes:
        """:meth:`group_class` of a small group in plain Python (numpy's per-call cost
        outweighs a few members): the same columns, each value replaced by its rank
        among the group's distinct values (what ``np.unique``'s inverse gives, and
        the running count of steps up for ascending ranks), as the same int64 bytes."""
        gpn = self.gpus_per_node
        one_nic_each = self.spec.nic.count_per_node == self.spec.gpus_per_node == gpn
        if len(key) == 1:  # (one member: every relabelled value is its own first, 0;
            # test_speed_paths.py's small-group-class test holds it to the loop's columns)
            flat = [0] * (5 if one_nic_each else 4)
            return _array("q", flat if one_nic_each else [key[0] % gpn] + flat).tobytes()
        nodes = [rank // gpn for rank in key]
        local = [rank % gpn for rank in key]
        if self.spec.scale_up.kind == "pcie" and self.spec.scale_up.domain_gpus <= 1:
            domains = list(key)
        else:
            domains = [node // self._nodes_per_domain for node in nodes]
        fabric = self.spec.fabric
        units = [node // fabric.nodes_per_leaf for node in nodes]
        spines = [unit // fabric.leaves_per_spine_group for unit in units]
        relabelled = (local, nodes, domains, units, spines) if one_nic_each else (
            nodes, domains, units, spines)
        flat = [] if one_nic_each else list(local)
        ascending = all(map(_lt, key, key[1:]))
        for values in relabelled:
            if ascending and values is not local:
                # (never decreasing: the running count of steps up, as the numpy path)
                flat += _accumulate(map(_ne, values[1:], values), initial=0)
                continue
            order = {value: index for index, value in enumerate(sorted(set(values)))}
            flat += [order[value] for value in values]
        return _array("q", flat).tobytes()

    def paths_links(self, src: np.ndarray, dst: np.ndarray, ordered: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The links of :meth:`path` (default rail) for many transfers at once, in numpy:
        ``(transfer index, link)`` entries ordered by transfer and, within one, in
        the order :meth:`path` lists them (so sums over them add in the same order).
        A transfer from a GPU to itself crosses nothing.

        ``ordered`` False: the same entries in no particular order (for sums of equal
        terms, which no order changes)."""
        parts = self._path_parts(src, dst, True)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        transfers = np.concatenate([t for t, _, _ in parts])
        links = np.concatenate([l for _, _, l in parts])
        if not ordered:
            return transfers, links
        positions = np.concatenate([np.full(t.size, p, dtype=np.int64) for t, p, _ in parts])
        order = np.lexsort((positions, transfers))
        return transfers[order], links[order]

    def link_counts(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """How many of the transfers ``src[i] -> dst[i]`` cross each link (int64, over
        :attr:`num_links`): :meth:`paths_links`' entries counted per link, without
        listing which transfer each belongs to (half the array operations: what a
        collective's per-link loads read, :meth:`hardware.network.NetworkModel.
        _counted_loads`)."""
        parts = self._path_parts(src, dst, False)
        if not parts:
            return np.zeros(self.num_links, dtype=np.int64)
        return np.bincount(np.concatenate([l for _, _, l in parts]), minlength=self.num_links)

    def _path_parts(self, src: np.ndarray, dst: np.ndarray, with_transfers: bool) -> list:
        """:meth:`paths_links`' entries by position along :meth:`path`: ``(transfer
        indices or None, position, links)`` per position some transfer reaches (with
        ``with_transfers`` False, no indices, and possibly empty ones)."""
        spec = self.spec
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        index = np.arange(src.size, dtype=np.int64) if with_transfers else None
        gpn, nics = self.gpus_per_node, spec.nic.count_per_node
        # (node and GPU index in one pass each: the same quotient and remainder)
        src_node, src_local = np.divmod(src, gpn)
        dst_node, dst_local = np.divmod(dst, gpn)
        # (one NIC per GPU: x * nics // gpus_per_node is x, and a rail's PXN relay is
        # the GPU of the same index, -(-rail * gpus_per_node // nics))
        one_nic_each = nics == spec.gpus_per_node
        if one_nic_each:
            src_rail, dst_rail_own = src_local, dst_local
        else:
            src_rail = src_local * nics // spec.gpus_per_node
            dst_rail_own = dst_local * nics // spec.gpus_per_node
        if spec.scale_up.kind == "pcie" and spec.scale_up.domain_gpus <= 1:
            src_domain, dst_domain = src, dst
        elif self._nodes_per_domain == 1:
            src_domain, dst_domain = src_node, dst_node
        else:
            src_domain = src_node // self._nodes_per_domain
            dst_domain = dst_node // self._nodes_per_domain
        moving = src != dst
        across = moving & (src_domain != dst_domain)
        # (every transfer between domains, as a collective's counted transfers are:
        # the positions taken by all of them need no mask, those inside none)
        all_across = _count(across) == across.size
        parts: list[tuple[np.ndarray, int, np.ndarray]] = []  # (transfers, position, links)

        def add(mask: np.ndarray, position: int, links: np.ndarray) -> None:
            if mask is across and all_across:
                parts.append((index, position, links))
            elif index is None:
                parts.append((None, position, links[mask]))
            elif _count(mask):
                parts.append((index[mask], position, links[mask]))

        if not all_across:
            inside = moving & (src_domain == dst_domain)
            add(inside, 0, self._gpu_out + src)
            add(inside, 1, self._gpu_in + dst)
        fabric = spec.fabric
        rail_mode = fabric.topology == "rail-optimized"
        rail = dst_rail_own if rail_mode else src_rail
        dst_rail = rail if rail_mode else dst_rail_own
        # _gpu_on_rail (a rail's index is below gpn with one NIC per GPU)
        relay_local = rail if one_nic_each else -(-rail * spec.gpus_per_node // nics)

        if not spec.nic.gpudirect_rdma:
            add(across, 0, self._host_d2h + src)
        elif gpn > 1:
            relayed = across & (src_rail != rail)
            if not one_nic_each:
                relayed &= relay_local < gpn
                relayed &= src_node * gpn + relay_local != src
            # (one NIC per GPU: the relay, the GPU of index ``rail`` in the source's
            # node, is the source itself exactly where its index is the rail: the
            # comparison above already leaves those out)
            if _count(relayed):
                add(relayed, 1, self._gpu_out + src)
                add(relayed, 2, self._gpu_in + src_node * gpn + relay_local)
        add(across, 3, self._nic_out + src_node * nics + rail)
        if self._leaf_up >= 0:
            units = fabric.nodes_per_leaf
            src_leaf = (src_node // units) * nics + rail if rail_mode else src_node // units
            dst_leaf = (dst_node // units) * nics + dst_rail if rail_mode else dst_node // units
            climbs = across & (src_leaf != dst_leaf)
            if _count(climbs):
                add(climbs, 4, self._leaf_up + src_leaf)
                if self._spine_up >= 0:
                    per_unit = nics if rail_mode else 1
                    src_group = src_leaf // per_unit // fabric.leaves_per_spine_group
                    dst_group = dst_leaf // per_unit // fabric.leaves_per_spine_group
                    crosses = climbs & (src_group != dst_group)
                    if _count(crosses):
                        add(crosses, 5, self._spine_up + src_group)
                        add(crosses, 6, self._spine_down + dst_group)
                add(climbs, 7, self._leaf_down + dst_leaf)
        add(across, 8, self._nic_in + dst_node * nics + dst_rail)
        if not spec.nic.gpudirect_rdma:
            add(across, 9, self._host_h2d + dst)
        elif gpn > 1 and not rail_mode:
            # (rail-optimized: the transfer arrives on the destination's own rail,
            # dst_rail is dst_rail_own, so nothing is relayed after the NIC)
            dst_relay_local = (dst_rail if one_nic_each
                               else -(-dst_rail * spec.gpus_per_node // nics))
            relayed = across & (dst_rail_own != dst_rail)
            if not one_nic_each:
                relayed &= dst_relay_local < gpn
            relay = dst_node * gpn + dst_relay_local
            relayed &= relay != dst
            if _count(relayed):
                add(relayed, 10, self._gpu_out + relay)
                add(relayed, 11, self._gpu_in + dst)
        return parts

    def all_pairs_link_counts(self, group: Sequence[int]) -> np.ndarray:
        """How many transfers of an exchange in which every member of ``group`` sends to
        every other member cross each link (an array over :attr:`num_links`), counted
        without listing the ``n (n - 1)`` pairs: the links of :meth:`path` split into
        those set by the source and the rail it leaves by (its GPU port towards a PXN
        relay, NIC egress, leaf and spine uplinks) and those set by the destination
        (NIC ingress, leaf and spine downlinks), each crossed by as many pairs as
        there are members on the other side that satisfy its condition (another
        domain, another leaf unit, another spine group; inclusion-exclusion over the
        group's own counts per domain, unit, spine group and rail). O(n x rails).
        Equal to counting :meth:`path` over every pair (tests/test_speed_paths.py).
        """
        spec = self.spec
        ranks = np.asarray(tuple(group), dtype=np.int64)
        n = ranks.size
        counts = np.zeros(self.num_links)
        if n < 2:
            return counts
        gpn, nics = self.gpus_per_node, spec.nic.count_per_node
        node = ranks // gpn
        local = ranks % gpn
        rail = local * nics // spec.gpus_per_node
        if spec.scale_up.kind == "pcie" and spec.scale_up.domain_gpus <= 1:
            domain = ranks
        else:
            domain = node // self._nodes_per_domain
        fabric = spec.fabric
        unit = node // fabric.nodes_per_leaf
        spine = unit // fabric.leaves_per_spine_group

        def label(*columns: np.ndarray) -> np.ndarray:
            """Dense ids of the distinct tuples of ``columns`` (one per member)."""
            stacked = np.stack(columns, axis=1)
            return np.unique(stacked, axis=0, return_inverse=True)[1].reshape(-1)

        def per_member(ids: np.ndarray) -> np.ndarray:
            """Members sharing each member's id."""
            return np.bincount(ids)[ids]

        dom_id = label(domain)
        same_domain = per_member(dom_id)
        cross = n - same_domain                  # pairs of a member across domains
        # NVLink: pairs inside a domain, GPU to GPU
        np.add.at(counts, self._gpu_out + ranks, same_domain - 1)
        np.add.at(counts, self._gpu_in + ranks, same_domain - 1)
        cross_unit = cross - per_member(label(unit)) + per_member(label(domain, unit))
        cross_spine = cross - per_member(label(spine)) + per_member(label(domain, spine))
        two_tiers, three_tiers = self._leaf_up >= 0, self._spine_up >= 0
        # destination side: the rail of the destination's GPU (rail-optimized: the
        # rail the source picked; else the destination's own NIC), no relay after it
        np.add.at(counts, self._nic_in + node * nics + rail, cross)
        # (leaf_of: the unit's leaf of the member's rail, or the unit's one leaf)
        dst_leaf = unit * nics + rail if fabric.topology == "rail-optimized" else unit
        if two_tiers:
            np.add.at(counts, self._leaf_down + dst_leaf, cross_unit)
            if three_tiers:
                np.add.at(counts, self._spine_down + spine, cross_spine)
        if not spec.nic.gpudirect_rdma:
            np.add.at(counts, self._host_h2d + ranks, cross)
            np.add.at(counts, self._host_d2h + ranks, cross)
        # source side
        if fabric.topology != "rail-optimized":  # each member leaves by its own NIC
            np.add.at(counts, self._nic_out + node * nics + rail, cross)
            if two_tiers:
                np.add.at(counts, self._leaf_up + dst_leaf, cross_unit)
                if three_tiers:
                    np.add.at(counts, self._spine_up + spine, cross_spine)
            return counts
        # rail-optimized: a member leaves by the destination's rail, over NVLink to
        # the GPU on that rail first (PXN) when it is not its own
        du = label(domain, unit)
        unit_ids = label(unit)
        for r in range(nics):
            on_rail = (rail == r).astype(np.float64)
            total = on_rail.sum()
            if not total:
                continue
            in_domain = np.bincount(dom_id, weights=on_rail, minlength=dom_id.max() + 1)[dom_id]
            to_rail = total - in_domain           # destinations on rail r elsewhere
            in_unit = np.bincount(unit_ids, weights=on_rail)[unit_ids]
            in_both = np.bincount(du, weights=on_rail)[du]
            to_rail_unit = to_rail - in_unit + in_both
            leaving = to_rail > 0
            if spec.nic.gpudirect_rdma and gpn > 1:
                relay = self._gpu_on_rail(0, r)
                moves = leaving & (rail != r)
                if relay is not None and moves.any():
                    np.add.at(counts, self._gpu_out + ranks[moves], to_rail[moves])
                    np.add.at(counts, self._gpu_in + node[moves] * gpn + relay,
                              to_rail[moves])
            np.add.at(counts, self._nic_out + node * nics + r, to_rail)
            if two_tiers:
                np.add.at(counts, self._leaf_up + unit * nics + r, to_rail_unit)
        if three_tiers:
            np.add.at(counts, self._spine_up + spine, cross_spine)
        return counts

    def _gpu_on_rail(self, node: int, rail: int) -> int | None:
        """First used GPU of ``node`` whose NIC is ``rail`` (None if no used GPU is)."""
        nics, gpn = self.spec.nic.count_per_node, self.spec.gpus_per_node
        local = -(-rail * gpn // nics)  # ceil(rail * gpn / nics)
        if local >= self.gpus_per_node:
            return None
        return node * self.gpus_per_node + local
