"""Stragglers and heterogeneity in the step: throttling episodes, degraded and flapping
NIC links, mixed GPU generations, and what they cost the whole job."""

import json

import pytest

from conftest import run_cli
from hardware.catalog import load_cluster
from hardware.compute import ComputeModel
from trainsim import api
from sim.step import simulate_step
from strategies.models import load_model
from hardware.cost import stretched_ns
from strategies.perturbations import FlappingLink, Perturbations, ThermalEpisode

MODEL = load_model("llama3-8b")
H100 = load_cluster("dgx-h100")
DATA_PARALLEL = dict(gpus=64, tp=1, seq_len=2048, global_batch=64, micro_batch=1)


def _step(perturbations=None, fidelity="event", **plan):
    return api.simulate(MODEL, cluster=H100, fidelity=fidelity,
                        perturbations=perturbations, **(plan or DATA_PARALLEL))


@pytest.mark.parametrize("start_ns,work_ns,episodes,expected", [
    (0, 100, [], 100),
    (10, 100, [(0, 1000, 0.5)], 200),           # inside: twice as long
    (0, 100, [(50, 1000, 0.5)], 150),           # 50 at full speed, 50 at half
    (0, 100, [(0, 40, 0.5)], 120),              # 20 done by 40, then 80 at full speed
    (0, 100, [(10, 20, 0.5), (30, 40, 0.25)], 113),  # 27.5 done by 40, ends at 112.5 (ceil)
])
def test_stretched_time_accumulates_the_work_at_the_episode_speed(start_ns, work_ns,
                                                                  episodes, expected):
    assert stretched_ns(start_ns, work_ns, episodes) == expected


def test_a_throttling_episode_inside_the_compute_costs_its_lost_progress():
    """Rank 5 at 40 % speed for 50 ms of its compute: every rank runs at the expected
    slowest GPU's pace 1/F (gpu.speed_spread), so the episode loses 50 ms x (1 - 0.4 F)
    of progress (29.6 ms at F 1.0215, 8 GPUs), and data parallelism makes every rank wait
    for it. One node: across nodes the gradient all-reduce's tail (paced ring steps)
    hides part of a late rank's delay (64 GPUs: 28.0 of 29.3 ms), which is not what this
    checks."""
    one_node = dict(DATA_PARALLEL, gpus=8, global_batch=8)
    base = _step(**one_node)
    episode = ThermalEpisode(rank=5, start_s=0.02, duration_s=0.05, speed=0.4)
    hot = _step(Perturbations(thermal=(episode,)), **one_node)
    pace = base.inputs["slowest_gpu_factor"]
    assert pace > 1.0
    assert hot.step_time_s - base.step_time_s == pytest.approx(0.05 * (1 - 0.4 * pace),
                                                               rel=0.01)
    assert hot.perturbation_cost["slowdown_s"] == pytest.approx(
        hot.step_time_s - base.step_time_s)
    assert hot.inputs["critical_rank"] == 5


def _exposed_dp_plan():
    # no overlap: the gradient all-reduce runs after the backward, fully exposed;
    # tp 8 puts each data-parallel ring on one rail, one NIC per node
    return dict(gpus=128, tp=8, seq_len=2048, global_batch=16, micro_batch=1,
                overlap_grad_reduce=False, zero=0)


def test_a_nic_at_half_rate_doubles_the_bandwidth_time_of_the_rings_through_it():
    """A ring runs at the pace of its slowest link (Patarasuk & Yuan 2009): one NIC at
    half rate doubles the bandwidth term of every ring through it. The cost is affine
    in the size, t(S) = a + b S, so the extra time is b S = t(2 S) - t(S) at full rate."""
    from hardware.cost import CostModel
    from hardware.topology import ClusterLayout
    from strategies.collectives.catalog import ALGORITHMS

    plan = _exposed_dp_plan()
    base = _step(**plan)
    slow = _step(Perturbations(degraded_nics={8 * 3: 0.5}), **plan)
    spans = base.timeline_frame()
    reductions = spans[(spans["rank"] == 0) & spans["op"].str.startswith("dp.")
                       & (spans["kind"] == "all_reduce")]
    assert len(reductions) >= 1
    cost = CostModel(ClusterLayout(H100, 16, 8), ALGORITHMS)
    group = tuple(range(0, 128, 8))
    expected_ns = sum(cost.collective("all_reduce", group, 2 * int(size)).duration_ns
                      - cost.collective("all_reduce", group, int(size)).duration_ns
                      for size in reductions["bytes"])
    extra_s = slow.step_time_s - base.step_time_s
    assert extra_s == pytest.approx(expected_ns / 1e9, rel=0.01)
    assert slow.breakdown["exposed_dp"] == pytest.approx(
        base.breakdown["exposed_dp"] + extra_s, rel=0.01)


def test_a_flapping_link_costs_what_its_time_averaged_rate_costs():
    plan = _exposed_dp_plan()
    flapping = _step(Perturbations(flapping_links=(FlappingLink(24, up_s=3.0, down_s=1.0),)),
                     **plan)
    degraded = _step(Perturbations(degraded_nics={24: 0.75}), **plan)
    assert flapping.step_time_s == degraded.step_time_s
    assert flapping.step_time_s > _step(**plan).step_time_s


def test_a_node_of_an_older_gpu_sets_the_pace_of_the_job():
    """One DGX A100 node in an H100 job: its replicas compute at the A100's speed
    and the others wait at the gradient reduction, so the step is (within 1 %) the
    step of a job whose every GPU computes like an A100."""
    a100 = load_cluster("dgx-a100").gpu
    mixed = _step(Perturbations(node_gpus={2: "dgx-a100"}))
    all_a100 = simulate_step(MODEL, H100, api.make_plan(**DATA_PARALLEL),
                             compute=ComputeModel(a100))
    h100 = _step()
    assert mixed.step_time_s > 1.5 * h100.step_time_s
    assert mixed.step_time_s == pytest.approx(all_a100.step_time_s, rel=0.01)
    assert 16 <= mixed.inputs["critical_rank"] < 24
    assert mixed.breakdown["compute"] == pytest.approx(all_a100.breakdown["compute"],
                                                       rel=1e-6)


def test_analytic_fidelity_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match=r"^fidelity: 'analytic' models slow ranks only"):
        _step(Perturbations(degraded_nics={3: 0.5}), fidelity="analytic")


def test_analytic_straggler_reports_its_cost():
    result = _step(Perturbations(slow_ranks={7: 0.5}), fidelity="analytic")
    cost = result.perturbation_cost
    assert cost["slowdown"] == pytest.approx(result.step_time_s / cost["baseline_step_time_s"] - 1)
    assert cost["slowdown"] > 0.5


@pytest.mark.parametrize("args,field", [
    (["--thermal", "5:0.1:0.2"], "thermal"),
    (["--thermal", "5:0.1:0.2:1.5"], "thermal"),
    (["--degraded-nic", "5"], "degraded-nic"),
    (["--degraded-nic", "500:0.5"], "degraded_nic"),
    (["--flapping-link", "5:x:1"], "flapping-link"),
    (["--node-gpu", "99:dgx-a100"], "node_gpu"),
    (["--node-gpu", "1:dgx-z900"], "cluster"),
])
def test_cli_rejects_bad_perturbations_in_one_line(capsys, args, field):
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {field}"), lines[0]


def test_cli_reports_what_the_slowest_rank_costs(capsys):
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16",
                             "--seq-len", "2048", "--global-batch", "64", "--straggler", "3:0.5",
                             "--thermal",
                             "4:0.0:0.01:0.5", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    cost = data["perturbation_cost"]
    assert cost["critical_rank"] == 3 and cost["slowdown"] > 0.5
    assert data["inputs"]["perturbations"]["thermal"][0]["rank"] == 4
