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
from pathlib import Path
from typing import Any

from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp

FORMAT = "trainsim-program"
VERSION = 1
_TYPES = {"compute": ComputeOp, "collective": CollectiveOp, "send": SendOp, "recv": RecvOp}
_NAMES = {cls: name for name, cls in _TYPES.items()}
_TUPLE_FIELDS = ("shape", "deps", "group")


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


def program_from_dict(data: dict, *, source: str = "program") -> Program:
    """Rebuild a Program from :func:`program_to_dict` output.

    Raises:
        ValueError: one line naming the problem (wrong format, unknown op type or field).
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"program: {source} is not a trainsim program file "
                         f"(expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ValueError(f"program: {source} has version {data.get('version')!r}; valid: {VERSION}")
    ops_by_rank = {}
    for rank_text, entries in data["ranks"].items():
        ops = []
        for position, entry in enumerate(entries):
            entry = dict(entry)
            kind = entry.pop("type", None)
            cls = _TYPES.get(kind)
            if cls is None:
                raise ValueError(f"program: op {position} of rank {rank_text} in {source} has "
                                 f"type {kind!r}; valid: {', '.join(_TYPES)}")
            for name in _TUPLE_FIELDS:
                if name in entry and entry[name] is not None:
                    entry[name] = tuple(entry[name])
            try:
                ops.append(cls(**entry))
            except TypeError as err:
                raise ValueError(f"program: op {position} of rank {rank_text} in {source}: "
                                 f"{err}") from None
        ops_by_rank[int(rank_text)] = tuple(ops)
    represents = data.get("represents")
    return Program(ops_by_rank=ops_by_rank, world_size=int(data["world_size"]),
                   name=data.get("name", "program"), metadata=data.get("metadata") or {},
                   represents=None if represents is None
                   else {int(k): int(v) for k, v in represents.items()})


def program_to_json(program: Program) -> str:
    """Deterministic JSON text of ``program`` (sorted keys)."""
    return json.dumps(program_to_dict(program), sort_keys=True, separators=(",", ":"))


def load_program(path: str | Path) -> Program:
    """Read a program file.

    Raises:
        ValueError: the file is missing, not JSON, or not a program.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"program: file {str(path)!r} not found") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"program: {str(path)!r} is not valid JSON ({err.msg} at line "
                         f"{err.lineno})") from None
    return program_from_dict(data, source=str(path))
