"""Measurement directories: append-only, one atomic JSON file per finished measurement.

Layout of a directory ``DIR``::

    DIR/program.json                      the replayed Program (validate.program_io)
    DIR/run.json                          what was run (task, world size, backend)
    DIR/rank00003/env.json                environment of rank 3 (validate.env_info)
    DIR/rank00003/process.json            pid and host of rank 3's latest process
    DIR/rank00003/replay/iter00007.json   spans of rank 3, measured iteration 7
    DIR/rank00000/collectives/<op>-<size>.json   one nccl-tests-style row
    DIR/rank00000/compute/<kind>-<...>.json      one GEMM / copy microbenchmark point

Every file is written with :func:`sim.atomic_io.write_text_atomic` (temporary file,
fsync, rename), so a reader sees either nothing or the whole file: a killed process
loses only the measurement it was taking. Measurement files are never overwritten
(append-only); a resumed run skips what is already on disk.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from sim.atomic_io import write_text_atomic

SCHEMA = "trainsim-measurement/1"
_RANK_DIR = re.compile(r"^rank(\d{5})$")
_ITER = re.compile(r"^iter(\d{5})\.json$")


class MeasurementStore:
    """One measurement directory (created on first write).

    Args:
        root: the directory.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ paths
    def rank_dir(self, rank: int) -> Path:
        """``root/rankNNNNN``."""
        return self.root / f"rank{rank:05d}"

    def path(self, rank: int, series: str, name: str) -> Path:
        """Where measurement ``name`` of ``series`` of ``rank`` lives."""
        return self.rank_dir(rank) / series / f"{name}.json"

    # ------------------------------------------------------------------ writing
    def write_meta(self, name: str, data: dict, *, rank: int | None = None) -> Path:
        """Write (or replace) a description file: ``root/name.json`` or, with ``rank``,
        ``root/rankNNNNN/name.json``. Not a measurement; replaced atomically."""
        directory = self.root if rank is None else self.rank_dir(rank)
        directory.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(directory / f"{name}.json",
                                 json.dumps(data, indent=1, sort_keys=True))

    def write(self, rank: int, series: str, name: str, data: dict) -> Path:
        """Write one finished measurement, atomically, unless it is already on disk.

        Returns the path. An existing file is kept as it is (append-only): a resumed
        run never replaces what an earlier run measured.
        """
        target = self.path(rank, series, name)
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        record = {"schema": SCHEMA, "rank": rank, "series": series, "name": name, **data}
        return write_text_atomic(target, json.dumps(record, sort_keys=True))

    # ------------------------------------------------------------------ reading
    def has(self, rank: int, series: str, name: str) -> bool:
        """Whether a measurement is on disk."""
        return self.path(rank, series, name).exists()

    def read_meta(self, name: str, *, rank: int | None = None) -> dict | None:
        """A description file, or None when absent."""
        directory = self.root if rank is None else self.rank_dir(rank)
        path = directory / f"{name}.json"
        if not path.exists():
            return None
        return _load(path)

    def ranks(self) -> list[int]:
        """Ranks with a directory, ascending."""
        if not self.root.is_dir():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir()
                 if (m := _RANK_DIR.match(p.name)) and p.is_dir()]
        return sorted(found)

    def read_series(self, series: str) -> dict[int, list[dict]]:
        """``{rank: [records sorted by name]}`` of one series over every rank.

        Raises:
            ValueError: a file is not a measurement record (never happens for files this
                module wrote; names the file otherwise).
        """
        out: dict[int, list[dict]] = {}
        for rank in self.ranks():
            directory = self.rank_dir(rank) / series
            if not directory.is_dir():
                continue
            records = [_load(p) for p in sorted(directory.glob("*.json"))
                       if not p.name.startswith(".")]
            if records:
                out[rank] = records
        return out

    def completed_iterations(self, rank: int) -> int:
        """Measured replay iterations of ``rank`` on disk, counted from 0 without gaps."""
        directory = self.rank_dir(rank) / "replay"
        if not directory.is_dir():
            return 0
        present = {int(m.group(1)) for p in directory.iterdir() if (m := _ITER.match(p.name))}
        count = 0
        while count in present:
            count += 1
        return count


def iteration_name(iteration: int) -> str:
    """File stem of a replay iteration: ``iter00007``."""
    return f"iter{iteration:05d}"


#: What each field of a measurement record must be (the schemas of the series, declared
#: once): ``count`` a whole number >= 1, ``index`` >= 0, ``positive`` a finite number > 0,
#: ``text`` a string.
RECORD_FIELDS = {
    "replay": {"iteration": "index", "spans": "list"},
    "collectives": {"op": "text", "ranks": "count", "size_bytes": "index",
                    "time_us": "positive", "nodes": "count", "gpus_per_node": "count"},
    "compute": {"kind": "text", "dtype": "text", "work": "positive", "time_s": "positive"},
}
_KIND_WORDS = {"count": "a whole number >= 1", "index": "a whole number >= 0",
               "positive": "a finite number > 0", "text": "a string", "list": "a list"}


def check_fields(record: dict, fields: dict[str, str], where: str) -> dict:
    """``record`` if every named field is present and of its kind (:data:`RECORD_FIELDS`).

    Raises:
        ValueError: ``"<where>: <field>: <value> is not valid; give ..."`` (one line).
    """
    for name, kind in fields.items():
        value = record.get(name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        whole = number and isinstance(value, int)
        ok = {"count": whole and value >= 1, "index": whole and value >= 0,
              "positive": number and math.isfinite(value) and value > 0,
              "text": isinstance(value, str), "list": isinstance(value, list)}[kind]
        if not ok:
            shown = "missing" if name not in record else f"{value!r:.60} is not valid"
            raise ValueError(f"{where}: {name}: {shown}; give {_KIND_WORDS[kind]}")
    return record


def _load(path: Path) -> dict:
    from hardware.user_input import read_input_text

    text = read_input_text(path, what="measurement", hint="it was not written by trainsim")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"measurement: {str(path)!r} is not a complete JSON record ({err}); "
                         "it was not written by trainsim") from None
    if not isinstance(data, dict):
        raise ValueError(f"measurement: {str(path)!r} is not a JSON object")
    series = data.get("series")
    if series in RECORD_FIELDS and path.parent.name == series:
        check_fields(data, RECORD_FIELDS[series], f"measurement: {str(path)!r}")
    return data
