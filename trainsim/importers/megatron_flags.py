"""Megatron-LM's command-line flags whose value trainsim reads, with their kind and type.

Read from ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM (commit 000c4ac2,
2025), plus the flags of the Megatron-LM of 2021 that the published runs of that time
used (``--checkpoint-activations``, ``--DDP-impl``, ``--data-impl``, ...). A flag's
*destination* is the ``argparse`` ``dest`` Megatron stores it under; the mapping
(:mod:`trainsim.importers.megatron_config`) works on destinations, so a NeMo or
Megatron-Bridge YAML that names the same settings shares it.

Kinds: ``on`` (``store_true``), ``off`` (``store_false``: the flag stores False), ``one``
(one value), ``many`` (one or more values; ``nargs='+'``/``'*'``).

Flags not listed here are either without effect on step time or memory (the lists of
:mod:`trainsim.importers.setting_kinds`, matched by destination) or unknown, and
refused.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Flag", "FLAGS", "destination", "flag_of"]


@dataclass(frozen=True)
class Flag:
    """How Megatron-LM parses one flag.

    Attributes:
        dest: the ``argparse`` destination.
        kind: ``on``, ``off``, ``one`` or ``many`` (module docstring).
        type: ``int``, ``float`` or ``str`` for the values of ``one``/``many``.
    """

    dest: str
    kind: str
    type: type = str


def _flags(kind: str, type_: type, *names: str) -> dict[str, Flag]:
    """Flags whose destination is their name with dashes as underscores."""
    return {name: Flag(name[2:].replace("-", "_"), kind, type_) for name in names}


FLAGS: dict[str, Flag] = {
    # network size
    **_flags("one", int, "--num-layers", "--encoder-num-layers", "--decoder-num-layers",
             "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
             "--num-query-groups", "--make-vocab-size-divisible-by", "--mtp-num-layers"),
    **_flags("one", str, "--attention-backend", "--softmax-type", "--window-size",
             "--window-attn-skip-freq", "--position-embedding-type", "--normalization",
             "--moe-layer-freq", "--pipeline-model-parallel-layout",
             "--heterogeneous-layers-config-path",
             "--heterogeneous-layers-config-encoded-json", "--hybrid-override-pattern",
             "--yaml-cfg", "--fp8-quantizer-factory", "--fp4-quantizer-factory"),
    **_flags("on", str, "--group-query-attention", "--use-rotary-position-embeddings",
             "--squared-relu", "--swiglu", "--quick-geglu",
             "--untie-embeddings-and-output-weights", "--multi-latent-attention",
             "--qk-layernorm", "--qk-l2-norm", "--add-qkv-bias", "--is-hybrid-model"),
    "--no-position-embedding": Flag("add_position_embedding", "off"),
    "--disable-bias-linear": Flag("add_bias_linear", "off"),
    # regularization
    **_flags("one", float, "--attention-dropout", "--hidden-dropout"),
    # training
    **_flags("one", int, "--micro-batch-size", "--global-batch-size", "--batch-size",
             "--recompute-num-layers", "--cpu-offloading-num-layers",
             "--empty-unused-memory-level"),
    **_flags("one", str, "--recompute-granularity", "--recompute-method", "--optimizer",
             "--cross-entropy-fusion-impl", "--transformer-impl", "--cuda-graph-impl",
             "--cuda-graph-scope", "--pipeline-model-parallel-comm-backend"),
    **_flags("many", str, "--recompute-modules", "--rampup-batch-size", "--spec"),
    **_flags("on", str, "--recompute-activations", "--distribute-saved-activations",
             "--tp-comm-overlap", "--tp-comm-overlap-rs-dgrad", "--deterministic-mode",
             "--cross-entropy-loss-fusion", "--use-flash-attn", "--optimizer-cpu-offload",
             "--sequence-parallel", "--use-legacy-models", "--use-fused-weighted-squared-relu",
             "--enable-cuda-graph", "--external-cuda-graph", "--manual-gc"),
    "--disable-tp-comm-overlap-ag": Flag("tp_comm_overlap_ag", "off"),
    "--disable-tp-comm-overlap-rs": Flag("tp_comm_overlap_rs", "off"),
    "--disable-tp-comm-bulk-dgrad": Flag("tp_comm_bulk_dgrad", "off"),
    "--disable-tp-comm-bulk-wgrad": Flag("tp_comm_bulk_wgrad", "off"),
    "--disable-tp-comm-split-ag": Flag("tp_comm_split_ag", "off"),
    "--disable-tp-comm-split-rs": Flag("tp_comm_split_rs", "off"),
    "--no-masked-softmax-fusion": Flag("masked_softmax_fusion", "off"),
    "--no-bias-gelu-fusion": Flag("bias_gelu_fusion", "off"),
    "--no-bias-swiglu-fusion": Flag("bias_swiglu_fusion", "off"),
    "--no-bias-dropout-fusion": Flag("bias_dropout_fusion", "off"),
    "--no-rope-fusion": Flag("apply_rope_fusion", "off"),
    "--no-gradient-accumulation-fusion": Flag("gradient_accumulation_fusion", "off"),
    "--no-async-tensor-model-parallel-allreduce":
        Flag("async_tensor_model_parallel_allreduce", "off"),
    # mixed precision
    **_flags("on", str, "--fp16", "--bf16", "--grad-reduce-in-bf16",
             "--fp32-residual-connection", "--accumulate-allreduce-grads-in-fp32",
             "--fp16-lm-cross-entropy"),
    # distributed
    **_flags("one", int, "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
             "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
             "--model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
             "--num-virtual-stages-per-pipeline-rank",
             "--virtual-pipeline-model-parallel-size", "--ddp-num-buckets",
             "--ddp-bucket-size", "--num-distributed-optimizer-instances",
             "--context-parallel-size", "--expert-model-parallel-size",
             "--expert-tensor-parallel-size"),
    "--microbatch-group-size-per-virtual-pipeline-stage":
        Flag("microbatch_group_size_per_vp_stage", "one", int),
    **_flags("one", str, "--distributed-backend", "--data-parallel-sharding-strategy"),
    **_flags("many", str, "--cp-comm-type"),
    **_flags("many", int, "--hierarchical-context-parallel-sizes"),
    "--no-overlap-p2p-communication": Flag("overlap_p2p_comm", "off"),
    "--overlap-p2p-communication-warmup-flush": Flag("overlap_p2p_comm_warmup_flush", "on"),
    "--no-align-grad-reduce": Flag("align_grad_reduce", "off"),
    "--no-align-param-gather": Flag("align_param_gather", "off"),
    "--no-scatter-gather-tensors-in-pipeline":
        Flag("scatter_gather_tensors_in_pipeline", "off"),
    "--torch-fsdp2-no-reshard-after-forward":
        Flag("torch_fsdp2_reshard_after_forward", "off"),
    "--use-nccl-ub": Flag("nccl_ub", "on"),
    **_flags("on", str, "--overlap-grad-reduce", "--defer-embedding-wgrad-compute",
             "--ddp-reduce-scatter-with-fp32-accumulation", "--overlap-param-gather",
             "--overlap-param-gather-with-optimizer-step", "--use-ring-exchange-p2p",
             "--account-for-embedding-in-pipeline-split",
             "--account-for-loss-in-pipeline-split", "--use-distributed-optimizer",
             "--use-sharp", "--use-megatron-fsdp", "--use-custom-fsdp",
             "--enable-full-sharding-in-hsdp", "--use-torch-fsdp2", "--use-tp-pp-dp-mapping"),
    # tokenizer and data
    **_flags("one", int, "--vocab-size", "--padded-vocab-size", "--vocab-extra-ids",
             "--seq-length", "--encoder-seq-length", "--decoder-seq-length"),
    **_flags("one", str, "--tokenizer-type", "--tokenizer-model"),
    # mixture of experts
    **_flags("one", int, "--num-experts", "--moe-ffn-hidden-size",
             "--moe-shared-expert-intermediate-size", "--moe-router-topk"),
    **_flags("one", float, "--moe-expert-capacity-factor"),
    **_flags("one", str, "--moe-token-dispatcher-type"),
    **_flags("on", str, "--moe-shared-expert-overlap", "--moe-grouped-gemm",
             "--moe-layer-recompute", "--moe-extended-tp", "--moe-router-force-load-balancing",
             "--moe-permute-fusion", "--moe-router-fusion", "--moe-enable-deepep",
             "--moe-pad-expert-input-to-capacity", "--overlap-moe-expert-parallel-comm",
             "--delay-wgrad-compute"),
    # precision-aware optimizer
    **_flags("on", str, "--use-precision-aware-optimizer", "--store-param-remainders"),
    # spelled by Megatron-LM derivatives that expose OptimizerConfig.store_param_remainders
    "--no-store-param-remainders": Flag("store_param_remainders", "off"),
    **_flags("one", str, "--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
             "--exp-avg-sq-dtype"),
    # Transformer Engine
    "--fp8-format": Flag("fp8", "one"),
    "--fp4-format": Flag("fp4", "one"),
    "--fp4-param-gather": Flag("fp4_param", "on"),
    "--no-fp8-wgrad": Flag("fp8_wgrad", "off"),
    **_flags("one", str, "--fp8-recipe"),
    **_flags("on", str, "--fp8-param-gather", "--first-last-layers-bf16"),
    # Megatron-LM of 2021 (removed since; the published runs of that time used them)
    **_flags("on", str, "--checkpoint-activations", "--distribute-checkpointed-activations"),
    **_flags("one", int, "--checkpoint-num-layers", "--activations-checkpoint-num-layers"),
    **_flags("one", str, "--activations-checkpoint-method", "--data-impl"),
    "--DDP-impl": Flag("DDP_impl", "one"),
}


def destination(flag: str) -> str:
    """The destination of ``flag``: its table entry's, or the name with dashes as
    underscores (argparse's rule) for flags not in :data:`FLAGS`."""
    entry = FLAGS.get(flag)
    return entry.dest if entry is not None else flag.lstrip("-").replace("-", "_")


#: The first flag of each destination (``--disable-bias-linear`` for ``add_bias_linear``).
_FLAG_OF: dict[str, str] = {}
for _name, _flag in FLAGS.items():
    _FLAG_OF.setdefault(_flag.dest, _name)


def flag_of(dest: str) -> str:
    """Megatron-LM's flag for a destination (its name with dashes when not in the table)."""
    return _FLAG_OF.get(dest, "--" + dest.replace("_", "-"))
