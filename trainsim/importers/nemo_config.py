"""A NeMo or Megatron-Bridge YAML -> :class:`~trainsim.importers.job.Settings`.

Three dialects, told apart by their top-level keys:

* **NeMo 1 launcher** training YAML (``NVIDIA/NeMo-Framework-Launcher``
  ``launcher_scripts/conf/training/<family>/<size>.yaml``; also the same under a
  ``training:`` key): ``trainer`` (nodes, devices, precision) and ``model`` (NeMo's own
  names: ``encoder_seq_length``, ``activations_checkpoint_granularity``,
  ``ub_tp_comm_overlap``, ``optim.name: distributed_fused_adam`` ...). OmegaConf
  interpolations the mapped keys use (``${.hidden_size}``, ``${multiply:4, ...}``,
  absolute ``${training.model.x}``) are resolved.
* **Megatron-Bridge** ``ConfigContainer`` dumped as YAML (``config.to_yaml()``, the
  ``scripts/performance/dryrun_configs`` of NVIDIA-NeMo/Megatron-Bridge): sections
  ``model`` (Megatron-Core ``TransformerConfig`` names), ``train``, ``optimizer``, ``ddp``,
  ``dist``, ``mixed_precision``, ``comm_overlap``, ``dataset``.
* **NeMo 2** recipes dumped as YAML (``nemo.collections.llm``): ``model.config``,
  ``trainer.strategy`` (+ ``ddp``), ``trainer.plugins``, ``trainer.callbacks``
  (``MegatronCommOverlapCallback``), ``optim.config``, ``data``. Its model shape usually
  lives in the config class's defaults, which trainsim does not import: give ``--model``
  then.

Keys are renamed to Megatron-LM's ``argparse`` destinations and handed to the one
mapping (:mod:`~trainsim.importers.megatron_config`). A key trainsim does not know is
accepted as ignored when its value is inactive (null, false, 0, empty) and refused
otherwise; whole sections without effect on a step (checkpointing, logging, data,
schedulers, profiling) are ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from hardware.user_input import load_input
from trainsim.importers.job import Setting, Settings
from trainsim.importers.setting_kinds import is_ignored
from trainsim.importers.megatron_flags import FLAGS

__all__ = ["settings_from_nemo"]

#: Destinations the mapping reads besides those of Megatron-LM's flags.
_EXTRA_DESTS = frozenset({"cpu_offloading_weights", "apex_store_param_remainders"})
_KNOWN = frozenset(f.dest for f in FLAGS.values()) | _EXTRA_DESTS

#: Sections with no effect on the step, by dialect key.
_IGNORED_SECTIONS = frozenset({
    "run", "exp_manager", "hydra", "defaults", "cluster", "checkpoint", "logger", "profiling",
    "rerun_state_machine", "rng", "scheduler", "tokenizer", "validation", "ft", "straggler",
    "nvrx_straggler", "inprocess_restart", "tensor_inspect",
    "optimizer_config_override_provider", "log", "resume", "_target_"})

#: Keys (any section) without effect that carry active values in real configurations.
_NEMO_IGNORED = frozenset({
    # NeMo 1 model keys
    "resume_from_checkpoint", "pre_process", "post_process", "gradient_as_bucket_view",
    "grad_div_ar_fusion", "native_amp_init_scale", "native_amp_growth_interval",
    "sync_batch_comm", "apex_transformer_log_level", "do_layer_norm_weight_decay",
    "get_attention_mask_from_fusion", "batch_p2p_comm", "reduce_amax", "use_emha",
    "ub_tp_comm_overlap_cfg", "nsys_profile", "rotary_percentage", "normalize_attention_scores",
    "attention_type", "grad_allreduce_chunk_size_mb", "gc_interval", "use_te_rng_tracker",
    "seq_len_interpolation_factor", "fp8_e4m3", "fp8_hybrid", "contiguous_grad_buffer",
    "contiguous_param_buffer", "betas", "eps", "sched", "name_or_path",
    # Megatron-Bridge / Megatron-Core config fields with active defaults
    "batch_p2p_sync", "cpu_offloading_activations", "cpu_offloading_double_buffering",
    "cuda_graph_retain_backward_graph", "cuda_graph_use_single_mempool",
    "deallocate_pipeline_outputs", "disable_parameter_transpose_cache", "hf_model_id",
    "kitchen_attention_backend", "min_offloaded_tensor_size", "mlp_chunks_for_prefill",
    "parallel_output", "qk_clip_alpha", "qk_clip_threshold",
    "scatter_embedding_sequence_parallel", "use_mamba_mem_eff_path", "params_dtype",
    "pipeline_dtype", "autocast_dtype", "should_pad_vocab", "transformer_layer_spec",
    "fsdp_all_gather_in_start_param_sync", "megatron_fsdp_main_params_dtype",
    "megatron_fsdp_main_grads_dtype", "megatron_fsdp_grad_comm_dtype",
    "outer_dp_sharding_strategy", "check_for_nan_in_grad", "average_in_collective",
    "use_gloo_process_groups", "external_gpu_device_mapping", "check_optimizer_step_success",
    "exit_signal", "exit_signal_handler_for_dataloader", "skip_sync_grad_norm_across_mp",
    "decoupled_weight_decay", "apply_wd_to_qk_layernorm", "pin_cpu_grads", "pin_cpu_params",
    "lion_beta1", "lion_beta2", "fp32", "timers", "cpu_offloading",
    "num_layers_at_end_in_bf16", "num_layers_at_start_in_bf16", "linear_conv_kernel_dim",
    "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_value_head_dim", "mamba_head_dim", "mamba_num_groups", "mamba_state_dim",
    "hf_tokenizer_kwargs", "accelerator", "strategy_target",
})
_IGNORED_KEY_PREFIXES = ("mup_", "yarn_", "flight_recorder_", "muon_", "comet_", "mlflow_",
                         "async_ckpt_", "inference_")

#: Megatron-Bridge / NeMo 2 field names -> Megatron-LM destinations.
_RENAMED = {"num_moe_experts": "num_experts", "fp8_param": "fp8_param_gather",
            "fp8_params": "fp8_param_gather",
            "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
            "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
            "virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank",
            "bucket_size": "ddp_bucket_size",
            "reduce_scatter_with_fp32_accumulation": "ddp_reduce_scatter_with_fp32_accumulation",
            "bias_dropout_add_fusion": "bias_dropout_fusion", "use_flash_attention":
            "use_flash_attn", "activations_checkpoint_granularity": "recompute_granularity",
            "activations_checkpoint_method": "recompute_method",
            "activations_checkpoint_num_layers": "recompute_num_layers",
            "encoder_seq_length": "seq_length", "ub_tp_comm_overlap": "tp_comm_overlap",
            "bias": "add_bias_linear", "layernorm_epsilon": "norm_epsilon"}

#: Sections of a Megatron-Bridge ConfigContainer read, in the order later ones win.
_BRIDGE_SECTIONS = ("model", "train", "optimizer", "ddp", "dist", "comm_overlap",
                    "mixed_precision", "dataset")
_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16",
                 "torch.float": "fp32", "torch.half": "fp16", "torch.uint8": "fp8"}
_PRECISIONS = {"bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "16": "fp16",
               "16-mixed": "fp16", "fp16": "fp16", "32": None, "32-true": None, "fp32": None}
_GATED = {"fast-swiglu", "swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu"}
_NOT_GATED = {"gelu", "fast-gelu", "approx-gelu"}


def settings_from_nemo(path: str | os.PathLike[str], *,
                       base_dir: str | os.PathLike[str] | None = None) -> Settings:
    """The Settings of a NeMo 1 launcher, NeMo 2 or Megatron-Bridge YAML (module docstring).

    Raises:
        ValueError: an unreadable file, an unknown dialect, or one line naming the key
            (as ``section.key``) that is refused or invalid.
    """
    file = Path(path).expanduser()
    if not file.is_absolute() and base_dir is not None:
        file = Path(base_dir) / file
    data, _ = load_input(file, what="nemo-config", syntax="yaml",
                         hint="give a NeMo or Megatron-Bridge YAML")
    if isinstance(data, dict) and isinstance(data.get("training"), dict):
        data = data["training"]  # a composed launcher config
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(f"nemo-config: {file} has no 'model' section; give a NeMo 1 "
                         "launcher, NeMo 2 or Megatron-Bridge training YAML")
    reader = _Reader(data, file.name)
    if isinstance(data.get("trainer"), dict) and isinstance(data["trainer"].get("strategy"),
                                                              dict):
        return reader.nemo2()
    if "train" in data or "ddp" in data or "optimizer" in data:
        return reader.bridge()
    return reader.nemo1()


def _inactive(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {}) or \
        value in ("none", "no_shard")


class _Reader:
    """Walks one YAML and collects Settings (module docstring)."""

    def __init__(self, root: dict, name: str) -> None:
        self.root, self.name = root, name
        self.values: dict[str, Setting] = {}
        self.ignored: list[str] = []
        self.notes: list[str] = []

    # ----------------------------------------------------------------- building blocks

    def set(self, dest: str, value: Any, spelled: str) -> None:
        self.values[dest] = Setting(value, spelled)

    def settings(self, source: str, gpus: int | None, shape_hint: str = "") -> Settings:
        return Settings(values=self.values, source=f"{source} {self.name}",
                        ignored=tuple(self.ignored), notes=tuple(self.notes), gpus=gpus,
                        shape_hint=shape_hint)

    def resolve(self, value: Any, where: tuple[str, ...], spelled: str, depth: int = 0
                ) -> Any:
        """A value with OmegaConf interpolations resolved (those a mapped key uses);
        ``where`` is the path of the node holding the key."""
        if isinstance(value, dict) and "_target_" in value:
            target = str(value["_target_"])
            return _TORCH_DTYPES.get(target, target)
        if not isinstance(value, str) or "${" not in value:
            return value
        match = re.fullmatch(r"\$\{(.*)\}", value.strip())
        if match is None or depth > 16:
            raise ValueError(f"{spelled}: {value!r} mixes text and interpolation or refers to "
                             "itself; give a value")
        inner = match.group(1).strip()
        if inner.startswith("multiply:"):
            product = 1
            for part in _split_args(inner[len("multiply:"):]):
                factor = self.resolve(part.strip(), where, spelled, depth + 1)
                try:
                    if isinstance(factor, str):
                        factor = float(factor) if "." in factor else int(factor)
                    product *= factor
                except (TypeError, ValueError):
                    raise ValueError(f"{spelled}: {value!r} multiplies {factor!r}, which is not "
                                     "a number; give the value") from None
            return product
        if inner.startswith("."):
            # ${.x} is a key of the same node, ${..x} of its parent
            up = len(inner) - len(inner.lstrip(".")) - 1
            path = (*where[:len(where) - up], *inner.lstrip(".").split("."))
        else:
            path = tuple(inner.split("."))
            if path[0] == "training" and "training" not in self.root:
                path = path[1:]
        node: Any = self.root
        for key in path:
            if not isinstance(node, dict) or key not in node:
                raise ValueError(f"{spelled}: {value!r} refers to {inner!r}, which the file does "
                                 "not hold; give the value")
            node = node[key]
        return self.resolve(node, path[:-1], spelled, depth + 1)

    def take(self, section: Mapping[str, Any], where: tuple[str, ...],
             special: Mapping[str, Callable[[Any, str], None]] | None = None) -> None:
        """Every key of ``section``: a special handler, a renamed or known destination,
        ignored, or refused (module docstring)."""
        special = special or {}
        for key, raw in section.items():
            spelled = ".".join((*where, str(key)))
            if not isinstance(key, str):
                raise ValueError(f"{spelled}: the key {key!r} is not a name; give keys as "
                                 "names (a null or numeric key is a typo)")
            if key in special:
                special[key](self.resolve(raw, where, spelled), spelled)
                continue
            dest = _RENAMED.get(key, key)
            if dest in _KNOWN and not is_ignored(dest):
                value = self.resolve(raw, where, spelled)
                if isinstance(value, str) and value.startswith("AttnBackend."):
                    value = value.split(".", 1)[1]
                self.set(dest, value, spelled)
            elif is_ignored(dest) or key in _NEMO_IGNORED or \
                    str(key).startswith(_IGNORED_KEY_PREFIXES) or _inactive(raw):
                self.ignored.append(spelled)
            else:
                raise ValueError(f"{spelled}: {raw!r} is not a setting trainsim knows; remove "
                                 "it if it has no effect on step time or memory")

    def ignore(self, value: Any, spelled: str) -> None:
        self.ignored.append(spelled)

    def refuse_set(self, value: Any, spelled: str) -> None:
        if not _inactive(value):
            raise ValueError(f"{spelled}: {value!r} is refused: partial activation "
                             "checkpointing is not modelled")

    def gpus(self, trainer: Mapping[str, Any]) -> int | None:
        nodes, devices = trainer.get("num_nodes"), trainer.get("devices")
        if nodes is None and devices is None:
            return None
        for key, value in (("num_nodes", nodes), ("devices", devices)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"trainer.{key}: {value!r} is not valid; give a whole number")
        return int(nodes or 1) * int(devices or 1)

    def precision(self, value: Any, spelled: str) -> None:
        text = str(value)
        if text not in _PRECISIONS:
            raise ValueError(f"{spelled}: {value!r} is not valid; valid: "
                             f"{', '.join(_PRECISIONS)}")
        if _PRECISIONS[text]:
            self.set(_PRECISIONS[text], True, spelled)

    # ----------------------------------------------------------------- NeMo 1

    def nemo1(self) -> Settings:
        model, trainer = self.root["model"], self.root.get("trainer") or {}
        if not isinstance(trainer, dict):
            raise ValueError(f"trainer: {trainer!r} is not valid; give the trainer section")
        accumulate = trainer.get("accumulate_grad_batches", 1)
        if accumulate != 1:
            raise ValueError(f"trainer.accumulate_grad_batches: {accumulate!r} is refused: "
                             "NeMo accumulates through the global batch; give 1")
        # the trainer's other keys are run-length, logging and validation settings
        for key, raw in trainer.items():
            if key == "precision":
                self.precision(raw, "trainer.precision")
            elif key not in ("num_nodes", "devices"):
                self.ignored.append(f"trainer.{key}")
        self.take(model, ("model",), {
            "num_query_groups": self._query_groups, "activation": self._activation,
            "normalization": self._normalization, "fp8": self._fp8,
            "share_embeddings_and_output_weights": self._shared_embeddings,
            "transformer_engine": self._transformer_engine, "mcore_gpt": self._mcore,
            "megatron_amp_O2": self._amp_o2, "bias_activation_fusion": self._bias_activation,
            "num_micro_batches_with_partial_activation_checkpoints": self.refuse_set,
            "activations_checkpoint_layers_per_pipeline": self.refuse_set,
            "headscale": self._headscale, "transformer_block_type": self._block_type,
            "ffn_dropout": self._ffn_dropout, "tokenizer": self._tokenizer,
            "optim": self._optim, "data": self._data})
        for section in self.root:
            if section not in ("model", "trainer"):
                self.ignored.append(section)
        return self.settings("NeMo 1 launcher config", self.gpus(trainer))

    def _query_groups(self, value: Any, spelled: str) -> None:
        if value is not None:
            self.set("group_query_attention", True, spelled)
            self.set("num_query_groups", value, spelled)

    def _activation(self, value: Any, spelled: str) -> None:
        if value in _GATED:
            self.set("swiglu", True, spelled)
        elif value == "squared-relu":
            self.set("squared_relu", True, spelled)
        elif value not in _NOT_GATED:
            raise ValueError(f"{spelled}: {value!r} is refused: the activations modelled are "
                             f"{', '.join(sorted(_GATED | _NOT_GATED | {'squared-relu'}))}")

    def _normalization(self, value: Any, spelled: str) -> None:
        names = {"layernorm": "LayerNorm", "layernorm1p": "LayerNorm", "rmsnorm": "RMSNorm",
                 "LayerNorm": "LayerNorm", "RMSNorm": "RMSNorm"}
        if value not in names:
            raise ValueError(f"{spelled}: {value!r} is not valid; valid: {', '.join(names)}")
        self.set("normalization", names[value], spelled)

    def _fp8(self, value: Any, spelled: str) -> None:
        if value:
            model = self.root["model"]
            fmt = "e4m3" if model.get("fp8_e4m3") and not model.get("fp8_hybrid") else "hybrid"
            self.set("fp8", fmt, spelled)
            self.set("fp8_recipe", "delayed", spelled)  # NeMo 1 runs TE's DelayedScaling

    def _shared_embeddings(self, value: Any, spelled: str) -> None:
        self.set("untie_embeddings_and_output_weights", not value, spelled)

    def _transformer_engine(self, value: Any, spelled: str) -> None:
        self.set("transformer_impl", "transformer_engine" if value else "local", spelled)

    def _mcore(self, value: Any, spelled: str) -> None:
        if value is False:
            self.set("use_legacy_models", True, spelled)

    def _amp_o2(self, value: Any, spelled: str) -> None:
        if value is False:
            raise ValueError(f"{spelled}: False is refused: fp32 parameters under autocast are "
                             "not modelled (half-precision weights with fp32 master copies are)")

    def _bias_activation(self, value: Any, spelled: str) -> None:
        self.set("bias_gelu_fusion", value, spelled)
        self.set("bias_swiglu_fusion", value, spelled)

    def _headscale(self, value: Any, spelled: str) -> None:
        if value:
            raise ValueError(f"{spelled}: True is refused: head scaling is not modelled")

    def _block_type(self, value: Any, spelled: str) -> None:
        if value not in ("pre_ln", "post_ln", None):
            raise ValueError(f"{spelled}: {value!r} is refused: the blocks modelled are pre_ln "
                             "and post_ln")

    def _ffn_dropout(self, value: Any, spelled: str) -> None:
        if value:
            self.notes.append(f"{spelled} {value}: the MLP's inner dropout mask is not priced")

    def _tokenizer(self, value: Any, spelled: str) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"{spelled}: {value!r} is not valid; give the tokenizer section")
        library, kind = value.get("library"), value.get("type")
        if library == "megatron" and kind:
            self.set("tokenizer_type", kind, f"{spelled}.type")
        elif library in ("sentencepiece", "huggingface"):
            self.set("tokenizer_type", "SentencePieceTokenizer" if library == "sentencepiece"
                     else "HuggingFaceTokenizer", f"{spelled}.library")
            self.set("tokenizer_model", str(value.get("model") or value.get("type") or ""),
                     f"{spelled}.model")
        else:
            raise ValueError(f"{spelled}.library: {library!r} is not valid; valid: megatron, "
                             "sentencepiece, huggingface")

    def _optim(self, value: Any, spelled: str) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"{spelled}: {value!r} is not valid; give the optim section")
        name = value.get("name")
        if name in ("distributed_fused_adam", "mcore_distributed_optim"):
            self.set("use_distributed_optimizer", True, f"{spelled}.name")
        elif name not in ("fused_adam", "adam", "adamw"):
            raise ValueError(f"{spelled}.name: {name!r} is refused: the optimizers modelled are "
                             "Adam (fused_adam, adam, adamw, distributed_fused_adam, "
                             "mcore_distributed_optim)")
        apex = name == "distributed_fused_adam"
        if apex:
            self.notes.append(f"{spelled}.name distributed_fused_adam: Apex DistributedFusedAdam "
                              "shards the optimizer state over data parallelism (ZeRO-1)")
        # Apex DistributedFusedAdam overlaps the gradient reduction unless told not to
        self.set("overlap_grad_reduce", bool(value.get("overlap_grad_sync", apex)),
                 f"{spelled}.overlap_grad_sync")
        self.set("overlap_param_gather", bool(value.get("overlap_param_sync", False)),
                 f"{spelled}.overlap_param_sync")
        sync = value.get("grad_sync_dtype")
        if sync is not None:
            if sync not in ("bf16", "fp32", "fp16"):
                raise ValueError(f"{spelled}.grad_sync_dtype: {sync!r} is not valid; valid: "
                                 "bf16, fp16, fp32")
            if sync == "fp32":
                self.set("accumulate_allreduce_grads_in_fp32", True, f"{spelled}.grad_sync_dtype")
            else:
                self.set("grad_reduce_in_bf16", True, f"{spelled}.grad_sync_dtype")
        elif apex:
            self.notes.append(f"no {spelled}.grad_sync_dtype: Apex reduces in the optimizer "
                              "state's dtype, fp32")
        if "bucket_cap_mb" in value and apex:
            # Apex buckets hold bucket_cap_mb MiB of gradients in the reduction dtype
            cap = value["bucket_cap_mb"]
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0:
                raise ValueError(f"{spelled}.bucket_cap_mb: {cap!r} is not valid; give a "
                                 "number of MiB > 0")
            bytes_ = int(cap * 2**20)
            grad_bytes = 2 if sync in ("bf16", "fp16") else 4
            self.set("ddp_bucket_size", bytes_ // grad_bytes, f"{spelled}.bucket_cap_mb")
        trainer = self.root.get("trainer")
        precision = trainer.get("precision") if isinstance(trainer, dict) else None
        if apex and value.get("store_params") is not True and \
                precision in ("bf16", "bf16-mixed"):
            # NeMo's MegatronGPTModel.setup_optimization: fp32 state with bf16 weights
            # stores the parameters' remainders
            self.set("apex_store_param_remainders", True, f"{spelled}.name")
        for key in ("dtype", "param_sync_dtype"):
            if value.get(key) not in (None, "fp32", "bf16", 32) or \
                    (key == "dtype" and value.get(key) == "bf16"):
                raise ValueError(f"{spelled}.{key}: {value.get(key)!r} is refused: the plan keeps "
                                 "the optimizer state in fp32 and gathers parameters in their "
                                 "own dtype")
        if value.get("distribute_within_nodes"):
            raise ValueError(f"{spelled}.distribute_within_nodes: True is refused: sharding "
                             "within nodes only is not modelled")
        known = {"name", "overlap_grad_sync", "overlap_param_sync", "grad_sync_dtype",
                 "bucket_cap_mb", "store_params", "dtype", "param_sync_dtype",
                 "distribute_within_nodes"}
        rest = {k: v for k, v in value.items() if k not in known}
        self.take(rest, tuple(spelled.split(".")))

    def _data(self, value: Any, spelled: str) -> None:
        if isinstance(value, dict) and value.get("seq_length") is not None:
            model_seq = self.root["model"].get("encoder_seq_length")
            if model_seq is not None and self.resolve(model_seq, ("model",), spelled) != \
                    self.resolve(value["seq_length"], ("model", "data"), spelled):
                raise ValueError(f"{spelled}.seq_length: {value['seq_length']!r} differs from "
                                 f"model.encoder_seq_length {model_seq!r}; give one length")
        self.ignored.append(spelled)

    # ----------------------------------------------------------------- Megatron-Bridge

    def bridge(self) -> Settings:
        root = self.root
        if root.get("peft") is not None:
            raise ValueError(f"peft: {root['peft']!r} is refused: parameter-efficient "
                             "fine-tuning is not modelled")
        for section in root:
            if section not in _BRIDGE_SECTIONS and section != "peft":
                if section not in _IGNORED_SECTIONS and not _inactive(root[section]):
                    raise ValueError(f"{section}: is not a section trainsim knows; remove it "
                                     "if it has no effect on step time or memory")
                self.ignored.append(section)
        parts = [(name, root[name], (name,)) for name in _BRIDGE_SECTIONS
                 if root.get(name) is not None]
        return self.sections(parts, None, "Megatron-Bridge config")

    def sections(self, parts: list[tuple[str, Any, tuple[str, ...]]], gpus: int | None,
                 source: str, shape_hint: str = "") -> Settings:
        """Read Megatron-Bridge-style sections: (kind, table, where it sits in the file)."""
        special: dict[str, Callable[[Any, str], None]] = {
            "activation_func": self._activation_func, "gated_linear_unit": self._gated,
            "share_embeddings_and_output_weights": self._shared_embeddings,
            "bias_activation_fusion": self._bias_activation,
            "grad_reduce_in_fp32": self._grad_reduce_fp32,
            "num_microbatches_with_partial_activation_checkpoints": self.refuse_set,
            "vocab_size": self._bridge_vocab, "cp_comm_type": self._cp_comm_type,
            "num_query_groups": self._query_groups,
            "main_grads_dtype": self._dtype_name, "main_params_dtype": self._dtype_name,
            "exp_avg_dtype": self._dtype_name, "exp_avg_sq_dtype": self._dtype_name}
        pad = True
        for kind, value, where in parts:
            spelled = ".".join(where)
            if kind == "mixed_precision" and isinstance(value, str):
                self._mixed_precision_name(value, spelled)
                continue
            if not isinstance(value, dict):
                raise ValueError(f"{spelled}: {value!r} is not valid; give a section")
            if kind == "dataset":
                self.take({k: v for k, v in value.items() if k == "seq_length"}, where,
                          {"seq_length": self._dataset_seq})
                self.ignored += [f"{spelled}.{k}" for k in value if k != "seq_length"]
                continue
            if kind == "model" and value.get("should_pad_vocab") is False:
                pad = False
            self.take({k: v for k, v in value.items() if k != "_target_"}, where, special)
        if not pad and "vocab_size" in self.values:  # the vocabulary used as given
            setting = self.values.pop("vocab_size")
            self.set("padded_vocab_size", setting.value, setting.spelled)
        return self.settings(source, gpus, shape_hint)

    def _activation_func(self, value: Any, spelled: str) -> None:
        name = str(value).rsplit(".", 1)[-1]
        if name == "squared_relu":
            self.set("squared_relu", True, spelled)
        elif name not in ("silu", "gelu", "fast_gelu", "openai_gelu", "quick_gelu"):
            raise ValueError(f"{spelled}: {value!r} is refused: the activations modelled are "
                             "silu, gelu and squared_relu")

    def _gated(self, value: Any, spelled: str) -> None:
        if value:
            self.set("swiglu", True, spelled)

    def _grad_reduce_fp32(self, value: Any, spelled: str) -> None:
        if value:
            self.set("accumulate_allreduce_grads_in_fp32", True, spelled)
            self.values.pop("grad_reduce_in_bf16", None)
        else:
            self.set("grad_reduce_in_bf16", True, spelled)
            self.values.pop("accumulate_allreduce_grads_in_fp32", None)

    def _bridge_vocab(self, value: Any, spelled: str) -> None:
        if value is not None:
            self.set("vocab_size", value, spelled)

    def _cp_comm_type(self, value: Any, spelled: str) -> None:
        if value is not None:
            self.set("cp_comm_type", value if isinstance(value, list) else [value], spelled)

    def _dtype_name(self, value: Any, spelled: str) -> None:
        dest = spelled.rsplit(".", 1)[-1]
        self.set(dest, _TORCH_DTYPES.get(str(value), value), spelled)

    def _dataset_seq(self, value: Any, spelled: str) -> None:
        model_seq = self.values.get("seq_length")
        if model_seq is not None and model_seq.value != value:
            self.notes.append(f"{spelled} {value} (what the data loader delivers) used instead "
                              f"of {model_seq.spelled} {model_seq.value}")
        self.set("seq_length", value, spelled)

    def _mixed_precision_name(self, value: str, spelled: str) -> None:
        names = {"bf16_mixed": "bf16", "fp16_mixed": "fp16"}
        if value not in names:
            raise ValueError(f"{spelled}: {value!r} is refused: give the mixed_precision section "
                             f"itself, or one of {', '.join(names)}")
        self.set(names[value], True, spelled)

    # ----------------------------------------------------------------- NeMo 2

    def nemo2(self) -> Settings:
        root = self.root
        trainer, model = root["trainer"], root["model"]
        strategy = trainer["strategy"]
        config = _section(model.get("config"), "model.config")
        parts: list[tuple[str, Any, tuple[str, ...]]] = [
            ("model", config, ("model", "config")),
            ("model", {k: v for k, v in strategy.items() if k not in ("ddp", "_target_")
                       and not str(k).startswith("ckpt")}, ("trainer", "strategy"))]
        self.ignored += [f"trainer.strategy.{k}" for k in strategy
                         if str(k).startswith("ckpt")]
        if isinstance(strategy.get("ddp"), dict):
            parts.append(("ddp", strategy["ddp"], ("trainer", "strategy", "ddp")))
        data = _section(root.get("data"), "data")
        batch = ("micro_batch_size", "global_batch_size")
        parts.append(("train", {k: data[k] for k in batch if k in data}, ("data",)))
        parts.append(("dataset", {k: v for k, v in data.items() if k not in batch},
                      ("data",)))
        optim = _section(root.get("optim"), "optim")
        if isinstance(optim.get("config"), dict):
            parts.append(("optimizer", optim["config"], ("optim", "config")))
        self.ignored += [f"optim.{k}" for k in optim if k != "config"]
        plugins = trainer.get("plugins")
        for i, plugin in enumerate(plugins if isinstance(plugins, list) else [plugins]):
            where = ("trainer", "plugins") if not isinstance(plugins, list) else \
                ("trainer", "plugins", str(i))
            if isinstance(plugin, dict) and "precision" in plugin:
                self.precision(plugin["precision"], ".".join((*where, "precision")))
                parts.append(("mixed_precision", {k: v for k, v in plugin.items()
                                                  if k != "precision"}, where))
        callbacks = trainer.get("callbacks") or []
        if not isinstance(callbacks, list):
            raise ValueError(f"trainer.callbacks: {callbacks!r} is not valid; give a list of "
                             "callbacks")
        for i, callback in enumerate(callbacks):
            where = ("trainer", "callbacks", str(i))
            if isinstance(callback, dict) and "CommOverlap" in str(callback.get("_target_")):
                parts.append(("comm_overlap", callback, where))
            else:
                self.ignored.append(".".join(where))
        self.ignored += [f"trainer.{k}" for k in trainer
                         if k not in ("strategy", "plugins", "callbacks", "num_nodes",
                                      "devices")]
        self.ignored += [k for k in root if k not in ("model", "trainer", "data", "optim")]
        self.ignored += [f"model.{k}" for k in model if k != "config"]
        hint = (f"the shape of model.config._target_ {config.get('_target_')!r} lives in "
                "its class defaults, which trainsim does not import; give --model")
        return self.sections(parts, self.gpus(trainer), "NeMo 2 recipe", hint)


def _section(value: Any, spelled: str) -> dict:
    """A section of the file (``{}`` when absent or null).

    Raises:
        ValueError: a section that is a scalar or a list (one line naming it).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{spelled}: {value!r} is not valid; give a section (a mapping of "
                         "keys)")
    return value


def _split_args(text: str) -> list[str]:
    """Arguments of an OmegaConf resolver call, split at top-level commas."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]
