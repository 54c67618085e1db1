"""``trainsim plan`` and ``trainsim sweep``: capacity planning and what-if sweeps.

Registered on the main app by :mod:`trainsim.cli` (``register``); kept apart so each
command module has one job.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
    TimeElapsedColumn
from rich.table import Table

PLAN_FORMATS = ("table", "json", "csv")


def _int_list(field: str, text: Optional[str]) -> tuple[int, ...] | None:
    """``"1,2,4"`` -> ``(1, 2, 4)``; one-line error for anything else."""
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not valid; give whole numbers separated by "
                         "commas, e.g. 1,2,4") from None
    return values


def _str_list(text: Optional[str]) -> tuple[str, ...] | None:
    return None if text is None else tuple(part.strip() for part in text.split(","))


def _progress(output_format: str):
    """A rich progress bar on stderr when it is a terminal and the output is a table
    (a redirected stderr or machine-readable output gets no bar codes), else no-op."""
    console = Console(stderr=True)
    if output_format != "table" or not console.is_terminal:
        return nullcontext(None)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _callback(bar):
    """Adapt a rich Progress to the planner's ``(phase, done, total)`` callback."""
    if bar is None:
        return None
    tasks: dict[str, int] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)
    return update


def register(app: typer.Typer, parse_overrides, check_choice, exit_oom: int) -> None:
    """Add the ``plan`` and ``sweep`` commands to ``app``."""

    @app.command()
    def plan(
        model: str = typer.Option(..., help="Model preset, model TOML or config.json."),
        cluster: str = typer.Option("dgx-h100", help="Cluster preset or preset TOML file."),
        gpus: Optional[int] = typer.Option(None, help="GPUs of the job (omit with --days to "
                                           "ask how many are needed)."),
        seq_len: int = typer.Option(4096, help="Tokens per sequence."),
        global_batch: Optional[int] = typer.Option(None, help="Sequences per step (default "
                                                   "~4M tokens, a power of two)."),
        tokens: Optional[str] = typer.Option(None, help="Tokens to train, e.g. 15T: gives "
                                             "days to train."),
        days: Optional[float] = typer.Option(None, help="With --tokens and no --gpus: the "
                                             "deadline; find the GPUs needed."),
        price_per_gpu_hour: Optional[float] = typer.Option(None, help="Price of a GPU-hour: "
                                                           "gives the cost."),
        top: int = typer.Option(10, help="Plans to show."),
        sort: str = typer.Option("time", help="time or cost."),
        profile: str = typer.Option("llama3-h100", help="Failure profile for goodput."),
        tp: Optional[str] = typer.Option(None, help="TP sizes to try, e.g. 4,8."),
        pp: Optional[str] = typer.Option(None, help="PP sizes to try."),
        cp: Optional[str] = typer.Option(None, help="CP sizes to try."),
        ep: Optional[str] = typer.Option(None, help="EP sizes to try (MoE)."),
        vpp: Optional[str] = typer.Option(None, help="Virtual stages to try (interleaved)."),
        micro_batch: str = typer.Option("1,2,4", help="Micro-batch sizes to try."),
        zero: str = typer.Option("0,1,2,3", help="ZeRO stages to try."),
        recompute: str = typer.Option("none,full", help="Recompute modes to try."),
        schedule: str = typer.Option("1f1b,interleaved,zb-h1", help="Schedules to try."),
        workers: Optional[int] = typer.Option(None, help="Simulating processes."),
        output_format: str = typer.Option("table", "--format", help="table, json or csv."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a preset field."),
    ) -> None:
        """Rank parallel plans by time to train (with failure goodput) and cost."""
        from trainsim import planner

        check_choice("format", output_format, PLAN_FORMATS)
        space = planner.SearchSpace(
            tp=_int_list("tp", tp), pp=_int_list("pp", pp), cp=_int_list("cp", cp),
            ep=_int_list("ep", ep), vpp=_int_list("vpp", vpp),
            micro_batch=_int_list("micro_batch", micro_batch),
            zero=_int_list("zero", zero), recompute=_str_list(recompute),
            schedule=_str_list(schedule))
        common = dict(cluster=cluster, seq_len=seq_len, global_batch=global_batch,
                      price_per_gpu_hour=price_per_gpu_hour, profile=profile, space=space,
                      workers=workers,
                      overrides=parse_overrides(set_))
        with _progress(output_format) as bar:
            if gpus is None:
                if days is None or tokens is None:
                    raise ValueError("gpus: give --gpus, or --tokens and --days to find the "
                                     "GPUs needed")
                result = planner.gpus_needed(model, tokens=tokens, days=days,
                                             progress=_callback(bar), **common)
                _emit_needed(result, output_format)
                return
            if days is not None:
                raise ValueError("days: give --days without --gpus (the question is how "
                                 "many GPUs); with --gpus use --tokens for days to train")
            report = planner.search(model, gpus=gpus, tokens=tokens, top=top, sort=sort,
                                    progress=_callback(bar), **common)
        _emit_report(report, output_format)

    @app.command()
    def sweep(
        spec: str = typer.Argument(..., help="Sweep spec YAML (see README: base, grid, "
                                   "scenarios)."),
        out: str = typer.Option(..., help="Results table: .parquet or .csv."),
        backend: str = typer.Option("local", help="local (processes) or ray."),
        workers: Optional[int] = typer.Option(None, help="Parallel workers (local: processes; "
                                              "default: CPUs)."),
        address: Optional[str] = typer.Option(None, help="Ray cluster address (ray backend; "
                                              "default: start a local instance)."),
        cache: Optional[str] = typer.Option(None, help="Cache directory (default: "
                                            "OUT.cache)."),
        fresh: bool = typer.Option(False, help="Ignore cached results."),
    ) -> None:
        """Run a grid or list of scenarios; results as one tidy table, resumable."""
        from trainsim import sweeps

        check_choice("backend", backend, sweeps.BACKENDS)
        scenarios = sweeps.load_spec(spec)
        console = Console(stderr=True)
        with _progress("table") as bar:
            summary = sweeps.run_sweep(scenarios, out, backend=backend, workers=workers,
                                       address=address, cache_dir=cache, fresh=fresh,
                                       progress=_callback(bar))
        console.print(f"{summary['scenarios']} scenarios: {summary['computed']} computed, "
                      f"{summary['cached']} from cache, {summary['failed']} failed -> {out}")


def _emit_report(report, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(report.plans, indent=1))
        _print_counts(report, Console(stderr=True))
        return
    frame = report.to_frame()
    if output_format == "csv":
        print(frame.to_csv(index=False), end="")
        _print_counts(report, Console(stderr=True))
        return
    console = Console(width=200)
    i = report.inputs
    console.print(f"# {i['model']} on {i['gpus']} GPUs of {i['cluster']}: seq {i['seq_len']}, "
                  f"global batch {i['global_batch']}; goodput {i['failure_goodput']:.3f} "
                  f"({i['profile']}, Young-Daly {i['failure_checkpoint_interval_s'] / 60:.1f} "
                  f"min); fidelity {i['final_fidelity']}")
    table = Table(box=None, pad_edge=False)
    columns = ("rank", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "zero", "recompute",
               "schedule", "step_time_s", "mfu", "peak_memory_GiB", "days_to_train", "cost")
    for column in columns:
        table.add_column(column, justify="left" if column in ("recompute", "schedule")
                         else "right")
    for row in frame.to_dict(orient="records"):
        table.add_row(*(_fmt(row[c]) for c in columns))
    console.print(table)
    _print_counts(report, console)


def _print_counts(report, console: Console) -> None:
    c = report.counts
    console.print(f"{c['enumerated']} plans enumerated: {c['invalid']} invalid, "
                  f"{c['equivalent']} equivalent to another, "
                  f"{c['bounded']} bounded out (cannot reach the top), {c['examined']} "
                  f"examined: {c['out_of_memory']} out of memory, {c['dominated']} "
                  f"dominated, {c['feasible']} feasible ranked "
                  f"({c['simulated']} simulated)")
    for reason, count in report.dropped.items():
        console.print(f"  {count:6d}  {reason}")


def _emit_needed(result, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(result, indent=1))
        return
    frame = __import__("pandas").DataFrame(result["tried"])
    if output_format == "csv":
        print(frame.to_csv(index=False), end="")
        return
    console = Console(width=200)
    answer = result["answer"]
    if answer is None:
        console.print(f"no GPU count up to {result['max_gpus_tried']} trains "
                      f"{result['tokens']:.3g} tokens in {result['days']} days")
    else:
        plan = answer["plan"]
        console.print(f"{answer['gpus']} GPUs: {answer['days_to_train']:.1f} days with tp "
                      f"{plan['tp']} pp {plan['pp']} dp {plan['dp']} cp {plan['cp']} vpp "
                      f"{plan['vpp']} micro-batch {plan['micro_batch']} zero {plan['zero']} "
                      f"recompute {plan['recompute']} schedule {plan['schedule']}")
    table = Table(box=None, pad_edge=False)
    for column in frame.columns:
        table.add_column(column, justify="right")
    for row in frame.to_dict(orient="records"):
        table.add_row(*(_fmt(v) for v in row.values()))
    console.print(table)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)
