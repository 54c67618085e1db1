"""Fast paths of the flow fidelity that must give exactly what the plain ones give:
rates solved per group of link-disjoint batches equal the joint solve bit for bit,
flow classes found by hashing equal the walk, and plans run by event callbacks
produce the very timeline the SimPy processes produce."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import simpy

from hardware.flow import (FlowNetwork, FlowRequest, _flow_classes_loop, _levels_apart,
                           flow_classes)


def test_levels_apart_closed_form():
    """Equal levels and levels further apart than 1e-12 relative pass; two levels
    within it but not equal do not."""
    assert _levels_apart([])
    assert _levels_apart([1.0, 1.0, 2.0])
    assert _levels_apart([1.0, 1.0 * (1.0 + 4e-12)])
    assert not _levels_apart([1.0, 1.0 + 1e-13])
    assert not _levels_apart([5.0, 3.0, 3.0 * (1.0 + 5e-13)])


def _run_random_network(seed: int, near_tie: bool = False):
    """Batches on a few link-disjoint islands (and some sharing links), started at
    random times; every rate the network sets is checked against one joint solve of
    all running batches. Returns the network."""
    rng = np.random.default_rng(seed)
    islands, per_island = 4, 5
    capacity = rng.choice([1e9, 2e9, 4e9], islands * per_island).astype(np.float64)
    if near_tie:  # two islands whose bottleneck levels differ by 1e-13 relative
        capacity[:per_island] = 1e9
        capacity[per_island:2 * per_island] = 1e9 * (1.0 + 1e-13)
    env = simpy.Environment()
    network = FlowNetwork(env, capacity)
    checked = []
    solve = FlowNetwork._solve_rates

    def checking(self):
        solve(self)
        joint = np.concatenate(self._solve(self._batches))
        self.rate_solves -= 1
        joint[~self._live] = 0.0
        assert joint.tobytes() == self._rate.tobytes()
        checked.append(len(self._batches))

    network._solve_rates = checking.__get__(network)

    def requests(island: int, count: int, spread: bool) -> list[FlowRequest]:
        out = []
        for _ in range(count):
            base = island * per_island
            hops = rng.integers(1, 4)
            pool = np.arange(islands * per_island) if spread else np.arange(base, base + per_island)
            links = tuple(int(x) for x in rng.choice(pool, hops, replace=False))
            out.append(FlowRequest(links, tuple(float(w) for w in rng.choice([1.0, 1.25], hops)),
                                   float(rng.choice([1e6, 3e6, 0.0])),
                                   float(rng.choice([np.inf, 5e8]))))
        return out

    lists = [requests(i % islands, int(rng.integers(1, 5)), spread=i % 7 == 6) for i in range(30)]
    if near_tie:
        lists[:2] = [[FlowRequest((0,), (1.0,), 1e6)], [FlowRequest((per_island,), (1.0,), 1e6)]]

    def start(at_ns: int, batch: list[FlowRequest]):
        yield env.timeout(at_ns)
        yield network.transfer(batch)

    for i, batch in enumerate(lists):
        at = 0 if near_tie and i < 2 else int(rng.integers(0, 5000))
        env.process(start(at, batch))
    env.run()
    assert checked
    return network


@pytest.mark.parametrize("seed", range(6))
def test_grouped_solves_equal_the_joint_solve(seed):
    network = _run_random_network(seed)
    assert network.flows_completed > 0


def test_near_tie_between_groups_is_solved_jointly():
    """Two disjoint groups whose levels are 1e-13 apart: the joint solve freezes both
    at the lower level, so the network must solve them together."""
    network = _run_random_network(3, near_tie=True)
    assert network.joint_solves >= 1


def test_hashed_flow_classes_equal_the_walk():
    rng = np.random.default_rng(11)
    for _ in range(200):
        flows = int(rng.integers(1, 50))
        lengths = rng.integers(1 if rng.random() < 0.5 else 0, 4, flows)
        entry_flow = np.repeat(np.arange(flows), lengths)
        entry_link = rng.integers(0, 5 if rng.random() < 0.5 else 10_000, entry_flow.size)
        entry_weight = rng.choice([1.0, 2.0], entry_flow.size)
        caps = rng.choice([np.inf, 1e9], flows)
        starts = np.searchsorted(entry_flow, np.arange(flows + 1))
        mine = flow_classes(entry_flow, entry_link, entry_weight, flows, caps)
        walked = _flow_classes_loop(starts, entry_link, entry_weight, flows, caps)
        assert np.array_equal(mine[0], walked[0]) and np.array_equal(mine[1], walked[1])


def _timeline_digest(fidelity_plan) -> tuple[str, int]:
    from hardware.catalog import load_cluster
    from sim import engine
    from sim.step import simulate_step
    from strategies.models import load_model
    from trainsim.api import make_plan

    runs = []
    original = engine.Engine.run

    def run(self):
        result = original(self)
        runs.append(result)
        return result

    engine.Engine.run = run
    try:
        gpus, tp, pp, extra = fidelity_plan
        plan = make_plan(gpus=gpus, tp=tp, pp=pp, micro_batch=1, seq_len=2048,
                         global_batch=16, **extra)
        simulate_step(load_model("llama3-8b"), load_cluster("dgx-h100"), plan,
                      fidelity="flow", check_memory=False)
    finally:
        engine.Engine.run = original
    digest = hashlib.sha256()
    for row in runs[-1].timeline._sorted_rows():
        digest.update(repr(row).encode())
    return digest.hexdigest(), len(runs[-1].timeline)


@pytest.mark.parametrize("case", [(16, 2, 2, {}), (16, 4, 2, dict(schedule="interleaved", vpp=2))],
                         ids=["tp2pp2", "tp4pp2-interleaved"])
def test_callback_plans_give_the_process_timeline(case, monkeypatch):
    """SharedFabric.start_collective/start_p2p (event callbacks) against
    run_collective/run_p2p (a SimPy process each): the same spans, to the ns."""
    from hardware.cost import SharedFabric

    with_callbacks = _timeline_digest(case)
    monkeypatch.setattr(SharedFabric, "start_collective", None)
    with_processes = _timeline_digest(case)
    assert with_callbacks == with_processes
