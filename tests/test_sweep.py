"""Sweeps: spec expansion, tidy table, cache/resume, errors as rows, ray == local."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import expect_one_line_error, run_cli
from trainsim import sweeps

SPEC_200 = {
    "kind": "collective",
    "base": {"op": "all_reduce", "cluster": "dgx-h100", "gpus_per_node": 8},
    "grid": {"nodes": [1, 2, 4, 8, 16], "size_bytes": [2**k for k in range(10, 30)],
             "nic.gbit_per_s": [200, 400]},
}


def test_spec_expands_grid_and_list_in_order():
    scenarios = sweeps.expand_spec({"base": {"model": "llama3-8b", "gpus": 8},
                                   "scenarios": [{"tp": 1}, {"tp": 2}],
                                   "grid": {"nic.gbit_per_s": [100, 400]}})
    assert [(s["tp"], s["nic.gbit_per_s"]) for s in scenarios] == \
        [(1, 100), (1, 400), (2, 100), (2, 400)]
    assert len(sweeps.expand_spec(SPEC_200)) == 200


def test_bad_spec_is_one_line():
    expect_one_line_error(lambda: sweeps.expand_spec({"grid": {"tpp": [1]}}), "tpp", "valid")
    expect_one_line_error(lambda: sweeps.expand_spec({"kind": "train"}), "kind", "train")
    expect_one_line_error(lambda: sweeps.expand_spec({"grid": {"tp": 2}}), "grid", "list")


def test_step_sweep_varies_a_preset_field_and_records_failures(tmp_path):
    spec = {"base": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16, "tp": 8,
                     "seq_len": 2048, "global_batch": 32},
            "grid": {"nic.gbit_per_s": [50, 400]},
            "scenarios": [{}, {"tp": 3}]}
    frame = sweeps.sweep(spec, out=tmp_path / "r.csv")
    assert list(frame["status"]) == ["ok", "ok", "error", "error"]
    assert "tp" in frame.loc[2, "error"]
    slow, fast = frame.loc[0, "step_time_s"], frame.loc[1, "step_time_s"]
    assert slow > fast  # a 50 Gb/s NIC slows the data-parallel reduction
    on_disk = sweeps.read_table(tmp_path / "r.csv")
    assert len(on_disk) == 4 and list(on_disk["scenario"]) == [0, 1, 2, 3]


def test_interrupted_sweep_resumes_from_cache(tmp_path):
    scenarios = sweeps.expand_spec(SPEC_200)[:12]
    out = tmp_path / "r.parquet"
    first = sweeps.run_sweep(scenarios[:5], out, workers=1)
    assert first["computed"] == 5
    again = sweeps.run_sweep(scenarios, out, workers=1)
    assert again["cached"] == 5 and again["computed"] == 7
    whole = sweeps.run_sweep(scenarios, tmp_path / "fresh.parquet", workers=1)["frame"]
    pd.testing.assert_frame_equal(again["frame"], whole)


def test_sweep_cli_writes_parquet(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: collective\nbase: {op: all_gather, cluster: dgx-h100, nodes: 2}\n"
                    "grid:\n  size_bytes: [1048576, 1073741824]\n")
    code, out, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "r.parquet"),
                             "--workers", "1")
    assert code == 0, err
    frame = pd.read_parquet(tmp_path / "r.parquet")
    assert list(frame["size_bytes"]) == [1048576, 1073741824]
    assert frame["busbw_GBps"].iloc[1] > frame["busbw_GBps"].iloc[0]
    code, out, err = run_cli(capsys, "sweep", str(spec), "--out", "x.csv", "--backend", "mpi")
    assert code == 2 and err.startswith("error: backend") and err.count("\n") == 1


@pytest.mark.slow
def test_ray_and_local_give_identical_tables(tmp_path):
    ray = pytest.importorskip("ray")
    scenarios = sweeps.expand_spec(SPEC_200)
    local = sweeps.run_sweep(scenarios, tmp_path / "local.parquet", workers=2)["frame"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweeps.run_sweep(scenarios, tmp_path / "ray.parquet", backend="ray",
                                 workers=2)["frame"]
    finally:
        ray.shutdown()
    assert len(local) == 200 and (local["status"] == "ok").all()
    pd.testing.assert_frame_equal(local, remote)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "local.parquet"),
                                  pd.read_parquet(tmp_path / "ray.parquet"))
