"""Framework settings a published row runs with but does not print
(validate/published_stacks.py): the Megatron-Bridge MoE performance configs and NeMo
AutoModel's benchmark YAMLs, and what they do to the memory model. Fast (no simulation)."""

from __future__ import annotations

import dataclasses

import pytest

from strategies import model_costs
from validate import published
from validate.published_memory import rank_peaks
from validate.published_stacks import (AUTOMODEL_ACTIVATION_CHECKPOINTING,
                                       AUTOMODEL_EXPERT_PARALLEL, dgxc_recipe_of,
                                       framework_defaults,
                                       MEGATRON_BRIDGE_BF16_GRAD_REDUCE, nemo1_distributed_adam,
                                       stack_settings)

BRIDGE = {"framework": "Megatron-Bridge/Megatron-Core", "framework_version": "NeMo 25.11 container"}
AUTOMODEL = {"framework": "NeMo AutoModel (PyTorch backend: FSDP2 + PP; TE + DeepEP)",
             "framework_version": "Automodel main branch, 2025-10-02"}


def _settings(row, **plan_fields):
    return stack_settings(row, {"zero": 1, "recompute": "none", "grad_reduce_dtype": "fp32",
                                **plan_fields}, None)


def test_bridge_gpt_oss_preset_recomputes_layernorm_and_moe_act_with_bf16_gradients():
    out = _settings({**BRIDGE, "model": "gpt-oss-120b", "gpu": "B200", "dtype": "bf16"})
    assert out.fields["grad_reduce_dtype"] == "bf16"
    assert out.fields["recompute"] == "selective"
    assert out.fields["recompute_modules"] == ("layernorm", "moe_act")
    assert any("grad_reduce_in_fp32 False" in u for u in out.unprinted)
    assert any("layernorm moe_act" in u for u in out.unprinted)


def test_bridge_preset_recompute_yields_to_a_printed_recompute():
    out = _settings({**BRIDGE, "model": "gpt-oss-120b", "gpu": "H100-SXM", "dtype": "bf16",
                     "recompute": "full"}, recompute="full")
    assert "recompute_modules" not in out.fields


def test_bridge_qwen3_reduces_in_bf16_but_other_families_keep_fp32():
    assert {"qwen3-30b-a3b", "qwen3-235b-a22b"} <= set(MEGATRON_BRIDGE_BF16_GRAD_REDUCE)
    qwen = _settings({**BRIDGE, "model": "qwen3-30b-a3b", "gpu": "H100-SXM", "dtype": "fp8"})
    assert qwen.fields["grad_reduce_dtype"] == "bf16"
    assert "recompute" not in qwen.fields  # set_qwen3_common_configs: recompute off
    llama = _settings({**BRIDGE, "model": "llama3-70b", "gpu": "H100-SXM", "dtype": "bf16"})
    assert "grad_reduce_dtype" not in llama.fields
    # NeMo AutoModel is no Megatron-Bridge stack: its gradient dtype is FSDP2's
    auto = _settings({**AUTOMODEL, "model": "qwen3-30b-a3b", "gpu": "H100-SXM", "dtype": "bf16"})
    assert "grad_reduce_dtype" not in auto.fields


@pytest.mark.parametrize("model", sorted(AUTOMODEL_ACTIVATION_CHECKPOINTING))
def test_automodel_checkpoints_every_block_where_its_yaml_says_so(model):
    out = _settings({**AUTOMODEL, "model": model, "gpu": "H100-SXM", "dtype": "bf16"},
                    zero=3)
    if AUTOMODEL_ACTIVATION_CHECKPOINTING[model]:
        assert (out.fields["recompute"], out.fields["recompute_layers"]) == ("full", 0)
    else:
        assert "recompute" not in out.fields


def test_bf16_gradient_buffer_is_half_the_fp32_one_exactly():
    """ZeRO-1 keeps the whole gradient buffer: g * (P_d + P_e) bytes with g = 2 (bf16,
    the gpt-oss preset) instead of 4; nothing else moves."""
    run = next(r for r in published.load_runs() if r.row_id == "mb2511_15")
    scenario = published.scenario_for(run, published.load_models(), published.load_nemo_recipes())
    plan = scenario.plan
    assert plan.grad_reduce_dtype == "bf16" and plan.zero == 1
    bf16 = rank_peaks(scenario.model, plan, 0.0)[0]
    fp32 = rank_peaks(scenario.model, dataclasses.replace(plan, grad_reduce_dtype="fp32"), 0.0)[0]
    params = model_costs.rank_params(scenario.model, layers=list(range(scenario.model.num_layers)),
                                     tp=plan.tp, ep=plan.ep, etp=plan.expert_tp or plan.tp,
                                     has_embedding=True, has_head=True)
    assert bf16.gradients_bytes == 2 * (params.dense_params + params.expert_params)
    assert fp32.gradients_bytes == 2 * bf16.gradients_bytes
    assert fp32.optimizer_bytes == bf16.optimizer_bytes
    assert fp32.weights_bytes == bf16.weights_bytes


def test_automodel_runs_fsdp2_fp32_params_and_the_bf16_logit_loss_without_nemo_recipes():
    """AutoModel is PyTorch FSDP2, not a NeMo Megatron recipe: fp32 sharded parameters as
    the optimizer's masters, MaskedCrossEntropy on bf16 logits, no TE fused loss or
    userbuffers TP overlap (which the NeMo recipe of qwen3-30b-a3b on H100 would set)."""
    defaults = framework_defaults(AUTOMODEL["framework"], AUTOMODEL["framework_version"])
    assert (defaults["zero"], defaults["fsdp_fp32_params"], defaults["cross_entropy"]) == \
        (3, True, "eager_bf16")
    runs = {r.row_id: r for r in published.load_runs(sources=["nvidia_nemo_automodel"])}
    models, recipes = published.load_models(), published.load_nemo_recipes()
    plan = published.scenario_for(runs["automodel_4"], models, recipes).plan
    assert (plan.cross_entropy, plan.tp_comm_overlap, plan.fsdp_fp32_params) == \
        ("eager_bf16", "dtensor", True)


@pytest.mark.parametrize("row, model, ep", [("automodel_5", "gpt-oss-20b", 8),
                                            ("automodel_6", "gpt-oss-120b", 64)])
def test_automodel_gpt_oss_rows_run_the_yaml_expert_parallelism(row, model, ep):
    """The table prints EP '-'; the benchmark YAMLs it names set ep_size 8 / 64."""
    assert AUTOMODEL_EXPERT_PARALLEL[model] == ep
    runs = {r.row_id: r for r in published.load_runs(sources=["nvidia_nemo_automodel"])}
    scenario = published.scenario_for(runs[row], published.load_models(),
                                      published.load_nemo_recipes())
    assert scenario.plan.ep == ep
    assert any("ep_size" in s for s in scenario.settings)


FOUNDRY = {"framework": "Composer / llm-foundry (PyTorch FSDP)", "framework_version": ""}


def test_llm_foundry_reduce_dtype_follows_the_composer_version_of_its_section():
    """Composer's get_mixed_precision: PURE reduces in bf16 in every version; DEFAULT of
    Composer 0.13.2-0.16 leaves reduce_dtype None with param_dtype bf16, so PyTorch FSDP
    reduces in bf16 too; only the large-scale H100 section (after composer PR #2628's
    reduce_dtype float32) reduces in fp32. Every row reduce-scatters per micro-batch."""
    pure = _settings({**FOUNDRY, "model": "mpt-7b", "gpu": "A100-40GB", "dtype": "bf16",
                      "notes": "GA 1, precision 'bf16', mp_mode PURE, sharding_strategy "
                               "FULL_SHARD"}, zero=3)
    assert pure.fields["grad_reduce_dtype"] == "bf16"
    assert any("PURE" in n for n in pure.notes)
    default = _settings({**FOUNDRY, "model": "mpt-7b", "gpu": "H100-SXM", "dtype": "bf16",
                         "notes": "GA 1, precision 'amp_bf16', mp_mode DEFAULT. Section "
                                  "title: H100 80GB BF16."}, zero=3)
    assert default.fields["grad_reduce_dtype"] == "bf16"
    large = _settings({**FOUNDRY, "model": "mpt-7b", "gpu": "H100-SXM", "dtype": "bf16",
                       "notes": "GA 1, precision 'amp_bf16', mp_mode DEFAULT. Section title: "
                                "H100 80GB BF16 (Large Scale, >= 128 GPUs)."}, zero=3)
    assert "grad_reduce_dtype" not in large.fields
    assert framework_defaults(FOUNDRY["framework"])["grad_reduce_dtype"] == "fp32"
    for out in (pure, default, large):
        assert out.fields["grad_reduce_every_microbatch"] is True


def test_llm_foundry_runs_composer_decoupled_adamw_tensor_by_tensor():
    """The MPT yamls' decoupled_adamw is Composer's per-tensor loop of unfused kernels:
    80 bytes per parameter (plus the fp32 gradient read and bf16 copy), not 28."""
    assert framework_defaults(FOUNDRY["framework"])["optimizer_impl"] == "for-loop"
    params = 1_000_000
    adam = {k.name: k for k in model_costs.optimizer_kernels(
        params, implementation="for-loop", grad_bytes=4.0, tensors=10)}["optimizer.adam"]
    assert adam.fwd_bytes == (80.0 - 4.0 + 4.0 + 2.0) * params
    assert adam.launches == (8 * 10, 0)
    fused = {k.name: k for k in model_costs.optimizer_kernels(
        params, implementation="fused", grad_bytes=4.0)}["optimizer.adam"]
    assert fused.fwd_bytes == 30.0 * params


def test_published_llm_foundry_rows_carry_the_composer_settings():
    """Every MosaicML row runs the for-loop Adam and reduce-scatters every micro-batch;
    exactly its large-scale DEFAULT rows reduce in fp32."""
    runs = published.load_runs(sources=["mosaicml_llmfoundry"])
    models = published.load_models()
    pure = 0
    for run in runs:
        plan = published.scenario_for(run, models).plan
        assert plan.optimizer_impl == "for-loop", run.row_id
        assert plan.grad_reduce_every_microbatch, run.row_id
        fp32 = "mp_mode DEFAULT" in run.get("notes") and "Large Scale" in run.get("notes")
        pure += "mp_mode PURE" in run.get("notes")
        assert plan.grad_reduce_dtype == ("fp32" if fp32 else "bf16"), run.row_id
    assert pure > 0


@pytest.mark.parametrize("framework, model, policy", [
    ("MaxText (JAX)", "llama2-70b", "jax_save_qkv"),      # dgxc maxtext/configure.sh
    ("Paxml (JAX)", "gpt3-175b", "jax_save_qkv_out"),     # dgxc paxml_mod_configs.py
    ("MaxText (JAX)", "llama3-8b", "jax_full"),           # MaxText's default remat_policy
])
def test_jax_rows_rematerialise_with_their_recipes_policy(framework, model, policy):
    settings = stack_settings({"framework": framework, "model": model, "dtype": "bf16"},
                              {"zero": 3, "recompute": "none"}, None)
    assert settings.fields["recompute"] == "selective"
    assert settings.fields["recompute_modules"] == (policy,)
    assert any(policy in u for u in settings.unprinted)
    printed = stack_settings({"framework": framework, "model": model, "recompute": "full"},
                             {"zero": 3, "recompute": "full"}, None)
    assert "recompute_modules" not in printed.fields


def test_dgxc_grok1_rows_run_the_recipes_padded_capacity_userbuffers_and_flash_attention():
    """Every dgxc Grok-1 row (the NeMo 1 launcher recipe grok1/configure.sh @143b90dd with
    grok1_314b.yaml) runs capacity factor 1.0 padded, the alltoall dispatcher, TE
    userbuffers TP overlap and FlashAttention 2 (NVTE_FUSED_ATTN=0); other dgxc rows keep
    their defaults."""
    models, recipes = published.load_models(), published.load_nemo_recipes()
    runs = published.load_runs(sources=["nvidia_dgxc_benchmarking"])
    grok = [r for r in runs if r.row_id.startswith("dgxc_grok")]
    assert len(grok) == 18
    for run in grok:
        plan = published.scenario_for(run, models, recipes).plan
        assert (plan.moe_capacity_factor, plan.moe_pad_to_capacity, plan.moe_dispatcher,
                plan.tp_comm_overlap, plan.attention_impl) == (
                    "1.0", True, "alltoall", "userbuffers", "fa2"), run.row_id
    other = next(r for r in runs if r.get("model") == "llama3.1-70b")
    plan = published.scenario_for(other, models, recipes).plan
    assert (plan.attention_impl, plan.moe_pad_to_capacity) == ("auto", False)
    # the recipe applies to the NeMo 1 launcher only (the 2025 NeMo 25.09 Grok recipe differs)
    row = {"framework": "NeMo (scripts/performance)", "framework_version": "NeMo 25.09",
           "citation": "GitHub NVIDIA/dgxc-benchmarking grok1/README.md@1f6d9f40",
           "model": "grok1-314b", "gpu": "H100-SXM", "dtype": "bf16"}
    assert "attention_impl" not in _settings(row).fields


@pytest.mark.parametrize("optim_dtype, fp8_params, master, remainders", [
    ("bf16", False, "none", False), ("bf16", True, "bf16", False),
    ("fp32", False, "fp32", True), ("fp32", True, "fp32", False)])
def test_nemo1_distributed_adam_stores_params_as_megatron_base_model_decides(
        optim_dtype, fp8_params, master, remainders):
    """NeMo 1 setup_optimization: FP8 params -> a copy in the state dtype; state dtype equal
    to the bf16 model's -> no copy; fp32 state over bf16 -> remainders."""
    fields = nemo1_distributed_adam(optim_dtype, fp8_params)
    assert fields["optimizer_moments_dtype"] == optim_dtype
    assert fields["master_weights_dtype"] == master
    assert fields.get("store_param_remainders", False) == remainders
    with pytest.raises(ValueError, match="optim_dtype"):
        nemo1_distributed_adam("fp16", False)


def test_dgxc_nemotron_rows_run_the_recipes_bf16_distributed_adam():
    """dgxc-benchmarking's Nemotron-4 340B recipe: bf16 optimizer state, FP8 parameters in
    the FP8 runs, selective recompute, FlashAttention 2, userbuffers."""
    runs = {r.row_id: r for r in published.load_runs(sources=["nvidia_dgxc_benchmarking"])}
    models, recipes = published.load_models(), published.load_nemo_recipes()
    bf16 = published.scenario_for(runs["dgxc_n340_01"], models, recipes).plan
    fp8 = published.scenario_for(runs["dgxc_n340_06"], models, recipes).plan
    assert (bf16.optimizer_moments_dtype, bf16.master_weights_dtype, bf16.fp8_params) == \
        ("bf16", "none", False)
    assert (fp8.optimizer_moments_dtype, fp8.master_weights_dtype, fp8.fp8_params) == \
        ("bf16", "bf16", True)
    for plan in (bf16, fp8):
        assert (plan.recompute, plan.attention_impl, plan.tp_comm_overlap) == \
            ("selective", "fa2", "userbuffers")


def test_dgxc_llama31_405b_rows_run_userbuffers_and_fp8_parameters():
    """dgxc-benchmarking's Llama 3.1 405B recipe (configure.sh sets the userbuffers'
    fp8_buf and fp8_params; the launcher YAML turns ub_tp_comm_overlap on): userbuffers
    TP overlap in both precisions, FP8 primary weights in the FP8 runs only; the 8B/70B
    rows of the same directory are not keyed to it."""
    runs = {r.row_id: r for r in published.load_runs(sources=["nvidia_dgxc_benchmarking"])}
    models, recipes = published.load_models(), published.load_nemo_recipes()
    bf16 = published.scenario_for(runs["dgxc_l405_04"], models, recipes)
    fp8 = published.scenario_for(runs["dgxc_l405_10"], models, recipes)
    assert (bf16.plan.tp_comm_overlap, bf16.plan.fp8_params) == ("userbuffers", False)
    assert (fp8.plan.tp_comm_overlap, fp8.plan.fp8_params) == ("userbuffers", True)
    assert any("llama3.1 405b recipe" in s for s in fp8.settings)
    assert dgxc_recipe_of(runs["dgxc_l70b_07"].get("citation")) is None


def test_fp8_reduce_scatter_buffers_follow_the_rows_dated_userbuffers_configs():
    """fp8_buf on the pipelined forward reduce-scatters only where the row's own
    userbuffers config sets it: dgxc's Llama 3.1 405B FP8 runs (configure.sh @143b90dd)
    and the NeMo 24.07 Llama 3 70B FP8 row (the launcher's llama3_70b_fp8.sh selects the
    fp8_buf config); BF16 runs, dgxc's 70B, GPT-3 175B and the Megatron-Bridge rows
    (ring-exchange reduce-scatters without fp8_buf) keep bf16 buffers."""
    runs = {r.row_id: r for r in published.load_runs()}
    models, recipes = published.load_models(), published.load_nemo_recipes()

    def buffers(row_id):
        scenario = published.scenario_for(runs[row_id], models, recipes)
        assert scenario.plan.tp_comm_overlap == "userbuffers"
        return scenario.plan.tp_comm_fp8_reduce_scatter

    both = ("proj_fprop", "fc2_fprop")
    assert buffers("dgxc_l405_10") == buffers("nemo2407a_12") == buffers("nemo2407b_12") == both
    for row_id in ("dgxc_l405_04", "dgxc_l70b_07", "nemo2407a_03", "dgxc_gpt175_06",
                   "mb2511_20", "mb2602_06", "mb2511_12", "dgxc_n340_06"):
        assert buffers(row_id) == (), row_id


def _row_plan_rank0(row_id):
    """The published row's plan and its rank-0 memory (with the GPU's reserve)."""
    run = next(r for r in published.load_runs() if r.row_id == row_id)
    scenario = published.scenario_for(run, published.load_models(), published.load_nemo_recipes())
    reserve = scenario.cluster.gpu.memory_reserve_bytes
    return scenario, rank_peaks(scenario.model, scenario.plan, reserve)[0]


def test_nemo_2407_nemotron_runs_the_launchers_bf16_distributed_adam_and_fits():
    """NeMo 24.07's Nemotron-4 340B row (TP 8, PP 8, VP 12, DP 2, FP8, MBS 1, GBS 32) with
    the launcher's distributed_fused_adam, bf16 state, no parameter copy. By hand, rank 0:
    P = 12 layers x (18432 x (18432 + 2 x 8 x 192) + 18432^2 + 2 x 18432 x 73728) / 8
    + 12 x 4 x 18432 (two LayerNorm1p weight+bias, replicated) + 256000 x 18432 / 8
    (embedding) = 5 771 722 752 parameters; bf16 gradients 2P; Adam's bf16 moments 4P over
    DP 2 = 2P (so equal to the gradients); weights 2P + FP8 copies 2 x 12 layers' P.
    Activations: interleaved 1F1B warm-up on rank 0 is (8 - 1) x 2 + (12 - 1) x 8 = 102
    chunks (Megatron get_num_warmup_microbatches), 103 held at the first backward, one
    layer each, no dropout: per layer 512 x 18432 x 6 (two bf16 norm inputs, FP8 QKV and
    fc1 inputs) + 4096 x 12 x 192 x 5 (bf16 Q and attention output, its FP8 copy)
    + 4 x 4096 x 192 (bf16 K, V of one KV head) + 4096 x 9216 x 3 (bf16 fc1 output, FP8
    fc2 input) = 220 200 960 bytes."""
    scenario, rank0 = _row_plan_rank0("nemo2407a_10")
    plan = scenario.plan
    assert (plan.optimizer_moments_dtype, plan.master_weights_dtype, plan.fp8_params,
            plan.store_param_remainders) == ("bf16", "none", False, False)
    assert any(s.startswith("unprinted: Apex distributed Adam with bf16 state")
               for s in scenario.settings)
    h = 18432
    layer = (h * (h + 2 * 8 * 192) + h * h + 2 * h * 73728) // 8 + 4 * h
    params = 12 * layer + 256000 * h // 8
    assert params == 5_771_722_752
    assert rank0.gradients_bytes == 2 * params
    assert rank0.optimizer_bytes == 4 * params / 2 == rank0.gradients_bytes
    assert rank0.weights_bytes == 2 * params + 2 * 12 * layer
    per_layer = 512 * h * 6 + 4096 * 12 * 192 * 5 + 4 * 4096 * 192 + 4096 * 9216 * 3
    assert per_layer == 220_200_960
    assert rank0.activations_bytes == 103 * per_layer
    assert rank0.total_bytes < scenario.cluster.gpu.hbm_bytes


def test_nemo1_launcher_adam_applies_to_its_release_and_model_only():
    base = {"framework": "NeMo/Megatron-Core", "gpu": "H100-SXM", "dtype": "fp8",
            "citation": "GitHub NVIDIA/NeMo docs/source/performance/performance_summary.md"}
    hit = _settings({**base, "model": "nemotron4-340b", "framework_version": "NeMo 24.07 container"})
    assert hit.fields["optimizer_moments_dtype"] == "bf16"
    assert hit.fields["master_weights_dtype"] == "none"
    for other in ({"model": "nemotron4-340b", "framework_version": "NeMo 25.02 container"},
                  {"model": "llama3-70b", "framework_version": "NeMo 24.07 container"}):
        assert "optimizer_moments_dtype" not in _settings({**base, **other}).fields


def test_bridge_gpt_oss_h100_row_runs_the_presets_micro_batch_and_fits():
    """The 25.11 H100 gpt-oss-120b row prints MBS 4 with GA 2 (flagged: GBS/(MBS*DP) = 8):
    the preset's micro-batch 1 is used. By hand, rank 0 (PP 4: 9 layers, EP 8, no TP, bf16,
    recompute modules layernorm and moe_act, no dropout), per token of a layer: norm inputs
    2 x 2 x 2880, Q/attention output/K/V 2 x (2 x 64 + 2 x 8) x 64, router fp32 4 x 128,
    per routed pair (top-4) the permuted input 2 x 2880, the gated fc1 output 2 x 2 x 2880
    and its fp32 probability 4: 99 600 bytes; 4096 tokens; 1F1B keeps PP = 4 micro-batches
    on rank 0."""
    scenario, rank0 = _row_plan_rank0("mb2511_21")
    assert scenario.plan.micro_batch == 1
    assert scenario.plan.num_microbatches == 512 // 16
    per_token = 2 * 2 * 2880 + 2 * (2 * 64 + 2 * 8) * 64 + 4 * 128 + 4 * (2 * 2880 + 4 * 2880 + 4)
    assert per_token == 99_600
    assert rank0.activations_bytes == 4 * 9 * 4096 * per_token
    assert rank0.total_bytes < scenario.cluster.gpu.hbm_bytes


def test_bridge_preset_micro_batch_only_replaces_a_contradicted_one():
    row = {**BRIDGE, "model": "gpt-oss-120b", "gpu": "H100-SXM", "dtype": "bf16",
           "micro_batch": "4"}
    flagged = {**row, "notes": "GA printed 2 (INCONSISTENT-AS-PRINTED: GBS/(MBS*DP) = 8)"}
    assert _settings(flagged).fields["micro_batch"] == 1
    assert any("printed MBS 4 contradicts" in u for u in _settings(flagged).unprinted)
    consistent = {**row, "notes": "GA printed 8 (consistent with GBS/(MBS*DP))"}
    assert "micro_batch" not in _settings(consistent).fields
    b200 = {**flagged, "gpu": "B200"}
    assert "micro_batch" not in _settings(b200).fields
