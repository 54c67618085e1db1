"""``trainsim validate replay|collectives|gemm|compare|published`` and ``trainsim calibrate``.

torch and the ``validate`` package are imported inside the commands only, so ``trainsim
simulate`` never loads torch (tests/test_layering.py). ``validate replay --model`` takes
the same plan options (and ``--scenario``) as ``trainsim simulate``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from trainsim.cli import options
from trainsim.cli.errors import check_choice, check_output_dir, check_output_path, json_text
from trainsim.cli.output import comment, console, spinner, table

#: Exit code of ``validate compare`` past ``--tolerance`` (2 stays "bad input").
EXIT_OUT_OF_TOLERANCE = 1
#: Most iterations (and warm-up iterations) of a replay, and timed calls per point of a
#: microbenchmark: a typo of 1e9 would run for years.
MAX_ITERATIONS = 100_000


def _split(text: str, field: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError(f"{field}: {text!r} is empty; give a comma-separated list")
    return items


def _sizes(text: str, field: str) -> list[int]:
    from hardware.units import parse_size_bytes

    return [parse_size_bytes(part, field=field) for part in _split(text, field)]


def _check_counts(**counts: int) -> None:
    """Timed calls, warm-up calls and nodes of a microbenchmark: in range.

    Raises:
        ValueError: one line naming the option.
    """
    for name, value in counts.items():
        low = 0 if name == "warmup" else 1
        if not low <= value <= MAX_ITERATIONS:
            raise ValueError(f"{name}: {value} is not valid; give a whole number from {low} "
                             f"to {MAX_ITERATIONS}")


def _backend(backend: str) -> str:
    from validate.worker import resolve_backend

    return resolve_backend(backend)


def _run(task: dict, nproc: Optional[int]) -> int:
    """Run a measurement task: N local processes, or this one inside torchrun/srun.
    Returns this process's rank (0 for a local launch): only rank 0 reports.

    Raises:
        ValueError: no --nproc outside a job; a worker failed (with its exit code).
    """
    from validate.launch import distributed_env, launch_local

    if nproc is not None:
        code = launch_local(task, nproc)
        if code:
            print(f"error: a rank exited with code {code}; measurements finished so far are "
                  f"in {task['out']}; rerun the same command to resume", file=sys.stderr)
            sys.exit(code)
        return 0
    env = distributed_env()
    if env is None:
        raise ValueError("nproc: not inside torchrun/srun; give --nproc N to start N local "
                         "ranks")
    from validate.worker import run_task

    run_task(task, env)
    return env.rank


def _program(example: Optional[str], program_file: Optional[str], source):
    """The Program to replay: a built-in example, a Program file, or the step of the
    scenario's model and plan (as ``trainsim simulate`` lowers it, every rank listed)."""
    from validate.examples import example_program, full_program
    from validate.program_io import load_program

    given = [name for name, value in (("example", example), ("program", program_file),
                                      ("model", source.model or source.job)) if value]
    if len(given) != 1:
        raise ValueError("program: give exactly one of --example NAME, --program FILE or "
                         "--model M (or --megatron-args / --nemo-config) (got "
                         f"{', '.join(given) or 'none'})")
    if example:
        return example_program(example)
    if program_file:
        return load_program(program_file)
    from strategies.plan import validate_plan
    from trainsim import resolve

    job = resolve.imported_job(source)
    spec = resolve.model_of(source, job)
    plan = resolve.plan_of(source, job)
    validate_plan(plan, num_layers=spec.num_layers, num_heads=spec.num_heads,
                  num_kv_heads=spec.num_kv_heads,
                  num_experts=spec.moe.num_experts if spec.moe else 0, gpus=source.gpus)
    return full_program(spec, plan)


def register(app: typer.Typer) -> None:
    """Add ``validate`` (a sub-app) and ``calibrate`` to ``app``."""
    validate_app = typer.Typer(help="Replay Programs on real hardware with torch.distributed, "
                                    "microbenchmark, compare with the simulator.",
                               no_args_is_help=True)
    app.add_typer(validate_app, name="validate")

    @validate_app.command("replay")
    @options.with_plan_options()
    def replay(
        out: str = typer.Option(..., help="Measurement directory (created; resumed if it "
                                "holds the same program)."),
        example: Optional[str] = typer.Option(None, help="Built-in example: tiny."),
        program: Optional[str] = typer.Option(None, help="Program JSON file."),
        scenario: Optional[str] = options.scenario_option(),
        model: Optional[str] = typer.Option(None, help="Model preset or file (with plan "
                                            "flags, or a scenario)."),
        megatron_args: Optional[str] = options.megatron_args_option(),
        nemo_config: Optional[str] = options.nemo_config_option(),
        cluster: Optional[str] = typer.Option(None, help="Preset of this hardware, recorded "
                                              "for calibrate and compare (e.g. dgx-h100)."),
        gpus: Optional[int] = typer.Option(None, help="GPUs (= dp*tp*pp*cp) with --model."),
        backend: str = typer.Option("auto", help="nccl, gloo, or auto (nccl with CUDA)."),
        iterations: int = typer.Option(5, help="Measured iterations (K)."),
        warmup: int = typer.Option(2, help="Warm-up iterations (W), not recorded."),
        nproc: Optional[int] = typer.Option(None, help="Start N local ranks (omit under "
                                            "torchrun/srun)."),
        timeout_s: float = typer.Option(300.0, help="Give up on a peer after this long (s)."),
        **plan: Any,
    ) -> None:
        """Replay a Program on real hardware, timing every op of every rank."""
        from sim.atomic_io import write_text_atomic
        from validate.program_io import program_to_json

        if not 1 <= iterations <= MAX_ITERATIONS or not 0 <= warmup <= MAX_ITERATIONS:
            raise ValueError(f"iterations: {iterations} / warmup: {warmup} are not valid; "
                             f"valid: 1 <= iterations <= {MAX_ITERATIONS}, 0 <= warmup <= "
                             f"{MAX_ITERATIONS}")
        if not 0 < timeout_s <= 86400:
            raise ValueError(f"timeout_s: {timeout_s!r} is not valid; give seconds in (0, "
                             "86400]")
        check_output_dir("out", out)
        source = options.scenario_from_options(scenario=scenario, model=model,
                                               cluster=cluster, gpus=gpus, plan=plan,
                                               megatron_args=megatron_args,
                                               nemo_config=nemo_config)
        if isinstance(source.cluster, str):
            cluster = source.cluster  # recorded for calibrate and compare
        prog = _program(example, program, source)
        if nproc is not None and nproc != prog.world_size:
            raise ValueError(f"nproc: {nproc} is not valid for this program; valid: "
                             f"{prog.world_size} (its world size)")
        text = program_to_json(prog)
        directory = Path(out)
        existing = directory / "program.json"
        if existing.exists() and existing.read_text(encoding="utf-8") != text:
            raise ValueError(f"out: {out!r} holds measurements of another program; valid: a "
                             "new directory, or the same program to resume")
        directory.mkdir(parents=True, exist_ok=True)
        if not existing.exists():
            write_text_atomic(existing, text)
        chosen = _backend(backend)
        if cluster:
            from hardware.catalog import load_cluster
            from validate.calibrate import preset_path

            load_cluster(preset_path(cluster))  # a bad name fails now, not after the run
        task = {"task": "replay", "out": str(directory), "backend": chosen, "cluster": cluster,
                "iterations": iterations, "warmup": warmup, "timeout_s": timeout_s,
                "source": {"example": example, "program": program, "model": source.model,
                           "gpus": source.gpus, "plan": dict(source.plan),
                           "import": dict(source.job)}}
        write_text_atomic(directory / "run.json", json.dumps(task, indent=1, sort_keys=True))
        if _run(task, nproc):
            return
        from validate.spans import load_measurements

        measured = load_measurements(directory)
        steps = measured.step_times_ns()
        print(f"replayed {prog.name!r} on {prog.world_size} ranks ({chosen}): "
              f"{len(steps)} iterations in {out}; step time mean "
              f"{measured.step_time_ns() / 1e6:.2f} "
              f"ms (min {min(steps) / 1e6:.2f}, max {max(steps) / 1e6:.2f})")

    @validate_app.command("collectives")
    def collectives(
        out: str = typer.Option(..., help="Measurement directory."),
        ops: str = typer.Option("all_reduce,all_gather,reduce_scatter,alltoall,broadcast,"
                                "sendrecv", help="Comma-separated collectives."),
        min_bytes: str = typer.Option("1K", help="Smallest size (nccl-tests -b)."),
        max_bytes: str = typer.Option("16M", help="Largest size (nccl-tests -e)."),
        step_factor: int = typer.Option(2, help="Size multiplier (nccl-tests -f)."),
        dtype: str = typer.Option("float", "--type", help="Element type (nccl-tests -d)."),
        iters: int = typer.Option(20, help="Timed calls per size (nccl-tests -n)."),
        warmup: int = typer.Option(5, help="Warm-up calls per size (nccl-tests -w)."),
        backend: str = typer.Option("auto", help="nccl, gloo, or auto."),
        nodes: int = typer.Option(1, help="Nodes the ranks span (recorded for calibration)."),
        nproc: Optional[int] = typer.Option(None, help="Start N local ranks."),
        output_format: str = typer.Option("table", "--format", help="table (nccl-tests "
                                          "layout) or json."),
    ) -> None:
        """Time collectives over a size sweep, in nccl-tests' columns."""
        from hardware.units import parse_size_bytes
        from sim.collective_bench import sweep_sizes
        from validate.microbench import MICROBENCH_OPS

        check_choice("format", output_format, ("table", "json"))
        chosen_ops = _split(ops, "ops")
        for op in chosen_ops:
            check_choice("ops", op, MICROBENCH_OPS)
        sizes = sweep_sizes(parse_size_bytes(min_bytes, field="min-bytes"),
                            parse_size_bytes(max_bytes, field="max-bytes"), step_factor)
        _check_counts(iters=iters, warmup=warmup, nodes=nodes)
        check_output_dir("out", out)
        task = {"task": "collectives", "out": out, "backend": _backend(backend),
                "ops": chosen_ops, "sizes": sizes, "type": dtype, "iters": iters,
                "warmup": warmup, "nodes": nodes}
        if not _run(task, nproc):
            _print_collectives(out, chosen_ops, output_format)

    @validate_app.command("gemm")
    def gemm(
        out: str = typer.Option(..., help="Measurement directory."),
        sizes: str = typer.Option("256,512,1024,2048", help="Square GEMM sizes n (n x n x n)."),
        shapes: Optional[str] = typer.Option(None, help="More GEMMs as BxMxNxK, comma-"
                                             "separated ([b,m,k] @ [b,k,n]), e.g. "
                                             "1x8192x1024x8192."),
        dtype: str = typer.Option("bf16", help="bf16, fp16, fp32 or fp64."),
        copy_sizes: str = typer.Option("1M,4M,16M,64M", help="Copy sizes for memory "
                                       "bandwidth."),
        iters: int = typer.Option(10, help="Timed calls per point."),
        warmup: int = typer.Option(3, help="Warm-up calls per point."),
        backend: str = typer.Option("auto", help="nccl (GPU) or gloo (CPU), or auto."),
        nproc: Optional[int] = typer.Option(1, help="Local ranks (each measures its own "
                                            "device)."),
    ) -> None:
        """Time GEMMs of a shape sweep and copies (memory bandwidth) on each rank's device."""
        gemm_sizes = [int(part) for part in _split(sizes, "sizes") if part.isdigit()]
        if len(gemm_sizes) != len(_split(sizes, "sizes")) or min(gemm_sizes) <= 0:
            raise ValueError(f"sizes: {sizes!r} is not valid; give positive integers, e.g. "
                             "256,512,1024")
        gemm_shapes = []
        for text in _split(shapes, "shapes") if shapes else []:
            parts = text.lower().split("x")
            if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"shapes: {text!r} is not valid; give BxMxNxK with positive "
                                 "integers, e.g. 1x4096x4096x4096")
            gemm_shapes.append([int(p) for p in parts])
        _check_counts(iters=iters, warmup=warmup)
        check_output_dir("out", out)
        task = {"task": "gemm", "out": out, "backend": _backend(backend), "dtype": dtype,
                "gemm_sizes": gemm_sizes, "gemm_shapes": gemm_shapes,
                "copy_sizes": _sizes(copy_sizes, "copy-sizes"),
                "iters": iters, "warmup": warmup}
        if _run(task, nproc):
            return
        from validate.store import MeasurementStore

        records = MeasurementStore(out).read_series("compute").get(0, [])
        rows = ((rec["kind"], rec["dtype"], f"{rec['work']:.4g}", f"{rec['time_s'] * 1e6:.2f}",
                 f"{rec['flops_per_s'] / 1e12:.3f} TFLOP/s" if rec["kind"] == "matmul"
                 else f"{rec['bytes_per_s'] / 1e9:.2f} GB/s") for rec in records)
        console().print(table(("kind", "dtype", "work", "time (us)", "rate"), rows,
                              title=f"# rank 0 compute microbenchmarks in {out}; GB/s = 1e9 "
                                    "B/s", left=("kind", "dtype")))

    @validate_app.command("compare")
    def compare(
        directory: str = typer.Argument(..., help="A directory written by validate replay."),
        calibration: Optional[str] = typer.Option(None, help="Calibration file to apply."),
        cluster: Optional[str] = typer.Option(None, help="Preset, or cpu-host (default: the "
                                              "calibration's, or cpu-host for CPU runs)."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a preset "
                                                 "field."),
        fidelity: str = typer.Option("analytic", help="analytic or flow."),
        tolerance: float = typer.Option(0.15, help="Exit 1 when the step-time error exceeds "
                                        "this fraction."),
        output_format: str = typer.Option("table", "--format", help="table or json."),
        trace: Optional[str] = typer.Option(None, help="Write Perfetto traces PREFIX.measured"
                                            ".json and PREFIX.simulated.json."),
    ) -> None:
        """Simulate what DIR measured; print the error per op kind and of the step time."""
        from validate.compare import compare as run_compare

        check_choice("format", output_format, ("table", "json"))
        if trace is not None:
            check_output_path("trace", f"{trace}.measured.json")
        result = run_compare(directory, calibration=calibration, cluster=cluster,
                             overrides=options.parse_overrides(set_), fidelity=fidelity,
                             tolerance=tolerance, trace_prefix=trace)
        if output_format == "json":
            print(json_text(result, indent=1))
        else:
            _print_compare(result)
        if not result["within_tolerance"]:
            print(f"error: step_time_error: {result['step_time_error']:.3f} exceeds tolerance "
                  f"{tolerance:g}", file=sys.stderr)
            sys.exit(EXIT_OUT_OF_TOLERANCE)

    @validate_app.command("published")
    def published(
        source: Optional[List[str]] = typer.Option(None, help="Only these source_ids "
                                                   "(repeatable)."),
        role: str = typer.Option("validation", help="validation, calibration or all rows."),
        worst: int = typer.Option(10, help="List this many rows with the largest errors."),
        fit: bool = typer.Option(False, help="Also refit each preset's sustained_fraction on "
                                 "its calibration rows (roles.toml) and print it."),
        output_format: str = typer.Option("table", "--format", help="table, json or "
                                          "markdown."),
        write_readme: Optional[str] = typer.Option(None, help="With --format markdown: put "
                                                   "the table in this README's generated "
                                                   "block."),
    ) -> None:
        """Simulate every published training run in validate/data/published and print the
        step-time error per source (median, p90, bias, worst rows)."""
        from validate.published_report import (build_report, markdown, readme_text,
                                               replace_readme_block)

        check_choice("format", output_format, ("table", "json", "markdown"))
        check_choice("role", role, ("validation", "calibration", "all"))
        if worst < 0:
            raise typer.BadParameter(f"worst: {worst} is not valid; give a count >= 0")
        if write_readme is not None:
            if output_format != "markdown":
                raise typer.BadParameter("write-readme: needs --format markdown")
            readme_text(write_readme)  # before the simulations: a bad file costs nothing
        with spinner(output_format == "table", "simulating the published runs..."):
            report = build_report(sources=source or None, role=role)
        if output_format == "markdown":
            block = markdown(report, worst=worst)
            if write_readme:
                replace_readme_block(write_readme, block)
            print(block, end="")
        elif output_format == "json":
            # A statistic of no compared rows (a source whose runs are all out of scope)
            # is NaN in the frame and null in JSON, which has no NaN.
            print(json_text(_nan_as_null({
                "summary": report.summary.to_dict(orient="records"),
                "rows": report.rows.to_dict(orient="records"),
                "memory_fits": report.memory_fits}), indent=1, default=str))
        else:
            _print_published(report, worst)
        if fit:
            from validate.calibrate_published import calibration_table

            fits = calibration_table(fit=True)
            console().print(table(
                ("preset", "rows", "now", "fitted", "median error now", "median error fitted"),
                ((r.preset, r.rows, f"{r.current:.4f}", f"{r.fitted:.4f}",
                  f"{r.median_error_current:+.2%}", f"{r.median_error_fitted:+.2%}")
                 for r in fits.itertuples()),
                title="gpu.sustained_fraction per preset, fitted on its calibration rows "
                      "(roles.toml)", left=("preset",)))

    @app.command("calibrate")
    def calibrate(
        inputs: List[str] = typer.Argument(..., help="Measurement directories, nccl-tests "
                                           "logs, or nccl-tests CSV tables."),
        out: str = typer.Option(..., help="Calibration TOML file to write."),
        cluster: Optional[str] = typer.Option(None, help="Preset the measurements ran on "
                                              "(default: cpu-host for CPU runs)."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a preset field "
                                                 "(kept in the calibration)."),
        source: Optional[str] = typer.Option(None, help="Only this source_id of a CSV table."),
        output_format: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Fit the hardware model to measurements; write a calibration file."""
        from validate.calibrate import calibrate as run_calibrate

        check_choice("format", output_format, ("table", "json"))
        check_output_path("out", out)
        result = run_calibrate(inputs, cluster=cluster, overrides=options.parse_overrides(set_),
                               out=out, source=source)
        if output_format == "json":
            print(json_text({"out": out, "fields": result["fields"],
                              "residuals": result["residuals"],
                              "provenance": result["provenance"]}, indent=1, default=str))
            return
        screen = console()
        comment(screen, f"# calibration of {result['provenance']['base_cluster']} written to "
                        f"{out} ({result['provenance']['comm_points']} communication and "
                        f"{result['provenance']['compute_points']} compute points)")
        screen.print(table(("field", "value"), (
            (key, f"{value:.6g}" if isinstance(value, float) else str(value))
            for key, value in sorted(result["fields"].items())),
            title="fitted fields (SI units)", left=("field",)))
        comm = result["residuals"].get("comm", {})
        if comm:
            screen.print(table(
                ("series", "points", "median", "p90", "max", "median >= 1 MiB"),
                ((series, str(e["points"]), f"{e['median_rel_err']:.3f}",
                  f"{e['p90_rel_err']:.3f}", f"{e['max_rel_err']:.3f}",
                  f"{e.get('median_rel_err_ge_1MiB', float('nan')):.3f}")
                 for series, e in comm.items()),
                title="communication fit: relative error of time (= of busbw)",
                left=("series",)))


def _nan_as_null(value: Any) -> Any:
    """``value`` with every float NaN (pandas' missing value) replaced by None."""
    if isinstance(value, dict):
        return {key: _nan_as_null(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_as_null(item) for item in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _print_published(report, worst: int) -> None:
    def percent(value: float, signed: bool = False) -> str:
        if value is None or value != value:  # NaN: nothing compared
            return "-"
        return f"{value:+.1%}" if signed else f"{value:.1%}"

    screen = console()
    chosen = report.chosen()
    comment(screen, f"# {len(chosen)} published runs ({report.role} rows), analytic fidelity; "
                    "error = simulated / published - 1")
    screen.print(table(
        ("source", "rows", "median", "p90", "bias", "worst row", "error"),
        ((r.source_id, f"{r.compared}/{r.rows}", percent(r.median_abs_error),
          percent(r.p90_abs_error), percent(r.bias, True), r.worst_row or "-",
          percent(r.worst_error, True))
         for r in report.summary.itertuples()),
        title="step-time error per source: median and p90 of |error|, bias = mean error",
        left=("source", "worst row")))
    if worst:
        screen.print(table(
            ("row", "model", "GPUs", "gpu", "dtype", "error"),
            ((r.row_id, r.model, r.gpus, r.gpu, r.dtype, f"{r.error:+.1%}")
             for r in report.worst(worst).itertuples()),
            title="largest errors", left=("row", "model", "gpu", "dtype")))
    skipped = report.not_compared()
    if len(skipped):
        screen.print(table(("rows", "status", "why"), ((r.rows, r.status, r.reason)
                                                      for r in skipped.itertuples()),
                           title="not compared", left=("status", "why"), wrap=("why",)))
    if report.memory_fits is not None:
        fit, compared = report.memory_fits
        screen.print(f"memory: {fit} of {compared} published configurations that ran fit the "
                     "memory model")


def _print_collectives(out: str, ops: list[str], output_format: str) -> None:
    from validate.nccl_log import format_nccl_tests
    from validate.store import MeasurementStore

    store = MeasurementStore(out)
    rows = store.read_series("collectives").get(0, [])
    if output_format == "json":
        print(json_text([r for r in rows if r["op"] in ops], indent=1))
        return
    env = [store.read_meta("env", rank=r) or {} for r in store.ranks()]
    hosts = [e.get("hostname", "?") for e in env]
    gpus = [(e.get("gpus") or ["cpu"])[0] for e in env]
    for op in ops:
        mine = sorted((r for r in rows if r["op"] == op), key=lambda r: r["size_bytes"])
        print(format_nccl_tests(mine, kind=op, hosts=hosts, gpus=gpus), end="")


def _print_compare(result: dict) -> None:
    screen = console()
    step = result["step_time_s"]
    comment(screen, f"# {result['inputs']['program']} on {result['inputs']['world_size']} ranks, "
                    f"simulated on {result['inputs']['cluster']} ({result['inputs']['fidelity']}"
                    f"{', calibrated' if result['inputs']['calibration'] else ''})")
    screen.print(f"step time: measured {step['measured'] * 1e3:.3f} ms (mean of "
                 f"{step['iterations_used']} of {step['iterations']} iterations), simulated "
                 f"{step['simulated'] * 1e3:.3f} ms, error {result['step_time_error']:.1%} "
                 f"(tolerance {result['tolerance']:.0%})")
    if result.get("inside_band") is not None:
        screen.print(f"80 % band of the simulated step: {step['p10'] * 1e3:.3f} - "
                     f"{step['p90'] * 1e3:.3f} ms; the measured step is "
                     f"{'inside' if result['inside_band'] else 'outside'} it")
    screen.print(table(
        ("kind", "category", "ops", "measured (ms)", "simulated (ms)", "error",
         "median op error"),
        ((kind, e["category"], str(e["ops"]), f"{e['measured_s'] * 1e3:.3f}",
          f"{e['simulated_s'] * 1e3:.3f}", "-" if e["error"] is None else f"{e['error']:.1%}",
          "-" if e["median_op_error"] is None else f"{e['median_op_error']:.1%}")
         for kind, e in result["per_op_kind"].items()),
        title="per op kind (sums over ranks; communication from the last arrival)",
        left=("kind", "category")))
