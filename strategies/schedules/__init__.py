"""Pipeline schedules, one class per schedule, and the registry that names them.

Exports :class:`PipelineSchedule` (the base class), :func:`get_schedule`,
:func:`register`, :func:`schedule_names`, :data:`SCHEDULES` (a live view of the
registered names) and :func:`schedule_actions`. Imports only
:mod:`strategies.pipeline` (the shared action machinery), never the step
lowering or anything of ``sim``.

Adding a schedule: write its class (a subclass of :class:`PipelineSchedule`) in a
module of its own and add an instance to :data:`_BUILT_IN` below (or call
:func:`register` with it). The plan validation, the lowering, the closed-form step
model, the memory model and ``trainsim plan`` then know it: they ask the schedule
object, never its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies.pipeline import Action
from strategies.schedules.base import PipelineSchedule, PipelineTiming
from strategies.schedules.gpipe import GPipe
from strategies.schedules.interleaved import Interleaved
from strategies.schedules.one_f_one_b import OneFOneB
from strategies.schedules.dualpipe import DualPipe, DualPipeV
from strategies.schedules.zero_bubble import ZeroBubbleH1, ZeroBubbleH2
from strategies.schedules.zero_bubble_v import ZeroBubbleV

__all__ = ["PipelineSchedule", "PipelineTiming", "SCHEDULES", "get_schedule", "register",
           "schedule_actions", "schedule_names"]

#: Registered schedules by name, in registration order (the order users see).
_REGISTRY: dict[str, PipelineSchedule] = {}


def register(schedule: PipelineSchedule) -> PipelineSchedule:
    """Add a schedule to the registry and return it.

    Raises:
        ValueError: when it is not a PipelineSchedule, has no name, or its name
            is taken by another schedule.
    """
    if not isinstance(schedule, PipelineSchedule) or not schedule.name:
        raise ValueError(f"schedule: {schedule!r} is not a named PipelineSchedule")
    existing = _REGISTRY.get(schedule.name)
    if existing is not None and type(existing) is not type(schedule):
        raise ValueError(f"schedule: the name {schedule.name!r} is taken by {existing!r}")
    _REGISTRY[schedule.name] = schedule
    return schedule


def schedule_names() -> tuple[str, ...]:
    """Names of the registered schedules, in registration order."""
    return tuple(_REGISTRY)


def get_schedule(name: str) -> PipelineSchedule:
    """The registered schedule called ``name``.

    Raises:
        ValueError: naming the schedule and listing the valid ones.
    """
    found = _REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"schedule={name!r} is invalid; valid: one of {schedule_names()}")
    return found


def schedule_actions(name: str, pp: int, microbatches: int, vpp: int = 1,
                     overlap: bool = False) -> list[list[Action]]:
    """The ordered actions of every pipeline rank under schedule ``name`` (``overlap``:
    with overlapped forward-backward pairs, :meth:`PipelineSchedule.actions`).

    Raises:
        ValueError: an unknown schedule or a shape it rejects (one line naming
            the field, its value and what is valid).
    """
    return [list(row) for row in get_schedule(name).actions(pp, microbatches, vpp, overlap)]


class _ScheduleNames(Sequence):
    """The registered names as a read-only sequence that follows the registry
    (``"1f1b" in SCHEDULES``, ``", ".join(SCHEDULES)``)."""

    def __getitem__(self, index):
        return schedule_names()[index]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY

    def __repr__(self) -> str:
        return repr(schedule_names())


#: Live view of the registered schedule names.
SCHEDULES = _ScheduleNames()

_BUILT_IN = (GPipe(), OneFOneB(), Interleaved(), ZeroBubbleH1(), ZeroBubbleH2(), ZeroBubbleV(),
             DualPipe(), DualPipeV())
for _schedule in _BUILT_IN:
    register(_schedule)
