"""Fit the prediction band's terms on the published set, and check that it is calibrated.

The band (:mod:`sim.step_bands`) has three terms; two are fitted here:

* **model error** on the *validation* rows (never the calibration rows): the log
  residual ``r = ln(published / simulated)`` of a row is modelled as Normal with mean
  ``b_0 + sum_k f_k b_k`` and variance ``known + s_0^2 + sum_k f_k^2 s_k^2``, ``f_k``
  the row's component shares (``share_*`` columns of :func:`validate.published.evaluate`)
  and ``known`` the variance the other two terms already explain. The fit is the
  maximum a posteriori estimate under weak priors (``b_k ~ N(0, PRIOR_BIAS^2)``,
  ``ln s_k ~ N(ln PRIOR_SIGMA, 1)``), so a component the rows barely exercise keeps a
  prior spread instead of none; Adam on the exact gradient, from a fixed start
  (deterministic).
* **calibration of that spread on unseen sources**: the in-sample spreads cover ~83 %
  of the rows they were fitted on but only ~69 % of a source left out (a new software
  stack is off in ways the others' components do not predict). So the spread gets a
  factor ``c`` (``scale``), cross-conformal (Vovk, 'Cross-conformal predictors', Ann.
  Math. Artif. Intell. 74, 2015; normalized nonconformity scores as in Lei, G'Sell,
  Rinaldo, Tibshirani, Wasserman, 'Distribution-free predictive inference for
  regression', JASA 2018, sec. 5.2): leave each training source out in turn, fit on the
  rest, and score each held-out row by the factor its model spread needs for the 80 %
  band to reach it, ``c_i^2 = max(0, e_i^2 / z_0.9^2 - known_i) / m_i`` (``e_i`` its
  error, ``m_i`` the model variance, ``known_i`` the other terms'); ``c`` is their
  ``ceil((n + 1) 0.8)``-th smallest (the split-conformal finite-sample rank). An
  empirical quantile of the held-out scores, not a normal assumption about their tails,
  sets the width, so heavy-tailed residuals are covered as stated.
* **parameter uncertainty**: per GPU, the standard error of its calibrated
  ``sustained_fraction`` from the spread of its calibration rows' residuals (the
  standard error of a median, ``1.2533 sd / sqrt(n)``), in log units of compute time
  (divided by the rows' mean compute share).

The third, GPU-to-GPU speed spread, is a published figure (:data:`GPU_SPEED_CV`).

``python -m validate.fit_bands`` simulates the published rows once (about a minute),
writes them to :data:`ROWS_FILE` (so the coverage test reuses them in milliseconds) and
the fitted terms with their provenance to :data:`sim.step_bands.BAND_FILE`;
:func:`leave_one_source_out` is the coverage check the tests run (nested: each held-out
source's band is calibrated by leave-one-source-out within the other sources only, so
the check never sees the rows it scores).

Nothing here imports torch.
"""

from __future__ import annotations

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

from sim.step_bands import (BAND_FILE, COMPONENTS, BandModel, compute_share, step_band,
                            slowest_of_n)
from validate.published import DATA_DIR, evaluate, load_runs
from validate.published_report import readme_text, replace_readme_block

#: The simulated published rows the band is fitted on (written by :func:`main`).
ROWS_FILE = DATA_DIR / "band_rows.csv"
#: GPU-to-GPU speed spread (coefficient of variation) of one GPU SKU, and its source.
GPU_SPEED_CV = 0.02
GPU_SPEED_CV_SOURCE = (
    "Sinha et al., 'Not All GPUs Are Created Equal: Characterizing Variability in "
    "Large-Scale, Accelerator-Rich Systems', SC22 (arXiv:2208.11035): 8 % average "
    "performance variation across GPUs of one SKU and cluster, read as the range of "
    "about +-2 standard deviations, so cv = 8 % / 4 = 2 %; outliers up to 1.5x slower "
    "are stragglers, not this spread")
#: Weak priors of the model-error fit (log units).
PRIOR_BIAS, PRIOR_SIGMA = 0.2, 0.1
#: A fixed per-step overhead's share is this over the step time (sim.step_bands).
OVERHEAD_REFERENCE_S = 1.0
#: Quantile of a standard normal at 0.9, and the efficiency factor of a median.
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
#: Median of a chi-square variable with one degree of freedom.
CHI2_1_MEDIAN = 0.4549364231195724
SHARE_COLUMNS = [f"share_{k}" for k in COMPONENTS]
#: The band's nominal coverage (p10..p90), and the standard normal's quantile at its top.
NOMINAL_COVERAGE = 0.8
Z_90 = NormalDist().inv_cdf(0.9)


def calibration_spread(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per GPU name of the calibration rows of ``frame`` (evaluate's columns): rows,
    ``sustained_fraction_se`` (log units of compute time) and ``calibration_gpus``
    (median GPU count).

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
                         / math.sqrt(len(group)) / max(share, 0.1),
                         "calibration_gpus": int(group["gpus"].median())}
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
    model = _band_model({k: 0.0 for k in COMPONENTS}, {k: 0.0 for k in COMPONENTS},
                        0.0, 0.0, 0.0, gpus_terms)
    offset, variance = [], []
    for _, row in rows.iterrows():
        band = step_band(1.0, _shares(row), gpus=int(row["gpus"]), gpu_name=row["gpu_name"],
                         model=model, samples=400)
        logs = np.log(band.ratios)
        offset.append(float(logs.mean()))
        variance.append(float(logs.var()))
    return np.array(offset), np.array(variance)


def _shares(row: Mapping) -> dict[str, float]:
    return {k: float(row[f"share_{k}"]) for k in COMPONENTS}


def _map_fit(shares: np.ndarray, residual: np.ndarray, known: np.ndarray,
             iterations: int, weights: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """MAP estimate of (biases with bias_0 last, sigmas with sigma_0 last): Adam on the
    exact gradient of the Gaussian negative log-posterior, from the priors' centres.

    Several fits at once: ``weights`` (folds x rows, 1 = the fold is fitted on the row;
    default one fold of every row) and ``known`` (rows, or folds x rows) give one fit per
    fold, each the same as fitting that fold's rows alone (Adam is per parameter).

    Returns:
        (biases, sigmas), each folds x (components + 1).
    """
    k = shares.shape[1]
    weights = np.ones((1, len(residual))) if weights is None else np.asarray(weights, float)
    folds = len(weights)
    counts = weights.sum(axis=1, keepdims=True)
    theta = np.concatenate([np.zeros((folds, k + 1)),
                            np.full((folds, k + 1), math.log(PRIOR_SIGMA))], axis=1)
    moment, second = np.zeros_like(theta), np.zeros_like(theta)
    design = np.hstack([shares, np.ones((len(residual), 1))])
    squares = design ** 2
    for step in range(1, iterations + 1):
        bias, log_sigma = theta[:, :k + 1], theta[:, k + 1:]
        sigma2 = np.exp(2 * log_sigma)
        variance = known + sigma2 @ squares.T
        error = residual - bias @ design.T
        d_variance = weights * 0.5 * (1 / variance - error ** 2 / variance ** 2)
        grad_bias = -((weights * error / variance) @ design) + bias / PRIOR_BIAS ** 2
        grad_log_sigma = (d_variance @ squares) * 2 * sigma2 \
            + (log_sigma - math.log(PRIOR_SIGMA))
        grad = np.concatenate([grad_bias, grad_log_sigma], axis=1) / counts
        moment = 0.9 * moment + 0.1 * grad
        second = 0.999 * second + 0.001 * grad ** 2
        theta -= 0.02 * (moment / (1 - 0.9 ** step)) / (np.sqrt(second / (1 - 0.999 ** step))
                                                        + 1e-9)
    return theta[:, :k + 1], np.exp(theta[:, k + 1:])


def _source_sigma(sources: np.ndarray, error: np.ndarray, variance: np.ndarray) -> float:
    """Spread of the sources' own offsets, each source one draw: per source, its mean
    error squared less that mean's sampling variance; their median over the median of
    a chi-square with one degree of freedom (:data:`CHI2_1_MEDIAN`) estimates the
    offsets' variance robustly (one source the simulator misses badly does not set
    every band's width)."""
    excess = []
    for source in np.unique(sources):
        mine = sources == source
        excess.append(error[mine].mean() ** 2 - variance[mine].mean() / mine.sum())
    return math.sqrt(max(float(np.median(excess)) / CHI2_1_MEDIAN, 0.0))


def _fit_folds(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray], masks: np.ndarray,
               iterations: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """The model-error fit (:func:`fit_model_error`) of each fold's rows (``masks``:
    folds x rows, True = fitted on), all folds at once: per fold (biases, sigmas with the
    constant last, sigma_source)."""
    shares = rows[SHARE_COLUMNS].to_numpy(float)
    offset, variance = known
    residual = rows["residual"].to_numpy(float) - offset
    sources = rows["source_id"].to_numpy()
    masks = np.asarray(masks, bool)
    bias, sigma = _map_fit(shares, residual, variance, iterations, masks)
    design = np.hstack([shares, np.ones((len(rows), 1))])
    source_sigma = np.array([
        _source_sigma(sources[m], (residual - design @ b)[m], (variance + design ** 2 @ s ** 2)[m])
        for m, b, s in zip(masks, bias, sigma)])
    bias, sigma = _map_fit(shares, residual, variance + source_sigma[:, None] ** 2, iterations,
                           masks)
    return [(b, s, float(t)) for b, s, t in zip(bias, sigma, source_sigma)]


def _as_terms(fitted: tuple[np.ndarray, np.ndarray, float]) -> tuple[dict, dict, float, float,
                                                                       float]:
    bias, sigma, source_sigma = fitted
    k = len(COMPONENTS)
    return (dict(zip(COMPONENTS, map(float, bias[:k]))),
            dict(zip(COMPONENTS, map(float, sigma[:k]))), float(bias[k]), float(sigma[k]),
            source_sigma)


def fit_model_error(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray], *,
                    iterations: int = 2000) -> tuple[dict, dict, float, float, float]:
    """Fit the model-error term on validation ``rows`` (module docstring): the
    components' MAP fit, the spread between sources from what is left, then the
    components again with that spread known (uncalibrated: see :func:`conformal_scale`).

    Args:
        rows: validation rows (:func:`validation_rows`).
        known: per row, the mean and variance of the other terms (:func:`known_terms`).

    Returns:
        (bias per component, sigma per component, bias_0, sigma_0, sigma_source), log
        units.

    Raises:
        ValueError: with fewer than 10 rows.
    """
    if len(rows) < 10:
        raise ValueError(f"validation rows: {len(rows)} is too few to fit the band on; "
                         "give 10 or more")
    return _as_terms(_fit_folds(rows, known, np.ones((1, len(rows)), bool), iterations)[0])


def conformal_scale(error: np.ndarray, model_variance: np.ndarray, known_variance: np.ndarray,
                    coverage: float = NOMINAL_COVERAGE) -> float:
    """The factor ``c`` on the model-error spread that puts ``coverage`` of held-out rows
    inside the band (module docstring): each row's score ``c_i^2 = max(0, e_i^2 / z^2 -
    known_i) / m_i`` (``z`` the normal quantile at ``(1 + coverage) / 2``), and ``c`` the
    square root of their ``ceil((n + 1) coverage)``-th smallest (the largest when that
    rank passes ``n``).

    Raises:
        ValueError: for no rows, or a coverage outside (0, 1).
    """
    if not 0 < coverage < 1:
        raise ValueError(f"coverage: {coverage!r} is not valid; give a fraction in (0, 1)")
    error = np.asarray(error, float)
    if error.size == 0:
        raise ValueError("error: no held-out rows to calibrate the spread on; give 1 or more")
    z = NormalDist().inv_cdf((1 + coverage) / 2)
    scores = np.maximum(error ** 2 / z ** 2 - known_variance, 0.0) / model_variance
    rank = min(math.ceil((error.size + 1) * coverage), error.size)
    return math.sqrt(float(np.sort(scores)[rank - 1]))


def _calibrated_fits(rows: pd.DataFrame, known: tuple[np.ndarray, np.ndarray],
                     trains: Sequence[np.ndarray], iterations: int = 2000
                     ) -> list[tuple[tuple, float, int]]:
    """Per training mask in ``trains``: the model-error terms fitted on its rows, the
    cross-conformal scale (:func:`conformal_scale`) from leaving each of its sources out
    in turn, and the number of held-out rows that scale was set on. Every fit needed
    (each training set and each of its leave-one-source-out folds) runs in one batch."""
    sources = rows["source_id"].to_numpy()
    shares = rows[SHARE_COLUMNS].to_numpy(float)
    design = np.hstack([shares, np.ones((len(rows), 1))])
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
        errors, model_variance, known_variance = [], [], []
        for held, fold in inner:
            bias, sigma, source_sigma = fitted[fold.tobytes()]
            errors.append(residual[held] - design[held] @ bias)
            model_variance.append(design[held] ** 2 @ sigma ** 2 + source_sigma ** 2)
            known_variance.append(known[1][held])
        scale = conformal_scale(np.concatenate(errors), np.concatenate(model_variance),
                                np.concatenate(known_variance))
        out.append((_as_terms(fitted[train.tobytes()]), scale, int(train.sum())))
    return out


def _band_model(bias, sigma, bias_0, sigma_0, sigma_source, gpus_terms,
                scale: float = 1.0) -> BandModel:
    return BandModel.from_dict(_band_dict(bias, sigma, bias_0, sigma_0, sigma_source,
                                          gpus_terms, scale))


def _band_dict(bias, sigma, bias_0, sigma_0, sigma_source, gpus_terms, scale: float = 1.0,
               heldout_rows: int | None = None) -> dict:
    calibration = {"scale": scale, "nominal_coverage": NOMINAL_COVERAGE,
                   "method": "cross-conformal (leave one source out) quantile of normalized "
                             "held-out errors: Vovk 2015, Lei et al. JASA 2018 sec. 5.2"}
    if heldout_rows is not None:
        calibration["heldout_rows"] = heldout_rows
    return {"components": {k: {"bias": bias[k], "sigma": sigma[k]} for k in COMPONENTS},
            "constant": {"bias": bias_0, "sigma": sigma_0},
            "source": {"sigma": sigma_source},
            "calibration": calibration,
            "overhead_reference_s": OVERHEAD_REFERENCE_S,
            "gpu_speed_cv": {"value": GPU_SPEED_CV, "source": GPU_SPEED_CV_SOURCE},
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
    terms, scale, _ = _calibrated_fits(rows, known, [np.ones(len(rows), bool)])[0]
    return _band_model(*terms, gpus_terms, scale)


def predict(rows: pd.DataFrame, model: BandModel) -> pd.DataFrame:
    """``rows`` with their band (``p10_s``, ``p50_s``, ``p90_s``), ``inside`` (the
    published step lies in it) and ``width`` ((p90 - p10) / p50)."""
    out = rows.copy()
    bands = [step_band(float(r["simulated_step_s"]), _shares(r), gpus=int(r["gpus"]),
                       gpu_name=r["gpu_name"], model=model) for _, r in rows.iterrows()]
    out["p10_s"] = [b.p10_s for b in bands]
    out["p50_s"] = [b.p50_s for b in bands]
    out["p90_s"] = [b.p90_s for b in bands]
    published = out["published_step_s"].astype(float)
    out["inside"] = (out["p10_s"] <= published) & (published <= out["p90_s"])
    out["width"] = (out["p90_s"] - out["p10_s"]) / out["p50_s"]
    return out


def leave_one_source_out(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Coverage of the 80 % band on sources it was not fitted on: for each validation
    source, fit on the others' validation rows -- the spread's scale calibrated by
    leaving each of *those* sources out in turn (nested; the held-out source never sets
    its own band) -- and predict its rows.

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
    for source, (terms, scale, _) in zip(sources, fits):
        model = _band_model(*terms, gpus_terms, scale)
        held_out.append(predict(rows[rows["source_id"] == source], model))
    predicted = pd.concat(held_out, ignore_index=True)
    return predicted, coverage_table(predicted)


def coverage_table(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per source and ``all``: rows, coverage of the band, median width."""
    groups = [*predicted.groupby("source_id"), ("all", predicted)]
    return pd.DataFrame([{"source_id": source, "rows": len(group),
                          "coverage": float(group["inside"].mean()),
                          "median_width": float(group["width"].median())}
                         for source, group in groups])


#: Markers of the README block :func:`main` writes with ``--write-readme``.
README_BEGIN = "<!-- band-coverage:begin (generated by python -m validate.fit_bands) -->"
README_END = "<!-- band-coverage:end -->"


def readme_block(table: pd.DataFrame, scale: float) -> str:
    """The README's coverage block: the widening factor ``scale`` of the fitted band, the
    overall leave-one-source-out figure and the per-source table (``coverage_table``'s
    rows), between :data:`README_BEGIN` and :data:`README_END`."""
    overall = table[table["source_id"] == "all"].iloc[0]
    lines = [README_BEGIN,
             f"The model-error spread is widened by a factor {scale:.2f} (cross-conformal, "
             "above).",
             f"Leave-one-source-out, the 80 % band covers {overall['coverage']:.0%} of "
             f"{int(overall['rows'])} held-out rows, median width "
             f"{overall['median_width']:.0%} of the median (`(p90 - p10) / p50`):", "",
             "| source | held-out rows | coverage | median width |", "|---|---|---|---|"]
    lines += [f"| {row.source_id} | {int(row.rows)} | {row.coverage:.0%} | "
              f"{row.median_width:.0%} |" for row in table.itertuples()
              if row.source_id != "all"]
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
    keep = ["source_id", "row_id", "role", "status", "gpu", "gpu_name", "dtype", "moe", "gpus",
            "published_step_s", "simulated_step_s", "error", *SHARE_COLUMNS]
    frame[frame["status"] == "ok"][keep].to_csv(path, index=False, float_format="%.6g")


def main(argv: list[str] | None = None) -> None:
    """Simulate the published rows (unless ``--reuse-rows``), write them and the fitted
    band model with its leave-one-source-out coverage; with ``--write-readme PATH``, also
    that coverage into the README's generated block (:func:`readme_block`)."""
    argv = sys.argv[1:] if argv is None else argv
    readme = None
    if "--write-readme" in argv:
        at = argv.index("--write-readme")
        if at + 1 >= len(argv):
            raise SystemExit("--write-readme: give the README's path")
        readme = argv[at + 1]
        try:  # before the work: a bad file costs nothing
            readme_text(readme, README_BEGIN, README_END)
        except ValueError as problem:
            raise SystemExit(str(problem)) from None
    if "--reuse-rows" not in argv:
        write_rows()
    frame = load_rows()
    model = fit(frame)
    _, table = leave_one_source_out(frame)
    rows = validation_rows(frame)
    data = _band_dict(model.bias, model.sigma, model.bias_0, model.sigma_0,
                      model.sigma_source, calibration_spread(frame), model.scale, int(len(rows)))
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
    BAND_FILE.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(table.to_string(index=False))
    print(f"wrote {ROWS_FILE} and {BAND_FILE}", file=sys.stderr)
    if readme is not None:
        replace_readme_block(readme, readme_block(table, model.scale), README_BEGIN, README_END)
        print(f"wrote the coverage block of {readme}", file=sys.stderr)


if __name__ == "__main__":
    main()
