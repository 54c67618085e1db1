"""The batch evaluator of plan searches (sim.analytic_batch.BatchStepEvaluator) gives
every plan the step time sim.step.simulate_step gives at ``analytic`` fidelity, to the
nanosecond, on a few hundred seeded random plans of several models and every schedule
it covers (ZeRO 0-3, overlapped or not parameter gathers, CP, recompute, bucket sizes,
host issue, uneven splits); plans it does not cover go through analytic_step and agree
too. Its ranking values (throughput, peak memory, out of memory) are simulate_step's."""

from __future__ import annotations

import random

import pytest

from conftest import tiny_models, validate_for
from hardware.catalog import load_cluster
from sim.analytic_batch import BatchStepEvaluator
from sim.step import simulate_step
from strategies.memory import OutOfMemoryError
from strategies.models import load_model
from strategies.schedules import base, get_schedule, schedule_names
from trainsim.api import make_plan

GPUS = 16
#: Registered schedules the batch evaluator prices itself (micro-batches take one
#: route, no forward paired with a backward in their own lists).
COVERED = tuple(name for name in schedule_names()
                if not get_schedule(name).pairs_own_actions
                and get_schedule(name).placement(4, max(get_schedule(name).vpp_choices))
                .routes == 1)


def _random_plan(rng: random.Random, model):
    schedule = rng.choice(schedule_names() + COVERED)  # covered ones drawn more often
    vpp = rng.choice(get_schedule(schedule).vpp_choices + (1, 2))
    fields = dict(tp=rng.choice((1, 2, 4)), pp=rng.choice((1, 2, 4, 4)),
                  cp=rng.choice((1, 1, 2)), vpp=vpp, schedule=schedule,
                  micro_batch=rng.choice((1, 2)), global_batch=rng.choice((32, 64, 128)),
                  seq_len=rng.choice((1024, 2048)), zero=rng.choice((0, 1, 1, 2, 3)),
                  recompute=rng.choice(("none", "selective", "full")),
                  overlap_grad_reduce=rng.random() < 0.9,
                  overlap_param_gather=rng.random() < 0.7,
                  grad_bucket_bytes=rng.choice((1 << 20, 4 << 20, 40_000_000)),
                  host_issue=rng.choice(("off", "off", "eager", "graphed")))
    if fields["recompute"] == "full" and rng.random() < 0.1:
        fields["recompute_layers"] = 1
    if model.moe is not None:
        fields["ep"] = rng.choice((1, 2))
    return make_plan(gpus=GPUS, **fields)


def _plans(model, cluster, count: int, seed: int, vary=None):
    """``count`` valid random plans and, for each, the simulate_step result at analytic
    fidelity (check_memory=False) that proved it valid: the tests compare the evaluator
    with these (simulate_step is deterministic, so simulating a plan again would give the
    same result at twice the cost). ``vary(plan, index)``, when given, changes each drawn
    plan before it is validated (index: the plans kept so far)."""
    rng = random.Random(seed)
    plans, references, tries = [], [], 0
    while len(plans) < count and tries < 50 * count:
        tries += 1
        try:
            plan = _random_plan(rng, model)
            if vary is not None:
                plan = vary(plan, len(plans))
            validate_for(plan, model, cluster, GPUS)
            reference = simulate_step(model, cluster, plan, fidelity="analytic",
                                      check_memory=False)
        except ValueError:
            continue
        plans.append(plan)
        references.append(reference)
    return plans, references


def _models():
    dense, moe = tiny_models()
    return {"tiny": dense, "tiny-moe": moe, "llama3-8b": load_model("llama3-8b"),
            "gpt3-175b": load_model("gpt3-175b")}


def _batch_equals_references(model, cluster, plans, references) -> BatchStepEvaluator:
    """A fresh evaluator (one cache for all, as a search) gives each plan its reference's
    step to the nanosecond, cold and again from warm prices; returned for its counts.
    The references filled the 1F1B family's timing memo: it is emptied first, so the
    walks pause and their timings are solved together (prime_family_timings), as in a
    cold search."""
    evaluator = BatchStepEvaluator(model, cluster)
    base._FAMILY_TIMINGS.clear()
    got = evaluator.step_ns(plans)
    for plan, step_ns, reference in zip(plans, got, references, strict=True):
        assert step_ns / 1e9 == reference.step_time_s, plan
    assert evaluator.step_ns(plans) == got  # warm prices: the same integers
    return evaluator


@pytest.mark.parametrize("name,count,batch_at_least",
                         [("tiny", 200, 120), ("llama3-8b", 60, 30), ("gpt3-175b", 60, 20),
                          ("tiny-moe", 20, 0)])
def test_batch_step_equals_simulate_step(name, count, batch_at_least):
    model = _models()[name]
    cluster = load_cluster("dgx-h100")
    plans, references = _plans(model, cluster, count, seed=16)
    assert len(plans) == count
    evaluator = _batch_equals_references(model, cluster, plans, references)
    assert evaluator.counts["batch"] + evaluator.counts["reference"] == 2 * count
    assert evaluator.counts["batch"] >= 2 * batch_at_least
    if batch_at_least:
        covered = {p.schedule for p in plans if evaluator.covers(p) and p.pp > 1}
        assert covered == set(COVERED), covered
    assert len(COVERED) >= 6  # 1F1B, interleaved, GPipe, ZB-H1/H2, ZB-V, ...


def test_host_issue_plans_batch_equal_simulate_step():
    """Plans whose CPU issues the kernels (eager, compiled, partial; graphed is host-free)
    take the batch path (phases as HostForms, the tail walk carrying the CPU's lead, the
    rank ends' host bounds from each schedule shape's blocks) and give simulate_step's
    step to the ns: dense models with and without pipelines, a model whose layers
    alternate kinds (the CPU issues them in order: forms do not commute) and an MoE
    model (through analytic_step), every covered schedule met with a pipeline."""
    import dataclasses

    cluster = load_cluster("dgx-h100")
    dense, moe = tiny_models()
    windowed = dataclasses.replace(dense, name="tiny-swa", sliding_window=256,
                                   full_attention_every=2)
    modes = ("eager", "compiled", "partial")
    met: set = set()
    for model, count, seed in ((dense, 50, 21), (windowed, 30, 22),
                               (load_model("llama3-8b"), 24, 23), (moe, 6, 24)):
        plans, references = _plans(
            model, cluster, count, seed,
            vary=lambda plan, kept: dataclasses.replace(plan,
                                                        host_issue=modes[kept % len(modes)]))
        assert len(plans) == count
        evaluator = _batch_equals_references(model, cluster, plans, references)
        batch = [plan for plan in plans if evaluator.covers(plan)]
        if model.moe is None:
            assert len(batch) >= count // 2, len(batch)
            met |= {(plan.host_issue, plan.pp > 1) for plan in batch}
            met |= {plan.schedule for plan in batch if plan.pp > 1}
        else:
            assert not batch and evaluator.counts["batch"] == 0
    assert {(mode, piped) for mode in modes for piped in (False, True)} <= met, met
    assert set(COVERED) <= met, met


def test_fp8_delayed_scaling_plans_batch_equal_simulate_step():
    """FP8 ``te-delayed`` plans carry Transformer Engine's amax all-reduce (an ``amax``
    part after every stage's layers, priced on the stage's own rank by its bytes and
    group: sim.analytic_step.AnalyticStepModel._kind_cost) and take the batch path:
    simulate_step's step to the ns with TP x DP x CP and TP x CP (tp_only_amax_red)
    groups, the op off (amax_reduction none) on some, host issue on some, every covered
    schedule, no pipeline with ZeRO's gathers (the whole-rank walk)."""
    import dataclasses

    from strategies.lowering import reduces_amax

    cluster = load_cluster("dgx-h100")
    dense, _ = tiny_models()
    modes = ("off", "eager", "off", "graphed", "compiled")
    met: set = set()
    for model, count, seed in ((dense, 60, 31), (load_model("llama3-8b"), 16, 32)):
        def vary(plan, kept):
            return dataclasses.replace(plan, dtype="fp8", fp8_recipe="te-delayed",
                                       tp_only_amax_red=kept % 3 == 1,
                                       amax_reduction="none" if kept % 7 == 6 else "megatron",
                                       host_issue=modes[kept % len(modes)])

        plans, references = _plans(model, cluster, count, seed, vary=vary)
        assert len(plans) == count
        evaluator = _batch_equals_references(model, cluster, plans, references)
        batch = [plan for plan in plans if evaluator.covers(plan) and reduces_amax(plan)]
        assert len(batch) >= count // 3, len(batch)
        met |= {plan.schedule for plan in batch if plan.pp > 1}
        met |= {("tp_only", plan.tp_only_amax_red) for plan in batch}
        met |= {("hosted", plan.host_issue in ("eager", "compiled")) for plan in batch}
        met |= {"whole rank" for plan in batch if plan.pp == 1 and evaluator._gathers(plan)}
    assert set(COVERED) | {("tp_only", True), ("tp_only", False), ("hosted", True),
                           "whole rank"} <= met, met


def test_rank_results_are_simulate_steps():
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100")
    plans, _ = _plans(model, cluster, 50, seed=5)
    plans += [make_plan(gpus=GPUS, tp=1, pp=1, micro_batch=8, global_batch=256,
                        seq_len=8192, zero=0)]  # does not fit
    results = BatchStepEvaluator(model, cluster).rank_results(plans)
    fits = 0
    for plan, result in zip(plans, results):
        try:
            full = simulate_step(model, cluster, plan, fidelity="analytic").to_dict()
        except OutOfMemoryError:
            assert "out_of_memory" in result, plan
            continue
        fits += 1
        for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                    "peak_memory_bytes"):
            assert result[key] == full[key], (key, plan)
    assert 0 < fits < len(plans)


def test_search_ranked_by_the_batch_evaluator_is_the_search_by_full_results(monkeypatch):
    from trainsim import planner

    def search():
        report = planner.search("llama3-8b", cluster="dgx-h100", gpus=16, workers=1, top=8,
                                global_batch=64,
                                space=planner.SearchSpace(recompute=("none", "full"),
                                                          zero=(1, 3)))
        return report.counts, report.dropped, [
            (p["plan"], p["step_time_s"], p["step_time_p50_s"], p["peak_memory_bytes"],
             p["fidelity"], p["breakdown"]) for p in report.plans]

    batch = search()
    # every plan ranked from its full simulate_step result, as before the evaluator
    monkeypatch.setattr(planner, "_rank_chunk", planner._evaluate_chunk)
    assert search() == batch
    assert batch[0]["examined"] > 8 * 2


def test_fill_run_closed_form_is_the_layer_by_layer_walk():
    """_fill_run (a run of identical layers in closed form) leaves the same total,
    stream free time and pending bytes as _fill_buckets layer by layer, over bucket
    sizes below, at and above a layer's bytes, pending bytes, reductions shorter and
    longer than the compute between buckets, and nothing to reduce (None)."""
    from sim.analytic_batch import _fill_buckets, _fill_run

    rng = random.Random(11)
    for _ in range(3000):
        dense = float(rng.choice((1, 3, 7, 1000, 2 ** 20, 123_456_789)))
        bucket = rng.choice((dense, dense * rng.choice((0.5, 2, 3.5, 40)), 40_000_000,
                             rng.uniform(1, 1e9)))
        start = float(rng.randrange(0, int(bucket))) if bucket >= 1 and rng.random() < 0.7 \
            else 0.0
        count, part_ns = rng.randrange(0, 40), rng.randrange(0, 10_000)
        scale = rng.choice((0, 1, 100, 100_000))
        none = rng.random() < 0.1

        def reduction_ns(rank, group, size):
            return None if none else int(size) % 997 * scale + 1

        total, dp_free = rng.randrange(0, 10 ** 6), rng.randrange(0, 2 * 10 ** 6)
        walked, closed = {"dense": start}, {"dense": start}
        t, f = total, dp_free
        for _ in range(count):
            t += part_ns
            f = _fill_buckets(walked, (dense, 0.0), False, bucket, t, f, {}, reduction_ns, 0)
        got = _fill_run(closed, dense, count, part_ns, bucket, total, dp_free, {},
                        reduction_ns, 0)
        assert got == (t, f), (dense, bucket, start, count, part_ns, scale)
        assert closed["dense"] == walked["dense"] and closed.get("expert", 0.0) == \
            walked.get("expert", 0.0)


def test_whole_rank_closed_forms_equal_simulate_step():
    """Without pipeline parallelism and with parameter gathers the evaluator walks one
    rank's actions; a stage of one layer kind takes its gathers (ZeRO-1/2 overlapped:
    micro-batch 0's forward; ZeRO-3: every action) and its last backward's buckets in
    closed form (_whole_rank_ns). Step times must equal simulate_step's to the ns, with
    and without split backwards, for every recompute mode and bucket sizes that fill
    one, several and no buckets per layer run; and a model whose layers alternate
    kinds (sliding windows) takes the layer-by-layer walk."""
    import dataclasses

    cluster = load_cluster("dgx-h100")
    dense, _ = tiny_models()
    windowed = dataclasses.replace(dense, name="tiny-swa", sliding_window=256,
                                   full_attention_every=2)
    checked = 0
    for model in (dense, load_model("llama3-8b"), windowed):
        evaluator = BatchStepEvaluator(model, cluster)
        plans = []
        for zero, overlap in ((1, True), (2, True), (3, False), (3, True)):
            for schedule in ("1f1b", "zb-h1"):
                for recompute in ("none", "full"):
                    for bucket in (1 << 20, 40_000_000, 1 << 34):
                        try:
                            plan = make_plan(gpus=GPUS, tp=2, pp=1, micro_batch=1,
                                             global_batch=64, seq_len=1024, zero=zero,
                                             overlap_param_gather=overlap, schedule=schedule,
                                             recompute=recompute, grad_bucket_bytes=bucket)
                            validate_for(plan, model, cluster, GPUS)
                        except ValueError:
                            continue
                        plans.append(plan)
        got = evaluator.step_ns(plans)
        for plan, step_ns in zip(plans, got):
            reference = simulate_step(model, cluster, plan, fidelity="analytic",
                                      check_memory=False)
            assert step_ns / 1e9 == reference.step_time_s, (model.name, plan)
        checked += evaluator.counts["batch"]
    assert checked >= 60


def _zero3_plans(model, cluster, gpus: int, count: int, seed: int, schedules, vpp_of,
                 hosts=None) -> tuple[list, list]:
    """``count`` seeded random ZeRO-3 plans on ``gpus`` GPUs (a schedule of
    ``schedules``, its ``vpp_of(rng, schedule)``, FP8 amax parts, CP, recompute, bucket
    sizes that fill one, several or no buckets per layer, a ``hosts`` issue mode when
    given) and their simulate_step results at analytic fidelity."""
    rng = random.Random(seed)
    plans, references = [], []
    while len(plans) < count:
        schedule = rng.choice(schedules)
        fp8 = rng.random() < 0.2
        try:
            plan = make_plan(
                gpus=gpus, tp=rng.choice((1, 2)), pp=rng.choice((2, 4)),
                cp=rng.choice((1, 1, 2)), vpp=vpp_of(rng, schedule),
                schedule=schedule, micro_batch=rng.choice((1, 2)),
                global_batch=rng.choice((32, 64, 128)), seq_len=rng.choice((1024, 2048)),
                zero=3, recompute=rng.choice(("none", "selective", "full")),
                grad_bucket_bytes=rng.choice((1 << 18, 1 << 20, 4 << 20, 1 << 34)),
                **({"host_issue": rng.choice(hosts)} if hosts else {}),
                **(dict(dtype="fp8", fp8_recipe="te-delayed") if fp8 else {}))
            validate_for(plan, model, cluster, gpus)
        except ValueError:
            continue
        plans.append(plan)
        references.append(simulate_step(model, cluster, plan, fidelity="analytic",
                                        check_memory=False))
    return plans, references


def test_zero3_timed_tails_batch_equal_simulate_step(monkeypatch):
    """ZeRO-3 plans whose pipeline timing runs each rank's tail apart (ZB-H1, ZB-H2,
    ZB-V: ``PipelineTiming.rank_tail``) walk that tail with its parameter gathers queued
    behind its reductions (AnalyticStepModel._regathers) and take the batch path
    (BatchStepEvaluator._regather_walk) instead of analytic_step: simulate_step's step
    to the ns on seeded random plans of three models (one whose layers alternate kinds)
    on 16 and 32 GPUs, with host issue, FP8 amax parts and bucket sizes that fill one,
    several or no buckets per run; every one counted as ``batch``."""
    import dataclasses

    from sim.analytic_batch import BatchStepEvaluator as Evaluator

    walked = []
    original = Evaluator._regather_rank
    monkeypatch.setattr(Evaluator, "_regather_rank",
                        lambda self, *args: walked.append(args[0]) or original(self, *args))
    cluster = load_cluster("dgx-h100")
    dense, _ = tiny_models()
    windowed = dataclasses.replace(dense, name="tiny-swa", sliding_window=256,
                                   full_attention_every=2)
    hosts = ("off", "off", "eager", "graphed", "compiled")
    met: set = set()
    for model, gpus, count, seed in ((dense, 16, 40, 41), (windowed, 16, 20, 42),
                                     (dense, 32, 20, 43), (load_model("llama3-8b"), 32, 12, 44)):
        plans, references = _zero3_plans(
            model, cluster, gpus, count, seed, ("zb-h1", "zb-h1", "zb-h2", "zb-v"),
            lambda rng, schedule: 2 if schedule == "zb-v" else 1, hosts)
        walked.clear()
        evaluator = _batch_equals_references(model, cluster, plans, references)
        assert evaluator.counts == {"batch": 2 * count, "reference": 0, "event": 0}
        assert walked, model.name  # (ranks whose tails the timing runs apart)
        met |= {plan.schedule for plan in plans}
        met |= {("hosted", plan.host_issue in ("eager", "compiled")) for plan in plans}
    assert {"zb-h1", "zb-h2", "zb-v", ("hosted", True), ("hosted", False)} <= met, met


def test_fill_run_with_gather_waits_is_the_layer_by_layer_walk():
    """_fill_run with ``wait`` (layer i also waits for its parameter gather, ending at
    G + i g) and _gathered_end leave the same total, stream and pending bytes as the walk
    layer by layer, gathers shorter and longer than a layer, ending before and after
    the run starts."""
    from sim.analytic_batch import _fill_buckets, _fill_run, _gathered_end

    rng = random.Random(12)
    for _ in range(3000):
        dense = float(rng.choice((1, 7, 2 ** 20, 123_456_789)))
        bucket = rng.choice((dense, dense * rng.choice((0.5, 2, 3.5, 40)), 40_000_000))
        start = float(rng.randrange(0, int(bucket))) if bucket >= 1 and rng.random() < 0.7 \
            else 0.0
        count, part_ns = rng.randrange(0, 40), rng.randrange(0, 10_000)
        total = rng.randrange(0, 10 ** 6)
        gathered, gather_ns = rng.randrange(0, 2 * 10 ** 6), rng.randrange(0, 20_000)
        scale = rng.choice((0, 1, 100, 100_000))

        def reduction_ns(rank, group, size):
            return int(size) % 997 * scale + 1

        dp_free = rng.randrange(0, 2 * 10 ** 6)
        walked, closed = {"dense": start}, {"dense": start}
        t, f = total, dp_free
        for i in range(1, count + 1):
            t = max(t, gathered + i * gather_ns) + part_ns
            f = _fill_buckets(walked, (dense, 0.0), False, bucket, t, f, {}, reduction_ns, 0)
        got = _fill_run(closed, dense, count, part_ns, bucket, total, dp_free, {},
                        reduction_ns, 0, (gathered, gather_ns))
        assert got == (t, f), (dense, bucket, start, count, part_ns, gathered, gather_ns)
        assert closed["dense"] == walked["dense"]
        if count:
            assert _gathered_end(total, count, part_ns, gathered, gather_ns) == t


def test_zero3_one_f_one_b_family_batch_equals_simulate_step(monkeypatch):
    """ZeRO-3 plans of the 1F1B family (1F1B, interleaved, GPipe) walk their units with
    their gathers (AnalyticStepModel._gathered_step; BatchStepEvaluator.
    _gathered_step_ns from shared prices): simulate_step's step to the ns on seeded
    random plans of three models (one whose layers alternate kinds) on 16 and 32 GPUs,
    with FP8 amax parts, CP and bucket sizes that fill one, several or no buckets per
    layer; every plan without the CPU's cost counted as ``batch`` and walked."""
    import dataclasses

    from sim.analytic_batch import BatchStepEvaluator as Evaluator

    walked = []
    original = Evaluator._gathered_step_ns
    monkeypatch.setattr(Evaluator, "_gathered_step_ns",
                        lambda self, plan, *args: walked.append(plan)
                        or original(self, plan, *args))
    cluster = load_cluster("dgx-h100")
    dense, _ = tiny_models()
    windowed = dataclasses.replace(dense, name="tiny-swa", sliding_window=256,
                                   full_attention_every=2)
    met: set = set()
    for model, gpus, count, seed in ((dense, 16, 30, 51), (windowed, 16, 15, 52),
                                     (dense, 32, 15, 53), (load_model("llama3-8b"), 32, 10, 54)):
        plans, references = _zero3_plans(
            model, cluster, gpus, count, seed, ("1f1b", "interleaved", "interleaved", "gpipe"),
            lambda rng, schedule: rng.choice((2, 4)) if schedule == "interleaved" else 1)
        walked.clear()
        evaluator = _batch_equals_references(model, cluster, plans, references)
        assert evaluator.counts == {"batch": 2 * count, "reference": 0, "event": 0}
        assert len(walked) == 2 * count, model.name
        met |= {plan.schedule for plan in plans}
    assert {"1f1b", "interleaved", "gpipe"} <= met, met
