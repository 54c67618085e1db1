"""MoE models through pipelines: DualPipe's forward-backward pairs hide the expert
all-to-all (DeepSeek-V3 report, arXiv 2412.19437, Section 3.2.1 and Figure 4), Megatron's
overlap does the same for interleaved 1F1B, the closed-form model equals the replay on
them, and the breakdown names the pipeline stage that sets the pace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware.catalog import load_cluster
from hardware.cost import CostModel
from sim.analytic_step import OpPricer
from sim.step import job_layout, simulate_step
from strategies.collectives.catalog import ALGORITHMS
from strategies.ir import ComputeOp
from strategies.lowering import StepLowerer
from strategies.model_spec import ModelSpec, MoESpec
from strategies.models import load_model
from strategies.plan import ParallelPlan

MIXTRAL = dict(dp=8, tp=2, pp=4, ep=8, seq_len=4096, global_batch=128)


def _step(plan, fidelity, model="mixtral-8x7b", cluster="dgx-h100"):
    return simulate_step(load_model(model) if isinstance(model, str) else model,
                         load_cluster(cluster), plan, fidelity=fidelity)


def test_a_dualpipe_pair_hides_the_all_to_all_when_compute_is_longer():
    """One forward-backward pair, list-scheduled as the lowering interleaves it: with
    EP inside a node (NVLink all-to-all shorter than the other micro-batch's compute) the
    pair takes its compute and hardly more (only the last all-to-all, with nothing of the
    other action left to run beside it, shows); the same two actions back to back expose
    every dispatch and combine."""
    plan = ParallelPlan(schedule="dualpipe", **MIXTRAL)
    lowerer = StepLowerer(load_model("mixtral-8x7b"), plan, domain_gpus=8)
    cost = CostModel(job_layout(load_cluster("dgx-h100"), plan.world_size), ALGORITHMS,
                     fidelity="analytic")
    pricer = OpPricer(cost)
    first, second = next((a, b) for a, b in zip(lowerer.actions()[1], lowerer.actions()[1][1:])
                         if a.overlap)
    pair = pricer.schedule(lowerer.pair_ops(1, first.stage, second.stage, second.comp))
    alone = [pricer.schedule(lowerer.phase_ops(1, layer, comp))
             for comp, stage in (("F", first.stage), (second.comp, second.stage))
             for layer in lowerer.stage_layers[stage]]
    hidden = pair.exposed_ns.get("ep", 0)
    exposed = sum(c.exposed_ns.get("ep", 0) for c in alone)
    assert hidden < 0.02 * pair.total_ns and exposed > 10 * hidden
    compute = sum(pricer.duration_ns(op) for op in lowerer.pair_ops(1, first.stage,
                                                                     second.stage, second.comp)
                  if isinstance(op, ComputeOp))
    assert pair.total_ns == compute + pair.exposed_ns.get("tp", 0) + hidden


@pytest.mark.parametrize("schedule, extra", [("dualpipe", {}),
                                             ("interleaved", dict(vpp=2, moe_a2a_overlap=True))])
def test_overlapped_pairs_hide_most_of_the_exposed_all_to_all(schedule, extra):
    """Steady-state pairs hide the expert all-to-all that 1F1B exposes; the closed-form
    model prices the pairs as the replay runs them (within 0.5 %)."""
    plain = _step(ParallelPlan(**MIXTRAL), "analytic")
    plan = ParallelPlan(schedule=schedule, **{**MIXTRAL, **extra})
    analytic, event = _step(plan, "analytic"), _step(plan, "event")
    assert analytic.step_time_s == pytest.approx(event.step_time_s, rel=0.005)
    assert analytic.breakdown["exposed_ep"] == pytest.approx(event.breakdown["exposed_ep"],
                                                             rel=0.05)
    assert event.breakdown["exposed_ep"] < 0.7 * plain.breakdown["exposed_ep"]
    assert event.step_time_s < plain.step_time_s


def test_dualpipe_holds_two_copies_of_its_chunks_and_reduces_them_together():
    plan = ParallelPlan(schedule="dualpipe", **MIXTRAL)
    lowerer = StepLowerer(load_model("mixtral-8x7b"), plan)
    assert lowerer.chunk_copies == 2 and lowerer.chunk_holders(1) == (1, 2)
    assert set(lowerer.rank_layers(0)) == set(lowerer.chunk_layers[0] + lowerer.chunk_layers[3])
    grad = lowerer._groups(lowerer.representatives[0])["grad"]
    assert len(grad) == 2 * plan.dp and {lowerer.layout.coords(r)["pp"] for r in grad} == {0, 3}
    assert lowerer.holds_embedding(3) and lowerer.holds_head(0)


def test_the_critical_stage_of_an_moe_model_with_dense_first_layers():
    """Dense first layers put a light stage first; the MoE stages' compute and all-to-all
    set the pace, and the top-level breakdown is theirs (the first stage waits: bubble)."""
    model = ModelSpec(name="dense-first", num_layers=8, hidden_size=2048, num_heads=16,
                      num_kv_heads=16, head_dim=128, ffn_hidden_size=4096, vocab_size=32000,
                      moe=MoESpec(num_experts=16, top_k=4, expert_ffn_hidden_size=2048,
                                  capacity_factor=0.0, first_dense_layers=2))
    plan = ParallelPlan(dp=8, tp=2, pp=4, ep=8, expert_tp=1, seq_len=4096, global_batch=64)
    for fidelity in ("analytic", "event"):
        result = _step(plan, fidelity, model=model)
        stages = result.stage_breakdown
        assert stages[0]["exposed_ep"] == 0 and stages[0]["bubble"] > stages[1]["bubble"]
        assert result.critical_stage != 0
        assert result.breakdown == stages[result.critical_stage]
        assert result.breakdown["exposed_ep"] > 0
        assert result.to_dict()["critical_stage"] == result.critical_stage
        busy = {p: sum(v for k, v in row.items() if k != "bubble") for p, row in stages.items()}
        assert busy[result.critical_stage] == pytest.approx(max(busy.values()), rel=0.005)
