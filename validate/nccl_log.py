"""nccl-tests results: read their standard stdout, the shared CSV tables, and print
rows in the same layout.

The stdout layout (NVIDIA/nccl-tests, src/common.cu): ``#``-comment header lines,
among them one ``#  Rank  N Group  G Pid  P on HOST device D [BUS] NAME`` line per rank,
the column header (``size count type redop root time algbw busbw #wrong`` twice, out-of-
place then in-place; ``root`` missing in old versions), then one data line per size.
``time`` is in microseconds, ``algbw``/``busbw`` in GB/s (1e9 bytes/s).

The collective is taken from a ``# Collective test starting: all_reduce_perf`` line when
present, else from the file name (``all_reduce_perf.log``, ``allgather.out``, ...), else
from the caller.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.collective_bench import bus_factor
from strategies.ir import COLLECTIVE_KINDS

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                   r"\[[^\]]*\]\s+(.*)$")
_STARTING = re.compile(r"Collective test starting:\s*(\w+)")
_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather",
            "reducescatter": "reduce_scatter", "alltoall": "alltoall",
            "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv"}


@dataclass
class NcclSeries:
    """One nccl-tests run: a collective over ``nodes x gpus_per_node`` ranks.

    Attributes:
        kind: collective kind (strategies.ir.COLLECTIVE_KINDS).
        nodes, gpus_per_node: job shape.
        sizes_bytes, times_us: out-of-place size and time of each line.
        label: where it came from (file, source id).
        gpu: GPU name, if printed.
        nccl_version: if known.
    """

    kind: str
    nodes: int
    gpus_per_node: int
    sizes_bytes: list[int] = field(default_factory=list)
    times_us: list[float] = field(default_factory=list)
    label: str = ""
    gpu: str = ""
    nccl_version: str = ""

    @property
    def ranks(self) -> int:
        """Ranks of the run."""
        return self.nodes * self.gpus_per_node

    def busbw_GBps(self) -> list[float]:
        """busbw of each line, GB/s (1e9 B/s), recomputed from size and time."""
        factor = bus_factor(self.kind, self.ranks)
        return [s / (t * 1e-6) / 1e9 * factor for s, t in zip(self.sizes_bytes, self.times_us)]


def _kind_from_text(text: str) -> str | None:
    flat = re.sub(r"[^a-z]", "", text.lower())
    for alias in sorted(_ALIASES, key=len, reverse=True):
        if alias in flat:
            return _ALIASES[alias]
    return None


def parse_nccl_tests(text: str, *, label: str = "log", kind: str | None = None) -> NcclSeries:
    """Parse one nccl-tests stdout.

    Raises:
        ValueError: no data lines, no rank lines, or the collective cannot be told
            (one line naming ``label``).
    """
    ranks: dict[int, tuple[str, str]] = {}
    found_kind = None
    sizes, times = [], []
    has_root = True
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if (m := _RANK.match(stripped)):
                ranks[int(m.group(1))] = (m.group(2), m.group(3).strip())
            elif (m := _STARTING.search(stripped)):
                found_kind = _kind_from_text(m.group(1))
            elif "size" in stripped and "count" in stripped and "type" in stripped:
                has_root = "root" in stripped
            continue
        parts = stripped.split()
        if len(parts) < 6 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        time_at = 5 if has_root else 4
        try:
            size, time_us = int(parts[0]), float(parts[time_at])
        except (ValueError, IndexError):
            continue
        sizes.append(size)
        times.append(time_us)
    kind = found_kind or kind or _kind_from_text(Path(label).name)
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"nccl-tests: cannot tell the collective of {label!r}; name the file "
                         f"after it (e.g. all_reduce_perf.log); valid: "
                         f"{', '.join(COLLECTIVE_KINDS)}")
    if not sizes:
        raise ValueError(f"nccl-tests: {label!r} has no result lines (size count type ...)")
    if not ranks:
        raise ValueError(f"nccl-tests: {label!r} has no '#  Rank N ... on HOST device' lines; "
                         "they give the job's shape")
    hosts = {host for host, _ in ranks.values()}
    nodes = len(hosts)
    if len(ranks) % nodes:
        raise ValueError(f"nccl-tests: {label!r} has {len(ranks)} ranks on {nodes} hosts; "
                         "valid: the same number of ranks on every host")
    gpu = next(iter(ranks.values()))[1]
    return NcclSeries(kind, nodes, len(ranks) // nodes, sizes, times, label, gpu)


def read_nccl_tests(path: str | Path) -> NcclSeries:
    """:func:`parse_nccl_tests` of a file.

    Raises:
        ValueError: the file is missing or not an nccl-tests stdout.
    """
    from hardware.user_input import read_input_bytes

    path = Path(path)
    data = read_input_bytes(path, what="nccl-tests", hint="give an nccl-tests stdout log")
    return parse_nccl_tests(data.decode("utf-8", errors="replace"), label=str(path))


def read_nccl_csv(path: str | Path, *, source_id: str | None = None) -> list[NcclSeries]:
    """Series of the shared long-format CSV (``nccl_tests_measurements.csv``: columns
    source_id, collective, num_nodes, gpus_per_node, size_bytes, oop_time_us, ...).

    Raises:
        ValueError: missing columns, or ``source_id`` not in the file.
    """
    import io

    from hardware.user_input import read_input_text

    path = Path(path)
    text = read_input_text(path, what="nccl-tests", hint="give an nccl-tests CSV table")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as problem:
        raise ValueError(f"nccl-tests: {str(path)!r} is not a CSV table ({problem})") from None
    needed = {"source_id", "collective", "num_nodes", "gpus_per_node", "size_bytes",
              "oop_time_us"}
    if not rows or not needed <= set(rows[0]):
        raise ValueError(f"nccl-tests: {str(path)!r} lacks columns "
                         f"{', '.join(sorted(needed - set(rows[0] if rows else ())))}")
    for line, row in enumerate(rows, start=2):
        _check_csv_row(row, f"nccl-tests: {str(path)!r} line {line}")
    series: dict[tuple, NcclSeries] = {}
    for row in rows:
        if source_id is not None and row["source_id"] != source_id:
            continue
        key = (row["source_id"], row["collective"], row["num_nodes"], row["gpus_per_node"])
        if key not in series:
            series[key] = NcclSeries(row["collective"], int(row["num_nodes"]),
                                     int(row["gpus_per_node"]),
                                     label=f"{path.name}:{row['source_id']}:{row['collective']}",
                                     gpu=row.get("gpu_model", ""),
                                     nccl_version=row.get("nccl_version", ""))
        series[key].sizes_bytes.append(int(row["size_bytes"]))
        series[key].times_us.append(float(row["oop_time_us"]))
    if not series:
        valid = sorted({r["source_id"] for r in rows})
        raise ValueError(f"source: {source_id!r} is not in {str(path)!r}; valid: "
                         f"{', '.join(valid)}")
    return list(series.values())


#: The columns of the shared CSV read as numbers: (kind, what is valid).
_CSV_NUMBERS = {"num_nodes": (int, "a whole number >= 1"),
                "gpus_per_node": (int, "a whole number >= 1"),
                "size_bytes": (int, "a whole number >= 0"),
                "oop_time_us": (float, "a finite number >= 0")}


def _check_csv_row(row: dict, where: str) -> None:
    """One row of the shared CSV: every column present (a short row has None), the
    collective known, counts and times in range.

    Raises:
        ValueError: one line naming the file, the line, the column and the value.
    """
    if None in row or any(value is None for value in row.values()):
        given = sum(value is not None for key, value in row.items() if key is not None) \
            + len(row.get(None) or ())
        raise ValueError(f"{where}: has {given} values for the header's "
                         f"{len(row) - (None in row)} columns; valid: one value per column")
    if row["collective"] not in COLLECTIVE_KINDS:
        raise ValueError(f"{where}: collective: {row['collective']!r} is not valid; valid: "
                         f"{', '.join(COLLECTIVE_KINDS)}")
    for column, (kind, valid) in _CSV_NUMBERS.items():
        try:
            value = kind(row[column])
        except ValueError:
            value = None
        low = 1 if column in ("num_nodes", "gpus_per_node") else 0
        if value is None or not math.isfinite(value) or value < low:
            raise ValueError(f"{where}: {column}: {row[column]!r} is not valid; give {valid}")


def format_nccl_tests(rows, *, kind: str, hosts: list[str], gpus: list[str]) -> str:
    """nccl-tests-style stdout for measured rows (objects or dicts with size_bytes, count,
    type, redop, root, time_us, algbw_GBps, busbw_GBps), readable by
    :func:`parse_nccl_tests`. ``hosts``/``gpus``: per rank."""
    lines = [f"# Collective test starting: {kind}_perf (trainsim validate collectives)",
             "#", "# Using devices"]
    for rank, (host, gpu) in enumerate(zip(hosts, gpus)):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid      0 on {host:>10} device {rank:2d} "
                     f"[0x00] {gpu}")
    lines += ["#", "#       size         count      type   redop    root     time   algbw   "
                   "busbw #wrong", "#        (B)    (elements)                               "
                   "(us)  (GB/s)  (GB/s)"]
    for row in rows:
        get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
        lines.append(f"{get('size_bytes'):12d} {get('count'):13d} {get('type'):>9} "
                     f"{get('redop'):>7} {get('root'):7d} {get('time_us'):8.2f} "
                     f"{get('algbw_GBps'):7.2f} {get('busbw_GBps'):7.2f}    N/A")
    return "\n".join(lines) + "\n"
