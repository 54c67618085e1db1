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
``dp * cp / ep`` for routed-expert parameters (expert data parallelism). Shards are exact
fractions (no padding to bucket boundaries).

Choices (assumptions, stated once):

* fp8 plans (``plan.dtype == "fp8"``) keep the bf16 weights *and* an fp8 copy of every
  parameter (Transformer Engine caches the fp8 cast of the weights for the step): weights
  cost 3 bytes per parameter (2 + 1); gradients stay bf16 and the optimizer fp32; stored
  activations stay bf16 (Transformer Engine can keep fp8 copies of linear inputs; not
  assumed). Norm and embedding weights are counted the same way (a small overestimate).
* Activations: what the pipeline schedule keeps alive at a rank's peak, each in-flight
  (stage, micro-batch) weighed by that stage's own bytes (:func:`stage_activation_bytes`:
  its layers' :func:`strategies.model_costs.activation_bytes_per_layer`, plus the
  embedding's and the head's — fp32 loss logits ``4*n*V/t`` — on the stages that hold
  them). An interleaved rank's in-flight chunks each hold one chunk's layers, not all of
  the rank's. With ``recompute="full"``, the backward
  rematerialises one layer's full activations at a time: the largest held layer's
  ``recompute="none"`` activations are added once (Korthikanti et al. 2022, Section 5).
  Dropout masks are counted as in Korthikanti et al. (the cost model's default).
* Communication buffers: ``2 * plan.grad_bucket_bytes`` for the data-parallel gradient
  reduction (one bucket being reduced while the next fills) when the data-parallel group has
  more than one rank; with ZeRO-3 (and a group > 1) also the all-gathered, unsharded weights
  of the two largest held layers (the current layer and the prefetched next one, as FSDP's
  default ``limit_all_gathers`` allows).
* Workspace: the GPU's stated reserve (``GpuSpec.memory_reserve_bytes``, a preset field:
  CUDA context and kernel images, NCCL channel buffers of the communicators, cuBLAS and
  Transformer Engine workspaces, the caching allocator's fragmentation slack);
  :data:`WORKSPACE_BYTES` = 1 GiB when none is given.
* Gradients are held in the plan's ``grad_reduce_dtype`` (Megatron's ``main_grad``
  buffers are fp32 with ``grad_reduce_in_fp32``, bf16 otherwise).

Units: bytes (GiB = 2**30 bytes only in messages).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from hardware.units import ELEMENT_BYTES, GIB
from strategies import model_costs
from strategies.model_spec import ModelSpec
from strategies.plan import ParallelPlan, RECOMPUTE, ZERO_STAGES

__all__ = [
    "FP8_WEIGHT_COPY_BYTES_PER_PARAM",
    "GRAD_BYTES_PER_PARAM",
    "MemoryBreakdown",
    "OPTIMIZER_BYTES_PER_PARAM",
    "OutOfMemoryError",
    "WEIGHT_BYTES_PER_PARAM",
    "WORKSPACE_BYTES",
    "ZERO3_PREFETCH_LAYERS",
    "check_fits",
    "rank_memory",
    "stage_activation_bytes",
]

#: bf16 weights (ZeRO paper: fp16 parameters, 2 bytes).
WEIGHT_BYTES_PER_PARAM = 2
#: Extra fp8 copy of the weights in fp8 plans (module docstring).
FP8_WEIGHT_COPY_BYTES_PER_PARAM = 1
#: bf16 gradients (ZeRO paper: fp16 gradients, 2 bytes).
GRAD_BYTES_PER_PARAM = 2
#: fp32 master weights, Adam momentum and variance (ZeRO paper: K = 12).
OPTIMIZER_BYTES_PER_PARAM = 12
#: Layers whose full weights ZeRO-3 holds gathered at once (current + prefetched).
ZERO3_PREFETCH_LAYERS = 2
#: CUDA context, cuBLAS/NCCL workspaces, allocator slack: assumed, see module docstring.
WORKSPACE_BYTES = 1 * GIB


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one rank, bytes.

    Attributes:
        weights_bytes: model weights (bf16, + fp8 copy in fp8 plans), after ZeRO-3 sharding.
        gradients_bytes: gradients (bf16), after ZeRO-2 sharding.
        optimizer_bytes: fp32 master weights, momentum, variance, after ZeRO-1 sharding.
        activations_bytes: activations kept for the backward (all in-flight micro-batches).
        comm_buffers_bytes: gradient buckets and ZeRO-3 gathered weights.
        workspace_bytes: CUDA context, library workspaces, allocator slack.
    """

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    comm_buffers_bytes: float
    workspace_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of all fields, bytes."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.comm_buffers_bytes + self.workspace_bytes)

    def to_dict(self) -> dict[str, float]:
        """Every field plus ``total_bytes``, bytes."""
        return {**asdict(self), "total_bytes": self.total_bytes}


class OutOfMemoryError(ValueError):
    """A rank needs more memory than its GPU has.

    Attributes:
        rank: the rank.
        breakdown: its :class:`MemoryBreakdown`.
        capacity_bytes: the GPU memory it was checked against, bytes.
    """

    def __init__(self, rank: int, breakdown: MemoryBreakdown, capacity_bytes: float,
                 suggestions: Sequence[str] = ()) -> None:
        self.rank = rank
        self.breakdown = breakdown
        self.capacity_bytes = capacity_bytes
        b = breakdown
        tips = ", ".join(suggestions) or "a plan that shards more"
        message = (
            f"out of memory on rank {rank}: needs {_gib(b.total_bytes)} GiB of "
            f"{_gib(capacity_bytes)} GiB (weights {_gib(b.weights_bytes)}, gradients "
            f"{_gib(b.gradients_bytes)}, optimizer {_gib(b.optimizer_bytes)}, activations "
            f"{_gib(b.activations_bytes)}, comm buffers {_gib(b.comm_buffers_bytes)}, workspace "
            f"{_gib(b.workspace_bytes)} GiB); try {tips}"
        )
        super().__init__(message)


def _gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                           has_embedding: bool, has_head: bool,
                           recompute_of: Callable[[int], str] | None = None) -> float:
    """Activations one micro-batch leaves on a pipeline stage for its backward, bytes:
    the stage's layers (:func:`strategies.model_costs.activation_bytes_per_layer` under
    ``plan.recompute``) plus the embedding's and the head's when the stage holds them.
    The memory model weighs each in-flight (stage, micro-batch) by this.

    ``recompute_of(layer)``: the layer's recompute mode when it differs from
    ``plan.recompute`` (a partial full recompute; StepLowerer.recompute_of)."""
    act_kwargs = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
                      sequence_parallel=plan.sequence_parallel)
    act_dtype = "bf16" if plan.dtype == "fp8" else plan.dtype
    layer_kwargs = dict(act_kwargs, flash_attention=plan.flash_attention, dropout=model.dropout)
    modes = [plan.recompute if recompute_of is None else recompute_of(layer)
             for layer in layers]
    total = 0.0
    for mode in sorted(set(modes)):
        chosen = [layer for layer, m in zip(layers, modes) if m == mode]
        total += sum(count * model_costs.activation_bytes_per_layer(
                         model, layer, recompute=mode, dtype=act_dtype, **layer_kwargs)
                     for layer, count in model_costs.layer_types(model, chosen).items())
    if has_embedding:
        total += model_costs.embedding_activation_bytes(model, dropout=model.dropout,
                                                        **act_kwargs)
    if has_head:
        total += model_costs.head_activation_bytes(model, dtype=act_dtype, **act_kwargs)
    return total


def rank_memory(model: ModelSpec, plan: ParallelPlan, *, layers: Sequence[int],
                has_embedding: bool, has_head: bool, inflight_microbatches: int | None = None,
                held_activation_bytes: float | None = None,
                reserve_bytes: float = WORKSPACE_BYTES,
                recompute_of: Callable[[int], str] | None = None) -> MemoryBreakdown:
    """Peak memory of one rank holding ``layers`` (and the embedding/head) under ``plan``.

    With ``P_d``, ``P_e`` the dense and routed-expert parameters on the rank
    (:func:`strategies.model_costs.rank_params` with ``plan.tp``, ``plan.ep``),
    ``D = dp*cp``, ``D_e = dp*cp/ep``, ``w = 2`` (3 for fp8) and ``z = plan.zero``:

    * weights    = ``w*(P_d/D + P_e/D_e)`` if z = 3 else ``w*(P_d + P_e)``;
    * gradients  = ``2*(P_d/D + P_e/D_e)`` if z >= 2 else ``2*(P_d + P_e)``;
    * optimizer  = ``12*(P_d/D + P_e/D_e)`` if z >= 1 else ``12*(P_d + P_e)``;
    * activations = ``held_activation_bytes`` (what the schedule's in-flight stages and
      micro-batches hold at the rank's peak, each weighed by its
      :func:`stage_activation_bytes`; :meth:`strategies.schedules.PipelineSchedule.peak_activation_bytes`),
      or ``inflight * stage_activation_bytes(layers, ...)`` for a rank whose in-flight
      micro-batches each hold all its layers; ``+ max over layers of the recompute="none"
      activations`` if ``plan.recompute`` is full (and anything is held);
    * comm buffers = ``2*grad_bucket_bytes`` if D > 1, plus for z = 3 and D > 1
      ``w * (sum of the two largest held layers' P_d + P_e)``;
    * workspace = :data:`WORKSPACE_BYTES`.

    Args:
        model: the model.
        plan: the parallel plan (tp, cp, dp, ep, zero, micro_batch, seq_len,
            sequence_parallel, recompute, dtype, grad_bucket_bytes are read).
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
    if plan.zero not in ZERO_STAGES:
        raise ValueError(f"zero: {plan.zero!r} is not a ZeRO stage; valid: {', '.join(map(str, ZERO_STAGES))}")
    if plan.recompute not in RECOMPUTE:
        raise ValueError(f"recompute: {plan.recompute!r} is not a recompute mode; valid: {', '.join(RECOMPUTE)}")
    for field in ("dp", "tp", "cp", "ep"):
        value = getattr(plan, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}: {value!r} must be a positive integer")
    dp_group = plan.dp * plan.cp
    if dp_group % plan.ep:
        raise ValueError(
            f"ep: {plan.ep} does not divide dp*cp = {dp_group} (dp {plan.dp}, cp {plan.cp}); "
            "expert parallelism splits the data-parallel group"
        )
    expert_dp_group = dp_group // plan.ep

    rp = model_costs.rank_params(model, layers=layers, tp=plan.tp, ep=plan.ep,
                                 has_embedding=has_embedding, has_head=has_head)
    fp8 = plan.dtype == "fp8"
    w = WEIGHT_BYTES_PER_PARAM + (FP8_WEIGHT_COPY_BYTES_PER_PARAM if fp8 else 0)

    def sharded(per_param: float, shard: bool) -> float:
        if shard:
            return per_param * rp.dense_params / dp_group + per_param * rp.expert_params / expert_dp_group
        return per_param * rp.dense_params + per_param * rp.expert_params

    weights = sharded(w, plan.zero >= 3)
    # gradients accumulate (and are reduced) in the plan's gradient dtype: Megatron's
    # main_grad buffer is fp32 with grad_reduce_in_fp32, bf16 otherwise
    grads = sharded(ELEMENT_BYTES[plan.grad_reduce_dtype], plan.zero >= 2)
    optimizer = sharded(OPTIMIZER_BYTES_PER_PARAM, plan.zero >= 1)

    if held_activation_bytes is None:
        activations = inflight_microbatches * stage_activation_bytes(
            model, plan, layers=layers, has_embedding=has_embedding, has_head=has_head,
            recompute_of=recompute_of)
    else:
        activations = float(held_activation_bytes)
    recomputed = [layer for layer in layers
                  if (plan.recompute if recompute_of is None else recompute_of(layer)) == "full"]
    if recomputed and activations > 0:
        # the backward rematerialises one layer's full activations at a time
        layer_kwargs = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp,
                            cp=plan.cp, sequence_parallel=plan.sequence_parallel,
                            flash_attention=plan.flash_attention, dropout=model.dropout)
        activations += max(model_costs.activation_bytes_per_layer(
                               model, layer, recompute="none",
                               dtype="bf16" if fp8 else plan.dtype, **layer_kwargs)
                           for layer in model_costs.layer_types(model, recomputed))

    comm = 0.0
    if dp_group > 1:
        comm += 2.0 * plan.grad_bucket_bytes
        if plan.zero >= 3 and len(layers) > 0:
            sizes = sorted((sum(model_costs.layer_params(model, layer, tp=plan.tp, ep=plan.ep))
                            for layer in layers), reverse=True)
            comm += w * sum(sizes[:ZERO3_PREFETCH_LAYERS])

    return MemoryBreakdown(
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        comm_buffers_bytes=comm,
        workspace_bytes=float(reserve_bytes),
    )


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
    states: list[str] = []
    if plan is None:
        states.append("a higher ZeRO stage")
    elif plan.zero < 3:
        states.append(f"zero={plan.zero + 1}")
    acts: list[str] = []
    # Under flash attention selective recompute saves nothing (model_costs), so only
    # full recompute is suggested.
    if plan is None:
        acts += ["recompute='full'", "a smaller micro_batch"]
    else:
        if plan.recompute != "full":
            acts.append("recompute='full'")
        if plan.micro_batch > 1:
            acts.append(f"micro_batch={plan.micro_batch // 2}")
    model_states = breakdown.weights_bytes + breakdown.gradients_bytes + breakdown.optimizer_bytes
    ordered = states + acts if model_states >= breakdown.activations_bytes else acts + states
    suggestions = [*ordered, "more tp, pp or cp"]
    raise OutOfMemoryError(rank, breakdown, capacity_bytes, suggestions)
