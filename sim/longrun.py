"""Long training runs with failures, checkpoints and restarts: Monte-Carlo over seeds.

What it answers: "How often will a 16k-GPU job die, how much does it lose, how often should it
checkpoint, and how many days will T tokens take?" The failure model, the responses and the
closed forms are in :mod:`strategies.failures`; this module runs them.

How a run goes (one Monte-Carlo run = one seed)
-----------------------------------------------
The job alternates between *running* and *down*:

* running: ``W`` seconds of training compute, then a save that blocks for ``C`` seconds
  (``W`` = the checkpoint interval); an asynchronous save is durable ``U`` seconds after its
  blocking part. Elastic jobs run at ``phi`` = alive replicas / replicas.
* a failure of class *c* (the earliest of the classes' next arrivals) kills the job: work
  since the last durable checkpoint is lost; its blast radius sends 0, 1 or
  ``nodes_per_switch`` nodes to repair;
* down: detection (``detection_s`` of the class; failures meanwhile are *absorbed*: counted
  apart, their nodes go to repair, they cause no new interruption),
  then waiting for nodes if the policy needs them (``wait``, an empty spare pool), then the
  restart (``reinit_s`` + reload); a failure during the restart is a new interruption;
* the run ends at the horizon (``days``) or when the useful work reaches the tokens asked for.

Accounting, in job-seconds (wall seconds of the whole job; x GPUs / 3600 = GPU-hours), adds up
to the wall time of every run: useful + lost work + checkpoint + detection + restart + waiting
for repair + degraded (the idle share of an elastic job). Goodput (effective training time
ratio) = useful / wall. Work done since the last checkpoint when the horizon ends counts as
useful.

Failure arrivals are pre-drawn per seed and class in operational time (common random numbers):
the same seed gives the same failures whatever the checkpoint interval, so a scan over
intervals compares them on identical failure histories, and the same seed gives identical
results (numpy ``Generator`` with ``PCG64``, streams spawned from ``SeedSequence(seed)``).

Vectorisation: every iteration of the event loop handles the next event of every unfinished
run with numpy; a scan runs all (interval, seed) pairs in one loop. Between failures a run is
periodic, so the work and checkpoint time of a running phase are closed-form (no event per
checkpoint).

Outputs (:class:`LongRunResult`): interruptions by cause (mean, 95 % CI of the mean by the
normal approximation), goodput with CI and the 5th-95th percentile across runs, GPU-hours lost
by cause and kind, days to train the tokens, the checkpoint interval chosen (Young-Daly and the
simulated optimum), the resolved inputs; pandas views. The figure of goodput against the
checkpoint interval is :func:`trainsim.figures.goodput_vs_interval_figure`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from hardware.catalog import load_cluster
from hardware.spec import ClusterSpec
from strategies import failures as fl
from strategies.failures import (
    CheckpointCosts,
    FailureProfile,
    JobUnits,
    Responses,
)
from strategies.model_spec import ModelSpec

__all__ = [
    "LongRunResult",
    "LongRunSetup",
    "SCAN_FACTORS",
    "goodput_vs_interval",
    "parse_tokens",
    "prepare_long_run",
    "simulate_long_run",
]

SECONDS_PER_DAY = 86400.0
#: Multiples of the Young-Daly interval that ``checkpoint_interval="auto"`` scans.
SCAN_FACTORS = tuple(float(x) for x in 2.0 ** np.linspace(-2.0, 2.0, 17))
#: Default cap of a run to a token target, days (a run that does not finish by then is
#: reported as unfinished).
MAX_DAYS = 3650.0
#: z of a two-sided 95 % normal interval.
_Z95 = 1.959963984540054

_RUN, _DOWN, _DONE = 0, 1, 2
_UNIT_INDEX = {u: i for i, u in enumerate(fl.UNITS)}


# --------------------------------------------------------------------------- set-up


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
        return sum(r * _detection(c, self.responses) for c, r in
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


def _detection(cls: fl.FailureClass, responses: Responses) -> float:
    return responses.detection_s if cls.detection_s is None else cls.detection_s


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: {value!r} is not valid; give a whole number >= 1")
    return int(value)


def _positive(name: str, value: object) -> float:
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
    return _positive("tokens", value)


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
        days = _positive("days", days)
    max_days = _positive("max_days", max_days)
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
        step_time_s = _positive("step_time_s", step_time_s)
    if tokens_per_step is not None:
        tokens_per_step = _positive("tokens_per_step", tokens_per_step)
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
        size = fl.checkpoint_bytes_for(model_spec) if model_spec is not None else 0
    else:
        from hardware.units import parse_size_bytes
        size = parse_size_bytes(checkpoint_bytes, field="checkpoint_bytes")
    costs = fl.checkpoint_costs(checkpoint_bytes=size, mode=checkpoint_mode, units=units,
                                cluster=spec, responses=resp)

    # Replica size for elastic shrink.
    if gpus_per_replica is None:
        gpus_per_replica = resp.gpus_per_replica
    if gpus_per_replica is None and plan:
        gpus_per_replica = int(plan["tp"]) * int(plan["pp"]) * int(plan.get("cp", 1))
    if gpus_per_replica is None:
        gpus_per_replica = units.gpus_per_node
    gpus_per_replica = _positive_int("gpus_per_replica", gpus_per_replica)
    if units.gpus % gpus_per_replica:
        raise ValueError(f"gpus_per_replica: {gpus_per_replica} does not divide the job's "
                         f"{units.gpus} GPUs; give tp*pp*cp of the plan")
    if resp.policy == "elastic" and units.gpus // gpus_per_replica < 2:
        raise ValueError(f"policy: 'elastic' needs at least 2 data-parallel replicas, the job "
                         f"has {units.gpus // gpus_per_replica}; valid: spares, wait")
    return LongRunSetup(cluster=spec, units=units, profile=prof, responses=resp, costs=costs,
                        gpus_per_replica=gpus_per_replica, days=days, tokens=tokens,
                        step_time_s=step_time_s, tokens_per_step=tokens_per_step,
                        max_days=max_days, model=model_name)


# --------------------------------------------------------------------------- engine


class _Stream:
    """Random numbers drawn per seed in fixed-size chunks, so that a (seed, index) pair
    always gets the same number however far other runs have read (common random numbers)."""

    def __init__(self, seed_seq: np.random.SeedSequence, n_seeds: int, chunk: int, draw):
        self._gen = np.random.Generator(np.random.PCG64(seed_seq))
        self._n, self._chunk, self._draw = n_seeds, max(16, int(chunk)), draw
        self.data = self._draw(self._gen, (n_seeds, self._chunk))

    def take(self, seeds: np.ndarray, index: np.ndarray) -> np.ndarray:
        if index.size:
            need = int(index.max()) + 1
            while need > self.data.shape[1]:
                more = self._draw(self._gen, (self._n, self._chunk))
                self.data = np.concatenate([self.data, more], axis=1)
        return self.data[seeds, index]


def _draw_exponential(gen, size):
    return np.maximum(gen.exponential(1.0, size), 1e-300)


def _weibull_draw(shape: float):
    scale = 1.0 / math.gamma(1.0 + 1.0 / shape)

    def draw(gen, size):
        return np.maximum(gen.weibull(shape, size) * scale, 1e-300)
    return draw


def _draw_ones(gen, size):
    return np.ones(size)


def _time_to_work(compute_s: np.ndarray, w: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Wall seconds from a running phase's start until ``compute_s`` of compute is done,
    with a save of ``p - w`` after every ``w``."""
    compute_s = np.maximum(compute_s, 0.0)
    full = np.maximum(np.ceil(compute_s / w) - 1.0, 0.0)
    return full * p + (compute_s - full * w)


def _run_engine(s: LongRunSetup, intervals_s: np.ndarray, n_seeds: int, seed: int
                ) -> dict[str, np.ndarray]:
    """Simulate ``n_seeds`` runs for each interval; arrays shaped (intervals, seeds, ...)."""
    intervals_s = np.asarray(intervals_s, dtype=float)
    n_cfg = intervals_s.size
    n = n_cfg * n_seeds
    seed_of = np.tile(np.arange(n_seeds), n_cfg)
    w = np.repeat(intervals_s, n_seeds)
    cb, up = s.costs.blocking_s, s.costs.upload_s
    p = w + cb
    classes = s.profile.classes
    nc = len(classes)
    units = s.units
    resp = s.responses
    base = np.array([c.rate_per_unit_hour / 3600.0 for c in classes])
    kind = np.array([_UNIT_INDEX[c.unit] for c in classes])
    blast = np.array([units.blast_nodes(c.blast) for c in classes], dtype=float)
    repair_mean = np.array([(resp.repair_hours if c.repair_hours is None else c.repair_hours)
                            * 3600.0 for c in classes])
    detect = np.array([_detection(c, resp) for c in classes])
    restart_s = s.costs.restart_s
    horizon = s.horizon_s
    target = s.target_work_s
    policy = resp.policy
    gpr, gpn = s.gpus_per_replica, units.gpus_per_node
    replicas = units.gpus // gpr
    if policy == "elastic":
        weight = np.where(blast > 0, np.minimum(np.ceil(blast * gpn / gpr), replicas), 0.0)
        cap = replicas - 1
    elif policy == "wait":
        weight, cap = blast, 0
    else:
        weight, cap = blast, (resp.spare_nodes if resp.spare_nodes is not None else math.inf)
    use_queue = math.isfinite(cap)

    unit_counts = np.array([units.gpus, units.nodes, units.switches, 1], dtype=float)
    unit_now = np.tile(unit_counts, (n, 1))
    rates = base[None, :] * unit_now[:, kind]

    # Random streams: one per class (arrivals in operational time), one for repairs.
    children = np.random.SeedSequence(seed).spawn(nc + 1)
    span_s = horizon if target is None else 2.0 * target
    expected = base * unit_counts[kind] * span_s
    streams = []
    for c, cls, ex, ch in zip(range(nc), classes, expected, children):
        draw = (_weibull_draw(cls.weibull_shape)
                if cls.distribution == "weibull" and cls.weibull_shape != 1.0
                else _draw_exponential)
        streams.append(_Stream(ch, n_seeds, min(ex * 1.2 + 5 * math.sqrt(ex) + 16, 1e5), draw))
    rep_stream = _Stream(children[nc], n_seeds, 64,
                         _draw_exponential if resp.repair_distribution == "exponential"
                         else _draw_ones)

    # State.
    t = np.zeros(n)
    phase = np.full(n, _RUN, dtype=np.int8)
    run_start = np.zeros(n)
    saved = np.zeros(n)
    phi = np.ones(n)
    rem = np.empty((n, nc))
    ptr = np.zeros((n, nc), dtype=np.int64)
    for c in range(nc):
        rem[:, c] = streams[c].take(seed_of, ptr[:, c])
    ptr += 1
    cause = np.zeros(n, dtype=np.int64)
    down_start = np.zeros(n)
    restart_begin = np.zeros(n)
    restart_end = np.zeros(n)
    rep_t = np.full((n, 4), -np.inf)
    rep_w = np.zeros((n, 4))
    rep_ptr = np.zeros(n, dtype=np.int64)
    # Accounting (job-seconds unless noted).
    useful = np.zeros(n)
    lost = np.zeros((n, nc))
    detect_acc = np.zeros((n, nc))
    restart_acc = np.zeros((n, nc))
    wait_acc = np.zeros((n, nc))
    ckpt = np.zeros(n)
    degraded = np.zeros(n)
    interruptions = np.zeros((n, nc), dtype=np.int64)
    absorbed = np.zeros((n, nc), dtype=np.int64)
    nodes_repair = np.zeros((n, nc))
    checkpoints = np.zeros(n)
    finished = np.zeros(n, dtype=bool)
    min_phi = np.ones(n)

    def add_repairs(g, c, t0):
        nonlocal rep_t, rep_w
        sel = blast[c] > 0
        g, c, t0 = g[sel], c[sel], t0[sel]
        if g.size == 0:
            return
        dur = repair_mean[c] * rep_stream.take(seed_of[g], rep_ptr[g])
        rep_ptr[g] += 1
        free = rep_t[g] <= t0[:, None]
        if not free.any(axis=1).all():
            width = rep_t.shape[1]
            rep_t = np.concatenate([rep_t, np.full((n, width), -np.inf)], axis=1)
            rep_w = np.concatenate([rep_w, np.zeros((n, width))], axis=1)
            free = rep_t[g] <= t0[:, None]
        j = free.argmax(axis=1)
        rep_t[g, j] = t0 + dur
        rep_w[g, j] = weight[c]

    def outstanding(g, t0):
        return (rep_w[g] * (rep_t[g] > t0[:, None])).sum(axis=1)

    def nodes_ready(g, t0):
        """Earliest time >= t0 when the outstanding repair weight is <= cap."""
        ready = t0.copy()
        out = outstanding(g, t0)
        need = out > cap
        if need.any():
            gn = g[need]
            times = np.where(rep_t[gn] > t0[need][:, None], rep_t[gn], np.inf)
            order = np.argsort(times, axis=1)
            ts = np.take_along_axis(times, order, axis=1)
            ws = np.take_along_axis(np.where(np.isfinite(times), rep_w[gn], 0.0), order, axis=1)
            remaining = out[need][:, None] - np.cumsum(ws, axis=1)
            j = np.argmax(remaining <= cap + 1e-9, axis=1)
            ready[need] = ts[np.arange(gn.size), j]
        return ready

    def interrupt(g, c, tf):
        interruptions[g, c] += 1
        nodes_repair[g, c] += blast[c]
        if use_queue:
            add_repairs(g, c, tf)
            ready = nodes_ready(g, tf)
        else:
            ready = tf
        cause[g] = c
        down_start[g] = tf
        restart_begin[g] = np.maximum(tf + detect[c], ready)
        restart_end[g] = restart_begin[g] + restart_s
        phase[g] = _DOWN

    def charge_down(g, until):
        c = cause[g]
        ds = down_start[g]
        det_end = ds + detect[c]
        det_part = np.minimum(until, det_end) - ds
        wait_part = np.maximum(np.minimum(until, restart_begin[g]) - det_end, 0.0)
        rest = np.maximum(until - ds - det_part - wait_part, 0.0)
        detect_acc[g, c] += det_part
        wait_acc[g, c] += wait_part
        restart_acc[g, c] += rest

    while True:
        act = np.flatnonzero(phase != _DONE)
        if act.size == 0:
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            tn = t[act, None] + np.where(rates[act] > 0, rem[act] / rates[act], np.inf)
        cls = tn.argmin(axis=1)
        tf = tn[np.arange(act.size), cls]
        new_t = t[act].copy()
        fired_rows, fired_cls = [], []
        elastic_rows = None
        ph = phase[act]

        # ---- running
        m = ph == _RUN
        if m.any():
            g, f, c = act[m], tf[m], cls[m]
            wg, pg, fg = w[g], p[g], phi[g]
            if target is None:
                t_end = np.full(g.size, horizon)
            else:
                t_end = np.minimum(run_start[g] + _time_to_work((target - saved[g]) / fg, wg, pg),
                                   horizon)
            fail = f < t_end
            stop = np.where(fail, f, t_end)
            x = stop - run_start[g]
            k = np.floor(x / pg)
            rm = x - k * pg
            comp = k * wg + np.minimum(rm, wg)
            blk = k * cb + np.maximum(rm - wg, 0.0)
            ckpt[g] += fg * blk
            degraded[g] += (1.0 - fg) * x
            new_t[m] = stop
            if fail.any():
                gf, cf, xf = g[fail], c[fail], x[fail]
                durable = np.where(xf >= up + pg[fail], np.floor((xf - up) / pg[fail]), 0.0)
                good = durable * wg[fail]
                saved[gf] += fg[fail] * good
                checkpoints[gf] += durable
                lost[gf, cf] += fg[fail] * (comp[fail] - good)
                interrupt(gf, cf, f[fail])
                fired_rows.append(gf)
                fired_cls.append(cf)
            end = ~fail
            if end.any():
                ge = g[end]
                useful[ge] = saved[ge] + fg[end] * comp[end]
                checkpoints[ge] += k[end]
                finished[ge] = t_end[end] < horizon if target is not None else True
                phase[ge] = _DONE

        # ---- down (detection, waiting, restart)
        m = ph == _DOWN
        if m.any():
            g, f, c = act[m], tf[m], cls[m]
            rb, re = restart_begin[g], restart_end[g]
            first = np.minimum(f, re)
            hor = first >= horizon
            ab = (f < rb) & ~hor
            it = (f >= rb) & (f < re) & ~hor
            dn = (re <= f) & ~hor
            if ab.any():
                ga, ca, fa = g[ab], c[ab], f[ab]
                absorbed[ga, ca] += 1
                nodes_repair[ga, ca] += blast[ca]
                if use_queue:
                    add_repairs(ga, ca, fa)
                    restart_begin[ga] = np.maximum(restart_begin[ga], nodes_ready(ga, fa))
                    restart_end[ga] = restart_begin[ga] + restart_s
                new_t[np.flatnonzero(m)[ab]] = fa
                fired_rows.append(ga)
                fired_cls.append(ca)
            if it.any():
                gi, ci, fi = g[it], c[it], f[it]
                charge_down(gi, fi)
                interrupt(gi, ci, fi)
                new_t[np.flatnonzero(m)[it]] = fi
                fired_rows.append(gi)
                fired_cls.append(ci)
            if dn.any():
                gd = g[dn]
                charge_down(gd, re[dn])
                phase[gd] = _RUN
                run_start[gd] = re[dn]
                new_t[np.flatnonzero(m)[dn]] = re[dn]
                if policy == "elastic":
                    elastic_rows = gd
            if hor.any():
                gh = g[hor]
                charge_down(gh, np.full(gh.size, horizon))
                useful[gh] = saved[gh]
                phase[gh] = _DONE
                new_t[np.flatnonzero(m)[hor]] = horizon

        # ---- advance operational time of every class, then redraw the classes that fired
        rem[act] -= rates[act] * (new_t - t[act])[:, None]
        t[act] = new_t
        if elastic_rows is not None:
            g = elastic_rows
            out = np.minimum(outstanding(g, restart_begin[g]), replicas - 1)
            alive = replicas - out
            phi[g] = alive / replicas
            min_phi[g] = np.minimum(min_phi[g], phi[g])
            unit_now[g, 0] = alive * gpr
            unit_now[g, 1] = alive * gpr / gpn
            rates[g] = base[None, :] * unit_now[g][:, kind]
        for g, c in zip(fired_rows, fired_cls):
            for cc in np.unique(c):
                rows = g[c == cc]
                rem[rows, cc] = streams[cc].take(seed_of[rows], ptr[rows, cc])
                ptr[rows, cc] += 1

    shape = (n_cfg, n_seeds)
    out = {
        "wall_s": t, "useful_s": useful, "checkpoint_s": ckpt, "degraded_s": degraded,
        "checkpoints": checkpoints, "finished": finished, "min_phi": min_phi,
        "lost_s": lost, "detection_s": detect_acc, "restart_s": restart_acc,
        "wait_s": wait_acc, "interruptions": interruptions, "absorbed": absorbed,
        "nodes_to_repair": nodes_repair,
    }
    return {k: v.reshape(shape + v.shape[1:]) for k, v in out.items()}


# --------------------------------------------------------------------------- statistics


def _stat(x: np.ndarray) -> dict[str, object]:
    """Mean, 95 % CI of the mean (normal approximation), sd and the 5th/95th percentiles."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, "ci95": [None, None], "sd": None, "p05": None, "p95": None, "n": 0}
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
    half = _Z95 * sd / math.sqrt(x.size)
    return {"mean": mean, "ci95": [mean - half, mean + half], "sd": sd,
            "p05": float(np.percentile(x, 5)), "p95": float(np.percentile(x, 95)),
            "n": int(x.size)}


def _clean(value: Any) -> Any:
    """JSON-ready copy: numpy scalars to Python, NaN/inf to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _goodput(runs: dict[str, np.ndarray]) -> np.ndarray:
    return runs["useful_s"] / runs["wall_s"]


def _round_to_steps(interval_s: float, step_time_s: float | None) -> float:
    if step_time_s is None:
        return interval_s
    return max(1.0, round(interval_s / step_time_s)) * step_time_s


def _feasible(interval_s: float, s: LongRunSetup) -> float:
    """An asynchronous save cannot start before the previous upload ends."""
    return max(interval_s, s.costs.upload_s, 1e-9)


def _analytic(s: LongRunSetup, interval_s: float) -> tuple[float, float]:
    """(first-order goodput, exact goodput or NaN) at ``interval_s``."""
    kw = dict(interval_s=interval_s, checkpoint_s=s.costs.blocking_s,
              detection_s=s.mean_detection_s, restart_s=s.costs.restart_s, mtbf_s=s.mtbf_s)
    first = fl.first_order_goodput(**kw, upload_s=s.costs.upload_s)
    exact = fl.expected_goodput_exponential(**kw) if s.exact_model_applies else math.nan
    return first, exact


def _scan(s: LongRunSetup, intervals: Sequence[float], seeds: int, seed: int) -> pd.DataFrame:
    grid = sorted({_round_to_steps(_feasible(float(x), s), s.step_time_s) for x in intervals})
    runs = _run_engine(s, np.array(grid), seeds, seed)
    good = _goodput(runs)
    rows = []
    for i, interval in enumerate(grid):
        st = _stat(good[i])
        first, exact = _analytic(s, interval)
        rows.append({"interval_s": interval, "goodput_mean": st["mean"],
                     "goodput_ci_lo": st["ci95"][0], "goodput_ci_hi": st["ci95"][1],
                     "goodput_p05": st["p05"], "goodput_p95": st["p95"],
                     "goodput_first_order": first, "goodput_exact": exact,
                     "interruptions_mean": float(runs["interruptions"][i].sum(axis=1).mean())})
    df = pd.DataFrame(rows)
    yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
    df.attrs.update({
        "young_daly_s": yd, "daly_s": fl.daly_interval_s(s.costs.blocking_s, s.mtbf_s),
        "simulated_optimum_s": _refined_optimum(df), "mtbf_s": s.mtbf_s,
        "checkpoint_blocking_s": s.costs.blocking_s, "restart_s": s.costs.restart_s,
        "detection_s": s.mean_detection_s, "seeds": seeds, "seed": seed,
        "exact_model": s.exact_model_applies,
    })
    return df


def _refined_optimum(df: pd.DataFrame) -> float:
    """The interval of the largest simulated goodput, refined by a parabola through it and
    its two neighbours in log(interval) (the grid point itself at an edge of the grid)."""
    x = np.log(df["interval_s"].to_numpy(float))
    y = df["goodput_mean"].to_numpy(float)
    i = int(np.argmax(y))
    if i == 0 or i == len(y) - 1:
        return float(np.exp(x[i]))
    a, b, _ = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
    if a >= 0:
        return float(np.exp(x[i]))
    return float(np.exp(np.clip(-b / (2 * a), x[i - 1], x[i + 1])))


# --------------------------------------------------------------------------- results


@dataclass
class LongRunResult:
    """Monte-Carlo result of a long run.

    Attributes:
        setup: resolved inputs.
        checkpoint_interval_s: compute seconds between saves that was simulated.
        interval: how it was chosen: ``{"requested", "young_daly_s", "daly_s",
            "simulated_optimum_s"}``.
        seeds, seed: number of runs and the base seed.
        runs: per-run arrays (see :func:`_run_engine`), first axis = run.
        scan: goodput against the interval when ``"auto"`` scanned (else None).
        embedded: what the application layer records for reproducibility (its
            resolved ``scenario`` and ``trainsim_version``); added to ``to_dict()``.
    """

    setup: LongRunSetup
    checkpoint_interval_s: float
    interval: dict[str, object]
    seeds: int
    seed: int
    runs: dict[str, np.ndarray] = field(repr=False)
    scan: pd.DataFrame | None = field(default=None, repr=False)
    embedded: dict[str, object] | None = field(default=None, repr=False)

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.setup.profile.class_names

    def _gpu_hours(self, job_seconds: np.ndarray) -> np.ndarray:
        return job_seconds * self.setup.units.gpus / 3600.0

    def goodput(self) -> np.ndarray:
        """Goodput of every run."""
        return _goodput(self.runs)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary with the resolved inputs."""
        r, names = self.runs, self.class_names
        inter = r["interruptions"]
        total = inter.sum(axis=1)
        by_cause = {name: _stat(inter[:, i]) for i, name in enumerate(names)}
        gh = {key: self._gpu_hours(r[key]) for key in
              ("lost_s", "detection_s", "restart_s", "wait_s")}
        lost_by_cause = {name: float(sum(gh[k][:, i].mean() for k in gh))
                         for i, name in enumerate(names)}
        wall_days = r["wall_s"] / SECONDS_PER_DAY
        days_to_train = None
        if self.setup.tokens is not None:
            days = np.where(r["finished"], wall_days, np.nan)
            days_to_train = {**_stat(days), "unfinished_runs": int((~r["finished"]).sum()),
                             "failure_free_days": self.setup.target_work_s / SECONDS_PER_DAY}
        first, exact = _analytic(self.setup, self.checkpoint_interval_s)
        out = {
            "interruptions_mean": float(total.mean()),
            "interruptions": _stat(total),
            "interruptions_by_cause": by_cause,
            "failures_absorbed_mean": float(r["absorbed"].sum(axis=1).mean()),
            "p_at_least_one_interruption": float((total > 0).mean()),
            "goodput": _stat(self.goodput()),
            "goodput_analytic": {"first_order": first,
                                 "exact": None if math.isnan(exact) else exact},
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "checkpoint_interval_steps": (None if self.setup.step_time_s is None else
                                          int(round(self.checkpoint_interval_s
                                                    / self.setup.step_time_s))),
            "checkpoint_interval": dict(self.interval),
            "checkpoints_mean": float(r["checkpoints"].mean()),
            "mtbf_s": self.setup.mtbf_s,
            "wall_days": _stat(wall_days),
            "gpu_hours": {
                "total": float(self._gpu_hours(r["wall_s"]).mean()),
                "useful": float(self._gpu_hours(r["useful_s"]).mean()),
                "lost_work": {n: float(gh["lost_s"][:, i].mean()) for i, n in enumerate(names)},
                "detection": {n: float(gh["detection_s"][:, i].mean())
                              for i, n in enumerate(names)},
                "restart": {n: float(gh["restart_s"][:, i].mean()) for i, n in enumerate(names)},
                "wait_repair": {n: float(gh["wait_s"][:, i].mean()) for i, n in enumerate(names)},
                "checkpoint": float(self._gpu_hours(r["checkpoint_s"]).mean()),
                "degraded": float(self._gpu_hours(r["degraded_s"]).mean()),
            },
            "gpu_hours_lost_by_cause": lost_by_cause,
            "nodes_to_repair_by_cause": {n: float(r["nodes_to_repair"][:, i].mean())
                                         for i, n in enumerate(names)},
            "days_to_train": days_to_train,
            "seeds": self.seeds,
            "seed": self.seed,
            "inputs": {**self.setup.to_dict(), "seeds": self.seeds, "seed": self.seed,
                       "checkpoint_interval": self.interval.get("requested")},
        }
        if self.scan is not None:
            out["scan"] = self.scan.to_dict(orient="records")
        return _clean({**out, **(self.embedded or {})})

    def interruptions_frame(self) -> pd.DataFrame:
        """Per cause: mean interruptions, 95 % CI, expected (rate x time), GPU-hours lost."""
        d = self.to_dict()
        rates = self.setup.profile.rates_per_hour(self.setup.units)
        wall_h = float(self.runs["wall_s"].mean()) / 3600.0
        rows = []
        for name in self.class_names:
            st = d["interruptions_by_cause"][name]
            rows.append({"cause": name, "mean": st["mean"], "ci95_lo": st["ci95"][0],
                         "ci95_hi": st["ci95"][1], "expected_failures": rates[name] * wall_h,
                         "gpu_hours_lost": d["gpu_hours_lost_by_cause"][name],
                         "nodes_to_repair": d["nodes_to_repair_by_cause"][name]})
        return pd.DataFrame(rows).set_index("cause")

    def gpu_hours_frame(self) -> pd.DataFrame:
        """GPU-hours (mean per run) by cause (rows) and kind of loss (columns)."""
        gh = self.to_dict()["gpu_hours"]
        df = pd.DataFrame({k: gh[k] for k in ("lost_work", "detection", "restart",
                                              "wait_repair")})
        df.index.name = "cause"
        df.loc["(checkpoints)"] = [gh["checkpoint"], 0.0, 0.0, 0.0]
        df.loc["(elastic shrink)"] = [gh["degraded"], 0.0, 0.0, 0.0]
        df["total"] = df.sum(axis=1)
        return df

    def runs_frame(self) -> pd.DataFrame:
        """One row per Monte-Carlo run."""
        r = self.runs
        df = pd.DataFrame({
            "wall_days": r["wall_s"] / SECONDS_PER_DAY, "goodput": self.goodput(),
            "interruptions": r["interruptions"].sum(axis=1),
            "absorbed": r["absorbed"].sum(axis=1), "checkpoints": r["checkpoints"],
            "finished": r["finished"]})
        for i, name in enumerate(self.class_names):
            df[f"interruptions_{name}"] = r["interruptions"][:, i]
        df.index.name = "run"
        return df

    def summary_frame(self) -> pd.DataFrame:
        """Headline numbers as rows of (metric, mean, ci95_lo, ci95_hi, unit) for a table."""
        d = self.to_dict()
        rows = [("interruptions", d["interruptions"], "count"),
                ("goodput", d["goodput"], "fraction")]
        if d["days_to_train"]:
            rows.append(("days_to_train", d["days_to_train"], "days"))
        out = [{"metric": m, "mean": st["mean"], "ci95_lo": st["ci95"][0],
                "ci95_hi": st["ci95"][1], "unit": unit} for m, st, unit in rows]
        out += [{"metric": "checkpoint_interval", "mean": d["checkpoint_interval_s"],
                 "ci95_lo": None, "ci95_hi": None, "unit": "s"},
                {"metric": "young_daly_interval", "mean": d["checkpoint_interval"]["young_daly_s"],
                 "ci95_lo": None, "ci95_hi": None, "unit": "s"},
                {"metric": "mtbf", "mean": d["mtbf_s"] / 3600.0, "ci95_lo": None,
                 "ci95_hi": None, "unit": "h"}]
        return pd.DataFrame(out).set_index("metric")


# --------------------------------------------------------------------------- public API


def _check_seeds(seeds: int, seed: int) -> None:
    _positive_int("seeds", seeds)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: {seed!r} is not valid; give a whole number >= 0")


def simulate_long_run(*, cluster: str | ClusterSpec = "dgx-h100", gpus: int,
                      days: float | None = None, tokens: float | str | None = None,
                      profile: str | Mapping[str, Any] | FailureProfile = "llama3-h100",
                      checkpoint_interval: str | float = "auto",
                      checkpoint_mode: str = "sync",
                      policy: str | None = None, spare_nodes: int | None = None,
                      responses: Responses | Mapping[str, Any] | None = None,
                      seeds: int = 100, seed: int = 0,
                      model: str | ModelSpec | None = None, step: Any = None,
                      step_time_s: float | None = None, tokens_per_step: float | None = None,
                      checkpoint_bytes: int | str | None = None,
                      gpus_per_replica: int | None = None,
                      overrides: Mapping[str, object] | None = None,
                      scan_seeds: int | None = None,
                      scan_factors: Sequence[float] = SCAN_FACTORS,
                      max_days: float = MAX_DAYS) -> LongRunResult:
    """Simulate a training job with failures for ``days`` (or until ``tokens``), ``seeds``
    Monte-Carlo runs.

    Args:
        cluster: preset name, preset file or spec (its fabric sets the switch blast radius).
        gpus: GPUs of the job (whole nodes).
        days: wall-clock horizon. Exactly one of ``days`` and ``tokens``.
        tokens: train until this many tokens (a number or e.g. ``"15.6T"``; needs the step
            time and tokens per step).
        profile: ``llama3-h100``, ``meta-rsc``, a TOML path, a dict or a FailureProfile.
        checkpoint_interval: seconds of compute between saves, a duration string
            (``"30min"``), ``"young-daly"`` (sqrt(2 C M)) or ``"auto"`` (scan
            ``scan_factors`` x Young-Daly on common random numbers, take the interval of the
            best simulated goodput, refined by a parabola). Rounded to whole steps when the
            step time is known.
        checkpoint_mode: ``sync`` or ``async``.
        policy: ``spares`` (hot spares), ``wait`` (for repair) or ``elastic`` (shrink DP);
            default from the responses (``spares``).
        spare_nodes: size of the spare pool with ``spares`` (default unlimited).
        responses: overrides of :class:`strategies.failures.Responses` fields.
        seeds: Monte-Carlo runs. seed: base seed (same seed -> identical results).
        model: model name or spec (checkpoint size = parameters x 14 bytes).
        step: a :class:`sim.step.StepResult` (step time, tokens per step, replica size).
        step_time_s, tokens_per_step: the step, when not from ``step``.
        checkpoint_bytes: checkpoint size (bytes or "5.7TB"), instead of the model's.
        gpus_per_replica: GPUs per data-parallel replica (elastic); default tp*pp*cp of the
            step's plan, else one node.
        overrides: dotted cluster preset keys to change.
        scan_seeds: runs per scanned interval with ``"auto"`` (default min(seeds, 200)).
        scan_factors: multiples of Young-Daly scanned by ``"auto"``.
        max_days: cap of a token run.

    Raises:
        ValueError: one line naming the bad field, its value and what is valid.
    """
    _check_seeds(seeds, seed)
    requested = fl.parse_interval(checkpoint_interval)
    s = prepare_long_run(cluster=cluster, gpus=gpus, days=days, tokens=tokens, profile=profile,
                         checkpoint_mode=checkpoint_mode, responses=responses, policy=policy,
                         spare_nodes=spare_nodes, model=model, step=step,
                         step_time_s=step_time_s, tokens_per_step=tokens_per_step,
                         checkpoint_bytes=checkpoint_bytes, gpus_per_replica=gpus_per_replica,
                         overrides=overrides, max_days=max_days)
    yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
    info: dict[str, object] = {
        "requested": requested, "young_daly_s": yd,
        "daly_s": fl.daly_interval_s(s.costs.blocking_s, s.mtbf_s),
        "simulated_optimum_s": None, "mtbf_s": s.mtbf_s,
        "checkpoint_blocking_s": s.costs.blocking_s,
    }
    scan = None
    if requested == "auto":
        if not math.isfinite(yd) or yd <= 0:
            raise ValueError(f"checkpoint_interval: 'auto' needs a finite Young-Daly interval "
                             f"(checkpoint {s.costs.blocking_s:g} s, MTBF {s.mtbf_s:g} s); "
                             "give a duration")
        factors = [_positive("scan_factors", float(f)) for f in scan_factors]
        scan = _scan(s, [yd * f for f in factors],
                     min(seeds, 200) if scan_seeds is None else _positive_int("scan_seeds",
                                                                             scan_seeds),
                     seed)
        interval = scan.attrs["simulated_optimum_s"]
        info["simulated_optimum_s"] = interval
    elif requested == "young-daly":
        if not math.isfinite(yd) or yd <= 0:
            raise ValueError(f"checkpoint_interval: 'young-daly' is {yd:g} s here (checkpoint "
                             f"{s.costs.blocking_s:g} s, MTBF {s.mtbf_s:g} s); give a duration")
        interval = yd
    else:
        interval = float(requested)
    interval = _round_to_steps(_feasible(interval, s), s.step_time_s)
    runs = _run_engine(s, np.array([interval]), seeds, seed)
    runs = {k: v[0] for k, v in runs.items()}
    return LongRunResult(setup=s, checkpoint_interval_s=interval, interval=info, seeds=seeds,
                         seed=seed, runs=runs, scan=scan)


def goodput_vs_interval(*, intervals: Sequence[float | str] | None = None, seeds: int = 100,
                        seed: int = 0, **kwargs: Any) -> pd.DataFrame:
    """Simulated goodput (mean, 95 % CI, 5th-95th percentiles) and the analytic models at
    each checkpoint interval, on common random numbers.

    ``kwargs`` are those of :func:`prepare_long_run` (cluster, gpus, days or tokens,
    profile, ...). ``intervals`` defaults to :data:`SCAN_FACTORS` x Young-Daly. The frame's
    ``attrs`` hold ``young_daly_s``, ``daly_s``, ``simulated_optimum_s``, ``mtbf_s``.
    Columns: interval_s, goodput_mean, goodput_ci_lo/hi, goodput_p05/p95,
    goodput_first_order, goodput_exact (NaN unless the exact model applies),
    interruptions_mean.
    """
    _check_seeds(seeds, seed)
    s = prepare_long_run(**kwargs)
    if intervals is None:
        yd = fl.young_daly_interval_s(s.costs.blocking_s, s.mtbf_s)
        intervals = [yd * f for f in SCAN_FACTORS]
    values = []
    for x in intervals:
        v = fl.parse_interval(x)
        if isinstance(v, str):
            raise ValueError(f"intervals: {x!r} is not valid here; give durations > 0")
        values.append(v)
    if not values:
        raise ValueError("intervals: [] is empty; give at least one duration > 0")
    return _scan(s, values, seeds, seed)
