"""``trainsim failures``: goodput of a long run with failures and checkpoints.

Registered on the main app by :mod:`trainsim.cli`; kept apart so each command
module has one job.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer, parse_overrides, check_choice, exit_oom: int) -> None:
    """Add the ``failures`` command to ``app``."""

    @app.command()
    def failures(
        model: str = typer.Option(..., help="Model preset, model TOML or config.json."),
        cluster: str = typer.Option("dgx-h100", help="Cluster preset or preset TOML file."),
        gpus: int = typer.Option(..., help="GPUs in the job (= dp*tp*pp*cp)."),
        tp: int = typer.Option(1, help="Tensor-parallel size."),
        pp: int = typer.Option(1, help="Pipeline-parallel size."),
        dp: Optional[int] = typer.Option(None, help="Data-parallel size (default: derived)."),
        cp: int = typer.Option(1, help="Context-parallel size."),
        ep: int = typer.Option(1, help="Expert-parallel size."),
        micro_batch: int = typer.Option(1, help="Sequences per micro-batch."),
        global_batch: Optional[int] = typer.Option(None, help="Sequences per step."),
        seq_len: int = typer.Option(4096, help="Tokens per sequence."),
        zero: int = typer.Option(1, help="ZeRO stage 0-3."),
        recompute: str = typer.Option("none", help="none, selective or full."),
        schedule: str = typer.Option("1f1b", help="Pipeline schedule."),
        days: Optional[float] = typer.Option(None, help="Simulate this many days ..."),
        tokens: Optional[str] = typer.Option(None, help="... or until this many tokens "
                                             "(e.g. 15.6T)."),
        profile: str = typer.Option("llama3-h100", help="Failure profile: llama3-h100, "
                                    "meta-rsc or a TOML file."),
        checkpoint_interval: str = typer.Option("auto", help="auto, young-daly, seconds or "
                                                "a duration like 30min."),
        checkpoint_mode: str = typer.Option("sync", help="sync or async."),
        policy: Optional[str] = typer.Option(None, help="spares, wait or elastic."),
        spare_nodes: Optional[int] = typer.Option(None, help="Hot-spare nodes (default: "
                                                  "unlimited)."),
        seeds: int = typer.Option(100, help="Monte-Carlo runs."),
        seed: int = typer.Option(0, help="First random seed."),
        output_format: str = typer.Option("table", "--format", help="table or json."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a preset field."),
        calibration: Optional[str] = typer.Option(None, help="Calibration file (trainsim "
                                                  "calibrate) applied to the cluster."),
    ) -> None:
        """Interruptions, goodput and days to train of a long run, Monte-Carlo over seeds."""
        from trainsim.api import failures as simulate_failures
        from strategies.memory import OutOfMemoryError

        check_choice("format", output_format, ("table", "json"))
        if calibration:
            from trainsim.cli.validate import calibrated_cluster

            cluster, set_ = calibrated_cluster(cluster, parse_overrides(set_), calibration), None
        if (days is None) == (tokens is None):
            raise ValueError("days: give exactly one of --days or --tokens")
        try:
            result = simulate_failures(
                model, cluster=cluster, gpus=gpus, overrides=parse_overrides(set_), days=days,
                tokens=tokens, profile=profile, checkpoint_interval=checkpoint_interval,
                checkpoint_mode=checkpoint_mode, policy=policy, spare_nodes=spare_nodes,
                seeds=seeds, seed=seed, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                micro_batch=micro_batch, global_batch=global_batch, seq_len=seq_len,
                zero=zero, recompute=recompute, schedule=schedule)
        except OutOfMemoryError as oom:
            print(f"error: {oom}", file=sys.stderr)
            sys.exit(exit_oom)
        if output_format == "json":
            print(json.dumps(result.to_dict(), indent=1))
            return
        console = Console(width=140)
        for title, frame in (("summary", result.summary_frame()),
                             ("interruptions by cause", result.interruptions_frame()),
                             ("GPU-hours by cause", result.gpu_hours_frame())):
            table = Table(title=title, title_justify="left", box=None, pad_edge=False)
            table.add_column(frame.index.name or "")
            for column in frame.columns:
                table.add_column(str(column), justify="right")
            for index, row in frame.iterrows():
                table.add_row(str(index), *(_fmt(v) for v in row))
            console.print(table)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)
