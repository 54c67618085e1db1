"""Megatron-LM settings -> the model and the ParallelPlan fields trainsim simulates.

One mapping for every front end: Megatron-LM command lines
(:mod:`~trainsim.importers.megatron_args`) and NeMo / Megatron-Bridge YAML
(:mod:`~trainsim.importers.nemo_config`) are first turned into :class:`Settings` named by
Megatron-LM's ``argparse`` destinations; :func:`job_from_settings` reads them here.

Every setting is one of:

* **mapped** to a model or plan field (this module's functions, one per concern);
* **ignored**, **refused** or **approximated**: the lists of
  :mod:`~trainsim.importers.setting_kinds`.

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
allgather``; ``--expert-tensor-parallel-size`` TP; no distributed optimizer; no overlap of the gradient reduction or the
parameter gather; gradients reduced in fp32 with ``--bf16`` unless
``--grad-reduce-in-bf16``; ``--fp8-recipe delayed``; ``--transformer-impl
transformer_engine``; ``--attention-backend auto``; the fp32 vocab-parallel loss unless
``--cross-entropy-loss-fusion``; ``--optimizer adam``; DDP buckets of
``max(40M, 1M x dp x cp)`` parameters (``megatron/core/distributed/
distributed_data_parallel.py``).
"""

from __future__ import annotations

from typing import Any

from strategies.model_spec import ModelSpec
from trainsim.importers.job import ImportedJob, Settings
from trainsim.importers.patterns import pipeline_layout
from trainsim.importers.megatron_model import model_from_settings
from trainsim.importers.setting_kinds import (APPROXIMATED, INTERLEAVED_ONLY, LEGACY, REFUSED,
                                              is_ignored)

__all__ = ["job_from_settings"]

_RECOMPUTE_MODULES = {"core_attn": "core_attn", "layernorm": "layernorm", "mlp": "mlp",
                      "moe": "moe", "moe_act": "moe_act"}
_FP8_RECIPES = {"delayed": "te-delayed", "tensorwise": "te-current", "mxfp8": "te-mxfp8",
                "blockwise": "te-blockwise"}
_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


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
    tp = s.value("tensor_model_parallel_size", int, 1, minimum=1)
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
    _host_issue(s, plan, model, notes)
    # settings this job's configuration never reads (--moe-router-topk without experts,
    # a recompute method without recompute) have no effect on it, as in Megatron-LM
    unused = [s.spelled(name) for name in s.values if name not in s.read or is_ignored(name)]
    ignored = tuple(dict.fromkeys([*s.ignored, *unused]))
    return ImportedJob(source=s.source, model=model, plan=plan, gpus=gpus, ignored=ignored,
                       assumed=tuple(dict.fromkeys(notes)))


def _parallel(s: Settings, plan: dict[str, Any], model: ModelSpec, gpus: int | None,
              notes: list[str]) -> None:
    """Parallel sizes, virtual pipeline stages, their layers, batch and sequence."""
    pp = s.value("pipeline_model_parallel_size", int, 1, minimum=1)
    cp = s.value("context_parallel_size", int, 1, minimum=1)
    plan.update(pp=pp, cp=cp, ep=s.value("expert_model_parallel_size", int, 1, minimum=1))
    # Megatron-Core: experts split over --expert-tensor-parallel-size, TP when not given
    # (arguments.py: expert_tensor_parallel_size None -> tensor_model_parallel_size)
    expert_tp = s.value("expert_tensor_parallel_size", int, None, minimum=1)
    if expert_tp is not None and expert_tp != plan["tp"] and model.moe is not None:
        plan["expert_tp"] = expert_tp
    vpp, split = _virtual_stages(s, model.num_layers, pp)
    plan.update(vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b")
    if split is not None:
        plan["layers_per_stage"] = split
    if vpp > 1:  # Megatron turns these off without interleaving (validate_args)
        for name, inactive, why in INTERLEAVED_ONLY:
            if s.value(name, bool, inactive) != inactive:
                raise ValueError(f"{s.spelled(name)}: {s.get(name)!r} is refused: {why}")
    group = s.value("microbatch_group_size_per_vp_stage", int, None, minimum=1)
    if group is not None and group != pp:
        raise ValueError(f"{s.spelled('microbatch_group_size_per_vp_stage')}: {group} is "
                         f"refused: the interleaved schedule here groups pp ({pp}) "
                         "micro-batches per virtual stage")
    if cp > 1:
        kinds = s.get("cp_comm_type") or ["p2p"]
        kinds = [kinds] if isinstance(kinds, str) else kinds
        # one kind for every layer: Transformer Engine's p2p ring or its all-gather variant
        # (megatron/core/transformer/enums.py, TE AttnFuncWithCPAndKVAllGather)
        if len(set(map(str, kinds))) != 1 or str(kinds[0]) not in ("p2p", "allgather"):
            raise ValueError(f"{s.spelled('cp_comm_type')}: {' '.join(map(str, kinds))!r} is "
                             "refused: the context parallelism modelled is p2p or allgather "
                             "for every layer (a2a and a2a+p2p are not)")
        plan["cp_comm_type"] = "all_gather" if str(kinds[0]) == "allgather" else "p2p"
    if s.value("use_tp_pp_dp_mapping", bool, False):
        plan["order"] = ("tp", "cp", "pp", "dp")
    seq = s.get("seq_length") if s.get("seq_length") is not None else s.get(
        "encoder_seq_length")
    if seq is None:
        s.required("seq_length")
    plan["seq_len"] = s.value("seq_length" if s.get("seq_length") is not None
                             else "encoder_seq_length", int, minimum=1)
    micro = s.required("micro_batch_size")
    plan["micro_batch"] = micro
    if s.has("global_batch_size") and s.get("global_batch_size") is not None:
        plan["global_batch"] = s.value("global_batch_size", int, minimum=1)
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
    layout = s.value("pipeline_model_parallel_layout", str, None)
    if layout is not None:
        split = pipeline_layout(layout, flag=s.spelled("pipeline_model_parallel_layout"))
        if len(split) % pp or sum(split) != layers:
            raise ValueError(f"{s.spelled('pipeline_model_parallel_layout')}: {layout!r} is "
                             f"not valid; give a multiple of pp {pp} stages holding the "
                             f"{layers} layers")
        return len(split) // pp, split
    embedding = bool(s.value("account_for_embedding_in_pipeline_split", bool, False))
    loss = bool(s.value("account_for_loss_in_pipeline_split", bool, False))
    first = s.value("decoder_first_pipeline_num_layers", int, None, minimum=0)
    last = s.value("decoder_last_pipeline_num_layers", int, None, minimum=0)
    per_stage = s.value("num_layers_per_virtual_pipeline_stage", int, None, minimum=1)
    vpp = s.value("num_virtual_stages_per_pipeline_rank", int, None, minimum=1)
    if vpp is None:
        vpp = s.value("virtual_pipeline_model_parallel_size", int, None, minimum=1)
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
    granularity = s.value("recompute_granularity", str, None, choices=("full", "selective",
                                                                          None))
    method = s.value("recompute_method", str, None, choices=("uniform", "block", None))
    layers = s.value("recompute_num_layers", int, None, minimum=0)
    if s.value("recompute_activations", bool, False):
        granularity = "selective"  # arguments.py: --recompute-activations is selective
    if legacy and s.value("checkpoint_activations", bool, False):
        # 2021: every layer (chunks of --checkpoint-num-layers) recomputed from its input
        granularity = "full"
        method = s.value("activations_checkpoint_method", str, "uniform")
        layers = s.value("activations_checkpoint_num_layers", int,
                        s.value("checkpoint_num_layers", int, 1))
    modules = s.get("recompute_modules")
    if s.value("moe_layer_recompute", bool, False):
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
    bf16 = s.value("bf16", bool, False)
    fp16 = s.value("fp16", bool, False)
    if bf16 and fp16:
        raise ValueError(f"{s.spelled('fp16')}: give it or {s.spelled('bf16')}, not both")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    fp8 = s.value("fp8", str, None)
    if fp8 is not None:
        if fp8 not in ("e4m3", "hybrid"):
            raise ValueError(f"{s.spelled('fp8')}: {fp8!r} is not valid; valid: e4m3, hybrid")
        recipe = s.value("fp8_recipe", str, "delayed")
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
        low = s.value("grad_reduce_in_bf16", bool, False) or \
            s.value("main_grads_dtype", str, "fp32", choices=("fp32", "bf16")) == "bf16"
        plan["grad_reduce_dtype"] = "bf16" if low else "fp32"
    elif dtype == "fp16":
        plan["grad_reduce_dtype"] = "bf16"  # 2-byte gradients: the plan's 16-bit choice
        notes.append("fp16 gradients reduced as 2-byte values (plan grad_reduce_dtype bf16)")
    else:
        plan["grad_reduce_dtype"] = "fp32"
    if s.value("accumulate_allreduce_grads_in_fp32", bool, False):
        plan["grad_reduce_dtype"] = "fp32"


def _data_parallel(s: Settings, plan: dict[str, Any], notes: list[str], *,
                   legacy: bool, dp: int | None) -> None:
    """Optimizer sharding, overlap of the gradient reduction and parameter gather, buckets,
    and the optimizer's precision."""
    zero = 0
    if s.value("use_distributed_optimizer", bool, False):
        zero = 1
    fsdp = s.value("use_megatron_fsdp", bool, False) or s.value("use_custom_fsdp", bool,
                                                                   False)
    if fsdp:
        strategy = s.value("data_parallel_sharding_strategy", str, "no_shard",
                          choices=tuple(_SHARDING))
        zero = _SHARDING[strategy]
    if s.value("use_torch_fsdp2", bool, False):
        zero = 3 if s.value("torch_fsdp2_reshard_after_forward", bool, True) else 2
    plan["zero"] = zero
    instances = s.value("num_distributed_optimizer_instances", int, 1, minimum=1)
    if instances > 1:
        # Megatron-Core's partial distributed optimizer: each instance shards over
        # dp*cp/instances consecutive data-parallel ranks (intra_partial_data_parallel_group,
        # megatron/core/parallel_state.py), gradients reduce-scattered there and all-reduced
        # across the instances: the plan's hybrid sharding, dp_shard = dp / instances
        spelled = s.spelled("num_distributed_optimizer_instances")
        if not zero:
            raise ValueError(f"{spelled}: {instances} needs {s.spelled('use_distributed_optimizer')} "
                             "(Megatron-LM rejects it otherwise); give 1")
        if dp is None:
            raise ValueError(f"{spelled}: {instances} needs the data-parallel size; give --gpus")
        if dp % instances:
            raise ValueError(f"{spelled}: {instances} does not divide dp {dp}; valid: a divisor "
                             f"of {dp} (instances splitting context-parallel groups are not "
                             "modelled)")
        plan["dp_shard"] = dp // instances
        notes.append(f"{spelled} {instances}: ZeRO shards over dp/{instances} = "
                     f"{dp // instances} data-parallel ranks (x cp), all-reduced across the "
                     "instances (plan dp_shard)")
    if not zero:
        notes.append(f"{s.spelled('use_distributed_optimizer')} off: optimizer state "
                     "replicated on every data-parallel rank (Megatron-LM's default; ZeRO 0)")
    overlap = bool(s.value("overlap_grad_reduce", bool, False))
    if legacy and s.has("DDP_impl"):
        impl = s.value("DDP_impl", str, "local", choices=("local", "torch"))
        overlap = impl == "torch"  # torch DDP reduces buckets during the backward
    gather = bool(s.value("overlap_param_gather", bool, False))
    if gather and not zero:
        raise ValueError(f"{s.spelled('overlap_param_gather')}: needs the distributed optimizer "
                         "or Megatron-FSDP (Megatron-LM rejects it otherwise)")
    plan.update(overlap_grad_reduce=overlap, overlap_param_gather=gather and zero in (1, 2))
    if not overlap:
        notes.append(f"{s.spelled('overlap_grad_reduce')} off: gradients reduced after the "
                     "backward pass (Megatron-LM's default)")
    optimizer = s.value("optimizer", str, "adam")
    if optimizer != "adam":
        raise ValueError(f"{s.spelled('optimizer')}: {optimizer!r} is refused: the optimizer "
                         "modelled is Adam")
    plan["optimizer_impl"] = "fused"
    if s.value("use_precision_aware_optimizer", bool, False):
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"):
            if s.value(name, str, "fp32") != "fp32":
                raise ValueError(f"{s.spelled(name)}: {s.get(name)!r} is refused: the plan "
                                 "keeps optimizer state and master weights in fp32")
        # Megatron-Core OptimizerConfig.store_param_remainders defaults to True; it takes
        # effect with the precision-aware optimizer and bf16 parameters
        if plan.get("dtype") in ("bf16", "fp8") and s.value("bf16", bool, False) and \
                s.value("store_param_remainders", bool, True):
            plan["store_param_remainders"] = True
    if s.value("apex_store_param_remainders", bool, False):
        # NeMo 1's Apex DistributedFusedAdam with fp32 state and bf16 weights keeps the
        # remainders (nemo/.../megatron_base_model.py setup_optimization)
        plan["store_param_remainders"] = True
    bucket = s.value("ddp_bucket_size", int, None, minimum=1)
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
    sequence = bool(s.value("sequence_parallel", bool, False)) and plan["tp"] > 1
    plan["sequence_parallel"] = sequence
    if plan["tp"] > 1 and not sequence:
        notes.append(f"{s.spelled('sequence_parallel')} off with TP {plan['tp']}: no "
                     "sequence parallelism (Megatron-LM's default)")
    if s.value("tp_comm_overlap", bool, False):
        if not sequence:
            raise ValueError(f"{s.spelled('tp_comm_overlap')}: needs sequence parallelism "
                             "(Megatron-LM rejects it otherwise)")
        plan["tp_comm_overlap"] = "userbuffers"
    elif legacy:
        plan["tp_comm_overlap"] = "none"
    else:
        plan["tp_comm_overlap"] = "async"
    impl = s.value("transformer_impl", str, "transformer_engine",
                  choices=("transformer_engine", "local"))
    spec = s.get("spec") or []
    local = impl == "local" or list(spec)[:1] == ["local"] or legacy
    if spec and list(spec)[:1] != ["local"]:
        raise ValueError(f"{s.spelled('spec')}: {' '.join(map(str, spec))!r} is refused: "
                         "custom layer specs are not modelled")
    flash = s.value("use_flash_attn", bool, False)
    backend = str(s.value("attention_backend", str, "auto")).split(".")[-1]
    legacy_models = bool(s.value("use_legacy_models", bool, False))
    # Megatron's local layers (ColumnParallelLinear, megatron/core/tensor_parallel/
    # layers.py) carry no Transformer Engine module bookkeeping (ParallelPlan.layer_impl)
    plan["layer_impl"] = "torch" if local or legacy_models else "te"
    if local or legacy_models:
        if flash:
            plan.update(flash_attention=True, attention_impl="fa2")
            notes.append(f"{s.spelled('use_flash_attn')}: the flash-attn package "
                         "(FlashAttention-2)")
        else:
            plan["flash_attention"] = False
            if s.value("masked_softmax_fusion", bool, True) is False:
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
    if s.value("cross_entropy_loss_fusion", bool, False):
        fusion = s.value("cross_entropy_fusion_impl", str, "native", choices=("native", "te"))
        plan["cross_entropy"] = "fused"
        if fusion == "native":
            notes.append(f"{s.spelled('cross_entropy_loss_fusion')} (native): Megatron's fused "
                         "vocab-parallel loss, priced as the fused loss")
    else:
        plan["cross_entropy"] = "megatron"
    plan["elementwise"] = "fused"
    offload = s.value("cpu_offloading_num_layers", int, 0, minimum=0)
    if offload:
        if s.value("cpu_offloading_weights", bool, False):
            raise ValueError(f"{s.spelled('cpu_offloading_weights')}: True is refused: weight "
                             "offload is not modelled")
        plan["activation_offload_layers"] = offload


#: ``--cuda-graph-scope`` values that capture whole transformer layers (Megatron-Core
#: ``CudaGraphScope``: ``full`` the default layer graph, ``full_iteration`` the whole
#: forward-backward), and the partial scopes trainsim's ``partial`` host issue prices
#: (attention, router and EP preprocess captured; the rest issued eagerly).
_WHOLE_LAYER_SCOPES = frozenset({"full", "full_iteration"})
_PARTIAL_SCOPES = frozenset({"attn", "moe_router", "moe_preprocess"})
_CUDA_GRAPH_SCOPES = frozenset({*_WHOLE_LAYER_SCOPES, *_PARTIAL_SCOPES, "mlp", "moe", "mamba"})


def _host_issue(s: Settings, plan: dict[str, Any], model: ModelSpec,
                notes: list[str]) -> None:
    """How the job's CPU issues kernels (``ParallelPlan.host_issue``): Megatron-LM runs
    PyTorch eager unless CUDA graphs are on (``--enable-cuda-graph``, the local
    implementation; ``--external-cuda-graph``, Transformer Engine's
    ``make_graphed_callables``; or ``--cuda-graph-impl local|transformer_engine``), whose
    ``--cuda-graph-scope`` says what is captured: whole layers (default ``full``, or
    ``full_iteration``) are ``graphed``, except a dropless MoE layer, whose routed experts
    have data-dependent shapes and stay eager (``partial``); ``attn`` with the router
    scopes is ``partial``; a scope without attention is priced ``eager`` (the plan's
    ``partial`` captures attention)."""
    impl = s.value("cuda_graph_impl", str, "none",
                   choices=("none", "local", "transformer_engine"))
    graphs = (impl != "none" or bool(s.value("enable_cuda_graph", bool, False))
              or bool(s.value("external_cuda_graph", bool, False)))
    if not graphs:
        plan["host_issue"] = "eager"
        return
    raw = s.get("cuda_graph_scope") if s.has("cuda_graph_scope") else None
    words = ([] if raw in (None, "", "none") else
             [str(w) for w in (raw if isinstance(raw, (list, tuple)) else
                               str(raw).replace(",", " ").split())])
    unknown = sorted(set(words) - _CUDA_GRAPH_SCOPES)
    if unknown:
        raise ValueError(f"{s.spelled('cuda_graph_scope')}: {' '.join(unknown)!r} is not "
                         f"valid; valid: {', '.join(sorted(_CUDA_GRAPH_SCOPES))}")
    scope = set(words) or {"full"}
    dropless = model.moe is not None and not plan.get("moe_pad_to_capacity", False)
    if scope & _WHOLE_LAYER_SCOPES:
        plan["host_issue"] = "partial" if dropless else "graphed"
        if dropless:
            notes.append(f"{s.spelled('cuda_graph_scope')} {' '.join(sorted(scope))}: a "
                         "dropless MoE layer's routed experts cannot be captured (token counts "
                         "per expert change every step): attention and router replayed, the "
                         "routed experts issued eagerly")
    elif "attn" in scope:
        plan["host_issue"] = "partial"
        if scope - _PARTIAL_SCOPES:
            notes.append(f"{s.spelled('cuda_graph_scope')} {' '.join(sorted(scope))}: priced "
                         "as attention, router and EP preprocess captured, the rest eager")
    else:
        plan["host_issue"] = "eager"
        notes.append(f"{s.spelled('cuda_graph_scope')} {' '.join(sorted(scope))}: without "
                     "attention, priced as eager issue")


def _moe(s: Settings, plan: dict[str, Any], model: ModelSpec, notes: list[str]) -> None:
    """Expert parallelism, the token dispatcher, the forward/backward all-to-all overlap,
    the routing load and the expert capacity."""
    if model.moe is None:
        if plan["ep"] > 1:
            raise ValueError(f"{s.spelled('expert_model_parallel_size')}: {plan['ep']} needs "
                             f"{s.spelled('num_experts')}")
        return
    dispatcher = s.value("moe_token_dispatcher_type", str, "allgather",
                        choices=("allgather", "alltoall", "flex"))
    if s.value("moe_enable_deepep", bool, False):  # the flag before --moe-flex-dispatcher-
        dispatcher = "flex"                        # backend: flex on DeepEP
    if dispatcher == "flex":
        # MoEFlexTokenDispatcher on DeepEP, or on HybridEP (NVIDIA's DeepEP for NVL72
        # domains): both send a token once per destination domain and forward it inside
        backend = s.value("moe_flex_dispatcher_backend", str, "deepep",
                          choices=("deepep", "hybridep"))
        plan["moe_dispatcher"] = "deepep"
        if backend == "hybridep":
            notes.append(f"{s.spelled('moe_flex_dispatcher_backend')} hybridep: priced as "
                         "DeepEP's per-domain deduplicated dispatch")
    else:
        plan["moe_dispatcher"] = dispatcher
    if s.value("overlap_moe_expert_parallel_comm", bool, False):
        plan["moe_a2a_overlap"] = True
    if s.value("moe_router_force_load_balancing", bool, False):
        plan["moe_expert_load"] = "uniform"
    else:
        notes.append("routing priced at a uniform expert load (the router's learned "
                     "imbalance is not in the job's settings; give moe_expert_load)")
    factor = s.value("moe_expert_capacity_factor", float, None)
    pad = s.value("moe_pad_expert_input_to_capacity", bool, False)
    if factor is not None:
        plan["moe_capacity_factor"] = repr(factor)
        plan["moe_pad_to_capacity"] = pad
    elif pad:  # Megatron-Core's TransformerConfig refuses it too
        raise ValueError(f"{s.spelled('moe_pad_expert_input_to_capacity')}: True is refused "
                         f"without {s.spelled('moe_expert_capacity_factor')}: padding needs a "
                         "capacity")
    local_experts = model.moe.num_experts // plan["ep"] if model.moe.num_experts % plan["ep"] \
        == 0 else 0
    if local_experts > 1 and not s.value("moe_grouped_gemm", bool, False):
        notes.append(f"{s.spelled('moe_grouped_gemm')} off: Megatron loops over the "
                     f"{local_experts} local experts; priced as one grouped GEMM")
