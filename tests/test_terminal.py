"""Work that can take more than a second shows a spinner or a bar on a terminal, and
nothing of it when the output is not a terminal (a pipe, a file, a test).

The terminal is a real pseudo-terminal (``pty``), so this is what a user's shell sees."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

pty = pytest.importorskip("pty")  # POSIX only

ROOT = Path(__file__).resolve().parents[1]
STEP = ("--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--global-batch",
        "32")
SPEC = "base: {model: llama3-8b, gpus: 8, global_batch: 8}\ngrid: {tp: [1, 2]}\n"
#: Command, and what its spinner or bar prints while it works.
COMMANDS = {
    "simulate": (("simulate", *STEP), "simulating..."),
    "simulate --report": (("simulate", *STEP, "--report", "{tmp}/step.html"),
                          "writing the report..."),
    "failures": (("failures", *STEP, "--days", "5", "--seeds", "4"), "simulating..."),
    "collective": (("collective", "all_reduce", "--nodes", "2"), "simulating..."),
    "plan": (("plan", "--model", "llama3-8b", "--gpus", "16", "--tp", "1,2", "--pp", "1,2",
              "--zero", "1", "--recompute", "none", "--workers", "1", "--global-batch", "32"),
             "simulating (analytic)"),
    "sweep": (("sweep", "{tmp}/spec.yaml", "--out", "{tmp}/r.csv", "--workers", "1"),
              "━"),  # the bar (its phase, "scenarios", is also in the summary line)
}


def _in_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``python -m trainsim.cli args`` with stdin, stdout and stderr on a pty."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "trainsim.cli", *args], stdin=slave,
                            stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=120)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def _args(name: str, tmp: Path) -> list[str]:
    (tmp / "spec.yaml").write_text(SPEC)
    return [a.replace("{tmp}", str(tmp)) for a in COMMANDS[name][0]]


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[] if name == "simulate" else [pytest.mark.slow])  # ~4 s each
    for name in COMMANDS])
def test_a_terminal_sees_the_work_progress(name, tmp_path):
    code, shown = _in_terminal(_args(name, tmp_path), tmp_path)
    assert code == 0, shown[-2000:]
    assert COMMANDS[name][1] in shown, shown[:2000]


@pytest.mark.parametrize("name", COMMANDS)
def test_no_progress_without_a_terminal(name, tmp_path, capsys):
    code, out, err = run_cli(capsys, *_args(name, tmp_path))
    assert code == 0, err
    assert COMMANDS[name][1] not in out + err
    assert "\x1b" not in out + err  # no cursor or colour codes in a file
