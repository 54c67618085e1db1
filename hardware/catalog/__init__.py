"""Cluster presets: load, merge, validate and describe hardware TOML files.

A preset is a TOML file in this folder (``dgx-h100.toml`` is the preset
``dgx-h100``; files starting with ``_`` are not presets). Its tables mirror
:class:`hardware.spec.ClusterSpec`: top-level ``name``, ``description``,
``gpus_per_node``, ``max_nodes``, then ``[gpu]`` (with
``[gpu.peak_flops_per_s]``), ``[scale_up]``, ``[nic]``, ``[fabric]`` and an
optional ``[comm]``.

Merge order (later wins; tables are merged key by key, so a file only states
what it changes)::

    _defaults.toml  <  extended preset(s)  <  the file  <  overrides

A file may say ``extends = "dgx-h100"`` (a built-in name, or a path relative
to the file) to inherit another preset; chains are followed base-first.
``name`` and ``extends`` are never inherited: a file without ``name`` is named
after its file stem.

Units: TOML keys carry their unit and are converted once, here, into the SI
fields of :mod:`hardware.spec`. GB = 1e9 bytes (``hbm_gb``), GB/s = 1e9
bytes/s (``*_gb_per_s*``), Gb/s = 1e9 bits/s (``nic.gbit_per_s``), ``*_us`` =
microseconds, ``peak_flops_per_s`` = FLOP/s. Override keys use the same TOML
names, e.g. ``{"nic.gbit_per_s": 200, "comm.hop_latency_us.network.Simple": 10}``.

Every number in a built-in preset carries a ``# source:`` comment (same line,
or the comment line directly above); :func:`preset_sources` returns them and
:func:`load_cluster` puts them into ``ClusterSpec.sources``.

All problems raise :class:`ValueError` with a one-line message that names the
field, the bad value and what is valid.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping

from hardware.toml_sources import source_comments, table_headers
from hardware.spec import (
    ALGORITHM_FAMILIES,
    DTYPES,
    NODE_BUCKETS,
    FABRIC_TOPOLOGIES,
    HOST_CPUS,
    NIC_KINDS,
    NIC_PATHS,
    PROTOCOLS,
    SCALE_UP_KINDS,
    TIERS,
    ClusterSpec,
    CommTuningSpec,
    FabricSpec,
    GpuSpec,
    NicSpec,
    ScaleUpSpec,
)
from hardware.compute import MAX_SPEED_SPREAD
from hardware.units import GIB, GB
# tomllib is re-exported: tests read pyproject.toml with it.
from hardware.user_input import load_input, tomllib  # noqa: F401

__all__ = [
    "check_cluster_spec",
    "list_presets",
    "load_cluster",
    "parse_override",
    "cluster_to_dict",
    "preset_sources",
    "parse_nccl_proto",
    "CATALOG_DIR",
]

CATALOG_DIR = Path(__file__).resolve().parent
_DEFAULTS = CATALOG_DIR / "_defaults.toml"

#: Per-lane PCIe data rate in GB/s per direction after line encoding (PCI-SIG
#: base specs: gen1/2 8b/10b at 2.5/5 GT/s, gen3-5 128b/130b at 8/16/32 GT/s,
#: gen6 64 GT/s PAM4 with 242/256-byte FLITs). Used when a preset gives
#: ``pcie_generation`` and ``pcie_lanes`` but no ``pcie_gb_per_s``.
PCIE_GB_PER_S_PER_LANE = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class _Field:
    """One TOML leaf: its Python type, range check, largest plausible value and whether
    it is required.

    ``high`` bounds every number far above any machine that exists or is announced, so a
    typo (``hbm_gb = 1e308``) is refused here instead of overflowing a simulation.
    """

    kind: type
    check: str = ""  # "", "positive", "nonnegative", "fraction", "at_least_1"
    choices: tuple = ()
    required: bool = True
    high: float | None = None


#: Smallest efficiency or fraction accepted: below it every time would exceed what a
#: simulation can represent (1e-300 overflows), and no measured efficiency is near it.
MIN_FRACTION = 1e-6
#: Smallest positive rate or size accepted (a rate of 1e-300 GB/s overflows too).
MIN_POSITIVE = 1e-6


def _same(keys: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    return {key: leaf for key in keys}


_STR = _Field(str)
_POS_INT = _Field(int, "positive", high=1_000_000)
_POS = _Field(float, "positive", high=1e9)
#: Rates (GB/s, Gb/s, FLOP/s x 1e-9): far above any hardware, so a test may model free
#: communication (1e21 GB/s), yet finite in every product the models form.
_RATE = _Field(float, "positive", high=1e24)
_FRAC = _Field(float, "fraction")
#: Latencies in microseconds: up to one second.
_US = _Field(float, "nonnegative", high=1e6)

#: The TOML layout of a preset; a dict is a table, a _Field a value.
SCHEMA: dict[str, Any] = {
    "extends": _Field(str, required=False),
    "name": _STR,
    "description": _STR,
    "gpus_per_node": _POS_INT,
    "max_nodes": _POS_INT,
    "gpu": {
        "name": _STR,
        "peak_flops_per_s": _same(DTYPES, _Field(float, "positive", required=False, high=1e33)),
        "hbm_gb": _POS,
        "hbm_gb_per_s": _RATE,
        "matmul_profile": _STR,
        "matmul_peak_efficiency": _FRAC,
        "memory_efficiency": _FRAC,
        "kernel_launch_us": _US,
        "sustained_fraction": _Field(float, "fraction", required=False),
        "sm_count": _Field(int, "nonnegative", required=False, high=1_000_000),
        "memory_reserve_gib": _Field(float, "nonnegative", required=False, high=1e6),
        "host_cpu": _Field(str, choices=HOST_CPUS, required=False),
        "compute_capability": _Field(int, "nonnegative", required=False, high=1000),
        "speed_spread": _Field(float, "nonnegative", required=False,
                               high=MAX_SPEED_SPREAD),
    },
    "scale_up": {
        "kind": _Field(str, choices=SCALE_UP_KINDS),
        "domain_gpus": _POS_INT,
        "nvlink_generation": _Field(int, "nonnegative", required=False, high=100),
        "nvlink_links_per_gpu": _Field(int, "nonnegative", required=False, high=10_000),
        "nvlink_gb_per_s_per_link": _Field(float, "nonnegative", required=False, high=1e24),
        "link_efficiency": _FRAC,
        "nvls": _Field(bool),
        "nvls_efficiency": _Field(float, "fraction", required=False),
        "pcie_generation": _POS_INT,
        "pcie_lanes": _POS_INT,
        "pcie_gb_per_s": _Field(float, "positive", required=False, high=1e24),
    },
    "nic": {
        "count_per_node": _POS_INT,
        "gbit_per_s": _RATE,
        "kind": _Field(str, choices=NIC_KINDS),
        "gpudirect_rdma": _Field(bool),
        "link_efficiency": _FRAC,
        "gpu_path": _Field(str, choices=NIC_PATHS, required=False),
        "net_latency_us": _Field(float, "nonnegative", required=False, high=1e6),
    },
    "fabric": {
        "topology": _Field(str, choices=FABRIC_TOPOLOGIES),
        "tiers": _Field(int, choices=(1, 2, 3)),
        "nodes_per_leaf": _POS_INT,
        "leaves_per_spine_group": _POS_INT,
        "oversubscription": _Field(float, "at_least_1", high=1e6),
        "switch_hop_latency_us": _US,
    },
    "comm": {
        "base_latency_us": _same(ALGORITHM_FAMILIES, _same(PROTOCOLS, _US)),
        "hop_latency_us": _same(TIERS, _same(PROTOCOLS, _US)),
        "protocol_efficiency": _same(TIERS, _same(PROTOCOLS, _FRAC)),
        "p2p_efficiency": _same(TIERS, _FRAC),
        "protocol_max_bytes": _same(PROTOCOLS, _Field(int, "nonnegative", required=False,
                                                      high=2**60)),
        "ll_max_gb_per_s": _same(NODE_BUCKETS, _Field(float, "positive", required=False,
                                                      high=1e24)),
        "channel_max_gb_per_s": _same(ALGORITHM_FAMILIES, _same(PROTOCOLS, _same(
            NODE_BUCKETS, _Field(float, "positive", required=False, high=1e24)))),
        "rail_channels": _Field(int, "positive", required=False, high=1024),
        "domain_channels": _Field(int, "positive", required=False, high=1024),
        "collective_channels": _Field(int, "positive", required=False, high=1024),
        "channel_threshold_bytes": _same(PROTOCOLS, _Field(int, "nonnegative", required=False,
                                                           high=2**60)),
        "p2p_net_channel_gb_per_s": _Field(float, "nonnegative", required=False, high=1e24),
        "p2p_net_channels_per_peer": _Field(int, "nonnegative", required=False, high=1024),
        "p2p_channels": _Field(int, "positive", required=False, high=1024),
        "p2p_peers_per_channel": _Field(int, "positive", required=False, high=1024),
        "net_step_overhead_us": _same(PROTOCOLS, _Field(float, "nonnegative", required=False,
                                                        high=1e6)),
        "ring_step_pacing_us": _same(PROTOCOLS, _Field(float, "nonnegative", required=False,
                                                       high=1e6)),
        "ring_plateau_factor": _Field(float, "at_least_1", required=False, high=10.0),
        "tree_chunk_bytes": _Field(int, "nonnegative", required=False, high=2**60),
        "nvls_chunk_bytes": _Field(int, "nonnegative", required=False, high=2**40),
        "nvls_channels": _Field(int, "positive", required=False, high=1024),
        "nvls_channels_multi_domain": _Field(int, "positive", required=False, high=1024),
        "nccl_proto": _Field(str, required=False),
    },
}

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_GOT_WORDS = {int: "an integer", float: "a float", bool: "a boolean", str: "a string", dict: "a table", list: "an array"}


# --------------------------------------------------------------------------- public API


def list_presets() -> list[str]:
    """Names of the built-in presets, sorted (``*.toml`` here not starting with ``_``)."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.toml") if not p.name.startswith("_"))


def load_cluster(
    name_or_path: str | os.PathLike[str], overrides: Mapping[str, object] | None = None
) -> ClusterSpec:
    """Load a cluster preset and return a validated :class:`ClusterSpec`.

    Args:
        name_or_path: a built-in preset name (see :func:`list_presets`) or the
            path of a TOML file, which may ``extends`` a built-in preset.
        overrides: ``{dotted TOML key: value}`` applied last, with the TOML
            (unit-suffixed) key names, e.g. ``{"nic.gbit_per_s": 200}`` (Gb/s),
            ``{"fabric.switch_hop_latency_us": 0.5}`` (microseconds). String
            values are converted as by :func:`parse_override`. A Mapping value
            for a table key is merged into that table.

    Returns:
        The spec with SI fields (bytes, bytes/s, FLOP/s, seconds) and
        ``sources`` mapping dotted TOML keys to their citation.

    Raises:
        ValueError: one line naming the field, the bad value and what is valid:
            unknown preset or missing file, invalid TOML, unknown key, wrong
            type, missing required field, non-positive bandwidth, efficiency
            outside (0, 1], unknown kind/topology, ``scale_up.domain_gpus`` not
            a multiple of ``gpus_per_node``, an ``extends`` cycle.
    """
    data, sources = _resolve(name_or_path)
    if overrides:
        for key, value in overrides.items():
            _apply_override(data, sources, str(key), value)
    return _build(data, sources)


def parse_override(text: str) -> tuple[str, object]:
    """Split a CLI override ``"KEY=VALUE"`` into ``(key, value)``.

    ``VALUE`` becomes a bool (``true``/``false``, any case), an int, a float
    (``1e15``, ``0.5``), or else a string (surrounding quotes removed). The key
    is a dotted TOML path such as ``nic.gbit_per_s``; it is checked by
    :func:`load_cluster`, not here.

    Raises:
        ValueError: when the text has no ``=`` or an empty key.
    """
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(
            f"override: {text!r} is not KEY=VALUE; give e.g. nic.gbit_per_s=200"
        )
    return key, _parse_scalar(raw.strip())


def cluster_to_dict(spec: ClusterSpec) -> dict[str, Any]:
    """A JSON-serialisable dict of ``spec``: SI field names and units as in
    :mod:`hardware.spec` (bytes, bytes/s, FLOP/s, seconds), including
    ``sources``. Mappings become plain dicts."""
    return _plain(spec)


def preset_sources(name: str | os.PathLike[str]) -> dict[str, str]:
    """``{dotted TOML key: citation}`` for a preset name or TOML path.

    Citations are the ``# source:`` comments of the file and of every preset
    it extends (the nearest file wins); keys that come from
    ``_defaults.toml`` point at that file's table comment. Keys are leaf TOML
    paths with their unit suffix, e.g. ``"scale_up.nvlink_gb_per_s_per_link"``.

    Raises:
        ValueError: for an unknown preset, a missing file or invalid TOML.
    """
    return dict(_resolve(name)[1])


# --------------------------------------------------------------------------- loading


def _locate(ref: str | os.PathLike[str], relative_to: Path | None) -> Path:
    text = os.fspath(ref)
    if text in list_presets():
        return CATALOG_DIR / f"{text}.toml"
    looks_like_path = text.endswith(".toml") or "/" in text or os.sep in text
    if looks_like_path:
        path = Path(text).expanduser()
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        if path.exists():
            return path.resolve()  # read_input_text refuses what is not a regular file
        raise ValueError(f"cluster: file {str(path)!r} not found; give a preset name or a TOML file")
    raise ValueError(
        f"cluster: {text!r} is not a preset; valid: {', '.join(list_presets())} "
        "(or a path to a .toml file)"
    )


def _read(path: Path) -> tuple[dict[str, Any], str]:
    return load_input(path, what="cluster", syntax="toml",
                      hint="give a preset name or a preset TOML file")


#: :func:`_resolve`'s merged presets by top file: the files read with their stamps, the
#: data and sources. Parsing a preset's TOML and comments takes ~4 ms, and a sweep or
#: ``trainsim validate published`` loads the same few presets thousands of times; a hit
#: is checked against every file's stamp, so an edited file is read again.
_RESOLVED: dict[Path, tuple[tuple[tuple[Path, tuple[int, int]], ...], dict[str, Any],
                            dict[str, str]]] = {}


def _stamp(path: Path) -> tuple[int, int]:
    """A file's modification time (ns) and size: what tells an edited file apart
    ((-1, -1) for a file gone since: read again, and the reader says what is missing)."""
    try:
        stat = path.stat()
    except OSError:
        return -1, -1
    return stat.st_mtime_ns, stat.st_size


def _resolve(ref: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merged data and sources of ``ref``: defaults, then bases, then the file (copies:
    the caller may apply overrides to them)."""
    path = _locate(ref, None)
    cached = _RESOLVED.get(path)
    if cached is None or any(_stamp(file) != stamp for file, stamp in cached[0]):
        data, sources, files = _resolve_files(path)
        cached = _RESOLVED[path] = (tuple((file, _stamp(file)) for file in files), data,
                                    sources)
    return copy.deepcopy(cached[1]), dict(cached[2])


def _resolve_files(path: Path) -> tuple[dict[str, Any], dict[str, str], list[Path]]:
    """:func:`_resolve` of the preset file ``path`` read from disk, and the files read."""
    chain: list[tuple[Path, dict[str, Any], str]] = []
    while True:
        if path in [p for p, _, _ in chain]:
            names = " -> ".join(p.stem for p in [*(c[0] for c in chain), path])
            raise ValueError(f"extends: cycle {names}; a preset cannot extend itself")
        layer, text = _read(path)
        _check_tree(layer, SCHEMA, "", where=f"in {path}")
        chain.append((path, layer, text))
        parent = layer.pop("extends", None)
        if parent is None:
            break
        path = _locate(parent, path.parent)

    data, text = _read(_DEFAULTS)
    _check_tree(data, SCHEMA, "", where=f"in {_DEFAULTS}")
    headers = table_headers(text)
    sources = {}
    for leaf in _leaves(data):
        table = max((h for h in headers if leaf.startswith(h + ".")), key=len, default="")
        sources[leaf] = f"hardware/catalog/_defaults.toml, comment of [{table}]"
    for path, layer, text in reversed(chain):  # base first
        data = _merge(data, layer)
        sources.update(_file_sources(layer, text))
    top_path, top, _ = chain[0]
    data["name"] = top.get("name", top_path.stem)
    if "name" not in top:
        sources["name"] = f"file name of {top_path}"
    return data, sources, [_DEFAULTS, *(file for file, _, _ in chain)]


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        keys += _leaves(value, path + ".") if isinstance(value, Mapping) else [path]
    return keys


# --------------------------------------------------------------------------- overrides


def _apply_override(data: dict[str, Any], sources: dict[str, str], key: str, value: object) -> None:
    parts = key.split(".")
    if parts == ["extends"]:
        raise ValueError("extends: cannot be overridden; load the other preset instead")
    schema: Any = SCHEMA
    table: dict[str, Any] = data
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "top level"
        if not isinstance(schema, dict):
            raise ValueError(f"{key}: {'.'.join(parts[:depth])} is a value, not a table; drop '.{part}'")
        if part not in schema:
            valid = ", ".join(k for k in schema if k != "extends")
            raise ValueError(f"{key}: unknown override key; valid keys of [{where}]: {valid}")
        schema = schema[part]
        if depth < len(parts) - 1:
            table = table.setdefault(part, {})
    leaf = parts[-1]
    if isinstance(schema, dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: {value!r} given, but [{key}] is a table; give a leaf key such as {key}.{next(iter(schema))}")
        _check_tree(value, schema, key + ".", where="override")
        table[leaf] = _merge(table.get(leaf, {}), value)
        for sub in _leaves(value, key + "."):
            sources[sub] = "override"
        return
    if isinstance(value, str) and schema.kind is not str:
        value = _parse_scalar(value)  # CLI text such as "200" or "false"
    elif schema.kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # e.g. gpu.name=100 parsed as a number by parse_override
    table[leaf] = _coerce(value, schema, key, where="override")
    sources[key] = f"override: {key}={value!r}"


def _parse_scalar(raw: str) -> object:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


# --------------------------------------------------------------------------- checking


def _check_tree(data: Mapping[str, Any], schema: Mapping[str, Any], prefix: str, where: str) -> None:
    """Reject unknown keys and wrong types in one layer (file or override)."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in schema:
            table = prefix.rstrip(".") or "top level"
            valid = ", ".join(schema)
            raise ValueError(f"{path}: unknown key; valid keys of [{table}]: {valid} ({where})")
        sub = schema[key]
        if isinstance(sub, dict):
            if not isinstance(value, Mapping):
                raise ValueError(f"{path}: {value!r} is not a table; give [{path}] with keys {', '.join(sub)} ({where})")
            _check_tree(value, sub, path + ".", where)
        else:
            _coerce(value, sub, path, where)


def _coerce(value: object, field: _Field, path: str, where: str = "") -> Any:
    """Type-check and convert one value (int -> float where a number is wanted)."""
    suffix = f" ({where})" if where else ""
    kind = field.kind
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if kind is int and isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok:
        got = _GOT_WORDS.get(type(value), f"a {type(value).__name__}")
        raise ValueError(f"{path}: {value!r} is {got}; expected {_TYPE_WORDS[kind]}{suffix}")
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{path}: {value!r} is not finite; give a finite number{suffix}")
    if field.choices and value not in field.choices:
        raise ValueError(f"{path}: {value!r} is not valid; valid: {', '.join(map(str, field.choices))}{suffix}")
    problem = {
        "positive": (lambda v: v > 0 and (kind is int or v >= MIN_POSITIVE),
                     "must be > 0" + ("" if kind is int else f" (at least {MIN_POSITIVE:g})")),
        "nonnegative": (lambda v: v >= 0 and (kind is int or v == 0 or v >= MIN_POSITIVE),
                        "must be >= 0" + ("" if kind is int else
                                          f" (0 or at least {MIN_POSITIVE:g})")),
        "fraction": (lambda v: MIN_FRACTION <= v <= 1,
                     f"is outside (0, 1]; give an efficiency {MIN_FRACTION:g} <= x <= 1"),
        "at_least_1": (lambda v: v >= 1, "is below 1; give a ratio >= 1 (1.0 = non-blocking)"),
    }.get(field.check)
    if problem and not problem[0](value):
        raise ValueError(f"{path}: {value!r} {problem[1]}{suffix}")
    if field.high is not None and value > field.high:
        raise ValueError(f"{path}: {value!r} is above {field.high:g}, the largest plausible "
                         f"value; give a value <= {field.high:g}{suffix}")
    return value


def _table(data: Mapping[str, Any], schema: Mapping[str, Any], path: str, name: str) -> dict[str, Any]:
    """The validated table at ``path``: required keys present, values coerced."""
    out: dict[str, Any] = {}
    for key, sub in schema.items():
        full = f"{path}.{key}" if path else key
        if key not in data:
            if isinstance(sub, _Field) and sub.required:
                raise ValueError(f"{full}: missing required field in cluster {name!r}; add it to [{path or 'top level'}]")
            if isinstance(sub, dict) and any(_required_leaves(sub)):
                raise ValueError(f"{full}: missing required table in cluster {name!r}; add [{full}]")
            continue
        value = data[key]
        out[key] = _table(value, sub, full, name) if isinstance(sub, dict) else _coerce(value, sub, full)
    return out


def _required_leaves(schema: Mapping[str, Any]) -> list[bool]:
    flags = []
    for sub in schema.values():
        flags += _required_leaves(sub) if isinstance(sub, dict) else [sub.required]
    return flags


# --------------------------------------------------------------------------- building


def _build(data: dict[str, Any], sources: Mapping[str, str]) -> ClusterSpec:
    name = data.get("name", "?")
    d = _table(data, SCHEMA, "", str(name))
    gpu, up, nic, fab, comm = d["gpu"], d["scale_up"], d["nic"], d["fabric"], d["comm"]

    if not gpu.get("peak_flops_per_s"):
        raise ValueError(f"gpu.peak_flops_per_s: empty in cluster {name!r}; give FLOP/s for at least one of {', '.join(DTYPES)}")
    if up["domain_gpus"] % d["gpus_per_node"]:
        raise ValueError(
            f"scale_up.domain_gpus: {up['domain_gpus']} is not a multiple of gpus_per_node "
            f"({d['gpus_per_node']}); valid: {d['gpus_per_node']}, {2 * d['gpus_per_node']}, ..."
        )
    if up["kind"] != "pcie":
        for key in ("nvlink_generation", "nvlink_links_per_gpu", "nvlink_gb_per_s_per_link"):
            if up.get(key, 0) <= 0:
                raise ValueError(
                    f"scale_up.{key}: {up.get(key, 'missing')!r} must be > 0 when scale_up.kind is "
                    f"{up['kind']!r} (only kind 'pcie' has no NVLink)"
                )
    if up["nvls"] and "nvls_efficiency" not in up:
        raise ValueError("scale_up.nvls_efficiency: missing required field when scale_up.nvls is true; give 0 < x <= 1")
    pcie_gb_per_s = up.get("pcie_gb_per_s")
    if pcie_gb_per_s is None:
        per_lane = PCIE_GB_PER_S_PER_LANE.get(up["pcie_generation"])
        if per_lane is None:
            raise ValueError(
                f"scale_up.pcie_gb_per_s: missing and pcie_generation {up['pcie_generation']} has no "
                f"known rate (known: {', '.join(map(str, PCIE_GB_PER_S_PER_LANE))}); give pcie_gb_per_s"
            )
        pcie_gb_per_s = per_lane * up["pcie_lanes"]

    us = 1e-6
    return ClusterSpec(
        name=d["name"],
        description=d["description"],
        gpus_per_node=d["gpus_per_node"],
        max_nodes=d["max_nodes"],
        gpu=GpuSpec(
            name=gpu["name"],
            peak_flops_per_s=dict(gpu["peak_flops_per_s"]),
            hbm_bytes=int(round(gpu["hbm_gb"] * GB)),
            hbm_bytes_per_s=gpu["hbm_gb_per_s"] * GB,
            matmul_profile=gpu["matmul_profile"],
            matmul_peak_efficiency=gpu["matmul_peak_efficiency"],
            memory_efficiency=gpu["memory_efficiency"],
            kernel_launch_s=gpu["kernel_launch_us"] * us,
            sustained_fraction=gpu.get("sustained_fraction", 1.0),
            sm_count=gpu.get("sm_count", 0),
            memory_reserve_bytes=int(round(gpu.get("memory_reserve_gib", 1.0) * GIB)),
            host_cpu=gpu.get("host_cpu", "x86"),
            compute_capability=gpu.get("compute_capability", 0),
            speed_spread=gpu.get("speed_spread", 0.0),
        ),
        scale_up=ScaleUpSpec(
            kind=up["kind"],
            domain_gpus=up["domain_gpus"],
            nvlink_generation=up.get("nvlink_generation", 0),
            nvlink_links_per_gpu=up.get("nvlink_links_per_gpu", 0),
            nvlink_bytes_per_s_per_link=up.get("nvlink_gb_per_s_per_link", 0.0) * GB,
            link_efficiency=up["link_efficiency"],
            nvls=up["nvls"],
            nvls_efficiency=up.get("nvls_efficiency", 0.0) if up["nvls"] else 0.0,
            pcie_generation=up["pcie_generation"],
            pcie_lanes=up["pcie_lanes"],
            pcie_bytes_per_s=pcie_gb_per_s * GB,
        ),
        nic=NicSpec(
            count_per_node=nic["count_per_node"],
            gbit_per_s=nic["gbit_per_s"],
            kind=nic["kind"],
            gpudirect_rdma=nic["gpudirect_rdma"],
            link_efficiency=nic["link_efficiency"],
            gpu_path=nic.get("gpu_path", "PXB"),
            net_latency_s=nic.get("net_latency_us", 0.0) * us,
        ),
        fabric=FabricSpec(
            topology=fab["topology"],
            tiers=fab["tiers"],
            nodes_per_leaf=fab["nodes_per_leaf"],
            leaves_per_spine_group=fab["leaves_per_spine_group"],
            oversubscription=fab["oversubscription"],
            switch_hop_latency_s=fab["switch_hop_latency_us"] * us,
        ),
        comm=CommTuningSpec(
            base_latency_s={a: {p: v * us for p, v in t.items()} for a, t in comm["base_latency_us"].items()},
            hop_latency_s={a: {p: v * us for p, v in t.items()} for a, t in comm["hop_latency_us"].items()},
            protocol_efficiency={a: dict(t) for a, t in comm["protocol_efficiency"].items()},
            p2p_efficiency=dict(comm["p2p_efficiency"]),
            protocol_max_bytes=dict(comm.get("protocol_max_bytes", {})),
            ll_max_bus_bytes_per_s={b: v * GB for b, v in comm.get("ll_max_gb_per_s", {}).items()},
            channel_max_bus_bytes_per_s={
                f: {p: {b: v * GB for b, v in t.items()} for p, t in by_proto.items()}
                for f, by_proto in comm.get("channel_max_gb_per_s", {}).items()},
            rail_channels=comm.get("rail_channels", 1),
            domain_channels=comm.get("domain_channels", 16),
            collective_channels=comm.get("collective_channels", 16),
            channel_threshold_bytes=dict(comm.get("channel_threshold_bytes", {})),
            p2p_net_channel_bytes_per_s=comm.get("p2p_net_channel_gb_per_s", 0.0) * GB,
            p2p_net_channels_per_peer=comm.get("p2p_net_channels_per_peer", 0),
            p2p_channels=comm.get("p2p_channels", 16),
            p2p_peers_per_channel=comm.get("p2p_peers_per_channel", 8),
            net_step_overhead_s={p: v * us for p, v in comm.get("net_step_overhead_us", {}).items()},
            ring_step_pacing_s={p: v * us for p, v in comm.get("ring_step_pacing_us", {}).items()},
            ring_plateau_factor=comm.get("ring_plateau_factor", 1.0),
            tree_chunk_bytes=comm.get("tree_chunk_bytes", 0),
            nvls_chunk_bytes=comm.get("nvls_chunk_bytes", 0),
            nvls_channels=comm.get("nvls_channels", 16),
            nvls_channels_multi_domain=comm.get("nvls_channels_multi_domain", 16),
            nccl_proto=parse_nccl_proto(comm.get("nccl_proto", ",".join(PROTOCOLS))),
        ),
        sources=dict(sorted(sources.items())),
    )


def parse_nccl_proto(text: str) -> tuple[str, ...]:
    """The protocols an ``NCCL_PROTO`` value enables, in :data:`PROTOCOLS` order: a
    comma list of names, case-insensitive, or ``^`` and the names to disable (NCCL
    src/graph/tuning.cc ``parseList``: ``strcasecmp``, a leading ``^`` inverts).

    Raises:
        ValueError: ``comm.nccl_proto`` naming the value for an unknown name or a list
            that enables no protocol.
    """
    if not isinstance(text, str):
        raise ValueError(f"comm.nccl_proto: {text!r} is not a string; give e.g. 'Simple' or "
                         f"'LL128,Simple' (names: {', '.join(PROTOCOLS)}, '^' to exclude)")
    exclude = text.startswith("^")
    names = [n.strip() for n in text[exclude:].split(",") if n.strip()]
    known = {p.lower(): p for p in PROTOCOLS}
    for name in names:
        if name.lower() not in known:
            raise ValueError(f"comm.nccl_proto: {name!r} in {text!r} is not a protocol; valid: "
                             f"{', '.join(PROTOCOLS)} (comma-separated, '^' to exclude)")
    listed = {known[n.lower()] for n in names}
    enabled = tuple(p for p in PROTOCOLS if (p in listed) != exclude)
    if not enabled:
        raise ValueError(f"comm.nccl_proto: {text!r} enables no protocol; valid: a comma list "
                         f"of {', '.join(PROTOCOLS)}, or '^' and at most two of them")
    return enabled


def check_cluster_spec(spec: ClusterSpec, *, where: str = "") -> ClusterSpec:
    """``spec`` if a preset file could hold it: the same schema (types, ranges, largest
    plausible values) and the same cross-field rules as :func:`load_cluster`, applied to
    a spec built another way (a calibration file sets SI fields directly, and must not
    set what a preset may not, e.g. ``scale_up.domain_gpus = 0``).

    Raises:
        ValueError: one line naming the field as a preset TOML key (``hbm_gb``,
            ``kernel_launch_us``, ...), the value and what is valid, then ``where``.
    """
    try:
        _build(_spec_data(spec), {})
    except ValueError as problem:
        raise ValueError(f"{problem}{f' ({where})' if where else ''}") from None
    return spec


def _spec_data(spec: ClusterSpec) -> dict[str, Any]:
    """The preset TOML data of ``spec``: the inverse of :func:`_build`'s unit conversion."""
    us = 1e6
    g, up, nic, fab, comm = spec.gpu, spec.scale_up, spec.nic, spec.fabric, spec.comm
    scale_up = {"kind": up.kind, "domain_gpus": up.domain_gpus,
                "nvlink_generation": up.nvlink_generation,
                "nvlink_links_per_gpu": up.nvlink_links_per_gpu,
                "nvlink_gb_per_s_per_link": up.nvlink_bytes_per_s_per_link / GB,
                "link_efficiency": up.link_efficiency, "nvls": up.nvls,
                "pcie_generation": up.pcie_generation, "pcie_lanes": up.pcie_lanes,
                "pcie_gb_per_s": up.pcie_bytes_per_s / GB}
    if up.nvls:
        scale_up["nvls_efficiency"] = up.nvls_efficiency
    return {
        "name": spec.name, "description": spec.description,
        "gpus_per_node": spec.gpus_per_node, "max_nodes": spec.max_nodes,
        "gpu": {"name": g.name, "peak_flops_per_s": dict(g.peak_flops_per_s),
                "hbm_gb": g.hbm_bytes / GB, "hbm_gb_per_s": g.hbm_bytes_per_s / GB,
                "matmul_profile": g.matmul_profile,
                "matmul_peak_efficiency": g.matmul_peak_efficiency,
                "memory_efficiency": g.memory_efficiency,
                "kernel_launch_us": g.kernel_launch_s * us,
                "sustained_fraction": g.sustained_fraction, "sm_count": g.sm_count,
                "memory_reserve_gib": g.memory_reserve_bytes / GIB,
                "host_cpu": g.host_cpu, "compute_capability": g.compute_capability,
                "speed_spread": g.speed_spread},
        "scale_up": scale_up,
        "nic": {"count_per_node": nic.count_per_node, "gbit_per_s": nic.gbit_per_s,
                "kind": nic.kind, "gpudirect_rdma": nic.gpudirect_rdma,
                "link_efficiency": nic.link_efficiency, "gpu_path": nic.gpu_path,
                "net_latency_us": nic.net_latency_s * us},
        "fabric": {"topology": fab.topology, "tiers": fab.tiers,
                   "nodes_per_leaf": fab.nodes_per_leaf,
                   "leaves_per_spine_group": fab.leaves_per_spine_group,
                   "oversubscription": fab.oversubscription,
                   "switch_hop_latency_us": fab.switch_hop_latency_s * us},
        "comm": {"base_latency_us": {a: {p: v * us for p, v in t.items()}
                                     for a, t in comm.base_latency_s.items()},
                 "hop_latency_us": {a: {p: v * us for p, v in t.items()}
                                    for a, t in comm.hop_latency_s.items()},
                 "protocol_efficiency": {a: dict(t) for a, t in
                                         comm.protocol_efficiency.items()},
                 "p2p_efficiency": dict(comm.p2p_efficiency),
                 "protocol_max_bytes": dict(comm.protocol_max_bytes),
                 "ll_max_gb_per_s": {b: v / GB for b, v in
                                     comm.ll_max_bus_bytes_per_s.items()},
                 "channel_max_gb_per_s": {
                     f: {p: {b: v / GB for b, v in t.items()} for p, t in by_proto.items()}
                     for f, by_proto in comm.channel_max_bus_bytes_per_s.items()},
                 "rail_channels": comm.rail_channels,
                 "domain_channels": comm.domain_channels,
                 "collective_channels": comm.collective_channels,
                 "channel_threshold_bytes": dict(comm.channel_threshold_bytes),
                 "p2p_net_channel_gb_per_s": comm.p2p_net_channel_bytes_per_s / GB,
                 "p2p_net_channels_per_peer": comm.p2p_net_channels_per_peer,
                 "p2p_channels": comm.p2p_channels,
                 "p2p_peers_per_channel": comm.p2p_peers_per_channel,
                 "net_step_overhead_us": {p: v * us for p, v in
                                          comm.net_step_overhead_s.items()},
                 "ring_step_pacing_us": {p: v * us for p, v in
                                         comm.ring_step_pacing_s.items()},
                 "ring_plateau_factor": comm.ring_plateau_factor,
                 "tree_chunk_bytes": comm.tree_chunk_bytes,
                 "nvls_chunk_bytes": comm.nvls_chunk_bytes,
                 "nvls_channels": comm.nvls_channels,
                 "nvls_channels_multi_domain": comm.nvls_channels_multi_domain,
                 "nccl_proto": ",".join(comm.nccl_proto)},
    }


def _plain(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _file_sources(layer: Mapping[str, Any], text: str) -> dict[str, str]:
    """``{leaf dotted key: citation}`` from the ``# source:`` comments of one file.

    A comment applies to the key on its own line or to the line directly
    below it; on a table header or an inline table it covers every leaf below.
    """
    by_prefix = source_comments(text)
    out = {}
    for leaf in _leaves(layer):
        parts = leaf.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in by_prefix:
                out[leaf] = by_prefix[".".join(parts[:n])]
                break
    return out
