"""Real kernels for the IR's compute ops (torch; imported only by the runner).

How each :class:`strategies.ir.ComputeOp` runs:

* ``matmul`` with ``shape = (b, m, n, k)``: ``torch.matmul`` of ``[b, m, k] @ [b, k, n]``
  in the op's dtype. The op's FLOPs say how many GEMMs of that size it stands for: a
  forward is one; a full backward (``B``, twice the FLOPs) is the two GEMMs of the real
  backward, dX = dY W^T (``[m, n] @ [n, k]``) and dW = X^T dY (``[k, m] @ [m, n]``).
* ``attention`` with ``shape = (b, heads, kv_heads, s_q, s_k, head_dim)``:
  ``scaled_dot_product_attention`` (grouped-query when kv_heads < heads) whose query
  length is chosen so the kernel does the op's FLOPs (4 b h s_q s_k d for a non-causal
  call), i.e. a backward runs as a longer forward of the same work.
* every other kind (elementwise, norm, memcpy, optimizer, other) is memory bound: a
  copy moving the op's HBM ``bytes`` (half read, half written).

fp8 GEMMs have no ``torch.matmul``; they run in bf16 and :func:`substitutions` says so.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from strategies.ir import ComputeOp

_TORCH_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
                 "bf16": torch.bfloat16, "fp16": torch.float16}
#: dtypes without a torch.matmul, and what runs instead.
SUBSTITUTES = {"fp8": "bf16", "fp4": "bf16"}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype an IR dtype runs in (fp8/fp4 as bf16, see :data:`SUBSTITUTES`)."""
    return _TORCH_DTYPES[SUBSTITUTES.get(name, name)]


def substitutions(ops) -> dict[str, str]:
    """``{IR dtype: dtype actually run}`` for the ops that cannot run as written."""
    return {op.dtype: SUBSTITUTES[op.dtype] for op in ops
            if isinstance(op, ComputeOp) and op.dtype in SUBSTITUTES}


class BufferPool:
    """Tensors reused across ops and iterations, keyed by (role, shape, dtype)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tensors: dict[tuple, torch.Tensor] = {}

    def get(self, role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape``/``dtype`` (random normal for floats, made once)."""
        key = (role, tuple(shape), dtype)
        tensor = self._tensors.get(key)
        if tensor is None:
            generator = torch.Generator(device="cpu").manual_seed(hash(key) & 0xFFFF)
            tensor = torch.randn(shape, generator=generator, dtype=torch.float32)
            tensor = tensor.to(device=self.device, dtype=dtype)
            self._tensors[key] = tensor
        return tensor


def _gemm_shapes(op: ComputeOp) -> list[tuple[int, int, int, int]]:
    b, m, n, k = (int(x) for x in op.shape)
    single = 2.0 * b * m * n * k
    reps = max(1, round(op.flops / single)) if single > 0 else 1
    if reps == 2:  # a full backward: dX = dY W^T and dW = X^T dY
        return [(b, m, k, n), (b, k, n, m)]
    return [(b, m, n, k)] * reps


def _matmul(op: ComputeOp, pool: BufferPool) -> Callable[[], None]:
    dtype = torch_dtype(op.dtype)
    calls = []
    for b, m, n, k in _gemm_shapes(op):
        a = pool.get("A", (b, m, k), dtype)
        w = pool.get("B", (b, k, n), dtype)
        out = pool.get("C", (b, m, n), dtype)
        calls.append((a, w, out))

    def run() -> None:
        for a, w, out in calls:
            torch.matmul(a, w, out=out)
    return run


def _attention(op: ComputeOp, pool: BufferPool) -> Callable[[], None]:
    b, heads, kv_heads, s_q, s_k, d = (int(x) for x in op.shape)
    dtype = torch_dtype(op.dtype)
    per_query = 4.0 * b * heads * s_k * d  # FLOPs of one query row, non-causal
    queries = max(1, round(op.flops / per_query)) if op.flops > 0 else s_q
    q = pool.get("q", (b, heads, queries, d), dtype)
    k = pool.get("k", (b, kv_heads, s_k, d), dtype)
    v = pool.get("v", (b, kv_heads, s_k, d), dtype)
    gqa = kv_heads != heads

    def run() -> None:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    return run


def _copy(op: ComputeOp, pool: BufferPool) -> Callable[[], None]:
    elements = int(op.bytes // 8)  # fp32 elements: bytes/2 read + bytes/2 written
    if elements <= 0:
        return lambda: None
    src = pool.get("copy_src", (elements,), torch.float32)
    dst = pool.get("copy_dst", (elements,), torch.float32)

    def run() -> None:
        dst.copy_(src)
    return run


def make_kernel(op: ComputeOp, pool: BufferPool) -> Callable[[], None]:
    """A callable running ``op`` once (see the module docstring for the mapping)."""
    if op.kind == "matmul" and len(op.shape) == 4 and math.prod(op.shape) > 0:
        return _matmul(op, pool)
    if op.kind == "attention" and len(op.shape) == 6 and math.prod(op.shape) > 0:
        return _attention(op, pool)
    return _copy(op, pool)
