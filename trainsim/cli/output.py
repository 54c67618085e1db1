"""What the commands print: consoles that fit the terminal, tables, headers, progress.

Tables are rich tables as wide as the terminal; without a terminal (a pipe, a file,
a test) they are :data:`DEFAULT_WIDTH` columns wide unless ``COLUMNS`` says otherwise,
and every table is designed to fit 100 columns. Numbers have one format per quantity,
and a missing value prints as ``-``.

Every command's header states the effective inputs, defaults included: the job, the
fidelity, the calibration file, the sequence length, the global batch and micro-batches,
and the overlap options (:func:`job_header`, :func:`plan_header`).
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Mapping, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
    TimeElapsedColumn
from rich.table import Table

#: Width of a console that is not a terminal, when ``COLUMNS`` is not set.
DEFAULT_WIDTH = 100


def console(*, stderr: bool = False) -> Console:
    """A console as wide as the terminal, or :data:`DEFAULT_WIDTH` (``COLUMNS``) without
    one."""
    # markup off: what we print is plain text, and a "[comm]" in a source citation or an
    # error must print as written, not vanish as a style tag.
    probe = Console(stderr=stderr, markup=False)
    if probe.is_terminal or "COLUMNS" in os.environ:
        return probe
    return Console(stderr=stderr, width=DEFAULT_WIDTH, markup=False)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
          left: Sequence[str] = (), wrap: Sequence[str] = (),
          max_widths: Mapping[str, int] | None = None, gap: int = 2,
          fold_names: bool = False) -> Table:
    """A borderless table; columns named in ``left`` are left-aligned, others right-aligned.
    Cells never wrap (a folded number misreads) except in the ``wrap`` columns (long
    text), which may be capped at ``max_widths[column]`` characters; a header may hold a
    line break (``"time\\n(us)"``) to stay narrow. ``gap`` spaces separate columns.
    ``fold_names`` puts long snake_case headers on two lines at the ``_`` nearest their
    middle (``exposed_tp`` -> ``exposed`` / ``tp``), for tables of many named columns."""
    out = Table(title=title, title_justify="left", box=None, pad_edge=False,
                padding=(0, gap, 0, 0))
    for column in columns:
        header = folded(column) if fold_names else column
        out.add_column(header, justify="left" if column in left else "right",
                       no_wrap=column not in wrap, overflow="fold" if column in wrap
                       else "ellipsis", max_width=(max_widths or {}).get(column))
    for row in rows:
        out.add_row(*(cell if isinstance(cell, str) else number(cell) for cell in row))
    return out


def folded(name: str, longest: int = 8) -> str:
    """``name`` on two lines at the ``_`` nearest its middle when it is longer than
    ``longest`` characters and has one; else ``name``."""
    cuts = [i for i, char in enumerate(name) if char == "_"]
    if len(name) <= longest or not cuts:
        return name
    cut = min(cuts, key=lambda i: (abs(2 * i - len(name)), i))
    return f"{name[:cut]}\n{name[cut + 1:]}"


def hyphen_wrapped(text: str, width: int) -> str:
    """``text`` on as many lines as it takes to keep each at most ``width`` characters,
    broken only after a hyphen (``GB200-Blackwell-186GB`` -> ``GB200-`` / ``Blackwell-`` /
    ``186GB``); a part longer than ``width`` stays whole."""
    lines = [""]
    for part in re.findall(r"[^-]*-|[^-]+$", text):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def number(value: Any, digits: int = 4) -> str:
    """A value for a table: ``-`` when missing (None, NaN), integers with thousands
    separators, other numbers with ``digits`` significant digits in fixed notation (no
    e-notation, so a column reads one way; below 1e-9 a value prints as 0)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 10**digits:
        return f"{int(value):,}"
    if abs(value) < 1e-9:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value))))) if value else 0
    return f"{value:,.{decimals}f}"


def count_text(values: Sequence[Any], limit: int = 8) -> str:
    """``"1, 2, 3"``, or the first ``limit`` values and how many in all."""
    text = ", ".join(map(str, values[:limit]))
    return text + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def comment(out: Console, text: str) -> None:
    """Print a ``# ...`` header wrapped to the console's width, every line starting with
    ``#`` (so ``grep -v '^#'`` leaves only the tables), never split inside a word."""
    for line in textwrap.wrap(text, width=out.width, subsequent_indent="#   ",
                              break_long_words=False, break_on_hyphens=False):
        out.print(line, highlight=False, soft_wrap=True)


def job_header(*, model: str | None, gpus: int | None, cluster: Any, fidelity: str,
               calibration: str | None, overrides: Mapping[str, Any] | None = None) -> str:
    """``# <model> on <gpus> GPUs of <cluster> (--set ...); fidelity F; calibration C``."""
    name = cluster.get("name") if isinstance(cluster, Mapping) else cluster
    sets = ", ".join(f"{k}={v}" for k, v in (overrides or {}).items())
    what = f"{model} on {gpus:,} GPUs of {name}" if model else f"{name}"
    return (f"# {what}{f' ({sets})' if sets else ''}; fidelity {fidelity}; calibration "
            f"{calibration or 'none'}")


def plan_header(plan: Mapping[str, Any]) -> str:
    """The effective plan in one sentence: parallel sizes, batch and sequence, schedule,
    memory options, overlap; then any other field that differs from its default."""
    from trainsim.plan_fields import PLAN_FIELDS

    tokens = plan["global_batch"] * plan["seq_len"]
    micro = plan["global_batch"] // (plan["dp"] * plan["micro_batch"])
    said = {"dp", "tp", "pp", "cp", "ep", "vpp", "global_batch", "micro_batch", "seq_len",
            "schedule", "zero", "recompute", "dtype", "sequence_parallel", "flash_attention",
            "overlap_grad_reduce", "grad_bucket_bytes"}
    other = [f"{f.name} {_plain(plan[f.name])}" for f in PLAN_FIELDS
             if f.name not in said and plan.get(f.name) is not None
             and _plain(plan[f.name]) != _plain(f.default)]
    overlap = (f"DP gradient reduction overlapped with backward in "
               f"{plan['grad_bucket_bytes'] / 1e6:g} MB buckets"
               if plan["overlap_grad_reduce"] else "DP gradient reduction after backward")
    if (plan["dtype"] == "fp8" and plan.get("fp8_recipe") == "te-delayed"
            and plan.get("amax_reduction") == "megatron"):
        # strategies.lowering StepLowerer._amax_reduction: its time shows as exposed dp
        group = "TP x CP" if plan.get("tp_only_amax_red") else "TP x DP x CP"
        overlap += (f"; FP8 amaxes all-reduced over {group} after each chunk's forward and "
                    "backward (exposed dp)")
    return (f"# plan: dp {plan['dp']} tp {plan['tp']} pp {plan['pp']} cp {plan['cp']} "
            f"ep {plan['ep']} vpp {plan['vpp']}; seq_len {plan['seq_len']:,}; global batch "
            f"{plan['global_batch']:,} sequences ({tokens / 2**20:.2f} Mi tokens) = {micro} "
            f"micro-batches of {plan['micro_batch']} per pipeline; schedule "
            f"{plan['schedule']}, zero {plan['zero']}, recompute {plan['recompute']}, "
            f"{plan['dtype']}, sequence parallel {_on(plan['sequence_parallel'])}, flash "
            f"attention {_on(plan['flash_attention'])}; {overlap}"
            + (f"; {', '.join(other)}" if other else ""))


def import_header(notes) -> str:
    """One line on an imported job: where from, settings ignored, assumptions made."""
    return (f"# imported from {notes['source']}: {len(notes['ignored'])} settings without "
            f"effect on the step ignored, {len(notes['assumed'])} assumptions (listed in "
            "--format json under inputs.import)")


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return _on(value)  # as the header says "sequence parallel on"
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def progress(enabled: bool):
    """A progress bar on stderr when ``enabled`` and stderr is a terminal (a redirected
    stderr or machine-readable output gets no bar codes); else a no-op context giving
    None."""
    err = Console(stderr=True)
    if not enabled or not err.is_terminal:
        return nullcontext(None)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True)


def spinner(enabled: bool, text: str = "simulating..."):
    """A spinner on stderr while work runs, on a terminal only."""
    err = Console(stderr=True)
    return err.status(text, spinner="dots") if enabled and err.is_terminal else nullcontext()


def progress_callback(bar) -> Callable[[str, int, int], None] | None:
    """Adapt a rich Progress to a ``(phase, done, total)`` callback."""
    if bar is None:
        return None
    tasks: dict[str, int] = {}

    def update(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)
    return update
