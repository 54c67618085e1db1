"""Failures of a training job, what they cost, and how often to checkpoint.

This module is the *policy* half of the long-run simulation (:mod:`sim.longrun` runs it):
failure processes, named failure profiles, the responses to a failure (detection, restart,
spares / repair / elastic shrink), checkpoint costs, and the closed forms for the checkpoint
interval. It holds no durations of steps and imports no simulator.

Failure model
-------------
A :class:`FailureProfile` is a list of :class:`FailureClass` es (gpu, hbm, host, nic, network
link, switch, software, ...). Each has

* a **rate** per unit-hour, where the unit is a GPU, a node, a scale-out switch or the job
  (``unit``); the job's rate of a class is ``rate x units of the job`` (:class:`JobUnits`),
  so rates scale with the GPU, node or switch count of the job;
* an **inter-arrival distribution** of the job's failures of that class: ``exponential``
  (a Poisson process) or ``weibull`` with shape ``k`` and the same mean (a renewal
  process; ``k < 1`` clusters failures, as Schroeder & Gibson 2006 found for HPC nodes).
  When the job's unit count changes (elastic shrink), time is rescaled by the new rate
  (a random time change: exact for the exponential, an approximation for Weibull);
* a **blast radius** that follows the hardware: ``node`` (a GPU, HBM, host, NIC or link
  failure kills the synchronous job and sends one node to repair), ``switch`` (every node
  below the failed switch goes to repair: :attr:`JobUnits.nodes_per_switch` =
  ``fabric.nodes_per_leaf``, capped at the job's nodes) or ``restart`` (software: the job
  restarts on the same nodes).

Switches. The job's switches are its leaf switches. On a ``fat-tree`` fabric every NIC of a
node sits on the node's leaf: ``ceil(nodes / nodes_per_leaf)`` leaves. On a
``rail-optimized`` fabric NIC *i* of each node of a scalable unit sits on the leaf of rail
*i*: a leaf serves one rail of ``nodes_per_leaf`` nodes and the job has
``ceil(nodes / nodes_per_leaf) x nic.count_per_node`` leaves. **Choice:** losing one rail
makes those nodes unusable for the job (NCCL spreads every collective over all rails and does
not re-route a dead rail), so a leaf failure takes ``nodes_per_leaf`` nodes out in both
fabrics; a rail-optimized fabric has more leaves per node, hence more switch failures per job
when the class's rate is per switch. Spine switches are not modelled (adaptive routing
spreads traffic over the remaining spines).

Responses and costs (:class:`Responses`, :class:`CheckpointCosts`)
-------------------------------------------------------------------
After a failure the job notices it after ``detection_s`` (per class, default in
``failure_profiles/_responses.toml``), waits for replacement nodes if the policy needs them,
then restarts: ``reinit_s`` (reschedule, communicator init) plus reloading the checkpoint,
``checkpoint_bytes / min(read_per_node x nodes, read_total)``. Work since the last durable
checkpoint is lost. Failures during the detection or the wait are absorbed (the job is
already down; their nodes go to repair too); a failure during the restart aborts it and
counts as a new interruption. Node policies:

* ``spares``: hot spares; failed nodes are replaced at once from a pool of ``spare_nodes``
  (``None`` = unlimited) that repaired nodes return to; with the pool empty the job waits;
* ``wait``: no spares; the job waits until every failed node is repaired;
* ``elastic``: the job restarts at once without the data-parallel replicas that lost a node
  and runs at the reduced rate (alive replicas / replicas) until the next restart, when
  repaired nodes rejoin. A blast of ``k`` nodes removes ``ceil(k x gpus_per_node /
  gpus_per_replica)`` replicas (aligned blocks; distinct outstanding repairs are assumed to
  hit distinct replicas, an upper bound on the loss).

Repair times are exponential (or constant) with the class's mean ``repair_hours``.

Checkpoints: ``checkpoint_bytes = parameters x bytes per parameter`` the plan's optimizer
stores (:func:`strategies.memory.checkpoint_bytes_per_param`: weights, master weights and
Adam's moments in their dtypes; by default ``CHECKPOINT_BYTES_PER_PARAM``, bf16 weights + fp32
master weights, momentum and variance = 2 + 12 = 14 bytes, the ZeRO accounting; gradients are
not saved). ``sync`` saves block training for
``checkpoint_fixed_s + bytes / min(write_per_node x nodes, write_total)``; ``async`` blocks
only for ``checkpoint_fixed_s + (bytes / gpus) / (pcie x snapshot_pcie_efficiency)`` (each GPU
copies its shard to host memory; the shards are assumed even) and uploads in the background
in the sync save's time; a checkpoint is durable when its upload ends, and the next snapshot
waits for the previous upload (the interval is raised to the upload time if shorter).

Checkpoint interval
-------------------
``interval`` is the training compute between two saves (the save's blocking time excluded).
Young (1974) / Daly (2006) first order: ``tau = sqrt(2 C M)`` with ``C`` the blocking save
time and ``M`` the job's MTBF; :func:`daly_interval_s` is Daly's higher-order estimate. For
exponential failures the expected goodput has an exact renewal-reward form
(:func:`expected_goodput_exponential`); :func:`first_order_goodput` is the first-order
waste model.

Errors: every bad input raises :class:`ValueError` with one line naming the field, the value
and what is valid.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from hardware.spec import ClusterSpec
from hardware.toml_sources import source_comments
from strategies.memory import checkpoint_bytes_per_param
from strategies.model_costs import param_counts
from strategies.model_spec import ModelSpec
from strategies.plan import ParallelPlan

__all__ = [
    "BLASTS",
    "CHECKPOINT_BYTES_PER_PARAM",
    "CHECKPOINT_MODES",
    "CheckpointCosts",
    "DISTRIBUTIONS",
    "FailureClass",
    "FailureProfile",
    "JobUnits",
    "MONTH_HOURS",
    "POLICIES",
    "PROFILES_DIR",
    "REPAIR_DISTRIBUTIONS",
    "Responses",
    "UNITS",
    "availability_profile",
    "checkpoint_bytes_for",
    "constant_rate_profile",
    "daly_interval_s",
    "expected_goodput_exponential",
    "first_order_goodput",
    "job_units",
    "list_profiles",
    "load_profile",
    "load_responses",
    "parse_duration_s",
    "parse_interval",
    "profile_sources",
    "young_daly_interval_s",
]

#: Where the profile data files live.
PROFILES_DIR = Path(__file__).resolve().parent / "failure_profiles"
#: What a class's rate is counted per.
UNITS = ("gpu", "node", "switch", "job")
#: What a failure takes down besides the job (module docstring).
BLASTS = ("restart", "node", "switch")
#: Inter-arrival distributions of a class.
DISTRIBUTIONS = ("exponential", "weibull")
#: Node policies after a failure (module docstring).
POLICIES = ("spares", "wait", "elastic")
#: Checkpoint save modes.
CHECKPOINT_MODES = ("sync", "async")
#: Repair-time distributions (mean = the class's repair_hours).
REPAIR_DISTRIBUTIONS = ("exponential", "constant")
#: Bytes saved per parameter by default: bf16 weights + fp32 master weights, momentum and
#: variance, 2 + 12 (ZeRO paper, Rajbhandari et al. 2020, section 3.1); a plan's own from
#: what its optimizer stores (:func:`strategies.memory.checkpoint_bytes_per_param`).
CHECKPOINT_BYTES_PER_PARAM = checkpoint_bytes_per_param()
#: Hours of the "month" of a monthly availability (assumed: 30 days).
MONTH_HOURS = 720.0

_SECONDS_PER_HOUR = 3600.0


# --------------------------------------------------------------------------- helpers


def _choice(field_name: str, value: object, valid: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{field_name}: {value!r} is not valid; valid: {', '.join(valid)}")
    return value


def _number(field_name: str, value: object, *, minimum: float = 0.0, strict: bool = False,
            allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field_name}: {value!r} is not a number; give a number "
                         f"{'>' if strict else '>='} {minimum:g}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf) or number < minimum \
            or (strict and number == minimum):
        raise ValueError(f"{field_name}: {value!r} is out of range; give a finite number "
                         f"{'>' if strict else '>='} {minimum:g}")
    return number


_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)\s*$", re.I)
_DURATION_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
                   "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
                   "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
                   "d": 86400.0, "day": 86400.0, "days": 86400.0}


def parse_duration_s(value: str | float | int, *, field_name: str = "duration") -> float:
    """Seconds from a number (seconds) or a string such as ``"90s"``, ``"30min"``,
    ``"2.5h"``, ``"1d"``.

    Raises:
        ValueError: naming ``field_name`` for a negative, non-finite or unparsable value.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(field_name, value)
    match = _DURATION_RE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _DURATION_UNITS:
        raise ValueError(f"{field_name}: {value!r} is not a duration; give seconds or a number "
                         "with a unit s, min, h or d (e.g. 30min)")
    return float(match.group(1)) * _DURATION_UNITS[unit]


def parse_interval(value: str | float | int) -> str | float:
    """A checkpoint interval: ``"auto"``, ``"young-daly"`` or a duration > 0 in seconds.

    Raises:
        ValueError: naming ``checkpoint_interval`` for anything else.
    """
    if isinstance(value, str) and value.strip().lower() in ("auto", "young-daly"):
        return value.strip().lower()
    try:
        seconds = parse_duration_s(value, field_name="checkpoint_interval")
    except ValueError:
        raise ValueError(f"checkpoint_interval: {value!r} is not valid; give auto, young-daly "
                         "or a duration > 0 (seconds, or e.g. 30min, 2h)") from None
    if seconds <= 0:
        raise ValueError(f"checkpoint_interval: {value!r} is not valid; give auto, young-daly "
                         "or a duration > 0 (seconds, or e.g. 30min, 2h)")
    return seconds


# --------------------------------------------------------------------------- the job


@dataclass(frozen=True, kw_only=True)
class JobUnits:
    """How many of each failing unit a job holds, and a switch's blast radius.

    Attributes:
        gpus: GPUs of the job.
        nodes: nodes of the job (a job smaller than a node holds one node).
        gpus_per_node: GPUs the job uses on each node.
        switches: leaf switches serving the job (module docstring).
        nodes_per_switch: nodes taken out by one leaf failure (``nodes_per_leaf``, at most
            ``nodes``).
        fabric_topology: ``fat-tree`` or ``rail-optimized``.
    """

    gpus: int
    nodes: int
    gpus_per_node: int
    switches: int
    nodes_per_switch: int
    fabric_topology: str

    def count(self, unit: str) -> float:
        """Units of the given kind (``gpu``, ``node``, ``switch``, ``job``)."""
        return {"gpu": self.gpus, "node": self.nodes, "switch": self.switches,
                "job": 1}[_choice("unit", unit, UNITS)]

    def blast_nodes(self, blast: str) -> int:
        """Nodes sent to repair by a failure of the given blast radius."""
        return {"restart": 0, "node": 1,
                "switch": self.nodes_per_switch}[_choice("blast", blast, BLASTS)]


def job_units(cluster: ClusterSpec, gpus: int) -> JobUnits:
    """The units of a job of ``gpus`` GPUs on whole nodes of ``cluster``.

    Raises:
        ValueError: for a GPU count that is not positive, not a whole number of nodes, or
            larger than the cluster.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ValueError(f"gpus: {gpus!r} is not valid; give a whole number of GPUs > 0")
    per_node = cluster.gpus_per_node
    if gpus < per_node:
        nodes, used = 1, gpus
    elif gpus % per_node:
        raise ValueError(f"gpus: {gpus} is not a whole number of {per_node}-GPU nodes of "
                         f"{cluster.name!r}; give a multiple of {per_node}")
    else:
        nodes, used = gpus // per_node, per_node
    if nodes > cluster.max_nodes:
        raise ValueError(f"gpus: {gpus} needs {nodes} nodes but {cluster.name!r} has "
                         f"{cluster.max_nodes}; give at most {cluster.max_nodes * per_node}")
    fabric = cluster.fabric
    leaves = math.ceil(nodes / fabric.nodes_per_leaf)
    if fabric.topology == "rail-optimized":
        leaves *= cluster.nic.count_per_node
    return JobUnits(gpus=gpus, nodes=nodes, gpus_per_node=used, switches=leaves,
                    nodes_per_switch=min(fabric.nodes_per_leaf, nodes),
                    fabric_topology=fabric.topology)


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    """One class of failures.

    Attributes:
        name: e.g. ``"gpu"``, ``"network_switch"``, ``"software"``.
        rate_per_unit_hour: failures per unit per hour (> 0 or 0 = never).
        unit: what the rate is counted per: ``gpu``, ``node``, ``switch`` or ``job``.
        blast: ``restart``, ``node`` or ``switch`` (module docstring).
        distribution: ``exponential`` or ``weibull`` inter-arrival times of the job.
        weibull_shape: shape ``k`` of the Weibull (1 = exponential).
        repair_hours: mean repair time of the nodes it takes out (None: the responses'
            default).
        detection_s: seconds until the job notices (None: the responses' default).
        components: the source rows mapped to the class (e.g. Table 5 components).
    """

    name: str
    rate_per_unit_hour: float
    unit: str = "gpu"
    blast: str = "node"
    distribution: str = "exponential"
    weibull_shape: float = 1.0
    repair_hours: float | None = None
    detection_s: float | None = None
    components: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"classes.{self.name}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"classes: {self.name!r} is not a class name; give a non-empty "
                             "string")
        _number(f"{where}.rate_per_unit_hour", self.rate_per_unit_hour)
        _choice(f"{where}.unit", self.unit, UNITS)
        _choice(f"{where}.blast", self.blast, BLASTS)
        _choice(f"{where}.distribution", self.distribution, DISTRIBUTIONS)
        _number(f"{where}.weibull_shape", self.weibull_shape, strict=True)
        if self.repair_hours is not None:
            _number(f"{where}.repair_hours", self.repair_hours)
        if self.detection_s is not None:
            _number(f"{where}.detection_s", self.detection_s)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["components"] = list(self.components)
        return data


@dataclass(frozen=True, kw_only=True)
class FailureProfile:
    """A named set of failure classes.

    Attributes:
        name: profile name (``llama3-h100``, ``meta-rsc``, or the user's).
        description: one line.
        classes: the failure classes, in a fixed order (random streams follow it).
        sources: ``{dotted key: citation}`` from the file's ``# source:`` comments.
    """

    name: str
    description: str = ""
    classes: tuple[FailureClass, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError(f"classes: profile {self.name!r} has no failure classes; give at "
                             "least one")
        names = [c.name for c in self.classes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"classes: {duplicates[0]!r} appears twice in profile "
                             f"{self.name!r}; give each class once")

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def rates_per_hour(self, units: JobUnits) -> dict[str, float]:
        """Failures per hour of the whole job, per class."""
        return {c.name: c.rate_per_unit_hour * units.count(c.unit) for c in self.classes}

    def mtbf_s(self, units: JobUnits) -> float:
        """Mean time between failures of the job (all classes), seconds."""
        total = sum(self.rates_per_hour(units).values())
        return math.inf if total == 0 else _SECONDS_PER_HOUR / total

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description,
                "classes": [c.to_dict() for c in self.classes]}


def list_profiles() -> list[str]:
    """Names of the built-in profiles, sorted."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if not p.name.startswith("_"))


def _profile_path(ref: str | os.PathLike[str]) -> Path:
    text = os.fspath(ref)
    if text in list_profiles():
        return PROFILES_DIR / f"{text}.toml"
    if text.endswith(".toml") or "/" in text or os.sep in text:
        path = Path(text).expanduser()
        if path.exists():
            return path.resolve()  # load_profile refuses what is not a regular file
        raise ValueError(f"profile: file {text!r} not found; give a built-in profile "
                         f"({', '.join(list_profiles())}) or an existing TOML file")
    raise ValueError(f"profile: {text!r} is not a profile; valid: {', '.join(list_profiles())}, "
                     "a TOML file path or a dict")


def profile_sources(name: str | os.PathLike[str]) -> dict[str, str]:
    """``{dotted key: citation}`` of a profile file's ``# source:`` comments."""
    return source_comments(_profile_path(name).read_text(encoding="utf-8"))


_PROFILE_KEYS = {"name", "description", "unit", "exposure", "total_rate_per_unit_hour",
                 "classes"}
_CLASS_KEYS = {"rate_per_unit_hour", "count", "share", "unit", "blast", "distribution",
               "weibull_shape", "repair_hours", "detection_s", "components"}


def profile_from_dict(data: Mapping[str, Any], *, default_name: str = "custom",
                      sources: Mapping[str, str] | None = None) -> FailureProfile:
    """Build a profile from the TOML schema (as a dict).

    Schema: top-level ``name``, ``description``, ``unit`` (default unit of the classes),
    optional ``[exposure] units, hours`` and ``total_rate_per_unit_hour``, and
    ``[classes.<name>]`` tables with ``unit``, ``blast``, ``distribution``,
    ``weibull_shape``, ``repair_hours``, ``detection_s``, ``components`` and exactly one
    of: ``rate_per_unit_hour``; ``count`` (rate = count / (exposure.units x
    exposure.hours)); ``share`` (rate = share / sum of shares x total_rate_per_unit_hour).

    Raises:
        ValueError: one line naming the bad key.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"profile: {type(data).__name__} is not a profile; give a name, a "
                         "TOML path or a dict")
    unknown = sorted(set(data) - _PROFILE_KEYS)
    if unknown:
        raise ValueError(f"profile: key {unknown[0]!r} is not valid; valid: "
                         f"{', '.join(sorted(_PROFILE_KEYS))}")
    name = str(data.get("name", default_name))
    default_unit = data.get("unit", "gpu")
    _choice("unit", default_unit, UNITS)
    classes_data = data.get("classes")
    if not isinstance(classes_data, Mapping) or not classes_data:
        raise ValueError(f"classes: {classes_data!r} is not valid; give a table of failure "
                         "classes, e.g. {'gpu': {'rate_per_unit_hour': 1e-5}}")
    exposure = data.get("exposure")
    shares = {}
    for cname, cdata in classes_data.items():
        if isinstance(cdata, Mapping) and "share" in cdata:
            shares[cname] = _number(f"classes.{cname}.share", cdata["share"])
    share_sum = sum(shares.values())
    classes = []
    for cname, cdata in classes_data.items():
        where = f"classes.{cname}"
        if not isinstance(cdata, Mapping):
            raise ValueError(f"{where}: {cdata!r} is not a table; give its rate and blast")
        bad = sorted(set(cdata) - _CLASS_KEYS)
        if bad:
            raise ValueError(f"{where}: key {bad[0]!r} is not valid; valid: "
                             f"{', '.join(sorted(_CLASS_KEYS))}")
        given = [k for k in ("rate_per_unit_hour", "count", "share") if k in cdata]
        if len(given) != 1:
            raise ValueError(f"{where}: {given or 'no rate'} is not valid; give exactly one of "
                             "rate_per_unit_hour, count (with [exposure]) or share (with "
                             "total_rate_per_unit_hour)")
        if given[0] == "rate_per_unit_hour":
            rate = _number(f"{where}.rate_per_unit_hour", cdata["rate_per_unit_hour"])
        elif given[0] == "count":
            if not isinstance(exposure, Mapping) or not {"units", "hours"} <= set(exposure):
                raise ValueError(f"exposure: {exposure!r} is not valid; a class with count "
                                 "needs [exposure] units and hours")
            units = _number("exposure.units", exposure["units"], strict=True)
            hours = _number("exposure.hours", exposure["hours"], strict=True)
            rate = _number(f"{where}.count", cdata["count"]) / (units * hours)
        else:
            if "total_rate_per_unit_hour" not in data:
                raise ValueError(f"total_rate_per_unit_hour: missing; a class with share "
                                 f"({where}) needs the profile's total rate")
            total = _number("total_rate_per_unit_hour", data["total_rate_per_unit_hour"])
            if share_sum <= 0:
                raise ValueError(f"{where}.share: the shares sum to {share_sum}; give shares "
                                 "with a positive sum")
            rate = total * shares[cname] / share_sum
        components = cdata.get("components", ())
        if isinstance(components, str) or not all(isinstance(c, str) for c in components):
            raise ValueError(f"{where}.components: {components!r} is not valid; give a list "
                             "of strings")
        classes.append(FailureClass(
            name=str(cname), rate_per_unit_hour=rate, unit=cdata.get("unit", default_unit),
            blast=cdata.get("blast", "node"),
            distribution=cdata.get("distribution", "exponential"),
            weibull_shape=cdata.get("weibull_shape", 1.0),
            repair_hours=cdata.get("repair_hours"), detection_s=cdata.get("detection_s"),
            components=tuple(components)))
    return FailureProfile(name=name, description=str(data.get("description", "")),
                          classes=tuple(classes), sources=dict(sources or {}))


def load_profile(profile: str | os.PathLike[str] | Mapping[str, Any] | FailureProfile
                 ) -> FailureProfile:
    """A built-in profile name, a TOML path, a dict in the same schema, or a profile.

    Raises:
        ValueError: for an unknown name, a missing file, invalid TOML or a bad key.
    """
    if isinstance(profile, FailureProfile):
        return profile
    if isinstance(profile, Mapping):
        return profile_from_dict(profile)
    if not isinstance(profile, (str, os.PathLike)):
        raise ValueError(f"profile: {profile!r} is not valid; valid: "
                         f"{', '.join(list_profiles())}, a TOML file path or a dict")
    from hardware.user_input import load_input

    path = _profile_path(profile)
    data, text = load_input(path, what="profile", syntax="toml", hint="give a built-in "
                            f"profile ({', '.join(list_profiles())}) or a failure profile TOML")
    return profile_from_dict(data, default_name=path.stem, sources=source_comments(text))


def constant_rate_profile(*, mtbf_s: float | None = None, rate_per_gpu_hour: float | None = None,
                          blast: str = "node", name: str = "constant") -> FailureProfile:
    """One exponential failure class named ``failure``.

    With ``mtbf_s`` the rate is per job (unit ``job``): the job's MTBF is ``mtbf_s`` at any
    size. With ``rate_per_gpu_hour`` it scales with the job's GPUs."""
    if (mtbf_s is None) == (rate_per_gpu_hour is None):
        raise ValueError("mtbf_s: give exactly one of mtbf_s or rate_per_gpu_hour")
    if mtbf_s is not None:
        rate = _SECONDS_PER_HOUR / _number("mtbf_s", mtbf_s, strict=True)
        cls = FailureClass(name="failure", rate_per_unit_hour=rate, unit="job", blast=blast)
    else:
        cls = FailureClass(name="failure", rate_per_unit_hour=_number(
            "rate_per_gpu_hour", rate_per_gpu_hour), unit="gpu", blast=blast)
    return FailureProfile(name=name, description="one exponential failure class",
                          classes=(cls,))


def availability_profile(monthly_availability: float = 0.999, *,
                         month_hours: float = MONTH_HOURS) -> FailureProfile:
    """One exponential GPU class such that a GPU survives a month with probability
    ``monthly_availability``: rate = -ln(a) / month_hours per GPU-hour.

    Then P(a job of N GPUs is interrupted at least once in a month) = 1 - a**N exactly.
    """
    a = _number("monthly_availability", monthly_availability, strict=True)
    if a >= 1:
        raise ValueError(f"monthly_availability: {monthly_availability!r} is out of range; "
                         "give a probability in (0, 1)")
    rate = -math.log(a) / _number("month_hours", month_hours, strict=True)
    return FailureProfile(
        name=f"availability-{a:g}", description=f"GPU monthly availability {a:g}",
        classes=(FailureClass(name="gpu", rate_per_unit_hour=rate, unit="gpu", blast="node"),))


# --------------------------------------------------------------------------- responses


@dataclass(frozen=True, kw_only=True)
class Responses:
    """What happens after a failure, and the storage figures of checkpoints.

    Defaults come from ``failure_profiles/_responses.toml`` (every number sourced or
    marked assumed); :func:`load_responses` applies overrides.

    Attributes:
        detection_s: seconds from a failure until the job notices (classes may override).
        reinit_s: reschedule + communicator init + warm-up, seconds (excludes the reload).
        storage_read_bytes_per_s_per_node, storage_write_bytes_per_s_per_node: checkpoint
            read/write rate of one node.
        storage_read_bytes_per_s_total, storage_write_bytes_per_s_total: of the storage
            system.
        snapshot_pcie_efficiency: fraction of the PCIe rate a device-to-host snapshot gets.
        checkpoint_fixed_s: fixed blocking cost of one save.
        repair_hours: repair time of classes without their own.
        repair_distribution: ``exponential`` or ``constant``.
        policy: ``spares``, ``wait`` or ``elastic``.
        spare_nodes: size of the hot-spare pool for ``spares`` (None = unlimited).
        gpus_per_replica: GPUs of one data-parallel replica (tp*pp*cp) for ``elastic``
            (None: the plan's, else one node).
        checkpoint_blocking_s, checkpoint_upload_s, reload_s: override the computed costs
            (seconds; None = compute them).
        sources: ``{field: citation}``.
    """

    detection_s: float
    reinit_s: float
    storage_read_bytes_per_s_per_node: float
    storage_write_bytes_per_s_per_node: float
    storage_read_bytes_per_s_total: float
    storage_write_bytes_per_s_total: float
    snapshot_pcie_efficiency: float
    checkpoint_fixed_s: float
    repair_hours: float
    repair_distribution: str = "exponential"
    policy: str = "spares"
    spare_nodes: int | None = None
    gpus_per_replica: int | None = None
    checkpoint_blocking_s: float | None = None
    checkpoint_upload_s: float | None = None
    reload_s: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("detection_s", "reinit_s", "checkpoint_fixed_s", "repair_hours"):
            _number(name, getattr(self, name))
        for name in ("storage_read_bytes_per_s_per_node", "storage_write_bytes_per_s_per_node",
                     "storage_read_bytes_per_s_total", "storage_write_bytes_per_s_total"):
            _number(name, getattr(self, name), strict=True, allow_inf=True)
        eff = _number("snapshot_pcie_efficiency", self.snapshot_pcie_efficiency, strict=True)
        if eff > 1:
            raise ValueError(f"snapshot_pcie_efficiency: {eff} is out of range; give (0, 1]")
        _choice("repair_distribution", self.repair_distribution, REPAIR_DISTRIBUTIONS)
        _choice("policy", self.policy, POLICIES)
        for name in ("spare_nodes", "gpus_per_replica"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < (0 if name == "spare_nodes" else 1)):
                raise ValueError(f"{name}: {value!r} is not valid; give a whole number "
                                 f"{'>= 0' if name == 'spare_nodes' else '>= 1'} or None")
        for name in ("checkpoint_blocking_s", "checkpoint_upload_s", "reload_s"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name))

    def to_dict(self) -> dict[str, object]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}
        return data


_GB = 1e9
#: TOML key -> (field, factor to SI).
_RESPONSE_TOML = {
    "detection_s": ("detection_s", 1.0),
    "reinit_s": ("reinit_s", 1.0),
    "storage_read_gb_per_s_per_node": ("storage_read_bytes_per_s_per_node", _GB),
    "storage_write_gb_per_s_per_node": ("storage_write_bytes_per_s_per_node", _GB),
    "storage_read_gb_per_s_total": ("storage_read_bytes_per_s_total", _GB),
    "storage_write_gb_per_s_total": ("storage_write_bytes_per_s_total", _GB),
    "snapshot_pcie_efficiency": ("snapshot_pcie_efficiency", 1.0),
    "checkpoint_fixed_s": ("checkpoint_fixed_s", 1.0),
    "repair_hours": ("repair_hours", 1.0),
    "repair_distribution": ("repair_distribution", None),
    "policy": ("policy", None),
    "spare_nodes": ("spare_nodes", None),
}


def _default_responses() -> Responses:
    path = PROFILES_DIR / "_responses.toml"
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    comments = source_comments(text)
    values, sources = {}, {}
    for key, value in data.items():
        name, factor = _RESPONSE_TOML[key]
        values[name] = value * factor if factor is not None else value
        if key in comments:
            sources[name] = comments[key]
    return Responses(**values, sources=sources)


def load_responses(overrides: Responses | Mapping[str, Any] | None = None, **more: Any
                   ) -> Responses:
    """The default responses with ``overrides`` (field names of :class:`Responses`) applied.

    Raises:
        ValueError: for an unknown field or a bad value, naming it.
    """
    if isinstance(overrides, Responses):
        base, changes = overrides, dict(more)
    else:
        base, changes = _default_responses(), {**dict(overrides or {}), **more}
    valid = [f.name for f in fields(Responses) if f.name != "sources"]
    for key in changes:
        if key not in valid:
            raise ValueError(f"responses: {key!r} is not a response field; valid: "
                             f"{', '.join(valid)}")
    return replace(base, **changes) if changes else base


# --------------------------------------------------------------------------- checkpoints


def checkpoint_bytes_for(model: ModelSpec, *, bytes_per_param: float | None = None,
                         plan: ParallelPlan | None = None) -> int:
    """Bytes of one full checkpoint of ``model``: parameters x ``bytes_per_param``, by
    default what ``plan``'s optimizer stores per parameter
    (:func:`strategies.memory.checkpoint_bytes_per_param`; without a plan
    :data:`CHECKPOINT_BYTES_PER_PARAM`)."""
    if bytes_per_param is None:
        bytes_per_param = checkpoint_bytes_per_param(plan)
    _number("bytes_per_param", bytes_per_param, strict=True)
    return int(param_counts(model).total * bytes_per_param)


@dataclass(frozen=True, kw_only=True)
class CheckpointCosts:
    """Time costs of checkpoints and restarts of one job.

    Attributes:
        checkpoint_bytes: bytes of one checkpoint.
        mode: ``sync`` or ``async``.
        blocking_s: training stops this long per save.
        upload_s: after the blocking part, until the checkpoint is durable (0 for sync).
        reload_s: reading the checkpoint at restart.
        restart_s: ``reinit_s + reload_s``: from restart start to training.
        detection_s: default detection delay (classes may override).
    """

    checkpoint_bytes: int
    mode: str
    blocking_s: float
    upload_s: float
    reload_s: float
    restart_s: float
    detection_s: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --------------------------------------------------------------------------- closed forms


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974) / Daly (2006) first-order optimum: ``sqrt(2 C M)`` seconds of compute
    between checkpoints, for a blocking save of ``C`` seconds and a job MTBF ``M``."""
    c = _number("checkpoint_s", checkpoint_s)
    m = _number("mtbf_s", mtbf_s, strict=True, allow_inf=True)
    return math.sqrt(2.0 * c * m)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (Daly 2006, "A higher order estimate of the optimum
    checkpoint interval for restart dumps", Future Generation Computer Systems 22(3)):
    ``sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for ``C < 2M``, else ``M``."""
    c = _number("checkpoint_s", checkpoint_s)
    m = _number("mtbf_s", mtbf_s, strict=True, allow_inf=True)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def expected_goodput_exponential(*, interval_s: float, checkpoint_s: float, detection_s: float,
                                 restart_s: float, mtbf_s: float) -> float:
    """Exact long-run goodput (useful compute / wall time) for Poisson failures.

    Model (the one :mod:`sim.longrun` simulates with unlimited hot spares and sync saves):
    segments of ``W`` seconds of compute each end with a blocking save of ``C``; a failure
    (rate ``1/M``) anywhere in ``W + C`` loses the segment; then ``D`` (detection; failures
    during it are absorbed) and a restart of ``R`` that a failure aborts (then ``D + R``
    again). The expected wall time to complete one segment is (renewal argument; Bougeret,
    Casanova, Rabie, Robert & Vivien, "Checkpointing strategies for parallel jobs", SC 2011;
    Hérault & Robert (eds.), "Fault-Tolerance Techniques for HPC", Springer 2015, ch. 1)::

        E[T(W)] = exp(R/M) (M + D) (exp((W + C)/M) - 1)

    and the goodput is ``W / E[T(W)]`` (renewal-reward theorem). With several exponential
    classes, ``M`` is the job MTBF and ``D`` the rate-weighted mean detection delay.
    """
    w = _number("interval_s", interval_s, strict=True)
    c = _number("checkpoint_s", checkpoint_s)
    d = _number("detection_s", detection_s)
    r = _number("restart_s", restart_s)
    m = _number("mtbf_s", mtbf_s, strict=True, allow_inf=True)
    if math.isinf(m):
        return w / (w + c)
    try:
        expected = math.exp(r / m) * (m + d) * math.expm1((w + c) / m)
    except OverflowError:
        # A job whose MTBF is far below a segment: the same formula in log space, whose
        # goodput underflows to 0 instead of overflowing.
        x = (w + c) / m
        log_expected = r / m + math.log(m + d) + x + math.log1p(-math.exp(-x))
        return math.exp(math.log(w) - log_expected)
    return w / expected


def first_order_goodput(*, interval_s: float, checkpoint_s: float, detection_s: float,
                        restart_s: float, mtbf_s: float, upload_s: float = 0.0) -> float:
    """First-order goodput (Young 1974; Daly 2006): the fraction of time spent computing,
    ``W / (W + C)``, times the fraction not lost to failures, ``1 - (D + R + (W + C)/2 +
    U) / M``: each failure costs detection, restart and on average half a segment (plus the
    upload lag ``U`` of an asynchronous save). Clipped at 0."""
    w = _number("interval_s", interval_s, strict=True)
    c = _number("checkpoint_s", checkpoint_s)
    m = _number("mtbf_s", mtbf_s, strict=True, allow_inf=True)
    loss = (detection_s + restart_s + (w + c) / 2 + upload_s) / m
    return max(0.0, w / (w + c) * (1 - loss))
