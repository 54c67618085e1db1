"""Model specifications: decoder-only transformers, dense or mixture-of-experts.

Plain frozen data; loading presets and Hugging Face configs lives in
:mod:`strategies.models`, costs (FLOPs, bytes, activations) in
:mod:`strategies.model_costs`.
"""

from __future__ import annotations

from dataclasses import dataclass

MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts layers.

    Attributes:
        num_experts: routed experts per MoE layer.
        top_k: experts each token is sent to.
        expert_ffn_hidden_size: hidden size of one expert's MLP.
        shared_experts: always-active experts (DeepSeek), each of
            ``expert_ffn_hidden_size``.
        capacity_factor: tokens an expert accepts relative to a perfectly
            balanced load (1.0 = exactly balanced; >1 pads, so costs scale
            with it); 0 means dropless (no padding, costs at balance).
        first_dense_layers: leading layers that stay dense (DeepSeek-V3: 3).
        layer_frequency: every ``layer_frequency``-th layer after those is MoE
            (1 = all of them).
        router_groups: the experts split in this many groups for group-limited
            routing (DeepSeek-V3 ``n_group`` 8; Megatron ``--moe-router-num-groups``);
            0 = no limit.
        router_group_topk: groups a token's experts may come from (DeepSeek-V3
            ``topk_group`` 4, its node-limited routing; Megatron
            ``--moe-router-group-topk``); 0 = no limit.
        expert_bias: the routed experts' up and down projections carry biases, one per
            expert (gpt-oss: ``gate_up_proj_bias`` and ``down_proj_bias`` of Hugging Face's
            ``GptOssExperts``; Megatron-Core ``add_bias_linear`` on ``TEGroupedMLP``). How a
            stack adds them is the plan's ``expert_bias_impl``.
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_experts: int = 0
    capacity_factor: float = 1.0
    first_dense_layers: int = 0
    layer_frequency: int = 1
    router_groups: int = 0
    router_group_topk: int = 0
    expert_bias: bool = False


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Section 2.1; DeepSeek-V3,
    arXiv 2412.19437, Section 2.1.1; Megatron-Core ``MLASelfAttention``).

    Queries are projected down to ``q_lora_rank`` and up to every head's ``nope + rope``
    dims; keys and values share one ``kv_lora_rank`` latent (plus one ``qk_rope_head_dim``
    rotary key shared by the heads) expanded to ``nope`` key and ``v_head_dim`` value dims
    per head. Only the latent and the rotary key are cached at inference.

    Attributes:
        q_lora_rank: the query latent (0: queries projected from the hidden state directly,
            DeepSeek-V2-Lite).
        kv_lora_rank: the shared key/value latent.
        qk_nope_head_dim: per-head query/key dims without position.
        qk_rope_head_dim: per-head query/key dims with rotary position.
        v_head_dim: per-head value dims.
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer.

    Attributes:
        name: preset or file name.
        num_layers: transformer layers.
        hidden_size: model width h.
        num_heads: query heads.
        num_kv_heads: key/value heads (= num_heads for MHA, 1 for MQA).
        head_dim: width of one head (usually hidden_size / num_heads).
        ffn_hidden_size: hidden size of the dense MLP.
        vocab_size: vocabulary size.
        mlp: ``gelu`` (2 matmuls) or ``swiglu`` (3 matmuls).
        norm: ``layernorm`` or ``rmsnorm``.
        tied_embeddings: the output head reuses the input embedding matrix.
        dropout: the model trains with dropout layers (GPT-2/GPT-3 recipes, Megatron
            GPT: 0.1); Llama, Mixtral and DeepSeek train without (their masks cost
            memory and HBM traffic only when this is True).
        moe: mixture-of-experts layers, or None for a dense model.
        mla: multi-head latent attention, or None for multi-head/grouped-query attention
            (then ``num_kv_heads`` and ``head_dim`` describe it).
        sliding_window: keys a query of a sliding-window (local) attention layer attends,
            itself included (Hugging Face ``sliding_window``; Megatron-Core's ``window_size``
            ``(left, 0)`` is ``left + 1``); 0: every layer attends to the whole causal
            prefix. Mistral-7B-v0.1: 4096 on every layer; gpt-oss: 128 on every other
            layer; Gemma 2: 4096 on every other layer, Gemma 3: 1024 on 5 of 6 layers.
        full_attention_every: with ``sliding_window``, every this-many-th layer
            (1-based: layers ``N, 2N, ...``) attends to the whole prefix and the others
            to the window, as Megatron-Core's ``window_attn_skip_freq`` integer
            (``megatron/core/transformer/utils.py`` ``is_layer_window_attention``:
            ``layer_number % N != 0`` is windowed) and Hugging Face's ``layer_types``
            of gpt-oss (2), Gemma 2 (2) and Gemma 3 (6); 0: every layer is windowed.
        mtp_layers: multi-token prediction modules trained beside the model (DeepSeek-V3
            report Section 2.2: one; each a transformer layer, a ``2h x h`` projection and
            two norms, sharing the embedding and the output head); not in the total.
        source: where the numbers come from (paper, config file).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    tied_embeddings: bool = False
    dropout: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: int = 0
    sliding_window: int = 0
    full_attention_every: int = 0
    source: str = ""

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width: ``head_dim``, or MLA's ``nope + rope``."""
        return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int:
        """Per-head value width: ``head_dim``, or MLA's ``v_head_dim``."""
        return self.mla.v_head_dim if self.mla else self.head_dim

    def attention_window(self, layer: int) -> int:
        """Keys a query of layer ``layer`` (0-based) attends at most: the sliding window
        of a windowed layer, 0 for a layer attending to the whole causal prefix (see
        ``full_attention_every``)."""
        if self.sliding_window <= 0:
            return 0
        if self.full_attention_every and (layer + 1) % self.full_attention_every == 0:
            return 0
        return self.sliding_window

    def layer_kind(self, layer: int) -> tuple[bool, int]:
        """What a layer's kernels depend on: ``(is MoE, attention window)``; layers of
        one kind cost the same."""
        return self.is_moe_layer(layer), self.attention_window(layer)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is a mixture-of-experts layer."""
        if self.moe is None or layer < self.moe.first_dense_layers:
            return False
        return (layer - self.moe.first_dense_layers) % self.moe.layer_frequency == 0
