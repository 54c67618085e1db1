"""Figure helpers return plotly figures built from simulator results."""

from __future__ import annotations

import pandas as pd
import pytest

from trainsim import api, figures


@pytest.fixture(scope="module")
def step():
    return api.simulate("llama3-8b", gpus=16, tp=2, pp=4, global_batch=16, seq_len=2048,
                        fidelity="event")


def test_breakdown_has_a_bar_per_category_and_rank(step):
    fig = figures.step_breakdown_figure(step)
    assert {t.name for t in fig.data} >= {"compute", "bubble"}
    assert all(len(t.x) == 4 for t in fig.data)


def test_gantt_has_forward_and_backward_per_rank(step):
    fig = figures.pipeline_gantt_figure(step)
    names = {t.name for t in fig.data}
    assert {"forward", "backward"} <= names
    assert {y for t in fig.data for y in t.y} == {f"rank {r}" for r in
                                                  set(step.timeline_frame()["rank"])}
    ends = max(float(b + x) for t in fig.data for b, x in zip(t.base, t.x))
    assert ends <= step.step_time_s * 1e3 + 1e-6


def test_gantt_needs_a_timeline():
    analytic = api.simulate("llama3-8b", gpus=8, tp=2, pp=2, global_batch=8,
                            fidelity="analytic")
    with pytest.raises(ValueError, match="timeline"):
        figures.pipeline_gantt_figure(analytic)


def test_busbw_overlays_measured_points():
    sim = api.collective("all_reduce", nodes=1, min_bytes="1MiB", max_bytes="64MiB")
    measured = pd.DataFrame({"size_bytes": [2**20, 2**26], "busbw_GBps": [100.0, 400.0]})
    fig = figures.busbw_figure(sim, measured=measured)
    assert [t.mode for t in fig.data] == ["lines", "markers"]


def test_scaling_and_goodput_figures():
    frame = pd.DataFrame({"gpus": [8, 16], "mfu": [0.5, 0.45], "tokens_per_s": [1e5, 1.8e5]})
    assert len(figures.scaling_figure(frame).data) == 2
    scan = pd.DataFrame({"interval_s": [600.0, 1200.0], "goodput_mean": [0.9, 0.92],
                         "goodput_ci_lo": [0.89, 0.91], "goodput_ci_hi": [0.91, 0.93],
                         "goodput_first_order": [0.9, 0.91],
                         "goodput_exact": [float("nan")] * 2})
    scan.attrs.update(young_daly_s=900.0, mtbf_s=7200.0, checkpoint_blocking_s=30.0)
    fig = figures.goodput_vs_interval_figure(scan)
    assert [t.name for t in fig.data] == ["simulated 95% CI", "simulated (mean)",
                                          "first-order model"]
    assert list(fig.data[1].x) == [10.0, 20.0]  # minutes
