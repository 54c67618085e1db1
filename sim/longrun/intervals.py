"""Checkpoint intervals: whole steps, feasible, and goodput scanned over a grid of them.

:func:`scan` runs every interval of a grid on the same failure histories (common random
numbers) in one engine, and finds the best interval by a parabola in log(interval)
(:func:`refined_optimum`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from sim.longrun.engine import run_engine
from sim.longrun.inputs import LongRunSetup
from sim.longrun.statistics import analytic_goodput, goodput, summary
from strategies import failures as fl

#: Multiples of the Young-Daly interval that ``checkpoint_interval="auto"`` scans.
SCAN_FACTORS = tuple(float(x) for x in 2.0 ** np.linspace(-2.0, 2.0, 17))


def round_to_steps(interval_s: float, step_time_s: float | None) -> float:
    """``interval_s`` as a whole number (>= 1) of steps, when the step time is known."""
    if step_time_s is None:
        return interval_s
    return max(1.0, round(interval_s / step_time_s)) * step_time_s


def feasible(interval_s: float, s: LongRunSetup) -> float:
    """An asynchronous save cannot start before the previous upload ends."""
    return max(interval_s, s.costs.upload_s, 1e-9)


def scan(s: LongRunSetup, intervals: Sequence[float], seeds: int, seed: int) -> pd.DataFrame:
    """Goodput at each interval (rounded to whole steps, feasible), ``seeds`` runs each on
    common random numbers; the frame of :func:`sim.longrun.goodput_vs_interval`."""
    grid = sorted({round_to_steps(feasible(float(x), s), s.step_time_s) for x in intervals})
    runs = run_engine(s, np.array(grid), seeds, seed)
    good = goodput(runs)
    rows = []
    for i, interval in enumerate(grid):
        st = summary(good[i], lower=0.0, upper=1.0)
        first, exact = analytic_goodput(s, interval)
        rows.append({"interval_s": interval, "goodput_mean": st["mean"],
                     "goodput_ci_lo": st["ci95"][0], "goodput_ci_hi": st["ci95"][1],
                     "goodput_p05": st["p05"], "goodput_p95": st["p95"],
                     "goodput_first_order": first, "goodput_exact": exact,
                     "interruptions_mean": float(runs["interruptions"][i].sum(axis=1).mean())})
    df = pd.DataFrame(rows)
    yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
    df.attrs.update({
        "young_daly_s": yd, "daly_s": fl.daly_interval_s(s.costs.blocking_s, s.mtbf_s),
        "simulated_optimum_s": refined_optimum(df), "mtbf_s": s.mtbf_s,
        "checkpoint_blocking_s": s.costs.blocking_s, "restart_s": s.costs.restart_s,
        "detection_s": s.mean_detection_s, "seeds": seeds, "seed": seed,
        "exact_model": s.exact_model_applies,
    })
    return df


def refined_optimum(df: pd.DataFrame) -> float:
    """The interval of the largest simulated goodput, refined by a parabola through it and
    its two neighbours in log(interval) (the grid point itself at an edge of the grid)."""
    x = np.log(df["interval_s"].to_numpy(float))
    y = df["goodput_mean"].to_numpy(float)
    i = int(np.argmax(y))
    if i == 0 or i == len(y) - 1:
        return float(np.exp(x[i]))
    a, b, _ = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
    if a >= 0:
        return float(np.exp(x[i]))
    return float(np.exp(np.clip(-b / (2 * a), x[i - 1], x[i + 1])))
