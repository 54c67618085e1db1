"""Hypothesis strategies over every command's options, and the checks every call must
pass (issue 17): exit code 0, 1, 2 or 3; on an error exactly one ``error:`` line on
stderr and no traceback; no fault of trainsim (``error: internal``); JSON output that
parses, with no NaN, no infinity and no negative time.

Used by ``tests/test_fuzz_cli.py`` (a few hundred derandomized calls) and
``benchmarks/fuzz_cli.py`` (10,000 calls, counted: the run of the issue note).

Values mix what a user means (presets, sizes like ``16GiB``) with what a hostile user
types (0, -0, 10^100, ``nan``, ``1e308``, unicode, 300-character names, FIFOs, files
where directories go). Valid calls are kept small (a global batch of a few sequences,
``--top`` <= 3) so the run measures robustness, not the speed of large simulations.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from trainsim.plan_fields import PLAN_FIELDS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "importers"

#: Exit codes a command may end with (trainsim.cli.errors).
EXIT_CODES = (0, 1, 2, 3)
#: Share of the calls each command gets in a long run (the cheap commands get more).
COMMAND_SHARE = {"collective": 1500, "simulate": 2000, "failures": 1500, "plan": 1000,
                 "sweep": 1000, "hardware": 1000, "validate": 2000}


def calls_per_command(total: int) -> dict[str, int]:
    """``total`` calls split over the commands in the proportions of
    :data:`COMMAND_SHARE` (rounded per command)."""
    share = sum(COMMAND_SHARE.values())
    return {name: round(total * part / share) for name, part in COMMAND_SHARE.items()}


#: A call slower than this is reported (issue 17: "did not answer within 30 s").
SLOW_S = 30.0

INTS = ["0", "-1", "-0", "1", "2", "3", "4", "7", "8", "16", "64", "1000", "1_000",
        "99999999999999999999", "9" * 100, "1e3", "abc", "", " 8", "\uff18", "0x10", "nan",
        "-2147483649"]
SMALL_INTS = ["1", "2", "4", "8"]
FLOATS = ["0", "-1", "1e308", "1e-300", "nan", "inf", "-inf", "0.5", "1", "54", "1e9",
          "abc", "", "1_0.5"]
TEXT = ["", "x" * 300, "\u00e9\u6f22\u5b57", "../../etc/passwd", "a,b", "1,2,,3", ",",
        "None", "true", "-1", "\U0001f680"]
SIZES = ["8", "1K", "1M", "4M", "16GiB", "1.5G", "-5", "0", "1e3", "12XB", "9" * 30, "1TB",
         "1PiB", "0.5", "1MB"]
MODELS = ["llama3-8b", "llama2-7b", "mixtral-8x7b", "llama3-70b", "gpt3-175b", "llama3-405b",
          "deepseek-v3", "llama4-x"]
CLUSTERS = ["dgx-h100", "dgx-a100", "gb200-nvl72", "dgx-b200", "gcp-a3-mega", "dgx-h900"]
GPUS = ["8", "16", "32", "64", "128", "1024", "9", "0", "-8", "16384", "99999999"]
SETS = ["nic.gbit_per_s=200", "nic.gbit_per_s=0", "nic.gbit_per_s=1e308",
        "gpu.hbm_gb=1e308", "gpu.sustained_fraction=1e-300", "fabric.oversubscription=2",
        "scale_up.nvls=false", "scale_up.domain_gpus=0", "max_nodes=4096", "nic.warp=9",
        "nic", "=1", "gpu.hbm_gb=nan", "gpu.kernel_launch_us=1e6", "comm.base_latency_us=1",
        "gpu.peak_flops_per_s.bf16=1e19", "fabric.tiers=4"]
PERTURBATIONS = {
    "--straggler": ["0:0.5", "5:0.5", "0:inf", "0:0", "-1:0.5", "0:nan", "x", "0:1e-300",
                    "99999:0.5", "0:2"],
    "--thermal": ["0:0.1:0.2:0.5", "0:0:1e308:0.5", "0:-1:1:0.5", "0:0.1:0.2", "a:b:c:d"],
    "--degraded-nic": ["0:0.5", "0:0", "0:2", "0:nan"],
    "--flapping-link": ["0:1:1", "0:0:0", "0:inf:1", "0:1"],
    "--node-gpu": ["0:dgx-a100", "1:dgx-b200", "0:nope", "99999:dgx-a100"],
}


@dataclass
class Outcome:
    """One call: arguments, exit code, output, seconds."""

    args: list[str]
    code: int | str
    out: str
    err: str
    seconds: float
    problems: list[str] = field(default_factory=list)
    #: CPU seconds of this process (a busy machine stretches ``seconds``, not this).
    cpu_seconds: float = 0.0

    @property
    def command(self) -> str:
        words = [a for a in self.args[:2] if not a.startswith("-")]
        return " ".join(words[:2]) if words[:1] in (["validate"], ["hardware"]) \
            else (words[0] if words else "?")

    @property
    def kind(self) -> str:
        """ok, usage (2), oom (3), failed (1: out of tolerance), internal, traceback,
        timeout, or bad-output."""
        if self.code == "timeout":
            return "timeout"
        if "Traceback" in self.err:
            return "traceback"
        if "error: internal" in self.err:
            return "internal"
        if self.problems:
            return "bad-output"
        return {0: "ok", 1: "failed", 2: "usage", 3: "oom"}.get(self.code, "bad-output")


class CallTimeout(BaseException):
    """Raised in a call that runs past its time (a BaseException: the CLI's handlers,
    which report Exceptions in one line, must not swallow it)."""


def _alarm(signum, frame):
    raise CallTimeout()


def run(args: list[str], *, timeout_s: float = 120.0) -> Outcome:
    """Run ``trainsim ARGS`` in this process; return its outcome, checked."""
    from trainsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code: int | str = 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None
                                                                     else 1)
    except CallTimeout:
        code = "timeout"
    except Exception as problem:  # noqa: BLE001 -- escaped main(): a traceback for a user
        import traceback

        code = "traceback"
        err.write("Traceback (escaped main)\n" + "".join(traceback.format_exception(problem)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    outcome = Outcome(list(args), code, out.getvalue(), err.getvalue(),
                      time.perf_counter() - start,
                      cpu_seconds=time.process_time() - cpu_start)
    outcome.problems = check(outcome)
    return outcome


def check(outcome: Outcome) -> list[str]:
    """What is wrong with a call's outcome (empty: nothing)."""
    problems = []
    code, err = outcome.code, outcome.err
    if code not in EXIT_CODES:
        problems.append(f"exit {code!r}")
    if "Traceback" in err:
        problems.append("traceback")
    if "error: internal" in err:
        problems.append("internal fault: " + err.strip().splitlines()[-1][:200])
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    if code in (1, 2, 3) and len(error_lines) != 1:
        problems.append(f"{len(error_lines)} error lines")
    if code == 2 and len([line for line in err.splitlines() if line.strip()]) != 1 \
            and outcome.command != "sweep":
        problems.append("more than the error line on stderr")
    if code == 0 and _json_output(outcome.args):
        problems += json_problems(outcome.out)
    return problems


def _json_output(args: list[str]) -> bool:
    return any(a == "--format" and b == "json" for a, b in zip(args, args[1:]))


#: Keys of a time that may be negative (a perturbation may speed a rank up).
_SIGNED_TIMES = ("slowdown_s",)


def json_problems(text: str) -> list[str]:
    """Non-JSON, NaN, infinity or a negative time (a key ending in _s, _ns or _us) in
    a command's JSON output."""
    def refuse(constant: str):
        raise ValueError(constant)

    try:
        data = json.loads(text, parse_constant=refuse)
    except ValueError as problem:
        return [f"JSON output: {str(problem)[:80]}"]
    found: list[str] = []
    stack = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack += [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(where, v) for v in value]
        elif isinstance(value, float) and not math.isfinite(value):
            found.append(f"JSON {where}: {value}")
        elif (isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0
              and where.endswith(("_s", "_ns", "_us")) and where not in _SIGNED_TIMES):
            found.append(f"JSON {where}: negative time {value}")
    return found


# --------------------------------------------------------------------------- strategies


def _maybe(draw, probability: float) -> bool:
    return draw(st.floats(0, 1)) < probability


def _pick(draw, values):
    return draw(st.sampled_from(values))


#: Whether the call being drawn is "calm": every value from the plausible pool, so about
#: half the calls are valid and run a simulation (a call with five options, each hostile
#: with some probability, is almost never valid).
_CALM = [False]


def _start(draw) -> None:
    _CALM[0] = _maybe(draw, 0.5)


def _choose(draw, good, bad):
    """A plausible value on a calm call; else one of either pool."""
    return _pick(draw, list(good) if _CALM[0] else list(good) + list(bad))


def _often(draw, probability: float) -> bool:
    """An optional (hostile-prone) option: rarer on calm calls."""
    return _maybe(draw, probability / 4 if _CALM[0] else probability)


def _plan_options(draw, *, search: bool) -> list[str]:
    """A few plan options, from ParallelPlan's metadata (trainsim.plan_fields)."""
    args: list[str] = []
    for spec in draw(st.lists(st.sampled_from(PLAN_FIELDS), max_size=2 if _CALM[0] else 4,
                              unique=True)):
        if spec.search == "derived" and search:
            continue
        option = _pick(draw, spec.options)
        if spec.name == "global_batch":
            continue  # chosen by the caller, kept small
        if spec.kind == "bool":
            if not search or spec.search != "list":
                args.append(option if draw(st.booleans()) else f"--no-{option[2:]}")
            continue
        choices = [str(c) for c in spec.choices()] if spec.choices else []
        if search and spec.search == "list":
            pool = choices or SMALL_INTS
            values = draw(st.lists(st.sampled_from(
                pool if _CALM[0] else pool + ["0", "-1", "x", ""]), min_size=1, max_size=3))
            args += [option, ",".join(values)]
        elif spec.kind in ("ints", "strs"):
            args += [option, _choose(draw, ["8,8,8,8", "tp,cp,dp,pp", "pp,dp,cp,tp"],
                                     ["7,8,8,7", "1,2", "", "a,b", "0,32", "tp,tp", "-1,33"])]
        elif choices:
            args += [option, _choose(draw, choices, ["nope", ""])]
        else:
            args += [option, _choose(draw, SMALL_INTS, INTS)]
    return args


def _common(draw, paths: dict[str, str]) -> list[str]:
    args: list[str] = []
    if _maybe(draw, 0.15):
        args += ["--set", _choose(draw, SETS[:1] + SETS[5:7], SETS)]
    if _maybe(draw, 0.1):
        args += ["--calibration", _choose(draw, [paths["cal_ok.toml"]], [paths[k] for k in (
            "cal_table_as_value.toml", "cal_fields_scalar.toml",
            "cal_forbidden_value.toml", "fifo", "directory", "missing")])]
    return args


def _model(draw, paths) -> str:
    return _choose(draw, MODELS[:-1], [MODELS[-1], paths["model_huge_layers.toml"],
                                       paths["hf_bad_dropout.json"], paths["fifo"],
                                       paths["missing"], ""])


def _batch(draw) -> list[str]:
    option = _pick(draw, ["--global-batch", "--global-batch-size"])
    return [option, _choose(draw, ["8", "16", "32", "64"], INTS)]


@st.composite
def collective_args(draw, paths):
    _start(draw)
    args = ["collective", _choose(draw, ["all_reduce", "all_gather", "reduce_scatter",
                                         "alltoall", "broadcast", "reduce", "sendrecv"],
                                  ["allreduce", ""])]
    if _maybe(draw, 0.5):
        args += ["--nodes", _choose(draw, ["1", "2", "4", "16", "64"], INTS)]
    if _maybe(draw, 0.3):
        args += ["--gpus-per-node", _choose(draw, ["2", "4", "8"], INTS)]
    for option in ("--min-bytes", "--max-bytes"):
        if _maybe(draw, 0.4):
            args += [option, _choose(draw, SIZES[:5], SIZES)]
    if _often(draw, 0.2):
        args += ["--step-factor", _choose(draw, ["2", "4"], ["1", "0", "-2", "1000"])]
    if _often(draw, 0.3):
        args += ["--algorithm", _pick(draw, ["auto", "ring", "tree", "nvls", "nvls_tree",
                                             "hierarchical", "direct", "butterfly"])]
    if _maybe(draw, 0.3):
        args += ["--fidelity", _choose(draw, ["analytic", "event", "flow"], ["packet"])]
    if _maybe(draw, 0.2):
        args += ["--cluster", _choose(draw, CLUSTERS[:-1], CLUSTERS[-1:] + [
            paths["preset_hbm_1e308.toml"], paths["dev_zero"]])]
    if _often(draw, 0.2):
        args += ["--type", _pick(draw, ["float", "half", "int8", "bf16", "x"])]
    args += ["--format", _choose(draw, ["json", "json", "csv", "table", "nccl-tests"],
                                 ["xml"])]
    return args + _common(draw, paths)


#: A small Megatron-LM job (flag -> value; None: a bare flag) the fuzz perturbs.
JOB_FLAGS = {"--tensor-model-parallel-size": "2", "--pipeline-model-parallel-size": "1",
             "--num-layers": "4", "--hidden-size": "1024", "--num-attention-heads": "16",
             "--seq-length": "2048", "--max-position-embeddings": "2048",
             "--micro-batch-size": "1", "--global-batch-size": "16", "--bf16": None,
             "--swiglu": None, "--group-query-attention": None, "--num-query-groups": "4",
             "--use-distributed-optimizer": None, "--recompute-granularity": "selective"}
#: Flags added to the job: MoE, layouts, settings without effect, refused, unknown.
JOB_EXTRA = {"--num-experts": ["8", "0", "3"], "--moe-router-topk": ["2", "0", "999"],
             "--context-parallel-size": ["2"], "--num-layers-per-virtual-pipeline-stage":
             ["1", "3"], "--ddp-bucket-size": ["40000000", "-1"], "--vocab-size": ["32000"],
             "--kv-channels": ["64"], "--lr": ["3e-4", "nan"], "--hidden-dropout": ["0.1", "inf"],
             "--use-sharp": [None], "--frobnicate": [None, "1"], "--seed": ["$SEED"],
             "--moe-expert-capacity-factor": ["1.0", "nan", "1e308"]}


def _job_args(draw, paths) -> str:
    """A Megatron-LM command line: the small job with some values made hostile, flags
    added or dropped; or an @FILE from the corpus (huge, a FIFO, malformed YAML ...)."""
    if not _CALM[0] and _maybe(draw, 0.3):
        return "@" + _pick(draw, [paths[k] for k in (
            "args_ok.args", "args_huge.args", "args_bad_yaml.yaml", "args_alias_bomb.yaml",
            "args_not_words.args", "fifo", "dev_zero", "directory", "missing")])
    flags = dict(JOB_FLAGS)
    for flag in draw(st.lists(st.sampled_from(sorted(JOB_FLAGS)), max_size=0 if _CALM[0]
                              else 3, unique=True)):
        if _maybe(draw, 0.3):
            del flags[flag]
        else:
            flags[flag] = _pick(draw, INTS + FLOATS[:6] + [None])
    for flag in draw(st.lists(st.sampled_from(sorted(JOB_EXTRA)), max_size=1 if _CALM[0]
                              else 3, unique=True)):
        flags[flag] = _pick(draw, JOB_EXTRA[flag][:1] if _CALM[0] else JOB_EXTRA[flag])
    words = []
    for flag, value in flags.items():
        words += [flag] if value is None else [flag, value]
    text = " ".join(w if w and " " not in w else repr(w) for w in words)
    if _often(draw, 0.1):
        text += " " + _pick(draw, ["'unclosed", "\\", "torchrun x.py", "--", "@" + paths["fifo"]])
    return text


#: NeMo YAML fixtures the fuzz perturbs (tests/fixtures/importers).
NEMO_FIXTURES = ("nemo1_gpt3_175b.yaml", "nemo2_llama3_8b.yaml",
                 "bridge_llama3_8b_sft_gb200_fp8_mx.yaml")
#: Values a perturbed YAML key takes.
YAML_VALUES = [0, -1, 10**100, 1e308, float("nan"), float("inf"), "abc", "", None, True,
               [], [1, 2], {}, {"x": 1}, "${.missing}", "${multiply:2, x}", "${..}",
               "\u00e9", 2**63, 1.5]


def _nemo_config(draw, paths) -> str:
    """A NeMo / Megatron-Bridge YAML: a fixture with a few keys given hostile values,
    deleted or added (written into the scratch directory), or a malformed corpus file."""
    import hashlib

    import yaml

    if not _CALM[0] and _maybe(draw, 0.3):
        return _pick(draw, [paths[k] for k in (
            "nemo_malformed.yaml", "nemo_alias_bomb.yaml", "nemo_deep.yaml",
            "nemo_model_scalar.yaml", "nemo_trainer_list.yaml", "fifo", "dev_zero",
            "directory", "missing", "existing_file")])
    name = _pick(draw, NEMO_FIXTURES)
    data = yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))
    for _ in range(0 if _CALM[0] else draw(st.integers(1, 4))):
        node, key = _random_key(draw, data)
        if node is None:
            break
        action = _pick(draw, ["value", "value", "value", "delete", "add"])
        if action == "delete":
            del node[key]
        elif action == "add":
            node[_pick(draw, ["frobnicate", None, 7, "num_layers_x"])] = _pick(draw, YAML_VALUES)
        else:
            node[key] = _pick(draw, YAML_VALUES)
    text = yaml.safe_dump(data, sort_keys=False)
    path = Path(paths["directory"]) / "nemo" / (
        hashlib.sha256(text.encode()).hexdigest()[:16] + ".yaml")
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_text(text, encoding="utf-8")
    return str(path)


def _random_key(draw, data):
    """A (mapping, key) somewhere in ``data``, leaning to the sections the importer reads."""
    node = data
    for _ in range(4):
        if not isinstance(node, dict) or not node:
            return None, None
        key = _pick(draw, list(node))
        if isinstance(node[key], dict) and node[key] and _maybe(draw, 0.6):
            node = node[key]
            continue
        return node, key
    return (node, _pick(draw, list(node))) if isinstance(node, dict) and node else (None, None)


def _job(draw, paths) -> list[str]:
    """``--megatron-args`` or ``--nemo-config`` with its value."""
    if draw(st.booleans()):
        return ["--megatron-args", _job_args(draw, paths)]
    return ["--nemo-config", _nemo_config(draw, paths)]


def _step_args(draw, paths) -> list[str]:
    _start(draw)
    if _maybe(draw, 0.2):
        return _imported_step_args(draw, paths)
    if _CALM[0]:
        return _calm_step_args(draw, paths)
    args = []
    if _often(draw, 0.1):
        args += ["--scenario", _choose(draw, [paths["scenario_ok.toml"]], [paths[k] for k in (
            "scenario_cp0.toml", "fifo", "missing", "spec_ok.yaml")])]
    if _maybe(draw, 0.95):
        args += ["--model", _model(draw, paths)]
    if _maybe(draw, 0.8):
        args += ["--gpus", _choose(draw, GPUS[:7], GPUS[7:])]
    if _maybe(draw, 0.15):
        args += ["--cluster", _choose(draw, CLUSTERS[:-1], CLUSTERS[-1:])]
    args += _batch(draw)
    args += _plan_options(draw, search=False)
    fidelity = _choose(draw, ["analytic"] * 6 + ["event", "flow"], ["packet"])
    args += ["--fidelity", fidelity]
    return args + _common(draw, paths)


#: Plan options of calm calls: each valid on its own with the GPU counts below.
_CALM_PLAN = [["--tp", "2"], ["--tp", "4"], ["--tp", "8"], ["--pp", "2"], ["--zero", "0"],
              ["--zero", "3"], ["--recompute", "full"], ["--recompute", "selective"],
              ["--dtype", "fp8"], ["--no-flash-attention"], ["--no-overlap-grad-reduce"],
              ["--seq-len", "2048"], ["--micro-batch", "2"], ["--grad-bucket-bytes", "1000000"],
              ["--tp-comm-overlap", "async"], ["--no-sequence-parallel"]]


def _calm_step_args(draw, paths) -> list[str]:
    """A step most likely valid: a small model, a GPU count, a batch that divides."""
    gpus = int(_pick(draw, ["8", "16", "32", "64"]))
    args = ["--model", _pick(draw, ["llama3-8b", "llama2-7b", "mixtral-8x7b", "llama3-70b"]),
            "--gpus", str(gpus), "--global-batch", str(gpus * _pick(draw, [1, 2]))]
    if _maybe(draw, 0.2):
        args += ["--cluster", _pick(draw, CLUSTERS[:-1])]
    for option in draw(st.lists(st.sampled_from(_CALM_PLAN), max_size=2, unique_by=tuple)):
        args += option
    fidelity = _pick(draw, ["analytic"] * 4 + ["event", "flow"])
    return args + ["--fidelity", fidelity] + _common(draw, paths)


def _imported_step_args(draw, paths) -> list[str]:
    """A step of an imported job, with a few options given explicitly on top."""
    args = _job(draw, paths)
    if _maybe(draw, 0.5):
        args += ["--gpus", _choose(draw, ["8", "16", "1024"], GPUS)]
    if _maybe(draw, 0.2):
        args += ["--model", _model(draw, paths)]
    if _CALM[0]:
        args += _pick(draw, [[], [], ["--tp", "4"], ["--recompute", "full"]])
    else:
        args += _plan_options(draw, search=False)
    # A NeMo fixture is a full-size job (GPT-3 175B on 1,024 GPUs: ~20 s of CPU for one
    # event-fidelity step, a documented long call); the fuzz prices those in closed form.
    fidelity = "analytic" if "--nemo-config" in args else \
        _pick(draw, ["analytic"] * 4 + ["event"])
    return args + ["--fidelity", fidelity] + _common(draw, paths)


@st.composite
def simulate_args(draw, paths):
    args = ["simulate", *_step_args(draw, paths)]
    replay = "analytic" not in args
    for option, values in PERTURBATIONS.items():
        if _maybe(draw, 0.06) and (replay or option == "--straggler" or not _CALM[0]):
            args += [option, _choose(draw, values[:1], values)]
    trace = str(Path(paths["directory"]) / "t" / "trace.json")
    if _CALM[0] and replay and _maybe(draw, 0.1):
        args += ["--trace", trace]
    elif _often(draw, 0.05):
        args += ["--trace", _pick(draw, [paths["existing_file"], paths["directory"],
                                         paths["under_a_file"], paths["long_name"], trace])]
    return args + ["--format", _choose(draw, ["json", "json", "table"], ["yaml"])]


@st.composite
def failures_args(draw, paths):
    args = ["failures", *_step_args(draw, paths)]
    if _maybe(draw, 0.9):
        args += ["--days", _choose(draw, ["1", "7", "54", "0.5"], FLOATS)]
    elif _maybe(draw, 0.5):
        args += ["--tokens", _choose(draw, ["1T", "15.6T", "1e12"], ["0", "-1T", "1e308", "x"])]
    args += ["--seeds", _choose(draw, ["1", "2", "10", "50"], INTS)]
    if _often(draw, 0.2):
        args += ["--seed", _choose(draw, ["0", "1"], ["-1", "99999999999999999999"])]
    if _maybe(draw, 0.3):
        args += ["--checkpoint-interval", _choose(draw, ["auto", "young-daly", "30min", "1h"],
                                                  ["0", "-5", "1e308", "nan", "x"])]
    if _maybe(draw, 0.2):
        args += ["--profile", _choose(draw, ["llama3-h100", "meta-rsc"], [
            "nope", paths["profile_huge_rate.toml"], paths["fifo"]])]
    if _maybe(draw, 0.2):
        args += ["--policy", _choose(draw, ["spares", "wait", "elastic"], ["pray"])]
    if _often(draw, 0.1):
        args += ["--spare-nodes", _choose(draw, ["0", "1", "4"], INTS)]
    if _maybe(draw, 0.1):
        args += ["--checkpoint-mode", _choose(draw, ["sync", "async"], ["lazy"])]
    return args + ["--format", _pick(draw, ["json", "json", "table"])]


@st.composite
def plan_args(draw, paths):
    _start(draw)
    if _maybe(draw, 0.15):
        # A NeMo fixture's own GPU count is up to 1,024: its top plans' event-fidelity
        # confirmation is a documented long call, so the fuzz plans them on a few nodes.
        args = ["plan", *_job(draw, paths)]
        if "--nemo-config" in args or _maybe(draw, 0.5):
            args += ["--gpus", _choose(draw, ["8", "16", "64"], GPUS)]
    else:
        args = ["plan", "--model", _model(draw, paths), "--gpus",
                _choose(draw, ["8", "16", "32", "64"], GPUS)]
        args += _batch(draw)
    args += ["--top", _choose(draw, ["1", "2", "3"], INTS)]
    args += ["--workers", _choose(draw, ["1"] * 8 + ["2"], ["0", "-1", "300"])]
    args += _plan_options(draw, search=True)
    if _maybe(draw, 0.2):
        args += ["--tokens", _choose(draw, ["1T", "15T"], ["0", "x", "1e308"])]
    if _maybe(draw, 0.1):
        args += ["--price-per-gpu-hour", _choose(draw, ["2.5", "1"], FLOATS)]
    if _maybe(draw, 0.1):
        args += ["--sort", _choose(draw, ["time", "cost"], ["mfu"])]
    if _often(draw, 0.1):
        args += ["--profile", _pick(draw, ["llama3-h100", paths["profile_huge_rate.toml"]])]
    if _often(draw, 0.05):
        args += ["--emit-scenarios", _pick(draw, [paths["existing_file"], paths["long_name"],
                                                  str(Path(paths["directory"]) / "plans")])]
    return args + ["--format", _pick(draw, ["json", "json", "csv", "table"])] + \
        _common(draw, paths)


@st.composite
def sweep_args(draw, paths):
    _start(draw)
    spec = _choose(draw, [paths["spec_ok.yaml"], paths["spec_one_bad_scenario.yaml"]], [
        paths[k] for k in ("spec_null_key.yaml", "spec_alias_bomb.yaml", "spec_grid_1e10.yaml",
                           "fifo", "dev_zero", "missing", "directory")])
    out = _choose(draw, [str(Path(paths["directory"]) / f"sweep{i}.csv") for i in range(3)],
                  [paths["existing_file"], paths["directory"], paths["under_a_file"],
                   paths["long_name"], ""])
    args = ["sweep", spec, "--out", out, "--workers", _choose(draw, ["1"] * 6 + ["2"],
                                                              ["0", "300"])]
    if _maybe(draw, 0.2):
        args += ["--cache", _choose(draw, [str(Path(paths["directory"]) / "cache")], [
            paths["existing_file"], paths["under_a_file"]])]
    if _maybe(draw, 0.2):
        args.append("--fresh")
    if _maybe(draw, 0.1):
        args += ["--backend", _pick(draw, ["local", "slurm"])]
    return args


@st.composite
def hardware_args(draw, paths):
    _start(draw)
    if draw(st.booleans()):
        return ["hardware", "list", "--format", _pick(draw, ["json", "csv", "table", "x"])]
    args = ["hardware", "show", _pick(draw, CLUSTERS + [paths["preset_hbm_1e308.toml"],
                                                        paths["fifo"], paths["missing"], ""])]
    if _maybe(draw, 0.5):
        args += ["--set", _pick(draw, SETS)]
    return args + ["--format", _pick(draw, ["json", "json", "table", "x"])]


@st.composite
def validate_args(draw, paths):
    _start(draw)
    which = _pick(draw, ["compare", "compare", "calibrate", "replay", "collectives", "gemm",
                         "published"])
    directory = Path(paths["directory"])
    if which == "published":
        # Always one small source: the whole published set is a documented long call
        # (~30 s of CPU: every published run simulated).
        args = ["validate", "published", "--source", _pick(draw, [
            "meta_llama3_paper", "deepseek_v3_report", "megatron_lm_2021", "nope", ""])]
        if _maybe(draw, 0.3):
            args += ["--role", _pick(draw, ["validation", "calibration", "all", "x"])]
        if _maybe(draw, 0.3):
            args += ["--worst", _pick(draw, INTS)]
        output = _pick(draw, ["json", "table", "markdown", "x"])
        if _maybe(draw, 0.3):
            args += ["--write-readme", _pick(draw, [paths[k] for k in (
                "existing_file", "fifo", "directory", "missing", "dev_zero")])]
        return args + ["--format", output]
    runs = [paths[k] for k in ("replay_ok", "replay_span_no_end", "replay_span_bad_index",
                               "missing", "existing_file", "fifo")]
    if which == "compare":
        args = ["validate", "compare", _pick(draw, runs)]
        if _maybe(draw, 0.3):
            args += ["--calibration", _pick(draw, [paths[k] for k in (
                "cal_ok.toml", "cal_fields_scalar.toml", "cal_forbidden_value.toml",
                "fifo")])]
        if _maybe(draw, 0.2):
            args += ["--fidelity", _pick(draw, ["analytic", "flow", "event", "x"])]
        if _maybe(draw, 0.2):
            args += ["--tolerance", _pick(draw, ["0.15", "100", "0", "-1", "nan", "inf"])]
        if _maybe(draw, 0.1):
            args += ["--trace", _pick(draw, [paths["under_a_file"], paths["long_name"],
                                             str(directory / "trace")])]
        if _maybe(draw, 0.1):
            args += ["--cluster", _pick(draw, CLUSTERS + ["cpu-host"])]
        return args + ["--format", _pick(draw, ["json", "table"])]
    if which == "calibrate":
        inputs = draw(st.lists(st.sampled_from(runs + [paths["nccl_short_row.csv"],
                                                       paths["dev_zero"]]),
                               min_size=1, max_size=2))
        out = _pick(draw, [str(directory / "cal.toml"), paths["directory"],
                           paths["under_a_file"], paths["long_name"]])
        args = ["calibrate", *inputs, "--out", out]
        if _maybe(draw, 0.3):
            args += ["--cluster", _pick(draw, CLUSTERS + ["cpu-host"])]
        return args + ["--format", _pick(draw, ["json", "table"])]
    # Measurements never start here: --nproc is always invalid (or absent for a replay,
    # which then needs torchrun; gemm's default is one local rank).
    nproc = _pick(draw, ["0", "-1", "1000", "abc"] + ([None] if which == "replay" else []))
    tail = [] if nproc is None else ["--nproc", nproc]
    out = _pick(draw, [str(directory / "m"), paths["existing_file"], paths["under_a_file"],
                       paths["long_name"]])
    if which == "replay":
        source = _pick(draw, [["--example", "tiny"], ["--example", "huge"],
                              ["--program", paths["program_tiny.json"]],
                              ["--program", paths["program_int_shape.json"]],
                              ["--program", paths["fifo"]],
                              ["--model", "llama3-8b", "--gpus", "8"],
                              _job(draw, paths)])
        extra = []
        if _maybe(draw, 0.3):
            extra += ["--iterations", _pick(draw, INTS)]
        if _maybe(draw, 0.2):
            extra += ["--warmup", _pick(draw, INTS)]
        return ["validate", "replay", *source, "--out", out, *extra, *tail]
    if which == "collectives":
        return ["validate", "collectives", "--out", out, "--min-bytes", _pick(draw, SIZES),
                "--max-bytes", _pick(draw, SIZES), "--iters", _pick(draw, INTS), *tail]
    return ["validate", "gemm", "--out", out, "--sizes", _pick(draw, ["256", "0", "a", "",
                                                                       "256,512"]),
            "--shapes", _pick(draw, ["1x64x64x64", "0x1x1x1", "1x2x3", "x"]), *tail]


#: Every command's strategy, by name.
COMMANDS = {"collective": collective_args, "simulate": simulate_args,
            "failures": failures_args, "plan": plan_args, "sweep": sweep_args,
            "hardware": hardware_args, "validate": validate_args}

