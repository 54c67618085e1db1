"""trainsim.report: a simulated step as one self-contained HTML page.

``trainsim simulate --report out.html`` and :func:`write_step_report` write it:
inputs, headline results, where the step goes, the memory stack, the pipeline Gantt
and the busbw of the collectives the step uses (:mod:`.page`, :mod:`.collectives`).
The page inlines plotly.js (about 5 MB) and loads nothing from the network.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.atomic_io import write_text_atomic
from trainsim.report.collectives import busbw_curves, step_collectives
from trainsim.report.page import step_report_html

__all__ = ["step_report", "write_step_report"]


def _program_and_cluster(result):
    """The step's Program (lowered again at analytic fidelity, which keeps none) and
    the cluster spec it ran on (overrides and calibration applied)."""
    from strategies.lowering import StepLowerer
    from trainsim import defaults, resolve
    from trainsim.scenario import scenario_from_dict

    step = resolve.resolve_step(scenario_from_dict(result.to_dict()["scenario"]),
                                default_fidelity=defaults.STEP_FIDELITY)
    lowering = result.lowering
    program = lowering.program if lowering is not None else \
        StepLowerer(step.model, step.plan).lower().program
    return program, step.cluster


def step_report(result) -> str:
    """The HTML page of ``result`` (a StepResult of :func:`trainsim.simulate` or the
    CLI, which embeds its scenario).

    Raises:
        ValueError: when the result embeds no scenario (built by ``sim.step`` directly).
    """
    from plotly.offline import get_plotlyjs

    if "scenario" not in result.to_dict():
        raise ValueError("result: it embeds no scenario; simulate it with "
                         "trainsim.simulate or the trainsim CLI")
    note = ""
    try:
        program, cluster = _program_and_cluster(result)
        used = step_collectives(program, int(result.inputs["gpus_per_node"]))
        curves, points = busbw_curves(used, cluster, program.world_size)
        collectives = (used, curves, points) if used else None
    except ValueError as problem:  # e.g. a parameter-server step has no lowering here
        collectives, note = None, f"The collectives could not be listed: {problem}"
    return step_report_html(result, collectives=collectives, plotly_js=get_plotlyjs(),
                            collectives_note=note)


def write_step_report(result, path: str | os.PathLike[str]) -> Path:
    """Write :func:`step_report` to ``path`` atomically (temp file + rename); return it."""
    return write_text_atomic(path, step_report(result))
