"""What one transformer step costs: kernels (FLOPs, HBM bytes), parameters, activations.

Everything here is arithmetic on a :class:`~strategies.model_spec.ModelSpec`; no durations
(the hardware models price the kernels). Units: FLOPs (a multiply-add counts 2), bytes,
parameter counts (elements).

Notation used in the docstrings: ``b`` micro-batch (sequences), ``s`` sequence length,
``h`` hidden size, ``a`` query heads, ``g`` key/value heads, ``d`` head dim, ``f`` FFN hidden
size, ``V`` vocabulary, ``t`` tensor-parallel size, ``c`` context-parallel size, ``e`` element
bytes of the dtype, ``n = b*s/c`` tokens on one rank and ``n_sp = n/t`` with sequence
parallelism (``n`` without).

Sources
-------
* Transformer FLOPs and the Megatron layer layout: Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv 2104.04473
  (Section 3 and Appendix: a matmul of ``m x k`` by ``k x n`` costs ``2mnk``; its backward
  costs twice the forward: one matmul for the input gradient, one for the weight gradient).
* Activation memory, sequence parallelism, selective recompute: Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198
  (Section 4, Table 2).
* Model FLOPs for MFU: Chowdhery et al. 2022 (PaLM), arXiv 2204.02311, Appendix B:
  ``6N + 12*L*H*Q*T`` per token.
* Attention: FlashAttention (Dao et al. 2022, arXiv 2205.14135; FlashAttention-2, Dao 2023,
  arXiv 2307.08691). Its benchmark (Dao-AILab/flash-attention,
  ``benchmarks/benchmark_flash_attention.py``, function ``flops``) counts the forward as
  ``4*b*s^2*a*d``, halved for a causal mask, and the backward as 2.5x the forward
  (recompute of ``QK^T`` plus the ``dV``, ``dP``, ``dQ``, ``dK`` matmuls: 5 matmuls vs 2).

Assumptions (each is a choice, stated once here)
------------------------------------------------
* Attention is FlashAttention: one fused ``attention`` kernel; the ``s x s`` scores are never
  written to HBM nor kept for the backward.
* **Kernel FLOPs are executed FLOPs.** A causal flash kernel skips the masked half, so the
  attention kernel counts ``CAUSAL_FLOP_FRACTION = 0.5`` of the full ``4*b*s^2*a*d`` (the
  diagonal blocks' extra work is ignored). :func:`model_flops_per_token` is the *model*
  FLOPs of the MFU convention (Megatron, PaLM) that count the full ``s^2`` matmuls: the two
  differ on purpose.
* Linear layers carry no bias; learned position embeddings are not modelled (rotary has no
  weights). For GPT-3 that omits 0.02 % of the parameters.
* Norm weights: LayerNorm has ``2h`` (gain, bias), RMSNorm ``h``; they are replicated over
  TP. Every layer has two norms; the model has a final norm before the LM head.
* Dropout is on by default (``dropout=True``) as in Korthikanti et al.: a 1-byte mask of
  ``n_sp*h`` after attention and after the MLP (and after the embedding), so the activation
  formulas reproduce their Table 2. Modern LLM recipes train without dropout: pass
  ``dropout=False`` to drop those bytes.
* Matmuls run in the given dtype. With ``fp8`` the transformer layers' linear layers run
  in fp8 the way Transformer Engine runs them (:class:`Fp8Recipe`): operands read at 1
  byte, results written in bf16, and before each fp8 GEMM a quantization kernel
  (``<linear>.quant``) that casts its input and weight (forward) and the output gradient
  (backward) to fp8 together with the transposed copies Hopper's fp8 GEMMs need (they
  only take K-major operands). Attention (no FP8 dot-product attention), norms,
  elementwise kernels, the router, the embedding and the LM head (Megatron's
  ``output_layer`` is not a TE module; torchtitan's float8 conversion skips ``output``)
  stay bf16, and so do stored activations.
* TP (Megatron): attention heads and the FFN (and every expert's FFN) are split over ``t``;
  KV heads are split when ``t`` divides them, and replicated (one per rank) when ``t`` is a
  multiple of them. The vocabulary is split in ``ceil(V/t)`` rows per rank (no padding to
  128*t). Norms, the router and residuals act on ``n_sp`` tokens with sequence parallelism.
* CP: each rank holds ``s/c`` queries of every sequence and attends to all ``s`` keys
  (ring attention, load-balanced so causal work is even), so attention FLOPs and all
  per-token work divide by ``c``.
* MoE as Megatron-Core's MoELayer runs it (``megatron/core/transformer/moe``): each TP
  rank routes its own sequence shard (``n_sp`` tokens, ``n_sp * top_k`` token-expert
  pairs); a rank with ``E/ep`` experts split ``etp`` ways (expert-TP, by default TP)
  processes ``etp * n_sp * top_k * load`` pairs (the dispatcher all-gathers them over
  expert-TP), as one grouped GEMM per expert matmul; ``load`` is 1 for a balanced router,
  the capacity factor when padded to capacity, and the most loaded rank's share otherwise
  (:mod:`strategies.expert_routing`). Shared experts are a dense TP MLP of
  ``shared_experts * expert_ffn_hidden_size`` on the ``n`` gathered tokens. The router
  (``h x E``) is replicated.
* Vector kernels: FLOPs per element are small documented constants (they are memory bound);
  their backward reads the saved input and the upstream gradient and writes the input
  gradient.
* The software stack decides what the non-GEMM kernels move: ``elementwise="fused"``
  (default: Transformer Engine / Megatron fused kernels, or torch.compile) or ``"eager"``
  (PyTorch eager: RMSNorm, SwiGLU and RoPE as chains of ATen kernels, each a pass over
  HBM, :data:`EAGER_RMSNORM` etc.); the loss is one of :data:`CROSS_ENTROPY_BYTES_PER_LOGIT`
  (default ``fused``); the optimizer step is :func:`optimizer_kernels`. Each kernel says
  how many GPU kernels it stands for (:attr:`Kernel.launches`).
* Rotary embedding is priced only for a model whose ``position_embedding`` is ``"rope"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence

from hardware.units import ELEMENT_BYTES, canonical_dtype
from strategies.model_spec import ModelSpec

__all__ = [
    "BLOCKS",
    "CAUSAL_FLOP_FRACTION",
    "FLASH_BWD_FLOP_FACTOR",
    "FP8_RECIPES",
    "Fp8Recipe",
    "Kernel",
    "ParamCounts",
    "RankParams",
    "CROSS_ENTROPY_IMPLS",
    "RECOMPUTE_MODES",
    "ADAM_BYTES_PER_PARAM",
    "ADAM_FLOPS_PER_PARAM",
    "ADAM_PASSES",
    "adam_bytes_per_param",
    "CROSS_ENTROPY_BYTES_PER_LOGIT",
    "ELEMENTWISE_MODES",
    "RECOMPUTE_MODULES",
    "activation_bytes_per_layer",
    "banded_causal_pairs",
    "embedding_activation_bytes",
    "embedding_kernels",
    "resolve_fp8_recipe",
    "ring_attention_steps",
    "CP_COMM_TYPES",
    "TorchRingKernels",
    "torch_ring_attention_kernels",
    "fp8_weight_quant_kernel",
    "head_activation_bytes",
    "head_transient_bytes",
    "head_kernels",
    "kv_cache_elements_per_token",
    "mla_latent_width",
    "layer_kernels",
    "layer_params",
    "model_flops_per_token",
    "mtp_kernels",
    "mtp_params",
    "optimizer_kernels",
    "op_sac_recompute_fractions",
    "JAX_REMAT_POLICIES",
    "jax_remat_policy",
    "jax_remat_recompute_fractions",
    "param_counts",
    "rank_params",
]

#: Values of :attr:`Kernel.block`.
BLOCKS = ("embedding", "attention", "mlp", "moe", "head")

#: Recompute modes accepted by :func:`activation_bytes_per_layer` (as ParallelPlan.recompute).
RECOMPUTE_MODES = ("none", "selective", "full")

#: Megatron-Core ``--recompute-modules`` :func:`activation_bytes_per_layer` models, and
#: ``op_sac``: torchtitan's per-op selective activation checkpointing
#: (``activation_checkpoint.selective_ac_option = "op"``, the Llama 3 presets' choice,
#: ``torchtitan/distributed/activation_checkpoint.py``): each transformer block keeps the
#: outputs of the ops in its save list (matmuls, SDPA, reduce-scatter, amax) except every
#: second matmul, and the backward re-runs the rest (:func:`op_sac_recompute_fractions`).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "mla_up_proj", "op_sac",
                     "jax_full", "jax_save_qkv", "jax_save_qkv_out")

#: JAX rematerialisation policies (``jax.checkpoint`` around each scanned decoder layer) as
#: recompute modules, and the matmul outputs each saves (:data:`RECOMPUTE_MODULES`,
#: :func:`jax_remat_recompute_fractions`):
#:
#: * ``jax_full``: ``jax.checkpoint_policies.nothing_saveable`` -- MaxText
#:   ``remat_policy: 'full'`` (``MaxText/configs/base.yml``; ``policy = None`` in the
#:   decoder's ``nn.remat``), Praxis ``AutodiffCheckpointType.SAVE_NOTHING``;
#: * ``jax_save_qkv``: MaxText ``remat_policy=save_qkv_proj``, ``save_only_these_names(
#:   "query_proj", "value_proj", "key_proj", "qkv_proj")`` (MaxText/layers/models.py): the
#:   Q, K and V projection outputs are kept;
#: * ``jax_save_qkv_out``: Praxis ``AutodiffCheckpointType.SAVE_QKV_OUT_PROJ``,
#:   ``save_only_these_names('combined_qkv_proj', 'out_proj')``
#:   (praxis/layers/checkpoint_policy.py); Transformer Engine's JAX ``MultiHeadAttention``
#:   names its fused QKV output ``combined_qkv_proj`` and its output projection
#:   ``out_proj`` (transformer_engine/jax/flax/transformer.py), so Paxml with TE layers
#:   keeps both.
JAX_REMAT_POLICIES = {"jax_full": (), "jax_save_qkv": ("attn.qkv",),
                      "jax_save_qkv_out": ("attn.qkv", "attn.out")}


def jax_remat_policy(modules: frozenset[str] | set[str] | None) -> str | None:
    """The JAX remat policy among recompute ``modules`` (:data:`JAX_REMAT_POLICIES`;
    a policy stands alone, :func:`strategies.plan.check_plan_fields`), or None."""
    found = sorted(set(modules or ()) & JAX_REMAT_POLICIES.keys())
    return found[0] if found else None

#: Cross-entropy implementations (memory: :func:`head_activation_bytes`; kernels:
#: :data:`CROSS_ENTROPY_BYTES_PER_LOGIT`): ``fused`` writes the gradient into the logits
#: buffer (TE ``parallel_cross_entropy``, flash-attn's fused loss); ``megatron`` is
#: Megatron-Core's fp32 vocab-parallel loss; ``eager`` is PyTorch ``F.cross_entropy`` on
#: fp32 logits; ``eager_bf16`` is PyTorch ``F.cross_entropy`` on the bf16 logits as they
#: come (NeMo AutoModel ``MaskedCrossEntropy(fp32_upcast=False)``,
#: nemo_automodel/components/loss/masked_ce.py: no ``.float()``, so log-softmax reads,
#: writes and saves 16-bit values; it accumulates in fp32 inside the kernel).
CROSS_ENTROPY_IMPLS = ("fused", "megatron", "eager", "eager_bf16")

#: Fraction of the full ``4*b*s^2*a*d`` a causal flash-attention kernel executes
#: (flash-attention's benchmark halves causal FLOPs; masked blocks are skipped).
CAUSAL_FLOP_FRACTION = 0.5

#: Flash-attention backward FLOPs / forward FLOPs (Dao-AILab/flash-attention
#: benchmarks/benchmark_flash_attention.py: ``2.5 * f`` for ``mode="bwd"``).
FLASH_BWD_FLOP_FACTOR = 2.5

#: Forward FLOPs per element of a norm: LayerNorm mean (1), variance (3), normalise (2),
#: affine (2); RMSNorm square-sum (2), normalise (1), gain (1). Backward input: 2x.
NORM_FWD_FLOPS_PER_ELEMENT = {"layernorm": 8.0, "rmsnorm": 4.0}

#: Forward FLOPs per output element of the MLP activation: tanh-GELU ~8; SiLU(gate)*up ~6.
#: Backward: 2x.
ACT_FWD_FLOPS_PER_ELEMENT = {"gelu": 8.0, "swiglu": 6.0}

#: Cross-entropy FLOPs per logit: max, subtract, exp, sum, divide (forward), 2 (backward).
CROSS_ENTROPY_FWD_FLOPS_PER_ELEMENT = 5.0

#: Bytes of a dropout mask element (torch stores bool masks, 1 byte; Korthikanti et al.).
DROPOUT_MASK_BYTES = 1

#: Bytes per fp32 value (softmax log-sum-exp, router probabilities, loss logits).
FP32_BYTES = 4
#: DeepSeek-V3's E5M6 activation format (1 sign, 5 exponent, 6 mantissa bits: 12 bits),
#: bytes per element (arXiv 2412.19437 Section 3.3.3).
E5M6_BYTES = 1.5

#: Bytes of a token id (int64).
TOKEN_ID_BYTES = 8


@dataclass(frozen=True, kw_only=True)
class Fp8Recipe:
    """How a stack runs its fp8 linear layers: what the quantization kernels move.

    Attributes:
        name: key in :data:`FP8_RECIPES`.
        quant_bytes_per_element: HBM bytes per element to quantize one bf16 tensor into
            the fp8 copies its GEMMs read (row-wise and transposed / column-wise, with
            their scales) -- Transformer Engine's fused ``cast_transpose``: read 2, write
            1 + 1 = 4 for per-tensor delayed scaling; current scaling first reads the
            tensor for its amax (+2); MXFP8 writes one E8M0 scale per 32 elements for each
            direction (+2/32); 1x128 blockwise one fp32 scale per 128 (+2*4/128).
        norm_fused: the preceding norm writes the fp8 input itself (TE ``LayerNormLinear``,
            Megatron-Core's ``TELayerNormColumnParallelLinear`` for QKV and FC1: the norm
            kernel outputs fp8; only the transposed copy is made later, 2 bytes per element).
            Impossible with current scaling (the amax must be known before the cast).
        weight_cache: weights are quantized once per optimizer step, not per micro-batch
            (TE ``is_first_microbatch``, which Megatron-Core passes); then the per-step cost
            (:data:`FP8_WEIGHT_QUANT_BYTES_PER_PARAM`-style, ``quant_bytes_per_element`` per
            parameter) belongs to the optimizer step and the micro-batch kernels omit it.
        weight_copy_bytes_per_param: bytes per linear-layer parameter of FP8 weight copies
            held through the step (memory): Transformer Engine modules keep the FP8 weight
            and its transpose as persistent workspaces (2); torchao float8 casts per use and
            keeps none (0).
        saves_fp8_inputs: the backward's saved linear inputs are the FP8 copies (TE:
            ``transformer_engine/pytorch/module/{linear,layernorm_linear}.py`` save the
            quantized input) rather than the bf16 inputs (torchao saves bf16).
        source: where the recipe's behaviour is documented.
        fused_split_quantize: Transformer Engine's ``split_quantize`` (the routed experts'
            ``GroupedLinear`` quantizing its input and its output gradient per expert) runs
            one fused kernel for all experts (``nvte_multi_cast_transpose``, which exists
            for delayed scaling only: "Currently only have fused kernel for FP8 delayed
            scaling", transformer_engine/pytorch/csrc/extensions/cast.cpp
            ``multi_tensor_quantize_impl``) rather than one quantize kernel per expert
            ("Quantize kernels individually", the other recipes).
    """

    name: str
    quant_bytes_per_element: float
    norm_fused: bool
    weight_cache: bool
    source: str
    weight_copy_bytes_per_param: float = 2.0
    saves_fp8_inputs: bool = True
    fused_split_quantize: bool = False


#: Recipes by name (the ``fp8_recipe`` a plan names). Bytes: see :class:`Fp8Recipe`.
FP8_RECIPES: dict[str, Fp8Recipe] = {r.name: r for r in (
    Fp8Recipe(name="te-delayed", quant_bytes_per_element=4.0, norm_fused=True, weight_cache=True,
              fused_split_quantize=True,
              source="Transformer Engine DelayedScaling (amax history; amax fused into the cast); "
                     "Megatron-Core TE layer spec (LayerNormLinear for QKV/FC1), is_first_microbatch"),
    Fp8Recipe(name="te-current", quant_bytes_per_element=6.0, norm_fused=False, weight_cache=True,
              source="Transformer Engine Float8CurrentScaling (per-tensor amax pass before the cast; "
                     "NeMo 'FP8-CS')"),
    Fp8Recipe(name="te-mxfp8", quant_bytes_per_element=4.0 + 2.0 / 32, norm_fused=True, weight_cache=True,
              source="Transformer Engine MXFP8BlockScaling (Blackwell; 1x32 blocks, E8M0 scales, "
                     "row- and column-wise copies instead of a transpose)"),
    Fp8Recipe(name="te-blockwise", quant_bytes_per_element=4.0 + 8.0 / 128, norm_fused=False,
              weight_cache=True,
              source="Transformer Engine Float8BlockScaling (1x128 activations / 128x128 weights, fp32 "
                     "scales; DeepSeek-V3 style)"),
    Fp8Recipe(name="te-linear", quant_bytes_per_element=4.0, norm_fused=False, weight_cache=False,
              source="te.Linear used as a drop-in linear (llm-foundry fc_type: te): no norm fusion, "
                     "no is_first_microbatch weight caching"),
    Fp8Recipe(name="torchao", quant_bytes_per_element=6.0, norm_fused=False, weight_cache=False,
              weight_copy_bytes_per_param=0.0, saves_fp8_inputs=False,
              source="torchao float8 tensorwise dynamic scaling (torchtitan): amax + cast per tensor, "
                     "weights cast every micro-batch (FSDP2 float8 all-gather casts the shard)"),
)}

#: The recipe assumed when a plan says only ``fp8``: Megatron-Core/NeMo with TE delayed
#: scaling (the default ``fp8_recipe`` of Megatron-Core before TE 2.x).
DEFAULT_FP8_RECIPE = "te-delayed"


#: How a stack runs its elementwise layers: ``fused`` -- hand-fused kernels (Transformer
#: Engine norms and RoPE, Megatron's jit-fused bias-SwiGLU/GeLU and bias-dropout-add, Apex),
#: or torch.compile's Inductor, which fuses the same chains; ``eager`` -- PyTorch eager
#: mode, one ATen kernel per tensor op (torchtitan and FSDP stacks without torch.compile).
ELEMENTWISE_MODES = ("fused", "eager")

#: HBM bytes per element and kernels of eager RMSNorm (``torch.nn.RMSNorm`` / torchtitan's
#: ``x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w``, composite ops):
#: forward cast r2w4, pow r4w4, mean r4, mul r4w4, cast r4w2, weight mul r2w2 = 36 bytes in 8
#: kernels (eps add and rsqrt are per row); backward, autograd of each op (weight mul, cast,
#: mul with its row reduction, mean expand, pow, accumulate, cast) = 76 bytes in 12 kernels.
#: LayerNorm has a fused ATen kernel even in eager mode (``torch.nn.functional.layer_norm``).
EAGER_RMSNORM = {"fwd_bytes_per_element": 36.0, "bwd_bytes_per_element": 76.0,
                 "fwd_launches": 8, "bwd_launches": 12}

#: Eager SwiGLU ``silu(gate) * up``, bytes per element of the FFN width: silu r2w2 + mul r4w2
#: = 10 forward (2 kernels); backward mul r4w2 twice + silu r4w2 = 18 (3 kernels). Fused
#: (Megatron ``bias_swiglu``): read gate and up, write one = 6; backward 10. GELU is one ATen
#: kernel in both modes.
EAGER_SWIGLU = {"fwd_bytes_per_element": 10.0, "bwd_bytes_per_element": 18.0,
                "fwd_launches": 2, "bwd_launches": 3}

#: Rotary position embedding over q and k, bytes per element: fused (TE/Apex fused RoPE, Megatron
#: ``--apply-rope-fusion``): read and write bf16 = 4 per pass, one kernel per tensor. Eager
#: (torchtitan's complex form: ``view_as_complex(x.float()) * freqs_cis`` then ``type_as``):
#: cast r2w4, complex mul r4w4, cast r4w2 = 20 per pass, three kernels per tensor.
ROPE_BYTES_PER_ELEMENT = {"fused": 4.0, "eager": 20.0}
ROPE_LAUNCHES_PER_TENSOR = {"fused": 1, "eager": 3}

#: Cross-entropy variants over the vocab-parallel logits: (forward, backward) HBM bytes per
#: logit and kernels per pass.
#: ``fused``: one pass each way (Megatron ``--cross-entropy-loss-fusion``, flash-attn's
#: xentropy used by llm-foundry ``loss_fn: fused_crossentropy``, torch.compile'd loss): read
#: bf16 logits, write the fp32 softmax kept for the backward (2 + 4); backward reads it and
#: writes the bf16 gradient (4 + 2).
#: ``megatron``: Megatron-Core's unfused ``vocab_parallel_cross_entropy``
#: (megatron/core/tensor_parallel/cross_entropy.py): ``.float()`` r2w4, max r4, in-place sub
#: r4w4, in-place exp r4w4, sum r4, in-place div r4w4 = 38 forward in 6 kernels; backward
#: in-place mul r4w4 and the cast back to bf16 r4w2 = 14 in 2 kernels.
#: ``eager``: PyTorch ``F.cross_entropy`` on fp32-upcast logits (autocast / ``.float()``):
#: cast r2w4 + log_softmax r4w4 = 14 forward (2 kernels); nll backward zero-fill w4,
#: log_softmax backward r4r4w4, cast r4w2 = 22 backward (3 kernels).
#: ``eager_bf16``: the same on the bf16 logits without the casts (AutoModel's
#: ``MaskedCrossEntropy(fp32_upcast=False)``): log_softmax r2w2 = 4 forward (1 kernel);
#: nll backward zero-fill w2, log_softmax backward r2r2w2 = 8 backward (2 kernels).
CROSS_ENTROPY_BYTES_PER_LOGIT = {"fused": (6.0, 6.0), "megatron": (38.0, 14.0),
                                 "eager": (14.0, 22.0), "eager_bf16": (4.0, 8.0)}
CROSS_ENTROPY_LAUNCHES = {"fused": (1, 1), "megatron": (6, 2), "eager": (2, 3),
                          "eager_bf16": (1, 2)}

#: How a stack adds the routed experts' biases (``MoESpec.expert_bias``):
#: ``megatron`` -- Megatron-Core ``TEGroupedMLP`` (megatron/core/transformer/moe/experts.py):
#: ``linear_fc1`` is TE ``GroupedLinear`` with ``bias=add_bias_linear, skip_bias_add=False``,
#: the bias added in the GEMM's cuBLAS epilogue and its gradient taken by the bf16 wgrad
#: GEMM's bias-gradient epilogue (transformer_engine/pytorch/module/grouped_linear.py
#: ``general_grouped_gemm(..., use_bias=...)``): free; ``linear_fc2`` has
#: ``skip_bias_add=True`` and ``TEGroupedMLP._apply_bias`` adds the returned per-expert
#: biases in eager PyTorch, ``torch.cat([t + b * p for t, b, p in zip(split(out,
#: tokens_per_expert), biases, split(probs, tokens_per_expert))]).to(dtype)``: one
#: ``b * p`` and one add per local expert and one cat.
#: ``eager`` -- both biases that way: NeMo AutoModel ``GroupedExpertsDeepEP._apply_bias``
#: (nemo_automodel/components/moe/layers.py): ``t + b`` per local expert after the
#: grouped up projection (no probabilities), ``t + b * p`` after the down projection.
EXPERT_BIAS_IMPLS = ("megatron", "eager")


def resolve_fp8_recipe(name: str | Fp8Recipe | None) -> Fp8Recipe:
    """The :class:`Fp8Recipe` called ``name`` (``None``/``""``: :data:`DEFAULT_FP8_RECIPE`).

    Raises:
        ValueError: unknown name, listing the valid ones.
    """
    if isinstance(name, Fp8Recipe):
        return name
    key = name or DEFAULT_FP8_RECIPE
    if key not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe: {name!r} is not known; valid: {', '.join(FP8_RECIPES)}")
    return FP8_RECIPES[key]


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """One forward kernel on one GPU, with the cost of its backward.

    Attributes:
        name: e.g. ``"attn.qkv"``, ``"mlp.fc1"``, ``"moe.experts.down"``.
        block: one of :data:`BLOCKS`.
        kind: one of :data:`hardware.compute.COMPUTE_KINDS`.
        shape: ``(groups, m, n, k)`` for a (grouped) GEMM ``[m, k] @ [k, n]`` (``m`` of a
            grouped GEMM is the average rows per group, rounded); ``(b, a, g, s_q, s_k, d)``
            for attention (local heads); ``(rows, cols)`` for vector kernels.
        dtype: compute dtype (canonical, e.g. ``"bf16"``).
        fwd_flops: forward FLOPs.
        fwd_bytes: forward HBM traffic (read inputs and weights, write outputs), bytes.
        bwd_input_flops: FLOPs of the input-gradient part of the backward (the whole
            backward for ops without weights).
        bwd_input_bytes: HBM bytes of that part.
        bwd_weight_flops: FLOPs of the weight-gradient part (0 for weightless ops).
        bwd_weight_bytes: HBM bytes of that part.
        selective_recompute: re-run in the backward under Megatron's selective recompute
            (the attention core; with flash attention, the attention kernel).
        params: weights this kernel owns on this rank (elements).
        expert: a routed-expert kernel (``moe.experts.*``): its weights are sharded by
            ``ep`` and its gradients reduce over the expert-data-parallel group
            (``dp*cp/ep``), not the data-parallel one.
        launches: GPU kernels the op stands for in the forward and in the backward (an
            eager RMSNorm is 8 and 12 ATen kernels); each pays the launch gap.
        causal: for attention, whether the kernel applies a causal mask (a ring-attention
            step off the diagonal does not: :func:`ring_attention_steps`).
        window: for attention, the sliding window (keys a query attends at most; 0: the
            whole causal prefix).
    """

    name: str
    block: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    fwd_flops: float
    fwd_bytes: float
    bwd_input_flops: float
    bwd_input_bytes: float
    bwd_weight_flops: float
    bwd_weight_bytes: float
    selective_recompute: bool = False
    params: int = 0
    expert: bool = False
    launches: tuple[int, int] = (1, 1)
    causal: bool = True
    window: int = 0

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs: input plus weight gradient."""
        return self.bwd_input_flops + self.bwd_weight_flops

    @property
    def bwd_bytes(self) -> float:
        """Backward HBM bytes: input plus weight gradient."""
        return self.bwd_input_bytes + self.bwd_weight_bytes


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameters of a whole (unsharded) model, in elements.

    Attributes:
        embedding: input embedding, ``V*h``.
        head: LM head, ``V*h``; 0 when tied to the embedding.
        final_norm: the norm before the head (``h`` or ``2h``).
        layers: parameters of each transformer layer, in order.
        dense_layer: parameters of one dense layer (attention + MLP + 2 norms).
        moe_layer: parameters of one MoE layer (attention + router + all experts + shared
            experts + 2 norms); 0 for a dense model.
        total: embedding + head + final_norm + sum(layers).
        active_per_token: parameters one token touches: total minus, in each MoE layer, the
            routed experts it is not sent to (``(E - top_k)`` experts). Includes the
            embedding and the head (MoE papers' "activated parameters" convention).
        mtp: parameters of the multi-token prediction modules (not in ``total``, as
            DeepSeek-V3's 671B leaves its 14B MTP module out).
    """

    embedding: int
    head: int
    final_norm: int
    layers: tuple[int, ...]
    dense_layer: int
    moe_layer: int
    total: int
    active_per_token: int
    mtp: int = 0


@dataclass(frozen=True, kw_only=True)
class RankParams:
    """Parameters one rank holds (elements).

    Attributes:
        dense_params: replicated over the data-parallel group (everything but routed
            experts).
        expert_params: routed-expert weights, replicated over ``dp / ep`` ranks.
    """

    dense_params: int
    expert_params: int

    @property
    def total(self) -> int:
        """dense_params + expert_params."""
        return self.dense_params + self.expert_params


# --------------------------------------------------------------------------- validation


def _pos_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: {value!r} must be a positive integer")
    return value


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _check_tp(model: ModelSpec, tp: int) -> None:
    _pos_int(tp, "tp")
    if model.num_heads % tp:
        raise ValueError(
            f"tp: {tp} does not divide num_heads {model.num_heads} of model {model.name!r}; "
            f"valid tp: {_divisors(model.num_heads)}"
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(
            f"tp: {tp} neither divides nor is a multiple of num_kv_heads {model.num_kv_heads} of "
            f"model {model.name!r}; valid tp: divisors or multiples of {model.num_kv_heads} that divide {model.num_heads}"
        )
    if model.ffn_hidden_size % tp:
        raise ValueError(
            f"tp: {tp} does not divide ffn_hidden_size {model.ffn_hidden_size} of model {model.name!r}"
        )
    moe = model.moe
    if moe is not None and moe.shared_experts and (moe.shared_experts * moe.expert_ffn_hidden_size) % tp:
        raise ValueError(
            f"tp: {tp} does not divide the shared experts' FFN size "
            f"{moe.shared_experts * moe.expert_ffn_hidden_size} of model {model.name!r}"
        )


def _check_etp(model: ModelSpec, etp: int) -> None:
    _pos_int(etp, "expert_tp")
    if model.moe is not None and model.moe.expert_ffn_hidden_size % etp:
        raise ValueError(
            f"expert_tp: {etp} does not divide moe.expert_ffn_hidden_size "
            f"{model.moe.expert_ffn_hidden_size} of model {model.name!r}; valid: a divisor of it"
        )


def _default_load(model: ModelSpec) -> float:
    """Rows of a routed expert relative to a balanced load when nothing else is said: the
    model's capacity factor, padded (1 when dropless)."""
    cf = model.moe.capacity_factor if model.moe is not None else 0.0
    return cf if cf > 0 else 1.0


def _check_ep(model: ModelSpec, ep: int) -> None:
    _pos_int(ep, "ep")
    if model.moe is None:
        return
    if model.moe.num_experts % ep:
        raise ValueError(
            f"ep: {ep} does not divide moe.num_experts {model.moe.num_experts} of model {model.name!r}; "
            f"valid ep: {_divisors(model.moe.num_experts)}"
        )


def _check_layer(model: ModelSpec, layer: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < model.num_layers:
        raise ValueError(
            f"layer: {layer!r} is out of range for model {model.name!r}; valid: 0..{model.num_layers - 1}"
        )


def _tokens(micro_batch: int, seq_len: int, cp: int) -> int:
    _pos_int(micro_batch, "micro_batch")
    _pos_int(seq_len, "seq_len")
    _pos_int(cp, "cp")
    if seq_len % cp:
        raise ValueError(f"cp: {cp} does not divide seq_len {seq_len}; valid cp: {_divisors(seq_len)}")
    return micro_batch * seq_len // cp


def _sp_tokens(tokens: int, tp: int, sequence_parallel: bool) -> int:
    if not sequence_parallel or tp == 1:
        return tokens
    if tokens % tp:
        raise ValueError(
            f"tp: {tp} does not divide the {tokens} tokens (micro_batch*seq_len/cp) a rank shards with "
            f"sequence_parallel; make seq_len/cp a multiple of tp or set sequence_parallel=False"
        )
    return tokens // tp


def _dtypes(dtype: str) -> tuple[str, float, str, float]:
    """(matmul dtype, its element bytes, activation dtype, its element bytes)."""
    mm = canonical_dtype(dtype)
    act = "bf16" if ELEMENT_BYTES[mm] < 2 else mm
    return mm, float(ELEMENT_BYTES[mm]), act, float(ELEMENT_BYTES[act])


def _kv_local(model: ModelSpec, tp: int) -> int:
    g = model.num_kv_heads
    return g // tp if g % tp == 0 else 1


def _mlp_matrices(model: ModelSpec) -> int:
    return 3 if model.mlp == "swiglu" else 2


def _norm_params(model: ModelSpec) -> int:
    return 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size


# --------------------------------------------------------------------------- kernel builders


def _matmul(name: str, block: str, *, m: float, n: int, k: int, groups: int = 1, dtype: str,
            in_bytes: float, out_bytes: float, params: int) -> Kernel:
    """``Y[m, n] = X[m, k] @ W[k, n]`` (``groups`` GEMMs sharing ``m`` rows in total).

    Forward reads X and W, writes Y; input grad ``dX = dY W^T`` reads dY and W, writes dX;
    weight grad ``dW = X^T dY`` reads X and dY, writes dW. Each costs ``2*m*n*k`` FLOPs
    (Narayanan et al. 2021): backward = 2x forward.
    """
    flops = 2.0 * m * n * k
    w = groups * k * n
    return Kernel(
        name=name, block=block, kind="matmul",
        shape=(groups, int(round(m / groups)), n, k), dtype=dtype,
        fwd_flops=flops,
        fwd_bytes=in_bytes * (m * k + w) + out_bytes * m * n,
        bwd_input_flops=flops,
        bwd_input_bytes=in_bytes * (m * n + w) + out_bytes * m * k,
        bwd_weight_flops=flops,
        bwd_weight_bytes=in_bytes * (m * k + m * n) + out_bytes * w,
        params=params,
    )


def _norm(name: str, block: str, model: ModelSpec, rows: int, act: str, e: float,
          out_bytes: float | None = None, elementwise: str = "fused") -> Kernel:
    """Norm over ``rows x h``: forward reads x and the weights, writes y (``out_bytes`` per
    element, default ``e``: 1 when it writes the fp8 input of a fused fp8 linear); input
    grad reads x, dy and the weights, writes dx; weight grad writes dgamma (and dbeta).
    An eager RMSNorm moves :data:`EAGER_RMSNORM` bytes per element instead."""
    h = model.hidden_size
    p = _norm_params(model)
    c = NORM_FWD_FLOPS_PER_ELEMENT[model.norm]
    out = e if out_bytes is None else out_bytes
    if elementwise == "eager" and model.norm == "rmsnorm":
        t = EAGER_RMSNORM
        return Kernel(
            name=name, block=block, kind="norm", shape=(rows, h), dtype=act,
            fwd_flops=c * rows * h, fwd_bytes=t["fwd_bytes_per_element"] * rows * h,
            bwd_input_flops=2 * c * rows * h, bwd_input_bytes=t["bwd_bytes_per_element"] * rows * h,
            bwd_weight_flops=2.0 * rows * p, bwd_weight_bytes=e * p, params=p,
            launches=(t["fwd_launches"], t["bwd_launches"]),
        )
    return Kernel(
        name=name, block=block, kind="norm", shape=(rows, h), dtype=act,
        fwd_flops=c * rows * h,
        fwd_bytes=e * (rows * h + p) + out * rows * h,
        bwd_input_flops=2 * c * rows * h,
        bwd_input_bytes=e * (3 * rows * h + p),
        bwd_weight_flops=2.0 * rows * p,
        bwd_weight_bytes=e * p,
        params=p,
    )


def _fp8_quant(name: str, block: str, *, m: float, k: int, n: int, groups: int = 1,
               recipe: Fp8Recipe, input_from_norm: bool, act: str) -> Kernel:
    """Transformer Engine's quantization around one fp8 GEMM ``Y[m,n] = X[m,k] W[k,n]``.

    Forward: cast X (``m*k``) unless the preceding norm already wrote it in fp8
    (``recipe.norm_fused`` and ``input_from_norm``), and W (``groups*k*n``) unless weights
    are cached per step. Backward, input-gradient part: cast dY (``m*n``) for the dgrad and
    wgrad GEMMs. Backward, weight-gradient part: the transposed fp8 copy of a norm-written
    X for the wgrad GEMM (read and write 1 byte). Each cast moves
    ``recipe.quant_bytes_per_element`` bytes per element (:class:`Fp8Recipe`) and does ~2
    FLOPs per element (scale, amax). A grouped GEMM's (``groups`` > 1, the routed
    experts' ``GroupedLinear``) quantizations are one kernel per expert (``launches``)
    unless the recipe fuses them (:attr:`Fp8Recipe.fused_split_quantize`).
    """
    q = recipe.quant_bytes_per_element
    fused = recipe.norm_fused and input_from_norm
    x, w, dy = m * k, groups * k * n, m * n
    fwd_elems = (0.0 if fused else x) + (0.0 if recipe.weight_cache else w)
    kernels = groups if groups > 1 and not recipe.fused_split_quantize else 1
    return Kernel(
        name=name, block=block, kind="elementwise", shape=(int(round(m)), k), dtype=act,
        fwd_flops=2.0 * fwd_elems, fwd_bytes=q * fwd_elems,
        bwd_input_flops=2.0 * dy, bwd_input_bytes=q * dy,
        bwd_weight_flops=0.0, bwd_weight_bytes=2.0 * x if fused else 0.0,
        launches=(kernels, kernels),
    )


def _rotary(name: str, block: str, *, tokens: int, q_heads: int, kv_heads: int, head_dim: int,
            act: str, elementwise: str) -> Kernel:
    """Rotary position embedding of the local q and k heads (``tokens x (q + kv) x d``
    elements): :data:`ROPE_BYTES_PER_ELEMENT` per element and pass; backward rotates the
    gradients back the same way (~3 FLOPs per element: two multiplies and an add)."""
    elems = tokens * (q_heads + kv_heads) * head_dim
    per = ROPE_BYTES_PER_ELEMENT[elementwise]
    launches = 2 * ROPE_LAUNCHES_PER_TENSOR[elementwise]
    return Kernel(
        name=name, block=block, kind="elementwise", shape=(tokens, (q_heads + kv_heads) * head_dim),
        dtype=act, fwd_flops=3.0 * elems, fwd_bytes=per * elems,
        bwd_input_flops=3.0 * elems, bwd_input_bytes=per * elems,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0, launches=(launches, launches),
    )


def _residual(name: str, block: str, rows: int, h: int, act: str, e: float, dropout: bool) -> Kernel:
    """Fused (bias-)dropout-add: reads the branch output and the residual, writes the sum
    (and the dropout mask); backward reads dy (and the mask), writes the branch gradient."""
    mask = DROPOUT_MASK_BYTES if dropout else 0
    return Kernel(
        name=name, block=block, kind="elementwise", shape=(rows, h), dtype=act,
        fwd_flops=2.0 * rows * h,
        fwd_bytes=(3 * e + mask) * rows * h,
        bwd_input_flops=1.0 * rows * h,
        bwd_input_bytes=(2 * e + mask) * rows * h,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
    )


def _activation(name: str, block: str, model: ModelSpec, rows: float, cols: int, act: str,
                e: float, elementwise: str = "fused") -> Kernel:
    """MLP activation on ``rows x cols`` outputs: GELU reads 1 input per output; SwiGLU reads
    gate and up (2 inputs). Backward reads the saved inputs and dy, writes the input grads.
    Eager SwiGLU is two kernels forward, three backward (:data:`EAGER_SWIGLU`)."""
    ins = 2 if model.mlp == "swiglu" else 1
    c = ACT_FWD_FLOPS_PER_ELEMENT[model.mlp]
    elems = rows * cols
    if elementwise == "eager" and model.mlp == "swiglu":
        t = EAGER_SWIGLU
        return Kernel(
            name=name, block=block, kind="elementwise", shape=(int(round(rows)), cols), dtype=act,
            fwd_flops=c * elems, fwd_bytes=t["fwd_bytes_per_element"] * elems,
            bwd_input_flops=2 * c * elems, bwd_input_bytes=t["bwd_bytes_per_element"] * elems,
            bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
            launches=(t["fwd_launches"], t["bwd_launches"]),
        )
    return Kernel(
        name=name, block=block, kind="elementwise", shape=(int(round(rows)), cols), dtype=act,
        fwd_flops=c * elems,
        fwd_bytes=e * (ins + 1) * elems,
        bwd_input_flops=2 * c * elems,
        bwd_input_bytes=e * (2 * ins + 1) * elems,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
    )


def expert_bias_kernels(*, pairs: float, local_experts: int, hidden: int, up_cols: int,
                        ea: float, act: str, impl: str = "megatron") -> dict[str, Kernel]:
    """The eager per-expert bias additions of a stack's routed experts
    (:data:`EXPERT_BIAS_IMPLS`), by the GEMM they follow (``"up"``, ``"down"``), over the
    rank's ``pairs`` token-expert rows split among ``local_experts`` experts.

    Down projection, ``t + b * p`` per expert then ``torch.cat`` (``pairs x hidden``
    elements ``x``; the routing probabilities ``p`` in the activation dtype ``ea``, as
    Megatron-Core's router returns them without ``moe_router_dtype`` and the gpt-oss
    providers do not set it): forward ``b*p`` writes ``x``, the add reads ``t`` and it and
    writes ``x``, the cat reads and writes ``x`` -- ``6*ea`` bytes per element in
    ``2*E + 1`` kernels (the final ``.to(dtype)`` is a no-op in the same dtype); backward
    (autograd of ``mul``, broadcast ``b`` over rows and ``p`` over columns): ``grad*p``
    read/write and its sum over the rows for ``db``, ``grad*b`` read/write and its sum
    over the columns for ``dp``, and the cat of the ``dt`` slices that ``split``'s
    backward builds (read and write) -- ``8*ea`` bytes in ``4*E + 1`` kernels.

    Up projection (``eager`` only), ``t + b`` per expert then the cat over ``pairs x
    up_cols``: forward ``4*ea`` bytes in ``E + 1`` kernels; backward ``db`` as a row sum
    (read) and the cat of the ``dt`` slices -- ``3*ea`` bytes in ``E + 1`` kernels.

    Raises:
        ValueError: an unknown ``impl``.
    """
    if impl not in EXPERT_BIAS_IMPLS:
        raise ValueError(f"expert_bias_impl: {impl!r} is not valid; valid: "
                         f"{', '.join(EXPERT_BIAS_IMPLS)}")
    e_l = max(1, int(local_experts))
    down = pairs * hidden
    kernels = {"down": Kernel(
        name="moe.experts.down_bias", block="moe", kind="elementwise",
        shape=(int(round(pairs)), hidden), dtype=act,
        fwd_flops=2.0 * down, fwd_bytes=6.0 * ea * down,
        bwd_input_flops=4.0 * down, bwd_input_bytes=8.0 * ea * down,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
        launches=(2 * e_l + 1, 4 * e_l + 1))}
    if impl == "eager":
        up = pairs * up_cols
        kernels["up"] = Kernel(
            name="moe.experts.up_bias", block="moe", kind="elementwise",
            shape=(int(round(pairs)), up_cols), dtype=act,
            fwd_flops=1.0 * up, fwd_bytes=4.0 * ea * up,
            bwd_input_flops=1.0 * up, bwd_input_bytes=3.0 * ea * up,
            bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
            launches=(e_l + 1, e_l + 1))
    return kernels


def _mlp(prefix: str, block: str, model: ModelSpec, *, rows: float, ffn_local: int, groups: int,
         mm: str, em: float, act: str, ea: float, recipe: Fp8Recipe | None = None,
         up_from_norm: bool = False, elementwise: str = "fused") -> list[Kernel]:
    """fc1 / act / fc2 (GELU) or gate_up (fused) / act / down (SwiGLU) over ``rows`` tokens;
    with an fp8 ``recipe``, each GEMM preceded by its quantization kernel (``up_from_norm``:
    the up projection's input is written by the block's norm)."""
    h = model.hidden_size
    if model.mlp == "swiglu":
        up_name, down_name, up_cols = "gate_up", "down", 2 * ffn_local
    else:
        up_name, down_name, up_cols = "fc1", "fc2", ffn_local
    up = _matmul(f"{prefix}.{up_name}", block, m=rows, n=up_cols, k=h, groups=groups, dtype=mm,
                 in_bytes=em, out_bytes=ea, params=groups * h * up_cols)
    down = _matmul(f"{prefix}.{down_name}", block, m=rows, n=h, k=ffn_local, groups=groups,
                   dtype=mm, in_bytes=em, out_bytes=ea, params=groups * ffn_local * h)
    act_kernel = _activation(f"{prefix}.act", block, model, rows, ffn_local, act, ea, elementwise)
    if recipe is None:
        return [up, act_kernel, down]
    return [
        _fp8_quant(f"{up.name}.quant", block, m=rows, k=h, n=up_cols, groups=groups,
                   recipe=recipe, input_from_norm=up_from_norm, act=act),
        up, act_kernel,
        _fp8_quant(f"{down.name}.quant", block, m=rows, k=ffn_local, n=h, groups=groups,
                   recipe=recipe, input_from_norm=False, act=act),
        down,
    ]


# --------------------------------------------------------------------------- kernels


def layer_kernels(model: ModelSpec, layer: int, *, micro_batch: int, seq_len: int, tp: int = 1,
                  cp: int = 1, ep: int = 1, sequence_parallel: bool = True, dtype: str = "bf16",
                  dropout: bool = True, flash_attention: bool = True,
                  fp8_recipe: str | Fp8Recipe | None = None,
                  elementwise: str = "fused", etp: int | None = None,
                  expert_load: float | None = None,
                  expert_bias_impl: str = "megatron") -> list[Kernel]:
    """Forward kernels of transformer layer ``layer`` on one GPU, in execution order.

    Attention block: ``attn.norm``, ``attn.qkv`` (fused; ``N = (a + 2g)*d/t``, GQA-aware),
    ``attn.core`` (causal flash attention: ``fwd = 0.5 * 4*b*(s/c)*s*(a/t)*d`` FLOPs,
    backward 2.5x, selective-recompute), ``attn.out``, ``attn.residual``. Dense MLP block:
    ``mlp.norm``, ``mlp.fc1``/``mlp.act``/``mlp.fc2`` (GELU) or
    ``mlp.gate_up``/``mlp.act``/``mlp.down`` (SwiGLU, gate and up fused), ``mlp.residual``.
    MoE block (Megatron-Core's MoELayer with the all-to-all dispatcher): ``moe.norm``,
    ``moe.router`` (``n_sp x h x E`` GEMM on the rank's sequence shard), ``moe.route``
    (softmax/top-k), shared experts ``moe.shared.*`` (if any; a dense TP MLP on the ``n``
    gathered tokens), ``moe.permute`` (the rank's ``n_sp*k`` token-expert pairs),
    ``moe.experts.*`` (grouped GEMMs over ``E/ep`` local experts, ``f_e/etp`` wide, on the
    ``etp*n_sp*k*load`` pairs the rank receives and gathers over expert-TP; ``load`` 1 for a
    balanced router, else :func:`strategies.expert_routing.routed_load`'s rows factor),
    ``moe.unpermute``, ``moe.residual``.

    Matmuls process ``n = b*s/c`` tokens; norms and residuals ``n_sp`` (module docstring).
    A matmul ``[m,k]@[k,n]`` costs ``2mnk`` FLOPs forward and the same for each of its input
    and weight gradients (Narayanan et al. 2021, arXiv 2104.04473).

    Args:
        model: the model.
        layer: 0-based layer index (decides dense vs MoE).
        micro_batch: sequences per micro-batch ``b``.
        seq_len: tokens per sequence ``s``.
        tp, cp, ep: tensor-, context- and expert-parallel sizes.
        etp: expert tensor-parallel size (None: tp).
        expert_load: routed rows relative to a balanced load (None: the model's
            capacity factor, padded; 1 when dropless).
        sequence_parallel: shard norms/residuals over TP (Korthikanti et al. 2022).
        dtype: matmul dtype (``bf16``, ``fp16``, ``fp32``, ``fp8``, ...).
        dropout: count dropout masks in the residual kernels.
        flash_attention: one fused causal kernel (default); False for the unfused
            attention of Megatron-LM 2021 (:func:`unfused_attention_kernels`).
        fp8_recipe: with an fp8 ``dtype``, how the stack quantizes (:data:`FP8_RECIPES`;
            default :data:`DEFAULT_FP8_RECIPE`): each fp8 GEMM gets a ``<name>.quant``
            kernel before it (:func:`_fp8_quant`). Ignored for other dtypes.
        elementwise: ``fused`` or ``eager`` (:data:`ELEMENTWISE_MODES`): how RMSNorm,
            SwiGLU and RoPE run (their eager forms move several times the bytes in more
            kernels); LayerNorm, GELU and residual adds are single kernels either way.
        expert_bias_impl: with ``model.moe.expert_bias``, how the stack adds the experts'
            biases (:data:`EXPERT_BIAS_IMPLS`): ``moe.experts.down_bias`` after the down
            projection, and ``moe.experts.up_bias`` after the up projection when ``eager``
            (:func:`expert_bias_kernels`).

    Returns:
        Kernels with FLOPs (FLOP) and HBM bytes (bytes) per micro-batch.

    Raises:
        ValueError: tp not dividing heads/FFN, ep not dividing experts, cp not dividing
            seq_len, layer out of range, unknown dtype.
    """
    _check_layer(model, layer)
    _check_tp(model, tp)
    _check_ep(model, ep)
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    if elementwise not in ELEMENTWISE_MODES:
        raise ValueError(f"elementwise: {elementwise!r} is not valid; valid: {', '.join(ELEMENTWISE_MODES)}")
    mm, em, act, ea = _dtypes(dtype)
    recipe = resolve_fp8_recipe(fp8_recipe) if em < 2 else None
    h, d = model.hidden_size, model.head_dim
    a_l, g_l = model.num_heads // tp, _kv_local(model, tp)
    s_q, s_k = seq_len // cp, seq_len
    # with a norm-fused fp8 recipe the norms in front of QKV and FC1 write fp8
    norm_out = 1.0 if recipe is not None and recipe.norm_fused else None

    def quant(kernel: Kernel, k: int, cols: int, from_norm: bool) -> list[Kernel]:
        """The fp8 quantization kernel of a GEMM over the layer's ``n`` tokens."""
        if recipe is None:
            return []
        return [_fp8_quant(f"{kernel.name}.quant", kernel.block, m=n, k=k, n=cols,
                           recipe=recipe, input_from_norm=from_norm, act=act)]

    if model.mla is not None:
        g_l = a_l  # MLA expands keys and values to every head
    window = model.attention_window(layer)
    core = _flash_core(micro_batch=micro_batch, heads=a_l, kv_heads=g_l, s_q=s_q, s_k=s_k,
                       d_qk=model.qk_head_dim, d_v=model.v_head_dim, act=act, ea=ea,
                       window=window)
    if window and not flash_attention:
        raise ValueError(f"flash_attention: False cannot run the {window}-token sliding "
                         f"window of layer {layer}; valid: True (a fused windowed kernel)")
    cores = [core] if flash_attention else unfused_attention_kernels(
        micro_batch=micro_batch, heads=a_l, s_q=s_q, s_k=s_k, head_dim=d, dtype=act,
        dropout=dropout)
    qkv = _matmul("attn.qkv", "attention", m=n, n=(a_l + 2 * g_l) * d, k=h, dtype=mm,
                  in_bytes=em, out_bytes=ea, params=h * (a_l + 2 * g_l) * d)
    out = _matmul("attn.out", "attention", m=n, n=h, k=a_l * d, dtype=mm, in_bytes=em,
                  out_bytes=ea, params=a_l * d * h)
    rope = []
    # RoPE needs the model to say it has it (a ``position_embedding`` of "rope"); the
    # ModelSpec field is proposed to the owner of strategies/model_spec.py. Without it no
    # rotary kernel is priced (GPT-3 and MPT use learned embeddings, which cost an add).
    if getattr(model, "position_embedding", "") == "rope":
        rope = [_rotary("attn.rope", "attention", tokens=n, q_heads=a_l, kv_heads=g_l,
                        head_dim=d, act=act, elementwise=elementwise)]
    if model.mla is not None:
        kernels = _mla_attention(model, n=n, n_sp=n_sp, tp=tp, mm=mm, em=em, act=act, ea=ea,
                                 core=core, recipe=recipe, norm_out=norm_out, dropout=dropout,
                                 elementwise=elementwise)
    else:
        kernels = [
            _norm("attn.norm", "attention", model, n_sp, act, ea, out_bytes=norm_out,
                  elementwise=elementwise),
            *quant(qkv, h, (a_l + 2 * g_l) * d, True),
            qkv,
            *rope,
            *cores,
            *quant(out, a_l * d, h, False),
            out,
            _residual("attn.residual", "attention", n_sp, h, act, ea, dropout),
        ]
    if not model.is_moe_layer(layer):
        kernels.append(_norm("mlp.norm", "mlp", model, n_sp, act, ea, out_bytes=norm_out,
                             elementwise=elementwise))
        kernels += _mlp("mlp", "mlp", model, rows=n, ffn_local=model.ffn_hidden_size // tp,
                        groups=1, mm=mm, em=em, act=act, ea=ea, recipe=recipe,
                        up_from_norm=True, elementwise=elementwise)
        kernels.append(_residual("mlp.residual", "mlp", n_sp, h, act, ea, dropout))
        return kernels

    moe = model.moe  # not None: is_moe_layer(layer) is True
    etp = tp if etp is None else etp
    _check_etp(model, etp)
    E, k = moe.num_experts, moe.top_k
    load = _default_load(model) if expert_load is None else expert_load
    local_pairs = n_sp * k          # this rank's token-expert pairs, before dispatch
    pairs = etp * local_pairs * load  # what its experts process, gathered over expert-TP
    fe_l = moe.expert_ffn_hidden_size // etp
    kernels.append(_norm("moe.norm", "moe", model, n_sp, act, ea, elementwise=elementwise))
    kernels.append(_matmul("moe.router", "moe", m=n_sp, n=E, k=h, dtype=act, in_bytes=ea,
                           out_bytes=ea, params=h * E))
    kernels.append(Kernel(
        name="moe.route", block="moe", kind="elementwise", shape=(n_sp, E), dtype=act,
        fwd_flops=5.0 * n_sp * E,
        # read logits; write fp32 probs and int32 indices of the top-k
        fwd_bytes=ea * n_sp * E + (FP32_BYTES + 4) * n_sp * k,
        bwd_input_flops=2.0 * n_sp * E,
        bwd_input_bytes=2 * ea * n_sp * E + FP32_BYTES * n_sp * k,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
    ))
    if moe.shared_experts:
        kernels += _mlp("moe.shared", "moe", model, rows=n,
                        ffn_local=moe.shared_experts * moe.expert_ffn_hidden_size // tp,
                        groups=1, mm=mm, em=em, act=act, ea=ea, recipe=recipe,
                        elementwise=elementwise)
    kernels.append(Kernel(
        name="moe.permute", block="moe", kind="memcpy", shape=(int(local_pairs), h), dtype=act,
        fwd_flops=0.0,
        fwd_bytes=2 * ea * local_pairs * h,
        bwd_input_flops=1.0 * local_pairs * h,  # sum of the top_k gradient copies
        bwd_input_bytes=2 * ea * local_pairs * h,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
    ))
    experts = [replace(k, expert=True) for k in _mlp(
        "moe.experts", "moe", model, rows=pairs, ffn_local=fe_l, groups=E // ep,
        mm=mm, em=em, act=act, ea=ea, recipe=recipe, elementwise=elementwise)]
    if moe.expert_bias:
        up_name = "moe.experts.gate_up" if model.mlp == "swiglu" else "moe.experts.fc1"
        up_cols = 2 * fe_l if model.mlp == "swiglu" else fe_l
        bias = expert_bias_kernels(pairs=pairs, local_experts=E // ep, hidden=h,
                                   up_cols=up_cols, ea=ea, act=act, impl=expert_bias_impl)
        with_bias = []
        for k in experts:
            with_bias.append(k)
            if k.name == up_name and "up" in bias:
                with_bias.append(bias["up"])
            elif k.kind == "matmul" and k.name != up_name:
                with_bias.append(bias["down"])
        experts = with_bias
    kernels += experts
    kernels.append(Kernel(
        name="moe.unpermute", block="moe", kind="elementwise", shape=(n_sp, h), dtype=act,
        fwd_flops=2.0 * local_pairs * h,  # scale by the router probability and sum
        fwd_bytes=ea * (local_pairs * h + n_sp * h) + FP32_BYTES * local_pairs,
        bwd_input_flops=3.0 * local_pairs * h,  # d(expert out) and d(prob)
        bwd_input_bytes=ea * (n_sp * h + 2 * local_pairs * h) + FP32_BYTES * 2 * local_pairs,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
    ))
    kernels.append(_residual("moe.residual", "moe", n_sp, h, act, ea, dropout))
    return kernels


def banded_causal_pairs(seq_len: int, window: int = 0) -> float:
    """Query-key pairs a causal mask keeps in one ``seq_len`` sequence when each query
    attends at most its last ``window`` keys (0: the whole prefix), as the area of the
    band ``0 <= q - k < w`` with ``w = min(window, s)``: ``s*w - w^2/2`` -- ``s^2/2`` without
    a window (:data:`CAUSAL_FLOP_FRACTION` of the full square), the diagonal's half
    tiles ignored as for the causal mask. A sliding-window flash kernel
    (FlashAttention-2 ``window_size=(w-1, 0)``, cuDNN/Transformer Engine
    ``window_size``) skips the key tiles outside the band the way a causal kernel skips
    those above the diagonal, so its executed FLOPs are these pairs times ``2*(d_qk + d_v)``
    per head.

    Raises:
        ValueError: a negative window or a non-positive length.
    """
    if seq_len <= 0 or window < 0:
        raise ValueError(f"banded attention: seq_len {seq_len!r} must be > 0 and window "
                         f"{window!r} >= 0 (0: no window)")
    w = seq_len if window == 0 else min(window, seq_len)
    return seq_len * w - CAUSAL_FLOP_FRACTION * w * w


def _flash_core(*, micro_batch: int, heads: int, kv_heads: int, s_q: int, s_k: int, d_qk: int,
                d_v: int, act: str, ea: float, window: int = 0) -> Kernel:
    """The fused causal attention kernel over local ``heads`` (``kv_heads`` key/value
    heads): scores ``QK^T`` over ``d_qk`` and ``PV`` over ``d_v`` dims
    (``CAUSAL * 2*b*s_q*s_k*a*(d_qk + d_v)`` FLOPs: ``4*b*s_q*s_k*a*d`` when both are ``d``;
    with a sliding ``window``, :func:`banded_causal_pairs` of the ``s_k`` sequence, the
    rank's ``s_q/s_k`` share of them under context parallelism, replace the ``s_q*s_k/2``);
    it reads q, k, v and writes o and the fp32 log-sum-exp; its backward (2.5x) reads q, k,
    v, o, do and the log-sum-exp and writes dq, dk, dv -- with or without a window (the
    band changes which tiles are visited, not what is read and written)."""
    if window and window < s_k:
        pairs = banded_causal_pairs(s_k, window) * s_q / s_k
        flops = 2.0 * micro_batch * pairs * heads * (d_qk + d_v)
    else:
        flops = CAUSAL_FLOP_FRACTION * 2.0 * micro_batch * s_q * s_k * heads * (d_qk + d_v)
    q, o = micro_batch * s_q * heads * d_qk, micro_batch * s_q * heads * d_v
    k, v = micro_batch * s_k * kv_heads * d_qk, micro_batch * s_k * kv_heads * d_v
    lse_bytes = FP32_BYTES * micro_batch * heads * s_q
    return Kernel(
        name="attn.core", block="attention", kind="attention",
        shape=(micro_batch, heads, kv_heads, s_q, s_k, d_qk), dtype=act,
        fwd_flops=flops,
        fwd_bytes=ea * (q + o + k + v) + lse_bytes,
        bwd_input_flops=FLASH_BWD_FLOP_FACTOR * flops,
        bwd_input_bytes=ea * 2 * (q + o + k + v) + lse_bytes,
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
        selective_recompute=True, window=window,
    )


def ring_attention_steps(core: Kernel, cp: int, *, d_v: int | None = None
                         ) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The ``cp`` steps of Transformer Engine's P2P ring attention for a causal ``core``
    kernel of one context-parallel rank (:func:`layer_kernels`' ``attn.core`` with shape
    ``(b, a, g, s/c, s, d_qk)``), and the merge kernel after each step.

    As ``AttnFuncWithCPAndKVP2P`` runs it (TransformerEngine
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``):
    the sequence is cut in ``2c`` chunks and rank ``r`` holds chunks ``r`` and
    ``2c-1-r`` (load balancing, ``get_seq_chunk_ids_for_reordering_before_attn``), so
    each step is half a ``(s/c) x (s/c)`` block: step 0 the causal diagonal block over
    its own K/V (``s_q = s_k = s/c``), every later step a block without mask, either all
    ``s/c`` queries over the first half of the K/V received (``s/(2c)`` keys, ranks
    ``r >= step``) or the second half of the queries over all of it (the others). The
    steps off the diagonal are priced as the first kind, the shorter key loop: the ring
    advances at its slowest rank. FLOPs: each step ``1/c`` of ``core``'s (they sum to it
    exactly); bytes: what each step's flash kernel reads and writes (q, the K/V block, o,
    the log-sum-exp; twice that and the gradients backward).

    Merge kernels (``attn.cp_merge``, elementwise, selective-recompute like the core):
    forward, the output and log-sum-exp correction of each step
    (``flash_attn_fwd_out_correction``, ``flash_attn_fwd_softmax_lse_correction``: read
    the step's output and the running output, write it; the log-sum-exp in fp64 as
    ``softmax_lse.to(torch.double)``); backward, the accumulation of the step's ``dq``
    and ``dk``/``dv`` into the running gradients (``dq.add_``, ``dkv.add_``).

    Args:
        core: the rank's causal attention kernel (no sliding window: TE's P2P ring does
            not run one).
        cp: context-parallel size ``c`` (>= 2).
        d_v: value head dim (None: ``core``'s ``d_qk``; MLA's differ).

    Raises:
        ValueError: a ``core`` that is not a causal attention kernel with that shape, a
            window, or ``cp < 2``.
    """
    shape = tuple(core.shape)
    if core.kind != "attention" or len(shape) != 6 or not core.causal or core.window:
        raise ValueError(f"ring attention: kernel {core.name!r} is not a causal attention "
                         "kernel without a window of shape (b, a, g, s/c, s, d)")
    if not isinstance(cp, int) or cp < 2:
        raise ValueError(f"cp: {cp!r} is not valid for ring attention; valid: an integer >= 2")
    b, heads, kv_heads, s_q, s_k, d_qk = shape
    if s_q % 2 or s_q * cp != s_k:
        raise ValueError(f"ring attention: {s_q} queries per rank of a {s_k}-token sequence "
                         f"with cp {cp} are not valid; valid: s/cp, an even number "
                         "(Megatron-Core: seq_len divisible by 2*cp)")
    d_v = d_qk if d_v is None else d_v
    ea = ELEMENT_BYTES[core.dtype]
    chunk = s_q // 2

    def block(name: str, rows: int, keys: int, causal: bool) -> Kernel:
        flops = (CAUSAL_FLOP_FRACTION if causal else 1.0) * 2.0 * b * rows * keys * heads * (
            d_qk + d_v)
        q, o = b * rows * heads * d_qk, b * rows * heads * d_v
        k, v = b * keys * kv_heads * d_qk, b * keys * kv_heads * d_v
        lse_bytes = FP32_BYTES * b * heads * rows
        return Kernel(name=name, block="attention", kind="attention",
                      shape=(b, heads, kv_heads, rows, keys, d_qk), dtype=core.dtype,
                      fwd_flops=flops, fwd_bytes=ea * (q + o + k + v) + lse_bytes,
                      bwd_input_flops=FLASH_BWD_FLOP_FACTOR * flops,
                      bwd_input_bytes=ea * 2 * (q + o + k + v) + lse_bytes,
                      bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
                      selective_recompute=True, causal=causal)

    def merge(name: str, rows: int, keys: int, first: bool) -> Kernel:
        out = b * rows * heads * d_v
        lse = b * heads * rows
        # forward: the first step's output is copied (read, write), later ones corrected
        # into the running output (read both, write); the fp64 log-sum-exp likewise
        fwd = ea * out * (2 if first else 3) + 8 * lse * (1 if first else 3) + FP32_BYTES * lse
        dq, dkv = b * rows * heads * d_qk, b * keys * kv_heads * (d_qk + d_v)
        return Kernel(name=name, block="attention", kind="elementwise",
                      shape=(b * rows, heads * d_v), dtype=core.dtype,
                      fwd_flops=(0.0 if first else 3.0) * out,
                      fwd_bytes=fwd,
                      bwd_input_flops=float(dq + dkv),
                      bwd_input_bytes=3 * ea * (dq + dkv),
                      bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
                      selective_recompute=True, launches=(1 if first else 2, 2))

    steps = [block(f"{core.name}.cp0", s_q, s_q, True)]
    merges = [merge("attn.cp_merge.cp0", s_q, s_q, True)]
    for step in range(1, cp):
        steps.append(block(f"{core.name}.cp{step}", s_q, chunk, False))
        merges.append(merge(f"attn.cp_merge.cp{step}", s_q, chunk, False))
    return tuple(steps), tuple(merges)


#: How context-parallel attention moves K/V between the ranks of a CP group
#: (``ParallelPlan.cp_comm_type``). ``p2p``: Transformer Engine's ring
#: (``AttnFuncWithCPAndKVP2P``, Megatron-Core ``--cp-comm-type p2p``, the default), priced by
#: :func:`ring_attention_steps`. ``all_gather``: Transformer Engine's
#: ``AttnFuncWithCPAndKVAllGather`` (``--cp-comm-type allgather``; the scheme of Meta's Llama
#: 3 CP): K/V all-gathered, then the local queries' kernel over them, nothing overlapped.
#: ``torch_allgather`` / ``torch_alltoall``: PyTorch's
#: ``context_parallel`` (``torch/distributed/tensor/experimental/_attention.py``,
#: ``_templated_ring_attention`` and its backward, what torchtitan runs) with
#: ``_cp_options.rotate_method`` ``ALL_GATHER`` (its default: one all-gather of every
#: rank's K/V before the ring) or ``ALL_TO_ALL`` (a permute per step), priced by
#: :func:`torch_ring_attention_kernels`.
CP_COMM_TYPES = ("p2p", "all_gather", "torch_allgather", "torch_alltoall")


@dataclass(frozen=True)
class TorchRingKernels:
    """The memory-bound kernels PyTorch's ring attention runs around its per-step SDPA
    kernels (:func:`torch_ring_attention_kernels`).

    Attributes:
        pack_first: step 0's ``key.contiguous()``, ``value.contiguous()`` and
            ``torch.cat([key.flatten(), value.flatten()])`` (the buffer exchanged).
        pack: a later step's ``torch.cat`` of the K/V it holds (made before every
            exchange call but the last, also when the all-gather rotater sends nothing).
        merge_first: forward, step 0's output upcast to fp32 (``convert_to_f32``);
            backward, the fp32 gradient buffers (``torch.zeros_like``), step 0's dK/dV and
            dQ accumulated into them, the fp32 dK/dV concatenated for the exchange.
        merge: forward, a later step's fp32 merge (``_SDPAMerger._merge_one``); backward,
            its gradients accumulated into the fp32 buffers and the dK/dV concatenated.
        finish: forward, the merged output cast back (``results``); backward, dQ and the
            returned dK/dV cast back to the input dtype.
        kv_bytes: one rank's K/V block as SDPA receives it, bytes (what an exchange
            sends; the all-gather receives ``cp`` of them).
        grad_kv_bytes: one rank's dK/dV in fp32, bytes (what each backward step sends).
    """

    pack_first: Kernel
    pack: Kernel
    merge_first: Kernel
    merge: Kernel
    finish: Kernel
    kv_bytes: float
    grad_kv_bytes: float


def torch_ring_attention_kernels(core: Kernel, cp: int, *, d_v: int | None = None,
                                 kv_heads: int | None = None) -> TorchRingKernels:
    """HBM traffic of PyTorch's ``context_parallel`` ring attention around its SDPA steps
    (``torch/distributed/tensor/experimental/_attention.py``: ``_templated_ring_attention``,
    ``_templated_ring_attention_backward``, ``_SDPAMerger``; options
    ``convert_to_f32 = True``, ``enable_load_balance = True``), for a causal ``core`` kernel
    of one context-parallel rank of shape ``(b, a, g, s/c, s, d_qk)``. The SDPA steps are
    those of :func:`ring_attention_steps` (the same round-robin load balancing: chunks
    ``r`` and ``2c-1-r``; the slowest rank's step is all ``s/c`` queries over half a block).

    Each op is an eager ATen kernel reading and writing HBM (bytes per element: bf16 2,
    fp32 4; ``E_o = b*(s/c)*a*d_v`` output elements, ``E_q`` query elements, ``E_kv`` K/V
    elements as SDPA receives them, ``L = b*a*(s/c)`` log-sum-exp elements):

    * pack: ``contiguous`` of K and V and their ``cat``: ``2 * 4 * E_kv`` at step 0 (two
      copies, read 2 write 2), ``4 * E_kv`` for the ``cat`` of a later step.
    * forward merge of a later step (full output, fp32): ``block_out.to(float32)`` r2w4,
      ``out - block_out`` r4r4w4, ``sigmoid(block_lse - lse) * (...)`` r4w4, ``out - ...``
      r4r4w4 = ``38 * E_o``; the log-sum-exp update (``block_lse - lse``, ``sigmoid``,
      ``lse - block_lse``, ``logsigmoid``, ``lse - ...``: three fp32 r4r4w4 and two r4w4
      kernels) ``52 * L``; 9 kernels, ``5 * E_o`` FLOPs. Step 0: the upcast, ``6 * E_o``.
    * backward of step 0: three fp32 zero buffers ``4 * (E_q + E_kv)``, ``grad_key +=``,
      ``grad_value +=`` and ``grad_query +=`` (fp32 += bf16: r4r2w4) ``10 * (E_kv + E_q)``,
      the fp32 ``cat`` of dK/dV r4w4 ``8 * E_kv``; 7 kernels. A later step (the slowest
      rank: all queries over the first half of the keys, ``_partial_update(add=True)``):
      half of dK/dV accumulated (``5 * E_kv``) and the halves concatenated again
      (``8 * E_kv``), dQ accumulated (``10 * E_q``), dK/dV concatenated (``8 * E_kv``);
      6 kernels.
    * finish: forward ``out.to(bf16)`` ``6 * E_o``; backward ``grad_query.to(bf16)`` and
      the returned dK/dV ``.to(bf16)`` ``6 * (E_q + E_kv)``.

    Args:
        core: the rank's causal attention kernel (no sliding window: the ring runs SDPA
            with ``is_causal`` only).
        cp: context-parallel size ``c`` (>= 2).
        d_v: value head dim (None: ``core``'s ``d_qk``).
        kv_heads: K/V heads as SDPA receives them (None: ``core``'s query heads, since
            torchtitan's Llama expands K/V to the query heads with ``repeat_kv`` before
            ``F.scaled_dot_product_attention``, torchtitan/models/llama/model.py
            ``Attention.forward``).

    Raises:
        ValueError: a ``core`` that is not a causal attention kernel without a window of
            that shape, ``cp < 2`` or ``kv_heads < 1``.
    """
    ring_attention_steps(core, cp, d_v=d_v)  # the same shape checks
    b, heads, _, s_q, _, d_qk = core.shape
    d_v = d_qk if d_v is None else d_v
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1:
        raise ValueError(f"kv_heads: {kv_heads!r} is not valid; valid: an integer >= 1")
    e_o, e_q = b * s_q * heads * d_v, b * s_q * heads * d_qk
    e_kv = b * s_q * kv_heads * (d_qk + d_v)
    lse = b * heads * s_q
    ea = ELEMENT_BYTES[core.dtype]
    f4 = FP32_BYTES

    def vector(name: str, fwd_bytes: float, bwd_bytes: float, launches: tuple[int, int],
               fwd_flops: float = 0.0, bwd_flops: float = 0.0) -> Kernel:
        return Kernel(name=name, block="attention", kind="elementwise",
                      shape=(b * s_q, heads * d_v), dtype=core.dtype,
                      fwd_flops=fwd_flops, fwd_bytes=fwd_bytes,
                      bwd_input_flops=bwd_flops, bwd_input_bytes=bwd_bytes,
                      bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
                      selective_recompute=True, launches=launches)

    copy = 2 * ea * e_kv                   # read and write the K/V once
    upcast = (ea + f4)                     # bf16 read, fp32 write
    accumulate = (f4 + ea + f4)            # fp32 += bf16
    pack_first = vector("attn.cp_pack.first", 2 * copy, 2 * copy, (3, 3))
    pack = vector("attn.cp_pack", copy, copy, (1, 1))
    merge_first = vector(
        "attn.cp_merge.first", upcast * e_o,
        f4 * (e_q + e_kv) + accumulate * (e_kv + e_q) + 2 * f4 * e_kv, (1, 7),
        bwd_flops=float(e_kv + e_q))
    merge = vector(
        "attn.cp_merge", (upcast + 3 * f4 + 2 * f4 + 3 * f4) * e_o + 13 * f4 * lse,
        accumulate * e_kv / 2 + 2 * f4 * e_kv + accumulate * e_q + 2 * f4 * e_kv, (9, 6),
        fwd_flops=5.0 * e_o, bwd_flops=float(e_kv / 2 + e_q))
    finish = vector("attn.cp_finish", (f4 + ea) * e_o, (f4 + ea) * (e_q + e_kv), (1, 2))
    return TorchRingKernels(pack_first=pack_first, pack=pack, merge_first=merge_first,
                            merge=merge, finish=finish, kv_bytes=float(ea * e_kv),
                            grad_kv_bytes=float(f4 * e_kv))


def _mla_attention(model: ModelSpec, *, n: int, n_sp: int, tp: int, mm: str, em: float,
                   act: str, ea: float, core: Kernel, recipe: Fp8Recipe | None,
                   norm_out: float | None, dropout: bool, elementwise: str) -> list[Kernel]:
    """Multi-head latent attention as Megatron-Core's ``MLASelfAttention`` runs it
    (``megatron/core/transformer/multi_latent_attention.py``; DeepSeek-V3 report Section
    2.1.1): ``attn.norm``; the down projections on the rank's sequence shard with their
    weights replicated over TP (``attn.q_down`` ``h x q_lora`` and its norm
    ``attn.q_norm``, ``attn.kv_down`` ``h x (kv_lora + rope)`` and ``attn.kv_norm``);
    the latents are then gathered over TP (the lowering's all-gather, latent-wide) for
    the column-parallel up projections ``attn.q_up`` (``q_lora x a*(nope + rope)``) and
    ``attn.kv_up`` (``kv_lora x a*(nope + v)``); the core over ``nope + rope`` query/key
    and ``v`` value dims; ``attn.out`` (``a*v x h``, row-parallel); ``attn.residual``.
    Without a query latent (``q_lora_rank`` 0) queries come from the gathered hidden state
    (``attn.q``, column-parallel)."""
    mla, h = model.mla, model.hidden_size
    a_l = model.num_heads // tp
    d_qk, d_v = model.qk_head_dim, model.v_head_dim
    kv_width = mla.kv_lora_rank + mla.qk_rope_head_dim

    def gemm(name: str, rows: int, cols: int, inner: int) -> list[Kernel]:
        kernel = _matmul(name, "attention", m=rows, n=cols, k=inner, dtype=mm, in_bytes=em,
                         out_bytes=ea, params=inner * cols)
        if recipe is None:
            return [kernel]
        quant = _fp8_quant(f"{name}.quant", "attention", m=rows, k=inner, n=cols, recipe=recipe,
                           input_from_norm=inner == h, act=act)
        return [quant, kernel]

    def latent_norm(name: str, rows: int, width: int) -> Kernel:
        # an RMSNorm over the latent (the norm kernel of a width-``width`` model)
        narrow = replace(model, hidden_size=width, norm="rmsnorm")
        return _norm(name, "attention", narrow, rows, act, ea, elementwise=elementwise)

    kernels = [_norm("attn.norm", "attention", model, n_sp, act, ea, out_bytes=norm_out,
                     elementwise=elementwise)]
    if mla.q_lora_rank:
        kernels += gemm("attn.q_down", n_sp, mla.q_lora_rank, h)
        kernels.append(latent_norm("attn.q_norm", n_sp, mla.q_lora_rank))
    kernels += gemm("attn.kv_down", n_sp, kv_width, h)
    kernels.append(latent_norm("attn.kv_norm", n_sp, mla.kv_lora_rank))
    if mla.q_lora_rank:
        kernels += gemm("attn.q_up", n, a_l * d_qk, mla.q_lora_rank)
    else:
        kernels += gemm("attn.q", n, a_l * d_qk, h)
    kernels += gemm("attn.kv_up", n, a_l * (mla.qk_nope_head_dim + d_v), mla.kv_lora_rank)
    kernels.append(core)
    kernels += gemm("attn.out", n, h, a_l * d_v)
    kernels.append(_residual("attn.residual", "attention", n_sp, h, act, ea, dropout))
    return kernels


def mla_latent_width(model: ModelSpec) -> int:
    """Elements per token the MLA latents carry into the up projections (the tensor its
    TP all-gather moves): query latent + key/value latent + the shared rotary key (the
    hidden size instead of the query latent without one)."""
    mla = model.mla
    query = mla.q_lora_rank or model.hidden_size
    return query + mla.kv_lora_rank + mla.qk_rope_head_dim


def kv_cache_elements_per_token(model: ModelSpec) -> int:
    """Key/value cache elements one token leaves per model (all layers): MLA caches its
    key/value latent and the shared rotary key, ``(kv_lora + rope) * L`` (DeepSeek-V2
    report Table 1: ``(d_c + d_h^R) l``); multi-head/grouped-query attention its keys
    and values, ``2 * g * d * L``."""
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * model.num_layers
    return 2 * model.num_kv_heads * model.head_dim * model.num_layers


def unfused_attention_kernels(*, micro_batch: int, heads: int, s_q: int, s_k: int,
                              head_dim: int, dtype: str, dropout: bool = True) -> list[Kernel]:
    """Attention without a fused kernel (Megatron-LM 2021): the full ``s x s`` scores
    are materialised in HBM.

    ``attn.scores`` (batched GEMM Q K^T over the full matrix: a causal mask does not
    save work here), ``attn.softmax`` (Megatron's fused scale-mask-softmax: read scores,
    write probabilities), ``attn.dropout`` (read, write output and a 1-byte mask),
    ``attn.context`` (batched GEMM P V). Every one is re-run by selective recompute
    (Korthikanti et al. 2022, Section 5) and the stored probabilities, mask and dropout
    output are the ``5as/h`` term of their activation memory. Bytes are HBM traffic per
    micro-batch; backward: GEMMs 2x forward (both inputs are activations: no weights),
    softmax backward reads probabilities and gradients and writes gradients, dropout
    backward reads the gradient and the mask.
    """
    _, _, act, e = _dtypes(dtype)
    scores = micro_batch * heads * s_q * s_k
    qk = micro_batch * heads * (s_q + s_k) * head_dim
    gemm = 2.0 * scores * head_dim
    kernels = [
        Kernel(name="attn.scores", block="attention", kind="matmul",
               shape=(micro_batch * heads, s_q, s_k, head_dim), dtype=act,
               fwd_flops=gemm, fwd_bytes=e * (qk + scores),
               bwd_input_flops=2 * gemm, bwd_input_bytes=e * (2 * qk + scores),
               bwd_weight_flops=0.0, bwd_weight_bytes=0.0, selective_recompute=True),
        Kernel(name="attn.softmax", block="attention", kind="elementwise",
               shape=(micro_batch, heads, s_q, s_k), dtype=act,
               fwd_flops=5.0 * scores, fwd_bytes=2 * e * scores,
               bwd_input_flops=3.0 * scores, bwd_input_bytes=3 * e * scores,
               bwd_weight_flops=0.0, bwd_weight_bytes=0.0, selective_recompute=True),
    ]
    if dropout:
        kernels.append(Kernel(
            name="attn.dropout", block="attention", kind="elementwise",
            shape=(micro_batch, heads, s_q, s_k), dtype=act,
            fwd_flops=2.0 * scores, fwd_bytes=(2 * e + DROPOUT_MASK_BYTES) * scores,
            bwd_input_flops=1.0 * scores, bwd_input_bytes=(2 * e + DROPOUT_MASK_BYTES) * scores,
            bwd_weight_flops=0.0, bwd_weight_bytes=0.0, selective_recompute=True))
    kernels.append(Kernel(
        name="attn.context", block="attention", kind="matmul",
        shape=(micro_batch * heads, s_q, head_dim, s_k), dtype=act,
        fwd_flops=gemm, fwd_bytes=e * (scores + qk),
        bwd_input_flops=2 * gemm, bwd_input_bytes=e * (2 * scores + 2 * qk),
        bwd_weight_flops=0.0, bwd_weight_bytes=0.0, selective_recompute=True))
    return kernels


def embedding_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1,
                      cp: int = 1, sequence_parallel: bool = True, dtype: str = "bf16",
                      dropout: bool = True) -> list[Kernel]:
    """Forward kernels of the vocab-parallel input embedding on one GPU.

    ``embed.lookup`` (``memcpy``): reads the ``n`` token ids and the rows of its
    ``ceil(V/t) x h`` shard, writes the (masked) ``n x h`` output that TP then reduces;
    backward (weight only, ATen ``embedding_dense_backward``) zero-fills the dense
    ``ceil(V/t) x h`` gradient, reads dy and scatter-adds it into the rows the ids hit. With
    ``dropout``, ``embed.dropout`` on ``n_sp x h`` after the reduce(-scatter).
    ``n = micro_batch*seq_len/cp``. Bytes in bytes, FLOPs in FLOP.
    """
    _check_tp(model, tp)
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    _, _, act, ea = _dtypes(dtype)
    h = model.hidden_size
    v_l = math.ceil(model.vocab_size / tp)
    kernels = [Kernel(
        name="embed.lookup", block="embedding", kind="memcpy", shape=(n, h), dtype=act,
        fwd_flops=0.0,
        fwd_bytes=TOKEN_ID_BYTES * n + ea * (n * h / tp + n * h),
        bwd_input_flops=0.0, bwd_input_bytes=0.0,
        bwd_weight_flops=1.0 * n * h / tp,
        # PyTorch's embedding_dense_backward zero-fills the whole (V/t x h) gradient, then
        # sorts the ids and scatter-adds dy into the rows they hit
        bwd_weight_bytes=TOKEN_ID_BYTES * n + ea * (n * h + 2 * n * h / tp + v_l * h),
        params=v_l * h,
    )]
    if dropout:
        mask = DROPOUT_MASK_BYTES
        kernels.append(Kernel(
            name="embed.dropout", block="embedding", kind="elementwise", shape=(n_sp, h), dtype=act,
            fwd_flops=1.0 * n_sp * h,
            fwd_bytes=(2 * ea + mask) * n_sp * h,
            bwd_input_flops=1.0 * n_sp * h,
            bwd_input_bytes=(2 * ea + mask) * n_sp * h,
            bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
        ))
    return kernels


def head_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1, cp: int = 1,
                 sequence_parallel: bool = True, dtype: str = "bf16",
                 cross_entropy: str = "fused", elementwise: str = "fused") -> list[Kernel]:
    """Forward kernels of the final norm, vocab-parallel LM head and loss on one GPU.

    ``head.norm`` (final norm over ``n_sp x h``), ``head.logits`` (GEMM ``n x h`` by
    ``h x ceil(V/t)``; owns ``ceil(V/t)*h`` params unless the embedding is tied, in which case
    the embedding kernel owns them), ``head.cross_entropy`` (vocab-parallel, ``5`` FLOPs per
    logit forward, 2 backward; its HBM traffic per logit is the ``cross_entropy`` variant's,
    :data:`CROSS_ENTROPY_BYTES_PER_LOGIT`: ``fused`` one pass each way, ``megatron`` the
    unfused fp32 vocab-parallel loss, ``eager`` PyTorch's fp32 ``F.cross_entropy``).
    ``n = micro_batch*seq_len/cp``. Bytes in bytes, FLOPs in FLOP.
    """
    _check_tp(model, tp)
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    _, _, act, ea = _dtypes(dtype)
    h = model.hidden_size
    v_l = math.ceil(model.vocab_size / tp)
    logits = n * v_l
    c = CROSS_ENTROPY_FWD_FLOPS_PER_ELEMENT
    if cross_entropy not in CROSS_ENTROPY_BYTES_PER_LOGIT:
        raise ValueError(f"cross_entropy: {cross_entropy!r} is not valid; valid: "
                         f"{', '.join(CROSS_ENTROPY_BYTES_PER_LOGIT)}")
    ce_fwd, ce_bwd = CROSS_ENTROPY_BYTES_PER_LOGIT[cross_entropy]
    return [
        _norm("head.norm", "head", model, n_sp, act, ea, elementwise=elementwise),
        # the output layer stays in the activation dtype under fp8 (module docstring)
        _matmul("head.logits", "head", m=n, n=v_l, k=h, dtype=act, in_bytes=ea, out_bytes=ea,
                params=0 if model.tied_embeddings else v_l * h),
        Kernel(
            name="head.cross_entropy", block="head", kind="elementwise", shape=(n, v_l), dtype=act,
            fwd_flops=c * logits,
            fwd_bytes=ce_fwd * logits,
            bwd_input_flops=2.0 * logits,
            bwd_input_bytes=ce_bwd * logits,
            bwd_weight_flops=0.0, bwd_weight_bytes=0.0,
            launches=CROSS_ENTROPY_LAUNCHES[cross_entropy],
        ),
    ]


# --------------------------------------------------------------------------- optimizer step

#: The tensors an Adam(W) step touches per parameter, each in its stored dtype:
#: ``grad`` (the gradient the optimizer reads), ``param`` (the weight it updates: the
#: master weight, or the model's own weight when there is none), ``exp_avg`` and
#: ``exp_avg_sq`` (the moments), ``tmp`` (a temporary in ``exp_avg_sq``'s dtype, foreach
#: only).
ADAM_TENSORS = ("grad", "param", "exp_avg", "exp_avg_sq", "tmp")
#: The passes over HBM of one Adam(W) update by implementation, each pass as
#: ``{tensor: (reads, writes)}`` per parameter (the dtype of each tensor gives the bytes,
#: :func:`adam_bytes_per_param`).
#: ``fused``: one multi-tensor kernel reads the gradient, weight and both moments and writes
#: the weight and both moments (TE ``tex.multi_tensor_adam``, transformer_engine/pytorch/
#: optimizers/fused_adam.py ``FusedAdam.step`` tensor lists ``[g, p, m, v, p_main]``; Apex
#: ``distributed_adam_cuda.multi_tensor_fused_adam`` lists ``[p, m, v, g, p_out]``,
#: apex/contrib/optimizers/distributed_fused_adam.py ``_local_step``; ``torch.optim.AdamW(
#: fused=True)``, aten/src/ATen/native/cuda/fused_adamw_impl.cu); the model-weight copy it
#: also writes (``p`` / ``p_out``) is :func:`adam_bytes_per_param`'s ``weight_copy_bytes``.
#: ``foreach``: ``torch.optim.AdamW(foreach=True)`` (torch.optim's default on CUDA, used by
#: torchtitan), ``_multi_tensor_adam`` in torch/optim/adam.py: ``_foreach_mul_`` of the
#: weights by ``1 - lr*wd``, ``_foreach_lerp_`` of exp_avg toward the gradient,
#: ``_foreach_mul_`` and ``_foreach_addcmul_`` of exp_avg_sq, ``_foreach_sqrt`` of
#: exp_avg_sq into a temporary, ``_foreach_div_`` of it by the bias correction,
#: ``_foreach_add_`` of eps, ``_foreach_addcdiv_`` of the weights. ``for-loop``: the same
#: ops tensor by tensor (``foreach=False``, Composer's ``DecoupledAdamW``).
_FOREACH_PASSES = (
    {"param": (1, 1)},                                  # mul_ (decoupled weight decay)
    {"exp_avg": (1, 1), "grad": (1, 0)},                # lerp_
    {"exp_avg_sq": (1, 1)},                             # mul_ by beta2
    {"exp_avg_sq": (1, 1), "grad": (1, 0)},             # addcmul_(grad, grad)
    {"exp_avg_sq": (1, 0), "tmp": (0, 1)},              # sqrt
    {"tmp": (1, 1)},                                    # div_ by sqrt(bias correction 2)
    {"tmp": (1, 1)},                                    # add_ eps
    {"param": (1, 1), "exp_avg": (1, 0), "tmp": (1, 0)},  # addcdiv_
)
ADAM_PASSES = {
    "fused": ({"grad": (1, 0), "param": (1, 1), "exp_avg": (1, 1), "exp_avg_sq": (1, 1)},),
    "foreach": _FOREACH_PASSES,
    "for-loop": _FOREACH_PASSES,
}
ADAM_IMPLEMENTATIONS = tuple(ADAM_PASSES)
ADAM_OPS = {name: len(passes) for name, passes in ADAM_PASSES.items()}


def adam_bytes_per_param(implementation: str = "fused", *, grad_bytes: float = 4.0,
                         param_bytes: float = 4.0, exp_avg_bytes: float = 4.0,
                         exp_avg_sq_bytes: float = 4.0, param_extra_read_bytes: float = 0.0,
                         weight_copy_bytes: float = 0.0) -> float:
    """HBM bytes per parameter of one Adam(W) update of ``implementation``
    (:data:`ADAM_PASSES`): every pass's reads and writes of the gradient
    (``grad_bytes`` per element), the updated weight (``param_bytes``: the master, or the
    model weight when the optimizer keeps none), the moments (``exp_avg_bytes``,
    ``exp_avg_sq_bytes``; the foreach temporary in ``exp_avg_sq``'s dtype), plus
    ``param_extra_read_bytes`` read once (the bf16 weight a 16-bit master remainder is
    rebuilt from) and ``weight_copy_bytes`` written once (the model-weight copy: bf16 2,
    FP8 1, none 0). All fp32 and no copy: fused 28, foreach/for-loop 80.

    Raises:
        ValueError: unknown implementation, negative or non-positive sizes.
    """
    if implementation not in ADAM_PASSES:
        raise ValueError(f"implementation: {implementation!r} is not valid; valid: "
                         f"{', '.join(ADAM_IMPLEMENTATIONS)}")
    sizes = {"grad": grad_bytes, "param": param_bytes, "exp_avg": exp_avg_bytes,
             "exp_avg_sq": exp_avg_sq_bytes, "tmp": exp_avg_sq_bytes}
    for name, value in (*sizes.items(), ("param_extra_read_bytes", param_extra_read_bytes),
                        ("weight_copy_bytes", weight_copy_bytes)):
        if not 0 <= value < math.inf or (name in ("grad", "param", "exp_avg", "exp_avg_sq")
                                         and value == 0):
            field = name if name.endswith("_bytes") else f"{name}_bytes"
            raise ValueError(f"{field}: {value!r} is not valid; give bytes per element "
                             f"(> 0 for the gradient, weight and moments, >= 0 otherwise)")
    total = sum(sizes[tensor] * (reads + writes)
                for step in ADAM_PASSES[implementation] for tensor, (reads, writes) in step.items())
    return total + param_extra_read_bytes + weight_copy_bytes


#: HBM bytes per parameter of one Adam(W) update by implementation with fp32 gradient,
#: weight and moments and no model-weight copy (:func:`adam_bytes_per_param`'s defaults):
#: fused 28 (read 4 x 4, write 3 x 4), foreach/for-loop 80 (8 passes).
ADAM_BYTES_PER_PARAM = {name: adam_bytes_per_param(name) for name in ADAM_IMPLEMENTATIONS}
#: FLOPs per parameter of an Adam update (moments 5, bias-corrected step 5, decay 2).
ADAM_FLOPS_PER_PARAM = 12.0
#: Gradient-norm clipping: the global L2 norm reads every gradient once (Apex
#: ``multi_tensor_l2norm`` / ``torch._foreach_norm``, 2 FLOPs per element), then, when the norm
#: exceeds the threshold, every gradient is scaled in place (Megatron ``clip_grad_by_total_norm_fp32``
#: ``multi_tensor_scale``, ``torch._foreach_mul_``: read and write).


def optimizer_kernels(params: float, *, implementation: str = "fused", grad_bytes: float = 4.0,
                      bf16_copy: bool = True, clip_grad: bool = True, clip_applied: bool = True,
                      tensors: int = 1, adam_bytes: float | None = None) -> list[Kernel]:
    """The optimizer step of one rank over ``params`` local parameters (its ZeRO shard).

    ``optimizer.grad_norm`` (reads the gradients, ``grad_bytes`` each; its scalar is then
    all-reduced over the data-parallel group), ``optimizer.clip`` (scales them in place when
    clipping is applied) and ``optimizer.adam`` (``adam_bytes`` per parameter: what the
    stored dtypes give, :meth:`strategies.memory.OptimizerStorage.adam_bytes_per_param`; by
    default :func:`adam_bytes_per_param` of fp32 state, a ``grad_bytes`` gradient and a
    2-byte model-weight copy with ``bf16_copy``). All in the forward
    fields (``fwd_flops``, ``fwd_bytes``, ``launches[0]``): the step has no backward.
    ``tensors``: parameter tensors, for the launches of a per-tensor ``for-loop``
    implementation.

    Raises:
        ValueError: unknown implementation, negative sizes.
    """
    if implementation not in ADAM_PASSES:
        raise ValueError(f"implementation: {implementation!r} is not valid; valid: "
                         f"{', '.join(ADAM_IMPLEMENTATIONS)}")
    if params < 0 or grad_bytes <= 0 or tensors < 1:
        raise ValueError(f"params {params!r}, grad_bytes {grad_bytes!r} and tensors {tensors!r} "
                         "must be >= 0, > 0 and >= 1")
    rows = int(round(params))
    if adam_bytes is None:
        adam_bytes = adam_bytes_per_param(implementation, grad_bytes=grad_bytes,
                                          weight_copy_bytes=2.0 if bf16_copy else 0.0)

    def step(name: str, flops: float, nbytes: float, launches: int) -> Kernel:
        return Kernel(name=name, block="optimizer", kind="optimizer", shape=(rows,), dtype="fp32",
                      fwd_flops=flops, fwd_bytes=nbytes, bwd_input_flops=0.0, bwd_input_bytes=0.0,
                      bwd_weight_flops=0.0, bwd_weight_bytes=0.0, launches=(launches, 0))

    per_tensor = tensors if implementation == "for-loop" else 1
    kernels = []
    if clip_grad:
        kernels.append(step("optimizer.grad_norm", 2.0 * params, grad_bytes * params, per_tensor))
        if clip_applied:
            kernels.append(step("optimizer.clip", 1.0 * params, 2.0 * grad_bytes * params, per_tensor))
    kernels.append(step("optimizer.adam", ADAM_FLOPS_PER_PARAM * params, adam_bytes * params,
                        ADAM_OPS[implementation] * per_tensor))
    return kernels


def fp8_weight_quant_kernel(params: float, recipe: str | Fp8Recipe | None = None) -> Kernel:
    """The per-step fp8 weight quantization of a weight-caching recipe (TE
    ``is_first_microbatch``): every local fp8 weight cast once per optimizer step,
    ``recipe.quant_bytes_per_element`` bytes per parameter, to run before the first
    micro-batch's forward (or fused into the optimizer with fp8 primary weights). Only the
    transformer layers' linear weights count. Fields as :func:`optimizer_kernels`."""
    r = resolve_fp8_recipe(recipe)
    return Kernel(name="fp8.weight_quant", block="optimizer", kind="elementwise",
                  shape=(int(round(params)),), dtype="bf16",
                  fwd_flops=2.0 * params, fwd_bytes=r.quant_bytes_per_element * params,
                  bwd_input_flops=0.0, bwd_input_bytes=0.0, bwd_weight_flops=0.0,
                  bwd_weight_bytes=0.0, launches=(1, 0))


# --------------------------------------------------------------------------- parameters


def _attention_params(model: ModelSpec, tp: int = 1) -> int:
    """Attention block parameters on one TP rank (with its norm). MLA: the replicated down
    projections and latent norms, the split up and output projections."""
    h, d = model.hidden_size, model.head_dim
    a_l, g_l = model.num_heads // tp, _kv_local(model, tp)
    mla = model.mla
    if mla is None:
        return h * (a_l + 2 * g_l) * d + a_l * d * h + _norm_params(model)
    query = (h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * a_l * model.qk_head_dim
             if mla.q_lora_rank else h * a_l * model.qk_head_dim)
    kv = (h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
          + mla.kv_lora_rank * a_l * (mla.qk_nope_head_dim + mla.v_head_dim))
    return query + kv + a_l * mla.v_head_dim * h + _norm_params(model)


def layer_params(model: ModelSpec, layer: int, *, tp: int = 1, ep: int = 1,
                 etp: int | None = None) -> tuple[int, int]:
    """``(dense, expert)`` parameters of layer ``layer`` on one rank (elements).

    Dense: attention ``h*(a + 2g)*d/t + a*d*h/t`` (KV replicated when ``t > g``), two norms
    (replicated), and either the MLP ``m*h*f/t`` (``m`` = 2 GELU, 3 SwiGLU) or, in an MoE
    layer, the router ``h*E`` plus shared experts ``m*h*S*f_e/t``. Expert: routed experts
    ``(E/ep)*m*h*f_e/etp`` (``etp``: expert-TP, default ``t``). With ``tp = ep = 1`` these
    are the unsharded counts.
    """
    _check_layer(model, layer)
    _check_tp(model, tp)
    _check_ep(model, ep)
    h, m = model.hidden_size, _mlp_matrices(model)
    dense = _attention_params(model, tp) + _norm_params(model)
    if not model.is_moe_layer(layer):
        return dense + m * h * (model.ffn_hidden_size // tp), 0
    moe = model.moe  # not None: is_moe_layer(layer) is True
    etp = tp if etp is None else etp
    _check_etp(model, etp)
    dense += h * moe.num_experts + m * h * (moe.shared_experts * moe.expert_ffn_hidden_size // tp)
    return dense, (moe.num_experts // ep) * m * h * (moe.expert_ffn_hidden_size // etp)


def param_counts(model: ModelSpec) -> ParamCounts:
    """Parameter counts of the whole model (elements; see :class:`ParamCounts`),
    memoised per model (a sweep asks for every plan's MFU; :func:`_param_counts`)."""
    try:
        return _param_counts_memo(model)
    except TypeError:  # a spec that cannot be hashed: computed each time
        return _param_counts(model)


@lru_cache(maxsize=64)
def _param_counts_memo(model: ModelSpec) -> ParamCounts:
    return _param_counts(model)


def _param_counts(model: ModelSpec) -> ParamCounts:
    """Parameter counts of the whole model (elements; see :class:`ParamCounts`).

    Per layer: attention ``h*(a+2g)*d + a*d*h``, two norms (``2h`` each for LayerNorm, ``h``
    for RMSNorm), MLP ``m*h*f`` (``m`` = 2 GELU, 3 SwiGLU) or MoE router ``h*E`` + ``E``
    routed and ``S`` shared experts of ``m*h*f_e``. Plus embedding ``V*h``, head ``V*h``
    (0 if tied), final norm. No biases or position embeddings (module docstring).
    """
    h, m = model.hidden_size, _mlp_matrices(model)
    layers = tuple(sum(layer_params(model, i)) for i in range(model.num_layers))
    embedding = model.vocab_size * h
    head = 0 if model.tied_embeddings else model.vocab_size * h
    final_norm = _norm_params(model)
    total = embedding + head + final_norm + sum(layers)
    dense_layer = _attention_params(model) + _norm_params(model) + m * h * model.ffn_hidden_size
    moe_layer = 0
    inactive = 0
    if model.moe is not None:
        moe = model.moe
        expert = m * h * moe.expert_ffn_hidden_size
        moe_layer = (_attention_params(model) + _norm_params(model) + h * moe.num_experts
                     + (moe.num_experts + moe.shared_experts) * expert)
        n_moe = sum(model.is_moe_layer(i) for i in range(model.num_layers))
        inactive = n_moe * (moe.num_experts - moe.top_k) * expert
    return ParamCounts(
        embedding=embedding, head=head, final_norm=final_norm, layers=layers,
        dense_layer=dense_layer, moe_layer=moe_layer, total=total,
        active_per_token=total - inactive, mtp=sum(mtp_params(model)),
    )


def _mtp_layer(model: ModelSpec) -> int:
    """The layer an MTP module's transformer block is like: the model's last."""
    return model.num_layers - 1


def mtp_params(model: ModelSpec, *, tp: int = 1, ep: int = 1, etp: int | None = None
               ) -> tuple[int, int]:
    """``(dense, expert)`` parameters of the model's MTP modules on one rank: per module a
    layer like the last one, the ``2h x h`` projection (column-parallel) and two norms
    (DeepSeek-V3 report Section 2.2: RMSNorms of the hidden state and the embedding, the
    projection ``M_k``, a transformer block; Megatron-Core ``MultiTokenPredictionLayer``).
    The embedding and the output head are shared with the model. (0, 0) without MTP."""
    if not model.mtp_layers:
        return 0, 0
    dense, expert = layer_params(model, _mtp_layer(model), tp=tp, ep=ep, etp=etp)
    h = model.hidden_size
    dense += 2 * h * h // tp + 2 * _norm_params(model)
    return model.mtp_layers * dense, model.mtp_layers * expert


def mtp_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1, cp: int = 1,
                ep: int = 1, etp: int | None = None, sequence_parallel: bool = True,
                dtype: str = "bf16", expert_load: float | None = None,
                cross_entropy: str = "megatron", elementwise: str = "fused") -> list[Kernel]:
    """Forward kernels of the MTP modules on the stage holding the head, each module its
    two norms, the ``2h -> h`` projection, a layer like the last one (its kernels, named
    ``mtp.<k>.``) and the shared head and loss again. Compute only: the module's TP and
    expert communication is not lowered (a documented simplification). [] without MTP."""
    if not model.mtp_layers:
        return []
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    mm, em, act, ea = _dtypes(dtype)
    h = model.hidden_size
    out: list[Kernel] = []
    for k in range(model.mtp_layers):
        prefix = f"mtp.{k}."
        module = [_norm("mtp.hnorm", "head", model, n_sp, act, ea, elementwise=elementwise),
                  _norm("mtp.enorm", "head", model, n_sp, act, ea, elementwise=elementwise),
                  _matmul("mtp.proj", "head", m=n, n=h // tp, k=2 * h, dtype=mm, in_bytes=em,
                          out_bytes=ea, params=2 * h * h // tp)]
        module += layer_kernels(model, _mtp_layer(model), micro_batch=micro_batch,
                                seq_len=seq_len, tp=tp, cp=cp, ep=ep, etp=etp,
                                sequence_parallel=sequence_parallel, dtype=dtype,
                                dropout=model.dropout, expert_load=expert_load,
                                elementwise=elementwise)
        module += [replace(kernel, params=0) if kernel.name == "head.logits" else kernel
                   for kernel in head_kernels(model, micro_batch=micro_batch, seq_len=seq_len,
                                              tp=tp, cp=cp, sequence_parallel=sequence_parallel,
                                              dtype=dtype, cross_entropy=cross_entropy,
                                              elementwise=elementwise)]
        out += [replace(kernel, name=prefix + kernel.name) for kernel in module]
    return out


def layer_types(model: ModelSpec, layers: Sequence[int]) -> dict[int, int]:
    """``{representative layer: how many of layers are like it}``: layers differ only in
    being dense or MoE, so sums over many layers need one evaluation per kind.

    Raises:
        ValueError: a layer out of range.
    """
    try:
        key = (id(model), tuple(layers))
        entry = _LAYER_TYPES.get(key)
    except TypeError:  # unhashable entries: checked (and refused) below
        key, entry = None, None
    if entry is not None and entry[0] is model:
        return dict(entry[1])
    first: dict[bool, int] = {}
    counts: dict[int, int] = {}
    for layer in layers:
        _check_layer(model, layer)
        representative = first.setdefault(model.is_moe_layer(layer), layer)
        counts[representative] = counts.get(representative, 0) + 1
    if key is not None:
        if len(_LAYER_TYPES) >= 65536:
            _LAYER_TYPES.clear()
        _LAYER_TYPES[key] = (model, dict(counts))  # the entry keeps the model alive
    return counts


#: layer_types by (model identity, layers); each entry keeps its model alive, so an id
#: names one model while it can be looked up.
_LAYER_TYPES: dict[tuple, tuple] = {}


def rank_params(model: ModelSpec, *, layers: Sequence[int], tp: int = 1, ep: int = 1,
                has_embedding: bool = False, has_head: bool = False,
                etp: int | None = None) -> RankParams:
    """Parameters one rank holds: its layers (see :func:`layer_params`), the embedding shard
    ``ceil(V/t)*h`` if ``has_embedding``, and the final norm plus the head shard
    ``ceil(V/t)*h`` if ``has_head`` (for tied embeddings the head shard is counted only when
    the rank does not also hold the embedding: a last pipeline stage keeps its own copy, as
    Megatron does); routed experts split over ``ep`` and ``etp`` (expert-TP, default ``t``).
    Elements, not bytes.

    Raises:
        ValueError: a layer out of range or listed twice; tp/ep not dividing the model.
    """
    _check_tp(model, tp)
    _check_ep(model, ep)
    if len(set(layers)) != len(layers):
        twice = next(layer for layer in layers if list(layers).count(layer) > 1)
        raise ValueError(f"layers: layer {twice} listed twice; give each held layer once")
    dense = expert = 0
    for layer, count in layer_types(model, layers).items():
        de, ex = layer_params(model, layer, tp=tp, ep=ep, etp=etp)
        dense, expert = dense + count * de, expert + count * ex
    shard = math.ceil(model.vocab_size / tp) * model.hidden_size
    if has_embedding:
        dense += shard
    if has_head:
        dense += _norm_params(model)
        if not model.tied_embeddings or not has_embedding:
            dense += shard
        mtp_dense, mtp_expert = mtp_params(model, tp=tp, ep=ep, etp=etp)
        dense, expert = dense + mtp_dense, expert + mtp_expert
    return RankParams(dense_params=dense, expert_params=expert)


# --------------------------------------------------------------------------- model FLOPs


def model_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Model FLOPs per trained token (forward + backward), the MFU convention.

    ``6*N + 12*L*a*d*s`` (PaLM, arXiv 2204.02311 Appendix B: ``6N + 12*L*H*Q*T``), where
    ``N`` is :attr:`ParamCounts.active_per_token` without the embedding lookup (it does no
    matmul) but with the LM head (``V*h``, also when tied), and the attention term counts the
    full (non-causal) ``s^2`` score and value matmuls, as Megatron (Narayanan et al. 2021) and
    PaLM do; with MLA's unequal query/key and value widths the term is
    ``6*L*a*s*(d_qk + d_v)`` (``12*L*a*d*s`` when both are ``d``). Norm weights are included
    in ``N`` (negligible). MTP modules are not counted. FLOPs per token.

    ``causal=True`` halves the attention term (``6*L*a*d*s``; ``3*L*a*s*(d_qk + d_v)``
    with MLA), the count of Megatron-LM's ``num_floating_point_operations`` since 2025
    (``megatron/training/training.py``: the core-attention terms are divided by 2, "causal
    mask (only half of the mask is non-zero)"; noted at commit 250b79415dcc in
    AI-Hypercomputer/maxtext issue 1972), which Megatron-Core's logged TFLOP/s use.

    Raises:
        ValueError: a non-positive ``seq_len``.
    """
    _pos_int(seq_len, "seq_len")
    pc = param_counts(model)
    head_matmul = model.vocab_size * model.hidden_size
    n = pc.active_per_token - pc.embedding + (head_matmul if model.tied_embeddings else 0)
    attention = 6.0 * model.num_layers * model.num_heads * seq_len * (
        model.qk_head_dim + model.v_head_dim)
    return 6.0 * n + (CAUSAL_FLOP_FRACTION * attention if causal else attention)


# --------------------------------------------------------------------------- activations


def activation_bytes_per_layer(model: ModelSpec, layer: int, *, micro_batch: int, seq_len: int,
                               tp: int = 1, cp: int = 1, sequence_parallel: bool = True,
                               recompute: str = "none", dtype: str = "bf16",
                               dropout: bool = True, flash_attention: bool = True,
                               fp8_linear_inputs: bool = False,
                               recompute_modules: Sequence[str] = (), etp: int | None = None,
                               expert_load: float | None = None,
                               fp8_swiglu_inputs: bool = False,
                               e5m6_attention_output: bool = False) -> float:
    """Bytes one layer keeps for the backward, per micro-batch, on one GPU.

    Korthikanti et al. 2022 (arXiv 2205.05198, Section 4, Table 2; 16-bit activations,
    1-byte dropout masks) give, per layer with TP and sequence parallelism,
    ``s*b*h*(34/t + 5*a*s/(h*t))``, built from (in units of ``s*b*h``):

    * attention: QKV input 2, Q 2, K 2, V 2, softmax output ``2as/h``, its dropout mask
      ``as/h``, dropout output ``2as/h``, out-proj input 2, dropout mask 1;
    * MLP (GELU, ``f = 4h``): fc1 input 2, GELU input 8, fc2 input 8, dropout mask 1;
    * two norm inputs, 2 each.

    This function generalises the list, tensor by tensor, with ``n = b*s/c`` tokens (CP
    keeps only the local queries' K/V chunk), ``n_sp`` for the norm inputs, QKV/MLP inputs
    and masks (``n`` without SP), element size ``e`` (2 for bf16; ``fp8`` plans keep bf16
    activations):

    * flash attention (assumed): the ``5as/h`` score terms are never stored; the kernel's
      fp32 log-sum-exp (``4*b*a*s/t`` bytes, <0.1 %) is neglected;
    * GQA: K and V are ``n*g_l*d`` each (``g_l`` = local KV heads), Q and the attention
      output ``n*(a/t)*d``;
    * SwiGLU: the GELU input/output terms become gate and up outputs (``2f``) and the
      activation output (``f``): 3 tensors of ``n*f/t``;
    * MoE layers: the MLP input, norm input and mask stay per token; the router keeps fp32
      probabilities ``4*n_sp*E``; per token-expert pair the experts process
      (``etp*n_sp*top_k*load``, :func:`layer_kernels`): the permuted input ``h`` and the FFN
      intermediates (1 + 1 tensors of ``f_e/etp`` for GELU, 2 + 1 for SwiGLU); per pair of
      the rank's own tokens (``n_sp*top_k``) its fp32 probability (Megatron-Core applies
      the probability in the experts' weighted activation, ``megatron/core/transformer/
      moe/experts.py``, so its gradient needs no saved expert output); shared experts keep
      their intermediates of ``S*f_e/t`` per token.

    Recompute: ``none`` and ``selective`` are equal under flash attention (selective recompute
    re-runs only the attention core, which flash attention never stores); ``full`` keeps only
    the layer input, ``e*n_sp*h`` (``2sbh/t`` with SP).

    ``fp8_linear_inputs`` (Transformer Engine's FP8 linear layers, ``transformer_engine/pytorch/
    module/{linear,layernorm_linear}.py``: the input is cast to FP8 and only the FP8 copy is
    saved for the weight-gradient GEMM): the QKV, MLP-fc1 and fc2 inputs (and the routed
    experts' fc1/fc2 inputs) are kept at 1 byte per element instead of ``e``; the
    attention output stays ``e`` (flash attention saves it) and the out-projection saves an
    FP8 copy of it besides (1 byte per element). Norm inputs, Q/K/V and the activation
    function's input (the fc1 output) stay ``e``.

    ``recompute_modules`` (Megatron-Core ``--recompute-modules``, ``megatron/core/transformer/
    transformer_config.py``; only with ``recompute`` not ``full``): ``layernorm`` drops the two
    norm outputs (the QKV and fc1 inputs, recomputed from the norm inputs); ``mlp`` keeps only
    a dense MLP's input; ``moe`` keeps only an MoE block's input (router, dispatch and experts
    recomputed); ``moe_act`` drops the experts' activation outputs (fc2 inputs);
    ``mla_up_proj`` drops MLA's per-head queries, keys and values (the up projections are
    re-run); ``core_attn`` is the flash-attention no-op; ``op_sac`` keeps what torchtitan's
    per-op policy saves (:func:`_op_sac_activation_bytes`); ``jax_full``,
    ``jax_save_qkv`` and ``jax_save_qkv_out`` keep the layer input and what their JAX remat
    policy saves (:func:`_jax_remat_activation_bytes`). Others are rejected.

    DeepSeek-V3's low-precision activation cache (arXiv 2412.19437 Section 3.3.3, "Low-
    Precision Storage"): ``fp8_swiglu_inputs`` keeps the routed experts' SwiGLU inputs
    (the fc1 outputs, ``2*f_e/etp`` per pair for a gated MLP) at 1 byte per element ("we
    cache the inputs of the SwiGLU operator and recompute its output in the backward
    pass. These activations are also stored in FP8"); ``e5m6_attention_output`` keeps
    the attention output once, in the E5M6 format (12 bits: 1.5 bytes per element), for
    the attention backward and the out-projection's ("Inputs of the Linear after the
    attention operator ... a customized E5M6 data format exclusively for these
    activations"), instead of ``e`` (plus TE's FP8 copy with ``fp8_linear_inputs``).

    For an MHA GELU model with ``f = 4h`` and ``a*d = h``, bf16 and dropout this is exactly
    ``s*b*h*34/t`` (TP + SP), ``s*b*h*(10 + 24/t)`` (TP without SP) and ``2*s*b*h/t``
    (full recompute with SP) -- Korthikanti's Table 2 minus the score terms. Bytes.

    Raises:
        ValueError: unknown ``recompute``, or invalid sizes (as :func:`layer_kernels`).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute: {recompute!r} is not a recompute mode; valid: {', '.join(RECOMPUTE_MODES)}")
    _check_layer(model, layer)
    _check_tp(model, tp)
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    _, _, _, e = _dtypes(dtype)
    h, d = model.hidden_size, model.head_dim
    a_l, g_l = model.num_heads // tp, _kv_local(model, tp)
    mask = DROPOUT_MASK_BYTES if dropout else 0

    modules = set(recompute_modules)
    unknown = modules - set(RECOMPUTE_MODULES)
    if unknown:
        raise ValueError(f"recompute_modules: {sorted(unknown)} not modelled; valid: "
                         f"{', '.join(RECOMPUTE_MODULES)}")
    if recompute == "full":
        return e * n_sp * h
    if "op_sac" in modules:
        return _op_sac_activation_bytes(model, layer, n, n_sp, tp, e)
    jax_policy = jax_remat_policy(modules)
    if jax_policy is not None:
        return _jax_remat_activation_bytes(model, layer, jax_policy, n, n_sp, tp, e)

    # element bytes of a saved linear-layer input (TE keeps only its FP8 copy)
    e_in = 1.0 if fp8_linear_inputs else e
    norm_out = 0.0 if "layernorm" in modules else 1.0
    # attention block: norm input, QKV input, Q, K, V, attention output (out-proj input), mask
    if model.mla is None:
        total = (e * n_sp * h + norm_out * e_in * n_sp * h + e * n * (2 * a_l + 2 * g_l) * d
                 + mask * n_sp * h)
    else:
        total = _mla_activation_bytes(model, n=n, n_sp=n_sp, tp=tp, e=e, e_in=e_in,
                                      norm_out=norm_out, modules=modules) + mask * n_sp * h
    if fp8_linear_inputs:
        # the out-projection's FP8 copy of the attention output
        total += 1.0 * n * a_l * model.v_head_dim
    if e5m6_attention_output:
        # one E5M6 copy of the attention output replaces the bf16 one (and the FP8 copy)
        total -= ((e + (1.0 if fp8_linear_inputs else 0.0)) - E5M6_BYTES) \
            * n * a_l * model.v_head_dim
    if not flash_attention and recompute == "none":
        # unfused attention stores softmax output, dropout mask and output: 5as/h * sbh
        total += (2 * e + DROPOUT_MASK_BYTES if dropout else e) * n * a_l * seq_len
    # MLP/MoE block: norm input, MLP input, mask
    gated = model.mlp == "swiglu"
    # fc1 output (gate and up for a gated MLP; the activation's input) and its output (fc2 input)
    def ffn(width: float, e_act: float = e) -> float:
        return e_act * (2 if gated else 1) * width + e_in * width

    if not model.is_moe_layer(layer):
        if "mlp" in modules:
            return total + e * n_sp * h
        return (total + e * n_sp * h + norm_out * e_in * n_sp * h + mask * n_sp * h
                + n * ffn(model.ffn_hidden_size // tp))
    if "moe" in modules:
        return total + e * n_sp * h
    total += e * n_sp * h + norm_out * e_in * n_sp * h + mask * n_sp * h
    moe = model.moe  # not None: is_moe_layer(layer) is True
    etp = tp if etp is None else etp
    load = _default_load(model) if expert_load is None else expert_load
    local_pairs = n_sp * moe.top_k
    pairs = etp * local_pairs * load
    fe_l = moe.expert_ffn_hidden_size // etp
    total += FP32_BYTES * n_sp * moe.num_experts
    expert = (ffn(fe_l, 1.0 if fp8_swiglu_inputs else e)
              - (e_in * fe_l if "moe_act" in modules else 0.0))
    # per processed pair: permuted input (fc1 input), expert FFN; per own pair its fp32
    # probability (Megatron-Core applies it in the experts' weighted activation, whose
    # saved input serves its gradient: no expert output is kept)
    total += pairs * (e_in * h + expert) + local_pairs * FP32_BYTES
    total += n * ffn(moe.shared_experts * moe.expert_ffn_hidden_size // tp)
    return total


def _mla_activation_bytes(model: ModelSpec, *, n: int, n_sp: int, tp: int, e: float,
                          e_in: float, norm_out: float, modules: set[str]) -> float:
    """What MLA's attention block keeps (:func:`_mla_attention`): the norm input and output
    (the down projections' input), the latents before their norms and the gathered latents
    the up projections read, the per-head queries, keys and values flash attention saves
    (unless ``mla_up_proj`` recompute re-runs the up projections: Megatron-Core
    ``--recompute-modules mla_up_proj``) and the attention output. Bytes."""
    mla, h = model.mla, model.hidden_size
    a_l = model.num_heads // tp
    kv_width = mla.kv_lora_rank + mla.qk_rope_head_dim
    total = e * n_sp * h + norm_out * e_in * n_sp * h
    total += e * n_sp * (mla.q_lora_rank + kv_width)                   # latents (norm inputs)
    total += e_in * n * (mla.q_lora_rank + mla.kv_lora_rank)          # up-projection inputs
    if "mla_up_proj" not in modules:
        total += e * n * a_l * (2 * model.qk_head_dim + model.v_head_dim)  # Q, K, V
    return total + e * n * a_l * model.v_head_dim                     # attention output


def _op_sac_activation_bytes(model: ModelSpec, layer: int, n: float, n_sp: float, tp: int,
                             e: float) -> float:
    """Bytes a dense block keeps under torchtitan's per-op selective checkpointing
    (:data:`RECOMPUTE_MODULES`): the block input (the checkpoint's argument) and the saved
    op outputs, in Llama's matmul order wq, wk, wv, wo, w1, w3, w2 with the even-numbered
    matmuls re-run: Q and V (K recomputed), the SDPA output, w1's output and w2's output
    (GELU MLPs: fc1's output; fc2 is the sixth matmul and re-runs). Norm outputs, the
    activation's output and the residual sum are recomputed, never kept.

    Raises:
        ValueError: ``layer`` is an MoE layer (the policy is modelled for dense blocks).
    """
    if model.is_moe_layer(layer):
        raise ValueError("recompute_modules: op_sac is modelled for dense layers; "
                         f"layer {layer} is an MoE layer")
    h, d = model.hidden_size, model.head_dim
    a_l, g_l = model.num_heads // tp, _kv_local(model, tp)
    f_l = model.ffn_hidden_size // tp
    kept = n * (a_l * d + g_l * d + a_l * d) + n * f_l
    if model.mlp == "swiglu":
        kept += n * h  # w2's output (the seventh matmul, odd: saved)
    return e * (n_sp * h + kept)


def op_sac_recompute_fractions(kernels: Sequence[Kernel], model: ModelSpec) -> list[float]:
    """The share of each of a dense layer's forward ``kernels`` that torchtitan's per-op
    selective checkpointing re-runs in the backward (:data:`RECOMPUTE_MODULES`).

    The policy counts the block's ``aten.mm`` calls in order and saves every odd-numbered
    one; in Llama's order (wq, wk, wv, wo, w1, w3, w2) the backward re-runs wk, wo and w3.
    Fused kernels here stand for several of those calls: ``attn.qkv`` for wq, wk, wv
    (widths ``a*d``, ``g*d``, ``g*d``), ``mlp.gate_up`` for w1 and w3 (equal halves).
    A ``<gemm>.quant`` cast re-runs with its GEMM's share; SDPA (kind ``attention``) is
    saved; every other kernel (norms, activation, RoPE, residual adds) re-runs whole.
    TP communication around the re-run matmuls is not modelled (torchtitan runs these
    presets without TP).

    Returns:
        One fraction in [0, 1] per kernel, in order.
    """
    pieces = {"attn.qkv": (model.num_heads, model.num_kv_heads, model.num_kv_heads),
              "mlp.gate_up": (1, 1)}
    count = 0
    matmul_share: dict[str, float] = {}
    for kernel in kernels:
        if kernel.kind != "matmul":
            continue
        widths = pieces.get(kernel.name, (1,))
        rerun = 0.0
        for width in widths:
            count += 1
            if count % 2 == 0:
                rerun += width
        matmul_share[kernel.name] = rerun / sum(widths)
    fractions = []
    for kernel in kernels:
        if kernel.kind == "matmul":
            fractions.append(matmul_share[kernel.name])
        elif kernel.name.endswith(".quant"):
            fractions.append(matmul_share.get(kernel.name[: -len(".quant")], 1.0))
        elif kernel.kind == "attention":
            fractions.append(0.0)
        else:
            fractions.append(1.0)
    return fractions


def jax_remat_recompute_fractions(kernels: Sequence[Kernel], model: ModelSpec,
                                  policy: str) -> list[float]:
    """The share (0 or 1) of each of a dense layer's forward ``kernels`` that the backward
    of a ``jax.checkpoint``-ed layer re-runs under ``policy`` (:data:`JAX_REMAT_POLICIES`).

    JAX's remat partial evaluation stages for the backward only the primal operations whose
    outputs the linearised layer needs and the policy did not save (``jax/_src/
    ad_checkpoint.py`` ``remat_partial_eval``, then ``pe.dce_jaxpr``; XLA's dead-code
    elimination drops the rest of the re-run forward). So, unlike Megatron's full
    recompute (which re-runs the checkpointed forward whole):

    * the layer's last matmul (the MLP's down projection, whose output only enters the
      residual sum) and that residual sum (the next layer's input, the scan carry the
      checkpoint keeps) are not re-run: nothing in the backward reads them;
    * a saved matmul output (``attn.qkv``, ``attn.out`` per policy) is read, not re-run;
    * everything else re-runs: norms (their outputs are the next matmul's input, which its
      weight gradient reads), the attention core (its output and softmax statistics), the
      activation function, the attention residual sum (the second norm's input), and each
      FP8 input cast ``<gemm>.quant`` (the weight gradient reads the cast input, whether or
      not the GEMM itself re-runs).

    TP communication around re-run matmuls is not modelled (the JAX recipes modelled run
    without TP).

    Raises:
        ValueError: ``policy`` not in :data:`JAX_REMAT_POLICIES`, or the kernels of an MoE
            layer (the policies are modelled for dense layers).
    """
    if policy not in JAX_REMAT_POLICIES:
        raise ValueError(f"policy: {policy!r} is not a JAX remat policy; valid: "
                         f"{', '.join(JAX_REMAT_POLICIES)}")
    if any(kernel.block == "moe" for kernel in kernels):
        raise ValueError(f"recompute_modules: {policy} is modelled for dense layers; "
                         "got an MoE layer's kernels")
    saved = set(JAX_REMAT_POLICIES[policy])
    matmuls = [i for i, k in enumerate(kernels) if k.kind == "matmul"]
    # the last matmul and what follows it (the residual sum into the next layer's input)
    dead = set(range(matmuls[-1], len(kernels))) if matmuls else set()
    fractions = []
    for index, kernel in enumerate(kernels):
        if kernel.name.endswith(".quant"):
            fractions.append(1.0)
        elif index in dead or (kernel.kind == "matmul" and kernel.name in saved):
            fractions.append(0.0)
        else:
            fractions.append(1.0)
    return fractions


def _jax_remat_activation_bytes(model: ModelSpec, layer: int, policy: str, n: float,
                                n_sp: float, tp: int, e: float) -> float:
    """Bytes a dense layer keeps under a JAX remat policy (:data:`JAX_REMAT_POLICIES`):
    the layer input (the scan carry ``jax.checkpoint`` keeps) and the saved matmul
    outputs, Q/K/V (``n*(a + 2g)*d/t``) and the output projection's (``n*h``).

    Raises:
        ValueError: ``layer`` is an MoE layer."""
    if model.is_moe_layer(layer):
        raise ValueError(f"recompute_modules: {policy} is modelled for dense layers; "
                         f"layer {layer} is an MoE layer")
    saved = JAX_REMAT_POLICIES[policy]
    kept = n_sp * model.hidden_size
    if "attn.qkv" in saved:
        kept += n * (model.num_heads // tp + 2 * _kv_local(model, tp)) * model.head_dim
    if "attn.out" in saved:
        kept += n * model.hidden_size
    return e * kept


def embedding_activation_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1,
                               cp: int = 1, sequence_parallel: bool = True,
                               dropout: bool = True) -> float:
    """Bytes the input embedding keeps for the backward per micro-batch on one GPU: its
    dropout mask, ``n_sp*h`` bytes (Korthikanti et al. 2022 Section 4.2), 0 without dropout.
    (Token ids, ``8n`` bytes, are neglected.)"""
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    return float(DROPOUT_MASK_BYTES * n_sp * model.hidden_size) if dropout else 0.0


def head_activation_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1,
                          cp: int = 1, sequence_parallel: bool = True, dtype: str = "bf16",
                          cross_entropy: str = "megatron") -> float:
    """Bytes the final norm, LM head and loss keep per micro-batch on one GPU:
    final-norm input ``e*n_sp*h``, head input ``e*n_sp*h`` (gathered again for the backward
    under SP) and what the loss keeps of the ``n*ceil(V/t)`` logits:

    * ``megatron`` (Megatron-Core's vocab-parallel cross entropy, fused or not: ``megatron/core/
      tensor_parallel/cross_entropy.py`` casts the logits ``.float()`` and saves the
      softmax) and ``eager`` (PyTorch ``F.cross_entropy`` on ``logits.float()``, as
      torchtitan computes its loss: log-softmax saves its fp32 output): ``4`` bytes per
      logit (Korthikanti et al. 2022 Section 4.2: ``4sbv/t``);
    * ``fused`` (Transformer Engine's ``parallel_cross_entropy``, Megatron-Core
      ``--cross-entropy-fusion-impl te``): the gradient is written into the bf16 logits in
      the forward, ``e`` bytes per logit;
    * ``eager_bf16`` (PyTorch ``F.cross_entropy`` on the 16-bit logits, NeMo AutoModel's
      ``MaskedCrossEntropy(fp32_upcast=False)``): log-softmax saves its ``e``-byte output,
      ``e`` bytes per logit.

    See :func:`head_transient_bytes` for what the loss needs on top while it runs. Bytes."""
    if cross_entropy not in CROSS_ENTROPY_IMPLS:
        raise ValueError(f"cross_entropy: {cross_entropy!r} is not known; valid: "
                         f"{', '.join(CROSS_ENTROPY_IMPLS)}")
    _check_tp(model, tp)
    n = _tokens(micro_batch, seq_len, cp)
    n_sp = _sp_tokens(n, tp, sequence_parallel)
    _, _, _, e = _dtypes(dtype)
    per_logit = e if cross_entropy in ("fused", "eager_bf16") else FP32_BYTES
    return e * 2 * n_sp * model.hidden_size + per_logit * n * math.ceil(model.vocab_size / tp)


def head_transient_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int, tp: int = 1,
                         cp: int = 1, dtype: str = "bf16", cross_entropy: str = "megatron") -> float:
    """Bytes the loss needs while it runs, on top of :func:`head_activation_bytes` (once per
    step, on the stage holding the head), with ``L = n*ceil(V/t)`` logits:

    * ``megatron`` (Megatron-Core, ``megatron/core/tensor_parallel/cross_entropy.py``:
      ``calculate_logits_max`` casts the logits ``.float()``, ``calculate_predicted_logits``
      subtracts the maximum out of place and exponentiates that copy in place, the one
      saved): while the softmax is formed, the bf16 logits and the fp32 cast are alive
      besides it, ``(e + 4)*L``;
    * ``eager``: in the backward, the dense fp32 gradient of the log-probabilities
      (``nll_loss`` backward) and log-softmax's fp32 input gradient are alive with the
      saved output: ``8*L``;
    * ``eager_bf16``: the same two gradients in the logits' dtype: ``2*e*L``;
    * ``fused``: nothing (the gradient already sits in the logits buffer). Bytes."""
    if cross_entropy not in CROSS_ENTROPY_IMPLS:
        raise ValueError(f"cross_entropy: {cross_entropy!r} is not known; valid: "
                         f"{', '.join(CROSS_ENTROPY_IMPLS)}")
    _check_tp(model, tp)
    logits = _tokens(micro_batch, seq_len, cp) * math.ceil(model.vocab_size / tp)
    _, _, _, e = _dtypes(dtype)
    return {"megatron": (e + FP32_BYTES) * logits, "eager": 2 * FP32_BYTES * logits,
            "eager_bf16": 2 * e * logits, "fused": 0.0}[cross_entropy]

