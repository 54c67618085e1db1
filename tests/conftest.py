"""Shared test helpers."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import pytest

from example_schedule import EagerOneFOneB
from strategies.schedules import register

# A schedule added the way a user adds one (tests/example_schedule.py): registered
# before collection, so every test parametrized over the registry covers it.
register(EagerOneFOneB())
#: Published measurements the tests check against, kept in the repository
#: (validate/data/*/SOURCES.md says where each comes from).
DATA = Path(__file__).resolve().parents[1] / "validate" / "data"


def _cpu_lock_files(tmp_path_factory) -> tuple[Path, Path]:
    """The gate and the CPU lock files, shared by every pytest-xdist worker of the run
    (their base temp directories share one parent)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / "cpu.gate", root / "cpu.lock"


@contextlib.contextmanager
def _cpu_lock(tmp_path_factory, mode: int):
    """Hold the run's CPU lock in ``mode`` (``fcntl.LOCK_SH`` or ``LOCK_EX``) across
    pytest-xdist workers; nothing outside xdist. The gate is passed first, so a waiting
    exclusive one keeps new shared ones out (no starvation). Yields a :class:`CpuShare`
    of the hold."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield CpuShare(None, None)
        return
    gate_path, lock_path = _cpu_lock_files(tmp_path_factory)
    with open(lock_path, "a") as lock:
        _take(lock, mode, gate_path)
        yield CpuShare(lock, gate_path)


def _take(lock, mode: int, gate_path: Path) -> None:
    """Lock ``lock`` in ``mode`` through the gate (one taker at a time)."""
    with open(gate_path, "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, mode)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)


class CpuShare:
    """A test's hold of the run's CPU lock (:func:`_shares_the_cpu`): a shared one can be
    traded for the whole machine while the test measures real execution (:meth:`alone`)."""

    def __init__(self, lock, gate_path: Path | None):
        self._lock, self._gate_path = lock, gate_path

    @contextlib.contextmanager
    def alone(self):
        """Hold the CPUs alone for the block, then share them again. The shared hold is
        dropped before the gate is taken: two tests upgrading at once would otherwise
        each wait for the other's shared hold (flock converts by unlock, then lock)."""
        if self._lock is None:  # (not under xdist)
            yield
            return
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        _take(self._lock, fcntl.LOCK_EX, self._gate_path)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_SH)


@pytest.fixture(autouse=True)
def _shares_the_cpu(tmp_path_factory):
    """Every test holds the CPU lock shared, so that :func:`cpu_to_itself` can wait for
    the tests of the other workers to end; a test measuring real execution in its body
    takes the CPUs alone with this fixture's :meth:`CpuShare.alone`."""
    with _cpu_lock(tmp_path_factory, fcntl.LOCK_SH) as share:
        yield share


def cpu_to_itself(tmp_path_factory):
    """A context that holds the machine's CPUs alone (no test of another xdist worker
    runs meanwhile): for real executions whose measured times a test compares with the
    simulation. Used from module fixtures, which are set up before the test's shared
    lock is taken."""
    return _cpu_lock(tmp_path_factory, fcntl.LOCK_EX)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the ``trainsim`` CLI in-process; return (exit code, stdout, stderr)."""
    from trainsim.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(func, *args, **kwargs) -> str:
    """Call ``func``; it must raise a ValueError whose message is one line. Return it."""
    with pytest.raises(ValueError) as info:
        func(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def validate_for(plan, model, cluster, gpus: int) -> None:
    """``strategies.plan.validate_plan`` of ``plan`` against ``model``'s shape and
    ``cluster``'s size on ``gpus`` GPUs (what random-plan tests draw against).

    Raises:
        ValueError: as validate_plan."""
    from strategies.plan import validate_plan

    validate_plan(plan, num_layers=model.num_layers, num_heads=model.num_heads,
                  num_kv_heads=model.num_kv_heads,
                  num_experts=model.moe.num_experts if model.moe else 0, gpus=gpus,
                  cluster_gpus=cluster.max_nodes * cluster.gpus_per_node)


def tiny_models():
    """A small dense GPT and a small MoE model for fast step tests."""
    from strategies.model_spec import ModelSpec, MoESpec

    dense = ModelSpec(name="tiny", num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=8,
                      head_dim=64, ffn_hidden_size=2048, vocab_size=1024, mlp="gelu",
                      norm="layernorm", tied_embeddings=True)
    moe = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=512, num_heads=8,
                    num_kv_heads=4, head_dim=64, ffn_hidden_size=1024, vocab_size=1024,
                    moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=512))
    return dense, moe


def expect_one_line_error(call, *words: str) -> str:
    """``call()`` must raise a one-line ValueError containing every word; return it."""
    message = one_line_error(call)
    for word in words:
        assert word in message, message
    return message
