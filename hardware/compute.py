"""Compute model: how long one compute op (a kernel) runs on one GPU.

Roofline over FLOPs and HBM bytes, with a compute efficiency that depends on the op's
size::

    time_s = kernel_launch_s + max(flops / (peak_flops_per_s[dtype] * efficiency),
                                   bytes / (hbm_bytes_per_s * memory_efficiency))

``efficiency`` by op kind:

* ``matmul``: the measured GEMM efficiency curve of the GPU's ``matmul_profile``
  (``hardware/data/matmul_efficiency.csv``, derived by ``tools/derive_matmul_efficiency.py``
  from OpenXLA's GEMM table and stas00's mamf-finder maxima; see ``hardware/data/README.md``),
  keyed by the GEMM's work ``flops = 2*b*m*n*k`` and interpolated in log-log space. The
  curve is of the profile's reference GPU; a GPU whose peak differs (e.g. an H100 PCIe on
  the ``sm_90`` profile) reads it at the same *ideal time* ``flops / peak`` and the plateau
  is rescaled to its own ``matmul_peak_efficiency``, never exceeded.
* ``attention``: the matmul curve at the op's flops times :data:`ATTENTION_EFFICIENCY_FACTOR`.
* ``elementwise``, ``norm``, ``memcpy``, ``optimizer``, ``other``: memory-bound kernels on
  CUDA cores; their flops run at :data:`VECTOR_EFFICIENCY` of the non-tensor-core rate.

The table was measured as *kernel* time (CUPTI, no host launch cost), so the GpuSpec's
``kernel_launch_s`` is added on top: it stands for the launch/dispatch gap between
consecutive kernels on a stream.

Units: seconds (``_s``), FLOP/s (``_flops_per_s``), bytes. :meth:`ComputeModel.duration_ns`
rounds up to whole nanoseconds for the engine.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Mapping, Protocol

from hardware.spec import COMPUTE_KINDS, GpuSpec
from hardware.units import DTYPE_ALIASES, canonical_dtype, seconds_to_ns



class ComputeOp(Protocol):
    """What the compute model reads from an op (strategies.ir.ComputeOp has it).

    The hardware layer does not import the IR: any object with these fields works.
    """

    name: str
    kind: str
    flops: float
    bytes: float
    dtype: str


@dataclass(frozen=True)
class _Work:
    """Minimal op used internally to query an efficiency."""

    name: str
    kind: str = "matmul"
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"

#: File inside :mod:`hardware.data` holding the efficiency curves.
EFFICIENCY_TABLE = "matmul_efficiency.csv"

#: Flash-attention reaches a lower fraction of peak than a GEMM of the same work: the
#: softmax/rescaling between its two GEMMs runs on the (16x slower) non-tensor units and
#: the backward pass has extra dependencies. Sources: FlashAttention-2 (Dao 2023,
#: arXiv 2307.08691) reaches 50-73 % of A100 peak in the forward pass (GEMM: 87 %,
#: mamf), i.e. 0.6-0.85 of GEMM, and less in the backward; FlashAttention-3 (Shah et al.
#: 2024, arXiv 2407.08608) reaches up to 75 % of H100 peak forward (GEMM: 80 %), ~0.93,
#: with the backward 1.5-1.75x FA2's (~0.6 of GEMM); FA2 on H100 reaches only ~35 %
#: (~0.45 of GEMM). Assumption: 0.7 for a fwd+bwd mix of a modern kernel (the backward
#: has ~2.5x the forward's flops). Override per model with ``attention_efficiency_factor``.
ATTENTION_EFFICIENCY_FACTOR = 0.7

#: Fraction of the CUDA-core (non-tensor) FLOP rate that elementwise, norm, optimizer and
#: other vector kernels reach on their arithmetic. Assumption: these kernels are memory
#: bound, the value matters only for unusually arithmetic-heavy ones (exp/erf/rsqrt go to
#: the slower SFUs), so half the FMA rate is a deliberately modest ceiling.
VECTOR_EFFICIENCY = 0.5

#: Kinds timed with the matmul curve; every other kind is a vector (CUDA-core) kernel.
TENSOR_CORE_KINDS = ("matmul", "attention")

#: Which measured curve a dtype's matmuls follow when the profile has no curve of its own.
#: fp16 runs on the same tensor-core datapath as bf16; IEEE fp32 (CUDA cores, PyTorch's
#: default with ``allow_tf32=False``) and fp64 follow the TF32 curve read at their own,
#: much lower peak; fp4 follows fp8. Last resort: bf16.
CURVE_FOR_DTYPE: Mapping[str, tuple[str, ...]] = {
    "bf16": ("bf16",),
    "fp16": ("fp16", "bf16"),
    "tf32": ("tf32", "bf16"),
    "fp32": ("fp32", "tf32", "bf16"),
    "fp64": ("fp64", "tf32", "bf16"),
    "fp8": ("fp8", "bf16"),
    "fp4": ("fp4", "fp8", "bf16"),
}


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class EfficiencyCurve:
    """One tabulated curve: efficiency (fraction of ``peak_flops_per_s``) vs GEMM flops.

    Attributes:
        log_flops: natural log of the knot flop counts, increasing.
        log_efficiency: natural log of the efficiency at each knot.
        peak_flops_per_s: dense peak of the reference GPU the efficiencies are relative to.
    """

    log_flops: tuple[float, ...]
    log_efficiency: tuple[float, ...]
    peak_flops_per_s: float

    @property
    def plateau(self) -> float:
        """Efficiency of the largest GEMMs (the last knot)."""
        return math.exp(self.log_efficiency[-1])

    def __call__(self, flops: float) -> float:
        """Efficiency at ``flops``: log-log linear interpolation, clamped outside the knots."""
        if flops <= 0.0:
            return math.exp(self.log_efficiency[0])
        x = math.log(flops)
        xs = self.log_flops
        if x <= xs[0]:
            return math.exp(self.log_efficiency[0])
        if x >= xs[-1]:
            return math.exp(self.log_efficiency[-1])
        i = bisect.bisect_right(xs, x)
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.log_efficiency[i - 1], self.log_efficiency[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@lru_cache(maxsize=1)
def load_efficiency_table() -> Mapping[str, Mapping[str, EfficiencyCurve]]:
    """``{profile: {dtype: EfficiencyCurve}}`` from ``hardware/data/matmul_efficiency.csv``."""
    text = resources.files("hardware.data").joinpath(EFFICIENCY_TABLE).read_text()
    rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in csv.DictReader(text.splitlines()):
        rows.setdefault((r["profile"], r["dtype"]), []).append(
            (float(r["flops"]), float(r["efficiency"]), float(r["peak_flops_per_s"]))
        )
    table: dict[str, dict[str, EfficiencyCurve]] = {}
    for (profile, dtype), knots in rows.items():
        knots.sort()
        table.setdefault(profile, {})[dtype] = EfficiencyCurve(
            log_flops=tuple(math.log(f) for f, _, _ in knots),
            log_efficiency=tuple(math.log(e) for _, e, _ in knots),
            peak_flops_per_s=knots[0][2],
        )
    return table


def matmul_profiles() -> tuple[str, ...]:
    """Profiles the efficiency table provides, sorted."""
    return tuple(sorted(load_efficiency_table()))


def _curve(profile: str, dtype: str) -> tuple[str, EfficiencyCurve]:
    """The curve a (profile, canonical dtype) uses and the curve's own dtype."""
    table = load_efficiency_table()
    if profile not in table:
        raise ValueError(
            f"matmul_profile: {profile!r} has no efficiency curve; valid profiles: "
            f"{', '.join(sorted(table))}"
        )
    curves = table[profile]
    for candidate in CURVE_FOR_DTYPE.get(dtype, (dtype,)):
        if candidate in curves:
            return candidate, curves[candidate]
    raise ValueError(
        f"dtype: {dtype!r} has no matmul curve in profile {profile!r}; valid dtypes: "
        f"{', '.join(sorted(curves))}"
    )


def matmul_efficiency(profile: str, dtype: str, flops: float) -> float:
    """Measured GEMM efficiency of a profile's reference GPU.

    Args:
        profile: ``"sm_80"``, ``"sm_90"`` or ``"sm_100"`` (see :func:`matmul_profiles`).
        dtype: input dtype (aliases accepted); fp16 uses the bf16 curve.
        flops: work of the GEMM, ``2*b*m*n*k``.

    Returns:
        Achieved fraction of the reference GPU's dense peak for ``dtype`` (the
        ``peak_flops_per_s`` column of the table), interpolated in log-log space and
        clamped outside the tabulated range.

    Raises:
        ValueError: unknown profile or dtype, or negative flops.
    """
    if flops < 0 or math.isnan(flops):
        raise ValueError(f"flops: {flops!r} must be >= 0")
    _, curve = _curve(profile, canonical_dtype(dtype))
    return curve(flops)


# ------------------------------------------------------------------------------- model


@dataclass(frozen=True, eq=False)
class ComputeModel:
    """Roofline compute model of one GPU (see the module docstring for the formula).

    Attributes:
        gpu: the accelerator.
        attention_efficiency_factor: attention efficiency as a fraction of a GEMM of the
            same flops (default :data:`ATTENTION_EFFICIENCY_FACTOR`).
        vector_efficiency: fraction of the CUDA-core FLOP rate vector kernels reach
            (default :data:`VECTOR_EFFICIENCY`).

    Raises:
        ValueError: the GPU's ``matmul_profile`` is not in the table, or a field is out of
            range.
    """

    gpu: GpuSpec
    attention_efficiency_factor: float = ATTENTION_EFFICIENCY_FACTOR
    vector_efficiency: float = VECTOR_EFFICIENCY
    _peaks: Mapping[str, float] = field(init=False, repr=False)
    _plateau_scale: float = field(init=False, repr=False)
    _plans: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        gpu = self.gpu
        table = load_efficiency_table()
        if gpu.matmul_profile not in table:
            raise ValueError(
                f"matmul_profile: {gpu.matmul_profile!r} of GPU {gpu.name!r} has no efficiency "
                f"curve; valid profiles: {', '.join(sorted(table))}"
            )
        for name, value in (
            ("matmul_peak_efficiency", gpu.matmul_peak_efficiency),
            ("memory_efficiency", gpu.memory_efficiency),
            ("attention_efficiency_factor", self.attention_efficiency_factor),
            ("vector_efficiency", self.vector_efficiency),
        ):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: {value!r} must be in (0, 1]")
        if gpu.hbm_bytes_per_s <= 0:
            raise ValueError(f"hbm_bytes_per_s: {gpu.hbm_bytes_per_s!r} must be > 0")
        if gpu.kernel_launch_s < 0:
            raise ValueError(f"kernel_launch_s: {gpu.kernel_launch_s!r} must be >= 0")
        peaks: dict[str, float] = {}
        for key, value in gpu.peak_flops_per_s.items():
            if value <= 0:
                raise ValueError(f"peak_flops_per_s[{key!r}]: {value!r} must be > 0")
            try:
                peaks[canonical_dtype(key)] = float(value)
            except ValueError:  # a dtype this model has no alias for (e.g. int8): keep as is
                peaks[str(key).lower()] = float(value)
        if not peaks:
            raise ValueError("peak_flops_per_s: empty; give at least one dtype's peak FLOP/s")
        object.__setattr__(self, "_peaks", peaks)
        object.__setattr__(self, "_plans", {})
        # The table's curves end at the reference GPU's max achievable efficiency (mamf, bf16
        # for the profile's bf16 curve); this GPU's own maximum rescales every curve.
        reference = table[gpu.matmul_profile].get("bf16")
        ref_plateau = reference.plateau if reference is not None else gpu.matmul_peak_efficiency
        object.__setattr__(self, "_plateau_scale", gpu.matmul_peak_efficiency / ref_plateau)

    # -- inputs ----------------------------------------------------------------------

    def valid_dtypes(self) -> tuple[str, ...]:
        """Canonical dtypes this GPU has a peak FLOP/s for, sorted."""
        return tuple(sorted(self._peaks))

    def _dtype(self, op: ComputeOp) -> str:
        dtype = canonical_dtype(op.dtype, field=f"ComputeOp {op.name!r} dtype")
        if dtype not in self._peaks:
            raise ValueError(
                f"ComputeOp {op.name!r} dtype: {op.dtype!r} is not supported by GPU "
                f"{self.gpu.name!r}; valid dtypes: {', '.join(self.valid_dtypes())}"
            )
        return dtype

    def _plan(self, op: ComputeOp) -> tuple:
        """Validated, cached per (kind, dtype spelling): how to get the op's compute rate.

        ``(peak_flops_per_s, curve, reference_flops_ratio, factor)`` for tensor-core kinds,
        ``(rate_flops_per_s, None, 0.0, 1.0)`` for vector kinds.
        """
        key = (op.kind, op.dtype)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        if op.kind not in COMPUTE_KINDS:
            raise ValueError(
                f"ComputeOp {op.name!r} kind: {op.kind!r} is not a compute kind; valid kinds: "
                f"{', '.join(COMPUTE_KINDS)}"
            )
        dtype = self._dtype(op)
        peak = self._peaks[dtype]
        if op.kind in TENSOR_CORE_KINDS:
            _, curve = _curve(self.gpu.matmul_profile, dtype)
            factor = self.attention_efficiency_factor if op.kind == "attention" else 1.0
            plan = (peak, curve, curve.peak_flops_per_s / peak, factor)
        else:
            # Vector kernels run on CUDA cores: bounded by the fp32 FMA rate (bf16/fp16/fp8
            # math is done in fp32 registers), or the dtype's own rate when lower (fp64).
            vector_peak = min(peak, self._peaks.get("fp32", math.inf))
            plan = (vector_peak * self.vector_efficiency, None, 0.0, 1.0)
        self._plans[key] = plan
        return plan

    @staticmethod
    def _check_work(op: ComputeOp) -> None:
        for name, value in (("flops", op.flops), ("bytes", op.bytes)):
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"ComputeOp {op.name!r} {name}: {value!r} must be finite and >= 0")

    # -- efficiencies ------------------------------------------------------------------

    def _tensor_eff(self, curve: EfficiencyCurve, ratio: float, flops: float) -> float:
        eff = curve(flops * ratio) * self._plateau_scale
        mpe = self.gpu.matmul_peak_efficiency
        return eff if eff < mpe else mpe

    def tensor_efficiency(self, dtype: str, flops: float) -> float:
        """GEMM efficiency of *this* GPU: fraction of ``peak_flops_per_s[dtype]``.

        The profile's curve is read at the flops the reference GPU would need for the same
        ideal time (``flops * reference_peak / this_peak``) and rescaled by
        ``matmul_peak_efficiency / reference plateau``; capped at ``matmul_peak_efficiency``.
        """
        canon = canonical_dtype(dtype)
        if canon not in self._peaks:
            raise ValueError(
                f"dtype: {dtype!r} is not supported by GPU {self.gpu.name!r}; valid dtypes: "
                f"{', '.join(self.valid_dtypes())}"
            )
        _, curve, ratio, _ = self._plan(_Work(name="tensor_efficiency", dtype=canon))
        return self._tensor_eff(curve, ratio, flops)

    def compute_flops_per_s(self, op: ComputeOp) -> float:
        """FLOP/s the op's arithmetic runs at (the compute side of the roofline)."""
        self._check_work(op)
        peak_or_rate, curve, ratio, factor = self._plan(op)
        if curve is None:
            return peak_or_rate
        return peak_or_rate * self._tensor_eff(curve, ratio, op.flops) * factor

    def memory_bytes_per_s(self) -> float:
        """Achievable HBM bandwidth, bytes/s."""
        return self.gpu.hbm_bytes_per_s * self.gpu.memory_efficiency

    # -- durations -------------------------------------------------------------------

    def kernel_time_s(self, op: ComputeOp) -> float:
        """Kernel execution time without the launch overhead, seconds (what a profiler
        shows): the roofline over microbenchmark rates, slowed by the GPU's
        ``sustained_fraction`` (clocks under continuous training load)."""
        rate = self.compute_flops_per_s(op)
        compute_s = op.flops / rate if op.flops > 0 else 0.0
        memory_s = op.bytes / (self.gpu.hbm_bytes_per_s * self.gpu.memory_efficiency)
        return max(compute_s, memory_s) / self.gpu.sustained_fraction

    def duration_s(self, op: ComputeOp) -> float:
        """Time the op occupies its stream, seconds: ``kernel_launch_s`` + roofline time."""
        return self.gpu.kernel_launch_s + self.kernel_time_s(op)

    def duration_ns(self, op: ComputeOp) -> int:
        """:meth:`duration_s` rounded up to whole nanoseconds."""
        return seconds_to_ns(self.duration_s(op))

    def bound(self, op: ComputeOp) -> str:
        """``"compute"``, ``"memory"`` or ``"launch"`` (no work): what limits the op."""
        rate = self.compute_flops_per_s(op)
        compute_s = op.flops / rate if op.flops > 0 else 0.0
        memory_s = op.bytes / self.memory_bytes_per_s()
        if compute_s == 0.0 and memory_s == 0.0:
            return "launch"
        return "compute" if compute_s >= memory_s else "memory"


def achieved_flops_per_s(gpu: GpuSpec, op: ComputeOp, *, include_launch: bool = False) -> float:
    """FLOP/s the model predicts for ``op`` on ``gpu``.

    Args:
        include_launch: divide by :meth:`ComputeModel.duration_s` (launch included) instead
            of the kernel time. The default matches profiler-measured kernel FLOP/s, which
            is how the GEMM table (CUPTI kernel durations) was measured.

    Returns 0.0 for an op without flops.
    """
    model = ComputeModel(gpu)
    seconds = model.duration_s(op) if include_launch else model.kernel_time_s(op)
    return op.flops / seconds if op.flops > 0 and seconds > 0 else 0.0
