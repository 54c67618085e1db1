"""Each preset's one calibrated number, fitted on its calibration rows of the published set.

A preset's ``gpu.sustained_fraction`` (the fraction of the roofline a GPU sustains under
training load: clocks, and what the kernel models leave out) is its only fitted number.
``validate/data/published/roles.toml`` names, per preset, the published rows it is fitted
on; every other row validates. :func:`fit_sustained_fraction` finds the value at which the
median step-time error of those rows is zero (bisection: the step time falls as the
fraction rises), so a preset's number can be refitted whenever the physics changes, and
the tests check that the presets carry it (:func:`calibration_table`).

Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import pandas as pd

from hardware.catalog import load_cluster
from validate.published import (
    PublishedRun,
    evaluate,
    load_models,
    load_roles,
    load_runs,
    preset_of,
)

__all__ = ["SustainedFit", "calibration_rows", "calibration_table", "fit_sustained_fraction"]

#: Bisection bounds and stop width of the fitted fraction.
LOWEST, HIGHEST, RESOLUTION = 0.40, 1.00, 0.0025


@dataclass(frozen=True)
class SustainedFit:
    """A preset's fitted ``gpu.sustained_fraction``.

    Attributes:
        preset: the preset.
        rows: calibration rows compared.
        current: the preset's value now.
        fitted: the value whose median error over the rows is zero (rounded to
            :data:`RESOLUTION`).
        median_error_current, median_error_fitted: median signed step-time error of the
            rows at each value.
    """

    preset: str
    rows: int
    current: float
    fitted: float
    median_error_current: float
    median_error_fitted: float


def calibration_rows(runs: Sequence[PublishedRun] | None = None,
                     roles: Mapping[str, object] | None = None) -> dict[str, list[PublishedRun]]:
    """``{preset: its calibration rows}`` (roles.toml), each row on the preset it names."""
    runs = load_runs() if runs is None else runs
    roles = load_roles() if roles is None else roles
    out: dict[str, list[PublishedRun]] = {}
    for preset, entries in roles.get("calibration_by_preset", {}).items():
        chosen = [r for r in runs if f"{r.source_id}:{r.row_id}" in entries
                  or f"{r.source_id}:*" in entries]
        out[preset] = [r for r in chosen if preset_of(r) == preset]
    return out


def _median_error(runs: Sequence[PublishedRun], preset: str, fraction: float,
                  models: Mapping) -> float:
    frame = evaluate(runs, models=models,
                     preset_overrides={preset: {"gpu.sustained_fraction": fraction}})
    errors = frame.loc[frame["status"] == "ok", "error"]
    if errors.empty:
        raise ValueError(f"calibration rows of {preset}: none could be simulated")
    return float(errors.median())


def fit_sustained_fraction(preset: str, runs: Sequence[PublishedRun],
                           models: Mapping | None = None) -> SustainedFit:
    """Fit ``gpu.sustained_fraction`` of ``preset`` on ``runs`` (module docstring).

    Raises:
        ValueError: no rows, or the zero-error value lies outside [LOWEST, HIGHEST].
    """
    if not runs:
        raise ValueError(f"calibration rows of {preset}: none listed in roles.toml")
    models = load_models() if models is None else models
    current = load_cluster(preset).gpu.sustained_fraction
    low, high = LOWEST, HIGHEST
    error_low = _median_error(runs, preset, low, models)
    error_high = _median_error(runs, preset, high, models)
    if not error_low >= 0 >= error_high:
        raise ValueError(f"sustained_fraction of {preset}: the median error is "
                         f"{error_low:+.1%} at {low} and {error_high:+.1%} at {high}; no value "
                         "in between reproduces its calibration rows")
    while high - low > RESOLUTION:
        middle = (low + high) / 2
        if _median_error(runs, preset, middle, models) > 0:
            low = middle
        else:
            high = middle
    fitted = round(round(((low + high) / 2) / RESOLUTION) * RESOLUTION, 4)
    return SustainedFit(preset=preset, rows=len(runs), current=current, fitted=fitted,
                        median_error_current=_median_error(runs, preset, current, models),
                        median_error_fitted=_median_error(runs, preset, fitted, models))


def calibration_table(*, fit: bool = False) -> pd.DataFrame:
    """Per preset with calibration rows: its value, the median error of its rows at it,
    and with ``fit`` the refitted value and its error (columns of :class:`SustainedFit`;
    ``fitted`` and ``median_error_fitted`` are NaN without ``fit``)."""
    models = load_models()
    rows = []
    for preset, runs in sorted(calibration_rows().items()):
        if fit:
            rows.append(vars(fit_sustained_fraction(preset, runs, models)))
            continue
        current = load_cluster(preset).gpu.sustained_fraction
        rows.append({"preset": preset, "rows": len(runs), "current": current,
                     "fitted": math.nan,
                     "median_error_current": _median_error(runs, preset, current, models),
                     "median_error_fitted": math.nan})
    return pd.DataFrame(rows)
