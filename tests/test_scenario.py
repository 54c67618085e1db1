"""Scenario files: one set of inputs for the API and every command; every result embeds the
scenario it came from and re-runs from it bit for bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import trainsim
from conftest import run_cli
from trainsim.scenario import Scenario, load_scenario, scenario_from_dict
from trainsim.version import VERSION

#: A small step: analytic, so the tests take milliseconds.
STEP = dict(model="llama3-8b", gpus=16, tp=2, pp=2, fidelity="analytic")
STEP_ARGS = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
             "--fidelity", "analytic", "--format", "json")


def _dumps(result) -> str:
    return json.dumps(result.to_dict(), indent=1)


def test_api_and_cli_give_bit_identical_json(capsys):
    code, out, err = run_cli(capsys, *STEP_ARGS)
    assert code == 0, err
    assert out == _dumps(trainsim.simulate(**STEP)) + "\n"


def test_api_and_cli_agree_at_event_fidelity_with_defaults(capsys):
    """No plan field given at all: the same defaults (seq_len, global batch) both ways."""
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "64",
                             "--tp", "8", "--pp", "2", "--global-batch", "32", "--format",
                             "json")
    assert code == 0, err
    assert out == _dumps(trainsim.simulate("llama3-8b", gpus=64, tp=8, pp=2,
                                           global_batch=32)) + "\n"
    inputs = json.loads(out)["inputs"]
    assert inputs["fidelity"] == "event" and inputs["plan"]["seq_len"] == 4096


def test_result_embeds_its_resolved_scenario_and_the_version():
    data = trainsim.simulate(**STEP).to_dict()
    scenario = data["scenario"]
    assert data["trainsim_version"] == VERSION
    assert (scenario["model"], scenario["cluster"], scenario["gpus"], scenario["fidelity"]) \
        == ("llama3-8b", "dgx-h100", 16, "analytic")
    # every plan field, defaults included, so a change of defaults cannot change a re-run
    assert scenario["plan"]["seq_len"] == 4096 and scenario["plan"]["global_batch"] == 1024
    assert scenario["plan"]["dp"] == 4 and len(scenario["plan"]) >= 20
    # the old keys stay (backward compatible)
    assert {"step_time_s", "tokens_per_s", "mfu", "memory", "breakdown", "inputs"} <= set(data)


def _rerun(capsys, command: str, out: str, path: Path) -> str:
    """Save a result JSON, run ``trainsim <command> --scenario`` on it; its stdout."""
    path.write_text(out)
    code, again, err = run_cli(capsys, command, "--scenario", str(path), "--format", "json")
    assert code == 0, err
    return again


def test_a_result_json_reruns_bit_identically(capsys, tmp_path):
    code, out, err = run_cli(capsys, *STEP_ARGS[:-2], "--straggler", "3:0.5", "--set",
                             "nic.gbit_per_s=200", "--format", "json")
    assert code == 0, err
    assert _rerun(capsys, "simulate", out, tmp_path / "result.json") == out
    assert trainsim.simulate(scenario=str(tmp_path / "result.json")).to_dict() == \
        json.loads(out)


def test_a_failures_result_reruns_bit_identically(capsys, tmp_path):
    args = ("failures", "--model", "llama3-8b", "--gpus", "64", "--tp", "8", "--days", "5",
            "--seeds", "8", "--checkpoint-interval", "30min", "--format", "json")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    data = json.loads(out)
    assert data["scenario"]["failures"] == {"profile": "llama3-h100",
                                            "checkpoint_interval": "30min",
                                            "checkpoint_mode": "sync", "seeds": 8, "seed": 0,
                                            "days": 5.0}
    assert _rerun(capsys, "failures", out, tmp_path / "failures.json") == out


def test_flags_given_explicitly_win_over_the_scenario(capsys, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('model = "llama3-8b"\ngpus = 16\nfidelity = "analytic"\n'
                    '[plan]\ntp = 2\npp = 2\nseq_len = 2048\n[set]\n"nic.gbit_per_s" = 100\n')
    code, out, err = run_cli(capsys, "simulate", "--scenario", str(path), "--tp", "4",
                             "--set", "fabric.oversubscription=2", "--format", "json")
    assert code == 0, err
    scenario = json.loads(out)["scenario"]
    assert (scenario["plan"]["tp"], scenario["plan"]["pp"], scenario["plan"]["seq_len"]) == \
        (4, 2, 2048)
    assert scenario["set"] == {"nic.gbit_per_s": 100, "fabric.oversubscription": 2}


def test_paths_in_a_scenario_are_relative_to_it(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    model = tmp_path / "models" / "small.toml"
    model.write_text('num_layers = 4\nhidden_size = 512\nnum_heads = 8\nffn_hidden_size = 2048\n'
                     'vocab_size = 1024\n')
    path = tmp_path / "s.toml"
    path.write_text('model = "models/small.toml"\ngpus = 8\nfidelity = "analytic"\n'
                    '[plan]\nglobal_batch = 8\n')
    scenario = load_scenario(path)
    assert scenario.model == str(model.resolve())
    result = trainsim.simulate(scenario=scenario)
    assert result.to_dict()["scenario"]["model"] == str(model.resolve())


def test_the_calibration_file_is_pinned_by_its_hash(tmp_path, capsys):
    cal = tmp_path / "cal.toml"
    cal.write_text('[fields]\n"gpu.sustained_fraction" = 0.5\n')
    result = trainsim.simulate(**STEP, calibration=str(cal)).to_dict()
    scenario = result["scenario"]
    assert scenario["calibration"] == str(cal.resolve())
    assert scenario["calibration_sha256"] == hashlib.sha256(cal.read_bytes()).hexdigest()
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(result))
    cal.write_text('[fields]\n"gpu.sustained_fraction" = 0.6\n')  # the file changed
    code, _, err = run_cli(capsys, "simulate", "--scenario", str(saved))
    assert code == 2 and err.count("\n") == 1
    assert "calibration_sha256" in err and str(saved) in err


@pytest.mark.parametrize("text,words", [
    ('model = "llama3-8b"\n[plan]\ntpp = 2\n', ["plan.tpp", "not a plan field", "valid:"]),
    ('model = "llama3-8b"\n[plan]\ntp = "two"\n', ["plan.tp", "'two'", "whole number"]),
    ('model = "llama3-8b"\n[plan]\npp = 0\n', ["plan.pp", "0", ">= 1"]),
    ('model = "llama9"\n', ["model", "'llama9'", "valid"]),
    ('model = "llama3-8b"\ngpus = -4\n', ["gpus", "-4", ">= 1"]),
    ('model = "llama3-8b"\nfidelity = "exact"\n', ["fidelity", "'exact'", "analytic"]),
    ('model = "llama3-8b"\nfidelty = "event"\n', ["fidelty", "not a scenario key"]),
    ('model = "llama3-8b"\n[set]\n"nic.warp" = 1\n', ["nic.warp"]),
    ('model = "llama3-8b"\n[perturbations]\nstraggler = ["5"]\n', ["straggler", "'5'"]),
    ('model = "llama3-8b"\n[failures]\nseeds = "many"\n', ["failures.seeds", "'many'"]),
    ('model = "llama3-8b"\ncalibration = "missing.toml"\n', ["calibration", "missing.toml"]),
    ('model = [1]\n', ["model", "[1]", "string"]),
    ('model = "llama3-8b\n', ["not valid TOML"]),
])
def test_a_bad_scenario_is_one_line_naming_the_file_and_field(tmp_path, capsys, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = run_cli(capsys, "simulate", "--scenario", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("error: ") and "bad.toml" in err
    for word in words:
        assert word in err, err


def test_a_json_without_a_scenario_is_refused(tmp_path, capsys):
    path = tmp_path / "plans.json"
    path.write_text("[]")
    code, _, err = run_cli(capsys, "simulate", "--scenario", str(path))
    assert code == 2 and "has no 'scenario' object" in err


def test_a_scenario_round_trips_through_toml(tmp_path):
    data = trainsim.simulate(**STEP, overrides={"nic.gbit_per_s": 200},
                             stragglers={3: 0.5}).to_dict()["scenario"]
    scenario = scenario_from_dict(data)
    path = tmp_path / "again.toml"
    path.write_text(scenario.to_toml())
    assert load_scenario(path) == scenario
    assert Scenario(model="m").merged(Scenario(gpus=8)) == Scenario(model="m", gpus=8)


def test_plan_emits_the_scenario_of_each_plan(capsys, tmp_path):
    out_dir = tmp_path / "plans"
    code, out, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "16", "--top",
                             "2", "--tp", "2,4", "--pp", "1", "--zero", "1", "--recompute",
                             "none", "--micro-batch", "1", "--seq-len", "2048",
                             "--global-batch", "32",
                             "--no-overlap-grad-reduce", "--emit-scenarios", str(out_dir),
                             "--format", "json", "--workers", "1")
    assert code == 0, err
    plans = json.loads(out)
    assert [p["scenario"]["plan"]["overlap_grad_reduce"] for p in plans] == [False, False]
    for row in plans:
        file = out_dir / f"plan-{row['rank']:02d}.toml"
        code, again, err = run_cli(capsys, "simulate", "--scenario", str(file), "--format",
                                   "json")
        assert code == 0, err
        assert json.loads(again)["step_time_s"] == row["step_time_s"]
        assert "--no-overlap-grad-reduce" in row["command"]


def test_validate_replay_builds_its_program_from_a_scenario(tmp_path):
    from trainsim.cli import options
    from trainsim.cli.validate import _program

    path = tmp_path / "s.toml"
    path.write_text('model = "llama3-8b"\ngpus = 4\n[plan]\npp = 2\nglobal_batch = 4\n'
                    'seq_len = 256\n')
    source = options.scenario_from_options(scenario=str(path))
    assert _program(None, None, source).world_size == 4  # dp 2 x pp 2
    source = options.scenario_from_options(scenario=str(path), plan={"tp": 2})
    program = _program(None, None, source)
    assert program.world_size == 4 and len(program.ops_by_rank) == 4  # tp 2 x pp 2


def test_a_sweep_row_is_the_api_result_with_the_same_defaults(capsys, tmp_path):
    """A sweep's step uses the API's defaults (seq_len, global batch) at its fidelity: the
    same step time to the last digit, and the effective values recorded in the row."""
    import pandas

    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: llama3-8b, gpus: 16, tp: 2, pp: 2}\n")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "r.csv"),
                           "--workers", "1")
    assert code == 0, err
    row = pandas.read_csv(tmp_path / "r.csv").iloc[0]
    api = trainsim.simulate("llama3-8b", gpus=16, tp=2, pp=2, fidelity="analytic")
    assert row["step_time_s"] == api.step_time_s
    assert (row["seq_len_used"], row["global_batch_used"], row["fidelity_used"]) == \
        (api.inputs["plan"]["seq_len"], api.inputs["plan"]["global_batch"], "analytic")
