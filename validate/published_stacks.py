"""How each framework ran a published row: the plan fields the row does not print.

A published row prints its parallel layout, batch, dtype and sometimes its recompute;
the rest (optimizer sharding, overlap, the attention kernel, how FP8 is quantized, fused
or eager elementwise kernels, the loss, memory savers) is what its framework does by
default or what its published recipe sets. :func:`framework_defaults` states the defaults
per framework, each with its source; :func:`stack_settings` adds what depends on the row
itself (its notes, version and NeMo recipe) and says which settings the row does not
print (``unprinted``: the row is compared with them, and the tables say so).

Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["AUTOMODEL_ACTIVATION_CHECKPOINTING", "AUTOMODEL_EXPERT_PARALLEL",
           "DGXC_FP8_PARAMS", "DGXC_LAUNCHER_RECIPES", "DGXC_NEMO1_DISTRIBUTED_ADAM",
           "UB_FP8_REDUCE_SCATTER",
           "dgxc_recipe_of", "hsdp_shard",
           "nemo1_distributed_adam",
           "JAX_FSDP_SHARD_GPUS", "JAX_LOOP_DOUBLE_BUFFERING", "JAX_REMAT_RECIPES",
           "MEGATRON_BRIDGE_BF16_GRAD_REDUCE", "MEGATRON_BRIDGE_PRESET_MICRO_BATCH",
           "NEMO1_LAUNCHER_DISTRIBUTED_ADAM",
           "MEGATRON_BRIDGE_OFFLOAD", "MEGATRON_BRIDGE_RECOMPUTE_MODULES", "StackSettings",
           "COMPOSER_FP32_REDUCE_SECTIONS", "composer_reduce_dtype",
           "framework_defaults", "framework_kind", "host_issue_of", "layer_impl_of",
           "recompute_modules_of",
           "stack_settings", "torchtitan_pipeline"]

#: Framework families by what their name contains (first match wins).
_KINDS = (("megatron-lm-2021", ()), ("meta-llama3", ("meta internal",)),
          ("llm-foundry", ("foundry",)),
          ("torchtitan", ("torchtitan",)), ("pytorch-fsdp", ("automodel", "fsdp")),
          ("jax", ("maxtext", "paxml", "jax")))

#: Megatron-Bridge performance recipes (``scripts/performance/configs/llama/
#: llama3_workload_base_configs.py`` @00919dcf1fe13c0acf65e131f244378f0a6cd2b5): Llama 3 70B
#: pre-training with Megatron-FSDP offloads the activations of ``cpu_offloading_num_layers``
#: layers to host memory. ``{(model, gpu, dtype): layers}``.
MEGATRON_BRIDGE_OFFLOAD = {
    ("llama3-70b", "GB200", "fp8"): 40,   # LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1 (mbs 2)
    ("llama3-70b", "GB200", "bf16"): 20,  # LLAMA3_70B_PRETRAIN_CONFIG_GB200_BF16_V1
    ("llama3-70b", "B200", "fp8"): 5,     # LLAMA3_70B_PRETRAIN_CONFIG_B200_FP8_CS_V1
}

#: Model families whose Megatron-Bridge performance configs reduce (and accumulate)
#: gradients in bf16 for every precision: ``set_qwen3_common_configs``
#: (``scripts/performance/configs/qwen/qwen3_llm_pretrain.py``, and the 25.09-era
#: ``configs/qwen3/qwen3_llm_pretrain.py`` with its token-drop helper) and
#: ``set_gpt_oss_common_configs`` (``configs/gpt_oss/gpt_oss_llm_pretrain.py``
#: @0501207b95dbbd00a8e0686ca0cc4f053a1fd87e) both set ``mixed_precision.grad_reduce_in_fp32
#: = False`` and ``ddp.grad_reduce_in_fp32 = False``. Qwen3-Next has its own common
#: settings (``set_qwen3_next_common_configs``) and is not included.
MEGATRON_BRIDGE_BF16_GRAD_REDUCE = ("qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b",
                                    "gpt-oss-120b")

#: NVIDIA/dgxc-benchmarking recipes run on the NeMo 1 launcher whose configuration sets
#: plan fields the rows' tables do not print, ``{recipe directory: (fields, source)}``; a
#: row names its recipe in its citation (``GitHub NVIDIA/dgxc-benchmarking <dir>/...``).
#: Grok-1 314B (``grok1/configure.sh`` @143b90dd91f9be958fed4773ae95d941a3356a82, the
#: README_314b.md revision the rows are transcribed from, launches
#: ``megatron_gpt_pretraining.py --config-name=grok1_314b.yaml``; ``grok1/grok1_314b.yaml``
#: @35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae, the file's only stored revision):
#:
#: * ``model.moe_expert_capacity_factor: 1.0`` and ``moe_pad_expert_input_to_capacity:
#:   true`` with ``moe_token_dispatcher_type: alltoall``: every expert gets exactly its
#:   capacity (Megatron-Core's ``drop_and_pad``: static all-to-all splits, no host sync,
#:   megatron/core/transformer/moe/token_dispatcher.py);
#: * ``model.ub_tp_comm_overlap=true`` (configure.sh override; the YAML's false is
#:   replaced): Transformer Engine userbuffers pipeline each TP collective with its GEMM;
#: * ``NVTE_FUSED_ATTN=0`` with ``use_flash_attention: true``: Transformer Engine's
#:   ``DotProductAttention`` cannot pick cuDNN's fused attention and runs its
#:   FlashAttention backend (the flash-attn 2.x package;
#:   transformer_engine/pytorch/attention.py ``get_attention_backend``).
#:
#: Left as the stack's defaults because the source shows them or they change nothing here:
#: ``moe_grouped_gemm: false`` (Megatron-Core ``SequentialMLP``, one TE linear per local
#: expert: at EP 8 every rank holds one of Grok's 8 experts, a single GEMM either way),
#: ``moe_aux_loss_coeff: 0.01`` (the default aux-loss router), no activation recompute,
#: ``fp8_hybrid`` delayed scaling (amax history 1024, ``max``), ``NCCL_NVLS_ENABLE=0``
#: (the TP collectives run in userbuffers, not NCCL).
#:
#: Nemotron-4 340B, the rows of ``nemotron/README_340b.md`` (``nemotron/configure.sh`` @35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae, the
#: file's only stored revision, which README_340b.md @143b90dd's launch.sh sources: for
#: 340b ``NVTE_FUSED_ATTN=0``, TP 8, PP 8, VP 12, MBS 1, ``model.ub_tp_comm_overlap=True``,
#: ``+model.fp8_params=${FP8_ENABLED}``, ``--config-name=nemotron4-340b-synth``;
#: ``nemotron/nemotron4-340b-synth.yaml`` @8f5cbb3799ea8cc031ed2c2cee1cbdbc15b240ad, its only
#: stored revision): ``activations_checkpoint_granularity: selective`` (Megatron-Core's
#: selective recompute: the attention core), ``optim.name: distributed_fused_adam`` with
#: ``dtype: bf16`` and ``grad_sync_dtype: bf16`` (:data:`DGXC_NEMO1_DISTRIBUTED_ADAM`),
#: FlashAttention 2 (``NVTE_FUSED_ATTN=0``, as Grok-1), userbuffers TP overlap.
#:
#: Llama 3.1 405B, the rows of ``llama3.1/README_405b.md`` (``llama3.1/configure.sh``
#: @143b90dd91f9be958fed4773ae95d941a3356a82 launches ``megatron_gpt_pretraining.py
#: --config-name=llama3.1_405b.yaml`` with, for 405b, ``model.ub_tp_comm_overlap_cfg.
#: proj_fprop.fp8_buf`` / ``fc2_fprop.fp8_buf`` set to the run's FP8 flag -- settings of
#: Transformer Engine's userbuffers, read only with ``ub_tp_comm_overlap`` on -- and
#: ``+model.fp8_params=${FP8_ENABLED}``; the recipe's YAML is not stored, the NeMo
#: launcher's ``conf/training/llama/llama3_1_405b.yaml`` it follows sets
#: ``ub_tp_comm_overlap: true``, TP 8, PP 9, VP 7, CP 2 as printed, no recompute):
#: userbuffers TP overlap; cuDNN attention (``NVTE_FUSED_ATTN=1``, the default). The FP8
#: runs' reduce-scatter buffers: :data:`UB_FP8_REDUCE_SCATTER`.
DGXC_LAUNCHER_RECIPES: dict[str, tuple[dict[str, object], str]] = {
    "grok1": ({"moe_dispatcher": "alltoall", "moe_capacity_factor": "1.0",
               "moe_pad_to_capacity": True, "tp_comm_overlap": "userbuffers",
               "attention_impl": "fa2"},
              "dgxc-benchmarking grok1 recipe (configure.sh @143b90dd, grok1_314b.yaml): "
              "capacity factor 1.0 padded, alltoall dispatcher, userbuffers TP overlap, "
              "FlashAttention 2 (NVTE_FUSED_ATTN=0)"),
    "nemotron/README_340b": ({"recompute": "selective", "recompute_layers": 0, "attention_impl": "fa2",
                  "tp_comm_overlap": "userbuffers"},
                 "dgxc-benchmarking nemotron recipe (configure.sh @35a9aecc, "
                 "nemotron4-340b-synth.yaml): selective (attention-core) recompute, "
                 "userbuffers TP overlap, FlashAttention 2 (NVTE_FUSED_ATTN=0)"),
    "llama3.1/README_405b": ({"tp_comm_overlap": "userbuffers"},
                             "dgxc-benchmarking llama3.1 405b recipe (configure.sh @143b90dd "
                             "overrides model.ub_tp_comm_overlap_cfg.{proj,fc2}_fprop.fp8_buf; "
                             "the NeMo launcher's llama3_1_405b.yaml: ub_tp_comm_overlap true): "
                             "userbuffers TP overlap"),
}

#: FP8 runs whose Transformer Engine userbuffers config sets ``fp8_buf`` on the pipelined
#: forward reduce-scatters (``ParallelPlan.tp_comm_fp8_reduce_scatter``), keyed by the
#: dgxc-benchmarking recipe directory (:func:`dgxc_recipe_of`) or, for the NeMo launcher
#: (NeMo 1) rows of NeMo's performance summary, by ``(model, framework_version)``; the
#: value is the buffers and where the config says so. Only rows whose config is dated by
#: the row's own source are listed; every other TE FP8 userbuffers row keeps bf16 buffers
#: (TE's default, ``initialize_ub`` ``fp8_buf`` only for the all-gathers), for these reasons:
#:
#: * dgxc Llama 3.1 70B (24.09): ``llama3.1/configure.sh`` @143b90dd sets ``fp8_buf`` only
#:   for 405b; the recipe's ``llama3.1_70b.yaml`` is not stored, and the NeMo launcher's
#:   ``conf/training/llama/llama3_1_70b.yaml`` (stored @1ab2c781) selects
#:   ``tp_overlap/ub_cfg_h100_h8192_tp4_mbs1_seqlen8192.yaml`` (@a3f31000: no ``fp8_buf``).
#: * GPT-3 175B (dgxc nemo_megatron README @0b71cfda, NeMo 24.07 summary): the launcher's
#:   ``gpt3/175b.yaml`` (stored @056a90ed) turns ``ub_tp_comm_overlap`` on with no
#:   ``ub_tp_comm_overlap_cfg`` (TE's defaults) and ``examples/training/gpt/h100/
#:   175b_fp8_16node.sh`` (@1ee3eb3e) names none; ``ub_cfg_h100_h12288_tp4_mbs2_seqlen2048
#:   .yaml`` (``fp8_buf`` on proj_fprop, fc2_fprop a ring exchange) is selected by no stored
#:   file, so it cannot be dated to these rows.
#: * Nemotron 8B/15B/22B/340B and Grok-1 (dgxc, NeMo 24.07): their configure.sh and the
#:   launcher's ``examples/training/nemotron/h100/nemotron_22b_fp8.sh`` (@79f92438) set no
#:   userbuffers config with ``fp8_buf``.
#: * Megatron-Bridge (25.09-26.02.01: Llama 3 70B H100, Llama 3.1 405B H100/B200/GB200):
#:   the performance scripts map FP8 runs to ``userbuffers_fp8_h100_h8192_tp4_mbs1_
#:   seqlen8192``, ``userbuffers_fp8_{h100_h16384_tp8,b200_h16384_tp4}_cp2_mbs1_seqlen8192``
#:   (``scripts/performance``), whose proj_fprop/fc2_fprop are ``RingExchangeOverlapCfg(
#:   num_sm=1, set_sm_margin=True)`` without ``fp8_buf`` in every stored revision of
#:   ``src/megatron/bridge/training/comm_overlap.py`` read (e.g. @0685ff5d): a bf16 ring-
#:   exchange reduce-scatter (TE ``CommOverlapP2P``), which trainsim prices as the pipelined
#:   one (strategies.lowering ``_reduced_matmul``).
#: * NeMo 2 long-sequence Llama 3 8B (B200, 25.04): NeMo's ``tp_overlap_configs/
#:   userbuffers.py`` holds no hidden-4096 config, so TE's defaults.
UB_FP8_REDUCE_SCATTER: dict[object, tuple[tuple[str, ...], str]] = {
    # configure.sh @143b90dd (the revision the rows are transcribed from):
    # model.ub_tp_comm_overlap_cfg.{proj,fc2}_fprop.fp8_buf=$FP8_ENABLED, as the NeMo
    # launcher's tp_overlap/ub_cfg_h100_fp8_h16384_tp8_cp2_mbs1_seqlen8192.yaml (@0937882d)
    "llama3.1/README_405b": (("proj_fprop", "fc2_fprop"),
                             "dgxc-benchmarking llama3.1/configure.sh @143b90dd "
                             "{proj,fc2}_fprop.fp8_buf=$FP8_ENABLED"),
    # NeMo-Framework-Launcher examples/training/llama/h100/llama3_70b_fp8.sh (@4a9b61bc),
    # the launcher's script for this very benchmark (8 nodes, GBS 128, FP8, the NeMo 24.07
    # table's Llama 3 70B row), selects tp_overlap/ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192
    # .yaml (@1015f23b: proj_fprop and fc2_fprop pipeline, fp8_buf: 1)
    ("llama3-70b", "NeMo 24.07 container"): (
        ("proj_fprop", "fc2_fprop"),
        "NeMo launcher examples/training/llama/h100/llama3_70b_fp8.sh @4a9b61bc: "
        "ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192 (fp8_buf on proj_fprop, fc2_fprop)"),
}

#: dgxc-benchmarking recipes whose FP8 runs hold FP8 primary weights (configure.sh
#: ``+model.fp8_params=${FP8_ENABLED}``); Nemotron-4 340B's through
#: :data:`DGXC_NEMO1_DISTRIBUTED_ADAM`, whose parameter copy depends on it.
DGXC_FP8_PARAMS = frozenset({"llama3.1/README_405b", "nemotron/README_340b"})

#: dgxc-benchmarking NeMo 1 recipes that run Apex's ``distributed_fused_adam``, with their
#: ``optim.dtype`` (the optimizer state's dtype), ``{recipe directory: dtype}``; their FP8
#: runs set ``model.fp8_params`` (configure.sh ``+model.fp8_params=${FP8_ENABLED}``). The
#: stored state follows :func:`nemo1_distributed_adam`.
DGXC_NEMO1_DISTRIBUTED_ADAM = {"nemotron/README_340b": "bf16"}


#: NeMo 1 launcher configs of NeMo performance-summary rows (no dgxc recipe) that run Apex's
#: ``distributed_fused_adam``, ``{(model, framework_version): optim.dtype}``; no FP8 primary
#: weights (the configs set no ``fp8_params``, NeMo 1's default False). Nemotron-4 340B in
#: the NeMo 24.07 summary: NeMo-Framework-Launcher ``launcher_scripts/conf/training/
#: nemotron/nemotron_340b.yaml`` ran ``optim.name: distributed_fused_adam`` with ``dtype:
#: bf16``, ``grad_sync_dtype: bf16`` (stored revision @6daee02ad897b6f8fb468a518edcdb9bda9c36c7:
#: the launcher's production config, PP 12, VP 8, ``fp8: False``, not the summary row's
#: TP 8 PP 8 VP 12 FP8 layout; its optimizer section is what the release ran) until the
#: launcher's PR #448 "switch to mcore's optimizer" (later revisions, e.g. @3be81fc1, run
#: ``mcore_distributed_optim``). That PR is numbered after PR #400 of 2024-08-02, so it most
#: likely landed after the 24.07 container (dated by PR numbering only, no merge date
#: stored); the dgxc-benchmarking recipe of the same
#: layout for the later 24.09 container (:data:`DGXC_NEMO1_DISTRIBUTED_ADAM`) still runs
#: ``distributed_fused_adam`` with bf16 state, at the same step time (3.16 s vs 3.18 s).
NEMO1_LAUNCHER_DISTRIBUTED_ADAM = {("nemotron4-340b", "NeMo 24.07 container"): "bf16"}


def nemo1_distributed_adam(optim_dtype: str, fp8_params: bool) -> dict[str, object]:
    """Plan fields for NeMo 1's Apex ``distributed_fused_adam`` over bf16 parameters
    (``megatron_amp_O2``) with optimizer-state dtype ``optim_dtype`` (``fp32``/``bf16``).

    ``MegatronBaseModel.setup_optimization`` (nemo/collections/nlp/models/language_modeling/
    megatron_base_model.py, NeMo 1 with FP8-parameter support) passes ``optim.dtype`` to
    ``DistributedFusedAdam(dtype=...)`` (Adam's moments in that dtype) and decides
    ``store_params``: with ``fp8_params`` a parameter copy in the state dtype; else, state
    dtype equal to the model's bf16: none (the model's bf16 weights are updated in place);
    fp32 state over bf16 weights: the 16-bit remainders of fp32 master weights.

    Raises:
        ValueError: ``optim_dtype`` not fp32 or bf16."""
    if optim_dtype not in ("fp32", "bf16"):
        raise ValueError(f"optim_dtype: {optim_dtype!r} is not valid; valid: fp32, bf16")
    fields: dict[str, object] = {"optimizer_moments_dtype": optim_dtype,
                                 "fp8_params": fp8_params}
    if fp8_params:
        fields["master_weights_dtype"] = optim_dtype
    elif optim_dtype == "bf16":
        fields["master_weights_dtype"] = "none"
    else:
        fields.update(master_weights_dtype="fp32", store_param_remainders=True)
    return fields

#: A row's citation naming its dgxc-benchmarking recipe directory.
_DGXC_RECIPE = re.compile(r"NVIDIA/dgxc-benchmarking ([\w.-]+)/([\w.-]+?)\.md")


def dgxc_recipe_of(citation: str) -> str | None:
    """The dgxc-benchmarking recipe a row's ``citation`` names when
    :data:`DGXC_LAUNCHER_RECIPES` configures it, else None: ``<dir>/<README stem>`` (one
    model size of a directory, e.g. ``nemotron/README_340b``) before ``<dir>``."""
    match = _DGXC_RECIPE.search(citation)
    if not match:
        return None
    for key in (f"{match.group(1)}/{match.group(2)}", match.group(1)):
        if key in DGXC_LAUNCHER_RECIPES:
            return key
    return None


#: Selective recompute modules of Megatron-Bridge's performance presets, ``{(model, gpu,
#: dtype): modules}``: ``scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py``
#: @07eea52d4523a69fc8975cef34938d61ae13f9e2 (and its older ``workload_base_configs.py``)
#: set ``recompute_modules=["layernorm", "moe_act"]`` in GPT_OSS_120B_PRETRAIN_CONFIG_
#: {GB200,B200,H100}_BF16_V1 (the B200 and H100 FP8 presets alias them; the V2 presets
#: inherit them, GB200's FP8-MX V2 clears them); the GB300/B300 presets set none.
MEGATRON_BRIDGE_RECOMPUTE_MODULES = {
    ("gpt-oss-120b", "GB200", "bf16"): ("layernorm", "moe_act"),
    ("gpt-oss-120b", "B200", "bf16"): ("layernorm", "moe_act"),
    ("gpt-oss-120b", "H100-SXM", "bf16"): ("layernorm", "moe_act"),
}

#: Micro-batches of Megatron-Bridge performance presets, ``{(model, gpu, dtype):
#: micro_batch}``, applied only to rows whose printed GA contradicts their printed MBS
#: (notes: "GA printed ... INCONSISTENT-AS-PRINTED"), where the printed MBS is in doubt.
#: gpt-oss-120b on H100: ``GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V1`` (and its GBS-512
#: predecessor ``GPT_OSS_120B_H100_BF16_BASE_CONFIG``, stored revision id 26286882719) of
#: ``scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py``
#: @07eea52d4523a69fc8975cef34938d61ae13f9e2 replace only ``pipeline_model_parallel_size=4``
#: and the recompute modules in ``BASE_GPT_OSS_120B_CONFIG`` (EP 8, GBS 512,
#: ``micro_batch_size=1``); the B200/GB200 presets set ``micro_batch_size=4``. The 25.11
#: table prints the H100 row with the B200 row's MBS 4 and GA 2 (GA 2 is GBS/(MBS*DP) at
#: DP 64, the B200 row's; at the H100 row's DP 16 it would be 8), and the 26.02 table prints
#: the same H100 layout with MBS 1.
MEGATRON_BRIDGE_PRESET_MICRO_BATCH = {("gpt-oss-120b", "H100-SXM", "bf16"): 1}

#: The printed-GA contradiction flag of a row's notes (validate/data/published/SOURCES.md).
_GA_INCONSISTENT = re.compile(r"GA printed \d+ \(INCONSISTENT-AS-PRINTED")

#: NeMo AutoModel's benchmark configs (``examples/benchmark/configs/*.yaml`` of
#: NVIDIA-NeMo/Automodel, the YAMLs its performance-summary rows name): ``parallelizer:
#: activation_checkpointing`` per model. ``true`` wraps every decoder block in
#: ``checkpoint_wrapper`` (``nemo_automodel/components/moe/parallelizer.py`` ``apply_ac``,
#: ``ignore_router`` False): full recompute of every layer. deepseek_v3_te_deepep.yaml,
#: kimi_k2_te_deepep.yaml, qwen3_moe_30b_te_deepep.yaml: true;
#: gptoss_20b_te_deepep.yaml, gptoss_120b_te_deepep.yaml: false.
AUTOMODEL_ACTIVATION_CHECKPOINTING = {
    "deepseek-v3": True, "kimi-k2": True, "qwen3-30b-a3b": True,
    "gpt-oss-20b": False, "gpt-oss-120b": False,
}

#: Expert parallelism of NeMo AutoModel's gpt-oss benchmark configs, whose published rows
#: print EP '-' (docs/performance-summary.md@ce005dd86d7818840a5605d7e668a5202800d306 names
#: these YAMLs as the rows' configurations): ``distributed: ep_size`` is 8 in
#: gptoss_20b_te_deepep.yaml (8 GPUs) and 64 in gptoss_120b_te_deepep.yaml (64 GPUs)
#: (examples/benchmark/configs/ @037e04a6a256dff70ef1ac7ea4c73819b8aab6de), and the rows'
#: kernels "TE + DeepEP" are the YAMLs' ``backend.enable_deepep: true``, which dispatches
#: over the EP mesh (``apply_ep`` in nemo_automodel/components/moe/parallelizer.py asserts
#: ``ep_mesh.size() > 1``): the rows ran EP = their GPU count, the printed '-' is the
#: table's omission.
AUTOMODEL_EXPERT_PARALLEL = {"gpt-oss-20b": 8, "gpt-oss-120b": 64}

#: JAX remat policies of published JAX recipes, ``{(framework word, model): recompute
#: module}`` (:data:`strategies.model_costs.JAX_REMAT_POLICIES`). NVIDIA/dgxc-benchmarking
#: (the recipes of the DGX Cloud benchmark rows): ``maxtext/configure.sh``
#: (@0b71cfda5163540778e2a3d2db59858bf62f96f7, GSW 25.01, the 2024.12.09 MaxText image of
#: README_70b.md) runs ``remat_policy=${POLICY}`` with ``POLICY="save_qkv_proj"``;
#: ``paxml/paxml_mod_configs.py`` (@35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae) registers
#: ``Synthetic175BCkpt`` with ``CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_QKV_OUT_PROJ``,
#: the config ``paxml/configure.sh`` launches (``--fdl_config=...Synthetic175BCkpt``).
#: Other JAX rows: MaxText's default ``remat_policy: 'full'`` (``jax_full``).
#: The Paxml policy is applied as its recipe states although its rows then come out
#: 29-33 % too fast (18-23 % with Megatron-style whole-layer recompute): what slows the
#: real run is another mechanism the simulator lacks, not a reason to price a remat policy
#: the recipe does not run. What the recipe runs (``paxml/configure.sh`` @143b90dd, the
#: README_175b.md revision of the rows; paxml ``contrib/gpu/scripts_gpu/configs.py``
#: ``GPT175BBase`` and ``te_helper.py``):
#:
#: * layout: ``--fdl.DCN_MESH_SHAPE=[DP, 16, 1]`` over ``ICI_MESH_SHAPE = [1, 8, 1]``
#:   (axes replica, data, mdl): weights sharded over an FSDP group of 128 GPUs (16 nodes),
#:   ``DP = nodes / 16`` replicas; no TP, no pipeline (``USE_REPEATED_LAYER``: one
#:   scanned layer). ZeRO-3 with ``dp_shard`` 128 (:data:`JAX_FSDP_SHARD_GPUS`); at 128
#:   GPUs (dgxc_pax_01) there is one shard group and the row is still -29 %;
#: * layers: ``ENABLE_TE=1`` swaps in Transformer Engine's praxis ``TransformerLayer``
#:   (``dtype`` = the bf16 ``FPROP_DTYPE``), FP8 through ``te.fp8_autocast`` with
#:   ``DelayedScaling`` (HYBRID, amax history 1024: ``te-delayed``), cuDNN fused attention
#:   (``NVTE_FUSED_ATTN=1``; XLA's own ``--xla_gpu_enable_cudnn_fmha=false``); TE tags
#:   ``combined_qkv_proj`` and ``out_proj``, the names the remat policy saves;
#: * XLA: latency-hiding scheduler with its approximate cost model (no PGLE profile,
#:   which the MaxText recipe generates and passes), async and pipelined all-gather /
#:   reduce-scatter, combine thresholds 512 MiB (all-gather) and 8 MiB (reduce-scatter),
#:   ``--xla_gpu_graph_level=0`` (no CUDA graphs).
#:
#: Per layer the FSDP traffic of a GPU (3.6 GB gathered twice, 7.2 GB of fp32 gradients
#: reduce-scattered over 16 nodes) takes about as long as the layer's compute (about 32 of
#: 36 ms in the backward at the simulator's rates), so how much of it the scheduler hides
#: decides the step: with the overlap the simulator assumes the 128-GPU row is 5.28 s
#: (-29 %), with none 7.13 s (-4.5 %), published 7.47 s. The pipelined collectives do
#: overlap across layers (the recipe turns the collective pipeliner on, as MaxText's
#: does), but without while-loop double buffering every iteration copies the carried
#: buffers (:data:`JAX_LOOP_DOUBLE_BUFFERING`): priced, 6.46 s (-13.5 %). What else the
#: approximate latency estimator (no PGLE profile) leaves exposed is not sourced, so it
#: is not priced.
JAX_REMAT_RECIPES = {("maxtext", "llama2-70b"): "jax_save_qkv",
                     ("paxml", "gpt3-175b"): "jax_save_qkv_out"}
#: FSDP shard groups (GPUs) of published JAX recipes whose rows do not print them: the
#: Paxml GPT-3 175B mesh above, FSDP over 16 nodes x 8 GPUs, ``DP = nodes / 16`` replicas
#: (the plan's ``dp_shard``).
JAX_FSDP_SHARD_GPUS = {("paxml", "gpt3-175b"): 128}

#: XLA while-loop double buffering of the published JAX recipes, ``{framework word:
#: --xla_gpu_enable_while_loop_double_buffering}``. Both NVIDIA/dgxc-benchmarking recipes
#: scan their layers (Paxml ``USE_REPEATED_LAYER``; MaxText ``scan_layers=true``) and turn
#: XLA's collective pipeliner on for the FSDP collectives
#: (``--xla_gpu_enable_pipelined_all_gather=true``, ``_reduce_scatter=true``,
#: ``_all_reduce=true``): the next layer's all-gather overlaps the whole current layer,
#: this layer's reduce-scatter the whole next one (xla/service/collective_pipeliner.h),
#: so both recipes overlap FSDP traffic across layers. They differ in double buffering:
#: ``paxml/configure.sh`` @143b90dd91f9be958fed4773ae95d941a3356a82 (the rows' README
#: revision; image ghcr.io/nvidia/jax:pax-2024-03-04, paxml/setup.sh) sets
#: ``--xla_gpu_enable_while_loop_double_buffering=false``, ``maxtext/configure.sh``
#: @0b71cfda5163540778e2a3d2db59858bf62f96f7 sets it ``true`` (as JAX-Toolbox's
#: rosetta/docs/GPU_performance.md recommends among its "Pipelined comm/compute for FSDP
#: flags"). Without it the pipelined values are loop-carried buffers that copy insertion
#: copies every iteration (``ParallelPlan.xla_scan_carry_copies``).
JAX_LOOP_DOUBLE_BUFFERING = {"paxml": False, "maxtext": True}

#: Spellings of Megatron-Core ``--recompute-modules`` in the rows' ``recompute_detail``
#: and the module the plan names (``None``: a module the cost model has no kernels of).
_MODULE_SPELLINGS = {"core_attn": "core_attn", "layernorm": "layernorm", "norm": "layernorm",
                     "mlp": "mlp", "moe": "moe", "moe_act": "moe_act", "act": "moe_act",
                     "up_proj": "mla_up_proj", "mla_up_proj": "mla_up_proj",
                     "shared_experts": None}


@dataclass(frozen=True)
class StackSettings:
    """Plan fields a published row runs with beyond what it prints.

    Attributes:
        fields: ParallelPlan fields to set.
        notes: each setting applied, with its source.
        unprinted: settings the row does not print but its framework's published recipe
            sets (recompute, offloading): the row is compared with them.
    """

    fields: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unprinted: list[str] = field(default_factory=list)


def framework_kind(framework: str, version: str = "") -> str:
    """``megatron-lm-2021``, ``meta-llama3``, ``llm-foundry``, ``torchtitan``,
    ``pytorch-fsdp``, ``jax`` or ``megatron-core`` (Megatron-Core, NeMo, Megatron-Bridge
    and later Megatron-LM)."""
    name = framework.lower()
    if "megatron-lm" in name and version.startswith("2021"):
        return "megatron-lm-2021"
    for kind, words in _KINDS:
        if any(word in name for word in words):
            return kind
    return "megatron-core"


def hsdp_shard(shard_gpus: int, dp: int) -> int:
    """The plan's ``dp_shard`` for a published shard group of ``shard_gpus`` ranks over
    ``dp`` data-parallel ranks: the group when it is a proper divisor of dp (hybrid
    sharding, ``dp / shard_gpus`` replicas), else 0 (one shard group over all of dp)."""
    return shard_gpus if 0 < shard_gpus < dp and dp % shard_gpus == 0 else 0


def framework_defaults(framework: str, version: str = "") -> dict[str, object]:
    """Plan fields a framework runs with unless the row says otherwise.

    * Megatron-Core / NeMo / Megatron-Bridge: ``--use-distributed-optimizer`` (ZeRO-1 over
      data x context parallelism, Megatron-LM docs/distrib_optimizer.md), sequence
      parallelism with TP, overlapped gradient reduction and parameter gather, gradients
      reduced in fp32 (NeMo's BF16 default ``grad_reduce_in_fp32``), TE's attention choice,
      the fp32 vocab-parallel loss (``cross_entropy_loss_fusion`` off by default).
    * Megatron-LM 2021 (the commit of the SC21 runs) predates all of it: unfused attention,
      the all-reduce after the backward, no distributed optimizer, blocking TP.
    * llm-foundry (MosaicML's MPT benchmark tables): FSDP ``FULL_SHARD`` with fp32 gradient
      reduction (Composer's DEFAULT mixed precision after composer PR #2628; the rows of
      older Composer versions and ``mp_mode PURE`` reduce in bf16, and every row
      reduce-scatters each micro-batch: :func:`stack_settings`,
      :func:`composer_reduce_dtype`); flash-attn 1.x kernels (the ``gpu`` extra of
      llm-foundry 0.2-0.3 pins ``flash-attn==1.0.x``; its ``triton`` impl, Tri Dao's 2022
      ``flash_attn_triton.py``, is of the same class). The rows agree: the fwd+bwd
      attention rate each 8k-64k row leaves after trainsim's non-attention time
      (tools/llmfoundry_attention_rates.py) is 5-18 % above the derived ``fa1`` rows in
      every section (A100 40GB/80GB, H100 BF16/FP8) and 1.45x or more below what
      FlashAttention-2 or cuDNN would run (tests/test_llmfoundry_attention.py; the
      README names no kernel per section); FP8 through ``te.Linear`` drop-ins
      (``fc_type: te``); eager PyTorch elementwise kernels; flash-attn's fused loss
      (``loss_fn: fused_crossentropy``); Composer's ``DecoupledAdamW`` (every MPT yaml's
      ``optimizer: name: decoupled_adamw``), whose ``adamw`` (composer/optim/
      decoupled_weight_decay.py) updates the parameters one tensor at a time with unfused
      ``mul_``/``add_``/``addcmul_``/``sqrt``/``div``/``add_``/``addcdiv_`` kernels:
      ``optimizer_impl = "for-loop"`` (the 80 bytes per parameter of
      ``strategies.model_costs.ADAM_BYTES_PER_PARAM``, not a fused kernel's 28).
      Activation checkpointing re-runs the whole MPTBlock (``activation_checkpointing_fn``:
      every ``MPTBlock``; submit_benchmarks.py sets ``activation_checkpointing_reentrant:
      False``) without early stop: the benchmark sweeps ran the
      ``mosaicml/pytorch:2.0.1_cu118`` image (scripts/train/benchmarking/sweep.sh; the
      A100 40GB table the 1.13.1 default of submit_benchmarks.py), whose non-reentrant
      checkpoint re-runs the function whole on the first unpack; early stop came with
      PyTorch 2.1 (pytorch PR #96866). The large-scale section's PyTorch is not printed:
      taken to be the same (assumption).
    * torchtitan: FSDP2 with ``mixed_precision_reduce = "float32"``; SDPA's flash backend
      (FlashAttention-2); torchao float8; without ``torch.compile`` eager RMSNorm, SwiGLU,
      RoPE and an fp32 ``F.cross_entropy`` (compiled runs: fused; :func:`stack_settings`);
      DTensor TP (``tp_comm_overlap = "dtensor"``: collectives block the compute
      stream, the column-parallel backward reuses the gathered input autograd saved;
      AsyncTP is opt-in, :func:`stack_settings`); context parallelism through PyTorch's
      ``context_parallel`` (``create_context_parallel_ctx`` in torchtitan/utils.py, later
      torchtitan/distributed/utils.py, wraps
      ``torch.distributed.tensor.experimental.context_parallel``), whose default
      ``_cp_options.rotate_method`` is ``ALL_GATHER`` (torch/distributed/tensor/
      experimental/_attention.py ``_ContextParallelOptions``; torchtitan's
      ``context_parallel_rotate_method`` option came later with the same default):
      ``cp_comm_type = "torch_allgather"``. Activation checkpointing through
      ``ptd_checkpoint_wrapper`` (torchtitan's ``apply_ac``: PyTorch's non-reentrant
      checkpoint, torch >= 2.1 nightlies), whose early stop ends a full recompute at
      the last saved tensor: ``recompute_early_stop`` (strategies.lowering.early_stop_end).
    * Other PyTorch FSDP stacks (NeMo AutoModel): ZeRO-3, fp32 reduction, torchao float8,
      DTensor TP; FSDP2 over fp32 parameters, the sharded fp32 parameters being the
      optimizer's masters (``fsdp_fp32_params``: AutoModel's ``apply_fsdp``,
      nemo_automodel/components/moe/parallelizer.py, wraps every block with
      ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, "params are
      kept in fp32 ... fp32 master weights under FSDP2", and its benchmark YAMLs run
      ``torch.optim.Adam`` on them); the loss is PyTorch ``F.cross_entropy`` on the bf16
      logits (``cross_entropy = "eager_bf16"``: every benchmark YAML sets ``loss_fn:
      MaskedCrossEntropy`` with ``fp32_upcast: false``); ``checkpoint_wrapper``
      activation checkpointing (``apply_ac``), PyTorch's non-reentrant checkpoint with
      early stop (``recompute_early_stop``).
    * JAX (MaxText, Paxml): parameters, gradients and optimizer state sharded (ZeRO-3),
      fp32 reduction; XLA fuses elementwise chains; no per-chunk amax all-reduce
      (``amax_reduction = "none"``: that is Transformer Engine's PyTorch
      ``fp8_autocast`` exit, which the JAX step does not run).
    * Meta's Llama 3 training stack (arXiv 2407.21783 Section 3.3.2): FSDP-style data
      parallelism that shards optimizer state and gradients and does not reshard the
      parameters after the forward (ZeRO-2 with the parameters gathered once per step);
      all-gather context parallelism: "we first all-gather the key (K) and value (V)
      tensors, and then compute attention output for the local query (Q) tensor chunk
      ... the all-gather communication latency is exposed in the critical path" (Section
      3.3.2, the chunks load-balanced as Transformer Engine's: ``cp_comm_type =
      "all_gather"``; the backward as TE's all-gather variant runs it, assumption).
    """
    kind = framework_kind(framework, version)
    if kind == "megatron-lm-2021":
        return {"zero": 0, "flash_attention": False, "overlap_grad_reduce": False,
                "overlap_param_gather": False, "tp_comm_overlap": "none",
                "cross_entropy": "megatron"}
    if kind == "llm-foundry":
        return {"zero": 3, "grad_reduce_dtype": "fp32", "tp_comm_overlap": "none",
                "attention_impl": "fa1", "fp8_recipe": "te-linear", "elementwise": "eager",
                "cross_entropy": "fused", "optimizer_impl": "for-loop"}
    if kind == "torchtitan":
        return {"zero": 3, "grad_reduce_dtype": "fp32", "tp_comm_overlap": "dtensor",
                "attention_impl": "fa2", "fp8_recipe": "torchao", "elementwise": "eager",
                "cross_entropy": "eager", "cp_comm_type": "torch_allgather",
                "recompute_early_stop": True}
    if kind == "pytorch-fsdp":
        out = {"zero": 3, "grad_reduce_dtype": "fp32", "tp_comm_overlap": "dtensor",
               "fp8_recipe": "torchao", "cross_entropy": "eager", "fsdp_fp32_params": True,
               "recompute_early_stop": True}
        if "automodel" in framework.lower():
            out["cross_entropy"] = "eager_bf16"
        return out
    if kind == "jax":
        # (FP8 in JAX: Flax's Fp8DotGeneralOp keeps the amax histories in the
        # "_overwrite_with_gradient" collection, reduced with the step's gradients; no
        # PyTorch Transformer Engine fp8_autocast exit all-reduces them per model chunk)
        return {"zero": 3, "grad_reduce_dtype": "fp32", "amax_reduction": "none"}
    if kind == "meta-llama3":
        return {"zero": 2, "grad_reduce_dtype": "fp32", "cp_comm_type": "all_gather"}
    return {"zero": 1, "grad_reduce_dtype": "fp32"}


def _is_nemo1(framework: str, version: str) -> bool:
    """NeMo 1 (the NeMo-Framework-Launcher configs): NeMo <= 24.09 containers."""
    return "launcher" in framework.lower() or version.startswith(("NeMo 24.", "NeMo24."))


def recompute_modules_of(detail: str) -> tuple[tuple[str, ...], list[str]]:
    """The Megatron-Core recompute modules a row's ``recompute_detail`` prints
    (``--recompute-modules layernorm moe`` or ``recompute modules: norm, act``), and the
    printed modules the cost model has no kernels of."""
    text = ""
    if "--recompute-modules" in detail:
        text = detail.split("--recompute-modules", 1)[1].split("(")[0]
    elif "recompute modules:" in detail:
        text = detail.split("recompute modules:", 1)[1].split("(")[0]
    modules: list[str] = []
    unknown: list[str] = []
    for word in text.replace(",", " ").split():
        if word.startswith("--"):
            break
        module = _MODULE_SPELLINGS.get(word)
        if module is None:
            unknown.append(word)
        elif module not in modules:
            modules.append(module)
    return tuple(modules), unknown


def torchtitan_pipeline(text: str, pp: int) -> tuple[str, int]:
    """The pipeline schedule and stages per rank a torchtitan row ran (``text``: its
    citation and notes, which print the schedule, e.g. "PP schedule Interleaved 1F1B").

    torchtitan (``torchtitan/parallelisms/pipelining_utils.py`` @9dec370,
    ``generate_split_points``) builds one stage per rank for single-stage schedules
    (``1F1B``, ``GPipe``) and, with no split points given, two stages per rank for the
    looped multi-stage ones (``Interleaved1F1B``, ``LoopedBFS``); its
    ``build_pipeline_schedule`` then runs as many micro-batches as there are stages in
    total (``pipeline_parallel_microbatches`` unset). Returns ``(schedule, vpp)``:
    ``("interleaved", 2)`` when the row prints an interleaved schedule, else ``("1f1b", 1)``.
    """
    if pp > 1 and "interleaved 1f1b" in text.lower():
        return "interleaved", 2
    return "1f1b", 1


def _torchtitan_selective(detail: str, num_layers: int, pp: int) -> dict[str, object]:
    """Plan fields of torchtitan's selective activation checkpointing
    (``torchtitan/distributed/activation_checkpoint.py``): ``selective_ac_option = "op"``
    (the Llama 3 presets' setting, and what a row printing only "selective" ran) saves
    every op's output but every second matmul (recompute module ``op_sac``); a layer
    frequency ``N`` ("per layer"; the benchmarks used 2) checkpoints every N-th block
    whole, which for the time and memory of a stage is full recompute of half its layers
    (``recompute_layers``, the block method)."""
    if "per layer" in detail.lower():
        return {"recompute": "full", "recompute_layers": max(1, num_layers // pp // 2)}
    return {"recompute_modules": ("op_sac",)}


def host_issue_of(row: Mapping[str, str], recipe: Mapping[str, str] | None) -> tuple[str, str]:
    """How a published row's stack issues its kernels from the CPU
    (``ParallelPlan.host_issue``) and why: ``(mode, note)``.

    * Megatron-Core / NeMo / Megatron-Bridge: ``eager`` (PyTorch eager, Transformer Engine
      modules) unless the row's NeMo performance recipe captures CUDA graphs
      (``cuda_graphs`` 1 in ``nemo_recipes/model_configs_*.csv``: NeMo 2's
      ``enable_cuda_graph``; Megatron-Bridge's own presets agree, e.g.
      ``scripts/performance/configs/llama/llama3_workload_base_configs.py``
      ``LLAMA3_8B_PRETRAIN_CONFIG_{B200,GB200}_*_V1``: ``cuda_graph_impl="local"``,
      ``cuda_graph_scope="full_iteration"``, the H100 presets none): ``graphed``. NeMo 1
      launcher configs (``launcher_scripts/conf/training/*/*.yaml``) set no CUDA graphs.
    * Megatron-LM 2021, llm-foundry (Composer's trainer runs the model eagerly
      unless given a ``compile_config``; the MPT benchmark tables name none, assumption), other
      PyTorch FSDP stacks (NeMo AutoModel) and Meta's Llama 3 stack (the paper describes
      no CUDA graphs; assumption): ``eager``.
    * torchtitan: ``eager`` without ``torch.compile``. With it (``training.compile``:
      ``torch.compile`` per TransformerBlock, ``apply_compile`` in
      torchtitan/parallelisms/parallelize_llama.py, default mode, no CUDA graphs)
      ``compiled``: Inductor's generated wrapper launches the blocks' fused kernels
      directly (``hardware.compute.HOST_ISSUE_S["compiled"]``); the embedding, output
      layer, optimizer and FSDP2's collectives stay eager.
    * JAX (MaxText, Paxml): XLA runs the whole step as compiled programs, the host issues
      one executable per step: ``graphed``.
    * DeepSeek's own stack (DualPipe): not published, ``off``.

    MoE rows of Megatron-Core and PyTorch FSDP stacks are refined by
    ``validate.published._moe_settings`` (partial graphs, dropless syncs).
    """
    framework, version = row.get("framework", ""), row.get("framework_version", "")
    kind = framework_kind(framework, version)
    text = (framework + " " + row.get("notes", "")).lower()
    if "dualpipe" in framework.lower():
        return "off", "host issue off (DeepSeek's stack: how it issues kernels is not published)"
    if kind == "jax":
        return "graphed", "host issue graphed (XLA: whole-step compiled programs)"
    if kind == "torchtitan":
        if "compile" in text:
            return "compiled", ("host issue compiled (torch.compile per TransformerBlock: "
                                "Inductor's wrapper launches the blocks' kernels)")
        return "eager", "host issue eager (torchtitan without torch.compile)"
    if kind == "megatron-core":
        if recipe is not None and int(float(recipe.get("cuda_graphs") or 0)):
            return "graphed", "host issue graphed (NeMo recipe cuda_graphs 1: CUDA graphs)"
        return "eager", "host issue eager (Megatron-Core without CUDA graphs: PyTorch eager, TE modules)"
    return "eager", f"host issue eager ({kind}: PyTorch eager)"


def layer_impl_of(row: Mapping[str, str]) -> tuple[str, str]:
    """What a published row's transformer layers are built of (``ParallelPlan.layer_impl``:
    Transformer Engine modules, whose per-call CPU bookkeeping the host model prices, or
    plain PyTorch / framework-local modules) and why: ``(impl, note)``.

    * Megatron-Core / NeMo / Megatron-Bridge (and the MegaScale paper's Megatron-LM
      baseline): ``te``, Megatron-LM's default ``--transformer-impl transformer_engine``
      (megatron/training/arguments.py) and NeMo's ``transformer_engine: True``; only
      ``--transformer-impl local`` builds Megatron's own ``ColumnParallelLinear`` layers
      (the Megatron importer reads it).
    * Megatron-LM 2021 (arXiv 2104.04473): Megatron's local layers, before Transformer
      Engine existed: ``torch``.
    * llm-foundry: ``torch.nn.Linear`` (``fc_type: torch``, the MPT default in
      llmfoundry/models/mpt/configuration_mpt.py) unless ``fc_type: te``; Composer's
      ``amp_fp8`` precision runs Transformer Engine's ``fp8_autocast``, which quantizes
      only TE modules, so an FP8 row ran ``fc_type: te`` (and TE's ``LayerNormMLP``):
      ``te`` for FP8 rows, ``torch`` for the others.
    * torchtitan: ``torch.nn.Linear`` (FP8 through torchao's ``Float8Linear``, a
      ``torch.nn.Linear`` subclass): ``torch``.
    * PyTorch FSDP stacks (NeMo AutoModel): ``te`` when the framework names Transformer
      Engine ("TE", AutoModel's ``BackendConfig`` ``linear: te``), else ``torch``.
    * Meta's Llama 3 stack: PyTorch modules (the paper names no Transformer Engine;
      assumption): ``torch``.
    * JAX (MaxText, Paxml) and DeepSeek's stack: no PyTorch host issue is priced
      (graphed / off): ``torch``, which changes nothing there.
    """
    framework, version = row.get("framework", ""), row.get("framework_version", "")
    kind = framework_kind(framework, version)
    if kind == "megatron-core" and "dualpipe" not in framework.lower():
        return "te", "layers: Transformer Engine modules (Megatron-Core's default transformer_impl)"
    if kind == "llm-foundry":
        if row.get("dtype") == "fp8":
            return "te", "layers: Transformer Engine (llm-foundry FP8 needs fc_type te)"
        return "torch", "layers: torch.nn.Linear (llm-foundry fc_type torch, its default)"
    if kind == "pytorch-fsdp" and "te" in framework.lower().replace("(", " ").replace(
            ")", " ").replace(",", " ").replace(";", " ").split():
        return "te", "layers: Transformer Engine modules (printed: TE)"
    return "torch", f"layers: PyTorch modules ({kind}: no Transformer Engine modules)"


#: The llm-foundry table sections that ran after Composer's FSDP ``DEFAULT`` mixed precision
#: was given ``reduce_dtype = torch.float32`` (composer PR #2628, 2023-10-10, "Fixes default
#: precision to use fp32 reduce dtype"): the large-scale H100 section appears only in the
#: benchmarking README's last version (scripts/train/benchmarking/README.md), after the
#: H100 and re-run A100 80GB sections; its rows are taken to run that fix (assumption: the
#: README names no Composer version).
COMPOSER_FP32_REDUCE_SECTIONS = ("Large Scale",)


def composer_reduce_dtype(notes: str) -> tuple[str, str]:
    """The dtype an llm-foundry row's Composer FSDP reduce-scatters gradients in, and why.

    Composer's ``get_mixed_precision`` (composer/trainer/mosaic_fsdp_utils.py) per version:

    * ``PURE`` (every version): ``param_dtype = reduce_dtype = buffer_dtype`` = the
      precision's dtype: bf16.
    * ``DEFAULT`` from composer PR #2047 (2023-03-09, Composer 0.13.2-0.16.x, the
      torch-2.0 sweep of llm-foundry's scripts/train/benchmarking/sweep.sh: image
      ``mosaicml/pytorch:2.0.1_cu118``): ``param_dtype`` and ``buffer_dtype`` = the
      precision's dtype, ``reduce_dtype`` left None; PyTorch FSDP then infers the
      reduction dtype from the parameter dtype (torch/distributed/fsdp/_flat_param.py
      ``FlatParamHandle._init_param_reduce_dtypes``: "Special case: infer gradient
      reduction mixed precision", ``_reduce_dtype = mp_param_dtype``): bf16. The H100 BF16,
      H100 FP8 (``amp_fp8`` maps to bf16 in ``get_torch_dtype``) and the re-run A100 80GB
      sections print ``amp_bf16``/``amp_fp8`` DEFAULT and came with that sweep (the first
      A100 80GB table printed ``bf16`` PURE: an older README version).
    * ``DEFAULT`` after composer PR #2628 (2023-10-10): ``reduce_dtype = torch.float32``;
      the sections of :data:`COMPOSER_FP32_REDUCE_SECTIONS`.
    * ``DEFAULT`` before PR #2047 (composer/trainer/dist_strategy.py and mosaic_fsdp.py of
      Composer <= 0.13.1: fp32 parameters, bf16 reduction) ran none of the tables: the
      tables of that time printed ``bf16`` PURE (torch 1.13, submit_benchmarks.py's
      ``--fsdp_config_mixed_precision`` default PURE).
    """
    if "mp_mode PURE" in notes:
        return "bf16", ("Composer FSDP mixed precision PURE (printed): gradients reduced "
                        "in bf16")
    if any(section in notes for section in COMPOSER_FP32_REDUCE_SECTIONS):
        return "fp32", ("Composer FSDP mixed precision DEFAULT after composer PR #2628: "
                        "gradients reduced in fp32")
    return "bf16", ("Composer FSDP mixed precision DEFAULT (Composer 0.13.2-0.16: "
                    "reduce_dtype None, FSDP reduces in the bf16 param_dtype)")


def stack_settings(row: Mapping[str, str], plan_fields: Mapping[str, object],
                   recipe: Mapping[str, str] | None, *, num_layers: int = 0) -> StackSettings:
    """What a published row runs with beyond its printed configuration and its
    framework's defaults (module docstring).

    Args:
        row: the row's cells (``framework``, ``framework_version``, ``gpu``, ``dtype``,
            ``model``, ``notes``, ``recompute``, ``recompute_detail``).
        plan_fields: the plan fields chosen so far (read: ``zero``, ``recompute``,
            ``grad_reduce_dtype``).
        recipe: the row's NeMo performance recipe, if it has one.
        num_layers: the model's transformer layers (for a pipeline layout the source
            describes in words).
    """
    framework, version = row.get("framework", ""), row.get("framework_version", "")
    kind = framework_kind(framework, version)
    notes_text = row.get("notes", "")
    out = StackSettings()
    fields, notes, unprinted = out.fields, out.notes, out.unprinted
    fields["host_issue"], host_note = host_issue_of(row, recipe)
    notes.append(host_note)
    fields["layer_impl"], layer_note = layer_impl_of(row)
    notes.append(layer_note)
    if kind == "torchtitan" and "compile" in (framework + notes_text).lower():
        fields.update(elementwise="fused", cross_entropy="fused")
        notes.append("torch.compile: fused elementwise kernels and loss")
        if int(plan_fields.get("tp", 1)) > 1 and "asynctp" in notes_text.lower().replace(" ", ""):
            # torchtitan enable_async_tensor_parallel: torch._inductor's micro-pipeline TP
            # pass rewrites the TP all-gather/matmul and matmul/reduce-scatter pairs into
            # torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
            fields["tp_comm_overlap"] = "symmetric_memory"
            notes.append("AsyncTP (printed): TP collectives micro-pipelined over symmetric memory")
    if kind == "megatron-core" and row.get("dtype") == "fp8":
        gpu = row.get("gpu", "")
        if gpu in ("B200", "GB200") and ("MXFP8" in notes_text or "FP8-MX" in notes_text):
            fields["fp8_recipe"] = "te-mxfp8"
        elif "FP8-CS" in notes_text or "current scaling" in notes_text.lower():
            fields["fp8_recipe"] = "te-current"
        if "fp8_recipe" in fields:
            notes.append(f"FP8 recipe {fields['fp8_recipe']} (printed in the row's notes)")
    pp = int(plan_fields.get("pp", 1))
    if (kind == "meta-llama3" and pp > 1 and not row.get("vpp")
            and (num_layers + 2) % pp == 0):
        # "we use an interleaved schedule ... and balance the pipeline by reducing one
        # Transformer layer each from the first and the last stages" (Section 3.3.2): one
        # layer per virtual stage, the first and last holding the embedding and the loss
        fields.update(schedule="interleaved", vpp=(num_layers + 2) // pp)
        unprinted.append(f"interleaved schedule, {(num_layers + 2) // pp} virtual stages of "
                         "one layer, the first and last holding only the embedding and the "
                         "loss (described in Section 3.3.2, not printed)")
    if kind == "llm-foundry":
        reduce_dtype, why = composer_reduce_dtype(notes_text)
        if reduce_dtype == "bf16":
            fields["grad_reduce_dtype"] = "bf16"
            notes.append(why)
        # Composer's trainer enters ddp_sync_context (composer/trainer/trainer.py
        # _train_microbatches -> composer/distributed/dist_strategy.py ddp_sync_context),
        # which only calls no_sync() on a DistributedDataParallel module: under FSDP it
        # yields at once, so FSDP v1 reduce-scatters every micro-batch's gradients
        fields["grad_reduce_every_microbatch"] = True
        notes.append("Composer FSDP: gradients reduce-scattered after every micro-batch "
                     "(ddp_sync_context is a no-op for FSDP)")
    if _is_nemo1(framework, version) and plan_fields.get("grad_reduce_dtype") != "bf16":
        fields["grad_reduce_dtype"] = "bf16"
        notes.append("NeMo 1 launcher: bf16 gradient buffers (optim.grad_sync_dtype bf16, "
                     "launcher_scripts/conf/training/nemotron/nemotron_340b.yaml)")
    if kind == "jax" and not row.get("recompute"):
        # JAX stacks rematerialise every layer (jax.checkpoint around the scanned layer)
        # with their recipe's policy, else MaxText's default remat_policy 'full'
        # (MaxText/configs/base.yml); JAX re-runs only what the backward reads
        # (strategies.model_costs.jax_remat_recompute_fractions)
        name = framework.lower()
        policy = next((p for (word, m), p in JAX_REMAT_RECIPES.items()
                       if word in name and m == row.get("model")), "jax_full")
        fields.update(recompute="selective", recompute_layers=0, recompute_modules=(policy,))
        dp = int(plan_fields.get("dp", 1))
        shard = hsdp_shard(next((g for (word, m), g in JAX_FSDP_SHARD_GPUS.items()
                                 if word in name and m == row.get("model")), 0), dp)
        if shard:
            fields["dp_shard"] = shard
            unprinted.append(f"FSDP shard group {shard} GPUs x {dp // shard} replicas (the "
                             "published recipe's mesh)")
        unprinted.append(f"JAX remat policy {policy} ("
                         + ("the published recipe's" if policy != "jax_full"
                            else "MaxText's default 'full'") + ")")
    if kind == "jax" and not next((on for word, on in JAX_LOOP_DOUBLE_BUFFERING.items()
                                   if word in framework.lower()), True):
        fields["xla_scan_carry_copies"] = True
        unprinted.append("XLA scanned layers with pipelined FSDP collectives and no while-loop "
                         "double buffering: each layer's gathered parameters and unreduced "
                         "gradients copied once per iteration (the published recipe's "
                         "XLA_FLAGS)")
    is_bridge = "megatron-bridge" in framework.lower()
    if is_bridge and version.startswith("NeMo 2"):
        fields["store_param_remainders"] = True
        notes.append("Megatron-Core store_param_remainders (OptimizerConfig default, printed "
                     "in the Megatron-Bridge log of memory_megatron_bridge_logs.csv)")
    if recipe is not None:
        fields["cross_entropy"] = "fused"
        notes.append("TE fused cross entropy (NeMo performance scripts, nemo_recipes/README.md)")
        offload = int(float(recipe.get("activation_offload_layers") or 0))
        if offload:
            fields["activation_offload_layers"] = offload
            unprinted.append(f"activation offload of {offload} layers (NeMo recipe)")
    key = (row.get("model"), row.get("gpu"), row.get("dtype"))
    if is_bridge and key in MEGATRON_BRIDGE_OFFLOAD and plan_fields.get("zero", 0) >= 3:
        fields["activation_offload_layers"] = MEGATRON_BRIDGE_OFFLOAD[key]
        unprinted[:] = [u for u in unprinted if not u.startswith("activation offload")]
        unprinted.append(f"activation offload of {MEGATRON_BRIDGE_OFFLOAD[key]} layers "
                         "(Megatron-Bridge workload config)")
    model = row.get("model", "")
    if is_bridge and model in MEGATRON_BRIDGE_BF16_GRAD_REDUCE:
        fields["grad_reduce_dtype"] = "bf16"
        unprinted.append("bf16 gradient reduction (Megatron-Bridge performance config: "
                         "grad_reduce_in_fp32 False)")
    preset_micro = MEGATRON_BRIDGE_PRESET_MICRO_BATCH.get(key)
    if is_bridge and preset_micro and _GA_INCONSISTENT.search(notes_text):
        fields["micro_batch"] = preset_micro
        unprinted.append(f"micro-batch {preset_micro} (Megatron-Bridge performance preset; the "
                         f"printed MBS {row.get('micro_batch')} contradicts the printed GA)")
    bridge_modules = MEGATRON_BRIDGE_RECOMPUTE_MODULES.get(key)
    if is_bridge and bridge_modules and not row.get("recompute"):
        fields.update(recompute="selective", recompute_modules=bridge_modules)
        unprinted.append(f"recompute modules {' '.join(bridge_modules)} (Megatron-Bridge "
                         "performance preset)")
    if (kind == "pytorch-fsdp" and "automodel" in framework.lower() and not row.get("recompute")
            and AUTOMODEL_ACTIVATION_CHECKPOINTING.get(model)):
        fields.update(recompute="full", recompute_layers=0)
        unprinted.append("activation checkpointing of every decoder block (AutoModel "
                         "benchmark YAML: activation_checkpointing true)")
    if (kind == "pytorch-fsdp" and "automodel" in framework.lower() and not row.get("ep")
            and model in AUTOMODEL_EXPERT_PARALLEL):
        fields["ep"] = AUTOMODEL_EXPERT_PARALLEL[model]
        unprinted.append(f"EP {fields['ep']} (AutoModel benchmark YAML ep_size; the table "
                         "prints '-')")
    if kind == "pytorch-fsdp" and "deepep" in framework.lower():
        # NeMo AutoModel's "TE + DeepEP" experts (nemo_automodel/components/moe/layers.py
        # GroupedExpertsDeepEP.forward): grouped_gemm ``ops.gmm`` without bias, then
        # ``_apply_bias`` per local expert after both projections (a no-op without biases)
        fields["expert_bias_impl"] = "eager"
        notes.append("DeepEP experts (printed): expert biases added per expert in eager "
                     "PyTorch after both grouped GEMMs")
    if kind == "torchtitan" and plan_fields.get("recompute") == "selective":
        fields.update(_torchtitan_selective(row.get("recompute_detail", ""), num_layers,
                                            int(plan_fields.get("pp", 1))))
        notes.append("torchtitan selective checkpointing as "
                     + ("every second layer fully recomputed (selective_ac_option '2')"
                        if fields.get("recompute") == "full" else
                        "its per-op policy (every second matmul of a block re-run)"))
    dgxc = dgxc_recipe_of(row.get("citation", ""))
    if dgxc is not None and _is_nemo1(framework, version):
        recipe_fields, source = DGXC_LAUNCHER_RECIPES[dgxc]
        fields.update(recipe_fields)
        unprinted.append(source)
        fp8_params = dgxc in DGXC_FP8_PARAMS and row.get("dtype") == "fp8"
        if fp8_params:
            fields["fp8_params"] = True
            unprinted.append("FP8 primary weights (dgxc-benchmarking configure.sh "
                             "+model.fp8_params)")
        if dgxc in DGXC_NEMO1_DISTRIBUTED_ADAM:
            optim_dtype = DGXC_NEMO1_DISTRIBUTED_ADAM[dgxc]
            adam = nemo1_distributed_adam(optim_dtype, fp8_params)
            fields.update(adam)
            copy = adam["master_weights_dtype"]
            unprinted.append(f"Apex distributed Adam with {optim_dtype} state ("
                             + (f"{copy} parameter copy" if copy != "none"
                                else "no parameter copy")
                             + f"; the {dgxc} recipe's optim.dtype)")
    launcher_adam = NEMO1_LAUNCHER_DISTRIBUTED_ADAM.get((row.get("model"), version))
    if dgxc is None and launcher_adam and _is_nemo1(framework, version):
        fields.update(nemo1_distributed_adam(launcher_adam, fp8_params=False))
        unprinted.append(f"Apex distributed Adam with {launcher_adam} state, no parameter copy "
                         "(the NeMo launcher's config of the release: optim.dtype)")
    ub_key = dgxc if dgxc in UB_FP8_REDUCE_SCATTER else (row.get("model"), version)
    if (_is_nemo1(framework, version) and row.get("dtype") == "fp8"
            and ub_key in UB_FP8_REDUCE_SCATTER and int(plan_fields.get("tp", 1)) > 1
            and fields.get("tp_comm_overlap", plan_fields.get("tp_comm_overlap"))
            == "userbuffers"):
        buffers, source = UB_FP8_REDUCE_SCATTER[ub_key]
        fields["tp_comm_fp8_reduce_scatter"] = buffers
        unprinted.append(f"FP8 userbuffers reduce-scatter buffers {', '.join(buffers)} "
                         f"({source})")
    modules, unknown = recompute_modules_of(row.get("recompute_detail", ""))
    if modules and plan_fields.get("recompute") == "selective":
        fields["recompute_modules"] = modules
        notes.append(f"recompute modules {' '.join(modules)} (printed)"
                     + (f"; {' '.join(unknown)} not modelled" if unknown else ""))
    return out
