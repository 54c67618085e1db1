"""Statistics of Monte-Carlo runs, and the closed-form goodput they are compared with.

* :func:`summary`: mean, 95 % CI of the mean (normal approximation), sd, 5th/95th
  percentiles of one quantity over runs;
* :func:`goodput`: useful / wall time of every run;
* :func:`analytic_goodput`: the first-order model and, when it applies, the exact
  exponential renewal model (strategies.failures) at one checkpoint interval;
* :func:`json_ready`: numpy scalars to Python, NaN/inf to None, for results.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.longrun.inputs import LongRunSetup
from strategies import failures as fl

#: z of a two-sided 95 % normal interval.
Z95 = 1.959963984540054


def summary(x: np.ndarray, *, lower: float | None = None,
            upper: float | None = None) -> dict[str, object]:
    """Mean, 95 % CI of the mean (normal approximation), sd and the 5th/95th percentiles.

    ``lower``/``upper``: the range the quantity lives in (0 for counts and times, [0, 1]
    for goodput); the normal interval is clipped to it (a count's interval of [-0.08,
    0.88] is [0, 0.88]: no run has fewer than 0 failures).
    """
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, "ci95": [None, None], "sd": None, "p05": None, "p95": None, "n": 0}
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
    half = Z95 * sd / math.sqrt(x.size)
    low, high = mean - half, mean + half
    if lower is not None:
        low = max(low, lower)
    if upper is not None:
        high = min(high, upper)
    return {"mean": mean, "ci95": [low, high], "sd": sd,
            "p05": float(np.percentile(x, 5)), "p95": float(np.percentile(x, 95)),
            "n": int(x.size)}


def json_ready(value: Any) -> Any:
    """JSON-ready copy: numpy scalars to Python, NaN/inf to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def goodput(runs: dict[str, np.ndarray]) -> np.ndarray:
    """Goodput (useful / wall seconds) of every run of :func:`sim.longrun.engine.run_engine`."""
    return runs["useful_s"] / runs["wall_s"]


def analytic_goodput(s: LongRunSetup, interval_s: float) -> tuple[float, float]:
    """(first-order goodput, exact goodput or NaN) at ``interval_s``."""
    kw = dict(interval_s=interval_s, checkpoint_s=s.costs.blocking_s,
              detection_s=s.mean_detection_s, restart_s=s.costs.restart_s, mtbf_s=s.mtbf_s)
    first = fl.first_order_goodput(**kw, upload_s=s.costs.upload_s)
    exact = fl.expected_goodput_exponential(**kw) if s.exact_model_applies else math.nan
    return first, exact
