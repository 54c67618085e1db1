"""Unit conversions and size parsing, done once at the edges.

Conventions used throughout trainsim (DESIGN.md, principle 2):

* GB = 1e9 bytes, GiB = 2**30 bytes; ``GB/s`` is 1e9 bytes per second.
* Gb/s (network line rates) is 1e9 *bits* per second.
* Engine time is an integer number of nanoseconds.
* Element types have a canonical name (``bf16``, ``fp8``, ...) and a size in bytes
  (:data:`ELEMENT_BYTES`).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

NS_PER_S = 1_000_000_000
GB = 1_000_000_000
GIB = 1 << 30

_SIZE_SUFFIXES = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1000,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1000**2,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1000**3,
    "GIB": 1 << 30,
    "T": 1 << 40,
    "TB": 1000**4,
    "TIB": 1 << 40,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size_bytes(text: str | int, *, field: str = "size") -> int:
    """Parse a byte count such as ``"8"``, ``"16GiB"``, ``"1MB"`` or ``"4G"``.

    Bare single-letter suffixes (``K``, ``M``, ``G``, ``T``) are binary, as in
    nccl-tests' ``-b``/``-e`` flags; ``KB``/``MB``/``GB`` are decimal and
    ``KiB``/``MiB``/``GiB`` binary.

    Raises:
        ValueError: naming ``field``, when the text is not a non-negative size.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{field}: {text} is negative; give a size >= 0 bytes")
        return text
    match = _SIZE_RE.match(str(text))
    suffix = match.group(2).upper() if match else None
    if match is None or suffix not in _SIZE_SUFFIXES:
        raise ValueError(
            f"{field}: {text!r} is not a size; give bytes as an integer with an optional "
            "suffix K/M/G/T (binary), KB/MB/GB/TB (decimal) or KiB/MiB/GiB/TiB"
        )
    value = float(match.group(1)) * _SIZE_SUFFIXES[suffix]
    if value != int(value):
        raise ValueError(f"{field}: {text!r} is not a whole number of bytes")
    return int(value)


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Convert a line rate in Gb/s (1e9 bits/s) to bytes/s."""
    return gbit_per_s * 1e9 / 8.0


def seconds_to_ns(seconds: float) -> int:
    """Round a duration in seconds up to whole nanoseconds (never 0 for > 0)."""
    if seconds <= 0:
        return 0
    return int(math.ceil(seconds * NS_PER_S - 1e-6))


def ns_to_us(ns: int) -> float:
    """Nanoseconds to microseconds as a float."""
    return ns / 1000.0


#: Bytes per element of each canonical dtype.
ELEMENT_BYTES: Mapping[str, float] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,  # stored as fp32; TF32 is a math mode
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "fp4": 0.5,
}

#: Spellings accepted for each canonical dtype (lower-cased, ``torch.``/``jnp.`` stripped).
DTYPE_ALIASES: Mapping[str, str] = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32", "single": "fp32",
    "fp64": "fp64", "float64": "fp64", "double": "fp64", "f64": "fp64",
    "tf32": "tf32", "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "fp8": "fp8", "float8": "fp8", "f8": "fp8",
    "fp8_e4m3": "fp8", "fp8_e4m3fn": "fp8", "float8_e4m3fn": "fp8", "f8e4m3fn": "fp8",
    "e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e5m2": "fp8", "f8e5m2": "fp8", "e5m2": "fp8",
    "fp4": "fp4", "float4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "fp4_e2m1": "fp4",
    "float4_e2m1fn_x2": "fp4", "e2m1": "fp4",
}


def canonical_dtype(dtype: str, *, field: str = "dtype") -> str:
    """Canonical dtype name (``"bfloat16"`` -> ``"bf16"``, ``"torch.float32"`` -> ``"fp32"``).

    Raises:
        ValueError: naming ``field`` when the spelling is unknown.
    """
    key = str(dtype).strip().lower()
    for prefix in ("torch.", "jnp.", "np.", "numpy."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    try:
        return DTYPE_ALIASES[key]
    except KeyError:
        valid = ", ".join(sorted(set(DTYPE_ALIASES.values())))
        raise ValueError(f"{field}: {dtype!r} is not a known dtype; valid dtypes: {valid}") from None
