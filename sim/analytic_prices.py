"""What the closed-form step model (:mod:`sim.analytic_step`) prices once for many plans.

A sweep or a plan search evaluates thousands of plans that share their parts: the
same layer kind at the same shape on the same groups, the same gradient bucket on the
same data-parallel group, the same optimizer shard. :class:`SharedPrices` keeps those
prices for one cost model (:class:`sim.analytic_step.PricingCache` holds one per job
shape), keyed by everything each is computed from, so a plan finds what another
already priced and gets the value it would have computed itself.

The plan's part of a key is a projection of its fields: every field but those listed
here as not read by that price. A field a price starts to read must leave its list
(tests/test_analytic_sharing.py evaluates plans that differ in each listed field with
and without sharing and compares the results).
"""

from __future__ import annotations

from operator import attrgetter

from strategies.model_spec import ModelSpec
from strategies.plan import PLAN_FIELDS

__all__ = ["SharedPrices", "part_recomputes", "plan_fields"]


class SharedPrices:
    """Prices one cost model gives the same for every plan that asks, kept across plans:
    a layer's or edge's list schedule in one phase, a gradient bucket's reduction, a
    layer's parameter gather, a rank's optimizer step
    (:class:`sim.analytic_step.AnalyticStepModel` says what each key holds). Every key
    names everything its value is computed from (the model, the plan fields the
    lowering reads for it, the part, the groups), so a value is the one the plan would
    compute itself: sharing changes no result, only how often it is computed.

    Bounded: past ``max_entries`` values the table starts again (values are recomputed
    on demand). Models are interned (:meth:`model_key`) so keys hold a small id, and
    each interned model is kept alive with the table (an id is never reused while
    its key can be looked up).

    Args:
        max_entries: values kept before the table is cleared.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._values: dict[tuple, object] = {}
        self._models: dict[ModelSpec, ModelSpec] = {}

    def model_key(self, model: ModelSpec) -> int:
        """A small key for ``model``: equal specs (a worker unpickles one per chunk) get
        the same key."""
        return id(self._models.setdefault(model, model))

    def get(self, key: tuple) -> object | None:
        """The value stored under ``key``, or None."""
        return self._values.get(key)

    def put(self, key: tuple, value: object) -> None:
        """Store ``value`` (immutable once stored: callers must not change it)."""
        if len(self._values) >= self.max_entries:
            self._values.clear()
        self._values[key] = value


#: Plan fields the ops of one layer or edge in one phase (StepLowerer.phase_ops) do not
#: read: they set how many micro-batches, stages, buckets and shards there are, not a
#: part's kernels and TP/CP/EP communication (recompute_layers reaches a part through
#: its recompute mode, which is keyed on its own; the groups are keyed on their own).
#: grad_reduce_dtype is read: with xla_scan_carry_copies a layer's backward copies its
#: unreduced gradients in that dtype (StepLowerer._carry_copy); dp and zero are not,
#: because the plan only allows those copies with zero 3 over dp*cp > 1. amax_reduction and
#: tp_only_amax_red decide whether there is an amax part and its group, keyed on its own
#: (its bytes and group: AnalyticStepModel._kind_cost); no layer or edge reads them.
_NOT_IN_PARTS = frozenset({
    "dp", "pp", "vpp", "global_batch", "zero", "schedule", "grad_bucket_bytes",
    "overlap_grad_reduce", "overlap_param_gather", "layers_per_stage",
    "optimizer_impl", "store_param_remainders", "fsdp_fp32_params", "activation_offload_layers",
    "recompute_layers", "dp_mode", "ps_servers", "ps_placement", "staleness", "ps_steps",
    "grad_reduce_every_microbatch", "dp_shard", "amax_reduction", "tp_only_amax_red"})
#: Plan fields the optimizer step of a rank (StepLowerer.optimizer_ops) and a layer's
#: parameter gather (StepLowerer.param_gather_op: its kernels' parameters) do not read
#: (its layers, embedding and head are keyed on their own; the tokens of a micro-batch,
#: micro_batch and seq_len, shape activations, never the parameters it updates; the
#: schedule and vpp place the layers, which are keyed, and the copies of a chunk, which
#: the groups key holds; the amax all-reduce is no part of the optimizer step).
_NOT_IN_OPTIMIZER = frozenset({
    "schedule", "vpp",
    "global_batch", "micro_batch", "seq_len", "recompute", "recompute_layers",
    "recompute_modules",
    "grad_bucket_bytes", "overlap_grad_reduce", "tp_comm_overlap", "attention_impl",
    "cross_entropy", "activation_offload_layers", "grad_reduce_every_microbatch",
    "recompute_early_stop", "xla_scan_carry_copies", "amax_reduction", "tp_only_amax_red"})
#: Plan fields only a recompute reads (StepLowerer._recompute, from a layer's B and I
#: phases): a layer's forward (F) and weight gradients (W), the embedding and the head in
#: every phase run the same ops whatever they say, so their prices are keyed without them
#: (the ``part_no_recompute`` fields; tests/test_analytic_sharing.py compares the ops).
_RECOMPUTE_FIELDS = frozenset({"recompute", "recompute_modules", "recompute_early_stop"})
#: What places a rank's groups and picks what runs on its data-parallel group: the
#: sizes and order of the axes, the ZeRO stage (reduction kind, parameter gathers) and
#: the parameter-gather overlap.
_GROUP_FIELDS = ("tp", "cp", "dp", "pp", "ep", "order", "zero", "overlap_param_gather",
                 "dp_mode", "dp_shard")
_GETTERS = {
    "part": attrgetter(*(f.name for f in PLAN_FIELDS if f.name not in _NOT_IN_PARTS)),
    "part_no_recompute": attrgetter(*(f.name for f in PLAN_FIELDS
                                      if f.name not in _NOT_IN_PARTS | _RECOMPUTE_FIELDS)),
    "optimizer": attrgetter(*(f.name for f in PLAN_FIELDS if f.name not in _NOT_IN_OPTIMIZER)),
    "groups": attrgetter(*_GROUP_FIELDS),
}


def plan_fields(plan, which: str) -> tuple:
    """The fields of ``plan`` a ``part`` (one layer or edge in one phase; a phase that
    recomputes nothing: ``part_no_recompute``, :func:`part_recomputes`), ``optimizer``
    (a rank's optimizer step) or ``groups`` (a rank's groups and what runs on its
    data-parallel group) price reads, as a tuple."""
    return _GETTERS[which](plan)


def part_recomputes(part: object, comp: str) -> bool:
    """Whether the ops of ``part`` (a layer index, or ``"embedding"`` / ``"head"``) in
    phase ``comp`` (F, B, I, W) read the plan's recompute fields: only a layer's B and I
    (StepLowerer.phase_ops recomputes before them); the others' prices are keyed by the
    ``part_no_recompute`` fields and no recompute mode."""
    return comp in ("B", "I") and not isinstance(part, str)


def amax_price_key(plain_key: tuple, kind: object, comp: str, nbytes: int,
                   group_key: object) -> tuple:
    """The shared-price key of a stage's amax all-reduce part (strategies.lowering
    AMAX_PART) in phase ``comp``: the ``part_no_recompute`` key of the plan, the part's
    bytes on that pipeline rank and its amax group's :func:`hardware.cost.group_price_key`
    -- what the closed form (sim.analytic_step) and the batch evaluator
    (sim.analytic_batch) both price it under."""
    return (plain_key, kind, comp, nbytes, group_key)

