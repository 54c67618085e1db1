"""What makes some ranks of a job differ from the others: stragglers and heterogeneity.

Synchronous training waits for its slowest rank, so one slow GPU or link slows
the whole job. A :class:`Perturbations` lists what differs:

* ``slow_ranks``: a GPU running at a fraction of its speed for the whole step
  (a lower clock, a power cap);
* ``thermal``: throttling episodes, a speed over an interval of the step;
* ``degraded_nics``: the NIC serving a rank at a fraction of its rate (a link
  trained down to a lower speed, a bad cable);
* ``flapping_links``: a NIC link that goes down for ``down_s`` every
  ``up_s + down_s``. Over a step it delivers ``up_s / (up_s + down_s)`` of its
  rate; the model charges that average (what a step spanning many flaps sees; a
  single long outage is a failure, :mod:`strategies.failures`);
* ``node_gpus``: nodes with another generation of GPU (the GPU of another
  preset, e.g. A100 nodes in an H100 job), priced by that GPU's own roofline.

Each perturbed rank breaks the rank symmetry: the step lowering simulates it,
with the ranks coupled to it, next to the representatives
(:meth:`strategies.lowering.StepLowerer.distinct_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class ThermalEpisode:
    """A GPU throttled to ``speed`` from ``start_s`` for ``duration_s`` of the step.

    Attributes:
        rank: the throttled rank.
        start_s: seconds after the step's start.
        duration_s: length of the episode in seconds (> 0).
        speed: kernel speed during it (0 < speed <= 1; 0.5 = half speed).
    """

    rank: int
    start_s: float
    duration_s: float
    speed: float


@dataclass(frozen=True)
class FlappingLink:
    """The NIC serving ``rank`` is up for ``up_s`` and down for ``down_s``, repeatedly."""

    rank: int
    up_s: float
    down_s: float

    @property
    def available_fraction(self) -> float:
        """Share of time the link carries traffic."""
        return self.up_s / (self.up_s + self.down_s)


@dataclass(frozen=True)
class Perturbations:
    """Everything that makes ranks differ (module docstring).

    Attributes:
        slow_ranks: ``{rank: speed}`` for the whole step (0.5 = half speed).
        thermal: throttling episodes.
        degraded_nics: ``{rank: fraction of the NIC's rate}`` of the NIC serving the rank.
        flapping_links: links that go up and down.
        node_gpus: ``{node: preset}``: nodes whose GPUs are those of another preset.
    """

    slow_ranks: Mapping[int, float] = field(default_factory=dict)
    thermal: tuple[ThermalEpisode, ...] = ()
    degraded_nics: Mapping[int, float] = field(default_factory=dict)
    flapping_links: tuple[FlappingLink, ...] = ()
    node_gpus: Mapping[int, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.slow_ranks or self.thermal or self.degraded_nics
                    or self.flapping_links or self.node_gpus)

    def only_slow_ranks(self) -> bool:
        """Nothing but whole-step slow ranks (what the analytic fidelity models)."""
        return not (self.thermal or self.degraded_nics or self.flapping_links
                    or self.node_gpus)

    def nic_rates(self) -> dict[int, float]:
        """``{rank: fraction of its NIC's rate}`` from degraded and flapping links."""
        rates = dict(self.degraded_nics)
        for link in self.flapping_links:
            rates[link.rank] = rates.get(link.rank, 1.0) * link.available_fraction
        return rates

    def episodes_by_rank(self) -> dict[int, list[tuple[float, float, float]]]:
        """``{rank: [(start_s, end_s, speed), ...]}`` sorted by start."""
        result: dict[int, list[tuple[float, float, float]]] = {}
        for episode in self.thermal:
            result.setdefault(episode.rank, []).append(
                (episode.start_s, episode.start_s + episode.duration_s, episode.speed))
        return {rank: sorted(spans) for rank, spans in result.items()}

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable form, for a result's inputs."""
        return {
            "slow_ranks": {str(r): s for r, s in sorted(self.slow_ranks.items())},
            "thermal": [e.__dict__ for e in self.thermal],
            "degraded_nics": {str(r): f for r, f in sorted(self.degraded_nics.items())},
            "flapping_links": [f.__dict__ for f in self.flapping_links],
            "node_gpus": {str(n): p for n, p in sorted(self.node_gpus.items())},
        }


def check_perturbations(perturbations: Perturbations, *, world_size: int, nodes: int) -> None:
    """Reject out-of-range ranks, nodes, speeds, rates and times.

    Raises:
        ValueError: one line naming the field, the value and what is valid.
    """
    def check_rank(field_name: str, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"{field_name}: rank {rank!r} is outside the job; "
                             f"valid: 0..{world_size - 1}")

    def check_fraction(field_name: str, rank: int, value: float, what: str) -> None:
        if not 0 < value <= 1:
            raise ValueError(f"{field_name}: rank {rank} {what} {value!r} is not valid; "
                             "give 0 < value <= 1")

    for rank, speed in perturbations.slow_ranks.items():
        check_rank("straggler", rank)
        if not speed > 0:
            raise ValueError(f"straggler: rank {rank} speed {speed!r} is not valid; "
                             "give a speed > 0 (0.5 = half speed)")
    for episode in perturbations.thermal:
        check_rank("thermal", episode.rank)
        check_fraction("thermal", episode.rank, episode.speed, "speed")
        if episode.start_s < 0 or not episode.duration_s > 0:
            raise ValueError(f"thermal: rank {episode.rank} episode at {episode.start_s!r} s "
                             f"for {episode.duration_s!r} s is not valid; give start >= 0 "
                             "and duration > 0 seconds")
    for rank, rate in perturbations.degraded_nics.items():
        check_rank("degraded_nic", rank)
        check_fraction("degraded_nic", rank, rate, "rate")
    for link in perturbations.flapping_links:
        check_rank("flapping_link", link.rank)
        if not (link.up_s > 0 and link.down_s >= 0):
            raise ValueError(f"flapping_link: rank {link.rank} up {link.up_s!r} s, down "
                             f"{link.down_s!r} s is not valid; give up > 0 and down >= 0")
    for node in perturbations.node_gpus:
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < nodes:
            raise ValueError(f"node_gpu: node {node!r} is outside the job; "
                             f"valid: 0..{nodes - 1}")
