"""What an MoE layer's token dispatcher moves: the collectives around the experts of one
layer, as Megatron-Core's dispatchers run them (``megatron/core/transformer/moe/
token_dispatcher.py``), sized for one micro-batch on one rank.

Each TP rank routes its own sequence shard: ``n`` tokens (``micro_batch * seq_len / cp /
tp`` under sequence parallelism), ``n * k`` token-expert pairs of ``h`` elements.

* ``alltoall`` (``MoEAlltoAllTokenDispatcher``): an all-to-all over the EP group moves
  every pair to the rank of its expert (``n * k * h`` elements per rank, the most loaded
  rank's share scaled by the routing load), then, with expert-TP > 1, an all-gather over
  the expert-TP group (``etp`` times that). The combine is the reverse: a reduce-scatter
  over expert-TP, then the all-to-all back.
* ``allgather`` (``MoEAllGatherTokenDispatcher``): every rank's tokens are all-gathered
  over the EP x expert-TP group (``etp * ep * n * h``; each rank then picks the pairs of
  its experts) and the outputs reduce-scattered back.
* ``deepep`` (``MoEFlexTokenDispatcher`` on DeepEP, DeepSeek-V3 report, arXiv 2412.19437,
  Section 3.2.2): a token crosses the network once per destination NVLink domain
  (:func:`strategies.expert_routing.expected_nodes_per_token`), to the GPU at its own
  position there (one rail), and NVLink forwards it to its experts; the two halves run
  together (pipelined). Modelled as an all-to-all over the rank's rail (the EP members at
  its position in each domain) beside an all-to-all over its domain's EP members. Inside
  one domain it is the plain all-to-all.

With ``fp8`` dispatch (DeepSeek-V3, Section 3.3.2; DeepEP's FP8 dispatch) a dispatched
element is 1 byte plus a fp32 scale per 128; the combine is bf16 (2 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies import expert_routing
from strategies.model_spec import ModelSpec
from strategies.plan import ParallelPlan, capacity_factor

#: Bytes per element of a dispatched bf16 / FP8 token (FP8: 1 byte + a fp32 scale per 128).
DISPATCH_BYTES = {False: 2.0, True: 1.0 + 4.0 / 128}
#: Bytes per element of the combine (bf16).
COMBINE_BYTES = 2.0


@dataclass(frozen=True)
class Transfer:
    """One collective of the dispatcher.

    Attributes:
        kind: ``alltoall``, ``all_gather`` or ``reduce_scatter``.
        group: the rank group it runs over: ``ep``, ``etp`` (expert-TP), ``ep_etp``
            (EP x expert-TP), ``ep_rail`` (EP members at the rank's position in every
            NVLink domain) or ``ep_local`` (EP members in the rank's domain).
        size_bytes: nccl-tests size (an all-to-all's whole send buffer, a gather's
            output), bytes.
        beside: runs at the same time as the transfer before it (DeepEP's halves).
    """

    kind: str
    group: str
    size_bytes: float
    beside: bool = False


@dataclass(frozen=True)
class EpShape:
    """How the EP group sits on the machine: ``domains`` NVLink domains of ``per_domain``
    members each (1 domain: all on NVLink)."""

    domains: int
    per_domain: int


def dispatch_transfers(*, dispatcher: str, tokens: float, top_k: int, hidden: int, ep: int,
                       etp: int, load: float, fp8: bool, shape: EpShape,
                       nodes_per_token: float) -> tuple[Transfer, ...]:
    """The dispatch of one layer's forward (module docstring).

    Args:
        dispatcher: ``alltoall``, ``allgather`` or ``deepep``.
        tokens: tokens the rank routes (its sequence shard).
        top_k: experts per token.
        hidden: model width ``h``.
        ep, etp: expert-parallel and expert tensor-parallel sizes.
        load: the most loaded rank's pairs relative to a balanced share
            (:func:`strategies.expert_routing.routed_load`).
        fp8: dispatch in FP8.
        shape: where the EP group's members sit.
        nodes_per_token: expected domains a token's experts occupy (deepep).

    Raises:
        ValueError: an unknown dispatcher.
    """
    element = DISPATCH_BYTES[bool(fp8)]
    pairs_bytes = tokens * top_k * hidden * element * load
    gathered = [Transfer("all_gather", "etp", etp * pairs_bytes)] if etp > 1 else []
    if dispatcher == "allgather":
        return (Transfer("all_gather", "ep_etp", etp * ep * tokens * hidden * element),)
    if dispatcher == "alltoall" or (dispatcher == "deepep" and shape.domains == 1):
        return (Transfer("alltoall", "ep", pairs_bytes), *gathered)
    if dispatcher == "deepep":
        domains = shape.domains
        remote = nodes_per_token * (domains - 1) / domains
        rail = Transfer("alltoall", "ep_rail",
                        tokens * remote * hidden * element * load * domains / (domains - 1))
        local = ([Transfer("alltoall", "ep_local", pairs_bytes, beside=True)]
                 if shape.per_domain > 1 else [])
        return (rail, *local, *gathered)
    raise ValueError(f"moe_dispatcher: {dispatcher!r} is not known; valid: alltoall, "
                     "allgather, deepep")


def combine_transfers(dispatch: tuple[Transfer, ...], fp8: bool) -> tuple[Transfer, ...]:
    """The combine mirrors the dispatch in reverse (gathers become reduce-scatters), in
    bf16."""
    scale = COMBINE_BYTES / DISPATCH_BYTES[bool(fp8)]
    swap = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
    out: list[Transfer] = []
    for transfer in reversed(dispatch):
        out.append(Transfer(swap.get(transfer.kind, transfer.kind), transfer.group,
                            transfer.size_bytes * scale))
    # concurrent halves stay concurrent: the later of a pair runs beside the earlier
    beside = [t.beside for t in dispatch][::-1]
    return tuple(Transfer(t.kind, t.group, t.size_bytes, beside=beside[i - 1] if i else False)
                 for i, t in enumerate(out))


def nodes_per_token(num_experts: int, top_k: int, domains: int, groups: int,
                    group_topk: int) -> float:
    """:func:`strategies.expert_routing.expected_nodes_per_token` over the EP group's
    domains (1 when it sits in one)."""
    if domains <= 1:
        return 1.0
    return expert_routing.expected_nodes_per_token(num_experts, top_k, domains, groups=groups,
                                                   group_topk=group_topk)


def plan_routed_load(model: ModelSpec, plan: ParallelPlan) -> expert_routing.RoutedLoad:
    """The routing the plan runs the model with: its ``moe_expert_load`` over the model's
    experts, its capacity factor (the model's when it names none: a MoESpec capacity pads
    every expert to it) and padding (:func:`strategies.expert_routing.routed_load`).
    Balanced (rows factor 1) for a dense model.

    Raises:
        ValueError: a load file that does not match the model's experts.
    """
    moe = model.moe
    if moe is None:
        return expert_routing.RoutedLoad(1.0, 0.0)
    fractions = expert_routing.expert_fractions(plan.moe_expert_load, moe.num_experts)
    if plan.moe_capacity_factor:
        factor, pad = capacity_factor(plan, moe.capacity_factor), plan.moe_pad_to_capacity
    else:
        factor = moe.capacity_factor if moe.capacity_factor > 0 else None
        pad = factor is not None or plan.moe_pad_to_capacity
    return expert_routing.routed_load(fractions, plan.ep, factor, pad)
