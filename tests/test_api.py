"""Python API: DataFrames with provenance, programs replayed with real compute costs."""

from __future__ import annotations

import json

import pytest

from trainsim import api
from strategies.ir import CollectiveOp, Program, matmul_op


def test_collective_returns_a_dataframe_with_its_inputs():
    df = api.collective("reduce_scatter", cluster="dgx-a100", nodes=2, min_bytes="1MiB",
                        max_bytes="4MiB")
    assert list(df.size_bytes) == [1 << 20, 2 << 20, 4 << 20]
    assert (df.busbw_GBps > 0).all()
    inputs = df.attrs["inputs"]
    assert inputs["cluster"] == "dgx-a100" and inputs["ranks"] == 16
    assert inputs["cluster_spec"]["nic"]["gbit_per_s"] == 200


def test_overrides_change_the_answer():
    fast = api.collective("all_reduce", nodes=4, min_bytes="1G", max_bytes="1G")
    slow = api.collective("all_reduce", nodes=4, min_bytes="1G", max_bytes="1G",
                          overrides={"nic.gbit_per_s": 100})
    assert slow.time_us.iloc[0] > 2 * fast.time_us.iloc[0]


def test_simulate_program_prices_compute_and_writes_a_trace(tmp_path):
    group = tuple(range(8))
    ops = {r: [matmul_op("gemm", 1, 8192, 8192, 8192, "bf16"),
               CollectiveOp(name="ar", key="ar", kind="all_reduce", group=group,
                            size_bytes=256 << 20, deps=(0,))] for r in group}
    trace = tmp_path / "step.json"
    result = api.simulate_program(Program(ops_by_rank=ops, world_size=8), cluster="dgx-h100",
                                  trace_path=str(trace))
    gemm = next(s for s in result.timeline.spans() if s.op == "gemm")
    achieved = gemm.flops / (gemm.duration_ns / 1e9)
    assert 0.6 * 989e12 < achieved <= 0.803 * 989e12  # a big GEMM near the mamf maximum
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} == {"gemm", "ar"}


def test_bad_cluster_in_the_api_raises_a_clear_error():
    with pytest.raises(ValueError, match="cluster: 'nope' is not a preset"):
        api.collective("all_reduce", cluster="nope")
