"""``trainsim collective``: nccl-tests, simulated, for one collective over all GPUs of a job."""

from __future__ import annotations

from typing import List, Optional

import typer

from trainsim import defaults
from trainsim.cli import options
from trainsim.cli.errors import check_choice, json_text
from trainsim.cli.output import comment, console, job_header, spinner, table

FORMATS = ("table", "csv", "json", "nccl-tests")


def register(app: typer.Typer) -> None:
    """Add the ``collective`` command to ``app``."""
    app.command()(collective)


def collective(
    op: str = typer.Argument(..., help="all_reduce, all_gather, reduce_scatter, alltoall, "
                                       "broadcast, reduce or sendrecv"),
    cluster: str = typer.Option(defaults.CLUSTER, help="Preset name or preset TOML file."),
    nodes: int = typer.Option(1, help="Nodes in the job."),
    gpus_per_node: Optional[int] = typer.Option(None, help="GPUs per node (default: all)."),
    algorithm: str = typer.Option("auto", help="auto, ring, tree, nvls, nvls_tree, "
                                  "hierarchical, direct."),
    min_bytes: str = typer.Option("8", help="Smallest size (bytes; K/M/G suffixes binary)."),
    max_bytes: str = typer.Option("16GiB", help="Largest size."),
    step_factor: int = typer.Option(2, help="Size multiplier between lines (nccl-tests -f)."),
    fidelity: str = typer.Option(defaults.COLLECTIVE_FIDELITY, help="analytic or event "
                                 "(alpha-beta closed form, the same for one collective) or "
                                 "flow (max-min)."),
    dtype: str = typer.Option("float", "--type", help="Element type for the count column."),
    output_format: str = typer.Option("table", "--format", help="table, csv, json, or "
                                      "nccl-tests (its exact stdout: out-of-place and in-place "
                                      "columns, for nccl-tests log parsers)."),
    set_: Optional[List[str]] = options.set_option(),
    calibration: Optional[str] = options.calibration_option(),
) -> None:
    """Simulate nccl-tests for one collective over all GPUs of the job."""
    from trainsim import api

    check_choice("format", output_format, FORMATS)
    overrides = options.parse_overrides(set_)
    spec = api.resolve_cluster(cluster, overrides, calibration)
    with spinner(output_format == "table"):
        df = api.collective(op, cluster=spec, nodes=nodes, gpus_per_node=gpus_per_node,
                            algorithm=algorithm, min_bytes=min_bytes, max_bytes=max_bytes,
                            step_factor=step_factor, fidelity=fidelity, dtype=dtype)
    if output_format == "json":
        print(json_text(df.to_dict(orient="records"), indent=1))
    elif output_format == "nccl-tests":
        print(nccl_tests_text(df, op, spec, nodes, gpus_per_node or spec.gpus_per_node,
                              step_factor), end="")
    elif output_format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        ranks = nodes * (gpus_per_node or spec.gpus_per_node)
        out = console()
        comment(out, job_header(model=None, gpus=None, cluster=spec.name, fidelity=fidelity,
                                calibration=calibration, overrides=overrides))
        # Below 100 columns the three columns that never change in a sweep (type, redop,
        # root) move to this line, so the numbers keep their room.
        narrow = out.width < NARROW_COLUMNS
        constant = (f"; type {df['type'].iloc[0]}, redop {df['redop'].iloc[0]}, root "
                    f"{df['root'].iloc[0]}" if narrow and len(df) else "")
        comment(out, f"# {op}: {nodes} node(s), {ranks} ranks, algorithm {algorithm}; "
                     f"GB/s = 1e9 B/s{constant}")
        out.print(_nccl_table(df, narrow=narrow))


#: Console width below which the collective table leaves out its constant columns.
NARROW_COLUMNS = 100


def _nccl_table(df, *, narrow: bool = False):
    """nccl-tests' columns (size, count, type, redop, root, time, algbw, busbw) and what
    trainsim chose (algorithm, protocol); ``narrow`` leaves out type, redop and root."""
    rows = ((str(r.size_bytes), str(r.count), r.type, r.redop, str(r.root), f"{r.time_us:.2f}",
             f"{r.algbw_GBps:.2f}", f"{r.busbw_GBps:.2f}", r.algorithm, r.protocol)
            for r in df.itertuples(index=False))
    columns = ("size\n(B)", "count\n(elements)", "type", "redop", "root", "time\n(us)",
               "algbw\n(GB/s)", "busbw\n(GB/s)", "algorithm", "protocol")
    if narrow:
        keep = [i for i, c in enumerate(columns) if c not in ("type", "redop", "root")]
        columns = tuple(columns[i] for i in keep)
        rows = ([row[i] for i in keep] for row in rows)
    return table(columns, rows, left=("type", "redop", "algorithm", "protocol"))


def nccl_tests_text(df, op: str, spec, nodes: int, gpus_per_node: int, step_factor: int) -> str:
    """The sweep as nccl-tests prints it (``<op>_perf``): one ``#  Rank`` line per rank
    (host ``node<N>``), then out-of-place and in-place time, algbw, busbw and ``#wrong``
    (the simulation moves no data: ``N/A``, as nccl-tests prints with ``-c 0``); in-place
    equals out-of-place here."""
    ranks = nodes * gpus_per_node
    lines = [f"# nThread 1 nGpus 1 minBytes {df['size_bytes'].iloc[0]} maxBytes "
             f"{df['size_bytes'].iloc[-1]} step: {step_factor}(factor) warmup iters: 0 iters: "
             "1 agg iters: 1 validation: 0 graph: 0",
             "#", f"# Collective test starting: {op}_perf (simulated by trainsim)", "#",
             "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {0:6d} on {f'node{r // gpus_per_node}':>10} "
              f"device {r % gpus_per_node:2d} [0x00] {spec.gpu.name}" for r in range(ranks)]
    lines += ["#",
              f"#{'':>62}out-of-place{'':>23}in-place",
              f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7} "
              + " ".join([f"{'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"] * 2),
              f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7} "
              + " ".join([f"{'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"] * 2)]
    for r in df.itertuples(index=False):
        result = f"{r.time_us:8.2f} {r.algbw_GBps:7.2f} {r.busbw_GBps:7.2f} {'N/A':>6}"
        lines.append(f"{r.size_bytes:12d} {r.count:13d} {r.type:>9} {r.redop:>7} "
                     f"{r.root:7d} {result} {result}")
    lines += ["# Out of bounds values : 0 OK",
              f"# Avg bus bandwidth    : {df['busbw_GBps'].mean():.4f} ", "#", ""]
    return "\n".join(lines)
