"""Command options declared once: the plan's from ParallelPlan's metadata, the rest here.

:func:`with_plan_options` adds one option per :class:`strategies.plan.ParallelPlan` field
(its ``--spelling``, Megatron-LM aliases and help text come from the field's metadata,
:mod:`trainsim.plan_fields`) to a command whose function ends in ``**plan``: typer reads
the function's ``__signature__``, which the decorator extends. For ``trainsim plan``,
fields with ``search="list"`` take comma-separated lists; ``derived`` fields (dp) are not
offered. Every plan option defaults to "not given" (None), so a scenario file can supply
it and the defaults (:mod:`trainsim.defaults`) fill the rest in one place.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import typer

from hardware.catalog import parse_override
from trainsim import defaults
from trainsim.plan_fields import PLAN_FIELDS, PlanField, coerce, search_values
from trainsim.scenario import Scenario

#: What the help shows as the default of plan fields whose default is a rule.
_SHOWN_DEFAULTS = {
    "dp": "gpus / (tp*pp*cp)",
    "global_batch": "~4 Mi tokens",
    "seq_len": str(defaults.SEQ_LEN),
    "zero": f"{defaults.ZERO} (0 with a parameter server)",
    "schedule": f"{defaults.SCHEDULE} ({defaults.INTERLEAVED} with vpp > 1)",
}


def _shown_default(field: PlanField) -> str:
    if field.name in _SHOWN_DEFAULTS:
        return _SHOWN_DEFAULTS[field.name]
    if field.default is None:
        return "none"
    if isinstance(field.default, bool):
        return "on" if field.default else "off"
    if isinstance(field.default, tuple):
        return ",".join(map(str, field.default))
    return str(field.default)


def _help(field: PlanField, *, listed: bool) -> str:
    text = field.help
    if field.choices is not None:
        text += f" Valid: {', '.join(map(str, field.choices()))}."
    if listed:
        text += " Values to try, comma-separated."
    return text


def plan_parameters(*, search: bool = False) -> list[inspect.Parameter]:
    """One keyword-only parameter per plan field, for a typer command's signature.

    Args:
        search: the options of ``trainsim plan``: ``list`` fields take comma-separated
            values to try (default: the planner's search space), ``derived`` fields are
            left out.
    """
    params = []
    for field in PLAN_FIELDS:
        if search and field.search == "derived":
            continue
        listed = search and field.search == "list"
        options = list(field.options)
        if field.kind == "bool" and not listed:
            options = [f"{o}/--no-{o[2:]}" for o in options]
            annotation: Any = Optional[bool]
        elif field.kind == "int" and not listed:
            annotation = Optional[int]
        else:
            annotation = Optional[str]
        shown = "the planner's search space" if listed else _shown_default(field)
        default = typer.Option(None, *options, help=_help(field, listed=listed),
                               show_default=shown)
        params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=default, annotation=annotation))
    return params


def with_plan_options(*, search: bool = False) -> Callable:
    """Decorator: put the plan options where the command function has ``**plan``."""
    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        keyword_only = [p.replace(kind=p.KEYWORD_ONLY) for p in own]
        func.__signature__ = signature.replace(
            parameters=keyword_only + plan_parameters(search=search))
        return func
    return decorate


def given_plan(values: Mapping[str, Any]) -> dict[str, Any]:
    """The plan fields given on the command line, as the plan takes them (None: not
    given; ``7,8,7`` becomes ``(7, 8, 7)``).

    Raises:
        ValueError: one line naming the field and what is valid.
    """
    by_name = {f.name: f for f in PLAN_FIELDS}
    return {name: coerce(by_name[name], value) for name, value in values.items()
            if name in by_name and value is not None}


def search_lists(values: Mapping[str, Any]) -> tuple[dict[str, tuple], dict[str, Any]]:
    """``trainsim plan``'s plan options: (values to try per ``list`` field, given fixed
    fields).

    Raises:
        ValueError: one line naming the field and what is valid.
    """
    lists, fixed = {}, {}
    for field in PLAN_FIELDS:
        value = values.get(field.name)
        if value is None:
            continue
        if field.search == "list":
            lists[field.name] = search_values(field, value)
        else:
            fixed[field.name] = coerce(field, value)
    return lists, fixed


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, object]:
    """``--set key=value`` pairs as ``{key: value}``.

    Raises:
        ValueError: one line naming the malformed pair.
    """
    result: dict[str, object] = {}
    for text in pairs or []:
        key, value = parse_override(text)
        result[key] = value
    return result


def scenario_from_options(*, scenario: str | None, model: str | None = None,
                          cluster: str | None = None, gpus: int | None = None,
                          fidelity: str | None = None, set_: Sequence[str] | None = None,
                          calibration: str | None = None, plan: Mapping[str, Any] | None = None,
                          perturbations: Mapping[str, Sequence[str]] | None = None,
                          failures: Mapping[str, Any] | None = None,
                          megatron_args: str | None = None,
                          nemo_config: str | None = None) -> Scenario:
    """The scenario a command runs: ``--scenario FILE`` (if given), then the options given
    explicitly on top (each one wins; ``--set`` pairs win key by key; ``--megatron-args`` /
    ``--nemo-config`` replace the file's ``[import]``).

    Raises:
        ValueError: one line for a bad scenario file or option.
    """
    from trainsim.scenario import load_scenario

    base = load_scenario(scenario) if scenario else Scenario()
    given = Scenario(model=model, cluster=cluster, gpus=gpus, fidelity=fidelity,
                     calibration=calibration, overrides=parse_overrides(set_),
                     plan=given_plan(plan or {}),
                     perturbations={k: tuple(v) for k, v in (perturbations or {}).items() if v},
                     failures={k: v for k, v in (failures or {}).items() if v is not None},
                     job=job_table(megatron_args, nemo_config))
    return base.merged(given)


def job_table(megatron_args: str | None, nemo_config: str | None) -> dict[str, str]:
    """The ``[import]`` table of ``--megatron-args`` / ``--nemo-config`` (at most one).

    Raises:
        ValueError: both given (one line).
    """
    if megatron_args is not None and nemo_config is not None:
        raise ValueError("megatron-args: give --megatron-args or --nemo-config, not both")
    if megatron_args is not None:
        return {"megatron_args": megatron_args}
    return {} if nemo_config is None else {"nemo_config": nemo_config}


# --------------------------------------------------------------------------- common options


def scenario_option() -> Any:
    return typer.Option(None, "--scenario", help="Scenario TOML, or a result JSON to re-run; "
                        "options given explicitly win over it.")


def model_option() -> Any:
    return typer.Option(None, help="Model preset, model TOML or Hugging Face config.json "
                        "(required unless the scenario names one).")


def megatron_args_option() -> Any:
    return typer.Option(None, "--megatron-args", help="A job's own Megatron-LM arguments "
                        "(quoted, e.g. --megatron-args='--tensor-model-parallel-size 8 ...'), "
                        "or @FILE of them: the model and plan come from the job; options "
                        "given explicitly win.")


def nemo_config_option() -> Any:
    return typer.Option(None, "--nemo-config", help="A job's NeMo 1 launcher, NeMo 2 or "
                        "Megatron-Bridge training YAML: the model and plan come from the job; "
                        "options given explicitly win.")


def cluster_option() -> Any:
    return typer.Option(None, help="Cluster preset or preset TOML file.",
                        show_default=defaults.CLUSTER)


def gpus_option() -> Any:
    return typer.Option(None, help="GPUs in the job (= dp*tp*pp*cp).",
                        show_default="the plan's dp*tp*pp*cp")


def set_option() -> Any:
    return typer.Option(None, "--set", help="Override a preset field: key=value (e.g. "
                        "nic.gbit_per_s=200); repeatable.")


def calibration_option() -> Any:
    return typer.Option(None, help="Calibration file (trainsim calibrate) applied to the "
                        "cluster.", show_default="none")


def format_option(valid: Sequence[str], default: str = "table") -> Any:
    return typer.Option(default, "--format", help=f"{', '.join(valid[:-1])} or {valid[-1]}.")


def fidelity_option(default: str) -> Any:
    return typer.Option(None, help="analytic (closed form, ms: for sweeps), event (replay "
                        "of every op) or flow (replay with per-link contention).",
                        show_default=default)
