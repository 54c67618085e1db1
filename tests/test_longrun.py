"""sim.longrun: Monte-Carlo long runs against closed forms and published counts.

Tolerances are stated per test; seeds are fixed, so every test is deterministic.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import expect_one_line_error as _one_line_error

import trainsim
from sim import longrun as lr
from trainsim import figures
from strategies import failures as fl

# A job with an exactly known failure process: one exponential class at a fixed job MTBF,
# fixed save / detection / restart times (no storage arithmetic involved).
MTBF_S = 4 * 3600.0
FIXED = {"checkpoint_blocking_s": 60.0, "reload_s": 0.0, "detection_s": 120.0,
         "reinit_s": 480.0}


def _buckets_add_up(runs):
    total = (runs["useful_s"] + runs["lost_s"].sum(-1) + runs["detection_s"].sum(-1)
             + runs["restart_s"].sum(-1) + runs["wait_s"].sum(-1) + runs["checkpoint_s"]
             + runs["degraded_s"])
    np.testing.assert_allclose(total, runs["wall_s"], rtol=1e-9)


# ---------------------------------------------------------------------------- published counts


def test_llama3_profile_reproduces_419_interruptions_in_54_days():
    """Mechanics check: mean interruptions within 10 % of Table 5's 419 on 16,384 GPUs in
    54 days (the only shortfall is failures absorbed while the job is already down)."""
    result = lr.simulate_long_run(gpus=16384, days=54, model="llama3-405b",
                                  checkpoint_interval="30min", seeds=200, seed=0)
    d = result.to_dict()
    assert d["interruptions_mean"] == pytest.approx(419, rel=0.10)
    # Tighter: interruptions + absorbed failures are Poisson(419) per run.
    failures = d["interruptions_mean"] + d["failures_absorbed_mean"]
    assert failures == pytest.approx(419, abs=4 * math.sqrt(419 / 200))
    lo, hi = d["goodput"]["ci95"]
    assert 0.5 < lo < d["goodput"]["mean"] < hi < 1.0
    assert d["goodput"]["p05"] < lo and d["goodput"]["p95"] > hi
    assert set(d["interruptions_by_cause"]) == set(result.class_names)
    assert d["interruptions_by_cause"]["gpu"]["mean"] == pytest.approx(196, rel=0.1)
    assert d["checkpoint_interval_s"] == 1800
    _buckets_add_up(result.runs)
    json.dumps(d, allow_nan=False)


def test_seed_claim_one_minus_0999_to_the_n():
    """At 99.9 % monthly availability per GPU, P(>= 1 interruption in a month) = 1 - 0.999^N:
    ~63 % at 1,000 GPUs, > 99.9 % at 8,000. Simulated fraction within 4 binomial sigma."""
    profile = fl.availability_profile(0.999)
    runs = 4000
    for gpus in (1000, 8000):
        result = lr.simulate_long_run(gpus=gpus, days=fl.MONTH_HOURS / 24, profile=profile,
                                      checkpoint_interval="1h", seeds=runs, seed=7,
                                      checkpoint_bytes="1TB")
        p_hat = result.to_dict()["p_at_least_one_interruption"]
        p = 1 - 0.999 ** gpus
        assert abs(p_hat - p) <= 4 * math.sqrt(p * (1 - p) / runs) + 1 / runs
        if gpus == 1000:
            assert p == pytest.approx(0.632, abs=0.001) and p_hat == pytest.approx(0.63, abs=0.03)
        else:
            assert p > 0.999 and p_hat > 0.998


# ---------------------------------------------------------------------------- analytic model


@pytest.fixture(scope="module")
def exact_scan():
    profile = fl.constant_rate_profile(mtbf_s=MTBF_S)
    return lr.goodput_vs_interval(gpus=1024, days=100, profile=profile, responses=FIXED,
                                  seeds=200, seed=1)


def test_simulated_goodput_matches_exact_renewal_model(exact_scan):
    """Exponential failures: simulated goodput vs interval within 0.5 % of (brief: 2 %)
    W / (exp(R/M) (M + D) (exp((W + C)/M) - 1)) (strategies.failures docstring)."""
    df = exact_scan
    assert df.attrs["exact_model"]
    exact = [fl.expected_goodput_exponential(interval_s=w, checkpoint_s=60, detection_s=120,
                                             restart_s=480, mtbf_s=MTBF_S)
             for w in df["interval_s"]]
    np.testing.assert_allclose(df["goodput_exact"], exact)
    np.testing.assert_allclose(df["goodput_mean"], exact, rtol=0.005)
    # The first-order model is within 3 % over the scanned range (0.25x..4x Young-Daly).
    np.testing.assert_allclose(df["goodput_first_order"], exact, rtol=0.03)
    assert len(df) == 17


def test_simulated_optimum_is_near_young_daly(exact_scan):
    yd = math.sqrt(2 * 60 * MTBF_S)
    assert exact_scan.attrs["young_daly_s"] == pytest.approx(yd)
    optimum = exact_scan.attrs["simulated_optimum_s"]
    assert optimum == pytest.approx(yd, rel=0.10)
    # ... and within 5 % of Daly's higher-order optimum, which the exact model confirms.
    assert optimum == pytest.approx(fl.daly_interval_s(60, MTBF_S), rel=0.05)


def test_auto_interval_uses_the_scan_and_reports_both():
    profile = fl.constant_rate_profile(mtbf_s=MTBF_S)
    result = lr.simulate_long_run(gpus=1024, days=30, profile=profile, responses=FIXED,
                                  checkpoint_interval="auto", seeds=60, seed=3,
                                  step_time_s=10.0, tokens_per_step=1e6)
    d = result.to_dict()
    info = d["checkpoint_interval"]
    assert info["requested"] == "auto"
    assert info["young_daly_s"] == pytest.approx(math.sqrt(2 * 60 * MTBF_S))
    assert info["simulated_optimum_s"] == pytest.approx(info["young_daly_s"], rel=0.25)
    assert d["checkpoint_interval_s"] % 10.0 == pytest.approx(0.0, abs=1e-9)   # whole steps
    assert d["checkpoint_interval_steps"] == round(d["checkpoint_interval_s"] / 10)
    assert len(d["scan"]) == 17
    fig = figures.goodput_vs_interval_figure(result)
    names = [trace.name for trace in fig.data]
    assert names == ["simulated 95% CI", "simulated (mean)", "first-order model",
                     "exact (exponential)"]
    assert len(fig.layout.shapes) == 2                    # Young-Daly and optimum markers
    young = lr.simulate_long_run(gpus=1024, days=5, profile=profile, responses=FIXED,
                                 checkpoint_interval="young-daly", seeds=5)
    assert young.checkpoint_interval_s == pytest.approx(math.sqrt(2 * 60 * MTBF_S))


# ---------------------------------------------------------------------------- blast radius


def test_switch_failure_takes_down_nodes_per_leaf():
    profile = {"classes": {"leaf": {"rate_per_unit_hour": 2e-3, "unit": "switch",
                                    "blast": "switch", "repair_hours": 6}}}
    result = lr.simulate_long_run(gpus=16384, days=20, profile=profile, responses=FIXED,
                                  checkpoint_interval="30min", seeds=50, seed=2)
    r = result.runs
    assert result.setup.units.switches == 512
    events = r["interruptions"][:, 0] + r["absorbed"][:, 0]
    np.testing.assert_array_equal(r["nodes_to_repair"][:, 0], 32 * events)
    # Rate per switch x 512 rail leaves x 20 days.
    assert events.mean() == pytest.approx(2e-3 * 512 * 480, rel=0.05)
    # A fat tree with the same nodes per leaf has 8x fewer leaves, so 8x fewer failures.
    fat = lr.simulate_long_run(gpus=16384, days=20, profile=profile, responses=FIXED,
                               checkpoint_interval="30min", seeds=50, seed=2,
                               overrides={"fabric.topology": "fat-tree"})
    assert fat.setup.units.switches == 64
    fat_events = fat.runs["interruptions"][:, 0] + fat.runs["absorbed"][:, 0]
    assert fat_events.mean() == pytest.approx(events.mean() / 8, rel=0.15)


def test_wait_for_repair_waits_the_repair_time():
    """Rare failures, constant repair time: each interruption of a 'wait' job waits
    repair - detection for its node; hot spares never wait."""
    profile = {"classes": {"gpu": {"rate_per_unit_hour": 1e-5, "blast": "node",
                                   "repair_hours": 2}}}
    common = dict(gpus=64, days=365, profile=profile, checkpoint_interval="1h", seeds=400,
                  seed=4)
    responses = {**FIXED, "repair_distribution": "constant"}
    wait = lr.simulate_long_run(policy="wait", responses=responses, **common)
    spares = lr.simulate_long_run(policy="spares", responses=responses, **common)
    n_wait = wait.runs["interruptions"].sum()
    assert n_wait > 1000
    per_interruption = wait.runs["wait_s"].sum() / n_wait
    assert per_interruption == pytest.approx(2 * 3600 - 120, rel=0.01)
    assert spares.runs["wait_s"].sum() == 0
    assert spares.to_dict()["goodput"]["mean"] > wait.to_dict()["goodput"]["mean"]
    # Same failure histories (common random numbers): identical failures; a few of them
    # strike while the waiting job is down (absorbed) instead of interrupting it.
    np.testing.assert_array_equal(spares.runs["interruptions"] + spares.runs["absorbed"],
                                  wait.runs["interruptions"] + wait.runs["absorbed"])
    assert wait.runs["absorbed"].sum() > spares.runs["absorbed"].sum()
    _buckets_add_up(wait.runs)


def test_spare_pool_sits_between_hot_spares_and_waiting():
    common = dict(gpus=1024, days=30, model="llama3-70b", checkpoint_interval="1h", seeds=100,
                  seed=5)
    unlimited = lr.simulate_long_run(**common).to_dict()
    pool = lr.simulate_long_run(spare_nodes=1, **common).to_dict()
    none = lr.simulate_long_run(spare_nodes=0, **common).to_dict()
    wait = lr.simulate_long_run(policy="wait", **common).to_dict()
    g = [d["goodput"]["mean"] for d in (unlimited, pool, none)]
    assert g[0] > g[1] > g[2]
    assert sum(unlimited["gpu_hours"]["wait_repair"].values()) == 0
    assert sum(pool["gpu_hours"]["wait_repair"].values()) > 0
    # An empty spare pool is waiting for repair.
    for key in ("goodput", "interruptions", "gpu_hours"):
        assert none[key] == wait[key]


def test_elastic_shrink_runs_degraded_instead_of_waiting():
    common = dict(gpus=1024, days=30, model="llama3-70b", checkpoint_interval="1h", seeds=100,
                  seed=6, gpus_per_replica=64)
    elastic = lr.simulate_long_run(policy="elastic", **common)
    wait = lr.simulate_long_run(policy="wait", **common)
    de, dw = elastic.to_dict(), wait.to_dict()
    assert sum(de["gpu_hours"]["wait_repair"].values()) == 0
    assert de["gpu_hours"]["degraded"] > 0
    assert de["goodput"]["mean"] > dw["goodput"]["mean"]
    # One node lost = one 64-GPU replica of 16: the job never runs below 15/16 per outstanding
    # repair, and runs full again after repairs.
    assert elastic.runs["min_phi"].min() < 1
    assert np.all(np.isin(np.round(elastic.runs["min_phi"] * 16), np.arange(1, 17)))
    _buckets_add_up(elastic.runs)


# ---------------------------------------------------------------------------- checkpoints


def test_async_checkpoint_reduces_overhead():
    common = dict(gpus=16384, days=10, model="llama3-405b", checkpoint_interval="10min",
                  seeds=50, seed=8)
    sync = lr.simulate_long_run(checkpoint_mode="sync", **common)
    asyn = lr.simulate_long_run(checkpoint_mode="async", **common)
    assert asyn.setup.costs.blocking_s < sync.setup.costs.blocking_s
    assert asyn.to_dict()["gpu_hours"]["checkpoint"] < \
        0.5 * sync.to_dict()["gpu_hours"]["checkpoint"]
    assert asyn.to_dict()["goodput"]["mean"] > sync.to_dict()["goodput"]["mean"]


def test_failure_free_run_is_exact():
    """No failures: wall = target compute + one blocking save per completed interval."""
    profile = {"classes": {"none": {"rate_per_unit_hour": 0.0}}}
    step_s, tokens_per_step, steps = 5.0, 4e6, 100_000
    result = lr.simulate_long_run(gpus=512, tokens=steps * tokens_per_step, profile=profile,
                                  checkpoint_interval=3600, step_time_s=step_s,
                                  tokens_per_step=tokens_per_step, seeds=3,
                                  checkpoint_mode="sync", checkpoint_bytes="2TB")
    work = steps * step_s
    saves = math.ceil(work / 3600) - 1
    expected_days = (work + saves * result.setup.costs.blocking_s) / 86400
    d = result.to_dict()
    assert d["days_to_train"]["mean"] == pytest.approx(expected_days, rel=1e-12)
    assert d["days_to_train"]["failure_free_days"] == pytest.approx(work / 86400)
    assert d["interruptions_mean"] == 0
    assert d["goodput"]["mean"] == pytest.approx(work / (expected_days * 86400))


def test_days_to_train_with_failures_follows_goodput():
    common = dict(gpus=16384, model="llama3-405b", checkpoint_interval="10min", seeds=100,
                  seed=9, step_time_s=20.0, tokens_per_step=16e6)
    tokens = 2e12                             # 2,500 steps per ... 125,000 steps = 29 days
    run = lr.simulate_long_run(tokens=tokens, **common).to_dict()
    horizon = lr.simulate_long_run(days=30, **common).to_dict()
    free_days = tokens / 16e6 * 20 / 86400
    assert run["days_to_train"]["failure_free_days"] == pytest.approx(free_days)
    assert run["days_to_train"]["unfinished_runs"] == 0
    assert run["days_to_train"]["mean"] == pytest.approx(free_days / horizon["goodput"]["mean"],
                                                         rel=0.01)


# ---------------------------------------------------------------------------- processes


def test_weibull_failures_keep_their_mean_and_cluster():
    """Weibull k=0.7 with the exponential's mean: same mean count (renewal theorem) but
    overdispersed counts (variance/mean ~ CV^2 = 1.96); exponential: Poisson (ratio 1)."""
    counts = {}
    for dist, shape in (("exponential", 1.0), ("weibull", 0.7)):
        profile = {"classes": {"sw": {"rate_per_unit_hour": 0.5, "unit": "job",
                                      "blast": "restart", "distribution": dist,
                                      "weibull_shape": shape}}}
        result = lr.simulate_long_run(gpus=8, days=30, profile=profile, responses=FIXED,
                                      checkpoint_interval="30min", seeds=1000, seed=10)
        r = result.runs
        counts[dist] = r["interruptions"][:, 0] + r["absorbed"][:, 0]
    for dist in counts:
        assert counts[dist].mean() == pytest.approx(0.5 * 720, rel=0.02)
    assert counts["exponential"].var() / counts["exponential"].mean() == pytest.approx(1, abs=0.15)
    cv2 = math.gamma(1 + 2 / 0.7) / math.gamma(1 + 1 / 0.7) ** 2 - 1
    assert counts["weibull"].var() / counts["weibull"].mean() == pytest.approx(cv2, rel=0.2)


def test_same_seed_same_result_other_seed_differs():
    common = dict(gpus=2048, days=7, model="llama3-70b", checkpoint_interval="20min",
                  seeds=30, policy="wait")
    a = lr.simulate_long_run(seed=11, **common).to_dict()
    b = lr.simulate_long_run(seed=11, **common).to_dict()
    c = lr.simulate_long_run(seed=12, **common).to_dict()
    assert a == b
    assert a["interruptions"] != c["interruptions"]


def test_frames():
    result = lr.simulate_long_run(gpus=1024, days=10, model="llama3-70b",
                                  checkpoint_interval="1h", seeds=20)
    inter = result.interruptions_frame()
    assert list(inter.index) == list(result.class_names)
    assert {"mean", "ci95_lo", "ci95_hi", "expected_failures"} <= set(inter.columns)
    hours = result.gpu_hours_frame()
    assert "(checkpoints)" in hours.index and "total" in hours.columns
    d = result.to_dict()
    lost = sum(d["gpu_hours_lost_by_cause"].values()) + d["gpu_hours"]["checkpoint"]
    assert hours["total"].sum() == pytest.approx(lost)
    assert d["gpu_hours"]["total"] == pytest.approx(d["gpu_hours"]["useful"] + lost)
    assert len(result.runs_frame()) == 20
    assert "goodput" in result.summary_frame().index


# ---------------------------------------------------------------------------- errors


def test_bad_inputs():
    base = dict(gpus=64, model="llama3-8b")
    _one_line_error(lambda: lr.simulate_long_run(days=1, profile="nope", **base), "profile",
                    "'nope'", "llama3-h100")
    _one_line_error(lambda: lr.simulate_long_run(days=1, checkpoint_interval=-60, **base),
                    "checkpoint_interval", "-60")
    _one_line_error(lambda: lr.simulate_long_run(**base), "days", "tokens")
    _one_line_error(lambda: lr.simulate_long_run(days=1, tokens=1e9, **base), "days", "tokens")
    _one_line_error(lambda: lr.simulate_long_run(tokens=1e9, **base), "tokens", "step_time_s")
    _one_line_error(lambda: lr.simulate_long_run(days=-1, **base), "days", "-1")
    _one_line_error(lambda: lr.parse_tokens("lots"), "tokens", "'lots'", "15.6T")
    _one_line_error(lambda: lr.parse_tokens(-5), "tokens", "-5")
    assert lr.parse_tokens("15.6T") == pytest.approx(15.6e12)
    assert lr.parse_tokens("2B") == 2e9 and lr.parse_tokens(1e9) == 1e9
    _one_line_error(lambda: lr.simulate_long_run(days=1, seeds=0, **base), "seeds", "0")
    _one_line_error(lambda: lr.simulate_long_run(days=1, policy="hope", **base), "policy",
                    "'hope'", "spares, wait, elastic")
    _one_line_error(lambda: lr.simulate_long_run(days=1, checkpoint_mode="lazy", **base),
                    "checkpoint_mode", "sync, async")
    _one_line_error(lambda: lr.simulate_long_run(days=1, gpus=12, model="llama3-8b"),
                    "gpus", "12")
    _one_line_error(lambda: lr.simulate_long_run(days=1, gpus=64), "checkpoint_bytes")
    _one_line_error(lambda: lr.simulate_long_run(days=1, policy="elastic", gpus_per_replica=64,
                                                 **base), "elastic", "replicas")
    _one_line_error(lambda: lr.simulate_long_run(days=1, gpus_per_replica=48, **base),
                    "gpus_per_replica", "48")
    _one_line_error(lambda: lr.goodput_vs_interval(intervals=["auto"], days=1, **base),
                    "intervals", "'auto'")


def test_failures_api_simulates_the_step_first():
    """The entry point of `trainsim failures`: model + plan -> step -> long run."""
    result = trainsim.failures("llama3-8b", cluster="dgx-h100", gpus=64, tp=2, pp=1,
                               global_batch=64, seq_len=4096, tokens=2e10, seeds=10,
                               checkpoint_interval="30min")
    d = result.to_dict()
    inputs = d["inputs"]
    assert inputs["model"] == "llama3-8b"
    assert inputs["tokens_per_step"] == 64 * 4096
    assert inputs["gpus_per_replica"] == 2
    assert inputs["step_time_s"] > 0
    assert d["checkpoint_interval_s"] == pytest.approx(
        d["checkpoint_interval_steps"] * inputs["step_time_s"])
    assert d["days_to_train"]["mean"] >= d["days_to_train"]["failure_free_days"]
