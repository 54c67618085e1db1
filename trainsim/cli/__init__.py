"""trainsim.cli: the ``trainsim`` command line.

What it is: the typer app, one module per command (``collective``, ``simulate``,
``failures``, ``plan``, ``sweep``, ``hardware``, ``validate`` with ``calibrate``) and the
helpers they share: ``options`` (the plan's options generated from ParallelPlan's
metadata, scenario files, the common options), ``output`` (consoles, tables, headers,
progress) and ``errors`` (one-line errors, exit codes, output paths checked up front).

What it exports: ``app`` and ``main`` (the console script ``trainsim``).

What it must not import at module level: ``validate`` (only the validate and calibrate
commands import it, inside their functions), so ``trainsim simulate`` never loads torch.

User mistakes (unknown preset, bad size, impossible layout, ...) print one line
``error: <field>: <value> ... valid: ...`` on stderr and exit with code 2 (3 when the
plan does not fit in memory); they never show a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from trainsim.cli import collective, failures, hardware, plan, simulate, sweep, validate
from trainsim.cli.errors import EXIT_USAGE, exit_code_for

app = typer.Typer(
    name="trainsim",
    help="Simulate distributed training on GPU clusters: collectives, steps, failures, plans.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for _command in (collective, simulate, failures, plan, sweep, hardware, validate):
    _command.register(app)


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the ``trainsim`` script: run the app, report user errors in one line.

    Exits 0 on success, 2 for bad input (one line on stderr), 3 when a plan does not fit
    in memory, 1 for a failed measurement or a fault of trainsim (one line too:
    trainsim.cli.errors.exit_code_for), 130 when interrupted.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]  # the help itself, not an error line made of it
    try:
        app(args=args, standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as problem:  # bad option syntax or type, from the parser
        message = problem.format_message() if hasattr(problem, "format_message") else problem
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except BrokenPipeError:  # the reader of stdout went away (| head): not an error
        try:  # Python would flush stdout again at exit and complain on stderr
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(0)
    except Exception as problem:  # noqa: BLE001 -- one line for every failure, never a traceback
        if os.environ.get("TRAINSIM_TRACEBACK"):
            raise
        code, message = exit_code_for(problem)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
