"""How sure a simulated step time is: the 80 % prediction band (p10, p50, p90).

A simulated step time ``T`` (any fidelity) becomes a distribution of the step a real
run would measure, ``T * exp(L)``, with ``L`` the sum of three stated terms:

1. **Model error**, learned from the published validation rows (never the calibration
   rows) by ``validate/fit_bands.py``: per component ``k`` of the step -- compute by
   dtype (bf16, fp8) and kernel class (dense, MoE: grouped-GEMM experts), exposed
   communication per axis (tp, cp, ep, pp, dp), pipeline bubble, a fixed per-step
   overhead whose share is ``overhead_reference_s / T`` -- a bias ``b_k`` and a spread
   ``s_k`` weighted by the component's share ``f_k`` of the step (:func:`band_shares`),
   with ``x = (f_1 .. f_K, 1)`` and the constant term last::

       L_model ~ Normal(x' b, sigma^2),
       sigma^2 = c^2 (x' C x + s_source^2 + s_0^2 + sum_k f_k^2 s_k^2)

   so a TP-heavy FP8 plan gets another band than a DP-only BF16 one. The fit is a
   two-level (hierarchical) model: each validation source -- a software stack -- has its
   own offset, ``s_source`` the spread of those offsets, which a new job draws afresh;
   ``C`` is the posterior covariance of the biases ``b``, so a component mix that few
   sources exercise gets the uncertainty of its biases on top (the posterior predictive
   of a Bayesian linear mixed model; Gelman et al., 'Bayesian Data Analysis', 3rd ed.,
   ch. 15). ``c`` (``scale``) calibrates the whole spread on sources the fit did not see:
   the pooled-CDF conformal quantile of held-out normalized errors, leaving one source
   out at a time with each source weighted equally (Dunn, Wasserman, Ramdas,
   'Distribution-free prediction sets for two-layer hierarchical models', JASA 2022;
   normalized scores as in Lei et al., 'Distribution-free predictive inference for
   regression', JASA 2018, sec. 5.2), so that the 80 % band covers 80 % of the rows of a
   new source.
2. **Parameter uncertainty** of the hardware model: each preset's one fitted number,
   ``gpu.sustained_fraction``, is known to the standard error of its calibration fit
   (``sustained_fraction_se``, in log units of the compute time); it is sampled and
   scales the compute share.
3. **Run-to-run variability**: GPUs of one SKU differ in speed (relative standard
   deviation ``speed_spread``, the cluster's ``gpu.speed_spread``); a synchronous step
   waits for the slowest of its ``N`` ranks, whose time is ``1 + s * Z_(N)`` with
   ``Z_(N)`` the largest of ``N`` standard normals (order statistics: its quantile ``q``
   is ``Phi^-1(q^(1/N))``). The simulated step already prices the expected slowest GPU
   (:func:`hardware.compute.expected_slowest_factor`, and the presets' calibration is
   fitted with it), so the factor applied to the compute share is the draw over that
   expectation, ``(1 + s Z_(N)) / (1 + s E[Z_(N)])``: the spread of a job's slowest GPU
   around the priced one.

The terms are combined by sampling (``SAMPLES`` draws from ``seed``: deterministic);
nothing is priced again, so a band costs about a millisecond.

The fitted numbers live in ``sim/data/step_bands.json`` (written by
``python -m validate.fit_bands``, with the rows and data hash it was fitted on); this
module only reads it (sim must not import validate).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import Mapping

import numpy as np

from hardware.cost import expected_slowest_factor
from strategies.ir import AXES

#: The fitted band model (package data).
BAND_FILE = Path(__file__).resolve().parent / "data" / "step_bands.json"
#: The band's quantiles: p10 and p90 bound the 80 % band.
QUANTILES = (0.1, 0.5, 0.9)
#: Draws per band, and the default seed.
SAMPLES = 2000
SEED = 0

#: Components of the model-error term, in order (:func:`band_shares`).
COMPUTE_CLASSES = tuple(f"compute_{dtype}_{kind}" for dtype in ("bf16", "fp8")
                        for kind in ("dense", "moe"))
COMPONENTS = (*COMPUTE_CLASSES, *(f"exposed_{axis}" for axis in AXES), "bubble", "overhead")


@dataclass(frozen=True)
class BandModel:
    """The fitted terms of the band (module docstring).

    Attributes:
        bias, sigma: per component (:data:`COMPONENTS`), the log-step bias and spread
            per unit share.
        bias_0, sigma_0: the constant term (every step carries it).
        sigma_source: the spread of a software stack's own offset: the validation
            sources (frameworks, versions, recipes) differ by more than their rows'
            components explain, and a new job is a new draw of it.
        scale: the conformal factor on the model-error spread (module docstring),
            1 = the fitted hierarchical model's predictive spread as it is.
        bias_covariance: the posterior covariance of the biases (log units squared),
            rows and columns in the order of :data:`COMPONENTS` then the constant.
        overhead_reference_s: the fixed overhead's share is this over the step time.
        sustained_fraction_se: per GPU name, the calibration fit's standard error
            (log units of compute time); ``default_se`` for a GPU with none.
        provenance: where the numbers come from (rows, data hash, sources).
    """

    bias: Mapping[str, float]
    sigma: Mapping[str, float]
    bias_0: float
    sigma_0: float
    sigma_source: float
    scale: float
    bias_covariance: tuple[tuple[float, ...], ...]
    overhead_reference_s: float
    sustained_fraction_se: Mapping[str, float] = field(default_factory=dict)
    default_se: float = 0.0
    provenance: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> "BandModel":
        """The model of a band file's dict.

        Raises:
            ValueError: for a missing or malformed entry (naming it).
        """
        try:
            terms = data["components"]
            gpus = data.get("gpus", {})
            return cls(bias={k: float(terms[k]["bias"]) for k in COMPONENTS},
                       sigma={k: float(terms[k]["sigma"]) for k in COMPONENTS},
                       bias_0=float(data["constant"]["bias"]),
                       sigma_0=float(data["constant"]["sigma"]),
                       sigma_source=float(data["source"]["sigma"]),
                       scale=float(data["calibration"]["scale"]),
                       bias_covariance=_covariance(data["bias_covariance"]),
                       overhead_reference_s=float(data["overhead_reference_s"]),
                       sustained_fraction_se={g: float(v["sustained_fraction_se"])
                                              for g, v in gpus.items()},
                       default_se=max((float(v["sustained_fraction_se"]) for v in gpus.values()),
                                      default=0.0),
                       provenance=dict(data.get("provenance", {})))
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"band model: entry {problem} is missing or malformed; refit with "
                             "python -m validate.fit_bands") from None


#: Order of the bias covariance's rows and columns: the components, then the constant.
COVARIANCE_ORDER = (*COMPONENTS, "constant")


def _covariance(entry: Mapping[str, object]) -> tuple[tuple[float, ...], ...]:
    """The bias covariance of a band file's entry (``order`` and ``matrix``), checked."""
    if list(entry["order"]) != list(COVARIANCE_ORDER):
        raise ValueError(f"bias_covariance.order: {list(entry['order'])!r} is not valid; "
                         f"valid: {list(COVARIANCE_ORDER)} (refit: python -m validate.fit_bands)")
    matrix = tuple(tuple(float(v) for v in row) for row in entry["matrix"])
    if len(matrix) != len(COVARIANCE_ORDER) or any(len(r) != len(matrix) for r in matrix):
        raise ValueError(f"bias_covariance.matrix: {len(matrix)} rows is not valid; give "
                         f"{len(COVARIANCE_ORDER)} rows of {len(COVARIANCE_ORDER)} "
                         "(refit: python -m validate.fit_bands)")
    return matrix


@lru_cache(maxsize=4)
def load_band_model(path: str | None = None) -> BandModel:
    """The band model of ``path`` (default :data:`BAND_FILE`), read once.

    Raises:
        ValueError: for an unreadable or malformed file (one line naming it).
    """
    path = Path(path) if path else BAND_FILE
    try:
        return BandModel.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as problem:
        raise ValueError(f"band model {path}: cannot read it ({problem})") from None


def band_shares(breakdown: Mapping[str, float], step_s: float, *, dtype: str, moe: bool,
                overhead_reference_s: float = 1.0) -> dict[str, float]:
    """The share of each component (:data:`COMPONENTS`) of a step of ``step_s`` seconds
    with ``breakdown`` (seconds per category, :mod:`sim.breakdown`): compute and the
    optimizer go to the compute class of ``dtype`` (fp8 or 16-bit) and of the model
    (``moe``); the overhead's share is ``min(1, overhead_reference_s / step_s)``.

    Raises:
        ValueError: for a step time that is not positive.
    """
    if not step_s > 0:
        raise ValueError(f"step_s: {step_s!r} is not a positive number of seconds")
    shares = dict.fromkeys(COMPONENTS, 0.0)
    compute_class = f"compute_{'fp8' if 'fp8' in dtype else 'bf16'}_{'moe' if moe else 'dense'}"
    shares[compute_class] = (breakdown.get("compute", 0.0)
                             + breakdown.get("optimizer", 0.0)) / step_s
    for axis in AXES:
        shares[f"exposed_{axis}"] = breakdown.get(f"exposed_{axis}", 0.0) / step_s
    shares["bubble"] = breakdown.get("bubble", 0.0) / step_s
    shares["overhead"] = min(1.0, overhead_reference_s / step_s)
    return shares


def compute_share(shares: Mapping[str, float]) -> float:
    """The compute share of :func:`band_shares` (whatever its class)."""
    return sum(shares[k] for k in COMPUTE_CLASSES)


def model_terms(model: BandModel, shares: Mapping[str, float]) -> tuple[float, float]:
    """(mean, standard deviation) of the model-error term ``L_model`` (log units):
    the fitted biases' mean, and the spread of a new source's step (module docstring:
    the biases' uncertainty ``x' C x``, the source offset, the per-row spread), times
    the conformal ``scale``."""
    mean = model.bias_0 + sum(shares[k] * model.bias[k] for k in COMPONENTS)
    x = [*(shares[k] for k in COMPONENTS), 1.0]
    used = [i for i, v in enumerate(x) if v]  # most components are absent from a step
    covariance = model.bias_covariance
    uncertainty = sum(x[i] * x[j] * covariance[i][j] for i in used for j in used)
    variance = (uncertainty + model.sigma_0 ** 2 + model.sigma_source ** 2
                + sum((shares[k] * model.sigma[k]) ** 2 for k in COMPONENTS))
    return mean, model.scale * math.sqrt(variance)


def slowest_of_n(n: int, u: np.ndarray) -> np.ndarray:
    """The largest of ``n`` standard normals at probabilities ``u`` (order statistics:
    ``Phi^-1(u^(1/n))``; exact for every ``n`` >= 1)."""
    tail = -np.expm1(np.log(u) / max(int(n), 1))  # 1 - u^(1/n), accurate when tiny
    inverse = NormalDist().inv_cdf
    return np.array([-inverse(float(t)) for t in tail])


@lru_cache(maxsize=256)
def _slowest_grid(n: int, samples: int) -> np.ndarray:
    """:func:`slowest_of_n` at the stratified probabilities ``(i + 1/2) / samples``."""
    grid = slowest_of_n(n, (np.arange(samples) + 0.5) / samples)
    grid.flags.writeable = False
    return grid


@dataclass(frozen=True)
class StepBand:
    """A step's prediction band (seconds) and what it is made of.

    Attributes:
        p10_s, p50_s, p90_s: quantiles of the step a real run would measure.
        ratios: the sorted draws of measured / simulated (to combine with other spreads).
        terms: the terms' sizes: ``model_bias``, ``model_sigma`` (log units),
            ``sustained_fraction_se``, ``speed_spread``, ``slow_of_n_median`` (the
            median factor on compute), ``compute_share``.
    """

    p10_s: float
    p50_s: float
    p90_s: float
    ratios: np.ndarray = field(repr=False)
    terms: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the quantiles and the terms."""
        return {"p10_s": self.p10_s, "p50_s": self.p50_s, "p90_s": self.p90_s,
                "terms": dict(self.terms)}

    def overlaps(self, other: "StepBand") -> bool:
        """Whether the two 80 % bands share any step time."""
        return self.p10_s <= other.p90_s and other.p10_s <= self.p90_s


def step_band(step_s: float, shares: Mapping[str, float], *, gpus: int, gpu_name: str,
              speed_spread: float, model: BandModel | None = None, seed: int = SEED,
              samples: int = SAMPLES) -> StepBand:
    """The prediction band of a simulated step (module docstring).

    Args:
        step_s: the simulated step time (seconds).
        shares: its components' shares (:func:`band_shares`).
        gpus: ranks of the job (the step waits for the slowest).
        gpu_name: the GPU's name (``cluster.gpu.name``), for its calibration spread.
        speed_spread: the GPUs' relative speed spread the step was priced with
            (``cluster.gpu.speed_spread``; 0 = GPUs alike, no run-to-run term).
        model: the fitted terms (default :func:`load_band_model`).
        seed, samples: the draws (same seed, same band).

    Raises:
        ValueError: for a step time that is not positive, ``gpus`` below 1 or a bad
            spread.
    """
    if not step_s > 0:
        raise ValueError(f"step_s: {step_s!r} is not a positive number of seconds")
    if gpus < 1:
        raise ValueError(f"gpus: {gpus!r} is not valid; give 1 or more")
    model = model or load_band_model()
    normal, _ = _draws(seed, samples)
    mean, sigma = model_terms(model, shares)
    f_compute = compute_share(shares)
    se = model.sustained_fraction_se.get(gpu_name, model.default_se)
    slow, slow_median = _slow_factor(int(gpus), float(speed_spread), seed, samples)
    compute_factor = np.exp(se * normal[1]) * slow
    log_ratio = mean + sigma * normal[0] + np.log1p(f_compute * (compute_factor - 1))
    ratios = np.sort(np.exp(log_ratio))
    # (one call for the three quantiles: the same numbers as one call each)
    p10, p50, p90 = (float(step_s * q) for q in np.quantile(ratios, QUANTILES))
    terms = {"model_bias": mean, "model_sigma": sigma, "sustained_fraction_se": se,
             "speed_spread": float(speed_spread), "slow_of_n_median": slow_median,
             "compute_share": f_compute}
    return StepBand(p10, p50, p90, ratios, terms)


@lru_cache(maxsize=16)
def _draws(seed: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The band's random draws for ``seed``: standard normals (2 x samples) and the
    permutation pairing the stratified slowest-GPU draws, drawn once per seed (the same
    generator calls, in the same order, as drawing them per band)."""
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((2, samples))
    order = rng.permutation(samples)  # stratified draws of the slowest GPU, paired at random
    normal.flags.writeable = False
    order.flags.writeable = False
    return normal, order


@lru_cache(maxsize=1024)
def _slow_factor(gpus: int, speed_spread: float, seed: int, samples: int
                 ) -> tuple[np.ndarray, float]:
    """The slowest-GPU factor on the compute share of each draw, over the expected
    slowest GPU the step was priced at (module docstring, term 3), and its median; once
    per job size and spread."""
    _, order = _draws(seed, samples)
    priced = expected_slowest_factor(speed_spread, gpus)
    slow = (1 + speed_spread * _slowest_grid(gpus, samples)[order]) / priced
    slow.flags.writeable = False
    return slow, float(np.median(slow))
