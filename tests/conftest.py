"""Shared test helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Published measurements live beside the repository (../shared/data).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def require_shared_data(path: Path = SHARED_DATA) -> Path:
    """Return ``path`` if it exists. Without it, skip on a developer machine but
    fail in CI (CI=true), where ../shared is always beside the clone: a check
    against published data must never silently stop running there."""
    if path.exists():
        return path
    message = f"published data not found at {path}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the ``trainsim`` CLI in-process; return (exit code, stdout, stderr)."""
    from trainsim.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(func, *args, **kwargs) -> str:
    """Call ``func``; it must raise a ValueError whose message is one line. Return it."""
    with pytest.raises(ValueError) as info:
        func(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def tiny_models():
    """A small dense GPT and a small MoE model for fast step tests."""
    from strategies.model_spec import ModelSpec, MoESpec

    dense = ModelSpec(name="tiny", num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=8,
                      head_dim=64, ffn_hidden_size=2048, vocab_size=1024, mlp="gelu",
                      norm="layernorm", tied_embeddings=True)
    moe = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=512, num_heads=8,
                    num_kv_heads=4, head_dim=64, ffn_hidden_size=1024, vocab_size=1024,
                    moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=512))
    return dense, moe


def expect_one_line_error(call, *words: str) -> str:
    """``call()`` must raise a one-line ValueError containing every word; return it."""
    message = one_line_error(call)
    for word in words:
        assert word in message, message
    return message
