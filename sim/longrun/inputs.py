"""The resolved inputs of a long run: the job's failing units, failure profile, responses
and checkpoint costs, the step, and the horizon (days, or a token target).

:func:`prepare_long_run` checks every input (one-line errors naming the field) and returns
a :class:`LongRunSetup`; :func:`parse_tokens` reads token counts like ``"15.6T"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hardware.catalog import load_cluster
from hardware.spec import ClusterSpec
from sim.checkpoint_costs import checkpoint_costs
from strategies import failures as fl
from strategies.failures import (
    CheckpointCosts,
    FailureProfile,
    JobUnits,
    Responses,
)
from strategies.model_spec import ModelSpec
from strategies.plan import plan_from_dict

SECONDS_PER_DAY = 86400.0
#: Default cap of a run to a token target, days (a run that does not finish by then is
#: reported as unfinished).
MAX_DAYS = 3650.0

# Bounds of what one long run may simulate. The engine steps from failure to failure,
# all seeds at once: its time is about (expected failures per run) x (3 ms + seeds x
# 2.5 us) on this project's 2-core machine (54 days of Llama 3 405B's 16,384 GPUs, ~414
# failures: 3 s for 1,000 seeds, 12 s for 10,000). Past these limits a run is refused
# in one line instead of running for hours or for ever (days = 1e308).
#: Longest horizon, days (100 years; also the largest max_days of a token run).
MAX_HORIZON_DAYS = 36_500.0
#: Most Monte-Carlo runs.
MAX_SEEDS = 100_000
#: Most failures one run may expect (horizon / job MTBF): ~5 min for one seed.
MAX_FAILURES_PER_RUN = 100_000
#: Most failures all runs together may expect (runs x failures per run): ~2.5 min.
MAX_SIMULATED_FAILURES = 50_000_000


@dataclass(frozen=True, kw_only=True)
class LongRunSetup:
    """Resolved inputs of a long run (everything but the checkpoint interval and seeds).

    Attributes:
        cluster: the cluster preset.
        units: GPUs, nodes and switches of the job.
        profile: failure classes.
        responses: detection, restart, storage, node policy.
        costs: checkpoint and restart times.
        gpus_per_replica: GPUs of one data-parallel replica (elastic shrink).
        days: horizon in days (None with tokens).
        tokens: tokens to train (None with days).
        step_time_s: seconds per step (None if unknown).
        tokens_per_step: tokens per step (None if unknown).
        max_days: cap of a token run.
        model: model name, if any.
    """

    cluster: ClusterSpec
    units: JobUnits
    profile: FailureProfile
    responses: Responses
    costs: CheckpointCosts
    gpus_per_replica: int
    days: float | None
    tokens: float | None
    step_time_s: float | None
    tokens_per_step: float | None
    max_days: float = MAX_DAYS
    model: str | None = None

    @property
    def horizon_s(self) -> float:
        return (self.days if self.days is not None else self.max_days) * SECONDS_PER_DAY

    @property
    def target_work_s(self) -> float | None:
        """Seconds of failure-free training that produce the tokens."""
        if self.tokens is None:
            return None
        return self.tokens / self.tokens_per_step * self.step_time_s

    @property
    def mtbf_s(self) -> float:
        return self.profile.mtbf_s(self.units)

    @property
    def mean_detection_s(self) -> float:
        """Detection delay averaged over classes, weighted by their rates."""
        rates = self.profile.rates_per_hour(self.units)
        total = sum(rates.values())
        if total == 0:
            return self.responses.detection_s
        return sum(r * detection_s(c, self.responses) for c, r in
                   zip(self.profile.classes, rates.values())) / total

    @property
    def exact_model_applies(self) -> bool:
        """True when :func:`strategies.failures.expected_goodput_exponential` is exact for
        this set-up: exponential classes, sync saves, no waiting for nodes, no shrink."""
        r = self.responses
        return (all(c.distribution == "exponential" or c.weibull_shape == 1.0
                    for c in self.profile.classes)
                and self.costs.upload_s == 0 and r.policy == "spares" and r.spare_nodes is None)

    def to_dict(self) -> dict[str, object]:
        u = self.units
        return {
            "cluster": self.cluster.name, "gpus": u.gpus, "nodes": u.nodes,
            "gpus_per_node": u.gpus_per_node, "switches": u.switches,
            "nodes_per_switch": u.nodes_per_switch, "fabric_topology": u.fabric_topology,
            "gpus_per_replica": self.gpus_per_replica, "model": self.model,
            "days": self.days, "tokens": self.tokens, "step_time_s": self.step_time_s,
            "tokens_per_step": self.tokens_per_step, "max_days": self.max_days,
            "profile": self.profile.to_dict(), "responses": self.responses.to_dict(),
            "checkpoint": self.costs.to_dict(), "mtbf_s": self.mtbf_s,
            "failures_per_day_by_class": {k: v * 24 for k, v in
                                          self.profile.rates_per_hour(u).items()},
        }


def detection_s(cls: fl.FailureClass, responses: Responses) -> float:
    """Seconds to detect a failure of ``cls``: its own, else the responses' default."""
    return responses.detection_s if cls.detection_s is None else cls.detection_s


def positive_int(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a one-line ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: {value!r} is not valid; give a whole number >= 1")
    return int(value)


def positive(name: str, value: object) -> float:
    """``value`` as a finite float > 0, or a one-line ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
            math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: {value!r} is not valid; give a finite number > 0")
    return float(value)


_COUNT_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_tokens(value: float | int | str) -> float:
    """A token count: a number, or a string with a decimal suffix K, M, B/G, T
    (``"15.6T"`` = 15.6e12).

    Raises:
        ValueError: naming ``tokens`` for anything else or a count <= 0.
    """
    if isinstance(value, str):
        text = value.strip().upper()
        suffix = text[-1:] if text[-1:].isalpha() else ""
        try:
            number = float(text[:-1] if suffix else text) * _COUNT_SUFFIXES[suffix]
        except (KeyError, ValueError):
            raise ValueError(f"tokens: {value!r} is not a count; give a number > 0, optionally "
                             "with a suffix K, M, B, T (e.g. 15.6T)") from None
        value = number
    return positive("tokens", value)


def prepare_long_run(*, cluster: str | ClusterSpec = "dgx-h100", gpus: int,
                     days: float | None = None, tokens: float | str | None = None,
                     profile: str | Mapping[str, Any] | FailureProfile = "llama3-h100",
                     checkpoint_mode: str = "sync",
                     responses: Responses | Mapping[str, Any] | None = None,
                     policy: str | None = None, spare_nodes: int | None = None,
                     model: str | ModelSpec | None = None, step: Any = None,
                     step_time_s: float | None = None, tokens_per_step: float | None = None,
                     checkpoint_bytes: int | str | None = None,
                     gpus_per_replica: int | None = None,
                     overrides: Mapping[str, object] | None = None,
                     max_days: float = MAX_DAYS) -> LongRunSetup:
    """Resolve and check the inputs of a long run (see :func:`simulate_long_run`)."""
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster, overrides)
    units = fl.job_units(spec, gpus)
    if (days is None) == (tokens is None):
        raise ValueError(f"days: give exactly one of days or tokens (got days={days!r}, "
                         f"tokens={tokens!r})")
    if days is not None:
        days = at_most("days", positive("days", days), MAX_HORIZON_DAYS)
    max_days = at_most("max_days", positive("max_days", max_days), MAX_HORIZON_DAYS)
    prof = fl.load_profile(profile)
    resp = fl.load_responses(responses)
    changes: dict[str, object] = {}
    if policy is not None:
        changes["policy"] = policy
    if spare_nodes is not None:
        changes["spare_nodes"] = spare_nodes
    if changes:
        resp = fl.load_responses(resp, **changes)
    fl._choice("checkpoint_mode", checkpoint_mode, fl.CHECKPOINT_MODES)

    # The step: from a StepResult, or given.
    plan = None
    model_spec = model if isinstance(model, ModelSpec) else None
    model_name = model.name if isinstance(model, ModelSpec) else model
    if step is not None:
        plan = step.inputs.get("plan") if hasattr(step, "inputs") else None
        step_time_s = step.step_time_s if step_time_s is None else step_time_s
        if tokens_per_step is None and plan:
            tokens_per_step = plan["global_batch"] * plan["seq_len"]
        model_name = model_name or step.inputs.get("model")
    if step_time_s is not None:
        step_time_s = positive("step_time_s", step_time_s)
    if tokens_per_step is not None:
        tokens_per_step = positive("tokens_per_step", tokens_per_step)
    if tokens is not None:
        tokens = parse_tokens(tokens)
        if step_time_s is None or tokens_per_step is None:
            raise ValueError("tokens: training to a token count needs the step: give a model "
                             "and plan (failures()), a StepResult (step=), or step_time_s and "
                             "tokens_per_step")

    # Checkpoint size.
    if checkpoint_bytes is None:
        if model_spec is None and isinstance(model_name, str):
            from strategies.models import load_model
            model_spec = load_model(model_name)
        overridden = resp.checkpoint_blocking_s is not None and resp.reload_s is not None
        if model_spec is None and not overridden:
            raise ValueError("checkpoint_bytes: unknown; give a model (its parameters x "
                             f"{fl.CHECKPOINT_BYTES_PER_PARAM} bytes), checkpoint_bytes, or "
                             "responses checkpoint_blocking_s and reload_s")
        # what the step's plan stores per parameter (weights, master, moments in their dtypes)
        size = (fl.checkpoint_bytes_for(model_spec, plan=plan_from_dict(plan) if plan else None)
                if model_spec is not None else 0)
    else:
        from hardware.units import parse_size_bytes
        size = parse_size_bytes(checkpoint_bytes, field="checkpoint_bytes")
    costs = checkpoint_costs(checkpoint_bytes=size, mode=checkpoint_mode, units=units,
                                cluster=spec, responses=resp)

    # Replica size for elastic shrink.
    if gpus_per_replica is None:
        gpus_per_replica = resp.gpus_per_replica
    if gpus_per_replica is None and plan:
        gpus_per_replica = int(plan["tp"]) * int(plan["pp"]) * int(plan.get("cp", 1))
    if gpus_per_replica is None:
        gpus_per_replica = units.gpus_per_node
    gpus_per_replica = positive_int("gpus_per_replica", gpus_per_replica)
    if units.gpus % gpus_per_replica:
        raise ValueError(f"gpus_per_replica: {gpus_per_replica} does not divide the job's "
                         f"{units.gpus} GPUs; give tp*pp*cp of the plan")
    if resp.policy == "elastic" and units.gpus // gpus_per_replica < 2:
        raise ValueError(f"policy: 'elastic' needs at least 2 data-parallel replicas, the job "
                         f"has {units.gpus // gpus_per_replica}; valid: spares, wait")
    setup = LongRunSetup(cluster=spec, units=units, profile=prof, responses=resp, costs=costs,
                         gpus_per_replica=gpus_per_replica, days=days, tokens=tokens,
                         step_time_s=step_time_s, tokens_per_step=tokens_per_step,
                         max_days=max_days, model=model_name)
    expected_failures(setup)  # refuse a run too long to simulate now, not after hours
    return setup


def expected_failures(setup: LongRunSetup, seeds: int = 1) -> float:
    """Failures ``seeds`` runs of ``setup`` expect over the horizon (horizon / MTBF each).

    Raises:
        ValueError: past :data:`MAX_FAILURES_PER_RUN` per run or
            :data:`MAX_SIMULATED_FAILURES` for all runs (one line saying what to lower).
    """
    per_run = setup.horizon_s / setup.mtbf_s  # 0 when nothing fails (MTBF infinite)
    horizon = f"{setup.horizon_s / SECONDS_PER_DAY:g} days"
    if per_run > MAX_FAILURES_PER_RUN:
        raise ValueError(f"days: the job expects {_count(per_run)} failures in {horizon} (MTBF "
                         f"{setup.mtbf_s:.3g} s); valid: at most {MAX_FAILURES_PER_RUN:,} "
                         "per run; give fewer days or a lower failure rate")
    if per_run * seeds > MAX_SIMULATED_FAILURES:
        raise ValueError(f"seeds: {seeds:,} runs of {_count(per_run)} expected failures each "
                         f"exceed the {MAX_SIMULATED_FAILURES:,} failures one simulation may "
                         f"take; valid: at most {int(MAX_SIMULATED_FAILURES // max(per_run, 1)):,}"
                         " seeds here, or fewer days")
    return per_run * seeds


def _count(value: float) -> str:
    return f"{value:,.0f}" if value < 1e12 else f"{value:.3g}"


def at_most(name: str, value: float, limit: float) -> float:
    """``value`` if it is at most ``limit``, or a one-line ValueError naming ``name``."""
    if value > limit:
        raise ValueError(f"{name}: {value!r} is not valid; give at most {limit:g}")
    return value
