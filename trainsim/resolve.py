"""From a scenario to what the simulator takes: specs, a plan, perturbations, a fidelity.

:func:`resolve_step` fills in the defaults (:mod:`trainsim.defaults`), loads the model and
the cluster (overrides, then the calibration file, whose SHA-256 must match the one the
scenario records), builds the plan and returns them with the *resolved* scenario: every
field given, paths absolute, the calibration's hash recorded. A result embeds that
scenario, and running it again gives the same result bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardware.spec import ClusterSpec
from strategies.model_spec import ModelSpec
from strategies.perturbations import Perturbations
from strategies.plan import ParallelPlan
from trainsim import defaults
from trainsim.perturbations import format_perturbations, parse_perturbations
from trainsim.plan_fields import plan_to_fields

if TYPE_CHECKING:
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
    """

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    gpus: int
    fidelity: str
    perturbations: Perturbations
    scenario: Scenario


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


def plan_of(scenario: Scenario) -> ParallelPlan:
    """The scenario's plan with the defaults filled in (defaults.resolve_plan_fields).

    Raises:
        ValueError: one line naming the plan field (or gpus).
    """
    return ParallelPlan(**defaults.resolve_plan_fields(scenario.plan, gpus=scenario.gpus))


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
    if scenario.model is None:
        raise ValueError("model: none given; give a model preset (e.g. llama3-8b), a model "
                         "file, or a scenario that names one")
    model = load_model_ref(scenario.model)
    cluster = cluster_spec(scenario)
    plan = plan_of(scenario)
    perturbations = perturbations_of(scenario)
    fidelity = default_fidelity if scenario.fidelity is None else scenario.fidelity
    gpus = plan.world_size if scenario.gpus is None else scenario.gpus
    check_fits_cluster(max(gpus, plan.world_size), cluster)
    return ResolvedStep(model=model, cluster=cluster, plan=plan, gpus=gpus, fidelity=fidelity,
                        perturbations=perturbations,
                        scenario=resolved_scenario(scenario, plan=plan, gpus=gpus,
                                                   fidelity=fidelity,
                                                   perturbations=perturbations))


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
        failures=dict(scenario.failures if failures is None else failures))
