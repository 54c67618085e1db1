"""Static checks of a :class:`~strategies.ir.Program` before it is simulated or run.

:func:`check_program` rejects programs the engine (or real GPUs) could not
execute: malformed ops, references outside the world, collectives and
send/recv pairs that never match, and orderings that deadlock. Every problem
is reported as a :class:`ProgramError` whose message is one line naming the
rank, the op index and name, what is wrong and what would be valid.

All passes are iterative and linear in the number of ops (plus explicit deps
and group sizes), so programs with millions of ops check in seconds.

Happens-before model used for deadlock detection (the ordering rules of
:mod:`strategies.ir`):

* an op waits for the previous op of the same rank on the same stream;
* an op waits for every op listed in its ``deps``;
* a SendOp and its RecvOp complete together once both are reached (NCCL's
  send/recv is a rendezvous; the engine models it the same way);
* a CollectiveOp completes only once every member of its group has reached
  it, so each member waits for every other member's predecessors.
"""

from __future__ import annotations

import gc
import math
from typing import Iterable, Sequence

from strategies.ir import (
    COLLECTIVE_ALGORITHMS,
    COLLECTIVE_KINDS,
    COMPUTE_KINDS,
    CollectiveOp,
    ComputeOp,
    Program,
    RecvOp,
    SendOp,
)

__all__ = ["ProgramError", "check_program"]

_OP_TYPES = (ComputeOp, CollectiveOp, SendOp, RecvOp)
_ROOTED_KINDS = ("broadcast", "reduce")
# How many ops of a dependency cycle the error message spells out.
_MAX_CYCLE_REPORT = 16


class ProgramError(ValueError):
    """A Program that cannot be executed; the message is one line."""


def _where(rank: int, index: int, op: object) -> str:
    name = getattr(op, "name", None)
    label = f" {name!r}" if isinstance(name, str) else ""
    return f"rank {rank} op #{index}{label} ({type(op).__name__})"


def _fail(rank: int, index: int, op: object, problem: str) -> ProgramError:
    message = f"{_where(rank, index, op)}: {problem}"
    return ProgramError(" ".join(message.splitlines()))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_amount(value: object, rank: int, index: int, op: object, field: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise _fail(rank, index, op, f"{field}={value!r} is invalid; give a finite number >= 0")


def _check_peer(peer: object, rank: int, index: int, op: object, world_size: int) -> None:
    if not _is_int(peer) or not 0 <= peer < world_size:
        raise _fail(
            rank, index, op,
            f"peer={peer!r} is outside the world; give a rank in 0..{world_size - 1} other than {rank}",
        )
    if peer == rank:
        raise _fail(
            rank, index, op,
            f"peer={peer} is the rank itself; give a rank in 0..{world_size - 1} other than {rank}",
        )


def _check_collective(op: CollectiveOp, rank: int, index: int, world_size: int,
                      checked_groups: dict[int, tuple[Sequence[int], frozenset]] | None = None
                      ) -> None:
    if op.kind not in COLLECTIVE_KINDS:
        raise _fail(rank, index, op, f"kind={op.kind!r} is unknown; valid kinds: {', '.join(COLLECTIVE_KINDS)}")
    if op.algorithm not in COLLECTIVE_ALGORITHMS:
        raise _fail(
            rank, index, op,
            f"algorithm={op.algorithm!r} is unknown; valid algorithms: {', '.join(COLLECTIVE_ALGORITHMS)}",
        )
    _check_amount(op.size_bytes, rank, index, op, "size_bytes")
    # every member of a collective holds the same group object: its members are
    # checked once (keyed by identity, the group kept alive), so checking a
    # collective over n ranks costs O(n), not O(n^2)
    known = checked_groups.get(id(op.group)) if checked_groups is not None else None
    if known is not None and known[0] is op.group:
        seen = known[1]
        _check_member(op, rank, index, seen)
        return
    try:
        group = tuple(op.group)
    except TypeError:
        raise _fail(rank, index, op, f"group={op.group!r} is not a sequence of ranks; give a tuple of ranks") from None
    if not group:
        raise _fail(rank, index, op, f"group is empty (key {op.key!r}); give the ranks taking part, including {rank}")
    seen: set[int] = set()
    for member in group:
        if not _is_int(member) or not 0 <= member < world_size:
            raise _fail(
                rank, index, op,
                f"group member {member!r} (key {op.key!r}) is outside the world; group ranks must be in 0..{world_size - 1}",
            )
        if member in seen:
            raise _fail(
                rank, index, op,
                f"group {_short(group)} (key {op.key!r}) lists rank {member} twice; give each rank once",
            )
        seen.add(member)
    if checked_groups is not None:
        checked_groups[id(op.group)] = (op.group, frozenset(seen))
    _check_member(op, rank, index, seen)


def _check_member(op: CollectiveOp, rank: int, index: int, seen: frozenset | set) -> None:
    """The rank issuing ``op`` and its root belong to its (checked) group."""
    group = op.group
    if rank not in seen:
        raise _fail(
            rank, index, op,
            f"rank {rank} holds collective key {op.key!r} but is not in its group {_short(group)}; "
            "only group members may issue it",
        )
    if op.kind in _ROOTED_KINDS:
        if op.root is None:
            raise _fail(rank, index, op, f"{op.kind} needs a root; give root= one of the group {_short(group)}")
        if op.root not in seen:
            raise _fail(
                rank, index, op,
                f"root={op.root!r} is not in the group {_short(group)}; give root= one of the group",
            )


def _short(group: Sequence[int]) -> str:
    """A group for a one-line message: all ranks if few, else the ends and the size."""
    members = tuple(group)
    if len(members) <= 8:
        return str(members)
    return f"({members[0]}, {members[1]}, ..., {members[-1]}) [{len(members)} ranks]"


def _check_deps(deps: object, rank: int, index: int, op: object) -> None:
    try:
        items = tuple(deps)  # type: ignore[arg-type]
    except TypeError:
        raise _fail(rank, index, op, f"deps={deps!r} is not a sequence; give a tuple of op indices") from None
    for dep in items:
        if not _is_int(dep) or not 0 <= dep < index:
            valid = f"0..{index - 1}" if index > 0 else "none (op #0 can have no deps)"
            raise _fail(
                rank, index, op,
                f"dep {dep!r} is not an earlier op of rank {rank}; deps must be indices in {valid}",
            )


_NUMBER_TYPES = (int, float)
_INF = math.inf
_COMPUTE_KINDS = frozenset(COMPUTE_KINDS)


def _check_local(
    rank: int,
    ops: Sequence[object],
    world_size: int,
    collective_ops: list[tuple[int, int, CollectiveOp]],
    p2p_ops: list[tuple[int, int, SendOp | RecvOp]],
    checked_groups: dict | None = None,
) -> None:
    """Check each op on its own; collect collectives and sends/recvs for matching."""
    # Fast paths (exact types, plain comparisons) keep this loop cheap for
    # millions of ops; anything unusual falls through to the full checks.
    for index, op in enumerate(ops):
        cls = type(op)
        if cls is ComputeOp:
            if op.kind not in _COMPUTE_KINDS:
                raise _fail(rank, index, op, f"kind={op.kind!r} is unknown; valid kinds: {', '.join(COMPUTE_KINDS)}")
            flops, nbytes = op.flops, op.bytes
            if not (type(flops) in _NUMBER_TYPES and 0 <= flops < _INF):
                _check_amount(flops, rank, index, op, "flops")
            if not (type(nbytes) in _NUMBER_TYPES and 0 <= nbytes < _INF):
                _check_amount(nbytes, rank, index, op, "bytes")
        elif cls is SendOp or cls is RecvOp:
            peer, size = op.peer, op.size_bytes
            if not (type(peer) is int and 0 <= peer < world_size and peer != rank):
                _check_peer(peer, rank, index, op, world_size)
            if not (type(size) in _NUMBER_TYPES and 0 <= size < _INF):
                _check_amount(size, rank, index, op, "size_bytes")
            p2p_ops.append((rank, index, op))
        elif isinstance(op, CollectiveOp):
            _check_collective(op, rank, index, world_size, checked_groups)
            collective_ops.append((rank, index, op))
        elif isinstance(op, ComputeOp):
            if op.kind not in _COMPUTE_KINDS:
                raise _fail(rank, index, op, f"kind={op.kind!r} is unknown; valid kinds: {', '.join(COMPUTE_KINDS)}")
            _check_amount(op.flops, rank, index, op, "flops")
            _check_amount(op.bytes, rank, index, op, "bytes")
        elif isinstance(op, (SendOp, RecvOp)):
            _check_peer(op.peer, rank, index, op, world_size)
            _check_amount(op.size_bytes, rank, index, op, "size_bytes")
            p2p_ops.append((rank, index, op))
        else:
            raise _fail(
                rank, index, op,
                f"{type(op).__name__} is not an op; give ComputeOp, CollectiveOp, SendOp or RecvOp",
            )
        deps = op.deps
        if deps:
            if type(deps) is tuple:
                for dep in deps:
                    if type(dep) is not int or not 0 <= dep < index:
                        _check_deps(deps, rank, index, op)
            else:
                _check_deps(deps, rank, index, op)


def _signature(op: CollectiveOp) -> tuple:
    return (op.kind, tuple(op.group), op.size_bytes, op.algorithm, op.dtype, op.root)


_SIGNATURE_FIELDS = ("kind", "group", "size_bytes", "algorithm", "dtype", "root")


def _check_collectives(
    collective_ops: list[tuple[int, int, CollectiveOp]], ops_by_rank: dict[int, Sequence[object]],
    reduced: bool = False,
) -> dict:
    """Match collectives by key; return ``{key: [(rank, index), ...]}``.

    ``collective_ops`` must be grouped by rank (as :func:`_check_local` emits them).
    """
    members: dict[object, list[tuple[int, int]]] = {}
    for rank, index, op in collective_ops:
        try:
            holders = members.setdefault(op.key, [])
        except TypeError:
            raise _fail(rank, index, op, f"key={op.key!r} is not hashable; give a string key") from None
        if holders and holders[-1][0] == rank:
            first = holders[-1][1]
            raise _fail(
                rank, index, op,
                f"rank {rank} issues collective key {op.key!r} twice (also op #{first}); "
                "give each collective instance its own key",
            )
        holders.append((rank, index))
    for key, holders in members.items():
        ref_rank, ref_index = holders[0]
        ref = ops_by_rank[ref_rank][ref_index]
        ref_sig = _signature(ref)
        for rank, index in holders[1:]:
            op = ops_by_rank[rank][index]
            if op is ref:
                continue
            sig = _signature(op)
            if sig != ref_sig:
                field = next(f for f, a, b in zip(_SIGNATURE_FIELDS, sig, ref_sig) if a != b)
                raise _fail(
                    rank, index, op,
                    f"collective key {key!r} has {field}={sig[_SIGNATURE_FIELDS.index(field)]!r} but "
                    f"{_where(ref_rank, ref_index, ref)} has {field}={ref_sig[_SIGNATURE_FIELDS.index(field)]!r}; "
                    "all members of a collective must agree on kind, group, size_bytes, algorithm, dtype and root",
                )
        issued = {rank for rank, _ in holders}
        for member in ref.group:
            # A reduced program (Program.represents) lists one rank per class:
            # absent members behave like their representative.
            if member not in issued and (not reduced or member in ops_by_rank):
                raise _fail(
                    ref_rank, ref_index, ref,
                    f"unmatched collective: key {key!r} has group {tuple(ref.group)} but rank {member} never "
                    f"issues it; every group member must issue a CollectiveOp with key {key!r}",
                )
    return members


def _check_p2p(
    p2p_ops: list[tuple[int, int, SendOp | RecvOp]], ops_by_rank: dict[int, Sequence[object]]
) -> dict[tuple[int, int], tuple[int, int]]:
    """Match sends with recvs; return ``{(recv rank, index): (send rank, index)}``."""
    sends: dict[tuple, tuple[int, int]] = {}
    recvs: dict[tuple, tuple[int, int]] = {}
    for rank, index, op in p2p_ops:
        if isinstance(op, SendOp):
            table, triple, what = sends, (rank, op.peer, op.tag), "send to"
        else:
            table, triple, what = recvs, (op.peer, rank, op.tag), "recv from"
        try:
            previous = table.get(triple)
        except TypeError:
            raise _fail(rank, index, op, f"tag={op.tag!r} is not hashable; give a string tag") from None
        if previous is not None:
            raise _fail(
                rank, index, op,
                f"duplicate {what} rank {op.peer} with tag {op.tag!r} (also op #{previous[1]}); "
                "tags must be unique per (src, dst) pair",
            )
        table[triple] = (rank, index)
    matched: dict[tuple[int, int], tuple[int, int]] = {}
    for (src, dst, tag), (rank, index) in sends.items():
        op = ops_by_rank[rank][index]
        hit = recvs.get((src, dst, tag))
        if hit is None:
            raise _fail(
                rank, index, op,
                f"unmatched send: sends tag {tag!r} to rank {dst} but rank {dst} has no RecvOp with "
                f"peer={src}, tag={tag!r}; add exactly one such RecvOp on rank {dst}",
            )
        recv = ops_by_rank[hit[0]][hit[1]]
        if recv.size_bytes != op.size_bytes:
            raise _fail(
                rank, index, op,
                f"send of tag {tag!r} to rank {dst} has size_bytes={op.size_bytes!r} but its recv "
                f"{_where(hit[0], hit[1], recv)} has size_bytes={recv.size_bytes!r}; "
                "a send and its recv must have the same size_bytes",
            )
        matched[hit] = (rank, index)
    if len(matched) != len(recvs):
        for (src, dst, tag), (rank, index) in recvs.items():
            if (rank, index) not in matched:
                raise _fail(
                    rank, index, ops_by_rank[rank][index],
                    f"unmatched recv: receives tag {tag!r} from rank {src} but rank {src} has no SendOp with "
                    f"peer={dst}, tag={tag!r}; add exactly one such SendOp on rank {src}",
                )
    return matched


def _check_deadlock(
    ranks: list[int],
    ops_by_rank: dict[int, Sequence[object]],
    collectives: dict,
    recv_to_send: dict[tuple[int, int], tuple[int, int]],
) -> None:
    """Run a Kahn-style topological pass over the happens-before graph.

    Edges are implicit (computed from the program), so memory stays linear in
    the number of ops. Collectives are handled as a barrier: a member
    "arrives" when its own predecessors are done, and all members complete
    together once every member has arrived.
    """
    offsets: dict[int, int] = {}
    rank_of: list[int] = []
    total = 0
    for rank in ranks:
        offsets[rank] = total
        n = len(ops_by_rank[rank])
        rank_of.extend([rank] * n)
        total += n
    if total == 0:
        return

    flat: list[object] = []
    for rank in ranks:
        flat.extend(ops_by_rank[rank])

    indeg = [0] * total
    next_on_stream = [-1] * total
    prev_on_stream = [-1] * total
    dependents: list[list[int] | None] = [None] * total
    for rank in ranks:
        base = offsets[rank]
        last: dict[str, int] = {}
        for index, op in enumerate(ops_by_rank[rank]):
            gid = base + index
            stream = op.stream
            prev = last.get(stream)
            if prev is not None:
                next_on_stream[prev] = gid
                prev_on_stream[gid] = prev
                indeg[gid] += 1
            last[stream] = gid
            deps = op.deps
            if deps:
                for dep in deps:
                    lst = dependents[base + dep]
                    if lst is None:
                        dependents[base + dep] = [gid]
                    else:
                        lst.append(gid)
                indeg[gid] += len(deps)

    # Collective instances and send/recv pairs both meet: every member must
    # arrive before any completes (NCCL's send/recv is a rendezvous, as in the
    # engine). gid -> instance id; instance -> member gids and a label.
    coll_of = [-1] * total
    coll_members: list[list[int]] = []
    coll_label: list[str] = []
    for key, holders in collectives.items():
        gids = [offsets[r] + i for r, i in holders]
        cid = len(coll_members)
        coll_members.append(gids)
        coll_label.append(f"collective {key!r} to be reached by")
        for gid in gids:
            coll_of[gid] = cid
    for (rr, ri), (sr, si) in recv_to_send.items():
        gids = [offsets[sr] + si, offsets[rr] + ri]
        cid = len(coll_members)
        coll_members.append(gids)
        coll_label.append("its send/recv partner to be reached by")
        for gid in gids:
            coll_of[gid] = cid
    arrived = [0] * len(coll_members)

    done = [False] * total
    ready = [gid for gid in range(total) if indeg[gid] == 0]
    finished = 0

    while ready:
        gid = ready.pop()
        cid = coll_of[gid]
        if cid < 0:
            completed: Iterable[int] = (gid,)
        else:
            arrived[cid] += 1
            members = coll_members[cid]
            if arrived[cid] < len(members):
                continue
            completed = members
        for g in completed:
            done[g] = True
            finished += 1
            nxt = next_on_stream[g]
            if nxt >= 0:
                indeg[nxt] -= 1
                if indeg[nxt] == 0:
                    ready.append(nxt)
            succ = dependents[g]
            if succ is not None:
                for s in succ:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        ready.append(s)
    if finished == total:
        return

    # Some ops never became ready: walk "waits for" links backwards from a
    # stuck op. Every stuck op waits for at least one other stuck op, so the
    # walk must revisit an op; the revisited stretch is a cycle.
    def waits_for(gid: int) -> tuple[int, str]:
        cid = coll_of[gid]
        if cid >= 0 and indeg[gid] == 0:
            for other in coll_members[cid]:
                if indeg[other] > 0:
                    return other, coll_label[cid]
        prev = prev_on_stream[gid]
        if prev >= 0 and not done[prev]:
            return prev, f"the previous op on stream {flat[gid].stream!r}"
        base = offsets[rank_of[gid]]
        for dep in flat[gid].deps:
            if not done[base + dep]:
                return base + dep, "an explicit dep"
        raise AssertionError("stuck op with nothing to wait for")  # pragma: no cover

    start = next(g for g in range(total) if not done[g])
    position: dict[int, int] = {}
    path: list[tuple[int, str]] = []
    gid = start
    while gid not in position:
        position[gid] = len(path)
        nxt, why = waits_for(gid)
        path.append((gid, why))
        gid = nxt
    cycle = path[position[gid]:]

    def describe(g: int) -> str:
        rank = rank_of[g]
        return _where(rank, g - offsets[rank], flat[g])

    links = [f"{describe(g)} waits for {why}:" for g, why in cycle[:_MAX_CYCLE_REPORT]]
    if len(cycle) > _MAX_CYCLE_REPORT:
        links.append(f"... ({len(cycle) - _MAX_CYCLE_REPORT} more ops) ...")
    links.append(describe(cycle[0][0]))
    raise ProgramError(
        " ".join(
            (
                f"deadlock: dependency cycle of {len(cycle)} ops: {' '.join(links)}; "
                "reorder the ops (issue collectives in the same order on every member, issue each send "
                "before the recv it unblocks), move ops to other streams, or drop a dep so that the "
                "happens-before graph is acyclic"
            ).splitlines()
        )
    )


def check_program(program: Program, *, world_size: int | None = None) -> None:
    """Check that ``program`` is well formed and can run without deadlock.

    Args:
        program: the Program to check.
        world_size: number of ranks available (e.g. a cluster's GPU count);
            defaults to ``program.world_size``. Every rank key, group member,
            root and peer must lie in ``0..world_size-1``.

    Raises:
        ProgramError: on the first problem found, with a one-line message
            naming the rank, the op index and name, the problem and what
            would be valid. Checks run in this order: rank keys; each op on
            its own (type, kind, algorithm, sizes, group, root, peer, deps);
            collective matching by key; send/recv matching by (src, dst,
            tag); deadlock (a cycle in the happens-before graph).
    """
    if world_size is None:
        world_size = program.world_size
    if not _is_int(world_size) or world_size < 1:
        raise ProgramError(f"world_size={world_size!r} is invalid; give a positive number of ranks")

    ops_by_rank = program.ops_by_rank
    for rank in ops_by_rank:
        if not _is_int(rank) or not 0 <= rank < world_size:
            raise ProgramError(
                f"rank {rank!r}: rank key is outside the world; ops_by_rank keys must be ranks in "
                f"0..{world_size - 1} (world_size={world_size})"
            )
    ranks = sorted(ops_by_rank)
    # Materialise each rank's ops once (Sequence may be lazy or costly to index).
    ops: dict[int, Sequence[object]] = {
        rank: seq if isinstance(seq, (list, tuple)) else list(seq) for rank, seq in ops_by_rank.items()
    }
    # The passes allocate millions of small acyclic objects; pausing the
    # cyclic garbage collector avoids repeated full scans (about 40% faster).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        collective_ops: list = []
        p2p_ops: list = []
        checked_groups: dict = {}
        for rank in ranks:
            _check_local(rank, ops[rank], world_size, collective_ops, p2p_ops, checked_groups)
        collectives = _check_collectives(collective_ops, ops,
                                         reduced=program.represents is not None)
        recv_to_send = _check_p2p(p2p_ops, ops)
        _check_deadlock(ranks, ops, collectives, recv_to_send)
    finally:
        if gc_was_enabled:
            gc.enable()
