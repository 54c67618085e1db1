"""Unit conversions and size parsing, done once at the edges.

Conventions used throughout trainsim (DESIGN.md, principle 2):

* GB = 1e9 bytes, GiB = 2**30 bytes; ``GB/s`` is 1e9 bytes per second.
* Gb/s (network line rates) is 1e9 *bits* per second.
* Engine time is an integer number of nanoseconds.
"""

from __future__ import annotations

import math
import re

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
