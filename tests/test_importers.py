"""A job's Megatron-LM arguments -> model and plan (trainsim.importers): Megatron's own
defaults where a flag is absent, every known flag mapped, ignored or refused in one line,
and the small languages inside the arguments read without eval."""

from __future__ import annotations

import math

import pytest

from conftest import expect_one_line_error
from trainsim.importers import import_job
from trainsim.importers.setting_kinds import APPROXIMATED, IGNORED, REFUSED
from trainsim.importers.megatron_flags import FLAGS
from trainsim.importers.patterns import layer_pattern, moe_layout, pipeline_layout

#: The smallest complete Megatron-LM command line (Megatron requires these).
BASE = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
        "--seq-length", "2048", "--max-position-embeddings", "2048",
        "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16"]


def job(*extra: str, gpus: int | None = 16):
    return import_job(megatron_args=[*BASE, *extra], gpus=gpus)


# --------------------------------------------------------------------------- patterns


def test_layer_patterns_read_like_megatrons_eval_without_eval():
    assert layer_pattern("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert layer_pattern("([1]*3+[0]*1)*3") == ([1] * 3 + [0]) * 3
    assert layer_pattern("[1,0,1,0]") == [1, 0, 1, 0]
    expect_one_line_error(lambda: layer_pattern("__import__('os')"), "--moe-layer-freq")


def test_moe_layouts_a_model_can_express_and_one_it_cannot():
    assert moe_layout("([0]*3+[1]*58)", 61) == (3, 1)  # DeepSeek-V3
    assert moe_layout(2, 8) == (0, 2) and moe_layout("2", 8) == (0, 2)
    assert moe_layout("[1,0,1,0]", 4) == (0, 2)
    expect_one_line_error(lambda: moe_layout("([1]*3+[0]*1)*2", 8), "--moe-layer-freq",
                          "refused")
    expect_one_line_error(lambda: moe_layout("[1,1]", 8), "8 entries")


def test_pipeline_layout_counts_transformer_layers_per_stage():
    # DeepSeek-V3 on GB200: embedding + 1 layer, 30 stages of 2, the loss alone
    assert pipeline_layout("Et|(tt|)*30L") == (1,) + (2,) * 30 + (0,)
    assert pipeline_layout("E,t*3|t*4|t*4|t*3,L") == (3, 4, 4, 3)
    expect_one_line_error(lambda: pipeline_layout("Et|tm|L"), "multi-token")
    expect_one_line_error(lambda: pipeline_layout("t|Et|L"), "embedding")
    expect_one_line_error(lambda: pipeline_layout("Et|x|L"), "character")


# --------------------------------------------------------------------------- Megatron's defaults


def test_megatrons_own_defaults_where_flags_are_absent():
    j = job()
    m, p = j.model, j.plan
    # arguments.py: ffn 4h, kv_channels h/heads, LayerNorm, tied embeddings, dropout 0.1
    assert (m.ffn_hidden_size, m.head_dim, m.num_kv_heads) == (4096, 64, 16)
    assert (m.mlp, m.norm, m.tied_embeddings, m.dropout) == ("gelu", "layernorm", True, True)
    # GPT2BPETokenizer (pretrain_gpt.py's default): 50257 padded to 128 x TP
    assert m.vocab_size == 50304
    # no distributed optimizer, no overlap, no sequence parallelism; bf16 reduces in fp32
    assert (p["zero"], p["overlap_grad_reduce"], p["overlap_param_gather"]) == (0, False, False)
    assert (p["sequence_parallel"], p["grad_reduce_dtype"], p["tp_comm_overlap"]) == \
        (False, "fp32", "async")
    assert (p["flash_attention"], p["attention_impl"], p["cross_entropy"]) == \
        (True, "auto", "megatron")
    assert "grad_bucket_bytes" not in p  # no overlap: one bucket, not Megatron's 40M rule
    assert any("ZeRO 0" in note for note in j.assumed)


def test_swiglu_ffn_default_and_gqa():
    m = job("--swiglu", "--group-query-attention", "--num-query-groups", "4",
            "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
            "--hidden-dropout", "0", "--attention-dropout", "0").model
    assert m.ffn_hidden_size == int(4 * 1024 * 2 / 3 / 64) * 64 == 2688
    assert (m.mlp, m.norm, m.num_kv_heads, m.tied_embeddings, m.dropout) == \
        ("swiglu", "rmsnorm", 4, False, False)


@pytest.mark.parametrize("tp, padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_vocabulary_padded_to_a_multiple_of_128_times_tp(tp, padded):
    gpus = 8 * tp
    assert job("--tensor-model-parallel-size", str(tp), gpus=gpus).model.vocab_size == padded
    assert padded == math.ceil(50257 / (128 * tp)) * 128 * tp


def test_vocabulary_from_a_null_tokenizer_and_from_a_padded_size():
    assert job("--tokenizer-type", "NullTokenizer", "--vocab-size", "1000").model.vocab_size \
        == 1024  # 1000 + the end-of-document token, padded to 128
    assert job("--padded-vocab-size", "32000").model.vocab_size == 32000
    expect_one_line_error(lambda: job("--tokenizer-type", "SentencePieceTokenizer",
                                      "--tokenizer-model", "/data/tok.model"),
                          "--tokenizer-type", "--padded-vocab-size")


def test_global_batch_defaults_to_one_micro_batch_per_replica():
    args = [a for a in BASE if a not in ("--global-batch-size", "64")]
    assert import_job(megatron_args=[*args, "--tensor-model-parallel-size", "2"],
                      gpus=16).plan["global_batch"] == 8  # micro-batch 1 x dp 8
    expect_one_line_error(lambda: import_job(megatron_args=args), "--global-batch-size",
                          "--gpus")


def test_sequence_parallel_is_off_at_tp_1_as_megatron_forces_it():
    assert job("--sequence-parallel").plan["sequence_parallel"] is False
    assert job("--sequence-parallel", "--tensor-model-parallel-size", "2").plan[
        "sequence_parallel"] is True


def test_precision_and_gradient_reduction():
    assert job("--grad-reduce-in-bf16").plan["grad_reduce_dtype"] == "bf16"
    fp16 = import_job(megatron_args=[a for a in BASE if a != "--bf16"] + ["--fp16"], gpus=16)
    assert (fp16.plan["dtype"], fp16.plan["grad_reduce_dtype"]) == ("fp16", "bf16")
    fp32 = import_job(megatron_args=[a for a in BASE if a != "--bf16"], gpus=16)
    assert (fp32.plan["dtype"], fp32.plan["grad_reduce_dtype"]) == ("fp32", "fp32")
    for recipe, name in (("delayed", "te-delayed"), ("tensorwise", "te-current"),
                         ("mxfp8", "te-mxfp8"), ("blockwise", "te-blockwise")):
        p = job("--fp8-format", "hybrid", "--fp8-recipe", recipe).plan
        assert (p["dtype"], p["fp8_recipe"]) == ("fp8", name)
    assert job("--fp8-format", "e4m3").plan["fp8_recipe"] == "te-delayed"  # the default
    expect_one_line_error(lambda: job("--fp8-format", "e4m3", "--fp8-param-gather"),
                          "--fp8-param-gather", "refused")


# --------------------------------------------------------------------------- pipelines


def test_virtual_pipeline_from_layers_per_virtual_stage():
    p = job("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
            "2").plan
    assert (p["vpp"], p["schedule"], p.get("layers_per_stage")) == (2, "interleaved", None)
    assert job("--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
               "4").plan["vpp"] == 4
    expect_one_line_error(lambda: job("--pipeline-model-parallel-size", "2",
                                      "--num-layers-per-virtual-pipeline-stage", "3"),
                          "--num-layers-per-virtual-pipeline-stage")


def test_embedding_and_loss_counted_as_layers_in_the_split():
    # 8 layers + embedding + loss = 10 over 2 ranks x 1: the ends lose one layer each
    p = job("--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split").plan
    assert p["layers_per_stage"] == (4, 4)
    p = job("--pipeline-model-parallel-size", "3", "--num-virtual-stages-per-pipeline-rank",
            "2", "--num-layers", "10", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split", gpus=24).plan
    assert p["layers_per_stage"] == (1, 2, 2, 2, 2, 1)
    # 8 layers + the embedding = 9 do not split over 4 ranks
    expect_one_line_error(lambda: job("--pipeline-model-parallel-size", "4",
                                      "--account-for-embedding-in-pipeline-split"),
                          "--num-layers", "divisible")


def test_uneven_first_and_last_stages_with_virtual_stages():
    # 8 layers: 1 on the first rank, 1 on the last, 3 on each of the 2 middle ranks; 1 chunk
    p = job("--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "2",
            "--decoder-last-pipeline-num-layers", "2", "--num-virtual-stages-per-pipeline-rank",
            "2", "--num-layers", "12", gpus=16).plan
    # ranks hold (2, 4, 4, 2); virtual stage v of rank r is chunk v * pp + r
    assert p["layers_per_stage"] == (1, 2, 2, 1, 1, 2, 2, 1)
    p = job("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
            "Ettt|tt|tt|tL").plan
    assert (p["vpp"], p["layers_per_stage"]) == (2, (3, 2, 2, 1))


# --------------------------------------------------------------------------- recompute, stack


def test_recompute_granularity_method_layers_and_modules():
    p = job("--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1").plan
    assert (p["recompute"], p.get("recompute_layers", 0)) == ("full", 0)
    p = job("--recompute-granularity", "full", "--recompute-method", "block",
            "--recompute-num-layers", "3").plan
    assert (p["recompute"], p["recompute_layers"]) == ("full", 3)
    p = job("--recompute-granularity", "selective", "--recompute-modules", "layernorm",
            "moe_act").plan
    assert (p["recompute"], p["recompute_modules"]) == ("selective", ("layernorm", "moe_act"))
    assert job("--recompute-activations").plan["recompute"] == "selective"
    expect_one_line_error(lambda: job("--recompute-granularity", "full"),
                          "--recompute-granularity", "--recompute-method")
    expect_one_line_error(lambda: job("--recompute-granularity", "selective",
                                      "--recompute-modules", "mla_up_proj"),
                          "--recompute-modules", "mla_up_proj")


def test_overlap_distributed_optimizer_and_fsdp():
    p = job("--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather").plan
    assert (p["zero"], p["overlap_grad_reduce"], p["overlap_param_gather"]) == (1, True, True)
    # Megatron-Core's bucket: max(40M, 1M x dp x cp) parameters, fp32 gradients
    assert p["grad_bucket_bytes"] == 40_000_000 * 4
    assert job("--use-distributed-optimizer", "--overlap-grad-reduce", gpus=64).plan[
        "grad_bucket_bytes"] == 64_000_000 * 4
    assert job("--overlap-grad-reduce", "--ddp-bucket-size", "1000").plan[
        "grad_bucket_bytes"] == 4000
    assert job("--use-torch-fsdp2").plan["zero"] == 3
    assert job("--use-torch-fsdp2", "--torch-fsdp2-no-reshard-after-forward").plan["zero"] == 2
    for strategy, zero in (("optim", 1), ("optim_grads", 2), ("optim_grads_params", 3)):
        assert job("--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                   strategy).plan["zero"] == zero
    expect_one_line_error(lambda: job("--overlap-param-gather"), "--overlap-param-gather")


def test_tp_overlap_attention_loss_and_offload():
    tp2 = ("--tensor-model-parallel-size", "2", "--sequence-parallel")
    assert job(*tp2, "--tp-comm-overlap").plan["tp_comm_overlap"] == "userbuffers"
    expect_one_line_error(lambda: job("--tensor-model-parallel-size", "2", "--tp-comm-overlap"),
                          "--tp-comm-overlap", "sequence parallelism")
    assert job("--attention-backend", "fused").plan["attention_impl"] == "cudnn"
    assert job("--attention-backend", "flash").plan["attention_impl"] == "fa2"
    assert job("--attention-backend", "unfused").plan["flash_attention"] is False
    assert job("--transformer-impl", "local").plan["flash_attention"] is False
    p = job("--use-legacy-models", "--use-flash-attn").plan
    assert (p["flash_attention"], p["attention_impl"]) == (True, "fa2")
    assert job("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te").plan[
        "cross_entropy"] == "fused"
    assert job("--cpu-offloading-num-layers", "2").plan["activation_offload_layers"] == 2
    assert job("--use-tp-pp-dp-mapping").plan["order"] == ("tp", "cp", "pp", "dp")


def test_mixture_of_experts_settings():
    j = job("--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "512",
            "--moe-shared-expert-intermediate-size", "1024", "--moe-layer-freq",
            "([0]*2+[1]*6)", "--expert-model-parallel-size", "4",
            "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm")
    moe = j.model.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.shared_experts) == \
        (8, 2, 512, 2)
    assert (moe.first_dense_layers, moe.layer_frequency, moe.capacity_factor) == (2, 1, 0.0)
    assert j.plan["ep"] == 4
    assert j.plan["moe_dispatcher"] == "alltoall" and "expert_tp" not in j.plan
    # the capacity is the plan's: tokens over it dropped, padded up to it on request
    p = job("--num-experts", "8", "--moe-expert-capacity-factor", "1.25",
            "--moe-pad-expert-input-to-capacity").plan
    assert (p["moe_capacity_factor"], p["moe_pad_to_capacity"]) == ("1.25", True)
    assert job("--num-experts", "8", "--moe-expert-capacity-factor", "1.0").plan[
        "moe_pad_to_capacity"] is False
    expect_one_line_error(lambda: job("--num-experts", "8",
                                      "--moe-pad-expert-input-to-capacity"),
                          "--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor")
    expect_one_line_error(lambda: job("--num-experts", "8", "--moe-ffn-hidden-size", "512",
                                      "--moe-shared-expert-intermediate-size", "700"),
                          "--moe-shared-expert-intermediate-size")


def test_cuda_graphs_decide_how_the_host_issues_kernels():
    """Megatron-LM is eager unless CUDA graphs are on; whole-layer graphs are graphed except
    for a dropless MoE layer's routed experts; attention-and-router scopes are partial."""
    assert job().plan["host_issue"] == "eager"
    for graphs in (["--cuda-graph-impl", "transformer_engine"], ["--enable-cuda-graph"],
                   ["--external-cuda-graph"], ["--cuda-graph-impl", "local",
                                               "--cuda-graph-scope", "full_iteration"]):
        assert job(*graphs).plan["host_issue"] == "graphed", graphs
    moe = ("--num-experts", "8", "--moe-router-topk", "2")
    dropless = job(*moe, "--cuda-graph-impl", "transformer_engine")
    assert dropless.plan["host_issue"] == "partial"
    assert any("routed experts cannot be captured" in n for n in dropless.assumed)
    padded = job(*moe, "--moe-expert-capacity-factor", "1.0",
                 "--moe-pad-expert-input-to-capacity", "--cuda-graph-impl", "local")
    assert padded.plan["host_issue"] == "graphed"
    partial = job(*moe, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
                  "attn moe_router moe_preprocess")
    assert partial.plan["host_issue"] == "partial" and not any(
        "cuda-graph-scope" in n for n in partial.assumed)
    mlp_only = job("--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "mlp")
    assert mlp_only.plan["host_issue"] == "eager"
    assert any("without attention" in n for n in mlp_only.assumed)
    expect_one_line_error(lambda: job("--cuda-graph-impl", "local", "--cuda-graph-scope",
                                      "everything"), "--cuda-graph-scope", "everything")
    expect_one_line_error(lambda: job("--cuda-graph-impl", "cupti"), "--cuda-graph-impl")


def test_expert_layouts_and_dispatchers_map_to_the_plan():
    # expert-TP independent of TP (the ModelZoo's Qwen3 runs: expert-TP 1 with TP 4)
    p = job("--num-experts", "8", "--tensor-model-parallel-size", "2",
            "--expert-tensor-parallel-size", "1", "--moe-token-dispatcher-type",
            "alltoall").plan
    assert (p["tp"], p["expert_tp"]) == (2, 1)
    assert "expert_tp" not in job("--num-experts", "8", "--tensor-model-parallel-size", "2",
                                  "--expert-tensor-parallel-size", "2").plan
    # Megatron-Core's default dispatcher is allgather, with or without EP
    assert job("--num-experts", "8", "--expert-model-parallel-size", "4").plan[
        "moe_dispatcher"] == "allgather"
    # flex on DeepEP or HybridEP, and the flag before --moe-flex-dispatcher-backend
    for extra in (("--moe-token-dispatcher-type", "flex"),
                  ("--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                   "hybridep"),
                  ("--moe-token-dispatcher-type", "flex", "--moe-enable-deepep")):
        assert job("--num-experts", "8", *extra).plan["moe_dispatcher"] == "deepep", extra
    expect_one_line_error(lambda: job("--num-experts", "8", "--moe-token-dispatcher-type",
                                      "flex", "--moe-flex-dispatcher-backend", "nccl"),
                          "--moe-flex-dispatcher-backend")
    # the all-to-all overlapped with the other micro-batch (combined 1F1B), forced balance
    p = job("--num-experts", "8", "--overlap-moe-expert-parallel-comm",
            "--moe-router-force-load-balancing").plan
    assert (p["moe_a2a_overlap"], p["moe_expert_load"]) == (True, "uniform")
    # group-limited routing: both settings or neither
    moe = job("--num-experts", "256", "--moe-router-topk", "8", "--moe-router-num-groups", "8",
              "--moe-router-group-topk", "4").model.moe
    assert (moe.router_groups, moe.router_group_topk) == (8, 4)
    expect_one_line_error(lambda: job("--num-experts", "8", "--moe-router-num-groups", "4"),
                          "--moe-router-num-groups", "--moe-router-group-topk")


def test_multi_latent_attention_and_mtp_map_to_the_model():
    """DeepSeek-V3's attention from its Megatron arguments: the deepseek-v3 preset's MLA."""
    from strategies.models import load_model
    m = job("--num-layers", "4", "--hidden-size", "7168", "--num-attention-heads", "128",
            "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
            "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
            "--mtp-num-layers", "1").model
    preset = load_model("deepseek-v3")
    assert m.mla == preset.mla and (m.head_dim, m.num_kv_heads) == (192, 128)
    assert m.mtp_layers == 1
    # no query latent: queries projected from the hidden state (DeepSeek-V2-Lite)
    assert job("--multi-latent-attention", "--kv-lora-rank", "512", "--qk-head-dim", "128",
               "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128").model.mla.q_lora_rank == 0
    expect_one_line_error(lambda: job("--multi-latent-attention", "--qk-head-dim", "128"),
                          "--kv-lora-rank", "--multi-latent-attention")


# --------------------------------------------------------------------------- parsing


def test_launch_line_equals_values_and_the_last_occurrence_wins():
    j = import_job(megatron_args="CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node=8 "
                                 "--nnodes 4 pretrain_gpt.py " + " ".join(BASE)
                                 + " --tensor-model-parallel-size=2"
                                 " --tensor-model-parallel-size 4")
    assert (j.gpus, j.plan["tp"]) == (32, 4)
    assert j.plan["global_batch"] == 64


def test_comments_continuations_and_quotes_as_a_shell_reads_them(tmp_path):
    path = tmp_path / "job.args"
    path.write_text("# a job\n" + " \\\n".join(BASE) + " \\\n  --wandb-exp-name 'a b'  # run\n")
    j = import_job(megatron_args=f"@{path} --tensor-model-parallel-size 2", gpus=16)
    assert j.plan["tp"] == 2 and "--wandb-exp-name" in j.ignored


def test_modelzoo_yaml_of_flags(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {k}: {v}\n" for k, v in zip(BASE[::2],
                                                                             BASE[1::2]))
                    + "  --bf16: true\n  --sequence-parallel: false\n")
    j = import_job(megatron_args=f"@{path}", gpus=16)
    assert j.plan["dtype"] == "bf16" and j.plan["sequence_parallel"] is False


@pytest.mark.parametrize("extra, words", [
    (["--no-such-flag"], ["--no-such-flag", "not a Megatron-LM argument"]),
    (["--tensor-model-parallel-size", "${TP}"], ["--tensor-model-parallel-size", "shell"]),
    (["--bf16", "true"], ["--bf16", "no value"]),
    (["--num-layers", "many"], ["--num-layers", "whole number"]),
    (["--num-layers"], ["--num-layers", "one value"]),
])
def test_malformed_arguments_are_one_line_naming_the_flag(extra, words):
    expect_one_line_error(lambda: job(*extra), *words)
    expect_one_line_error(lambda: import_job(megatron_args=["tp=8", *BASE]), "'tp=8'",
                          "not a flag")


def test_flags_without_effect_are_listed_as_ignored():
    j = job("--lr", "3e-4", "--save", "/ckpt", "--seed", "7", "--log-interval", "1",
            "--data-path", "0.5", "/a", "0.5", "/b", "--lr-decay-style", "cosine",
            "--wandb-project", "p", "--decoupled-lr", "1e-4", "--moe-router-topk", "4")
    for flag in ("--lr", "--save", "--seed", "--log-interval", "--data-path",
                 "--lr-decay-style", "--wandb-project", "--decoupled-lr"):
        assert flag in j.ignored
    assert "--moe-router-topk" in j.ignored  # no effect without experts, as in Megatron


def _sample(flag: str, kind: str, type_) -> list[str]:
    """A plausible value for a flag, for the sweep below."""
    samples = {"--normalization": "RMSNorm", "--position-embedding-type": "rope",
               "--attention-backend": "flash", "--transformer-impl": "local",
               "--recompute-granularity": "selective", "--recompute-method": "block",
               "--optimizer": "sgd", "--fp8-format": "hybrid", "--fp8-recipe": "mxfp8",
               "--moe-token-dispatcher-type": "alltoall", "--cross-entropy-fusion-impl": "te",
               "--data-parallel-sharding-strategy": "optim_grads",
               "--tokenizer-type": "GPT2BPETokenizer", "--cuda-graph-impl": "local",
               "--DDP-impl": "torch", "--moe-layer-freq": "2", "--softmax-type": "learnable",
               "--pipeline-model-parallel-layout": "Ettt|tttttL",
               "--recompute-modules": "mlp", "--cp-comm-type": "a2a"}
    if kind in ("on", "off"):
        return []
    if flag in samples:
        return [samples[flag]]
    return ["2"] if type_ in (int, float) else ["x"]


#: Flags that take effect only with another one (absent from BASE), as in Megatron-LM,
#: so alone they land among the ignored settings; every other known flag must be read.
NEEDS_ANOTHER = {
    # MoE settings without --num-experts
    "--moe-expert-capacity-factor", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
    "--moe-layer-freq", "--moe-pad-expert-input-to-capacity", "--moe-router-topk",
    "--moe-shared-expert-intermediate-size", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--moe-enable-deepep", "--moe-router-num-groups",
    "--moe-router-group-topk", "--moe-router-force-load-balancing",
    "--overlap-moe-expert-parallel-comm",
    # MLA sizes without --multi-latent-attention
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    # interleaved-schedule settings without virtual stages; CP settings at CP 1
    "--no-align-param-gather", "--no-overlap-p2p-communication",
    "--overlap-p2p-communication-warmup-flush", "--cp-comm-type",
    # variants of a feature that is off: FP8 recipe, loss fusion, precision-aware optimizer,
    # FSDP sharding, GQA groups, unfused-attention softmax, CUDA-graph scope
    "--fp8-recipe", "--cross-entropy-fusion-impl", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--main-params-dtype", "--store-param-remainders", "--no-store-param-remainders",
    "--data-parallel-sharding-strategy", "--torch-fsdp2-no-reshard-after-forward",
    "--num-query-groups", "--no-masked-softmax-fusion", "--cuda-graph-scope",
    "--tokenizer-model", "--encoder-seq-length",
    # the 2021 recompute spellings without --checkpoint-activations; its markers
    "--activations-checkpoint-method", "--activations-checkpoint-num-layers",
    "--checkpoint-num-layers", "--data-impl",
    # no effect on trainsim's costs (RoPE is not priced; deprecated and ignored by Megatron)
    "--no-rope-fusion", "--no-position-embedding", "--no-async-tensor-model-parallel-allreduce",
    "--tp-comm-overlap-rs-dgrad", "--use-fused-weighted-squared-relu",
}


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_every_known_flag_is_mapped_ignored_or_refused_in_one_line(flag):
    """No known flag is silently dropped or ends in a traceback: each either imports or
    raises one line that names it (or the flag it depends on)."""
    spec = FLAGS[flag]
    try:
        imported = job(flag, *_sample(flag, spec.kind, spec.type))
    except ValueError as problem:
        message = str(problem)
        assert "\n" not in message and message.startswith("--"), message
        assert "not a setting trainsim knows" not in message
        return
    if flag in imported.ignored:
        assert flag in NEEDS_ANOTHER or spec.dest in IGNORED, flag


def test_refused_settings_name_the_flag_and_why():
    for flag, spec in sorted(FLAGS.items()):
        if spec.dest not in REFUSED or spec.kind not in ("on", "off"):
            continue
        message = expect_one_line_error(lambda: job(flag), flag)
        assert "refused" in message


def test_approximations_are_stated():
    j = job("--qk-layernorm", "--manual-gc")
    assert any(note.startswith("--qk-layernorm:") for note in j.assumed)
    assert any(note.startswith("--manual-gc:") for note in j.assumed)
    assert {"qk_layernorm", "manual_gc"} <= set(APPROXIMATED)


def test_a_model_given_apart_replaces_the_jobs_shape():
    from strategies.models import load_model

    spec = load_model("llama3-8b")
    j = import_job(megatron_args=[*BASE, "--pipeline-model-parallel-size", "2",
                                  "--num-layers-per-virtual-pipeline-stage", "4"],
                   gpus=16, model=spec)
    assert j.model is spec and j.plan["vpp"] == 4  # 32 layers / 2 ranks / 4 per stage


# --------------------------------------------------------------------------- malformed YAML


@pytest.mark.parametrize("text, words", [
    ("- a list\n", ["nemo-config", "'model'"]),
    ("model: [1]\n", ["nemo-config", "'model'"]),
    ("model: {num_layers: 2}\ntrainer: [1]\n", ["trainer"]),
    ("model: {ffn_hidden_size: '${.nope}'}\n", ["model.ffn_hidden_size", "nope"]),
    ("model: {ffn_hidden_size: '${multiply:4, ${.x}}', x: abc}\n",
     ["model.ffn_hidden_size", "not a number"]),
    ("model: {ffn_hidden_size: '${.a}', a: '${.b}', b: '${.a}'}\n",
     ["model.ffn_hidden_size", "itself"]),
    ("trainer: {precision: 8}\nmodel: {num_layers: 2}\n", ["trainer.precision"]),
    ("model: {optim: {name: sgd}}\n", ["model.optim.name", "refused"]),
    ("model: {optim: {name: distributed_fused_adam, bucket_cap_mb: lots}}\n",
     ["model.optim.bucket_cap_mb"]),
    ("model: {activation: relu6}\n", ["model.activation", "refused"]),
    ("model: {not_a_key: 7}\n", ["model.not_a_key", "not a setting"]),
    ("model: {megatron_amp_O2: false}\n", ["model.megatron_amp_O2", "refused"]),
    ("model: {num_layers: 2}\ntrain: {}\nbogus: {x: 1}\n", ["bogus", "section"]),
    ("model: {num_layers: 2}\ntrain: {}\npeft: {dim: 8}\n", ["peft", "refused"]),
    ("{unclosed: [\n", ["nemo-config", "YAML"]),
])
def test_malformed_nemo_yaml_is_one_line_naming_the_key(tmp_path, text, words):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    expect_one_line_error(lambda: import_job(nemo_config=path, gpus=8), *words)


def test_nemo_interpolations_resolve_relative_and_absolute(tmp_path):
    text = ("trainer: {num_nodes: 2, devices: 8, precision: bf16-mixed}\n"
            "model:\n  hidden_size: 1024\n  ffn_hidden_size: ${multiply:4, ${.hidden_size}}\n"
            "  num_layers: ${training.model.num_attention_heads}\n"
            "  num_attention_heads: 16\n  encoder_seq_length: 2048\n"
            "  micro_batch_size: 1\n  global_batch_size: 16\n"
            "  tokenizer: {library: megatron, type: GPT2BPETokenizer}\n"
            "  optim: {name: fused_adam}\n")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    j = import_job(nemo_config=path)
    assert (j.model.ffn_hidden_size, j.model.num_layers, j.gpus) == (4096, 16, 16)
    assert j.plan["zero"] == 0 and j.plan["dtype"] == "bf16"


def test_cp_comm_type_p2p_or_allgather_for_every_layer():
    """--cp-comm-type: TE's p2p ring (default) or its all-gather variant; a2a refused."""
    cp = ["--context-parallel-size", "2"]
    assert job(*cp).plan["cp_comm_type"] == "p2p"
    assert job(*cp, "--cp-comm-type", "allgather").plan["cp_comm_type"] == "all_gather"
    expect_one_line_error(lambda: job(*cp, "--cp-comm-type", "a2a"), "--cp-comm-type",
                          "refused")
    expect_one_line_error(lambda: job(*cp, "--cp-comm-type", "p2p", "allgather"),
                          "--cp-comm-type", "refused")
