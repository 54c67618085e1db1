"""Every command example of the README runs as written.

The examples are read from README.md itself: every line of a ``bash`` block (backslash
continuations joined, ``&&`` chains split, comments dropped) and every ``python`` block.
The files the README shows (a block whose first line is ``# step.toml``, or whose info
string names the file, as in ``json config.json``) are written first, into one working
directory that the commands share in README order (a ``> result.json`` of one command is
the ``--scenario result.json`` of the next).

``trainsim`` commands run in-process through the CLI's ``main``; any exception other than
the CLI's own exit fails the test with its traceback, and so does a non-zero exit. The
install and test-suite commands are the set-up itself and are not re-run here
(:data:`SETUP`). Commands that take more than a few seconds on two cores are marked
``slow`` (:data:`SLOW`); those that take minutes (:data:`LONG`) run only with
``TRAINSIM_README_LONG=1`` and are skipped with their reason otherwise; those that need
the hardware they describe (:data:`HARDWARE`) are skipped with their reason. The lists are
checked against the README, so they cannot go stale.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: The set-up and the suite (what .ci/run does): not re-run from inside the suite.
SETUP = ("python -m pip install", "python -m pytest")
#: Examples that take 3-20 s here (marked ``slow``), and what they do.
SLOW = {
    "trainsim simulate --model llama3-70b --cluster dgx-h100 --gpus 1024 --tp 8 --pp 4 --dp 32 "
    "--global-batch 1024 --seq-len 8192 --trace step.json": "an event replay of 32 "
    "micro-batches",
    "trainsim simulate --model mixtral-8x7b --gpus 128 --tp 2 --pp 4 --ep 8 --recompute full "
    "--format json": "an event replay at the default batch",
    "trainsim validate replay --example tiny --backend gloo --nproc 4 --out runs/tiny":
        "4 gloo processes",
    "trainsim calibrate runs/tiny --out runs/tiny.toml": "needs the replay",
    "trainsim validate compare runs/tiny --calibration runs/tiny.toml --format json":
        "needs the replay",
    "trainsim plan --model llama3-8b --gpus 64 --tp 1,2 --pp 1,2,4 --zero 1,3 --schedule "
    "1f1b,zb-h1": "a plan search",
    "python benchmarks/collective_scale.py": "a benchmark",
    "trainsim failures --model llama3-405b --gpus 16128 --tp 8 --pp 14 --seq-len 8192 "
    "--global-batch 2016 --recompute full --days 54 --profile llama3-h100 "
    "--checkpoint-interval auto --seeds 100": "100 seeds and an interval scan (4 s)",
    "trainsim simulate --model ./config.json --gpus 16 --tp 2 --pp 4 --schedule zb-h1 "
    "--global-batch 32 --report step.html --trace zb.json --trace-ranks all":
        "an event replay, the report and every rank's trace (3 s)",
    "trainsim plan --megatron-args @job.args --tp 2,4,8 --pp 1,2,4": "a plan search on 256 "
    "GPUs (14 s)",
}
#: Examples that measure real execution: run with the machine's CPUs to themselves (the
#: tests of other xdist workers would be part of the measurement, and the README's
#: ``validate compare`` of it exits 1 past its 15 % tolerance).
MEASURED = {"trainsim validate replay --example tiny --backend gloo --nproc 4 --out runs/tiny"}
#: Examples that need the hardware they describe: skipped here with this reason.
HARDWARE = {
    "trainsim validate replay --megatron-args @job.args --out runs/job": "replays the job "
    "on its 256 GPUs under torchrun (outside a job it exits 2 asking for --nproc)",
}
#: Examples that take from half a minute to ten minutes on two cores (27 min for all of
#: them and the rest): run with ``TRAINSIM_README_LONG=1``, else skipped with this reason.
LONG = {
    "trainsim collective all_reduce --cluster dgx-h100 --nodes 128 --fidelity flow --format "
    "json": "1,024 ranks at flow fidelity (45 s)",
    "trainsim simulate --scenario step.toml --format json > result.json": "1,024 GPUs at "
    "event fidelity, default batch (40 s)",
    "trainsim simulate --scenario step.toml --pp 8": "1,024 GPUs at event fidelity (70 s)",
    "trainsim simulate --scenario result.json": "1,024 GPUs at event fidelity (40 s)",
    "trainsim failures --scenario step.toml": "1,024 GPUs at event fidelity (40 s)",
    "trainsim plan --model llama3-70b --gpus 1024 --emit-scenarios plans/": "a plan search "
    "on 1,024 GPUs (35 s)",
    "trainsim plan --model llama3-70b --cluster dgx-h100 --gpus 1024 --format json":
        "a plan search on 1,024 GPUs (35 s)",
    "trainsim plan --model llama3-70b --gpus 1024 --tokens 15T --price-per-gpu-hour 2.5 "
    "--sort cost": "a plan search on 1,024 GPUs (35 s)",
    "trainsim plan --model llama3-70b --tokens 2T --days 30": "plan searches from 8 to "
    "1,024 GPUs (4-5 min)",
    "python benchmarks/scale.py": "a benchmark up to 16,384 GPUs at flow fidelity (10 min)",
    "python benchmarks/analytic_sweep.py": "a benchmark of 10,000 plans (2.5 min)",
    "python benchmarks/plan_scale.py": "a benchmark (40 s)",
    "python benchmarks/failures_mc.py": "a benchmark (30 s)",
    "python benchmarks/speed.py": "the speed figures of issue 16 (several minutes)",
    "python benchmarks/fuzz_cli.py --calls 10000": "10,000 hostile CLI calls (about an "
    "hour on one core)",
    "python notebooks/render.py": "executes the six notebooks (2.5 min)",
    "trainsim sweep spec.yaml --out results.csv --backend ray": "starts a local Ray (25-50 s); "
    "tests/test_sweep.py runs the same sweep on Ray and compares it with the local table",
}
#: Files the README's examples read, from its blocks.
_FILE_HEADER = re.compile(r"#\s*([\w.-]+\.(?:toml|yaml|json))\s*$")
#: A block's info string that names its file.
_FILE_NAME = re.compile(r"[\w-]+\.[\w.]+")


def _blocks() -> list[tuple[str, str, str]]:
    """(language, rest of the info string, body) of every fenced block."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in
            re.finditer(r"^```(\w*)([^\n]*)\n(.*?)^```", README, flags=re.S | re.M)]


def readme_files() -> dict[str, str]:
    """``{file name: text}`` of the files the README shows."""
    files = {}
    for language, info, body in _blocks():
        first = body.splitlines()[0] if body.strip() else ""
        named = _FILE_HEADER.fullmatch(first.strip())
        if language in ("toml", "yaml") and named:
            files[named.group(1)] = body
        elif _FILE_NAME.fullmatch(info):  # ```json config.json, ```text job.args
            files[info] = body
    return files


def readme_commands() -> list[str]:
    """Every command of the README's bash blocks, then ``python:<first line>`` for each
    python block, in README order."""
    commands = []
    for language, _, body in _blocks():
        if language == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line and not line.startswith("#"):
                    commands += [" ".join(part.split()) for part in line.split("&&")]
        elif language == "python":
            commands.append("python:" + body.splitlines()[0])
    return commands


def _python_block(first_line: str) -> str:
    return next(body for language, _, body in _blocks()
                if language == "python" and body.splitlines()[0] == first_line)


def _params():
    out = []
    for command in readme_commands():
        if command.startswith(SETUP):
            continue
        if command in HARDWARE:
            marks = [pytest.mark.skip(reason=f"needs real hardware: {HARDWARE[command]}")]
        else:
            marks = [pytest.mark.slow] if command in SLOW or command in LONG else []
        out.append(pytest.param(command, marks=marks, id=command[:70]))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One directory for all the examples, holding the README's files."""
    path = tmp_path_factory.mktemp("readme")
    # the README names files of the repository by their path in it (tests/fixtures/...)
    (path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    for name, text in readme_files().items():
        (path / name).write_text(text, encoding="utf-8")
    return path


def test_the_readme_has_its_examples_and_the_lists_are_current():
    commands = readme_commands()
    assert len(commands) >= 30
    assert {"step.toml", "spec.yaml", "config.json"} <= set(readme_files())
    assert [c for c in (*SLOW, *LONG, *HARDWARE, *MEASURED) if c not in commands] == []  # no stale entry
    assert {"job.args"} <= set(readme_files())
    assert any(c.startswith("python -m pip install") for c in commands)


@pytest.mark.parametrize("command", _params())
def test_readme_example_runs(command, workdir, monkeypatch, capsys, _shares_the_cpu):
    if command in LONG and not os.environ.get("TRAINSIM_README_LONG"):
        pytest.skip(f"README example takes minutes: {LONG[command]}; run with "
                    "TRAINSIM_README_LONG=1")
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("COLUMNS", "100")
    if command.startswith("python:"):
        exec(compile(_python_block(command[len("python:"):]), "README.md", "exec"), {})
        return
    args = shlex.split(command)
    target = None
    if ">" in args:  # the README's one redirection: stdout into a file
        at = args.index(">")
        args, target = args[:at], args[at + 1]
    if args[0] == "trainsim":
        from trainsim.cli import main

        capsys.readouterr()
        code = 0
        alone = _shares_the_cpu.alone() if command in MEASURED else contextlib.nullcontext()
        try:
            with alone:
                main(args[1:])
        except SystemExit as done:
            code = done.code or 0
        out, err = capsys.readouterr()
        assert code == 0, f"{command}: exit {code}: {err[-2000:]}"
    else:  # python scripts, as a user runs them
        if args[1] == "notebooks/render.py":
            pytest.importorskip("kaleido", reason="python notebooks/render.py needs the "
                                "notebooks extra")
        done = subprocess.run([sys.executable, *(str(ROOT / a) if a.endswith(".py") else a
                                                 for a in args[1:])],
                              capture_output=True, text=True, cwd=workdir,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        out, err = done.stdout, done.stderr
        assert done.returncode == 0, f"{command}: exit {done.returncode}: {err[-2000:]}"
    assert "Traceback" not in err, err
    if target:
        (workdir / target).write_text(out, encoding="utf-8")
