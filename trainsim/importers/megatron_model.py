"""Megatron-LM's network-size, tokenizer and MoE settings -> the ModelSpec they train.

Megatron-LM's defaults where a setting is absent (``megatron/training/arguments.py``,
NVIDIA/Megatron-LM commit 000c4ac2): ``--ffn-hidden-size`` 4h, or ``int(8h/3 / 64) * 64``
with ``--swiglu``; ``--kv-channels`` h / heads; ``--num-query-groups`` only with
``--group-query-attention``; LayerNorm; learned absolute position embeddings; tied
embeddings; dropout 0.1; the tokenizer's vocabulary padded to a multiple of
``--make-vocab-size-divisible-by`` (128) x TP (``_vocab_size_with_padding``);
``--moe-router-topk 2``; ``--moe-ffn-hidden-size`` the FFN size; ``--moe-layer-freq 1``;
dropless routing; no multi-token prediction; multi-head (not latent) attention.
"""

from __future__ import annotations

import math

from strategies.model_spec import MLASpec, ModelSpec, MoESpec
from strategies.models import MAX_MODEL_NUMBER as _MAX, validate_model
from trainsim.importers.job import Settings
from trainsim.importers.patterns import moe_layout
from trainsim.importers.setting_kinds import GPT2_VOCAB, KNOWN_TOKENIZERS

__all__ = ["model_from_settings"]


def model_from_settings(s: Settings, *, tp: int, notes: list[str]) -> ModelSpec:
    """The ModelSpec of a job's network-size, tokenizer and MoE settings.

    Raises:
        ValueError: a missing size, a tokenizer whose vocabulary trainsim cannot know, or
            a MoE layout a ModelSpec cannot express (one line).
    """
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        if s.get(name) is None and s.shape_hint:
            raise ValueError(f"{s.spelled(name)}: missing from {s.source}; {s.shape_hint}")
    layers = s.required("num_layers", maximum=_MAX)
    hidden = s.required("hidden_size", maximum=_MAX)
    heads = s.required("num_attention_heads", maximum=_MAX)
    swiglu = bool(s.value("swiglu", bool, False)) or bool(s.value("quick_geglu", bool,
                                                                    False))
    if s.value("squared_relu", bool, False):
        if swiglu:
            raise ValueError(f"{s.spelled('squared_relu')}: give it or {s.spelled('swiglu')}, "
                             "not both")
        notes.append(f"{s.spelled('squared_relu')}: priced as the two-matmul GELU MLP (its "
                     "activation kernel moves the same bytes)")
    if s.has("ffn_hidden_size") and s.get("ffn_hidden_size") is not None:
        ffn = s.value("ffn_hidden_size", int, minimum=1, maximum=_MAX)
    else:
        # arguments.py validate_args: 4h, or 2/3 of it rounded down to 64 for gated units
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        notes.append(f"{s.spelled('ffn_hidden_size')} not given: {ffn} (Megatron-LM's "
                     "default)")
    if s.has("kv_channels") and s.get("kv_channels") is not None:
        head_dim = s.value("kv_channels", int, minimum=1, maximum=_MAX)
    elif hidden % heads:
        raise ValueError(f"{s.spelled('num_attention_heads')}: {heads} does not divide "
                         f"{s.spelled('hidden_size')} {hidden}; give {s.spelled('kv_channels')}")
    else:
        head_dim = hidden // heads
    kv_heads = heads
    if s.value("group_query_attention", bool, False):
        kv_heads = s.value("num_query_groups", int, 1, minimum=1, maximum=_MAX)
    norm = s.value("normalization", str, "LayerNorm", choices=("LayerNorm", "RMSNorm"))
    dropout = max(s.value("hidden_dropout", float, 0.1),
                  s.value("attention_dropout", float, 0.1)) > 0
    position = s.value("position_embedding_type", str, "learned_absolute")
    if s.value("use_rotary_position_embeddings", bool, False):
        position = "rope"
    if position not in ("learned_absolute", "rope", "none"):
        raise ValueError(f"{s.spelled('position_embedding_type')}: {position!r} is refused: "
                         "only learned-absolute and rotary position embeddings are modelled")
    notes.append(f"position embedding {position}: not priced (as for every model here: "
                 "rotary embeddings have no weights, learned ones are 0.02 % of GPT-3)")
    if s.value("add_bias_linear", bool, True):
        notes.append(f"{s.spelled('add_bias_linear')}: linear layers with biases (Megatron's "
                     "default): biases are not priced")
    vocab = _vocab(s, tp, notes)
    moe = _moe_spec(s, layers, ffn, notes)
    mla = _mla_spec(s)
    if mla is not None:
        # as the deepseek-v3 preset: the query/key width, keys and values on every head
        head_dim, kv_heads = mla.qk_nope_head_dim + mla.qk_rope_head_dim, heads
    spec = ModelSpec(name=_model_name(s), num_layers=layers, hidden_size=hidden,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     ffn_hidden_size=ffn, vocab_size=vocab,
                     mlp="swiglu" if swiglu else "gelu",
                     norm="rmsnorm" if norm == "RMSNorm" else "layernorm",
                     tied_embeddings=not s.value("untie_embeddings_and_output_weights", bool,
                                                False),
                     dropout=dropout, moe=moe, mla=mla,
                     mtp_layers=s.value("mtp_num_layers", int, None, minimum=0) or 0,
                     **_window(s), source=s.source)
    # The checks every model passes (sizes within the model schema's bound, kv heads
    # dividing heads, top-k within the experts), with the job's own flags named above.
    return validate_model(spec)


def _window(s: Settings) -> dict[str, int]:
    """``sliding_window`` and ``full_attention_every`` of ``--window-size LEFT,RIGHT`` and
    ``--window-attn-skip-freq N`` (Megatron-Core ``TransformerConfig.window_size`` /
    ``window_attn_skip_freq``; ``megatron/core/transformer/utils.py``
    ``is_layer_window_attention``: layer ``n`` (1-based) is windowed unless ``n % N == 0``).
    A window ``(left, 0)`` lets a query see itself and ``left`` keys before it: ``left + 1``
    keys; ``left = -1`` is no window.

    Raises:
        ValueError: a window that is not ``(left, 0)`` with ``left >= -1``, or a
            per-layer list for ``--window-attn-skip-freq`` (one line naming the flag).
    """
    every = s.get("window_attn_skip_freq")  # read even alone: Megatron ignores it then
    raw = s.get("window_size")
    if raw is None:
        return {}
    spelled = s.spelled("window_size")
    parts = raw.replace("(", "").replace(")", "").split(",") if isinstance(raw, str) else raw
    try:
        left, right = (int(str(p).strip()) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{spelled}: {raw!r} is not valid; give LEFT,RIGHT (e.g. 128,0)"
                         ) from None
    if right != 0 or left < -1:
        raise ValueError(f"{spelled}: {raw!r} is not valid; valid: LEFT,0 with LEFT >= -1 "
                         "(a causal window; -1: none)")
    if left == -1:
        return {}
    if every is not None and not (isinstance(every, int) or str(every).strip().isdigit()):
        raise ValueError(f"{s.spelled('window_attn_skip_freq')}: {every!r} is not valid; "
                         "give N (every N-th layer full attention): per-layer lists are "
                         "not modelled")
    return {"sliding_window": left + 1,
            "full_attention_every": 0 if every is None else int(str(every).strip())}


def _model_name(s: Settings) -> str:
    return f"imported ({s.source})"


def _vocab(s: Settings, tp: int, notes: list[str]) -> int:
    """The padded vocabulary (Megatron ``_vocab_size_with_padding``: a multiple of
    ``--make-vocab-size-divisible-by`` x TP)."""
    if s.has("padded_vocab_size") and s.get("padded_vocab_size") is not None:
        return s.value("padded_vocab_size", int, minimum=1, maximum=_MAX)
    kind = s.value("tokenizer_type", str, None)
    if s.has("vocab_size") and s.get("vocab_size") is not None:
        tokens = s.value("vocab_size", int, minimum=1, maximum=_MAX)
        if kind == "NullTokenizer":
            tokens += 1  # the null tokenizer adds its end-of-document token
    elif kind in (None, "GPT2BPETokenizer"):
        tokens = GPT2_VOCAB
        if kind is None:
            notes.append(f"no {s.spelled('tokenizer_type')}: GPT2BPETokenizer, "
                         "pretrain_gpt.py's default (50,257 tokens)")
    else:
        name = str(s.get("tokenizer_model") or "").lower()
        known = [(count, why) for words, count, why in KNOWN_TOKENIZERS
                 if any(word in name for word in words)]
        if not known:
            raise ValueError(f"{s.spelled('tokenizer_type')}: {kind!r} keeps its vocabulary in "
                             f"files trainsim does not read ({s.spelled('tokenizer_model')} "
                             f"{s.get('tokenizer_model')!r}); give "
                             f"{s.spelled('padded_vocab_size')} N")
        tokens, why = known[0]
        notes.append(f"{s.spelled('tokenizer_model')} {s.get('tokenizer_model')!r}: {tokens} "
                     f"tokens ({why})")
    tokens += s.value("vocab_extra_ids", int, 0, minimum=0, maximum=_MAX)
    multiple = s.value("make_vocab_size_divisible_by", int, 128, minimum=1,
                       maximum=_MAX) * tp
    padded = math.ceil(tokens / multiple) * multiple
    notes.append(f"vocabulary {tokens} tokens padded to a multiple of {multiple} "
                 f"(make-vocab-size-divisible-by x TP): {padded}")
    return padded


def _moe_spec(s: Settings, layers: int, ffn: int, notes: list[str]) -> MoESpec | None:
    experts = s.value("num_experts", int, None, minimum=0, maximum=_MAX)
    if not experts:
        return None
    expert_ffn = s.value("moe_ffn_hidden_size", int, None, minimum=1, maximum=_MAX) or ffn
    shared = 0
    shared_size = s.value("moe_shared_expert_intermediate_size", int, None, minimum=1,
                          maximum=_MAX)
    if shared_size:
        if shared_size % expert_ffn:
            raise ValueError(f"{s.spelled('moe_shared_expert_intermediate_size')}: "
                             f"{shared_size} is refused: a model here has shared experts of "
                             f"the routed experts' size ({expert_ffn}), and this is not a "
                             "multiple of it")
        shared = shared_size // expert_ffn
    first_dense, frequency = moe_layout(s.get("moe_layer_freq", 1), layers,
                                        flag=s.spelled("moe_layer_freq"))
    # group-limited routing (DeepSeek-V3's node-limited routing): a token's experts lie in
    # --moe-router-group-topk of --moe-router-num-groups expert groups
    groups = s.value("moe_router_num_groups", int, None, minimum=1, maximum=_MAX) or 0
    group_topk = s.value("moe_router_group_topk", int, None, minimum=1, maximum=_MAX) or 0
    if bool(groups) != bool(group_topk):
        given = "moe_router_num_groups" if groups else "moe_router_group_topk"
        missing = "moe_router_group_topk" if groups else "moe_router_num_groups"
        raise ValueError(f"{s.spelled(given)}: group-limited routing needs "
                         f"{s.spelled(missing)} too")
    # the capacity (tokens dropped or padded) is a plan setting (megatron_config._moe):
    # the model routes dropless
    top_k = s.value("moe_router_topk", int, 2, minimum=1, maximum=_MAX)
    return MoESpec(num_experts=experts, top_k=top_k,
                   expert_ffn_hidden_size=expert_ffn, shared_experts=shared,
                   capacity_factor=0.0, first_dense_layers=first_dense,
                   layer_frequency=frequency, router_groups=groups,
                   router_group_topk=group_topk)


def _mla_spec(s: Settings) -> MLASpec | None:
    """Multi-head latent attention (``--multi-latent-attention``) with its sizes; the
    query latent is optional (``--q-lora-rank`` absent: queries projected directly, as
    Megatron-Core's ``MLASelfAttention`` does), the others are required here rather than
    taken from a default."""
    if not s.value("multi_latent_attention", bool, False):
        return None
    sizes = {}
    for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
        if s.get(name) is None:
            raise ValueError(f"{s.spelled(name)}: missing from {s.source}; give it with "
                             f"{s.spelled('multi_latent_attention')} (trainsim takes no "
                             "default for the MLA sizes)")
        sizes[name] = s.value(name, int, minimum=1)
    return MLASpec(q_lora_rank=s.value("q_lora_rank", int, None, minimum=1) or 0,
                   kv_lora_rank=sizes["kv_lora_rank"], qk_nope_head_dim=sizes["qk_head_dim"],
                   qk_rope_head_dim=sizes["qk_pos_emb_head_dim"],
                   v_head_dim=sizes["v_head_dim"])
