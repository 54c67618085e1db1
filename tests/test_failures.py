"""strategies.failures: profiles and their derivation, job units, costs, closed forms, errors."""

from __future__ import annotations

import csv
import math
import re

import pytest

from conftest import expect_one_line_error as _one_line_error

from conftest import DATA
from hardware.catalog import load_cluster
from sim.checkpoint_costs import checkpoint_costs
from strategies import failures as fl
from strategies.memory import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES_PER_PARAM
from strategies.model_costs import param_counts
from strategies.models import load_model

H100 = load_cluster("dgx-h100")
LLAMA3_GPUS, LLAMA3_HOURS, LLAMA3_INTERRUPTIONS = 16384, 54 * 24, 419
PROFILE_FILES = sorted(fl.PROFILES_DIR.glob("*.toml"))


# ---------------------------------------------------------------------------- profiles


def test_builtin_profiles():
    assert fl.list_profiles() == ["llama3-h100", "meta-rsc"]
    for name in fl.list_profiles():
        profile = fl.load_profile(name)
        assert profile.name == name and profile.description
        assert all(c.rate_per_unit_hour > 0 for c in profile.classes)


def test_llama3_profile_reproduces_table5_exactly():
    """rate = count / (16,384 GPUs x 54 days): the profile's expected count on the Llama 3
    job is 419, and each class is the sum of its Table 5 rows."""
    profile = fl.load_profile("llama3-h100")
    units = fl.job_units(H100, LLAMA3_GPUS)
    expected = {name: rate * LLAMA3_HOURS for name, rate in profile.rates_per_hour(units).items()}
    assert sum(expected.values()) == pytest.approx(LLAMA3_INTERRUPTIONS, rel=1e-12)
    assert expected["gpu"] == pytest.approx(148 + 19 + 17 + 6 + 6)
    assert expected["hbm"] == pytest.approx(72)
    assert expected["network_link"] + expected["network_switch"] == pytest.approx(35)
    assert all(c.unit == "gpu" for c in profile.classes)
    # MTBF of the Llama 3 job: 54 days / 419 = 3.09 h.
    assert profile.mtbf_s(units) == pytest.approx(LLAMA3_HOURS * 3600 / 419)


def test_llama3_class_mapping_covers_every_table5_row_once():
    path = DATA / "failures" / "llama3_405b_table5_interruptions.csv"
    with open(path, newline="") as handle:
        rows = {r["component"]: int(r["interruption_count"]) for r in csv.DictReader(handle)}
    assert sum(rows.values()) == LLAMA3_INTERRUPTIONS
    profile = fl.load_profile("llama3-h100")
    units = fl.job_units(H100, LLAMA3_GPUS)
    rates = profile.rates_per_hour(units)
    mapped: dict[str, str] = {}
    for cls in profile.classes:
        for comp in cls.components:
            row = comp.split(" (")[0]          # "Network Switch/Cable (links: ...)" -> row
            assert row in rows, f"{cls.name}: {comp!r} is not a Table 5 row"
            mapped.setdefault(row, cls.name)
        whole = [c.split(" (")[0] for c in cls.components if "(" not in c]
        if whole and len(whole) == len(cls.components):
            assert rates[cls.name] * LLAMA3_HOURS == pytest.approx(sum(rows[r] for r in whole))
    assert set(mapped) == set(rows)


def test_llama3_switch_split_follows_its_derivation():
    """12.2 switch failures = 1,024 ToRs x -ln(0.98)/(365.25/4 days) x 54 days (header)."""
    expected = 1024 * (-math.log(0.98) / (365.25 / 4)) * 54
    profile = fl.load_profile("llama3-h100")
    rates = profile.rates_per_hour(fl.job_units(H100, LLAMA3_GPUS))
    assert rates["network_switch"] * LLAMA3_HOURS == pytest.approx(expected, abs=0.05)
    blasts = {c.name: c.blast for c in profile.classes}
    assert blasts["network_switch"] == "switch" and blasts["gpu"] == "node"
    assert blasts["software"] == "restart"


def test_meta_rsc_mtbf_matches_kokolis_projections():
    """6.50 failures / 1000 node-days -> job MTBF 1.8 h at 16,384 GPUs and 0.23 h at
    131,072 GPUs (meta_rsc_reliability_kokolis2025.csv, projected rows)."""
    profile = fl.load_profile("meta-rsc")
    big = load_cluster("dgx-a100", {"max_nodes": 16384})
    assert profile.mtbf_s(fl.job_units(big, 16384)) / 3600 == pytest.approx(1.8, abs=0.01)
    assert profile.mtbf_s(fl.job_units(big, 131072)) / 3600 == pytest.approx(0.23, abs=0.01)
    # Per node-hour exactly 6.50 / 1000 / 24, whatever the split.
    total = sum(c.rate_per_unit_hour for c in profile.classes)
    assert total == pytest.approx(6.50 / 1000 / 24, rel=1e-6)
    assert all(c.unit == "node" for c in profile.classes)


_NUMBER_RE = re.compile(r"=\s*[-+]?(?:\d|\.\d)")


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_number_in_profile_files_has_a_source(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    missing = []
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if line.strip().startswith("#") or not _NUMBER_RE.search(code):
            continue
        same_line = "# source:" in line
        above = i > 0 and lines[i - 1].strip().startswith("# source:")
        if not (same_line or above):
            missing.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not missing, "numbers without a '# source:' comment:\n" + "\n".join(missing)


def test_profile_sources_are_attached():
    profile = fl.load_profile("llama3-h100")
    assert "Table 5" in profile.sources["classes.gpu.count"]
    assert "Singh" in profile.sources["classes.network_switch.count"]
    assert "Kokolis" in fl.profile_sources("meta-rsc")["total_rate_per_unit_hour"]
    responses = fl.load_responses()
    assert "Llama 3" in responses.sources["storage_write_bytes_per_s_total"]
    assert all(responses.sources.get(k) for k in ("detection_s", "reinit_s",
                                                    "checkpoint_fixed_s"))


def test_user_profile_from_dict_and_toml(tmp_path):
    data = {"name": "mine", "unit": "node", "exposure": {"units": 100, "hours": 10},
            "classes": {"gpu": {"count": 5, "blast": "node"},
                        "sw": {"rate_per_unit_hour": 0.5, "unit": "job", "blast": "restart",
                               "distribution": "weibull", "weibull_shape": 0.7}}}
    profile = fl.load_profile(data)
    assert profile.classes[0].rate_per_unit_hour == pytest.approx(5 / 1000)
    assert profile.classes[1].distribution == "weibull"
    units = fl.job_units(H100, 64)
    assert profile.rates_per_hour(units) == pytest.approx({"gpu": 8 * 5 / 1000, "sw": 0.5})
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[classes.gpu]\nrate_per_unit_hour = 1e-5\nblast = "switch"\n')
    loaded = fl.load_profile(str(path))
    assert loaded.classes[0].blast == "switch" and loaded.classes[0].unit == "gpu"
    shares = fl.load_profile({"unit": "node", "total_rate_per_unit_hour": 1.0,
                              "classes": {"a": {"share": 3}, "b": {"share": 1}}})
    assert [c.rate_per_unit_hour for c in shares.classes] == pytest.approx([0.75, 0.25])


def test_availability_profile_is_one_minus_a_to_the_n():
    profile = fl.availability_profile(0.999)
    for gpus, expected in ((1000, 0.6323), (8000, 0.99966)):
        units = fl.job_units(H100, gpus)
        rate = sum(profile.rates_per_hour(units).values())
        p = 1 - math.exp(-rate * fl.MONTH_HOURS)
        assert p == pytest.approx(1 - 0.999 ** gpus, rel=1e-12)
        assert p == pytest.approx(expected, abs=1e-4)


# ---------------------------------------------------------------------------- job units


def test_rail_optimized_leaves_serve_one_rail():
    units = fl.job_units(H100, 16384)
    assert (units.nodes, units.switches, units.nodes_per_switch) == (2048, 64 * 8, 32)
    assert units.blast_nodes("switch") == 32 and units.blast_nodes("node") == 1
    assert units.blast_nodes("restart") == 0
    fat = fl.job_units(load_cluster("dgx-h100", {"fabric.topology": "fat-tree"}), 16384)
    assert (fat.switches, fat.nodes_per_switch) == (64, 32)
    small = fl.job_units(H100, 40)          # 5 nodes: one leaf group, 8 rails
    assert (small.nodes, small.switches, small.nodes_per_switch) == (5, 8, 5)
    sub = fl.job_units(H100, 4)
    assert (sub.nodes, sub.gpus_per_node, sub.count("gpu")) == (1, 4, 4)


# ---------------------------------------------------------------------------- costs


def test_checkpoint_bytes_are_weights_plus_optimizer_state():
    model = load_model("llama3-405b")
    assert fl.CHECKPOINT_BYTES_PER_PARAM == WEIGHT_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM
    assert fl.checkpoint_bytes_for(model) == param_counts(model).total * 14
    assert fl.checkpoint_bytes_for(model, bytes_per_param=16) == param_counts(model).total * 16


def test_sync_and_async_checkpoint_costs():
    units = fl.job_units(H100, 1024)              # 128 nodes
    r = fl.load_responses()
    size = 10**12
    sync = checkpoint_costs(checkpoint_bytes=size, mode="sync", units=units, cluster=H100,
                               responses=r)
    write = min(r.storage_write_bytes_per_s_per_node * 128, r.storage_write_bytes_per_s_total)
    read = min(r.storage_read_bytes_per_s_per_node * 128, r.storage_read_bytes_per_s_total)
    assert sync.blocking_s == pytest.approx(r.checkpoint_fixed_s + size / write)
    assert sync.upload_s == 0
    assert sync.reload_s == pytest.approx(size / read)
    assert sync.restart_s == pytest.approx(r.reinit_s + size / read)
    asyn = checkpoint_costs(checkpoint_bytes=size, mode="async", units=units, cluster=H100,
                               responses=r)
    snapshot = size / 1024 / (H100.scale_up.pcie_bytes_per_s * r.snapshot_pcie_efficiency)
    assert asyn.blocking_s == pytest.approx(r.checkpoint_fixed_s + snapshot)
    assert asyn.upload_s == pytest.approx(size / write)
    assert asyn.blocking_s < sync.blocking_s
    # The aggregate storage limit binds on a big job.
    big = checkpoint_costs(checkpoint_bytes=size, mode="sync", units=fl.job_units(H100, 16384),
                              cluster=H100, responses=r)
    assert big.blocking_s == pytest.approx(r.checkpoint_fixed_s
                                           + size / r.storage_write_bytes_per_s_total)
    fixed = checkpoint_costs(checkpoint_bytes=size, mode="sync", units=units, cluster=H100,
                                responses=fl.load_responses(checkpoint_blocking_s=7.0,
                                                            reload_s=0.0))
    assert (fixed.blocking_s, fixed.reload_s, fixed.restart_s) == (7.0, 0.0, r.reinit_s)


# ---------------------------------------------------------------------------- closed forms


def test_young_daly_and_daly():
    assert fl.young_daly_interval_s(60, 14400) == pytest.approx(math.sqrt(2 * 60 * 14400))
    x = 60 / (2 * 14400)
    assert fl.daly_interval_s(60, 14400) == pytest.approx(
        math.sqrt(2 * 60 * 14400) * (1 + math.sqrt(x) / 3 + x / 9) - 60)
    assert fl.daly_interval_s(100, 40) == 40           # C >= 2M: checkpoint every M


def test_exact_goodput_limits_and_optimum():
    kw = dict(checkpoint_s=60.0, detection_s=120.0, restart_s=480.0)
    # No failures: the save overhead only.
    assert fl.expected_goodput_exponential(interval_s=600, mtbf_s=math.inf, **kw) == \
        pytest.approx(600 / 660)
    # Rare failures: exact and first-order agree to second order.
    exact = fl.expected_goodput_exponential(interval_s=600, mtbf_s=1e8, **kw)
    first = fl.first_order_goodput(interval_s=600, mtbf_s=1e8, **kw)
    assert exact == pytest.approx(first, rel=1e-5)
    # The exact optimum is Daly's higher-order estimate (within 1 %) and near Young-Daly.
    grid = [1000 + i for i in range(0, 1000)]
    best = max(grid, key=lambda w: fl.expected_goodput_exponential(interval_s=w, mtbf_s=14400,
                                                                   **kw))
    assert best == pytest.approx(fl.daly_interval_s(60, 14400), rel=0.01)
    assert best == pytest.approx(fl.young_daly_interval_s(60, 14400), rel=0.05)


# ---------------------------------------------------------------------------- parsing, errors


def test_parse_durations_and_intervals():
    assert fl.parse_duration_s("30min") == 1800
    assert fl.parse_duration_s("2.5h") == 9000
    assert fl.parse_duration_s(90) == 90
    assert fl.parse_duration_s("1d") == 86400
    assert fl.parse_interval("auto") == "auto"
    assert fl.parse_interval("Young-Daly") == "young-daly"
    assert fl.parse_interval("10min") == 600



def test_bad_inputs_raise_one_line_errors(tmp_path):
    _one_line_error(lambda: fl.load_profile("nope"), "profile", "'nope'", "llama3-h100",
                    "meta-rsc")
    _one_line_error(lambda: fl.load_profile(str(tmp_path / "missing.toml")), "profile",
                    "not found")
    _one_line_error(lambda: fl.parse_interval(-5), "checkpoint_interval", "-5", "auto")
    _one_line_error(lambda: fl.parse_interval("0s"), "checkpoint_interval", "auto")
    _one_line_error(lambda: fl.parse_interval("soon"), "checkpoint_interval", "'soon'")
    _one_line_error(lambda: fl.load_profile({"classes": {"gpu": {"rate_per_unit_hour": -1}}}),
                    "classes.gpu.rate_per_unit_hour", "-1")
    _one_line_error(lambda: fl.load_profile({"classes": {"gpu": {"rate_per_unit_hour": 1,
                                                                 "blast": "rack"}}}),
                    "classes.gpu.blast", "'rack'", "restart, node, switch")
    _one_line_error(lambda: fl.load_profile({"classes": {"gpu": {"rate_per_unit_hour": 1,
                                                                 "unit": "chip"}}}),
                    "classes.gpu.unit", "'chip'", "gpu, node, switch, job")
    _one_line_error(lambda: fl.load_profile({"classes": {"gpu": {"count": 3}}}), "exposure")
    _one_line_error(lambda: fl.load_profile({"classes": {"gpu": {"rate": 3}}}),
                    "classes.gpu", "'rate'", "rate_per_unit_hour")
    _one_line_error(lambda: fl.load_profile({"classes": {}}), "classes")
    _one_line_error(lambda: fl.load_responses(policy="pray"), "policy", "'pray'",
                    "spares, wait, elastic")
    _one_line_error(lambda: fl.load_responses(detection_s=-1), "detection_s", "-1")
    _one_line_error(lambda: fl.load_responses(warp_s=1), "responses", "'warp_s'", "detection_s")
    _one_line_error(lambda: fl.load_responses(spare_nodes=-2), "spare_nodes", "-2")
    _one_line_error(lambda: fl.job_units(H100, 12), "gpus", "12", "multiple of 8")
    _one_line_error(lambda: fl.job_units(H100, 8 * 4096), "gpus", "2048")
    _one_line_error(lambda: fl.availability_profile(1.5), "monthly_availability", "1.5")
    units = fl.job_units(H100, 8)
    _one_line_error(lambda: checkpoint_costs(checkpoint_bytes=1, mode="lazy", units=units,
                                                cluster=H100, responses=fl.load_responses()),
                    "checkpoint_mode", "'lazy'", "sync, async")
