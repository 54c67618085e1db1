"""Calibration files: fitted hardware parameters, applied to any cluster preset.

``trainsim calibrate`` (validate/calibrate.py) writes a TOML file; this module reads
it and applies it, with no dependency on torch or on the rest of trainsim::

    [provenance]            inputs, versions, date, base cluster (free-form, kept as is)
    [fields]                "<ClusterSpec field path>" = value, in the spec's SI units
                            (seconds, bytes/s, FLOP/s, fractions), e.g.
                            "gpu.kernel_launch_s" = 1.2e-5
                            "comm.base_latency_s.ring.Simple" = 3.1e-5
                            "scale_up.link_efficiency" = 0.81
    [compute_tables."matmul/fp32"]   measured op time vs work of one kernel kind/dtype
    work = [...]            FLOPs (matmul, attention) or HBM bytes (other kinds)
    time_s = [...]          seconds the op occupied its stream (launch included)
    [rank_speed]            "<rank>" = measured speed of that rank's kernels relative to
                            the tables (1 = as the tables; 0.8 = 25 % longer), e.g. a
                            rank sharing its CPU core with other work; used when the
                            same job shape is simulated (validate compare)
    [residuals]             fit quality (free-form, kept as is)

:func:`apply_calibration` sets the ``[fields]`` on a :class:`ClusterSpec` with
``dataclasses.replace``; :class:`CalibratedComputeModel` prices compute ops from the
tables (log-log interpolation, proportional to work above the largest point, the
smallest point's time below it) and falls back to :class:`hardware.compute.ComputeModel`
for kinds without a table.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hardware.compute import ComputeModel
from hardware.units import canonical_dtype
from hardware.spec import ClusterSpec, GpuSpec
from hardware.units import seconds_to_ns

#: Kinds whose table is keyed by FLOPs; every other kind by HBM bytes.
FLOP_KEYED_KINDS = ("matmul", "attention")
_SECTIONS = ("provenance", "fields", "compute_tables", "rank_speed", "residuals")


@dataclass(frozen=True)
class ComputeTable:
    """Measured time of one (kind, dtype) vs its work.

    Attributes:
        work: increasing FLOPs (matmul, attention) or bytes (other kinds).
        time_s: seconds at each work value (> 0).
    """

    work: tuple[float, ...]
    time_s: tuple[float, ...]

    def __call__(self, work: float) -> float:
        """Seconds for ``work``: log-log interpolation between points, proportional to
        work above the last point, the first point's time below the first."""
        xs, ys = self.work, self.time_s
        if work <= xs[0]:
            return ys[0]
        if work >= xs[-1]:
            return ys[-1] * work / xs[-1]
        i = bisect.bisect_right(xs, work)
        x0, x1, y0, y1 = math.log(xs[i - 1]), math.log(xs[i]), math.log(ys[i - 1]), math.log(ys[i])
        return math.exp(y0 + (y1 - y0) * (math.log(work) - x0) / (x1 - x0))


@dataclass(frozen=True)
class Calibration:
    """A calibration file, read.

    Attributes:
        fields: ``{spec field path: value}`` (SI units).
        compute_tables: ``{(kind, canonical dtype): ComputeTable}``.
        provenance: inputs, versions, date, base cluster.
        residuals: fit quality.
        source: the file it came from.
        rank_speed: ``{rank: speed}`` measured per rank (see the module docstring).
    """

    fields: Mapping[str, Any]
    compute_tables: Mapping[tuple[str, str], ComputeTable] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    residuals: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    rank_speed: Mapping[int, float] = field(default_factory=dict)


# ------------------------------------------------------------------ reading / writing


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file.

    Raises:
        ValueError: one line naming the file and the bad section, path or value.
    """
    from hardware.user_input import load_input

    path = Path(path)
    data, _ = load_input(path, what="calibration", syntax="toml",
                         hint="give a calibration file written by trainsim calibrate")
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ValueError(f"calibration: section [{unknown[0]}] in {str(path)!r} is unknown; "
                         f"valid: {', '.join(_SECTIONS)}")
    for section in _SECTIONS:
        if section in data and not isinstance(data[section], dict):
            raise ValueError(f"calibration: [{section}] in {str(path)!r} is "
                             f"{data[section]!r}, not a table; valid: a table [{section}]")
    for name, table in data.get("compute_tables", {}).items():
        if not isinstance(table, dict):
            raise ValueError(f"calibration: compute_tables.{name} in {str(path)!r} is "
                             f"{table!r}, not a table; valid: a table with work and time_s")
    for key, value in data.get("fields", {}).items():
        if isinstance(value, dict):
            raise ValueError(f"calibration: fields.{key} in {str(path)!r} is a table; valid: "
                             'one number per field path, e.g. "scale_up.link_efficiency" = 0.8')
    fields = dict(data.get("fields", {}))
    tables = {}
    for name, table in data.get("compute_tables", {}).items():
        kind, _, dtype = name.partition("/")
        work, times = table.get("work"), table.get("time_s")
        if (not isinstance(work, list) or not isinstance(times, list) or len(work) != len(times)
                or not work or any(not isinstance(v, (int, float)) or not v > 0
                                   for v in [*work, *times])):
            raise ValueError(f"calibration: compute_tables.{name} in {str(path)!r} needs equal-"
                             "length lists work and time_s of positive numbers")
        pairs = sorted(zip(work, times))
        tables[(kind, canonical_dtype(dtype, field=f"compute_tables.{name}"))] = ComputeTable(
            tuple(float(w) for w, _ in pairs), tuple(float(t) for _, t in pairs))
    speeds = {}
    for rank, speed in data.get("rank_speed", {}).items():
        if not str(rank).isdigit() or not isinstance(speed, (int, float)) or not speed > 0:
            raise ValueError(f"calibration: rank_speed.{rank} = {speed!r} in {str(path)!r}; "
                             "valid: a rank number = a speed > 0")
        speeds[int(rank)] = float(speed)
    calibration = Calibration(fields, tables, data.get("provenance", {}),
                              data.get("residuals", {}), str(path), speeds)
    for key, value in fields.items():  # fail on load, not on first use
        _checked_value(key, value)
    return calibration


def calibration_to_toml(fields: Mapping[str, Any],
                        compute_tables: Mapping[tuple[str, str], ComputeTable],
                        provenance: Mapping[str, Any], residuals: Mapping[str, Any],
                        rank_speed: Mapping[int, float] | None = None) -> str:
    """TOML text of a calibration (the format :func:`load_calibration` reads)."""
    lines = ["# trainsim calibration file, written by `trainsim calibrate`.",
             "# [fields] are ClusterSpec field paths in SI units (s, bytes/s, FLOP/s, "
             "fractions); GB = 1e9 bytes.", ""]
    _table(lines, "provenance", provenance)
    _table(lines, "fields", dict(sorted(fields.items())))
    for (kind, dtype), table in sorted(compute_tables.items()):
        _table(lines, f'compute_tables."{kind}/{dtype}"',
               {"work": list(table.work), "time_s": list(table.time_s)})
    if rank_speed:
        _table(lines, "rank_speed", {str(r): float(v) for r, v in sorted(rank_speed.items())})
    _table(lines, "residuals", residuals)
    return "\n".join(lines) + "\n"


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE.match(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                        ("inf" if value > 0 else "-inf"))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if value is None:
        return '""'
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _table(lines: list[str], name: str, data: Mapping[str, Any]) -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
    lines.append(f"[{name}]")
    lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
    lines.append("")
    for k, v in data.items():
        if isinstance(v, Mapping):
            _table(lines, f"{name}.{_key(k)}", v)


# ------------------------------------------------------------------ applying


def _checked_value(path: str, value: Any) -> Any:
    leaf = path.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"calibration: {path}: {value!r} is not a finite number")
    if ("efficiency" in path or leaf == "sustained_fraction") and not 0 < value <= 1:
        raise ValueError(f"calibration: {path}: {value!r} is outside (0, 1]; valid: an "
                         "efficiency 0 < x <= 1")
    if value < 0:
        raise ValueError(f"calibration: {path}: {value!r} must be >= 0")
    return value


def set_field(obj: Any, path: str, value: Any, *, _full: str | None = None) -> Any:
    """A copy of the frozen dataclass ``obj`` with the field at dotted ``path`` set.

    Mapping fields are copied and updated by key (``comm.hop_latency_s.pcie.Simple``);
    a key of ``gpu.peak_flops_per_s`` may be new (a dtype the preset had no peak for).

    Raises:
        ValueError: an unknown path component, naming the valid ones.
    """
    full = _full or path
    head, _, rest = path.partition(".")
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
        if head not in names or head == "sources":
            raise ValueError(f"calibration: {full}: {head!r} is not a field; valid: "
                             f"{', '.join(n for n in names if n != 'sources')}")
        current = getattr(obj, head)
        if not rest and (dataclasses.is_dataclass(current) or isinstance(current, Mapping)):
            raise ValueError(f"calibration: {full}: is a table of fields, not a value; give "
                             f"a field path below it, e.g. {full}.{_first_key(current)}")
        new = set_field(current, rest, value, _full=full) if rest else value
        if not rest and isinstance(current, (int, float)) and not isinstance(current, bool):
            new = type(current)(value) if isinstance(current, float) else value
        return dataclasses.replace(obj, **{head: new})
    if isinstance(obj, Mapping):
        growable = full.startswith("gpu.peak_flops_per_s.")
        if head not in obj and not growable:
            raise ValueError(f"calibration: {full}: {head!r} is not a key; valid: "
                             f"{', '.join(map(str, obj))}")
        if not rest and isinstance(obj.get(head), Mapping):
            raise ValueError(f"calibration: {full}: is a table of fields, not a value; give "
                             f"a field path below it, e.g. {full}.{_first_key(obj[head])}")
        copy = dict(obj)
        copy[head] = set_field(obj[head], rest, value, _full=full) if rest else float(value)
        return copy
    raise ValueError(f"calibration: {full}: {head!r} goes below a value")


def _first_key(node: Any) -> str:
    if dataclasses.is_dataclass(node):
        return next(f.name for f in dataclasses.fields(node) if f.name != "sources")
    return str(next(iter(node), "..."))


def get_field(obj: Any, path: str) -> Any:
    """The value at dotted ``path`` of a (nested) dataclass / mapping.

    Raises:
        ValueError: an unknown path component.
    """
    for part in path.split("."):
        if dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}:
            obj = getattr(obj, part)
        elif isinstance(obj, Mapping) and part in obj:
            obj = obj[part]
        else:
            raise ValueError(f"calibration: {path}: {part!r} is not a field or key")
    return obj


def spec_leaves(spec: ClusterSpec) -> dict[str, Any]:
    """``{field path: value}`` of every scalar a calibration can set (no ``sources``)."""
    leaves: dict[str, Any] = {}
    pending: list[tuple[str, Any]] = [("", spec)]
    while pending:
        prefix, node = pending.pop()
        if dataclasses.is_dataclass(node):
            items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)
                     if f.name != "sources"]
        elif isinstance(node, Mapping):
            items = list(node.items())
        else:
            leaves[prefix] = node
            continue
        pending.extend((f"{prefix}.{key}" if prefix else str(key), value) for key, value in items)
    return leaves


def apply_calibration(spec: ClusterSpec, calibration: Calibration) -> ClusterSpec:
    """``spec`` with every ``[fields]`` entry set; the sources name the file.

    Raises:
        ValueError: a path that is not a field of the spec (one line).
    """
    from hardware.catalog import check_cluster_spec

    sources = dict(spec.sources)
    for path, value in calibration.fields.items():
        spec = set_field(spec, path, _checked_value(path, value))
        sources[path] = f"calibration: {calibration.source or 'in memory'}"
    # A calibration may not set what a preset may not (domain_gpus = 0, ...): the
    # calibrated spec passes the preset schema, declared once in hardware.catalog.
    check_cluster_spec(spec, where=f"calibration {calibration.source or 'in memory'}")
    return dataclasses.replace(spec, sources=sources)


class CalibratedComputeModel:
    """Prices compute ops from measured tables, else with the roofline model.

    Args:
        gpu: the (calibrated) GPU spec for kinds without a table.
        tables: ``{(kind, canonical dtype): ComputeTable}``.
    """

    def __init__(self, gpu: GpuSpec, tables: Mapping[tuple[str, str], ComputeTable]) -> None:
        self.fallback = ComputeModel(gpu)
        self.tables = dict(tables)

    def duration_s(self, op) -> float:
        """Seconds ``op`` occupies its stream."""
        table = self.tables.get((op.kind, canonical_dtype(op.dtype)))
        if table is None:
            return self.fallback.duration_s(op)
        work = op.flops if op.kind in FLOP_KEYED_KINDS else op.bytes
        return table(max(work, 1.0))

    def duration_ns(self, op) -> int:
        """:meth:`duration_s` rounded up to whole nanoseconds."""
        return seconds_to_ns(self.duration_s(op))
