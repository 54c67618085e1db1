"""Tests for sim.timeline."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from sim.timeline import COLUMNS, Span, Timeline


def sample() -> Timeline:
    tl = Timeline(metadata={"program": "demo", "world_size": 2})
    # Deliberately added out of order.
    tl.add(Span(1, "comm", "ar0", "all_reduce", 3_000, 9_000, 1 << 20, 0.0, "comm"))
    tl.add(Span(0, "compute", "fwd", "matmul", 0, 4_000, 2048, 1e9, "compute"))
    tl.add(Span(0, "comm", "ar0", "all_reduce", 2_500, 9_000, 1 << 20, 0.0, "comm"))
    tl.add(Span(1, "compute", "fwd", "matmul", 500, 3_000, 2048.5, 1e9))
    tl.add(Span(0, "compute", "bwd", "matmul", 4_000, 10_000, 4096, 2e9, "compute"))
    return tl


def test_span_basics():
    s = Span(0, "compute", "x", "matmul", 10, 25, 1, 2.0)
    assert s.duration_ns == 15
    assert s.category == ""
    with pytest.raises(AttributeError):
        s.end_ns = 3  # frozen
    assert not hasattr(s, "__dict__")  # slots


def test_span_rejects_end_before_start():
    with pytest.raises(ValueError, match="end_ns=5 is before start_ns=10"):
        Span(0, "compute", "x", "matmul", 10, 5, 0, 0.0)


def test_span_rejects_float_times():
    with pytest.raises(ValueError, match="integers"):
        Span(0, "compute", "x", "matmul", 1.5, 5, 0, 0.0)


def test_span_normalises_numpy_ints():
    s = Span(np.int64(1), "compute", "x", "matmul", np.int64(3), np.int32(7))
    assert type(s.start_ns) is int and type(s.rank) is int and s.duration_ns == 4


def test_len_and_sorted_spans():
    tl = sample()
    assert len(tl) == 5
    keys = [(s.start_ns, s.rank, s.stream, s.op) for s in tl.spans()]
    assert keys == sorted(keys)
    assert keys[0] == (0, 0, "compute", "fwd")
    tl.add(Span(0, "compute", "early", "other", -100, 0))
    assert next(iter(tl.spans())).op == "early"


def test_sort_ties_by_rank_stream_op():
    tl = Timeline()
    tl.add(Span(1, "a", "z", "k", 0, 1))
    tl.add(Span(0, "b", "z", "k", 0, 1))
    tl.add(Span(0, "a", "y", "k", 0, 1))
    tl.add(Span(0, "a", "x", "k", 0, 1))
    assert [(s.rank, s.stream, s.op) for s in tl.spans()] == [
        (0, "a", "x"), (0, "a", "y"), (0, "b", "z"), (1, "a", "z")
    ]


def test_dataframe_columns_and_values():
    df = sample().to_dataframe()
    assert list(df.columns) == list(COLUMNS) == [
        "rank", "stream", "op", "kind", "category", "start_ns", "end_ns", "duration_ns", "bytes", "flops",
        "op_id", "axis"
    ]
    assert len(df) == 5
    assert df["start_ns"].tolist() == [0, 500, 2_500, 3_000, 4_000]
    assert df["duration_ns"].tolist() == (df["end_ns"] - df["start_ns"]).tolist()
    assert df["duration_ns"].tolist() == [4_000, 2_500, 6_500, 6_000, 6_000]
    assert df["rank"].dtype == np.int64 and df["start_ns"].dtype == np.int64
    assert df["bytes"].dtype == np.float64 and df["flops"].dtype == np.float64
    row = df.iloc[1]
    assert (row["rank"], row["stream"], row["op"], row["kind"], row["category"]) == (1, "compute", "fwd", "matmul", "")
    assert row["bytes"] == 2048.5
    assert df.attrs["metadata"]["program"] == "demo"


def test_empty_timeline():
    tl = Timeline()
    assert len(tl) == 0
    assert tl.makespan_ns() == 0
    assert tl.end_ns_by_rank() == {}
    assert tl.busy_ns(0, "compute") == 0
    df = tl.to_dataframe()
    assert list(df.columns) == list(COLUMNS) and len(df) == 0
    trace = tl.to_chrome_trace()
    assert trace["traceEvents"] == []
    json.dumps(trace)


def test_makespan_and_end_by_rank():
    tl = sample()
    assert tl.makespan_ns() == 10_000
    assert tl.end_ns_by_rank() == {0: 10_000, 1: 9_000}
    shifted = Timeline([Span(0, "c", "a", "k", 1_000, 2_000), Span(1, "c", "b", "k", 1_500, 4_000)])
    assert shifted.makespan_ns() == 3_000


def test_busy_ns_union_not_sum():
    tl = Timeline()
    tl.add(Span(0, "compute", "a", "matmul", 0, 100))
    tl.add(Span(0, "compute", "b", "matmul", 50, 150))  # overlaps a
    tl.add(Span(0, "compute", "c", "matmul", 60, 70))  # inside b
    tl.add(Span(0, "compute", "d", "matmul", 150, 160))  # touches b
    tl.add(Span(0, "compute", "e", "matmul", 200, 250))  # gap before
    tl.add(Span(0, "comm", "x", "all_reduce", 140, 400))  # other stream
    tl.add(Span(1, "compute", "y", "matmul", 0, 1_000))  # other rank
    assert tl.busy_ns(0, "compute") == 160 + 50
    assert tl.busy_ns(0, "comm") == 260
    assert tl.busy_ns(0) == 400  # union over all streams of rank 0
    assert tl.busy_ns(1, "compute") == 1_000
    assert tl.busy_ns(2, "compute") == 0


def test_chrome_trace_structure():
    tl = sample()
    trace = tl.to_chrome_trace()
    text = json.dumps(trace)
    assert json.loads(text) == trace
    events = trace["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 5
    process_names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert process_names == {0: "rank 0", 1: "rank 1"}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert set(thread_names.values()) == {"compute", "comm"}
    assert all(isinstance(tid, int) for _, tid in thread_names)
    assert len(thread_names) == 4
    # Same stream -> same tid on every rank.
    tid_of = {}
    for (pid, tid), name in thread_names.items():
        assert tid_of.setdefault(name, tid) == tid
    for e in complete:
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        assert isinstance(e["tid"], int)
        assert (e["pid"], e["tid"]) in thread_names
        assert set(e["args"]) == {"bytes", "flops"}
    first = complete[0]
    assert first["name"] == "fwd" and first["pid"] == 0
    assert first["ts"] == 0.0 and first["dur"] == 4.0  # microseconds
    assert thread_names[(0, first["tid"])] == "compute"
    ar = [e for e in complete if e["pid"] == 0 and e["name"] == "ar0"][0]
    assert ar["ts"] == 2.5 and ar["dur"] == 6.5 and ar["cat"] == "comm"
    assert ar["args"] == {"bytes": 1 << 20, "flops": 0.0}
    uncategorised = [e for e in complete if e["pid"] == 1 and e["name"] == "fwd"][0]
    assert uncategorised["cat"] == "matmul"  # falls back to kind
    assert [e["ts"] for e in complete] == sorted(e["ts"] for e in complete)
    # Metadata events come before complete events.
    assert events.index(complete[0]) > max(events.index(m) for m in meta)
    assert trace["otherData"] == {"program": "demo", "world_size": 2}


def test_chrome_trace_sub_microsecond_precision():
    tl = Timeline([Span(3, "comm", "tiny", "send", 1_234_567, 1_235_000)])
    (event,) = [e for e in tl.to_chrome_trace()["traceEvents"] if e["ph"] == "X"]
    assert event["ts"] == pytest.approx(1234.567)
    assert event["dur"] == pytest.approx(0.433)
    assert event["pid"] == 3


def test_chrome_trace_non_json_metadata_is_stringified():
    tl = Timeline([Span(0, "c", "a", "k", 0, 1)], metadata={"obj": object(), "n": np.int64(3), "t": (1, 2)})
    trace = tl.to_chrome_trace()
    json.dumps(trace)
    assert trace["otherData"]["n"] == 3 and trace["otherData"]["t"] == [1, 2]


def test_write_chrome_trace_atomic(tmp_path):
    tl = sample()
    target = tmp_path / "trace.json"
    target.write_text("old contents")
    returned = tl.write_chrome_trace(target)
    assert returned == target
    assert sorted(os.listdir(tmp_path)) == ["trace.json"]  # no temp files left
    loaded = json.loads(target.read_text())
    assert loaded == tl.to_chrome_trace()


def test_write_chrome_trace_failure_leaves_no_temp(tmp_path, monkeypatch):
    tl = sample()
    target = tmp_path / "trace.json"
    target.write_text("old contents")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        tl.write_chrome_trace(target)
    assert sorted(os.listdir(tmp_path)) == ["trace.json"]
    assert target.read_text() == "old contents"


def test_dataframe_round_trip():
    tl = sample()
    back = Timeline.from_dataframe(tl.to_dataframe())
    assert list(back.spans()) == list(tl.spans())
    assert back.metadata == tl.metadata
    # bytes come back as ints when integral
    assert all(type(s.bytes) is int for s in back.spans() if s.op != "fwd" or s.rank != 1)
    pd.testing.assert_frame_equal(back.to_dataframe(), tl.to_dataframe())


def test_from_dataframe_minimal_columns():
    df = pd.DataFrame({"rank": [0], "stream": ["compute"], "op": ["a"], "kind": ["matmul"],
                       "start_ns": [5], "end_ns": [9]})
    (span,) = Timeline.from_dataframe(df).spans()
    assert span == Span(0, "compute", "a", "matmul", 5, 9, 0, 0.0, "")


def test_from_dataframe_rejects_missing_columns_and_bad_duration():
    with pytest.raises(ValueError, match="end_ns"):
        Timeline.from_dataframe(pd.DataFrame({"rank": [0], "stream": ["c"], "op": ["a"], "kind": ["k"],
                                              "start_ns": [0]}))
    df = sample().to_dataframe()
    df.loc[0, "duration_ns"] = 1
    with pytest.raises(ValueError, match="duration_ns"):
        Timeline.from_dataframe(df)


def test_records_round_trip_through_json():
    tl = sample()
    records = tl.to_records()
    assert [list(r) for r in records] == [list(COLUMNS)] * len(records)
    assert records[0]["op"] == "fwd" and records[0]["duration_ns"] == 4_000
    back = Timeline.from_records(json.loads(json.dumps(records)), metadata=tl.metadata)
    assert list(back.spans()) == list(tl.spans())
    assert back.to_records() == records
    assert back.metadata == {"program": "demo", "world_size": 2}


def test_from_records_errors():
    with pytest.raises(ValueError, match="lacks field 'kind'"):
        Timeline.from_records([{"rank": 0, "stream": "c", "op": "a", "start_ns": 0, "end_ns": 1}])
    with pytest.raises(ValueError, match="duration_ns"):
        Timeline.from_records([{"rank": 0, "stream": "c", "op": "a", "kind": "k", "start_ns": 0, "end_ns": 1,
                                "duration_ns": 2}])


def test_record_fast_path_and_many_spans():
    tl = Timeline()
    n = 20_000
    for i in range(n):
        tl.record(i % 4, "compute" if i % 2 else "comm", f"op{i}", "matmul", i * 10, i * 10 + 15, 8, 1.0)
    assert len(tl) == n
    assert tl.makespan_ns() == (n - 1) * 10 + 15
    # Per rank the spans are 40 ns apart, per (rank, stream) too -> no overlap, 15 ns each.
    assert tl.busy_ns(0, "comm") == (n // 4) * 15
    assert tl.to_dataframe()["start_ns"].is_monotonic_increasing


def test_add_rejects_non_span():
    with pytest.raises(TypeError):
        Timeline().add((0, "c", "a", "k", 0, 1))


def test_atomic_writes_get_the_mode_of_a_plain_open(tmp_path):
    """Temporary files start private (0600); results must not stay that way."""
    from sim.atomic_io import write_text_atomic

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    written = write_text_atomic(tmp_path / "atomic.txt", "x")
    assert (written.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)
