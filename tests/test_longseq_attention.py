"""What the published long-sequence rows say about attention time (issue 12).

``tools/longseq_attention_rates.py`` finds, for every long-sequence row, the factor ``k*``
on every fused-attention kernel's priced time at which the simulated step equals the
published one. These tests pin what it finds:

* NeMo 24.03.01 on DGX-H100 (LLAMA2-7B FP8, cuDNN 9.0.0 of the NGC PyTorch 24.02 base
  container, TE main @bfe21c3d as the NeMo README of that container pins): TE's backend
  selection ran cuDNN FusedAttention there, with and without CP (hardware.compute
  DEFAULT_ATTENTION_IMPL gives the source); attention runs ~1.25-1.35x slower than priced (implied
  305-335 TFLOP/s fwd+bwd per GPU, 0.31-0.34 of the BF16 peak), and the factor is the
  same *without* context parallelism (8K-16K, CP 1) as with CP 32 at 1M tokens: the miss
  is the kernel rate of that stack, not the context-parallel ring trainsim lowers
  (per-step shapes, corrections, the backward's dK/dV ring). trainsim's sm_90 cuDNN rows
  are the FlashAttention-3 paper's cuDNN 9.1.1 bars; no source was found for what
  cuDNN 9.0.0 reached, so the table is not changed (a fitted factor is not allowed).
* NeMo 25.04 on DGX-B200 (LLAMA3-8B FP8) at 128K+ is priced right within 3 % (k* 1.01-1.03)
  now that the sm_100 cuDNN rows are cudnn-frontend's measured B200 rates (cuDNN 9.10.2);
  with the earlier rows (H100's cuDNN fraction of peak) it implied attention ~5-9 % faster
  than priced. The Megatron-Core Qwen3 forced-balance rows on H100 (2025) run ~1.2x faster
  than priced -- ~1.55x the rate the 2024 H100 rows imply on the same GPU: the rate depends
  on the software era.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from hardware.compute import resolve_attention_impl
from sim.step import simulate_step
from strategies.model_costs import FLASH_BWD_FLOP_FACTOR
from tool_modules import load_tool
from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for

rates = load_tool("longseq_attention_rates")


@pytest.fixture(scope="module")
def by_row():
    return {r.row_id: r for r in rates.row_rates()}


def _h100_nemo(by_row):
    return [r for r in by_row.values()
            if r.row_id.startswith("nemo_longseq_") and r.gpu == "H100-SXM"]


def test_attention_flops_closed_form():
    """nemo_longseq_09 (LLAMA2-7B, 1M tokens, TP 8, CP 32, DP 4, GBS 4): causal forward
    s^2 * 32 heads * 256 per layer, 32 layers, one sequence per DP rank over TP*CP = 256
    GPUs, times (1 + 2.5) = 3584 * 2^40 FLOPs exactly."""
    run = next(r for r in load_runs(sources=["nvidia_nemo_perf"]) if r.row_id == "nemo_longseq_09")
    scenario = scenario_for(run, load_models(), load_nemo_recipes())
    flops = rates.attention_flops_per_gpu(scenario.model, scenario.plan)
    assert 1 + FLASH_BWD_FLOP_FACTOR == 3.5
    assert flops == 3584 * 2 ** 40


def test_bad_published_step_is_rejected():
    with pytest.raises(ValueError, match="published_s"):
        rates.solve_factor(None, 0.0)


@pytest.mark.slow  # simulates the 25 long-sequence rows ~4 times each (~3 s)
def test_every_row_is_solved(by_row):
    assert len(by_row) == 25
    for r in by_row.values():
        assert abs(r.solved_s / r.published_s - 1) <= 1e-3, r


@pytest.mark.slow
def test_nemo_2403_h100_attention_is_slower_than_priced(by_row):
    """Every H100 row with attention >= 40 % of the step: k* in [1.2, 1.4] (measured
    1.26-1.35); implied 0.30-0.35 of the BF16 peak (measured 0.313-0.336)."""
    long_rows = [r for r in _h100_nemo(by_row) if r.attention_share >= 0.4]
    assert len(long_rows) == 7
    for r in long_rows:
        assert 1.2 <= r.factor <= 1.4, r
        assert 0.30 <= r.implied_efficiency <= 0.35, r


@pytest.mark.slow
def test_the_miss_is_not_context_parallelism(by_row):
    """The factor without CP (8K at PP 2 and 16K at TP 2, CP 1; attention 30-43 % of the step) and with CP >= 8 (256K-1M) differ
    by less than 0.1 (measured 1.25 vs 1.33): a missing ring mechanism would show only with
    CP."""
    rows = _h100_nemo(by_row)
    no_cp = [r.factor for r in rows if r.cp == 1 and r.attention_share >= 0.25]
    wide_cp = [r.factor for r in rows if r.cp >= 8]
    assert len(no_cp) == 2 and len(wide_cp) == 3
    assert abs(statistics.median(wide_cp) - statistics.median(no_cp)) < 0.1


@pytest.mark.slow
def test_newer_stacks_run_attention_at_least_as_fast_as_priced(by_row):
    """NeMo 25.04 on B200 at >= 128K: k* in [0.95, 1.05] (1.01-1.03 since the sm_100 cuDNN
    rows are cudnn-frontend's measured cuDNN 9.10.2 rates and dgx-b200 is refitted on them;
    0.92-0.94 with the rule-5 rows derived from H100, which priced the kernel ~7 % slow). Megatron-Core
    Qwen3 forced-balance rows on H100: k* in [0.7, 0.9] (measured 0.79-0.82), and their
    implied rate is >= 1.4x the NeMo 24.03 H100 rows' median (measured ~1.55x)."""
    b200 = [r for r in by_row.values() if r.row_id.startswith("nemo_longseq_b200_")
            and r.seq_len >= 131072]
    assert len(b200) == 4
    for r in b200:
        assert 0.95 <= r.factor <= 1.05, r
    qwen_fb = [r for r in by_row.values() if r.row_id.startswith("mcore_moe_qwen3_long_")
               and r.row_id.endswith("_fb")]
    assert len(qwen_fb) == 4
    for r in qwen_fb:
        assert 0.7 <= r.factor <= 0.9, r
    nemo = statistics.median(r.implied_tflops for r in _h100_nemo(by_row)
                             if r.attention_share >= 0.4)
    assert statistics.median(r.implied_tflops for r in qwen_fb) >= 1.4 * nemo


def _nemo_2403_runs():
    return [r for r in load_runs(sources=["nvidia_nemo_perf"])
            if r.get("framework_version").startswith("NeMo 24.03")]


def test_nemo_2403_rows_run_te_default_cudnn():
    """The NeMo 24.03 rows (only the nine H100 long-sequence rows) carry no attention
    override: the launcher recipe sets ``use_flash_attention: true`` and no
    ``NVTE_FUSED_ATTN``, so TE's selection runs, and on sm_90 it resolves to cuDNN (its
    Hopper preference and CP-with-cuDNN rule: hardware.compute.DEFAULT_ATTENTION_IMPL)."""
    runs = _nemo_2403_runs()
    assert sorted(r.row_id for r in runs) == [f"nemo_longseq_0{i}" for i in range(1, 10)]
    models, recipes = load_models(), load_nemo_recipes()
    for run in runs:
        scenario = scenario_for(run, models, recipes)
        assert scenario.plan.attention_impl == "auto", run.row_id
        profile = scenario.cluster.gpu.matmul_profile
        assert profile == "sm_90"
        assert resolve_attention_impl(profile) == "cudnn"


@pytest.mark.slow  # simulates the nine rows twice (~1 s)
def test_fa2_is_not_what_the_nemo_2403_rows_ran(by_row):
    """Pricing flash-attn 2 instead (the backend TE 1.0/1.1 preferred) overshoots: every
    row with attention >= 40 % of the step lands >= 10 % above its published step (measured
    +13 to +22 %; the cuDNN 9.1 pricing is -10 to -24 %, which test_published tracks). The
    rows sit between the two kernels, as the source says cuDNN (of release 9.0) ran; a
    fitted factor would hide that."""
    models, recipes = load_models(), load_nemo_recipes()
    checked = 0
    for run in _nemo_2403_runs():
        if by_row[run.row_id].attention_share < 0.4:
            continue
        scenario = scenario_for(run, models, recipes)
        plan = dataclasses.replace(scenario.plan, attention_impl="fa2")
        step_s = simulate_step(scenario.model, scenario.cluster, plan, fidelity="analytic",
                               check_memory=False).step_time_s
        assert step_s / run.published_step_time_s - 1 >= 0.10, run.row_id
        checked += 1
    assert checked == 7
