"""Apply :class:`strategies.perturbations.Perturbations` to one step's simulation.

Turns the user's description (ranks, nodes, seconds, fractions) into what the
engine and the topology take: the ranks that must be simulated on their own,
NIC capacities scaled on the job's layout, throttling episodes in nanoseconds,
and a compute model for every rank on a GPU of another generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hardware.catalog import load_cluster
from hardware.compute import ComputeModel
from hardware.topology import ClusterLayout
from hardware.units import seconds_to_ns
from strategies.perturbations import Perturbations


@dataclass
class EngineInputs:
    """What a perturbed step hands to the lowering and the engine.

    Attributes:
        distinct: ranks that differ from their class (before coupling).
        rank_speed: ``{rank: speed}`` for the whole step.
        rank_episodes: ``{rank: [(start_ns, end_ns, speed), ...]}``.
        rank_compute: ``{rank: ComputeModel}`` of ranks on another GPU.
        smallest_hbm_bytes: the least HBM of any GPU in the job.
    """

    distinct: set[int] = field(default_factory=set)
    rank_speed: dict[int, float] = field(default_factory=dict)
    rank_episodes: dict[int, list[tuple[int, int, float]]] = field(default_factory=dict)
    rank_compute: dict[int, ComputeModel] = field(default_factory=dict)
    smallest_hbm_bytes: float = 0.0


def apply_perturbations(perturbations: Perturbations, layout: ClusterLayout) -> EngineInputs:
    """Scale the NICs of ``layout`` in place and return the engine's inputs.

    Raises:
        ValueError: for an unknown GPU preset of ``node_gpus`` (one line).
    """
    result = EngineInputs(rank_speed=dict(perturbations.slow_ranks),
                          smallest_hbm_bytes=layout.spec.gpu.hbm_bytes)
    result.distinct.update(perturbations.slow_ranks)
    for rank, spans in perturbations.episodes_by_rank().items():
        result.rank_episodes[rank] = [(seconds_to_ns(start), seconds_to_ns(end), speed)
                                      for start, end, speed in spans]
        result.distinct.add(rank)
    for rank, rate in perturbations.nic_rates().items():
        served = layout.scale_nic(rank, rate)
        result.distinct.update(served)
    models: dict[str, ComputeModel] = {}
    for node, preset in sorted(perturbations.node_gpus.items()):
        if preset not in models:
            gpu = load_cluster(preset).gpu
            models[preset] = ComputeModel(gpu)
            result.smallest_hbm_bytes = min(result.smallest_hbm_bytes, gpu.hbm_bytes)
        for local in range(layout.gpus_per_node):
            rank = node * layout.gpus_per_node + local
            result.rank_compute[rank] = models[preset]
            result.distinct.add(rank)
    return result
