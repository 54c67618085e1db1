"""The memory model against published runs (validate/published_memory.py): published
peak-memory figures within tolerance, and every published training configuration that ran
fits its GPU. Memory model only (no step simulation): seconds."""

from __future__ import annotations

import math

import pytest

from validate import published_memory as M
from validate.published import PublishedRun

# Every published configuration's memory (~10 s): with the published step times, the whole
# suite's, not the inner loop's.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def memory_rows():
    return M.evaluate_memory(M.load_memory_runs())


@pytest.fixture(scope="module")
def fit_rows():
    return M.fits_table()


def test_allocated_peaks_within_tolerance(memory_rows):
    """Allocated-type figures (torch.cuda.max_memory_allocated) within MEMORY_TOLERANCE = 8 %."""
    allocated = memory_rows[(memory_rows.kind == "allocated") & (memory_rows.status == "ok")]
    assert len(allocated) >= 1
    bad = allocated[allocated.error.abs() > M.MEMORY_TOLERANCE]
    assert bad.empty, bad[["row_id", "published_gib", "simulated_gib", "error"]].to_string()


def test_saturated_figures_bound_the_model(memory_rows):
    """A reserved figure near the GPU's capacity only bounds the need from above: the
    model's need must not exceed it, except for the documented gaps."""
    bound = memory_rows[memory_rows.status == "bound"]
    assert len(bound) >= 1
    over = bound[(bound.within == False) & ~bound.row_id.isin(list(M.KNOWN_GAPS))]  # noqa: E712
    assert over.empty, over[["row_id", "published_gib", "simulated_gib"]].to_string()
    listed = bound[bound.row_id.isin(list(M.KNOWN_GAPS))]
    assert (listed.within == False).all(), "a listed gap now holds: remove it from KNOWN_GAPS"  # noqa: E712


def test_every_compared_training_row_fits_except_the_documented_gaps(fit_rows):
    ok = fit_rows[fit_rows.status == "ok"]
    assert len(ok) >= 400
    not_fitting = set(ok[ok.fits == False].row_id)  # noqa: E712
    training_gaps = {row for row in M.KNOWN_GAPS if not row.startswith("mem_")}
    assert not_fitting - training_gaps == set(), "rows that ran but do not fit"
    assert training_gaps - not_fitting == set(), "rows that now fit: remove them from KNOWN_GAPS"


def test_rows_not_compared_say_why(fit_rows, memory_rows):
    for frame in (fit_rows, memory_rows):
        skipped = frame[~frame.status.isin(["ok", "bound"])]
        assert (skipped.reason.str.len() > 0).all()
        assert not (frame.status == "error").any(), frame[frame.status == "error"].to_string()


def test_unprinted_settings_are_reported(fit_rows):
    """Rows that fit only with settings their source does not print say so."""
    unprinted = fit_rows[fit_rows.settings.str.contains("unprinted:")]
    assert {"dgxc_maxtext_01", "mb2509_03"} <= set(unprinted.row_id)
    assert "activation offload of 40 layers" in unprinted.set_index("row_id").loc["mb2509_03", "settings"]
    settings = unprinted.set_index("row_id").settings
    # the Megatron-Bridge gpt-oss preset and NeMo AutoModel's benchmark YAML (published_stacks)
    assert "recompute modules layernorm moe_act" in settings["mb2511_15"]
    assert "grad_reduce_in_fp32 False" in settings["mb2511_22"]
    assert "activation checkpointing of every decoder block" in settings["automodel_1"]


def test_memory_kind_is_read_from_the_row_and_bad_kinds_are_refused():
    def run(kind):
        return PublishedRun("s", "r1", {"memory_kind": kind}, None)

    assert M.memory_kind(run("allocated: max allocated")) == "allocated"
    assert M.memory_kind(run("reserved: max reserved")) == "reserved"
    assert M.memory_kind(run("torchtitan logged ... the CUDA caching allocator max reserved")) == "reserved"
    assert M.memory_kind(run("nvidia-smi: Memory-Usage")) == "device"
    with pytest.raises(ValueError, match="memory_kind: row 'r1'"):
        M.memory_kind(run("peak"))


def test_megatron_loss_transient_reproduces_the_logged_llama32_1b_peak(memory_rows):
    """Hand-derived from the Megatron-Bridge log (memory_megatron_bridge_logs.csv): the
    activation peak over the persistent states is max allocated - allocated = 12003.6 -
    9554.9 = 2448.7 MiB. One micro-batch (1024 tokens) of 16 layers keeps 74 MiB per layer
    (SwiGLU, GQA: 37 bytes per token and hidden unit, 2048 wide) = 1184 MiB, and the loss
    holds 10 bytes per logit while it runs (bf16 logits 2, their fp32 cast 4, the fp32
    softmax 4) over 1024 x 128256 logits = 1252.5 MiB: 2436.5 MiB, within 0.5 %."""
    from validate.published import load_models, load_nemo_recipes, scenario_for

    layers = 16 * 37 * 1024 * 2048 / 2**20
    loss = 10 * 1024 * 128256 / 2**20
    head_inputs = 2 * 2 * 1024 * 2048 / 2**20
    logged = 12003.60400390625 - 9554.87939453125
    assert layers + loss == pytest.approx(logged, rel=0.005)
    run = next(r for r in M.load_memory_runs() if r.row_id == "mem_mb_llama32_1b_alloc")
    recipes = load_nemo_recipes()
    scenario = scenario_for(run, load_models(), recipes)
    rank0 = M.rank_peaks(scenario.model, scenario.plan, 0.0)[0]
    mib = (rank0.activations_bytes + rank0.transient_bytes) / 2**20
    assert mib == pytest.approx(layers + loss + head_inputs, rel=1e-9)
    assert mib == pytest.approx(logged, rel=0.01)
    row = memory_rows.set_index("row_id").loc["mem_mb_llama32_1b_alloc"]
    assert not math.isnan(row.simulated_gib)
