"""``trainsim hardware show`` prints every field by the name ``--set`` takes, in that name's
unit, with the source of every number; what it prints can be given back to ``--set``."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from hardware.catalog import list_presets, load_cluster, preset_sources
from trainsim.cli.hardware import _shown
from trainsim.preset_fields import preset_fields

TEXT = {"name", "description", "gpu.name"}


@pytest.mark.parametrize("preset", list_presets())
def test_every_field_round_trips_through_set(preset):
    """All fields at once, as printed, as overrides: the same cluster (a wrong name
    fails to load, a wrong unit changes the spec)."""
    fields = preset_fields(preset)
    overrides = {f.key: _shown(f.value) for f in fields if f.key not in TEXT}
    assert len(overrides) >= 70
    assert load_cluster(preset, overrides) == load_cluster(preset)


@pytest.mark.parametrize("preset", list_presets())
def test_every_number_has_a_source(preset):
    cited = preset_sources(preset)
    for field in preset_fields(preset):
        assert field.source, field.key
        if field.key in cited:
            assert field.source == cited[field.key]
        else:  # what the loader filled in says so
            assert field.key in TEXT or field.source.startswith(("derived:", "not in the "
                                                                 "preset")), field


def test_units_follow_the_names():
    fields = {f.key: f.value for f in preset_fields("dgx-h100")}
    spec = load_cluster("dgx-h100")
    assert fields["gpu.hbm_gb"] == spec.gpu.hbm_bytes / 1e9
    assert fields["gpu.memory_reserve_gib"] == spec.gpu.memory_reserve_bytes / 2**30 == 2
    assert fields["gpu.kernel_launch_us"] == 4  # 4e-06 s, shown as the file's decimal
    assert fields["scale_up.nvlink_gb_per_s_per_link"] == 25
    assert fields["comm.base_latency_us.nvls.Simple"] == 45
    assert "gpu.hbm_bytes" not in fields and "nic.gbit_per_s" in fields


def test_cli_json_is_nested_like_a_preset_file_and_names_overrides(capsys):
    code, out, err = run_cli(capsys, "hardware", "show", "dgx-h100", "--set",
                             "gpu.hbm_gb=80")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["gpu"]["hbm_gb"] == 80 and shown["nic"]["gbit_per_s"] == 400
    assert shown["sources"]["gpu.hbm_gb"] == "override: gpu.hbm_gb=80"
    assert shown["comm"]["hop_latency_us"]["network"]["LL"] == 2.7


def test_cli_table_prints_set_names(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run_cli(capsys, "hardware", "show", "gcp-a3-mega", "--format", "table")
    assert code == 0, err
    keys = [line.split()[0] for line in out.splitlines()[3:] if line[:1].strip()]
    assert keys == [f.key for f in preset_fields("gcp-a3-mega")]
    assert "scale_up.nvls_efficiency" not in keys  # no NVLS on this preset
    # a citation's "[table]" prints as written (not eaten as a rich style tag)
    assert "_defaults.toml, comment of [comm.base_latency_us]" in " ".join(out.split())
