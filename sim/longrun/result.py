"""The result of a long run: what every Monte-Carlo run did, summarised, with pandas views."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.longrun.inputs import SECONDS_PER_DAY, LongRunSetup
from sim.longrun.statistics import analytic_goodput, goodput, json_ready, summary


@dataclass
class LongRunResult:
    """Monte-Carlo result of a long run.

    Attributes:
        setup: resolved inputs.
        checkpoint_interval_s: compute seconds between saves that was simulated.
        interval: how it was chosen: ``{"requested", "young_daly_s", "daly_s",
            "simulated_optimum_s"}``.
        seeds, seed: number of runs and the base seed.
        runs: per-run arrays (see :func:`sim.longrun.engine.run_engine`), first axis =
            run.
        scan: goodput against the interval when ``"auto"`` scanned (else None).
        embedded: what the application layer records for reproducibility (its
            resolved ``scenario`` and ``trainsim_version``); added to ``to_dict()``.
        step_ratios: the step's prediction band as sorted draws of measured / simulated
            step time (:class:`sim.step_bands.StepBand`), None without one: days to
            train combine it with the runs' spread (:meth:`days_band`).
    """

    setup: LongRunSetup
    checkpoint_interval_s: float
    interval: dict[str, object]
    seeds: int
    seed: int
    runs: dict[str, np.ndarray] = field(repr=False)
    scan: pd.DataFrame | None = field(default=None, repr=False)
    embedded: dict[str, object] | None = field(default=None, repr=False)
    step_ratios: np.ndarray | None = field(default=None, repr=False)

    def days_band(self) -> dict[str, float] | None:
        """p10, p50 and p90 of the days to train (None without a token target, or when
        no run finished): every finished run's days times every draw of the step band,
        the wall time taken as proportional to the step time (same failures per day,
        same goodput)."""
        if self.setup.tokens is None or not self.runs["finished"].any():
            return None
        days = self.runs["wall_s"][self.runs["finished"]] / SECONDS_PER_DAY
        ratios = np.ones(1) if self.step_ratios is None else self.step_ratios
        combined = np.outer(days, ratios).ravel()
        return {f"p{q}": float(np.quantile(combined, q / 100)) for q in (10, 50, 90)}

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.setup.profile.class_names

    def _gpu_hours(self, job_seconds: np.ndarray) -> np.ndarray:
        return job_seconds * self.setup.units.gpus / 3600.0

    def goodput(self) -> np.ndarray:
        """Goodput of every run."""
        return goodput(self.runs)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary with the resolved inputs."""
        r, names = self.runs, self.class_names
        inter = r["interruptions"]
        total = inter.sum(axis=1)
        by_cause = {name: summary(inter[:, i], lower=0.0) for i, name in enumerate(names)}
        gh = {key: self._gpu_hours(r[key]) for key in
              ("lost_s", "detection_s", "restart_s", "wait_s")}
        lost_by_cause = {name: float(sum(gh[k][:, i].mean() for k in gh))
                         for i, name in enumerate(names)}
        wall_days = r["wall_s"] / SECONDS_PER_DAY
        days_to_train = None
        if self.setup.tokens is not None:
            days = np.where(r["finished"], wall_days, np.nan)
            days_to_train = {**summary(days, lower=0.0), "unfinished_runs": int((~r["finished"]).sum()),
                             "failure_free_days": self.setup.target_work_s / SECONDS_PER_DAY,
                             "band": self.days_band()}
        first, exact = analytic_goodput(self.setup, self.checkpoint_interval_s)
        out = {
            "interruptions_mean": float(total.mean()),
            "interruptions": summary(total, lower=0.0),
            "interruptions_by_cause": by_cause,
            "failures_absorbed_mean": float(r["absorbed"].sum(axis=1).mean()),
            "p_at_least_one_interruption": float((total > 0).mean()),
            "goodput": summary(self.goodput(), lower=0.0, upper=1.0),
            "goodput_analytic": {"first_order": first,
                                 "exact": None if math.isnan(exact) else exact},
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "checkpoint_interval_steps": (None if self.setup.step_time_s is None else
                                          int(round(self.checkpoint_interval_s
                                                    / self.setup.step_time_s))),
            "checkpoint_interval": dict(self.interval),
            "checkpoints_mean": float(r["checkpoints"].mean()),
            "mtbf_s": self.setup.mtbf_s,
            "wall_days": summary(wall_days, lower=0.0),
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
        return json_ready({**out, **(self.embedded or {})})

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
        """Headline numbers as rows of (metric, mean, ci95_lo, ci95_hi, unit, p10, p50,
        p90) for a table; the quantiles (days to train only) include the step's band."""
        d = self.to_dict()
        rows = [("interruptions", d["interruptions"], "count"),
                ("goodput", d["goodput"], "fraction")]
        if d["days_to_train"]:
            rows.append(("days_to_train", d["days_to_train"], "days"))
        out = [{"metric": m, "mean": st["mean"], "ci95_lo": st["ci95"][0],
                "ci95_hi": st["ci95"][1], "unit": unit} for m, st, unit in rows]
        band = (d["days_to_train"] or {}).get("band")
        for row in out:  # the step's prediction band with the runs' spread (days_band)
            chosen = band if band and row["metric"] == "days_to_train" else {}
            row.update({q: chosen.get(q) for q in ("p10", "p50", "p90")})
        out += [{"metric": "checkpoint_interval", "mean": d["checkpoint_interval_s"],
                 "ci95_lo": None, "ci95_hi": None, "unit": "s"},
                {"metric": "young_daly_interval", "mean": d["checkpoint_interval"]["young_daly_s"],
                 "ci95_lo": None, "ci95_hi": None, "unit": "s"},
                {"metric": "mtbf", "mean": d["mtbf_s"] / 3600.0, "ci95_lo": None,
                 "ci95_hi": None, "unit": "h"}]
        frame = pd.DataFrame(out).set_index("metric")
        return frame if band else frame.drop(columns=["p10", "p50", "p90"])
