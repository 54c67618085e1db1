"""Fit the prediction band's terms on the published set, and check that it is calibrated.

The band (:mod:`sim.step_bands`) has three terms; two are fitted here:

* **model error** on the *validation* rows (never the calibration rows), a two-level
  (hierarchical) linear model of the log residual ``r = ln(published / simulated)`` of
  row ``i`` of source ``j`` (a source is one software stack: framework, version,
  recipe)::

      r_ij = known_ij + x_ij' b + u_j + e_ij,    x_ij = (f_1 .. f_K, 1)
      b ~ N(0, PRIOR_BIAS^2 I),   u_j ~ N(0, tau^2),
      e_ij ~ N(0, known_var_ij + s_0^2 + sum_k f_k^2 s_k^2)

  ``f_k`` the row's component shares (``share_*`` columns of
  :func:`validate.published.evaluate`), ``known`` the mean and variance the other two
  terms already explain, ``u_j`` the stack's own offset (``tau`` = ``sigma_source``).
  The spreads ``s_k``, ``s_0`` and ``tau`` maximize the marginal likelihood with ``b`` and
  every ``u_j`` integrated out, times weak log-normal priors (``ln s ~ N(ln PRIOR_SIGMA,
  1)``, ``ln tau ~ N(ln PRIOR_SOURCE_SIGMA, 1)``): empirical Bayes, the Bayesian form of
  REML (Patterson & Thompson, Biometrika 58, 1971; Harville, JASA 72, 1977). Because the
  rows of one source share one offset in that likelihood, a source counts as one draw of
  ``u`` however many rows it has, and the component biases cannot absorb the differences
  between stacks for free (the earlier fit treated every row as independent and took the
  offsets' spread as a median over sources, which left ``tau`` ~0.01 while the sources'
  mean errors differ by ~0.1). ``b`` is then its posterior (mean and covariance ``C``)
  given the spreads, and a new source's row has the posterior predictive ``N(x' b, x' C
  x + tau^2 + s_0^2 + sum_k f_k^2 s_k^2)`` (Gelman et al., 'Bayesian Data Analysis', 3rd
  ed., ch. 15): a component mix few sources exercise gets its biases' uncertainty.
  Adam on the exact gradient (:func:`_marginal_terms`), from the priors' centres
  (deterministic).
* **calibration of that spread on unseen sources**: a factor ``c`` (``scale``) on the
  predictive spread, conformal over held-out sources: leave each training source out in
  turn, fit on the rest, and score each held-out row by the factor its spread needs for
  the 80 % band to reach it, ``c_i^2 = max(0, e_i^2 / z_0.9^2 - known_i) / m_i`` (``e_i``
  its error, ``m_i`` the predictive variance, ``known_i`` the other terms'; normalized
  scores as in Lei, G'Sell, Rinaldo, Tibshirani, Wasserman, 'Distribution-free
  predictive inference for regression', JASA 2018, sec. 5.2). Rows of one source are not
  exchangeable with another's, so ``c`` is the 80 % quantile of the scores' pooled CDF
  with each held-out source weighted equally (Dunn, Wasserman, Ramdas,
  'Distribution-free prediction sets for two-layer hierarchical models', JASA 2022,
  "CDF pooling"): a 213-row source no longer sets a new stack's width by itself. An
  empirical quantile of held-out scores, not a normal tail, sets the width.
* **parameter uncertainty**: per GPU, the standard error of its calibrated
  ``sustained_fraction`` from the spread of its calibration rows' residuals (the
  standard error of a median, ``1.2533 sd / sqrt(n)``), in log units of compute time
  (divided by the rows' mean compute share).

The third, GPU-to-GPU speed spread, is each row's cluster's ``gpu.speed_spread`` (a
published figure, hardware/catalog/_defaults.toml), the one the step was priced with.

``python -m validate.fit_bands`` simulates the published rows once (about a minute),
writes them to :data:`ROWS_FILE` (so the coverage test reuses them in milliseconds) and
the fitted terms with their provenance to :data:`sim.step_bands.BAND_FILE`;
:func:`leave_one_source_out` is the coverage check the tests run (nested: each held-out
source's band is calibrated by leave-one-source-out within the other sources only, so
the check never sees the rows it scores).

Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from sim.atomic_io import write_text_atomic
from sim.step_bands import BAND_FILE, COMPONENTS, COVARIANCE_ORDER, BandModel, step_band
from validate.published import DATA_DIR, evaluate, load_runs
from validate.published_report import readme_text, replace_readme_block

#: The simulated published rows the band is fitted on (written by :func:`main`).
ROWS_FILE = DATA_DIR / "band_rows.csv"
#: Weak priors of the model-error fit (log units): the biases' prior spread, and the
#: centres of the log-normal priors (one e-fold wide) of the row spreads and of the
#: spread between sources.
PRIOR_BIAS, PRIOR_SIGMA, PRIOR_SOURCE_SIGMA = 0.2, 0.1, 0.05
#: Adam's steps and step size on the log spreads (converged to 1e-3 relative by 300).
ITERATIONS, LEARNING_RATE = 300, 0.05
#: A fixed per-step overhead's share is this over the step time (sim.step_bands).
OVERHEAD_REFERENCE_S = 1.0
#: Quantile of a standard normal at 0.9, and the efficiency factor of a median.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
SHARE_COLUMNS = [f"share_{k}" for k in COMPONENTS]
#: The band's nominal coverage (p10..p90), and the standard normal's quantile at its top.
NOMINAL_COVERAGE = 0.8
Z_90 = NormalDist().inv_cdf(0.9)


def calibration_spread(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per GPU name of the calibration rows of ``frame`` (evaluate's columns): rows and
    ``sustained_fraction_se`` (log units of compute time).

    Raises:
        ValueError: when ``frame`` has no compared calibration row.
    """
    rows = frame[(frame["role"] == "calibration") & (frame["status"] == "ok")]
    if rows.empty:
        raise ValueError("calibration rows: none compared; nothing to measure the spread on")
    out = {}
    for gpu_name, group in rows.groupby("gpu_name"):
        residuals = -np.log1p(group["error"].to_numpy(float))
        share = float(group[[c for c in SHARE_COLUMNS if c.startswith("share_compute")]]
                      .sum(axis=1).mean())
        spread = float(residuals.std(ddof=1)) if len(residuals) > 1 else float(abs(residuals[0]))
        out[gpu_name] = {"rows": int(len(group)),
                         "sustained_fraction_se": MEDIAN_SE_FACTOR * spread
                         / math.sqrt(len(group)) / max(share, 0.1)}
    return out


def validation_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The compared validation rows of ``frame``, with ``residual`` = ln(published /
    simulated)."""
    rows = frame[(frame["role"] == "validation") & (frame["status"] == "ok")].copy()
    rows["residual"] = -np.log1p(rows["error"].to_numpy(float))
    return rows.reset_index(drop=True)


def known_terms(rows: pd.DataFrame, gpus_terms: Mapping[str, Mapping[str, float]]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the mean and variance (log units) of the parameter and run-to-run terms:
    what the model-error term need not explain."""
    p = len(COVARIANCE_ORDER)
    model = _band_model((np.zeros(p), np.zeros((p, p)), np.zeros(p), 0.0), gpus_terms)
    offset, variance = [], []
    for _, row in rows.iterrows():
        band = step_band(1.0, _shares(row), gpus=int(row["gpus"]), gpu_name=row["gpu_name"],
                         speed_spread=float(row["speed_spread"]), model=model, samples=400)
        logs = np.log(band.ratios)
        offset.append(float(logs.mean()))
        variance.append(float(logs.var()))
    return np.array(offset), np.array(variance)


def _shares(row: Mapping) -> dict[str, float]:
    return {k: float(row[f"share_{k}"]) for k in COMPONENTS}


def _source_matrix(sources: np.ndarray) -> np.ndarray:
    """One-hot rows x sources (sorted source names)."""
    _, index = np.unique(sources, return_inverse=True)
    matrix = np.zeros((len(sources), index.max() + 1 if len(sources) else 0))
    matrix[np.arange(len(sources)), index] = 1.0
    return matrix


def _marginal_terms(theta: np.ndarray, design: np.ndarray, residual: np.ndarray,
                    known: np.ndarray, sources: np.ndarray, weights: np.ndarray,
                    gradient: bool = True) -> dict[str, np.ndarray]:
    """The hierarchical model of each fold at log-spreads ``theta`` (folds x (p + 1): the
    p row spreads, constant last, then the source spread): the biases' posterior mean
    and covariance, the negative log marginal likelihood (biases and source offsets
    integrated out; priors included) and, with ``gradient``, its exact gradient in
    ``theta``.

    With ``W = D + tau^2 Z Z'`` (``D`` the rows' variances, ``Z`` the one-hot sources:
    block diagonal, inverted per source by Sherman-Morrison) and ``V = W + X P X'`` (``P``
    the biases' prior covariance, inverted by Woodbury), the fold's rows are ``N(0, V)``:
    ``A = P^-1 + X' W^-1 X`` is the biases' posterior precision, their mean is
    ``A^-1 X' W^-1 r``, and ``d nll / d ln s_a = s_a^2 (tr(V^-1 G_a) - a' G_a a)``
    with ``a = V^-1 r = W^-1 (r - X b)`` (Harville, 'Maximum likelihood approaches to
    variance component estimation', JASA 72, 1977, eq. 4.2)."""
    p = design.shape[1]
    squares = design ** 2
    sigma2 = np.exp(2 * theta[:, :p])
    tau2 = np.exp(2 * theta[:, p])
    variance = known + sigma2 @ squares.T
    d_inv = weights / variance  # a row outside the fold has no weight: infinite variance
    per_source = d_inv @ sources
    shrink = tau2[:, None] / (1 + tau2[:, None] * per_source)

    def w_inverse(v: np.ndarray) -> np.ndarray:  # W^-1 v per fold
        u = d_inv * v
        return u - d_inv * ((shrink * (u @ sources)) @ sources.T)

    u = d_inv[:, :, None] * design
    index = sources.argmax(axis=1)  # each row's source
    w_design = u - d_inv[:, :, None] * (shrink[:, :, None] * (sources.T @ u))[:, index, :]
    precision = np.eye(p) / PRIOR_BIAS ** 2 + design.T @ w_design
    covariance = np.linalg.inv(precision)
    bias = (covariance @ (w_inverse(np.broadcast_to(residual, d_inv.shape)) @ design)[:, :, None]
            )[:, :, 0]
    alpha = w_inverse(residual - bias @ design.T)
    centre = np.append(np.full(p, math.log(PRIOR_SIGMA)), math.log(PRIOR_SOURCE_SIGMA))
    log_det = (np.where(weights > 0, np.log(variance), 0.0).sum(axis=1)
               + np.log1p(tau2[:, None] * per_source).sum(axis=1)
               + np.linalg.slogdet(precision)[1] + 2 * p * math.log(PRIOR_BIAS))
    out = {"bias": bias, "covariance": covariance, "sigma": np.sqrt(sigma2),
           "source_sigma": np.sqrt(tau2),
           "nll": 0.5 * (log_det + (residual * alpha).sum(axis=1))
           + 0.5 * ((theta - centre) ** 2).sum(axis=1)}
    if gradient:
        w_diagonal = d_inv - d_inv ** 2 * shrink[:, index]
        v_diagonal = w_diagonal - ((w_design @ covariance) * w_design).sum(axis=2)
        grad_sigma = sigma2 * ((v_diagonal - alpha ** 2) @ squares)
        w_sources = sources.T @ w_design
        ones_v_ones = (per_source - shrink * per_source ** 2
                       - ((w_sources @ covariance) * w_sources).sum(axis=2))
        grad_tau = tau2 * (ones_v_ones.sum(axis=1) - ((alpha @ sources) ** 2).sum(axis=1))
        out["gradient"] = np.concatenate([grad_sigma, grad_tau[:, None]], axis=1) + theta - centre
    return out


def _marginal_fit(shares: np.ndarray, residual: np.ndarray, known: np.ndarray,
                  sources: np.ndarray, iterations: int, weights: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """The hierarchical model's fit of each fold (module docstring): the spreads maximize
    the marginal likelihood times their priors (Adam on the exact gradient of
    :func:`_marginal_terms`, from the priors' centres: deterministic); the biases are
    their posterior given those spreads.

    Several fits at once: ``weights`` (folds x rows, 1 = the fold is fitted on the row;
    default one fold of every row) gives one fit per fold, each the same as fitting that
    fold's rows alone (Adam is per parameter).

    Returns:
        ``bias`` (folds x p, constant last), ``covariance`` (folds x p x p), ``sigma``
        (folds x p), ``source_sigma`` (folds), ``nll`` (folds).
    """
    design = np.hstack([shares, np.ones((len(residual), 1))])
    weights = np.ones((1, len(residual))) if weights is None else np.asarray(weights, float)
    one_hot = _source_matrix(np.asarray(sources))
    p = design.shape[1]
    theta = np.tile(np.append(np.full(p, math.log(PRIOR_SIGMA)), math.log(PRIOR_SOURCE_SIGMA)),
                    (len(weights), 1))
    counts = weights.sum(axis=1, keepdims=True)
    moment, second = np.zeros_like(theta), np.zeros_like(theta)
    for step in range(1, iterations + 1):
        grad = _marginal_terms(theta, design, residual, known, one_hot, weights)["gradient"]
        grad = grad / counts
        moment = 0.9 * moment + 0.1 * grad
        second = 0.999 * second + 0.001 * grad ** 2
        theta -= LEARNING_RATE * (moment / (1 - 0.9 ** step)) / (
            np.sqrt(second / (1 - 0.999 ** step)) + 1e-9)
    return _marginal_terms(theta, design, residual, known, one_hot, weights, gradient=False)


Fitted = tuple[np.ndarray, np.ndarray, np.ndarray, float]


def _fit_folds(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray], masks: np.ndarray,
               iterations: int = ITERATIONS) -> list[Fitted]:
    """The model-error fit (:func:`fit_model_error`) of each fold's rows (``masks``:
    folds x rows, True = fitted on), all folds at once: per fold (biases, their
    covariance, sigmas -- the constant last in each -- and sigma_source)."""
    offset, variance = known
    out = _marginal_fit(rows[SHARE_COLUMNS].to_numpy(float),
                        rows["residual"].to_numpy(float) - offset, variance,
                        rows["source_id"].to_numpy(), iterations, np.asarray(masks, bool))
    return [(b, c, s, float(t)) for b, c, s, t in
            zip(out["bias"], out["covariance"], out["sigma"], out["source_sigma"])]


def _as_terms(fitted: Fitted) -> tuple[dict, dict, float, float, float, np.ndarray]:
    bias, covariance, sigma, source_sigma = fitted
    k = len(COMPONENTS)
    return (dict(zip(COMPONENTS, map(float, bias[:k]))),
            dict(zip(COMPONENTS, map(float, sigma[:k]))), float(bias[k]), float(sigma[k]),
            source_sigma, covariance)


def fit_model_error(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray], *,
                    iterations: int = ITERATIONS
                    ) -> tuple[dict, dict, float, float, float, np.ndarray]:
    """Fit the model-error term on validation ``rows`` (module docstring): the
    hierarchical model's spreads by marginal likelihood, the biases' posterior given them
    (uncalibrated: see :func:`conformal_scale`).

    Args:
        rows: validation rows (:func:`validation_rows`).
        known: per row, the mean and variance of the other terms (:func:`known_terms`).

    Returns:
        (bias per component, sigma per component, bias_0, sigma_0, sigma_source, the
        biases' covariance in :data:`sim.step_bands.COVARIANCE_ORDER`), log units.

    Raises:
        ValueError: with fewer than 10 rows.
    """
    if len(rows) < 10:
        raise ValueError(f"validation rows: {len(rows)} is too few to fit the band on; "
                         "give 10 or more")
    return _as_terms(_fit_folds(rows, known, np.ones((1, len(rows)), bool), iterations)[0])


def predictive(fitted: Fitted, shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``shares`` (rows x components), the mean and variance (log units) of a
    new source's model error under ``fitted`` (uncalibrated): ``x' b`` and ``x' C x +
    s_source^2 + s_0^2 + sum_k f_k^2 s_k^2`` (:func:`sim.step_bands.model_terms`)."""
    bias, covariance, sigma, source_sigma = fitted
    design = np.hstack([shares, np.ones((len(shares), 1))])
    variance = (np.einsum("np,pq,nq->n", design, covariance, design) + source_sigma ** 2
                + design ** 2 @ sigma ** 2)
    return design @ bias, variance


def conformal_scale(error: np.ndarray, model_variance: np.ndarray, known_variance: np.ndarray,
                    coverage: float = NOMINAL_COVERAGE,
                    groups: np.ndarray | None = None) -> float:
    """The factor ``c`` on the model-error spread that puts ``coverage`` of held-out rows
    inside the band (module docstring): each row's score ``c_i^2 = max(0, e_i^2 / z^2 -
    known_i) / m_i`` (``z`` the normal quantile at ``(1 + coverage) / 2``), and ``c`` the
    square root of their quantile at ``coverage``.

    Without ``groups`` the rows are exchangeable: the ``ceil((n + 1) coverage)``-th
    smallest score (the split-conformal rank; the largest when that rank passes ``n``).
    With ``groups`` (the held-out source of each row) each group weighs the same, its
    rows ``1 / n_group`` each, and ``c^2`` is the smallest score whose pooled weight
    reaches ``coverage`` (CDF pooling: Dunn, Wasserman, Ramdas, JASA 2022, sec. 3.1), so
    a source of 200 rows does not set a new source's band alone.

    Raises:
        ValueError: for no rows, a coverage outside (0, 1), or groups of another length.
    """
    if not 0 < coverage < 1:
        raise ValueError(f"coverage: {coverage!r} is not valid; give a fraction in (0, 1)")
    error = np.asarray(error, float)
    if error.size == 0:
        raise ValueError("error: no held-out rows to calibrate the spread on; give 1 or more")
    z = NormalDist().inv_cdf((1 + coverage) / 2)
    scores = np.maximum(error ** 2 / z ** 2 - known_variance, 0.0) / model_variance
    if groups is None:
        rank = min(math.ceil((error.size + 1) * coverage), error.size)
        return math.sqrt(float(np.sort(scores)[rank - 1]))
    groups = np.asarray(groups)
    if groups.shape != error.shape:
        raise ValueError(f"groups: {groups.size} labels for {error.size} rows; give one per row")
    _, index, counts = np.unique(groups, return_inverse=True, return_counts=True)
    weights = 1.0 / counts[index]
    order = np.argsort(scores, kind="stable")
    pooled = np.cumsum(weights[order]) / weights.sum()
    at = min(int(np.searchsorted(pooled, coverage - 1e-12)), error.size - 1)
    return math.sqrt(float(scores[order][at]))


def _calibrated_fits(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray],
                     trains: Sequence[np.ndarray], iterations: int = ITERATIONS
                     ) -> list[tuple[Fitted, float, int]]:
    """Per training mask in ``trains``: the model-error terms fitted on its rows, the
    conformal scale (:func:`conformal_scale`, each source weighted equally) from leaving
    each of its sources out in turn, and the number of held-out rows that scale was set
    on. Every fit needed (each training set and each of its leave-one-source-out folds)
    runs in one batch."""
    sources = rows["source_id"].to_numpy()
    shares = rows[SHARE_COLUMNS].to_numpy(float)
    residual = rows["residual"].to_numpy(float) - known[0]
    wanted: dict[bytes, np.ndarray] = {}
    plans = []
    for train in trains:
        train = np.asarray(train, bool)
        inner = [(train & (sources == s), train & (sources != s))
                 for s in np.unique(sources[train])]
        for mask in [train, *(fold for _, fold in inner)]:
            wanted.setdefault(mask.tobytes(), mask)
        plans.append((train, inner))
    keys = list(wanted)
    fitted = dict(zip(keys, _fit_folds(rows, known, np.array([wanted[k] for k in keys]),
                                       iterations)))
    out = []
    for train, inner in plans:
        errors, model_variance, known_variance, groups = [], [], [], []
        for held, fold in inner:
            mean, variance = predictive(fitted[fold.tobytes()], shares[held])
            errors.append(residual[held] - mean)
            model_variance.append(variance)
            known_variance.append(known[1][held])
            groups.append(sources[held])
        scale = conformal_scale(np.concatenate(errors), np.concatenate(model_variance),
                                np.concatenate(known_variance), groups=np.concatenate(groups))
        out.append((fitted[train.tobytes()], scale, int(train.sum())))
    return out


def _band_model(fitted: Fitted, gpus_terms, scale: float = 1.0) -> BandModel:
    return BandModel.from_dict(_band_dict(fitted, gpus_terms, scale))


def _band_dict(fitted: Fitted, gpus_terms, scale: float = 1.0,
               heldout_rows: int | None = None) -> dict:
    bias, sigma, bias_0, sigma_0, sigma_source, covariance = _as_terms(fitted)
    calibration = {"scale": scale, "nominal_coverage": NOMINAL_COVERAGE,
                   "method": "conformal quantile of normalized held-out errors, leaving one "
                             "source out, each source weighted equally (CDF pooling): Dunn, "
                             "Wasserman, Ramdas JASA 2022; Lei et al. JASA 2018 sec. 5.2"}
    if heldout_rows is not None:
        calibration["heldout_rows"] = heldout_rows
    return {"components": {k: {"bias": bias[k], "sigma": sigma[k]} for k in COMPONENTS},
            "constant": {"bias": bias_0, "sigma": sigma_0},
            "source": {"sigma": sigma_source},
            "bias_covariance": {"order": list(COVARIANCE_ORDER),
                                "matrix": [[float(v) for v in row] for row in covariance]},
            "calibration": calibration,
            "overhead_reference_s": OVERHEAD_REFERENCE_S,
            "gpus": {g: dict(v) for g, v in gpus_terms.items()}}


def fit(frame: pd.DataFrame) -> BandModel:
    """The band model fitted on ``frame`` (evaluate's rows, with roles), its spread
    calibrated on held-out sources (:func:`conformal_scale`)."""
    gpus_terms = calibration_spread(frame)
    rows = validation_rows(frame)
    if len(rows) < 10:
        raise ValueError(f"validation rows: {len(rows)} is too few to fit the band on; "
                         "give 10 or more")
    known = known_terms(rows, gpus_terms)
    fitted, scale, _ = _calibrated_fits(rows, known, [np.ones(len(rows), bool)])[0]
    return _band_model(fitted, gpus_terms, scale)


def predict(rows: pd.DataFrame, model: BandModel) -> pd.DataFrame:
    """``rows`` with their band (``p10_s``, ``p50_s``, ``p90_s``), ``inside`` (the
    published step lies in it) and ``width`` ((p90 - p10) / p50)."""
    out = rows.copy()
    bands = [step_band(float(r["simulated_step_s"]), _shares(r), gpus=int(r["gpus"]),
                       gpu_name=r["gpu_name"], speed_spread=float(r["speed_spread"]),
                       model=model) for _, r in rows.iterrows()]
    out["p10_s"] = [b.p10_s for b in bands]
    out["p50_s"] = [b.p50_s for b in bands]
    out["p90_s"] = [b.p90_s for b in bands]
    published = out["published_step_s"].astype(float)
    out["inside"] = (out["p10_s"] <= published) & (published <= out["p90_s"])
    out["width"] = (out["p90_s"] - out["p10_s"]) / out["p50_s"]
    return out


def leave_one_source_out(frame: pd.DataFrame, *, miscalibrate: float = 1.0
                         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Coverage of the 80 % band on sources it was not fitted on: for each validation
    source, fit on the others' validation rows -- the spread's scale calibrated by
    leaving each of *those* sources out in turn (nested; the held-out source never sets
    its own band) -- and predict its rows. ``miscalibrate`` multiplies every fold's
    scale (1 = as fitted; the tests check that a band too narrow or too wide fails).

    Returns:
        (every held-out row with its band, ``inside`` and ``width``; per source and
        ``all``: rows, coverage, median width).
    """
    rows = validation_rows(frame)
    gpus_terms = calibration_spread(frame)
    offset, variance = known_terms(rows, gpus_terms)  # per row, not fitted: computed once
    sources = sorted(rows["source_id"].unique())
    trains = [(rows["source_id"] != source).to_numpy() for source in sources]
    fits = _calibrated_fits(rows, (offset, variance), trains)
    held_out = []
    for source, (fitted, scale, _) in zip(sources, fits):
        model = _band_model(fitted, gpus_terms, scale * miscalibrate)
        held_out.append(predict(rows[rows["source_id"] == source], model))
    predicted = pd.concat(held_out, ignore_index=True)
    return predicted, coverage_table(predicted)


def shift_source(frame: pd.DataFrame, source: str, factor: float) -> pd.DataFrame:
    """``frame`` with the published step times of ``source`` multiplied by ``factor``
    (and their errors recomputed): what a physics change that moves one stack's rows
    does to the band (the robustness check of :func:`perturbation_table`).

    Raises:
        ValueError: for a factor that is not positive, or a source ``frame`` lacks.
    """
    if not factor > 0:
        raise ValueError(f"factor: {factor!r} is not valid; give a positive number")
    if source not in set(frame["source_id"]):
        raise ValueError(f"source: {source!r} is not in the rows; give one of "
                         f"{sorted(set(frame['source_id']))}")
    out = frame.copy()
    mine = out["source_id"] == source
    out.loc[mine, "published_step_s"] = out.loc[mine, "published_step_s"] * factor
    out.loc[mine, "error"] = (1 + out.loc[mine, "error"]) / factor - 1  # simulated/published - 1
    return out


#: The row of :func:`coverage_table` that weighs every held-out source equally.
EACH_SOURCE = "each source"


def perturbation_table(frame: pd.DataFrame, shift: float = 0.05, min_rows: int = 100
                       ) -> pd.DataFrame:
    """Leave-one-source-out coverage after shifting each validation source of at least
    ``min_rows`` rows by ``+-shift`` in turn (:func:`shift_source`): per shift, the
    coverage with each source weighted equally, the pooled rows' coverage and width, and
    the coverage of every such source."""
    rows = validation_rows(frame)
    counts = rows["source_id"].value_counts()
    large = sorted(counts[counts >= min_rows].index)
    out = []
    for source in large:
        for sign in (1, -1):
            table = leave_one_source_out(shift_source(frame, source, 1 + sign * shift))[1]
            table = table.set_index("source_id")
            out.append({"shifted": source, "shift": sign * shift,
                        "coverage": float(table.loc[EACH_SOURCE, "coverage"]),
                        "coverage_pooled": float(table.loc["all", "coverage"]),
                        "median_width": float(table.loc["all", "median_width"]),
                        **{f"coverage_{s}": float(table.loc[s, "coverage"]) for s in large}})
    return pd.DataFrame(out)


def coverage_table(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per source, ``all`` (every held-out row pooled) and :data:`EACH_SOURCE` (the mean
    of the sources' coverages; its width is the pooled rows'): rows, coverage of the band,
    median width.

    The band is calibrated for a job on a stack it has not seen (the conformal quantile
    weighs each source equally, :func:`conformal_scale`), so its coverage is the mean over
    held-out sources: a source's rows share one draw of its stack's offset, and pooling
    rows lets the largest source (MosaicML, 43 % of the rows) stand for the whole figure,
    which a +-5 % shift of that source alone moved by 14 points (:func:`perturbation_table`).
    """
    def summary(source: str, group: pd.DataFrame) -> dict:
        return {"source_id": source, "rows": len(group),
                "coverage": float(group["inside"].mean()),
                "median_width": float(group["width"].median())}

    rows = [summary(source, group)
            for source, group in [*predicted.groupby("source_id"), ("all", predicted)]]
    each = {**rows[-1], "source_id": EACH_SOURCE,
            "coverage": float(np.mean([row["coverage"] for row in rows[:-1]]))}
    return pd.DataFrame([*rows, each])


def source_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The per-source rows of a :func:`coverage_table` (without its two summary rows)."""
    return table[~table["source_id"].isin(["all", EACH_SOURCE])]


#: Markers of the README block :func:`main` writes with ``--write-readme``.
README_BEGIN = "<!-- band-coverage:begin (generated by python -m validate.fit_bands) -->"
README_END = "<!-- band-coverage:end -->"


def readme_block(table: pd.DataFrame, scale: float) -> str:
    """The README's coverage block: the conformal factor ``scale`` of the fitted band, the
    overall leave-one-source-out figure and the per-source table (``coverage_table``'s
    rows), between :data:`README_BEGIN` and :data:`README_END`."""
    by_source = table.set_index("source_id")
    overall, each = by_source.loc["all"], by_source.loc[EACH_SOURCE]
    sources = len(source_rows(table))
    lines = [README_BEGIN,
             f"The model-error spread is scaled by a factor {scale:.2f} (conformal, each "
             "source weighted equally, above).",
             f"Leave-one-source-out, the 80 % band covers {each['coverage']:.0%} of a held-out "
             f"source's rows (mean over the {sources} sources, each weighted equally as the "
             f"band is calibrated) and {overall['coverage']:.0%} of the "
             f"{int(overall['rows'])} held-out rows pooled, median width "
             f"{overall['median_width']:.0%} of the median (`(p90 - p10) / p50`):", "",
             "| source | held-out rows | coverage | median width |", "|---|---|---|---|"]
    lines += [f"| {row.source_id} | {int(row.rows)} | {row.coverage:.0%} | "
              f"{row.median_width:.0%} |" for row in source_rows(table).itertuples()]
    return "\n".join([*lines, README_END]) + "\n"


def load_rows(path: Path = ROWS_FILE) -> pd.DataFrame:
    """The simulated published rows :func:`main` wrote.

    Raises:
        ValueError: when the file is missing (run ``python -m validate.fit_bands``).
    """
    if not path.exists():
        raise ValueError(f"{path}: missing; run python -m validate.fit_bands")
    return pd.read_csv(path)


def data_hash(directory: Path = DATA_DIR) -> str:
    """SHA-256 of the published data the rows come from (train_*.csv, models.csv,
    roles.toml), so a stale fit is visible."""
    digest = hashlib.sha256()
    for path in sorted([*directory.glob("train_*.csv"), directory / "models.csv",
                        directory / "roles.toml"]):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=DATA_DIR, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_rows(path: Path = ROWS_FILE) -> None:
    """Simulate every published row (analytic fidelity) and write the compared ones with
    their shares to ``path``."""
    frame = evaluate(load_runs())
    keep = ["source_id", "row_id", "role", "status", "gpu", "gpu_name", "speed_spread", "dtype",
            "moe", "gpus", "published_step_s", "simulated_step_s", "error", *SHARE_COLUMNS]
    text = frame[frame["status"] == "ok"][keep].to_csv(index=False, float_format="%.6g")
    write_text_atomic(path, text)  # a killed refit leaves the previous rows whole


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line of :func:`main` (argparse: an unknown option exits 2 with usage)."""
    parser = argparse.ArgumentParser(
        prog="python -m validate.fit_bands", allow_abbrev=False,
        description="Fit the step-time band model on the published rows and report its "
                    "leave-one-source-out coverage.")
    parser.add_argument("--write-readme", metavar="PATH",
                        help="also write the coverage into this README's generated block")
    parser.add_argument("--reuse-rows", action="store_true",
                        help="fit on the stored band rows instead of simulating them again")
    parser.add_argument("--perturb", action="store_true",
                        help="only print the perturbation table of the stored rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Simulate the published rows (unless ``--reuse-rows``), write them and the fitted
    band model with its leave-one-source-out coverage; with ``--write-readme PATH``, also
    that coverage into the README's generated block (:func:`readme_block`). With
    ``--perturb``, only print :func:`perturbation_table` of the stored rows (writes
    nothing)."""
    args = _arguments(argv)
    if args.perturb:
        with pd.option_context("display.width", 250, "display.max_columns", 20):
            print(perturbation_table(load_rows()).round(3).to_string(index=False))
        return
    readme = args.write_readme
    if readme is not None:
        try:  # before the work: a bad file costs nothing
            readme_text(readme, README_BEGIN, README_END)
        except ValueError as problem:
            raise SystemExit(str(problem)) from None
    if not args.reuse_rows:
        write_rows()
    frame = load_rows()
    gpus_terms = calibration_spread(frame)
    rows = validation_rows(frame)
    fitted, scale, _ = _calibrated_fits(rows, known_terms(rows, gpus_terms),
                                        [np.ones(len(rows), bool)])[0]
    _, table = leave_one_source_out(frame)
    data = _band_dict(fitted, gpus_terms, scale, int(len(rows)))
    data["provenance"] = {
        "fitted_by": "python -m validate.fit_bands",
        "rows_file": str(ROWS_FILE.relative_to(DATA_DIR.parents[2])),
        "validation_rows": int(len(rows)),
        "rows_per_source": {str(k): int(v) for k, v in rows["source_id"].value_counts()
                            .sort_index().items()},
        "published_data_sha256": data_hash(),
        "git_commit": _git_commit(),
        "leave_one_source_out": table.to_dict(orient="records"),
    }
    BAND_FILE.parent.mkdir(exist_ok=True)
    write_text_atomic(BAND_FILE, json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(table.to_string(index=False))
    print(f"wrote {ROWS_FILE} and {BAND_FILE}", file=sys.stderr)
    if readme is not None:
        replace_readme_block(readme, readme_block(table, scale), README_BEGIN, README_END)
        print(f"wrote the coverage block of {readme}", file=sys.stderr)


if __name__ == "__main__":
    main()
