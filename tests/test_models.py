"""Tests for strategies.models: presets, sources, native TOML files, HF configs, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import one_line_error as _error

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from strategies.model_spec import MLASpec, MLP_KINDS, NORM_KINDS, ModelSpec, MoESpec
from strategies.models import MODELS_DIR, list_models, load_model, model_sources, validate_model

PRESETS = [
    "deepseek-v3",
    "gpt3-175b",
    "llama2-13b",
    "llama2-70b",
    "llama2-7b",
    "llama3-405b",
    "llama3-70b",
    "llama3-8b",
    "mixtral-8x7b",
]



def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- presets


def test_list_models_is_sorted_and_complete():
    assert list_models() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(name):
    spec = load_model(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name
    assert spec.source
    assert spec.mlp in MLP_KINDS and spec.norm in NORM_KINDS
    assert spec.num_heads % spec.num_kv_heads == 0
    assert validate_model(spec) is spec


@pytest.mark.parametrize("name", PRESETS)
def test_every_number_in_a_preset_has_a_source(name):
    path = MODELS_DIR / f"{name}.toml"
    data = tomllib.loads(path.read_text())
    sources = model_sources(name)
    leaves = {**{k: v for k, v in data.items() if k not in ("moe", "mla")},
              **{f"moe.{k}": v for k, v in data.get("moe", {}).items()},
              **{f"mla.{k}": v for k, v in data.get("mla", {}).items()}}
    for key, value in leaves.items():
        if key in ("name", "source"):
            continue
        assert key in sources and sources[key].strip(), f"{name}: {key} = {value!r} has no # source:"


def test_preset_values_match_the_papers():
    m = load_model("llama3-405b")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size,
            m.vocab_size) == (126, 16384, 128, 8, 53248, 128256)
    g = load_model("gpt3-175b")
    assert (g.num_layers, g.hidden_size, g.num_heads, g.ffn_hidden_size, g.vocab_size) == \
        (96, 12288, 96, 4 * 12288, 50257)
    assert (g.mlp, g.norm, g.tied_embeddings) == ("gelu", "layernorm", True)
    x = load_model("mixtral-8x7b")
    assert x.moe == MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336, capacity_factor=0.0)
    assert (x.num_layers, x.hidden_size, x.num_kv_heads, x.ffn_hidden_size) == (32, 4096, 8, 14336)
    d = load_model("deepseek-v3")
    assert d.moe == MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, shared_experts=1,
                            capacity_factor=0.0, first_dense_layers=3, layer_frequency=1,
                            router_groups=8, router_group_topk=4)
    assert (d.num_layers, d.hidden_size, d.num_heads, d.head_dim, d.ffn_hidden_size, d.vocab_size) == \
        (61, 7168, 128, 192, 18432, 129280)
    assert d.mla == MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                            qk_rope_head_dim=64, v_head_dim=128)
    assert (d.qk_head_dim, d.v_head_dim, d.mtp_layers) == (192, 128, 1)
    assert [d.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    l2 = load_model("llama2-70b")
    assert (l2.num_heads, l2.num_kv_heads) == (64, 8)


def test_unknown_preset_lists_valid_names():
    message = _error(load_model, "llama4-9000b")
    assert "'llama4-9000b'" in message
    for name in PRESETS:
        assert name in message


def test_missing_file_is_named(tmp_path):
    message = _error(load_model, str(tmp_path / "nope.toml"))
    assert "nope.toml" in message and "not found" in message


# ---------------------------------------------------------------------------- native TOML

SMALL = """
name = "tiny"
num_layers = 2
hidden_size = 64
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 128
vocab_size = 1000
"""


def test_native_file_loads_with_defaults(tmp_path):
    spec = load_model(_write(tmp_path / "tiny.toml", SMALL))
    assert spec == ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                             head_dim=16, ffn_hidden_size=128, vocab_size=1000, mlp="swiglu",
                             norm="rmsnorm", tied_embeddings=False, moe=None,
                             source=f"model file {(tmp_path / 'tiny.toml').resolve()}")


def test_native_file_with_moe_and_head_dim(tmp_path):
    text = SMALL.replace('name = "tiny"\n', "") + "head_dim = 24\n[moe]\nnum_experts = 4\ntop_k = 2\nexpert_ffn_hidden_size = 32\ncapacity_factor = 1\n"
    spec = load_model(str(_write(tmp_path / "other.toml", text)))
    assert spec.name == "other"
    assert spec.head_dim == 24
    assert spec.moe == MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, capacity_factor=1.0)
    assert isinstance(spec.moe.capacity_factor, float)


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("num_layers = 2\n", ""), ["num_layers", "missing"]),
    (lambda t: t.replace("hidden_size = 64", "hidden_size = 0"), ["hidden_size", "0", "> 0"]),
    (lambda t: t.replace("hidden_size = 64", "hidden_size = -64"), ["hidden_size", "-64"]),
    (lambda t: t.replace("hidden_size = 64", 'hidden_size = "64"'), ["hidden_size", "integer"]),
    (lambda t: t.replace("hidden_size = 64", "hidden_size = 64.0"), ["hidden_size", "integer"]),
    (lambda t: t.replace("num_heads = 4", "num_heads = 5"), ["num_heads", "5", "64", "head_dim"]),
    (lambda t: t.replace("num_kv_heads = 2", "num_kv_heads = 3"), ["num_kv_heads", "3", "4"]),
    (lambda t: t + 'mlp = "relu"\n', ["mlp", "relu", "gelu", "swiglu"]),
    (lambda t: t + 'norm = "batchnorm"\n', ["norm", "batchnorm", "rmsnorm"]),
    (lambda t: t + "tied_embeddings = 1\n", ["tied_embeddings", "true or false"]),
    (lambda t: t + "hidden = 3\n", ["hidden", "unknown key", "hidden_size"]),
    (lambda t: t + "[moe]\nnum_experts = 4\ntop_k = 2\n", ["moe.expert_ffn_hidden_size", "missing"]),
    (lambda t: t + "[moe]\nnum_experts = 4\ntop_k = 8\nexpert_ffn_hidden_size = 8\n", ["moe.top_k", "8", "1..4"]),
    (lambda t: t + "[moe]\nnum_experts = 4\ntop_k = 1\nexpert_ffn_hidden_size = 8\ncapacity_factor = -1\n",
     ["moe.capacity_factor", "-1"]),
    (lambda t: t + "[moe]\nnum_experts = 4\ntop_k = 1\nexpert_ffn_hidden_size = 8\nfoo = 1\n", ["moe.foo", "unknown"]),
    (lambda t: t + "[moe]\nnum_experts = 4\ntop_k = 1\nexpert_ffn_hidden_size = 8\nfirst_dense_layers = 3\n",
     ["moe.first_dense_layers", "3", "0..2"]),
    (lambda t: t + "num_layers = [", ["not valid TOML"]),
])
def test_bad_native_files_raise_one_line_errors(tmp_path, edit, words):
    path = _write(tmp_path / "bad.toml", edit(SMALL))
    message = _error(load_model, path)
    for word in words:
        assert word in message, message
    assert "bad.toml" in message, message


def test_validate_model_rejects_bad_specs():
    good = load_model("llama3-8b")
    from dataclasses import replace
    assert "num_kv_heads" in _error(validate_model, replace(good, num_kv_heads=5))
    assert "head_dim" in _error(validate_model, replace(good, head_dim=0))
    assert "moe.top_k" in _error(validate_model, replace(
        good, moe=MoESpec(num_experts=2, top_k=3, expert_ffn_hidden_size=8)))


# ---------------------------------------------------------------------------- Hugging Face configs


LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False, "vocab_size": 128256, "torch_dtype": "bfloat16",
}


def test_hf_llama_config_matches_the_preset(tmp_path):
    path = _write(tmp_path / "Meta-Llama-3-8B" / "config.json", json.dumps(LLAMA3_8B_CONFIG))
    spec = load_model(path)
    preset = load_model("llama3-8b")
    assert spec.name == "Meta-Llama-3-8B"
    assert "config.json" in spec.source
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "vocab_size", "mlp", "norm", "tied_embeddings", "moe"):
        assert getattr(spec, field) == getattr(preset, field), field


def test_hf_llama_defaults_kv_heads_and_reads_head_dim(tmp_path):
    cfg = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    cfg["head_dim"] = 256
    spec = load_model(_write(tmp_path / "m.json", json.dumps(cfg)))
    assert (spec.num_kv_heads, spec.head_dim, spec.tied_embeddings, spec.name) == (32, 256, False, "m")


def test_hf_gpt2_config(tmp_path):
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
           "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    spec = load_model(_write(tmp_path / "gpt2" / "config.json", json.dumps(cfg)))
    assert spec == ModelSpec(name="gpt2", num_layers=12, hidden_size=768, num_heads=12, num_kv_heads=12,
                             head_dim=64, ffn_hidden_size=3072, vocab_size=50257, mlp="gelu",
                             norm="layernorm", tied_embeddings=True, dropout=True,
                             source=spec.source)  # GPT-2 trains with resid_pdrop 0.1
    cfg["n_inner"] = 1000
    assert load_model(_write(tmp_path / "g2.json", json.dumps(cfg))).ffn_hidden_size == 1000


def test_hf_mixtral_config_matches_the_preset(tmp_path):
    cfg = {"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "vocab_size": 32000}
    spec = load_model(_write(tmp_path / "mixtral" / "config.json", json.dumps(cfg)))
    preset = load_model("mixtral-8x7b")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "vocab_size", "mlp", "norm", "tied_embeddings", "moe"):
        assert getattr(spec, field) == getattr(preset, field), field


def test_hf_deepseek_config_matches_the_preset(tmp_path):
    cfg = {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
           "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
           "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-06,
           "tie_word_embeddings": False, "vocab_size": 129280, "n_group": 8, "topk_group": 4,
           "num_nextn_predict_layers": 1}
    spec = load_model(_write(tmp_path / "DeepSeek-V3" / "config.json", json.dumps(cfg)))
    preset = load_model("deepseek-v3")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "vocab_size", "mlp", "norm", "tied_embeddings", "moe",
                  "mla", "mtp_layers"):
        assert getattr(spec, field) == getattr(preset, field), field


# BigScience's bloom config.json (huggingface.co/bigscience/bloom), the keys the loader reads
BLOOM_CONFIG = {"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "n_head": 112,
                "vocab_size": 250880, "layer_norm_epsilon": 1e-05, "hidden_dropout": 0.0,
                "attention_dropout": 0.0}
# tiiuae/falcon-180B config.json
FALCON_180B_CONFIG = {"model_type": "falcon", "hidden_size": 14848, "num_hidden_layers": 80,
                      "num_attention_heads": 232, "num_kv_heads": 8, "multi_query": True,
                      "new_decoder_architecture": True, "parallel_attn": True, "alibi": False,
                      "bias": False, "layer_norm_epsilon": 1e-05, "vocab_size": 65024}
# facebook/opt-66b config.json (the released OPT sizes share the layout of OPT-175B)
OPT_66B_CONFIG = {"model_type": "opt", "hidden_size": 9216, "num_hidden_layers": 64,
                  "num_attention_heads": 72, "ffn_dim": 36864, "vocab_size": 50272,
                  "activation_function": "relu", "dropout": 0.1, "do_layer_norm_before": True,
                  "word_embed_proj_dim": 9216, "max_position_embeddings": 2048}
# Qwen/Qwen3-30B-A3B config.json
QWEN3_30B_A3B_CONFIG = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                        "intermediate_size": 6144, "moe_intermediate_size": 768,
                        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                        "mlp_only_layers": [], "hidden_act": "silu", "rms_norm_eps": 1e-06,
                        "tie_word_embeddings": False, "vocab_size": 151936}


def test_hf_bloom_falcon_opt_configs_read_their_own_keys(tmp_path):
    """A user's BLOOM config once failed with "num_attention_heads: missing": its keys are
    transformers' attribute_map aliases, and the MLP width is implied (4 x hidden)."""
    bloom = load_model(_write(tmp_path / "bloom" / "config.json", json.dumps(BLOOM_CONFIG)))
    assert (bloom.num_layers, bloom.num_heads, bloom.num_kv_heads, bloom.head_dim,
            bloom.ffn_hidden_size, bloom.mlp, bloom.norm, bloom.tied_embeddings,
            bloom.dropout) == (70, 112, 112, 128, 57344, "gelu", "layernorm", True, False)
    falcon = load_model(_write(tmp_path / "falcon" / "config.json", json.dumps(FALCON_180B_CONFIG)))
    assert (falcon.num_layers, falcon.num_heads, falcon.num_kv_heads, falcon.head_dim,
            falcon.ffn_hidden_size, falcon.mlp, falcon.norm, falcon.tied_embeddings) == (
        80, 232, 8, 64, 59392, "gelu", "layernorm", True)
    falcon7 = dict(FALCON_180B_CONFIG, new_decoder_architecture=False)  # multi-query: one K/V head
    assert load_model(_write(tmp_path / "f7.json", json.dumps(falcon7))).num_kv_heads == 1
    falcon7["multi_query"] = False
    assert load_model(_write(tmp_path / "f7b.json", json.dumps(falcon7))).num_kv_heads == 232
    opt = load_model(_write(tmp_path / "opt" / "config.json", json.dumps(OPT_66B_CONFIG)))
    assert (opt.num_layers, opt.num_heads, opt.ffn_hidden_size, opt.mlp, opt.norm,
            opt.tied_embeddings, opt.dropout) == (64, 72, 36864, "gelu", "layernorm", True, True)
    untied = dict(OPT_66B_CONFIG, tie_word_embeddings=False)
    assert not load_model(_write(tmp_path / "o2.json", json.dumps(untied))).tied_embeddings


def test_hf_qwen_moe_config_is_read_as_moe(tmp_path):
    """A Qwen3-MoE config was read as a dense 48-layer model of FFN 6144 (MFU 54 % on a
    3B-active model): its experts are under num_experts, which no branch read."""
    spec = load_model(_write(tmp_path / "q" / "config.json", json.dumps(QWEN3_30B_A3B_CONFIG)))
    assert spec.moe == MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768,
                               capacity_factor=0.0)
    assert [spec.is_moe_layer(i) for i in range(4)] == [True] * 4
    step2 = dict(QWEN3_30B_A3B_CONFIG, decoder_sparse_step=2)  # layers 1, 3, ... are MoE
    spec2 = load_model(_write(tmp_path / "q2.json", json.dumps(step2)))
    assert [spec2.is_moe_layer(i) for i in range(6)] == [False, True] * 3
    lead = dict(QWEN3_30B_A3B_CONFIG, mlp_only_layers=[0, 1])
    spec3 = load_model(_write(tmp_path / "q3.json", json.dumps(lead)))
    assert [spec3.is_moe_layer(i) for i in range(4)] == [False, False, True, True]
    qwen2 = dict(QWEN3_30B_A3B_CONFIG, model_type="qwen2_moe", moe_intermediate_size=2560,
                 shared_expert_intermediate_size=20480)  # Qwen2-57B-A14B: 8 experts' worth
    assert load_model(_write(tmp_path / "q4.json", json.dumps(qwen2))).moe.shared_experts == 8
    olmoe = {k: v for k, v in QWEN3_30B_A3B_CONFIG.items() if k != "moe_intermediate_size"}
    olmoe.update(model_type="olmoe", intermediate_size=1024, num_experts=64)
    assert load_model(_write(tmp_path / "o.json", json.dumps(olmoe))).moe.expert_ffn_hidden_size == 1024


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.update(mlp_only_layers=[3]), ["mlp_only_layers", "[3]", "leading run"]),
    (lambda c: c.update(mlp_only_layers=[0], decoder_sparse_step=2), ["mlp_only_layers", "2"]),
    (lambda c: c.update(model_type="qwen2_moe", shared_expert_intermediate_size=1000),
     ["shared_expert_intermediate_size", "1000", "768"]),
    (lambda c: c.update(model_type="jamba"), ["num_experts", "128", "jamba", "[moe]"]),
    (lambda c: c.update(model_type="dbrx", num_experts=None, ffn_config={"moe_num_experts": 16}),
     ["ffn_config", "dbrx", "[moe]"]),
])
def test_unread_or_bad_expert_keys_are_refused(tmp_path, edit, words):
    cfg = dict(QWEN3_30B_A3B_CONFIG)
    edit(cfg)
    message = _error(load_model, _write(tmp_path / "bad" / "config.json", json.dumps(cfg)))
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.pop("intermediate_size"), ["intermediate_size", "missing"]),
    (lambda c: c.pop("vocab_size"), ["vocab_size", "missing"]),
    (lambda c: c.update(hidden_size="4096"), ["hidden_size", "integer"]),
    (lambda c: c.update(num_hidden_layers=0), ["num_hidden_layers", "0"]),
    (lambda c: c.update(num_key_value_heads=5), ["num_kv_heads", "5"]),
    (lambda c: c.update(num_attention_heads=3), ["num_attention_heads", "3", "4096"]),
    (lambda c: c.update(hidden_act="relu"), ["hidden_act", "relu", "silu"]),
    (lambda c: c.update(tie_word_embeddings="yes"), ["tie_word_embeddings"]),
    (lambda c: c.update(num_local_experts=8), ["num_experts_per_tok", "missing"]),
    (lambda c: c.pop("hidden_size"), ["hidden_size", "n_embd"]),
])
def test_bad_hf_configs_raise_one_line_errors(tmp_path, edit, words):
    cfg = dict(LLAMA3_8B_CONFIG)
    edit(cfg)
    path = _write(tmp_path / "bad" / "config.json", json.dumps(cfg))
    message = _error(load_model, path)
    for word in words:
        assert word in message, message
    assert "config.json" in message, message


def test_invalid_json_is_reported(tmp_path):
    message = _error(load_model, _write(tmp_path / "x.json", "{not json"))
    assert "not valid JSON" in message and "x.json" in message


def test_model_sources_refuses_json(tmp_path):
    path = _write(tmp_path / "c.json", json.dumps(LLAMA3_8B_CONFIG))
    assert "Hugging Face" in _error(model_sources, path)


def test_presets_ship_as_package_data():
    """The packages setuptools finds from pyproject's include list hold the model
    presets, and their TOML files are declared package data (a non-editable install
    would otherwise ship a simulator without models)."""
    from setuptools import find_packages

    from hardware.catalog import tomllib

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_packages(str(root), include=config["packages"]["find"]["include"])
    assert {"strategies.models", "strategies.schedules", "hardware.catalog"} <= set(found)
    assert "*.toml" in config["package-data"]["strategies.models"]
