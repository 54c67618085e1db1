"""When failures arrive and how long repairs take: random numbers per seed, drawn so that
the same seed sees the same failures whatever else changes (common random numbers).

Each failure class has one stream of arrival gaps in *operational time* (exponential, or
Weibull with mean 1 when the class says so): a run divides a gap by the class's rate to
get wall seconds, so a run that shrinks (elastic) or sits idle still meets the same
failures. One more stream gives repair-time multipliers. Streams come from
``SeedSequence(seed).spawn(classes + 1)`` with numpy's ``PCG64``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from strategies import failures as fl

#: ``draw(generator, shape) -> array`` of positive numbers.
Draw = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


class CommonRandomStream:
    """Random numbers drawn per seed in fixed-size chunks, so that a (seed, index) pair
    always gets the same number however far other runs have read (common random numbers).

    Args:
        seed_seq: the stream's seed sequence.
        n_seeds: runs (rows).
        chunk: numbers drawn per seed at a time (at least 16).
        draw: the distribution.
    """

    def __init__(self, seed_seq: np.random.SeedSequence, n_seeds: int, chunk: int, draw: Draw):
        self._gen = np.random.Generator(np.random.PCG64(seed_seq))
        self._n, self._chunk, self._draw = n_seeds, max(16, int(chunk)), draw
        self.data = self._draw(self._gen, (n_seeds, self._chunk))

    def take(self, seeds: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The ``index``-th number of each seed in ``seeds`` (drawing more as needed)."""
        if index.size:
            need = int(index.max()) + 1
            while need > self.data.shape[1]:
                more = self._draw(self._gen, (self._n, self._chunk))
                self.data = np.concatenate([self.data, more], axis=1)
        return self.data[seeds, index]


def draw_exponential(gen: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """Exponential numbers of mean 1 (never 0)."""
    return np.maximum(gen.exponential(1.0, size), 1e-300)


def weibull_draw(shape: float) -> Draw:
    """Weibull numbers of the given shape, scaled to mean 1 (never 0)."""
    scale = 1.0 / math.gamma(1.0 + 1.0 / shape)

    def draw(gen: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
        return np.maximum(gen.weibull(shape, size) * scale, 1e-300)
    return draw


def draw_ones(gen: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """All ones (a constant repair time)."""
    return np.ones(size)


class FailureArrivals:
    """The random streams of one batch of runs: one per failure class, one for repairs.

    Args:
        classes: the failure classes.
        expected: expected failures of each class over a run (sizes the first chunk).
        n_seeds: runs per interval (seeds).
        seed: the base seed.
        repair_distribution: ``exponential`` (multipliers of mean 1) or ``constant``.
    """

    def __init__(self, classes: Sequence[fl.FailureClass], expected: np.ndarray, n_seeds: int,
                 seed: int, repair_distribution: str) -> None:
        children = np.random.SeedSequence(seed).spawn(len(classes) + 1)
        self.classes = [
            CommonRandomStream(child, n_seeds, min(ex * 1.2 + 5 * math.sqrt(ex) + 16, 1e5),
                               weibull_draw(cls.weibull_shape)
                               if cls.distribution == "weibull" and cls.weibull_shape != 1.0
                               else draw_exponential)
            for cls, ex, child in zip(classes, expected, children)]
        self.repairs = CommonRandomStream(children[len(classes)], n_seeds, 64,
                                          draw_exponential
                                          if repair_distribution == "exponential"
                                          else draw_ones)
