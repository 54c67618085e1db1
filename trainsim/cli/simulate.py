"""``trainsim simulate``: one training step: step time, MFU, memory and where the time goes."""

from __future__ import annotations

import sys
from typing import Any, List, Optional

import typer

from trainsim import defaults
from trainsim.cli import options
from trainsim.cli.errors import (EXIT_OOM, UserError, check_choice, check_output_path, json_text,
                                 oom_message, remedies_json)
from trainsim.cli.output import (comment, console, count_text, import_header, job_header,
                                  plan_header, spinner, table)
from trainsim.trace import parse_trace_ranks, write_step_trace


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command to ``app``."""
    app.command()(simulate)


@options.with_plan_options()
def simulate(
    scenario: Optional[str] = options.scenario_option(),
    model: Optional[str] = options.model_option(),
    megatron_args: Optional[str] = options.megatron_args_option(),
    nemo_config: Optional[str] = options.nemo_config_option(),
    cluster: Optional[str] = options.cluster_option(),
    gpus: Optional[int] = options.gpus_option(),
    fidelity: Optional[str] = options.fidelity_option(defaults.STEP_FIDELITY),
    output_format: str = options.format_option(("table", "json")),
    trace: Optional[str] = typer.Option(None, help="Write a Perfetto/Chrome trace here."),
    trace_ranks: str = typer.Option("simulated", help="Ranks in the trace: simulated (one "
                                    "per pipeline stage, each track saying how many it "
                                    "stands for), all, or a list such as 0-7,64."),
    report: Optional[str] = typer.Option(None, help="Write a self-contained HTML report "
                                         "here (inputs, breakdown, memory, Gantt, busbw)."),
    set_: Optional[List[str]] = options.set_option(),
    calibration: Optional[str] = options.calibration_option(),
    straggler: Optional[List[str]] = typer.Option(None, help="A slow rank as RANK:SPEED "
                                                  "(0.5 = half speed); repeatable."),
    thermal: Optional[List[str]] = typer.Option(None, help="A throttling episode as "
                                                "RANK:START_S:DURATION_S:SPEED; repeatable."),
    degraded_nic: Optional[List[str]] = typer.Option(None, help="The NIC serving RANK at a "
                                                     "fraction of its rate: RANK:FRACTION."),
    flapping_link: Optional[List[str]] = typer.Option(None, help="The NIC link of RANK up "
                                                      "UP_S, down DOWN_S: RANK:UP_S:DOWN_S."),
    node_gpu: Optional[List[str]] = typer.Option(None, help="A node with the GPUs of another "
                                                 "preset (mixed generations): NODE:PRESET."),
    **plan: Any,
) -> None:
    """Simulate one training step: step time, MFU, memory and where the time goes."""
    from strategies.memory import OutOfMemoryError
    from trainsim.api import run_step

    check_choice("format", output_format, ("table", "json"))
    chosen = options.scenario_from_options(
        scenario=scenario, model=model, cluster=cluster, gpus=gpus, fidelity=fidelity,
        set_=set_, calibration=calibration, plan=plan,
        perturbations={"straggler": straggler, "thermal": thermal,
                       "degraded_nic": degraded_nic, "flapping_link": flapping_link,
                       "node_gpu": node_gpu},
        megatron_args=megatron_args, nemo_config=nemo_config)
    if trace and (chosen.fidelity or defaults.STEP_FIDELITY) == "analytic":
        raise UserError("trace: the analytic fidelity replays no ops; give --fidelity event "
                        "or flow to write a trace")
    ranks = parse_trace_ranks(trace_ranks)
    check_output_path("trace", trace)
    check_output_path("report", report)
    try:
        with spinner(output_format == "table"):
            result = run_step(chosen, default_fidelity=defaults.STEP_FIDELITY)
    except OutOfMemoryError as oom:
        if output_format == "json":
            print(json_text({"error": "out_of_memory", "rank": oom.rank,
                              "capacity_bytes": oom.capacity_bytes,
                              "memory": oom.breakdown.to_dict(),
                              "remedies": remedies_json(oom)}, indent=1))
        print(f"error: {oom_message(oom)}", file=sys.stderr)
        sys.exit(EXIT_OOM)
    # The result is printed first: a trace or report that cannot be written (too many
    # ranks asked for) then costs the user that file, never the simulation.
    if output_format == "json":
        print(json_text(result.to_dict(), indent=1))
    else:
        print_step(result)
    if trace:
        write_step_trace(result, trace, ranks=ranks)
    if report:
        from trainsim.report import write_step_report

        with spinner(output_format == "table", "writing the report..."):
            write_step_report(result, report)


def print_step(result) -> None:
    """The header, the headline numbers, and the breakdown and memory per pipeline rank."""
    out = console()
    resolved = result.to_dict()["scenario"]
    comment(out, job_header(model=result.inputs["model"], gpus=result.inputs["gpus"],
                            cluster=result.inputs["cluster"], fidelity=result.inputs["fidelity"],
                            calibration=resolved.get("calibration"),
                            overrides=resolved.get("set")))
    comment(out, plan_header(result.inputs["plan"]))
    if "import" in result.inputs:
        comment(out, import_header(result.inputs["import"]))
    # The band is what a real run would measure (sim/step_bands.py: the fitted model-error
    # bias and spread, the calibration's uncertainty, the GPU spread), so its p50 need
    # not be the simulated step, and the step may even lie outside it: the labels say which
    # is which (a user read "step time 0.75 / p10 0.79" as a contradiction).
    rows = [("step time, simulated (s)", f"{result.step_time_s:.4f}"),
            ("a real run's step, 80 % band p10 / p50 / p90 (s)", f"{result.step_time_p10_s:.4f} / "
             f"{result.step_time_p50_s:.4f} / {result.step_time_p90_s:.4f}"),
            ("tokens/s", f"{result.tokens_per_s:,.0f}"),
            ("TFLOP/s per GPU (model)", f"{result.tflops_per_gpu:.1f}"),
            ("MFU (%)", f"{100 * result.mfu:.1f}"),
            ("peak memory (GiB)", f"{result.peak_memory_bytes / 2**30:.2f}")]
    slowest = result.inputs.get("slowest_gpu_factor", 1.0)
    if slowest != 1.0:
        spread = result.inputs["cluster"]["gpu"]["speed_spread"]
        rows.append(("kernels at the slowest GPU's pace", f"x{slowest:.4f} (speed_spread "
                     f"{spread:g})"))
    cost = result.perturbation_cost
    if cost is not None:
        rows += [("step time without perturbations (s)", f"{cost['baseline_step_time_s']:.4f}"),
                 (f"what they cost (critical rank {cost['critical_rank']})",
                  f"+{cost['slowdown_s']:.4f} s ({cost['slowdown']:+.1%})")]
    summary = table(("", ""), rows, left=("",))
    summary.show_header = False
    out.print(summary)
    ps = result.ps
    if ps is not None:
        out.print(f"parameter servers: {ps['mode']}"
                  + (f" (staleness {ps['staleness']})" if ps['mode'] == "ps-stale" else "")
                  + f", {ps['servers']} {ps['placement']} server(s) on ranks "
                  f"{count_text(ps['server_ranks'])}, {ps['gpus_total']} GPUs on "
                  f"{ps['nodes']} nodes; step time = steady-state interval over "
                  f"{ps['steps']} step(s), makespan {ps['makespan_s']:.4f} s; server "
                  f"memory {ps['server_memory']['total_bytes'] / 2**30:.2f} GiB")
    frame = result.breakdown_frame()
    out.print(table(["pp", *frame.columns],
                    ([str(p), *(f"{v:.4f}" for v in row)] for p, row in frame.iterrows()),
                    title="where the step goes (s), per pipeline rank", fold_names=True,
                    gap=_gap(out)))
    mem = result.memory_frame() / 2**30
    out.print(table(["pp", *(c.replace("_bytes", "") for c in mem.columns)],
                    ([str(p), *(f"{v:.2f}" for v in row)] for p, row in mem.iterrows()),
                    title="memory per pipeline rank (GiB = 2^30 B)", fold_names=True,
                    gap=_gap(out)))


def _gap(out) -> int:
    """Spaces between columns: 2, or 1 on a console narrower than 100 columns."""
    return 2 if out.width >= 100 else 1
