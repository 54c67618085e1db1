"""Where a real router sends tokens: per-expert load, capacity and dropped tokens, and the
nodes a token's experts live on.

Arithmetic on routing statistics only (no durations); the lowering turns it into the
rows of the expert GEMMs and the bytes of the dispatch (strategies.lowering).

* **Load.** ``fractions[e]`` is the share of a rank's token-expert pairs routed to expert
  ``e``: ``uniform`` (a perfectly balanced router, what an auxiliary loss or DeepSeek's
  bias term aims at), ``zipf:<s>`` (expert ``e`` gets a share proportional to
  ``(e + 1)^-s``: the experts are ranked by popularity in index order, so with
  Megatron-Core's contiguous placement of experts on EP ranks the first EP rank holds
  the hottest ones — the pessimistic case) or a file of measured token counts per
  expert (numbers separated by commas or white space, one per expert, in expert order;
  lines starting with ``#`` are comments).
* **Capacity** (Megatron-Core ``--moe-expert-capacity-factor``, ``megatron/core/
  transformer/moe/moe_utils.py`` ``get_capacity``): each source rank keeps at most
  ``cf * n * k / E`` pairs per expert (``n`` its tokens, ``k`` top-k) and drops the
  rest; with ``--moe-pad-expert-input-to-capacity`` every expert receives exactly that
  many (padded); dropless routing keeps everything.
* **The slowest rank.** The expert GEMMs of the EP rank with the most pairs (its
  ``E / ep`` consecutive experts) and its share of the all-to-all set the pace: every
  rank waits for it at the combine. :func:`routed_load` gives its rows relative to a
  balanced share.
* **Nodes per token** (DeepEP's dispatch sends a token once to every node that holds
  one of its experts and forwards it over NVLink there; DeepSeek-V3 report, arXiv
  2412.19437, Section 3.2.2): :func:`expected_nodes_per_token`, with group-limited
  routing capping the nodes (DeepSeek-V3: 8 groups, 4 per token, one group per node).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

#: Load distributions a plan names (besides a file path).
EXPERT_LOAD_KINDS = ("uniform", "zipf:<s>", "<file of token counts per expert>")


def check_expert_load_spec(spec: str) -> None:
    """Check ``spec`` without knowing the model (``uniform``, ``zipf:<s>`` with ``s >= 0``,
    or an existing file).

    Raises:
        ValueError: one line naming ``moe_expert_load``, the value and what is valid.
    """
    _kind_of(spec)


def _kind_of(spec: str) -> tuple[str, float | Path | None]:
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"moe_expert_load: {spec!r} is not valid; valid: "
                         f"{', '.join(EXPERT_LOAD_KINDS)}")
    if spec == "uniform":
        return "uniform", None
    if spec.startswith("zipf:"):
        try:
            exponent = float(spec[5:])
        except ValueError:
            exponent = -1.0
        if not exponent >= 0 or math.isinf(exponent):
            raise ValueError(f"moe_expert_load: {spec!r} is not valid; give zipf:<s> with a "
                             "finite exponent s >= 0, e.g. zipf:1.0")
        return "zipf", exponent
    path = Path(os.path.expanduser(spec))
    if not path.is_file():
        raise ValueError(f"moe_expert_load: {spec!r} is neither uniform, zipf:<s> nor an "
                         "existing file of token counts per expert")
    return "file", path


def expert_fractions(spec: str, num_experts: int) -> tuple[float, ...]:
    """Share of the token-expert pairs each expert receives (sums to 1; module docstring).

    Raises:
        ValueError: a bad spec, a file that is not ``num_experts`` non-negative numbers
            with a positive sum.
    """
    kind, value = _kind_of(spec)
    if kind == "uniform":
        return (1.0 / num_experts,) * num_experts
    if kind == "zipf":
        weights = [(e + 1) ** -value for e in range(num_experts)]
    else:
        weights = _read_counts(value, num_experts)
    total = sum(weights)
    return tuple(w / total for w in weights)


def _read_counts(path: Path, num_experts: int) -> list[float]:
    text = path.read_text(encoding="utf-8")
    words = [w for line in text.splitlines() if not line.lstrip().startswith("#")
             for w in line.replace(",", " ").split()]
    try:
        counts = [float(w) for w in words]
    except ValueError:
        raise ValueError(f"moe_expert_load: {str(path)!r} holds something other than "
                         "numbers; give one token count per expert") from None
    if len(counts) != num_experts or any(not c >= 0 or math.isinf(c) for c in counts) \
            or not sum(counts) > 0:
        raise ValueError(f"moe_expert_load: {str(path)!r} has {len(counts)} counts; give "
                         f"{num_experts} non-negative token counts (one per expert) with a "
                         "positive sum")
    return counts


@dataclass(frozen=True)
class RoutedLoad:
    """What routing leaves the most loaded expert-parallel rank.

    Attributes:
        rows_factor: token-expert pairs its local experts process, relative to a
            balanced rank's (``n * k`` pairs of each EP rank's ``n`` tokens): 1 balanced;
            the capacity factor when padded to capacity; ``ep * max_i L_i`` dropless with
            ``L_i`` rank ``i``'s share of the pairs.
        dropped_fraction: share of all token-expert pairs dropped by the capacity.
    """

    rows_factor: float
    dropped_fraction: float


def routed_load(fractions: tuple[float, ...], ep: int, capacity_factor: float | None,
                pad_to_capacity: bool) -> RoutedLoad:
    """The most loaded EP rank's rows (module docstring: capacity and the slowest rank).

    Args:
        fractions: :func:`expert_fractions`.
        ep: expert-parallel size (divides the experts; rank ``i`` holds experts
            ``i*E/ep .. (i+1)*E/ep - 1``, Megatron-Core's placement).
        capacity_factor: None for dropless routing.
        pad_to_capacity: every expert processes its full capacity.

    Raises:
        ValueError: ``ep`` not dividing the experts, a capacity factor <= 0, or padding
            without a capacity.
    """
    experts = len(fractions)
    if ep < 1 or experts % ep:
        raise ValueError(f"ep: {ep} does not divide the {experts} experts")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"moe_capacity_factor: {capacity_factor!r} is not valid; give a "
                         "number > 0, or dropless")
    if pad_to_capacity and capacity_factor is None:
        raise ValueError("moe_pad_to_capacity: padding needs a capacity factor; give "
                         "moe_capacity_factor too, or moe_pad_to_capacity false")
    if capacity_factor is None:
        kept = list(fractions)
    elif pad_to_capacity:
        return RoutedLoad(capacity_factor,
                          sum(max(0.0, f - capacity_factor / experts) for f in fractions))
    else:
        kept = [min(f, capacity_factor / experts) for f in fractions]
    local = experts // ep
    busiest = max(sum(kept[i * local:(i + 1) * local]) for i in range(ep))
    return RoutedLoad(ep * busiest, max(0.0, 1.0 - sum(kept)))


def expected_nodes_per_token(num_experts: int, top_k: int, nodes: int, *, groups: int = 0,
                             group_topk: int = 0) -> float:
    """Expected number of distinct nodes holding a token's ``top_k`` experts, with the
    experts spread evenly over ``nodes`` nodes (``num_experts / nodes`` each) and a
    router picking uniformly; with group-limited routing (``group_topk`` of ``groups``
    groups, each node holding ``groups / nodes`` whole groups) the token first picks its
    groups, then its experts among theirs. Exact (hypergeometric) expectations.

    Raises:
        ValueError: sizes that do not divide, or ``top_k`` above the experts it may use.
    """
    if nodes < 1 or num_experts % nodes:
        raise ValueError(f"nodes: {nodes} does not divide the {num_experts} experts")
    per_node = num_experts // nodes
    limited = groups > 0 and 0 < group_topk < groups and groups % nodes == 0
    if not limited:
        if top_k > num_experts:
            raise ValueError(f"top_k: {top_k} exceeds the {num_experts} experts")
        missed = math.comb(num_experts - per_node, top_k) / math.comb(num_experts, top_k)
        return nodes * (1.0 - missed)
    if num_experts % groups:
        raise ValueError(f"groups: {groups} does not divide the {num_experts} experts")
    per_group = num_experts // groups
    pool = group_topk * per_group
    if top_k > pool:
        raise ValueError(f"top_k: {top_k} exceeds the {pool} experts of {group_topk} groups")
    own = groups // nodes  # groups on one node
    hit = 0.0
    for chosen in range(0, min(own, group_topk) + 1):
        p_groups = (math.comb(own, chosen) * math.comb(groups - own, group_topk - chosen)
                    / math.comb(groups, group_topk))
        p_miss = math.comb(pool - chosen * per_group, top_k) / math.comb(pool, top_k)
        hit += p_groups * (1.0 - p_miss)
    return nodes * hit
