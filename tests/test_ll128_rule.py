"""NCCL's LL128 enable rule and NCCL_PROTO in trainsim's protocol choice.

NCCL 2.29 src/graph/tuning.cc ``isLL128Enabled`` (default ``NCCL_LL128_C2C=1``): LL128
across nodes only while the graph's GPU-NIC path is at most PXB, or at most PXN from
compute capability 9.0; the GPUs of a node joined at most by NVB (NVLink); not below
compute capability 7.0. ``NCCL_PROTO`` (``comm.nccl_proto``) limits what ``auto`` picks.
"""

from __future__ import annotations

import pytest

from hardware.catalog import check_cluster_spec, load_cluster, parse_nccl_proto
from hardware.cost import CostModel, ll128_enabled
from hardware.spec import NIC_PATHS
from hardware.topology import ClusterLayout
from strategies.collectives.catalog import ALGORITHMS

MiB = 1 << 20


def _enabled(preset: str, nodes: int, gpn: int, **overrides) -> bool:
    spec = load_cluster(preset, {k.replace("__", "."): v for k, v in overrides.items()})
    layout = ClusterLayout(spec, nodes, gpn)
    return ll128_enabled(spec, layout.geometry(tuple(range(nodes * gpn))))


#: (compute capability, farthest GPU-NIC path NCCL still runs LL128 over)
FARTHEST = {80: "PXB", 90: "PXN", 100: "PXN", 0: "PXB"}


@pytest.mark.parametrize("capability", sorted(FARTHEST))
@pytest.mark.parametrize("path", NIC_PATHS)
def test_nic_path_rule_across_nodes(capability, path):
    """Every path type at every architecture, across 2 nodes: on up to PXB below 9.0
    (and when the capability is not given), up to PXN from 9.0 (P2C is nearer than PXN,
    tuning.cc's path order PIX < PXB < P2C < PXN < PHB < SYS)."""
    expected = NIC_PATHS.index(path) <= NIC_PATHS.index(FARTHEST[capability])
    assert _enabled("dgx-h100", 2, 8, nic__gpu_path=path,
                    gpu__compute_capability=capability) is expected


def test_the_cases_by_name():
    assert _enabled("dgx-a100", 2, 8, nic__gpu_path="PXB")
    assert not _enabled("dgx-a100", 2, 8, nic__gpu_path="PXN")  # PxN may hide a PXB/P2C hop
    assert _enabled("dgx-h100", 2, 8, nic__gpu_path="PXN")
    assert not _enabled("dgx-h100", 2, 8, nic__gpu_path="PHB")
    assert _enabled("dgx-b200", 2, 8, nic__gpu_path="P2C")
    assert not _enabled("dgx-b200", 2, 8, nic__gpu_path="SYS")


def test_inside_one_node_the_nic_path_does_not_matter():
    """One NVLink domain: NCCL's graph has no network (typeInter stays PIX)."""
    assert _enabled("polaris", 1, 4)
    assert _enabled("dgx-a100", 1, 8, nic__gpu_path="SYS")


def test_compute_capability_below_7_disables_everywhere():
    assert not _enabled("dgx-a100", 1, 8, gpu__compute_capability=60)
    assert not _enabled("dgx-a100", 2, 8, gpu__compute_capability=61)
    assert _enabled("dgx-a100", 1, 8, gpu__compute_capability=70)


def test_pcie_only_nodes_need_one_gpu_per_node():
    """typeIntra <= NVB: a PCIe node with several GPUs of the group fails; with one GPU
    per node the graph's intra path is PATH_LOC."""
    pcie = {"scale_up__kind": "pcie"}
    assert not _enabled("dgx-h100", 1, 8, **pcie)
    assert not _enabled("dgx-h100", 2, 8, **pcie)
    assert _enabled("dgx-h100", 4, 1, **pcie)


def test_presets():
    """DGX/HGX presets keep LL128 (a NIC under each GPU's PCIe switch); Polaris, whose
    NICs are PHB/SYS to every GPU on A100s (ALCF's affinity table), does not."""
    for preset in ("dgx-a100", "dgx-h100", "dgx-b200", "hgx-h200", "gb200-nvl72"):
        assert _enabled(preset, 2, load_cluster(preset).gpus_per_node), preset
    polaris = load_cluster("polaris")
    assert (polaris.nic.gpu_path, polaris.gpu.compute_capability) == ("PHB", 80)
    assert not _enabled("polaris", 2, 4)


def _choices(preset: str, nodes: int, gpn: int, overrides: dict, protocol="auto"):
    layout = ClusterLayout(load_cluster(preset, overrides), nodes, gpn)
    cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
    group = tuple(range(nodes * gpn))
    return {size: cost.collective("all_reduce", group, size, "auto", protocol).protocol
            for size in (1 << k for k in range(10, 31, 2))}


def test_auto_never_picks_a_disabled_ll128_but_a_request_runs_it():
    """Polaris across nodes: no size runs LL128 under auto; the same machine with its
    NICs at PXB does at some size; NCCL_PROTO=LL128 asked for explicitly still runs."""
    assert "LL128" not in _choices("polaris", 2, 4, {}).values()
    assert "LL128" in _choices("polaris", 2, 4, {"nic.gpu_path": "PXB"}).values()
    assert set(_choices("polaris", 2, 4, {}, protocol="LL128").values()) == {"LL128"}
    assert "LL128" in _choices("polaris", 1, 4, {}).values()


def test_nccl_proto_limits_auto():
    assert set(_choices("dgx-a100", 2, 8, {"comm.nccl_proto": "Simple"}).values()) == {"Simple"}
    assert "LL" not in _choices("dgx-a100", 2, 8, {"comm.nccl_proto": "^LL"}).values()
    assert set(_choices("dgx-a100", 2, 8, {}).values()) >= {"LL", "LL128"}


def test_parse_nccl_proto():
    """NCCL's parseList: comma list, case-insensitive, ^ excludes."""
    assert parse_nccl_proto("Simple") == ("Simple",)
    assert parse_nccl_proto("simple,ll128") == ("LL128", "Simple")
    assert parse_nccl_proto("^LL") == ("LL128", "Simple")
    assert parse_nccl_proto("LL,LL128,Simple") == ("LL", "LL128", "Simple")
    with pytest.raises(ValueError, match=r"^comm\.nccl_proto: 'LL256'"):
        parse_nccl_proto("LL256")
    with pytest.raises(ValueError, match="enables no protocol"):
        parse_nccl_proto("^LL,LL128,Simple")
    with pytest.raises(ValueError, match=r"^nic\.gpu_path: 'NVL' is not valid"):
        load_cluster("dgx-h100", {"nic.gpu_path": "NVL"})


def test_fields_survive_check_cluster_spec():
    spec = load_cluster("polaris", {"comm.nccl_proto": "LL128,Simple"})
    assert check_cluster_spec(spec) is spec
    assert spec.comm.nccl_proto == ("LL128", "Simple")
    assert load_cluster("dgx-h100").comm.nccl_proto == ("LL", "LL128", "Simple")


def test_net_plugin_latency_on_every_network_step_twice_for_simple():
    """NCCL adds the net plugin's reported latency to each network step of its model,
    once more for Simple (tuning.cc: interLat += latencyInter; "flush extra latency");
    NVLink steps do not pay it. Exact, on a 2-node ring all_reduce, in NCCL's own model
    (``paced=False``: without the ring step pacing, which floors a step's latency and so
    hides part of any term under it)."""
    def latency_s(net_latency_us, protocol):
        spec = load_cluster("dgx-h100", {"nic.net_latency_us": net_latency_us})
        cost = CostModel(ClusterLayout(spec, 2, 8), ALGORITHMS, fidelity="analytic")
        plan = cost.collective_plan("all_reduce", tuple(range(16)), 64 * MiB, "ring", protocol)
        phases = plan.phases
        inter = sum(ph.inter_steps for ph in phases)
        return sum(cost.network.phase_latency_s(ph, protocol, plan.family, paced=False)
                   for ph in phases), inter

    for protocol, times in (("LL", 1), ("LL128", 1), ("Simple", 2)):
        base, inter = latency_s(0.0, protocol)
        added, _ = latency_s(75.0, protocol)
        plateau = load_cluster("dgx-h100").comm.ring_plateau_factor if protocol == "Simple" else 1
        assert inter > 0
        assert added - base == pytest.approx(inter * times * 75e-6 * plateau, rel=1e-9)
    assert load_cluster("dgx-h100").nic.net_latency_s == 0.0  # NCCL's IB transport: 0
