"""The fast closed-form step (sim.analytic_step.AnalyticStepModel with ``fast``: action
counts from the schedule's closed form, stage walks from per-plan tables, no action
lists) gives exactly what the reference walk over the schedule's action lists gives, on
a few hundred seeded random plans across models, every registered schedule, recompute,
CP, ZeRO, overlap, host issue and stragglers; and each schedule's closed-form action
counts and first actions equal those of its lists."""

from __future__ import annotations

import dataclasses
import random

import pytest

from conftest import tiny_models, validate_for
from hardware.catalog import load_cluster
from sim.analytic_step import PricingCache, analytic_step
from sim.step import job_layout
from strategies.lowering import StepLowerer
from strategies.models import load_model
from strategies.schedules import get_schedule, schedule_names
from strategies.schedules.base import count_actions
from trainsim.api import make_plan

GPUS = 16


def _random_plan(rng: random.Random, model):
    """A random plan on 16 GPUs (may be invalid: the caller skips those)."""
    moe = model.moe is not None
    schedule = rng.choice(schedule_names())
    vpp = rng.choice(get_schedule(schedule).vpp_choices + (1, 2))
    tp, pp, cp = rng.choice((1, 2, 4)), rng.choice((1, 2, 4)), rng.choice((1, 1, 2))
    fields = dict(tp=tp, pp=pp, cp=cp, vpp=vpp, schedule=schedule,
                  micro_batch=rng.choice((1, 2)), global_batch=rng.choice((32, 64, 128)),
                  seq_len=rng.choice((1024, 2048)), zero=rng.choice((0, 1, 1, 2, 3)),
                  recompute=rng.choice(("none", "selective", "full")),
                  overlap_grad_reduce=rng.random() < 0.8,
                  overlap_param_gather=rng.random() < 0.7,
                  grad_bucket_bytes=rng.choice((1 << 20, 4 << 20, 40_000_000)),
                  host_issue=rng.choice(("off", "compiled", "eager", "partial", "graphed")),
                  tp_comm_overlap=rng.choice(("none", "async")))
    # torch.compile'd stacks (torchtitan) build torch layers; the others TE modules
    fields["layer_impl"] = "torch" if fields["host_issue"] == "compiled" else "te"
    if fields["recompute"] == "full" and rng.random() < 0.3:
        fields["recompute_layers"] = 1
    if moe:
        fields["ep"] = rng.choice((1, 2, 4))
        fields["moe_a2a_overlap"] = rng.random() < 0.4
    return make_plan(gpus=GPUS, **fields)


def _plans(model, count: int, seed: int):
    rng = random.Random(seed)
    cluster = load_cluster("dgx-h100")
    plans, tries = [], 0
    while len(plans) < count and tries < 50 * count:
        tries += 1
        try:
            plan = _random_plan(rng, model)
            validate_for(plan, model, cluster, GPUS)
            StepLowerer(model, plan)
        except ValueError:
            continue
        stragglers = {rng.randrange(GPUS): 0.8} if rng.random() < 0.15 else None
        plans.append((plan, stragglers))
    return cluster, plans


def _models():
    dense, moe = tiny_models()
    # MoE layers alternating sliding-window and full attention (gpt-oss's pattern):
    # two layer kinds within a stage
    windowed = dataclasses.replace(moe, name="tiny-moe-window", num_layers=8,
                                   sliding_window=128, full_attention_every=2)
    return {"tiny": dense, "tiny-moe": moe, "tiny-moe-window": windowed,
            "llama3-8b": load_model("llama3-8b")}


#: Plans per model, and how many of them (the first ones of the same seeded draw) the
#: inner loop checks; the whole suite (slow tier) checks the rest of the draw.
COUNTS = {"tiny": (120, 30), "tiny-moe": (100, 25), "tiny-moe-window": (60, 15),
          "llama3-8b": (40, 10)}


@pytest.mark.parametrize("name,part", [
    pytest.param(name, part, marks=[pytest.mark.slow] if part == "rest" else [])
    for name in COUNTS for part in ("first", "rest")])
def test_fast_path_equals_reference(name, part):
    model = _models()[name]
    count, first = COUNTS[name]
    cluster, plans = _plans(model, count, seed=16)
    assert len(plans) == count
    assert len({plan.schedule if plan.pp > 1 else "-" for plan, _ in plans}) >= 4  # several
    layout = job_layout(cluster, GPUS)
    cache = PricingCache()
    for plan, stragglers in (plans[:first] if part == "first" else plans[first:]):
        fast = analytic_step(model, cluster, plan, layout, stragglers=stragglers,
                             cache=cache, fast=True)
        reference = analytic_step(model, cluster, plan, layout, stragglers=stragglers,
                                  fast=False)
        assert (fast.step_ns, fast.rank_end_ns, fast.breakdown_s, fast.critical) == (
            reference.step_ns, reference.rank_end_ns, reference.breakdown_s,
            reference.critical), plan


def test_schedule_counts_equal_their_lists():
    checked = 0
    for name in schedule_names():
        schedule = get_schedule(name)
        for pp in (1, 2, 3, 4, 8):
            for vpp in (1, 2, 3):
                for m in (1, 2, 3, 5, 8, 16, 17, 24):
                    for overlap in (False, True):
                        try:
                            rows = schedule.actions(pp, m, vpp, overlap)
                        except ValueError:
                            continue
                        counts = schedule.action_counts(pp, m, vpp, overlap)
                        assert counts == tuple(count_actions(row) for row in rows), \
                            (name, pp, vpp, m, overlap)
                        for rank in range(pp):
                            assert schedule.first_action(rank, pp, m, vpp, overlap) == rows[rank][0]
                        checked += 1
    assert checked > 100
