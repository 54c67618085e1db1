"""Hybrid sharding (HSDP, plan field ``dp_shard``): ZeRO/FSDP shard groups of ``dp_shard``
data-parallel ranks (x cp), replicated ``dp / dp_shard`` times.

Asserted exactly: the groups of every data-parallel collective and the bytes each rank
moves (closed forms by hand), the model-state memory, the closed form against the event
replay to the nanosecond, the symmetry-reduced program against the full one, and that
``dp_shard == dp`` is today's step to the byte.
"""

from __future__ import annotations

import pytest

from conftest import expect_one_line_error, run_cli
from hardware.catalog import load_cluster
from hardware.cost import CostModel
from sim.engine import Engine
from sim.step import job_layout
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import CollectiveOp
from strategies.lowering import StepLowerer, lower_step
from strategies.memory import rank_memory
from strategies.model_costs import rank_params
from strategies.models import load_model
from strategies.plan import ParallelPlan, RankLayout, validate_plan
from trainsim import api

MODEL = load_model("llama3-8b")


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=8, tp=2, cp=2, pp=1, zero=3, dp_shard=2, micro_batch=1, global_batch=8,
                seq_len=4096)
    base.update(kw)
    return ParallelPlan(**base)


# ------------------------------------------------------------------------------- groups

def test_shard_groups_are_consecutive_in_dp_and_replicas_strided():
    # rank = tp + 2*cp + 4*dp (order tp, cp, dp, pp)
    layout = RankLayout(_plan())
    assert layout.dp_shard_group(0) == (0, 2, 4, 6)          # dp 0-1 x cp 0-1, tp 0
    assert layout.dp_replica_group(0) == (0, 8, 16, 24)      # dp 0, 2, 4, 6 at cp 0
    assert layout.dp_shard_group(13) == (9, 11, 13, 15)      # tp 1, dp 2-3
    assert layout.dp_replica_group(13) == (5, 13, 21, 29)    # tp 1, cp 0, dp 1, 3, 5, 7
    whole = RankLayout(_plan(dp_shard=8))
    assert whole.dp_shard_group(5) == whole.group(5, "dp", "cp")
    assert whole.dp_replica_group(5) == (5,)


def _collectives(plan: ParallelPlan, model=MODEL) -> list[CollectiveOp]:
    return [op for op in StepLowerer(model, plan).rank_ops(0) if isinstance(op, CollectiveOp)]


@pytest.mark.parametrize("zero", [1, 3])
def test_dp_collectives_run_on_the_shard_group_then_the_replicas(zero):
    plan = _plan(zero=zero)
    shard, replicas = (0, 2, 4, 6), (0, 8, 16, 24)
    ops = _collectives(plan)
    dp_ops = [op for op in ops if op.axis == "dp"]
    scatters = [op for op in dp_ops if op.kind == "reduce_scatter"]
    reduces = [op for op in dp_ops if op.name.startswith("dp.all_reduce.grads.replica")]
    gathers = [op for op in dp_ops if op.kind == "all_gather"]
    norms = [op for op in dp_ops if op.name.endswith("optimizer.grad_norm")]
    assert scatters and len(reduces) == len(scatters) and len(norms) == 1
    assert {op.group for op in scatters + gathers + norms} == {shard}
    assert {op.group for op in reduces} == {replicas}
    # every bucket's shard (1 / (dp_shard * cp) of it) is all-reduced right after its
    # reduce-scatter, which it depends on
    for rs, ar in zip(scatters, reduces):
        assert ar.size_bytes == rs.size_bytes // 4
    # the whole model's gradients (bf16: the plan's default), reduce-scattered once
    dense = rank_params(MODEL, layers=range(MODEL.num_layers), tp=2, ep=1, has_embedding=True,
                        has_head=True).dense_params
    assert sum(op.size_bytes for op in scatters) == pytest.approx(2 * dense, abs=len(scatters))
    assert sum(op.size_bytes for op in reduces) == pytest.approx(2 * dense / 4,
                                                                 abs=len(reduces))
    if zero == 3:  # each layer's bf16 weights gathered in the forward and the backward
        layer = sum(k.params for k in StepLowerer(MODEL, plan).kernels(0))
        assert {op.size_bytes for op in gathers} == {2 * layer}
        assert len(gathers) == 2 * MODEL.num_layers
    else:  # ZeRO-1 overlapped: gathered once, in the first forward
        assert len(gathers) == MODEL.num_layers


def test_without_replicas_nothing_is_all_reduced_and_zero0_is_refused():
    assert not [op for op in _collectives(_plan(dp_shard=8)) if "replica" in op.name]
    expect_one_line_error(lambda: _plan(zero=0), "dp_shard", "zero")
    expect_one_line_error(lambda: _plan(dp_shard=3), "dp_shard", "divide")
    expect_one_line_error(lambda: _plan(dp_shard=1, cp=1), "dp_shard", "shards nothing")


def test_model_and_schedule_rules_are_one_line_errors():
    moe = load_model("mixtral-8x7b")
    plan = _plan(tp=1, cp=1, ep=8)
    expect_one_line_error(lambda: validate_plan(
        plan, num_layers=moe.num_layers, num_heads=moe.num_heads,
        num_kv_heads=moe.num_kv_heads, num_experts=8), "dp_shard", "mixture-of-experts")
    dual = _plan(pp=2, zero=1, schedule="dualpipe", cp=1, global_batch=32)
    expect_one_line_error(lambda: validate_plan(
        dual, num_layers=MODEL.num_layers, num_heads=MODEL.num_heads,
        num_kv_heads=MODEL.num_kv_heads), "dp_shard", "dualpipe")


# ------------------------------------------------------------------------------- memory

@pytest.mark.parametrize("zero, states", [
    (1, lambda p, d: 2 * p + 2 * p + 12 * p / d),
    (2, lambda p, d: 2 * p + 2 * p / d + 12 * p / d),
    (3, lambda p, d: 2 * p / d + 2 * p / d + 12 * p / d),
])
def test_model_states_divide_by_the_shard_group_not_dp(zero, states):
    p = rank_params(MODEL, layers=range(MODEL.num_layers), tp=1, ep=1, has_embedding=True,
                    has_head=True).dense_params
    plan = _plan(zero=zero, tp=1, cp=2, dp=8, dp_shard=2, grad_reduce_dtype="bf16")
    b = rank_memory(MODEL, plan, layers=range(MODEL.num_layers), has_embedding=True,
                    has_head=True, inflight_microbatches=1)
    assert b.weights_bytes + b.gradients_bytes + b.optimizer_bytes == pytest.approx(
        states(p, 2 * 2), rel=1e-15)  # D = dp_shard x cp
    whole = rank_memory(MODEL, _plan(zero=zero, tp=1, dp_shard=0, grad_reduce_dtype="bf16"),
                        layers=range(MODEL.num_layers), has_embedding=True, has_head=True,
                        inflight_microbatches=1)
    same = rank_memory(MODEL, _plan(zero=zero, tp=1, dp_shard=8, grad_reduce_dtype="bf16"),
                       layers=range(MODEL.num_layers), has_embedding=True, has_head=True,
                       inflight_microbatches=1)
    assert whole == same


# ------------------------------------------------------------------------------- timing

FIDELITY_CASES = [
    dict(gpus=64, tp=1, seq_len=4096, global_batch=64, zero=3, dp_shard=8),
    dict(gpus=64, tp=2, seq_len=4096, global_batch=64, zero=1, dp_shard=4),
    dict(gpus=64, tp=2, pp=2, seq_len=4096, global_batch=64, zero=1, dp_shard=4),
    dict(gpus=32, tp=2, cp=2, seq_len=8192, global_batch=16, zero=3, dp_shard=2),
    dict(gpus=64, tp=2, seq_len=4096, global_batch=64, zero=2, dp_shard=16,
         overlap_grad_reduce=False),
]


@pytest.mark.parametrize("case", FIDELITY_CASES, ids=lambda c: f"z{c['zero']}-s{c['dp_shard']}")
def test_analytic_equals_event_to_the_ns(case):
    analytic, event = (api.simulate("llama3-8b", fidelity=f, **case)
                       for f in ("analytic", "event"))
    assert analytic.step_time_s == event.step_time_s
    for key, seconds in event.breakdown.items():
        assert analytic.breakdown[key] == pytest.approx(seconds, abs=1e-9 * 1000), key


@pytest.mark.parametrize("zero", [1, 3])
def test_shard_size_dp_is_todays_step_to_the_byte(zero):
    case = dict(gpus=64, tp=2, seq_len=4096, global_batch=64, zero=zero)
    for fidelity in ("analytic", "event"):
        today = api.simulate("llama3-8b", fidelity=fidelity, **case)
        whole = api.simulate("llama3-8b", fidelity=fidelity, dp_shard=32, **case)
        assert whole.step_time_s == today.step_time_s
        assert whole.memory == today.memory


def test_replicas_add_the_cross_group_all_reduce_and_save_gather_time():
    """Shard groups of one node (8 GPUs on NVLink): gathers and reduce-scatters stay on
    NVLink, the shard's all-reduce crosses the nodes; the step differs from ZeRO-3 over
    all 64 GPUs and the dp exposure is what the engine replays (checked above)."""
    case = dict(gpus=64, tp=1, seq_len=4096, global_batch=64, zero=3)
    full = api.simulate("llama3-8b", fidelity="event", **case)
    node = api.simulate("llama3-8b", fidelity="event", dp_shard=8, **case)
    assert node.step_time_s != full.step_time_s
    assert max(m.total_bytes for m in node.memory.values()) > max(
        m.total_bytes for m in full.memory.values())
    spans = {name: r.timeline_frame() for name, r in (("full", full), ("node", node))}
    gathers = {name: f.loc[f["kind"] == "all_gather", "duration_ns"] for name, f in spans.items()}
    # the same gathers (each layer in forward and backward), within one node: shorter
    assert len(gathers["node"]) == len(gathers["full"]) > 0
    assert gathers["node"].sum() < gathers["full"].sum()
    replica = spans["node"]["op"].str.startswith("dp.all_reduce.grads.replica.")
    assert replica.any() and not spans["full"]["op"].str.contains("replica").any()


def test_symmetry_reduced_program_replays_as_the_full_one():
    cluster = load_cluster("dgx-h100")
    plan = ParallelPlan(dp=16, tp=2, pp=2, zero=1, dp_shard=4, micro_batch=1, seq_len=1024,
                        global_batch=32)
    layout = job_layout(cluster, plan.world_size)
    reduced = lower_step(MODEL, plan)
    full = lower_step(MODEL, plan, distinct=list(range(plan.world_size)))
    cost = CostModel(layout, ALGORITHMS, fidelity="event")
    small, big = (Engine(lowering.program, cost).run() for lowering in (reduced, full))
    assert len(reduced.program.ops_by_rank) < plan.world_size
    assert small.makespan_ns == big.makespan_ns


# ------------------------------------------------------------------ command line, import

def test_cli_option_and_printed_plan(capsys):
    code, out, _ = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16",
                           "--zero", "3", "--dp-shard", "8", "--global-batch", "16",
                           "--seq-len", "2048", "--fidelity", "analytic")
    assert code == 0 and "dp_shard 8" in out


def test_megatron_distributed_optimizer_instances_map_to_dp_shard():
    from trainsim.importers import import_job

    base = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
            "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16"]
    job = import_job(megatron_args=[*base, "--use-distributed-optimizer",
                                    "--num-distributed-optimizer-instances", "4"], gpus=16)
    assert job.plan["dp_shard"] == 4 and job.plan["zero"] == 1
    expect_one_line_error(lambda: import_job(
        megatron_args=[*base, "--num-distributed-optimizer-instances", "2"], gpus=16),
        "--num-distributed-optimizer-instances", "--use-distributed-optimizer")
    expect_one_line_error(lambda: import_job(
        megatron_args=[*base, "--use-distributed-optimizer",
                       "--num-distributed-optimizer-instances", "3"], gpus=16),
        "--num-distributed-optimizer-instances", "divide")
