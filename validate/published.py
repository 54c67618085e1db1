"""Published training runs, simulated: the error table behind "How close it is".

``validate/data/published`` holds published step times (or throughputs) of real training
runs with their full configurations, one CSV per source (``SOURCES.md`` says where every
number comes from). This module turns each row into a scenario — the model of
``models.csv``, the preset of its GPU, the parallel plan its framework ran — simulates it
(``analytic`` fidelity by default) and reports the error ``(simulated - published) /
published`` of the step time, per source and overall: median and 90th percentile of
``|error|``, the bias (mean signed error) and the worst rows.

Rows are split by ``roles.toml``: **calibration** rows are the runs a preset's one
calibrated number (``gpu.sustained_fraction``) was fitted on; every other row
**validates**, and the summary reports them apart. A row the simulator cannot express
yet (an attention kind, schedule or expert layout it does not model) is kept with its
reason and counted, never silently dropped.

How a framework runs (the settings a row does not print: optimizer sharding, overlap,
attention kernel, FP8 recipe, elementwise kernels, loss, memory savers) is
:mod:`validate.published_stacks`; every scenario lists what it assumed.

Nothing here imports torch.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from hardware.catalog import load_cluster
from hardware.spec import ClusterSpec
from sim.analytic_step import PricingCache
from sim.step import simulate_step
from sim.step_bands import band_shares
from strategies import model_costs
from strategies.memory import OutOfMemoryError
from strategies.model_spec import MLASpec, ModelSpec, MoESpec
from strategies.plan import ParallelPlan
from validate.published_stacks import (framework_defaults, framework_kind, hsdp_shard,
                                       stack_settings, torchtitan_pipeline)

#: Folder of the published data, inside the installed package.
DATA_DIR = Path(__file__).resolve().parent / "data" / "published"

#: The preset each published GPU runs on.
GPU_PRESETS: Mapping[str, str] = {
    "A100-80GB": "dgx-a100",
    "A100-40GB": "dgx-a100-40gb",
    "H100-SXM": "dgx-h100",
    "H800": "dgx-h800",
    "H200": "hgx-h200",
    "B200": "dgx-b200",
    "GB200": "gb200-nvl72",
}

#: Activation functions of models.csv and the MLP the cost model prices them as: gated
#: ones (SwiGLU, GeGLU) run three matmuls, the others (GELU, squared ReLU) two.
MLP_OF_ACTIVATION = {"swiglu": "swiglu", "geglu": "swiglu", "gelu": "gelu",
                     "squared_relu": "gelu"}

#: Model families that train with LayerNorm (the rest: RMSNorm) and with dropout
#: (GPT-3 recipes and Megatron's GPT set hidden/attention dropout 0.1; Llama, Nemotron,
#: MPT, Mixtral-class and DeepSeek train without).
LAYERNORM_PREFIXES = ("gpt3-", "megatron-gpt-", "mpt-", "nemotron")
DROPOUT_PREFIXES = ("gpt3-", "megatron-gpt-")


@dataclass(frozen=True)
class PublishedRun:
    """One published training run (a row of a ``train_*.csv``; columns in SOURCES.md).

    Attributes:
        source_id, row_id: where it comes from and which row it is.
        fields: the row's cells (empty strings dropped).
        published_step_time_s: the step time the source gives, or derives from its
            throughput (None when only a FLOP rate was published).
    """

    source_id: str
    row_id: str
    fields: Mapping[str, str]
    published_step_time_s: float | None

    def get(self, name: str, default: str = "") -> str:
        """A cell of the row ('' when empty)."""
        return self.fields.get(name, default)

    def integer(self, name: str, default: int | None = None) -> int | None:
        """A whole-number cell, or ``default`` when empty."""
        text = self.fields.get(name, "")
        return int(float(text)) if text else default


@dataclass
class Scenario:
    """What a published run simulates as.

    Attributes:
        model, cluster, plan: the simulator's inputs.
        assumptions: the defaults applied where the row says nothing.
        settings: framework settings applied beyond the defaults, each with its source;
            those the row does not print but its framework's recipe sets start with
            ``unprinted:`` (validate.published_stacks).
    """

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    assumptions: list[str] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)


class NotExpressible(Exception):
    """A published run the simulator cannot express yet (its reason is the message)."""


# --------------------------------------------------------------------------- loading


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: (v or "").strip() for k, v in row.items() if k is not None}
                for row in csv.DictReader(handle)]


def load_models(directory: Path = DATA_DIR) -> dict[str, ModelSpec | str]:
    """``{model key: ModelSpec}`` of ``models.csv``; a model the cost model cannot
    express maps to the reason (a string).

    Raises:
        ValueError: naming the file, the model and the column for a malformed row.
    """
    models: dict[str, ModelSpec | str] = {}
    for row in _read_csv(directory / "models.csv"):
        key = row["model"]
        try:
            models[key] = model_from_row(row)
        except NotExpressible as reason:
            models[key] = str(reason)
        except (KeyError, ValueError) as problem:
            raise ValueError(f"models.csv: model {key!r}: {problem}") from None
    return models


#: Group-limited routing of models.csv's MoE models that use it (its columns do not print
#: it): ``{model: (groups, groups per token)}``.
ROUTER_GROUPS = {
    # deepseek-ai/DeepSeek-V3 config.json n_group 8, topk_group 4 (arXiv 2412.19437
    # Section 2.1.2: each token goes to at most 4 nodes)
    "deepseek-v3": (8, 4),
}


#: Sliding-window attention of models.csv's models that use it (its columns do not print
#: it): ``{model: (window tokens, every N-th layer full)}``.
ATTENTION_WINDOWS = {
    # openai/gpt-oss-{20b,120b} config.json: "sliding_window": 128 and "layer_types"
    # alternating "sliding_attention", "full_attention" (sliding first; transformers
    # GptOssConfig's default pattern); gpt-oss model card (arXiv 2508.10925), model
    # architecture: attention alternates banded-window and dense layers, band 128 tokens
    "gpt-oss-120b": (128, 2),
    "gpt-oss-20b": (128, 2),
}


#: models.csv's models whose routed experts carry biases (its columns do not print it):
#: openai/gpt-oss-{20b,120b} checkpoints hold ``mlp.experts.gate_up_proj_bias`` and
#: ``mlp.experts.down_proj_bias`` per layer (transformers ``GptOssExperts``); Megatron-Bridge
#: ``GPTOSSProvider`` sets ``add_bias_linear=True`` (src/megatron/bridge/models/gpt_oss/
#: gpt_oss_provider.py).
EXPERT_BIASES = frozenset({"gpt-oss-120b", "gpt-oss-20b"})


def model_from_row(row: Mapping[str, str]) -> ModelSpec:
    """A ModelSpec from one row of ``models.csv`` (multi-head latent attention from its
    ``mla_*`` columns; group-limited routing from :data:`ROUTER_GROUPS`; sliding-window
    layers from :data:`ATTENTION_WINDOWS`).

    Raises:
        NotExpressible: a model whose notes print sliding-window layers that
            :data:`ATTENTION_WINDOWS` does not list.
        ValueError: for an unknown activation.
    """
    key = row["model"]
    mla = None
    if row.get("attention") == "mla":
        mla = MLASpec(q_lora_rank=int(row.get("mla_q_lora_rank") or 0),
                      kv_lora_rank=int(row["mla_kv_lora_rank"]),
                      qk_nope_head_dim=int(row["mla_qk_nope_dim"]),
                      qk_rope_head_dim=int(row["mla_qk_rope_dim"]),
                      v_head_dim=int(row["mla_v_dim"]))
    window, full_every = ATTENTION_WINDOWS.get(key, (0, 0))
    if "sliding-window" in row.get("notes", "") and not window:
        raise NotExpressible("sliding-window attention layers without a window in "
                             "ATTENTION_WINDOWS")
    activation = row["activation"]
    if activation not in MLP_OF_ACTIVATION:
        raise ValueError(f"activation: {activation!r} is not known; valid: "
                         f"{', '.join(MLP_OF_ACTIVATION)}")
    hidden, heads = int(row["hidden_size"]), int(row["num_heads"])
    head_dim = int(row["head_dim"]) if row.get("head_dim") else hidden // heads
    moe = None
    if int(row.get("num_experts") or 0) > 0:
        layout = row.get("moe_layer_freq_or_first_dense_layers", "") or "1"
        first_dense = int(layout.split("=", 1)[1]) if layout.startswith("first_dense=") else 0
        frequency = 1 if layout.startswith("first_dense=") else int(layout)
        groups, group_topk = ROUTER_GROUPS.get(key, (0, 0))
        moe = MoESpec(num_experts=int(row["num_experts"]), top_k=int(row["top_k"]),
                      expert_ffn_hidden_size=int(row["moe_ffn_hidden_size"]),
                      shared_experts=int(row.get("shared_experts") or 0), capacity_factor=0.0,
                      first_dense_layers=first_dense, layer_frequency=frequency,
                      router_groups=groups, router_group_topk=group_topk,
                      expert_bias=key in EXPERT_BIASES)
    return ModelSpec(name=key, num_layers=int(row["num_layers"]), hidden_size=hidden,
                     num_heads=heads, num_kv_heads=int(row["num_kv_heads"]),
                     head_dim=head_dim,
                     ffn_hidden_size=int(row["ffn_hidden_size"] or row["moe_ffn_hidden_size"]),
                     vocab_size=int(row["vocab_size"]), mlp=MLP_OF_ACTIVATION[activation],
                     norm="layernorm" if key.startswith(LAYERNORM_PREFIXES) else "rmsnorm",
                     tied_embeddings=row.get("tied_embeddings") == "yes",
                     dropout=key.startswith(DROPOUT_PREFIXES), moe=moe, mla=mla,
                     sliding_window=window, full_attention_every=full_every,
                     source=row.get("citation", ""))


def load_runs(directory: Path = DATA_DIR, sources: Iterable[str] | None = None
              ) -> list[PublishedRun]:
    """Every row of every ``train_*.csv`` (or of the given sources), in file order."""
    wanted = set(sources) if sources is not None else None
    runs = []
    for path in sorted(directory.glob("train_*.csv")):
        for row in _read_csv(path):
            if wanted is not None and row["source_id"] not in wanted:
                continue
            fields = {k: v for k, v in row.items() if v != ""}
            runs.append(PublishedRun(row["source_id"], row["row_id"], fields,
                                     _published_step_s(fields)))
    return runs


def _published_step_s(fields: Mapping[str, str]) -> float | None:
    """The published step time, or the one the published tokens/s per GPU gives."""
    if fields.get("measured_step_time_s"):
        return float(fields["measured_step_time_s"])
    tokens_per_gpu = fields.get("measured_tokens_per_s_per_gpu")
    if tokens_per_gpu and fields.get("global_batch_seqs") and fields.get("seq_len"):
        tokens = float(fields["global_batch_seqs"]) * float(fields["seq_len"])
        return tokens / (float(tokens_per_gpu) * float(fields["num_gpus"]))
    return None


def load_roles(directory: Path = DATA_DIR) -> dict:
    """The calibration rows of ``roles.toml``: ``{"calibration": {"source:row", ...},
    "calibration_by_preset": {preset: {"source:row", ...}}}`` (a row is a calibration row
    when its ``source_id:row_id`` or ``source_id:*`` is listed).

    Raises:
        ValueError: for a malformed file (naming it and the entry).
    """
    path = directory / "roles.toml"
    if not path.exists():
        return {"calibration": set(), "calibration_by_preset": {}}
    data = tomllib.loads(path.read_text())
    listed = data.get("calibration", {})
    by_preset: dict[str, set[str]] = {}
    for preset, entries in listed.items():
        if not isinstance(entries, list) or not all(
                isinstance(e, str) and ":" in e for e in entries):
            raise ValueError(f"roles.toml: calibration.{preset} is not valid; give a list of "
                             "'source_id:row_id' or 'source_id:*'")
        by_preset[preset] = set(entries)
    return {"calibration": set().union(*by_preset.values()) if by_preset else set(),
            "calibration_by_preset": by_preset}


def role_of(run: PublishedRun, roles: Mapping[str, set[str]]) -> str:
    """``calibration`` or ``validation``."""
    calibration = roles.get("calibration", set())
    if f"{run.source_id}:{run.row_id}" in calibration or f"{run.source_id}:*" in calibration:
        return "calibration"
    return "validation"


# --------------------------------------------------------------------------- scenarios


#: NeMo performance-recipe keys (validate/data/published/nemo_recipes) of models.csv keys.
NEMO_RECIPE_MODELS = {
    "gpt3-175b": ("gpt3", "175b"), "llama3-8b": ("llama3", "8b"), "llama3.1-8b": ("llama3", "8b"),
    "llama3-70b": ("llama3", "70b"), "llama3.1-70b": ("llama3", "70b"),
    "llama3.1-405b": ("llama31", "405b"), "nemotron4-15b": ("nemotron4", "15b"),
    "nemotron4-340b": ("nemotron4", "340b"), "nemotron3-8b": ("nemotron3", "8b"),
    "nemotron3-22b": ("nemotron3", "22b"), "qwen3-30b-a3b": ("qwen3", "30b_a3b"),
    "qwen3-235b-a22b": ("qwen3", "235b_a22b"), "deepseek-v3": ("deepseek", "v3"),
}
#: Systems of the recipe files by GPU of the published rows.
NEMO_RECIPE_SYSTEMS = {"H100-SXM": "h100", "B200": "b200", "GB200": "gb200"}


def load_nemo_recipes(directory: Path = DATA_DIR) -> list[dict[str, str]]:
    """Rows of NeMo's recommended performance configurations (nemo_recipes/README.md)."""
    rows: list[dict[str, str]] = []
    for path in sorted((directory / "nemo_recipes").glob("model_configs_*.csv")):
        rows += _read_csv(path)
    return rows


def nemo_recipe(run: PublishedRun, recipes: Sequence[Mapping[str, str]]) -> Mapping[str, str] | None:
    """The NeMo performance recipe a NeMo / Megatron-Bridge row ran: same model, size,
    system, dtype and GPU count (pre-training), else same but any GPU count; None if
    NeMo publishes none."""
    key = NEMO_RECIPE_MODELS.get(run.get("model"))
    system = NEMO_RECIPE_SYSTEMS.get(run.get("gpu"))
    if key is None or system is None:
        return None
    candidates = [r for r in recipes if r["task"] == "pre_train" and (r["model"], r["size"]) == key
                  and r["system"] == system and r["dtype"] == run.get("dtype")]
    exact = [r for r in candidates if int(float(r["num_gpus"])) == run.integer("num_gpus")]
    return (exact or candidates or [None])[0]


def preset_of(run: PublishedRun) -> str | None:
    """The cluster preset a published run simulates on (None: its GPU has none)."""
    if "96GB HBM2e" in run.get("notes"):  # torchtitan's benchmark hosts (its notes)
        return "grand-teton-h100-96gb"
    return GPU_PRESETS.get(run.get("gpu"))


def scenario_for(run: PublishedRun, models: Mapping[str, ModelSpec | str],
                 recipes: Sequence[Mapping[str, str]] = (), *,
                 preset_overrides: Mapping[str, Mapping[str, object]] | None = None
                 ) -> Scenario:
    """The simulator's inputs for one published run; ``preset_overrides``: dotted preset
    keys to change per preset name (e.g. a calibration trial's
    ``{"dgx-h100": {"gpu.sustained_fraction": 0.8}}``).

    Raises:
        NotExpressible: when the model, GPU, schedule or layout cannot be expressed yet.
    """
    model = models.get(run.get("model"))
    if model is None:
        raise NotExpressible(f"model {run.get('model')!r} is not in models.csv")
    if isinstance(model, str):
        raise NotExpressible(model)
    preset = preset_of(run)
    if preset is None:
        raise NotExpressible(f"GPU {run.get('gpu')!r} has no preset")
    base = load_cluster(preset)
    gpus_per_node = run.integer("gpus_per_node") or base.gpus_per_node
    nodes = -(-run.integer("num_gpus") // gpus_per_node)
    # the published job's own machine room: at least as many nodes as it used
    cluster = load_cluster(preset, {**dict((preset_overrides or {}).get(preset, {})),
                                    "max_nodes": max(nodes, base.max_nodes)})
    assumptions: list[str] = []
    tp, pp = run.integer("tp", 1), run.integer("pp", 1)
    cp, ep = run.integer("cp", 1), run.integer("ep", 1)
    gpus = run.integer("num_gpus")
    dp = gpus // (tp * pp * cp)
    if model.moe is None:
        ep = 1
    micro = run.integer("micro_batch")
    vpp = run.integer("vpp", 1) or 1
    schedule = "interleaved" if vpp > 1 else "1f1b"
    is_torchtitan = "torchtitan" in run.get("framework").lower()
    if is_torchtitan and pp > 1 and vpp == 1:
        # the schedule the row prints, with torchtitan's default stages per rank
        schedule, vpp = torchtitan_pipeline(run.get("citation") + " " + run.get("notes"), pp)
        if vpp > 1:
            assumptions.append(f"{vpp} stages per rank (torchtitan's default for the printed "
                               "interleaved schedule)")
    if micro is None and is_torchtitan:
        # torchtitan accumulates no gradients: a rank's local batch is one micro-batch,
        # split over the pipeline's stages when there is one (its default
        # pipeline_parallel_microbatches: the total number of stages, pp * vpp)
        local = run.integer("global_batch_seqs") // dp
        micro = max(1, local // (pp * vpp)) if pp > 1 else local
        assumptions.append(f"micro-batch {micro} (torchtitan: the local batch)")
    if micro is None:
        micro = 1
        assumptions.append("micro-batch 1 (not printed)")
    defaults = framework_defaults(run.get("framework"), run.get("framework_version"))
    fsdp = run.integer("fsdp", 0) or 0
    if fsdp > 0:  # sharding group printed: Megatron-FSDP / PyTorch FSDP
        defaults["zero"] = 2 if "SHARD_GRAD_OP" in run.get("notes") else 3
    if hsdp_shard(fsdp, dp):
        # a printed shard group smaller than DP: hybrid sharding, dp / fsdp replicas (the
        # dgxc MaxText rows' 'FSDP+DP', FSDP=128: ici_fsdp x dcn_fsdp with dcn_data replicas)
        defaults["dp_shard"] = fsdp
    recompute = run.get("recompute") or "none"
    recompute_layers = 0
    # NeMo's performance recipes are Megatron-Core (NeMo 2 / Megatron-Bridge) configs; NeMo
    # AutoModel (PyTorch FSDP2) runs its own benchmark YAMLs (published_stacks)
    megatron_stack = framework_kind(run.get("framework"),
                                    run.get("framework_version")) == "megatron-core"
    recipe = (nemo_recipe(run, recipes) if megatron_stack and (
              "nemo" in run.get("framework").lower()
              or "megatron-bridge" in run.get("framework").lower()) else None)
    if recipe is not None:
        # NeMo's performance scripts (nemo_recipes/README.md): TE userbuffers TP overlap,
        # FP8 runs reduce gradients in bf16, the recipe's recompute and FSDP choices
        defaults["tp_comm_overlap"] = "userbuffers"
        if run.get("dtype") == "fp8":
            defaults["grad_reduce_dtype"] = "bf16"
        if int(recipe["use_mcore_fsdp"] or 0):
            defaults["zero"] = 3
        if int(recipe["recompute_layers"] or 0) and not run.get("recompute"):
            recompute, recompute_layers = "full", int(recipe["recompute_layers"])
        assumptions.append(f"NeMo recipe {recipe['model']} {recipe['size']} {recipe['system']} "
                           f"{recipe['dtype']} ({recipe['num_gpus']} GPUs)")
    elif not run.get("recompute"):
        assumptions.append("no activation recompute (not printed)")
    fields = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro,
                  global_batch=run.integer("global_batch_seqs"), seq_len=run.integer("seq_len"),
                  recompute=recompute, recompute_layers=recompute_layers,
                  schedule=schedule, dtype=run.get("dtype"),
                  sequence_parallel=tp > 1, **defaults)
    stack = stack_settings(run.fields, fields, recipe, num_layers=model.num_layers)
    fields.update(stack.fields)
    model, moe_notes = _moe_settings(run, model, fields, recipe, recipes)
    if fields["recompute"] != "none":  # the framework's (or recipe's) recompute replaces "none"
        assumptions = [a for a in assumptions if not a.startswith("no activation recompute")]
    if any(n.startswith("host issue") for n in moe_notes):  # the MoE rule refines the stack's
        stack.notes[:] = [n for n in stack.notes if not n.startswith("host issue")]
    plan = ParallelPlan(**fields)
    return Scenario(model, cluster, plan, assumptions,
                    stack.notes + moe_notes + [f"unprinted: {u}" for u in stack.unprinted])


#: A row's notes naming a token-drop (capacity-factor) run: "tokendrop" or "token-drop",
#: but not the "token-dropless" of Megatron-Bridge's page note on its dropless benchmarks.
_TOKEN_DROP = re.compile(r"token-?drop(?!less)")


#: (model, GPU) whose Megatron-Bridge token-drop performance preset captures the whole
#: training iteration in one CUDA graph. Megatron-Bridge scripts/performance/configs/qwen3/
#: qwen3_30b_a3b_llm_pretrain.py (commit 4054233ae08b785aac1beeb028e66b6baf9dfc1b, the
#: 25.09-era presets: GB200 mb 4, B200 mb 1, EP 8, GBS 512 as the 25.09 rows print):
#: ``qwen3_30b_a3b_{gb200,b200}_8gpus_*_config`` default ``cuda_graph_impl="local"``,
#: ``cuda_graph_scope="full_iteration"`` with ``use_tokendrop=True``
#: (``apply_moe_token_drop``: capacity factor 1, padded), the H100 presets none. A full-
#: iteration graph needs static shapes and no device-to-host sync, which padded token drop
#: gives and the dropless dispatcher's tokens-per-expert sync
#: (megatron/core/transformer/moe/token_dispatcher.py ``_maybe_dtoh_and_synchronize``)
#: does not: the later dropless presets of the same model issue eagerly (x86) or with
#: partial graphs (Grace), the pair's difference on B200 (mb2509_19 vs mb2511_16).
_FULL_ITERATION_GRAPHS = frozenset({("qwen3-30b-a3b", "B200"), ("qwen3-30b-a3b", "GB200")})


def _moe_settings(run: PublishedRun, model: ModelSpec, fields: dict[str, object],
                  recipe: Mapping[str, str] | None, recipes: Sequence[Mapping[str, str]] = ()
                  ) -> tuple[ModelSpec, list[str]]:
    """The MoE and MLA settings a row runs with, set in ``fields``: its expert-TP (printed,
    else its NeMo recipe's, else TP as Megatron-Core defaults), the token dispatcher its
    framework names, the forward-backward all-to-all overlap its notes print, DualPipe and
    DeepSeek's FP8 dispatch, fine-grained FP8 scaling and recompute for DeepSeek's own run,
    and the MTP module where the row says it trained with one. Returns the model (with its
    MTP modules) and the notes.

    Raises:
        NotExpressible: a printed EP larger than a pipeline stage's ranks."""
    notes: list[str] = []
    if model.moe is None:
        return model, notes
    framework, text = run.get("framework").lower(), run.get("notes").lower()
    expert_tp = run.integer("expert_tp")
    if expert_tp is None and recipe is not None and recipe.get("etp_size"):
        expert_tp = int(float(recipe["etp_size"]))
        notes.append(f"expert-TP {expert_tp} (NeMo recipe etp_size)")
    # the model's NeMo recipe on the same system (in another dtype or size when the row
    # has none of its own): its expert-TP and recompute modules
    same = [r for r in recipes if (r["model"], r["size"]) == NEMO_RECIPE_MODELS.get(
            run.get("model")) and r["system"] == NEMO_RECIPE_SYSTEMS.get(run.get("gpu"))]
    family = recipe or (same[0] if same and "megatron-bridge" in framework else None)
    if expert_tp is None and recipe is None and family is not None and family.get("etp_size"):
        expert_tp = int(float(family["etp_size"]))
        notes.append(f"expert-TP {expert_tp} (the model's NeMo recipe on {family['system']}, "
                     f"{family['dtype']})")
    modules = tuple(m for m in (family or {}).get("recompute_modules", "").split("/") if m)
    megatron = framework_kind(run.get("framework"), run.get("framework_version")) == "megatron-core"
    if modules and megatron and not run.get("recompute") and fields.get("recompute") == "none":
        fields.update(recompute="selective", recompute_modules=modules)
        notes.append(f"unprinted: recompute modules {' '.join(modules)} (the model's NeMo "
                     f"recipe on {family['system']})")
    stage = fields["tp"] * fields["cp"] * fields["dp"]
    if stage % fields["ep"]:
        raise NotExpressible(f"EP {fields['ep']} exceeds the {stage} ranks of a pipeline stage: "
                             "the printed layout cannot run")
    if expert_tp is None and stage % (fields["tp"] * fields["ep"]):
        # Megatron-Core refuses expert-TP x EP not dividing a stage's ranks, so the run
        # used a smaller expert-TP: 1, the recipes' choice for fine-grained MoE
        expert_tp = 1
        notes.append(f"expert-TP 1 (expert-TP = TP {fields['tp']} would not fit EP "
                     f"{fields['ep']} in {stage} ranks)")
    if expert_tp is not None and expert_tp != fields["tp"]:
        fields["expert_tp"] = expert_tp
    if "deepep" in framework or "hybridep" in framework or "dualpipe" in framework:
        # DeepEP (and NVIDIA's HybridEP on NVL72): deduplicated network dispatch; DeepSeek's
        # own run dispatches in FP8 (arXiv 2412.19437 Section 3.3.2)
        fields["moe_dispatcher"] = "deepep"
        notes.append("DeepEP dispatcher (printed framework)")
    if "1f1b overlap" in text:
        fields["moe_a2a_overlap"] = True
        notes.append("EP all-to-all overlapped with the other micro-batch (printed '1f1b overlap')")
    if "dualpipe" in framework:
        fields.update(schedule="dualpipe", vpp=1, moe_dispatch_fp8=True,
                      fp8_recipe="te-blockwise")
        if "mla up-projection" in run.get("recompute_detail").lower():
            # RMSNorm and MLA up-projections (Section 3.2.3); the MoE SwiGLU's output,
            # its input cached instead (Section 3.3.2)
            fields["recompute_modules"] = ("layernorm", "mla_up_proj", "moe_act")
        notes.append("DualPipe, FP8 dispatch, 1x128/128x128 FP8 scaling, RMSNorm, MLA "
                     "up-projection and SwiGLU recompute (arXiv 2412.19437 Sections 3.2.1, "
                     "3.3, 3.2.3, 3.3.2)")
        # Low-precision storage (Section 3.3.3): BF16 Adam moments with fp32 master
        # weights and gradients; the attention output cached once in E5M6; the MoE
        # SwiGLU inputs cached in FP8 (their output is the moe_act recompute above)
        fields.update(optimizer_moments_dtype="bf16", e5m6_attention_output=True,
                      fp8_swiglu_inputs=True)
        notes.append("BF16 Adam moments, E5M6 attention outputs and FP8 SwiGLU inputs "
                     "cached (arXiv 2412.19437 Section 3.3.3)")
    kind = framework_kind(run.get("framework"), run.get("framework_version"))
    if kind in ("megatron-core", "pytorch-fsdp") and "dualpipe" not in framework:
        # PyTorch eager issues every kernel from the CPU and the dropless dispatcher syncs
        # once per MoE layer (ParallelPlan.host_issue); NVIDIA's DeepSeek-V3 GB200 work
        # (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization) added partial CUDA
        # graphs (attention, router, preprocess) before its HybridEP rows, and Megatron-
        # Bridge's MoE performance configs capture them on GB200 (Grace hosts)
        # (scripts/performance/configs/qwen/qwen3_workload_base_configs.py: every GB200
        # preset sets cuda_graph_impl "transformer_engine", cuda_graph_scope moe_router,
        # moe_preprocess and mostly attn; the x86 B200/H100 FP8 presets set none)
        partial = "hybridep" in framework or ("megatron-bridge" in framework
                                              and run.get("gpu") == "GB200")
        fields["host_issue"] = "partial" if partial else "eager"
        notes.append(f"host issue {fields['host_issue']} (the CPU launches "
                     + ("the routed experts" if partial else "every kernel")
                     + ("; padded to capacity: no dispatch sync)"
                        if fields.get("moe_pad_to_capacity")
                        else "; dropless dispatch syncs per layer)"))
    if _TOKEN_DROP.search(text):
        # NeMo's token-drop runs: capacity factor 1 with padding (static shapes, no sync)
        fields.update(moe_capacity_factor="1.0", moe_pad_to_capacity=True)
        notes.append("token drop: capacity factor 1.0, padded (printed 'tokendrop')")
        if ("megatron-bridge" in framework
                and (run.get("model"), run.get("gpu")) in _FULL_ITERATION_GRAPHS):
            # static shapes and no host sync: the whole iteration replays as one graph
            fields["host_issue"] = "graphed"
            notes[:] = [n for n in notes if not n.startswith("host issue")]
            notes.append("host issue graphed (Megatron-Bridge token-drop preset: "
                         "cuda_graph_scope full_iteration)")
    mtp = 1 if "w/ mtp" in text or "mtp module" in text else 0
    if mtp:
        model = replace(model, mtp_layers=mtp)
        notes.append("one MTP module (printed)")
    return model, notes


# --------------------------------------------------------------------------- evaluation


def evaluate(runs: Sequence[PublishedRun], *, fidelity: str = "analytic",
             roles: Mapping[str, set[str]] | None = None,
             models: Mapping[str, ModelSpec | str] | None = None,
             preset_overrides: Mapping[str, Mapping[str, object]] | None = None
             ) -> pd.DataFrame:
    """Simulate every run; one row each with the published and simulated step time.

    Columns: ``source_id``, ``row_id``, ``role``, ``model``, ``gpu``, ``dtype``,
    ``gpus``, ``published_step_s``, ``simulated_step_s``, ``error`` (relative),
    ``fits`` (the simulated peak memory fits the GPU), ``peak_memory_gib``,
    ``status`` (``ok``, ``not_expressible``, ``no_step_time``, ``error``), ``reason``
    (the assumptions, or why the row was not compared), ``settings`` (framework
    settings applied; :class:`Scenario`), ``gpu_name`` (the preset's GPU),
    ``speed_spread`` (its GPUs' spread, ``gpu.speed_spread``) and
    ``share_<component>`` (each component's share of the simulated step,
    :func:`sim.step_bands.band_shares`: what the prediction band is fitted on).
    ``preset_overrides``: as :func:`scenario_for`.
    """
    models = load_models() if models is None else models
    roles = load_roles() if roles is None else roles
    cache = PricingCache()
    recipes = load_nemo_recipes()
    rows = []
    for run in runs:
        row = {"source_id": run.source_id, "row_id": run.row_id, "role": role_of(run, roles),
               "model": run.get("model"), "gpu": run.get("gpu"), "dtype": run.get("dtype"),
               "gpus": run.integer("num_gpus"), "moe": _is_moe(models.get(run.get("model"))),
               "published_step_s": run.published_step_time_s,
               "simulated_step_s": math.nan, "error": math.nan, "fits": None,
               "peak_memory_gib": math.nan, "status": "ok", "reason": "", "settings": ""}
        try:
            scenario = scenario_for(run, models, recipes, preset_overrides=preset_overrides)
            result = simulate_step(scenario.model, scenario.cluster, scenario.plan,
                                   fidelity=fidelity, check_memory=False, cache=cache)
        except NotExpressible as reason:
            row.update(status="not_expressible", reason=str(reason))
        except (ValueError, OutOfMemoryError) as problem:
            row.update(status="error", reason=str(problem).splitlines()[0])
        else:
            row["simulated_step_s"] = result.step_time_s
            row["peak_memory_gib"] = result.peak_memory_bytes / 2**30
            row["fits"] = result.peak_memory_bytes <= scenario.cluster.gpu.hbm_bytes
            row["reason"] = "; ".join(scenario.assumptions)
            row["settings"] = "; ".join(scenario.settings)
            row["gpu_name"] = scenario.cluster.gpu.name
            row["speed_spread"] = scenario.cluster.gpu.speed_spread
            shares = band_shares(result.breakdown, result.step_time_s,
                                 dtype=scenario.plan.dtype, moe=scenario.model.moe is not None)
            row.update({f"share_{name}": value for name, value in shares.items()})
            published = run.published_step_time_s
            if published is None:
                published = _step_from_flop_rate(run, scenario)
                row["published_step_s"] = published
            if published is None:
                row["status"] = "no_step_time"
            else:
                row["error"] = result.step_time_s / published - 1
        rows.append(row)
    return pd.DataFrame(rows)


def _is_moe(model: ModelSpec | str | None) -> bool | None:
    """Whether a models.csv entry is a mixture of experts (None: not expressible)."""
    return None if model is None or isinstance(model, str) else model.moe is not None


def _step_from_flop_rate(run: PublishedRun, scenario: Scenario) -> float | None:
    """Step time from a published model TFLOP/s per GPU, counting the model's FLOPs the
    way the source's framework counts them (:func:`flop_rate_is_causal`): PaLM's
    ``6N + 12 L h s`` per token, or with Megatron-Core's causal attention count
    ``6N + 6 L h s`` (:func:`strategies.model_costs.model_flops_per_token`)."""
    tflops = run.get("measured_tflops_per_gpu")
    if not tflops:
        return None
    plan = scenario.plan
    flops = (model_costs.model_flops_per_token(scenario.model, plan.seq_len,
                                               causal=flop_rate_is_causal(run))
             * plan.global_batch * plan.seq_len)
    return flops / (float(tflops) * 1e12 * plan.world_size)


def flop_rate_is_causal(run: PublishedRun) -> bool:
    """Whether a row's published TFLOP/s count causal attention at half the ``s^2`` work:
    the TFLOP/s Megatron-Core's training loop logs (``megatron/training/training.py``
    ``num_floating_point_operations``, causal since 2025) for Megatron-Core rows printed
    as a FLOP rate only (the Megatron-Core MoE sources); Megatron-LM 2021 and the other
    sources count the full square (Narayanan et al. 2021; PaLM Appendix B)."""
    return framework_kind(run.get("framework"), run.get("framework_version")) == "megatron-core"


def summarize(frame: pd.DataFrame, *, role: str | None = "validation") -> pd.DataFrame:
    """Per source, then ``dense models``, ``MoE models`` and ``all``: rows compared, median
    and p90 of ``|error|``, bias (mean signed error), the worst row, and rows not compared
    (with why)."""
    chosen = frame if role is None else frame[frame["role"] == role]
    groups = [*sorted(chosen.groupby("source_id")),
              ("dense models", chosen[chosen["moe"] == False]),  # noqa: E712 (None: unknown)
              ("MoE models", chosen[chosen["moe"] == True]),  # noqa: E712
              ("all", chosen)]
    out = []
    for source, group in groups:
        compared = group[group["status"] == "ok"]
        errors = compared["error"].to_numpy(dtype=float)
        worst = compared.loc[compared["error"].abs().idxmax()] if len(compared) else None
        out.append({
            "source_id": source, "rows": len(group), "compared": len(compared),
            "median_abs_error": float(pd.Series(abs(errors)).median()) if len(errors) else math.nan,
            "p90_abs_error": float(pd.Series(abs(errors)).quantile(0.9)) if len(errors) else math.nan,
            "bias": float(errors.mean()) if len(errors) else math.nan,
            "worst_row": "" if worst is None else worst["row_id"],
            "worst_error": math.nan if worst is None else float(worst["error"]),
            "not_compared": len(group) - len(compared),
            "gpus": ", ".join(sorted(set(compared["gpu"]))),
            "dtypes": ", ".join(sorted(set(compared["dtype"]))),
        })
    return pd.DataFrame(out)
