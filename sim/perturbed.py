"""Apply :class:`strategies.perturbations.Perturbations` to one step's simulation.

Turns the user's description (ranks, nodes, seconds, fractions) into what the
cost model and the topology take: the ranks that must be simulated on their own,
NIC capacities scaled on the job's layout, and each perturbed rank's
:class:`hardware.cost.RankConditions` (speed, throttling episodes in nanoseconds,
the GPU of another generation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hardware.catalog import load_cluster
from hardware.cost import RankConditions
from hardware.spec import GpuSpec
from hardware.topology import ClusterLayout
from hardware.units import seconds_to_ns
from strategies.perturbations import Perturbations


@dataclass
class EngineInputs:
    """What a perturbed step hands to the lowering and the cost model.

    Attributes:
        distinct: ranks that differ from their class (before coupling).
        rank_conditions: ``{rank: RankConditions}`` (speed, throttling episodes in ns,
            the GPU of another generation) for the cost model.
        smallest_hbm_bytes: the least HBM of any GPU in the job.
    """

    distinct: set[int] = field(default_factory=set)
    rank_conditions: dict[int, RankConditions] = field(default_factory=dict)
    smallest_hbm_bytes: float = 0.0


def apply_perturbations(perturbations: Perturbations, layout: ClusterLayout) -> EngineInputs:
    """Scale the NICs of ``layout`` in place and return the cost model's inputs.

    Raises:
        ValueError: for an unknown GPU preset of ``node_gpus`` (one line).
    """
    result = EngineInputs(smallest_hbm_bytes=layout.spec.gpu.hbm_bytes)
    speeds = dict(perturbations.slow_ranks)
    episodes = {rank: tuple((seconds_to_ns(start), seconds_to_ns(end), speed)
                            for start, end, speed in spans)
                for rank, spans in perturbations.episodes_by_rank().items()}
    result.distinct.update(speeds)
    result.distinct.update(episodes)
    for rank, rate in perturbations.nic_rates().items():
        served = layout.scale_nic(rank, rate)
        result.distinct.update(served)
    gpus: dict[int, GpuSpec] = {}
    specs: dict[str, GpuSpec] = {}
    for node, preset in sorted(perturbations.node_gpus.items()):
        if preset not in specs:
            specs[preset] = load_cluster(preset).gpu
            result.smallest_hbm_bytes = min(result.smallest_hbm_bytes, specs[preset].hbm_bytes)
        for local in range(layout.gpus_per_node):
            rank = node * layout.gpus_per_node + local
            gpus[rank] = specs[preset]
            result.distinct.add(rank)
    for rank in sorted(set(speeds) | set(episodes) | set(gpus)):
        result.rank_conditions[rank] = RankConditions(speed=speeds.get(rank, 1.0),
                                                      episodes=episodes.get(rank, ()),
                                                      gpu=gpus.get(rank))
    return result
