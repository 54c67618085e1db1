"""Parameter-server training (strategies.param_server): valid programs, incast against closed
forms at flow fidelity, sync/async/stale semantics, placement, memory, plan checks, CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import run_cli, tiny_models

from hardware.catalog import load_cluster
from hardware.compute import ComputeModel
from hardware.network import NetworkModel
from hardware.topology import ClusterLayout
from sim.engine import Engine
from hardware.cost import CostModel
from strategies.collectives.catalog import ALGORITHMS
from sim.ps_step import ps_job_layout, ps_step_ends
from sim.step import simulate_step
from strategies import model_costs
from strategies.ir import ComputeOp, Program
from strategies.memory import OutOfMemoryError
from strategies.models import load_model
from strategies.param_server import lower_ps_step, server_ranks, split_bytes
from strategies.plan import ParallelPlan, validate_plan
from strategies.program_check import check_program

TINY, TINY_MOE = tiny_models()
# One GPU and one NIC per node: every rank is its own node, so every push crosses the fabric.
ONE_GPU_NODES = {"gpus_per_node": 1, "nic.count_per_node": 1, "scale_up.domain_gpus": 1}
N = 4  # workers in the closed-form tests


def ps_plan(**fields) -> ParallelPlan:
    base = dict(dp=N, global_batch=N, seq_len=512, zero=0, dp_mode="ps-sync")
    base.update(fields)
    return ParallelPlan(**base)


def p2p_rate(cluster, tier: str) -> float:
    """Payload bytes/s one p2p flow gets alone on a link of ``tier`` (Simple protocol)."""
    comm = cluster.comm
    if tier == "network":
        raw = cluster.nic.bytes_per_s * cluster.nic.link_efficiency
    else:
        raw = cluster.scale_up.nvlink_bytes_per_s * cluster.scale_up.link_efficiency
    return raw * comm.protocol_efficiency[tier]["Simple"] * comm.p2p_efficiency[tier]


def p2p_latency(cluster, tier: str) -> float:
    comm = cluster.comm
    latency = comm.base_latency_s["direct"]["Simple"] + comm.hop_latency_s[tier]["Simple"]
    if tier == "network":
        latency += cluster.fabric.switch_hop_latency_s  # one leaf switch
    return latency


def phase_s(df, prefix: str, ranks=None, step: int = 0) -> float:
    """From the first issue to the last end of the spans named ``prefix...t{step}.``."""
    rows = df[df["op"].str.startswith(prefix) & df["op"].str.contains(f".t{step}.", regex=False)]
    if ranks is not None:
        rows = rows[rows["rank"].isin(list(ranks))]
    assert len(rows) > 0
    return (rows["end_ns"].max() - rows["start_ns"].min()) / 1e9


def compute_per_step_s(result, rank: int) -> float:
    df = result.timeline_frame()
    mine = df[(df["rank"] == rank) & (df["category"] == "compute")
              & ~df["op"].str.startswith("dp.")]
    return mine["duration_ns"].sum() / 1e9 / result.ps["steps"]


# ----------------------------------------------------------------------------- programs
@pytest.mark.parametrize("mode,staleness", [("ps-sync", 0), ("ps-async", 0), ("ps-stale", 1),
                                            ("ps-stale", 2)])
@pytest.mark.parametrize("placement,servers", [("dedicated", 1), ("dedicated", 3),
                                               ("colocated", 2), ("colocated", 4)])
def test_lowered_ps_programs_are_valid(mode, staleness, placement, servers):
    plan = ps_plan(global_batch=8, dp_mode=mode, staleness=staleness, ps_steps=3,
                   ps_placement=placement, ps_servers=servers, grad_bucket_bytes=10_000_000)
    validate_plan(plan, num_layers=8, num_heads=8, num_kv_heads=8)
    lowering = lower_ps_step(TINY, plan, servers=servers)
    check_program(lowering.program)
    assert lowering.program.represents is None
    assert len(lowering.bucket_bytes) > 1  # pushes overlap the backward, bucket by bucket
    ops = [op for ops in lowering.program.ops_by_rank.values() for op in ops]
    assert any(op.name.startswith("dp.push.") for op in ops)
    assert any(op.name.startswith("dp.pull.") for op in ops)
    updates = [op for op in ops if op.name.startswith("dp.server.update")]
    assert updates and all(op.kind == "optimizer" for op in updates)
    # no worker runs an optimizer of its own
    assert not any(op.name.startswith("optimizer") for op in ops)
    # the servers update every parameter once per step (per push when async)
    params = model_costs.rank_params(TINY, layers=range(8), has_embedding=True,
                                     has_head=True).total
    per_step = 2 * params / 2 * (N if mode == "ps-async" else 1)
    assert sum(op.flops for op in updates) == pytest.approx(12 * per_step * 3)


def test_moe_model_without_expert_parallelism_lowers():
    plan = ps_plan(dp_mode="ps-async", ps_steps=2)
    validate_plan(plan, num_layers=4, num_heads=8, num_kv_heads=4, num_experts=4)
    lowering = lower_ps_step(TINY_MOE, plan, servers=2)
    check_program(lowering.program)
    params = model_costs.rank_params(TINY_MOE, layers=range(4), has_embedding=True,
                                     has_head=True).total
    assert lowering.gradient_bytes == 2 * params


def test_shards_split_exactly_and_servers_are_placed():
    assert split_bytes(10, 3) == (3, 3, 4) and sum(split_bytes(2**40 + 7, 13)) == 2**40 + 7
    assert server_ranks(ps_plan(dp=16), 3) == (16, 17, 18)
    assert server_ranks(ps_plan(dp=16, ps_placement="colocated"), 2) == (0, 8)
    assert server_ranks(ps_plan(dp=4, ps_placement="colocated"), 4) == (0, 1, 2, 3)


# ------------------------------------------------------------------------ incast, flow
@pytest.mark.parametrize("placement,servers,load", [
    ("dedicated", 1, N),              # one server NIC takes every worker's whole gradient
    ("dedicated", N, 1),              # each NIC (worker out, server in) carries G
    ("colocated", N, (N - 1) / N),    # a worker's own shard stays home
    ("colocated", 1, N - 1),          # worker 0's NIC takes the other N-1 gradients
])
def test_push_and_pull_phases_are_the_incast_closed_form(placement, servers, load):
    """N workers on separate nodes push G bytes each (one bucket, after the backward), G/S
    to every server: the busiest NIC carries ``load * G`` bytes, so at flow fidelity a
    phase takes latency + load * G / B (and the pull phase, from the servers, the same)."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    plan = ps_plan(ps_servers=servers, ps_placement=placement, overlap_grad_reduce=False)
    result = simulate_step(TINY, cluster, plan, fidelity="flow")
    g = result.lowering.gradient_bytes
    expected = p2p_latency(cluster, "network") + load * g / p2p_rate(cluster, "network")
    df = result.timeline_frame()
    assert phase_s(df, "dp.push.s", ranks=range(N)) == pytest.approx(expected, rel=1e-5)
    assert phase_s(df, "dp.pull.w", ranks=result.ps["server_ranks"]) == \
        pytest.approx(expected, rel=1e-5)


def test_incast_grows_with_workers_per_server():
    """The push phase of one server is N times that of N servers (minus latency)."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    times = {}
    for servers in (1, N):
        result = simulate_step(TINY, cluster, ps_plan(ps_servers=servers,
                                                      overlap_grad_reduce=False),
                               fidelity="flow")
        times[servers] = phase_s(result.timeline_frame(), "dp.push.s", ranks=range(N))
    latency = p2p_latency(cluster, "network")
    assert (times[1] - latency) / (times[N] - latency) == pytest.approx(N, rel=1e-5)


def test_analytic_fidelity_does_not_see_incast():
    """Alpha-beta prices each send alone: one server looks as fast as N (use flow). Alone,
    a send runs at its NIC's rate or at what NCCL's channels to one network peer move,
    whichever is lower (NetworkModel.p2p_cap_bytes_per_s)."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    result = simulate_step(TINY, cluster, ps_plan(ps_servers=1, overlap_grad_reduce=False),
                           fidelity="analytic")
    g = result.lowering.gradient_bytes
    channels = NetworkModel(ClusterLayout(cluster, N + 1, 1), cluster.comm)
    alone = min(p2p_rate(cluster, "network"), channels.p2p_cap_bytes_per_s(2))
    expected = p2p_latency(cluster, "network") + g / alone
    assert phase_s(result.timeline_frame(), "dp.push.s", ranks=range(N)) == \
        pytest.approx(expected, rel=1e-5)


def test_colocated_on_one_node_pushes_over_nvlink_dedicated_over_the_nic():
    """8 workers of one DGX node, one server: colocated on GPU 0, the other 7 gradients
    arrive over NVLink (incast on GPU 0's NVLink port); dedicated on the next node, all 8
    leave over rail 0's NIC (PXN relays them there) and arrive at the server's NIC."""
    cluster = load_cluster("dgx-h100")
    n = 8
    phases = {}
    for placement in ("colocated", "dedicated"):
        plan = ps_plan(dp=n, global_batch=n, ps_servers=1, ps_placement=placement,
                       overlap_grad_reduce=False)
        result = simulate_step(TINY, cluster, plan, fidelity="flow")
        phases[placement] = phase_s(result.timeline_frame(), "dp.push.s", ranks=range(n))
        g = result.lowering.gradient_bytes
    assert phases["colocated"] == pytest.approx(
        p2p_latency(cluster, "nvlink") + (n - 1) * g / p2p_rate(cluster, "nvlink"), rel=1e-5)
    assert phases["dedicated"] == pytest.approx(
        p2p_latency(cluster, "network") + n * g / p2p_rate(cluster, "network"), rel=1e-5)
    assert phases["dedicated"] > 5 * phases["colocated"]


def test_sync_iteration_is_compute_push_aggregate_update_pull():
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    result = simulate_step(TINY, cluster, ps_plan(ps_servers=1, overlap_grad_reduce=False),
                           fidelity="flow")
    df = result.timeline_frame()
    server = result.ps["server_ranks"][0]
    mine = df[df["rank"] == server]
    aggregate = mine[mine["op"].str.startswith("dp.server.aggregate")]["duration_ns"].sum()
    update = mine[mine["op"].str.startswith("dp.server.update")]["duration_ns"].sum()
    assert aggregate > 0 and update > 0
    backward_end = df[(df["rank"] == 0) & (df["category"] == "compute")]["end_ns"].max()
    push = phase_s(df, "dp.push.s", ranks=range(N)) * 1e9
    pull = phase_s(df, "dp.pull.w", ranks=[server]) * 1e9
    assert result.step_time_s * 1e9 == pytest.approx(backward_end + push + aggregate + update
                                                      + pull, abs=2)
    assert sum(result.breakdown.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    assert result.breakdown["exposed_dp"] > 0


# ------------------------------------------------------------- sync, async, staleness
def test_stale_with_zero_staleness_is_sync():
    cluster = load_cluster("dgx-h100")
    base = dict(dp=8, global_batch=16, ps_steps=3)
    sync = simulate_step(TINY, cluster, ps_plan(**base), fidelity="flow")
    stale = simulate_step(TINY, cluster, ps_plan(**base, dp_mode="ps-stale"), fidelity="flow")
    assert stale.step_time_s == sync.step_time_s
    assert stale.ps["step_ends_s"] == sync.ps["step_ends_s"]


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_async_step_interval_is_not_longer_than_sync(placement):
    cluster = load_cluster("dgx-h100")
    base = dict(dp=8, global_batch=16, ps_steps=3, ps_placement=placement)
    sync = simulate_step(TINY, cluster, ps_plan(**base), fidelity="flow")
    async_ = simulate_step(TINY, cluster, ps_plan(**base, dp_mode="ps-async"), fidelity="flow")
    assert async_.step_time_s <= sync.step_time_s
    assert async_.ps["server_busy_s"]["aggregate"] == 0  # each push is applied on its own
    assert async_.ps["server_busy_s"]["update"] == pytest.approx(
        8 * sync.ps["server_busy_s"]["update"], rel=1e-6)


def test_staleness_hides_push_and_pull_behind_compute():
    """One bucket after the backward, N servers: sync pays compute + push + update + pull
    every step; with staleness 1 the exchange of step t overlaps step t+1's compute, so the
    step interval is the compute time (the NICs have room: G per step each way)."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    base = dict(ps_servers=N, overlap_grad_reduce=False, ps_steps=6, global_batch=2 * N)
    sync = simulate_step(TINY, cluster, ps_plan(**base), fidelity="flow")
    compute = compute_per_step_s(sync, 0)
    g = sync.lowering.gradient_bytes
    assert sync.step_time_s > compute + 2 * g / p2p_rate(cluster, "network")
    for staleness in (1, 2):
        stale = simulate_step(TINY, cluster, ps_plan(**base, dp_mode="ps-stale",
                                                     staleness=staleness), fidelity="flow")
        assert stale.step_time_s == pytest.approx(compute, rel=1e-3)
        assert stale.breakdown["exposed_dp"] == pytest.approx(0, abs=compute * 1e-3)


def test_network_bound_staleness_cannot_beat_the_server_nic():
    """One server: the exchange of a step needs N*G through its NIC, whatever the staleness."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    plan = ps_plan(ps_servers=1, overlap_grad_reduce=False, ps_steps=6, dp_mode="ps-stale",
                   staleness=2)
    result = simulate_step(TINY, cluster, plan, fidelity="flow")
    nic_s = N * result.lowering.gradient_bytes / p2p_rate(cluster, "network")
    assert nic_s > compute_per_step_s(result, 0)
    assert result.step_time_s == pytest.approx(nic_s, rel=0.02)


class SlowTimer:
    """The roofline, ``factor`` times slower for ops named ``*.slow``."""

    def __init__(self, gpu, factor: float) -> None:
        self.model = ComputeModel(gpu)
        self.factor = factor

    def duration_ns(self, op) -> int:
        duration = self.model.duration_ns(op)
        return round(duration * self.factor) if op.name.endswith(".slow") else duration


def _run_with_straggler(plan: ParallelPlan, cluster, slow_rank: int, factor: float):
    """Step intervals per worker (s) with worker ``slow_rank``'s kernels ``factor`` x slower
    (the Program is full, so one rank's ops can be edited)."""
    layout, servers = ps_job_layout(cluster, plan)
    lowering = lower_ps_step(TINY, plan, servers=servers)
    ops = dict(lowering.program.ops_by_rank)
    ops[slow_rank] = [replace(op, name=f"{op.name}.slow")
                      if isinstance(op, ComputeOp) and not op.name.startswith("dp.") else op
                      for op in ops[slow_rank]]
    program = Program(ops_by_rank=ops, world_size=lowering.program.world_size)
    check_program(program)
    run = Engine(program, CostModel(layout, ALGORITHMS, fidelity="flow",
                                    compute=SlowTimer(cluster.gpu, factor))).run()
    ends = ps_step_ends(run.timeline, lowering)
    return {rank: (e[-1] - e[0]) / (len(e) - 1) / 1e9 for rank, e in ends.items()}


def test_async_workers_do_not_wait_for_a_straggler():
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    base = dict(ps_servers=N, ps_steps=4, global_batch=4 * N)
    sync = _run_with_straggler(ps_plan(**base), cluster, slow_rank=N - 1, factor=2.0)
    async_ = _run_with_straggler(ps_plan(**base, dp_mode="ps-async"), cluster, slow_rank=N - 1,
                                 factor=2.0)
    # BSP: everybody runs at the straggler's pace
    assert sync[0] == pytest.approx(sync[N - 1], rel=1e-3)
    # async: the fast workers keep their own pace, the straggler its own
    assert async_[0] < 0.7 * async_[N - 1]
    assert async_[N - 1] == pytest.approx(sync[N - 1], rel=0.05)


def test_bounded_staleness_lets_the_straggler_overlap_its_exchange():
    """With a 2x straggler, BSP's interval is its compute plus the exchange; with
    staleness 1 the exchange overlaps the next step, so the interval is its compute."""
    cluster = load_cluster("dgx-h100", ONE_GPU_NODES)
    base = dict(ps_servers=N, ps_steps=6, overlap_grad_reduce=False)
    sync = _run_with_straggler(ps_plan(**base), cluster, slow_rank=N - 1, factor=2.0)
    stale = _run_with_straggler(ps_plan(**base, dp_mode="ps-stale", staleness=1), cluster,
                                slow_rank=N - 1, factor=2.0)
    homogeneous = simulate_step(TINY, cluster, ps_plan(**base), fidelity="flow")
    slow_compute = 2 * compute_per_step_s(homogeneous, 0)
    assert stale[0] == pytest.approx(stale[N - 1], rel=1e-3)  # bounded: no one runs away
    assert stale[N - 1] == pytest.approx(slow_compute, rel=0.02)
    assert sync[N - 1] > stale[N - 1] * 1.2


# ----------------------------------------------------------------------- memory, layout
def test_memory_workers_hold_no_optimizer_servers_hold_their_shard():
    cluster = load_cluster("dgx-h100")
    params = model_costs.rank_params(TINY, layers=range(8), has_embedding=True,
                                     has_head=True).total
    servers = 2
    result = simulate_step(TINY, cluster, ps_plan(dp=8, global_batch=8, ps_servers=servers))
    worker = result.memory[0]
    assert worker.optimizer_bytes == 0
    assert worker.weights_bytes + worker.gradients_bytes == 4 * params
    server = result.ps["server_memory"]
    assert server["optimizer_bytes"] == pytest.approx(12 * params / servers, abs=12)
    assert server["weights_bytes"] == pytest.approx(2 * params / servers, abs=2)
    assert server["activations_bytes"] == 0
    colocated = simulate_step(TINY, cluster, ps_plan(dp=8, global_batch=8, ps_servers=servers,
                                                     ps_placement="colocated"))
    host = colocated.ps["host_memory"]
    assert host["total_bytes"] == pytest.approx(
        worker.total_bytes + server["total_bytes"] - server["workspace_bytes"])
    assert colocated.peak_memory_bytes == int(host["total_bytes"])
    stale = simulate_step(TINY, cluster, ps_plan(dp=8, global_batch=8, dp_mode="ps-stale",
                                                 staleness=1, ps_steps=2))
    assert stale.memory[0].weights_bytes == 2 * worker.weights_bytes  # double buffered


def test_out_of_memory_suggests_what_parameter_servers_can_change():
    model = load_model("llama3-8b")  # 8e9 params x 12 B of optimizer state on one server
    with pytest.raises(OutOfMemoryError) as info:
        simulate_step(model, load_cluster("dgx-h100"), ps_plan(dp=8, global_batch=8))
    assert info.value.rank == 8 and "try ps_servers=2" in str(info.value)
    assert "zero" not in str(info.value)


def test_dedicated_servers_get_nodes_of_their_own():
    cluster = load_cluster("dgx-h100")
    result = simulate_step(TINY, cluster, ps_plan(dp=16, global_batch=16))
    assert result.ps["servers"] == 2  # default: one per worker node
    assert result.ps["server_ranks"] == [16, 17] and result.ps["nodes"] == 3
    assert result.ps["gpus_total"] == 18 and result.inputs["gpus"] == 16
    small = load_cluster("dgx-h100", {"max_nodes": 2})
    with pytest.raises(ValueError, match=r"^ps_servers: 2 dedicated servers need 1 more"):
        simulate_step(TINY, small, ps_plan(dp=16, global_batch=16))
    colocated = simulate_step(TINY, small, ps_plan(dp=16, global_batch=16,
                                                   ps_placement="colocated"))
    assert colocated.ps["server_ranks"] == [0, 8] and colocated.ps["nodes"] == 2


# --------------------------------------------------------------------- plans, allreduce
@pytest.mark.parametrize("fields,field", [
    (dict(dp_mode="ps"), "dp_mode"),
    (dict(dp_mode="ps-sync", tp=2, dp=2), "dp_mode"),
    (dict(dp_mode="ps-sync", pp=2, dp=2), "dp_mode"),
    (dict(dp_mode="ps-sync", zero=1), "zero"),
    (dict(dp_mode="ps-sync", ps_placement="nearby"), "ps_placement"),
    (dict(dp_mode="ps-sync", ps_servers=-1), "ps_servers"),
    (dict(dp_mode="ps-sync", ps_servers=5, ps_placement="colocated"), "ps_servers"),
    (dict(dp_mode="ps-sync", staleness=1), "staleness"),
    (dict(dp_mode="ps-stale", staleness=-1), "staleness"),
    (dict(dp_mode="ps-stale", staleness=2, ps_steps=2), "ps_steps"),
    (dict(dp_mode="ps-async", ps_steps=0), "ps_steps"),
    (dict(ps_servers=2), "ps_servers"),
    (dict(ps_steps=3), "ps_steps"),
])
def test_bad_ps_plans_are_one_line_errors(fields, field):
    values = dict(dp=4, global_batch=4, seq_len=512, zero=0)
    values.update(fields)
    with pytest.raises(ValueError) as info:
        validate_plan(ParallelPlan(**values), num_layers=8, num_heads=8, num_kv_heads=8)
    message = str(info.value)
    assert message.startswith(f"{field}: ") and "\n" not in message


def test_allreduce_results_have_no_ps_entry_and_are_unchanged():
    cluster = load_cluster("dgx-h100")
    plan = ParallelPlan(dp=8, global_batch=16, seq_len=512)
    result = simulate_step(TINY, cluster, plan)
    assert result.ps is None and "ps" not in result.to_dict()
    same = simulate_step(TINY, cluster, replace(plan, dp_mode="allreduce", ps_steps=1))
    assert same.step_time_s == result.step_time_s


# ---------------------------------------------------------------------------------- CLI


def test_cli_simulates_parameter_servers(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 1024, "num_hidden_layers": 4,
                                  "num_attention_heads": 16, "num_key_value_heads": 4,
                                  "intermediate_size": 4096, "vocab_size": 32000}))
    code, out, err = run_cli(capsys, "simulate", "--model", str(config), "--gpus", "8",
                             "--seq-len", "1024", "--global-batch", "32", "--dp-mode",
                             "ps-stale", "--staleness", "1",
                             "--ps-steps", "3", "--ps-servers", "2", "--ps-placement",
                             "colocated", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["inputs"]["plan"]["dp_mode"] == "ps-stale"
    assert data["inputs"]["plan"]["zero"] == 0  # the PS default
    assert data["ps"]["servers"] == 2 and data["ps"]["server_ranks"] == [0, 4]
    assert len(data["ps"]["step_ends_s"]) == 3
    code, out, err = run_cli(capsys, "simulate", "--model", str(config), "--gpus", "8",
                             "--seq-len", "1024", "--global-batch", "32", "--dp-mode",
                             "ps-sync")
    assert code == 0, err
    assert "parameter servers: ps-sync, 1 dedicated server(s) on ranks 8" in out


@pytest.mark.parametrize("args,field", [
    (["--dp-mode", "ps-lazy"], "dp_mode"),
    (["--dp-mode", "ps-sync", "--tp", "2"], "dp_mode"),
    (["--dp-mode", "ps-sync", "--zero", "1"], "zero"),
    (["--dp-mode", "ps-stale", "--staleness", "3", "--ps-steps", "2"], "ps_steps"),
    (["--ps-servers", "2"], "ps_servers"),
])
def test_cli_rejects_bad_ps_options_in_one_line(capsys, args, field):
    code, _, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "8", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}")
