"""A sweep says when an axis it varies changed no output, and a missing Ray cluster is one
line, not a traceback."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from conftest import run_cli
from trainsim import sweeps
from trainsim.sweep_checks import unchanged_axes


def _table(scenarios, outputs):
    rows = [{"scenario": i, "scenario_id": str(i), **s, **o, "status": "ok", "error": None}
            for i, (s, o) in enumerate(zip(scenarios, outputs))]
    return pd.DataFrame(rows)


def test_an_axis_is_inert_only_when_it_alone_changes_nothing():
    grid = [{"kind": "step", "a": a, "b": b} for a in (1, 2) for b in (1, 2, 3)]
    outputs = [{"t": 10.0 * s["b"], "m": 1.0} for s in grid]  # b matters, a does not
    assert unchanged_axes(grid, _table(grid, outputs)) == ["a"]
    outputs[0]["m"] = 2.0  # now a changes one output somewhere
    assert unchanged_axes(grid, _table(grid, outputs)) == []
    # scenarios that never differ in one input alone are not compared
    listed = [{"kind": "step", "a": 1, "b": 1}, {"kind": "step", "a": 2, "b": 2}]
    assert unchanged_axes(listed, _table(listed, [{"t": 1.0}, {"t": 1.0}])) == []


def test_failed_rows_are_not_evidence():
    grid = [{"kind": "step", "a": a} for a in (1, 2)]
    frame = _table(grid, [{"t": 1.0}, {"t": float("nan")}])
    frame.loc[1, "status"] = "error"
    assert unchanged_axes(grid, frame) == []


def test_cli_warns_about_an_oversubscription_no_traffic_crosses(capsys, tmp_path):
    """256 H100s are 32 nodes, one leaf switch of dgx-h100: oversubscribing its uplinks
    changes nothing (the example the README used to give)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: step\nbase: {model: llama3-8b, gpus: 256, tp: 8}\n"
                    "grid:\n  nic.gbit_per_s: [200, 400]\n  fabric.oversubscription: [1, 2]\n")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "r.csv"),
                           "--workers", "1")
    assert code == 0, err
    warnings = [line for line in " ".join(err.split()).split("warning: ")[1:]]
    assert len(warnings) == 1 and warnings[0].startswith("fabric.oversubscription: its "
                                                        "values left every output unchanged")
    with pytest.warns(UserWarning, match="fabric.oversubscription"):
        frame = sweeps.sweep(str(spec))
    assert frame["step_time_s"].nunique() == 2  # nic.gbit_per_s did change it


@pytest.mark.skipif(bool(os.environ.get("RAY_ADDRESS")), reason="a Ray cluster is set")
def test_ray_without_a_cluster_is_one_line(capsys, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from ray._private.services import find_gcs_addresses

    # "auto" joins any Ray instance on this machine (RAY_ADDRESS, the address file, or a
    # running GCS process): without one the command must say so in one line. Another
    # test (on another pytest-xdist worker) may have one up right now.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if find_gcs_addresses():
        pytest.skip("a Ray instance runs on this machine (another test's): 'auto' joins it")
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: llama3-8b, gpus: 8, global_batch: 8}\n")
    code, out, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "r.csv"),
                             "--backend", "ray", "--address", "auto")
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("error: address: 'auto': no Ray instance answers")
