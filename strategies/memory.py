"""Memory of one rank during training: model states, activations, buffers; OOM checks.

Model states follow mixed-precision Adam as in the ZeRO paper (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", arXiv 1910.02054,
Section 3.1): per parameter 2 bytes of bf16 weights, 2 bytes of bf16 gradients and
K = 12 bytes of optimizer state (fp32 master weights, momentum and variance), 16 bytes
unsharded. ZeRO stages shard them over the data-parallel group (Section 5):

* stage 1: optimizer state / ``N_d``;
* stage 2: + gradients / ``N_d``;
* stage 3: + weights / ``N_d``.

``N_d`` is ``dp * cp`` for dense parameters (Megatron shards the distributed optimizer over
the data-parallel group *with* context parallelism: CP ranks hold identical weights) and
``tp * dp * cp / (expert_tp * ep)`` for routed-expert parameters (expert data parallelism,
Megatron-Core's expert rank generator). Shards are exact
fractions (no padding to bucket boundaries).

Choices (assumptions, stated once):

* How the training stack holds memory is stated by the plan's stack fields (fp8 recipe,
  loss implementation, recompute modules, activation offload, parameter remainders; read
  once by :func:`memory_options`; defaults: Megatron-Core with Transformer Engine as
  configured out of the box); the published-run harness sets them per framework
  (``validate/published.py``).
* fp8 plans (``plan.dtype == "fp8"``) keep the bf16 weights *and*, for the linear weights
  of the transformer layers, Transformer Engine's cached FP8 copies
  (the recipe's ``weight_copy_bytes_per_param``: the FP8 weight and its
  transpose, 2 bytes; ``transformer_engine/pytorch/module/linear.py`` caches them across
  the micro-batches of a step when Megatron passes ``is_first_microbatch``). The
  embedding, LM head and norms stay bf16 (Megatron-Core's output layer is not a TE
  module). Stored activations are bf16 except the inputs of the linear layers, whose FP8
  copies TE saves instead (the recipe's ``saves_fp8_inputs``).
* Optimizer: fp32 master weights, momentum and variance, 12 bytes per parameter; with
  :attr:`ParallelPlan.store_param_remainders` (Megatron-Core's distributed optimizer with
  bf16 parameters, ``OptimizerConfig.store_param_remainders``) the master weight is kept as
  the 16-bit remainder of the bf16 parameter: 10 bytes. With
  :attr:`ParallelPlan.fsdp_fp32_params` (PyTorch FSDP2 over fp32 parameters with a bf16
  ``MixedPrecisionPolicy``: "FSDP ... keeps the high-precision sharded parameters in memory
  anyway ... does not require any extra memory to keep a high-precision copy of the
  parameters for the optimizer step", torch/distributed/fsdp/_fully_shard/_fsdp_api.py
  ``MixedPrecisionPolicy``) the sharded weights are fp32, 4 bytes, and are the master
  weights: the optimizer holds Adam's two fp32 moments, 8 bytes (``torch.optim.Adam``
  keeps ``exp_avg``/``exp_avg_sq`` in the parameter's dtype); the gradient is the
  reduce-scattered fp32 shard (``grad_reduce_dtype``). 4 + 4 + 8 = 16 bytes per parameter.
  The optimizer's bytes per parameter are its master weights (4 fp32, 2 as remainders,
  2 bf16, 0 with :attr:`ParallelPlan.master_weights_dtype` ``none``) plus Adam's two
  moments in :attr:`ParallelPlan.optimizer_moments_dtype` (8 fp32, 4 bf16). Apex's
  ``DistributedFusedAdam`` (``apex/contrib/optimizers/distributed_fused_adam.py``) keeps
  its state in its ``dtype`` and, with ``store_params=False``, no copy of the parameters
  at all: NeMo 1 (``MegatronBaseModel.setup_optimization``) passes ``optim.dtype`` and
  stores no parameter copy when that dtype equals the model's, a copy in that dtype with
  FP8 parameters, remainders for fp32 state over bf16 parameters. DeepSeek-V3 keeps fp32
  master weights and bf16 moments (arXiv 2412.19437 Section 3.3.3): 8 bytes.
* FP8 primary weights (:attr:`ParallelPlan.fp8_params`, Transformer Engine
  ``fp8_model_init``): the linear layers' weights are ``Float8Tensor`` s, 1 byte, whose
  transpose TE caches for the backward, 1 byte; they replace the bf16 weight and the
  cached FP8 copies (2 bytes per linear parameter instead of ``2 + c``).
* Activations: what the pipeline schedule keeps alive at a rank's peak, each in-flight
  (stage, micro-batch) weighed by that stage's own bytes (:func:`stage_activation_bytes`:
  its layers' :func:`strategies.model_costs.activation_bytes_per_layer`, plus the
  embedding's and the head's — what the loss keeps of the logits,
  :attr:`ParallelPlan.cross_entropy` — on the stages that hold them). An interleaved
  rank's in-flight chunks each hold one chunk's layers, not all of the rank's. Layers
  whose activations are offloaded to host memory (:attr:`ParallelPlan.
  activation_offload_layers`, Megatron-Core ``cpu_offloading_num_layers`` through TE's
  ``get_cpu_offload_context``) hold none.
* On top of what is held, the largest *transient* working set is added once (it is
  ``MemoryBreakdown.transient_bytes``): the backward of a recomputed layer rematerialises its
  activations (``recompute="full"``: the largest held layer's ``recompute="none"``
  activations, Korthikanti et al. 2022 Section 5; recompute modules: what they dropped);
  an offloaded layer is reloaded one at a time (one layer's activations); the loss
  (:func:`strategies.model_costs.head_transient_bytes`); the backward of an MLP (the
  gradients of the fc1 output and of the activation output, ``e*n*(F1 + f)/t``).
  Dropout masks are counted as in Korthikanti et al. (the cost model's default).
* Communication buffers: ``2 * plan.grad_bucket_bytes`` for the data-parallel gradient
  reduction (one bucket being reduced while the next fills) when the data-parallel group has
  more than one rank; with ZeRO-3 (and a group > 1) also the all-gathered, unsharded weights
  of the two largest held layers (the current layer and the prefetched next one, as FSDP's
  default ``limit_all_gathers`` allows; with their FP8 copies in fp8 plans) and the
  unsharded gradients of the largest one in the backward (bf16, plus their copy in the
  reduction dtype when it is not bf16: PyTorch FSDP2 ``foreach_reduce`` casts to
  ``reduce_dtype`` before the reduce-scatter).
* Workspace: the GPU's stated reserve (``GpuSpec.memory_reserve_bytes``, a preset field:
  CUDA context and kernel images, NCCL channel buffers of the communicators, cuBLAS and
  Transformer Engine workspaces, the caching allocator's fragmentation slack);
  :data:`WORKSPACE_BYTES` = 1 GiB when none is given.
* Gradients are held in the plan's ``grad_reduce_dtype`` (Megatron's ``main_grad``
  buffers are fp32 with ``grad_reduce_in_fp32``, bf16 otherwise).

Units: bytes (GiB = 2**30 bytes only in messages).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Callable, Protocol, Sequence

from hardware.units import ELEMENT_BYTES, GIB
from strategies import model_costs
from strategies.model_spec import ModelSpec
from strategies.moe_dispatch import plan_routed_load
from strategies.plan import PLAN_FIELDS, ParallelPlan, RECOMPUTE, ZERO_STAGES

__all__ = [
    "FP8_PARAM_BYTES_PER_PARAM",
    "FP8_WEIGHT_COPY_BYTES_PER_PARAM",
    "FP8_WEIGHT_WRITE_BYTES_PER_PARAM",
    "FSDP_FP32_WEIGHT_BYTES_PER_PARAM",
    "GRAD_BYTES_PER_PARAM",
    "MemoryBreakdown",
    "MASTER_WEIGHT_BYTES_PER_PARAM",
    "MemoryOptions",
    "OPTIMIZER_BYTES_PER_PARAM",
    "optimizer_state_bytes_per_param",
    "OptimizerStorage",
    "OutOfMemoryError",
    "WEIGHT_BYTES_PER_PARAM",
    "WORKSPACE_BYTES",
    "ZERO3_PREFETCH_LAYERS",
    "check_fits",
    "checkpoint_bytes_per_param",
    "memory_options",
    "optimizer_storage",
    "pipeline_memory",
    "rank_memory",
    "stage_activation_bytes",
    "transient_activation_bytes",
]

#: bf16 weights (ZeRO paper: fp16 parameters, 2 bytes).
WEIGHT_BYTES_PER_PARAM = 2
#: Transformer Engine's cached FP8 weight and its transpose, in fp8 plans (module
#: docstring): counted on every parameter of the transformer layers, norm weights included
#: (they are not cast; < 0.1 % of a layer's parameters in the catalog's models).
FP8_WEIGHT_COPY_BYTES_PER_PARAM = 2
#: bf16 gradients (ZeRO paper: fp16 gradients, 2 bytes).
GRAD_BYTES_PER_PARAM = 2
#: fp32 master weights, Adam momentum and variance (ZeRO paper: K = 12).
OPTIMIZER_BYTES_PER_PARAM = 12
#: The same with the master weight kept as the 16-bit remainder of the bf16 weight
#: (Megatron-Core ``OptimizerConfig.store_param_remainders``).
OPTIMIZER_REMAINDER_BYTES_PER_PARAM = 10
#: The optimizer's master weights per parameter by ``ParallelPlan.master_weights_dtype``
#: (fp32 as 16-bit remainders: 2, :data:`OPTIMIZER_REMAINDER_BYTES_PER_PARAM`).
MASTER_WEIGHT_BYTES_PER_PARAM = {"fp32": 4, "bf16": 2, "none": 0}
#: An fp32 master weight kept as the 16-bit remainder of the bf16 weight.
MASTER_REMAINDER_BYTES_PER_PARAM = 2
#: FP8 primary weights (``ParallelPlan.fp8_params``): the FP8 weight and its cached
#: transpose, per linear-layer parameter.
FP8_PARAM_BYTES_PER_PARAM = 2
#: PyTorch FSDP2 over fp32 parameters (``ParallelPlan.fsdp_fp32_params``): the sharded fp32
#: parameter is the master weight (4 bytes, counted as weights) and the optimizer holds
#: Adam's two moments (``optimizer_moments_dtype``; module docstring).
FSDP_FP32_WEIGHT_BYTES_PER_PARAM = 4
#: Layers whose full weights ZeRO-3 holds gathered at once (current + prefetched).
ZERO3_PREFETCH_LAYERS = 2
#: CUDA context, cuBLAS/NCCL workspaces, allocator slack: assumed, see module docstring.
WORKSPACE_BYTES = 1 * GIB


@dataclass(frozen=True, kw_only=True)
class MemoryOptions:
    """How the training stack holds memory, as the plan's stack fields say
    (:func:`memory_options`): one place that reads them for every memory function.

    Attributes:
        store_param_remainders: ``plan.store_param_remainders`` (optimizer 10 instead of
            12 bytes per parameter with ``plan.zero >= 1`` and 16-bit weights).
        fp8_weight_cache_bytes_per_param: bytes per transformer-layer parameter (norm
            weights included, as :data:`FP8_WEIGHT_COPY_BYTES_PER_PARAM`) of the FP8
            weight copies held through the step in fp8 plans (the recipe's
            :attr:`strategies.model_costs.Fp8Recipe.weight_copy_bytes_per_param`).
        fp8_linear_inputs: fp8 plans save FP8 copies of the linear layers' inputs
            (:attr:`strategies.model_costs.Fp8Recipe.saves_fp8_inputs`).
        cross_entropy: ``plan.cross_entropy``, what the loss keeps of the logits.
        recompute_modules: ``plan.recompute_modules`` (selective recompute).
        activation_offload_layers: ``plan.activation_offload_layers``.
        fp8_swiglu_inputs: ``plan.fp8_swiglu_inputs``.
        e5m6_attention_output: ``plan.e5m6_attention_output``.
    """

    store_param_remainders: bool = False
    fp8_weight_cache_bytes_per_param: float = FP8_WEIGHT_COPY_BYTES_PER_PARAM
    fp8_linear_inputs: bool = True
    cross_entropy: str = "megatron"
    recompute_modules: tuple[str, ...] = ()
    activation_offload_layers: int = 0
    fp8_swiglu_inputs: bool = False
    e5m6_attention_output: bool = False


# --------------------------------------------------------------------------- caching
#
# A sweep or a plan search asks for the memory of thousands of plans that share their
# layers' terms (same model, micro-batch, TP, recompute ...) and differ in how many
# stages, micro-batches and shards there are. The terms below are memoised in one
# bounded table keyed by everything they read: the model (by identity; the entry keeps
# it alive), the plan's fields minus those listed as not read (a field a term starts
# to read must leave its list), the layers, the embedding/head flags and each layer's
# recompute mode. Hits return the value the function would compute; the table holds no
# state of any simulation.

#: Plan fields the activation terms (:func:`stage_activation_bytes`,
#: :func:`transient_activation_bytes`) do not read; each layer's recompute mode is keyed
#: on its own (it carries recompute_layers and the stage split).
_NOT_IN_ACTIVATIONS = frozenset({
    "dp", "pp", "vpp", "global_batch", "zero", "schedule", "grad_bucket_bytes",
    "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_dtype", "layers_per_stage",
    "optimizer_impl", "store_param_remainders", "fsdp_fp32_params", "recompute_layers",
    "tp_comm_overlap",
    "attention_impl", "elementwise", "order", "dp_mode", "ps_servers", "ps_placement",
    "staleness", "ps_steps", "grad_reduce_every_microbatch", "recompute_early_stop",
    "optimizer_moments_dtype", "master_weights_dtype", "fp8_params", "comm_sm_contention",
    "nccl_max_ctas", "tp_comm_fp8_reduce_scatter", "xla_scan_carry_copies", "dp_shard"})
#: Plan fields the model states and buffers of :func:`rank_memory` do not read.
_NOT_IN_STATES = frozenset({
    "global_batch", "micro_batch", "seq_len", "schedule", "pp", "vpp", "layers_per_stage",
    "recompute_layers", "recompute_modules", "activation_offload_layers", "cross_entropy",
    "flash_attention", "sequence_parallel", "tp_comm_overlap", "attention_impl",
    "elementwise", "overlap_grad_reduce", "overlap_param_gather", "optimizer_impl", "order",
    "dp_mode", "ps_servers", "ps_placement", "staleness", "ps_steps",
    "grad_reduce_every_microbatch", "recompute_early_stop", "fp8_swiglu_inputs",
    "e5m6_attention_output", "comm_sm_contention", "nccl_max_ctas",
    "tp_comm_fp8_reduce_scatter", "xla_scan_carry_copies"})
_FIELDS = {"activations": tuple(f.name for f in PLAN_FIELDS if f.name not in _NOT_IN_ACTIVATIONS),
           "states": tuple(f.name for f in PLAN_FIELDS if f.name not in _NOT_IN_STATES)}
#: Entries kept before the table starts again (values are recomputed on demand).
_CACHE_MAX = 100_000
_CACHE: dict[tuple, tuple] = {}
#: Per plan object: its field projections and options (the entry keeps the plan alive).
_PLAN_KEYS: dict[int, tuple] = {}


def _plan_key(plan: ParallelPlan, which: str) -> tuple:
    """The plan's fields that the ``which`` terms read, as a tuple (memoised per plan)."""
    entry = _PLAN_KEYS.get(id(plan))
    if entry is None or entry[0] is not plan:
        if len(_PLAN_KEYS) >= 4096:
            _PLAN_KEYS.clear()
        entry = (plan, {})
        _PLAN_KEYS[id(plan)] = entry
    found = entry[1].get(which)
    if found is None:
        found = tuple(getattr(plan, name) for name in _FIELDS[which])
        entry[1][which] = found
    return found


def _cached(key: tuple, model: ModelSpec, compute: Callable[[], object]) -> object:
    """``compute()`` memoised under ``(id(model), *key)``; the entry keeps ``model``
    alive, so its id names it while the entry exists."""
    full = (id(model), *key)
    entry = _CACHE.get(full)
    if entry is not None and entry[0] is model:
        return entry[1]
    value = compute()
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[full] = (model, value)
    return value


def _layers_key(model: ModelSpec, layers: tuple[int, ...]) -> tuple:
    """What the memory terms of ``layers`` depend on, as a cache key: layers differ only
    in being dense or MoE (:func:`strategies.model_costs.layer_types`, through which every
    term here sums them), so for a model without MoE layers the count says it all and
    every stage of that many layers shares one entry, in any plan with the same fields
    (issue 16: keyed per layer index, a pipeline of p stages missed p times). Layer lists
    that are not distinct layers of the model keep their own key (their evaluation
    raises the one-line error)."""
    if (model.moe is None and layers and len(set(layers)) == len(layers)
            and min(layers) >= 0 and max(layers) < model.num_layers):
        return ("uniform", len(layers))
    return layers


def _modes_key(layers: Sequence[int], recompute_of: Callable[[int], str] | None) -> tuple | None:
    """Each layer's recompute mode (None: the plan's, which the key holds)."""
    return None if recompute_of is None else tuple(map(recompute_of, layers))


def memory_options(plan: ParallelPlan) -> MemoryOptions:
    """The :class:`MemoryOptions` a plan's stack fields give (its fp8 recipe decides the
    FP8 weight copies and saved inputs)."""
    recipe = model_costs.resolve_fp8_recipe(plan.fp8_recipe)
    return MemoryOptions(store_param_remainders=plan.store_param_remainders,
                         fp8_weight_cache_bytes_per_param=recipe.weight_copy_bytes_per_param,
                         fp8_linear_inputs=recipe.saves_fp8_inputs,
                         cross_entropy=plan.cross_entropy,
                         recompute_modules=tuple(plan.recompute_modules),
                         activation_offload_layers=plan.activation_offload_layers,
                         fp8_swiglu_inputs=plan.fp8_swiglu_inputs,
                         e5m6_attention_output=plan.e5m6_attention_output)


# --------------------------------------------------------------------------- optimizer storage

#: The model-weight copy a fused optimizer writes per parameter with FP8 primary weights
#: (``ParallelPlan.fp8_params``): the FP8 weight, 1 byte, with one scale per tensor (TE
#: ``FusedAdam.step``: ``multi_tensor_adam_fp8`` over ``[g, p_fp8, m, v, p_main, scale,
#: amax, scale_inv]``, transformer_engine/pytorch/optimizers/fused_adam.py; Megatron-Core's
#: distributed optimizer casts its master shard into the FP8 parameter buffer,
#: ``quantize_param_shard``). The transpose is made from the gathered FP8 weight, outside the
#: optimizer's shard.
FP8_WEIGHT_WRITE_BYTES_PER_PARAM = 1


@dataclass(frozen=True, kw_only=True)
class OptimizerStorage:
    """What an Adam(W) step reads and writes per parameter, from the dtypes the plan's
    optimizer stores (:func:`optimizer_storage`); bytes per element.

    Attributes:
        implementation: ``plan.optimizer_impl``.
        grad_bytes: the gradient the optimizer reads.
        param_bytes: the weight it updates: the master (fp32 4, its 16-bit remainder 2,
            bf16 2) or, without one, the model's weight.
        exp_avg_bytes: Adam's first moment.
        exp_avg_sq_bytes: Adam's second moment.
        param_extra_read_bytes: read once more: the bf16 weight a 16-bit remainder is
            rebuilt into an fp32 master from.
        weight_copy_bytes: the model-weight copy written (bf16 2, FP8 1, none 0).
    """

    implementation: str
    grad_bytes: float
    param_bytes: float
    exp_avg_bytes: float
    exp_avg_sq_bytes: float
    param_extra_read_bytes: float
    weight_copy_bytes: float

    def adam_bytes_per_param(self) -> float:
        """HBM bytes per parameter of the Adam kernels
        (:func:`strategies.model_costs.adam_bytes_per_param`)."""
        return model_costs.adam_bytes_per_param(
            self.implementation, grad_bytes=self.grad_bytes, param_bytes=self.param_bytes,
            exp_avg_bytes=self.exp_avg_bytes, exp_avg_sq_bytes=self.exp_avg_sq_bytes,
            param_extra_read_bytes=self.param_extra_read_bytes,
            weight_copy_bytes=self.weight_copy_bytes)


def _uses_param_remainders(plan: ParallelPlan, store_param_remainders: bool) -> bool:
    """The fp32 master weights are kept as 16-bit remainders of the 16-bit weights
    (``store_param_remainders`` -- the plan's, or :class:`MemoryOptions`' in
    :func:`rank_memory` -- under a sharded optimizer, 16-bit or fp8 plans)."""
    return (store_param_remainders and plan.zero >= 1 and ELEMENT_BYTES[plan.dtype] <= 2
            and plan.master_weights_dtype == "fp32"
            and not (plan.fsdp_fp32_params and plan.zero >= 3))


def _master_bytes_per_param(plan: ParallelPlan, store_param_remainders: bool) -> int:
    """Bytes per parameter of the master weights a non-FSDP-fp32 plan keeps: 16-bit
    remainders (:func:`_uses_param_remainders`) or ``plan.master_weights_dtype``'s."""
    if _uses_param_remainders(plan, store_param_remainders):
        return MASTER_REMAINDER_BYTES_PER_PARAM
    return MASTER_WEIGHT_BYTES_PER_PARAM[plan.master_weights_dtype]


def optimizer_storage(plan: ParallelPlan) -> OptimizerStorage:
    """What the plan's Adam step reads and writes per parameter, by the dtypes it stores.

    * Moments in ``plan.optimizer_moments_dtype`` (fp32 4, bf16 2 each: Megatron-Core
      ``--exp-avg-dtype``/``--exp-avg-sq-dtype``, Apex ``DistributedFusedAdam(dtype=...)``,
      DeepSeek-V3). The fused kernel is taken to read and write them in that dtype, as
      Apex's ``multi_tensor_fused_adam`` does (assumption for TE ``FusedAdam``, which
      copies 16-bit states to fp32 temporaries around its kernel: ``get_unscaled_state``,
      ``_apply_scale``).
    * PyTorch FSDP over fp32 parameters (``fsdp_fp32_params``) and ``torch.optim``'s
      ``foreach``/``for-loop`` AdamW: the optimizer updates the parameters it is given and
      reads their gradients in the same dtype (torch.optim needs ``grad.dtype ==
      param.dtype``; FSDP1 casts the reduced shard to the parameter dtype,
      ``_cast_grad_to_param_dtype``): the master's dtype, or the bf16 model weight without
      one; the bf16 copy stands for FSDP's cast of the updated shard at the next gather.
    * Fused (Megatron-Core distributed optimizer with TE/Apex ``FusedAdam``; Apex
      ``DistributedFusedAdam``): the gradient in ``plan.grad_reduce_dtype`` (the
      ``main_grad`` buffer the precision-aware optimizer reads as ``decoupled_grad``);
      the master in ``plan.master_weights_dtype``; with ``store_param_remainders`` TE's
      ``multi_tensor_adam_param_remainder`` reads the bf16 weight and its int16 remainder
      and writes both (param 2, extra read 2, copy 2); without a master Apex updates the
      bf16 weight in place and, sharded, also writes ``params_out`` for the all-gather
      (``DistributedFusedAdam._local_step``, ``store_params=False``); the copy written is
      the bf16 weight (2) or, with ``fp8_params``, the FP8 weight
      (:data:`FP8_WEIGHT_WRITE_BYTES_PER_PARAM`).

    Defaults (fused, bf16 gradients, fp32 master and moments): 2 + 8 + 16 + 2 = 28 bytes.
    """
    moment = float(ELEMENT_BYTES[plan.optimizer_moments_dtype])
    impl = plan.optimizer_impl
    model_weight = float(WEIGHT_BYTES_PER_PARAM)
    copy = float(FP8_WEIGHT_WRITE_BYTES_PER_PARAM if plan.dtype == "fp8" and plan.fp8_params
                 else WEIGHT_BYTES_PER_PARAM)
    if (plan.fsdp_fp32_params and plan.zero >= 3) or impl != "fused":
        param = (float(FSDP_FP32_WEIGHT_BYTES_PER_PARAM) if plan.fsdp_fp32_params
                 else float(MASTER_WEIGHT_BYTES_PER_PARAM[plan.master_weights_dtype])
                 or model_weight)
        has_master = plan.fsdp_fp32_params or plan.master_weights_dtype != "none"
        return OptimizerStorage(implementation=impl, grad_bytes=param, param_bytes=param,
                                exp_avg_bytes=moment, exp_avg_sq_bytes=moment,
                                param_extra_read_bytes=0.0,
                                weight_copy_bytes=copy if has_master else 0.0)
    grad = float(ELEMENT_BYTES[plan.grad_reduce_dtype])
    extra = 0.0
    if plan.master_weights_dtype == "none":
        param, copy = model_weight, (copy if plan.zero >= 1 else 0.0)
    elif _uses_param_remainders(plan, plan.store_param_remainders):
        param, extra = float(MASTER_REMAINDER_BYTES_PER_PARAM), model_weight
    else:
        param = float(MASTER_WEIGHT_BYTES_PER_PARAM[plan.master_weights_dtype])
    return OptimizerStorage(implementation=impl, grad_bytes=grad, param_bytes=param,
                            exp_avg_bytes=moment, exp_avg_sq_bytes=moment,
                            param_extra_read_bytes=extra, weight_copy_bytes=copy)


def checkpoint_bytes_per_param(plan: ParallelPlan | None = None) -> float:
    """Bytes a full checkpoint holds per parameter, from what the plan stores: the model
    weights (bf16 2; the fp32 parameters 4 under ``fsdp_fp32_params``, which are the
    masters), the master weights (``master_weights_dtype``: fp32 4, as 16-bit remainders 2,
    bf16 2, none 0) and Adam's two moments (``optimizer_moments_dtype``); gradients are not
    saved (``torch.save`` of the model and optimizer state dicts; Megatron-Core
    ``dist_checkpointing`` saves the model's sharded state dict and the distributed
    optimizer's ``param``/``exp_avg``/``exp_avg_sq`` shards). FP8 primary weights are
    counted at 2 bytes (assumption: saved as the FP8 weight and its transpose or
    dequantized to bf16). Without a plan, and for the defaults: 2 + 4 + 8 = 14
    (:data:`strategies.failures.CHECKPOINT_BYTES_PER_PARAM`).
    """
    if plan is None:
        return float(WEIGHT_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM)
    if plan.fsdp_fp32_params and plan.zero >= 3:
        return FSDP_FP32_WEIGHT_BYTES_PER_PARAM + 2.0 * ELEMENT_BYTES[plan.optimizer_moments_dtype]
    return WEIGHT_BYTES_PER_PARAM + optimizer_state_bytes_per_param(plan)


def optimizer_state_bytes_per_param(plan: ParallelPlan) -> float:
    """Bytes per parameter of an Adam optimizer's state outside FSDP fp32 parameters: the
    master weights (:func:`_master_bytes_per_param`) and the two moments in
    ``optimizer_moments_dtype`` (defaults: 4 + 8 = 12,
    :data:`OPTIMIZER_BYTES_PER_PARAM`)."""
    moments = 2.0 * ELEMENT_BYTES[plan.optimizer_moments_dtype]
    return float(_master_bytes_per_param(plan, plan.store_param_remainders) + moments)


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one rank, bytes.

    Attributes:
        weights_bytes: model weights (bf16, + FP8 copies in fp8 plans), after ZeRO-3 sharding.
        gradients_bytes: gradients (bf16), after ZeRO-2 sharding.
        optimizer_bytes: fp32 master weights, momentum, variance, after ZeRO-1 sharding.
        activations_bytes: activations kept for the backward (all in-flight micro-batches).
        comm_buffers_bytes: gradient buckets and ZeRO-3 gathered weights.
        workspace_bytes: CUDA context, library workspaces, allocator slack.
        transient_bytes: the largest transient working set on top of the held activations
            (:func:`transient_activation_bytes`).
    """

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    comm_buffers_bytes: float
    workspace_bytes: float
    transient_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        """Sum of all fields, bytes."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.comm_buffers_bytes + self.workspace_bytes
                + self.transient_bytes)

    def to_dict(self) -> dict[str, float]:
        """Every field plus ``total_bytes``, bytes."""
        # (the fields are floats: dataclasses.asdict's recursive copy gives the same dict)
        values = self.__dict__
        return {**{name: values[name] for name in _BREAKDOWN_FIELDS},
                "total_bytes": self.total_bytes}


_BREAKDOWN_FIELDS = tuple(f.name for f in fields(MemoryBreakdown))


@dataclass(frozen=True)
class Remedy:
    """One plan change that lowers a rank's memory: a suggestion of :class:`OutOfMemoryError`.

    Attributes:
        field: the :class:`~strategies.plan.ParallelPlan` field to change.
        value: the value to try.
    """

    field: str
    value: object

    def __str__(self) -> str:
        """As the Python API takes it: ``zero=2``, ``recompute='full'``."""
        return f"{self.field}={self.value!r}"


class OutOfMemoryError(ValueError):
    """A rank needs more memory than its GPU has.

    Attributes:
        rank: the rank.
        breakdown: its :class:`MemoryBreakdown`.
        capacity_bytes: the GPU memory it was checked against, bytes.
        suggestions: remedies, the most effective first: :class:`Remedy` (one plan field)
            or plain advice (``"more tp, pp or cp"``). The message spells them as the
            Python API does; :meth:`message` lets a front end spell them its own way.
    """

    def __init__(self, rank: int, breakdown: MemoryBreakdown, capacity_bytes: float,
                 suggestions: Sequence[Remedy | str] = ()) -> None:
        self.rank = rank
        self.breakdown = breakdown
        self.capacity_bytes = capacity_bytes
        self.suggestions = tuple(suggestions)
        super().__init__(self.message(str))

    def message(self, spell: Callable[[Remedy], str]) -> str:
        """The one-line message with each :class:`Remedy` written by ``spell`` (plain
        advice as it is)."""
        b = self.breakdown
        tips = ", ".join(spell(s) if isinstance(s, Remedy) else s
                         for s in self.suggestions) or "a plan that shards more"
        return (
            f"out of memory on rank {self.rank}: needs {_gib(b.total_bytes)} GiB of "
            f"{_gib(self.capacity_bytes)} GiB (weights {_gib(b.weights_bytes)}, gradients "
            f"{_gib(b.gradients_bytes)}, optimizer {_gib(b.optimizer_bytes)}, activations "
            f"{_gib(b.activations_bytes + b.transient_bytes)}, comm buffers {_gib(b.comm_buffers_bytes)}, workspace "
            f"{_gib(b.workspace_bytes)} GiB); try {tips}"
        )


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def _layer_kwargs(model: ModelSpec, plan: ParallelPlan, options: MemoryOptions) -> dict:
    """Keyword arguments of :func:`model_costs.activation_bytes_per_layer` for ``plan``."""
    fp8 = plan.dtype == "fp8"
    return dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
                sequence_parallel=plan.sequence_parallel, dtype="bf16" if fp8 else plan.dtype,
                flash_attention=plan.flash_attention, dropout=model.dropout,
                fp8_linear_inputs=fp8 and options.fp8_linear_inputs, etp=_etp(plan),
                fp8_swiglu_inputs=options.fp8_swiglu_inputs,
                e5m6_attention_output=options.e5m6_attention_output,
                expert_load=plan_routed_load(model, plan).rows_factor)


def _etp(plan: ParallelPlan) -> int:
    """Expert tensor-parallel size of the plan."""
    return plan.expert_tp or plan.tp


def _modes(plan: ParallelPlan, layers: Sequence[int],
           recompute_of: Callable[[int], str] | None) -> list[str]:
    return [plan.recompute if recompute_of is None else recompute_of(layer) for layer in layers]


def _layer_bytes(model: ModelSpec, layer: int, mode: str, kwargs: dict,
                 options: MemoryOptions) -> float:
    """One layer's held activations under ``mode`` and the options' recompute modules."""
    modules = options.recompute_modules if mode != "full" else ()
    return model_costs.activation_bytes_per_layer(model, layer, recompute=mode,
                                                  recompute_modules=modules, **kwargs)


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                           has_embedding: bool, has_head: bool,
                           recompute_of: Callable[[int], str] | None = None) -> float:
    """Activations one micro-batch leaves on a pipeline stage for its backward, bytes
    (:func:`_stage_activation_bytes`, memoised: module section "caching")."""
    layers = tuple(layers)
    key = ("stage", _plan_key(plan, "activations"), _layers_key(model, layers), has_embedding,
           has_head,
           _modes_key(layers[plan.activation_offload_layers:], recompute_of))
    return _cached(key, model, lambda: _stage_activation_bytes(
        model, plan, layers=layers, has_embedding=has_embedding, has_head=has_head,
        recompute_of=recompute_of))


def _stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                            has_embedding: bool, has_head: bool,
                            recompute_of: Callable[[int], str] | None = None) -> float:
    """Activations one micro-batch leaves on a pipeline stage for its backward, bytes:
    the stage's layers (:func:`strategies.model_costs.activation_bytes_per_layer` under
    ``plan.recompute`` and ``options.recompute_modules``, in fp8 plans with FP8 linear
    inputs when ``options.fp8_linear_inputs``) plus the embedding's and the head's
    (``options.cross_entropy``) when the stage holds them, and on the head's stage the MTP
    modules' (each a layer like the last one and the head again). The first
    ``options.activation_offload_layers`` layers hold nothing on the GPU (offloaded).
    The memory model weighs each in-flight (stage, micro-batch) by this.

    ``recompute_of(layer)``: the layer's recompute mode when it differs from
    ``plan.recompute`` (a partial full recompute; StepLowerer.recompute_of)."""
    options = memory_options(plan)
    kwargs = _layer_kwargs(model, plan, options)
    kept = list(layers)[options.activation_offload_layers:]
    modes = _modes(plan, kept, recompute_of)
    total = 0.0
    for mode in sorted(set(modes)):
        chosen = [layer for layer, m in zip(kept, modes) if m == mode]
        total += sum(count * _layer_bytes(model, layer, mode, kwargs, options)
                     for layer, count in model_costs.layer_types(model, chosen).items())
    act_kwargs = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
                      sequence_parallel=plan.sequence_parallel)
    if has_embedding:
        total += model_costs.embedding_activation_bytes(model, dropout=model.dropout,
                                                        **act_kwargs)
    if has_head:
        head = model_costs.head_activation_bytes(model, dtype=kwargs["dtype"],
                                                 cross_entropy=options.cross_entropy,
                                                 **act_kwargs)
        # each MTP module keeps a layer's activations and runs the head and loss again
        mtp_layer = _layer_bytes(model, model.num_layers - 1, plan.recompute, kwargs, options)
        total += head + model.mtp_layers * (mtp_layer + head)
    return total


def transient_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                               has_head: bool,
                               recompute_of: Callable[[int], str] | None = None) -> float:
    """The largest working set a rank needs on top of the activations it holds, bytes
    (:func:`_transient_activation_bytes`, memoised: module section "caching")."""
    layers = tuple(layers)
    key = ("transient", _plan_key(plan, "activations"), _layers_key(model, layers), has_head,
           _modes_key(layers, recompute_of))
    return _cached(key, model, lambda: _transient_activation_bytes(
        model, plan, layers=layers, has_head=has_head, recompute_of=recompute_of))


def _transient_activation_bytes(model: ModelSpec, plan: ParallelPlan, *,
                                layers: Sequence[int], has_head: bool,
                                recompute_of: Callable[[int], str] | None = None) -> float:
    """The largest working set a rank needs on top of the activations it holds, bytes
    (module docstring): the largest of

    * a recomputed layer's rematerialised activations (``full``: its ``recompute="none"``
      bytes; recompute modules: the bytes they dropped);
    * an offloaded layer reloaded for its backward (its held bytes);
    * the loss (:func:`strategies.model_costs.head_transient_bytes`, head rank only);
    * an MLP backward: gradients of the fc1 output and of the activation output,
      ``e*n*(F1 + f)/t`` with ``F1 = 2f`` gated, ``f`` otherwise (routed experts: per
      token-expert pair, ``f = f_e``; shared experts added).

    0 for a rank holding no layer and no head."""
    options = memory_options(plan)
    kwargs = _layer_kwargs(model, plan, options)
    held = list(layers)
    candidates = [0.0]
    modes = _modes(plan, held, recompute_of)
    offloaded = set(held[:options.activation_offload_layers])
    for mode in sorted(set(modes)):
        chosen = [layer for layer, m in zip(held, modes) if m == mode]
        for layer in model_costs.layer_types(model, chosen):
            none = _layer_bytes(model, layer, "none", kwargs, replace_modules(options, ()))
            kept = _layer_bytes(model, layer, mode, kwargs, options)
            if mode == "full":
                candidates.append(none)
            else:
                candidates.append(none - kept)
        for layer in model_costs.layer_types(model, [x for x in chosen if x in offloaded]):
            candidates.append(_layer_bytes(model, layer, mode, kwargs, options))
    e = ELEMENT_BYTES[kwargs["dtype"]]
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    width = 3 if model.mlp == "swiglu" else 2
    for layer in model_costs.layer_types(model, held):
        if model.is_moe_layer(layer):
            moe = model.moe
            local = tokens / plan.tp if plan.sequence_parallel else tokens
            pairs = kwargs["etp"] * local * moe.top_k * kwargs["expert_load"]
            candidates.append(e * width * (pairs * moe.expert_ffn_hidden_size / kwargs["etp"]
                                           + tokens * moe.shared_experts
                                           * moe.expert_ffn_hidden_size / plan.tp))
        else:
            candidates.append(e * width * tokens * model.ffn_hidden_size / plan.tp)
    if has_head:
        candidates.append(model_costs.head_transient_bytes(
            model, micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
            dtype=kwargs["dtype"], cross_entropy=options.cross_entropy))
    return max(candidates)


def replace_modules(options: MemoryOptions, modules: tuple[str, ...]) -> MemoryOptions:
    """``options`` with other recompute modules."""
    return dataclasses.replace(options, recompute_modules=modules)


def rank_memory(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                has_embedding: bool, has_head: bool, inflight_microbatches: int | None = None,
                held_activation_bytes: float | None = None,
                reserve_bytes: float = WORKSPACE_BYTES,
                recompute_of: Callable[[int], str] | None = None,
                chunk_copies: int = 1) -> MemoryBreakdown:
    """Peak memory of one rank holding ``layers`` (and the embedding/head) under ``plan``.

    With ``P_d``, ``P_e`` the dense and routed-expert parameters on the rank
    (:func:`strategies.model_costs.rank_params` with ``plan.tp``, ``plan.ep``), ``P_l`` the
    parameters of its transformer layers, ``D = shard_dp*cp`` (the ZeRO/FSDP shard group:
    ``dp*cp`` unless ``plan.dp_shard`` splits dp), ``D_e = tp*dp*cp/(expert_tp*ep)``, ``z =
    plan.zero``, ``c`` the fp8 recipe's weight-copy bytes in fp8 plans (else 0),
    ``g`` the bytes of ``plan.grad_reduce_dtype`` and ``K = M + 2*m`` with ``m`` the bytes
    of ``plan.optimizer_moments_dtype`` and ``M`` those of ``plan.master_weights_dtype``
    (fp32 4, bf16 2, none 0; 2 for fp32 with ``plan.store_param_remainders``, ``z >= 1``
    and 16-bit weights): 12 by default. With ``plan.fp8_params`` in fp8 plans ``c = 0``
    (the FP8 weight and its transpose take the bf16 weight's 2 bytes):

    * weights    = ``2*(P_d/D + P_e/D_e) + c*P_l/D`` if z = 3 else ``2*(P_d + P_e) + c*P_l``
      (sharded FP8 copies with ZeRO-3 are those of the gathered layers, counted in the
      buffers, so ``c*P_l/D`` is omitted there); with ``plan.fsdp_fp32_params`` (z = 3)
      ``4*(P_d/D + P_e/D_e)``;
    * gradients  = ``g*(P_d/D + P_e/D_e)`` if z >= 2 else ``g*(P_d + P_e)``;
    * optimizer  = ``K*(P_d/D + P_e/D_e)`` if z >= 1 else ``K*(P_d + P_e)`` (no
      remainders); with ``plan.fsdp_fp32_params`` ``2*m*(P_d/D + P_e/D_e)`` (the weights
      are the masters);
    * activations = ``held_activation_bytes`` (what the schedule's in-flight stages and
      micro-batches hold at the rank's peak, each weighed by its
      :func:`stage_activation_bytes`; :meth:`strategies.schedules.PipelineSchedule.peak_activation_bytes`),
      or ``inflight * stage_activation_bytes(layers, ...)`` for a rank whose in-flight
      micro-batches each hold all its layers;
    * transient = :func:`transient_activation_bytes` when anything is held, else 0;
    * comm buffers = ``2*grad_bucket_bytes`` if dp*cp > 1, plus for z = 3 and D > 1
      ``(2 + c) * (sum of the two largest held layers' P_d + P_e)`` (gathered weights) and
      ``(2 + (g if g != 2 else 0)) * (the largest)`` (its unsharded gradients);
    * workspace = ``reserve_bytes``.

    Args:
        model: the model.
        plan: the parallel plan (tp, cp, dp, ep, zero, micro_batch, seq_len,
            sequence_parallel, recompute, dtype, grad_bucket_bytes, grad_reduce_dtype are
            read).
        layers: indices of the transformer layers this rank holds (all its virtual stages).
        has_embedding: the rank holds the input embedding (first pipeline stage).
        has_head: the rank holds the final norm, LM head and loss (last stage).
        inflight_microbatches: micro-batches whose activations of every held layer are
            alive at the peak (1F1B: ``pp - stage``; GPipe: all of them).
        held_activation_bytes: instead, the activations held at the peak, bytes (give
            exactly one of the two).
        reserve_bytes: the GPU's reserve (CUDA context, NCCL buffers, workspaces,
            allocator slack: ``GpuSpec.memory_reserve_bytes``), reported as workspace.
        recompute_of: each layer's recompute mode when it differs from the plan's
            (a partial full recompute, StepLowerer.recompute_of).
        chunk_copies: pipeline ranks holding each of this rank's chunks (DualPipe: 2);
            ZeRO shards their states over all of them (``D`` and ``D_e`` times this).

    Returns:
        The :class:`MemoryBreakdown`, bytes.

    Raises:
        ValueError: ``ep`` not dividing ``dp*cp``, negative in-flight count, unknown zero
            stage or recompute mode, sizes the model cannot be split by.
    """
    if (inflight_microbatches is None) == (held_activation_bytes is None):
        raise ValueError("inflight_microbatches: give exactly one of inflight_microbatches and "
                         "held_activation_bytes")
    if inflight_microbatches is not None and (
            isinstance(inflight_microbatches, bool) or not isinstance(inflight_microbatches, int)
            or inflight_microbatches < 0):
        raise ValueError(f"inflight_microbatches: {inflight_microbatches!r} must be an integer >= 0")
    if held_activation_bytes is not None and not 0 <= held_activation_bytes < math.inf:
        raise ValueError(f"held_activation_bytes: {held_activation_bytes!r} must be finite and >= 0")
    layers = tuple(layers)
    key = ("states", _plan_key(plan, "states"), _layers_key(model, layers), has_embedding,
           has_head, chunk_copies)
    weights, grads, optimizer, comm = _cached(key, model, lambda: _model_states(
        model, plan, layers=layers, has_embedding=has_embedding, has_head=has_head,
        chunk_copies=chunk_copies))

    if held_activation_bytes is None:
        activations = inflight_microbatches * stage_activation_bytes(
            model, plan, layers=layers, has_embedding=has_embedding, has_head=has_head,
            recompute_of=recompute_of)
    else:
        activations = float(held_activation_bytes)
    transient = 0.0
    if activations > 0:
        transient = transient_activation_bytes(model, plan, layers=layers, has_head=has_head,
                                               recompute_of=recompute_of)

    return MemoryBreakdown(
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        comm_buffers_bytes=comm,
        workspace_bytes=float(reserve_bytes),
        transient_bytes=transient,
    )


def _model_states(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                  has_embedding: bool, has_head: bool, chunk_copies: int = 1) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, communication buffers) bytes of :func:`rank_memory`
    (its formulas), after checking the plan's fields they read."""
    if plan.zero not in ZERO_STAGES:
        raise ValueError(f"zero: {plan.zero!r} is not a ZeRO stage; valid: {', '.join(map(str, ZERO_STAGES))}")
    if plan.recompute not in RECOMPUTE:
        raise ValueError(f"recompute: {plan.recompute!r} is not a recompute mode; valid: {', '.join(RECOMPUTE)}")
    for field in ("dp", "tp", "cp", "ep"):
        value = getattr(plan, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}: {value!r} must be a positive integer")
    dp_group = plan.dp * plan.cp
    etp = _etp(plan)
    if (plan.tp * dp_group) % (etp * plan.ep):
        raise ValueError(
            f"ep: expert_tp {etp} x ep {plan.ep} does not divide tp*cp*dp = "
            f"{plan.tp * dp_group}; the expert side splits a pipeline stage's ranks"
        )
    # expert data parallelism: tp*cp*dp / (expert_tp*ep) ranks hold the same expert shard
    expert_dp_group = plan.tp * dp_group // (etp * plan.ep) * chunk_copies
    # hybrid sharding (plan.dp_shard): states divided by the shard group, shard_dp * cp
    # (PyTorch FSDP HYBRID_SHARD / FSDP2 2-D mesh: "sharding within a node and replicating
    # across nodes", torch.distributed.fsdp.ShardingStrategy; Megatron-Core's distributed
    # optimizer over dp*cp / num_distributed_optimizer_instances ranks)
    shard_dp_group = plan.shard_dp * plan.cp
    shard_group = shard_dp_group * chunk_copies

    rp = model_costs.rank_params(model, layers=layers, tp=plan.tp, ep=plan.ep, etp=etp,
                                 has_embedding=has_embedding, has_head=has_head)
    layer_params = sum(count * sum(model_costs.layer_params(model, layer, tp=plan.tp, ep=plan.ep,
                                                            etp=etp))
                       for layer, count in model_costs.layer_types(model, layers).items())
    options = memory_options(plan)
    fp8_cache = options.fp8_weight_cache_bytes_per_param if plan.dtype == "fp8" else 0.0
    if plan.dtype == "fp8" and plan.fp8_params:
        # FP8 primary weights: the FP8 weight and its transpose replace the bf16 weight
        # and the cached FP8 copies, FP8_PARAM_BYTES_PER_PARAM == WEIGHT_BYTES_PER_PARAM
        fp8_cache = FP8_PARAM_BYTES_PER_PARAM - WEIGHT_BYTES_PER_PARAM

    def sharded(per_param: float, shard: bool) -> float:
        if shard:
            return (per_param * rp.dense_params / shard_group
                    + per_param * rp.expert_params / expert_dp_group)
        return per_param * rp.dense_params + per_param * rp.expert_params

    fp32_params = plan.fsdp_fp32_params and plan.zero >= 3
    weights = sharded(FSDP_FP32_WEIGHT_BYTES_PER_PARAM if fp32_params
                      else WEIGHT_BYTES_PER_PARAM, plan.zero >= 3)
    if plan.zero < 3:
        weights += fp8_cache * layer_params
    # gradients accumulate (and are reduced) in the plan's gradient dtype: Megatron's
    # main_grad buffer is fp32 with grad_reduce_in_fp32, bf16 otherwise
    grad_bytes = ELEMENT_BYTES[plan.grad_reduce_dtype]
    grads = sharded(grad_bytes, plan.zero >= 2)
    moments = 2 * ELEMENT_BYTES[plan.optimizer_moments_dtype]
    if fp32_params:
        optimizer = sharded(moments, True)
    else:
        master = _master_bytes_per_param(plan, options.store_param_remainders)
        optimizer = sharded(master + moments, plan.zero >= 1)

    comm = 0.0
    if dp_group > 1:
        comm += 2.0 * plan.grad_bucket_bytes
        if plan.zero >= 3 and len(layers) > 0 and shard_dp_group > 1:
            sizes = sorted((sum(model_costs.layer_params(model, layer, tp=plan.tp, ep=plan.ep,
                                                         etp=etp))
                            for layer, count in model_costs.layer_types(model, layers).items()
                            for _ in range(min(count, ZERO3_PREFETCH_LAYERS))), reverse=True)
            comm += (WEIGHT_BYTES_PER_PARAM + fp8_cache) * sum(sizes[:ZERO3_PREFETCH_LAYERS])
            # the largest layer's unsharded gradients (bf16, plus their reduction-dtype copy)
            comm += (GRAD_BYTES_PER_PARAM + (grad_bytes if grad_bytes != GRAD_BYTES_PER_PARAM
                                             else 0)) * max(sizes)
    return weights, grads, optimizer, comm


class PipelineLayout(Protocol):
    """What :func:`pipeline_memory` reads of a step's stage layout
    (:class:`strategies.lowering.StepLowerer` provides it)."""

    num_stages: int
    stage_layers: Sequence[Sequence[int]]
    schedule: object
    placement: object
    chunk_copies: int

    def rank_layers(self, p: int) -> list[int]: ...
    def holds_embedding(self, p: int) -> bool: ...
    def holds_head(self, p: int) -> bool: ...
    def recompute_of(self, layer: int) -> str: ...


def pipeline_memory(model: ModelSpec, plan: ParallelPlan, layout: PipelineLayout, *,
                    reserve_bytes: float = WORKSPACE_BYTES) -> dict[int, MemoryBreakdown]:
    """Peak memory of every pipeline rank under the plan's schedule: :func:`rank_memory`
    of each rank with the activations the schedule keeps in flight at its peak, each
    (stage, micro-batch) weighed by that stage's :func:`stage_activation_bytes`
    (:meth:`strategies.schedules.PipelineSchedule.peak_activation_bytes`).
    ``{pipeline rank: breakdown}``."""
    placement = layout.placement
    stage_bytes = [stage_activation_bytes(model, plan, layers=layers,
                                          has_embedding=placement.is_first(s),
                                          has_head=placement.is_last(s),
                                          recompute_of=layout.recompute_of)
                   for s, layers in enumerate(layout.stage_layers)]
    held = layout.schedule.peak_activation_bytes(plan.pp, plan.num_microbatches, plan.vpp,
                                                 stage_bytes)
    return {p: rank_memory(model, plan, layers=layout.rank_layers(p),
                           has_embedding=layout.holds_embedding(p),
                           has_head=layout.holds_head(p), held_activation_bytes=held[p],
                           reserve_bytes=reserve_bytes, recompute_of=layout.recompute_of,
                           chunk_copies=layout.chunk_copies)
            for p in range(plan.pp)}


def check_fits(breakdown: MemoryBreakdown, capacity_bytes: float, rank: int, *,
               plan: ParallelPlan | None = None) -> None:
    """Raise :class:`OutOfMemoryError` when ``breakdown.total_bytes > capacity_bytes``.

    The message suggests remedies, the biggest consumer first: for model states a higher
    ZeRO stage (when ``plan.zero < 3`` or no plan is given); for activations full
    recompute (unless ``plan`` uses it; selective recompute saves nothing under flash
    attention) and a smaller micro-batch (when ``plan.micro_batch > 1`` or no plan);
    always, last, more tp, pp or cp.

    Raises:
        ValueError: ``capacity_bytes`` not > 0.
        OutOfMemoryError: the rank does not fit (a ValueError with a one-line message).
    """
    if not capacity_bytes > 0:
        raise ValueError(f"capacity_bytes: {capacity_bytes!r} must be > 0")
    if breakdown.total_bytes <= capacity_bytes:
        return
    states: list[Remedy | str] = []
    if plan is None:
        states.append("a higher ZeRO stage")
    elif plan.zero < 3 and plan.shard_dp * plan.cp > 1:  # (one shard: ZeRO divides nothing)
        states.append(Remedy("zero", plan.zero + 1))
    acts: list[Remedy | str] = []
    # Under flash attention selective recompute saves nothing (model_costs), so only
    # full recompute is suggested.
    if plan is None:
        acts += [Remedy("recompute", "full"), "a smaller micro_batch"]
    else:
        if plan.recompute != "full":
            acts.append(Remedy("recompute", "full"))
        if plan.micro_batch > 1:
            acts.append(Remedy("micro_batch", plan.micro_batch // 2))
    model_states = breakdown.weights_bytes + breakdown.gradients_bytes + breakdown.optimizer_bytes
    ordered = states + acts if model_states >= breakdown.activations_bytes else acts + states
    suggestions = [*ordered, "more tp, pp or cp"]
    raise OutOfMemoryError(rank, breakdown, capacity_bytes, suggestions)
