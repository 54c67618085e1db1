"""The trainsim CLI: nccl-tests-shaped output and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli


ROOT = Path(__file__).resolve().parents[1]




def test_default_job_prints_an_nccl_tests_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the wide layout (below 100 columns it folds)
    code, out, err = run_cli(capsys, "collective", "all_reduce", "--cluster", "dgx-h100",
                             "--nodes", "1", "--gpus-per-node", "8")
    assert code == 0, err
    head = [line.split() for line in out.splitlines()[2:4]]  # after the two header lines
    assert head == [["size", "count", "time", "algbw", "busbw"],
                    ["(B)", "(elements)", "type", "redop", "root", "(us)", "(GB/s)", "(GB/s)",
                     "algorithm", "protocol"]]
    lines = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    sizes = [int(line[0]) for line in lines]
    assert sizes[0] == 8 and sizes[-1] == 16 << 30 and len(sizes) == 32


def test_json_has_the_documented_keys(capsys):
    code, out, _ = run_cli(capsys, "collective", "all_gather", "--nodes", "2",
                           "--min-bytes", "1M", "--max-bytes", "64M", "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert [r["size_bytes"] for r in rows] == [1 << s for s in range(20, 27)]
    for row in rows:
        assert {"size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "count", "algorithm",
                "protocol"} <= row.keys()
        # nccl-tests: all_gather size is the total, busbw = algbw * (n-1)/n
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 15 / 16)
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_us"] / 1e3)


def test_csv_and_overrides(capsys):
    base = run_cli(capsys, "collective", "all_reduce", "--nodes", "4", "--min-bytes", "1G",
                   "--max-bytes", "1G", "--format", "csv")[1]
    slow = run_cli(capsys, "collective", "all_reduce", "--nodes", "4", "--min-bytes", "1G",
                   "--max-bytes", "1G", "--format", "csv", "--set", "nic.gbit_per_s=100")[1]
    header, value = base.splitlines()
    assert header.startswith("size_bytes,count,type")
    busbw = header.split(",").index("busbw_GBps")
    assert float(slow.splitlines()[1].split(",")[busbw]) < 0.5 * float(value.split(",")[busbw])


@pytest.mark.parametrize("args,field", [
    (["collective", "all_reduce", "--cluster", "dgx-h900"], "cluster"),
    (["collective", "all_reduce", "--max-bytes", "-5"], "max-bytes"),
    (["collective", "all_reduce", "--min-bytes", "12XB"], "min-bytes"),
    (["collective", "all_reduce", "--gpus-per-node", "9"], "gpus_per_node"),
    (["collective", "all_reduce", "--algorithm", "butterfly"], "algorithm"),
    (["collective", "all_gather", "--algorithm", "tree"], "algorithm"),
    (["collective", "allreduce"], "op"),
    (["collective", "all_reduce", "--fidelity", "packet"], "fidelity"),
    (["collective", "all_reduce", "--format", "xml"], "format"),
    (["collective", "all_reduce", "--nodes", "abc"], "--nodes"),
    (["collective", "all_reduce", "--nodes", "4096"], "nodes"),
    (["collective", "all_reduce", "--set", "nic.warp_speed=9"], "nic.warp_speed"),
    (["collective", "all_reduce", "--algorithm", "nvls", "--nodes", "2"], "algorithm"),
    (["hardware", "show", "nope"], "cluster"),
])
def test_bad_input_exits_nonzero_with_one_line(capsys, args, field):
    code, out, err = run_cli(capsys, *args)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and field in lines[0]
    assert "Traceback" not in err


def test_installed_script_reports_errors_without_traceback():
    """The same through a real process (what a user's shell sees)."""
    done = subprocess.run([sys.executable, "-m", "trainsim.cli", "collective", "all_reduce",
                           "--cluster", "dgx-h900"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: cluster: 'dgx-h900' is not a preset (did you mean ")
    assert "; valid: dgx-a100, " in done.stderr
    assert "Traceback" not in done.stderr


def test_hardware_list_and_show(capsys):
    code, out, _ = run_cli(capsys, "hardware", "list", "--format", "json")
    names = {row["name"] for row in json.loads(out)}
    assert {"dgx-a100", "dgx-h100", "dgx-h100-roce", "hgx-h200", "dgx-b200",
            "gb200-nvl72"} <= names
    code, out, _ = run_cli(capsys, "hardware", "show", "dgx-h100")
    shown = json.loads(out)
    assert shown["nic"]["gbit_per_s"] == 400
    code, out, _ = run_cli(capsys, "hardware", "show", "dgx-h100", "--format", "table")
    assert code == 0 and "NVIDIA" in out  # sources are printed beside the values


def test_failures_json_has_the_documented_keys(capsys):
    code, out, err = run_cli(capsys, "failures", "--model", "llama3-8b", "--gpus", "1024",
                             "--tp", "8", "--days", "10", "--seeds", "20",
                             "--checkpoint-interval", "30min", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    for key in ("interruptions_mean", "interruptions_by_cause", "goodput",
                "checkpoint_interval_s", "inputs"):
        assert key in data
    # the interval is rounded to whole steps
    assert data["checkpoint_interval_s"] == pytest.approx(1800, rel=1e-3)
    assert 0 < data["goodput"]["mean"] < 1


def test_failures_needs_days_or_tokens(capsys):
    code, _, err = run_cli(capsys, "failures", "--model", "llama3-8b", "--gpus", "8")
    assert code == 2 and err.startswith("error: days: give exactly one of --days or --tokens")


def test_nccl_tests_format_is_read_by_nccl_tests_parsers(capsys):
    """`--format nccl-tests` is nccl-tests' own stdout (out-of-place and in-place columns,
    #wrong), which validate's nccl-tests parser (and calibrate) reads back."""
    from validate.nccl_log import parse_nccl_tests

    args = ("collective", "all_gather", "--nodes", "2", "--min-bytes", "1M", "--max-bytes",
            "64M")
    code, text, err = run_cli(capsys, *args, "--format", "nccl-tests")
    assert code == 0, err
    series = parse_nccl_tests(text, label="sim")
    rows = json.loads(run_cli(capsys, *args, "--format", "json")[1])
    assert (series.kind, series.nodes, series.gpus_per_node) == ("all_gather", 2, 8)
    assert series.sizes_bytes == [r["size_bytes"] for r in rows]
    assert series.busbw_GBps() == pytest.approx([r["busbw_GBps"] for r in rows], rel=1e-3)
    header = next(line for line in text.splitlines() if "#wrong" in line)
    assert header.split().count("#wrong") == 2  # out-of-place and in-place
    data = [line.split() for line in text.splitlines() if line[:1] == " "]
    assert all(len(parts) == 13 and parts[8] == parts[12] == "N/A" for parts in data)


@pytest.mark.parametrize("args,hint", [
    (["collective", "all_reduce", "--nodes", "4096"], "--set max_nodes=4096"),
    (["simulate", "--model", "llama3-8b", "--gpus", "32768", "--tp", "8"],
     "--set max_nodes=4096"),
    (["plan", "--model", "llama3-8b", "--gpus", "20000"], "--set max_nodes=2500"),
])
def test_a_job_larger_than_the_preset_names_the_override(capsys, args, hint):
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and hint in err, err


@pytest.mark.parametrize("args,expected", [
    (["simulate", "--model", "llama3-8x", "--gpus", "8"],
     "model: 'llama3-8x' is not a preset (did you mean 'llama3-8b'?); valid: "),
    (["hardware", "show", "dgx-h10"],
     "cluster: 'dgx-h10' is not a preset (did you mean 'dgx-h100'?); valid: "),
    (["simulate", "--model", "llama3-8b", "--gpus", "8", "--schedule", "1f1c"],
     "schedule: '1f1c' is not valid (did you mean '1f1b'?); valid: "),
    (["plan", "--model", "llama3-8b", "--gpus", "8", "--schedule", "gpipe,1f1bb"],
     "schedule: '1f1bb' is not valid (did you mean '1f1b'?); valid: "),
    (["failures", "--model", "llama3-8b", "--gpus", "8", "--days", "3", "--profile",
      "llama3-h10"], "profile: 'llama3-h10' is not a profile (did you mean 'llama3-h100'?)"),
    (["collective", "alreduce"], "op: 'alreduce' is not valid (did you mean 'all_reduce'?)"),
    (["simulate", "--model", "llama3-8b", "--gpus", "8", "--fidelity", "evnt"],
     "fidelity: 'evnt' is not valid (did you mean 'event'?); valid: analytic, event, flow"),
    # nothing close: no guess
    (["simulate", "--model", "llama3-8b", "--gpus", "8", "--schedule", "zzz"],
     "schedule: 'zzz' is not valid; valid: gpipe, 1f1b, interleaved, zb-h1"),
    # a real schedule trainsim does not model is not "gpipe" misspelled
    (["simulate", "--model", "llama3-8b", "--gpus", "8", "--schedule", "chimera"],
     "schedule: 'chimera' is not valid; valid: gpipe, 1f1b, interleaved, zb-h1"),
])
def test_a_misspelled_name_gets_a_did_you_mean(capsys, args, expected):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("error: " + expected), err


def test_a_misspelled_model_in_a_scenario_file_gets_a_did_you_mean(capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('model = "llama3-7b"\ngpus = 8\n')
    code, _, err = run_cli(capsys, "simulate", "--scenario", str(path))
    assert code == 2 and f"{path}: model: 'llama3-7b' is not a preset (did you mean " in err


@pytest.mark.parametrize("args,expected", [
    (["simulate", "--model", "llama3-8b", "--gpus", "-8"], "gpus: -8 is not valid"),
    (["failures", "--model", "llama3-8b", "--gpus", "-8", "--days", "3"],
     "gpus: -8 is not valid"),
    (["plan", "--model", "llama3-8b", "--gpus", "-8"], "gpus: -8 is not valid"),
    (["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "-2"], "tp: -2 is not valid"),
    (["plan", "--model", "llama3-8b", "--gpus", "8", "--tp", "2,-2"], "tp: -2 is not valid"),
])
def test_a_negative_size_names_the_option_given(capsys, args, expected):
    """--gpus -8 is reported as gpus (once reported as the dp it implied, dp: -1)."""
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and err.startswith("error: " + expected), err
    assert err.count("\n") == 1


def test_out_of_memory_suggests_command_line_flags(capsys):
    """A user who ran `trainsim simulate` out of memory was told "try recompute='full',
    zero=2": the Python API's spelling, not the flags the command takes."""
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-405b", "--gpus", "8",
                           "--micro-batch", "2", "--global-batch", "16", "--fidelity",
                           "analytic")
    assert code == 3, err
    line = err.strip()
    assert "\n" not in line and line.startswith("error: out of memory on rank 0"), line
    tips = line.rpartition("; try ")[2]
    assert tips == "--zero 2, --recompute full, --micro-batch 1, more tp, pp or cp", tips
    code, out, _ = run_cli(capsys, "simulate", "--model", "llama3-405b", "--gpus", "8",
                           "--micro-batch", "2", "--global-batch", "16", "--fidelity",
                           "analytic", "--format", "json")
    assert code == 3 and json.loads(out)["remedies"] == [
        {"field": "zero", "value": 2}, {"field": "recompute", "value": "full"},
        {"field": "micro_batch", "value": 1}, "more tp, pp or cp"]


def test_parameter_server_out_of_memory_spells_its_flags():
    from sim.ps_step import _check_ps_fits
    from strategies.memory import MemoryBreakdown, OutOfMemoryError
    from strategies.plan import ParallelPlan
    from trainsim.cli.errors import oom_message

    plan = ParallelPlan(dp=4, micro_batch=2, global_batch=64, seq_len=32, zero=0)
    full = MemoryBreakdown(weights_bytes=2e9, gradients_bytes=2e9, optimizer_bytes=4e9,
                           activations_bytes=1e9, comm_buffers_bytes=0, workspace_bytes=0)
    with pytest.raises(OutOfMemoryError) as info:
        _check_ps_fits(plan, 4, full, 1e9, rank=8, server=True)
    assert "try ps_servers=8, " in str(info.value)
    assert oom_message(info.value).rpartition("; try ")[2].startswith(
        "--ps-servers 8, --recompute full, --micro-batch 1"), oom_message(info.value)
