"""A cluster preset as the fields ``--set`` takes: TOML key, value in the key's unit, source.

A preset file names its numbers with their unit (``gpu.hbm_gb``, ``kernel_launch_us``);
the loader converts them once into SI fields (``GpuSpec.hbm_bytes``,
``kernel_launch_s``). ``trainsim hardware show`` prints the file's names, so that what
it shows can be given back to ``--set`` as shown. :func:`preset_fields` walks every key
of the preset schema and takes its value from the preset as the loader merged it
(``_defaults.toml``, the presets it extends, the file, then the ``--set`` overrides), with
the source of each number:

* the ``# source:`` comment of the preset (or of a preset it extends);
* ``hardware/catalog/_defaults.toml`` for the communication defaults;
* ``override: key=value`` for a ``--set``;
* for a key no file sets, what the loader puts there (a PCIe rate derived from the
  generation and lanes, or its default), read back from the loaded spec where the SI
  field's name follows from the key's (``_gb`` -> ``_bytes``, ``_us`` -> ``_s``, ...).

The merged data comes from the catalog's ``_resolve`` and ``_apply_override``, the very
functions :func:`hardware.catalog.load_cluster` runs (the catalog has no public reader of
the merged data yet), after ``load_cluster`` has checked the preset and the overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from hardware import catalog
from hardware.catalog import SCHEMA, load_cluster
from hardware.spec import ClusterSpec

__all__ = ["PresetField", "preset_fields", "preset_tree"]

#: Units in TOML key names: (TOML word, SI word, SI value -> TOML value factor); the
#: word ends the name or is followed by another ``_`` word (``nvlink_gb_per_s_per_link``).
_UNITS = (("_gb_per_s", "_bytes_per_s", 1e-9), ("_gb", "_bytes", 1e-9),
          ("_gib", "_bytes", 2.0**-30), ("_us", "_s", 1e6))
#: SI fields whose names say more than the unit (NCCL's bus-bandwidth ceilings).
_ALIASES = {"ll_max_gb_per_s": ("ll_max_bus_bytes_per_s", 1e-9),
            "channel_max_gb_per_s": ("channel_max_bus_bytes_per_s", 1e-9)}
#: Text fields (no number to cite): where they come from.
_TEXT = {"name": "the preset's name", "description": "the preset's description",
         "gpu.name": "the preset's GPU name"}


@dataclass(frozen=True)
class PresetField:
    """One leaf of a preset: ``key`` as ``--set`` takes it, its ``value`` in the key's
    unit, and ``source`` (a citation, or what the loader did)."""

    key: str
    value: Any
    source: str


def _leaf_keys(schema: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, sub in schema.items():
        if name == "extends":
            continue
        if isinstance(sub, Mapping):
            yield from _leaf_keys(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def _lookup(data: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _si_name(node: Any, part: str) -> tuple[str, float]:
    """The SI field of ``node`` that TOML name ``part`` converts to, and the factor
    from SI back to the TOML unit (1 when the names are the same)."""
    if part in _ALIASES:
        return _ALIASES[part]
    if hasattr(node, part) or isinstance(node, Mapping):
        return part, 1.0
    for word, si_word, scale in _UNITS:
        at = (part + "_").find(word + "_")
        if at >= 0:
            return part[:at] + si_word + part[at + len(word):], scale
    return part, 1.0


def _loaded_value(spec: ClusterSpec, key: str) -> tuple[bool, Any]:
    """``(found, value in the key's unit)`` of a key no file sets, from the SI spec."""
    node: Any = spec
    factor = 1.0
    for part in key.split("."):
        name, scale = _si_name(node, part)
        factor = scale if scale != 1.0 else factor
        if isinstance(node, Mapping):
            if name not in node:
                return False, None
            node = node[name]
        elif hasattr(node, name):
            node = getattr(node, name)
        else:
            return False, None
    if isinstance(node, Mapping):
        return False, None
    if isinstance(node, tuple) and all(isinstance(item, str) for item in node):
        return True, ",".join(node)  # a name list as a file writes it (comm.nccl_proto)
    if isinstance(node, bool) or not isinstance(node, (int, float)) or factor == 1.0:
        return True, node
    rounded = float(f"{node * factor:.12g}")  # the decimal a file would hold
    return True, int(rounded) if rounded.is_integer() else rounded


def _fallback_source(key: str, spec: ClusterSpec) -> str:
    if key in _TEXT:
        return _TEXT[key]
    if key == "scale_up.pcie_gb_per_s":
        return (f"derived: PCIe gen {spec.scale_up.pcie_generation} x "
                f"{spec.scale_up.pcie_lanes} lanes at the PCI-SIG rate per lane "
                "(hardware/catalog PCIE_GB_PER_S_PER_LANE)")
    return "not in the preset: the loader's default (hardware/catalog/__init__.py)"


def preset_fields(cluster: str, overrides: Mapping[str, object] | None = None
                  ) -> list[PresetField]:
    """Every field of a preset (after ``overrides``), in schema order, as ``--set`` names
    it, with the source of every value. Keys with nothing to show are left out: an
    optional table no file fills, the NVLS efficiency of a preset without NVLS.

    Raises:
        ValueError: unknown preset or bad override (one line).
    """
    spec = load_cluster(cluster, overrides)  # checks the preset and the overrides
    data, sources = catalog._resolve(cluster)
    for key, value in (overrides or {}).items():
        catalog._apply_override(data, sources, str(key), value)
    out = []
    for key in _leaf_keys(SCHEMA):
        found, value = _lookup(data, key)
        if found:
            out.append(PresetField(key, value, sources.get(key) or _fallback_source(key,
                                                                                    spec)))
            continue
        found, value = _loaded_value(spec, key)
        if not found or (key == "scale_up.nvls_efficiency" and not spec.scale_up.nvls):
            continue
        out.append(PresetField(key, value, _fallback_source(key, spec)))
    return out


def preset_tree(fields: list[PresetField]) -> dict[str, Any]:
    """The fields as nested tables, as a preset file lays them out, plus ``sources``
    (``{key: source}``): JSON that reads like the TOML it came from."""
    tree: dict[str, Any] = {}
    for item in fields:
        *tables, leaf = item.key.split(".")
        node = tree
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = item.value
    tree["sources"] = {item.key: item.source for item in fields}
    return tree
