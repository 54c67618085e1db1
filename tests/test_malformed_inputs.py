"""Issue 17, one test per class of failure found by the adversarial CLI run: each input
that gave a traceback, a hang or a silent wrong result now gives one line naming the
field, or the right result. The inputs are the corpus of tests/malformed_corpus.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli
from malformed_corpus import build_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("malformed"))


def _one_line(capsys, *args: str, code: int = 2, words: tuple[str, ...] = ()) -> str:
    """Run the CLI; it must exit ``code`` with exactly one ``error:`` line on stderr
    holding every word, and no traceback."""
    got, _, err = run_cli(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and ("internal" not in err or code == 1), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# Each case: (class of the issue, argv with {corpus names}, words of the one error line).
CASES = [
    ("zero cp", "simulate --model llama3-8b --gpus 16 --tp 2 --pp 2 --cp 0", ("cp", "0")),
    ("zero pp", "simulate --model llama3-8b --gpus 16 --tp 2 --pp 0", ("pp",)),
    ("zero cp, failures", "failures --model llama3-8b --gpus 16 --cp 0 --days 1", ("cp",)),
    ("vpp -0", "simulate --model llama3-8b --gpus 16 --tp 2 --pp 2 --vpp -0", ("vpp",)),
    ("zero cp, scenario", "simulate --scenario {scenario_cp0.toml}", ("cp",)),
    ("100-digit size", "collective all_reduce --min-bytes " + "9" * 100, ("bytes",)),
    ("hbm_gb 1e308", "hardware show gb200-nvl72 --set gpu.hbm_gb=1e308",
     ("gpu.hbm_gb", "1e+308", "<=")),
    ("preset file hbm_gb 1e308", "hardware show {preset_hbm_1e308.toml}", ("gpu.hbm_gb",)),
    ("sustained_fraction 1e-300", "failures --model llama3-8b --gpus 16 --days 1 "
     "--set gpu.sustained_fraction=1e-300", ("gpu.sustained_fraction", "1e-300")),
    ("failure rate no job survives", "failures --model llama3-8b --gpus 16 --days 1 "
     "--profile {profile_huge_rate.toml}", ("failures", "per run")),
    ("failure rate no job survives, plan", "plan --model llama3-8b --gpus 16 --workers 1 "
     "--profile {profile_huge_rate.toml}", ("failures", "per run")),
    ("days 1e308", "failures --model llama3-8b --gpus 16 --days 1e308", ("days", "36500")),
    # (at analytic fidelity one representative prices it in ~1 s since speed2; every
    # size's 72,000 flows at flow fidelity still would not finish in the bound)
    ("collective on 1,000 nodes", "collective reduce --nodes 1_000 --fidelity flow",
     ("nodes", "8,000 ranks")),
    ("model 1e12 layers", "simulate --model {model_huge_layers.toml} --gpus 8",
     ("num_layers", "10,000,000")),
    ("config.json dropout text", "simulate --model {hf_bad_dropout.json} --gpus 8",
     ("resid_pdrop", "probability")),
    ("replay --out existing file", "validate replay --example tiny --nproc 4 "
     "--out {existing_file}", ("out", "is a file")),
    ("replay --out under a file", "validate replay --example tiny --nproc 4 "
     "--out {under_a_file}", ("out", "not a directory")),
    ("replay --out 300-char name", "validate replay --example tiny --nproc 4 "
     "--out {long_name}", ("out", "255 bytes")),
    ("trace under a file, before simulating", "simulate --model llama3-8b --gpus 8 "
     "--fidelity event --trace {under_a_file}", ("trace", "not a directory")),
    ("emit-scenarios is a file", "plan --model llama3-8b --gpus 8 --workers 1 "
     "--emit-scenarios {existing_file}", ("emit_scenarios", "is a file")),
    ("sweep --cache file", "sweep {spec_ok.yaml} --out {directory}/o.csv "
     "--cache {existing_file}", ("cache", "is a file")),
    ("sweep --cache under a file", "sweep {spec_ok.yaml} --out {directory}/o.csv "
     "--cache {under_a_file}", ("cache", "not a directory")),
    ("sweep --out ''", ["sweep", "{spec_ok.yaml}", "--out", ""], ("out", "not a path")),
    ("calibration is a directory", "collective all_reduce --calibration /",
     ("calibration", "directory")),
    ("calibration table as value", "collective all_reduce --calibration "
     "{cal_table_as_value.toml}", ("scale_up", "table")),
    ("calibration [fields] scalar", "simulate --model llama3-8b --gpus 8 --calibration "
     "{cal_fields_scalar.toml}", ("[fields]", "not a table")),
    ("calibration [fields] list", "failures --model llama3-8b --gpus 8 --days 1 "
     "--calibration {cal_fields_list.toml}", ("[fields]", "not a table")),
    ("calibration [fields] scalar, compare", "validate compare {replay_ok} --calibration "
     "{cal_fields_scalar.toml}", ("[fields]",)),
    ("calibration sets what presets forbid", "collective all_reduce --calibration "
     "{cal_forbidden_value.toml}", ("scale_up.domain_gpus", "0", "cal_forbidden_value")),
    ("spec null key", "sweep {spec_null_key.yaml} --out {directory}/o1.csv", ("None",)),
    ("spec nested 1,000 deep", "sweep {spec_deep.yaml} --out {directory}/o2.csv",
     ("spec", "deep")),
    ("spec alias bomb", "sweep {spec_alias_bomb.yaml} --out {directory}/o3.csv",
     ("spec", "2,000,000")),
    ("spec 1e10 grid", "sweep {spec_grid_1e10.yaml} --out {directory}/o4.csv",
     ("10,000,000,000", "100,000")),
    ("sweep --workers 300", "sweep {spec_ok.yaml} --out {directory}/o5.csv --workers 300",
     ("workers", "256")),
    ("program int shape", "validate replay --program {program_int_shape.json} --nproc 4 "
     "--out {directory}/p1", ("ranks.0[0].shape", "list")),
    ("program without world_size", "validate replay --program "
     "{program_no_world_size.json} --nproc 4 --out {directory}/p2", ("world_size",)),
    ("span without end_ns", "validate compare {replay_span_no_end}", ("end_ns", "missing")),
    ("span bad index", "validate compare {replay_span_bad_index}", ("index", "'x'")),
    ("span without end_ns, calibrate", "calibrate {replay_span_no_end} --out "
     "{directory}/c.toml", ("end_ns",)),
    ("nccl-tests CSV short row", "calibrate {nccl_short_row.csv} --cluster dgx-h100 "
     "--out {directory}/c2.toml", ("line 3", "3 values")),
    ("failures --seeds 1e7", "failures --model llama3-8b --gpus 8 --days 1 --seeds 10000000",
     ("seeds", "100000")),
    ("FIFO as spec", "sweep {fifo} --out {directory}/o6.csv", ("FIFO",)),
    ("/dev/zero as spec", "sweep {dev_zero} --out {directory}/o7.csv", ("FIFO",)),
    ("FIFO as calibration", "collective all_reduce --calibration {fifo}", ("FIFO",)),
    ("FIFO as Program", "validate replay --program {fifo} --nproc 1 --out {directory}/p3",
     ("FIFO",)),
    ("FIFO as scenario", "simulate --scenario {fifo}", ("FIFO",)),
    ("/dev/zero as cluster", "simulate --model llama3-8b --cluster {dev_zero} --gpus 8",
     ("FIFO",)),
    # Importers: the job's own files pass the same edge (regular file, size, nesting)
    ("FIFO as @FILE", "simulate --megatron-args @{fifo} --gpus 8", ("megatron-args", "FIFO")),
    ("/dev/zero as @FILE", "simulate --megatron-args @{dev_zero} --gpus 8", ("FIFO",)),
    ("directory as @FILE", "simulate --megatron-args @{directory} --gpus 8", ("directory",)),
    ("huge @FILE", "plan --megatron-args @{args_huge.args} --gpus 8",
     ("megatron-args", "262,144")),
    ("@FILE not shell words", "simulate --megatron-args @{args_not_words.args} --gpus 8",
     ("args_not_words.args", "shell words")),
    ("@FILE YAML malformed", "failures --megatron-args @{args_bad_yaml.yaml} --gpus 8 "
     "--days 1", ("args_bad_yaml.yaml", "not valid YAML")),
    ("@FILE YAML alias bomb", "simulate --megatron-args @{args_alias_bomb.yaml} --gpus 8",
     ("args_alias_bomb.yaml", "2,000,000")),
    ("unknown Megatron flag", ["simulate", "--megatron-args", "@{args_ok.args} --frobnicate",
                               "--gpus", "8"], ("--frobnicate", "not a Megatron-LM argument")),
    ("shell variable in arguments", ["simulate", "--megatron-args",
                                     "@{args_ok.args} --seq-length $SEQ", "--gpus", "8"],
     ("--seq-length", "shell variable")),
    ("100-digit layer count in arguments", ["simulate", "--megatron-args",
                                            "@{args_ok.args} --num-layers " + "9" * 100,
                                            "--gpus", "8"], ("--num-layers", "10,000,000")),
    ("NaN capacity factor in arguments", ["simulate", "--megatron-args",
                                          "@{args_ok.args} --num-experts 8 "
                                          "--moe-expert-capacity-factor nan", "--gpus", "8"],
     ("--moe-expert-capacity-factor", "finite")),
    ("FIFO as NeMo config", "simulate --nemo-config {fifo} --gpus 8", ("FIFO",)),
    ("/dev/zero as NeMo config", "plan --nemo-config {dev_zero} --gpus 8", ("FIFO",)),
    ("NeMo config malformed", "simulate --nemo-config {nemo_malformed.yaml}",
     ("nemo_malformed.yaml", "not valid YAML")),
    ("NeMo config alias bomb", "failures --nemo-config {nemo_alias_bomb.yaml} --days 1",
     ("nemo_alias_bomb.yaml", "2,000,000")),
    ("NeMo config nested 1,500 deep", "simulate --nemo-config {nemo_deep.yaml}",
     ("nemo_deep.yaml", "deep")),
    ("NeMo model section a scalar", "simulate --nemo-config {nemo_model_scalar.yaml}",
     ("model",)),
    ("NeMo trainer a list", "simulate --nemo-config {nemo_trainer_list.yaml}",
     ("trainer", "[1, 2]")),
    ("NeMo config a directory", "validate replay --nemo-config {directory} --nproc 1 "
     "--out {directory}/p4", ("nemo", "directory")),
    ("FIFO as --write-readme", "validate published --source meta_llama3_paper --format "
     "markdown --write-readme {fifo}", ("write-readme", "FIFO")),
    ("README without markers", "validate published --source meta_llama3_paper --format "
     "markdown --write-readme {existing_file}", ("write-readme", "markers")),
    ("alltoall smaller than one element per rank", "collective alltoall --gpus-per-node 8 "
     "--min-bytes 8 --max-bytes 8 --format nccl-tests", ("max-bytes", "32 bytes")),
    ("one-rank collective", "collective all_reduce --gpus-per-node 1 --format json",
     ("at least 2 ranks",)),
    ("straggler 0:inf", "simulate --model llama3-8b --gpus 8 --straggler 0:inf", ("inf",)),
    ("negative bucket", "simulate --model llama3-8b --gpus 8 --grad-bucket-bytes -1000",
     ("grad_bucket_bytes",)),
]


@pytest.mark.parametrize("name,args,words", CASES, ids=[c[0] for c in CASES])
def test_each_malformed_input_is_one_line(capsys, corpus, name, args, words):
    argv = args if isinstance(args, list) else args.split()
    _one_line(capsys, *(_fill(a, corpus) for a in argv), words=words)


def _fill(arg: str, corpus: dict[str, str]) -> str:
    """``{name}`` replaced by the corpus path of that name (names hold dots)."""
    for name, path in corpus.items():
        arg = arg.replace("{" + name + "}", path)
    assert "{" not in arg, arg
    return arg


#: A NeMo 2 recipe with one part of the wrong shape: (where, value, words of the error).
NEMO_SHAPES = [
    (("data",), float("nan"), ("data", "section")),
    (("optim",), [1, 2], ("optim", "section")),
    (("model", "config"), "x", ("model.config", "section")),
    (("trainer", "callbacks"), 3, ("trainer.callbacks", "list")),
    (("trainer", "strategy", None), 4, ("trainer.strategy.None", "not a name")),
    (("model", "config", 7), True, ("model.config.7", "not a name")),
]


@pytest.mark.parametrize("where,value,words", NEMO_SHAPES,
                         ids=[".".join(map(str, w[0])) for w in NEMO_SHAPES])
def test_nemo_parts_of_the_wrong_shape_are_one_line(capsys, tmp_path, where, value, words):
    import yaml

    data = yaml.safe_load((ROOT / "tests/fixtures/importers/nemo2_llama3_8b.yaml")
                          .read_text(encoding="utf-8"))
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    _one_line(capsys, "simulate", "--nemo-config", str(config), "--model", "llama3-8b",
              "--fidelity", "analytic", words=words)


def test_trace_into_a_new_directory_is_written(capsys, tmp_path):
    trace = tmp_path / "sub" / "deeper" / "out.json"
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "8",
                           "--global-batch", "8", "--fidelity", "event", "--trace", str(trace))
    assert code == 0, err
    assert json.loads(trace.read_text())["traceEvents"]


def test_one_bad_scenario_is_an_error_row(capsys, corpus, tmp_path):
    out = tmp_path / "rows.csv"
    code, _, err = run_cli(capsys, "sweep", corpus["spec_one_bad_scenario.yaml"], "--out",
                           str(out), "--workers", "1")
    assert code == 0, err
    from trainsim.sweeps import read_table

    table = read_table(out)
    assert list(table["status"]) == ["ok", "ok", "error", "ok"]
    assert "tp" in table["error"][2]


def test_any_exception_in_a_scenario_is_a_row(monkeypatch):
    from trainsim import sweeps

    def broken(inputs, overrides):
        return 1 / 0

    monkeypatch.setitem(sweeps._RUNNERS, "step", broken)
    row = sweeps.run_scenario({"kind": "step", "model": "llama3-8b"})
    assert row == {"status": "error", "error": "ZeroDivisionError: division by zero"}


def test_published_json_has_null_where_nothing_was_compared(capsys):
    code, out, err = run_cli(capsys, "validate", "published", "--source",
                             "deepseek_v3_report", "--format", "json")
    assert code == 0, err

    def refuse(constant):
        raise ValueError(constant)

    summary = json.loads(out, parse_constant=refuse)["summary"]
    # the source's one run is a MoE model: its dense-models row compares nothing
    empty = [row for row in summary if row["compared"] == 0]
    assert empty, summary
    assert all(row["median_abs_error"] is None and row["worst_error"] is None
               and row["bias"] is None for row in empty)


def test_worker_processes_are_capped_by_the_work(monkeypatch, tmp_path):
    """--workers 8 for 2 scenarios starts 2 processes, not 8."""
    import concurrent.futures

    from trainsim import sweeps

    started = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, **options):
            started.append(max_workers)
            super().__init__(max_workers=max_workers, **options)

    monkeypatch.setattr(sweeps, "ProcessPoolExecutor", Recording)
    scenarios = sweeps.expand_spec({"kind": "collective",
                                    "base": {"op": "all_reduce", "size_bytes": 1 << 20},
                                    "grid": {"nodes": [1, 2]}})
    result = sweeps.run_sweep(scenarios, tmp_path / "t.csv", workers=8)
    assert len(result["frame"]) == 2
    assert started and max(started) <= 2, started


def test_duplicate_list_values_are_searched_once(capsys):
    code, out, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "16", "--tp",
                             "2", "--pp", "1", "--micro-batch", "8,8,8", "--zero", "1",
                             "--global-batch", "16", "--workers", "1", "--format", "json")
    assert code == 0, err
    plans = json.loads(out)
    keys = [json.dumps(p["plan"], sort_keys=True) for p in plans]
    assert len(keys) == len(set(keys)) >= 1
    counts = err.splitlines()[0]
    assert " -" not in counts, counts  # no negative count


def test_confidence_intervals_stay_in_range():
    import numpy as np

    from sim.longrun.statistics import summary

    counts = summary(np.array([0.0, 0.0, 0.0, 1.0]), lower=0.0)
    assert counts["ci95"][0] == 0.0 and counts["ci95"][1] > 0.25
    goodput = summary(np.array([1.0, 1.0, 0.7]), lower=0.0, upper=1.0)
    assert goodput["ci95"][1] == 1.0 and goodput["ci95"][0] < 0.9


def test_failures_report_clipped_intervals(capsys):
    code, out, err = run_cli(capsys, "failures", "--model", "llama3-8b", "--gpus", "16",
                             "--days", "1", "--seeds", "4", "--checkpoint-interval", "1h",
                             "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    for stats in [data["interruptions"], *data["interruptions_by_cause"].values()]:
        assert stats["ci95"][0] >= 0
    assert 0 <= data["goodput"]["ci95"][0] <= data["goodput"]["ci95"][1] <= 1


def test_corrupted_cache_entry_is_recomputed_with_a_warning(tmp_path):
    from trainsim import sweeps

    scenarios = sweeps.expand_spec({"kind": "collective", "base": {
        "op": "all_reduce", "size_bytes": 1 << 20}, "grid": {"nodes": [1, 2]}})
    out = tmp_path / "t.csv"
    first = sweeps.run_sweep(scenarios, out, workers=1)["frame"]
    cache = Path(f"{out}.cache")
    a, b = (cache / f"{sweeps.scenario_hash(s)}.json" for s in scenarios)
    b.write_text(a.read_text())  # another scenario's result under b's name
    warnings: list[str] = []
    again = sweeps.run_sweep(scenarios, out, workers=1, warn=warnings.append)
    assert again["cached"] == 1 and again["computed"] == 1
    assert len(warnings) == 1 and "another scenario" in warnings[0]
    assert again["frame"].equals(first)
    entry = json.loads(a.read_text())
    entry["result"]["time_us"] *= 2  # edited: the checksum no longer matches
    a.write_text(json.dumps(entry))
    warnings.clear()
    third = sweeps.run_sweep(scenarios, out, workers=1, warn=warnings.append)
    assert "checksum" in warnings[0] and third["frame"].equals(first)


_KILLABLE_SWEEP = textwrap.dedent("""
    import os, sys, time
    from trainsim import sweeps
    real = sweeps._run_chunk

    def slow(chunk):  # the sweep's first rows land, then the workers linger
        os.write(int(sys.argv[2]), f"{os.getpid()}\\n".encode())
        if any(s["nodes"] > 2 for _, s in chunk):
            time.sleep(60)
        return real(chunk)

    sweeps._run_chunk = slow
    scenarios = sweeps.expand_spec({"kind": "collective", "base": {"op": "all_reduce",
        "size_bytes": 1048576}, "grid": {"nodes": [1, 2, 3, 4]}})
    sweeps.run_sweep(scenarios, sys.argv[1], workers=2)
""")


def test_killed_sweep_takes_its_workers_and_resumes_to_the_same_table(tmp_path):
    from trainsim import sweeps

    out = tmp_path / "killed.csv"
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE_SWEEP, str(out), str(write)],
                            cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, pass_fds=(write,))
    os.close(write)
    cache = Path(f"{out}.cache")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(cache.glob("*.json"))) < 2:
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    workers = {int(p) for p in os.read(read, 4096).decode().split()}
    os.close(read)
    time.sleep(0.5)
    alive = [pid for pid in workers if _alive(pid)]
    assert workers and not alive, f"workers outlived the killed sweep: {alive}"
    assert len(list(cache.glob("*.json"))) == 2
    scenarios = sweeps.expand_spec({"kind": "collective", "base": {
        "op": "all_reduce", "size_bytes": 1 << 20}, "grid": {"nodes": [1, 2, 3, 4]}})
    resumed = sweeps.run_sweep(scenarios, out, workers=1)
    assert resumed["cached"] == 2 and resumed["computed"] == 2
    fresh = sweeps.run_sweep(scenarios, tmp_path / "fresh.csv", workers=1)
    assert out.read_text() == (tmp_path / "fresh.csv").read_text()
    assert fresh["computed"] == 4


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead; its parent (gone) cannot reap it, init will
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


_PARENT_OF_A_RANK = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from sim.child_process import die_with_parent

    def rank(parent):
        die_with_parent(parent)
        time.sleep(60)

    child = multiprocessing.get_context("fork").Process(target=rank, args=(os.getpid(),))
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_killed_launcher_takes_its_ranks():
    proc = subprocess.Popen([sys.executable, "-c", _PARENT_OF_A_RANK], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(proc.stdout.readline())
    assert _alive(child)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_run_directory_is_locked_while_written(tmp_path):
    from validate.launch import lock_run_directory

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from validate.launch import lock_run_directory; "
         "lock_run_directory(Path(sys.argv[1])); print('locked', flush=True); "
         "time.sleep(60)", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"pid {holder.pid}"):
            lock_run_directory(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    os.close(lock_run_directory(tmp_path))  # free again once the holder is gone


def test_json_output_refuses_non_finite_numbers():
    from trainsim.cli.errors import InternalError, json_text

    assert json_text({"a": [1.0, 2]}) == '{"a": [1.0, 2]}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(InternalError, match=r"x\[1\]"):
            json_text({"x": [0.0, bad]})


def test_a_fault_of_trainsim_is_one_line_exit_1(capsys, monkeypatch):
    from trainsim import api

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(api, "collective", broken)
    line = _one_line(capsys, "collective", "all_reduce", code=1)
    assert line.startswith("error: internal: ZeroDivisionError")
