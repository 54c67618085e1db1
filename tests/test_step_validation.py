"""Simulated step times against published training runs (validate/data/published).

Megatron-LM 2021 (Narayanan et al. 2021, Table 1; megatron_lm_a100_weak_scaling_2021.csv):
GPT models of 1.7B-1T parameters on 32-3072 A100s, vocabulary 51,200, sequence 2048,
full activation recompute, TP = min(model-parallel size, 8), PP = model-parallel size / TP,
DP = GPUs / model-parallel size. The software of the time: unfused attention, gradient
all-reduce after the backward (no overlap), no distributed optimizer, micro-batch 1,
non-interleaved 1F1B. The published step time follows from the published TFLOP/s per
GPU: those runs count 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per step.

Megatron-LM 2022 (megatron_lm_mfu_hfu_2022.csv): MFU of 22B-1T GPT models with sequence
parallelism and selective recompute at data-parallel size 1 (configurations below).

MosaicML llm-foundry (mosaicml_llmfoundry_mpt_throughput.csv): MPT-13B/30B/70B on 128
H100s with PyTorch FSDP (ZeRO-3), flash attention and activation checkpointing.

The dgx-a100 and dgx-h100 presets each carry one calibrated number
(``gpu.sustained_fraction``) fitted on these runs; the tests check that the physics
then reproduces every row within the tolerance (printing the table), not that a
single row was fitted.
"""

from __future__ import annotations

import csv
from concurrent.futures import ProcessPoolExecutor

import pytest

from conftest import DATA
from hardware.catalog import load_cluster
from sim.step import simulate_step
from strategies.model_spec import ModelSpec
from strategies.plan import ParallelPlan

TOLERANCE = 0.10
# Attention heads of each Megatron model (Narayanan et al. 2021, Table 1).
MEGATRON_HEADS = {"1.7B": 24, "3.6B": 32, "7.5B": 32, "18B": 48, "39B": 64, "76B": 80,
                  "145B": 96, "310B": 128, "530B": 128, "1T": 160}
SEQ, VOCAB = 2048, 51200


def _megatron_rows() -> list[dict[str, str]]:
    path = DATA / "published" / "orig_megatron_lm_a100_weak_scaling_2021.csv"
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def megatron_case(row: dict[str, str]) -> tuple[ModelSpec, ParallelPlan, float]:
    """Model, plan and published step time (s) of one Megatron row."""
    h, layers = int(row["hidden_size"]), int(row["num_layers"])
    mp, gpus, batch = (int(row[k]) for k in ("model_parallel_size", "num_gpus",
                                             "batch_size_seqs"))
    heads = MEGATRON_HEADS[row["model_size_label"]]
    model = ModelSpec(name=f"megatron-{row['model_size_label']}", num_layers=layers,
                      hidden_size=h, num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
                      ffn_hidden_size=4 * h, vocab_size=VOCAB, mlp="gelu", norm="layernorm",
                      tied_embeddings=True, dropout=True)
    tp = min(mp, 8)
    plan = ParallelPlan(dp=gpus // mp, tp=tp, pp=mp // tp, micro_batch=1, global_batch=batch,
                        seq_len=SEQ, recompute="full", zero=0, flash_attention=False,
                        overlap_grad_reduce=False)
    flops = 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))
    published_s = flops / (float(row["achieved_tflops_per_gpu"]) * 1e12 * gpus)
    return model, plan, published_s


def _simulate_megatron(row: dict[str, str]) -> tuple[str, float, float, dict]:
    model, plan, published = megatron_case(row)
    result = simulate_step(model, load_cluster("dgx-a100"), plan, check_memory=False,
                           fidelity="analytic")
    return row["model_size_label"], published, result.step_time_s, result.breakdown


@pytest.fixture(scope="module")
def megatron_results() -> dict[str, tuple[float, float, dict]]:
    """All rows, simulated on both cores, printed as a table."""
    rows = _megatron_rows()
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_simulate_megatron, rows))
    print("\nMegatron-LM 2021 on dgx-a100: published vs simulated step time")
    print(f"{'model':>6} {'published (s)':>14} {'simulated (s)':>14} {'error':>7}  breakdown (s)")
    for label, published, simulated, breakdown in results:
        parts = " ".join(f"{k}={v:.2f}" for k, v in breakdown.items() if v >= 0.01)
        print(f"{label:>6} {published:>14.2f} {simulated:>14.2f} "
              f"{(simulated - published) / published:>+7.1%}  {parts}")
    return {label: (published, simulated, breakdown)
            for label, published, simulated, breakdown in results}


@pytest.mark.parametrize("label", list(MEGATRON_HEADS))
def test_megatron_step_time_within_tolerance(megatron_results, label):
    published, simulated, _ = megatron_results[label]
    assert abs(simulated - published) / published <= TOLERANCE


# (model, hidden, heads, layers, GPUs, micro-batch, global batch, tokens/s/GPU published)
MOSAIC_H100 = [
    ("13b", 5120, 40, 40, 128, 16, 2048, 5080),
    ("30b", 7168, 56, 48, 128, 8, 1024, 2199),
    ("70b", 8192, 64, 80, 128, 8, 1024, 1058),
]


def test_mosaic_rows_are_the_published_ones():
    path = DATA / "published" / "orig_mosaicml_llmfoundry_mpt_throughput.csv"
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for name, _, _, _, gpus, micro, batch, tokens in MOSAIC_H100:
        assert any(r["model"] == name and r["gpu"] == "h100_80gb" and r["seq_len"] == "2048"
                   and int(r["num_gpus"]) == gpus and int(r["micro_batch_size"]) == micro
                   and int(r["global_batch_size_seqs"]) == batch
                   and int(r["throughput_tokens_per_s_per_gpu"]) == tokens
                   and r["sharding_strategy"] == "FULL_SHARD"
                   and r["activation_checkpointing"] == "True" for r in rows), name


@pytest.mark.parametrize("name,hidden,heads,layers,gpus,micro,batch,published", MOSAIC_H100)
def test_mosaic_h100_throughput_within_tolerance(name, hidden, heads, layers, gpus, micro,
                                                 batch, published):
    """MPT: MHA, GELU MLP of 4h, LayerNorm, tied embeddings, vocabulary 50,368."""
    model = ModelSpec(name=f"mpt-{name}", num_layers=layers, hidden_size=hidden,
                      num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
                      ffn_hidden_size=4 * hidden, vocab_size=50368, mlp="gelu",
                      norm="layernorm", tied_embeddings=True)
    plan = ParallelPlan(dp=gpus, micro_batch=micro, global_batch=batch, seq_len=2048,
                        recompute="full", zero=3)
    result = simulate_step(model, load_cluster("dgx-h100"), plan, check_memory=False)
    simulated = result.tokens_per_s / gpus
    error = (simulated - published) / published
    print(f"\nMPT-{name} on {gpus} H100: published {published} tokens/s/GPU, simulated "
          f"{simulated:.0f} ({error:+.1%}), MFU {result.mfu:.1%}")
    assert abs(error) <= TOLERANCE


# Megatron-LM 2022 (megatron_lm_mfu_hfu_2022.csv): model FLOPs utilization of GPT models
# on A100 80GB with sequence parallelism and selective recompute, data-parallel size 1.
# Configurations from Korthikanti et al. 2022 (arXiv 2205.05198), Table 3: heads, hidden,
# layers, tensor-, pipeline-parallel size, GPUs, global batch; micro-batch 1, sequence
# 2048, vocabulary 51,200, the software of 2022 (attention not fused: selective recompute
# re-runs its core). MFU counts 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) FLOPs per step over
# the A100's 312 TFLOP/s (Korthikanti et al. 2022, Section 6).
KORTHIKANTI_2022 = {"22B": (64, 6144, 48, 8, 1, 8, 4), "175B": (96, 12288, 96, 8, 8, 64, 64),
                    "530B": (128, 20480, 105, 8, 35, 280, 280),
                    "1T": (160, 25600, 128, 8, 64, 512, 512)}


def _megatron_2022_mfu() -> dict[str, float]:
    path = DATA / "published" / "orig_megatron_lm_mfu_hfu_2022.csv"
    with open(path, newline="") as handle:
        return {r["model_size"]: float(r["model_flops_utilization_pct"]) / 100
                for r in csv.DictReader(handle)}


@pytest.mark.parametrize("label", list(KORTHIKANTI_2022))
def test_megatron_2022_mfu_within_tolerance(label):
    """Step time implied by the published MFU vs the simulated one (closed-form step
    model: these are non-interleaved 1F1B pipelines, where it equals the replay)."""
    heads, hidden, layers, tp, pp, gpus, batch = KORTHIKANTI_2022[label]
    model = ModelSpec(name=f"megatron-2022-{label}", num_layers=layers, hidden_size=hidden,
                      num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
                      ffn_hidden_size=4 * hidden, vocab_size=VOCAB, mlp="gelu",
                      norm="layernorm", tied_embeddings=True, dropout=True)
    plan = ParallelPlan(dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=1, global_batch=batch,
                        seq_len=SEQ, recompute="selective", zero=0, flash_attention=False)
    flops = 72 * batch * SEQ * layers * hidden ** 2 * (
        1 + SEQ / (6 * hidden) + VOCAB / (12 * layers * hidden))
    published_s = flops / (_megatron_2022_mfu()[label] * 312e12 * gpus)
    result = simulate_step(model, load_cluster("dgx-a100"), plan, check_memory=False,
                           fidelity="analytic")
    error = result.step_time_s / published_s - 1
    print(f"\nMegatron 2022 {label} on {gpus} A100: published {published_s:.2f} s, "
          f"simulated {result.step_time_s:.2f} s ({error:+.1%})")
    assert abs(error) <= TOLERANCE
