"""Figure helpers return plotly figures built from simulator results, with a title that
names what was simulated, axes that say their unit, and ranges that show all the data
(and not much more)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pandas as pd
import pytest

from trainsim import api, figures

#: An axis title states its unit in parentheses.
UNIT = re.compile(r"\((s|ms|µs|GiB = 2\^30 B|GB/s, GB = 1e9 B|%|.*minutes.*|KiB = 2\^10 B.*|"
                  r"useful time / wall time|tokens/s)\)")


@pytest.fixture(scope="module")
def step():
    return api.simulate("llama3-8b", gpus=16, tp=2, pp=4, global_batch=16, seq_len=2048,
                        fidelity="event")


def _bar_ends(fig) -> list[float]:
    """Both ends of every horizontal bar (base and base + length)."""
    return [float(v) for t in fig.data for b, x in zip(t.base, t.x) for v in (b, b + x)]


def _check_axis(fig, axis: str, values: list[float], *, log: bool = False,
                fill: float = 0.6) -> None:
    """The layout gives the axis an explicit range that holds every value, of which
    the values span at least ``fill`` (log10 units on a log axis)."""
    low, high = getattr(fig.layout, f"{axis}axis").range
    points = [math.log10(v) for v in values if v > 0] if log else values
    assert low <= min(points) and max(points) <= high, (axis, low, high, min(points),
                                                        max(points))
    assert (max(points) - min(points)) >= fill * (high - low), (axis, low, high)


def _check_titles(fig, *words: str) -> None:
    title = fig.layout.title.text
    for word in words:
        assert word in title, (word, title)
    assert UNIT.search(fig.layout.xaxis.title.text or "") or \
        fig.layout.xaxis.title.text == "pipeline rank", fig.layout.xaxis.title.text
    assert UNIT.search(fig.layout.yaxis.title.text or "") or \
        not fig.layout.yaxis.title.text, fig.layout.yaxis.title.text


def test_breakdown_bars_add_up_to_the_step_and_name_the_job(step):
    fig = figures.step_breakdown_figure(step)
    assert {t.name for t in fig.data} >= {"compute", "pipeline bubble"}
    assert all(len(t.x) == 4 for t in fig.data)
    _check_titles(fig, "llama3-8b", "16 GPUs", "dgx-h100", "tp 2 pp 4 dp 2", "1f1b",
                  "8 micro-batches", "event fidelity")
    bars = [t for t in fig.data if t.type == "bar"]
    tops = [sum(float(t.y[i]) for t in bars) for i in range(4)]
    assert max(tops) == pytest.approx(step.step_time_s, rel=1e-6)
    band = next(t for t in fig.data if t.type == "scatter")  # the step's 80 % band
    p90 = step.step_time_s + band.error_y.array[0]
    assert p90 >= step.step_time_s
    assert fig.layout.yaxis.range[0] == 0 and p90 <= fig.layout.yaxis.range[1] <= 1.1 * p90


def test_memory_stack_in_gib_against_the_hbm(step):
    fig = figures.memory_figure(step)
    _check_titles(fig, "llama3-8b", "dgx-h100")
    assert "GiB = 2^30 B" in fig.layout.yaxis.title.text
    totals = [sum(float(t.y[i]) for t in fig.data) for i in range(4)]
    expected = step.memory_frame()["total_bytes"] / 2**30
    assert totals == pytest.approx(list(expected), rel=1e-9)
    hbm = step.inputs["cluster"]["gpu"]["hbm_bytes"] / 2**30
    assert [s.y0 for s in fig.layout.shapes] == [pytest.approx(hbm)]
    assert fig.layout.yaxis.range[1] >= hbm


def test_gantt_has_forward_and_backward_per_rank(step):
    fig = figures.pipeline_gantt_figure(step)
    names = {t.name for t in fig.data}
    assert {"forward", "backward"} <= names
    assert {y for t in fig.data for y in t.y} == {f"rank {r} (×4)" for r in
                                                  set(step.timeline_frame()["rank"])}
    # a step of a third of a second is drawn in ms, ending at the step time
    assert fig.layout.xaxis.title.text == "time since the step's start (ms)"
    ends = max(float(b + x) for t in fig.data for b, x in zip(t.base, t.x))
    assert ends <= step.step_time_s * 1e3 + 1e-6
    _check_axis(fig, "x", _bar_ends(fig), fill=0.95)
    _check_titles(fig, "llama3-8b", "dgx-h100")


def test_gantt_of_a_long_step_is_in_seconds_without_k_ticks(step):
    """A 9.5 s step: seconds (ticks 0-10), never "2k ... 10k" milliseconds."""
    frame = step.timeline_frame().copy()
    scale = 9.5 / step.step_time_s
    frame[["start_ns", "end_ns"]] = (frame[["start_ns", "end_ns"]] * scale).round()
    long = SimpleNamespace(timeline_frame=lambda: frame, step_time_s=9.5,
                           inputs=step.inputs, lowering=step.lowering)
    fig = figures.pipeline_gantt_figure(long)
    assert fig.layout.xaxis.title.text == "time since the step's start (s)"
    assert fig.layout.xaxis.range[1] == pytest.approx(9.5 * 1.01)
    assert fig.layout.xaxis.tickformat == ",~g"  # plain numbers, no SI suffix


def test_gantt_needs_a_timeline():
    analytic = api.simulate("llama3-8b", gpus=8, tp=2, pp=2, global_batch=8,
                            fidelity="analytic")
    with pytest.raises(ValueError, match="timeline"):
        figures.pipeline_gantt_figure(analytic)


def test_busbw_ticks_are_binary_sizes_not_si_billions():
    sim = api.collective("all_reduce", nodes=2, min_bytes="8", max_bytes="8GiB")
    measured = pd.DataFrame({"size_bytes": [2**20, 2**26], "busbw_GBps": [100.0, 400.0]})
    fig = figures.busbw_figure(sim, measured=measured)
    assert [t.mode for t in fig.data] == ["lines", "markers"]
    texts = list(fig.layout.xaxis.ticktext)
    assert texts[0] == "8 B" and texts[-1] == "8 GiB" and "1 GiB" in texts
    assert all(re.fullmatch(r"\d+ (B|KiB|MiB|GiB)", t) for t in texts), texts
    assert list(fig.layout.xaxis.tickvals) == [2**e for e in range(3, 34, 3)]
    _check_titles(fig, "all_reduce over 16 ranks", "dgx-h100")
    _check_axis(fig, "x", list(sim["size_bytes"]), log=True, fill=0.95)
    _check_axis(fig, "y", list(sim["busbw_GBps"]), fill=0.9)


@pytest.mark.parametrize("size,text", [(512, "512 B"), (2**10, "1 KiB"), (3 * 2**19, "1.5 MiB"),
                                       (2**34, "16 GiB")])
def test_size_label(size, text):
    assert figures.size_label(size) == text


def test_scaling_figure_ticks_at_the_gpu_counts():
    frame = pd.DataFrame({"gpus": [8, 64, 512], "mfu": [0.5, 0.45, 0.4],
                          "tokens_per_s": [1e5, 7e5, 5e6]})
    fig = figures.scaling_figure(frame)
    assert len(fig.data) == 2
    assert list(fig.layout.xaxis.tickvals) == [8, 64, 512]
    assert fig.layout.xaxis.title.text == "GPUs"
    assert fig.layout.yaxis.title.text == "MFU (%)"
    assert fig.layout.yaxis2.title.text == "throughput (tokens/s)"
    _check_axis(fig, "x", [8, 64, 512], log=True, fill=0.8)


def _scan(intervals_s, young_daly_s, optimum_s):
    scan = pd.DataFrame({"interval_s": intervals_s,
                         "goodput_mean": [0.9, 0.92, 0.91],
                         "goodput_ci_lo": [0.89, 0.91, 0.90],
                         "goodput_ci_hi": [0.91, 0.93, 0.92],
                         "goodput_first_order": [0.9, 0.915, 0.905],
                         "goodput_exact": [float("nan")] * 3})
    scan.attrs.update(young_daly_s=young_daly_s, simulated_optimum_s=optimum_s,
                      mtbf_s=7200.0, checkpoint_blocking_s=30.0)
    return scan


def test_goodput_axis_spans_the_scan_not_twenty_decades():
    """The markers' labels sit at log10 of their interval: placed at the interval
    itself, they stretched the axis to 10^15 minutes and squeezed the curve into a
    fifth of it."""
    fig = figures.goodput_vs_interval_figure(_scan([600.0, 1200.0, 2400.0], 900.0, 1300.0))
    assert [t.name for t in fig.data] == ["simulated 95% CI", "simulated (mean)",
                                          "first-order model"]
    assert list(fig.data[1].x) == [10.0, 20.0, 40.0]  # minutes
    _check_axis(fig, "x", [10.0, 20.0, 40.0], log=True, fill=0.8)
    low, high = fig.layout.xaxis.range
    for note in fig.layout.annotations:
        assert low <= note.x <= high, note.text
    assert [a.text for a in fig.layout.annotations] == ["Young-Daly 15.0 min",
                                                        "simulated optimum 21.7 min"]
    assert [s.x0 for s in fig.layout.shapes] == [15.0, pytest.approx(1300 / 60)]
    assert list(fig.layout.xaxis.tickvals) == [10.0, 20.0]
    _check_axis(fig, "y", [0.89, 0.93], fill=0.9)
    assert fig.layout.yaxis.tickformat == ".1%"
    _check_titles(fig, "Goodput", "MTBF 2.00 h")
