"""One rank of a measurement task: ``python -m validate.worker TASK.json``.

A task is a JSON object with ``task`` (``replay``, ``collectives`` or ``gemm``), ``out``
(the measurement directory), ``backend`` (``nccl`` or ``gloo``) and the task's options;
:mod:`validate.launch` starts the workers, or torchrun / srun does and the CLI calls
:func:`run_task` in-process.

Exit codes: 0 done, 2 a user error (one line ``error: ...`` on stderr), 1 a failure.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

from validate.launch import DistEnv, distributed_env
from validate.store import MeasurementStore, iteration_name

BACKENDS = ("nccl", "gloo")


def resolve_backend(backend: str) -> str:
    """``nccl`` or ``gloo``; ``auto`` is nccl where CUDA GPUs are visible, else gloo.

    Raises:
        ValueError: an unknown backend (one line).
    """
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend: {backend!r} is not valid; valid: auto, {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _device(backend: str, env: DistEnv):
    import torch

    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend: 'nccl' needs CUDA GPUs and none is visible; valid "
                             "here: gloo")
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _cpu_threads(env: DistEnv) -> int:
    """Threads per rank on CPU: the cores shared out among this host's ranks."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or env.world_size
    return max(1, (os.cpu_count() or 1) // max(1, local_world))


def _pin(env: DistEnv, threads: int) -> None:
    """Pin a CPU rank to its own cores: local rank i gets cores [i*t, (i+1)*t) modulo the
    cores this process may use. With more ranks than cores, ranks i and i + cores share
    one core (with the Megatron layout those are the pipeline stages of one replica, so
    replicas do not disturb each other). Unpinned ranks on an oversubscribed host
    migrate between cores and make every measurement noisier."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    start = env.local_rank * threads
    chosen = {cores[(start + k) % len(cores)] for k in range(threads)}
    os.sched_setaffinity(0, chosen)


def run_task(task: dict, env: DistEnv | None = None) -> None:
    """Run one rank of ``task`` (see the module docstring).

    Raises:
        ValueError: bad task fields or environment (one line).
    """
    import torch
    import torch.distributed as dist

    env = env or distributed_env()
    if env is None:
        raise ValueError("rank: not inside a job; give --nproc N, or start with torchrun/srun")
    backend = task.get("backend", "gloo")
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not valid; valid: {', '.join(BACKENDS)}")
    device = _device(backend, env)
    if device.type == "cpu":
        threads = int(task.get("threads") or _cpu_threads(env))
        _pin(env, threads)
        torch.set_num_threads(threads)
    timeout_s = float(task.get("timeout_s", 300.0))
    dist.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}",
                            rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    store = MeasurementStore(task["out"])
    try:
        from validate.env_info import environment

        store.write_meta("process", {"pid": os.getpid(), "task": task["task"],
                                     "started_unix_s": time.time(),
                                     "world_size": env.world_size}, rank=env.rank)
        store.write_meta("env", environment(backend, topology=env.local_rank == 0),
                         rank=env.rank)
        if task["task"] == "replay":
            _replay(task, env, device, store, timeout_s)
        elif task["task"] == "collectives":
            from validate.microbench import run_collectives

            run_collectives(task, env, device, store)
        elif task["task"] == "gemm":
            from validate.microbench import run_compute

            run_compute(task, env, device, store)
        else:
            raise ValueError(f"task: {task['task']!r} is not valid; valid: replay, "
                             "collectives, gemm")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _replay(task: dict, env: DistEnv, device, store: MeasurementStore, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from validate.kernels import substitutions
    from validate.program_io import load_program
    from validate.replay import GroupTable, RankReplayer

    program = load_program(store.root / "program.json")
    if program.world_size != env.world_size:
        raise ValueError(f"world_size: the program has {program.world_size} ranks but the job "
                         f"has {env.world_size}; valid: launch {program.world_size} processes")
    groups = GroupTable(program, task.get("backend", "gloo"))
    replayer = RankReplayer(program, env.rank, groups, device, timeout_s=timeout_s)
    warmup, iterations = int(task.get("warmup", 2)), int(task.get("iterations", 5))
    for _ in range(warmup):
        dist.barrier()
        replayer.run_iteration()
    # Resume: every rank starts at the first iteration some rank has not finished.
    done = torch.tensor([store.completed_iterations(env.rank)], dtype=torch.int64)
    if device.type == "cuda":
        done = done.to(device)
    dist.all_reduce(done, op=dist.ReduceOp.MIN)
    ops = replayer.ops
    notes = substitutions(ops)
    for iteration in range(int(done.item()), iterations):
        dist.barrier()
        started_unix_ns = time.time_ns()
        timings = replayer.run_iteration()
        spans = []
        for t in timings:
            op = ops[t.index]
            category = "compute" if hasattr(op, "flops") else "comm"
            kind = op.kind if hasattr(op, "kind") else type(op).__name__.replace("Op", "").lower()
            spans.append({"index": t.index, "stream": op.stream, "op": op.name, "kind": kind,
                          "category": category, "start_ns": t.start_ns, "end_ns": t.end_ns,
                          "bytes": getattr(op, "bytes", getattr(op, "size_bytes", 0)),
                          "flops": getattr(op, "flops", 0.0)})
        store.write(env.rank, "replay", iteration_name(iteration),
                    {"iteration": iteration, "started_unix_ns": started_unix_ns,
                     "device": str(device), "dtype_substitutions": notes, "spans": spans})


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the task file given as the only argument."""
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRAINSIM_LAUNCHER_PID", "").isdigit():  # started by launch_local
        from sim.child_process import die_with_parent

        die_with_parent(int(os.environ["TRAINSIM_LAUNCHER_PID"]))
    try:
        with open(argv[0], encoding="utf-8") as handle:
            task = json.load(handle)
        run_task(task)
    except ValueError as problem:
        rank = os.environ.get("RANK", "?")
        print(f"error: rank {rank}: {str(problem).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
