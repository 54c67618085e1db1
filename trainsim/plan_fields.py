"""The plan's fields as the application layer offers them, read from ParallelPlan's metadata.

Each :class:`strategies.plan.ParallelPlan` field declares its help text, option spelling,
Megatron-LM aliases and role in ``trainsim plan``'s search once (``dataclasses``
metadata). This module turns that into :class:`PlanField` records (with the value kind
from the type annotation) and converts values given as text (the command line) or as
TOML/JSON values (scenario files) into what the plan takes. The command options
(``trainsim.cli.options``) and scenario files (``trainsim.scenario``) both build on it,
so a field added to ParallelPlan with metadata needs no other edit.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable

from strategies.plan import PLAN_FIELDS as _DATACLASS_FIELDS
from strategies.plan import ParallelPlan

#: Value kinds: one int, bool or str; a tuple of ints or of strs (``7,8,7`` on the CLI).
KINDS = ("int", "bool", "str", "ints", "strs")


@dataclass(frozen=True)
class PlanField:
    """One plan field as the commands and scenario files offer it.

    Attributes:
        name: the ParallelPlan field.
        kind: one of :data:`KINDS`.
        optional: None is a valid value (e.g. ``layers_per_stage``).
        help: one sentence.
        options: ``--spelling`` first, then the aliases.
        search: how ``trainsim plan`` treats it: ``list``, ``fixed`` or ``derived``.
        choices: function returning the valid values, or None.
        default: the dataclass default.
    """

    name: str
    kind: str
    optional: bool
    help: str
    options: tuple[str, ...]
    search: str
    choices: Callable[[], tuple] | None
    default: Any


def _kind(annotation: Any) -> tuple[str, bool]:
    """(kind, optional) of a type annotation like ``int`` or ``tuple[int, ...] | None``."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if optional:
        (annotation,) = [a for a in args if a is not type(None)]
    if typing.get_origin(annotation) is tuple:
        element = typing.get_args(annotation)[0]
        return ("ints" if element is int else "strs"), optional
    for kind, python_type in (("bool", bool), ("int", int), ("str", str)):
        if annotation is python_type:
            return kind, optional
    raise TypeError(f"ParallelPlan field of type {annotation!r} has no command-line form; "
                    f"valid kinds: {', '.join(KINDS)}")


def _plan_fields() -> tuple[PlanField, ...]:
    hints = typing.get_type_hints(ParallelPlan)
    out = []
    for spec in _DATACLASS_FIELDS:
        meta = spec.metadata
        kind, optional = _kind(hints[spec.name])
        option = meta.get("cli") or "--" + spec.name.replace("_", "-")
        default = spec.default if spec.default is not MISSING else spec.default_factory()
        out.append(PlanField(name=spec.name, kind=kind, optional=optional,
                             help=meta.get("help", ""), options=(option, *meta.get("aliases", ())),
                             search=meta.get("search", "fixed"), choices=meta.get("choices"),
                             default=default))
    return tuple(out)


#: Every plan field, in declaration order.
PLAN_FIELDS: tuple[PlanField, ...] = _plan_fields()
#: By name.
BY_NAME: dict[str, PlanField] = {f.name: f for f in PLAN_FIELDS}


def field_named(name: str, *, where: str = "") -> PlanField:
    """The field called ``name``.

    Raises:
        ValueError: ``"<where>name: is not a plan field; valid: ..."``.
    """
    if name not in BY_NAME:
        raise ValueError(f"{where}{name}: is not a plan field; valid: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def _what(field: PlanField) -> str:
    if field.choices is not None:
        return "one of " + ", ".join(map(str, field.choices()))
    return {"int": "a whole number", "bool": "true or false", "str": "a string",
            "ints": "whole numbers separated by commas, e.g. 7,8,8,7",
            "strs": "names separated by commas, e.g. tp,cp,dp,pp"}[field.kind]


def coerce(field: PlanField, value: Any, *, where: str = "") -> Any:
    """``value`` (a TOML/JSON value, or text for the tuple kinds) as the plan takes it.

    Only the type is checked here; the plan checks ranges and choices when it is built.

    Raises:
        ValueError: ``"<where>name: value is not valid; give ..."`` (one line).
    """
    bad = ValueError(f"{where}{field.name}: {value!r} is not valid; give {_what(field)}")
    if value is None:
        if field.optional:
            return None
        raise bad
    if field.kind in ("ints", "strs"):
        items = [part.strip() for part in value.split(",")] if isinstance(value, str) \
            else value
        if not isinstance(items, (list, tuple)):
            raise bad
        try:
            return tuple(_one(field.kind[:-1], item, bad) for item in items)
        except ValueError:
            raise bad from None
    return _one(field.kind, value, bad)


def _one(kind: str, value: Any, bad: ValueError) -> Any:
    if kind == "int":
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad
    elif not isinstance(value, str):
        raise bad
    return value


def search_values(field: PlanField, text: str) -> tuple:
    """The values ``trainsim plan`` tries for a ``list`` field, from ``"1,2,4"``, each
    once, in the order given (``8,8,8`` is ``(8,)``: a repeated value would be searched,
    counted and ranked as many times).

    Raises:
        ValueError: one line naming the field.
    """
    values = coerce(PlanField(**{**field.__dict__, "kind": "ints" if field.kind == "int"
                                 else "strs"}), text)
    return tuple(dict.fromkeys(values))


def plan_to_fields(plan: ParallelPlan) -> dict[str, Any]:
    """Every field of ``plan`` as TOML/JSON values (tuples as lists; None kept)."""
    return {f.name: list(v) if isinstance(v := getattr(plan, f.name), tuple) else v
            for f in PLAN_FIELDS}
