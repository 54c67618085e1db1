"""Default split of layers over pipeline stages (strategies.plan.stage_layer_counts)."""

import pytest

from strategies.plan import ParallelPlan, stage_layer_counts, validate_plan


@pytest.mark.parametrize("layers, pp, vpp, expected", [
    (32, 4, 1, (8, 8, 8, 8)),                   # divides: even
    (126, 16, 1, (7,) + (8,) * 14 + (7,)),      # Llama 3 405B's published split
    (10, 4, 1, (2, 3, 3, 2)),                   # ends lighter
    (7, 4, 1, (2, 2, 2, 1)),                    # 3 extra: middle, then the first stage
    (5, 1, 1, (5,)),
    (9, 2, 2, (2, 3, 2, 2)),                    # over virtual stages
])
def test_default_split_is_balanced_with_light_ends(layers, pp, vpp, expected):
    plan = ParallelPlan(pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b")
    counts = stage_layer_counts(layers, plan)
    assert counts == expected
    assert sum(counts) == layers and max(counts) - min(counts) <= 1


def test_explicit_split_wins():
    plan = ParallelPlan(pp=2, layers_per_stage=(1, 3))
    assert stage_layer_counts(4, plan) == (1, 3)


def test_more_stages_than_layers_is_one_line_error():
    with pytest.raises(ValueError, match=r"^pp: 3 layers cannot fill pp 8 x vpp 1 = 8 stages"):
        validate_plan(ParallelPlan(pp=8, global_batch=8), num_layers=3, num_heads=4, num_kv_heads=4)


def test_first_and_last_stage_may_hold_only_embedding_and_loss():
    """Llama 3 405B: 126 layers on 16 x 8 virtual stages, one layer each, the first and
    the last holding only the embedding and the loss (arXiv 2407.21783 Section 3.3.2)."""
    plan = ParallelPlan(pp=16, vpp=8, schedule="interleaved", global_batch=32)
    validate_plan(plan, num_layers=126, num_heads=128, num_kv_heads=8)
    assert stage_layer_counts(126, plan) == (0,) + (1,) * 126 + (0,)
    with pytest.raises(ValueError, match=r"^layers_per_stage: .* positive but for the first"):
        ParallelPlan(pp=4, layers_per_stage=(1, 0, 2, 1))
    assert ParallelPlan(pp=4, layers_per_stage=(0, 2, 2, 0)).layers_per_stage == (0, 2, 2, 0)
