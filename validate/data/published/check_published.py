#!/usr/bin/env python3
"""Check the published training-step validation set in this folder.

Standard library only. Run from anywhere:

    python3 validate/data/published/check_published.py

Checks every train_*.csv, memory_*.csv and models.csv (orig_*.csv are verbatim
copies of earlier data sets and are only checked for being readable):

* the header matches the schema exactly;
* numeric cells parse, enumerated cells hold allowed values, required cells are present;
* every model key exists in models.csv, row_id is unique, source_id matches the file name;
* internal consistency where the source printed (or we derived) several quantities:
  - tp*pp*cp*dp == num_gpus,
  - global_batch_seqs is a multiple of micro_batch*dp,
  - tokens/s/GPU * num_gpus * step_time == global_batch_seqs * seq_len within 2 %.

A row whose notes contain "INCONSISTENT-AS-PRINTED" documents a contradiction in
the source itself; failures of the consistency checks on such rows are reported
as warnings, not errors. Exit status is 0 when there are no errors.
"""
import csv
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

TRAIN_COLS = (
    "source_id,row_id,model,model_params_b,gpu,num_gpus,gpus_per_node,dtype,seq_len,global_batch_seqs,"
    "micro_batch,tp,pp,cp,ep,expert_tp,vpp,dp,sequence_parallel,recompute,recompute_detail,distributed_optimizer,"
    "fsdp,framework,framework_version,measured_step_time_s,measured_tokens_per_s_per_gpu,measured_tflops_per_gpu,"
    "measured_mfu_pct,quantity_published,citation,notes"
).split(",")
MEASURED = [c for c in TRAIN_COLS if c.startswith("measured_")]
MEMORY_COLS = (
    [c for c in TRAIN_COLS if c not in MEASURED and c not in ("quantity_published", "citation", "notes")]
    + ["measured_peak_memory_gib", "memory_kind", "citation", "notes"]
)
MODEL_COLS = (
    "model,num_layers,hidden_size,ffn_hidden_size,num_heads,num_kv_heads,vocab_size,max_seq_len,activation,num_experts,top_k,"
    "moe_ffn_hidden_size,shared_experts,moe_layer_freq_or_first_dense_layers,attention,mla_q_lora_rank,mla_kv_lora_rank,mla_qk_rope_dim,"
    "mla_qk_nope_dim,mla_v_dim,tied_embeddings,citation,head_dim,notes"
).split(",")

GPUS = {"A100-80GB", "A100-40GB", "H100-SXM", "H800", "H200", "B200", "GB200"}
DTYPES = {"bf16", "fp8"}
RECOMPUTE = {"", "none", "selective", "full"}
ACTIVATIONS = {"swiglu", "gelu", "geglu", "squared_relu"}
ATTENTION = {"mha", "gqa", "mla"}
INT_COLS = ["num_gpus", "gpus_per_node", "seq_len", "global_batch_seqs", "micro_batch", "tp", "pp", "cp", "ep",
            "expert_tp", "vpp", "dp", "fsdp"]
FLOAT_COLS = ["model_params_b"] + MEASURED
REQUIRED = ["source_id", "row_id", "model", "gpu", "num_gpus", "dtype", "seq_len", "tp", "pp", "citation"]
MODEL_INT = ["num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size", "max_seq_len",
             "num_experts", "top_k", "moe_ffn_hidden_size", "shared_experts", "mla_q_lora_rank", "mla_kv_lora_rank",
             "mla_qk_rope_dim", "mla_qk_nope_dim", "mla_v_dim", "head_dim"]
FLAG = "INCONSISTENT-AS-PRINTED"


class Report:
    def __init__(self):
        self.errors, self.warnings = [], []

    def err(self, where, msg):
        self.errors.append(f"ERROR {where}: {msg}")

    def warn(self, where, msg):
        self.warnings.append(f"warning {where}: {msg}")


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]], rows[1:]


def num(rep, where, col, val, kind):
    if val == "":
        return None
    try:
        x = int(val) if kind is int else float(val)
    except ValueError:
        rep.err(where, f"{col}={val!r} is not a{'n integer' if kind is int else ' number'}")
        return None
    if x < 0:
        rep.err(where, f"{col}={val!r} is negative")
    return x


def check_models(rep):
    path = os.path.join(HERE, "models.csv")
    header, rows, raw = read(path)
    if header != MODEL_COLS:
        rep.err("models.csv", f"header mismatch: {header}")
    keys = set()
    for i, r in enumerate(rows):
        where = f"models.csv line {i + 2}"
        if len(raw[i]) != len(header):
            rep.err(where, "wrong number of cells")
        k = r.get("model", "")
        if not k or k in keys:
            rep.err(where, f"empty or duplicate model key {k!r}")
        keys.add(k)
        for c in MODEL_INT:
            num(rep, where, c, r.get(c, ""), int)
        for c in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
            if not r.get(c):
                rep.err(where, f"{c} is required")
        if r.get("activation") not in ACTIVATIONS:
            rep.err(where, f"activation {r.get('activation')!r} not in {sorted(ACTIVATIONS)}")
        if r.get("attention") not in ATTENTION:
            rep.err(where, f"attention {r.get('attention')!r} not in {sorted(ATTENTION)}")
        if r.get("tied_embeddings") not in ("yes", "no"):
            rep.err(where, "tied_embeddings must be yes/no")
        if r.get("attention") == "mla":
            for c in ("mla_q_lora_rank", "mla_kv_lora_rank", "mla_qk_rope_dim", "mla_qk_nope_dim", "mla_v_dim"):
                if not r.get(c):
                    rep.err(where, f"{c} required for MLA")
        ne = r.get("num_experts") or "0"
        if ne != "0" and (not r.get("top_k") or not r.get("moe_ffn_hidden_size")):
            rep.err(where, "MoE model needs top_k and moe_ffn_hidden_size")
        if not r.get("citation"):
            rep.err(where, "citation is required")
    return keys


def check_rows(rep, fname, rows, raw, header, models, kind):
    stem = os.path.basename(fname)
    sid_expected = stem[len(kind) + 1:-4]
    ids = set()
    for i, r in enumerate(rows):
        where = f"{stem} line {i + 2} ({r.get('row_id', '?')})"
        if len(raw[i]) != len(header):
            rep.err(where, "wrong number of cells")
            continue
        flagged = FLAG in r.get("notes", "")
        soft = rep.warn if flagged else rep.err
        for c in REQUIRED:
            if not r.get(c):
                rep.err(where, f"{c} is required")
        if r["source_id"] != sid_expected:
            rep.err(where, f"source_id {r['source_id']!r} does not match file name ({sid_expected!r})")
        if r["row_id"] in ids:
            rep.err(where, "duplicate row_id")
        ids.add(r["row_id"])
        if r["model"] not in models:
            rep.err(where, f"model {r['model']!r} not in models.csv")
        if r["gpu"] not in GPUS:
            rep.err(where, f"gpu {r['gpu']!r} not in {sorted(GPUS)}")
        if r["dtype"] not in DTYPES:
            rep.err(where, f"dtype {r['dtype']!r} not in {sorted(DTYPES)}")
        if r.get("recompute", "") not in RECOMPUTE:
            rep.err(where, f"recompute {r['recompute']!r} not in {sorted(RECOMPUTE)}")
        v = {c: num(rep, where, c, r.get(c, ""), int) for c in INT_COLS if c in r}
        v.update({c: num(rep, where, c, r.get(c, ""), float) for c in FLOAT_COLS + ["measured_peak_memory_gib"] if c in r})
        for c in ("num_gpus", "tp", "pp", "seq_len"):
            if v.get(c) == 0:
                rep.err(where, f"{c} must be positive")
        if v.get("dp") is None and v.get("global_batch_seqs") is None:
            rep.err(where, "need dp or global_batch_seqs")
        n, tp, pp = v.get("num_gpus"), v.get("tp"), v.get("pp")
        cp = v.get("cp") or 1
        dp = v.get("dp")
        if n and tp and pp and dp:
            if tp * pp * cp * dp != n:
                soft(where, f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {tp * pp * cp * dp} != num_gpus {n}")
        elif n and tp and pp and n % (tp * pp * cp):
            soft(where, f"num_gpus {n} not divisible by tp*pp*cp")
        g, mb = v.get("global_batch_seqs"), v.get("micro_batch")
        if g and mb and dp and g % (mb * dp):
            soft(where, f"global_batch_seqs {g} not a multiple of micro_batch*dp = {mb * dp}")
        if kind == "train":
            if not any(r.get(c) for c in MEASURED):
                rep.err(where, "no measured quantity")
            if not r.get("quantity_published"):
                rep.err(where, "quantity_published is required")
            mfu = v.get("measured_mfu_pct")
            if mfu is not None and not 0 < mfu <= 100:
                rep.err(where, f"measured_mfu_pct {mfu} outside (0, 100]")
            st, tok, s = v.get("measured_step_time_s"), v.get("measured_tokens_per_s_per_gpu"), v.get("seq_len")
            if st and tok and g and s and n:
                rel = tok * n * st / (g * s) - 1
                if abs(rel) > 0.02:
                    soft(where, f"tokens/s/GPU*GPUs*step_time differs from GBS*seq_len by {rel:+.1%}")
        else:
            if not v.get("measured_peak_memory_gib"):
                rep.err(where, "measured_peak_memory_gib is required")
            if not r.get("memory_kind"):
                rep.err(where, "memory_kind is required")


def main():
    rep = Report()
    models = check_models(rep)
    used = set()
    counts = {}
    for kind, cols in (("train", TRAIN_COLS), ("memory", MEMORY_COLS)):
        for fname in sorted(glob.glob(os.path.join(HERE, f"{kind}_*.csv"))):
            header, rows, raw = read(fname)
            if header != cols:
                rep.err(os.path.basename(fname), "header does not match the schema")
                continue
            check_rows(rep, fname, rows, raw, header, models, kind)
            used.update(r["model"] for r in rows)
            counts[os.path.basename(fname)] = len(rows)
    for fname in sorted(glob.glob(os.path.join(HERE, "orig_*.csv"))):
        try:
            read(fname)
        except Exception as e:  # noqa: BLE001 - report any unreadable copy
            rep.err(os.path.basename(fname), f"unreadable: {e}")
    for k in sorted(models - used):
        rep.warn("models.csv", f"model {k!r} is not referenced by any row")
    for w in rep.warnings:
        print(w)
    for e in rep.errors:
        print(e)
    total = sum(v for k, v in counts.items() if k.startswith("train_"))
    for k, v in counts.items():
        print(f"{k}: {v} rows")
    print(f"training rows: {total}; warnings: {len(rep.warnings)}; errors: {len(rep.errors)}")
    print("OK" if not rep.errors else "FAILED")
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
