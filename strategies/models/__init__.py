"""Model presets: load and validate decoder-only transformer specs.

A preset is a TOML file in this folder (``llama3-8b.toml`` is the preset
``llama3-8b``; files starting with ``_`` are not presets). Its keys mirror
:class:`strategies.model_spec.ModelSpec`::

    name = "my-model"              # optional; default: the file stem
    source = "where the numbers come from"   # optional
    num_layers = 32                # required, > 0
    hidden_size = 4096             # required, > 0
    num_heads = 32                 # required, > 0
    num_kv_heads = 8               # optional, default num_heads; must divide num_heads
    head_dim = 128                 # optional, default hidden_size / num_heads (must divide)
    ffn_hidden_size = 14336        # required, > 0
    vocab_size = 128256            # required, > 0
    mlp = "swiglu"                 # optional: gelu | swiglu (default swiglu)
    norm = "rmsnorm"               # optional: layernorm | rmsnorm (default rmsnorm)
    tied_embeddings = false        # optional, default false
    mtp_layers = 0                 # optional: multi-token prediction modules (DeepSeek-V3: 1)
    sliding_window = 0             # optional: keys a windowed layer's query attends (0: none)
    full_attention_every = 0       # optional: every N-th layer (1-based) is full attention

    [moe]                          # optional: mixture-of-experts layers
    num_experts = 8                # required in [moe], > 0
    top_k = 2                      # required in [moe], 1 <= top_k <= num_experts
    expert_ffn_hidden_size = 14336 # required in [moe], > 0
    shared_experts = 0             # optional, >= 0
    capacity_factor = 0.0          # optional, >= 0 (0 = dropless)
    first_dense_layers = 0         # optional, 0 <= x <= num_layers
    layer_frequency = 1            # optional, >= 1
    router_groups = 0              # optional: group-limited routing (0: none)
    router_group_topk = 0          # optional: groups a token may use

    [mla]                          # optional: multi-head latent attention (DeepSeek)
    q_lora_rank = 1536             # required in [mla], >= 0 (0: no query latent)
    kv_lora_rank = 512             # required in [mla], > 0
    qk_nope_head_dim = 128         # required in [mla], > 0
    qk_rope_head_dim = 64          # required in [mla], > 0
    v_head_dim = 128               # required in [mla], > 0

A native model file is the same schema at any path. A Hugging Face
``config.json`` already on disk (never downloaded) is accepted too:

* Llama style (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads`` (default: the heads), ``intermediate_size``,
  ``vocab_size``, ``tie_word_embeddings`` (default false), ``hidden_act``
  (``silu``/``swish`` -> swiglu, ``gelu*`` -> gelu, except Gemma's gated GELU
  -> swiglu), optional ``head_dim``; ``layer_norm_eps`` without
  ``rms_norm_eps`` means LayerNorm);
* GPT-2 style (``n_embd``, ``n_layer``, ``n_head``, ``n_inner`` (None ->
  4 * n_embd), ``vocab_size``; gelu, layernorm, tied embeddings);
* sliding-window attention: ``sliding_window`` (ignored when ``use_sliding_window`` is
  false) on the layers ``layer_types`` marks ``sliding_attention`` (one full layer every N),
  else Gemma 3's ``sliding_window_pattern``, Gemma 2's alternation, or every layer;
* BLOOM, Falcon and OPT configs, whose keys transformers maps onto Llama's
  (``attribute_map`` and ``__init__`` of ``BloomConfig``, ``FalconConfig``, ``OPTConfig``):
  BLOOM's ``n_layer``/``n_head`` with an MLP of 4 x ``hidden_size`` (``BloomMLP``) and
  GELU; Falcon's ``num_kv_heads`` (used when ``new_decoder_architecture``, else one K/V
  head with ``multi_query`` (the default) or every head), ``ffn_hidden_size`` (None ->
  4 x ``hidden_size``), ``activation``; OPT's ``ffn_dim``, ``activation_function`` (ReLU:
  two matmuls and an elementwise activation, priced as the ``gelu`` MLP kind) and
  ``dropout``; all three tie the embeddings unless ``tie_word_embeddings`` says otherwise
  (transformers' ``PretrainedConfig`` default). ALiBi, parallel attention and OPT-350m's
  ``word_embed_proj_dim`` projections are not priced;
* Mixtral MoE keys ``num_local_experts``, ``num_experts_per_tok`` (each expert
  of ``intermediate_size``);
* Qwen2-MoE / Qwen3-MoE keys ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``decoder_sparse_step`` (layer ``i`` is MoE when
  ``(i + 1) % step == 0``, transformers ``Qwen3MoeDecoderLayer``), ``mlp_only_layers`` (a
  leading run of dense layers), Qwen2-MoE's ``shared_expert_intermediate_size`` (a whole
  number of experts); OLMoE's ``num_experts`` (each expert of ``intermediate_size``). Any
  other config that names experts (``num_experts``, ``n_experts``, ``moe_num_experts``,
  ``ffn_config``) is refused rather than read as a dense model;
* DeepSeek MoE keys ``n_routed_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``n_shared_experts``, ``first_k_dense_replace``,
  ``moe_layer_freq``, ``n_group``, ``topk_group``, and multi-head latent attention
  (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``) and ``num_nextn_predict_layers`` (MTP modules).

Hugging Face MoE implementations never drop tokens, so configs load with
``capacity_factor = 0`` (dropless).

Every number in a built-in preset carries a ``# source:`` comment (same line,
or the comment line directly above); :func:`model_sources` returns them.

All problems raise :class:`ValueError` with a one-line message naming the
key, the bad value, the file and what is valid.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from hardware.toml_sources import source_comments
from hardware.user_input import load_input, read_input_text
from strategies.model_spec import MLP_KINDS, NORM_KINDS, MLASpec, ModelSpec, MoESpec

__all__ = ["MODELS_DIR", "list_models", "load_model", "model_sources", "validate_model"]

MODELS_DIR = Path(__file__).resolve().parent

# key: (type, check, required); check in "positive", "nonnegative", "at_least_1", or a tuple of choices
_TOP: dict[str, tuple[type, Any, bool]] = {
    "name": (str, "", False),
    "source": (str, "", False),
    "num_layers": (int, "positive", True),
    "hidden_size": (int, "positive", True),
    "num_heads": (int, "positive", True),
    "num_kv_heads": (int, "positive", False),
    "head_dim": (int, "positive", False),
    "ffn_hidden_size": (int, "positive", True),
    "vocab_size": (int, "positive", True),
    "mlp": (str, MLP_KINDS, False),
    "norm": (str, NORM_KINDS, False),
    "tied_embeddings": (bool, "", False),
    "dropout": (bool, "", False),
    "mtp_layers": (int, "nonnegative", False),
    "sliding_window": (int, "nonnegative", False),
    "full_attention_every": (int, "nonnegative", False),
}
_MLA: dict[str, tuple[type, Any, bool]] = {
    "q_lora_rank": (int, "nonnegative", True),
    "kv_lora_rank": (int, "positive", True),
    "qk_nope_head_dim": (int, "positive", True),
    "qk_rope_head_dim": (int, "positive", True),
    "v_head_dim": (int, "positive", True),
}
_MOE: dict[str, tuple[type, Any, bool]] = {
    "num_experts": (int, "positive", True),
    "top_k": (int, "positive", True),
    "expert_ffn_hidden_size": (int, "positive", True),
    "shared_experts": (int, "nonnegative", False),
    "capacity_factor": (float, "nonnegative", False),
    "first_dense_layers": (int, "nonnegative", False),
    "layer_frequency": (int, "positive", False),
    "router_groups": (int, "nonnegative", False),
    "router_group_topk": (int, "nonnegative", False),
    "expert_bias": (bool, None, False),
}
_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
#: Largest size, count or ratio a model may give (10 million: 30x the largest vocabulary
#: or width of any published model); beyond it every cost overflows into nonsense.
MAX_MODEL_NUMBER = 10_000_000

#: hidden_act values of Hugging Face configs and the MLP they mean.
_HF_ACTIVATIONS = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_fast": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python": "gelu",
    "quick_gelu": "gelu",
}


# --------------------------------------------------------------------------- public API


def list_models() -> list[str]:
    """Names of the built-in presets, sorted (``*.toml`` here not starting with ``_``)."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.toml") if not p.name.startswith("_"))


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """Load a model preset, a native TOML model file or a Hugging Face config.json.

    Args:
        name_or_path: a built-in preset name (see :func:`list_models`), the path
            of a ``.toml`` file in the preset schema (module docstring), or the
            path of a Hugging Face ``config.json`` (any ``.json`` file).

    Returns:
        A validated :class:`ModelSpec` (see :func:`validate_model`).

    Raises:
        ValueError: one line naming the key, value, file and what is valid:
            unknown preset (lists the valid names), missing file, invalid
            TOML/JSON, unknown or missing key, wrong type, non-positive size,
            heads not dividing hidden (when head_dim is absent), kv heads not
            dividing heads, unknown mlp/norm/hidden_act, top_k > num_experts.
    """
    path = _locate(name_or_path)
    if path.suffix.lower() == ".json":
        return _load_hf(path)
    return _load_toml(path)


def model_sources(name_or_path: str | os.PathLike[str]) -> dict[str, str]:
    """``{dotted key: citation}`` from the ``# source:`` comments of a TOML model file.

    A comment applies to the key on its own line or to the key on the line
    directly below it. Keys are dotted (``"moe.top_k"``).

    Raises:
        ValueError: unknown preset, missing file, or a JSON (Hugging Face) file.
    """
    path = _locate(name_or_path)
    if path.suffix.lower() == ".json":
        raise ValueError(f"model: {str(path)!r} is a Hugging Face config; only TOML model files carry # source: comments")
    return source_comments(_read(path))


def validate_model(spec: ModelSpec, *, where: str = "") -> ModelSpec:
    """Check a :class:`ModelSpec` and return it unchanged.

    Checks: positive sizes of at most :data:`MAX_MODEL_NUMBER`; ``num_kv_heads`` divides ``num_heads``; ``mlp``
    and ``norm`` are known kinds; for MoE: positive expert counts and sizes,
    ``top_k <= num_experts``, ``capacity_factor >= 0``, ``shared_experts >= 0``,
    ``0 <= first_dense_layers <= num_layers``, ``layer_frequency >= 1``.

    Args:
        where: appended to messages (e.g. ``"in /path/model.toml"``).

    Raises:
        ValueError: one line naming the field, the value and what is valid.
    """
    at = f" in {where}" if where else f" in model {spec.name!r}"
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "vocab_size"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{field}: {value!r} must be a positive integer{at}")
        if value > MAX_MODEL_NUMBER:
            raise ValueError(f"{field}: {value!r} is not valid{at}; give at most "
                             f"{MAX_MODEL_NUMBER:,}")
    if spec.num_heads % spec.num_kv_heads:
        raise ValueError(
            f"num_kv_heads: {spec.num_kv_heads} does not divide num_heads {spec.num_heads}{at}; "
            f"valid: {', '.join(map(str, _divisors(spec.num_heads)))}"
        )
    if spec.mlp not in MLP_KINDS:
        raise ValueError(f"mlp: {spec.mlp!r} is not an MLP kind{at}; valid: {', '.join(MLP_KINDS)}")
    if spec.norm not in NORM_KINDS:
        raise ValueError(f"norm: {spec.norm!r} is not a norm kind{at}; valid: {', '.join(NORM_KINDS)}")
    if not isinstance(spec.mtp_layers, int) or isinstance(spec.mtp_layers, bool) \
            or spec.mtp_layers < 0:
        raise ValueError(f"mtp_layers: {spec.mtp_layers!r} must be an integer >= 0{at}")
    for field in ("sliding_window", "full_attention_every"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{field}: {value!r} must be an integer >= 0{at} (0: none)")
    if spec.full_attention_every and not spec.sliding_window:
        raise ValueError(f"full_attention_every: {spec.full_attention_every} needs a "
                         f"sliding_window{at}; valid: 0 without a window")
    if spec.mla is not None:
        for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(spec.mla, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"mla.{field}: {value!r} must be a positive integer{at}")
        if not isinstance(spec.mla.q_lora_rank, int) or spec.mla.q_lora_rank < 0:
            raise ValueError(f"mla.q_lora_rank: {spec.mla.q_lora_rank!r} must be an integer "
                             f">= 0{at} (0: no query compression)")
    moe = spec.moe
    if moe is not None:
        for field in ("num_experts", "top_k", "expert_ffn_hidden_size", "layer_frequency"):
            value = getattr(moe, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"moe.{field}: {value!r} must be a positive integer{at}")
            if value > MAX_MODEL_NUMBER:
                raise ValueError(f"moe.{field}: {value!r} is not valid{at}; give at most "
                                 f"{MAX_MODEL_NUMBER:,}")
        for field in ("shared_experts", "first_dense_layers"):
            value = getattr(moe, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"moe.{field}: {value!r} must be an integer >= 0{at}")
        if moe.top_k > moe.num_experts:
            raise ValueError(f"moe.top_k: {moe.top_k} exceeds moe.num_experts {moe.num_experts}{at}; valid: 1..{moe.num_experts}")
        if not moe.capacity_factor >= 0:
            raise ValueError(f"moe.capacity_factor: {moe.capacity_factor!r} must be >= 0{at} (0 = dropless)")
        if moe.router_group_topk > moe.router_groups or (
                moe.router_groups and moe.num_experts % moe.router_groups):
            raise ValueError(
                f"moe.router_group_topk: {moe.router_group_topk} of {moe.router_groups} router "
                f"groups is not valid{at}; valid: groups dividing the {moe.num_experts} experts "
                "and at most that many picked (0 and 0: no group limit)")
        if moe.first_dense_layers > spec.num_layers:
            raise ValueError(
                f"moe.first_dense_layers: {moe.first_dense_layers} exceeds num_layers {spec.num_layers}{at}; "
                f"valid: 0..{spec.num_layers}"
            )
    return spec


# --------------------------------------------------------------------------- locating


def _locate(ref: str | os.PathLike[str]) -> Path:
    text = os.fspath(ref)
    if text in list_models():
        return MODELS_DIR / f"{text}.toml"
    path = Path(text).expanduser()
    looks_like_path = path.suffix.lower() in (".toml", ".json") or "/" in text or os.sep in text
    if looks_like_path:
        if path.exists():
            return path.resolve()  # _read refuses what is not a regular file
        raise ValueError(f"model: file {str(path)!r} not found; give a preset name, a .toml model file or a config.json")
    raise ValueError(
        f"model: {text!r} is not a preset; valid: {', '.join(list_models())} "
        "(or a path to a .toml model file or a Hugging Face config.json)"
    )


# --------------------------------------------------------------------------- native TOML


_HINT = "give a preset name, a .toml model file or a Hugging Face config.json"


def _read(path: Path) -> str:
    return read_input_text(path, what="model", hint=_HINT)


def _load_toml(path: Path) -> ModelSpec:
    data, _ = load_input(path, what="model", hint=_HINT, syntax="toml")
    where = f"in {path}"
    for key in data:
        if key not in ("moe", "mla") and key not in _TOP:
            raise ValueError(f"{key}: unknown key {where}; valid keys: "
                             f"{', '.join([*_TOP, 'moe', 'mla'])}")
    top = {key: _coerce(data[key], spec, key, where) for key, spec in _TOP.items() if key in data}
    for key, (_, _, required) in _TOP.items():
        if required and key not in top:
            raise ValueError(f"{key}: missing required key {where}; add it at the top level")

    moe = None
    if "moe" in data:
        table = data["moe"]
        if not isinstance(table, Mapping):
            raise ValueError(f"moe: {table!r} must be a table [moe] {where}")
        for key in table:
            if key not in _MOE:
                raise ValueError(f"moe.{key}: unknown key {where}; valid keys of [moe]: {', '.join(_MOE)}")
        values = {key: _coerce(table[key], spec, f"moe.{key}", where) for key, spec in _MOE.items() if key in table}
        for key, (_, _, required) in _MOE.items():
            if required and key not in values:
                raise ValueError(f"moe.{key}: missing required key {where}; add it to [moe]")
        moe = MoESpec(**values)

    mla = None
    if "mla" in data:
        table = data["mla"]
        if not isinstance(table, Mapping):
            raise ValueError(f"mla: {table!r} must be a table [mla] {where}")
        for key in table:
            if key not in _MLA:
                raise ValueError(f"mla.{key}: unknown key {where}; valid keys of [mla]: "
                                 f"{', '.join(_MLA)}")
        values = {key: _coerce(table[key], spec, f"mla.{key}", where)
                  for key, spec in _MLA.items() if key in table}
        for key in _MLA:
            if key not in values:
                raise ValueError(f"mla.{key}: missing required key {where}; add it to [mla]")
        mla = MLASpec(**values)

    heads = top["num_heads"]
    head_dim = top.get("head_dim") or _head_dim(top["hidden_size"], heads, "num_heads", where)
    spec = ModelSpec(
        name=top.get("name", path.stem),
        num_layers=top["num_layers"],
        hidden_size=top["hidden_size"],
        num_heads=heads,
        num_kv_heads=top.get("num_kv_heads", heads),
        head_dim=head_dim,
        ffn_hidden_size=top["ffn_hidden_size"],
        vocab_size=top["vocab_size"],
        mlp=top.get("mlp", "swiglu"),
        norm=top.get("norm", "rmsnorm"),
        tied_embeddings=top.get("tied_embeddings", False),
        dropout=top.get("dropout", False),
        moe=moe,
        mla=mla,
        mtp_layers=top.get("mtp_layers", 0),
        sliding_window=top.get("sliding_window", 0),
        full_attention_every=top.get("full_attention_every", 0),
        source=top.get("source", f"model file {path}"),
    )
    return validate_model(spec, where=str(path))


def _coerce(value: Any, spec: tuple[type, Any, bool], key: str, where: str) -> Any:
    kind, check, _ = spec
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ValueError(f"{key}: {value!r} must be {_WORDS[kind]} {where}")
    if isinstance(check, tuple):
        if value not in check:
            raise ValueError(f"{key}: {value!r} is not valid {where}; valid: {', '.join(check)}")
    elif check == "positive" and value <= 0:
        raise ValueError(f"{key}: {value!r} must be > 0 {where}")
    elif check == "nonnegative" and value < 0:
        raise ValueError(f"{key}: {value!r} must be >= 0 {where}")
    if kind in (int, float) and not value <= MAX_MODEL_NUMBER:  # also NaN, inf
        raise ValueError(f"{key}: {value!r} is not valid {where}; give at most "
                         f"{MAX_MODEL_NUMBER:,}")
    return value


def _head_dim(hidden: int, heads: int, heads_key: str, where: str) -> int:
    if heads <= 0 or hidden % heads:
        raise ValueError(
            f"{heads_key}: {heads} does not divide hidden size {hidden} {where} and no head_dim is given; "
            f"valid: a divisor of {hidden} (e.g. {', '.join(map(str, _divisors(hidden)[-6:]))}) or give head_dim"
        )
    return hidden // heads


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


# --------------------------------------------------------------------------- Hugging Face


def _load_hf(path: Path) -> ModelSpec:
    cfg, _ = load_input(path, what="model", hint=_HINT, syntax="json")
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {path} is not a JSON object; expected a Hugging Face config.json")
    where = f"in {path}"
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    source = f"Hugging Face config {path}"

    if "n_embd" in cfg:  # GPT-2 style
        hidden = _hf_int(cfg, "n_embd", where)
        heads = _hf_int(cfg, "n_head", where)
        inner = cfg.get("n_inner")
        spec = ModelSpec(
            name=name,
            num_layers=_hf_int(cfg, "n_layer", where),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=_head_dim(hidden, heads, "n_head", where),
            ffn_hidden_size=4 * hidden if inner is None else _hf_int(cfg, "n_inner", where),
            vocab_size=_hf_int(cfg, "vocab_size", where),
            mlp="gelu",
            norm="layernorm",
            tied_embeddings=True,
            dropout=_hf_rate(cfg, "resid_pdrop", 0.1, where) > 0,  # GPT-2 default 0.1
            source=source,
        )
        return validate_model(spec, where=str(path))

    cfg = _hf_llama_keys(cfg, where)
    if "hidden_size" not in cfg:
        raise ValueError(
            f"hidden_size: missing {where}; a Hugging Face config needs Llama-style keys "
            "(hidden_size, num_hidden_layers, ...) or GPT-2-style keys (n_embd, n_layer, ...)"
        )
    hidden = _hf_int(cfg, "hidden_size", where)
    heads = _hf_int(cfg, "num_attention_heads", where)
    kv_heads = heads if cfg.get("num_key_value_heads") is None else _hf_int(cfg, "num_key_value_heads", where)
    mla = None
    if cfg.get("kv_lora_rank") is not None:  # DeepSeek-V2/V3, Kimi K2: latent attention
        mla = MLASpec(q_lora_rank=_hf_int(cfg, "q_lora_rank", where, default=0, minimum=0),
                      kv_lora_rank=_hf_int(cfg, "kv_lora_rank", where),
                      qk_nope_head_dim=_hf_int(cfg, "qk_nope_head_dim", where),
                      qk_rope_head_dim=_hf_int(cfg, "qk_rope_head_dim", where),
                      v_head_dim=_hf_int(cfg, "v_head_dim", where))
    if mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    elif cfg.get("head_dim") is not None:
        head_dim = _hf_int(cfg, "head_dim", where)
    else:
        head_dim = _head_dim(hidden, heads, "num_attention_heads", where)
    family = str(cfg.get("model_type", ""))
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if family == "opt" and act == "relu":
        # OPTDecoderLayer fc1 -> ReLU -> fc2: the two-matmul MLP kind (a Llama-style
        # config's "relu" would gate it, three matmuls: refused below)
        act = "gelu"
    if not isinstance(act, str) or act.lower() not in _HF_ACTIVATIONS:
        raise ValueError(f"hidden_act: {act!r} is not supported {where}; valid: {', '.join(_HF_ACTIVATIONS)}")
    mlp = _HF_ACTIVATIONS[act.lower()]
    if family.startswith("gemma"):
        mlp = "swiglu"  # gated GELU: three matmuls, priced as swiglu
    has_ln = "layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg
    norm = "layernorm" if has_ln and "rms_norm_eps" not in cfg else "rmsnorm"
    tied = cfg.get("tie_word_embeddings", family in _HF_TIED_BY_DEFAULT)
    if not isinstance(tied, bool):
        raise ValueError(f"tie_word_embeddings: {tied!r} must be true or false {where}")
    ffn = _hf_int(cfg, "intermediate_size", where)

    moe = None
    if cfg.get("num_local_experts") is not None:  # Mixtral
        moe = MoESpec(
            num_experts=_hf_int(cfg, "num_local_experts", where),
            top_k=_hf_int(cfg, "num_experts_per_tok", where),
            expert_ffn_hidden_size=ffn,
            capacity_factor=0.0,
            # transformers GptOssExperts (models/gpt_oss/modeling_gpt_oss.py) always has
            # gate_up_proj_bias and down_proj_bias; Mixtral's experts have none
            expert_bias=family == "gpt_oss",
        )
    elif family in ("qwen2_moe", "qwen3_moe") and cfg.get("num_experts"):
        moe = _hf_qwen_moe(cfg, where)
    elif family == "olmoe" and cfg.get("num_experts"):
        # transformers OlmoeSparseMoeBlock: every layer, experts of intermediate_size
        moe = MoESpec(num_experts=_hf_int(cfg, "num_experts", where),
                      top_k=_hf_int(cfg, "num_experts_per_tok", where),
                      expert_ffn_hidden_size=ffn, capacity_factor=0.0)
    elif cfg.get("n_routed_experts") is not None:  # DeepSeek
        moe = MoESpec(
            num_experts=_hf_int(cfg, "n_routed_experts", where),
            top_k=_hf_int(cfg, "num_experts_per_tok", where),
            expert_ffn_hidden_size=_hf_int(cfg, "moe_intermediate_size", where),
            shared_experts=_hf_int(cfg, "n_shared_experts", where, default=0, minimum=0),
            capacity_factor=0.0,
            first_dense_layers=_hf_int(cfg, "first_k_dense_replace", where, default=0, minimum=0),
            layer_frequency=_hf_int(cfg, "moe_layer_freq", where, default=1),
            router_groups=_hf_int(cfg, "n_group", where, default=0, minimum=0),
            router_group_topk=_hf_int(cfg, "topk_group", where, default=0, minimum=0),
        )
    if moe is None:
        for key in _HF_EXPERT_KEYS:
            if cfg.get(key):
                raise ValueError(
                    f"{key}: {cfg[key]!r} in a {family or 'model_type-less'} config {where} "
                    "names experts this loader does not read (it reads Mixtral, DeepSeek, "
                    "Qwen2-MoE, Qwen3-MoE and OLMoE configs); write a native model TOML "
                    "with a [moe] table instead")
    spec = ModelSpec(
        name=name,
        num_layers=_hf_int(cfg, "num_hidden_layers", where),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=ffn,
        vocab_size=_hf_int(cfg, "vocab_size", where),
        mlp=mlp,
        norm=norm,
        tied_embeddings=tied,
        dropout=_hf_rate(cfg, "hidden_dropout" if "hidden_dropout" in cfg else
                         "attention_dropout", 0.0, where) > 0,
        moe=moe,
        mla=mla,
        mtp_layers=_hf_int(cfg, "num_nextn_predict_layers", where, default=0, minimum=0),
        **_hf_window(cfg, where),
        source=source,
    )
    return validate_model(spec, where=str(path))


_MISSING = object()

#: model_types whose transformers config leaves ``tie_word_embeddings`` at
#: ``PretrainedConfig``'s default (True) and whose LM head is tied to the embedding
#: (``_tied_weights_keys = ["lm_head.weight"]`` of BloomForCausalLM, FalconForCausalLM,
#: OPTForCausalLM). Llama-style configs default to untied (LlamaConfig: False).
_HF_TIED_BY_DEFAULT = frozenset({"bloom", "falcon", "opt"})

#: Keys that name experts in Hugging Face configs of MoE families (Qwen, OLMoE, Jamba,
#: DBRX's ``ffn_config``, ...); a config carrying one that no branch reads is refused.
_HF_EXPERT_KEYS = ("num_experts", "n_experts", "moe_num_experts", "ffn_config")


def _hf_llama_keys(cfg: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``cfg`` with BLOOM's, Falcon's and OPT's keys renamed to the Llama-style ones
    :func:`_load_hf` reads, their defaults filled in as transformers fills them
    (``BloomConfig.attribute_map``; ``FalconConfig.__init__`` and ``FalconAttention``
    for the K/V heads; ``OPTConfig``); other configs unchanged."""
    family = str(cfg.get("model_type", ""))
    out = dict(cfg)
    if family == "bloom":
        for old, new in (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads")):
            if new not in out and old in out:
                out[new] = out[old]
        if "hidden_size" in out and isinstance(out["hidden_size"], int):
            out.setdefault("intermediate_size", 4 * out["hidden_size"])  # BloomMLP
        out.setdefault("hidden_act", "gelu")  # bloom_gelu_forward: tanh-approximated GELU
    elif family == "falcon":
        heads = out.get("num_attention_heads")
        if out.get("new_decoder_architecture"):
            kv = out.get("num_kv_heads", heads)
        elif out.get("multi_query", True):
            kv = 1
        else:
            kv = heads
        out.setdefault("num_key_value_heads", kv)
        if out.get("ffn_hidden_size") is not None:
            out.setdefault("intermediate_size", out["ffn_hidden_size"])
        elif "hidden_size" in out and isinstance(out["hidden_size"], int):
            out.setdefault("intermediate_size", 4 * out["hidden_size"])
        out.setdefault("hidden_act", out.get("activation", "gelu"))
    elif family == "opt":
        if "ffn_dim" in out:
            out.setdefault("intermediate_size", out["ffn_dim"])
        out.setdefault("hidden_act", out.get("activation_function", "relu"))
        if "dropout" in out:
            out.setdefault("hidden_dropout", out["dropout"])
        out.setdefault("layer_norm_eps", 1e-5)  # OPTDecoderLayer: nn.LayerNorm, default eps
    return out


def _hf_qwen_moe(cfg: Mapping[str, Any], where: str) -> MoESpec:
    """The experts of a Qwen2-MoE / Qwen3-MoE config (transformers
    ``Qwen3MoeDecoderLayer``: layer ``i`` is sparse when it is not in ``mlp_only_layers``
    and ``(i + 1) % decoder_sparse_step == 0``; Qwen2-MoE adds a shared expert of
    ``shared_expert_intermediate_size``).

    Raises:
        ValueError: ``mlp_only_layers`` that is not a leading run of layers with
            ``decoder_sparse_step`` 1, or a shared expert that is not a whole number of
            routed experts.
    """
    expert = _hf_int(cfg, "moe_intermediate_size", where)
    step = _hf_int(cfg, "decoder_sparse_step", where, default=1)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or (dense and (step != 1 or dense != list(range(len(dense))))):
        raise ValueError(f"mlp_only_layers: {dense!r} is not valid {where}; valid: [] or a "
                         f"leading run [0, 1, ..., n-1] with decoder_sparse_step 1 (got {step})")
    shared_size = _hf_int(cfg, "shared_expert_intermediate_size", where, default=0, minimum=0)
    if shared_size % expert:
        raise ValueError(f"shared_expert_intermediate_size: {shared_size} is not a whole number "
                         f"of experts of moe_intermediate_size {expert} {where}; valid: a "
                         f"multiple of {expert}")
    return MoESpec(num_experts=_hf_int(cfg, "num_experts", where),
                   top_k=_hf_int(cfg, "num_experts_per_tok", where),
                   expert_ffn_hidden_size=expert,
                   shared_experts=shared_size // expert,
                   capacity_factor=0.0,
                   # trainsim's layer l is MoE when (l - first) % freq == 0
                   first_dense_layers=len(dense) if dense else step - 1,
                   layer_frequency=step)

#: ``layer_types`` entries of Hugging Face configs (transformers ``configuration_utils``
#: ``ALLOWED_LAYER_TYPES``) and whether the layer is windowed.
_HF_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


def _hf_window(cfg: Mapping[str, Any], where: str) -> dict[str, int]:
    """``sliding_window`` and ``full_attention_every`` of a Hugging Face config: its
    ``sliding_window`` (keys a query attends, itself included: transformers'
    ``sliding_window_causal_mask_function`` keeps ``q - window < kv <= q``) unless
    ``use_sliding_window`` is false (Qwen2/Qwen3 configs carry a window they do not use);
    which layers use it from ``layer_types`` (gpt-oss, Gemma 2/3, transformers >= 4.53),
    else Gemma 2's alternation (``sliding_window_pattern`` / every other layer) or, for
    Mistral-style configs, every layer.

    Raises:
        ValueError: a ``layer_types`` entry that is not known, or a pattern that is not
            one full layer every N (what Megatron-Core's ``window_attn_skip_freq`` and
            :class:`~strategies.model_spec.ModelSpec` express).
    """
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return {}
    window = _hf_int(cfg, "sliding_window", where)
    types = cfg.get("layer_types")
    if types is None:
        if cfg.get("sliding_window_pattern") is not None:  # Gemma 3 before layer_types
            every = _hf_int(cfg, "sliding_window_pattern", where)
        elif str(cfg.get("model_type", "")) == "gemma2":
            every = 2  # Gemma 2 alternates local and global layers, local first
        else:
            every = 0  # Mistral: every layer
        return {"sliding_window": window, "full_attention_every": every}
    if not isinstance(types, list) or any(t not in _HF_LAYER_TYPES for t in types):
        raise ValueError(f"layer_types: {types!r} is not valid {where}; valid entries: "
                         f"{', '.join(_HF_LAYER_TYPES)}")
    windowed = [_HF_LAYER_TYPES[t] for t in types]
    if all(windowed):
        return {"sliding_window": window, "full_attention_every": 0}
    if not any(windowed):
        return {}
    every = windowed.index(False) + 1
    if any(windowed[i] != bool((i + 1) % every) for i in range(len(windowed))):
        raise ValueError(f"layer_types: the pattern {types!r} is not one full-attention layer "
                         f"every N {where}; valid: N-1 sliding layers then one full layer")
    return {"sliding_window": window, "full_attention_every": every}


def _hf_rate(cfg: Mapping[str, Any], key: str, default: float, where: str) -> float:
    """A dropout probability of a config (None or absent: ``default``)."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{key}: {value!r} is not valid {where}; give a probability 0 <= p <= 1")
    return float(value)


def _hf_int(cfg: Mapping[str, Any], key: str, where: str, *, default: Any = _MISSING, minimum: int = 1) -> int:
    value = cfg.get(key, _MISSING)
    if value is _MISSING or value is None:
        if default is not _MISSING:
            return default
        raise ValueError(f"{key}: missing required key {where}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: {value!r} must be an integer {where}")
    if value < minimum:
        raise ValueError(f"{key}: {value!r} must be >= {minimum} {where}")
    if value > MAX_MODEL_NUMBER:
        raise ValueError(f"{key}: {value!r} is not valid {where}; give at most "
                         f"{MAX_MODEL_NUMBER:,}")
    return value


