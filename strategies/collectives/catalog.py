"""The collective algorithms trainsim knows, as the hardware cost model reads them.

:data:`ALGORITHMS` (a :class:`AlgorithmCatalog`) tells the cost model
(:class:`hardware.cost.CostModel`, which takes it at construction so that
``hardware`` imports nothing above it) which algorithms a collective kind has,
which of them a machine and group can run and ``auto`` considers (NCCL's rules:
src/enqueue.cc, topoGetAlgoInfo), their base-latency family, the protocols each
runs with, and the transfer phases each builds. The cost model then prices every
candidate and picks the fastest, as NCCL does.
"""

from __future__ import annotations

from typing import Callable, Sequence

from hardware.spec import PROTOCOLS, ClusterSpec, GroupGeometry
from strategies.collectives import algorithms as alg
from strategies.collectives.plans import CommPlan, Phase
from strategies.ir import COLLECTIVE_KINDS

Builder = Callable[[GroupGeometry, int], list[Phase]]

#: Algorithms each collective can run with, in ``auto``'s tie-break order.
BUILDERS: dict[str, dict[str, Builder]] = {
    "all_reduce": {
        "ring": alg.ring_all_reduce,
        "tree": alg.tree_all_reduce,
        "nvls": alg.nvls_all_reduce,
        "nvls_tree": alg.nvls_tree_all_reduce,
        "hierarchical": alg.hierarchical_all_reduce,
    },
    "all_gather": {"ring": alg.ring_gather_scatter("all_gather")},
    "reduce_scatter": {"ring": alg.ring_gather_scatter("reduce_scatter")},
    "broadcast": {"ring": alg.ring_chain("broadcast")},
    "reduce": {"ring": alg.ring_chain("reduce")},
    "alltoall": {"direct": alg.direct_alltoall},
    "sendrecv": {"direct": alg.direct_sendrecv},
}
#: Base-latency family of each algorithm.
FAMILY = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvls_tree": "nvls",
          "hierarchical": "ring", "direct": "direct"}
#: Algorithms ``auto`` never picks (NCCL has no hierarchical algorithm) but users may ask for.
NOT_AUTO = frozenset({"hierarchical"})
#: Algorithms that run only NCCL's Simple protocol (NVLS).
SIMPLE_ONLY = frozenset({"nvls", "nvls_tree"})
#: Send/recv-based algorithms: NCCL runs a p2p operation with LL up to
#: NCCL_P2P_LL_THRESHOLD bytes and Simple above, never LL128 (src/enqueue.cc,
#: NCCL_P2P_LL_THRESHOLD default 16384).
P2P_BASED = frozenset({"direct"})
P2P_LL_MAX_BYTES = 16384


def valid_algorithms(kind: str) -> list[str]:
    """Algorithms (plus ``auto``) that a collective kind accepts.

    Raises:
        ValueError: for an unknown kind, listing the valid ones.
    """
    if kind not in BUILDERS:
        raise ValueError(f"op: {kind!r} is not a collective; valid: {', '.join(COLLECTIVE_KINDS)}")
    return ["auto", *BUILDERS[kind]]


class AlgorithmCatalog:
    """The algorithms of :data:`BUILDERS`, in the shape :class:`hardware.cost.CostModel`
    asks for (its ``CollectiveAlgorithms`` protocol)."""

    def algorithms(self, kind: str) -> tuple[str, ...]:
        """Algorithm names of ``kind`` in tie-break order.

        Raises:
            ValueError: for an unknown kind.
        """
        return tuple(valid_algorithms(kind)[1:])

    def family(self, algorithm: str) -> str:
        """Base-latency family of an algorithm."""
        return FAMILY[algorithm]

    def chosen_by_auto(self, algorithm: str) -> bool:
        """Whether ``auto`` considers the algorithm."""
        return algorithm not in NOT_AUTO

    def unavailable(self, kind: str, algorithm: str, geometry: GroupGeometry, spec: ClusterSpec,
                    *, explicit: bool) -> str | None:
        """Why an algorithm cannot (or, under ``auto``, would not) run on this group and
        machine; None when it can."""
        if algorithm in ("nvls", "nvls_tree"):
            if not spec.scale_up.nvls:
                return f"cluster {spec.name!r} has no NVLink SHARP (NVLS)"
            if geometry.local_size < 2:
                return "NVLS needs at least 2 ranks in every NVLink domain"
        if algorithm == "nvls" and geometry.num_domains > 1:
            return "NVLS reduces inside one NVLink domain; use nvls_tree across domains"
        if algorithm == "nvls_tree":
            if geometry.num_domains == 1:
                return "nvls_tree joins several NVLink domains; use nvls inside one"
            if not geometry.uniform:
                return "nvls_tree needs the same number of ranks in every NVLink domain"
        if algorithm == "tree" and geometry.num_domains == 1 and not explicit:
            return "inside one NVLink domain NCCL runs rings, not trees"
        if algorithm == "hierarchical" and not geometry.uniform:
            return "hierarchical needs the same number of ranks in every NVLink domain"
        return None

    def protocols(self, algorithm: str, requested: str,
                  size_bytes: float | None = None) -> tuple[str, ...]:
        """Protocols to consider for ``algorithm`` when ``requested`` (``auto`` or one
        protocol) is asked for, for an operation of ``size_bytes`` (None: any size);
        empty when the algorithm cannot run it."""
        if algorithm in SIMPLE_ONLY:
            return ("Simple",) if requested in ("auto", "Simple") else ()
        if algorithm in P2P_BASED and requested == "auto":
            small = size_bytes is not None and size_bytes <= P2P_LL_MAX_BYTES
            return ("LL", "Simple") if small or size_bytes is None else ("Simple",)
        return PROTOCOLS if requested == "auto" else (requested,)

    def phases(self, kind: str, algorithm: str, geometry: GroupGeometry,
               size_bytes: float) -> tuple[Phase, ...]:
        """The transfer phases of one collective of ``size_bytes`` (nccl-tests size)."""
        return tuple(BUILDERS[kind][algorithm](geometry, size_bytes))

    def plan(self, kind: str, algorithm: str, protocol: str, geometry: GroupGeometry,
             size_bytes: float, phases: Sequence[Phase] | None = None) -> CommPlan:
        """A whole plan: the algorithm's phases under ``protocol``."""
        if phases is None:
            phases = self.phases(kind, algorithm, geometry, size_bytes)
        return CommPlan(FAMILY[algorithm], protocol, tuple(phases), algorithm,
                        float(size_bytes), geometry.size, geometry.num_domains,
                        geometry.local_size)

    def empty_plan(self, kind: str) -> CommPlan:
        """The plan of a collective with nothing to move (one rank, or 0 bytes)."""
        name = valid_algorithms(kind)[1]
        return CommPlan(FAMILY[name], "Simple", (), name)

    def point_to_point(self, geometry: GroupGeometry, size_bytes: float) -> CommPlan:
        """A single send/recv from ``geometry.group[0]`` to ``group[1]``."""
        return alg.point_to_point(geometry, size_bytes)


#: The catalog every cost model of a simulation is given.
ALGORITHMS = AlgorithmCatalog()
