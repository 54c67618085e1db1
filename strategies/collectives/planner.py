"""Choose and build the communication plan of a collective.

``auto`` does what NCCL does: evaluate every algorithm the collective and the
machine allow, under every protocol, with the cost model, and take the
fastest (NCCL: src/enqueue.cc, topoGetAlgoInfo). Hierarchical is never picked
by ``auto`` (NCCL has no such algorithm) but can be asked for.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from hardware.network import CommPlan, NetworkModel, Phase
from hardware.spec import PROTOCOLS, CommTuningSpec
from hardware.topology import ClusterLayout
from hardware.units import seconds_to_ns
from strategies.collectives import algorithms as alg
from strategies.ir import COLLECTIVE_KINDS

Builder = Callable[[alg.GroupGeometry, int], list[Phase]]

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
          "hierarchical": "ring",
          "direct": "direct"}
_NOT_AUTO = {"hierarchical"}
#: Size at which plans are built to read their per-byte costs (any size gives the
#: same coefficients up to rounding: every transfer is proportional to the size).
_REFERENCE_BYTES = float(1 << 30)


class PlanCost(NamedTuple):
    """The choice :meth:`CollectivePlanner.plan` makes and its α-β duration."""

    algorithm: str
    protocol: str
    duration_ns: int


def valid_algorithms(kind: str) -> list[str]:
    """Algorithms (plus ``auto``) that a collective kind accepts.

    Raises:
        ValueError: for an unknown kind, listing the valid ones.
    """
    if kind not in BUILDERS:
        raise ValueError(f"op: {kind!r} is not a collective; valid: {', '.join(COLLECTIVE_KINDS)}")
    return ["auto", *BUILDERS[kind]]


class CollectivePlanner:
    """Builds (and remembers) the plan of every collective of one simulation.

    Args:
        layout: ranks placed on the cluster.
        comm: communication tuning (latency/efficiency tables).
    """

    def __init__(self, layout: ClusterLayout, comm: CommTuningSpec) -> None:
        self.layout = layout
        self.model = NetworkModel(layout, comm)
        self._plans: dict[tuple, CommPlan] = {}
        self._costs: dict[tuple, PlanCost] = {}
        self._affine: dict[tuple, tuple[int, tuple[float, ...]]] = {}
        self._reference_phases: dict[tuple, tuple[Phase, ...]] = {}
        self._geometry: dict[tuple[int, ...], alg.GroupGeometry] = {}

    def geometry(self, group: Sequence[int]) -> alg.GroupGeometry:
        """Cached :func:`strategies.collectives.algorithms.group_geometry`."""
        key = tuple(group)
        found = self._geometry.get(key)
        if found is None:
            found = alg.group_geometry(self.layout, key)
            self._geometry[key] = found
        return found

    def _available(self, kind: str, algorithm: str, geometry: alg.GroupGeometry,
                   explicit: bool = False) -> str | None:
        """Why an algorithm cannot (or, under ``auto``, would not) run here; None if it can."""
        spec = self.layout.spec
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

    def plan(self, kind: str, group: Sequence[int], size_bytes: int,
             algorithm: str = "auto", protocol: str = "auto") -> CommPlan:
        """The plan a collective runs with.

        Args:
            kind: collective kind (:data:`strategies.ir.COLLECTIVE_KINDS`).
            group: ranks in communicator order.
            size_bytes: nccl-tests size.
            algorithm: ``auto`` or one of :func:`valid_algorithms`.
            protocol: ``auto`` or one of ``LL``, ``LL128``, ``Simple``.

        Raises:
            ValueError: naming the field for an unknown kind, algorithm or
                protocol, or an algorithm this machine or group cannot run.
        """
        key = (kind, tuple(group), size_bytes, algorithm, protocol)
        found = self._plans.get(key)
        if found is None:
            found = self._build(kind, group, size_bytes, algorithm, protocol)
            self._plans[key] = found
        return found

    def cost(self, kind: str, group: Sequence[int], size_bytes: int,
             algorithm: str = "auto", protocol: str = "auto") -> PlanCost:
        """What :meth:`plan` would choose and how long it takes, without building it.

        Every term of the α-β cost is either fixed (base and hop latencies) or
        proportional to the size (the most-loaded link's bytes), so each
        candidate algorithm x protocol is built once per group, at a reference
        size, and priced for any size from its per-phase coefficients. The
        choice is :meth:`plan`'s; the duration can differ from
        ``model.plan_time_ns(plan(...))`` by the rounding of a nanosecond.
        This is what the event and analytic fidelities charge for a collective.

        Raises:
            ValueError: as :meth:`plan`.
        """
        key = (kind, tuple(group), size_bytes, algorithm, protocol)
        found = self._costs.get(key)
        if found is not None:
            return found
        candidates, geometry = self._candidates(kind, group, size_bytes, algorithm, protocol)
        if not candidates:
            found = PlanCost(valid_algorithms(kind)[1], "Simple", 0)
        else:
            best: PlanCost | None = None
            for name in candidates:
                for proto in self._protocols(name, protocol, size_bytes):
                    fixed_ns, per_byte_s = self._coefficients(kind, geometry, name, proto)
                    duration = fixed_ns + sum(seconds_to_ns(size_bytes * c) for c in per_byte_s)
                    if best is None or duration < best.duration_ns:
                        best = PlanCost(name, proto, duration)
            if best is None:
                raise ValueError(
                    f"protocol: {protocol!r} is not usable for {kind} of {size_bytes} bytes "
                    f"here; valid: auto, {', '.join(PROTOCOLS)}")
            found = best
        self._costs[key] = found
        return found

    def _coefficients(self, kind: str, geometry: alg.GroupGeometry, name: str,
                      protocol: str) -> tuple[int, tuple[float, ...]]:
        """(fixed ns, seconds per byte of each phase) of one algorithm and protocol."""
        key = (kind, geometry.group, name, protocol)
        found = self._affine.get(key)
        if found is None:
            phases = self._reference_phases.get(key[:3])
            if phases is None:  # built once for all protocols
                phases = tuple(BUILDERS[kind][name](geometry, _REFERENCE_BYTES))
                self._reference_phases[key[:3]] = phases
            plan = CommPlan(FAMILY[name], protocol, phases, name)
            fixed = seconds_to_ns(self.model.base_latency_s(plan))
            fixed += sum(seconds_to_ns(self.model.phase_latency_s(ph, protocol))
                         for ph in plan.phases)
            found = (fixed, tuple(self.model.phase_bandwidth_s(ph, protocol) / _REFERENCE_BYTES
                                  for ph in plan.phases))
            self._affine[key] = found
        return found

    def _candidates(self, kind: str, group: Sequence[int], size_bytes: int, algorithm: str,
                    protocol: str) -> tuple[list[str], alg.GroupGeometry]:
        """Algorithms to evaluate (none: nothing to move) and the group's geometry."""
        choices = valid_algorithms(kind)
        if algorithm not in choices:
            raise ValueError(
                f"algorithm: {algorithm!r} is not available for {kind}; valid: {', '.join(choices)}")
        if protocol != "auto" and protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol: {protocol!r} is not valid; valid: auto, {', '.join(PROTOCOLS)}")
        if size_bytes < 0:
            raise ValueError(f"size: {size_bytes} is negative; give a size >= 0 bytes")
        geometry = self.geometry(group)
        if geometry.size == 1 or size_bytes == 0:
            return [], geometry
        if algorithm == "auto":
            return [a for a in BUILDERS[kind]
                    if a not in _NOT_AUTO and self._available(kind, a, geometry) is None], geometry
        reason = self._available(kind, algorithm, geometry, explicit=True)
        if reason is not None:
            raise ValueError(f"algorithm: {algorithm!r} cannot run here: {reason}")
        return [algorithm], geometry

    def _build(self, kind: str, group: Sequence[int], size_bytes: int, algorithm: str,
               protocol: str) -> CommPlan:
        candidates, geometry = self._candidates(kind, group, size_bytes, algorithm, protocol)
        if not candidates:
            name = valid_algorithms(kind)[1]
            return CommPlan(FAMILY[name], "Simple", (), name)
        best: tuple[int, CommPlan] | None = None
        for name in candidates:
            phases = tuple(BUILDERS[kind][name](geometry, size_bytes))
            for proto in self._protocols(name, protocol, size_bytes):
                plan = CommPlan(FAMILY[name], proto, phases, name)
                time_ns = self.model.plan_time_ns(plan)
                if best is None or time_ns < best[0]:
                    best = (time_ns, plan)
        if best is None:
            raise ValueError(
                f"protocol: {protocol!r} is not usable for {kind} of {size_bytes} bytes here; "
                f"valid: auto, {', '.join(PROTOCOLS)}")
        return best[1]

    def _protocols(self, algorithm: str, protocol: str, size_bytes: int) -> list[str]:
        if algorithm in ("nvls", "nvls_tree"):
            return ["Simple"] if protocol in ("auto", "Simple") else []
        if protocol != "auto":
            return [protocol]
        limits = self.model.comm.protocol_max_bytes
        return [p for p in PROTOCOLS if not limits.get(p) or size_bytes <= limits[p]]
