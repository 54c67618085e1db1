#!/usr/bin/env python3
"""The fused-attention rate the published long-sequence rows imply (issue 12).

Run from the repository root::

    PYTHONPATH=. python tools/longseq_attention_rates.py            # markdown table
    PYTHONPATH=. python tools/longseq_attention_rates.py --min-seq 65536

Evidence, not a fit: every long-sequence row -- NeMo's "Long Input Sequences" tables
(``nemo_longseq_*``: LLAMA2-7B FP8 on DGX-H100, NeMo 24.03.01; ``nemo_longseq_b200_*``:
LLAMA3-8B FP8 on DGX-B200, NeMo 25.04.rc2) and the Megatron-Core MoE model zoo's Qwen3
long-context rows (``mcore_moe_qwen3_long_*``) -- is simulated at analytic fidelity with
exactly the settings ``trainsim validate published`` uses, with every fused-attention
kernel's time multiplied by a factor ``k`` (launch overhead and every other op as priced).
The step time is then a monotone, piecewise-linear function of ``k``; ``k*`` is the factor
at which it equals the published step (secant iterations). ``1/k*`` is the share of the
priced attention rate the published step allows when everything else is priced right; at
long sequences attention is most of the step, so an error elsewhere moves ``k*`` little
(the table lists the attention share; the short rows of the same tables, where attention
is a small share, bound the rest: their errors are listed too).

Rates are fwd+bwd attention TFLOP/s per GPU counted as the kernels execute them
(FlashAttention's benchmark convention, ``strategies.model_costs``: causal forward
``s^2 * a * (d_qk + d_v)`` per sequence and layer, backward 2.5x, a full recompute runs
the forward again), over the attention time on the step's critical path
(``d step / d k``, the ring's exchanges hidden behind the kernels). "Kernel efficiency"
is that rate over the GPU's dense BF16 peak, the units of
``hardware/data/attention_efficiency.csv`` times the preset's ``sustained_fraction``.

This script is not imported by the package; ``tests/test_longseq_attention.py`` pins what
it finds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hardware.compute import ComputeModel  # noqa: E402
from sim.step import simulate_step  # noqa: E402
from strategies.model_costs import CAUSAL_FLOP_FRACTION, FLASH_BWD_FLOP_FACTOR  # noqa: E402
from validate.published import (  # noqa: E402
    _step_from_flop_rate, load_models, load_nemo_recipes, load_runs, scenario_for)

#: ``(source_id, row_id prefix)`` of the long-sequence rows.
ROW_SETS = (("nvidia_nemo_perf", "nemo_longseq_"),
            ("megatron_core_moe", "mcore_moe_qwen3_long_"))

#: The attention factor ``k`` at which a row's step is first evaluated besides ``k = 1``.
_PROBE_FACTOR = 1.5


class _ScaledAttention(ComputeModel):
    """The GPU's roofline with every fused-attention kernel ``factor`` times as long."""

    def __init__(self, gpu, factor: float):
        super().__init__(gpu)
        object.__setattr__(self, "_attention_factor", factor)

    def kernel_time_s(self, op) -> float:
        """The roofline's kernel time, times the factor for an attention op."""
        time_s = super().kernel_time_s(op)
        return time_s * self._attention_factor if op.kind == "attention" else time_s


@dataclass
class LongSeqRates:
    """One row's simulated and implied attention figures (module docstring)."""

    row_id: str
    gpu: str
    model: str
    seq_len: int
    tp: int
    cp: int
    published_s: float
    simulated_s: float
    attention_s: float
    factor: float
    solved_s: float
    attention_flops: float
    peak_flops_per_s: float

    @property
    def error(self) -> float:
        """simulated / published - 1."""
        return self.simulated_s / self.published_s - 1

    @property
    def attention_share(self) -> float:
        """Share of the simulated step that is attention time on the critical path."""
        return self.attention_s / self.simulated_s

    @property
    def priced_tflops(self) -> float:
        """Fwd+bwd attention TFLOP/s per GPU as trainsim prices the row."""
        return self.attention_flops / self.attention_s / 1e12

    @property
    def implied_tflops(self) -> float:
        """Fwd+bwd attention TFLOP/s per GPU the published step implies."""
        return self.priced_tflops / self.factor

    @property
    def implied_efficiency(self) -> float:
        """The implied rate over the GPU's dense BF16 peak."""
        return self.implied_tflops * 1e12 / self.peak_flops_per_s


def attention_flops_per_gpu(model, plan) -> float:
    """Executed fused-attention FLOPs of one training step on one GPU: causal forward
    ``s^2 * a * (d_qk + d_v)`` per sequence and layer, split over TP (heads) and CP
    (queries), each rank's ``global_batch / dp`` sequences and ``layers / pp`` layers;
    backward 2.5x; a full recompute adds a forward."""
    fwd_per_seq_layer = (CAUSAL_FLOP_FRACTION * 2.0 * plan.seq_len ** 2 * model.num_heads
                         * (model.qk_head_dim + model.v_head_dim))
    n_fwd = 2 if plan.recompute == "full" else 1
    return (fwd_per_seq_layer * (model.num_layers / plan.pp) * (plan.global_batch / plan.dp)
            / (plan.tp * plan.cp) * (n_fwd + FLASH_BWD_FLOP_FACTOR))


def _step_s(scenario, factor: float) -> float:
    """Analytic step time with attention kernels ``factor`` times as long."""
    compute = _ScaledAttention(scenario.cluster.gpu, factor)
    return simulate_step(scenario.model, scenario.cluster, scenario.plan, fidelity="analytic",
                         check_memory=False, compute=compute).step_time_s


def solve_factor(scenario, published_s: float, *, tolerance: float = 1e-3,
                 iterations: int = 8) -> tuple[float, float, float, float]:
    """``(k*, simulated step at k = 1, critical-path attention seconds at k = 1, step at
    k*)``: secant
    iterations on the step time as a function of the attention factor until it is within
    ``tolerance`` (relative) of ``published_s``.

    Raises:
        ValueError: a non-positive published step, or a step that does not depend on
            the attention kernels.
    """
    if not published_s > 0:
        raise ValueError(f"published_s: {published_s!r} is not valid; valid: seconds > 0")
    k0, t0 = 1.0, _step_s(scenario, 1.0)
    k1, t1 = _PROBE_FACTOR, _step_s(scenario, _PROBE_FACTOR)
    if t1 <= t0:
        raise ValueError("attention factor: the step does not depend on attention kernels")
    attention_s = (t1 - t0) / (k1 - k0)
    simulated_s = t0
    for _ in range(iterations):
        if abs(t1 / published_s - 1) <= tolerance:
            break
        slope = (t1 - t0) / (k1 - k0)
        k_next = max(1e-3, k1 + (published_s - t1) / slope)
        k0, t0 = k1, t1
        k1, t1 = k_next, _step_s(scenario, k_next)
    return k1, simulated_s, attention_s, t1


def row_rates(min_seq: int = 0) -> list[LongSeqRates]:
    """Every long-sequence row (:data:`ROW_SETS`) at ``min_seq`` tokens or longer."""
    models = load_models()
    recipes = load_nemo_recipes()
    out = []
    for source, prefix in ROW_SETS:
        for run in load_runs(sources=[source]):
            if not run.row_id.startswith(prefix):
                continue
            scenario = scenario_for(run, models, recipes)
            plan = scenario.plan
            if plan.seq_len < min_seq:
                continue
            # a row printing only TFLOP/s: its step as ``trainsim validate published`` derives it
            published_s = run.published_step_time_s or _step_from_flop_rate(run, scenario)
            factor, simulated_s, attention_s, solved_s = solve_factor(scenario, published_s)
            out.append(LongSeqRates(
                row_id=run.row_id, gpu=run.get("gpu"), model=run.get("model"),
                seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
                published_s=published_s, simulated_s=simulated_s,
                attention_s=attention_s, factor=factor, solved_s=solved_s,
                attention_flops=attention_flops_per_gpu(scenario.model, plan),
                peak_flops_per_s=scenario.cluster.gpu.peak_flops_per_s["bf16"]))
    return out


def markdown(rows: list[LongSeqRates]) -> str:
    """The per-row table as markdown."""
    lines = ["| row | GPU | model | seq | TP | CP | error | attn share | priced TFLOP/s | "
             "k* | implied TFLOP/s | implied eff. |",
             "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r.row_id} | {r.gpu} | {r.model} | {r.seq_len} | {r.tp} | {r.cp} | "
            f"{r.error:+.1%} | {r.attention_share:.2f} | {r.priced_tflops:.0f} | "
            f"{r.factor:.3f} | {r.implied_tflops:.0f} | {r.implied_efficiency:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-seq", type=int, default=0,
                        help="shortest sequence length tabulated (default: every row)")
    args = parser.parse_args(argv)
    if args.min_seq < 0:
        raise ValueError(f"--min-seq: {args.min_seq!r} is not valid; valid: a length >= 0")
    print(markdown(row_rates(args.min_seq)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
