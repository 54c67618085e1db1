"""What each Megatron-LM setting is to trainsim, by ``argparse`` destination.

* :data:`IGNORED` / :data:`IGNORED_PREFIXES`: no effect on step time or memory (logging,
  checkpoint paths and intervals, data, seeds, learning-rate schedules and optimizer
  hyper-parameters, fault tolerance, inference, other model families); listed in the
  result's inputs;
* :data:`REFUSED`: changes step time or memory in a way the plan has no field for; refused
  in one line, with the reason, when active;
* :data:`APPROXIMATED`: a second-order effect trainsim does not model; accepted and stated;
* :data:`LEGACY`: flags of the Megatron-LM of 2021, before Megatron-Core;
* :data:`KNOWN_TOKENIZERS`: vocabularies of tokenizers whose files trainsim does not read.

The mapping that reads the rest is :mod:`trainsim.importers.megatron_config`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["APPROXIMATED", "GPT2_VOCAB", "IGNORED", "IGNORED_PREFIXES", "INTERLEAVED_ONLY",
           "KNOWN_TOKENIZERS", "LEGACY", "REFUSED", "is_ignored"]

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
    "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_router_dtype",
    "moe_token_drop_policy",
    "moe_use_upcycling", "moe_upcycling_granularity", "moe_router_padding_for_fp8",
    "moe_router_padding_for_quantization", "moe_apply_probs_on_input",
    "moe_pad_experts_for_cuda_graph_inference", "moe_use_legacy_grouped_gemm",
    # MLA's rotary scaling (its sizes are mapped)
    "rotary_scaling_factor", "mscale", "mscale_all_dim", "cache_mla_latents",
    # settings of other flags that are refused or absent when these apply
    "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
    "disable_mamba_mem_eff_path", "hybrid_attention_ratio", "hybrid_mlp_ratio",
    "relative_attention_num_buckets", "relative_attention_max_distance", "mrope_section",
    "wgrad_deferral_limit", "optimizer_offload_fraction", "use_torch_optimizer_for_cpu_offload",
    "overlap_cpu_optimizer_d2h_h2d", "pin_cpu_grads", "no_pin_cpu_grads", "pin_cpu_params",
    "no_pin_cpu_params", "sharp_enabled_group", "keep_fp8_transpose_cache",
    "reuse_grad_buf_for_mxfp8_param_ag", "moe_deepep_num_sms", "moe_hybridep_num_sms",
    "ddp_average_in_collective", "gradient_reduce_div_fusion",
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
    "ddp_num_buckets": ((None,), "give --ddp-bucket-size instead (the plan sizes buckets in "
                        "bytes)"),
    "ddp_reduce_scatter_with_fp32_accumulation": ((False, None), "the all-to-all "
                                                  "reduce-scatter is not modelled"),
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
    "moe_extended_tp": ((False, None), "expert tensor parallelism other than TP is not "
                        "modelled"),
    "pipeline_model_parallel_comm_backend": (("nccl", None), "only NCCL is modelled"),
    "distributed_backend": (("nccl", None), "only NCCL is modelled"),
}

#: Settings of the interleaved schedule refused when not at Megatron's default:
#: (destination, default, why).
INTERLEAVED_ONLY = (
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

def is_ignored(name: str) -> bool:
    """Whether a setting (by destination) has no effect on step time or memory."""
    return name in IGNORED or name.startswith(IGNORED_PREFIXES)
