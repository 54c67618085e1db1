"""The malformed-input corpus of issue 17: static files in ``tests/malformed/`` and the
cases made at test time (a FIFO, a replay directory with broken spans, Program JSON that
is too big to keep in the repository, existing files to write over).

:func:`build_corpus` returns ``{name: path}``; ``tests/test_malformed_inputs.py`` (one
test per class of the issue) and the fuzz test and script (``tests/cli_fuzz.py``) use it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "malformed"


def _replay_dir(directory: Path) -> Path:
    """A replay directory as ``validate replay --example tiny`` writes it, with made-up
    times (every op 1 us, one after the other): enough for compare and calibrate to read
    it, no torch needed."""
    from validate.examples import example_program
    from validate.program_io import program_to_json
    from validate.store import MeasurementStore, iteration_name

    program = example_program("tiny")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "program.json").write_text(program_to_json(program), encoding="utf-8")
    store = MeasurementStore(directory)
    store.write_meta("run", {"task": "replay", "cluster": None, "backend": "gloo"})
    for rank in program.ranks():
        store.write_meta("env", {"backend": "gloo", "hostname": "host0",
                                 "cuda_available": False}, rank=rank)
        for iteration in range(2):
            spans = [{"index": i, "start_ns": 1000 * i, "end_ns": 1000 * i + 900}
                     for i in range(len(program.ops_by_rank[rank]))]
            store.write(rank, "replay", iteration_name(iteration),
                        {"iteration": iteration, "spans": spans})
    return directory


def _broken_span(source: Path, target: Path, change) -> Path:
    shutil.copytree(source, target)
    record = target / "rank00001" / "replay" / "iter00000.json"
    data = json.loads(record.read_text(encoding="utf-8"))
    change(data["spans"][3])
    record.write_text(json.dumps(data), encoding="utf-8")
    return target


def build_corpus(root: Path) -> dict[str, str]:
    """Make the generated cases under ``root``; return every case's path by name (the
    static files by their file name)."""
    from validate.examples import example_program
    from validate.program_io import program_to_dict

    root.mkdir(parents=True, exist_ok=True)
    cases = {p.name: str(p) for p in sorted(STATIC.iterdir()) if p.is_file()
             and p.suffix != ".md"}
    fifo = root / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    cases["fifo"] = str(fifo)
    cases["dev_zero"] = "/dev/zero"
    cases["directory"] = str(root)
    cases["missing"] = str(root / "missing.toml")
    existing = root / "existing_file"
    existing.write_text("x\n", encoding="utf-8")
    cases["existing_file"] = str(existing)
    cases["under_a_file"] = str(existing / "sub")
    cases["long_name"] = str(root / ("a" * 300))

    program = program_to_dict(example_program("tiny"))
    shape = json.loads(json.dumps(program))
    shape["ranks"]["0"][0]["shape"] = 5
    (root / "program_int_shape.json").write_text(json.dumps(shape), encoding="utf-8")
    cases["program_int_shape.json"] = str(root / "program_int_shape.json")
    world = json.loads(json.dumps(program))
    del world["world_size"]
    (root / "program_no_world_size.json").write_text(json.dumps(world), encoding="utf-8")
    cases["program_no_world_size.json"] = str(root / "program_no_world_size.json")
    good = root / "program_tiny.json"
    good.write_text(json.dumps(program), encoding="utf-8")
    cases["program_tiny.json"] = str(good)

    replay = root / "replay_ok"
    if not replay.exists():
        _replay_dir(replay)
        _broken_span(replay, root / "replay_span_no_end", lambda s: s.pop("end_ns"))
        _broken_span(replay, root / "replay_span_bad_index",
                     lambda s: s.__setitem__("index", "x"))
    cases["replay_ok"] = str(replay)
    cases["replay_span_no_end"] = str(root / "replay_span_no_end")
    cases["replay_span_bad_index"] = str(root / "replay_span_bad_index")

    scenario = root / "scenario_ok.toml"
    scenario.write_text('model = "llama3-8b"\ngpus = 8\nfidelity = "analytic"\n'
                        '[plan]\nglobal_batch = 8\n', encoding="utf-8")
    cases["scenario_ok.toml"] = str(scenario)
    spec = root / "spec_ok.yaml"
    spec.write_text("kind: collective\nbase: {op: all_reduce, size_bytes: 1048576}\n"
                    "grid:\n  nodes: [1, 2]\n", encoding="utf-8")
    cases["spec_ok.yaml"] = str(spec)
    job = root / "args_ok.args"
    job.write_text("# a small job\n--tensor-model-parallel-size 2 --num-layers 4 \\\n"
                   "  --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\\n"
                   "  --max-position-embeddings 2048 --micro-batch-size 1 "
                   "--global-batch-size 16 --bf16\n", encoding="utf-8")
    cases["args_ok.args"] = str(job)
    # An @FILE past the input edge's limit for argument files (hardware.user_input).
    from hardware.user_input import MAX_TEXT_BYTES

    huge = root / "args_huge.args"
    line = "--num-layers 4 --hidden-size 1024\n"
    huge.write_text(line * (MAX_TEXT_BYTES // len(line) + 1), encoding="utf-8")
    cases["args_huge.args"] = str(huge)
    calibration = root / "cal_ok.toml"
    calibration.write_text('[fields]\n"scale_up.link_efficiency" = 0.8\n', encoding="utf-8")
    cases["cal_ok.toml"] = str(calibration)
    return cases
