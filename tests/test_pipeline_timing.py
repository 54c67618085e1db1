"""The 1F1B family (GPipe, 1F1B, interleaved) timed without its lists
(strategies.pipeline.one_f_one_b_family_timing) equals the list replay
(strategies.pipeline.replay_timing, the event engine's schedule) to the integer: makespan,
every rank's last end, first start and wait for transfers, on random shapes and durations
(empty stages, t_comm > 0), and on long pipelines whose steady periods it skips. Both of
its forms are checked on every shape: the position walk and the numpy rows."""

import os
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies.pipeline as pipeline
from strategies.pipeline import one_f_one_b_family_timing, replay_timing
from strategies.schedules import get_schedule

FAMILY = ("1f1b", "interleaved", "gpipe")


def _random_case(rng, max_pp, max_m):
    name = rng.choice(FAMILY + ("1f1b", "interleaved"))
    pp = rng.randint(1, max_pp)
    vpp = rng.randint(2, 8) if name == "interleaved" else 1
    step = pp if name == "interleaved" else 1
    m = step * rng.randint(1, max(1, max_m // step))
    stages = pp * vpp
    hi = rng.choice([1, 3, 100, 10 ** 6, 10 ** 9])
    if rng.random() < 0.5:  # any durations
        t_f = [rng.randint(0, hi) for _ in range(stages)]
        t_b = [rng.randint(0, hi) for _ in range(stages)]
    else:  # equal but for the ends (embedding, head)
        t_f, t_b = [rng.randint(0, hi)] * stages, [rng.randint(0, hi)] * stages
        for row in (t_f, t_b):
            row[0] += rng.randint(0, hi // 3 + 1)
            row[-1] += rng.randint(0, hi // 3 + 1)
    for row in (t_f, t_b):
        for _ in range(rng.randint(0, 2)):
            row[rng.randrange(stages)] = 0  # empty stages
    t_comm = rng.randint(1, max(1, hi // rng.choice([1, 10, 1000])))
    return name, pp, m, vpp, t_f, t_b, t_comm


def _check(name, pp, m, vpp, t_f, t_b, t_comm):
    schedule = get_schedule(name)
    expected = replay_timing(schedule.actions(pp, m, vpp), schedule.placement(pp, vpp),
                             t_f, t_b, None, t_comm)
    timing = schedule.timing(pp, m, vpp, t_f, t_b, None, t_comm)
    got = (timing.makespan, timing.rank_end, timing.rank_start, timing.rank_comm_wait)
    assert got == expected, (name, pp, m, vpp, t_f, t_b, t_comm)
    # the recurrence itself, not a fallback to the replay the schedule could take
    warmups = [schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp)]
    direct = one_f_one_b_family_timing(pp, m, vpp, warmups, t_f, t_b, t_comm)
    assert tuple(direct) == expected, (name, pp, m, vpp, t_f, t_b, t_comm)
    # each form, whichever the cost model would pick
    walked = pipeline._family_timing_scalar(pp, m, vpp, warmups, t_f, t_b, t_comm)
    assert tuple(walked) == expected, ("walk", name, pp, m, vpp, t_f, t_b, t_comm)
    # (rows allowed every round they need: the fixed point, however far)
    rows = pipeline._family_timing_vector(pp, m, vpp, tuple(warmups), t_f, t_b, t_comm,
                                          rounds_max=10 ** 6)
    assert rows == expected, ("rows", name, pp, m, vpp, t_f, t_b, t_comm)


@pytest.mark.parametrize("seed", range(4))
def test_family_timing_equals_the_list_replay_on_random_shapes(seed):
    """100 random shapes per seed (pp 1-8, m up to 32), exact integers."""
    rng = random.Random(seed)
    for _ in range(100):
        _check(*_random_case(rng, 8, 32))


#: Random large shapes per seed: 150 in the suite (about 4 s a seed on one core: each
#: shape is timed by the list replay, the walk and the numpy rows), 1,000 with
#: TRAINSIM_PIPELINE_LONG=1 (the 3,000-shape check that the 1F1B-family timing was accepted on).
LARGE_SHAPES_PER_SEED = 1000 if os.environ.get("TRAINSIM_PIPELINE_LONG") == "1" else 150


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 13))
def test_family_timing_equals_the_list_replay_on_many_random_shapes(seed):
    """Random shapes per seed (pp 1-16, vpp 1-8, m up to 64), exact integers."""
    rng = random.Random(seed)
    for _ in range(LARGE_SHAPES_PER_SEED):
        _check(*_random_case(rng, 16, 64))


@pytest.mark.parametrize("name, pp, vpp, m", [
    ("1f1b", 4, 1, 300), ("1f1b", 8, 1, 97), ("1f1b", 2, 1, 64),
    ("interleaved", 4, 2, 96), ("interleaved", 2, 3, 64), ("interleaved", 3, 4, 60),
])
def test_long_pipelines_skip_steady_periods_exactly(name, pp, vpp, m, monkeypatch):
    """Past the warm-up the ends repeat every period shifted by one constant; whole
    periods are then skipped (the skip runs here) and the result still equals the
    replay of every action, for several duration vectors each."""
    skips = []
    real = pipeline._skip_periods
    monkeypatch.setattr(pipeline, "_skip_periods", lambda *a: skips.append(a) or real(*a))
    rng = random.Random(pp * 1000 + m)
    stages = pp * vpp
    cases = [([5] * stages, [9] * stages, 1),
             ([100] * (stages - 1) + [140], [200] * (stages - 1) + [260], 3),
             ([rng.randint(0, 1000) for _ in range(stages)],
              [rng.randint(0, 1000) for _ in range(stages)], 250)]
    for t_f, t_b, t_comm in cases:
        _check(name, pp, m, vpp, t_f, t_b, t_comm)
    assert skips


@pytest.mark.parametrize("name", FAMILY)
def test_equal_stages_without_transfers_give_the_bubble_closed_form(name):
    """Equal stages, t_comm = 0: the step is (m v + p - 1) (F + B) of one stage -- the
    bubble (p - 1) / (m v + p - 1) (Narayanan et al. 2021, §2.2), exactly."""
    schedule = get_schedule(name)
    for pp in (1, 2, 3, 4, 8, 16):
        for vpp in ((2, 3, 4) if name == "interleaved" else (1,)):
            step = pp if name == "interleaved" else 1
            for m in (step, 2 * step, 5 * step, 64 * step):
                timing = schedule.timing(pp, m, vpp, [7] * (pp * vpp), [13] * (pp * vpp),
                                         None, 0)
                assert timing.makespan == (m * vpp + pp - 1) * 20, (pp, vpp, m)


@pytest.mark.parametrize("name", FAMILY)
def test_warmup_counts_rebuild_the_lists(name):
    """The order the recurrence walks (strategies.pipeline's 1F1B-family comment: w_r
    warm-up forwards, F/B pairs, cool-down backwards; virtual k runs chunk
    (k mod p v) // p forwards, the mirrored chunk backwards) is each rank's list."""
    schedule = get_schedule(name)
    for pp in (1, 2, 3, 4, 5):
        for vpp in ((2, 3) if name == "interleaved" else (1,)):
            step = pp if name == "interleaved" else 1
            for m in (step, 2 * step, 3 * step, 7 * step):
                total, group = m * vpp, pp * vpp
                for rank in range(pp):
                    w = schedule.warmup_forwards(rank, pp, m, vpp)
                    order = ([("F", k) for k in range(w)]
                             + [x for q in range(total - w)
                                for x in (("F", w + q), ("B", q))]
                             + [("B", k) for k in range(total - w, total)])
                    rebuilt = []
                    for comp, k in order:
                        chunk = (k % group) // pp
                        if comp == "B":
                            chunk = vpp - 1 - chunk
                        rebuilt.append((chunk * pp + rank, comp, (k // group) * pp + k % pp))
                    lists = [(a.stage, a.comp, a.microbatch)
                             for a in schedule.actions(pp, m, vpp)[rank]]
                    assert rebuilt == lists, (pp, vpp, m, rank)


def test_bad_input_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="warmups"):
        one_f_one_b_family_timing(2, 4, 1, [1], [1, 1], [1, 1], 0)
    with pytest.raises(ValueError, match="warmups"):
        one_f_one_b_family_timing(2, 4, 1, [5, 0], [1, 1], [1, 1], 0)
    with pytest.raises(ValueError, match="t_f/t_b"):
        one_f_one_b_family_timing(2, 4, 1, [1, 0], [1, 1, 1], [1, 1], 0)


def test_a_subclass_with_its_own_order_is_replayed():
    """A 1F1B subclass that orders its lists its own way (here: every forward first)
    has no warm-up count of its parent's, so its timing is the replay of its lists."""
    from strategies.pipeline import Action
    from strategies.schedules.one_f_one_b import OneFOneB

    class AllForwardsFirst(OneFOneB):
        name = "all-forwards-first"

        def rank_actions(self, rank, pp, microbatches, vpp):
            return ([Action(rank, "F", j) for j in range(microbatches)]
                    + [Action(rank, "B", j) for j in range(microbatches)])

    schedule = AllForwardsFirst()
    assert schedule.warmup_forwards(0, 4, 8, 1) is None
    t_f, t_b = [3, 5, 4, 9], [6, 11, 8, 15]
    expected = replay_timing(schedule.actions(4, 8, 1), schedule.placement(4, 1), t_f, t_b,
                             None, 2)
    timing = schedule.timing(4, 8, 1, t_f, t_b, None, 2)
    assert (timing.makespan, timing.rank_end, timing.rank_start,
            timing.rank_comm_wait) == expected


def _draw_family_shape(data, max_pp: int, max_vpp: int, max_microbatches: int, sets: int):
    """A random 1F1B-family shape for the hypothesis tests: ``(pp, m, vpp, warm-ups,
    duration sets [(t_f, t_b)], t_comm)``, durations from 0 to 10**12 (empty stages
    included), warm-up counts of the drawn schedule."""
    name = data.draw(st.sampled_from(FAMILY))
    pp = data.draw(st.integers(1, max_pp))
    vpp = data.draw(st.integers(2, max_vpp)) if name == "interleaved" else 1
    step = pp if name == "interleaved" else 1
    m = step * data.draw(st.integers(1, max(1, max_microbatches // step)))
    stages = pp * vpp
    hi = data.draw(st.sampled_from([0, 1, 7, 1000, 10 ** 12]))
    durations = st.lists(st.integers(0, hi), min_size=stages, max_size=stages)
    drawn = [(data.draw(durations), data.draw(durations)) for _ in range(sets)]
    t_comm = data.draw(st.integers(0, max(hi, 1)))
    schedule = get_schedule(name)
    warmups = [schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp)]
    return pp, m, vpp, warmups, drawn, t_comm


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_numpy_rows_equal_the_position_walk(data):
    """The numpy rows (strategies.pipeline._family_timing_vector) and the position walk
    give the same integers on any family shape: durations from 0 to 10**12 (ends near
    10**16), any t_comm, empty stages, warm-up counts of every schedule."""
    pp, m, vpp, warmups, durations, t_comm = _draw_family_shape(data, 12, 4, 40, 1)
    (t_f, t_b), = durations
    walked = pipeline._family_timing_scalar(pp, m, vpp, warmups, t_f, t_b, t_comm)
    rows = pipeline._family_timing_vector(pp, m, vpp, tuple(warmups), t_f, t_b, t_comm,
                                          rounds_max=10 ** 6)
    assert rows == tuple(walked)
    capped = pipeline._family_timing_vector(pp, m, vpp, tuple(warmups), t_f, t_b, t_comm)
    assert capped in (None, rows)


def test_long_pipelines_take_the_numpy_rows_and_equal_the_replay(monkeypatch):
    """The benchmark's long interleaved shapes (pp 8-16, vpp 2) are timed by the numpy
    rows, which settle within their rounds and equal the replay of the lists; one
    chunk (1F1B) walks positions."""
    used = []
    real = pipeline._family_timing_vector

    def counted(*args, **kwargs):
        found = real(*args, **kwargs)
        if not kwargs:  # (the public path's call, not _check's own)
            used.append(args[:3])
            assert found is not None, ("unsettled", args[:3])
        return found

    monkeypatch.setattr(pipeline, "_family_timing_vector", counted)
    rng = random.Random(16)
    for name, pp, vpp, m in [("interleaved", 16, 2, 48), ("interleaved", 8, 2, 24),
                             ("1f1b", 16, 1, 24), ("interleaved", 16, 2, 192)]:
        stages = pp * vpp
        t_f = [850_000_000 + rng.randint(0, 10 ** 7) for _ in range(stages)]
        t_b = [1_700_000_000 + rng.randint(0, 10 ** 7) for _ in range(stages)]
        _check(name, pp, m, vpp, t_f, t_b, 2_105_163)
    assert set(used) == {(16, 48, 2), (8, 24, 2), (16, 192, 2)}


def test_durations_int64_cannot_hold_take_the_position_walk(monkeypatch):
    """Fractions, negative values and ends past 2**62 are walked by position (Python's
    exact numbers), never by the int64 rows; rows that do not settle in
    their rounds give way to the walk with the same integers."""
    assert not pipeline._vector_exact(4, [1, 2], [3, Fraction(1, 2)], 0)
    assert not pipeline._vector_exact(4, [1, 2], [3, 4], -1)
    assert not pipeline._vector_exact(4, [1, -2], [3, 4], 0)
    assert not pipeline._vector_exact(4, [2 ** 60, 0], [0, 0], 0)
    assert pipeline._vector_exact(4, [2 ** 50, 0], [0, 0], 2 ** 40)
    schedule = get_schedule("interleaved")
    pp, vpp, m = 16, 2, 48
    warmups = [schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp)]
    big = [2 ** 61 + s for s in range(pp * vpp)]
    assert pipeline._vector_pays(pp, m * vpp, vpp, max(warmups))
    assert (one_f_one_b_family_timing(pp, m, vpp, warmups, big, big, 3)
            == pipeline._family_timing_scalar(pp, m, vpp, warmups, big, big, 3))
    t_f, t_b = [5] * (pp * vpp), [9] * (pp * vpp)
    expected = pipeline._family_timing_scalar(pp, m, vpp, warmups, t_f, t_b, 2)
    monkeypatch.setattr(pipeline, "_VECTOR_ROUNDS_PER_CHUNK", 0)
    monkeypatch.setattr(pipeline, "_VECTOR_ROUNDS_EXTRA", 0)
    assert pipeline._family_timing_vector(pp, m, vpp, tuple(warmups), t_f, t_b, 2) is None
    assert one_f_one_b_family_timing(pp, m, vpp, warmups, t_f, t_b, 2) == expected


def test_rows_refuse_an_order_the_walk_reads_ahead_of():
    """Warm-up counts of no schedule (rank 1 warming up longer than rank 0 in 1F1B):
    the walk would read an input not yet computed, so the units' graph is not the one
    the rows solve; the rows refuse (None) and the public function walks."""
    assert pipeline._vector_layout(2, 4, 1, (0, 3)) is None
    assert pipeline._family_timing_vector(2, 4, 1, (0, 3), [3, 5], [7, 9], 1) is None
    assert (one_f_one_b_family_timing(2, 4, 1, [0, 3], [3, 5], [7, 9], 1)
            == pipeline._family_timing_scalar(2, 4, 1, [0, 3], [3, 5], [7, 9], 1))
    for name in FAMILY:  # every schedule's own counts keep the walk's order
        schedule = get_schedule(name)
        for pp in (1, 2, 3, 4, 8, 16):
            for vpp in ((2, 3) if name == "interleaved" else (1,)):
                step = pp if name == "interleaved" else 1
                for m in (step, 2 * step, 5 * step):
                    warmups = tuple(schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp))
                    assert pipeline._vector_layout(pp, m, vpp, warmups) is not None


def test_replay_takes_a_transfer_price_per_pair_of_ranks():
    """t_comm as {(sending rank, receiving rank): ns}: the compiled replay and the event
    replay (simulate_unit_times) agree, equal prices give the scalar's integers, and a
    dearer hop delays exactly the dependencies that cross it (one hop of 1F1B on two
    ranks: the first backward waits for the forward's transfer and its own)."""
    from strategies.pipeline import simulate_unit_times
    from strategies.schedules import get_schedule

    schedule = get_schedule("zb-v")
    actions, placement = schedule.actions(4, 8, 2), schedule.placement(4, 2)
    t_f, t_b, t_w = [10, 11, 12, 13, 14, 15, 16, 17], [20] * 8, [7] * 8
    pairs = [(a, b) for a, b in placement.edges()] + [(b, a) for a, b in placement.edges()]
    same = {pair: 5 for pair in pairs}
    assert replay_timing(actions, placement, t_f, t_b, t_w, same) == \
        replay_timing(actions, placement, t_f, t_b, t_w, 5)
    dear = {**same, (1, 2): 40, (2, 1): 40}
    full = simulate_unit_times(actions, placement, 2, t_f, t_b, t_w, dear)
    got = replay_timing(actions, placement, t_f, t_b, t_w, dear)
    assert got[0] == full.makespan
    assert got[1] == tuple(row[-1][2] for row in full.spans)
    assert got[0] > replay_timing(actions, placement, t_f, t_b, t_w, 5)[0]
    one = get_schedule("1f1b")
    two = replay_timing(one.actions(2, 1, 1), one.placement(2, 1), [3, 4], [5, 6], None,
                        {(0, 1): 100, (1, 0): 1})
    assert two[0] == 3 + 100 + 4 + 6 + 1 + 5


def test_a_price_per_hop_reaches_the_one_price_family_and_a_missing_hop_is_named():
    """The 1F1B family takes a per-hop mapping through the list replay (equal prices give
    the recurrence's integers); a mapping without a crossed hop is one ValueError naming
    it, not a KeyError."""
    one = get_schedule("1f1b")
    assert (one.timing(2, 4, 1, [1, 1], [2, 2], None, {(0, 1): 1, (1, 0): 1}).makespan
            == one.timing(2, 4, 1, [1, 1], [2, 2], None, 1).makespan)
    with pytest.raises(ValueError, match=r"t_comm: no price for the hop from rank 1 to rank 0"):
        get_schedule("zb-v").timing(2, 2, 2, [1] * 4, [2] * 4, [1] * 4, {(0, 1): 1})


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_batched_rows_equal_each_set_walked(data):
    """Several duration sets of one shape at once (strategies.pipeline.
    _family_timing_vectors, one more numpy axis) give each set's own integers: every
    set equal to its position walk, a set left unsettled by a round cap is None (never
    another set's numbers), and the public batch (one_f_one_b_family_timings) equals
    one call per set whichever form its cost model picks."""
    pp, m, vpp, warmups, sets, t_comm = _draw_family_shape(
        data, 10, 3, 32, data.draw(st.integers(1, 5)))
    walked = [pipeline._family_timing_scalar(pp, m, vpp, warmups, t_f, t_b, t_comm)
              for t_f, t_b in sets]
    rows = pipeline._family_timing_vectors(pp, m, vpp, tuple(warmups), sets, t_comm,
                                           rounds_max=10 ** 6)
    assert rows == [tuple(w) for w in walked]
    capped = pipeline._family_timing_vectors(pp, m, vpp, tuple(warmups), sets, t_comm,
                                             rounds_max=1)
    assert all(c in (None, r) for c, r in zip(capped, rows))
    assert (pipeline.one_f_one_b_family_timings(pp, m, vpp, warmups, sets, t_comm)
            == [one_f_one_b_family_timing(pp, m, vpp, warmups, t_f, t_b, t_comm)
                for t_f, t_b in sets])


def test_batches_of_the_benchmark_shapes_take_the_rows(monkeypatch):
    """One-chunk pipelines the single call walks (1F1B pp 8-16 at 12-48 micro-batches) are
    timed by the batched rows for a dozen duration sets (the recompute modes and
    micro-batch shapes of a plan search), equal to each set's replay; a set the rows
    cannot hold (ends past 2**62) and one left unsettled by the round cap are walked
    within the same batch, with their own integers."""
    used = []
    real = pipeline._family_timing_vectors

    def counted(*args, **kwargs):
        found = real(*args, **kwargs)
        used.append((args[:3], found.count(None)))
        return found

    monkeypatch.setattr(pipeline, "_family_timing_vectors", counted)
    rng = random.Random(9)
    schedule = get_schedule("1f1b")
    for pp, m in [(16, 24), (8, 12), (16, 48)]:
        warmups = [schedule.warmup_forwards(r, pp, m, 1) for r in range(pp)]
        sets = [([850_000_000 + rng.randint(0, 10 ** 7) for _ in range(pp)],
                 [1_700_000_000 + rng.randint(0, 10 ** 8) for _ in range(pp)])
                for _ in range(12)]
        sets.append(([2 ** 61] * pp, [2 ** 61] * pp))
        got = pipeline.one_f_one_b_family_timings(pp, m, 1, warmups, sets, 2_105_163)
        for (t_f, t_b), found in zip(sets, got):
            expected = replay_timing(schedule.actions(pp, m, 1), schedule.placement(pp, 1),
                                     t_f, t_b, None, 2_105_163)
            assert found == expected, (pp, m)
    assert [shape for shape, _ in used] == [(16, 24, 1), (8, 12, 1), (16, 48, 1)]
    # a batch cut short: the unsettled sets walk, the result is the same
    monkeypatch.setattr(pipeline, "_VECTOR_ROUNDS_PER_CHUNK", 0)
    monkeypatch.setattr(pipeline, "_VECTOR_ROUNDS_EXTRA", 1)
    warmups = [schedule.warmup_forwards(r, 16, 24, 1) for r in range(16)]
    sets = [([5 + s for s in range(16)], [9] * 16), ([7] * 16, [3 + 2 * s for s in range(16)])]
    got = pipeline.one_f_one_b_family_timings(16, 24, 1, warmups, sets, 40)
    assert len(used) == 4 and used[-1][1] > 0  # (the cap left a set unsettled)
    assert got == [pipeline._family_timing_scalar(16, 24, 1, warmups, t_f, t_b, 40)
                   for t_f, t_b in sets]


def test_primed_timings_are_the_ones_each_call_computes():
    """strategies.schedules.base.prime_family_timings returns, and keeps in the 1F1B
    family's memo, what OneFOneBFamily.timing computes alone (same PipelineTiming), from
    the memo on a second call too (known_family_timing reads it); requests the
    recurrence does not time (a price per hop, a refused shape, fractions) get None and
    are left to their own call, which still gives its own answer or error."""
    from strategies.schedules import base

    rng = random.Random(5)
    one, inter = get_schedule("1f1b"), get_schedule("interleaved")
    requests = []
    for _ in range(30):
        schedule, vpp = rng.choice([(one, 1), (inter, 2)])
        pp = rng.choice([2, 4, 8])
        m = pp * rng.randint(1, 4)
        t_f = [rng.randint(1, 10 ** 6) for _ in range(pp * vpp)]
        t_b = [rng.randint(1, 10 ** 6) for _ in range(pp * vpp)]
        requests.append((schedule, pp, m, vpp, t_f, t_b, rng.choice([0, 7, 1000])))
    requests.append((one, 2, 4, 1, [1, 1], [2, 2], {(0, 1): 1, (1, 0): 1}))  # per hop
    requests.append((inter, 4, 6, 2, [1] * 8, [2] * 8, 3))  # m not a multiple of pp
    requests.append((one, 2, 4, 1, [Fraction(1, 2), 1], [2, 2], 1))  # not whole ns
    base._FAMILY_TIMINGS.clear()
    alone = [base._family_timing(s, pp, m, vpp, tuple(f), tuple(b), c)
             for s, pp, m, vpp, f, b, c in requests[:30]]
    base._FAMILY_TIMINGS.clear()
    primed = base.prime_family_timings(requests)
    assert primed == alone + [None, None, None]
    assert base.prime_family_timings(requests) == primed
    # (the fractions' request is kept as lists to replay, as _family_timing keeps it)
    assert len(base._FAMILY_TIMINGS) == 1 + len({(s, pp, m, vpp, tuple(f), tuple(b), c)
                                                 for s, pp, m, vpp, f, b, c in requests[:30]})
    for (s, pp, m, vpp, f, b, c), expected in zip(requests, alone):
        assert s.timing(pp, m, vpp, f, b, None, c) == expected
        assert base.known_family_timing(s, pp, m, vpp, f, b, c) == (False, expected)
    # what the memo never times is not waited for (a price per hop; fractions: lists to
    # replay, kept as such), a refused shape stays missing (its own call raises)
    assert [base.known_family_timing(*request) for request in requests[30:]] == [
        (False, None), (True, None), (False, None)]
    assert one.timing(2, 4, 1, [1, 1], [2, 2], None, {(0, 1): 1, (1, 0): 1}).makespan > 0
    with pytest.raises(ValueError):
        inter.timing(4, 6, 2, [1] * 8, [2] * 8, None, 3)


@pytest.mark.parametrize("warmups", [[1, 1, 1], [1, 1, 1, 99], [1, 1, -1, 1]],
                         ids=["wrong-length", "past-the-actions", "negative"])
def test_batched_timings_refuse_bad_warmups_as_the_single_call(warmups):
    """strategies.pipeline.one_f_one_b_family_timings checks the warm-up counts once,
    before its sets, and hands bad ones to the single call: the same ValueError."""
    sets = [([5] * 4, [9] * 4), ([7] * 4, [3] * 4)]
    with pytest.raises(ValueError) as single:
        pipeline.one_f_one_b_family_timing(4, 8, 1, warmups, *sets[0], 10)
    with pytest.raises(ValueError) as batched:
        pipeline.one_f_one_b_family_timings(4, 8, 1, warmups, sets, 10)
    assert str(batched.value) == str(single.value)


def test_shortened_rows_insert_the_walks_periods_exactly(monkeypatch):
    """Long shapes solved by the numpy rows with whole periods fewer micro-batches
    (strategies.pipeline._period_microbatches) and the missing periods inserted where
    the short rows repeat: each set equal to the replay of every action (one chunk and
    interleaved, equal stages but for the ends, t_comm > 0); random durations whose short
    rows show no period are solved again at full length, with the walk's integers."""
    shortened, again = [], []
    real = pipeline._solve_rows

    def counted(*args):
        found = real(*args)
        if len(args) > 7:
            shortened.append(args[:3])
            again.extend(args[:3] for k in found if k is pipeline._NO_PERIOD)
        return found

    monkeypatch.setattr(pipeline, "_solve_rows", counted)
    rng = random.Random(12)
    for name, pp, vpp, m in [("1f1b", 8, 1, 96), ("1f1b", 16, 1, 192),
                             ("interleaved", 16, 2, 192), ("interleaved", 4, 3, 64)]:
        schedule = get_schedule(name)
        warmups = [schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp)]
        assert pipeline._period_microbatches(pp, m, vpp, warmups) < m
        stages = pp * vpp
        sets = []
        for _ in range(5):
            t_f = [850_000_000 + rng.randint(0, 10 ** 6)] * stages
            t_b = [1_700_000_000 + rng.randint(0, 10 ** 6)] * stages
            t_f[0] += 10 ** 7
            t_b[-1] += rng.randint(0, 10 ** 8)
            sets.append((t_f, t_b))
        got = pipeline._family_timing_vectors(pp, m, vpp, tuple(warmups), sets, 2_105_163)
        for (t_f, t_b), found in zip(sets, got):
            assert found == replay_timing(schedule.actions(pp, m, vpp),
                                          schedule.placement(pp, vpp), t_f, t_b, None,
                                          2_105_163), (name, pp, vpp, m)
    # every shape shortened, and most sets took the inserted periods (a slow last stage
    # can settle past the margin: that set was solved again, still exact)
    assert len(shortened) == 4 and len(again) <= 3
    # random durations: some short rows show no period (solved again), all exact
    for _ in range(40):
        pp, vpp = rng.randint(2, 8), rng.randint(1, 3)
        name = "interleaved" if vpp > 1 else "1f1b"
        m = (pp if vpp > 1 else 1) * rng.randint(8, 24)
        schedule = get_schedule(name)
        warmups = [schedule.warmup_forwards(r, pp, m, vpp) for r in range(pp)]
        sets = [([rng.randint(0, 1000) for _ in range(pp * vpp)],
                 [rng.randint(0, 1000) for _ in range(pp * vpp)]) for _ in range(2)]
        t_comm = rng.randint(0, 300)
        got = pipeline._family_timing_vectors(pp, m, vpp, tuple(warmups), sets, t_comm,
                                              rounds_max=10 ** 6)
        assert got == [pipeline._family_timing_scalar(pp, m, vpp, warmups, t_f, t_b, t_comm)
                       for t_f, t_b in sets], (pp, vpp, m)
    assert again
