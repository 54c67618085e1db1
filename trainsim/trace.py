"""Chrome/Perfetto traces of a simulated step that say which ranks each track stands for.

The simulator replays one representative rank per pipeline stage (DESIGN.md principle 5;
ranks it must treat apart, such as stragglers, are replayed on their own). The ranks it
leaves out run the same ops at the same times as their representative. A trace therefore
shows, per node (process) and rank and stream (thread):

* ``ranks="simulated"`` (default): the replayed ranks only; each track's name ends with
  ``(×N)``, the number of ranks it stands for, and the trace's metadata
  (``otherData.stands_for``) lists them as ranges;
* ``ranks="all"``: every rank of the job, the left-out ones as copies of their
  representative's spans, named ``(mirrors rank R)``;
* a rank list such as ``"0-7,64"``: those ranks, expanded the same way.

Timestamps are in microseconds (the Trace Event Format's unit), from the step's start.

How exact a copy is: without perturbations, an expanded trace equals the replay of the
full program span for span (tests/test_trace_ranks.py). With a straggler, ranks whose
data-parallel group holds the straggler itself finish their gradient reduction and
optimizer a little later than their representative (290 µs of a 120 ms step in that
test); the step time is the same.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Mapping

from sim.atomic_io import write_bytes_atomic
from sim.timeline import Timeline

__all__ = ["MAX_TRACE_EVENTS", "TRACE_RANKS", "parse_trace_ranks", "rank_ranges",
           "representative_of", "write_step_trace"]

#: The named choices of ``--trace-ranks`` (a rank list is the third form).
TRACE_RANKS = ("simulated", "all")
#: Largest trace written (complete events): about 1.5 GB of JSON, what Perfetto's UI
#: still opens.
MAX_TRACE_EVENTS = 10_000_000


def parse_trace_ranks(text: str) -> str | tuple[int, ...]:
    """``"simulated"``, ``"all"`` or a sorted tuple of ranks from ``"0-7,64"``.

    Raises:
        ValueError: one line naming ``trace-ranks``, the value and what is valid.
    """
    text = str(text).strip()
    if text in TRACE_RANKS:
        return text
    ranks: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise ValueError(f"trace-ranks: {text!r} is not valid; give simulated, all, or "
                             "ranks such as 0-7,64")
        low = int(match.group(1))
        ranks.update(range(low, int(match.group(2) or low) + 1))
    return tuple(sorted(ranks))


def rank_ranges(ranks: Iterable[int]) -> str:
    """``"0-7, 16-23, 40"`` for ranks 0..7, 16..23 and 40."""
    out, run = [], []
    for rank in sorted(set(ranks)):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [rank]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def representative_of(result) -> dict[int, int]:
    """``{rank of the job: the replayed rank whose spans it shares}`` (a replayed rank
    maps to itself). Without a lowering (a parameter-server step), every replayed rank
    stands for itself only."""
    timeline_ranks = sorted(set(result.timeline_frame()["rank"])) if len(result.timeline) \
        else []
    lowering = getattr(result, "lowering", None)
    if lowering is None:
        return {rank: rank for rank in timeline_ranks}
    listed = set(lowering.program.ops_by_rank)
    mapping = {}
    for rank in range(lowering.program.world_size):
        if rank in listed:
            mapping[rank] = rank
        else:  # it runs what its pipeline stage's representative runs
            mapping[rank] = lowering.representatives[lowering.layout.coords(rank)["pp"]]
    return mapping


def _stands_for(mapping: Mapping[int, int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for rank, rep in mapping.items():
        groups.setdefault(rep, []).append(rank)
    return groups


def write_step_trace(result, path: str | os.PathLike[str], *,
                     ranks: str | tuple[int, ...] = "simulated") -> Path:
    """Write the step's Chrome/Perfetto trace (module docstring) atomically.

    Args:
        result: a replayed :class:`sim.step.StepResult` (event or flow fidelity).
        ranks: ``"simulated"``, ``"all"`` or ranks of the job (:func:`parse_trace_ranks`).

    Raises:
        ValueError: one line, for a rank outside the job, or a trace larger than
            :data:`MAX_TRACE_EVENTS` (naming the rank list that would fit).
    """
    timeline = result.timeline
    gpus_per_node = int(result.inputs["gpus_per_node"])
    mapping = representative_of(result)
    stands_for = _stands_for(mapping)
    if ranks == "simulated":
        chosen = sorted(stands_for)
    else:
        chosen = sorted(mapping) if ranks == "all" else list(ranks)
        outside = [r for r in chosen if r not in mapping]
        if outside:
            raise ValueError(f"trace-ranks: rank {outside[0]} is not in the job; give ranks "
                             f"0-{max(mapping)}")
    spans_of: dict[int, list[dict]] = {}
    for row in timeline.to_records():
        spans_of.setdefault(row["rank"], []).append(row)
    events = sum(len(spans_of.get(mapping[r], ())) for r in chosen)
    if events > MAX_TRACE_EVENTS:
        per_rank = max(1, events // max(1, len(chosen)))
        fits = max(1, MAX_TRACE_EVENTS // per_rank)
        raise ValueError(f"trace-ranks: {len(chosen):,} ranks make {events:,} trace events, "
                         f"more than the {MAX_TRACE_EVENTS:,} a trace viewer opens; give at "
                         f"most {fits:,} ranks, e.g. --trace-ranks 0-{fits - 1}")
    expanded = Timeline(metadata=timeline.metadata)
    for rank in chosen:
        for row in spans_of.get(mapping[rank], ()):
            expanded.record(rank, row["stream"], row["op"], row["kind"], row["start_ns"],
                            row["end_ns"], row["bytes"], row["flops"], row["category"],
                            row["op_id"], row["axis"])
    trace = expanded.to_chrome_trace(process_of=lambda rank: rank // gpus_per_node,
                                     process_label="node")
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event["name"] == "thread_name":
            match = re.match(r"rank (\d+) ", event["args"]["name"])
            rank = int(match.group(1))
            rep = mapping[rank]
            event["args"]["name"] += (f" (mirrors rank {rep})" if rep != rank else
                                      f" (×{len(stands_for[rank])})"
                                      if len(stands_for[rank]) > 1 else "")
    trace["otherData"] = {
        **trace.get("otherData", {}),
        "ranks": ("simulated ranks; each stands for the ranks listed in stands_for"
                  if ranks == "simulated" else
                  "every rank listed in stands_for is drawn; a rank that was not "
                  "simulated repeats its representative's spans"),
        "stands_for": {f"rank {rep}": rank_ranges(group)
                       for rep, group in sorted(stands_for.items())},
        "world_size": len(mapping)}
    data = json.dumps(trace, separators=(",", ":"), default=str).encode("utf-8")
    return write_bytes_atomic(path, data)
