"""Plotly figures for what-if studies and reports. Every helper returns a
``plotly.graph_objects.Figure`` whose title names what was simulated (model, plan,
cluster, fidelity), whose axes say their unit, and whose ranges are set from the data
(so a figure exported without plotly's autorange still shows all of it):

* :func:`step_breakdown_figure`: where a step's time goes, per pipeline rank, with the
  step's 80 % prediction band (sim.step_bands) as an error bar;
* :func:`memory_figure`: the memory stack of every pipeline rank against the HBM;
* :func:`pipeline_gantt_figure`: the compute spans of every simulated rank over time;
* :func:`scaling_figure`: MFU and throughput against the GPU count, with error bars of
  the 80 % band when the frame has ``step_time_p10_s`` and ``step_time_p90_s``;
* :func:`goodput_vs_interval_figure`: goodput of a long run against the checkpoint interval;
* :func:`busbw_figure`: nccl-tests busbw against message size, measured points overlaid.

Units: seconds, GiB = 2^30 bytes for memory, GB/s = 1e9 bytes/s for bandwidth, message
sizes in binary units (KiB = 2^10 B, as nccl-tests sweeps powers of two).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

__all__ = ["BREAKDOWN_LABELS", "busbw_figure", "goodput_vs_interval_figure", "memory_figure",
           "pipeline_gantt_figure", "scaling_figure", "size_label", "step_breakdown_figure",
           "step_context"]

#: Legend labels of the step-time categories (keys of ``StepResult.breakdown``).
BREAKDOWN_LABELS = {"compute": "compute", "optimizer": "optimizer",
                    "exposed_tp": "exposed TP comm", "exposed_cp": "exposed CP comm",
                    "exposed_ep": "exposed EP comm", "exposed_pp": "exposed PP comm",
                    "exposed_dp": "exposed DP comm", "bubble": "pipeline bubble"}
#: Legend labels of the memory categories (``MemoryBreakdown.to_dict()`` keys).
MEMORY_LABELS = {"weights_bytes": "weights", "gradients_bytes": "gradients",
                 "optimizer_bytes": "optimizer state", "activations_bytes": "activations",
                 "comm_buffers_bytes": "comm buffers", "workspace_bytes": "workspace",
                 "transient_bytes": "transient"}
_GIB = 2**30
_TEMPLATE = "plotly_white"


def _go():
    import plotly.graph_objects as go

    return go


def _inputs(result) -> Mapping[str, Any]:
    return result["inputs"] if isinstance(result, Mapping) else result.inputs


def step_context(result) -> str:
    """One line naming what a step result simulated: model, GPUs, cluster, plan,
    batch, sequence length and fidelity (for titles)."""
    inputs = _inputs(result)
    cluster = inputs.get("cluster")
    cluster = cluster.get("name") if isinstance(cluster, Mapping) else cluster
    plan = inputs.get("plan") or {}
    parts = [f"{inputs.get('model')} on {int(inputs.get('gpus', 0)):,} GPUs of {cluster}"]
    if plan:
        sizes = " ".join(f"{axis} {plan[axis]}" for axis in ("tp", "pp", "dp", "cp", "ep")
                         if axis in ("tp", "pp", "dp") or plan.get(axis, 1) > 1)
        if plan.get("vpp", 1) > 1:
            sizes += f" vpp {plan['vpp']}"
        micro = plan["global_batch"] // (plan["dp"] * plan["micro_batch"])
        parts += [sizes, f"{plan['schedule']}, {micro} micro-batches",
                  f"seq_len {plan['seq_len']:,}"]
    parts.append(f"{inputs.get('fidelity')} fidelity")
    return " · ".join(parts)


def _title(main: str, context: str | None) -> dict:
    """A title with the context as a smaller second line (plotly titles do not wrap)."""
    text = main if not context else f"{main}<br><sup>{context}</sup>"
    return dict(text=text, x=0.01, xanchor="left")


def _padded(low: float, high: float, fraction: float = 0.04) -> list[float]:
    """A linear axis range around [low, high] with a margin (an empty span gets 1)."""
    span = (high - low) or abs(high) or 1.0
    return [low - fraction * span, high + fraction * span]


def step_breakdown_figure(result, *, title: str | None = None):
    """Stacked bars: seconds per category (compute, optimizer, exposed communication
    per parallel axis, pipeline bubble) for every pipeline rank of a
    :class:`sim.step.StepResult` (or its ``to_dict()``); the bars add up to the step
    time. Categories that are zero on every rank are left out."""
    go = _go()
    stages = result["stage_breakdown"] if isinstance(result, Mapping) else {
        f"pp{p}": b for p, b in result.stage_breakdown.items()}
    frame = pd.DataFrame(stages).T
    fig = go.Figure()
    for category in frame.columns:
        if frame[category].abs().sum() > 0:
            fig.add_trace(go.Bar(name=BREAKDOWN_LABELS.get(category, category),
                                 x=list(frame.index), y=frame[category],
                                 hovertemplate="%{x}: %{y:.4f} s"))
    top = float(frame.clip(lower=0).sum(axis=1).max()) if len(frame) else 1.0
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
        top = max(top, data["step_time_p90_s"])
    fig.update_layout(barmode="stack", template=_TEMPLATE,
                      title=_title(title or "Where the step goes", step_context(result)),
                      xaxis_title="pipeline rank", yaxis_title="time per step (s)",
                      yaxis_range=[0, 1.05 * top], legend_traceorder="reversed")
    return fig


def memory_figure(result, *, title: str | None = None):
    """Stacked bars: memory per GPU of every pipeline rank by kind (weights, gradients,
    optimizer state, activations, buffers, workspace, transient) in GiB (2^30 bytes),
    with the GPU's HBM capacity as a dashed line."""
    go = _go()
    memory = result["memory"] if isinstance(result, Mapping) else {
        f"pp{p}": m.to_dict() for p, m in result.memory.items()}
    frame = pd.DataFrame(memory).T
    fig = go.Figure()
    for column, label in MEMORY_LABELS.items():
        if column in frame and frame[column].sum() > 0:
            fig.add_trace(go.Bar(name=label, x=list(frame.index), y=frame[column] / _GIB,
                                 hovertemplate="%{x}: %{y:.2f} GiB"))
    cluster = _inputs(result).get("cluster")
    hbm_bytes = cluster.get("gpu", {}).get("hbm_bytes") if isinstance(cluster, Mapping) \
        else None
    top = float(frame["total_bytes"].max()) / _GIB if "total_bytes" in frame else 1.0
    if hbm_bytes:
        fig.add_hline(y=hbm_bytes / _GIB, line_dash="dash", line_color="black")
        fig.add_annotation(x=1, xref="paper", y=hbm_bytes / _GIB, yanchor="bottom",
                           xanchor="right", showarrow=False,
                           text=f"HBM {hbm_bytes / _GIB:.1f} GiB")
        top = max(top, hbm_bytes / _GIB)
    fig.update_layout(barmode="stack", template=_TEMPLATE,
                      title=_title(title or "Memory per GPU", step_context(result)),
                      xaxis_title="pipeline rank",
                      yaxis_title="memory per GPU (GiB = 2^30 B)",
                      yaxis_range=[0, 1.08 * top], legend_traceorder="reversed")
    return fig


def _time_unit(span_s: float) -> tuple[str, float]:
    """The unit that keeps a time axis' numbers below 1,000 (no "2k" ticks)."""
    if span_s >= 1.0:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def pipeline_gantt_figure(result, *, stream: str | None = "compute", title: str | None = None):
    """Gantt chart per rank: one bar per span (forward, backward, ...) from the step's
    timeline; needs a replayed step (``event`` or ``flow`` fidelity). The time axis is
    in seconds from the step's start, or ms / µs for steps shorter than a second /
    millisecond, so tick labels stay plain numbers.

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
    end_s = max(float(result.step_time_s), float(bars["end_ns"].max()) / 1e9)
    unit, scale = _time_unit(end_s)
    stands_for = _stands_for(result)
    fig = go.Figure()
    names = {"F": "forward", "B": "backward", "I": "backward (input)",
             "W": "backward (weights)"}
    for phase, part in bars.groupby("phase"):
        fig.add_trace(go.Bar(name=names[phase], y=[_rank_label(r, stands_for)
                                                    for r in part["rank"]],
                             x=(part["end_ns"] - part["start_ns"]) / 1e9 * scale,
                             base=part["start_ns"] / 1e9 * scale, orientation="h",
                             hovertext=part["tag"]))
    fig.update_layout(barmode="overlay", template=_TEMPLATE,
                      title=_title(title or f"Pipeline timeline ({stream or 'every'} stream)",
                                   step_context(result)),
                      xaxis_title=f"time since the step's start ({unit})", yaxis_title="",
                      xaxis_range=[0, 1.01 * end_s * scale], xaxis_tickformat=",~g")
    fig.update_yaxes(autorange="reversed")
    return fig


def _stands_for(result) -> Mapping[int, int]:
    """``{simulated rank: ranks it stands for}`` of a symmetry-reduced replay."""
    lowering = getattr(result, "lowering", None)
    represents = getattr(getattr(lowering, "program", None), "represents", None)
    return dict(represents or {})


def _rank_label(rank: int, stands_for: Mapping[int, int]) -> str:
    count = stands_for.get(rank, 1)
    return f"rank {rank}" + (f" (×{count})" if count > 1 else "")


def scaling_figure(frame: pd.DataFrame, *, x: str = "gpus", mfu: str = "mfu",
                   throughput: str = "tokens_per_s", group: str | None = None,
                   title: str | None = None):
    """MFU (left axis, %) and throughput (right axis) against the GPU count (log axis,
    ticks at the counts simulated), one line per ``group`` value if given; with
    ``step_time_s``, ``step_time_p10_s`` and ``step_time_p90_s`` columns (a sweep's), error
    bars show the 80 % band (both scale with 1 / step time)."""
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
                                 line=dict(dash="dot"),
                                 name=f"{_throughput_title(throughput)}{label}",
                                 error_y=_band_bars(part, part[throughput])),
                      secondary_y=True)
    counts = sorted(set(frame[x]))
    fig.update_xaxes(title_text="GPUs" if x == "gpus" else x, type="log", tickvals=counts,
                     ticktext=[f"{int(c):,}" for c in counts],
                     range=[math.log10(counts[0]) - 0.1, math.log10(counts[-1]) + 0.1])
    fig.update_yaxes(title_text="MFU (%)", secondary_y=False, rangemode="tozero")
    # Ticks of its own (not synced to the MFU grid, which gave "0.8M, 1.59M, ...").
    fig.update_yaxes(title_text=f"throughput ({_throughput_title(throughput)})", secondary_y=True,
                     rangemode="tozero", tickmode="auto", showgrid=False)
    fig.update_layout(title=_title(title or "MFU and throughput vs GPU count", None),
                      template=_TEMPLATE)
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


def _throughput_title(column: str) -> str:
    return {"tokens_per_s": "tokens/s"}.get(column, column)


def size_label(size_bytes: float) -> str:
    """A size in binary units: ``"512 B"``, ``"4 KiB"``, ``"16 GiB"`` (KiB = 2^10 B)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes:g} B"


def _size_axis(sizes: pd.Series) -> dict:
    """A log axis over message sizes with ticks at powers of two, labelled in binary
    units (plotly's own SI ticks would print "1B" for a gigabyte)."""
    low = max(1, int(math.floor(math.log2(max(float(sizes.min()), 1.0)))))
    high = int(math.ceil(math.log2(max(float(sizes.max()), 2.0))))
    step = max(1, math.ceil((high - low) / 10))
    ticks = [2**e for e in range(low, high + 1, step)]
    return dict(type="log", tickvals=ticks, ticktext=[size_label(t) for t in ticks],
                range=[math.log10(2**low) - 0.05, math.log10(2**high) + 0.05],
                title="message size (KiB = 2^10 B, MiB = 2^20 B, GiB = 2^30 B)")


def _collective_context(frame: pd.DataFrame) -> str | None:
    inputs = frame.attrs.get("inputs") or {}
    if not inputs:
        return None
    return (f"{inputs.get('op')} over {inputs.get('ranks')} ranks ({inputs.get('nodes')} "
            f"node(s) × {inputs.get('gpus_per_node')} GPUs) of {inputs.get('cluster')}, "
            f"algorithm {inputs.get('algorithm')}, {inputs.get('fidelity')} fidelity")


def busbw_figure(simulated: pd.DataFrame | Mapping[str, pd.DataFrame], *,
                 measured: pd.DataFrame | None = None, title: str | None = None):
    """busbw (GB/s = 1e9 B/s) against message size (log axis, binary units): a line per
    simulated sweep (:func:`trainsim.api.collective` frames, several by name in a dict)
    and ``measured`` points (columns ``size_bytes``, ``busbw_GBps``, optional ``label``;
    points whose label names a simulated line are drawn on it, in its colour).
    """
    go = _go()
    from plotly.colors import qualitative

    sweeps = simulated if isinstance(simulated, Mapping) else {"simulated": simulated}
    colors = {str(name): qualitative.Plotly[i % len(qualitative.Plotly)]
              for i, name in enumerate(sweeps)}
    fig = go.Figure()
    for name, frame in sweeps.items():
        fig.add_trace(go.Scatter(x=frame["size_bytes"], y=frame["busbw_GBps"],
                                 mode="lines", name=str(name), legendgroup=str(name),
                                 line=dict(color=colors[str(name)])))
    frames = list(sweeps.values())
    if measured is not None:
        groups = measured.groupby("label") if "label" in measured else [("measured",
                                                                         measured)]
        for label, part in groups:
            # Points labelled like a simulated line belong to it: its colour, its legend
            # entry (a report marks the sizes a step uses on each collective's curve).
            line = str(label) if str(label) in colors else None
            fig.add_trace(go.Scatter(x=part["size_bytes"], y=part["busbw_GBps"],
                                     mode="markers", name=str(label), legendgroup=line,
                                     showlegend=line is None,
                                     marker=dict(symbol="x", size=9,
                                                 color=colors.get(str(label)))))
        frames.append(measured)
    every = pd.concat([f[["size_bytes", "busbw_GBps"]] for f in frames])
    context = _collective_context(frames[0]) if len(sweeps) == 1 else None
    fig.update_layout(title=_title(title or "busbw vs message size", context),
                      xaxis=_size_axis(every["size_bytes"]),
                      yaxis_title="busbw (GB/s, GB = 1e9 B)",
                      yaxis_range=[0, 1.08 * float(every["busbw_GBps"].max() or 1.0)],
                      template=_TEMPLATE)
    return fig


def _nice_log_ticks(low: float, high: float) -> list[float]:
    """Ticks 1, 2, 5, 10, 20, 50, ... times a power of ten covering [low, high] (plotly's
    own log ticks label 20 and 30 as "2" and "3" after a "10")."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        ticks += [m * 10.0**exponent for m in (1, 2, 5)]
    inside = [t for t in ticks if low / 1.15 <= t <= high * 1.15]
    return inside if len(inside) >= 2 else ticks


def _long_run_context(result) -> str | None:
    setup = getattr(result, "setup", None)
    if setup is None:
        return None
    return (f"{setup.model} on {setup.units.gpus:,} GPUs of {setup.cluster.name}, "
            f"profile {setup.profile.name}, {setup.days:g} days, {setup.costs.mode} "
            f"checkpoints")


def goodput_vs_interval_figure(scan, *, title: str | None = None):
    """Plotly figure: simulated goodput against the checkpoint interval (mean with its 95 %
    CI band), the first-order analytic curve, the exact curve when it applies, and vertical
    markers at Young-Daly and the simulated optimum. The interval axis is logarithmic and
    spans the scanned intervals and the markers, nothing more.

    Args:
        scan: the frame of :func:`sim.longrun.goodput_vs_interval`, or a
            :class:`sim.longrun.LongRunResult` of ``checkpoint_interval="auto"`` (whose
            model, job and profile then go into the title).

    Raises:
        ValueError: for a result without an interval scan.
    """
    go = _go()
    context = None
    if not isinstance(scan, pd.DataFrame):  # a LongRunResult
        if scan.scan is None:
            raise ValueError("scan: this result has no interval scan; use "
                             "checkpoint_interval='auto' or goodput_vs_interval()")
        context = _long_run_context(scan)
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
    xs = list(x_min)
    for key, label, color, dash, yanchor in (
            ("young_daly_s", "Young-Daly", "red", "dash", "top"),
            ("simulated_optimum_s", "simulated optimum", "green", "dot", "bottom")):
        if attrs.get(key):
            at_min = attrs[key] / 60.0
            xs.append(at_min)
            fig.add_vline(x=at_min, line_dash=dash, line_color=color)
            # An annotation's x on a log axis is log10 of the value (a shape's is the
            # value itself): add_vline's own annotation lands at 10^x minutes.
            fig.add_annotation(x=math.log10(at_min), y=1 if yanchor == "top" else 0,
                               yref="paper", yanchor=yanchor, xanchor="left", xshift=3,
                               showarrow=False, text=f"{label} {at_min:.1f} min",
                               font=dict(color=color))
    goodputs = pd.concat([df[c] for c in ("goodput_ci_lo", "goodput_ci_hi",
                                          "goodput_first_order", "goodput_exact")])
    main = title or (f"Goodput vs checkpoint interval (MTBF "
                     f"{attrs.get('mtbf_s', float('nan')) / 3600:.2f} h, save "
                     f"{attrs.get('checkpoint_blocking_s', float('nan')):.1f} s)")
    fig.update_layout(
        title=_title(main, context), template=_TEMPLATE,
        xaxis=dict(type="log", title="checkpoint interval (minutes of compute)",
                   range=[math.log10(min(xs)) - 0.05, math.log10(max(xs)) + 0.05],
                   tickvals=_nice_log_ticks(min(xs), max(xs)), tickformat=",~g"),
        yaxis=dict(title="goodput (useful time / wall time)", tickformat=".1%",
                   range=_padded(float(goodputs.min()), float(goodputs.max()))))
    return fig
