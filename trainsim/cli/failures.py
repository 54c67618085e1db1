"""``trainsim failures``: goodput of a long run with failures and checkpoints."""

from __future__ import annotations

import sys
from typing import Any, List, Optional

import typer

from trainsim import defaults
from trainsim.cli import options
from trainsim.cli.errors import EXIT_OOM, UserError, check_choice, json_text, oom_message
from trainsim.cli.output import (comment, console, import_header, job_header, plan_header,
                                  spinner, table)


def register(app: typer.Typer) -> None:
    """Add the ``failures`` command to ``app``."""
    app.command()(failures)


@options.with_plan_options()
def failures(
    scenario: Optional[str] = options.scenario_option(),
    model: Optional[str] = options.model_option(),
    megatron_args: Optional[str] = options.megatron_args_option(),
    nemo_config: Optional[str] = options.nemo_config_option(),
    cluster: Optional[str] = options.cluster_option(),
    gpus: Optional[int] = options.gpus_option(),
    fidelity: Optional[str] = options.fidelity_option(defaults.FAILURES_FIDELITY),
    days: Optional[float] = typer.Option(None, help="Simulate this many days ..."),
    tokens: Optional[str] = typer.Option(None, help="... or until this many tokens "
                                         "(e.g. 15.6T)."),
    profile: Optional[str] = typer.Option(None, help="Failure profile: llama3-h100, "
                                          "meta-rsc or a TOML file.",
                                          show_default=defaults.FAILURES["profile"]),
    checkpoint_interval: Optional[str] = typer.Option(
        None, help="auto, young-daly, seconds or a duration like 30min.",
        show_default=defaults.FAILURES["checkpoint_interval"]),
    checkpoint_mode: Optional[str] = typer.Option(
        None, help="sync or async.", show_default=defaults.FAILURES["checkpoint_mode"]),
    policy: Optional[str] = typer.Option(None, help="spares, wait or elastic.",
                                         show_default="spares"),
    spare_nodes: Optional[int] = typer.Option(None, help="Hot-spare nodes.",
                                              show_default="unlimited"),
    seeds: Optional[int] = typer.Option(None, help="Monte-Carlo runs.",
                                        show_default=str(defaults.FAILURES["seeds"])),
    seed: Optional[int] = typer.Option(None, help="First random seed.",
                                       show_default=str(defaults.FAILURES["seed"])),
    output_format: str = options.format_option(("table", "json")),
    set_: Optional[List[str]] = options.set_option(),
    calibration: Optional[str] = options.calibration_option(),
    **plan: Any,
) -> None:
    """Interruptions, goodput and days to train of a long run, Monte-Carlo over seeds."""
    from strategies.memory import OutOfMemoryError
    from trainsim.api import run_failures

    check_choice("format", output_format, ("table", "json"))
    chosen = options.scenario_from_options(
        scenario=scenario, model=model, cluster=cluster, gpus=gpus, fidelity=fidelity,
        set_=set_, calibration=calibration, plan=plan,
        failures={"days": days, "tokens": tokens, "profile": profile,
                  "checkpoint_interval": checkpoint_interval,
                  "checkpoint_mode": checkpoint_mode, "policy": policy,
                  "spare_nodes": spare_nodes, "seeds": seeds, "seed": seed},
        megatron_args=megatron_args, nemo_config=nemo_config)
    if ("days" in chosen.failures) == ("tokens" in chosen.failures):
        raise UserError("days: give exactly one of --days or --tokens")
    try:
        with spinner(output_format == "table"):
            result = run_failures(chosen)
    except OutOfMemoryError as oom:
        print(f"error: {oom_message(oom)}", file=sys.stderr)
        sys.exit(EXIT_OOM)
    if output_format == "json":
        print(json_text(result.to_dict(), indent=1))
        return
    print_failures(result)


def print_failures(result) -> None:
    """The header, then the summary, interruptions and GPU-hours by cause."""
    out = console()
    data = result.to_dict()
    resolved = data["scenario"]
    # an imported job's model is in the import, not in the scenario's "model"
    comment(out, job_header(model=resolved.get("model", data["inputs"]["model"]),
                            gpus=resolved["gpus"], cluster=resolved["cluster"],
                            fidelity=resolved["fidelity"],
                            calibration=resolved.get("calibration"),
                            overrides=resolved.get("set")))
    comment(out, plan_header(resolved["plan"]))
    if "import" in data:
        comment(out, import_header(data["import"]))
    run = resolved["failures"]
    horizon = f"{run['days']:g} days" if "days" in run else f"{run['tokens']} tokens"
    comment(out, f"# long run: {horizon}, profile {run['profile']}, checkpoint interval "
                 f"{run['checkpoint_interval']} ({run['checkpoint_mode']} saves), policy "
                 f"{run.get('policy', 'spares')}, {run['seeds']} seeds from {run['seed']}")
    for title, frame in (("summary", result.summary_frame()),
                         ("interruptions by cause", result.interruptions_frame()),
                         ("GPU-hours by cause", result.gpu_hours_frame())):
        columns = [frame.index.name or "", *map(str, frame.columns)]
        rows = ([str(index), *row] for index, row in zip(frame.index, frame.itertuples(
            index=False)))
        out.print(table(columns, rows, title=title, left=(columns[0], "unit"),
                        fold_names=True))
