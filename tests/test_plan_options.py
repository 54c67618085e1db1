"""The plan is declared once: ParallelPlan's field metadata makes every command's plan
options, Megatron-LM's spellings are aliases, and a plan checks itself when it is built."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import typer

from conftest import run_cli
from strategies.plan import ParallelPlan
from trainsim import defaults
from trainsim.cli import app
from trainsim.plan_fields import PLAN_FIELDS
from trainsim.planner import SearchSpace

MEGATRON = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
            "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
            "vpp": "--virtual-pipeline-model-parallel-size", "micro_batch": "--micro-batch-size",
            "global_batch": "--global-batch-size", "seq_len": "--seq-length"}


def _command(*path: str):
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def _options(*path: str) -> dict:
    """The command's options by parameter name (typer's click parameters)."""
    return {p.name: p for p in _command(*path).params if p.param_type_name == "option"}


@pytest.mark.parametrize("path", [("simulate",), ("failures",), ("validate", "replay")])
def test_every_plan_field_is_an_option_of_the_step_commands(path):
    options = _options(*path)
    for spec in fields(ParallelPlan):
        assert spec.name in options, f"{' '.join(path)} has no option for {spec.name}"
        option = options[spec.name]
        assert option.opts[0] == "--" + spec.name.replace("_", "-")
        assert option.help.startswith(spec.metadata["help"])
        if spec.name in MEGATRON:
            assert MEGATRON[spec.name] in option.opts


def test_plan_searches_the_list_fields_and_fixes_the_others():
    options = _options("plan")
    for spec in fields(ParallelPlan):
        role = spec.metadata["search"]
        if role == "derived":
            assert spec.name not in options
            continue
        assert spec.name in options, f"plan has no option for {spec.name}"
        listed = "comma-separated" in options[spec.name].help  # values to try: "1,2,4"
        assert listed == (role == "list"), spec.name
    # The planner's search space has exactly the list fields.
    assert {f.name for f in fields(SearchSpace)} == \
        {f.name for f in PLAN_FIELDS if f.search == "list"}


def test_a_new_field_with_metadata_needs_no_other_edit(monkeypatch):
    """Adding a field to ParallelPlan (here: a stand-in list of fields) adds the option."""
    from strategies.plan import _field
    from trainsim.cli import options as cli_options
    from trainsim.plan_fields import PlanField

    extra = PlanField(name="overlap_param_gather", kind="bool", optional=False,
                      help=_field(False, "Overlap the ZeRO parameter all-gather.").metadata[
                          "help"], options=("--overlap-param-gather",), search="fixed",
                      choices=None, default=False)
    monkeypatch.setattr(cli_options, "PLAN_FIELDS", (*PLAN_FIELDS, extra))
    names = [p.name for p in cli_options.plan_parameters()]
    assert names[-1] == "overlap_param_gather"
    option = cli_options.plan_parameters()[-1].default
    assert option.param_decls == ("--overlap-param-gather/--no-overlap-param-gather",)


def test_megatron_spellings_give_the_same_step(capsys):
    short = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--fidelity", "analytic",
             "--tp", "2", "--pp", "2", "--micro-batch", "2", "--global-batch", "64",
             "--seq-len", "2048", "--format", "json")
    megatron = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--fidelity", "analytic",
                "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                "--micro-batch-size", "2", "--global-batch-size", "64", "--seq-length", "2048",
                "--format", "json")
    code, out, err = run_cli(capsys, *short)
    assert code == 0, err
    again = run_cli(capsys, *megatron)
    assert again[0] == 0, again[2]
    assert again[1] == out


def test_vpp_above_one_implies_the_interleaved_schedule(capsys):
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16",
                             "--pp", "4", "--virtual-pipeline-model-parallel-size", "2",
                             "--global-batch", "32", "--fidelity", "analytic", "--format",
                             "json")
    assert code == 0, err
    plan = json.loads(out)["inputs"]["plan"]
    assert (plan["vpp"], plan["schedule"]) == (2, "interleaved")
    # a schedule given explicitly is kept (and this one cannot take virtual stages)
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16", "--pp",
                           "4", "--vpp", "2", "--schedule", "1f1b", "--fidelity", "analytic")
    assert code == 2 and err.startswith("error: vpp: vpp=2 is invalid for schedule='1f1b'")


@pytest.mark.parametrize("args,line", [
    (["--dp", "0"], "error: dp: 0 is not valid; give a whole number >= 1"),
    (["--cp", "0"], "error: cp: 0 is not valid; give a whole number >= 1"),
    (["--pp", "0"], "error: pp: 0 is not valid; give a whole number >= 1"),
    (["--vpp", "-0"], "error: vpp: 0 is not valid; give a whole number >= 1"),
    (["--gpus", "-8"], "error: gpus: -8 is not valid; give a whole number >= 1"),
    (["--schedule", "pipedream"], "error: schedule: 'pipedream' is not valid; valid: "),
    (["--order", "tp,dp"], "error: order: ('tp', 'dp') is not valid; give a permutation"),
    (["--layers-per-stage", "7,x"], "error: layers_per_stage: '7,x' is not valid; give whole"),
])
def test_bad_plan_options_are_one_line_errors(capsys, args, line):
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "8", *args)
    assert code == 2
    assert err.startswith(line) and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("fields_,field", [
    (dict(dp=0), "dp"), (dict(cp=0), "cp"), (dict(pp=0), "pp"), (dict(vpp=-0), "vpp"),
    (dict(tp=True), "tp"), (dict(zero=4), "zero"), (dict(recompute="most"), "recompute"),
    (dict(schedule="looped"), "schedule"), (dict(dtype="fp4"), "dtype"),
    (dict(sequence_parallel=1), "sequence_parallel"), (dict(ps_servers=2), "ps_servers"),
    (dict(tp=3, seq_len=4096), "tp"), (dict(cp=3, seq_len=4096), "seq_len"),
    (dict(pp=2, layers_per_stage=(4,)), "layers_per_stage"), (dict(order=("tp",)), "order"),
])
def test_a_plan_checks_itself_when_built(fields_, field):
    with pytest.raises(ValueError) as info:
        ParallelPlan(**fields_)
    message = str(info.value)
    assert message.startswith(f"{field}: ") and "\n" not in message


def test_the_defaults_are_one_policy():
    """API, CLI, sweeps and plan share them: 4 Mi tokens in a power of two of sequences,
    rounded to whole micro-batches per replica."""
    assert defaults.global_batch(4096, 1024) == 1024
    assert defaults.global_batch(2048, 64) == 2048
    assert defaults.global_batch(4096, 131072) == 16384  # one sequence per 8 GPUs
    assert defaults.global_batch(4096, 24, unit=3) == 1023  # dp 3: nearest multiple
    from trainsim.api import make_plan

    plan = make_plan(gpus=1024, tp=8, pp=4, vpp=2)
    assert (plan.dp, plan.seq_len, plan.global_batch, plan.schedule, plan.zero) == \
        (32, 4096, 1024, "interleaved", 1)
    assert make_plan(gpus=8, dp_mode="ps-sync").zero == 0
