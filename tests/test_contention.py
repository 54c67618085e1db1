"""NCCL kernels holding SMs while compute runs beside them (plan ``comm_sm_contention``,
issue 12): the processor-sharing closed form, the closed-form step against the event
engine (to the nanosecond without pipelines; within a stated tolerance with them;
DualPipe falls back to the engine), and the batch evaluator handing such plans over."""

import pytest

from hardware.cost import shared_sm_ns
from trainsim import api


def test_shared_sm_ns_closed_form():
    # 1,000 ns alone on 100 SMs = 100,000 SM-ns; 20 CTAs held over [0, 500): 80 SMs do
    # 40,000 there, the other 60,000 on all 100 SMs take 600 ns more
    assert shared_sm_ns(0, 1000, 100, [(0, 500, 20)]) == 1100
    # the same interval seen from a start at 250: 250 ns at 80 SMs (20,000), 800 ns after
    assert shared_sm_ns(250, 1000, 100, [(0, 500, 20)]) == 1050
    # overlapping intervals add their CTAs; at most sms - 1 are taken (1 SM left)
    assert shared_sm_ns(0, 10, 4, [(0, 100, 3), (0, 100, 3)]) == 40
    # an interval over before the start, or none: alone
    assert shared_sm_ns(600, 1000, 100, [(0, 500, 20)]) == 1000
    assert shared_sm_ns(0, 1000, 100, []) == 1000
    # the ceiling of the last partial nanosecond
    assert shared_sm_ns(0, 1, 3, [(0, 10, 1)]) == 2


# Without pipelines the closed form's one causal pass is the engine's schedule exactly:
# ZeRO-3 gathers running ahead over several micro-batches, behind every micro-batch's
# reduce-scatters (FSDP v1 outside no_sync), ZeRO-1's overlapped parameter gather, and
# CP's ring exchanges overlapping attention inside a layer.
EXACT = [
    dict(gpus=64, tp=1, seq_len=4096, global_batch=128, zero=3),
    dict(gpus=64, tp=1, seq_len=4096, global_batch=128, zero=3,
         grad_reduce_every_microbatch=True),
    # a bucket the head's gradients do not fill: the backward's gathers are not held
    # behind a head reduction and run during the head (the walk finds the fills first)
    dict(gpus=64, tp=1, seq_len=4096, global_batch=128, zero=3,
         grad_reduce_every_microbatch=True, grad_bucket_bytes=2_000_000_000),
    dict(gpus=64, tp=2, seq_len=4096, global_batch=128, zero=1, overlap_param_gather=True),
    dict(gpus=64, tp=4, seq_len=8192, global_batch=64, cp=2),
]


@pytest.mark.parametrize("case", EXACT, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_contended_analytic_equals_event_to_the_ns_without_pipelines(case):
    analytic, event = [api.simulate("llama3-8b", fidelity=f, comm_sm_contention=True, **case)
                       for f in ("analytic", "event")]
    assert analytic.step_time_s == event.step_time_s
    assert "analytic_fallback" not in analytic.stats
    free = api.simulate("llama3-8b", fidelity="analytic", **case)
    assert free.inputs["plan"]["comm_sm_contention"] is False  # opt-in (default off)
    # overlapped collectives take SMs: the step is slower, and by no more than the
    # whole compute running on the SMs the largest NCCL kernel leaves (132 SMs, H100)
    assert free.step_time_s < analytic.step_time_s < free.step_time_s * 132 / (132 - 32)


def test_contended_pipeline_is_within_two_percent_of_event():
    """With pipelines the closed form stays an approximation: pipeline send/recvs do not
    take SMs there (the engine's do), and the drain's waits differ as without
    contention (tests/test_fidelity.py). 2 % on Megatron's interleaved 1F1B."""
    case = dict(gpus=64, tp=2, pp=4, vpp=2, seq_len=4096, global_batch=128,
                schedule="interleaved", comm_sm_contention=True)
    analytic, event = [api.simulate("llama3-8b", fidelity=f, **case)
                       for f in ("analytic", "event")]
    assert abs(analytic.step_time_s / event.step_time_s - 1) < 0.02


def test_dualpipe_with_contention_falls_back_to_the_engine():
    case = dict(gpus=64, tp=2, pp=4, seq_len=4096, global_batch=128,
                schedule="dualpipe", comm_sm_contention=True)
    analytic, event = [api.simulate("llama3-8b", fidelity=f, **case)
                       for f in ("analytic", "event")]
    assert analytic.stats["analytic_fallback"].startswith("event")
    assert analytic.step_time_s == event.step_time_s


def test_batch_evaluator_hands_contended_plans_to_analytic_step():
    from dataclasses import replace

    from hardware.catalog import load_cluster
    from sim.analytic_batch import BatchStepEvaluator
    from strategies.models import load_model
    from trainsim.api import make_plan

    evaluator = BatchStepEvaluator(load_model("llama3-8b"), load_cluster("dgx-h100"))
    plan = make_plan(gpus=64, tp=8, seq_len=4096, global_batch=64)
    assert evaluator.covers(plan)
    assert not evaluator.covers(replace(plan, comm_sm_contention=True))


def test_batch_evaluator_prices_contended_dualpipe_as_the_engine():
    from hardware.catalog import load_cluster
    from sim.analytic_batch import BatchStepEvaluator
    from sim.step import simulate_step
    from strategies.models import load_model
    from trainsim.api import make_plan

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    zero3 = make_plan(gpus=64, tp=1, seq_len=4096, global_batch=128, zero=3,
                      comm_sm_contention=True)
    dualpipe = make_plan(gpus=64, tp=2, pp=4, seq_len=4096, global_batch=128,
                         schedule="dualpipe", comm_sm_contention=True)
    evaluator = BatchStepEvaluator(model, cluster)
    found = evaluator.step_ns([zero3, dualpipe])
    assert evaluator.counts == {"batch": 0, "reference": 1, "event": 1}
    event = [simulate_step(model, cluster, plan, fidelity="event",
                           check_memory=False).step_time_s for plan in (zero3, dualpipe)]
    assert [n / 1e9 for n in found] == event


def test_a_cta_cap_without_contention_is_a_one_line_error():
    from strategies.plan import ParallelPlan

    with pytest.raises(ValueError, match=r"^nccl_max_ctas: 8 needs comm_sm_contention true"):
        ParallelPlan(nccl_max_ctas=8)


def test_contention_on_a_gpu_without_an_sm_count_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"^comm_sm_contention: true needs the GPU's SM count, "
                                         r"which preset 'dgx-h100'"):
        api.simulate("llama3-8b", gpus=8, tp=4, seq_len=2048, global_batch=8,
                     comm_sm_contention=True, overrides={"gpu.sm_count": 0})
