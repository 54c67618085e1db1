"""``trainsim simulate --report``: one self-contained HTML page (inputs, breakdown, memory,
Gantt, busbw of the collectives used) that renders offline in a real headless browser."""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess

import pytest

from conftest import run_cli
from trainsim import api
from trainsim.report import step_report, write_step_report
from trainsim.report.collectives import step_collectives

STEP = dict(gpus=16, tp=2, pp=2, global_batch=16)
FIGURES = ("figure-breakdown", "figure-memory", "figure-gantt", "figure-busbw")


@pytest.fixture(scope="module")
def step():
    return api.simulate("llama3-8b", fidelity="event", **STEP)


@pytest.fixture(scope="module")
def page(step):
    return step_report(step)


def _without_inline_scripts(text: str) -> str:
    return re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)


def test_the_page_is_self_contained_and_deterministic(step, page):
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<script") == 1 + len(FIGURES)  # plotly.js once, one per figure
    assert len(page) > 3_000_000  # plotly.js is inlined, not linked
    markup = _without_inline_scripts(page)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", markup), \
        "the page must load nothing from the network"
    for div in FIGURES:
        assert f'id="{div}"' in markup
    assert step_report(step) == page  # same result, same bytes


def test_the_page_states_the_inputs_and_the_numbers(step, page):
    markup = html.unescape(_without_inline_scripts(page))
    for words in ("llama3-8b on 16 GPUs of dgx-h100", "tp 2 pp 2 dp 4", "1f1b",
                  "event fidelity", f"{step.step_time_s:.4f} s", f"{100 * step.mfu:.1f} %",
                  f"{step.peak_memory_bytes / 2**30:.2f} GiB", "<td>global_batch</td>",
                  "<td>seq_len</td>", '"gpus": 16', "pipeline bubble", "exposed TP comm"):
        assert words in markup, words
    # every collective the step issues has a row, with its busbw
    used = step_collectives(step.lowering.program, 8)
    assert {u.kind for u in used} >= {"all_gather", "reduce_scatter", "sendrecv"}
    for item in used:
        assert f"<td>{item.label}</td>" in markup, item.label


def test_analytic_fidelity_has_no_gantt_but_its_collectives(step):
    analytic = api.simulate("llama3-8b", fidelity="analytic", **STEP)
    markup = _without_inline_scripts(step_report(analytic))
    assert 'id="figure-gantt"' not in markup and "--fidelity event" in markup
    assert 'id="figure-busbw"' in markup
    assert [u.label for u in step_collectives(step.lowering.program, 8)] == \
        [label for label in re.findall(r"<tr><td>([A-Z]{2} [a-z_]+, [^<]+)</td>", markup)]


def test_cli_writes_the_report_and_checks_its_path_first(capsys, tmp_path, monkeypatch):
    args = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--global-batch", "16", "--fidelity", "analytic")
    out_file = tmp_path / "new" / "report.html"
    code, out, err = run_cli(capsys, *args, "--report", str(out_file))
    assert code == 0, err
    assert "step time" in out and out_file.read_text().startswith("<!DOCTYPE html>")
    assert not list(out_file.parent.glob("*.tmp*"))  # written atomically

    import trainsim.api

    monkeypatch.setattr(trainsim.api, "run_step", lambda *a, **k: pytest.fail("simulated"))
    code, out, err = run_cli(capsys, *args, "--report", str(tmp_path))
    assert code == 2 and out == "" and err.startswith("error: report: ")


def _chromium() -> str:
    """Debian's Chromium; .ci/run installs it where apt-get exists."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get"):
        pytest.fail("chromium is missing: apt-get install chromium (.ci/run installs it)")
    pytest.skip("no Chromium and no apt-get to install it on this machine")


def _png_size(path) -> tuple[int, int]:
    """Width and height from a PNG's header."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # starts a headless Chromium (~5 s)
def test_the_report_renders_in_headless_chromium(tmp_path, step):
    """Chromium opens the page from disk with its network shut: plotly draws every
    figure (its SVGs are in the DOM after the scripts ran) and the screenshot has
    content. The screenshot stays in tmp_path for a look."""
    browser = _chromium()
    report = write_step_report(step, tmp_path / "report.html")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             "--virtual-time-budget=15000"]
    shot = tmp_path / "report.png"
    # One browser run gives both: the DOM after the scripts ran, and the screenshot.
    done = subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,3800", f"--screenshot={shot}", "--dump-dom",
                           report.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for div in FIGURES:  # each figure div holds plotly's drawing
        block = dom.split(f'id="{div}"', 1)[1][:200_000]
        assert 'class="main-svg"' in block, div
    assert 'class="legendtext"' in dom and "pipeline bubble" in dom
    assert _png_size(shot) == (1200, 3800)
    # A blank page of that size compresses to about 20 kB; this one, with four figures,
    # to about 300 kB.
    assert shot.stat().st_size > 100_000, shot.stat().st_size
    if os.environ.get("TRAINSIM_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["TRAINSIM_KEEP_SCREENSHOT"])


@pytest.mark.slow
def test_a_parameter_server_step_lists_its_pushes_and_pulls():
    """The servers of a parameter-server job are ranks past the workers, on nodes of
    their own: the busbw is priced on that larger layout."""
    ps = api.simulate("llama3-8b", gpus=8, tp=1, pp=1, global_batch=8, dp_mode="ps-sync",
                      ps_servers=2)
    markup = html.unescape(_without_inline_scripts(step_report(ps)))
    assert "<td>DP sendrecv, 2 ranks (2 nodes × 1)</td>" in markup
    assert 'id="figure-busbw"' in markup and "could not be listed" not in markup
