"""An imported job as ``trainsim plan``'s starting point.

The planner searches the parallel layout (the plan fields whose metadata says
``search="list"``: tp, pp, cp, ep, vpp, micro-batch, ZeRO, recompute, schedule) and keeps
every other field fixed. Of an imported job it keeps the fixed fields (sequence length,
global batch, dtype, overlap, the software stack), except those that only make sense with
the job's own layout (recompute modules and layers, an explicit layer split); each plan's
scenario then records the import, so ``trainsim simulate --scenario`` re-runs it.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from trainsim.importers.job import ImportedJob
from trainsim.plan_fields import BY_NAME

__all__ = ["LAYOUT_BOUND", "attach_import", "fixed_fields"]

#: Fields tied to the job's own layout, left out when the layout is searched.
LAYOUT_BOUND = ("recompute_modules", "recompute_layers", "layers_per_stage")


def fixed_fields(job: ImportedJob, given: Mapping[str, Any]) -> dict[str, Any]:
    """The fixed plan fields the job gives and the command line (``given``) does not:
    searched fields and :data:`LAYOUT_BOUND` ones are left out."""
    return {name: value for name, value in job.plan.items()
            if BY_NAME[name].search == "fixed" and name not in LAYOUT_BOUND
            and name not in given}


def attach_import(plans: list[dict], table: Mapping[str, Any], *, model_given: bool) -> None:
    """Record the resolved ``[import]`` table in each ranked plan's scenario and command
    (the job's model has no preset name to record otherwise)."""
    if model_given or not table:
        return
    option, value = next(iter(table.items()))
    for row in plans:
        scenario = {k: v for k, v in row["scenario"].items() if k != "model"}
        row["scenario"] = {**scenario, "import": dict(table)}
        words = shlex.split(row["command"])
        at = words.index("--model")
        words[at:at + 2] = ["--" + option.replace("_", "-"), value]
        row["command"] = shlex.join(words)
