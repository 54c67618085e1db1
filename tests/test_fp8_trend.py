"""tools/fp8_trend.py: the FP8 weak-scaling trend measurement and the amax all-reduces
per row (issue 12). Closed forms exact; which published rows carry the op, and that the
simulated step with it is slower than re-simulated without."""

import pytest

from tool_modules import load_tool


def test_slope_per_doubling_is_the_least_squares_slope_on_log2_gpus():
    tool = load_tool("fp8_trend")
    # error = 0.01 - 0.02 * log2(N / 64): exactly -2 % per doubling
    assert tool.slope_per_doubling([64, 128, 256, 512], [0.01, -0.01, -0.03, -0.05]) \
        == pytest.approx(-0.02, abs=1e-12)


def test_slope_per_doubling_refuses_a_single_gpu_count():
    with pytest.raises(ValueError, match="gpus: \\[64\\] is not valid"):
        load_tool("fp8_trend").slope_per_doubling([64, 64], [0.0, 0.1])


def test_series_of_names_the_weak_scaling_series():
    tool = load_tool("fp8_trend")
    assert tool.series_of("nvidia_dgxc_benchmarking", "dgxc_l70b_07") == "l70b"
    assert tool.series_of("nvidia_nemo_perf", "nemo_longseq_b200_03") == "longseq_b200"
    assert tool.series_of("nvidia_nemo_perf", "nemo_longseq_03") == "longseq"
    assert tool.series_of("nvidia_nemo_perf", "nemo2407a_01") is None


def test_amax_reductions_cover_megatron_delayed_scaling_rows_only():
    """Two amax all-reduces (forward, backward) per micro-batch and model chunk over TP x
    DP x CP for a Megatron-Core FP8 row, and the simulated step carries them (slower than
    the same row re-simulated without); none for its BF16 twin or a JAX (MaxText) row."""
    from sim.analytic_step import PricingCache
    from sim.step import simulate_step
    from validate.published import load_models, load_nemo_recipes, load_runs, scenario_for
    tool = load_tool("fp8_trend")
    runs = {r.row_id: r for r in load_runs(sources=["nvidia_dgxc_benchmarking"])}
    models, recipes = load_models(), load_nemo_recipes()

    def scenario(row_id):
        return scenario_for(runs[row_id], models, recipes)

    gpt = scenario("dgxc_gpt175_10")  # tp4 pp8 vpp12 dp64, 64 micro-batches
    assert tool.amax_reductions(gpt) == (4 * 64, 2 * 64 * 12)
    cache = PricingCache()
    with_op = simulate_step(gpt.model, gpt.cluster, gpt.plan, fidelity="analytic",
                            check_memory=False, cache=cache).step_time_s
    assert with_op > tool.without_amax_s(gpt, cache)
    assert tool.amax_reductions(scenario("dgxc_gpt175_05")) == (0, 0)   # its BF16 twin
    assert tool.amax_reductions(scenario("dgxc_maxtext_12")) == (0, 0)  # MaxText FP8 (JAX)
