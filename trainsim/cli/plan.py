"""``trainsim plan``: which parallel plan, and how many GPUs; each plan as a scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from trainsim import defaults
from trainsim.cli import options
from trainsim.cli.errors import UserError, check_choice, json_text
from trainsim.cli.output import (comment, console, number, progress, progress_callback,
                                  table)

FORMATS = ("table", "json", "csv")
#: The plan table: (header, column of PlanReport.to_frame()); fits 100 columns.
PLAN_COLUMNS = (("#", "rank_tied"), ("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"),
                ("ep", "ep"), ("vpp", "vpp"), ("mb", "micro_batch"), ("zero", "zero"),
                ("recompute", "recompute"), ("schedule", "schedule"),
                ("step\n(s)", "step_time_s"), ("p10-p90\n(s)", "step_band"),
                ("MFU\n(%)", "mfu_percent"),
                ("mem\n(GiB)", "peak_memory_GiB"), ("days", "days_to_train"),
                ("cost", "cost"))
#: The header line names a column left out as the table would (micro_batch is "mb").
_SHORT = {"micro_batch": "mb"}
#: Columns left out of the table (and named in the header) when every plan has the same
#: value: what the search did not vary says nothing per row, and 80 columns then suffice.
_OPTIONAL_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "zero", "recompute",
                     "schedule")

def register(app: typer.Typer) -> None:
    """Add the ``plan`` command to ``app``."""
    app.command()(plan)


@options.with_plan_options(search=True)
def plan(
    model: Optional[str] = typer.Option(None, help="Model preset, model TOML or config.json "
                                        "(required unless --megatron-args / --nemo-config)."),
    megatron_args: Optional[str] = options.megatron_args_option(),
    nemo_config: Optional[str] = options.nemo_config_option(),
    cluster: str = typer.Option(defaults.CLUSTER, help="Cluster preset or preset TOML file."),
    gpus: Optional[int] = typer.Option(None, help="GPUs of the job (omit with --days to "
                                       "ask how many are needed)."),
    tokens: Optional[str] = typer.Option(None, help="Tokens to train, e.g. 15T: gives "
                                         "days to train."),
    days: Optional[float] = typer.Option(None, help="With --tokens and no --gpus: the "
                                         "deadline; find the GPUs needed."),
    price_per_gpu_hour: Optional[float] = typer.Option(None, help="Price of a GPU-hour: "
                                                       "gives the cost."),
    currency: str = typer.Option("USD", help="Currency of --price-per-gpu-hour, printed "
                                 "with every cost."),
    top: int = typer.Option(10, help="Plans to show."),
    sort: str = typer.Option("time", help="time or cost."),
    profile: str = typer.Option(defaults.FAILURES["profile"], help="Failure profile for "
                                "goodput."),
    workers: Optional[int] = typer.Option(None, help="Simulating processes."),
    output_format: str = options.format_option(FORMATS),
    emit_scenarios: Optional[str] = typer.Option(None, help="Write each plan's scenario "
                                                 "to DIR/plan-NN.toml (trainsim simulate "
                                                 "--scenario reproduces it)."),
    set_: Optional[List[str]] = options.set_option(),
    calibration: Optional[str] = options.calibration_option(),
    **plan_options: Any,
) -> None:
    """Rank parallel plans by time to train (with failure goodput) and cost."""
    from trainsim import planner

    check_choice("format", output_format, FORMATS)
    lists, fixed = options.search_lists(plan_options)
    job, table = None, options.job_table(megatron_args, nemo_config)
    if table:  # a real job: its model, GPUs and fixed fields; the layout is searched
        from trainsim import resolve
        from trainsim.importers.planning import fixed_fields
        from trainsim.scenario import Scenario

        job = resolve.imported_job(Scenario(model=model, gpus=gpus, job=table))
        fixed = {**fixed_fields(job, fixed), **fixed}
        gpus = gpus if gpus is not None else job.gpus
        table = resolve.resolved_import(table)
    if model is None and job is None:
        raise UserError("model: give --model, --megatron-args or --nemo-config")
    subject = model if model is not None else job.model
    seq_len = fixed.pop("seq_len", defaults.SEQ_LEN)
    global_batch = fixed.pop("global_batch", None)
    dtype = fixed.pop("dtype", "bf16")
    space = planner.SearchSpace(**lists)
    common = dict(cluster=cluster, seq_len=seq_len, global_batch=global_batch,
                  price_per_gpu_hour=price_per_gpu_hour, profile=profile, space=space,
                  workers=workers, overrides=options.parse_overrides(set_), dtype=dtype,
                  calibration=calibration, fixed=fixed)
    if emit_scenarios is not None:
        _check_directory(emit_scenarios)
    with progress(output_format == "table") as bar:
        if gpus is None:
            if days is None or tokens is None:
                raise UserError("gpus: give --gpus, or --tokens and --days to find the GPUs "
                                "needed")
            result = planner.gpus_needed(subject, tokens=tokens, days=days,
                                         progress=progress_callback(bar), **common)
            _emit_needed(result, output_format, currency)
            return
        if days is not None:
            raise UserError("days: give --days without --gpus (the question is how many "
                            "GPUs); with --gpus use --tokens for days to train")
        report = planner.search(subject, gpus=gpus, tokens=tokens, top=top, sort=sort,
                                progress=progress_callback(bar), **common)
    if job is not None:
        from trainsim.importers.planning import attach_import

        attach_import(report.plans, table, model_given=model is not None)
    if emit_scenarios is not None:
        _write_scenarios(report, emit_scenarios)
    _emit_report(report, output_format, currency)


def _check_directory(path: str) -> None:
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UserError(f"emit_scenarios: {path!r} is a file; give a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise UserError(f"emit_scenarios: cannot create {path!r} ({problem.strerror}); give a "
                        "writable directory") from None


def _write_scenarios(report, directory: str) -> None:
    """DIR/plan-01.toml ... one scenario per ranked plan, written atomically."""
    from sim.atomic_io import write_text_atomic
    from trainsim.scenario import scenario_from_dict

    for row in report.plans:
        scenario = scenario_from_dict(row["scenario"], where=f"plan {row['rank']}")
        write_text_atomic(Path(directory) / f"plan-{row['rank']:02d}.toml", scenario.to_toml())


def _emit_report(report, output_format: str, currency: str) -> None:
    if output_format == "json":
        print(json_text(report.plans, indent=1))
        _print_counts(report, console(stderr=True))
        return
    frame = report.to_frame()
    if output_format == "csv":
        print(frame.to_csv(index=False), end="")
        _print_counts(report, console(stderr=True))
        return
    out = console()
    i = report.inputs
    fixed = ", ".join(f"{k} {v}" for k, v in i["fixed"].items())
    comment(out, f"# {i['model']} on {i['gpus']:,} GPUs of {i['cluster']}; calibration "
                 f"{i['calibration'] or 'none'}; seq_len {i['seq_len']:,}; global batch "
                 f"{i['global_batch']:,} sequences ({i['global_batch'] * i['seq_len'] / 2**20:.2f}"
                 f" Mi tokens), micro-batches per pipeline = global batch / (dp x mb); "
                 f"{fixed or 'DP gradient reduction overlapped with backward'}; ranked at "
                 f"{i['ranking_fidelity']}, {_confirmed(report)}")
    comment(out, f"# goodput {i['failure_goodput']:.3f} ({i['profile']}, Young-Daly "
                 f"{i['failure_checkpoint_interval_s'] / 60:.1f} min)"
                 + (f"; cost ({currency}) = GPU-hours x {i['price_per_gpu_hour']:g} "
                    f"{currency} per GPU-hour" if i["price_per_gpu_hour"] else ""))
    frame = frame.assign(mfu_percent=100 * frame["mfu"], **_band_columns(frame))
    same = [c for c in _OPTIONAL_COLUMNS if frame[c].nunique(dropna=False) == 1]
    if same:
        comment(out, f"# {', '.join(f'{_SHORT.get(c, c)} {frame[c].iloc[0]}' for c in same)} "
                     "in every plan")
    columns = [(h if c != "cost" else f"cost\n({currency})", c) for h, c in PLAN_COLUMNS
               if c not in same]
    rows = ([number(row[c], 3) if c in ("step_time_s", "mfu_percent", "peak_memory_GiB",
                                         "days_to_train") else number(row[c])
             for _, c in columns] for row in frame.to_dict(orient="records"))
    out.print(table([h for h, _ in columns], rows, left=("recompute", "schedule")))
    first = frame.iloc[0]
    if first["days_band"] != "-":  # every plan's is in --format json / csv
        out.print(f"# days to train of plan 1, 80 % band: {first['days_band']}")
    tied = int(frame["tied_with_best"].sum()) - 1
    if tied > 0:
        out.print(f"# ranked by the median of the 80 % band; {tied} plan(s) marked = overlap "
                  "the best's band: not distinguishable by this simulator")
    _print_counts(report, out)


def _band_columns(frame) -> dict:
    """The table's band columns: step and days p10-p90, and the rank with '=' where the
    plan is tied with the best."""
    def short(value: float) -> str:  # two digits: the band is ~30 % wide
        return f"{value:.2g}" if value < 10 else f"{value:.0f}"

    def span(low, high) -> list[str]:
        return [f"{short(a)}-{short(b)}" if a is not None and a == a else "-"
                for a, b in zip(frame[low], frame[high])]
    return {"step_band": span("step_time_p10_s", "step_time_p90_s"),
            "days_band": span("days_to_train_p10", "days_to_train_p90"),
            "rank_tied": [f"{r}=" if t and r > 1 else str(r)
                          for t, r in zip(frame["tied_with_best"], frame["rank"])]}


def _confirmed(report) -> str:
    """Which plans the final fidelity confirmed (a plan search confirms within a replay
    budget: trainsim.planner.MAX_CONFIRM_LAYER_PASSES)."""
    i, done, shown = report.inputs, report.counts["final_simulated"], len(report.plans)
    if i["final_fidelity"] == i["ranking_fidelity"]:
        return "not confirmed (no finer fidelity)"
    # plans without a pipeline are confirmed by construction (trainsim.planner.
    # analytic_equals_event): their ranked result is the replay's
    free = done - report.counts.get("final_replayed", done)
    how = (f"; {free} without a replay: no pipeline, where {i['ranking_fidelity']} equals "
           f"{i['final_fidelity']} to the ns" if free else "")
    if done == shown:
        return f"confirmed at {i['final_fidelity']} fidelity{how}"
    return (f"{done} of {shown} confirmed at {i['final_fidelity']} fidelity (replay budget; "
            f"the others keep their {i['ranking_fidelity']} time, column fidelity in "
            f"json/csv{how})")


def _print_counts(report, out) -> None:
    c = report.counts
    out.print(f"{c['enumerated']} plans enumerated: {c['invalid']} invalid, "
              f"{c['equivalent']} equivalent to another, "
              f"{c['bounded']} bounded out (cannot reach the top), {c['examined']} "
              f"examined: {c['out_of_memory']} out of memory, {c['dominated']} "
              f"dominated, {c['feasible']} feasible ranked "
              f"({c['simulated']} simulated)")
    for reason, count in report.dropped.items():
        out.print(f"  {count:6d}  {reason}")


def _emit_needed(result, output_format: str, currency: str) -> None:
    if output_format == "json":
        print(json_text(result, indent=1))
        return
    frame = __import__("pandas").DataFrame(result["tried"])
    if output_format == "csv":
        print(frame.to_csv(index=False), end="")
        return
    out = console()
    answer = result["answer"]
    if answer is None:
        out.print(f"no GPU count up to {result['max_gpus_tried']} trains "
                  f"{result['tokens']:.3g} tokens in {result['days']} days")
    else:
        p = answer["plan"]
        out.print(f"{answer['gpus']} GPUs: {answer['days_to_train']:.1f} days with tp "
                  f"{p['tp']} pp {p['pp']} dp {p['dp']} cp {p['cp']} vpp {p['vpp']} "
                  f"micro-batch {p['micro_batch']} zero {p['zero']} recompute "
                  f"{p['recompute']} schedule {p['schedule']}; seq_len {p['seq_len']:,}, "
                  f"global batch {p['global_batch']:,}")
    cost = "cost" in frame and frame["cost"].notna().any()
    out.print(table(("GPUs", "days", "step\n(s)", "MFU\n(%)", "goodput",
                     *((f"cost\n({currency})",) if cost else ()), "plan"),
                    (_needed_row(row, cost) for row in result["tried"]),
                    left=("plan",), wrap=("plan",)))


def _needed_row(row: dict, cost: bool) -> list:
    """One GPU count tried by ``plan --days``: its best plan in a few words, or why
    there is none."""
    if row.get("days_to_train") is None:
        return [row["gpus"], None, None, None, None, *((None,) if cost else ()),
                row.get("note", "-")]
    words = [f"{axis} {row[axis]}" for axis in ("tp", "pp", "dp", "cp", "ep", "vpp")
             if axis in ("tp", "pp", "dp") or row.get(axis, 1) != 1]
    words += [f"mb {row['micro_batch']}", f"zero {row['zero']}",
              f"recompute {row['recompute']}", row["schedule"]]
    return [row["gpus"], number(row["days_to_train"], 3), number(row["step_time_s"], 3),
            number(100 * row["mfu"], 3), number(row["goodput"], 3),
            *((row.get("cost"),) if cost else ()), " ".join(words)]
