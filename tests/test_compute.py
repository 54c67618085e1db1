"""Tests of the roofline compute model (hardware/compute.py) and its efficiency table.

Measured values come from OpenXLA's GEMM table (kernel times; validate/data/compute/SOURCES.md)
and stas00's mamf-finder maxima; the GpuSpecs are built here, independent of the presets.
"""

from __future__ import annotations

import csv
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware.compute import (
    ComputeModel,
    achieved_flops_per_s,
    canonical_dtype,
    load_efficiency_table,
    matmul_efficiency,
    matmul_profiles,
)
from conftest import DATA
from hardware.spec import GpuSpec
from strategies.ir import ComputeOp, matmul_op

REPO = Path(__file__).resolve().parents[1]
XLA_TABLE = DATA / "compute" / "xla_gpu_matmul_perf_table.csv"

# H100 SXM5 80GB, dense peaks from the NVIDIA datasheet; max achievable matmul efficiency
# from mamf-finder (794.5 of 989 TFLOPS bf16).
H100 = GpuSpec(
    name="H100-SXM5-80GB (test)",
    peak_flops_per_s={
        "fp64": 66.9e12,
        "fp32": 66.9e12,
        "tf32": 494.5e12,
        "bf16": 989e12,
        "fp16": 989e12,
        "fp8": 1979e12,
    },
    hbm_bytes=80 * 10**9,
    hbm_bytes_per_s=3.35e12,
    matmul_profile="sm_90",
    matmul_peak_efficiency=794.5 / 989,
    memory_efficiency=0.85,
    kernel_launch_s=3e-6,
)
# A100 SXM4 80GB: no fp8; mamf 271.2 of 312.
A100 = GpuSpec(
    name="A100-SXM4-80GB (test)",
    peak_flops_per_s={"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    hbm_bytes=80 * 10**9,
    hbm_bytes_per_s=2.039e12,
    matmul_profile="sm_80",
    matmul_peak_efficiency=271.2 / 312,
    memory_efficiency=0.85,
    kernel_launch_s=3e-6,
)
B200 = GpuSpec(
    name="B200 (test)",
    peak_flops_per_s={"fp32": 75e12, "tf32": 1.1e15, "bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15},
    hbm_bytes=180 * 10**9,
    hbm_bytes_per_s=8e12,
    matmul_profile="sm_100",
    matmul_peak_efficiency=1745 / 2250,
    memory_efficiency=0.85,
    kernel_launch_s=3e-6,
)
GPUS = (A100, H100, B200)

# Square bf16 GEMMs on sm_90, b=1, measured TFLOP/s (SOURCES.md, xla table).
SM90_BF16_SQUARE_TFLOPS = {256: 6.7, 512: 43.6, 1024: 252.8, 2048: 641.0, 4096: 780.2}
# Tolerance on achieved kernel FLOP/s for those squares. One size-keyed curve cannot tell
# a square from the other shapes of the same work; the curve is the median over them and
# 1024^3 sits 8.5 % above that median (2048^3: 6.2 %).
SQUARE_TOLERANCE = 0.15
# Whole 375-point sm_90 bf16 grid: median / 90th percentile relative error bounds. The
# curve reaches 4.2 % / 17 %; the worst shapes are k-heavy (k=4096 with m*n=256*256..512):
# their serial k-loop is slower than the median shape of the same work.
GRID_MEDIAN_TOLERANCE = 0.06
GRID_P90_TOLERANCE = 0.20


def rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


def load_sm90_bf16_grid() -> list[tuple[int, int, int, int, float]]:
    with XLA_TABLE.open(newline="") as fh:
        rows = [
            (int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops_per_s"]))
            for r in csv.DictReader(fh)
            if r["gpu_key"] == "sm_90" and r["dtype"] == "bf16xbf16->bf16"
        ]
    assert len(rows) == 375
    return rows


# ---------------------------------------------------------------- (a) measured GEMMs


@pytest.mark.parametrize("size", sorted(SM90_BF16_SQUARE_TFLOPS))
def test_square_bf16_gemm_matches_xla_measurement(size):
    op = matmul_op(f"gemm{size}", 1, size, size, size, "bf16")
    model_tflops = achieved_flops_per_s(H100, op) / 1e12
    assert rel(model_tflops, SM90_BF16_SQUARE_TFLOPS[size]) <= SQUARE_TOLERANCE, model_tflops


def test_small_gemm_is_latency_bound():
    """256^3 runs ~5 us (kernel latency floor), 1000x its time at peak; launch adds on top."""
    model = ComputeModel(H100)
    op = matmul_op("tiny", 1, 256, 256, 256, "bf16")
    kernel_s = model.kernel_time_s(op)
    measured_s = op.flops / 6.7e12
    assert rel(kernel_s, measured_s) <= 0.05
    assert kernel_s > 100 * op.flops / 989e12
    assert model.duration_s(op) == pytest.approx(H100.kernel_launch_s + kernel_s)
    with_launch = achieved_flops_per_s(H100, op, include_launch=True)
    assert with_launch < achieved_flops_per_s(H100, op)
    # Below the grid the kernel time stays at the floor instead of shrinking with the work.
    tiny = matmul_op("tinier", 1, 64, 64, 64, "bf16")
    assert model.kernel_time_s(tiny) == pytest.approx(kernel_s, rel=1e-6)


def test_whole_sm90_bf16_grid_error():
    model = ComputeModel(H100)
    errors = []
    for b, m, n, k, measured in load_sm90_bf16_grid():
        op = matmul_op("g", b, m, n, k, "bf16")
        errors.append(rel(op.flops / model.kernel_time_s(op), measured))
    errors.sort()
    median = statistics.median(errors)
    p90 = errors[int(0.9 * len(errors))]
    assert median < GRID_MEDIAN_TOLERANCE, median
    assert p90 < GRID_P90_TOLERANCE, p90


def test_table_is_reproducible_from_published_data():
    """The CSV is what tools/derive_matmul_efficiency.py computes (no hand edits)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "derive_matmul_efficiency.py"), "--check", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ (b) saturation


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_largest_gemms_approach_but_never_exceed_peak_efficiency(gpu):
    model = ComputeModel(gpu)
    cap = gpu.matmul_peak_efficiency * gpu.peak_flops_per_s["bf16"]
    rates = [
        achieved_flops_per_s(gpu, matmul_op("big", 1, s, s, s, "bf16"))
        for s in (4096, 8192, 16384, 65536, 1 << 20)
    ]
    assert all(r <= cap * (1 + 1e-12) for r in rates)
    assert rates[-1] >= 0.999 * cap
    assert rates[-2] >= 0.98 * cap
    # Every dtype the GPU has, for any size.
    for dtype in model.valid_dtypes():
        for exponent in range(10, 60, 3):
            assert model.tensor_efficiency(dtype, 2.0**exponent) <= gpu.matmul_peak_efficiency


def test_plateaus_are_the_mamf_maxima():
    table = load_efficiency_table()
    assert table["sm_90"]["bf16"].plateau == pytest.approx(794.5 / 989, rel=1e-4)
    assert table["sm_90"]["fp8"].plateau == pytest.approx(1402.6 / 1979, rel=1e-4)
    assert table["sm_100"]["bf16"].plateau == pytest.approx(1745 / 2250, rel=1e-4)
    assert table["sm_100"]["fp8"].plateau == pytest.approx(3432.5 / 4500, rel=1e-4)
    assert table["sm_80"]["bf16"].plateau == pytest.approx(271.2 / 312, rel=1e-4)


def test_gpu_peak_efficiency_rescales_the_curve():
    """A GPU sharing a profile but with a higher mamf (GH200: 83.8 %) gets a higher plateau."""
    gh200 = GpuSpec(**{**H100.__dict__, "name": "GH200 (test)", "matmul_peak_efficiency": 0.838})
    op = matmul_op("g", 1, 2048, 2048, 2048, "bf16")
    ratio = achieved_flops_per_s(gh200, op) / achieved_flops_per_s(H100, op)
    assert ratio == pytest.approx(0.838 / (794.5 / 989), rel=1e-9)


def test_lower_peak_gpu_reads_curve_at_same_ideal_time():
    """Half the peak: a GEMM reaches the efficiency the reference GPU has at twice the work."""
    half = GpuSpec(
        **{**H100.__dict__, "name": "half-H100", "peak_flops_per_s": {"bf16": 989e12 / 2}}
    )
    flops = 2.0 * 1024**3
    assert ComputeModel(half).tensor_efficiency("bf16", flops) == pytest.approx(
        matmul_efficiency("sm_90", "bf16", 2 * flops)
    )


# ------------------------------------------------------------- (c) memory-bound ops


@pytest.mark.parametrize("kind", ["elementwise", "norm", "memcpy", "optimizer", "other"])
def test_memory_bound_op_time_is_bytes_over_bandwidth_plus_launch(kind):
    model = ComputeModel(H100)
    op = ComputeOp(name=kind, kind=kind, flops=3.0e9, bytes=4.0e9, dtype="bf16")
    expected = H100.kernel_launch_s + op.bytes / (H100.hbm_bytes_per_s * H100.memory_efficiency)
    assert model.duration_s(op) == expected
    assert model.bound(op) == "memory"
    assert model.duration_ns(op) == math.ceil(expected * 1e9 - 1e-6)


def test_skinny_gemm_is_memory_bound():
    """A decode-like GEMM (m=8) streams its weights: the bytes side of the roofline wins."""
    model = ComputeModel(H100)
    op = matmul_op("gemv", 1, 8, 8192, 8192, "bf16")
    assert model.bound(op) == "memory"
    assert model.kernel_time_s(op) == op.bytes / (H100.hbm_bytes_per_s * H100.memory_efficiency)


def test_zero_work_op_costs_only_the_launch():
    model = ComputeModel(H100)
    for kind in ("matmul", "attention", "elementwise"):
        op = ComputeOp(name="nothing", kind=kind)
        assert model.duration_s(op) == H100.kernel_launch_s
        assert model.duration_ns(op) == 3000
        assert model.bound(op) == "launch"
        assert achieved_flops_per_s(H100, op) == 0.0


# ----------------------------------------------------------------- (d) monotonicity


@pytest.mark.parametrize(
    "profile,dtype",
    [(p, d) for p in ("sm_80", "sm_90", "sm_100") for d in sorted(load_efficiency_table()[p])],
)
def test_efficiency_is_monotone_in_size(profile, dtype):
    effs = [matmul_efficiency(profile, dtype, 2.0 ** (x / 4)) for x in range(0, 4 * 60)]
    assert all(b >= a for a, b in zip(effs, effs[1:]))
    assert effs[-1] > 20 * effs[4 * 25]  # the smallest grid GEMM (2^25 flops) is latency bound


def test_profiles_and_dtypes():
    assert matmul_profiles() == ("sm_100", "sm_80", "sm_90")
    assert set(load_efficiency_table()["sm_90"]) == {"bf16", "fp8", "tf32"}
    assert matmul_efficiency("sm_90", "fp16", 1e10) == matmul_efficiency("sm_90", "bf16", 1e10)
    assert matmul_efficiency("sm_90", "bfloat16", 1e10) == matmul_efficiency("sm_90", "bf16", 1e10)


# --------------------------------------------------------------------- (e) bad input


def test_unknown_dtype_for_gpu_raises_clear_error():
    model = ComputeModel(A100)
    op = matmul_op("fp8-on-a100", 1, 1024, 1024, 1024, "fp8")
    with pytest.raises(ValueError) as info:
        model.duration_s(op)
    message = str(info.value)
    assert "dtype" in message and "'fp8'" in message and "fp8-on-a100" in message
    assert "valid dtypes: bf16, fp16, fp32, fp64, tf32" in message


def test_unparseable_dtype_raises_clear_error():
    with pytest.raises(ValueError, match=r"dtype: 'int3' is not a known dtype; valid dtypes: .*bf16"):
        ComputeModel(H100).duration_s(ComputeOp(name="x", kind="matmul", flops=1.0, dtype="int3"))
    with pytest.raises(ValueError, match="dtype"):
        matmul_op("x", 1, 2, 2, 2, "complex64")


def test_other_bad_inputs():
    with pytest.raises(ValueError, match=r"matmul_profile: 'sm_42'.*valid profiles: sm_100, sm_80, sm_90"):
        ComputeModel(GpuSpec(**{**H100.__dict__, "matmul_profile": "sm_42"}))
    with pytest.raises(ValueError, match="kind: 'conv'"):
        ComputeModel(H100).duration_s(ComputeOp(name="c", kind="conv", flops=1.0))
    with pytest.raises(ValueError, match="flops: -1.0"):
        ComputeModel(H100).duration_s(ComputeOp(name="n", kind="matmul", flops=-1.0))
    with pytest.raises(ValueError, match="m: 0 must be a positive integer"):
        matmul_op("z", 1, 0, 4, 4)
    with pytest.raises(ValueError, match="memory_efficiency"):
        ComputeModel(GpuSpec(**{**H100.__dict__, "memory_efficiency": 1.5}))


def test_dtype_aliases():
    assert canonical_dtype("bfloat16") == "bf16"
    assert canonical_dtype("torch.float16") == "fp16"
    assert canonical_dtype("float32") == "fp32"
    assert canonical_dtype("float8_e4m3fn") == "fp8"
    op = matmul_op("alias", 2, 512, 512, 512, "torch.bfloat16")
    assert op.dtype == "bf16"
    assert op.flops == 2.0 * 2 * 512**3
    assert op.bytes == 2.0 * 2 * 3 * 512**2


# ------------------------------------------------------------------- other kinds


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_attention_is_slower_than_gemm_of_same_work(gpu):
    """Every fused attention kernel (default implementation, either pass) stays below the
    GEMM plateau: its softmax runs between the two GEMMs on the slower non-tensor units
    (the per-implementation figures are tested in tests/test_attention_kernels.py)."""
    model = ComputeModel(gpu)
    flops = 2.0 * 4 * 4096**3
    gemm = ComputeOp(name="g", kind="matmul", flops=flops, dtype="bf16")
    for name in ("a.F0.l0", "a.B0.l0"):
        attn = ComputeOp(name=name, kind="attention", flops=flops, dtype="bf16")
        assert model.compute_flops_per_s(attn) < model.compute_flops_per_s(gemm)


def test_dtype_peaks_matter():
    """fp8 beats bf16 beats tf32 beats IEEE fp32 on the same big GEMM."""
    times = [
        ComputeModel(H100).kernel_time_s(matmul_op("d", 1, 8192, 8192, 8192, dt))
        for dt in ("fp8", "bf16", "tf32", "fp32")
    ]
    assert times == sorted(times)
    assert times[3] / times[1] > 10  # CUDA-core fp32 is ~15x slower than bf16 tensor cores


# ------------------------------------------------------------- property (hypothesis)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["matmul", "attention", "elementwise", "norm", "optimizer"]),
    dtype=st.sampled_from(["bf16", "fp16", "fp8", "tf32", "fp32"]),
    gpu_index=st.sampled_from([1, 2]),
    bytes_=st.floats(min_value=0.0, max_value=1e11),
    f1=st.floats(min_value=0.0, max_value=1e16),
    f2=st.floats(min_value=0.0, max_value=1e16),
)
def test_time_is_monotone_in_flops_at_fixed_bytes(kind, dtype, gpu_index, bytes_, f1, f2):
    model = ComputeModel(GPUS[gpu_index])
    lo, hi = sorted((f1, f2))
    t_lo = model.duration_s(ComputeOp(name="lo", kind=kind, flops=lo, bytes=bytes_, dtype=dtype))
    t_hi = model.duration_s(ComputeOp(name="hi", kind=kind, flops=hi, bytes=bytes_, dtype=dtype))
    assert t_hi >= t_lo * (1 - 1e-12)
    assert t_lo >= model.gpu.kernel_launch_s
