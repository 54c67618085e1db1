"""Compute model: how long one compute op (a kernel) runs on one GPU.

Roofline over FLOPs and HBM bytes, with a compute efficiency that depends on the op's
size::

    time_s = kernel_launch_s * launches
             + max(flops / (peak_flops_per_s[dtype] * efficiency),
                   bytes / (hbm_bytes_per_s * memory_efficiency)) / sustained_fraction

``efficiency`` by op kind:

* ``matmul``: the measured GEMM efficiency curve of the GPU's ``matmul_profile``
  (``hardware/data/matmul_efficiency.csv``, derived by ``tools/derive_matmul_efficiency.py``
  from OpenXLA's GEMM table and stas00's mamf-finder maxima; see ``hardware/data/README.md``),
  keyed by the GEMM's work ``flops = 2*b*m*n*k`` and interpolated in log-log space. The
  curve is of the profile's reference GPU; a GPU whose peak differs (e.g. an H100 PCIe on
  the ``sm_90`` profile) reads it at the same *ideal time* ``flops / peak`` and the plateau
  is rescaled to its own ``matmul_peak_efficiency``, never exceeded.
* ``attention``: the fused-attention kernel's measured efficiency
  (``hardware/data/attention_efficiency.csv``, derived by
  ``tools/derive_attention_efficiency.py`` from the FlashAttention-2/-3 papers' benchmarks)
  for the op's *implementation* (FlashAttention 1/2/3, cuDNN, Triton: the software stack
  picks it), pass (forward or backward), causal mask, head dimension and sequence length
  (see :func:`attention_efficiency`). The op says which implementation through an
  ``impl`` attribute (``""``: the model's ``attention_impl``, else what Transformer Engine
  runs on the architecture, :data:`DEFAULT_ATTENTION_IMPL`), which pass through a
  ``phase`` attribute or its name, and its shape ``(b, heads, kv_heads, s_q, s_k, d)``.
* ``elementwise``, ``norm``, ``memcpy``, ``optimizer``, ``other``: memory-bound kernels on
  CUDA cores; their flops run at :data:`VECTOR_EFFICIENCY` of the non-tensor-core rate and
  their bytes at ``memory_efficiency`` of the HBM rate (the presets take it from STREAM-style
  scale/triad measurements). What they move -- fused or eager, fp32 cross entropy, Adam
  passes -- is ``strategies.model_costs``'s business.

The GEMM table was measured as *kernel* time (CUPTI, no host launch cost), so the GpuSpec's
``kernel_launch_s`` is added on top, once per GPU kernel the op stands for (an op's
``launches`` attribute: an eager RMSNorm is 8 ATen kernels): it stands for the minimal
kernel's duration and the launch gap between consecutive kernels on a stream. It is also
why small kernels do not reach the datasheet bandwidth: a memory-bound kernel of ``x``
bytes achieves ``x / (kernel_launch_s + x / B)`` with ``B = hbm_bytes_per_s *
memory_efficiency``, half of ``B`` at ``x = B * kernel_launch_s`` (~12 MB on an H100).

**The host.** A stack issues every kernel from a CPU thread (:data:`HOST_ISSUE_S`: eager
PyTorch, torch.compile, CUDA graphs). Kernels queue, so the CPU only matters when a run of
kernels is shorter than their issue time: :meth:`ComputeModel.issue_bound_time_s` prices a
serial stream that way (the scheduler decides where streams and synchronisations are).

Units: seconds (``_s``), FLOP/s (``_flops_per_s``), bytes. :meth:`ComputeModel.duration_ns`
rounds up to whole nanoseconds for the engine.
"""

from __future__ import annotations

import bisect
import csv
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from statistics import NormalDist
from typing import Mapping, Protocol, Sequence

from hardware.spec import ATTENTION_IMPLS, COMPUTE_KINDS, GpuSpec
from hardware.units import canonical_dtype, seconds_to_ns



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

#: File inside :mod:`hardware.data` holding the fused-attention efficiencies.
ATTENTION_TABLE = "attention_efficiency.csv"


#: What a stack that does not say runs: Transformer Engine's choice. It prefers cuDNN
#: FusedAttention on Hopper and newer ("Disabling FlashAttention to give FusedAttention
#: preference on Hopper+ for performance reasons", transformer_engine/pytorch/attention
#: backend selection) and flash-attn (FA2) on Ampere.
#:
#: Since which TE release (issue 12, checked for the NeMo 24.03-24.07 rows): TE 1.0/1.1
#: ranked "FlashAttention > FusedAttention (cuDNN) > UnfusedDotProductAttention" and ran
#: context parallelism with flash-attn only ("Context parallelism is only implemented with
#: Flash Attention!", DotProductAttention.forward); TE 1.2 (release notes, 2024-01: "Performance
#: of DotProductAttention is increased on Hopper GPUs by utilizing cuDNN") gave cuDNN the
#: preference on Hopper, and TE PR #572 ("port cuDNN Flash Attn API to CP implementation",
#: merged 2024-01) let the CP ring run it too. The NeMo containers the published rows name
#: all ship a later TE (NeMo Framework "Software Component Versions": 24.05 TE 1.6.0.dev0,
#: 24.07 TE 1.8.0.dev0, 24.09 TE 1.10; 24.03 sits between 1.2 and 1.6), so on Hopper every
#: one of them runs cuDNN: no row of the data predates the switch. NeMo 24.03 in detail (the
#: ``nemo_longseq_0*`` rows, the only rows of that release): the NeMo README of the 24.03
#: container pins ``te_commit=bfe21c3d68b0a9951e5716fb520045db53419c5e`` on
#: ``nvcr.io/nvidia/pytorch:24.02-py3`` (a pre-1.7 TE main commit, installed over the base
#: container's TE); the launcher recipe (NeMo-Framework-Launcher
#: ``conf/training/llama/llama2_7b.yaml``) sets ``use_flash_attention: true`` and no
#: ``NVTE_FUSED_ATTN``/``NVTE_FLASH_ATTN``, and no ``fp8_dpa`` (attention runs BF16 inside
#: the FP8 autocast); TE's ``DotProductAttention.forward`` keeps FusedAttention under
#: context parallelism when the backend is ``F16_arbitrary_seqlen`` (``not context_parallel
#: or fused_attention_backend == FusedAttnBackend["F16_arbitrary_seqlen"]``) and then, on
#: sm90, drops FlashAttention ("Select FusedAttention on sm90 and FlashAttention on others
#: for performance") -- read in the stored pre-1.8 source (flash-attn max 2.5.8, the TE
#: 1.6-1.7 line; the commit itself is not stored, the 1.2 release notes date the rule before
#: it); NeMo's own docs (PR #9188, 2024-05): TE "prefers cuDNN flash attention on Hopper+".
#: So those rows ran cuDNN, with and without CP. Which cuDNN differs: NeMo 24.03
#: is built on NGC PyTorch 24.02, cuDNN 9.0.0.306; the ``sm_90`` cuDNN rows are cuDNN 9.1.1
#: (FA3 paper). No measured 9.0 rate was found, so one ``cudnn`` curve serves every era;
#: ``tools/longseq_attention_rates.py`` shows what the rows imply (hardware/data/README.md:
#: between the priced cuDNN 9.1 and FA2 rates, so FA2 is not the answer either).
DEFAULT_ATTENTION_IMPL: Mapping[str, str] = {"sm_80": "fa2", "sm_90": "cudnn", "sm_100": "cudnn"}

#: An implementation that does not run on an architecture falls back to the first of these
#: that does (FA3 is Hopper-only; the table has no Triton rows for Blackwell).
ATTENTION_FALLBACK: Mapping[str, tuple[str, ...]] = {
    "fa3": ("cudnn", "fa2"), "triton": ("cudnn", "fa2"), "cudnn": ("fa2",),
    "fa2": ("cudnn",), "fa1": ("fa2",),
}

#: Head dim and sequence length assumed for an attention op that carries no shape
#: (a Llama-style head of 128 at a 4k context).
DEFAULT_ATTENTION_HEAD_DIM = 128
DEFAULT_ATTENTION_SEQ_LEN = 4096

#: CPU time to issue one GPU kernel, seconds, by how the software stack launches.
#: ``eager``: PyTorch eager mode, a Python call through the autograd and ATen dispatchers to
#: ``cudaLaunchKernel`` per op: 5-25 us of CPU work per op (J. Lin, "From PyTorch op to kernel
#: launch": Python ~1, pybind ~1, autograd 1-3, dispatcher 1-2, backend 1-5, driver 1-3 us);
#: assumption: 10 us, the middle of that range on a server CPU. ``compiled``: torch.compile's
#: generated wrapper calls its (fused) kernels directly, skipping the Python op, autograd and
#: dispatcher layers: the driver and backend part, assumption 4 us. ``graphed``: CUDA graphs
#: (Megatron ``--enable-cuda-graph``/``--external-cuda-graph``, torch.compile
#: ``mode="reduce-overhead"``): one graph launch for a whole captured region; per kernel
#: nothing beyond the GPU-side gap ``kernel_launch_s`` already priced, 0.
HOST_ISSUE_S: Mapping[str, float] = {"eager": 10e-6, "compiled": 4e-6, "graphed": 0.0}

#: CPU time of one eager PyTorch call that launches no kernel (``torch.empty`` from the
#: caching allocator, a view, ``torch.split``), seconds, on the reference host (below).
#: NVIDIA's DeepSeek-V3 GB200 guide (Megatron-LM docs/discussions/deepseek-v3-gb200-
#: optimization, Section 2): "a simple ``torch.empty`` will not call any CUDA kernel, but
#: it will generate a few microseconds of overhead on the host side". Assumption: 3 us,
#: the Python, pybind and dispatcher layers of :data:`HOST_ISSUE_S`'s breakdown (~1 us
#: each) without the backend launch and driver parts.
HOST_CALL_S = 3e-6

#: CPU time of one Transformer Engine module call (``te.Linear``/``LayerNormLinear``/
#: ``GroupedLinear``/``DotProductAttention`` forward, or its autograd backward) beyond the
#: kernels it launches, seconds, on the reference host: FP8 recipe/quantizer set-up,
#: parameter and workspace checks, the custom autograd Function's context. TE issue 2053
#: ("High CPU overhead on Grace systems", 2025-08) measured the CPU time of one BF16
#: ``Linear`` forward (hidden 2048, 8192 tokens): ``torch.nn.Linear`` 37.08 us and
#: ``te.Linear`` 99.66 us on GB200; the difference, 62.6 us on Grace, is 62.6 / 2.75 =
#: 22.8 us on the reference host (:data:`HOST_CPU_FACTOR` of Grace).
HOST_MODULE_S = 22.8e-6

#: Host CPU time relative to the reference host, an Intel Xeon Platinum 8480C (DGX H100),
#: by host CPU (``GpuSpec.host_cpu``). TE issue 2053 measured one ``torch.nn.Linear``
#: forward's CPU time (PyTorch dispatch and one cuBLAS launch) at 13.48 us on DGX H100,
#: 37.08 us on GB200 and 33.17 us on GH200 (both Grace): Grace 37.08 / 13.48 = 2.75.
#: Assumption: DGX B200's Xeon Platinum 8570 (the same Sapphire/Emerald Rapids core
#: family) and the AMD EPYC hosts run the framework at the reference speed.
HOST_CPU_FACTOR: Mapping[str, float] = {"x86": 1.0, "grace": 37.08 / 13.48}

#: Concurrent GEMMs of a grouped GEMM: Transformer Engine's ``GroupedLinear`` (Megatron-Core's
#: ``TEGroupedMLP`` for ``--moe-grouped-gemm``) runs its per-expert cuBLAS GEMMs on the
#: multi-stream pool of ``nvte_get_num_compute_streams()``, 4 streams
#: (transformer_engine/common/util/multi_stream.cpp).
GROUPED_GEMM_STREAMS = 4

_PHASE_IN_NAME = re.compile(r"\.([FBIW])\d*(?:\.|$)")

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


#: Largest ``GpuSpec.speed_spread`` a preset may give: a relative standard deviation of
#: 20 % is ten times the measured fleets' (:func:`expected_slowest_factor`), so anything
#: above it is a typo (a percentage given as a number: 1.5 for 1.5 %).
MAX_SPEED_SPREAD = 0.2


def expected_slowest_z(gpus: int) -> float:
    """Expected largest of ``gpus`` independent standard normal draws, by Blom's
    approximation ``Phi^-1((n - 0.375) / (n + 0.25))`` (G. Blom, *Statistical Estimates
    and Transformed Beta-Variables*, 1958): 0 for one GPU, 1.434 for 8, 3.427 for 2048.
    It is within 0.03 of the exact expected maximum (the integral of
    ``x n Phi(x)^(n-1) phi(x)``, tabulated by H. L. Harter, Biometrika 48, 1961):
    0.589 against 0.564 for two GPUs, 3.427 against 3.442 for 2048.

    Raises:
        ValueError: for a GPU count that is not an integer >= 1.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus: {gpus!r} is not valid; give an integer >= 1")
    return NormalDist().inv_cdf((gpus - 0.375) / (gpus + 0.25))


def expected_slowest_factor(speed_spread: float, gpus: int) -> float:
    """How much longer a kernel runs on the expected slowest of ``gpus`` GPUs than on the
    fleet's mean GPU, when the GPUs' sustained kernel times have relative standard
    deviation ``speed_spread`` (``GpuSpec.speed_spread``): ``1 + speed_spread *``
    :func:`expected_slowest_z` ``(gpus)``.

    Why: a synchronous data/tensor/pipeline-parallel step waits at its collectives for
    every rank, so it runs at the pace of its slowest GPU, and same-SKU GPUs do not run
    at one speed: under power management each settles at its own clock (Sinha et al.,
    "Not All GPUs Are Created Equal", SC22, arXiv 2208.11035: 8 % average performance
    variation across a cluster's same-SKU GPUs, up to 22 %; the Llama 3 paper, arXiv
    2407.21783 §3.3.4: the 16K-H100 job's throughput moved 1-2 % with the day's
    temperature through the GPUs' DVFS). The expected slowest of more GPUs is slower
    (order statistics), so a job of the same per-GPU work slows as it grows.

    Raises:
        ValueError: for a spread outside ``[0, MAX_SPEED_SPREAD]`` or a bad GPU count.
    """
    if not 0 <= speed_spread <= MAX_SPEED_SPREAD:
        raise ValueError(f"speed_spread: {speed_spread!r} is not valid; give a relative "
                         f"standard deviation 0 <= x <= {MAX_SPEED_SPREAD:g} (0.015 = 1.5 %)")
    return 1.0 + speed_spread * expected_slowest_z(gpus)


@lru_cache(maxsize=1)
def load_efficiency_table() -> Mapping[str, Mapping[str, EfficiencyCurve]]:
    """``{profile: {dtype: EfficiencyCurve}}`` from ``hardware/data/matmul_efficiency.csv``."""
    text = resources.files("hardware.data").joinpath(EFFICIENCY_TABLE).read_text()
    rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    # (csv.reader and the header's columns: the same fields as csv.DictReader's rows,
    # without building a dict per row)
    lines = csv.reader(text.splitlines())
    column = {name: index for index, name in enumerate(next(lines))}
    profile, dtype, flops, efficiency, peak = (column[name] for name in (
        "profile", "dtype", "flops", "efficiency", "peak_flops_per_s"))
    for r in lines:
        rows.setdefault((r[profile], r[dtype]), []).append(
            (float(r[flops]), float(r[efficiency]), float(r[peak]))
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


# ---------------------------------------------------------------------------- attention


@lru_cache(maxsize=1)
def load_attention_table() -> Mapping[tuple[str, str, str, bool], Mapping[int, tuple[tuple[float, ...], tuple[float, ...]]]]:
    """``{(profile, impl, phase, causal): {head_dim: (log seq_len knots, log efficiency)}}``
    from ``hardware/data/attention_efficiency.csv``."""
    text = resources.files("hardware.data").joinpath(ATTENTION_TABLE).read_text()
    points: dict[tuple, dict[int, list[tuple[float, float]]]] = {}
    # (csv.reader and the header's columns, as load_efficiency_table)
    lines = csv.reader(text.splitlines())
    column = {name: index for index, name in enumerate(next(lines))}
    profile, impl, phase, causal, head_dim, seq_len, efficiency = (column[name] for name in (
        "profile", "impl", "phase", "causal", "head_dim", "seq_len", "efficiency"))
    for r in lines:
        key = (r[profile], r[impl], r[phase], r[causal] == "1")
        points.setdefault(key, {}).setdefault(int(r[head_dim]), []).append(
            (float(r[seq_len]), float(r[efficiency])))
    table: dict[tuple, dict[int, tuple]] = {}
    for key, by_dim in points.items():
        for d, knots in by_dim.items():
            knots.sort()
            table.setdefault(key, {})[d] = (tuple(math.log(s) for s, _ in knots),
                                            tuple(math.log(e) for _, e in knots))
    return table


def attention_impls(profile: str) -> tuple[str, ...]:
    """Implementations the table has measured or derived rows for on ``profile``."""
    return tuple(sorted({impl for p, impl, _, _ in load_attention_table() if p == profile}))


def resolve_attention_impl(profile: str, impl: str = "") -> str:
    """The implementation that runs for ``impl`` on ``profile``: ``""`` is the profile's
    default (:data:`DEFAULT_ATTENTION_IMPL`); one that does not run there falls back
    (:data:`ATTENTION_FALLBACK`).

    Raises:
        ValueError: unknown implementation or profile without attention rows.
    """
    available = attention_impls(profile)
    if not available:
        raise ValueError(f"matmul_profile: {profile!r} has no attention efficiencies; valid: "
                         f"{', '.join(sorted({p for p, *_ in load_attention_table()}))}")
    if not impl:
        impl = DEFAULT_ATTENTION_IMPL.get(profile, available[0])
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention impl: {impl!r} is not known; valid: {', '.join(ATTENTION_IMPLS)}")
    for candidate in (impl, *ATTENTION_FALLBACK.get(impl, ())):
        if candidate in available:
            return candidate
    return available[0]


def _log_interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Linear in (log x, log y); below the first knot the first segment's slope continues,
    above the last the value stays."""
    if x >= xs[-1]:
        return ys[-1]
    if x <= xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0]) if len(xs) > 1 else 0.0
        return ys[0] + slope * (x - xs[0])
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@lru_cache(maxsize=4096)
def attention_efficiency(profile: str, impl: str = "", *, phase: str = "fwd", causal: bool = True,
                         head_dim: int = DEFAULT_ATTENTION_HEAD_DIM,
                         seq_len: int = DEFAULT_ATTENTION_SEQ_LEN) -> float:
    """Fused-attention efficiency: achieved FLOP/s over the profile's reference BF16 peak.

    FLOPs are counted as FlashAttention's benchmark counts them (forward ``4*b*s^2*h*d``,
    halved when causal; backward 2.5x), the convention of ``strategies.model_costs``.

    Args:
        profile: ``sm_80``, ``sm_90`` or ``sm_100``.
        impl: one of :data:`ATTENTION_IMPLS`, or ``""`` for the profile's default; an
            implementation the architecture cannot run falls back (:func:`resolve_attention_impl`).
        phase: ``"fwd"`` or ``"bwd"``.
        causal: causal mask (LLM training).
        head_dim: per-head dimension; tabulated at 64 and 128, linear in between, clamped
            outside (assumption: hdim 256 reaches about hdim 128's fraction).
        seq_len: sequence length the kernel loops over (queries per rank); tabulated
            512..16k, interpolated in log-log, extrapolated below with the first segment's
            slope and flat above.

    Raises:
        ValueError: unknown profile, implementation or phase, or a non-positive size.
    """
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase: {phase!r} is not valid; valid: fwd, bwd")
    if head_dim < 1 or seq_len < 1:
        raise ValueError(f"attention shape: head_dim {head_dim!r} and seq_len {seq_len!r} must be >= 1")
    impl = resolve_attention_impl(profile, impl)
    by_dim = load_attention_table()[(profile, impl, phase, bool(causal))]
    dims = sorted(by_dim)
    x = math.log(seq_len)
    if head_dim <= dims[0] or head_dim >= dims[-1]:
        d = dims[0] if head_dim <= dims[0] else dims[-1]
        return math.exp(_log_interp(*by_dim[d], x))
    j = bisect.bisect_right(dims, head_dim)
    d0, d1 = dims[j - 1], dims[j]
    e0 = math.exp(_log_interp(*by_dim[d0], x))
    e1 = math.exp(_log_interp(*by_dim[d1], x))
    return e0 + (e1 - e0) * (head_dim - d0) / (d1 - d0)


def op_phase(op: ComputeOp) -> str:
    """``"fwd"`` or ``"bwd"``: the op's ``phase`` attribute (``F``/``R`` forward or
    recompute, ``B``/``I``/``W`` backward) or, without one, its lowering name
    (``attn.core.F0.l3``, ``attn.core.recompute.B0.l3``: a recompute is forward work)."""
    phase = getattr(op, "phase", "") or ""
    if phase:
        return "fwd" if phase in ("F", "R", "fwd") else "bwd"
    name = op.name
    if ".recompute" in name:
        return "fwd"
    match = _PHASE_IN_NAME.search(name)
    return "bwd" if match and match.group(1) != "F" else "fwd"


def op_gemm_groups(op: ComputeOp) -> int:
    """GEMMs a grouped-GEMM op stands for: its ``gemm_groups`` attribute when above 1 or,
    without one, the first entry of the ``(groups, m, n, k)`` shape of a routed-expert
    kernel (named ``moe.experts.*`` by ``strategies.model_costs``); 1 for every other
    matmul (a batched GEMM such as unfused attention's is one cuBLAS call)."""
    groups = getattr(op, "gemm_groups", 0)
    if isinstance(groups, int) and groups > 1:
        return groups
    shape = tuple(getattr(op, "shape", ()) or ())
    if ".experts." in op.name and len(shape) == 4 and shape[0] > 1:
        return int(shape[0])
    return 1


def op_launches(op: ComputeOp) -> int:
    """GPU kernels an op stands for: its ``launches`` attribute (``strategies.model_costs``
    sets it per pass, e.g. an eager RMSNorm is 8 ATen kernels), default 1."""
    launches = getattr(op, "launches", 1)
    return launches if isinstance(launches, int) and launches >= 1 else 1


def attention_shape(op: ComputeOp) -> tuple[int, int]:
    """``(head_dim, seq_len)`` an attention op's efficiency is read at, from its shape
    ``(b, heads, kv_heads, s_q, s_k, d)``, or the defaults when it has none.

    The table's lengths are square benchmarks (``s_q = s_k``) whose tile loops run over
    the keys, so the length that matters is how many keys a query tile loops over: a
    causal kernel is read at ``s_q`` (its own triangle, a context-parallel diagonal block
    included), a kernel without mask (a ring-attention step off the diagonal) at ``s_k``,
    and a sliding-window kernel (the op's ``window``) at the causal length whose mean
    keys per query match the band's, ``min(length, 2 * window)`` (assumption: the loop
    length decides, as it does between the table's lengths)."""
    shape = tuple(getattr(op, "shape", ()) or ())
    if len(shape) == 6 and shape[3] > 0 and shape[4] > 0 and shape[5] > 0:
        causal = bool(getattr(op, "causal", True))
        seq_len = int(shape[3]) if causal else int(shape[4])
        window = int(getattr(op, "window", 0) or 0)
        if causal and window > 0:
            seq_len = min(seq_len, 2 * window)
        return int(shape[5]), seq_len
    return DEFAULT_ATTENTION_HEAD_DIM, DEFAULT_ATTENTION_SEQ_LEN


# ------------------------------------------------------------------------------- model


@dataclass(frozen=True, eq=False)
class ComputeModel:
    """Roofline compute model of one GPU (see the module docstring for the formula).

    Attributes:
        gpu: the accelerator.
        attention_impl: the fused-attention implementation of the software stack
            (:data:`ATTENTION_IMPLS`) for attention ops that do not name one; ``""``: the
            architecture's default (:data:`DEFAULT_ATTENTION_IMPL`).
        grouped_gemm_streams: GEMMs of a grouped GEMM in flight at once
            (:data:`GROUPED_GEMM_STREAMS`; 1 for a sequential expert loop; a large number
            for a single grouped kernel such as CUTLASS ``grouped_gemm``).
        host_mode: how the stack issues kernels from the CPU (:data:`HOST_ISSUE_S`:
            ``eager``, ``compiled``, ``graphed``), for :meth:`host_time_s` and
            :meth:`issue_bound_time_s`; ``""``: the host is never the bottleneck.
        vector_efficiency: fraction of the CUDA-core FLOP rate vector kernels reach
            (default :data:`VECTOR_EFFICIENCY`).

    Raises:
        ValueError: the GPU's ``matmul_profile`` is not in the table, or a field is out of
            range.
    """

    gpu: GpuSpec
    attention_impl: str = ""
    host_mode: str = ""
    grouped_gemm_streams: int = GROUPED_GEMM_STREAMS
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
        if isinstance(self.grouped_gemm_streams, bool) or not isinstance(self.grouped_gemm_streams, int) \
                or self.grouped_gemm_streams < 1:
            raise ValueError(f"grouped_gemm_streams: {self.grouped_gemm_streams!r} must be an integer >= 1")
        if self.host_mode and self.host_mode not in HOST_ISSUE_S:
            raise ValueError(f"host_mode: {self.host_mode!r} is not known; valid: "
                             f"{', '.join(HOST_ISSUE_S)} (or '' for none)")
        if self.attention_impl and self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl: {self.attention_impl!r} is not known; valid: "
                             f"{', '.join(ATTENTION_IMPLS)} (or '' for the GPU's default)")

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

        ``(peak_flops_per_s, curve, reference_flops_ratio, factor)`` for matmuls,
        ``(peak_flops_per_s, None, 1.0, 0.0)`` for attention (its efficiency depends on the
        op's implementation, pass and shape: :meth:`attention_efficiency`),
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
        if op.kind == "attention":
            # FP8 attention (TE's fp8_dpa) is not tabulated: it runs at the BF16 rate.
            attention_peak = self._peaks.get("bf16", peak) if dtype in ("fp8", "fp4") else peak
            plan = (attention_peak, None, 1.0, 0.0)
        elif op.kind in TENSOR_CORE_KINDS:
            # One curve for every pass: the sm_90 fp8 curve is the split-accumulation rate
            # (mamf-finder's torch._scaled_mm, use_fast_accum=False), which TE's dgrad/wgrad
            # run; TE's fast-accumulated fprop is not sped up (no per-shape measurement of
            # the ratio): hardware/data/README.md "FP8 accumulation mode".
            _, curve = _curve(self.gpu.matmul_profile, dtype)
            plan = (peak, curve, curve.peak_flops_per_s / peak, 1.0)
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
        if op.kind == "attention":
            return peak_or_rate * self.attention_efficiency(op)
        if curve is None:
            return peak_or_rate
        return peak_or_rate * self._tensor_eff(curve, ratio, self.gemm_work(op)) * factor

    def gemm_work(self, op: ComputeOp) -> float:
        """The work the GEMM curve is read at: the op's flops, or for a grouped GEMM of
        ``g`` equal GEMMs (:func:`op_gemm_groups`, MoE experts) the work of the
        ``min(g, grouped_gemm_streams)`` GEMMs in flight at once -- Transformer Engine's
        ``GroupedLinear`` issues one cuBLAS GEMM per group round-robin on its compute
        streams, so a small expert GEMM runs at the efficiency of its own size, not of
        the whole group's."""
        groups = op_gemm_groups(op)
        if groups <= 1:
            return op.flops
        return op.flops / groups * min(groups, self.grouped_gemm_streams)

    def attention_efficiency(self, op: ComputeOp) -> float:
        """Fraction of this GPU's peak an attention op reaches: the table's efficiency
        (:func:`attention_efficiency`) for the op's implementation (its ``impl``
        attribute, else :attr:`attention_impl`, else the architecture's default), pass
        (:func:`op_phase`) and shape (:func:`attention_shape`), rescaled like the GEMM
        curves by ``matmul_peak_efficiency / reference plateau`` and capped at 1."""
        impl = getattr(op, "impl", "") or self.attention_impl
        head_dim, seq_len = attention_shape(op)
        eff = attention_efficiency(self.gpu.matmul_profile, impl, phase=op_phase(op),
                                   causal=bool(getattr(op, "causal", True)),
                                   head_dim=head_dim, seq_len=seq_len) * self._plateau_scale
        return eff if eff < 1.0 else 1.0

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

    def serial_launches(self, op: ComputeOp) -> int:
        """Kernel launches of ``op`` that follow one another on the GPU: its ``launches``
        (:func:`op_launches`), and for a grouped GEMM of ``g`` GEMMs
        (:func:`op_gemm_groups`) each of those launches is a round of ``g`` per-expert cuBLAS
        GEMMs spread over :attr:`grouped_gemm_streams` streams, ``ceil(g / streams)`` in a
        row on each: Transformer Engine's ``te_general_grouped_gemm`` hands the per-expert
        GEMMs to ``nvte_multi_tensor_gemm``, which launches GEMM ``i`` on compute stream
        ``i % num_streams`` (transformer_engine/pytorch/csrc/extensions/gemm.cpp,
        transformer_engine/common/gemm/cublaslt_gemm.cu)."""
        launches = op_launches(op)
        groups = op_gemm_groups(op) if op.kind == "matmul" else 1
        if groups <= 1:
            return launches
        return launches * -(-groups // self.grouped_gemm_streams)

    def duration_s(self, op: ComputeOp) -> float:
        """Time the op occupies its stream, seconds: ``kernel_launch_s`` per GPU kernel the
        op stands for in a row (:meth:`serial_launches`: its ``launches`` attribute, default
        1, an eager RMSNorm is 8; a grouped expert GEMM's per-stream rounds) plus the
        roofline time."""
        return self.gpu.kernel_launch_s * self.serial_launches(op) + self.kernel_time_s(op)

    def host_time_s(self, op: ComputeOp) -> float:
        """CPU time to issue the op's kernels under :attr:`host_mode` (0 without one):
        :data:`HOST_ISSUE_S` per launch."""
        if not self.host_mode:
            return 0.0
        return HOST_ISSUE_S[self.host_mode] * op_launches(op)

    def issue_bound_time_s(self, ops: Sequence[ComputeOp]) -> float:
        """Seconds a serial stream of ``ops`` takes when one CPU thread issues their
        kernels in order into an unbounded launch queue (PyTorch's asynchronous CUDA
        stream): kernel ``i`` starts when it is issued and its predecessor is done,
        ``end_i = max(end_{i-1}, issue_i) + duration_i`` with ``issue_i`` the cumulative
        host time of ops ``0..i`` (:meth:`host_time_s`). Long kernels let the CPU run
        ahead; a run of kernels shorter than their issue time leaves the GPU idle. Equal
        to the sum of :meth:`duration_s` when the GPU is never starved (and always without
        a ``host_mode``)."""
        end = issued = 0.0
        for op in ops:
            issued += self.host_time_s(op)
            end = max(end, issued) + self.duration_s(op)
        return end

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
