"""Schedules own their shape: the registry, and a schedule added as one file plus one
registry entry (tests/example_schedule.py, registered in conftest.py) reaching the
plan validation, the planner, the memory model and both step fidelities with no
other edit."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from example_schedule import EagerOneFOneB
from trainsim import api, planner
from sim.step import simulate_step
from strategies.models import load_model
from strategies.pipeline import check_schedule
from strategies.schedules import (
    SCHEDULES,
    PipelineSchedule,
    get_schedule,
    register,
    schedule_names,
)


def test_the_registry_names_its_schedules_and_rejects_strangers():
    assert {"gpipe", "1f1b", "interleaved", "zb-h1", "1f1b-eager"} <= set(SCHEDULES)
    assert tuple(SCHEDULES) == schedule_names() and "1f1b" in SCHEDULES
    with pytest.raises(ValueError, match=r"^schedule='pipedream' is invalid; valid: one of"):
        get_schedule("pipedream")
    with pytest.raises(ValueError, match="not a named PipelineSchedule"):
        register(PipelineSchedule())

    class Impostor(PipelineSchedule):
        name = "1f1b"

    with pytest.raises(ValueError, match="taken"):
        register(Impostor())
    assert register(EagerOneFOneB()).name == "1f1b-eager"  # re-registering is harmless


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_registered_schedule_is_complete_and_deadlock_free(schedule):
    sched = get_schedule(schedule)
    for pp in (1, 2, 3, 4, 8):
        for vpp in sorted({1, *sched.vpp_choices}):
            for m in (pp, 2 * pp, 3 * pp + 1):
                try:
                    rows = sched.actions(pp, m, vpp)
                except ValueError:
                    continue  # a shape the schedule does not run
                check_schedule(rows, sched.placement(pp, vpp), microbatches=m)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_schedules_planner_bound_stays_below_the_simulated_step(schedule):
    model, cluster = load_model("llama3-8b"), api.resolve_cluster("dgx-h100")
    vpp = get_schedule(schedule).vpp_choices[0]
    for pp, mb in ((2, 1), (4, 2), (8, 1)):
        plan = api.make_plan(gpus=64, tp=2, pp=pp, vpp=vpp, micro_batch=mb, global_batch=128,
                             seq_len=4096, schedule=schedule)
        step = simulate_step(model, cluster, plan, fidelity="analytic").step_time_s
        assert planner.step_time_lower_bound_s(model, cluster, plan) <= step


def test_a_schedule_added_as_one_file_reaches_the_planner(capsys):
    code, out, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "16",
                             "--tp", "2", "--pp", "2,4", "--micro-batch", "1", "--zero", "1",
                             "--recompute", "none", "--schedule", "1f1b,1f1b-eager",
                             "--global-batch", "32", "--format", "json", "--top", "4")
    assert code == 0, err
    schedules = {row["plan"]["schedule"] for row in json.loads(out)}
    assert schedules == {"1f1b", "1f1b-eager"}


def test_a_schedule_added_as_one_file_reaches_the_memory_model():
    """Eager 1F1B's rank r holds 2 (p - r - 1) + 1 micro-batches at its peak (its warm-up
    and the first steady-state forward), twice 1F1B's minus one: the memory model walks
    the schedule's own actions."""
    model = load_model("llama3-8b")
    common = dict(gpus=64, tp=2, pp=4, global_batch=128, seq_len=4096)
    eager = api.simulate(model, schedule="1f1b-eager", fidelity="analytic", **common)
    plain = api.simulate(model, schedule="1f1b", fidelity="analytic", **common)
    for p in range(4):
        per_mb = plain.memory[p].activations_bytes / (4 - p)
        assert eager.memory[p].activations_bytes == pytest.approx((2 * (4 - p - 1) + 1) * per_mb)
    assert eager.step_time_s == pytest.approx(plain.step_time_s, rel=0.01)


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb-h1"])
def test_held_counts_closed_form_equals_walking_the_lists(name):
    """Schedules with a closed form for the activations held after each forward
    (PipelineSchedule.held_counts: issue 16, the planner's memory check builds no
    action lists) give peak_held's bytes to the float for whole-byte stage sizes, on
    every shape of a seeded sample, cut at the memory horizon or not."""
    import random

    from strategies.pipeline import peak_held
    from strategies.schedules import get_schedule

    schedule = get_schedule(name)
    rng = random.Random(16)
    shapes = [(pp, vpp) for pp in (1, 2, 3, 4, 8)
              for vpp in ((2, 3, 4) if name == "interleaved" else (1,))]
    checked = 0
    for pp, vpp in shapes:
        for m in sorted({pp, 2 * pp, 3 * pp, 5 * pp, 12 * pp} | (
                {1, 2, 7, 33} if name != "interleaved" else set())):
            try:
                schedule.check(pp, m, vpp)
            except ValueError:
                continue
            sizes = [float(rng.randrange(1, 10**11)) for _ in range(pp * vpp)]
            got = schedule.peak_activation_bytes(pp, m, vpp, sizes)
            horizon = schedule.memory_horizon(pp, vpp)
            walked = peak_held(schedule.actions(pp, min(m, horizon or m), vpp), sizes)
            assert got == walked, (pp, m, vpp)
            assert peak_held(schedule.actions(pp, m, vpp), sizes) == got, (pp, m, vpp)
            checked += 1
    assert checked >= 10
    # sizes that are not whole bytes walk the lists (the sums' rounding is theirs)
    schedule.check(2, 4, shapes[0][1])
    halves = [0.5 + i for i in range(2 * shapes[0][1])]
    assert schedule.peak_activation_bytes(2, 4, shapes[0][1], halves) == peak_held(
        schedule.actions(2, 4, shapes[0][1]), halves)
