"""Timelines: what ran where and when, simulated or measured.

A :class:`Timeline` is the simulator's output and also the schema real-GPU
measurements use, so both can be compared span by span. Each :class:`Span`
is one op on one rank's stream, with integer nanosecond start/end times.

Each span is stored as one plain tuple, so millions of spans stay cheap to
append and to export. Every export (``spans()``, ``to_dataframe()``,
``to_records()``, ``to_chrome_trace()``) uses the same deterministic order:
by ``(start_ns, rank, stream, op)``, then by the remaining fields, so the
order never depends on the order spans were added in.

The Chrome trace is in the Trace Event Format understood by
``chrome://tracing`` and https://ui.perfetto.dev: one process per rank
(``"rank N"``), one thread per stream, complete (``"X"``) events with
timestamps and durations in microseconds.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from sim.atomic_io import write_bytes_atomic
from strategies.ir import CollectiveOp, ComputeOp, SendOp

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Span", "Timeline", "COLUMNS", "record_op"]

#: Column order of :meth:`Timeline.to_dataframe` and keys of :meth:`Timeline.to_records`.
COLUMNS = (
    "rank",
    "stream",
    "op",
    "kind",
    "category",
    "start_ns",
    "end_ns",
    "duration_ns",
    "bytes",
    "flops",
    "op_id",
    "axis",
)

# Streams that get the first thread ids (in this order) in Chrome traces.
_PREFERRED_STREAMS = ("compute", "comm")


@dataclass(frozen=True, slots=True)
class Span:
    """One op executed on one rank's stream.

    Attributes:
        rank: global rank.
        stream: stream name, e.g. ``"compute"`` or ``"comm"``.
        op: op name (the IR op's ``name``).
        kind: compute kind, collective kind, or ``"send"``/``"recv"``.
        start_ns: start time in integer nanoseconds.
        end_ns: end time in integer nanoseconds (``>= start_ns``).
        bytes: bytes moved (HBM traffic or message size).
        flops: floating-point operations.
        category: coarse class for grouping, e.g. ``"compute"``, ``"comm"``.
        op_id: index of the op in its rank's Program list (-1 when unknown), so a
            simulated and a measured span of the same op meet by ``(rank, op_id)``.
        axis: parallelism a communication span serves (``tp``, ``cp``, ``ep``,
            ``pp``, ``dp``; ``""`` for compute or when unknown).

    Raises:
        ValueError: when rank or a time is not an integer, or ``end_ns <
            start_ns``. Integer-like values (numpy ints) become plain ints.
    """

    rank: int
    stream: str
    op: str
    kind: str
    start_ns: int
    end_ns: int
    bytes: int | float = 0
    flops: float = 0.0
    category: str = ""
    op_id: int = -1
    axis: str = ""

    def __post_init__(self) -> None:
        if (
            type(self.start_ns) is int
            and type(self.end_ns) is int
            and type(self.rank) is int
            and self.start_ns <= self.end_ns
        ):
            return
        try:
            start = operator.index(self.start_ns)
            end = operator.index(self.end_ns)
            rank = operator.index(self.rank)
        except TypeError:
            raise ValueError(
                f"span {self.op!r} on rank {self.rank!r}: rank, start_ns and end_ns must be integers "
                f"(got rank={self.rank!r}, start_ns={self.start_ns!r}, end_ns={self.end_ns!r}); "
                "round times to whole nanoseconds"
            ) from None
        if end < start:
            raise ValueError(
                f"span {self.op!r} on rank {rank} stream {self.stream!r}: end_ns={end} is before "
                f"start_ns={start}; end_ns must be >= start_ns"
            )
        # Normalise numpy integers etc. to plain ints (frozen: bypass __setattr__).
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "start_ns", start)
        object.__setattr__(self, "end_ns", end)

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns


def _plain_bytes(value: Any) -> int | float:
    """Return ``value`` as an int when it is integral, else as a float."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    value = float(value)
    return int(value) if value.is_integer() else value


def _jsonable(value: Any) -> Any:
    """Convert ``value`` into something ``json.dumps`` accepts (strings as a fallback)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building millions of small acyclic objects.

    Without this, exports of ~10^6 spans spend more than half their time in
    repeated collector passes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _as_int(value: Any, field: str, row: int) -> int:
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"row {row}: {field}={value!r} is not an integer; give whole nanoseconds/ranks")


class Timeline:
    """An append-only collection of :class:`Span` plus free-form ``metadata``.

    Each span is kept as a tuple laid out so that sorting the tuples orders
    them by ``(start_ns, rank, stream, op)``. :meth:`add` and :meth:`record`
    append in O(1); exports sort once and reuse that order until the next
    append.
    """

    __slots__ = ("metadata", "_rows", "_sorted")

    def __init__(self, spans: Iterable[Span] = (), *, metadata: Mapping[str, Any] | None = None) -> None:
        """Create a timeline holding ``spans`` (in any order) and a copy of ``metadata``."""
        self.metadata: dict[str, Any] = dict(metadata or {})
        # (start_ns, rank, stream, op, end_ns, kind, category, bytes, flops, op_id, axis)
        self._rows: list[tuple] = []
        self._sorted = True
        self.extend(spans)

    # ------------------------------------------------------------------ building

    def add(self, span: Span) -> None:
        """Append one span."""
        if not isinstance(span, Span):
            raise TypeError(f"Timeline.add takes a Span, got {type(span).__name__}")
        self._rows.append(
            (span.start_ns, span.rank, span.stream, span.op, span.end_ns, span.kind, span.category, span.bytes,
             span.flops, span.op_id, span.axis)
        )
        self._sorted = False

    def extend(self, spans: Iterable[Span]) -> None:
        """Append every span of ``spans``."""
        for span in spans:
            self.add(span)

    def record(
        self,
        rank: int,
        stream: str,
        op: str,
        kind: str,
        start_ns: int,
        end_ns: int,
        bytes: int | float = 0,
        flops: float = 0.0,
        category: str = "",
        op_id: int = -1,
        axis: str = "",
    ) -> None:
        """Append a span given field by field, without keeping a :class:`Span` object.

        Validated like :class:`Span` (integer rank and times, ``end_ns >=
        start_ns``); the fast path for simulators and trace parsers.
        """
        if type(start_ns) is not int or type(end_ns) is not int or type(rank) is not int or end_ns < start_ns:
            span = Span(rank, stream, op, kind, start_ns, end_ns, bytes, flops, category)  # validates or raises
            rank, start_ns, end_ns = span.rank, span.start_ns, span.end_ns
        self._rows.append((start_ns, rank, stream, op, end_ns, kind, category, bytes, flops, op_id,
                           axis))
        self._sorted = False

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Timeline({len(self)} spans, makespan_ns={self.makespan_ns()})"

    # ------------------------------------------------------------------ reading

    def _sorted_rows(self) -> list[tuple]:
        if not self._sorted:
            self._rows.sort()
            self._sorted = True
        return self._rows

    def spans(self) -> Iterator[Span]:
        """Iterate over the spans sorted by ``(start_ns, rank, stream, op)``."""
        for start, rank, stream, op, end, kind, category, nbytes, flops, op_id, axis in \
                self._sorted_rows():
            yield Span(rank, stream, op, kind, start, end, nbytes, flops, category, op_id, axis)

    __iter__ = spans

    def makespan_ns(self) -> int:
        """Latest end minus earliest start over all spans; 0 when empty."""
        rows = self._rows
        if not rows:
            return 0
        return max(row[4] for row in rows) - min(row[0] for row in rows)

    def end_ns_by_rank(self) -> dict[int, int]:
        """``{rank: latest end_ns of its spans}``, ranks ascending."""
        ends: dict[int, int] = {}
        for row in self._rows:
            rank, end = row[1], row[4]
            if rank not in ends or end > ends[rank]:
                ends[rank] = end
        return dict(sorted(ends.items()))

    def busy_ns(self, rank: int, stream: str | None = None) -> int:
        """Time ``rank``'s ``stream`` was busy: the length of the union of its spans.

        Overlapping spans are counted once. With ``stream=None`` the union is
        over all streams of the rank (time the rank was doing anything).
        """
        total = 0
        cur_start = cur_end = None
        for row in self._sorted_rows():  # sorted by start_ns first
            if row[1] != rank or (stream is not None and row[2] != stream):
                continue
            s, e = row[0], row[4]
            if cur_end is None or s > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = s, e
            elif e > cur_end:
                cur_end = e
        if cur_end is not None:
            total += cur_end - cur_start
        return total

    def columns(self, *names: str) -> dict[str, "np.ndarray"]:
        """Chosen columns of :data:`COLUMNS` as numpy arrays (ints for ``rank``,
        ``start_ns``, ``end_ns``, ``op_id``; floats for ``bytes``, ``flops``; object
        arrays of text otherwise), in append order: for order-free reductions (the
        step breakdown) that need no DataFrame."""
        import numpy as np

        where = {"start_ns": 0, "rank": 1, "stream": 2, "op": 3, "end_ns": 4, "kind": 5,
                 "category": 6, "bytes": 7, "flops": 8, "op_id": 9, "axis": 10}
        types = {"start_ns": np.int64, "rank": np.int64, "end_ns": np.int64,
                 "op_id": np.int64, "bytes": np.float64, "flops": np.float64}
        out = {}
        for name in names:
            if name not in where:
                raise ValueError(f"columns: {name!r} is not a column; valid: "
                                 f"{', '.join(where)}")
            index = where[name]
            values = [row[index] for row in self._rows]
            if name in types:
                out[name] = np.array(values, dtype=types[name])
            else:
                array = np.empty(len(values), dtype=object)
                array[:] = values
                out[name] = array
        return out

    # ------------------------------------------------------------------ tables

    @_gc_paused()
    def to_dataframe(self) -> "pd.DataFrame":
        """Spans as a DataFrame with columns :data:`COLUMNS`, sorted, index 0..n-1.

        ``rank``/``start_ns``/``end_ns``/``duration_ns`` are int64, ``bytes``
        and ``flops`` float64, the rest strings (object dtype). ``metadata``
        is copied to ``df.attrs["metadata"]``.
        """
        import numpy as np
        import pandas as pd

        rows = self._sorted_rows()
        cols = list(zip(*rows)) if rows else [()] * 11
        start = np.array(cols[0], dtype=np.int64)
        end = np.array(cols[4], dtype=np.int64)

        def text(values: tuple) -> Any:
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out

        df = pd.DataFrame(
            {
                "rank": np.array(cols[1], dtype=np.int64),
                "stream": text(cols[2]),
                "op": text(cols[3]),
                "kind": text(cols[5]),
                "category": text(cols[6]),
                "start_ns": start,
                "end_ns": end,
                "duration_ns": end - start,
                "bytes": np.array(cols[7], dtype=np.float64),
                "flops": np.array(cols[8], dtype=np.float64),
                "op_id": np.array(cols[9], dtype=np.int64),
                "axis": text(cols[10]),
            },
            columns=list(COLUMNS),
        )
        df.attrs["metadata"] = dict(self.metadata)
        return df

    @classmethod
    @_gc_paused()
    def from_dataframe(cls, df: "pd.DataFrame", *, metadata: Mapping[str, Any] | None = None) -> "Timeline":
        """Build a timeline from a DataFrame shaped like :meth:`to_dataframe`'s.

        ``category``, ``bytes``, ``flops``, ``op_id``, ``axis`` and ``duration_ns`` may be absent;
        when ``duration_ns`` is present it must equal ``end_ns - start_ns``.
        Integral ``bytes`` come back as ints. ``metadata`` defaults to
        ``df.attrs.get("metadata", {})``.

        Raises:
            ValueError: on a missing column, a non-integer time or rank, or an
                inconsistent ``duration_ns``.
        """
        required = ("rank", "stream", "op", "kind", "start_ns", "end_ns")
        missing = [c for c in required if c not in df.columns]
        if missing:
            raise ValueError(
                f"DataFrame lacks column(s) {missing}; a timeline needs {list(required)} "
                "and optionally category, bytes, flops, duration_ns"
            )
        n = len(df)
        rank = df["rank"].tolist()
        start = df["start_ns"].tolist()
        end = df["end_ns"].tolist()
        stream = df["stream"].tolist()
        op = df["op"].tolist()
        kind = df["kind"].tolist()
        category = df["category"].fillna("").tolist() if "category" in df.columns else [""] * n
        nbytes = df["bytes"].tolist() if "bytes" in df.columns else [0] * n
        flops = df["flops"].tolist() if "flops" in df.columns else [0.0] * n
        op_ids = df["op_id"].tolist() if "op_id" in df.columns else [-1] * n
        axes = df["axis"].fillna("").tolist() if "axis" in df.columns else [""] * n
        duration = df["duration_ns"].tolist() if "duration_ns" in df.columns else None
        if metadata is None:
            metadata = df.attrs.get("metadata", {})
        timeline = cls(metadata=metadata)
        record = timeline.record
        for i in range(n):
            s, e = _as_int(start[i], "start_ns", i), _as_int(end[i], "end_ns", i)
            if duration is not None and duration[i] != e - s:
                raise ValueError(
                    f"row {i} (op {op[i]!r}, rank {rank[i]}): duration_ns={duration[i]} but end_ns - start_ns = "
                    f"{e - s}; duration_ns must equal end_ns - start_ns"
                )
            record(
                _as_int(rank[i], "rank", i),
                str(stream[i]),
                str(op[i]),
                str(kind[i]),
                s,
                e,
                _plain_bytes(nbytes[i]),
                float(flops[i]),
                str(category[i]),
                _as_int(op_ids[i], "op_id", i),
                str(axes[i]),
            )
        return timeline

    @_gc_paused()
    def to_records(self) -> list[dict[str, Any]]:
        """Spans as a sorted list of JSON-ready dicts keyed by :data:`COLUMNS`."""
        return [
            {
                "rank": rank,
                "stream": stream,
                "op": op,
                "kind": kind,
                "category": category,
                "start_ns": start,
                "end_ns": end,
                "duration_ns": end - start,
                "bytes": nbytes,
                "flops": flops,
                "op_id": op_id,
                "axis": axis,
            }
            for start, rank, stream, op, end, kind, category, nbytes, flops, op_id, axis
            in self._sorted_rows()
        ]

    @classmethod
    @_gc_paused()
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], *, metadata: Mapping[str, Any] | None = None
    ) -> "Timeline":
        """Build a timeline from dicts like :meth:`to_records`'s.

        ``category``, ``bytes``, ``flops``, ``op_id``, ``axis`` and ``duration_ns`` are optional;
        a given ``duration_ns`` must equal ``end_ns - start_ns``.

        Raises:
            ValueError: on a missing field, a non-integer time or rank, or an
                inconsistent ``duration_ns``.
        """
        timeline = cls(metadata=metadata)
        record = timeline.record
        for i, rec in enumerate(records):
            try:
                rank = _as_int(rec["rank"], "rank", i)
                stream, op, kind = str(rec["stream"]), str(rec["op"]), str(rec["kind"])
                start = _as_int(rec["start_ns"], "start_ns", i)
                end = _as_int(rec["end_ns"], "end_ns", i)
            except KeyError as exc:
                raise ValueError(
                    f"record {i} lacks field {exc.args[0]!r}; a span record needs rank, stream, op, kind, "
                    "start_ns, end_ns"
                ) from None
            duration = rec.get("duration_ns")
            if duration is not None and duration != end - start:
                raise ValueError(
                    f"record {i} (op {op!r}, rank {rank}): duration_ns={duration} but end_ns - "
                    f"start_ns = {end - start}; duration_ns must equal end_ns - start_ns"
                )
            record(
                rank,
                stream,
                op,
                kind,
                start,
                end,
                _plain_bytes(rec.get("bytes", 0)),
                float(rec.get("flops", 0.0)),
                str(rec.get("category", "") or ""),
                _as_int(rec.get("op_id", -1), "op_id", i),
                str(rec.get("axis", "") or ""),
            )
        return timeline

    # ------------------------------------------------------------------ traces

    def _stream_tids(self) -> dict[str, int]:
        names = {row[2] for row in self._rows}
        ordered = [s for s in _PREFERRED_STREAMS if s in names]
        ordered += sorted(names.difference(_PREFERRED_STREAMS))
        return {name: tid for tid, name in enumerate(ordered, start=1)}

    @_gc_paused()
    def to_chrome_trace(self, *, process_of: Callable[[int], int] | None = None,
                        process_label: str = "node") -> dict[str, Any]:
        """The timeline in Chrome/Perfetto Trace Event Format.

        Returns ``{"traceEvents": [...], "displayTimeUnit": "ns",
        "otherData": metadata}``. Metadata events (``"ph": "M"``) come first,
        then one complete event (``"ph": "X"``) per span in sorted order:
        ``ts``/``dur`` in microseconds (floats), ``name`` = op, ``cat`` =
        category or kind, ``args`` = ``{"bytes", "flops"}``.

        By default a process is a rank (``pid`` = rank, named ``"rank N"``) and
        a thread is a stream (integer ``tid``, the same for a stream name on
        every rank: ``compute``, then ``comm``, then the rest alphabetically).
        With ``process_of`` (e.g. rank -> node), a process groups several ranks
        (named ``"<process_label> P"``) and each (rank, stream) is a thread
        named ``"rank R <stream>"``.
        """
        tids = self._stream_tids()
        rows = self._sorted_rows()
        grouped = process_of is not None
        pid_of = process_of if grouped else (lambda rank: rank)
        width = len(tids) + 1

        def tid_of(rank: int, stream: str) -> int:
            return rank * width + tids[stream] if grouped else tids[stream]

        events: list[dict[str, Any]] = []
        for pid in sorted({pid_of(row[1]) for row in rows}):
            name = f"{process_label} {pid}" if grouped else f"rank {pid}"
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        for rank, stream in sorted({(row[1], row[2]) for row in rows},
                                   key=lambda rs: (rs[0], tids[rs[1]])):
            tid = tid_of(rank, stream)
            label = f"rank {rank} {stream}" if grouped else stream
            events.append({"ph": "M", "name": "thread_name", "pid": pid_of(rank), "tid": tid,
                           "args": {"name": label}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of(rank),
                           "tid": tid, "args": {"sort_index": tid}})
        plain = (int, float)
        events.extend(
            {
                "name": op,
                "cat": category or kind,
                "ph": "X",
                "ts": start / 1000.0,
                "dur": (end - start) / 1000.0,
                "pid": pid_of(rank),
                "tid": tid_of(rank, stream),
                "args": {
                    "bytes": nbytes if type(nbytes) in plain and math.isfinite(nbytes) else _jsonable(nbytes),
                    "flops": flops if type(flops) in plain and math.isfinite(flops) else _jsonable(flops),
                    **({"op_id": op_id} if op_id >= 0 else {}),
                    **({"axis": axis} if axis else {}),
                },
            }
            for start, rank, stream, op, end, kind, category, nbytes, flops, op_id, axis in rows
        )
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": _jsonable(self.metadata)}

    def write_chrome_trace(self, path: str | os.PathLike[str], *,
                           process_of: Callable[[int], int] | None = None,
                           process_label: str = "node") -> Path:
        """Write :meth:`to_chrome_trace` as JSON to ``path`` atomically; return the path.

        Readers see either the old file or the complete new one
        (:func:`sim.atomic_io.write_bytes_atomic`).
        """
        with _gc_paused():
            trace = self.to_chrome_trace(process_of=process_of, process_label=process_label)
            data = json.dumps(trace, separators=(",", ":")).encode("utf-8")
        return write_bytes_atomic(path, data)


def record_op(timeline: Timeline, rank: int, op_id: int, op, start_ns: int, end_ns: int) -> None:
    """Append the span of Program op ``op`` (index ``op_id`` in its rank's list) that ran
    from ``start_ns`` to ``end_ns``: what the engine records, and what a measured
    replay records for the same op, so the two meet by ``(rank, op_id)``."""
    if isinstance(op, ComputeOp):
        timeline.record(rank, op.stream, op.name, op.kind, start_ns, end_ns, op.bytes,
                        op.flops, "compute", op_id)
        return
    kind = op.kind if isinstance(op, CollectiveOp) else (
        "send" if isinstance(op, SendOp) else "recv")
    timeline.record(rank, op.stream, op.name, kind, start_ns, end_ns, op.size_bytes, 0.0,
                    "comm", op_id, op.axis)
