"""Start the ranks of a measurement: N local processes, or join torchrun / Slurm.

* ``--nproc N`` (:func:`launch_local`): this process starts N workers itself (forked
  on Linux after importing torch once -- importing torch takes seconds per process on a
  small CI machine; elsewhere ``python -m validate.worker TASK.json``) with
  ``MASTER_ADDR=127.0.0.1``, a free
  ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, and watches them: when
  one dies, the others are stopped (they would wait for it until the timeout), and the
  exit code of the first failure is returned.
* started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) or by ``srun``
  (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``, with ``MASTER_ADDR``/
  ``MASTER_PORT`` exported by the batch script): :func:`distributed_env` reads them and
  the task runs in this process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _int_env(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}: {env[name]!r} is not an integer; valid: 0, 1, ...") from None


def distributed_env(env=None) -> DistEnv | None:
    """The job coordinates from torchrun's or Slurm's variables, or None outside a job.

    Raises:
        ValueError: variables present but inconsistent (one line naming the variable).
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
        local = _int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int_env(env, "SLURM_PROCID"), _int_env(env, "SLURM_NTASKS")
        local = _int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    else:
        return None
    if not 0 <= rank < world:
        raise ValueError(f"RANK: {rank} is not valid for WORLD_SIZE {world}; valid: 0..{world - 1}")
    if "MASTER_ADDR" not in env:
        raise ValueError("MASTER_ADDR: not set; export the address of rank 0's host "
                         "(the sbatch example does it)")
    port = _int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
    return DistEnv(rank, world, local, env["MASTER_ADDR"], port)


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_local(task: dict, nproc: int, *, grace_s: float = 5.0) -> int:
    """Run ``task`` on ``nproc`` local worker processes; return 0 or the first failure's
    exit code (a rank killed by a signal gives 128 + signal number).

    The task is written next to the measurements (``OUT/.launch-task.json``).

    Raises:
        ValueError: ``nproc`` < 1.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= MAX_NPROC:
        raise ValueError(f"nproc: {nproc!r} is not valid; valid: an integer from 1 to "
                         f"{MAX_NPROC}")
    out = Path(task["out"])
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_run_directory(out)  # held (and inherited by the ranks) until they end
    try:
        return _launch(task, nproc, out, grace_s)
    finally:
        os.close(lock)


#: Most local ranks one launcher starts (each is a torch process: ~300 MiB).
MAX_NPROC = 256
#: The lock file of a measurement directory.
LOCK_NAME = ".lock"


def lock_run_directory(directory: Path) -> int:
    """Take the directory's lock (``flock`` on ``DIR/.lock``) for this process and the
    ranks it forks; returns the lock's file descriptor (closing it, or the end of every
    process holding it, releases it). Two replays writing one directory would time each
    other's ranks on the same cores and record that as data.

    Raises:
        ValueError: another process holds the lock (names its pid).
    """
    import fcntl

    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"out: {str(directory)!r} is being written by another measurement "
                         f"(pid {holder}); wait for it to end, or give another directory") \
            from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode("ascii"))
    return fd


def _launch(task: dict, nproc: int, out: Path, grace_s: float) -> int:
    """:func:`launch_local` once the directory is locked."""
    task_path = out / ".launch-task.json"
    task_path.write_text(json.dumps(task, sort_keys=True))
    port = free_port()
    procs = []
    forking = hasattr(os, "fork") and sys.platform.startswith("linux")
    if forking:
        import torch  # noqa: F401  (imported once here; forked ranks inherit it)
        import multiprocessing

        context = multiprocessing.get_context("fork")
    for rank in range(nproc):
        threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        env = dict(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS=threads, MASTER_PORT=str(port),
                   RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
        if forking:
            proc = context.Process(target=_forked_rank,
                                   args=(str(task_path), env, os.getpid()),
                                   name=f"trainsim-rank{rank}")
            proc.start()
            procs.append(_Forked(proc))
        else:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "validate.worker", str(task_path)],
                env=dict(os.environ, **env, TRAINSIM_LAUNCHER_PID=str(os.getpid()))))
    failure = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                failure = bad[0] if bad[0] > 0 else 128 - bad[0]
                break
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    finally:
        _stop(procs, grace_s)
    return failure


def _forked_rank(task_path: str, env: dict, launcher_pid: int) -> None:
    """Body of a forked rank: die with the launcher (a killed launcher must not leave
    ranks running beside the next run), its environment, then the worker."""
    from sim.child_process import die_with_parent

    die_with_parent(launcher_pid)
    os.environ.update(env)
    from validate.worker import main

    main([task_path])


class _Forked:
    """A forked rank with the part of the Popen interface the launcher uses."""

    def __init__(self, process) -> None:
        self.process = process

    def poll(self) -> int | None:
        """Exit code (negative: killed by that signal), None while running."""
        return self.process.exitcode

    def send_signal(self, number: int) -> None:
        """Send a signal to the rank's pid."""
        if self.process.pid is not None and self.process.exitcode is None:
            os.kill(self.process.pid, number)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the rank to end."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired("trainsim-rank", timeout)
        return self.process.exitcode

    def kill(self) -> None:
        """SIGKILL the rank."""
        self.send_signal(signal.SIGKILL)


def _stop(procs: list, grace_s: float) -> None:
    """Terminate the workers this launcher started that still run, by pid."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
