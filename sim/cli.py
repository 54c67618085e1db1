"""The ``trainsim`` command line.

User mistakes (unknown preset, bad size, impossible layout, ...) print one
line ``error: <field>: <value> ... valid: ...`` on stderr and exit with code 2;
they never show a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from hardware.catalog import parse_override

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
    fidelity: str = typer.Option("analytic", help="analytic (alpha-beta) or flow (max-min)."),
    dtype: str = typer.Option("float", "--type", help="Element type for the count column."),
    output_format: str = typer.Option("table", "--format", help="table, csv or json."),
    set_: Optional[List[str]] = typer.Option(None, "--set",
                                             help="Override a preset field: key=value "
                                                  "(e.g. nic.gbit_per_s=200); repeatable."),
) -> None:
    """Simulate nccl-tests for one collective over all GPUs of the job."""
    from sim import api

    _check_choice("format", output_format, FORMATS)
    spec = api.resolve_cluster(cluster, _overrides(set_))
    rows_done: list = []
    console = Console(stderr=True)
    show_progress = output_format == "table" and console.is_terminal
    with console.status("simulating...", spinner="dots") if show_progress else _nullcontext():
        df = api.collective(op, cluster=spec, nodes=nodes, gpus_per_node=gpus_per_node,
                            algorithm=algorithm, min_bytes=min_bytes, max_bytes=max_bytes,
                            step_factor=step_factor, fidelity=fidelity, dtype=dtype,
                            on_row=rows_done.append)
    ranks = nodes * (gpus_per_node or spec.gpus_per_node)
    if output_format == "json":
        print(json.dumps(df.to_dict(orient="records"), indent=1))
    elif output_format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        _print_nccl_table(df, op, spec.name, nodes, ranks, fidelity)


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


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@hardware_app.command("list")
def hardware_list(
    output_format: str = typer.Option("table", "--format", help="table, csv or json."),
) -> None:
    """List the built-in cluster presets."""
    from sim import api

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
    from sim import api

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
