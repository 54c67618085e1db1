"""What an importer reads from a job and what it makes of it.

:class:`Settings` is what a front end (Megatron-LM arguments, a NeMo YAML) hands the
mapping (:mod:`trainsim.importers.megatron_config`): Megatron-LM's settings by their
``argparse`` destination names (``tensor_model_parallel_size``, ``overlap_grad_reduce``,
...), each with the spelling the user wrote, so every error names the flag or key as it
appears in the user's own file. :class:`ImportedJob` is what the mapping gives back.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from strategies.model_spec import ModelSpec

#: Largest whole number a job's setting may give (10^15: no setting trainsim reads is
#: near it, and products of a few such numbers stay far inside a float's range). Model
#: sizes have the model schema's smaller bound (strategies.models.MAX_MODEL_NUMBER).
MAX_WHOLE_NUMBER = 10**15


@dataclass(frozen=True)
class Setting:
    """One setting of a job.

    Attributes:
        value: the value, already typed (int, float, bool, str, list).
        spelled: how the job spells it: ``--overlap-grad-reduce`` or
            ``model.optim.overlap_grad_sync``.
    """

    value: Any
    spelled: str


@dataclass(frozen=True)
class Settings:
    """A job's settings by Megatron-LM destination name, with where they came from.

    Attributes:
        values: ``{destination: Setting}`` of the settings the job gives.
        source: what was read, for messages (``Megatron-LM arguments``, a file name).
        ignored: spellings of settings read and found to have no effect on step time or
            memory (logging, checkpoint paths, data, seeds, learning-rate schedules).
        notes: what the front end itself assumed (e.g. a tokenizer's default).
        gpus: GPUs the job ran on, when the job says (a launcher's nodes x devices).
        shape_hint: what to do when the job gives no model shape (a NeMo 2 recipe keeps it
            in a config class trainsim does not import), or empty.
        read: destinations the mapping has read (:meth:`get`), so it can refuse a setting
            nothing read.
    """

    values: Mapping[str, Setting]
    source: str
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    gpus: int | None = None
    shape_hint: str = ""
    read: set[str] = field(default_factory=set, compare=False, repr=False)

    def has(self, name: str) -> bool:
        """Whether the job gives ``name``."""
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name``, or ``default`` when the job does not give it."""
        self.read.add(name)
        setting = self.values.get(name)
        return default if setting is None else setting.value

    def spelled(self, name: str) -> str:
        """How the job spells ``name``; Megatron-LM's flag when it does not give it."""
        from trainsim.importers.megatron_flags import flag_of

        setting = self.values.get(name)
        return setting.spelled if setting is not None else flag_of(name)

    def value(self, name: str, kind: Callable, default: Any = None, *,
              minimum: int | None = None, maximum: int = MAX_WHOLE_NUMBER,
              choices: tuple = ()) -> Any:
        """A setting checked for its type (``int``, ``float``, ``bool`` or ``str``), range
        and choices; ``default`` when the job does not give it (or gives null). A whole
        number is at most ``maximum``; a number is finite.

        Raises:
            ValueError: one line naming the setting as the job spells it.
        """
        value = self.get(name)
        if value is None:
            return default
        spelled = self.spelled(name)
        if kind is int:
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{spelled}: {value!r} is not valid; give a whole number")
            if (minimum is not None and value < minimum) or value > maximum:
                low = "" if minimum is None else f">= {minimum} and "
                raise ValueError(f"{spelled}: {value} is not valid; give a whole number "
                                 f"{low}<= {maximum:,}")
        elif kind is float:
            try:
                value = float(value)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{spelled}: {value!r} is not valid; give a number") from None
            if not math.isfinite(value):
                raise ValueError(f"{spelled}: {value!r} is not valid; give a finite number")
        elif kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{spelled}: {value!r} is not valid; give true or false")
        elif kind is str and not isinstance(value, str):
            raise ValueError(f"{spelled}: {value!r} is not valid; give a name")
        if choices and value not in choices:
            raise ValueError(f"{spelled}: {value!r} is not valid; valid: "
                             f"{', '.join(map(str, choices))}")
        return value

    def required(self, name: str, kind: Callable = int, *,
                 maximum: int = MAX_WHOLE_NUMBER) -> Any:
        """A setting Megatron-LM requires (a whole number in [1, ``maximum``] by default),
        checked.

        Raises:
            ValueError: one line naming it when it is missing or invalid.
        """
        if self.get(name) is None:
            raise ValueError(f"{self.spelled(name)}: missing from {self.source}; Megatron-LM "
                             "requires it (give it)")
        return self.value(name, kind, minimum=1 if kind is int else None, maximum=maximum)


@dataclass(frozen=True)
class ImportedJob:
    """A job as trainsim runs it.

    Attributes:
        source: what was imported (for the result's inputs).
        model: the model the job trains (None when another model was given instead).
        plan: ParallelPlan fields the job sets (Megatron's own defaults included).
        gpus: GPUs of the job when it says, else None.
        ignored: settings accepted with no effect on step time or memory.
        assumed: defaults relied on and approximations made, one sentence each.
    """

    source: str
    model: ModelSpec | None
    plan: Mapping[str, Any]
    gpus: int | None = None
    ignored: tuple[str, ...] = ()
    assumed: tuple[str, ...] = field(default=())

    def notes(self) -> dict[str, Any]:
        """What a result records of the import: source, the model it made of the job (its
        shape, which a model's name alone does not say), ignored settings, assumptions."""
        return {"source": self.source,
                "model": None if self.model is None else asdict(self.model),
                "ignored": list(self.ignored), "assumed": list(self.assumed)}
