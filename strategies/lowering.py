"""Lower one training step of a model under a parallel plan into a Program.

What the Program contains for each pipeline rank (Megatron-LM's execution,
Narayanan et al. 2021, Korthikanti et al. 2022):

* the pipeline schedule's actions in order (strategies.pipeline); a forward
  runs the stage's layers kernel by kernel, a backward runs them in reverse
  (recomputing the forward first under ``full`` recompute, or the attention
  core under ``selective``); zero-bubble schedules split the backward into
  input-gradient (I) and weight-gradient (W) actions;
* tensor parallelism: per block (attention, MLP) an all-gather before and a
  reduce-scatter after with sequence parallelism, or one all-reduce after
  without it (forward), mirrored in the backward; on the compute stream, so
  they are exposed, as in Megatron without TP communication overlap;
* context parallelism: the attention core split in ``cp`` pieces, each after
  one ring step of K/V exchange on its own stream (ring attention overlaps
  the exchange with the previous piece);
* expert parallelism: all-to-all dispatch after the router and combine after
  the experts, over the EP group;
* pipeline send/recv of activations (forward) and gradients (backward) on
  per-direction streams, so sends never block the compute stream;
* data parallelism: after the last micro-batch's weight gradients of a
  bucket are ready, its reduction on the ``dp`` stream (all-reduce, or
  reduce-scatter with ZeRO >= 1), overlapped with the rest of the backward;
  ZeRO-3 all-gathers every layer's parameters before its forward and
  backward; the optimizer step, then (ZeRO 1/2) the parameter all-gather.

Parameter-server data parallelism (``plan.dp_mode``) reuses this lowering for one
worker's compute: strategies.param_server overrides :meth:`StepLowerer._reduce_bucket`
(record where each gradient bucket is ready instead of reducing it) and the optimizer.

Symmetry (DESIGN.md principle 5): without stragglers every rank of a pipeline
stage does the same thing at the same time, so the Program lists one
representative per pipeline rank (tp = cp = dp = 0) and collectives carry
their full groups; :attr:`Program.represents` records the multiplicities.
"""

from __future__ import annotations

import functools
import re
from types import MemberDescriptorType
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from hardware.units import ELEMENT_BYTES
from strategies import model_costs as costs
from strategies import moe_dispatch
from strategies.ir import CollectiveOp, ComputeOp, Mirrors, Op, Program, RecvOp, SendOp
from strategies.memory import optimizer_storage
from strategies.model_spec import ModelSpec
from strategies.pipeline import Action
from strategies.schedules import get_schedule
from strategies.plan import (HOST_FREE_MODES, UB_FP8_GATHER_BYTES_PER_ELEMENT, ParallelPlan,
                             RankLayout, stage_layer_counts)

#: Bytes per gradient element reduced over data parallelism (bf16 gradients,
#: the 2 bytes/param of the 16 bytes/param mixed-precision Adam accounting).
GRAD_BYTES = 2
#: Bytes per parameter element all-gathered (bf16 weights).
PARAM_BYTES = 2
#: Chunks a row-parallel GEMM is split in when Transformer Engine pipelines its
#: reduce-scatter (TE userbuffers ``pipeline`` method; ``num_splits`` 4 in NeMo's
#: userbuffer configurations, e.g. nemo/collections/llm/recipes/tp_overlap_configs).
UB_PIPELINE_SPLITS = 4
#: SMs the pipelined reduce-scatter kernels hold while the GEMM chunks run (NeMo's H100
#: userbuffer configurations: ``proj_fprop`` / ``fc2_fprop`` ``num_sm`` 16-24).
UB_PIPELINE_COMM_SMS = 24
#: TP modes of PyTorch DTensor (torch.distributed.tensor.parallel, torchtitan): the
#: all-gather of a column-parallel GEMM's input is the forward of a DTensor redistribute
#: and autograd saves its output for the weight gradient, so the backward does not
#: gather the input again (Megatron-LM saves only the local shard and re-gathers it).
DTENSOR_TP = ("dtensor", "symmetric_memory")
#: TP modes that micro-pipeline each TP collective with its GEMM.
PIPELINED_TP = ("userbuffers", "symmetric_memory")
#: Bytes of the gradient norm's partial sum all-reduced over the optimizer shards (fp32).
GRAD_NORM_BYTES = 4

COMPUTE = "compute"
#: Stream of the expert all-to-all inside an overlapped forward-backward pair.
EP_STREAM = "ep"
#: Communication groups of a rank: tensor, context, gradient (data x context: the ZeRO/FSDP
#: shard group, ``plan.shard_dp`` x cp under hybrid sharding), the HSDP replicas of its
#: shard, expert, expert-gradient (expert data parallelism), expert-tensor, expert x
#: expert-tensor, and the EP members at the rank's position in every NVLink domain and in
#: its own domain.
GROUP_NAMES = ("tp", "cp", "grad", "replica", "ep", "expert_grad", "etp", "ep_etp", "ep_rail",
               "ep_local", "amax")
#: The pseudo-part (beside the layers and the ``"embedding"``/``"head"`` edges) that stands
#: for Transformer Engine's amax all-reduce at the end of a model chunk's forward and
#: backward (:meth:`StepLowerer._amax_reduction`).
AMAX_PART = "amax"
#: fp32 amaxes one FP8 GEMM contributes to TE delayed scaling's forward and backward
#: reductions: forward input, weight, output; backward grad-output, grad-input
#: (TE ``fp8_meta["scaling_fwd"]`` / ``["scaling_bwd"]`` hold ``3 * num_gemms`` and
#: ``2 * num_gemms`` amaxes: transformer_engine/pytorch/module/base.py, TE 1.x and the
#: 2.x DelayedScalingRecipeState alike).
AMAX_PER_GEMM = {"F": 3, "B": 2}
_MICROBATCH = re.compile(r"\.mb\d+")

#: Kernels of a layer kind, the embedding or the head by everything
#: strategies.model_costs reads to build them (StepLowerer._layer_kernels,
#: StepLowerer._edge_kernels): ``key -> (model, kernels)``, the model kept alive with its
#: entry (the key holds its identity); emptied past :data:`_SHARED_KERNELS_MAX` entries.
_SHARED_KERNELS: dict[tuple, tuple[ModelSpec, tuple]] = {}
_SHARED_KERNELS_MAX = 4096


#: Compute ops of :meth:`StepLowerer._emit_kernel` by the kernel's identity and every
#: field compute_op reads (``key -> (kernel, op)``), across lowerers; bounded as
#: :data:`_SHARED_KERNELS`.
_SHARED_OPS: dict[tuple, tuple] = {}
_SHARED_OPS_MAX = 65536


def _bounded_put(table: dict, limit: int, key: tuple, value: tuple) -> None:
    """Store ``value`` under ``key`` in a shared table (:data:`_SHARED_KERNELS`,
    :data:`_SHARED_OPS`), emptying the table first when it holds ``limit`` entries."""
    if len(table) >= limit:
        table.clear()
    table[key] = value


class _LazyGroups(dict):
    """A rank's groups by name (:data:`GROUP_NAMES`), each computed by
    :meth:`StepLowerer._group_of` on first use and kept."""

    def __init__(self, lowerer: "StepLowerer", rank: int) -> None:
        super().__init__()
        self._lowerer, self._rank = lowerer, rank

    def __missing__(self, name: str) -> tuple[int, ...]:
        if name not in GROUP_NAMES:
            raise KeyError(name)
        group = self[name] = self._lowerer._group_of(self._rank, name)
        return group


@dataclass(frozen=True)
class StepLowering:
    """A lowered step and what reports need to interpret it.

    Attributes:
        program: the symmetry-reduced Program (one rank per pipeline rank).
        layout: rank coordinates and groups.
        representatives: rank of each pipeline position (tp = cp = dp = 0).
        stage_layers: global layer indices of each virtual stage.
        actions: schedule actions of each pipeline rank.
    """

    program: Program
    layout: RankLayout
    representatives: tuple[int, ...]
    stage_layers: tuple[tuple[int, ...], ...]
    actions: tuple[tuple[Action, ...], ...]


def split_layers(num_layers: int, plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """Global layer indices of each of the ``pp * vpp`` virtual stages."""
    result, start = [], 0
    for count in stage_layer_counts(num_layers, plan):
        result.append(tuple(range(start, start + count)))
        start += count
    return tuple(result)


class _RankBuilder:
    """Accumulates the ops of one representative rank.

    Args:
        rank: the representative rank.
        groups: its communication groups by name (tp, cp, grad, ep, expert_grad).
    """

    def __init__(self, rank: int, groups: dict[str, tuple[int, ...]],
                 key_counts: dict[str, int] | None = None) -> None:
        self.rank = rank
        self.groups = groups
        self.ops: list[Op] = []
        self.last_on: dict[str, int] = {}
        #: collectives issued per name and group (shared by the builders of one rank)
        self.key_counts: dict[str, int] = {} if key_counts is None else key_counts
        self._waits: set[int] = set()

    def add(self, op: Op) -> int:
        """Append an op; the next compute-stream op also waits for pending :meth:`wait`s."""
        if op.stream == COMPUTE and self._waits:
            op = _copier(type(op), ("deps",))(op, tuple(sorted(self._waits.union(op.deps))))
            self._waits.clear()
        self.ops.append(op)
        index = len(self.ops) - 1
        self.last_on[op.stream] = index
        return index

    def wait(self, index: int) -> None:
        """Make the compute stream's next op wait for op ``index`` (no cost of its own)."""
        if index >= 0:
            self._waits.add(index)

    def last(self, stream: str = COMPUTE) -> int | None:
        return self.last_on.get(stream)

    def pending_waits(self) -> tuple[int, ...]:
        """Ops the next compute-stream op would wait for (:meth:`wait`)."""
        return tuple(sorted(self._waits))

    def replayed(self, last_on: dict[str, int], waits: set[int]) -> None:
        """Ops were appended to :attr:`ops` directly (a replayed layer pass,
        :meth:`StepLowerer._replay`): the streams they ended on and the compute stream's
        pending waits after them."""
        self.last_on.update(last_on)
        self._waits = waits


@dataclass(frozen=True)
class _Template:
    """The ops one layer pass (:meth:`StepLowerer._layer_forward`,
    :meth:`StepLowerer._layer_backward`) appended to a builder, recorded to be replayed for
    the other micro-batches of the same pass (:meth:`StepLowerer._replayed`).

    Indices of ops are stored as references (:func:`_reference`): ``r >= 0`` is the op
    ``r`` places after the pass's first, ``r < 0`` the entry op ``-1 - r`` (the ops the
    pass found as the builder's last compute op and pending waits, in index order).

    Attributes:
        tag: the tag the pass was recorded under (``<phase><stage>.mb<j>``, perhaps
            prefixed): the one part of a collective's name that changes between
            micro-batches.
        ops: per op ``(op, deps, make)``: ``deps`` as references (None: the op is
            appended as it is, the same object); ``make`` builds its copy (:func:`_copier`)
            from a new name, key and deps (a collective) or new deps (a compute op).
        last_on: ``(stream, reference)`` of the streams the pass ended on.
        waits: the compute stream's pending waits after the pass (:meth:`_RankBuilder.wait`),
            as references.
    """

    tag: str
    ops: tuple[tuple[Op, tuple[int, ...] | None, Callable[..., Op]], ...]
    last_on: tuple[tuple[str, int], ...]
    waits: tuple[int, ...]


@functools.cache
def _copier(cls: type, changed: tuple[str, ...]) -> Callable[..., Op]:
    """A function ``make(op, *values)`` building a copy of ``op`` (a ``cls``) whose fields
    ``changed`` take ``values`` (in that order), the others ``op``'s: ``dataclasses.replace``
    without its per-call field walk and keyword handling (a replayed pass rebuilds
    thousands of ops,
    :meth:`StepLowerer._replay`). The op classes are frozen, slotted dataclasses without
    ``__post_init__``: the copy's slots are set directly, one statement per field (code
    generated once per class and fields, as ``dataclasses`` builds ``__init__``); any
    other class is copied by ``dataclasses.replace``."""
    names = tuple(cls.__dataclass_fields__)
    slots = {name: getattr(cls, name, None) for name in names}
    if hasattr(cls, "__post_init__") or not all(
            isinstance(slot, MemberDescriptorType) for slot in slots.values()):
        return lambda op, *values: replace(op, **dict(zip(changed, values)))
    body = [f"    set_{name}(copy, {name})" for name in changed]
    body += [f"    set_{name}(copy, op.{name})" for name in names if name not in changed]
    source = (f"def make(op, {', '.join(changed)}):\n    copy = new(cls)\n"
              + "\n".join(body) + "\n    return copy\n")
    scope = {f"set_{name}": slot.__set__ for name, slot in slots.items()}
    scope.update(new=object.__new__, cls=cls)
    exec(source, scope)  # noqa: S102 (source built above from the class's own field names)
    return scope["make"]


def _record_template(b: _RankBuilder, base: int, entry: Sequence[int], tag: str
                     ) -> _Template | None:
    """The :class:`_Template` of the ops appended to ``b`` since index ``base``, whose
    references to earlier ops are all to ``entry`` (ascending: the builder's last compute
    op and pending waits at the start); None when the ops cannot be replayed by mapping
    indices and renaming: a reference elsewhere before ``base``, deps not ascending (a
    replay keeps their order), a pipeline transfer, or a collective whose name does not
    hold ``tag`` exactly once."""
    position = {index: -1 - k for k, index in enumerate(entry)}

    def references(indices) -> tuple[int, ...] | None:
        if any(i < base and i not in position for i in indices):
            return None
        return tuple(i - base if i >= base else position[i] for i in indices)

    ops = []
    for op in b.ops[base:]:
        deps = references(op.deps)
        if deps is None or any(a >= c for a, c in zip(op.deps, op.deps[1:])):
            return None
        if isinstance(op, CollectiveOp):
            if op.name.count(tag) != 1:
                return None
            ops.append((op, deps, _copier(type(op), ("name", "key", "deps"))))
        elif isinstance(op, ComputeOp):
            ops.append((op, None, None) if not deps
                       else (op, deps, _copier(type(op), ("deps",))))
        else:
            return None
    last_on = tuple((stream, index - base) for stream, index in b.last_on.items()
                    if index >= base)
    waits = references(sorted(b._waits))
    return None if waits is None else _Template(tag, tuple(ops), last_on, waits)


def _is_expert_comm(op: Op) -> bool:
    """Expert-parallel communication (dispatch, combine and the expert-TP gathers)."""
    return isinstance(op, CollectiveOp) and op.axis == "ep"


def _segments(ops: Sequence[Op]) -> list[list[tuple[int, Op]]]:
    """``ops`` (with their indices) cut after each run of expert communication on the
    compute stream: the pieces an overlapped pair interleaves."""
    pieces: list[list[tuple[int, Op]]] = [[]]
    for index, op in enumerate(ops):
        pieces[-1].append((index, op))
        following = ops[index + 1] if index + 1 < len(ops) else None
        if (op.stream == COMPUTE and _is_expert_comm(op) and following is not None
                and not (following.stream == COMPUTE and _is_expert_comm(following))):
            pieces.append([])
    return [piece for piece in pieces if piece]


def reduces_amax(plan: ParallelPlan) -> bool:
    """Whether ``plan``'s stack all-reduces Transformer Engine delayed scaling's amaxes
    after every model chunk's forward and backward (:meth:`StepLowerer._amax_reduction`): dtype
    fp8, ``fp8_recipe`` ``te-delayed``, ``amax_reduction`` ``megatron``, over a group of
    more than one rank (TP x CP x DP, TP x CP with ``tp_only_amax_red``: the same size on
    every rank; a group of one reduces nothing, TE's ``torch.distributed.all_reduce`` over
    a one-rank group moves no data and the simulator issues no op)."""
    group = plan.tp * plan.cp * (1 if plan.tp_only_amax_red else plan.dp)
    return (plan.dtype == "fp8" and plan.fp8_recipe == "te-delayed"
            and plan.amax_reduction == "megatron" and group > 1)


def amax_reduction_bytes(gemms: int, comp: str) -> int:
    """Bytes of the amax all-reduce ending phase ``comp`` (F, or B / I) of a pipeline rank
    whose Transformer Engine modules run ``gemms`` FP8 GEMMs: one fp32 amax per FP8
    tensor, :data:`AMAX_PER_GEMM` of them per GEMM (:meth:`StepLowerer.amax_bytes`)."""
    return ELEMENT_BYTES["fp32"] * AMAX_PER_GEMM["F" if comp == "F" else "B"] * gemms


def pp_message_bytes(model: ModelSpec, plan: ParallelPlan) -> int:
    """Bytes one pipeline send/recv of a micro-batch's activations moves: its tokens on a
    context-parallel rank x hidden size in bf16, split over TP with sequence parallelism
    (each TP rank sends its sequence shard)."""
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    act_bytes = tokens * model.hidden_size * ELEMENT_BYTES["bf16"]
    return act_bytes // plan.tp if plan.sequence_parallel and plan.tp > 1 else act_bytes


class StepLowerer:
    """Builds the Program of one training step (see module docstring).

    Args:
        model: the model.
        plan: a validated plan.
        domain_gpus: GPUs of one NVLink domain (the cluster's scale-up domain), for
            dispatchers whose traffic depends on it (DeepEP); None: one domain.
    """

    def __init__(self, model: ModelSpec, plan: ParallelPlan, *,
                 domain_gpus: int | None = None) -> None:
        self.model = model
        self.plan = plan
        self.domain_gpus = domain_gpus
        self.layout = RankLayout(plan)
        self.schedule = get_schedule(plan.schedule)
        self.placement = self.schedule.placement(plan.pp, plan.vpp)
        #: layers of each of the model's pp * vpp chunks, and of each virtual stage (a
        #: stage runs one chunk; DualPipe's two routes run every chunk twice)
        self.chunk_layers = split_layers(model.num_layers, plan)
        self.stage_layers = tuple(self.chunk_layers[self.placement.chunk_of(s)]
                                  for s in range(self.placement.num_stages))
        self.num_stages = self.placement.num_stages
        #: pipeline ranks holding a copy of each rank's chunks (DualPipe: its mirror)
        self.chunk_copies = self.placement.num_stages // self.placement.num_chunks
        #: overlapped forward-backward pairs in the steady state
        self.overlap = bool(getattr(plan, "moe_a2a_overlap", False))
        # (RankLayout.stage_rank(p, like=0): rank 0's coordinates are all 0, so the
        # rank at pipeline position p is p pipeline strides)
        pp_stride = self.layout.strides["pp"]
        self.representatives = tuple(p * pp_stride for p in range(plan.pp))
        self.tokens = plan.micro_batch * plan.seq_len // plan.cp
        self.act_bytes = self.tokens * model.hidden_size * ELEMENT_BYTES["bf16"]
        # torchao float8 tensor parallelism gathers a column-parallel GEMM's input in
        # float8 (:meth:`_gathered_matmul`)
        self._fp8_tp_gather = plan.dtype == "fp8" and plan.fp8_recipe == "torchao"
        # Transformer Engine's userbuffers hold every all-gathered GEMM input in FP8 under an
        # FP8 recipe (MXFP8 with its scales, UB_FP8_GATHER_BYTES_PER_ELEMENT): the forward
        # inputs (qkv_fprop, fc1_fprop), the output gradients (proj_dgrad, fc2_dgrad) and
        # the inputs re-gathered for the weight
        # gradient (qkv_dgrad, fc1_dgrad bulk); the reduce-scatters stay bf16 unless a
        # config opts in (plan.tp_comm_fp8_reduce_scatter, :meth:`_reduced_matmul`;
        # transformer_engine/pytorch/module/base.py ``initialize_ub``:
        # "AllGather buffers use fp8 when using fp8 recipe", ``fp8_buf``; ``buffer_dtype =
        # torch.uint8 if (use_fp8 and fp8_buf)``, TE 1.x and 2.x)
        #: bytes a TP all-gather moves per bf16 byte (1: bf16, TE userbuffers in FP8: less)
        self._ub_gather_scale = (
            UB_FP8_GATHER_BYTES_PER_ELEMENT[plan.fp8_recipe] / ELEMENT_BYTES["bf16"]
            if plan.dtype == "fp8" and plan.tp_comm_overlap == "userbuffers"
            and plan.fp8_recipe in UB_FP8_GATHER_BYTES_PER_ELEMENT else 1.0)
        self.pp_message_bytes = pp_message_bytes(model, plan)
        #: Transformer Engine delayed scaling's amax all-reduce after each model chunk's
        #: forward and backward (:meth:`_amax_reduction`)
        self.reduces_amax = reduces_amax(plan)
        self._amax_gemms: dict[int, int] = {}
        self._ops: dict[tuple, ComputeOp] = {}
        #: recorded layer passes by rank, pass, tag stem and entry state (_replayed;
        #: None: the pass is emitted every time)
        self._templates: dict[tuple, _Template | None] = {}
        self._tag_stems: dict[str, str] = {}  # tag -> tag without ".mb<j>" (_emit_kernel)
        self._group_cache: dict[int, dict[str, tuple[int, ...]]] = {}
        self._scaled_kernels: dict[tuple[int, float], costs.Kernel] = {}
        # each layer's index in its virtual stage (recompute_of, only under
        # recompute_layers: built when first read)
        self._position_in_stage: dict[int, int] | None = None
        #: bytes per gradient element reduced over data parallelism
        self.grad_bytes = ELEMENT_BYTES[plan.grad_reduce_dtype]
        #: the fused attention kernel attention ops name ("": the GPU's default)
        self.attention_impl = "" if plan.attention_impl == "auto" else plan.attention_impl
        #: modules selective recompute re-runs (Megatron's default: the attention core)
        self.recompute_modules = frozenset(plan.recompute_modules or ("core_attn",))
        #: expert tensor parallelism, routing and the dispatcher's collectives per layer
        self.etp = self.layout.expert_tp
        self.routing = moe_dispatch.plan_routed_load(model, plan)
        self.dispatch, self.combine, self.dispatch_backward = self._dispatcher()
        #: routed experts per EP rank, and where the dropless dispatcher's host sync sits
        #: (:meth:`_host_sync`)
        moe = model.moe
        self.local_experts = moe.num_experts // plan.ep if moe is not None else 0
        padded = plan.moe_pad_to_capacity or (moe is not None and moe.capacity_factor > 0
                                              and not plan.moe_capacity_factor)
        capacity = moe is not None and (
            (plan.moe_capacity_factor not in ("", "dropless"))
            or (not plan.moe_capacity_factor and moe.capacity_factor > 0))
        syncs = moe is not None and plan.host_issue != "off" and not padded
        self.sync_before_permute = syncs and capacity
        self.sync_before_dispatch = syncs and not capacity and (plan.ep > 1 or self.local_experts > 1)

    def _dispatcher(self) -> tuple[tuple[moe_dispatch.Transfer, ...], ...]:
        """The MoE dispatch, the combine, and the dispatch's direction in bf16 (the
        combine's gradient going back to the experts); empty for a dense model."""
        moe, plan = self.model.moe, self.plan
        if moe is None:
            return (), (), ()
        tokens = self.tokens // plan.tp if plan.sequence_parallel else self.tokens
        shape = self._ep_shape()
        nodes = moe_dispatch.nodes_per_token(moe.num_experts, moe.top_k, shape.domains,
                                             moe.router_groups, moe.router_group_topk)
        common = dict(dispatcher=plan.moe_dispatcher, tokens=tokens, top_k=moe.top_k,
                      hidden=self.model.hidden_size, ep=plan.ep, etp=self.etp,
                      load=self.routing.rows_factor, shape=shape, nodes_per_token=nodes)
        dispatch = moe_dispatch.dispatch_transfers(fp8=plan.moe_dispatch_fp8, **common)
        return (dispatch, moe_dispatch.combine_transfers(dispatch, plan.moe_dispatch_fp8),
                moe_dispatch.dispatch_transfers(fp8=False, **common))

    def _ep_shape(self) -> moe_dispatch.EpShape:
        """How the first rank's EP group sits on NVLink domains (all groups alike)."""
        group = self.layout.ep_group(0)
        if not self.domain_gpus:
            return moe_dispatch.EpShape(1, len(group))
        domains = {r // self.domain_gpus for r in group}
        return moe_dispatch.EpShape(len(domains), len(group) // len(domains))

    def _groups(self, rank: int) -> dict[str, tuple[int, ...]]:
        """The groups (:data:`GROUP_NAMES`) of ``rank``, each computed when first asked
        for (a dense model's ops never ask for the expert groups, whose generator
        walks the whole data-parallel side)."""
        groups = self._group_cache.get(rank)
        if groups is None:
            groups = _LazyGroups(self, rank)
            self._group_cache[rank] = groups
        return groups

    # ------------------------------------------------------------------ kernels
    def _layer_kernels(self, kind: tuple[bool, int]) -> tuple[costs.Kernel, ...]:
        """Forward kernels of a layer of ``kind`` on one GPU, one tuple for every lowerer
        whose plan gives :func:`strategies.model_costs.layer_kernels` the same arguments
        (:data:`_SHARED_KERNELS`: the lowerers of a plan search's plans share them, and
        the ops :meth:`_emit_kernel` builds of them)."""
        plan, model = self.plan, self.model
        args = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp,
                    cp=plan.cp, ep=plan.ep, sequence_parallel=plan.sequence_parallel,
                    dtype=plan.dtype, flash_attention=plan.flash_attention,
                    dropout=model.dropout, fp8_recipe=plan.fp8_recipe,
                    elementwise=plan.elementwise, etp=self.etp,
                    expert_load=self.routing.rows_factor,
                    expert_bias_impl=plan.expert_bias_impl)
        # (the key is the call's own arguments, so it cannot miss one the call reads)
        key = ("layer", id(model), kind, *args.values())
        found = _SHARED_KERNELS.get(key)
        if found is not None:
            return found[1]
        layer = next(i for i in range(model.num_layers) if model.layer_kind(i) == kind)
        kernels = tuple(costs.layer_kernels(model, layer, **args))
        # (the model stored only to hold it alive: its id in the key stays its own)
        _bounded_put(_SHARED_KERNELS, _SHARED_KERNELS_MAX, key, (model, kernels))
        return kernels

    def kernels(self, layer: int) -> tuple[costs.Kernel, ...]:
        """Forward kernels of a layer on one GPU."""
        return self._layer_kernels(self.model.layer_kind(layer))

    def _edge_kernels(self, which: str) -> tuple[costs.Kernel, ...]:
        """Kernels of the ``embedding`` or the ``head`` (with the MTP modules) on one
        GPU, shared as :meth:`_layer_kernels`' are (keyed by the calls' arguments)."""
        plan, model = self.plan, self.model
        common = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len, tp=plan.tp, cp=plan.cp,
                      sequence_parallel=plan.sequence_parallel, dtype=plan.dtype)
        if which == "embedding":
            extra = dict(dropout=model.dropout)
        else:
            extra = dict(cross_entropy=plan.cross_entropy, elementwise=plan.elementwise,
                         ep=plan.ep, etp=self.etp, expert_load=self.routing.rows_factor)
        key = ("edge", id(model), which, *common.values(), *extra.values())
        found = _SHARED_KERNELS.get(key)
        if found is not None:
            return found[1]
        if which == "embedding":
            kernels = tuple(costs.embedding_kernels(model, **extra, **common))
        else:
            head = costs.head_kernels(model, cross_entropy=plan.cross_entropy,
                                      elementwise=plan.elementwise, **common)
            # the MTP modules run on the stage holding the head (Megatron-Core puts them there)
            kernels = tuple(head + costs.mtp_kernels(model, **extra, **common))
        # (the model stored only to hold it alive: its id in the key stays its own)
        _bounded_put(_SHARED_KERNELS, _SHARED_KERNELS_MAX, key, (model, kernels))
        return kernels

    # -------------------------------------------------------------- collectives
    @staticmethod
    def _key(b: _RankBuilder, name: str, group: Sequence[int]) -> str:
        """A key unique per collective instance and identical across its members:
        every member issues its n-th collective of a name and group in the same order."""
        base = f"{name}@{group[0]}"
        count = b.key_counts.get(base, 0)
        b.key_counts[base] = count + 1
        return f"{base}#{count}"

    def _collective(self, b: _RankBuilder, axis: str, kind: str, group: tuple[int, ...],
                    size: float, label: str, stream: str, deps: tuple[int, ...] = (),
                    dtype: str = "bf16", name: str | None = None) -> int:
        """Add a ``kind`` collective of ``size`` bytes of ``dtype`` over ``group`` on
        ``stream``, reported under ``axis`` and named ``<axis>.<kind>.<label>`` (or
        ``name``); its op index, or -1 when there is nothing to issue (a group of one,
        no bytes)."""
        if len(group) == 1 or size <= 0:
            return -1
        name = f"{axis}.{kind}.{label}" if name is None else name
        key = self._key(b, name, group)
        return b.add(CollectiveOp(name=name, key=key, kind=kind,
                                  group=group, size_bytes=int(size), stream=stream, deps=deps,
                                  dtype=dtype, axis=axis,
                                  host_launches=self._collective_host_launches(axis),
                                  host_issue=self._collective_host_issue(axis),
                                  # TE userbuffers / AsyncTP symmetric memory: not NCCL
                                  holds_sms=not (axis == "tp"
                                                 and self.plan.tp_comm_overlap in PIPELINED_TP)))

    def _collective_host_launches(self, axis: str) -> int:
        """CPU launches of one collective: an NCCL kernel issued from Python (1), or none
        when the host is not modelled or the whole layer is a CUDA graph; under partial
        graphs the TP/CP collectives inside the captured attention are replayed."""
        mode = self.plan.host_issue
        if mode in HOST_FREE_MODES or (mode == "partial" and axis in ("tp", "cp")):
            return 0
        return 1

    def _collective_host_issue(self, axis: str) -> str:
        """How the CPU issues one collective (:func:`collective_host_issue`)."""
        return collective_host_issue(axis, self.plan.host_issue)

    def _deps_after(self, b: _RankBuilder, *extra: int | None) -> tuple[int, ...]:
        return tuple(sorted({d for d in extra if d is not None and d >= 0}))

    # ------------------------------------------------------------- FP8 amaxes
    def amax_in(self, comp: str) -> bool:
        """Whether phase ``comp`` (F, B, I, W) of a model chunk ends with Transformer
        Engine's amax all-reduce (:meth:`_amax_reduction`): the forward and the input-gradient
        backward (B, I) under delayed scaling; never the weight-gradient W."""
        return self.reduces_amax and comp in ("F", "B", "I")

    def amax_bytes(self, p: int, comp: str) -> int:
        """Bytes of pipeline rank ``p``'s amax all-reduce in phase ``comp``: one fp32
        amax per FP8 tensor of every TE module on the rank (:data:`AMAX_PER_GEMM` per
        GEMM; a grouped expert GEMM is one GEMM per local expert). TE keys its global
        amax buffer by recipe and group, not by autocast region
        (``FP8GlobalStateManager.add_fp8_tensors_to_global_buffer``,
        ``get_key_in_buffer``), so every region exit reduces the amaxes of all the
        rank's model chunks (with ``vpp`` > 1, all its virtual stages' layers)."""
        gemms = self._amax_gemms.get(p)
        if gemms is None:
            gemms = self._amax_gemms[p] = sum(self.layer_amax_gemms(layer)
                                              for layer in self.rank_layers(p))
        return amax_reduction_bytes(gemms, comp)

    def layer_amax_gemms(self, layer: int) -> int:
        """FP8 GEMMs of a layer whose amaxes TE's delayed scaling keeps (one per FP8
        matmul kernel; a grouped expert GEMM counts once per local expert: its
        ``shape[0]``); the same for every layer of one kind."""
        return sum(kernel.shape[0] for kernel in self.kernels(layer)
                   if kernel.kind == "matmul" and kernel.dtype == "fp8")

    def _amax_reduction(self, b: _RankBuilder, p: int, comp: str) -> None:
        """Transformer Engine delayed scaling's amax all-reduce at the end of a model
        chunk's ``comp`` (:meth:`amax_in`) on pipeline rank ``p`` (none over a group of
        one, :func:`reduces_amax`).

        Megatron-Core runs each ``TransformerBlock.forward`` (one model chunk, one
        micro-batch) inside one ``fp8_autocast`` region under delayed scaling
        (megatron/core/transformer/transformer_block.py, megatron/core/fp8_utils.py
        ``get_fp8_context``: ``fp8_group = parallel_state.get_amax_reduction_group(
        with_context_parallel=True, tp_only_amax_red=config.tp_only_amax_red)``). TE
        reduces at the region's outermost exit (transformer_engine/pytorch/fp8.py
        ``fp8_autocast_exit`` -> ``reduce_and_update_fp8_tensors(forward=True)``; TE 2.x
        quantization.py ``autocast_exit``, still for delayed scaling only: the other
        recipes' global amax buffer is empty) and at the end of the region's backward
        (the first FP8 module's backward, ``reduce_and_update_fp8_tensors(forward=
        False)``), each a ``torch.distributed.all_reduce(op=MAX, async_op=False)`` of
        the concatenated fp32 amaxes on the current (compute) stream
        (``reduce_tensor_across_group_op_max``): the compute stream waits for it. Its
        exposed time is reported under ``dp`` (the group spans the data-parallel
        replicas: what grows with the job), the op named ``amax.all_reduce.*``."""
        if self.amax_in(comp):
            self._collective(b, "dp", "all_reduce", b.groups["amax"],
                             self.amax_bytes(p, comp), "", COMPUTE, dtype="fp32",
                             name=f"amax.all_reduce.{'fwd' if comp == 'F' else 'bwd'}")

    # ----------------------------------------------------------------- forward
    def _tp_boundary(self, b: _RankBuilder, label: str, entering: bool, backward: bool) -> None:
        """TP communication at a block boundary (Megatron's f/g operators)."""
        plan = self.plan
        if plan.tp == 1:
            return
        if plan.sequence_parallel:
            # forward: all-gather in, reduce-scatter out; the backward swaps them
            kind = "all_gather" if entering != backward else "reduce_scatter"
            self._collective(b, "tp", kind, b.groups["tp"], self.act_bytes, label, COMPUTE)
        elif entering == backward:  # fwd: all-reduce after the block; bwd: at its input
            self._collective(b, "tp", "all_reduce", b.groups["tp"], self.act_bytes, label,
                             COMPUTE)

    def _stem(self, tag: str) -> str:
        """``tag`` without its micro-batch (``.mb<j>``), computed once per tag (a step
        emits tens of thousands of ops under a few hundred tags)."""
        stem = self._tag_stems.get(tag)
        if stem is None:
            stem = self._tag_stems[tag] = _MICROBATCH.sub('', tag)
        return stem

    def _replayed(self, b: _RankBuilder, what: tuple, tag: str,
                  emit: Callable[[], None]) -> None:
        """Append one layer pass (``what``, under ``tag``) to ``b``: ``emit()`` the first
        time, then the recorded ops (:class:`_Template`) for the other micro-batches.

        A pass depends on its micro-batch only through ``tag``, which only collectives'
        names hold (compute ops are named by the tag's stem, :meth:`_emit_kernel`), and on
        what came before it only through the builder's last compute op and pending waits,
        which it references as deps (never compares): with as many of those, in the same
        order, its ops are the recorded ones with every index mapped and the tag replaced
        in the names (keys drawn anew, :meth:`_key`, as each member issues them in the same
        order). A recording that cannot be replayed so (:func:`_record_template`) leaves
        the pass emitted every time."""
        last = b.last()
        waits = b.pending_waits()
        entry = tuple(sorted({*waits, last})) if last is not None else waits
        key = (b.rank, what, self._stem(tag), len(waits),
               None if last is None else entry.index(last), len(entry))
        template = self._templates.get(key, False)
        if template is False:
            base = len(b.ops)
            emit()
            self._templates[key] = _record_template(b, base, entry, tag)
        elif template is None:
            emit()
        else:
            self._replay(b, template, entry, tag)

    def _replay(self, b: _RankBuilder, template: _Template, entry: tuple[int, ...],
                tag: str) -> None:
        """Append ``template``'s ops to ``b`` for ``tag``, its entry references to
        ``entry``."""
        recorded = template.tag
        ops = b.ops
        base = len(ops)
        for op, deps, make in template.ops:
            if deps is None:
                ops.append(op)
                continue
            deps = tuple(base + d if d >= 0 else entry[-1 - d] for d in deps)
            if isinstance(op, CollectiveOp):
                name = op.name.replace(recorded, tag)
                ops.append(make(op, name, self._key(b, name, op.group), deps))
            else:
                ops.append(make(op, deps))
        b.replayed({stream: base + index for stream, index in template.last_on},
                   {base + d if d >= 0 else entry[-1 - d] for d in template.waits})

    def _emit_kernel(self, b: _RankBuilder, kernel: costs.Kernel, tag: str, phase: str,
                     deps: tuple[int, ...] = (), comm_sms: int = 0) -> int:
        """Append one kernel's work for ``phase`` (F, B, I or W); ``comm_sms``: SMs a
        communication kernel running beside it holds.

        Compute ops are named without their micro-batch and shared between
        micro-batches (a step repeats the same kernels thousands of times).
        """
        # (the kernel's identity fixes its name, so the key need not hold the op's name)
        stem = self._stem(tag)
        key = (id(kernel), stem, phase, deps, comm_sms)
        op = self._ops.get(key)
        if op is None:
            # (the same op for every lowerer that emits this kernel object -- shared by
            # _layer_kernels / _edge_kernels -- with the same lowerer fields it reads)
            plan = self.plan
            shared_key = (key, self.attention_impl, plan.host_issue, self.local_experts,
                          plan.layer_impl)
            found = _SHARED_OPS.get(shared_key)
            if found is not None:
                op = found[1]
            else:
                name = f"{kernel.name}.{stem}"
                host = (kernel, phase, plan.host_issue, self.local_experts)
                op = compute_op(kernel, name, phase, attention_impl=self.attention_impl,
                                deps=deps, comm_sms=comm_sms,
                                host_launches=host_launches(*host),
                                host_calls=host_calls(*host),
                                host_modules=host_modules(*host, layer_impl=plan.layer_impl),
                                host_issue=kernel_host_issue(kernel, plan.host_issue))
                # (the kernel stored only to hold it alive: its id in the key stays its own)
                _bounded_put(_SHARED_OPS, _SHARED_OPS_MAX, shared_key, (kernel, op))
            self._ops[key] = op
        return b.add(op)

    def _host_sync(self, b: _RankBuilder, tag: str) -> None:
        """Megatron-Core's dropless dispatcher copies the tokens per expert to the host
        and synchronises (``MoEAlltoAllTokenDispatcher.preprocess``: ``cuda_sync_point``
        ``before_ep_alltoall`` dropless, ``before_permutation_1`` with a capacity but no
        padding; none with ``--moe-pad-expert-input-to-capacity``, whose shapes are
        static; megatron/core/transformer/moe/token_dispatcher.py), so the all-to-all
        splits and the grouped GEMM's ``m_splits`` are host lists: the CPU drains the GPU
        queue once per MoE layer forward. Emitted only when the host is modelled."""
        if self.plan.host_issue == "off" or self.model.moe is None:
            return
        op = self._ops.get(("host_sync", tag))
        if op is None:
            # int64 counts of every expert, device to host; on the CPU, the preprocess
            # that computes and copies the splits (dispatch_preprocess_host)
            launches, calls = dispatch_preprocess_host(self.plan.host_issue, self.plan.ep,
                                                       self.plan.moe_dispatcher)
            op = ComputeOp(name=f"moe.sync.{self._stem(tag)}", kind="memcpy",
                           bytes=8.0 * self.model.moe.num_experts, stream=COMPUTE, phase="F",
                           host_launches=launches, host_calls=calls, host_sync=True)
            self._ops[("host_sync", tag)] = op
        b.add(op)

    def _carry_copy(self, b: _RankBuilder, layer: int, what: str, phase: str) -> None:
        """With ``plan.xla_scan_carry_copies``, the device-to-device copy of one loop-carried
        buffer of a scanned layer on the compute stream (``what``: ``params``, the layer's
        gathered parameters, which the pipelined all-gather of the previous iteration
        wrote; ``grads``, its unreduced gradients, which the next iteration's pipelined
        reduce-scatter reads): copy insertion's copy of a while loop's carried value that
        the body reads while a collective writes it (xla/service/copy_insertion.cc
        ``AddCopiesForWhile``; what while-loop double buffering removes, openxla/xla
        PR #5473). A memcpy kernel reading and writing the buffer once each."""
        if not self.plan.xla_scan_carry_copies:
            return
        key = ("carry_copy", layer, what, phase)
        op = self._ops.get(key)
        if op is None:
            params = sum(k.params for k in self.kernels(layer))
            size = params * (PARAM_BYTES if what == "params" else self.grad_bytes)
            op = ComputeOp(name=f"scan.copy.{what}.l{layer}.{phase}", kind="memcpy",
                           bytes=2.0 * size, shape=(int(params),),
                           dtype="bf16" if what == "params" else self.plan.grad_reduce_dtype,
                           stream=COMPUTE, phase=phase)
            self._ops[key] = op
        b.add(op)

    def _layer_forward(self, b: _RankBuilder, layer: int, tag: str,
                       modules: frozenset[str] | None = None, early_stop: bool = False) -> None:
        """The forward of ``layer``; with ``modules``, only what selective recompute of
        those modules re-runs (:func:`recomputed`); with ``early_stop``, a full recompute
        that ends where PyTorch's checkpoint early stop ends it (:func:`early_stop_end`).
        Replayed for every micro-batch after the first (:meth:`_replayed`)."""
        self._replayed(b, ("F", layer, modules, early_stop), tag,
                       lambda: self._emit_layer_forward(b, layer, tag, modules, early_stop))

    def _emit_layer_forward(self, b: _RankBuilder, layer: int, tag: str,
                            modules: frozenset[str] | None, early_stop: bool) -> None:
        """:meth:`_layer_forward`'s ops, built kernel by kernel."""
        if modules is not None and "op_sac" in modules:
            self._op_sac_recompute(b, layer, tag)
            return
        jax_policy = costs.jax_remat_policy(modules)
        if jax_policy is not None:
            self._jax_remat_recompute(b, layer, tag, jax_policy)
            return
        blocks = _blocks(self.kernels(layer))
        for position, (block, members) in enumerate(blocks):
            end = len(members)
            if early_stop and position == len(blocks) - 1:
                end = early_stop_end(block, members, dropout=self.model.dropout,
                                     aten_matmul=(self.plan.layer_impl == "torch"
                                                  and "fp8" not in self.plan.dtype))
            if modules is not None:
                members, whole = recomputed(block, members, modules)
                if not whole:
                    for kernel in members:
                        if kernel.kind == "attention" and self.plan.cp > 1:
                            # the recomputed core runs the ring again (TE re-runs the
                            # checkpointed DotProductAttention forward)
                            self._ring_attention(b, kernel, f"{tag}.l{layer}", "F")
                        else:
                            self._emit_kernel(b, kernel, f"{tag}.l{layer}", "F")
                    continue
            label = f"l{layer}.{block}.{tag}"
            if block == "moe":
                self._moe_forward(b, layer, members, tag, label)
                continue
            column, row = self._tp_matmuls(block, members)
            if column is None:
                self._tp_boundary(b, label, entering=True, backward=False)
            for index, kernel in enumerate(members[:end]):
                if kernel.kind == "attention" and self.plan.cp > 1:
                    self._ring_attention(b, kernel, f"{tag}.l{layer}", "F")
                    continue
                if index == column:
                    self._gathered_matmul(b, kernel, f"{tag}.l{layer}", label, "F")
                elif index == row:
                    self._reduced_matmul(b, kernel, f"{tag}.l{layer}", label)
                else:
                    self._emit_kernel(b, kernel, f"{tag}.l{layer}", "F")
            if column is None:
                self._tp_boundary(b, label, entering=False, backward=False)

    # --------------------------------------------------------------------- MoE
    def _shared_matmuls(self, members: Sequence[costs.Kernel]) -> tuple[int | None, int | None]:
        """The shared experts' first and last GEMM (a dense TP MLP inside the MoE block,
        Megatron-Core's SharedExpertMLP: column- and row-parallel); (None, None) without
        shared experts or TP."""
        matmuls = [i for i, k in enumerate(members)
                   if k.name.startswith("moe.shared.") and k.kind == "matmul"]
        if self.plan.tp == 1 or len(matmuls) < 2:
            return None, None
        return matmuls[0], matmuls[-1]

    def _moe_forward(self, b: _RankBuilder, layer: int, members: Sequence[costs.Kernel],
                     tag: str, label: str) -> None:
        """An MoE block's forward as Megatron-Core's MoELayer runs it: the router on the
        rank's sequence shard, the shared experts (TP-gathered input, reduce-scattered
        output), permute, the dispatch (:mod:`strategies.moe_dispatch`), the experts, the
        combine, unpermute."""
        first, last = self._shared_matmuls(members)
        where = f"{tag}.l{layer}"
        for index, kernel in enumerate(members):
            if kernel.name == "moe.unpermute":
                self._expert_comm(b, self.combine, f"l{layer}.combine.{tag}")
            if index == first:
                self._gathered_matmul(b, kernel, where, f"{label}.shared", "F")
            elif index == last:
                self._reduced_matmul(b, kernel, where, f"{label}.shared")
            else:
                self._emit_kernel(b, kernel, where, "F")
            if kernel.name == "moe.route" and self.sync_before_permute:
                self._host_sync(b, where)
            if kernel.name == "moe.permute":
                if self.sync_before_dispatch:
                    self._host_sync(b, where)
                self._expert_comm(b, self.dispatch, f"l{layer}.dispatch.{tag}")

    def _moe_backward(self, b: _RankBuilder, layer: int, members: Sequence[costs.Kernel],
                      tag: str, phase: str, label: str) -> None:
        """An MoE block's backward (B, I) or weight pass (W), in reverse: the gradients
        take the combine's way back to the experts (in bf16) and the dispatch's way back
        to the tokens; the weight pass communicates only for the shared experts."""
        first, last = self._shared_matmuls(members)
        where = f"{tag}.l{layer}"
        for index in reversed(range(len(members))):
            kernel = members[index]
            if phase == "W" and kernel.bwd_weight_flops <= 0 and kernel.bwd_weight_bytes <= 0:
                continue
            if kernel.name == "moe.permute" and phase != "W":
                self._expert_comm(b, self.combine, f"l{layer}.dispatch.{tag}")
            if index == last:
                self._row_backward(b, kernel, where, f"{label}.shared", phase)
            elif index == first:
                self._column_backward(b, kernel, where, f"{label}.shared", phase)
            else:
                self._emit_kernel(b, kernel, where, phase)
            if kernel.name == "moe.unpermute" and phase != "W":
                self._expert_comm(b, self.dispatch_backward, f"l{layer}.combine.{tag}")

    def _expert_comm(self, b: _RankBuilder, transfers: Sequence[moe_dispatch.Transfer],
                     label: str) -> None:
        """Issue the dispatcher's collectives on the compute stream (the layer waits for
        them); a transfer followed by one ``beside`` it runs on a side stream at the same
        time, and the layer waits for both (DeepEP's network and NVLink halves)."""
        side = None
        for position, transfer in enumerate(transfers):
            following = transfers[position + 1] if position + 1 < len(transfers) else None
            stream = (f"{EP_STREAM}.{transfer.group}" if following is not None
                      and following.beside else COMPUTE)
            index = self._collective(b, "ep", transfer.kind, b.groups[transfer.group],
                                     transfer.size_bytes,
                                     f"{label}.{transfer.kind}.{transfer.group}", stream,
                                     self._deps_after(b, b.last()) if stream != COMPUTE else ())
            if stream != COMPUTE:
                side = index
            elif side is not None:
                b.wait(side)
                side = None
        if side is not None:
            b.wait(side)

    def _op_sac_recompute(self, b: _RankBuilder, layer: int, tag: str) -> None:
        """What torchtitan's per-op selective checkpointing re-runs of ``layer``: each
        kernel's share from :func:`strategies.model_costs.op_sac_recompute_fractions`."""
        kernels = self.kernels(layer)
        for kernel, share in zip(kernels, costs.op_sac_recompute_fractions(kernels, self.model)):
            if share > 0:
                piece = kernel if share == 1 else self._scaled(kernel, share)
                self._emit_kernel(b, piece, f"{tag}.l{layer}", "F")

    def _jax_remat_recompute(self, b: _RankBuilder, layer: int, tag: str, policy: str) -> None:
        """What the backward of a ``jax.checkpoint``-ed ``layer`` re-runs under the JAX
        remat ``policy``: the kernels :func:`strategies.model_costs.
        jax_remat_recompute_fractions` marks."""
        kernels = self.kernels(layer)
        for kernel, share in zip(kernels, costs.jax_remat_recompute_fractions(
                kernels, self.model, policy)):
            if share > 0:
                self._emit_kernel(b, kernel, f"{tag}.l{layer}", "F")

    # ------------------------------------------------------------ TP and GEMMs
    def _tp_matmuls(self, block: str, members: Sequence[costs.Kernel]
                    ) -> tuple[int | None, int | None]:
        """Where a dense block's TP communication meets its GEMMs (Megatron-LM's
        ColumnParallelLinear / RowParallelLinear): the indices of the column-parallel
        GEMM (QKV, FC1: its input is all-gathered over TP under sequence parallelism)
        and the row-parallel one (out, FC2: its output reduce-scattered, or all-reduced
        without sequence parallelism); (None, None) without TP."""
        if self.plan.tp == 1:
            return None, None
        # MLA's down projections are replicated over TP: the up projections gather
        matmuls = [i for i, k in enumerate(members) if k.kind == "matmul"
                   and not k.name.endswith("_down")]
        if len(matmuls) < 2:
            return None, None
        return matmuls[0], matmuls[-1]

    def _scaled(self, kernel: costs.Kernel, factor: float) -> costs.Kernel:
        """:func:`_scaled` of ``kernel``, one object per (kernel, factor), so the ops
        built from it are shared between micro-batches like the whole kernels'."""
        key = (id(kernel), factor)
        found = self._scaled_kernels.get(key)
        if found is None:
            found = _scaled(kernel, factor)
            self._scaled_kernels[key] = found
        return found

    def _tp_collective(self, b: _RankBuilder, kind: str, size: float, label: str,
                       stream: str = COMPUTE, deps: tuple[int, ...] = ()) -> int:
        return self._collective(b, "tp", kind, b.groups["tp"], size, label, stream, deps)

    def _gathered_matmul(self, b: _RankBuilder, kernel: costs.Kernel, tag: str, label: str,
                         phase: str) -> None:
        """A GEMM whose input is first all-gathered over TP (the forward of a
        column-parallel GEMM, the input-gradient part of a row-parallel one under
        sequence parallelism). With ``tp_comm_overlap = "userbuffers"``
        (Transformer Engine's ring exchange, TE ``ring_exchange`` method), the GEMM
        runs in ``tp`` chunks: chunk 0 on the local shard at once, chunk ``c`` after the
        ring's step ``c - 1`` brought the next shard (a send/recv of ``1/tp`` of the
        activations on the copy engines, no SMs taken from the GEMM; PyTorch AsyncTP's
        ``fused_all_gather_matmul`` does the same: torch/distributed/_symmetric_memory
        ``_pipelined_all_gather_and_consume`` copies each peer's shard and multiplies
        it as it lands); otherwise the all-gather blocks the compute stream first."""
        plan = self.plan
        size = self._tp_input_bytes(kernel)
        if phase == "F" and self._fp8_tp_gather:
            # torchao Float8ColwiseParallel / PrepareFloat8ModuleInput (torchtitan's
            # apply_tp with float8, torchao/float8/float8_tensor_parallel.py): the input
            # is cast to float8 before the all-gather, which moves 1 byte per element
            size *= ELEMENT_BYTES["fp8"] / ELEMENT_BYTES["bf16"]
        # TE userbuffers gather FP8 inputs and output gradients alike (__init__)
        size *= self._ub_gather_scale
        if not plan.sequence_parallel:
            self._emit_kernel(b, kernel, tag, phase)
            return
        if plan.tp_comm_overlap not in PIPELINED_TP:
            self._tp_collective(b, "all_gather", size, label)
            self._emit_kernel(b, kernel, tag, phase)
            return
        chunk = self._scaled(kernel, 1.0 / plan.tp)
        ready = self._deps_after(b, b.last())
        previous = None
        for step in range(plan.tp):
            if step < plan.tp - 1:  # the ring's next shard moves while this chunk computes
                previous_exchange = self._tp_collective(
                    b, "sendrecv", size / plan.tp, f"{label}.ring{step}", "tp",
                    ready if step == 0 else ())
            else:
                previous_exchange = None
            self._emit_kernel(b, chunk, f"{tag}.ring{step}", phase, self._deps_after(b, previous))
            previous = previous_exchange

    def _tp_input_bytes(self, kernel: costs.Kernel) -> float:
        """Bytes a column-parallel GEMM's TP all-gather moves (and its input gradient's
        reduce-scatter): the hidden states, or for MLA's up projections the latents
        (Megatron-Core gathers the down-projected latents, not the hidden states)."""
        if self.model.mla is not None and kernel.name in ("attn.q_up", "attn.q"):
            width = costs.mla_latent_width(self.model)
            return self.tokens * width * ELEMENT_BYTES["bf16"]
        return self.act_bytes

    def _reduced_matmul(self, b: _RankBuilder, kernel: costs.Kernel, tag: str,
                        label: str) -> None:
        """The forward of a row-parallel GEMM and the reduction of its output over TP:
        a reduce-scatter under sequence parallelism (all-reduce without), blocking the
        compute stream; with ``tp_comm_overlap = "userbuffers"`` (TE's ``pipeline``
        method) the GEMM runs in :data:`UB_PIPELINE_SPLITS` chunks, each chunk's
        reduce-scatter on the TP stream while the next chunk computes on the SMs the
        communication kernel leaves (:data:`UB_PIPELINE_COMM_SMS`)."""
        plan = self.plan
        if not (plan.sequence_parallel and plan.tp_comm_overlap in PIPELINED_TP):
            self._emit_kernel(b, kernel, tag, "F")
            self._tp_collective(b, "reduce_scatter" if plan.sequence_parallel else "all_reduce",
                                self.act_bytes, label)
            return
        if plan.tp_comm_overlap == "symmetric_memory":
            # PyTorch AsyncTP's fused_matmul_reduce_scatter
            # (torch/distributed/_symmetric_memory _pipelined_produce_and_all2all): one
            # GEMM chunk per destination rank, each copied to its peer by the copy
            # engine while the next computes (no SMs held)
            splits, comm_sms = plan.tp, 0
        else:
            splits, comm_sms = UB_PIPELINE_SPLITS, UB_PIPELINE_COMM_SMS
        size = self.act_bytes
        # proj_fprop is the attention out-projection's reduce-scatter, fc2_fprop the MLP's
        # (and the shared experts', Megatron-Core's SharedExpertMLP being an MLP whose
        # linear_fc2 names the "fc2" buffer); a config's fp8_buf gives it an FP8 buffer the
        # GEMM writes in FP8 (ParallelPlan.tp_comm_fp8_reduce_scatter)
        buffer = "proj_fprop" if kernel.block == "attention" else "fc2_fprop"
        if buffer in plan.tp_comm_fp8_reduce_scatter:
            size *= ELEMENT_BYTES["fp8"] / ELEMENT_BYTES["bf16"]
        chunk = self._scaled(kernel, 1.0 / splits)
        last = None
        for split in range(splits):
            done = self._emit_kernel(b, chunk, f"{tag}.split{split}", "F", comm_sms=comm_sms)
            last = self._tp_collective(b, "reduce_scatter", size / splits,
                                       f"{label}.split{split}", "tp", (done,))
        b.wait(last)

    def recompute_of(self, layer: int) -> str:
        """How layer ``layer`` is recomputed in the backward: the plan's mode, except
        that ``recompute = "full"`` with ``recompute_layers = N > 0`` recomputes only
        the first N layers of each virtual stage and keeps the others' activations
        (Megatron-LM's ``--recompute-method block --recompute-num-layers N``)."""
        plan = self.plan
        if plan.recompute != "full" or plan.recompute_layers == 0:
            return plan.recompute
        if self._position_in_stage is None:
            self._position_in_stage = {layer: i for layers in self.stage_layers
                                       for i, layer in enumerate(layers)}
        return "full" if self._position_in_stage[layer] < plan.recompute_layers else "none"

    def _recompute(self, b: _RankBuilder, layer: int, tag: str) -> None:
        """Re-run what the backward of ``layer`` needs and did not keep (under
        ``plan.recompute_early_stop``, up to :func:`early_stop_end` of its last block)."""
        mode = self.recompute_of(layer)
        if mode == "full":
            self._layer_forward(b, layer, f"recompute.{tag}",
                                early_stop=self.plan.recompute_early_stop)
        elif mode == "selective":
            self._layer_forward(b, layer, f"recompute.{tag}", modules=self.recompute_modules)

    def _per_kernel(self, kernel: costs.Kernel, build):
        """``build(kernel, cp, d_v=...)`` of ``kernel``, one object per kernel and builder
        (the ops built from them are shared between micro-batches)."""
        key = (id(kernel), build.__name__)
        found = self._scaled_kernels.get(key)
        if found is None:
            found = build(kernel, self.plan.cp, d_v=self.model.v_head_dim)
            self._scaled_kernels[key] = found
        return found

    def _ring_steps(self, kernel: costs.Kernel
                    ) -> tuple[tuple[costs.Kernel, ...], tuple[costs.Kernel, ...]]:
        """:func:`strategies.model_costs.ring_attention_steps` of ``kernel``."""
        return self._per_kernel(kernel, costs.ring_attention_steps)

    def _kv_block_bytes(self, kernel: costs.Kernel) -> float:
        """Bytes of one rank's K/V block (bf16 ``b*(s/c)*g_l*(d_qk + d_v)``): what a ring
        step sends, and the size of its dK/dV."""
        b_, _, kv_heads, s_q, _, d_qk = kernel.shape
        return b_ * s_q * kv_heads * (d_qk + self.model.v_head_dim) * ELEMENT_BYTES["bf16"]

    def _ring_attention(self, b: _RankBuilder, kernel: costs.Kernel, tag: str,
                        phase: str) -> None:
        """Context-parallel attention as Transformer Engine runs it
        (``AttnFuncWithCPAndKVP2P``, TransformerEngine
        ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``).

        Forward: ``cp`` steps (:func:`strategies.model_costs.ring_attention_steps`); step
        ``i`` first issues the exchange that brings the K/V block of step ``i+1`` (after
        the previous exchange: the host waits for it), then computes on the block the
        previous exchange brought, then merges its output. Backward: step ``i`` sends
        the K/V block it works on together with the dK/dV accumulated so far (step 0
        the K/V alone, the last step the dK/dV alone: ``send_tensor[0]``/``[1]``, bf16
        like K/V), which it may only do once step ``i-1``'s gradients are accumulated,
        and accumulates its own gradients once the exchange has delivered the dK/dV they
        add to -- so backward steps run one after another, each ``max(compute,
        exchange)`` long. Sliding-window layers use TE's all-gather variant (the P2P ring
        does not support a window, ``AttnFuncWithCPAndKVAllGather``), and so does every
        layer with ``cp_comm_type = "all_gather"`` (Megatron-Core ``--cp-comm-type
        allgather``; Meta's Llama 3 CP, arXiv 2407.21783 Section 3.3.2): the whole K/V
        all-gathered before the kernel in the forward and again in the backward, dK/dV
        reduce-scattered after the backward's kernel, all on the critical path.
        """
        if self.plan.cp_comm_type in ("torch_allgather", "torch_alltoall"):
            self._torch_ring_attention(b, kernel, tag, phase)
            return
        cp = self.plan.cp
        kv_bytes = self._kv_block_bytes(kernel)
        group = b.groups['cp']
        start = b.last()
        # ops the compute stream still waits for (a ZeRO-3 parameter gather before a
        # selective recompute that starts with this attention): the exchanges wait for
        # them too, as ProcessGroupNCCL makes its stream wait for the current stream
        # (which waits for the gather) when an op is issued (PyTorch
        # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, syncStream)
        waits = b.pending_waits()
        if kernel.window or self.plan.cp_comm_type == "all_gather":
            # AttnFuncWithCPAndKVAllGather: the forward and the backward each all-gather
            # K/V (the backward gathers again from the local K/V it saved) before the
            # kernel; the backward reduce-scatters dK/dV after it
            gather = self._collective(b, "cp", "all_gather", group, kv_bytes * cp,
                                      f"{tag}.{phase}.kv", "cp",
                                      self._deps_after(b, start, *waits))
            self._emit_kernel(b, kernel, tag, phase, self._deps_after(b, gather))
            if phase == "F":
                return
            reduce = self._collective(b, "cp", "reduce_scatter", group, kv_bytes * cp,
                                      f"{tag}.{phase}.dkv", "cp", self._deps_after(b, b.last()))
            b.wait(reduce)
            return
        steps, merges = self._ring_steps(kernel)
        exchange = None
        merged = start
        for step in range(cp):
            if phase == "F":
                following = None
                if step < cp - 1:
                    following = self._collective(b, "cp", "sendrecv", group, kv_bytes,
                                                 f"{tag}.{phase}.kv{step}", "cp",
                                                 self._deps_after(b, start, *waits))
                self._emit_kernel(b, steps[step], tag, phase, self._deps_after(b, exchange))
                self._emit_kernel(b, merges[step], tag, phase)
                exchange = following
                continue
            size = kv_bytes if step in (0, cp - 1) else 2 * kv_bytes
            label = "kv" if step == 0 else "dkv" if step == cp - 1 else "kv_dkv"
            following = self._collective(b, "cp", "sendrecv", group, size,
                                         f"{tag}.{phase}.{label}{step}", "cp",
                                         self._deps_after(b, merged, exchange, *waits))
            self._emit_kernel(b, steps[step], tag, phase, self._deps_after(b, exchange))
            merged = self._emit_kernel(b, merges[step], tag, phase,
                                       self._deps_after(b, following))
            exchange = following

    def _torch_ring_kernels(self, kernel: costs.Kernel) -> costs.TorchRingKernels:
        """:func:`strategies.model_costs.torch_ring_attention_kernels` of ``kernel``."""
        return self._per_kernel(kernel, costs.torch_ring_attention_kernels)

    def _torch_ring_attention(self, b: _RankBuilder, kernel: costs.Kernel, tag: str,
                              phase: str) -> None:
        """Context-parallel attention as PyTorch's ``context_parallel`` runs it
        (``torch/distributed/tensor/experimental/_attention.py``,
        ``_templated_ring_attention`` and ``_templated_ring_attention_backward``), the
        SDPA steps of :func:`strategies.model_costs.ring_attention_steps` and the eager
        kernels of :func:`strategies.model_costs.torch_ring_attention_kernels`.

        Forward: step ``i`` waits for its K/V, packs the K/V it holds (``torch.cat``)
        and hands it to the rotater unless it is the last step, runs SDPA and merges in
        fp32. The ``torch_allgather`` rotater (``_AllGatherRotater``, PyTorch's default
        ``rotate_method``) all-gathers every rank's K/V once, at step 0, and step 1 waits
        for all of it; ``torch_alltoall`` (``_AllToAllRotater``) permutes the block to
        the next rank each step, sent once the block it forwards has arrived. Backward:
        the K/V move the same way (a fresh rotater); after each step's SDPA backward the
        step waits for the dK/dV the previous step sent, accumulates its own in fp32 and
        sends them on (``dkv_rotater``, always ``ALL_TO_ALL``, fp32), ``cp`` sends in
        all; the gradients are cast back once the last has arrived.
        """
        cp = self.plan.cp
        if kernel.window:
            raise ValueError(f"cp_comm_type: {self.plan.cp_comm_type!r} is not valid for "
                             "sliding-window attention (PyTorch context_parallel runs SDPA "
                             "causal only); valid: p2p")
        steps, _ = self._ring_steps(kernel)
        ring = self._torch_ring_kernels(kernel)
        group = b.groups['cp']
        gather = self.plan.cp_comm_type == "torch_allgather"
        exchange = None    # brings this step's K/V (none at step 0)
        gathered = None
        grads = None       # brings the dK/dV the previous backward step sent
        for step in range(cp):
            arrived = exchange
            following = None
            if step < cp - 1:
                packed = self._emit_kernel(b, ring.pack_first if step == 0 else ring.pack,
                                           tag, phase, self._deps_after(b, arrived))
                if not gather:
                    following = self._collective(b, "cp", "sendrecv", group, ring.kv_bytes,
                                                 f"{tag}.{phase}.kv{step}", "cp",
                                                 self._deps_after(b, packed))
                elif gathered is None:
                    gathered = self._collective(b, "cp", "all_gather", group,
                                                ring.kv_bytes * cp, f"{tag}.{phase}.kv", "cp",
                                                self._deps_after(b, packed))
            if gather:
                following = gathered
            self._emit_kernel(b, steps[step], tag, phase, self._deps_after(b, arrived))
            merge = ring.merge_first if step == 0 else ring.merge
            if phase == "F":
                self._emit_kernel(b, merge, tag, phase)
            else:
                merged = self._emit_kernel(b, merge, tag, phase, self._deps_after(b, grads))
                grads = self._collective(b, "cp", "sendrecv", group, ring.grad_kv_bytes,
                                         f"{tag}.{phase}.dkv{step}", "cp",
                                         self._deps_after(b, merged))
            exchange = following
        self._emit_kernel(b, ring.finish, tag, phase, self._deps_after(b, grads))

    # ---------------------------------------------------------------- backward
    def _layer_backward(self, b: _RankBuilder, layer: int, tag: str, phase: str) -> None:
        """The backward (``phase`` B or I) or weight pass (W) of ``layer``, replayed for
        every micro-batch after the first (:meth:`_replayed`)."""
        self._replayed(b, ("B", layer, phase), tag,
                       lambda: self._emit_layer_backward(b, layer, tag, phase))

    def _emit_layer_backward(self, b: _RankBuilder, layer: int, tag: str, phase: str) -> None:
        """:meth:`_layer_backward`'s ops, built kernel by kernel."""
        for block, members in reversed(_blocks(self.kernels(layer))):
            label = f"l{layer}.{block}.{tag}"
            if block == "moe":
                self._moe_backward(b, layer, members, tag, phase, label)
                continue
            column, row = self._tp_matmuls(block, members)
            if phase != "W" and column is None:
                self._tp_boundary(b, label, entering=False, backward=True)
            for index in reversed(range(len(members))):
                kernel = members[index]
                if phase == "W" and kernel.bwd_weight_flops <= 0 and kernel.bwd_weight_bytes <= 0:
                    continue
                if kernel.kind == "attention" and self.plan.cp > 1 and phase != "W":
                    self._ring_attention(b, kernel, f"{tag}.l{layer}", phase)
                    continue
                if index == row:
                    self._row_backward(b, kernel, f"{tag}.l{layer}", label, phase)
                elif index == column:
                    self._column_backward(b, kernel, f"{tag}.l{layer}", label, phase)
                else:
                    self._emit_kernel(b, kernel, f"{tag}.l{layer}", phase)
            if phase != "W" and column is None:
                self._tp_boundary(b, label, entering=True, backward=True)

    def _row_backward(self, b: _RankBuilder, kernel: costs.Kernel, tag: str, label: str,
                      phase: str) -> None:
        """Backward of a row-parallel GEMM: under sequence parallelism its output
        gradient is first all-gathered over TP (the backward of the forward's
        reduce-scatter); the weight gradient needs the whole gathered gradient."""
        if phase == "W" or not self.plan.sequence_parallel:
            self._emit_kernel(b, kernel, tag, phase)
            return
        if phase == "I" or self.plan.tp_comm_overlap not in PIPELINED_TP:
            self._gathered_matmul(b, kernel, tag, label, phase)
            return
        self._gathered_matmul(b, kernel, tag, label, "I")
        self._emit_kernel(b, kernel, tag, "W")

    def _column_backward(self, b: _RankBuilder, kernel: costs.Kernel, tag: str, label: str,
                         phase: str) -> None:
        """Backward of a column-parallel GEMM, as Megatron-LM's
        ``LinearWithGradAccumulationAndAsyncCommunication`` runs it: the input gradient
        (dgrad) is reduce-scattered over TP under sequence parallelism (all-reduced
        without) while the weight gradient (wgrad) computes, and under sequence
        parallelism the layer's input is all-gathered again for the wgrad while the
        dgrad computes. With ``tp_comm_overlap = "none"`` (Megatron-LM 2021) each
        collective blocks the compute stream instead."""
        plan = self.plan
        size = self._tp_input_bytes(kernel)
        reduce_kind = "reduce_scatter" if plan.sequence_parallel else "all_reduce"
        # DTensor TP keeps the gathered input (DTENSOR_TP): nothing to gather again
        regather = plan.sequence_parallel and plan.tp_comm_overlap not in DTENSOR_TP
        if plan.tp_comm_overlap in ("none", "dtensor"):
            if phase != "I" and regather:
                self._tp_collective(b, "all_gather", size, f"{label}.input")
            self._emit_kernel(b, kernel, tag, phase)
            if phase != "W":
                self._tp_collective(b, reduce_kind, size, label)
            return
        # (TE's bulk all-gather of the saved input: an FP8 buffer, __init__)
        gather_bytes = size * self._ub_gather_scale
        if phase == "W":  # a zero-bubble weight pass: the gathered input first
            if regather:
                self._tp_collective(b, "all_gather", gather_bytes, f"{label}.input")
            self._emit_kernel(b, kernel, tag, "W")
            return
        gathered = None
        if phase == "B" and regather:
            gathered = self._tp_collective(b, "all_gather", gather_bytes, f"{label}.input",
                                           "tp", self._deps_after(b, b.last()))
        dgrad = self._emit_kernel(b, kernel, tag, "I")
        reduced = self._tp_collective(b, reduce_kind, size, label, "tp", (dgrad,))
        if phase == "B":
            self._emit_kernel(b, kernel, tag, "W", self._deps_after(b, gathered))
        b.wait(reduced)

    # -------------------------------------------------------------- DP, ZeRO-3
    def gathers_params(self, comp: str, microbatch: int) -> bool:
        """Whether an action all-gathers its layers' parameters over data parallelism
        before using them: ZeRO-3 (FSDP) every forward and backward; ZeRO-1/2 with
        ``overlap_param_gather`` the first micro-batch's forward (the parameters the
        last optimizer step updated, gathered layer by layer as the forward reaches
        them: Megatron-LM's ``--overlap-param-gather``)."""
        plan = self.plan
        if plan.shard_dp * plan.cp == 1:
            return False
        if plan.zero == 3:
            return True
        return (plan.zero in (1, 2) and self._gather_in_forward() and comp == "F"
                and microbatch == 0)

    def gathering_microbatches(self, comp: str, stage: int) -> int:
        """How many of the step's ``comp`` actions of ``stage`` gather their layers'
        parameters: :meth:`gathers_params` over the micro-batches on the stage's route,
        in closed form (ZeRO-3: every one; ZeRO-1/2 with overlapped gathers: micro-batch
        0's forward where its route passes; tests/test_fast_analytic.py checks it
        against the sum)."""
        plan = self.plan
        placement, m = self.placement, plan.num_microbatches
        if type(self).gathers_params is not StepLowerer.gathers_params:  # (a subclass's)
            return sum(self.gathers_params(comp, j) for j in range(m)
                       if placement.on_route(stage, j))
        if plan.shard_dp * plan.cp == 1:
            return 0
        if plan.zero == 3:
            return placement.microbatches_through(stage, m)
        return int(plan.zero in (1, 2) and self._gather_in_forward() and comp == "F"
                   and placement.on_route(stage, 0))

    def _gather_in_forward(self) -> bool:
        """ZeRO-1/2 gathers the updated parameters in the next step's first forward
        (``overlap_param_gather``), except for chunks held by several pipeline ranks
        (DualPipe), whose copies reach their first forward at different times: they
        gather right after the optimizer."""
        return self.plan.overlap_param_gather and self.chunk_copies == 1

    def _param_gather(self, b: _RankBuilder, layers: Sequence[int], tag: str, comp: str,
                      microbatch: int) -> dict[int, int]:
        """All-gather each layer's parameters on the dp stream, in use order, when the
        action gathers them (:meth:`gathers_params`); ``{layer: op index}``."""
        gathered = {}
        if not self.gathers_params(comp, microbatch):
            return gathered
        for layer in layers:
            params = sum(k.params for k in self.kernels(layer))
            gathered[layer] = self._collective(
                b, "dp", "all_gather", b.groups['grad'], params * PARAM_BYTES,
                f"params.l{layer}.{tag}", "dp")
        return gathered

    def _grad_buckets(self, b: _RankBuilder, kernels: Sequence[costs.Kernel], label: str,
                      pending: dict[str, float], done_index: int, final: bool) -> list[int]:
        """Add gradients of ``kernels`` to the open buckets; reduce the full ones."""
        issued = []
        for group, size in self.fill_buckets(kernels, pending, final):
            index = self._reduce_bucket(b, group, size, label, done_index)
            if index >= 0:
                issued.append(index)
        return issued

    def fill_buckets(self, kernels: Sequence[costs.Kernel], pending: dict[str, float],
                     final: bool) -> list[tuple[str, float]]:
        """Add the gradients of ``kernels`` to the open buckets ``pending`` (bytes per
        group, ``dense`` or ``expert``); return the buckets now due, as (group, bytes):
        those past ``plan.grad_bucket_bytes``, or every open one when ``final``."""
        due = []
        for kernel in kernels:
            group = "expert" if kernel.block == "moe" and kernel.expert else "dense"
            pending[group] = pending.get(group, 0.0) + kernel.params * self.grad_bytes
        for group in ("dense", "expert"):
            size = pending.get(group, 0.0)
            if size > 0 and (size >= self.plan.grad_bucket_bytes or final):
                due.append((group, size))
                pending[group] = 0.0
        return due

    def part_kernels(self, part: int | str) -> tuple[costs.Kernel, ...]:
        """Forward kernels of a layer (its index) or of the ``"embedding"``/``"head"``."""
        if part == AMAX_PART:
            return ()
        return self._edge_kernels(part) if isinstance(part, str) else self.kernels(part)

    def _bucket_reduction_ops(self, p: int, group: str, size: float) -> list[Op]:
        """The ops :meth:`_reduce_bucket` issues for one gradient bucket of pipeline rank
        ``p``: its reduction and, with HSDP replicas, the all-reduce after it."""
        rank = self.representatives[p]
        b = _RankBuilder(rank, self._groups(rank))
        self._reduce_bucket(b, group, size, "bucket", 0)
        return b.ops

    def reduction_op(self, p: int, group: str, size: float) -> Op | None:
        """The op that reduces one gradient bucket of pipeline rank ``p`` (None when
        there is nothing to reduce, e.g. data parallelism of 1)."""
        ops = self._bucket_reduction_ops(p, group, size)
        return ops[0] if ops else None

    def param_gather_op(self, p: int, layer: int) -> Op | None:
        """The all-gather of one layer's parameters on pipeline rank ``p`` that a
        parameter-gathering action issues (:meth:`gathers_params`; None when no action
        gathers)."""
        rank = self.representatives[p]
        b = _RankBuilder(rank, self._groups(rank))
        index = self._param_gather(b, [layer], "gather", "F", 0).get(layer, -1)
        return b.ops[index] if index >= 0 else None

    def replica_reduction_op(self, p: int, group: str, size: float) -> Op | None:
        """The all-reduce over the HSDP replicas that follows the reduction of one
        ``dense`` gradient bucket of pipeline rank ``p`` (:meth:`_reduce_bucket`; None
        without replicas)."""
        ops = self._bucket_reduction_ops(p, group, size)
        return ops[1] if len(ops) > 1 else None

    def optimizer_ops(self, p: int) -> list[Op]:
        """The optimizer step of pipeline rank ``p`` and, under ZeRO 1/2, the
        parameter all-gathers after it."""
        rank = self.representatives[p]
        b = _RankBuilder(rank, self._groups(rank))
        self._optimizer(b, p, [])
        return b.ops

    def _reduce_bucket(self, b: _RankBuilder, group: str, size: float, label: str,
                       done_index: int) -> int:
        """Reduce one full gradient bucket (``size`` bytes of the ``dense`` or ``expert``
        group, ready once op ``done_index`` ends) over data parallelism; the op's index,
        or -1 when nothing was issued. Parameter-server lowering overrides it
        (strategies.param_server)."""
        ranks = b.groups['grad'] if group == "dense" else b.groups['expert_grad']
        kind = "all_reduce" if self.plan.zero == 0 else "reduce_scatter"
        index = self._collective(b, "dp", kind, ranks, size, f"grads.{group}.{label}", "dp",
                                 (done_index,))
        return self._replica_all_reduce(b, group, size, label, index)

    def _replica_all_reduce(self, b: _RankBuilder, group: str, size: float, label: str,
                            reduced: int) -> int:
        """Hybrid sharding: after a ``dense`` bucket's reduce-scatter (op ``reduced``) in the
        shard group, all-reduce the rank's ``size / (shard_dp * cp)`` bytes with the ranks
        holding the same shard (PyTorch FSDP2 ``foreach_reduce``: reduce-scatter over the
        mesh's shard dimension, then ``all_reduce`` over ``all_reduce_group``, its
        replicate dimension, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py;
        Megatron-Core ``--num-distributed-optimizer-instances``: reduce-scatter in the
        intra-instance group, all-reduce in the inter-instance group,
        megatron/core/distributed/param_and_grad_buffer.py ``start_grad_sync``). The op's
        index (``reduced`` without replicas).

        Both frameworks issue the all-reduce on its own stream (FSDP2's
        ``all_reduce_stream``, Megatron's second communication stream), so the next
        bucket's reduce-scatter may run beside it; here it follows on the data-parallel
        stream, which overstates the stream's busy time by at most the shorter of the two
        per bucket (the all-reduce moves 1/shard of the bucket)."""
        plan = self.plan
        if plan.dp_replicas == 1 or group != "dense" or reduced < 0:
            return reduced
        shard = size / len(b.groups['grad'])
        index = self._collective(b, "dp", "all_reduce", b.groups['replica'], shard,
                                 f"grads.replica.{label}", "dp", (reduced,))
        return reduced if index < 0 else index

    # -------------------------------------------------------------------- step
    def distinct_ranks(self, ranks: Sequence[int]) -> list[int]:
        """Ranks to simulate on their own because ``ranks`` behave differently
        (stragglers): each one's whole pipeline, and the TP and CP groups of
        those, which wait for it and in turn hold up their data-parallel peers."""
        layout, plan = self.layout, self.plan
        chosen: set[int] = set()
        for rank in ranks:
            for q in range(plan.pp):
                peer = layout.stage_rank(q, like=rank)
                chosen.update(layout.group(peer, "tp"))
                chosen.update(layout.group(peer, "cp"))
        return sorted(chosen - set(self.representatives))

    def lower(self, distinct: Sequence[int] = (), *, mirrors: bool = False) -> StepLowering:
        """Build the Program of one step.

        Args:
            distinct: ranks that break the symmetry (stragglers); they and the
                ranks coupled to them (:meth:`distinct_ranks`) are simulated
                individually next to one representative per pipeline rank.
            mirrors: record the communication of the ranks left out
                (:class:`strategies.ir.Mirrors`), for the flow fidelity.
        """
        plan = self.plan
        all_actions = self.actions()
        programs = {}
        for p, rank in enumerate(self.representatives):
            programs[rank] = self._lower_rank(p, rank, all_actions[p])
        extra = self.distinct_ranks(distinct)
        for rank in extra:
            p = self.layout.coords(rank)["pp"]
            programs[rank] = self._lower_rank(p, rank, all_actions[p])
        represents = {rank: 1 for rank in extra}
        for p, rank in enumerate(self.representatives):
            alike = plan.tp * plan.cp * plan.dp
            represents[rank] = alike - sum(1 for r in extra if self.layout.coords(r)["pp"] == p)
        program = Program(ops_by_rank=programs, world_size=plan.world_size,
                          name=f"{self.model.name} step", represents=represents,
                          metadata={"model": self.model.name, "plan": plan},
                          mirrors=self.mirrors(set(programs)) if mirrors else None)
        return StepLowering(program, self.layout, self.representatives, self.stage_layers,
                            tuple(tuple(a) for a in all_actions))

    def mirrors(self, present: set[int]) -> Mirrors:
        """Communication of the ranks not in ``present`` that mirrors the
        representatives' (groups and pipeline edges without a present member)."""
        layout, plan = self.layout, self.plan
        groups: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = {}
        pairs: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        next_rank: dict[int, list[int]] = {}
        for p, q in self.placement.edges():
            next_rank.setdefault(p, []).append(q)
        for p, rep in enumerate(self.representatives):
            absent = [layout.rank(tp=t, cp=c, dp=d, pp=p) for d in range(plan.dp)
                      for c in range(plan.cp) for t in range(plan.tp)]
            absent = [r for r in absent if r not in present]
            rep_groups = self._groups(rep)
            for name in GROUP_NAMES:
                group = rep_groups[name]
                if len(group) < 2 or group in groups:
                    continue
                found, covered = set(), set()
                for rank in absent:
                    if rank in covered:
                        continue
                    other = self._group_of(rank, name)
                    covered.update(other)
                    if not present.intersection(other):
                        found.add(other)
                groups[group] = tuple(sorted(found))
            for q in next_rank.get(p, ()):
                edges = [(r, layout.stage_rank(q, like=r)) for r in absent]
                edges = [(a, b) for a, b in edges if b not in present]
                peer = self.representatives[q]
                pairs[(rep, peer)] = tuple(edges)
                pairs[(peer, rep)] = tuple((b, a) for a, b in edges)
        return Mirrors(groups=groups, pairs=pairs)

    def _group_of(self, rank: int, name: str) -> tuple[int, ...]:
        """Group ``name`` (:data:`GROUP_NAMES`) of any rank, uncached (mirrors visit
        every rank once)."""
        layout = self.layout
        if name == "ep":
            return layout.ep_group(rank)
        if name in ("grad", "expert_grad") and self.chunk_copies > 1:
            # a chunk held by several pipeline ranks (DualPipe) reduces its gradients,
            # and shards its optimizer, over all of its holders
            holders = self.chunk_holders(layout.coords(rank)["pp"])
            return tuple(sorted(r for q in holders
                                for r in self._group_of_one_copy(layout.stage_rank(q, rank),
                                                                 name)))
        return self._group_of_one_copy(rank, name)

    def _group_of_one_copy(self, rank: int, name: str) -> tuple[int, ...]:
        layout = self.layout
        if name == "expert_grad":
            return layout.expert_dp_group(rank)
        if name == "etp":
            return layout.expert_tp_group(rank)
        if name == "ep_etp":
            return tuple(sorted(r for member in layout.ep_group(rank)
                                for r in layout.expert_tp_group(member)))
        if name in ("ep_rail", "ep_local"):
            return self._ep_domain_group(rank, name)
        if name == "grad":
            return layout.dp_shard_group(rank)
        if name == "replica":
            return layout.dp_replica_group(rank)
        if name == "amax":
            # Megatron-Core get_amax_reduction_group(with_context_parallel=True,
            # tp_only_amax_red): TP x DP x CP, or TP x CP with --tp-only-amax-red
            axes = ("tp", "cp") if self.plan.tp_only_amax_red else ("tp", "cp", "dp")
            return layout.group(rank, *axes)
        return layout.group(rank, *{"tp": ("tp",), "cp": ("cp",)}[name])

    def _ep_domain_group(self, rank: int, name: str) -> tuple[int, ...]:
        """The members of ``rank``'s EP group in its NVLink domain (``ep_local``), or at
        its position in every domain the group spans (``ep_rail``)."""
        group = self.layout.ep_group(rank)
        if not self.domain_gpus:
            return group if name == "ep_local" else (rank,)
        blocks: dict[int, list[int]] = {}
        for member in group:
            blocks.setdefault(member // self.domain_gpus, []).append(member)
        own = blocks[rank // self.domain_gpus]
        if name == "ep_local":
            return tuple(own)
        position = own.index(rank)
        return tuple(block[position] for block in blocks.values() if position < len(block))

    def rank_ops(self, p: int) -> list[Op]:
        """Ops of pipeline rank ``p``'s representative, as :meth:`lower` builds them."""
        return self._lower_rank(p, self.representatives[p], self.actions()[p])

    def phase_ops(self, p: int, part: int | str, comp: str) -> list[Op]:
        """Ops of one layer (``part`` = its index) or of the ``"embedding"`` or
        ``"head"`` in one phase (F, B, I or W) on pipeline rank ``p``'s
        representative, as an action emits them (recompute and TP/CP/EP
        communication included; no pipeline or data-parallel communication)."""
        b = _RankBuilder(self.representatives[p], self._groups(self.representatives[p]))
        tag = f"{comp}.part"
        if part == AMAX_PART:
            self._amax_reduction(b, p, comp)
        elif isinstance(part, str):
            kernels = self._edge_kernels(part)
            for kernel in (kernels if comp == "F" else reversed(kernels)):
                self._emit_kernel(b, kernel, tag, comp)
        elif comp == "F":
            self._carry_copy(b, part, "params", comp)
            self._layer_forward(b, part, tag)
        else:
            if comp in ("B", "I"):
                self._carry_copy(b, part, "params", comp)
                self._recompute(b, part, tag)
            self._layer_backward(b, part, tag, comp)
            if comp in ("B", "W"):
                self._carry_copy(b, part, "grads", comp)
        return b.ops

    def actions(self) -> tuple[tuple[Action, ...], ...]:
        """The schedule's actions of every pipeline rank for this plan (with overlapped
        forward-backward pairs when the plan asks for them)."""
        plan = self.plan
        return self.schedule.actions(plan.pp, plan.num_microbatches, plan.vpp, self.overlap)

    def last_microbatch(self, stage: int) -> int:
        """The last micro-batch that runs through ``stage`` (its route's last)."""
        m, routes = self.plan.num_microbatches, self.placement.routes
        route = stage // self.placement.num_chunks
        return route + (m - 1 - route) // routes * routes

    def reduces_grads(self, stage: int, microbatch: int) -> bool:
        """Whether the backward (B or W) of ``microbatch`` through ``stage`` reduces its
        gradients over data parallelism: the route's last micro-batch's (gradients
        accumulated locally before it, DDP's ``no_sync`` and Megatron's deferred
        reduction), every micro-batch's with ``plan.grad_reduce_every_microbatch``
        (PyTorch FSDP v1 outside ``no_sync``: torch/distributed/fsdp/_runtime_utils.py
        ``_post_backward_hook`` reduce-scatters whenever ``_sync_gradients`` is set,
        which only ``FullyShardedDataParallel.no_sync`` clears)."""
        return (self.plan.grad_reduce_every_microbatch
                or microbatch == self.last_microbatch(stage))

    def _lower_rank(self, p: int, rank: int, actions: Sequence[Action]) -> list[Op]:
        plan = self.plan
        b = _RankBuilder(rank, self._groups(rank))
        pending: dict[int, dict[str, float]] = {}
        dp_ops: list[int] = []
        last_compute_stage: dict[int, int] = {}
        index = 0
        while index < len(actions):
            action = actions[index]
            if action.overlap:
                dp_ops += self._pair_action(b, action, actions[index + 1], pending)
                for member in actions[index:index + 2]:
                    last_compute_stage[member.stage] = b.last()
                index += 2
                continue
            dp_ops += self._action(b, action, pending)
            last_compute_stage[action.stage] = b.last()
            index += 1
        if not plan.overlap_grad_reduce:
            # by model chunk, named by chunk: DualPipe's two holders of a chunk (a rank and
            # its mirror, which holds it as another stage of the other route) reduce its
            # gradients in one collective, so both must issue it under the same key and in
            # the same order (by stage index and named by stage they never met: deadlock)
            chunk_of = self.placement.chunk_of
            for s in sorted(last_compute_stage, key=lambda s: (chunk_of(s), s)):
                kernels = [k for layer in self.stage_layers[s] for k in self.kernels(layer)]
                if self.placement.is_first(s):
                    kernels += self._edge_kernels("embedding")
                if self.placement.is_last(s):
                    kernels += self._edge_kernels("head")
                dp_ops += self._grad_buckets(b, kernels, f"stage{chunk_of(s)}", {}, b.last(),
                                             True)
        self._optimizer(b, p, dp_ops)
        return b.ops

    def _action(self, b: _RankBuilder, action: Action, pending: dict[int, dict[str, float]],
                communicate: bool = True) -> list[int]:
        """Emit one action; the indices of the gradient reductions it issued.
        ``communicate`` False leaves out pipeline transfers and data-parallel
        reductions (what :meth:`pair_ops` prices)."""
        s, j = action.stage, action.microbatch
        layers = self.stage_layers[s]
        tag = f"{action.comp}{s}.mb{j}"
        if action.comp == "F":
            self._forward_action(b, s, j, layers, tag, communicate)
            return []
        return self._backward_action(b, action, layers, tag, pending, communicate)

    def _backward_action(self, b: _RankBuilder, action: Action, layers: Sequence[int],
                         tag: str, pending: dict[int, dict[str, float]],
                         communicate: bool) -> list[int]:
        """A backward (B, I) or weight (W) action of stage ``action.stage``: the head,
        the layers in reverse (recomputing first what recompute dropped) and the
        embedding, each bucket of the route's last micro-batch reduced as it fills."""
        plan, placement = self.plan, self.placement
        s, j = action.stage, action.microbatch
        dp_ops: list[int] = []
        reduce_now = (action.comp in ("B", "W") and self.reduces_grads(s, j)
                      and plan.overlap_grad_reduce and communicate)
        grads = pending.setdefault(s, {})
        amax = self.amax_in(action.comp)
        if action.comp in ("B", "I") and communicate:
            self._backward_recv(b, s, j)
        if placement.is_last(s):
            head = self._edge_kernels("head")
            for kernel in reversed(head):
                self._emit_kernel(b, kernel, tag, action.comp)
            if reduce_now:
                dp_ops += self._grad_buckets(b, head, "head", grads, b.last(), False)
        gathered = self._param_gather(b, layers[::-1], tag, action.comp, j) if communicate else {}
        for layer in reversed(layers):
            b.wait(gathered.get(layer, -1))
            if action.comp in ("B", "I"):
                self._carry_copy(b, layer, "params", action.comp)
                self._recompute(b, layer, tag)
            self._layer_backward(b, layer, tag, action.comp)
            if action.comp in ("B", "W"):
                self._carry_copy(b, layer, "grads", action.comp)
            if reduce_now:
                dp_ops += self._grad_buckets(b, self.kernels(layer), f"l{layer}", grads,
                                             b.last(),
                                             final=(layer == layers[0] and not amax
                                                    and not placement.is_first(s)))
        if amax:
            # the chunk's backward ends with the amax reduction inside the first FP8
            # module's backward, before autograd hands its weight gradients to the
            # gradient-reduction hooks: the stage's last bucket is issued after it
            self._amax_reduction(b, placement.rank_of(s), action.comp)
            if reduce_now and not placement.is_first(s):
                dp_ops += self._grad_buckets(b, (), f"l{layers[0]}", grads, b.last(), True)
        if placement.is_first(s):
            embedding = self._edge_kernels("embedding")
            for kernel in reversed(embedding):
                self._emit_kernel(b, kernel, tag, action.comp)
            if reduce_now:
                dp_ops += self._grad_buckets(b, embedding, "embedding", grads, b.last(), True)
        if action.comp in ("B", "I") and communicate:
            self._backward_send(b, s, j)
        return dp_ops

    def _pair_action(self, b: _RankBuilder, first: Action, second: Action,
                     pending: dict[int, dict[str, float]]) -> list[int]:
        """An overlapped forward-backward pair (:attr:`strategies.pipeline.Action.overlap`)
        as DualPipe's ``_forward_backward_chunk`` runs it: both inputs received, the two
        actions' kernels interleaved on the compute stream so that each one's expert
        all-to-all runs on its own stream while the other computes
        (:meth:`_merge_overlapped`), and both outputs sent after the pair."""
        parts = []
        for action in (first, second):
            sub = _RankBuilder(b.rank, b.groups, key_counts=b.key_counts)
            reductions = self._action(sub, action, pending)
            parts.append((sub, reductions))
        return self._merge_overlapped(b, parts)

    def pair_ops(self, p: int, forward_stage: int, backward_stage: int, comp: str) -> list[Op]:
        """Ops of an overlapped pair on pipeline rank ``p``'s representative: the
        forward of ``forward_stage`` with the ``comp`` (B or I) of ``backward_stage``,
        as :meth:`_pair_action` interleaves them, without pipeline transfers and
        gradient reductions (the closed-form model prices it once)."""
        rank = self.representatives[p]
        b = _RankBuilder(rank, self._groups(rank))
        parts = []
        for action in (Action(forward_stage, "F", 0), Action(backward_stage, comp, 0)):
            sub = _RankBuilder(rank, b.groups, key_counts=b.key_counts)
            self._action(sub, action, {}, communicate=False)
            parts.append((sub, []))
        self._merge_overlapped(b, parts)
        return b.ops

    def _merge_overlapped(self, b: _RankBuilder, parts: list[tuple[_RankBuilder, list[int]]]
                          ) -> list[int]:
        """Append two actions' ops to ``b`` interleaved (DeepSeek-V3 report, Figure 4:
        the forward's attention beside the backward's combine, its dispatch beside the
        backward's experts, ...): each action's compute-stream ops are cut at its expert
        communication (axis ``ep``) and the pieces alternate, the communication moving
        to the ``ep`` stream after the piece that produced its input and before the
        piece that reads its output. Sends wait for the whole pair. Returns the new
        indices of the parts' gradient reductions."""
        mapping: list[dict[int, int]] = [{}, {}]
        # both inputs arrive before the pair computes (DualPipe's _forward_backward_chunk
        # posts both receives and waits for them)
        for k, (sub, _) in enumerate(parts):
            for local, op in enumerate(sub.ops):
                if isinstance(op, RecvOp):
                    mapping[k][local] = b.add(op)
                    b.wait(mapping[k][local])
        segments = [[[(local, op) for local, op in piece if not isinstance(op, RecvOp)]
                     for piece in _segments(sub.ops)] for sub, _ in parts]
        sends: list[tuple[int, Op]] = []
        comm_done: list[int | None] = [None, None]
        last_compute: list[int | None] = [None, None]
        for step in range(max(len(seg) for seg in segments)):
            for k, seg in enumerate(segments):
                if step >= len(seg):
                    continue
                for local, op in seg[step]:
                    deps = {mapping[k][d] for d in op.deps}
                    if isinstance(op, SendOp):
                        sends.append((k, op))
                        continue
                    if op.stream == COMPUTE and _is_expert_comm(op):
                        deps.update(d for d in (last_compute[k], comm_done[k]) if d is not None)
                        op = replace(op, stream=EP_STREAM)
                    elif op.stream == COMPUTE and comm_done[k] is not None:
                        deps.add(comm_done[k])
                        comm_done[k] = None
                    index = b.add(replace(op, deps=tuple(sorted(deps))))
                    mapping[k][local] = index
                    if op.stream == EP_STREAM and _is_expert_comm(op):
                        comm_done[k] = index
                    elif op.stream == COMPUTE:
                        last_compute[k] = index
        for k, done in enumerate(comm_done):
            if done is not None:
                b.wait(done)
        for k, (sub, _) in enumerate(parts):
            for pending in sub.pending_waits():
                b.wait(mapping[k][pending])
        end = b.last()
        for k, op in sends:
            b.add(replace(op, deps=tuple(sorted({end, *(mapping[k][d] for d in op.deps
                                                          if d in mapping[k])}))))
        return [mapping[k][i] for k, (_, reductions) in enumerate(parts) for i in reductions]

    def _forward_action(self, b: _RankBuilder, s: int, j: int, layers: Sequence[int],
                        tag: str, communicate: bool = True) -> None:
        placement = self.placement
        recv = None
        if communicate and not placement.is_first(s) and self._crosses(s - 1, s):
            recv = b.add(RecvOp(name=f"pp.recv.act.{tag}", peer=self._stage_rank(b, s - 1),
                                size_bytes=int(self.pp_message_bytes), tag=f"act{s}.{j}",
                                stream=self._p2p_stream("pp.recv.fwd", s - 1, s)))
            b.wait(recv)
        if placement.is_first(s):
            for kernel in self._edge_kernels("embedding"):
                self._emit_kernel(b, kernel, tag, "F")
        gathered = self._param_gather(b, layers, tag, "F", j) if communicate else {}
        for layer in layers:
            b.wait(gathered.get(layer, -1))
            self._carry_copy(b, layer, "params", "F")
            self._layer_forward(b, layer, tag)
        self._amax_reduction(b, placement.rank_of(s), "F")
        if placement.is_last(s):
            for kernel in self._edge_kernels("head"):
                self._emit_kernel(b, kernel, tag, "F")
        elif communicate and self._crosses(s, s + 1):
            b.add(SendOp(name=f"pp.send.act.{tag}", peer=self._stage_rank(b, s + 1),
                         size_bytes=int(self.pp_message_bytes), tag=f"act{s + 1}.{j}",
                         stream=self._p2p_stream("pp.send.fwd", s, s + 1), deps=(b.last(),)))

    def _backward_recv(self, b: _RankBuilder, s: int, j: int) -> None:
        if not self.placement.is_last(s) and self._crosses(s, s + 1):
            recv = b.add(RecvOp(name=f"pp.recv.grad.B{s}.{j}", peer=self._stage_rank(b, s + 1),
                                size_bytes=int(self.pp_message_bytes), tag=f"grad{s}.{j}",
                                stream=self._p2p_stream("pp.recv.bwd", s, s + 1)))
            b.wait(recv)

    def _backward_send(self, b: _RankBuilder, s: int, j: int) -> None:
        if not self.placement.is_first(s) and self._crosses(s - 1, s):
            b.add(SendOp(name=f"pp.send.grad.B{s}.{j}", peer=self._stage_rank(b, s - 1),
                         size_bytes=int(self.pp_message_bytes), tag=f"grad{s - 1}.{j}",
                         stream=self._p2p_stream("pp.send.bwd", s - 1, s), deps=(b.last(),)))

    def _p2p_stream(self, name: str, earlier: int, later: int) -> str:
        """The stream of a pipeline transfer between stages ``earlier`` and ``later``
        (``earlier + 1``): ``name`` where ``later``'s rank follows ``earlier``'s on the
        pipeline ring (every transfer of 1F1B and interleaved 1F1B), ``name + ".up"``
        where the route runs back up the ranks (the V's second leg, DualPipe's reverse
        direction). Transfers to different neighbours do not queue behind each other:
        DualPipe posts each step's sends and receives as one ``batch_isend_irecv``
        (deepseek-ai/DualPipe ``dualpipe/comm.py``), which NCCL runs as one group, and
        PyTorch gives unbatched ``isend``/``irecv`` a communicator and stream per peer
        pair (ProcessGroupNCCL ``getKeySendRecv``); one FIFO per direction would make
        the two directions wait on each other and deadlock at 16 ranks."""
        pp = self.placement.pp
        down = (self.placement.rank_of(earlier) + 1) % pp == self.placement.rank_of(later)
        return name if down or pp <= 2 else name + ".up"

    def _stage_rank(self, b: _RankBuilder, stage: int) -> int:
        """The rank of ``b``'s pipeline that holds virtual stage ``stage``."""
        return self.layout.stage_rank(self.placement.rank_of(stage), like=b.rank)

    def _crosses(self, stage: int, following: int) -> bool:
        """Whether two stages sit on different pipeline ranks (a V-shaped placement
        keeps the middle pair on one rank: no transfer)."""
        return self.placement.rank_of(stage) != self.placement.rank_of(following)

    def rank_layers(self, p: int) -> list[int]:
        """Global layer indices pipeline rank ``p`` holds (all its virtual stages)."""
        return [layer for s in self.placement.stages_of(p) for layer in self.stage_layers[s]]

    def holds_embedding(self, p: int) -> bool:
        """Pipeline rank ``p`` holds a route's first stage (the input embedding)."""
        return any(self.placement.is_first(s) for s in self.placement.stages_of(p))

    def holds_head(self, p: int) -> bool:
        """Pipeline rank ``p`` holds a route's last stage (final norm, output head, loss)."""
        return any(self.placement.is_last(s) for s in self.placement.stages_of(p))

    def chunk_holders(self, p: int) -> tuple[int, ...]:
        """Pipeline ranks holding the chunks pipeline rank ``p`` holds, ``p`` first
        (DualPipe: ``p`` and its mirror ``pp - 1 - p``; otherwise ``(p,)``)."""
        placement = self.placement
        chunks = {placement.chunk_of(s) for s in placement.stages_of(p)}
        others = sorted({placement.rank_of(s) for s in range(placement.num_stages)
                         if placement.chunk_of(s) in chunks} - {p})
        return (p, *others)

    def _optimizer(self, b: _RankBuilder, p: int, dp_ops: list[int]) -> None:
        """The optimizer step of pipeline rank ``p`` once its gradients are reduced:
        the gradient norm (its local kernel, then its partial sums all-reduced over the
        ranks sharing the optimizer state; Megatron also reduces it over the model-parallel
        group, a few bytes left out here), clipping, the Adam kernels of
        ``plan.optimizer_impl`` (:func:`strategies.model_costs.optimizer_kernels`) over
        the rank's shard, reading and writing what the plan's optimizer stores
        (:func:`strategies.memory.optimizer_storage`), the per-step FP8 weight
        quantization of a weight-caching fp8 recipe, and under ZeRO 1/2 without overlap
        the parameter all-gather."""
        plan = self.plan
        layers = self.rank_layers(p)
        params = costs.rank_params(self.model, layers=layers, tp=plan.tp,
                                   ep=plan.ep, has_embedding=self.holds_embedding(p),
                                   has_head=self.holds_head(p), etp=self.etp)
        sharded = plan.zero >= 1
        # a chunk held by several pipeline ranks is sharded over all of their ranks; under
        # hybrid sharding over the shard group only (plan.dp_shard)
        copies = self.chunk_copies if sharded else 1
        dense = params.dense_params / (plan.shard_dp * plan.cp * copies if sharded else 1)
        expert = params.expert_params / (self.layout.expert_dp * copies if sharded else 1)
        # (the kernels with parameters counted once per layer kind: a layer's kernels
        # are its kind's, StepLowerer.kernels)
        tensors = 2
        per_kind: dict[tuple[bool, int], int] = {}
        layer_kind = self.model.layer_kind
        for layer in layers:
            kind = layer_kind(layer)
            found = per_kind.get(kind)
            if found is None:
                found = per_kind[kind] = sum(1 for k in self._layer_kernels(kind) if k.params)
            tensors += found
        # what the optimizer stores and so reads and writes (strategies.memory.optimizer_storage)
        stored = optimizer_storage(plan)
        kernels = costs.optimizer_kernels(dense + expert, implementation=stored.implementation,
                                          grad_bytes=stored.grad_bytes, tensors=tensors,
                                          adam_bytes=stored.adam_bytes_per_param())
        deps = tuple(sorted(set(dp_ops)))
        for kernel in kernels:
            b.add(compute_op(kernel, kernel.name, "F", deps=deps))
            deps = ()
            if kernel.name == "optimizer.grad_norm" and sharded:
                # (hybrid sharding: the replicas hold the same reduced shards, so the
                # norm's partial sums reduce over the shard group only: FSDP2's DTensor
                # gradients are Replicate on the replicate dimension; Megatron-Core sums
                # over the intra-instance data-parallel group)
                self._collective(b, "dp", "all_reduce", b.groups['grad'], GRAD_NORM_BYTES,
                                 "optimizer.grad_norm", COMPUTE, (b.last(),))
        recipe = costs.resolve_fp8_recipe(plan.fp8_recipe)
        if plan.dtype == "fp8" and recipe.weight_cache:
            weights = sum(count * sum(costs.layer_params(self.model, layer, tp=plan.tp,
                                                         ep=plan.ep, etp=self.etp))
                          for layer, count in costs.layer_types(self.model, layers).items())
            quant = costs.fp8_weight_quant_kernel(weights, recipe)
            b.add(compute_op(quant, quant.name, "F"))
        if plan.zero in (1, 2) and not self._gather_in_forward():
            # (overlapped, the gather runs layer by layer in the next step's first
            # forward instead: gathers_params)
            done = b.last()
            self._collective(b, "dp", "all_gather", b.groups['grad'],
                             params.dense_params * PARAM_BYTES, "params.optimizer", "dp", (done,))
            if params.expert_params:
                self._collective(b, "dp", "all_gather", b.groups['expert_grad'],
                                 params.expert_params * PARAM_BYTES, "params.experts.optimizer",
                                 "dp", (done,))


#: Kernels Megatron-Core's router launches per pass without ``--moe-router-fusion``
#: (score function, top-k, routing map, probabilities, auxiliary-loss statistics): 72 in
#: the forward (NVIDIA, "Optimizing DeepSeek-V3 Training Performance on GB200 NVL72",
#: Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, Section 2.1.4: "from 72
#: to 31" with the fusion); assumption: as many autograd kernels in the backward.
ROUTER_HOST_LAUNCHES = 72
#: Kernels replayed from CUDA graphs under ``host_issue = "partial"`` (Megatron-Core
#: ``--cuda-graph-scope attn moe_router moe_preprocess``, same document Section 2.3:
#: attention, router, EP preprocess and shared experts captured; routed experts eager).
_PARTIAL_GRAPH_PREFIXES = ("attn.", "moe.norm", "moe.router", "moe.route", "moe.shared.")


#: CPU launches of Megatron-Core's all-to-all dispatcher preprocess per MoE layer forward
#: (``MoEAlltoAllTokenDispatcher.preprocess`` and ``_maybe_dtoh_and_synchronize``,
#: megatron/core/transformer/moe/token_dispatcher.py; dropless, EP > 1, permute fusion):
#: the kernels ``routing_map.sum(dim=0)``, the ``input_splits`` ``reshape(ep, E_local)
#: .sum(axis=1)``, the token-count all-gather over the TP x EP group
#: (``gather_from_sequence_parallel_region``, one NCCL launch), the ``.contiguous()`` of
#: the local experts' slice and its three sums (per rank, per TP rank, per local expert),
#: 7; then the device-to-host copies on the side stream of ``tokens_per_expert``,
#: ``input_splits``, ``output_splits`` and ``output_splits_tp`` (``maybe_move_tensor_to_cpu``;
#: ``num_out_tokens`` is a Python int when dropless, ``num_global_tokens_per_local_expert``
#: stays on the GPU under permute fusion), 4: 11.
DISPATCH_PREPROCESS_HOST_LAUNCHES = 11
#: CPU-only calls of the same code: the views (``reshape``/``transpose`` of the gathered
#: counts, the local-expert slice, ``[tp_rank]``, the per-local-expert ``view``), the
#: all-gather's ``torch.empty`` output, the side stream's ``wait_stream``, stream switch
#: and ``record_event``, the ``event.synchronize`` and the three ``as_numpy`` conversions
#: of the splits: 13.
DISPATCH_PREPROCESS_HOST_CALLS = 13


def dispatch_preprocess_host(mode: str, ep: int, dispatcher: str) -> tuple[int, int]:
    """(CPU launches, CPU-only calls) of the dropless MoE layer's host sync op under
    ``host_issue`` ``mode``: for Megatron-Core's ``alltoall`` dispatcher over EP > 1, the
    preprocess that computes the splits and copies them to the host
    (:data:`DISPATCH_PREPROCESS_HOST_LAUNCHES`, :data:`DISPATCH_PREPROCESS_HOST_CALLS`),
    except under ``partial`` CUDA graphs, whose ``moe_preprocess`` scope captures it
    (NVIDIA's DeepSeek-V3 GB200 guide, Section 2.3); otherwise the one copy of the
    tokens per expert."""
    if mode in ("eager", "compiled") and dispatcher == "alltoall" and ep > 1:
        return DISPATCH_PREPROCESS_HOST_LAUNCHES, DISPATCH_PREPROCESS_HOST_CALLS
    return 1, 0


def host_launches(kernel: costs.Kernel, phase: str, mode: str, local_experts: int) -> int:
    """Kernels the CPU issues one by one for ``kernel``'s ``phase`` under ``host_issue``
    ``mode`` (:data:`strategies.plan.HOST_ISSUE_MODES`): none when off or graphed (or
    captured by partial graphs); else (eager, compiled, partial) its GPU kernels (under
    ``compiled`` one launch per kernel of the fused graph, the plan's ``elementwise``
    saying how far elementwise work is fused), the router's
    :data:`ROUTER_HOST_LAUNCHES`, and for the routed experts one per local expert per
    GEMM: Transformer Engine's ``GroupedLinear`` (Megatron-Core ``TEGroupedMLP``,
    ``--moe-grouped-gemm``) multiplies each expert's slice of its input (split by
    ``m_splits``) with its own cuBLAS GEMM (transformer_engine/pytorch/module/
    grouped_linear.py), a GEMM in the forward and two (data and weight gradient) in the
    backward; its quantizations launch the kernels the quantization kernel stands for
    (one per expert unless the recipe fuses them: ``Fp8Recipe.fused_split_quantize``)."""
    if mode in HOST_FREE_MODES:
        return 0
    if mode == "partial" and kernel.name.startswith(_PARTIAL_GRAPH_PREFIXES):
        return 0
    launches = max(1, kernel.launches[0 if phase == "F" else 1])
    if kernel.name == "moe.route":
        return ROUTER_HOST_LAUNCHES
    if kernel.expert and local_experts > 1 and kernel.kind == "matmul":
        gemms = 2 if phase == "B" else 1
        return launches * local_experts * gemms
    return launches


#: CPU-only framework calls per GEMM of Transformer Engine's ``GroupedLinear``: the
#: ``torch.split`` view of its input and two ``torch.empty`` allocations per GEMM
#: (TE issue 1499, a maintainer's answer: "CPU overheads of PyTorch ops, such as
#: ``torch.split()`` and ``torch.empty()`` (2x ``num_gemms`` calls)").
GROUPED_GEMM_HOST_CALLS = 3
#: CPU-only calls per FP8 quantization (one ``.quant`` kernel): the quantized tensor's
#: row-wise and column-wise data and scaling factors, "four tensors need to be allocated"
#: (NVIDIA's DeepSeek-V3 GB200 guide, Megatron-LM docs/discussions/deepseek-v3-gb200-
#: optimization, Section 2.1.2).
QUANT_HOST_CALLS = 4
#: Matmul kernels that are not Transformer Engine modules: Megatron-Core's router gating
#: (``TopKRouter``, a torch GEMM), its own ``ColumnParallelLinear`` output layer and the
#: unfused attention's torch batched GEMMs.
_NON_TE_MATMULS = ("moe.router", "head.logits", "attn.scores", "attn.context")


def host_calls(kernel: costs.Kernel, phase: str, mode: str, local_experts: int) -> int:
    """CPU-only framework calls (allocations, views, splits) of ``kernel``'s ``phase``
    under ``host_issue`` ``mode``, wherever :func:`host_launches` counts launches:
    :data:`GROUPED_GEMM_HOST_CALLS` per routed-expert GEMM and
    :data:`QUANT_HOST_CALLS` per quantization kernel; 0 otherwise."""
    launches = host_launches(kernel, phase, mode, local_experts)
    if not launches:
        return 0
    if kernel.name.endswith(".quant"):
        return QUANT_HOST_CALLS * launches
    if kernel.expert and kernel.kind == "matmul":
        return GROUPED_GEMM_HOST_CALLS * launches
    return 0


#: Blocks of a transformer layer: what torchtitan compiles (``apply_compile`` in
#: torchtitan/parallelisms/parallelize_llama.py wraps each ``TransformerBlock`` of
#: ``model.layers`` in ``torch.compile(..., fullgraph=True)``; the embedding, the final
#: norm and output projection and the optimizer step run eagerly).
_COMPILED_BLOCKS = ("attention", "mlp", "moe")
#: Collective axes issued from inside a compiled block: a DTensor TP redistribution
#: traced into the graph becomes a functional collective the wrapper calls
#: (``torch.ops._c10d_functional``); FSDP2's all-gathers and reduce-scatters run in its
#: module hooks outside the compiled blocks, pipeline sends and the expert all-to-all in
#: eager code.
_COMPILED_AXES = ("tp",)


def kernel_host_issue(kernel: costs.Kernel, mode: str) -> str:
    """How the CPU issues ``kernel``'s launches under ``host_issue`` ``mode``
    (``hardware.compute.HOST_ISSUE_S``'s key): ``compiled`` for the kernels of a
    transformer layer (:data:`_COMPILED_BLOCKS`) under ``compiled`` -- Inductor's generated
    wrapper calls each Triton kernel's launcher and each extern kernel (cuBLAS GEMM,
    flash attention) directly, without the Python op, autograd and dispatcher layers of
    an eager op (torch/_inductor/codegen/wrapper.py; AOTAutograd compiles the backward
    graph the same way) -- else ``eager``."""
    return "compiled" if mode == "compiled" and kernel.block in _COMPILED_BLOCKS else "eager"


def collective_host_issue(axis: str, mode: str) -> str:
    """How the CPU issues a collective of ``axis`` under ``host_issue`` ``mode``:
    ``compiled`` for the TP collectives inside torch.compile'd blocks
    (:data:`_COMPILED_AXES`), else ``eager``."""
    return "compiled" if mode == "compiled" and axis in _COMPILED_AXES else "eager"


def host_modules(kernel: costs.Kernel, phase: str, mode: str, local_experts: int, *,
                 layer_impl: str = "te") -> int:
    """Transformer Engine module calls of ``kernel``'s ``phase`` under ``host_issue``
    ``mode`` (each priced at ``hardware.compute.HOST_MODULE_S``) for layers built of
    ``layer_impl`` modules (:data:`strategies.plan.LAYER_IMPLS`). None for ``torch``: a
    ``torch.nn.Linear`` or Megatron ``local`` layer costs the CPU only its launches (TE
    issue 2053 measured the difference to ``te.Linear``). For ``te``: one for a TE linear
    layer's or fused attention's forward (``F``) and its autograd backward (``B``, ``I``;
    a deferred weight-gradient ``W`` is a bare GEMM), one per ``GroupedLinear`` call for
    the routed experts; none for the torch GEMMs of :data:`_NON_TE_MATMULS`, for other
    kernels, or where no launch is issued from the CPU."""
    if layer_impl != "te" or phase == "W" or not host_launches(kernel, phase, mode,
                                                               local_experts):
        return 0
    if kernel.kind == "attention" or (kernel.kind == "matmul"
                                      and kernel.name not in _NON_TE_MATMULS):
        return 1
    return 0


def compute_op(kernel: costs.Kernel, name: str, phase: str, *, attention_impl: str = "",
               deps: tuple[int, ...] = (), comm_sms: int = 0,
               host_launches: int = 0, host_calls: int = 0,
               host_modules: int = 0, host_issue: str = "eager") -> ComputeOp:
    """The op of ``kernel``'s work in ``phase`` (``F`` forward, ``B`` whole backward, ``I``
    input gradient, ``W`` weight gradient): its FLOPs and bytes for that phase, the GPU
    kernels it stands for (:attr:`strategies.model_costs.Kernel.launches`), the GEMMs of a
    grouped expert GEMM (its shape's first entry) and, for attention, the fused kernel
    ``attention_impl`` ("": the GPU's default)."""
    if phase == "F":
        flops, nbytes = kernel.fwd_flops, kernel.fwd_bytes
    elif phase == "B":
        flops = kernel.bwd_input_flops + kernel.bwd_weight_flops
        nbytes = kernel.bwd_input_bytes + kernel.bwd_weight_bytes
    elif phase == "I":
        flops, nbytes = kernel.bwd_input_flops, kernel.bwd_input_bytes
    else:
        flops, nbytes = kernel.bwd_weight_flops, kernel.bwd_weight_bytes
    launches = kernel.launches[0 if phase == "F" else 1]
    groups = kernel.shape[0] if kernel.expert and kernel.kind == "matmul" and kernel.shape else 1
    if groups > 1 and phase == "B":
        # the whole backward of a grouped expert GEMM is two grouped calls, the data and
        # the weight gradients (grouped_linear.py: two general_grouped_gemm calls), each a
        # round of per-expert GEMMs on the GPU (hardware.compute.ComputeModel.serial_launches)
        launches = 2 * max(1, launches)
    return ComputeOp(name=name, kind=kernel.kind, flops=flops, bytes=nbytes,
                     shape=tuple(kernel.shape), dtype=kernel.dtype, stream=COMPUTE, deps=deps,
                     comm_sms=comm_sms, phase=phase, launches=max(1, launches),
                     gemm_groups=max(1, int(groups)),
                     impl=attention_impl if kernel.kind == "attention" else "",
                     causal=kernel.causal, window=kernel.window,
                     host_launches=host_launches, host_calls=host_calls,
                     host_modules=host_modules, host_issue=host_issue)


#: MLA's up projections (what ``--recompute-modules mla_up_proj`` re-runs).
_MLA_UP_PROJECTIONS = ("attn.q_up", "attn.kv_up", "attn.q")
#: Recompute modules that re-run a whole block (with its communication: Megatron-Core
#: checkpoints the MLP / MoE submodule, dispatcher included) and the block they re-run.
_BLOCK_MODULES = {"mlp": "mlp", "moe": "moe"}


def recomputed(block: str, members: Sequence[costs.Kernel], modules: frozenset[str]
               ) -> tuple[list[costs.Kernel], bool]:
    """What selective recompute of ``modules`` (Megatron-Core ``--recompute-modules``,
    ``megatron/core/transformer/transformer_config.py``) re-runs of one block's kernels,
    and whether it re-runs the block as a whole (its TP/EP communication included).

    ``core_attn``: the attention core (the kernels marked ``selective_recompute``);
    ``layernorm``: the block's norm; ``moe_act``: the routed experts' activation;
    ``mla_up_proj``: MLA's up projections (their latent inputs are kept);
    ``mlp`` / ``moe``: the dense MLP / MoE block, its norm and residual left out unless
    ``layernorm`` asks for the norm."""
    whole = _BLOCK_MODULES.get(block) in modules
    chosen = []
    for kernel in members:
        if kernel.kind == "norm":
            keep = "layernorm" in modules
        elif whole:
            keep = not kernel.name.endswith(".residual")
        else:
            keep = ((kernel.selective_recompute and "core_attn" in modules)
                    or (kernel.name == "moe.experts.act" and "moe_act" in modules)
                    or (kernel.name.split(".quant")[0] in _MLA_UP_PROJECTIONS
                        and "mla_up_proj" in modules))
        if keep:
            chosen.append(kernel)
    return chosen, whole


def _scaled(kernel: costs.Kernel, factor: float) -> costs.Kernel:
    """A kernel doing ``factor`` of the work (one piece of ring attention)."""
    return replace(kernel, fwd_flops=kernel.fwd_flops * factor,
                   fwd_bytes=kernel.fwd_bytes * factor,
                   bwd_input_flops=kernel.bwd_input_flops * factor,
                   bwd_input_bytes=kernel.bwd_input_bytes * factor,
                   bwd_weight_flops=kernel.bwd_weight_flops * factor,
                   bwd_weight_bytes=kernel.bwd_weight_bytes * factor)


def early_stop_end(block: str, members: Sequence[costs.Kernel], *, dropout: bool,
                   aten_matmul: bool) -> int:
    """How many of a layer's last block's kernels (``members``, in forward order) a full
    recompute re-runs when it stops early, as PyTorch's non-reentrant checkpoint does
    from 2.1 on (torch/utils/checkpoint.py: the recompute's pack hook raises
    ``_StopRecomputationError`` once it has re-packed as many tensors as the forward saved;
    ``early_stop`` default True, pytorch PR #96866).

    What the recompute re-packs last is the last tensor the block's backward saved: in a
    dense MLP block (``block == "mlp"``) ending in the down projection and the residual add,
    the down projection's inputs. An ATen ``mm`` (``aten_matmul``: a plain
    ``torch.nn.Linear`` in 16-bit) saves its inputs *before* it runs (the generated
    autograd kernel, torch/csrc/autograd/generated/VariableType_*.cpp ``mm``, builds its
    ``SavedVariable`` s and so calls the pack hook before ``redispatch::mm``), so the
    recompute stops before that GEMM: ``index of the GEMM``. A custom autograd Function
    (Transformer Engine's linear, torchao's ``Float8Linear``) packs what
    ``ctx.save_for_backward`` named only after its forward returned, so the GEMM runs and
    only the residual add is left: ``index + 1``. The add saves nothing; with dropout the
    fused dropout-add saves its mask and runs too (every kernel: ``len(members)``), as does
    any other block (attention, MoE: the whole block re-runs).
    """
    if block != "mlp" or dropout:
        return len(members)
    matmuls = [i for i, kernel in enumerate(members) if kernel.kind == "matmul"]
    if not matmuls:
        return len(members)
    last = matmuls[-1]
    trailing = members[last + 1:]
    if not all(k.kind == "elementwise" and k.name.endswith(".residual") for k in trailing):
        return len(members)
    return last if aten_matmul else last + 1


def _blocks(kernels: Sequence[costs.Kernel]) -> list[tuple[str, list[costs.Kernel]]]:
    """Consecutive kernels grouped by block (attention, mlp, moe)."""
    blocks: list[tuple[str, list[costs.Kernel]]] = []
    for kernel in kernels:
        if blocks and blocks[-1][0] == kernel.block:
            blocks[-1][1].append(kernel)
        else:
            blocks.append((kernel.block, [kernel]))
    return blocks


def lower_step(model: ModelSpec, plan: ParallelPlan, distinct: Sequence[int] = (), *,
               mirrors: bool = False) -> StepLowering:
    """Lower one training step (see module docstring); ``distinct`` ranks
    (stragglers) are simulated individually; ``mirrors`` records the
    communication of the ranks left out (for the flow fidelity)."""
    return StepLowerer(model, plan).lower(distinct, mirrors=mirrors)
