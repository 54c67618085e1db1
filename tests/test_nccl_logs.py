"""NCCL as it behaves across nodes, against every multi-node nccl-tests log we hold.

Issue 12, item 4, must show: inter-node sendrecv, tree all-reduce and mid-size
(1-256 MiB) busbw within 10 % median on the logs held in validate/data/nccl, and
multi-node ring busbw versus node count within 10 %. ``tests/nccl_logs.py`` does the
simulating (every log on the preset of its system, analytic fidelity); this module
asserts the tolerances per category and per source, and prints every table with::

    PYTHONPATH=. python -m pytest -q -s tests/test_nccl_logs.py

Where a source misses the tolerance for a reason this model does not (yet) cover, its
test is a strict xfail carrying that reason: it fails the suite the day the miss turns
into a pass (so the mark has to go) or the category median breaks.
"""

from __future__ import annotations

import math

import pytest

import nccl_logs as logs

# Every held-out nccl-tests log simulated (~7 s): the whole suite's, not the inner loop's.
pytestmark = pytest.mark.slow

TOLERANCE = 0.10
#: (category, source) pairs that miss the 10 % median, and why.
KNOWN_MISSES = {
    ("mid", "aws_awsome_distributed_training_readme"):
        "EFA at 1-8 MiB: with what the plugin tells NCCL (aws-ofi-nccl: NCCL_PROTO=simple "
        "on p4de, a 75 us network latency on every step, twice for Simple; "
        "tests/nccl_logs.py AWS) both 2-node all_reduce sweeps are within 10 % from 16 MiB "
        "up but 15-47 % slow at 1-8 MiB (13 % median): NCCL's step model with the plugin's "
        "75 us overstates a small 2-node tree over EFA, and the README prints neither the "
        "NCCL nor the plugin version",
    ("mid", "together_b200_64node_sweep"):
        "512-rank collectives at 1-8 MiB: the rings run LL there (NCCL's selection and "
        "trainsim's alike) and spend 1.6-1.75x NCCL's LL step latency (+54 to +300 % "
        "fast): no calibration log runs LL where its latency counts, so LL's ring step "
        "pacing stays 0 (hardware/catalog/_defaults.toml); and tree/NVLS-tree under auto "
        "are 1.4-2.7x fast at 1-64 MiB (test_512_rank_ring_latency_in_numbers), trees "
        "not being paced. Its LL128 ring rows (16-256 MiB), paced at the step time "
        "fitted on the H100 10x8 rings, are within -22 % .. +9 % "
        "(test_paced_512_rank_ll128_rings_are_validated); 47 % median over its 72 rows",
    ("sendrecv", "xxrjun_h100_clusters"):
        "one GPU per node sends and receives through one NIC and PCIe link: "
        "23.7-24.9 GB/s per pair against 2 channels x 14 GB/s (+12-18 %); NCCL itself "
        "discounts such pairs (tuning.cc, ppn < 2); the 8-GPU-per-node pairs are -3 % / -8 %",
}


def _median(rows) -> float:
    return logs.median_abs(r.error for r in rows)


def _sources(category: str) -> list[str]:
    # from the logs' own rows: collection simulates nothing (every xdist worker collects)
    return sorted({r.log.source for r in logs.category_rows(category, simulate=False)})


def _params(category: str):
    out = []
    for source in _sources(category):
        reason = KNOWN_MISSES.get((category, source))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(category, source, marks=marks, id=f"{category}-{source}"))
    return out


def test_error_tables_cover_every_log(capsys):
    """Every log is either simulated or left out for a stated reason (no preset of its
    system, or CollNet/SHARP, which trainsim does not model); prints every table."""
    logs.print_tables()
    printed = capsys.readouterr().out
    with capsys.disabled():
        print(printed)
    for log, rows in logs.compared():
        if rows is None:
            assert logs.system_of(log) is None or logs.algorithm_of(log) is None, log.label
        else:
            assert rows, f"{log.label}: no size could be simulated"


#: Categories whose median over all rows misses, and why.
CATEGORY_MISSES: dict[str, str] = {}
#: The mid category was a strict xfail until the ring step pacing
#: (comm.ring_step_pacing_us.LL128, fitted on the calibration logs, which are in no
#: category): 10.4 % over 282 rows with the calibration logs and no pacing, 9.9 % over
#: the 274 validation rows with no pacing, 8.4 % with it (tests/nccl_logs.py).


@pytest.mark.parametrize("category", [
    pytest.param(c, marks=[pytest.mark.xfail(strict=True, reason=CATEGORY_MISSES[c])]
                 if c in CATEGORY_MISSES else [], id=c)
    for c in ("sendrecv", "tree", "mid")])
def test_category_median_within_tolerance(category):
    """Median |busbw error| over every row of the category (multi-node logs, sizes
    >= 1 MiB; mid: 1-256 MiB of logs spanning several NVLink domains; no calibration
    log in any)."""
    rows = logs.category_rows(category)
    assert len(rows) >= 10
    median = _median(rows)
    print(f"\n{category}: {len(rows)} rows, median |busbw error| {median:.1%}")
    assert median <= TOLERANCE


@pytest.mark.parametrize("category,source", _params("sendrecv") + _params("tree")
                         + _params("mid"))
def test_source_median_within_tolerance(category, source):
    rows = [r for r in logs.category_rows(category) if r.log.source == source]
    median = _median(rows)
    print(f"\n{category} {source}: {len(rows)} rows, median |busbw error| {median:.1%}")
    assert median <= TOLERANCE


#: Ring series that miss, and why.
RING_MISSES = {
    "together_b200_collective all_gather Ring 16GiB":
        "the use3a cluster loses ~8-15 % of its 2-node bandwidth beyond 4 nodes at 16 GiB "
        "(343 -> 293 GB/s at 46 nodes) where no latency term is large; its other cluster "
        "(flapping-airplanes, tuned adaptive routing) stays flat to 64 nodes at 32 GiB, so "
        "this is its fabric (ECMP/adaptive routing across leaves, not published)",
}


def _series_ids():
    return [pytest.param(s.key, id=s.key,
                         marks=[pytest.mark.xfail(strict=True, reason=RING_MISSES[s.key])]
                         if s.key in RING_MISSES else [])
            for s in logs.ring_series(simulate=False)]


@pytest.mark.parametrize("key", _series_ids())
def test_ring_busbw_versus_node_count(key):
    """A ring's busbw at every node count of one system and report, within 10 % (median
    over the node counts), and falling with the node count where the measurement
    falls by more than 5 %."""
    series = next(s for s in logs.ring_series() if s.key == key)
    median = _median(series.points)
    print(f"\n{key}: drop measured {series.drop('measured'):.2f} simulated "
          f"{series.drop('simulated'):.2f}, median |error| {median:.1%}")
    assert median <= TOLERANCE
    if series.drop("measured") < 0.95:
        assert series.drop("simulated") < 1.0


def test_there_are_ring_series_on_several_node_counts():
    series = logs.ring_series()
    assert len(series) >= 10
    assert max(len(s.points) for s in series) >= 6


# ------------------------------------------------------- the mechanisms, one by one
def _row(source: str, collective: str, nodes: int, note: str, size: int):
    for log, rows in logs.compared():
        if (log.source == source and log.collective == collective and log.nodes == nodes
                and log.note.startswith(note) and rows):
            for r in rows:
                if r.size_bytes == size:
                    return r
    raise LookupError((source, collective, nodes, note, size))


def test_b200_sendrecv_follows_the_p2p_channels_per_peer():
    """4 channels per network peer up to 32 ranks (NIC-bound), 2 at 64, 1 at 128+
    (paths.cc, 2.29): 43 -> 26 -> 14.6 GB/s per pair as measured."""
    size = 256 << 20
    by_nodes = {n: _row("together_b200_sendrecv_scaling", "sendrecv", n, "sendrecv", size)
                for n in (2, 4, 8, 16, 32, 64)}
    for n, row in by_nodes.items():
        assert abs(row.error) <= TOLERANCE, (n, row.measured, row.simulated)
    assert by_nodes[8].simulated < 0.7 * by_nodes[4].simulated
    assert by_nodes[16].simulated == pytest.approx(by_nodes[64].simulated, rel=0.01)


def test_b200_tree_is_half_of_the_nics_at_two_nodes_and_less_beyond():
    """NCCL's tree kernel, not the NICs, bounds a B200 tree: ~335 GB/s busbw on 2 nodes
    (the NICs would give ~690) and ~190 beyond."""
    two = _row("together_b200_collective_scaling", "all_reduce", 2, "Tree", 16 << 30)
    many = _row("together_b200_collective_scaling", "all_reduce", 16, "Tree", 16 << 30)
    assert abs(two.error) <= TOLERANCE and abs(many.error) <= TOLERANCE
    assert 1.5 < two.simulated / many.simulated < 2.0


def test_gb200_tree_across_three_partitions_beats_the_ring():
    """NCCL's dtree over 3 partitions (a chain and its shift) loads a NIC with 1.5 S
    against the ring's 2(n-1)/n S: tree above ring as in NVIDIA/nccl#1801."""
    for gpn in (4, 8):
        found = {log.note.split(" ")[0]: rows[0] for log, rows in logs.compared()
                 if log.source == "gh_nccl1801_gb200_tree_vs_ring" and log.gpus_per_node == gpn}
        tree, ring = found["tree"], found["ring"]
        assert abs(tree.error) <= TOLERANCE and abs(ring.error) <= TOLERANCE
        assert tree.simulated > 1.1 * ring.simulated


def test_errors_are_finite():
    for log, rows in logs.compared():
        for r in rows or ():
            assert math.isfinite(r.simulated) and r.simulated > 0, log.label


def test_512_rank_ring_latency_in_numbers():
    """The biggest mid-size miss (issue 12, item 4), in numbers. Beyond streaming its
    bytes, a 512-rank ring (64 x 8 B200, NCCL 2.29.7) spends, of the latency of NCCL's
    step model under the protocol NCCL's selection runs there (tuning.cc: baseLat +
    (steps - net steps) x max(hwLat NVLink, netOverhead) + net steps x hwLat NET;
    hardware/network.py phase_latency_s):

    * LL at 1-2 MiB: 1.5-1.8x;
    * LL128 at 16-32 MiB: 2.6-3.0x, in both runs and for every collective;
    * LL128 at 64-256 MiB: 2.8-3.0x in the run of 2026-04-09, 3.55-3.8x in the run of
      2026-04-16 (another allocation, 8-21 % slower at 64 MiB-2 GiB, SOURCES.md).

    Step counts are NCCL's: 2 (n - 1) for all_reduce, n - 1 for all_gather and
    reduce_scatter. The 80-rank H100 rings (10 x 8, NCCL 2.29.2) pay 2.3x or more of the
    LL128 latency too: the same per-step excess at 80 and 512 ranks, on H100 and B200.
    (These windows were read as Simple before; NCCL and trainsim run LL128 there:
    test_512_rank_ring_switches_to_simple_between_4_and_8_gib.)"""
    rows = logs.ring_latency_rows()
    big = [r for r in rows if r.log.source == "together_b200_64node_sweep"]
    assert len(big) >= 40
    assert {r.protocol for r in big} == {"LL", "LL128"}
    for r in big:
        ranks = r.log.nodes * r.log.gpus_per_node
        assert r.steps == (2 * (ranks - 1) if r.log.collective == "all_reduce" else ranks - 1)
        if r.protocol == "LL":
            low, high = 1.5, 1.8
        elif r.size_bytes <= 32 * logs.MiB:
            low, high = 2.6, 3.0
        elif "Apr-09" in r.log.citation:
            low, high = 2.8, 3.0
        else:
            low, high = 3.55, 3.8
        assert low <= r.ratio <= high, (r.log.label, r.size_bytes >> 20, r.protocol, r.ratio)
    h100 = [r for r in rows if r.log.source == "xxrjun_h100_clusters"]
    assert h100 and all(r.protocol == "LL128" and r.ratio > 2.3 for r in h100)


#: Data bytes one ring step moves per rank and channel at most (NCCL 2.29
#: src/enqueue.cc calcCollChunking: ring chunkSteps 1 for LL/LL128, chunk = stepSize =
#: buffSizes[proto] / NCCL_STEPS; LL halves it (8-byte flag + data words), LL128 keeps 15
#: of every 16 words). Default buffers (src/include/device.h): LL 8 lines/thread x 512
#: threads x 8 steps x 16 B = 512 KiB; LL128 120 elems/thread x 640 threads x 8 steps x
#: 8 B = 4,915,200 B: 32,768 (LL) and 576,000 (LL128) data bytes.
RING_CHUNK_DATA_BYTES = {"LL": 524288 // 8 // 2, "LL128": 4915200 // 8 * 15 // 16}


def test_mid_size_512_rank_rings_run_one_pass():
    """NCCL's latency per chunk is not the mid-size mechanism (the brief's candidate):
    NCCL 2.29's ring kernels run a channel's share in passes of the ring's steps, one
    pass per chunk (src/device/all_gather.h runRing: ``for elemOffset < partCount;
    elemOffset += chunkCount`` over the per-rank count; all_reduce.h: loops of nranks x
    chunkCount of the buffer), and a pass pays the steps' latency again. Even with all
    the data on one channel, every mid-size row of the 512-rank sweep fits one pass:
    trainsim's one charge of 2 (n - 1) or n - 1 step latencies is NCCL's count, and the
    2.7-3.7x LL128 excess is per step, not per chunk (the chunks are 576,000 B of data,
    the rows move <= 512 KiB per rank)."""
    big = [r for r in logs.ring_latency_rows() if r.log.source == "together_b200_64node_sweep"]
    assert big
    for r in big:
        ranks = r.log.nodes * r.log.gpus_per_node
        chunk = RING_CHUNK_DATA_BYTES[r.protocol]
        # all_gather / reduce_scatter: passes over the per-rank count; all_reduce: over
        # the buffer in loops of nranks chunks (one channel: the most a channel gets)
        per_pass = chunk * (ranks if r.log.collective == "all_reduce" else 1)
        share = r.size_bytes if r.log.collective == "all_reduce" else r.size_bytes // ranks
        assert math.ceil(share / per_pass) == 1, (r.log.label, r.size_bytes, r.protocol)


def test_512_rank_ring_switches_to_simple_between_4_and_8_gib():
    """What the 512-rank ring runs at mid sizes is LL128, not Simple: NCCL's tuning
    model (src/tuning/ring.cc: LL128 at 0.92 of Simple's bandwidth with a smaller
    latency) keeps LL128 up to ~6 GB on this ring, and so does trainsim's selection
    (ring/LL128 from 16 MiB to 4 GiB, ring/Simple at 8 GiB for all_gather and
    reduce_scatter). The logs show the switch: doubling 2 -> 4 GiB doubles the time
    (x1.94-1.96), doubling 4 -> 8 GiB adds only half again (x1.49-1.56), where Simple's
    bandwidth takes over."""
    for kind in ("all_gather", "reduce_scatter"):
        found = [rows for log, rows in logs.compared()
                 if log.source == "together_b200_64node_sweep" and log.collective == kind
                 and log.note.startswith("ring") and rows]
        assert len(found) == 1
        by_gib = {r.size_bytes >> 30: r for r in found[0] if r.size_bytes >= 1 << 30}
        plans = {r.size_bytes >> 20: r.plan for r in found[0]}
        assert all(plan == "ring/LL128" for mib, plan in plans.items() if 16 <= mib <= 4096)
        assert plans[8192] == "ring/Simple"

        def time_s(r):  # up to the bus factor, equal for one collective over 512 ranks
            return r.size_bytes / r.measured

        assert 1.85 < time_s(by_gib[4]) / time_s(by_gib[2]) < 2.0
        assert 1.4 < time_s(by_gib[8]) / time_s(by_gib[4]) < 1.65


def test_ring_plateau_applies_to_multi_domain_simple_all_reduce_only():
    """NCCL's ring plateau (x1.4 from compute capability 8.0, tuning.cc) multiplies the
    step latency of a Simple ring all-reduce across NVLink domains, exactly; not LL or
    LL128, not all_gather, not inside one domain."""
    from hardware.catalog import load_cluster
    from hardware.cost import CostModel
    from hardware.topology import ClusterLayout
    from strategies.collectives.catalog import ALGORITHMS

    def step_latency_s(nodes, kind, protocol, factor):
        layout = ClusterLayout(load_cluster("dgx-h100", {"comm.ring_plateau_factor": factor}),
                               nodes, 8)
        cost = CostModel(layout, ALGORITHMS, fidelity="analytic")
        plan = cost.collective_plan(kind, tuple(range(8 * nodes)), 64 << 20, "ring", protocol)
        return sum(cost.network.phase_latency_s(ph, protocol, plan.family) for ph in plan.phases)

    assert load_cluster("dgx-h100").comm.ring_plateau_factor == 1.4
    assert step_latency_s(4, "all_reduce", "Simple", 1.4) == pytest.approx(
        1.4 * step_latency_s(4, "all_reduce", "Simple", 1.0), rel=1e-12)
    for nodes, kind, protocol in ((4, "all_reduce", "LL128"), (4, "all_reduce", "LL"),
                                  (4, "all_gather", "Simple"), (1, "all_reduce", "Simple")):
        assert step_latency_s(nodes, kind, protocol, 1.4) == step_latency_s(nodes, kind,
                                                                           protocol, 1.0)


def _ring_excess_per_step_s(source: str, nodes: int, gpn: int, max_bytes: int):
    """(collective, size, steps, network steps, (measured - streamed) seconds, NVLink
    hop s) of every ring/LL128 all_gather and reduce_scatter row of a log up to
    ``max_bytes``: the time trainsim's streaming of the bytes leaves to latency."""
    out = []
    for log, rows in logs.compared():
        if (log.source != source or log.nodes != nodes or log.gpus_per_node != gpn or not rows
                or log.collective not in ("all_gather", "reduce_scatter")):
            continue
        preset, overrides, _, _ = logs.system_of(log)
        cost = logs._cost_model(preset, tuple(sorted(overrides.items())), nodes, gpn)
        nvlink_s = cost.network.comm.hop_latency_s[cost.layout.scale_up_tier]["LL128"]
        for row in rows:
            if row.plan != "ring/LL128" or row.size_bytes > max_bytes:
                continue
            ring = logs.ring_latency(log, row, "LL128")
            out.append((log.collective, row.size_bytes, ring.steps, ring.inter_steps,
                        ring.measured_s - ring.stream_s, nvlink_s))
    return out


def test_the_mid_size_excess_is_per_ring_step_not_per_network_hop():
    """What NCCL's network proxy does on an inter-node ring step (NCCL 2.29
    src/transport/net.cc, src/device/prims_ll128.h), and which reading of the mid-size
    excess the logs allow.

    The code: a ring connection across nodes keeps its send buffer for LL in host
    memory and for LL128 / Simple in GPU memory when GDR is on (sendProxyConnect:
    ``p != NCCL_PROTO_LL && useGdr``); receive buffers are in GPU memory. Per step the
    send proxy (sendProxyProgress) isends LL once it has read both flags of every
    16-byte line of the step in host memory, LL128 once the GPU's tail has moved (with
    GDR it reads no flag), after the kernel's end-of-step barrier and, from sm_90,
    ``__threadfence_system`` (prims_ll128.h postSend). The receive side flushes only
    Simple (``p == NCCL_PROTO_SIMPLE && needFlush``) and, for LL / LL128 on one
    sub-operation, skips the receive completion (NCCL_NET_OPTIONAL_RECV_COMPLETION);
    it keeps at most min(NCCL_STEPS = 8, NCCL_SHARED_STEPS = 16 / subs) receives posted
    per connection. Every GenericOp (one ring step) ends with a barrier of the
    channel's threads, so a rank's step k+1 waits for its step k: a one-pass ring is
    paced by its slowest rank's per-step service as much as it is a chain of hops.
    None of this gives a cited constant of tens of microseconds per network hop.

    The logs: a ring with ONE GPU per node (H100 10x1, every step a network step, 9
    of them) leaves under 6 us per step beyond streaming at 31 MiB on LL128, base
    latency included; the lead's chain reading of the 8-GPU-per-node rings (NVLink
    hops at NCCL's 1.9 us, the rest on the network hops) needs 30-56 us per network
    hop for the 10x8 ring of the same cluster, which the 10x1 ring would show as
    +270 us or more. Read per ring step instead, the excess is 5-9 us on every step at 10x8
    and 6-8.5 us on the 64x8 B200 ring: the same per step on two systems, 80 and 512
    ranks. So the miss is a per-step cost of rings that cross nodes with several GPUs
    per node, not a slow network hop; its constant is not in NCCL's source (NCCL's
    own model floors such steps at netOverhead = 1 us, tuning.cc)."""
    one_gpu = _ring_excess_per_step_s("xxrjun_h100_clusters", 10, 1, 32 * logs.MiB)
    assert len(one_gpu) == 2
    for kind, size, steps, inter, excess_s, _ in one_gpu:
        assert steps == inter == 9
        assert excess_s / inter < 6e-6, (kind, size, excess_s)
    eight = _ring_excess_per_step_s("xxrjun_h100_clusters", 10, 8, 128 * logs.MiB)
    assert len(eight) == 6
    for kind, size, steps, inter, excess_s, nvlink_s in eight:
        per_network_hop = (excess_s - (steps - inter) * nvlink_s) / inter
        # the chain reading, applied to the all-network ring, would add 9 such hops:
        # >= 270 us against the < 54 us that ring leaves to latency
        assert 30e-6 < per_network_hop < 60e-6, (kind, size, per_network_hop)
        assert 5e-6 < excess_s / steps < 9e-6, (kind, size, excess_s / steps)


# ------------------------------------------------- ring step pacing: calibrated, validated
def test_ring_step_pacing_is_fitted_on_the_calibration_logs():
    """comm.ring_step_pacing_us.LL128 is what its calibration logs give (the median time
    per ring step beyond streaming and the base latency of the H100 10x8 all_gather and
    reduce_scatter ring/LL128 rows, ``python tests/nccl_logs.py --fit-ring-pacing``),
    every preset carries it, and LL / Simple, with no calibration log, stay off."""
    fitted, rows = logs.ring_step_pacing_fit("LL128")
    assert rows == 8
    assert 5.0 <= fitted <= 9.0  # the 5-9 us per step the rows show one by one
    from hardware.catalog import list_presets, load_cluster
    for preset in list_presets():
        pacing = load_cluster(preset).comm.ring_step_pacing_s
        assert pacing["LL128"] * 1e6 == pytest.approx(fitted, abs=1e-9), preset
        assert pacing["LL"] == pacing["Simple"] == 0.0, preset
    with pytest.raises(ValueError, match="protocol"):
        logs.ring_step_pacing_fit("LL")


def test_calibration_logs_are_in_no_category():
    """Calibration and validation kept apart: the logs the pacing is fitted on are
    reported on their own and in no category, and they are the H100 10x8 rings only."""
    assert {key[:2] for key in logs.CALIBRATION_LOGS} == {
        ("xxrjun_h100_clusters", "all_gather"), ("xxrjun_h100_clusters", "reduce_scatter")}
    assert logs.calibration_rows()
    for category in ("sendrecv", "tree", "mid"):
        assert not [r for r in logs.category_rows(category) if logs.is_calibration(r.log)]
    # the same source's other logs still validate (sendrecv, alltoall, 10x1 rings, ...)
    assert [r for r in logs.category_rows("mid") if r.log.source == "xxrjun_h100_clusters"]


def test_paced_512_rank_ll128_rings_are_validated():
    """The validation of the pacing fitted on 80 H100 ranks: the 64 x 8 B200 sweep
    (another system, NCCL 2.29.7, 512 ranks), every ring/LL128 row at 16-256 MiB (30 rows,
    2.5-3.3x too fast with NCCL's step model alone) within -25 % .. +10 %, median |error|
    under 15 %: too slow at 16-32 MiB (6.2 us per step measured against 7.7), within
    -15 .. +9 % at 64-256 MiB (8.2-8.4 us measured in one run, 6.9-7.0 in the other)."""
    rows = [r for log, found in logs.compared() if found
            and log.source == "together_b200_64node_sweep"
            for r in found if r.plan == "ring/LL128" and r.size_bytes <= 256 * logs.MiB]
    assert len(rows) == 30
    for r in rows:
        assert -0.25 <= r.error <= 0.10, (r.log.label, r.size_bytes >> 20, r.error)
    assert logs.median_abs(r.error for r in rows) <= 0.15
