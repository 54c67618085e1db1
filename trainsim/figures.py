"""Plotly figures for what-if studies. Every helper returns a ``plotly.graph_objects.Figure``.

* :func:`step_breakdown_figure`: where a step's time goes, per pipeline rank, with the
  step's 80 % prediction band (sim.step_bands) as an error bar;
* :func:`pipeline_gantt_figure`: the compute spans of every simulated rank over time;
* :func:`scaling_figure`: MFU and throughput against the GPU count, with error bars of
  the 80 % band when the frame has ``step_time_p10_s`` and ``step_time_p90_s``;
* :func:`goodput_vs_interval_figure`: goodput of a long run against the checkpoint interval;
* :func:`busbw_figure`: nccl-tests busbw against message size, measured points overlaid.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

__all__ = ["busbw_figure", "goodput_vs_interval_figure", "pipeline_gantt_figure",
           "scaling_figure", "step_breakdown_figure"]


def _go():
    import plotly.graph_objects as go

    return go


def step_breakdown_figure(result, *, title: str | None = None):
    """Stacked bars: seconds per category (compute, optimizer, exposed comm per axis,
    bubble) for every pipeline rank of a :class:`sim.step.StepResult` (or its
    ``to_dict()``)."""
    go = _go()
    stages = result["stage_breakdown"] if isinstance(result, Mapping) else {
        f"pp{p}": b for p, b in result.stage_breakdown.items()}
    frame = pd.DataFrame(stages).T
    fig = go.Figure()
    for category in frame.columns:
        if frame[category].abs().sum() > 0:
            fig.add_trace(go.Bar(name=category, x=list(frame.index), y=frame[category]))
    data = result if isinstance(result, Mapping) else result.to_dict()
    if "step_time_p10_s" in data:
        step = data["step_time_s"]
        fig.add_trace(go.Scatter(
            name="step time, 80 % band (p10-p90)", x=list(frame.index),
            y=[step] * len(frame), mode="markers", marker=dict(color="black", symbol="line-ew",
                                                              size=14, line_width=2),
            error_y=dict(type="data", symmetric=False,
                         array=[data["step_time_p90_s"] - step] * len(frame),
                         arrayminus=[step - data["step_time_p10_s"]] * len(frame))))
    fig.update_layout(barmode="stack", title=title or "Where the step goes",
                      xaxis_title="pipeline rank", yaxis_title="seconds",
                      template="plotly_white")
    return fig


def pipeline_gantt_figure(result, *, stream: str | None = "compute", title: str | None = None):
    """Gantt chart per rank: one bar per span (forward, backward, ...) from the step's
    timeline; needs a replayed step (``event`` or ``flow`` fidelity).

    Raises:
        ValueError: when the result has no timeline (``analytic`` fidelity).
    """
    go = _go()
    frame = result.timeline_frame()
    if frame.empty:
        raise ValueError("result: the step has no timeline (analytic fidelity replays "
                         "nothing); simulate with fidelity='event'")
    if stream is not None:
        frame = frame[frame["stream"] == stream]
    # One bar per run of consecutive kernels of one action kind and stage (".F0",
    # ".B1", ".W2" in op names), not one per kernel. Op names carry no micro-batch
    # (kernels are shared between micro-batches), so back-to-back forwards of the
    # warm-up merge into one bar.
    frame = frame.assign(tag=frame["op"].astype(str).str.extract(r"\.([FBIW]\d+)",
                                                                  expand=False))
    frame = frame.dropna(subset=["tag"]).sort_values(["rank", "start_ns"])
    new_bar = (frame["tag"] != frame["tag"].shift()) | (frame["rank"] != frame["rank"].shift())
    frame = frame.assign(bar=new_bar.cumsum(), phase=frame["tag"].str[0])
    bars = frame.groupby("bar").agg(rank=("rank", "first"), phase=("phase", "first"),
                                    tag=("tag", "first"), start_ns=("start_ns", "min"),
                                    end_ns=("end_ns", "max"))
    fig = go.Figure()
    names = {"F": "forward", "B": "backward", "I": "backward (input)",
             "W": "backward (weights)"}
    for phase, part in bars.groupby("phase"):
        fig.add_trace(go.Bar(name=names[phase], y=[f"rank {r}" for r in part["rank"]],
                             x=(part["end_ns"] - part["start_ns"]) / 1e6,
                             base=part["start_ns"] / 1e6, orientation="h",
                             hovertext=part["tag"]))
    fig.update_layout(barmode="overlay", title=title or "Pipeline timeline (compute stream)",
                      xaxis_title="time (ms)", yaxis_title="", template="plotly_white")
    fig.update_yaxes(autorange="reversed")
    return fig


def scaling_figure(frame: pd.DataFrame, *, x: str = "gpus", mfu: str = "mfu",
                   throughput: str = "tokens_per_s", group: str | None = None,
                   title: str | None = None):
    """MFU (left axis, %) and throughput (right axis) against the GPU count, one line
    per ``group`` value if given; with ``step_time_s``, ``step_time_p10_s`` and
    ``step_time_p90_s`` columns (a sweep's), error bars show the 80 % band (both
    scale with 1 / step time)."""
    go = _go()
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    groups = frame.groupby(group) if group else [(None, frame)]
    for key, part in groups:
        part = part.sort_values(x)
        label = "" if key is None else f" {key}"
        fig.add_trace(go.Scatter(x=part[x], y=100 * part[mfu], mode="lines+markers",
                                 name=f"MFU{label}", error_y=_band_bars(part, 100 * part[mfu])),
                      secondary_y=False)
        fig.add_trace(go.Scatter(x=part[x], y=part[throughput], mode="lines+markers",
                                 line=dict(dash="dot"), name=f"{throughput}{label}",
                                 error_y=_band_bars(part, part[throughput])),
                      secondary_y=True)
    fig.update_xaxes(title_text=x, type="log")
    fig.update_yaxes(title_text="MFU (%)", secondary_y=False)
    fig.update_yaxes(title_text=throughput, secondary_y=True)
    fig.update_layout(title=title or "MFU and throughput vs GPU count",
                      template="plotly_white")
    return fig


def _band_bars(part: pd.DataFrame, rate: pd.Series) -> dict | None:
    """Error bars of a rate (inverse to the step time) over the step's 80 % band; None
    without the band columns."""
    if not {"step_time_s", "step_time_p10_s", "step_time_p90_s"} <= set(part.columns):
        return None
    high = rate * part["step_time_s"] / part["step_time_p10_s"]
    low = rate * part["step_time_s"] / part["step_time_p90_s"]
    return dict(type="data", symmetric=False, array=list(high - rate),
                arrayminus=list(rate - low))


def busbw_figure(simulated: pd.DataFrame | Mapping[str, pd.DataFrame], *,
                 measured: pd.DataFrame | None = None, title: str | None = None):
    """busbw (GB/s = 1e9 B/s) against message size (bytes, log axis): a line per
    simulated sweep (:func:`trainsim.api.collective` frames, several by name in a dict) and
    ``measured`` points (columns ``size_bytes``, ``busbw_GBps``, optional ``label``)."""
    go = _go()
    sweeps = simulated if isinstance(simulated, Mapping) else {"simulated": simulated}
    fig = go.Figure()
    for name, frame in sweeps.items():
        fig.add_trace(go.Scatter(x=frame["size_bytes"], y=frame["busbw_GBps"],
                                 mode="lines", name=str(name)))
    if measured is not None:
        groups = measured.groupby("label") if "label" in measured else [("measured",
                                                                         measured)]
        for label, part in groups:
            fig.add_trace(go.Scatter(x=part["size_bytes"], y=part["busbw_GBps"],
                                     mode="markers", name=str(label),
                                     marker=dict(symbol="x", size=8)))
    fig.update_layout(title=title or "busbw vs message size", xaxis_type="log",
                      xaxis_title="message size (bytes)", yaxis_title="busbw (GB/s, 1e9 B/s)",
                      template="plotly_white")
    return fig


def goodput_vs_interval_figure(scan, *, title: str | None = None):
    """Plotly figure: simulated goodput against the checkpoint interval (mean with its 95 %
    CI band), the first-order analytic curve, the exact curve when it applies, and vertical
    markers at Young-Daly and the simulated optimum.

    Args:
        scan: the frame of :func:`sim.longrun.goodput_vs_interval`, or a
            :class:`sim.longrun.LongRunResult` of ``checkpoint_interval="auto"``.

    Raises:
        ValueError: for a result without an interval scan.
    """
    go = _go()
    if not isinstance(scan, pd.DataFrame):  # a LongRunResult
        if scan.scan is None:
            raise ValueError("scan: this result has no interval scan; use "
                             "checkpoint_interval='auto' or goodput_vs_interval()")
        scan = scan.scan
    df = scan.sort_values("interval_s")
    x_min = df["interval_s"] / 60.0
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=list(x_min) + list(x_min[::-1]),
        y=list(df["goodput_ci_hi"]) + list(df["goodput_ci_lo"][::-1]),
        fill="toself", fillcolor="rgba(31,119,180,0.2)", line=dict(width=0),
        hoverinfo="skip", name="simulated 95% CI"))
    fig.add_trace(go.Scatter(x=x_min, y=df["goodput_mean"], mode="lines+markers",
                             name="simulated (mean)", line=dict(color="rgb(31,119,180)")))
    fig.add_trace(go.Scatter(x=x_min, y=df["goodput_first_order"], mode="lines",
                             name="first-order model", line=dict(dash="dash", color="gray")))
    if df["goodput_exact"].notna().any():
        fig.add_trace(go.Scatter(x=x_min, y=df["goodput_exact"], mode="lines",
                                 name="exact (exponential)", line=dict(dash="dot",
                                                                       color="black")))
    attrs = scan.attrs
    if attrs.get("young_daly_s"):
        fig.add_vline(x=attrs["young_daly_s"] / 60.0, line_dash="dash", line_color="red",
                      annotation_text="Young-Daly")
    if attrs.get("simulated_optimum_s"):
        fig.add_vline(x=attrs["simulated_optimum_s"] / 60.0, line_dash="dot",
                      line_color="green", annotation_text="simulated optimum",
                      annotation_position="bottom right")
    fig.update_layout(
        title=title or (f"Goodput vs checkpoint interval (MTBF "
                        f"{attrs.get('mtbf_s', float('nan')) / 3600:.2f} h, save "
                        f"{attrs.get('checkpoint_blocking_s', float('nan')):.1f} s)"),
        xaxis_title="checkpoint interval (minutes of compute)", xaxis_type="log",
        yaxis_title="goodput (useful / wall time)", template="plotly_white")
    return fig
