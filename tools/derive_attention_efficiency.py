#!/usr/bin/env python3
"""Derive ``hardware/data/attention_efficiency.csv``: fused-attention kernel efficiency by
implementation, GPU architecture, pass, causal mask, head dimension and sequence length.

Run from the repository root::

    python tools/derive_attention_efficiency.py            # writes the CSV, prints a summary
    python tools/derive_attention_efficiency.py --check    # exits 1 if the CSV is out of date

Every number is a published benchmark or a stated rule applied to one (the rules are in
the constants below, each with its source). The efficiency is the achieved FLOP/s over the
dense BF16 peak of the profile's reference GPU, with FLOPs counted as the FlashAttention
benchmarks count them (``benchmarks/benchmark_flash_attention.py``): forward
``4*b*s^2*h*d``, halved with a causal mask, backward 2.5x the forward -- the same
convention as ``strategies/model_costs.py`` (``CAUSAL_FLOP_FRACTION``,
``FLASH_BWD_FLOP_FACTOR``), so ``flops / (peak * efficiency)`` is the kernel time.

Measured (``sm_90``, H100 SXM5 80GB, BF16): Shah et al. 2024, "FlashAttention-3: Fast and
Accurate Attention with Asynchrony and Low-precision", arXiv 2407.08608, Section 4.1
benchmark figures (batch x seqlen = 16k tokens, hidden 2048, i.e. 32 heads of 64 or 16
heads of 128; the TFLOP/s printed on each bar): forward with and without causal mask
for FlashAttention-2 (``fa2``), the Triton tutorial kernel (``triton``), cuDNN fused
attention (``cudnn``, what Transformer Engine runs on Hopper+) and FlashAttention-3
(``fa3``); backward without mask for fa2, cudnn and fa3.

Derived (rules; each constant is cited where it is defined):

1. ``sm_90`` causal backward: the non-causal backward times the forward's causal /
   non-causal ratio of the same implementation, head dim and length (the mask removes
   the same tiles in both passes; the diagonal tiles and the uneven row lengths cost the
   same fraction).
2. ``sm_90`` Triton backward (not benchmarked): the Triton forward times FA2's
   backward/forward ratio.
3. ``fa1`` (FlashAttention v1, flash-attn 1.x, what MosaicML's llm-foundry benchmarks ran
   with Transformer Engine's pin): FA2 times :data:`FA1_OVER_FA2` per pass, from the FA2
   paper's statement of both kernels' reach on the A100.
4. ``sm_80`` (A100): FA2 runs the same ``mma.sync`` code on A100 and H100; its A100
   forward plateau is 73 % of peak (FA2 paper) where the H100 reaches 370/989: every
   ``sm_90`` FA2 point is scaled by :data:`FA2_A100_OVER_H100`. fa1 follows from FA2 by
   the paper's reach statements (rule 3); Triton from FA2 by the per-pass ratio measured at
   one point by Triton's regression test (:data:`TRITON_A100_MEASURED`); cuDNN on Ampere is
   taken equal to FA2 (Transformer Engine runs flash-attn there). FA3 is Hopper-only: no
   ``sm_80`` rows.
5. ``sm_100`` (B200) cuDNN: **measured** where the measurement is a kernel rate -- NVIDIA's
   cudnn-frontend SDPA training benchmark on one B200 (cuDNN 9.10.2, BF16, causal, GQA 128
   query / 8 KV heads, head dim 128, batch 1; :data:`B200_CUDNN_CSV`), at the lengths where
   the call is at least :data:`KERNEL_BOUND_FLOOR_MULTIPLE` times the run's own 512-token
   time (so host latency is at most 1/10 of it): 8k-128k in both passes. Below that, the
   H100 cuDNN length shape (FA3 paper) anchored at the shortest kernel-bound length; the
   non-causal and head-dim-64 rows are the measured causal hdim-128 rows times the H100
   cuDNN non-causal/causal and hdim-64/hdim-128 ratios at the same length (at 16k above
   the FA3 paper's lengths). FA2 and FA1 scale by the measured B200/H100 FA2 ratio
   (:data:`FA2_B200_OVER_H100`). FA3 does not run on Blackwell: no ``sm_100`` rows.

This script is not imported by the package.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_CSV = REPO / "hardware" / "data" / "attention_efficiency.csv"

#: Sequence lengths of the FA3 paper's benchmark (keys = queries, batch = 16k / seqlen).
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)

#: Dense BF16 peaks of the reference GPUs, FLOP/s (NVIDIA datasheets, sparsity halved).
PEAKS = {"sm_80": 312e12, "sm_90": 989e12, "sm_100": 2.25e15}

FA3_PAPER = "Shah et al. 2024 FlashAttention-3 arXiv 2407.08608 Sec. 4.1 H100 SXM5 BF16"

#: TFLOP/s on H100 SXM5 BF16 at :data:`SEQ_LENS`, keyed (impl, pass, causal, head_dim),
#: as printed on the bars of the FA3 paper's benchmark figures.
H100_MEASURED: dict[tuple[str, str, bool, int], tuple[float, ...]] = {
    ("fa2", "fwd", False, 64): (282, 306, 318, 321, 322, 324),
    ("triton", "fwd", False, 64): (340, 382, 396, 400, 401, 403),
    ("cudnn", "fwd", False, 64): (335, 373, 395, 408, 412, 413),
    ("fa3", "fwd", False, 64): (333, 392, 460, 476, 496, 497),
    ("fa2", "fwd", True, 64): (180, 229, 262, 284, 295, 299),
    ("triton", "fwd", True, 64): (152, 291, 342, 363, 376, 363),
    ("cudnn", "fwd", True, 64): (225, 288, 334, 363, 379, 388),
    ("fa3", "fwd", True, 64): (197, 265, 371, 420, 460, 473),
    ("fa2", "fwd", False, 128): (309, 350, 362, 368, 370, 370),
    ("triton", "fwd", False, 128): (323, 372, 389, 389, 392, 395),
    ("cudnn", "fwd", False, 128): (497, 574, 617, 609, 600, 595),
    ("fa3", "fwd", False, 128): (467, 565, 625, 638, 646, 648),
    ("fa2", "fwd", True, 128): (191, 260, 298, 319, 333, 335),
    ("triton", "fwd", True, 128): (146, 273, 323, 353, 369, 378),
    ("cudnn", "fwd", True, 128): (315, 410, 484, 518, 529, 539),
    ("fa3", "fwd", True, 128): (292, 423, 521, 579, 602, 616),
    ("fa2", "bwd", False, 64): (198, 238, 264, 279, 287, 291),
    ("cudnn", "bwd", False, 64): (266, 348, 395, 417, 432, 433),
    ("fa3", "bwd", False, 64): (272, 363, 422, 453, 472, 474),
    ("fa2", "bwd", False, 128): (214, 260, 291, 310, 318, 322),
    ("cudnn", "bwd", False, 128): (305, 408, 465, 499, 518, 516),
    ("fa3", "bwd", False, 128): (316, 424, 501, 542, 559, 561),
}

#: FA2 forward plateau on A100: "FlashAttention-2 ... reaching 50-73% of the theoretical
#: maximum FLOPs/s on A100" / "up to 230 TFLOPs/s" (Dao 2023, arXiv 2307.08691, abstract and
#: Sec. 4.1). Its H100 counterpart (same kernel) is 370/989 (FA3 paper, hdim 128, 16k).
#: The backward gets the same ratio: FA2's H100 backward/forward (322/370) applied to 0.73
#: gives 0.635, the FA2 paper's backward reach on A100 (its Fig. 6, ~63 %). The FA2 paper
#: checks this pair on H100: fwd 370 and bwd 322 combine (3.5 / (1/370 + 2.5/322)) to the
#: "up to 335 TFLOPs/s" fwd+bwd it reports there.
FA2_A100_FWD_PLATEAU = 0.73
FA2_A100_OVER_H100 = FA2_A100_FWD_PLATEAU / (370.0 / 989.0)

#: FlashAttention v1 relative to FA2, per pass: "the forward pass only reaches 30-50% of the
#: theoretical maximum FLOPs/s of the device, while the backward pass ... only 25-35% of
#: maximum throughput on A100" (FA2 paper, Sec. 1); the tops of the ranges (long sequences)
#: over FA2's A100 plateaus (fwd 0.73, bwd 0.635). Check: fwd+bwd FA2/FA1 = 1.71 at long
#: sequences, inside the paper's "1.7-3.0x faster than FlashAttention".
FA1_OVER_FA2 = {"fwd": 0.50 / FA2_A100_FWD_PLATEAU,
                "bwd": 0.35 / (FA2_A100_FWD_PLATEAU * 322.0 / 370.0)}

#: FlashAttention v1 as first released (flash-attn 0.1, May 2022) on A100 40GB, fp16, batch 16 x
#: 8 heads, head dim 64, no mask, no dropout: runtime in ms at seqlen 512 ... 65536 (Dao et al.
#: 2022, arXiv 2205.14135, Appendix E.6, Table 18 forward and Table 19 backward, row
#: "FlashAttention"). **Not used for rows**: the llm-foundry rows ran flash-attn 1.0.x, whose
#: backward was rewritten after this paper (FA2 paper issue #505: its FA1 bars are v1.0.9, which
#: reach 30-50 % / 25-35 %), while these give only ~0.21 of peak in both passes. What they do
#: measure is the length trend past the 16k the other sources stop at: the efficiency is the
#: same at 16k, 32k and 64k within 1 % in both passes (``tests/test_attention_kernels.py``), which
#: is what ``hardware.compute.attention_efficiency`` assumes (flat above the last knot).
FA1_V01_A100_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
FA1_V01_A100_MS = {"fwd": (0.18, 0.68, 2.40, 8.42, 33.54, 134.03, 535.95, 2147.05),
                   "bwd": (0.52, 1.62, 5.45, 21.57, 84.75, 336.00, 1338.56, 5343.19)}
FA1_V01_A100_SHAPE = {"batch": 16, "heads": 8, "head_dim": 64}

#: OpenAI's Triton flash attention (the 2023 tutorial kernel shipped as ``triton.ops.attention``,
#: the "FlashAttention in Triton" of the FA2 paper's benchmark script) on A100, measured:
#: Triton's own performance-regression test pins it at 0.37 (forward) and 0.25 (backward) of
#: the A100's tensor-core peak at the current SM clock, fp16, causal, batch 4 x 48 heads,
#: seqlen 4096, head dim 64, FLOPs counted as here (causal half of ``4*b*s^2*h*d``, backward
#: 2.5x) -- triton-lang/triton ``python/test/regression/test_performance.py``,
#: ``flash_attention_data["a100"]`` (the values Tri Dao points to in Dao-AILab/flash-attention
#: issue #390, 2023-07-28). Key ``(phase, causal, head_dim, seq_len)``.
TRITON_REGRESSION = "Triton regression test A100 (triton-lang/triton test_performance.py)"
TRITON_A100_MEASURED: dict[tuple[str, bool, int, int], float] = {
    ("fwd", True, 64, 4096): 0.37,
    ("bwd", True, 64, 4096): 0.25,
}

#: The other A100 Triton points (rule 4): FA2's A100 point of the same pass times the
#: measured Triton/FA2 ratio at the regression test's shape, per pass. Check against the FA2
#: paper (Sec. 4.1): "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton
#: in the forward pass and around 2x faster in the backward pass" -- the measured ratios give
#: FA2/Triton = 1.51 (fwd) and 1.95 (bwd) (tests/test_attention_kernels.py). This replaces a
#: single 1/1.8 for both passes (the midpoint of the paper's fwd+bwd "1.3-2.5x").

#: FA2 (flash_attn 2.7.4) on B200 vs H100, hdim 64 non-causal, 16k: B200 fwd 379.4 / bwd
#: 334.0 TFLOP/s of 2250 (Dao-AILab/flash-attention issue #1589) against H100 fwd 324 /
#: bwd 291 of 989 (FA3 paper). FA2's sm80 code runs at half the fraction on Blackwell too.
FA2_B200_OVER_H100 = {"fwd": (379.44 / 2250.0) / (324.0 / 989.0),
                      "bwd": (333.95 / 2250.0) / (291.0 / 989.0)}


#: NVIDIA cudnn-frontend, ``benchmark/sdpa_benchmark_training/artifacts/
#: sdpa_bf16_benchmark_results_NVIDIA_B200.csv`` (commit cb560b92882357764b874dc3be2c469a488a94a7),
#: copied unchanged: one B200 (HGX, "free clock"), NGC PyTorch 25.06 (torch 2.8.0, CUDA 12.9),
#: cuDNN 9.10.2 through PyTorch SDPA's cuDNN backend (``pyt_cudnn``), BF16, batch 1, 128 query
#: heads / 8 KV heads (GQA, Llama-3.1-405B's layer), head dim 128, causal, q = kv = 512..131072;
#: median of 10 timed calls (CUDA events around one ``scaled_dot_product_attention`` call and
#: one ``backward``) after 5 warm-up calls. Its FLOP convention is this table's
#: (``benchmark_bf16_sdpa.py`` ``flops()``: ``4*b*s_q*s_kv*h_q*d``, halved when causal,
#: backward 2.5x), so the efficiency is its TFLOP/s over the B200's dense BF16 2250.
B200_CUDNN_CSV = REPO / "validate" / "data" / "compute" / "cudnn_frontend_sdpa_bf16_B200_cudnn9.10.2.csv"
#: The same benchmark re-run with cuDNN 9.13.0 (NGC PyTorch 25.09, CUDA 13.0; same path at commit
#: bb37575d103b9974bc619a193dc1a96d835dc117). Not used for rows: it checks that the kernel-bound
#: points do not depend on the host (its per-call floor is 3.5x lower in the backward) nor on
#: the cuDNN 9.10 -> 9.13 step (tests/test_attention_kernels.py).
B200_CUDNN_CSV_9_13 = REPO / "validate" / "data" / "compute" / "cudnn_frontend_sdpa_bf16_B200_cudnn9.13.0.csv"
B200_CUDNN_BACKEND = "pyt_cudnn"
B200_CUDNN_SOURCE = "cudnn-frontend sdpa_benchmark_training B200 cuDNN 9.10.2 BF16 (measured)"

#: A measured point is a kernel rate when the call takes at least this many times the run's
#: 512-token call (the same backend and pass): that call's time bounds the per-call host
#: latency the CUDA events include (its kernels alone need ~10 / ~25 us of the 157 us forward
#: and 565 us backward measured), so the latency is at most 10 % of a kernel-bound point. Met
#: from 8k (fwd 11.7x, bwd 10.4x); at 4k 4.0x / 3.5x (the 4k and 2k points are 20-25 % and
#: 50-56 % below the measured 8k point times the H100 cuDNN length shape).
KERNEL_BOUND_FLOOR_MULTIPLE = 10.0

#: Lengths of the ``sm_100`` cuDNN rows: the FA3 paper's plus the benchmark's longer ones.
B200_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def read_sdpa_benchmark(path: Path, backend: str = B200_CUDNN_BACKEND) -> dict[str, dict[int, tuple[float, float]]]:
    """One backend's rows of a cudnn-frontend ``sdpa_bf16_benchmark_results`` CSV:
    ``{phase: {seq_len: (time_ms, tflops_per_s)}}`` (square causal layers only)."""
    out: dict[str, dict[int, tuple[float, float]]] = {"fwd": {}, "bwd": {}}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r["backend"] != backend or r["q_seqlen"] != r["kv_seqlen"] or r["is_causal"] != "True":
                continue
            s = int(r["q_seqlen"])
            out["fwd"][s] = (float(r["forward_time"]), float(r["fwd_tflops_per_sec"]))
            out["bwd"][s] = (float(r["backward_time"]), float(r["bwd_tflops_per_sec"]))
    return out


def kernel_bound_lengths(measured: dict[int, tuple[float, float]]) -> tuple[int, ...]:
    """Lengths whose call takes at least :data:`KERNEL_BOUND_FLOOR_MULTIPLE` times the
    shortest length's call and every longer one does too (one pass)."""
    floor_ms = measured[min(measured)][0]
    out: list[int] = []
    for s in sorted(measured, reverse=True):
        if measured[s][0] < KERNEL_BOUND_FLOOR_MULTIPLE * floor_ms:
            break
        out.append(s)
    return tuple(sorted(out))


def b200_cudnn_table(h100: dict) -> dict[tuple[str, bool, int], list[tuple[int, float, str]]]:
    """sm_100 cuDNN rows (rule 5): ``{(phase, causal, head_dim): [(seq_len, eff, source)]}``."""
    measured = read_sdpa_benchmark(B200_CUDNN_CSV)
    peak_t = PEAKS["sm_100"] / 1e12

    def h100_at(phase: str, causal: bool, d: int, s: int) -> float:
        effs, _ = h100[("cudnn", phase, causal, d)]
        return effs[SEQ_LENS.index(min(s, SEQ_LENS[-1]))]

    out: dict[tuple[str, bool, int], list[tuple[int, float, str]]] = {}
    for phase in ("fwd", "bwd"):
        bound = kernel_bound_lengths(measured[phase])
        anchor = bound[0]
        anchor_eff = measured[phase][anchor][1] / peak_t
        base: dict[int, tuple[float, str]] = {}
        for s in B200_SEQ_LENS:
            if s in bound:
                base[s] = (measured[phase][s][1] / peak_t, B200_CUDNN_SOURCE)
            else:
                base[s] = (anchor_eff * h100_at(phase, True, 128, s) / h100_at(phase, True, 128, anchor),
                           f"rule 5: B200 cuDNN at {anchor} x H100 cuDNN length shape (FA3 paper)")
        for causal in (False, True):
            for d in (64, 128):
                rows = []
                for s in B200_SEQ_LENS:
                    eff, src = base[s]
                    if (causal, d) != (True, 128):
                        eff *= h100_at(phase, causal, d, s) / h100_at(phase, True, 128, s)
                        src = ("rule 5: B200 cuDNN causal hdim 128 x H100 cuDNN "
                               f"{'causal' if causal else 'non-causal'} hdim {d} / causal hdim 128 (FA3 paper)")
                    rows.append((s, eff, src))
                out[(phase, causal, d)] = rows
    return out


def h100_table() -> dict[tuple[str, str, bool, int], tuple[tuple[float, ...], str]]:
    """sm_90 efficiencies (measured and rules 1-3): ``{key: (efficiencies, source)}``."""
    peak_t = PEAKS["sm_90"] / 1e12
    out = {key: (tuple(v / peak_t for v in vals), FA3_PAPER)
           for key, vals in H100_MEASURED.items()}
    for impl in ("fa2", "cudnn", "fa3"):
        for d in (64, 128):
            nc_b, _ = out[(impl, "bwd", False, d)]
            nc_f, _ = out[(impl, "fwd", False, d)]
            c_f, _ = out[(impl, "fwd", True, d)]
            out[(impl, "bwd", True, d)] = (
                tuple(b * cf / nf for b, cf, nf in zip(nc_b, c_f, nc_f)),
                "rule 1: non-causal bwd x causal/non-causal fwd (FA3 paper)")
    for causal in (False, True):
        for d in (64, 128):
            tf, _ = out[("triton", "fwd", causal, d)]
            ff, _ = out[("fa2", "fwd", causal, d)]
            fb, _ = out[("fa2", "bwd", causal, d)]
            out[("triton", "bwd", causal, d)] = (
                tuple(t * b / f for t, b, f in zip(tf, fb, ff)),
                "rule 2: Triton fwd x FA2 bwd/fwd (FA3 paper)")
    for (impl, phase, causal, d), (eff, _) in list(out.items()):
        if impl == "fa2":
            out[("fa1", phase, causal, d)] = (
                tuple(e * FA1_OVER_FA2[phase] for e in eff),
                "rule 3: FA2 x FA1/FA2 reach on A100 (FA2 paper Sec. 1)")
    return out


def triton_a100_over_fa2(h100: dict) -> dict[str, float]:
    """Per pass, the measured A100 Triton efficiency (:data:`TRITON_A100_MEASURED`) over the
    A100 FA2 efficiency (rule 4) at the same point."""
    out = {}
    for (phase, causal, d, s), eff in TRITON_A100_MEASURED.items():
        fa2_h100, _ = h100[("fa2", phase, causal, d)]
        out[phase] = eff / (fa2_h100[SEQ_LENS.index(s)] * FA2_A100_OVER_H100)
    return out


def derive() -> list[tuple]:
    """Rows ``(profile, impl, phase, causal, head_dim, seq_len, efficiency, peak, source)``."""
    rows = []
    h100 = h100_table()
    triton_ratio = triton_a100_over_fa2(h100)
    for (impl, phase, causal, d), (eff, src) in h100.items():
        for s, e in zip(SEQ_LENS, eff):
            rows.append(("sm_90", impl, phase, causal, d, s, e, PEAKS["sm_90"], src))
    for (impl, phase, causal, d), (eff, _) in h100.items():
        if impl == "fa2":
            a100 = {
                "fa2": (FA2_A100_OVER_H100, "rule 4: H100 FA2 x A100/H100 FA2 plateau (FA2 paper)"),
                "fa1": (FA2_A100_OVER_H100 * FA1_OVER_FA2[phase], "rule 4: A100 FA2 x FA1/FA2"),
                "triton": (FA2_A100_OVER_H100 * triton_ratio[phase],
                           "rule 4: A100 FA2 x measured Triton/FA2 (Triton regression test)"),
                "cudnn": (FA2_A100_OVER_H100, "rule 4: assumption cuDNN = FA2 on Ampere"),
            }
            for a_impl, (factor, src) in a100.items():
                for s, e in zip(SEQ_LENS, eff):
                    measured = a_impl == "triton" and (phase, causal, d, s) in TRITON_A100_MEASURED
                    rows.append(("sm_80", a_impl, phase, causal, d, s, e * factor, PEAKS["sm_80"],
                                 TRITON_REGRESSION if measured else src))
            for b_impl, factor in (("fa2", FA2_B200_OVER_H100[phase]),
                                   ("fa1", FA2_B200_OVER_H100[phase] * FA1_OVER_FA2[phase])):
                for s, e in zip(SEQ_LENS, eff):
                    rows.append(("sm_100", b_impl, phase, causal, d, s, e * factor, PEAKS["sm_100"],
                                 "rule 5: H100 FA2 x B200/H100 FA2 (flash-attention #1589)"))
    for (phase, causal, d), b_rows in b200_cudnn_table(h100).items():
        for s, e, src in b_rows:
            rows.append(("sm_100", "cudnn", phase, causal, d, s, e, PEAKS["sm_100"], src))
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3], r[4], r[5]))
    return rows


def render_csv(rows: list[tuple]) -> str:
    """The CSV text (fixed formatting, so --check is byte-exact)."""
    buf = io.StringIO()
    buf.write("profile,impl,phase,causal,head_dim,seq_len,efficiency,peak_flops_per_s,source\n")
    for profile, impl, phase, causal, d, s, e, peak, src in rows:
        buf.write(f"{profile},{impl},{phase},{int(causal)},{d},{s},{e:.5f},{peak:g},{src}\n")
    return buf.getvalue()


def summary(rows: list[tuple]) -> str:
    """Long-sequence (16k) hdim-128 causal efficiencies per profile and implementation."""
    lines = ["profile impl    fwd    bwd   (hdim 128, causal, 16k; fraction of dense BF16 peak)"]
    table = {(r[0], r[1], r[2]): r[6] for r in rows if r[3] and r[4] == 128 and r[5] == 16384}
    for profile in ("sm_80", "sm_90", "sm_100"):
        for impl in ("fa1", "fa2", "triton", "cudnn", "fa3"):
            if (profile, impl, "fwd") in table:
                lines.append(f"{profile:7s} {impl:6s} {table[(profile, impl, 'fwd')]:.3f}  "
                             f"{table[(profile, impl, 'bwd')]:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT_CSV)
    ap.add_argument("--check", action="store_true", help="do not write; fail if --out differs")
    ap.add_argument("--quiet", action="store_true", help="no summary")
    args = ap.parse_args(argv)
    rows = derive()
    text = render_csv(rows)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; rerun tools/derive_attention_efficiency.py",
                  file=sys.stderr)
            return 1
    else:
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(rows)} rows)")
    if not args.quiet:
        print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
