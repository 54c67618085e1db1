"""Execute one rank's part of a Program with torch.distributed and time every op.

Execution follows the IR's rules (strategies/ir.py), the same ones the simulator's
engine uses: an op waits for its ``deps`` (earlier ops of the rank, any stream);
collectives meet their group, send/recv their peer. On GPU every stream of the rank is
a host thread issuing its ops in list order onto its own CUDA stream (communication
overlaps compute as simulated; cross-stream deps become ``wait_event``). On CPU one
thread issues all ops in list order, communication asynchronously
(:meth:`RankReplayer._run_inline`).

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

        The stream threads persist across iterations (a new thread would start a new
        OpenMP team with the default thread count, which oversubscribes a CPU host).

        Raises:
            RuntimeError: an op failed on some stream (the first error), or a dependency
                did not finish within ``timeout_s``.
        """
        if not self.cuda:
            return self._run_inline()
        if not hasattr(self, "_threads"):
            self._start_threads()
        n = len(self.ops)
        self._issued = [threading.Event() for _ in range(n)]
        self._abort = threading.Event()
        self._errors = []
        self._host_times = [None] * n
        self._events = [None] * n
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._reference = torch.cuda.Event(enable_timing=True)
            self._reference.record(torch.cuda.current_stream(self.device))
        self._t0 = time.perf_counter_ns()
        self._go.wait()      # release the stream threads
        self._done.wait()    # and wait until every one has walked its ops
        if self._errors:
            raise RuntimeError(f"rank {self.rank}: {self._errors[0]}") from self._errors[0]
        if self.cuda:
            torch.cuda.synchronize(self.device)
            reference = self._reference
            return [OpTiming(i, int(round(reference.elapsed_time(s) * 1e6)),
                             int(round(reference.elapsed_time(e) * 1e6)))
                    for i, (s, e) in enumerate(self._events)]
        return [OpTiming(i, s, e) for i, (s, e) in enumerate(self._host_times)]

    def _run_inline(self) -> list[OpTiming]:
        """CPU: issue the rank's ops from this thread in list order.

        Compute runs here; communication is issued asynchronously (gloo works run on
        gloo's own threads) and overlaps later ops as a GPU comm stream would; an op
        waits only for the handles of its ``deps``, and a communication op on the stream
        of compute ops is waited at once (stream order). A second thread per stream
        would add a cross-thread wake-up to every dependency, which costs milliseconds
        on an oversubscribed CPU host. Communication end times: the work's future
        callback when the backend has one (collectives), else when this thread waits for
        it (gloo's send/recv report no completion before ``wait``): a recv is waited by
        the op that needs its data, so its end is the arrival or that moment; a send ends
        at the end of the iteration at the latest. The comparison uses the receiver's end
        (validate.spans.comm_durations), never a send's.
        """
        t0 = time.perf_counter_ns()
        times: list[list[int] | None] = [None] * len(self.ops)
        pending: dict[int, list] = {}
        compute_streams = {op.stream for op in self.ops if isinstance(op, ComputeOp)}

        def finish(index: int, block: bool) -> bool:
            handles = pending[index]
            if not block and not all(h.is_completed() for h in handles):
                return False
            for handle in handles:
                handle.wait()
            now = time.perf_counter_ns() - t0
            if times[index][1] < 0 or times[index][1] > now:
                times[index][1] = now
            del pending[index]
            return True

        for index, op in enumerate(self.ops):
            for dep in op.deps:
                if dep in pending:
                    finish(dep, block=True)
            for other in list(pending):
                finish(other, block=False)
            start = time.perf_counter_ns() - t0
            if isinstance(op, ComputeOp):
                self.calls[index]()
                times[index] = [start, time.perf_counter_ns() - t0]
                continue
            times[index] = [start, -1]
            handles = list(self.calls[index]() or ())
            for handle in handles:
                try:
                    handle.get_future().add_done_callback(
                        lambda _f, i=index: _set_end(times[i], time.perf_counter_ns() - t0))
                except RuntimeError:  # gloo send/recv works have no future
                    pass
            pending[index] = handles
            if op.stream in compute_streams:
                finish(index, block=True)
        for index in list(pending):
            finish(index, block=True)
        return [OpTiming(i, s, e) for i, (s, e) in enumerate(times)]

    def _start_threads(self) -> None:
        parties = len(self.streams) + 1
        self._go = threading.Barrier(parties)
        self._done = threading.Barrier(parties)
        threads = torch.get_num_threads()
        self._threads = [threading.Thread(target=self._loop, args=(name, indices, threads),
                                          daemon=True, name=f"rank{self.rank}.{name}")
                         for name, indices in sorted(self.streams.items())]
        for thread in self._threads:
            thread.start()

    def _loop(self, stream: str, indices: list[int], threads: int) -> None:
        torch.set_num_threads(threads)  # per thread: OpenMP's count is thread-local
        if self.cuda:
            torch.cuda.set_device(self.device)  # the current device is per thread too
        while True:
            self._go.wait()
            try:
                self._walk(stream, indices)
            except _Aborted:
                pass
            except BaseException as err:  # noqa: BLE001 - re-raised by run_iteration
                self._errors.append(err)
                self._abort.set()
            self._done.wait()

    def _wait_deps(self, index: int) -> None:
        for dep in self.ops[index].deps:
            deadline = time.monotonic() + self.timeout_s
            while not self._issued[dep].wait(DEP_POLL_S):
                if self._abort.is_set():
                    raise _Aborted()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank {self.rank}: op {self.ops[index].name!r} "
                                       f"waited over {self.timeout_s:g} s for op {dep}")
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self._events[dep][1])

    def _walk(self, stream: str, indices: list[int]) -> None:
        if self.cuda:
            cuda_stream = self.cuda_streams[stream]
            cuda_stream.wait_event(self._reference)
            with torch.cuda.stream(cuda_stream):
                for index in indices:
                    self._wait_deps(index)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record(cuda_stream)
                    for handle in self.calls[index]() or ():
                        handle.wait()  # NCCL: the stream waits, the host does not
                    end.record(cuda_stream)
                    self._events[index] = (start, end)
                    self._issued[index].set()
            return
        t0 = self._t0
        for index in indices:
            self._wait_deps(index)
            start_ns = time.perf_counter_ns() - t0
            for handle in self.calls[index]() or ():
                handle.wait()
            self._host_times[index] = (start_ns, time.perf_counter_ns() - t0)
            self._issued[index].set()


def _set_end(times: list[int], now: int) -> None:
    """Future callback: the first completion time wins."""
    if times[1] < 0 or times[1] > now:
        times[1] = now


class _Aborted(Exception):
    """Another stream of this rank failed; stop quietly."""
