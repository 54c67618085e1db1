"""Microbenchmarks on real hardware: collectives (nccl-tests' columns), GEMMs, copies.

* :func:`run_collectives` -- each collective over every rank, for each size: ``warmup``
  calls, then ``iters`` calls back to back, timed together (like nccl-tests: the time
  is the average per call, the slowest rank's); one row per (op, size) written by rank 0
  to ``collectives/`` as soon as it is measured. Sizes follow nccl-tests: the total
  for all_gather and reduce_scatter; sendrecv sends to rank+1 and receives from rank-1.
* :func:`run_compute` -- on each rank's own device: GEMMs (square ``n x n x n``, or any
  ``b x m x n x k``: ``[b, m, k] @ [b, k, n]``) in a dtype, and copies of a size sweep
  (HBM / memory bandwidth: a copy of ``s`` bytes moves ``2 s`` bytes); one point per
  shape to ``compute/`` of that rank.

Both resume: a point already on disk is not measured again.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from sim.collective_bench import TYPE_BYTES, bus_factor
from validate.launch import DistEnv
from validate.store import MeasurementStore

MICROBENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast",
                  "sendrecv")
_TORCH_TYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
                "double": torch.float64, "int32": torch.int32, "int64": torch.int64}
_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _collective_call(kind: str, count: int, world: int, rank: int, dtype, device):
    """A callable issuing one collective of ``count`` elements (nccl-tests' count)."""
    if kind == "all_reduce":
        buf = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, async_op=True)
    if kind == "all_gather":
        inp = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count * world, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp, async_op=True)
    if kind == "reduce_scatter":
        inp = torch.ones(count * world, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, async_op=True)
    if kind == "alltoall":
        inp = torch.ones(count * world, dtype=dtype, device=device)
        out = torch.empty(count * world, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp, async_op=True)
    if kind == "broadcast":
        buf = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.broadcast(buf, 0, async_op=True)
    if kind == "sendrecv":
        send = torch.ones(count, dtype=dtype, device=device)
        recv = torch.empty(count, dtype=dtype, device=device)
        peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
        ops = [dist.P2POp(dist.isend, send, peer_to), dist.P2POp(dist.irecv, recv, peer_from)]
        return lambda: _Batch(dist.batch_isend_irecv(ops))
    raise ValueError(f"op: {kind!r} is not valid; valid: {', '.join(MICROBENCH_OPS)}")


class _Batch:
    """Several works waited as one."""

    def __init__(self, works) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


def _count(kind: str, size_bytes: int, world: int, type_bytes: int) -> int:
    """Elements per rank buffer as nccl-tests counts them (0: size too small)."""
    elements = size_bytes // type_bytes
    return elements // world if kind in ("all_gather", "reduce_scatter", "alltoall") else elements


def run_collectives(task: dict, env: DistEnv, device, store: MeasurementStore) -> None:
    """Sweep ``task['ops']`` over ``task['sizes']`` (bytes); see the module docstring.

    Raises:
        ValueError: an unknown op or type (one line).
    """
    world, rank = env.world_size, env.rank
    type_name = task.get("type", "float")
    if type_name not in _TORCH_TYPES:
        raise ValueError(f"type: {type_name!r} is not valid; valid: {', '.join(_TORCH_TYPES)}")
    dtype, type_bytes = _TORCH_TYPES[type_name], TYPE_BYTES[type_name]
    iters, warmup = int(task.get("iters", 20)), int(task.get("warmup", 5))
    nodes = int(task.get("nodes", 1))
    for kind in task["ops"]:
        for size in task["sizes"]:
            count = _count(kind, int(size), world, type_bytes)
            if count == 0:
                continue
            total = count * type_bytes * (world if kind in ("all_gather", "reduce_scatter",
                                                            "alltoall") else 1)
            name = f"{kind}-{total:015d}"
            flag = torch.tensor([1 if store.has(0, "collectives", name) else 0], device=device)
            dist.broadcast(flag, 0)  # rank 0's disk decides, so every rank skips alike
            if flag.item():
                continue
            call = _collective_call(kind, count, world, rank, dtype, device)
            for _ in range(warmup):
                call().wait()
            _sync(device)
            dist.barrier()
            start = time.perf_counter()
            works = [call() for _ in range(iters)]
            for work in works:
                work.wait()
            _sync(device)
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            time_s = float(elapsed.item())
            if rank == 0:
                algbw = total / time_s / 1e9
                store.write(0, "collectives", name, {
                    "op": kind, "size_bytes": total, "count": count, "type": type_name,
                    "redop": _REDOP.get(kind, "none"), "root": 0 if kind == "broadcast" else -1,
                    "time_us": time_s * 1e6, "algbw_GBps": algbw,
                    "busbw_GBps": algbw * bus_factor(kind, world), "ranks": world,
                    "nodes": nodes, "gpus_per_node": world // nodes, "iters": iters,
                    "device": str(device)})


def run_compute(task: dict, env: DistEnv, device, store: MeasurementStore) -> None:
    """GEMM and copy sweeps on this rank's device (see the module docstring).

    Raises:
        ValueError: an unknown dtype (one line).
    """
    from validate.kernels import torch_dtype

    dtype_name = task.get("dtype", "bf16")
    try:
        dtype = torch_dtype(dtype_name)
    except KeyError:
        raise ValueError(f"dtype: {dtype_name!r} is not valid; valid: fp32, bf16, fp16, "
                         "fp64") from None
    iters, warmup = int(task.get("iters", 10)), int(task.get("warmup", 3))
    shapes = [(1, n, n, n) for n in task.get("gemm_sizes", [])]
    shapes += [tuple(shape) for shape in task.get("gemm_shapes", [])]
    for bsz, m, n, k in shapes:
        name = f"matmul-{dtype_name}-{bsz}x{m}x{n}x{k}"
        if store.has(env.rank, "compute", name):
            continue
        a = torch.randn(bsz, m, k, device=device).to(dtype)
        b = torch.randn(bsz, k, n, device=device).to(dtype)
        out = torch.empty(bsz, m, n, device=device, dtype=dtype)
        time_s = _timed(lambda: torch.matmul(a, b, out=out), iters, warmup, device)
        flops = 2.0 * bsz * m * n * k
        store.write(env.rank, "compute", name, {
            "kind": "matmul", "dtype": dtype_name, "shape": [bsz, m, n, k], "work": flops,
            "time_s": time_s, "flops_per_s": flops / time_s, "device": str(device)})
    for size in task.get("copy_sizes", []):
        name = f"memcpy-{int(size):015d}"
        if store.has(env.rank, "compute", name):
            continue
        src = torch.ones(max(1, int(size) // 4), dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        time_s = _timed(lambda: dst.copy_(src), iters, warmup, device)
        moved = 2.0 * src.numel() * 4
        store.write(env.rank, "compute", name, {
            "kind": "memcpy", "dtype": "fp32", "work": moved, "time_s": time_s,
            "bytes_per_s": moved / time_s, "device": str(device)})


def _timed(call, iters: int, warmup: int, device) -> float:
    """Seconds per call: CUDA events around ``iters`` back-to-back calls on GPU,
    perf_counter on CPU."""
    for _ in range(warmup):
        call()
    _sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t) / iters
