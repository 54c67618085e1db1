"""The one owner of time: every duration of a simulation comes from a :class:`CostModel`.

DESIGN.md: *strategies decide what, hardware decides how long, the engine decides
when.* The engine, the closed-form step model and the planner ask this model and
never turn work into time themselves. It prices

* **compute**: a kernel on a rank's GPU (:class:`hardware.compute.ComputeModel`'s
  roofline, or calibration tables handed in as another :class:`ComputeTimer`), at
  the rank's speed (a straggler), through its throttling episodes
  (:func:`stretched_ns`), on the rank's own GPU generation;
* **collectives**: which algorithm and protocol run (every candidate the algorithm
  catalog allows on this group and machine, the fastest wins, as NCCL's tuner does)
  and how long they take;
* **point-to-point** transfers (pipeline edges).

The algorithm catalog (``strategies.collectives.catalog.ALGORITHMS``) is handed in at
construction, so this module imports nothing above ``hardware``; plans are read
through the protocols of :mod:`hardware.network`.

**Fidelity lives here.** ``analytic`` and ``event`` price communication by its α-β
closed form (:meth:`hardware.network.NetworkModel.plan_time_ns`); ``flow`` runs it as
flows sharing every link max-min fairly with whatever else is in flight
(:class:`hardware.network.FlowFabric`). The engine binds a model to its SimPy
environment with :meth:`CostModel.fabric` and runs communication through it, with no
branch on the fidelity of its own.

**The fast path.** Every α-β term is either fixed (base and hop latencies) or
proportional to the size (the most-loaded link's bytes, each transfer's bytes), so
each candidate algorithm × protocol is built once per group, at a reference size,
and any size is priced from its coefficients. What NCCL's kernels can drive is not
affine: a phase streams for ``max(link time, ceiling time)``, where the ceiling of
a protocol or algorithm scales with the channels NCCL runs at that size
(:meth:`NetworkModel.bus_cap_bytes_per_s`, piecewise over sizes). The fast path
keeps both coefficients per phase and asks the network model for the ceiling per
size: equal, to the rounding of a nanosecond, to building the plan at that size
(tests).

Units: integer nanoseconds for every duration handed out.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Iterator, Mapping, NamedTuple, Protocol, Sequence

import simpy

from hardware.compute import (HOST_CALL_S, HOST_CPU_FACTOR, HOST_ISSUE_S, HOST_MODULE_S,
                              ComputeModel, expected_slowest_factor)
from hardware.network import (CommPlanLike, FlowFabric, NetworkModel, PhaseLike,
                              all_pairs_p2p_cap_s)
from hardware.spec import NIC_PATHS, PROTOCOLS, ClusterSpec, GpuSpec, GroupGeometry
from hardware.topology import ClusterLayout
from hardware.units import seconds_to_ns

#: Fidelities of communication: ``analytic`` and ``event`` price it in closed form
#: (one collective has no schedule to replay, so the two names agree here);
#: ``flow`` shares link bandwidth max-min fairly among the transfers in flight.
FIDELITIES = ("analytic", "event", "flow")
#: Size at which candidate plans are built to read their per-byte costs (any size
#: gives the same coefficients up to rounding: every transfer is proportional to it).
_REFERENCE_BYTES = float(1 << 30)


class ComputeTimer(Protocol):
    """Anything that prices a compute op (hardware.compute.ComputeModel, calibration
    tables): ``duration_ns(op)`` of an op with ``name``, ``kind``, ``flops``,
    ``bytes``, ``dtype``."""

    def duration_ns(self, op) -> int: ...


class CollectiveAlgorithms(Protocol):
    """What the cost model asks of the collective algorithm catalog
    (strategies.collectives.catalog.AlgorithmCatalog)."""

    def algorithms(self, kind: str) -> tuple[str, ...]: ...

    def family(self, algorithm: str) -> str: ...

    def chosen_by_auto(self, algorithm: str) -> bool: ...

    def unavailable(self, kind: str, algorithm: str, geometry: GroupGeometry,
                    spec: ClusterSpec, *, explicit: bool) -> str | None: ...

    def protocols(self, algorithm: str, requested: str,
                  size_bytes: float | None = None) -> tuple[str, ...]: ...

    def phases(self, kind: str, algorithm: str, geometry: GroupGeometry,
               size_bytes: float) -> Sequence[PhaseLike]: ...

    def plan(self, kind: str, algorithm: str, protocol: str, geometry: GroupGeometry,
             size_bytes: float, phases: Sequence[PhaseLike] | None = None) -> CommPlanLike: ...

    def empty_plan(self, kind: str) -> CommPlanLike: ...

    def point_to_point(self, geometry: GroupGeometry, size_bytes: float) -> CommPlanLike: ...


class CollectiveCost(NamedTuple):
    """What runs for one collective and how long it takes (closed form).

    Attributes:
        algorithm: the algorithm chosen (or asked for).
        protocol: ``LL``, ``LL128`` or ``Simple``.
        duration_ns: its α-β duration.
    """

    algorithm: str
    protocol: str
    duration_ns: int


@dataclass(frozen=True)
class RankConditions:
    """How one rank's kernels differ from the job's.

    Attributes:
        speed: relative kernel speed for the whole step (0.5 = a straggler at half
            speed: every compute op takes twice as long). In (0, 1] or above.
        episodes: throttling episodes ``(start_ns, end_ns, speed)``, sorted and not
            overlapping: a kernel progresses at ``speed`` while it overlaps one.
        gpu: the rank's GPU when it differs from the job's (mixed generations),
            priced by its own roofline; None: the job's.

    Raises:
        ValueError: for a speed that is not > 0, or a malformed episode.
    """

    speed: float = 1.0
    episodes: tuple[tuple[int, int, float], ...] = ()
    gpu: GpuSpec | None = None

    def __post_init__(self) -> None:
        if not self.speed > 0 or math.isinf(self.speed):
            raise ValueError(f"rank speed: {self.speed!r} is not valid; give a finite speed > 0")
        previous_end = -1
        for start, end, speed in self.episodes:
            if not (start < end and start >= previous_end and 0 < speed < math.inf):
                raise ValueError(f"episode: ({start}, {end}, {speed}) is not valid; give sorted, "
                                 "non-overlapping (start_ns < end_ns, speed > 0) episodes")
            previous_end = end


def stretched_ns(start_ns: int, work_ns: int, episodes: Sequence[tuple[int, int, float]]) -> int:
    """Nanoseconds an op of ``work_ns`` at full speed takes when it starts at
    ``start_ns`` on a rank throttled to ``speed`` during ``[start, end)`` episodes
    (ns, sorted, not overlapping): the time to accumulate ``work_ns`` of progress."""
    now, left = start_ns, float(work_ns)
    for begin, end, speed in episodes:
        if end <= now:
            continue
        if begin > now:  # full speed until the episode
            if left <= begin - now:
                break
            left -= begin - now
            now = begin
        progress = (end - now) * speed
        if left <= progress:
            return math.ceil(now + left / speed - start_ns)
        left -= progress
        now = end
    return math.ceil(now + left - start_ns)


def shared_sm_ns(start_ns: int, work_ns: int, sms: int,
                 busy: Sequence[tuple[int, int, int]]) -> int:
    """Nanoseconds a compute kernel of ``work_ns`` (alone on all ``sms`` SMs) takes when
    it starts at ``start_ns`` while NCCL kernels hold SMs during ``busy`` intervals
    ``(begin_ns, end_ns, ctas)`` (any order, may overlap): while CTAs are held the kernel
    runs on the SMs left, ``(sms - held) / sms`` of its speed (NCCL runs one CTA per
    channel on its own SM for the whole collective: src/enqueue.cc launches
    ``nChannels`` blocks; DeepSeek-V3 report, arXiv 2412.19437 §3.2.2, limits them to 20
    SMs "to conserve the number of SMs dedicated to communication"). At most
    ``sms - 1`` SMs are taken (a kernel always keeps one). Integer arithmetic (work in
    SM-nanoseconds), so the event engine and the closed form agree to the nanosecond."""
    if work_ns <= 0 or not busy or sms <= 0:
        return work_ns
    edges = sorted({e for b, f, _ in busy for e in (b, f) if f > start_ns and e > start_ns})
    left = work_ns * sms
    now = start_ns
    for edge in edges + [None]:
        held = sum(c for b, f, c in busy if b <= now < f)
        free = sms - min(held, sms - 1)
        if edge is None or left <= (edge - now) * free:
            return now + -(-left // free) - start_ns
        left -= (edge - now) * free
        now = edge
    return now - start_ns  # (unreachable: the last segment is open)


def storage_transfer_s(size_bytes: float, *, nodes: int, per_node_bytes_per_s: float,
                       total_bytes_per_s: float) -> float:
    """Seconds to write or read ``size_bytes`` of a checkpoint spread over ``nodes``:
    each node's storage link carries its share, and the storage system's aggregate
    bandwidth caps the whole (``size / min(per_node x nodes, total)``).

    Raises:
        ValueError: for a negative size or a bandwidth that is not > 0.
    """
    if not size_bytes >= 0:
        raise ValueError(f"checkpoint_bytes: {size_bytes!r} must be >= 0")
    rate = min(per_node_bytes_per_s * nodes, total_bytes_per_s)
    if not rate > 0:
        raise ValueError(f"storage bandwidth: {rate!r} bytes/s must be > 0")
    return size_bytes / rate


def host_copy_s(size_bytes: float, *, gpus: int, pcie_bytes_per_s: float,
                efficiency: float) -> float:
    """Seconds for every GPU to copy its even share of ``size_bytes`` to host memory
    over its own PCIe link at ``efficiency`` of the link rate (an asynchronous
    checkpoint's snapshot)."""
    return (size_bytes / gpus) / (pcie_bytes_per_s * efficiency)


class _Coefficients:
    """Fast-path prices of one algorithm × protocol on one group.

    Attributes:
        fixed_ns: base and hop latencies of NCCL's tuning model (what the choice of
            algorithm and protocol compares).
        paced_ns: what the ring step pacing adds to them
            (:meth:`hardware.network.NetworkModel.ring_step_pacing_s`): part of the
            duration, not of the choice.
        per_byte: per phase, seconds per byte of the size: (its links' time, its
            NCCL bus bytes, its size-independent ceilings' time); None until a price
            needs them (:meth:`CostModel._per_byte`: a candidate whose latencies alone
            lose never does).
        plan: the plan at the reference size (what the ceilings are read from).
        phases: the reference phases the plan was built from (shared by the protocols).
        protocol: the protocol the plan runs.
    """

    __slots__ = ("fixed_ns", "per_byte", "plan", "phases", "protocol", "paced_ns")

    def __init__(self, fixed_ns: int, per_byte: tuple | None, plan: CommPlanLike,
                 phases: tuple, protocol: str, paced_ns: int = 0) -> None:
        self.fixed_ns = fixed_ns
        self.paced_ns = paced_ns
        self.per_byte = per_byte
        self.plan = plan
        self.phases = phases
        self.protocol = protocol

    fixed_ns: int
    per_byte: tuple[tuple[float, float, float], ...]
    plan: CommPlanLike


def _p2p_only_cap_s(model: NetworkModel, plan: CommPlanLike, phase: PhaseLike) -> float:
    """Seconds a phase takes at its p2p channel ceilings alone (0: none): the part of
    its ceilings that does not depend on the size (bus ceilings are priced per size)."""
    if getattr(phase.transfers, "all_pairs", False):
        return all_pairs_p2p_cap_s(model, plan, phase.transfers)
    if getattr(phase.transfers, "columns", False):  # one mode (plans.TransferColumns)
        if phase.transfers.mode != "p2p":
            return 0.0
    elif not any(t.mode == "p2p" for t in phase.transfers):
        return 0.0
    cap = model.p2p_cap_bytes_per_s(plan.ranks)
    if math.isinf(cap):
        return 0.0
    domain = model.layout.domain_of
    return max((t.payload_bytes / cap for t in phase.transfers
                if t.mode == "p2p" and domain(t.src) != domain(t.dst)), default=0.0)



def prices_ops_by_shape(compute: object) -> bool:
    """Whether the compute timer ``compute`` prices an op from its kind, work, shape,
    dtype, phase and launches alone, never from its name (the roofline and the
    calibrated roofline): then ops priced once for one layer stand for every layer of
    their kind, in any plan (sim.analytic_prices.SharedPrices). False for any other
    timer, which may price by name."""
    if type(compute) is ComputeModel:
        return True
    # (a calibrated model exists only once its module is imported: a plan search on the
    # roofline never pays for importing it)
    calibration = sys.modules.get("hardware.calibration")
    return calibration is not None and type(compute) is calibration.CalibratedComputeModel


def ll128_enabled(spec: ClusterSpec, geometry: GroupGeometry) -> bool:
    """Whether NCCL lets its tuner pick LL128 by default for this group on this machine.

    NCCL enables LL128 only on the topologies it tested ("other cases ... may cause
    silent data corruption"). NCCL 2.29 src/graph/tuning.cc ``isLL128Enabled`` (the
    same conditions inline in ``ncclTopoTuneModel`` since 2.23), with the default
    ``NCCL_LL128_C2C=1``:

    * across NVLink domains, the graph's GPU-NIC path (``typeInter``,
      ``NicSpec.gpu_path``) at most PXN from compute capability 9.0, at most PXB below
      ("Don't enable LL128 over PxN because PxN can encapsulate PxB or P2C links");
      inside one domain the graph has no NIC path (``typeInter`` stays PIX);
    * the path between the GPUs of a node (``typeIntra``) at most NVB: NVLink, or one
      GPU per node (PATH_LOC); a PCIe-only node with several GPUs of the group fails;
    * not below compute capability 7.0 (Volta); every GPU has the same compute
      capability here (one GPU per preset). 0 (not given) skips this check.

    A protocol asked for explicitly (NCCL_PROTO=LL128 set by the user) is not subject
    to it (:meth:`CostModel.collective`).
    """
    capability = spec.gpu.compute_capability
    if 0 < capability < 70:
        return False
    if spec.scale_up.kind == "pcie" and max(len(d) for d in geometry.domains) > 1:
        return False
    if geometry.num_domains > 1:
        farthest = "PXN" if capability >= 90 else "PXB"
        if NIC_PATHS.index(spec.nic.gpu_path) > NIC_PATHS.index(farthest):
            return False
    return True


def slowest_gpu_factor(spec: ClusterSpec, gpus: int) -> float:
    """How much longer every kernel of a ``gpus``-GPU job on ``spec`` runs than on the
    fleet's mean GPU: the job's expected slowest GPU's
    (:func:`hardware.compute.expected_slowest_factor` of ``spec.gpu.speed_spread``).

    Raises:
        ValueError: for a bad spread or GPU count.
    """
    return expected_slowest_factor(spec.gpu.speed_spread, gpus)


class CostModel:
    """Durations of compute, collectives and point-to-point transfers on one job layout.

    Args:
        layout: ranks placed on the cluster.
        algorithms: the collective algorithm catalog
            (``strategies.collectives.catalog.ALGORITHMS``).
        compute: prices compute ops (default: the roofline of the cluster's GPU).
        fidelity: ``analytic``, ``event`` or ``flow`` (:data:`FIDELITIES`).
        ranks: ``{rank: RankConditions}`` of ranks whose kernels differ.

    Raises:
        ValueError: for an unknown fidelity, listing the valid ones.
    """

    def __init__(self, layout: ClusterLayout, algorithms: CollectiveAlgorithms, *,
                 compute: ComputeTimer | None = None, fidelity: str = "event",
                 ranks: Mapping[int, RankConditions] | None = None) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity: {fidelity!r} is not valid; valid: {', '.join(FIDELITIES)}")
        self.layout = layout
        self.algorithms = algorithms
        self.fidelity = fidelity
        self.network = NetworkModel(layout, layout.spec.comm)
        self.compute = compute if compute is not None else ComputeModel(layout.spec.gpu)
        self.ranks = dict(ranks or {})
        #: the host CPU's time relative to the reference host (GpuSpec.host_cpu)
        self._host_factor = HOST_CPU_FACTOR[layout.spec.gpu.host_cpu]
        #: every kernel at the pace of the job's expected slowest GPU (GpuSpec.speed_spread,
        #: hardware.compute.expected_slowest_factor); 1.0 for a fleet of equal GPUs
        self.slowest_gpu_factor = slowest_gpu_factor(layout.spec, layout.world_size)
        self._episode_cache: dict[int, tuple[tuple[int, int, float], ...]] = {}
        self._compute_cache: dict[tuple, int] = {}
        self._gpu_timers: dict[int, tuple[GpuSpec, ComputeModel]] = {}
        self._choices: dict[tuple, CollectiveCost] = {}
        self._choices_by_id: dict[tuple, tuple[Sequence[int], CollectiveCost]] = {}
        #: choices by (kind, ClusterLayout.group_class, size, algorithm, protocol)
        self._choices_by_class: dict[tuple, CollectiveCost] = {}
        # _candidates' algorithms and a geometry of the class, by (kind, group class,
        # algorithm): a function of the class, at every size that moves something
        self._candidates_by_class: dict[tuple, tuple[list[str], GroupGeometry]] = {}
        self._coefficients: dict[tuple, _Coefficients] = {}
        #: ll128_enabled by (spans several domains, a domain holds several members)
        self._ll128_by_shape: dict[tuple[bool, bool], bool] = {}
        self._geometry_classes: dict[int, tuple[GroupGeometry, bytes | None]] = {}
        self._reference_phases: dict[tuple, tuple[PhaseLike, ...]] = {}
        self._p2p_caps: dict[tuple, tuple[PhaseLike, float]] = {}
        self._plans: dict[tuple, CommPlanLike] = {}
        self._p2p: dict[tuple[int, int, int], int] = {}
        # the same by the pair's symmetry class and size (ClusterLayout.group_class)
        self._p2p_by_class: dict[tuple[bytes, int], int] = {}

    @property
    def contended(self) -> bool:
        """Whether communication durations depend on what else is in flight (``flow``):
        then they are known only when the transfers have run."""
        return self.fidelity == "flow"

    # ---------------------------------------------------------------- compute
    def rank_speed(self, rank: int | None) -> float:
        """Relative kernel speed of ``rank`` for the whole step (1.0 unless slowed)."""
        conditions = self.ranks.get(rank) if rank is not None else None
        return 1.0 if conditions is None else conditions.speed

    def kernel_factor(self, rank: int | None) -> float:
        """What ``rank``'s kernels take relative to the fleet's mean GPU: the job's
        expected slowest GPU's (:attr:`slowest_gpu_factor`), or a slowed rank's ``1 /
        speed`` where it is slower still. A rank named slow is one of the job's GPUs, so
        it sets the pace only where it is slower than the expected slowest of them. With
        GPUs alike (factor 1.0) a rank's kernels take ``1 / speed``, faster ones too."""
        if self.slowest_gpu_factor == 1.0:
            return 1.0 / self.rank_speed(rank)
        return max(self.slowest_gpu_factor, 1.0 / self.rank_speed(rank))

    def compute_ns(self, op, rank: int | None = None, start_ns: int = 0) -> int:
        """Nanoseconds a compute op takes on ``rank`` when it starts at ``start_ns``:
        the rank's GPU's price of the kernel times :meth:`kernel_factor` (the expected
        slowest GPU's pace, or the rank's own ``1 / speed`` where slower), stretched by
        its throttling episodes (each at the pace it sets beyond that factor:
        :meth:`_episodes`).

        Raises:
            ValueError: from the compute model, for an op it cannot price.
        """
        conditions = self.ranks.get(rank) if rank is not None else None
        # everything a ComputeTimer may read (calibration tables key by name and kind)
        comm_sms = getattr(op, "comm_sms", 0)
        key = (op.name, op.kind, op.flops, op.bytes, op.dtype, comm_sms,
               getattr(op, "impl", ""), getattr(op, "phase", ""), getattr(op, "launches", 1),
               getattr(op, "gemm_groups", 1),
               None if conditions is None else rank)
        duration = self._compute_cache.get(key)
        if duration is None:
            timer = self.compute
            if conditions is not None and conditions.gpu is not None:
                timer = self._gpu_timer(conditions.gpu)
            duration = timer.duration_ns(op)
            sms = self.layout.spec.gpu.sm_count
            if comm_sms and sms > comm_sms:
                # the kernel's thread blocks run on the SMs the communication leaves
                duration = math.ceil(duration * sms / (sms - comm_sms))
            if self.slowest_gpu_factor != 1.0:
                duration = math.ceil(duration * self.kernel_factor(rank))
            elif conditions is not None and conditions.speed != 1.0:
                duration = math.ceil(duration / conditions.speed)
            self._compute_cache[key] = duration
        if conditions is not None and conditions.episodes:
            return stretched_ns(start_ns, duration, self._episodes(rank, conditions.episodes))
        return duration

    def _episodes(self, rank: int, episodes: Sequence[tuple[int, int, float]]
                  ) -> Sequence[tuple[int, int, float]]:
        """``rank``'s throttling episodes as speeds relative to the duration
        :meth:`compute_ns` already priced at the expected slowest GPU's factor ``F``: an
        episode at speed ``s`` runs at ``min(1, s F)`` of it, so it costs ``max(F, 1/s)``
        of the mean GPU's time, as a whole-step straggler at ``s`` does
        (:meth:`kernel_factor`); as given when ``F`` is 1."""
        factor = self.slowest_gpu_factor
        if factor == 1.0:
            return episodes
        found = self._episode_cache.get(rank)
        if found is None:
            found = self._episode_cache[rank] = tuple(
                (begin, end, min(1.0, speed * factor)) for begin, end, speed in episodes)
        return found

    def host_ns(self, op) -> int:
        """Nanoseconds of CPU time the rank's launching thread spends issuing ``op``
        (lowering facts, counted for PyTorch eager mode; 0 for an op without any: the
        host not modelled, or replayed from a CUDA graph): its ``host_launches`` at
        :data:`hardware.compute.HOST_ISSUE_S` of the op's ``host_issue`` (``eager``
        unless torch.compile's wrapper issues them: ``compiled``) each, its ``host_calls``
        (CPU-only framework calls) at :data:`~hardware.compute.HOST_CALL_S` and its
        ``host_modules`` (Transformer Engine module calls) at
        :data:`~hardware.compute.HOST_MODULE_S`, all times the host CPU's
        :data:`~hardware.compute.HOST_CPU_FACTOR` (``GpuSpec.host_cpu``). The engine
        and the closed form both start an op no earlier than its issue (the sum of the
        rank's host times up to it, in program order, restarted after a
        ``host_sync`` op ends).

        Raises:
            ValueError: an op's ``host_issue`` is not one of ``HOST_ISSUE_S``'s modes.
        """
        launches = getattr(op, "host_launches", 0)
        calls = getattr(op, "host_calls", 0)
        modules = getattr(op, "host_modules", 0)
        if not (launches or calls or modules):
            return 0
        issue = getattr(op, "host_issue", "eager")
        per_launch_s = HOST_ISSUE_S.get(issue)
        if per_launch_s is None:
            raise ValueError(f"host_issue: {issue!r} of op {op.name!r} is not valid; valid: "
                             f"{', '.join(HOST_ISSUE_S)}")
        seconds = per_launch_s * launches + HOST_CALL_S * calls + HOST_MODULE_S * modules
        return seconds_to_ns(seconds * self._host_factor)

    def _gpu_timer(self, gpu: GpuSpec) -> ComputeModel:
        """The roofline of another GPU generation, one per GPU spec."""
        found = self._gpu_timers.get(id(gpu))
        if found is None:
            found = (gpu, ComputeModel(gpu))
            self._gpu_timers[id(gpu)] = found
        return found[1]

    # ------------------------------------------------------------ collectives
    def collective(self, kind: str, group: Sequence[int], size_bytes: int,
                   algorithm: str = "auto", protocol: str = "auto") -> CollectiveCost:
        """The algorithm and protocol a collective runs with and its α-β duration.

        ``auto`` evaluates every algorithm the catalog allows here (not those it
        keeps from ``auto``) under every protocol the size allows, and takes the
        fastest (NCCL: src/enqueue.cc, topoGetAlgoInfo); ties keep the catalog's
        order. The choice compares NCCL's tuning model; the duration adds what it
        leaves out, the ring step pacing (``comm.ring_step_pacing_s``), which NCCL's
        choice does not see. Nothing to move (one rank, 0 bytes) costs 0.

        Raises:
            ValueError: naming the field for an unknown kind, algorithm or protocol,
                a negative size, or an algorithm this machine or group cannot run.
        """
        # Hashing a 16,384-rank tuple costs more than a lookup should: callers that
        # pass the same group object (every member's op of one collective) hit a table
        # keyed by its identity (the group kept alive with the entry, so its id is its own).
        fast_key = (kind, id(group), size_bytes, algorithm, protocol)
        if type(group) is tuple:  # (a list could change under its identity)
            known = self._choices_by_id.get(fast_key)
            if known is not None and known[0] is group:
                return known[1]
        key = (kind, tuple(group), size_bytes, algorithm, protocol)
        found = self._choices.get(key)
        if found is not None:
            self._remember_choice(fast_key, group, found)
            return found
        # a group the machine's symmetry maps onto one already priced at this size gets
        # its choice: candidates follow from the class's geometry (domains, their sizes)
        # and every price from the class's coefficients (_coefficients_of), so the whole
        # choice is a function of the class (None while links are not uniform)
        group_class = self.layout.group_class(key[1])
        class_key = None if group_class is None else (kind, group_class, size_bytes,
                                                      algorithm, protocol)
        if class_key is not None:
            found = self._choices_by_class.get(class_key)
            if found is not None:
                self._choices[key] = found
                self._remember_choice(fast_key, group, found)
                return found
        # (the algorithms a class can run and its geometry, which every price of the
        # class reads through _coefficients_of's class key, once per class: the
        # arguments are still checked on every call)
        by_class = None
        if class_key is not None and size_bytes > 0:
            by_class = self._candidates_by_class.get((kind, group_class, algorithm))
        if by_class is not None:
            self._check_request(kind, size_bytes, algorithm, protocol)
            candidates, geometry = by_class
        else:
            candidates, geometry = self._candidates(kind, key[1], size_bytes, algorithm,
                                                    protocol)
            if class_key is not None and size_bytes > 0:
                self._candidates_by_class[(kind, group_class, algorithm)] = (candidates,
                                                                             geometry)
        if not candidates:
            empty = self.algorithms.empty_plan(kind)
            found = CollectiveCost(empty.label, empty.protocol, 0)
        else:
            # every candidate's fixed latencies first (its phases' step counts: the
            # transfers of a builder's plans.LazyTransfers are not built for them), then
            # the candidates priced from the lowest latency up: one whose latencies alone
            # pass the best so far cannot win (streaming adds >= 0 ns), nor one that
            # reaches it and comes later in the catalog's order, which breaks ties; so the
            # choice is the catalog-order argmin of the durations, as trying every
            # candidate in order gives, and a loser's transfers and per-byte prices are
            # left to a size that needs them
            order = []
            for name in candidates:
                for proto in self._protocols(name, protocol, size_bytes, geometry):
                    found = self._coefficients_of(kind, geometry, name, proto)
                    order.append((found.fixed_ns, len(order), name, proto, found))
            order.sort(key=lambda entry: entry[:2])
            best: CollectiveCost | None = None
            best_index, best_paced_ns = -1, 0
            for fixed_ns, index, name, proto, found in order:
                if best is not None and (fixed_ns > best.duration_ns or (
                        fixed_ns == best.duration_ns and index > best_index)):
                    continue
                duration = self._priced_ns(found, size_bytes)
                if best is None or (duration, index) < (best.duration_ns, best_index):
                    best, best_index = CollectiveCost(name, proto, duration), index
                    best_paced_ns = found.paced_ns
            if best is None:
                raise ValueError(
                    f"protocol: {protocol!r} is not usable for {kind} of {size_bytes} bytes "
                    f"here; valid: auto, {', '.join(PROTOCOLS)}")
            if best_paced_ns:
                best = CollectiveCost(best.algorithm, best.protocol,
                                      best.duration_ns + best_paced_ns)
            found = best
        self._choices[key] = found
        if class_key is not None:
            self._choices_by_class[class_key] = found
        self._remember_choice(fast_key, group, found)
        return found

    def _remember_choice(self, fast_key: tuple, group: Sequence[int],
                         found: CollectiveCost) -> None:
        """Keep ``found`` under the identity of ``group``, a tuple (bounded)."""
        if type(group) is not tuple:
            return
        if len(self._choices_by_id) >= 65536:
            self._choices_by_id.clear()
        self._choices_by_id[fast_key] = (group, found)

    def collective_plan(self, kind: str, group: Sequence[int], size_bytes: int,
                        algorithm: str = "auto", protocol: str = "auto") -> CommPlanLike:
        """The transfers of the collective :meth:`collective` chooses, at ``size_bytes``
        (what the flow fidelity runs and reports show).

        Raises:
            ValueError: as :meth:`collective`.
        """
        choice = self.collective(kind, group, size_bytes, algorithm, protocol)
        return self.plan_of(kind, group, size_bytes, choice)

    def plan_of(self, kind: str, group: Sequence[int], size_bytes: int,
                choice: CollectiveCost) -> CommPlanLike:
        """The transfers of ``choice`` (an algorithm and protocol) for this group and
        size, built once per (kind, group, size, choice)."""
        key = (kind, tuple(group), size_bytes, choice.algorithm, choice.protocol)
        found = self._plans.get(key)
        if found is None:
            geometry = self.layout.geometry(key[1])
            if geometry.size == 1 or size_bytes == 0:
                found = self.algorithms.empty_plan(kind)
            else:
                found = self.algorithms.plan(kind, choice.algorithm, choice.protocol, geometry,
                                             size_bytes)
            self._plans[key] = found
        return found

    def _priced_ns(self, found: "_Coefficients", size_bytes: int) -> int:
        """α-β duration of one candidate from its coefficients (the fast path,
        :meth:`_coefficients_of`): the fixed latencies, plus each phase's streaming time
        at ``size_bytes``, the longer of its links' time and its NCCL ceilings' time."""
        network = self.network
        bus_cap = network.bus_cap_bytes_per_s(found.plan, size_bytes)
        total = found.fixed_ns
        per_byte = found.per_byte if found.per_byte is not None else self._per_byte(found)
        for phase, (link_s, bus_s, cap_s) in zip(found.plan.phases, per_byte):
            per_byte = max(link_s, cap_s, bus_s / bus_cap if bus_s else 0.0)
            fill = network.pipeline_factor(found.plan, phase, size_bytes)
            total += seconds_to_ns(size_bytes * per_byte * fill)
        return total

    def _coefficients_of(self, kind: str, geometry: GroupGeometry, name: str,
                         protocol: str) -> "_Coefficients":
        """The fixed ns and per-byte coefficients of one algorithm and protocol, once
        per class of groups the machine's symmetry maps onto each other
        (:meth:`hardware.topology.ClusterLayout.group_class`: equal prices by
        construction), else per group."""
        # (the class of a geometry's group, once per geometry object: a collective
        # asks for it per algorithm and protocol, and hashing a large group costs)
        known = self._geometry_classes.get(id(geometry))
        if not self.layout.uniform_links:  # (ClusterLayout.group_class: None)
            known = (geometry, None)
        elif known is None or known[0] is not geometry:
            known = (geometry, self.layout.group_class(geometry.group))
            if len(self._geometry_classes) >= 65536:
                self._geometry_classes.clear()
            self._geometry_classes[id(geometry)] = known
        group_class = known[1]
        key = (kind, geometry.group if group_class is None else group_class, name, protocol)
        found = self._coefficients.get(key)
        if found is None:
            phases = self._reference_phases.get(key[:3])
            if phases is None:  # built once for all protocols
                phases = tuple(self.algorithms.phases(kind, name, geometry, _REFERENCE_BYTES))
                self._reference_phases[key[:3]] = phases
            plan = self.algorithms.plan(kind, name, protocol, geometry, _REFERENCE_BYTES, phases)
            model = self.network
            fixed = seconds_to_ns(model.base_latency_s(plan))
            fixed += sum(seconds_to_ns(model.phase_latency_s(ph, protocol, plan.family,
                                                             paced=False))
                         for ph in phases)
            # (the pacing as the engine rounds the phases: paced minus unpaced, per phase)
            paced = sum(seconds_to_ns(model.phase_latency_s(ph, protocol, plan.family))
                        - seconds_to_ns(model.phase_latency_s(ph, protocol, plan.family,
                                                              paced=False))
                        for ph in phases if model.ring_step_pacing_s(ph, protocol,
                                                                     plan.family) > 0)
            found = _Coefficients(fixed, None, plan, phases, protocol, paced)
            self._coefficients[key] = found
        return found

    def _per_byte(self, found: _Coefficients) -> tuple:
        """The per-byte coefficients of ``found``'s phases (computed once, kept in it)."""
        model, plan, protocol = self.network, found.plan, found.protocol
        per_byte = []
        for ph in found.phases:
            per_byte.append((model.phase_bandwidth_s(ph, protocol) / _REFERENCE_BYTES,
                             getattr(ph, "bus_bytes", 0.0) / _REFERENCE_BYTES,
                             self._p2p_cap_of(plan, ph) / _REFERENCE_BYTES))
        found.per_byte = tuple(per_byte)
        return found.per_byte

    def _p2p_cap_of(self, plan: CommPlanLike, phase: PhaseLike) -> float:
        """:func:`_p2p_only_cap_s` of a reference phase, once for all the protocols that
        share it (keyed by its identity; the phase kept alive with the entry)."""
        key = (id(phase), plan.ranks)
        found = self._p2p_caps.get(key)
        if found is None or found[0] is not phase:
            found = (phase, _p2p_only_cap_s(self.network, plan, phase))
            self._p2p_caps[key] = found
        return found[1]

    def _check_request(self, kind: str, size_bytes: int, algorithm: str,
                       protocol: str) -> tuple[str, ...]:
        """The kind's algorithms, once the algorithm, protocol and size asked for are
        checked (a ValueError naming the field otherwise)."""
        names = self.algorithms.algorithms(kind)
        if algorithm != "auto" and algorithm not in names:
            raise ValueError(f"algorithm: {algorithm!r} is not available for {kind}; valid: "
                             f"auto, {', '.join(names)}")
        if protocol != "auto" and protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol: {protocol!r} is not valid; valid: auto, {', '.join(PROTOCOLS)}")
        if size_bytes < 0:
            raise ValueError(f"size: {size_bytes} is negative; give a size >= 0 bytes")
        return names

    def _candidates(self, kind: str, group: tuple[int, ...], size_bytes: int, algorithm: str,
                    protocol: str) -> tuple[list[str], GroupGeometry]:
        """Algorithms to evaluate (none: nothing to move) and the group's geometry."""
        names = self._check_request(kind, size_bytes, algorithm, protocol)
        geometry = self.layout.geometry(group)
        if geometry.size == 1 or size_bytes == 0:
            return [], geometry
        spec = self.layout.spec
        if algorithm == "auto":
            return [a for a in names if self.algorithms.chosen_by_auto(a)
                    and self.algorithms.unavailable(kind, a, geometry, spec, explicit=False)
                    is None], geometry
        reason = self.algorithms.unavailable(kind, algorithm, geometry, spec, explicit=True)
        if reason is not None:
            raise ValueError(f"algorithm: {algorithm!r} cannot run here: {reason}")
        return [algorithm], geometry

    def _protocols(self, algorithm: str, protocol: str, size_bytes: int,
                   geometry: GroupGeometry) -> list[str]:
        """Protocols to try: the catalog's for the algorithm; under ``auto`` only those
        NCCL_PROTO enables (CommTuningSpec.nccl_proto), LL128 only where NCCL enables
        it by default (:func:`ll128_enabled`), each within its size limit
        (CommTuningSpec.protocol_max_bytes)."""
        offered = self.algorithms.protocols(algorithm, protocol, size_bytes)
        if protocol != "auto":
            return list(offered)
        comm = self.network.comm
        limits = comm.protocol_max_bytes
        found = [p for p in offered if p in comm.nccl_proto
                 and (not limits.get(p) or size_bytes <= limits[p])]
        if "LL128" in found and not self._ll128_enabled(geometry):
            found.remove("LL128")
        return found

    def _ll128_enabled(self, geometry: GroupGeometry) -> bool:
        """:func:`ll128_enabled` of this machine (its answer depends on the group only
        through the domains it spans and their sizes)."""
        # (some domain holds more than one member exactly when the group has more members
        # than domains: the domains split the group, each holding at least one -- the
        # same key as the largest domain's size above 1, without a pass over them)
        domains = geometry.num_domains
        key = (domains > 1, geometry.size > domains)
        found = self._ll128_by_shape.get(key)
        if found is None:
            found = self._ll128_by_shape[key] = ll128_enabled(self.layout.spec, geometry)
        return found

    # ----------------------------------------------------------- point to point
    def p2p_plan(self, src: int, dst: int, size_bytes: int) -> CommPlanLike:
        """The transfer of one send/recv between two ranks (none within a rank)."""
        if src == dst:
            return self.algorithms.empty_plan("sendrecv")
        return self.algorithms.point_to_point(self.layout.geometry((src, dst)), size_bytes)

    def p2p_ns(self, src: int, dst: int, size_bytes: int) -> int:
        """Nanoseconds of one uncontended send/recv (0 within a rank or for 0 bytes)."""
        if src == dst or size_bytes <= 0:
            return 0
        key = (src, dst, size_bytes)
        found = self._p2p.get(key)
        if found is None:
            # a pair the machine's symmetry maps onto one already priced at this size
            # takes its price, as a collective's group does (CostModel.collective): the
            # transfer's path crosses links of the same kinds in the same tiers, with
            # the same steps and ceilings (None while links are not uniform)
            pair_class = self.layout.group_class((src, dst))
            class_key = None if pair_class is None else (pair_class, size_bytes)
            if class_key is not None:
                found = self._p2p_by_class.get(class_key)
            if found is None:
                found = self.network.plan_time_ns(self.p2p_plan(src, dst, size_bytes))
                if class_key is not None:
                    self._p2p_by_class[class_key] = found
            self._p2p[key] = found
        return found

    def collective_ctas(self, kind: str, group: Sequence[int], size_bytes: int,
                        choice: CollectiveCost, max_ctas: int = 0) -> int:
        """CTAs (SMs) NCCL's kernel holds on each member for the whole collective: one
        per channel it runs at this size (src/enqueue.cc: ``nChannels`` blocks, fewer for
        a small message, :meth:`NetworkModel.channels_running`), at most ``max_ctas``
        when positive (NCCL_MAX_CTAS, or a framework pinning its communicator's
        ``maxCTAs``); 0 when nothing moves."""
        if size_bytes <= 0 or len(group) <= 1 or choice.duration_ns <= 0:
            return 0
        ctas = self.network.channels_running(self.plan_of(kind, group, size_bytes, choice),
                                             size_bytes)
        return min(ctas, max_ctas) if max_ctas > 0 else ctas

    def p2p_ctas(self, src: int, dst: int, size_bytes: int, max_ctas: int = 0) -> int:
        """CTAs a send/recv holds on each side: NCCL's p2p channels to one peer
        (src/graph/paths.cc ncclTopoComputeP2pChannels, :meth:`NetworkModel.
        p2p_channels_per_peer`), at most ``max_ctas`` when positive; 0 within a rank."""
        if src == dst or size_bytes <= 0:
            return 0
        ctas = self.network.p2p_channels_per_peer(2)
        return min(ctas, max_ctas) if max_ctas > 0 else ctas

    # -------------------------------------------------------------- fidelity
    def fabric(self, env: simpy.Environment, present_ranks: Sequence[int] = ()) -> "Fabric":
        """Bind the model to a SimPy environment: the fabric the engine runs
        communication on (closed-form durations, or shared flows at ``flow``).

        Args:
            present_ranks: ranks the simulated program lists (the flow fabric leaves
                out mirror traffic that cannot meet theirs).
        """
        if self.contended:
            return SharedFabric(env, self, present_ranks)
        return ClosedFormFabric(env, self)


class Fabric(Protocol):
    """Runs communication inside the engine's SimPy environment."""

    contended: bool

    def run_collective(self, kind: str, group: Sequence[int], size_bytes: int,
                       choice: CollectiveCost, mirrors: Sequence[Sequence[int]]
                       ) -> Iterator[simpy.Event]: ...

    def run_p2p(self, src: int, dst: int, size_bytes: int,
                mirrors: Sequence[tuple[int, int]]) -> Iterator[simpy.Event]: ...

    def stats(self) -> dict[str, int]: ...


class ClosedFormFabric:
    """``analytic`` and ``event``: every transfer takes its α-β time; nothing contends."""

    contended = False

    def __init__(self, env: simpy.Environment, cost: CostModel) -> None:
        self.env = env
        self.cost = cost

    def run_collective(self, kind: str, group: Sequence[int], size_bytes: int,
                       choice: CollectiveCost, mirrors: Sequence[Sequence[int]]
                       ) -> Iterator[simpy.Event]:
        """SimPy process body: wait the collective's duration (mirrors do not contend)."""
        yield self.env.timeout(choice.duration_ns)

    def run_p2p(self, src: int, dst: int, size_bytes: int,
                mirrors: Sequence[tuple[int, int]]) -> Iterator[simpy.Event]:
        """SimPy process body: wait the transfer's duration."""
        yield self.env.timeout(self.cost.p2p_ns(src, dst, size_bytes))

    def stats(self) -> dict[str, int]:
        """Counters of the fabric's work (none here)."""
        return {}


class SharedFabric:
    """``flow``: every phase's transfers become flows sharing links max-min fairly with
    everything in flight, including the mirrors of the ranks a symmetry-reduced
    program leaves out (Program.mirrors)."""

    contended = True

    def __init__(self, env: simpy.Environment, cost: CostModel,
                 present_ranks: Sequence[int] = ()) -> None:
        self.env = env
        self.cost = cost
        self.flows = FlowFabric(env, cost.network)
        self._present_domains = {cost.layout.domain_of(r) for r in present_ranks}
        self._mirror_cache: dict[tuple, tuple] = {}

    def _may_contend(self, group: Sequence[int]) -> bool:
        """A mirror group inside one scale-up domain that holds no simulated rank
        loads only that domain's links, which no simulated flow crosses: skipping
        it changes no rate (a mirror of a cross-domain transfer routed through the
        domain's scale-up links, PXN, would; the tests pin the cases that agree)."""
        domains = {self.cost.layout.domain_of(r) for r in group}
        return len(domains) > 1 or not domains.isdisjoint(self._present_domains)

    def _collective_run(self, kind: str, group: Sequence[int], size_bytes: int,
                        choice: CollectiveCost, mirrors: Sequence[Sequence[int]]) -> tuple:
        """The chosen plan and the same collective's plans of every mirror group that
        may contend (a group's mirrors are a function of the group, Program.mirrors:
        both cached by it; CostModel.plan_of caches the plan by the same key)."""
        key = ("collective", kind, tuple(group), size_bytes, choice)
        found = self._mirror_cache.get(key)
        if found is None:
            found = (self.cost.plan_of(kind, group, size_bytes, choice),
                     tuple(self.cost.plan_of(kind, g, size_bytes, choice) for g in mirrors
                           if self._may_contend(g)))
            self._mirror_cache[key] = found
        return found

    def _p2p_run(self, src: int, dst: int, size_bytes: int,
                 mirrors: Sequence[tuple[int, int]]) -> tuple:
        """The send/recv's plan, its mirrors' plans or their batches built in bulk
        (a function of the pair, Program.mirrors: cached by it)."""
        key = ("p2p", src, dst, size_bytes)
        found = self._mirror_cache.get(key)
        if found is None:
            plan = self.cost.p2p_plan(src, dst, size_bytes)
            batch = self.flows.p2p_mirrored_requests(plan, mirrors) if mirrors else None
            if batch is not None:  # the mirrors' requests in bulk, no plan per pair
                found = (plan, (), (batch,))
            else:
                found = (plan, tuple(self.cost.p2p_plan(a, b, size_bytes) for a, b in mirrors),
                         None)
            self._mirror_cache[key] = found
        return found

    def run_collective(self, kind: str, group: Sequence[int], size_bytes: int,
                       choice: CollectiveCost, mirrors: Sequence[Sequence[int]]
                       ) -> Iterator[simpy.Event]:
        """SimPy process body: the chosen plan's phases as shared flows, with the same
        collective of every mirror group that may contend."""
        yield from self.flows.run(*self._collective_run(kind, group, size_bytes, choice,
                                                        mirrors))

    def run_p2p(self, src: int, dst: int, size_bytes: int,
                mirrors: Sequence[tuple[int, int]]) -> Iterator[simpy.Event]:
        """SimPy process body: one send/recv as a flow, with its mirrors."""
        yield from self.flows.run(*self._p2p_run(src, dst, size_bytes, mirrors))

    def start_collective(self, kind: str, group: Sequence[int], size_bytes: int,
                         choice: CollectiveCost, mirrors: Sequence[Sequence[int]],
                         on_done) -> bool:
        """:meth:`run_collective` driven by callbacks (:meth:`FlowFabric.start`): the same
        events in the same order without a process; ``on_done()`` where it would
        return. False: nothing to run."""
        plan, found = self._collective_run(kind, group, size_bytes, choice, mirrors)
        return self.flows.start(plan, found, None, on_done)

    def start_p2p(self, src: int, dst: int, size_bytes: int,
                  mirrors: Sequence[tuple[int, int]], on_done) -> bool:
        """:meth:`run_p2p` driven by callbacks, as :meth:`start_collective`."""
        plan, plans, batches = self._p2p_run(src, dst, size_bytes, mirrors)
        return self.flows.start(plan, plans, batches, on_done)

    def stats(self) -> dict[str, int]:
        """Max-min rate solves and completed flows."""
        return {"flow_rate_solves": self.flows.network.rate_solves,
                "flows_completed": self.flows.network.flows_completed}
