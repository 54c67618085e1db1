"""Measured efficiency tables the compute model reads (package data).

``matmul_efficiency.csv``: GEMM efficiency curves per GPU profile and dtype (achieved /
peak FLOP rate against work per GEMM), derived from the published matmul measurements in
``validate/data/compute`` by ``tools/derive_matmul_efficiency.py``.
``attention_efficiency.csv``: fused attention efficiency per implementation, architecture,
pass, mask, head dimension and sequence length (``tools/derive_attention_efficiency.py``).
``README.md`` says where every number comes from.

Exports nothing; :mod:`hardware.compute` reads the files through ``importlib.resources``.
Imports nothing.
"""
