"""Published runs entered as they ran: their own Megatron-LM arguments or NeMo YAML give
the scenario validate/published.py builds by hand for the same row, field for field, but
for the differences listed here, each where the job's own configuration says otherwise
than the hand translation (validate/published.py, validate/published_stacks.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import expect_one_line_error
from strategies.plan import ParallelPlan, stage_layer_counts
from trainsim.importers import import_job
from validate import published

FIXTURES = Path(__file__).parent / "fixtures" / "importers"


@pytest.fixture(scope="module")
def catalog():
    """(runs by (source, row), models of models.csv, NeMo recipes)."""
    runs = {(r.source_id, r.row_id): r for r in published.load_runs()}
    return runs, published.load_models(), published.load_nemo_recipes()


def _published(catalog, source: str, row: str) -> published.Scenario:
    runs, models, recipes = catalog
    return published.scenario_for(runs[(source, row)], models, recipes)


def _plan(job, **given) -> ParallelPlan:
    """The imported job's plan as trainsim resolves it (defaults filled in)."""
    from trainsim.defaults import resolve_plan_fields

    return ParallelPlan(**resolve_plan_fields({**job.plan, **given}, gpus=job.gpus))


def _differences(ours: ParallelPlan, theirs: ParallelPlan) -> dict[str, tuple]:
    return {f: (getattr(ours, f), getattr(theirs, f)) for f in ours.__dataclass_fields__
            if getattr(ours, f) != getattr(theirs, f)}


def _same_shape(ours, theirs, **expected_differences) -> None:
    """The models agree but for name, source and the differences given."""
    assert replace(ours, name=theirs.name, source=theirs.source, **expected_differences) \
        == theirs


# --------------------------------------------------------------------------- Megatron-LM 2021


def _megatron_2021_args(run, model) -> str:
    template = (FIXTURES / "megatron_lm_2021_gpt.args").read_text()
    return template.format(nodes=run.integer("num_gpus") // 8, tp=run.integer("tp"),
                           pp=run.integer("pp"), num_layers=model.num_layers,
                           hidden_size=model.hidden_size, num_heads=model.num_heads,
                           global_batch=run.integer("global_batch_seqs"),
                           seq_len=run.integer("seq_len"))


@pytest.mark.parametrize("row", [f"megatron2021_{i:02d}" for i in range(1, 11)])
def test_megatron_lm_2021_runs_from_their_arguments(catalog, row):
    theirs = _published(catalog, "megatron_lm_2021", row)
    job = import_job(megatron_args=_megatron_2021_args(
        catalog[0][("megatron_lm_2021", row)], theirs.model))
    ours = _plan(job)
    # the arguments of 2021: no sequence parallelism (it came in 2022: published.py turns
    # it on for every TP > 1 row), and --fp16 as the era's example script (the paper does
    # not say which 16-bit format; both run at the A100's 312 TFLOP/s). Both issue kernels
    # eagerly (no CUDA graphs: the importer; published_stacks.host_issue_of)
    expected = {"dtype": ("fp16", "bf16")}
    if theirs.plan.tp > 1:
        expected["sequence_parallel"] = (False, True)
    assert _differences(ours, theirs.plan) == expected
    assert job.gpus == theirs.plan.world_size
    # the vocabulary Megatron pads to 128 x TP: 51,200 only at TP 8 (the paper's V)
    tp = theirs.plan.tp
    padded = -(-50257 // (128 * tp)) * 128 * tp
    assert job.model.vocab_size == padded
    _same_shape(job.model, theirs.model, vocab_size=theirs.model.vocab_size)
    assert (padded == 51200) == (tp == 8)


# --------------------------------------------------------------------------- ModelZoo Qwen3


def test_qwen3_long_context_run_from_its_arguments(catalog):
    theirs = _published(catalog, "megatron_core_moe", "mcore_moe_qwen3_long_16k_fb")
    # the job's expert-TP 1 with TP 4, as the row now carries it (from the same model
    # config), and its flex dispatcher on DeepEP, as the row's framework prints
    job = import_job(megatron_args=f"@{FIXTURES / 'qwen3_235b_long_16k_h100.args'}")
    ours = _plan(job)
    assert job.gpus == 256
    # what the job's own arguments say that the row does not: TE userbuffers
    # (--tp-comm-overlap, set by sbatch_benchmarking.sh for bf16), TE's fused loss, and
    # Megatron-Core's default gradient bucket of 40M parameters in fp32
    assert _differences(ours, theirs.plan) == {
        "tp_comm_overlap": ("userbuffers", "async"),
        "cross_entropy": ("fused", "megatron"),
        "grad_bucket_bytes": (160_000_000, 40_000_000),
        "layers_per_stage": ((2,) + (3,) * 30 + (2,), None)}
    # both eager: the job sets no CUDA graphs, and published.py runs Megatron-Core MoE rows
    # eager
    assert ours.host_issue == theirs.plan.host_issue == "eager"
    # the embedding and loss counted as layers: the split published.py balances into
    assert stage_layer_counts(94, theirs.plan) == ours.layers_per_stage
    _same_shape(job.model, theirs.model)  # the vocabulary 151,936 included


# --------------------------------------------------------------------------- NeMo 1 launcher


def test_gpt3_175b_from_its_nemo_launcher_config(catalog):
    theirs = _published(catalog, "nvidia_dgxc_benchmarking", "dgxc_gpt175_04")
    job = import_job(nemo_config=FIXTURES / "nemo1_gpt3_175b.yaml")
    ours = _plan(job)
    assert job.gpus == 1024 == theirs.plan.world_size
    # the YAML says selective recompute (core attention); Apex DistributedFusedAdam reduces
    # in its fp32 state's dtype (no grad_sync_dtype) in buckets of bucket_cap_mb 100 MiB and,
    # with bf16 weights, keeps parameter remainders (NeMo's setup_optimization); the loss
    # is Megatron's (no cross-entropy fusion in NeMo 1). published.py takes NeMo 2's
    # recipe defaults and NeMo 1's Nemotron-340B grad_sync_dtype instead.
    assert _differences(ours, theirs.plan) == {
        "recompute": ("selective", "none"), "grad_reduce_dtype": ("fp32", "bf16"),
        "store_param_remainders": (True, False), "grad_bucket_bytes": (100 * 2**20, 40e6),
        "cross_entropy": ("megatron", "fused")}
    # both eager: NeMo without CUDA graphs (the importer and published_stacks.host_issue_of)
    assert ours.host_issue == theirs.plan.host_issue == "eager"
    # GPT-2's 50,257 tokens padded to 128 x TP 4 (models.csv: 51,200 of the FLOP formulas)
    _same_shape(job.model, theirs.model, vocab_size=51200)
    assert job.model.vocab_size == 50688
    assert "model.optim.lr" in job.ignored and "exp_manager" in job.ignored


# --------------------------------------------------------------------------- Megatron-Bridge


def test_bridge_dump_with_fp8_parameters_is_refused_in_one_line():
    expect_one_line_error(lambda: import_job(
        nemo_config=FIXTURES / "bridge_llama3_8b_sft_gb200_fp8_mx.yaml", gpus=8),
        "mixed_precision.fp8_param_gather", "refused")


def test_bridge_dump_maps_onto_the_llama3_8b_shape(tmp_path):
    from strategies.models import load_model

    data = yaml.safe_load((FIXTURES / "bridge_llama3_8b_sft_gb200_fp8_mx.yaml").read_text())
    data["mixed_precision"].update(fp8_param_gather=False, fp8_param=False)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    job = import_job(nemo_config=path, gpus=8)
    _same_shape(job.model, load_model("llama3-8b"))
    p = job.plan
    assert (p["dtype"], p["fp8_recipe"], p["grad_reduce_dtype"]) == ("fp8", "te-mxfp8", "fp32")
    assert (p["seq_len"], p["micro_batch"], p["global_batch"], p["zero"]) == (4096, 1, 8, 1)
    assert (p["cross_entropy"], p["tp_comm_overlap"], p["overlap_grad_reduce"]) == \
        ("fused", "async", False)
    assert "optimizer.lr" in job.ignored and "checkpoint" in job.ignored
    data["model"]["qk_clip"] = True  # an unknown setting with an active value
    path.write_text(yaml.safe_dump(data))
    expect_one_line_error(lambda: import_job(nemo_config=path, gpus=8), "model.qk_clip")


def _bridge_from_recipe(row: dict, model) -> dict:
    """A Megatron-Bridge config with the model's shape and one NeMo recipe's settings."""
    tp, vp = int(float(row["tp_size"])), int(float(row["vp_size"] or 1))
    pp = int(float(row["pp_size"]))
    layers = int(float(row["recompute_layers"] or 0))
    # Llama 3.1 405B's 126 layers: Megatron-Bridge's recipe counts the embedding and the
    # loss as pipeline layers (126 + 2 = 128 = pp 8 x vp 8 x 2)
    ends = model.num_layers % pp != 0
    fsdp = bool(int(row["use_mcore_fsdp"] or 0))
    return {
        "model": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "ffn_hidden_size": model.ffn_hidden_size,
                  "num_attention_heads": model.num_heads,
                  "num_query_groups": model.num_kv_heads, "kv_channels": model.head_dim,
                  "vocab_size": model.vocab_size, "gated_linear_unit": model.mlp == "swiglu",
                  "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
                  "share_embeddings_and_output_weights": model.tied_embeddings,
                  "tensor_model_parallel_size": tp,
                  "pipeline_model_parallel_size": pp,
                  "account_for_embedding_in_pipeline_split": ends,
                  "account_for_loss_in_pipeline_split": ends,
                  "context_parallel_size": int(float(row["cp_size"])),
                  "virtual_pipeline_model_parallel_size": vp if vp > 1 else None,
                  "seq_length": int(float(row["seq_len"])), "sequence_parallel": tp > 1,
                  "recompute_granularity": "full" if layers else None,
                  "recompute_method": "block" if layers else None,
                  "recompute_num_layers": layers or None,
                  "cpu_offloading_num_layers": int(float(row["activation_offload_layers"]
                                                         or 0)),
                  "bf16": True, "fp8": "hybrid" if row["dtype"] == "fp8" else None},
        "train": {"micro_batch_size": int(float(row["mbs"])),
                  "global_batch_size": int(float(row["gbs"]))},
        "ddp": {"use_distributed_optimizer": True, "overlap_grad_reduce": True,
                "overlap_param_gather": True, "use_megatron_fsdp": fsdp,
                "data_parallel_sharding_strategy": "optim_grads_params" if fsdp
                else "no_shard"}}


def test_nemo_recipe_settings_land_in_the_plan(catalog, tmp_path):
    """NeMo's recommended configurations (nemo_recipes/) written as Megatron-Bridge
    configs: every parallel, batch, recompute, offload and FSDP setting arrives."""
    _, models, recipes = catalog
    keys = {v: k for k, v in published.NEMO_RECIPE_MODELS.items()}
    rows = [r for r in recipes if r["task"] == "pre_train"
            and not isinstance(models.get(keys.get((r["model"], r["size"]))), (str,
                                                                              type(None)))
            and int(float(r["ep_size"])) == 1]
    assert len(rows) >= 30
    for row in rows:
        model = models[keys[(row["model"], row["size"])]]
        path = tmp_path / "recipe.yaml"
        config = _bridge_from_recipe(row, model)
        graphs = bool(int(row["cuda_graphs"] or 0))
        if graphs:  # Transformer Engine's graphs of whole layers (the default scope)
            config["model"]["cuda_graph_impl"] = "transformer_engine"
        path.write_text(yaml.safe_dump(config))
        job = import_job(nemo_config=path, gpus=int(float(row["num_gpus"])))
        p = job.plan
        assert p["host_issue"] == ("graphed" if graphs else "eager")
        want = {"tp": "tp_size", "pp": "pp_size", "cp": "cp_size", "micro_batch": "mbs",
                "global_batch": "gbs", "seq_len": "seq_len"}
        assert {k: p[k] for k in want} == {k: int(float(row[v])) for k, v in want.items()}
        assert p["vpp"] == int(float(row["vp_size"] or 1))
        assert p["zero"] == (3 if int(row["use_mcore_fsdp"] or 0) else 1)
        assert p.get("recompute_layers", 0) == int(float(row["recompute_layers"] or 0))
        assert p.get("activation_offload_layers", 0) == \
            int(float(row["activation_offload_layers"] or 0))
        assert p["dtype"] == row["dtype"]
        # Megatron-Bridge pads the vocabulary to 128 x TP (published.py keeps models.csv's)
        assert job.model.vocab_size % (128 * p["tp"]) == 0


# --------------------------------------------------------------------------- NeMo 2


def test_nemo2_recipe_dump_takes_its_shape_from_model_and_the_rest_from_the_file():
    from strategies.models import load_model

    path = FIXTURES / "nemo2_llama3_8b.yaml"
    expect_one_line_error(lambda: import_job(nemo_config=path), "--num-layers",
                          "Llama3Config8B", "--model")
    job = import_job(nemo_config=path, model=load_model("llama3-8b"))
    recipe = next(r for r in published.load_nemo_recipes() if (
        r["task"], r["model"], r["size"], r["system"], r["dtype"]) ==
        ("pre_train", "llama3", "8b", "h100", "bf16"))
    p = job.plan
    assert (p["tp"], p["pp"], p["cp"], p["micro_batch"], p["global_batch"], p["seq_len"]) \
        == tuple(int(float(recipe[k])) for k in ("tp_size", "pp_size", "cp_size", "mbs",
                                                 "gbs", "seq_len"))
    assert job.gpus == int(float(recipe["num_gpus"]))  # trainer.num_nodes x devices
    assert (p["zero"], p["overlap_grad_reduce"], p["overlap_param_gather"],
            p["grad_reduce_dtype"], p["cross_entropy"]) == (1, True, True, "fp32", "fused")
    assert "optim.config.lr" in job.ignored and "trainer.max_steps" in job.ignored
