"""The vectorised long-run engine: many Monte-Carlo runs of a job that fails, at once.

A run alternates between *running* (``w`` seconds of compute, then a save blocking ``C``
seconds; period ``p = w + C``) and *down* (detection, waiting for nodes, restart). Every
iteration of :meth:`LongRunEngine.run` handles the next event of every unfinished run
with numpy: the earliest next failure of any class (arrival gaps in operational time,
:mod:`sim.longrun.arrivals`), or the end of the running phase, of the restart or of the
horizon. Between failures a run is periodic, so the work and save time of a running phase
are closed-form (no event per checkpoint). One engine runs every (interval, seed) pair of
a scan in the same loop.

State lives in explicit objects: :class:`ClassTable` (what each failure class does, fixed),
:class:`RepairQueue` (repairs in progress per run), :class:`RunState` (clock, phase and
pending arrivals per run) and :class:`Accounts` (where each run's job-seconds went).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.longrun.arrivals import CommonRandomStream, FailureArrivals
from sim.longrun.inputs import LongRunSetup, detection_s
from strategies import failures as fl

#: Phases of a run.
RUN, DOWN, DONE = 0, 1, 2
#: Column of each failing unit (gpu, node, switch, job) in the unit-count arrays.
UNIT_INDEX = {u: i for i, u in enumerate(fl.UNITS)}


@dataclass(frozen=True)
class ClassTable:
    """What each failure class does, one entry per class (arrays).

    Attributes:
        rate_per_unit_s: failures per second per failing unit.
        unit: column of the class's unit in the unit counts (:data:`UNIT_INDEX`).
        blast_nodes: nodes a failure sends to repair.
        repair_mean_s: mean repair time.
        detection_s: time to detect a failure.
        repair_weight: what a repair holds back: nodes, or replicas for ``elastic``.
        cap: outstanding repair weight the job runs with (spare nodes; inf: unlimited).
    """

    rate_per_unit_s: np.ndarray
    unit: np.ndarray
    blast_nodes: np.ndarray
    repair_mean_s: np.ndarray
    detection_s: np.ndarray
    repair_weight: np.ndarray
    cap: float

    @classmethod
    def of(cls, s: LongRunSetup) -> ClassTable:
        """The table of a set-up (its profile, job units and responses)."""
        classes, units, resp = s.profile.classes, s.units, s.responses
        blast = np.array([units.blast_nodes(c.blast) for c in classes], dtype=float)
        replicas = units.gpus // s.gpus_per_replica
        if resp.policy == "elastic":
            weight = np.where(blast > 0, np.minimum(np.ceil(
                blast * units.gpus_per_node / s.gpus_per_replica), replicas), 0.0)
            cap = replicas - 1
        elif resp.policy == "wait":
            weight, cap = blast, 0
        else:
            weight, cap = blast, (resp.spare_nodes if resp.spare_nodes is not None
                                  else math.inf)
        return cls(rate_per_unit_s=np.array([c.rate_per_unit_hour / 3600.0 for c in classes]),
                   unit=np.array([UNIT_INDEX[c.unit] for c in classes]),
                   blast_nodes=blast,
                   repair_mean_s=np.array([(resp.repair_hours if c.repair_hours is None
                                            else c.repair_hours) * 3600.0 for c in classes]),
                   detection_s=np.array([detection_s(c, resp) for c in classes]),
                   repair_weight=weight, cap=cap)


class RepairQueue:
    """Repairs in progress, per run: when each ends and the weight it holds back.

    Args:
        runs: number of runs (rows).
        table: the failure classes.
        stream: repair-time multipliers (common random numbers per seed).
        seed_of: the seed of each run.
    """

    def __init__(self, runs: int, table: ClassTable, stream: CommonRandomStream,
                 seed_of: np.ndarray) -> None:
        self.ends = np.full((runs, 4), -np.inf)
        self.weights = np.zeros((runs, 4))
        self.drawn = np.zeros(runs, dtype=np.int64)
        self._table, self._stream, self._seed_of = table, stream, seed_of

    def add(self, g: np.ndarray, c: np.ndarray, t0: np.ndarray) -> None:
        """Start the repairs of failures of classes ``c`` in runs ``g`` at times ``t0``
        (classes that send no node to repair start none)."""
        sel = self._table.blast_nodes[c] > 0
        g, c, t0 = g[sel], c[sel], t0[sel]
        if g.size == 0:
            return
        dur = self._table.repair_mean_s[c] * self._stream.take(self._seed_of[g], self.drawn[g])
        self.drawn[g] += 1
        free = self.ends[g] <= t0[:, None]
        if not free.any(axis=1).all():
            runs, width = self.ends.shape
            self.ends = np.concatenate([self.ends, np.full((runs, width), -np.inf)], axis=1)
            self.weights = np.concatenate([self.weights, np.zeros((runs, width))], axis=1)
            free = self.ends[g] <= t0[:, None]
        j = free.argmax(axis=1)
        self.ends[g, j] = t0 + dur
        self.weights[g, j] = self._table.repair_weight[c]

    def outstanding(self, g: np.ndarray, t0: np.ndarray) -> np.ndarray:
        """Weight still in repair at ``t0`` in runs ``g``."""
        return (self.weights[g] * (self.ends[g] > t0[:, None])).sum(axis=1)

    def ready(self, g: np.ndarray, t0: np.ndarray) -> np.ndarray:
        """Earliest time >= t0 when the outstanding repair weight is <= the cap."""
        cap = self._table.cap
        ready = t0.copy()
        out = self.outstanding(g, t0)
        need = out > cap
        if need.any():
            gn = g[need]
            times = np.where(self.ends[gn] > t0[need][:, None], self.ends[gn], np.inf)
            order = np.argsort(times, axis=1)
            ts = np.take_along_axis(times, order, axis=1)
            ws = np.take_along_axis(np.where(np.isfinite(times), self.weights[gn], 0.0), order,
                                    axis=1)
            remaining = out[need][:, None] - np.cumsum(ws, axis=1)
            j = np.argmax(remaining <= cap + 1e-9, axis=1)
            ready[need] = ts[np.arange(gn.size), j]
        return ready


class RunState:
    """Clock, phase and pending failure arrivals of every run (one row per run).

    Attributes:
        t: wall seconds. phase: :data:`RUN`, :data:`DOWN` or :data:`DONE`.
        run_start: start of the current running phase. saved: compute seconds durably
            checkpointed. phi: share of replicas alive (elastic); min_phi: its minimum.
        remaining: operational time to each class's next failure; drawn: gaps drawn.
        cause: class of the failure being handled; down_start, restart_begin,
            restart_end: the down phase's times.
        unit_now: failing units of each kind alive; rates: failures per second by class.
    """

    def __init__(self, runs: int, table: ClassTable, unit_counts: np.ndarray,
                 arrivals: FailureArrivals, seed_of: np.ndarray) -> None:
        classes = len(table.rate_per_unit_s)
        self.t = np.zeros(runs)
        self.phase = np.full(runs, RUN, dtype=np.int8)
        self.run_start = np.zeros(runs)
        self.saved = np.zeros(runs)
        self.phi = np.ones(runs)
        self.min_phi = np.ones(runs)
        self.remaining = np.empty((runs, classes))
        self.drawn = np.zeros((runs, classes), dtype=np.int64)
        for c in range(classes):
            self.remaining[:, c] = arrivals.classes[c].take(seed_of, self.drawn[:, c])
        self.drawn += 1
        self.cause = np.zeros(runs, dtype=np.int64)
        self.down_start = np.zeros(runs)
        self.restart_begin = np.zeros(runs)
        self.restart_end = np.zeros(runs)
        self.unit_now = np.tile(unit_counts, (runs, 1))
        self.rates = table.rate_per_unit_s[None, :] * self.unit_now[:, table.unit]


class Accounts:
    """Where each run's job-seconds went, and what happened (one row per run; per class in
    the columns of the 2-D arrays)."""

    def __init__(self, runs: int, classes: int) -> None:
        self.useful = np.zeros(runs)
        self.lost = np.zeros((runs, classes))
        self.detection = np.zeros((runs, classes))
        self.restart = np.zeros((runs, classes))
        self.wait = np.zeros((runs, classes))
        self.checkpoint = np.zeros(runs)
        self.degraded = np.zeros(runs)
        self.interruptions = np.zeros((runs, classes), dtype=np.int64)
        self.absorbed = np.zeros((runs, classes), dtype=np.int64)
        self.nodes_to_repair = np.zeros((runs, classes))
        self.checkpoints = np.zeros(runs)
        self.finished = np.zeros(runs, dtype=bool)


def time_to_work(compute_s: np.ndarray, w: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Wall seconds from a running phase's start until ``compute_s`` of compute is done,
    with a save of ``p - w`` after every ``w``."""
    compute_s = np.maximum(compute_s, 0.0)
    full = np.maximum(np.ceil(compute_s / w) - 1.0, 0.0)
    return full * p + (compute_s - full * w)


class LongRunEngine:
    """``n_seeds`` runs of a set-up for each checkpoint interval (module docstring).

    Args:
        s: the set-up.
        intervals_s: compute seconds between saves, one batch of runs each.
        n_seeds: runs per interval, seeds 0.. of the streams of ``seed``.
        seed: the base seed (the same seed gives the same failures at every interval).
    """

    def __init__(self, s: LongRunSetup, intervals_s: np.ndarray, n_seeds: int,
                 seed: int) -> None:
        intervals_s = np.asarray(intervals_s, dtype=float)
        self.shape = (intervals_s.size, n_seeds)
        runs = intervals_s.size * n_seeds
        self.seed_of = np.tile(np.arange(n_seeds), intervals_s.size)
        self.w = np.repeat(intervals_s, n_seeds)
        self.blocking_s, self.upload_s = s.costs.blocking_s, s.costs.upload_s
        self.p = self.w + self.blocking_s
        self.restart_s = s.costs.restart_s
        self.horizon = s.horizon_s
        self.target = s.target_work_s
        self.elastic = s.responses.policy == "elastic"
        self.gpus_per_replica, self.gpus_per_node = s.gpus_per_replica, s.units.gpus_per_node
        self.replicas = s.units.gpus // s.gpus_per_replica
        self.table = ClassTable.of(s)
        units = s.units
        unit_counts = np.array([units.gpus, units.nodes, units.switches, 1], dtype=float)
        span_s = self.horizon if self.target is None else 2.0 * self.target
        expected = self.table.rate_per_unit_s * unit_counts[self.table.unit] * span_s
        self.arrivals = FailureArrivals(s.profile.classes, expected, n_seeds, seed,
                                        s.responses.repair_distribution)
        self.state = RunState(runs, self.table, unit_counts, self.arrivals, self.seed_of)
        self.repairs = RepairQueue(runs, self.table, self.arrivals.repairs, self.seed_of)
        self.accounts = Accounts(runs, len(s.profile.classes))
        self.use_queue = math.isfinite(self.table.cap)

    def run(self) -> dict[str, np.ndarray]:
        """Simulate every run to its end; arrays shaped (intervals, seeds, ...)."""
        st = self.state
        while True:
            act = np.flatnonzero(st.phase != DONE)
            if act.size == 0:
                break
            with np.errstate(divide="ignore", invalid="ignore"):
                tn = st.t[act, None] + np.where(st.rates[act] > 0,
                                                st.remaining[act] / st.rates[act], np.inf)
            cls = tn.argmin(axis=1)
            tf = tn[np.arange(act.size), cls]
            new_t = st.t[act].copy()
            fired: list[tuple[np.ndarray, np.ndarray]] = []
            phase = st.phase[act]
            running = phase == RUN
            if running.any():
                self._running(act, running, tf, cls, new_t, fired)
            down = phase == DOWN
            elastic_rows = self._down(act, down, tf, cls, new_t, fired) if down.any() \
                else None
            self._advance(act, new_t, fired, elastic_rows)
        return self._results()

    def _running(self, act: np.ndarray, m: np.ndarray, tf: np.ndarray, cls: np.ndarray,
                 new_t: np.ndarray, fired: list) -> None:
        """Runs in a running phase: to the next failure (lose the work since the last
        durable save, go down) or to the end (the horizon, or the work for the tokens)."""
        st, acc = self.state, self.accounts
        g, f, c = act[m], tf[m], cls[m]
        wg, pg, fg = self.w[g], self.p[g], st.phi[g]
        if self.target is None:
            t_end = np.full(g.size, self.horizon)
        else:
            t_end = np.minimum(st.run_start[g] + time_to_work((self.target - st.saved[g]) / fg,
                                                              wg, pg), self.horizon)
        fail = f < t_end
        stop = np.where(fail, f, t_end)
        x = stop - st.run_start[g]
        k = np.floor(x / pg)
        rm = x - k * pg
        comp = k * wg + np.minimum(rm, wg)
        blk = k * self.blocking_s + np.maximum(rm - wg, 0.0)
        acc.checkpoint[g] += fg * blk
        acc.degraded[g] += (1.0 - fg) * x
        new_t[m] = stop
        if fail.any():
            gf, cf, xf = g[fail], c[fail], x[fail]
            durable = np.where(xf >= self.upload_s + pg[fail],
                               np.floor((xf - self.upload_s) / pg[fail]), 0.0)
            good = durable * wg[fail]
            st.saved[gf] += fg[fail] * good
            acc.checkpoints[gf] += durable
            acc.lost[gf, cf] += fg[fail] * (comp[fail] - good)
            self._interrupt(gf, cf, f[fail])
            fired.append((gf, cf))
        end = ~fail
        if end.any():
            ge = g[end]
            acc.useful[ge] = st.saved[ge] + fg[end] * comp[end]
            acc.checkpoints[ge] += k[end]
            acc.finished[ge] = t_end[end] < self.horizon if self.target is not None else True
            st.phase[ge] = DONE

    def _down(self, act: np.ndarray, m: np.ndarray, tf: np.ndarray, cls: np.ndarray,
              new_t: np.ndarray, fired: list) -> np.ndarray | None:
        """Runs that are down: a failure while detecting or waiting is absorbed, one
        during the restart interrupts again; else the restart ends (running again) or the
        horizon does. Returns the runs that restarted, when elastic (their size changes)."""
        st, acc = self.state, self.accounts
        g, f, c = act[m], tf[m], cls[m]
        rb, re = st.restart_begin[g], st.restart_end[g]
        first = np.minimum(f, re)
        hor = first >= self.horizon
        ab = (f < rb) & ~hor
        it = (f >= rb) & (f < re) & ~hor
        dn = (re <= f) & ~hor
        where = np.flatnonzero(m)
        elastic_rows = None
        if ab.any():
            ga, ca, fa = g[ab], c[ab], f[ab]
            acc.absorbed[ga, ca] += 1
            acc.nodes_to_repair[ga, ca] += self.table.blast_nodes[ca]
            if self.use_queue:
                self.repairs.add(ga, ca, fa)
                st.restart_begin[ga] = np.maximum(st.restart_begin[ga],
                                                  self.repairs.ready(ga, fa))
                st.restart_end[ga] = st.restart_begin[ga] + self.restart_s
            new_t[where[ab]] = fa
            fired.append((ga, ca))
        if it.any():
            gi, ci, fi = g[it], c[it], f[it]
            self._charge_down(gi, fi)
            self._interrupt(gi, ci, fi)
            new_t[where[it]] = fi
            fired.append((gi, ci))
        if dn.any():
            gd = g[dn]
            self._charge_down(gd, re[dn])
            st.phase[gd] = RUN
            st.run_start[gd] = re[dn]
            new_t[where[dn]] = re[dn]
            if self.elastic:
                elastic_rows = gd
        if hor.any():
            gh = g[hor]
            self._charge_down(gh, np.full(gh.size, self.horizon))
            acc.useful[gh] = st.saved[gh]
            st.phase[gh] = DONE
            new_t[where[hor]] = self.horizon
        return elastic_rows

    def _interrupt(self, g: np.ndarray, c: np.ndarray, tf: np.ndarray) -> None:
        """Failures of classes ``c`` stop runs ``g`` at ``tf``: count them, start their
        repairs, and plan the restart (after detection and, if needed, nodes)."""
        st, acc, table = self.state, self.accounts, self.table
        acc.interruptions[g, c] += 1
        acc.nodes_to_repair[g, c] += table.blast_nodes[c]
        if self.use_queue:
            self.repairs.add(g, c, tf)
            ready = self.repairs.ready(g, tf)
        else:
            ready = tf
        st.cause[g] = c
        st.down_start[g] = tf
        st.restart_begin[g] = np.maximum(tf + table.detection_s[c], ready)
        st.restart_end[g] = st.restart_begin[g] + self.restart_s
        st.phase[g] = DOWN

    def _charge_down(self, g: np.ndarray, until: np.ndarray) -> None:
        """Book runs ``g``'s down time up to ``until`` to detection, waiting and restart."""
        st, acc = self.state, self.accounts
        c = st.cause[g]
        ds = st.down_start[g]
        det_end = ds + self.table.detection_s[c]
        det_part = np.minimum(until, det_end) - ds
        wait_part = np.maximum(np.minimum(until, st.restart_begin[g]) - det_end, 0.0)
        rest = np.maximum(until - ds - det_part - wait_part, 0.0)
        acc.detection[g, c] += det_part
        acc.wait[g, c] += wait_part
        acc.restart[g, c] += rest

    def _advance(self, act: np.ndarray, new_t: np.ndarray, fired: list,
                 elastic_rows: np.ndarray | None) -> None:
        """Advance every class's operational time, resize restarted elastic runs, then
        draw the next arrival of the classes that fired."""
        st, table = self.state, self.table
        st.remaining[act] -= st.rates[act] * (new_t - st.t[act])[:, None]
        st.t[act] = new_t
        if elastic_rows is not None:
            g = elastic_rows
            out = np.minimum(self.repairs.outstanding(g, st.restart_begin[g]),
                             self.replicas - 1)
            alive = self.replicas - out
            st.phi[g] = alive / self.replicas
            st.min_phi[g] = np.minimum(st.min_phi[g], st.phi[g])
            st.unit_now[g, 0] = alive * self.gpus_per_replica
            st.unit_now[g, 1] = alive * self.gpus_per_replica / self.gpus_per_node
            st.rates[g] = table.rate_per_unit_s[None, :] * st.unit_now[g][:, table.unit]
        for g, c in fired:
            for cc in np.unique(c):
                rows = g[c == cc]
                st.remaining[rows, cc] = self.arrivals.classes[cc].take(self.seed_of[rows],
                                                                        st.drawn[rows, cc])
                st.drawn[rows, cc] += 1

    def _results(self) -> dict[str, np.ndarray]:
        st, acc = self.state, self.accounts
        out = {
            "wall_s": st.t, "useful_s": acc.useful, "checkpoint_s": acc.checkpoint,
            "degraded_s": acc.degraded, "checkpoints": acc.checkpoints,
            "finished": acc.finished, "min_phi": st.min_phi, "lost_s": acc.lost,
            "detection_s": acc.detection, "restart_s": acc.restart, "wait_s": acc.wait,
            "interruptions": acc.interruptions, "absorbed": acc.absorbed,
            "nodes_to_repair": acc.nodes_to_repair,
        }
        return {k: v.reshape(self.shape + v.shape[1:]) for k, v in out.items()}


def run_engine(s: LongRunSetup, intervals_s: np.ndarray, n_seeds: int, seed: int
               ) -> dict[str, np.ndarray]:
    """Simulate ``n_seeds`` runs for each interval; arrays shaped (intervals, seeds, ...):
    ``wall_s``, ``useful_s``, ``checkpoint_s``, ``degraded_s``, ``checkpoints``,
    ``finished``, ``min_phi``, and per failure class ``lost_s``, ``detection_s``,
    ``restart_s``, ``wait_s``, ``interruptions``, ``absorbed``, ``nodes_to_repair``."""
    return LongRunEngine(s, intervals_s, n_seeds, seed).run()
