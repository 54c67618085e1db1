"""trainsim: simulate distributed training on GPU clusters, from Python or the command line.

What it is: the application layer on top of ``hardware``, ``strategies`` and ``sim``: the
public Python API, the defaults every entry point shares (``defaults``), scenario files
(``scenario``), capacity planning (``planner``), what-if sweeps (``sweeps``), plotly
figures (``figures``) and the ``trainsim`` command line (``trainsim.cli``).

What it exports (loaded on first use, so ``import trainsim`` is cheap)::

    trainsim.simulate(model, cluster=..., gpus=..., tp=8, ...)   # one step -> StepResult
    trainsim.collective("all_reduce", cluster=..., nodes=...)    # nccl-tests -> DataFrame
    trainsim.failures(model, gpus=..., days=...)                 # long run -> LongRunResult
    trainsim.plan(model, gpus=...)                               # best plans -> PlanReport
    trainsim.gpus_needed(model, tokens=..., days=...)            # the inverse question
    trainsim.sweep(spec)                                         # what-if grid -> DataFrame
    trainsim.hardware_list(), trainsim.hardware_show(name)       # presets
    trainsim.load_scenario(path), trainsim.Scenario              # scenario files
    trainsim.make_plan(gpus=..., **fields)                       # a plan with the defaults
    trainsim.simulate_program(program, cluster=...)              # replay any Program
    trainsim.figures                                             # plotly figures
    trainsim.report.write_step_report(result, "step.html")       # the HTML report
    trainsim.trace.write_step_trace(result, "t.json", ranks=...) # Perfetto trace
    trainsim.__version__

What it may import: every other package of the repository; ``validate`` only inside the
functions of the ``trainsim validate`` and ``trainsim calibrate`` commands
(``trainsim/cli/validate.py``), so nothing else ever loads torch (tests/test_layering.py).
"""

from __future__ import annotations

import importlib

#: Public name -> (module, attribute in it; None for the module itself).
_EXPORTS = {
    "simulate": ("trainsim.api", "simulate"),
    "simulate_program": ("trainsim.api", "simulate_program"),
    "collective": ("trainsim.api", "collective"),
    "failures": ("trainsim.api", "failures"),
    "plan": ("trainsim.api", "plan"),
    "gpus_needed": ("trainsim.api", "gpus_needed"),
    "sweep": ("trainsim.api", "sweep"),
    "hardware_list": ("trainsim.api", "hardware_list"),
    "hardware_show": ("trainsim.api", "hardware_show"),
    "make_plan": ("trainsim.api", "make_plan"),
    "load_scenario": ("trainsim.scenario", "load_scenario"),
    "Scenario": ("trainsim.scenario", "Scenario"),
    "figures": ("trainsim.figures", None),
    "report": ("trainsim.report", None),
    "trace": ("trainsim.trace", None),
    "__version__": ("trainsim.version", "VERSION"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Load a public name on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
