"""sim.breakdown: where a rank's replayed time goes."""

from __future__ import annotations

from sim.breakdown import rank_breakdowns
from sim.timeline import Timeline


def test_a_rank_idle_beside_its_own_send_is_in_the_bubble_beside_a_receive_exposed():
    """Rank 0 computes 0-4 us, sends 4-6 us and idles to 10 us; rank 1 receives 4-6 us,
    computes 6-10 us. Rank 0's compute never waits on its send (it runs on its own
    stream): its 6 idle us are bubble. Rank 1 waits 4 us for nothing (bubble) and 2 us for
    the transfer it needs (exposed pp)."""
    timeline = Timeline()
    timeline.record(0, "compute", "F", "matmul", 0, 4_000, 0, 1e9, "compute", 0)
    timeline.record(0, "pp.send.fwd", "send", "send", 4_000, 6_000, 1 << 20, 0.0, "comm", 1,
                    "pp")
    timeline.record(1, "pp.recv.fwd", "recv", "recv", 4_000, 6_000, 1 << 20, 0.0, "comm", 0,
                    "pp")
    timeline.record(1, "compute", "F", "matmul", 6_000, 10_000, 0, 1e9, "compute", 1)
    rows = rank_breakdowns(timeline, [0, 1], 10_000)
    assert rows[0]["compute"] == 4e-6 and rows[0]["exposed_pp"] == 0.0
    assert rows[0]["bubble"] == 6e-6
    assert rows[1]["compute"] == 4e-6 and rows[1]["exposed_pp"] == 2e-6
    assert rows[1]["bubble"] == 4e-6
