#!/usr/bin/env python3
"""The fused-attention rate MosaicML's llm-foundry benchmark rows imply (issue 12).

Run from the repository root::

    PYTHONPATH=. python tools/llmfoundry_attention_rates.py              # markdown tables
    PYTHONPATH=. python tools/llmfoundry_attention_rates.py --min-seq 4096

Evidence, not a fit: every long-sequence row of ``train_mosaicml_llmfoundry.csv`` is
simulated twice at analytic fidelity with exactly the settings ``trainsim validate
published`` uses -- once as priced, once with every attention kernel free (launch
overhead kept) -- so ``simulated - free`` is the attention time trainsim charges and
``free`` the simulated non-attention time. The attention time the published step leaves is
``published - c * free``, where ``c`` = published / simulated of the *reference row*: the
same model, table section and GPU count at that section's shortest sequence, where
attention is a small share; its per-token costs (GEMMs, FSDP, loss, optimizer) are the
long row's, so they cancel (``c = 1`` gives the unpaired figure, also listed).

Rates are fwd+bwd attention TFLOP/s per GPU counted as FlashAttention's benchmark counts
them (``benchmarks/benchmark_flash_attention.py``: causal forward ``2*b*s^2*a*d``, backward
2.5x, a full activation recompute runs the forward again): the FLOPs the kernels execute.
"Kernel efficiency" converts the implied time into the units of
``hardware/data/attention_efficiency.csv`` (fraction of the dense BF16 peak at the
kernel's own clock) without restating the cost model: it is the efficiency trainsim
prices the row with (``attention_impl`` of the row, :func:`combined_efficiency`) times
simulated / implied attention time. Candidates are the same combination of the table's
rows for flash-attn 1.x (``fa1``), Triton (``triton``), flash-attn 2 / SDPA flash
(``fa2``) and cuDNN (``cudnn``).

This script is not imported by the package; ``tests/test_llmfoundry_attention.py`` pins
what it finds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hardware.compute import ComputeModel, attention_efficiency  # noqa: E402
from sim.step import simulate_step  # noqa: E402
from strategies.model_costs import FLASH_BWD_FLOP_FACTOR  # noqa: E402
from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
# the step's executed attention FLOPs, one formula for both tools (TP, CP, PP and DP split)
from longseq_attention_rates import attention_flops_per_gpu  # noqa: E402

SOURCE = "mosaicml_llmfoundry"
#: attention implementations compared with the implied rates
CANDIDATES = ("fa1", "triton", "fa2", "cudnn")
_SECTION = re.compile(r"Section title: (.+?)\. Parsed")


class _AttentionFree(ComputeModel):
    """The GPU's roofline with every fused-attention kernel free (its launch kept)."""

    def kernel_time_s(self, op) -> float:
        """0 for an attention op, else the roofline's kernel time."""
        if op.kind == "attention":
            return 0.0
        return super().kernel_time_s(op)


def section_of(notes: str) -> str:
    """The benchmark README section a row was copied from (its ``notes``)."""
    match = _SECTION.search(notes)
    return match.group(1) if match else ""


def combined_efficiency(profile: str, impl: str, *, head_dim: int, seq_len: int,
                        recompute: bool) -> float:
    """Fwd+bwd efficiency of ``impl`` (table units) over one training step's attention
    work: ``n`` causal forwards (2 with a full recompute) and one backward of 2.5x a
    forward, each at its own table efficiency (the times add)."""
    fwd = attention_efficiency(profile, impl, phase="fwd", causal=True, head_dim=head_dim,
                               seq_len=seq_len)
    bwd = attention_efficiency(profile, impl, phase="bwd", causal=True, head_dim=head_dim,
                               seq_len=seq_len)
    n_fwd = 2 if recompute else 1
    return (n_fwd + FLASH_BWD_FLOP_FACTOR) / (n_fwd / fwd + FLASH_BWD_FLOP_FACTOR / bwd)


@dataclass
class RowRates:
    """One row's simulated and implied attention figures (module docstring)."""

    row_id: str
    section: str
    gpu: str
    model: str
    seq_len: int
    head_dim: int
    recompute: bool
    impl: str
    published_s: float
    simulated_s: float
    free_s: float
    attention_flops: float
    reference_row: str = ""
    reference_ratio: float = 1.0
    candidates: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """simulated / published - 1."""
        return self.simulated_s / self.published_s - 1

    @property
    def attention_share(self) -> float:
        """Share of the simulated step that is attention time."""
        return (self.simulated_s - self.free_s) / self.simulated_s

    def implied_attention_s(self, paired: bool = True) -> float:
        """Attention seconds the published step leaves (paired: per-token costs from the
        reference row)."""
        return self.published_s - (self.reference_ratio if paired else 1.0) * self.free_s

    def implied_tflops(self, paired: bool = True) -> float:
        """Implied fwd+bwd attention TFLOP/s per GPU (executed FLOPs)."""
        return self.attention_flops / self.implied_attention_s(paired) / 1e12

    def kernel_efficiency(self, paired: bool = True) -> float:
        """The implied rate in the table's units (module docstring)."""
        priced = self.candidates[self.impl]
        return priced * (self.simulated_s - self.free_s) / self.implied_attention_s(paired)


def row_rates(min_seq: int = 8192) -> list[RowRates]:
    """Every llm-foundry row at ``min_seq`` or longer, paired with its reference row."""
    runs = load_runs(sources=[SOURCE])
    models = load_models()
    recipes = load_nemo_recipes()
    cases = []
    for run in runs:
        scenario = scenario_for(run, models, recipes)
        key = (run.get("model"), section_of(run.get("notes")), run.integer("num_gpus"))
        cases.append((run, scenario, key))
    shortest: dict[tuple, tuple] = {}
    for run, scenario, key in cases:
        if key not in shortest or scenario.plan.seq_len < shortest[key][1].plan.seq_len:
            shortest[key] = (run, scenario)
    wanted = [c for c in cases if c[1].plan.seq_len >= min_seq]
    needed = {id(c[0]): c for c in wanted}
    for _, _, key in wanted:
        run, scenario = shortest[key]
        needed.setdefault(id(run), (run, scenario, key))
    priced: dict[str, tuple[float, float]] = {}
    for run, scenario, _ in needed.values():
        model, cluster, plan = scenario.model, scenario.cluster, scenario.plan
        full = simulate_step(model, cluster, plan, fidelity="analytic",
                             check_memory=False).step_time_s
        free = simulate_step(model, cluster, plan, fidelity="analytic", check_memory=False,
                             compute=_AttentionFree(cluster.gpu)).step_time_s
        priced[run.row_id] = (full, free)
    out = []
    for run, scenario, key in wanted:
        model, cluster, plan = scenario.model, scenario.cluster, scenario.plan
        full, free = priced[run.row_id]
        ref_run, ref_scenario = shortest[key]
        head_dim = model.head_dim
        rates = RowRates(
            row_id=run.row_id, section=key[1], gpu=run.get("gpu"), model=key[0],
            seq_len=plan.seq_len, head_dim=head_dim, recompute=plan.recompute == "full",
            impl=plan.attention_impl, published_s=run.published_step_time_s,
            simulated_s=full, free_s=free,
            attention_flops=attention_flops_per_gpu(model, plan))
        if ref_scenario.plan.seq_len < plan.seq_len:
            ref_full, _ = priced[ref_run.row_id]
            rates.reference_row = ref_run.row_id
            rates.reference_ratio = ref_run.published_step_time_s / ref_full
        rates.candidates = {
            impl: combined_efficiency(cluster.gpu.matmul_profile, impl, head_dim=head_dim, seq_len=plan.seq_len,
                                      recompute=rates.recompute)
            for impl in CANDIDATES}
        out.append(rates)
    return out


def summary(rows: list[RowRates]) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per (section, GPU, head dim) of the paired rows: the count, the median implied
    kernel efficiency and its median ratio to each candidate's."""
    groups: dict[tuple[str, str, int], list[RowRates]] = {}
    for r in rows:
        if r.reference_row:
            groups.setdefault((r.section, r.gpu, r.head_dim), []).append(r)
    out = {}
    for key, members in sorted(groups.items()):
        stats = {"rows": float(len(members)),
                 "implied": statistics.median(r.kernel_efficiency() for r in members)}
        for impl in CANDIDATES:
            stats[impl] = statistics.median(r.kernel_efficiency() / r.candidates[impl]
                                            for r in members)
        out[key] = stats
    return out


def markdown(rows: list[RowRates]) -> str:
    """The per-row table and the per-section summary as markdown."""
    lines = ["| row | section | GPU | model | seq | hdim | AC | error | attn share | "
             "implied TFLOP/s (unpaired) | implied TFLOP/s (paired) | kernel eff. | "
             + " | ".join(CANDIDATES) + " | reference |",
             "|" + "---|" * (13 + len(CANDIDATES))]
    for r in sorted(rows, key=lambda r: (r.gpu, r.section, r.head_dim, r.model, r.seq_len)):
        paired = f"{r.implied_tflops():.0f}" if r.reference_row else "-"
        eff = f"{r.kernel_efficiency():.3f}" if r.reference_row else "-"
        lines.append(
            f"| {r.row_id} | {r.section} | {r.gpu} | {r.model} | {r.seq_len} | {r.head_dim} | "
            f"{'full' if r.recompute else 'none'} | {r.error:+.1%} | {r.attention_share:.2f} | "
            f"{r.implied_tflops(paired=False):.0f} | {paired} | {eff} | "
            + " | ".join(f"{r.candidates[i]:.3f}" for i in CANDIDATES)
            + f" | {r.reference_row} ({1 / r.reference_ratio - 1:+.1%}) |")
    lines += ["", "| section | GPU | hdim | rows | implied kernel eff. | "
              + " | ".join(f"implied / {i}" for i in CANDIDATES) + " |",
              "|" + "---|" * (5 + len(CANDIDATES))]
    for (section, gpu, hdim), s in summary(rows).items():
        lines.append(f"| {section} | {gpu} | {hdim} | {int(s['rows'])} | {s['implied']:.3f} | "
                     + " | ".join(f"{s[i]:.2f}" for i in CANDIDATES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-seq", type=int, default=8192,
                        help="shortest sequence length tabulated (default 8192)")
    args = parser.parse_args(argv)
    if args.min_seq < 1:
        raise ValueError(f"--min-seq: {args.min_seq!r} is not valid; valid: a length >= 1")
    print(markdown(row_rates(args.min_seq)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
