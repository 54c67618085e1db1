"""From a scenario to what the simulator takes: specs, a plan, perturbations, a fidelity.

:func:`resolve_step` fills in the defaults (:mod:`trainsim.defaults`), loads the model and
the cluster (overrides, then the calibration file, whose SHA-256 must match the one the
scenario records), builds the plan and returns them with the *resolved* scenario: every
field given, paths absolute, the calibration's hash recorded. A result embeds that
scenario, and running it again gives the same result bit for bit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from hardware.spec import ClusterSpec
from strategies.model_spec import ModelSpec
from strategies.perturbations import Perturbations
from strategies.plan import ParallelPlan
from trainsim import defaults
from trainsim.perturbations import format_perturbations, parse_perturbations
from trainsim.plan_fields import plan_to_fields

if TYPE_CHECKING:
    from trainsim.importers import ImportedJob
    from trainsim.scenario import Scenario


@dataclass(frozen=True)
class ResolvedStep:
    """A scenario made concrete (module docstring).

    Attributes:
        model, cluster: the specs (cluster with overrides and calibration applied).
        plan: the plan with every default filled in.
        gpus: GPUs of the job (workers, for parameter servers).
        fidelity: step fidelity.
        perturbations: stragglers and heterogeneity.
        scenario: the resolved scenario a result embeds.
        imported: the job imported from ``[import]`` (its notes go in the result), or None.
    """

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    gpus: int
    fidelity: str
    perturbations: Perturbations
    scenario: Scenario
    imported: ImportedJob | None = None


def imported_job(scenario: Scenario) -> ImportedJob | None:
    """The job of the scenario's ``[import]`` table, or None without one. A model the
    scenario names replaces the job's own.

    Raises:
        ValueError: a NeMo YAML whose SHA-256 differs from the recorded one, or one line
            naming the job's setting that is unknown, refused or invalid.
    """
    if not scenario.job:
        return None
    from trainsim.importers import import_job

    table = scenario.job
    if table.get("nemo_config") is not None:
        check_nemo_config_hash(table["nemo_config"], table.get("nemo_config_sha256"))
    model = None if scenario.model is None else load_model_ref(scenario.model)
    return import_job(megatron_args=table.get("megatron_args"),
                      nemo_config=table.get("nemo_config"), gpus=scenario.gpus, model=model)


def load_model_ref(ref: str | ModelSpec) -> ModelSpec:
    """A model preset name, a model file path, or a spec.

    Raises:
        ValueError: one line naming the model and the valid presets.
    """
    from strategies.models import load_model

    return ref if isinstance(ref, ModelSpec) else load_model(ref)


def _ref(ref: Any, presets: list[str]) -> Any:
    """How a scenario records a model or cluster: a preset by name, a file by its
    absolute path, a spec object by its name."""
    if not isinstance(ref, str) or ref in presets or not Path(ref).exists():
        return getattr(ref, "name", ref)
    return str(Path(ref).resolve())


def cluster_spec(scenario: Scenario) -> ClusterSpec:
    """The scenario's cluster: preset (default :data:`defaults.CLUSTER`), then its
    overrides, then its calibration file.

    Raises:
        ValueError: unknown preset, bad override, unreadable calibration, or a
            calibration file whose SHA-256 differs from the recorded one (one line).
    """
    from hardware.catalog import load_cluster

    cluster = defaults.CLUSTER if scenario.cluster is None else scenario.cluster
    if isinstance(cluster, ClusterSpec):
        if scenario.overrides:
            raise ValueError("overrides: give a preset name or path to apply overrides to, "
                             "not a ClusterSpec (use dataclasses.replace on the spec)")
        spec = cluster
    else:
        spec = load_cluster(cluster, scenario.overrides or None)
    if scenario.calibration is None:
        return spec
    from hardware.calibration import apply_calibration, load_calibration

    check_calibration_hash(scenario.calibration, scenario.calibration_sha256)
    return apply_calibration(spec, load_calibration(scenario.calibration))


def check_calibration_hash(path: str, expected: str | None) -> str:
    """The SHA-256 of the calibration file, checked against ``expected`` when given.

    Raises:
        ValueError: unreadable file, or another hash than the scenario records.
    """
    from trainsim.scenario import file_sha256

    actual = file_sha256(path)
    if expected is not None and actual != expected:
        raise ValueError(f"calibration_sha256: {str(path)!r} has SHA-256 {actual[:12]}..., the "
                         f"scenario records {expected[:12]}...; valid: the calibration file the "
                         "scenario was made with (or drop calibration_sha256)")
    return actual


def check_nemo_config_hash(path: str, expected: str | None) -> str:
    """The SHA-256 of an imported NeMo YAML, checked against ``expected`` when given.

    Raises:
        ValueError: unreadable file, or another hash than the scenario records.
    """
    from hardware.user_input import MAX_TEXT_BYTES, read_input_bytes

    actual = hashlib.sha256(read_input_bytes(
        path, what="nemo_config", hint="give a NeMo or Megatron-Bridge YAML",
        max_bytes=MAX_TEXT_BYTES)).hexdigest()
    if expected is not None and actual != expected:
        raise ValueError(f"nemo_config_sha256: {str(path)!r} has SHA-256 {actual[:12]}..., the "
                         f"scenario records {expected[:12]}...; valid: the file the scenario "
                         "was made with (or drop nemo_config_sha256)")
    return actual


def plan_of(scenario: Scenario, job: ImportedJob | None = None) -> ParallelPlan:
    """The scenario's plan with the defaults filled in (defaults.resolve_plan_fields): its
    own fields over those of the imported job (``job``, or the scenario's ``[import]``).

    Raises:
        ValueError: one line naming the plan field (or gpus).
    """
    job = imported_job(scenario) if job is None else job
    if job is None:
        return ParallelPlan(**defaults.resolve_plan_fields(scenario.plan, gpus=scenario.gpus))
    gpus = scenario.gpus if scenario.gpus is not None else job.gpus
    return ParallelPlan(**defaults.resolve_plan_fields({**job.plan, **scenario.plan},
                                                      gpus=gpus))


def model_of(scenario: Scenario, job: ImportedJob | None = None) -> ModelSpec:
    """The scenario's model: the one it names, else the imported job's.

    Raises:
        ValueError: no model at all, or a bad one (one line).
    """
    if scenario.model is not None:
        return load_model_ref(scenario.model)
    job = imported_job(scenario) if job is None else job
    if job is not None and job.model is not None:
        return job.model
    raise ValueError("model: none given; give a model preset (e.g. llama3-8b), a model "
                     "file, --megatron-args / --nemo-config, or a scenario that names one")


def check_fits_cluster(gpus: int, cluster: ClusterSpec) -> None:
    """A job larger than the preset's machine room fails here, saying which override
    makes room for it.

    Raises:
        ValueError: ``gpus: N ... --set max_nodes=M`` (one line).
    """
    room = cluster.max_nodes * cluster.gpus_per_node
    if gpus > room:
        needed = -(-gpus // cluster.gpus_per_node)
        raise ValueError(f"gpus: {gpus:,} GPUs exceed the {room:,} of {cluster.name!r} "
                         f"({cluster.max_nodes:,} nodes x {cluster.gpus_per_node}); give fewer "
                         f"GPUs, or make room with --set max_nodes={needed} (overrides "
                         f"{{'max_nodes': {needed}}})")


def perturbations_of(scenario: Scenario) -> Perturbations:
    """The scenario's perturbations (trainsim.perturbations syntax).

    Raises:
        ValueError: one line naming the option and the expected form.
    """
    return parse_perturbations(**scenario.perturbations)


def resolve_step(scenario: Scenario, *, default_fidelity: str) -> ResolvedStep:
    """Everything one step needs, and the resolved scenario (module docstring).

    Raises:
        ValueError: no model, or a bad model, cluster, plan or perturbation (one line).
    """
    job = imported_job(scenario)
    model = model_of(scenario, job)
    cluster = cluster_spec(scenario)
    plan = plan_of(scenario, job)
    perturbations = perturbations_of(scenario)
    fidelity = default_fidelity if scenario.fidelity is None else scenario.fidelity
    gpus = scenario.gpus if scenario.gpus is not None else \
        job.gpus if job is not None and job.gpus is not None else plan.world_size
    check_fits_cluster(max(gpus, plan.world_size), cluster)
    return ResolvedStep(model=model, cluster=cluster, plan=plan, gpus=gpus, fidelity=fidelity,
                        perturbations=perturbations,
                        scenario=resolved_scenario(scenario, plan=plan, gpus=gpus,
                                                   fidelity=fidelity,
                                                   perturbations=perturbations),
                        imported=job)


def resolved_scenario(scenario: Scenario, *, plan: ParallelPlan, gpus: int, fidelity: str,
                      perturbations: Perturbations | None = None,
                      failures: dict[str, Any] | None = None) -> Scenario:
    """``scenario`` with every field given: the whole plan, the fidelity, the GPU count,
    absolute paths and the calibration file's SHA-256."""
    from hardware.catalog import list_presets
    from strategies.models import list_models
    from trainsim.scenario import Scenario

    calibration = None if scenario.calibration is None else \
        str(Path(scenario.calibration).resolve())
    return Scenario(
        model=_ref(scenario.model, list_models()),
        cluster=_ref(defaults.CLUSTER if scenario.cluster is None else scenario.cluster,
                     list_presets()),
        gpus=gpus, fidelity=fidelity, calibration=calibration,
        calibration_sha256=None if calibration is None else
        check_calibration_hash(calibration, scenario.calibration_sha256),
        overrides=dict(scenario.overrides),
        plan={k: v for k, v in plan_to_fields(plan).items() if v is not None},
        perturbations=format_perturbations(perturbations or Perturbations()),
        failures=dict(scenario.failures if failures is None else failures),
        job=resolved_import(scenario.job))


def resolved_import(table: Mapping[str, Any]) -> dict[str, Any]:
    """An ``[import]`` table as a result records it: the Megatron-LM arguments themselves
    (an ``@FILE`` read), or the NeMo YAML's absolute path and SHA-256."""
    if not table:
        return {}
    if table.get("megatron_args") is not None:
        from trainsim.importers.megatron_args import canonical_arguments

        return {"megatron_args": canonical_arguments(table["megatron_args"])}
    path = str(Path(table["nemo_config"]).resolve())
    return {"nemo_config": path,
            "nemo_config_sha256": check_nemo_config_hash(path, table.get("nemo_config_sha256"))}
