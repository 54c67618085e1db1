"""Real execution on CPU with gloo (runs in CI): replay, calibrate, compare; kill and
resume; microbenchmarks; bad input. One replay of the tiny example is shared by the
tests of this module (starting 4 gloo ranks takes seconds)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cpu_to_itself, run_cli

# Real executions (gloo ranks, microbenchmarks; ~15 s): the whole suite, not the inner loop.
pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch") is None:  # checked without importing it (~2 s)
    pytest.skip("torch is not installed (pip install trainsim[test])", allow_module_level=True)

#: Stated tolerance of the Must-show (issue 6): step-time error of the calibrated
#: simulation of the tiny example's CPU replay.
STEP_TOLERANCE = 0.15


@pytest.fixture(scope="module")
def replay_dir(tmp_path_factory):
    """`trainsim validate replay --example tiny --backend gloo --nproc 4` (6 iterations),
    with the CPUs to itself: its measured step is compared with the simulation, and the
    tests of another xdist worker running alongside would be part of that measurement."""
    out = tmp_path_factory.mktemp("replay") / "tiny"
    from trainsim.cli import main

    try:
        with cpu_to_itself(tmp_path_factory):
            main(["validate", "replay", "--example", "tiny", "--backend", "gloo", "--nproc", "4",
                  "--iterations", "6", "--warmup", "2", "--out", str(out)])
    except SystemExit as done:
        assert not done.code, f"replay failed with exit code {done.code}"
    return out


def test_calibrated_simulation_reproduces_the_measured_step(capsys, replay_dir, tmp_path):
    from validate.program_io import load_program

    cal = tmp_path / "cal.toml"
    code, out, err = run_cli(capsys, "calibrate", str(replay_dir), "--out", str(cal))
    assert code == 0, err
    code, out, err = run_cli(capsys, "validate", "compare", str(replay_dir), "--calibration",
                             str(cal), "--format", "json", "--tolerance", str(STEP_TOLERANCE))
    result = json.loads(out)
    assert {"step_time_error", "per_op_kind"} <= set(result)
    assert result["step_time_error"] <= STEP_TOLERANCE, result["step_time_s"]
    assert code == 0
    kinds = result["per_op_kind"]
    assert {"matmul", "attention", "norm", "elementwise", "optimizer", "all_reduce",
            "p2p"} <= set(kinds)
    # the measured step is a real measurement, not the simulation echoed back
    assert result["step_time_s"]["measured"] != result["step_time_s"]["simulated"]
    # every rank got a measured speed (ranks sharing a busier core run slower)
    assert sorted(int(r) for r in result["inputs"]["rank_speed"]) == [0, 1, 2, 3]
    # past the tolerance the command says so and exits non-zero
    code, out, err = run_cli(capsys, "validate", "compare", str(replay_dir), "--calibration",
                             str(cal), "--format", "json", "--tolerance", "1e-9", "--trace",
                             str(tmp_path / "step"))
    assert code == 1 and "exceeds tolerance" in err
    for which in ("measured", "simulated"):  # Perfetto traces side by side
        events = json.loads((tmp_path / f"step.{which}.json").read_text())["traceEvents"]
        assert sum(1 for e in events if e.get("ph") == "X") == sum(
            len(ops) for ops in load_program(replay_dir / "program.json").ops_by_rank.values())


def test_without_calibration_the_cpu_host_placeholders_are_far_off(capsys, replay_dir):
    """The comparison can fail: cpu-host's deliberately low placeholder rates without a
    calibration miss the measured step by far more than the tolerance."""
    code, out, _ = run_cli(capsys, "validate", "compare", str(replay_dir), "--format", "json")
    result = json.loads(out)
    assert code == 1 and result["step_time_error"] > 1.0
    # and the prediction band says so: the measured step lies outside it
    step = result["step_time_s"]
    assert step["p10"] <= step["p50"] <= step["p90"]
    assert result["inside_band"] is False


def test_spans_use_the_timeline_schema_and_environment_is_recorded(replay_dir):
    from sim.timeline import Span
    from validate.program_io import load_program

    program = load_program(replay_dir / "program.json")
    for rank in program.ranks():
        files = sorted((replay_dir / f"rank{rank:05d}" / "replay").glob("iter*.json"))
        assert len(files) == 6
        record = json.loads(files[-1].read_text())
        assert len(record["spans"]) == len(program.ops_by_rank[rank])
        for span in record["spans"]:
            Span(rank, span["stream"], span["op"], span["kind"], span["start_ns"],
                 span["end_ns"], span["bytes"], span["flops"], span["category"])
        env = json.loads((replay_dir / f"rank{rank:05d}" / "env.json").read_text())
        assert env["torch"] and env["backend"] == "gloo" and env["hostname"]
        assert "nccl" in env and "driver" in env and "nvidia_smi_topo" in env


def _replay_command(out: Path, iterations: int) -> list[str]:
    return [sys.executable, "-m", "trainsim.cli", "validate", "replay", "--example", "tiny",
            "--backend", "gloo", "--nproc", "4", "--iterations", str(iterations),
            "--warmup", "1", "--out", str(out)]


@pytest.mark.slow
def test_killed_rank_loses_nothing_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "killed"
    iterations = 8
    run = subprocess.Popen(_replay_command(out, iterations), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    victim = out / "rank00002"
    deadline = time.monotonic() + 120
    while not (victim / "replay" / "iter00002.json").exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "rank 2 never finished iteration 2"
        time.sleep(0.05)
    pid = json.loads((victim / "process.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)  # mid-run: rank 2 is in iteration 3 or later
    _, err = run.communicate(timeout=60)
    assert run.returncode != 0 and "resume" in err
    # every finished measurement is readable, and no rank finished everything
    before = {}
    for path in out.glob("rank*/replay/*.json"):
        record = json.loads(path.read_text())
        assert record["spans"] and record["iteration"] == int(path.stem[4:])
        before[path] = path.read_bytes()
    assert len(before) < 4 * iterations
    rerun = subprocess.run(_replay_command(out, iterations), capture_output=True, text=True,
                           timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    for rank in range(4):
        assert len(list((out / f"rank{rank:05d}" / "replay").glob("iter*.json"))) == iterations
    for path, data in before.items():  # append-only: what was measured stays as it was
        assert path.read_bytes() == data
    from validate.spans import load_measurements

    assert len(load_measurements(out).iterations) == iterations


def test_collectives_microbenchmark_and_calibration_from_it(capsys, tmp_path):
    out = tmp_path / "coll"
    code, text, err = run_cli(capsys, "validate", "collectives", "--backend", "gloo",
                              "--nproc", "2", "--ops", "all_reduce,sendrecv,all_gather",
                              "--min-bytes", "4K", "--max-bytes", "1M", "--step-factor", "4",
                              "--iters", "20", "--warmup", "3", "--out", str(out))
    assert code == 0, err
    from validate.nccl_log import parse_nccl_tests

    rows = json.loads(run_cli(capsys, "validate", "collectives", "--backend", "gloo",
                              "--nproc", "2", "--ops", "all_reduce", "--min-bytes", "4K",
                              "--max-bytes", "1M", "--step-factor", "4", "--out", str(out),
                              "--format", "json")[1])
    assert [r["size_bytes"] for r in rows] == [4096, 16384, 65536, 262144, 1048576]
    for row in rows:  # nccl-tests' definitions
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_us"] / 1e3)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)
    first_table = text.split("# Collective test starting: ")[1]
    series = parse_nccl_tests("# Collective test starting: " + first_table, label="stdout")
    assert series.kind == "all_reduce" and series.gpus_per_node == 2
    cal = tmp_path / "cal.toml"
    code, text, err = run_cli(capsys, "calibrate", str(out), "--out", str(cal), "--format",
                              "json")
    assert code == 0, err
    residuals = json.loads(text)["residuals"]["comm"]
    assert set(residuals) == {f"coll:collectives:{op}" for op in ("all_reduce", "sendrecv",
                                                                  "all_gather")}
    # Loopback gloo on a shared 2-core host is noisy (milliseconds of scheduling per call)
    # and gloo's all_gather is no NCCL ring, so no tight bound holds here (the fit itself
    # is checked exactly on synthetic points and within 5 % on published nccl-tests runs,
    # test_validate_units / test_validate_nccl_tests). What must hold: the fit moved the
    # loopback bandwidth off cpu-host's placeholder 0.1 GB/s, which every line exceeds.
    fields = json.loads(text)["fields"]
    assert fields["scale_up.pcie_bytes_per_s"] > 2 * 0.1e9


def test_gemm_microbenchmark(capsys, tmp_path):
    out = tmp_path / "gemm"
    code, text, err = run_cli(capsys, "validate", "gemm", "--backend", "gloo", "--nproc", "1",
                              "--dtype", "fp32", "--sizes", "64,128", "--shapes", "2x32x48x16",
                              "--copy-sizes", "64K,1M",
                              "--iters", "3", "--out", str(out))
    assert code == 0, err
    from validate.store import MeasurementStore

    records = MeasurementStore(out).read_series("compute")[0]
    kinds = sorted(r["kind"] for r in records)
    assert kinds == ["matmul", "matmul", "matmul", "memcpy", "memcpy"]
    assert [2, 32, 48, 16] in [r.get("shape") for r in records]
    for r in records:
        assert r["time_s"] > 0 and r["work"] > 0
    assert "TFLOP/s" in text and "GB/s" in text


@pytest.mark.parametrize("args, words", [
    (["--example", "huge"], ["example: 'huge'", "valid: tiny"]),
    (["--example", "tiny", "--nproc", "3"], ["nproc: 3", "valid: 4"]),
    (["--example", "tiny", "--backend", "mpi"], ["backend: 'mpi'", "valid:"]),
    ([], ["program: give exactly one of"]),
])
def test_replay_bad_input_is_one_line(capsys, tmp_path, args, words):
    code, _, err = run_cli(capsys, "validate", "replay", "--out", str(tmp_path / "x"), *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    for word in words:
        assert word in err


def test_replay_refuses_a_directory_of_another_program(capsys, tmp_path):
    (tmp_path / "program.json").write_text("{}")
    code, _, err = run_cli(capsys, "validate", "replay", "--example", "tiny", "--nproc", "4",
                           "--out", str(tmp_path))
    assert code == 2 and "another program" in err


def test_compare_bad_input_is_one_line(capsys, tmp_path, replay_dir):
    code, _, err = run_cli(capsys, "validate", "compare", str(tmp_path))
    assert code == 2 and "program.json" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "validate", "compare", str(replay_dir), "--fidelity", "exact")
    assert code == 2 and "fidelity: 'exact'" in err


@pytest.mark.gpu
def test_nccl_replay_on_gpus(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 4:
        pytest.skip("needs 4 CUDA GPUs")
    out = tmp_path / "gpu"
    code, _, err = run_cli(capsys, "validate", "replay", "--example", "tiny", "--backend",
                           "nccl", "--nproc", "4", "--iterations", "5", "--out", str(out))
    assert code == 0, err
    env = json.loads((out / "rank00000" / "env.json").read_text())
    assert env["nccl"] and env["gpus"]
    code, _, err = run_cli(capsys, "validate", "collectives", "--backend", "nccl", "--nproc",
                           "4", "--ops", "all_reduce", "--min-bytes", "1M", "--max-bytes",
                           "64M", "--out", str(out / "coll"))
    assert code == 0, err


@pytest.mark.gpu
def test_gemm_on_gpu(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    code, _, err = run_cli(capsys, "validate", "gemm", "--backend", "nccl", "--nproc", "1",
                           "--dtype", "bf16", "--sizes", "1024,4096", "--out", str(tmp_path))
    assert code == 0, err


def test_program_file_with_every_collective_kind_replays(capsys, tmp_path):
    """A hand-written 2-rank Program (every collective kind the IR has, send/recv,
    cross-stream deps) replays from a file with gloo, and compare reads it back."""
    from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp, matmul_op
    from validate.program_io import program_to_json

    def rank_ops(rank: int):
        peer = 1 - rank
        ops = [matmul_op("mm", 1, 64, 64, 64, dtype="fp32"),
               ComputeOp(name="attn", kind="attention", flops=4 * 2 * 16 * 32 * 8,
                         bytes=4096, shape=(1, 2, 1, 16, 16, 8), dtype="fp32"),
               ComputeOp(name="norm", kind="norm", flops=100, bytes=8192, dtype="fp32")]
        for i, kind in enumerate(("all_reduce", "all_gather", "reduce_scatter", "alltoall",
                                  "broadcast", "reduce", "sendrecv")):
            ops.append(CollectiveOp(name=kind, key=f"{kind}#0", kind=kind, group=(0, 1),
                                    size_bytes=4096, root=0 if kind in ("broadcast", "reduce")
                                    else None, dtype="fp32", deps=(0,) if i == 0 else ()))
        if rank == 0:
            ops.append(SendOp(name="send", peer=peer, size_bytes=2048, tag="t", deps=(2,)))
        else:
            ops.append(RecvOp(name="recv", peer=peer, size_bytes=2048, tag="t"))
            ops.append(ComputeOp(name="after", kind="elementwise", bytes=1024, dtype="fp32",
                                 deps=(len(ops) - 1,)))
        return tuple(ops)

    program = Program(ops_by_rank={0: rank_ops(0), 1: rank_ops(1)}, world_size=2,
                      name="every kind")
    path = tmp_path / "program.json"
    path.write_text(program_to_json(program))
    out = tmp_path / "run"
    code, text, err = run_cli(capsys, "validate", "replay", "--program", str(path), "--backend",
                              "gloo", "--nproc", "2", "--iterations", "2", "--warmup", "1",
                              "--out", str(out))
    assert code == 0, err
    from validate.spans import load_measurements

    measured = load_measurements(out)
    kinds = sorted(inst.kind for inst in measured.comm_instances())
    assert kinds == sorted(["all_reduce", "all_gather", "reduce_scatter", "alltoall",
                            "broadcast", "reduce", "sendrecv", "p2p"])
    # the dependent op started after the recv it waits for had finished
    for it in measured.iterations:
        recv_end = it[(1, len(rank_ops(1)) - 2)][1]
        assert it[(1, len(rank_ops(1)) - 1)][0] >= recv_end
    code, text, err = run_cli(capsys, "calibrate", str(out), "--out", str(tmp_path / "c.toml"))
    assert code == 0, err
    code, text, _ = run_cli(capsys, "validate", "compare", str(out), "--calibration",
                            str(tmp_path / "c.toml"), "--format", "json", "--tolerance", "100")
    assert code == 0 and "broadcast" in json.loads(text)["per_op_kind"]
