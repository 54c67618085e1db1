"""Same inputs, same bytes: collective, simulate, failures (seeded), plan and sweep give
byte-identical output in two processes with different ``PYTHONHASHSEED`` (set and dict
iteration orders of strings differ between them, so any output that follows one would
differ here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs each command in one process; prints {command: SHA-256 and length of its output}.
_RUN_ALL = textwrap.dedent("""
    import contextlib, hashlib, io, json, sys
    from pathlib import Path
    from trainsim.cli import main

    out_dir = Path(sys.argv[1])
    spec = out_dir / "spec.yaml"
    spec.write_text("kind: step\\nbase: {model: llama3-8b, gpus: 16, global_batch: 16}\\n"
                    "grid:\\n  tp: [1, 2, 4]\\n  nic.gbit_per_s: [200, 400]\\n")
    commands = {
        "collective": ["collective", "all_reduce", "--nodes", "2", "--max-bytes", "64M",
                       "--format", "json"],
        "simulate": ["simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2",
                     "--pp", "2", "--global-batch", "16", "--fidelity", "event",
                     "--straggler", "3:0.8", "--format", "json"],
        "failures": ["failures", "--model", "llama3-8b", "--gpus", "16", "--days", "7",
                     "--seeds", "20", "--seed", "5", "--format", "json"],
        "plan": ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "16",
                 "--top", "3", "--workers", "1", "--tp", "1,2", "--pp", "1,2",
                 "--format", "json"],
        "sweep": ["sweep", str(spec), "--out", str(out_dir / "table.csv"), "--workers", "2"],
    }
    digests = {}
    for name, args in commands.items():
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
            try:
                main(args)
            except SystemExit as done:
                assert not done.code, (name, done.code)
        text = buffer.getvalue()
        if name == "sweep":
            text = (out_dir / "table.csv").read_text()
        else:
            json.loads(text)  # the output is the JSON, nothing else
        digests[name] = [hashlib.sha256(text.encode()).hexdigest(), len(text)]
    print(json.dumps(digests))
""")


def _start(tmp_path: Path, hash_seed: str) -> subprocess.Popen:
    directory = tmp_path / f"hashseed{hash_seed}"
    directory.mkdir()
    return subprocess.Popen([sys.executable, "-c", _RUN_ALL, str(directory)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONHASHSEED": hash_seed,
                                 "PYTHONPATH": str(ROOT)})


def _outputs(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out)


def test_outputs_do_not_depend_on_the_hash_seed(tmp_path):
    runs = [_start(tmp_path, "1"), _start(tmp_path, "2")]  # side by side: two cores
    first, second = (_outputs(run) for run in runs)
    assert set(first) == {"collective", "simulate", "failures", "plan", "sweep"}
    assert all(length > 100 for _, length in first.values()), first
    assert first == second

