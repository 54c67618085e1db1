"""Execute one rank's part of a Program with torch.distributed and time every op.

Execution follows the IR's rules (strategies/ir.py), the same ones the simulator's
engine uses: every stream of the rank is a thread that walks its ops in list order;
an op first waits for its ``deps`` (earlier ops of the rank, any stream); collectives
meet their group, send/recv their peer. On GPU each stream is its own CUDA stream
(communication overlaps compute as simulated) and cross-stream deps become
``wait_event``; on CPU the threads run the ops directly.

Process groups: one per (collective group, stream) and one per directed send/recv pair,
created in the same order on every rank, so that ops issued by one stream thread are
matched in issue order on every member (streams never share a communicator).

Timing: CUDA events around each op on GPU (relative to an event recorded after the
iteration's barrier), ``time.perf_counter_ns`` on CPU (relative to the barrier exit).
A communication span starts when this rank *reached* the op, so it includes the wait
for peers; :mod:`validate.spans` recovers the data-movement time from the last arrival.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from strategies.ir import CollectiveOp, ComputeOp, Program, RecvOp, SendOp
from validate.kernels import BufferPool, make_kernel, torch_dtype

#: Seconds a stream thread waits for a dependency before giving up.
DEP_POLL_S = 0.2


class GroupTable:
    """Process groups of a Program, created identically on every rank.

    Args:
        program: the full Program (every rank listed).
        backend: ``nccl`` or ``gloo``.

    Raises:
        ValueError: when members of one collective issue it on different streams
            (they could not share a communicator).
    """

    def __init__(self, program: Program, backend: str) -> None:
        streams_of_key: dict[str, set[str]] = {}
        collective_keys: set[tuple[tuple[int, ...], str]] = set()
        pairs: set[tuple[int, int]] = set()
        for rank in program.ranks():
            for op in program.ops_by_rank[rank]:
                if isinstance(op, CollectiveOp):
                    streams_of_key.setdefault(op.key, set()).add(op.stream)
                    collective_keys.add((tuple(op.group), op.stream))
                elif isinstance(op, SendOp):
                    pairs.add((rank, op.peer))
                elif isinstance(op, RecvOp):
                    pairs.add((op.peer, rank))
        for key, streams in streams_of_key.items():
            if len(streams) > 1:
                raise ValueError(f"program: collective {key!r} is issued on streams "
                                 f"{sorted(streams)} by different members; valid: one stream")
        self.collective: dict[tuple[tuple[int, ...], str], object] = {}
        self.pair: dict[tuple[int, int], object] = {}
        for group, stream in sorted(collective_keys):
            self.collective[(group, stream)] = dist.new_group(list(group), backend=backend)
        for src, dst in sorted(pairs):
            self.pair[(src, dst)] = dist.new_group(sorted((src, dst)), backend=backend)


def _tag(text: str) -> int:
    """A stable non-negative int tag for a send/recv tag string."""
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _elements(size_bytes: int, dtype: torch.dtype) -> int:
    return max(1, int(size_bytes) // torch.tensor([], dtype=dtype).element_size())


def make_comm(op, rank: int, groups: GroupTable, pool: BufferPool) -> Callable[[], object]:
    """A callable issuing a communication op asynchronously; it returns the work
    handles to wait on (a list)."""
    if isinstance(op, (SendOp, RecvOp)):
        dtype = torch.float32
        buf = pool.get(f"p2p:{op.name}", (_elements(op.size_bytes, dtype),), dtype)
        if isinstance(op, SendOp):
            group = groups.pair[(rank, op.peer)]
            return lambda: [dist.isend(buf, op.peer, group=group, tag=_tag(op.tag))]
        group = groups.pair[(op.peer, rank)]
        return lambda: [dist.irecv(buf, op.peer, group=group, tag=_tag(op.tag))]
    group = groups.collective[(tuple(op.group), op.stream)]
    dtype = torch_dtype(op.dtype) if op.dtype in ("fp32", "bf16", "fp16", "fp64", "fp8") \
        else torch.float32
    n = len(op.group)
    size = _elements(op.size_bytes, dtype)
    per_rank = max(1, size // n)
    kind = op.kind
    if kind == "all_reduce":
        buf = pool.get("ar", (size,), dtype)
        return lambda: [dist.all_reduce(buf, group=group, async_op=True)]
    if kind == "all_gather":
        out = pool.get("ag_out", (per_rank * n,), dtype)
        inp = pool.get("ag_in", (per_rank,), dtype)
        return lambda: [dist.all_gather_into_tensor(out, inp, group=group, async_op=True)]
    if kind == "reduce_scatter":
        inp = pool.get("rs_in", (per_rank * n,), dtype)
        out = pool.get("rs_out", (per_rank,), dtype)
        return lambda: [dist.reduce_scatter_tensor(out, inp, group=group, async_op=True)]
    if kind == "alltoall":
        inp = pool.get("a2a_in", (per_rank * n,), dtype)
        out = pool.get("a2a_out", (per_rank * n,), dtype)
        return lambda: [dist.all_to_all_single(out, inp, group=group, async_op=True)]
    if kind in ("broadcast", "reduce"):
        buf = pool.get(kind, (size,), dtype)
        root = op.group[0] if op.root is None else op.root
        if kind == "broadcast":
            return lambda: [dist.broadcast(buf, root, group=group, async_op=True)]
        return lambda: [dist.reduce(buf, root, group=group, async_op=True)]
    if kind == "sendrecv":  # ring exchange: send to the next member, receive from the previous
        position = op.group.index(rank)
        nxt, prev = op.group[(position + 1) % n], op.group[(position - 1) % n]
        send = pool.get("sr_send", (size,), dtype)
        recv = pool.get("sr_recv", (size,), dtype)
        return lambda: [dist.isend(send, nxt, group=group), dist.irecv(recv, prev, group=group)]
    raise ValueError(f"op {op.name!r} kind: {kind!r} cannot be replayed")


@dataclass
class OpTiming:
    """Measured interval of one op of this rank (ns since the iteration's reference)."""

    index: int
    start_ns: int
    end_ns: int


class RankReplayer:
    """Replays the ops of one rank, one iteration per :meth:`run_iteration` call.

    Args:
        program: the full Program.
        rank: this process's global rank.
        groups: the Program's process groups.
        device: ``cuda:N`` or ``cpu``.
        timeout_s: give up on a dependency or a peer after this long.
    """

    def __init__(self, program: Program, rank: int, groups: GroupTable,
                 device: torch.device, timeout_s: float = 300.0) -> None:
        self.ops = tuple(program.ops_by_rank.get(rank, ()))
        self.rank = rank
        self.device = device
        self.cuda = device.type == "cuda"
        self.timeout_s = timeout_s
        pool = BufferPool(device)
        self.calls: list[Callable] = []
        for op in self.ops:
            if isinstance(op, ComputeOp):
                self.calls.append(make_kernel(op, pool))
            else:
                self.calls.append(make_comm(op, rank, groups, pool))
        self.streams: dict[str, list[int]] = {}
        for index, op in enumerate(self.ops):
            self.streams.setdefault(op.stream, []).append(index)
        self.cuda_streams = ({name: torch.cuda.Stream(device=device) for name in self.streams}
                             if self.cuda else {})

    def run_iteration(self) -> list[OpTiming]:
        """Run every op once, all streams concurrently; return their timings by index.

        Raises:
            RuntimeError: an op failed on some stream (the first error), or a dependency
                did not finish within ``timeout_s``.
        """
        n = len(self.ops)
        issued = [threading.Event() for _ in range(n)]
        abort = threading.Event()
        errors: list[BaseException] = []
        host_times: list[tuple[int, int] | None] = [None] * n
        events: list[tuple | None] = [None] * n
        if self.cuda:
            torch.cuda.synchronize(self.device)
            reference = torch.cuda.Event(enable_timing=True)
            reference.record(torch.cuda.current_stream(self.device))
        else:
            reference = None
        t0 = time.perf_counter_ns()

        def wait_deps(index: int) -> None:
            for dep in self.ops[index].deps:
                deadline = time.monotonic() + self.timeout_s
                while not issued[dep].wait(DEP_POLL_S):
                    if abort.is_set():
                        raise _Aborted()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"rank {self.rank}: op {self.ops[index].name!r} "
                                           f"waited over {self.timeout_s:g} s for op {dep}")
                if self.cuda:
                    torch.cuda.current_stream(self.device).wait_event(events[dep][1])

        def walk(stream: str, indices: list[int]) -> None:
            try:
                if self.cuda:
                    cuda_stream = self.cuda_streams[stream]
                    cuda_stream.wait_event(reference)
                    with torch.cuda.stream(cuda_stream):
                        for index in indices:
                            wait_deps(index)
                            start = torch.cuda.Event(enable_timing=True)
                            end = torch.cuda.Event(enable_timing=True)
                            start.record(cuda_stream)
                            handles = self.calls[index]()
                            for handle in handles or ():
                                handle.wait()  # NCCL: the stream waits, the host does not
                            end.record(cuda_stream)
                            events[index] = (start, end)
                            issued[index].set()
                else:
                    for index in indices:
                        wait_deps(index)
                        start_ns = time.perf_counter_ns() - t0
                        handles = self.calls[index]()
                        for handle in handles or ():
                            handle.wait()
                        host_times[index] = (start_ns, time.perf_counter_ns() - t0)
                        issued[index].set()
            except _Aborted:
                pass
            except BaseException as err:  # noqa: BLE001 - re-raised by the caller
                errors.append(err)
                abort.set()

        threads = [threading.Thread(target=walk, args=(name, indices), daemon=True,
                                    name=f"rank{self.rank}.{name}")
                   for name, indices in sorted(self.streams.items())]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(f"rank {self.rank}: {errors[0]}") from errors[0]
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [OpTiming(i, int(round(reference.elapsed_time(s) * 1e6)),
                             int(round(reference.elapsed_time(e) * 1e6)))
                    for i, (s, e) in enumerate(events)]
        return [OpTiming(i, s, e) for i, (s, e) in enumerate(host_times)]


class _Aborted(Exception):
    """Another stream of this rank failed; stop quietly."""
