"""Tests for hardware.catalog: presets, sources, inheritance, overrides, errors."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import one_line_error as _error
from hypothesis import given
from hypothesis import strategies as st

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from hardware.catalog import (
    CATALOG_DIR,
    cluster_to_dict,
    list_presets,
    load_cluster,
    parse_override,
    preset_sources,
)
from hardware.spec import FABRIC_TOPOLOGIES, NIC_KINDS, SCALE_UP_KINDS, ClusterSpec

PRESETS = [
    "dgx-a100",
    "dgx-a100-40gb",
    "dgx-b200",
    "dgx-h100",
    "dgx-h100-roce",
    "dgx-h800",
    "gb200-nvl72",
    "gcp-a3-mega",
    "grand-teton-h100-96gb",
    "hgx-h200",
    "polaris",
]
PRESET_FILES = sorted(p for p in CATALOG_DIR.glob("*.toml") if not p.name.startswith("_"))



# ---------------------------------------------------------------------------- presets


def test_list_presets_is_sorted_and_excludes_private_files():
    assert list_presets() == PRESETS
    assert "_defaults" not in list_presets()


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads(name):
    spec = load_cluster(name)
    assert isinstance(spec, ClusterSpec)
    assert spec.name == name
    assert spec.description
    assert spec.scale_up.domain_gpus % spec.gpus_per_node == 0
    assert spec.gpu.peak_flops_per_s["bf16"] > 0
    assert 0 < spec.scale_up.link_efficiency <= 1
    assert 0 < spec.nic.link_efficiency <= 1
    assert spec.fabric.topology in FABRIC_TOPOLOGIES
    # JSON round trip of the dict form.
    as_dict = cluster_to_dict(spec)
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["scale_up"]["nvlink_bytes_per_s_per_link"] == spec.scale_up.nvlink_bytes_per_s_per_link


def test_dgx_h100_numbers():
    spec = load_cluster("dgx-h100")
    assert spec.gpus_per_node == 8
    assert spec.scale_up.nvlink_bytes_per_s == pytest.approx(450e9)
    assert spec.nic.gbit_per_s == 400
    assert spec.nic.bytes_per_s == pytest.approx(50e9)
    assert spec.nic.count_per_node == 8
    assert spec.gpu.hbm_bytes == 81559 * 2**20  # what nvidia-smi reports: 79.6 GiB
    assert spec.gpu.sm_count == 132 and spec.gpu.memory_reserve_bytes == 2 * 2**30
    assert spec.gpu.hbm_bytes_per_s == pytest.approx(3.35e12)
    assert spec.gpu.peak_flops_per_s["bf16"] == pytest.approx(989e12)
    assert spec.gpu.peak_flops_per_s["fp8"] == pytest.approx(1979e12)
    assert spec.gpu.matmul_profile == "sm_90"
    assert spec.gpu.matmul_peak_efficiency == pytest.approx(0.803)
    assert spec.gpu.kernel_launch_s == pytest.approx(4e-6)
    assert spec.scale_up.nvls and spec.scale_up.nvls_efficiency == pytest.approx(0.61)
    assert spec.scale_up.link_efficiency == pytest.approx(0.82)
    assert spec.scale_up.pcie_bytes_per_s == pytest.approx(63e9)
    assert spec.fabric.switch_hop_latency_s == pytest.approx(0.13e-6)
    assert spec.fabric.nodes_per_leaf * spec.fabric.leaves_per_spine_group >= spec.max_nodes
    # comm comes from _defaults.toml, converted from microseconds.
    assert spec.comm.hop_latency_s["network"]["Simple"] == pytest.approx(14e-6)
    assert spec.comm.base_latency_s["ring"]["LL"] == pytest.approx(24e-6)
    assert spec.comm.protocol_efficiency["nvlink"]["LL128"] == pytest.approx(0.9375)


def test_other_preset_numbers():
    a100 = load_cluster("dgx-a100")
    assert a100.scale_up.nvlink_bytes_per_s == pytest.approx(300e9)
    assert a100.nic.bytes_per_s == pytest.approx(25e9)
    assert a100.scale_up.pcie_bytes_per_s == pytest.approx(31.5e9)
    assert not a100.scale_up.nvls and a100.scale_up.nvls_efficiency == 0.0
    assert a100.gpu.matmul_peak_efficiency == pytest.approx(0.869)

    h200 = load_cluster("hgx-h200")
    assert h200.gpu.hbm_bytes == 143771 * 2**20
    assert h200.gpu.hbm_bytes_per_s == pytest.approx(4.8e12)

    b200 = load_cluster("dgx-b200")
    assert b200.gpu.hbm_bytes == 183359 * 2**20
    assert b200.scale_up.nvlink_bytes_per_s == pytest.approx(900e9)
    assert b200.gpu.peak_flops_per_s["fp4"] == pytest.approx(9e15)
    assert b200.scale_up.nvls_efficiency == pytest.approx(0.537)

    nvl72 = load_cluster("gb200-nvl72")
    assert (nvl72.gpus_per_node, nvl72.scale_up.domain_gpus) == (4, 72)
    assert nvl72.nic.count_per_node == 4
    assert nvl72.gpu.peak_flops_per_s["bf16"] == pytest.approx(2.5e15)
    assert nvl72.gpu.matmul_peak_efficiency == pytest.approx(0.729)

    a3 = load_cluster("gcp-a3-mega")
    assert (a3.nic.kind, a3.nic.gpudirect_rdma, a3.nic.count_per_node) == ("tcp", True, 8)
    assert a3.nic.bytes_per_s == pytest.approx(25e9)
    assert not a3.scale_up.nvls
    assert a3.fabric.topology == "fat-tree"


# ---------------------------------------------------------------------------- sources

_NUMBER_RE = re.compile(r"=\s*[-+]?(?:\d|\.\d|inf\b|nan\b)")


def _code(line: str) -> str:
    """The part of a TOML line before its comment (no '#' inside strings here)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_every_number_has_a_source_comment(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    missing = []
    for i, line in enumerate(lines):
        if line.strip().startswith("#") or not _NUMBER_RE.search(_code(line)):
            continue
        same_line = "# source:" in line[len(_code(line)):]
        above = i > 0 and lines[i - 1].strip().startswith("# source:")
        if not (same_line or above):
            missing.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not missing, "numbers without a '# source:' comment:\n" + "\n".join(missing)


def _numeric_leaves(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _numeric_leaves(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_sources_cover_every_number(name):
    own = tomllib.loads((CATALOG_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    sources = preset_sources(name)
    for key in _numeric_leaves(own):
        assert sources.get(key, "").strip(), f"{name}: no source for {key}"
        assert not sources[key].startswith("hardware/catalog/_defaults.toml"), key
    # The spec carries the same map, and every leaf (defaults included) has one.
    spec = load_cluster(name)
    assert dict(spec.sources) == sources
    assert "comm.hop_latency_us.nvlink.LL" in spec.sources


def test_sources_text():
    sources = preset_sources("dgx-h100")
    assert "nccl-tests#212" in sources["scale_up.link_efficiency"]
    assert "794.5" in sources["gpu.matmul_peak_efficiency"]
    assert "nccl-tests#290" in sources["nic.link_efficiency"]


# ---------------------------------------------------------------------------- inheritance


def _flat(data, prefix=""):
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_roce_differs_from_h100_only_in_what_it_overrides():
    base = cluster_to_dict(load_cluster("dgx-h100"))
    roce = cluster_to_dict(load_cluster("dgx-h100-roce"))
    base.pop("sources"), roce.pop("sources")
    flat_base, flat_roce = _flat(base), _flat(roce)
    assert flat_base.keys() == flat_roce.keys()
    changed = {k for k in flat_base if flat_base[k] != flat_roce[k]}
    assert changed == {
        "name",
        "description",
        "nic.kind",
        "nic.link_efficiency",
        "fabric.switch_hop_latency_s",
    }
    assert flat_roce["nic.kind"] == "roce"
    assert flat_roce["nic.link_efficiency"] < flat_base["nic.link_efficiency"]
    assert flat_roce["fabric.switch_hop_latency_s"] > flat_base["fabric.switch_hop_latency_s"]


def test_roce_sources_mix_own_and_inherited():
    sources = preset_sources("dgx-h100-roce")
    assert "RoCEv2" in sources["nic.link_efficiency"]
    assert sources["nic.gbit_per_s"] == preset_sources("dgx-h100")["nic.gbit_per_s"]


# ---------------------------------------------------------------------------- overrides


def test_overrides_apply_with_unit_conversion():
    spec = load_cluster(
        "dgx-h100",
        {
            "nic.gbit_per_s": 200,
            "fabric.oversubscription": 2,
            "gpu.peak_flops_per_s.bf16": 1e15,
            "scale_up.nvls": False,
            "comm.hop_latency_us.network.Simple": 10,
            "fabric.switch_hop_latency_us": 1,
            "gpu.hbm_gb": 96,
        },
    )
    assert spec.nic.bytes_per_s == pytest.approx(25e9)
    assert spec.fabric.oversubscription == 2.0 and isinstance(spec.fabric.oversubscription, float)
    assert spec.gpu.peak_flops_per_s["bf16"] == 1e15
    assert spec.gpu.peak_flops_per_s["fp8"] == pytest.approx(1979e12)  # untouched sibling
    assert not spec.scale_up.nvls and spec.scale_up.nvls_efficiency == 0.0
    assert spec.comm.hop_latency_s["network"]["Simple"] == pytest.approx(10e-6)
    assert spec.comm.hop_latency_s["network"]["LL"] == pytest.approx(2.7e-6)  # untouched sibling
    assert spec.fabric.switch_hop_latency_s == pytest.approx(1e-6)
    assert spec.gpu.hbm_bytes == 96_000_000_000
    assert spec.sources["nic.gbit_per_s"].startswith("override")
    # Loading again is unaffected (no shared mutable state).
    assert load_cluster("dgx-h100").nic.gbit_per_s == 400


def test_table_override_and_string_values():
    spec = load_cluster("dgx-h100", {"nic": {"gbit_per_s": 800}, "fabric.tiers": "3", "gpu.name": 100})
    assert spec.nic.gbit_per_s == 800
    assert spec.fabric.tiers == 3
    assert spec.gpu.name == "100"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nic.gbit_per_s=200", ("nic.gbit_per_s", 200)),
        ("fabric.oversubscription = 1.5", ("fabric.oversubscription", 1.5)),
        ("gpu.peak_flops_per_s.bf16=1e15", ("gpu.peak_flops_per_s.bf16", 1e15)),
        ("scale_up.nvls=false", ("scale_up.nvls", False)),
        ("nic.gpudirect_rdma=True", ("nic.gpudirect_rdma", True)),
        ("nic.kind=roce", ("nic.kind", "roce")),
        ('gpu.name="X 1"', ("gpu.name", "X 1")),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


def test_parse_override_feeds_load_cluster():
    overrides = dict(parse_override(t) for t in ["nic.gbit_per_s=200", "scale_up.nvls=false"])
    spec = load_cluster("dgx-h100", overrides)
    assert spec.nic.gbit_per_s == 200 and not spec.scale_up.nvls


@pytest.mark.parametrize("text", ["nic.gbit_per_s", "=200", ""])
def test_parse_override_rejects_malformed(text):
    assert "KEY=VALUE" in _error(parse_override, text)


@given(st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False)))
def test_parse_override_round_trips_numbers(value):
    key, parsed = parse_override(f"nic.gbit_per_s={value!r}")
    assert key == "nic.gbit_per_s"
    assert parsed == value and type(parsed) is type(value)


# ---------------------------------------------------------------------------- errors


def test_unknown_preset_lists_valid_presets():
    message = _error(load_cluster, "dgx-h900")
    assert message.startswith("cluster: 'dgx-h900' is not a preset; valid: dgx-a100, dgx-a100-40gb, dgx-b200, dgx-h100")
    for name in PRESETS:
        assert name in message
    assert "_defaults" not in message
    assert "dgx-h900" in _error(preset_sources, "dgx-h900")


def test_missing_file():
    assert "not found" in _error(load_cluster, "/nonexistent/cluster.toml")


def test_unknown_override_key_lists_valid_keys_of_that_table():
    message = _error(load_cluster, "dgx-h100", {"nic.gbps": 200})
    assert message.startswith("nic.gbps: unknown override key")
    for key in ("count_per_node", "gbit_per_s", "kind", "gpudirect_rdma", "link_efficiency"):
        assert key in message
    message = _error(load_cluster, "dgx-h100", {"netwrk.x": 1})
    assert "netwrk.x" in message and "scale_up" in message and "fabric" in message
    message = _error(load_cluster, "dgx-h100", {"comm.hop_latency_us.infiniband.LL": 1})
    assert "nvlink, pcie, network" in message
    message = _error(load_cluster, "dgx-h100", {"gpu.peak_flops_per_s.int8": 1e15})
    assert "fp4" in message and "bf16" in message
    assert "is a value" in _error(load_cluster, "dgx-h100", {"nic.kind.x": 1})
    assert "extends" in _error(load_cluster, "dgx-h100", {"extends": "dgx-a100"})


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("nic.gbit_per_s", "fast", ["nic.gbit_per_s", "'fast'", "expected a number"]),
        ("nic.gbit_per_s", True, ["nic.gbit_per_s", "True", "expected a number"]),
        ("nic.count_per_node", 2.5, ["nic.count_per_node", "2.5", "expected an integer"]),
        ("scale_up.nvls", 1, ["scale_up.nvls", "expected true or false"]),
        ("gpu.matmul_profile", True, ["gpu.matmul_profile", "is a boolean", "expected a string"]),
        ("nic.gbit_per_s", 0, ["nic.gbit_per_s", "0", "> 0"]),
        ("gpu.hbm_gb_per_s", -1, ["gpu.hbm_gb_per_s", "-1", "> 0"]),
        ("scale_up.nvlink_gb_per_s_per_link", 0, ["scale_up.nvlink_gb_per_s_per_link", "> 0", "pcie"]),
        ("gpu.peak_flops_per_s.bf16", float("inf"), ["gpu.peak_flops_per_s.bf16", "finite"]),
        ("nic.link_efficiency", 1.5, ["nic.link_efficiency", "1.5", "(0, 1]"]),
        ("scale_up.nvls_efficiency", 0, ["scale_up.nvls_efficiency", "(0, 1]"]),
        ("comm.p2p_efficiency.network", 0, ["comm.p2p_efficiency.network", "(0, 1]"]),
        ("comm.hop_latency_us.nvlink.LL", -1, ["comm.hop_latency_us.nvlink.LL", ">= 0"]),
        ("fabric.oversubscription", 0.5, ["fabric.oversubscription", "0.5", ">= 1"]),
        ("fabric.tiers", 4, ["fabric.tiers", "4", "valid: 1, 2, 3"]),
        ("scale_up.kind", "torus", ["scale_up.kind", "'torus'", ", ".join(SCALE_UP_KINDS)]),
        ("nic.kind", "omnipath", ["nic.kind", "'omnipath'", ", ".join(NIC_KINDS)]),
        ("fabric.topology", "dragonfly", ["fabric.topology", "'dragonfly'", ", ".join(FABRIC_TOPOLOGIES)]),
        ("scale_up.domain_gpus", 12, ["scale_up.domain_gpus", "12", "multiple of gpus_per_node", "16"]),
        ("nic", 5, ["nic", "5", "is a table"]),
    ],
)
def test_bad_override_values(key, value, words):
    message = _error(load_cluster, "dgx-h100", {key: value})
    for word in words:
        assert word in message, (word, message)


# ---------------------------------------------------------------------------- user files


def test_user_file_extending_a_builtin(tmp_path):
    path = tmp_path / "my-h100.toml"
    path.write_text(
        'extends = "dgx-h100"\n'
        'description = "DGX H100 with half the NICs"\n'
        "[nic]\n"
        "count_per_node = 4  # source: our cluster\n"
    )
    spec = load_cluster(str(path))
    assert spec.name == "my-h100"  # name is not inherited: defaults to the file stem
    assert spec.nic.count_per_node == 4
    assert spec.nic.gbit_per_s == 400
    assert spec.sources["nic.count_per_node"] == "our cluster"
    assert load_cluster(path, {"nic.count_per_node": 2}).nic.count_per_node == 2


def test_user_file_chain_relative_extends(tmp_path):
    (tmp_path / "base.toml").write_text('extends = "dgx-a100"\nname = "base"\nmax_nodes = 4\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "top.toml").write_text('extends = "../base.toml"\nname = "top"\n[fabric]\ntiers = 1\n')
    spec = load_cluster(str(sub / "top.toml"))
    assert (spec.name, spec.max_nodes, spec.fabric.tiers, spec.gpu.name) == ("top", 4, 1, "A100-SXM4-80GB")


def test_an_edited_preset_file_is_read_again_and_overrides_do_not_leak(tmp_path):
    """Presets are parsed once per process (hardware.catalog._RESOLVED) but a file edited
    since, its base included, is read again, and a load's overrides stay its own."""
    import os

    base, top = tmp_path / "base.toml", tmp_path / "top.toml"
    base.write_text('extends = "dgx-h100"\nmax_nodes = 4\n')
    top.write_text('extends = "base.toml"\n[nic]\ncount_per_node = 4\n')
    assert (load_cluster(top).max_nodes, load_cluster(top).nic.count_per_node) == (4, 4)
    assert load_cluster(top, {"nic.count_per_node": 2}).nic.count_per_node == 2
    assert load_cluster(top).nic.count_per_node == 4
    stamp = base.stat().st_mtime_ns
    base.write_text('extends = "dgx-h100"\nmax_nodes = 8\n')
    os.utime(base, ns=(stamp + 10**9, stamp + 10**9))  # (a coarse clock may not tick)
    assert load_cluster(top).max_nodes == 8


def test_extends_cycle(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    assert "cycle" in _error(load_cluster, str(tmp_path / "a.toml"))


def test_standalone_user_file_pcie_box(tmp_path):
    path = tmp_path / "pcie-box.toml"
    path.write_text(
        """
name = "pcie-box"
description = "4x PCIe GPUs, one 100G NIC"
gpus_per_node = 4
max_nodes = 2
[gpu]
name = "X"
hbm_gb = 48
hbm_gb_per_s = 864
matmul_profile = "sm_89"
matmul_peak_efficiency = 0.7
memory_efficiency = 0.9
kernel_launch_us = 5
[gpu.peak_flops_per_s]
bf16 = 181e12
[scale_up]
kind = "pcie"
domain_gpus = 4
link_efficiency = 0.8
nvls = false
pcie_generation = 4
pcie_lanes = 16
[nic]
count_per_node = 1
gbit_per_s = 100
kind = "roce"
gpudirect_rdma = false
link_efficiency = 0.9
[fabric]
topology = "fat-tree"
tiers = 1
nodes_per_leaf = 2
leaves_per_spine_group = 1
oversubscription = 1
switch_hop_latency_us = 0.6
"""
    )
    spec = load_cluster(str(path))
    assert spec.scale_up.nvlink_bytes_per_s == 0
    assert spec.scale_up.pcie_bytes_per_s == pytest.approx(16 * 16e9 * 128 / 130 / 8)
    assert spec.gpu.hbm_bytes == 48_000_000_000
    assert spec.gpu.kernel_launch_s == pytest.approx(5e-6)
    assert spec.comm.p2p_efficiency["nvlink"] == pytest.approx(0.83)  # from _defaults.toml


def test_missing_required_field_is_named(tmp_path):
    path = tmp_path / "partial.toml"
    path.write_text('description = "no hardware"\ngpus_per_node = 8\nmax_nodes = 1\n')
    message = _error(load_cluster, str(path))
    assert "missing required" in message and "gpu" in message
    path.write_text('extends = "dgx-h100"\n[gpu]\nname = "X"\n')
    assert load_cluster(str(path)).gpu.name == "X"


def test_nvls_true_needs_efficiency(tmp_path):
    path = tmp_path / "a100-nvls.toml"
    path.write_text('extends = "dgx-a100"\n[scale_up]\nnvls = true\n')
    message = _error(load_cluster, str(path))
    assert message.startswith("scale_up.nvls_efficiency: missing required field")


def test_unknown_key_in_file_names_the_file(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text('extends = "dgx-h100"\n[nic]\ngbps = 400\n')
    message = _error(load_cluster, str(path))
    assert message.startswith("nic.gbps: unknown key") and "gbit_per_s" in message and "typo.toml" in message


def test_invalid_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[nic\ncount = \n")
    assert "not valid TOML" in _error(load_cluster, str(path))


def test_loader_uses_no_assert_for_validation():
    source = (CATALOG_DIR / "__init__.py").read_text(encoding="utf-8")
    assert not re.search(r"^\s*assert\b", source, re.MULTILINE)


def test_builtin_names_match_file_stems():
    for path in PRESET_FILES:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        assert data["name"] == path.stem
        assert not math.isnan(load_cluster(path.stem).gpu.hbm_bytes)
