"""The ``trainsim`` command line.

What it is: the typer app and ``main`` (the console script). What it exports: ``app`` and
``main``. What it must not import at module level: ``validate`` (only the validate and
calibrate commands import it, inside their functions), so ``trainsim simulate`` never
loads torch.

User mistakes (unknown preset, bad size, impossible layout, ...) print one
line ``error: <field>: <value> ... valid: ...`` on stderr and exit with code 2;
they never show a traceback.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from hardware.catalog import parse_override
from trainsim.cli.perturbations import parse_perturbations

app = typer.Typer(
    name="trainsim",
    help="Simulate distributed training on GPU clusters: collectives, steps, failures, plans.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
hardware_app = typer.Typer(help="List and inspect cluster presets.", no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")

FORMATS = ("table", "csv", "json")
EXIT_USAGE = 2
EXIT_OOM = 3


class UserError(Exception):
    """A mistake in the user's input, reported as one line."""


def _check_choice(field: str, value: str, valid: tuple[str, ...] | list[str]) -> str:
    if value not in valid:
        raise UserError(f"{field}: {value!r} is not valid; valid: {', '.join(valid)}")
    return value


def _overrides(pairs: Optional[List[str]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for text in pairs or []:
        key, value = parse_override(text)
        result[key] = value
    return result


@app.command()
def collective(
    op: str = typer.Argument(..., help="all_reduce, all_gather, reduce_scatter, alltoall, "
                                       "broadcast, reduce or sendrecv"),
    cluster: str = typer.Option("dgx-h100", help="Preset name or preset TOML file."),
    nodes: int = typer.Option(1, help="Nodes in the job."),
    gpus_per_node: Optional[int] = typer.Option(None, help="GPUs per node (default: all)."),
    algorithm: str = typer.Option("auto", help="auto, ring, tree, nvls, nvls_tree, hierarchical, direct."),
    min_bytes: str = typer.Option("8", help="Smallest size (bytes; K/M/G suffixes binary)."),
    max_bytes: str = typer.Option("16GiB", help="Largest size."),
    step_factor: int = typer.Option(2, help="Size multiplier between lines (nccl-tests -f)."),
    fidelity: str = typer.Option("analytic", help="analytic or event (alpha-beta closed "
                                 "form, the same for one collective) or flow (max-min)."),
    dtype: str = typer.Option("float", "--type", help="Element type for the count column."),
    output_format: str = typer.Option("table", "--format", help="table, csv or json."),
    set_: Optional[List[str]] = typer.Option(None, "--set",
                                             help="Override a preset field: key=value "
                                                  "(e.g. nic.gbit_per_s=200); repeatable."),
    calibration: Optional[str] = typer.Option(None, help="Calibration file (trainsim "
                                              "calibrate) applied to the cluster."),
) -> None:
    """Simulate nccl-tests for one collective over all GPUs of the job."""
    from trainsim import api

    _check_choice("format", output_format, FORMATS)
    spec = api.resolve_cluster(cluster, _overrides(set_))
    if calibration:
        spec = _calibrated(spec, calibration)
    console = Console(stderr=True)
    show_progress = output_format == "table" and console.is_terminal
    with console.status("simulating...", spinner="dots") if show_progress else nullcontext():
        df = api.collective(op, cluster=spec, nodes=nodes, gpus_per_node=gpus_per_node,
                            algorithm=algorithm, min_bytes=min_bytes, max_bytes=max_bytes,
                            step_factor=step_factor, fidelity=fidelity, dtype=dtype)
    ranks = nodes * (gpus_per_node or spec.gpus_per_node)
    if output_format == "json":
        print(json.dumps(df.to_dict(orient="records"), indent=1))
    elif output_format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        _print_nccl_table(df, op, spec.name, nodes, ranks, fidelity)


@app.command()
def simulate(
    model: str = typer.Option(..., help="Model preset, model TOML or Hugging Face config.json."),
    cluster: str = typer.Option("dgx-h100", help="Cluster preset or preset TOML file."),
    gpus: int = typer.Option(..., help="GPUs in the job (= dp*tp*pp*cp)."),
    tp: int = typer.Option(1, help="Tensor-parallel size."),
    pp: int = typer.Option(1, help="Pipeline-parallel size."),
    dp: Optional[int] = typer.Option(None, help="Data-parallel size (default: gpus/(tp*pp*cp))."),
    cp: int = typer.Option(1, help="Context-parallel size."),
    ep: int = typer.Option(1, help="Expert-parallel size (MoE)."),
    vpp: int = typer.Option(1, help="Virtual pipeline stages per rank (interleaved)."),
    micro_batch: int = typer.Option(1, help="Sequences per micro-batch."),
    global_batch: Optional[int] = typer.Option(None, help="Sequences per step "
                                               "(default: dp*micro_batch*4*pp)."),
    seq_len: int = typer.Option(4096, help="Tokens per sequence."),
    zero: Optional[int] = typer.Option(None, help="ZeRO stage 0-3 (3 = FSDP); default 1, "
                                       "0 with a parameter-server --dp-mode."),
    recompute: str = typer.Option("none", help="none, selective or full."),
    schedule: str = typer.Option("1f1b", help="gpipe, 1f1b, interleaved or zb-h1."),
    dtype: str = typer.Option("bf16", help="bf16 or fp8."),
    sequence_parallel: bool = typer.Option(True, help="Sequence parallelism with TP."),
    dp_mode: str = typer.Option("allreduce", help="Data parallelism: allreduce, or parameter "
                                "servers ps-sync, ps-async or ps-stale (needs tp=pp=cp=1)."),
    ps_servers: int = typer.Option(0, help="Parameter-server shards (0 = one per worker node); "
                                   "dedicated servers use GPUs beyond --gpus."),
    ps_placement: str = typer.Option("dedicated", help="dedicated (extra nodes) or colocated "
                                     "(on worker GPUs)."),
    staleness: int = typer.Option(0, help="ps-stale: steps a worker may run ahead of the "
                                  "parameters it uses."),
    ps_steps: int = typer.Option(1, help="Steps simulated in parameter-server modes (async "
                                 "and stale need >= 2; the step time is the steady-state "
                                 "interval)."),
    fidelity: str = typer.Option("event", help="analytic (closed form, ms: for sweeps), "
                                 "event (replay of every op) or flow (replay with per-link "
                                 "contention)."),
    output_format: str = typer.Option("table", "--format", help="table or json."),
    trace: Optional[str] = typer.Option(None, help="Write a Perfetto/Chrome trace here."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a preset field."),
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
    layers_per_stage: Optional[str] = typer.Option(None, help="Uneven split of the layers over "
                                                   "pp*vpp stages, e.g. 7,8,8,...,7."),
    calibration: Optional[str] = typer.Option(None, help="Calibration file (trainsim "
                                              "calibrate) applied to the cluster."),
) -> None:
    """Simulate one training step: step time, MFU, memory and where the time goes."""
    from trainsim import api
    from strategies.memory import OutOfMemoryError

    _check_choice("format", output_format, ("table", "json"))
    if calibration:
        spec = _calibrated(api.resolve_cluster(cluster, _overrides(set_)), calibration)
        cluster, set_ = spec, None
    if trace and fidelity == "analytic":
        raise UserError("trace: the analytic fidelity replays no ops; give --fidelity event "
                        "or flow to write a trace")
    try:
        result = api.simulate(model, cluster=cluster, gpus=gpus, fidelity=fidelity,
                              perturbations=parse_perturbations(
                                  straggler=straggler, thermal=thermal,
                                  degraded_nic=degraded_nic, flapping_link=flapping_link,
                                  node_gpu=node_gpu),
                              layers_per_stage=_layer_split(layers_per_stage),
                              overrides=_overrides(set_), tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                              vpp=vpp, micro_batch=micro_batch, global_batch=global_batch,
                              seq_len=seq_len, zero=zero, recompute=recompute,
                              schedule=schedule, dtype=dtype,
                              sequence_parallel=sequence_parallel, dp_mode=dp_mode,
                              ps_servers=ps_servers, ps_placement=ps_placement,
                              staleness=staleness, ps_steps=ps_steps)
    except OutOfMemoryError as oom:
        if output_format == "json":
            print(json.dumps({"error": "out_of_memory", "rank": oom.rank,
                              "capacity_bytes": oom.capacity_bytes,
                              "memory": oom.breakdown.to_dict()}, indent=1))
        print(f"error: {oom}", file=sys.stderr)
        sys.exit(EXIT_OOM)
    if trace:
        result.write_trace(trace, gpus_per_node=int(result.inputs["gpus_per_node"]))
    if output_format == "json":
        print(json.dumps(result.to_dict(), indent=1))
        return
    _print_step(result)


def _calibrated(spec, calibration: str):
    """``spec`` with a calibration file applied (hardware.calibration)."""
    from hardware.calibration import apply_calibration, load_calibration

    return apply_calibration(spec, load_calibration(calibration))


def _layer_split(text: Optional[str]) -> tuple[int, ...] | None:
    """``"7,8,7"`` -> ``(7, 8, 7)``; one-line error for anything else."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"layers_per_stage: {text!r} is not valid; give layer counts "
                        "separated by commas, e.g. 7,8,8,7") from None


def _print_step(result) -> None:
    console = Console(width=120)
    plan = result.inputs["plan"]
    console.print(f"# {result.inputs['model']} on {result.inputs['gpus']} GPUs of "
                  f"{result.inputs['cluster']['name']}: dp {plan['dp']} tp {plan['tp']} "
                  f"pp {plan['pp']} cp {plan['cp']} ep {plan['ep']}, "
                  f"{plan['num_microbatches']} micro-batches of {plan['micro_batch']} x "
                  f"{plan['seq_len']} tokens, schedule {plan['schedule']}, zero {plan['zero']}, "
                  f"recompute {plan['recompute']}")
    summary = Table(box=None, pad_edge=False, show_header=False)
    summary.add_column(justify="left")
    summary.add_column(justify="right")
    summary.add_row("step time (s)", f"{result.step_time_s:.4f}")
    summary.add_row("tokens/s", f"{result.tokens_per_s:,.0f}")
    summary.add_row("TFLOP/s per GPU (model)", f"{result.tflops_per_gpu:.1f}")
    summary.add_row("MFU", f"{result.mfu:.1%}")
    summary.add_row("peak memory (GiB)", f"{result.peak_memory_bytes / 2**30:.2f}")
    cost = result.perturbation_cost
    if cost is not None:
        summary.add_row("step time without perturbations (s)",
                        f"{cost['baseline_step_time_s']:.4f}")
        summary.add_row(f"what they cost (critical rank {cost['critical_rank']})",
                        f"+{cost['slowdown_s']:.4f} s ({cost['slowdown']:+.1%})")
    console.print(summary)
    ps = result.ps
    if ps is not None:
        console.print(f"parameter servers: {ps['mode']}"
                      + (f" (staleness {ps['staleness']})" if ps['mode'] == "ps-stale" else "")
                      + f", {ps['servers']} {ps['placement']} server(s) on ranks "
                      f"{_short_list(ps['server_ranks'])}, {ps['gpus_total']} GPUs on "
                      f"{ps['nodes']} nodes; step time = steady-state interval over "
                      f"{ps['steps']} step(s), makespan {ps['makespan_s']:.4f} s; server "
                      f"memory {ps['server_memory']['total_bytes'] / 2**30:.2f} GiB")
    table = Table(title="where the step goes (s), per pipeline rank", title_justify="left",
                  box=None, pad_edge=False)
    frame = result.breakdown_frame()
    table.add_column("pp")
    for column in frame.columns:
        table.add_column(column, justify="right")
    for p, row in frame.iterrows():
        table.add_row(str(p), *(f"{v:.4f}" for v in row))
    console.print(table)
    memory = Table(title="memory per pipeline rank (GiB = 2^30 B)", title_justify="left",
                   box=None, pad_edge=False)
    mem = result.memory_frame() / 2**30
    memory.add_column("pp")
    for column in mem.columns:
        memory.add_column(column.replace("_bytes", ""), justify="right")
    for p, row in mem.iterrows():
        memory.add_row(str(p), *(f"{v:.2f}" for v in row))
    console.print(memory)


def _short_list(values: list, limit: int = 8) -> str:
    text = ", ".join(map(str, values[:limit]))
    return text + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _print_nccl_table(df, op: str, cluster: str, nodes: int, ranks: int, fidelity: str) -> None:
    table = Table(title=f"# {op} on {cluster}: {nodes} node(s), {ranks} ranks, "
                        f"fidelity {fidelity}; GB/s = 1e9 B/s",
                  title_justify="left", box=None, pad_edge=False)
    for header in ("size (B)", "count (elements)", "type", "redop", "root", "time (us)",
                   "algbw (GB/s)", "busbw (GB/s)", "algorithm", "protocol"):
        table.add_column(header, justify="right" if header[0] in "scrtab" else "left")
    for row in df.itertuples(index=False):
        table.add_row(str(row.size_bytes), str(row.count), row.type, row.redop, str(row.root),
                      f"{row.time_us:.2f}", f"{row.algbw_GBps:.2f}", f"{row.busbw_GBps:.2f}",
                      row.algorithm, row.protocol)
    Console(width=200).print(table)


@hardware_app.command("list")
def hardware_list(
    output_format: str = typer.Option("table", "--format", help="table, csv or json."),
) -> None:
    """List the built-in cluster presets."""
    from trainsim import api

    _check_choice("format", output_format, FORMATS)
    df = api.hardware_list()
    if output_format == "json":
        print(json.dumps(df.to_dict(orient="records"), indent=1))
    elif output_format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        columns = ("name", "gpu", "gpus_per_node", "nvlink_domain_gpus", "nvlink_GBps_per_gpu",
                   "nvls", "nics_per_node", "nic_Gbps", "nic_kind", "fabric")
        table = Table(box=None, pad_edge=False)
        for column in columns:
            table.add_column(column)
        for row in df.to_dict(orient="records"):
            table.add_row(*(f"{row[c]:g}" if isinstance(row[c], float) else str(row[c])
                            for c in columns))
        Console(width=200).print(table)


@hardware_app.command("show")
def hardware_show(
    preset: str = typer.Argument(..., help="Preset name or preset TOML file."),
    output_format: str = typer.Option("json", "--format", help="json or table."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Override: key=value."),
) -> None:
    """Show every field of a preset, with the source of each number."""
    from trainsim import api

    _check_choice("format", output_format, ("json", "table"))
    data = api.hardware_show(preset, _overrides(set_))
    if output_format == "json":
        print(json.dumps(data, indent=1))
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("field")
    table.add_column("value")
    table.add_column("source")
    sources = data.get("sources", {})
    for key, value in _flatten(data):
        if key.startswith("sources."):
            continue
        table.add_row(key, str(value), sources.get(key, ""))
    Console(width=220).print(table)


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _register_commands() -> None:
    """Commands that live in their own modules."""
    from trainsim.cli import failures, plan, validate

    failures.register(app, _overrides, _check_choice, EXIT_OOM)
    validate.register(app, _overrides, _check_choice)
    plan.register(app, _overrides, _check_choice, EXIT_OOM)


_register_commands()


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the ``trainsim`` script: run the app, report user errors in one line."""
    try:
        app(args=argv, standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as problem:  # bad option syntax or type, from the parser
        message = problem.format_message() if hasattr(problem, "format_message") else problem
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except (UserError, ValueError) as problem:
        message = str(problem).splitlines()[0] if str(problem) else type(problem).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
