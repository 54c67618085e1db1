"""Scenario files: every input of a simulation in one TOML file, and in every result.

A scenario::

    model = "llama3-70b"          # preset name, or a model TOML / Hugging Face config.json
    cluster = "dgx-h100"          # preset name, or a preset TOML
    gpus = 1024
    fidelity = "event"            # analytic | event | flow
    calibration = "cal.toml"      # optional (trainsim calibrate); calibration_sha256 pins it

    [import]                      # optional: a real job's own configuration (trainsim.importers)
    megatron_args = "@job.args"   # Megatron-LM arguments (or "@FILE"), or
    # nemo_config = "job.yaml"    # a NeMo / Megatron-Bridge YAML; nemo_config_sha256 pins it

    [set]                         # cluster preset overrides, as --set key=value
    "nic.gbit_per_s" = 200

    [plan]                        # ParallelPlan fields, as --tp, --pp, ...
    tp = 8
    pp = 4

    [perturbations]               # as --straggler, --thermal, ... (lists of strings)
    straggler = ["5:0.5"]

    [failures]                    # the long run of trainsim failures
    days = 54
    seeds = 100

Every key is optional; what a scenario leaves out comes from the command's flags, then
the imported job (``[import]``: its model and plan fields; ``model`` and ``[plan]`` win),
then the defaults (:mod:`trainsim.defaults`). Paths (model, cluster, calibration, failure
profile) are relative to the scenario file. ``trainsim simulate``, ``failures`` and
``validate replay`` take ``--scenario FILE`` (flags given explicitly win); ``trainsim
plan`` writes one per plan. A result JSON of ``simulate`` or ``failures`` is a scenario
too: its ``scenario`` key is the resolved scenario it came from (every field filled in,
absolute paths, the calibration file's SHA-256), so re-running it reproduces the result
bit for bit.

:func:`load_scenario` and :func:`scenario_from_dict` are the one validation path: each
problem is one line naming the file, the field, the value and what is valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from trainsim.perturbations import PERTURBATION_OPTIONS, parse_perturbations
from trainsim.plan_fields import BY_NAME, coerce, field_named

#: Top-level keys of a scenario, in the order they are written.
SCENARIO_KEYS = ("model", "cluster", "gpus", "fidelity", "calibration", "calibration_sha256",
                 "import", "set", "plan", "perturbations", "failures")
#: Keys of the ``[import]`` table.
IMPORT_KEYS = ("megatron_args", "nemo_config", "nemo_config_sha256")
#: Step fidelities a scenario may name.
FIDELITIES = ("analytic", "event", "flow")
#: Keys of the ``[failures]`` table and the kinds of value they take.
FAILURE_KEYS = {"days": "number", "tokens": "number or text like 15T", "profile": "text",
                "checkpoint_interval": "number or text like 30min",
                "checkpoint_mode": "text", "policy": "text", "spare_nodes": "whole number",
                "seeds": "whole number", "seed": "whole number", "responses": "table"}


@dataclass(frozen=True)
class Scenario:
    """The inputs of one simulation (module docstring); None or empty = not given.

    Attributes:
        model: preset name or file path (or a ModelSpec, named by its ``name``).
        cluster: preset name or file path (or a ClusterSpec).
        gpus: GPUs of the job.
        fidelity: ``analytic``, ``event`` or ``flow``.
        calibration: calibration file path.
        calibration_sha256: SHA-256 (hex) the calibration file must have.
        overrides: cluster preset overrides (the ``[set]`` table).
        plan: ParallelPlan fields.
        perturbations: ``{option: ["text", ...]}`` (trainsim.perturbations syntax).
        failures: inputs of the long run (:data:`FAILURE_KEYS`).
        job: the ``[import]`` table (:data:`IMPORT_KEYS`): a job's Megatron-LM arguments or
            NeMo YAML, read by :func:`trainsim.importers.import_job`.
    """

    model: Any = None
    cluster: Any = None
    gpus: int | None = None
    fidelity: str | None = None
    calibration: str | None = None
    calibration_sha256: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    plan: Mapping[str, Any] = field(default_factory=dict)
    perturbations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    failures: Mapping[str, Any] = field(default_factory=dict)
    job: Mapping[str, Any] = field(default_factory=dict)

    def merged(self, other: Scenario) -> Scenario:
        """This scenario with everything ``other`` gives on top (tables key by key; a new
        calibration file drops the old file's hash; a new import replaces the old one)."""
        pick = {name: getattr(other, name) if getattr(other, name) is not None
                else getattr(self, name) for name in ("model", "cluster", "gpus", "fidelity",
                                                      "calibration")}
        sha = other.calibration_sha256 if other.calibration is not None \
            else self.calibration_sha256
        return Scenario(**pick, calibration_sha256=sha,
                        overrides={**self.overrides, **other.overrides},
                        plan={**self.plan, **other.plan},
                        perturbations={**self.perturbations, **other.perturbations},
                        failures={**self.failures, **other.failures},
                        job=dict(other.job or self.job))

    def to_dict(self) -> dict[str, Any]:
        """The scenario as TOML/JSON data: given keys only, in :data:`SCENARIO_KEYS` order."""
        data = {"model": _name(self.model), "cluster": _name(self.cluster), "gpus": self.gpus,
                "fidelity": self.fidelity, "calibration": self.calibration,
                "calibration_sha256": self.calibration_sha256, "import": dict(self.job),
                "set": dict(self.overrides), "plan": dict(self.plan),
                "perturbations": {k: list(v) for k, v in self.perturbations.items()},
                "failures": dict(self.failures)}
        return {k: v for k, v in data.items() if v is not None and v != {}}

    def to_toml(self) -> str:
        """The scenario as a TOML file (:func:`load_scenario` reads it back)."""
        return _toml(self.to_dict())


def _name(ref: Any) -> Any:
    """A spec object is recorded by its name (only names and files can be re-run)."""
    return getattr(ref, "name", ref)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes.

    Raises:
        ValueError: when the file cannot be read (one line naming it).
    """
    from hardware.user_input import read_input_bytes

    return hashlib.sha256(read_input_bytes(
        path, what="calibration", hint="give a calibration file written by trainsim "
        "calibrate")).hexdigest()


# --------------------------------------------------------------------------- reading


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario TOML, or the ``scenario`` embedded in a result JSON, and check it.

    Raises:
        ValueError: one line naming the file, the field, the value and what is valid.
    """
    from hardware.user_input import load_input

    source = Path(path)
    where = str(path)
    data, _ = load_input(path, what="scenario", hint="give a scenario TOML or a result JSON",
                         syntax="json" if source.suffix == ".json" else "toml")
    if source.suffix == ".json":
        if not isinstance(data, Mapping) or not isinstance(data.get("scenario"), Mapping):
            raise ValueError(f"scenario: {where!r} has no 'scenario' object; give a result "
                             "JSON of trainsim simulate or failures, or a scenario TOML")
        data = data["scenario"]
    return scenario_from_dict(data, where=where, base_dir=source.parent)


def scenario_from_dict(data: Mapping[str, Any], *, where: str = "scenario",
                       base_dir: str | os.PathLike[str] | None = None) -> Scenario:
    """Check scenario data (module docstring) and return the Scenario.

    Checks the keys and types, that the model and cluster (with ``set``) load, that the
    calibration file has the recorded hash, that the plan fields make a plan and that the
    perturbations parse.

    Args:
        data: the parsed TOML or the ``scenario`` of a result.
        where: the file, named in errors.
        base_dir: relative paths are relative to it (default: the working directory).

    Raises:
        ValueError: ``"<where>: <field>: <value> ...; valid: ..."`` (one line).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: the scenario is a {type(data).__name__}; give a table of "
                         f"{', '.join(SCENARIO_KEYS)}")
    unknown = [k for k in data if k not in SCENARIO_KEYS]
    if unknown:
        raise ValueError(f"{where}: {unknown[0]}: is not a scenario key; valid: "
                         f"{', '.join(SCENARIO_KEYS)}")
    base = Path(base_dir) if base_dir is not None else None
    for key in ("model", "cluster", "fidelity", "calibration", "calibration_sha256"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{where}: {key}: {data[key]!r} is not valid; give a string")
    for key in ("import", "set", "plan", "perturbations", "failures"):
        if key in data and not isinstance(data[key], Mapping):
            raise ValueError(f"{where}: {key}: {data[key]!r} is not valid; give a table")
    gpus = data.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"{where}: gpus: {gpus!r} is not valid; give a whole number >= 1")
    fidelity = data.get("fidelity")
    if fidelity is not None and fidelity not in FIDELITIES:
        raise ValueError(f"{where}: fidelity: {fidelity!r} is not valid; valid: "
                         f"{', '.join(FIDELITIES)}")
    scenario = Scenario(
        model=_path_or_name(data.get("model"), base), cluster=_path_or_name(
            data.get("cluster"), base), gpus=gpus, fidelity=fidelity,
        calibration=_path(data.get("calibration"), base),
        calibration_sha256=data.get("calibration_sha256"),
        overrides=dict(data.get("set", {})),
        plan={k: coerce(field_named(k, where=f"{where}: plan."), v, where=f"{where}: plan.")
              for k, v in data.get("plan", {}).items()},
        perturbations=_perturbations(data.get("perturbations", {}), where),
        failures=_failures(data.get("failures", {}), where, base),
        job=_import(data.get("import", {}), where, base))
    _check_resolves(scenario, where)
    return scenario


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or "/" in ref or ref.endswith((".toml", ".json"))


def _path_or_name(ref: str | None, base: Path | None) -> str | None:
    """A preset name stays a name; a relative path becomes relative to ``base``."""
    if ref is None or not _looks_like_path(ref):
        return ref
    return _path(ref, base)


def _path(ref: str | None, base: Path | None) -> str | None:
    if ref is None:
        return None
    path = Path(ref).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return str(path.resolve())


def _perturbations(table: Mapping[str, Any], where: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for key, entries in table.items():
        if key not in PERTURBATION_OPTIONS:
            raise ValueError(f"{where}: perturbations.{key}: is not a perturbation; valid: "
                             f"{', '.join(PERTURBATION_OPTIONS)}")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError(f"{where}: perturbations.{key}: {entries!r} is not valid; give a "
                             'list of strings, e.g. ["5:0.5"]')
        out[key] = tuple(entries)
    return out


def _failures(table: Mapping[str, Any], where: str, base: Path | None) -> dict[str, Any]:
    out = dict(table)
    for key, value in table.items():
        kind = FAILURE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"{where}: failures.{key}: is not an input of the long run; "
                             f"valid: {', '.join(FAILURE_KEYS)}")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = {"number": number, "text": isinstance(value, str),
              "whole number": number and float(value).is_integer(),
              "table": isinstance(value, Mapping)}.get(kind, number or isinstance(value, str))
        if not ok or (number and not math.isfinite(value)):
            raise ValueError(f"{where}: failures.{key}: {value!r} is not valid; give a {kind}")
    if isinstance(out.get("profile"), str):
        out["profile"] = _path_or_name(out["profile"], base)
    return out


def _import(table: Mapping[str, Any], where: str, base: Path | None) -> dict[str, Any]:
    """The ``[import]`` table checked, its paths made absolute (``@FILE`` included)."""
    unknown = [k for k in table if k not in IMPORT_KEYS]
    if unknown:
        raise ValueError(f"{where}: import.{unknown[0]}: is not an import key; valid: "
                         f"{', '.join(IMPORT_KEYS)}")
    for key, value in table.items():
        if not isinstance(value, str):
            raise ValueError(f"{where}: import.{key}: {value!r} is not valid; give a string")
    out = dict(table)
    args = out.get("megatron_args")
    if isinstance(args, str) and "@" in args:
        from trainsim.importers.megatron_args import relative_files

        out["megatron_args"] = relative_files(args, base)
    if "nemo_config" in out:
        out["nemo_config"] = _path(out["nemo_config"], base)
    return out


def _check_resolves(scenario: Scenario, where: str) -> None:
    """Load what the scenario names, so a bad file fails now, naming itself."""
    from trainsim import resolve

    try:
        if scenario.model is not None:
            resolve.load_model_ref(scenario.model)
        resolve.imported_job(scenario)
        if scenario.cluster is not None or scenario.overrides or scenario.calibration:
            resolve.cluster_spec(scenario)
        parse_perturbations(**scenario.perturbations)
    except ValueError as problem:
        raise ValueError(f"{where}: {problem}") from None
    try:
        resolve.plan_of(scenario)
    except ValueError as problem:
        message = str(problem)
        prefix = "plan." if message.split(":")[0] in BY_NAME else ""
        raise ValueError(f"{where}: {prefix}{message}") from None


# --------------------------------------------------------------------------- writing


def _toml(data: Mapping[str, Any]) -> str:
    """TOML text of scalars, lists and tables (tables after the scalars, as TOML needs)."""
    lines: list[str] = []
    _toml_table(lines, data, prefix="")
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_table(lines: list[str], data: Mapping[str, Any], prefix: str) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    for key, value in data.items():
        if key not in tables and value is not None:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        name = f"{prefix}{_toml_key(key)}"
        lines += ["", f"[{name}]"]
        _toml_table(lines, value, prefix=name + ".")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value)
                                                         else ("inf" if value > 0 else "-inf"))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ValueError(f"scenario: {value!r} cannot be written to TOML; give numbers, strings, "
                     "booleans or lists of them")

