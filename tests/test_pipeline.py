"""Tests for strategies.pipeline: schedules, notation, checks and exact timing.

Closed forms asserted here (bubble fraction of rank r = 1 - busy_r / makespan,
every rank starts at 0, t_comm = 0 unless stated):

* GPipe and 1F1B, equal stages: (p-1)/(m+p-1) on every rank.
* Interleaved 1F1B (Megatron), equal virtual stages: (p-1)/(v*m+p-1), i.e.
  bubble time (p-1)(t_f+t_b) per rank against v*m*(t_f+t_b) of work — the
  Narayanan et al. 2021 bubble (p-1)/v of a full stage's (t_f+t_b) per
  micro-batch, with t_f, t_b here per virtual stage.
* ZB-H1, m >= p: makespan = m(t_f+t_b) + (p-1)(t_f+t_i-t_w) with
  t_i = t_b - t_w, whenever t_w <= min(t_f, t_i) (Qi et al. 2023 §2.1's
  (p-1)(T_F+T_B-T_W) with their B = our I); with t_f = t_i = t_w the bubble
  fraction is (p-1)/(3m+p-1).
"""

from __future__ import annotations

import random
from collections import deque
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.pipeline import (
    Action,
    PeerStages,
    StagePlacement,
    check_schedule,
    format_schedule,
    interleaved_placement,
    max_inflight_microbatches,
    parse_action,
    parse_actions,
    peer_stages,
    send_target,
    simulate_unit_times,
    v_placement,
)
from strategies.schedules import SCHEDULES, schedule_actions

#: The four schedules this file pins by their published closed forms.
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def strs(actions):
    return [" ".join(str(a) for a in row) for row in actions]


# --------------------------------------------------------------------------- notation


def test_action_str_and_parse():
    assert str(Action(0, "F", 1)) == "0F1"
    assert str(Action(3, "B", 0)) == "3B0"
    assert str(Action(12, "W", 107)) == "12W107"
    assert parse_action("2I1") == Action(2, "I", 1)
    assert parse_action("15B230") == Action(15, "B", 230)


@given(st.integers(0, 10_000), st.sampled_from("FBIW"), st.integers(0, 10_000))
def test_notation_round_trips(stage, comp, mb):
    action = Action(stage, comp, mb)
    assert parse_action(str(action)) == action
    text = f"{stage}{comp}{mb}"
    assert str(parse_action(text)) == text


@pytest.mark.parametrize("text", ["0X1", "F1", "0F", "-1F0", " 0F1", "0f1", "0FF1", "", "0 F 1", "0F1.0"])
def test_parse_action_rejects_bad_text(text):
    with pytest.raises(ValueError, match="action text="):
        parse_action(text)


@pytest.mark.parametrize("kwargs, field", [
    (dict(stage=-1, comp="F", microbatch=0), "stage"),
    (dict(stage=0, comp="X", microbatch=0), "comp"),
    (dict(stage=0, comp="F", microbatch=-2), "microbatch"),
    (dict(stage=True, comp="F", microbatch=0), "stage"),
    (dict(stage=1.0, comp="F", microbatch=0), "stage"),
])
def test_action_validates_fields(kwargs, field):
    with pytest.raises(ValueError, match=f"Action.{field}="):
        Action(**kwargs)


def test_parse_actions_and_format_schedule():
    rows = parse_actions(["0F0 0B0", ["1F0", "1B0"]])
    assert rows == [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    assert format_schedule(rows) == "rank 0: 0F0 0B0\nrank 1: 1F0 1B0"


def test_schedule_names_match_plan():
    from strategies.plan import SCHEDULES as PLAN_SCHEDULES

    assert tuple(PLAN_SCHEDULES) == tuple(SCHEDULES)
    assert set(PIPELINE_SCHEDULES) <= set(SCHEDULES)


# --------------------------------------------------------------------------- layout


def test_stage_layout_and_peers():
    megatron = interleaved_placement(4, 2)
    assert [megatron.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert interleaved_placement(4, 3).stages_of(1) == (1, 5, 9)
    assert peer_stages(0, 8) == PeerStages(activations_to=1, gradients_to=None)
    assert peer_stages(3, 8) == PeerStages(activations_to=4, gradients_to=2)
    assert peer_stages(7, 8) == PeerStages(activations_to=None, gradients_to=6)
    # Forward of stage 3 (rank 3) goes to stage 4, which rank 0 holds.
    assert send_target(Action(3, "F", 0), megatron) == (4, 0)
    assert send_target(Action(4, "B", 0), megatron) == (3, 3)
    assert send_target(Action(4, "I", 0), megatron) == (3, 3)
    assert send_target(Action(4, "W", 0), megatron) is None
    assert send_target(Action(7, "F", 0), megatron) is None
    assert send_target(Action(0, "B", 0), megatron) is None
    assert megatron.edges() == ((0, 1), (1, 2), (2, 3), (3, 0))


def test_v_placement_puts_both_ends_on_the_first_rank():
    v = v_placement(4)
    assert v.rank_of_stage == (0, 1, 2, 3, 3, 2, 1, 0)
    assert v.stages_of(0) == (0, 7) and v.stages_of(3) == (3, 4)
    # the turn of the V (stages 3 -> 4) stays on rank 3: no transfer
    assert send_target(Action(3, "F", 0), v) == (4, 3)
    assert v.edges() == ((0, 1), (1, 2), (2, 3), (3, 2), (2, 1), (1, 0))


@pytest.mark.parametrize("call, field", [
    (lambda: interleaved_placement(0), "pp"),
    (lambda: interleaved_placement(4).rank_of(-1), "stage"),
    (lambda: interleaved_placement(4).stages_of(4), "rank"),
    (lambda: peer_stages(8, 8), "stage"),
    (lambda: interleaved_placement(4, 0), "vpp"),
    (lambda: StagePlacement(2, (0, 0, 1)), "rank_of_stage"),
])
def test_layout_errors_name_the_field(call, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        call()


# --------------------------------------------------------------------------- explicit orders


def test_gpipe_order():
    assert strs(schedule_actions("gpipe", 2, 3)) == [
        "0F0 0F1 0F2 0B0 0B1 0B2",
        "1F0 1F1 1F2 1B0 1B1 1B2",
    ]


def test_1f1b_order():
    assert strs(schedule_actions("1f1b", 4, 6)) == [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5",
    ]
    # Fewer micro-batches than stages: the warm-up is cut short.
    assert strs(schedule_actions("1f1b", 4, 2))[0] == "0F0 0F1 0B0 0B1"


def test_interleaved_order_megatron():
    # p=2, v=2, m=4. Rank 0 holds stages 0, 2; rank 1 holds 1, 3.
    # Warm-up: rank 0 (2-0-1)*2 + (2-1)*2 = 4, rank 1 0 + 2 = 2 forwards.
    # Forward k: chunk (k % 4) // 2, micro-batch (k // 4) * 2 + k % 2;
    # backward k: the chunks reversed.
    assert strs(schedule_actions("interleaved", 2, 4, vpp=2)) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_interleaved_m_equal_pp_is_all_warmup():
    # Megatron: with m == pp every rank runs all forwards first.
    rows = schedule_actions("interleaved", 2, 2, vpp=2)
    assert strs(rows) == [
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1",
        "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1",
    ]


def test_zb_h1_order_and_exact_timing():
    rows = schedule_actions("zb-h1", 2, 2)
    assert strs(rows) == ["0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"]
    timing = simulate_unit_times(rows, 2, 1, t_f=1, t_b=2, t_w=1)
    got = [[(str(a), s, e) for a, s, e in row] for row in timing.spans]
    assert got == [
        [("0F0", 0, 1), ("0F1", 1, 2), ("0I0", 3, 4), ("0W0", 4, 5), ("0I1", 5, 6), ("0W1", 6, 7)],
        [("1F0", 1, 2), ("1I0", 2, 3), ("1F1", 3, 4), ("1I1", 4, 5), ("1W0", 5, 6), ("1W1", 6, 7)],
    ]
    assert timing.makespan == 7 and timing.busy == (6, 6)


def test_zb_h1_defers_rank_weight_passes():
    rows = schedule_actions("zb-h1", 4, 8)
    assert strs(rows)[0] == "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7"
    assert strs(rows)[3] == "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("args, field", [
    (("pipedream", 4, 8), "schedule"),
    (("1f1b", 0, 8), "pp"),
    (("1f1b", 4, 0), "microbatches"),
    (("1f1b", True, 8), "pp"),
    (("1f1b", 4, 8.0), "microbatches"),
    (("1f1b", 4, 8, 0), "vpp"),
    (("1f1b", 4, 8, 2), "vpp"),
    (("gpipe", 4, 8, 2), "vpp"),
    (("zb-h1", 4, 8, 2), "vpp"),
    (("interleaved", 4, 8, 1), "vpp"),
    (("interleaved", 4, 6, 2), "microbatches"),
])
def test_schedule_validation(args, field):
    with pytest.raises(ValueError, match=f"^{field}=") as info:
        schedule_actions(*args)
    message = str(info.value)
    assert "\n" not in message and "valid" in message


def test_unknown_schedule_lists_valid_names():
    with pytest.raises(ValueError) as info:
        schedule_actions("pipedream-2bw", 4, 8)
    for name in PIPELINE_SCHEDULES:
        assert name in str(info.value)


# --------------------------------------------------------------------------- completeness & deadlock


def _cases():
    for p in range(1, 7):
        for m in range(1, 13):
            for sched in ("gpipe", "1f1b", "zb-h1"):
                yield sched, p, m, 1
            if m % p == 0:
                for v in range(2, 5):
                    yield "interleaved", p, m, v


@pytest.mark.parametrize("sched, p, m, v", list(_cases()))
def test_every_schedule_is_complete_and_deadlock_free(sched, p, m, v):
    rows = schedule_actions(sched, p, m, v)
    check_schedule(rows, p, v, microbatches=m)
    assert sum(len(r) for r in rows) == p * v * m * (3 if sched == "zb-h1" else 2)
    for rank, row in enumerate(rows):
        assert all(a.stage % p == rank for a in row)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(PIPELINE_SCHEDULES), st.integers(1, 16), st.integers(1, 8), st.integers(2, 4), st.data())
def test_every_schedule_checks_hypothesis(sched, p, k, v, data):
    if sched == "interleaved":
        m = p * k
    else:
        v = 1
        m = data.draw(st.integers(1, 40))
    check_schedule(schedule_actions(sched, p, m, v), p, v, microbatches=m)


def _rows(*texts):
    return parse_actions(list(texts))


@pytest.mark.parametrize("rows, pp, vpp, m, pattern", [
    (_rows("0F0 0B0", "1F0"), 2, 1, 1, r"stage 1 \(rank 1\), micro-batch 0 lacks a backward \(1I0 and 1W0 missing\)"),
    (_rows("0F0 0B0", "1B0"), 2, 1, 1, r"no forward 1F0"),
    (_rows("0F0 0B0 0F0", "1F0 1B0"), 2, 1, 1, r"0F0 appears twice"),
    (_rows("0F0 0B0 1F0", "1B0"), 2, 1, 1, r"action 1F0 is on rank 0; valid: rank 1"),
    (_rows("0F0 0B0 0I0 0W0", "1F0 1B0"), 2, 1, 1, r"both 0B0 and a split I/W"),
    (_rows("0F0 0I0", "1F0 1B0"), 2, 1, 1, r"0W0 missing"),
    (_rows("0F0 0B0 2F0", "1F0 1B0"), 2, 1, 1, r"stage=2 is invalid; valid: 0 \.\. 1"),
    (_rows("0F0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"), 2, 1, 1, r"microbatch=1 is invalid"),
    (_rows("0F0 0B0"), 2, 1, 1, r"actions has 1 rank lists; valid: exactly pp=2"),
])
def test_check_schedule_rejects_incomplete(rows, pp, vpp, m, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_schedule(rows, pp, vpp, microbatches=m)


def test_deadlock_on_one_rank():
    rows = _rows("0B0 0F0", "1F0 1B0")
    with pytest.raises(ValueError, match=r"deadlocks: action 0B0 \(rank 0, position 0\) waits for 0F0"):
        check_schedule(rows, 2)


def test_deadlock_across_ranks_names_first_stuck_action():
    # Rank 1 runs stage 3 before stage 1, but stage 3 needs stage 2 (rank 0),
    # which needs stage 1: a cycle through both ranks.
    rows = _rows("0F0 2F0 2B0 0B0", "3F0 1F0 3B0 1B0")
    with pytest.raises(ValueError, match=r"deadlocks: action 2F0 \(rank 0, position 1\) waits for 1F0"):
        check_schedule(rows, 2, 2)
    with pytest.raises(ValueError, match="deadlocks"):
        simulate_unit_times(rows, 2, 2, 1, 2)


def test_weight_before_input_deadlocks():
    rows = _rows("0F0 0W0 0I0", "1F0 1I0 1W0")
    with pytest.raises(ValueError, match=r"action 0W0 .* waits for 0I0"):
        check_schedule(rows, 2)


def _oracle_deadlock_free(rows, num_stages):
    """Independent check: Kahn's algorithm on the explicit dependency graph."""
    split = {(a.stage, a.microbatch) for row in rows for a in row if a.comp == "I"}
    nodes = {(a.stage, a.comp, a.microbatch) for row in rows for a in row}
    edges = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}

    def edge(u, v):
        edges[u].append(v)
        indeg[v] += 1

    for row in rows:
        keys = [(a.stage, a.comp, a.microbatch) for a in row]
        for u, v in zip(keys, keys[1:]):
            edge(u, v)
    for s, c, j in nodes:
        if c == "F" and s > 0:
            edge((s - 1, "F", j), (s, c, j))
        if c in "BI":
            edge((s, "F", j), (s, c, j))
            if s + 1 < num_stages:
                edge((s + 1, "I" if (s + 1, j) in split else "B", j), (s, c, j))
        if c == "W":
            edge((s, "I", j), (s, c, j))
    queue = deque(n for n in nodes if indeg[n] == 0)
    seen = 0
    while queue:
        n = queue.popleft()
        seen += 1
        for v in edges[n]:
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    return seen == len(nodes)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(PIPELINE_SCHEDULES), st.integers(1, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_deadlock_check_agrees_with_graph_oracle(sched, p, k, rnd):
    v = 2 if sched == "interleaved" else 1
    m = p * k
    rows = schedule_actions(sched, p, m, v)
    # Perturb: swap a few adjacent actions on random ranks.
    for _ in range(rnd.randint(0, 4)):
        row = rows[rnd.randrange(p)]
        if len(row) > 1:
            i = rnd.randrange(len(row) - 1)
            row[i], row[i + 1] = row[i + 1], row[i]
    ok = _oracle_deadlock_free(rows, p * v)
    if ok:
        check_schedule(rows, p, v, microbatches=m)
    else:
        with pytest.raises(ValueError, match="deadlocks"):
            check_schedule(rows, p, v, microbatches=m)


# --------------------------------------------------------------------------- bubbles


def _assert_bubble(timing, expected):
    assert timing.bubble_fraction == tuple([expected] * len(timing.bubble_fraction))
    assert timing.mean_bubble_fraction == expected


@pytest.mark.parametrize("sched", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (2, 1), (2, 8), (4, 8), (4, 3), (8, 16), (8, 64), (16, 32)])
def test_gpipe_1f1b_bubble_closed_form(sched, p, m):
    t_f = 3
    timing = simulate_unit_times(schedule_actions(sched, p, m), p, 1, t_f=t_f, t_b=2 * t_f)
    _assert_bubble(timing, Fraction(p - 1, m + p - 1))
    assert timing.makespan == (m + p - 1) * 3 * t_f
    assert timing.busy == tuple([m * 3 * t_f] * p)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 24), st.integers(1, 48), st.integers(1, 1000))
def test_gpipe_1f1b_bubble_hypothesis(sched, p, m, t_f):
    timing = simulate_unit_times(schedule_actions(sched, p, m), p, 1, t_f=t_f, t_b=2 * t_f)
    _assert_bubble(timing, Fraction(p - 1, m + p - 1))


def test_bubble_with_float_durations_is_float():
    timing = simulate_unit_times(schedule_actions("1f1b", 4, 8), 4, 1, t_f=1.5, t_b=3.0)
    assert isinstance(timing.bubble_fraction[0], float)
    assert timing.bubble_fraction[0] == pytest.approx(3 / 11, rel=1e-12)


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (4, 2, 4), (4, 4, 16), (2, 2, 4), (8, 2, 16), (8, 3, 24), (3, 2, 9), (1, 2, 3)])
def test_interleaved_bubble_closed_form(p, v, m):
    timing = simulate_unit_times(schedule_actions("interleaved", p, m, v), p, v, t_f=1, t_b=2)
    _assert_bubble(timing, Fraction(p - 1, v * m + p - 1))
    # Narayanan 2021: bubble time / ideal time = (p-1)/(v*m).
    busy = timing.busy[0]
    assert Fraction(timing.makespan - busy, busy) == Fraction(p - 1, v * m)


def test_interleaved_beats_1f1b_by_factor_v():
    p, m, v = 4, 8, 2
    plain = simulate_unit_times(schedule_actions("1f1b", p, m), p, 1, t_f=2, t_b=4)
    inter = simulate_unit_times(schedule_actions("interleaved", p, m, v), p, v, t_f=1, t_b=2)
    # Same work per rank; the bubble time shrinks by v.
    assert plain.busy == inter.busy
    assert (plain.makespan - plain.busy[0]) == v * (inter.makespan - inter.busy[0])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(2, 4), st.integers(1, 4), st.integers(1, 50))
def test_interleaved_bubble_hypothesis(p, v, k, t_f):
    m = p * k
    timing = simulate_unit_times(schedule_actions("interleaved", p, m, v), p, v, t_f=t_f, t_b=2 * t_f)
    _assert_bubble(timing, Fraction(p - 1, v * m + p - 1))


@pytest.mark.parametrize("p, m", [(2, 2), (4, 4), (4, 8), (8, 8), (8, 32), (3, 10)])
def test_zb_h1_bubble_closed_form_equal_passes(p, m):
    # t_f = t_i = t_w = 1, i.e. t_b = 2, t_w = 1.
    zb = simulate_unit_times(schedule_actions("zb-h1", p, m), p, 1, t_f=1, t_b=2, t_w=1)
    _assert_bubble(zb, Fraction(p - 1, 3 * m + p - 1))
    assert zb.makespan == 3 * m + p - 1
    one = simulate_unit_times(schedule_actions("1f1b", p, m), p, 1, t_f=1, t_b=2)
    if p > 1:
        assert zb.bubble_fraction[0] < one.bubble_fraction[0]
        # Bubble time is one third of 1F1B's (Qi et al. 2023).
        assert 3 * (zb.makespan - zb.busy[0]) == one.makespan - one.busy[0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 30), st.integers(1, 20), st.integers(1, 20), st.integers(0, 20))
def test_zb_h1_makespan_hypothesis(p, extra, t_f, t_i, t_w):
    m = p + extra
    t_w = min(t_w, t_f, t_i)  # the regime where W always fits the bubbles
    zb = simulate_unit_times(schedule_actions("zb-h1", p, m), p, 1, t_f=t_f, t_b=t_i + t_w, t_w=t_w)
    assert zb.makespan == m * (t_f + t_i + t_w) + (p - 1) * (t_f + t_i - t_w)
    one = simulate_unit_times(schedule_actions("1f1b", p, m), p, 1, t_f=t_f, t_b=t_i + t_w)
    assert zb.makespan <= one.makespan
    if p > 1 and t_w > 0:
        assert zb.makespan < one.makespan


# --------------------------------------------------------------------------- timing details


def test_gpipe_with_p2p_latency():
    # Forward and backward chains each cross p-1 rank boundaries.
    p, m, c = 4, 6, 5
    timing = simulate_unit_times(schedule_actions("gpipe", p, m), p, 1, t_f=2, t_b=4, t_comm=c)
    assert timing.makespan == (m + p - 1) * 6 + 2 * (p - 1) * c


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.data())
def test_gpipe_heterogeneous_stages_flow_shop(p, m, data):
    # Identical jobs through a flow shop: sum of stage times + (m-1) * slowest.
    tf = data.draw(st.lists(st.integers(1, 9), min_size=p, max_size=p))
    tb = data.draw(st.lists(st.integers(1, 9), min_size=p, max_size=p))
    timing = simulate_unit_times(schedule_actions("gpipe", p, m), p, 1, t_f=tf, t_b=tb)
    assert timing.makespan == sum(tf) + (m - 1) * max(tf) + sum(tb) + (m - 1) * max(tb)
    assert timing.busy == tuple(m * (a + b) for a, b in zip(tf, tb))


def test_simulate_respects_dependencies_and_rank_order():
    p, m = 3, 5
    rows = schedule_actions("zb-h1", p, m)
    timing = simulate_unit_times(rows, p, 1, t_f=2, t_b=3, t_w=1, t_comm=1)
    end = {}
    for rank, row in enumerate(timing.spans):
        assert [a for a, _, _ in row] == rows[rank]
        prev = 0
        for action, start, stop in row:
            assert start >= prev
            assert stop - start == {"F": 2, "I": 2, "W": 1}[action.comp]
            prev = stop
            end[str(action)] = (start, stop)
    for j in range(m):
        for s in range(p):
            if s > 0:
                assert end[f"{s}F{j}"][0] >= end[f"{s - 1}F{j}"][1] + 1
            if s < p - 1:
                assert end[f"{s}I{j}"][0] >= end[f"{s + 1}I{j}"][1] + 1
            assert end[f"{s}W{j}"][0] >= end[f"{s}I{j}"][1]


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(t_f=1, t_b=2), r"^t_w=None is invalid"),
    (dict(t_f=1, t_b=2, t_w=3), r"^t_w=3 exceeds t_b=2"),
    (dict(t_f=-1, t_b=2, t_w=1), r"^t_f=-1 is invalid"),
    (dict(t_f=[1, 1], t_b=2, t_w=1), r"^t_f has 2 entries"),
    (dict(t_f=1, t_b=2, t_w=1, t_comm=-1), r"^t_comm=-1 is invalid"),
])
def test_simulate_errors(kwargs, pattern):
    rows = schedule_actions("zb-h1", 3, 4)
    with pytest.raises(ValueError, match=pattern):
        simulate_unit_times(rows, 3, 1, **kwargs)


def test_per_stage_durations_equal_scalar():
    rows = schedule_actions("interleaved", 2, 4, 2)
    a = simulate_unit_times(rows, 2, 2, t_f=1, t_b=2)
    b = simulate_unit_times(rows, 2, 2, t_f=[1] * 4, t_b=(2, 2, 2, 2))
    assert a == b


# --------------------------------------------------------------------------- in-flight micro-batches


@pytest.mark.parametrize("p, m", [(1, 4), (4, 8), (4, 2), (8, 8), (8, 30)])
def test_inflight_1f1b_and_gpipe(p, m):
    assert max_inflight_microbatches(schedule_actions("1f1b", p, m)) == [min(p - r, m) for r in range(p)]
    assert max_inflight_microbatches(schedule_actions("gpipe", p, m)) == [m] * p


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (4, 2, 16), (2, 3, 4), (8, 2, 32), (4, 4, 12)])
def test_inflight_interleaved_megatron_count(p, v, m):
    rows = schedule_actions("interleaved", p, m, v)
    peaks = max_inflight_microbatches(rows)
    # Rank 0: warm-up (p-1)*2 + (v-1)*p forwards plus the first steady one,
    # i.e. p*v + p - 1 chunk activations = p * (1 + (p-1)/(p*v)) stages' worth.
    assert peaks[0] == v * p + p - 1
    assert Fraction(peaks[0], v) == p * (1 + Fraction(p - 1, p * v))
    assert peaks == [(p - r - 1) * 2 + (v - 1) * p + 1 for r in range(p)]


def test_inflight_interleaved_all_warmup():
    p, v = 4, 2
    assert max_inflight_microbatches(schedule_actions("interleaved", p, p, v)) == [v * p] * p


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 8), (6, 20)])
def test_inflight_zb_h1(p, m):
    rows = schedule_actions("zb-h1", p, m)
    # Until B/I: the same as 1F1B.
    assert max_inflight_microbatches(rows) == [p - r for r in range(p)]
    # Until W: every rank holds p (the paper: equal in-flight micro-batches,
    # no more than 1F1B's first rank).
    assert max_inflight_microbatches(rows, release="weight") == [p] * p
    timing = simulate_unit_times(rows, p, 1, t_f=1, t_b=2, t_w=1)
    assert list(timing.max_inflight) == [p - r for r in range(p)]
    assert list(timing.max_inflight_until_w) == [p] * p


def test_inflight_release_validated():
    with pytest.raises(ValueError, match="^release="):
        max_inflight_microbatches([], release="both")


def test_inflight_from_random_orders_matches_direct_count():
    rnd = random.Random(7)
    rows = schedule_actions("1f1b", 4, 8)
    for row in rows:
        rnd.shuffle(row)
    for row, peak in zip(rows, max_inflight_microbatches(rows)):
        held = best = 0
        for a in row:
            held += {"F": 1, "B": -1}[a.comp]
            best = max(best, held)
        assert peak == best
