"""The published training runs of validate/data/published, simulated (validate/published.py).

One comparison of the whole set at analytic fidelity (module fixture) backs every test
here: its size and spread (sources, GPU generations, dtypes), the error it reaches, that
every row not compared says why, that the README prints exactly what it gives, and that
each preset's one calibrated number reproduces its calibration rows.

The accuracy bounds are what the simulator reaches today on the validation rows, with a
small margin; they fail on any regression. They are looser than issue 12's targets
(median 5 %, p90 12 %, |bias| 2 %), which the dense models approach and the MoE models do
not yet meet: with their expert layouts, dispatchers, MLA and DualPipe modelled (issue 15)
all 75 expressible MoE rows are compared, and they are simulated too fast on average
(bias about -18 %; the fine-grained Qwen3-30B-A3B NeMo rows by 58-63 %, as before issue
15). That MoE bias is pinned by its own test and is what moves the whole set's bias past
the dense models' 3 %.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware.catalog import load_cluster
from validate.calibrate_published import calibration_rows
from validate.published import evaluate, load_models, summarize
from validate.published_report import README_BEGIN, README_END, build_report, markdown

# The whole published set simulated once (~30 s on two cores): CI's whole suite runs it,
# the inner loop (-m "not slow") leaves it out; run it after any physics change.
pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
#: GPU generation of each published GPU name.
GENERATIONS = {"A100-80GB": "Ampere", "A100-40GB": "Ampere", "H100-SXM": "Hopper",
               "H800": "Hopper", "H200": "Hopper", "B200": "Blackwell", "GB200": "Blackwell"}


@pytest.fixture(scope="module")
def report():
    return build_report()


def _line(report, name):
    return report.summary.set_index("source_id").loc[name]


def test_the_set_spans_sources_generations_and_dtypes(report):
    compared = report.chosen()
    compared = compared[compared["status"] == "ok"]
    assert len(compared) >= 150
    assert compared["source_id"].nunique() >= 6
    assert {GENERATIONS[g] for g in compared["gpu"]} == {"Ampere", "Hopper", "Blackwell"}
    assert {"bf16", "fp8"} <= set(compared["dtype"])


def test_dense_models_within_todays_bounds(report):
    """Pricing llm-foundry's Composer DecoupledAdamW as its per-tensor unfused loop and its
    mp_mode PURE rows' bf16 gradient reduction measured median 6.0 %, p90 16.1 %, bias
    -1.4 % (from 6.0 %, 16.4 %, -1.6 %): the p90 bound tightens. The measured B200 cuDNN
    attention rows (cudnn-frontend, cuDNN 9.10.2) with dgx-b200 / gb200-nvl72 refitted:
    5.3 %, 16.0 %, -2.2 % (from 5.4 %, 16.0 %, -2.1 %): the median bound tightens. The
    1F1B family timed exactly at any size (strategies.pipeline.one_f_one_b_family_timing;
    the closed form under-timed long pipelines: it left out the transfers a 1F-1B steady
    state waits for each round): 5.0 %, 15.8 %, -2.0 %; all three tighten. The closed form
    carrying the CPU's lead as its replay does (sim/host_lead.py, issue 12's host issue in
    pipelines): 5.29 %, 15.85 %, -2.2 %; the median and bias bounds open to that (a fidelity fix, the replay's numbers, not a physics loss). The eager Megatron-Core / NeMo rows (0.3-5.5 % faster) had
    been priced above their own replay, every layer's phase starting with the CPU level
    (nemo2407a_03 +1.2 % over the event fidelity, now -0.15 %; mb2602_01 +2.0 %, now
    -0.17 %): that excess had offset part of their under-prediction. The dgxc Paxml
    recipe's per-iteration copies of its scanned layers' loop-carried buffers (XLA
    while-loop double buffering off; ParallelPlan.xla_scan_carry_copies): 5.29 %,
    15.57 %, -2.04 % (the Paxml rows from -29..-33 % to -13.5..-19.5 %): the p90 and
    bias tighten. Every kernel at the job's expected slowest GPU (gpu.speed_spread 1.5 %,
    hardware.compute.expected_slowest_factor) with every preset refitted on its
    calibration rows: 4.93 %, 14.82 %, -2.70 %. The median and p90 tighten (each weak-
    scaling series flattens: tests/test_fleet_spread.py); the bias opens to 0.028 because
    the calibration rows (H100: 128 GPUs; A100: 32-3072) now carry their slowest GPU, so
    the rows on fewer GPUs, which were already simulated too fast, run 1-2 points faster
    (MosaicML H100 below 128 GPUs -1.9 -> -3.5 %). Transformer Engine's amax all-reduce
    after every model chunk's forward and backward (FP8 te-delayed Megatron-Core rows,
    strategies.lowering StepLowerer._amax_reduction): 4.86 %, 14.82 %, -2.64 %; the
    median and bias tighten. Every step of a data-parallel ring over several nodes of
    several GPUs paced at comm.ring_step_pacing_us (LL128 7.7 us, fitted on nccl-tests
    logs, tests/test_nccl_logs.py): 4.86 %, 14.62 %, -2.61 % (the FSDP rows at 128-512
    GPUs, simulated too fast, come closer: MosaicML mpt-1b at 512 GPUs -16.7 -> -15.3 %);
    the p90 tightens."""
    dense = _line(report, "dense models")
    assert dense["compared"] >= 350
    assert dense["median_abs_error"] <= 0.049
    assert dense["p90_abs_error"] <= 0.147
    assert abs(dense["bias"]) <= 0.027


def test_moe_models_within_todays_bounds(report):
    """Every MoE row but DeepSeek's EP 64 over 32 ranks is compared (41 before issue 15:
    median 21 %, p90 59 %, bias +4 %, with +240 % rows cancelling -60 % ones). Since
    sliding-window layers are modelled (issue 12) the 11 gpt-oss rows are compared too
    (75 -> 86 rows); they share the fine-grained MoE rows' under-prediction (-23 % to
    -48 %; FSDP-64 AutoModel +49 %), which moved the 75 rows' median 14.0 %, p90 38.9 %,
    bias -16.3 % to 15.5 %, 41.5 %, -17.5 %. The host's CPU time per op beyond kernel
    launches (TE module calls, CPU-only torch calls of grouped GEMMs and quantizations,
    the Grace host factor; Megatron-Bridge GB200 rows on partial CUDA graphs) measured
    15.4 %, 37.4 %, -14.2 %. Converting the Megatron-Core rows' printed TFLOP/s with
    Megatron's causal FLOP count (validate.published.flop_rate_is_causal) measured 13.2 %,
    35.6 %, -9.9 %. The Megatron-Bridge Qwen3 / gpt-oss configs' bf16 gradient reduction
    and gpt-oss recompute modules and AutoModel's activation checkpointing
    (validate.published_stacks) measured 12.0 %, 36.2 %, -8.9 %: the median and bias
    tighten to that; the p90 bound stays. The gpt-oss experts' biases added as the stacks
    add them (eager per-expert adds; strategies.model_costs.expert_bias_kernels) measured
    12.0 %, 32.7 %, -8.3 %: the p90 and bias tighten. AutoModel's rows run as AutoModel runs
    them (no NeMo recipe, bf16-logit loss, FSDP2 fp32 masters, the gpt-oss YAMLs' EP)
    measured 11.8 %, 32.2 %, -9.0 %: automodel_6's +55 % (EP 1) no longer offsets the
    under-predicted rows, so the bias bound goes back to 9.5 % while the p90 tightens.
    The 25.09 token-drop qwen3-30b-a3b presets on B200/GB200 replay full-iteration CUDA
    graphs (validate.published._FULL_ITERATION_GRAPHS; the B200 token-drop/dropless pair's
    1.94x is reproduced within 10 %, test_host_issue) measured 12.2 %, 31.8 %, -10.4 %:
    their eager pricing (+36 %, +4 %, +8 %) had hidden that these rows' GPU time is
    simulated 19-29 % too fast, so the bias bound opens to 10.5 % (the p90 tightens).
    Counting the GPU kernels of TE 2.x's grouped experts as TE launches them (a quantize
    kernel per expert, delayed scaling's one fused cast; per-expert cuBLAS GEMMs four
    streams wide; strategies.model_costs Fp8Recipe.fused_split_quantize,
    hardware.compute ComputeModel.serial_launches) measured 12.6 %, 30.7 %, -10.1 %: the
    p90 and bias tighten; the median opens to 12.7 % because mb260201_13 (H100, FP8 recipe
    not printed, so delayed scaling) loses 16 per-expert host casts it never issued and
    goes from -11 % to -20 %, past the median. Counting the dropless all-to-all
    dispatcher's preprocess on the host (strategies.lowering.dispatch_preprocess_host:
    11 launches, 13 CPU-only calls per MoE layer forward, eager only) measured 12.2 %,
    30.5 %, -9.9 %: all three tighten (the eager x86 micro-batch-1 rows stay 25-57 % fast,
    host-bound in the measurement by far more than the source counts). The dgxc Grok-1
    rows run their recipe's capacity factor 1.0 padded, userbuffers TP overlap and
    FlashAttention 2 (validate.published_stacks.DGXC_LAUNCHER_RECIPES): 11.9 %, 30.5 %,
    -9.3 %; the median and bias tighten. The measured B200 cuDNN attention rows with the B200
    presets refitted on them (sustained_fraction +0.015): 12.0 %, 30.8 %, -9.4 % (from 12.0 %,
    30.5 %, -9.4 %) -- the
    B200/GB200 MoE rows the simulator already runs too fast (gpt-oss, Qwen3, DeepSeek-V3;
    not attention-bound) run 1-2 % faster still, so the MoE p90 bound loosens to 0.309.
    The 1F1B family timed exactly at any size moves 43 MoE pipeline rows by -0.7 to +0.9
    points (32 of them closer), but the median row's |error| grows: 12.15 %, 30.8 %,
    -9.4 %, so the median bound opens to 0.122. The closed form carrying the CPU's lead as
    its replay does (sim/host_lead.py): 11.45 %, 34.55 %, -11.73 %; the median tightens. The eager and partial MoE rows had been
    priced up to 22 % above their own replay (every layer's phase from the CPU level;
    mb2511_16 +22.5 %): five rows that were 18-31 % slow come within 9 % (mb2511_08
    +17.9 -> -1.9 %), the rows already simulated too fast fall further (mb2511_16 -27.7 ->
    -41.0 %); the p90 and bias open to what the replay gives (the eager dropless rows'
    host cost is under-priced: test_host_issue's token-drop/dropless pair). Every kernel
    at the job's expected slowest GPU (gpu.speed_spread) with the presets refitted:
    11.39 %, 33.96 %, -11.46 %; the p90 and bias tighten. Transformer Engine's amax
    all-reduce per model chunk forward and backward (FP8 te-delayed rows): 11.50 %,
    33.96 %, -11.40 %: eleven of the thirteen FP8 rows it touches come closer (the Grok
    series, -8.5 -> -7.9 % at 128-512 GPUs), but mb2602_17, already 11.5 % slow, becomes
    the median's upper row at 11.7 %, so the median bound opens by 0.05 point."""
    moe = _line(report, "MoE models")
    assert moe["compared"] >= 86
    assert moe["median_abs_error"] <= 0.1155
    assert moe["p90_abs_error"] <= 0.340
    assert abs(moe["bias"]) <= 0.115


def test_whole_set_within_todays_bounds(report):
    """Median as before issue 15; the bias is the dense rows' (within 3 %) plus the MoE
    rows' under-prediction weighted by their share (86 of 486 with the gpt-oss rows,
    test_moe_models_within_todays_bounds): within 5 %; the p90 21.8 % with them, 20.1 %
    with the causal FLOP count of the Megatron-Core rows, 19.2 % with the context-parallel
    rows of torchtitan and Llama 3 run as their stacks run CP (cp_comm_type), then
    the MoE framework settings of validate.published_stacks as well (18.9 %); host issue
    per stack for the dense rows (18.6 %) and the gpt-oss experts' eager bias adds
    (18.4 %); the dgxc Paxml scanned-layer copies (18.2 %); every kernel at the job's
    expected slowest GPU (17.5 %); the ring step pacing of multi-node rings (17.4 %)."""
    every = _line(report, "all")
    assert every["median_abs_error"] <= 0.075
    assert every["p90_abs_error"] <= 0.1745
    assert abs(every["bias"]) <= 0.05


def test_rows_not_compared_say_why_and_none_failed(report):
    rows = report.rows
    assert not (rows["status"] == "error").any(), rows[rows["status"] == "error"].to_string()
    skipped = rows[rows["status"] != "ok"]
    assert (skipped["reason"].str.len() > 0).all()


def test_readme_prints_what_the_comparison_gives(report):
    text = README.read_text(encoding="utf-8")
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    assert text[start:end] + "\n" == markdown(report), (
        "README's published-accuracy block is stale: run `trainsim validate published "
        "--format markdown --write-readme README.md`")


def test_each_preset_reproduces_its_calibration_rows():
    """The one calibrated number of each preset (roles.toml) leaves a median error of its
    calibration rows within 1 % (the bisection resolution is 0.25 % of the fraction)."""
    models = load_models()
    chosen = calibration_rows()
    assert set(chosen) >= {"dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72",
                           "grand-teton-h100-96gb"}
    for preset, runs in chosen.items():
        assert runs, f"{preset}: no calibration row found"
        frame = evaluate(runs, models=models)
        line = summarize(frame, role="calibration").set_index("source_id").loc["all"]
        assert line["compared"] == len(runs)
        assert abs(frame["error"].median()) <= 0.01, (preset, frame["error"].median())


# grand-teton-h100-96gb is not here: its H100s run at a 500 W power limit, not 700 W, and
# it carries its own calibration (roles.toml; test_each_preset_reproduces_its_calibration_rows)
@pytest.mark.parametrize("preset,like", [("hgx-h200", "dgx-h100"), ("gcp-a3-mega", "dgx-h100"),
                                         ("dgx-h800", "dgx-h100"),
                                         ("dgx-a100-40gb", "dgx-a100")])
def test_presets_with_the_same_gpu_share_its_calibration(preset, like):
    assert (load_cluster(preset).gpu.sustained_fraction
            == load_cluster(like).gpu.sustained_fraction)


#: Published rows replayed at event fidelity too: a Megatron-LM 2021 pipeline (TP 8, PP 4),
#: an FSDP run (llm-foundry), a NeMo FP8 long-sequence run with TE userbuffers TP overlap.
EVENT_SPOT_CHECKS = ("megatron2021_05", "mosaic_025", "nemo_longseq_03")


@pytest.mark.parametrize("row_id", EVENT_SPOT_CHECKS)
def test_event_replay_agrees_with_the_closed_form_on_published_rows(row_id):
    from validate.published import load_nemo_recipes, load_runs, scenario_for
    from sim.step import simulate_step

    run = next(r for r in load_runs() if r.row_id == row_id)
    scenario = scenario_for(run, load_models(), load_nemo_recipes())
    times = {fidelity: simulate_step(scenario.model, scenario.cluster, scenario.plan,
                                     fidelity=fidelity, check_memory=False).step_time_s
             for fidelity in ("analytic", "event")}
    assert times["analytic"] == pytest.approx(times["event"], rel=0.02), times


@pytest.mark.parametrize("row_id, expected", [
    ("tt_a100_2", {"recompute": "selective", "recompute_modules": ("op_sac",),
                   "recompute_layers": 0}),
    ("tt_a100_1", {"recompute": "full", "recompute_modules": (), "recompute_layers": 16}),
])
def test_torchtitan_selective_checkpointing_is_its_own_policy(row_id, expected):
    """torchtitan's 'selective' is not Megatron's: per op it re-runs every second matmul,
    per layer it checkpoints every second block of the 32 whole."""
    from validate.published import load_nemo_recipes, load_runs, scenario_for
    run = next(r for r in load_runs(sources=["pytorch_torchtitan"]) if r.row_id == row_id)
    plan = scenario_for(run, load_models(), load_nemo_recipes()).plan
    assert {name: getattr(plan, name) for name in expected} == expected


@pytest.mark.parametrize("row_id, expected", [
    # Table 5: "PP schedule 1F1B" and "Interleaved 1F1B"; torchtitan's 2 stages per rank
    # for looped schedules, one micro-batch per stage of the local batch of 32
    ("tt_t5_1", {"schedule": "1f1b", "vpp": 1, "micro_batch": 4,
                 "tp_comm_overlap": "symmetric_memory"}),
    ("tt_t5_2", {"schedule": "interleaved", "vpp": 2, "micro_batch": 2,
                 "tp_comm_overlap": "symmetric_memory"}),
    # Table 4: 2D without and with AsyncTP
    ("tt_t4_1", {"schedule": "1f1b", "tp_comm_overlap": "dtensor"}),
    ("tt_t4_2", {"schedule": "1f1b", "tp_comm_overlap": "symmetric_memory"}),
])
def test_torchtitan_rows_run_their_printed_schedule_and_tp(row_id, expected):
    """A torchtitan row runs the pipeline schedule and TP mode it prints."""
    from validate.published import load_nemo_recipes, load_runs, scenario_for
    run = next(r for r in load_runs(sources=["pytorch_torchtitan"]) if r.row_id == row_id)
    plan = scenario_for(run, load_models(), load_nemo_recipes()).plan
    assert {name: getattr(plan, name) for name in expected} == expected


def test_torchtitan_within_todays_bounds(report):
    """torchtitan (issue 12): the printed schedules, DTensor TP / AsyncTP, torchao float8
    all-gathers and the 500 W Grand Teton calibration took it from median 11.6 %,
    p90 29.0 %, bias -7.9 % (28 rows) to 3.5 %, 17.4 %, -3.9 % (26 validation rows);
    PyTorch's context_parallel ring (all-gathered K/V as SDPA receives them, fp32 merges
    and dK/dV, cp_comm_type torch_allgather) took the context-parallel rows of Tables 2 and
    6 to 3.5 %, 14.3 %, -2.3 %."""
    line = _line(report, "pytorch_torchtitan")
    assert line["compared"] >= 26
    assert line["median_abs_error"] <= 0.05
    assert line["p90_abs_error"] <= 0.15
    assert abs(line["bias"]) <= 0.05
