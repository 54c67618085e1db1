"""Parallel plans and how their ranks map onto the cluster.

A :class:`ParallelPlan` says how one training step is split: data (dp),
tensor (tp), pipeline (pp, with ``vpp`` virtual stages per rank), context
(cp) and expert (ep) parallelism, batch sizes, ZeRO stage, recompute and the
pipeline schedule.

Data parallelism is an all-reduce (or ZeRO reduce-scatter/all-gather) among
the replicas by default; ``dp_mode`` selects parameter-server training instead
(synchronous, asynchronous or bounded-staleness; strategies.param_server).

Rank order (Megatron-LM's default, ``tp-cp-ep-dp-pp``): TP varies fastest,
so a TP group sits inside one node on consecutive GPUs; then CP, then DP
(EP subdivides DP for the MoE layers), and PP varies slowest, so pipeline
stages are far apart. ``order`` can override it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from hardware.spec import ATTENTION_IMPLS
from strategies import model_costs
from strategies.expert_routing import check_expert_load_spec
from strategies.schedules import SCHEDULES, get_schedule

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
#: Matmul dtypes of a plan (fp16/fp32: e.g. the CPU replay of validate's tiny example).
PLAN_DTYPES = ("bf16", "fp8", "fp16", "fp32")
#: Dtypes of Adam's moments (``ParallelPlan.optimizer_moments_dtype``).
OPTIMIZER_MOMENT_DTYPES = ("fp32", "bf16")
#: How the optimizer holds its master copy of the weights
#: (``ParallelPlan.master_weights_dtype``; ``none``: it updates the model's weights).
MASTER_WEIGHT_DTYPES = ("fp32", "bf16", "none")
AXES = ("tp", "cp", "dp", "pp")
DP_MODES = ("allreduce", "ps-sync", "ps-async", "ps-stale")
GRAD_REDUCE_DTYPES = ("bf16", "fp32")
TP_COMM_OVERLAPS = ("none", "async", "userbuffers", "dtensor", "symmetric_memory")
#: FP8 recipes whose Transformer Engine userbuffers can reduce-scatter an FP8 GEMM
#: output (TE's per-tensor ``Float8Tensor`` recipes: delayed and current scaling;
#: ``tp_comm_fp8_reduce_scatter``).
UB_FP8_REDUCE_SCATTER_RECIPES = ("te-delayed", "te-current")
#: Bytes per element a Transformer Engine userbuffers all-gather moves under each FP8
#: recipe (``strategies.lowering``): the FP8 data (per-tensor recipes: one scale per
#: tensor); MXFP8 also all-gathers its E8M0 scale-inverses, one byte per 32 elements, in a
#: separate NCCL all-gather (transformer_engine/pytorch/module/base.py
#: ``fill_userbuffers_buffer_for_all_gather``, TE 2.x), priced here as part of the same
#: exchange. Other recipes gather bf16.
UB_FP8_GATHER_BYTES_PER_ELEMENT = {"te-delayed": 1.0, "te-current": 1.0,
                                   "te-mxfp8": 1.0 + 1.0 / 32}
#: Transformer Engine's pipelined forward reduce-scatters (userbuffers names,
#: transformer_engine/pytorch/module/base.py ``initialize_ub`` ``methods["pipeline"]``):
#: the attention out-projection's and the MLP down projection's output reductions.
UB_PIPELINED_REDUCE_SCATTERS = ("proj_fprop", "fc2_fprop")
PS_PLACEMENTS = ("dedicated", "colocated")
#: Fused attention implementations a plan can name; ``auto`` is Transformer Engine's own
#: choice for the GPU (hardware.compute.DEFAULT_ATTENTION_IMPL).
ATTENTION_CHOICES = ("auto", *ATTENTION_IMPLS)
#: Token dispatchers of Megatron-Core's MoE layer (``--moe-token-dispatcher-type``):
#: ``alltoall`` (MoEAlltoAllTokenDispatcher: NCCL all-to-all over EP, then all-gather over
#: expert-TP), ``allgather`` (MoEAllGatherTokenDispatcher: every token gathered over
#: EP x expert-TP) and ``deepep`` (the flex dispatcher on DeepEP: a token crosses the
#: network once per destination node, then NVLink; FP8 dispatch optional).
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")
#: How the CPU issues the step's kernels (``ParallelPlan.host_issue``).
HOST_ISSUE_MODES = ("off", "eager", "compiled", "partial", "graphed")
#: Host-issue modes whose CPU launches nothing per kernel (no host time priced).
HOST_FREE_MODES = ("off", "graphed")
#: What the transformer layers are built of (``ParallelPlan.layer_impl``): Transformer
#: Engine modules (``te``) or plain PyTorch / framework-local modules (``torch``).
LAYER_IMPLS = ("te", "torch")
#: Who reduces Transformer Engine's delayed-scaling amaxes (``ParallelPlan.amax_reduction``):
#: ``megatron`` -- TE's ``fp8_autocast`` exit (Megatron-Core opens one region per model
#: chunk forward, ``megatron/core/fp8_utils.py`` ``get_fp8_context``), a blocking
#: all-reduce per forward and per backward (strategies.lowering); ``none`` -- not as a
#: separate synchronising collective (JAX/XLA stacks, or ``DelayedScaling(reduce_amax=
#: False)``).
AMAX_REDUCTIONS = ("megatron", "none")
#: How ``trainsim plan`` treats a field (metadata ``search``): tries a ``list`` of values,
#: takes one ``fixed`` value for every candidate, or ``derived`` it (dp: what is left).
SEARCH_KINDS = ("list", "fixed", "derived")


def _field(default: Any, help: str, *, cli: str | None = None, aliases: tuple[str, ...] = (),
           search: str = "fixed", choices: Callable[[], tuple] | None = None,
           minimum: int | None = None) -> Any:
    """A plan field declared once, with what the application layer needs to offer it.

    Metadata: ``help`` (one sentence for ``--help``), ``cli`` (the option, default
    ``--`` + the name with dashes), ``aliases`` (other spellings, e.g. Megatron-LM's),
    ``search`` (:data:`SEARCH_KINDS`), ``choices`` (a function returning the valid
    values, read when asked so a registry can change them) and ``minimum`` (of an int).
    :meth:`ParallelPlan.__post_init__` checks ``choices`` and ``minimum``.
    """
    if search not in SEARCH_KINDS:
        raise ValueError(f"search: {search!r} is not valid; valid: {', '.join(SEARCH_KINDS)}")
    metadata = {"help": help, "cli": cli, "aliases": aliases, "search": search,
                "choices": choices, "minimum": minimum}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """How a training step is split over GPUs.

    Every field carries its help text, command-line spelling (and Megatron-LM aliases)
    and its role in ``trainsim plan``'s search as ``dataclasses`` metadata (:func:`_field`):
    the ``trainsim`` commands generate their plan options from it, so a new field with
    metadata appears on the command line with no other edit.

    A plan checks itself when it is built (:meth:`__post_init__`): every rule that does
    not depend on the model. :func:`validate_plan` adds the model's and the cluster's.

    Attributes:
        dp, tp, pp, cp: data, tensor, pipeline and context parallel sizes.
        ep: expert-parallel size for MoE layers: the expert side splits each pipeline
            stage's ``tp * cp * dp`` ranks as ``expert_tp * ep * expert-dp`` (Megatron-Core
            ``parallel_state``), so EP spans DP x CP (x TP when ``expert_tp < tp``) and may
            exceed dp.
        expert_tp: expert tensor-parallel size (Megatron ``--expert-tensor-parallel-size``);
            0 = tp.
        moe_dispatcher: the token dispatcher (:data:`MOE_DISPATCHERS`).
        moe_dispatch_fp8: dispatch tokens in FP8 (1 byte per element and a fp32 scale per
            128: DeepSeek-V3's dispatch, DeepEP's FP8 dispatch); the combine stays bf16.
        moe_a2a_overlap: overlap one micro-batch's forward with another's backward so each
            one's expert communication hides behind the other's compute (Megatron
            ``--overlap-moe-expert-parallel-comm``, its combined 1F1B; needs vpp >= 2 with
            pipeline parallelism). DualPipe schedules always do.
        moe_expert_load: how the router loads the experts
            (:mod:`strategies.expert_routing`): ``uniform``, ``zipf:<s>`` or a file of
            token counts per expert.
        moe_capacity_factor: ``""`` the model's (MoESpec.capacity_factor), ``dropless``,
            or a number: the per-expert capacity relative to a balanced load (Megatron
            ``--moe-expert-capacity-factor``), tokens above it dropped.
        moe_pad_to_capacity: every expert processes its full capacity (Megatron
            ``--moe-pad-expert-input-to-capacity``).
        vpp: virtual pipeline stages (model chunks) per pipeline rank.
        micro_batch: sequences per micro-batch.
        global_batch: sequences per step (over all data-parallel replicas).
        seq_len: tokens per sequence.
        zero: ZeRO stage (0 none, 1 optimizer state, 2 + gradients,
            3 + parameters = FSDP).
        dp_shard: hybrid sharding (HSDP): the data-parallel ranks (times cp) one ZeRO/FSDP
            shard group spans, consecutive in dp; the ``dp / dp_shard`` groups hold the
            same shards (replicas). Parameters are all-gathered and gradients
            reduce-scattered within the shard group, then each rank all-reduces its
            1/(dp_shard*cp) of the gradients with the ranks holding the same shard in the
            other groups, and optimizer state is divided by ``dp_shard * cp``, not
            ``dp * cp``: PyTorch FSDP ``ShardingStrategy.HYBRID_SHARD`` / FSDP2
            ``fully_shard(mesh=2-D (replicate, shard))`` (torchtitan
            ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``),
            Megatron-Core ``--num-distributed-optimizer-instances`` (dp_shard = dp /
            instances), MaxText/Paxml meshes with an FSDP axis smaller than DP. 0 (default)
            or dp: one shard group over all of dp. Needs ZeRO >= 1 when it splits dp.
        sequence_parallel: shard LayerNorm/dropout activations over TP
            (Korthikanti et al. 2022); TP all-reduces become reduce-scatter +
            all-gather.
        recompute: activation recomputation ``none``, ``selective`` (attention
            core only) or ``full`` (whole layer, from its input).
        schedule: pipeline schedule (one of :data:`SCHEDULES`).
        dtype: compute dtype of matmuls.
        flash_attention: fused attention kernels (FlashAttention); False for
            the unfused attention of Megatron-LM 2021, which materialises the
            s x s scores.
        grad_bucket_bytes: gradient bucket size for DP reduction (bytes).
        overlap_grad_reduce: overlap DP gradient reduction with backward.
        overlap_param_gather: ZeRO-1/2: all-gather the updated parameters layer by
            layer as the next step's first forward reaches them (Megatron-LM
            ``--overlap-param-gather``) instead of after the optimizer step.
        grad_reduce_dtype: dtype gradients accumulate and are reduced in over data
            parallelism: ``bf16``, or ``fp32`` (Megatron ``grad_reduce_in_fp32``, NeMo's
            default in BF16 recipes; PyTorch FSDP ``reduce_dtype=float32``).
        tp_comm_overlap: how TP communication meets compute: ``none`` (every
            collective blocks the compute stream: Megatron-LM 2021), ``async``
            (Megatron-Core: the column-parallel backward's input all-gather and
            gradient reduce-scatter overlap its GEMMs) or ``userbuffers`` (Transformer
            Engine pipelines every TP collective with its GEMM: ``--tp-comm-overlap``);
            PyTorch DTensor TP (torchtitan): ``dtensor`` (every collective blocks, and
            the column-parallel backward reuses the gathered input autograd saved
            instead of gathering it again) or ``symmetric_memory`` (torchtitan's
            AsyncTP: each all-gather/GEMM and GEMM/reduce-scatter pair micro-pipelined
            over symmetric memory with copy-engine transfers).
        recompute_layers: with ``recompute = "full"``, recompute only this many layers
            of each virtual stage (Megatron ``--recompute-method block
            --recompute-num-layers``); 0 = all of them.
        attention_impl: the fused attention kernel the stack runs (``auto``: Transformer
            Engine's choice, cuDNN on Hopper and newer, FA2 on Ampere; ``fa1``/``fa2``/
            ``fa3``/``cudnn``/``triton``); ignored with ``flash_attention`` False.
        cp_comm_type: how context-parallel attention moves K/V
            (:data:`strategies.model_costs.CP_COMM_TYPES`): ``p2p`` (Transformer Engine's
            ring, Megatron-Core ``--cp-comm-type p2p``), ``all_gather`` (its
            all-gather variant, ``--cp-comm-type allgather``), ``torch_allgather`` or
            ``torch_alltoall`` (PyTorch ``context_parallel`` with ``rotate_method``
            ``allgather``/``alltoall``, what torchtitan runs); ignored with ``cp`` 1.
        fp8_recipe: with dtype ``fp8``, how the stack quantizes
            (:data:`strategies.model_costs.FP8_RECIPES`: the quantization kernels it runs,
            the FP8 weight copies and saved inputs it holds).
        elementwise: ``fused`` (TE/Apex/jit-fused or torch.compile'd norms, activations,
            RoPE) or ``eager`` (PyTorch eager composites: more kernels, more HBM traffic).
        expert_bias_impl: for a model whose routed experts have biases
            (``MoESpec.expert_bias``), how the stack adds them
            (:data:`strategies.model_costs.EXPERT_BIAS_IMPLS`): ``megatron`` (the up bias in
            the grouped GEMM's epilogue, the down bias per expert in eager PyTorch,
            Megatron-Core ``TEGroupedMLP._apply_bias``) or ``eager`` (both per expert,
            NeMo AutoModel ``GroupedExpertsDeepEP``).
        host_issue: how the CPU issues kernels, for the host-bound time of small kernels:
            ``off`` (the host is never the bottleneck: the CPU runs ahead), ``eager``
            (PyTorch eager: the CPU issues every kernel, :data:`hardware.compute.
            HOST_ISSUE_S`, and waits at the dropless MoE dispatcher's device-to-host
            sync), ``partial`` (Megatron-Core/TE partial CUDA graphs ``--cuda-graph-scope
            attn moe_router moe_preprocess``: attention and router replayed, the routed
            experts and dispatch eager), ``compiled`` (torch.compile per transformer
            block, torchtitan's ``apply_compile``: Inductor's generated wrapper launches the
            layers' kernels at ``HOST_ISSUE_S["compiled"]`` each, no Python op, autograd
            or dispatcher layer per op; the embedding, output layer, optimizer and the
            data-, pipeline-, context- and expert-parallel collectives stay eager) or
            ``graphed`` (whole layers replayed; no host cost).
        layer_impl: what the linear layers and attention are built of
            (:data:`LAYER_IMPLS`): ``te`` (Transformer Engine modules, Megatron-Core's
            default ``--transformer-impl transformer_engine``: each module call costs the
            CPU ``hardware.compute.HOST_MODULE_S`` beyond its launches) or ``torch``
            (``torch.nn.Linear``, Megatron's ``local`` layers, torchao's Float8Linear:
            only the launches); read only when the host is modelled.
        cross_entropy: the loss implementation: ``megatron`` (Megatron-Core's fp32
            vocab-parallel loss, its default), ``fused`` (gradient written into the bf16
            logits: TE ``--cross-entropy-fusion-impl te``, flash-attn's fused loss),
            ``eager`` (PyTorch ``F.cross_entropy`` on fp32 logits) or ``eager_bf16``
            (PyTorch ``F.cross_entropy`` on the bf16 logits, NeMo AutoModel's
            ``MaskedCrossEntropy(fp32_upcast=False)``).
        optimizer_impl: Adam as ``fused`` (one multi-tensor kernel: Apex/TE FusedAdam),
            ``foreach`` (torch's multi-tensor AdamW, 8 passes) or ``for-loop`` (per tensor).
        store_param_remainders: the distributed optimizer keeps fp32 master weights as
            16-bit remainders of the bf16 weights (Megatron-Core): 10 instead of 12 optimizer
            bytes per parameter with ZeRO >= 1.
        fsdp_fp32_params: PyTorch FSDP2 with a bf16 ``MixedPrecisionPolicy`` over fp32
            parameters: the fp32 sharded parameters are the optimizer's master weights
            (4 weight bytes per parameter, 8 optimizer bytes: Adam's two moments; the bf16
            copies exist only gathered). Needs ZeRO-3.
        optimizer_moments_dtype: dtype of Adam's two moments, ``fp32`` (4 bytes each) or
            ``bf16`` (2 each): Apex ``DistributedFusedAdam(dtype=...)``, Megatron-Core's
            ``exp_avg_dtype``/``exp_avg_sq_dtype``, DeepSeek-V3's BF16 moments.
        master_weights_dtype: the optimizer's master copy of the weights: ``fp32`` (4
            bytes; 2 with ``store_param_remainders``), ``bf16`` (2) or ``none`` (the model's
            own weights are updated: Apex ``DistributedFusedAdam(store_params=False)``).
        fp8_params: fp8 plans hold the linear layers' weights only in FP8 (Transformer
            Engine ``fp8_model_init``: the FP8 weight and its cached transpose, 2 bytes per
            parameter) instead of bf16 weights plus TE's cached FP8 copies.
        amax_reduction: with dtype ``fp8`` and ``fp8_recipe`` ``te-delayed``, who reduces
            the amaxes (:data:`AMAX_REDUCTIONS`): ``megatron`` -- Transformer Engine at
            every exit of the ``fp8_autocast`` region Megatron-Core wraps around each
            model chunk's forward, and when that region's backward ends (a blocking fp32
            MAX all-reduce on the compute stream, axis ``amax``); ``none`` -- no such
            collective (JAX stacks).
        tp_only_amax_red: Megatron-Core ``--tp-only-amax-red``: the amax all-reduce runs
            over the TP x CP group instead of TP x DP x CP
            (``parallel_state.get_amax_reduction_group(with_context_parallel=True,
            tp_only_amax_red=...)``).
        tp_comm_fp8_reduce_scatter: the TE userbuffers forward reduce-scatters
            (:data:`UB_PIPELINED_REDUCE_SCATTERS`: ``proj_fprop``, the attention
            out-projection's; ``fc2_fprop``, the MLP down projection's) whose buffer is
            FP8: the GEMM writes its output in FP8 and the reduce-scatter moves 1 byte per
            element, reduced into bf16 (transformer_engine/pytorch/module/base.py
            ``initialize_ub``: ``fp8_buf = (name in layers_all_gather_overlap) or
            (cfg.get("fp8_buf") and name in methods["pipeline"])``, ``buffer_dtype =
            torch.uint8`` with FP8; TE 1.x linear.py writes the GEMM1_OUTPUT FP8 meta into
            it, TE 2.x ``Linear.forward`` sets ``fp8_output`` when ``is_fp8_ubuf()``). Set
            per layer by a userbuffers config's ``fp8_buf`` (NeMo's ``PipelineOverlapCfg(...,
            fp8_buf=True)``, the NeMo launcher's ``ub_cfg_*.yaml`` ``fp8_buf: 1``). Needs
            dtype fp8, ``tp_comm_overlap`` userbuffers and a per-tensor recipe
            (:data:`UB_FP8_REDUCE_SCATTER_RECIPES`); empty (default): bf16, TE's default.
        fp8_swiglu_inputs: the routed experts' SwiGLU inputs (fc1 outputs) are saved in
            FP8 for the backward, 1 byte per element (DeepSeek-V3, arXiv 2412.19437
            Section 3.3.3).
        e5m6_attention_output: the attention output (the out-projection's input) is saved
            once in the E5M6 format, 1.5 bytes per element, for both the attention and the
            out-projection backward, instead of bf16 plus TE's FP8 copy (DeepSeek-V3,
            Section 3.3.3).
        grad_reduce_every_microbatch: reduce-scatter the gradients after every
            micro-batch's backward, not only the last one's: PyTorch FSDP v1 outside
            ``no_sync()`` (Composer's trainer, whose ``ddp_sync_context`` skips
            ``no_sync`` for FSDP), each shard accumulating the reduced gradients. Needs
            ZeRO 2 or 3, overlapped gradient reduction and no pipeline parallelism.
        xla_scan_carry_copies: the layers run as one scanned layer (``jax.lax.scan``,
            an XLA while loop) whose FSDP collectives XLA's collective pipeliner moves one
            iteration away (``--xla_gpu_enable_pipelined_all_gather`` /
            ``_reduce_scatter``: the next layer's parameter all-gather issued in this
            iteration, this layer's gradient reduce-scatter in the next;
            xla/service/collective_pipeliner.h), without while-loop double buffering
            (``--xla_gpu_enable_while_loop_double_buffering=false``). The pipelined values
            are then loop-carried buffers that the loop body reads while the collective
            writes (or writes while it reads), and copy insertion copies them once per
            iteration: a device-to-device copy on the compute stream of each layer's
            gathered parameters (every forward and backward) and of its unreduced
            gradients (every backward). Double buffering (unrolling by two) removes these
            copies (openxla/xla PR #5473: "some of the additional copies that result from
            potential read-after-write hazards will be removed", savings "proportional to
            sizes of weights and number of layers"; PR #10297: "the memcpies (which this
            pass is designed to eliminate)"). Needs ZeRO 3 over more than one rank and
            every backward reducing its gradients (one micro-batch per step, or
            ``grad_reduce_every_microbatch``). False (default): no copies (double
            buffering on, or the layers not scanned).
        comm_sm_contention: NCCL kernels overlapped with compute (data-parallel
            reduce-scatters and gathers, EP all-to-alls, CP ring exchanges, pipeline
            send/recvs) hold one SM per channel for as long as they run, and compute
            kernels beside them get the SMs left (:func:`hardware.cost.shared_sm_ns`);
            False (default): overlapped communication is free for the compute it
            overlaps. Opt-in: on the published rows it moves dense p90 16.1 -> 15.6 % and
            bias -1.9 -> -1.2 % but the median 5.7 -> 5.9 % (dgxc 3.8 -> 4.2 %), and it
            does not produce dgxc's error growth with GPU count (the shift is about the
            same at 64 and 2,048 GPUs); see the branch's commit message.
        nccl_max_ctas: most CTAs (SMs) one NCCL kernel holds (NCCL_MAX_CTAS, or a
            framework pinning its communicator's ``maxCTAs``); 0: NCCL's default, one per
            channel it runs at that size (the cost model's channel count).
        recompute_early_stop: with ``recompute = "full"``, the recompute of a layer stops
            once it has re-packed the last tensor the layer's backward saved: PyTorch's
            non-reentrant ``torch.utils.checkpoint`` from 2.1 on (``early_stop`` default
            True, pytorch PR #96866; torchtitan's and other ``checkpoint_wrapper`` users').
            An ATen ``mm`` saves its inputs before it runs, so a layer ending in a plain
            ``torch.nn.Linear`` (the MLP down projection) and a residual add does not
            re-run that GEMM (:func:`strategies.lowering.early_stop_end`). False: the
            whole forward re-runs (Megatron's ``CheckpointFunction``, reentrant
            checkpointing, PyTorch <= 2.0).
        recompute_modules: with ``recompute = "selective"``, the Megatron-Core
            ``--recompute-modules`` re-run in the backward (:data:`strategies.model_costs.
            RECOMPUTE_MODULES`; empty: ``core_attn``, Megatron's default), or one whole-layer
            policy alone: torchtitan's ``op_sac`` or a JAX remat policy (``jax_full``,
            ``jax_save_qkv``, ``jax_save_qkv_out``: :data:`strategies.model_costs.
            JAX_REMAT_POLICIES`).
        activation_offload_layers: layers per pipeline rank whose saved activations go to
            host memory (Megatron-Core ``cpu_offloading_num_layers``); the copies run on
            their own stream beside compute and are not timed.
        layers_per_stage: explicit split of layers over pp * vpp stages
            (None = :func:`stage_layer_counts`: even, or balanced with the
            first and last stages one layer lighter).
        order: rank order, fastest-varying axis first.
        dp_mode: how data-parallel replicas combine gradients: ``allreduce``
            (collectives among the replicas), or parameter servers:
            ``ps-sync`` (every server waits for all workers' pushes, then
            updates: BSP), ``ps-async`` (a server applies each push as it
            arrives and answers that worker at once) or ``ps-stale`` (bounded
            staleness: a worker may compute step t+1 with the parameters of
            step t - staleness). Parameter-server modes need tp = pp = cp =
            ep = 1 and zero = 0 (strategies.param_server).
        ps_servers: parameter-server shards; 0 = one per worker node.
        ps_placement: ``dedicated`` (servers on extra nodes after the
            workers, one per GPU slot) or ``colocated`` (shard s on worker
            rank floor(s * dp / ps_servers), sharing its GPU and NIC).
        staleness: the ``ps-stale`` bound, in steps (0 = ps-sync).
        ps_steps: consecutive steps simulated in parameter-server modes
            (async and stale need >= 2 to show their effect).
    """

    dp: int = _field(1, "Data-parallel size.", search="derived",
                     minimum=1)
    tp: int = _field(1, "Tensor-parallel size.", aliases=("--tensor-model-parallel-size",),
                     search="list", minimum=1)
    pp: int = _field(1, "Pipeline-parallel size.",
                     aliases=("--pipeline-model-parallel-size",), search="list", minimum=1)
    cp: int = _field(1, "Context-parallel size.", aliases=("--context-parallel-size",),
                     search="list", minimum=1)
    ep: int = _field(1, "Expert-parallel size (MoE; expert_tp*ep divides tp*cp*dp).",
                     aliases=("--expert-model-parallel-size",), search="list", minimum=1)
    expert_tp: int = _field(0, "Expert tensor-parallel size (MoE; 0: the same as tp).",
                            aliases=("--expert-tensor-parallel-size",), minimum=0)
    moe_dispatcher: str = _field("alltoall", "MoE token dispatcher: alltoall, allgather or "
                                             "deepep.",
                                 aliases=("--moe-token-dispatcher-type",),
                                 choices=lambda: MOE_DISPATCHERS)
    moe_dispatch_fp8: bool = _field(False, "Dispatch MoE tokens in FP8 (the combine stays "
                                           "bf16).")
    moe_a2a_overlap: bool = _field(False, "Overlap one micro-batch's forward with another's "
                                          "backward, hiding each one's expert all-to-all "
                                          "(Megatron --overlap-moe-expert-parallel-comm).",
                                   aliases=("--overlap-moe-expert-parallel-comm",))
    moe_expert_load: str = _field("uniform", "Router load over the experts: uniform, "
                                             "zipf:<s>, or a file of token counts per expert.")
    moe_capacity_factor: str = _field("", "Expert capacity factor: a number, dropless, or "
                                          "empty for the model's.",
                                      aliases=("--moe-expert-capacity-factor",))
    moe_pad_to_capacity: bool = _field(False, "Pad every expert's input to its capacity.",
                                       aliases=("--moe-pad-expert-input-to-capacity",))
    vpp: int = _field(1, "Virtual pipeline stages per rank; > 1 implies the interleaved "
                         "schedule unless one is given.",
                      aliases=("--virtual-pipeline-model-parallel-size",), search="list",
                      minimum=1)
    micro_batch: int = _field(1, "Sequences per micro-batch.", aliases=("--micro-batch-size",),
                              search="list", minimum=1)
    global_batch: int = _field(1, "Sequences per step over all replicas.",
                               aliases=("--global-batch-size",), minimum=1)
    seq_len: int = _field(2048, "Tokens per sequence.", aliases=("--seq-length",), minimum=1)
    zero: int = _field(1, "ZeRO stage (3 = FSDP).", search="list",
                       choices=lambda: ZERO_STAGES)
    dp_shard: int = _field(0, "Data-parallel ranks a ZeRO/FSDP shard group spans; the "
                              "dp/dp_shard groups replicate it (HSDP; 0: all of dp).",
                           minimum=0)
    sequence_parallel: bool = _field(True, "Sequence parallelism with TP.")
    recompute: str = _field("none", "Activation recomputation.", search="list",
                            choices=lambda: RECOMPUTE)
    schedule: str = _field("1f1b", "Pipeline schedule.", search="list",
                           choices=lambda: SCHEDULES)
    dtype: str = _field("bf16", "Compute dtype of the matmuls.", choices=lambda: PLAN_DTYPES)
    flash_attention: bool = _field(True, "Fused attention kernels (FlashAttention).")
    grad_bucket_bytes: int = _field(40_000_000, "Gradient bucket of the DP reduction (bytes).",
                                    minimum=1)
    overlap_grad_reduce: bool = _field(True, "Overlap the DP gradient reduction with the "
                                             "backward pass.")
    overlap_param_gather: bool = _field(True, "ZeRO-1/2: gather the updated parameters layer by "
                                              "layer in the next step's first forward "
                                              "(Megatron --overlap-param-gather).")
    grad_reduce_dtype: str = _field("bf16", "Dtype gradients accumulate and are reduced in "
                                            "over data parallelism.",
                                    choices=lambda: GRAD_REDUCE_DTYPES)
    tp_comm_overlap: str = _field("async", "TP communication against compute: none (blocking), "
                                           "async (Megatron-Core's overlapped column-parallel "
                                           "backward), userbuffers (TE pipelines every TP "
                                           "collective with its GEMM), dtensor (PyTorch "
                                           "DTensor TP: blocking, gathered input saved for "
                                           "the backward) or symmetric_memory (PyTorch "
                                           "AsyncTP: micro-pipelined over symmetric memory).",
                                  choices=lambda: TP_COMM_OVERLAPS)
    recompute_layers: int = _field(0, "With full recompute: layers of each virtual stage to "
                                      "recompute (0 = all; Megatron --recompute-num-layers).",
                                   minimum=0)
    attention_impl: str = _field("auto", "Fused attention kernel (auto: Transformer Engine's "
                                         "choice for the GPU).",
                                 choices=lambda: ATTENTION_CHOICES)
    cp_comm_type: str = _field("p2p", "Context-parallel K/V exchange: p2p (Transformer "
                                      "Engine's ring), all_gather (its all-gather variant), "
                                      "torch_allgather or torch_alltoall "
                                      "(PyTorch context_parallel rotate methods).",
                               choices=lambda: model_costs.CP_COMM_TYPES)
    fp8_recipe: str = _field(model_costs.DEFAULT_FP8_RECIPE, "With dtype fp8: the quantization "
                                                             "recipe.",
                             choices=lambda: tuple(model_costs.FP8_RECIPES))
    elementwise: str = _field("fused", "Norms, activations and RoPE as fused kernels or as "
                                       "eager PyTorch composites.",
                              choices=lambda: model_costs.ELEMENTWISE_MODES)
    host_issue: str = _field("off", "How the CPU issues kernels: off (never the bottleneck), "
                                    "eager, compiled (torch.compile'd blocks), partial "
                                    "(CUDA graphs of attention and router) or graphed.",
                             choices=lambda: HOST_ISSUE_MODES)
    layer_impl: str = _field("te", "Layers as Transformer Engine modules (te: their CPU "
                                   "bookkeeping per call is priced) or torch / Megatron "
                                   "local modules (torch).",
                             choices=lambda: LAYER_IMPLS)
    expert_bias_impl: str = _field("megatron", "With expert biases (gpt-oss): megatron "
                                               "(Megatron-Core TEGroupedMLP: up bias in the "
                                               "grouped GEMM, down bias added eagerly per "
                                               "expert) or eager (both added eagerly per "
                                               "expert, NeMo AutoModel's DeepEP experts).",
                                   choices=lambda: model_costs.EXPERT_BIAS_IMPLS)
    cross_entropy: str = _field("megatron", "Loss implementation: megatron (fp32 "
                                            "vocab-parallel), fused, eager (fp32 logits) "
                                            "or eager_bf16 (bf16 logits).",
                                choices=lambda: model_costs.CROSS_ENTROPY_IMPLS)
    optimizer_impl: str = _field("fused", "Adam implementation: fused, foreach or for-loop.",
                                 choices=lambda: model_costs.ADAM_IMPLEMENTATIONS)
    store_param_remainders: bool = _field(False, "Keep fp32 master weights as 16-bit "
                                                 "remainders of the bf16 weights (ZeRO >= 1).")
    fsdp_fp32_params: bool = _field(False, "PyTorch FSDP2 over fp32 parameters: the sharded "
                                           "fp32 parameters are the optimizer's master "
                                           "weights (ZeRO-3).")
    optimizer_moments_dtype: str = _field("fp32", "Dtype of Adam's two moments: fp32 or "
                                                  "bf16.",
                                          choices=lambda: OPTIMIZER_MOMENT_DTYPES)
    master_weights_dtype: str = _field("fp32", "The optimizer's master weights: fp32, bf16 "
                                               "or none (the model's weights are updated).",
                                       choices=lambda: MASTER_WEIGHT_DTYPES)
    fp8_params: bool = _field(False, "With dtype fp8: linear-layer weights held only in FP8 "
                                     "(with their transpose), no bf16 copy.")
    amax_reduction: str = _field("megatron", "With fp8_recipe te-delayed: megatron (TE "
                                             "all-reduces the amaxes at each model chunk's "
                                             "fp8_autocast exit and backward end) or none "
                                             "(JAX stacks: no separate collective).",
                                 choices=lambda: AMAX_REDUCTIONS)
    tp_only_amax_red: bool = _field(False, "Reduce FP8 AMAX only in TP or TP-CP domain "
                                           "(Megatron-Core --tp-only-amax-red).")
    tp_comm_fp8_reduce_scatter: tuple[str, ...] = _field(
        (), "TE userbuffers forward reduce-scatters with an FP8 buffer (fp8_buf): "
            "proj_fprop, fc2_fprop (empty: bf16).")
    fp8_swiglu_inputs: bool = _field(False, "Routed experts' SwiGLU inputs saved in FP8 for "
                                            "the backward.")
    e5m6_attention_output: bool = _field(False, "The attention output saved once in E5M6 "
                                                "(1.5 bytes) for its backward.")
    grad_reduce_every_microbatch: bool = _field(
        False, "Reduce-scatter gradients after every micro-batch (FSDP v1 outside "
               "no_sync), not only the last one (ZeRO 2/3, pp 1).")
    xla_scan_carry_copies: bool = _field(
        False, "Scanned layers under XLA's collective pipeliner without while-loop double "
               "buffering: each layer's gathered parameters and unreduced gradients are "
               "copied once per loop iteration on the compute stream (ZeRO 3).")
    comm_sm_contention: bool = _field(False, "Overlapped NCCL kernels hold one SM per "
                                            "channel; compute beside them runs on the "
                                            "SMs left.")
    nccl_max_ctas: int = _field(0, "Most CTAs (SMs) an NCCL kernel holds (NCCL_MAX_CTAS; "
                                   "0: NCCL's default, one per channel).", minimum=0)
    recompute_early_stop: bool = _field(
        False, "Full recompute stops at the last tensor the layer's backward saved "
               "(PyTorch >= 2.1 non-reentrant checkpoint early stop).")
    recompute_modules: tuple[str, ...] = _field(
        (), "With selective recompute: modules re-run in the backward, e.g. "
            "core_attn,mlp (empty: core_attn).")
    activation_offload_layers: int = _field(0, "Layers per pipeline rank whose activations "
                                               "are offloaded to host memory.", minimum=0)
    layers_per_stage: tuple[int, ...] | None = _field(
        None, "Uneven split of the layers over pp*vpp stages, e.g. 7,8,8,7 (none: "
              "balanced).")
    order: tuple[str, ...] = _field(("tp", "cp", "dp", "pp"), "Rank order, fastest-varying "
                                    "axis first: a permutation of tp,cp,dp,pp.")
    dp_mode: str = _field("allreduce", "Data parallelism: all-reduce, or parameter servers "
                                       "(need tp = pp = cp = 1).", choices=lambda: DP_MODES)
    ps_servers: int = _field(0, "Parameter-server shards (0 = one per worker node).",
                             minimum=0)
    ps_placement: str = _field("dedicated", "Parameter servers on extra nodes (dedicated) or "
                                            "on worker GPUs (colocated).",
                               choices=lambda: PS_PLACEMENTS)
    staleness: int = _field(0, "ps-stale: steps a worker may run ahead of its parameters.",
                            minimum=0)
    ps_steps: int = _field(1, "Steps simulated in parameter-server modes (the step time is "
                              "the steady-state interval).", minimum=1)

    def __post_init__(self) -> None:
        """Check every rule that does not depend on the model (one line per problem).

        Raises:
            ValueError: naming the field, its value and what is valid.
        """
        for name in ("layers_per_stage", "order", "recompute_modules",
                     "tp_comm_fp8_reduce_scatter"):  # lists become tuples
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        check_plan_fields(self)

    @property
    def world_size(self) -> int:
        """GPUs the plan uses: dp * tp * pp * cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_dp(self) -> int:
        """Data-parallel ranks of one ZeRO/FSDP shard group: ``dp_shard``, or dp (0)."""
        return self.dp_shard or self.dp

    @property
    def dp_replicas(self) -> int:
        """Shard groups holding the same shards (HSDP replicas): ``dp / shard_dp``."""
        return self.dp // self.shard_dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per pipeline: global / (dp * micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


def check_plan_fields(plan: ParallelPlan) -> None:
    """The model-independent rules of a plan, in field order, then between fields.

    Raises:
        ValueError: one line naming the field, its value and what is valid.
    """
    for spec in PLAN_FIELDS:
        value = getattr(plan, spec.name)
        minimum, choices = spec.metadata["minimum"], spec.metadata["choices"]
        if minimum is not None and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < minimum):
            raise ValueError(f"{spec.name}: {value!r} is not valid; give a whole number >= "
                             f"{minimum}")
        if choices is not None and (value not in choices() or isinstance(value, bool)):
            raise ValueError(f"{spec.name}: {value!r} is not valid; valid: "
                             f"{', '.join(map(str, choices()))}")
        if spec.type in (bool, "bool") and not isinstance(value, bool):
            raise ValueError(f"{spec.name}: {value!r} is not valid; give true or false")
    if plan.sequence_parallel and plan.tp > 1 and plan.seq_len % plan.tp:
        raise ValueError(f"tp: {plan.tp} does not divide seq_len {plan.seq_len} (sequence "
                         "parallelism splits the sequence over tp); valid: a divisor of the "
                         "sequence length, or sequence_parallel false")
    if plan.seq_len % (2 * plan.cp) and plan.cp > 1:
        raise ValueError(f"seq_len: {plan.seq_len} is not divisible by 2*cp = {2 * plan.cp} "
                         "(context parallelism splits the sequence in 2*cp load-balanced chunks)")
    if plan.layers_per_stage is not None:
        split = tuple(plan.layers_per_stage)
        stages = plan.pp * plan.vpp
        ends = {0, stages - 1}
        if len(split) != stages or any(
                isinstance(n, bool) or not isinstance(n, int) or n < (0 if i in ends else 1)
                for i, n in enumerate(split)):
            raise ValueError(f"layers_per_stage: {split} is not valid; give {stages} layer "
                             "counts (pp*vpp), positive but for the first and last stage (which "
                             "hold the embedding and the loss and may hold no layer)")
    if sorted(plan.order) != sorted(AXES):
        raise ValueError(f"order: {tuple(plan.order)} is not valid; give a permutation of "
                         f"{', '.join(AXES)}")
    unknown = sorted(set(plan.recompute_modules) - set(model_costs.RECOMPUTE_MODULES))
    if unknown:
        raise ValueError(f"recompute_modules: {', '.join(map(str, unknown))} not known; valid: "
                         f"{', '.join(model_costs.RECOMPUTE_MODULES)}")
    policies = [m for m in plan.recompute_modules
                if m in model_costs.JAX_REMAT_POLICIES or m == "op_sac"]
    if policies and len(plan.recompute_modules) > 1:
        raise ValueError(f"recompute_modules: {','.join(plan.recompute_modules)} is not valid; "
                         f"{policies[0]} is a whole-layer policy and stands alone")
    if plan.recompute_modules and plan.recompute != "selective":
        raise ValueError(f"recompute_modules: {','.join(plan.recompute_modules)} needs recompute "
                         f"'selective', not {plan.recompute!r}; give no recompute_modules")
    if plan.recompute_layers and plan.recompute != "full":
        raise ValueError(f"recompute_layers: {plan.recompute_layers} needs recompute 'full', "
                         f"not {plan.recompute!r}; give recompute_layers 0")
    if plan.fsdp_fp32_params and plan.zero != 3:
        raise ValueError(f"fsdp_fp32_params: true needs zero 3 (FSDP2 shards the parameters), "
                         f"not zero {plan.zero}; give fsdp_fp32_params false")
    if plan.fsdp_fp32_params and plan.master_weights_dtype != "fp32":
        raise ValueError(f"master_weights_dtype: {plan.master_weights_dtype!r} with "
                         f"fsdp_fp32_params (the fp32 parameters are the master weights); "
                         f"give master_weights_dtype fp32")
    if plan.grad_reduce_every_microbatch and (plan.zero not in (2, 3) or plan.pp != 1
                                              or not plan.overlap_grad_reduce):
        raise ValueError(f"grad_reduce_every_microbatch: true needs zero 2 or 3, pp 1 and "
                         f"overlap_grad_reduce true, not zero {plan.zero}, pp {plan.pp}, "
                         f"overlap_grad_reduce {plan.overlap_grad_reduce}; give "
                         f"grad_reduce_every_microbatch false")
    if plan.xla_scan_carry_copies and (plan.zero != 3 or plan.shard_dp * plan.cp == 1 or not (
            plan.num_microbatches == 1 or plan.grad_reduce_every_microbatch)):
        raise ValueError(f"xla_scan_carry_copies: true needs zero 3 over a shard group of "
                         f"dp_shard*cp > 1 ranks and every backward reducing its gradients (1 "
                         f"micro-batch or grad_reduce_every_microbatch), not zero {plan.zero}, "
                         f"shard group {plan.shard_dp * plan.cp}, {plan.num_microbatches} micro-batches, "
                         f"grad_reduce_every_microbatch {plan.grad_reduce_every_microbatch}; "
                         f"give xla_scan_carry_copies false")
    if plan.fp8_params and plan.dtype != "fp8":
        raise ValueError(f"fp8_params: true needs dtype fp8 (FP8 primary weights), not dtype "
                         f"{plan.dtype}; give fp8_params false")
    if plan.tp_comm_fp8_reduce_scatter:
        fp8_rs = ",".join(map(str, plan.tp_comm_fp8_reduce_scatter))
        unknown = sorted(set(plan.tp_comm_fp8_reduce_scatter) - set(UB_PIPELINED_REDUCE_SCATTERS))
        if unknown:
            raise ValueError(f"tp_comm_fp8_reduce_scatter: {fp8_rs} is not valid; valid: "
                             f"{', '.join(UB_PIPELINED_REDUCE_SCATTERS)}")
        if not (plan.dtype == "fp8" and plan.tp_comm_overlap == "userbuffers"
                and plan.fp8_recipe in UB_FP8_REDUCE_SCATTER_RECIPES):
            raise ValueError(f"tp_comm_fp8_reduce_scatter: {fp8_rs} needs dtype fp8, "
                             f"tp_comm_overlap userbuffers and fp8_recipe "
                             f"{' or '.join(UB_FP8_REDUCE_SCATTER_RECIPES)} (TE's FP8 userbuffers), not "
                             f"dtype {plan.dtype}, {plan.tp_comm_overlap}, {plan.fp8_recipe}; "
                             f"give it empty")
    if plan.dp_shard and plan.dp % plan.dp_shard:
        raise ValueError(f"dp_shard: {plan.dp_shard} does not divide dp {plan.dp}; valid: a "
                         f"divisor of {plan.dp}, or 0 (one shard group over all of dp)")
    if plan.dp_replicas > 1 and plan.shard_dp * plan.cp == 1:
        raise ValueError(f"dp_shard: 1 with cp 1 shards nothing (every rank would hold the "
                         f"whole model); give dp_shard 0 or a divisor of dp {plan.dp} above 1, "
                         f"or zero 0 for plain data parallelism")
    if plan.dp_replicas > 1 and plan.zero == 0:
        raise ValueError(f"dp_shard: {plan.dp_shard} (of dp {plan.dp}) needs zero >= 1 (it "
                         "sizes the ZeRO/FSDP shard groups; ZeRO 0 shards nothing); give "
                         f"dp_shard 0 or zero 1, 2 or 3")
    if plan.nccl_max_ctas and not plan.comm_sm_contention:
        raise ValueError(f"nccl_max_ctas: {plan.nccl_max_ctas} needs comm_sm_contention true "
                         "(it caps the SMs an NCCL kernel takes from compute); give 0")
    _check_moe_fields(plan)
    _validate_dp_mode(plan)


def capacity_factor(plan: ParallelPlan, model_capacity_factor: float) -> float | None:
    """The expert capacity factor the plan runs with (None: dropless): the plan's
    ``moe_capacity_factor`` when given, else the model's (0 there means dropless)."""
    text = plan.moe_capacity_factor
    if text == "dropless" or (not text and model_capacity_factor <= 0):
        return None
    return float(text) if text else float(model_capacity_factor)


def _check_moe_fields(plan: ParallelPlan) -> None:
    """The MoE fields together (model-independent; one line per problem)."""
    text = plan.moe_capacity_factor
    if text not in ("", "dropless"):
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise ValueError(f"moe_capacity_factor: {text!r} is not valid; give a number > 0, "
                             "dropless, or nothing (the model's)")
    if plan.moe_pad_to_capacity and text == "dropless":
        raise ValueError("moe_pad_to_capacity: padding needs a capacity; give "
                         "moe_capacity_factor a number, or moe_pad_to_capacity false")
    check_expert_load_spec(plan.moe_expert_load)
    etp = plan.expert_tp or plan.tp
    stage_ranks = plan.tp * plan.cp * plan.dp
    if stage_ranks % (etp * plan.ep):
        raise ValueError(f"ep: expert_tp {etp} x ep {plan.ep} = {etp * plan.ep} does not divide "
                         f"the {stage_ranks} ranks of a pipeline stage (tp {plan.tp} x cp "
                         f"{plan.cp} x dp {plan.dp}); valid: expert_tp*ep dividing tp*cp*dp")
    if plan.moe_a2a_overlap and plan.pp > 1 and plan.vpp < 2:
        raise ValueError(f"moe_a2a_overlap: needs virtual pipeline stages with pipeline "
                         f"parallelism (pp {plan.pp}, vpp {plan.vpp}), as Megatron-Core's "
                         "combined 1F1B; give vpp >= 2 or moe_a2a_overlap false")


def validate_plan(plan: ParallelPlan, *, num_layers: int, num_heads: int, num_kv_heads: int,
                  num_experts: int = 0, gpus: int | None = None,
                  cluster_gpus: int | None = None, expert_ffn_hidden_size: int = 0) -> None:
    """Reject a plan that cannot run this model on this job, with one line naming the
    field, the value and what would be valid (torchtitan's ParallelDims style: print every
    factor). The plan already checked its own fields when it was built.

    Args:
        plan: the plan.
        num_layers, num_heads, num_kv_heads: of the model.
        num_experts: routed experts of the model (0 for dense).
        expert_ffn_hidden_size: of one routed expert (0: not checked).
        gpus: GPUs the user asked for (must equal dp*tp*pp*cp).
        cluster_gpus: GPUs the cluster has.

    Raises:
        ValueError: for the first problem found.
    """
    factors = f"dp {plan.dp} x tp {plan.tp} x pp {plan.pp} x cp {plan.cp} = {plan.world_size}"
    if gpus is not None and plan.world_size != gpus:
        raise ValueError(f"gpus: {gpus} but the plan uses {factors}; "
                         "make dp*tp*pp*cp equal the GPU count")
    if cluster_gpus is not None and plan.world_size > cluster_gpus:
        raise ValueError(f"gpus: the plan uses {factors} but the cluster has only "
                         f"{cluster_gpus} GPUs; give a smaller plan or a larger cluster")
    if num_heads % plan.tp:
        raise ValueError(f"tp: {plan.tp} does not divide the model's {num_heads} attention heads; "
                         f"valid: a divisor of {num_heads}")
    if num_kv_heads % plan.tp:
        raise ValueError(f"tp: {plan.tp} does not divide the model's {num_kv_heads} key/value heads; "
                         f"valid: a divisor of {num_kv_heads}")
    stages = plan.pp * plan.vpp
    if plan.layers_per_stage is not None:
        split = tuple(plan.layers_per_stage)
        if sum(split) != num_layers:
            raise ValueError(f"layers_per_stage: {split} is not valid; give {stages} positive "
                             f"counts (pp*vpp) summing to the model's {num_layers} layers")
    elif num_layers < stages - 2 or (stages == 2 and num_layers < 1):
        # the first and last stages may hold only the embedding and the loss (Megatron's
        # --account-for-embedding/loss-in-pipeline-split; Llama 3 405B's 126 layers on
        # 128 virtual stages, arXiv 2407.21783 Section 3.3.2)
        raise ValueError(f"pp: {num_layers} layers cannot fill pp {plan.pp} x vpp {plan.vpp} = "
                         f"{stages} stages; valid: pp*vpp <= {num_layers + 2} (the first and "
                         "last stage may hold only the embedding and the loss)")
    # Model-independent, but kept here: tests/test_memory.py builds plans that break it
    # (global batch below dp x micro-batch) to test the memory model.
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise ValueError(f"global_batch: {plan.global_batch} is not divisible by dp {plan.dp} x "
                         f"micro_batch {plan.micro_batch} = {plan.dp * plan.micro_batch}")
    # the schedule object says which shapes it runs (strategies.schedules)
    schedule = get_schedule(plan.schedule)
    try:
        schedule.check(plan.pp, plan.num_microbatches, plan.vpp)
    except ValueError as problem:
        field_name = str(problem).split("=", 1)[0]
        if field_name == "microbatches":
            raise ValueError(f"global_batch: gives {plan.num_microbatches} micro-batches per "
                             f"pipeline, which schedule {plan.schedule!r} rejects: {problem}"
                             ) from None
        raise ValueError(f"{field_name}: {problem}") from None
    if plan.zero == 3 and schedule.placement(plan.pp, plan.vpp).routes > 1:
        raise ValueError(f"zero: 3 is not valid with schedule {plan.schedule!r}, whose two "
                         "copies of every chunk would gather their parameters at different "
                         "times; give zero 0, 1 or 2")
    if plan.dp_replicas > 1 and schedule.placement(plan.pp, plan.vpp).routes > 1:
        raise ValueError(f"dp_shard: {plan.dp_shard} (of dp {plan.dp}) is not supported with "
                         f"schedule {plan.schedule!r}, whose chunks are sharded over both of "
                         "their holders; give dp_shard 0")
    if plan.dp_replicas > 1 and num_experts:
        raise ValueError(f"dp_shard: {plan.dp_shard} (of dp {plan.dp}) is not supported for a "
                         "mixture-of-experts model (expert data parallelism is not split into "
                         "shard groups here); give dp_shard 0")
    if num_experts == 0:
        for name, default in (("ep", 1), ("expert_tp", 0), ("moe_a2a_overlap", False),
                              ("moe_dispatcher", "alltoall"), ("moe_dispatch_fp8", False),
                              ("moe_expert_load", "uniform"), ("moe_capacity_factor", ""),
                              ("moe_pad_to_capacity", False)):
            if getattr(plan, name) != default:
                raise ValueError(f"{name}: {getattr(plan, name)!r} needs a mixture-of-experts "
                                 f"model; give {name} {default!r}")
        return
    if num_experts % plan.ep:
        raise ValueError(f"ep: {plan.ep} does not divide the model's {num_experts} experts; "
                         f"valid: a divisor of {num_experts}")
    etp = plan.expert_tp or plan.tp
    if expert_ffn_hidden_size and expert_ffn_hidden_size % etp:
        raise ValueError(f"expert_tp: {etp} does not divide the experts' FFN size "
                         f"{expert_ffn_hidden_size}; valid: a divisor of it")
    if max(plan.tp, etp) > 1 and not plan.sequence_parallel:
        raise ValueError("sequence_parallel: false is not valid for a mixture-of-experts model "
                         f"with tp {plan.tp} / expert_tp {etp}: Megatron-Core routes each TP "
                         "rank's sequence shard (megatron/training/arguments.py requires it); "
                         "give sequence_parallel true")


def _validate_dp_mode(plan: ParallelPlan) -> None:
    """The parameter-server fields together (one line per problem, naming the field)."""
    if plan.dp_mode == "allreduce":
        for name, default in (("ps_servers", 0), ("ps_placement", "dedicated"), ("staleness", 0),
                              ("ps_steps", 1)):
            if getattr(plan, name) != default:
                raise ValueError(f"{name}: {getattr(plan, name)!r} applies to parameter-server "
                                 f"training only; give dp_mode one of {', '.join(DP_MODES[1:])}, "
                                 f"or {name} {default!r}")
        return
    mode = plan.dp_mode
    if plan.tp * plan.pp * plan.cp != 1:
        raise ValueError(f"dp_mode: {mode!r} needs tp = pp = cp = 1 (got tp {plan.tp}, pp "
                         f"{plan.pp}, cp {plan.cp}): each parameter-server worker is a whole "
                         "model replica on one GPU; give dp_mode 'allreduce' to combine them")
    if plan.ep != 1:
        raise ValueError(f"ep: {plan.ep} is not supported with dp_mode {mode!r}; give ep 1 "
                         "(every worker holds all experts)")
    if plan.zero != 0:
        raise ValueError(f"zero: {plan.zero} is not valid with dp_mode {mode!r}; give zero 0 "
                         "(the servers hold the optimizer state)")
    if plan.ps_placement == "colocated" and plan.ps_servers > plan.dp:
        raise ValueError(f"ps_servers: {plan.ps_servers} colocated servers exceed the {plan.dp} "
                         f"workers (dp); give 0..{plan.dp} or ps_placement 'dedicated'")
    if mode != "ps-stale" and plan.staleness != 0:
        raise ValueError(f"staleness: {plan.staleness} applies to dp_mode 'ps-stale' only "
                         f"(dp_mode is {mode!r}); give staleness 0")
    if mode == "ps-stale" and plan.ps_steps <= plan.staleness:
        raise ValueError(f"ps_steps: {plan.ps_steps} must exceed staleness {plan.staleness} "
                         f"for dp_mode 'ps-stale' to reach a steady state; give ps_steps >= "
                         f"{plan.staleness + 1} (better {plan.staleness + 2} or more)")


#: The plan's fields with their metadata, in declaration order.
PLAN_FIELDS = fields(ParallelPlan)


def plan_from_dict(data: Mapping[str, object]) -> ParallelPlan:
    """The plan whose fields ``data`` gives as JSON values (the inverse of a result's
    embedded plan, ``sim.step._plan_dict``): lists back to tuples; keys that are not plan
    fields (its ``num_microbatches``) ignored."""
    names = {spec.name for spec in PLAN_FIELDS}
    return ParallelPlan(**{name: tuple(value) if isinstance(value, list) else value
                           for name, value in data.items() if name in names})


#: RankLayout.group's tuples by (axis sizes and order, rank, axes), holding at most
#: _GROUP_RANKS_MAX ranks in all (then the table starts again)
_GROUPS: dict[tuple, tuple[int, ...]] = {}
_GROUP_RANKS = 0
_GROUP_RANKS_MAX = 1 << 20


class RankLayout:
    """Coordinates of every rank in a plan, and its communication groups.

    Args:
        plan: the (validated) plan.
    """

    def __init__(self, plan: ParallelPlan) -> None:
        self.plan = plan
        self.sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
        self.strides: dict[str, int] = {}
        stride = 1
        for axis in plan.order:
            self.strides[axis] = stride
            stride *= self.sizes[axis]
        #: what places every rank (the group tables' key)
        self._shape = (plan.tp, plan.cp, plan.dp, plan.pp, tuple(plan.order))

    def coords(self, rank: int) -> dict[str, int]:
        """``{axis: index}`` of a rank."""
        return {a: rank // self.strides[a] % self.sizes[a] for a in AXES}

    def rank(self, **coords: int) -> int:
        """Rank at the given coordinates (missing axes: 0)."""
        return sum(coords.get(a, 0) * self.strides[a] for a in AXES)

    def group(self, rank: int, *axes: str) -> tuple[int, ...]:
        """Ranks that differ from ``rank`` only along ``axes``, in communicator order.

        One tuple object per group of a layout (interned across RankLayouts of plans with
        the same axis sizes and order): the plans of a search ask for the same groups,
        and tables keyed by a group's identity (hardware.cost ``CostModel.collective``)
        then find them without hashing a long tuple."""
        key = (self._shape, rank, axes)
        found = _GROUPS.get(key)
        if found is not None:
            return found
        found = self._group(rank, axes)
        global _GROUP_RANKS
        if _GROUP_RANKS + len(found) > _GROUP_RANKS_MAX:
            _GROUPS.clear()
            _GROUP_RANKS = 0
        _GROUPS[key] = found
        _GROUP_RANKS += len(found)
        return found

    def _group(self, rank: int, axes: tuple[str, ...]) -> tuple[int, ...]:
        """:meth:`group`, computed."""
        base = self.coords(rank)
        first = rank - sum(base[a] * self.strides[a] for a in axes)
        spans = [(self.strides[a], self.sizes[a]) for a in axes if self.sizes[a] > 1]
        if len(spans) == 1:  # one axis: an arithmetic progression (the common case)
            stride, size = spans[0]
            return tuple(range(first, first + stride * size, stride))
        ranks = [first]
        for stride, size in spans:
            ranks = [r + i * stride for i in range(size) for r in ranks]
        return tuple(sorted(ranks))

    # ------------------------------------------------------------ hybrid sharding
    # The shard groups are consecutive in dp, the replicas strided (PyTorch DeviceMesh
    # ``(replicate, shard)``: the shard dimension innermost, torchtitan's ParallelDims
    # ``["dp_replicate", "dp_shard", "cp", "tp"]``; Megatron-Core's
    # ``intra_partial_data_parallel_group_with_cp``: dp*cp/instances consecutive ranks of
    # the data-parallel-with-CP group, megatron/core/parallel_state.py).

    def dp_shard_group(self, rank: int) -> tuple[int, ...]:
        """The ``shard_dp * cp`` ranks that share ``rank``'s ZeRO/FSDP shards (all of
        dp x cp without hybrid sharding: :meth:`group` over dp and cp)."""
        plan = self.plan
        if plan.dp_replicas == 1:
            return self.group(rank, "dp", "cp")
        coords = self.coords(rank)
        first = coords["dp"] // plan.shard_dp * plan.shard_dp
        return tuple(sorted(self.rank(tp=coords["tp"], cp=c, dp=d, pp=coords["pp"])
                            for d in range(first, first + plan.shard_dp)
                            for c in range(plan.cp)))

    def dp_replica_group(self, rank: int) -> tuple[int, ...]:
        """The ``dp / shard_dp`` ranks holding the same shard as ``rank`` (same position
        in their shard groups): they all-reduce it."""
        plan = self.plan
        coords = self.coords(rank)
        offset = coords["dp"] % plan.shard_dp
        return tuple(sorted(self.rank(tp=coords["tp"], cp=coords["cp"], pp=coords["pp"],
                                      dp=offset + i * plan.shard_dp)
                            for i in range(plan.dp_replicas)))

    # ------------------------------------------------------------ expert side
    # Megatron-Core builds the MoE layers' groups from a second rank generator over the
    # same pipeline stages (megatron/core/parallel_state.py, initialize_model_parallel:
    # expert_tensor_parallel_size x expert_model_parallel_size x expert data parallel,
    # order tp-ep-dp, pp outermost): inside a stage, the ranks in the dense order (tp
    # fastest, then cp, then dp) are renumbered local = etp_i + etp*(ep_i + ep*edp_i).

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size (the plan's, or tp)."""
        return self.plan.expert_tp or self.plan.tp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size, ``tp * cp * dp / (expert_tp * ep)``."""
        return self.plan.tp * self.plan.cp * self.plan.dp // (self.expert_tp * self.plan.ep)

    def _local_axes(self) -> list[str]:
        return [a for a in self.plan.order if a != "pp"]

    def _stage_local(self, rank: int) -> int:
        """Position of ``rank`` among its pipeline stage's ranks, in the dense order."""
        coords, local, stride = self.coords(rank), 0, 1
        for axis in self._local_axes():
            local += coords[axis] * stride
            stride *= self.sizes[axis]
        return local

    def _from_stage_local(self, local: int, like: int) -> int:
        """The rank at stage position ``local`` in ``like``'s pipeline stage."""
        coords = {"pp": self.coords(like)["pp"]}
        for axis in self._local_axes():
            coords[axis] = local % self.sizes[axis]
            local //= self.sizes[axis]
        return self.rank(**coords)

    def _expert_group(self, rank: int, varying: str) -> tuple[int, ...]:
        etp, ep, edp = self.expert_tp, self.plan.ep, self.expert_dp
        if (varying == "ep" and ep == 1) or (varying == "etp" and etp == 1):
            # (one member: the rank itself -- its index along that axis is 0, so the
            # loop below maps its own position back to it; a dense model's EP group,
            # asked for every rank)
            return (rank,)
        local = self._stage_local(rank)
        index = {"etp": local % etp, "ep": local // etp % ep, "edp": local // (etp * ep)}
        size = {"etp": etp, "ep": ep, "edp": edp}[varying]
        members = []
        for i in range(size):
            index[varying] = i
            members.append(self._from_stage_local(
                index["etp"] + etp * (index["ep"] + ep * index["edp"]), rank))
        return tuple(members)

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """Expert-parallel group: the ``ep`` ranks that exchange tokens (all-to-all)."""
        return self._expert_group(rank, "ep")

    def expert_tp_group(self, rank: int) -> tuple[int, ...]:
        """Expert tensor-parallel group: the ``expert_tp`` ranks sharing each expert's
        weights (the dispatcher's all-gather and reduce-scatter around the experts)."""
        return self._expert_group(rank, "etp")

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Expert data-parallel group: ranks holding the same expert shards (their
        gradients reduce over it), ``tp * cp * dp / (expert_tp * ep)`` of them."""
        return self._expert_group(rank, "edp")

    def stage_rank(self, pp_index: int, like: int) -> int:
        """The rank at pipeline position ``pp_index`` with ``like``'s other coordinates."""
        coords = self.coords(like)
        coords["pp"] = pp_index
        return self.rank(**coords)


def stage_layer_counts(num_layers: int, plan: ParallelPlan) -> tuple[int, ...]:
    """Layers of each of the ``pp * vpp`` virtual stages.

    The plan's ``layers_per_stage`` when given; else an even split when ``pp * vpp``
    divides the layers; else a balanced split (counts differ by at most one) whose
    lighter stages are the first and the last, which also hold the embedding and the
    output head. That is the split of Llama 3 405B's 126 layers over 16 stages
    (7, 8 x 14, 7; Llama 3 paper, arXiv 2407.21783, Section 3.3.2); over 128 virtual
    stages the first and last hold no layer, only the embedding and the loss (Megatron's
    ``--account-for-embedding-in-pipeline-split`` / ``-loss-``).
    """
    if plan.layers_per_stage is not None:
        return tuple(plan.layers_per_stage)
    stages = plan.pp * plan.vpp
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    # Middle stages take the extra layers first, then the first stage (the head of
    # the last stage is the heavier of the two ends for large vocabularies).
    heavier = list(range(1, stages - 1)) + [0, stages - 1] if stages > 1 else [0]
    for stage in heavier[:extra]:
        counts[stage] += 1
    return tuple(counts)
