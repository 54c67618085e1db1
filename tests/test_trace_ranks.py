"""Traces of a symmetry-reduced step say which ranks each track stands for, and expand to
every rank: the expanded trace equals the replay of the full program (every rank listed)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from conftest import run_cli
from hardware.catalog import load_cluster
from hardware.cost import CostModel, RankConditions
from sim.engine import Engine
from sim.step import job_layout
from strategies.collectives.catalog import ALGORITHMS
from strategies.lowering import lower_step
from strategies.models import load_model
from trainsim import trace as tr
from trainsim.api import make_plan

GPUS, TP, PP = 16, 2, 2


def _replays(stragglers):
    """The reduced replay (what trainsim simulates) and the full one, same costs."""
    model = load_model("llama3-8b")
    plan = make_plan(gpus=GPUS, tp=TP, pp=PP, micro_batch=1, seq_len=1024, global_batch=8)
    layout = job_layout(load_cluster("dgx-h100"), GPUS)
    cost = CostModel(layout, ALGORITHMS, fidelity="event",
                     ranks={r: RankConditions(speed=v) for r, v in stragglers.items()})
    reduced = lower_step(model, plan, distinct=sorted(stragglers))
    full = lower_step(model, plan, distinct=list(range(GPUS)))
    small, big = (Engine(lowering.program, cost).run() for lowering in (reduced, full))
    result = SimpleNamespace(timeline=small.timeline, lowering=reduced,
                             inputs={"gpus_per_node": 8},
                             timeline_frame=small.timeline.to_dataframe)
    return result, big


@pytest.fixture(scope="module")
def runs():
    """A straggler (rank 5, half speed): its TP group and their pipeline peers are
    replayed on their own next to one representative per stage."""
    return _replays({5: 0.5})


def _tracks(path) -> tuple[dict, dict[int, set]]:
    """(metadata, {rank: {(stream, op, ts, dur)}}) of a written trace."""
    trace = json.loads(path.read_text())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "thread_name"}
    spans: dict[int, set] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            rank, stream = re.match(r"rank (\d+) (\S+)", names[event["pid"], event["tid"]]
                                    ).groups()
            spans.setdefault(int(rank), set()).add((stream, event["name"], event["ts"],
                                                    event["dur"]))
    return trace["otherData"], spans, names


def test_simulated_tracks_say_how_many_ranks_they_stand_for(runs, tmp_path):
    result, _ = runs
    path = tr.write_step_trace(result, tmp_path / "t.json")
    meta, spans, names = _tracks(path)
    simulated = set(result.lowering.program.ops_by_rank)
    assert set(spans) == simulated
    represents = result.lowering.program.represents
    for name in names.values():
        rank = int(name.split()[1])
        count = represents[rank]
        assert name.endswith(f"(×{count})") if count > 1 else "(" not in name, name
    # the metadata lists every rank of the job exactly once
    listed = [r for text in meta["stands_for"].values() for part in text.split(", ")
              for r in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))]
    assert sorted(listed) == list(range(GPUS)) and meta["world_size"] == GPUS
    assert meta["stands_for"]["rank 0"] == "0-3, 6-7"  # stage 0 but the straggler's TP group


def _truth(full) -> dict[int, set]:
    truth: dict[int, set] = {}
    for span in full.timeline.spans():
        truth.setdefault(span.rank, set()).add((span.stream, span.op, span.start_ns / 1000,
                                                (span.end_ns - span.start_ns) / 1000))
    return truth


def test_all_ranks_equal_the_full_replay(tmp_path):
    result, full = _replays({})
    path = tr.write_step_trace(result, tmp_path / "all.json", ranks="all")
    _, spans, names = _tracks(path)
    truth = _truth(full)
    assert set(spans) == set(range(GPUS)) and all(len(truth[r]) > 100 for r in truth)
    assert spans == truth
    assert "rank 3 compute (mirrors rank 0)" in names.values()


def test_with_a_straggler_mirrors_match_the_full_replay_but_for_the_end(runs, tmp_path):
    """The straggler's own ranks are replayed; the others repeat their stage's
    representative. Ranks whose DP group holds the straggler itself (not only its TP
    peer, as the representative's does) end their gradient reduction 80 µs later in the
    full replay (of a 120 ms step): the step time is the same; the spans that move are
    the gradient reduction and optimizer spans at the end, by under 0.5 % of the step
    (290 µs when this was written)."""
    result, full = runs
    path = tr.write_step_trace(result, tmp_path / "all.json", ranks="all")
    _, spans, names = _tracks(path)
    truth = _truth(full)
    assert "rank 5 compute" in names.values()  # the straggler is its own rank
    assert spans[4] == truth[4] and spans[5] == truth[5] and spans[0] == truth[0]
    for rank in range(GPUS):
        ours = sorted(spans[rank], key=lambda s: (s[0], s[1], s[2]))
        theirs = sorted(truth[rank], key=lambda s: (s[0], s[1], s[2]))
        assert [s[:2] for s in ours] == [s[:2] for s in theirs]
        moved = [a for a, b in zip(ours, theirs) if a != b]
        assert len(moved) <= 0.05 * len(ours)
        assert all(a[0] in ("dp", "compute") and ("grad" in a[1] or "optimizer" in a[1])
                   for a in moved), moved
        step_us = full.timeline.makespan_ns() / 1e3
        assert all(abs(a[2] - b[2]) < 0.005 * step_us and a[3] == b[3]
                   for a, b in zip(ours, theirs))
    assert result.timeline.makespan_ns() == full.timeline.makespan_ns()


def test_a_rank_list_and_its_errors(runs, tmp_path):
    result, _ = runs
    path = tr.write_step_trace(result, tmp_path / "some.json", ranks=tr.parse_trace_ranks(
        "0-1,9"))
    assert set(_tracks(path)[1]) == {0, 1, 9}
    with pytest.raises(ValueError, match=r"trace-ranks: rank 40 is not in the job; give "
                                         r"ranks 0-15"):
        tr.write_step_trace(result, tmp_path / "x.json", ranks=(1, 40))
    for bad in ("3-1", "a", "1,,2", "-2"):
        with pytest.raises(ValueError, match="trace-ranks: .* give simulated, all, or ranks"):
            tr.parse_trace_ranks(bad)


def test_too_large_a_trace_names_a_rank_list_that_fits(runs, tmp_path, monkeypatch):
    result, _ = runs
    per_rank = len(result.timeline) // len(result.lowering.program.ops_by_rank)
    monkeypatch.setattr(tr, "MAX_TRACE_EVENTS", 10 * per_rank)
    with pytest.raises(ValueError) as info:
        tr.write_step_trace(result, tmp_path / "big.json", ranks="all")
    hint = re.search(r"--trace-ranks (\S+)$", str(info.value)).group(1)
    assert not (tmp_path / "big.json").exists()
    tr.write_step_trace(result, tmp_path / "fits.json", ranks=tr.parse_trace_ranks(hint))


def test_cli_prints_the_result_before_a_trace_error(capsys, tmp_path):
    args = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--global-batch", "8", "--seq-len", "1024", "--format", "json", "--trace",
            str(tmp_path / "t.json"))
    code, out, err = run_cli(capsys, *args, "--trace-ranks", "0-99")
    assert code == 2 and json.loads(out)["step_time_s"] > 0
    assert err == "error: trace-ranks: rank 16 is not in the job; give ranks 0-15\n"
    code, out, err = run_cli(capsys, *args, "--trace-ranks", "7-3")
    assert code == 2 and out == "" and err.startswith("error: trace-ranks: '7-3' is not valid")
    code, out, err = run_cli(capsys, *args, "--trace-ranks", "all")
    assert code == 0, err
    meta = json.loads((tmp_path / "t.json").read_text())["otherData"]
    assert meta["stands_for"] == {"rank 0": "0-7", "rank 8": "8-15"}
