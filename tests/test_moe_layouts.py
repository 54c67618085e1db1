"""Expert layouts, dispatch volumes and routing as Megatron-Core runs MoE layers.

* groups: the expert side renumbers a pipeline stage's ranks as expert-TP x EP x
  expert-DP (Megatron-Core ``parallel_state``, order tp-ep-dp), so EP may exceed DP;
* dispatch (``token_dispatcher.py``): each TP rank routes its sequence shard; the
  alltoall dispatcher moves ``n_sp * k * h`` elements over EP, then ``etp`` times that
  over expert-TP; the allgather dispatcher gathers every token over EP x expert-TP; DeepEP
  crosses the network once per destination NVLink domain;
* routing: the most loaded EP rank's rows set the pace; capacity drops or pads.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hardware.catalog import load_cluster
from strategies import model_costs
from strategies.expert_routing import (
    expected_nodes_per_token,
    expert_fractions,
    routed_load,
)
from strategies.ir import CollectiveOp
from strategies.lowering import StepLowerer
from strategies.memory import rank_memory
from strategies.model_spec import ModelSpec, MoESpec
from strategies.models import load_model
from strategies.plan import ParallelPlan, RankLayout, validate_plan

H, E, K, FE = 256, 8, 2, 512
MOE = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=H, num_heads=8, num_kv_heads=8,
                head_dim=32, ffn_hidden_size=1024, vocab_size=1000,
                moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=FE, capacity_factor=0.0))


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=4, tp=2, pp=1, ep=4, micro_batch=1, global_batch=4, seq_len=64)
    base.update(kw)
    return ParallelPlan(**base)


def _expert_collectives(lowerer: StepLowerer, layer: int = 0, phase: str = "F"):
    return [op for op in lowerer.phase_ops(0, layer, phase)
            if isinstance(op, CollectiveOp) and op.axis == "ep"]


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize("kw", [dict(tp=2, cp=2, dp=4, pp=2, ep=4, expert_tp=1),
                                dict(tp=4, cp=1, dp=2, pp=2, ep=8, expert_tp=1),
                                dict(tp=2, cp=1, dp=8, pp=1, ep=4),
                                dict(tp=4, cp=2, dp=4, pp=1, ep=8, expert_tp=2),
                                # (groups of one: RankLayout._expert_group returns the rank)
                                dict(tp=2, cp=2, dp=2, pp=2, ep=1),
                                dict(tp=4, cp=1, dp=2, pp=2, ep=1, expert_tp=2)])
def test_expert_groups_follow_megatrons_expert_rank_generator(kw):
    """Megatron-Core's expert RankGenerator (order tp-ep-dp-pp over etp, ep, edp, pp):
    rank = etp_i + etp*(ep_i + ep*(edp_i + edp*pp_i)); a group varies one index."""
    plan = ParallelPlan(global_batch=kw["dp"], seq_len=64, **kw)
    layout = RankLayout(plan)
    etp, ep = layout.expert_tp, plan.ep
    edp = plan.tp * plan.cp * plan.dp // (etp * ep)
    assert edp == layout.expert_dp

    def rank(t, e, d, p):
        return t + etp * (e + ep * (d + edp * p))

    for p in range(plan.pp):
        for d in range(edp):
            for e in range(ep):
                for t in range(etp):
                    r = rank(t, e, d, p)
                    assert layout.ep_group(r) == tuple(rank(t, i, d, p) for i in range(ep))
                    assert layout.expert_tp_group(r) == tuple(rank(i, e, d, p) for i in range(etp))
                    assert layout.expert_dp_group(r) == tuple(rank(t, e, i, p) for i in range(edp))


def test_ep_may_exceed_dp_and_bad_layouts_are_one_line_errors():
    plan = ParallelPlan(dp=2, tp=4, ep=8, expert_tp=1, global_batch=2, seq_len=64)
    validate_plan(plan, num_layers=4, num_heads=8, num_kv_heads=8, num_experts=8,
                  expert_ffn_hidden_size=FE)
    assert RankLayout(plan).ep_group(0) == tuple(range(8))  # spans TP x DP
    with pytest.raises(ValueError, match=r"^ep: expert_tp 4 x ep 8 = 32 does not divide") as info:
        ParallelPlan(dp=2, tp=4, ep=8, global_batch=2, seq_len=64)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="^expert_tp: 3 does not divide the experts' FFN"):
        validate_plan(ParallelPlan(dp=3, ep=1, expert_tp=3, global_batch=3, seq_len=64),
                      num_layers=4, num_heads=8, num_kv_heads=8, num_experts=8,
                      expert_ffn_hidden_size=FE)
    for field, value in (("moe_capacity_factor", "lots"), ("moe_expert_load", "zipf:-1"),
                         ("moe_dispatcher", "nvshmem")):
        with pytest.raises(ValueError, match=f"^{field}: ") as info:
            _plan(**{field: value})
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="^moe_a2a_overlap: needs virtual pipeline stages"):
        _plan(pp=2, global_batch=8, moe_a2a_overlap=True)
    with pytest.raises(ValueError, match="^ep: 4 needs a mixture-of-experts model"):
        validate_plan(_plan(), num_layers=4, num_heads=8, num_kv_heads=8)
    with pytest.raises(ValueError, match="^sequence_parallel: false is not valid"):
        validate_plan(_plan(sequence_parallel=False), num_layers=4, num_heads=8,
                      num_kv_heads=8, num_experts=8)


# --------------------------------------------------------------------------- dispatch


def test_alltoall_dispatch_moves_the_sequence_shard_and_gathers_over_expert_tp():
    n_sp = 64 // 2  # micro_batch * seq_len / tp
    pairs = n_sp * K * H * 2
    same = _expert_collectives(StepLowerer(MOE, _plan()))
    assert [(op.kind, op.size_bytes, len(op.group)) for op in same] == [
        ("alltoall", pairs, 4), ("all_gather", 2 * pairs, 2),
        ("reduce_scatter", 2 * pairs, 2), ("alltoall", pairs, 4)]
    # expert-TP 1: no gather; EP 8 spans the TP ranks too
    narrow = _expert_collectives(StepLowerer(MOE, _plan(ep=8, expert_tp=1)))
    assert [(op.kind, op.size_bytes, len(op.group)) for op in narrow] == [
        ("alltoall", pairs, 8), ("alltoall", pairs, 8)]
    # the backward mirrors it: combine's way back to the experts, then the dispatch's
    back = _expert_collectives(StepLowerer(MOE, _plan()), phase="B")
    assert [op.kind for op in back] == ["alltoall", "all_gather", "reduce_scatter", "alltoall"]


def test_allgather_dispatcher_gathers_every_token_over_ep_and_expert_tp():
    ops = _expert_collectives(StepLowerer(MOE, _plan(moe_dispatcher="allgather")))
    gathered = 2 * 4 * (64 // 2) * H * 2  # etp * ep * n_sp * h * bf16
    assert [(op.kind, op.size_bytes, len(op.group)) for op in ops] == [
        ("all_gather", gathered, 8), ("reduce_scatter", gathered, 8)]


def test_deepep_crosses_the_network_once_per_domain():
    """DeepSeek-V3 routing (256 experts, top-8, at most 4 of 8 node groups) over EP 64 on
    8-GPU domains: a token reaches 3.63 nodes on average (5.29 unlimited), and the network
    half of the dispatch carries that many copies, beside the NVLink half."""
    uniform = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert expected_nodes_per_token(256, 8, 8) == pytest.approx(uniform, rel=1e-12)
    limited = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert expected_nodes_per_token(256, 8, 8, groups=8, group_topk=4) == pytest.approx(
        limited, rel=1e-12)
    assert (uniform, limited) == (pytest.approx(5.295, abs=1e-3), pytest.approx(3.629, abs=1e-3))
    model = replace(load_model("deepseek-v3"), num_layers=4, mtp_layers=0,
                    moe=replace(load_model("deepseek-v3").moe, first_dense_layers=0))
    plan = ParallelPlan(dp=64, ep=64, global_batch=64, seq_len=4096, moe_dispatcher="deepep",
                        moe_dispatch_fp8=True)
    lowerer = StepLowerer(model, plan, domain_gpus=8)
    rail, local = _expert_collectives(lowerer)[:2]
    element = 1 + 4 / 128
    assert (rail.kind, len(rail.group), rail.stream) == ("alltoall", 8, "ep.ep_rail")
    assert rail.size_bytes == int(4096 * limited * 7 / 8 * 7168 * element * 8 / 7)
    assert (local.kind, len(local.group), local.size_bytes) == (
        "alltoall", 8, int(4096 * 8 * 7168 * element))
    # in one NVLink domain (a 72-GPU NVL72 rack) it is one all-to-all
    one = _expert_collectives(StepLowerer(model, plan, domain_gpus=72))[0]
    assert (len(one.group), one.size_bytes) == (64, int(4096 * 8 * 7168 * element))


def test_ep_inside_an_nvl72_domain_exposes_less_all_to_all_than_across_8_gpu_nodes():
    from sim.step import simulate_step

    model = load_model("mixtral-8x7b")
    plan = ParallelPlan(dp=32, tp=2, ep=8, expert_tp=1, pp=1, global_batch=64, seq_len=4096)
    cluster = load_cluster("gb200-nvl72")
    rack = simulate_step(model, cluster, plan, fidelity="analytic")
    nodes = simulate_step(model, replace(cluster, scale_up=replace(cluster.scale_up,
                                                                   domain_gpus=4)),
                          plan, fidelity="analytic")
    assert rack.breakdown["exposed_ep"] < 0.5 * nodes.breakdown["exposed_ep"]


# --------------------------------------------------------------------------- routing


def test_the_most_loaded_rank_sets_the_rows_and_capacity_drops_or_pads(tmp_path):
    zipf = expert_fractions("zipf:1.0", 8)
    weights = [1 / (e + 1) for e in range(8)]
    assert zipf == pytest.approx([w / sum(weights) for w in weights], rel=1e-12)
    busiest = max(sum(zipf[2 * i:2 * i + 2]) for i in range(4))
    assert routed_load(zipf, 4, None, False).rows_factor == pytest.approx(4 * busiest)
    assert routed_load(expert_fractions("uniform", 8), 4, None, False).rows_factor == 1.0
    capped = routed_load(zipf, 4, 1.0, False)
    assert capped.rows_factor == pytest.approx(4 * min(zipf[0], 1 / 8) + 4 * min(zipf[1], 1 / 8))
    assert capped.dropped_fraction == pytest.approx(sum(max(0, f - 1 / 8) for f in zipf))
    assert routed_load(zipf, 4, 1.25, True).rows_factor == 1.25
    counts = tmp_path / "tokens.csv"
    counts.write_text("# tokens per expert\n10, 30\n20 40 0 0 0 100\n")
    assert expert_fractions(str(counts), 8) == pytest.approx(
        [x / 200 for x in (10, 30, 20, 40, 0, 0, 0, 100)])
    with pytest.raises(ValueError, match="moe_expert_load: .* has 8 counts; give 16"):
        expert_fractions(str(counts), 16)


def test_imbalance_and_capacity_reach_the_expert_gemms_and_the_all_to_all():
    def experts_and_dispatch(**kw):
        lowerer = StepLowerer(MOE, _plan(**kw))
        gemm = next(k for k in lowerer.kernels(0) if k.name == "moe.experts.gate_up")
        return gemm.fwd_flops, _expert_collectives(lowerer)[0].size_bytes

    flops, size = experts_and_dispatch()
    factor = routed_load(expert_fractions("zipf:1.2", E), 4, None, False).rows_factor
    assert factor > 1
    hot = experts_and_dispatch(moe_expert_load="zipf:1.2")
    assert hot[0] == pytest.approx(flops * factor) and hot[1] == int(size * factor)
    padded = experts_and_dispatch(moe_capacity_factor="1.5", moe_pad_to_capacity=True)
    assert padded[0] == pytest.approx(1.5 * flops)


# --------------------------------------------------------------------------- memory


def test_expert_params_and_their_optimizer_follow_expert_tp_and_expert_dp():
    """Experts split E/ep ways and f_e/etp wide; ZeRO-1 shards them over expert-DP =
    tp*cp*dp/(etp*ep) ranks, the rest over dp*cp."""
    plan = _plan(ep=8, expert_tp=1, zero=1, tp=2, dp=4, global_batch=4)
    dense, expert = model_costs.layer_params(MOE, 1, tp=2, ep=8, etp=1)
    assert expert == (E // 8) * 3 * H * FE
    assert model_costs.layer_params(MOE, 1, tp=2, ep=4)[1] == (E // 4) * 3 * H * (FE // 2)
    layers = [0, 1, 2, 3]
    mem = rank_memory(MOE, plan, layers=layers, has_embedding=True, has_head=True,
                      inflight_microbatches=1)
    rp = model_costs.rank_params(MOE, layers=layers, tp=2, ep=8, etp=1, has_embedding=True,
                                 has_head=True)
    assert rp.expert_params == 4 * expert
    edp = 2 * 1 * 4 // (1 * 8)
    assert mem.optimizer_bytes == pytest.approx(12 * (rp.dense_params / 4 + rp.expert_params / edp))
