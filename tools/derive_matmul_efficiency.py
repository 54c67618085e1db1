#!/usr/bin/env python3
"""Derive ``hardware/data/matmul_efficiency.csv`` from the published GEMM measurements.

Run from the repository root::

    python tools/derive_matmul_efficiency.py            # writes the CSV, prints the fit report
    python tools/derive_matmul_efficiency.py --check    # exits 1 if the CSV is out of date

Inputs (read-only, see ``validate/data/compute/SOURCES.md``):

* ``xla_gpu_matmul_perf_table.csv``: OpenXLA's ``matmul_interpolator_data.h``, measured
  FLOP/s of batched GEMMs b in {1,2,4}, m,n,k in {256..4096} (375 shapes per GPU and dtype
  combination) on ``sm_90`` (H100-class) and ``sm_100_B200``. The generator
  (``xla/tools/matmul_perf_table_gen.cc``) reports the median *kernel* time from a CUPTI
  kernel tracer, so the numbers exclude host-side launch overhead.
* ``mamf_matmul_tflops_stas00.csv``: maximum achievable matmul TFLOPS (brute-force shape
  search with torch.matmul), used as the plateau each curve saturates at.

Output: one efficiency curve per (profile, dtype): the achieved fraction of the reference
GPU's dense peak as a function of the GEMM's work, ``flops = 2*b*m*n*k``, tabulated at
log-spaced flop counts; ``hardware/compute.py`` interpolates it in log-log space. The
method (see ``hardware/data/README.md`` for the numbers):

1. efficiency of every measured shape = measured FLOP/s / dense peak;
2. knots at the grid's flop counts (every power of two from 2^25 to 2^39): the median
   efficiency of all shapes with that work, made non-decreasing (weighted isotonic
   regression) and capped at the plateau;
3. below the grid: the kernel time stays at the latency floor of the smallest measured
   GEMM (efficiency proportional to flops, a straight line in log-log);
4. above the grid: the overhead time left at the largest measured size (measured time minus
   time at plateau rate) stays constant while the work grows, so the efficiency rises
   smoothly to the plateau, which the last knot reaches exactly;
5. profiles/dtypes without trustworthy measurements (sm_80 = A100; sm_90 fp8, whose
   measurements exceed the H100's dense peak) are derived from the sm_90 curve of the same
   math by matching the *ideal time* flops/peak and rescaling to the mamf plateau.

This script is not imported by the package.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "validate" / "data" / "compute"
OUT_CSV = REPO / "hardware" / "data" / "matmul_efficiency.csv"

# Dense (no sparsity) tensor-core peaks of the reference GPU of each profile, FLOP/s.
# H100 SXM5: NVIDIA H100 datasheet (BF16 1979 / FP8 3958 / TF32 989 TFLOPS *with* sparsity,
# halved here). B200 (HGX, 1000 W): NVIDIA HGX B200 datasheet per-GPU 4.5 PF BF16, 9 PF FP8,
# 2.2 PF TF32 with sparsity, halved. A100 SXM4: NVIDIA A100 datasheet, 312 TF BF16, 156 TF TF32.
PEAKS = {
    ("sm_90", "bf16"): 989e12,
    ("sm_90", "fp8"): 1979e12,
    ("sm_90", "tf32"): 494.5e12,
    ("sm_100", "bf16"): 2.25e15,
    ("sm_100", "fp8"): 4.5e15,
    ("sm_100", "tf32"): 1.1e15,
    ("sm_80", "bf16"): 312e12,
    ("sm_80", "tf32"): 156e12,
}
# CUDA-core FP32 peak of the H100 SXM (NVIDIA datasheet: 67 TFLOPS): what XLA's f32 GEMMs
# would be bounded by if they did *not* use TF32 tensor cores.
H100_FP32_SIMT_PEAK = 66.9e12

XLA_GPU_KEY = {"sm_90": "sm_90", "sm_100": "sm_100_B200"}
XLA_DTYPE = {
    "bf16": "bf16xbf16->bf16",
    "fp8": "f8e4m3fnxf8e4m3fn->bf16",
    # XLA's default precision for f32 dots on Ampere+ lets cuBLAS/Triton use TF32 tensor
    # cores; the data confirm it (see README): the curve is relative to the TF32 peak.
    "tf32": "f32xf32->f32",
}
ELEMENT_BYTES = {"bf16": 2, "fp8": 1, "tf32": 4}

# mamf-finder rows (accelerator name, dtype) giving the plateau of each measured curve.
MAMF_ROWS = {
    ("sm_90", "bf16"): ("NVIDIA H100 SXM", "bf16"),
    ("sm_90", "fp8"): ("NVIDIA H100 SXM", "fp8_e4m3fn"),
    ("sm_100", "bf16"): ("NVIDIA B200 SXM", "bf16"),
    ("sm_100", "fp8"): ("NVIDIA B200 SXM", "fp8_e4m3fn"),
    ("sm_80", "bf16"): ("NVIDIA A100 SXM", "bf16"),
}
# No mamf row exists for TF32; assumption: TF32 GEMMs saturate at the same fraction of
# their peak as BF16 on the same GPU. Supported by the grid maxima: sm_90 tf32 0.815 vs
# bf16 0.814, sm_100 tf32 0.79 vs bf16 0.74 of the respective dense peaks.
TF32_PLATEAU_FROM = "bf16"

GRID_EXPONENTS = range(25, 40)  # 2^25 = 2*256^3 ... 2^39 = 2*4*4096^3
FLOOR_EXPONENT = 10  # one knot at 1024 flops: latency floor, exact in log-log
ABOVE_STEP = 2  # knots every 4x above the grid
PLATEAU_TOL = 0.001  # stop extending once within 0.1 % of the plateau
MAX_EXPONENT = 52


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def load_measurements(data: Path) -> dict[tuple[str, str], list[tuple[int, int, int, int, float]]]:
    """``{(profile, dtype): [(b, m, n, k, flops_per_s), ...]}`` for the dtypes we use."""
    rows = read_csv(data / "xla_gpu_matmul_perf_table.csv")
    out: dict[tuple[str, str], list] = {}
    for profile, key in XLA_GPU_KEY.items():
        for dtype, xla_dtype in XLA_DTYPE.items():
            pts = [
                (int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops_per_s"]))
                for r in rows
                if r["gpu_key"] == key and r["dtype"] == xla_dtype
            ]
            if len(pts) != 375:
                raise SystemExit(f"{profile}/{dtype}: expected 375 grid points, found {len(pts)}")
            out[(profile, dtype)] = pts
    return out


def load_plateaus(data: Path) -> dict[tuple[str, str], float]:
    rows = read_csv(data / "mamf_matmul_tflops_stas00.csv")
    by_name = {(r["accelerator"], r["dtype"]): r for r in rows}
    plateaus = {}
    for key, name in MAMF_ROWS.items():
        r = by_name[name]
        plateaus[key] = float(r["mamf_tflops"]) / float(r["theoretical_tflops"])
    for profile in ("sm_90", "sm_100", "sm_80"):
        plateaus[(profile, "tf32")] = plateaus[(profile, TF32_PLATEAU_FROM)]
    return plateaus


def isotonic_non_decreasing(values: list[float], weights: list[float]) -> list[float]:
    """Weighted pool-adjacent-violators: the closest non-decreasing sequence."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out.extend([v] * int(n))
    return out


def interp_loglog(knots: list[tuple[float, float]], flops: float) -> float:
    """Efficiency at ``flops`` by linear interpolation of log(eff) over log(flops), clamped."""
    if flops <= knots[0][0]:
        return knots[0][1]
    if flops >= knots[-1][0]:
        return knots[-1][1]
    x = math.log(flops)
    for (f0, e0), (f1, e1) in zip(knots, knots[1:]):
        if f0 <= flops <= f1:
            t = (x - math.log(f0)) / (math.log(f1) - math.log(f0))
            return math.exp(math.log(e0) + t * (math.log(e1) - math.log(e0)))
    raise AssertionError("unreachable")


def extend(grid: list[tuple[float, float]], plateau: float, peak: float) -> list[tuple[float, float, str]]:
    """Add the latency-floor knot below and the saturation knots above the measured grid."""
    f_lo, e_lo = grid[0]
    floor_s = f_lo / (peak * e_lo)  # kernel time of the smallest measured GEMM
    f_floor = 2.0**FLOOR_EXPONENT
    knots = [(f_floor, f_floor / (peak * floor_s), "floor")]
    knots += [(f, e, "measured") for f, e in grid]
    f_top, e_top = grid[-1]
    overhead_s = max(0.0, f_top / (peak * e_top) - f_top / (peak * plateau))
    exponent = round(math.log2(f_top))
    while True:
        exponent += ABOVE_STEP
        f = 2.0**exponent
        e = f / (peak * (f / (peak * plateau) + overhead_s))
        if e >= plateau * (1.0 - PLATEAU_TOL) or exponent + ABOVE_STEP > MAX_EXPONENT:
            knots.append((f, plateau, "plateau"))
            break
        knots.append((f, e, "saturating"))
    return knots


def measured_curve(points, peak: float, plateau: float) -> list[tuple[float, float, str]]:
    by_flops: dict[float, list[float]] = {}
    for b, m, n, k, fps in points:
        by_flops.setdefault(2.0 * b * m * n * k, []).append(fps / peak)
    flops = sorted(by_flops)
    assert [round(math.log2(f)) for f in flops] == list(GRID_EXPONENTS), flops
    medians = [statistics.median(by_flops[f]) for f in flops]
    mono = isotonic_non_decreasing(medians, [len(by_flops[f]) for f in flops])
    grid = [(flops[0], min(mono[0], plateau))]
    for f, e in zip(flops[1:], mono[1:]):
        # A bigger GEMM never takes less time: cap the efficiency so that the kernel time
        # flops/(peak*eff) does not fall (a median of other shapes can be faster).
        f0, e0 = grid[-1]
        grid.append((f, min(e, plateau, e0 * f / f0)))
    return extend(grid, plateau, peak)


def transfer(
    src: list[tuple[float, float, str]], src_peak: float, src_plateau: float,
    dst_peak: float, dst_plateau: float, label: str,
) -> list[tuple[float, float, str]]:
    """Curve of another GPU/dtype from ``src``: same ideal time flops/peak, rescaled plateau.

    The latency floor, wave quantisation and tail effects of a GEMM scale with the time it
    would take at peak rate, not with its flop count (validated on the measured curves, see
    the README), so the knot at ``f`` takes the source efficiency at ``f * src_peak/dst_peak``.
    """
    pairs = [(f, e) for f, e, _ in src]
    scale = dst_plateau / src_plateau
    out = []
    for f, _, _ in src:
        e = interp_loglog(pairs, f * src_peak / dst_peak) * scale
        out.append((f, min(e, dst_plateau), label))
    out[-1] = (out[-1][0], dst_plateau, label)
    return out


def derive(data: Path):
    meas = load_measurements(data)
    plateaus = load_plateaus(data)
    curves: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for key in [("sm_90", "bf16"), ("sm_90", "tf32"), ("sm_100", "bf16"), ("sm_100", "fp8"), ("sm_100", "tf32")]:
        curves[key] = measured_curve(meas[key], PEAKS[key], plateaus[key])
    for dst, src, label in [
        (("sm_90", "fp8"), ("sm_90", "bf16"), "from sm_90 bf16"),
        (("sm_80", "bf16"), ("sm_90", "bf16"), "from sm_90 bf16"),
        (("sm_80", "tf32"), ("sm_90", "tf32"), "from sm_90 tf32"),
    ]:
        curves[dst] = transfer(curves[src], PEAKS[src], plateaus[src], PEAKS[dst], plateaus[dst], label)
    return curves, meas, plateaus


def round_sig(x: float, direction: int = 0, digits: int = 6) -> float:
    """``x`` to ``digits`` significant digits: nearest (0), down (-1) or up (+1)."""
    q = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    v = x / q
    v = round(v) if direction == 0 else (math.floor(v) if direction < 0 else math.ceil(v))
    return float(f"{v * q:.{digits}g}")


def finalize(knots: list[tuple[float, float, str]]) -> list[tuple[int, float, str]]:
    """Round to 6 significant digits keeping both invariants exactly on the written values:
    efficiency non-decreasing and kernel time flops/(peak*eff) non-decreasing in flops."""
    out: list[tuple[int, float, str]] = []
    for f, e, src in knots:
        e = round_sig(e)
        if out:
            f0, e0, _ = out[-1]
            e = max(e, e0)
            if e > e0 * f / f0:
                e = round_sig(e0 * f / f0, direction=-1)
        out.append((int(f), e, src))
    return out


def render_csv(curves) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["profile", "dtype", "flops", "efficiency", "peak_flops_per_s", "source"])
    for (profile, dtype), knots in sorted(curves.items()):
        for f, e, src in knots:
            w.writerow([profile, dtype, f, f"{e:.6g}", f"{PEAKS[(profile, dtype)]:.6g}", src])
    return buf.getvalue()


# --------------------------------------------------------------------------- fit report


def rel_errors(pred: list[float], meas: list[float]) -> list[float]:
    return [abs(p / m - 1.0) for p, m in zip(pred, meas)]


def summary(errs: list[float]) -> str:
    s = sorted(errs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"median {statistics.median(s):6.1%}  p90 {p90:6.1%}  max {s[-1]:6.1%}"


def smooth_fit_error(points, key_fn, peak: float) -> list[float]:
    """Error of a 12-knot log-log least-squares curve of efficiency vs ``key_fn(shape)``.

    Used only to compare candidate size measures on equal terms.
    """
    import numpy as np

    x = np.log([key_fn(b, m, n, k) for b, m, n, k, _ in points])
    y = np.log([fps / peak for *_, fps in points])
    kx = np.linspace(x.min(), x.max(), 12)
    basis = np.stack([np.interp(x, kx, np.eye(len(kx))[j]) for j in range(len(kx))], axis=1)
    coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
    return list(np.abs(np.exp(basis @ coef - y) - 1.0))


def report(curves, meas, plateaus) -> str:
    lines = []
    out = lines.append
    out("Fit of the tabulated curve (log-log interpolation) to every measured grid point,")
    out("relative error of achieved FLOP/s (= of kernel time), 375 points each:")
    for key in [("sm_90", "bf16"), ("sm_90", "tf32"), ("sm_100", "bf16"), ("sm_100", "fp8"), ("sm_100", "tf32"), ("sm_90", "fp8")]:
        knots = [(f, e) for f, e, _ in curves[key]]
        pts = meas[key]
        pred = [interp_loglog(knots, 2.0 * b * m * n * k) for b, m, n, k, _ in pts]
        obs = [fps / PEAKS[key] for *_, fps in pts]
        note = "  (curve derived from sm_90 bf16; data exceed peak)" if key == ("sm_90", "fp8") else ""
        out(f"  {key[0]:6s} {key[1]:5s} {summary(rel_errors(pred, obs))}{note}")
    out("")
    out("Candidate size measures, same smooth 12-knot curve for each (sm_90 bf16 | sm_100 bf16):")
    keys = {
        "flops 2bmnk": lambda b, m, n, k: 2.0 * b * m * n * k,
        "arithmetic intensity": lambda b, m, n, k: 2.0 * b * m * n * k / (2.0 * b * (m * k + k * n + m * n)),
        "output elements bmn": lambda b, m, n, k: float(b * m * n),
        "k": lambda b, m, n, k: float(k),
    }
    for name, fn in keys.items():
        a = summary(smooth_fit_error(meas[("sm_90", "bf16")], fn, PEAKS[("sm_90", "bf16")]))
        b_ = summary(smooth_fit_error(meas[("sm_100", "bf16")], fn, PEAKS[("sm_100", "bf16")]))
        out(f"  {name:22s} {a} | {b_}")
    out("")
    out("Transfer check (how sm_80 and sm_90 fp8 are derived), predicting a measured curve from")
    out("another one with the mamf/assumed plateau of the target:")
    for dst, src in [
        (("sm_100", "bf16"), ("sm_90", "bf16")),
        (("sm_100", "tf32"), ("sm_90", "tf32")),
        (("sm_90", "bf16"), ("sm_100", "bf16")),
        (("sm_100", "fp8"), ("sm_100", "bf16")),
    ]:
        for mode in ("ideal time", "same flops"):
            ratio = PEAKS[src] / PEAKS[dst] if mode == "ideal time" else 1.0
            src_knots = [(f, e) for f, e, _ in curves[src]]
            scale = plateaus[dst] / plateaus[src]
            pts = meas[dst]
            pred = [
                min(plateaus[dst], interp_loglog(src_knots, 2.0 * b * m * n * k * ratio) * scale)
                for b, m, n, k, _ in pts
            ]
            obs = [fps / PEAKS[dst] for *_, fps in pts]
            out(f"  {src[0]} {src[1]:4s} -> {dst[0]} {dst[1]:4s} by {mode:10s}: {summary(rel_errors(pred, obs))}")
    out("")
    out("Plausibility of the raw data (largest measured efficiency vs dense peak):")
    for key in [("sm_90", "bf16"), ("sm_90", "fp8"), ("sm_90", "tf32"), ("sm_100", "bf16"), ("sm_100", "fp8"), ("sm_100", "tf32")]:
        best = max(fps for *_, fps in meas[key])
        out(f"  {key[0]:6s} {key[1]:5s} max {best / 1e12:7.1f} TFLOP/s = {best / PEAKS[key]:.3f} of peak {PEAKS[key] / 1e12:g} T")
    best = max(fps for *_, fps in meas[("sm_90", "tf32")])
    out(f"  sm_90 f32 max would be {best / H100_FP32_SIMT_PEAK:.1f}x the CUDA-core FP32 peak -> TF32 tensor cores")
    out("")
    out("Square GEMMs, b=1 (measured vs curve), TFLOP/s:")
    for key in [("sm_90", "bf16"), ("sm_100", "bf16")]:
        knots = [(f, e) for f, e, _ in curves[key]]
        for b, m, n, k, fps in meas[key]:
            if b == 1 and m == n == k:
                e = interp_loglog(knots, 2.0 * m * n * k)
                out(f"  {key[0]:6s} {key[1]} {m:4d}^3: measured {fps / 1e12:7.1f}  curve {e * PEAKS[key] / 1e12:7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with the published CSVs")
    ap.add_argument("--out", type=Path, default=OUT_CSV)
    ap.add_argument("--check", action="store_true", help="do not write; fail if --out differs")
    ap.add_argument("--quiet", action="store_true", help="no fit report")
    args = ap.parse_args(argv)
    curves, meas, plateaus = derive(args.data)
    curves = {key: finalize(knots) for key, knots in curves.items()}
    text = render_csv(curves)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; rerun tools/derive_matmul_efficiency.py", file=sys.stderr)
            return 1
    else:
        args.out.write_text(text)
        print(f"wrote {args.out} ({text.count(chr(10)) - 1} rows)")
    if not args.quiet:
        print(report(curves, meas, plateaus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
