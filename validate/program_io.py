"""A Program as JSON, so a replay, its measurements and the comparison share one file.

Format (``trainsim-program`` version 1)::

    {"format": "trainsim-program", "version": 1, "name": ..., "world_size": N,
     "represents": null | {"rank": count}, "metadata": {...},
     "ranks": {"0": [{"type": "compute", "name": ..., ...}, ...], ...}}

Op objects carry their dataclass fields (tuples as lists) and ``type`` one of
``compute``, ``collective``, ``send``, ``recv``. Metadata values that are not JSON
(a ParallelPlan) are stored as their dataclass dict or ``repr``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp

FORMAT = "trainsim-program"
VERSION = 1
_TYPES = {"compute": ComputeOp, "collective": CollectiveOp, "send": SendOp, "recv": RecvOp}
_NAMES = {cls: name for name, cls in _TYPES.items()}
_TUPLE_FIELDS = ("shape", "deps", "group")
_HINTS = {cls: typing.get_type_hints(cls) for cls in _TYPES.values()}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def program_to_dict(program: Program) -> dict:
    """A JSON-serialisable dict of ``program`` (see the module docstring)."""
    ranks = {}
    for rank in program.ranks():
        ops = []
        for op in program.ops_by_rank[rank]:
            entry = {"type": _NAMES[type(op)]}
            entry.update({f.name: _plain(getattr(op, f.name)) for f in dataclasses.fields(op)})
            ops.append(entry)
        ranks[str(rank)] = ops
    return {"format": FORMAT, "version": VERSION, "name": program.name,
            "world_size": program.world_size,
            "represents": None if program.represents is None
            else {str(k): v for k, v in program.represents.items()},
            "metadata": _plain(dict(program.metadata)), "ranks": ranks}


#: Largest world size a Program file may declare (a million ranks).
MAX_WORLD_SIZE = 1 << 20


def _check_value(hint: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for a field annotated ``hint`` (None: nothing)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list):
            return "a list of whole numbers"
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        return "a list of whole numbers >= 0" if bad else None
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "a whole number >= 0"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value) and value >= 0
        return None if ok else "a finite number >= 0"
    return None


def _op(entry: Any, rank_text: str, position: int, source: str):
    where = f"program: {source}: ranks.{rank_text}[{position}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: {entry!r:.60} is not an op object; give an object with "
                         "type and the op's fields")
    entry = dict(entry)
    kind = entry.pop("type", None)
    cls = _TYPES.get(kind)
    if cls is None:
        raise ValueError(f"{where}.type: {kind!r} is not valid; valid: {', '.join(_TYPES)}")
    hints = _HINTS[cls]
    for name, value in entry.items():
        if name not in hints:
            raise ValueError(f"{where}.{name}: is not a field of a {kind} op; valid: "
                             f"{', '.join(hints)}")
        wanted = _check_value(hints[name], value)
        if wanted is not None:
            raise ValueError(f"{where}.{name}: {value!r:.60} is not valid; give {wanted}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in entry
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing; a {kind} op needs "
                         f"{', '.join(missing)}")
    for name in _TUPLE_FIELDS:
        if name in entry and entry[name] is not None:
            entry[name] = tuple(entry[name])
    return cls(**entry)


def program_from_dict(data: dict, *, source: str = "program") -> Program:
    """Rebuild a Program from :func:`program_to_dict` output, checking every field's
    type and range, then the Program itself (:func:`strategies.program_check.check_program`:
    groups, peers, matching and deadlock).

    Raises:
        ValueError: one line naming the file, the field (``ranks.3[12].shape``), the value
            and what is valid.
    """
    from strategies.program_check import check_program

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"program: {source} is not a trainsim program file "
                         f"(expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ValueError(f"program: {source} has version {data.get('version')!r}; valid: {VERSION}")
    world = data.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD_SIZE:
        raise ValueError(f"program: {source}: world_size: {world!r} is not valid; give a whole "
                         f"number from 1 to {MAX_WORLD_SIZE:,}")
    ranks = data.get("ranks")
    if not isinstance(ranks, dict):
        raise ValueError(f"program: {source}: ranks: {ranks!r:.60} is not valid; give an "
                         "object of rank number to a list of ops")
    ops_by_rank = {}
    for rank_text, entries in ranks.items():
        if not (isinstance(rank_text, str) and rank_text.isdigit()
                and int(rank_text) < world):
            raise ValueError(f"program: {source}: ranks: {rank_text!r} is not a rank; valid: "
                             f"0..{world - 1}")
        if not isinstance(entries, list):
            raise ValueError(f"program: {source}: ranks.{rank_text}: {entries!r:.60} is not a "
                             "list of ops")
        ops_by_rank[int(rank_text)] = tuple(_op(entry, rank_text, position, source)
                                            for position, entry in enumerate(entries))
    represents = data.get("represents")
    if represents is not None and not (
            isinstance(represents, dict)
            and all(isinstance(k, str) and k.isdigit() and isinstance(v, int)
                    and not isinstance(v, bool) and 1 <= v <= world
                    for k, v in represents.items())):
        raise ValueError(f"program: {source}: represents: {represents!r:.60} is not valid; "
                         "give null or an object of rank to the ranks it stands for (>= 1)")
    name = data.get("name", "program")
    metadata = data.get("metadata") or {}
    if not isinstance(name, str) or not isinstance(metadata, dict):
        raise ValueError(f"program: {source}: name must be a string and metadata an object")
    program = Program(ops_by_rank=ops_by_rank, world_size=world, name=name, metadata=metadata,
                      represents=None if represents is None
                      else {int(k): int(v) for k, v in represents.items()})
    try:
        check_program(program)
    except ValueError as problem:
        raise ValueError(f"program: {source}: {problem}") from None
    return program


def program_to_json(program: Program) -> str:
    """Deterministic JSON text of ``program`` (sorted keys)."""
    return json.dumps(program_to_dict(program), sort_keys=True, separators=(",", ":"))


def load_program(path: str | Path) -> Program:
    """Read a program file.

    Raises:
        ValueError: the file is missing, not JSON, or not a program.
    """
    from hardware.user_input import load_input

    path = Path(path)
    data, _ = load_input(path, what="program", syntax="json",
                         hint="give a Program JSON written by trainsim (validate.program_io)")
    return program_from_dict(data, source=str(path))
