"""Closed forms of the zero-bubble and DualPipe schedules, asserted exactly on their
action lists replayed with unit times (strategies.pipeline.simulate_unit_times).

Notation: per-stage (per-chunk for V shapes) forward ``F``, input gradient ``I``,
weight gradient ``W``, full backward ``B = I + W``, an overlapped pair ``F&B``. The
bubble is the first rank's idle time between its first start and its last end.

* ZB-H2 (Qi et al. 2023, arXiv 2401.10241, Table 2): ``(p - 1)(F + I - 2W)`` when
  ``W <= min(F, I)``; a parallelogram (every rank busy from its first to its last action)
  when ``F = I = W``; up to ``2p - 1`` micro-batches in flight.
* ZB-V (Qi et al. 2024, arXiv 2405.15362; the ZB paper's Appendix): ``(p - 1)(F + I -
  2W)`` with ``F = I`` and ``W <= F``, chunk times; 1F1B's activations (``2p`` chunks).
* DualPipe (DeepSeek-V3 report, arXiv 2412.19437, Table 2): ``(PP/2 - 1)(F&B + B - 3W)``
  with ``I = F >= W``, when ``F&B = F + B`` or ``PP <= 4``; in general the replay is
  ``(PP/2 - 2)(F + B - F&B)`` below it. Activations ``PP + 1`` chunks, parameters twice.
  DualPipeV: the same with ``PP`` twice its ranks, parameters once.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.pipeline import check_schedule, simulate_unit_times
from strategies.schedules import SCHEDULES, get_schedule


def _first_rank_bubble(timing) -> int:
    """Idle time of rank 0 between its first start and its last end."""
    row = timing.spans[0]
    return row[-1][2] - row[0][1] - timing.busy[0]


def _replay(name, pp, m, vpp, *, f, i, w, fb=None):
    sched = get_schedule(name)
    return simulate_unit_times(sched.actions(pp, m, vpp), sched.placement(pp, vpp), vpp,
                               t_f=f, t_b=i + w, t_w=w, t_fb=fb)


# --------------------------------------------------------------------------- ZB-H2


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(0, 12), st.integers(1, 9), st.integers(1, 9),
       st.integers(0, 9))
def test_zb_h2_bubble_is_its_published_closed_form(p, extra, f, i, w):
    w = min(w, f, i)  # the regime of the paper's Table 2
    m = 2 * p - 1 + extra
    timing = _replay("zb-h2", p, m, 1, f=f, i=i, w=w)
    assert _first_rank_bubble(timing) == (p - 1) * (f + i - 2 * w)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (6, 24)])
def test_zb_h2_is_a_parallelogram_with_equal_passes_and_holds_2p_minus_1(p, m):
    timing = _replay("zb-h2", p, m, 1, f=1, i=1, w=1)
    for rank, row in enumerate(timing.spans):
        assert row[0][1] == rank and row[-1][2] - row[0][1] == timing.busy[rank] == 3 * m
    assert timing.max_inflight == tuple(min(m, 2 * (p - r) - 1) for r in range(p))
    one = _replay("zb-h1", p, m, 1, f=1, i=1, w=1)
    assert _first_rank_bubble(one) == (p - 1) and _first_rank_bubble(timing) == 0


# --------------------------------------------------------------------------- ZB-V


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(0, 12), st.integers(1, 9), st.integers(0, 9))
def test_zb_v_bubble_is_its_published_closed_form(p, extra, f, w):
    w = min(w, f)
    m = 2 * p + extra
    timing = _replay("zb-v", p, m, 2, f=f, i=f, w=w)
    assert _first_rank_bubble(timing) == (p - 1) * (f + f - 2 * w)
    # 1F1B's memory: 2p chunk activations, each half a 1F1B stage
    assert set(timing.max_inflight) == {2 * p}


# --------------------------------------------------------------------------- DualPipe


def _dualpipe_form(pp, f, b, w, fb):
    return (pp // 2 - 1) * (fb + b - 3 * w)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 6), st.integers(1, 9), st.integers(0, 9), st.data())
def test_dualpipe_bubble_is_its_published_closed_form_on_four_ranks(extra, f, w, data):
    """PP = 4, I = F, W <= F, any overlap of the pair (max(F, B) <= F&B <= F + B)."""
    w = min(w, f)
    b = f + w
    fb = data.draw(st.integers(b, f + b))
    m = 8 + 2 * extra
    timing = _replay("dualpipe", 4, m, 1, f=f, i=f, w=w, fb=fb)
    assert _first_rank_bubble(timing) == _dualpipe_form(4, f, b, w, fb)


@pytest.mark.parametrize("pp", [2, 6, 8, 10])
@pytest.mark.parametrize("f, w", [(2, 1), (3, 2), (4, 1)])
def test_dualpipe_bubble_as_the_report_draws_it(pp, f, w):
    """F&B drawn as the two cells side by side (F&B = F + B), I = F: the published form
    for any PP; with a pair that overlaps (F&B < F + B), (PP/2 - 2)(F + B - F&B) less."""
    b = f + w
    for m in (2 * pp, 4 * pp):
        timing = _replay("dualpipe", pp, m, 1, f=f, i=f, w=w, fb=f + b)
        assert _first_rank_bubble(timing) == _dualpipe_form(pp, f, b, w, f + b)
        fb = b  # the pair fully overlapped (its longer member)
        timing = _replay("dualpipe", pp, m, 1, f=f, i=f, w=w, fb=fb)
        assert _first_rank_bubble(timing) == (_dualpipe_form(pp, f, b, w, fb)
                                              - max(0, pp // 2 - 2) * (f + b - fb))


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_dualpipe_v_is_dualpipe_on_half_the_ranks(ranks):
    f, w = 3, 1
    b = f + w
    for fb in (b, b + 1, f + b):
        v = _replay("dualpipe-v", ranks, 4 * ranks, 2, f=f, i=f, w=w, fb=fb)
        full = _replay("dualpipe", 2 * ranks, 4 * ranks, 1, f=f, i=f, w=w, fb=fb)
        assert _first_rank_bubble(v) == _first_rank_bubble(full)
    v = _replay("dualpipe-v", ranks, 4 * ranks, 2, f=f, i=f, w=w, fb=f + b)
    assert _first_rank_bubble(v) == _dualpipe_form(2 * ranks, f, b, w, f + b)


@pytest.mark.parametrize("name, vpp, pp", [("dualpipe", 1, 4), ("dualpipe", 1, 8),
                                          ("dualpipe-v", 2, 4)])
def test_dualpipe_memory_and_parameters(name, vpp, pp):
    """Activations of PP + 1 chunks on every rank (PP = the pipeline's chunk count);
    DualPipe holds every chunk on two ranks, DualPipeV once."""
    sched = get_schedule(name)
    placement = sched.placement(pp, vpp)
    timing = _replay(name, pp, 4 * pp, vpp, f=2, i=2, w=1, fb=4)
    chunks = placement.num_chunks
    assert set(timing.max_inflight) == {chunks + 1}
    holders = {c: {placement.rank_of(s) for s in range(placement.num_stages)
                   if placement.chunk_of(s) == c} for c in range(chunks)}
    assert {len(h) for h in holders.values()} == {2 if name == "dualpipe" else 1}


def test_dualpipe_overlaps_a_forward_with_a_backward_in_its_steady_state():
    rows = get_schedule("dualpipe").actions(8, 32, 1)
    for row in rows:
        pairs = [(a, b) for a, b in zip(row, row[1:]) if a.overlap]
        assert pairs and all(a.comp == "F" and b.comp == "B" for a, b in pairs)
        # the two members belong to micro-batches of opposite directions or chunks
        assert all(a.stage != b.stage for a, b in pairs)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_schedule_with_overlapped_pairs_is_complete_and_deadlock_free(schedule):
    """Megatron-Core's overlap of one micro-batch's forward with another's backward
    (``--overlap-moe-expert-parallel-comm``) pairs adjacent F and B actions; a pair whose
    backward would wait for its own forward stays two actions."""
    sched = get_schedule(schedule)
    for pp in (1, 2, 3, 4):
        for vpp in sorted({1, *sched.vpp_choices}):
            for m in (1, pp, 2 * pp, 3 * pp + 1, 4 * pp):
                try:
                    rows = sched.actions(pp, m, vpp, overlap=True)
                except ValueError:
                    continue
                check_schedule(rows, sched.placement(pp, vpp), microbatches=m)


def test_a_pair_takes_its_own_duration_in_the_exact_replay():
    """Interleaved 1F1B with its steady-state forwards and backwards paired: each pair
    saves F + B - F&B of busy time, and the step is shorter."""
    sched = get_schedule("interleaved")
    rows = sched.actions(4, 16, 2, overlap=True)
    paired = simulate_unit_times(rows, 4, 2, t_f=1, t_b=2, t_fb=Fraction(5, 2))
    plain = simulate_unit_times(sched.actions(4, 16, 2), 4, 2, t_f=1, t_b=2)
    pairs = sum(a.overlap for a in rows[0])
    assert pairs > 0 and paired.busy[0] == plain.busy[0] - pairs * Fraction(1, 2)
    assert plain.makespan - pairs * Fraction(1, 2) <= paired.makespan < plain.makespan


def test_without_a_pipeline_each_backward_waits_to_pair_with_the_next_forward():
    rows = get_schedule("1f1b").actions(1, 4, 1, overlap=True)
    assert [str(a) + ("+" if a.overlap else "") for a in rows[0]] == [
        "0F0", "0F1+", "0B0", "0F2+", "0B1", "0F3+", "0B2", "0B3"]
    timing = simulate_unit_times(rows, 1, 1, t_f=1, t_b=2, t_fb=2)
    assert timing.makespan == 1 + 3 * 2 + 2
