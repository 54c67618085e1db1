"""What the commands print: tables that fit 100 columns, headers that state the effective
inputs (defaults included), output paths checked before the work."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from conftest import run_cli

SMALL_STEP = ("--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
              "--global-batch", "32")

COMMANDS = {
    "collective": ("collective", "all_reduce", "--nodes", "16", "--min-bytes", "1K",
                   "--max-bytes", "16G"),
    "simulate": ("simulate", *SMALL_STEP, "--straggler", "3:0.5"),
    "failures": ("failures", *SMALL_STEP, "--days", "5", "--seeds", "4"),
    "plan": ("plan", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1,2",
             "--zero", "1", "--recompute", "none", "--workers", "1", "--tokens", "1T",
             "--price-per-gpu-hour", "2.5", "--global-batch", "64"),
    "plan --days": ("plan", "--model", "llama3-8b", "--tokens", "200B", "--days", "20",
                    "--tp", "1,2", "--pp", "1", "--zero", "1", "--recompute", "none",
                    "--schedule", "1f1b", "--workers", "1", "--price-per-gpu-hour", "2"),
    "hardware list": ("hardware", "list"),
    "hardware show": ("hardware", "show", "gb200-nvl72", "--format", "table"),
}


#: What the header of ``simulate`` with SMALL_STEP's model and parallelism (any batch)
#: states besides its fidelity, batch and calibration: the defaults it ran with.
SIMULATE_HEADER_PHRASES = ("llama3-8b on 16 GPUs of dgx-h100", "seq_len 4,096",
                           "schedule 1f1b", "zero 1",
                           "DP gradient reduction overlapped with backward in 40 MB buckets")


def words(text: str) -> str:
    """``text`` with its whitespace collapsed and wrapped header lines joined again (a
    header wraps with ``#   `` at the start of each continuation line)."""
    return " ".join(text.replace("\n#   ", " ").split())


@pytest.mark.parametrize("columns", [100, 80])
@pytest.mark.parametrize("name", COMMANDS)
def test_tables_fit_100_columns(capsys, monkeypatch, name, columns):
    """Every table fits 100 columns (the issue's bar); at 80 they still fit, nothing cut."""
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(capsys, *COMMANDS[name])
    assert code == 0, err
    widths = [cell_len(line.rstrip()) for line in out.splitlines()]
    assert widths and max(widths) <= columns, max(widths)
    assert "…" not in out  # nothing truncated
    # a header wrapped to the width keeps its '#' on every line: no header words outside
    bare = [line for line in out.splitlines() if not line.startswith("#")]
    assert not [line for line in bare if "calibration none" in line or "Mi tokens" in line
                or "fidelity" in line], bare[:5]


def test_simulate_header_states_the_defaults_without_the_long_replay(capsys, tmp_path):
    """The inner loop's variant of the test below (whose default event replay of 256
    micro-batches takes seconds): the default batch is stated at analytic fidelity, the
    default fidelity with a small batch, the calibration file in both."""
    cal = tmp_path / "cal.toml"
    cal.write_text('[fields]\n"gpu.sustained_fraction" = 0.7\n')
    base = ("simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--calibration", str(cal))
    expected = {("--fidelity", "analytic"): ("fidelity analytic",
                                             "global batch 1,024 sequences (4.00 Mi tokens)",
                                             "256 micro-batches of 1 per pipeline"),
                ("--global-batch", "32"): ("fidelity event", "global batch 32 sequences",
                                           "8 micro-batches of 1 per pipeline")}
    for extra, phrases in expected.items():
        code, out, err = run_cli(capsys, *base, *extra)
        assert code == 0, err
        header = words(out.split("step time")[0])
        for phrase in (*SIMULATE_HEADER_PHRASES, f"calibration {cal.resolve()}", *phrases):
            assert phrase in header, (phrase, header)


@pytest.mark.slow  # the default step at event fidelity (256 micro-batches): ~6 s
def test_simulate_header_states_the_effective_inputs(capsys, tmp_path):
    cal = tmp_path / "cal.toml"
    cal.write_text('[fields]\n"gpu.sustained_fraction" = 0.7\n')
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "16",
                             "--tp", "2", "--pp", "2", "--calibration", str(cal))
    assert code == 0, err
    header = words(out.split("step time")[0])
    for phrase in (*SIMULATE_HEADER_PHRASES, "fidelity event", f"calibration {cal.resolve()}",
                   "global batch 1,024 sequences (4.00 Mi tokens)",
                   "256 micro-batches of 1 per pipeline"):
        assert phrase in header, (phrase, header)


@pytest.mark.parametrize("name", ("failures", "plan", "collective"))
def test_every_header_names_fidelity_and_calibration(capsys, name):
    code, out, err = run_cli(capsys, *COMMANDS[name])
    assert code == 0, err
    head = " ".join(words(out.split("\n\n")[0]).split()[:80])
    assert "fidelity" in head and "calibration none" in head, head
    if name != "collective":
        assert "seq_len 4,096" in head and "global batch" in head and "overlapped" in head


def test_sweep_header_states_the_defaults(capsys, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: llama3-8b, gpus: 8, global_batch: 8}\n")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "r.csv"),
                           "--workers", "1")
    assert code == 0, err
    for phrase in ("seq_len 4,096", "global batch ~4 Mi tokens", "fidelity analytic",
                  "no calibration", "overlapped"):
        assert phrase in words(err), err


def test_trace_into_a_new_directory_is_created_first(capsys, tmp_path):
    trace = tmp_path / "new" / "dir" / "step.json"
    code, _, err = run_cli(capsys, "simulate", *SMALL_STEP, "--trace", str(trace))
    assert code == 0, err
    assert trace.stat().st_size > 0


def test_trace_into_a_directory_fails_before_simulating(capsys, tmp_path, monkeypatch):
    import trainsim.api

    def never(*args, **kwargs):
        raise AssertionError("simulated before checking the output path")
    monkeypatch.setattr(trainsim.api, "run_step", never)
    code, out, err = run_cli(capsys, "simulate", *SMALL_STEP, "--trace", str(tmp_path))
    assert code == 2 and out == ""
    assert err.startswith("error: trace: ") and "is a directory" in err


def test_bare_trainsim_prints_the_help(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0 and err == ""
    assert "Usage:" in out and "simulate" in out and "\n" in out.strip()


def test_collective_table_fits_80_columns_with_its_constants_in_the_header(capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(capsys, *COMMANDS["collective"])
    assert code == 0, err
    assert max(cell_len(line.rstrip()) for line in out.splitlines()) <= 80
    assert "…" not in out
    assert "type float, redop sum, root -1" in words(out)
    first = next(line.split() for line in out.splitlines() if line.strip()[:1].isdigit())
    assert first[:2] == ["1024", "256"] and len(first) == 7  # type, redop, root left out


@pytest.mark.parametrize("columns", [80, 120])
def test_hardware_list_breaks_names_only_after_a_hyphen(capsys, monkeypatch, columns):
    """At 80 columns a GPU name or fabric spans lines only after a hyphen: every piece of
    one on a line starts at its start or after a hyphen and ends at a hyphen or its end;
    at 120 they stay whole."""
    from trainsim import api

    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(capsys, "hardware", "list")
    assert code == 0, err
    listed = api.hardware_list()
    values = {*listed["gpu"], *listed["fabric"]}
    cells = set(out.split())
    def aligned(cell: str, value: str) -> bool:
        return any((i == 0 or value[i - 1] == "-")
                   and (i + len(cell) == len(value) or value[i + len(cell) - 1] == "-")
                   for i in range(len(value)) if value.startswith(cell, i))

    pieces = {cell for cell in cells for value in values
              if len(cell) >= 4 and cell != value and cell in value}
    for cell in pieces:  # a piece cut mid-word is no hyphen-aligned piece of any value
        assert any(aligned(cell, value) for value in values), cell
    assert ("rail-" in cells) == (columns < 100)
    assert ("rail-optimized" in cells) == (columns >= 100)


def test_simulate_labels_the_simulated_step_and_the_real_run_band(capsys, monkeypatch):
    """A user read "step time 0.7527" beside "p10 / p50 / p90 0.7879 / 0.8886 / 1.0041" as a
    contradiction: the band is what a real run would measure (model-error bias included),
    so the simulated step can lie outside it. The labels say which number is which."""
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run_cli(capsys, "simulate", "--model", "llama3-8b", "--gpus", "4",
                             "--global-batch", "8", "--fidelity", "analytic")
    assert code == 0, err
    text = words(out)
    assert "step time, simulated (s)" in text, text
    assert "a real run's step, 80 % band p10 / p50 / p90 (s)" in text, text
