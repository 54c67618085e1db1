"""The public entry points of the long run: :func:`simulate_long_run` (one checkpoint
interval, or the best one found by a scan) and :func:`goodput_vs_interval` (a scan)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from hardware.spec import ClusterSpec
from sim.longrun.engine import run_engine
from sim.longrun.inputs import (
    MAX_DAYS,
    MAX_SEEDS,
    at_most,
    expected_failures,
    positive,
    positive_int,
    prepare_long_run,
)
from sim.longrun.intervals import SCAN_FACTORS, feasible, round_to_steps, scan
from sim.longrun.result import LongRunResult
from strategies import failures as fl
from strategies.failures import FailureProfile, Responses
from strategies.model_spec import ModelSpec


def _check_seeds(seeds: int, seed: int) -> None:
    """One-line errors for a bad number of runs or base seed."""
    at_most("seeds", positive_int("seeds", seeds), MAX_SEEDS)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: {seed!r} is not valid; give a whole number >= 0")


def simulate_long_run(*, cluster: str | ClusterSpec = "dgx-h100", gpus: int,
                      days: float | None = None, tokens: float | str | None = None,
                      profile: str | Mapping[str, Any] | FailureProfile = "llama3-h100",
                      checkpoint_interval: str | float = "auto",
                      checkpoint_mode: str = "sync",
                      policy: str | None = None, spare_nodes: int | None = None,
                      responses: Responses | Mapping[str, Any] | None = None,
                      seeds: int = 100, seed: int = 0,
                      model: str | ModelSpec | None = None, step: Any = None,
                      step_time_s: float | None = None, tokens_per_step: float | None = None,
                      checkpoint_bytes: int | str | None = None,
                      gpus_per_replica: int | None = None,
                      overrides: Mapping[str, object] | None = None,
                      scan_seeds: int | None = None,
                      scan_factors: Sequence[float] = SCAN_FACTORS,
                      max_days: float = MAX_DAYS) -> LongRunResult:
    """Simulate a training job with failures for ``days`` (or until ``tokens``), ``seeds``
    Monte-Carlo runs.

    Args:
        cluster: preset name, preset file or spec (its fabric sets the switch blast radius).
        gpus: GPUs of the job (whole nodes).
        days: wall-clock horizon. Exactly one of ``days`` and ``tokens``.
        tokens: train until this many tokens (a number or e.g. ``"15.6T"``; needs the step
            time and tokens per step).
        profile: ``llama3-h100``, ``meta-rsc``, a TOML path, a dict or a FailureProfile.
        checkpoint_interval: seconds of compute between saves, a duration string
            (``"30min"``), ``"young-daly"`` (sqrt(2 C M)) or ``"auto"`` (scan
            ``scan_factors`` x Young-Daly on common random numbers, take the interval of the
            best simulated goodput, refined by a parabola). Rounded to whole steps when the
            step time is known.
        checkpoint_mode: ``sync`` or ``async``.
        policy: ``spares`` (hot spares), ``wait`` (for repair) or ``elastic`` (shrink DP);
            default from the responses (``spares``).
        spare_nodes: size of the spare pool with ``spares`` (default unlimited).
        responses: overrides of :class:`strategies.failures.Responses` fields.
        seeds: Monte-Carlo runs. seed: base seed (same seed -> identical results).
        model: model name or spec (checkpoint size = parameters x 14 bytes).
        step: a :class:`sim.step.StepResult` (step time, tokens per step, replica size).
        step_time_s, tokens_per_step: the step, when not from ``step``.
        checkpoint_bytes: checkpoint size (bytes or "5.7TB"), instead of the model's.
        gpus_per_replica: GPUs per data-parallel replica (elastic); default tp*pp*cp of the
            step's plan, else one node.
        overrides: dotted cluster preset keys to change.
        scan_seeds: runs per scanned interval with ``"auto"`` (default min(seeds, 200)).
        scan_factors: multiples of Young-Daly scanned by ``"auto"``.
        max_days: cap of a token run.

    Raises:
        ValueError: one line naming the bad field, its value and what is valid.
    """
    _check_seeds(seeds, seed)
    requested = fl.parse_interval(checkpoint_interval)
    s = prepare_long_run(cluster=cluster, gpus=gpus, days=days, tokens=tokens, profile=profile,
                         checkpoint_mode=checkpoint_mode, responses=responses, policy=policy,
                         spare_nodes=spare_nodes, model=model, step=step,
                         step_time_s=step_time_s, tokens_per_step=tokens_per_step,
                         checkpoint_bytes=checkpoint_bytes, gpus_per_replica=gpus_per_replica,
                         overrides=overrides, max_days=max_days)
    scan_runs = 0 if requested != "auto" else len(scan_factors) * (
        min(seeds, 200) if scan_seeds is None else positive_int("scan_seeds", scan_seeds))
    expected_failures(s, seeds + scan_runs)
    yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
    info: dict[str, object] = {
        "requested": requested, "young_daly_s": yd,
        "daly_s": fl.daly_interval_s(s.costs.blocking_s, s.mtbf_s),
        "simulated_optimum_s": None, "mtbf_s": s.mtbf_s,
        "checkpoint_blocking_s": s.costs.blocking_s,
    }
    found = None
    if requested == "auto":
        if not math.isfinite(yd) or yd <= 0:
            raise ValueError(f"checkpoint_interval: 'auto' needs a finite Young-Daly interval "
                             f"(checkpoint {s.costs.blocking_s:g} s, MTBF {s.mtbf_s:g} s); "
                             "give a duration")
        factors = [positive("scan_factors", float(f)) for f in scan_factors]
        found = scan(s, [yd * f for f in factors],
                     min(seeds, 200) if scan_seeds is None else positive_int("scan_seeds",
                                                                             scan_seeds),
                     seed)
        interval = found.attrs["simulated_optimum_s"]
        info["simulated_optimum_s"] = interval
    elif requested == "young-daly":
        if not math.isfinite(yd) or yd <= 0:
            raise ValueError(f"checkpoint_interval: 'young-daly' is {yd:g} s here (checkpoint "
                             f"{s.costs.blocking_s:g} s, MTBF {s.mtbf_s:g} s); give a duration")
        interval = yd
    else:
        interval = float(requested)
    interval = round_to_steps(feasible(interval, s), s.step_time_s)
    runs = run_engine(s, np.array([interval]), seeds, seed)
    runs = {k: v[0] for k, v in runs.items()}
    band = getattr(step, "band", None)
    return LongRunResult(setup=s, checkpoint_interval_s=interval, interval=info, seeds=seeds,
                         seed=seed, runs=runs, scan=found,
                         step_ratios=None if band is None else band.ratios)


def goodput_vs_interval(*, intervals: Sequence[float | str] | None = None, seeds: int = 100,
                        seed: int = 0, **kwargs: Any) -> pd.DataFrame:
    """Simulated goodput (mean, 95 % CI, 5th-95th percentiles) and the analytic models at
    each checkpoint interval, on common random numbers.

    ``kwargs`` are those of :func:`prepare_long_run` (cluster, gpus, days or tokens,
    profile, ...). ``intervals`` defaults to :data:`SCAN_FACTORS` x Young-Daly. The frame's
    ``attrs`` hold ``young_daly_s``, ``daly_s``, ``simulated_optimum_s``, ``mtbf_s``.
    Columns: interval_s, goodput_mean, goodput_ci_lo/hi, goodput_p05/p95,
    goodput_first_order, goodput_exact (NaN unless the exact model applies),
    interruptions_mean.
    """
    _check_seeds(seeds, seed)
    s = prepare_long_run(**kwargs)
    expected_failures(s, seeds * (len(SCAN_FACTORS) if intervals is None else len(intervals)))
    if intervals is None:
        yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
        intervals = [yd * f for f in SCAN_FACTORS]
    values = []
    for x in intervals:
        v = fl.parse_interval(x)
        if isinstance(v, str):
            raise ValueError(f"intervals: {x!r} is not valid here; give durations > 0")
        values.append(v)
    if not values:
        raise ValueError("intervals: [] is empty; give at least one duration > 0")
    return scan(s, values, seeds, seed)
