"""What-if sweeps: a YAML spec of scenarios -> one tidy table, on processes or Ray.

A spec (YAML or a dict)::

    kind: step                 # step | collective | failures (a scenario may override it)
    base:                      # inputs every scenario shares
      model: llama3-8b
      cluster: dgx-h100
      gpus: 64
      tp: 8
    grid:                      # cartesian product of these values
      gpus: [64, 128]
      nic.gbit_per_s: [100, 400]    # dotted keys override preset fields (--set)
    scenarios:                 # optional list, each crossed with the grid
      - {cluster: dgx-h100}
      - {cluster: dgx-h100-roce}

Scenario = base, then the list entry, then the grid point (later wins). Keys with a dot
are cluster preset overrides (``nic.gbit_per_s``, ``fabric.oversubscription``,
``scale_up.nvlink_bytes_per_s``, ...); the others are inputs of the kind:

* ``step``: :func:`trainsim.api.simulate` (model, cluster, gpus, fidelity, plan fields);
  outputs step_time_s, its prediction band step_time_p10_s, step_time_p50_s and
  step_time_p90_s (:mod:`sim.step_bands`), tokens_per_s, tflops_per_gpu, mfu,
  peak_memory_bytes, the
  critical rank's breakdown as ``<category>_s``, and the values the defaults filled in
  (fidelity_used, seq_len_used, global_batch_used, micro_batches; :mod:`trainsim.defaults`).
* ``collective``: one message size of :func:`trainsim.api.collective` (op, cluster, nodes,
  gpus_per_node, size_bytes, algorithm, fidelity); outputs time_us, algbw_GBps,
  busbw_GBps, algorithm_used, protocol.
* ``failures``: :func:`sim.longrun.simulate_long_run` (cluster, gpus, days or tokens,
  profile, checkpoint_interval, seeds, seed, model, step_time_s, tokens_per_step, ...);
  outputs goodput_mean, interruptions_mean, checkpoint_interval_s, young_daly_s, mtbf_s,
  days_to_train_mean and days_to_train_p10, _p50, _p90 (the runs' spread; with a
  ``step``, its band too).

The table has one row per scenario in spec order: ``scenario`` (index), ``scenario_id``
(hash of its inputs), ``kind``, every input, the outputs, ``status`` (``ok``,
``out_of_memory``, ``error``) and ``error`` (one line). A scenario that fails is a row,
not a crash. Results are cached one JSON file per scenario hash as they arrive, and the
table is rewritten atomically as rows come in, so an interrupted sweep loses nothing and
resumes without recomputing. Both backends compute the same function of the same inputs,
so their tables are identical.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from sim.atomic_io import write_bytes_atomic, write_text_atomic
from sim.child_process import die_with_parent
from trainsim import defaults
from trainsim.plan_fields import PLAN_FIELDS
from trainsim.sweep_checks import unchanged_axes

BACKENDS = ("local", "ray")
KINDS = ("step", "collective", "failures")
#: Bumped when the meaning or the layout of a cached result changes (invalidates old
#: caches). 2: entries carry their scenario hash and a checksum of the result.
CACHE_VERSION = 2
#: Most scenarios one spec may expand to (the grid's product is checked before it is
#: expanded: a 1e10-point grid is refused, not built in memory).
MAX_SCENARIOS = 100_000
#: Most local worker processes (each holds a simulator: ~150 MiB).
MAX_WORKERS = 256
#: Seconds between rewrites of the output table while a sweep runs.
FLUSH_EVERY_S = 5.0

#: A step's inputs: the job, then every ParallelPlan field (declared once, in strategies.plan).
_STEP_INPUTS = ("model", "cluster", "gpus", "fidelity", "calibration",
                *(f.name for f in PLAN_FIELDS))
_COLLECTIVE_INPUTS = ("op", "cluster", "nodes", "gpus_per_node", "size_bytes", "algorithm",
                      "fidelity", "dtype", "calibration")
_FAILURE_INPUTS = ("cluster", "gpus", "days", "tokens", "profile", "checkpoint_interval",
                   "checkpoint_mode", "policy", "spare_nodes", "seeds", "seed", "model",
                   "step_time_s", "tokens_per_step", "checkpoint_bytes", "gpus_per_replica",
                   "max_days", "scan_seeds")
INPUTS = {"step": _STEP_INPUTS, "collective": _COLLECTIVE_INPUTS, "failures": _FAILURE_INPUTS}


# --------------------------------------------------------------------------- the spec


def expand_spec(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Scenarios of a spec dict, in order: list entries (outer) x grid points (inner).

    Raises:
        ValueError: one line for an unknown top-level key, kind or input, or a grid
            entry that is not a non-empty list.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"spec: {type(spec).__name__} is not valid; give a mapping with "
                         "base, grid and/or scenarios")
    unknown = sorted(set(spec) - {"kind", "base", "grid", "scenarios"})
    if unknown:
        raise ValueError(f"spec: {unknown[0]!r} is not a spec key; valid: kind, base, grid, "
                         "scenarios")
    kind = spec.get("kind", "step")
    for section in ("base", "grid"):
        if spec.get(section) is not None and not isinstance(spec[section], Mapping):
            raise ValueError(f"{section}: {_short(spec[section])} is not valid; give a mapping "
                             "of input names to values")
    base = dict(spec.get("base") or {})
    grid = dict(spec.get("grid") or {})
    _check_values("base", base)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid: {key}: {_short(values)} is not valid; give a non-empty "
                             "list")
    _check_values("grid", {f"{k}[{i}]": v for k, vs in grid.items() for i, v in enumerate(vs)},
                  keys=grid)
    listed = spec.get("scenarios") or [{}]
    if not isinstance(listed, list) or not all(isinstance(s, Mapping) for s in listed):
        raise ValueError("scenarios: give a list of mappings")
    for number, entry in enumerate(listed):
        _check_values(f"scenarios[{number}]", entry)
    count = len(listed) * math.prod(len(v) for v in grid.values())
    if count > MAX_SCENARIOS:
        raise ValueError(f"grid: the spec expands to {count:,} scenarios; valid: at most "
                         f"{MAX_SCENARIOS:,} (split the sweep into several specs)")
    keys = list(grid)
    out = []
    for entry in listed:
        for point in itertools.product(*(grid[k] for k in keys)):
            scenario = {"kind": kind, **base, **entry, **dict(zip(keys, point))}
            _check_inputs(scenario)
            out.append(scenario)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_values(where: str, table: Mapping[Any, Any],
                  keys: Mapping[Any, Any] | None = None) -> None:
    """Keys are text; values are scalars or lists of scalars, numbers finite.

    Raises:
        ValueError: one line naming ``where``, the key and the value.
    """
    for key in (table if keys is None else keys):
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: the key {key!r} is not valid; give input names as "
                             "text (e.g. tp, nic.gbit_per_s)")
    for key, value in table.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"{where}: {key}: {item!r} is not finite; give a finite "
                                 "number")
            if item is not None and not isinstance(item, (str, int, float, bool)):
                raise ValueError(f"{where}: {key}: {_short(value)} is not valid; give a "
                                 "number, a string, a boolean or a list of them")


def _check_inputs(scenario: Mapping[str, Any]) -> None:
    kind = scenario.get("kind")
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not valid; valid: {', '.join(KINDS)}")
    valid = INPUTS[kind]
    for key in scenario:
        if key != "kind" and "." not in key and key not in valid:
            raise ValueError(f"{key}: is not an input of kind {kind!r}; valid: "
                             f"{', '.join(valid)}, or a dotted preset key like nic.gbit_per_s")


def load_spec(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Scenarios of a YAML spec file (see the module docstring).

    Raises:
        ValueError: one line for a missing file, bad YAML or a bad spec.
    """
    from hardware.user_input import load_input

    # load_input follows YAML aliases when counting values: a few hundred bytes of nested
    # aliases would otherwise expand to billions of values when the scenarios are hashed.
    data, _ = load_input(path, what="spec", syntax="yaml",
                         hint="give a sweep spec YAML file of base, grid and scenarios")
    return expand_spec(data)


def scenario_hash(scenario: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the scenario's canonical JSON and :data:`CACHE_VERSION`."""
    text = json.dumps({"v": CACHE_VERSION, "s": scenario}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- the cache


def _result_checksum(scenario_id: str, result: Mapping[str, Any]) -> str:
    text = json.dumps({"id": scenario_id, "result": result}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cache_entry_text(scenario: Mapping[str, Any], scenario_id: str,
                     result: Mapping[str, Any]) -> str:
    """One cache file: the scenario, its hash, the result (key order kept: a resumed
    table has the columns of a fresh one) and a SHA-256 over hash and result."""
    return json.dumps({"scenario": scenario, "scenario_id": scenario_id, "result": result,
                       "sha256": _result_checksum(scenario_id, result)}, default=str)


def read_cache_entry(path: Path, scenario_id: str) -> tuple[dict | None, str | None]:
    """``(result, None)`` of a cache file that passes its checks, else ``(None, what is
    wrong)``: unreadable, not JSON, another scenario's entry, or a checksum that does not
    match (a truncated, edited or copied file is never read as a result)."""
    from hardware.user_input import read_input_text

    try:
        data = json.loads(read_input_text(path, what="cache", hint="recomputed"))
    except (ValueError, RecursionError) as problem:  # JSONDecodeError is a ValueError
        return None, f"cannot be read ({' '.join(str(problem).split())[:80]})"
    if not isinstance(data, dict) or not isinstance(data.get("result"), dict):
        return None, "is not a cache entry"
    if data.get("scenario_id") != scenario_id:
        return None, "holds another scenario's result"
    if data.get("sha256") != _result_checksum(scenario_id, data["result"]):
        return None, "fails its checksum"
    return data["result"], None


def _warn(line: str) -> None:
    import warnings

    warnings.warn(line, RuntimeWarning, stacklevel=3)


# --------------------------------------------------------------------------- one scenario


def _split(scenario: Mapping[str, Any]) -> tuple[dict, dict]:
    inputs = {k: v for k, v in scenario.items() if k != "kind" and "." not in k}
    overrides = {k: v for k, v in scenario.items() if "." in k}
    return inputs, overrides


def _run_step(inputs: dict, overrides: dict) -> dict:
    from trainsim import api

    model = inputs.pop("model")
    inputs.setdefault("fidelity", defaults.SWEEP_FIDELITY)
    result = api.simulate(model, overrides=overrides or None, **inputs)
    data = result.to_dict()
    out = {k: data[k] for k in ("step_time_s", "step_time_p10_s", "step_time_p50_s",
                                "step_time_p90_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                                "peak_memory_bytes")}
    out.update({f"{k}_s": v for k, v in result.breakdown.items()})
    plan = result.inputs["plan"]
    out.update(fidelity_used=result.inputs.get("fidelity"), seq_len_used=plan["seq_len"],
               global_batch_used=plan["global_batch"], micro_batches=plan["num_microbatches"])
    return out


def _run_collective(inputs: dict, overrides: dict) -> dict:
    from trainsim import api

    size = inputs.pop("size_bytes")
    frame = api.collective(inputs.pop("op"), min_bytes=size, max_bytes=size,
                           overrides=overrides or None, **inputs)
    row = frame.iloc[0]
    return {"time_us": float(row["time_us"]), "algbw_GBps": float(row["algbw_GBps"]),
            "busbw_GBps": float(row["busbw_GBps"]), "algorithm_used": row["algorithm"],
            "protocol": row["protocol"]}


def _run_failures(inputs: dict, overrides: dict) -> dict:
    from sim.longrun import simulate_long_run

    result = simulate_long_run(overrides=overrides or None, **inputs).to_dict()
    days = result["days_to_train"]
    return {"goodput_mean": result["goodput"]["mean"],
            "interruptions_mean": result["interruptions_mean"],
            "checkpoint_interval_s": result["checkpoint_interval_s"],
            "young_daly_s": result["checkpoint_interval"]["young_daly_s"],
            "mtbf_s": result["mtbf_s"],
            "days_to_train_mean": None if days is None else days["mean"],
            **{f"days_to_train_{q}": None if not days or not days["band"] else days["band"][q]
               for q in ("p10", "p50", "p90")}}


_RUNNERS = {"step": _run_step, "collective": _run_collective, "failures": _run_failures}


def run_scenario(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Outputs of one scenario plus ``status`` and ``error`` (never raises for bad input:
    a sweep records the failure and goes on)."""
    from strategies.memory import OutOfMemoryError

    inputs, overrides = _split(scenario)
    try:
        out = _RUNNERS[scenario["kind"]](inputs, overrides)
    except OutOfMemoryError as oom:
        return {"status": "out_of_memory", "error": str(oom).splitlines()[0]}
    except Exception as problem:  # noqa: BLE001 -- any failure is this scenario's row
        # (README: "A failing scenario is a row"); the other scenarios go on.
        text = str(problem).splitlines()[0] if str(problem) else ""
        return {"status": "error", "error": f"{type(problem).__name__}: {text}"}
    if any(isinstance(v, float) and not math.isfinite(v) for v in out.values()):
        bad = next(k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v))
        return {"status": "error", "error": f"InternalError: {bad} is {out[bad]!r}; a result "
                                            "must be finite"}
    return {**out, "status": "ok", "error": None}


def _run_chunk(chunk: Sequence[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """Worker: run scenarios ``(index, scenario)``; return ``(index, outputs)``."""
    return [(i, run_scenario(s)) for i, s in chunk]


# --------------------------------------------------------------------------- backends


def _chunks(items: Sequence, workers: int, per_worker: int = 8) -> list[list]:
    """Split into ~``workers * per_worker`` chunks: few enough to amortise task overhead,
    many enough to balance uneven scenarios and to report progress."""
    size = max(1, math.ceil(len(items) / max(1, workers * per_worker)))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def map_local(func: Callable[[list], list], chunks: Sequence[list], workers: int
              ) -> Iterator[list]:
    """Yield ``func(chunk)`` for every chunk as it completes, on ``workers`` processes
    (in this process when ``workers`` is 1)."""
    workers = min(workers, len(chunks))  # never more processes than pieces of work
    if workers <= 1:
        for chunk in chunks:
            yield func(chunk)
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        pending = {pool.submit(func, chunk) for chunk in chunks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()


def map_ray(func: Callable[[list], list], chunks: Sequence[list], workers: int,
            address: str | None = None) -> Iterator[list]:
    """Yield ``func(chunk)`` for every chunk as it completes, as Ray tasks.

    Uses the Ray instance this process is connected to; else connects to ``address``
    (``"auto"``, ``"ray://host:10001"``, ...), or starts a local instance with
    ``workers`` CPUs, and shuts down only what it started.

    Raises:
        ValueError: when Ray is not installed (``pip install 'trainsim[ray]'``), or no
            Ray instance answers at ``address``.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("backend: 'ray' needs the ray package; install it with "
                         "pip install 'trainsim[ray]', or use --backend local") from None
    started = False
    if not ray.is_initialized():
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            options["num_cpus"] = workers
        try:
            ray.init(address=address, **options)
        except ConnectionError as problem:  # no cluster at that address
            first = " ".join(str(problem).split())[:160]
            raise ValueError(f"address: {address!r}: no Ray instance answers ({first}); "
                             "start one with 'ray start --head', give its address, or "
                             "leave --address out to start a local one") from None
        started = True
    try:
        remote = ray.remote(func)
        pending = [remote.remote(chunk) for chunk in chunks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------- the table


def results_frame(scenarios: Sequence[Mapping[str, Any]],
                  results: Mapping[int, Mapping[str, Any]]) -> pd.DataFrame:
    """The tidy table: one row per scenario that has a result, in scenario order."""
    rows = []
    for i, scenario in enumerate(scenarios):
        if i not in results:
            continue
        rows.append({"scenario": i, "scenario_id": scenario_hash(scenario)[:16], **scenario,
                     **results[i]})
    frame = pd.DataFrame(rows)
    for column in frame.columns:
        values = {type(v) for v in frame[column] if v is not None and not
                  (isinstance(v, float) and math.isnan(v))}
        # parquet needs one type per column; inputs like tokens may mix 15e12 and "15T".
        if len(values) > 1 and not values <= {int, float}:
            frame[column] = [None if v is None else str(v) for v in frame[column]]
    return frame


def write_table(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write the table atomically, as parquet (``.parquet``) or CSV (anything else)."""
    target = Path(path)
    if target.suffix == ".parquet":
        import io

        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        write_bytes_atomic(target, buffer.getvalue())
    else:
        write_text_atomic(target, frame.to_csv(index=False))


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a table written by :func:`write_table`."""
    target = Path(path)
    return pd.read_parquet(target) if target.suffix == ".parquet" else pd.read_csv(target)


def resolve_workers(workers: int | None) -> int:
    """The worker count: ``workers``, or the CPUs when None.

    Raises:
        ValueError: not a whole number from 1 to :data:`MAX_WORKERS`.
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or not \
            1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers: {workers!r} is not valid; give a whole number from 1 to "
                         f"{MAX_WORKERS}")
    return workers


def run_sweep(scenarios: Sequence[Mapping[str, Any]], out: str | os.PathLike[str] | None, *,
              backend: str = "local", workers: int | None = None, address: str | None = None,
              cache_dir: str | os.PathLike[str] | None = None, fresh: bool = False,
              progress: Callable[[str, int, int], None] | None = None,
              warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``scenarios`` and write the table to ``out`` (and return it).

    Args:
        scenarios: from :func:`expand_spec` / :func:`load_spec`.
        out: table path (``.parquet`` or ``.csv``); None: no files (no cache unless
            ``cache_dir``).
        backend: ``local`` (processes) or ``ray``.
        workers: processes (local) or CPUs of a started local Ray instance; default all
            CPUs.
        address: Ray cluster address (ray backend).
        cache_dir: one JSON per scenario hash (default ``<out>.cache``).
        fresh: recompute everything (the cache is overwritten, not read).
        progress: ``callback(phase, done, total)``.
        warn: ``callback(line)`` for a cache entry that fails its check (and is
            recomputed); default: a :class:`RuntimeWarning`.

    Returns:
        ``{"frame", "scenarios", "computed", "cached", "failed", "unchanged_axes"}``
        (the inputs whose values changed no output: :mod:`trainsim.sweep_checks`).

    Raises:
        ValueError: for an unknown backend, bad workers (more than
            :data:`MAX_WORKERS`), or Ray missing.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not valid; valid: {', '.join(BACKENDS)}")
    workers = resolve_workers(workers)
    scenarios = [dict(s) for s in scenarios]
    for s in scenarios:
        _check_inputs(s)
    if cache_dir is None and out is not None:
        cache_dir = f"{out}.cache"
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    hashes = [scenario_hash(s) for s in scenarios]
    results: dict[int, dict] = {}
    say = warn or _warn
    if cache is not None and not fresh:
        for i, h in enumerate(hashes):
            path = cache / f"{h}.json"
            if path.exists():
                result, problem = read_cache_entry(path, h)
                if problem is not None:
                    say(f"sweep cache: {str(path)!r} {problem}; scenario {i} is recomputed")
                    continue
                results[i] = result
    cached = len(results)
    todo = [(i, s) for i, s in enumerate(scenarios) if i not in results]
    report = progress or (lambda phase, done, total: None)
    report("scenarios", cached, len(scenarios))
    chunks = _chunks(todo, workers)
    stream = map_local(_run_chunk, chunks, workers) if backend == "local" else \
        map_ray(_run_chunk, chunks, workers, address)
    last_flush = time.monotonic()
    for finished in stream:
        for i, result in finished:
            results[i] = result
            if cache is not None:
                write_text_atomic(cache / f"{hashes[i]}.json",
                                  cache_entry_text(scenarios[i], hashes[i], result))
        report("scenarios", len(results), len(scenarios))
        if out is not None and time.monotonic() - last_flush > FLUSH_EVERY_S:
            write_table(results_frame(scenarios, results), out)
            last_flush = time.monotonic()
    frame = results_frame(scenarios, results)
    if out is not None:
        write_table(frame, out)
    failed = int((frame["status"] != "ok").sum()) if len(frame) else 0
    return {"frame": frame, "scenarios": len(scenarios), "computed": len(todo),
            "cached": cached, "failed": failed,
            "unchanged_axes": unchanged_axes(scenarios, frame)}


def sweep(spec: Mapping[str, Any] | str | os.PathLike[str], *, backend: str = "local",
          workers: int | None = 1, out: str | os.PathLike[str] | None = None,
          **kwargs: Any) -> pd.DataFrame:
    """Run a spec (dict or YAML path) and return the table (for notebooks).

    ``workers`` defaults to 1 (in-process): a notebook's small sweeps finish faster than
    a process pool starts. Other keywords as :func:`run_sweep`.
    """
    scenarios = expand_spec(spec) if isinstance(spec, Mapping) else load_spec(spec)
    summary = run_sweep(scenarios, out, backend=backend, workers=workers, **kwargs)
    for axis in summary["unchanged_axes"]:
        warnings.warn(unchanged_message(axis), stacklevel=2)
    return summary["frame"]


def unchanged_message(axis: str) -> str:
    """The warning for an axis that changed no output."""
    return (f"{axis}: its values left every output unchanged, so the rows that differ "
            "only in it are identical: nothing this sweep runs is limited by it (for "
            "instance, no traffic is slowed by an oversubscribed uplink)")
