"""Long training runs with failures, checkpoints and restarts: Monte-Carlo over seeds.

What it answers: "How often will a 16k-GPU job die, how much does it lose, how often should it
checkpoint, and how many days will T tokens take?" The failure model, the responses and the
closed forms are in :mod:`strategies.failures`; this module runs them.

How a run goes (one Monte-Carlo run = one seed)
-----------------------------------------------
The job alternates between *running* and *down*:

* running: ``W`` seconds of training compute, then a save that blocks for ``C`` seconds
  (``W`` = the checkpoint interval); an asynchronous save is durable ``U`` seconds after its
  blocking part. Elastic jobs run at ``phi`` = alive replicas / replicas.
* a failure of class *c* (the earliest of the classes' next arrivals) kills the job: work
  since the last durable checkpoint is lost; its blast radius sends 0, 1 or
  ``nodes_per_switch`` nodes to repair;
* down: detection (``detection_s`` of the class; failures meanwhile are *absorbed*: counted
  apart, their nodes go to repair, they cause no new interruption),
  then waiting for nodes if the policy needs them (``wait``, an empty spare pool), then the
  restart (``reinit_s`` + reload); a failure during the restart is a new interruption;
* the run ends at the horizon (``days``) or when the useful work reaches the tokens asked for.

Accounting, in job-seconds (wall seconds of the whole job; x GPUs / 3600 = GPU-hours), adds up
to the wall time of every run: useful + lost work + checkpoint + detection + restart + waiting
for repair + degraded (the idle share of an elastic job). Goodput (effective training time
ratio) = useful / wall. Work done since the last checkpoint when the horizon ends counts as
useful.

Failure arrivals are pre-drawn per seed and class in operational time (common random numbers):
the same seed gives the same failures whatever the checkpoint interval, so a scan over
intervals compares them on identical failure histories, and the same seed gives identical
results (numpy ``Generator`` with ``PCG64``, streams spawned from ``SeedSequence(seed)``).

Vectorisation: every iteration of the event loop handles the next event of every unfinished
run with numpy; a scan runs all (interval, seed) pairs in one loop. Between failures a run is
periodic, so the work and checkpoint time of a running phase are closed-form (no event per
checkpoint).

Outputs (:class:`LongRunResult`): interruptions by cause (mean, 95 % CI of the mean by the
normal approximation), goodput with CI and the 5th-95th percentile across runs, GPU-hours lost
by cause and kind, days to train the tokens, the checkpoint interval chosen (Young-Daly and the
simulated optimum), the resolved inputs; pandas views. The figure of goodput against the
checkpoint interval is :func:`trainsim.figures.goodput_vs_interval_figure`.

What it is, module by module (each one job):

* ``inputs`` -- the resolved inputs of a run (:class:`LongRunSetup`,
  :func:`prepare_long_run`, :func:`parse_tokens`);
* ``arrivals`` -- failure arrivals and repair times on common random numbers;
* ``engine`` -- the vectorised engine (:class:`~sim.longrun.engine.LongRunEngine`);
* ``statistics`` -- summaries over runs and the closed-form goodput;
* ``intervals`` -- checkpoint intervals: whole steps, feasible, scanned;
* ``result`` -- :class:`LongRunResult` and its pandas views;
* ``simulate`` -- the entry points :func:`simulate_long_run` and
  :func:`goodput_vs_interval`.

What it exports: the names in ``__all__`` (loaded with the package).

What it must not import: ``validate``, ``trainsim`` and torch; of this repository only
``hardware``, ``strategies`` and the rest of ``sim``.
"""

from __future__ import annotations

from sim.longrun.inputs import MAX_DAYS, SECONDS_PER_DAY, LongRunSetup, parse_tokens, \
    prepare_long_run
from sim.longrun.intervals import SCAN_FACTORS
from sim.longrun.result import LongRunResult
from sim.longrun.simulate import goodput_vs_interval, simulate_long_run

__all__ = [
    "LongRunResult",
    "LongRunSetup",
    "MAX_DAYS",
    "SCAN_FACTORS",
    "SECONDS_PER_DAY",
    "goodput_vs_interval",
    "parse_tokens",
    "prepare_long_run",
    "simulate_long_run",
]
