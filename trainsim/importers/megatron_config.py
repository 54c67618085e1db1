"""Megatron-LM settings -> the model and the ParallelPlan fields trainsim simulates.

One mapping for every front end: Megatron-LM command lines
(:mod:`~trainsim.importers.megatron_args`) and NeMo / Megatron-Bridge YAML
(:mod:`~trainsim.importers.nemo_config`) are first turned into :class:`Settings` named by
Megatron-LM's ``argparse`` destinations; :func:`job_from_settings` reads them here.

Every setting is one of:

* **mapped** to a model or plan field (this module's functions, one per concern);
* **ignored**: no effect on step time or memory (:data:`IGNORED`, :data:`IGNORED_PREFIXES`:
  logging, checkpoint paths and intervals, data, seeds, learning-rate schedules and
  optimizer hyper-parameters, fault tolerance, inference, other model families), listed in
  the result's inputs;
* **refused** when active (:data:`REFUSED`): it changes step time or memory in a way the
  plan has no field for; one line names it and says why;
* **approximated** (:data:`APPROXIMATED`): a second-order effect trainsim does not model;
  accepted and stated in the result's inputs.

Where the job gives no value, Megatron-LM's own default applies, read from
``megatron/training/arguments.py`` (NVIDIA/Megatron-LM commit 000c4ac2, 2025):
``--tensor/pipeline/context/expert-model-parallel-size`` 1; ``--sequence-parallel`` off,
and forced off at TP 1 (``validate_args``); ``--ffn-hidden-size`` 4h, or
``int(8h/3 / 64) * 64`` with ``--swiglu``; ``--kv-channels`` h / heads;
``--num-query-groups`` used only with ``--group-query-attention``;
``--normalization LayerNorm``; ``--position-embedding-type learned_absolute``; tied
embeddings unless ``--untie-embeddings-and-output-weights``; dropout 0.1;
``--make-vocab-size-divisible-by 128`` (x TP); ``--global-batch-size`` micro-batch x dp;
``--moe-router-topk 2``; ``--moe-ffn-hidden-size`` the FFN size; ``--moe-layer-freq 1``;
dropless routing (no ``--moe-expert-capacity-factor``); ``--moe-token-dispatcher-type
allgather``; no distributed optimizer; no overlap of the gradient reduction or the
parameter gather; gradients reduced in fp32 with ``--bf16`` unless
``--grad-reduce-in-bf16``; ``--fp8-recipe delayed``; ``--transformer-impl
transformer_engine``; ``--attention-backend auto``; the fp32 vocab-parallel loss unless
``--cross-entropy-loss-fusion``; ``--optimizer adam``; DDP buckets of
``max(40M, 1M x dp x cp)`` parameters (``megatron/core/distributed/
distributed_data_parallel.py``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from strategies.model_spec import ModelSpec, MoESpec
from trainsim.importers.job import ImportedJob, Settings
from trainsim.importers.patterns import moe_layout, pipeline_layout

__all__ = ["APPROXIMATED", "IGNORED", "IGNORED_PREFIXES", "REFUSED", "is_ignored",
           "job_from_settings"]

# --------------------------------------------------------------------------- the lists

#: Settings without effect on step time or memory, by destination.
IGNORED = frozenset({
    # logging, timers, profiling
    "timing_log_level", "timing_log_option", "logging_level", "barrier_with_L1_time",
    "config_logger_dir", "enable_one_logger", "profile", "use_pytorch_profiler",
    "record_memory_history", "memory_snapshot_path", "run_workload_inspector_server",
    "disable_straggler_on_startup", "enable_ft_package", "calc_ft_timeouts",
    "check_for_nan_in_loss_and_grad", "no_check_for_nan_in_loss_and_grad",
    "check_for_spiky_loss", "check_for_large_grads", "rerun_mode",
    "check_weight_hash_across_dp_replicas_interval", "manual_gc_eval", "no_manual_gc_eval",
    "manual_gc_interval",
    "result_rejected_tracker_filename", "iterations_to_skip",
    # checkpoints
    "save", "save_interval", "persistent_save_interval", "save_retain_interval",
    "no_save_optim", "no_save_rng", "load", "no_load_optim", "no_load_rng",
    "load_main_params_from_ckpt", "no_strict_fsdp_dtensor_load", "finetune",
    "pretrained_checkpoint", "no_initialization", "use_checkpoint_args",
    "use_mp_args_from_checkpoint_args", "no_use_tokenizer_model_from_checkpoint_args",
    "exit_on_missing_checkpoint", "use_dist_ckpt", "use_persistent_ckpt_worker",
    "auto_detect_ckpt_format", "async_save", "no_ckpt_fully_parallel_save", "replication",
    "replication_jump", "replication_factor", "distrib_optim_fully_reshardable_mem_efficient",
    "override_opt_param_scheduler", "use_checkpoint_opt_param_scheduler",
    # data and tokenizer files
    "data_path", "split", "train_data_path", "valid_data_path", "test_data_path",
    "data_args_path", "per_split_data_args_path", "data_cache_path", "no_mmap_bin_files",
    "mock_data", "num_workers", "reset_position_ids", "reset_attention_mask", "eod_mask_loss",
    "no_create_attention_mask_in_dataloader", "num_dataset_builder_threads",
    "object_storage_cache_path", "mid_level_dataset_surplus", "allow_ambiguous_pad_tokens",
    "dataloader_type", "sample_rate", "mask_prob", "short_seq_prob", "data_impl",
    "vocab_file", "merge_file", "tokenizer_metadata", "legacy_tokenizer",
    "trust_remote_code", "max_position_embeddings",
    # initialization and seeds
    "seed", "data_parallel_random_init", "init_method_std", "embedding_init_method_std",
    "init_method_xavier_uniform", "use_cpu_initialization", "init_model_with_meta_device",
    "perform_initialization",
    # learning rate, weight decay, clipping, loss scaling, optimizer hyper-parameters
    "lr", "min_lr", "warmup", "decoupled_lr", "decoupled_min_lr", "weight_decay",
    "start_weight_decay", "end_weight_decay", "weight_decay_incr_style", "clip_grad",
    "adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum", "head_lr_mult", "loss_scale",
    "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis",
    # run length, evaluation, launcher
    "train_iters", "train_samples", "eval_iters", "eval_interval", "full_validation",
    "multiple_validation_sets", "test_mode", "skip_train", "adlr_autoresume",
    "adlr_autoresume_interval", "distributed_timeout_minutes",
    "distributed_timeout_seconds_after_init", "local_rank", "lazy_mpu_init",
    "enable_msc", "disable_msc", "enable_experimental", "use_mcore_models",
    "deprecated_use_mcore_models", "train_sync_interval", "decrease_batch_size_if_needed",
    "calculate_per_token_loss", "disable_gloo_process_groups", "te_rng_tracker",
    "inference_rng_tracker", "cuda_graph_warmup_steps", "tp_comm_overlap_cfg",
    "tp_comm_bootstrap_backend", "disable_symmetric_registration",
    # numerics with no cost of their own
    "norm_epsilon", "layernorm_epsilon", "apply_layernorm_1p",
    "apply_residual_connection_post_layernorm", "openai_gelu", "onnx_safe",
    "apply_query_key_layer_scaling", "attention_softmax_in_fp32",
    "disable_bf16_reduced_precision_matmul", "activation_func_clamp_value",
    "glu_linear_offset", "mtp_loss_scaling_factor", "fp8_margin", "fp8_interval",
    "fp8_amax_history_len", "fp8_amax_compute_algo", "num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16", "fp4_recipe", "rotary_base", "rotary_percent",
    "rotary_interleaved", "rotary_seq_len_interpolation_factor", "use_rope_scaling",
    "rope_scaling_factor", "rope_type", "no_rope_freq", "apply_rope_fusion",
    # MoE routing arithmetic (the router's cost is priced from the expert count)
    "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_input_jitter_eps",
    "moe_per_layer_logging", "moe_router_load_balancing_type", "moe_router_score_function",
    "moe_router_pre_softmax", "moe_router_topk_scaling_factor",
    "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_router_num_groups",
    "moe_router_group_topk", "moe_router_dtype", "moe_token_drop_policy",
    "moe_use_upcycling", "moe_upcycling_granularity", "moe_router_padding_for_fp8",
    "moe_router_padding_for_quantization", "moe_apply_probs_on_input",
    "moe_pad_experts_for_cuda_graph_inference", "moe_use_legacy_grouped_gemm",
    # multi-latent attention sizes (MLA itself is refused)
    "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "rotary_scaling_factor", "mscale", "mscale_all_dim", "cache_mla_latents",
    # settings of other flags that are refused or absent when these apply
    "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
    "disable_mamba_mem_eff_path", "hybrid_attention_ratio", "hybrid_mlp_ratio",
    "relative_attention_num_buckets", "relative_attention_max_distance", "mrope_section",
    "wgrad_deferral_limit", "optimizer_offload_fraction", "use_torch_optimizer_for_cpu_offload",
    "overlap_cpu_optimizer_d2h_h2d", "pin_cpu_grads", "no_pin_cpu_grads", "pin_cpu_params",
    "no_pin_cpu_params", "sharp_enabled_group", "keep_fp8_transpose_cache",
    "reuse_grad_buf_for_mxfp8_param_ag", "moe_deepep_num_sms", "moe_hybridep_num_sms",
    "moe_flex_dispatcher_backend", "ddp_average_in_collective", "gradient_reduce_div_fusion",
    "no_gradient_reduce_div_fusion", "ddp_pad_buckets_for_high_nccl_busbw",
    "clone_scatter_output_in_embedding", "no_clone_scatter_output_in_embedding",
    "persist_layer_norm", "no_persist_layer_norm", "use_te_activation_func",
    "use_fused_weighted_squared_relu", "async_tensor_model_parallel_allreduce",
})

#: Destination prefixes without effect on step time or memory.
IGNORED_PREFIXES = ("log_", "no_log_", "tensorboard_", "wandb_", "one_logger_", "app_tag_",
                    "straggler_", "ckpt_", "dist_ckpt_", "non_persistent_", "lr_", "exit_",
                    "inference_", "inprocess_", "error_injection_", "tiktoken_", "retro_",
                    "rl_", "grpo_", "langrl_", "dino_", "vision_", "swin_", "ict_",
                    "biencoder_", "retriever_", "indexer_", "sft", "kitchen_", "bert_",
                    "profile_", "nccl_communicator_", "high_priority_stream_groups")

_NO_ENCODER = "encoder-decoder models are not modelled (give --num-layers)"
_ELEMENTWISE = ("the plan prices norms, activations and RoPE as fused or eager together "
                "(plan field elementwise)")
_TP_OVERLAP = ("the plan overlaps all TP collectives with userbuffers or none of them (plan "
               "field tp_comm_overlap)")

#: Settings refused when active: destination -> (inactive values, why).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "multi_latent_attention": ((False, None), "multi-head latent attention is not modelled "
                               "(ModelSpec has no MLA; validate/published.py skips MLA runs too)"),
    "mtp_num_layers": ((None, 0), "multi-token-prediction layers are not modelled"),
    "window_size": ((None,), "sliding-window attention is not modelled"),
    "window_attn_skip_freq": ((None,), "sliding-window attention is not modelled"),
    "softmax_type": (("vanilla", None), "only the vanilla attention softmax is modelled"),
    "heterogeneous_layers_config_path": ((None,), "heterogeneous layers are not modelled"),
    "heterogeneous_layers_config_encoded_json": ((None,), "heterogeneous layers are not "
                                                 "modelled"),
    "is_hybrid_model": ((False, None), "Mamba hybrid models are not modelled"),
    "hybrid_override_pattern": ((None,), "Mamba hybrid models are not modelled"),
    **{name: ((None,), _NO_ENCODER) for name in ("encoder_num_layers", "decoder_num_layers",
                                                 "decoder_seq_length")},
    "yaml_cfg": ((None,), "it replaces every other argument with a file trainsim does not "
                 "read; give its arguments instead"),
    "batch_size": ((None,), "it was removed from Megatron-LM; give --micro-batch-size"),
    "model_parallel_size": ((None,), "it was removed from Megatron-LM; give "
                            "--tensor-model-parallel-size"),
    **{name: ((False, None), "the plan has no field for recomputed activations split over "
              "TP") for name in ("distribute_saved_activations",
                                 "distribute_checkpointed_activations")},
    "deterministic_mode": ((False, None), "deterministic kernels are not modelled"),
    "fp32_residual_connection": ((False, None), "fp32 residuals are not modelled"),
    "gradient_accumulation_fusion": ((True, None), "the plan has no field for weight "
                                     "gradients accumulated by a separate kernel"),
    **{name: ((True, None), _ELEMENTWISE) for name in ("bias_gelu_fusion", "bias_swiglu_fusion",
                                                       "bias_dropout_fusion")},
    **{name: ((True, None), _TP_OVERLAP) for name in (
        "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad",
        "tp_comm_split_ag", "tp_comm_split_rs")},
    "align_grad_reduce": ((True, None), "the plan has no field for unaligned gradient "
                          "reductions across pipeline stages"),
    "scatter_gather_tensors_in_pipeline": ((True, None), "the plan has no field for "
                                           "pipeline tensors sent whole"),
    "use_ring_exchange_p2p": ((False, None), "ring-exchange p2p is not modelled"),
    "defer_embedding_wgrad_compute": ((False, None), "the plan has no field for the "
                                      "output layer's weight gradient deferred to the flush"),
    "delay_wgrad_compute": ((False, None), "the plan has no field for delayed weight "
                            "gradients"),
    "overlap_moe_expert_parallel_comm": ((False, None), "the plan has no field for the MoE "
                                         "all-to-all overlapped across micro-batches"),
    "ddp_num_buckets": ((None,), "give --ddp-bucket-size instead (the plan sizes buckets in "
                        "bytes)"),
    "ddp_reduce_scatter_with_fp32_accumulation": ((False, None), "the all-to-all "
                                                  "reduce-scatter is not modelled"),
    "num_distributed_optimizer_instances": ((1, None), "the plan has no field for several "
                                            "distributed-optimizer instances"),
    "use_sharp": ((False, None), "SHARP in-network reductions are not modelled"),
    "enable_full_sharding_in_hsdp": ((False, None), "hybrid-sharded data parallelism is not "
                                     "modelled"),
    "hierarchical_context_parallel_sizes": ((None,), "hierarchical context parallelism is "
                                            "not modelled"),
    "optimizer_cpu_offload": ((False, None), "optimizer offload to the CPU is not modelled"),
    "fp8_param_gather": ((False, None), "the plan has no field for FP8 parameters gathered "
                         "in FP8"),
    "fp8_wgrad": ((True, None), "the plan has no field for weight gradients in bf16 under "
                  "FP8"),
    "first_last_layers_bf16": ((False, None), "the plan has no field for bf16 first and last "
                               "layers under FP8"),
    "fp8_quantizer_factory": ((None,), "custom FP8 quantizers are not modelled"),
    "fp4": ((None,), "FP4 training is not modelled"),
    "fp4_param": ((False, None), "FP4 training is not modelled"),
    "fp4_quantizer_factory": ((None,), "FP4 training is not modelled"),
    "enable_cuda_graph": ((False, None), "the plan has no field for CUDA graphs"),
    "external_cuda_graph": ((False, None), "the plan has no field for CUDA graphs"),
    "cuda_graph_impl": (("none", None), "the plan has no field for CUDA graphs"),
    "moe_extended_tp": ((False, None), "expert tensor parallelism other than TP is not "
                        "modelled"),
    "pipeline_model_parallel_comm_backend": (("nccl", None), "only NCCL is modelled"),
    "distributed_backend": (("nccl", None), "only NCCL is modelled"),
}

#: Settings of the interleaved schedule refused when not at Megatron's default:
#: (destination, default, why).
_INTERLEAVED_ONLY = (
    ("overlap_p2p_comm", True, "the plan has no field for blocking pipeline send/recv"),
    ("overlap_p2p_comm_warmup_flush", False, "the plan has no field for pipeline send/recv "
     "overlapped in warm-up and flush"),
    ("align_param_gather", True, "the plan has no field for unaligned parameter gathers "
     "across pipeline stages"),
)

#: Settings accepted but not modelled: destination -> (inactive values, what it means).
APPROXIMATED: dict[str, tuple[tuple[Any, ...], str]] = {
    "qk_layernorm": ((False, None), "query/key norms are not priced (two small norms per "
                     "layer)"),
    "qk_l2_norm": ((False, None), "query/key norms are not priced"),
    "add_qkv_bias": ((False, None), "linear-layer biases are not priced"),
    "moe_shared_expert_overlap": ((False, None), "shared experts priced as if not overlapped "
                                  "with the token dispatch"),
    "moe_permute_fusion": ((False, None), "token permutation priced the same fused or not"),
    "moe_router_fusion": ((False, None), "the router priced the same fused or not"),
    "moe_router_force_load_balancing": ((False, None), "routing is priced perfectly "
                                        "balanced, forced or not"),
    "moe_enable_deepep": ((False, None), "DeepEP dispatch priced as an NCCL all-to-all"),
    "manual_gc": ((False, None), "Python garbage-collection pauses are not modelled"),
    "nccl_ub": ((False, None), "NCCL user-buffer registration not modelled"),
    "fsdp_double_buffer": ((False, None), "FSDP double buffering not modelled"),
    "overlap_param_gather_with_optimizer_step": ((False, None), "the first bucket's gather "
                                                 "overlapping the optimizer step is not "
                                                 "modelled"),
    "empty_unused_memory_level": ((0, None), "emptying the CUDA cache is not modelled"),
    "fp16_lm_cross_entropy": ((False, None), "the loss priced in fp32"),
    "rampup_batch_size": ((None,), "the steady-state step at the full global batch is "
                          "simulated, not the ramp-up"),
    "suggested_communication_unit_size": ((None,), "FSDP communication units not modelled"),
}

#: Flags of the Megatron-LM of 2021 (before Megatron-Core; removed since).
LEGACY = ("checkpoint_activations", "checkpoint_num_layers", "DDP_impl", "data_impl",
          "activations_checkpoint_method", "activations_checkpoint_num_layers")

#: Vocabulary sizes of tokenizers Megatron reads from files trainsim does not open:
#: (words in --tokenizer-model, tokens, source).
KNOWN_TOKENIZERS = (
    (("qwen3",), 151669, "Qwen3 tokenizer: 151,643 BPE tokens + special tokens up to id "
     "151668 (</think>) in its tokenizer_config.json"),
    (("llama-3", "llama3", "llama-3.1", "llama3.1"), 128256, "Llama 3 tokenizer: 128,000 "
     "BPE tokens + 256 special tokens (meta-llama config.json vocab_size 128256)"),
)
#: Tokens of Megatron's GPT2BPETokenizer (GPT-2's vocabulary, gpt2-vocab.json).
GPT2_VOCAB = 50257

_RECOMPUTE_MODULES = {"core_attn": "core_attn", "layernorm": "layernorm", "mlp": "mlp",
                      "moe": "moe", "moe_act": "moe_act"}
_FP8_RECIPES = {"delayed": "te-delayed", "tensorwise": "te-current", "mxfp8": "te-mxfp8",
                "blockwise": "te-blockwise"}
_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def is_ignored(name: str) -> bool:
    """Whether a setting (by destination) has no effect on step time or memory."""
    return name in IGNORED or name.startswith(IGNORED_PREFIXES)


# --------------------------------------------------------------------------- reading


def _value(s: Settings, name: str, kind: Callable, default: Any = None, *,
           minimum: int | None = None, choices: tuple = ()) -> Any:
    """A setting checked for its type (and range / choices), or ``default``.

    Raises:
        ValueError: one line naming the setting as the job spells it.
    """
    value = s.get(name)
    if value is None:
        return default
    spelled = s.spelled(name)
    if kind is int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{spelled}: {value!r} is not valid; give a whole number")
        if minimum is not None and value < minimum:
            raise ValueError(f"{spelled}: {value} is not valid; give a whole number >= "
                             f"{minimum}")
    elif kind is float:
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{spelled}: {value!r} is not valid; give a number") from None
    elif kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{spelled}: {value!r} is not valid; give true or false")
    elif kind is str and not isinstance(value, str):
        raise ValueError(f"{spelled}: {value!r} is not valid; give a name")
    if choices and value not in choices:
        raise ValueError(f"{spelled}: {value!r} is not valid; valid: "
                         f"{', '.join(map(str, choices))}")
    return value


def _required(s: Settings, name: str, kind: Callable = int) -> Any:
    if not s.has(name) or s.get(name) is None:
        raise ValueError(f"{s.spelled(name)}: missing from {s.source}; Megatron-LM requires "
                         "it (give it)")
    return _value(s, name, kind, minimum=1 if kind is int else None)


def _active(value: Any, inactive: tuple[Any, ...]) -> bool:
    return not any(value is v or (value == v and type(value) is type(v)) or
                   (isinstance(value, list) and not value and v is None) for v in inactive)


# --------------------------------------------------------------------------- the mapping


def job_from_settings(s: Settings, *, gpus: int | None = None,
                      model: ModelSpec | None = None) -> ImportedJob:
    """The model and plan fields of a job's Megatron-LM settings (module docstring).

    Args:
        s: the settings.
        gpus: GPUs of the job when the caller knows (``--gpus``); else the settings'.
        model: a model given explicitly: it replaces the job's own shape.

    Returns:
        The :class:`ImportedJob` (plan fields, model, ignored settings, assumptions).

    Raises:
        ValueError: one line naming the setting as the job spells it: a refused setting,
            a missing required one, or a value Megatron-LM itself would reject.
    """
    notes = list(s.notes)
    for name, (inactive, why) in REFUSED.items():
        if s.has(name) and _active(s.get(name), inactive):
            raise ValueError(f"{s.spelled(name)}: {s.get(name)!r} is refused: {why}; remove "
                             "it to simulate the job without it")
    for name, (inactive, what) in APPROXIMATED.items():
        if s.has(name) and _active(s.get(name), inactive):
            notes.append(f"{s.spelled(name)}: {what}")
    legacy = [s.spelled(name) for name in LEGACY if s.has(name)]
    if legacy:
        notes.append(f"{', '.join(legacy)}: Megatron-LM before Megatron-Core (2021-2022): "
                     "local transformer layers with unfused attention unless "
                     "--use-flash-attn, TP collectives blocking compute")
    gpus = gpus if gpus is not None else s.gpus
    tp = _value(s, "tensor_model_parallel_size", int, 1, minimum=1)
    if model is None:
        model = model_from_settings(s, tp=tp, notes=notes)
    else:
        notes.append(f"model {model.name!r} given explicitly: the job's own shape settings "
                     "are not used")
    plan: dict[str, Any] = {"tp": tp}
    _parallel(s, plan, model, gpus, notes)
    _recompute(s, plan, notes, legacy=bool(legacy))
    _precision(s, plan, notes)
    model_parallel = plan["tp"] * plan["pp"] * plan["cp"]
    dp = gpus // model_parallel if gpus is not None and gpus % model_parallel == 0 else None
    _data_parallel(s, plan, notes, legacy=bool(legacy), dp=dp)
    _stack(s, plan, notes, legacy=bool(legacy))
    _moe(s, plan, model, notes)
    # settings this job's configuration never reads (--moe-router-topk without experts,
    # a recompute method without recompute) have no effect on it, as in Megatron-LM
    unused = [s.spelled(name) for name in s.values if name not in s.read or is_ignored(name)]
    ignored = tuple(dict.fromkeys([*s.ignored, *unused]))
    return ImportedJob(source=s.source, model=model, plan=plan, gpus=gpus, ignored=ignored,
                       assumed=tuple(dict.fromkeys(notes)))


def model_from_settings(s: Settings, *, tp: int, notes: list[str]) -> ModelSpec:
    """The ModelSpec of a job's network-size, tokenizer and MoE settings.

    Raises:
        ValueError: a missing size, a tokenizer whose vocabulary trainsim cannot know, or
            a MoE layout a ModelSpec cannot express (one line).
    """
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        if s.get(name) is None and s.shape_hint:
            raise ValueError(f"{s.spelled(name)}: missing from {s.source}; {s.shape_hint}")
    layers = _required(s, "num_layers")
    hidden = _required(s, "hidden_size")
    heads = _required(s, "num_attention_heads")
    swiglu = bool(_value(s, "swiglu", bool, False)) or bool(_value(s, "quick_geglu", bool,
                                                                    False))
    if _value(s, "squared_relu", bool, False):
        if swiglu:
            raise ValueError(f"{s.spelled('squared_relu')}: give it or {s.spelled('swiglu')}, "
                             "not both")
        notes.append(f"{s.spelled('squared_relu')}: priced as the two-matmul GELU MLP (its "
                     "activation kernel moves the same bytes)")
    if s.has("ffn_hidden_size") and s.get("ffn_hidden_size") is not None:
        ffn = _value(s, "ffn_hidden_size", int, minimum=1)
    else:
        # arguments.py validate_args: 4h, or 2/3 of it rounded down to 64 for gated units
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        notes.append(f"{s.spelled('ffn_hidden_size')} not given: {ffn} (Megatron-LM's "
                     "default)")
    if s.has("kv_channels") and s.get("kv_channels") is not None:
        head_dim = _value(s, "kv_channels", int, minimum=1)
    elif hidden % heads:
        raise ValueError(f"{s.spelled('num_attention_heads')}: {heads} does not divide "
                         f"{s.spelled('hidden_size')} {hidden}; give {s.spelled('kv_channels')}")
    else:
        head_dim = hidden // heads
    kv_heads = heads
    if _value(s, "group_query_attention", bool, False):
        kv_heads = _value(s, "num_query_groups", int, 1, minimum=1)
    norm = _value(s, "normalization", str, "LayerNorm", choices=("LayerNorm", "RMSNorm"))
    dropout = max(_value(s, "hidden_dropout", float, 0.1),
                  _value(s, "attention_dropout", float, 0.1)) > 0
    position = _value(s, "position_embedding_type", str, "learned_absolute")
    if _value(s, "use_rotary_position_embeddings", bool, False):
        position = "rope"
    if position not in ("learned_absolute", "rope", "none"):
        raise ValueError(f"{s.spelled('position_embedding_type')}: {position!r} is refused: "
                         "only learned-absolute and rotary position embeddings are modelled")
    notes.append(f"position embedding {position}: not priced (as for every model here: "
                 "rotary embeddings have no weights, learned ones are 0.02 % of GPT-3)")
    if _value(s, "add_bias_linear", bool, True):
        notes.append(f"{s.spelled('add_bias_linear')}: linear layers with biases (Megatron's "
                     "default): biases are not priced")
    vocab = _vocab(s, tp, notes)
    moe = _moe_spec(s, layers, ffn, notes)
    return ModelSpec(name=_model_name(s), num_layers=layers, hidden_size=hidden,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     ffn_hidden_size=ffn, vocab_size=vocab,
                     mlp="swiglu" if swiglu else "gelu",
                     norm="rmsnorm" if norm == "RMSNorm" else "layernorm",
                     tied_embeddings=not _value(s, "untie_embeddings_and_output_weights", bool,
                                                False),
                     dropout=dropout, moe=moe, source=s.source)


def _model_name(s: Settings) -> str:
    return f"imported ({s.source})"


def _vocab(s: Settings, tp: int, notes: list[str]) -> int:
    """The padded vocabulary (Megatron ``_vocab_size_with_padding``: a multiple of
    ``--make-vocab-size-divisible-by`` x TP)."""
    if s.has("padded_vocab_size") and s.get("padded_vocab_size") is not None:
        return _value(s, "padded_vocab_size", int, minimum=1)
    kind = _value(s, "tokenizer_type", str, None)
    if s.has("vocab_size") and s.get("vocab_size") is not None:
        tokens = _value(s, "vocab_size", int, minimum=1)
        if kind == "NullTokenizer":
            tokens += 1  # the null tokenizer adds its end-of-document token
    elif kind in (None, "GPT2BPETokenizer"):
        tokens = GPT2_VOCAB
        if kind is None:
            notes.append(f"no {s.spelled('tokenizer_type')}: GPT2BPETokenizer, "
                         "pretrain_gpt.py's default (50,257 tokens)")
    else:
        name = str(s.get("tokenizer_model") or "").lower()
        known = [(count, why) for words, count, why in KNOWN_TOKENIZERS
                 if any(word in name for word in words)]
        if not known:
            raise ValueError(f"{s.spelled('tokenizer_type')}: {kind!r} keeps its vocabulary in "
                             f"files trainsim does not read ({s.spelled('tokenizer_model')} "
                             f"{s.get('tokenizer_model')!r}); give "
                             f"{s.spelled('padded_vocab_size')} N")
        tokens, why = known[0]
        notes.append(f"{s.spelled('tokenizer_model')} {s.get('tokenizer_model')!r}: {tokens} "
                     f"tokens ({why})")
    tokens += _value(s, "vocab_extra_ids", int, 0, minimum=0)
    multiple = _value(s, "make_vocab_size_divisible_by", int, 128, minimum=1) * tp
    padded = math.ceil(tokens / multiple) * multiple
    notes.append(f"vocabulary {tokens} tokens padded to a multiple of {multiple} "
                 f"(make-vocab-size-divisible-by x TP): {padded}")
    return padded


def _moe_spec(s: Settings, layers: int, ffn: int, notes: list[str]) -> MoESpec | None:
    experts = _value(s, "num_experts", int, None, minimum=0)
    if not experts:
        return None
    expert_ffn = _value(s, "moe_ffn_hidden_size", int, None, minimum=1) or ffn
    shared = 0
    shared_size = _value(s, "moe_shared_expert_intermediate_size", int, None, minimum=1)
    if shared_size:
        if shared_size % expert_ffn:
            raise ValueError(f"{s.spelled('moe_shared_expert_intermediate_size')}: "
                             f"{shared_size} is refused: a model here has shared experts of "
                             f"the routed experts' size ({expert_ffn}), and this is not a "
                             "multiple of it")
        shared = shared_size // expert_ffn
    first_dense, frequency = moe_layout(s.get("moe_layer_freq", 1), layers,
                                        flag=s.spelled("moe_layer_freq"))
    factor = _value(s, "moe_expert_capacity_factor", float, None)
    capacity = 0.0
    if factor is not None:
        if _value(s, "moe_pad_expert_input_to_capacity", bool, False):
            capacity = factor
        else:
            notes.append(f"{s.spelled('moe_expert_capacity_factor')} {factor} without padding: "
                         "tokens over capacity are dropped, none padded; priced at balance")
    return MoESpec(num_experts=experts, top_k=_value(s, "moe_router_topk", int, 2, minimum=1),
                   expert_ffn_hidden_size=expert_ffn, shared_experts=shared,
                   capacity_factor=capacity, first_dense_layers=first_dense,
                   layer_frequency=frequency)


def _parallel(s: Settings, plan: dict[str, Any], model: ModelSpec, gpus: int | None,
              notes: list[str]) -> None:
    """Parallel sizes, virtual pipeline stages, their layers, batch and sequence."""
    pp = _value(s, "pipeline_model_parallel_size", int, 1, minimum=1)
    cp = _value(s, "context_parallel_size", int, 1, minimum=1)
    plan.update(pp=pp, cp=cp, ep=_value(s, "expert_model_parallel_size", int, 1, minimum=1))
    expert_tp = _value(s, "expert_tensor_parallel_size", int, None, minimum=1)
    if expert_tp is not None and expert_tp != plan["tp"] and model.moe is not None:
        raise ValueError(f"{s.spelled('expert_tensor_parallel_size')}: {expert_tp} is refused: "
                         f"experts here are split over TP ({plan['tp']}); the plan has no "
                         "field for another expert TP")
    vpp, split = _virtual_stages(s, model.num_layers, pp)
    plan.update(vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b")
    if split is not None:
        plan["layers_per_stage"] = split
    if vpp > 1:  # Megatron turns these off without interleaving (validate_args)
        for name, inactive, why in _INTERLEAVED_ONLY:
            if _value(s, name, bool, inactive) != inactive:
                raise ValueError(f"{s.spelled(name)}: {s.get(name)!r} is refused: {why}")
    group = _value(s, "microbatch_group_size_per_vp_stage", int, None, minimum=1)
    if group is not None and group != pp:
        raise ValueError(f"{s.spelled('microbatch_group_size_per_vp_stage')}: {group} is "
                         f"refused: the interleaved schedule here groups pp ({pp}) "
                         "micro-batches per virtual stage")
    if cp > 1:
        kinds = s.get("cp_comm_type") or ["p2p"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if any(kind != "p2p" for kind in kinds):
            raise ValueError(f"{s.spelled('cp_comm_type')}: {' '.join(map(str, kinds))!r} is "
                             "refused: the context parallelism modelled is the p2p ring")
    if _value(s, "use_tp_pp_dp_mapping", bool, False):
        plan["order"] = ("tp", "cp", "pp", "dp")
    seq = s.get("seq_length") if s.get("seq_length") is not None else s.get(
        "encoder_seq_length")
    if seq is None:
        _required(s, "seq_length")
    plan["seq_len"] = _value(s, "seq_length" if s.get("seq_length") is not None
                             else "encoder_seq_length", int, minimum=1)
    micro = _required(s, "micro_batch_size")
    plan["micro_batch"] = micro
    if s.has("global_batch_size") and s.get("global_batch_size") is not None:
        plan["global_batch"] = _value(s, "global_batch_size", int, minimum=1)
    elif gpus is not None and gpus % (plan["tp"] * pp * cp) == 0:
        plan["global_batch"] = micro * gpus // (plan["tp"] * pp * cp)
        notes.append(f"{s.spelled('global_batch_size')} not given: micro-batch x dp = "
                     f"{plan['global_batch']} (Megatron-LM's default: one micro-batch per "
                     "step)")
    else:
        raise ValueError(f"{s.spelled('global_batch_size')}: not given, and Megatron's default "
                         "(micro-batch x dp) needs the GPU count; give --gpus")


def _virtual_stages(s: Settings, layers: int, pp: int
                    ) -> tuple[int, tuple[int, ...] | None]:
    """(virtual stages per rank, explicit layers per virtual stage or None), as Megatron
    places layers: ``validate_args`` and ``get_num_layers_to_build``."""
    layout = _value(s, "pipeline_model_parallel_layout", str, None)
    if layout is not None:
        split = pipeline_layout(layout, flag=s.spelled("pipeline_model_parallel_layout"))
        if len(split) % pp or sum(split) != layers:
            raise ValueError(f"{s.spelled('pipeline_model_parallel_layout')}: {layout!r} is "
                             f"not valid; give a multiple of pp {pp} stages holding the "
                             f"{layers} layers")
        return len(split) // pp, split
    embedding = bool(_value(s, "account_for_embedding_in_pipeline_split", bool, False))
    loss = bool(_value(s, "account_for_loss_in_pipeline_split", bool, False))
    first = _value(s, "decoder_first_pipeline_num_layers", int, None, minimum=0)
    last = _value(s, "decoder_last_pipeline_num_layers", int, None, minimum=0)
    per_stage = _value(s, "num_layers_per_virtual_pipeline_stage", int, None, minimum=1)
    vpp = _value(s, "num_virtual_stages_per_pipeline_rank", int, None, minimum=1)
    if vpp is None:
        vpp = _value(s, "virtual_pipeline_model_parallel_size", int, None, minimum=1)
    if per_stage is not None and vpp is not None:
        raise ValueError(f"{s.spelled('num_layers_per_virtual_pipeline_stage')}: give it or "
                         f"{s.spelled('num_virtual_stages_per_pipeline_rank')}, not both")
    counted = layers + embedding + loss  # the embedding and the loss count as layers
    if first is not None or last is not None:
        if embedding or loss:
            raise ValueError(f"{s.spelled('decoder_first_pipeline_num_layers')}: give it or "
                             "--account-for-embedding/loss-in-pipeline-split, not both")
        return _uneven_split(s, layers, pp, vpp or 1, first, last, per_stage)
    if counted % pp:
        raise ValueError(f"{s.spelled('num_layers')}: {counted} layers (with the embedding and "
                         f"loss if accounted) are not divisible by pp {pp}, as Megatron-LM "
                         "requires; give an uneven split (--decoder-first/last-pipeline-"
                         "num-layers)")
    per_rank = counted // pp
    if per_stage is not None:
        if per_rank % per_stage:
            raise ValueError(f"{s.spelled('num_layers_per_virtual_pipeline_stage')}: "
                             f"{per_stage} does not divide the {per_rank} layers per pipeline "
                             "rank")
        vpp = per_rank // per_stage
    vpp = vpp or 1
    if per_rank % vpp:
        raise ValueError(f"{s.spelled('num_virtual_stages_per_pipeline_rank')}: {vpp} does not "
                         f"divide the {per_rank} layers per pipeline rank")
    if not (embedding or loss):
        return vpp, None
    split = [per_rank // vpp] * (pp * vpp)
    split[0] -= embedding
    split[-1] -= loss
    return vpp, tuple(split)


def _uneven_split(s: Settings, layers: int, pp: int, vpp: int, first: int | None,
                  last: int | None, per_stage: int | None
                  ) -> tuple[int, tuple[int, ...] | None]:
    """Megatron's ``--decoder-first/last-pipeline-num-layers``: the rest split evenly over
    the middle ranks; each rank's layers split evenly over its virtual stages."""
    if per_stage is not None:
        raise ValueError(f"{s.spelled('num_layers_per_virtual_pipeline_stage')}: Megatron-LM "
                         "needs --num-virtual-stages-per-pipeline-rank with an uneven pipeline")
    middle = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
        raise ValueError(f"{s.spelled('decoder_first_pipeline_num_layers')}: {first} and "
                         f"{s.spelled('decoder_last_pipeline_num_layers')}: {last} leave "
                         f"{rest} layers for {middle} middle pipeline ranks; give counts that "
                         "leave a multiple")
    ranks = [rest // middle if middle else 0] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    if any(count % vpp for count in ranks):
        raise ValueError(f"{s.spelled('num_virtual_stages_per_pipeline_rank')}: {vpp} does not "
                         f"divide every pipeline rank's layers {tuple(ranks)}")
    # virtual stage v of rank r is model chunk v * pp + r
    split = tuple(ranks[stage % pp] // vpp for stage in range(pp * vpp))
    return vpp, split


def _recompute(s: Settings, plan: dict[str, Any], notes: list[str], *, legacy: bool) -> None:
    """Activation recomputation: granularity, method, layers and modules."""
    granularity = _value(s, "recompute_granularity", str, None, choices=("full", "selective",
                                                                          None))
    method = _value(s, "recompute_method", str, None, choices=("uniform", "block", None))
    layers = _value(s, "recompute_num_layers", int, None, minimum=0)
    if _value(s, "recompute_activations", bool, False):
        granularity = "selective"  # arguments.py: --recompute-activations is selective
    if legacy and _value(s, "checkpoint_activations", bool, False):
        # 2021: every layer (chunks of --checkpoint-num-layers) recomputed from its input
        granularity = "full"
        method = _value(s, "activations_checkpoint_method", str, "uniform")
        layers = _value(s, "activations_checkpoint_num_layers", int,
                        _value(s, "checkpoint_num_layers", int, 1))
    modules = s.get("recompute_modules")
    if _value(s, "moe_layer_recompute", bool, False):
        granularity, modules = "selective", list(modules or []) + ["moe"]
    if granularity is None:
        plan["recompute"] = "none"
        return
    if granularity == "selective":
        plan["recompute"] = "selective"
        chosen = []
        for module in (modules if modules else ["core_attn"]):
            if module not in _RECOMPUTE_MODULES:
                raise ValueError(f"{s.spelled('recompute_modules')}: {module!r} is refused: "
                                 "the modules modelled are "
                                 f"{', '.join(_RECOMPUTE_MODULES)}")
            chosen.append(_RECOMPUTE_MODULES[module])
        if chosen != ["core_attn"]:
            plan["recompute_modules"] = tuple(dict.fromkeys(chosen))
        return
    if method is None:
        raise ValueError(f"{s.spelled('recompute_granularity')}: 'full' needs "
                         f"{s.spelled('recompute_method')} uniform or block (Megatron-Core "
                         "TransformerConfig rejects full recompute without one)")
    plan["recompute"] = "full"
    if method == "block":
        plan["recompute_layers"] = layers or 0
        if not layers:
            notes.append(f"{s.spelled('recompute_method')} block with 0 layers: Megatron "
                         "recomputes none; priced as none")
            plan["recompute"] = "none"
            plan.pop("recompute_layers")
    elif layers and layers > 1:
        notes.append(f"{s.spelled('recompute_num_layers')} {layers} (uniform): Megatron "
                     f"keeps one input per {layers} layers; priced as one per layer")


def _precision(s: Settings, plan: dict[str, Any], notes: list[str]) -> None:
    """Matmul dtype, FP8 recipe and the dtype gradients are reduced in."""
    bf16 = _value(s, "bf16", bool, False)
    fp16 = _value(s, "fp16", bool, False)
    if bf16 and fp16:
        raise ValueError(f"{s.spelled('fp16')}: give it or {s.spelled('bf16')}, not both")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    fp8 = _value(s, "fp8", str, None)
    if fp8 is not None:
        if fp8 not in ("e4m3", "hybrid"):
            raise ValueError(f"{s.spelled('fp8')}: {fp8!r} is not valid; valid: e4m3, hybrid")
        recipe = _value(s, "fp8_recipe", str, "delayed")
        if recipe not in _FP8_RECIPES:
            raise ValueError(f"{s.spelled('fp8_recipe')}: {recipe!r} is refused: the FP8 "
                             f"recipes modelled are {', '.join(_FP8_RECIPES)}")
        plan.update(dtype="fp8", fp8_recipe=_FP8_RECIPES[recipe])
    else:
        plan["dtype"] = dtype
    if dtype == "fp32":
        notes.append("neither --bf16 nor --fp16: fp32 parameters and matmuls "
                     "(Megatron-LM's default)")
    # arguments.py validate_args: with --bf16 gradients accumulate and are reduced in fp32
    # unless --grad-reduce-in-bf16 (or a bf16 --main-grads-dtype); fp16 keeps them in fp16
    if dtype == "bf16":
        low = _value(s, "grad_reduce_in_bf16", bool, False) or \
            _value(s, "main_grads_dtype", str, "fp32", choices=("fp32", "bf16")) == "bf16"
        plan["grad_reduce_dtype"] = "bf16" if low else "fp32"
    elif dtype == "fp16":
        plan["grad_reduce_dtype"] = "bf16"  # 2-byte gradients: the plan's 16-bit choice
        notes.append("fp16 gradients reduced as 2-byte values (plan grad_reduce_dtype bf16)")
    else:
        plan["grad_reduce_dtype"] = "fp32"
    if _value(s, "accumulate_allreduce_grads_in_fp32", bool, False):
        plan["grad_reduce_dtype"] = "fp32"


def _data_parallel(s: Settings, plan: dict[str, Any], notes: list[str], *,
                   legacy: bool, dp: int | None) -> None:
    """Optimizer sharding, overlap of the gradient reduction and parameter gather, buckets,
    and the optimizer's precision."""
    zero = 0
    if _value(s, "use_distributed_optimizer", bool, False):
        zero = 1
    fsdp = _value(s, "use_megatron_fsdp", bool, False) or _value(s, "use_custom_fsdp", bool,
                                                                   False)
    if fsdp:
        strategy = _value(s, "data_parallel_sharding_strategy", str, "no_shard",
                          choices=tuple(_SHARDING))
        zero = _SHARDING[strategy]
    if _value(s, "use_torch_fsdp2", bool, False):
        zero = 3 if _value(s, "torch_fsdp2_reshard_after_forward", bool, True) else 2
    plan["zero"] = zero
    if not zero:
        notes.append(f"{s.spelled('use_distributed_optimizer')} off: optimizer state "
                     "replicated on every data-parallel rank (Megatron-LM's default; ZeRO 0)")
    overlap = bool(_value(s, "overlap_grad_reduce", bool, False))
    if legacy and s.has("DDP_impl"):
        impl = _value(s, "DDP_impl", str, "local", choices=("local", "torch"))
        overlap = impl == "torch"  # torch DDP reduces buckets during the backward
    gather = bool(_value(s, "overlap_param_gather", bool, False))
    if gather and not zero:
        raise ValueError(f"{s.spelled('overlap_param_gather')}: needs the distributed optimizer "
                         "or Megatron-FSDP (Megatron-LM rejects it otherwise)")
    plan.update(overlap_grad_reduce=overlap, overlap_param_gather=gather and zero in (1, 2))
    if not overlap:
        notes.append(f"{s.spelled('overlap_grad_reduce')} off: gradients reduced after the "
                     "backward pass (Megatron-LM's default)")
    optimizer = _value(s, "optimizer", str, "adam")
    if optimizer != "adam":
        raise ValueError(f"{s.spelled('optimizer')}: {optimizer!r} is refused: the optimizer "
                         "modelled is Adam")
    plan["optimizer_impl"] = "fused"
    if _value(s, "use_precision_aware_optimizer", bool, False):
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"):
            if _value(s, name, str, "fp32") != "fp32":
                raise ValueError(f"{s.spelled(name)}: {s.get(name)!r} is refused: the plan "
                                 "keeps optimizer state and master weights in fp32")
        # Megatron-Core OptimizerConfig.store_param_remainders defaults to True; it takes
        # effect with the precision-aware optimizer and bf16 parameters
        if plan.get("dtype") in ("bf16", "fp8") and _value(s, "bf16", bool, False) and \
                _value(s, "store_param_remainders", bool, True):
            plan["store_param_remainders"] = True
    if _value(s, "apex_store_param_remainders", bool, False):
        # NeMo 1's Apex DistributedFusedAdam with fp32 state and bf16 weights keeps the
        # remainders (nemo/.../megatron_base_model.py setup_optimization)
        plan["store_param_remainders"] = True
    bucket = _value(s, "ddp_bucket_size", int, None, minimum=1)
    grad_bytes = 4 if plan.get("grad_reduce_dtype") == "fp32" else 2
    if bucket is not None:
        plan["grad_bucket_bytes"] = bucket * grad_bytes
    elif overlap and not legacy and dp is not None:
        # Megatron-Core's default bucket: max(40M, 1M x dp x cp) parameters
        # (megatron/core/distributed/distributed_data_parallel.py), in reduction-dtype bytes
        plan["grad_bucket_bytes"] = max(40_000_000, 1_000_000 * dp * plan["cp"]) * grad_bytes
        notes.append(f"no {s.spelled('ddp_bucket_size')}: Megatron-Core's bucket of "
                     f"max(40M, 1M x dp x cp) parameters = {plan['grad_bucket_bytes']:,} bytes")


def _stack(s: Settings, plan: dict[str, Any], notes: list[str], *, legacy: bool) -> None:
    """Sequence parallelism, TP overlap, attention kernel, loss, elementwise kernels and
    activation offload."""
    sequence = bool(_value(s, "sequence_parallel", bool, False)) and plan["tp"] > 1
    plan["sequence_parallel"] = sequence
    if plan["tp"] > 1 and not sequence:
        notes.append(f"{s.spelled('sequence_parallel')} off with TP {plan['tp']}: no "
                     "sequence parallelism (Megatron-LM's default)")
    if _value(s, "tp_comm_overlap", bool, False):
        if not sequence:
            raise ValueError(f"{s.spelled('tp_comm_overlap')}: needs sequence parallelism "
                             "(Megatron-LM rejects it otherwise)")
        plan["tp_comm_overlap"] = "userbuffers"
    elif legacy:
        plan["tp_comm_overlap"] = "none"
    else:
        plan["tp_comm_overlap"] = "async"
    impl = _value(s, "transformer_impl", str, "transformer_engine",
                  choices=("transformer_engine", "local"))
    spec = s.get("spec") or []
    local = impl == "local" or list(spec)[:1] == ["local"] or legacy
    if spec and list(spec)[:1] != ["local"]:
        raise ValueError(f"{s.spelled('spec')}: {' '.join(map(str, spec))!r} is refused: "
                         "custom layer specs are not modelled")
    flash = _value(s, "use_flash_attn", bool, False)
    backend = str(_value(s, "attention_backend", str, "auto")).split(".")[-1]
    if local or _value(s, "use_legacy_models", bool, False):
        if flash:
            plan.update(flash_attention=True, attention_impl="fa2")
            notes.append(f"{s.spelled('use_flash_attn')}: the flash-attn package "
                         "(FlashAttention-2)")
        else:
            plan["flash_attention"] = False
            if _value(s, "masked_softmax_fusion", bool, True) is False:
                raise ValueError(f"{s.spelled('masked_softmax_fusion')}: False is refused: the "
                                 "unfused attention is priced with its fused softmax")
    elif backend == "auto":
        plan.update(flash_attention=True, attention_impl="auto")
        if flash:
            notes.append(f"{s.spelled('use_flash_attn')} with Transformer Engine layers: the "
                         "attention kernel is TE's choice for the GPU (attention backend auto)")
    elif backend == "flash":
        plan.update(flash_attention=True, attention_impl="fa2")
    elif backend == "fused":
        plan.update(flash_attention=True, attention_impl="cudnn")
    elif backend == "unfused":
        plan["flash_attention"] = False
    else:
        raise ValueError(f"{s.spelled('attention_backend')}: {backend!r} is not valid with "
                         "Transformer Engine layers; valid: auto, flash, fused, unfused")
    if _value(s, "cross_entropy_loss_fusion", bool, False):
        fusion = _value(s, "cross_entropy_fusion_impl", str, "native", choices=("native", "te"))
        plan["cross_entropy"] = "fused"
        if fusion == "native":
            notes.append(f"{s.spelled('cross_entropy_loss_fusion')} (native): Megatron's fused "
                         "vocab-parallel loss, priced as the fused loss")
    else:
        plan["cross_entropy"] = "megatron"
    plan["elementwise"] = "fused"
    offload = _value(s, "cpu_offloading_num_layers", int, 0, minimum=0)
    if offload:
        if _value(s, "cpu_offloading_weights", bool, False):
            raise ValueError(f"{s.spelled('cpu_offloading_weights')}: True is refused: weight "
                             "offload is not modelled")
        plan["activation_offload_layers"] = offload


def _moe(s: Settings, plan: dict[str, Any], model: ModelSpec, notes: list[str]) -> None:
    """Expert parallelism and the token dispatcher."""
    if model.moe is None:
        if plan["ep"] > 1:
            raise ValueError(f"{s.spelled('expert_model_parallel_size')}: {plan['ep']} needs "
                             f"{s.spelled('num_experts')}")
        return
    dispatcher = _value(s, "moe_token_dispatcher_type", str, "allgather",
                        choices=("allgather", "alltoall", "flex"))
    if dispatcher == "allgather" and plan["ep"] > 1:
        raise ValueError(f"{s.spelled('moe_token_dispatcher_type')}: 'allgather' is refused "
                         "with expert parallelism: the dispatch modelled is the all-to-all "
                         "(alltoall or flex)")
    if dispatcher == "flex":
        notes.append(f"{s.spelled('moe_token_dispatcher_type')} flex (DeepEP/HybridEP): "
                     "priced as an NCCL all-to-all")
    local_experts = model.moe.num_experts // plan["ep"] if model.moe.num_experts % plan["ep"] \
        == 0 else 0
    if local_experts > 1 and not _value(s, "moe_grouped_gemm", bool, False):
        notes.append(f"{s.spelled('moe_grouped_gemm')} off: Megatron loops over the "
                     f"{local_experts} local experts; priced as one grouped GEMM")
