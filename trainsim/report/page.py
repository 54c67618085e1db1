"""One self-contained HTML page for a simulated step: what a planner pastes into a review.

The page holds the inputs (the resolved scenario, every plan field, the cluster's
headline numbers), the headline results, where the step goes (compute, exposed
communication per axis, bubble), the memory stack, the pipeline Gantt (replayed
fidelities) and the busbw of the collectives the step uses. plotly.js is inlined once,
so the page opens without a network; figure ids are fixed, so the same result gives the
same bytes.
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping, Sequence

from trainsim import figures

__all__ = ["step_report_html"]

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 1.8em;
     border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
p.context { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { padding: 0.2em 0.8em; border-bottom: 1px solid #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.headline td { font-size: 1.1em; } .note { color: #666; font-size: 0.9em; }
.columns { display: flex; gap: 2em; flex-wrap: wrap; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
footer { margin-top: 3em; color: #777; font-size: 0.85em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None,
           css: str = "") -> str:
    """An HTML table; numbers right-aligned (already formatted strings stay as given)."""
    out = [f'<table class="{css}">' if css else "<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            numeric = i > 0 and _looks_numeric(cell)
            cells.append(f'<td class="num">{_e(cell)}</td>' if numeric else
                         f"<td>{_e(cell)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _looks_numeric(cell: Any) -> bool:
    text = str(cell).replace(",", "").replace("%", "").replace("+", "").strip()
    try:
        float(text)
        return True
    except ValueError:
        return False


def _figure(fig, div_id: str, height_px: int = 430) -> str:
    fig.update_layout(height=height_px, margin=dict(t=80, l=70, r=30, b=60))
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _headline(result) -> list[tuple[str, str]]:
    rows = [("step time", f"{result.step_time_s:.4f} s"),
            ("tokens/s", f"{result.tokens_per_s:,.0f}"),
            ("model TFLOP/s per GPU (1e12 FLOP/s)", f"{result.tflops_per_gpu:.1f}"),
            ("MFU (of the dense bf16 peak)", f"{100 * result.mfu:.1f} %"),
            ("peak memory per GPU", f"{result.peak_memory_bytes / 2**30:.2f} GiB")]
    cost = result.perturbation_cost
    if cost is not None:
        rows += [("step time without perturbations", f"{cost['baseline_step_time_s']:.4f} s"),
                 (f"what they cost (critical rank {cost['critical_rank']})",
                  f"+{cost['slowdown_s']:.4f} s ({cost['slowdown']:+.1%})")]
    return rows


def _inputs_rows(result, scenario: Mapping[str, Any]) -> list[tuple[str, str]]:
    inputs = result.inputs
    cluster = inputs["cluster"]
    gpu = cluster["gpu"]
    rows = [("model", inputs["model"]),
            ("cluster", f"{cluster['name']}: {cluster.get('description', '')}"),
            ("GPUs", f"{inputs['gpus']:,} ({inputs['nodes']:,} nodes × "
                     f"{inputs['gpus_per_node']})"),
            ("GPU", f"{gpu['name']}, {gpu['hbm_bytes'] / 2**30:.1f} GiB HBM, "
                    f"{gpu['peak_flops_per_s'].get('bf16', 0) / 1e12:,.0f} TFLOP/s bf16 dense"),
            ("fidelity", inputs["fidelity"]),
            ("calibration", scenario.get("calibration") or "none")]
    for key, value in (scenario.get("set") or {}).items():
        rows.append((f"--set {key}", value))
    for key, values in (scenario.get("perturbations") or {}).items():
        rows.append((f"--{key.replace('_', '-')}", ", ".join(map(str, values))))
    return rows


def _plan_rows(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(key, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else
             str(value)) for key, value in plan.items() if value is not None]


def _breakdown_rows(result) -> list[tuple[str, ...]]:
    frame = result.breakdown_frame()
    rows = []
    for category in frame.columns:
        if frame[category].abs().sum() > 0:
            rows.append((figures.BREAKDOWN_LABELS.get(category, category),
                         *(f"{v:.4f}" for v in frame[category])))
    rows.append(("step", *(f"{v:.4f}" for v in frame.sum(axis=1))))
    return rows


def step_report_html(result, *, collectives: tuple | None, plotly_js: str,
                     collectives_note: str = "") -> str:
    """The page for ``result`` (a :class:`sim.step.StepResult` from the application
    layer, with its embedded scenario).

    Args:
        collectives: ``(used, curves, points)`` from :mod:`trainsim.report.collectives`,
            or None when they could not be listed (``collectives_note`` says why).
        plotly_js: the plotly.js bundle to inline.
    """
    data = result.to_dict()
    scenario = data.get("scenario", {})
    context = figures.step_context(result)
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>trainsim step report: {_e(context)}</title>",
        f"<style>{_STYLE}</style>",
        f'<script type="text/javascript">{plotly_js}</script>',
        "</head>", "<body>",
        "<h1>trainsim step report</h1>", f'<p class="context">{_e(context)}</p>',
        '<section id="summary"><h2>Result</h2>',
        _table(_headline(result), css="headline"), "</section>",
        '<section id="inputs"><h2>Inputs</h2><div class="columns"><div>',
        _table(_inputs_rows(result, scenario), header=("input", "value")), "</div><div>",
        _table(_plan_rows(result.inputs["plan"]), header=("plan field", "value")),
        "</div></div>",
        '<p class="note">Re-run it: save <code>trainsim simulate ... --format json</code> '
        "and give it to <code>trainsim simulate --scenario result.json</code>; the "
        "resolved scenario:</p>",
        f"<details><summary>scenario</summary><pre>{_e(json.dumps(scenario, indent=1))}"
        "</pre></details></section>",
        '<section id="breakdown"><h2>Where the step goes</h2>',
        _figure(figures.step_breakdown_figure(result), "figure-breakdown"),
        _table(_breakdown_rows(result), header=("seconds per step", *(
            f"pp{p}" for p in result.breakdown_frame().index))),
        '<p class="note">Exposed communication is the part of an axis\' communication '
        "that no computation hides; the bubble is the time a pipeline rank waits for "
        "its neighbours.</p></section>",
        '<section id="memory"><h2>Memory per GPU</h2>',
        _figure(figures.memory_figure(result), "figure-memory"), "</section>",
        '<section id="gantt"><h2>Pipeline timeline</h2>', _gantt(result), "</section>",
        '<section id="collectives"><h2>Collectives this step uses</h2>',
        _collectives(collectives, collectives_note), "</section>",
        f"<footer>trainsim {_e(data.get('trainsim_version', ''))}. Units: s, GiB = 2^30 "
        "bytes for memory, GB/s = 1e9 bytes/s for bandwidth, KiB/MiB/GiB message sizes."
        "</footer>", "</body>", "</html>", ""]
    return "\n".join(parts)


def _gantt(result) -> str:
    if result.timeline_frame().empty:
        return ('<p class="note">The analytic fidelity prices the step in closed form and '
                "replays no ops, so there is no timeline: simulate with <code>--fidelity "
                "event</code> for the Gantt.</p>")
    return (_figure(figures.pipeline_gantt_figure(result), "figure-gantt", 120 + 40 * max(
        4, result.timeline_frame()["rank"].nunique())) +
        '<p class="note">One row per simulated rank; "(×N)" is how many ranks of the job '
        "it stands for (ranks of one pipeline stage run the same ops at the same "
        "time).</p>")


def _collectives(collectives: tuple | None, note: str) -> str:
    if not collectives:
        return f'<p class="note">{_e(note or "This step uses no collectives.")}</p>'
    used, curves, points = collectives
    rows = []
    for item in used:
        at = points[points["label"] == item.label]
        sizes = ", ".join(figures.size_label(s) for s in item.sizes_bytes[:4]) + (
            f" (+{len(item.sizes_bytes) - 4})" if len(item.sizes_bytes) > 4 else "")
        busbw = ", ".join(f"{v:,.1f}" for v in at["busbw_GBps"][:4])
        rows.append((item.label, f"{item.calls:,}", sizes, busbw,
                     ", ".join(sorted(set(at["algorithm"] + "/" + at["protocol"])))))
    fig = figures.busbw_figure(curves, measured=points,
                               title="busbw of the collectives this step uses")
    return (_table(rows, header=("collective (axis, kind, group)", "calls per step",
                                 "sizes", "busbw (GB/s)", "algorithm/protocol")) +
            _figure(fig.update_layout(legend=dict(orientation="h", y=-0.25)),
                    "figure-busbw", 560) +
            '<p class="note">Each line sweeps one collective over one of its groups in '
            "this job's layout, as nccl-tests would (α-β cost model, busbw with "
            "nccl-tests' factors); the crosses are the sizes the step uses.</p>")
